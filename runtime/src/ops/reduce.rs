//! Reductions: sum and mean along an axis or over everything, with or without keeping the reduced
//! axis; `logsumexp` along an axis; max and min along an axis, with the positions where they are
//! (`argmax`, `argmin`). The variance and standard deviation, composed of these and of
//! elementwise ops, are in `ops::moments`.

use ndarray::{ArrayView1, Axis, Dimension, IxDyn, RemoveAxis, Zip};

use super::{beats, check_axis, rows, simd, work, Dim};
use crate::autograd::{self, args, Arg, Backward, Forward, Grads, Op, Saved};
use crate::dims::{Dims, Walk};
use crate::element::{DType, Element};
use crate::error::{panicking, Result};
use crate::scope::State;
use crate::tensor::Tensor;
use crate::TensorOps;

/// `sum` or `mean` along an axis.
#[derive(Debug, Clone, Copy)]
struct Reduce {
    axis: usize,
    mean: bool,
}

impl<T: Element> Op<T> for Reduce {
    /// The input's shape.
    type Saved<'s> = Dims;

    fn name(&self) -> &'static str {
        if self.mean {
            "mean"
        } else {
            "sum"
        }
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let x = cx.input(0);
        let out = if self.mean {
            reduce(x, cx.scope(), self.axis, |sum, len| {
                sum / T::from_f64(len as f64)
            })
        } else {
            reduce(x, cx.scope(), self.axis, |sum, _| sum)
        }?;
        Ok((out, cx.saving().then(|| Dims::from_slice(x.shape()))))
    }

    /// The gradient repeated along the reduced axis (divided by its length for a mean).
    fn backward<'b>(
        &self,
        shape: Dims,
        g: Tensor<'b, T>,
        _: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
        let g = match self.mean {
            true => {
                let n = T::from_f64(shape[self.axis] as f64);
                g.try_map(
                    #[inline(always)]
                    move |v| v / n,
                )?
            }
            false => g,
        };
        Ok(Grads::from([Some(expand(g, self.axis, shape.slice())?)]))
    }
}

/// `logsumexp` along an axis.
#[derive(Debug, Clone, Copy)]
struct LogSumExp {
    axis: usize,
}

impl<T: Element> Op<T> for LogSumExp {
    /// The input and the output.
    type Saved<'s> = (Saved<'s, T>, Saved<'s, T>);

    fn name(&self) -> &'static str {
        "logsumexp"
    }

    /// `ln(sum(e^(x - m))) + m` of every lane, `m` its largest element (0 if that is infinite, as
    /// PyTorch), so that no `e^x` overflows.
    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let (x, axis) = (cx.input(0), self.axis);
        let shape = IxDyn(x.shape()).remove_axis(Axis(axis));
        let mut out = cx.rent(shape.slice())?;
        if !out.is_empty() {
            work::visit(out.len());
            Zip::from(out.unique_view_mut())
                .and(x.view().lanes(Axis(axis)))
                .for_each(|o, lane| {
                    let max = lane.fold(T::neg_infinity(), |m, &v| if v > m { v } else { m });
                    let shift = if max.is_infinite() { T::zero() } else { max };
                    let sum = lane.fold(T::zero(), |s, &v| s + (v - shift).exp_kernel());
                    *o = sum.ln_kernel() + shift;
                });
        }
        let saved = cx.saving().then(|| (cx.save(x), cx.save(&out)));
        Ok((out, saved))
    }

    /// `g e^(x - y)`: the gradient times the softmax of the lane.
    fn backward<'b>(
        &self,
        (x, y): Self::Saved<'b>,
        g: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
        let (x, y, axis) = (x.get(cx), y.get(cx), Axis(self.axis));
        let mut dx = cx.rent::<T>(x.shape())?;
        if !dx.is_empty() {
            work::visit(rows(x.shape()));
            Zip::from(dx.unique_view_mut())
                .and(&x.view())
                .and_broadcast(&g.view().insert_axis(axis))
                .and_broadcast(&y.view().insert_axis(axis))
                .for_each(|d, &x, &g, &y| *d = g * (x - y).exp_kernel());
        }
        Ok(Grads::from([Some(dx)]))
    }
}

