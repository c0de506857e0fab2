//! An op written outside the library with its own backward: SwiGLU, `silu(a) * b`, the gated unit
//! of LLaMA's feed-forward block, as one fused kernel; and a residual model of SwiGLU blocks whose
//! forward is a `#[checkpoint]` loop (the stack of `pre_norm_mlp.rs`).
//!
//! Shared by `examples/custom_op.rs` and `tests/integration/custom_op.rs` through `#[path]`; the
//! includer declares `pre_norm_mlp` beside this module.

#![allow(dead_code)] // each user needs a different part

use tensorscope::autograd::{Backward, Forward, Grads, Op, Saved};
use tensorscope::prelude::*;
use tensorscope::{Element, Error, Parameters, Result};

use super::pre_norm_mlp::{self, Residual};

/// `silu(a) * b` for two tensors of one shape, in one pass over them: the composition `a.silu() *
/// b` rents a tensor for `silu(a)` and, in training, saves it for the backward as well as `a` and
/// `b`; the fused op rents only its output and saves only `a` and `b`.
#[derive(Clone, Copy)]
pub(crate) struct SwiGlu;

// The kernels use `exp_kernel`, the library's vectorisable `e^x`: `Float::exp` calls libm once per
// element, and the loop around it would not vectorise.

/// `silu(x) = x sigmoid(x)`.
#[inline(always)]
fn silu<T: Element>(x: T) -> T {
    x / (T::one() + (-x).exp_kernel())
}

/// `d silu / dx = sigmoid(x) (1 + x (1 - sigmoid(x)))`.
#[inline(always)]
fn silu_grad<T: Element>(x: T) -> T {
    let sig = T::one() / (T::one() + (-x).exp_kernel());
    sig * (T::one() + x * (T::one() - sig))
}

impl<T: Element> Op<T> for SwiGlu {
    /// `a` and `b`: aliases of the inputs, not copies.
    type Saved<'s> = (Saved<'s, T>, Saved<'s, T>);

    fn name(&self) -> &'static str {
        "swiglu"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let (a, b) = (cx.input(0), cx.input(1));
        if a.shape() != b.shape() {
            return Err(Error::ShapeMismatch {
                op: "swiglu",
                lhs: a.shape().into(),
                rhs: b.shape().into(),
                reason: "a fused kernel over two tensors of one shape, no broadcasting".into(),
            });
        }
        let y = a.try_zip_map(b, |a, b| silu(a) * b)?;
        let saved = cx.saving().then(|| (cx.save(a), cx.save(b)));
        Ok((y, saved))
    }

    /// `da = g b silu'(a)`, `db = g silu(a)`, each only when its input needs a gradient.
    fn backward<'b>(
        &self,
        (a, b): Self::Saved<'b>,
        g: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
        let (a, b) = (a.get(cx), b.get(cx));
        let da = if cx.needs(0) {
            let slope = b.try_zip_map(&a, |b, a| b * silu_grad(a))?;
            Some(g.try_zip_map(&slope, |g, s| g * s)?)
        } else {
            None
        };
        let db = if cx.needs(1) {
            Some(g.try_zip_map(&a, |g, a| g * silu(a))?)
        } else {
            None
        };
        Ok(Grads::from([da, db]))
    }
}

/// `silu(a) * b` through [`SwiGlu`]: recorded in a training scope, replayed by a `#[checkpoint]`.
/// Panics if the shapes differ (see [`SwiGlu`]).
pub(crate) fn swiglu<'s, T: Element>(a: &Tensor<'s, T>, b: &Tensor<'s, T>) -> Tensor<'s, T> {
    Tensor::apply(SwiGlu, &[a, b])
}

const EPS: f32 = 1e-5;

/// One pre-norm SwiGLU block, `x + W3 (silu(W1 h) * W2 h)` with `h = LayerNorm(x)`, as in
/// LLaMA's feed-forward (without its RMS norm's scale).
#[derive(Parameters)]
pub(crate) struct Block {
    w1: Param,
    w2: Param,
    w3: Param,
}

/// Normal samples with standard deviation `std`, from `seed`.
fn randn(pool: &Pool, shape: &[usize], std: f32, seed: u64) -> Param {
    pool.scope(|s| (s.randn::<f32>(shape, seed) * std).detach())
}

impl Block {
    /// The block with the library's ops composed (`silu`, then `*`).
    #[dispose_scope]
    pub(crate) fn forward_composed<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        let h = x.layer_norm(EPS);
        let gated = h.matmul(&self.w1).silu() * h.matmul(&self.w2);
        gated.matmul(&self.w3) + x
    }
}

impl Residual for Block {
    /// Block `i` of a model `blocks` deep, hidden width `2 * width`; the output projection small,
    /// so the residual stream stays near unit scale.
    fn new(pool: &Pool, i: usize, blocks: usize, width: usize) -> Block {
        let (hidden, seed) = (2 * width, 10 * i as u64);
        let std_in = 1.0 / (width as f32).sqrt();
        Block {
            w1: randn(pool, &[width, hidden], std_in, seed),
            w2: randn(pool, &[width, hidden], std_in, seed + 1),
            w3: randn(
                pool,
                &[hidden, width],
                0.5 / ((hidden * blocks) as f32).sqrt(),
                seed + 2,
            ),
        }
    }

    /// The block with the fused op.
    #[dispose_scope]
    fn forward<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        let h = x.layer_norm(EPS);
        let gated = swiglu(&h.matmul(&self.w1), &h.matmul(&self.w2));
        gated.matmul(&self.w3) + x
    }
}

/// The blocks as one model (`Model::forward` is a `#[checkpoint]` loop over them, whose backward
/// replays the fused op's forward).
pub(crate) type Model = pre_norm_mlp::Model<Block>;

impl Model {
    /// The forward with the library's ops composed instead of the fused op.
    pub(crate) fn forward_composed<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        self.blocks
            .iter()
            .fold(x, |x, block| block.forward_composed(&x))
    }
}
