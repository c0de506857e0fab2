//! The reference forwards of the benchmarks (16 residual MLP blocks, `examples/common/
//! reference_model.rs`), each written three ways: (a) `plain` ndarray with a fresh array per op,
//! (b) `pooled` tensorscope, (c) `prealloc`, hand-written into buffers allocated once.
//!
//! `cargo run --release --example reference_forward` runs every variant on both shapes (M: batch
//! 256, width 1024; E: batch 16384, width 64), each in a process of its own so that each peak RSS
//! is its own, and prints a table: median time per forward, peak RSS, and for `pooled` the pool's
//! figures (misses after the first forward, peak bytes in use against the liveness lower bound).
//!
//! `cargo run --release --example reference_forward -- <plain|pooled|prealloc> <M|E> [forwards]`
//! runs one of them (20 forwards unless given), for timing or for `/usr/bin/time -v`.
//!
//! `cargo run --release --example reference_forward -- pooled <M|E> [forwards] --callers N` runs
//! the pooled forward on N threads at once, each its own forwards on one shared model and pool
//! (requests served side by side), and prints the median time of a forward and the forwards per
//! second of all of them.

#[path = "common/reference_model.rs"]
mod reference_model;

use std::process::{exit, Command};
use std::time::Instant;

use reference_model::{Buffers, Shape};
use tensorscope::prelude::*;

const USAGE: &str =
    "usage: reference_forward [<plain|pooled|prealloc> <M|E> [forwards] [--callers N]]";
const VARIANTS: [&str; 3] = ["plain", "pooled", "prealloc"];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        return table();
    }
    let (Some(variant), Some(shape)) = (
        args.first().filter(|v| VARIANTS.contains(&v.as_str())),
        args.get(1).and_then(|s| reference_model::shape_named(s)),
    ) else {
        fail(&format!("unknown variant or shape: {}", args.join(" ")));
    };
    let forwards = match args.get(2).map(|n| n.parse()) {
        None => 20,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => fail("the number of forwards must be a positive whole number"),
    };
    // `--row-only`: the table's own runs (below) print their row without the header.
    let row_only = match args.get(3).map(String::as_str) {
        None => false,
        Some("--row-only") if args.len() == 4 => true,
        Some("--callers") if variant == "pooled" && args.len() == 5 => match args[4].parse() {
            Ok(callers) if callers > 0 => return concurrent(shape, forwards, callers),
            _ => fail("the number of callers must be a positive whole number"),
        },
        Some(_) => fail(&format!("unexpected arguments: {}", args[3..].join(" "))),
    };
    let run = run(variant, shape, forwards);
    if !row_only {
        header();
    }
    println!(
        "{variant:<9} {:<5} {:>9.2} {:>13} {:>20} {:>20}",
        shape.name,
        run.median_ms,
        peak_rss().map_or("unknown".into(), |kb| format!("{:.1}", kb as f64 / 1024.0)),
        run.misses.map_or("-".into(), |m| m.to_string()),
        run.peak_over_bound
            .map_or("-".into(), |r| format!("{r:.2}x")),
    );
}

fn header() {
    println!(
        "{:<9} {:<5} {:>9} {:>13} {:>20} {:>20}",
        "variant", "shape", "median ms", "peak RSS MiB", "misses after first", "peak pool / bound"
    );
}

fn fail(why: &str) -> ! {
    eprintln!("{why}\n{USAGE}");
    exit(2)
}

/// What one variant's forwards measured.
struct Run {
    median_ms: f64,
    /// For `pooled`: pool misses after the first forward.
    misses: Option<u64>,
    /// For `pooled`: the peak of bytes in use beyond the weights and input, over the liveness lower
    /// bound of the forward's activations.
    peak_over_bound: Option<f64>,
}

