//! Lane ops: kernels over the 1-D runs ("lanes") of a tensor along one axis: softmax, log-softmax,
//! layer, group and RMS norm, and their backward passes.
//!
//! Every kernel works on plain slices, in place, and runs through [`simd::lanes`]: compiled for
//! the widest instruction set the CPU has and split over the worker threads when the tensor is
//! large. Lanes along the last axis are contiguous runs of the buffer; along another axis the
//! tensors are first transposed into pooled scratch buffers (and the result back), so that one
//! kernel serves every axis.
//!
//! A sum over a lane is kept as [`ACC`] partial sums, added in a fixed order at the end: written
//! so, the loop vectorises (a single running sum cannot be reordered), and every instruction set
//! adds the same numbers in the same order, so gives the same bits.

use super::{simd, work};
use crate::autograd::{self, args, Arg, Backward, Forward, Grads, Op, Saved};
use crate::element::Element;
use crate::error::Result;
use crate::tensor::Tensor;

/// The partial sums of a lane reduction: one AVX-512 register of `f32`.
const ACC: usize = 16;

/// `sum(f(a[i], b[i]))` over two slices of one length, as [`ACC`] partial sums added pairwise.
#[inline(always)]
pub(super) fn sum_with<T: Element>(a: &[T], b: &[T], f: impl Fn(T, T) -> T) -> T {
    let mut acc = [T::zero(); ACC];
    let (ca, cb) = (a.chunks_exact(ACC), b.chunks_exact(ACC));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (ca, cb) in ca.zip(cb) {
        for k in 0..ACC {
            acc[k] = acc[k] + f(ca[k], cb[k]);
        }
    }
    for (k, (&x, &y)) in ra.iter().zip(rb).enumerate() {
        acc[k] = acc[k] + f(x, y);
    }
    halves(acc)
}

/// The sum of `N` partial sums (`N` a power of two) in halves: `acc[k] + acc[k + N/2]`, and so on
/// down to one: the fixed order every lane sum and the few-rows products add in.
#[inline(always)]
pub(in crate::ops) fn halves<T: Element, const N: usize>(mut acc: [T; N]) -> T {
    let mut width = N;
    while width > 1 {
        width /= 2;
        for k in 0..width {
            acc[k] = acc[k] + acc[k + width];
        }
    }
    acc[0]
}

/// `sum(xs)`.
#[inline(always)]
pub(super) fn sum<T: Element>(xs: &[T]) -> T {
    sum_with(xs, xs, |x, _| x)
}

/// The largest element, NaNs skipped (`-inf` for a lane of NaNs), as [`ACC`] partial maxima.
#[inline(always)]
pub(super) fn max<T: Element>(xs: &[T]) -> T {
    let mut acc = [T::neg_infinity(); ACC];
    let chunks = xs.chunks_exact(ACC);
    let rest = chunks.remainder();
    for c in chunks {
        for k in 0..ACC {
            acc[k] = if c[k] > acc[k] { c[k] } else { acc[k] };
        }
    }
    for (k, &x) in rest.iter().enumerate() {
        acc[k] = if x > acc[k] { x } else { acc[k] };
    }
    acc.into_iter()
        .fold(T::neg_infinity(), |m, x| if x > m { x } else { m })
}

/// Softmax (or log-softmax) of a lane, in place, shifted by the lane's max so that `exp` cannot
/// overflow.
#[inline(always)]
fn softmax<T: Element>(lane: &mut [T], log: bool) {
    let max = max(lane);
    // A lane of all -inf has no finite max; shifting by 0 keeps the result NaN-free where possible.
    let shift = if max.is_finite() { max } else { T::zero() };
    if log {
        let log_sum = sum_with(lane, lane, |x, _| (x - shift).exp_kernel()).ln_kernel();
        for x in lane {
            *x = *x - shift - log_sum;
        }
    } else {
        // One `exp` per element: write it, then scale by the reciprocal of the sum.
        for x in lane.iter_mut() {
            *x = (*x - shift).exp_kernel();
        }
        let inv = sum(lane).recip();
        for x in lane {
            *x = *x * inv;
        }
    }
}

