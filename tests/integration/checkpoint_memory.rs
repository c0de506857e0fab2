//! `Policy::Memory`: checkpointing placed by a byte budget for the whole training step. The pool's
//! own peak stays within the budget, the gradients are the plain ones bit for bit, a budget no
//! schedule fits in names the smallest one that does, and layers of different sizes are placed
//! by their costs.

use tensorscope::checkpoint::PlanKind;
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, CheckpointError, Checkpointer, Policy};

use tensorscope::Gradients;

use crate::denoiser::Denoiser;
use crate::gpt::{Config, Gpt};
use crate::pre_norm_mlp::Model;

/// One training step into gradients kept from an earlier step (their buffers are the training
/// loop's, as the parameters are): its loss, every parameter's gradient, and the pool's peak above
/// what was in use when the forward started (the input and the target made).
pub(crate) fn step(
    pool: &Pool,
    model: &Model,
    ckpt: Option<&mut Checkpointer>,
    shape: [usize; 2],
) -> (f32, Vec<Vec<f32>>, usize) {
    pool.train(|s| {
        let x = s.randn::<f32>(&shape, 100);
        let target = s.randn::<f32>(&shape, 101);
        let mut grads = model
            .forward_plain(x.clone())
            .mse(&target)
            .backward()
            .unwrap();
        grads.zero().unwrap();
        let start = pool.stats().bytes_in_use;
        pool.reset_peak();
        let y = match ckpt {
            Some(ckpt) => model.forward(ckpt, x),
            None => model.forward_plain(x),
        };
        let loss = y.mse(&target);
        loss.backward_into(&mut grads).unwrap();
        let peak = pool.stats().peak_bytes_in_use - start;
        let mut all = Vec::new();
        model.visit_params(&ParamPath::ROOT, &mut |_, p| {
            all.push(grads.get(p).expect("a gradient").to_vec())
        });
        (loss.item(), all, peak)
    })
}

#[test]
fn the_step_stays_within_the_budget_with_the_plain_gradients() {
    let pool = Pool::with_max_memory_mb(256);
    let width = 32;
    let model = Model::new(&pool, 64, width);
    let (loss, grads, plain_peak) = step(&pool, &model, None, [16, width]);
    // The smallest budget, from the error of one far too small. The first step measures.
    let mut probe = Checkpointer::new(CheckpointConfig::new(Policy::Memory(1)));
    let (_, _, profiling_peak) = step(&pool, &model, Some(&mut probe), [16, width]);
    let smallest = match pool.train(|s| {
        let x = s.randn::<f32>(&[16, width], 100);
        let layers: Vec<usize> = (0..64).collect();
        probe
            .checkpointed_forward(&x, &layers, |x, i| model.blocks[i].forward(x))
            .map(drop)
    }) {
        Err(CheckpointError::MemoryBudgetTooSmall {
            smallest, layers, ..
        }) => {
            assert_eq!(layers, 64);
            smallest
        }
        other => panic!("{other:?}"),
    };
    println!("plain {plain_peak} B, profiling {profiling_peak} B, smallest {smallest} B");
    assert!(
        profiling_peak <= smallest,
        "the profiling step holds the least a backward can"
    );
    assert!(smallest < plain_peak / 4, "{smallest} vs {plain_peak}");
    for budget in [
        smallest,
        smallest * 3 / 2,
        smallest * 2,
        plain_peak / 2,
        plain_peak * 2,
    ] {
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Memory(budget)));
        for round in 0..4 {
            let (got_loss, got, peak) = step(&pool, &model, Some(&mut ckpt), [16, width]);
            assert_eq!(got_loss.to_bits(), loss.to_bits(), "budget {budget}");
            assert!(
                got == grads,
                "budget {budget}, round {round}: the plain gradients"
            );
            let report = ckpt.last_backward();
            println!("budget {budget} round {round}: peak {peak} B, {report:?}");
            // The profiling step (round 0) included.
            assert!(
                peak <= budget,
                "budget {budget}, round {round}: peak {peak}"
            );
        }
    }
}

