//! Values of every tensor op against a plain ndarray computation, in-place buffer reuse, and the
//! errors (and panics) of bad inputs.
//!
//! Expected values are always computed here with ndarray (`&a + &b`, `dot`, `sum_axis`, loops over
//! lanes for softmax and layer norm, ...) from the tensors' inputs, never taken from the code under
//! test.

mod images;
mod kernels;
mod model_ops;

use half::{bf16, f16};
use ndarray::{concatenate, stack, Array, Array2, ArrayD, Axis, Dimension, Ix2, Ix3, IxDyn, Zip};
use tensorscope::{DType, Element, Error, Shape, Tensor, TensorOps};

use crate::common::{assert_fully_written, panic_message, test_pool};

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

/// Asserts `got` has `want`'s shape and every element within `atol + rtol * |want|`.
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
        let ok = g == w || (g - w).abs() <= atol + rtol * w.abs() || (g.is_nan() && w.is_nan());
        assert!(ok, "{what}: at {idx:?} got {g}, expected {w}");
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

fn shape_mismatch(op: &'static str, lhs: &[usize], rhs: &[usize], reason: &str) -> Error {
    Error::ShapeMismatch {
        op,
        lhs: Shape(lhs.to_vec()),
        rhs: Shape(rhs.to_vec()),
        reason: reason.to_string(),
    }
}

// ---------------------------------------------------------------------------------------------
// Reference implementations (f64, on ndarray)
// ---------------------------------------------------------------------------------------------

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

fn gelu_ref(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044_715 * x.powi(3))).tanh())
}

fn sigmoid_ref(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

// ---------------------------------------------------------------------------------------------
// Binary arithmetic
// ---------------------------------------------------------------------------------------------

/// Checks `a $op b` for every mix of owned (unique and shared) and borrowed operands, and the
/// `try_` method, against ndarray's own broadcasting operator on the same inputs.
macro_rules! check_operator_mixes {
    ($s:expr, $op:tt, $try_method:ident, $a_shape:expr, $b_shape:expr) => {{
        let s = $s;
        let a_shape: &[usize] = &$a_shape;
        let b_shape: &[usize] = &$b_shape;
        // `b` stays away from zero so division is well conditioned.
        let fresh = || {
            (
                s.randn::<f32>(a_shape, 11),
                s.uniform::<f32>(b_shape, 0.5, 2.0, 12),
            )
        };
        let what = format!("{:?} {} {:?}", a_shape, stringify!($op), b_shape);
        let (a, b) = fresh();
        let want = &a.to_array() $op &b.to_array();

        assert_close(&format!("&a {what} &b"), &(&a $op &b), &want);
        let try_what = format!("a.{}(&b) {what}", stringify!($try_method));
        assert_close(&try_what, &a.$try_method(&b).unwrap(), &want);
        // Owned but shared: the op must not write over the other handle.
        assert_close(&format!("shared a {what} shared b"), &(a.clone() $op b.clone()), &want);
        assert_close(&format!("shared a {what} &b"), &(a.clone() $op &b), &want);
        assert_close(&format!("&a {what} shared b"), &(&a $op b.clone()), &want);
        // Owned and unique: may be written in place.
        let (a2, b2) = fresh();
        assert_close(&format!("a {what} b"), &(a2 $op b2), &want);
        let (a2, b2) = fresh();
        assert_close(&format!("a {what} &b"), &(a2 $op &b2), &want);
        let (a2, b2) = fresh();
        assert_close(&format!("&a {what} b"), &(&a2 $op b2), &want);
        // The inputs the shared forms used are intact.
        assert_eq!(a.to_array(), fresh().0.to_array(), "{what}: lhs changed");
        assert_eq!(b.to_array(), fresh().1.to_array(), "{what}: rhs changed");
    }};
}

macro_rules! check_all_operators {
    ($s:expr, $a_shape:expr, $b_shape:expr) => {{
        check_operator_mixes!($s, +, try_add, $a_shape, $b_shape);
        check_operator_mixes!($s, -, try_sub, $a_shape, $b_shape);
        check_operator_mixes!($s, *, try_mul, $a_shape, $b_shape);
        check_operator_mixes!($s, /, try_div, $a_shape, $b_shape);
    }};
}

#[test]
fn arithmetic_same_shape_matches_ndarray_for_every_operand_mix() {
    let pool = test_pool(16);
    pool.scope(|s| check_all_operators!(s, [2, 3], [2, 3]));
}

#[test]
fn arithmetic_broadcasts_a_row_vector_over_a_matrix_either_side() {
    let pool = test_pool(16);
    pool.scope(|s| {
        check_all_operators!(s, [2, 3], [3]);
        check_all_operators!(s, [3], [2, 3]);
    });
}

#[test]
fn arithmetic_broadcasts_both_operands_4x1x3_with_5x1() {
    let pool = test_pool(16);
    pool.scope(|s| {
        check_all_operators!(s, [4, 1, 3], [5, 1]);
        check_all_operators!(s, [5, 1], [4, 1, 3]);
    });
}

#[test]
fn arithmetic_broadcasts_a_one_element_tensor_like_a_scalar() {
    let pool = test_pool(16);
    pool.scope(|s| {
        check_all_operators!(s, [2, 3], [1]);
        check_all_operators!(s, [1], [2, 3]);
        check_all_operators!(s, [1], [1]);
    });
}

#[test]
fn scalar_on_the_right_matches_ndarray() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.randn::<f32>(&[2, 3], 3);
        let xa = x.to_array();
        assert_close("&x * 2", &(&x * 2.0), &(&xa * 2.0));
        assert_close("&x + 1", &(&x + 1.0), &(&xa + 1.0));
        assert_close("&x - 0.5", &(&x - 0.5), &(&xa - 0.5));
        assert_close("&x / 4", &(&x / 4.0), &(&xa / 4.0));
        assert_close("x + 1", &(x.clone() + 1.0), &(&xa + 1.0));
        assert_close("x - 3", &(x.clone() - 3.0), &(&xa - 3.0));
        assert_close("x * -1.5", &(x.clone() * -1.5), &(&xa * -1.5));
        assert_close("x / 0.25", &(x.clone() / 0.25), &(&xa / 0.25));
        assert_eq!(
            x.to_array(),
            xa,
            "the borrowed and shared forms leave x as it was"
        );
        let y = s.randn::<f32>(&[2, 3], 3);
        assert_close("unique y + 1", &(y + 1.0), &(&xa + 1.0));
    });
}

