//! `f32` matrix products on 2 threads (`PEERS_THREADS=1`: one): tensorscope's `matmul` against
//! matrixmultiply, the `gemm` crate, faer and (with `--features blas`) OpenBLAS, on the shapes of
//! `tensorscope_peers::SHAPES` and `TRANSFORMER_SHAPES`. Throughput is in elements per second
//! with 2mkn elements per product, i.e. FLOP/s. Groups are `peers/SHAPE` on 2 threads and
//! `peers_tN/SHAPE` on N others.
//!
//! From `peers/`:
//! `[PEERS_THREADS=1] cargo bench --bench matmul [--features blas] -- [--warm-up-time 1
//! --measurement-time 3] [FILTER]`

use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use tensorscope_peers::{
    blas_info, candidates, threads, use_threads, Operands, SHAPES, TRANSFORMER_SHAPES,
};

fn products(c: &mut Criterion) {
    if let Some(info) = blas_info() {
        eprintln!("OpenBLAS: {info}");
    }
    let threads = threads();
    eprintln!("threads per product: {threads}");
    let group = match threads {
        2 => "peers".to_string(),
        n => format!("peers_t{n}"),
    };
    for shape in SHAPES.into_iter().chain(TRANSFORMER_SHAPES) {
        let operands = Operands::new(shape);
        let mut list = candidates(&operands);
        for candidate in &mut list {
            // Warms the candidate up too (packing buffers, thread pools, pool buffers).
            if let Err(wrong) = candidate.check(&operands) {
                panic!("{wrong}");
            }
        }
        let mut g = c.benchmark_group(format!("{group}/{}", shape.name));
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
