//! Heap allocations per steady-state forward, counted by a global allocator (a count,
//! not a time): every tensor comes from the pool, so what remains is what the kernels and the
//! bookkeeping allocate on their own.

#[path = "../examples/common/reference_model.rs"]
mod reference_model;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use tensorscope::prelude::*;

/// The system allocator, counting allocations made on any thread.
struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to `System`, which upholds `GlobalAlloc`'s contract.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made by the third of three forwards of `shape` (the first fills the pool).
fn per_forward(shape: reference_model::Shape) -> usize {
    let pool = Pool::with_max_memory_mb(512);
    let weights = reference_model::pooled_weights(&pool, &reference_model::weights(shape));
    let input = Param::try_from_array(&pool, &reference_model::input(shape)).unwrap();
    let forward = || pool.scope(|s| reference_model::pooled(&weights, &s.bind(&input)).len());
    forward();
    forward();
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    forward();
    ALLOCATIONS.load(Ordering::Relaxed) - before
}

/// Not zero yet (issue 16): each of the 16 blocks' scopes allocates its state, each tensor its
/// reference-counted storage record, some ops a shape `Vec`, and matmul its packing buffers, 12
/// allocations a block. The count may only go down; lower the bound with it.
#[test]
fn steady_state_forwards_allocate_no_more_than_measured() {
    let e = per_forward(reference_model::E);
    let m = per_forward(reference_model::M);
    println!("allocations per steady-state forward: E {e}, M {m}");
    assert!(
        e <= 193 && m <= 193,
        "allocations per forward grew: E {e}, M {m} (were 193)"
    );
}
