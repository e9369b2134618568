//! Neural-network functions as compositions of core ops (no new primitives:
//! fusion makes them fast where a backend fuses).

use crate::handle::array::Array;
use crate::location::in_composition;

/// `softmax` along `axis`, stabilised by subtracting the maximum.
///
/// ```
/// use kiln::{nn, Array};
/// let p = nn::softmax(&Array::from_vec(vec![1.0f32, 1.0], &[2])?, -1);
/// assert_eq!(p.to_vec::<f32>()?, vec![0.5, 0.5]);
/// # Ok::<(), kiln::Error>(())
/// ```
#[track_caller]
pub fn softmax(x: &Array, axis: isize) -> Array {
    in_composition("softmax", || {
        if empty_float_axis(x, axis) {
            return x.clone();
        }
        let shifted = x - x.max(&[axis], true);
        let e = shifted.exp();
        &e / e.sum(&[axis], true)
    })
}

/// `log(softmax(x))` along `axis`, computed without forming the softmax.
#[track_caller]
pub fn log_softmax(x: &Array, axis: isize) -> Array {
    in_composition("log_softmax", || {
        if empty_float_axis(x, axis) {
            return x.clone();
        }
        let shifted = x - x.max(&[axis], true);
        let log_sum = shifted.exp().sum(&[axis], true).log();
        shifted - log_sum
    })
}

/// True when float `x`'s `axis` has size 0: the (log-)softmax over it has
/// no elements, and is `x` itself, while its maximum would have none to
/// take (as in JAX, the result is the empty array, not an error).
fn empty_float_axis(x: &Array, axis: isize) -> bool {
    let dims = &x.shape().0;
    let rank = dims.len() as isize;
    let index = if axis < 0 { axis + rank } else { axis };
    x.dtype().is_float() && (0..rank).contains(&index) && dims[index as usize].known() == Some(0)
}

/// GELU with the exact erf form: `x/2 · (1 + erf(x/√2))`.
#[track_caller]
pub fn gelu(x: &Array) -> Array {
    in_composition("gelu", || {
        x * 0.5 * ((x * std::f64::consts::FRAC_1_SQRT_2).erf() + 1.0)
    })
}

/// GELU with the tanh approximation used by many transformer checkpoints.
#[track_caller]
pub fn gelu_tanh(x: &Array) -> Array {
    in_composition("gelu_tanh", || {
        let sqrt_2_over_pi = (2.0 / std::f64::consts::PI).sqrt();
        let inner = (x + x * x * x * 0.044715) * sqrt_2_over_pi;
        x * 0.5 * (inner.tanh() + 1.0)
    })
}

/// Layer normalisation over the last axis, with optional scale and shift.
#[track_caller]
pub fn layer_norm(x: &Array, weight: Option<&Array>, bias: Option<&Array>, eps: f64) -> Array {
    in_composition("layer_norm", || {
        let centered = x - x.mean(&[-1], true);
        let variance = (&centered * &centered).mean(&[-1], true);
        let mut y = centered * (variance + eps).rsqrt();
        if let Some(w) = weight {
            y = y * w;
        }
        if let Some(b) = bias {
            y = y + b;
        }
        y
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    #[test]
    fn softmax_and_log_softmax_over_an_empty_axis_are_the_empty_array() {
        let x = Array::zeros(&[2, 0], DType::F32);
        for y in [softmax(&x, -1), log_softmax(&x, 1)] {
            assert_eq!(y.shape().as_known(), Some(vec![2, 0]));
            assert_eq!(
                y.to_vec::<f32>().expect("an empty result"),
                Vec::<f32>::new()
            );
        }
    }

    #[test]
    fn softmax_over_a_non_empty_axis_of_an_empty_array_still_runs() {
        let x = Array::zeros(&[0, 3], DType::F32);
        let y = softmax(&x, -1);
        assert_eq!(y.shape().as_known(), Some(vec![0, 3]));
        assert_eq!(
            y.to_vec::<f32>().expect("an empty result"),
            Vec::<f32>::new()
        );
    }
}