#[test]
fn f32_and_f64_scalars_on_the_left_match_ndarray() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.uniform::<f32>(&[2, 3], 0.5, 2.0, 4);
        let xa = x.to_array();
        assert_close("2 * &x", &(2.0f32 * &x), &xa.mapv(|v| 2.0 * v));
        assert_close("2 + &x", &(2.0f32 + &x), &xa.mapv(|v| 2.0 + v));
        assert_close("2 - &x", &(2.0f32 - &x), &xa.mapv(|v| 2.0 - v));
        assert_close("2 / &x", &(2.0f32 / &x), &xa.mapv(|v| 2.0 / v));
        assert_close("1 - x", &(1.0f32 - x.clone()), &xa.mapv(|v| 1.0 - v));
        assert_close("1 / x", &(1.0f32 / x.clone()), &xa.mapv(|v| 1.0 / v));
        assert_eq!(x.to_array(), xa);

        let y = s.uniform::<f64>(&[3, 2], 0.5, 2.0, 5);
        let ya = y.to_array();
        let tight = |what: &str, got: &Tensor<'_, f64>, want: &ArrayD<f64>| {
            assert_close_tol(what, got, want, 1e-14, 0.0)
        };
        tight("3 * &y (f64)", &(3.0f64 * &y), &ya.mapv(|v| 3.0 * v));
        tight("3 - &y (f64)", &(3.0f64 - &y), &ya.mapv(|v| 3.0 - v));
        tight("3 / &y (f64)", &(3.0f64 / &y), &ya.mapv(|v| 3.0 / v));
        tight("3 + y (f64)", &(3.0f64 + y.clone()), &ya.mapv(|v| 3.0 + v));
        tight("1 - y (f64)", &(1.0f64 - y), &ya.mapv(|v| 1.0 - v));
    });
}

#[test]
fn negation_by_value_and_by_reference_matches_ndarray() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.randn::<f32>(&[3, 4], 6);
        let xa = x.to_array();
        assert_close("-&x", &(-&x), &xa.mapv(|v| -v));
        assert_close("-x (shared)", &(-x.clone()), &xa.mapv(|v| -v));
        assert_close("-x (unique)", &(-x), &xa.mapv(|v| -v));
    });
}

// ---------------------------------------------------------------------------------------------
// Linear algebra
// ---------------------------------------------------------------------------------------------

#[test]
fn matmul_2d_matches_ndarray_dot() {
    let pool = test_pool(16);
    pool.scope(|s| {
        for (m, k, n) in [(3, 4, 5), (1, 1, 1), (17, 33, 9)] {
            let a = s.randn::<f32>(&[m, k], 20);
            let b = s.randn::<f32>(&[k, n], 21);
            let want = matmul_ref(&a.to_array(), &b.to_array());
            let what = format!("[{m}, {k}] x [{k}, {n}]");
            assert_close_tol(&what, &a.matmul(&b), &want, 1e-5, 1e-5);
            assert_close_tol(&what, &a.try_matmul(&b).unwrap(), &want, 1e-5, 1e-5);
        }
    });
}

#[test]
fn matmul_3d_by_2d_applies_the_matrix_to_every_batch_entry() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let a = s.randn::<f32>(&[2, 3, 4], 22);
        let b = s.randn::<f32>(&[4, 5], 23);
        let want = matmul_ref(&a.to_array(), &b.to_array());
        assert_eq!(want.shape(), &[2, 3, 5]);
        assert_close_tol("[2,3,4] x [4,5]", &a.matmul(&b), &want, 1e-5, 1e-5);
    });
}

#[test]
fn matmul_3d_by_3d_multiplies_batch_by_batch() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let a = s.randn::<f32>(&[3, 2, 4], 24);
        let b = s.randn::<f32>(&[3, 4, 5], 25);
        let want = matmul_ref(&a.to_array(), &b.to_array());
        assert_eq!(want.shape(), &[3, 2, 5]);
        assert_close_tol("[3,2,4] x [3,4,5]", &a.matmul(&b), &want, 1e-5, 1e-5);
    });
}

#[test]
fn matmul_of_many_batch_entries_split_over_threads_matches_each_product() {
    // 64 products of 60,000 multiply-adds: runs of whole matrices go to different threads.
    let pool = test_pool(64);
    pool.scope(|s| {
        let a = s.randn::<f32>(&[64, 40, 30], 26);
        let b = s.randn::<f32>(&[64, 30, 50], 27);
        let want = matmul_ref(&a.to_array(), &b.to_array());
        let got = a.matmul(&b);
        assert_fully_written("[64,40,30] x [64,30,50]", &got);
        assert_close_tol("[64,40,30] x [64,30,50]", &got, &want, 1e-4, 1e-4);
    });
}

#[test]
fn matmul_overwrites_stale_pool_contents_even_with_an_empty_inner_dimension() {
    let pool = test_pool(16);
    pool.scope(|s| {
        // Leave NaN-filled buffers in the pool; the outputs below reuse them.
        drop(s.full::<f32>(&[2, 3], f32::NAN));
        drop(s.full::<f32>(&[6], f32::NAN));
        let a = s.randn::<f32>(&[2, 4], 26);
        let b = s.randn::<f32>(&[4, 3], 27);
        let want = matmul_ref(&a.to_array(), &b.to_array());
        assert_close_tol("after NaN", &a.matmul(&b), &want, 1e-5, 1e-5);

        drop(s.full::<f32>(&[2, 3], f32::NAN));
        let a = s.from_slice::<f32>(&[2, 0], &[]);
        let b = s.from_slice::<f32>(&[0, 3], &[]);
        let want = matmul_ref(&a.to_array(), &b.to_array());
        assert_eq!(want, ArrayD::<f32>::zeros(IxDyn(&[2, 3])));
        assert_close("[2,0] x [0,3]", &a.matmul(&b), &want);

        // A batch of them: each output matrix is zeros too.
        drop(s.full::<f32>(&[2, 2, 3], f32::NAN));
        let a = s.from_slice::<f32>(&[2, 2, 0], &[]);
        let b = s.from_slice::<f32>(&[2, 0, 3], &[]);
        assert_eq!(a.matmul(&b).to_vec(), vec![0.0; 12]);
    });
}

#[test]
fn transpose_swaps_the_last_two_axes_in_2d_and_3d() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let a = s.randn::<f32>(&[3, 4], 28);
        let want = a.to_array().t().to_owned();
        assert_close("2-D transpose", &a.t(), &want);
        assert_close("2-D try_transpose", &a.try_t().unwrap(), &want);

        let b = s.randn::<f32>(&[2, 3, 4], 29);
        let want = b.to_array().permuted_axes(IxDyn(&[0, 2, 1]));
        assert_close("3-D transpose", &b.t(), &want);
        assert_close("transpose twice", &b.t().t(), &b.to_array());
    });
}

// ---------------------------------------------------------------------------------------------
// Elementwise maps
// ---------------------------------------------------------------------------------------------

/// Checks a unary op in its borrowed, shared-owned and unique-owned forms against `f` in f64.
macro_rules! check_unary {
    ($s:expr, $name:literal, |$t:ident| $op:expr, $f:expr) => {{
        let s = $s;
        let fresh = || s.randn::<f32>(&[3, 5], 30) * 3.0;
        let x = fresh();
        let want = to_f64(&x).mapv($f);
        let got = {
            let $t = &x;
            $op
        };
        assert_close(concat!($name, " on &x"), &got, &want);
        let got = {
            let $t = x.clone();
            $op
        };
        assert_close(concat!($name, " on shared x"), &got, &want);
        let got = {
            let $t = fresh();
            $op
        };
        assert_close(concat!($name, " on unique x"), &got, &want);
        assert_eq!(
            x.to_array(),
            fresh().to_array(),
            concat!($name, ": input changed")
        );
    }};
}

#[test]
fn relu_matches_max_with_zero() {
    let pool = test_pool(16);
    pool.scope(|s| check_unary!(s, "relu", |t| t.relu(), |v: f64| v.max(0.0)));
}

