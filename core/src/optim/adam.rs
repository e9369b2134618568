//! Adam and AdamW (decoupled weight decay), with bias correction computed
//! from the step array.

use super::checks::{as_dtype, matching_leaves, require, step_as_f32};
use super::optimizer::Optimizer;
use super::schedule::Schedule;
use crate::{tree_map, tree_map_n, Array, DType, Result, Tree};

/// Adam (Kingma & Ba), as optax's `adam` and PyTorch's `Adam` define it.
/// For each parameter `p` with gradient `g`, at step `t = step + 1` and
/// learning rate `lr` (from the schedule at `step`):
///
/// ```text
/// m ← β₁ · m + (1 − β₁) · g
/// v ← β₂ · v + (1 − β₂) · g²
/// p ← p − lr · (m / (1 − β₁ᵗ)) / (√(v / (1 − β₂ᵗ)) + ε)
/// ```
///
/// Defaults: β₁ = 0.9, β₂ = 0.999, ε = 1e-8.
///
/// ```
/// use kiln::optim::{Adam, Optimizer};
/// use kiln::{Array, DType};
/// let opt = Adam::new(0.1);
/// let p = vec![Array::ones(&[2], DType::F32)];
/// let g = vec![Array::full(&[2], 3.0, DType::F32)];
/// let state = opt.init(&p)?;
/// let (p, _) = opt.update(&p, &g, &state, &Array::scalar(0.0, DType::F32))?;
/// // The first step moves every parameter by about lr.
/// assert!((p[0].to_vec::<f32>()?[0] - 0.9).abs() < 1e-6);
/// # Ok::<(), kiln::Error>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
pub struct Adam {
    /// The learning rate.
    pub lr: Schedule,
    /// The decay of the first moment.
    pub beta1: f64,
    /// The decay of the second moment.
    pub beta2: f64,
    /// Added to the root of the second moment.
    pub eps: f64,
}

/// AdamW (Loshchilov & Hutter): [`Adam`] with decoupled weight decay, as
/// optax's `adamw` and PyTorch's `AdamW` define it:
///
/// ```text
/// p ← p − lr · ((m / (1 − β₁ᵗ)) / (√(v / (1 − β₂ᵗ)) + ε) + weight_decay · p)
/// ```
///
/// Defaults: β₁ = 0.9, β₂ = 0.999, ε = 1e-8, weight decay 0.01.
#[derive(Clone, Debug, PartialEq)]
pub struct AdamW {
    /// The learning rate.
    pub lr: Schedule,
    /// The decay of the first moment.
    pub beta1: f64,
    /// The decay of the second moment.
    pub beta2: f64,
    /// Added to the root of the second moment.
    pub eps: f64,
    /// The decoupled weight decay, scaled by the learning rate.
    pub weight_decay: f64,
}

/// The state of [`Adam`] and [`AdamW`]: both moments, shaped like the
/// parameters.
#[derive(Tree, Clone, Debug)]
pub struct AdamState<P> {
    /// The first moment (mean of the gradients).
    pub m: P,
    /// The second moment (mean of the squared gradients).
    pub v: P,
}

impl Adam {
    /// Adam at learning rate `lr` (a number or a [`Schedule`]) with the
    /// default betas and epsilon.
    pub fn new(lr: impl Into<Schedule>) -> Adam {
        Adam {
            lr: lr.into(),
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
        }
    }

    /// With moment decays `beta1` and `beta2`.
    pub fn betas(mut self, beta1: f64, beta2: f64) -> Adam {
        (self.beta1, self.beta2) = (beta1, beta2);
        self
    }

    /// With epsilon `eps`.
    pub fn eps(mut self, eps: f64) -> Adam {
        self.eps = eps;
        self
    }
}

impl AdamW {
    /// AdamW at learning rate `lr` (a number or a [`Schedule`]) with the
    /// default betas, epsilon and weight decay.
    pub fn new(lr: impl Into<Schedule>) -> AdamW {
        AdamW {
            lr: lr.into(),
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }

    /// With moment decays `beta1` and `beta2`.
    pub fn betas(mut self, beta1: f64, beta2: f64) -> AdamW {
        (self.beta1, self.beta2) = (beta1, beta2);
        self
    }

    /// With epsilon `eps`.
    pub fn eps(mut self, eps: f64) -> AdamW {
        self.eps = eps;
        self
    }

    /// With decoupled weight decay `weight_decay`.
    pub fn weight_decay(mut self, weight_decay: f64) -> AdamW {
        self.weight_decay = weight_decay;
        self
    }
}

/// The rule both optimizers share, under composition name `name`.
struct AdamRule<'a> {
    name: &'static str,
    lr: &'a Schedule,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
}

