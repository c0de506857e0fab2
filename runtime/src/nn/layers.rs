//! Layers with forward and backward passes.
//!
//! A layer's forward pushes what its backward needs onto a [`Cache`] when one is given (the
//! checkpointed forward gives none, so nothing but the checkpoints is kept); its backward pops that,
//! adds its parameters' gradients into the [`ParamStore`], and returns the gradient with respect to
//! its input. One cache serves a whole model: nested layers push and pop in stack order.

use ndarray::{Axis, Zip};

use super::{NnError, ParamId, ParamStore};
use crate::autograd::Gradients;
use crate::element::Element;
use crate::error::{Error, Shape};
use crate::tensor::Tensor;
use crate::TensorOps;

/// What forward passes keep for their backward passes: a stack of tensors (aliases, no copies).
pub struct Cache<'s, T: Element = f32> {
    stack: Vec<Tensor<'s, T>>,
}

impl<'s, T: Element> Cache<'s, T> {
    /// An empty cache.
    pub fn new() -> Self {
        Cache { stack: Vec::new() }
    }

    /// Keeps `t` for the backward pass.
    pub fn push(&mut self, t: Tensor<'s, T>) {
        self.stack.push(t);
    }

    /// Takes back the last tensor pushed. Fails with [`NnError::CacheUnderflow`] naming `layer` if
    /// the cache is empty (a backward without its forward).
    pub fn pop(&mut self, layer: &'static str) -> Result<Tensor<'s, T>, NnError> {
        self.stack.pop().ok_or(NnError::CacheUnderflow { layer })
    }

    /// Tensors still held.
    pub fn len(&self) -> usize {
        self.stack.len()
    }

    /// Whether nothing is held: true after a complete backward.
    pub fn is_empty(&self) -> bool {
        self.stack.is_empty()
    }
}

impl<T: Element> Default for Cache<'_, T> {
    fn default() -> Self {
        Cache::new()
    }
}

/// Fails with [`NnError::GradShape`] naming `layer` unless `grad` has the layer's output shape.
fn check_grad<T: Element>(
    layer: &'static str,
    expected: &[usize],
    grad: &Tensor<'_, T>,
) -> Result<(), NnError> {
    if grad.shape() == expected {
        Ok(())
    } else {
        Err(NnError::GradShape {
            layer,
            expected: Shape::from(expected),
            got: Shape::from(grad.shape()),
        })
    }
}

/// A differentiable layer.
pub trait Layer<T: Element = f32> {
    /// A short name for messages, e.g. `"linear"`.
    fn name(&self) -> &'static str;

    /// The output for input `x`; pushes what [`Layer::backward`] needs onto `cache` if one is given.
    fn forward<'s>(
        &self,
        params: &ParamStore<T>,
        x: &Tensor<'s, T>,
        cache: Option<&mut Cache<'s, T>>,
    ) -> Result<Tensor<'s, T>, NnError>;

    /// Pops what the forward pushed, adds the parameters' gradients into `grads`, and returns the
    /// gradient with respect to the input, given `grad` with respect to the output.
    fn backward<'s>(
        &self,
        params: &ParamStore<T>,
        grads: &mut Gradients<'_, T>,
        cache: &mut Cache<'s, T>,
        grad: &Tensor<'s, T>,
    ) -> Result<Tensor<'s, T>, NnError>;
}

/// `y = x W + b` for `x` of shape `[batch, inputs]`, `W` `[inputs, outputs]`, `b` `[outputs]`.
pub struct Linear {
    weight: ParamId,
    bias: ParamId,
}

impl Linear {
    /// Registers `{name}.weight` (normal, std `1/sqrt(inputs)`) and `{name}.bias` (zeros).
    pub fn new<T: Element>(
        params: &mut ParamStore<T>,
        name: &str,
        inputs: usize,
        outputs: usize,
        seed: u64,
    ) -> Result<Self, NnError> {
        let std = 1.0 / (inputs.max(1) as f64).sqrt();
        Linear::with_std(params, name, inputs, outputs, std, seed)
    }

