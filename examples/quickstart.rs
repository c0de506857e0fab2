//! The README's first example as it stands there (a residual MLP block, three steps on the default
//! pool), printing the pool's figures after the weights are made and after every step, and what the
//! block's own scope did.
//!
//! `cargo run --release --example quickstart`

use tensorscope::prelude::*;
use tensorscope::{PoolStats, ScopeStats};

/// The block's weights: kept outside every scope, no ops.
struct BlockParams {
    w1: Param,
    w2: Param,
}

#[dispose_scope]
fn block<'a>(x: &Tensor<'a>, p: &BlockParams) -> Tensor<'a> {
    let h = x.matmul(&p.w1).gelu(); // rented from the pool, released when dropped
    &h.matmul(&p.w2) + x // the result is escaped to the caller's scope
}

fn row(when: &str, p: &PoolStats) {
    println!(
        "{when:>8} {:>6} {:>7} {:>8} {:>10} {:>10} {:>10}",
        p.hits, p.misses, p.returns, p.bytes_in_use, p.bytes_cached, p.peak_bytes_in_use
    );
}

fn main() {
    // `tensorscope::scope` opens a scope on the default pool, `Pool::global()` (4096 MiB budget).
    let p = tensorscope::scope(|s| BlockParams {
        w1: (s.randn::<f32>(&[64, 256], 1) * 0.05).detach(),
        w2: (s.randn::<f32>(&[256, 64], 2) * 0.05).detach(),
    });
    let pool = Pool::global();

    println!("A [32, 64] input through the block x + gelu(x W1) W2 (64 -> 256 -> 64), 3 steps.\n");
    println!(
        "{:>8} {:>6} {:>7} {:>8} {:>10} {:>10} {:>10}",
        "after", "hits", "misses", "returns", "in use B", "cached B", "peak B"
    );
    let weights = pool.stats();
    row("weights", &weights);
    let mut first_step = weights;
    let mut block_scope = ScopeStats::default();
    for step in 0..3 {
        let misses_before = pool.stats().misses;
        tensorscope::scope(|s| {
            let x = s.randn::<f32>(&[32, 64], 100 + step);
            let y = block(&x, &p);
            assert_eq!(y.shape(), &[32, 64]);
            block_scope = s
                .last_child_stats()
                .expect("the block ran in a child scope");
        });
        row(&format!("step {step}"), &pool.stats());
        if step == 0 {
            first_step = pool.stats();
        } else {
            assert_eq!(pool.stats().misses, misses_before); // every buffer came from the pool
        }
    }

    let end = pool.stats();
    println!(
        "\nThe weights took {} buffers ({} B, in use to the end: parameters live outside every scope).",
        weights.misses, weights.bytes_in_use
    );
    println!(
        "Step 0 allocated {} more; steps 1 and 2 allocated none: all {} of their rents were hits.",
        first_step.misses - weights.misses,
        end.hits - first_step.hits
    );
    println!(
        "Between steps only the weights are in use ({} B); a step's buffers wait in the pool.",
        end.bytes_in_use
    );
    println!(
        "The block's own scope in the last step: rented {}, released {}, escaped {} (the result), \
         leaked {}, peak {} B in use.",
        block_scope.rented,
        block_scope.released,
        block_scope.escaped,
        block_scope.leaked,
        block_scope.peak_bytes_in_use
    );
}