/// `g` (a reduction's gradient, `shape` without `axis`) repeated along `axis` to `shape`.
fn expand<'b, T: Element>(g: Tensor<'b, T>, axis: usize, shape: &[usize]) -> Result<Tensor<'b, T>> {
    let mut kept = Dims::from_slice(shape);
    kept[axis] = 1;
    g.try_reshape(kept.slice())?.try_broadcast_to(shape)
}

/// `g` summed over the axes along which an input of `shape` was broadcast to `g`'s shape.
pub(crate) fn reduce_to<'b, T: Element>(
    g: Tensor<'b, T>,
    shape: &[usize],
) -> Result<Tensor<'b, T>> {
    if g.shape() == shape {
        return Ok(g);
    }
    let lead = g.ndim() - shape.len();
    let mut g = g;
    if lead > 0 {
        // The leading axes in one pass, as one axis of their product.
        let mut flat = Dims::zeros(1 + shape.len());
        flat[0] = g.shape()[..lead].iter().product();
        flat.slice_mut()[1..].copy_from_slice(&g.shape()[lead..]);
        g = g.try_reshape(flat.slice())?.try_sum(0)?;
    }
    for (axis, &len) in shape.iter().enumerate() {
        if len == 1 && g.shape()[axis] != 1 {
            let mut kept = Dims::from_slice(g.shape());
            kept[axis] = 1;
            g = g.try_sum(axis)?.try_reshape(kept.slice())?;
        }
    }
    Ok(g)
}

impl<'s, T: Element> Tensor<'s, T> {
    /// Sums along `axis` (negative counts from the back); the result has that axis removed (`[2, 3]`
    /// summed along 1 or -1 is `[2]`). Fails with
    /// [`Error::AxisOutOfRange`](crate::Error::AxisOutOfRange) for a bad axis.
    pub fn try_sum(&self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        let axis = check_axis("sum", self, axis)?;
        autograd::run(
            Reduce { axis, mean: false },
            &mut args([Arg::Borrowed(self)]),
        )
    }

    /// The mean along `axis`; the result has that axis removed. The mean over a zero-length axis is
    /// NaN, as 0/0. Fails with [`Error::AxisOutOfRange`](crate::Error::AxisOutOfRange) for a bad axis.
    pub fn try_mean(&self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        let axis = check_axis("mean", self, axis)?;
        autograd::run(
            Reduce { axis, mean: true },
            &mut args([Arg::Borrowed(self)]),
        )
    }

    panicking! {
        /// Sums along `axis`.
        pub fn sum(&self, axis: impl Dim) -> Tensor<'s, T> = try_sum;
        /// The mean along `axis`.
        pub fn mean(&self, axis: impl Dim) -> Tensor<'s, T> = try_mean;
    }

    /// Sums along `axis`, keeping it with length 1 (PyTorch's `keepdim=True`), so the result
    /// broadcasts against the input: `&x / &x.sum_keepdim(-1)`. Fails as [`Tensor::try_sum`].
    pub fn try_sum_keepdim(&self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        let axis = check_axis("sum", self, axis)?;
        self.try_sum(axis)?.try_unsqueeze(axis)
    }

    panicking! {
        /// Sums along `axis`, keeping it.
        pub fn sum_keepdim(&self, axis: impl Dim) -> Tensor<'s, T> = try_sum_keepdim;
    }

    /// The mean along `axis`, keeping it with length 1. Fails as [`Tensor::try_mean`].
    pub fn try_mean_keepdim(&self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        let axis = check_axis("mean", self, axis)?;
        self.try_mean(axis)?.try_unsqueeze(axis)
    }

    panicking! {
        /// The mean along `axis`, keeping it.
        pub fn mean_keepdim(&self, axis: impl Dim) -> Tensor<'s, T> = try_mean_keepdim;
    }

    /// `ln(sum(e^x))` along `axis`, computed stably (shifted by the lane's largest element); the
    /// result has that axis removed (PyTorch's `logsumexp`; `-inf` for an empty axis). Its gradient
    /// is the softmax of the lane times the gradient. Fails with
    /// [`Error::AxisOutOfRange`](crate::Error::AxisOutOfRange) for a bad axis.
    pub fn try_logsumexp(&self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        let axis = check_axis("logsumexp", self, axis)?;
        autograd::run(LogSumExp { axis }, &mut args([Arg::Borrowed(self)]))
    }

    /// `ln(sum(e^x))` along `axis`, keeping it with length 1. Fails as
    /// [`Tensor::try_logsumexp`].
    pub fn try_logsumexp_keepdim(&self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        let axis = check_axis("logsumexp", self, axis)?;
        self.try_logsumexp(axis)?.try_unsqueeze(axis)
    }

