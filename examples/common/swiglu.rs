//! An op written outside the library with its own backward: SwiGLU, `silu(a) * b`, the gated unit
//! of LLaMA's feed-forward block, as one fused kernel; and a residual model of SwiGLU blocks whose
//! forward is a `#[checkpoint]` loop.
//!
//! Shared by `examples/custom_op.rs` and `tests/integration/custom_op.rs` through `#[path]`.

#![allow(dead_code)] // each user needs a different part

use tensorscope::autograd::{Backward, Forward, Grads, Op, Saved};
use tensorscope::prelude::*;
use tensorscope::{Checkpointer, Element, Error, Parameters, Result};

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
    type Saved = (Saved<T>, Saved<T>);

    fn name(&self) -> &'static str {
        "swiglu"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved>)> {
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
        (a, b): Self::Saved,
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
    /// Block `i` of a model `blocks` deep, hidden width `2 * width`; the output projection small,
    /// so the residual stream stays near unit scale.
    pub(crate) fn new(pool: &Pool, i: usize, blocks: usize, width: usize) -> Block {
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
    pub(crate) fn forward<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        let h = x.layer_norm(EPS);
        let gated = swiglu(&h.matmul(&self.w1), &h.matmul(&self.w2));
        gated.matmul(&self.w3) + x
    }

    /// The block with the library's ops composed (`silu`, then `*`).
    #[dispose_scope]
    pub(crate) fn forward_composed<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        let h = x.layer_norm(EPS);
        let gated = h.matmul(&self.w1).silu() * h.matmul(&self.w2);
        gated.matmul(&self.w3) + x
    }
}

/// The blocks as one model.
pub(crate) struct Model {
    pub(crate) blocks: Vec<Block>,
}

impl Model {
    /// `blocks` blocks of `width`.
    pub(crate) fn new(pool: &Pool, blocks: usize, width: usize) -> Model {
        Model {
            blocks: (0..blocks)
                .map(|i| Block::new(pool, i, blocks, width))
                .collect(),
        }
    }

    /// Every block in turn, checkpointed as `ckpt`'s configuration says: in a training scope, the
    /// backward replays the blocks, the fused op's forward among them, from the stored boundaries.
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

    /// The forward with the library's ops composed instead of the fused op.
    pub(crate) fn forward_composed<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        self.blocks
            .iter()
            .fold(x, |x, block| block.forward_composed(&x))
    }
}

impl Parameters<f32> for Model {
    fn for_each_param(&mut self, f: &mut dyn FnMut(&mut Param)) {
        for Block { w1, w2, w3 } in &mut self.blocks {
            [w1, w2, w3].into_iter().for_each(&mut *f)
        }
    }
}
