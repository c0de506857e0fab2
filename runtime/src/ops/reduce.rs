//! Reductions: sum and mean along an axis or over everything, with or without keeping the reduced
//! axis; max and min along an axis, with the positions where they are (`argmax`, `argmin`).

use ndarray::{Axis, Dimension, IxDyn, RemoveAxis, Zip};

use super::{beats, check_axis, work, Dim};
use crate::autograd::{self, Recorder, Rule};
use crate::element::{DType, Element};
use crate::error::{or_panic, Result};
use crate::tensor::Tensor;

impl<'s, T: Element> Tensor<'s, T> {
    /// Sums along `axis` (negative counts from the back); the result has that axis removed (`[2, 3]`
    /// summed along 1 or -1 is `[2]`). Fails with
    /// [`Error::AxisOutOfRange`](crate::Error::AxisOutOfRange) for a bad axis.
    pub fn try_sum(&self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        let axis = check_axis("sum", self, axis)?;
        let out = self.reduce(axis, |lane_sum, _| lane_sum)?;
        Ok(autograd::finish(Recorder::of(&[self]), out, |_| {
            Rule::Sum(axis, IxDyn(self.shape()))
        }))
    }

    /// Sums along `axis`; see [`Tensor::try_sum`].
    ///
    /// # Panics
    /// For a bad axis or an exhausted budget, with the error's message.
    #[track_caller]
    pub fn sum(&self, axis: impl Dim) -> Tensor<'s, T> {
        or_panic(self.try_sum(axis))
    }

    /// The mean along `axis`; the result has that axis removed. The mean over a zero-length axis is
    /// NaN, as 0/0. Fails with [`Error::AxisOutOfRange`](crate::Error::AxisOutOfRange) for a bad axis.
    pub fn try_mean(&self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        let axis = check_axis("mean", self, axis)?;
        let out = self.reduce(axis, |lane_sum, len| lane_sum / T::from_f64(len as f64))?;
        Ok(autograd::finish(Recorder::of(&[self]), out, |_| {
            Rule::Mean(axis, IxDyn(self.shape()))
        }))
    }

    /// The mean along `axis`; see [`Tensor::try_mean`].
    ///
    /// # Panics
    /// For a bad axis or an exhausted budget, with the error's message.
    #[track_caller]
    pub fn mean(&self, axis: impl Dim) -> Tensor<'s, T> {
        or_panic(self.try_mean(axis))
    }

    /// Sums along `axis`, keeping it with length 1 (PyTorch's `keepdim=True`), so the result
    /// broadcasts against the input: `&x / &x.sum_keepdim(-1)`. Fails as [`Tensor::try_sum`].
    pub fn try_sum_keepdim(&self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        let axis = check_axis("sum", self, axis)?;
        self.try_sum(axis)?.try_unsqueeze(axis)
    }

    /// Sums along `axis`, keeping it; see [`Tensor::try_sum_keepdim`].
    ///
    /// # Panics
    /// For a bad axis or an exhausted budget, with the error's message.
    #[track_caller]
    pub fn sum_keepdim(&self, axis: impl Dim) -> Tensor<'s, T> {
        or_panic(self.try_sum_keepdim(axis))
    }

    /// The mean along `axis`, keeping it with length 1. Fails as [`Tensor::try_mean`].
    pub fn try_mean_keepdim(&self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        let axis = check_axis("mean", self, axis)?;
        self.try_mean(axis)?.try_unsqueeze(axis)
    }

    /// The mean along `axis`, keeping it; see [`Tensor::try_mean_keepdim`].
    ///
    /// # Panics
    /// For a bad axis or an exhausted budget, with the error's message.
    #[track_caller]
    pub fn mean_keepdim(&self, axis: impl Dim) -> Tensor<'s, T> {
        or_panic(self.try_mean_keepdim(axis))
    }

    /// The sum of every element, as a rank-0 tensor (0 for an empty tensor). Fails only with a
    /// budget error.
    pub fn try_sum_all(&self) -> Result<Tensor<'s, T>> {
        self.flatten().try_sum(0)
    }

    /// The sum of every element; see [`Tensor::try_sum_all`].
    ///
    /// # Panics
    /// If the budget is exhausted, with the error's message.
    #[track_caller]
    pub fn sum_all(&self) -> Tensor<'s, T> {
        or_panic(self.try_sum_all())
    }

    /// The mean of every element, as a rank-0 tensor (NaN for an empty tensor). Fails only with a
    /// budget error.
    pub fn try_mean_all(&self) -> Result<Tensor<'s, T>> {
        self.flatten().try_mean(0)
    }

    /// The mean of every element; see [`Tensor::try_mean_all`].
    ///
    /// # Panics
    /// If the budget is exhausted, with the error's message.
    #[track_caller]
    pub fn mean_all(&self) -> Tensor<'s, T> {
        or_panic(self.try_mean_all())
    }

    /// `finish(sum of the lane, lane length)` for every lane along `axis` (checked).
    fn reduce(&self, axis: usize, finish: impl Fn(T, usize) -> T) -> Result<Tensor<'s, T>> {
        let view = self.view();
        let shape = IxDyn(self.shape()).remove_axis(Axis(axis));
        let len = self.shape()[axis];
        let mut out = Tensor::try_rent_in(&self.rents_in, shape.slice())?;
        if out.is_empty() {
            return Ok(out);
        }
        let mut acc = out.unique_view_mut();
        if len == 0 {
            // Empty lanes: the sum is 0 (and the mean 0/0).
            acc.fill(finish(T::zero(), 0));
        } else if axis + 1 == self.ndim() {
            // Contiguous lanes: one sum each.
            work::visit(acc.len());
            Zip::from(&mut acc)
                .and(view.lanes(Axis(axis)))
                .for_each(|o, lane| *o = finish(lane.sum(), len));
        } else {
            // Strided lanes would be read one element per cache line: add whole slices instead.
            work::visit(len);
            acc.fill(T::zero());
            for slice in view.axis_iter(Axis(axis)) {
                Zip::from(&mut acc)
                    .and(&slice)
                    .for_each(|o, &x| *o = *o + x);
            }
            acc.mapv_inplace(|sum| finish(sum, len));
        }
        Ok(out)
    }
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

    /// The position of the largest value along `axis`; see [`Tensor::try_argmax`].
    ///
    /// # Panics
    /// For a bad or empty axis, with the error's message.
    #[track_caller]
    pub fn argmax(&self, axis: impl Dim) -> Tensor<'s, i64> {
        or_panic(self.try_argmax(axis))
    }

    /// The position of the smallest value along `axis`, with that axis removed; as
    /// [`Tensor::try_argmax`] otherwise.
    pub fn try_argmin(&self, axis: impl Dim) -> Result<Tensor<'s, i64>> {
        self.arg_extreme(Extreme::Min, axis, false, true)
    }

    /// The position of the smallest value along `axis`; see [`Tensor::try_argmin`].
    ///
    /// # Panics
    /// For a bad or empty axis, with the error's message.
    #[track_caller]
    pub fn argmin(&self, axis: impl Dim) -> Tensor<'s, i64> {
        or_panic(self.try_argmin(axis))
    }

    /// The largest value along `axis`, with that axis removed (PyTorch's `max(dim).values`; NaN if
    /// the lane holds one). Its gradient goes to the position [`Tensor::argmax`] gives. Fails as
    /// [`Tensor::try_argmax`].
    pub fn try_max(&self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        self.extreme(Extreme::Max, axis, false)
    }

    /// The largest value along `axis`; see [`Tensor::try_max`].
    ///
    /// # Panics
    /// For a bad or empty axis, or an exhausted budget, with the error's message.
    #[track_caller]
    pub fn max(&self, axis: impl Dim) -> Tensor<'s, T> {
        or_panic(self.try_max(axis))
    }

    /// The largest value along `axis`, keeping it with length 1. Fails as [`Tensor::try_max`].
    pub fn try_max_keepdim(&self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        self.extreme(Extreme::Max, axis, true)
    }

    /// The largest value along `axis`, keeping it; see [`Tensor::try_max_keepdim`].
    ///
    /// # Panics
    /// For a bad or empty axis, or an exhausted budget, with the error's message.
    #[track_caller]
    pub fn max_keepdim(&self, axis: impl Dim) -> Tensor<'s, T> {
        or_panic(self.try_max_keepdim(axis))
    }

    /// The smallest value along `axis`, with that axis removed; as [`Tensor::try_max`] otherwise.
    pub fn try_min(&self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        self.extreme(Extreme::Min, axis, false)
    }

    /// The smallest value along `axis`; see [`Tensor::try_min`].
    ///
    /// # Panics
    /// For a bad or empty axis, or an exhausted budget, with the error's message.
    #[track_caller]
    pub fn min(&self, axis: impl Dim) -> Tensor<'s, T> {
        or_panic(self.try_min(axis))
    }

    /// The smallest value along `axis`, keeping it with length 1. Fails as [`Tensor::try_min`].
    pub fn try_min_keepdim(&self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        self.extreme(Extreme::Min, axis, true)
    }

    /// The smallest value along `axis`, keeping it; see [`Tensor::try_min_keepdim`].
    ///
    /// # Panics
    /// For a bad or empty axis, or an exhausted budget, with the error's message.
    #[track_caller]
    pub fn min_keepdim(&self, axis: impl Dim) -> Tensor<'s, T> {
        or_panic(self.try_min_keepdim(axis))
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
