//! Heap allocations per steady-state forward and training step, counted by a global allocator (a
//! count, not a time).

#[path = "../examples/common/gpt.rs"]
mod gpt;
#[path = "../examples/common/pre_norm_mlp.rs"]
mod pre_norm_mlp;
#[path = "../examples/common/reference_model.rs"]
mod reference_model;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use tensorscope::nn::{Adam, Optimizer};
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Gradients, Policy, Precision};

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

/// Blocks per counted forward of the reference model: two keep the test quick in a debug build.
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

/// Steps run before the counted one: the first fills the pool, the spare lists and the optimizer's
/// state; the later ones only reuse them.
const WARM_UP: usize = 3;

/// Allocations made by `step` after `WARM_UP` calls of it (counting one step at a time).
fn per_step(mut step: impl FnMut()) -> usize {
    for _ in 0..WARM_UP {
        step();
    }
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    step();
    ALLOCATIONS.load(Ordering::Relaxed) - before
}

/// Allocations per steady-state training step (forward, backward into kept gradients, Adam, zeroed
/// gradients) of a pre-norm MLP of `blocks` blocks, with a `#[checkpoint]` configuration or
/// without.
fn per_mlp_training_step(blocks: usize, config: Option<CheckpointConfig>) -> usize {
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let pool = Pool::with_max_memory_mb(256);
    let (batch, width) = (64, 32);
    let mut model = pre_norm_mlp::Model::new(&pool, blocks, width);
    let mut ckpt = config.map(Checkpointer::new);
    let mut adam = Adam::new(1e-3);
    pool.scope(|outer| {
        let mut grads = Gradients::new(outer);
        per_step(|| {
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
        })
    })
}

/// The graph's nodes and lists, the scopes' states, the checkpointer's tapes, plans and stored
/// boundaries all reuse what the previous step let go of. Four blocks, so that every policy
/// replays at least one segment from a stored boundary (`Sqrt` stores blocks 0 and 2, `Budget`
/// recomputes boundaries it did not store).
#[test]
fn steady_state_mlp_training_steps_allocate_nothing() {
    let activation = 64 * 32 * 4;
    let cases = [
        ("plain", None),
        ("Every(1)", Some(CheckpointConfig::new(Policy::Every(1)))),
        ("Every(2)", Some(CheckpointConfig::new(Policy::Every(2)))),
        ("Sqrt", Some(CheckpointConfig::new(Policy::Sqrt))),
        (
            "Budget(2 activations)",
            Some(CheckpointConfig::new(Policy::Budget(2 * activation))),
        ),
        (
            "Every(1), f16",
            Some(CheckpointConfig::new(Policy::Every(1)).with_precision(Precision::F16)),
        ),
    ];
    let counts: Vec<(&str, usize)> = cases
        .into_iter()
        .map(|(name, config)| (name, per_mlp_training_step(4, config)))
        .collect();
    assert!(
        counts.iter().all(|&(_, n)| n == 0),
        "heap allocations per steady-state training step of 4 blocks: {counts:?}"
    );
}

/// The tiny GPT of the parity fixture's sizes, with random weights and two blocks.
fn tiny_gpt(pool: &Pool) -> gpt::Gpt {
    let config = gpt::Config {
        layers: 2,
        ..gpt::Config::TINY
    };
    gpt::Gpt::random(pool, config, 1).expect("a model")
}

/// Two sequences of 8 token ids.
const TOKENS: [i64; 16] = [3, 10, 17, 24, 31, 38, 45, 52, 59, 66, 73, 80, 87, 94, 5, 12];

/// Allocations per steady-state forward (inference) of the tiny GPT.
fn per_gpt_forward() -> usize {
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let pool = Pool::with_max_memory_mb(64);
    let model = tiny_gpt(&pool);
    per_step(|| {
        pool.scope(|s| {
            let ids = s.from_slice::<i64>(&[2, 8], &TOKENS);
            model.forward(&ids).len()
        });
    })
}

/// Allocations per steady-state training step of the tiny GPT (next-token cross-entropy by ids,
/// Adam), with its `#[checkpoint]` block loop under `config` or without.
fn per_gpt_training_step(config: Option<CheckpointConfig>) -> usize {
    let _alone = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
    let pool = Pool::with_max_memory_mb(64);
    let mut model = tiny_gpt(&pool);
    let mut ckpt = config.map(Checkpointer::new);
    let mut adam = Adam::new(1e-3);
    pool.scope(|outer| {
        let mut grads = Gradients::new(outer);
        per_step(|| {
            outer.train(|t| {
                let ids = t.from_slice::<i64>(&[2, 8], &TOKENS);
                let logits = match ckpt.as_mut() {
                    Some(ckpt) => model.forward_checkpointed(ckpt, &ids),
                    None => model.forward(&ids),
                };
                let loss = gpt::Gpt::loss(&logits, &ids);
                loss.backward_into(&mut grads).expect("backward");
            });
            adam.step(&mut model, &grads).expect("adam");
            grads.zero().expect("zero");
        })
    })
}

/// Attention (reshape, transpose, masked_fill, softmax), embeddings and cross-entropy by ids
/// allocate nothing either, in inference and in training, plain or checkpointed block by block.
#[test]
fn steady_state_gpt_forwards_and_training_steps_allocate_nothing() {
    let counts = [
        ("forward", per_gpt_forward()),
        ("training", per_gpt_training_step(None)),
        (
            "training, Every(1)",
            per_gpt_training_step(Some(CheckpointConfig::new(Policy::Every(1)))),
        ),
    ];
    assert!(
        counts.iter().all(|&(_, n)| n == 0),
        "heap allocations per steady-state step of the tiny GPT: {counts:?}"
    );
}
