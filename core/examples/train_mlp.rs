//! Trains a small MLP with SGD on synthetic data, inside one compiled,
//! donated training step: forward, backward and update are one cached
//! executable, and the parameters' buffers are reused for their updates.
//!
//! `cargo run --example train_mlp -p kiln`

use kiln::random::Key;
use kiln::{compile, value_and_grad, Array, DType, Result, Tree};

/// The model: two dense layers with a tanh between them.
#[derive(Tree, Clone)]
struct Mlp {
    w1: Array,
    b1: Array,
    w2: Array,
    b2: Array,
    /// Static: part of the cache key, never differentiated.
    #[tree(static)]
    hidden: usize,
}

const LEARNING_RATE: f32 = 0.1;

impl Mlp {
    fn new(key: Key, inputs: usize, hidden: usize) -> Result<Mlp> {
        let scale = |fan_in: usize| 1.0 / (fan_in as f32).sqrt();
        Ok(Mlp {
            w1: Array::random_normal(key.fold_in(0), &[inputs, hidden], DType::F32)?
                * scale(inputs),
            b1: Array::zeros(&[hidden], DType::F32),
            w2: Array::random_normal(key.fold_in(1), &[hidden, 1], DType::F32)? * scale(hidden),
            b2: Array::zeros(&[1], DType::F32),
            hidden,
        })
    }

    fn forward(&self, x: &Array) -> Array {
        (x.matmul(&self.w1) + &self.b1).tanh().matmul(&self.w2) + &self.b2
    }
}

/// Mean squared error of the model on a batch.
fn loss((model, x, y): (Mlp, Array, Array)) -> Array {
    let error = model.forward(&x) - &y;
    (&error * &error).mean_all()
}

/// A regression target the model can learn: y = sin(x · a).
fn batch(key: Key, size: usize, inputs: usize) -> Result<(Array, Array)> {
    let x = Array::random_normal(key, &[size, inputs], DType::F32)?;
    let direction = Array::arange(1.0, inputs as f64 + 1.0, 1.0, DType::F32)? / inputs as f32;
    let y = x.matmul(&direction.reshape(&[inputs as i64, 1])).sin();
    Ok((x, y))
}

/// Trains for `steps` steps and returns the loss before each.
fn train(steps: usize) -> Result<Vec<f32>> {
    let (inputs, hidden) = (4, 32);
    let step = compile(
        |(model, x, y): (Mlp, Array, Array)| -> Result<(Mlp, Array)> {
            let (value, (g, _, _)) =
                value_and_grad(loss)
                    .wrt(["args[0]"])
                    .call(&(model.clone(), x, y))?;
            let sgd = |w: &Array, dw: &Array| w - &(dw * LEARNING_RATE);
            let updated = Mlp {
                w1: sgd(&model.w1, &g.w1),
                b1: sgd(&model.b1, &g.b1),
                w2: sgd(&model.w2, &g.w2),
                b2: sgd(&model.b2, &g.b2),
                hidden: model.hidden,
            };
            Ok((updated, value))
        },
    )
    .donate(["args[0]"]);
    let mut model = Mlp::new(Key::new(0), inputs, hidden)?;
    let mut losses = Vec::with_capacity(steps);
    for i in 0..steps {
        let (x, y) = batch(Key::new(1).fold_in(i as u64), 64, inputs)?;
        let (next, value) = step.call_owned((model, x, y))?;
        losses.push(value.item::<f32>()?);
        model = next;
    }
    Ok(losses)
}

fn main() -> Result<()> {
    let losses = train(200)?;
    for (i, loss) in losses.iter().enumerate().step_by(20) {
        println!("step {i:3}: loss {loss:.4}");
    }
    println!(
        "step {:3}: loss {:.4}",
        losses.len() - 1,
        losses[losses.len() - 1]
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_short_training_run_lowers_the_loss() {
        let losses = super::train(60).expect("training runs");
        let first: f32 = losses[..5].iter().sum::<f32>() / 5.0;
        let last: f32 = losses[55..].iter().sum::<f32>() / 5.0;
        assert!(last < 0.5 * first, "loss {first} → {last}");
    }
}