/// A chain of 32 steps `tanh(x W_i)` whose activations alternate between 64 and 640 wide.
struct Alternating {
    weights: Vec<Param>,
    input: usize,
}

impl Alternating {
    fn new(pool: &Pool, starts_narrow: bool) -> Self {
        Self::with_layers(pool, starts_narrow, 32)
    }

    fn with_layers(pool: &Pool, starts_narrow: bool, n: usize) -> Self {
        let (a, b) = if starts_narrow { (64, 640) } else { (640, 64) };
        let weights = (0..n)
            .map(|i| {
                let shape = if i % 2 == 0 { [a, b] } else { [b, a] };
                pool.scope(|s| (s.randn::<f32>(&shape, i as u64) * 0.05).detach())
            })
            .collect();
        Alternating { weights, input: a }
    }

    fn layer<'s>(&self, x: &Tensor<'s>, i: usize) -> Tensor<'s> {
        x.matmul(&x.bind(&self.weights[i])).tanh()
    }

    /// The loss's gradients (kept buffers), the step's pool peak, and the backward's report.
    fn step(&self, pool: &Pool, ckpt: Option<&mut Checkpointer>) -> (Vec<Vec<f32>>, usize) {
        pool.train(|s| {
            let x = s.randn::<f32>(&[4, self.input], 7);
            let layers: Vec<usize> = (0..self.weights.len()).collect();
            let plain = layers.iter().fold(x.clone(), |x, &i| self.layer(&x, i));
            let mut grads = plain.sum_all().backward().unwrap();
            grads.zero().unwrap();
            let start = pool.stats().bytes_in_use;
            pool.reset_peak();
            let y = match ckpt {
                Some(ckpt) => ckpt
                    .checkpointed_forward(&x, &layers, |x, i| self.layer(x, i))
                    .unwrap(),
                None => layers.iter().fold(x, |x, &i| self.layer(&x, i)),
            };
            y.sum_all().backward_into(&mut grads).unwrap();
            let peak = pool.stats().peak_bytes_in_use - start;
            let all = self
                .weights
                .iter()
                .map(|w| grads.get(w).unwrap().to_vec())
                .collect();
            (all, peak)
        })
    }
}

#[test]
fn layers_of_different_sizes_are_placed_by_their_costs_within_the_budget() {
    let pool = Pool::with_max_memory_mb(256);
    let chain = Alternating::new(&pool, false);
    let (plain, plain_peak) = chain.step(&pool, None);
    let memory_steps = |chain: &Alternating, plain: &[Vec<f32>], budget: usize| {
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Memory(budget)));
        let (_, profiling) = chain.step(&pool, Some(&mut ckpt));
        assert!(
            profiling <= budget,
            "budget {budget}: profiling {profiling}"
        );
        let (grads, peak) = chain.step(&pool, Some(&mut ckpt));
        assert!(grads == plain, "budget {budget}: the plain gradients");
        assert!(peak <= budget, "budget {budget}: peak {peak}");
        let r = ckpt
            .last_backward()
            .map_or(0, |r| r.recomputed_steps + r.replayed_steps);
        (peak, r)
    };
    // Against Budget at the peak Budget's own step reaches: no more layer steps run again.
    for slots in [2, 4, 8] {
        let wide = 4 * 640 * 4;
        let mut budget = Checkpointer::new(CheckpointConfig::new(Policy::Budget(slots * wide)));
        let (grads, budget_peak) = chain.step(&pool, Some(&mut budget));
        assert!(grads == plain);
        let r = budget.last_backward().unwrap();
        let budget_steps = r.recomputed_steps + r.replayed_steps;
        let (peak, steps) = memory_steps(&chain, &plain, budget_peak);
        println!(
            "{slots} wide slots: Budget {budget_steps} steps at {budget_peak} B; \
             Memory {steps} at {peak} B (plain {plain_peak} B)"
        );
        assert!(steps <= budget_steps, "{steps} > {budget_steps}");
    }
    // A chain that starts narrow, at budgets from the smallest that fits to the plain step's.
    let chain = Alternating::new(&pool, true);
    let (plain, plain_peak) = chain.step(&pool, None);
    let mut probe = Checkpointer::new(CheckpointConfig::new(Policy::Memory(1)));
    chain.step(&pool, Some(&mut probe));
    let smallest = match pool.train(|s| {
        let layers: Vec<usize> = (0..32).collect();
        probe
            .checkpointed_forward(&s.randn::<f32>(&[4, 64], 7), &layers, |x, i| {
                chain.layer(x, i)
            })
            .map(drop)
    }) {
        Err(CheckpointError::MemoryBudgetTooSmall { smallest, .. }) => smallest,
        other => panic!("{other:?}"),
    };
    for k in 0..=8 {
        let budget = smallest + (plain_peak - smallest) * k / 8;
        let (peak, steps) = memory_steps(&chain, &plain, budget);
        println!("starts narrow, budget {budget}: {steps} steps at {peak} B");
    }
}

