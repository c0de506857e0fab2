//! The `nn` module: named parameters, modules (forward values, gradients through autograd,
//! checkpointed forwards) and optimizers (against hand-computed updates).

use tensorscope::autograd::check_gradients;
use tensorscope::nn::{
    Activation, Adam, LayerNorm, Linear, LoadOptions, Module, NnError, Optimizer, ParamStore,
    Residual, SaveOptions, Sequential, Sgd,
};
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Error, Param, Parameters, Policy};

#[test]
fn params_are_found_by_name_in_registration_order() {
    let pool = Pool::with_max_memory_mb(16);
    let mut params = ParamStore::<f32>::new(&pool);
    params.randn("fc1.weight", &[3, 2], 0.5, 1).unwrap();
    params.zeros("fc1.bias", &[2]).unwrap();
    params.ones("fc2.weight", &[2, 2]).unwrap();
    let names: Vec<&str> = params.iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["fc1.weight", "fc1.bias", "fc2.weight"]);
    assert_eq!(params.get("fc1.weight").unwrap().shape(), &[3, 2]);
    assert_eq!(params.get("fc2.weight").unwrap().to_vec(), vec![1.0; 4]);

    let err = params.get("fc1.bais").unwrap_err();
    assert_eq!(
        err,
        NnError::UnknownParam {
            name: "fc1.bais".into(),
            close: vec!["fc1.bias".into()]
        }
    );
    assert_eq!(
        params.get("fc.weight").unwrap_err().to_string(),
        "no parameter named \"fc.weight\"; did you mean \"fc1.weight\" or \"fc2.weight\"?"
    );
    assert_eq!(
        params.get("decoder").unwrap_err().to_string(),
        "no parameter named \"decoder\""
    );
    assert_eq!(
        params.zeros("fc1.bias", &[2]).unwrap_err(),
        NnError::DuplicateParam("fc1.bias".into())
    );
    // Taken out for a module: gone from the store, the others still found by name.
    let w = params.take("fc1.weight").unwrap();
    assert_eq!(w.shape(), &[3, 2]);
    assert_eq!(params.len(), 2);
    assert_eq!(params.get("fc2.weight").unwrap().shape(), &[2, 2]);
    assert!(params.get("fc1.weight").is_err());
}

#[test]
fn gradients_accumulate_per_parameter() {
    let pool = Pool::with_max_memory_mb(16);
    let mut params = ParamStore::<f32>::new(&pool);
    params.zeros("b", &[3]).unwrap();
    params.zeros("unused", &[2]).unwrap();
    pool.scope(|s| {
        let b = params.get("b").unwrap();
        let mut grads = tensorscope::Gradients::new(s);
        let g = s.from_slice::<f32>(&[3], &[1.0, 2.0, 3.0]);
        grads.accumulate(b, g.clone()).unwrap();
        grads.accumulate(b, g.clone()).unwrap();
        assert_eq!(grads.get(b).unwrap().to_vec(), vec![2.0, 4.0, 6.0]);
        // `g` has another handle, so the first gradient was a copy: the sum never wrote into it.
        assert_eq!(g.to_vec(), vec![1.0, 2.0, 3.0]);
        assert!(!grads.get(b).unwrap().shares_buffer_with(&g));
        assert_eq!(grads.len(), 1);
        assert!(grads.get(params.get("unused").unwrap()).is_none());
        let err = grads.accumulate(b, s.zeros::<f32>(&[2])).unwrap_err();
        assert!(matches!(
            err,
            Error::ShapeMismatch {
                op: "Gradients::accumulate",
                ..
            }
        ));
    });
    assert_eq!(pool.stats().bytes_in_use, 2 * 64, "the parameters only");
}

/// Runs `steps` steps of `opt` on one parameter `w` with the fixed gradient `grad`, returning `w`
/// after each.
fn steps(
    pool: &Pool,
    opt: &mut dyn Optimizer<f64>,
    value: &[f64],
    grad: &[f64],
    steps: usize,
) -> Vec<Vec<f64>> {
    let mut params = ParamStore::<f64>::new(pool);
    params
        .add("w", Param::from_slice(pool, &[value.len()], value))
        .unwrap();
    (0..steps)
        .map(|_| {
            pool.scope(|s| {
                let mut grads = tensorscope::Gradients::new(s);
                let g = s.from_slice::<f64>(&[grad.len()], grad);
                grads
                    .accumulate(params.get("w").unwrap(), g.clone())
                    .unwrap();
                opt.step(&mut params, &grads).unwrap();
            });
            params.get("w").unwrap().to_vec()
        })
        .collect()
}

