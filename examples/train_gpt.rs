//! Trains the GPT of `examples/common/gpt.rs` from scratch on a real text, character by character:
//! the books Genesis to Judges of the King James Bible (`examples/data/kjv.txt`, public domain,
//! from Debian's `bible-kjv-text`; see `examples/data/README.md`). The block loop is checkpointed
//! under a memory budget for the whole training step (`Policy::Memory`), AdamW without decay on
//! biases, norms and embeddings, a warm-up and cosine schedule, clipping by norm. It prints the
//! training loss as it falls, the held-out loss (the text's last tenth) and a sample of the model's
//! writing at intervals; `--save DIR` writes the model and optimizer state by name at the end, and
//! `--resume DIR` starts from them.
//!
//! ```text
//! cargo run --release --example train_gpt -- [--steps 2000] [--memory-mb 32] [--layers 4]
//!     [--dim 128] [--ctx 128] [--batch 16] [--save DIR] [--resume DIR]
//! ```
//!
//! `--memory-mb 0` trains without checkpointing. Below the smallest budget that fits, the forward
//! panics with a message naming that budget (`#[checkpoint]` reports a checkpointer error so).

use std::path::{Path, PathBuf};
use std::time::Instant;

use tensorscope::nn::{
    generate, Adam, GenerateOptions, Group, NnError, Optimizer, Sampling, SaveOptions, Schedule,
    WarmupCosine,
};
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Gradients, Policy};

#[path = "common/gpt.rs"]
mod gpt;

use gpt::{Config, Gpt};

const TEXT: &str = "examples/data/kjv.txt";
/// Bytes of ASCII: the vocabulary.
const VOCAB: usize = 128;
const PROMPT: &str = "And God said";

struct Args {
    steps: u64,
    memory_mb: usize,
    layers: usize,
    dim: usize,
    ctx: usize,
    batch: usize,
    save: Option<PathBuf>,
    resume: Option<PathBuf>,
}

fn fail(message: &str) -> ! {
    eprintln!("train_gpt: {message}");
    std::process::exit(2)
}

fn args() -> Args {
    let mut a = Args {
        steps: 2000,
        memory_mb: 32,
        layers: 4,
        dim: 128,
        ctx: 128,
        batch: 16,
        save: None,
        resume: None,
    };
    let raw: Vec<String> = std::env::args().skip(1).collect();
    for pair in raw.chunks(2) {
        let value = pair
            .get(1)
            .cloned()
            .unwrap_or_else(|| fail(&format!("{} needs a value", pair[0])));
        let number = || -> usize {
            value
                .parse()
                .unwrap_or_else(|_| fail(&format!("{} needs a whole number", pair[0])))
        };
        match pair[0].as_str() {
            "--steps" => a.steps = number() as u64,
            "--memory-mb" => a.memory_mb = number(),
            "--layers" => a.layers = number(),
            "--dim" => a.dim = number(),
            "--ctx" => a.ctx = number(),
            "--batch" => a.batch = number(),
            "--save" => a.save = Some(value.into()),
            "--resume" => a.resume = Some(value.into()),
            other => fail(&format!(
                "unknown argument {other}; accepted: --steps --memory-mb --layers --dim --ctx \
                 --batch --save --resume"
            )),
        }
    }
    a
}

/// The start of a window of `len` tokens of `text`, drawn by a SplitMix64 step of `state`.
fn window(text: &[i64], len: usize, state: &mut u64) -> usize {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    ((z ^ (z >> 31)) % (text.len() - len) as u64) as usize
}

/// `batch` windows of `ctx` tokens of `text`, from `seed`, into `out`.
fn batch(text: &[i64], batch: usize, ctx: usize, seed: u64, out: &mut Vec<i64>) {
    out.clear();
    let mut state = seed;
    for _ in 0..batch {
        let start = window(text, ctx, &mut state);
        out.extend_from_slice(&text[start..start + ctx]);
    }
}

/// The mean loss of the model on fixed windows of `text` (no gradient).
fn held_out_loss(pool: &Pool, model: &Gpt, text: &[i64], a: &Args) -> f32 {
    let mut ids = Vec::new();
    batch(text, a.batch, a.ctx, 1 << 40, &mut ids);
    pool.scope(|s| {
        let ids = s.from_slice::<i64>(&[a.batch, a.ctx], &ids);
        Gpt::loss(&model.forward(&ids), &ids).item()
    })
}

/// A sample of the model's writing after [`PROMPT`] (temperature 0.8, top 20 characters).
fn sample(pool: &Pool, model: &Gpt, ctx: usize, seed: u64) -> String {
    let prompt: Vec<i64> = PROMPT.bytes().map(i64::from).collect();
    let options = GenerateOptions {
        sampling: Sampling {
            temperature: 0.8,
            top_k: Some(20),
            top_p: None,
            seed,
        },
        ..GenerateOptions::greedy(ctx - prompt.len())
    };
    let generated = pool
        .scope(|s| generate(model, s, &[&prompt], &options))
        .unwrap_or_else(|e| fail(&e.to_string()));
    let bytes: Vec<u8> = prompt
        .iter()
        .chain(&generated.tokens[0])
        .map(|&t| t as u8)
        .collect();
    String::from_utf8_lossy(&bytes).replace('\n', " / ")
}

