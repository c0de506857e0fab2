//! A matrix product that finishes its output while it is in cache: [`Tensor::matmul_with`] adds a
//! bias or a residual, applies an activation and normalizes each row of a block of the product as
//! soon as the block is computed, instead of one pass over the whole output per op.
//!
//! The result has the bits of the same ops written one after another: every step runs the kernel
//! its op runs. In a recording forward (training) the steps run as those ops, so the graph and
//! the gradients are theirs.

use std::borrow::Cow;

use ndarray::{Dimension, IxDyn};

use super::gemm::{self, Matrix};
use super::lanes::{lane_runs, Lane};
use super::unary::{unary, unary_in_place};
use super::{simd, Arg, Operand, TensorOps};
use crate::autograd::{self, Mode, Unary};
use crate::element::Element;
use crate::error::{or_panic, Error, Result};
use crate::scope::deeper;
use crate::tensor::Tensor;

/// Most steps an [`Epilogue`] holds.
const MAX_STEPS: usize = 8;

/// What a fused matrix product ([`Tensor::matmul_with`]) does to its output, step by step in the
/// order given, before writing it: the ops it stands for are named the same.
///
/// ```
/// use tensorscope_runtime::ops::Epilogue;
/// use tensorscope_runtime::{Param, Pool, TensorOps};
///
/// let pool = Pool::with_max_memory_mb(16);
/// let w = Param::from_slice(&pool, &[2, 2], &[1.0f32, 2.0, 3.0, 4.0]);
/// let b = Param::from_slice(&pool, &[2], &[0.5f32, -0.5]);
/// pool.scope(|s| {
///     let x = s.from_slice::<f32>(&[1, 2], &[1.0, 1.0]);
///     // gelu(x w + b), with the bias and the activation applied in the product's last pass.
///     let fused = x.matmul_with(&w, Epilogue::new().add(&b).gelu());
///     let unfused = (x.matmul(&w) + &b).gelu();
///     assert_eq!(fused.to_vec(), unfused.to_vec());
///     // layer_norm(x w + b + x): a bias, a residual and a normalization of each row.
///     let y = x.matmul_with(&w, Epilogue::new().add(&b).add(&x).layer_norm(1e-5));
///     assert_eq!(y.to_vec(), (x.matmul(&w) + &b + &x).layer_norm(1e-5).to_vec());
/// });
/// ```
pub struct Epilogue<'a, 's, T: Element = f32> {
    steps: [Option<Step<'a, 's, T>>; MAX_STEPS],
    /// Steps asked for, also past [`MAX_STEPS`] (an error when used).
    len: usize,
}

/// One step of an [`Epilogue`].
#[derive(Clone, Copy)]
enum Step<'a, 's, T: Element> {
    Add(&'a dyn Operand<'s, T>),
    Unary(Unary),
    /// A lane op over the last axis.
    Lane(Lane<T>),
}

impl<T: Element> Default for Epilogue<'_, '_, T> {
    fn default() -> Self {
        Epilogue {
            steps: [None; MAX_STEPS],
            len: 0,
        }
    }
}