#[test]
fn sgd_with_momentum_matches_the_update_rule() {
    let pool = Pool::with_max_memory_mb(16);
    let w = steps(
        &pool,
        &mut Sgd::new(0.1, 0.9),
        &[1.0, -2.0],
        &[0.5, -1.0],
        2,
    );
    assert_eq!(w[0], vec![1.0 - 0.05, -2.0 + 0.1]); // v = g; w -= 0.1 g
                                                    // v = 0.9 g + g = 1.9 g; w -= 0.19 g
    assert!((w[1][0] - (0.95 - 0.1 * 1.9 * 0.5)).abs() < 1e-15);
    assert!((w[1][1] - (-1.9 + 0.1 * 1.9 * 1.0)).abs() < 1e-15);
}

#[test]
fn adam_and_adamw_match_the_update_rule() {
    let pool = Pool::with_max_memory_mb(16);
    let (lr, b1, b2, eps) = (0.01, 0.9, 0.999, 1e-8);
    let g = [0.5, -2.0];
    for decay in [0.0, 0.1] {
        let mut adam = if decay == 0.0 {
            Adam::with_betas(lr, b1, b2, eps)
        } else {
            Adam::adamw(lr, decay)
        };
        let got = steps(&pool, &mut adam, &[1.0, 1.0], &g, 3);
        let (mut m, mut v, mut w) = ([0.0f64; 2], [0.0f64; 2], [1.0f64; 2]);
        for t in 1..=3 {
            for i in 0..2 {
                w[i] *= 1.0 - lr * decay; // AdamW: decoupled from the gradient
                m[i] = b1 * m[i] + (1.0 - b1) * g[i];
                v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
                let m_hat = m[i] / (1.0 - b1.powi(t));
                let v_hat = v[i] / (1.0 - b2.powi(t));
                w[i] -= lr * m_hat / (v_hat.sqrt() + eps);
            }
            for i in 0..2 {
                let got = got[t as usize - 1][i];
                assert!(
                    (got - w[i]).abs() < 1e-15,
                    "decay {decay}, step {t}, element {i}"
                );
            }
        }
    }
}

#[test]
fn a_replaced_parameter_starts_with_fresh_optimizer_state() {
    let pool = Pool::with_max_memory_mb(16);
    let optimizers: [Box<dyn Optimizer<f32>>; 2] =
        [Box::new(Sgd::new(0.1, 0.9)), Box::new(Adam::new(0.1))];
    for mut opt in optimizers {
        let mut params = ParamStore::<f32>::new(&pool);
        params.zeros("w", &[4]).unwrap();
        let mut step = |params: &mut ParamStore<f32>| {
            pool.scope(|s| {
                let mut grads = tensorscope::Gradients::new(s);
                let w = params.get("w").unwrap();
                grads.accumulate(w, s.ones::<f32>(w.shape())).unwrap();
                opt.step(params, &grads)
            })
        };
        step(&mut params).unwrap();
        // The parameter replaced by one of another shape: it is a new parameter (a new key), so its
        // momentum or moments are made anew rather than met in the old shape.
        *params.get_mut("w").unwrap() = Param::<f32>::zeros(&pool, &[3]);
        step(&mut params).unwrap();
        let w = params.get("w").unwrap().to_vec();
        assert_eq!(w.len(), 3);
        assert!(w.iter().all(|&v| v < 0.0 && v == w[0]), "{w:?}");
    }
}

#[test]
fn a_step_that_runs_out_of_memory_changes_nothing() {
    // Two parameters and their gradients take 4 x 896 bytes of a 6 KiB budget: Adam's moments fit
    // for the first parameter, not for the second. Updating the first before finding that out would
    // leave half a step applied.
    let pool = tensorscope::Pool::new(tensorscope::PoolConfig::with_max_bytes(6 * 1024));
    let mut params = ParamStore::<f32>::new(&pool);
    params.zeros("a", &[200]).unwrap();
    params.zeros("b", &[200]).unwrap();
    let mut adam = Adam::new(0.1);
    let err = pool
        .scope(|s| {
            let mut grads = tensorscope::Gradients::new(s);
            for (_, p) in params.iter() {
                grads.accumulate(p, s.ones::<f32>(&[200])).unwrap();
            }
            adam.step(&mut params, &grads)
        })
        .unwrap_err();
    assert!(err.to_string().contains("budget exceeded"), "{err}");
    for (name, p) in params.iter() {
        assert_eq!(p.to_vec(), vec![0.0; 200], "{name} unchanged");
    }
}

