//! The checkpointer: what each policy stores, exact recompute, memory figures, the binomial
//! schedule's recompute counts against Griewank and Walther's formula, and every error.

use std::cell::Cell;

use tensorscope::checkpoint::{binomial_recompute_steps, ReverseReport};
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, CheckpointError, Checkpointer, Policy, Precision};

use crate::common::max_abs_diff;

/// One "layer": a little nonlinear map whose output depends on the layer index.
fn layer_step<'s>(x: &Tensor<'s>, i: usize) -> Tensor<'s> {
    (x * (1.0 + 0.01 * i as f32) + 0.1).tanh()
}

/// The inputs of every layer, from a plain forward: `a_0 .. a_{n-1}`, and the output.
fn plain_forward(s: &Scope<'_, '_>, n: usize) -> (Vec<Vec<f32>>, Vec<f32>) {
    let mut x = s.randn::<f32>(&[4, 8], 7);
    let mut inputs = Vec::new();
    for i in 0..n {
        inputs.push(x.to_vec());
        x = layer_step(&x, i);
    }
    (inputs, x.to_vec())
}

/// Pins a closure to the layer-step signature for every brand, so it can be bound with `let`.
fn step<F>(f: F) -> F
where
    F: for<'a> FnMut(&Tensor<'a>, usize) -> Tensor<'a>,
{
    f
}

fn config(policy: Policy) -> CheckpointConfig {
    CheckpointConfig::new(policy)
}

#[test]
fn each_policy_stores_exactly_its_layers() {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|s| {
        let input = s.randn::<f32>(&[4, 8], 7);
        let bytes = input.data_bytes();
        let cases: Vec<(usize, Policy, Vec<usize>)> = vec![
            (16, Policy::Every(4), vec![0, 4, 8, 12]),
            (16, Policy::Every(5), vec![0, 5, 10, 15]),
            (16, Policy::Sqrt, vec![0, 4, 8, 12]),
            (64, Policy::Sqrt, (0..64).step_by(8).collect()),
            (16, Policy::Explicit(vec![3, 9]), vec![0, 3, 9]),
            (16, Policy::Budget(16 * bytes), (0..16).collect()),
            (16, Policy::Budget(bytes), vec![0]),
        ];
        for (n, policy, expected) in cases {
            let layers: Vec<usize> = (0..n).collect();
            let mut ckpt = Checkpointer::new(config(policy.clone()));
            ckpt.checkpointed_forward(&input, &layers, layer_step)
                .unwrap();
            assert_eq!(ckpt.stored_layers(), expected, "{policy:?}, n = {n}");
            assert!(expected.iter().all(|&l| ckpt.is_checkpoint_layer(l)));
            assert_eq!(ckpt.memory_stored_bytes(), expected.len() * bytes);
            assert_eq!(ckpt.memory_saved_bytes(), (n - expected.len()) * bytes);
        }
    });
}

#[test]
fn recompute_is_bit_identical_at_full_precision_for_every_policy() {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|s| {
        for n in [16, 64] {
            let (inputs, output) = plain_forward(s, n);
            let layers: Vec<usize> = (0..n).collect();
            let input = s.randn::<f32>(&[4, 8], 7);
            for policy in [
                Policy::Every(4),
                Policy::Sqrt,
                Policy::Explicit(vec![10]),
                Policy::Budget(5 * 128),
            ] {
                let mut ckpt = Checkpointer::new(config(policy.clone()));
                let out = ckpt
                    .checkpointed_forward(&input, &layers, layer_step)
                    .unwrap();
                assert_eq!(out.to_vec(), output);
                for (target, want) in inputs.iter().enumerate() {
                    let a = ckpt
                        .recompute_from_checkpoint(s, target, &layers, layer_step)
                        .unwrap();
                    assert_eq!(&a.to_vec(), want, "{policy:?} n={n} layer {target}");
                }
            }
        }
    });
}

