//! The backward rule of every op: what it saves in the forward, and the gradients of its inputs.
//!
//! Rules run with recording off, in the scope backward runs in (`at`): saved tensors and gradients
//! are rebound there, so every temporary and every gradient is rented there.

use ndarray::{Axis, Dimension, IxDyn, Slice, Zip};

use super::PerInput;
use crate::checkpoint::Region;
use crate::element::{DType, Element};
use crate::error::{Error, Result};
use crate::ops::{self, Lane, Lanes};
use crate::scope::State;
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
    Log,
    Sqrt,
    Abs,
    GeluErf,
    Erf,
}

impl Unary {
    /// Whether the rule needs the op's output (`true`) or its input (`false`); `Neg` needs neither.
    pub(crate) fn saves_output(self) -> bool {
        matches!(
            self,
            Unary::Relu | Unary::Sigmoid | Unary::Tanh | Unary::Exp | Unary::Sqrt
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
    /// `x ^ c`: its rule needs `x`.
    Pow,
}

impl Scalar {
    /// Whether the rule needs the op's input.
    pub(crate) fn saves_input(self) -> bool {
        matches!(self, Scalar::DivInto | Scalar::Pow)
    }
}

/// A user's elementwise function or its derivative ([`crate::TensorOps::map_with_derivative`]);
/// `Sync`, since an elementwise loop may run on several threads.
pub(crate) type Function<T> = std::sync::Arc<dyn Fn(T) -> T + Send + Sync>;

/// A backward rule and what it saved.
pub(crate) enum Rule<T: DType> {
    /// `a + b` with broadcasting: the inputs' shapes, to reduce the gradient to.
    Add(IxDyn, IxDyn),
    /// `a - b` with broadcasting.
    Sub(IxDyn, IxDyn),
    /// `a * b` with broadcasting.
    Mul(Saved<T>, Saved<T>),
    /// `a / b` with broadcasting.
    Div(Saved<T>, Saved<T>),
    /// A scalar op; `DivInto` keeps `x`.
    Scalar(Scalar, T, Option<Saved<T>>),
    /// An elementwise function; the saved tensor is its input or its output (see
    /// [`Unary::saves_output`]).
    Unary(Unary, Option<Saved<T>>),
    /// `clamp(min, max)`: the input and the bounds.
    Clamp(Saved<T>, T, T),
    /// `map_with_derivative`: the input, the function (for a replay) and the derivative.
    Map(Saved<T>, Function<T>, Function<T>),
    /// An op without a derivative: backward through it fails, naming it.
    NotDifferentiable(&'static str),
    /// Softmax along an axis, from its output.
    Softmax(Saved<T>, usize),
    /// Log-softmax along an axis, from its output.
    LogSoftmax(Saved<T>, usize),
    /// Layer norm over the last axis: input, output, eps.
    LayerNorm(Saved<T>, Saved<T>, T),
    /// RMS norm over the last axis: input, eps.
    RmsNorm(Saved<T>, T),
    /// Group norm of `[n, c, h, w]`: input, output, groups, eps.
    GroupNorm(Saved<T>, Saved<T>, usize, T),
    /// Sum along an axis of a tensor of this shape.
    Sum(usize, IxDyn),
    /// Mean along an axis of a tensor of this shape.
    Mean(usize, IxDyn),
    /// Matrix product.
    Matmul(Saved<T>, Saved<T>),
    /// A permutation of the axes: axis `i` of the output is axis `axes[i]` of the input.
    Permute(IxDyn),
    /// `narrow(axis, start, _)` of a tensor whose axis had this length.
    Narrow(usize, usize, usize),
    /// A reshape of a tensor of this shape.
    Reshape(IxDyn),
    /// Concatenation along an axis, of inputs of these lengths along it.
    Concat(usize, IxDyn),
    /// 2-D convolution: input, weight, stride, padding.
    Conv2d(Saved<T>, Saved<T>, usize, usize),
    /// Nearest upsampling by a scale.
    Upsample(usize),
    /// Mean squared error: `pred - target` and the element count.
    Mse(Saved<T>, usize),
    /// Softmax cross-entropy: the log-probabilities and the labels (checked to be in range).
    CrossEntropy(Saved<T>, Saved<i64>),
    /// `index_select` along an axis of this length, by these ids.
    IndexSelect(usize, Saved<i64>, usize),
    /// `gather` along an axis, by this index, of an input of this shape.
    Gather(usize, Saved<i64>, IxDyn),
    /// `tril` (`false`) or `triu` (`true`) with this diagonal offset.
    Triangle(i64, bool),
    /// `where_cond` with this mask, of operands of these shapes.
    Where(Saved<u8>, IxDyn, IxDyn),
    /// `masked_fill` with this mask and value.
    MaskedFill(Saved<u8>, T),
    /// 2-D pooling: the max's positions (for max pooling) and the input's shape.
    Pool2d {
        kind: ops::Pooling,
        kernel: usize,
        stride: usize,
        at: Option<Saved<i64>>,
        input: [usize; 4],
    },
    /// A checkpointed region: its backward replays the region's layer steps (held in place, as
    /// large as the largest other rule, so that no box is allocated for it).
    Region(Region<T>),
}

impl<T: DType> Rule<T> {
    /// Moves the accounting of everything the rule saved to `target` (see
    /// `Tensor::move_accounting`): its tensors of `T`, and the ids, masks and positions it keeps.
    pub(crate) fn move_saved(&self, target: &State) {
        let f = &mut |t: &Saved<T>| t.move_accounting(target);
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
            Rule::Region(region) => region.move_saved(target),
            Rule::Scalar(_, _, Some(x))
            | Rule::Unary(_, Some(x))
            | Rule::Map(x, ..)
            | Rule::Clamp(x, ..)
            | Rule::RmsNorm(x, _)
            | Rule::Softmax(x, _)
            | Rule::LogSoftmax(x, _)
            | Rule::Mse(x, _) => f(x),
            Rule::Add(..)
            | Rule::Sub(..)
            | Rule::Scalar(_, _, None)
            | Rule::Unary(_, None)
            | Rule::NotDifferentiable(_)
            | Rule::Sum(..)
            | Rule::Mean(..)
            | Rule::Permute(_)
            | Rule::Narrow(..)
            | Rule::Reshape(_)
            | Rule::Concat(..)
            | Rule::Upsample(_)
            | Rule::Triangle(..)
            | Rule::Pool2d { at: None, .. } => {}
            Rule::CrossEntropy(x, labels) => {
                f(x);
                labels.move_accounting(target);
            }
            Rule::IndexSelect(_, ids, _) | Rule::Gather(_, ids, _) => ids.move_accounting(target),
            Rule::Pool2d { at: Some(at), .. } => at.move_accounting(target),
            Rule::Where(mask, ..) | Rule::MaskedFill(mask, _) => mask.move_accounting(target),
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
        at: &State,
    ) -> Result<PerInput<Saved<T>>> {
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
            Rule::Add(a, b) => PerInput::Two([
                grad_if(0, &|| reduce_to(g.clone(), a.slice()))?,
                grad_if(1, &|| reduce_to(g.clone(), b.slice()))?,
            ]),
            Rule::Sub(a, b) => PerInput::Two([
                grad_if(0, &|| reduce_to(g.clone(), a.slice()))?,
                grad_if(1, &|| {
                    reduce_to(
                        (&g).try_map(
                            #[inline(always)]
                            |v| -v,
                        )?,
                        b.slice(),
                    )
                })?,
            ]),
            Rule::Mul(a, b) => {
                let (a, b) = (here(&a), here(&b));
                PerInput::Two([
                    grad_if(0, &|| reduce_to(g.try_mul(&b)?, a.shape()))?,
                    grad_if(1, &|| reduce_to(g.try_mul(&a)?, b.shape()))?,
                ])
            }
            Rule::Div(a, b) => {
                let (a, b) = (here(&a), here(&b));
                PerInput::Two([
                    grad_if(0, &|| reduce_to(g.try_div(&b)?, a.shape()))?,
                    grad_if(1, &|| {
                        // d(a / b)/db = -a / b^2
                        let q = g.try_mul(&a)?.try_div(&b)?.try_div(&b)?;
                        reduce_to(
                            q.try_map(
                                #[inline(always)]
                                |v| -v,
                            )?,
                            b.shape(),
                        )
                    })?,
                ])
            }
            Rule::Scalar(kind, c, x) => PerInput::Two([
                Some(match kind {
                    Scalar::Add | Scalar::Sub => g,
                    Scalar::SubFrom => g.try_map(
                        #[inline(always)]
                        |v| -v,
                    )?,
                    Scalar::Mul => g.try_map(
                        #[inline(always)]
                        |v| v * c,
                    )?,
                    Scalar::Div => g.try_map(
                        #[inline(always)]
                        |v| v / c,
                    )?,
                    Scalar::DivInto => {
                        let x = here(x.as_ref().expect("c / x saves x"));
                        g.try_zip_map(
                            &x,
                            #[inline(always)]
                            |g, x| -g * c / (x * x),
                        )?
                    }
                    // `x^0` is constant: its gradient is 0, also at x = 0 (where `0 * 0^-1` is NaN).
                    Scalar::Pow if c == T::zero() => g.try_map(
                        #[inline(always)]
                        |_| T::zero(),
                    )?,
                    Scalar::Pow => {
                        let x = here(x.as_ref().expect("x ^ c saves x"));
                        g.try_zip_map(
                            &x,
                            #[inline(always)]
                            |g, x| g * c * x.powf(c - T::one()),
                        )?
                    }
                }),
                None,
            ]),
            Rule::Unary(kind, saved) => {
                let saved = saved.as_ref().map(here);
                PerInput::Two([Some(ops::unary_backward(kind, g, saved.as_ref())?), None])
            }
            Rule::Clamp(x, min, max) => {
                PerInput::Two([Some(ops::clamp_backward(g, &here(&x), min, max)?), None])
            }
            Rule::Map(x, _, df) => PerInput::Two([
                Some(g.try_zip_map(
                    &here(&x),
                    #[inline(always)]
                    |g, x| g * df(x),
                )?),
                None,
            ]),
            Rule::Region(_) => {
                unreachable!("the engine runs a region's backward with the gradients")
            }
            Rule::IndexSelect(axis, ids, len) => {
                let mut shape = IxDyn(g.shape());
                shape[axis] = len;
                let mut dx = Tensor::try_rent_zeroed_in(&g.rents_in, shape.slice())?;
                if !g.is_empty() {
                    let (src, mut dst) = (g.view(), dx.unique_view_mut());
                    for (j, &id) in ids.as_slice().iter().enumerate() {
                        Zip::from(dst.index_axis_mut(Axis(axis), id as usize))
                            .and(src.index_axis(Axis(axis), j))
                            .for_each(|d, &g| *d = *d + g);
                    }
                }
                PerInput::Two([Some(dx), None])
            }
            Rule::Gather(axis, index, shape) => {
                let mut dx = Tensor::try_rent_zeroed_in(&g.rents_in, shape.slice())?;
                if !g.is_empty() {
                    let (src, idx) = (g.view(), index.view());
                    let mut dst = dx.unique_view_mut();
                    let mut dst = dst.slice_each_axis_mut(ops::cut_to(index.shape(), axis));
                    Zip::from(dst.lanes_mut(Axis(axis)))
                        .and(idx.lanes(Axis(axis)))
                        .and(src.lanes(Axis(axis)))
                        .for_each(|mut d, i, g| {
                            i.iter().zip(g).for_each(|(&i, &g)| {
                                let d = &mut d[i as usize];
                                *d = *d + g;
                            })
                        });
                }
                PerInput::Two([Some(dx), None])
            }
            Rule::Triangle(k, upper) => PerInput::Two([Some(g.triangle(k, upper)?), None]),
            Rule::Where(mask, a, b) => PerInput::Two([
                grad_if(0, &|| {
                    reduce_to(ops::mask::select_grad(&g, &mask, true)?, a.slice())
                })?,
                grad_if(1, &|| {
                    reduce_to(ops::mask::select_grad(&g, &mask, false)?, b.slice())
                })?,
            ]),
            Rule::MaskedFill(mask, _) => {
                PerInput::Two([Some(ops::mask::select_grad(&g, &mask, false)?), None])
            }
            Rule::Pool2d {
                kind,
                kernel,
                stride,
                at: positions,
                input,
            } => PerInput::Two([
                Some(ops::pool2d_backward(
                    &g,
                    kind,
                    kernel,
                    stride,
                    positions.as_ref(),
                    input,
                )?),
                None,
            ]),
            Rule::NotDifferentiable(op) => return Err(Error::NotDifferentiable { op }),
            Rule::Softmax(y, axis) => {
                let (y, lanes) = (here(&y), Lanes::along(y.shape(), axis));
                PerInput::Two([
                    Some(ops::lane_backward(Lane::Softmax, g, &y, None, lanes)?),
                    None,
                ])
            }
            Rule::LogSoftmax(y, axis) => {
                let (y, lanes) = (here(&y), Lanes::along(y.shape(), axis));
                PerInput::Two([
                    Some(ops::lane_backward(Lane::LogSoftmax, g, &y, None, lanes)?),
                    None,
                ])
            }
            Rule::LayerNorm(x, y, eps) => {
                let (x, y, lanes) = (here(&x), here(&y), Lanes::last(x.shape()));
                let kind = Lane::LayerNorm(eps);
                PerInput::Two([
                    Some(ops::lane_backward(kind, g, &x, Some(&y), lanes)?),
                    None,
                ])
            }
            Rule::RmsNorm(x, eps) => {
                let (x, lanes) = (here(&x), Lanes::last(x.shape()));
                PerInput::Two([
                    Some(ops::lane_backward(Lane::RmsNorm(eps), g, &x, None, lanes)?),
                    None,
                ])
            }
            Rule::GroupNorm(x, y, groups, eps) => {
                let (x, y) = (here(&x), here(&y));
                // A group's channels and pixels are a contiguous run of `[n, c, h, w]`.
                let lanes = Lanes::runs(x.len() / (x.shape()[0] * groups).max(1));
                let kind = Lane::LayerNorm(eps);
                PerInput::Two([
                    Some(ops::lane_backward(kind, g, &x, Some(&y), lanes)?),
                    None,
                ])
            }
            Rule::Sum(axis, shape) => PerInput::Two([Some(expand(g, axis, shape.slice())?), None]),
            Rule::Mean(axis, shape) => {
                let n = T::from_f64(shape[axis] as f64);
                PerInput::Two([
                    Some(expand(
                        g.try_map(
                            #[inline(always)]
                            |v| v / n,
                        )?,
                        axis,
                        shape.slice(),
                    )?),
                    None,
                ])
            }
            Rule::Matmul(a, b) => {
                let (a, b) = (here(&a), here(&b));
                let (k, n) = (a.shape()[a.ndim() - 1], g.shape()[g.ndim() - 1]);
                // One right matrix for every left one: the rows of every left matrix are the rows
                // of one `[rows, k]` matrix, and the products read the transposes where they lie.
                let one_matrix = b.shape()[..b.ndim() - 2].iter().all(|&l| l == 1);
                let rows = a.shape()[..a.ndim() - 1].iter().product();
                let matrix = |t: &Saved<T>, cols| t.try_reshape(&[rows, cols]);
                PerInput::Two([
                    grad_if(0, &|| {
                        if one_matrix {
                            let b2 = b.try_reshape(&[k, n])?;
                            ops::matmul_transposed((&matrix(&g, n)?, false), (&b2, true))?
                                .try_reshape(a.shape())
                        } else {
                            reduce_to(g.try_matmul(&b.try_t()?)?, a.shape())
                        }
                    })?,
                    grad_if(1, &|| {
                        if one_matrix {
                            // The batch sums in the one product.
                            ops::matmul_transposed(
                                (&matrix(&a, k)?, true),
                                (&matrix(&g, n)?, false),
                            )?
                            .try_reshape(b.shape())
                        } else {
                            reduce_to(a.try_t()?.try_matmul(&g)?, b.shape())
                        }
                    })?,
                ])
            }
            Rule::Permute(axes) => {
                let mut inverse = axes.clone();
                for (i, &a) in axes.slice().iter().enumerate() {
                    inverse[a] = i;
                }
                PerInput::Two([Some(g.try_permute(inverse.slice())?), None])
            }
            Rule::Narrow(axis, start, full) => {
                let mut shape = IxDyn(g.shape());
                let len = std::mem::replace(&mut shape[axis], full);
                let mut dx = Tensor::try_rent_zeroed_in(&g.rents_in, shape.slice())?;
                if !g.is_empty() {
                    dx.unique_view_mut()
                        .slice_axis_mut(Axis(axis), Slice::from(start..start + len))
                        .assign(&g.view());
                }
                PerInput::Two([Some(dx), None])
            }
            Rule::Reshape(shape) => PerInput::Two([Some(g.try_reshape(shape.slice())?), None]),
            Rule::Concat(axis, lengths) => {
                let mut start = 0;
                let parts = lengths.slice().iter().enumerate().map(|(i, &len)| {
                    start += len;
                    grad_if(i, &|| g.narrow_kernel(axis, start - len, len))
                });
                parts.collect::<Result<_>>()?
            }
            Rule::Conv2d(x, w, stride, padding) => {
                let (x, w) = (here(&x), here(&w));
                let (dx, dw) = ops::conv2d_backward(&x, &w, &g, stride, padding, need(0), need(1))?;
                PerInput::Two([dx, dw])
            }
            Rule::Upsample(scale) => {
                PerInput::Two([Some(ops::upsample_backward(&g, scale)?), None])
            }
            Rule::Mse(diff, n) => {
                // As `nn::mse` has always scaled: 2 / n, times the upstream gradient (1 for a loss).
                let scale = T::from_f64(2.0) / T::from_f64(n.max(1) as f64) * g.as_slice()[0];
                let dp = here(&diff).try_map(
                    #[inline(always)]
                    |d| d * scale,
                )?;
                let dt = grad_if(1, &|| {
                    (&dp).try_map(
                        #[inline(always)]
                        |v| -v,
                    )
                })?;
                PerInput::Two([need(0).then_some(dp), dt])
            }
            Rule::CrossEntropy(log_probs, labels) => {
                let upstream = g.as_slice()[0];
                let n = T::from_f64(labels.len().max(1) as f64);
                let mut grad = here(&log_probs).try_map(
                    #[inline(always)]
                    |lp| lp.exp_kernel() / n,
                )?;
                let classes = grad.shape().get(1).copied().unwrap_or(1);
                let rows = grad.unique_slice_mut();
                for (row, &label) in labels.as_slice().iter().enumerate() {
                    let v = &mut rows[row * classes + label as usize];
                    *v = *v - T::one() / n;
                }
                PerInput::Two([
                    Some(grad.try_map(
                        #[inline(always)]
                        |v| v * upstream,
                    )?),
                    None,
                ])
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
        let mut flat = IxDyn::zeros(1 + shape.len());
        flat[0] = g.shape()[..lead].iter().product();
        flat.slice_mut()[1..].copy_from_slice(&g.shape()[lead..]);
        g = g.try_reshape(flat.slice())?.try_sum(0)?;
    }
    for (axis, &len) in shape.iter().enumerate() {
        if len == 1 && g.shape()[axis] != 1 {
            let mut kept = IxDyn(g.shape());
            kept[axis] = 1;
            g = g.try_sum(axis)?.try_reshape(kept.slice())?;
        }
    }
    Ok(g)
}

/// `g` (a reduction's gradient, `shape` without `axis`) repeated along `axis` to `shape`.
fn expand<T: Element>(g: Saved<T>, axis: usize, shape: &[usize]) -> Result<Saved<T>> {
    let mut kept = IxDyn(shape);
    kept[axis] = 1;
    g.try_reshape(kept.slice())?.try_broadcast_to(shape)
}
