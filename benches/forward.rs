//! The reference forwards M (matmul-bound) and E (memory-bound) three ways, an elementwise chain by
//! reference against by value, and E from one and two threads sharing one model and one pool.
//!
//! `cargo bench --bench forward`

#[path = "../examples/common/reference_model.rs"]
mod reference_model;

use std::hint::black_box;
use std::ops::Neg;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use reference_model::{Buffers, Shape, E, M};
use tensorscope::prelude::*;

fn three_ways(c: &mut Criterion, shape: Shape) {
    let mut g = c.benchmark_group(format!("forward_{}", shape.name));
    g.sample_size(10);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(5));
    let weights = reference_model::weights(shape);
    let input = reference_model::input(shape);

    g.bench_function("a_plain", |b| {
        b.iter(|| black_box(reference_model::plain(&weights, &input)))
    });

    let pool = Pool::with_max_memory_mb(4096);
    let blocks = reference_model::pooled_params(&pool, shape, reference_model::BLOCKS);
    let x = reference_model::pooled_input(&pool, shape);
    pool.scope(|s| drop(reference_model::pooled(&blocks, &s.bind(&x))));
    let misses = pool.stats().misses;
    g.bench_function("b_pooled", |b| {
        b.iter(|| {
            pool.scope(|s| {
                black_box(
                    reference_model::pooled(&blocks, &s.bind(&x))
                        .as_slice()
                        .unwrap()[0],
                )
            })
        })
    });
    assert_eq!(
        pool.stats().misses,
        misses,
        "no pool miss after the first forward"
    );

    let mut buffers = Buffers::new(shape);
    g.bench_function("c_prealloc", |b| {
        b.iter(|| black_box(reference_model::prealloc(&weights, &input, &mut buffers)[[0, 0]]))
    });
    g.finish();
}

fn forwards(c: &mut Criterion) {
    three_ways(c, M);
    three_ways(c, E);
}

/// Eight cheap elementwise ops on a 16 MiB tensor (memory-bound): each renting a new buffer, or
/// each writing in place.
fn elementwise(c: &mut Criterion) {
    let mut g = c.benchmark_group("elementwise_16MiB_x8");
    g.sample_size(20);
    // Each op reads and writes 16 MiB.
    g.throughput(Throughput::Bytes(8 * 2 * (16 << 20)));
    let pool = Pool::with_max_memory_mb(1024);
    let n = 4 << 20;
    pool.scope(|s| {
        let x = s.randn::<f32>(&[n], 1);
        g.bench_function("by_reference", |b| {
            b.iter(|| {
                let y = &x * 2.0;
                let y = (&y).relu();
                let y = &y + 1.0;
                let y = -&y;
                let y = &y * 0.5;
                let y = (&y).relu();
                let y = &y - 1.0;
                let y = (&y).map(|v| v * v);
                black_box(y.as_slice().unwrap()[0])
            })
        });
        let misses = pool.stats().misses;
        g.bench_function("by_value", |b| {
            b.iter(|| {
                // The first op reads the shared `x` and so rents; the other seven run in place.
                let y = ((&x * 2.0).relu() + 1.0).neg() * 0.5;
                let y = (y.relu() - 1.0).map(|v| v * v);
                black_box(y.as_slice().unwrap()[0])
            })
        });
        assert_eq!(pool.stats().misses, misses, "by value allocates nothing");
    });
    g.finish();
}

/// E on one thread, and on two threads at once: one model and one input, `Param`s shared by
/// reference, on one pool; each thread runs its forward in its own scope.
fn threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("forward_E_threads");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(8));
    let pool = Pool::with_max_memory_mb(4096);
    let blocks = reference_model::pooled_params(&pool, E, reference_model::BLOCKS);
    let x = reference_model::pooled_input(&pool, E);
    let shared_bytes = pool.stats().bytes_in_use;
    let run = || {
        pool.scope(|s| {
            reference_model::pooled(&blocks, &s.bind(&x))
                .as_slice()
                .unwrap()[0]
        })
    };
    for threads in [1usize, 2] {
        g.throughput(Throughput::Elements(threads as u64));
        g.bench_function(BenchmarkId::new("forwards", threads), |b| {
            b.iter(|| {
                std::thread::scope(|t| {
                    let handles: Vec<_> = (0..threads).map(|_| t.spawn(run)).collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().expect("no panic"))
                        .sum::<f32>()
                })
            })
        });
    }
    g.finish();
    assert_eq!(
        pool.stats().bytes_in_use,
        shared_bytes,
        "only the shared weights and input stay in use"
    );
}

criterion_group!(benches, forwards, elementwise, threads);
criterion_main!(benches);