#[test]
fn reverse_hands_each_layer_its_exact_input_last_first() {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|s| {
        let n = 16;
        let (inputs, _) = plain_forward(s, n);
        let layers: Vec<usize> = (0..n).collect();
        let input = s.randn::<f32>(&[4, 8], 7);
        let bytes = input.data_bytes();
        for (policy, steps, peak) in [
            (Policy::Every(4), n - 4, 4 + 4 - 1), // n/k + k - 1 at the last segment
            (Policy::Sqrt, n - 4, 7),
            (Policy::Every(1), 0, n),
            (
                Policy::Budget(3 * bytes),
                binomial_recompute_steps(16, 3) as usize,
                4,
            ),
        ] {
            let mut ckpt = Checkpointer::new(config(policy.clone()));
            ckpt.checkpointed_forward(&input, &layers, layer_step)
                .unwrap();
            let mut seen = Vec::new();
            let report = ckpt
                .reverse(s, layer_step, |layer, x| {
                    assert_eq!(x.to_vec(), inputs[layer], "{policy:?} layer {layer}");
                    seen.push(layer);
                })
                .unwrap();
            assert_eq!(seen, (0..n).rev().collect::<Vec<_>>());
            assert_eq!(report.recomputed_steps, steps, "{policy:?}");
            assert_eq!(report.peak_activations, peak, "{policy:?}");
            assert_eq!(
                ckpt.num_checkpoints(),
                0,
                "the sweep consumes the checkpoints"
            );
        }
    });
}

#[test]
fn binomial_recompute_counts_follow_the_revolve_formula() {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|s| {
        let input = s.ones::<f32>(&[2]);
        // A budget counts what the pool holds per activation: its size class.
        let bytes = input.allocated_bytes();
        let evaluations = Cell::new(0usize);
        let mut counted = step(|x, i| {
            evaluations.set(evaluations.get() + 1);
            x + i as f32
        });
        for n in [1usize, 2, 5, 10, 16, 33, 64] {
            for slots in [1usize, 2, 3, 4, 6, 10] {
                let layers: Vec<usize> = (0..n).collect();
                let mut ckpt = Checkpointer::new(config(Policy::Budget(slots * bytes)));
                evaluations.set(0);
                ckpt.checkpointed_forward(&input, &layers, &mut counted)
                    .unwrap();
                assert_eq!(evaluations.get(), n);
                assert!(ckpt.num_checkpoints() <= slots);
                evaluations.set(0);
                let mut calls = 0;
                let report: ReverseReport =
                    ckpt.reverse(s, &mut counted, |_, _| calls += 1).unwrap();
                let formula = binomial_recompute_steps(n as u64, slots.min(n) as u64) as usize;
                assert_eq!(report.recomputed_steps, formula, "n={n} slots={slots}");
                assert_eq!(evaluations.get(), formula, "n={n} slots={slots}");
                assert!(
                    report.peak_activations <= slots.min(n) + 1,
                    "n={n} slots={slots}"
                );
                assert_eq!(calls, n);
            }
        }
    });
}

#[test]
fn low_precision_storage_halves_the_bytes_with_a_measured_error() {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|s| {
        let n = 16;
        let (inputs, _) = plain_forward(s, n);
        let layers: Vec<usize> = (0..n).collect();
        let input = s.randn::<f32>(&[4, 8], 7);
        for (precision, bound) in [(Precision::F16, 2e-3), (Precision::Bf16, 1.6e-2)] {
            let mut ckpt = Checkpointer::new(config(Policy::Every(4)).with_precision(precision));
            ckpt.checkpointed_forward(&input, &layers, layer_step)
                .unwrap();
            assert_eq!(
                ckpt.memory_stored_bytes(),
                4 * 32 * 2,
                "{precision:?}: 2 bytes each"
            );
            // Normwise: the largest error in an activation over its largest magnitude.
            let mut max_rel = 0f32;
            for (target, want) in inputs.iter().enumerate() {
                let a = ckpt
                    .recompute_from_checkpoint(s, target, &layers, layer_step)
                    .unwrap();
                let err = max_abs_diff(&a.to_vec(), want);
                let scale = want.iter().fold(0f32, |m, w| m.max(w.abs()));
                max_rel = max_rel.max(err / scale);
            }
            println!(
                "{precision:?}: max normwise relative error of recomputed activations {max_rel:.2e}"
            );
            assert!(
                max_rel > 0.0,
                "{precision:?} storage is lossy, never exact here"
            );
            assert!(max_rel < bound, "{precision:?}: {max_rel}");
        }
    });
}

#[test]
fn stored_checkpoints_are_pool_buffers() {
    let pool = Pool::with_max_memory_mb(64);
    let layers: Vec<usize> = (0..8).collect();
    let mut ckpt = Checkpointer::new(config(Policy::Every(2)).with_precision(Precision::F16));
    pool.scope(|s| {
        let input = s.ones::<f32>(&[1024]);
        ckpt.checkpointed_forward(&input, &layers, layer_step)
            .unwrap();
    });
    assert_eq!(
        pool.stats().bytes_in_use,
        4 * 2048,
        "four f16 copies outlive the scope"
    );
    ckpt.clear();
    assert_eq!(pool.stats().bytes_in_use, 0);
}

