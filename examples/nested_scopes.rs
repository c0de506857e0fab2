//! Scopes inside scopes: per-iteration scopes in an outer one, an outer accumulator fed by explicit
//! escapes, a helper that returns a tensor to its caller's scope, and `detach` into a `Param` for a
//! value kept across calls. Prints each scope's counters: every scope released or escaped what it
//! rented.
//!
//! `cargo run --release --example nested_scopes`

use tensorscope::prelude::*;
use tensorscope::ScopeStats;

/// Returns a tensor to its caller's scope: the result carries the caller's brand `'a`, its
/// temporaries die here.
#[dispose_scope]
fn normalized<'a>(x: &Tensor<'a>) -> Tensor<'a> {
    let centered = x - &x.mean(0).reshape(&[1]);
    let norm = (&centered * &centered).sum(0).map(f32::sqrt).reshape(&[1]);
    &centered / &norm
}

fn row(name: &str, s: &ScopeStats) {
    println!(
        "{name:<22} {:>7} {:>9} {:>8} {:>8} {:>7} {:>11}",
        s.rented, s.released, s.escaped, s.adopted, s.leaked, s.peak_bytes_in_use
    );
}

fn main() {
    let pool = Pool::with_max_memory_mb(64);
    // A value kept across calls: a parameter, it belongs to no scope and lives while it has handles.
    let mut running_mean: Param = Param::zeros(&pool, &[256]);
    let mut per_step = Vec::new();

    let ((), outer) = pool.scope_with_stats(|s| {
        let mut total = s.zeros::<f32>(&[256]);
        for step in 0..5u64 {
            let ((), inner) = s.scope_with_stats(|iteration| {
                let x = iteration.randn::<f32>(&[256], step);
                let y = normalized(&x); // rented in `iteration`'s child, escaped to `iteration`
                let scaled = &y * (step as f32 + 1.0);
                // The accumulator belongs to the outer scope: the new sum leaves on purpose.
                total = iteration.escape(&total + &scaled);
                // Keep the running mean across calls: detached into a parameter of its own. A
                // parameter has no ops, so the old mean takes part bound into this scope.
                running_mean = (iteration.bind(&running_mean) * 0.8 + &(&y * 0.2)).detach();
            });
            per_step.push(inner);
        }
        let checksum: f32 = total.view().iter().map(|v| v.abs()).sum();
        println!("sum of |total| after 5 steps: {checksum:.4}");
    });

    println!(
        "\n{:<22} {:>7} {:>9} {:>8} {:>8} {:>7} {:>11}",
        "scope", "rented", "released", "escaped", "adopted", "leaked", "peak bytes"
    );
    for (i, s) in per_step.iter().enumerate() {
        row(&format!("iteration {i}"), s);
    }
    row("outer", &outer);
    for s in per_step.iter().chain([&outer]) {
        assert_eq!(
            s.rented + s.adopted,
            s.released + s.escaped,
            "every buffer accounted for"
        );
        assert_eq!(s.leaked, 0);
    }
    println!(
        "\nEach iteration adopts the result of `normalized` (its child scope), rents its own temporaries, \
         and escapes two buffers: the new sum to the outer scope and the new running mean (detached). \
         The outer scope adopts the sums and releases each when the next replaces it. Outside every \
         scope only the detached running mean is in use: {} B.",
        pool.stats().bytes_in_use
    );
    assert_eq!(pool.stats().bytes_in_use, running_mean.allocated_bytes());
}
