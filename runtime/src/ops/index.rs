//! Indexing by integer tensors: `index_select` and `embedding` (rows by id), `gather` (one
//! position per lane), `one_hot` (ids as rows of 0s and 1s). Every index is checked before any
//! output is rented: an id past the table is an [`Error::IndexOutOfRange`] naming it, never a
//! panic or a wrong row.

use ndarray::{ArrayViewD, ArrayViewMutD, Axis, Dimension, IxDyn, Slice, Zip};

use super::{check_addressable, check_axis, dimension_overflow, work, Dim};
use crate::autograd::{self, args, Arg, Backward, Forward, Grads, Kept, Op, Saved};
use crate::element::DType;
use crate::error::{panicking, Error, Result, Shape};
use crate::tensor::Tensor;

/// `index_select` along an axis, by ids (checked).
#[derive(Clone)]
struct IndexSelect {
    axis: usize,
    ids: Saved<'static, i64>,
}

impl<T: DType> Op<T> for IndexSelect {
    /// The length of the input's axis.
    type Saved<'s> = usize;

    fn name(&self) -> &'static str {
        "index_select"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let (x, axis, ids) = (cx.input(0), self.axis, self.ids.0.slice());
        let mut shape = IxDyn(x.shape());
        shape[axis] = ids.len();
        let mut out = cx.rent(shape.slice())?;
        if !out.is_empty() {
            rows(Way::Read, out.unique_view_mut(), x.view(), axis, ids);
        }
        Ok((out, cx.saving().then(|| x.shape()[axis])))
    }

    /// Each id's gradient added to its position (repeated ids add up).
    fn backward<'b>(
        &self,
        len: usize,
        g: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
        let axis = self.axis;
        let mut shape = IxDyn(g.shape());
        shape[axis] = len;
        let mut dx = cx.zeros::<T>(shape.slice())?;
        if !g.is_empty() {
            rows(
                Way::Add,
                dx.unique_view_mut(),
                g.view(),
                axis,
                self.ids.0.slice(),
            );
        }
        Ok(Grads::from([Some(dx)]))
    }

    fn held(&self) -> &dyn Kept {
        &self.ids
    }
}

/// `gather` along an axis, by an index (checked).
#[derive(Clone)]
struct Gather {
    axis: usize,
    index: Saved<'static, i64>,
}

impl<T: DType> Op<T> for Gather {
    /// The input's shape.
    type Saved<'s> = IxDyn;

    fn name(&self) -> &'static str {
        "gather"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let (x, axis, index) = (cx.input(0), self.axis, &self.index.0);
        let mut out = cx.rent(index.shape())?;
        if !out.is_empty() {
            lanes(
                Way::Read,
                out.unique_view_mut(),
                x.view(),
                axis,
                index.view(),
            );
        }
        Ok((out, cx.saving().then(|| IxDyn(x.shape()))))
    }

    /// Each gradient added to the position its value came from.
    fn backward<'b>(
        &self,
        shape: IxDyn,
        g: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
        let (axis, index) = (self.axis, &self.index.0);
        let mut dx = cx.zeros::<T>(shape.slice())?;
        if !g.is_empty() {
            lanes(Way::Add, dx.unique_view_mut(), g.view(), axis, index.view());
        }
        Ok(Grads::from([Some(dx)]))
    }

    fn held(&self) -> &dyn Kept {
        &self.index
    }
}

/// Checks every index against `len`, the length of the axis it indexes.
pub(super) fn check_indices(
    op: &'static str,
    index: &Tensor<'_, i64>,
    axis: usize,
    len: usize,
) -> Result<()> {
    let ids = index.view();
    match ids.iter().find(|&&i| i < 0 || i as u64 >= len as u64) {
        Some(&index) => Err(Error::IndexOutOfRange {
            op,
            index,
            axis,
            len,
        }),
        None => Ok(()),
    }
}

/// `axis` of `x` checked, and `ids`, 1-D, checked to name positions along it: the arguments of
/// the ops that take whole positions by id (`index_select`, `index_add`), their errors naming
/// `op`. Returns the axis.
pub(super) fn check_ids<T: DType>(
    op: &'static str,
    x: &Tensor<'_, T>,
    axis: impl Dim,
    ids: &Tensor<'_, i64>,
) -> Result<usize> {
    let axis = check_axis(op, x, axis)?;
    if ids.ndim() != 1 {
        return Err(Error::InvalidShape {
            op,
            shape: Shape::from(ids.shape()),
            reason: "the ids must be 1-D".into(),
        });
    }
    check_indices(op, ids, axis, x.shape()[axis])?;
    Ok(axis)
}

