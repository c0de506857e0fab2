//! Training loops of the pre-norm MLP and of the tiny GPT, with a hook at every step boundary:
//! `tests/allocations.rs` counts the heap allocations of a steady-state step through it, and
//! `examples/training_steps.rs` runs the loops alone for counting instructions.
//!
//! Shared through `#[path]`; the includer declares `gpt` and `pre_norm_mlp` beside this module.

#![allow(dead_code)] // each user needs a different part

use tensorscope::nn::{Adam, Optimizer};
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Gradients, Parameters, Scope};

use super::{gpt, pre_norm_mlp};

/// `steps` Adam steps of `model`, checkpointed with `config` if given: `backward(outer, model,
/// checkpointer, grads)` runs a forward in a training scope and its backward into `grads`, which
/// are kept across steps and zeroed after each update. Calls `boundary(i)` before step `i` and once
/// after the last (`i == steps`).
fn adam_steps<M: Parameters<f32>>(
    pool: &Pool,
    model: &mut M,
    config: Option<CheckpointConfig>,
    steps: usize,
    mut boundary: impl FnMut(usize),
    mut backward: impl for<'s, 'p> FnMut(
        &Scope<'s, 'p>,
        &M,
        Option<&mut Checkpointer>,
        &mut Gradients<'s>,
    ),
) {
    let mut ckpt = config.map(Checkpointer::new);
    let mut adam = Adam::new(1e-3);
    pool.scope(|outer| {
        let mut grads = Gradients::new(outer);
        for step in 0..steps {
            boundary(step);
            backward(outer, model, ckpt.as_mut(), &mut grads);
            adam.step(model, &grads).expect("adam");
            grads.zero().expect("zero");
        }
        boundary(steps);
    });
}

/// `steps` training steps of a pre-norm MLP of `blocks` blocks, batch 64, width 32 (mean squared
/// error against a fixed target); see [`adam_steps`].
pub(crate) fn mlp(
    pool: &Pool,
    blocks: usize,
    config: Option<CheckpointConfig>,
    steps: usize,
    boundary: impl FnMut(usize),
) {
    let (batch, width) = (64, 32);
    let mut model: pre_norm_mlp::Model = pre_norm_mlp::Model::new(pool, blocks, width);
    adam_steps(
        pool,
        &mut model,
        config,
        steps,
        boundary,
        |outer, model, ckpt, grads| {
            outer.scope(|s| {
                let x = s.randn::<f32>(&[batch, width], 7);
                let target = s.randn::<f32>(&[batch, width], 8);
                s.train(|t| {
                    let x = t.rebind(&x);
                    let y = match ckpt {
                        Some(ckpt) => model.forward(ckpt, x),
                        None => model.forward_plain(x),
                    };
                    y.mse(&target).backward_into(grads).expect("backward");
                })
            })
        },
    );
}

/// The tiny GPT of the parity fixture's sizes, with random weights and two blocks, its attention
/// in the form given.
pub(crate) fn tiny_gpt(pool: &Pool, attention: gpt::Attention) -> gpt::Gpt {
    let config = gpt::Config {
        layers: 2,
        attention,
        ..gpt::Config::TINY
    };
    gpt::Gpt::random(pool, config, 1).expect("a model")
}

/// Two sequences of 8 token ids.
pub(crate) const TOKENS: [i64; 16] = [3, 10, 17, 24, 31, 38, 45, 52, 59, 66, 73, 80, 87, 94, 5, 12];

/// `steps` forwards (inference) of the tiny GPT on [`TOKENS`], its attention in the form given;
/// `boundary` as in [`adam_steps`].
pub(crate) fn gpt_forwards(
    pool: &Pool,
    attention: gpt::Attention,
    steps: usize,
    mut boundary: impl FnMut(usize),
) {
    let model = tiny_gpt(pool, attention);
    for step in 0..steps {
        boundary(step);
        pool.scope(|s| {
            let ids = s.from_slice::<i64>(&[2, 8], &TOKENS);
            model.forward(&ids).len()
        });
    }
    boundary(steps);
}

/// `steps` training steps of the tiny GPT on [`TOKENS`] (next-token cross-entropy by ids), its
/// attention in the form given; see [`adam_steps`].
pub(crate) fn gpt(
    pool: &Pool,
    attention: gpt::Attention,
    config: Option<CheckpointConfig>,
    steps: usize,
    boundary: impl FnMut(usize),
) {
    gpt_steps(pool, tiny_gpt(pool, attention), config, steps, boundary)
}

/// The same steps of the tiny GPT with its LM head a field tied to the token embedding
/// ([`gpt::Gpt::tie_head`]).
pub(crate) fn tied_gpt(pool: &Pool, steps: usize, boundary: impl FnMut(usize)) {
    let model = tiny_gpt(pool, gpt::Attention::Fused).tie_head();
    gpt_steps(pool, model, None, steps, boundary)
}

/// `steps` training steps of `model` on [`TOKENS`]; see [`adam_steps`].
fn gpt_steps(
    pool: &Pool,
    mut model: gpt::Gpt,
    config: Option<CheckpointConfig>,
    steps: usize,
    boundary: impl FnMut(usize),
) {
    adam_steps(
        pool,
        &mut model,
        config,
        steps,
        boundary,
        |outer, model, ckpt, grads| {
            outer.train(|t| {
                let ids = t.from_slice::<i64>(&[2, 8], &TOKENS);
                let logits = match ckpt {
                    Some(ckpt) => model.forward_checkpointed(ckpt, &ids),
                    None => model.forward(&ids),
                };
                let loss = gpt::Gpt::loss(&logits, &ids);
                loss.backward_into(grads).expect("backward");
            })
        },
    );
}