#[test]
fn bad_input_gives_typed_errors() {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|s| {
        let input = s.ones::<f32>(&[4]);
        let layers: Vec<usize> = (0..8).collect();
        let mut ckpt = Checkpointer::new(config(Policy::Every(4)));
        ckpt.checkpointed_forward(&input, &layers, layer_step)
            .unwrap();

        let err = ckpt.get(5).unwrap_err();
        assert_eq!(
            err,
            CheckpointError::NotStored {
                layer: 5,
                stored: vec![0, 4]
            }
        );
        assert_eq!(
            err.to_string(),
            "no checkpoint is stored for layer 5; stored: [0, 4]"
        );
        let err = ckpt
            .recompute_from_checkpoint(s, 99, &layers, layer_step)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "layer 99 is not in the layer list of the forward pass (8 layers)"
        );
        let err = ckpt
            .checkpointed_forward(&input, &[0, 1, 0], layer_step)
            .unwrap_err();
        assert!(matches!(
            err,
            CheckpointError::BadLayer {
                layer: 0,
                problem: "appears twice in",
                ..
            }
        ));

        // Shape drift: a layer that behaves differently on the replay.
        let calls = Cell::new(0);
        let mut drifting = step(|x, i| {
            calls.set(calls.get() + 1);
            if calls.get() > 8 && i == 5 {
                x.reshape(&[2, 2])
            } else {
                x + 1.0
            }
        });
        ckpt.checkpointed_forward(&input, &layers, &mut drifting)
            .unwrap();
        let err = ckpt
            .recompute_from_checkpoint(s, 7, &layers, &mut drifting)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "recomputing the input of layer 6 gave shape [2, 2], but the forward pass gave [4]"
        );

        let invalid = |policy| {
            Checkpointer::new(config(policy))
                .checkpointed_forward(&input, &layers, layer_step)
                .unwrap_err()
        };
        assert!(matches!(
            invalid(Policy::Every(0)),
            CheckpointError::InvalidPolicy(_)
        ));
        assert_eq!(
            invalid(Policy::Explicit(vec![8])).to_string(),
            "invalid checkpoint policy: explicit checkpoint position 8 is past the last of 8 layers"
        );
        // 16 bytes of data take a 64-byte size class in the pool.
        assert_eq!(
            invalid(Policy::Budget(63)).to_string(),
            "invalid checkpoint policy: a budget of 63 bytes holds no stored activation of 64 \
             bytes (16 bytes of data in the pool's size class)"
        );

        let mut limited = Checkpointer::new(config(Policy::Every(2)).with_max_checkpoints(3));
        let err = limited
            .checkpointed_forward(&input, &layers, layer_step)
            .unwrap_err();
        assert_eq!(
            err,
            CheckpointError::LimitExceeded {
                layer: 6,
                needed: 4,
                limit: 3
            }
        );
        let mut limited = Checkpointer::new(config(Policy::Every(2)).with_max_checkpoints(1));
        limited.save(0, &input).unwrap();
        limited.save(0, &input).unwrap(); // replacing is not adding
        assert!(matches!(
            limited.save(1, &input),
            Err(CheckpointError::LimitExceeded { .. })
        ));

        let nan = s.from_slice::<f32>(&[2], &[1.0, f32::NAN]);
        let err = ckpt.save(0, &nan).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the input of layer 0 cannot be stored: it holds NaN"
        );
        let mut half = Checkpointer::new(config(Policy::Every(1)).with_precision(Precision::F16));
        let err = half.save(0, &s.full::<f32>(&[2], 1e5)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the input of layer 0 cannot be stored: 100000 is beyond the f16 range (+-65504)"
        );
    });
}

#[test]
fn a_sweep_follows_the_forwards_plan_and_consumes_the_checkpoints() {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|s| {
        let input = s.ones::<f32>(&[4]);
        let layers: Vec<usize> = (0..8).collect();
        // The sweep follows the plan the forward made, even if the config changed since.
        let mut ckpt = Checkpointer::new(config(Policy::Every(4)));
        ckpt.checkpointed_forward(&input, &layers, layer_step)
            .unwrap();
        ckpt.set_config(config(Policy::Budget(1 << 20)));
        let mut calls = 0;
        let report = ckpt.reverse(s, layer_step, |_, _| calls += 1).unwrap();
        assert_eq!((calls, report.recomputed_steps), (8, 6));
        // A second sweep finds the checkpoints consumed.
        let err = ckpt.reverse(s, layer_step, |_, _| ()).unwrap_err();
        assert_eq!(
            err,
            CheckpointError::UnknownLayer {
                layer: 0,
                stored: vec![]
            }
        );
    });
}