    /// Like [`Linear::new`] with the weights' standard deviation given, e.g. small for the last layer
    /// of a residual branch so that a deep stack starts near the identity.
    pub fn with_std<T: Element>(
        params: &mut ParamStore<T>,
        name: &str,
        inputs: usize,
        outputs: usize,
        std: f64,
        seed: u64,
    ) -> Result<Self, NnError> {
        Ok(Linear {
            weight: params.randn(&format!("{name}.weight"), &[inputs, outputs], std, seed)?,
            bias: params.zeros(&format!("{name}.bias"), &[outputs])?,
        })
    }
}

impl<T: Element> Layer<T> for Linear {
    fn name(&self) -> &'static str {
        "linear"
    }

    fn forward<'s>(
        &self,
        params: &ParamStore<T>,
        x: &Tensor<'s, T>,
        cache: Option<&mut Cache<'s, T>>,
    ) -> Result<Tensor<'s, T>, NnError> {
        let y = x.try_matmul(params.param(self.weight, "linear")?)?;
        let y = y.try_add(params.param(self.bias, "linear")?)?;
        if let Some(cache) = cache {
            cache.push(x.clone());
        }
        Ok(y)
    }

    fn backward<'s>(
        &self,
        params: &ParamStore<T>,
        grads: &mut Gradients<'_, T>,
        cache: &mut Cache<'s, T>,
        grad: &Tensor<'s, T>,
    ) -> Result<Tensor<'s, T>, NnError> {
        let x = cache.pop("linear")?;
        let weight = params.param(self.weight, "linear")?.clone();
        // The forward's output shape: x's, with the last axis the weight's outputs.
        let mut expected = x.shape().to_vec();
        if let (Some(last), Some(&outputs)) = (expected.last_mut(), weight.shape().last()) {
            *last = outputs;
        }
        check_grad("linear", &expected, grad)?;
        let dw = x.try_transpose()?.try_matmul(grad)?;
        grads.accumulate(&weight, dw)?;
        let db = grad.try_sum(0)?;
        grads.accumulate(params.param(self.bias, "linear")?, db)?;
        Ok(grad.try_matmul(&grad.bind(&weight).try_transpose()?)?)
    }
}

/// An elementwise activation: `f(x)` forward, `grad * f'(x)` backward (the cache holds `x`).
pub struct Activation {
    kind: ActivationKind,
}

#[derive(Clone, Copy)]
enum ActivationKind {
    Relu,
    Gelu,
    Tanh,
}

impl Activation {
    /// `max(x, 0)`.
    pub fn relu() -> Self {
        Activation {
            kind: ActivationKind::Relu,
        }
    }

    /// GELU, tanh approximation (as [`TensorOps::gelu`]).
    pub fn gelu() -> Self {
        Activation {
            kind: ActivationKind::Gelu,
        }
    }

    /// `tanh(x)`.
    pub fn tanh() -> Self {
        Activation {
            kind: ActivationKind::Tanh,
        }
    }
}

impl<T: Element> Layer<T> for Activation {
    fn name(&self) -> &'static str {
        match self.kind {
            ActivationKind::Relu => "relu",
            ActivationKind::Gelu => "gelu",
            ActivationKind::Tanh => "tanh",
        }
    }

    fn forward<'s>(
        &self,
        _params: &ParamStore<T>,
        x: &Tensor<'s, T>,
        cache: Option<&mut Cache<'s, T>>,
    ) -> Result<Tensor<'s, T>, NnError> {
        if let Some(cache) = cache {
            cache.push(x.clone());
        }
        Ok(match self.kind {
            ActivationKind::Relu => x.try_map(crate::ops::relu)?,
            ActivationKind::Gelu => x.try_map(crate::ops::gelu)?,
            ActivationKind::Tanh => x.try_map(T::tanh)?,
        })
    }

    fn backward<'s>(
        &self,
        _params: &ParamStore<T>,
        _grads: &mut Gradients<'_, T>,
        cache: &mut Cache<'s, T>,
        grad: &Tensor<'s, T>,
    ) -> Result<Tensor<'s, T>, NnError> {
        let name = Layer::<T>::name(self);
        let x = cache.pop(name)?;
        check_grad(name, x.shape(), grad)?;
        let kind = self.kind;
        Ok(grad.try_zip_map(&x, move |g, x| {
            g * match kind {
                ActivationKind::Relu if x > T::zero() => T::one(),
                ActivationKind::Relu => T::zero(),
                ActivationKind::Gelu => crate::ops::gelu_grad(x),
                ActivationKind::Tanh => T::one() - x.tanh() * x.tanh(),
            }
        })?)
    }
}

