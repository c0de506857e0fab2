//! Heap allocations per steady-state forward and training step, counted by a global allocator (a
//! count, not a time).

#[path = "../examples/common/ddpm_unet.rs"]
mod ddpm_unet;
#[path = "../examples/common/diffusion.rs"]
mod diffusion;
#[path = "../examples/common/gpt.rs"]
mod gpt;
#[path = "../examples/common/llama.rs"]
mod llama;
#[path = "../examples/common/pre_norm_mlp.rs"]
mod pre_norm_mlp;
#[path = "../examples/common/reference_model.rs"]
mod reference_model;
#[path = "../examples/common/training_loops.rs"]
mod training_loops;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use tensorscope::nn::{Adam, CausalLm, Group, KvCache, Optimizer, Schedule, Sgd, WarmupCosine};
use tensorscope::ops::{autocast, Products};
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Policy, Precision};

/// The system allocator, counting the allocations of a test's counting thread and of the library's
/// worker threads (not those of the test harness or of threads running other tests, which run
/// alongside).
struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's allocations are counted.
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    if COUNTED.get() || tensorscope::__private::is_worker_thread() {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded unchanged to `System`, which upholds `GlobalAlloc`'s contract.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: forwarded unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Held while counting: the worker threads are shared, so tests count one at a time.
static COUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Holds [`COUNTING`] and counts this thread's allocations until dropped.
struct Alone(#[allow(dead_code)] std::sync::MutexGuard<'static, ()>);

impl Alone {
    fn new() -> Self {
        let guard = COUNTING.lock().unwrap_or_else(|e| e.into_inner());
        COUNTED.set(true);
        Alone(guard)
    }
}

impl Drop for Alone {
    fn drop(&mut self) {
        COUNTED.set(false);
    }
}

/// Blocks per counted forward of the reference model: two (the second block's input is a rented
/// activation, not the bound input) keep the test quick in a debug build.
const BLOCKS: usize = 2;

/// Allocations made by the second of two forwards of `BLOCKS` blocks of `shape` (the first fills
/// the pool, the spare lists and the packing buffers).
fn per_forward(shape: reference_model::Shape) -> usize {
    let _alone = Alone::new();
    let pool = Pool::with_max_memory_mb(512);
    let blocks = reference_model::pooled_params(&pool, shape, BLOCKS);
    let input = reference_model::pooled_input(&pool, shape);
    let forward = || pool.scope(|s| reference_model::pooled(&blocks, &s.bind(&input)).len());
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

/// Steps run before the counted ones: the first fills the pool, the spare lists and the optimizer's
/// state; the later ones only reuse them.
const WARM_UP: usize = 3;

/// Steps counted after the warm-up. More than one: what a step lets go of may pile up and allocate
/// only some steps later (a hash map whose keys are removed and inserted every step grew once its
/// tombstones filled it, at a step its random hashes decided).
const STEADY_STEPS: usize = 8;
/// Budgets for the 4-block MLP of `training_loops::mlp` under `Policy::Memory`.
const MEMORY_TIGHT: usize = 120 * 1024;
const MEMORY_LOOSE: usize = 160 * 1024;

/// Allocations made by the `STEADY_STEPS` steps after `WARM_UP` of `run(steps, boundary)`, a loop of
/// `training_loops` calling `boundary(i)` before step `i` and after the last (counting one loop at a
/// time).
fn per_step(run: impl FnOnce(usize, &mut dyn FnMut(usize))) -> usize {
    let _alone = Alone::new();
    // Read at each boundary into a fixed array: the counting itself allocates nothing.
    let mut at = [0; WARM_UP + STEADY_STEPS + 1];
    run(WARM_UP + STEADY_STEPS, &mut |i| {
        at[i] = ALLOCATIONS.load(Ordering::Relaxed)
    });
    at[WARM_UP + STEADY_STEPS] - at[WARM_UP]
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
        // Planned from the third step on (the second measures), near the smallest budget that
        // fits (115,490 B) and above it.
        (
            "Memory(tight)",
            Some(CheckpointConfig::new(Policy::Memory(MEMORY_TIGHT))),
        ),
        (
            "Memory(loose)",
            Some(CheckpointConfig::new(Policy::Memory(MEMORY_LOOSE))),
        ),
    ];
    let counts: Vec<(&str, usize)> = cases
        .into_iter()
        .map(|(name, config)| {
            let pool = Pool::with_max_memory_mb(256);
            let n =
                per_step(|steps, boundary| training_loops::mlp(&pool, 4, config, steps, boundary));
            (name, n)
        })
        .collect();
    assert!(
        counts.iter().all(|&(_, n)| n == 0),
        "heap allocations over {STEADY_STEPS} steady-state training steps of 4 blocks: {counts:?}"
    );
}

/// A pool records a trace only once [`Pool::start_trace`] is called; until then every step above
/// runs with tracing off. While another pool traces, scopes, ops and the checkpointed loop tag
/// this thread (a few cells, no heap): the checkpointed steps of a pool that is not tracing still
/// allocate nothing, and none of their events reaches the other pool's trace.
#[test]
fn steady_state_steps_allocate_nothing_while_another_pool_traces() {
    let traced = Pool::with_max_memory_mb(1);
    traced.start_trace();
    let pool = Pool::with_max_memory_mb(256);
    let config = Some(CheckpointConfig::new(Policy::Sqrt));
    let n = per_step(|steps, boundary| training_loops::mlp(&pool, 4, config, steps, boundary));
    assert_eq!(
        n, 0,
        "heap allocations over {STEADY_STEPS} steady-state steps under Sqrt"
    );
    assert!(traced.finish_trace().events().is_empty());
}

/// The optimizers with parameter groups, a learning rate set from a schedule at every step, and
/// gradients clipped by norm and by value: the same steps as the plain loop, nothing on the heap.
#[test]
fn steady_state_steps_with_schedules_groups_and_clipping_allocate_nothing() {
    let schedule = WarmupCosine {
        lr: 1e-3,
        warmup: 2,
        total: 100,
        min_lr: 0.0,
    };
    let group = |name: &str| {
        if name.ends_with(".beta") || name.starts_with("blocks.0") {
            Group::NO_DECAY
        } else {
            Group::DEFAULT
        }
    };
    let optimizers: [(&str, Box<dyn Optimizer<f32>>); 2] = [
        ("AdamW", Box::new(Adam::adamw(1e-3, 0.01).groups(group))),
        (
            "SGD",
            Box::new(Sgd::new(1e-2, 0.9).weight_decay(1e-4).groups(group)),
        ),
    ];
    let counts = optimizers.map(|(name, mut optimizer)| {
        let pool = Pool::with_max_memory_mb(64);
        let mut model: pre_norm_mlp::Model = pre_norm_mlp::Model::new(&pool, 2, 32);
        let n = per_step(|steps, boundary| {
            pool.scope(|outer| {
                let mut grads = tensorscope::Gradients::new(outer);
                for step in 0..steps {
                    boundary(step);
                    optimizer.set_lr(schedule.lr(step as u64) as f32);
                    outer.train(|s| {
                        let x = s.randn::<f32>(&[16, 32], 7);
                        let y = model.forward_plain(x);
                        (&y * &y).mean_all().backward_into(&mut grads).unwrap();
                    });
                    grads.clip_norm(1.0).unwrap();
                    grads.clip_value(0.5).unwrap();
                    optimizer.step(&mut model, &grads).unwrap();
                    grads.zero().unwrap();
                }
                boundary(steps);
            })
        });
        (name, n)
    });
    assert!(
        counts.iter().all(|&(_, n)| n == 0),
        "heap allocations over {STEADY_STEPS} steady-state steps: {counts:?}"
    );
}

/// Attention, fused (its tiles in per-thread scratch, its three inputs' record recycled) or not
/// (reshape, transpose, masked_fill, softmax), embeddings and cross-entropy by ids allocate
/// nothing either, in inference and in training, plain or checkpointed block by block.
#[test]
fn steady_state_gpt_forwards_and_training_steps_allocate_nothing() {
    let pool = Pool::with_max_memory_mb(64);
    let every = || Some(CheckpointConfig::new(Policy::Every(1)));
    let counts = [gpt::Attention::Fused, gpt::Attention::Unfused].map(|form| {
        let forward =
            per_step(|steps, boundary| training_loops::gpt_forwards(&pool, form, steps, boundary));
        let training =
            per_step(|steps, boundary| training_loops::gpt(&pool, form, None, steps, boundary));
        let every =
            per_step(|steps, boundary| training_loops::gpt(&pool, form, every(), steps, boundary));
        (form, [forward, training, every])
    });
    assert!(
        counts.iter().all(|(_, n)| *n == [0; 3]),
        "heap allocations over {STEADY_STEPS} steady-state steps of the tiny GPT (forward, \
         training, training under Every(1)): {counts:?}"
    );
    // With the products in bf16: their packing buffers are per-thread too.
    let bf16 = per_step(|steps, boundary| {
        autocast(Products::Bf16, || {
            training_loops::gpt(&pool, gpt::Attention::Fused, None, steps, boundary)
        })
    });
    assert_eq!(
        bf16, 0,
        "heap allocations over {STEADY_STEPS} steady-state training steps with bf16 products"
    );
}

/// A parameter two fields hold (the GPT's head tied to its embedding) is found once by the
/// optimizer's walks in recycled lists: its steps allocate nothing either.
#[test]
fn steady_state_steps_of_a_tied_gpt_allocate_nothing() {
    let pool = Pool::with_max_memory_mb(64);
    let n = per_step(|steps, boundary| training_loops::tied_gpt(&pool, steps, boundary));
    assert_eq!(
        n, 0,
        "heap allocations over {STEADY_STEPS} steady-state training steps of the tied GPT"
    );
}

/// A decode step of the Llama-style model for two sequences at different positions, through its
/// key/value caches (kept by the outer scope) in a scope of its own, then top-k/top-p sampling:
/// the cache's appends, attention and the step's temporaries all reuse pooled buffers and
/// recycled records.
#[test]
fn steady_state_decode_steps_allocate_nothing() {
    let pool = Pool::with_max_memory_mb(64);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/llama_tiny.safetensors");
    let model = llama::Llama::load(&pool, &path).unwrap();
    let layout = model.cache_layout();
    let count = per_step(|steps, boundary| {
        pool.scope(|s| {
            let mut caches: Vec<_> = (0..layout.layers)
                .map(|_| KvCache::new(s, 2, layout.kv_heads, 32, layout.head_dim))
                .collect();
            for (seq, prompt) in [&[3i64, 1, 4][..], &[1, 5, 9, 2, 6, 5, 3]]
                .iter()
                .enumerate()
            {
                s.scope(|p| {
                    let ids = p.from_slice::<i64>(&[1, prompt.len()], prompt);
                    model
                        .forward_cached(p, &ids, &mut caches, Some(seq), 1)
                        .unwrap();
                });
            }
            let mut last = [1i64, 2];
            let mut rng = tensorscope::Generator::new(7);
            for i in 0..steps {
                boundary(i);
                s.scope(|p| {
                    let ids = p.from_slice::<i64>(&[2, 1], &last);
                    let logits = model.forward_cached(p, &ids, &mut caches, None, 1).unwrap();
                    let next = logits.sample_logits(0.8, Some(10), Some(0.9), &mut rng);
                    last.copy_from_slice(next.as_slice().unwrap());
                });
            }
            boundary(steps);
        })
    });
    assert_eq!(
        count, 0,
        "heap allocations over {STEADY_STEPS} steady-state decode steps of the Llama-style model"
    );
}

/// An f16 cache's attention computes in f32 from pooled widened copies of its filled rows: its
/// steps allocate nothing either.
#[test]
fn steady_state_half_precision_cache_attends_allocate_nothing() {
    let pool = Pool::with_max_memory_mb(64);
    let count = per_step(|steps, boundary| {
        pool.scope(|s| {
            let mut cache = KvCache::<tensorscope::f16>::new(s, 2, 2, steps, 8);
            for i in 0..steps {
                boundary(i);
                s.scope(|p| {
                    let kv = p.randn::<f32>(&[2, 2, 1, 8], i as u64);
                    let kv = kv.cast::<tensorscope::f16>();
                    cache.append(&kv, &kv);
                    let q = p.randn::<f32>(&[2, 4, 1, 8], 7).cast::<tensorscope::f16>();
                    std::hint::black_box(cache.attend(&q, None));
                });
            }
            boundary(steps);
        })
    });
    assert_eq!(
        count, 0,
        "heap allocations over {STEADY_STEPS} steady-state attends of an f16 cache"
    );
}

/// Causal attention over `x` (`[b, t, c]`) with `heads` heads, split as PyTorch's models split them,
/// through rank 5: `[b, t, 3, h, d]`, permuted to `[3, b, h, t, d]`, one head group per narrow; the
/// heads merged back by a rank-4 permute.
fn rank5_attention<'a>(x: &Tensor<'a>, w_qkv: &Param, w_proj: &Param, heads: usize) -> Tensor<'a> {
    let &[b, t, c] = x.shape() else {
        panic!("[b, t, c], got {:?}", x.shape())
    };
    let d = c / heads;
    let qkv = x
        .matmul(w_qkv)
        .reshape(&[b, t, 3, heads, d])
        .permute(&[2, 0, 3, 1, 4]);
    let group = |i: usize| qkv.narrow(0, i, 1).squeeze(0);
    let causal = tensorscope::ops::AttentionOptions {
        causal: true,
        ..Default::default()
    };
    let y = group(0).scaled_dot_product_attention(&group(1), &group(2), causal);
    y.permute(&[0, 2, 1, 3]).reshape(&[b, t, c]).matmul(w_proj)
}

