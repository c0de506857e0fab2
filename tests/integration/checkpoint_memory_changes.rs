//! `Policy::Memory` keeps its budget when what the plan was made for changes: a batch that grows
//! and shrinks, weights swapped for wider ones, sequence lengths that vary step by step, and two
//! threads training on one pool. At every step the pool's peak above the step's start is within
//! the budget, or the step fails with `MemoryBudgetTooSmall` naming the smallest budget before
//! anything runs; the gradients are the plain step's.

use tensorscope::checkpoint::{PlanKind, PlanReport};
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, CheckpointError, Checkpointer, Policy};

use crate::gpt::Gpt;

/// A chain of `tanh(x W1) W2` steps of a hidden width its weights set, on inputs of width 32.
struct Chain {
    weights: Vec<(Param, Param)>,
}

impl Chain {
    fn new(pool: &Pool, steps: usize, hidden: usize) -> Self {
        let weights = (0..steps as u64)
            .map(|i| {
                pool.scope(|s| {
                    let w1 = (s.randn::<f32>(&[32, hidden], 2 * i) * 0.1).detach();
                    let w2 = (s.randn::<f32>(&[hidden, 32], 2 * i + 1) * 0.1).detach();
                    (w1, w2)
                })
            })
            .collect();
        Chain { weights }
    }

    fn layer<'s>(&self, x: &Tensor<'s>, i: usize) -> Tensor<'s> {
        let (w1, w2) = &self.weights[i];
        &x.matmul(&x.bind(w1)).tanh().matmul(&x.bind(w2)) + x
    }

    /// One training step on a batch of `rows`: the weights' gradients and the pool's peak above
    /// what was in use when the forward started, or the forward's error.
    fn step(
        &self,
        pool: &Pool,
        rows: usize,
        ckpt: Option<&mut Checkpointer>,
    ) -> Result<(Vec<Vec<f32>>, usize), CheckpointError> {
        pool.train(|s| {
            let x = s.randn::<f32>(&[rows, 32], 7);
            let layers: Vec<usize> = (0..self.weights.len()).collect();
            let start = pool.stats().bytes_in_use;
            pool.reset_peak();
            let y = match ckpt {
                Some(ckpt) => ckpt.checkpointed_forward(&x, &layers, |x, i| self.layer(x, i))?,
                None => layers.iter().fold(x, |x, &i| self.layer(&x, i)),
            };
            let grads = y.sum_all().backward().unwrap();
            // Saturating: with another thread on the pool, its returns can take the peak reset
            // after `start` was read below `start` (the pool's figures are that thread's too).
            let peak = pool.stats().peak_bytes_in_use.saturating_sub(start);
            let all = self
                .weights
                .iter()
                .flat_map(|(a, b)| {
                    [
                        grads.get(a).unwrap().to_vec(),
                        grads.get(b).unwrap().to_vec(),
                    ]
                })
                .collect();
            Ok((all, peak))
        })
    }
}

/// Runs `rows` batches through `chain` under `ckpt`, checking each step against the plain one:
/// within the budget with its gradients, or refused before running with the smallest budget
/// (which then fits). Returns the plan reports.
fn steps_within(
    pool: &Pool,
    chain: &Chain,
    ckpt: &mut Checkpointer,
    budget: usize,
    rows: &[usize],
) -> Vec<PlanReport> {
    let mut reports = Vec::new();
    for (i, &r) in rows.iter().enumerate() {
        let (plain, _) = chain.step(pool, r, None).unwrap();
        match chain.step(pool, r, Some(ckpt)) {
            Ok((grads, peak)) => {
                let report = ckpt.plan_report().expect("a report");
                println!("step {i}, batch {r}: peak {peak} B of {budget}\n{report}");
                assert!(
                    peak <= budget,
                    "step {i}, batch {r}: peak {peak} > {budget}"
                );
                assert!(grads == plain, "step {i}, batch {r}: the plain gradients");
                let (_, measured) = report.measured.expect("measured");
                assert!(measured <= peak, "the thread's peak is within the pool's");
                reports.push(report);
            }
            Err(CheckpointError::MemoryBudgetTooSmall { smallest, .. }) => {
                assert!(smallest > budget);
                println!("step {i}, batch {r}: refused, smallest {smallest} B");
                assert_eq!(pool.stats().bytes_in_use, 0, "refused before anything ran");
                reports.push(ckpt.plan_report().expect("a report"));
            }
            Err(e) => panic!("step {i}: {e}"),
        }
    }
    reports
}

