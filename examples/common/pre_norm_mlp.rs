//! The deep residual MLP of `examples/checkpointed_training.rs`, written two ways on the same
//! parameters: `n` pre-norm blocks `x + W2 gelu(W1 LayerNorm(x))` (hidden width 2x, affine layer
//! norm, GELU's tanh form).
//!
//! - as `nn` layers, trained through their hand-written backward passes ([`layers`]);
//! - as an annotated forward of tensor ops on parameters the blocks own, trained through autograd
//!   ([`Block`]).
//!
//! Shared by `examples/checkpointed_training.rs`, `tests/training.rs` and
//! `tests/checkpoint_training.rs` through `#[path]`.

#![allow(dead_code)] // each user needs a different part

use tensorscope::nn::{Activation, LayerNorm, Linear, ParamStore, Residual, Sequential};
use tensorscope::prelude::*;
use tensorscope::{Checkpointer, Parameters};

const EPS: f32 = 1e-5;

/// The model as `nn` layers, registering `b{i}.ln.{gamma,beta}` and `b{i}.fc{1,2}.{weight,bias}`
/// in `params`. The output projections start small (std `0.5 / sqrt(2 width blocks)`), so the
/// residual stream stays near unit scale at any depth.
pub(crate) fn layers(params: &mut ParamStore, blocks: usize, width: usize) -> Sequential {
    let hidden = 2 * width;
    let out_std = 0.5 / ((hidden * blocks) as f64).sqrt();
    (0..blocks).fold(Sequential::new(), |seq, i| {
        let seed = 10 * i as u64;
        let inner = Sequential::new()
            .push(LayerNorm::new(params, &format!("b{i}.ln"), width, EPS).unwrap())
            .push(Linear::new(params, &format!("b{i}.fc1"), width, hidden, seed).unwrap())
            .push(Activation::gelu())
            .push(
                Linear::with_std(
                    params,
                    &format!("b{i}.fc2"),
                    hidden,
                    width,
                    out_std,
                    seed + 1,
                )
                .unwrap(),
            );
        seq.push(Residual::new(inner))
    })
}

/// One block as tensor ops on parameters it owns.
pub(crate) struct Block {
    gamma: Param,
    beta: Param,
    w1: Param,
    b1: Param,
    w2: Param,
    b2: Param,
}

impl Block {
    /// The blocks of a model made by [`layers`], sharing its parameters (no copy). Drop the store
    /// before training them, so each parameter has one owner and updates run in place.
    pub(crate) fn all(params: &ParamStore, blocks: usize) -> Vec<Block> {
        (0..blocks)
            .map(|i| {
                let get = |name: &str| params.get(&format!("b{i}.{name}")).unwrap().clone();
                Block {
                    gamma: get("ln.gamma"),
                    beta: get("ln.beta"),
                    w1: get("fc1.weight"),
                    b1: get("fc1.bias"),
                    w2: get("fc2.weight"),
                    b2: get("fc2.bias"),
                }
            })
            .collect()
    }

    /// `x + W2 gelu(W1 LayerNorm(x))`: the same kernels in the same order as the layers.
    #[dispose_scope]
    pub(crate) fn forward<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        let h = x.layer_norm(EPS) * &self.gamma + &self.beta;
        let h = (h.matmul(&self.w1) + &self.b1).gelu();
        h.matmul(&self.w2) + &self.b2 + x
    }
}

impl Parameters<f32> for Block {
    /// In registration order, as the store lists them.
    fn for_each_param(&mut self, f: &mut dyn FnMut(&mut Param)) {
        let Block {
            gamma,
            beta,
            w1,
            b1,
            w2,
            b2,
        } = self;
        [gamma, beta, w1, b1, w2, b2].into_iter().for_each(f)
    }
}

/// The blocks as one model: the forward written once, with checkpointing under the control of the
/// checkpointer it is given.
pub(crate) struct Model {
    pub(crate) blocks: Vec<Block>,
}

impl Model {
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

impl Parameters<f32> for Model {
    fn for_each_param(&mut self, f: &mut dyn FnMut(&mut Param)) {
        self.blocks.for_each_param(f)
    }
}

impl Block {
    /// Calls `f` on every parameter, in registration order.
    pub(crate) fn each_param(&self, f: &mut dyn FnMut(&Param)) {
        [
            &self.gamma,
            &self.beta,
            &self.w1,
            &self.b1,
            &self.w2,
            &self.b2,
        ]
        .into_iter()
        .for_each(f)
    }
}