#[test]
fn a_forward_over_no_layers_stores_nothing_under_every_policy() {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|s| {
        let input = s.ones::<f32>(&[4]);
        for policy in [
            Policy::Explicit(vec![]),
            Policy::Budget(1 << 20),
            Policy::Sqrt,
        ] {
            let mut ckpt = Checkpointer::new(config(policy));
            let out = ckpt.checkpointed_forward(&input, &[], layer_step).unwrap();
            assert!(out.shares_buffer_with(&input));
            assert_eq!(ckpt.num_checkpoints(), 0);
            assert_eq!(
                ckpt.reverse(s, layer_step, |_, _| unreachable!())
                    .unwrap()
                    .recomputed_steps,
                0
            );
        }
    });
}

#[test]
fn the_limit_error_names_the_layer_id_and_clear_forgets_the_plan() {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|s| {
        let input = s.ones::<f32>(&[4]);
        let ids: Vec<usize> = (100..108).collect();
        let mut limited = Checkpointer::new(config(Policy::Every(2)).with_max_checkpoints(3));
        let err = limited
            .checkpointed_forward(&input, &ids, layer_step)
            .unwrap_err();
        assert_eq!(
            err,
            CheckpointError::LimitExceeded {
                layer: 106,
                needed: 4,
                limit: 3
            }
        );
        let layers: Vec<usize> = (0..8).collect();
        let mut sqrt = Checkpointer::new(config(Policy::Sqrt));
        sqrt.checkpointed_forward(&input, &layers, layer_step)
            .unwrap();
        assert!(sqrt.is_checkpoint_layer(3));
        sqrt.clear();
        assert!(!sqrt.is_checkpoint_layer(3));
    });
}

#[test]
fn narrow_storage_refuses_values_it_would_round_to_infinity_whatever_the_source_type() {
    use tensorscope::{bf16, f16};
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let f16_storage = config(Policy::Every(1)).with_precision(Precision::F16);
        // 65536 is a bf16 value past f16's 65504 (a bound converted to bf16 rounds to 65536).
        let mut from_bf16 = Checkpointer::<bf16>::for_element(f16_storage.clone());
        let big = s.full::<bf16>(&[2], bf16::from_f32(65536.0));
        let err = from_bf16.save(3, &big).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the input of layer 3 cannot be stored: 65536 is beyond the f16 range (+-65504)"
        );
        // From f64: 65519 rounds to f16's 65504 and is stored; 65520 rounds to infinity.
        let mut from_f64 = Checkpointer::<f64>::for_element(f16_storage);
        from_f64.save(0, &s.full::<f64>(&[1], 65519.0)).unwrap();
        assert_eq!(from_f64.get(0).unwrap().to_vec(), vec![65504.0]);
        assert!(matches!(
            from_f64.save(1, &s.full::<f64>(&[1], -65520.0)),
            Err(CheckpointError::BadValue { layer: 1, .. })
        ));
        // bf16 storage of f32's largest finite value.
        let mut to_bf16 =
            Checkpointer::<f32>::new(config(Policy::Every(1)).with_precision(Precision::Bf16));
        let err = to_bf16.save(0, &s.full::<f32>(&[1], f32::MAX)).unwrap_err();
        assert!(err.to_string().contains("beyond the bf16 range"), "{err}");
        assert_eq!(to_bf16.num_checkpoints(), 0);
        let _ = f16::MAX;
    });
}

