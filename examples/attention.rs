//! The fused attention (`scaled_dot_product_attention`) against the same causal attention written
//! with the unfused ops (`matmul`, `masked_fill`, `softmax`; `examples/common/gpt.rs`'s two
//! forms), at GPT-2-like shapes: batch 8, 6 heads, head dimension 64, `t` 256 and 1024, `f32`.
//! For each: the forward's time (nothing recorded), a forward and backward's time (`q`, `k` and
//! `v` requiring gradients, the output's gradient given), and the peak pool bytes of that forward
//! and backward beyond its inputs. Then a training step of a GPT of that shape (6 blocks of width
//! 384, context 256, batch 8, vocabulary 256, Adam) in either form: its time and peak activation
//! bytes, and the time of its forward alone (inference: nothing recorded).
//!
//! The forms take turns in rounds, so that a drift of the machine's speed affects both alike; the
//! table gives the medians over the rounds of each round's median.
//!
//! `cargo run --release --example attention [-- --rounds 5 --vocab 256 --gpt-only --bf16]`:
//! `--vocab 50257` gives the GPT GPT-2's vocabulary, `--gpt-only` skips the op's table, `--bf16`
//! adds a row of the fused form with its products in mixed precision (`autocast(Products::Bf16)`)
//! and prints both fused rows' losses every 20 steps (`--rounds 40`: a 200-step curve).
//! `--adamw-clip` trains as a real run does instead of plain Adam: AdamW (weight decay 0.1) without
//! decay on biases and LayerNorms (parameter groups), and the gradients clipped to norm 1.0 before
//! each update (`scripts/gpt_step_torch.py --adamw-clip` is the same step in PyTorch).
//! `--saving` adds rows of the fused form's step checkpointed (`#[checkpoint]` on the block loop)
//! under `Every(2)`, `Sqrt` and `Budget` (room for 4 block inputs), each without and with
//! `Saving::Products` (the products' and the attention's outputs kept for the replays): their step
//! time and peak at the same policies.

use std::hint::black_box;
use std::time::Instant;

use tensorscope::checkpoint::Saving;
use tensorscope::nn::{Adam, Group};
use tensorscope::ops::{autocast, Products};
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Policy};

#[path = "common/gpt.rs"]
mod gpt;

#[path = "common/measured_training.rs"]
mod measured_training;

use gpt::{Attention, Config, Gpt};
use measured_training::{Measured, CHUNK};

const FORMS: [Attention; 2] = [Attention::Fused, Attention::Unfused];
const BATCH: usize = 8;
const HEADS: usize = 6;
const HEAD_DIM: usize = 64;
/// Calls of the op per form and round.
const REPS: usize = 3;

fn main() {
    let (mut rounds, mut vocab, mut gpt_only, mut bf16, mut recipe) = (5, 256, false, false, false);
    let mut saving = false;
    let mut raw = std::env::args().skip(1);
    while let Some(flag) = raw.next() {
        let mut number = || {
            raw.next()
                .and_then(|n| n.parse().ok())
                .unwrap_or_else(|| usage())
        };
        match flag.as_str() {
            "--rounds" => rounds = number(),
            "--vocab" => vocab = number(),
            "--gpt-only" => gpt_only = true,
            "--bf16" => bf16 = true,
            "--adamw-clip" => recipe = true,
            "--saving" => saving = true,
            _ => usage(),
        }
    }
    let threads = tensorscope::threads();
    if !gpt_only {
        println!(
            "causal attention [{BATCH}, {HEADS}, t, {HEAD_DIM}], f32, {threads} threads, {rounds} \
             rounds of {REPS} calls per form"
        );
        println!(
            "\n| t | form | forward ms | forward + backward ms | peak bytes, forward + backward |"
        );
        println!("|---:|---|---:|---:|---:|");
        for t in [256, 1024] {
            op_table(t, rounds);
        }
    }
    gpt_table(rounds, vocab, bf16, recipe, saving);
}

fn usage() -> ! {
    eprintln!(
        "usage: attention [--rounds N] [--vocab N] [--gpt-only] [--bf16] [--adamw-clip] [--saving]"
    );
    std::process::exit(2)
}

