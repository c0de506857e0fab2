//! The backward rule of every op: what it saves in the forward, and the gradients of its inputs.
//!
//! Rules run with recording off, in the scope backward runs in (`at`): saved tensors and gradients
//! are rebound there, so every temporary and every gradient is rented there.

use std::rc::Rc;

use ndarray::{ArrayView1, ArrayViewMut1, Axis, Zip};

use super::Gradients;
use crate::element::{DType, Element};
use crate::error::{Error, Result};
use crate::ops;
use crate::scope::ScopeState;
use crate::tensor::Tensor;
use crate::TensorOps;

/// A saved tensor: an alias without a graph, branded for nothing (only rules hold it).
pub(crate) type Saved<T> = Tensor<'static, T>;

/// Elementwise functions with a derivative.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unary {
    Relu,
    Gelu,
    Silu,
    Sigmoid,
    Tanh,
    Exp,
    Neg,
}

impl Unary {
    /// Whether the rule needs the op's output (`true`) or its input (`false`); `Neg` needs neither.
    pub(crate) fn saves_output(self) -> bool {
        matches!(
            self,
            Unary::Relu | Unary::Sigmoid | Unary::Tanh | Unary::Exp
        )
    }
}

/// Ops between a tensor and a scalar `c`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scalar {
    /// `x + c` (and `c + x`).
    Add,
    /// `x - c`.
    Sub,
    /// `c - x`.
    SubFrom,
    /// `x * c` (and `c * x`).
    Mul,
    /// `x / c`.
    Div,
    /// `c / x`: its rule needs `x`.
    DivInto,
}

/// A backward rule and what it saved.
pub(crate) enum Rule<T: DType> {
    /// `a + b` with broadcasting: the inputs' shapes, to reduce the gradient to.
    Add(Vec<usize>, Vec<usize>),
    /// `a - b` with broadcasting.
    Sub(Vec<usize>, Vec<usize>),
    /// `a * b` with broadcasting.
    Mul(Saved<T>, Saved<T>),
    /// `a / b` with broadcasting.
    Div(Saved<T>, Saved<T>),
    /// A scalar op; `DivInto` keeps `x`.
    Scalar(Scalar, T, Option<Saved<T>>),
    /// An elementwise function; the saved tensor is its input or its output (see
    /// [`Unary::saves_output`]).
    Unary(Unary, Option<Saved<T>>),
    /// `map_with_derivative`: the input, the function (for a replay) and the derivative.
    Map(Saved<T>, Rc<dyn Fn(T) -> T>, Rc<dyn Fn(T) -> T>),
    /// An op without a derivative: backward through it fails, naming it.
    NotDifferentiable(&'static str),
    /// Softmax along an axis, from its output.
    Softmax(Saved<T>, usize),
    /// Log-softmax along an axis, from its output.
    LogSoftmax(Saved<T>, usize),
    /// Layer norm over the last axis: input, output, eps.
    LayerNorm(Saved<T>, Saved<T>, T),
    /// Group norm of `[n, c, h, w]`: input, output, groups, eps.
    GroupNorm(Saved<T>, Saved<T>, usize, T),
    /// Sum along an axis of a tensor of this shape.
    Sum(usize, Vec<usize>),
    /// Mean along an axis of a tensor of this shape.
    Mean(usize, Vec<usize>),
    /// Matrix product.
    Matmul(Saved<T>, Saved<T>),
    /// Transpose of the last two axes.
    Transpose,
    /// A reshape of a tensor of this shape.
    Reshape(Vec<usize>),
    /// Concatenation along an axis, of inputs of these lengths along it.
    Concat(usize, Vec<usize>),
    /// 2-D convolution: input, weight, stride, padding.
    Conv2d(Saved<T>, Saved<T>, usize, usize),
    /// Nearest upsampling by a scale.
    Upsample(usize),
    /// Mean squared error: `pred - target` and the element count.
    Mse(Saved<T>, usize),
    /// Softmax cross-entropy: the log-probabilities and the labels.
    CrossEntropy(Saved<T>, Vec<usize>),
    /// A checkpointed region: its backward replays the region's layer steps.
    Region(Box<dyn RegionRule<T>>),
}

/// The backward of a checkpointed region (see `checkpoint::region`): it runs nested backward
/// passes, so it adds the gradients of the parameters it reaches into `grads` itself.
pub(crate) trait RegionRule<T: DType> {
    /// The gradients of the region's graph inputs given `g`, the gradient of its output.
    fn backward(
        self: Box<Self>,
        g: Saved<T>,
        needs: &[bool],
        at: &Rc<ScopeState>,
        grads: &mut Gradients<'_, T>,
    ) -> Result<Vec<Option<Saved<T>>>>;

