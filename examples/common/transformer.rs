//! The transformer-style model of `examples/model_forward.rs`: pre-norm blocks of single-head
//! self-attention and a 4x MLP, every sub-module forward `#[dispose_scope]`, and the block loop
//! also written with `#[checkpoint]`.
//!
//! Shared by `examples/model_forward.rs` and `tests/integration/checkpoint_training.rs` through
//! `#[path]`.

#![allow(dead_code)] // each user needs a different part

use tensorscope::prelude::*;
use tensorscope::{Checkpointer, Parameters};

fn weight(s: &Scope<'_, '_>, rows: usize, cols: usize, seed: u64) -> Param {
    (s.randn::<f32>(&[rows, cols], seed) * (1.0 / (rows as f32).sqrt())).detach()
}

/// Single-head self-attention over `[batch, seq, dim]`.
#[derive(Parameters)]
pub(crate) struct Attention {
    wq: Param,
    wk: Param,
    wv: Param,
    wo: Param,
    #[param(skip)]
    scale: f32,
}

impl Attention {
    #[dispose_scope]
    pub(crate) fn forward<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        let q = x.matmul(&self.wq);
        let k = x.matmul(&self.wk);
        let v = x.matmul(&self.wv);
        let scores = q.matmul(&k.t()) * self.scale; // [batch, seq, seq]
        let weights = scores.softmax(2);
        weights.matmul(&v).matmul(&self.wo)
    }
}

/// `gelu(x W1 + b1) W2 + b2`, hidden width 4x.
#[derive(Parameters)]
pub(crate) struct Mlp {
    w1: Param,
    b1: Param,
    w2: Param,
    b2: Param,
}

impl Mlp {
    #[dispose_scope]
    pub(crate) fn forward<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        let h = (x.matmul(&self.w1) + &self.b1).gelu();
        h.matmul(&self.w2) + &self.b2
    }
}

/// Pre-norm block: `h = x + attn(ln(x)); y = h + mlp(ln(h))`.
#[derive(Parameters)]
pub(crate) struct Block {
    attention: Attention,
    mlp: Mlp,
}

impl Block {
    #[dispose_scope]
    pub(crate) fn forward<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        let h = x + &self.attention.forward(&x.layer_norm(1e-5));
        let out = self.mlp.forward(&(&h).layer_norm(1e-5)); // `&h`: keep `h` for the residual
        h + &out
    }
}

/// `blocks` blocks of width `dim`.
#[derive(Parameters)]
pub(crate) struct Transformer {
    pub(crate) blocks: Vec<Block>,
}

impl Transformer {
    pub(crate) fn new(pool: &Pool, blocks: usize, dim: usize) -> Self {
        pool.scope(|s| Transformer {
            blocks: (0..blocks as u64)
                .map(|i| Block {
                    attention: Attention {
                        wq: weight(s, dim, dim, 10 * i),
                        wk: weight(s, dim, dim, 10 * i + 1),
                        wv: weight(s, dim, dim, 10 * i + 2),
                        wo: weight(s, dim, dim, 10 * i + 3),
                        scale: 1.0 / (dim as f32).sqrt(),
                    },
                    mlp: Mlp {
                        w1: weight(s, dim, 4 * dim, 10 * i + 4),
                        b1: Param::zeros(pool, &[4 * dim]),
                        w2: weight(s, 4 * dim, dim, 10 * i + 5),
                        b2: Param::zeros(pool, &[dim]),
                    },
                })
                .collect(),
        })
    }

    #[dispose_scope]
    pub(crate) fn forward<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        let mut x = x.clone();
        for block in &self.blocks {
            x = block.forward(&x);
        }
        x
    }

    /// The same blocks, checkpointed as `ckpt` says.
    #[checkpoint]
    pub(crate) fn forward_checkpointed<'a>(
        &self,
        ckpt: &mut Checkpointer,
        x: Tensor<'a>,
    ) -> Tensor<'a> {
        let mut x = x;
        for block in &self.blocks {
            x = block.forward(&x);
        }
        x
    }
}
