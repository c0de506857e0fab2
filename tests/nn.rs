//! The training path's groundwork: named parameters, losses (values and gradients against central
//! finite differences in f64) and optimizers (against hand-computed updates).

use tensorscope::nn::{mse, softmax_cross_entropy, Adam, NnError, Optimizer, ParamStore, Sgd};
use tensorscope::prelude::*;
use tensorscope::Error;
use tensorscope::Param;

#[test]
fn params_are_found_by_name_in_registration_order() {
    let pool = Pool::with_max_memory_mb(16);
    let mut params = ParamStore::<f32>::new(&pool);
    let w = params.randn("fc1.weight", &[3, 2], 0.5, 1).unwrap();
    params.zeros("fc1.bias", &[2]).unwrap();
    params.ones("fc2.weight", &[2, 2]).unwrap();
    let names: Vec<&str> = params.iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["fc1.weight", "fc1.bias", "fc2.weight"]);
    assert_eq!(params.id("fc1.weight").unwrap(), w);
    assert_eq!(params[w].shape(), &[3, 2]);
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

/// Central finite differences of `f` at `x`, element by element.
fn numeric_grad(x: &[f64], f: impl Fn(&[f64]) -> f64) -> Vec<f64> {
    let h = 1e-6;
    (0..x.len())
        .map(|i| {
            let mut plus = x.to_vec();
            let mut minus = x.to_vec();
            plus[i] += h;
            minus[i] -= h;
            (f(&plus) - f(&minus)) / (2.0 * h)
        })
        .collect()
}

fn assert_grad_close(analytic: &[f64], numeric: &[f64]) {
    for (i, (a, n)) in analytic.iter().zip(numeric).enumerate() {
        assert!(
            (a - n).abs() <= 1e-6 * (1.0 + n.abs()),
            "element {i}: {a} vs {n}"
        );
    }
}

#[test]
fn mse_value_and_gradient() {
    tensorscope::scope(|s| {
        let pred: Vec<f64> = vec![0.5, -1.0, 2.0, 0.25, 3.0, -0.75];
        let target: Vec<f64> = vec![1.0, -1.5, 1.0, 0.0, 2.5, 0.25];
        let t = s.from_slice::<f64>(&[2, 3], &target);
        let loss_of = |p: &[f64]| mse(&s.from_slice::<f64>(&[2, 3], p), &t).unwrap().0;
        let (loss, grad) = mse(&s.from_slice::<f64>(&[2, 3], &pred), &t).unwrap();
        let expected: f64 = pred
            .iter()
            .zip(&target)
            .map(|(p, t)| (p - t).powi(2))
            .sum::<f64>()
            / 6.0;
        assert!((loss - expected).abs() < 1e-15);
        assert_grad_close(&grad.to_vec(), &numeric_grad(&pred, loss_of));
        let err = mse(&s.zeros::<f64>(&[2]), &s.zeros::<f64>(&[3])).unwrap_err();
        assert!(matches!(
            err,
            NnError::Tensor(Error::ShapeMismatch { op: "mse", .. })
        ));
    });
}

