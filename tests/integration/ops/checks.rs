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
            for (i, (&got, &want)) in y.as_slice().iter().zip(want.as_slice()).enumerate() {
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

/// One layer of a [`Stack`]: any function of the activation (closing over its parameters).
pub(crate) type Layer = Box<dyn for<'a> Fn(Tensor<'a>) -> Tensor<'a>>;

/// `f` as a [`Layer`] (a closure passed here gets the signature for every lifetime).
pub(crate) fn layer(f: impl for<'a> Fn(Tensor<'a>) -> Tensor<'a> + 'static) -> Layer {
    Box::new(f)
}

/// Layers applied in turn, checkpointed.
struct Stack<'l> {
    layers: &'l [Layer],
}

impl Stack<'_> {
    #[checkpoint]
    fn forward<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let mut x = x;
        for layer in self.layers {
            x = layer(x);
        }
        x
    }
}

/// Asserts that `layers` (six or more), checkpointed under every policy, give the loss and the
/// gradients of `params` bit for bit as the plain forward from a random input of `shape`. `before`
/// runs before each forward (to seed the generator of ops that draw random numbers).
#[track_caller]
pub(crate) fn assert_checkpoint_replays_exactly(
    shape: &[usize],
    layers: &[Layer],
    params: &[&Param],
    before: impl Fn(),
) {
    let pool = Pool::with_max_memory_mb(64);
    let each = |f: &mut dyn FnMut(&Param)| params.iter().for_each(|p| f(p));
    let plain = gradients(
        &pool,
        shape,
        |x| {
            before();
            layers.iter().fold(x, |x, layer| layer(x))
        },
        each,
    );
    let activation = shape.iter().product::<usize>() * 4;
    for policy in policies(layers.len(), activation) {
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(policy.clone()));
        let stack = Stack { layers };
        let got = gradients(
            &pool,
            shape,
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
