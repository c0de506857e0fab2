//! [`TensorOps`]: the ops that can write their output over their input (elementwise functions and
//! per-lane kernels such as softmax and the norms), for `Tensor` and `&Tensor` alike; and the
//! records of the elementwise functions with a derivative.

use std::ops::Neg;
use std::sync::Arc;

use ndarray::{ArrayViewMut1, Axis};

use crate::dims::Dims;

use super::elementwise::{scalar, ScalarKind};
use super::lanes::{Lane, LaneOp};
use super::pointwise::{map, zip_kernel};
use super::{check_axis, work, Dim};
use crate::autograd::{self, args, Arg, Backward, Forward, Grads, Op, Saved};
use crate::element::Element;
use crate::error::{panicking, Result};
use crate::scope::State;
use crate::tensor::Tensor;

/// What the backward of an elementwise function reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Saves {
    Input,
    Output,
    Nothing,
}

/// The elementwise functions with a derivative as one record, [`Unary`], from a table of one row
/// per function: its variant and name, what its backward reads (the input, the output or nothing),
/// the function of one element and the gradient of one element from the output's gradient `g`
/// and what was saved. The forward runs the function in one vectorised loop (in the input's buffer
/// when it is unique), the backward the gradient in another (in `g`'s).
macro_rules! unary {
    ($(
        $(#[doc = $doc:literal])*
        $kind:ident $name:literal, saves $saves:ident, |$x:ident| $f:expr, |$g:ident $(, $s:ident)?| $df:expr;
    )*) => {
        /// An elementwise function with a derivative: one record for all of them.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum Unary {
            $($(#[doc = $doc])* $kind,)*
        }

        impl Unary {
            fn saves(self) -> Saves {
                match self {
                    $(Unary::$kind => Saves::$saves,)*
                }
            }
        }

        impl<T: Element> Op<T> for Unary {
            /// The input or the output, as the table says; nothing for `Neg`.
            type Saved<'s> = Option<Saved<'s, T>>;

            fn name(&self) -> &'static str {
                match self {
                    $(Unary::$kind => $name,)*
                }
            }

            fn forward<'s>(
                &self,
                cx: &mut Forward<'_, 's, T>,
            ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
                let saves = self.saves();
                // The input is saved before the kernel runs, so it is not written over.
                let input = (cx.saving() && saves == Saves::Input).then(|| cx.save(cx.input(0)));
                let src = cx.take(0);
                // One instantiation of the loop per function, so that it inlines and vectorises
                // (a function pointer would be called once per element). The function is a closure
                // marked to inline: it then compiles inside the vectorised loop of every
                // instruction set `simd` dispatches to, whichever codegen unit the loop lands in.
                let out = match self {
                    $(Unary::$kind => map(src, cx.scope(), #[inline(always)] |$x: T| $f),)*
                }?;
                let saved = cx.saving().then(|| match saves {
                    Saves::Output => Some(cx.save(&out)),
                    Saves::Input | Saves::Nothing => input,
                });
                Ok((out, saved))
            }

            /// `g` times the derivative, in one vectorised loop, written over `g` when it is
            /// unique.
            fn backward<'b>(
                &self,
                saved: Self::Saved<'b>,
                g: Tensor<'b, T>,
                cx: &Backward<'b>,
            ) -> Result<Grads<'b, T>> {
                let saved = saved.map(|s| s.get(cx));
                let shape = Dims::from_slice(g.shape());
                let dx = match self {
                    $(Unary::$kind => unary!(@grad cx, shape, saved, g, |$g $(, $s)?| $df),)*
                }?;
                Ok(Grads::from([Some(dx)]))
            }
        }
    };
    (@grad $cx:ident, $shape:ident, $saved:ident, $grad:ident, |$g:ident, $s:ident| $df:expr) => {
        zip_kernel(
            $cx.at(),
            $shape.slice(),
            Arg::Owned($grad),
            Arg::Borrowed($saved.as_ref().expect("the forward saved what it needs")),
            #[inline(always)]
            |$g: T, $s: T| $df,
        )
    };
    (@grad $cx:ident, $shape:ident, $saved:ident, $grad:ident, |$g:ident| $df:expr) => {
        map(Arg::Owned($grad), $cx.at(), #[inline(always)] |$g: T| $df)
    };
}

// The gradients are written as the layers' hand-written backward passes were, for the same bits.
unary! {
    /// `max(x, 0)`.
    Relu "relu", saves Output, |x| relu(x),
        |g, y| g * if y > T::zero() { T::one() } else { T::zero() };
    /// GELU, tanh approximation.
    Gelu "gelu", saves Input, |x| gelu(x), |g, x| g * gelu_grad(x);
    /// `x sigmoid(x)`.
    Silu "silu", saves Input, |x| silu(x), |g, x| g * silu_grad(x);
    /// `1 / (1 + e^-x)`.
    Sigmoid "sigmoid", saves Output, |x| sigmoid(x), |g, y| g * y * (T::one() - y);
    /// `tanh(x)`.
    Tanh "tanh", saves Output, |x| x.tanh_kernel(), |g, y| g * (T::one() - y * y);
    /// `e^x`.
    Exp "exp", saves Output, |x| x.exp_kernel(), |g, y| g * y;
    /// `-x`.
    Neg "neg", saves Nothing, |x| -x, |g| -g;
    /// `ln(x)`.
    Log "log", saves Input, |x| x.ln_kernel(), |g, x| g / x;
    /// The square root.
    Sqrt "sqrt", saves Output, |x| x.sqrt(), |g, y| g / (y + y);
    /// `|x|`; its gradient is the sign, 0 at 0, as PyTorch's.
    Abs "abs", saves Input, |x| x.abs(),
        |g, x| if x > T::zero() { g } else if x < T::zero() { -g } else { x * g };
    /// GELU, exact.
    GeluErf "gelu_erf", saves Input, |x| gelu_erf(x), |g, x| g * gelu_erf_grad(x);
    /// The error function; its derivative is `2 / sqrt(pi) e^{-x^2}`.
    Erf "erf", saves Input, |x| x.erf_kernel(),
        |g, x| g * (T::from_f64(std::f64::consts::FRAC_2_SQRT_PI) * (-x * x).exp_kernel());
    /// `sin(x)`.
    Sin "sin", saves Input, |x| x.sin(), |g, x| g * x.cos();
    /// `cos(x)`.
    Cos "cos", saves Input, |x| x.cos(), |g, x| -g * x.sin();
}

impl Unary {
    /// The function of every element of `x`, recorded (the `nn` activations).
    pub(crate) fn apply<'s, T: Element>(self, x: &Tensor<'s, T>) -> Result<Tensor<'s, T>> {
        autograd::run(self, &mut args([Arg::Borrowed(x)]))
    }
}

