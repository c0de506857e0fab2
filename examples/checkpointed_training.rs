//! Trains a deep residual MLP on synthetic regression data under each checkpoint policy, and once
//! through autograd, and prints peak activation memory, stored checkpoint bytes, step time and
//! loss.
//!
//! `cargo run --release --example checkpointed_training [-- --blocks 64 --width 128 --batch 32 --steps 60]`
//!
//! Each block is `x + W2 gelu(W1 LayerNorm(x))` (pre-norm, hidden width 2x); the target is a fixed
//! random teacher `tanh(x A)`; Adam. Every row trains the same model from the same seeds on the same
//! batches, in a pool of its own, so its peak is its own. The policy rows use `nn` layers and their
//! hand-written backward passes; the `autograd` row runs the same blocks as an annotated forward
//! (`examples/common/pre_norm_mlp.rs`) and differentiates it with `backward()`, no checkpointing:
//! its gradients are bit-identical to the `none` row's (`tests/training.rs`).

use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use tensorscope::nn::{mse, train_step, Adam, Optimizer, ParamStore};
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Gradients, Policy, Precision};

#[path = "common/pre_norm_mlp.rs"]
mod pre_norm_mlp;

struct Args {
    blocks: usize,
    width: usize,
    batch: usize,
    steps: usize,
}

fn args() -> Args {
    let mut args = Args {
        blocks: 64,
        width: 128,
        batch: 32,
        steps: 60,
    };
    let raw: Vec<String> = std::env::args().skip(1).collect();
    for pair in raw.chunks(2) {
        let value = || -> usize {
            pair.get(1).and_then(|v| v.parse().ok()).unwrap_or_else(|| {
                eprintln!("{} needs a whole number", pair[0]);
                std::process::exit(2)
            })
        };
        match pair[0].as_str() {
            "--blocks" => args.blocks = value(),
            "--width" => args.width = value(),
            "--batch" => args.batch = value(),
            "--steps" => args.steps = value(),
            other => {
                eprintln!("unknown argument {other}; accepted: --blocks --width --batch --steps");
                std::process::exit(2)
            }
        }
    }
    args
}

struct Row {
    name: &'static str,
    peak: usize,
    stored: usize,
    median_ms: f64,
    first_loss: f32,
    last_loss: f32,
}

/// How a row trains the model.
enum Path {
    /// `nn` layers with hand-written backward passes, under a checkpoint policy or none.
    Layers(Option<CheckpointConfig>),
    /// The annotated forward of `pre_norm_mlp::Block`, differentiated by `backward()`.
    Autograd,
}

/// A model trained one way: one step on a batch, with gradients kept across steps in `grads`;
/// returns the loss and the checkpoint bytes.
trait Trainer {
    fn step<'s>(
        &mut self,
        s: &Scope<'s, '_>,
        grads: &mut Gradients<'_>,
        x: &Tensor<'s>,
        target: &Tensor<'s>,
    ) -> (f32, usize);
}

struct Layers {
    seq: tensorscope::nn::Sequential,
    params: ParamStore,
    adam: Adam,
    ckpt: Option<Checkpointer>,
}

impl Trainer for Layers {
    fn step<'s>(
        &mut self,
        _: &Scope<'s, '_>,
        grads: &mut Gradients<'_>,
        x: &Tensor<'s>,
        target: &Tensor<'s>,
    ) -> (f32, usize) {
        let (params, adam, ckpt) = (&mut self.params, &mut self.adam, self.ckpt.as_mut());
        let report = train_step(&self.seq, params, adam, grads, x, |y| mse(y, target), ckpt)
            .unwrap_or_else(|e| panic!("{e}"));
        (report.loss, report.stored_bytes)
    }
}

struct Autograd {
    blocks: Vec<pre_norm_mlp::Block>,
    adam: Adam,
}

impl Trainer for Autograd {
    fn step<'s>(
        &mut self,
        s: &Scope<'s, '_>,
        grads: &mut Gradients<'_>,
        x: &Tensor<'s>,
        target: &Tensor<'s>,
    ) -> (f32, usize) {
        // The batch and its target are made outside the training scope: the teacher is not
        // trained, so it must not be a leaf of the graph.
        s.train(|s| {
            let x = s.rebind(x);
            let y = self.blocks.iter().fold(x, |x, b| b.forward(&x));
            let loss = y.try_mse(target).unwrap_or_else(|e| panic!("{e}"));
            loss.backward_into(grads).unwrap_or_else(|e| panic!("{e}"));
            self.adam
                .step(&mut self.blocks, grads)
                .unwrap_or_else(|e| panic!("{e}"));
            grads.zero().unwrap_or_else(|e| panic!("{e}"));
            (loss.item(), 0)
        })
    }
}

