//! Selective saving (`Saving`): a checkpointed forward whose tapes keep the outputs of products
//! (or of named ops) and whose replays bind them. Against the plain forward, on the three models of
//! `checkpoint_training` (the pre-norm MLP, the transformer blocks, the convolutional denoiser) and
//! the GPT with fused attention: the
//! loss and every gradient bit for bit under every policy, no product run again in a replay, the
//! kept bytes released by the backward, and `Policy::Memory`'s plan within its budget with the
//! kept bytes counted.

use tensorscope::checkpoint::{PlanKind, ReverseReport, Saving, StepRun};
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Policy};

use crate::checkpoint_training::{gradients, policies};
use crate::gpt::{Config, Gpt};
use crate::pre_norm_mlp::Model;
use crate::{denoiser, transformer};

const WIDTH: usize = 8;
const BATCH: usize = 4;

/// The three models, each as a training step of `ckpt` (or plain, without): the loss's bits and
/// every gradient. Policies are given for the activation size of each.
struct Case {
    name: &'static str,
    /// Layer steps and the bytes of one activation, for `policies`.
    steps: usize,
    activation: usize,
    /// Products per layer step (matmuls or convolutions), where every step has as many.
    products: Option<usize>,
    #[allow(clippy::type_complexity)]
    step: Box<dyn Fn(Option<&mut Checkpointer>) -> (u32, Vec<Vec<f32>>)>,
}

fn cases(pool: &Pool) -> Vec<Case> {
    let mlp: Model = Model::new(pool, 16, WIDTH);
    let blocks = transformer::Transformer::new(pool, 6, 8);
    let noise = denoiser::Denoiser::new(pool, 2, 4, 2);
    let config = Config {
        layers: 3,
        dim: 32,
        n_ctx: 16,
        ..Config::TINY
    };
    let gpt = Gpt::random(pool, config, 5).unwrap();
    let (p1, p2, p3, p4) = (pool.clone(), pool.clone(), pool.clone(), pool.clone());
    vec![
        Case {
            name: "pre-norm MLP",
            steps: 16,
            activation: BATCH * WIDTH * 4,
            // Two linear layers.
            products: Some(2),
            step: Box::new(move |mut ckpt: Option<&mut Checkpointer>| {
                gradients(
                    &p1,
                    &[BATCH, WIDTH],
                    |x| match ckpt.as_deref_mut() {
                        Some(ckpt) => mlp.forward(ckpt, x),
                        None => mlp.forward_plain(x),
                    },
                    |f| mlp.visit_params(&ParamPath::ROOT, &mut |_, p| f(p)),
                )
            }),
        },
        Case {
            name: "transformer",
            steps: 6,
            activation: 2 * 5 * 8 * 4,
            // q, k, v, the scores, the weighted values, the output projection; two in the MLP.
            products: Some(8),
            step: Box::new(move |mut ckpt: Option<&mut Checkpointer>| {
                gradients(
                    &p2,
                    &[2, 5, 8],
                    |x| match ckpt.as_deref_mut() {
                        Some(ckpt) => blocks.forward_checkpointed(ckpt, x),
                        None => blocks.forward(&x),
                    },
                    |f| blocks.visit_params(&ParamPath::ROOT, &mut |_, p| f(p)),
                )
            }),
        },
        Case {
            name: "denoiser",
            steps: 5,
            activation: 4 * 6 * 6 * 4,
            // One convolution per step but the upsampling's.
            products: None,
            step: Box::new(move |mut ckpt: Option<&mut Checkpointer>| {
                gradients(
                    &p3,
                    &[1, 2, 6, 6],
                    |x| match ckpt.as_deref_mut() {
                        Some(ckpt) => noise.predict_noise_checkpointed(ckpt, x),
                        None => noise.predict_noise(&x),
                    },
                    |f| noise.visit_params(&ParamPath::ROOT, &mut |_, p| f(p)),
                )
            }),
        },
        Case {
            name: "gpt",
            steps: 3,
            activation: 2 * 16 * 32 * 4,
            // The fused qkv projection, attention, its output projection and the MLP's two.
            products: Some(5),
            step: Box::new(move |mut ckpt: Option<&mut Checkpointer>| {
                let ids: Vec<i64> = (0..32).map(|i| i * 7 % 96).collect();
                p4.train(|s| {
                    let ids = s.from_slice::<i64>(&[2, 16], &ids);
                    let logits = match ckpt.as_deref_mut() {
                        Some(ckpt) => gpt.forward_checkpointed(ckpt, &ids),
                        None => gpt.forward(&ids),
                    };
                    let loss = Gpt::loss(&logits, &ids);
                    let grads = loss.backward().unwrap();
                    let all = gpt.named_params().into_iter();
                    let all = all.map(|(_, p)| grads.get(&p).expect("a gradient").to_vec());
                    (loss.item().to_bits(), all.collect())
                })
            }),
        },
    ]
}