/// Layer normalization over the last axis with a learned scale and shift:
/// `y = gamma (x - mean) / sqrt(var + eps) + beta`.
pub struct LayerNorm<T: Element = f32> {
    gamma: ParamId,
    beta: ParamId,
    eps: T,
}

impl<T: Element> LayerNorm<T> {
    /// Registers `{name}.gamma` (ones) and `{name}.beta` (zeros) of shape `[width]`.
    pub fn new(
        params: &mut ParamStore<T>,
        name: &str,
        width: usize,
        eps: T,
    ) -> Result<Self, NnError> {
        Ok(LayerNorm {
            gamma: params.ones(&format!("{name}.gamma"), &[width])?,
            beta: params.zeros(&format!("{name}.beta"), &[width])?,
            eps,
        })
    }
}

impl<T: Element> Layer<T> for LayerNorm<T> {
    fn name(&self) -> &'static str {
        "layer_norm"
    }

    fn forward<'s>(
        &self,
        params: &ParamStore<T>,
        x: &Tensor<'s, T>,
        cache: Option<&mut Cache<'s, T>>,
    ) -> Result<Tensor<'s, T>, NnError> {
        let normalized = x.try_layer_norm(self.eps)?;
        let scaled = normalized.try_mul(params.param(self.gamma, "layer_norm")?)?;
        let y = scaled.try_add(params.param(self.beta, "layer_norm")?)?;
        if let Some(cache) = cache {
            cache.push(normalized.clone());
            cache.push(x.clone());
        }
        Ok(y)
    }

    fn backward<'s>(
        &self,
        params: &ParamStore<T>,
        grads: &mut Gradients<'_, T>,
        cache: &mut Cache<'s, T>,
        grad: &Tensor<'s, T>,
    ) -> Result<Tensor<'s, T>, NnError> {
        let x = cache.pop("layer_norm")?;
        let normalized = cache.pop("layer_norm")?;
        // What the forward pushed: x of rank >= 1 and its normalization, of one shape.
        let Some(axis) = x.ndim().checked_sub(1) else {
            return Err(Error::InvalidShape {
                op: "layer_norm backward",
                shape: Shape::from(x.shape()),
                reason: "the cached input has no axis to normalize over".into(),
            }
            .into());
        };
        check_grad("layer_norm", x.shape(), grad)?;
        let width = x.shape()[axis];
        let gamma = params.param(self.gamma, "layer_norm")?.clone();
        let mismatch = |other: &[usize], reason: &str| Error::ShapeMismatch {
            op: "layer_norm backward",
            lhs: Shape::from(x.shape()),
            rhs: Shape::from(other),
            reason: reason.into(),
        };
        if normalized.shape() != x.shape() {
            let reason = "the cached input and its normalization differ in shape";
            return Err(mismatch(normalized.shape(), reason).into());
        }
        if gamma.shape() != [width] {
            let reason = "gamma must be as long as the normalized (last) axis";
            return Err(mismatch(gamma.shape(), reason).into());
        }
        // Parameter gradients: sums over every axis but the last.
        let mut dgamma = grad.try_mul(&normalized)?;
        let mut dbeta = grad.clone();
        for _ in 0..axis {
            dgamma = dgamma.try_sum(0)?;
            dbeta = dbeta.try_sum(0)?;
        }
        grads.accumulate(&gamma, dgamma)?;
        grads.accumulate(params.param(self.beta, "layer_norm")?, dbeta)?;
        // dx = inv_std / n * (n dxhat - sum(dxhat) - xhat * sum(dxhat * xhat)), per row: the kernel
        // of the op's own backward rule.
        let mut dx = grad.try_mul(&gamma)?;
        let mut out = dx.try_view_mut()?;
        let (xv, nv) = (x.view(), normalized.view());
        let eps = self.eps;
        Zip::from(out.lanes_mut(Axis(axis)))
            .and(xv.lanes(Axis(axis)))
            .and(nv.lanes(Axis(axis)))
            .for_each(|d, xrow, xhat| crate::ops::norm_backward_lane(d, xrow, xhat, eps));
        Ok(dx)
    }
}

