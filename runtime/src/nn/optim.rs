//! Optimizers: they update the parameters of a store from their gradients, in place.

use std::collections::{HashMap, HashSet};

use super::NnError;
use crate::autograd::Gradients;
use crate::element::Element;
use crate::error::{Error, Shape};
use crate::ops::simd;
use crate::param::{Param, Parameters};

/// Updates parameters from their gradients.
pub trait Optimizer<T: Element> {
    /// One update of every parameter in `params` (a [`ParamStore`](super::ParamStore), a model
    /// struct: any [`Parameters`]) that has a gradient in `grads` (the others are left as they
    /// are), in place: a parameter no other handle shares is written without a copy.
    /// All or nothing: the memory an update needs (new state, a copy of a shared parameter) is
    /// taken before any parameter changes, so a budget error leaves every parameter and the
    /// optimizer's state as they were.
    fn step(
        &mut self,
        params: &mut dyn Parameters<T>,
        grads: &Gradients<'_, T>,
    ) -> Result<(), NnError>;
}

/// The state an optimizer keeps per parameter (by its key), made on the parameter's first update.
/// A parameter replaced by another (a new key) starts afresh.
struct States<S> {
    by_key: HashMap<u64, S>,
    /// The keys seen in the current step (kept to reuse its memory).
    seen: HashSet<u64>,
    /// The key and version of each parameter with a gradient, in the order the step's first walk
    /// met them: the later walks must meet the same, or the step stops (kept to reuse its memory).
    walked: Vec<(u64, u64)>,
}

impl<S> States<S> {
    fn new() -> Self {
        States {
            by_key: HashMap::new(),
            seen: HashSet::new(),
            walked: Vec::new(),
        }
    }

    /// Calls `update(parameter, its state, its gradient)` for every parameter of `params` that has
    /// a gradient, all or nothing: first every check, changing nothing; then every rent (states
    /// made with `make`, copies of parameters another handle shares), kept aside until all have
    /// succeeded; then the updates, which cannot fail. Each walk over `params` must meet the
    /// parameters the first met, with the same values ([`Parameters`] promises the same order on
    /// every call); one that does not is [`NnError::ParametersChanged`], before anything is written
    /// if the second walk notices it.
    fn update_all<T: Element>(
        &mut self,
        params: &mut dyn Parameters<T>,
        grads: &Gradients<'_, T>,
        make: impl Fn(&Param<T>) -> Result<S, NnError>,
        mut update: impl FnMut(&mut [T], &mut S, &[T]),
    ) -> Result<(), NnError> {
        self.check(params, grads)?;
        // Empty in a steady-state step, when every state exists and the model owns its
        // parameters: no heap allocation.
        let mut states = Vec::new();
        let mut copies = Vec::new();
        let mut failure = None;
        let (mut index, mut met) = (0, 0);
        params.for_each_param(&mut |p| {
            index += 1;
            if failure.is_some() || grads.get(p).is_none() {
                return;
            }
            met += 1;
            let rented = (|| {
                self.same(met - 1, index - 1, p, 0)?;
                if !self.by_key.contains_key(&p.key()) {
                    states.push((p.key(), make(p)?));
                }
                if let Some(copy) = p.copy_for_write()? {
                    copies.push((index - 1, copy));
                }
                Ok(())
            })();
            if let Err(e) = rented {
                failure = Some(e);
            }
        });
        let missing = self.walked.len().saturating_sub(met);
        if let Some(e) = failure
            .take()
            .or_else(|| (missing > 0).then(|| self.changed(met, 0)))
        {
            return Err(e);
        }
        self.by_key.extend(states);
        let mut copies = copies.into_iter().peekable();
        let (mut index, mut met, mut updated) = (0, 0, 0);
        params.for_each_param(&mut |p| {
            index += 1;
            let Some(g) = grads.get(p) else {
                return;
            };
            met += 1;
            if failure.is_some() {
                return;
            }
            if let Err(e) = self.same(met - 1, index - 1, p, updated) {
                failure = Some(e);
                return;
            }
            if let Some((_, copy)) = copies.next_if(|(i, _)| *i == index - 1) {
                p.take_copy(copy);
            }
            let state = self
                .by_key
                .get_mut(&p.key())
                .expect("made for every key walked");
            update(p.unique_slice_mut(), state, g.slice());
            updated += 1;
        });
        let missing = self.walked.len().saturating_sub(met);
        failure
            .or_else(|| (missing > 0).then(|| self.changed(met, updated)))
            .map_or(Ok(()), Err)
    }

    /// Fails unless `p`, the `n`-th parameter with a gradient of this walk (at `index` in the
    /// set), is the one the first walk met there, with the same values.
    fn same<T: Element>(
        &self,
        n: usize,
        index: usize,
        p: &Param<T>,
        updated: usize,
    ) -> Result<(), NnError> {
        match self.walked.get(n) {
            Some(&walked) if walked == (p.key(), p.version()) => Ok(()),
            _ => Err(NnError::ParametersChanged { index, updated }),
        }
    }

    /// The error of a later walk that met fewer parameters with a gradient than the first: `met`.
    fn changed(&self, met: usize, updated: usize) -> NnError {
        NnError::ParametersChanged {
            index: met,
            updated,
        }
    }

