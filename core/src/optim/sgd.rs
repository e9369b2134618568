//! Stochastic gradient descent with momentum, Nesterov momentum and
//! (coupled) weight decay, as PyTorch's `SGD` defines them.

use super::checks::{as_dtype, matching_leaves, require, step_as_f32};
use super::optimizer::Optimizer;
use super::schedule::Schedule;
use crate::{tree_map, tree_map2, tree_map_n, Array, Result, Tree};

/// SGD. For each parameter `p` with gradient `g`, at learning rate `lr`
/// (from the schedule at the step):
///
/// ```text
/// g ← g + weight_decay · p
/// v ← momentum · v + g              (v starts at 0; only with momentum > 0)
/// g ← g + momentum · v  (Nesterov)  or  g ← v  (plain momentum)
/// p ← p − lr · g
/// ```
///
/// Defaults: no momentum, no Nesterov, no weight decay.
///
/// ```
/// use kiln::optim::{Optimizer, Sgd};
/// use kiln::{Array, DType};
/// let opt = Sgd::new(0.1).momentum(0.9);
/// let p = vec![Array::ones(&[2], DType::F32)];
/// let g = vec![Array::ones(&[2], DType::F32)];
/// let state = opt.init(&p)?;
/// let (p, _) = opt.update(&p, &g, &state, &Array::scalar(0.0, DType::F32))?;
/// assert_eq!(p[0].to_vec::<f32>()?, [0.9, 0.9]);
/// # Ok::<(), kiln::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Sgd {
    /// The learning rate.
    pub lr: Schedule,
    /// The momentum factor (0: none).
    pub momentum: f64,
    /// Nesterov momentum (needs `momentum > 0`).
    pub nesterov: bool,
    /// The L2 penalty added to the gradient.
    pub weight_decay: f64,
}

/// The state of [`Sgd`]: the velocity of every parameter, when it uses
/// momentum. Without momentum it holds no array, so a compiled step must
/// not donate it (donating a path that names no leaf is an error).
#[derive(Tree, Clone, Debug)]
pub struct SgdState<P> {
    /// The momentum buffer, shaped like the parameters; `None` without momentum.
    pub velocity: Option<P>,
}

impl Sgd {
    /// Plain SGD at learning rate `lr` (a number or a [`Schedule`]).
    pub fn new(lr: impl Into<Schedule>) -> Sgd {
        Sgd {
            lr: lr.into(),
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
        }
    }

    /// With momentum factor `momentum`.
    pub fn momentum(mut self, momentum: f64) -> Sgd {
        self.momentum = momentum;
        self
    }

    /// With Nesterov momentum when `nesterov`.
    pub fn nesterov(mut self, nesterov: bool) -> Sgd {
        self.nesterov = nesterov;
        self
    }

    /// With L2 penalty `weight_decay` added to the gradients.
    pub fn weight_decay(mut self, weight_decay: f64) -> Sgd {
        self.weight_decay = weight_decay;
        self
    }

    fn validate(&self) -> Result<()> {
        require(
            "sgd",
            "momentum",
            self.momentum,
            (0.0..=1.0).contains(&self.momentum),
            "in [0, 1]",
        )?;
        require(
            "sgd",
            "weight_decay",
            self.weight_decay,
            self.weight_decay >= 0.0,
            ">= 0",
        )?;
        if self.nesterov {
            require(
                "sgd",
                "momentum",
                self.momentum,
                self.momentum > 0.0,
                "> 0 with Nesterov",
            )?;
        }
        Ok(())
    }
}

impl Optimizer for Sgd {
    type State<P: Tree> = SgdState<P>;

    fn init<P: Tree>(&self, params: &P) -> Result<SgdState<P>> {
        self.validate()?;
        let velocity = if self.momentum > 0.0 {
            Some(tree_map(params, |p| Ok(p.zeros_like()))?)
        } else {
            None
        };
        Ok(SgdState { velocity })
    }

    fn update<P: Tree>(
        &self,
        params: &P,
        grads: &P,
        state: &SgdState<P>,
        step: &Array,
    ) -> Result<(P, SgdState<P>)> {
        self.validate()?;
        crate::in_composition("sgd", || {
            let lr = self.lr.at(&step_as_f32("sgd", step)?);
            let (decay, mu) = (self.weight_decay, self.momentum);
            let grads: P = tree_map_n(&[params, grads], |x| {
                matching_leaves("sgd", &["parameter", "gradient"], x)?;
                if decay == 0.0 {
                    return Ok(x[1].clone());
                }
                (x[1] + x[0] * decay).check()
            })?;
            let velocity = match (&state.velocity, mu > 0.0) {
                (Some(v), true) => Some(tree_map_n(&[params, v, &grads], |x| {
                    matching_leaves("sgd", &["parameter", "velocity"], &x[..2])?;
                    (x[1] * mu + x[2]).check()
                })?),
                (None, false) => None,
                _ => return Err(velocity_mismatch(mu)),
            };
            let nesterov_direction;
            let direction: &P = match &velocity {
                Some(v) if self.nesterov => {
                    nesterov_direction = tree_map2(&grads, v, |g, v| (g + v * mu).check())?;
                    &nesterov_direction
                }
                Some(v) => v,
                None => &grads,
            };
            let params = tree_map_n(&[params, direction], |x| {
                (x[0] - x[1] * as_dtype(&lr, x[0].dtype())).check()
            })?;
            Ok((params, SgdState { velocity }))
        })
    }
}

/// The error for a state whose velocity does not match the momentum.
fn velocity_mismatch(momentum: f64) -> crate::Error {
    crate::Error::Tree {
        path: "velocity".to_string(),
        detail: format!(
            "sgd: momentum is {momentum} but the state {} a velocity; \
             make the state with this optimizer's `init`",
            if momentum > 0.0 { "has no" } else { "has" }
        ),
    }
}