/// Elementwise, broadcast, lane and reduction ops, a repeat and an expand, on rank-6 views and
/// their gradients.
fn rank6_chain<'a>(x: &Tensor<'a>, scale: &Param) -> Tensor<'a> {
    let six = x.reshape(&[2, 2, 2, 2, 4, 4]).permute(&[5, 1, 0, 3, 2, 4]);
    let y = (&six * scale).softmax(-1) + &six.narrow(2, 1, 1);
    let tiled = y.repeat(&[1, 1, 2, 1, 1, 1]) * &x.bind(scale).expand(&[1, 1, 1, 1, 1, 4]);
    tiled.sum(3).exp().mean_all()
}

/// The two blocks above on a fixed random `[2, 8, 16]` input, as one loss.
fn high_rank_loss<'a>(s: &tensorscope::Scope<'a, '_>, params: &[Param; 3]) -> Tensor<'a> {
    let [w_qkv, w_proj, scale] = params;
    let x = s.randn::<f32>(&[2, 8, 16], 4);
    let y = rank5_attention(&x, w_qkv, w_proj, 4);
    rank6_chain(&y, scale) + &y.mean_all()
}

/// `steps` steps of [`high_rank_loss`], each a training step (forward and backward) if `train`,
/// else a forward alone.
fn high_rank_steps(train: bool, steps: usize, mut boundary: impl FnMut(usize)) {
    let pool = Pool::with_max_memory_mb(64);
    let param =
        |shape: &[usize], seed| pool.scope(|s| (s.randn::<f32>(shape, seed) * 0.2).detach());
    let params = [param(&[16, 48], 1), param(&[16, 16], 2), param(&[4], 3)];
    pool.scope(|outer| {
        let mut grads = tensorscope::Gradients::new(outer);
        for step in 0..steps {
            boundary(step);
            match train {
                true => outer.train(|s| {
                    high_rank_loss(s, &params)
                        .backward_into(&mut grads)
                        .expect("backward")
                }),
                false => {
                    outer.scope(|s| high_rank_loss(s, &params).len());
                }
            }
        }
        boundary(steps);
    });
}

