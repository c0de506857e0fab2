//! The gradients a backward pass computes, keyed by parameter.

use std::fmt;
use std::marker::PhantomData;

use crate::dims::Dims;

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
    /// Sorted by key. A sorted list rather than a hash map: a checkpointed backward takes the
    /// gradients of each step's own tensors out again, and a hash map whose keys come and go step
    /// after step fills with tombstones until it grows, at a step its random hashes decide (a heap
    /// allocation in a steady-state step). The list reaches its size in the first step and keeps it;
    /// its buffer is recycled, so a `Gradients` made anew every step (`loss.backward()`) allocates
    /// nothing either.
    slots: RecycledVec<Slot<T>>,
    /// The scope the gradients belong to: the slots hold them unbranded, as `'static` (a tensor's
    /// brand is covariant, so a `&Tensor<'static>` reads as a `&Tensor<'s>`).
    _brand: PhantomData<&'s ()>,
}

/// A gradient and what it was computed from.
struct Slot<T: DType> {
    key: u64,
    /// `None` only inside [`Gradients::add`], while the sum is computed.
    grad: Option<Tensor<'static, T>>,
    /// The parameter values the gradient was computed from ([`Param::version`]), until zeroed.
    version: Option<u64>,
}

impl<'s, T: Element> Gradients<'s, T> {
    /// No gradients yet; what is added is kept in `s`.
    pub fn new(s: &Scope<'s, '_>) -> Self {
        Gradients::in_scope(s.state())
    }

    pub(crate) fn in_scope(scope: &State) -> Self {
        Gradients {
            scope: scope.clone(),
            slots: RecycledVec::new(),
            _brand: PhantomData,
        }
    }

