//! `sort`, `argsort` and `topk`: values, positions and gradients against PyTorch
//! (`scripts/sort_fixture.py`), the order of ties and NaN, integers, gradients against finite
//! differences, a checkpointed replay, and the errors.

use tensorscope::prelude::*;
use tensorscope::Error;

use super::checks::{assert_checkpoint_replays_exactly, Fixture};
use super::{assert_panics_with, axis_out_of_range};
use crate::autograd::check;
use crate::common::test_pool;

/// The fixture's sort (`k` = -1) or topk (`k` values) along `axis`, descending or largest if
/// `flag` is 1.
fn run<'s>(
    x: &Tensor<'s, f64>,
    axis: i64,
    k: i64,
    flag: i64,
) -> (Tensor<'s, f64>, Tensor<'s, i64>) {
    match k {
        -1 => x.sort(axis, flag == 1),
        k => x.topk(k as usize, axis, flag == 1),
    }
}

#[test]
fn sort_and_topk_match_pytorch() {
    let fixture = Fixture::open("sort");
    for prefix in [
        "sort_rows",
        "sort_columns_descending",
        "topk_largest",
        "topk_smallest",
    ] {
        let [axis, k, flag] = fixture.values::<i64>(&format!("{prefix}.args"))[..]
            .try_into()
            .expect("three arguments");
        fixture.check(prefix, &["x"], |x| run(&x[0], axis, k, flag).0);
        let want = fixture.values::<i64>(&format!("{prefix}.indices"));
        test_pool(16).scope(|s| {
            let x = s.bind(&fixture.param::<f64>(&format!("{prefix}.x")));
            assert_eq!(
                run(&x, axis, k, flag).1.to_vec(),
                want,
                "{prefix}: positions"
            );
            if k == -1 {
                assert_eq!(
                    x.argsort(axis, flag == 1).to_vec(),
                    want,
                    "{prefix}: argsort"
                );
            }
        });
    }
}

#[test]
fn ties_keep_their_order_and_nan_is_the_largest_in_either_direction() {
    test_pool(16).scope(|s| {
        let nan = f32::NAN;
        let x = s.from_slice::<f32>(&[6], &[1.0, nan, 0.0, 1.0, nan, -0.0]);
        assert_eq!(x.argsort(0, false).to_vec(), vec![2, 5, 0, 3, 1, 4]);
        assert_eq!(x.argsort(0, true).to_vec(), vec![1, 4, 0, 3, 2, 5]);
        assert_eq!(x.topk(3, 0, true).1.to_vec(), vec![1, 4, 0]);
        assert_eq!(x.topk(3, 0, false).1.to_vec(), vec![2, 5, 0]);
        // Integers sort too, along any axis.
        let ids = s.from_slice::<i64>(&[2, 3], &[5, -1, 5, 0, 7, 0]);
        let (values, positions) = ids.sort(0, true);
        assert_eq!(values.to_vec(), vec![5, 7, 5, 0, -1, 0]);
        assert_eq!(positions.to_vec(), vec![0, 1, 0, 1, 0, 1]);
        // k = the length is the sort; k = 0 is empty.
        let x = s.randn::<f32>(&[3, 5], 1);
        assert_eq!(x.topk(5, 1, false).0.to_vec(), x.sort(1, false).0.to_vec());
        assert_eq!(x.topk(0, 1, true).0.shape(), &[3, 0]);
        assert_eq!(s.zeros::<f32>(&[0, 4]).sort(0, false).1.shape(), &[0, 4]);
    });
}

#[test]
fn gradients_match_finite_differences() {
    check("sort", &[&[4, 3]], |x| Ok(x[0].try_sort(0, false)?.0));
    check("sort descending", &[&[2, 5]], |x| {
        Ok(x[0].try_sort(-1, true)?.0)
    });
    check("topk", &[&[3, 6]], |x| Ok(x[0].try_topk(2, 1, true)?.0));
    check("topk smallest", &[&[5, 2]], |x| {
        Ok(x[0].try_topk(3, 0, false)?.0)
    });
}

#[test]
fn checkpointed_sorts_replay_bit_for_bit() {
    assert_checkpoint_replays_exactly(
        &[4, 6],
        &[6, 6],
        // Sorted rows, then the 3 largest and the 3 smallest of each row, in turn.
        |i, x, w| match x.matmul(w).tanh() {
            h if i % 2 == 0 => h.sort(1, i % 4 == 0).0,
            h => Tensor::concat(&[&h.topk(3, 1, true).0, &h.topk(3, 1, false).0], 1),
        },
        || (),
    );
}

#[test]
fn a_bad_k_or_axis_is_a_typed_error() {
    test_pool(16).scope(|s| {
        let x = s.zeros::<f32>(&[2, 3]);
        let err = x.try_topk(4, 1, true).unwrap_err();
        assert_eq!(
            err,
            Error::InvalidArgument {
                op: "topk",
                arg: "k",
                reason: "4 is larger than axis 1 of length 3".into()
            }
        );
        assert_eq!(
            err.to_string(),
            "topk: invalid k: 4 is larger than axis 1 of length 3"
        );
        assert_panics_with(&err, || drop(x.topk(4, -1, true)));
        assert_eq!(
            x.try_sort(2, false).unwrap_err(),
            axis_out_of_range("sort", 2, 2)
        );
        assert_eq!(
            x.try_argsort(-3, true).unwrap_err(),
            axis_out_of_range("argsort", -3, 2)
        );
    });
}
