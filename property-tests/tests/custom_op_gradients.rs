//! Custom ops whose backward returns gradients of random shapes, and random counts of them: a
//! backward succeeds exactly when every gradient has its input's shape and there is none past the
//! inputs, and then gives those gradients; otherwise it fails with `InvalidGradient` naming both
//! shapes (or `TooManyGradients`) before anything is added, and every buffer goes back to the pool.

use proptest::prelude::*;
use tensorscope::autograd::{Backward, Forward, Grads, Op};
use tensorscope::{Error, Pool, Shape, Tensor};

/// `x + y` (or `x` alone), whose backward returns `grads[i]`-shaped tensors filled with `i + 1`.
#[derive(Clone)]
struct Claimed {
    grads: Vec<Vec<usize>>,
}

impl Op<f32> for Claimed {
    type Saved<'s> = ();

    fn name(&self) -> &'static str {
        "claimed"
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, f32>,
    ) -> tensorscope::Result<(Tensor<'s, f32>, Option<()>)> {
        let y = match cx.len() {
            1 => cx.input(0).clone(),
            _ => cx.input(0).try_add(cx.input(1))?,
        };
        Ok((y, Some(())))
    }

    fn backward<'b>(
        &self,
        (): (),
        _: Tensor<'b, f32>,
        cx: &Backward<'b>,
    ) -> tensorscope::Result<Grads<'b, f32>> {
        self.grads
            .iter()
            .enumerate()
            .map(|(i, shape)| {
                let mut g = cx.rent::<f32>(shape)?;
                g.view_mut().fill(i as f32 + 1.0);
                Ok(Some(g))
            })
            .collect()
    }
}

fn shape() -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(0usize..4, 0..4)
}

/// Input shapes (one or two inputs, of one shape), and the gradients the op returns: each the
/// input's shape or a random one, and maybe more of them than inputs.
fn case() -> impl Strategy<Value = (Vec<usize>, usize, Vec<Vec<usize>>)> {
    (shape(), 1usize..3).prop_flat_map(|(input, inputs)| {
        let grad = prop_oneof![3 => Just(input.clone()), 1 => shape()];
        let grads = prop::collection::vec(grad, 1..=inputs + 1);
        (Just(input), Just(inputs), grads)
    })
}

proptest! {
    // 256 cases unless `PROPTEST_CASES` says otherwise.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(256),
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_backward_uses_a_custom_ops_gradients_only_when_each_has_its_inputs_shape(
        (input, inputs, grads) in case()
    ) {
        let pool = Pool::with_max_memory_mb(16);
        let expected = match grads.iter().position(|g| *g != input) {
            _ if grads.len() > inputs => Err(Error::TooManyGradients {
                op: "claimed",
                got: grads.len(),
                inputs,
            }),
            Some(index) => Err(Error::InvalidGradient {
                op: "claimed",
                index,
                got: Shape(grads[index].clone()),
                expected: Shape(input.clone()),
            }),
            None => Ok(()),
        };
        pool.scope(|s| {
            let xs: Vec<_> = (0..inputs).map(|_| s.ones::<f32>(&input).requires_grad()).collect();
            let refs: Vec<_> = xs.iter().collect();
            let op = Claimed { grads: grads.clone() };
            let loss = Tensor::apply(op, &refs).sum_all();
            match (loss.backward(), &expected) {
                (Ok(got), Ok(())) => {
                    for (i, x) in xs.iter().enumerate() {
                        match got.of(x).map(|g| g.to_vec()) {
                            Some(g) => prop_assert!(g.iter().all(|&v| v == i as f32 + 1.0), "{g:?}"),
                            // The op returned nothing for it: no gradient, as PyTorch's `None`.
                            None => prop_assert!(i >= grads.len()),
                        }
                    }
                }
                (got, want) => prop_assert_eq!(got.map(|g| g.len()).map(drop), want.clone()),
            }
            Ok(())
        })?;
        prop_assert_eq!(pool.stats().bytes_in_use, 0);
    }
}
