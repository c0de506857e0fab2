//! Modules: forward passes over parameters they own. In a training scope their ops record a graph,
//! so [`Tensor::backward`] differentiates them; no module has a backward pass of its own.

use std::cell::RefCell;

use super::NnError;
use crate::checkpoint::{self, Checkpointer};
use crate::element::Element;
use crate::error::{Error, Result, Shape};
use crate::ops::{check_probability, ConvOptions, Unary};
use crate::param::{Param, ParamPath, Parameters};
use crate::pool::Pool;
use crate::scope::Scope;
use crate::tensor::Tensor;
use crate::TensorOps;
use tensorscope_macros::Parameters;

/// A layer of a model: a forward pass over the parameters it owns ([`Parameters`] lists them for
/// optimizers).
pub trait Module<T: Element = f32>: Parameters<T> {
    /// The layer applied to `x`: recorded for [`Tensor::backward`] in a training scope, like any
    /// other ops. Fails with the first op's error (shapes, budgets).
    fn forward<'s>(&self, x: &Tensor<'s, T>) -> Result<Tensor<'s, T>>;
}

/// A parameter of normal samples with standard deviation `std`, from `seed`.
fn randn<T: Element>(pool: &Pool, shape: &[usize], std: f64, seed: u64) -> Result<Param<T>> {
    pool.scope(|s| (s.try_randn::<T>(shape, seed)? * T::from_f64(std)).try_detach())
}

/// A parameter of `value`.
fn full<T: Element>(pool: &Pool, shape: &[usize], value: T) -> Result<Param<T>> {
    pool.scope(|s| s.try_full::<T>(shape, value)?.try_detach())
}

/// `Ok(())` if `fits`, else [`Error::ShapeMismatch`] from `op` naming both parameters' shapes and
/// what `reason` says they must be.
fn check_shapes<T: Element>(
    op: &'static str,
    fits: bool,
    (first, second): (&Param<T>, &Param<T>),
    reason: &str,
) -> Result<()> {
    match fits {
        true => Ok(()),
        false => Err(Error::ShapeMismatch {
            op,
            lhs: Shape::from(first.shape()),
            rhs: Shape::from(second.shape()),
            reason: reason.into(),
        }),
    }
}

/// `param` (`[c]`) as a tensor of `x`'s scope of shape `[c, 1, 1]`: one value per channel of
/// images `[n, c, h, w]`, added or multiplied to every position of its channel.
fn per_channel<'s, T: Element>(x: &Tensor<'s, T>, param: &Param<T>) -> Result<Tensor<'s, T>> {
    x.bind(param).try_reshape(&[param.len(), 1, 1])
}

/// `y = x W + b` over the last axis of `x` (any leading axes: `[.., inputs]` to `[.., outputs]`),
/// `W` of shape `[inputs, outputs]`, `b` `[outputs]`. Its parameters are named `weight` and `bias`.
#[derive(Parameters)]
#[param(crate = "crate")]
pub struct Linear<T: Element = f32> {
    weight: Param<T>,
    bias: Param<T>,
}

impl<T: Element> Linear<T> {
    /// Weights of normal samples with standard deviation `1/sqrt(inputs)` from `seed`, bias zeros.
    pub fn new(pool: &Pool, inputs: usize, outputs: usize, seed: u64) -> Result<Self> {
        let std = 1.0 / (inputs.max(1) as f64).sqrt();
        Linear::with_std(pool, inputs, outputs, std, seed)
    }

    /// Like [`Linear::new`] with the weights' standard deviation given, e.g. small for the last
    /// layer of a residual branch so that a deep stack starts near the identity.
    pub fn with_std(
        pool: &Pool,
        inputs: usize,
        outputs: usize,
        std: f64,
        seed: u64,
    ) -> Result<Self> {
        Ok(Linear {
            weight: randn(pool, &[inputs, outputs], std, seed)?,
            bias: full(pool, &[outputs], T::zero())?,
        })
    }

    /// A layer over these parameters (a weight `[inputs, outputs]` and a bias `[outputs]`). Fails
    /// with [`Error::ShapeMismatch`] if their shapes do not fit.
    pub fn from_params(weight: Param<T>, bias: Param<T>) -> Result<Self> {
        check_shapes(
            "Linear::from_params",
            weight.shape().len() == 2 && bias.shape() == [weight.shape()[1]],
            (&weight, &bias),
            "the weight must be [inputs, outputs] and the bias [outputs]",
        )?;
        Ok(Linear { weight, bias })
    }

