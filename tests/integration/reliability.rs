//! Stress and faults: threads sharing one pool and one model, a panic in the middle of a checkpointed
//! training step, and the pool working on after budget exhaustion.

use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::rc::Rc;
use std::sync::Arc;

use tensorscope::nn::{Activation, Linear, Module, Optimizer, Sequential, Sgd};
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Error, Parameters, Policy};

use crate::common::panic_message;

#[test]
fn threads_with_their_own_scopes_share_one_pool_exactly() {
    let pool = Pool::with_max_memory_mb(256);
    let threads = 4;
    let rounds = 2000;
    let rents_per_thread: Vec<u64> = std::thread::scope(|t| {
        let handles: Vec<_> = (0..threads)
            .map(|id| {
                let pool = pool.clone();
                t.spawn(move || {
                    let mut rents = 0u64;
                    let mut state = 0x9E37_79B9u32.wrapping_mul(id + 1);
                    for round in 0..rounds {
                        pool.scope(|s| {
                            // A few tensors at once, each filled with a value no other thread uses.
                            let live: Vec<Tensor<'_>> = (0..3)
                                .map(|k| {
                                    state ^= state << 13;
                                    state ^= state >> 17;
                                    state ^= state << 5;
                                    let len = 1 + (state % 5000) as usize;
                                    let value = (id * 100_000 + round * 4 + k) as f32;
                                    rents += 1;
                                    s.full::<f32>(&[len], value)
                                })
                                .collect();
                            for (k, t) in live.iter().enumerate() {
                                let value = (id * 100_000 + round * 4 + k as u32) as f32;
                                assert!(
                                    t.as_slice().unwrap().iter().all(|&v| v == value),
                                    "a buffer was handed to two threads at once"
                                );
                            }
                        });
                    }
                    rents
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect()
    });
    let stats = pool.stats();
    let total: u64 = rents_per_thread.iter().sum();
    assert_eq!(total, u64::from(threads) * u64::from(rounds) * 3);
    assert_eq!(stats.hits + stats.misses, total);
    assert_eq!(stats.returns, total);
    assert_eq!(stats.bytes_in_use, 0);
    assert_eq!(stats.failed_rents, 0);
}

/// A residual MLP whose weights are parameters: one copy, shared by every thread.
struct Model {
    blocks: Vec<[Param; 4]>,
}

impl Model {
    fn new(pool: &Pool, width: usize, depth: usize) -> Self {
        let blocks = (0..depth as u64)
            .map(|i| {
                pool.scope(|s| {
                    [
                        (s.randn::<f32>(&[width, 2 * width], 4 * i) * 0.2).detach(),
                        (s.randn::<f32>(&[2 * width], 4 * i + 1) * 0.1).detach(),
                        (s.randn::<f32>(&[2 * width, width], 4 * i + 2) * 0.2).detach(),
                        (s.randn::<f32>(&[width], 4 * i + 3) * 0.1).detach(),
                    ]
                })
            })
            .collect();
        Model { blocks }
    }

    #[dispose_scope]
    fn block<'a>(x: &Tensor<'a>, p: &[Param; 4]) -> Tensor<'a> {
        let h = (x.matmul(&p[0]) + &p[1]).gelu();
        (h.matmul(&p[2]) + &p[3] + x).layer_norm(1e-5)
    }

    fn forward(&self, pool: &Pool, seed: u64) -> Vec<f32> {
        pool.scope(|s| {
            let mut x = s.randn::<f32>(&[8, 32], seed);
            for p in &self.blocks {
                x = Model::block(&x, p);
            }
            x.to_vec()
        })
    }
}

#[test]
fn one_model_shared_by_four_threads_gives_the_single_thread_outputs_and_exact_figures() {
    let pool = Pool::with_max_memory_mb(64);
    let model = Arc::new(Model::new(&pool, 32, 6));
    let model_bytes = pool.stats().bytes_in_use;
    let inputs: Vec<u64> = (0..12).collect();
    // Single-threaded: the outputs, and the rents of one forward.
    let expected: Vec<Vec<f32>> = inputs.iter().map(|&i| model.forward(&pool, i)).collect();
    let before = pool.stats();
    model.forward(&pool, 0);
    let rents_per_forward = pool.stats().hits + pool.stats().misses - before.hits - before.misses;
    assert!(rents_per_forward > 0);

    let before = pool.stats();
    let rounds = 25;
    std::thread::scope(|t| {
        for thread in 0..4 {
            let (model, pool, inputs, expected) = (Arc::clone(&model), &pool, &inputs, &expected);
            t.spawn(move || {
                for round in 0..rounds {
                    for (k, &seed) in inputs.iter().enumerate().skip((thread + round) % 3) {
                        let got = model.forward(pool, seed);
                        assert_eq!(got, expected[k], "thread {thread}, input {seed}");
                    }
                }
            });
        }
    });
    let forwards: u64 = (0..4)
        .flat_map(|thread| (0..rounds).map(move |round| (12 - (thread + round) % 3) as u64))
        .sum();
    let after = pool.stats();
    let rents = after.hits + after.misses - before.hits - before.misses;
    assert_eq!(
        rents,
        forwards * rents_per_forward,
        "every forward rents the same"
    );
    assert_eq!(
        after.returns - before.returns,
        rents,
        "and returns all of it"
    );
    assert_eq!(after.bytes_in_use, model_bytes, "only the weights stay");
    assert_eq!(after.failed_rents, 0);
    assert_eq!(Arc::strong_count(&model), 1);
}

/// A layer that panics on demand (the flag is shared with the test), in the middle of a model.
#[derive(Parameters)]
struct Faulty {
    #[param(skip)]
    fail: Rc<Cell<bool>>,
}

impl Module for Faulty {
    fn forward<'s>(&self, x: &Tensor<'s>) -> tensorscope::Result<Tensor<'s>> {
        assert!(
            !self.fail.get(),
            "fault injected in the middle of a forward"
        );
        Ok(x.clone())
    }
}

