//! Sorting along an axis: [`Tensor::sort`] and [`Tensor::argsort`], and the `k` largest or
//! smallest values with [`Tensor::topk`].
//!
//! The positions are computed without a record (integers have no gradient); the values are the
//! input gathered at them, so their gradient goes through `gather`'s backward to the positions they
//! came from, and a checkpointed replay reads the same positions. The order is PyTorch's: NaN
//! counts as the largest value, in either direction. Equal values keep their original order
//! (lower index first) in either direction, as PyTorch's `sort(stable=True)`; `topk` orders its
//! ties the same way (PyTorch leaves theirs unspecified).

use std::cmp::Ordering;

use ndarray::{Axis, Dimension, IxDyn, Zip};

use super::{check_axis, work, Dim};
use crate::element::DType;
use crate::error::{panicking, Error, Result};
use crate::tensor::Tensor;

/// `a` against `b` in ascending order with NaN the largest (and equal to itself), reversed if
/// `descending`.
fn compare<T: PartialOrd>(a: T, b: T, descending: bool) -> Ordering {
    let is_nan = |v: &T| v.partial_cmp(v).is_none();
    let ascending = a
        .partial_cmp(&b)
        .unwrap_or_else(|| is_nan(&a).cmp(&is_nan(&b)));
    if descending {
        ascending.reverse()
    } else {
        ascending
    }
}

impl<'s, T: DType> Tensor<'s, T> {
    /// The values along `axis` sorted ascending, or descending if `descending`, and the positions
    /// they came from, as `i64` (PyTorch's `sort(stable=True)`): NaN counts as the largest value,
    /// and equal values keep their original order. The values' gradient goes back to those
    /// positions. Fails with [`Error::AxisOutOfRange`].
    ///
    /// ```
    /// use tensorscope::Pool;
    /// let pool = Pool::with_max_memory_mb(16);
    /// pool.scope(|s| {
    ///     let x = s.from_slice::<f32>(&[5], &[2.0, f32::NAN, -1.0, 2.0, 0.5]);
    ///     let (values, positions) = x.sort(0, true);
    ///     assert_eq!(positions.to_vec(), vec![1, 0, 3, 4, 2]);
    ///     assert_eq!(values.to_vec()[1..], [2.0, 2.0, 0.5, -1.0]);
    /// });
    /// ```
    pub fn try_sort(
        &self,
        axis: impl Dim,
        descending: bool,
    ) -> Result<(Tensor<'s, T>, Tensor<'s, i64>)> {
        let axis = check_axis("sort", self, axis)?;
        let positions = self.sorted_positions(axis, self.shape()[axis], descending)?;
        Ok((self.try_gather(axis, &positions)?, positions))
    }

    /// The positions that sort the values along `axis`, ascending or descending: the positions of
    /// [`Tensor::try_sort`]. Fails with [`Error::AxisOutOfRange`].
    pub fn try_argsort(&self, axis: impl Dim, descending: bool) -> Result<Tensor<'s, i64>> {
        let axis = check_axis("argsort", self, axis)?;
        self.sorted_positions(axis, self.shape()[axis], descending)
    }

    /// The `k` largest values along `axis` (the `k` smallest if not `largest`), in that order, and
    /// their positions as `i64` (PyTorch's `topk` with `sorted=True`); NaN counts as the largest
    /// value, and equal values come lower index first. The values' gradient goes back to those
    /// positions. Takes `O(n + k log k)` per lane. Fails with [`Error::AxisOutOfRange`], or
    /// [`Error::InvalidArgument`] for a `k` past the axis's length.
    ///
    /// ```
    /// use tensorscope::Pool;
    /// let pool = Pool::with_max_memory_mb(16);
    /// pool.scope(|s| {
    ///     let x = s.from_slice::<f32>(&[2, 4], &[0.1, 0.7, 0.2, 0.7, 3.0, 1.0, 2.0, 0.0]);
    ///     let (values, positions) = x.topk(2, -1, true);
    ///     assert_eq!(values.to_vec(), vec![0.7, 0.7, 3.0, 2.0]);
    ///     assert_eq!(positions.to_vec(), vec![1, 3, 0, 2]);
    /// });
    /// ```
    pub fn try_topk(
        &self,
        k: usize,
        axis: impl Dim,
        largest: bool,
    ) -> Result<(Tensor<'s, T>, Tensor<'s, i64>)> {
        let axis = check_axis("topk", self, axis)?;
        let len = self.shape()[axis];
        if k > len {
            return Err(Error::InvalidArgument {
                op: "topk",
                arg: "k",
                reason: format!("{k} is larger than axis {axis} of length {len}"),
            });
        }
        let positions = self.sorted_positions(axis, k, largest)?;
        Ok((self.try_gather(axis, &positions)?, positions))
    }

    panicking! {
        /// The values along `axis` sorted, and their positions.
        pub fn sort(&self, axis: impl Dim, descending: bool) -> (Tensor<'s, T>, Tensor<'s, i64>) = try_sort;
        /// The positions that sort the values along `axis`.
        pub fn argsort(&self, axis: impl Dim, descending: bool) -> Tensor<'s, i64> = try_argsort;
        /// The `k` largest (or smallest) values along `axis`, and their positions.
        pub fn topk(&self, k: usize, axis: impl Dim, largest: bool) -> (Tensor<'s, T>, Tensor<'s, i64>) = try_topk;
    }

    /// The positions of the first `k` (at most the length of `axis`, checked) values of each lane
    /// along `axis` in sorted order. Ties are broken by position, which makes the order total: an
    /// unstable sort (no allocation) then gives the stable order, and a selection of the first `k`
    /// followed by a sort of those gives the same first `k` as a whole sort.
    fn sorted_positions(&self, axis: usize, k: usize, descending: bool) -> Result<Tensor<'s, i64>> {
        let len = self.shape()[axis];
        let mut shape = IxDyn(self.shape());
        shape[axis] = k;
        let mut out = Tensor::<i64>::try_rent_in(&self.rents_in, shape.slice())?;
        if out.is_empty() {
            return Ok(out);
        }
        let mut lane_order = Tensor::<i64>::try_rent_in(&self.rents_in, &[len])?;
        let order = lane_order.unique_slice_mut();
        let view = self.view();
        let mut positions = out.unique_view_mut();
        work::visit(positions.len() / k);
        Zip::from(positions.lanes_mut(Axis(axis)))
            .and(view.lanes(Axis(axis)))
            .for_each(|mut first, lane| {
                order
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, p)| *p = i as i64);
                let before = |a: &i64, b: &i64| {
                    compare(lane[*a as usize], lane[*b as usize], descending).then(a.cmp(b))
                };
                if k < len {
                    order.select_nth_unstable_by(k - 1, before);
                }
                order[..k].sort_unstable_by(before);
                first.iter_mut().zip(&order[..k]).for_each(|(f, &p)| *f = p);
            });
        Ok(out)
    }
}
