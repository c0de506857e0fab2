//! Lane ops, over the 1-D runs of a tensor along one axis: softmax and log-softmax (along any
//! axis, large values, `-inf`, lanes of length 1), layer and RMS norm over the last axis (lanes of
//! equal values too), and custom kernels through `map_lanes`, against per-lane `f64` references; and
//! their bad axes and shapes.

use ndarray::Axis;
use tensorscope::{Error, TensorOps};

use super::{
    assert_close, assert_panics_with, axis_out_of_range, layer_norm_ref, softmax_ref, to_f64,
};
use crate::common::test_pool;

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
        assert!(y.as_slice().unwrap().iter().all(|v| v.is_finite()), "{y:?}");
        assert_close("softmax of 1000s", &y, &softmax_ref(&xa, 1, false));
        let l = (&x).log_softmax(1);
        assert!(l.as_slice().unwrap().iter().all(|v| v.is_finite()), "{l:?}");
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
fn softmax_gives_zero_probability_to_negative_infinity() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let data = [f32::NEG_INFINITY, 0.0, 1.0, 2.0, f32::NEG_INFINITY, -1.0];
        let x = s.from_slice::<f32>(&[2, 3], &data);
        let xa = to_f64(&x);
        let y = (&x).softmax(1);
        assert_close("softmax with -inf", &y, &softmax_ref(&xa, 1, false));
        assert_eq!(y.as_slice().unwrap()[0], 0.0);
        assert_eq!(y.as_slice().unwrap()[4], 0.0);
        let l = (&x).log_softmax(1);
        assert_close("log_softmax with -inf", &l, &softmax_ref(&xa, 1, true));
        assert_eq!(l.as_slice().unwrap()[0], f32::NEG_INFINITY);
    });
}

#[test]
fn softmax_and_log_softmax_along_a_bad_axis_report_axis_out_of_range() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.zeros::<f32>(&[2, 3, 4]);
        let err = (&x).try_softmax(3).unwrap_err();
        assert_eq!(err, axis_out_of_range("softmax", 3, 3));
        assert_eq!(
            err.to_string(),
            "softmax: axis 3 is out of range for a tensor of rank 3"
        );
        assert_panics_with(&err, || drop((&x).softmax(3)));
        assert_eq!(x.clone().try_softmax(3).unwrap_err(), err);

        let err = (&x).try_log_softmax(3).unwrap_err();
        assert_eq!(err, axis_out_of_range("log_softmax", 3, 3));
        assert_panics_with(&err, || drop(x.clone().log_softmax(3)));
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

fn assert_zeros<T: Into<f64> + Copy>(what: &str, y: &[T]) {
    let nonzero: Vec<f64> = y.iter().map(|&v| v.into()).filter(|&v| v != 0.0).collect();
    assert!(
        nonzero.is_empty(),
        "{what}: {} of {} not 0, as {}",
        nonzero.len(),
        y.len(),
        nonzero[0]
    );
}

#[test]
fn layer_norm_and_group_norm_of_equal_values_are_zero() {
    let pool = test_pool(16);
    pool.scope(|s| {
        // Lanes whose mean, summed and divided in f32, is not the value itself: the values minus
        // such a mean are a unit in the last place, which eps = 1e-5 does not hide (0.987 and
        // -0.995 before the values were centred on a lane's own element).
        for (len, value) in [(1000, 33333.3f32), (9, 410184.03), (7, -1e30), (16, 0.1)] {
            let x = s.full::<f32>(&[2, len], value);
            assert_zeros(&format!("{len} x {value}"), &x.layer_norm(1e-5).to_vec());
        }
        let x = s.full::<f64>(&[1000], 33333.3);
        assert_zeros("f64", &x.layer_norm(1e-5).to_vec());
        let x = s.full::<f32>(&[2, 4, 3, 3], 410184.03);
        assert_zeros("group norm", &x.group_norm(2, 1e-5).to_vec());
    });
}

#[test]
fn rms_norm_divides_each_lane_by_its_root_mean_square() {
    test_pool(16).scope(|s| {
        let rms = s
            .from_slice::<f32>(&[2, 2], &[3.0, 4.0, 1.0, 1.0])
            .rms_norm(0.0)
            .to_vec();
        let r = (12.5f32).sqrt();
        assert_eq!(rms, vec![3.0 / r, 4.0 / r, 1.0, 1.0]);
    });
}

#[test]
fn rms_norm_of_a_rank_0_tensor_is_an_invalid_shape() {
    test_pool(16).scope(|s| {
        let x = s.from_slice::<f32>(&[], &[2.0]);
        let err = (&x).try_rms_norm(1e-5).unwrap_err();
        assert!(
            matches!(err, Error::InvalidShape { op: "rms_norm", ref shape, .. } if shape.0.is_empty()),
            "{err}"
        );
        assert_panics_with(&err, || drop(x.rms_norm(1e-5)));
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
        let ptr = x.as_slice().unwrap().as_ptr();
        let by_value = x.map_lanes(1, cumsum);
        assert_eq!(
            by_value.as_slice().unwrap().as_ptr(),
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
        assert_eq!(err, axis_out_of_range("map_lanes", 2, 2));
    });
}
