//! Matrix products: 2-D, batched and broadcast over leading axes as PyTorch does, against
//! ndarray's `dot`; outputs fully written over stale pool contents; and operands whose inner
//! dimensions, batch axes or ranks do not fit, as errors and as panics.

use ndarray::{ArrayD, IxDyn};
use tensorscope::{bf16, f16, Element, Scope};

use super::{assert_close, assert_close_tol, assert_panics_with, matmul_ref, shape_mismatch};
use crate::common::{assert_fully_written, test_pool};

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
fn matmul_broadcasts_leading_axes_as_pytorch() {
    test_pool(16).scope(|s| {
        let a = s.randn::<f32>(&[2, 1, 3, 4], 1);
        let b = s.randn::<f32>(&[3, 4, 5], 2);
        let c = a.matmul(&b);
        assert_fully_written("matmul", &c);
        assert_eq!(c.shape(), &[2, 3, 3, 5]);
        // Each output matrix is the 2-D product of the matrices it broadcasts from.
        for i in 0..2 {
            for h in 0..3 {
                let ai = a.narrow(0, i, 1).reshape(&[3, 4]);
                let bh = b.narrow(0, h, 1).reshape(&[4, 5]);
                let want = ai.matmul(&bh).to_vec();
                let got = c.narrow(0, i, 1).narrow(1, h, 1).to_vec();
                assert_eq!(got, want, "matrix ({i}, {h})");
            }
        }
        let err = s.zeros::<f32>(&[2, 3, 4]).try_matmul(&b).unwrap_err();
        assert_eq!(
            err.to_string(),
            "matmul: incompatible shapes [2, 3, 4] and [3, 4, 5]: batch axes [2] and [3] do not \
             broadcast"
        );
        let err = a.try_matmul(&s.zeros::<f32>(&[4])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "matmul: incompatible shapes [2, 1, 3, 4] and [4]: operands need rank 2 or more, got \
             ranks 4 and 1"
        );
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

/// `[.., m, 0] x [.., 0, n]` of `T`: zeros of `[.., m, n]` over stale (NaN) pool contents, 2-D,
/// batched and broadcast, and gradients that are empty tensors of the operands' shapes.
fn check_empty_inner_dimension<T: Element>() {
    let pool = test_pool(16);
    let nan = T::from_f64(f64::NAN);
    pool.train(|s| {
        for (a_shape, b_shape, out) in [
            (&[2, 0][..], &[0, 3][..], &[2, 3][..]),
            (&[2, 2, 0], &[2, 0, 3], &[2, 2, 3]),
            (&[2, 2, 0], &[0, 3], &[2, 2, 3]),
            (&[1, 2, 0], &[2, 0, 3], &[2, 2, 3]),
        ] {
            let what = format!("{} {a_shape:?} x {b_shape:?}", std::any::type_name::<T>());
            drop(s.full::<T>(out, nan));
            let a = s.from_slice::<T>(a_shape, &[]).requires_grad();
            let b = s.from_slice::<T>(b_shape, &[]).requires_grad();
            let y = a.try_matmul(&b).unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(y.shape(), out, "{what}");
            assert!(y.to_vec().iter().all(|&v| v == T::zero()), "{what}");
            let grads = y.sum_all().backward().unwrap();
            for x in [&a, &b] {
                let g = grads.of(x).unwrap();
                assert_eq!(g.shape(), x.shape(), "{what}: gradient");
            }
        }
    });
}

#[test]
fn matmul_with_an_empty_inner_dimension_gives_zeros_in_every_element_type() {
    check_empty_inner_dimension::<f32>();
    check_empty_inner_dimension::<f64>();
    check_empty_inner_dimension::<f16>();
    check_empty_inner_dimension::<bf16>();
}

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

        assert_matmul_refused(
            s,
            (&[2, 3, 4], &[2, 5, 6]),
            "inner dimensions differ (4 and 5)",
        );
    });
}

#[test]
fn matmul_batch_axes_that_do_not_broadcast_name_both_shapes() {
    test_pool(16).scope(|s| {
        let reason = "batch axes [2] and [3] do not broadcast";
        assert_matmul_refused(s, (&[2, 3, 4], &[3, 4, 5]), reason);
    });
}

/// `a.matmul(&b)` of zeros of these shapes fails with a shape mismatch naming both and `reason`,
/// and the panicking form panics with its message.
fn assert_matmul_refused(s: &Scope<'_, '_>, (a, b): (&[usize], &[usize]), reason: &str) {
    let (x, y) = (s.zeros::<f32>(a), s.zeros::<f32>(b));
    let err = x.try_matmul(&y).unwrap_err();
    assert_eq!(err, shape_mismatch("matmul", a, b, reason));
    assert_panics_with(&err, || drop(x.matmul(&y)));
}

#[test]
fn matmul_rejects_rank_1_operands_and_takes_a_rank_2_left_over_a_batch() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let reason = "operands need rank 2 or more, got ranks 1 and 2";
        assert_matmul_refused(s, (&[3], &[3, 2]), reason);
        let reason = "operands need rank 2 or more, got ranks 2 and 1";
        assert_matmul_refused(s, (&[2, 3], &[3]), reason);
        // A matrix times a batch of matrices broadcasts the left one, as in PyTorch.
        let b3 = s.ones::<f32>(&[2, 3, 4]);
        let ones = s.ones::<f32>(&[2, 3]);
        assert_eq!(ones.matmul(&b3).shape(), &[2, 2, 4]);
        assert_eq!(ones.matmul(&b3).to_vec(), vec![3.0; 16]);
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
