//! The checks each op of the model families gets besides its own values and errors: forward and
//! gradients against a committed PyTorch fixture (`scripts/<family>_fixture.py` writes
//! `tests/fixtures/<family>.safetensors`), and a `#[checkpoint]` replay that gives the plain
//! forward's gradients bit for bit. Finite differences are `crate::autograd::check`.

use std::path::PathBuf;

use tensorscope::nn::SafeTensorsFile;
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, DType};

use crate::checkpoint_training::{gradients, policies};
use crate::common::close;

/// A committed PyTorch fixture, with a pool for its tensors.
pub(crate) struct Fixture {
    file: SafeTensorsFile,
    pool: Pool,
}

impl Fixture {
    /// `tests/fixtures/<name>.safetensors`.
    pub(crate) fn open(name: &str) -> Fixture {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(format!("tests/fixtures/{name}.safetensors"));
        Fixture {
            file: SafeTensorsFile::open(&path).unwrap_or_else(|e| panic!("{path:?}: {e}")),
            pool: Pool::with_max_memory_mb(16),
        }
    }

    /// The tensor `name`, to bind into a scope.
    pub(crate) fn param<T: DType>(&self, name: &str) -> Param<T> {
        self.file
            .param(&self.pool, name)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    /// The values of the tensor `name`.
    pub(crate) fn values<T: DType>(&self, name: &str) -> Vec<T> {
        self.param::<T>(name).as_slice().to_vec()
    }

    /// Runs `f` on the fixture's `{prefix}.{name}` for each name of `inputs` (`f64`, requiring
    /// gradients); asserts that the output is `{prefix}.y` within 1e-5 relative, and that the
    /// gradient of `sum(y * {prefix}.gy)` with respect to each input is `{prefix}.d{name}` within
    /// 1e-4 of that gradient's largest element.
    #[track_caller]
    pub(crate) fn check(
        &self,
        prefix: &str,
        inputs: &[&str],
        f: impl for<'s> Fn(&[Tensor<'s, f64>]) -> Tensor<'s, f64>,
    ) {
        let name = |n: &str| format!("{prefix}.{n}");
        let (want, gy) = (self.param::<f64>(&name("y")), self.param(&name("gy")));
        let pool = Pool::with_max_memory_mb(16);
        pool.scope(|s| {
            let xs: Vec<_> = inputs
                .iter()
                .map(|n| s.bind(&self.param::<f64>(&name(n))).requires_grad())
                .collect();
            let y = f(&xs);
            assert_eq!(y.shape(), want.shape(), "{prefix}: shape");
            for (i, (got, &want)) in y.to_vec().into_iter().zip(want.as_slice()).enumerate() {
                assert!(
                    close(got, want, 1e-5, 1e-12),
                    "{prefix}: y[{i}] = {got}, PyTorch {want}"
                );
            }
            let grads = (&y * &s.bind(&gy)).sum_all().backward().unwrap();
            for (n, x) in inputs.iter().zip(&xs) {
                let want = self.values::<f64>(&name(&format!("d{n}")));
                let got = grads.of(x).map_or(vec![0.0; x.len()], |g| g.to_vec());
                let largest = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
                let error = got
                    .iter()
                    .zip(&want)
                    .fold(0.0f64, |m, (a, b)| m.max((a - b).abs()));
                assert!(
                    error <= 1e-4 * largest,
                    "{prefix}: d{n} differs by {error:e}, its largest element is {largest:e}"
                );
            }
        });
    }
}

/// A layer of a [`Stack`]: its index, the activation and its weight.
type Step<'f> = dyn for<'a> Fn(usize, Tensor<'a>, &Param) -> Tensor<'a> + 'f;

/// Layers applied in turn, checkpointed: `x = step(i, x, &weights[i])`.
struct Stack<'l> {
    weights: &'l [Param],
    step: &'l Step<'l>,
}

impl Stack<'_> {
    #[checkpoint]
    fn forward<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let mut x = x;
        for (i, w) in self.weights.iter().enumerate() {
            x = (self.step)(i, x, w);
        }
        x
    }

    fn plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let each = self.weights.iter().enumerate();
        each.fold(x, |x, (i, w)| (self.step)(i, x, w))
    }
}

/// Asserts that six layers `x = step(i, x, &w_i)`, each with a random weight of shape `weight`,
/// checkpointed under every policy, give the loss and the weights' gradients bit for bit as the
/// plain forward from a random input of shape `input`. `before` runs before each forward (to seed
/// the generator of ops that draw random numbers).
#[track_caller]
pub(crate) fn assert_checkpoint_replays_exactly(
    input: &[usize],
    weight: &[usize],
    step: impl for<'a> Fn(usize, Tensor<'a>, &Param) -> Tensor<'a>,
    before: impl Fn(),
) {
    let pool = Pool::with_max_memory_mb(64);
    let weights: Vec<Param> = (0..6)
        .map(|i| pool.scope(|s| (s.randn::<f32>(weight, 40 + i) * 0.4).detach()))
        .collect();
    let stack = Stack {
        weights: &weights,
        step: &step,
    };
    let each = |f: &mut dyn FnMut(&Param)| weights.iter().for_each(&mut *f);
    let plain = gradients(
        &pool,
        input,
        |x| {
            before();
            stack.plain(x)
        },
        each,
    );
    let activation = input.iter().product::<usize>() * 4;
    for policy in policies(weights.len(), activation) {
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(policy.clone()));
        let got = gradients(
            &pool,
            input,
            |x| {
                before();
                stack.forward(&mut ckpt, x)
            },
            each,
        );
        assert!(got == plain, "{policy:?}: the gradients differ");
        assert!(
            ckpt.last_backward().is_some_and(|r| r.replayed_steps > 0),
            "{policy:?}: the backward replayed the steps"
        );
    }
}
