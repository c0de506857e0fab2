//! What the bench's times do not show, per shape and candidate: heap allocations per product
//! (a counting global allocator); the threads kept busy during products (process CPU time over
//! wall time: 2.0 is both cores); the product's rate per CPU-second of all its threads (GFLOP per
//! CPU-second, which other processes on the machine disturb far less than wall time, though time
//! a thread spends spinning counts against it); and the CPU time the process burns in the 100 ms
//! after the last product returns, while the calling thread sleeps (worker threads that spin
//! instead of parking).
//!
//! From `peers/`: `cargo run --release --example probe [--features blas]` (Linux: reads
//! `/proc/self/task/*/schedstat`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tensorscope_peers::{
    blas_info, candidates, threads, use_threads, Operands, SHAPES, TRANSFORMER_SHAPES,
};

/// The system allocator, counting allocations (`alloc`, `alloc_zeroed` and `realloc`).
struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so `System`'s
// guarantees are this allocator's; the counter has no effect on memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc`, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `alloc_zeroed`, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract for `realloc`, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract for `dealloc`, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// CPU time of every thread of this process so far, in nanoseconds.
fn process_cpu_ns() -> u64 {
    let tasks = std::fs::read_dir("/proc/self/task").expect("Linux /proc/self/task");
    tasks
        .filter_map(|task| {
            let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
            stat.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum()
}

fn main() {
    use_threads();
    if let Some(info) = blas_info() {
        println!("OpenBLAS: {info}");
    }
    println!("threads per product: {}", threads());
    println!(
        "{:6} {:22} {:>12} {:>13} {:>13} {:>17}",
        "shape", "candidate", "allocs/call", "busy threads", "GFLOP/CPU-s", "CPU ms after 100"
    );
    for shape in SHAPES.into_iter().chain(TRANSFORMER_SHAPES) {
        let operands = Operands::new(shape);
        for mut candidate in candidates(&operands) {
            candidate
                .check(&operands)
                .unwrap_or_else(|wrong| panic!("{wrong}"));
            // Enough calls for about 0.3 s, after a warm-up of the same length.
            let start = Instant::now();
            let mut calls = 0u32;
            while start.elapsed() < Duration::from_millis(300) {
                candidate.run();
                calls += 1;
            }
            // Counted apart from the CPU time, whose reading of /proc allocates.
            let allocations = ALLOCATIONS.load(Ordering::Relaxed);
            for _ in 0..calls {
                candidate.run();
            }
            let per_call =
                (ALLOCATIONS.load(Ordering::Relaxed) - allocations) as f64 / calls as f64;
            let (cpu, wall) = (process_cpu_ns(), Instant::now());
            for _ in 0..calls {
                candidate.run();
            }
            let cpu = (process_cpu_ns() - cpu) as f64;
            let busy = cpu / wall.elapsed().as_nanos() as f64;
            let per_cpu_second = shape.flops() as f64 * f64::from(calls) / cpu;
            let cpu = process_cpu_ns();
            std::thread::sleep(Duration::from_millis(100));
            let after = (process_cpu_ns() - cpu) as f64 / 1e6;
            println!(
                "{:6} {:22} {per_call:>12.1} {busy:>13.2} {per_cpu_second:>13.1} {after:>17.1}",
                shape.name,
                candidate.name()
            );
            // Lets spinning workers give up before the next candidate's CPU time is read.
            std::thread::sleep(Duration::from_millis(400));
        }
    }
}