fn save(model: &Gpt, adam: &Adam, dir: &Path, step: u64) -> Result<(), NnError> {
    if let Err(e) = std::fs::create_dir_all(dir) {
        fail(&format!("{}: {e}", dir.display()));
    }
    let options = SaveOptions::new().metadata("step", step.to_string());
    model.save_safetensors(dir.join("model.safetensors"), &options)?;
    adam.save_state(model, &dir.join("optimizer.safetensors"))
}

fn main() {
    let a = args();
    let text = std::fs::read(TEXT).unwrap_or_else(|e| fail(&format!("{TEXT}: {e}")));
    if let Some(i) = text.iter().position(|&b| usize::from(b) >= VOCAB) {
        fail(&format!("{TEXT}: byte {i} is not ASCII"));
    }
    let tokens: Vec<i64> = text.iter().map(|&b| i64::from(b)).collect();
    let (train, held_out) = tokens.split_at(tokens.len() * 9 / 10);

    let config = Config {
        vocab: VOCAB,
        n_ctx: a.ctx,
        dim: a.dim,
        heads: (a.dim / 32).max(1),
        layers: a.layers,
        ..Config::TINY
    };
    let pool = Pool::with_max_memory_mb(4096);
    let mut model = Gpt::random(&pool, config, 0).unwrap_or_else(|e| fail(&e.to_string()));
    let decay_off = |name: &str| {
        let no_decay = name.ends_with("bias") || name.contains("ln_") || name.starts_with("wpe");
        if no_decay || name.starts_with("wte") {
            Group::NO_DECAY
        } else {
            Group::DEFAULT
        }
    };
    let mut adam = Adam::adamw(0.0, 0.1).groups(decay_off);
    let schedule = WarmupCosine {
        lr: 3e-3,
        warmup: a.steps / 20,
        total: a.steps,
        min_lr: 3e-4,
    };
    let mut first = 0;
    if let Some(dir) = &a.resume {
        let loaded = model
            .load_safetensors(dir.join("model.safetensors"), &Default::default())
            .and_then(|_| adam.load_state(&model, &dir.join("optimizer.safetensors")));
        loaded.unwrap_or_else(|e| fail(&e.to_string()));
        let file = tensorscope::nn::SafeTensorsFile::open(dir.join("model.safetensors"))
            .unwrap_or_else(|e| fail(&e.to_string()));
        first = file
            .metadata()
            .get("step")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
    }
    let mut ckpt = (a.memory_mb > 0)
        .then(|| Checkpointer::new(CheckpointConfig::new(Policy::Memory(a.memory_mb << 20))));
    println!(
        "GPT: {} parameters ({} blocks, width {}, context {}), batch {}, {} characters of {TEXT} \
         ({} held out); {}",
        model.param_count(),
        a.layers,
        a.dim,
        a.ctx,
        a.batch,
        train.len(),
        held_out.len(),
        match a.memory_mb {
            0 => "no checkpointing".to_string(),
            mb => format!("checkpointed within {mb} MiB per step"),
        }
    );
    let every = (a.steps / 6).max(1);
    let started = Instant::now();
    let mut ids = Vec::new();
    let mut recent = Vec::new();
    pool.scope(|outer| {
        let mut grads = Gradients::new(outer);
        for step in first..a.steps {
            adam.set_lr(schedule.lr(step) as f32);
            batch(train, a.batch, a.ctx, step, &mut ids);
            pool.reset_peak();
            let base = pool.stats().bytes_in_use;
            let loss = outer.train(|s| {
                let ids = s.from_slice::<i64>(&[a.batch, a.ctx], &ids);
                let logits = match ckpt.as_mut() {
                    Some(ckpt) => model.forward_checkpointed(ckpt, &ids),
                    None => model.forward(&ids),
                };
                let loss = Gpt::loss(&logits, &ids);
                loss.backward_into(&mut grads)
                    .unwrap_or_else(|e| fail(&e.to_string()));
                loss.item()
            });
            grads
                .clip_norm(1.0)
                .unwrap_or_else(|e| fail(&e.to_string()));
            adam.step(&mut model, &grads)
                .unwrap_or_else(|e| fail(&e.to_string()));
            grads.zero().unwrap_or_else(|e| fail(&e.to_string()));
            let peak = pool.stats().peak_bytes_in_use - base;
            // The plan of the first step that follows one (the first ones measure).
            if let Some(report) = ckpt.as_ref().and_then(Checkpointer::plan_report) {
                if step == first + 2 {
                    print!("{report}");
                }
            }
            recent.push(loss);
            if (step + 1) % every == 0 || step + 1 == a.steps {
                let mean = recent.iter().sum::<f32>() / recent.len() as f32;
                recent.clear();
                let held = held_out_loss(&pool, &model, held_out, &a);
                println!(
                    "step {:5}  {:6.1} s  train loss {mean:.3}  held-out loss {held:.3}  \
                     step peak {:.1} MiB above the weights and moments",
                    step + 1,
                    started.elapsed().as_secs_f64(),
                    peak as f64 / (1 << 20) as f64
                );
                println!("    {}", sample(&pool, &model, a.ctx, step));
            }
        }
    });
    if let Some(dir) = &a.save {
        save(&model, &adam, dir, a.steps).unwrap_or_else(|e| fail(&e.to_string()));
        println!("saved to {}", dir.display());
    }
}
