//! Joining tensors.

use ndarray::{Axis, Slice};

use super::{check_addressable, check_axis, dimension_overflow, work};
use crate::autograd::{self, Recorder, Rule};
use crate::element::Element;
use crate::error::{or_panic, Error, Result, Shape};
use crate::scope::deeper;
use crate::tensor::Tensor;

impl<'s, T: Element> Tensor<'s, T> {
    /// Joins `tensors` along `axis`. All must have the same rank and the same lengths on every other
    /// axis. Fails with [`Error::NoInputs`] for an empty list, [`Error::AxisOutOfRange`] for a bad
    /// axis, and [`Error::ShapeMismatch`] naming the first two shapes that do not fit.
    pub fn try_concat(tensors: &[&Tensor<'s, T>], axis: usize) -> Result<Tensor<'s, T>> {
        let Some((first, rest)) = tensors.split_first() else {
            return Err(Error::NoInputs { op: "concat" });
        };
        check_axis("concat", first, axis)?;
        let mut joined = Some(first.shape()[axis]);
        let mut scope = &first.scope;
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
            scope = deeper(scope, &t.scope);
        }
        let overflow = || {
            let lengths = tensors.iter().map(|t| t.shape()[axis]);
            let total = lengths.fold(0usize, usize::saturating_add);
            dimension_overflow("concat", "joined length", total, first.shape())
        };
        let mut shape = first.shape().to_vec();
        shape[axis] = joined.ok_or_else(overflow)?;
        check_addressable::<T>(&shape, overflow)?;
        let mut out = Tensor::try_rent_in(scope, &shape)?;
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
            Rule::Concat(axis, tensors.iter().map(|t| t.shape()[axis]).collect())
        }))
    }

    /// A copy of `len` positions of `axis` from `start` (checked by the caller). Not recorded: for
    /// backward rules.
    pub(crate) fn try_narrow_copy(&self, axis: usize, start: usize, len: usize) -> Result<Self> {
        let mut shape = self.shape().to_vec();
        shape[axis] = len;
        let mut out = Tensor::try_rent_in(&self.scope, &shape)?;
        if !out.is_empty() {
            work::visit(1);
            let view = self.view();
            out.unique_view_mut()
                .assign(&view.slice_axis(Axis(axis), Slice::from(start..start + len)));
        }
        Ok(out)
    }

    /// Joins `tensors` along `axis`; see [`Tensor::try_concat`].
    ///
    /// # Panics
    /// If the shapes do not fit or the budget is exhausted, with the error's message.
    #[track_caller]
    pub fn concat(tensors: &[&Tensor<'s, T>], axis: usize) -> Tensor<'s, T> {
        or_panic(Tensor::try_concat(tensors, axis))
    }
}