fn run(a: &Args, name: &'static str, path: Path) -> Row {
    let pool = Pool::with_max_memory_mb(4096);
    let mut params = ParamStore::new(&pool);
    let seq = pre_norm_mlp::layers(&mut params, a.blocks, a.width);
    let mut trainer: Box<dyn Trainer> = match path {
        Path::Layers(config) => Box::new(Layers {
            seq,
            params,
            adam: Adam::new(1e-3),
            ckpt: config.map(Checkpointer::new),
        }),
        Path::Autograd => {
            let blocks = pre_norm_mlp::Block::all(&params, a.blocks);
            // The blocks own the parameters alone, so Adam updates them in place.
            drop((seq, params));
            Box::new(Autograd {
                blocks,
                adam: Adam::new(1e-3),
            })
        }
    };
    let teacher = pool.scope(|s| (s.randn::<f32>(&[a.width, a.width], 7) * 0.2).detach());
    let bar = ProgressBar::new(a.steps as u64).with_message(name);
    bar.set_style(
        ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} loss {prefix}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let (mut times, mut losses, mut stored, mut peak) = (Vec::new(), Vec::new(), 0, 0);
    // The gradients live in a scope around the loop and are zeroed after each update, so after the
    // first step they hold their memory as the parameters and Adam's moments do.
    pool.scope(|outer| {
        let mut grads = Gradients::new(outer);
        for step in 0..a.steps {
            if step == 1 {
                // From here on, parameters, gradients and Adam's moments are all allocated: what is
                // rented beyond them during a step is activations.
                pool.reset_peak();
            }
            let baseline = pool.stats().bytes_in_use;
            let started = Instant::now();
            let (loss, stored_bytes) = outer.scope(|s| {
                let x = s.randn::<f32>(&[a.batch, a.width], 1000 + step as u64);
                let target = x.matmul(&teacher).tanh();
                trainer.step(s, &mut grads, &x, &target)
            });
            times.push(started.elapsed().as_secs_f64() * 1e3);
            if step >= 1 {
                peak = peak.max(pool.stats().peak_bytes_in_use - baseline);
            }
            stored = stored_bytes;
            losses.push(loss);
            bar.set_prefix(format!("{loss:.5}"));
            bar.inc(1);
        }
    });
    bar.finish();
    times.sort_by(f64::total_cmp);
    Row {
        name,
        peak,
        stored,
        median_ms: times[times.len() / 2],
        first_loss: losses[0],
        last_loss: losses[losses.len() - 1],
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
    let policy = |p: Policy| Path::Layers(Some(CheckpointConfig::new(p)));
    let rows: Vec<Row> = [
        ("none", Path::Layers(None)),
        ("autograd", Path::Autograd),
        ("every 4", policy(Policy::Every(4))),
        ("sqrt", policy(Policy::Sqrt)),
        (
            "sqrt f16",
            Path::Layers(Some(
                CheckpointConfig::new(Policy::Sqrt).with_precision(Precision::F16),
            )),
        ),
        ("budget 8", policy(Policy::Budget(8 * activation))),
    ]
    .into_iter()
    .map(|(name, path)| run(&a, name, path))
    .collect();

    let base = &rows[0];
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
        println!(
            "{:<10} {:>14} {:>8.2}x {:>14} {:>9.1} ms {:>7.2}x {:>11.5} {:>11.5}",
            r.name,
            r.peak,
            r.peak as f64 / base.peak as f64,
            r.stored,
            r.median_ms,
            r.median_ms / base.median_ms,
            r.first_loss,
            r.last_loss
        );
    }
    println!(
        "\nOne activation is {activation} B. Peak activation bytes are the pool's peak during a step \
         beyond the parameters, gradients and optimizer state."
    );
    for r in &rows {
        assert!(
            r.last_loss < r.first_loss,
            "{}: the loss must decrease",
            r.name
        );
    }
}
