//! Runs a given number of training steps of a small model and nothing else, for counting the
//! instructions of a steady-state step under `valgrind --tool=callgrind` (a count, unlike a time,
//! is the same on a loaded machine): the difference between two step counts, divided by the
//! difference of steps, is one steady-state step.
//!
//! `cargo run --release --example training_steps -- MODEL STEPS`, MODEL one of `mlp` (the 2-block
//! pre-norm MLP, batch 64, width 32), `mlp-sqrt` (its block loop under `#[checkpoint]` with
//! `Policy::Sqrt`, 4 blocks), `gpt` (the tiny GPT, 2 blocks, batch 2 of 8 tokens, its attention
//! fused), `gpt-every` (its checkpointed block loop, `Policy::Every(1)`) or `gpt-tied` (its LM head
//! a field tied to the token embedding, `Gpt::tie_head`); the loops of `tests/allocations.rs`.
//!
//! Without arguments it runs each model for 50 steps and prints the median time of a step.

use std::time::Instant;

use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Policy};

#[path = "common/gpt.rs"]
mod gpt;
#[path = "common/pre_norm_mlp.rs"]
mod pre_norm_mlp;
#[path = "common/training_loops.rs"]
mod training_loops;

use gpt::Attention::Fused;

const MODELS: [&str; 5] = ["mlp", "mlp-sqrt", "gpt", "gpt-every", "gpt-tied"];
const USAGE: &str = "usage: training_steps [mlp|mlp-sqrt|gpt|gpt-every|gpt-tied STEPS]";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match &args[..] {
        [] => {
            println!("{:<10} {:>16}", "model", "median step µs");
            for model in MODELS {
                let mut at = Vec::with_capacity(51);
                run(model, 50, &mut |_| at.push(Instant::now()));
                let mut micros: Vec<f64> = at
                    .windows(2)
                    .map(|w| (w[1] - w[0]).as_secs_f64() * 1e6)
                    .collect();
                micros.sort_by(f64::total_cmp);
                println!("{model:<10} {:>16.1}", micros[micros.len() / 2]);
            }
        }
        [model, steps] if MODELS.contains(&model.as_str()) => match steps.parse() {
            Ok(steps) => run(model, steps, &mut |_| {}),
            Err(_) => fail(&format!("STEPS must be a whole number, not {steps}")),
        },
        _ => fail(&format!("unknown arguments: {}", args.join(" "))),
    }
}

fn fail(why: &str) -> ! {
    eprintln!("{why}\n{USAGE}");
    std::process::exit(2)
}

/// `steps` steps of `model`, calling `boundary(i)` before step `i` and after the last.
fn run(model: &str, steps: usize, boundary: &mut dyn FnMut(usize)) {
    let pool = Pool::with_max_memory_mb(256);
    let policy = |p| Some(CheckpointConfig::new(p));
    match model {
        "mlp" => training_loops::mlp(&pool, 2, None, steps, boundary),
        "mlp-sqrt" => training_loops::mlp(&pool, 4, policy(Policy::Sqrt), steps, boundary),
        "gpt" => training_loops::gpt(&pool, Fused, None, steps, boundary),
        "gpt-tied" => training_loops::tied_gpt(&pool, steps, boundary),
        _ => training_loops::gpt(&pool, Fused, policy(Policy::Every(1)), steps, boundary),
    }
}
