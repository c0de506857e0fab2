//! Every tensor op, one module per op family as in `runtime/src/ops/`: values, in-place buffer
//! reuse, and each op's errors (and the panics of its panicking form) beside its values.
//!
//! Expected values are computed here, from the tensors' actual inputs, with ndarray (`&a + &b`,
//! `dot`, `sum_axis`), plain `f64` loops (softmax and the norms lane by lane, convolution) or by
//! hand, never taken from the code under test. The tests run on a poisoned pool
//! ([`crate::common::test_pool`]) in debug builds, so an output left partly unwritten shows the
//! sentinel. Gradients are checked in `autograd`.

mod arithmetic;
mod attention;
mod autocast;
mod checks;
mod conv;
mod dropout;
mod dtypes;
mod elementwise;
mod images;
mod in_place;
mod index;
mod kernels;
mod lanes;
mod linalg;
mod mask;
mod model_ops;
mod reduce;
mod sample;
mod scatter;
mod shape;
mod sizes;
mod sort;
mod views;

use ndarray::{stack, Array, Array2, ArrayD, Axis, Dimension, Ix2, Ix3};
use tensorscope::prelude::*;
use tensorscope::{DType, Element, Error, Shape};

use crate::common::{close, panic_message};

/// Tolerances for `f32` results: a few ulps relative, plus an absolute floor for values near zero.
const F32_RTOL: f64 = 1e-5;
const F32_ATOL: f64 = 1e-6;

/// `x` as `f64`, through [`DType`] (`num_traits::ToPrimitive` has a method of the same name).
fn f64_of<T: Element>(x: T) -> f64 {
    <T as DType>::to_f64(x)
}

/// A tensor's values as an `f64` ndarray array.
fn to_f64<T: Element>(t: &Tensor<'_, T>) -> ArrayD<f64> {
    t.to_array().mapv(f64_of)
}

/// Asserts `got` has `want`'s shape and every element [`close`] to `want`'s: within
/// `atol + rtol * |want|`, NaN where it is NaN, the same infinity where it is infinite.
fn assert_close_tol<T: Element, U: Element, D: Dimension>(
    what: &str,
    got: &Tensor<'_, T>,
    want: &Array<U, D>,
    rtol: f64,
    atol: f64,
) {
    assert_eq!(got.shape(), want.shape(), "{what}: shape");
    let got = to_f64(got);
    for ((idx, &g), &w) in got.indexed_iter().zip(want.iter()) {
        let w = f64_of(w);
        assert!(
            close(g, w, rtol, atol),
            "{what}: at {idx:?} got {g}, expected {w}"
        );
    }
}

/// [`assert_close_tol`] with the `f32` tolerances.
fn assert_close<T: Element, U: Element, D: Dimension>(
    what: &str,
    got: &Tensor<'_, T>,
    want: &Array<U, D>,
) {
    assert_close_tol(what, got, want, F32_RTOL, F32_ATOL);
}

/// Asserts that `f` panics with exactly `err`'s message.
fn assert_panics_with(err: &Error, f: impl FnOnce()) {
    assert_eq!(panic_message(f), err.to_string());
}

/// The [`Error::ShapeMismatch`] that `op` reports for operands of shapes `lhs` and `rhs`.
fn shape_mismatch(op: &'static str, lhs: &[usize], rhs: &[usize], reason: &str) -> Error {
    Error::ShapeMismatch {
        op,
        lhs: Shape(lhs.to_vec()),
        rhs: Shape(rhs.to_vec()),
        reason: reason.to_string(),
    }
}

/// The [`Error::AxisOutOfRange`] that `op` reports for `axis` (as given) of a tensor of rank `ndim`.
fn axis_out_of_range(op: &'static str, axis: isize, ndim: usize) -> Error {
    Error::AxisOutOfRange { op, axis, ndim }
}

/// `0, 1, 2, ...` as f32 in `shape`.
fn iota<'s>(s: &Scope<'s, '_>, shape: &[usize]) -> Tensor<'s, f32> {
    let n: usize = shape.iter().product();
    s.arange(0.0f32, n as f32, 1.0).reshape(shape)
}

// Reference implementations used by several families (f64, on ndarray); one family's own live
// in its module.

/// `a @ b` for `[m, k] x [k, n]`, `[b, m, k] x [k, n]` and `[b, m, k] x [b, k, n]`, one `dot` per
/// batch entry.
fn matmul_ref<A: ndarray::LinalgScalar>(a: &ArrayD<A>, b: &ArrayD<A>) -> ArrayD<A> {
    if a.ndim() == 2 {
        let a = a.view().into_dimensionality::<Ix2>().unwrap();
        let b = b.view().into_dimensionality::<Ix2>().unwrap();
        return a.dot(&b).into_dyn();
    }
    let a = a.view().into_dimensionality::<Ix3>().unwrap();
    let products: Vec<Array2<A>> = (0..a.len_of(Axis(0)))
        .map(|i| {
            let bi = if b.ndim() == 3 {
                b.index_axis(Axis(0), i)
            } else {
                b.view()
            };
            a.index_axis(Axis(0), i)
                .dot(&bi.into_dimensionality::<Ix2>().unwrap())
        })
        .collect();
    let views: Vec<_> = products.iter().map(|p| p.view()).collect();
    stack(Axis(0), &views).unwrap().into_dyn()
}

/// Softmax (or log-softmax) along `axis`, lane by lane.
fn softmax_ref(x: &ArrayD<f64>, axis: usize, log: bool) -> ArrayD<f64> {
    let mut out = x.clone();
    for mut lane in out.lanes_mut(Axis(axis)) {
        let max = lane.fold(f64::NEG_INFINITY, |m, &v| m.max(v));
        let sum: f64 = lane.iter().map(|&v| (v - max).exp()).sum();
        lane.mapv_inplace(|v| {
            if log {
                v - max - sum.ln()
            } else {
                (v - max).exp() / sum
            }
        });
    }
    out
}

/// `(x - mean) / sqrt(var + eps)` over the last axis, biased variance.
fn layer_norm_ref(x: &ArrayD<f64>, eps: f64) -> ArrayD<f64> {
    let mut out = x.clone();
    let last = Axis(x.ndim() - 1);
    for mut lane in out.lanes_mut(last) {
        let n = lane.len() as f64;
        let mean = lane.sum() / n;
        let var = lane.iter().map(|&v| (v - mean).powi(2)).sum::<f64>() / n;
        lane.mapv_inplace(|v| (v - mean) / (var + eps).sqrt());
    }
    out
}

/// GELU in its tanh form, as `gelu` computes it.
fn gelu_ref(x: f64) -> f64 {
    // `0.5 x (1 + tanh(u))` as `x sigmoid(2u)`, the same function: in `f64` too, `1 + tanh(u)`
    // cancels where `u` is very negative (at x = -7.2 it kept 1 significant bit).
    let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044_715 * x.powi(3));
    x / (1.0 + (-2.0 * u).exp())
}

/// The logistic function `1 / (1 + e^-x)`.
fn sigmoid_ref(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}