    /// The weight, `[inputs, outputs]`.
    pub fn weight(&self) -> &Param<T> {
        &self.weight
    }

    /// The bias, `[outputs]`.
    pub fn bias(&self) -> &Param<T> {
        &self.bias
    }
}

impl<T: Element> Module<T> for Linear<T> {
    fn forward<'s>(&self, x: &Tensor<'s, T>) -> Result<Tensor<'s, T>> {
        match x.ndim() {
            0 => Err(Error::InvalidShape {
                op: "Linear",
                shape: Shape::from(x.shape()),
                reason: "the input needs an axis of features".into(),
            }),
            // One vector: a matrix of one row.
            1 => x
                .try_unsqueeze(0)?
                .try_matmul(&self.weight)?
                .try_add(&self.bias)?
                .try_squeeze(0),
            // Leading axes are rows of one matrix product.
            _ => x.try_matmul(&self.weight)?.try_add(&self.bias),
        }
    }
}

/// `y = conv2d(x, W) + b` over images `[n, in, h, w]`, as PyTorch's `nn.Conv2d`: `W` of shape
/// `[out, in / groups, k, k]`, `b` `[out]` added to every position of its channel, the options
/// (stride, padding, dilation, groups) those of [`Tensor::try_conv2d_with`]. Its parameters are
/// named `weight` and `bias`, as PyTorch's, so a state dict of `nn.Conv2d` loads into it.
///
/// ```
/// use tensorscope::nn::{Conv2d, Module};
/// use tensorscope::ops::ConvOptions;
/// use tensorscope::Pool;
/// let pool = Pool::with_max_memory_mb(16);
/// let conv = Conv2d::<f32>::new(&pool, 3, 8, 3, ConvOptions { padding: 1, ..Default::default() }, 7)?;
/// pool.scope(|s| {
///     let y = conv.forward(&s.ones::<f32>(&[2, 3, 16, 16]))?;
///     assert_eq!(y.shape(), &[2, 8, 16, 16]);
///     Ok::<_, tensorscope::Error>(())
/// })?;
/// # Ok::<_, tensorscope::Error>(())
/// ```
#[derive(Parameters)]
#[param(crate = "crate")]
pub struct Conv2d<T: Element = f32> {
    weight: Param<T>,
    bias: Param<T>,
    #[param(skip)]
    options: ConvOptions,
}

impl<T: Element> Conv2d<T> {
    /// A `kernel` x `kernel` convolution from `inputs` to `outputs` channels: weights of normal
    /// samples with standard deviation `1/sqrt(inputs / groups * kernel^2)` (the fan-in) from
    /// `seed`, bias zeros. Fails with [`Error::InvalidArgument`] for zero groups or groups that
    /// do not divide both channel counts.
    pub fn new(
        pool: &Pool,
        inputs: usize,
        outputs: usize,
        kernel: usize,
        options: ConvOptions,
        seed: u64,
    ) -> Result<Self> {
        let groups = options.groups;
        if groups == 0 || !inputs.is_multiple_of(groups) || !outputs.is_multiple_of(groups) {
            return Err(Error::InvalidArgument {
                op: "Conv2d::new",
                arg: "groups",
                reason: format!(
                    "{groups} groups must divide the {inputs} input and {outputs} output channels"
                ),
            });
        }
        let fan_in = inputs / groups * kernel * kernel;
        let std = 1.0 / (fan_in.max(1) as f64).sqrt();
        let shape = [outputs, inputs / groups, kernel, kernel];
        Conv2d::from_params(
            randn(pool, &shape, std, seed)?,
            full(pool, &[outputs], T::zero())?,
            options,
        )
    }

    /// A convolution over these parameters (a weight `[out, in / groups, kh, kw]` and a bias
    /// `[out]`). Fails with [`Error::ShapeMismatch`] if their shapes do not fit.
    pub fn from_params(weight: Param<T>, bias: Param<T>, options: ConvOptions) -> Result<Self> {
        check_shapes(
            "Conv2d::from_params",
            weight.shape().len() == 4 && bias.shape() == [weight.shape()[0]],
            (&weight, &bias),
            "the weight must be [out, in / groups, kh, kw] and the bias [out]",
        )?;
        Ok(Conv2d {
            weight,
            bias,
            options,
        })
    }

    /// The weight, `[out, in / groups, kh, kw]`.
    pub fn weight(&self) -> &Param<T> {
        &self.weight
    }

