//! Rent + return of a cached pool buffer against a fresh zeroed allocation, 4 KiB to 64 MiB.
//!
//! `cargo bench --bench pool`
//!
//! - `alloc`: obtain a buffer and drop it, touching nothing. The fresh allocations are `vec![0f32; n]`
//!   (calloc: large blocks come as lazily zeroed pages) and `ndarray::Array1::zeros`.
//! - `alloc_fill`: obtain a buffer, write every element once, drop it: what a forward pass does with
//!   an activation, including the page faults a fresh allocation pays on first touch.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tensorscope::{Pool, PoolConfig};

const SIZES: [(usize, &str); 4] = [
    (4 << 10, "4KiB"),
    (256 << 10, "256KiB"),
    (4 << 20, "4MiB"),
    (64 << 20, "64MiB"),
];

fn config<'c>(
    c: &'c mut Criterion,
    group: &str,
    bytes: usize,
) -> criterion::BenchmarkGroup<'c, criterion::measurement::WallTime> {
    let mut g = c.benchmark_group(group);
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(if bytes >= 4 << 20 { 3 } else { 2 }));
    g.sample_size(if bytes >= 64 << 20 { 20 } else { 50 });
    g.throughput(Throughput::Bytes(bytes as u64));
    g
}

fn alloc(c: &mut Criterion) {
    for (bytes, label) in SIZES {
        let n = bytes / 4;
        let pool = Pool::new(PoolConfig::default());
        drop(pool.rent::<f32>(&[n])); // warm: the buffer is cached from here on
        let mut g = config(c, "alloc", bytes);
        g.bench_function(BenchmarkId::new("pool_rent_return", label), |b| {
            b.iter(|| drop(black_box(pool.rent::<f32>(black_box(&[n])))))
        });
        g.bench_function(BenchmarkId::new("pool_rent_zeroed_return", label), |b| {
            b.iter(|| drop(black_box(pool.rent_zeroed::<f32>(black_box(&[n])))))
        });
        g.bench_function(BenchmarkId::new("vec_zeroed", label), |b| {
            b.iter(|| drop(black_box(vec![0f32; black_box(n)])))
        });
        g.bench_function(BenchmarkId::new("ndarray_zeros", label), |b| {
            b.iter(|| drop(black_box(ndarray::Array1::<f32>::zeros(black_box(n)))))
        });
        g.finish();
        assert_eq!(pool.stats().misses, 1, "every measured rent was a hit");
    }
}

fn alloc_fill(c: &mut Criterion) {
    for (bytes, label) in SIZES {
        let n = bytes / 4;
        let pool = Pool::new(PoolConfig::default());
        drop(pool.rent::<f32>(&[n]));
        let mut g = config(c, "alloc_fill", bytes);
        g.bench_function(BenchmarkId::new("pool_rent_return", label), |b| {
            b.iter(|| {
                let mut buf = pool.rent::<f32>(black_box(&[n]));
                buf.fill(1.0);
                drop(black_box(buf))
            })
        });
        g.bench_function(BenchmarkId::new("vec_zeroed", label), |b| {
            b.iter(|| {
                let mut buf = vec![0f32; black_box(n)];
                buf.fill(1.0);
                drop(black_box(buf))
            })
        });
        g.finish();
    }
}

criterion_group!(benches, alloc, alloc_fill);
criterion_main!(benches);