    /// Fails with [`NnError::ParamListedTwice`] or [`Error::StaleGradient`] for the first
    /// parameter of `params` with a gradient that is listed twice or whose gradient was computed
    /// from other values than it holds.
    fn check<T: Element>(
        &mut self,
        params: &mut dyn Parameters<T>,
        grads: &Gradients<'_, T>,
    ) -> Result<(), NnError> {
        self.seen.clear();
        self.walked.clear();
        let mut failure = None;
        let mut index = 0;
        params.for_each_param(&mut |p| {
            index += 1;
            if failure.is_some() || grads.get(p).is_none() {
                return;
            }
            self.walked.push((p.key(), p.version()));
            let (index, shape) = (index - 1, || Shape::from(p.shape()));
            if !self.seen.insert(p.key()) {
                let shape = shape();
                failure = Some(NnError::ParamListedTwice { index, shape });
            } else if !grads.is_of_current_values(p) {
                failure = Some(
                    Error::StaleGradient {
                        index,
                        shape: shape(),
                    }
                    .into(),
                );
            }
        });
        failure.map_or(Ok(()), Err)
    }
}

/// Stochastic gradient descent with momentum (PyTorch's form):
/// `v = momentum v + g; p = p - lr v` (plain SGD for `momentum = 0`).
pub struct Sgd<T: Element = f32> {
    lr: T,
    momentum: T,
    velocity: States<Param<T>>,
}

impl<T: Element> Sgd<T> {
    /// SGD with learning rate `lr` and `momentum` in `[0, 1)`.
    pub fn new(lr: T, momentum: T) -> Self {
        Sgd {
            lr,
            momentum,
            velocity: States::new(),
        }
    }
}

impl<T: Element> Optimizer<T> for Sgd<T> {
    fn step(
        &mut self,
        params: &mut dyn Parameters<T>,
        grads: &Gradients<'_, T>,
    ) -> Result<(), NnError> {
        let (lr, momentum) = (self.lr, self.momentum);
        self.velocity.update_all(
            params,
            grads,
            |p| Ok(Param::try_zeros(p.pool(), p.shape())?),
            |w, v, g| {
                simd::update(
                    w,
                    v.unique_slice_mut(),
                    g,
                    #[inline(always)]
                    move |w, v, g| {
                        let v = momentum * v + g;
                        (w - lr * v, v)
                    },
                );
            },
        )
    }
}

/// Adam (Kingma and Ba 2015) with bias correction, and AdamW (Loshchilov and Hutter 2019): with a
/// `weight_decay`, each step first shrinks the parameter, `p = p - lr weight_decay p`, decoupled
/// from the gradient (PyTorch's `AdamW`).
pub struct Adam<T: Element = f32> {
    lr: T,
    beta1: T,
    beta2: T,
    eps: T,
    weight_decay: T,
    /// Per parameter: the moments and the number of updates it has had (its bias correction, as in
    /// PyTorch, counts the parameter's own steps).
    moments: States<(Param<T>, Param<T>, i32)>,
}

impl<T: Element> Adam<T> {
    /// Adam with learning rate `lr` and the usual `beta1 = 0.9`, `beta2 = 0.999`, `eps = 1e-8`.
    pub fn new(lr: T) -> Self {
        Adam::with_betas(lr, T::from_f64(0.9), T::from_f64(0.999), T::from_f64(1e-8))
    }

    /// Adam with every coefficient given.
    pub fn with_betas(lr: T, beta1: T, beta2: T, eps: T) -> Self {
        Adam {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay: T::zero(),
            moments: States::new(),
        }
    }

    /// AdamW: Adam with decoupled weight decay `weight_decay` (PyTorch's default is 0.01).
    pub fn adamw(lr: T, weight_decay: T) -> Self {
        Adam {
            weight_decay,
            ..Adam::new(lr)
        }
    }
}

impl<T: Element> Optimizer<T> for Adam<T> {
    fn step(
        &mut self,
        params: &mut dyn Parameters<T>,
        grads: &Gradients<'_, T>,
    ) -> Result<(), NnError> {
        let (b1, b2, eps) = (self.beta1, self.beta2, self.eps);
        let (lr, decay) = (self.lr, T::one() - self.lr * self.weight_decay);
        let decoupled = self.weight_decay != T::zero();
        self.moments.update_all(
            params,
            grads,
            |p| {
                Ok((
                    Param::try_zeros(p.pool(), p.shape())?,
                    Param::try_zeros(p.pool(), p.shape())?,
                    0,
                ))
            },
            |w, (m, v, t), g| {
                *t = t.saturating_add(1);
                let correction1 = T::one() - b1.powi(*t);
                let correction2 = T::one() - b2.powi(*t);
                let states = (m.unique_slice_mut(), v.unique_slice_mut());
                simd::update(
                    w,
                    states,
                    g,
                    #[inline(always)]
                    move |w, (m, v), g| {
                        let w = if decoupled { w * decay } else { w };
                        let m = b1 * m + (T::one() - b1) * g;
                        let v = b2 * v + (T::one() - b2) * g * g;
                        let (m_hat, v_hat) = (m / correction1, v / correction2);
                        (w - lr * m_hat / (v_hat.sqrt() + eps), (m, v))
                    },
                );
            },
        )
    }
}
