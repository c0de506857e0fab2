//! `#[dispose_scope]` against the same forward written by hand against the runtime API.
//!
//! `cargo bench --bench dispose`
//!
//! Both run `x + gelu(x W1) W2` in a child scope and escape the result; the ratio of their medians
//! is the cost of the expansion (it should be 1.00).

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use tensorscope::prelude::*;

struct Block {
    w1: Param,
    w2: Param,
}

impl Block {
    #[dispose_scope]
    fn annotated<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        let h = x.matmul(&self.w1).gelu();
        &h.matmul(&self.w2) + x
    }

    fn by_hand<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        x.child_scope(|inner| {
            let x = inner.rebind(x);
            let h = x.matmul(&self.w1).gelu();
            inner.escape(&h.matmul(&self.w2) + &x)
        })
    }
}

fn forward(c: &mut Criterion) {
    let mut g = c.benchmark_group("dispose_scope");
    g.warm_up_time(Duration::from_millis(500));
    g.measurement_time(Duration::from_secs(3));
    for (batch, width, hidden) in [(8, 64, 128), (64, 256, 1024)] {
        let label = format!("{batch}x{width}x{hidden}");
        let pool = Pool::with_max_memory_mb(256);
        let block = pool.scope(|s| Block {
            w1: (s.randn::<f32>(&[width, hidden], 1) * 0.05).detach(),
            w2: (s.randn::<f32>(&[hidden, width], 2) * 0.05).detach(),
        });
        let misses_after_warm_up = pool.scope(|s| {
            let x = s.randn::<f32>(&[batch, width], 3);
            assert_eq!(block.annotated(&x).to_vec(), block.by_hand(&x).to_vec());
            let misses = pool.stats().misses;
            g.bench_function(BenchmarkId::new("annotated", &label), |b| {
                b.iter(|| black_box(block.annotated(black_box(&x))))
            });
            g.bench_function(BenchmarkId::new("by_hand", &label), |b| {
                b.iter(|| black_box(block.by_hand(black_box(&x))))
            });
            misses
        });
        assert_eq!(
            pool.stats().misses,
            misses_after_warm_up,
            "no allocation while measuring"
        );
    }
    g.finish();
}

criterion_group!(benches, forward);
criterion_main!(benches);
