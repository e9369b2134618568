//! Control flow: `scan`, `while_loop` and `switch` (and `cond`, a switch
//! of two) as single graph nodes that hold subgraphs, plus [`Op::Get`],
//! which reads one result of such a node.
//!
//! A control node's value is an empty token (`u8[0]`); each of its results
//! is a `get` node reading the token, so every graph value keeps one aval
//! and the passes, the planner and the executors see ordinary values. The
//! planner treats a `get` as written when its control node runs
//! ([`crate::plan::lifetimes`]).
//!
//! The subgraphs are graphs of the IR layer, above the op families, so
//! this family sees them only through the [`Subgraphs`] trait (equality,
//! hashing, description); the IR implements it and gives
//! `ControlCall::graphs`. What the shape rule needs (the operands' and
//! results' avals, the guards the bodies assumed) is plain data here.
//!
//! Operands, per kind, in order:
//! * scan: the captured values (`consts`), the initial carries, the
//!   scanned arrays (`xs`, sliced along axis 0). The body reads
//!   `[consts, carries, x slices]` and returns `[carries, ys]`; the
//!   results are the final carries and the stacked `ys`.
//! * while: `consts`, the initial carries. The condition and the body
//!   read `[consts, carries]`; the condition returns a bool scalar and the
//!   body the carries; the results are the final carries.
//! * switch: the branch index (an integer scalar, clamped to the branches
//!   as in JAX), `consts`, the operands. Every branch reads `[consts,
//!   operands]` and returns the results.

use super::{Guard, Op, ShapeCx};
use crate::error::{arg_err, shape_err, Result};
use crate::handle::array::Array;
use crate::shape::{Aval, Dim, Shape};
use crate::DType;
use std::any::Any;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

/// Which control-flow construct a [`ControlCall`] is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ControlKind {
    /// A loop over `length` iterations that slices its scanned arrays and
    /// stacks its per-iteration outputs; `reverse` runs from the last
    /// slice to the first.
    Scan {
        /// The trip count (symbolic under shapeless compile).
        length: Dim,
        /// Iterate from the end.
        reverse: bool,
    },
    /// A loop that runs its body while its condition holds.
    While,
    /// Runs the branch the index names.
    Switch,
}

/// The subgraphs of a control-flow op, opaque to the op families: the IR
/// implements this for its graphs.
pub trait Subgraphs: fmt::Debug + Send + Sync {
    /// `self` as `Any`, for the IR to read its graphs back.
    fn as_any(&self) -> &dyn Any;
    /// True when `other` holds equal subgraphs.
    fn equals(&self, other: &dyn Subgraphs) -> bool;
    /// Hashes the subgraphs.
    fn hash_into(&self, state: &mut dyn Hasher);
}

/// A control-flow op: its kind, its subgraphs and the avals its operands
/// and results must have.
#[derive(Clone)]
pub struct ControlCall {
    /// Which construct.
    pub kind: ControlKind,
    /// How many leading operands (after a switch's index) are captured
    /// values every subgraph reads.
    pub num_consts: usize,
    /// How many operands after the consts are carries (scan, while) or
    /// the branches' operands (switch).
    pub num_carry: usize,
    /// The avals each operand must have, in order.
    pub operands: Vec<Aval>,
    /// The results' avals, in order.
    pub results: Vec<Aval>,
    /// The guards the subgraphs' shape rules recorded.
    pub guards: Vec<Guard>,
    pub(crate) graphs: Arc<dyn Subgraphs>,
}

impl PartialEq for ControlCall {
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind
            && self.num_consts == other.num_consts
            && self.num_carry == other.num_carry
            && self.operands == other.operands
            && self.results == other.results
            && self.graphs.equals(&*other.graphs)
    }
}

impl Eq for ControlCall {}

impl Hash for ControlCall {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.kind.hash(state);
        self.num_consts.hash(state);
        self.num_carry.hash(state);
        self.operands.hash(state);
        self.results.hash(state);
        self.graphs.hash_into(state);
    }
}

impl fmt::Debug for ControlCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// How one input of a subgraph is fed ([`ControlCall::subgraph_inputs`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubgraphInput {
    /// The control node's operand it reads.
    pub operand: usize,
    /// It reads the operand's slice (along axis 0) for the iteration.
    pub sliced: bool,
    /// The subgraph may write over it.
    pub donated: bool,
}

/// The aval of a control node's own value: an empty token.
pub fn token_aval() -> Aval {
    Aval::new(Shape::known(&[0]), DType::U8)
}

