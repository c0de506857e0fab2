//! Ops that can write their output over their input: elementwise maps and per-lane kernels.

use ndarray::{ArrayViewMut1, Axis};

use super::{check_axis, work, Arg};
use crate::element::Element;
use crate::error::{or_panic, Result};
use crate::tensor::Tensor;

/// Ops that write in place when they can, implemented for both `Tensor` and `&Tensor`.
///
/// On an owned `Tensor` that is the only handle on its buffer, the result overwrites the input and
/// nothing is rented; on a `&Tensor` (or a shared one) a new tensor is rented in its scope. The values
/// are the same either way.
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
///     assert_eq!(z.to_vec(), vec![1.0, 1.0, 2f32.exp()]);
///     assert_eq!(x.to_vec(), vec![-1.0, 0.0, 2.0]);
/// });
/// ```
pub trait TensorOps<'s, T: Element>: Sized + sealed::Sealed {
    /// The tensor the op reads.
    fn as_tensor(&self) -> &Tensor<'s, T>;

    /// Applies `f` to every element. Fails only if an output cannot be rented.
    fn try_map(self, f: impl Fn(T) -> T) -> Result<Tensor<'s, T>>;

    /// Applies `kernel` to every 1-D lane along `axis` of a copy of the tensor (or of the tensor itself
    /// when it can be written in place): the escape hatch for row-wise kernels. Fails with
    /// [`Error::AxisOutOfRange`](crate::Error::AxisOutOfRange) or if an output cannot be rented.
    fn try_map_lanes(
        self,
        axis: usize,
        kernel: impl FnMut(ArrayViewMut1<'_, T>),
    ) -> Result<Tensor<'s, T>>;

    /// Applies `kernel` to every 1-D lane along `axis`; see [`TensorOps::try_map_lanes`].
    ///
    /// # Panics
    /// For a bad axis or an exhausted budget, with the error's message.
    #[track_caller]
    fn map_lanes(self, axis: usize, kernel: impl FnMut(ArrayViewMut1<'_, T>)) -> Tensor<'s, T> {
        or_panic(self.try_map_lanes(axis, kernel))
    }

    /// Applies `f` to every element.
    ///
    /// # Panics
    /// If an output cannot be rented (pool budget exhausted), with the error's message.
    #[track_caller]
    fn map(self, f: impl Fn(T) -> T) -> Tensor<'s, T> {
        or_panic(self.try_map(f))
    }

    /// `max(x, 0)`, with NaN passed through (as in PyTorch). Panics only as [`TensorOps::map`] does.
    #[track_caller]
    fn relu(self) -> Tensor<'s, T> {
        self.map(relu)
    }

    /// GELU, tanh approximation: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))` (PyTorch's
    /// `approximate="tanh"`). Panics only as [`TensorOps::map`] does.
    #[track_caller]
    fn gelu(self) -> Tensor<'s, T> {
        self.map(gelu)
    }

    /// SiLU (swish), `x * sigmoid(x)`. Panics only as [`TensorOps::map`] does.
    #[track_caller]
    fn silu(self) -> Tensor<'s, T> {
        self.map(|x| x / (T::one() + (-x).exp()))
    }

    /// The logistic sigmoid `1 / (1 + exp(-x))`. Panics only as [`TensorOps::map`] does.
    #[track_caller]
    fn sigmoid(self) -> Tensor<'s, T> {
        self.map(|x| T::one() / (T::one() + (-x).exp()))
    }

    /// Hyperbolic tangent. Panics only as [`TensorOps::map`] does.
    #[track_caller]
    fn tanh(self) -> Tensor<'s, T> {
        self.map(T::tanh)
    }

    /// `e^x`. Panics only as [`TensorOps::map`] does.
    #[track_caller]
    fn exp(self) -> Tensor<'s, T> {
        self.map(T::exp)
    }

    /// Softmax along `axis` (max-subtracted, so large inputs do not overflow). Fails with
    /// [`Error::AxisOutOfRange`](crate::Error::AxisOutOfRange) for a bad axis.
    fn try_softmax(self, axis: usize) -> Result<Tensor<'s, T>> {
        check_axis("softmax", self.as_tensor(), axis)?;
        self.try_map_lanes(axis, |lane| softmax_lane(lane, false))
    }

    /// Softmax along `axis`; see [`TensorOps::try_softmax`].
    ///
    /// # Panics
    /// For a bad axis or an exhausted budget, with the error's message.
    #[track_caller]
    fn softmax(self, axis: usize) -> Tensor<'s, T> {
        or_panic(self.try_softmax(axis))
    }

    /// Log-softmax along `axis`, computed as `x - max - ln(sum(exp(x - max)))`. Fails with
    /// [`Error::AxisOutOfRange`](crate::Error::AxisOutOfRange) for a bad axis.
    fn try_log_softmax(self, axis: usize) -> Result<Tensor<'s, T>> {
        check_axis("log_softmax", self.as_tensor(), axis)?;
        self.try_map_lanes(axis, |lane| softmax_lane(lane, true))
    }

    /// Log-softmax along `axis`; see [`TensorOps::try_log_softmax`].
    ///
    /// # Panics
    /// For a bad axis or an exhausted budget, with the error's message.
    #[track_caller]
    fn log_softmax(self, axis: usize) -> Tensor<'s, T> {
        or_panic(self.try_log_softmax(axis))
    }

    /// Layer normalization over the last axis, without affine parameters:
    /// `(x - mean) / sqrt(var + eps)` with the biased variance. Scale and shift by broadcasting
    /// (`&y * &gamma + &beta`). Fails with
    /// [`Error::InvalidShape`](crate::Error::InvalidShape) for a rank-0 tensor.
    fn try_layer_norm(self, eps: T) -> Result<Tensor<'s, T>> {
        let t = self.as_tensor();
        if t.ndim() == 0 {
            return Err(crate::Error::InvalidShape {
                op: "layer_norm",
                shape: t.shape().into(),
                reason: "needs at least one axis to normalize over".into(),
            });
        }
        let axis = t.ndim() - 1;
        self.try_map_lanes(axis, |lane| layer_norm_lane(lane, eps))
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
pub(crate) fn relu<T: Element>(x: T) -> T {
    if x <= T::zero() {
        T::zero()
    } else {
        x
    }
}