#[test]
fn gelu_matches_the_tanh_approximation_formula() {
    let pool = test_pool(16);
    pool.scope(|s| check_unary!(s, "gelu", |t| t.gelu(), gelu_ref));
}

#[test]
fn silu_matches_x_times_sigmoid() {
    let pool = test_pool(16);
    pool.scope(|s| check_unary!(s, "silu", |t| t.silu(), |v: f64| v * sigmoid_ref(v)));
}

#[test]
fn sigmoid_matches_the_logistic_function() {
    let pool = test_pool(16);
    pool.scope(|s| check_unary!(s, "sigmoid", |t| t.sigmoid(), sigmoid_ref));
}

#[test]
fn tanh_matches_f64_tanh() {
    let pool = test_pool(16);
    pool.scope(|s| check_unary!(s, "tanh", |t| t.tanh(), f64::tanh));
}

#[test]
fn exp_matches_f64_exp() {
    let pool = test_pool(16);
    pool.scope(|s| check_unary!(s, "exp", |t| t.exp(), f64::exp));
}

#[test]
fn map_applies_the_closure_to_every_element() {
    let pool = test_pool(16);
    pool.scope(|s| {
        check_unary!(s, "map", |t| t.map(|v| v * v - 1.0), |v: f64| v * v - 1.0);
        let x = s.randn::<f32>(&[2, 3], 31);
        assert_close(
            "try_map",
            &(&x).try_map(|v| v.abs()).unwrap(),
            &x.to_array().mapv(f32::abs),
        );
    });
}

#[test]
fn activations_saturate_without_nan_at_large_magnitudes() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let data = [-1000.0f32, -50.0, 0.0, 50.0, 1000.0];
        let x = s.from_slice::<f32>(&[5], &data);
        let xa = to_f64(&x);
        assert_close("sigmoid", &(&x).sigmoid(), &xa.mapv(sigmoid_ref));
        assert_close("silu", &(&x).silu(), &xa.mapv(|v| v * sigmoid_ref(v)));
        assert_close("gelu", &(&x).gelu(), &xa.mapv(gelu_ref));
        assert_close("tanh", &(&x).tanh(), &xa.mapv(f64::tanh));
    });
}

// ---------------------------------------------------------------------------------------------
// Softmax, layer norm
// ---------------------------------------------------------------------------------------------

#[test]
fn softmax_and_log_softmax_along_first_and_last_axis_of_3d_match_reference() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.randn::<f32>(&[3, 4, 5], 40) * 2.0;
        let xa = to_f64(&x);
        for (log, name) in [(false, "softmax"), (true, "log_softmax")] {
            for axis in [0, 2] {
                let want = softmax_ref(&xa, axis, log);
                let (by_ref, owned) = if log {
                    ((&x).log_softmax(axis), x.clone().try_log_softmax(axis))
                } else {
                    ((&x).softmax(axis), x.clone().try_softmax(axis))
                };
                assert_close(&format!("{name} axis {axis}"), &by_ref, &want);
                assert_close(
                    &format!("try_{name} axis {axis} (owned)"),
                    &owned.unwrap(),
                    &want,
                );
                let probs = to_f64(&by_ref).mapv(|v| if log { v.exp() } else { v });
                let sums = probs.sum_axis(Axis(axis));
                assert!(
                    sums.iter().all(|&t| (t - 1.0).abs() < 1e-5),
                    "{name} axis {axis}: lane sums {sums:?}"
                );
                assert!(probs.iter().all(|&p| (0.0..=1.0).contains(&p)));
            }
        }
    });
}

#[test]
fn softmax_of_large_values_does_not_overflow() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let data = [1000.0f32, 1001.0, 1002.0, -1000.0, 0.0, 1000.0];
        let x = s.from_slice::<f32>(&[2, 3], &data);
        let xa = to_f64(&x);
        let y = (&x).softmax(1);
        assert!(y.as_slice().iter().all(|v| v.is_finite()), "{y:?}");
        assert_close("softmax of 1000s", &y, &softmax_ref(&xa, 1, false));
        let l = (&x).log_softmax(1);
        assert!(l.as_slice().iter().all(|v| v.is_finite()), "{l:?}");
        assert_close("log_softmax of 1000s", &l, &softmax_ref(&xa, 1, true));
        let along0 = x.softmax(0);
        assert_close(
            "softmax axis 0 of 1000s",
            &along0,
            &softmax_ref(&xa, 0, false),
        );
    });
}

#[test]
fn layer_norm_over_the_last_axis_matches_reference() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.randn::<f32>(&[2, 3, 8], 42) * 3.0 + 1.5;
        let want = layer_norm_ref(&to_f64(&x), 1e-5);
        assert_close("layer_norm &x", &(&x).layer_norm(1e-5), &want);
        assert_close(
            "try_layer_norm shared x",
            &x.clone().try_layer_norm(1e-5).unwrap(),
            &want,
        );
        let y = x.layer_norm(1e-5);
        assert_close("layer_norm unique x", &y, &want);
        // Every row has mean 0 and (almost, because of eps) unit variance.
        let ya = to_f64(&y);
        for lane in ya.lanes(Axis(2)) {
            assert!(lane.mean().unwrap().abs() < 1e-5);
            assert!((lane.mapv(|v| v * v).mean().unwrap() - 1.0).abs() < 1e-3);
        }
        let big_eps = s.randn::<f32>(&[4, 3], 43);
        let want = layer_norm_ref(&to_f64(&big_eps), 0.5);
        assert_close("layer_norm eps 0.5", &big_eps.layer_norm(0.5), &want);
    });
}

// ---------------------------------------------------------------------------------------------
// Reductions, concat, zip_map, reshape
// ---------------------------------------------------------------------------------------------

#[test]
fn sum_and_mean_along_each_axis_of_3d_match_ndarray() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.randn::<f32>(&[2, 3, 4], 50);
        let xa = x.to_array();
        for axis in 0..3 {
            let want_sum = xa.sum_axis(Axis(axis));
            let want_mean = xa.mean_axis(Axis(axis)).unwrap();
            assert_close(&format!("sum axis {axis}"), &x.sum(axis), &want_sum);
            assert_close(
                &format!("try_sum axis {axis}"),
                &x.try_sum(axis).unwrap(),
                &want_sum,
            );
            assert_close(&format!("mean axis {axis}"), &x.mean(axis), &want_mean);
            assert_close(
                &format!("try_mean axis {axis}"),
                &x.try_mean(axis).unwrap(),
                &want_mean,
            );
        }
    });
}

#[test]
fn concat_of_three_tensors_along_axes_0_and_1_matches_ndarray_concatenate() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let (a, b, c) = (
            s.randn::<f32>(&[1, 3], 51),
            s.randn::<f32>(&[2, 3], 52),
            s.randn::<f32>(&[3, 3], 53),
        );
        let (aa, ba, ca) = (a.to_array(), b.to_array(), c.to_array());
        let want = concatenate(Axis(0), &[aa.view(), ba.view(), ca.view()]).unwrap();
        assert_close("concat axis 0", &Tensor::concat(&[&a, &b, &c], 0), &want);

        let (a, b, c) = (
            s.randn::<f32>(&[2, 1, 2], 54),
            s.randn::<f32>(&[2, 2, 2], 55),
            s.randn::<f32>(&[2, 4, 2], 56),
        );
        let (aa, ba, ca) = (a.to_array(), b.to_array(), c.to_array());
        let want = concatenate(Axis(1), &[aa.view(), ba.view(), ca.view()]).unwrap();
        assert_close(
            "concat axis 1",
            &Tensor::try_concat(&[&a, &b, &c], 1).unwrap(),
            &want,
        );
    });
}

