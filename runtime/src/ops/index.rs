//! Indexing by integer tensors: `index_select` and `embedding` (rows by id), `gather` (one
//! position per lane). Every index is checked before any output is rented: an id past the table
//! is an [`Error::IndexOutOfRange`] naming it, never a panic or a wrong row.

use ndarray::{Axis, Dimension, IxDyn, Slice, Zip};

use super::{check_axis, work, Dim};
use crate::autograd::{self, Recorder, Rule};
use crate::element::DType;
use crate::error::{or_panic, Error, Result, Shape};
use crate::scope::deeper;
use crate::tensor::Tensor;

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
        let len = self.shape()[axis];
        check_indices(op, ids, axis, len)?;
        let mut shape = IxDyn(self.shape());
        shape[axis] = ids.len();
        let mut out = Tensor::try_rent_in(deeper(&self.rents_in, &ids.rents_in), shape.slice())?;
        if !out.is_empty() {
            work::visit(ids.len());
            let (src, mut dst) = (self.view(), out.unique_view_mut());
            for (j, &id) in ids.as_slice().iter().enumerate() {
                dst.index_axis_mut(Axis(axis), j)
                    .assign(&src.index_axis(Axis(axis), id as usize));
            }
        }
        Ok(autograd::finish(Recorder::of(&[self]), out, |_| {
            Rule::IndexSelect(axis, ids.saved(), len)
        }))
    }

    /// The positions `ids` of `axis`; see [`Tensor::try_index_select`].
    ///
    /// # Panics
    /// For a bad axis or id, or an exhausted budget, with the error's message.
    #[track_caller]
    pub fn index_select(&self, axis: impl Dim, ids: &Tensor<'s, i64>) -> Tensor<'s, T> {
        or_panic(self.try_index_select(axis, ids))
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

    /// The rows of this table for `ids`; see [`Tensor::try_embedding`].
    ///
    /// # Panics
    /// For a table that is not 2-D, an id past the vocabulary, or an exhausted budget, with the
    /// error's message.
    #[track_caller]
    pub fn embedding(&self, ids: &Tensor<'s, i64>) -> Tensor<'s, T> {
        or_panic(self.try_embedding(ids))
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
        let len = self.shape()[axis];
        check_indices("gather", index, axis, len)?;
        let mut out = Tensor::try_rent_in(deeper(&self.rents_in, &index.rents_in), index.shape())?;
        if !out.is_empty() {
            let src = self.view();
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
        Ok(autograd::finish(Recorder::of(&[self]), out, |_| {
            Rule::Gather(axis, index.saved(), IxDyn(self.shape()))
        }))
    }

    /// One value per position of `index` along `axis`; see [`Tensor::try_gather`].
    ///
    /// # Panics
    /// For a bad axis, shape or index, or an exhausted budget, with the error's message.
    #[track_caller]
    pub fn gather(&self, axis: impl Dim, index: &Tensor<'s, i64>) -> Tensor<'s, T> {
        or_panic(self.try_gather(axis, index))
    }
}

/// How to cut a view, on every axis but `axis`, to the lengths of `shape`: the lanes a gather of
/// an index of `shape` reads (and its backward writes).
pub(crate) fn cut_to(
    shape: &[usize],
    axis: usize,
) -> impl Fn(ndarray::AxisDescription) -> Slice + '_ {
    move |d| match d.axis.index() {
        a if a == axis => Slice::from(..),
        a => Slice::from(..shape[a]),
    }
}