impl<'s, T: DType> Tensor<'s, T> {
    /// The positions `ids` of `axis`, in that order (PyTorch's `index_select`): `ids` is 1-D, and
    /// the result has `ids.len()` positions along `axis`. Gradients of repeated ids add up. Fails
    /// with [`Error::AxisOutOfRange`], [`Error::InvalidShape`] for ids that are not 1-D, or
    /// [`Error::IndexOutOfRange`] naming the first id past the axis.
    pub fn try_index_select(&self, axis: impl Dim, ids: &Tensor<'s, i64>) -> Result<Tensor<'s, T>> {
        self.select_rows("index_select", axis, ids)
    }

    /// `index_select`, its errors naming `op`.
    fn select_rows(
        &self,
        op: &'static str,
        axis: impl Dim,
        ids: &Tensor<'s, i64>,
    ) -> Result<Tensor<'s, T>> {
        let axis = check_ids(op, self, axis, ids)?;
        let ids = Saved::held(ids)?;
        autograd::run(IndexSelect { axis, ids }, &mut args([Arg::Borrowed(self)]))
    }

    panicking! {
        /// The positions `ids` of `axis`.
        pub fn index_select(&self, axis: impl Dim, ids: &Tensor<'s, i64>) -> Tensor<'s, T> = try_index_select;
    }

    /// The rows of this `[vocab, dim]` table for token `ids` of any shape: the result has shape
    /// `ids.shape() + [dim]` (PyTorch's `F.embedding`). Fails with [`Error::InvalidShape`] if the
    /// table is not 2-D, or [`Error::IndexOutOfRange`] naming the first id past the vocabulary.
    ///
    /// ```
    /// use tensorscope::{Param, Pool};
    /// let pool = Pool::with_max_memory_mb(16);
    /// let table = Param::from_slice(&pool, &[3, 2], &[0.0f32, 0.5, 1.0, 1.5, 2.0, 2.5]);
    /// pool.scope(|s| {
    ///     let ids = s.from_slice::<i64>(&[2, 2], &[2, 0, 1, 2]);
    ///     let x = s.bind(&table).embedding(&ids);
    ///     assert_eq!(x.shape(), &[2, 2, 2]);
    ///     assert_eq!(x.to_vec(), vec![2.0, 2.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5]);
    /// });
    /// ```
    pub fn try_embedding(&self, ids: &Tensor<'s, i64>) -> Result<Tensor<'s, T>> {
        let [_, dim] = *self.shape() else {
            return Err(Error::InvalidShape {
                op: "embedding",
                shape: Shape::from(self.shape()),
                reason: "the table must be 2-D ([vocab, dim])".into(),
            });
        };
        let mut shape = IxDyn(ids.shape()).insert_axis(Axis(ids.ndim()));
        shape[ids.ndim()] = dim;
        let rows = ids.try_reshape(&[ids.len()])?;
        self.select_rows("embedding", 0, &rows)?
            .try_reshape(shape.slice())
    }

    panicking! {
        /// The rows of this table for `ids`.
        pub fn embedding(&self, ids: &Tensor<'s, i64>) -> Tensor<'s, T> = try_embedding;
    }

    /// One value per position of `index` (PyTorch's `gather`): `out[.., i, ..] = self[.., index[..,
    /// i, ..], ..]` along `axis`. `index` has this tensor's rank and, on every other axis, at most
    /// its length; the result has `index`'s shape. Picking each row's label from `[n, classes]`
    /// scores is `gather(1, &labels.unsqueeze(1))`. Fails with [`Error::AxisOutOfRange`],
    /// [`Error::ShapeMismatch`] naming both shapes, or [`Error::IndexOutOfRange`].
    pub fn try_gather(&self, axis: impl Dim, index: &Tensor<'s, i64>) -> Result<Tensor<'s, T>> {
        let axis = check_axis("gather", self, axis)?;
        let fits = index.ndim() == self.ndim()
            && (0..self.ndim()).all(|d| d == axis || index.shape()[d] <= self.shape()[d]);
        if !fits {
            return Err(Error::ShapeMismatch {
                op: "gather",
                lhs: Shape::from(self.shape()),
                rhs: Shape::from(index.shape()),
                reason: format!(
                    "the index needs the same rank and, on every axis but {axis}, at most the \
                     input's length"
                ),
            });
        }
        check_indices("gather", index, axis, self.shape()[axis])?;
        let index = Saved::held(index)?;
        autograd::run(Gather { axis, index }, &mut args([Arg::Borrowed(self)]))
    }

    panicking! {
        /// One value per position of `index` along `axis`.
        pub fn gather(&self, axis: impl Dim, index: &Tensor<'s, i64>) -> Tensor<'s, T> = try_gather;
    }
}

impl<'s> Tensor<'s, i64> {
    /// Every id as a row of `num_classes` zeros with a 1 at the id (PyTorch's `F.one_hot`): ids of
    /// shape `[..]` give `[.., num_classes]`, as `i64`, in the ids' scope. Fails with
    /// [`Error::IndexOutOfRange`] naming the first id outside `0..num_classes`, and
    /// [`Error::DimensionOverflow`] for an output too large to address.
    pub fn try_one_hot(&self, num_classes: usize) -> Result<Tensor<'s, i64>> {
        check_indices("one_hot", self, self.ndim(), num_classes)?;
        let mut shape = IxDyn(self.shape()).insert_axis(Axis(self.ndim()));
        shape[self.ndim()] = num_classes;
        let overflow = || dimension_overflow("one_hot", "num_classes", num_classes, self.shape());
        check_addressable::<i64>(shape.slice(), overflow)?;
        let mut out = Tensor::try_rent_zeroed_in(&self.rents_in, shape.slice())?;
        if !out.is_empty() {
            work::visit(self.len());
            let rows = out.unique_slice_mut().chunks_exact_mut(num_classes);
            for (row, &id) in rows.zip(self.view().iter()) {
                row[id as usize] = 1;
            }
        }
        Ok(out)
    }

    panicking! {
        /// Every id as a row of `num_classes` zeros with a 1 at the id.
        pub fn one_hot(&self, num_classes: usize) -> Tensor<'s, i64> = try_one_hot;
    }
}

/// Which way values move between a tensor and the positions an index names.
#[derive(Clone, Copy)]
pub(super) enum Way {
    /// `dst[j] = src[at j]`: `index_select` and `gather`, the backward of the adds.
    Read,
    /// `dst[at j] += src[j]`, repeated positions adding up: `index_add` and `scatter_add`, the
    /// backward of the reads.
    Add,
}

/// Whole positions along `axis`, by 1-D ids: `dst[.., j, ..] = src[.., ids[j], ..]` (reading) or
/// `dst[.., ids[j], ..] += src[.., j, ..]` (adding).
pub(super) fn rows<T: DType>(
    way: Way,
    mut dst: ArrayViewMutD<'_, T>,
    src: ArrayViewD<'_, T>,
    axis: usize,
    ids: &[i64],
) {
    work::visit(ids.len());
    for (j, &id) in ids.iter().enumerate() {
        let (at, id) = (Axis(axis), id as usize);
        match way {
            Way::Read => dst.index_axis_mut(at, j).assign(&src.index_axis(at, id)),
            Way::Add => Zip::from(dst.index_axis_mut(at, id))
                .and(src.index_axis(at, j))
                .for_each(|d, &s| *d = d.add_gradient(s)),
        }
    }
}

/// One position per element of `index`, along `axis`: `dst[i] = src[.., index[i], ..]` (reading)
/// or `dst[.., index[i], ..] += src[i]` (adding), for every position `i` of `index`; the side
/// indexed by `i` is read or written over `index`'s shape only, the other on its lanes along
/// `axis` that `index`'s shape reaches.
pub(super) fn lanes<T: DType>(
    way: Way,
    mut dst: ArrayViewMutD<'_, T>,
    src: ArrayViewD<'_, T>,
    axis: usize,
    index: ArrayViewD<'_, i64>,
) {
    let (dst_whole, src_whole) = match way {
        Way::Read => (None, Some(axis)),
        Way::Add => (Some(axis), None),
    };
    let mut dst = dst.slice_each_axis_mut(cut_to(index.shape(), dst_whole));
    let src = src.slice_each_axis(cut_to(index.shape(), src_whole));
    work::visit(index.len() / index.shape()[axis].max(1));
    let zip = Zip::from(dst.lanes_mut(Axis(axis)))
        .and(index.lanes(Axis(axis)))
        .and(src.lanes(Axis(axis)));
    match way {
        Way::Read => zip.for_each(|mut d, i, s| {
            d.iter_mut().zip(i).for_each(|(d, &i)| *d = s[i as usize]);
        }),
        Way::Add => zip.for_each(|mut d, i, s| {
            i.iter().zip(s).for_each(|(&i, &s)| {
                let d = &mut d[i as usize];
                *d = d.add_gradient(s);
            })
        }),
    }
}

/// How to cut a view to the lengths of `shape` on every axis but `whole`: the lanes an index of
/// `shape` reads or writes along `whole`.
fn cut_to(
    shape: &[usize],
    whole: Option<usize>,
) -> impl Fn(ndarray::AxisDescription) -> Slice + '_ {
    move |d| match d.axis.index() {
        a if Some(a) == whole => Slice::from(..),
        a => Slice::from(..shape[a]),
    }
}