#[test]
fn a_chain_longer_than_the_planner_steps_through_is_planned_on_runs_within_the_budget() {
    // 150 layers: planned on 100 runs of one or two layers, each recorded or replayed whole.
    let pool = Pool::with_max_memory_mb(256);
    let chain = Alternating::with_layers(&pool, true, 150);
    let (plain, plain_peak) = chain.step(&pool, None);
    let mut probe = Checkpointer::new(CheckpointConfig::new(Policy::Memory(plain_peak)));
    chain.step(&pool, Some(&mut probe)); // as under Sqrt
    let (grads, _) = chain.step(&pool, Some(&mut probe)); // profiling
    assert!(grads == plain);
    let smallest = probe.smallest_budget().unwrap();
    assert!(smallest < plain_peak / 2, "{smallest} vs {plain_peak}");
    for k in 0..=4 {
        let budget = smallest + (plain_peak - smallest) * k / 4;
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Memory(budget)));
        ckpt.set_costs(probe.costs().unwrap());
        let (grads, peak) = chain.step(&pool, Some(&mut ckpt));
        let again = ckpt
            .last_backward()
            .map_or(0, |r| r.recomputed_steps + r.replayed_steps);
        println!("150 layers, budget {budget}: peak {peak} B, {again} steps again (plain {plain_peak} B)");
        assert!(grads == plain, "budget {budget}: the plain gradients");
        assert!(peak <= budget, "budget {budget}: peak {peak}");
        if budget == plain_peak {
            assert_eq!(again, 0, "the plain step fits its own peak");
        }
    }
}

/// Steps of a model under `Policy::Memory` at budgets between the least that fits and its plain
/// step's peak: each planned step within its budget, with the plain step's gradients. `step` runs
/// one training step into kept gradients and returns them with the pool's peak above what was in
/// use when the checkpointed forward started.
pub(crate) fn within_budgets(
    name: &str,
    step: impl Fn(Option<&mut Checkpointer>) -> (Vec<Vec<f32>>, usize),
) {
    let (plain, plain_peak) = step(None);
    let mut probe = Checkpointer::new(CheckpointConfig::new(Policy::Memory(plain_peak)));
    let (grads, profiling_peak) = step(Some(&mut probe));
    assert!(grads == plain, "{name}: the profiling step's gradients");
    let smallest = probe.smallest_budget().unwrap();
    assert!(
        smallest < plain_peak,
        "{name}: {smallest} B, plain {plain_peak} B"
    );
    for fraction in [0.0, 0.3, 0.7] {
        let budget = smallest + ((plain_peak - smallest) as f64 * fraction) as usize;
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Memory(budget)));
        ckpt.set_costs(probe.costs().unwrap());
        for round in 0..2 {
            let (grads, peak) = step(Some(&mut ckpt));
            println!(
                "{name}: plain {plain_peak} B, profiling {profiling_peak} B, budget {budget}: \
                 peak {peak} B, {:?}",
                ckpt.last_backward()
            );
            assert!(
                grads == plain,
                "{name}, budget {budget}: the plain gradients"
            );
            assert!(
                peak <= budget,
                "{name}, budget {budget}, round {round}: peak {peak} B"
            );
            // The plan's predicted peak bounds what the step measured, within the budget.
            let report = ckpt.plan_report().unwrap();
            let (_, measured) = report.measured.unwrap();
            let predicted = report.predicted_peak.unwrap();
            println!("{report}");
            assert!(
                measured <= predicted && predicted <= budget,
                "{name}, budget {budget}, round {round}: measured {measured} B, predicted \
                 {predicted} B"
            );
        }
    }
}

