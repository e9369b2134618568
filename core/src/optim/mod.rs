//! Optimizers: pure update rules over trees of parameters, in the manner
//! of optax.
//!
//! An [`Optimizer`] builds its state from the parameters' tree
//! ([`Optimizer::init`]) and maps `(params, grads, state, step)` to new
//! parameters and a new state ([`Optimizer::update`]). Nothing is mutated,
//! so an update composes with [`crate::compile()`], [`crate::value_and_grad`]
//! and donation: a training step that takes the parameters, the state and
//! the step count as arguments and returns their successors is one cached
//! executable whose parameters and moments are written in place.
//!
//! The step count is an *array* (a scalar, `f32` or an integer dtype; it is
//! used as `f32`, exact up to 2²⁴ steps), the number of updates applied
//! before this one: `0` for the first call. It is a traced argument, so a
//! compiled step does not retrace when it changes; a learning rate
//! [`Schedule`] and Adam's bias correction are computed from it in the
//! graph.
//!
//! Every update is recorded under its optimizer's name (`sgd`, `adam`,
//! `adamw`, `clip_by_global_norm`; see [`crate::in_composition`]) so that
//! reports group it. Like `nn`, this module uses only Kiln's public API.
//!
//! ```
//! use kiln::optim::{AdamW, Optimizer, Schedule};
//! use kiln::{Array, DType};
//!
//! let opt = AdamW::new(Schedule::warmup_cosine(1e-3, 100, 1_000, 1e-5)).clip(1.0);
//! let params = vec![Array::ones(&[4], DType::F32)];
//! let grads = vec![Array::full(&[4], 0.5, DType::F32)];
//! let state = opt.init(&params)?;
//! let step = Array::scalar(0.0, DType::F32);
//! let (params, state) = opt.update(&params, &grads, &state, &step)?;
//! assert_eq!(params[0].dims(), Some(vec![4]));
//! # let _ = state;
//! # Ok::<(), kiln::Error>(())
//! ```

mod adam;
mod checks;
mod clip;
mod optimizer;
mod schedule;
mod sgd;

pub use adam::{Adam, AdamState, AdamW};
pub use clip::clip_by_global_norm;
pub use optimizer::{Clipped, Optimizer};
pub use schedule::Schedule;
pub use sgd::{Sgd, SgdState};
