//! The deep residual MLP of `examples/checkpointed_training.rs`: `n` pre-norm blocks
//! `x + W2 gelu(W1 LayerNorm(x))` (hidden width 2x, affine layer norm, GELU's tanh form), written
//! as an annotated forward of tensor ops on parameters the blocks own, and the block loop once more
//! with `#[checkpoint]`, for these blocks or any others ([`Residual`]).
//!
//! Shared by `examples/checkpointed_training.rs` and `tests/integration/checkpoint_training.rs`
//! through `#[path]`.

#![allow(dead_code)] // each user needs a different part

use tensorscope::prelude::*;
use tensorscope::{Checkpointer, Parameters};

const EPS: f32 = 1e-5;

/// One block as tensor ops on parameters it owns.
#[derive(Parameters)]
pub(crate) struct Block {
    gamma: Param,
    beta: Param,
    w1: Param,
    b1: Param,
    w2: Param,
    b2: Param,
}

/// Normal samples with standard deviation `std`, from `seed`.
fn randn(pool: &Pool, shape: &[usize], std: f32, seed: u64) -> Param {
    pool.scope(|s| (s.randn::<f32>(shape, seed) * std).detach())
}

impl Block {
    /// Block `i` of a model `blocks` deep: layer norm at the identity, the first projection of
    /// standard deviation `1/sqrt(width)`, the second small (`0.5 / sqrt(hidden blocks)`), so the
    /// residual stream stays near unit scale at any depth; biases zero.
    pub(crate) fn new(pool: &Pool, i: usize, blocks: usize, width: usize) -> Block {
        let hidden = 2 * width;
        let seed = 10 * i as u64;
        let out_std = 0.5 / ((hidden * blocks) as f32).sqrt();
        Block {
            gamma: Param::from_slice(pool, &[width], &vec![1.0; width]),
            beta: Param::zeros(pool, &[width]),
            w1: randn(pool, &[width, hidden], 1.0 / (width as f32).sqrt(), seed),
            b1: Param::zeros(pool, &[hidden]),
            w2: randn(pool, &[hidden, width], out_std, seed + 1),
            b2: Param::zeros(pool, &[width]),
        }
    }

    /// `x + W2 gelu(W1 LayerNorm(x))`.
    #[dispose_scope]
    pub(crate) fn forward<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        let h = x.layer_norm(EPS) * &self.gamma + &self.beta;
        let h = (h.matmul(&self.w1) + &self.b1).gelu();
        h.matmul(&self.w2) + &self.b2 + x
    }
}

/// A residual block a [`Model`] stacks: made from its place in the model and the width, run on
/// the residual stream.
pub(crate) trait Residual: Parameters<f32> {
    /// Block `i` of a model `blocks` deep, of width `width`.
    fn new(pool: &Pool, i: usize, blocks: usize, width: usize) -> Self;
    /// The block on `x`, in `x`'s scope.
    fn forward<'a>(&self, x: &Tensor<'a>) -> Tensor<'a>;
}

impl Residual for Block {
    fn new(pool: &Pool, i: usize, blocks: usize, width: usize) -> Block {
        Block::new(pool, i, blocks, width)
    }

    fn forward<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        Block::forward(self, x)
    }
}

/// The blocks as one model: the forward written once, with checkpointing under the control of the
/// checkpointer it is given.
#[derive(Parameters)]
pub(crate) struct Model<B = Block> {
    pub(crate) blocks: Vec<B>,
}

impl<B: Residual> Model<B> {
    /// `blocks` blocks of `width`.
    pub(crate) fn new(pool: &Pool, blocks: usize, width: usize) -> Model<B> {
        Model {
            blocks: (0..blocks)
                .map(|i| B::new(pool, i, blocks, width))
                .collect(),
        }
    }

    /// Every block in turn. Checkpointed as `ckpt`'s configuration says; in a training scope its
    /// backward replays the blocks from the stored boundaries.
    #[checkpoint]
    pub(crate) fn forward<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let mut x = x;
        for block in &self.blocks {
            x = block.forward(&x);
        }
        x
    }

    /// The same forward without the attribute.
    pub(crate) fn forward_plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        self.blocks.iter().fold(x, |x, block| block.forward(&x))
    }
}