/// Views of rank 5 and 6 keep their shapes and steps in recycled records as well: splitting heads
/// through rank 5 and back, and a chain of rank-6 ops, allocate nothing forward or backward.
#[test]
fn steady_state_high_rank_views_allocate_nothing() {
    let forward = per_step(|steps, boundary| high_rank_steps(false, steps, boundary));
    let training = per_step(|steps, boundary| high_rank_steps(true, steps, boundary));
    assert_eq!(
        (forward, training),
        (0, 0),
        "heap allocations over {STEADY_STEPS} steady-state steps at ranks 5 and 6 (forward, training)"
    );
}

/// The shortest loop, `loss.backward()` then `step` in one `pool.train` per step: the gradients are
/// a new `Gradients` every step, whose list reuses a recycled buffer (it made one heap allocation
/// per doubling of its length, three a step for these twelve parameters).
#[test]
fn steady_state_steps_of_the_simplest_loop_allocate_nothing() {
    let pool = Pool::with_max_memory_mb(64);
    let mut model: pre_norm_mlp::Model = pre_norm_mlp::Model::new(&pool, 2, 32);
    let mut adam = Adam::new(1e-3);
    let n = per_step(|steps, boundary| {
        for step in 0..steps {
            boundary(step);
            pool.train(|s| {
                let y = model.forward_plain(s.randn::<f32>(&[16, 32], 7));
                let grads = (&y * &y).mean_all().backward().unwrap();
                adam.step(&mut model, &grads).unwrap();
            });
        }
        boundary(steps);
    });
    assert_eq!(
        n, 0,
        "heap allocations over {STEADY_STEPS} steady-state steps of backward() then step"
    );
}

