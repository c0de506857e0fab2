//! Reductions: sum and mean along an axis (kept or not, negative axes) or over everything, max
//! and min with their positions (NaN wins, the first of equal values), against ndarray and
//! hand-computed values; and bad or empty axes.

use ndarray::Axis;
use tensorscope::prelude::*;

use super::{assert_close, assert_panics_with, axis_out_of_range, iota};
use crate::common::test_pool;

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
fn reductions_keep_axes_and_take_negative_axes() {
    test_pool(16).scope(|s| {
        let x = iota(s, &[2, 3]);
        assert_eq!(x.sum(-1).to_vec(), vec![3.0, 12.0]);
        assert_eq!(x.sum_keepdim(-1).shape(), &[2, 1]);
        assert_eq!(x.mean_keepdim(0).to_vec(), vec![1.5, 2.5, 3.5]);
        assert_eq!(x.sum_all().shape(), &[] as &[usize]);
        assert_eq!(x.sum_all().item(), 15.0);
        assert_eq!(x.mean_all().item(), 2.5);
        assert_eq!((&x).softmax(-1).to_vec(), (&x).softmax(1).to_vec());
        assert_eq!(Tensor::concat(&[&x, &x], -2).shape(), &[4, 3]);
        let err = x.try_sum(-3).unwrap_err();
        assert_eq!(
            err.to_string(),
            "sum: axis -3 is out of range for a tensor of rank 2"
        );
        assert_eq!(err, axis_out_of_range("sum", -3, 2));
        let err = x.try_unsqueeze(3).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unsqueeze: axis 3 is out of range for a tensor of rank 3"
        );
    });
}

#[test]
fn sum_and_mean_along_a_bad_axis_report_axis_out_of_range() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.zeros::<f32>(&[2, 3, 4]);
        let err = x.try_sum(3).unwrap_err();
        assert_eq!(err, axis_out_of_range("sum", 3, 3));
        assert_panics_with(&err, || drop(x.sum(3)));

        let err = x.try_mean(3).unwrap_err();
        assert_eq!(err, axis_out_of_range("mean", 3, 3));
        assert_panics_with(&err, || drop(x.mean(3)));
    });
}

#[test]
fn max_min_and_their_positions() {
    test_pool(16).scope(|s| {
        let x = s.from_slice::<f32>(&[2, 4], &[1.0, 7.0, 7.0, -2.0, f32::NAN, 3.0, -5.0, 0.0]);
        assert_eq!(x.argmax(1).to_vec(), vec![1, 0]); // the first of equal maxima; NaN wins
        assert_eq!(x.argmin(-1).to_vec(), vec![3, 0]);
        assert_eq!(x.argmax(0).to_vec(), vec![1, 0, 0, 1]);
        let m = x.max(1).to_vec();
        assert_eq!(m[0], 7.0);
        assert!(m[1].is_nan());
        assert_eq!(x.min_keepdim(0).shape(), &[1, 4]);
        assert_eq!(x.min_keepdim(0).to_vec()[1..], [3.0, -5.0, -2.0]);
        let ids = s.from_slice::<i64>(&[3], &[4, 9, 2]);
        assert_eq!(ids.argmax(0).item(), 1);
        let err = s.zeros::<f32>(&[3, 0]).try_argmax(1).unwrap_err();
        assert_eq!(
            err.to_string(),
            "argmax: invalid shape [3, 0]: axis 1 is empty: it has no max position"
        );
        assert_eq!(s.zeros::<f32>(&[0, 3]).argmax(1).shape(), &[0]);
        let err = s.zeros::<f32>(&[3, 0]).try_max(-1).unwrap_err();
        assert_eq!(
            err.to_string(),
            "max: invalid shape [3, 0]: axis 1 is empty: it has no max position"
        );
    });
}
