//! A state file that would poison training is refused by `Optimizer::load_state`, naming the
//! tensor or key and the value, and changing nothing: NaN or infinite moments, a negative second
//! moment, a learning rate that is NaN, infinite, negative or infinite in `f32` (`1e300`), a
//! negative step count.

use std::path::PathBuf;

use tensorscope::nn::{Adam, NnError, Optimizer, ParamStore, SaveOptions, Sgd};
use tensorscope::prelude::*;
use tensorscope::Gradients;

/// What a state file holds: the optimizer's kind, its learning rate's text, tensors and step
/// counts (metadata).
struct StateFile {
    kind: &'static str,
    lr: &'static str,
    tensors: Vec<(&'static str, [f32; 3])>,
    steps: Vec<(&'static str, &'static str)>,
}

impl StateFile {
    /// A valid Adam state of the set `[w]` (its parameter named "0").
    fn adam() -> StateFile {
        StateFile {
            kind: "adam",
            lr: "0.01",
            tensors: vec![
                ("0.exp_avg", [0.1, -0.2, 0.3]),
                ("0.exp_avg_sq", [0.01, 0.04, 0.09]),
            ],
            steps: vec![("0.step", "3")],
        }
    }

    fn write(&self, pool: &Pool, name: &str) -> PathBuf {
        let path = std::env::temp_dir().join(format!(
            "tensorscope-state-{name}-{}.safetensors",
            std::process::id()
        ));
        let mut store = ParamStore::<f32>::new(pool);
        for (name, values) in &self.tensors {
            store
                .add(name, Param::from_slice(pool, &[3], values))
                .unwrap();
        }
        let mut options = SaveOptions::new()
            .metadata("optimizer", self.kind)
            .metadata("lr", self.lr);
        for (key, count) in &self.steps {
            options = options.metadata(*key, *count);
        }
        store.save_safetensors(&path, &options).unwrap();
        path
    }
}

/// `w` after one step of `optimizer` with the gradient `[1, -1, 0.5]`.
fn stepped(pool: &Pool, optimizer: &mut dyn Optimizer<f32>) -> Vec<f32> {
    let mut set = vec![Param::from_slice(pool, &[3], &[1.0f32, 2.0, 3.0])];
    pool.scope(|s| {
        let mut grads = Gradients::new(s);
        grads
            .accumulate(&set[0], s.from_slice(&[3], &[1.0f32, -1.0, 0.5]))
            .unwrap();
        optimizer.step(&mut set, &grads).unwrap();
    });
    set[0].to_vec()
}

/// Loads `bad` into an optimizer that loaded the valid state first: refused with
/// `OptimizerStateValue` naming `key`, `index` and a value like `value`, and the optimizer steps
/// as one that loaded only the valid state.
fn refused(bad: StateFile, key: &str, index: Option<usize>, value: f64, sgd: bool) {
    let pool = Pool::with_max_memory_mb(16);
    let set = vec![Param::<f32>::zeros(&pool, &[3])];
    let make = || -> Box<dyn Optimizer<f32>> {
        if sgd {
            Box::new(Sgd::new(0.1, 0.9))
        } else {
            Box::new(Adam::new(0.1))
        }
    };
    let good = if sgd {
        StateFile {
            kind: "sgd",
            lr: "0.01",
            tensors: vec![("0.momentum_buffer", [0.5, 0.5, 0.5])],
            steps: vec![],
        }
    } else {
        StateFile::adam()
    };
    let (good, bad) = (
        good.write(&pool, &format!("{key}-good")),
        bad.write(&pool, key),
    );
    let (mut loaded, mut reference) = (make(), make());
    loaded.load_state(&set, &good).unwrap();
    reference.load_state(&set, &good).unwrap();
    let err = loaded.load_state(&set, &bad).unwrap_err();
    match &err {
        NnError::OptimizerStateValue {
            key: k,
            index: i,
            value: v,
            ..
        } => {
            assert_eq!((k.as_str(), *i), (key, index), "{err}");
            assert!(
                v.to_bits() == value.to_bits() || (v.is_nan() && value.is_nan()),
                "{v} for {value}: {err}"
            );
        }
        other => panic!("refused with another error: {other}"),
    }
    assert!(err.to_string().contains(key), "{err}");
    assert_eq!(loaded.lr(), reference.lr(), "the rate unchanged");
    let (got, want) = (
        stepped(&pool, &mut *loaded),
        stepped(&pool, &mut *reference),
    );
    assert_eq!(got, want, "the state unchanged");
    assert!(got.iter().all(|w| w.is_finite()));
    std::fs::remove_file(good).unwrap();
    std::fs::remove_file(bad).unwrap();
}

fn with_tensor(slot: &'static str, values: [f32; 3]) -> StateFile {
    let mut file = StateFile::adam();
    file.tensors.iter_mut().find(|(n, _)| *n == slot).unwrap().1 = values;
    file
}

#[test]
fn a_nan_first_moment_is_refused() {
    let bad = with_tensor("0.exp_avg", [0.1, f32::NAN, 0.3]);
    refused(bad, "0.exp_avg", Some(1), f64::NAN, false);
}

#[test]
fn an_infinite_second_moment_is_refused() {
    let bad = with_tensor("0.exp_avg_sq", [0.01, 0.04, f32::INFINITY]);
    refused(bad, "0.exp_avg_sq", Some(2), f64::INFINITY, false);
}

#[test]
fn a_negative_second_moment_is_refused() {
    let bad = with_tensor("0.exp_avg_sq", [-0.01, 0.04, 0.09]);
    refused(bad, "0.exp_avg_sq", Some(0), f64::from(-0.01f32), false);
}

#[test]
fn an_infinite_momentum_is_refused() {
    let bad = StateFile {
        kind: "sgd",
        lr: "0.01",
        tensors: vec![("0.momentum_buffer", [0.5, 0.5, f32::NEG_INFINITY])],
        steps: vec![],
    };
    refused(bad, "0.momentum_buffer", Some(2), f64::NEG_INFINITY, true);
}

fn with_lr(lr: &'static str) -> StateFile {
    StateFile {
        lr,
        ..StateFile::adam()
    }
}

#[test]
fn a_nan_learning_rate_is_refused() {
    refused(with_lr("NaN"), "lr", None, f64::NAN, false);
}

#[test]
fn an_infinite_learning_rate_is_refused() {
    refused(with_lr("inf"), "lr", None, f64::INFINITY, false);
}

#[test]
fn a_learning_rate_infinite_in_f32_is_refused() {
    refused(with_lr("1e300"), "lr", None, 1e300, false);
}

#[test]
fn a_negative_learning_rate_is_refused() {
    refused(with_lr("-0.01"), "lr", None, -0.01, false);
}

#[test]
fn a_negative_step_count_is_refused() {
    let bad = StateFile {
        steps: vec![("0.step", "-5")],
        ..StateFile::adam()
    };
    refused(bad, "0.step", None, -5.0, false);
}