    /// The gradient of `param`, if the backward passes reached it.
    pub fn get(&self, param: &Param<T>) -> Option<&Tensor<'s, T>> {
        self.grad(param.key())
    }

    /// The gradient of `tensor`, a tensor marked with [`Tensor::requires_grad`] (or an alias of
    /// one), if the backward passes reached it.
    pub fn of(&self, tensor: &Tensor<'_, T>) -> Option<&Tensor<'s, T>> {
        self.grad(tensor.node.as_ref()?.key()?)
    }

    fn slot(&self, key: u64) -> Option<&Slot<T>> {
        let i = self.find(key).ok()?;
        Some(&self.slots[i])
    }

    fn grad(&self, key: u64) -> Option<&Tensor<'s, T>> {
        self.slot(key)?.grad.as_ref()
    }

    /// The version of the values the gradient under `key` was computed from, if known.
    fn version(&self, key: u64) -> Option<u64> {
        self.slot(key)?.version
    }

    /// Where `key` is in the list, or where it would go.
    fn find(&self, key: u64) -> std::result::Result<usize, usize> {
        self.slots.binary_search_by_key(&key, |slot| slot.key)
    }

    /// How many parameters and marked tensors have a gradient.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether there is no gradient.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Pool bytes the gradients hold.
    pub(crate) fn held_bytes(&self) -> usize {
        let grads = self.slots.iter().filter_map(|slot| slot.grad.as_ref());
        grads.map(Tensor::allocated_bytes).sum()
    }

    /// Sets every gradient to zero, keeping its buffer: the gradients of the next backward passes
    /// ([`Tensor::backward_into`]) are added in place, so a training loop that keeps one
    /// `Gradients` across its steps rents no gradient memory after the first (PyTorch's
    /// `zero_grad(set_to_none=False)`). A gradient that another handle shares is copied first, so
    /// the other handle keeps its values; this can fail only then, with a budget error.
    pub fn zero(&mut self) -> Result<()> {
        for slot in self.slots.iter_mut() {
            if let Some(g) = &mut slot.grad {
                g.try_view_mut()?.fill(T::zero());
            }
            // Zeros are the gradient of any values: the next pass may use the updated parameters.
            slot.version = None;
        }
        Ok(())
    }

    /// The L2 norm of all the gradients together, as one vector (summed in `f64`).
    pub fn norm(&self) -> f64 {
        let grads = self.slots.iter().filter_map(|slot| slot.grad.as_ref());
        let squares: f64 = grads
            .flat_map(|g| g.slice().iter())
            .map(|&x| DType::to_f64(x) * DType::to_f64(x))
            .sum();
        squares.sqrt()
    }

    /// Scales every gradient so that their norm ([`Gradients::norm`]) is at most `max_norm`, and
    /// returns the norm before: PyTorch's `clip_grad_norm_`, whose factor is
    /// `max_norm / (norm + 1e-6)`, applied only when below 1. A norm that is not finite is returned
    /// and nothing is scaled, so the caller can skip the step. In place. Fails with
    /// [`Error::InvalidArgument`] if `max_norm` is negative or NaN (a negative factor would flip
    /// every gradient; infinity is accepted and scales nothing), and with a budget error (a
    /// gradient another handle shares is copied first).
    ///
    /// ```
    /// use tensorscope::{Gradients, Param, Pool};
    ///
    /// let pool = Pool::with_max_memory_mb(16);
    /// let w = Param::zeros(&pool, &[2]);
    /// pool.scope(|s| {
    ///     let mut grads = Gradients::new(s);
    ///     grads.accumulate(&w, s.from_slice(&[2], &[3.0f32, 4.0])).unwrap();
    ///     assert_eq!(grads.clip_norm(1.0).unwrap(), 5.0);
    ///     assert!((grads.norm() - 1.0).abs() < 1e-6);
    ///     grads.clip_value(0.5).unwrap();
    ///     assert_eq!(grads.get(&w).unwrap().to_vec(), vec![0.5, 0.5]);
    /// });
    /// ```
    pub fn clip_norm(&mut self, max_norm: f64) -> Result<f64> {
        check_bound("Gradients::clip_norm", "max_norm", max_norm)?;
        let norm = self.norm();
        let factor = max_norm / (norm + 1e-6);
        if norm.is_finite() && factor < 1.0 {
            let factor = T::from_f64(factor);
            self.each_mut(|g| *g = *g * factor)?;
        }
        Ok(norm)
    }

    /// Clamps every gradient element to `[-max, max]` (PyTorch's `clip_grad_value_`), in place.
    /// Fails as [`Gradients::clip_norm`] does: with [`Error::InvalidArgument`] if `max` is negative
    /// or NaN (there is no such interval; infinity is accepted and clamps nothing), and with a
    /// budget error.
    pub fn clip_value(&mut self, max: f64) -> Result<()> {
        check_bound("Gradients::clip_value", "max", max)?;
        let (low, high) = (T::from_f64(-max), T::from_f64(max));
        self.each_mut(|g| *g = num_traits::clamp(*g, low, high))
    }

    /// Calls `f` on every element of every gradient, written in place.
    fn each_mut(&mut self, mut f: impl FnMut(&mut T)) -> Result<()> {
        for g in self.slots.iter_mut().filter_map(|slot| slot.grad.as_mut()) {
            g.try_view_mut()?.iter_mut().for_each(&mut f);
        }
        Ok(())
    }

    /// Whether the gradient of `param` (if any) was computed from the values `param` holds now,
    /// rather than from another copy (a clone written after it, or written before it).
    pub(crate) fn is_of_current_values(&self, param: &Param<T>) -> bool {
        self.version(param.key())
            .is_none_or(|s| s == param.version())
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
        self.check_versions([(param.key(), param.version(), param.shape())])?;
        self.add(param.key(), Some(param.version()), grad.into_saved())
    }

    /// Removes and returns the gradient under `key` (a checkpointed region's own leaves).
    pub(crate) fn take(&mut self, key: u64) -> Option<Tensor<'static, T>> {
        let i = self.find(key).ok()?;
        self.slots.remove(i).grad
    }

    /// Checks that no key of `leaves` (key, version, shape) meets two versions, among them or against
    /// what is here: one parameter's gradient summed over two different copies of its values would
    /// be the gradient of neither.
    pub(crate) fn check_versions<'a>(
        &self,
        leaves: impl IntoIterator<Item = (u64, u64, &'a [usize])>,
    ) -> Result<()> {
        let conflict = |shape: &[usize]| Error::ParamUsedWithTwoValues {
            shape: Shape::from(shape),
        };
        // Sorted by key, two versions of one key meet: no map to build.
        let mut seen: RecycledVec<(u64, u64, Dims)> = RecycledVec::new();
        for (key, version, shape) in leaves {
            if self.version(key).is_some_and(|e| e != version) {
                return Err(conflict(shape));
            }
            seen.push((key, version, Dims::from_slice(shape)));
        }
        seen.sort_unstable_by_key(|&(key, version, _)| (key, version));
        match seen
            .windows(2)
            .find(|w| w[0].0 == w[1].0 && w[0].1 != w[1].1)
        {
            Some(w) => Err(conflict(w[1].2.slice())),
            None => Ok(()),
        }
    }

    /// Adds `grad` to the gradient under `key`, computed from the values `version` identifies (see
    /// [`Gradients::check_versions`]); the sum is kept in this collection's scope.
    pub(crate) fn add(
        &mut self,
        key: u64,
        version: Option<u64>,
        grad: Tensor<'static, T>,
    ) -> Result<()> {
        let i = self.find(key).unwrap_or_else(|i| {
            let slot = Slot {
                key,
                grad: None,
                version: None,
            };
            self.slots.insert(i, slot);
            i
        });
        let slot = &mut self.slots[i];
        if version.is_some() {
            slot.version = version;
        }
        let total = match slot.grad.take() {
            // By value: written into the earlier gradient's buffer when it is the only handle.
            Some(earlier) => earlier.try_add_owned(&grad),
            // A buffer another handle shares (a caller's seed or gradient, a bound parameter) is
            // copied, here: moving it would hand that handle's buffer to this scope's brand.
            None => grad.try_into_unique_in(&self.scope),
        };
        match total {
            Ok(total) => {
                slot.grad = Some(total.move_to(&self.scope).into_saved());
                Ok(())
            }
            Err(e) => {
                // The gradient is lost (the backward's error says so); no slot stays empty.
                self.slots.remove(i);
                Err(e)
            }
        }
    }
}

/// Checks a clipping bound: a number at least 0 (infinity included), else
/// [`Error::InvalidArgument`] naming `op` and `arg`.
fn check_bound(op: &'static str, arg: &'static str, bound: f64) -> Result<()> {
    match bound >= 0.0 {
        true => Ok(()),
        false => Err(Error::InvalidArgument {
            op,
            arg,
            reason: format!("{bound} is not a number at least 0"),
        }),
    }
}

impl<'from, 'to, T: Element> Escape<'from, 'to> for Gradients<'from, T> {
    type Escaped = Gradients<'to, T>;
    /// Every gradient escapes with the collection, which then adds into the target scope.
    fn escape_to(self, target: &EscapeTarget<'from, 'to>) -> Gradients<'to, T> {
        let mut slots = self.slots;
        for slot in slots.iter_mut() {
            if let Some(grad) = slot.grad.take() {
                slot.grad = Some(grad.escape_to(target).into_saved());
            }
        }
        Gradients {
            scope: target.state().clone(),
            slots,
            _brand: PhantomData,
        }
    }
}

impl<T: Element> fmt::Debug for Gradients<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Gradients")
            .field("count", &self.slots.len())
            .finish()
    }
}
