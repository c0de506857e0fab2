//! `dropout` and `nn::Dropout`: the scaling and the gradient rule against PyTorch's
//! (`scripts/dropout_fixture.py`; its masks cannot be matched), the share of elements kept and the
//! expected value over a large tensor, masks replayed after `manual_seed` and under `#[checkpoint]`
//! bit for bit, finite differences under a fixed mask, and the errors.

use tensorscope::autograd::check_gradients;
use tensorscope::nn::{Dropout, Module, Sequential};
use tensorscope::prelude::*;
use tensorscope::{manual_seed, Error};

use super::checks::{assert_checkpoint_replays_exactly, Fixture};
use crate::common::{close, test_pool};

/// `a / b` elementwise where `b` is nonzero (the fixture's inputs are).
fn ratios(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(a, b)| a / b).collect()
}

#[test]
fn scaling_and_gradient_follow_pytorchs_rule() {
    let fixture = Fixture::open("dropout");
    let p = fixture.values::<f64>("p")[0];
    let x = fixture.values::<f64>("x");
    let gy = fixture.values::<f64>("gy");
    let scale = 1.0 / (1.0 - p);
    // PyTorch's own output and gradient: y = x m / (1 - p), dx = gy m / (1 - p), m = (y != 0).
    let torch_y = ratios(&fixture.values("y"), &x);
    let torch_dx = ratios(&fixture.values("dx"), &gy);
    for (y, dx) in torch_y.iter().zip(&torch_dx) {
        assert!(*y == 0.0 || close(*y, scale, 1e-12, 0.0), "{y}");
        assert!(
            close(*dx, *y, 1e-12, 0.0),
            "PyTorch's gradient carries its mask"
        );
    }
    // Ours, with our mask: kept elements scaled as PyTorch's, the gradient by the same mask.
    test_pool(16).scope(|s| {
        let xt = s.bind(&fixture.param::<f64>("x")).requires_grad();
        let y = xt.dropout(p);
        let grads = (&y * &s.bind(&fixture.param::<f64>("gy")))
            .sum_all()
            .backward()
            .unwrap();
        let ours = ratios(&y.to_vec(), &x);
        let ours_dx = ratios(&grads.of(&xt).unwrap().to_vec(), &gy);
        for (i, (y, dx)) in ours.iter().zip(&ours_dx).enumerate() {
            assert!(
                *y == 0.0 || close(*y, scale, 1e-12, 0.0),
                "y[{i}] / x[{i}] = {y}"
            );
            assert!(
                close(*dx, *y, 1e-12, 0.0),
                "element {i}: the gradient carries the mask"
            );
        }
        let kept = ours.iter().filter(|&&r| r != 0.0).count();
        assert!((40..=120).contains(&kept), "{kept} of 128 kept at p = {p}");
    });
}

#[test]
fn the_mask_keeps_one_minus_p_and_the_mean_is_preserved() {
    test_pool(64).scope(|s| {
        let n = 200_000;
        let x = s.ones::<f32>(&[n]);
        for p in [0.1, 0.5, 0.9] {
            let y = x.dropout(p).to_vec();
            let kept = y.iter().filter(|&&v| v != 0.0).count() as f64 / n as f64;
            // The standard deviation of the share kept is at most 0.0012 here: 5 of them.
            assert!((kept - (1.0 - p)).abs() < 0.006, "p = {p}: kept {kept}");
            let mean = y.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
            let bound = 5.0 * (p / (1.0 - p) / n as f64).sqrt();
            assert!((mean - 1.0).abs() < bound, "p = {p}: mean {mean}");
        }
    });
}

#[test]
fn a_seed_replays_the_masks_and_each_call_draws_anew() {
    test_pool(16).scope(|s| {
        let x = s.randn::<f32>(&[4, 32], 1);
        manual_seed(42);
        let (a, b) = (x.dropout(0.5).to_vec(), x.dropout(0.5).to_vec());
        assert_ne!(a, b, "two calls, two masks");
        manual_seed(42);
        assert_eq!(x.dropout(0.5).to_vec(), a);
        assert_eq!(x.dropout(0.5).to_vec(), b);
        // p = 0 is the identity: the same tensor, nothing drawn.
        let same = x.dropout(0.0);
        assert!(same.shares_buffer_with(&x));
    });
}

#[test]
fn gradients_match_finite_differences_under_a_fixed_mask() {
    let pool = test_pool(16);
    let x = pool.scope(|s| s.randn::<f64>(&[3, 7], 2).to_array());
    let report = check_gradients(&pool, &[x], 1e-6, |xs| {
        manual_seed(9);
        xs[0].try_dropout(0.4)?.try_tanh()?.try_sum_all()
    })
    .unwrap();
    assert!(report.max_error() < 1e-8, "{report:?}");
    let zeros = report.analytic[0].iter().filter(|&&g| g == 0.0).count();
    assert!(zeros > 0 && zeros < 21, "{zeros} of 21 dropped");
}

#[test]
fn checkpointed_dropout_replays_its_masks_bit_for_bit() {
    assert_checkpoint_replays_exactly(
        &[4, 6],
        &[6, 6],
        |_, x, w| x.matmul(w).tanh().dropout(0.3),
        || manual_seed(11),
    );
}

#[test]
fn the_module_drops_only_in_training_mode() {
    let pool = Pool::with_max_memory_mb(16);
    let mut model = Sequential::new().push(Dropout::new(0.5).unwrap());
    pool.scope(|s| {
        let x = s.ones::<f32>(&[64]);
        let y = model.forward(&x).unwrap().to_vec();
        assert!(y.iter().all(|&v| v == 0.0 || v == 2.0), "{y:?}");
        assert!(y.contains(&0.0) && y.contains(&2.0));
    });
    let mut dropout = Dropout::new(0.5).unwrap();
    assert!(dropout.is_training());
    dropout.set_training(false);
    model = Sequential::new().push(dropout);
    pool.scope(|s| {
        let x = s.ones::<f32>(&[64]);
        assert!(model.forward(&x).unwrap().shares_buffer_with(&x));
    });
}

#[test]
fn p_outside_zero_to_one_is_an_invalid_argument() {
    test_pool(16).scope(|s| {
        let x = s.ones::<f32>(&[4]);
        for p in [-0.1, 1.0, f64::NAN] {
            let err = x.try_dropout(p).unwrap_err();
            assert_eq!(
                err,
                Error::InvalidArgument {
                    op: "dropout",
                    arg: "p",
                    reason: format!("{p} is outside [0, 1)")
                }
            );
        }
        assert_eq!(
            x.try_dropout(1.5).unwrap_err().to_string(),
            "dropout: invalid p: 1.5 is outside [0, 1)"
        );
        assert_eq!(
            Dropout::new(2.0).unwrap_err().to_string(),
            "Dropout::new: invalid p: 2 is outside [0, 1)"
        );
    });
}
