//! `argsort`: the stable order of each row along one axis, as i32
//! indices, the one sorting primitive (`sort` and `top_k` gather by it;
//! `ops::array_api`). Its shape rule, reference evaluation and batching
//! rule; it has no derivative (an integer output), and a sort's gradient
//! flows through the gather.

use super::batching::Batched;
use crate::data::HostData;
use crate::error::{arg_err, shape_err, Result};
use crate::handle::array::Array;
use crate::ops::Op;
use crate::shape::{Aval, Dim};
use crate::DType;
use std::cmp::Ordering;

const OP: &str = "argsort";

/// The output aval: the operand's shape, i32 (JAX's index dtype); an axis
/// longer than i32 holds has no such indices.
pub fn shape_rule(axis: usize, aval: &Aval) -> Result<Aval> {
    let rank = aval.shape.rank();
    let Some(n) = aval.shape.dims().get(axis) else {
        return Err(arg_err(
            OP,
            format!("axis {axis} is out of range for rank {rank}"),
        ));
    };
    if matches!(n, Dim::Known(n) if *n > i32::MAX as usize) {
        return Err(shape_err(
            OP,
            &[aval],
            format!("axis {axis} is longer than i32 indices reach"),
        ));
    }
    Ok(Aval::new(aval.shape.clone(), DType::I32))
}

/// The order of two keys: NaN above every number and equal to NaN, `-0.0`
/// equal to `0.0`; reversed when `descending`.
fn compare(a: f64, b: f64, descending: bool) -> Ordering {
    let ascending = match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    };
    match descending {
        true => ascending.reverse(),
        false => ascending,
    }
}

/// Reference evaluation: each row along `axis` of contiguous `data` of
/// `shape` sorted stably (equal keys keep their order). Every dtype's
/// values are exact as f64 keys.
pub fn eval(axis: usize, descending: bool, data: &HostData, shape: &[usize]) -> Result<HostData> {
    let Some(&n) = shape.get(axis) else {
        return Err(arg_err(
            OP,
            format!("axis {axis} is out of range for rank {}", shape.len()),
        ));
    };
    let keys = data.to_f64_vec();
    let inner: usize = shape[axis + 1..].iter().product();
    let outer: usize = shape[..axis].iter().product();
    let mut out = vec![0i32; keys.len()];
    let mut order: Vec<usize> = Vec::with_capacity(n);
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| (o * n + k) * inner + i;
            order.clear();
            order.extend(0..n);
            // `sort_by` is stable: ties keep the lower index first.
            order.sort_by(|&a, &b| compare(keys[at(a)], keys[at(b)], descending));
            for (place, &k) in order.iter().enumerate() {
                out[at(place)] = k as i32;
            }
        }
    }
    Ok(HostData::I32(out))
}

/// The batched argsort: the batch axis first, the sorted axis after it.
pub(crate) fn batch(axis: usize, descending: bool, x: &Batched) -> Batched {
    Batched::along(
        Array::apply(
            Op::Argsort {
                axis: axis + 1,
                descending,
            },
            vec![x.front()],
        ),
        0,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_sort_stably_with_nan_above_every_number() {
        let data = HostData::F32(vec![2.0, f32::NAN, -0.0, 0.0, 2.0, -1.0]);
        assert_eq!(
            eval(0, false, &data, &[6]),
            Ok(HostData::I32(vec![5, 2, 3, 0, 4, 1]))
        );
        assert_eq!(
            eval(0, true, &data, &[6]),
            Ok(HostData::I32(vec![1, 0, 4, 2, 3, 5]))
        );
    }

    #[test]
    fn a_middle_axis_sorts_each_column_of_it() {
        // [2, 3, 2]: sort along the middle axis.
        let data = HostData::I32(vec![5, 0, 1, 0, 3, 7, 2, 2, 2, 1, 2, 0]);
        let got = eval(1, false, &data, &[2, 3, 2]);
        assert_eq!(
            got,
            Ok(HostData::I32(vec![1, 0, 2, 1, 0, 2, 0, 2, 1, 1, 2, 0]))
        );
    }

    #[test]
    fn argsort_has_a_zero_tangent_and_batches_with_its_axis_past_the_batch() {
        use crate::compile::rule_checks as rules;
        let x = rules::normal(3, &[4]);
        let (_, t) = crate::jvp(|x: Array| x.argsort(0, false), &x, &x).unwrap();
        assert_eq!(t.to_vec::<i32>().unwrap(), [0; 4]);
        let xs = rules::normal(4, &[3, 2, 5]);
        let f = |x: Vec<Array>| x[0].argsort(1, true).cast(DType::F32);
        let report = rules::assert_batches_like_stacking("argsort", f, &[xs]);
        assert!(
            report.vmap_fallbacks.is_empty(),
            "{:?}",
            report.vmap_fallbacks
        );
    }

    #[test]
    fn the_shape_rule_gives_i32_of_the_operands_shape() {
        let a = Aval::new([2, 3], DType::Bool);
        assert_eq!(shape_rule(1, &a), Ok(Aval::new([2, 3], DType::I32)));
        assert!(shape_rule(2, &a).is_err());
        let empty = HostData::F32(vec![]);
        assert_eq!(eval(1, false, &empty, &[0, 4]), Ok(HostData::I32(vec![])));
    }
}
