//! `f32` matrix products on 2 threads: tensorscope's `matmul` against matrixmultiply, the `gemm`
//! crate, faer and (with `--features blas`) OpenBLAS, on the shapes of `tensorscope_peers::SHAPES`.
//! Throughput is in elements per second with 2mkn elements per product, i.e. FLOP/s.
//!
//! From `peers/`:
//! `cargo bench --bench matmul [--features blas] -- [--warm-up-time 1 --measurement-time 3]`

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use tensorscope_peers::{blas_info, candidates, use_threads, Operands, SHAPES, THREADS};

fn products(c: &mut Criterion) {
    if let Some(info) = blas_info() {
        eprintln!("OpenBLAS: {info}");
    }
    eprintln!("threads per product: {THREADS}");
    for shape in SHAPES {
        let operands = Operands::new(shape);
        let mut list = candidates(&operands);
        for candidate in &mut list {
            // Warms the candidate up too (packing buffers, thread pools, pool buffers).
            if let Err(wrong) = candidate.check(&operands) {
                panic!("{wrong}");
            }
        }
        let mut g = c.benchmark_group(format!("peers/{}", shape.name));
        g.throughput(Throughput::Elements(shape.flops()));
        for candidate in &mut list {
            g.bench_function(BenchmarkId::from_parameter(candidate.name()), |bench| {
                bench.iter(|| candidate.run())
            });
        }
        g.finish();
    }
}

fn main() {
    // Before anything starts a thread or reads the variables.
    use_threads();
    // 30 benchmarks in a few minutes; command-line options override these.
    let mut c = Criterion::default()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    products(&mut c);
    c.final_summary();
}
