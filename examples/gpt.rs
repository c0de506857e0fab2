//! A GPT-2-style decoder (`examples/common/gpt.rs`) loaded from safetensors weights: its logits
//! against PyTorch's, greedy generation through a key/value cache, then training steps with
//! `#[checkpoint]` on the block loop, without checkpointing and under `Every(2)`, `Sqrt` and a byte
//! `Budget`, printing loss, peak activation memory and step time.
//!
//! `cargo run --release --example gpt [-- --weights FILE --layers 8 --ctx 64 --steps 20]`
//!
//! The weights default to `tests/fixtures/gpt_tiny.safetensors`, written by
//! `scripts/gpt_fixture.py` with PyTorch (which also stored its logits and greedy tokens there).
//! The training table uses a deeper model of random GPT-2-initialised weights (`--layers` blocks,
//! `--ctx` positions) on a synthetic next-token task, so that the policies differ.

use std::path::PathBuf;
use std::time::Instant;

use tensorscope::nn::{generate, Adam, GenerateOptions, SafeTensorsFile};
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Policy};

#[path = "common/gpt.rs"]
mod gpt;

#[path = "common/measured_training.rs"]
mod measured_training;

use gpt::{Config, Gpt};
use measured_training::{Measured, CHUNK};

struct Args {
    weights: PathBuf,
    layers: usize,
    ctx: usize,
    steps: usize,
}

fn args() -> Args {
    let mut a = Args {
        weights: PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/gpt_tiny.safetensors"),
        layers: 8,
        ctx: 64,
        steps: 20,
    };
    let raw: Vec<String> = std::env::args().skip(1).collect();
    for pair in raw.chunks(2) {
        let Some(value) = pair.get(1) else {
            eprintln!("{} needs a value", pair[0]);
            std::process::exit(2)
        };
        let number = || -> usize {
            value.parse().unwrap_or_else(|_| {
                eprintln!("{} needs a whole number, got {value}", pair[0]);
                std::process::exit(2)
            })
        };
        match pair[0].as_str() {
            "--weights" => a.weights = PathBuf::from(value),
            "--layers" => a.layers = number(),
            "--ctx" => a.ctx = number(),
            "--steps" => a.steps = number().max(CHUNK),
            other => {
                eprintln!("unknown argument {other}; accepted: --weights --layers --ctx --steps");
                std::process::exit(2)
            }
        }
    }
    a
}

fn main() {
    let a = args();
    let pool = Pool::with_max_memory_mb(1024);
    let fail = |e: &dyn std::fmt::Display| -> ! {
        eprintln!("{}: {e}", a.weights.display());
        std::process::exit(1)
    };
    let model = Gpt::load(&pool, &a.weights, Config::TINY).unwrap_or_else(|e| fail(&e));
    let file = SafeTensorsFile::open(&a.weights).unwrap_or_else(|e| fail(&e));
    let c = model.config;
    println!(
        "GPT: vocab {}, context {}, width {}, {} heads, {} blocks, from {}",
        c.vocab,
        c.n_ctx,
        c.dim,
        c.heads,
        c.layers,
        a.weights.display()
    );

    // The logits of the reference batch, against PyTorch's.
    let ids = file
        .param::<i64>(&pool, "input_ids")
        .unwrap_or_else(|e| fail(&e));
    let reference = file.param::<f32>(&pool, "logits").ok();
    pool.scope(|s| {
        let ids = s.bind(&ids);
        let started = Instant::now();
        let logits = model.forward(&ids);
        let ms = started.elapsed().as_secs_f64() * 1e3;
        let loss = Gpt::loss(&logits, &ids).item();
        println!(
            "forward of {:?} ids: {ms:.2} ms, loss {loss:.6}",
            ids.shape()
        );
        if let Some(reference) = &reference {
            let worst = logits
                .to_vec()
                .iter()
                .zip(reference.as_slice())
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            println!("largest |logit - PyTorch's|: {worst:.2e}");
        }
        let first = logits
            .narrow(0, 0, 1)
            .narrow(1, 0, 1)
            .narrow(2, 0, 8)
            .flatten();
        println!("logits[0, 0, ..8]:\n{first}");
    });

    // Greedy generation from the first four ids, through a key/value cache per block.
    let prompt: Vec<i64> = ids.as_slice()[..4].to_vec();
    let started = Instant::now();
    let generated = pool
        .scope(|s| generate(&model, s, &[&prompt], &GenerateOptions::greedy(8)))
        .unwrap_or_else(|e| fail(&e));
    let tokens = &generated.tokens[0];
    println!(
        "greedy from {prompt:?} through the cache: {tokens:?} ({:.2} ms)",
        started.elapsed().as_secs_f64() * 1e3
    );
    if let Ok(expected) = file.param::<i64>(&pool, "generated") {
        let same = expected.as_slice()[4..] == tokens[..];
        println!(
            "PyTorch's greedy tokens: {:?} ({})",
            &expected.as_slice()[4..],
            if same { "same" } else { "DIFFERENT" }
        );
    }

    train_table(&a);
}

