//! One training step, plain or checkpointed.

use std::cell::RefCell;
use std::rc::Rc;

use super::{Cache, Layer, NnError, Optimizer, ParamStore, Sequential};
use crate::autograd::Gradients;
use crate::checkpoint::{Checkpointer, Policy};
use crate::element::Element;
use crate::tensor::Tensor;

/// What a training step did.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub struct StepReport<T: Element = f32> {
    /// The loss before the update.
    pub loss: T,
    /// Bytes of the activations the checkpointed forward stored (0 without checkpointing).
    pub stored_bytes: usize,
    /// Layer forwards run again in the backward pass (0 without checkpointing).
    pub recomputed_layers: usize,
}

/// Runs the model's layers without caching, keeping the first error.
fn forward_no_cache<'s, T: Element>(
    layer: &dyn Layer<T>,
    params: &ParamStore<T>,
    x: &Tensor<'s, T>,
    failure: &mut Option<NnError>,
) -> Tensor<'s, T> {
    match layer.forward(params, x, None) {
        Ok(y) => y,
        Err(e) => {
            failure.get_or_insert(e);
            x.clone()
        }
    }
}

/// One step: [`backward_step`] into `grads`, then `optimizer` applies them to `params`, then
/// `grads` is zeroed for the next step ([`Gradients::zero`]). Keep one `Gradients` (of a scope
/// around the training loop) across steps: after the first step, the gradients need no new memory.
///
/// Fails with the first layer, loss or optimizer error, or a checkpointer error (e.g. a NaN in an
/// activation being stored).
pub fn train_step<'s, T: Element>(
    model: &Sequential<T>,
    params: &mut ParamStore<T>,
    optimizer: &mut dyn Optimizer<T>,
    grads: &mut Gradients<'_, T>,
    input: &Tensor<'s, T>,
    loss: impl FnOnce(&Tensor<'s, T>) -> Result<(T, Tensor<'s, T>), NnError>,
    checkpointer: Option<&mut Checkpointer<T>>,
) -> Result<StepReport<T>, NnError> {
    let report = backward_step(model, params, grads, input, loss, checkpointer)?;
    optimizer.step(params, grads)?;
    grads.zero()?;
    Ok(report)
}

/// The forward and backward of a step through the layers' hand-written backward passes: returns
/// the loss (`loss` gives its value and its gradient with respect to the output) and adds the
/// gradients of the parameters into `grads`.
///
/// Without a checkpointer the forward caches what every layer's backward needs. With one, the
/// forward over the model's top-level layers caches nothing and stores only the inputs the policy
/// picks; the backward then walks the segments last first, recomputing each from its checkpoint
/// inside a child scope (caching as it goes), backpropagating through it, and releasing it before
/// the next. Under `Policy::Budget` the binomial schedule drives the sweep and each layer's cache is
/// rebuilt from its recomputed input. With full-precision storage the gradients are bit-identical
/// to the plain step's.
pub fn backward_step<'s, T: Element>(
    model: &Sequential<T>,
    params: &ParamStore<T>,
    grads: &mut Gradients<'_, T>,
    input: &Tensor<'s, T>,
    loss: impl FnOnce(&Tensor<'s, T>) -> Result<(T, Tensor<'s, T>), NnError>,
    checkpointer: Option<&mut Checkpointer<T>>,
) -> Result<StepReport<T>, NnError> {
    Ok(match checkpointer {
        None => {
            let mut cache = Cache::new();
            let y = model.forward(params, input, Some(&mut cache))?;
            let (value, grad) = loss(&y)?;
            drop(y);
            model.backward(params, grads, &mut cache, &grad)?;
            check_empty(&cache)?;
            StepReport {
                loss: value,
                stored_bytes: 0,
                recomputed_layers: 0,
            }
        }
        Some(ckpt) => checkpointed(model, params, grads, input, loss, ckpt)?,
    })
}

fn check_empty<T: Element>(cache: &Cache<'_, T>) -> Result<(), NnError> {
    if cfg!(debug_assertions) && !cache.is_empty() {
        return Err(NnError::CacheNotEmpty { left: cache.len() });
    }
    Ok(())
}

