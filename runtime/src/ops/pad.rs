//! Padding the last axes, in PyTorch's `F.pad` order: `pads` holds `(before, after)` pairs, the
//! first pair for the last axis, the next for the one before it. A constant pad joins blocks of
//! the value to the tensor (`concat`); a reflection selects the mirrored positions
//! (`index_select`), so each differentiates, and replays under `#[checkpoint]`, as those ops do:
//! the reflected positions' gradients add up on the positions they mirror.

use ndarray::{Dimension, IxDyn};

use super::{check_addressable, dimension_overflow};
use crate::element::DType;
use crate::error::{panicking, Error, Result};
use crate::tensor::Tensor;

impl<'s, T: DType> Tensor<'s, T> {
    /// The tensor with `value` before and after its last axes (PyTorch's `F.pad(x, pads,
    /// value=value)`): `pads = [1, 2]` puts one `value` before and two after along the last axis,
    /// `[1, 1, 2, 2]` also two before and after along the axis before it. Fails with
    /// [`Error::InvalidArgument`] for an odd count of pads or more pairs than axes, and
    /// [`Error::DimensionOverflow`] for an output too large to address.
    pub fn try_pad(&self, pads: &[usize], value: T) -> Result<Tensor<'s, T>> {
        self.padded("pad", pads, |x, axis, before, after| {
            let block = |len: usize| {
                let mut shape = IxDyn(x.shape());
                shape[axis] = len;
                let mut block = Tensor::try_rent_in(&x.rents_in, shape.slice())?;
                block.unique_slice_mut().fill(value);
                Ok::<_, Error>(block)
            };
            Tensor::try_concat(&[&block(before)?, &x, &block(after)?], axis)
        })
    }

    panicking! {
        /// The tensor with `value` before and after its last axes.
        pub fn pad(&self, pads: &[usize], value: T) -> Tensor<'s, T> = try_pad;
    }

    /// The tensor padded with its own values mirrored at each edge, the edge itself not repeated
    /// (PyTorch's `F.pad(x, pads, mode="reflect")`, on any number of axes): `[1, 2, 3]` padded by
    /// `[2, 1]` is `[3, 2, 1, 2, 3, 2]`. `pads` is read as [`Tensor::try_pad`] reads it. The
    /// gradients of the mirrored positions add up on the positions they mirror. Fails with
    /// [`Error::InvalidArgument`] for an odd count of pads, more pairs than axes, or a pad not
    /// shorter than its axis (a reflection needs that many positions beyond the edge), and
    /// [`Error::DimensionOverflow`] for an output too large to address.
    pub fn try_pad_reflect(&self, pads: &[usize]) -> Result<Tensor<'s, T>> {
        self.padded("pad_reflect", pads, |x, axis, before, after| {
            let len = x.shape()[axis];
            if before.max(after) >= len {
                return Err(Error::InvalidArgument {
                    op: "pad_reflect",
                    arg: "pads",
                    reason: format!(
                        "{before} before and {after} after axis {axis} of length {len}: a \
                         reflection pads less than the length"
                    ),
                });
            }
            let mut ids = Tensor::<i64>::try_rent_in(&x.rents_in, &[before + len + after])?;
            for (j, id) in ids.unique_slice_mut().iter_mut().enumerate() {
                // The position `j - before` mirrored into `0..len`.
                let at = (j as i64 - before as i64).abs();
                let last = len as i64 - 1;
                *id = last - (last - at).abs();
            }
            x.try_index_select(axis, &ids)
        })
    }

    panicking! {
        /// The tensor padded with its own values mirrored at each edge.
        pub fn pad_reflect(&self, pads: &[usize]) -> Tensor<'s, T> = try_pad_reflect;
    }

    /// The tensor padded by `pad_axis(x, axis, before, after)` for every pair of `pads` (checked,
    /// and the output's size with them) that pads anything, from the last axis back.
    fn padded(
        &self,
        op: &'static str,
        pads: &[usize],
        pad_axis: impl Fn(Tensor<'s, T>, usize, usize, usize) -> Result<Tensor<'s, T>>,
    ) -> Result<Tensor<'s, T>> {
        if !pads.len().is_multiple_of(2) || pads.len() / 2 > self.ndim() {
            return Err(Error::InvalidArgument {
                op,
                arg: "pads",
                reason: format!(
                    "{} values for a tensor of rank {}: a (before, after) pair per axis, from the \
                     last, at most one per axis",
                    pads.len(),
                    self.ndim()
                ),
            });
        }
        let mut shape = IxDyn(self.shape());
        for (i, pair) in pads.chunks_exact(2).enumerate() {
            let axis = self.ndim() - 1 - i;
            let overflow = || dimension_overflow(op, "padding", pair[0].max(pair[1]), self.shape());
            shape[axis] = (shape[axis].checked_add(pair[0]))
                .and_then(|len| len.checked_add(pair[1]))
                .ok_or_else(overflow)?;
        }
        let total = pads.iter().fold(0usize, |t, &p| t.saturating_add(p));
        let overflow = || dimension_overflow(op, "padding", total, self.shape());
        check_addressable::<T>(shape.slice(), overflow)?;
        let mut x = self.clone();
        for (i, pair) in pads.chunks_exact(2).enumerate() {
            if pair != [0, 0] {
                x = pad_axis(x, self.ndim() - 1 - i, pair[0], pair[1])?;
            }
        }
        Ok(x)
    }
}
