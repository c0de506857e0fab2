//! Mixed-precision products: under `autocast(Products::Bf16, ..)` a product of `f32` tensors is
//! the `f32` product of its operands rounded to bf16 (summed in `f32`, so equal up to the order of
//! the sums), its backward computes the same way wherever it runs, and other element types are
//! left alone.

use tensorscope::ops::{autocast, Products};
use tensorscope::prelude::*;

use crate::common::test_pool;

/// `x` rounded to bf16 and back: the operand a bf16 product reads.
fn rounded<'s>(x: &Tensor<'s>) -> Tensor<'s> {
    x.cast::<half::bf16>().cast::<f32>()
}

/// Asserts `got` is `want` up to the rounding of `f32` sums of `k` terms: each entry within
/// `k * 2^-23` of the sum of the terms' magnitudes (`scale`, `|a| |b|`'s entry).
fn assert_close(got: &Tensor<'_>, want: &Tensor<'_>, scale: &Tensor<'_>, k: usize, what: &str) {
    let bound = k as f32 * f32::EPSILON;
    for ((g, w), s) in got.to_vec().iter().zip(want.to_vec()).zip(scale.to_vec()) {
        assert!(
            (g - w).abs() <= bound * s + f32::MIN_POSITIVE,
            "{what}: {g} against {w} (terms' magnitudes {s})"
        );
    }
}

#[test]
fn a_bf16_product_is_the_f32_product_of_the_rounded_operands() {
    test_pool(16).scope(|s| {
        // Odd sizes, a transposed view, a batch broadcast against one matrix.
        let a = s.randn::<f32>(&[3, 37, 70], 1);
        let b = s.randn::<f32>(&[29, 70], 2).t();
        let mixed = autocast(Products::Bf16, || a.matmul(&b));
        let want = rounded(&a).matmul(&rounded(&b));
        let scale = rounded(&a).abs().matmul(&rounded(&b).abs());
        assert_close(&mixed, &want, &scale, 70, "[3, 37, 70] x [70, 29]^T");
        // The operands were rounded: the exact product differs.
        let exact = a.matmul(&b);
        let apart = (&exact - &mixed)
            .abs()
            .to_vec()
            .into_iter()
            .fold(0.0, f32::max);
        assert!(apart > 1e-3, "the f32 product differs by {apart} only");
        // Outside the closure, products are f32 again.
        assert_eq!(a.matmul(&b).to_vec(), exact.to_vec());
        // Other element types multiply in their own.
        let (a64, b64) = (a.cast::<f64>(), b.cast::<f64>());
        let mixed64 = autocast(Products::Bf16, || a64.matmul(&b64));
        assert_eq!(mixed64.to_vec(), a64.matmul(&b64).to_vec());
    });
}

#[test]
fn a_product_made_under_autocast_differentiates_in_bf16_outside_it() {
    let pool = test_pool(16);
    pool.train(|s| {
        let a = s.randn::<f32>(&[19, 45], 3).requires_grad();
        let b = s.randn::<f32>(&[45, 23], 4).requires_grad();
        let c = s.randn::<f32>(&[19, 23], 5);
        let y = autocast(Products::Bf16, || a.matmul(&b));
        // The backward runs outside the closure.
        let grads = (&y * &c).sum_all().backward().unwrap();
        // d a = c b^T and d b = a^T c, their operands rounded too.
        let (ra, rb, rc) = (rounded(&a), rounded(&b), rounded(&c));
        let da_want = rc.matmul(&rb.t());
        let da_scale = (&rc).abs().matmul(&(&rb).abs().t());
        assert_close(grads.of(&a).unwrap(), &da_want, &da_scale, 23, "d a");
        let db_want = ra.t().matmul(&rc);
        let db_scale = (&ra).abs().t().matmul(&(&rc).abs());
        assert_close(grads.of(&b).unwrap(), &db_want, &db_scale, 19, "d b");
    });
}
