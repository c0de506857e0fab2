//! Losses with their gradients.

use ndarray::{Axis, Zip};

use super::NnError;
use crate::element::Element;
use crate::error::{Error, Shape};
use crate::tensor::Tensor;
use crate::TensorOps;

/// Mean squared error `mean((pred - target)^2)` and its gradient `2 (pred - target) / N` with
/// respect to `pred` (rented in `pred`'s scope). Fails with [`Error::ShapeMismatch`] if the shapes
/// differ.
pub fn mse<'s, T: Element>(
    pred: &Tensor<'s, T>,
    target: &Tensor<'s, T>,
) -> Result<(T, Tensor<'s, T>), NnError> {
    if pred.shape() != target.shape() {
        return Err(Error::ShapeMismatch {
            op: "mse",
            lhs: Shape::from(pred.shape()),
            rhs: Shape::from(target.shape()),
            reason: "prediction and target must have the same shape".into(),
        }
        .into());
    }
    let n = T::from_f64(pred.len().max(1) as f64);
    let diff = pred.try_zip_map(target, |p, t| p - t)?;
    let loss = diff.as_slice().iter().map(|&d| d * d).sum::<T>() / n;
    let scale = T::from_f64(2.0) / n;
    Ok((loss, diff.try_map(|d| d * scale)?))
}

/// Softmax cross-entropy of `logits` (`[batch, classes]`) against class `labels`, averaged over the
/// batch, and its gradient `(softmax(logits) - onehot(labels)) / batch` with respect to `logits`.
/// Fails with [`Error::InvalidShape`] for logits that are not 2-D, [`Error::LengthMismatch`] if
/// there is not one label per row, and [`NnError::LabelOutOfRange`].
pub fn softmax_cross_entropy<'s, T: Element>(
    logits: &Tensor<'s, T>,
    labels: &[usize],
) -> Result<(T, Tensor<'s, T>), NnError> {
    let &[batch, classes] = logits.shape() else {
        return Err(Error::InvalidShape {
            op: "softmax_cross_entropy",
            shape: Shape::from(logits.shape()),
            reason: "logits must be [batch, classes]".into(),
        }
        .into());
    };
    if labels.len() != batch {
        return Err(Error::LengthMismatch {
            op: "softmax_cross_entropy",
            shape: Shape::from(logits.shape()),
            expected: batch,
            got: labels.len(),
        }
        .into());
    }
    if let Some((row, &label)) = labels.iter().enumerate().find(|(_, &l)| l >= classes) {
        return Err(NnError::LabelOutOfRange {
            row,
            label,
            classes,
        });
    }
    let log_probs = logits.try_log_softmax(1)?;
    let n = T::from_f64(batch.max(1) as f64);
    let loss = -labels
        .iter()
        .enumerate()
        .map(|(row, &label)| log_probs.as_slice()[row * classes + label])
        .sum::<T>()
        / n;
    let mut grad = log_probs.try_map(|lp| lp.exp() / n)?;
    let mut view = grad.try_view_mut()?;
    Zip::from(view.axis_iter_mut(Axis(0)))
        .and(labels)
        .for_each(|mut row, &label| row[label] = row[label] - T::one() / n);
    Ok((loss, grad))
}
