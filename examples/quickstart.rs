//! A residual MLP block run for a few steps on the default pool, with pool stats before and after.
//!
//! `cargo run --release --example quickstart`

use tensorscope::prelude::*;
use tensorscope::{PoolStats, ScopeStats};

/// Weights of one block, kept across steps: parameters, outside every scope.
struct BlockParams {
    w1: Param,
    w2: Param,
}

/// `x + gelu(x W1) W2`. Everything it rents lives in its own child scope of the caller's and is
/// released when dropped; the result is escaped to the caller.
#[dispose_scope]
fn block<'a>(x: &Tensor<'a>, p: &BlockParams) -> Tensor<'a> {
    let h = x.matmul(&p.w1).gelu(); // `gelu` runs in the matmul's buffer
    &h.matmul(&p.w2) + x
}

fn row(step: &str, p: &PoolStats) {
    println!(
        "{step:>6} {:>6} {:>6} {:>8} {:>12} {:>12} {:>12}",
        p.hits, p.misses, p.returns, p.bytes_in_use, p.bytes_cached, p.peak_bytes_in_use
    );
}

fn main() {
    let (width, hidden, batch) = (256, 1024, 64);
    let params = tensorscope::scope(|s| BlockParams {
        w1: (s.randn::<f32>(&[width, hidden], 1) * 0.03).detach(),
        w2: (s.randn::<f32>(&[hidden, width], 2) * 0.03).detach(),
    });
    let pool = Pool::global();
    println!(
        "a {batch}x{width} input through a {width}->{hidden}->{width} residual block, 5 steps\n"
    );
    println!(
        "{:>6} {:>6} {:>6} {:>8} {:>12} {:>12} {:>12}",
        "step", "hits", "misses", "returns", "in use B", "cached B", "peak B"
    );
    row("before", &pool.stats());
    let mut inner_stats = ScopeStats::default();
    let mut misses_after_first = 0;
    for step in 0..5 {
        let norm = tensorscope::scope(|s| {
            let x = s.randn::<f32>(&[batch, width], 100 + step);
            let y = block(&x, &params);
            inner_stats = s.last_child_stats().expect("block opened a child scope");
            let sq = &y * &y;
            sq.sum(1).mean(0).to_vec()[0].sqrt()
        });
        row(&step.to_string(), &pool.stats());
        assert!(norm.is_finite());
        if step == 0 {
            misses_after_first = pool.stats().misses;
        }
    }
    let s = inner_stats;
    let end = pool.stats();
    println!(
        "\n'before' holds the two weight matrices (2 misses). Step 0 allocated {} buffers; steps 1-4 \
         allocated none: every rent was a hit.",
        misses_after_first - 2
    );
    println!(
        "Between steps only the weights stay in use ({} B); the step's buffers wait in the pool, cached.",
        end.bytes_in_use
    );
    println!(
        "The block's own scope in the last step: rented {}, released {}, escaped {} (the result), \
         leaked {}, peak {} B.",
        s.rented, s.released, s.escaped, s.leaked, s.peak_bytes_in_use
    );
    assert_eq!(end.misses, misses_after_first);
}
