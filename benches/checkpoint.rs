//! Checkpointed forward against a plain one: stored bytes and forward time per policy, n = 16 and
//! 64 layers of width 256 at batch 64.
//!
//! `cargo bench --bench checkpoint`
//!
//! The stored-bytes figures are printed once per configuration before timing (they do not vary).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Policy, Precision};

const WIDTH: usize = 256;
const BATCH: usize = 64;

fn layer<'s>(x: &Tensor<'s>, w: &Param) -> Tensor<'s> {
    x.matmul(w).tanh()
}

fn forward(c: &mut Criterion) {
    let pool = Pool::with_max_memory_mb(1024);
    let mut g = c.benchmark_group("checkpoint_forward");
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    g.sample_size(30);
    for n in [16usize, 64] {
        let weights: Vec<Param> = (0..n)
            .map(|i| pool.scope(|s| (s.randn::<f32>(&[WIDTH, WIDTH], i as u64) * 0.06).detach()))
            .collect();
        let layers: Vec<usize> = (0..n).collect();
        pool.scope(|s| {
            let input = s.randn::<f32>(&[BATCH, WIDTH], 99);
            let activation_bytes = input.data_bytes();

            g.bench_function(BenchmarkId::new("none", n), |b| {
                b.iter(|| {
                    let mut x = input.clone();
                    for &i in &layers {
                        x = layer(&x, &weights[i]);
                    }
                    black_box(x)
                })
            });
            let configs = [
                ("every4", CheckpointConfig::new(Policy::Every(4))),
                ("sqrt", CheckpointConfig::new(Policy::Sqrt)),
                (
                    "explicit_half",
                    CheckpointConfig::new(Policy::Explicit(vec![n / 2])),
                ),
                (
                    "sqrt_f16",
                    CheckpointConfig::new(Policy::Sqrt).with_precision(Precision::F16),
                ),
                (
                    "budget4",
                    CheckpointConfig::new(Policy::Budget(4 * activation_bytes)),
                ),
            ];
            for (name, config) in configs {
                let mut ckpt = Checkpointer::new(config);
                ckpt.checkpointed_forward(&input, &layers, |x, i| layer(x, &weights[i]))
                    .unwrap();
                println!(
                    "checkpoint n={n} {name}: stored {} B in {} checkpoints; all activations {} B",
                    ckpt.memory_stored_bytes(),
                    ckpt.num_checkpoints(),
                    n * activation_bytes
                );
                g.bench_function(BenchmarkId::new(name, n), |b| {
                    b.iter(|| {
                        black_box(
                            ckpt.checkpointed_forward(&input, &layers, |x, i| {
                                layer(x, &weights[i])
                            })
                            .unwrap(),
                        )
                    })
                });
            }
        });
    }
    g.finish();
}

criterion_group!(benches, forward);
criterion_main!(benches);
