//! Convolution with stride, padding, dilation and groups, 2-D and 1-D: values and gradients against
//! PyTorch (`scripts/conv_fixture.py`), gradients against finite differences, a checkpointed replay,
//! and the errors naming the option at fault.

use tensorscope::ops::ConvOptions;
use tensorscope::prelude::*;
use tensorscope::{Error, Result, Shape};

use super::checks::{assert_checkpoint_replays_exactly, Fixture};
use crate::autograd::check;
use crate::common::test_pool;

/// The options of the fixture's case `prefix`.
fn options(fixture: &Fixture, prefix: &str) -> ConvOptions {
    let [stride, padding, dilation, groups] =
        fixture.values::<i64>(&format!("{prefix}.options"))[..]
            .try_into()
            .expect("four options");
    ConvOptions {
        stride: stride as usize,
        padding: padding as usize,
        dilation: dilation as usize,
        groups: groups as usize,
    }
}

/// The options of `padding`, `dilation` and `groups`, stride 1.
fn opts(padding: usize, dilation: usize, groups: usize) -> ConvOptions {
    ConvOptions {
        padding,
        dilation,
        groups,
        ..ConvOptions::default()
    }
}

#[test]
fn conv1d_and_conv2d_with_every_option_match_pytorch() {
    let fixture = Fixture::open("conv");
    for case in 0..4 {
        let prefix = format!("case{case}");
        let options = options(&fixture, &prefix);
        let two_d = fixture.param::<f64>(&format!("{prefix}.x")).shape().len() == 4;
        fixture.check(&prefix, &["x", "w"], |x| match two_d {
            true => x[0].conv2d_with(&x[1], options),
            false => x[0].conv1d(&x[1], options),
        });
    }
}

#[test]
fn gradients_match_finite_differences_in_every_configuration() {
    for options in [
        opts(0, 1, 2),
        opts(1, 2, 1),
        ConvOptions {
            stride: 2,
            ..opts(2, 2, 4)
        },
    ] {
        check(
            "conv2d",
            &[&[2, 4, 5, 5], &[4, 4 / options.groups, 2, 3]],
            |x| x[0].try_conv2d_with(&x[1], options),
        );
        check("conv1d", &[&[2, 4, 7], &[8, 4 / options.groups, 3]], |x| {
            x[0].try_conv1d(&x[1], options)
        });
    }
    // A 1x1 kernel: pointwise without padding (its patches are the image itself), and padded
    // beyond its reach (its input gradient is not a convolution of the output's, but col2im).
    for padding in [0, 1] {
        check("conv2d 1x1", &[&[2, 4, 3, 3], &[6, 4, 1, 1]], |x| {
            x[0].try_conv2d_with(&x[1], opts(padding, 1, 1))
        });
    }
}

