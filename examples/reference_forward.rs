//! Runs one variant of the reference forward repeatedly, for measuring peak RSS with
//! `/usr/bin/time -v`.
//!
//! `cargo run --release --example reference_forward -- <plain|pooled|prealloc> <M|E> [iterations]`
//!
//! Prints the median time per forward and, for `pooled`, the pool's figures: misses after the first
//! forward (0 in steady state) and the peak bytes in use against the liveness lower bound derived from
//! the shapes.

#[path = "common/reference_model.rs"]
mod reference_model;

use std::time::Instant;

use reference_model::{Buffers, Shape};
use tensorscope::prelude::*;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: reference_forward <plain|pooled|prealloc> <M|E> [iterations]";
    let (Some(variant), Some(shape)) = (
        args.first(),
        args.get(1).and_then(|s| reference_model::shape_named(s)),
    ) else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let iterations: usize = match args.get(2).map(|n| n.parse()) {
        None => 20,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("iterations must be a positive whole number\n{usage}");
            std::process::exit(2);
        }
    };
    let weights = reference_model::weights(shape);
    let input = reference_model::input(shape);
    let mut times = Vec::new();
    let mut timed = |f: &mut dyn FnMut() -> f32| {
        for _ in 0..iterations {
            let t = Instant::now();
            let checksum = f();
            times.push(t.elapsed().as_secs_f64() * 1e3);
            assert!(checksum.is_finite());
        }
    };
    match variant.as_str() {
        "plain" => timed(&mut || reference_model::plain(&weights, &input)[[0, 0]]),
        "prealloc" => {
            let mut buffers = Buffers::new(shape);
            timed(&mut || reference_model::prealloc(&weights, &input, &mut buffers)[[0, 0]])
        }
        "pooled" => {
            let pool = Pool::with_max_memory_mb(4096);
            let blocks = reference_model::pooled_weights(&pool, &weights);
            let x = Param::try_from_array(&pool, &input).expect("input fits");
            // The pool holds its own copies now; keep no second one alive (it would count in RSS).
            drop((weights, input));
            let mut first = None;
            timed(&mut || {
                let y = pool.scope(|s| reference_model::pooled(&blocks, &s.bind(&x)).as_slice()[0]);
                first.get_or_insert(pool.stats());
                y
            });
            report_pool(&pool, first.expect("ran"), shape);
        }
        other => {
            eprintln!("unknown variant {other}\n{usage}");
            std::process::exit(2);
        }
    }
    times.sort_by(f64::total_cmp);
    println!(
        "{variant} {}: median {:.2} ms per forward over {iterations} forwards",
        shape.name,
        times[times.len() / 2]
    );
}

fn report_pool(pool: &Pool, after_first: tensorscope::PoolStats, shape: Shape) {
    let end = pool.stats();
    let params = after_first.bytes_in_use;
    let bound = reference_model::liveness_bound_bytes(shape);
    println!(
        "pool: {} misses after the first forward; peak {} B in use beyond the {} B of weights and \
         input, against a liveness lower bound of {} B ({:.2}x)",
        end.misses - after_first.misses,
        end.peak_bytes_in_use - params,
        params,
        bound,
        (end.peak_bytes_in_use - params) as f64 / bound as f64
    );
}