macro_rules! activations {
    ($($(#[$doc:meta])* $name:ident $kind:ident;)*) => {$(
        $(#[$doc])*
        #[must_use]
        pub fn $name(self) -> Self {
            self.then(Step::Unary(Unary::$kind))
        }
    )*};
}

impl<'a, 's, T: Element> Epilogue<'a, 's, T> {
    /// No steps: the plain product.
    pub fn new() -> Self {
        Self::default()
    }

    fn then(mut self, step: Step<'a, 's, T>) -> Self {
        if let Some(slot) = self.steps.get_mut(self.len) {
            *slot = Some(step);
        }
        self.len += 1;
        self
    }

    /// `+ other`, broadcast as `+` does. A row of the output's width (a bias) or a tensor of the
    /// output's shape (a residual) is added in the product's pass; another shape runs as `+`
    /// after it.
    #[must_use]
    #[allow(clippy::should_implement_trait)] // named for the op it stands for, as `Tensor::try_add`
    pub fn add(self, other: &'a impl Operand<'s, T>) -> Self {
        self.then(Step::Add(other))
    }

    activations! {
        /// [`TensorOps::relu`](crate::TensorOps::relu).
        relu Relu;
        /// [`TensorOps::gelu`](crate::TensorOps::gelu) (the tanh approximation).
        gelu Gelu;
        /// [`TensorOps::gelu_erf`](crate::TensorOps::gelu_erf) (exact).
        gelu_erf GeluErf;
        /// [`TensorOps::silu`](crate::TensorOps::silu).
        silu Silu;
        /// [`TensorOps::sigmoid`](crate::TensorOps::sigmoid).
        sigmoid Sigmoid;
        /// [`TensorOps::tanh`](crate::TensorOps::tanh).
        tanh Tanh;
    }

    /// [`TensorOps::layer_norm`](crate::TensorOps::layer_norm) over the last axis.
    #[must_use]
    pub fn layer_norm(self, eps: T) -> Self {
        self.then(Step::Lane(Lane::LayerNorm(eps)))
    }

    /// [`TensorOps::softmax`](crate::TensorOps::softmax) over the last axis.
    #[must_use]
    pub fn softmax(self) -> Self {
        self.then(Step::Lane(Lane::Softmax))
    }

    /// [`TensorOps::log_softmax`](crate::TensorOps::log_softmax) over the last axis.
    #[must_use]
    pub fn log_softmax(self) -> Self {
        self.then(Step::Lane(Lane::LogSoftmax))
    }

    /// [`TensorOps::rms_norm`](crate::TensorOps::rms_norm) over the last axis.
    #[must_use]
    pub fn rms_norm(self, eps: T) -> Self {
        self.then(Step::Lane(Lane::RmsNorm(eps)))
    }

    fn steps(&self) -> impl Iterator<Item = Step<'a, 's, T>> + '_ {
        self.steps.iter().flatten().copied()
    }
}

/// A step as the product's pass runs it: an add reads the rows of a tensor of the output's shape
/// where they lie, or one row repeated over every row of the output.
#[derive(Clone, Copy)]
enum Pass<'b, T> {
    AddWhole(&'b [T]),
    AddRow(&'b [T]),
    Unary(Unary),
    Lane(Lane<T>),
}

impl<'s, T: Element> Tensor<'s, T> {
    /// The matrix product with `other` ([`Tensor::try_matmul`]), then each step of `epilogue` in
    /// order, applied to each block of the product's rows as soon as the block is computed (while
    /// it is in cache) instead of in a pass of its own: `x.matmul_with(&w, Epilogue::new().add(&b)
    /// .gelu())` is `(x.matmul(&w) + &b).gelu()` in one pass over the output, with the same bits.
    ///
    /// The pass is fused for a product of one right matrix (`[.., m, k] x [k, n]`) of `f32` or
    /// `f64`, adds of a row of the output's width or of the output's shape; anything else, and
    /// every recording forward (training), runs the same ops one after another.
    ///
    /// Fails as the ops it stands for do (shapes, budget), and with [`Error::InvalidArgument`] for
    /// more than 8 steps.
    pub fn try_matmul_with(
        &self,
        other: &impl Operand<'s, T>,
        epilogue: Epilogue<'_, 's, T>,
    ) -> Result<Tensor<'s, T>> {
        if epilogue.len > MAX_STEPS {
            return Err(Error::InvalidArgument {
                op: "matmul_with",
                arg: "epilogue",
                reason: format!("{} steps, at most {MAX_STEPS} are supported", epilogue.len),
            });
        }
        let other = other.bind_beside(self);
        if let Some(out) = self.fused(&other, &epilogue)? {
            return Ok(out);
        }
        let mut y = self.try_matmul(&*other)?;
        for step in epilogue.steps() {
            y = match step {
                Step::Add(operand) => {
                    let operand = operand.bind_beside(&y);
                    y.try_add(&*operand)?
                }
                Step::Unary(kind) => unary(Arg::Owned(y), kind)?,
                Step::Lane(Lane::LayerNorm(eps)) => TensorOps::try_layer_norm(y, eps)?,
                Step::Lane(Lane::RmsNorm(eps)) => TensorOps::try_rms_norm(y, eps)?,
                Step::Lane(Lane::Softmax) => TensorOps::try_softmax(y, -1)?,
                Step::Lane(Lane::LogSoftmax) => TensorOps::try_log_softmax(y, -1)?,
            };
        }
        Ok(y)
    }

    /// The fused product, or `None` where the ops must run one after another.
    fn fused(
        &self,
        other: &Tensor<'s, T>,
        epilogue: &Epilogue<'_, 's, T>,
    ) -> Result<Option<Tensor<'s, T>>> {
        let recording = autograd::mode() != Mode::Off;
        let (Some((&k, lead)), &[k2, n]) = (
            self.shape()
                .split_last()
                .filter(|(_, lead)| !lead.is_empty()),
            other.shape(),
        ) else {
            return Ok(None);
        };
        if !T::GEMM || k != k2 || (recording && (self.node.is_some() || other.node.is_some())) {
            return Ok(None);
        }
        let mut shape = IxDyn(self.shape());
        shape.slice_mut()[lead.len()] = n;
        let shape = shape.slice();
        // The adds' operands, bound (and so kept alive) for the pass to read.
        let mut operands: [Option<Cow<'_, Tensor<'s, T>>>; MAX_STEPS] = Default::default();
        for (slot, step) in operands.iter_mut().zip(epilogue.steps()) {
            if let Step::Add(operand) = step {
                let operand = operand.bind_beside(self);
                let fits = operand.shape() == shape
                    || (operand.len() == n && operand.shape().last() == Some(&n));
                if !fits || (recording && operand.node.is_some()) {
                    return Ok(None);
                }
                *slot = Some(operand);
            }
        }
        let scope = operands
            .iter()
            .flatten()
            .fold(deeper(&self.scope, &other.scope), |s, t| {
                deeper(s, &t.scope)
            })
            .clone();
        let mut pass = [None; MAX_STEPS];
        for ((slot, step), operand) in pass.iter_mut().zip(epilogue.steps()).zip(&operands) {
            *slot = Some(match (step, operand) {
                (_, Some(t)) if t.shape() == shape => Pass::AddWhole(t.as_slice()),
                (_, Some(t)) => Pass::AddRow(t.as_slice()),
                (Step::Unary(kind), None) => Pass::Unary(kind),
                (Step::Lane(kind), None) => Pass::Lane(kind),
                (Step::Add(_), None) => unreachable!("every add is bound"),
            });
        }
        let mut out = Tensor::try_rent_in(&scope, shape)?;
        if out.is_empty() {
            return Ok(Some(out));
        }
        let rows = out.len() / n;
        let then = |first: usize, block: &mut [T]| {
            for step in pass.iter().flatten() {
                match *step {
                    Pass::AddWhole(t) => {
                        simd::zip_in_place(block, &t[first * n..][..block.len()], add)
                    }
                    Pass::AddRow(t) => simd::zip_in_place(block, t, add),
                    Pass::Unary(kind) => unary_in_place(kind, block),
                    Pass::Lane(kind) => lane_runs(kind, block, n),
                }
            }
        };
        let (a, b) = (
            Matrix::row_major(self.as_slice(), rows, k),
            Matrix::row_major(other.as_slice(), k, n),
        );
        gemm::product(a, b, out.unique_slice_mut(), Some(&then));
        Ok(Some(out))
    }

    /// The fused matrix product; see [`Tensor::try_matmul_with`].
    ///
    /// # Panics
    /// If the shapes do not fit or the budget is exhausted, with the error's message.
    #[track_caller]
    pub fn matmul_with(
        &self,
        other: &impl Operand<'s, T>,
        epilogue: Epilogue<'_, 's, T>,
    ) -> Tensor<'s, T> {
        or_panic(self.try_matmul_with(other, epilogue))
    }
}

/// `+` as the binary op computes it.
#[inline(always)]
fn add<T: Element>(a: T, b: T) -> T {
    a + b
}