    /// Calls `f` on every tensor the region keeps (for moving their accounting on escape).
    fn for_each_saved(&self, f: &mut dyn FnMut(&Saved<T>));

    /// Fails as the region's backward would, before any backward runs: with
    /// [`Error::NotDifferentiable`] for an op without a derivative its output depends on, and as
    /// [`Gradients::check_sources`] does for the parameters its steps read.
    fn check(&self, grads: &Gradients<'_, T>) -> Result<()>;
}

impl<T: DType> Rule<T> {
    /// Calls `f` on every saved tensor (for moving their accounting on escape).
    pub(crate) fn for_each_saved(&self, f: &mut dyn FnMut(&Saved<T>)) {
        match self {
            Rule::Mul(a, b)
            | Rule::Div(a, b)
            | Rule::Matmul(a, b)
            | Rule::LayerNorm(a, b, _)
            | Rule::GroupNorm(a, b, ..)
            | Rule::Conv2d(a, b, ..) => {
                f(a);
                f(b);
            }
            Rule::Region(region) => region.for_each_saved(f),
            Rule::Scalar(_, _, Some(x))
            | Rule::Unary(_, Some(x))
            | Rule::Map(x, ..)
            | Rule::Softmax(x, _)
            | Rule::LogSoftmax(x, _)
            | Rule::Mse(x, _)
            | Rule::CrossEntropy(x, _) => f(x),
            Rule::Add(..)
            | Rule::Sub(..)
            | Rule::Scalar(_, _, None)
            | Rule::Unary(_, None)
            | Rule::NotDifferentiable(_)
            | Rule::Sum(..)
            | Rule::Mean(..)
            | Rule::Transpose
            | Rule::Reshape(_)
            | Rule::Concat(..)
            | Rule::Upsample(_) => {}
        }
    }
}

impl<T: Element> Rule<T> {
    /// The gradients of the op's inputs given `g`, the gradient of its output (a tensor of `at`):
    /// one per input, `None` where `needs` says the input needs none.
    pub(crate) fn backward(
        self,
        g: Saved<T>,
        needs: &[bool],
        at: &Rc<ScopeState>,
    ) -> Result<Vec<Option<Saved<T>>>> {
        let here = |t: &Saved<T>| -> Saved<T> { t.alias_in(at) };
        let need = |i: usize| needs.get(i).copied().unwrap_or(false);
        // The gradient of input `i`, computed only if it is needed.
        let grad_if = |i: usize, f: &dyn Fn() -> Result<Saved<T>>| -> Result<Option<Saved<T>>> {
            if need(i) {
                f().map(Some)
            } else {
                Ok(None)
            }
        };
        Ok(match self {
            Rule::Add(a, b) => vec![
                grad_if(0, &|| reduce_to(g.clone(), &a))?,
                grad_if(1, &|| reduce_to(g.clone(), &b))?,
            ],
            Rule::Sub(a, b) => vec![
                grad_if(0, &|| reduce_to(g.clone(), &a))?,
                grad_if(1, &|| reduce_to((&g).try_map(|v| -v)?, &b))?,
            ],
            Rule::Mul(a, b) => {
                let (a, b) = (here(&a), here(&b));
                vec![
                    grad_if(0, &|| reduce_to(g.try_mul(&b)?, a.shape()))?,
                    grad_if(1, &|| reduce_to(g.try_mul(&a)?, b.shape()))?,
                ]
            }
            Rule::Div(a, b) => {
                let (a, b) = (here(&a), here(&b));
                vec![
                    grad_if(0, &|| reduce_to(g.try_div(&b)?, a.shape()))?,
                    grad_if(1, &|| {
                        // d(a / b)/db = -a / b^2
                        let q = g.try_mul(&a)?.try_div(&b)?.try_div(&b)?;
                        reduce_to(q.try_map(|v| -v)?, b.shape())
                    })?,
                ]
            }
            Rule::Scalar(kind, c, x) => vec![Some(match kind {
                Scalar::Add | Scalar::Sub => g,
                Scalar::SubFrom => g.try_map(|v| -v)?,
                Scalar::Mul => g.try_map(|v| v * c)?,
                Scalar::Div => g.try_map(|v| v / c)?,
                Scalar::DivInto => {
                    let x = here(x.as_ref().expect("c / x saves x"));
                    g.try_zip_map(&x, |g, x| -g * c / (x * x))?
                }
            })],
            Rule::Unary(kind, saved) => {
                let saved = saved.as_ref().map(here);
                let s = || saved.as_ref().expect("the rule saved what it needs");
                vec![Some(match kind {
                    Unary::Neg => g.try_map(|v| -v)?,
                    // Written as the layers' hand-written backward passes are, for the same bits.
                    Unary::Relu => g.try_zip_map(s(), |g, y| {
                        g * if y > T::zero() { T::one() } else { T::zero() }
                    })?,
                    Unary::Gelu => g.try_zip_map(s(), |g, x| g * ops::gelu_grad(x))?,
                    Unary::Silu => g.try_zip_map(s(), |g, x| {
                        let sig = T::one() / (T::one() + (-x).exp());
                        g * sig * (T::one() + x * (T::one() - sig))
                    })?,
                    Unary::Sigmoid => g.try_zip_map(s(), |g, y| g * y * (T::one() - y))?,
                    Unary::Tanh => g.try_zip_map(s(), |g, y| g * (T::one() - y * y))?,
                    Unary::Exp => g.try_zip_map(s(), |g, y| g * y)?,
                })]
            }
            Rule::Map(x, _, df) => vec![Some(g.try_zip_map(&here(&x), |g, x| g * df(x))?)],
            Rule::Region(_) => {
                unreachable!("the engine runs a region's backward with the gradients")
            }
            Rule::NotDifferentiable(op) => return Err(Error::NotDifferentiable { op }),
            Rule::Softmax(y, axis) => vec![Some(lanes3(g, &here(&y), axis, softmax_lane)?)],
            Rule::LogSoftmax(y, axis) => vec![Some(lanes3(g, &here(&y), axis, log_softmax_lane)?)],
            Rule::LayerNorm(x, y, eps) => {
                let (x, y) = (here(&x), here(&y));
                let axis = x.ndim() - 1;
                let mut dx = g.try_into_unique()?;
                if !dx.is_empty() {
                    let (xv, yv) = (x.view(), y.view());
                    let mut out = dx.unique_view_mut();
                    Zip::from(out.lanes_mut(Axis(axis)))
                        .and(xv.lanes(Axis(axis)))
                        .and(yv.lanes(Axis(axis)))
                        .for_each(|d, x, y| ops::norm_backward_lane(d, x, y, eps));
                }
                vec![Some(dx)]
            }
            Rule::GroupNorm(x, y, groups, eps) => {
                let (x, y) = (here(&x), here(&y));
                let mut dx = g.try_into_unique()?;
                let chunk = x.len() / (x.shape()[0] * groups).max(1);
                if chunk > 0 {
                    let (xs, ys) = (x.as_slice(), y.as_slice());
                    dx.unique_slice_mut()
                        .chunks_exact_mut(chunk)
                        .zip(xs.chunks_exact(chunk).zip(ys.chunks_exact(chunk)))
                        .for_each(|(d, (x, y))| {
                            ops::norm_backward_lane(d.into(), x.into(), y.into(), eps)
                        });
                }
                vec![Some(dx)]
            }
            Rule::Sum(axis, shape) => vec![Some(expand(g, axis, &shape)?)],
            Rule::Mean(axis, shape) => {
                let n = T::from_f64(shape[axis] as f64);
                vec![Some(expand(g.try_map(|v| v / n)?, axis, &shape)?)]
            }
            Rule::Matmul(a, b) => {
                let (a, b) = (here(&a), here(&b));
                vec![
                    grad_if(0, &|| g.try_matmul(&b.try_transpose()?))?,
                    grad_if(1, &|| match (a.ndim(), b.ndim()) {
                        // One matrix for every batch entry: sum over the batch in one product.
                        (3, 2) => {
                            let rows = a.shape()[0] * a.shape()[1];
                            let a2 = a.try_reshape(&[rows, a.shape()[2]])?;
                            let g2 = g.try_reshape(&[rows, g.shape()[2]])?;
                            a2.try_transpose()?.try_matmul(&g2)
                        }
                        _ => a.try_transpose()?.try_matmul(&g),
                    })?,
                ]
            }
            Rule::Transpose => vec![Some(g.try_transpose()?)],
            Rule::Reshape(shape) => vec![Some(g.try_reshape(&shape)?)],
            Rule::Concat(axis, lengths) => {
                let mut start = 0;
                let mut out = Vec::with_capacity(lengths.len());
                for (i, &len) in lengths.iter().enumerate() {
                    out.push(grad_if(i, &|| g.try_narrow_copy(axis, start, len))?);
                    start += len;
                }
                out
            }
            Rule::Conv2d(x, w, stride, padding) => {
                let (x, w) = (here(&x), here(&w));
                let (dx, dw) = ops::conv2d_backward(&x, &w, &g, stride, padding, need(0), need(1))?;
                vec![dx, dw]
            }
            Rule::Upsample(scale) => vec![Some(ops::upsample_backward(&g, scale)?)],
            Rule::Mse(diff, n) => {
                // As `nn::mse` has always scaled: 2 / n, times the upstream gradient (1 for a loss).
                let scale = T::from_f64(2.0) / T::from_f64(n.max(1) as f64) * g.as_slice()[0];
                let dp = here(&diff).try_map(|d| d * scale)?;
                let dt = grad_if(1, &|| (&dp).try_map(|v| -v))?;
                vec![need(0).then_some(dp), dt]
            }
            Rule::CrossEntropy(log_probs, labels) => {
                let upstream = g.as_slice()[0];
                let n = T::from_f64(labels.len().max(1) as f64);
                let mut grad = here(&log_probs).try_map(|lp| lp.exp() / n)?;
                let classes = grad.shape().get(1).copied().unwrap_or(1);
                let rows = grad.unique_slice_mut();
                for (row, &label) in labels.iter().enumerate() {
                    let v = &mut rows[row * classes + label];
                    *v = *v - T::one() / n;
                }
                vec![Some(grad.try_map(|v| v * upstream)?)]
            }
        })
    }
}

/// `g` summed over the axes along which an input of `shape` was broadcast to `g`'s shape.
fn reduce_to<T: Element>(g: Saved<T>, shape: &[usize]) -> Result<Saved<T>> {
    if g.shape() == shape {
        return Ok(g);
    }
    let lead = g.ndim() - shape.len();
    let mut g = g;
    if lead > 0 {
        // The leading axes in one pass, as one axis of their product.
        let mut flat = vec![g.shape()[..lead].iter().product()];
        flat.extend_from_slice(&g.shape()[lead..]);
        g = g.try_reshape(&flat)?.try_sum(0)?;
    }
    for (axis, &len) in shape.iter().enumerate() {
        if len == 1 && g.shape()[axis] != 1 {
            let mut kept = g.shape().to_vec();
            kept[axis] = 1;
            g = g.try_sum(axis)?.try_reshape(&kept)?;
        }
    }
    Ok(g)
}

/// `g` (a reduction's gradient, `shape` without `axis`) repeated along `axis` to `shape`.
fn expand<T: Element>(g: Saved<T>, axis: usize, shape: &[usize]) -> Result<Saved<T>> {
    let mut kept = shape.to_vec();
    kept[axis] = 1;
    g.try_reshape(&kept)?.try_broadcast_to(shape)
}

/// A new tensor of `g`'s shape whose lanes along `axis` are `kernel(out, g, y)`.
fn lanes3<T: Element>(
    g: Saved<T>,
    y: &Saved<T>,
    axis: usize,
    kernel: fn(ArrayViewMut1<'_, T>, ArrayView1<'_, T>, ArrayView1<'_, T>),
) -> Result<Saved<T>> {
    let mut out = Tensor::try_rent_in(&g.scope, g.shape())?;
    if !out.is_empty() {
        let (gv, yv) = (g.view(), y.view());
        let mut ov = out.unique_view_mut();
        Zip::from(ov.lanes_mut(Axis(axis)))
            .and(gv.lanes(Axis(axis)))
            .and(yv.lanes(Axis(axis)))
            .for_each(kernel);
    }
    Ok(out)
}

/// Softmax's backward on a lane: `y (g - sum(g y))`.
fn softmax_lane<T: Element>(
    mut out: ArrayViewMut1<'_, T>,
    g: ArrayView1<'_, T>,
    y: ArrayView1<'_, T>,
) {
    let dot = Zip::from(&g)
        .and(&y)
        .fold(T::zero(), |acc, &g, &y| acc + g * y);
    Zip::from(&mut out)
        .and(&g)
        .and(&y)
        .for_each(|o, &g, &y| *o = y * (g - dot));
}

/// Log-softmax's backward on a lane: `g - exp(y) sum(g)`.
fn log_softmax_lane<T: Element>(
    mut out: ArrayViewMut1<'_, T>,
    g: ArrayView1<'_, T>,
    y: ArrayView1<'_, T>,
) {
    let total = g.sum();
    Zip::from(&mut out)
        .and(&g)
        .and(&y)
        .for_each(|o, &g, &y| *o = g - y.exp() * total);
}
