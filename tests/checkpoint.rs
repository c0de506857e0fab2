//! The checkpointer: what each policy stores, exact recompute, memory figures, the binomial
//! schedule's recompute counts against Griewank and Walther's formula, and every error.

use std::cell::Cell;

use tensorscope::checkpoint::{binomial_recompute_steps, ReverseReport};
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, CheckpointError, Checkpointer, Policy, Precision};

/// One "layer": a little nonlinear map whose output depends on the layer index.
fn layer_step<'s>(x: &Tensor<'s>, i: usize) -> Tensor<'s> {
    (x * (1.0 + 0.01 * i as f32) + 0.1).tanh()
}

/// The inputs of every layer, from a plain forward: `a_0 .. a_{n-1}`, and the output.
fn plain_forward(s: &Scope<'_>, n: usize) -> (Vec<Vec<f32>>, Vec<f32>) {
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
                        .recompute_from_checkpoint(target, &layers, layer_step)
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
                .reverse(layer_step, |layer, x| {
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
        let bytes = input.data_bytes();
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
                let report: ReverseReport = ckpt.reverse(&mut counted, |_, _| calls += 1).unwrap();
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
            ckpt.checkpointed_forward(&input, &layers, layer_step).unwrap();
            assert_eq!(ckpt.memory_stored_bytes(), 4 * 32 * 2, "{precision:?}: 2 bytes each");
            // Normwise: the largest error in an activation over its largest magnitude.
            let mut max_rel = 0f32;
            for (target, want) in inputs.iter().enumerate() {
                let a = ckpt.recompute_from_checkpoint(target, &layers, layer_step).unwrap();
                let err = a.to_vec().iter().zip(want).fold(0f32, |m, (g, w)| m.max((g - w).abs()));
                let scale = want.iter().fold(0f32, |m, w| m.max(w.abs()));
                max_rel = max_rel.max(err / scale);
            }
            println!("{precision:?}: max normwise relative error of recomputed activations {max_rel:.2e}");
            assert!(max_rel > 0.0, "{precision:?} storage is lossy, never exact here");
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
            CheckpointError::UnknownLayer {
                layer: 5,
                stored: vec![0, 4]
            }
        );
        assert_eq!(
            err.to_string(),
            "no checkpoint for layer 5 or any layer before it; stored: [0, 4]"
        );
        let err = ckpt
            .recompute_from_checkpoint(99, &layers, layer_step)
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
            .recompute_from_checkpoint(7, &layers, &mut drifting)
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
        assert_eq!(
            invalid(Policy::Budget(15)).to_string(),
            "invalid checkpoint policy: a budget of 15 bytes holds no stored activation of 16 bytes"
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
fn edge_cases_found_in_review() {
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
        let report = ckpt.reverse(layer_step, |_, _| calls += 1).unwrap();
        assert_eq!((calls, report.recomputed_steps), (8, 6));
        // A second sweep finds the checkpoints consumed.
        let err = ckpt.reverse(layer_step, |_, _| ()).unwrap_err();
        assert_eq!(
            err,
            CheckpointError::UnknownLayer {
                layer: 0,
                stored: vec![]
            }
        );

        // No layers: nothing stored, nothing to sweep, under every policy.
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
                ckpt.reverse(layer_step, |_, _| unreachable!())
                    .unwrap()
                    .recomputed_steps,
                0
            );
        }

        // The limit error names the layer id, not its position.
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

        // `clear` forgets the plan too.
        let mut sqrt = Checkpointer::new(config(Policy::Sqrt));
        sqrt.checkpointed_forward(&input, &layers, layer_step)
            .unwrap();
        assert!(sqrt.is_checkpoint_layer(3));
        sqrt.clear();
        assert!(!sqrt.is_checkpoint_layer(3));
    });
}