    /// The bias, `[out]`.
    pub fn bias(&self) -> &Param<T> {
        &self.bias
    }

    /// The stride, padding, dilation and groups.
    pub fn options(&self) -> ConvOptions {
        self.options
    }
}

impl<T: Element> Module<T> for Conv2d<T> {
    fn forward<'s>(&self, x: &Tensor<'s, T>) -> Result<Tensor<'s, T>> {
        let y = x.try_conv2d_with(&self.weight, self.options)?;
        y.try_add(&per_channel(x, &self.bias)?)
    }
}

/// An elementwise activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Activation(Unary);

impl Activation {
    /// `max(x, 0)`.
    pub fn relu() -> Self {
        Activation(Unary::Relu)
    }

    /// GELU, tanh approximation (as [`TensorOps::gelu`](crate::TensorOps::gelu)).
    pub fn gelu() -> Self {
        Activation(Unary::Gelu)
    }

    /// `tanh(x)`.
    pub fn tanh() -> Self {
        Activation(Unary::Tanh)
    }

    /// SiLU, `x sigmoid(x)`.
    pub fn silu() -> Self {
        Activation(Unary::Silu)
    }

    /// `1 / (1 + exp(-x))`.
    pub fn sigmoid() -> Self {
        Activation(Unary::Sigmoid)
    }
}

impl<T: Element> Module<T> for Activation {
    fn forward<'s>(&self, x: &Tensor<'s, T>) -> Result<Tensor<'s, T>> {
        self.0.apply(x)
    }
}

/// Layers without parameters, for any element type.
macro_rules! no_parameters {
    ($($layer:ty),*) => {$(
        impl<T: Element> Parameters<T> for $layer {
            fn visit_params(&self, _: &ParamPath<'_>, _: &mut dyn FnMut(&ParamPath<'_>, &Param<T>)) {}

            fn visit_params_mut(
                &mut self,
                _: &ParamPath<'_>,
                _: &mut dyn FnMut(&ParamPath<'_>, &mut Param<T>),
            ) {
            }
        }
    )*};
}

no_parameters!(Activation, Dropout);

/// Layer normalization over the last axis with a learned scale and shift:
/// `y = gamma (x - mean) / sqrt(var + eps) + beta`. Its parameters are named as PyTorch's
/// `nn.LayerNorm` names them: `weight` (`gamma`) and `bias` (`beta`).
#[derive(Parameters)]
#[param(crate = "crate")]
pub struct LayerNorm<T: Element = f32> {
    #[param(rename = "weight")]
    gamma: Param<T>,
    #[param(rename = "bias")]
    beta: Param<T>,
    #[param(skip)]
    eps: T,
}

impl<T: Element> LayerNorm<T> {
    /// `gamma` ones and `beta` zeros of shape `[width]`.
    pub fn new(pool: &Pool, width: usize, eps: T) -> Result<Self> {
        Ok(LayerNorm {
            gamma: full(pool, &[width], T::one())?,
            beta: full(pool, &[width], T::zero())?,
            eps,
        })
    }

    /// A layer over these parameters (a scale `gamma` and a shift `beta`, both `[width]`), e.g.
    /// loaded from a file. Fails with [`Error::ShapeMismatch`] if their shapes differ or are not
    /// one axis.
    pub fn from_params(gamma: Param<T>, beta: Param<T>, eps: T) -> Result<Self> {
        check_shapes(
            "LayerNorm::from_params",
            gamma.shape().len() == 1 && beta.shape() == gamma.shape(),
            (&gamma, &beta),
            "gamma and beta must both have shape [width]",
        )?;
        Ok(LayerNorm { gamma, beta, eps })
    }

    /// The scale, `[width]`.
    pub fn gamma(&self) -> &Param<T> {
        &self.gamma
    }

    /// The shift, `[width]`.
    pub fn beta(&self) -> &Param<T> {
        &self.beta
    }
}

impl<T: Element> Module<T> for LayerNorm<T> {
    fn forward<'s>(&self, x: &Tensor<'s, T>) -> Result<Tensor<'s, T>> {
        x.try_layer_norm(self.eps)?
            .try_mul(&self.gamma)?
            .try_add(&self.beta)
    }
}