#[test]
fn optimizers_update_any_parameter_set_in_place_and_a_parameter_listed_twice_once() {
    let pool = Pool::with_max_memory_mb(16);
    let mut set = vec![Param::<f32>::zeros(&pool, &[2]), Param::zeros(&pool, &[3])];
    let mut sgd = Sgd::new(0.5, 0.0);
    fn grads_of<'s>(set: &[Param<f32>], s: &Scope<'s, '_>) -> tensorscope::Gradients<'s, f32> {
        let mut grads = tensorscope::Gradients::new(s);
        for p in set {
            grads.accumulate(p, s.ones::<f32>(p.shape())).unwrap();
        }
        grads
    }
    pool.scope(|s| {
        let grads = grads_of(&set, s);
        let before: Vec<_> = set.iter().map(|p| p.as_slice().as_ptr()).collect();
        sgd.step(&mut set, &grads).unwrap();
        assert_eq!(set[0].to_vec(), [-0.5; 2]);
        assert_eq!(set[1].to_vec(), [-0.5; 3]);
        let after: Vec<_> = set.iter().map(|p| p.as_slice().as_ptr()).collect();
        assert_eq!(before, after, "unique parameters are written in place");
    });
    // A clone listed beside its original is the same parameter (one key), as tied fields are: it
    // is updated once, and both handles hold the result.
    set.push(set[1].clone());
    pool.scope(|s| {
        let grads = grads_of(&set[..2], s);
        sgd.step(&mut set, &grads).unwrap();
    });
    assert_eq!(set[1].to_vec(), [-1.0; 3], "one update, not two");
    assert!(
        set[2].shares_buffer_with(&set[1]),
        "the handles still share"
    );
    // A handle written apart holds other values: which to update is unknown.
    set[2].view_mut()[[0]] = 7.0;
    pool.scope(|s| {
        let grads = grads_of(&set[..2], s);
        let err = sgd.step(&mut set, &grads).unwrap_err();
        assert!(
            matches!(&err, NnError::ParamListedTwice { index: 2, first: 1, shape } if shape.0 == [3]),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("holds parameter #1 again at #2 (shape [3]) with other values"),
            "{err}"
        );
    });
    assert_eq!(set[0].to_vec(), [-1.0; 2], "nothing changed");
    assert_eq!(set[1].to_vec(), [-1.0; 3], "nothing changed");
}

#[test]
fn a_gradient_of_values_an_update_left_behind_is_refused() {
    let pool = Pool::with_max_memory_mb(16);
    let mut store = ParamStore::<f32>::new(&pool);
    store.ones("w", &[2]).unwrap();
    // A model holding a clone of the store's parameter, trained through the store: the first
    // update copies the store's data (the clone shares it), so the clone keeps the old values.
    let stale = store.get("w").unwrap().clone();
    let mut sgd = Sgd::new(0.5, 0.0);
    let mut step = |store: &mut ParamStore<f32>| {
        pool.train(|s| {
            let loss = s
                .ones::<f32>(&[2])
                .try_mul(&stale)
                .unwrap()
                .try_sum(0)
                .unwrap();
            let grads = loss.backward().unwrap();
            sgd.step(store, &grads)
        })
    };
    step(&mut store).unwrap();
    assert_eq!(store.get("w").unwrap().to_vec(), [0.5; 2]);
    let err = step(&mut store).unwrap_err();
    assert!(
        matches!(&err, NnError::Tensor(Error::StaleGradient { index: 0, .. })),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("computed from values it no longer holds"),
        "{err}"
    );
    assert_eq!(
        store.get("w").unwrap().to_vec(),
        [0.5; 2],
        "nothing changed"
    );
}