fn run(variant: &str, shape: Shape, forwards: usize) -> Run {
    let mut times = Vec::with_capacity(forwards);
    let mut timed = |f: &mut dyn FnMut() -> f32| {
        for _ in 0..forwards {
            let t = Instant::now();
            let checksum = f();
            times.push(t.elapsed().as_secs_f64() * 1e3);
            assert!(checksum.is_finite());
        }
    };
    let (mut misses, mut peak_over_bound) = (None, None);
    match variant {
        "plain" | "prealloc" => {
            let weights = reference_model::weights(shape);
            let input = reference_model::input(shape);
            if variant == "plain" {
                timed(&mut || reference_model::plain(&weights, &input)[[0, 0]]);
            } else {
                let mut buffers = Buffers::new(shape);
                timed(&mut || reference_model::prealloc(&weights, &input, &mut buffers)[[0, 0]]);
            }
        }
        _ => {
            // The weights and the input are made in the pool itself: no second copy.
            let pool = Pool::with_max_memory_mb(4096);
            let blocks = reference_model::pooled_params(&pool, shape, reference_model::BLOCKS);
            let x = reference_model::pooled_input(&pool, shape);
            let mut first = None;
            timed(&mut || {
                let y = pool.scope(|s| {
                    reference_model::pooled(&blocks, &s.bind(&x))
                        .as_slice()
                        .unwrap()[0]
                });
                first.get_or_insert(pool.stats());
                y
            });
            let (first, end) = (first.expect("ran"), pool.stats());
            misses = Some(end.misses - first.misses);
            let activations = end.peak_bytes_in_use - first.bytes_in_use;
            peak_over_bound =
                Some(activations as f64 / reference_model::liveness_bound_bytes(shape) as f64);
        }
    }
    times.sort_by(f64::total_cmp);
    Run {
        median_ms: times[times.len() / 2],
        misses,
        peak_over_bound,
    }
}

/// Runs the pooled forward on `callers` threads at once, `forwards` each, on one model and one
/// pool, and prints the median time of a forward and the forwards per second of them all.
fn concurrent(shape: Shape, forwards: usize, callers: usize) {
    let pool = Pool::with_max_memory_mb(4096);
    let blocks = reference_model::pooled_params(&pool, shape, reference_model::BLOCKS);
    let x = reference_model::pooled_input(&pool, shape);
    let forward = || {
        pool.scope(|s| {
            reference_model::pooled(&blocks, &s.bind(&x))
                .as_slice()
                .unwrap()[0]
        })
    };
    forward(); // warm-up: the pool's buffers and the workers
    let start = Instant::now();
    let mut times: Vec<f64> = std::thread::scope(|t| {
        let callers: Vec<_> = (0..callers)
            .map(|_| {
                t.spawn(|| {
                    (0..forwards)
                        .map(|_| {
                            let t = Instant::now();
                            assert!(forward().is_finite());
                            t.elapsed().as_secs_f64() * 1e3
                        })
                        .collect::<Vec<f64>>()
                })
            })
            .collect();
        callers
            .into_iter()
            .flat_map(|c| c.join().expect("a caller panicked"))
            .collect()
    });
    let wall = start.elapsed().as_secs_f64();
    times.sort_by(f64::total_cmp);
    println!(
        "{callers} caller(s), pooled {}: median {:.2} ms per forward, {:.1} forwards/s in all",
        shape.name,
        times[times.len() / 2],
        times.len() as f64 / wall
    );
}

/// This process's peak resident set size in KiB (`VmHWM` of `/proc/self/status`; Linux only).
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// Runs this program again for every variant and shape (five forwards each), one process per run
/// so that each peak RSS is that variant's alone, and prints their rows as one table.
fn table() {
    let exe = std::env::current_exe().expect("the path of this program");
    println!(
        "16 residual MLP blocks, y = LayerNorm(x + gelu(x W1 + b1) W2 + b2), f32, each variant in a \
         process of its own, 5 forwards:\n"
    );
    header();
    for shape in ["M", "E"] {
        for variant in VARIANTS {
            let out = Command::new(&exe)
                .args([variant, shape, "5", "--row-only"])
                .output()
                .expect("run this program again");
            print!("{}", String::from_utf8_lossy(&out.stdout));
            assert!(
                out.status.success(),
                "{variant} {shape} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    println!(
        "\nplain allocates every op's result afresh; pooled rents it from the pool (no miss after the \
         first forward);\nprealloc writes into buffers made once. The weights of M and E take {:.1} and {:.1} MiB \
         of each RSS.\n'peak pool / bound': the pool's peak bytes in use beyond weights and input, \
         over the most\nactivations one forward needs at once (a block's input, hidden and output).",
        weight_mib(reference_model::M),
        weight_mib(reference_model::E)
    );
}

/// The weights' size in MiB (two square matrices and two bias vectors per block).
fn weight_mib(shape: Shape) -> f64 {
    let w = shape.width;
    (reference_model::BLOCKS * 2 * (w * w + w) * 4) as f64 / (1 << 20) as f64
}