#[test]
fn zip_map_broadcasts_both_operands() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let a = s.randn::<f32>(&[4, 1, 3], 57);
        let b = s.randn::<f32>(&[5, 1], 58);
        let f = |x: f32, y: f32| x.max(y) * 2.0 - y;
        let (aa, ba) = (a.to_array(), b.to_array());
        let shape = IxDyn(&[4, 5, 3]);
        let want = Zip::from(&aa.broadcast(shape.clone()).unwrap())
            .and(&ba.broadcast(shape).unwrap())
            .map_collect(|&x, &y| f(x, y));
        assert_close("zip_map", &a.zip_map(&b, f), &want);
        assert_close("try_zip_map", &a.try_zip_map(&b, f).unwrap(), &want);
        // Argument order is kept when the smaller operand is on the left.
        let rev = b.zip_map(&a, f);
        let want = Zip::from(&ba.broadcast(IxDyn(&[4, 5, 3])).unwrap())
            .and(&aa.broadcast(IxDyn(&[4, 5, 3])).unwrap())
            .map_collect(|&x, &y| f(x, y));
        assert_close("zip_map reversed", &rev, &want);
    });
}

#[test]
fn reshape_keeps_row_major_order_and_shares_the_buffer() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.randn::<f32>(&[2, 3, 4], 59);
        let xa = x.to_array();
        let r = x.reshape(&[6, 4]);
        let want = xa.to_shape((6, 4)).unwrap().to_owned();
        assert_close("reshape [6, 4]", &r, &want);
        assert!(r.shares_buffer_with(&x));
        let flat = r.try_reshape(&[24]).unwrap();
        assert_eq!(flat.to_vec(), xa.iter().copied().collect::<Vec<_>>());
        assert_close(
            "reshape [4, 1, 6]",
            &x.reshape(&[4, 1, 6]),
            &xa.to_shape((4, 1, 6)).unwrap().to_owned(),
        );
    });
}

// ---------------------------------------------------------------------------------------------
// Other element types
// ---------------------------------------------------------------------------------------------

#[test]
fn f64_ops_match_ndarray_to_f64_precision() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let (rtol, atol) = (1e-12, 1e-14);
        let a = s.randn::<f64>(&[2, 3, 4], 60);
        let b = s.randn::<f64>(&[4], 61);
        let w = s.randn::<f64>(&[4, 5], 62);
        let (aa, ba, wa) = (a.to_array(), b.to_array(), w.to_array());
        assert_close_tol("f64 add broadcast", &(&a + &b), &(&aa + &ba), rtol, atol);
        assert_close_tol("f64 mul", &(a.clone() * &b), &(&aa * &ba), rtol, atol);
        assert_close_tol(
            "f64 matmul",
            &a.matmul(&w),
            &matmul_ref(&aa, &wa),
            rtol,
            atol,
        );
        assert_close_tol(
            "f64 softmax",
            &(&a).softmax(2),
            &softmax_ref(&aa, 2, false),
            rtol,
            atol,
        );
        assert_close_tol(
            "f64 layer_norm",
            &(&a).layer_norm(1e-6),
            &layer_norm_ref(&aa, 1e-6),
            rtol,
            atol,
        );
        assert_close_tol("f64 gelu", &(&a).gelu(), &aa.mapv(gelu_ref), rtol, atol);
        assert_close_tol("f64 sum", &a.sum(1), &aa.sum_axis(Axis(1)), rtol, atol);
    });
}

/// A few ops in a 16-bit type `T`, against f64 computed from the same (rounded) inputs. `eps` is
/// the type's machine epsilon.
fn check_half_precision_ops<T: Element>(eps: f64) {
    let pool = test_pool(16);
    pool.scope(|s| {
        // One rounding of the result: half an ulp, with slack.
        let (rtol, atol) = (eps, eps);
        let a = s.randn::<T>(&[2, 3, 4], 70);
        let b = s.randn::<T>(&[4], 71);
        let w = s.randn::<T>(&[4, 3], 72);
        let (aa, ba, wa) = (to_f64(&a), to_f64(&b), to_f64(&w));
        let name = T::NAME;
        assert_close_tol(&format!("{name} add"), &(&a + &b), &(&aa + &ba), rtol, atol);
        assert_close_tol(&format!("{name} mul"), &(&a * &b), &(&aa * &ba), rtol, atol);
        assert_close_tol(
            &format!("{name} relu"),
            &(&a).relu(),
            &aa.mapv(|v| v.max(0.0)),
            0.0,
            0.0,
        );
        assert_close_tol(
            &format!("{name} exp"),
            &(&a).exp(),
            &aa.mapv(f64::exp),
            rtol,
            atol,
        );
        // Accumulated in the type: k roundings of partial sums of magnitude up to sum |a||b|.
        let k = 4.0;
        let scale = matmul_ref(&aa.mapv(f64::abs), &wa.mapv(f64::abs));
        let got = to_f64(&a.matmul(&w));
        let want = matmul_ref(&aa, &wa);
        for ((g, w), sc) in got.iter().zip(&want).zip(&scale) {
            assert!(
                (g - w).abs() <= (k + 1.0) * eps * sc + eps,
                "{name} matmul: got {g}, expected {w}"
            );
        }
        assert_close_tol(
            &format!("{name} softmax"),
            &(&a).softmax(2),
            &softmax_ref(&aa, 2, false),
            4.0 * eps,
            eps,
        );
        // Four terms summed in the type.
        assert_close_tol(
            &format!("{name} sum"),
            &a.sum(2),
            &aa.sum_axis(Axis(2)),
            0.0,
            8.0 * eps,
        );
    });
}

#[test]
fn f16_ops_match_f64_reference_within_f16_precision() {
    check_half_precision_ops::<f16>(f64::from(f16::EPSILON.to_f32()));
}

#[test]
fn bf16_ops_match_f64_reference_within_bf16_precision() {
    check_half_precision_ops::<bf16>(f64::from(bf16::EPSILON.to_f32()));
}

// ---------------------------------------------------------------------------------------------
// In-place reuse
// ---------------------------------------------------------------------------------------------

