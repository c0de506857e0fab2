//! Image ops on `[batch, channels, height, width]` tensors against naive reference loops:
//! convolution (strides, padding, non-square kernels), group normalization, nearest upsampling, max
//! and average pooling; and their errors, with outputs that would be too large to address.

use ndarray::{ArrayD, IxDyn};
use tensorscope::Error;

use super::{assert_close_tol, iota};
use crate::common::{assert_fully_written, test_pool};

/// `x` (of shape `xs`) convolved with the kernels `w` (of shape `ws`), zero-padded by `pad`, by
/// the definition: one sum of products per output element.
fn conv_ref(
    x: &[f64],
    xs: [usize; 4],
    w: &[f64],
    ws: [usize; 4],
    stride: usize,
    pad: usize,
) -> ArrayD<f64> {
    let [n, ci, h, wd] = xs;
    let [co, _, kh, kw] = ws;
    let ho = (h + 2 * pad - kh) / stride + 1;
    let wo = (wd + 2 * pad - kw) / stride + 1;
    let mut out = vec![0.0; n * co * ho * wo];
    for b in 0..n {
        for o in 0..co {
            for oy in 0..ho {
                for ox in 0..wo {
                    let mut acc = 0.0;
                    for c in 0..ci {
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let iy = (oy * stride + ky) as isize - pad as isize;
                                let ix = (ox * stride + kx) as isize - pad as isize;
                                if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < wd {
                                    acc += x[((b * ci + c) * h + iy as usize) * wd + ix as usize]
                                        * w[((o * ci + c) * kh + ky) * kw + kx];
                                }
                            }
                        }
                    }
                    out[((b * co + o) * ho + oy) * wo + ox] = acc;
                }
            }
        }
    }
    ArrayD::from_shape_vec(IxDyn(&[n, co, ho, wo]), out).unwrap()
}

/// The tolerance of `f64` image ops against the loops above, relative with an absolute floor.
const TOL: f64 = 1e-12;

#[test]
fn conv2d_matches_the_naive_loops() {
    test_pool(64).scope(|s| {
        for (xs, ws, stride, pad) in [
            ([2, 3, 7, 6], [4, 3, 3, 3], 1, 1),
            ([1, 2, 8, 8], [3, 2, 3, 2], 2, 0),
            ([2, 1, 5, 5], [2, 1, 1, 1], 1, 0),
            ([1, 4, 6, 5], [5, 4, 3, 3], 2, 1),
        ] {
            let x = s.randn::<f64>(&xs, 1);
            let w = s.randn::<f64>(&ws, 2);
            let y = x.conv2d(&w, stride, pad);
            let want = conv_ref(
                x.as_slice().unwrap(),
                xs,
                w.as_slice().unwrap(),
                ws,
                stride,
                pad,
            );
            let what = format!("{xs:?} * {ws:?}, stride {stride}, padding {pad}");
            assert_close_tol(&what, &y, &want, TOL, TOL);
        }
    });
}

#[test]
fn group_norm_and_upsample_match_the_naive_loops() {
    test_pool(64).scope(|s| {
        let x = s.randn::<f64>(&[2, 6, 3, 4], 3);
        let y = x.group_norm(3, 1e-5);
        let per_group = 2 * 3 * 4;
        let mut want = Vec::new();
        for group in x.as_slice().unwrap().chunks(per_group) {
            let mean = group.iter().sum::<f64>() / per_group as f64;
            let var = group.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / per_group as f64;
            want.extend(group.iter().map(|v| (v - mean) / (var + 1e-5).sqrt()));
        }
        let want = ArrayD::from_shape_vec(IxDyn(x.shape()), want).unwrap();
        assert_close_tol("group_norm", &y, &want, TOL, TOL);

        let small = s.from_slice::<f64>(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let up = small.upsample_nearest2d(2);
        assert_eq!(up.shape(), &[1, 1, 4, 4]);
        assert_eq!(
            up.to_vec(),
            vec![1., 1., 2., 2., 1., 1., 2., 2., 3., 3., 4., 4., 3., 3., 4., 4.]
        );
    });
}

#[test]
fn image_ops_name_bad_shapes() {
    test_pool(64).scope(|s| {
        let x = s.zeros::<f32>(&[1, 3, 4, 4]);
        let err = x
            .try_conv2d(&s.zeros::<f32>(&[2, 4, 3, 3]), 1, 0)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "conv2d: incompatible shapes [1, 3, 4, 4] and [2, 4, 3, 3]: input channels differ (3 and 4)"
        );
        let err = x
            .try_conv2d(&s.zeros::<f32>(&[2, 3, 5, 5]), 1, 0)
            .unwrap_err();
        assert!(err
            .to_string()
            .ends_with("a 5x5 kernel does not fit a 4x4 padded image"));
        assert!(matches!(
            x.try_conv2d(&s.zeros::<f32>(&[2, 3, 3, 3]), 0, 0),
            Err(Error::ShapeMismatch { .. })
        ));
        assert!(matches!(
            s.zeros::<f32>(&[3, 4]).try_conv2d(&x, 1, 0),
            Err(Error::InvalidShape { op: "conv2d", .. })
        ));
        assert_eq!(
            x.try_group_norm(2, 1e-5).unwrap_err().to_string(),
            "group_norm: invalid shape [1, 3, 4, 4]: 2 groups do not divide 3 channels"
        );
        assert!(x.try_upsample_nearest2d(0).is_err());
    });
}