fn checkpointed<'s, T: Element>(
    model: &Sequential<T>,
    params: &ParamStore<T>,
    grads: &mut Gradients<'_, T>,
    input: &Tensor<'s, T>,
    loss: impl FnOnce(&Tensor<'s, T>) -> Result<(T, Tensor<'s, T>), NnError>,
    ckpt: &mut Checkpointer<T>,
) -> Result<StepReport<T>, NnError> {
    let layers = model.layers();
    let n = layers.len();
    let ids: Vec<usize> = (0..n).collect();
    let mut failure = None;
    let y = ckpt
        .checkpointed_forward(input, &ids, |x, i| {
            forward_no_cache(&*layers[i], params, x, &mut failure)
        })
        .map_err(checkpoint_error)?;
    if let Some(e) = failure {
        return Err(e);
    }
    let stored_bytes = ckpt.memory_stored_bytes();
    let (value, grad) = loss(&y)?;
    drop(y);

    let recomputed_layers = if matches!(ckpt.config().policy, Policy::Budget(_)) {
        binomial_backward(layers, params, grads, ckpt, grad)?
    } else {
        segment_backward(layers, params, grads, ckpt, grad)?
    };
    ckpt.clear();
    Ok(StepReport {
        loss: value,
        stored_bytes,
        recomputed_layers,
    })
}

fn checkpoint_error(e: crate::checkpoint::CheckpointError) -> NnError {
    NnError::Checkpoint(Box::new(e))
}

/// Segment by segment, last first: recompute with caching in a child scope, backpropagate.
fn segment_backward<'s, T: Element>(
    layers: &[Box<dyn Layer<T>>],
    params: &ParamStore<T>,
    grads: &mut Gradients<'_, T>,
    ckpt: &Checkpointer<T>,
    mut grad: Tensor<'s, T>,
) -> Result<usize, NnError> {
    let starts = ckpt.stored_layers();
    let mut recomputed = 0;
    for (j, &start) in starts.iter().enumerate().rev() {
        let end = starts.get(j + 1).copied().unwrap_or(layers.len());
        let boundary = ckpt.get(start).map_err(checkpoint_error)?;
        recomputed += end - start;
        grad = grad.child_scope(|segment| {
            let mut cache = Cache::new();
            let mut a = segment.bind(&boundary);
            for layer in &layers[start..end] {
                a = layer.forward(params, &a, Some(&mut cache))?;
            }
            drop(a);
            let mut g = segment.rebind(&grad);
            for layer in layers[start..end].iter().rev() {
                g = layer.backward(params, grads, &mut cache, &g)?;
            }
            check_empty(&cache)?;
            Ok::<_, NnError>(segment.escape(g))
        })?;
    }
    Ok(recomputed)
}

/// The binomial schedule's reverse sweep; each layer's cache is rebuilt from its input.
fn binomial_backward<'s, T: Element>(
    layers: &[Box<dyn Layer<T>>],
    params: &ParamStore<T>,
    grads: &mut Gradients<'_, T>,
    ckpt: &mut Checkpointer<T>,
    grad: Tensor<'s, T>,
) -> Result<usize, NnError> {
    let scope = Rc::clone(&grad.scope);
    let grad = RefCell::new(grad);
    let failure = RefCell::new(None);
    let report = ckpt
        .reverse_in(
            &scope,
            |x, i| {
                Ok(forward_no_cache(
                    &*layers[i],
                    params,
                    x,
                    &mut failure.borrow_mut(),
                ))
            },
            |i, x| {
                let mut cache = Cache::new();
                let step = layers[i]
                    .forward(params, x, Some(&mut cache))
                    .and_then(|_| layers[i].backward(params, grads, &mut cache, &grad.borrow()));
                match step {
                    Ok(g) => *grad.borrow_mut() = g,
                    Err(e) => {
                        failure.borrow_mut().get_or_insert(e);
                    }
                }
                Ok(())
            },
        )
        .map_err(checkpoint_error)?;
    if let Some(e) = failure.into_inner() {
        return Err(e);
    }
    Ok(report.recomputed_steps + layers.len())
}