#[test]
fn by_value_ops_on_a_unique_tensor_write_into_its_own_buffer() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.randn::<f32>(&[4, 8], 80);
        let mut want = to_f64(&x);
        let ptr = x.as_slice().as_ptr();
        let before = pool.stats();
        let rented = s.stats().rented;

        macro_rules! step {
            ($x:ident = $op:expr, $f:expr) => {
                let $x = $op;
                want = $f(want);
                assert_eq!($x.as_slice().as_ptr(), ptr, "{} moved", stringify!($op));
            };
        }
        step!(x = x.relu(), |w: ArrayD<f64>| w.mapv(|v| v.max(0.0)));
        step!(x = x * 2.0, |w: ArrayD<f64>| w * 2.0);
        step!(x = x - 0.5, |w: ArrayD<f64>| w - 0.5);
        step!(x = 3.0f32 * x, |w: ArrayD<f64>| w * 3.0);
        step!(x = -x, |w: ArrayD<f64>| -w);
        step!(x = x.gelu(), |w: ArrayD<f64>| w.mapv(gelu_ref));
        step!(x = x.silu(), |w: ArrayD<f64>| w
            .mapv(|v| v * sigmoid_ref(v)));
        step!(x = x.tanh(), |w: ArrayD<f64>| w.mapv(f64::tanh));
        step!(x = x.sigmoid(), |w: ArrayD<f64>| w.mapv(sigmoid_ref));
        step!(x = x.exp(), |w: ArrayD<f64>| w.mapv(f64::exp));
        step!(x = x.map(|v| v * v), |w: ArrayD<f64>| w.mapv(|v| v * v));
        step!(x = x.layer_norm(1e-5), |w: ArrayD<f64>| layer_norm_ref(
            &w, 1e-5
        ));
        step!(x = x.softmax(0), |w: ArrayD<f64>| softmax_ref(&w, 0, false));
        step!(x = x.log_softmax(1), |w: ArrayD<f64>| softmax_ref(
            &w, 1, true
        ));

        let after = pool.stats();
        assert_eq!(after.misses, before.misses, "no new allocation");
        assert_eq!(
            after.hits, before.hits,
            "no rent served from the cache either"
        );
        assert_eq!(s.stats().rented, rented, "nothing rented");
        assert_close_tol("chain of in-place ops", &x, &want, 1e-4, 1e-5);
    });
}

#[test]
fn by_value_op_on_a_tensor_with_a_live_clone_rents_and_leaves_the_clone_intact() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let b = s.randn::<f32>(&[3], 81);
        let x = s.randn::<f32>(&[2, 3], 82);
        let original = x.to_array();

        // Each op consumes one handle while `keep` stays alive.
        let check =
            |what: &str, keep: &Tensor<'_, f32>, y: &Tensor<'_, f32>, rented_before: u64| {
                assert_ne!(
                    y.as_slice().as_ptr(),
                    keep.as_slice().as_ptr(),
                    "{what}: same buffer"
                );
                assert!(!y.shares_buffer_with(keep), "{what}");
                assert_eq!(keep.to_array(), original, "{what}: the clone changed");
                assert_eq!(s.stats().rented, rented_before + 1, "{what}: one new rent");
            };

        let keep = x.clone();
        let r = s.stats().rented;
        let y = x.clone().relu();
        check("relu", &keep, &y, r);
        assert_close("relu values", &y, &original.mapv(|v| v.max(0.0)));

        let r = s.stats().rented;
        let y = x.clone() * 2.0;
        check("* 2", &keep, &y, r);
        assert_close("* 2 values", &y, &(&original * 2.0));

        let r = s.stats().rented;
        let y = x.clone().softmax(1);
        check("softmax", &keep, &y, r);
        assert_close(
            "softmax values",
            &y,
            &softmax_ref(&original.mapv(f64::from), 1, false),
        );

        let r = s.stats().rented;
        let y = x.clone() + &b;
        check("+ &b", &keep, &y, r);
        assert_close("+ &b values", &y, &(&original + &b.to_array()));

        // A reshape is an alias too.
        let view = x.reshape(&[3, 2]);
        let r = s.stats().rented;
        let y = x.exp();
        check("exp with a reshaped alias", &view.reshape(&[2, 3]), &y, r);
        assert_close("exp values", &y, &original.mapv(f32::exp));
    });
}

#[test]
fn owned_lhs_with_borrowed_rhs_reuses_the_lhs_buffer() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let b = s.randn::<f32>(&[3], 83);
        for rhs_shape in [&[2usize, 3][..], &[3], &[1]] {
            let b = if rhs_shape == [3] {
                b.clone()
            } else {
                s.uniform::<f32>(rhs_shape, 0.5, 2.0, 84)
            };
            let a = s.randn::<f32>(&[2, 3], 85);
            let want = &a.to_array() - &b.to_array();
            let ptr = a.as_slice().as_ptr();
            let before = pool.stats();
            let y = a - &b;
            assert_eq!(y.as_slice().as_ptr(), ptr, "a - &b with b {rhs_shape:?}");
            assert_eq!(pool.stats().misses, before.misses);
            assert_eq!(pool.stats().hits, before.hits);
            assert_close("a - &b values", &y, &want);
        }
        // Both owned and unique with the output shape: the left one is written.
        let a = s.randn::<f32>(&[2, 3], 86);
        let c = s.uniform::<f32>(&[2, 3], 0.5, 2.0, 87);
        let want = &a.to_array() / &c.to_array();
        let ptr = a.as_slice().as_ptr();
        let y = a / c;
        assert_eq!(y.as_slice().as_ptr(), ptr);
        assert_close("a / c values", &y, &want);
    });
}

#[test]
fn borrowed_lhs_with_owned_rhs_reuses_the_rhs_buffer_when_it_has_the_output_shape() {
    let pool = test_pool(16);
    pool.scope(|s| {
        // Non-commutative ops, so a swapped argument order would show.
        for lhs_shape in [&[2usize, 3][..], &[3], &[2, 1]] {
            let a = s.randn::<f32>(lhs_shape, 88);
            let b = s.uniform::<f32>(&[2, 3], 0.5, 2.0, 89);
            let (aa, ba) = (a.to_array(), b.to_array());
            let ptr = b.as_slice().as_ptr();
            let before = pool.stats();
            let y = &a - b;
            assert_eq!(y.as_slice().as_ptr(), ptr, "&a - b with a {lhs_shape:?}");
            assert_eq!(pool.stats().misses, before.misses);
            assert_eq!(pool.stats().hits, before.hits);
            assert_close("&a - b values", &y, &(&aa - &ba));

            // Both owned: the lhs is written if it has the output shape, else the rhs.
            let a = s.randn::<f32>(lhs_shape, 88);
            let b = s.uniform::<f32>(&[2, 3], 0.5, 2.0, 89);
            let ptr = if lhs_shape == [2, 3] {
                a.as_slice().as_ptr()
            } else {
                b.as_slice().as_ptr()
            };
            let y = a / b;
            assert_eq!(y.as_slice().as_ptr(), ptr, "a / b with a {lhs_shape:?}");
            assert_close("a / b values", &y, &(&aa / &ba));
        }
    });
}

#[test]
fn borrowed_lhs_with_owned_rhs_that_must_broadcast_rents_a_new_buffer() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let a = s.randn::<f32>(&[2, 3], 90);
        let b = s.uniform::<f32>(&[3], 0.5, 2.0, 91);
        let want = &a.to_array() / &b.to_array();
        let (pa, pb) = (a.as_slice().as_ptr(), b.as_slice().as_ptr());
        let rented = s.stats().rented;
        let y = &a / b;
        assert_eq!(s.stats().rented, rented + 1);
        assert_ne!(y.as_slice().as_ptr(), pa);
        assert_ne!(y.as_slice().as_ptr(), pb);
        assert_close("&a / b values", &y, &want);
        assert_eq!(a.to_array(), s.randn::<f32>(&[2, 3], 90).to_array());
    });
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

