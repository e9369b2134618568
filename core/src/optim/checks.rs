//! The checks every optimizer makes on its arguments: the step, the
//! leaves' shapes and dtypes, the hyperparameters.

use crate::{Array, DType, Error, Result};

/// `step` checked to be a scalar and converted to `f32`, for optimizer `op`.
pub(super) fn step_as_f32(op: &str, step: &Array) -> Result<Array> {
    let step = step.clone().check()?;
    if step.ndim() != 0 || step.dtype() == DType::Bool {
        return Err(Error::InvalidArgument {
            at: None,
            op: op.to_string(),
            detail: format!(
                "the step must be a numeric scalar (the updates applied so far), got {}",
                step.aval()
            ),
        });
    }
    Ok(as_dtype(&step, DType::F32))
}

/// `x` in `dtype` (itself when it already is).
pub(super) fn as_dtype(x: &Array, dtype: DType) -> Array {
    if x.dtype() == dtype {
        x.clone()
    } else {
        x.cast(dtype)
    }
}

/// Checks that every leaf in `leaves` has the shape and dtype of the first
/// (the parameter); `names` names them. The error is a tree error at
/// `<root>`, which [`crate::tree_map_n`] turns into the leaf's path.
pub(super) fn matching_leaves(op: &str, names: &[&str], leaves: &[&Array]) -> Result<()> {
    let first = leaves[0];
    for (name, leaf) in names.iter().zip(leaves).skip(1) {
        if leaf.shape() != first.shape() || leaf.dtype() != first.dtype() {
            return Err(Error::Tree {
                path: "<root>".to_string(),
                detail: format!(
                    "{op}: the {name} is {} but the {} is {}",
                    leaf.aval(),
                    names[0],
                    first.aval()
                ),
            });
        }
    }
    Ok(())
}

/// An `Err` naming hyperparameter `name` of `op` unless `ok`; `must`
/// says what it must be (`in [0, 1)`).
pub(super) fn require(op: &str, name: &str, value: f64, ok: bool, must: &str) -> Result<()> {
    if ok {
        return Ok(());
    }
    Err(Error::InvalidArgument {
        at: None,
        op: op.to_string(),
        detail: format!("{name} = {value}, but it must be {must}"),
    })
}