/// The report of a checkpointed step of `case` under `policy` and `saving`, after checking its
/// gradients against `plain` bit for bit.
fn checked(
    case: &Case,
    plain: &(u32, Vec<Vec<f32>>),
    policy: &Policy,
    saving: Saving,
) -> ReverseReport {
    let config = CheckpointConfig::new(policy.clone()).with_saving(saving);
    let mut ckpt = Checkpointer::new(config);
    let got = (case.step)(Some(&mut ckpt));
    assert!(&got == plain, "{}, {policy:?}, {saving:?}", case.name);
    ckpt.last_backward().unwrap_or_default()
}

#[test]
fn kept_products_give_the_plain_gradients_bit_for_bit_and_are_not_run_again() {
    let pool = Pool::with_max_memory_mb(256);
    for case in cases(&pool) {
        let plain = (case.step)(None);
        for policy in policies(case.steps, case.activation) {
            let all = checked(&case, &plain, &policy, Saving::Nothing);
            let kept = checked(&case, &plain, &policy, Saving::Products);
            println!("{}, {policy:?}: {all:?} / {kept:?}", case.name);
            assert_eq!(all.kept_ops, 0, "{}, {policy:?}", case.name);
            assert_eq!(
                (kept.replayed_steps, kept.recomputed_steps),
                (all.replayed_steps, all.recomputed_steps)
            );
            // A replay that records runs every op but the kept products; a values-only one
            // (Budget's recomputations) also skips what only they depended on.
            let replays = kept.replayed_steps + kept.recomputed_steps;
            if kept.recomputed_steps == 0 {
                if let Some(products) = case.products {
                    assert_eq!(kept.kept_ops, products * replays, "{}", case.name);
                }
                assert_eq!(kept.replayed_ops + kept.kept_ops, all.replayed_ops);
            } else {
                // Where every step has products, at least one is bound per replay (the last
                // before the step's output); the denoiser's upsampling step has none.
                let each = case.products.is_some();
                assert!(
                    !each || kept.kept_ops >= replays,
                    "{}, {policy:?}",
                    case.name
                );
                // Ops only a bound product depended on are not run (the denoiser's steps start
                // with their convolution: nothing before it to skip).
                let ran = kept.replayed_ops + kept.kept_ops;
                assert!(ran < all.replayed_ops || (!each && ran == all.replayed_ops));
            }
            assert!(
                replays == 0 || kept.kept_ops > 0,
                "{}, {policy:?}",
                case.name
            );
        }
        // Policy::Memory: the first step profiles keeping nothing, the second (under a saving)
        // keeping the products, the third follows the plan at the smallest budget, which keeps
        // nothing (keeping needs more).
        for saving in [Saving::Nothing, Saving::Products] {
            let config = |budget| CheckpointConfig::new(Policy::Memory(budget)).with_saving(saving);
            let mut ckpt = Checkpointer::new(config(1 << 30));
            for round in 0..2 {
                let got = (case.step)(Some(&mut ckpt));
                assert!(
                    got == plain,
                    "{}, Memory, {saving:?}, round {round}",
                    case.name
                );
            }
            let smallest = ckpt.smallest_budget().expect("profiled");
            ckpt.set_config(config(smallest));
            let got = (case.step)(Some(&mut ckpt));
            assert!(
                got == plain,
                "{}, Memory({smallest}), {saving:?}",
                case.name
            );
            let report = ckpt.last_backward().unwrap_or_default();
            println!("{}, Memory({smallest}), {saving:?}: {report:?}", case.name);
            assert_eq!(report.kept_ops, 0, "{}, {saving:?}: {report:?}", case.name);
        }
        // Naming an elementwise op keeps it too, with the same gradients.
        let named = Saving::Ops(&["gelu", "silu", "matmul"]);
        let report = checked(&case, &plain, &Policy::Sqrt, named);
        assert!(report.replayed_steps == 0 || report.kept_ops > 0);
    }
}

