//! Accumulation at integer positions, out of place: `index_add` (whole positions of an axis, by
//! 1-D ids) and `scatter_add` (one position per element, by an index of the source's rank), as
//! PyTorch's ops of those names. They are the transposes of `index_select` and `gather`: each
//! one's forward is the other's backward kernel. Every index is checked before anything is rented.

use ndarray::{ArrayViewD, ArrayViewMutD, Dimension, IxDyn};

use super::index::{check_ids, check_indices, lanes, rows, Way};
use super::{check_axis, Dim};
use crate::autograd::{self, args, Arg, Backward, Forward, Grads, Kept, Op, Saved};
use crate::element::DType;
use crate::error::{panicking, Error, Result, Shape};
use crate::tensor::Tensor;

/// `index_add` (`rows`: whole positions of the axis, by 1-D ids) or `scatter_add` (one position
/// per element, by an index of the source's rank) along an axis, by positions (checked).
#[derive(Clone)]
struct AddAt {
    axis: usize,
    positions: Saved<'static, i64>,
    rows: bool,
}

impl AddAt {
    /// Moves values between `dst` and `src` by the positions, `way` (see [`Way`]).
    fn kernel<T: DType>(&self, way: Way, dst: ArrayViewMutD<'_, T>, src: ArrayViewD<'_, T>) {
        let positions = &self.positions.0;
        match self.rows {
            true => rows(way, dst, src, self.axis, positions.slice()),
            false => lanes(way, dst, src, self.axis, positions.view()),
        }
    }
}

impl<T: DType> Op<T> for AddAt {
    /// The source's shape.
    type Saved<'s> = IxDyn;

    fn name(&self) -> &'static str {
        if self.rows {
            "index_add"
        } else {
            "scatter_add"
        }
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let x = cx.take(0);
        let mut out = x.into_writable_copy(cx.scope())?;
        let src = cx.input(1);
        if !src.is_empty() && !self.positions.0.is_empty() {
            self.kernel(Way::Add, out.unique_view_mut(), src.view());
        }
        Ok((out, cx.saving().then(|| IxDyn(src.shape()))))
    }

    /// The input's gradient is the output's; the source's is the output's read at the positions,
    /// and zero where they do not reach.
    fn backward<'b>(
        &self,
        shape: IxDyn,
        g: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
        let dsrc = cx.needs(1).then(|| {
            let mut dsrc = cx.zeros::<T>(shape.slice())?;
            if !dsrc.is_empty() && !self.positions.0.is_empty() {
                self.kernel(Way::Read, dsrc.unique_view_mut(), g.view());
            }
            Ok(dsrc)
        });
        let dsrc = dsrc.transpose()?;
        Ok(Grads::from([cx.needs(0).then_some(g), dsrc]))
    }

    fn held(&self) -> &dyn Kept {
        &self.positions
    }
}