/// The median of `xs` (not empty).
fn median(xs: &[f64]) -> f64 {
    let mut xs = xs.to_vec();
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// One form's figures over the rounds: per round, the medians of its calls.
#[derive(Default)]
struct Rounds {
    forward: Vec<f64>,
    training: Vec<f64>,
    peak: usize,
}

/// Prints the rows of the op at `t`, the forms taking turns for `rounds` rounds.
fn op_table(t: usize, rounds: usize) {
    let pool = Pool::with_max_memory_mb(8192);
    let future = pool.scope(|s| s.ones::<u8>(&[t, t]).triu(1).detach());
    let mut figures: [Rounds; 2] = Default::default();
    for _ in 0..rounds {
        for (form, rounds) in FORMS.into_iter().zip(&mut figures) {
            op_round(&pool, form, t, &future, rounds);
        }
    }
    for (form, rounds) in FORMS.into_iter().zip(&figures) {
        println!(
            "| {t} | {form:?} | {:.1} | {:.1} | {} |",
            median(&rounds.forward),
            median(&rounds.training),
            rounds.peak
        );
    }
}

/// One round of `form` at `t`: `REPS` forwards, then `REPS` forwards and backwards, their medians
/// and the peak pool bytes beyond the inputs and the output's gradient added to `rounds`.
fn op_round(pool: &Pool, form: Attention, t: usize, future: &Param<u8>, rounds: &mut Rounds) {
    pool.scope(|s| {
        let shape = [BATCH, HEADS, t, HEAD_DIM];
        let [q, k, v, gy] = [1, 2, 3, 4].map(|seed| s.randn::<f32>(&shape, seed));
        let timed = |f: &mut dyn FnMut()| {
            let times: Vec<f64> = (0..REPS)
                .map(|_| {
                    let started = Instant::now();
                    f();
                    started.elapsed().as_secs_f64() * 1e3
                })
                .collect();
            median(&times)
        };
        rounds.forward.push(timed(&mut || {
            black_box(form.apply((&q, &k, &v), future).len());
        }));
        let [q, k, v] = [q, k, v].map(Tensor::requires_grad);
        let before = pool.stats().bytes_in_use;
        pool.reset_peak();
        rounds.training.push(timed(&mut || {
            let y = form.apply((&q, &k, &v), future);
            black_box(y.backward_with(&gy).expect("backward").len());
        }));
        rounds.peak = rounds.peak.max(pool.stats().peak_bytes_in_use - before);
    });
}

/// Prints a GPT training step in either form (and, with `bf16`, the fused form with its products
/// in bf16), the rows taking turns, `CHUNK` steps each per round; with `recipe`, AdamW with groups
/// and clipping by norm.
fn gpt_table(rounds: usize, vocab: usize, bf16: bool, recipe: bool, saving: bool) {
    let config = |attention| Config {
        vocab,
        n_ctx: 256,
        dim: HEADS * HEAD_DIM,
        heads: HEADS,
        layers: 6,
        eps: 1e-5,
        attention,
    };
    let mut rows = vec![
        (Attention::Fused, Products::F32, None),
        (Attention::Unfused, Products::F32, None),
    ];
    if bf16 {
        rows.push((Attention::Fused, Products::Bf16, None));
    }
    if saving {
        let c = config(Attention::Fused);
        let activation = BATCH * c.n_ctx * c.dim * 4;
        let policies = [
            ("every 2", Policy::Every(2)),
            ("sqrt", Policy::Sqrt),
            ("budget 4", Policy::Budget(4 * activation)),
        ];
        for (name, policy) in policies {
            for kept in [Saving::Nothing, Saving::Products] {
                let config = CheckpointConfig::new(policy.clone()).with_saving(kept);
                rows.push((Attention::Fused, Products::F32, Some((name, config))));
            }
        }
    }
    let mut runs: Vec<_> = rows
        .into_iter()
        .map(|(form, products, checkpointed)| {
            let pool = Pool::with_max_memory_mb(8192);
            let model = Gpt::random(&pool, config(form), 1).expect("the model's own shapes");
            let name = match &checkpointed {
                Some((policy, config)) => format!("{form:?}, {policy}, saving {:?}", config.saving),
                None => format!("{form:?}, {products:?} products"),
            };
            let ckpt = checkpointed.map(|(_, config)| Checkpointer::new(config));
            let forwards = Vec::new();
            let no_decay = |name: &str| name.ends_with("bias") || name.contains("ln_");
            let adam = if recipe {
                Adam::adamw(3e-4, 0.1).groups(move |name| {
                    if no_decay(name) {
                        Group::NO_DECAY
                    } else {
                        Group::DEFAULT
                    }
                })
            } else {
                Adam::new(3e-4)
            };
            let row = (name, products, pool, model, adam);
            (row, Measured::default(), forwards, ckpt, Vec::new())
        })
        .collect();
    let c = config(Attention::Fused);
    let ids: Vec<i64> = (0..BATCH * c.n_ctx)
        .map(|i| ((i * 7 + i / c.n_ctx) % c.vocab) as i64)
        .collect();
    for round in 0..rounds {
        for ((name, products, pool, model, adam), measured, forwards, ckpt, rounds) in &mut runs {
            let steps = round * CHUNK..(round + 1) * CHUNK;
            let timed = measured.times.len();
            let products = *products;
            let checkpointed = ckpt.is_some();
            measured.run(name, pool, model, adam, steps, |model, s, _, grads| {
                s.train(|t| {
                    let ids = t.from_slice::<i64>(&[BATCH, c.n_ctx], &ids);
                    let mut logits = |model: &Gpt| match ckpt.as_mut() {
                        Some(ckpt) => model.forward_checkpointed(ckpt, &ids),
                        None => model.forward(&ids),
                    };
                    let loss = autocast(products, || Gpt::loss(&logits(model), &ids));
                    loss.backward_into(grads).expect("backward");
                    if recipe {
                        grads.clip_norm(1.0).expect("clip");
                    }
                    loss.item()
                })
            });
            rounds.push(median(&measured.times[timed..]));
            if checkpointed {
                // Inference does not checkpoint: the forward alone is the rows' above.
                continue;
            }
            // The forward alone, as inference runs it; the chunk's first warms the pool.
            for j in 0..CHUNK {
                let started = Instant::now();
                pool.scope(|s| {
                    let ids = s.from_slice::<i64>(&[BATCH, c.n_ctx], &ids);
                    black_box(autocast(products, || model.forward(&ids).len()))
                });
                if j > 0 {
                    forwards.push(started.elapsed().as_secs_f64() * 1e3);
                }
            }
        }
    }
    println!(
        "\nGPT training step: {} blocks, width {}, {} heads, context {}, batch {BATCH}, vocabulary \
         {}, {}",
        c.layers,
        c.dim,
        c.heads,
        c.n_ctx,
        c.vocab,
        if recipe {
            "AdamW with groups, clipped to norm 1"
        } else {
            "Adam"
        }
    );
    println!("\n| row | step ms | forward ms | peak activation bytes | last loss |");
    println!("|---|---:|---:|---:|---:|");
    for ((name, ..), measured, forwards, ..) in &runs {
        let forward = match forwards.is_empty() {
            true => "-".to_string(),
            false => format!("{:.1}", median(forwards)),
        };
        println!(
            "| {name} | {:.1} | {forward} | {} | {:.4} |",
            measured.median_ms(),
            measured.peak,
            measured.losses.last().expect("a step ran")
        );
    }
    if saving {
        // Each products row ran right after its policy's row without saving, in every round: the
        // ratio of their round medians, paired, is less moved by the machine's load than either.
        println!(
            "\n| policy | step, Products / Nothing | Nothing / no checkpointing | Products / no \
             checkpointing | peak, Products / Nothing |"
        );
        println!("|---|---:|---:|---:|---:|");
        let paired = |a: &[f64], b: &[f64]| {
            let ratios: Vec<f64> = a.iter().zip(b).map(|(a, b)| b / a).collect();
            median(&ratios)
        };
        let plain = &runs[0].4;
        let checkpointed: Vec<_> = runs.iter().filter(|r| r.3.is_some()).collect();
        for pair in checkpointed.chunks(2) {
            let [nothing, products] = pair else { continue };
            println!(
                "| {} | {:.3} | {:.3} | {:.3} | {:.3} |",
                nothing.0 .0,
                paired(&nothing.4, &products.4),
                paired(plain, &nothing.4),
                paired(plain, &products.4),
                products.1.peak as f64 / nothing.1.peak as f64
            );
        }
    }
    if bf16 {
        // The fused rows' losses, f32 against bf16 products, from the same initial weights.
        let (f32s, bf16s) = (&runs[0].1.losses, &runs[2].1.losses);
        println!("\n| step | f32 loss | bf16-products loss | difference |");
        println!("|---:|---:|---:|---:|");
        for step in (0..f32s.len()).step_by(20).chain([f32s.len() - 1]) {
            let (a, b) = (f32s[step], bf16s[step]);
            println!("| {} | {a:.4} | {b:.4} | {:+.4} |", step + 1, b - a);
        }
    }
}