#[test]
fn a_parameter_written_in_place_after_the_forward_refuses_its_gradient() {
    let pool = Pool::with_max_memory_mb(16);
    let mut w = Param::from_slice(&pool, &[2], &[1.0f32, 2.0]);
    let mut sgd = Sgd::new(0.5, 0.0);
    pool.train(|s| {
        // `add` saves nothing of `w` for its backward: the graph holds no handle on it, so the
        // write below is in place, on the very values the forward read.
        let loss = (s.ones::<f32>(&[2]) + &w).sum_all();
        w.view_mut()[[0]] = 5.0;
        let grads = loss.backward().unwrap();
        let err = sgd.step(&mut w, &grads).unwrap_err();
        assert!(
            matches!(&err, NnError::Tensor(Error::StaleGradient { index: 0, .. })),
            "{err}"
        );
    });
    assert_eq!(w.to_vec(), [5.0, 2.0], "the refused step changed nothing");
}

#[test]
fn a_second_step_with_the_same_gradients_is_refused() {
    let pool = Pool::with_max_memory_mb(16);
    let mut set = vec![Param::from_slice(&pool, &[2], &[1.0f32, 2.0])];
    let (mut sgd, mut adam) = (Sgd::new(0.5f32, 0.0), Adam::new(0.1f32));
    for optimizer in [&mut sgd as &mut dyn Optimizer<f32>, &mut adam] {
        pool.train(|s| {
            let loss = (s.ones::<f32>(&[2]) * &set[0]).sum_all();
            let grads = loss.backward().unwrap();
            optimizer.step(&mut set, &grads).unwrap();
            let once = set[0].to_vec();
            let err = optimizer.step(&mut set, &grads).unwrap_err();
            assert!(
                matches!(&err, NnError::Tensor(Error::StaleGradient { index: 0, .. })),
                "{err}"
            );
            assert_eq!(set[0].to_vec(), once, "the gradients were applied once");
        });
    }
}

#[test]
fn gradients_of_a_parameter_written_between_two_backward_passes_do_not_add_up() {
    let pool = Pool::with_max_memory_mb(16);
    let mut w = Param::from_slice(&pool, &[2], &[1.0f32, 2.0]);
    pool.train(|s| {
        let mut grads = tensorscope::Gradients::new(s);
        let loss = (s.ones::<f32>(&[2]) + &w).sum_all();
        loss.backward_into(&mut grads).unwrap();
        drop(loss);
        w.view_mut()[[1]] = 0.0;
        let loss = (s.ones::<f32>(&[2]) + &w).sum_all();
        let err = loss.backward_into(&mut grads).unwrap_err();
        assert!(matches!(err, Error::ParamUsedWithTwoValues { .. }), "{err}");
        // Zeroed gradients are of any values: accumulation starts again.
        grads.zero().unwrap();
        loss.backward_into(&mut grads).unwrap();
        assert_eq!(grads.get(&w).unwrap().to_vec(), [1.0, 1.0]);
    });
}

#[test]
fn a_refused_step_changes_nothing() {
    let pool = Pool::with_max_memory_mb(16);
    let mut w = Param::from_slice(&pool, &[3], &[1.0f32, 2.0, 3.0]);
    let mut adam = Adam::new(0.1);
    pool.train(|s| {
        let loss = (s.ones::<f32>(&[3]) * &w).sum_all();
        let grads = loss.backward().unwrap();
        drop(loss);
        // Listed twice with different values (a handle written apart): refused before
        // anything is rented or copied.
        let mut written = w.clone();
        written.view_mut()[[0]] = 5.0;
        let mut twice = vec![w.clone(), written];
        let before = pool.stats();
        let err = adam.step(&mut twice, &grads).unwrap_err();
        assert!(
            matches!(err, NnError::ParamListedTwice { index: 1, .. }),
            "{err}"
        );
        assert!(twice[0].shares_buffer_with(&w), "no copy on write");
        assert_eq!(
            pool.stats().bytes_in_use,
            before.bytes_in_use,
            "no state made"
        );
        drop(twice);
        // The same gradients then apply to the parameter alone, as a fresh optimizer's would.
        let mut fresh = w.duplicate();
        adam.step(&mut w, &grads).unwrap();
        let mut fresh_grads = tensorscope::Gradients::new(s);
        fresh_grads
            .accumulate(&fresh, grads.get(&w).unwrap().clone())
            .unwrap();
        Adam::new(0.1).step(&mut fresh, &fresh_grads).unwrap();
        assert_eq!(w.to_vec(), fresh.to_vec());
    });
}