/// One training run: a fresh random model, its checkpointer, and what it measured.
struct Row {
    name: &'static str,
    pool: Pool,
    model: Gpt,
    ckpt: Option<Checkpointer>,
    adam: Adam,
    measured: Measured,
}

/// A batch of the synthetic task: sequences counting up by a stride (mod the vocabulary), so the
/// next token is learnable from the last two.
fn batch(config: &Config, rows: usize, step: usize) -> Vec<i64> {
    let v = config.vocab as i64;
    (0..rows)
        .flat_map(|r| {
            let (start, stride) = (
                (step * 7 + r * 13) as i64 % v,
                1 + (r as i64 + step as i64) % 3,
            );
            (0..config.n_ctx as i64).map(move |t| (start + stride * t) % v)
        })
        .collect()
}

fn train_table(a: &Args) {
    let config = Config {
        n_ctx: a.ctx,
        dim: 64,
        layers: a.layers,
        ..Config::TINY
    };
    let rows = 4;
    let policy = |p: Policy| Some(Checkpointer::new(CheckpointConfig::new(p)));
    let mut runs: Vec<Row> = [
        ("none", None),
        ("every 2", policy(Policy::Every(2))),
        ("sqrt", policy(Policy::Sqrt)),
        // Room for three block inputs: the binomial schedule.
        (
            "budget 3",
            policy(Policy::Budget(3 * rows * config.n_ctx * config.dim * 4)),
        ),
    ]
    .into_iter()
    .map(|(name, ckpt)| {
        let pool = Pool::with_max_memory_mb(2048);
        Row {
            name,
            model: Gpt::random(&pool, config, 1).expect("the shapes are the model's own"),
            pool,
            ckpt,
            adam: Adam::new(3e-3),
            measured: Measured::default(),
        }
    })
    .collect();
    println!(
        "\ntraining: {} blocks, width {}, context {}, batch {rows}, {} Adam steps per policy",
        config.layers, config.dim, config.n_ctx, a.steps
    );
    // The rows take turns, a few steps each, so a change in the machine's speed affects them alike.
    for start in (0..a.steps).step_by(CHUNK) {
        for row in &mut runs {
            row.run(&config, rows, start..(start + CHUNK).min(a.steps));
        }
    }
    let base_peak = runs[0].measured.peak as f64;
    let base_ms = runs[0].measured.median_ms();
    println!(
        "\n{:<8} {:>14} {:>8} {:>12} {:>8} {:>11} {:>11}",
        "policy", "peak act. B", "vs none", "median step", "vs none", "first loss", "final loss"
    );
    for r in &runs {
        let m = &r.measured;
        println!(
            "{:<8} {:>14} {:>7.2}x {:>9.2} ms {:>7.2}x {:>11.4} {:>11.4}",
            r.name,
            m.peak,
            m.peak as f64 / base_peak,
            m.median_ms(),
            m.median_ms() / base_ms,
            m.losses[0],
            m.losses[m.losses.len() - 1]
        );
    }
}

impl Row {
    /// Adam steps on batches `steps`, measured (see [`Measured::run`]).
    fn run(&mut self, config: &Config, rows: usize, steps: std::ops::Range<usize>) {
        let Row {
            name,
            pool,
            model,
            ckpt,
            adam,
            measured,
        } = self;
        measured.run(name, pool, model, adam, steps, |model, s, step, grads| {
            let ids = s.from_slice::<i64>(&[rows, config.n_ctx], &batch(config, rows, step));
            s.train(|t| {
                let ids = t.rebind(&ids);
                let logits = match ckpt.as_mut() {
                    Some(ckpt) => model.forward_checkpointed(ckpt, &ids),
                    None => model.forward(&ids),
                };
                let loss = Gpt::loss(&logits, &ids);
                loss.backward_into(grads)
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                loss.item()
            })
        });
    }
}
