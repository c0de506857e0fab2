//! Matrix products of the reference forwards' shapes: tensorscope's `matmul` (its own packed FMA
//! kernels, `runtime/src/ops/gemm.rs`) on every core, into an output rented from the pool.
//!
//! `cargo bench --bench matmul`
//!
//! The comparison with other libraries (matrixmultiply, gemm, faer, OpenBLAS) on these shapes and
//! more is the `peers` crate's bench, outside the workspace: `cd peers && cargo bench`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tensorscope::prelude::*;

fn products(c: &mut Criterion) {
    let mut g = c.benchmark_group("matmul");
    g.sample_size(20);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(4));
    for (name, m, k, n) in [("M", 256, 1024, 1024), ("E", 16384, 64, 64)] {
        g.throughput(Throughput::Elements((2 * m * k * n) as u64));
        let pool = Pool::with_max_memory_mb(512);
        let (a, b) = pool.scope(|s| {
            (
                s.randn::<f32>(&[m, k], 1).detach(),
                s.randn::<f32>(&[k, n], 2).detach(),
            )
        });
        g.bench_function(BenchmarkId::new("tensorscope", name), |bench| {
            bench.iter(|| pool.scope(|s| black_box(s.bind(&a).matmul(&b).as_slice().unwrap()[0])))
        });
    }
    g.finish();
}

criterion_group!(benches, products);
criterion_main!(benches);