#[test]
fn a_step_short_of_memory_changes_nothing() {
    // Room for the parameters and their gradients, not for Adam's moments of both.
    let pool = Pool::with_max_memory_mb(1);
    let len = 40_000; // 160 KB a tensor: two parameters, two gradients, four moments = 1.28 MB
    let mut set = vec![
        Param::<f32>::zeros(&pool, &[len]),
        Param::zeros(&pool, &[len]),
    ];
    let mut adam = Adam::new(0.1);
    pool.scope(|s| {
        let mut grads = tensorscope::Gradients::new(s);
        for p in &set {
            grads.accumulate(p, s.ones::<f32>(&[len])).unwrap();
        }
        let before = pool.stats().bytes_in_use;
        let err = adam.step(&mut set, &grads).unwrap_err();
        assert!(err.to_string().contains("budget exceeded"), "{err}");
        assert_eq!(pool.stats().bytes_in_use, before, "no state kept");
        assert!(set.iter().all(|p| p.as_slice().iter().all(|&x| x == 0.0)));
        // With the gradients gone there is room: the step succeeds, each parameter's first.
        drop(grads);
        let mut grads = tensorscope::Gradients::new(s);
        grads.accumulate(&set[0], s.ones::<f32>(&[len])).unwrap();
        adam.step(&mut set, &grads).unwrap();
        assert!((set[0].as_slice()[0] + 0.1).abs() < 1e-6);
    });
}

/// A parameter set that breaks `Parameters`' promise: each walk gives the parameter `pick` names
/// for that walk (0, 1, 2, ..., counting walks of either kind).
struct Shifty {
    params: Vec<Param>,
    pick: fn(usize) -> usize,
    walks: std::cell::Cell<usize>,
}

impl Shifty {
    /// The parameter this walk gives, counting the walk.
    fn walk(&self) -> usize {
        let walk = self.walks.replace(self.walks.get() + 1);
        (self.pick)(walk)
    }
}

impl Parameters<f32> for Shifty {
    fn visit_params(&self, path: &ParamPath<'_>, f: &mut dyn FnMut(&ParamPath<'_>, &Param)) {
        let i = self.walk();
        f(&path.index(i), &self.params[i]);
    }

    fn visit_params_mut(
        &mut self,
        path: &ParamPath<'_>,
        f: &mut dyn FnMut(&ParamPath<'_>, &mut Param),
    ) {
        let i = self.walk();
        f(&path.index(i), &mut self.params[i]);
    }
}

#[test]
fn a_parameter_set_that_changes_between_walks_is_refused() {
    let pool = Pool::with_max_memory_mb(16);
    let w = Param::from_slice(&pool, &[2], &[1.0f32, 2.0]);
    pool.train(|s| {
        let loss = (s.ones::<f32>(&[2]) * &w).sum_all();
        let grads = loss.backward().unwrap();
        // The third walk (the writes) gives a clone of `w` written after the backward: its
        // gradient is stale, and the first two walks never saw it.
        let mut stale = w.clone();
        stale.view_mut()[[0]] = 100.0;
        for (pick, changed_at) in [
            (|walk| usize::from(walk >= 2)) as fn(usize) -> usize,
            |walk| usize::from(walk >= 1),
        ]
        .into_iter()
        .zip(["the writes", "the rents"])
        {
            let mut set = Shifty {
                params: vec![w.clone(), stale.clone()],
                pick,
                walks: Default::default(),
            };
            let err = Sgd::new(1.0f32, 0.0).step(&mut set, &grads).unwrap_err();
            assert!(
                matches!(
                    err,
                    NnError::ParametersChanged {
                        index: 0,
                        updated: 0
                    }
                ),
                "changed at {changed_at}: {err}"
            );
            assert_eq!(set.params[0].to_vec(), [1.0, 2.0]);
            assert_eq!(
                set.params[1].to_vec(),
                [100.0, 2.0],
                "the stale gradient was not applied"
            );
        }
    });
}

