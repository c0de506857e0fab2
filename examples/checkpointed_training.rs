//! Trains a deep residual MLP, written once as an annotated forward, on synthetic regression data:
//! without checkpointing and under each checkpoint policy, and prints peak activation memory,
//! stored checkpoint bytes, step time and loss.
//!
//! `cargo run --release --example checkpointed_training [-- --blocks 64 --width 128 --batch 32 --steps 60]`
//!
//! Each block is `x + W2 gelu(W1 LayerNorm(x))` (pre-norm, hidden width 2x,
//! `examples/common/pre_norm_mlp.rs`); the target is a fixed random teacher `tanh(x A)`; Adam. The
//! model's forward is a `#[checkpoint]` loop over the blocks: with a checkpointer of a given policy
//! it stores that policy's block inputs, and `loss.backward()` replays the blocks from them. Every
//! row trains the same model from the same seeds on the same batches, in a pool of its own, so its
//! peak is its own; the rows take turns, five steps at a time, so their times are comparable on a
//! machine whose speed drifts.

use tensorscope::nn::Adam;
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Policy, Precision};

#[path = "common/cli.rs"]
mod cli;
#[path = "common/measured_training.rs"]
mod measured_training;
#[path = "common/pre_norm_mlp.rs"]
mod pre_norm_mlp;

use cli::Args;
use measured_training::{Measured, CHUNK};
use pre_norm_mlp::Model;

/// The sizes the example runs with unless the command line says otherwise.
fn args() -> Args {
    Args {
        blocks: 64,
        width: 128,
        batch: 32,
        steps: 60,
    }
    .or_command_line()
}

/// One model trained one way, in a pool of its own: its checkpointer (none for the plain row), its
/// optimizer, and what its steps measured.
struct Trainer {
    name: &'static str,
    pool: Pool,
    model: Model,
    adam: Adam,
    ckpt: Option<Checkpointer>,
    teacher: Param,
    measured: Measured,
}

impl Trainer {
    fn new(a: &Args, name: &'static str, config: Option<CheckpointConfig>) -> Self {
        let pool = Pool::with_max_memory_mb(4096);
        Trainer {
            name,
            model: Model::new(&pool, a.blocks, a.width),
            adam: Adam::new(1e-3),
            ckpt: config.map(Checkpointer::new),
            teacher: pool.scope(|s| (s.randn::<f32>(&[a.width, a.width], 7) * 0.2).detach()),
            pool,
            measured: Measured::default(),
        }
    }

    /// Adam steps on batches `steps`, measured (see [`Measured::run`]).
    fn run(&mut self, a: &Args, steps: std::ops::Range<usize>) {
        let Trainer {
            name,
            pool,
            model,
            adam,
            ckpt,
            teacher,
            measured,
        } = self;
        measured.run(name, pool, model, adam, steps, |model, s, step, grads| {
            // The batch and its target are made outside the training scope: the teacher is not
            // trained, so it must not be a leaf of the graph.
            let x = s.randn::<f32>(&[a.batch, a.width], 1000 + step as u64);
            let target = x.matmul(teacher).tanh();
            s.train(|t| {
                let x = t.rebind(&x);
                let y = match ckpt.as_mut() {
                    Some(ckpt) => model.forward(ckpt, x),
                    None => model.forward_plain(x),
                };
                let loss = y.mse(&target);
                loss.backward_into(grads)
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                loss.item()
            })
        });
    }

    fn stored(&self) -> usize {
        self.ckpt
            .as_ref()
            .map_or(0, Checkpointer::memory_stored_bytes)
    }
}

fn main() {
    let a = args();
    let activation = a.batch * a.width * 4;
    println!(
        "{} pre-norm residual blocks, width {} (hidden {}), batch {}, {} Adam steps per policy",
        a.blocks,
        a.width,
        2 * a.width,
        a.batch,
        a.steps
    );
    let policy = |p: Policy| Some(CheckpointConfig::new(p));
    let mut rows: Vec<Trainer> = [
        ("none", None),
        ("every 4", policy(Policy::Every(4))),
        ("sqrt", policy(Policy::Sqrt)),
        (
            "sqrt f16",
            Some(CheckpointConfig::new(Policy::Sqrt).with_precision(Precision::F16)),
        ),
        ("budget 8", policy(Policy::Budget(8 * activation))),
    ]
    .into_iter()
    .map(|(name, config)| Trainer::new(&a, name, config))
    .collect();
    // The rows take turns, a few steps each, so that a change in the machine's speed during the
    // run affects them alike.
    for start in (0..a.steps).step_by(CHUNK) {
        let steps = start..(start + CHUNK).min(a.steps);
        for row in &mut rows {
            row.run(&a, steps.clone());
        }
        print!("\r{} of {} steps of every row", steps.end, a.steps);
        std::io::Write::flush(&mut std::io::stdout()).ok();
    }
    println!();

    let base = &rows[0].measured;
    println!(
        "\n{:<10} {:>14} {:>9} {:>14} {:>12} {:>8} {:>11} {:>11}",
        "policy",
        "peak act. B",
        "vs none",
        "stored B",
        "median step",
        "vs none",
        "first loss",
        "final loss"
    );
    for r in &rows {
        let m = &r.measured;
        println!(
            "{:<10} {:>14} {:>8.2}x {:>14} {:>9.1} ms {:>7.2}x {:>11.5} {:>11.5}",
            r.name,
            m.peak,
            m.peak as f64 / base.peak as f64,
            r.stored(),
            m.median_ms(),
            m.median_ms() / base.median_ms(),
            m.losses[0],
            m.losses[m.losses.len() - 1]
        );
    }
    println!(
        "\nOne activation is {activation} B. Peak activation bytes are the pool's peak during a step \
         beyond the parameters, gradients and optimizer state."
    );
    for r in &rows {
        let losses = &r.measured.losses;
        assert!(
            losses[losses.len() - 1] < losses[0],
            "{}: the loss must decrease",
            r.name
        );
    }
}
