//! Elementwise functions of one tensor (the activations, `exp`, `log`, `sqrt`, `pow`, `abs`,
//! `sin`, `cos`, `clamp`, `gelu_erf`, `map`) in their borrowed, shared and unique forms, against `f64`: their
//! saturation at large magnitudes, NaN propagated as PyTorch does, and their errors. The binary ones
//! are in `arithmetic`; the kernels' accuracy over whole ranges in `kernels`.

use ndarray::Array1;
use tensorscope::prelude::*;
use tensorscope::Error;

use super::{assert_close, assert_close_tol, gelu_ref, sigmoid_ref, to_f64};
use crate::common::{panic_message, test_pool};

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
fn sin_and_cos_match_f64_in_every_form() {
    let pool = test_pool(16);
    pool.scope(|s| {
        check_unary!(s, "sin", |t| t.sin(), f64::sin);
        check_unary!(s, "cos", |t| t.cos(), f64::cos);
    });
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
fn elementwise_functions_match_f64() {
    test_pool(16).scope(|s| {
        let v = [-3.0f32, -0.5, 0.0, 0.25, 2.0, 9.0];
        let x = s.from_slice::<f32>(&[6], &v);
        let xa = to_f64(&x);
        // Within 1e-6 relative, with a floor of 1e-6.
        let close = |what: &str, got: &Tensor<'_, f32>, f: fn(f64) -> f64| {
            assert_close_tol(what, got, &xa.mapv(f), 1e-6, 1e-6);
        };
        close("log", &(&x).log(), f64::ln);
        close("sqrt", &(&x).sqrt(), f64::sqrt);
        close("abs", &(&x).abs(), f64::abs);
        close("pow", &(&x).pow(3.0), |x| x.powi(3));
        close("clamp", &(&x).clamp(-1.0, 1.0), |x| x.clamp(-1.0, 1.0));
        // Exact GELU against values from PyTorch's F.gelu (float64).
        let want = [
            -0.004_049_694_094_890_31,
            -0.154_268_769_362_993_44,
            0.0,
            0.149_676_581_420_730_93,
            1.954_499_736_103_641_6,
            9.0,
        ];
        assert_close_tol(
            "gelu_erf",
            &(&x).gelu_erf(),
            &Array1::from(want.to_vec()),
            0.0,
            1e-6,
        );
        let nan = s
            .from_slice::<f32>(&[1], &[f32::NAN])
            .clamp(0.0, 1.0)
            .item();
        assert!(nan.is_nan(), "clamp keeps NaN");
        // Every elementwise function has a `try_` form that reports an exhausted budget.
        let tight = Pool::with_max_memory_mb(1);
        tight.scope(|t| {
            let big = t.zeros::<f32>(&[200_000]);
            let err = (&big).try_sqrt().unwrap_err();
            assert!(matches!(err, Error::BudgetExceeded { .. }), "{err}");
            assert!((&big).try_gelu_erf().is_err() && (&big).try_pow(2.0).is_err());
            assert!(big.try_log().is_ok(), "in place: nothing to rent");
        });
        assert_eq!(
            panic_message(|| drop((&x).clamp(1.0, 0.0))),
            "clamp: invalid bounds: min 1 is not at most max 0"
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