/// A UNet-like chain of products with nested long skips: the down path's values read by the up
/// path, and a residual from the chain's input.
struct Ladder {
    w: Vec<Param>,
}

impl Ladder {
    #[checkpoint]
    fn forward<'a>(&self, ckpt: &mut tensorscope::Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let w = &self.w;
        let h = x.tanh();
        let d1 = h.matmul(&w[0]).tanh();
        let d2 = d1.matmul(&w[1]).tanh();
        let m = d2.matmul(&w[2]).tanh();
        let u2 = (m + &d2).matmul(&w[3]).tanh();
        let u1 = (u2 + &d1).matmul(&w[4]).tanh();
        let out = (u1 + &h).matmul(&w[5]);
        out
    }
}

/// Skip connections keep their values, pending gradients and the nodes that carry them across a
/// region's end in recycled records: steady-state steps of a chain with skips allocate nothing
/// under every kind of policy.
#[test]
fn steady_state_steps_of_a_chain_with_skips_allocate_nothing() {
    let policies = [
        Policy::Every(1),
        Policy::Every(2),
        Policy::Budget(2 * 32 * 16 * 4),
        Policy::Memory(1 << 20),
    ];
    let counts: Vec<(String, usize)> = policies
        .into_iter()
        .map(|policy| {
            let pool = Pool::with_max_memory_mb(64);
            let w = (0..6)
                .map(|i| pool.scope(|s| (s.randn::<f32>(&[16, 16], i) * 0.3).detach()))
                .collect();
            let ladder = Ladder { w };
            let name = format!("{policy:?}");
            let mut ckpt = tensorscope::Checkpointer::new(CheckpointConfig::new(policy));
            let n = per_step(|steps, boundary| {
                pool.scope(|outer| {
                    let mut grads = tensorscope::Gradients::new(outer);
                    for step in 0..steps {
                        boundary(step);
                        outer.train(|s| {
                            let y = ladder.forward(&mut ckpt, s.randn::<f32>(&[32, 16], 1));
                            y.mse(&s.zeros(&[32, 16]))
                                .backward_into(&mut grads)
                                .expect("backward")
                        });
                    }
                    boundary(steps);
                })
            });
            (name, n)
        })
        .collect();
    assert!(
        counts.iter().all(|(_, n)| *n == 0),
        "heap allocations over {STEADY_STEPS} steady-state steps of a chain with skips: {counts:?}"
    );
}