#[test]
fn matmul_inner_dimension_mismatch_names_both_shapes() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let (a, b) = (s.zeros::<f32>(&[2, 3]), s.zeros::<f32>(&[4, 5]));
        let err = a.try_matmul(&b).unwrap_err();
        assert_eq!(
            err,
            shape_mismatch(
                "matmul",
                &[2, 3],
                &[4, 5],
                "inner dimensions differ (3 and 4)"
            )
        );
        assert_eq!(
            err.to_string(),
            "matmul: incompatible shapes [2, 3] and [4, 5]: inner dimensions differ (3 and 4)"
        );
        assert_panics_with(&err, || drop(a.matmul(&b)));

        let (a, b) = (s.zeros::<f32>(&[2, 3, 4]), s.zeros::<f32>(&[2, 5, 6]));
        let err = a.try_matmul(&b).unwrap_err();
        assert_eq!(
            err,
            shape_mismatch(
                "matmul",
                &[2, 3, 4],
                &[2, 5, 6],
                "inner dimensions differ (4 and 5)"
            )
        );
        assert_panics_with(&err, || drop(a.matmul(&b)));
    });
}

#[test]
fn matmul_batch_axes_that_do_not_broadcast_name_both_shapes() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let (a, b) = (s.zeros::<f32>(&[2, 3, 4]), s.zeros::<f32>(&[3, 4, 5]));
        let err = a.try_matmul(&b).unwrap_err();
        assert_eq!(
            err,
            shape_mismatch(
                "matmul",
                &[2, 3, 4],
                &[3, 4, 5],
                "batch axes [2] and [3] do not broadcast"
            )
        );
        assert_panics_with(&err, || drop(a.matmul(&b)));
    });
}

#[test]
fn matmul_rejects_rank_1_operands_and_takes_a_rank_2_left_over_a_batch() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let v = s.zeros::<f32>(&[3]);
        let m = s.zeros::<f32>(&[3, 2]);
        let err = v.try_matmul(&m).unwrap_err();
        assert_eq!(
            err,
            shape_mismatch(
                "matmul",
                &[3],
                &[3, 2],
                "operands need rank 2 or more, got ranks 1 and 2"
            )
        );
        assert_panics_with(&err, || drop(v.matmul(&m)));

        let m = s.zeros::<f32>(&[2, 3]);
        let err = m.try_matmul(&v).unwrap_err();
        assert_eq!(
            err,
            shape_mismatch(
                "matmul",
                &[2, 3],
                &[3],
                "operands need rank 2 or more, got ranks 2 and 1"
            )
        );
        // A matrix times a batch of matrices broadcasts the left one, as in PyTorch.
        let b3 = s.ones::<f32>(&[2, 3, 4]);
        let ones = s.ones::<f32>(&[2, 3]);
        assert_eq!(ones.matmul(&b3).shape(), &[2, 2, 4]);
        assert_eq!(ones.matmul(&b3).to_vec(), vec![3.0; 16]);
    });
}

/// A `try_` binary op with its result dropped.
type TryBinary = fn(&Tensor<'_, f32>, &Tensor<'_, f32>) -> tensorscope::Result<()>;

#[test]
fn elementwise_broadcast_failure_names_the_op_and_both_shapes() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let a = s.zeros::<f32>(&[2, 3]);
        let b = s.zeros::<f32>(&[2]);
        let reason = "cannot broadcast: axis 1 of the result has lengths 3 and 2, neither is 1";
        let cases: [(&'static str, TryBinary); 5] = [
            ("add", |a, b| a.try_add(b).map(drop)),
            ("sub", |a, b| a.try_sub(b).map(drop)),
            ("mul", |a, b| a.try_mul(b).map(drop)),
            ("div", |a, b| a.try_div(b).map(drop)),
            ("zip_map", |a, b| a.try_zip_map(b, |x, y| x + y).map(drop)),
        ];
        for (op, f) in cases {
            let err = f(&a, &b).unwrap_err();
            assert_eq!(err, shape_mismatch(op, &[2, 3], &[2], reason));
            assert_eq!(
                err.to_string(),
                format!("{op}: incompatible shapes [2, 3] and [2]: {reason}")
            );
        }
        // The operators panic with the same message, in every operand mix.
        let add = shape_mismatch("add", &[2, 3], &[2], reason);
        assert_panics_with(&add, || drop(&a + &b));
        assert_panics_with(&add, || drop(a.clone() + b.clone()));
        assert_panics_with(&add, || drop(a.clone() + &b));
        assert_panics_with(&add, || drop(&a + b.clone()));
        let sub = shape_mismatch("sub", &[2, 3], &[2], reason);
        assert_panics_with(&sub, || drop(&a - &b));
        let mul = shape_mismatch("mul", &[2, 3], &[2], reason);
        assert_panics_with(&mul, || drop(&a * &b));
        let div = shape_mismatch("div", &[2, 3], &[2], reason);
        assert_panics_with(&div, || drop(a.clone() / b.clone()));
        let zip = shape_mismatch("zip_map", &[2, 3], &[2], reason);
        assert_panics_with(&zip, || drop(a.zip_map(&b, |x, _| x)));

        // Reversed operands keep their order in the message.
        let err = b.try_add(&a).unwrap_err();
        assert_eq!(
            err,
            shape_mismatch(
                "add",
                &[2],
                &[2, 3],
                "cannot broadcast: axis 1 of the result has lengths 2 and 3, neither is 1"
            )
        );
    });
}

#[test]
fn softmax_log_softmax_sum_mean_with_a_bad_axis_report_axis_out_of_range() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.zeros::<f32>(&[2, 3, 4]);
        let out_of_range = |op| Error::AxisOutOfRange {
            op,
            axis: 3,
            ndim: 3,
        };

        let err = (&x).try_softmax(3).unwrap_err();
        assert_eq!(err, out_of_range("softmax"));
        assert_eq!(
            err.to_string(),
            "softmax: axis 3 is out of range for a tensor of rank 3"
        );
        assert_panics_with(&err, || drop((&x).softmax(3)));
        assert_eq!(x.clone().try_softmax(3).unwrap_err(), err);

        let err = (&x).try_log_softmax(3).unwrap_err();
        assert_eq!(err, out_of_range("log_softmax"));
        assert_panics_with(&err, || drop(x.clone().log_softmax(3)));

        let err = x.try_sum(3).unwrap_err();
        assert_eq!(err, out_of_range("sum"));
        assert_panics_with(&err, || drop(x.sum(3)));

        let err = x.try_mean(3).unwrap_err();
        assert_eq!(err, out_of_range("mean"));
        assert_panics_with(&err, || drop(x.mean(3)));

        let err = Tensor::try_concat(&[&x, &x], 3).unwrap_err();
        assert_eq!(err, out_of_range("concat"));
        assert_panics_with(&err, || drop(Tensor::concat(&[&x, &x], 3)));
    });
}

