//! The GPT's training step: the loss, its gradient and an optimizer's
//! update as one pure function, for `compile` with the model and the
//! optimizer state donated, so that a step is one cache entry whose
//! parameters and moments are written in place.

use crate::gpt::Gpt;
use kiln::optim::Optimizer;
use kiln::{value_and_grad, Array, Result};

/// The arguments of a training step: the model, the optimizer's state, the
/// number of updates applied so far (a scalar), the inputs and the targets
/// (`i32[batch, t]`).
pub type StepArgs<S> = (Gpt, S, Array, Array, Array);

/// What a training step returns: the model, the optimizer's state and the
/// loss before the update.
pub type StepResult<S> = (Gpt, S, Array);

/// The argument paths a compiled step donates: the model and the state.
pub const DONATED: [&str; 2] = ["args[0]", "args[1]"];

/// The training step of `optimizer`: `(model, state, step, inputs,
/// targets) → (model, state, loss)`. Compile it and donate [`DONATED`]:
///
/// ```no_run
/// use kiln::optim::{AdamW, Optimizer};
/// use kiln_models::{train, Gpt, GptConfig};
/// let optimizer = AdamW::new(3e-4);
/// let step = kiln::compile(train::step(optimizer.clone())).donate(train::DONATED);
/// let model = Gpt::new(kiln::random::Key::new(0), GptConfig::SMALL)?;
/// let state = optimizer.init(&model)?;
/// # Ok::<(), kiln::Error>(())
/// ```
// Clippy counts the closure's signature as one type; spelled out, it says
// what a step takes and gives better than another alias would.
#[allow(clippy::type_complexity)]
pub fn step<O: Optimizer + Clone>(
    optimizer: O,
) -> impl Fn(StepArgs<O::State<Gpt>>) -> Result<StepResult<O::State<Gpt>>> + Clone {
    move |(model, state, step, inputs, targets)| {
        let loss = |(model, inputs, targets): (Gpt, Array, Array)| model.loss(&inputs, &targets);
        let (value, (grads, _, _)) =
            value_and_grad(loss)
                .wrt(["args[0]"])
                .call(&(model.clone(), inputs, targets))?;
        let (model, state) = optimizer.update(&model, &grads, &state, &step)?;
        Ok((model, state, value))
    }
}