#[test]
fn a_load_into_a_parameter_set_that_changes_between_walks_is_refused() {
    let pool = Pool::with_max_memory_mb(16);
    let path = std::env::temp_dir().join(format!(
        "tensorscope-shifty-load-{}.safetensors",
        std::process::id()
    ));
    let mut saved = ParamStore::<f32>::new(&pool);
    saved
        .add("0", Param::from_slice(&pool, &[2], &[5.0, 6.0]))
        .unwrap();
    saved
        .add("1", Param::from_slice(&pool, &[3], &[0.0; 3]))
        .unwrap();
    saved.save_safetensors(&path, &SaveOptions::new()).unwrap();
    // The first walk (the checks) meets `0`, the next (the writes) `1`, of another shape: the
    // load stopped with an internal "checked above: ShapeMismatch" panic.
    let mut set = Shifty {
        params: vec![
            Param::from_slice(&pool, &[2], &[1.0, 2.0]),
            Param::from_slice(&pool, &[3], &[7.0, 8.0, 9.0]),
        ],
        pick: |walk| usize::from(walk >= 1),
        walks: Default::default(),
    };
    let err = set
        .load_safetensors(&path, &LoadOptions::new())
        .unwrap_err();
    std::fs::remove_file(&path).unwrap();
    assert!(
        matches!(
            err,
            NnError::ParametersChanged {
                index: 0,
                updated: 0
            }
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "the parameter set changed between the walks of one optimizer step or load at position 0 \
         (a Parameters implementation must visit the same parameters in the same order on every \
         call); 0 parameters were updated before it was noticed"
    );
    assert_eq!(set.params[0].to_vec(), [1.0, 2.0]);
    assert_eq!(set.params[1].to_vec(), [7.0, 8.0, 9.0]);
}

#[test]
fn adam_corrects_each_parameter_by_its_own_step_count() {
    // PyTorch keeps Adam's step per parameter: a parameter whose first gradient comes at a later
    // step still makes a first step of size lr.
    let pool = Pool::with_max_memory_mb(16);
    let mut set = vec![Param::<f32>::zeros(&pool, &[1]), Param::zeros(&pool, &[1])];
    let mut adam = Adam::new(0.01);
    for step in 0..3 {
        pool.scope(|s| {
            let mut grads = tensorscope::Gradients::new(s);
            grads.accumulate(&set[0], s.ones::<f32>(&[1])).unwrap();
            if step == 2 {
                grads.accumulate(&set[1], s.ones::<f32>(&[1])).unwrap();
            }
            adam.step(&mut set, &grads).unwrap();
        });
    }
    let late = set[1].to_vec()[0];
    assert!((late + 0.01).abs() < 1e-6, "first step of b: {late}");
    assert!((set[0].to_vec()[0] + 0.03).abs() < 1e-5, "three steps of a");
}

#[test]
fn linear_takes_any_leading_axes() {
    let pool = Pool::with_max_memory_mb(16);
    let w = Param::from_slice(&pool, &[2, 3], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = Param::from_slice(&pool, &[3], &[0.5f32, 0.0, -0.5]);
    let layer = Linear::from_params(w, b).unwrap();
    pool.scope(|s| {
        let x = s.from_slice::<f32>(&[2, 1, 2], &[1.0, 0.0, 0.0, 1.0]);
        let y = layer.forward(&x).unwrap();
        assert_eq!(y.shape(), &[2, 1, 3]);
        assert_eq!(y.to_vec(), vec![1.5, 2.0, 2.5, 4.5, 5.0, 5.5]);
        let rows = layer.forward(&x.reshape(&[2, 2])).unwrap();
        assert_eq!(rows.to_vec(), y.to_vec());
        let one = layer
            .forward(&x.reshape(&[2, 2]).narrow(0, 1, 1).reshape(&[2]))
            .unwrap();
        assert_eq!((one.shape(), one.to_vec()), (&[3][..], vec![4.5, 5.0, 5.5]));
        let err = layer.forward(&s.full::<f32>(&[], 1.0)).unwrap_err();
        assert!(err.to_string().starts_with("Linear: "), "{err}");
        let err = layer.forward(&s.ones::<f32>(&[4, 3])).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("matmul: incompatible shapes [4, 3] and [2, 3]"),
            "{err}"
        );
    });
    let err = Linear::from_params(
        Param::<f32>::zeros(&pool, &[2, 3]),
        Param::zeros(&pool, &[2]),
    )
    .err()
    .unwrap();
    assert!(
        matches!(
            err,
            Error::ShapeMismatch {
                op: "Linear::from_params",
                ..
            }
        ),
        "{err}"
    );
}

/// `width -> 2 width -> width` with layer norm, every activation and a residual connection.
fn model(pool: &Pool, width: usize) -> Sequential<f64> {
    let branch = Sequential::new()
        .push(LayerNorm::new(pool, width, 1e-5).unwrap())
        .push(Linear::new(pool, width, 2 * width, 1).unwrap())
        .push(Activation::gelu())
        .push(Activation::tanh())
        .push(Activation::silu())
        .push(Activation::sigmoid())
        .push(Activation::relu())
        .push(Linear::new(pool, 2 * width, width, 2).unwrap());
    Sequential::new()
        .push(Residual::new(branch))
        .push(Linear::new(pool, width, width, 3).unwrap())
}

#[test]
fn modules_differentiate_through_autograd() {
    let pool = Pool::with_max_memory_mb(64);
    let net = model(&pool, 4);
    // The gradient with respect to the input, against finite differences; the parameters'
    // gradients come from the same rules.
    let x = pool.scope(|s| s.randn::<f64>(&[3, 4], 5).to_array());
    let report = check_gradients(&pool, &[x], 1e-6, |xs| {
        let y = net.forward(&xs[0])?;
        y.try_mul(&y)?.try_reshape(&[12])?.try_sum(0)
    })
    .unwrap();
    assert!(report.max_error() < 1e-6, "{report:?}");
    // Every parameter of every layer gets a gradient in a training scope.
    let mut count = 0;
    let mut net = net;
    net.for_each_param(&mut |_| count += 1);
    let keys = pool.train(|s| {
        let y = net.forward(&s.randn::<f64>(&[3, 4], 5)).unwrap();
        y.mse(&s.zeros(&[3, 4])).backward().unwrap().len()
    });
    assert_eq!((count, keys), (8, 8), "layer norm and three linear layers");
}

#[test]
fn a_checkpointed_sequential_gives_the_plain_gradients_and_reports_layer_errors() {
    let pool = Pool::with_max_memory_mb(64);
    // Handles on the layers' parameters (clones: the same parameters, for looking gradients up).
    let mut handles = Vec::new();
    let mut net = Sequential::new();
    for i in 0..6 {
        let layer = Linear::<f32>::new(&pool, 4, 4, i).unwrap();
        handles.extend([layer.weight().clone(), layer.bias().clone()]);
        net = net.push(layer).push(Activation::tanh());
    }
    let grads = |ckpt: Option<&mut Checkpointer<f32>>| {
        pool.train(|s| {
            let x = s.randn::<f32>(&[2, 4], 9);
            let y = match ckpt {
                Some(ckpt) => net.forward_checkpointed(ckpt, x).unwrap(),
                None => net.forward(&x).unwrap(),
            };
            let grads = y.mse(&s.ones(&[2, 4])).backward().unwrap();
            assert_eq!(grads.len(), handles.len());
            handles
                .iter()
                .map(|p| grads.get(p).unwrap().to_vec())
                .collect::<Vec<_>>()
        })
    };
    let plain = grads(None);
    let mut ckpt = Checkpointer::new(CheckpointConfig::new(Policy::Sqrt));
    assert_eq!(grads(Some(&mut ckpt)), plain, "bit for bit");
    // Sqrt of 12 layers: segments of 4; the last one's graph was kept by the forward.
    assert_eq!(ckpt.last_backward().unwrap().replayed_steps, 8);

    let err = pool.scope(|s| {
        net.forward_checkpointed(&mut ckpt, s.ones::<f32>(&[2, 3]))
            .unwrap_err()
    });
    assert!(
        err.to_string()
            .starts_with("matmul: incompatible shapes [2, 3] and [4, 4]"),
        "{err}"
    );
    ckpt.clear();
    let weights: usize = handles.iter().map(Param::allocated_bytes).sum();
    assert_eq!(pool.stats().bytes_in_use, weights, "nothing else is held");
}

/// `Conv2d` is the convolution plus its bias per channel: against a hand-computed 1x1 case, its
/// gradients (the bias's: the output gradient summed over batch and positions), the names of its
/// parameters, and its errors for bad groups and bad parameter shapes.
#[test]
fn conv2d_adds_its_bias_per_channel_and_differentiates_it() {
    use tensorscope::nn::Conv2d;
    use tensorscope::ops::ConvOptions;
    let pool = Pool::with_max_memory_mb(16);
    // 1x1 kernels: out[c] = sum_i w[c, i] x[i] + b[c].
    let weight = Param::from_slice(&pool, &[2, 3, 1, 1], &[1.0, 2.0, 3.0, -1.0, 0.5, 0.0]);
    let bias = Param::from_slice(&pool, &[2], &[10.0, -10.0]);
    let conv = Conv2d::from_params(weight, bias, ConvOptions::default()).unwrap();
    assert_eq!(param_names(&conv), ["weight", "bias"]);
    pool.train(|s| {
        // Two images of 3 channels, 1x2 positions.
        let x = s.from_slice::<f32>(
            &[2, 3, 1, 2],
            &[1., 2., 3., 4., 5., 6., 0., 1., 0., 1., 0., 1.],
        );
        let y = conv.forward(&x).unwrap();
        assert_eq!(y.shape(), &[2, 2, 1, 2]);
        assert_eq!(
            y.to_vec(),
            vec![
                10. + 1. + 6. + 15.,
                10. + 2. + 8. + 18.,
                -10. - 1. + 1.5,
                -10. - 2. + 2.,
                10.,
                10. + 1. + 2. + 3.,
                -10.,
                -10. - 1. + 0.5,
            ]
        );
        let grads = y.sum_all().backward().unwrap();
        assert_eq!(grads.get(conv.bias()).unwrap().to_vec(), vec![4.0, 4.0]);
        // d/dw[c, i] = sum over images and positions of x[i]: 1+2+0+1, 3+4+0+1, 5+6+0+1.
        assert_eq!(
            grads.get(conv.weight()).unwrap().to_vec(),
            vec![4.0, 8.0, 12.0, 4.0, 8.0, 12.0]
        );
    });
    // Padding and stride reach the op; the default init gives the fan-in's scale.
    let strided = ConvOptions {
        stride: 2,
        padding: 1,
        ..Default::default()
    };
    let made = Conv2d::<f32>::new(&pool, 4, 6, 3, strided, 1).unwrap();
    assert_eq!(made.weight().shape(), &[6, 4, 3, 3]);
    pool.scope(|s| {
        let y = made.forward(&s.ones::<f32>(&[1, 4, 8, 8])).unwrap();
        assert_eq!(y.shape(), &[1, 6, 4, 4]);
    });
    let grouped = ConvOptions {
        groups: 4,
        ..Default::default()
    };
    let e = Conv2d::<f32>::new(&pool, 6, 8, 3, grouped, 1)
        .err()
        .unwrap();
    assert!(
        e.to_string().contains("4 groups must divide the 6 input"),
        "{e}"
    );
    let w = Param::from_slice(&pool, &[2, 3, 1, 1], &[0.0; 6]);
    let b = Param::from_slice(&pool, &[3], &[0.0; 3]);
    let e = Conv2d::from_params(w, b, ConvOptions::default())
        .err()
        .unwrap();
    assert!(e.to_string().contains("Conv2d::from_params"), "{e}");
}

#[test]
fn group_norm_scales_and_shifts_each_channel_and_differentiates_both() {
    use tensorscope::nn::GroupNorm;
    let pool = Pool::with_max_memory_mb(16);
    let weight = Param::from_slice(&pool, &[4], &[1.0, 2.0, 3.0, 4.0]);
    let bias = Param::from_slice(&pool, &[4], &[10.0, 20.0, 30.0, 40.0]);
    let norm = GroupNorm::from_params(weight, bias, 2, 0.0).unwrap();
    assert_eq!(param_names(&norm), ["weight", "bias"]);
    pool.train(|s| {
        // Each group of two channels has mean 4 (then 1) and variance 1: normalized, the values
        // are -1 and 1 exactly.
        let x = s.from_slice::<f32>(&[1, 4, 1, 2], &[3., 3., 5., 5., 0., 2., 0., 2.]);
        let y = norm.forward(&x).unwrap();
        assert_eq!(y.to_vec(), vec![9., 9., 22., 22., 27., 33., 36., 44.]);
        let grads = y.sum_all().backward().unwrap();
        assert_eq!(grads.get(norm.bias()).unwrap().to_vec(), vec![2.0; 4]);
        // d/dweight[c] = the sum of channel c's normalized values.
        assert_eq!(
            grads.get(norm.weight()).unwrap().to_vec(),
            vec![-2.0, 2.0, 0.0, 0.0]
        );
    });
    pool.scope(|s| {
        let e = norm.forward(&s.ones::<f32>(&[1, 6, 2, 2])).err().unwrap();
        assert!(e.to_string().contains("6 channels, the layer 4"), "{e}");
    });
    let e = GroupNorm::<f32>::new(&pool, 3, 4, 1e-5).err().unwrap();
    assert!(e.to_string().contains("3 groups must divide the 4"), "{e}");
}

/// The names of a module's parameters, in order.
fn param_names(module: &impl Parameters<f32>) -> Vec<String> {
    module
        .named_params()
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}
