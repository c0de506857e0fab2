//! An op written outside the library (`examples/common/swiglu.rs`, SwiGLU as one fused kernel) is
//! the same kind of thing as the library's own: it computes what the composition of library ops
//! computes, its gradients pass the gradient check, a model built on it trains through a
//! `#[checkpoint]` forward with the plain forward's gradients bit for bit, and its graph holds less
//! memory in a training step than the composition it fuses.

use ndarray::ArrayD;
use tensorscope::autograd::check_gradients;
use tensorscope::autograd::{Backward, Forward, Grads, Op};
use tensorscope::nn::{Optimizer, Sgd};
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Error, Param, Parameters, Policy, Shape};

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

/// `2 x`, whose backward returns what `grad` says instead of `2 g`: a gradient of `shape` (filled
/// with 2), the right one made a view (a transpose of a transposed copy), or `extra` more
/// gradients than the op has inputs.
#[derive(Clone)]
struct Doubling {
    grad: Returned,
}

#[derive(Clone)]
enum Returned {
    Shape(Vec<usize>),
    TransposedView,
    Extra(usize),
}

impl Op<f32> for Doubling {
    type Saved<'s> = ();

    fn name(&self) -> &'static str {
        "doubling"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, f32>,
    ) -> tensorscope::Result<(Tensor<'s, f32>, Option<()>)> {
        Ok((cx.input(0) * 2.0, Some(())))
    }

    fn backward<'b>(
        &self,
        (): (),
        g: Tensor<'b, f32>,
        cx: &Backward<'b>,
    ) -> tensorscope::Result<Grads<'b, f32>> {
        let right = g * 2.0;
        Ok(match &self.grad {
            Returned::Shape(shape) => {
                let mut wrong = cx.rent::<f32>(shape)?;
                wrong.view_mut().fill(2.0);
                Grads::from([Some(wrong)])
            }
            Returned::TransposedView => {
                Grads::from([Some(right.try_t()?.try_contiguous()?.try_t()?)])
            }
            Returned::Extra(n) => std::iter::repeat_n(right, 1 + n).map(Some).collect(),
        })
    }
}

#[test]
fn a_gradient_of_another_shape_than_its_input_is_the_ops_error_and_changes_nothing() {
    let pool = Pool::with_max_memory_mb(16);
    let n = 3;
    // The wrong shapes of the review: rank 0, [1] and [2n], which a later add broadcasts into the
    // weights' gradient, [3, n], and a view of the transposed shape.
    let wrong: [&[usize]; 5] = [&[], &[1], &[2 * n], &[3, n], &[n, 2]];
    for shape in wrong {
        let mut w = Param::from_slice(&pool, &[2, n], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let error = pool.train(|s| {
            let op = Doubling {
                grad: Returned::Shape(shape.to_vec()),
            };
            let y = Tensor::try_apply(op, &[&s.bind(&w)]).unwrap();
            // Through a built-in op whose backward would index out of range with a wrong gradient.
            y.sum(1).sum_all().backward().map(|g| g.len())
        });
        let expected = Error::InvalidGradient {
            op: "doubling",
            index: 0,
            got: Shape(shape.to_vec()),
            expected: Shape(vec![2, n]),
        };
        assert_eq!(error, Err(expected.clone()), "{shape:?}");
        let message = expected.to_string();
        assert!(
            message.contains("doubling returned an invalid gradient for input 0"),
            "{message}"
        );
        // Nothing reached the weights: a step with the gradients of a fresh, valid backward only.
        let mut sgd = Sgd::new(1.0, 0.0);
        pool.train(|s| {
            let loss = s.bind(&w).sum_all();
            sgd.step(&mut w, &loss.backward().unwrap()).unwrap();
        });
        assert_eq!(w.to_vec(), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0], "{shape:?}");
    }
    assert_eq!(pool.stats().bytes_in_use, 0);
}

#[test]
fn a_view_of_the_right_shape_is_a_gradient_and_extra_gradients_are_refused() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let x = s
            .from_slice::<f32>(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
            .requires_grad();
        let view = Doubling {
            grad: Returned::TransposedView,
        };
        let y = Tensor::apply(view, &[&x]);
        let weights = s.from_slice::<f32>(&[2, 3], &[1.0, -1.0, 0.5, 2.0, 0.0, 3.0]);
        let grads = (&y * &weights).sum_all().backward().unwrap();
        assert_eq!(
            grads.of(&x).unwrap().to_vec(),
            vec![2.0, -2.0, 1.0, 4.0, 0.0, 6.0]
        );
        for extra in [1, 2] {
            let op = Doubling {
                grad: Returned::Extra(extra),
            };
            let loss = Tensor::apply(op, &[&x]).sum_all();
            assert_eq!(
                loss.backward().map(|g| g.len()),
                Err(Error::TooManyGradients {
                    op: "doubling",
                    got: 1 + extra,
                    inputs: 1,
                })
            );
        }
    });
}

#[test]
fn the_gradient_check_reports_a_wrong_shaped_gradient_rather_than_panicking() {
    let pool = Pool::with_max_memory_mb(16);
    let x = ArrayD::from_shape_fn(vec![2, 3], |i| i[0] as f64 + 0.5 * i[1] as f64);
    #[derive(Clone)]
    struct Wrong;
    impl Op<f64> for Wrong {
        type Saved<'s> = ();
        fn name(&self) -> &'static str {
            "wrong"
        }
        fn forward<'s>(
            &self,
            cx: &mut Forward<'_, 's, f64>,
        ) -> tensorscope::Result<(Tensor<'s, f64>, Option<()>)> {
            Ok((cx.input(0).clone(), Some(())))
        }
        fn backward<'b>(
            &self,
            (): (),
            g: Tensor<'b, f64>,
            _: &Backward<'b>,
        ) -> tensorscope::Result<Grads<'b, f64>> {
            Ok(Grads::from([Some(g.try_reshape(&[3, 2])?)]))
        }
    }
    let check = check_gradients(&pool, &[x], 1e-6, |xs| {
        let y = Tensor::try_apply(Wrong, &[&xs[0]])?;
        (&y * &y).try_sum_all()
    });
    assert_eq!(
        check.map(|c| c.max_error()),
        Err(Error::InvalidGradient {
            op: "wrong",
            index: 0,
            got: Shape(vec![3, 2]),
            expected: Shape(vec![2, 3]),
        })
    );
}

#[test]
fn an_op_on_no_inputs_is_an_error_naming_it() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|_| {
        let op = Doubling {
            grad: Returned::Extra(0),
        };
        assert_eq!(
            Tensor::<f32>::try_apply(op, &[]).map(|t| t.len()),
            Err(Error::NoInputs { op: "doubling" })
        );
    });
}