/// The statistics of a lane to normalize, the same in the forward and the backward pass: where
/// its mean lies, and `1 / sqrt(var + eps)` (biased variance, from the centred values).
#[derive(Clone, Copy)]
struct Stats<T> {
    /// The lane's first element: the values are centred in two steps, `(x - pivot) - shift`.
    pivot: T,
    /// The mean of `x - pivot`.
    shift: T,
    inv_std: T,
}

impl<T: Element> Stats<T> {
    /// The statistics of a lane (not empty).
    ///
    /// The mean is never rounded to `T` itself: that rounding alone may put it up to half a unit in
    /// the last place of the values from the true mean (0.002 at 33,333.3 in `f32`, so that a lane
    /// of equal values, whose answer is 0, normalized to about 0.99 with eps = 1e-5). Values close
    /// to the pivot subtract exactly, so the mean of the differences keeps the lane's small
    /// spread to `T`'s relative precision, and a lane of equal values gives 0 exactly (as PyTorch).
    #[inline(always)]
    fn of(lane: &[T], eps: T) -> Self {
        let n = T::from_f64(lane.len() as f64);
        let pivot = lane.first().copied().unwrap_or_else(T::zero);
        let shift = sum_with(lane, lane, |x, _| x - pivot) / n;
        let mut stats = Stats {
            pivot,
            shift,
            inv_std: T::zero(),
        };
        let var = sum_with(lane, lane, |x, _| {
            let d = stats.centred(x);
            d * d
        }) / n;
        stats.inv_std = (var + eps).sqrt().recip();
        stats
    }

    /// `x - mean`.
    #[inline(always)]
    fn centred(&self, x: T) -> T {
        (x - self.pivot) - self.shift
    }
}

/// Layer (or group) normalization of a lane, in place: `(x - mean) / sqrt(var + eps)`.
#[inline(always)]
fn layer_norm<T: Element>(lane: &mut [T], eps: T) {
    let stats = Stats::of(lane, eps);
    for x in lane {
        *x = stats.centred(*x) * stats.inv_std;
    }
}

/// `1 / sqrt(mean(x^2) + eps)` of a lane.
#[inline(always)]
fn inv_rms<T: Element>(lane: &[T], eps: T) -> T {
    let n = T::from_f64(lane.len() as f64);
    (sum_with(lane, lane, |x, _| x * x) / n + eps)
        .sqrt()
        .recip()
}

/// The backward pass of a normalization over one lane, in place: `d` holds the gradient of the
/// normalized values `xhat` on entry and the gradient of the input `x` on return,
/// `inv_std / n (n d - sum(d) - xhat sum(d xhat))`.
#[inline(always)]
fn norm_backward_lane<T: Element>(d: &mut [T], x: &[T], xhat: &[T], eps: T) {
    let n = T::from_f64(x.len() as f64);
    let inv_std = Stats::of(x, eps).inv_std;
    let sum_d = sum(d);
    let sum_dx = sum_with(d, xhat, |g, h| g * h);
    let scale = inv_std / n;
    for (g, &h) in d.iter_mut().zip(xhat) {
        *g = scale * (n * *g - sum_d - h * sum_dx);
    }
}

/// The kernels of the lane ops.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Lane<T> {
    /// Softmax.
    Softmax,
    /// Log-softmax.
    LogSoftmax,
    /// Layer norm without affine parameters, with this eps.
    LayerNorm(T),
    /// RMS norm without a scale, with this eps.
    RmsNorm(T),
}

/// Where the lanes of a tensor lie in its buffer: `len` elements each, `stride` apart.
#[derive(Debug, Clone, Copy)]
struct Lanes {
    len: usize,
    stride: usize,
}

impl Lanes {
    /// The lanes along `axis` (checked) of a tensor of `shape`.
    fn along(shape: &[usize], axis: usize) -> Self {
        Lanes {
            len: shape[axis],
            stride: shape[axis + 1..].iter().product(),
        }
    }

    /// The consecutive runs of `len` elements of the buffer (a group of group norm).
    fn runs(len: usize) -> Self {
        Lanes { len, stride: 1 }
    }
}

