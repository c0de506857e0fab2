//! Runs a given number of training steps of a small model and nothing else, for counting the
//! instructions of a steady-state step under `valgrind --tool=callgrind` (a count, unlike a time,
//! is the same on a loaded machine): the difference between two step counts, divided by the
//! difference of steps, is one steady-state step.
//!
//! `cargo run --release --example training_steps -- MODEL STEPS`, MODEL one of `mlp` (the 2-block
//! pre-norm MLP, batch 64, width 32), `mlp-sqrt` (its block loop under `#[checkpoint]` with
//! `Policy::Sqrt`, 4 blocks), `gpt` (the tiny GPT, 2 blocks, batch 2 of 8 tokens) or `gpt-every`
//! (its checkpointed block loop, `Policy::Every(1)`); the loops of `tests/allocations.rs`.

use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Policy};

#[path = "common/gpt.rs"]
mod gpt;
#[path = "common/pre_norm_mlp.rs"]
mod pre_norm_mlp;
#[path = "common/training_loops.rs"]
mod training_loops;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (model, steps) = match &args[..] {
        [model, steps] => (
            model.as_str(),
            steps.parse::<usize>().expect("STEPS is a number"),
        ),
        _ => panic!("usage: training_steps mlp|mlp-sqrt|gpt|gpt-every STEPS"),
    };
    let pool = Pool::with_max_memory_mb(256);
    let policy = |p| Some(CheckpointConfig::new(p));
    match model {
        "mlp" => training_loops::mlp(&pool, 2, None, steps, |_| {}),
        "mlp-sqrt" => training_loops::mlp(&pool, 4, policy(Policy::Sqrt), steps, |_| {}),
        "gpt" => training_loops::gpt(&pool, None, steps, |_| {}),
        "gpt-every" => training_loops::gpt(&pool, policy(Policy::Every(1)), steps, |_| {}),
        other => panic!("unknown model {other}"),
    }
}
