//! Checkpointed training steps against plain ones: bit-identical at full precision for every
//! policy, measured error at f16/bf16, and less memory held; autograd through an annotated forward
//! against the hand-written backward passes, bit for bit.

use tensorscope::nn::{
    backward_step, mse, train_step, Activation, Adam, Linear, Optimizer, ParamStore, Residual,
    Sequential, Sgd, StepReport,
};
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Gradients, Parameters, Policy, Precision};

#[path = "../examples/common/pre_norm_mlp.rs"]
mod pre_norm_mlp;

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

/// Every parameter's name, gradient and updated value.
type Snapshot = Vec<(String, Vec<f32>, Vec<f32>)>;

/// One SGD step; returns its report and snapshot.
fn step(
    pool: &Pool,
    seq: &Sequential,
    params: &mut ParamStore,
    ckpt: Option<&mut Checkpointer>,
) -> (StepReport, Snapshot) {
    let mut sgd = Sgd::new(0.05, 0.9);
    pool.scope(|s| {
        let x = s.randn::<f32>(&[BATCH, WIDTH], 100);
        let target = s.randn::<f32>(&[BATCH, WIDTH], 101);
        let mut grads = Gradients::new(s);
        let report = backward_step(seq, params, &mut grads, &x, |y| mse(y, &target), ckpt).unwrap();
        sgd.step(params, &grads).unwrap();
        let snapshot = params
            .iter()
            .map(|(n, p)| {
                let g = grads.get(p).expect("every parameter has a gradient");
                (n.to_string(), g.to_vec(), p.to_vec())
            })
            .collect();
        (report, snapshot)
    })
}

#[test]
fn checkpointed_steps_are_bit_identical_for_every_policy() {
    let pool = Pool::with_max_memory_mb(256);
    let act_bytes = BATCH * WIDTH * 4;
    for n in [16usize, 64] {
        let (seq, mut plain_params) = model(&pool, n);
        let (plain, want) = step(&pool, &seq, &mut plain_params, None);
        for policy in [
            Policy::Every(4),
            Policy::Sqrt,
            Policy::Explicit(vec![n / 3, n / 2]),
            Policy::Budget(3 * act_bytes),
        ] {
            let (seq, mut params) = model(&pool, n);
            let mut ckpt = Checkpointer::new(CheckpointConfig::new(policy.clone()));
            let (report, got) = step(&pool, &seq, &mut params, Some(&mut ckpt));
            assert_eq!(
                report.loss.to_bits(),
                plain.loss.to_bits(),
                "{policy:?} n={n}"
            );
            for ((name, grad, data), (_, want_grad, want_data)) in got.iter().zip(&want) {
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
    let (_, want) = step(&pool, &seq, &mut plain_params, None);
    for (precision, bound) in [(Precision::F16, 5e-3), (Precision::Bf16, 5e-2)] {
        let (seq, mut params) = model(&pool, n);
        let config = CheckpointConfig::new(Policy::Sqrt).with_precision(precision);
        let mut ckpt = Checkpointer::new(config);
        let (_, got) = step(&pool, &seq, &mut params, Some(&mut ckpt));
        // Normwise relative error of each parameter's gradient, the largest over all parameters.
        let mut worst = 0f32;
        for ((name, grad, _), (_, want_grad, _)) in got.iter().zip(&want) {
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
        _: &ParamStore,
        _: &mut tensorscope::Gradients<'_>,
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
                &mut Gradients::new(s),
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

#[test]
fn autograd_through_an_annotated_forward_matches_the_hand_written_backward_bit_for_bit() {
    let pool = Pool::with_max_memory_mb(256);
    let mut params = ParamStore::new(&pool);
    let seq = pre_norm_mlp::layers(&mut params, 64, WIDTH);
    let mut blocks = pre_norm_mlp::Block::all(&params, 64);
    // Each side its own Adam: the store's parameters and the blocks' clones part at the first
    // update (copy on write) and must stay equal bit for bit.
    let (mut adam_hand, mut adam_auto) = (Adam::new(1e-3), Adam::new(1e-3));
    let mut losses = Vec::new();
    // One batch, three steps: the loss must fall.
    for step in 0..3 {
        let (hand_loss, hand_grads) = pool.scope(|s| {
            let x = s.randn::<f32>(&[BATCH, WIDTH], 100);
            let target = s.randn::<f32>(&[BATCH, WIDTH], 200);
            let mut grads = Gradients::new(s);
            let report =
                backward_step(&seq, &params, &mut grads, &x, |y| mse(y, &target), None).unwrap();
            let snapshot: Vec<Vec<f32>> = params
                .iter()
                .map(|(_, p)| grads.get(p).unwrap().to_vec())
                .collect();
            adam_hand.step(&mut params, &grads).unwrap();
            (report.loss, snapshot)
        });
        pool.train(|s| {
            let x = s.randn::<f32>(&[BATCH, WIDTH], 100);
            let target = s.randn::<f32>(&[BATCH, WIDTH], 200);
            let y = blocks.iter().fold(x, |x, b| b.forward(&x));
            let loss = y.try_mse(&target).unwrap();
            assert_eq!(
                loss.item().to_bits(),
                hand_loss.to_bits(),
                "step {step}: loss"
            );
            let grads = loss.backward().unwrap();
            assert_eq!(grads.len(), params.len(), "a gradient for every parameter");
            for ((name, p), want) in params.iter().zip(&hand_grads) {
                assert_eq!(&grads.get(p).unwrap().to_vec(), want, "step {step}: {name}");
            }
            adam_auto.step(&mut blocks, &grads).unwrap();
            losses.push(loss.item());
        });
        let mut updated = Vec::new();
        blocks.for_each_param(&mut |p| updated.push(p.to_vec()));
        for ((name, p), got) in params.iter().zip(&updated) {
            assert_eq!(&p.to_vec(), got, "step {step}: updated {name}");
        }
    }
    assert!(
        losses[2] < losses[0],
        "Adam on autograd gradients trains: {losses:?}"
    );
    drop((seq, blocks, params, adam_hand, adam_auto));
    assert_eq!(pool.stats().bytes_in_use, 0);
}
