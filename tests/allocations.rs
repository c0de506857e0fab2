//! Heap allocations per steady-state forward and training step, counted by a global allocator (a
//! count, not a time).

#[path = "../examples/common/pre_norm_mlp.rs"]
mod pre_norm_mlp;
#[path = "../examples/common/reference_model.rs"]
mod reference_model;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use tensorscope::nn::{Adam, Optimizer};
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Gradients, Policy};

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

/// Held while counting: the count includes every thread's allocations, so tests count one at a time.
static COUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Blocks per counted forward: the count is per block (each block runs the same ops), and two keep
/// the test quick in a debug build.
const BLOCKS: usize = 2;

/// Allocations made by the third of three forwards of `BLOCKS` blocks of `shape` (the first fills
/// the pool).
fn per_forward(shape: reference_model::Shape) -> usize {
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let pool = Pool::with_max_memory_mb(512);
    let w = shape.width;
    let param =
        |dims: &[usize], seed: u64| pool.scope(|s| (s.randn::<f32>(dims, seed) * 0.1).detach());
    let blocks: Vec<reference_model::Pooled> = (0..BLOCKS as u64)
        .map(|i| reference_model::Pooled {
            w1: param(&[w, w], 4 * i),
            b1: param(&[w], 4 * i + 1),
            w2: param(&[w, w], 4 * i + 2),
            b2: param(&[w], 4 * i + 3),
        })
        .collect();
    let input = param(&[shape.batch, w], 99);
    let forward = || pool.scope(|s| reference_model::pooled(&blocks, &s.bind(&input)).len());
    forward();
    forward();
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    forward();
    ALLOCATIONS.load(Ordering::Relaxed) - before
}

/// Every tensor's buffer comes from the pool, its reference-counted record and its scope's state
/// from per-thread spares, and the matrix products pack into per-thread buffers and split over
/// parked worker threads: nothing is allocated once the first forwards have warmed these up.
#[test]
fn steady_state_forwards_allocate_nothing() {
    let e = per_forward(reference_model::E);
    let m = per_forward(reference_model::M);
    assert_eq!(
        (e, m),
        (0, 0),
        "heap allocations per steady-state forward of {BLOCKS} blocks (E, M)"
    );
}

/// Allocations made by the fourth of four training steps (forward, backward into kept gradients,
/// Adam) of a pre-norm MLP of `BLOCKS` blocks, with a `#[checkpoint]` policy or without.
fn per_training_step(policy: Option<Policy>) -> usize {
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let pool = Pool::with_max_memory_mb(256);
    let (batch, width) = (64, 32);
    let mut model = pre_norm_mlp::Model::new(&pool, BLOCKS, width);
    let mut ckpt = policy.map(|p| Checkpointer::new(CheckpointConfig::new(p)));
    let mut adam = Adam::new(1e-3);
    let mut counted = 0;
    pool.scope(|outer| {
        let mut grads = Gradients::new(outer);
        for step in 0..4 {
            let before = ALLOCATIONS.load(Ordering::Relaxed);
            outer.scope(|s| {
                let x = s.randn::<f32>(&[batch, width], 7);
                let target = s.randn::<f32>(&[batch, width], 8);
                s.train(|t| {
                    let x = t.rebind(&x);
                    let y = match ckpt.as_mut() {
                        Some(ckpt) => model.forward(ckpt, x),
                        None => model.forward_plain(x),
                    };
                    y.mse(&target).backward_into(&mut grads).expect("backward");
                })
            });
            adam.step(&mut model, &grads).expect("adam");
            grads.zero().expect("zero");
            if step == 3 {
                counted = ALLOCATIONS.load(Ordering::Relaxed) - before;
            }
        }
    });
    counted
}

/// Not zero yet: the forward's tensors allocate nothing, but the gradient graph does (a reference-
/// counted node per recorded op, each rule's list of input gradients, the backward walk's order and
/// maps, the checkpointer's tapes). The counts may only go down; lower the bounds with them.
#[test]
fn steady_state_training_steps_allocate_no_more_than_measured() {
    let plain = per_training_step(None);
    let sqrt = per_training_step(Some(Policy::Sqrt));
    println!(
        "allocations per steady-state training step of {BLOCKS} blocks: plain {plain}, sqrt {sqrt}"
    );
    assert!(
        plain <= 193 && sqrt <= 207,
        "allocations per training step grew: plain {plain}, sqrt {sqrt} (were 193 and 207)"
    );
}
