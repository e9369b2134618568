//! Learning-rate schedules, evaluable on the host and in the graph.

use crate::{Array, DType};
use std::f64::consts::PI;

/// A learning rate as a function of the step (the number of updates
/// applied before this one, from 0). [`Schedule::value`] evaluates it on
/// the host; [`Schedule::at`] builds it in the graph from a step *array*,
/// so that a compiled training step takes the step as a traced argument
/// and does not retrace when it changes.
///
/// A plain number converts into [`Schedule::Constant`].
///
/// ```
/// use kiln::optim::Schedule;
/// let s = Schedule::warmup_cosine(1.0, 10, 100, 0.1);
/// assert_eq!(s.value(0), 0.0);
/// assert_eq!(s.value(5), 0.5);
/// assert_eq!(s.value(10), 1.0);
/// assert!((s.value(60) - 0.55).abs() < 1e-12);
/// assert_eq!(s.value(500), 0.1);
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum Schedule {
    /// The same rate at every step.
    Constant(f64),
    /// Linear warm-up from 0 to `peak` over `warmup_steps` steps, then a
    /// cosine decay from `peak` to `final_lr` over the next `decay_steps`
    /// steps, then `final_lr`.
    WarmupCosine {
        /// The rate at the end of the warm-up.
        peak: f64,
        /// Steps of linear warm-up (0: start at `peak`).
        warmup_steps: usize,
        /// Steps of cosine decay after the warm-up (0: drop to `final_lr`).
        decay_steps: usize,
        /// The rate after the decay.
        final_lr: f64,
    },
}

impl Schedule {
    /// A constant rate.
    pub fn constant(lr: f64) -> Schedule {
        Schedule::Constant(lr)
    }

    /// Warm-up then cosine decay (see [`Schedule::WarmupCosine`]).
    pub fn warmup_cosine(
        peak: f64,
        warmup_steps: usize,
        decay_steps: usize,
        final_lr: f64,
    ) -> Schedule {
        Schedule::WarmupCosine {
            peak,
            warmup_steps,
            decay_steps,
            final_lr,
        }
    }

    /// The rate at `step`, on the host.
    pub fn value(&self, step: usize) -> f64 {
        match *self {
            Schedule::Constant(lr) => lr,
            Schedule::WarmupCosine {
                peak,
                warmup_steps,
                decay_steps,
                final_lr,
            } => {
                if step < warmup_steps {
                    return peak * step as f64 / warmup_steps as f64;
                }
                let into_decay = step - warmup_steps;
                if into_decay >= decay_steps {
                    return final_lr;
                }
                let progress = into_decay as f64 / decay_steps as f64;
                final_lr + (peak - final_lr) * 0.5 * (1.0 + (PI * progress).cos())
            }
        }
    }

    /// The rate at `step` (an array of any numeric dtype and shape, used
    /// as `f32`), in the graph: an `f32` array of `step`'s shape.
    ///
    /// ```
    /// use kiln::optim::Schedule;
    /// use kiln::{Array, DType};
    /// let s = Schedule::warmup_cosine(1.0, 10, 100, 0.1);
    /// let rate = s.at(&Array::scalar(5.0, DType::F32));
    /// assert_eq!(rate.item::<f32>()?, 0.5);
    /// # Ok::<(), kiln::Error>(())
    /// ```
    pub fn at(&self, step: &Array) -> Array {
        let step = if step.dtype() == DType::F32 {
            step.clone()
        } else {
            step.cast(DType::F32)
        };
        crate::in_composition("schedule", || match *self {
            Schedule::Constant(lr) => step.zeros_like() + lr,
            Schedule::WarmupCosine {
                peak,
                warmup_steps,
                decay_steps,
                final_lr,
            } => {
                let decayed = if decay_steps == 0 {
                    step.zeros_like() + final_lr
                } else {
                    let progress = ((&step - warmup_steps as f64) / decay_steps as f64)
                        .maximum(0.0)
                        .minimum(1.0);
                    (progress * PI).cos() * (0.5 * (peak - final_lr)) + 0.5 * (peak + final_lr)
                };
                if warmup_steps == 0 {
                    return decayed;
                }
                let warm = &step * (peak / warmup_steps as f64);
                step.less(warmup_steps as f64).select(warm, decayed)
            }
        })
    }
}

impl From<f64> for Schedule {
    fn from(lr: f64) -> Schedule {
        Schedule::Constant(lr)
    }
}