/// `y = x + inner(x)`.
pub struct Residual<T: Element = f32> {
    inner: Sequential<T>,
}

impl<T: Element> Residual<T> {
    /// A residual connection around `inner`, whose output must have the input's shape.
    pub fn new(inner: Sequential<T>) -> Self {
        Residual { inner }
    }
}

impl<T: Element> Layer<T> for Residual<T> {
    fn name(&self) -> &'static str {
        "residual"
    }

    fn forward<'s>(
        &self,
        params: &ParamStore<T>,
        x: &Tensor<'s, T>,
        cache: Option<&mut Cache<'s, T>>,
    ) -> Result<Tensor<'s, T>, NnError> {
        let inner = self.inner.forward(params, x, cache)?;
        if inner.shape() != x.shape() {
            return Err(Error::ShapeMismatch {
                op: "residual",
                lhs: Shape::from(x.shape()),
                rhs: Shape::from(inner.shape()),
                reason: "the inner layers must keep the shape".into(),
            }
            .into());
        }
        Ok(inner.try_add(x)?)
    }

    fn backward<'s>(
        &self,
        params: &ParamStore<T>,
        grads: &mut Gradients<'_, T>,
        cache: &mut Cache<'s, T>,
        grad: &Tensor<'s, T>,
    ) -> Result<Tensor<'s, T>, NnError> {
        let inner = self.inner.backward(params, grads, cache, grad)?;
        // The block keeps the shape, so the inner gradient must have the output gradient's.
        check_grad("residual", grad.shape(), &inner)?;
        Ok(inner.try_add(grad)?)
    }
}

/// Layers applied in order.
pub struct Sequential<T: Element = f32> {
    layers: Vec<Box<dyn Layer<T>>>,
}

impl<T: Element> Sequential<T> {
    /// No layers yet.
    pub fn new() -> Self {
        Sequential { layers: Vec::new() }
    }

    /// Appends `layer`.
    pub fn push(mut self, layer: impl Layer<T> + 'static) -> Self {
        self.layers.push(Box::new(layer));
        self
    }

    /// The layers, in order.
    pub fn layers(&self) -> &[Box<dyn Layer<T>>] {
        &self.layers
    }
}

impl<T: Element> Default for Sequential<T> {
    fn default() -> Self {
        Sequential::new()
    }
}

impl<T: Element> Layer<T> for Sequential<T> {
    fn name(&self) -> &'static str {
        "sequential"
    }

    fn forward<'s>(
        &self,
        params: &ParamStore<T>,
        x: &Tensor<'s, T>,
        mut cache: Option<&mut Cache<'s, T>>,
    ) -> Result<Tensor<'s, T>, NnError> {
        let mut x = x.clone();
        for layer in &self.layers {
            x = layer.forward(params, &x, cache.as_deref_mut())?;
        }
        Ok(x)
    }

    fn backward<'s>(
        &self,
        params: &ParamStore<T>,
        grads: &mut Gradients<'_, T>,
        cache: &mut Cache<'s, T>,
        grad: &Tensor<'s, T>,
    ) -> Result<Tensor<'s, T>, NnError> {
        let mut grad = grad.clone();
        for layer in self.layers.iter().rev() {
            grad = layer.backward(params, grads, cache, &grad)?;
        }
        Ok(grad)
    }
}