/// A list of mixed layers, as a diffusion model's blocks are kept (`#[derive(Parameters)]` on an
/// enum): convolutions with their biases, group norm with its scale and shift, SiLU.
#[derive(Parameters)]
enum Layer {
    Conv(tensorscope::nn::Conv2d),
    Norm(tensorscope::nn::GroupNorm),
    Silu,
}

impl Layer {
    fn forward<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        match self {
            Layer::Conv(conv) => conv.forward(x).expect("conv"),
            Layer::Norm(norm) => norm.forward(x).expect("norm"),
            Layer::Silu => x.silu(),
        }
    }
}

/// Convolutions (3x3, strided, 1x1) trained with group norm and SiLU between them: their tiles of
/// patches, turned kernels and gradients come from the pool, and the images split over the
/// threads take nothing from the heap.
#[test]
fn steady_state_convolution_training_steps_allocate_nothing() {
    use tensorscope::nn::{Conv2d, GroupNorm};
    use tensorscope::ops::ConvOptions;
    let pool = Pool::with_max_memory_mb(256);
    let pad = ConvOptions {
        padding: 1,
        ..ConvOptions::default()
    };
    let strided = ConvOptions { stride: 2, ..pad };
    let mut layers = vec![
        Layer::Conv(Conv2d::new(&pool, 4, 16, 3, pad, 1).expect("conv")),
        Layer::Norm(GroupNorm::new(&pool, 4, 16, 1e-5).expect("norm")),
        Layer::Silu,
        Layer::Conv(Conv2d::new(&pool, 16, 16, 3, pad, 2).expect("conv")),
        Layer::Conv(Conv2d::new(&pool, 16, 16, 3, strided, 3).expect("conv")),
        Layer::Conv(Conv2d::new(&pool, 16, 8, 1, ConvOptions::default(), 4).expect("conv")),
    ];
    let images = Param::from_slice(&pool, &[4, 4, 32, 32], &vec![0.25; 4 * 4 * 32 * 32]);
    let n = per_step(|steps, boundary| {
        let mut adam = Adam::new(1e-3);
        pool.scope(|outer| {
            let mut grads = tensorscope::Gradients::new(outer);
            for step in 0..steps {
                boundary(step);
                outer.train(|s| {
                    let mut h = s.bind(&images).without_grad();
                    for layer in &layers {
                        h = layer.forward(&h);
                    }
                    h.sum_all().backward_into(&mut grads).expect("backward");
                });
                adam.step(&mut layers, &grads).expect("adam");
                grads.zero().expect("zero");
            }
            boundary(steps);
        });
    });
    assert_eq!(
        n, 0,
        "heap allocations over {STEADY_STEPS} steady-state steps of convolutions"
    );
}