/// Small images are gathered several to a tile of patches (20 images of 4x4 over 64 channels
/// make tiles of 16 and a last one of 4): a batch's outputs and input gradients are each
/// image's alone, bit for bit, and its weight gradient their sum up to the sum's rounding.
#[test]
fn a_batch_of_small_images_is_each_image_alone() {
    let pool = test_pool(64);
    let draw = |shape: &[usize], seed| pool.scope(|s| s.randn::<f32>(shape, seed).detach());
    let (x, w) = (draw(&[20, 64, 4, 4], 1), draw(&[8, 64, 3, 3], 2));
    let image = 64 * 4 * 4;
    for stride in [1, 2] {
        let options = ConvOptions {
            stride,
            ..opts(1, 1, 1)
        };
        let side = 3 / stride + 1;
        // Weights of the outputs, so that each output's gradient differs.
        let r = draw(&[20, 8, side, side], 3);
        // The outputs, dx and dW of images `first..first + n`.
        let run = |first: usize, n: usize| {
            pool.train(|s| {
                let xs = s.bind(&x).narrow(0, first, n);
                let y = xs.conv2d_with(&s.bind(&w), options);
                let r = s.bind(&r).without_grad().narrow(0, first, n);
                let grads = (&y * &r).sum_all().backward().expect("backward");
                let dx = grads.get(&x).expect("dx").to_vec();
                let dx = dx[first * image..(first + n) * image].to_vec();
                (y.to_vec(), dx, grads.get(&w).expect("dW").to_vec())
            })
        };
        let (y, dx, dw) = run(0, 20);
        let (mut y_alone, mut dx_alone) = (Vec::new(), Vec::new());
        let mut dw_sum = vec![0.0; dw.len()];
        for i in 0..20 {
            let (y, dx, dw) = run(i, 1);
            y_alone.extend(y);
            dx_alone.extend(dx);
            dw_sum.iter_mut().zip(dw).for_each(|(s, d)| *s += d);
        }
        assert_eq!(y, y_alone, "stride {stride}: the outputs");
        assert_eq!(dx, dx_alone, "stride {stride}: the input gradients");
        for (k, (a, b)) in dw.iter().zip(&dw_sum).enumerate() {
            assert!(
                (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                "stride {stride}: dW[{k}] {a} against {b} summed image by image"
            );
        }
    }
}

/// Small images with no input channels (no patch rows): several share a tile, and their output
/// is the product with nothing, zeros (a random sequence of ops found this).
#[test]
fn small_images_without_input_channels_give_zeros() {
    let pool = test_pool(16);
    for stride in [1, 2] {
        let y = pool.scope(|s| {
            let x = s.ones::<f32>(&[3, 0, 3, 3]);
            let w = s.ones::<f32>(&[2, 0, 3, 3]);
            x.conv2d(&w, stride, 1).to_vec()
        });
        let side = 2 / stride + 1;
        assert_eq!(y, vec![0.0; 3 * 2 * side * side], "stride {stride}");
    }
}

#[test]
fn the_plain_form_is_the_options_form_with_stride_and_padding() {
    test_pool(16).scope(|s| {
        let x = s.randn::<f32>(&[1, 2, 6, 6], 1);
        let w = s.randn::<f32>(&[3, 2, 3, 3], 2);
        let options = ConvOptions {
            stride: 2,
            padding: 1,
            ..ConvOptions::default()
        };
        assert_eq!(
            x.conv2d(&w, 2, 1).to_vec(),
            x.conv2d_with(&w, options).to_vec()
        );
        // conv1d is conv2d on images of height 1, padded along the length only.
        let x1 = s.randn::<f32>(&[2, 2, 7], 3);
        let w1 = s.randn::<f32>(&[4, 1, 3], 4);
        let options = opts(1, 2, 2);
        let y = x1.conv1d(&w1, options);
        assert_eq!(y.shape(), &[2, 4, 5]);
        let zeros = s.zeros::<f32>(&[2, 2, 1]);
        let padded = Tensor::concat(&[&zeros, &x1, &zeros], 2);
        let want = padded
            .unsqueeze(2)
            .conv2d_with(
                &w1.unsqueeze(2),
                ConvOptions {
                    padding: 0,
                    ..options
                },
            )
            .squeeze(2);
        assert_eq!(y.to_vec(), want.to_vec());
    });
}

#[test]
fn checkpointed_convolutions_replay_bit_for_bit() {
    // Each layer keeps the input's shape: padding = dilation (k - 1) / 2.
    assert_checkpoint_replays_exactly(
        &[2, 4, 5, 5],
        &[4, 2, 3, 3],
        |_, x, w| x.conv2d_with(w, opts(2, 2, 2)).tanh(),
        || (),
    );
    assert_checkpoint_replays_exactly(
        &[2, 4, 9],
        &[4, 1, 3],
        |_, x, w| x.conv1d(w, opts(1, 1, 4)).tanh(),
        || (),
    );
}

#[test]
fn bad_groups_dilation_and_shapes_are_typed_errors() {
    test_pool(16).scope(|s| {
        let x = s.zeros::<f32>(&[1, 6, 5, 5]);
        let conv = |w: &[usize], options| x.try_conv2d_with(&s.zeros::<f32>(w), options);
        let message = |r: Result<Tensor<'_>>| r.unwrap_err().to_string();
        let err = conv(&[4, 1, 3, 3], opts(0, 1, 4)).unwrap_err();
        assert_eq!(
            err,
            Error::InvalidArgument {
                op: "conv2d",
                arg: "groups",
                reason: "4 groups do not divide 6 input channels".into()
            }
        );
        assert_eq!(
            message(conv(&[3, 3, 3, 3], opts(0, 1, 2))),
            "conv2d: invalid groups: 2 groups do not divide 3 output channels"
        );
        assert_eq!(
            message(conv(&[4, 2, 3, 3], opts(0, 1, 2))),
            "conv2d: incompatible shapes [1, 6, 5, 5] and [4, 2, 3, 3]: input channels differ \
             (6 and 2 per group x 2 groups)"
        );
        assert_eq!(
            message(conv(&[4, 6, 3, 3], opts(0, 1, 0))),
            "conv2d: invalid groups: must be at least 1"
        );
        assert_eq!(
            message(conv(&[4, 6, 3, 3], opts(0, 0, 1))),
            "conv2d: invalid dilation: must be at least 1"
        );
        assert_eq!(
            message(conv(&[4, 6, 3, 3], opts(0, 3, 1))),
            "conv2d: incompatible shapes [1, 6, 5, 5] and [4, 6, 3, 3]: a 3x3 kernel dilated by \
             3 (spanning 7x7) does not fit a 5x5 padded image"
        );
        assert_eq!(
            conv(&[4, 6, 3, 3], opts(0, usize::MAX, 1)).unwrap_err(),
            Error::DimensionOverflow {
                op: "conv2d",
                operand: "dilation",
                value: usize::MAX,
                shape: Shape(vec![1, 6, 5, 5])
            }
        );

        let seq = s.zeros::<f32>(&[2, 6, 4]);
        let conv1d = |w: &[usize], options| seq.try_conv1d(&s.zeros::<f32>(w), options);
        assert_eq!(
            message(conv1d(&[4, 6, 3], opts(0, 2, 1))),
            "conv1d: incompatible shapes [2, 6, 4] and [4, 6, 3]: a 3-long kernel dilated by 2 \
             (spanning 5-long) does not fit a 4-long padded sequence"
        );
        assert_eq!(
            message(conv1d(&[4, 6, 3, 3], ConvOptions::default())),
            "conv1d: incompatible shapes [2, 6, 4] and [4, 6, 3, 3]: the weight must be [c_out, \
             c_in / groups, k]"
        );
        assert_eq!(
            message(x.try_conv1d(&s.zeros::<f32>(&[4, 6, 3]), ConvOptions::default())),
            "conv1d: invalid shape [1, 6, 5, 5]: expected [batch, channels, length]"
        );
        assert_eq!(
            message(conv1d(&[4, 1, 3], opts(0, 1, 4))),
            "conv1d: invalid groups: 4 groups do not divide 6 input channels"
        );
    });
}