#[test]
fn a_batch_that_grows_and_shrinks_keeps_the_budget() {
    let pool = Pool::with_max_memory_mb(256);
    let chain = Chain::new(&pool, 24, 64);
    let budget = 600_000;
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Memory(budget)));
    let rows = [64, 64, 128, 128, 64, 32, 128, 64];
    let reports = steps_within(&pool, &chain, &mut ckpt, budget, &rows);
    let kinds: Vec<PlanKind> = reports.iter().map(|r| r.kind).collect();
    // Each batch size is measured once (the first twice: its first step made the gradients),
    // and its plan found again when it comes back.
    use PlanKind::{Planned, Profiled};
    assert_eq!(
        kinds,
        [Profiled, Profiled, Profiled, Planned, Planned, Profiled, Planned, Planned]
    );
}

#[test]
fn weights_swapped_for_wider_ones_replan_before_exceeding_the_budget() {
    let pool = Pool::with_max_memory_mb(256);
    let narrow = Chain::new(&pool, 24, 64);
    let wide = Chain::new(&pool, 24, 256);
    // The narrow chain's plain step fits (its plan records every graph), the wide one's does not.
    let budget = 1_800_000;
    let (_, wide_plain) = wide.step(&pool, 64, None).unwrap();
    let (_, narrow_plain) = narrow.step(&pool, 64, None).unwrap();
    assert!(narrow_plain < budget && budget < wide_plain);
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Memory(budget)));
    let mut kinds = Vec::new();
    for chain in [&narrow, &narrow, &wide, &wide, &wide, &narrow] {
        let reports = steps_within(&pool, chain, &mut ckpt, budget, &[64]);
        kinds.extend(reports.iter().map(|r| r.kind));
    }
    // The wide weights' first step finds its steps differ from the plan after the first one
    // ran on a tape: the rest of it holds the least memory, and the next one measures.
    assert!(
        matches!(kinds[2], PlanKind::Replanned { at: 1 }),
        "{kinds:?}"
    );
    assert_eq!(kinds[3], PlanKind::Profiled, "{kinds:?}");
    assert_eq!(kinds[4], PlanKind::Planned, "{kinds:?}");
}

/// One training step of `gpt` on 2 sequences of `len` tokens: every gradient, and the pool's peak
/// above what was in use when the forward started.
fn gpt_step(
    pool: &Pool,
    gpt: &Gpt,
    len: usize,
    ckpt: Option<&mut Checkpointer>,
) -> (Vec<Vec<f32>>, usize) {
    let ids: Vec<i64> = (0..2 * len as i64).map(|i| i * 7 % 96).collect();
    pool.train(|s| {
        let ids = s.from_slice::<i64>(&[2, len], &ids);
        let start = pool.stats().bytes_in_use;
        pool.reset_peak();
        let logits = match ckpt {
            Some(ckpt) => gpt.forward_checkpointed(ckpt, &ids),
            None => gpt.forward(&ids),
        };
        let grads = Gpt::loss(&logits, &ids).backward().unwrap();
        let peak = pool.stats().peak_bytes_in_use - start;
        let all: Vec<Vec<f32>> = gpt
            .named_params()
            .iter()
            .map(|(_, p)| grads.get(p).unwrap().to_vec())
            .collect();
        (all, peak)
    })
}

#[test]
fn sequence_lengths_that_vary_step_by_step_keep_the_budget() {
    let pool = Pool::with_max_memory_mb(512);
    let gpt = crate::checkpoint_memory::small_gpt(&pool);
    let budget = 3 << 20;
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Memory(budget)));
    for (i, len) in [32usize, 16, 24, 32, 16, 8, 24, 32].into_iter().enumerate() {
        let step = |ckpt: Option<&mut Checkpointer>| gpt_step(&pool, &gpt, len, ckpt);
        let (plain, plain_peak) = step(None);
        let (grads, peak) = step(Some(&mut ckpt));
        let report = ckpt.plan_report().unwrap();
        println!(
            "step {i}, length {len}: peak {peak} B (plain {plain_peak} B), {:?}",
            report.kind
        );
        assert!(peak <= budget, "step {i}, length {len}: {peak} > {budget}");
        assert!(
            grads == plain,
            "step {i}, length {len}: the plain gradients"
        );
    }
}

