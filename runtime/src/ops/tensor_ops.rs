//! [`TensorOps`]: the ops that can write their output over their input (elementwise functions and
//! per-lane kernels such as softmax and the norms), for `Tensor` and `&Tensor` alike.

use std::sync::Arc;

use ndarray::{ArrayViewMut1, Axis};

use super::elementwise::{zip_with, Binary};
use super::lanes::{lane_op, Lane, Lanes};
use super::{check_axis, simd, work, Arg, Dim};
use crate::autograd::{self, Recorder, Rule, Saved, Scalar, Unary};
use crate::element::Element;
use crate::error::{or_panic, Result};
use crate::tensor::Tensor;

/// An elementwise function with its rule, as a `try_` method and a panicking one.
macro_rules! elementwise {
    ($(#[doc = $doc:literal])* $name:ident $try_name:ident $kind:ident; $($rest:tt)*) => {
        $(#[doc = $doc])*
        /// Fails only if an output cannot be rented.
        fn $try_name(self) -> Result<Tensor<'s, T>> {
            self.with_arg(|a| unary(a, Unary::$kind))
        }

        $(#[doc = $doc])*
        ///
        /// # Panics
        /// If the budget is exhausted, with the error's message.
        #[track_caller]
        fn $name(self) -> Tensor<'s, T> {
            or_panic(self.$try_name())
        }

        elementwise! { $($rest)* }
    };
    () => {};
}

/// Ops that write in place when they can, implemented for both `Tensor` and `&Tensor`.
///
/// On an owned `Tensor` that is the only handle on its buffer, the result overwrites the input and
/// nothing is rented; on a `&Tensor` (or a shared one) a new tensor is rented in its scope. The values
/// are the same either way. A tensor saved by a gradient graph has another handle, so it is never
/// overwritten.
///
/// ```
/// use tensorscope_runtime::{Pool, TensorOps};
/// let pool = Pool::with_max_memory_mb(16);
/// pool.scope(|s| {
///     let x = s.from_slice::<f32>(&[3], &[-1.0, 0.0, 2.0]);
///     let y = (&x).relu();          // rents a new buffer; `x` is still usable
///     let misses = pool.stats().misses;
///     let z = y.relu().exp();       // `y` is unique: both ops run in its buffer
///     assert_eq!(pool.stats().misses, misses);
///     assert_eq!(z.to_vec()[..2], [1.0, 1.0]);
///     assert!((z.to_vec()[2] - 2f32.exp()).abs() < 1e-6);
///     assert_eq!(x.to_vec(), vec![-1.0, 0.0, 2.0]);
/// });
/// ```
pub trait TensorOps<'s, T: Element>: Sized + sealed::Sealed<'s, T> {
    /// The tensor the op reads.
    fn as_tensor(&self) -> &Tensor<'s, T>;

    /// Applies `f` to every element. Fails only if an output cannot be rented. `f` has no known
    /// derivative: a backward through the result fails ([`NotDifferentiable`](crate::Error::NotDifferentiable)); use
    /// [`TensorOps::try_map_with_derivative`] in a differentiated forward.
    fn try_map(self, f: impl Fn(T) -> T + Sync) -> Result<Tensor<'s, T>> {
        self.with_arg(|a| map_recorded(a, f, |_| Rule::NotDifferentiable("map")))
    }

    /// Applies `f` to every element; see [`TensorOps::try_map`].
    ///
    /// # Panics
    /// If an output cannot be rented (pool budget exhausted), with the error's message.
    #[track_caller]
    fn map(self, f: impl Fn(T) -> T + Sync) -> Tensor<'s, T> {
        or_panic(self.try_map(f))
    }

    /// Applies `f` to every element, with `df` its derivative: backward multiplies the gradient by
    /// `df(x)`. Fails only if an output cannot be rented.
    fn try_map_with_derivative(
        self,
        f: impl Fn(T) -> T + Send + Sync + 'static,
        df: impl Fn(T) -> T + Send + Sync + 'static,
    ) -> Result<Tensor<'s, T>> {
        self.with_arg(|a| {
            let saved = Recorder::of(&[a.tensor()]).map(|_| a.tensor().saved());
            let f = Arc::new(f);
            let kernel = Arc::clone(&f);
            map_recorded(
                a,
                move |x| kernel(x),
                move |_| Rule::Map(saved.expect("saved when recording"), f, Arc::new(df)),
            )
        })
    }

    /// Applies `f` with derivative `df` to every element; see
    /// [`TensorOps::try_map_with_derivative`].
    ///
    /// # Panics
    /// If an output cannot be rented (pool budget exhausted), with the error's message.
    #[track_caller]
    fn map_with_derivative(
        self,
        f: impl Fn(T) -> T + Send + Sync + 'static,
        df: impl Fn(T) -> T + Send + Sync + 'static,
    ) -> Tensor<'s, T> {
        or_panic(self.try_map_with_derivative(f, df))
    }

    /// Applies `kernel` to every 1-D lane along `axis` of a copy of the tensor (or of the tensor itself
    /// when it can be written in place): the escape hatch for row-wise kernels. Fails with
    /// [`Error::AxisOutOfRange`](crate::Error::AxisOutOfRange) or if an output cannot be rented.
    /// The kernel has no known derivative: a backward through the result fails.
    fn try_map_lanes(
        self,
        axis: impl Dim,
        kernel: impl FnMut(ArrayViewMut1<'_, T>),
    ) -> Result<Tensor<'s, T>> {
        self.with_arg(|a| {
            let recorder = Recorder::of(&[a.tensor()]);
            let out = map_lanes(a, axis, kernel)?;
            Ok(autograd::finish(recorder, out, |_| {
                Rule::NotDifferentiable("map_lanes")
            }))
        })
    }

    /// Applies `kernel` to every 1-D lane along `axis`; see [`TensorOps::try_map_lanes`].
    ///
    /// # Panics
    /// For a bad axis or an exhausted budget, with the error's message.
    #[track_caller]
    fn map_lanes(self, axis: impl Dim, kernel: impl FnMut(ArrayViewMut1<'_, T>)) -> Tensor<'s, T> {
        or_panic(self.try_map_lanes(axis, kernel))
    }

    elementwise! {
        /// `max(x, 0)`, with NaN passed through (as in PyTorch).
        relu try_relu Relu;
        /// GELU, tanh approximation: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))` (PyTorch's
        /// `approximate="tanh"`, GPT-2's).
        gelu try_gelu Gelu;
        /// SiLU (swish), `x * sigmoid(x)`.
        silu try_silu Silu;
        /// The logistic sigmoid `1 / (1 + exp(-x))`.
        sigmoid try_sigmoid Sigmoid;
        /// Hyperbolic tangent.
        tanh try_tanh Tanh;
        /// `e^x`.
        exp try_exp Exp;
        /// GELU, exact: `x Phi(x) = 0.5 x (1 + erf(x / sqrt(2)))` (PyTorch's default `F.gelu(x)`),
        /// computed as `0.5 x erfc(-x / sqrt(2))`, which keeps its relative accuracy for negative
        /// `x`.
        gelu_erf try_gelu_erf GeluErf;
        /// The error function `erf(x) = 2/sqrt(pi) int_0^x e^{-t^2} dt`.
        erf try_erf Erf;
        /// The natural logarithm (NaN below 0, `-inf` at 0).
        log try_log Log;
        /// The square root (NaN below 0).
        sqrt try_sqrt Sqrt;
        /// The absolute value; its gradient is the sign (0 at 0, as PyTorch).
        abs try_abs Abs;
    }

    /// Every element to the power `p` (`powf`; a negative base with a fractional power is NaN).
    /// Fails only if an output cannot be rented.
    fn try_pow(self, p: T) -> Result<Tensor<'s, T>> {
        self.with_arg(|a| scalar(a, Scalar::Pow, p, move |v| v.powf(p)))
    }

    /// Every element to the power `p`; see [`TensorOps::try_pow`].
    ///
    /// # Panics
    /// If the budget is exhausted, with the error's message.
    #[track_caller]
    fn pow(self, p: T) -> Tensor<'s, T> {
        or_panic(self.try_pow(p))
    }

    /// Every element limited to `[min, max]` (NaN stays NaN, as in PyTorch). The gradient passes
    /// where `min <= x <= max` and is 0 elsewhere. Fails with
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) if `min > max` (or either is NaN).
    fn try_clamp(self, min: T, max: T) -> Result<Tensor<'s, T>> {
        if min.partial_cmp(&max).is_none_or(|o| o.is_gt()) {
            return Err(crate::Error::InvalidArgument {
                op: "clamp",
                arg: "bounds",
                reason: format!("min {min} is not at most max {max}"),
            });
        }
        self.with_arg(|a| {
            let x = Recorder::of(&[a.tensor()]).map(|_| a.tensor().saved());
            map_recorded(
                a,
                #[inline(always)]
                move |x: T| clamp(x, min, max),
                |_| Rule::Clamp(x.expect("saved when recording"), min, max),
            )
        })
    }

    /// Every element limited to `[min, max]`; see [`TensorOps::try_clamp`].
    ///
    /// # Panics
    /// If `min > max`, or the budget is exhausted, with the error's message.
    #[track_caller]
    fn clamp(self, min: T, max: T) -> Tensor<'s, T> {
        or_panic(self.try_clamp(min, max))
    }

    /// RMS normalization over the last axis, without a scale: `x / sqrt(mean(x^2) + eps)`
    /// (PyTorch's `F.rms_norm` without a weight; scale by broadcasting, `&y * &gamma`). Fails with
    /// [`Error::InvalidShape`](crate::Error::InvalidShape) for a rank-0 tensor, or a budget error.
    fn try_rms_norm(self, eps: T) -> Result<Tensor<'s, T>> {
        let axis = last_axis("rms_norm", self.as_tensor())?;
        self.with_arg(|a| {
            recorded_lanes(a, axis, Lane::RmsNorm(eps), |x, _| {
                Rule::RmsNorm(x.expect("saves the input"), eps)
            })
        })
    }

    /// RMS normalization over the last axis; see [`TensorOps::try_rms_norm`].
    ///
    /// # Panics
    /// For a rank-0 tensor or an exhausted budget, with the error's message.
    #[track_caller]
    fn rms_norm(self, eps: T) -> Tensor<'s, T> {
        or_panic(self.try_rms_norm(eps))
    }

    /// Softmax along `axis` (max-subtracted, so large inputs do not overflow). Fails with
    /// [`Error::AxisOutOfRange`](crate::Error::AxisOutOfRange) for a bad axis.
    fn try_softmax(self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        let axis = check_axis("softmax", self.as_tensor(), axis)?;
        self.with_arg(|a| {
            recorded_lanes(a, axis, Lane::Softmax, |_, y| {
                Rule::Softmax(y.saved(), axis)
            })
        })
    }

    /// Softmax along `axis`; see [`TensorOps::try_softmax`].
    ///
    /// # Panics
    /// For a bad axis or an exhausted budget, with the error's message.
    #[track_caller]
    fn softmax(self, axis: impl Dim) -> Tensor<'s, T> {
        or_panic(self.try_softmax(axis))
    }

    /// Log-softmax along `axis`, computed as `x - max - ln(sum(exp(x - max)))`. Fails with
    /// [`Error::AxisOutOfRange`](crate::Error::AxisOutOfRange) for a bad axis.
    fn try_log_softmax(self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        let axis = check_axis("log_softmax", self.as_tensor(), axis)?;
        self.with_arg(|a| {
            recorded_lanes(a, axis, Lane::LogSoftmax, |_, y| {
                Rule::LogSoftmax(y.saved(), axis)
            })
        })
    }

    /// Log-softmax along `axis`; see [`TensorOps::try_log_softmax`].
    ///
    /// # Panics
    /// For a bad axis or an exhausted budget, with the error's message.
    #[track_caller]
    fn log_softmax(self, axis: impl Dim) -> Tensor<'s, T> {
        or_panic(self.try_log_softmax(axis))
    }

    /// Layer normalization over the last axis, without affine parameters:
    /// `(x - mean) / sqrt(var + eps)` with the biased variance. Scale and shift by broadcasting
    /// (`&y * &gamma + &beta`). Fails with
    /// [`Error::InvalidShape`](crate::Error::InvalidShape) for a rank-0 tensor.
    fn try_layer_norm(self, eps: T) -> Result<Tensor<'s, T>> {
        let axis = last_axis("layer_norm", self.as_tensor())?;
        self.with_arg(|a| {
            recorded_lanes(a, axis, Lane::LayerNorm(eps), |x, y| {
                Rule::LayerNorm(x.expect("saves the input"), y.saved(), eps)
            })
        })
    }

    /// Layer normalization over the last axis; see [`TensorOps::try_layer_norm`].
    ///
    /// # Panics
    /// For a rank-0 tensor or an exhausted budget, with the error's message.
    #[track_caller]
    fn layer_norm(self, eps: T) -> Tensor<'s, T> {
        or_panic(self.try_layer_norm(eps))
    }
}

