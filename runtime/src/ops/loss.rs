//! Losses: a prediction and a target in, one value out, with their backward rules.

use super::Operand;
use crate::autograd::{self, args, Arg, Backward, Forward, Grads, Kept, Op, Saved};
use crate::element::Element;
use crate::error::{panicking, Error, Result, Shape};
use crate::tensor::Tensor;
use crate::TensorOps;

/// Mean squared error.
#[derive(Debug, Clone, Copy)]
struct Mse;

impl<T: Element> Op<T> for Mse {
    /// `prediction - target`.
    type Saved<'s> = Saved<'s, T>;

    fn name(&self) -> &'static str {
        "mse"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let diff = cx.input(0).try_sub(cx.input(1))?.with_scope(cx.scope());
        let n = diff.len();
        let total = diff.slice().iter().map(|&d| d * d).sum::<T>();
        let loss = scalar_tensor(cx, total / T::from_f64(n.max(1) as f64))?;
        Ok((loss, cx.saving().then(|| cx.save(&diff))))
    }

    /// `2 (prediction - target) / n` times the upstream gradient (1 for a loss), as `nn::mse` has
    /// always scaled; its negation for the target.
    fn backward<'b>(
        &self,
        diff: Saved<'b, T>,
        g: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
        let n = diff.0.slice().len();
        let scale = T::from_f64(2.0) / T::from_f64(n.max(1) as f64) * g.slice()[0];
        let dp = diff.get(cx).try_map(
            #[inline(always)]
            |d| d * scale,
        )?;
        let dt = cx
            .needs(1)
            .then(|| {
                (&dp).try_map(
                    #[inline(always)]
                    |v| -v,
                )
            })
            .transpose()?;
        Ok(Grads::from([cx.needs(0).then_some(dp), dt]))
    }
}

/// Softmax cross-entropy of logits `[batch, classes]` against one label per row (held, checked).
#[derive(Clone)]
struct CrossEntropy {
    labels: Saved<'static, i64>,
}

impl<T: Element> Op<T> for CrossEntropy {
    /// The log-probabilities.
    type Saved<'s> = Saved<'s, T>;

    fn name(&self) -> &'static str {
        "cross_entropy"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let logits = cx.input(0);
        let (batch, classes) = (logits.shape()[0], logits.shape()[1]);
        // Rented in the op's scope, which the labels' may make deeper than the logits'.
        let log_probs = logits.alias_in(cx.scope()).try_log_softmax(1)?;
        let n = T::from_f64(batch.max(1) as f64);
        let picked = self
            .labels
            .0
            .slice()
            .iter()
            .enumerate()
            .map(|(row, &label)| log_probs.slice()[row * classes + label as usize])
            .sum::<T>();
        let loss = scalar_tensor(cx, -picked / n)?;
        Ok((loss, cx.saving().then(|| cx.save(&log_probs))))
    }

    /// `(softmax - one_hot(label)) / n` times the upstream gradient.
    fn backward<'b>(
        &self,
        log_probs: Saved<'b, T>,
        g: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
        let upstream = g.slice()[0];
        let labels = self.labels.0.slice();
        let n = T::from_f64(labels.len().max(1) as f64);
        let mut grad = log_probs.get(cx).try_map(
            #[inline(always)]
            |lp| lp.exp_kernel() / n,
        )?;
        let classes = grad.shape().get(1).copied().unwrap_or(1);
        let rows = grad.unique_slice_mut();
        for (row, &label) in labels.iter().enumerate() {
            let v = &mut rows[row * classes + label as usize];
            *v = *v - T::one() / n;
        }
        let grad = grad.try_map(
            #[inline(always)]
            |v| v * upstream,
        )?;
        Ok(Grads::from([Some(grad)]))
    }

    fn held(&self) -> &dyn Kept {
        &self.labels
    }
}

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
        autograd::run(Mse, &mut args([Arg::Borrowed(self), Arg::Borrowed(target)]))
    }

    panicking! {
        /// Mean squared error against a tensor or a parameter.
        pub fn mse(&self, target: &impl Operand<'s, T>) -> Tensor<'s, T> = try_mse;
        /// Softmax cross-entropy against one label per row.
        pub fn cross_entropy(&self, labels: &[usize]) -> Tensor<'s, T> = try_cross_entropy;
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
        let values = labels.view();
        if let Some(&l) = values.iter().find(|&&l| l < 0) {
            return Err(Error::IndexOutOfRange {
                op: "cross_entropy",
                index: l,
                axis: 1,
                len: classes,
            });
        }
        let ids = values.iter().map(|&l| l as usize);
        self.check_cross_entropy(labels.len(), ids)?;
        let labels = Saved::held(labels)?;
        autograd::run(CrossEntropy { labels }, &mut args([Arg::Borrowed(self)]))
    }

    panicking! {
        /// Softmax cross-entropy with integer-tensor labels.
        pub fn cross_entropy_ids(&self, labels: &Tensor<'s, i64>) -> Tensor<'s, T> = try_cross_entropy_ids;
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
        let labels = Saved::held(&ids)?;
        autograd::run(CrossEntropy { labels }, &mut args([Arg::Borrowed(self)]))
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
}

/// A tensor of shape `[]` holding `value`, in the op's scope.
fn scalar_tensor<'s, T: Element>(cx: &Forward<'_, 's, T>, value: T) -> Result<Tensor<'s, T>> {
    let mut t = cx.rent(&[])?;
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