/// One training step into `grads` (made by a plain step first, then kept): the gradients of
/// `params` and the pool's peak above what was in use when the checkpointed forward started (when
/// `loss` started, without a checkpointer).
pub(crate) fn kept_step<'s>(
    pool: &Pool,
    grads: &mut Option<Gradients<'s>>,
    loss: impl FnOnce(Option<&mut Checkpointer>) -> Tensor<'s>,
    ckpt: Option<&mut Checkpointer>,
    params: &[&Param],
) -> (Vec<Vec<f32>>, usize) {
    let mut start = pool.stats().bytes_in_use;
    pool.reset_peak();
    let loss = match ckpt {
        Some(ckpt) => {
            let loss = loss(Some(&mut *ckpt));
            start = ckpt.forward_start_bytes();
            loss
        }
        None => loss(None),
    };
    match grads {
        Some(grads) => loss.backward_into(grads).unwrap(),
        None => *grads = Some(loss.backward().unwrap()),
    }
    let peak = pool.stats().peak_bytes_in_use - start;
    let grads = grads.as_ref().unwrap();
    let all = params
        .iter()
        .map(|p| grads.get(p).unwrap().to_vec())
        .collect();
    (all, peak)
}

/// The GPT the budget tests train: 4 blocks of width 64 over 32 positions.
pub(crate) fn small_gpt(pool: &Pool) -> Gpt {
    let config = Config {
        layers: 4,
        dim: 64,
        n_ctx: 32,
        ..Config::TINY
    };
    Gpt::random(pool, config, 5).unwrap()
}

#[test]
fn the_gpt_and_the_denoiser_steps_stay_within_their_budgets() {
    let pool = Pool::with_max_memory_mb(512);
    let gpt = small_gpt(&pool);
    let params: Vec<Param> = gpt.named_params().into_iter().map(|(_, p)| p).collect();
    let params: Vec<&Param> = params.iter().collect();
    within_budgets("gpt", |ckpt| {
        pool.train(|s| {
            let ids =
                s.from_slice::<i64>(&[2, 32], &(0..64).map(|i| i * 7 % 96).collect::<Vec<_>>());
            let mut grads = None;
            let loss = |ckpt: Option<&mut Checkpointer>| {
                let logits = match ckpt {
                    Some(ckpt) => gpt.forward_checkpointed(ckpt, &ids),
                    None => gpt.forward(&ids),
                };
                Gpt::loss(&logits, &ids)
            };
            kept_step(&pool, &mut grads, loss, None, &params);
            grads.as_mut().unwrap().zero().unwrap();
            kept_step(&pool, &mut grads, loss, ckpt, &params)
        })
    });

    let denoiser = Denoiser::new(&pool, 4, 16, 4);
    let params: Vec<Param> = denoiser
        .named_params()
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    let params: Vec<&Param> = params.iter().collect();
    within_budgets("denoiser", |ckpt| {
        pool.train(|s| {
            let x = s.randn::<f32>(&[1, 4, 24, 24], 3);
            let target = s.randn::<f32>(&[1, 4, 24, 24], 4);
            let mut grads = None;
            let loss = |ckpt: Option<&mut Checkpointer>| {
                let y = match ckpt {
                    Some(ckpt) => denoiser.predict_noise_checkpointed(ckpt, x.clone()),
                    None => denoiser.predict_noise(&x),
                };
                y.mse(&target)
            };
            kept_step(&pool, &mut grads, loss, None, &params);
            grads.as_mut().unwrap().zero().unwrap();
            kept_step(&pool, &mut grads, loss, ckpt, &params)
        })
    });
}