/// A lane op with its lanes: one record for softmax, log-softmax, and layer, RMS and group norm.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LaneOp<T> {
    kind: Lane<T>,
    span: Span,
}

/// Which lanes a [`LaneOp`] works on.
#[derive(Debug, Clone, Copy)]
enum Span {
    /// Along an axis.
    Along(usize),
    /// The groups of group norm: each (image, group) of `[n, c, h, w]`, a contiguous run.
    Groups(usize),
}

impl<T: Element> LaneOp<T> {
    /// `kind` along `axis` (checked).
    pub(crate) fn along(kind: Lane<T>, axis: usize) -> Self {
        LaneOp {
            kind,
            span: Span::Along(axis),
        }
    }

    /// Layer norm of each of `groups` groups of every image of `[n, c, h, w]` (checked).
    pub(crate) fn groups(groups: usize, eps: T) -> Self {
        LaneOp {
            kind: Lane::LayerNorm(eps),
            span: Span::Groups(groups),
        }
    }

    /// The op on `x`, recorded.
    pub(crate) fn run<'s>(self, x: Arg<'_, 's, T>) -> Result<Tensor<'s, T>> {
        autograd::run(self, &mut args([x]))
    }

    fn lanes(&self, shape: &[usize]) -> Lanes {
        match self.span {
            Span::Along(axis) => Lanes::along(shape, axis),
            Span::Groups(groups) => {
                let len = shape.iter().product::<usize>();
                Lanes::runs(len / (shape[0] * groups).max(1))
            }
        }
    }
}

impl<T: Element> Op<T> for LaneOp<T> {
    /// The input (for the norms) and the output (for softmax, log-softmax, layer and group norm).
    type Saved<'s> = (Option<Saved<'s, T>>, Option<Saved<'s, T>>);

    fn name(&self) -> &'static str {
        match (self.kind, self.span) {
            (Lane::Softmax, _) => "softmax",
            (Lane::LogSoftmax, _) => "log_softmax",
            (Lane::LayerNorm(_), Span::Groups(_)) => "group_norm",
            (Lane::LayerNorm(_), _) => "layer_norm",
            (Lane::RmsNorm(_), _) => "rms_norm",
        }
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let kind = self.kind;
        let lanes = self.lanes(cx.input(0).shape());
        // The input is saved before the kernel runs, so it is not written over.
        let norm = matches!(kind, Lane::LayerNorm(_) | Lane::RmsNorm(_));
        let x = (cx.saving() && norm).then(|| cx.save(cx.input(0)));
        let src = cx.take(0);
        let mut out = src.into_writable_copy(cx.scope())?;
        along(
            &mut out,
            [],
            lanes,
            #[inline(always)]
            |lane, []| forward(kind, lane),
        );
        let y = cx.saving() && !matches!(kind, Lane::RmsNorm(_));
        let saved = cx.saving().then(|| (x, y.then(|| cx.save(&out))));
        Ok((out, saved))
    }

    fn backward<'b>(
        &self,
        (x, y): Self::Saved<'b>,
        g: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
        let (x, y) = (x.map(|x| x.get(cx)), y.map(|y| y.get(cx)));
        let (first, second) = match (x, y) {
            (Some(x), y) => (x, y),
            (None, Some(y)) => (y, None),
            (None, None) => unreachable!("every lane op saves its input or its output"),
        };
        let lanes = self.lanes(first.shape());
        let dx = lane_backward(self.kind, g, &first, second.as_ref(), lanes)?;
        Ok(Grads::from([Some(dx)]))
    }
}

/// `kind` of one lane, in place.
#[inline(always)]
fn forward<T: Element>(kind: Lane<T>, lane: &mut [T]) {
    match kind {
        Lane::Softmax => softmax(lane, false),
        Lane::LogSoftmax => softmax(lane, true),
        Lane::LayerNorm(eps) => layer_norm(lane, eps),
        Lane::RmsNorm(eps) => {
            let inv = inv_rms(lane, eps);
            for x in lane {
                *x = *x * inv;
            }
        }
    }
}

