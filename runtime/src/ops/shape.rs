//! Shape ops: joining, stacking, slicing, splitting, permuting and adding or removing axes of
//! length 1. They move elements and do no arithmetic, so they work on every [`DType`]; slices and
//! permutations are copies into the pool (the pooled tensor is always contiguous), while
//! `squeeze`/`unsqueeze` are zero-copy aliases.

use ndarray::{Axis, Dimension, IxDyn, RemoveAxis, Slice};

use super::{check_addressable, check_axis, dimension_overflow, resolve_axis, work, Dim};
use crate::autograd::{self, Recorder, Rule};
use crate::element::DType;
use crate::error::{or_panic, Error, Result, Shape};
use crate::scope::deeper;
use crate::tensor::Tensor;

impl<'s, T: DType> Tensor<'s, T> {
    /// Joins `tensors` along `axis`. All must have the same rank and the same lengths on every other
    /// axis. Fails with [`Error::NoInputs`] for an empty list, [`Error::AxisOutOfRange`] for a bad
    /// axis, and [`Error::ShapeMismatch`] naming the first two shapes that do not fit.
    pub fn try_concat(tensors: &[&Tensor<'s, T>], axis: impl Dim) -> Result<Tensor<'s, T>> {
        let Some((first, rest)) = tensors.split_first() else {
            return Err(Error::NoInputs { op: "concat" });
        };
        let axis = check_axis("concat", first, axis)?;
        let mut joined = Some(first.shape()[axis]);
        let mut scope = &first.rents_in;
        for t in rest {
            let reason = if t.ndim() != first.ndim() {
                Some(format!("ranks differ ({} and {})", first.ndim(), t.ndim()))
            } else {
                (0..t.ndim())
                    .find(|&i| i != axis && t.shape()[i] != first.shape()[i])
                    .map(|i| {
                        format!(
                            "axis {i} differs ({} and {}); only the joined axis {axis} may",
                            first.shape()[i],
                            t.shape()[i]
                        )
                    })
            };
            if let Some(reason) = reason {
                return Err(Error::ShapeMismatch {
                    op: "concat",
                    lhs: Shape::from(first.shape()),
                    rhs: Shape::from(t.shape()),
                    reason,
                });
            }
            joined = joined.and_then(|len| len.checked_add(t.shape()[axis]));
            scope = deeper(scope, &t.rents_in);
        }
        let overflow = || {
            let lengths = tensors.iter().map(|t| t.shape()[axis]);
            let total = lengths.fold(0usize, usize::saturating_add);
            dimension_overflow("concat", "joined length", total, first.shape())
        };
        let mut shape = IxDyn(first.shape());
        shape[axis] = joined.ok_or_else(overflow)?;
        check_addressable::<T>(shape.slice(), overflow)?;
        let mut out = Tensor::try_rent_in(scope, shape.slice())?;
        if !out.is_empty() {
            let mut view = out.unique_view_mut();
            let mut start = 0;
            for t in tensors.iter().filter(|t| !t.is_empty()) {
                work::visit(1);
                let end = start + t.shape()[axis];
                view.slice_axis_mut(Axis(axis), Slice::from(start..end))
                    .assign(&t.view());
                start = end;
            }
        }
        Ok(autograd::finish(Recorder::of(tensors), out, |_| {
            let mut lengths = IxDyn::zeros(tensors.len());
            for (len, t) in lengths.slice_mut().iter_mut().zip(tensors) {
                *len = t.shape()[axis];
            }
            Rule::Concat(axis, lengths)
        }))
    }

    /// Joins `tensors` along `axis`; see [`Tensor::try_concat`].
    ///
    /// # Panics
    /// If the shapes do not fit or the budget is exhausted, with the error's message.
    #[track_caller]
    pub fn concat(tensors: &[&Tensor<'s, T>], axis: impl Dim) -> Tensor<'s, T> {
        or_panic(Tensor::try_concat(tensors, axis))
    }

    /// Stacks `tensors` along a new axis `axis` (`-1`: a new last axis): `n` tensors of shape `[a, b]`
    /// stacked along 1 give `[a, n, b]`. All must have the same shape. Fails with
    /// [`Error::NoInputs`], [`Error::AxisOutOfRange`] (the new axis may be 0 to the rank), or
    /// [`Error::ShapeMismatch`] naming the first two shapes that differ.
    pub fn try_stack(tensors: &[&Tensor<'s, T>], axis: impl Dim) -> Result<Tensor<'s, T>> {
        let Some(first) = tensors.first() else {
            return Err(Error::NoInputs { op: "stack" });
        };
        let axis = resolve_axis("stack", axis, first.ndim() + 1)?;
        if let Some(t) = tensors.iter().find(|t| t.shape() != first.shape()) {
            return Err(Error::ShapeMismatch {
                op: "stack",
                lhs: Shape::from(first.shape()),
                rhs: Shape::from(t.shape()),
                reason: "stacked tensors must have the same shape".into(),
            });
        }
        let lifted = tensors
            .iter()
            .map(|t| t.try_unsqueeze(axis))
            .collect::<Result<Vec<_>>>()?;
        Tensor::try_concat(&lifted.iter().collect::<Vec<_>>(), axis)
    }

    /// Stacks `tensors` along a new axis; see [`Tensor::try_stack`].
    ///
    /// # Panics
    /// If the shapes differ, the axis is out of range or the budget is exhausted, with the error's
    /// message.
    #[track_caller]
    pub fn stack(tensors: &[&Tensor<'s, T>], axis: impl Dim) -> Tensor<'s, T> {
        or_panic(Tensor::try_stack(tensors, axis))
    }

    /// A copy of positions `start..start + len` of `axis` (PyTorch's `narrow`, or `x[.., a..b, ..]`).
    /// Fails with [`Error::AxisOutOfRange`], or [`Error::InvalidShape`] if the range passes the axis's
    /// length.
    pub fn try_narrow(&self, axis: impl Dim, start: usize, len: usize) -> Result<Tensor<'s, T>> {
        let axis = check_axis("narrow", self, axis)?;
        let full = self.shape()[axis];
        if start.checked_add(len).is_none_or(|end| end > full) {
            return Err(Error::InvalidShape {
                op: "narrow",
                shape: Shape::from(self.shape()),
                reason: format!(
                    "positions {start}..{} of axis {axis} pass its length {full}",
                    start.saturating_add(len)
                ),
            });
        }
        let out = self.narrow_kernel(axis, start, len)?;
        Ok(autograd::finish(Recorder::of(&[self]), out, |_| {
            Rule::Narrow(axis, start, full)
        }))
    }

    /// A copy of positions `start..start + len` of `axis`; see [`Tensor::try_narrow`].
    ///
    /// # Panics
    /// If the range does not fit, with the error's message.
    #[track_caller]
    pub fn narrow(&self, axis: impl Dim, start: usize, len: usize) -> Tensor<'s, T> {
        or_panic(self.try_narrow(axis, start, len))
    }

    /// A copy of `len` positions of `axis` from `start` (checked by the caller), not recorded.
    pub(crate) fn narrow_kernel(&self, axis: usize, start: usize, len: usize) -> Result<Self> {
        let mut shape = IxDyn(self.shape());
        shape[axis] = len;
        let mut out = Tensor::try_rent_in(&self.rents_in, shape.slice())?;
        if !out.is_empty() {
            work::visit(1);
            let view = self.view();
            out.unique_view_mut()
                .assign(&view.slice_axis(Axis(axis), Slice::from(start..start + len)));
        }
        Ok(out)
    }

    /// Splits `axis` into pieces of `size` positions (the last may be shorter; one empty piece for
    /// an empty axis), as PyTorch's `split`. Fails with [`Error::AxisOutOfRange`], or [`Error::InvalidShape`] for a size of 0.
    pub fn try_split(&self, size: usize, axis: impl Dim) -> Result<Vec<Tensor<'s, T>>> {
        let axis = check_axis("split", self, axis)?;
        if size == 0 {
            return Err(Error::InvalidShape {
                op: "split",
                shape: Shape::from(self.shape()),
                reason: "pieces of size 0".into(),
            });
        }
        let full = self.shape()[axis];
        if full == 0 {
            // One empty piece, as PyTorch's `split`.
            return Ok(vec![self.try_narrow(axis, 0, 0)?]);
        }
        (0..full)
            .step_by(size)
            .map(|start| self.try_narrow(axis, start, size.min(full - start)))
            .collect()
    }

    /// Splits `axis` into pieces of `size` positions; see [`Tensor::try_split`].
    ///
    /// # Panics
    /// For a bad axis, a size of 0 or an exhausted budget, with the error's message.
    #[track_caller]
    pub fn split(&self, size: usize, axis: impl Dim) -> Vec<Tensor<'s, T>> {
        or_panic(self.try_split(size, axis))
    }

    /// Splits `axis` into `chunks` pieces of equal size (the last may be shorter, and there may be
    /// fewer when the axis is short; `chunks` empty pieces for an empty axis), as PyTorch's `chunk`: a fused `[b, t, 3c]` projection gives
    /// q, k and v with `chunk(3, -1)`. Fails with [`Error::AxisOutOfRange`], or
    /// [`Error::InvalidShape`] for 0 chunks.
    pub fn try_chunk(&self, chunks: usize, axis: impl Dim) -> Result<Vec<Tensor<'s, T>>> {
        let axis = check_axis("chunk", self, axis)?;
        if chunks == 0 {
            return Err(Error::InvalidShape {
                op: "chunk",
                shape: Shape::from(self.shape()),
                reason: "0 chunks".into(),
            });
        }
        match self.shape()[axis] {
            // `chunks` empty pieces, as PyTorch's `chunk`.
            0 => (0..chunks).map(|_| self.try_narrow(axis, 0, 0)).collect(),
            full => self.try_split(full.div_ceil(chunks), axis),
        }
    }

    /// Splits `axis` into `chunks` pieces; see [`Tensor::try_chunk`].
    ///
    /// # Panics
    /// For a bad axis, 0 chunks or an exhausted budget, with the error's message.
    #[track_caller]
    pub fn chunk(&self, chunks: usize, axis: impl Dim) -> Vec<Tensor<'s, T>> {
        or_panic(self.try_chunk(chunks, axis))
    }

    /// A copy with the axes in the order `axes` (a permutation of `0..rank`, negative axes allowed):
    /// axis `i` of the result is axis `axes[i]` of the input, as PyTorch's `permute`. Fails with
    /// [`Error::AxisOutOfRange`], or [`Error::InvalidShape`] if `axes` is not a permutation.
    pub fn try_permute<D: Dim>(&self, axes: &[D]) -> Result<Tensor<'s, T>> {
        let nd = self.ndim();
        // Held inline in `IxDyn`s (up to 4 axes), as shapes are.
        let mut resolved = IxDyn::zeros(axes.len());
        for (r, &a) in resolved.slice_mut().iter_mut().zip(axes) {
            *r = resolve_axis("permute", a, nd)?;
        }
        let mut seen = IxDyn::zeros(nd);
        let is_permutation = axes.len() == nd
            && resolved.slice().iter().all(|&a| {
                seen[a] += 1;
                seen[a] == 1
            });
        if !is_permutation {
            return Err(Error::InvalidShape {
                op: "permute",
                shape: Shape::from(self.shape()),
                reason: format!(
                    "axes {:?} are not a permutation of the {nd} axes",
                    resolved.slice()
                ),
            });
        }
        let view = self.view().permuted_axes(resolved.clone());
        let mut out = Tensor::try_rent_in(&self.rents_in, view.shape())?;
        if !out.is_empty() {
            work::visit(1);
            out.unique_view_mut().assign(&view);
        }
        Ok(autograd::finish(Recorder::of(&[self]), out, |_| {
            Rule::Permute(resolved)
        }))
    }

    /// A copy with the axes in the order `axes`; see [`Tensor::try_permute`].
    ///
    /// # Panics
    /// If `axes` is not a permutation of the axes, or the budget is exhausted, with the error's
    /// message.
    #[track_caller]
    pub fn permute<D: Dim>(&self, axes: &[D]) -> Tensor<'s, T> {
        or_panic(self.try_permute(axes))
    }