impl ControlCall {
    /// The op's name: `scan`, `while_loop` or `switch`.
    pub fn name(&self) -> &'static str {
        match self.kind {
            ControlKind::Scan { .. } => "scan",
            ControlKind::While => "while_loop",
            ControlKind::Switch => "switch",
        }
    }

    /// The op with its parameters, for reports.
    pub fn describe(&self) -> String {
        match &self.kind {
            ControlKind::Scan { length, reverse } => format!(
                "scan(length={length}{}, carries={}, results={})",
                if *reverse { ", reverse" } else { "" },
                self.num_carry,
                self.results.len()
            ),
            ControlKind::While => format!("while_loop(carries={})", self.num_carry),
            ControlKind::Switch => format!("switch(results={})", self.results.len()),
        }
    }

    /// The position of the first operand after the consts (a switch's
    /// index comes first).
    pub fn first_const(&self) -> usize {
        usize::from(self.kind == ControlKind::Switch)
    }

    /// The operand positions of the carries (scan, while) or the
    /// branches' operands (switch).
    pub fn carry_operands(&self) -> std::ops::Range<usize> {
        let start = self.first_const() + self.num_consts;
        start..start + self.num_carry
    }

    /// How subgraph `graph` reads the node's operands: per subgraph input,
    /// in order, the operand position it reads, whether it reads one slice
    /// (along axis 0) per iteration, and whether the subgraph may write
    /// over it (a loop body's carries: each iteration's carry is its own).
    pub fn subgraph_inputs(&self, graph: usize) -> Vec<SubgraphInput> {
        let carries = self.carry_operands();
        let donated = match self.kind {
            ControlKind::Scan { .. } => true,
            ControlKind::While => graph == 1,
            ControlKind::Switch => false,
        };
        let mut inputs: Vec<SubgraphInput> = (self.first_const()..carries.end)
            .map(|operand| SubgraphInput {
                operand,
                sliced: false,
                donated: donated && carries.contains(&operand),
            })
            .collect();
        if let ControlKind::Scan { .. } = self.kind {
            inputs.extend(
                (carries.end..self.operands.len()).map(|operand| SubgraphInput {
                    operand,
                    sliced: true,
                    donated: false,
                }),
            );
        }
        inputs
    }

    /// The shape rule: every operand has the aval it was traced with
    /// (symbolic dims unified, their equalities recorded as guards); the
    /// value is a token.
    pub fn shape_rule(&self, inputs: &[&Aval], cx: &mut ShapeCx) -> Result<Aval> {
        if inputs.len() != self.operands.len() {
            return Err(arg_err(
                self.name(),
                format!(
                    "expects {} operands, got {}",
                    self.operands.len(),
                    inputs.len()
                ),
            ));
        }
        for (position, (given, want)) in inputs.iter().zip(&self.operands).enumerate() {
            let fits = given.dtype == want.dtype
                && given.shape.rank() == want.shape.rank()
                && given
                    .shape
                    .dims()
                    .iter()
                    .zip(want.shape.dims())
                    .all(|(a, b)| cx.unify(a, b).is_some());
            if !fits {
                return Err(shape_err(
                    self.name(),
                    &[given],
                    format!("operand {position} must be {want}, as the body was traced for"),
                ));
            }
        }
        cx.guards.extend(self.guards.iter().cloned());
        Ok(token_aval())
    }

    /// The control node applied to `operands`, and its results.
    pub fn apply(self: Arc<Self>, operands: Vec<Array>) -> Vec<Array> {
        let results = self.results.clone();
        let token = Array::apply(Op::Control(self), operands);
        results
            .into_iter()
            .enumerate()
            .map(|(index, aval)| Array::apply(Op::Get { index, aval }, vec![token.clone()]))
            .collect()
    }
}

/// The shape rule of [`Op::Get`]: the result's aval, read from a token.
pub fn get_shape_rule(aval: &Aval, token: &Aval) -> Result<Aval> {
    if *token != token_aval() {
        return Err(shape_err(
            "get",
            &[token],
            "reads a result of a control-flow node, whose value is a u8[0] token",
        ));
    }
    Ok(aval.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Names(Vec<&'static str>);

    impl Subgraphs for Names {
        fn as_any(&self) -> &dyn Any {
            self
        }
        fn equals(&self, other: &dyn Subgraphs) -> bool {
            other.as_any().downcast_ref::<Names>() == Some(self)
        }
        fn hash_into(&self, mut state: &mut dyn Hasher) {
            self.0.hash(&mut state);
        }
    }

    fn call(body: &'static str) -> ControlCall {
        ControlCall {
            kind: ControlKind::While,
            num_consts: 0,
            num_carry: 1,
            operands: vec![Aval::new([2], DType::F32)],
            results: vec![Aval::new([2], DType::F32)],
            guards: Vec::new(),
            graphs: Arc::new(Names(vec![body])),
        }
    }

    #[test]
    fn calls_are_equal_only_with_equal_subgraphs() {
        assert_eq!(call("a"), call("a"));
        assert_ne!(call("a"), call("b"));
    }

    #[test]
    fn an_operand_of_another_aval_is_an_error_naming_its_position() {
        let f16 = Aval::new([2], DType::F16);
        let err = call("a")
            .shape_rule(&[&f16], &mut ShapeCx::new())
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("while_loop") && msg.contains("operand 0") && msg.contains("f32[2]"),
            "{msg}"
        );
    }

    #[test]
    fn get_reads_only_a_token() {
        let aval = Aval::new([3], DType::I32);
        assert_eq!(get_shape_rule(&aval, &token_aval()), Ok(aval.clone()));
        assert!(get_shape_rule(&aval, &Aval::new([0], DType::F32)).is_err());
    }
}