    panicking! {
        /// `ln(sum(e^x))` along `axis`.
        pub fn logsumexp(&self, axis: impl Dim) -> Tensor<'s, T> = try_logsumexp;
        /// `ln(sum(e^x))` along `axis`, keeping it.
        pub fn logsumexp_keepdim(&self, axis: impl Dim) -> Tensor<'s, T> = try_logsumexp_keepdim;
    }

    /// The sum of every element, as a rank-0 tensor (0 for an empty tensor). Fails only with a
    /// budget error.
    pub fn try_sum_all(&self) -> Result<Tensor<'s, T>> {
        self.flatten().try_sum(0)
    }

    panicking! {
        /// The sum of every element.
        pub fn sum_all(&self) -> Tensor<'s, T> = try_sum_all;
    }

    /// The mean of every element, as a rank-0 tensor (NaN for an empty tensor). Fails only with a
    /// budget error.
    pub fn try_mean_all(&self) -> Result<Tensor<'s, T>> {
        self.flatten().try_mean(0)
    }

    panicking! {
        /// The mean of every element.
        pub fn mean_all(&self) -> Tensor<'s, T> = try_mean_all;
    }
}

/// `finish(sum of the lane, lane length)` for every lane along `axis` (checked) of `x`, into a
/// tensor of `scope`.
fn reduce<'s, T: Element>(
    x: &Tensor<'s, T>,
    scope: &State,
    axis: usize,
    finish: impl Fn(T, usize) -> T,
) -> Result<Tensor<'s, T>> {
    let shape = Dims::from_slice(x.shape()).removed(axis);
    let len = x.shape()[axis];
    let mut out = Tensor::try_rent_in(scope, &shape)?;
    if out.is_empty() {
        return Ok(out);
    }
    // The lanes' starts, walked in the output's order.
    let (values, start) = x.buffer();
    let lane_step = x.step(axis);
    let walk = Walk::new(&shape, [start], [&x.steps_over(x.shape()).removed(axis)]);
    let acc = out.unique_slice_mut();
    if len == 0 {
        // Empty lanes: the sum is 0 (and the mean 0/0).
        acc.fill(finish(T::zero(), 0));
    } else if lane_step == 1 {
        // Contiguous lanes: one sum each.
        work::visit(acc.len());
        walk.for_each_run(|at, [from], n, [step]| {
            for (i, o) in acc[at..at + n].iter_mut().enumerate() {
                let lane = &values[from + i * step..][..len];
                *o = finish(ArrayView1::from(lane).sum(), len);
            }
        });
    } else {
        // Strided lanes would be read one element per cache line: add whole slices instead.
        work::visit(len);
        acc.fill(T::zero());
        for j in 0..len {
            walk.for_each_run(|at, [from], n, [step]| {
                let (acc, from) = (&mut acc[at..at + n], from + j * lane_step);
                match step {
                    1 => simd::zip_in_place(acc, &values[from..from + n], |o, x| o + x),
                    _ => (acc.iter_mut().enumerate())
                        .for_each(|(i, o)| *o = *o + values[from + i * step]),
                }
            });
        }
        acc.iter_mut().for_each(|sum| *sum = finish(*sum, len));
    }
    Ok(out)
}

/// Which extreme a reduction looks for.
#[derive(Clone, Copy)]
enum Extreme {
    Max,
    Min,
}

impl Extreme {
    fn op(self, arg: bool) -> &'static str {
        match (self, arg) {
            (Extreme::Max, false) => "max",
            (Extreme::Min, false) => "min",
            (Extreme::Max, true) => "argmax",
            (Extreme::Min, true) => "argmin",
        }
    }
}