#[test]
fn conv2d_with_no_input_channels_or_an_empty_image_is_zeros_not_stale_data() {
    // A plain pool: the output gets the buffer a tensor of 42s just gave back.
    let pool = tensorscope::Pool::with_max_memory_mb(8);
    pool.scope(|s| {
        let cases: [([usize; 4], [usize; 4], [usize; 4]); 2] = [
            ([1, 0, 3, 3], [2, 0, 3, 3], [1, 2, 3, 3]), // no input channels
            ([1, 1, 0, 0], [2, 1, 1, 1], [1, 2, 2, 2]), // no pixels, only padding
        ];
        for (input, weight, out_shape) in cases {
            let x = s.zeros::<f32>(&input);
            let w = s.ones::<f32>(&weight);
            let len: usize = out_shape.iter().product();
            drop(s.full::<f32>(&[len], 42.0));
            let y = x.conv2d(&w, 1, 1);
            assert_eq!(y.shape(), out_shape);
            assert_eq!(y.to_vec(), vec![0.0; len], "input {input:?}");
        }
    });
}

#[test]
fn huge_padding_or_scale_is_a_dimension_overflow_naming_the_operand() {
    test_pool(8).scope(|s| {
        let x = s.ones::<f32>(&[1, 1, 2, 2]);
        let w = s.ones::<f32>(&[1, 1, 1, 1]);
        let overflow = |op, operand, value| Error::DimensionOverflow {
            op,
            operand,
            value,
            shape: tensorscope::Shape(vec![1, 1, 2, 2]),
        };
        // 2 * padding overflows usize.
        let pad = (1usize << 63) - 1;
        let err = x.try_conv2d(&w, 1, pad).unwrap_err();
        assert_eq!(err, overflow("conv2d", "padding", pad));
        assert_eq!(
            err.to_string(),
            "conv2d: padding 9223372036854775807 on an input of shape [1, 1, 2, 2] gives an \
             output too large to address"
        );
        // The padded size fits, the 2^82-element output does not.
        let err = x.try_conv2d(&w, 1, 1 << 40).unwrap_err();
        assert_eq!(err, overflow("conv2d", "padding", 1 << 40));
        // 2 * scale overflows usize; then 2^63 x 2^63 pixels do not fit.
        for scale in [(1usize << 63) + 1, 1 << 62] {
            let err = x.try_upsample_nearest2d(scale).unwrap_err();
            assert_eq!(err, overflow("upsample_nearest2d", "scale", scale));
        }
    });
}

#[test]
fn pooling_takes_each_windows_max_or_mean() {
    test_pool(16).scope(|s| {
        let x = iota(s, &[1, 1, 4, 5]);
        let m = x.max_pool2d(2, 2);
        assert_fully_written("max_pool2d", &m);
        assert_eq!(m.shape(), &[1, 1, 2, 2]);
        assert_eq!(m.to_vec(), [6.0, 8.0, 16.0, 18.0]);
        assert_eq!(x.avg_pool2d(2, 2).to_vec(), [3.0, 5.0, 13.0, 15.0]);
        assert_eq!(x.max_pool2d(3, 1).shape(), &[1, 1, 2, 3]);
        let err = x.try_max_pool2d(5, 1).unwrap_err();
        assert_eq!(
            err.to_string(),
            "max_pool2d: invalid kernel: 5 is larger than the image side 4"
        );
        let err = x.try_avg_pool2d(2, 0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "avg_pool2d: invalid stride: must be at least 1"
        );
        let err = iota(s, &[4, 5]).try_max_pool2d(2, 2).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("max_pool2d: invalid shape [4, 5]"),
            "{err}"
        );
    });
}