/// The gradient of the input of `kind` over `lanes` given `g`, the gradient of its output, and
/// what the forward saved: the output `y` for softmax and log-softmax, the input `x` for RMS norm,
/// and both (`x`, then `y`) for layer norm. Written over `g` when it is unique.
fn lane_backward<'s, T: Element>(
    kind: Lane<T>,
    g: Tensor<'s, T>,
    saved: &Tensor<'s, T>,
    y: Option<&Tensor<'s, T>>,
    lanes: Lanes,
) -> Result<Tensor<'s, T>> {
    let mut d = g.try_into_unique()?;
    match kind {
        // y (g - sum(g y))
        Lane::Softmax => along(
            &mut d,
            [saved],
            lanes,
            #[inline(always)]
            |d, [y]| {
                let dot = sum_with(d, y, |g, y| g * y);
                for (g, &y) in d.iter_mut().zip(y) {
                    *g = y * (*g - dot);
                }
            },
        ),
        // g - exp(y) sum(g)
        Lane::LogSoftmax => along(
            &mut d,
            [saved],
            lanes,
            #[inline(always)]
            |d, [y]| {
                let total = sum(d);
                for (g, &y) in d.iter_mut().zip(y) {
                    *g = *g - y.exp_kernel() * total;
                }
            },
        ),
        Lane::LayerNorm(eps) => along(
            &mut d,
            [saved, y.expect("layer norm saves its output")],
            lanes,
            #[inline(always)]
            |d, [x, y]| norm_backward_lane(d, x, y, eps),
        ),
        // With r = 1 / rms(x): y = x r, and dx = r g - x r^3 sum(g x) / n.
        Lane::RmsNorm(eps) => along(
            &mut d,
            [saved],
            lanes,
            #[inline(always)]
            |d, [x]| {
                let r = inv_rms(x, eps);
                let n = T::from_f64(x.len() as f64);
                let c = r * r * r * sum_with(d, x, |g, x| g * x) / n;
                for (g, &x) in d.iter_mut().zip(x) {
                    *g = r * *g - x * c;
                }
            },
        ),
    }
    Ok(d)
}

/// Runs `kernel(lane of dst, [the same lane of each of srcs])` on every lane of tensors of one
/// shape: on their buffers when the lanes are contiguous; else one lane at a time, each copied
/// into a per-thread scratch buffer (which only grows) and the result copied back, so that an op
/// in place rents nothing.
fn along<T: Element, const N: usize>(
    dst: &mut Tensor<'_, T>,
    srcs: [&Tensor<'_, T>; N],
    lanes: Lanes,
    kernel: impl Fn(&mut [T], [&[T]; N]) + Sync,
) {
    if dst.is_empty() {
        // No lane has an element: nothing to visit, however many empty lanes there are.
        return;
    }
    let Lanes {
        len: lane,
        stride: inner,
    } = lanes;
    work::visit(dst.len() / lane);
    let data = dst.unique_slice_mut();
    let srcs = srcs.map(|s| s.slice());
    if inner == 1 {
        simd::lanes(data, srcs, lane, kernel);
        return;
    }
    super::with_scratch((N + 1) * lane, |scratch: &mut [T]| {
        let (d, rest) = scratch.split_at_mut(lane);
        let mut parts = rest.chunks_exact_mut(lane);
        let mut s: [&mut [T]; N] = std::array::from_fn(|_| parts.next().expect("N lanes"));
        for block in (0..data.len()).step_by(lane * inner) {
            for i in block..block + inner {
                for j in 0..lane {
                    d[j] = data[i + j * inner];
                }
                for (s, src) in s.iter_mut().zip(&srcs) {
                    for j in 0..lane {
                        s[j] = src[i + j * inner];
                    }
                }
                simd::lanes(
                    d,
                    std::array::from_fn(|k| &*s[k]),
                    lane,
                    #[inline(always)]
                    |d, s| kernel(d, s),
                );
                for j in 0..lane {
                    data[i + j * inner] = d[j];
                }
            }
        }
    });
}
