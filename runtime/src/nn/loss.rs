//! Losses with their gradients, for the hand-written training path.

use super::NnError;
use crate::element::Element;
use crate::tensor::Tensor;

/// The value of `loss(pred)` and its gradient with respect to `pred`, through the op's own backward
/// rule (so the hand-written path and autograd share the loss gradient bit for bit).
fn value_and_grad<'s, T: Element>(
    pred: &Tensor<'s, T>,
    loss: impl FnOnce(&Tensor<'s, T>) -> crate::Result<Tensor<'s, T>>,
) -> Result<(T, Tensor<'s, T>), NnError> {
    let marked = pred.clone().requires_grad();
    let value = loss(&marked)?;
    let grads = value.backward()?;
    let grad = grads
        .of(&marked)
        .expect("a loss depends on its prediction")
        .clone();
    Ok((value.try_item()?, grad))
}

/// Mean squared error `mean((pred - target)^2)` and its gradient `2 (pred - target) / N` with
/// respect to `pred` (rented in `pred`'s scope): [`Tensor::try_mse`] for a training loop with
/// hand-written backward passes. Fails with [`crate::Error::ShapeMismatch`] if the shapes differ.
pub fn mse<'s, T: Element>(
    pred: &Tensor<'s, T>,
    target: &Tensor<'s, T>,
) -> Result<(T, Tensor<'s, T>), NnError> {
    value_and_grad(pred, |p| p.try_mse(target))
}

/// Softmax cross-entropy of `logits` (`[batch, classes]`) against class `labels`, averaged over the
/// batch, and its gradient `(softmax(logits) - onehot(labels)) / batch` with respect to `logits`:
/// [`Tensor::try_cross_entropy`] for a training loop with hand-written backward passes. Fails with
/// [`crate::Error::InvalidShape`] for logits that are not 2-D, [`crate::Error::LengthMismatch`] if
/// there is not one label per row, and [`crate::Error::LabelOutOfRange`].
pub fn softmax_cross_entropy<'s, T: Element>(
    logits: &Tensor<'s, T>,
    labels: &[usize],
) -> Result<(T, Tensor<'s, T>), NnError> {
    value_and_grad(logits, |l| l.try_cross_entropy(labels))
}