/// ReLU of one value, as PyTorch's `threshold(x, 0, 0)`: `-0.0` gives `0.0` and NaN stays NaN
/// (`Float::max` would turn NaN into 0).
#[inline(always)]
pub(crate) fn relu<T: Element>(x: T) -> T {
    if x <= T::zero() {
        T::zero()
    } else {
        x
    }
}

/// GELU of one value, tanh approximation: `0.5 x (1 + tanh(u))`, `u = sqrt(2/pi) (x + 0.044715
/// x^3)`, computed as `x / (1 + e^(-2u))`, the same function (`(1 + tanh(u)) / 2` is the logistic
/// function of `2u`): one `exp` and one division, where `tanh` computes two forms and selects one,
/// and no cancellation where `tanh(u)` nears -1 (the tail keeps its relative accuracy instead of
/// rounding to 0).
#[inline(always)]
pub(crate) fn gelu<T: Element>(x: T) -> T {
    let c = T::from_f64(-2.0 * (2.0 / std::f64::consts::PI).sqrt());
    let k = T::from_f64(0.044_715);
    x / (T::one() + (c * (x + k * x * x * x)).exp_kernel())
}

/// `d/dx` of the tanh-approximated GELU.
#[inline(always)]
fn gelu_grad<T: Element>(x: T) -> T {
    let c = T::from_f64((2.0 / std::f64::consts::PI).sqrt());
    let k = T::from_f64(0.044_715);
    let half = T::from_f64(0.5);
    let three = T::from_f64(3.0);
    let inner = c * (x + k * x * x * x);
    let t = inner.tanh_kernel();
    half * (T::one() + t) + half * x * (T::one() - t * t) * c * (T::one() + three * k * x * x)
}

