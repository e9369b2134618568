//! The op of an implicit value ([`crate::implicit`]): its shape rule,
//! reference evaluation and vjp beside each other, like every family. The
//! lowering that resolves the ops reading one sits above, in
//! `transform/implicit.rs`.

use super::batching::Batched;
use super::custom::CustomCall;
use super::{Backward, BatchWalk, Forward, ShapeCx};
use crate::data::HostData;
use crate::error::{Error, Result};
use crate::handle::array::Array;
use crate::shape::{Aval, Dim};
use std::fmt;

/// The op of an implicit value: its kind, its materialization over its
/// leaves (the operands), and whether gradients pass straight through to
/// an extra last operand, the master copy.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ImplicitCall {
    pub(crate) kind: &'static str,
    pub(crate) body: CustomCall,
    pub(crate) straight_through: bool,
}

impl fmt::Debug for ImplicitCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

impl ImplicitCall {
    /// The kind's name.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// `nf4(packed, scales; block=64)`, with `, straight through` when so.
    pub fn describe(&self) -> String {
        let body = self.body.describe();
        if self.straight_through {
            format!("implicit {body} straight through")
        } else {
            format!("implicit {body}")
        }
    }

    /// The number of operands that are the value's leaves (the master copy
    /// of a straight-through value is not one).
    pub(crate) fn num_leaves(&self, operands: usize) -> usize {
        operands - usize::from(self.straight_through)
    }

    pub(crate) fn shape_rule(&self, inputs: &[&Aval], cx: &mut ShapeCx) -> Result<Aval> {
        if self.straight_through && inputs.is_empty() {
            return Err(self.error("a straight-through value needs its master copy"));
        }
        let leaves = self.num_leaves(inputs.len());
        let aval = self.body.shape_rule(&inputs[..leaves], cx)?;
        if self.straight_through && !crate::symbolic::avals_equal(inputs[leaves], &aval) {
            return Err(self.error(format!(
                "the master copy is {} but the value stands for {aval}",
                inputs[leaves]
            )));
        }
        Ok(aval)
    }

    pub(crate) fn eval(&self, inputs: &[&HostData], in_shapes: &[&[usize]]) -> Result<HostData> {
        let leaves = self.num_leaves(inputs.len());
        self.body.eval(&inputs[..leaves], &in_shapes[..leaves])
    }

    /// The cotangents of the leaves (and master copy): straight through,
    /// or `backward` (reverse mode, from the transform layer) over the
    /// materialization.
    pub(crate) fn vjp(
        &self,
        inputs: &[Array],
        g: &Array,
        backward: Backward<'_>,
    ) -> Result<Vec<Option<Array>>> {
        let leaves = self.num_leaves(inputs.len());
        if self.straight_through {
            let mut out = vec![None; leaves];
            out.push(Some(g.clone()));
            return Ok(out);
        }
        let value = self.body.apply_forward(inputs.to_vec())?;
        backward(&[value], vec![Some(g.clone())], inputs)
    }

    /// The tangent of the value for its leaves' (and master copy's)
    /// tangents: the master copy's straight through, or `forward` (forward
    /// mode, from the transform layer) over the materialization.
    pub(crate) fn jvp(
        &self,
        inputs: &[Array],
        tangents: &[Option<Array>],
        forward: Forward<'_>,
    ) -> Result<Option<Array>> {
        if self.straight_through {
            return Ok(tangents.last().cloned().flatten());
        }
        let value = self.body.apply_forward(inputs.to_vec())?;
        Ok(forward(&[value], inputs, tangents.to_vec())?
            .pop()
            .flatten())
    }

    /// The batched value under vmap: the materialization batched (through
    /// `walk`, from the transform layer) like any composition, and recorded
    /// for the report (the batched program reads the dense value).
    pub(crate) fn batch(
        &self,
        inputs: &[Array],
        operands: &[Batched],
        size: &Dim,
        walk: BatchWalk<'_>,
    ) -> Result<Batched> {
        let value = self.body.apply_forward(inputs.to_vec())?;
        super::batching::record_materialization(self.describe());
        walk(&[value], inputs, operands.to_vec(), size)?
            .pop()
            .ok_or_else(|| self.error("batching its materialization gave no value"))
    }

    fn error(&self, detail: impl Into<String>) -> Error {
        Error::InvalidArgument {
            op: self.kind.to_string(),
            detail: detail.into(),
            at: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::compile::rule_checks as rules;
    use crate::handle::array::Array;
    use crate::implicit::{ImplicitArray, LowRank};

    /// `x @ (base + a·b)` with the low-rank value built from `leaves`
    /// (`[base, a, b]`) and `x` shared.
    fn product(x: &Array, leaves: &[Array]) -> Array {
        let w = LowRank {
            base: leaves[0].clone(),
            a: leaves[1].clone(),
            b: leaves[2].clone(),
        };
        x.matmul(&w.array())
    }

    #[test]
    fn tangents_flow_through_an_implicit_values_materialization() {
        let x = rules::normal(47, &[2, 4]);
        let leaves = [
            rules::normal(48, &[4, 3]),
            rules::normal(49, &[4, 2]),
            rules::normal(50, &[2, 3]),
        ];
        let f = move |l: Vec<Array>| product(&x, &l);
        rules::assert_jvp_matches_central_difference("low_rank", f, &leaves);
    }

    #[test]
    fn a_batched_implicit_value_is_materialized_and_the_report_says_so() {
        let x = rules::normal(51, &[2, 4]);
        let leaves = [
            rules::normal(52, &[3, 4, 3]),
            rules::normal(53, &[3, 4, 2]),
            rules::normal(54, &[3, 2, 3]),
        ];
        let f = move |l: Vec<Array>| product(&x, &l);
        let report = rules::assert_batches_like_stacking("low_rank", f, &leaves);
        assert_eq!(report.vmap_materialized.len(), 1);
        assert!(report.vmap_materialized[0].value.contains("low_rank"));
    }
}
