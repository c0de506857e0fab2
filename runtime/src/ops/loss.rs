//! Losses: a prediction and a target in, one value out, with their backward rules.

use super::Operand;
use crate::autograd::{self, Recorder, Rule};
use crate::element::Element;
use crate::error::{or_panic, Error, Result, Shape};
use crate::scope::{deeper, State};
use crate::tensor::Tensor;
use crate::TensorOps;

impl<'s, T: Element> Tensor<'s, T> {
    /// Mean squared error `mean((self - target)^2)` against a tensor or a [`Param`](crate::Param)
    /// of the same shape, as a tensor of one value (shape `[]`). Differentiable in both. Fails with
    /// [`Error::ShapeMismatch`] if the shapes differ.
    pub fn try_mse(&self, target: &impl Operand<'s, T>) -> Result<Tensor<'s, T>> {
        let target = &*target.bind_beside(self);
        if self.shape() != target.shape() {
            return Err(Error::ShapeMismatch {
                op: "mse",
                lhs: Shape::from(self.shape()),
                rhs: Shape::from(target.shape()),
                reason: "prediction and target must have the same shape".into(),
            });
        }
        let recorder = Recorder::of(&[self, target]);
        let diff = autograd::with_mode(autograd::Mode::Off, || self.try_sub(target))?;
        let n = self.len();
        let total = diff.as_slice().iter().map(|&d| d * d).sum::<T>();
        let loss = scalar_tensor(&diff, total / T::from_f64(n.max(1) as f64))?;
        Ok(autograd::finish(recorder, loss, |_| {
            Rule::Mse(diff.saved(), n)
        }))
    }

    /// [`Tensor::try_mse`], panicking with the error's message.
    #[track_caller]
    pub fn mse(&self, target: &impl Operand<'s, T>) -> Tensor<'s, T> {
        or_panic(self.try_mse(target))
    }

    /// [`Tensor::try_cross_entropy`], panicking with the error's message.
    #[track_caller]
    pub fn cross_entropy(&self, labels: &[usize]) -> Tensor<'s, T> {
        or_panic(self.try_cross_entropy(labels))
    }

    /// Softmax cross-entropy with the labels as a 1-D integer tensor, one per row (next-token ids:
    /// `ids.narrow(1, 1, t - 1).flatten()`); otherwise as [`Tensor::try_cross_entropy`]. A
    /// negative label is [`Error::IndexOutOfRange`], labels that are not 1-D
    /// [`Error::InvalidShape`]. The labels are kept for backward as an alias, not a copy. The loss
    /// and what it keeps rent in the deeper of the two tensors' scopes, as every op's output does.
    pub fn try_cross_entropy_ids(&self, labels: &Tensor<'s, i64>) -> Result<Tensor<'s, T>> {
        if labels.ndim() != 1 {
            return Err(Error::InvalidShape {
                op: "cross_entropy",
                shape: Shape::from(labels.shape()),
                reason: "the labels must be 1-D, one per row".into(),
            });
        }
        let classes = self.shape().last().copied().unwrap_or(0);
        if let Some(&l) = labels.as_slice().iter().find(|&&l| l < 0) {
            return Err(Error::IndexOutOfRange {
                op: "cross_entropy",
                index: l,
                axis: 1,
                len: classes,
            });
        }
        let ids = labels.as_slice().iter().map(|&l| l as usize);
        self.check_cross_entropy(labels.len(), ids)?;
        self.cross_entropy_of(labels.saved(), deeper(&self.rents_in, &labels.rents_in))
    }

    /// Softmax cross-entropy with integer-tensor labels; see [`Tensor::try_cross_entropy_ids`].
    ///
    /// # Panics
    /// For bad shapes or labels, with the error's message.
    #[track_caller]
    pub fn cross_entropy_ids(&self, labels: &Tensor<'s, i64>) -> Tensor<'s, T> {
        or_panic(self.try_cross_entropy_ids(labels))
    }

    /// Softmax cross-entropy of logits `[batch, classes]` against one class label per row, averaged
    /// over the batch: `-mean(log_softmax(self)[row, label])`, as a tensor of one value. Fails with
    /// [`Error::InvalidShape`] for logits that are not 2-D, [`Error::LengthMismatch`] if there is
    /// not one label per row, and [`Error::LabelOutOfRange`].
    pub fn try_cross_entropy(&self, labels: &[usize]) -> Result<Tensor<'s, T>> {
        self.check_cross_entropy(labels.len(), labels.iter().copied())?;
        // Kept for backward in a pooled tensor: in range, so they fit an `i64`.
        let mut ids = Tensor::try_rent_in(&self.rents_in, &[labels.len()])?;
        for (id, &label) in ids.unique_slice_mut().iter_mut().zip(labels) {
            *id = label as i64;
        }
        self.cross_entropy_of(ids, &self.rents_in)
    }

    /// Checks logits `self` against `count` labels: 2-D, one label per row, each below the number
    /// of classes.
    fn check_cross_entropy(&self, count: usize, labels: impl Iterator<Item = usize>) -> Result<()> {
        let &[batch, classes] = self.shape() else {
            return Err(Error::InvalidShape {
                op: "cross_entropy",
                shape: Shape::from(self.shape()),
                reason: "logits must be [batch, classes]".into(),
            });
        };
        if count != batch {
            return Err(Error::LengthMismatch {
                op: "cross_entropy",
                shape: Shape::from(self.shape()),
                expected: batch,
                got: count,
            });
        }
        match labels.enumerate().find(|&(_, l)| l >= classes) {
            Some((row, label)) => Err(Error::LabelOutOfRange {
                op: "cross_entropy",
                row,
                label,
                classes,
            }),
            None => Ok(()),
        }
    }

    /// The loss of logits `[batch, classes]` against `labels`, checked: one per row, in range;
    /// rented in `scope`.
    fn cross_entropy_of(
        &self,
        labels: Tensor<'static, i64>,
        scope: &State,
    ) -> Result<Tensor<'s, T>> {
        let (batch, classes) = (self.shape()[0], self.shape()[1]);
        let recorder = Recorder::of(&[self]);
        let logits = self.alias_in(scope);
        let log_probs = autograd::with_mode(autograd::Mode::Off, || logits.try_log_softmax(1))?;
        let n = T::from_f64(batch.max(1) as f64);
        let picked = labels
            .as_slice()
            .iter()
            .enumerate()
            .map(|(row, &label)| log_probs.as_slice()[row * classes + label as usize])
            .sum::<T>();
        let loss = scalar_tensor(&log_probs, -picked / n)?;
        Ok(autograd::finish(recorder, loss, |_| {
            Rule::CrossEntropy(log_probs.saved(), labels)
        }))
    }
}

/// A tensor of shape `[]` holding `value`, in `like`'s scope.
fn scalar_tensor<'s, T: Element>(like: &Tensor<'s, T>, value: T) -> Result<Tensor<'s, T>> {
    let mut t = Tensor::try_rent_in(&like.rents_in, &[])?;
    t.unique_slice_mut()[0] = value;
    Ok(t)
}

#[cfg(test)]
mod tests {
    use crate::Pool;

    #[test]
    fn losses_are_values_of_shape_rank_0() {
        let pool = Pool::with_max_memory_mb(8);
        pool.scope(|s| {
            let p = s.from_slice::<f64>(&[2], &[1.0, 3.0]);
            let mse = p.try_mse(&s.zeros::<f64>(&[2])).unwrap();
            assert_eq!((mse.shape(), mse.item()), (&[][..], 5.0));
            let logits = s.zeros::<f64>(&[2, 4]);
            let ce = logits.try_cross_entropy(&[0, 3]).unwrap();
            assert!((ce.item() - 4f64.ln()).abs() < 1e-15);
        });
    }
}
