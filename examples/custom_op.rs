//! An op of your own with its own backward: SwiGLU, `silu(a) * b`, written as one fused kernel
//! outside the library (`examples/common/swiglu.rs`, `impl Op for SwiGlu`). The example checks its
//! gradients against finite differences, then trains a residual model of SwiGLU blocks three ways:
//! with the library's ops composed (`a.silu() * b`), with the fused op, and with the fused op under
//! `#[checkpoint]`, whose backward replays the op's forward. It prints each row's losses, step time
//! and peak memory; the checkpointed row's losses equal the fused row's bit for bit.
//!
//! `cargo run --release --example custom_op [-- --blocks 16 --width 256 --batch 64 --steps 20]`

use ndarray::ArrayD;
use tensorscope::autograd::check_gradients;
use tensorscope::nn::Adam;
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Policy};

#[path = "common/cli.rs"]
mod cli;
#[path = "common/measured_training.rs"]
mod measured_training;
#[path = "common/pre_norm_mlp.rs"]
mod pre_norm_mlp;
#[path = "common/swiglu.rs"]
mod swiglu;

use cli::Args;
use measured_training::{Measured, CHUNK};
use swiglu::{Model, SwiGlu};

/// The sizes the example runs with unless the command line says otherwise.
fn args() -> Args {
    Args {
        blocks: 16,
        width: 256,
        batch: 64,
        steps: 20,
    }
    .or_command_line()
}

/// How a row runs the model's forward.
#[derive(Clone, Copy, PartialEq)]
enum Way {
    Composed,
    Fused,
    Checkpointed,
}

/// One way of training the model, in a pool of its own.
struct Row {
    name: &'static str,
    way: Way,
    pool: Pool,
    model: Model,
    adam: Adam,
    ckpt: Checkpointer,
    measured: Measured,
}

impl Row {
    fn new(a: &Args, name: &'static str, way: Way) -> Row {
        let pool = Pool::with_max_memory_mb(4096);
        Row {
            name,
            way,
            model: Model::new(&pool, a.blocks, a.width),
            pool,
            adam: Adam::new(1e-3),
            ckpt: Checkpointer::new(CheckpointConfig::new(Policy::Sqrt)),
            measured: Measured::default(),
        }
    }

    /// Adam steps on batches `steps` (see [`Measured::run`]); the target is a fixed function of
    /// the input, `tanh` of a shifted copy.
    fn run(&mut self, a: &Args, steps: std::ops::Range<usize>) {
        let Row {
            name,
            way,
            pool,
            model,
            adam,
            ckpt,
            measured,
        } = self;
        measured.run(name, pool, model, adam, steps, |model, s, step, grads| {
            let x = s.randn::<f32>(&[a.batch, a.width], 1000 + step as u64);
            let target = (&x * 0.5).tanh();
            s.train(|t| {
                let x = t.rebind(&x);
                let y = match way {
                    Way::Composed => model.forward_composed(x),
                    Way::Fused => model.forward_plain(x),
                    Way::Checkpointed => model.forward(ckpt, x),
                };
                let loss = y.mse(&target);
                loss.backward_into(grads)
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                loss.item()
            })
        });
    }
}

fn main() {
    let a = args();
    // The gradient check, in f64: the op's backward against central differences of its forward.
    let pool = Pool::with_max_memory_mb(64);
    let gate = ArrayD::from_shape_fn(vec![4, 6], |i| (i[0] as f64 - 1.5) + 0.25 * i[1] as f64);
    let up = ArrayD::from_shape_fn(vec![4, 6], |i| 1.0 - 0.1 * (i[0] * 6 + i[1]) as f64);
    let check = check_gradients(&pool, &[gate, up], 1e-6, |xs| {
        let y = Tensor::try_apply(SwiGlu, &[&xs[0], &xs[1]])?;
        (&y * &y).try_sum_all()
    })
    .expect("the op runs");
    println!(
        "gradient check of swiglu (4x6, f64): largest error {:.1e} (da {:.1e}, db {:.1e})",
        check.max_error(),
        check.errors[0],
        check.errors[1]
    );
    assert!(check.max_error() < 1e-7, "{check:?}");

    println!(
        "\n{} SwiGLU blocks, width {} (hidden {}), batch {}, {} Adam steps per row",
        a.blocks,
        a.width,
        2 * a.width,
        a.batch,
        a.steps
    );
    let mut rows: Vec<Row> = [
        ("composed silu * b", Way::Composed),
        ("fused swiglu", Way::Fused),
        ("fused, #[checkpoint] sqrt", Way::Checkpointed),
    ]
    .into_iter()
    .map(|(name, way)| Row::new(&a, name, way))
    .collect();
    // The rows take turns, a few steps each, so that a change in the machine's speed affects them
    // alike.
    for start in (0..a.steps).step_by(CHUNK) {
        let steps = start..(start + CHUNK).min(a.steps);
        for row in &mut rows {
            row.run(&a, steps.clone());
        }
    }

    let fused = &rows[1].measured;
    println!(
        "\n{:<26} {:>11} {:>11} {:>12} {:>8} {:>14} {:>8}  losses vs fused",
        "row", "first loss", "final loss", "median step", "vs fused", "peak act. B", "vs fused"
    );
    for r in &rows {
        let m = &r.measured;
        let same = m.losses.iter().zip(&fused.losses);
        let versus = if same.clone().all(|(x, y)| x.to_bits() == y.to_bits()) {
            "bit for bit".to_string()
        } else {
            let worst = same.fold(0f32, |w, (x, y)| w.max((x - y).abs() / y.abs()));
            format!("differ by up to {worst:.1e} of themselves")
        };
        println!(
            "{:<26} {:>11.5} {:>11.5} {:>9.1} ms {:>7.2}x {:>14} {:>7.2}x  {versus}",
            r.name,
            m.losses[0],
            m.losses[m.losses.len() - 1],
            m.median_ms(),
            m.median_ms() / fused.median_ms(),
            m.peak,
            m.peak as f64 / fused.peak as f64,
        );
    }
    match rows[2].ckpt.last_backward() {
        Some(replay) => println!(
            "\nThe checkpointed backward replayed {} of {} block steps, the fused op's forward in \
             each.",
            replay.replayed_steps, a.blocks
        ),
        None => println!(
            "\nAt {} blocks the policy stores no boundary: the checkpointed backward replays \
             nothing.",
            a.blocks
        ),
    }
    for r in &rows {
        let losses = &r.measured.losses;
        assert!(
            losses[losses.len() - 1] < losses[0],
            "{}: the loss must decrease",
            r.name
        );
    }
    assert!(
        rows[2]
            .measured
            .losses
            .iter()
            .zip(&fused.losses)
            .all(|(x, y)| x.to_bits() == y.to_bits()),
        "a checkpointed replay of the op gives the same bits"
    );
}
