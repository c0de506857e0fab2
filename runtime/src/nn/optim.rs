//! Optimizers: they update the parameters of a store from their gradients, in place.

use std::collections::hash_map::Entry;
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
}

impl<S> States<S> {
    fn new() -> Self {
        States {
            by_key: HashMap::new(),
            seen: HashSet::new(),
        }
    }

    /// Calls `update(parameter, its state, its gradient)` for every parameter of `params` that has
    /// a gradient, after making every missing state with `make` and every shared parameter writable.
    fn update_all<T: Element>(
        &mut self,
        params: &mut dyn Parameters<T>,
        grads: &Gradients<'_, T>,
        make: impl Fn(&Param<T>) -> Result<S, NnError>,
        mut update: impl FnMut(&mut [T], &mut S, &[T]),
    ) -> Result<(), NnError> {
        let mut failure = None;
        let mut index = 0;
        self.seen.clear();
        params.for_each_param(&mut |p| {
            index += 1;
            if failure.is_some() || grads.get(p).is_none() {
                return;
            }
            let prepared = (|| {
                if !self.seen.insert(p.key()) {
                    return Err(NnError::ParamListedTwice {
                        index: index - 1,
                        shape: Shape::from(p.shape()),
                    });
                }
                if !grads.is_of_current_values(p) {
                    return Err(Error::StaleGradient {
                        index: index - 1,
                        shape: Shape::from(p.shape()),
                    }
                    .into());
                }
                if let Entry::Vacant(slot) = self.by_key.entry(p.key()) {
                    slot.insert(make(p)?);
                }
                // Copy on write now, so that the updates below cannot fail halfway.
                p.try_view_mut()?;
                Ok(())
            })();
            if let Err(e) = prepared {
                failure = Some(e);
            }
        });
        if let Some(e) = failure {
            return Err(e);
        }
        params.for_each_param(&mut |p| {
            let Some(g) = grads.get(p) else {
                return;
            };
            let state = self.by_key.get_mut(&p.key()).expect("made above");
            // Unique since the first pass, so written in place: this cannot fail.
            update(slice_mut(p), state, g.as_slice());
        });
        Ok(())
    }
}

/// The elements of `p`, writable (in place: every parameter an update writes is unique by then).
fn slice_mut<T: Element>(p: &mut Param<T>) -> &mut [T] {
    p.view_mut()
        .into_slice()
        .expect("a parameter's elements are contiguous")
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
                    slice_mut(v),
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
                let states = (slice_mut(m), slice_mut(v));
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
