//! Reductions along an axis.

use ndarray::{Axis, Zip};

use super::{check_axis, work};
use crate::autograd::{self, Recorder, Rule};
use crate::element::Element;
use crate::error::{or_panic, Result};
use crate::tensor::Tensor;

impl<'s, T: Element> Tensor<'s, T> {
    /// Sums along `axis`; the result has that axis removed (`[2, 3]` summed along 1 is `[2]`). Fails
    /// with [`Error::AxisOutOfRange`](crate::Error::AxisOutOfRange) for a bad axis.
    pub fn try_sum(&self, axis: usize) -> Result<Tensor<'s, T>> {
        let out = self.reduce("sum", axis, |lane_sum, _| lane_sum)?;
        Ok(autograd::finish(Recorder::of(&[self]), out, |_| {
            Rule::Sum(axis, self.shape().to_vec())
        }))
    }

    /// Sums along `axis`; see [`Tensor::try_sum`].
    ///
    /// # Panics
    /// For a bad axis or an exhausted budget, with the error's message.
    #[track_caller]
    pub fn sum(&self, axis: usize) -> Tensor<'s, T> {
        or_panic(self.try_sum(axis))
    }

    /// The mean along `axis`; the result has that axis removed. The mean over a zero-length axis is
    /// NaN, as 0/0. Fails with [`Error::AxisOutOfRange`](crate::Error::AxisOutOfRange) for a bad axis.
    pub fn try_mean(&self, axis: usize) -> Result<Tensor<'s, T>> {
        let out = self.reduce("mean", axis, |lane_sum, len| {
            lane_sum / T::from_f64(len as f64)
        })?;
        Ok(autograd::finish(Recorder::of(&[self]), out, |_| {
            Rule::Mean(axis, self.shape().to_vec())
        }))
    }

    /// The mean along `axis`; see [`Tensor::try_mean`].
    ///
    /// # Panics
    /// For a bad axis or an exhausted budget, with the error's message.
    #[track_caller]
    pub fn mean(&self, axis: usize) -> Tensor<'s, T> {
        or_panic(self.try_mean(axis))
    }

    /// `finish(sum of the lane, lane length)` for every lane along `axis`.
    fn reduce(
        &self,
        op: &'static str,
        axis: usize,
        finish: impl Fn(T, usize) -> T,
    ) -> Result<Tensor<'s, T>> {
        check_axis(op, self, axis)?;
        let view = self.view();
        let mut shape = self.shape().to_vec();
        let len = shape.remove(axis);
        let mut out = Tensor::try_rent_in(&self.scope, &shape)?;
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
