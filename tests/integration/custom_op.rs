//! An op written outside the library (`examples/common/swiglu.rs`, SwiGLU as one fused kernel) is
//! the same kind of thing as the library's own: it computes what the composition of library ops
//! computes, its gradients pass the gradient check, a model built on it trains through a
//! `#[checkpoint]` forward with the plain forward's gradients bit for bit, and its graph holds less
//! memory in a training step than the composition it fuses.

use ndarray::ArrayD;
use tensorscope::autograd::check_gradients;
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Error, Parameters, Policy};

use crate::swiglu::{swiglu, Model, SwiGlu};

const WIDTH: usize = 8;
const BATCH: usize = 4;

#[test]
fn the_fused_op_computes_the_composition() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let a = s.randn::<f32>(&[6, 40], 1) * 3.0;
        let b = s.randn::<f32>(&[6, 40], 2);
        let fused = swiglu(&a, &b).to_vec();
        let composed = ((&a).silu() * &b).to_vec();
        for (i, (f, c)) in fused.iter().zip(&composed).enumerate() {
            assert!(
                (f - c).abs() <= 1e-6 * (1.0 + c.abs()),
                "element {i}: fused {f}, composed {c}"
            );
        }
        // silu(0) * b = 0, silu(a) * 0 = 0, silu(1) * 2 = 2 / (1 + e^-1).
        let a = s.from_slice::<f32>(&[3], &[0.0, 5.0, 1.0]);
        let b = s.from_slice::<f32>(&[3], &[7.0, 0.0, 2.0]);
        let y = swiglu(&a, &b).to_vec();
        assert_eq!(&y[..2], &[0.0, 0.0]);
        assert!((y[2] - 2.0 / (1.0 + (-1f32).exp())).abs() < 1e-6, "{y:?}");
    });
}

#[test]
fn a_shape_mismatch_is_the_ops_error() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let a = s.zeros::<f32>(&[2, 3]);
        let b = s.zeros::<f32>(&[3]);
        match Tensor::try_apply(SwiGlu, &[&a, &b]) {
            Err(Error::ShapeMismatch { op, lhs, rhs, .. }) => {
                assert_eq!(op, "swiglu");
                assert_eq!((lhs.0, rhs.0), (vec![2, 3], vec![3]));
            }
            other => panic!("expected the op's shape error, got {other:?}"),
        }
    });
}

#[test]
fn its_gradients_pass_the_gradient_check() {
    let pool = Pool::with_max_memory_mb(16);
    let a = ArrayD::from_shape_fn(vec![3, 5], |i| {
        (i[0] as f64 - 1.2) * 0.9 + i[1] as f64 * 0.3
    });
    let b = ArrayD::from_shape_fn(vec![3, 5], |i| 0.5 - (i[0] * 5 + i[1]) as f64 * 0.07);
    let check = check_gradients(&pool, &[a, b], 1e-6, |xs| {
        // Squared, so that the gradient reaching the op is not all ones.
        let y = Tensor::try_apply(SwiGlu, &[&xs[0], &xs[1]])?;
        (&y * &y).try_sum_all()
    })
    .unwrap();
    assert!(check.max_error() < 1e-7, "{check:?}");
    // Only one input needs a gradient: the other's is not computed, and the check still passes.
    pool.scope(|s| {
        let a = s.from_slice::<f64>(&[2], &[0.5, -1.0]).requires_grad();
        let b = s.from_slice::<f64>(&[2], &[2.0, 3.0]);
        let grads = swiglu(&a, &b).sum_all().backward().unwrap();
        assert!(grads.of(&b).is_none());
        let da = grads.of(&a).unwrap().to_vec();
        for (i, x) in [0.5f64, -1.0].into_iter().enumerate() {
            let sig = 1.0 / (1.0 + (-x).exp());
            let want = [2.0, 3.0][i] * sig * (1.0 + x * (1.0 - sig));
            assert!((da[i] - want).abs() < 1e-12, "{da:?}");
        }
    });
}

/// The loss, every parameter's gradient and the bytes the forward's graph holds for the backward in
/// one training step of `model`, through `forward`.
fn step(
    model: &mut Model,
    forward: impl for<'a> Fn(&Model, Tensor<'a>) -> Tensor<'a>,
) -> (f32, Vec<Vec<f32>>, usize) {
    let pool = Pool::with_max_memory_mb(256);
    pool.train(|s| {
        let x = s.randn::<f32>(&[BATCH, WIDTH], 100);
        let target = s.randn::<f32>(&[BATCH, WIDTH], 101);
        let before = pool.stats().bytes_in_use;
        let y = forward(model, x);
        let held = pool.stats().bytes_in_use - before;
        let loss = y.mse(&target);
        let grads = loss.backward().unwrap();
        let mut all = Vec::new();
        model.for_each_param(&mut |p| all.push(grads.get(p).expect("a gradient").to_vec()));
        (loss.item(), all, held)
    })
}

#[test]
fn a_checkpointed_forward_replays_it_bit_for_bit() {
    let n = 12;
    let pool = Pool::with_max_memory_mb(16);
    let mut model = Model::new(&pool, n, WIDTH);
    let (loss, grads, _) = step(&mut model, |m, x| m.forward_plain(x));
    assert!(loss.is_finite() && loss > 0.0, "{loss}");
    for policy in [Policy::Every(3), Policy::Sqrt, Policy::Explicit(vec![5])] {
        let ckpt =
            std::cell::RefCell::new(Checkpointer::new(CheckpointConfig::new(policy.clone())));
        let (got_loss, got, _) = step(&mut model, |m, x| m.forward(&mut ckpt.borrow_mut(), x));
        assert_eq!(got_loss.to_bits(), loss.to_bits(), "{policy:?}");
        assert_eq!(got, grads, "{policy:?}: every gradient bit for bit");
        let report = ckpt.borrow().last_backward().expect("the backward ran");
        assert!(report.replayed_steps > 0, "{policy:?}: {report:?}");
    }
}

#[test]
fn fused_it_holds_less_than_the_composition_and_trains_alike() {
    let pool = Pool::with_max_memory_mb(16);
    let mut model = Model::new(&pool, 6, WIDTH);
    let (loss, fused, fused_held) = step(&mut model, |m, x| m.forward_plain(x));
    let (composed_loss, composed, composed_held) = step(&mut model, |m, x| m.forward_composed(x));
    assert!(
        (loss - composed_loss).abs() <= 1e-6 * composed_loss,
        "{loss} {composed_loss}"
    );
    let largest = composed.iter().flatten().fold(0f32, |m, g| m.max(g.abs()));
    for (f, c) in fused.iter().flatten().zip(composed.iter().flatten()) {
        assert!((f - c).abs() <= 1e-5 * largest, "fused {f}, composed {c}");
    }
    // The composition keeps silu(W1 h) for its backward in every block, beside W1 h and W2 h;
    // the fused op keeps only those two.
    let silu_bytes = BATCH * 2 * WIDTH * 4;
    assert_eq!(
        composed_held - fused_held,
        6 * silu_bytes,
        "fused {fused_held} B, composed {composed_held} B"
    );
}
