//! Optimizers: they update every parameter of a store from its gradient, in place.

use ndarray::Zip;

use super::{NnError, ParamEntry, ParamStore};
use crate::element::Element;
use crate::error::Shape;
use crate::param::Param;

/// Updates parameters from their gradients.
pub trait Optimizer<T: Element> {
    /// One update of every parameter in `params` (in registration order) from its gradient.
    fn step(&mut self, params: &mut ParamStore<T>) -> Result<(), NnError>;
}

/// A zeroed state parameter of `like`'s shape, from `params`' pool.
fn zeros_like<T: Element>(params: &ParamStore<T>, like: &Param<T>) -> Result<Param<T>, NnError> {
    Ok(Param::try_zeros(params.pool(), like.shape())?)
}

/// Adds optimizer state for the parameters registered since the last step: `make(params, data)`
/// for each parameter past the `state.len()` already covered.
fn grow_state<T: Element, S>(
    state: &mut Vec<S>,
    params: &ParamStore<T>,
    make: impl Fn(&ParamStore<T>, &Param<T>) -> Result<S, NnError>,
) -> Result<(), NnError> {
    for (_, p) in params.iter().skip(state.len()) {
        state.push(make(params, &p.data)?);
    }
    Ok(())
}

/// Fails with [`NnError::ParamShapeChanged`] unless the gradient and every state tensor of the
/// parameter `name` have its data's shape (`data` or `grad` may have been replaced since the state
/// was made).
fn check_shapes<T: Element>(
    name: &str,
    p: &ParamEntry<T>,
    state: &[&Param<T>],
) -> Result<(), NnError> {
    let changed = |what, other: &[usize]| NnError::ParamShapeChanged {
        name: name.to_string(),
        data: Shape::from(p.data.shape()),
        what,
        other: Shape::from(other),
    };
    if p.grad.shape() != p.data.shape() {
        return Err(changed("gradient", p.grad.shape()));
    }
    match state.iter().find(|s| s.shape() != p.data.shape()) {
        Some(s) => Err(changed("optimizer state", s.shape())),
        None => Ok(()),
    }
}

/// Stochastic gradient descent with momentum (PyTorch's form):
/// `v = momentum v + g; p = p - lr v` (plain SGD for `momentum = 0`).
pub struct Sgd<T: Element = f32> {
    lr: T,
    momentum: T,
    velocity: Vec<Param<T>>,
}

impl<T: Element> Sgd<T> {
    /// SGD with learning rate `lr` and `momentum` in `[0, 1)`.
    pub fn new(lr: T, momentum: T) -> Self {
        Sgd {
            lr,
            momentum,
            velocity: Vec::new(),
        }
    }
}

impl<T: Element> Optimizer<T> for Sgd<T> {
    fn step(&mut self, params: &mut ParamStore<T>) -> Result<(), NnError> {
        grow_state(&mut self.velocity, params, |params, like| {
            zeros_like(params, like)
        })?;
        let (lr, momentum) = (self.lr, self.momentum);
        for ((name, p), v) in params.iter_mut().zip(&mut self.velocity) {
            check_shapes(name, p, &[v])?;
            let grad = p.grad.view();
            Zip::from(p.data.try_view_mut()?)
                .and(v.try_view_mut()?)
                .and(&grad)
                .for_each(|w, v, &g| {
                    *v = momentum * *v + g;
                    *w = *w - lr * *v;
                });
        }
        Ok(())
    }
}

/// Adam (Kingma and Ba 2015) with bias correction.
pub struct Adam<T: Element = f32> {
    lr: T,
    beta1: T,
    beta2: T,
    eps: T,
    t: i32,
    moments: Vec<(Param<T>, Param<T>)>,
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
            t: 0,
            moments: Vec::new(),
        }
    }
}

impl<T: Element> Optimizer<T> for Adam<T> {
    fn step(&mut self, params: &mut ParamStore<T>) -> Result<(), NnError> {
        grow_state(&mut self.moments, params, |params, like| {
            Ok((zeros_like(params, like)?, zeros_like(params, like)?))
        })?;
        self.t = self.t.saturating_add(1);
        let (b1, b2, eps) = (self.beta1, self.beta2, self.eps);
        let correction1 = T::one() - b1.powi(self.t);
        let correction2 = T::one() - b2.powi(self.t);
        let lr = self.lr;
        for ((name, p), (m, v)) in params.iter_mut().zip(&mut self.moments) {
            check_shapes(name, p, &[m, v])?;
            let grad = p.grad.view();
            Zip::from(p.data.try_view_mut()?)
                .and(m.try_view_mut()?)
                .and(v.try_view_mut()?)
                .and(&grad)
                .for_each(|w, m, v, &g| {
                    *m = b1 * *m + (T::one() - b1) * g;
                    *v = b2 * *v + (T::one() - b2) * g * g;
                    let m_hat = *m / correction1;
                    let v_hat = *v / correction2;
                    *w = *w - lr * m_hat / (v_hat.sqrt() + eps);
                });
        }
        Ok(())
    }
}