impl<'s, T: DType> Tensor<'s, T> {
    /// The position of the largest value along `axis`, with that axis removed, as `i64` (the
    /// first position among equal values; a NaN counts as the largest, as in PyTorch). Fails with
    /// [`Error::AxisOutOfRange`](crate::Error::AxisOutOfRange), or
    /// [`Error::InvalidShape`](crate::Error::InvalidShape) for an empty axis (no position to give).
    pub fn try_argmax(&self, axis: impl Dim) -> Result<Tensor<'s, i64>> {
        self.arg_extreme(Extreme::Max, axis, false, true)
    }

    panicking! {
        /// The position of the largest value along `axis`.
        pub fn argmax(&self, axis: impl Dim) -> Tensor<'s, i64> = try_argmax;
    }

    /// The position of the smallest value along `axis`, with that axis removed; as
    /// [`Tensor::try_argmax`] otherwise.
    pub fn try_argmin(&self, axis: impl Dim) -> Result<Tensor<'s, i64>> {
        self.arg_extreme(Extreme::Min, axis, false, true)
    }

    panicking! {
        /// The position of the smallest value along `axis`.
        pub fn argmin(&self, axis: impl Dim) -> Tensor<'s, i64> = try_argmin;
    }

    /// The largest value along `axis`, with that axis removed (PyTorch's `max(dim).values`; NaN if
    /// the lane holds one). Its gradient goes to the position [`Tensor::argmax`] gives. Fails as
    /// [`Tensor::try_argmax`].
    pub fn try_max(&self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        self.extreme(Extreme::Max, axis, false)
    }

    panicking! {
        /// The largest value along `axis`.
        pub fn max(&self, axis: impl Dim) -> Tensor<'s, T> = try_max;
    }

    /// The largest value along `axis`, keeping it with length 1. Fails as [`Tensor::try_max`].
    pub fn try_max_keepdim(&self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        self.extreme(Extreme::Max, axis, true)
    }

    panicking! {
        /// The largest value along `axis`, keeping it.
        pub fn max_keepdim(&self, axis: impl Dim) -> Tensor<'s, T> = try_max_keepdim;
    }

    /// The smallest value along `axis`, with that axis removed; as [`Tensor::try_max`] otherwise.
    pub fn try_min(&self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        self.extreme(Extreme::Min, axis, false)
    }

    panicking! {
        /// The smallest value along `axis`.
        pub fn min(&self, axis: impl Dim) -> Tensor<'s, T> = try_min;
    }

    /// The smallest value along `axis`, keeping it with length 1. Fails as [`Tensor::try_min`].
    pub fn try_min_keepdim(&self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        self.extreme(Extreme::Min, axis, true)
    }

    panicking! {
        /// The smallest value along `axis`, keeping it.
        pub fn min_keepdim(&self, axis: impl Dim) -> Tensor<'s, T> = try_min_keepdim;
    }

    /// The extreme values: the input gathered at the extremes' positions, so the gradient follows
    /// the gather's rule to exactly those positions.
    fn extreme(&self, which: Extreme, axis: impl Dim, keepdim: bool) -> Result<Tensor<'s, T>> {
        let axis = check_axis(which.op(false), self, axis)?;
        let at = self.arg_extreme(which, axis, true, false)?;
        let values = self.try_gather(axis, &at)?;
        if keepdim {
            Ok(values)
        } else {
            values.try_squeeze(axis)
        }
    }

    /// The positions of the extremes along `axis`, as `i64`, keeping the axis with length 1 if
    /// `keepdim`; errors name the positions' op (`arg`) or the values' op.
    fn arg_extreme(
        &self,
        which: Extreme,
        axis: impl Dim,
        keepdim: bool,
        arg: bool,
    ) -> Result<Tensor<'s, i64>> {
        let op = which.op(arg);
        let axis = check_axis(op, self, axis)?;
        let mut shape = self.shape().to_vec();
        if shape[axis] == 0 {
            return Err(crate::Error::InvalidShape {
                op,
                shape: self.shape().into(),
                reason: format!(
                    "axis {axis} is empty: it has no {} position",
                    which.op(false)
                ),
            });
        }
        if keepdim {
            shape[axis] = 1;
        } else {
            shape.remove(axis);
        }
        let mut out = Tensor::<i64>::try_rent_in(&self.rents_in, &shape)?;
        if out.is_empty() {
            return Ok(out);
        }
        let max = matches!(which, Extreme::Max);
        let view = self.view();
        let mut positions = out.unique_view_mut();
        if keepdim {
            positions = positions.index_axis_move(Axis(axis), 0);
        }
        work::visit(positions.len());
        Zip::from(&mut positions)
            .and(view.lanes(Axis(axis)))
            .for_each(|p, lane| {
                let mut best = 0;
                for (i, &x) in lane.iter().enumerate().skip(1) {
                    if beats(x, lane[best], max) {
                        best = i;
                    }
                }
                *p = best as i64;
            });
        Ok(out)
    }
}