    /// A copy with axes `a` and `b` swapped (PyTorch's `transpose(a, b)`; `transpose(1, 2)` turns
    /// `[b, t, h, d]` into `[b, h, t, d]`). Fails with [`Error::AxisOutOfRange`].
    pub fn try_transpose(&self, a: impl Dim, b: impl Dim) -> Result<Tensor<'s, T>> {
        let a = check_axis("transpose", self, a)?;
        let b = check_axis("transpose", self, b)?;
        let mut axes = IxDyn::zeros(self.ndim());
        for (i, axis) in axes.slice_mut().iter_mut().enumerate() {
            *axis = i;
        }
        axes.slice_mut().swap(a, b);
        self.try_permute(axes.slice())
    }

    /// A copy with axes `a` and `b` swapped; see [`Tensor::try_transpose`].
    ///
    /// # Panics
    /// For a bad axis or an exhausted budget, with the error's message.
    #[track_caller]
    pub fn transpose(&self, a: impl Dim, b: impl Dim) -> Tensor<'s, T> {
        or_panic(self.try_transpose(a, b))
    }

    /// A copy with the last two axes swapped (`[.., m, n] -> [.., n, m]`), as candle's `t()` and
    /// PyTorch's `mT`. Fails with [`Error::InvalidShape`] for a rank below 2.
    pub fn try_t(&self) -> Result<Tensor<'s, T>> {
        if self.ndim() < 2 {
            return Err(Error::InvalidShape {
                op: "t",
                shape: Shape::from(self.shape()),
                reason: "needs at least two axes".into(),
            });
        }
        self.try_transpose(-2, -1)
    }

    /// A copy with the last two axes swapped; see [`Tensor::try_t`].
    ///
    /// # Panics
    /// For a rank below 2 or an exhausted budget, with the error's message.
    #[track_caller]
    pub fn t(&self) -> Tensor<'s, T> {
        or_panic(self.try_t())
    }

    /// A zero-copy alias with a new axis of length 1 at `axis` (0 to the rank; `-1` appends one).
    /// Fails with [`Error::AxisOutOfRange`].
    pub fn try_unsqueeze(&self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        let axis = resolve_axis("unsqueeze", axis, self.ndim() + 1)?;
        let shape = IxDyn(self.shape()).insert_axis(Axis(axis));
        self.try_reshape(shape.slice())
    }

    /// A zero-copy alias with a new axis of length 1; see [`Tensor::try_unsqueeze`].
    ///
    /// # Panics
    /// For a bad axis, with the error's message.
    #[track_caller]
    pub fn unsqueeze(&self, axis: impl Dim) -> Tensor<'s, T> {
        or_panic(self.try_unsqueeze(axis))
    }

    /// A zero-copy alias without `axis`, which must have length 1. Unlike PyTorch, which returns
    /// the tensor unchanged, squeezing an axis of another length is an error
    /// ([`Error::InvalidShape`]), since it is almost always a shape bug; also
    /// [`Error::AxisOutOfRange`].
    pub fn try_squeeze(&self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        let axis = check_axis("squeeze", self, axis)?;
        if self.shape()[axis] != 1 {
            return Err(Error::InvalidShape {
                op: "squeeze",
                shape: Shape::from(self.shape()),
                reason: format!("axis {axis} has length {}, not 1", self.shape()[axis]),
            });
        }
        self.try_reshape(IxDyn(self.shape()).remove_axis(Axis(axis)).slice())
    }

    /// A zero-copy alias without `axis`; see [`Tensor::try_squeeze`].
    ///
    /// # Panics
    /// If the axis does not exist or has a length other than 1, with the error's message.
    #[track_caller]
    pub fn squeeze(&self, axis: impl Dim) -> Tensor<'s, T> {
        or_panic(self.try_squeeze(axis))
    }

    /// A zero-copy alias of all the elements as one axis (`[len]`).
    pub fn flatten(&self) -> Tensor<'s, T> {
        or_panic(self.try_reshape(&[self.len()]))
    }
}