/// `Phi(x)`, the standard normal distribution function, as `0.5 erfc(-x / sqrt(2))`.
#[inline(always)]
fn normal_cdf<T: Element>(x: T) -> T {
    T::from_f64(0.5) * (-x * T::from_f64(std::f64::consts::FRAC_1_SQRT_2)).erfc_kernel()
}

/// GELU of one value, exact: `x Phi(x)` (PyTorch's default).
#[inline(always)]
fn gelu_erf<T: Element>(x: T) -> T {
    x * normal_cdf(x)
}

/// `d/dx` of the exact GELU: `Phi(x) + x phi(x)`.
#[inline(always)]
fn gelu_erf_grad<T: Element>(x: T) -> T {
    let pdf = (T::from_f64(-0.5) * x * x).exp_kernel() * T::from_f64(0.398_942_280_401_432_7);
    normal_cdf(x) + x * pdf
}

#[inline(always)]
fn sigmoid<T: Element>(x: T) -> T {
    T::one() / (T::one() + (-x).exp_kernel())
}

#[inline(always)]
fn silu<T: Element>(x: T) -> T {
    x / (T::one() + (-x).exp_kernel())
}

/// `d/dx` of SiLU: `sigmoid(x) (1 + x (1 - sigmoid(x)))`, with `1 - sigmoid(x)` as
/// `e^-x sigmoid(x)`, which does not cancel where `sigmoid(x)` nears 1.
#[inline(always)]
fn silu_grad<T: Element>(x: T) -> T {
    let e = (-x).exp_kernel();
    let sig = T::one() / (T::one() + e);
    sig * (T::one() + x * (e * sig))
}

