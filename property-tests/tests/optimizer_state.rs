//! Optimizer state files of random values: `Optimizer::load_state` refuses one holding a value the
//! next step would spread to the weights (a NaN or infinite moment, a negative second moment, a
//! learning rate that is negative or not finite in `f32`, a negative step count) with
//! `OptimizerStateValue`, changing nothing; it accepts every other, and the next step then leaves
//! every weight finite. Finite values are drawn up to 1e3 in size, rates up to 10: beyond such
//! values a valid state can still overflow a weight, as a rate of 1e38 would in PyTorch.

use proptest::prelude::*;
use tensorscope::nn::{Adam, NnError, Optimizer, ParamStore, SaveOptions, Sgd, Weights};
use tensorscope::{Gradients, Param, Pool};

const LEN: usize = 3;

/// A state value: special values often, moderate finite ones otherwise.
fn value() -> impl Strategy<Value = f32> {
    prop_oneof![
        1 => Just(f32::NAN),
        1 => Just(f32::INFINITY),
        1 => Just(f32::NEG_INFINITY),
        1 => Just(-0.0f32),
        1 => Just(0.0f32),
        1 => Just(f32::MIN_POSITIVE),
        12 => -1e3f32..1e3,
    ]
}

/// A learning rate's text as a state file holds it.
fn rate() -> impl Strategy<Value = String> {
    prop_oneof![
        1 => Just("NaN".to_string()),
        1 => Just("inf".to_string()),
        1 => Just("-inf".to_string()),
        1 => Just("1e300".to_string()),
        1 => Just("-0.5".to_string()),
        1 => Just("0.0".to_string()),
        6 => (0.0f64..10.0).prop_map(|lr| format!("{lr:?}")),
    ]
}

#[derive(Debug, Clone)]
struct State {
    adam: bool,
    lr: String,
    /// Per parameter: its first buffer (`exp_avg` or `momentum_buffer`) and Adam's `exp_avg_sq`.
    buffers: Vec<([f32; LEN], [f32; LEN])>,
    steps: Vec<i32>,
    grads: Vec<[f32; LEN]>,
}

fn state() -> impl Strategy<Value = State> {
    let three = || prop::array::uniform3(value());
    let finite = || prop::array::uniform3(-1e3f32..1e3);
    (
        any::<bool>(),
        rate(),
        prop::collection::vec((three(), three()), 2),
        prop::collection::vec(prop_oneof![3 => 0..100i32, 1 => any::<i32>()], 2),
        prop::collection::vec(finite(), 2),
    )
        .prop_map(|(adam, lr, buffers, steps, grads)| State {
            adam,
            lr,
            buffers,
            steps,
            grads,
        })
}

impl State {
    /// Whether every value is one the optimizer may load.
    fn valid(&self) -> bool {
        let lr = self.lr.parse::<f64>().expect("a number");
        let lr_ok = lr >= 0.0 && (lr as f32).is_finite();
        let buffers_ok = self.buffers.iter().all(|(first, second)| {
            first.iter().all(|x| x.is_finite())
                && (!self.adam || second.iter().all(|x| x.is_finite() && *x >= 0.0))
        });
        let steps_ok = !self.adam || self.steps.iter().all(|&t| t >= 0);
        lr_ok && buffers_ok && steps_ok
    }

    fn write(&self, pool: &Pool, path: &std::path::Path) {
        let mut store = ParamStore::<f32>::new(pool);
        let mut options = SaveOptions::new()
            .metadata("optimizer", if self.adam { "adam" } else { "sgd" })
            .metadata("lr", self.lr.as_str());
        for (i, (first, second)) in self.buffers.iter().enumerate() {
            let add = |store: &mut ParamStore<f32>, slot: &str, values: &[f32]| {
                let p = Param::from_slice(pool, &[LEN], values);
                store.add(&format!("{i}.{slot}"), p).unwrap()
            };
            if self.adam {
                add(&mut store, "exp_avg", first);
                add(&mut store, "exp_avg_sq", second);
                options = options.metadata(format!("{i}.step"), self.steps[i].to_string());
            } else {
                add(&mut store, "momentum_buffer", first);
            }
        }
        store.save_safetensors(path, &options).unwrap();
    }
}

proptest! {
    // 256 cases unless `PROPTEST_CASES` says otherwise.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(256),
        ..ProptestConfig::default()
    })]

    #[test]
    fn a_state_is_refused_or_steps_to_finite_weights(state in state()) {
        let pool = Pool::with_max_memory_mb(16);
        let path = std::env::temp_dir().join(format!(
            "tensorscope-random-state-{}-{:?}.safetensors",
            std::process::id(),
            std::thread::current().id()
        ));
        state.write(&pool, &path);
        let mut set = vec![
            Param::from_slice(&pool, &[LEN], &[1.0f32, -2.0, 0.5]),
            Param::from_slice(&pool, &[LEN], &[0.0f32, 3.0, -1.0]),
        ];
        let mut optimizer: Box<dyn Optimizer<f32>> = if state.adam {
            Box::new(Adam::new(0.125))
        } else {
            Box::new(Sgd::new(0.125, 0.9))
        };
        let loaded = optimizer.load_state(&set, &path);
        std::fs::remove_file(&path).unwrap();
        match loaded {
            Err(NnError::OptimizerStateValue { .. }) => {
                prop_assert!(!state.valid(), "a valid state refused: {loaded:?}");
                prop_assert_eq!(optimizer.lr(), 0.125, "a refused load changed the rate");
            }
            Err(other) => prop_assert!(false, "refused with another error: {other}"),
            Ok(()) => {
                prop_assert!(state.valid(), "an invalid state accepted");
                pool.scope(|s| {
                    let mut grads = Gradients::new(s);
                    for (p, g) in set.iter().zip(&state.grads) {
                        grads.accumulate(p, s.from_slice(&[LEN], g)).unwrap();
                    }
                    optimizer.step(&mut set, &grads).unwrap();
                });
                for p in &set {
                    prop_assert!(p.as_slice().iter().all(|w| w.is_finite()), "{:?}", p.to_vec());
                }
            }
        }
    }
}