#[test]
fn get_is_checkpoint_layer_and_reverse_answer_for_what_was_stored() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let x = s.ones::<f32>(&[4]);
        // Saved by hand, no forward.
        let mut ckpt = Checkpointer::new(config(Policy::Every(2)));
        for layer in [10, 30, 50] {
            ckpt.save(layer, &x).unwrap();
        }
        let err = ckpt.get(20).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no checkpoint is stored for layer 20; stored: [10, 30, 50]"
        );
        let mut calls = 0;
        let err = ckpt.reverse(s, layer_step, |_, _| calls += 1).unwrap_err();
        assert_eq!(err, CheckpointError::NoForward { stored: 3 });
        assert_eq!(
            (calls, ckpt.num_checkpoints()),
            (0, 3),
            "nothing run, nothing dropped"
        );

        // Before any forward, position 0 is a checkpoint under every policy.
        for policy in [Policy::Sqrt, Policy::Budget(1 << 20), Policy::Every(3)] {
            let fresh = Checkpointer::<f32>::new(config(policy));
            assert!(fresh.is_checkpoint_layer(0));
            assert!(!fresh.is_checkpoint_layer(1));
        }
        // After a forward, only the ids of that forward's plan.
        let ids: Vec<usize> = (100..108).collect();
        let mut every2 = Checkpointer::new(config(Policy::Every(2)));
        every2.checkpointed_forward(&x, &ids, layer_step).unwrap();
        assert!(every2.is_checkpoint_layer(100) && every2.is_checkpoint_layer(106));
        assert!(!every2.is_checkpoint_layer(101));
        // 4 and 98 are even positions, but not layers of that forward.
        assert!(!every2.is_checkpoint_layer(4) && !every2.is_checkpoint_layer(98));
    });
}

#[test]
fn a_budget_counts_the_pool_bytes_each_stored_activation_takes() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        // 10 f32 are 40 bytes of data in a 64-byte size class: 192 bytes hold 3, not 4.
        let x = s.ones::<f32>(&[10]);
        let layers: Vec<usize> = (0..16).collect();
        for precision in [Precision::Full, Precision::F16] {
            let before = pool.stats().bytes_in_use;
            let mut ckpt = Checkpointer::new(config(Policy::Budget(192)).with_precision(precision));
            ckpt.checkpointed_forward(&x, &layers, |x, _| x + 1.0)
                .unwrap();
            // At f16, 20 bytes of data still take a 64-byte class.
            assert_eq!(ckpt.num_checkpoints(), 3, "{precision:?}");
            assert_eq!(pool.stats().bytes_in_use - before, 192, "{precision:?}");
        }
    });
}

#[test]
fn binomial_plans_for_long_models_cost_far_less_than_their_forward() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let x = s.ones::<f32>(&[1]);
        let slot = x.allocated_bytes();
        let steps = Cell::new(0usize);
        let mut counted = step(|x, _| {
            steps.set(steps.get() + 1);
            x.clone()
        });
        // 16,000 layers with 120 slots took seconds to plan and reverse; 100,000 to plan. Both
        // run here in a debug build, one cheap layer step at a time.
        let layers: Vec<usize> = (0..16_000).collect();
        let mut ckpt = Checkpointer::new(config(Policy::Budget(120 * slot)));
        ckpt.checkpointed_forward(&x, &layers, &mut counted)
            .unwrap();
        assert_eq!(ckpt.num_checkpoints(), 120);
        steps.set(0);
        let mut calls = 0;
        let report = ckpt.reverse(s, &mut counted, |_, _| calls += 1).unwrap();
        let formula = binomial_recompute_steps(16_000, 120) as usize;
        assert_eq!(
            (calls, report.recomputed_steps, steps.get()),
            (16_000, formula, formula)
        );

        let layers: Vec<usize> = (0..100_000).collect();
        let mut ckpt = Checkpointer::new(config(Policy::Budget(120 * slot)));
        ckpt.checkpointed_forward(&x, &layers, &mut counted)
            .unwrap();
        assert_eq!(ckpt.num_checkpoints(), 120);
    });
}

#[test]
fn is_checkpoint_layer_answers_for_the_last_forward_after_its_reverse_sweep() {
    let pool = Pool::with_max_memory_mb(16);
    pool.scope(|s| {
        let ids: Vec<usize> = (100..108).collect();
        let mut ckpt = Checkpointer::new(config(Policy::Every(2)));
        ckpt.checkpointed_forward(&s.ones::<f32>(&[4]), &ids, layer_step)
            .unwrap();
        let mut seen = Vec::new();
        ckpt.reverse(s, layer_step, |layer, _| seen.push(layer))
            .unwrap();
        assert_eq!(seen, (100..108).rev().collect::<Vec<_>>());
        // The checkpoints are consumed; the plan is still that forward's.
        assert_eq!(ckpt.num_checkpoints(), 0);
        assert!(ckpt.is_checkpoint_layer(100) && ckpt.is_checkpoint_layer(106));
        assert!(!ckpt.is_checkpoint_layer(101) && !ckpt.is_checkpoint_layer(4));
        // A second sweep has nothing to start from.
        assert!(ckpt.reverse(s, layer_step, |_, _| {}).is_err());
        ckpt.clear();
        assert!(!ckpt.is_checkpoint_layer(100));
    });
}