/// `x` limited to `[min, max]`, NaN kept.
#[inline(always)]
fn clamp<T: Element>(x: T, min: T, max: T) -> T {
    if x < min {
        min
    } else if x > max {
        max
    } else {
        x
    }
}

/// The last axis of `t`, or [`Error::InvalidShape`](crate::Error::InvalidShape) for rank 0.
fn last_axis<T: Element>(op: &'static str, t: &Tensor<'_, T>) -> Result<usize> {
    t.ndim()
        .checked_sub(1)
        .ok_or_else(|| crate::Error::InvalidShape {
            op,
            shape: t.shape().into(),
            reason: "needs at least one axis to normalize over".into(),
        })
}

/// The gradient of the input of the elementwise function `kind` given `g`, the gradient of its
/// output, and what its rule saved (see [`Unary::saves_output`]): `g` times the derivative, in one
/// vectorised loop, written over `g` when it is unique.
pub(crate) fn unary_backward<'s, T: Element>(
    kind: Unary,
    g: Tensor<'s, T>,
    saved: Option<&Tensor<'s, T>>,
) -> Result<Tensor<'s, T>> {
    macro_rules! times {
        (|$g:ident, $s:ident| $e:expr) => {
            zip_with(
                Binary::ZipMap,
                Arg::Owned(g),
                Arg::Borrowed(saved.expect("the rule saved what it needs")),
                #[inline(always)]
                |$g: T, $s: T| $e,
            )
        };
    }
    match kind {
        Unary::Neg => unary(Arg::Owned(g), Unary::Neg),
        // Written as the layers' hand-written backward passes are, for the same bits.
        Unary::Relu => times!(|g, y| g * if y > T::zero() { T::one() } else { T::zero() }),
        Unary::Gelu => times!(|g, x| g * gelu_grad(x)),
        Unary::GeluErf => times!(|g, x| g * gelu_erf_grad(x)),
        Unary::Silu => times!(|g, x| g * silu_grad(x)),
        Unary::Sigmoid => times!(|g, y| g * y * (T::one() - y)),
        Unary::Tanh => times!(|g, y| g * (T::one() - y * y)),
        Unary::Exp => times!(|g, y| g * y),
        Unary::Log => times!(|g, x| g / x),
        Unary::Sqrt => times!(|g, y| g / (y + y)),
        // 2 / sqrt(pi) e^{-x^2}
        Unary::Erf => times!(
            |g, x| g * (T::from_f64(std::f64::consts::FRAC_2_SQRT_PI) * (-x * x).exp_kernel())
        ),
        // As PyTorch: the sign, 0 at 0.
        Unary::Abs => times!(|g, x| if x > T::zero() {
            g
        } else if x < T::zero() {
            -g
        } else {
            x * g
        }),
    }
}

