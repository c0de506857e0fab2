//! Training loops of the pre-norm MLP and of the tiny GPT, with a hook at every step boundary:
//! `tests/allocations.rs` counts the heap allocations of a steady-state step through it, and
//! `examples/training_steps.rs` runs the loops alone for counting instructions.
//!
//! Shared through `#[path]`; the includer declares `gpt` and `pre_norm_mlp` beside this module.

#![allow(dead_code)] // each user needs a different part

use tensorscope::nn::{Adam, Optimizer};
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Gradients};

use super::{gpt, pre_norm_mlp};

/// `steps` training steps (forward in a training scope, backward into kept gradients, Adam, zeroed
/// gradients) of a pre-norm MLP of `blocks` blocks, batch 64, width 32; its block loop is
/// checkpointed with `config` if given. Calls `boundary(i)` before step `i` and once after the last
/// (`i == steps`).
pub(crate) fn mlp(
    pool: &Pool,
    blocks: usize,
    config: Option<CheckpointConfig>,
    steps: usize,
    mut boundary: impl FnMut(usize),
) {
    let (batch, width) = (64, 32);
    let mut model = pre_norm_mlp::Model::new(pool, blocks, width);
    let mut ckpt = config.map(Checkpointer::new);
    let mut adam = Adam::new(1e-3);
    pool.scope(|outer| {
        let mut grads = Gradients::new(outer);
        for step in 0..steps {
            boundary(step);
            outer.scope(|s| {
                let x = s.randn::<f32>(&[batch, width], 7);
                let target = s.randn::<f32>(&[batch, width], 8);
                s.train(|t| {
                    let x = t.rebind(&x);
                    let y = match ckpt.as_mut() {
                        Some(ckpt) => model.forward(ckpt, x),
                        None => model.forward_plain(x),
                    };
                    y.mse(&target).backward_into(&mut grads).expect("backward");
                })
            });
            adam.step(&mut model, &grads).expect("adam");
            grads.zero().expect("zero");
        }
        boundary(steps);
    });
}

/// The tiny GPT of the parity fixture's sizes, with random weights and two blocks.
pub(crate) fn tiny_gpt(pool: &Pool) -> gpt::Gpt {
    let config = gpt::Config {
        layers: 2,
        ..gpt::Config::TINY
    };
    gpt::Gpt::random(pool, config, 1).expect("a model")
}

/// Two sequences of 8 token ids.
pub(crate) const TOKENS: [i64; 16] = [3, 10, 17, 24, 31, 38, 45, 52, 59, 66, 73, 80, 87, 94, 5, 12];

/// `steps` forwards (inference) of the tiny GPT on [`TOKENS`]; `boundary` as in [`mlp`].
pub(crate) fn gpt_forwards(pool: &Pool, steps: usize, mut boundary: impl FnMut(usize)) {
    let model = tiny_gpt(pool);
    for step in 0..steps {
        boundary(step);
        pool.scope(|s| {
            let ids = s.from_slice::<i64>(&[2, 8], &TOKENS);
            model.forward(&ids).len()
        });
    }
    boundary(steps);
}

/// `steps` training steps of the tiny GPT on [`TOKENS`] (next-token cross-entropy by ids, Adam),
/// its block loop checkpointed with `config` if given; `boundary` as in [`mlp`].
pub(crate) fn gpt(
    pool: &Pool,
    config: Option<CheckpointConfig>,
    steps: usize,
    mut boundary: impl FnMut(usize),
) {
    let mut model = tiny_gpt(pool);
    let mut ckpt = config.map(Checkpointer::new);
    let mut adam = Adam::new(1e-3);
    pool.scope(|outer| {
        let mut grads = Gradients::new(outer);
        for step in 0..steps {
            boundary(step);
            outer.train(|t| {
                let ids = t.from_slice::<i64>(&[2, 8], &TOKENS);
                let logits = match ckpt.as_mut() {
                    Some(ckpt) => model.forward_checkpointed(ckpt, &ids),
                    None => model.forward(&ids),
                };
                let loss = gpt::Gpt::loss(&logits, &ids);
                loss.backward_into(&mut grads).expect("backward");
            });
            adam.step(&mut model, &grads).expect("adam");
            grads.zero().expect("zero");
        }
        boundary(steps);
    });
}
