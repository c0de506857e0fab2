//! Checkpointed training steps against plain ones: bit-identical at full precision for every
//! policy, measured error at f16/bf16, and less memory held.

use tensorscope::nn::{
    mse, train_step, Activation, Linear, ParamStore, Residual, Sequential, Sgd, StepReport,
};
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Policy, Precision};

const WIDTH: usize = 8;
const BATCH: usize = 4;

/// `n` residual blocks `x + W2 gelu(W1 x)`, with the same parameters for the same seed.
fn model(pool: &Pool, n: usize) -> (Sequential, ParamStore) {
    let mut params = ParamStore::new(pool);
    let mut seq = Sequential::new();
    for i in 0..n {
        let inner = Sequential::new()
            .push(
                Linear::new(
                    &mut params,
                    &format!("b{i}.fc1"),
                    WIDTH,
                    2 * WIDTH,
                    2 * i as u64,
                )
                .unwrap(),
            )
            .push(Activation::gelu())
            .push(
                Linear::new(
                    &mut params,
                    &format!("b{i}.fc2"),
                    2 * WIDTH,
                    WIDTH,
                    2 * i as u64 + 1,
                )
                .unwrap(),
            );
        seq = seq.push(Residual::new(inner));
    }
    (seq, params)
}

fn step(
    pool: &Pool,
    seq: &Sequential,
    params: &mut ParamStore,
    ckpt: Option<&mut Checkpointer>,
) -> StepReport {
    let mut sgd = Sgd::new(0.05, 0.9);
    pool.scope(|s| {
        let x = s.randn::<f32>(&[BATCH, WIDTH], 100);
        let target = s.randn::<f32>(&[BATCH, WIDTH], 101);
        train_step(seq, params, &mut sgd, &x, |y| mse(y, &target), ckpt).unwrap()
    })
}

fn snapshot(params: &ParamStore) -> Vec<(String, Vec<f32>, Vec<f32>)> {
    params
        .iter()
        .map(|(n, p)| (n.to_string(), p.data.to_vec(), p.grad.to_vec()))
        .collect()
}

#[test]
fn checkpointed_steps_are_bit_identical_for_every_policy() {
    let pool = Pool::with_max_memory_mb(256);
    let act_bytes = BATCH * WIDTH * 4;
    for n in [16usize, 64] {
        let (seq, mut plain_params) = model(&pool, n);
        let plain = step(&pool, &seq, &mut plain_params, None);
        let want = snapshot(&plain_params);
        for policy in [
            Policy::Every(4),
            Policy::Sqrt,
            Policy::Explicit(vec![n / 3, n / 2]),
            Policy::Budget(3 * act_bytes),
        ] {
            let (seq, mut params) = model(&pool, n);
            let mut ckpt = Checkpointer::new(CheckpointConfig::new(policy.clone()));
            let report = step(&pool, &seq, &mut params, Some(&mut ckpt));
            assert_eq!(
                report.loss.to_bits(),
                plain.loss.to_bits(),
                "{policy:?} n={n}"
            );
            let got = snapshot(&params);
            for ((name, data, grad), (_, want_data, want_grad)) in got.iter().zip(&want) {
                assert_eq!(grad, want_grad, "{policy:?} n={n}: gradient of {name}");
                assert_eq!(data, want_data, "{policy:?} n={n}: updated {name}");
            }
            assert!(
                report.stored_bytes < n * act_bytes / 2,
                "{policy:?}: {report:?}"
            );
            assert!(
                report.recomputed_layers >= n,
                "{policy:?}: at least one extra forward"
            );
            assert_eq!(
                ckpt.num_checkpoints(),
                0,
                "the step releases its checkpoints"
            );
        }
    }
    assert_eq!(pool.stats().bytes_in_use, 0);
}

#[test]
fn low_precision_storage_gives_a_small_measured_gradient_error() {
    let pool = Pool::with_max_memory_mb(256);
    let n = 16;
    let (seq, mut plain_params) = model(&pool, n);
    step(&pool, &seq, &mut plain_params, None);
    let want = snapshot(&plain_params);
    for (precision, bound) in [(Precision::F16, 5e-3), (Precision::Bf16, 5e-2)] {
        let (seq, mut params) = model(&pool, n);
        let config = CheckpointConfig::new(Policy::Sqrt).with_precision(precision);
        let mut ckpt = Checkpointer::new(config);
        step(&pool, &seq, &mut params, Some(&mut ckpt));
        // Normwise relative error of each parameter's gradient, the largest over all parameters.
        let mut worst = 0f32;
        for ((name, _, grad), (_, _, want_grad)) in snapshot(&params).iter().zip(&want) {
            let err = grad
                .iter()
                .zip(want_grad)
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            let scale = want_grad.iter().fold(0f32, |m, b| m.max(b.abs()));
            assert!(err.is_finite(), "{name}");
            worst = worst.max(err / scale);
        }
        println!("{precision:?} storage: max normwise relative gradient error {worst:.2e}");
        assert!(worst > 0.0 && worst < bound, "{precision:?}: {worst}");
    }
}

/// A layer whose backward pops less than its forward pushes.
struct Leaky;

impl tensorscope::nn::Layer for Leaky {
    fn name(&self) -> &'static str {
        "leaky"
    }
    fn forward<'s>(
        &self,
        _: &ParamStore,
        x: &Tensor<'s>,
        cache: Option<&mut tensorscope::nn::Cache<'s>>,
    ) -> Result<Tensor<'s>, tensorscope::nn::NnError> {
        if let Some(cache) = cache {
            cache.push(x.clone());
            cache.push(x.clone());
        }
        Ok(x.clone())
    }
    fn backward<'s>(
        &self,
        _: &mut ParamStore,
        cache: &mut tensorscope::nn::Cache<'s>,
        grad: &Tensor<'s>,
    ) -> Result<Tensor<'s>, tensorscope::nn::NnError> {
        cache.pop("leaky")?;
        Ok(grad.clone())
    }
}

#[test]
#[cfg(debug_assertions)]
fn a_cache_left_non_empty_is_an_error_in_debug_builds() {
    let pool = Pool::with_max_memory_mb(16);
    let mut params = ParamStore::new(&pool);
    let seq = Sequential::new().push(Leaky);
    let err = pool
        .scope(|s| {
            let x = s.ones::<f32>(&[1, 2]);
            train_step(
                &seq,
                &mut params,
                &mut Sgd::new(0.1, 0.0),
                &x,
                |y| mse(y, &x),
                None,
            )
        })
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the cache holds 1 tensors after backward: a layer's backward pops less than its forward pushes"
    );
}