#[test]
fn t_of_a_1d_tensor_is_an_invalid_shape() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let v = s.zeros::<f32>(&[5]);
        let err = v.try_t().unwrap_err();
        assert_eq!(
            err,
            Error::InvalidShape {
                op: "t",
                shape: Shape(vec![5]),
                reason: "needs at least two axes".into(),
            }
        );
        assert_eq!(
            err.to_string(),
            "t: invalid shape [5]: needs at least two axes"
        );
        assert_panics_with(&err, || drop(v.t()));
    });
}

#[test]
fn layer_norm_of_a_rank_0_tensor_is_an_invalid_shape() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.from_slice::<f32>(&[], &[2.0]);
        let err = (&x).try_layer_norm(1e-5).unwrap_err();
        assert!(
            matches!(err, Error::InvalidShape { op: "layer_norm", ref shape, .. } if shape.0.is_empty()),
            "{err}"
        );
        assert!(err.to_string().starts_with("layer_norm: invalid shape []"));
        assert_panics_with(&err, || drop(x.layer_norm(1e-5)));
    });
}

#[test]
fn concat_with_mismatched_shapes_names_both_shapes() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let a = s.zeros::<f32>(&[2, 3]);
        let b = s.zeros::<f32>(&[4, 3]);
        let c = s.zeros::<f32>(&[2, 4]);
        let err = Tensor::try_concat(&[&a, &b, &c], 0).unwrap_err();
        assert_eq!(
            err,
            shape_mismatch(
                "concat",
                &[2, 3],
                &[2, 4],
                "axis 1 differs (3 and 4); only the joined axis 0 may"
            )
        );
        assert_eq!(
            err.to_string(),
            "concat: incompatible shapes [2, 3] and [2, 4]: axis 1 differs (3 and 4); only the joined axis 0 may"
        );
        assert_panics_with(&err, || drop(Tensor::concat(&[&a, &b, &c], 0)));

        // Different ranks never fit.
        let v = s.zeros::<f32>(&[3]);
        let err = Tensor::try_concat(&[&a, &v], 0).unwrap_err();
        assert_eq!(
            err,
            shape_mismatch("concat", &[2, 3], &[3], "ranks differ (2 and 1)")
        );
    });
}

#[test]
fn concat_of_an_empty_list_is_a_no_inputs_error() {
    let pool = test_pool(16);
    pool.scope(|_s| {
        let err = Tensor::<f32>::try_concat(&[], 0).unwrap_err();
        assert_eq!(err, Error::NoInputs { op: "concat" });
        assert_eq!(
            err.to_string(),
            "concat: needs at least one tensor, got an empty list"
        );
        assert_panics_with(&err, || drop(Tensor::<f32>::concat(&[], 0)));
    });
}

#[test]
fn reshape_to_a_different_element_count_names_both_shapes() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.zeros::<f32>(&[2, 3]);
        let err = x.try_reshape(&[4, 2]).unwrap_err();
        assert_eq!(
            err,
            shape_mismatch(
                "reshape",
                &[2, 3],
                &[4, 2],
                "6 elements cannot be viewed as 8"
            )
        );
        assert_panics_with(&err, || drop(x.reshape(&[4, 2])));
    });
}

#[test]
fn from_slice_with_the_wrong_length_reports_length_mismatch() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let err = s.try_from_slice::<f32>(&[2, 3], &[1.0; 5]).unwrap_err();
        assert_eq!(
            err,
            Error::LengthMismatch {
                op: "from_slice",
                shape: Shape(vec![2, 3]),
                expected: 6,
                got: 5,
            }
        );
        assert_eq!(
            err.to_string(),
            "from_slice: shape [2, 3] holds 6 elements but 5 were given"
        );
        assert_panics_with(&err, || drop(s.from_slice::<f32>(&[2, 3], &[1.0; 5])));
    });
}

#[test]
#[should_panic(
    expected = "matmul: incompatible shapes [2, 3] and [4, 5]: inner dimensions differ (3 and 4)"
)]
fn matmul_panics_with_the_error_message() {
    let pool = test_pool(16);
    pool.scope(|s| drop(s.zeros::<f32>(&[2, 3]).matmul(&s.zeros::<f32>(&[4, 5]))));
}

// ---------------------------------------------------------------------------------------------
// Edge cases
// ---------------------------------------------------------------------------------------------

#[test]
fn rank_0_and_empty_tensors_broadcast_like_ndarray() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let scalar = s.from_slice::<f32>(&[], &[2.5]);
        let row = s.randn::<f32>(&[3], 100);
        let (sa, ra) = (scalar.to_array(), row.to_array());
        assert_close("rank-0 + [3]", &(&scalar + &row), &(&sa + &ra));
        assert_close("[3] * rank-0", &(&row * &scalar), &(&ra * &sa));
        assert_close("rank-0 - rank-0", &(&scalar - &scalar), &(&sa - &sa));

        let empty = s.from_slice::<f32>(&[0, 3], &[]);
        let ea = empty.to_array();
        assert_close("[0, 3] + [3]", &(&empty + &row), &(&ea + &ra));
        assert_close("[0, 3] relu", &(&empty).relu(), &ea);
        assert_close("[0, 3] transpose", &empty.t(), &ea.t().to_owned());
        assert_close("[0, 3] sum 0", &empty.sum(0), &ea.sum_axis(Axis(0)));
        assert_close("[0, 3] sum 1", &empty.sum(1), &ea.sum_axis(Axis(1)));
        let mean0 = empty.mean(0);
        assert_eq!(mean0.shape(), &[3]);
        assert!(
            mean0.as_slice().iter().all(|v| v.is_nan()),
            "0/0: {mean0:?}"
        );

        let two = s.randn::<f32>(&[2, 3], 101);
        let ta = two.to_array();
        let want = concatenate(Axis(0), &[ea.view(), ta.view(), ea.view()]).unwrap();
        assert_close(
            "concat with empty pieces",
            &Tensor::concat(&[&empty, &two, &empty], 0),
            &want,
        );
    });
}

#[test]
fn softmax_and_layer_norm_of_length_1_lanes() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.randn::<f32>(&[4, 1], 102) * 10.0;
        let xa = to_f64(&x);
        assert_close("softmax", &(&x).softmax(1), &softmax_ref(&xa, 1, false));
        assert_close(
            "log_softmax",
            &(&x).log_softmax(1),
            &softmax_ref(&xa, 1, true),
        );
        assert_close(
            "layer_norm",
            &(&x).layer_norm(1e-5),
            &layer_norm_ref(&xa, 1e-5),
        );
    });
}

#[test]
fn softmax_gives_zero_probability_to_negative_infinity() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let data = [f32::NEG_INFINITY, 0.0, 1.0, 2.0, f32::NEG_INFINITY, -1.0];
        let x = s.from_slice::<f32>(&[2, 3], &data);
        let xa = to_f64(&x);
        let y = (&x).softmax(1);
        assert_close("softmax with -inf", &y, &softmax_ref(&xa, 1, false));
        assert_eq!(y.as_slice()[0], 0.0);
        assert_eq!(y.as_slice()[4], 0.0);
        let l = (&x).log_softmax(1);
        assert_close("log_softmax with -inf", &l, &softmax_ref(&xa, 1, true));
        assert_eq!(l.as_slice()[0], f32::NEG_INFINITY);
    });
}