/// Group normalization with a learned scale and shift per channel, as PyTorch's `nn.GroupNorm`:
/// over images `[n, c, h, w]`, [`Tensor::try_group_norm`] (each image's channels in `groups`
/// groups, each group normalized over its channels and positions), then
/// `y = weight[c] x_hat + bias[c]`. Its parameters are named `weight` and `bias`, as PyTorch's.
///
/// ```
/// use tensorscope::nn::{GroupNorm, Module};
/// use tensorscope::Pool;
/// let pool = Pool::with_max_memory_mb(16);
/// let norm = GroupNorm::<f32>::new(&pool, 2, 4, 1e-5)?;
/// pool.scope(|s| {
///     let x = s.arange::<f32>(0.0, 32.0, 1.0).reshape(&[1, 4, 2, 4]);
///     let y = norm.forward(&x)?;
///     // A new layer scales by one and shifts by zero: each group has mean 0.
///     let first: f32 = y.to_vec()[..16].iter().sum();
///     assert!(first.abs() < 1e-4);
///     Ok::<_, tensorscope::Error>(())
/// })?;
/// # Ok::<_, tensorscope::Error>(())
/// ```
#[derive(Parameters)]
#[param(crate = "crate")]
pub struct GroupNorm<T: Element = f32> {
    weight: Param<T>,
    bias: Param<T>,
    #[param(skip)]
    groups: usize,
    #[param(skip)]
    eps: T,
}

impl<T: Element> GroupNorm<T> {
    /// `groups` groups over `channels` channels (PyTorch's argument order), the scale ones and
    /// the shift zeros. Fails with [`Error::InvalidArgument`] for zero groups or groups that do not
    /// divide the channels.
    pub fn new(pool: &Pool, groups: usize, channels: usize, eps: T) -> Result<Self> {
        GroupNorm::from_params(
            full(pool, &[channels], T::one())?,
            full(pool, &[channels], T::zero())?,
            groups,
            eps,
        )
    }

    /// A layer over these parameters (a scale `weight` and a shift `bias`, both `[channels]`),
    /// e.g. loaded from a file. Fails with [`Error::ShapeMismatch`] if their shapes differ or are
    /// not one axis, and with [`Error::InvalidArgument`] for groups that do not divide the
    /// channels.
    pub fn from_params(weight: Param<T>, bias: Param<T>, groups: usize, eps: T) -> Result<Self> {
        check_shapes(
            "GroupNorm::from_params",
            weight.shape().len() == 1 && bias.shape() == weight.shape(),
            (&weight, &bias),
            "the weight and the bias must both have shape [channels]",
        )?;
        let channels = weight.len();
        if groups == 0 || !channels.is_multiple_of(groups) {
            return Err(Error::InvalidArgument {
                op: "GroupNorm",
                arg: "groups",
                reason: format!("{groups} groups must divide the {channels} channels"),
            });
        }
        Ok(GroupNorm {
            weight,
            bias,
            groups,
            eps,
        })
    }

    /// The scale, `[channels]`.
    pub fn weight(&self) -> &Param<T> {
        &self.weight
    }

    /// The shift, `[channels]`.
    pub fn bias(&self) -> &Param<T> {
        &self.bias
    }

    /// The number of groups.
    pub fn groups(&self) -> usize {
        self.groups
    }
}

impl<T: Element> Module<T> for GroupNorm<T> {
    /// Fails with [`Error::ShapeMismatch`] for images whose channels are not the layer's, and
    /// with the op's errors otherwise (an input that is not 4-D).
    fn forward<'s>(&self, x: &Tensor<'s, T>) -> Result<Tensor<'s, T>> {
        let channels = self.weight.len();
        if x.ndim() == 4 && x.shape()[1] != channels {
            return Err(Error::ShapeMismatch {
                op: "GroupNorm",
                lhs: Shape::from(x.shape()),
                rhs: Shape::from(self.weight.shape()),
                reason: format!(
                    "the images have {} channels, the layer {channels}",
                    x.shape()[1]
                ),
            });
        }
        x.try_group_norm(self.groups, self.eps)?
            .try_mul(&per_channel(x, &self.weight)?)?
            .try_add(&per_channel(x, &self.bias)?)
    }
}

/// Dropout while training, the identity otherwise (PyTorch's `nn.Dropout`): in training mode,
/// [`Tensor::dropout`] with probability `p`, its mask drawn from the thread's generator
/// ([`manual_seed`](crate::manual_seed)). A new module is in training mode, as in PyTorch;
/// [`Dropout::set_training`] switches it.
///
/// ```
/// use tensorscope::nn::{Dropout, Module};
/// use tensorscope::Pool;
/// let pool = Pool::with_max_memory_mb(16);
/// let mut dropout = Dropout::new(0.5).unwrap();
/// pool.scope(|s| {
///     let x = s.ones::<f32>(&[100]);
///     assert!(dropout.forward(&x).unwrap().to_vec().contains(&0.0));
///     dropout.set_training(false);
///     assert_eq!(dropout.forward(&x).unwrap().to_vec(), vec![1.0; 100]);
/// });
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    p: f64,
    training: bool,
}