#[test]
fn two_threads_training_on_one_pool_each_keep_their_own_budget() {
    let pool = Pool::with_max_memory_mb(256);
    let chain = Chain::new(&pool, 24, 64);
    let other = Chain::new(&pool, 16, 128);
    let budget = 600_000;
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|threads| {
        // Another thread trains on the same pool all along.
        let trainer = threads.spawn(|| {
            let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Memory(1 << 20)));
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                other.step(&pool, 64, Some(&mut ckpt)).unwrap();
            }
        });
        /// Stops the other thread when this one is done, also if it panics (the scope waits
        /// for the other thread before it unwinds).
        struct Stop<'a>(&'a std::sync::atomic::AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let stopping = Stop(&stop);
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Memory(budget)));
        for round in 0..4 {
            let (plain, _) = chain.step(&pool, 64, None).unwrap();
            let (grads, _) = chain.step(&pool, 64, Some(&mut ckpt)).unwrap();
            assert!(grads == plain, "round {round}");
            let report = ckpt.plan_report().unwrap();
            let (_, peak) = report.measured.unwrap();
            println!("round {round}: this thread's peak {peak} B\n{report}");
            assert!(peak <= budget, "round {round}: {peak} > {budget}");
        }
        drop(stopping);
        trainer.join().unwrap();
        // Alone on the pool, the plan made beside the other thread holds the pool's own peak too.
        let (_, peak) = chain.step(&pool, 64, Some(&mut ckpt)).unwrap();
        assert!(peak <= budget, "alone: {peak} > {budget}");
    });
}

/// Step `i` of `chain` from `x`, plus the value from before the chain it reads.
fn with_skip<'s>(chain: &Chain, skips: &[Tensor<'s>], x: &Tensor<'s>, i: usize) -> Tensor<'s> {
    &chain.layer(x, i) + &skips[i % 4]
}

#[test]
fn values_from_before_the_chain_read_by_several_steps_keep_the_budget() {
    let pool = Pool::with_max_memory_mb(256);
    let chain = Chain::new(&pool, 16, 64);
    let projections: Vec<Param> = (0..4u64)
        .map(|i| pool.scope(|s| (s.randn::<f32>(&[32, 32], 100 + i) * 0.1).detach()))
        .collect();
    // Four values computed before the chain, each read by four of its steps (as a UNet's time
    // embedding or its skips from before the region are).
    let step = |ckpt: Option<&mut Checkpointer>| {
        pool.train(|s| {
            let x = s.randn::<f32>(&[64, 32], 7);
            let start = pool.stats().bytes_in_use;
            pool.reset_peak();
            let skips: Vec<Tensor<'_>> = projections.iter().map(|p| x.matmul(p).tanh()).collect();
            let layers: Vec<usize> = (0..16).collect();
            // The budget counts from the checkpointed forward's start, after the skips.
            let (y, start) = match ckpt {
                Some(ckpt) => {
                    let y = ckpt
                        .checkpointed_forward(&x, &layers, |x, i| with_skip(&chain, &skips, x, i))
                        .unwrap();
                    (y, ckpt.forward_start_bytes())
                }
                None => (
                    layers
                        .iter()
                        .fold(x.clone(), |x, &i| with_skip(&chain, &skips, &x, i)),
                    start,
                ),
            };
            let grads = y.sum_all().backward().unwrap();
            let peak = pool.stats().peak_bytes_in_use - start;
            let all: Vec<Vec<f32>> = projections
                .iter()
                .map(|p| grads.get(p).unwrap().to_vec())
                .collect();
            (all, peak)
        })
    };
    let (plain, plain_peak) = step(None);
    let mut probe = Checkpointer::new(CheckpointConfig::new(Policy::Memory(plain_peak)));
    step(Some(&mut probe));
    step(Some(&mut probe));
    let smallest = probe.smallest_budget().unwrap();
    for k in 0..6 {
        let budget = smallest + (plain_peak - smallest) * k / 5;
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Memory(budget)));
        for round in 0..3 {
            let (grads, peak) = step(Some(&mut ckpt));
            println!(
                "budget {budget}, round {round}: peak {peak} B (plain {plain_peak} B)\n{}",
                ckpt.plan_report().unwrap()
            );
            assert!(peak <= budget, "budget {budget}, round {round}: {peak} B");
            // Per-use gradients add in another order: equal to rounding.
            for (g, p) in grads.iter().zip(&plain) {
                for (a, b) in g.iter().zip(p) {
                    assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{a} vs {b}");
                }
            }
        }
    }
}

