//! The gradients a backward pass computes, keyed by parameter.

use std::collections::HashMap;
use std::fmt;

use ndarray::{Dimension, IxDyn};

use crate::element::{DType, Element};
use crate::error::{Error, Result, Shape};
use crate::escape::{Escape, EscapeTarget};
use crate::param::Param;
use crate::recycle::RecycledVec;
use crate::scope::{Scope, State};
use crate::tensor::Tensor;

/// Gradients keyed by parameter (and by tensor marked with [`Tensor::requires_grad`]), as tensors
/// of one scope: the one [`Tensor::backward`] ran in, or the one [`Gradients::new`] was given.
///
/// A parameter used several times in a forward gets the sum of its gradients; several backward
/// passes into one `Gradients` ([`Tensor::backward_into`]) accumulate. Gradients are scoped tensors:
/// they are released with their scope, and leave it only through [`Scope::escape`].
pub struct Gradients<'s, T: DType = f32> {
    scope: State,
    by_key: HashMap<u64, Tensor<'s, T>>,
    /// The parameter values each gradient was computed from ([`Param::source`]).
    sources: HashMap<u64, u64>,
}

impl<'s, T: Element> Gradients<'s, T> {
    /// No gradients yet; what is added is kept in `s`.
    pub fn new(s: &Scope<'s, '_>) -> Self {
        Gradients::in_scope(s.state())
    }

    pub(crate) fn in_scope(scope: &State) -> Self {
        Gradients {
            scope: scope.clone(),
            by_key: HashMap::new(),
            sources: HashMap::new(),
        }
    }

    /// The gradient of `param`, if the backward passes reached it.
    pub fn get(&self, param: &Param<T>) -> Option<&Tensor<'s, T>> {
        self.by_key.get(&param.key())
    }

    /// The gradient of `tensor`, a tensor marked with [`Tensor::requires_grad`] (or an alias of
    /// one), if the backward passes reached it.
    pub fn of(&self, tensor: &Tensor<'_, T>) -> Option<&Tensor<'s, T>> {
        let key = tensor.node.as_ref()?.key()?;
        self.by_key.get(&key)
    }

    /// How many parameters and marked tensors have a gradient.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether there is no gradient.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// Sets every gradient to zero, keeping its buffer: the gradients of the next backward passes
    /// ([`Tensor::backward_into`]) are added in place, so a training loop that keeps one
    /// `Gradients` across its steps rents no gradient memory after the first (PyTorch's
    /// `zero_grad(set_to_none=False)`). A gradient that another handle shares is copied first, so
    /// the other handle keeps its values; this can fail only then, with a budget error.
    pub fn zero(&mut self) -> Result<()> {
        for g in self.by_key.values_mut() {
            g.try_view_mut()?.fill(T::zero());
        }
        // Zeros are the gradient of any values: the next pass may use the updated parameters.
        self.sources.clear();
        Ok(())
    }

    /// Whether the gradient of `param` (if any) was computed from the values `param` holds now,
    /// rather than from another copy (a clone written after it, or written before it).
    pub(crate) fn is_of_current_values(&self, param: &Param<T>) -> bool {
        self.sources
            .get(&param.key())
            .is_none_or(|&s| s == param.source())
    }

    /// Adds `grad` to the gradient of `param`: how hand-written backward passes report theirs.
    /// A first gradient takes `grad`'s buffer when `grad` is its only handle, else a copy: the
    /// gradients never alias a tensor of another scope. Fails with [`Error::ShapeMismatch`] if
    /// `grad` does not have the parameter's shape, or with a budget error.
    pub fn accumulate(&mut self, param: &Param<T>, grad: Tensor<'_, T>) -> Result<()> {
        if grad.shape() != param.shape() {
            return Err(Error::ShapeMismatch {
                op: "Gradients::accumulate",
                lhs: Shape::from(param.shape()),
                rhs: Shape::from(grad.shape()),
                reason: "a gradient must have its parameter's shape".into(),
            });
        }
        self.check_sources([(param.key(), param.source(), param.shape())])?;
        self.add(param.key(), Some(param.source()), grad.into_saved())
    }

    /// Removes and returns the gradient under `key` (a checkpointed region's own leaves).
    pub(crate) fn take(&mut self, key: u64) -> Option<Tensor<'static, T>> {
        self.sources.remove(&key);
        self.by_key.remove(&key).map(Tensor::into_saved)
    }

    /// Checks that no key of `leaves` (key, source, shape) meets two sources, among them or against
    /// what is here: one parameter's gradient summed over two different copies of its values would
    /// be the gradient of neither.
    pub(crate) fn check_sources<'a>(
        &self,
        leaves: impl IntoIterator<Item = (u64, u64, &'a [usize])>,
    ) -> Result<()> {
        let conflict = |shape: &[usize]| Error::ParamUsedWithTwoValues {
            shape: Shape::from(shape),
        };
        // Sorted by key, two sources of one key meet: no map to build.
        let mut seen: RecycledVec<(u64, u64, IxDyn)> = RecycledVec::new();
        for (key, source, shape) in leaves {
            if self.sources.get(&key).is_some_and(|&e| e != source) {
                return Err(conflict(shape));
            }
            seen.push((key, source, IxDyn(shape)));
        }
        seen.sort_unstable_by_key(|&(key, source, _)| (key, source));
        match seen
            .windows(2)
            .find(|w| w[0].0 == w[1].0 && w[0].1 != w[1].1)
        {
            Some(w) => Err(conflict(w[1].2.slice())),
            None => Ok(()),
        }
    }

    /// Adds `grad` to the gradient under `key`, computed from the values `source` identifies (see
    /// [`Gradients::check_sources`]); the sum is kept in this collection's scope.
    pub(crate) fn add(
        &mut self,
        key: u64,
        source: Option<u64>,
        grad: Tensor<'static, T>,
    ) -> Result<()> {
        if let Some(source) = source {
            self.sources.insert(key, source);
        }
        let total = match self.by_key.remove(&key) {
            // By value: written into the earlier gradient's buffer when it is the only handle.
            Some(earlier) => earlier.try_add_owned(&grad)?.move_to(&self.scope),
            // A buffer another handle shares (a caller's seed or gradient, a bound parameter) is
            // copied, here: moving it would hand that handle's buffer to this scope's brand.
            None => grad.try_into_unique_in(&self.scope)?.move_to(&self.scope),
        };
        self.by_key.insert(key, total);
        Ok(())
    }
}

impl<'from, 'to, T: Element> Escape<'from, 'to> for Gradients<'from, T> {
    type Escaped = Gradients<'to, T>;
    /// Every gradient escapes with the collection, which then adds into the target scope.
    fn escape_to(self, target: &EscapeTarget<'from, 'to>) -> Gradients<'to, T> {
        Gradients {
            scope: target.state().clone(),
            by_key: self
                .by_key
                .into_iter()
                .map(|(key, g)| (key, g.escape_to(target)))
                .collect(),
            sources: self.sources,
        }
    }
}

impl<T: Element> fmt::Debug for Gradients<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gradients")
            .field("count", &self.by_key.len())
            .finish()
    }
}