/// The gradient of `clamp(x, min, max)`'s input: `g` where `min <= x <= max`, else 0.
pub(crate) fn clamp_backward<'s, T: Element>(
    g: Tensor<'s, T>,
    x: &Tensor<'s, T>,
    min: T,
    max: T,
) -> Result<Tensor<'s, T>> {
    zip_with(
        Binary::ZipMap,
        Arg::Owned(g),
        Arg::Borrowed(x),
        #[inline(always)]
        |g: T, x: T| if x >= min && x <= max { g } else { T::zero() },
    )
}

/// The lane op `kind` along `axis` (checked) of `src`, with the rule `rule(x, y)` recorded: `x` is
/// the input, saved before the kernel runs (so it is not overwritten) for the norms, whose
/// backward needs it; `y` the output.
fn recorded_lanes<'s, T: Element>(
    src: Arg<'_, 's, T>,
    axis: usize,
    kind: Lane<T>,
    rule: impl FnOnce(Option<Saved<T>>, &Tensor<'s, T>) -> Rule<T>,
) -> Result<Tensor<'s, T>> {
    let recorder = Recorder::of(&[src.tensor()]);
    let saves_input = matches!(kind, Lane::LayerNorm(_) | Lane::RmsNorm(_));
    let x = (recorder.is_some() && saves_input).then(|| src.tensor().saved());
    let lanes = Lanes::along(src.tensor().shape(), axis);
    let out = lane_op(src, lanes, kind)?;
    Ok(autograd::finish(recorder, out, |y| rule(x, y)))
}

