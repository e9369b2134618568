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
mod clip;
mod schedule;
mod sgd;

pub use adam::{Adam, AdamState, AdamW};
pub use clip::{clip_by_global_norm, Clipped};
pub use schedule::Schedule;
pub use sgd::{Sgd, SgdState};

use crate::{Array, DType, Error, Result, Tree};

/// An update rule: state built from the parameters' tree, and a pure
/// function from `(params, grads, state, step)` to new parameters and state.
pub trait Optimizer {
    /// The state kept for parameters of type `P` (moments, velocity): a
    /// tree, so that a compiled step takes and returns it, and can donate it.
    type State<P: Tree>: Tree;

    /// The state before the first update (zeros shaped like `params`).
    fn init<P: Tree>(&self, params: &P) -> Result<Self::State<P>>;

    /// New parameters and state after one step. `grads` has the structure
    /// of `params` and `state` is the state `init` or `update` made;
    /// `step` is the number of updates applied before this one, a scalar
    /// array (see the [module docs](self)). A structural difference or a
    /// leaf whose shape or dtype differs from its parameter's is an `Err`
    /// naming its path.
    fn update<P: Tree>(
        &self,
        params: &P,
        grads: &P,
        state: &Self::State<P>,
        step: &Array,
    ) -> Result<(P, Self::State<P>)>;

    /// This optimizer with the gradients clipped to global norm
    /// `max_norm` first (see [`clip_by_global_norm`]).
    fn clip(self, max_norm: f64) -> Clipped<Self>
    where
        Self: Sized,
    {
        Clipped::new(self, max_norm)
    }
}

/// `step` checked to be a scalar and converted to `f32`, for optimizer `op`.
fn step_as_f32(op: &str, step: &Array) -> Result<Array> {
    let step = step.clone().check()?;
    if step.ndim() != 0 || step.dtype() == DType::Bool {
        return Err(Error::InvalidArgument {
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
fn as_dtype(x: &Array, dtype: DType) -> Array {
    if x.dtype() == dtype {
        x.clone()
    } else {
        x.cast(dtype)
    }
}

/// Checks that every leaf in `leaves` has the shape and dtype of the first
/// (the parameter); `names` names them. The error is a tree error at
/// `<root>`, which [`crate::tree_map_n`] turns into the leaf's path.
fn matching_leaves(op: &str, names: &[&str], leaves: &[&Array]) -> Result<()> {
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
fn require(op: &str, name: &str, value: f64, ok: bool, must: &str) -> Result<()> {
    if ok {
        return Ok(());
    }
    Err(Error::InvalidArgument {
        op: op.to_string(),
        detail: format!("{name} = {value}, but it must be {must}"),
    })
}