/// Sampling a diffusion model (`examples/ddpm.rs`'s UNet, with time embedding and attention):
/// each denoising step's temporaries (the UNet's, the noise drawn) go back to the pool, so every
/// step after the first allocates nothing from the heap and nothing from the system (no pool
/// miss), and no later step holds more at once than the first.
#[test]
fn steady_state_diffusion_sampling_steps_allocate_nothing_and_miss_nothing() {
    use diffusion::{Diffusion, Sampler};
    const STEPS: usize = WARM_UP + STEADY_STEPS;
    let pool = Pool::with_max_memory_mb(64);
    let model = ddpm_unet::Unet::new(&pool, 1, 8, 0).expect("the UNet");
    // DDIM visits every fourth timestep of its schedule, DDPM every one.
    let cases = [
        (Sampler::Ddpm, STEPS),
        (Sampler::Ddim { steps: STEPS }, 4 * STEPS),
    ];
    for (sampler, timesteps) in cases {
        let diffusion = Diffusion::linear(&pool, timesteps);
        let mut stats = [pool.stats(); STEPS + 1];
        let n = per_step(|steps, boundary| {
            assert_eq!(sampler.steps(timesteps), steps);
            let mut each = |i: usize| {
                boundary(i);
                stats[i] = pool.stats();
            };
            let shape = [2, 1, 8, 8];
            diffusion
                .sample(&pool, &model, sampler, shape, 7, &mut each)
                .expect("sampling");
        });
        assert_eq!(
            n, 0,
            "{sampler}: heap allocations over {STEADY_STEPS} sampling steps"
        );
        let (first, last) = (stats[1], stats[STEPS]);
        assert_eq!(
            last.misses, first.misses,
            "{sampler}: pool misses after the first step"
        );
        let held = |s: tensorscope::PoolStats| s.bytes_in_use + s.bytes_cached;
        assert_eq!(
            held(last),
            held(first),
            "{sampler}: the pool grew after the first step"
        );
        assert_eq!(
            last.peak_bytes_in_use, first.peak_bytes_in_use,
            "{sampler}: a later step needed more at once than the first"
        );
    }
}