impl<'s, T: DType> Tensor<'s, T> {
    /// This tensor with `src`'s positions along `axis` added at the positions `ids` (PyTorch's
    /// `index_add`): `out[.., ids[j], ..] = self[.., ids[j], ..] + src[.., j, ..]`, repeated ids
    /// adding up. `ids` is 1-D, and `src` has this tensor's shape but `ids.len()` positions along
    /// `axis`. Out of place; differentiable in this tensor and in `src`. Fails with
    /// [`Error::AxisOutOfRange`], [`Error::InvalidShape`] for ids that are not 1-D,
    /// [`Error::ShapeMismatch`] naming this tensor's and `src`'s shapes, or
    /// [`Error::IndexOutOfRange`] naming the first id past the axis.
    ///
    /// ```
    /// use tensorscope::Pool;
    /// let pool = Pool::with_max_memory_mb(16);
    /// pool.scope(|s| {
    ///     let x = s.zeros::<f32>(&[3, 2]);
    ///     let ids = s.from_slice::<i64>(&[3], &[2, 0, 2]);
    ///     let src = s.from_slice::<f32>(&[3, 2], &[1., 2., 3., 4., 5., 6.]);
    ///     assert_eq!(x.index_add(0, &ids, &src).to_vec(), vec![3., 4., 0., 0., 6., 8.]);
    /// });
    /// ```
    pub fn try_index_add(
        &self,
        axis: impl Dim,
        ids: &Tensor<'s, i64>,
        src: &Tensor<'s, T>,
    ) -> Result<Tensor<'s, T>> {
        let op = "index_add";
        let axis = check_ids(op, self, axis, ids)?;
        let mut expected = IxDyn(self.shape());
        expected[axis] = ids.len();
        if src.shape() != expected.slice() {
            return Err(Error::ShapeMismatch {
                op,
                lhs: Shape::from(self.shape()),
                rhs: Shape::from(src.shape()),
                reason: format!(
                    "the source must be {}: the input's shape with the ids' length, {}, \
                     on axis {axis}",
                    Shape::from(expected.slice()),
                    ids.len()
                ),
            });
        }
        self.add_at(axis, ids, true, src)
    }

    /// This tensor with each element of `src` added at the position `index` gives it along `axis`
    /// (PyTorch's `scatter_add`): `out[.., index[i], ..] = self[.., index[i], ..] + src[i]` for
    /// every position `i` of `index`, repeated positions adding up. `index`, `src` and this tensor
    /// have one rank; `index` is at most `src`'s length on every axis and at most this tensor's on
    /// every axis but `axis` (the elements of `src` past `index`'s shape are not read). Out of
    /// place; differentiable in this tensor and in `src`. Fails with [`Error::AxisOutOfRange`],
    /// [`Error::ShapeMismatch`] naming the index's shape and the one it does not fit, or
    /// [`Error::IndexOutOfRange`] naming the first index past the axis.
    ///
    /// ```
    /// use tensorscope::Pool;
    /// let pool = Pool::with_max_memory_mb(16);
    /// pool.scope(|s| {
    ///     // Sums per class: row i of `src` goes to column `labels[i]`.
    ///     let sums = s.zeros::<f32>(&[2, 3]);
    ///     let labels = s.from_slice::<i64>(&[2, 2], &[0, 0, 2, 1]);
    ///     let src = s.from_slice::<f32>(&[2, 2], &[1., 2., 3., 4.]);
    ///     assert_eq!(sums.scatter_add(1, &labels, &src).to_vec(), vec![3., 0., 0., 0., 4., 3.]);
    /// });
    /// ```
    pub fn try_scatter_add(
        &self,
        axis: impl Dim,
        index: &Tensor<'s, i64>,
        src: &Tensor<'s, T>,
    ) -> Result<Tensor<'s, T>> {
        let op = "scatter_add";
        let axis = check_axis(op, self, axis)?;
        let fits = |shape: &[usize], every_axis: bool| {
            index.ndim() == shape.len()
                && (0..shape.len())
                    .all(|d| (d == axis && !every_axis) || index.shape()[d] <= shape[d])
        };
        for (shape, every_axis, of) in [
            (self.shape(), false, "input"),
            (src.shape(), true, "source"),
        ] {
            if !fits(shape, every_axis) {
                let axes = match every_axis {
                    true => "every axis".to_string(),
                    false => format!("every axis but {axis}"),
                };
                return Err(Error::ShapeMismatch {
                    op,
                    lhs: Shape::from(shape),
                    rhs: Shape::from(index.shape()),
                    reason: format!(
                        "the index needs the {of}'s rank and, on {axes}, at most its length"
                    ),
                });
            }
        }
        check_indices(op, index, axis, self.shape()[axis])?;
        self.add_at(axis, index, false, src)
    }

    /// [`AddAt`] with positions checked.
    fn add_at(
        &self,
        axis: usize,
        positions: &Tensor<'s, i64>,
        rows: bool,
        src: &Tensor<'s, T>,
    ) -> Result<Tensor<'s, T>> {
        let positions = Saved::held(positions)?;
        let op = AddAt {
            axis,
            positions,
            rows,
        };
        autograd::run(op, &mut args([Arg::Borrowed(self), Arg::Borrowed(src)]))
    }

    panicking! {
        /// `src`'s positions added at `ids` along `axis`.
        pub fn index_add(&self, axis: impl Dim, ids: &Tensor<'s, i64>, src: &Tensor<'s, T>) -> Tensor<'s, T> = try_index_add;
        /// `src`'s elements added at the positions `index` gives along `axis`.
        pub fn scatter_add(&self, axis: impl Dim, index: &Tensor<'s, i64>, src: &Tensor<'s, T>) -> Tensor<'s, T> = try_scatter_add;
    }
}