/// A user's elementwise function or its derivative ([`TensorOps::map_with_derivative`]); `Sync`,
/// since an elementwise loop may run on several threads.
type Function<T> = Arc<dyn Fn(T) -> T + Send + Sync>;

/// `map_with_derivative`: a user's function and its derivative.
#[derive(Clone)]
struct Map<T> {
    f: Function<T>,
    df: Function<T>,
}

impl<T: Element> Op<T> for Map<T> {
    /// The input.
    type Saved<'s> = Saved<'s, T>;

    fn name(&self) -> &'static str {
        "map_with_derivative"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let saved = cx.saving().then(|| cx.save(cx.input(0)));
        let (scope, f) = (cx.scope().clone(), &self.f);
        let out = map(
            cx.take(0),
            &scope,
            #[inline(always)]
            |x| f(x),
        )?;
        Ok((out, saved))
    }

    fn backward<'b>(
        &self,
        x: Self::Saved<'b>,
        g: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
        let (x, df) = (x.get(cx), &self.df);
        let shape = Dims::from_slice(g.shape());
        let dx = zip_kernel(
            cx.at(),
            shape.slice(),
            Arg::Owned(g),
            Arg::Borrowed(&x),
            #[inline(always)]
            |g, x| g * df(x),
        )?;
        Ok(Grads::from([Some(dx)]))
    }
}

