//! Trains a deep residual MLP on synthetic regression data under each checkpoint policy and prints
//! peak activation memory, stored checkpoint bytes, step time and loss.
//!
//! `cargo run --release --example checkpointed_training [-- --blocks 64 --width 128 --batch 32 --steps 60]`
//!
//! Each block is `x + W2 gelu(W1 LayerNorm(x))` (pre-norm, hidden width 2x); the target is a fixed
//! random teacher `tanh(x A)`; Adam. Every policy trains the same model from the same seeds on the same
//! batches, in a pool of its own, so its peak is its own.

use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use tensorscope::nn::{
    mse, train_step, Activation, Adam, LayerNorm, Linear, ParamStore, Residual, Sequential,
};
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Policy, Precision};

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

fn model(a: &Args, params: &mut ParamStore) -> Sequential {
    let (w, h) = (a.width, 2 * a.width);
    let out_std = 0.5 / ((h * a.blocks) as f64).sqrt();
    (0..a.blocks).fold(Sequential::new(), |seq, i| {
        let seed = 10 * i as u64;
        let inner = Sequential::new()
            .push(LayerNorm::new(params, &format!("b{i}.ln"), w, 1e-5).unwrap())
            .push(Linear::new(params, &format!("b{i}.fc1"), w, h, seed).unwrap())
            .push(Activation::gelu())
            .push(Linear::with_std(params, &format!("b{i}.fc2"), h, w, out_std, seed + 1).unwrap());
        seq.push(Residual::new(inner))
    })
}

struct Row {
    name: &'static str,
    peak: usize,
    stored: usize,
    median_ms: f64,
    first_loss: f32,
    last_loss: f32,
}

fn run(a: &Args, name: &'static str, config: Option<CheckpointConfig>) -> Row {
    let pool = Pool::with_max_memory_mb(4096);
    let mut params = ParamStore::new(&pool);
    let seq = model(a, &mut params);
    let teacher = pool.scope(|s| (s.randn::<f32>(&[a.width, a.width], 7) * 0.2).detach());
    let mut adam = Adam::new(1e-3);
    let mut ckpt = config.map(Checkpointer::new);
    let bar = ProgressBar::new(a.steps as u64).with_message(name);
    bar.set_style(
        ProgressStyle::with_template("{msg:>10} [{bar:40}] {pos}/{len} loss {prefix}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let (mut times, mut losses, mut stored, mut peak) = (Vec::new(), Vec::new(), 0, 0);
    for step in 0..a.steps {
        if step == 1 {
            // From here on, parameters, gradients and Adam's moments are all allocated: what is
            // rented beyond them during a step is activations.
            pool.reset_peak();
        }
        let baseline = pool.stats().bytes_in_use;
        let started = Instant::now();
        let report = pool.scope(|s| {
            let x = s.randn::<f32>(&[a.batch, a.width], 1000 + step as u64);
            let target = x.matmul(&teacher).tanh();
            train_step(
                &seq,
                &mut params,
                &mut adam,
                &x,
                |y| mse(y, &target),
                ckpt.as_mut(),
            )
            .unwrap_or_else(|e| panic!("{name}: {e}"))
        });
        times.push(started.elapsed().as_secs_f64() * 1e3);
        if step >= 1 {
            peak = peak.max(pool.stats().peak_bytes_in_use - baseline);
        }
        stored = report.stored_bytes;
        losses.push(report.loss);
        bar.set_prefix(format!("{:.5}", report.loss));
        bar.inc(1);
    }
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
    let rows: Vec<Row> = [
        ("none", None),
        ("every 4", Some(CheckpointConfig::new(Policy::Every(4)))),
        ("sqrt", Some(CheckpointConfig::new(Policy::Sqrt))),
        (
            "sqrt f16",
            Some(CheckpointConfig::new(Policy::Sqrt).with_precision(Precision::F16)),
        ),
        (
            "budget 8",
            Some(CheckpointConfig::new(Policy::Budget(8 * activation))),
        ),
    ]
    .into_iter()
    .map(|(name, config)| run(&a, name, config))
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
