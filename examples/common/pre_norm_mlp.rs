//! The deep residual MLP of `examples/checkpointed_training.rs`, written two ways on the same
//! parameters: `n` pre-norm blocks `x + W2 gelu(W1 LayerNorm(x))` (hidden width 2x, affine layer
//! norm, GELU's tanh form).
//!
//! - as `nn` layers, trained through their hand-written backward passes ([`layers`]);
//! - as an annotated forward of tensor ops on parameters the blocks own, trained through autograd
//!   ([`Block`]).
//!
//! Shared by `examples/checkpointed_training.rs` and `tests/training.rs` through `#[path]`.

use tensorscope::nn::{Activation, LayerNorm, Linear, ParamStore, Residual, Sequential};
use tensorscope::prelude::*;
use tensorscope::Parameters;

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
