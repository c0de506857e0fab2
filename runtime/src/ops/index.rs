//! Indexing by integer tensors: `index_select` and `embedding` (rows by id), `gather` (one
//! position per lane), `one_hot` (ids as rows of 0s and 1s). Every index is checked before any output is rented: an id past the table
//! is an [`Error::IndexOutOfRange`] naming it, never a panic or a wrong row.

use ndarray::{Axis, Dimension, IxDyn, Slice, Zip};

use super::{check_addressable, check_axis, dimension_overflow, work, Dim};
use crate::autograd::{self, args, Arg, Backward, Forward, Grads, Held, Op, Saved};
use crate::element::DType;
use crate::error::{panicking, Error, Result, Shape};
use crate::tensor::Tensor;

/// `index_select` along an axis, by ids (checked).
#[derive(Clone)]
struct IndexSelect {
    axis: usize,
    ids: Saved<i64>,
}

impl<T: DType> Op<T> for IndexSelect {
    /// The length of the input's axis.
    type Saved = usize;

    fn name(&self) -> &'static str {
        "index_select"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved>)> {
        let (x, axis, ids) = (cx.input(0), self.axis, self.ids.as_slice());
        let mut shape = IxDyn(x.shape());
        shape[axis] = ids.len();
        let mut out = cx.rent(shape.slice())?;
        if !out.is_empty() {
            work::visit(ids.len());
            let (src, mut dst) = (x.view(), out.unique_view_mut());
            for (j, &id) in ids.iter().enumerate() {
                dst.index_axis_mut(Axis(axis), j)
                    .assign(&src.index_axis(Axis(axis), id as usize));
            }
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
            let (src, mut dst) = (g.view(), dx.unique_view_mut());
            for (j, &id) in self.ids.as_slice().iter().enumerate() {
                Zip::from(dst.index_axis_mut(Axis(axis), id as usize))
                    .and(src.index_axis(Axis(axis), j))
                    .for_each(|d, &g| *d = d.add_gradient(g));
            }
        }
        Ok(Grads::from([Some(dx)]))
    }

    fn held(&self) -> &dyn Held {
        &self.ids
    }
}

/// `gather` along an axis, by an index (checked).
#[derive(Clone)]
struct Gather {
    axis: usize,
    index: Saved<i64>,
}

impl<T: DType> Op<T> for Gather {
    /// The input's shape.
    type Saved = IxDyn;

    fn name(&self) -> &'static str {
        "gather"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved>)> {
        let (x, axis, index) = (cx.input(0), self.axis, &self.index.0);
        let mut out = cx.rent(index.shape())?;
        if !out.is_empty() {
            let src = x.view();
            let src = src.slice_each_axis(cut_to(index.shape(), axis));
            let idx = index.view();
            let mut dst = out.unique_view_mut();
            work::visit(idx.len() / index.shape()[axis].max(1));
            Zip::from(dst.lanes_mut(Axis(axis)))
                .and(idx.lanes(Axis(axis)))
                .and(src.lanes(Axis(axis)))
                .for_each(|mut o, i, s| {
                    o.iter_mut().zip(i).for_each(|(o, &i)| *o = s[i as usize]);
                });
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
            let (src, idx) = (g.view(), index.view());
            let mut dst = dx.unique_view_mut();
            let mut dst = dst.slice_each_axis_mut(cut_to(index.shape(), axis));
            Zip::from(dst.lanes_mut(Axis(axis)))
                .and(idx.lanes(Axis(axis)))
                .and(src.lanes(Axis(axis)))
                .for_each(|mut d, i, g| {
                    i.iter().zip(g).for_each(|(&i, &g)| {
                        let d = &mut d[i as usize];
                        *d = d.add_gradient(g);
                    })
                });
        }
        Ok(Grads::from([Some(dx)]))
    }

    fn held(&self) -> &dyn Held {
        &self.index
    }
}

/// Checks every index against `len`, the length of the axis it indexes.
fn check_indices(op: &'static str, index: &Tensor<'_, i64>, axis: usize, len: usize) -> Result<()> {
    match index
        .as_slice()
        .iter()
        .find(|&&i| i < 0 || i as u64 >= len as u64)
    {
        Some(&index) => Err(Error::IndexOutOfRange {
            op,
            index,
            axis,
            len,
        }),
        None => Ok(()),
    }
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
        let axis = check_axis(op, self, axis)?;
        if ids.ndim() != 1 {
            return Err(Error::InvalidShape {
                op,
                shape: Shape::from(ids.shape()),
                reason: "the ids must be 1-D".into(),
            });
        }
        check_indices(op, ids, axis, self.shape()[axis])?;
        let ids = Saved(ids.saved());
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
    /// use tensorscope_runtime::{Param, Pool};
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
        let index = Saved(index.saved());
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
            for (row, &id) in rows.zip(self.as_slice()) {
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

/// How to cut a view, on every axis but `axis`, to the lengths of `shape`: the lanes a gather of
/// an index of `shape` reads (and its backward writes).
fn cut_to(shape: &[usize], axis: usize) -> impl Fn(ndarray::AxisDescription) -> Slice + '_ {
    move |d| match d.axis.index() {
        a if a == axis => Slice::from(..),
        a => Slice::from(..shape[a]),
    }
}