/// `clamp(min, max)`.
#[derive(Clone, Copy)]
struct Clamp<T> {
    min: T,
    max: T,
}

impl<T: Element> Op<T> for Clamp<T> {
    /// The input.
    type Saved<'s> = Saved<'s, T>;

    fn name(&self) -> &'static str {
        "clamp"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let saved = cx.saving().then(|| cx.save(cx.input(0)));
        let x = cx.take(0);
        let (scope, Clamp { min, max }) = (cx.scope(), *self);
        let out = map(
            x,
            scope,
            #[inline(always)]
            move |x: T| clamp(x, min, max),
        )?;
        Ok((out, saved))
    }

    /// `g` where `min <= x <= max`, else 0.
    fn backward<'b>(
        &self,
        x: Self::Saved<'b>,
        g: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
        let (x, Clamp { min, max }) = (x.get(cx), *self);
        let shape = Dims::from_slice(g.shape());
        let dx = zip_kernel(
            cx.at(),
            shape.slice(),
            Arg::Owned(g),
            Arg::Borrowed(&x),
            #[inline(always)]
            |g: T, x: T| if x >= min && x <= max { g } else { T::zero() },
        )?;
        Ok(Grads::from([Some(dx)]))
    }
}

/// An elementwise function with its record, as a `try_` method and a panicking one.
macro_rules! elementwise {
    ($(#[doc = $doc:literal])* $name:ident $try_name:ident $kind:ident; $($rest:tt)*) => {
        $(#[doc = $doc])*
        /// Fails only if an output cannot be rented.
        fn $try_name(self) -> Result<Tensor<'s, T>> {
            self.with_arg(|a| autograd::run(Unary::$kind, &mut args([a])))
        }

        panicking! {
            $(#[doc = $doc])*
            fn $name(self) -> Tensor<'s, T> = $try_name;
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
/// use tensorscope::{Pool, TensorOps};
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
        self.with_arg(|a| {
            autograd::run_opaque("map", &mut args([a]), |cx| {
                let x = cx.take(0);
                map(x, cx.scope(), f)
            })
        })
    }

    /// Applies `f` to every element, differentiable with `df`, the derivative of `f`: a backward
    /// through the result multiplies the gradient by `df(x)`, and a `#[checkpoint]` replays `f`.
    /// Fails only if an output cannot be rented.
    fn try_map_with_derivative(
        self,
        f: impl Fn(T) -> T + Send + Sync + 'static,
        df: impl Fn(T) -> T + Send + Sync + 'static,
    ) -> Result<Tensor<'s, T>> {
        let op = Map {
            f: Arc::new(f),
            df: Arc::new(df),
        };
        self.with_arg(|a| autograd::run(op, &mut args([a])))
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
        let axis = check_axis("map_lanes", self.as_tensor(), axis)?;
        self.with_arg(|a| {
            autograd::run_opaque("map_lanes", &mut args([a]), |cx| {
                let x = cx.take(0);
                map_lanes(x, cx.scope(), axis, kernel)
            })
        })
    }

    panicking! {
        /// Applies `f` to every element.
        fn map(self, f: impl Fn(T) -> T + Sync) -> Tensor<'s, T> = try_map;
        /// Applies `f` to every element, differentiable with `df`.
        fn map_with_derivative(
            self,
            f: impl Fn(T) -> T + Send + Sync + 'static,
            df: impl Fn(T) -> T + Send + Sync + 'static,
        ) -> Tensor<'s, T> = try_map_with_derivative;
        /// Applies `kernel` to every 1-D lane along `axis`.
        fn map_lanes(self, axis: impl Dim, kernel: impl FnMut(ArrayViewMut1<'_, T>)) -> Tensor<'s, T> = try_map_lanes;
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
        /// The sine (of radians).
        sin try_sin Sin;
        /// The cosine (of radians).
        cos try_cos Cos;
    }

    /// Every element to the power `p` (`powf`; a negative base with a fractional power is NaN).
    /// Fails only if an output cannot be rented.
    fn try_pow(self, p: T) -> Result<Tensor<'s, T>> {
        self.with_arg(|a| scalar(a, ScalarKind::Pow, p))
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
        self.with_arg(|a| autograd::run(Clamp { min, max }, &mut args([a])))
    }

    /// RMS normalization over the last axis, without a scale: `x / sqrt(mean(x^2) + eps)`
    /// (PyTorch's `F.rms_norm` without a weight; scale by broadcasting, `&y * &gamma`). Fails with
    /// [`Error::InvalidShape`](crate::Error::InvalidShape) for a rank-0 tensor, or a budget error.
    fn try_rms_norm(self, eps: T) -> Result<Tensor<'s, T>> {
        let axis = last_axis("rms_norm", self.as_tensor())?;
        self.with_arg(|a| LaneOp::along(Lane::RmsNorm(eps), axis).run(a))
    }

    /// Softmax along `axis` (max-subtracted, so large inputs do not overflow). Fails with
    /// [`Error::AxisOutOfRange`](crate::Error::AxisOutOfRange) for a bad axis.
    fn try_softmax(self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        let axis = check_axis("softmax", self.as_tensor(), axis)?;
        self.with_arg(|a| LaneOp::along(Lane::Softmax, axis).run(a))
    }

    /// Log-softmax along `axis`, computed as `x - max - ln(sum(exp(x - max)))`. Fails with
    /// [`Error::AxisOutOfRange`](crate::Error::AxisOutOfRange) for a bad axis.
    fn try_log_softmax(self, axis: impl Dim) -> Result<Tensor<'s, T>> {
        let axis = check_axis("log_softmax", self.as_tensor(), axis)?;
        self.with_arg(|a| LaneOp::along(Lane::LogSoftmax, axis).run(a))
    }

    /// Layer normalization over the last axis, without affine parameters:
    /// `(x - mean) / sqrt(var + eps)` with the biased variance. Scale and shift by broadcasting
    /// (`&y * &gamma + &beta`). Fails with
    /// [`Error::InvalidShape`](crate::Error::InvalidShape) for a rank-0 tensor.
    fn try_layer_norm(self, eps: T) -> Result<Tensor<'s, T>> {
        let axis = last_axis("layer_norm", self.as_tensor())?;
        self.with_arg(|a| LaneOp::along(Lane::LayerNorm(eps), axis).run(a))
    }

    panicking! {
        /// Every element to the power `p`.
        fn pow(self, p: T) -> Tensor<'s, T> = try_pow;
        /// Every element limited to `[min, max]`.
        fn clamp(self, min: T, max: T) -> Tensor<'s, T> = try_clamp;
        /// RMS normalization over the last axis.
        fn rms_norm(self, eps: T) -> Tensor<'s, T> = try_rms_norm;
        /// Softmax along `axis`.
        fn softmax(self, axis: impl Dim) -> Tensor<'s, T> = try_softmax;
        /// Log-softmax along `axis`.
        fn log_softmax(self, axis: impl Dim) -> Tensor<'s, T> = try_log_softmax;
        /// Layer normalization over the last axis.
        fn layer_norm(self, eps: T) -> Tensor<'s, T> = try_layer_norm;
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

fn map_lanes<'s, T: Element>(
    src: Arg<'_, 's, T>,
    scope: &State,
    axis: usize,
    kernel: impl FnMut(ArrayViewMut1<'_, T>),
) -> Result<Tensor<'s, T>> {
    let mut out = src.into_writable_copy(scope)?;
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
    use crate::autograd::Arg;
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

impl<'s, T: Element> Neg for Tensor<'s, T> {
    type Output = Tensor<'s, T>;
    #[track_caller]
    fn neg(self) -> Tensor<'s, T> {
        crate::error::or_panic(autograd::run(Unary::Neg, &mut args([Arg::Owned(self)])))
    }
}

impl<'s, T: Element> Neg for &Tensor<'s, T> {
    type Output = Tensor<'s, T>;
    #[track_caller]
    fn neg(self) -> Tensor<'s, T> {
        crate::error::or_panic(autograd::run(Unary::Neg, &mut args([Arg::Borrowed(self)])))
    }
}