impl Optimizer for Adam {
    type State<P: Tree> = AdamState<P>;

    fn init<P: Tree>(&self, params: &P) -> Result<AdamState<P>> {
        self.rule().init(params)
    }

    fn update<P: Tree>(
        &self,
        params: &P,
        grads: &P,
        state: &AdamState<P>,
        step: &Array,
    ) -> Result<(P, AdamState<P>)> {
        self.rule().update(params, grads, state, step)
    }
}

impl Optimizer for AdamW {
    type State<P: Tree> = AdamState<P>;

    fn init<P: Tree>(&self, params: &P) -> Result<AdamState<P>> {
        self.rule().init(params)
    }

    fn update<P: Tree>(
        &self,
        params: &P,
        grads: &P,
        state: &AdamState<P>,
        step: &Array,
    ) -> Result<(P, AdamState<P>)> {
        self.rule().update(params, grads, state, step)
    }
}

impl Adam {
    fn rule(&self) -> AdamRule<'_> {
        AdamRule {
            name: "adam",
            lr: &self.lr,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: 0.0,
        }
    }
}

impl AdamW {
    fn rule(&self) -> AdamRule<'_> {
        AdamRule {
            name: "adamw",
            lr: &self.lr,
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: self.weight_decay,
        }
    }
}

impl AdamRule<'_> {
    fn validate(&self) -> Result<()> {
        let unit = |b: f64| (0.0..1.0).contains(&b);
        require(
            self.name,
            "beta1",
            self.beta1,
            unit(self.beta1),
            "in [0, 1)",
        )?;
        require(
            self.name,
            "beta2",
            self.beta2,
            unit(self.beta2),
            "in [0, 1)",
        )?;
        require(self.name, "eps", self.eps, self.eps >= 0.0, ">= 0")?;
        require(
            self.name,
            "weight_decay",
            self.weight_decay,
            self.weight_decay >= 0.0,
            ">= 0",
        )
    }

    fn init<P: Tree>(&self, params: &P) -> Result<AdamState<P>> {
        self.validate()?;
        Ok(AdamState {
            m: tree_map(params, |p| Ok(p.zeros_like()))?,
            v: tree_map(params, |p| Ok(p.zeros_like()))?,
        })
    }

    fn update<P: Tree>(
        &self,
        params: &P,
        grads: &P,
        state: &AdamState<P>,
        step: &Array,
    ) -> Result<(P, AdamState<P>)> {
        self.validate()?;
        crate::in_composition(self.name, || {
            let step = step_as_f32(self.name, step)?;
            let lr = self.lr.at(&step);
            let t = &step + 1.0;
            // 1 − βᵗ, with t an array so that the step stays traced.
            let correction = |beta: f64| 1.0 - Array::scalar(beta, DType::F32).pow(&t);
            let (c1, c2) = (correction(self.beta1), correction(self.beta2));
            let names = ["parameter", "gradient", "first moment", "second moment"];
            let (b1, b2) = (self.beta1, self.beta2);
            let m = tree_map_n(&[params, grads, &state.m, &state.v], |x| {
                matching_leaves(self.name, &names, x)?;
                (x[2] * b1 + x[1] * (1.0 - b1)).check()
            })?;
            let v = tree_map_n(&[grads, &state.v], |x| {
                (x[1] * b2 + x[0] * x[0] * (1.0 - b2)).check()
            })?;
            let params = tree_map_n(&[params, &m, &v], |x| self.step_leaf(x, &lr, &c1, &c2))?;
            Ok((params, AdamState { m, v }))
        })
    }

    /// The new parameter from `[p, m, v]` (moments already updated).
    fn step_leaf(&self, x: &[&Array], lr: &Array, c1: &Array, c2: &Array) -> Result<Array> {
        let dtype = x[0].dtype();
        let like = |a: &Array| as_dtype(a, dtype);
        let m_hat = x[1] / like(c1);
        let v_hat = x[2] / like(c2);
        let mut direction = m_hat / (v_hat.sqrt() + self.eps);
        if self.weight_decay != 0.0 {
            direction = direction + x[0] * self.weight_decay;
        }
        (x[0] - direction * like(lr)).check()
    }
}
