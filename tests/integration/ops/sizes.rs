//! Element counts across every op family: a constructor given the wrong number of values, shapes
//! too large to exist next to a zero-length axis (size errors, never panics), and ops on tensors
//! with no elements, which do no work however long their other axes are.

use tensorscope::prelude::*;
use tensorscope::{Error, Shape};

use super::assert_panics_with;
use crate::common::test_pool;

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
        assert_eq!(cube.cumsum(1).shape(), &[0, N, 1]);
        assert_eq!(cube.logsumexp(1).shape(), &[0, 1]);
        assert_eq!(cube.std(1, 1).shape(), &[0, 1]);
        assert_eq!(tall.repeat(&[1, 2]).shape(), &[N, 0]);
        assert_eq!(s.zeros::<f32>(&[0, 1]).expand(&[0, N]).shape(), &[0, N]);
        assert_eq!(wide.pad(&[1, 1], 0.0).shape(), &[0, N + 2]);
        assert_eq!(tall.maximum(&s.ones::<f32>(&[1, 1])).shape(), &[N, 0]);
        assert_eq!(s.zeros::<i64>(&[0]).one_hot(N >> 4).shape(), &[0, N >> 4]);
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