impl Dropout {
    /// Dropout with probability `p`, in training mode. Fails with [`Error::InvalidArgument`] for a
    /// `p` outside `[0, 1)`.
    pub fn new(p: f64) -> Result<Self> {
        check_probability("Dropout::new", p)?;
        Ok(Dropout { p, training: true })
    }

    /// The probability of dropping an element.
    pub fn p(&self) -> f64 {
        self.p
    }

    /// Whether the module drops elements (training mode).
    pub fn is_training(&self) -> bool {
        self.training
    }

    /// Switches training mode on (dropping elements) or off (the identity).
    pub fn set_training(&mut self, training: bool) {
        self.training = training;
    }
}

impl<T: Element> Module<T> for Dropout {
    fn forward<'s>(&self, x: &Tensor<'s, T>) -> Result<Tensor<'s, T>> {
        match self.training {
            true => x.try_dropout(self.p),
            false => Ok(x.clone()),
        }
    }
}

/// `y = x + inner(x)`. Its parameters are the inner layers', under the same names.
#[derive(Parameters)]
#[param(crate = "crate")]
pub struct Residual<T: Element = f32> {
    #[param(flatten)]
    inner: Sequential<T>,
}

impl<T: Element> Residual<T> {
    /// A residual connection around `inner`.
    pub fn new(inner: Sequential<T>) -> Self {
        Residual { inner }
    }
}

impl<T: Element> Module<T> for Residual<T> {
    fn forward<'s>(&self, x: &Tensor<'s, T>) -> Result<Tensor<'s, T>> {
        self.inner.forward(x)?.try_add(x)
    }
}

/// Modules applied in order. Their parameters are named by position, as in PyTorch's
/// `nn.Sequential`: `0.weight`, `0.bias`, `2.weight`, ...
#[derive(Parameters)]
#[param(crate = "crate")]
pub struct Sequential<T: Element = f32> {
    #[param(flatten)]
    layers: Vec<Box<dyn Module<T>>>,
}

impl<T: Element> Sequential<T> {
    /// No layers: the identity.
    pub fn new() -> Self {
        Sequential { layers: Vec::new() }
    }

    /// The same model with `layer` appended.
    pub fn push(mut self, layer: impl Module<T> + 'static) -> Self {
        self.layers.push(Box::new(layer));
        self
    }

    /// The layers, in order.
    pub fn layers(&self) -> &[Box<dyn Module<T>>] {
        &self.layers
    }

    /// The forward with activation checkpointing as `ckpt`'s configuration says: the inputs of the
    /// layers its policy picks are stored, and in a training scope the output's backward replays
    /// the layers from them (as a `#[checkpoint]` function's does). Fails with the first layer's
    /// error or a checkpointer error.
    pub fn forward_checkpointed<'s>(
        &self,
        ckpt: &mut Checkpointer<T>,
        x: Tensor<'s, T>,
    ) -> std::result::Result<Tensor<'s, T>, NnError> {
        let failure = RefCell::new(None);
        let y = checkpoint::run_layers(
            None,
            Some(ckpt),
            x,
            self.layers.iter().map(|layer| &**layer),
            &[],
            |_: &Scope<'_, 's>, x, _, layer: &dyn Module<T>| match layer.forward(&x) {
                Ok(y) => y,
                Err(e) => {
                    // The rest of the layers run on the last good activation; the error is
                    // reported once the forward has unwound its scopes.
                    failure.borrow_mut().get_or_insert(e);
                    x
                }
            },
        )
        .map_err(|e| NnError::Checkpoint(Box::new(e)))?;
        match failure.into_inner() {
            Some(e) => Err(e.into()),
            None => Ok(y),
        }
    }
}

impl<T: Element> Default for Sequential<T> {
    fn default() -> Self {
        Sequential::new()
    }
}

impl<T: Element> Module<T> for Sequential<T> {
    fn forward<'s>(&self, x: &Tensor<'s, T>) -> Result<Tensor<'s, T>> {
        self.layers
            .iter()
            .try_fold(x.clone(), |x, layer| layer.forward(&x))
    }
}
