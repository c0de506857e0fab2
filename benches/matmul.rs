//! Matrix products of the reference forwards' shapes: tensorscope's `matmul` (its own packed FMA
//! kernels, `runtime/src/ops/gemm.rs`) on every core, into an output rented from the pool.
//!
//! `cargo bench --bench matmul [-- decode]`
//!
//! Group `decode` (issue 28): the products of a decode step, `[m, k]` activations times a weight
//! kept as PyTorch's `[out, in]` and read through its transposed view, `x.matmul(&w.t())`, as
//! the Llama example and a tied LM head read theirs: GPT-2's head (`wte`, 50257 x 768) at m = 1 and at
//! a 512-token prefill, and a small Llama's projections at m = 1 and 8.
//!
//! The comparison with other libraries (matrixmultiply, gemm, faer, OpenBLAS) on these shapes and
//! more is the `peers` crate's bench, outside the workspace: `cd peers && cargo bench`.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tensorscope::prelude::*;

fn products(c: &mut Criterion) {
    let shapes = [("M", 256, 1024, 1024), ("E", 16384, 64, 64)];
    group(c, "matmul", &shapes, Layout::RowMajor, 4);
}

/// `(name, m, k, n)`: `[m, k] x [n, k]^T`.
const DECODE: [(&str, usize, usize, usize); 12] = [
    ("head_gpt2_m1", 1, 768, 50257),
    ("head_gpt2_m512", 512, 768, 50257),
    ("q_m1", 1, 768, 768),
    ("q_m8", 8, 768, 768),
    ("kv_m1", 1, 768, 256),
    ("kv_m8", 8, 768, 256),
    ("up_m1", 1, 768, 2048),
    ("up_m8", 8, 768, 2048),
    ("down_m1", 1, 2048, 768),
    ("down_m8", 8, 2048, 768),
    ("head_llama_m1", 1, 768, 32000),
    ("head_llama_m8", 8, 768, 32000),
];

fn decode(c: &mut Criterion) {
    group(c, "decode", &DECODE, Layout::Transposed, 3);
}

/// How a group's weights lie.
#[derive(Clone, Copy, PartialEq)]
enum Layout {
    /// `[k, n]`, multiplied as it lies.
    RowMajor,
    /// `[n, k]` (PyTorch's `[out, in]`), multiplied through its transposed view.
    Transposed,
}

/// The group `name`: for each `(name, m, k, n)` of `shapes`, the product of an `[m, k]` operand and
/// a `[k, n]` weight laid out as `layout` says, each measured for `seconds`.
fn group(
    c: &mut Criterion,
    name: &str,
    shapes: &[(&str, usize, usize, usize)],
    layout: Layout,
    seconds: u64,
) {
    let mut g = c.benchmark_group(name);
    g.sample_size(20);
    g.warm_up_time(Duration::from_secs(1));
    g.measurement_time(Duration::from_secs(seconds));
    for &(name, m, k, n) in shapes {
        g.throughput(Throughput::Elements((2 * m * k * n) as u64));
        let pool = Pool::with_max_memory_mb(1024);
        let stored = match layout {
            Layout::RowMajor => [k, n],
            Layout::Transposed => [n, k],
        };
        let (x, w) = pool.scope(|s| {
            (
                s.randn::<f32>(&[m, k], 1).detach(),
                s.randn::<f32>(&stored, 2).detach(),
            )
        });
        g.bench_function(BenchmarkId::new("tensorscope", name), |bench| {
            bench.iter(|| {
                pool.scope(|s| {
                    let w = match layout {
                        Layout::RowMajor => s.bind(&w),
                        Layout::Transposed => s.bind(&w).t(),
                    };
                    black_box(s.bind(&x).matmul(&w).as_slice().unwrap()[0])
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, products, decode);
criterion_main!(benches);