#[test]
fn softmax_cross_entropy_value_gradient_and_errors() {
    tensorscope::scope(|s| {
        let logits: Vec<f64> = vec![1.0, 2.0, 0.5, -1.0, 0.0, 3.0];
        let labels = [1usize, 2];
        let loss_of = |l: &[f64]| {
            softmax_cross_entropy(&s.from_slice::<f64>(&[2, 3], l), &labels)
                .unwrap()
                .0
        };
        let (loss, grad) =
            softmax_cross_entropy(&s.from_slice::<f64>(&[2, 3], &logits), &labels).unwrap();
        let row_loss = |row: &[f64], label: usize| {
            let lse = row.iter().map(|v| v.exp()).sum::<f64>().ln();
            lse - row[label]
        };
        let expected = (row_loss(&logits[0..3], 1) + row_loss(&logits[3..6], 2)) / 2.0;
        assert!((loss - expected).abs() < 1e-14, "{loss} vs {expected}");
        assert_grad_close(&grad.to_vec(), &numeric_grad(&logits, loss_of));

        let bad = s.zeros::<f64>(&[2, 3]);
        assert_eq!(
            softmax_cross_entropy(&bad, &[0, 3])
                .unwrap_err()
                .to_string(),
            "cross_entropy: label 3 of row 1 is out of range for 3 classes"
        );
        assert!(matches!(
            softmax_cross_entropy(&bad, &[0]).unwrap_err(),
            NnError::Tensor(Error::LengthMismatch {
                expected: 2,
                got: 1,
                ..
            })
        ));
        assert!(matches!(
            softmax_cross_entropy(&s.zeros::<f64>(&[6]), &[0]).unwrap_err(),
            NnError::Tensor(Error::InvalidShape { .. })
        ));
    });
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

mod layers {
    use super::*;
    use tensorscope::nn::{Activation, Cache, Layer, LayerNorm, Linear, Residual, Sequential};

    /// `L = sum(layer(x) * r)` for `x` given as values.
    fn loss(
        layer: &dyn Layer<f64>,
        params: &ParamStore<f64>,
        shape: &[usize],
        x: &[f64],
        r: &[f64],
    ) -> f64 {
        tensorscope::scope(|s| {
            let y = layer
                .forward(params, &s.from_slice::<f64>(shape, x), None)
                .unwrap();
            y.as_slice().iter().zip(r).map(|(a, b)| a * b).sum()
        })
    }

    fn set(params: &mut ParamStore<f64>, name: &str, values: &[f64]) {
        let p = params.get_mut(name).unwrap();
        p.view_mut().as_slice_mut().unwrap().copy_from_slice(values);
    }

    /// Checks `layer`'s backward against central finite differences of `L = sum(y * r)`, for the
    /// input and for every parameter, in f64.
    fn check(make: impl Fn(&mut ParamStore<f64>) -> Box<dyn Layer<f64>>, shape: &[usize]) {
        let pool = Pool::with_max_memory_mb(64);
        let mut params = ParamStore::<f64>::new(&pool);
        let layer = make(&mut params);
        let (x, r, dx, param_grads) = pool.scope(|s| {
            let x = s.randn::<f64>(shape, 11);
            let mut cache = Cache::new();
            let y = layer.forward(&params, &x, Some(&mut cache)).unwrap();
            let r = s.randn::<f64>(y.shape(), 12);
            let mut grads = tensorscope::Gradients::new(s);
            let dx = layer.backward(&params, &mut grads, &mut cache, &r).unwrap();
            let param_grads: Vec<Vec<f64>> = params
                .iter()
                .map(|(_, p)| {
                    grads
                        .get(p)
                        .expect("every parameter has a gradient")
                        .to_vec()
                })
                .collect();
            assert!(
                cache.is_empty(),
                "{}: backward popped all it pushed",
                layer.name()
            );
            let plain = layer.forward(&params, &x, None).unwrap();
            assert_eq!(
                y.to_vec(),
                plain.to_vec(),
                "caching does not change the output"
            );
            (x.to_vec(), r.to_vec(), dx.to_vec(), param_grads)
        });
        let numeric = numeric_grad(&x, |v| loss(&*layer, &params, shape, v, &r));
        assert_grad_close(&dx, &numeric);

        let names: Vec<String> = params.iter().map(|(n, _)| n.to_string()).collect();
        for (name, grad) in names.into_iter().zip(param_grads) {
            let value = params.get(&name).unwrap().to_vec();
            let mut numeric = Vec::new();
            for i in 0..value.len() {
                let h = 1e-6;
                let mut plus = value.clone();
                plus[i] += h;
                set(&mut params, &name, &plus);
                let up = loss(&*layer, &params, shape, &x, &r);
                plus[i] -= 2.0 * h;
                set(&mut params, &name, &plus);
                let down = loss(&*layer, &params, shape, &x, &r);
                numeric.push((up - down) / (2.0 * h));
            }
            set(&mut params, &name, &value);
            assert_grad_close(&grad, &numeric);
        }
    }

    #[test]
    fn linear_backward_matches_finite_differences() {
        check(
            |p| Box::new(Linear::new(p, "fc", 4, 3, 1).unwrap()),
            &[5, 4],
        );
    }

    #[test]
    fn activations_backward_match_finite_differences() {
        check(|_| Box::new(Activation::relu()), &[3, 4]);
        check(|_| Box::new(Activation::gelu()), &[3, 4]);
        check(|_| Box::new(Activation::tanh()), &[3, 4]);
    }

    #[test]
    fn layer_norm_backward_matches_finite_differences() {
        check(
            |p| Box::new(LayerNorm::new(p, "ln", 6, 1e-5).unwrap()),
            &[4, 6],
        );
    }

    #[test]
    fn residual_block_and_sequential_backward_match_finite_differences() {
        check(
            |p| {
                let inner = Sequential::new()
                    .push(Linear::new(p, "b.fc1", 4, 8, 2).unwrap())
                    .push(Activation::gelu())
                    .push(Linear::new(p, "b.fc2", 8, 4, 3).unwrap());
                Box::new(
                    Sequential::new()
                        .push(Residual::new(inner))
                        .push(LayerNorm::new(p, "b.ln", 4, 1e-5).unwrap())
                        .push(Activation::tanh()),
                )
            },
            &[3, 4],
        );
    }

    #[test]
    fn backward_without_forward_is_an_error() {
        let pool = Pool::with_max_memory_mb(16);
        let mut params = ParamStore::<f32>::new(&pool);
        let fc = Linear::new(&mut params, "fc", 2, 2, 1).unwrap();
        pool.scope(|s| {
            let mut grads = tensorscope::Gradients::new(s);
            let err = fc
                .backward(
                    &params,
                    &mut grads,
                    &mut Cache::new(),
                    &s.ones::<f32>(&[1, 2]),
                )
                .unwrap_err();
            assert_eq!(
                err.to_string(),
                "linear: backward found no cached forward values; run forward with a cache first"
            );
        });
    }
}

#[test]
fn a_layer_used_with_another_store_is_an_error_naming_the_layer() {
    use tensorscope::nn::{Layer, Linear};
    let pool = Pool::with_max_memory_mb(16);
    let mut own = ParamStore::<f32>::new(&pool);
    let linear = Linear::new(&mut own, "fc", 3, 2, 1).unwrap();
    // A store with too few parameters (an index past its end), and one whose first two
    // parameters have the shapes the layer expects (which must not be used either).
    let mut short = ParamStore::<f32>::new(&pool);
    short.zeros("w", &[1]).unwrap();
    let mut lookalike = ParamStore::<f32>::new(&pool);
    lookalike.zeros("w", &[3, 2]).unwrap();
    lookalike.zeros("b", &[2]).unwrap();
    pool.scope(|s| {
        let x = s.ones::<f32>(&[4, 3]);
        for store in [&short, &lookalike] {
            let err = linear.forward(store, &x, None).unwrap_err();
            assert_eq!(
                err,
                NnError::ForeignParam {
                    layer: "linear",
                    index: 0
                }
            );
            assert_eq!(
                err.to_string(),
                "linear: parameter #0 was registered in another ParamStore; use the layer with \
                 the store it was built with"
            );
        }
        assert_eq!(linear.forward(&own, &x, None).unwrap().shape(), &[4, 2]);
    });
}

#[test]
fn backward_with_a_gradient_or_cache_of_the_wrong_shape_is_an_error() {
    use tensorscope::nn::{Activation, Cache, Layer, LayerNorm};
    use tensorscope::Shape;
    let pool = Pool::with_max_memory_mb(16);
    let mut params = ParamStore::<f32>::new(&pool);
    let norm = LayerNorm::new(&mut params, "ln", 3, 1e-5).unwrap();
    pool.scope(|s| {
        let x = s.ones::<f32>(&[4, 3]);
        let grad_shape = |layer, got: &[usize]| NnError::GradShape {
            layer,
            expected: Shape(vec![4, 3]),
            got: Shape(got.to_vec()),
        };
        let mut grads = tensorscope::Gradients::new(s);
        let mut cache = Cache::new();
        norm.forward(&params, &x, Some(&mut cache)).unwrap();
        let err = norm
            .backward(&params, &mut grads, &mut cache, &s.ones::<f32>(&[4, 2]))
            .unwrap_err();
        assert_eq!(err, grad_shape("layer_norm", &[4, 2]));
        assert_eq!(
            err.to_string(),
            "layer_norm: the gradient has shape [4, 2] but the layer's output has shape [4, 3]"
        );
        // A gradient that would broadcast against the input is still the wrong shape.
        for act in [Activation::relu(), Activation::gelu(), Activation::tanh()] {
            let mut cache = Cache::new();
            act.forward(&params, &x, Some(&mut cache)).unwrap();
            let err = act
                .backward(&params, &mut grads, &mut cache, &s.ones::<f32>(&[1, 3]))
                .unwrap_err();
            assert_eq!(err, grad_shape(Layer::<f32>::name(&act), &[1, 3]));
        }
        // Rank-0 tensors where the layer norm's backward expects its forward's values.
        let mut cache = Cache::new();
        cache.push(s.ones::<f32>(&[]));
        cache.push(s.ones::<f32>(&[]));
        let err = norm
            .backward(&params, &mut grads, &mut cache, &s.ones::<f32>(&[]))
            .unwrap_err();
        assert!(
            matches!(
                &err,
                NnError::Tensor(Error::InvalidShape { op: "layer_norm backward", shape, .. })
                    if shape.0.is_empty()
            ),
            "{err}"
        );
    });
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
fn optimizers_update_any_parameter_set_in_place_and_refuse_one_listed_twice() {
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
    // A clone listed beside its original is the same parameter (one key): updating both would apply
    // the step twice.
    set.push(set[1].clone());
    pool.scope(|s| {
        let grads = grads_of(&set[..2], s);
        let err = sgd.step(&mut set, &grads).unwrap_err();
        assert!(
            matches!(&err, NnError::ParamListedTwice { index: 2, shape } if shape.0 == [3]),
            "{err}"
        );
        assert!(
            err.to_string()
                .contains("lists parameter #2 (shape [3]) twice"),
            "{err}"
        );
    });
    assert_eq!(set[0].to_vec(), [-0.5; 2], "nothing changed");
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
        err.to_string().contains("another copy of its values"),
        "{err}"
    );
    assert_eq!(
        store.get("w").unwrap().to_vec(),
        [0.5; 2],
        "nothing changed"
    );
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