#[test]
fn with_every_product_named_no_product_runs_in_a_replay() {
    // The MLP's products are its only matmuls: naming them and everything else but the adds
    // leaves only the adds to run.
    let pool = Pool::with_max_memory_mb(64);
    let case = cases(&pool).remove(0);
    let plain = (case.step)(None);
    let every = Policy::Every(4);
    let all = checked(&case, &plain, &every, Saving::Nothing);
    let kept = checked(&case, &plain, &every, Saving::Products);
    // 12 steps replayed (the last segment of 4 keeps its graph), two products each.
    assert_eq!(all.replayed_steps, 12);
    assert_eq!(kept.kept_ops, 24);
    assert_eq!(all.replayed_ops - kept.replayed_ops, 24);
    let per_step = all.replayed_ops / 12;
    let names = Saving::Ops(&["layer_norm", "matmul", "gelu"]);
    let most = checked(&case, &plain, &every, names);
    assert_eq!(most.kept_ops, 4 * 12, "{most:?}");
    assert_eq!(most.replayed_ops, (per_step - 4) * 12, "{most:?}");
}

/// The pool bytes a checkpointed forward of `model` under `saving` holds when it returns (its
/// output, the stored boundaries, the last segment's graph and what the tapes keep), and the peak
/// of the whole training step, both above what was in use before it.
fn held_after_forward(pool: &Pool, model: &Model, saving: Saving) -> (usize, usize) {
    pool.train(|s| {
        let config = CheckpointConfig::new(Policy::Every(8)).with_saving(saving);
        let mut ckpt = Checkpointer::new(config);
        let x = s.randn::<f32>(&[64, 32], 1);
        let target = s.randn::<f32>(&[64, 32], 2);
        let start = pool.stats().bytes_in_use;
        pool.reset_peak();
        let y = model.forward(&mut ckpt, x);
        let held = pool.stats().bytes_in_use - start;
        let grads = y.mse(&target).backward().unwrap();
        let peak = pool.stats().peak_bytes_in_use - start;
        drop(grads);
        (held, peak)
    })
}

#[test]
fn kept_outputs_are_pool_memory_released_by_the_backward() {
    let pool = Pool::with_max_memory_mb(64);
    let model: Model = Model::new(&pool, 32, 32);
    let weights = pool.stats().bytes_in_use;
    let (held, peak) = held_after_forward(&pool, &model, Saving::Nothing);
    assert_eq!(pool.stats().bytes_in_use, weights, "all released");
    let (kept_held, kept_peak) = held_after_forward(&pool, &model, Saving::Products);
    assert_eq!(pool.stats().bytes_in_use, weights, "all released");
    // The kept products: two outputs of [64, 64] and [64, 32] per taped step, 24 taped steps.
    let kept = 24 * (64 * 64 + 64 * 32) * 4;
    println!("held {held} -> {kept_held}, peak {peak} -> {kept_peak}, kept {kept}");
    assert_eq!(kept_held, held + kept);
    // Released as the backward consumes the steps: the peak grows by less than they hold.
    assert!(
        kept_peak > peak && kept_peak < peak + kept,
        "{peak} -> {kept_peak}"
    );
    // A forward dropped without its backward releases them too.
    pool.train(|s| {
        let config = CheckpointConfig::new(Policy::Every(8)).with_saving(Saving::Products);
        let mut ckpt = Checkpointer::new(config);
        let x = s.randn::<f32>(&[64, 32], 1);
        let before = pool.stats().bytes_in_use;
        drop(model.forward(&mut ckpt, x));
        drop(ckpt);
        assert_eq!(pool.stats().bytes_in_use, before - 64 * 32 * 4);
    });
}

/// One training step of the MLP under `ckpt` (none: the plain forward) into kept gradients: its
/// gradients and peak (see `checkpoint_memory::step`).
fn kept_gradients_step(
    pool: &Pool,
    model: &Model,
    ckpt: Option<&mut Checkpointer>,
) -> (Vec<Vec<f32>>, usize) {
    let (_, grads, peak) = crate::checkpoint_memory::step(pool, model, ckpt, [128, 32]);
    (grads, peak)
}