/// GELU of one value, tanh approximation: `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub(crate) fn gelu<T: Element>(x: T) -> T {
    let c = T::from_f64((2.0 / std::f64::consts::PI).sqrt());
    let k = T::from_f64(0.044_715);
    T::from_f64(0.5) * x * (T::one() + (c * (x + k * x * x * x)).tanh())
}

fn softmax_lane<T: Element>(mut lane: ArrayViewMut1<'_, T>, log: bool) {
    let max = lane.fold(T::neg_infinity(), |m, &x| m.max(x));
    // A lane of all -inf has no finite max; shifting by 0 keeps the result NaN-free where possible.
    let shift = if max.is_finite() { max } else { T::zero() };
    if log {
        let log_sum = lane.iter().map(|&x| (x - shift).exp()).sum::<T>().ln();
        lane.mapv_inplace(|x| x - shift - log_sum);
    } else {
        // One `exp` per element: write it, then scale by the reciprocal of the sum.
        lane.mapv_inplace(|x| (x - shift).exp());
        let inv = lane.sum().recip();
        lane.mapv_inplace(|x| x * inv);
    }
}

fn layer_norm_lane<T: Element>(mut lane: ArrayViewMut1<'_, T>, eps: T) {
    let n = T::from_f64(lane.len() as f64);
    let mean = lane.sum() / n;
    let var = lane.fold(T::zero(), |acc, &x| acc + (x - mean) * (x - mean)) / n;
    let inv = (var + eps).sqrt().recip();
    lane.mapv_inplace(|x| (x - mean) * inv);
}

fn try_map<'s, T: Element>(src: Arg<'_, 's, T>, f: impl Fn(T) -> T) -> Result<Tensor<'s, T>> {
    let shape = src.tensor().shape().to_vec();
    match src.into_writable(&shape) {
        Ok(mut t) => {
            t.unique_slice_mut().iter_mut().for_each(|x| *x = f(*x));
            Ok(t)
        }
        Err(src) => {
            let src = src.tensor();
            let mut out = Tensor::try_rent_in(&src.scope, &shape)?;
            out.unique_slice_mut()
                .iter_mut()
                .zip(src.as_slice())
                .for_each(|(o, &x)| *o = f(x));
            Ok(out)
        }
    }
}

fn try_map_lanes<'s, T: Element>(
    src: Arg<'_, 's, T>,
    axis: usize,
    kernel: impl FnMut(ArrayViewMut1<'_, T>),
) -> Result<Tensor<'s, T>> {
    check_axis("map_lanes", src.tensor(), axis)?;
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

mod sealed {
    pub trait Sealed {}
    impl<T: crate::Element> Sealed for crate::Tensor<'_, T> {}
    impl<T: crate::Element> Sealed for &crate::Tensor<'_, T> {}
}

impl<'s, T: Element> TensorOps<'s, T> for Tensor<'s, T> {
    fn as_tensor(&self) -> &Tensor<'s, T> {
        self
    }
    fn try_map(self, f: impl Fn(T) -> T) -> Result<Tensor<'s, T>> {
        try_map(Arg::Owned(self), f)
    }
    fn try_map_lanes(
        self,
        axis: usize,
        kernel: impl FnMut(ArrayViewMut1<'_, T>),
    ) -> Result<Tensor<'s, T>> {
        try_map_lanes(Arg::Owned(self), axis, kernel)
    }
}

impl<'s, T: Element> TensorOps<'s, T> for &Tensor<'s, T> {
    fn as_tensor(&self) -> &Tensor<'s, T> {
        self
    }
    fn try_map(self, f: impl Fn(T) -> T) -> Result<Tensor<'s, T>> {
        try_map(Arg::Borrowed(self), f)
    }
    fn try_map_lanes(
        self,
        axis: usize,
        kernel: impl FnMut(ArrayViewMut1<'_, T>),
    ) -> Result<Tensor<'s, T>> {
        try_map_lanes(Arg::Borrowed(self), axis, kernel)
    }
}