#[test]
fn custom_kernels_map_lanes_and_rent_with_match_ndarray() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.randn::<f32>(&[3, 5], 21);
        let xv = x.to_array();
        // Running sum along axis 1, by reference (x unchanged) and by value (in place).
        let cumsum = |mut lane: ndarray::ArrayViewMut1<'_, f32>| {
            let mut acc = 0.0;
            lane.iter_mut().for_each(|v| {
                acc += *v;
                *v = acc;
            });
        };
        let by_ref = (&x).map_lanes(1, cumsum);
        let mut expected = xv.clone();
        expected.accumulate_axis_inplace(ndarray::Axis(1), |&prev, cur| *cur += prev);
        assert_eq!(by_ref.to_array(), expected);
        assert_eq!(x.to_array(), xv, "the borrowed input is unchanged");
        let ptr = x.as_slice().as_ptr();
        let by_value = x.map_lanes(1, cumsum);
        assert_eq!(
            by_value.as_slice().as_ptr(),
            ptr,
            "a unique input is written in place"
        );
        assert_eq!(by_value.to_array(), expected);

        let iota = s.rent_with::<f64>(&[2, 3], |mut v| {
            v.indexed_iter_mut()
                .for_each(|(ix, e)| *e = (ix[0] * 10 + ix[1]) as f64)
        });
        let expected = ndarray::Array2::from_shape_fn((2, 3), |(i, j)| (i * 10 + j) as f64);
        assert_eq!(iota.to_array(), expected.into_dyn());
        let err = (&iota).try_map_lanes(2, |_| ()).unwrap_err();
        assert_eq!(
            err,
            Error::AxisOutOfRange {
                op: "map_lanes",
                axis: 2,
                ndim: 2
            }
        );
    });
}

#[test]
fn huge_lengths_next_to_a_zero_axis_are_size_errors_not_panics() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let overflow = |e: Error| matches!(e, Error::SizeOverflow { elem_bytes: 4, .. });
        // ndarray's rule: the non-zero lengths must address at most isize::MAX bytes.
        assert!(overflow(
            s.try_full::<f32>(&[0, usize::MAX], 1.0).unwrap_err()
        ));
        assert!(overflow(
            s.try_zeros::<f32>(&[0, 1 << 40, 1 << 40]).unwrap_err()
        ));
        assert!(overflow(
            s.try_zeros::<f32>(&[1 << 40, 1 << 40, 0]).unwrap_err()
        ));
        let ok = s.try_zeros::<f32>(&[0, 1 << 20]).unwrap();
        assert_eq!((ok.len(), ok.view().shape()), (0, &[0, 1 << 20][..]));
        let empty = s.zeros::<f32>(&[0]);
        assert!(overflow(empty.try_reshape(&[0, usize::MAX]).unwrap_err()));
        assert!(overflow(
            s.try_from_slice::<f32>(&[usize::MAX, 2], &[]).unwrap_err()
        ));
        let wide = s.zeros::<f32>(&[0, 1 << 60]); // 2^62 bytes per row: still valid
        assert_eq!(Tensor::concat(&[&wide, &wide], 0).shape(), &[0, 1 << 60]);
        assert_eq!(
            Tensor::try_concat(&[&wide, &wide], 1).unwrap_err(),
            Error::DimensionOverflow {
                op: "concat",
                operand: "joined length",
                value: 1 << 61,
                shape: Shape(vec![0, 1 << 60]),
            }
        );
    });
}

#[test]
fn ops_on_empty_tensors_do_no_work_however_long_their_other_axes() {
    use tensorscope::__private::{kernel_visits, limit_kernel_visits};
    const N: usize = 1 << 60;
    let pool = test_pool(8);
    pool.scope(|s| {
        let wide = s.zeros::<f32>(&[0, N]);
        let tall = s.zeros::<f32>(&[N, 0]);
        let before = kernel_visits();
        // Debug builds panic at the first lane counted, rather than loop 2^60 times.
        limit_kernel_visits(Some(0));
        assert_eq!((&wide).softmax(0).shape(), &[0, N]);
        assert_eq!((&wide).log_softmax(0).shape(), &[0, N]);
        assert_eq!((&tall).layer_norm(1e-5).shape(), &[N, 0]);
        let lanes = (&tall).map_lanes(1, |_| panic!("no lane has an element"));
        assert_eq!(lanes.shape(), &[N, 0]);
        let cube = s.zeros::<f32>(&[0, N, 1]);
        assert_eq!(cube.sum(1).shape(), &[0, 1]);
        assert_eq!(cube.mean(1).shape(), &[0, 1]);
        let product = s
            .zeros::<f32>(&[N, 0, 1])
            .matmul(&s.zeros::<f32>(&[N, 1, 0]));
        assert_eq!(product.shape(), &[N, 0, 0]);
        assert_eq!(wide.t().shape(), &[N, 0]);
        assert_eq!((&tall + &s.ones::<f32>(&[1, 1])).shape(), &[N, 0]);
        assert_eq!(Tensor::concat(&[&tall, &tall], 1).shape(), &[N, 0]);
        let images = s.zeros::<f32>(&[N, 0, 1, 1]);
        let kernel = s.zeros::<f32>(&[0, 0, 1, 1]);
        assert_eq!(images.conv2d(&kernel, 1, 0).shape(), &[N, 0, 1, 1]);
        assert_eq!(images.group_norm(1, 1e-5).shape(), &[N, 0, 1, 1]);
        // Upsampling 2^60 images by 2 would pass isize::MAX bytes; 2^56 does not.
        let small = s.zeros::<f32>(&[N >> 4, 0, 1, 1]);
        assert_eq!(small.upsample_nearest2d(2).shape(), &[N >> 4, 0, 2, 2]);
        limit_kernel_visits(None);
        assert_eq!(kernel_visits(), before);
    });
}

#[test]
fn every_activation_propagates_nan_as_pytorch_does() {
    let pool = test_pool(8);
    pool.scope(|s| {
        let x = s.from_slice::<f32>(&[3], &[f32::NAN, -1.0, 2.0]);
        let outputs = [
            ("relu", (&x).relu()),
            ("gelu", (&x).gelu()),
            ("silu", (&x).silu()),
            ("sigmoid", (&x).sigmoid()),
            ("tanh", (&x).tanh()),
            ("exp", (&x).exp()),
        ];
        for (name, y) in outputs {
            let y = y.to_vec();
            assert!(y[0].is_nan(), "{name}(NaN) = {}", y[0]);
            assert!(!y[1].is_nan() && !y[2].is_nan(), "{name}: {y:?}");
        }
        // threshold(x, 0, 0): -0.0 gives +0.0.
        let zero = s.from_slice::<f32>(&[1], &[-0.0]).relu().to_vec()[0];
        assert!(zero == 0.0 && zero.is_sign_positive());
        // A NaN anywhere in a lane makes the whole lane NaN, in softmax and layer norm alike.
        let rows = s.from_slice::<f32>(&[2, 2], &[f32::NAN, 1.0, 3.0, 1.0]);
        for y in [
            (&rows).softmax(1),
            (&rows).log_softmax(1),
            (&rows).layer_norm(1e-5),
        ] {
            let y = y.to_vec();
            assert!(y[0].is_nan() && y[1].is_nan(), "{y:?}");
            assert!(y[2].is_finite() && y[3].is_finite(), "{y:?}");
        }
    });
}