/// Ignored: the dynamic program's class misses schedules that run in less. Every `Explicit`
/// schedule that stores position 1 (one region storing 0 and 1, the steps after the last stored
/// position recorded) runs this chain in 147,520 B, where the least the program plans is
/// 155,712 B, whose own schedule (regions 0..1 and 1..2, the rest recorded) peaks at exactly
/// that; the other 21 schedules are planned within their peaks, no slower. Run with `--ignored`
/// for the list.
#[test]
#[ignore = "a known gap of the planner's class: see the doc comment"]
fn every_budget_an_explicit_schedule_fits_is_planned_within_it_and_no_slower() {
    let pool = Pool::with_max_memory_mb(256);
    let chain = Chain::new(&pool, 6, 64);
    let (plain, _) = chain.step(&pool, 64, None).unwrap();
    // The measured bytes, with every step's times made equal: the fastest schedule is the one
    // that runs the fewest steps again, which the counts show without a clock.
    let mut probe = Checkpointer::new(CheckpointConfig::new(Policy::Memory(usize::MAX)));
    chain.step(&pool, 64, Some(&mut probe)).unwrap();
    chain.step(&pool, 64, Some(&mut probe)).unwrap();
    let mut costs = probe.costs().unwrap();
    for step in &mut costs.steps {
        (step.forward_secs, step.backward_secs) = (1.0, 2.0);
    }
    let again = |ckpt: &Checkpointer| {
        ckpt.last_backward()
            .map_or(0, |r| r.recomputed_steps + r.replayed_steps)
    };
    let mut missed = Vec::new();
    for mask in 0..32u32 {
        let stored: Vec<usize> = (1..6).filter(|p| mask & (1 << (p - 1)) != 0).collect();
        let mut explicit =
            Checkpointer::new(CheckpointConfig::new(Policy::Explicit(stored.clone())));
        chain.step(&pool, 64, Some(&mut explicit)).unwrap();
        let (_, explicit_peak) = chain.step(&pool, 64, Some(&mut explicit)).unwrap();
        let explicit_again = again(&explicit);
        let mut memory = Checkpointer::new(CheckpointConfig::new(Policy::Memory(explicit_peak)));
        memory.set_costs(costs.clone());
        match chain.step(&pool, 64, Some(&mut memory)) {
            Ok((grads, peak)) => {
                assert!(grads == plain);
                assert!(
                    peak <= explicit_peak,
                    "{stored:?}: {peak} > {explicit_peak}"
                );
                if again(&memory) > explicit_again {
                    missed.push(format!(
                        "{stored:?} at {explicit_peak} B: {} steps again against {explicit_again}",
                        again(&memory)
                    ));
                }
            }
            Err(e) => missed.push(format!("{stored:?} at {explicit_peak} B: {e}")),
        }
    }
    assert!(missed.is_empty(), "{}", missed.join("\n"));
}

/// The GPT's block keeps its attention's output bound until it returns, while its replay drops it
/// after the residual sum: recording its graph in a planned forward, a block peaks above what the
/// profiling step's replay measured. That step's peak is kept with its costs (once per block),
/// and the plans that follow hold: before, every planned step met it, went stale, and the next profiled
/// again (a `Memory` row of the GPT's curve ran its least-memory schedule every step).
#[test]
fn a_step_that_holds_values_longer_than_its_replay_is_planned_again_not_profiled() {
    let pool = Pool::with_max_memory_mb(512);
    let gpt = crate::checkpoint_memory::small_gpt(&pool);
    let step = |ckpt: Option<&mut Checkpointer>| gpt_step(&pool, &gpt, 32, ckpt);
    let (plain, plain_peak) = step(None);
    let mut probe = Checkpointer::new(CheckpointConfig::new(Policy::Memory(plain_peak)));
    step(Some(&mut probe));
    step(Some(&mut probe));
    let smallest = probe.smallest_budget().unwrap();
    // Between the least and the plain step: plans that record some blocks.
    let budget = smallest + (plain_peak - smallest) / 2;
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Memory(budget)));
    let mut kinds = Vec::new();
    for i in 0..7 {
        let (grads, peak) = step(Some(&mut ckpt));
        let report = ckpt.plan_report().unwrap();
        println!("step {i}: peak {peak} B of {budget} (plain {plain_peak})\n{report}");
        assert!(grads == plain, "step {i}: the plain gradients");
        assert!(peak <= budget, "step {i}: {peak} > {budget}");
        kinds.push(report.kind);
    }
    // Profiled twice (the first step made the gradients), then planned: each block that peaks
    // above its replay is met once (4 blocks), and the plans after that hold.
    let profiled = kinds.iter().filter(|k| **k == PlanKind::Profiled).count();
    assert_eq!(profiled, 2, "the first two steps only: {kinds:?}");
    let replanned = kinds
        .iter()
        .filter(|k| matches!(k, PlanKind::Replanned { .. }));
    assert!(replanned.count() <= 4, "{kinds:?}");
    assert_eq!(kinds[5..], [PlanKind::Planned; 2], "{kinds:?}");
}
