//! Element types other than `f32`: `f64` ops to `f64` precision, `f16` and `bf16` within their own
//! precision of an `f64` reference, and integer tensors (ranges, casts, shape ops) in the same pool
//! and budget as floats.

use half::{bf16, f16};
use ndarray::Axis;
use tensorscope::prelude::*;
use tensorscope::{Element, Error};

use super::{assert_close_tol, gelu_ref, layer_norm_ref, matmul_ref, softmax_ref, to_f64};
use crate::common::test_pool;

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

#[test]
fn integer_tensors_share_the_pool_and_budget() {
    let pool = test_pool(1);
    pool.scope(|s| {
        let ids = s.from_slice::<i64>(&[2, 3], &[5, 0, 2, 2, 1, 4]);
        assert_eq!(ids.len(), 6);
        assert_eq!(s.arange(0i64, 5, 1).to_vec(), vec![0, 1, 2, 3, 4]);
        assert_eq!(s.arange(5i32, 0, -2).to_vec(), vec![5, 3, 1]);
        assert_eq!(s.arange(0i64, 0, 1).len(), 0);
        assert_eq!(s.arange(3u8, 1, 1).len(), 0);
        // Integers count and step exactly, past f64's 2^53 and up to the type's end.
        let big = 1i64 << 53;
        assert_eq!(
            s.arange(big, big + 4, 1).to_vec(),
            vec![big, big + 1, big + 2, big + 3]
        );
        assert_eq!(
            s.arange(i64::MAX - 3, i64::MAX, 1).to_vec(),
            vec![i64::MAX - 3, i64::MAX - 2, i64::MAX - 1]
        );
        assert_eq!(
            s.arange(0.0f32, 1.0, 0.25).to_vec(),
            vec![0.0, 0.25, 0.5, 0.75]
        );
        assert_eq!(ids.narrow(1, 1, 2).to_vec(), vec![0, 2, 1, 4]);
        assert_eq!(ids.t().to_vec(), vec![5, 2, 0, 1, 2, 4]);
        assert_eq!(
            ids.cast::<f32>().to_vec(),
            vec![5.0, 0.0, 2.0, 2.0, 1.0, 4.0]
        );
        assert_eq!(
            s.from_slice::<f32>(&[4], &[-1.7, 2.9, f32::NAN, 1e30])
                .cast::<i32>()
                .to_vec(),
            vec![-1, 2, 0, i32::MAX]
        );
        // An integer rent past the budget fails like a float one.
        let err = s.try_zeros::<i64>(&[1 << 18]).unwrap_err();
        assert!(matches!(err, Error::BudgetExceeded { .. }), "{err}");
        assert!(pool.stats().bytes_in_use > 0);
    });
    assert_eq!(pool.stats().bytes_in_use, 0);
    let err = test_pool(1).scope(|s| s.try_arange(0i64, 3, 0).unwrap_err());
    assert_eq!(
        err.to_string(),
        "arange: invalid step: from 0 to 3 by 0 is not a finite range"
    );
}