#[test]
fn a_memory_plan_with_kept_products_holds_its_budget_with_the_plain_gradients() {
    let pool = Pool::with_max_memory_mb(256);
    let model: Model = Model::new(&pool, 32, 32);
    let (plain, plain_peak) = kept_gradients_step(&pool, &model, None);
    for saving in [Saving::Nothing, Saving::Products] {
        let config = |budget| CheckpointConfig::new(Policy::Memory(budget)).with_saving(saving);
        let mut probe = Checkpointer::new(config(plain_peak));
        kept_gradients_step(&pool, &model, Some(&mut probe));
        let (grads, _) = kept_gradients_step(&pool, &model, Some(&mut probe));
        assert!(grads == plain, "{saving:?}: the profiling step's gradients");
        // Read once: what follows the profiled backward is measured until then.
        let costs = probe.costs().unwrap();
        let smallest = probe.smallest_budget().unwrap();
        assert!(
            smallest < plain_peak,
            "{saving:?}: {smallest} vs {plain_peak}"
        );
        for fraction in [0.0, 0.5] {
            let budget = smallest + ((plain_peak - smallest) as f64 * fraction) as usize;
            let mut ckpt = Checkpointer::new(config(budget));
            ckpt.set_costs(costs.clone());
            let (grads, peak) = kept_gradients_step(&pool, &model, Some(&mut ckpt));
            let report = ckpt.last_backward();
            println!("{saving:?}, plain {plain_peak}, budget {budget}: peak {peak}, {report:?}");
            assert!(grads == plain, "{saving:?}, budget {budget}");
            assert!(peak <= budget, "{saving:?}, budget {budget}: peak {peak}");
            // Stated costs are those of steps keeping nothing, and the plan keeps nothing.
            let plan = ckpt.plan_report().unwrap();
            assert_eq!(plan.saving, Saving::Nothing);
            assert!(!plan.to_string().contains("outputs of"), "{plan}");
        }
    }
}

/// Under `Policy::Memory` a saving policy is offered to the planner: it measures the steps
/// keeping nothing (counting what the saving would keep), then, if the least-memory schedule fits
/// the budget with those bytes, keeping what the saving names; each budget runs the faster of the
/// two plans that fit. So the smallest budget is that of keeping nothing, and every step holds
/// its budget, the profiling ones included, with the plain gradients.
#[test]
fn memory_offers_the_saving_to_its_planner_and_keeps_every_budget() {
    let pool = Pool::with_max_memory_mb(256);
    let model: Model = Model::new(&pool, 32, 32);
    let (plain, plain_peak) = kept_gradients_step(&pool, &model, None);
    let config = |budget, saving| CheckpointConfig::new(Policy::Memory(budget)).with_saving(saving);
    let run = |budget, saving| {
        let mut ckpt = Checkpointer::new(config(budget, saving));
        let mut runs = Vec::new();
        for round in 0..4 {
            let (grads, peak) = kept_gradients_step(&pool, &model, Some(&mut ckpt));
            let report = ckpt.plan_report().unwrap();
            println!("{saving:?}, budget {budget}, round {round}: peak {peak}\n{report}");
            assert!(grads == plain, "{saving:?}, budget {budget}, round {round}");
            assert!(
                peak <= budget,
                "{saving:?}, budget {budget}, round {round}: {peak}"
            );
            // The report says what the taped steps kept.
            let taped = report
                .steps
                .iter()
                .any(|s| matches!(s, StepRun::Taped { .. }));
            let says = report.to_string().contains("outputs of matmul, conv1d");
            assert_eq!(says, taped && report.saving == Saving::Products, "{report}");
            runs.push((report.kind, report.saving, ckpt.smallest_budget().unwrap()));
        }
        runs
    };
    let nothing = run(plain_peak, Saving::Nothing);
    let smallest = nothing[3].2;
    assert!(
        nothing[1..].iter().all(|r| r.0 == PlanKind::Planned),
        "{nothing:?}"
    );
    // At the plain step's peak: one profiling step more, keeping the products; the smallest
    // budget is that of keeping nothing all along.
    let offered = run(plain_peak, Saving::Products);
    let kinds: Vec<PlanKind> = offered.iter().map(|r| r.0).collect();
    assert_eq!(
        kinds,
        [
            PlanKind::Profiled,
            PlanKind::Profiled,
            PlanKind::Planned,
            PlanKind::Planned
        ]
    );
    assert!(
        offered.iter().all(|r| r.2 == smallest),
        "{offered:?} vs {smallest}"
    );
    assert_eq!(offered[1].1, Saving::Products, "the second profile keeps");
    let shown = offered.iter().filter(|r| r.1 == Saving::Products);
    assert!(shown.count() >= 1);
    // At the smallest budget the least schedule cannot keep the products: no second profile,
    // and schedules that keep nothing.
    let least = run(smallest, Saving::Products);
    assert!(
        least[1..]
            .iter()
            .all(|r| r.0 != PlanKind::Profiled && r.1 == Saving::Nothing),
        "{least:?}"
    );
}
