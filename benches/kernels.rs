//! The vectorised kernels of the transcendental ops, in time per element (criterion's throughput):
//! each op on 2^15 `f32` values spread over [-8, 8] (small enough to run on one thread), against
//! the same function computed with libm one element at a time into a preallocated buffer
//! (`std`'s `tanhf`, `expf`, `logf`; the `libm` crate's `erff`, `erfcf`); softmax over rows of
//! 1024; layer norm over rows of 1024 (no libm counterpart); and each op's forward and backward in
//! a training scope (the derivative loops).
//!
//! `cargo bench --bench kernels`

use std::f32::consts::FRAC_1_SQRT_2;
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tensorscope::prelude::*;

const N: usize = 1 << 15;

type Op = dyn for<'s> Fn(&Tensor<'s, f32>) -> Tensor<'s, f32>;

fn logistic(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// An op's name, the op, and its libm counterpart.
type Case = (&'static str, Box<Op>, fn(f32) -> f32);

/// Each op, and its libm counterpart.
fn ops() -> Vec<Case> {
    vec![
        ("tanh", Box::new(|t| t.tanh()), f32::tanh),
        ("exp", Box::new(|t| t.exp()), f32::exp),
        // On |x|, so that every value has a logarithm.
        ("log", Box::new(|t| t.abs().log()), |x| x.abs().ln()),
        ("erf", Box::new(|t| t.erf()), libm::erff),
        ("gelu", Box::new(|t| t.gelu()), |x| {
            let c = (2.0 / std::f32::consts::PI).sqrt();
            0.5 * x * (1.0 + (c * (x + 0.044_715 * x * x * x)).tanh())
        }),
        ("gelu_erf", Box::new(|t| t.gelu_erf()), |x| {
            x * 0.5 * libm::erfcf(-x * FRAC_1_SQRT_2)
        }),
        ("sigmoid", Box::new(|t| t.sigmoid()), logistic),
        ("silu", Box::new(|t| t.silu()), |x| x * logistic(x)),
    ]
}

fn setup(g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>) {
    g.sample_size(30);
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(2));
    g.throughput(Throughput::Elements(N as u64));
}

fn forward(c: &mut Criterion) {
    let xs: Vec<f32> = (0..N).map(|i| (i as f32 / N as f32 - 0.5) * 16.0).collect();
    let pool = Pool::with_max_memory_mb(64);
    let x = Param::from_slice(&pool, &[N], &xs);
    let mut g = c.benchmark_group("kernels");
    setup(&mut g);
    let mut out = vec![0f32; N];
    for (name, op, libm_f) in ops() {
        g.bench_function(BenchmarkId::new("tensorscope", name), |b| {
            b.iter(|| pool.scope(|s| black_box(op(&s.bind(&x)).as_slice().unwrap()[0])))
        });
        g.bench_function(BenchmarkId::new("libm", name), |b| {
            b.iter(|| {
                for (o, &v) in out.iter_mut().zip(&xs) {
                    *o = libm_f(v);
                }
                black_box(out[0])
            })
        });
    }
    let rows = x.clone();
    g.bench_function(BenchmarkId::new("tensorscope", "softmax [32, 1024]"), |b| {
        b.iter(|| {
            pool.scope(|s| {
                black_box(
                    s.bind(&rows)
                        .reshape(&[32, 1024])
                        .softmax(-1)
                        .as_slice()
                        .unwrap()[0],
                )
            })
        })
    });
    g.bench_function(
        BenchmarkId::new("tensorscope", "layer_norm [32, 1024]"),
        |b| {
            b.iter(|| {
                pool.scope(|s| {
                    black_box(
                        s.bind(&rows)
                            .reshape(&[32, 1024])
                            .layer_norm(1e-5)
                            .as_slice()
                            .unwrap()[0],
                    )
                })
            })
        },
    );
    g.bench_function(BenchmarkId::new("libm", "softmax [32, 1024]"), |b| {
        b.iter(|| {
            for (o, x) in out.chunks_exact_mut(1024).zip(xs.chunks_exact(1024)) {
                let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0.0;
                for (o, &v) in o.iter_mut().zip(x) {
                    *o = (v - max).exp();
                    sum += *o;
                }
                o.iter_mut().for_each(|v| *v /= sum);
            }
            black_box(out[0])
        })
    });
    g.finish();
}

fn backward(c: &mut Criterion) {
    let xs: Vec<f32> = (0..N).map(|i| (i as f32 / N as f32 - 0.5) * 16.0).collect();
    let pool = Pool::with_max_memory_mb(64);
    let x = Param::from_slice(&pool, &[N], &xs);
    let mut g = c.benchmark_group("kernels_forward_backward");
    setup(&mut g);
    let mut ops = ops();
    ops.push((
        "softmax [32, 1024]",
        Box::new(|t| t.reshape(&[32, 1024]).softmax(-1)),
        f32::exp,
    ));
    ops.push((
        "layer_norm [32, 1024]",
        Box::new(|t| t.reshape(&[32, 1024]).layer_norm(1e-5)),
        f32::exp,
    ));
    for (name, op, _) in ops {
        g.bench_function(name, |b| {
            b.iter(|| {
                pool.train(|s| {
                    let x = s.bind(&x).requires_grad();
                    let y = op(&x).reshape(&[N]);
                    let grads = y.backward_with(&s.ones::<f32>(&[N])).unwrap();
                    black_box(grads.of(&x).unwrap().as_slice().unwrap()[0])
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, forward, backward);
criterion_main!(benches);