/// The 64-block MLP with its block loop under the attribute's budget, and no checkpointer.
struct Attributed(Model);

impl Attributed {
    #[checkpoint(memory = "128 KiB")]
    fn forward<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let mut x = x;
        for block in &self.0.blocks {
            x = block.forward(&x);
        }
        x
    }
}

#[test]
fn the_attribute_keeps_what_it_measured_without_a_checkpointer() {
    let pool = Pool::with_max_memory_mb(256);
    let width = 32;
    let model = Attributed(Model::new(&pool, 64, width));
    let (loss, grads, plain_peak) = step(&pool, &model.0, None, [16, width]);
    assert!(
        plain_peak > 4 * 128 * 1024,
        "{plain_peak} B: the budget is a real constraint"
    );
    for round in 0..4 {
        let (got_loss, got, peak) = pool.train(|s| {
            let x = s.randn::<f32>(&[16, width], 100);
            let target = s.randn::<f32>(&[16, width], 101);
            let mut kept = model
                .0
                .forward_plain(x.clone())
                .mse(&target)
                .backward()
                .unwrap();
            kept.zero().unwrap();
            let start = pool.stats().bytes_in_use;
            pool.reset_peak();
            let loss = model.forward(x).mse(&target);
            loss.backward_into(&mut kept).unwrap();
            let peak = pool.stats().peak_bytes_in_use - start;
            let mut all = Vec::new();
            model.0.visit_params(&ParamPath::ROOT, &mut |_, p| {
                all.push(kept.get(p).unwrap().to_vec())
            });
            (loss.item(), all, peak)
        });
        assert_eq!(got_loss.to_bits(), loss.to_bits());
        assert!(got == grads, "round {round}: the plain gradients");
        // The first step measures; the second plans with what it measured, kept for this
        // function on this thread.
        println!("round {round}: peak {peak} B");
        assert!(peak <= 128 * 1024, "round {round}: peak {peak} B");
    }
}

#[test]
fn a_budget_too_small_and_narrow_storage_are_refused_with_what_would_fit() {
    use tensorscope::Precision;
    let pool = Pool::with_max_memory_mb(64);
    let chain = Alternating::new(&pool, true);
    let layers: Vec<usize> = (0..32).collect();
    let forward = |ckpt: &mut Checkpointer| {
        pool.train(|s| {
            let x = s.randn::<f32>(&[4, 64], 7);
            ckpt.checkpointed_forward(&x, &layers, |x, i| chain.layer(x, i))
                .map(|y| y.sum_all().backward().map(drop))
        })
    };
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Memory(1000)));
    assert!(ckpt.costs().is_none() && ckpt.smallest_budget().is_none());
    // The first step measures, whatever the budget, and the second again (the first made the
    // gradients, which this loop makes every step).
    for _ in 0..2 {
        forward(&mut ckpt).unwrap().unwrap();
        assert_eq!(ckpt.plan_report().unwrap().kind, PlanKind::Profiled);
    }
    let smallest = ckpt.smallest_budget().unwrap();
    let err = forward(&mut ckpt).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "no schedule of these 32 layers fits in 1000 bytes; the smallest budget that fits is \
             {smallest} bytes"
        )
    );
    // That smallest budget fits.
    ckpt.set_config(CheckpointConfig::new(Policy::Memory(smallest)));
    forward(&mut ckpt).unwrap().unwrap();

    let narrow = CheckpointConfig::new(Policy::Memory(1 << 20)).with_precision(Precision::F16);
    let mut ckpt = Checkpointer::new(narrow);
    assert!(matches!(
        forward(&mut ckpt),
        Err(CheckpointError::InvalidPolicy(why)) if why.contains("full precision")
    ));
}
