//! The [`Optimizer`] trait, and [`Clipped`], the optimizer its
//! [`Optimizer::clip`] makes.

use super::clip::clip_by_global_norm;
use crate::{Array, Result, Tree};

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
    /// array (see the [module docs](super)). A structural difference or a
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

/// An optimizer whose gradients are clipped to global norm `max_norm`
/// before its update (see [`clip_by_global_norm`]); made by
/// [`Optimizer::clip`]. Its state is the inner optimizer's. To log the
/// norm, call [`clip_by_global_norm`] and the inner optimizer instead.
#[derive(Clone, Debug, PartialEq)]
pub struct Clipped<O> {
    /// The optimizer that applies the clipped gradients.
    pub inner: O,
    /// The largest global norm passed on.
    pub max_norm: f64,
}

impl<O> Clipped<O> {
    /// `inner` with gradients clipped to global norm `max_norm`.
    pub fn new(inner: O, max_norm: f64) -> Clipped<O> {
        Clipped { inner, max_norm }
    }
}

impl<O: Optimizer> Optimizer for Clipped<O> {
    type State<P: Tree> = O::State<P>;

    fn init<P: Tree>(&self, params: &P) -> Result<O::State<P>> {
        self.inner.init(params)
    }

    fn update<P: Tree>(
        &self,
        params: &P,
        grads: &P,
        state: &O::State<P>,
        step: &Array,
    ) -> Result<(P, O::State<P>)> {
        let (grads, _) = clip_by_global_norm(grads, self.max_norm)?;
        self.inner.update(params, &grads, state, step)
    }
}