/// `f` of every element, in place when the input can be written, with `rule` recorded.
fn map_recorded<'s, T: Element>(
    src: Arg<'_, 's, T>,
    f: impl Fn(T) -> T + Sync,
    rule: impl FnOnce(&Tensor<'s, T>) -> Rule<T>,
) -> Result<Tensor<'s, T>> {
    let recorder = Recorder::of(&[src.tensor()]);
    let out = map(src, f)?;
    Ok(autograd::finish(recorder, out, rule))
}

/// An elementwise function with its rule; the input it needs is saved before the kernel runs, so
/// it is not overwritten.
pub(crate) fn unary<'s, T: Element>(src: Arg<'_, 's, T>, kind: Unary) -> Result<Tensor<'s, T>> {
    let recording = Recorder::of(&[src.tensor()]).is_some();
    let input =
        (recording && !kind.saves_output() && kind != Unary::Neg).then(|| src.tensor().saved());
    let rule = |y: &Tensor<'s, T>| {
        let saved = if kind.saves_output() {
            Some(y.saved())
        } else {
            input
        };
        Rule::Unary(kind, saved)
    };
    // One instantiation of the loop per function, so that it inlines and vectorises (a function
    // pointer would be called once per element). The function is a closure marked to inline: it
    // then compiles inside the vectorised loop of every instruction set `simd` dispatches to,
    // whichever codegen unit the loop lands in.
    macro_rules! pointwise {
        ($f:expr) => {
            map_recorded(
                src,
                #[inline(always)]
                |x: T| $f(x),
                rule,
            )
        };
    }
    match kind {
        Unary::Relu => pointwise!(relu),
        Unary::Gelu => pointwise!(gelu),
        Unary::Silu => pointwise!(silu),
        Unary::Sigmoid => pointwise!(sigmoid),
        Unary::Tanh => pointwise!(T::tanh_kernel),
        Unary::Exp => pointwise!(T::exp_kernel),
        Unary::Neg => pointwise!(|x: T| -x),
        Unary::Log => pointwise!(T::ln_kernel),
        Unary::Erf => pointwise!(T::erf_kernel),
        Unary::Sqrt => pointwise!(T::sqrt),
        Unary::Abs => pointwise!(T::abs),
        Unary::GeluErf => pointwise!(gelu_erf),
    }
}

/// The elementwise function `kind` of `x`, as [`TensorOps`] runs it (for a replay).
pub(crate) fn unary_op<'s, T: Element>(x: &Tensor<'s, T>, kind: Unary) -> Result<Tensor<'s, T>> {
    unary(Arg::Borrowed(x), kind)
}

/// `x` with scalar `c` by `kind`, as the operators compute it (for a replay).
pub(crate) fn scalar_op<'s, T: Element>(
    x: &Tensor<'s, T>,
    kind: Scalar,
    c: T,
) -> Result<Tensor<'s, T>> {
    let x = Arg::Borrowed(x);
    match kind {
        Scalar::Add => scalar(
            x,
            kind,
            c,
            #[inline(always)]
            move |v| v + c,
        ),
        Scalar::Sub => scalar(
            x,
            kind,
            c,
            #[inline(always)]
            move |v| v - c,
        ),
        Scalar::SubFrom => scalar(
            x,
            kind,
            c,
            #[inline(always)]
            move |v| c - v,
        ),
        Scalar::Mul => scalar(
            x,
            kind,
            c,
            #[inline(always)]
            move |v| v * c,
        ),
        Scalar::Div => scalar(
            x,
            kind,
            c,
            #[inline(always)]
            move |v| v / c,
        ),
        Scalar::DivInto => scalar(
            x,
            kind,
            c,
            #[inline(always)]
            move |v| c / v,
        ),
        Scalar::Pow => scalar(
            x,
            kind,
            c,
            #[inline(always)]
            move |v| v.powf(c),
        ),
    }
}

