//! Gradient clipping by global norm.

use super::checks::{as_dtype, require};
use crate::{tree_leaves, tree_map, Array, DType, Result, Tree};

/// `grads` scaled so that their global norm (the 2-norm of all leaves
/// together) is at most `max_norm`, and that norm before clipping (an `f32`
/// scalar). Gradients already within the bound are unchanged; the norm is
/// summed in `f32` whatever the leaves' dtypes. `max_norm` must be positive.
///
/// ```
/// use kiln::optim::clip_by_global_norm;
/// use kiln::Array;
/// let grads = (Array::from_vec(vec![3.0f32], &[1])?, Array::from_vec(vec![4.0f32], &[1])?);
/// let ((a, b), norm) = clip_by_global_norm(&grads, 1.0)?;
/// assert_eq!(norm.item::<f32>()?, 5.0);
/// assert_eq!((a.item::<f32>()?, b.item::<f32>()?), (0.6, 0.8));
/// # Ok::<(), kiln::Error>(())
/// ```
pub fn clip_by_global_norm<P: Tree>(grads: &P, max_norm: f64) -> Result<(P, Array)> {
    require(
        "clip_by_global_norm",
        "max_norm",
        max_norm,
        max_norm > 0.0 && max_norm.is_finite(),
        "positive and finite",
    )?;
    crate::in_composition("clip_by_global_norm", || {
        let squares = tree_leaves(grads)?.into_iter().map(|g| {
            let g = as_dtype(&g, DType::F32);
            (&g * &g).sum_all()
        });
        let norm = squares
            .reduce(|a, b| a + b)
            .unwrap_or_else(|| Array::scalar(0.0, DType::F32))
            .sqrt()
            .check()?;
        // max_norm / max(norm, max_norm): 1 within the bound, and no
        // division by a zero norm.
        let scale = max_norm as f32 / norm.maximum(max_norm);
        let clipped = tree_map(grads, |g| (g * as_dtype(&scale, g.dtype())).check())?;
        Ok((clipped, norm))
    })
}