#[test]
fn a_panic_in_a_checkpointed_training_step_leaves_the_pool_consistent() {
    let pool = Pool::with_max_memory_mb(64);
    let fail = Rc::new(Cell::new(false));
    let mut model = Sequential::new();
    for i in 0..8 {
        model = model
            .push(Linear::new(&pool, 8, 8, i).unwrap())
            .push(Activation::tanh());
        if i == 4 {
            model = model.push(Faulty { fail: fail.clone() });
        }
    }
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Every(3)));
    let mut sgd = Sgd::new(0.01, 0.0);
    let mut step = |model: &mut Sequential, ckpt: &mut Checkpointer| {
        pool.train(|s| {
            let x = s.randn::<f32>(&[4, 8], 1);
            let y = model.forward_checkpointed(ckpt, x).unwrap();
            let loss = y.mse(&s.zeros(&[4, 8]));
            sgd.step(model, &loss.backward().unwrap()).unwrap();
            loss.item()
        })
    };
    let first = step(&mut model, &mut ckpt);
    ckpt.clear();
    let steady = pool.stats().bytes_in_use;

    fail.set(true);
    assert_eq!(
        panic_message(|| {
            step(&mut model, &mut ckpt);
        }),
        "fault injected in the middle of a forward"
    );
    fail.set(false);
    // The checkpoints of the interrupted step are the only thing left over; clearing them restores
    // the steady state exactly.
    ckpt.clear();
    assert_eq!(
        pool.stats().bytes_in_use,
        steady,
        "every activation of the failed step returned"
    );
    let next = step(&mut model, &mut ckpt);
    assert!(
        next.is_finite() && next < first,
        "training goes on: {first} -> {next}"
    );
}

/// A panic payload whose destructor panics too.
struct Bomb;

impl Drop for Bomb {
    fn drop(&mut self) {
        panic!("a panic payload that panics when dropped");
    }
}

#[test]
fn a_kernel_panicking_with_a_payload_that_panics_when_dropped_unwinds_cleanly() {
    // Large enough that `map` splits its elements over every thread (2^16 or more each): with two
    // or more threads, two parts panic and one payload is dropped where it was caught.
    let len = 1 << 20;
    let pool = Pool::with_max_memory_mb(64);
    for _ in 0..10 {
        let payload = std::panic::catch_unwind(AssertUnwindSafe(|| {
            pool.scope(|s| {
                let x = s.ones::<f32>(&[len]);
                let _ = x.map(|_| std::panic::panic_any(Bomb));
            })
        }))
        .expect_err("the kernel's panic reaches the caller");
        assert!(payload.is::<Bomb>());
        std::mem::forget(payload); // dropping it would panic: it is the test's own to handle
        assert_eq!(pool.stats().bytes_in_use, 0, "every buffer went back");
    }
    // The worker threads serve the next op, every element written.
    let sum = pool.scope(|s| s.ones::<f32>(&[len]).map(|x| x * 3.0).sum_all().item());
    assert_eq!(sum, 3.0 * len as f32);
}

#[test]
fn after_budget_exhaustion_the_pool_keeps_working() {
    let pool = Pool::with_max_memory_mb(1);
    pool.scope(|s| {
        let a = s.zeros::<f32>(&[200_000]); // 800 KB
        let err = s.try_zeros::<f32>(&[100_000]).unwrap_err();
        assert!(
            matches!(
                err,
                Error::BudgetExceeded {
                    in_use: 800_768..,
                    ..
                }
            ),
            "{err}"
        );
        drop(a);
        for _ in 0..10 {
            assert_eq!(s.zeros::<f32>(&[100_000]).len(), 100_000);
        }
    });
    let stats = pool.stats();
    assert_eq!((stats.failed_rents, stats.bytes_in_use), (1, 0));
}
