//! Joining tensors.

use ndarray::{Axis, Slice};

use crate::element::Element;
use crate::error::{or_panic, Error, Result, Shape};
use crate::scope::{deeper, rent_scope};
use crate::tensor::Tensor;

impl<'s, T: Element> Tensor<'s, T> {
    /// Joins `tensors` along `axis`. All must have the same rank and the same lengths on every other
    /// axis. Fails with [`Error::NoInputs`] for an empty list, [`Error::AxisOutOfRange`] for a bad
    /// axis, and [`Error::ShapeMismatch`] naming the first two shapes that do not fit.
    pub fn try_concat(tensors: &[&Tensor<'s, T>], axis: usize) -> Result<Tensor<'s, T>> {
        let Some((first, rest)) = tensors.split_first() else {
            return Err(Error::NoInputs { op: "concat" });
        };
        super::check_axis("concat", first, axis)?;
        let mut shape = first.shape().to_vec();
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
            // Saturating: an overflowing length is then refused by the rent as a size overflow.
            shape[axis] = shape[axis].saturating_add(t.shape()[axis]);
            scope = deeper(scope, &t.scope);
        }
        let mut out = Tensor::try_rent_in(&rent_scope(scope), &shape)?;
        let mut view = out.unique_view_mut();
        let mut start = 0;
        for t in tensors {
            let end = start + t.shape()[axis];
            view.slice_axis_mut(Axis(axis), Slice::from(start..end))
                .assign(&t.view());
            start = end;
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