/// An op between a tensor and a scalar `c`, `f(x)`, with its rule.
pub(crate) fn scalar<'s, T: Element>(
    src: Arg<'_, 's, T>,
    kind: Scalar,
    c: T,
    f: impl Fn(T) -> T + Sync,
) -> Result<Tensor<'s, T>> {
    let x = (kind.saves_input() && Recorder::of(&[src.tensor()]).is_some())
        .then(|| src.tensor().saved());
    map_recorded(src, f, |_| Rule::Scalar(kind, c, x))
}

fn map<'s, T: Element>(src: Arg<'_, 's, T>, f: impl Fn(T) -> T + Sync) -> Result<Tensor<'s, T>> {
    let shape = ndarray::IxDyn(src.tensor().shape());
    let shape = ndarray::Dimension::slice(&shape);
    match src.into_writable(shape) {
        Ok(mut t) => {
            simd::map_in_place(t.unique_slice_mut(), f);
            Ok(t)
        }
        Err(src) => {
            let src = src.tensor();
            let mut out = Tensor::try_rent_in(&src.rents_in, shape)?;
            simd::map_into(out.unique_slice_mut(), src.as_slice(), f);
            Ok(out)
        }
    }
}

fn map_lanes<'s, T: Element>(
    src: Arg<'_, 's, T>,
    axis: impl Dim,
    kernel: impl FnMut(ArrayViewMut1<'_, T>),
) -> Result<Tensor<'s, T>> {
    let axis = check_axis("map_lanes", src.tensor(), axis)?;
    let mut out = src.into_writable_copy()?;
    if out.is_empty() {
        // No lane has an element: running the kernel on each of the (possibly 2^60) empty lanes
        // would be work without data.
        return Ok(out);
    }
    let lane = out.shape()[axis];
    work::visit(out.len() / lane);
    if axis + 1 == out.ndim() {
        // Lanes along the last axis are contiguous runs of the buffer.
        out.unique_slice_mut()
            .chunks_exact_mut(lane)
            .map(ArrayViewMut1::from)
            .for_each(kernel);
    } else {
        out.unique_view_mut()
            .lanes_mut(Axis(axis))
            .into_iter()
            .for_each(kernel);
    }
    Ok(out)
}

// The trait is sealed: it cannot be named outside the crate, so its crate-private `Arg` never
// reaches a user even though `TensorOps` makes the method formally reachable.
mod sealed {
    use crate::ops::Arg;
    use crate::{Element, Tensor};

    /// How a [`TensorOps`](super::TensorOps) receiver reaches the kernels: owned or borrowed.
    pub trait Sealed<'s, T: Element> {
        #[allow(private_bounds)]
        fn with_arg<R>(self, f: impl FnOnce(Arg<'_, 's, T>) -> R) -> R;
    }

    impl<'s, T: Element> Sealed<'s, T> for Tensor<'s, T> {
        #[allow(private_bounds)]
        fn with_arg<R>(self, f: impl FnOnce(Arg<'_, 's, T>) -> R) -> R {
            f(Arg::Owned(self))
        }
    }

    impl<'s, T: Element> Sealed<'s, T> for &Tensor<'s, T> {
        #[allow(private_bounds)]
        fn with_arg<R>(self, f: impl FnOnce(Arg<'_, 's, T>) -> R) -> R {
            f(Arg::Borrowed(self))
        }
    }
}

impl<'s, T: Element> TensorOps<'s, T> for Tensor<'s, T> {
    fn as_tensor(&self) -> &Tensor<'s, T> {
        self
    }
}

impl<'s, T: Element> TensorOps<'s, T> for &Tensor<'s, T> {
    fn as_tensor(&self) -> &Tensor<'s, T> {
        self
    }
}
