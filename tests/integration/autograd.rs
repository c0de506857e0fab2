//! Reverse-mode autodiff: every op's backward rule against central finite differences in f64 (the
//! public gradient check), gradients keyed by parameter, accumulation, the errors, and memory: saved
//! tensors released by backward, graphs freed with their last tensor, escapes that carry a graph.

use ndarray::ArrayD;
use tensorscope::autograd::check_gradients;
use tensorscope::prelude::*;
use tensorscope::{Error, Gradients, Result};

use crate::common::test_pool;

/// A random input of `shape` (standard normal, from `seed`).
fn input(shape: &[usize], seed: u64) -> ArrayD<f64> {
    test_pool(8).scope(|s| s.randn::<f64>(shape, seed).to_array())
}

/// `sum(out * w)` for a fixed random `w` of `out`'s shape: a scalar whose gradient with respect to
/// `out` is `w`, so checking it checks the op's whole Jacobian-vector product.
fn weighted_sum<'s>(out: &Tensor<'s, f64>) -> Result<Tensor<'s, f64>> {
    let w = out.bind(&weights(out.shape()));
    let n = out.len();
    out.try_mul(&w)?.try_reshape(&[n])?.try_sum(0)
}

fn weights(shape: &[usize]) -> Param<f64> {
    let pool = Pool::with_max_memory_mb(8);
    pool.scope(|s| s.randn::<f64>(shape, 777).detach())
}

/// Checks `f` of random inputs of `shapes` against finite differences.
#[track_caller]
pub(crate) fn check(
    what: &str,
    shapes: &[&[usize]],
    f: impl for<'s> Fn(&[Tensor<'s, f64>]) -> Result<Tensor<'s, f64>>,
) {
    let inputs: Vec<ArrayD<f64>> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| input(s, 10 + i as u64))
        .collect();
    let pool = test_pool(64);
    let report = check_gradients(&pool, &inputs, 1e-6, |xs| weighted_sum(&f(xs)?))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        report.max_error() < 1e-6,
        "{what}: errors {:?} at {:?}",
        report.errors,
        report.worst
    );
    assert_eq!(
        pool.stats().bytes_in_use,
        0,
        "{what}: every buffer returned"
    );
}

#[test]
fn elementwise_ops_with_broadcasting() {
    let pairs: [(&[usize], &[usize]); 4] = [
        (&[2, 3], &[2, 3]),
        (&[2, 3], &[3]),
        (&[2, 1], &[1, 3]),
        (&[4, 1, 3], &[2, 1]),
    ];
    for (a, b) in pairs {
        check("add", &[a, b], |x| x[0].try_add(&x[1]));
        check("sub", &[a, b], |x| x[0].try_sub(&x[1]));
        check("mul", &[a, b], |x| x[0].try_mul(&x[1]));
        // Denominators kept away from zero.
        check("div", &[a, b], |x| {
            let d = (&x[1]).exp() + 0.5;
            x[0].try_div(&d)
        });
    }
}

#[test]
fn scalar_ops_either_side_and_negation() {
    check("x + c", &[&[3, 2]], |x| Ok(&x[0] + 1.5));
    check("x - c", &[&[3, 2]], |x| Ok(&x[0] - 1.5));
    check("c - x", &[&[3, 2]], |x| Ok(1.5 - &x[0]));
    check("x * c", &[&[3, 2]], |x| Ok(&x[0] * -2.5));
    check("c * x", &[&[3, 2]], |x| Ok(-2.5 * &x[0]));
    check("x / c", &[&[3, 2]], |x| Ok(&x[0] / 4.0));
    check("c / x", &[&[3, 2]], |x| Ok(3.0 / &((&x[0]).exp() + 0.5)));
    check("-x", &[&[3, 2]], |x| Ok(-&x[0]));
    // By value too: the same rules whether or not the op writes in place.
    check("chained by value", &[&[3, 2]], |x| {
        Ok((((&x[0] + 1.0) * 2.0).tanh() - 0.5) / 3.0)
    });
}

#[test]
fn activations() {
    check("relu", &[&[4, 5]], |x| Ok((&x[0]).relu()));
    check("gelu", &[&[4, 5]], |x| Ok((&x[0]).gelu()));
    check("silu", &[&[4, 5]], |x| Ok((&x[0]).silu()));
    check("sigmoid", &[&[4, 5]], |x| Ok((&x[0]).sigmoid()));
    check("tanh", &[&[4, 5]], |x| Ok((&x[0]).tanh()));
    check("exp", &[&[4, 5]], |x| Ok((&x[0]).exp()));
    check("map_with_derivative", &[&[4, 5]], |x| {
        (&x[0]).try_map_with_derivative(|v| v * v * v, |v| 3.0 * v * v)
    });
}

#[test]
fn lane_ops_softmax_log_softmax_layer_norm() {
    for axis in [0, 1, 2] {
        check("softmax", &[&[2, 3, 4]], |x| (&x[0]).try_softmax(axis));
        check("log_softmax", &[&[2, 3, 4]], |x| {
            (&x[0]).try_log_softmax(axis)
        });
    }
    check("layer_norm", &[&[3, 6]], |x| (&x[0]).try_layer_norm(1e-5));
    check("layer_norm 3-D", &[&[2, 3, 4]], |x| {
        (&x[0]).try_layer_norm(1e-5)
    });
}

#[test]
fn reductions() {
    for axis in [0, 1, 2] {
        check("sum", &[&[2, 3, 4]], |x| x[0].try_sum(axis));
        check("mean", &[&[2, 3, 4]], |x| x[0].try_mean(axis));
    }
}

#[test]
fn matmul_transpose_reshape_concat() {
    check("matmul 2-D", &[&[3, 4], &[4, 2]], |x| {
        x[0].try_matmul(&x[1])
    });
    check("matmul [b,m,k] x [k,n]", &[&[2, 3, 4], &[4, 5]], |x| {
        x[0].try_matmul(&x[1])
    });
    check("matmul batched", &[&[2, 3, 4], &[2, 4, 5]], |x| {
        x[0].try_matmul(&x[1])
    });
    check("transpose", &[&[2, 3, 4]], |x| x[0].try_t());
    check("reshape", &[&[2, 3, 4]], |x| x[0].try_reshape(&[4, 6]));
    for axis in [0, 1] {
        check("concat", &[&[2, 3], &[2, 3], &[2, 3]], |x| {
            let pieces = if axis == 0 {
                vec![&x[0], &x[1]]
            } else {
                vec![&x[0], &x[1], &x[2]]
            };
            Tensor::try_concat(&pieces, axis)
        });
    }
}

#[test]
fn shape_ops_of_real_models() {
    check("narrow", &[&[3, 5, 2]], |x| x[0].try_narrow(1, 1, 3));
    check("narrow, negative axis", &[&[3, 5]], |x| {
        x[0].try_narrow(-1, 2, 3)
    });
    check("permute", &[&[2, 3, 4]], |x| x[0].try_permute(&[2, 0, 1]));
    check("transpose(1, 2)", &[&[2, 3, 4, 2]], |x| {
        x[0].try_transpose(1, 2)
    });
    check("split", &[&[2, 7]], |x| {
        let parts = x[0].try_split(3, -1)?;
        // Every piece, each weighted differently, so each one's gradient is checked.
        let lens: Vec<usize> = parts.iter().map(|p| p.shape()[1]).collect();
        assert_eq!(lens, vec![3, 3, 1]);
        Tensor::try_concat(&[&(&parts[2] * 3.0), &(&parts[0] * 2.0), &parts[1]], 1)
    });
    check("chunk", &[&[2, 6]], |x| {
        let [q, k, v] = x[0].try_chunk::<3>(-1)?;
        q.try_mul(&k)?.try_add(&v)
    });
    check("stack", &[&[2, 3], &[2, 3]], |x| {
        Tensor::try_stack(&[&x[0], &x[1]], 1)
    });
    check("squeeze/unsqueeze", &[&[2, 1, 3]], |x| {
        x[0].try_squeeze(1)?.try_unsqueeze(-1)
    });
    check("tril", &[&[2, 4, 4]], |x| x[0].try_tril(0));
    check("triu(1)", &[&[3, 5]], |x| x[0].try_triu(1));
}

#[test]
fn index_ops_of_real_models() {
    check("index_select, repeated ids", &[&[5, 3]], |x| {
        let ids = x[0].bind(&Param::from_slice(
            &Pool::with_max_memory_mb(1),
            &[4],
            &[4i64, 0, 4, 2],
        ));
        x[0].try_index_select(0, &ids)
    });
    check("index_select along 1", &[&[2, 5, 3]], |x| {
        let ids = x[0].bind(&Param::from_slice(
            &Pool::with_max_memory_mb(1),
            &[2],
            &[1i64, 3],
        ));
        x[0].try_index_select(1, &ids)
    });
    check("embedding", &[&[6, 4]], |x| {
        let ids = x[0].bind(&Param::from_slice(
            &Pool::with_max_memory_mb(1),
            &[2, 3],
            &[5i64, 0, 5, 1, 2, 3],
        ));
        x[0].try_embedding(&ids)
    });
    check("gather", &[&[3, 4]], |x| {
        let index = x[0].bind(&Param::from_slice(
            &Pool::with_max_memory_mb(1),
            &[3, 2],
            &[3i64, 3, 0, 1, 2, 0],
        ));
        x[0].try_gather(1, &index)
    });
    check("gather, smaller index", &[&[4, 3]], |x| {
        let index = x[0].bind(&Param::from_slice(
            &Pool::with_max_memory_mb(1),
            &[2, 2],
            &[3i64, 0, 1, 1],
        ));
        x[0].try_gather(0, &index)
    });
    // Random inputs have no ties, so the max is where the gradient goes, and finite differences see
    // the same max.
    for axis in [0, 1, -1] {
        check("max", &[&[3, 4, 2]], |x| x[0].try_max(axis));
        check("min_keepdim", &[&[3, 4, 2]], |x| x[0].try_min_keepdim(axis));
    }
}

#[test]
fn masks_and_selection() {
    check("where_cond", &[&[2, 3], &[3]], |x| {
        let mask = x[0].bind(&Param::from_slice(
            &Pool::with_max_memory_mb(1),
            &[2, 1],
            &[1u8, 0],
        ));
        mask.try_where_cond(&x[0], &x[1])
    });
    check("masked_fill", &[&[2, 3]], |x| {
        let mask = x[0].bind(&Param::from_slice(
            &Pool::with_max_memory_mb(1),
            &[3],
            &[0u8, 1, 0],
        ));
        x[0].try_masked_fill(&mask, -7.0)
    });
    check("causal softmax", &[&[2, 4, 4]], |x| {
        let future = x[0]
            .bind(&Param::from_slice(
                &Pool::with_max_memory_mb(1),
                &[4, 4],
                &[1u8; 16],
            ))
            .triu(1);
        x[0].try_masked_fill(&future, f64::NEG_INFINITY)?
            .try_softmax(-1)
    });
}

#[test]
fn elementwise_functions_of_real_models() {
    fn positive<'s>(x: &Tensor<'s, f64>) -> Tensor<'s, f64> {
        (x * 0.5).exp() + 0.1
    }
    check("log", &[&[3, 4]], |x| Ok(positive(&x[0]).log()));
    check("sqrt", &[&[3, 4]], |x| Ok(positive(&x[0]).sqrt()));
    check("pow 3", &[&[3, 4]], |x| Ok((&x[0]).pow(3.0)));
    check("pow -0.5", &[&[3, 4]], |x| Ok(positive(&x[0]).pow(-0.5)));
    // `x^0` is constant: its gradient is 0 everywhere, x = 0 included (as PyTorch), not NaN.
    let pool = Pool::with_max_memory_mb(8);
    pool.scope(|s| {
        s.train(|t| {
            let x = t.zeros::<f64>(&[3]).requires_grad();
            let grads = (&x).pow(0.0).sum(0).backward().unwrap();
            assert_eq!(grads.of(&x).unwrap().to_vec(), vec![0.0; 3]);
        })
    });
    check("abs", &[&[3, 4]], |x| Ok((&x[0]).abs()));
    check("clamp", &[&[3, 4]], |x| Ok((&x[0]).clamp(-0.5, 0.7)));
    check("gelu_erf", &[&[3, 4]], |x| Ok((&x[0]).gelu_erf()));
    check("rms_norm", &[&[3, 5]], |x| (&x[0]).try_rms_norm(1e-6));
    check("sum_keepdim", &[&[3, 4]], |x| x[0].try_sum_keepdim(-1));
    check("mean_keepdim", &[&[3, 4]], |x| x[0].try_mean_keepdim(0));
    check("sum_all", &[&[3, 4]], |x| x[0].try_sum_all());
    check("mean_all", &[&[3, 4]], |x| x[0].try_mean_all());
}

#[test]
fn matmul_broadcasts_over_leading_axes() {
    check(
        "[b,h,t,d] x [b,h,d,t]",
        &[&[2, 3, 4, 2], &[2, 3, 2, 4]],
        |x| x[0].try_matmul(&x[1]),
    );
    check("[b,1,m,k] x [h,k,n]", &[&[2, 1, 3, 4], &[3, 4, 2]], |x| {
        x[0].try_matmul(&x[1])
    });
    check("[m,k] x [b,k,n]", &[&[3, 4], &[2, 4, 5]], |x| {
        x[0].try_matmul(&x[1])
    });
    check("[b,t,c] x [c,d]", &[&[2, 3, 4], &[4, 5]], |x| {
        x[0].try_matmul(&x[1])
    });
    // An empty inner dimension: the gradients are empty and zero, not a reshape error.
    check("matmul k = 0", &[&[3, 0], &[0, 4]], |x| {
        x[0].try_matmul(&x[1])
    });
    check("matmul batched k = 0", &[&[2, 3, 0], &[0, 4]], |x| {
        x[0].try_matmul(&x[1])
    });
}

#[test]
fn pooling() {
    for (kernel, stride) in [(2, 2), (3, 1), (2, 3)] {
        check("max_pool2d", &[&[2, 3, 5, 6]], |x| {
            x[0].try_max_pool2d(kernel, stride)
        });
        check("avg_pool2d", &[&[2, 3, 5, 6]], |x| {
            x[0].try_avg_pool2d(kernel, stride)
        });
    }
}

#[test]
fn image_ops() {
    for (stride, padding) in [(1, 0), (1, 1), (2, 1)] {
        check("conv2d", &[&[2, 3, 5, 4], &[4, 3, 3, 2]], |x| {
            x[0].try_conv2d(&x[1], stride, padding)
        });
    }
    check("group_norm", &[&[2, 4, 3, 3]], |x| {
        x[0].try_group_norm(2, 1e-5)
    });
    check("upsample", &[&[2, 3, 2, 3]], |x| {
        x[0].try_upsample_nearest2d(2)
    });
}

#[test]
fn losses() {
    check("mse", &[&[3, 4], &[3, 4]], |x| x[0].try_mse(&x[1]));
    check("cross_entropy", &[&[3, 5]], |x| {
        x[0].try_cross_entropy(&[4, 0, 2])
    });
}

#[test]
fn a_transformer_style_block_passes_the_gradient_check() {
    // Self-attention with a causal mask, a residual, layer norm and a GELU MLP, all from tensor ops.
    check(
        "attention block",
        &[&[2, 4, 6], &[6, 18], &[6, 6], &[6, 12], &[12, 6]],
        |p| {
            let (x, wqkv, wo, w1, w2) = (&p[0], &p[1], &p[2], &p[3], &p[4]);
            let h = x.try_layer_norm(1e-5)?;
            let qkv = h.try_matmul(wqkv)?;
            let part = |i: usize| -> Result<Tensor<'_, f64>> {
                // Columns [6 i, 6 i + 6) of qkv, by a matmul with a fixed selection matrix.
                let mut sel = ndarray::Array2::<f64>::zeros((18, 6));
                for j in 0..6 {
                    sel[[6 * i + j, j]] = 1.0;
                }
                qkv.try_matmul(&x.bind(&Param::from_array(&Pool::with_max_memory_mb(1), &sel)))
            };
            let (q, k, v) = (part(0)?, part(1)?, part(2)?);
            let scores = q.try_matmul(&k.try_t()?)? * (1.0 / 6f64.sqrt());
            let mut mask = ndarray::Array2::<f64>::zeros((4, 4));
            for i in 0..4 {
                for j in i + 1..4 {
                    mask[[i, j]] = -1e9;
                }
            }
            let mask = x.bind(&Param::from_array(&Pool::with_max_memory_mb(1), &mask));
            let attn = scores.try_add(&mask)?.try_softmax(2)?;
            let y = x.try_add(&attn.try_matmul(&v)?.try_matmul(wo)?)?;
            let m = (&y)
                .try_layer_norm(1e-5)?
                .try_matmul(w1)?
                .gelu()
                .try_matmul(w2)?;
            y.try_add(&m)
        },
    );
}

#[test]
fn backward_returns_gradients_keyed_by_parameter_in_the_loss_scope() {
    let pool = test_pool(16);
    let w = Param::from_slice(&pool, &[2, 2], &[1.0f64, 2.0, 3.0, 4.0]);
    let b = Param::from_slice(&pool, &[2], &[0.5f64, -0.5]);
    let unused = Param::zeros(&pool, &[3]);
    pool.train(|s| {
        let x = s.from_slice::<f64>(&[1, 2], &[1.0, 1.0]);
        // The same parameter twice: its gradients add up.
        let y = x.matmul(&w) + &b + &b;
        let loss = y.try_mse(&s.zeros::<f64>(&[1, 2])).unwrap();
        let grads = loss.backward().unwrap();
        // y = [4 + 2 (0.5), 6 + 2 (-0.5)] = [5, 5]; dL/dy = 2 y / 2 = y; dL/db = 2 y; dL/dw = x^T y
        assert_eq!(grads.get(&b).unwrap().to_vec(), vec![10.0, 10.0]);
        assert_eq!(grads.get(&w).unwrap().to_vec(), vec![5.0; 4]);
        assert!(grads.get(&unused).is_none());
        assert_eq!(grads.len(), 2);
        // Gradients are tensors of this scope.
        assert!(s.stats().live() >= 2);
    });
    // Outside a training scope the same forward records nothing.
    pool.scope(|s| {
        let x = s.from_slice::<f64>(&[1, 2], &[1.0, 1.0]);
        let y = x.matmul(&w) + &b;
        assert!(!y.has_graph());
        assert_eq!(y.backward().unwrap_err(), Error::NoGraph);
    });
}

#[test]
fn gradients_accumulate_over_backward_passes_and_escape() {
    let pool = test_pool(16);
    let w = Param::from_slice(&pool, &[2], &[1.0f64, -1.0]);
    pool.scope(|outer| {
        let mut grads = Gradients::new(outer);
        for batch in 0..3 {
            outer.train(|s| {
                let x = s.full::<f64>(&[2], batch as f64);
                let loss = x.try_mul(&w).unwrap().try_sum(0).unwrap();
                loss.backward_into(&mut grads).unwrap();
            });
        }
        // d/dw sum(x w) = x, summed over the batches 0, 1, 2.
        assert_eq!(grads.get(&w).unwrap().to_vec(), vec![3.0, 3.0]);
        let ((), stats) = outer.scope_with_stats(|inner| {
            let g = inner.train(|t| {
                let loss = t
                    .full::<f64>(&[2], 2.0)
                    .try_mul(&w)
                    .unwrap()
                    .try_sum(0)
                    .unwrap();
                t.escape(loss.backward().unwrap())
            });
            assert_eq!(g.get(&w).unwrap().to_vec(), vec![2.0, 2.0]);
        });
        assert_eq!(stats.leaked, 0);
    });
    assert_eq!(pool.stats().bytes_in_use, w.allocated_bytes());
}

#[test]
fn a_marked_tensor_gets_its_gradient() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.from_slice::<f64>(&[3], &[1.0, 2.0, 3.0]).requires_grad();
        let y = (&x * &x).try_sum(0).unwrap();
        let grads = y.backward().unwrap();
        assert_eq!(grads.of(&x).unwrap().to_vec(), vec![2.0, 4.0, 6.0]);
        let plain = s.ones::<f64>(&[3]);
        assert!(grads.of(&plain).is_none());
    });
}

#[test]
fn errors_name_what_is_wrong() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.from_slice::<f64>(&[2], &[1.0, 2.0]).requires_grad();
        assert_eq!(
            (&x).exp().backward().unwrap_err().to_string(),
            "backward: the tensor has shape [2]; backward starts from a single value (a loss), or \
             use backward_with and give the gradient of the output"
        );
        let err = (&x).exp().backward_with(&s.ones::<f64>(&[3])).unwrap_err();
        assert!(
            matches!(
                &err,
                Error::ShapeMismatch {
                    op: "backward_with",
                    ..
                }
            ),
            "{err}"
        );
        for (op, y) in [
            ("map", (&x).map(|v| v * 2.0)),
            ("zip_map", x.zip_map(&x, |a, b| a * b)),
            ("map_lanes", (&x).map_lanes(0, |_| ())),
        ] {
            let loss = y.try_sum(0).unwrap();
            assert_eq!(
                loss.backward().unwrap_err(),
                Error::NotDifferentiable { op }
            );
        }
        let through_cast = x.cast::<f32>().cast::<f64>().try_sum(0).unwrap();
        assert_eq!(
            through_cast.backward().unwrap_err(),
            Error::NotDifferentiable { op: "cast" }
        );
        // A graph is differentiated once: backward releases what it saved.
        let loss = (&x * &x).try_sum(0).unwrap();
        loss.backward().unwrap();
        assert_eq!(loss.backward().unwrap_err(), Error::GraphConsumed);
        // Writing into a tensor of a graph would make its gradient wrong.
        let mut y = &x * 2.0;
        assert_eq!(
            y.try_view_mut().unwrap_err(),
            Error::WriteToGraph { op: "view_mut" }
        );
        let mut free = y.without_grad();
        free.view_mut()[[0]] = 7.0;
        assert_eq!(free.to_vec(), vec![7.0, 4.0]);
    });
}

#[test]
fn by_value_ops_never_overwrite_what_a_graph_saved() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.from_slice::<f64>(&[3], &[0.5, -1.0, 2.0]).requires_grad();
        // `exp` saves its output; `relu` by value on it must rent, not overwrite it.
        let e = (&x).exp();
        let ptr = e.as_slice().unwrap().as_ptr();
        let r = e.relu();
        assert_ne!(r.as_slice().unwrap().as_ptr(), ptr);
        let grads = r.try_sum(0).unwrap().backward().unwrap();
        let want: Vec<f64> = [0.5f64, -1.0, 2.0].iter().map(|v| v.exp()).collect();
        assert_eq!(grads.of(&x).unwrap().to_vec(), want);
    });
}

#[test]
fn backward_releases_saved_tensors_and_a_dropped_graph_frees_them() {
    let pool = test_pool(64);
    let w = Param::from_slice(&pool, &[4, 4], &[0.1f32; 16]);
    pool.train(|s| {
        let base = pool.stats().bytes_in_use;
        let x = s.ones::<f32>(&[8, 4]);
        let h = x.matmul(&w).tanh().matmul(&w).sigmoid();
        let loss = h.try_mse(&s.zeros::<f32>(&[8, 4])).unwrap();
        let held = pool.stats().bytes_in_use;
        drop(h);
        assert_eq!(
            pool.stats().bytes_in_use,
            held,
            "the loss's graph keeps what backward needs"
        );
        let grads = loss.backward().unwrap();
        drop(grads);
        // Only x and the loss remain: every saved activation was released as its rule ran.
        assert_eq!(
            pool.stats().bytes_in_use - base,
            x.allocated_bytes() + loss.allocated_bytes()
        );
        let again = x.matmul(&w).tanh();
        let before = pool.stats().bytes_in_use;
        drop(again);
        assert!(
            pool.stats().bytes_in_use < before,
            "a dropped graph frees what it saved"
        );
    });
}

#[test]
fn escaping_a_tensor_with_its_graph_moves_the_graphs_accounting() {
    let pool = test_pool(64);
    let w = Param::from_slice(&pool, &[4, 4], &[0.1f32; 16]);
    pool.train(|s| {
        let x = s.ones::<f32>(&[2, 4]);
        let (y, inner) = s.scope_with_stats(|i| {
            let x = i.rebind(&x);
            // tanh saves its output; the matmuls save their inputs: all owned by `i`.
            i.escape(x.matmul(&w).tanh().matmul(&w))
        });
        assert_eq!(inner.leaked, 0, "{inner:?}");
        assert!(
            inner.escaped >= 2,
            "the output and the saved tanh: {inner:?}"
        );
        let grads = y
            .try_sum(0)
            .unwrap()
            .try_sum(0)
            .unwrap()
            .backward()
            .unwrap();
        assert_eq!(grads.get(&w).unwrap().shape(), &[4, 4]);
    });
    assert_eq!(pool.stats().bytes_in_use, w.allocated_bytes());
}

#[test]
fn no_grad_records_nothing() {
    let pool = test_pool(16);
    let w = Param::from_slice(&pool, &[2], &[1.0f64, 2.0]);
    pool.train(|s| {
        let x = s.ones::<f64>(&[2]).requires_grad();
        s.no_grad(|n| {
            let y = (&x).exp() * 2.0;
            let z = y.try_mul(&w).unwrap();
            assert!(!y.has_graph() && !z.has_graph());
            assert!(!n.bind(&w).has_graph());
        });
        assert!(s.bind(&w).has_graph());
    });
}

#[test]
fn a_written_clone_is_the_same_parameter_and_a_duplicate_is_another() {
    let pool = test_pool(16);
    let w = Param::from_slice(&pool, &[2], &[1.0f64, 2.0]);
    // A teacher made by cloning and then writing: still `w` for gradients. Summing the student's
    // and the teacher's contributions under one key would be the gradient of neither.
    let mut teacher = w.clone();
    teacher.view_mut().fill(0.0);
    let err = pool.train(|s| {
        let x = s.ones::<f64>(&[2]);
        let loss = (&x * &w).try_mse(&(&x * &teacher)).unwrap();
        loss.backward().unwrap_err()
    });
    assert_eq!(
        err,
        Error::ParamUsedWithTwoValues {
            shape: tensorscope::Shape::from(&[2][..])
        }
    );
    // A duplicate is an independent parameter: the student's gradient alone, 2 (w - 0) / 2.
    let teacher = teacher.duplicate();
    let grad = pool.train(|s| {
        let x = s.ones::<f64>(&[2]);
        let loss = (&x * &w).try_mse(&(&x * &teacher)).unwrap();
        let grads = loss.backward().unwrap();
        assert_eq!(grads.len(), 2, "the teacher is a parameter of its own");
        grads.get(&w).unwrap().to_vec()
    });
    assert_eq!(grad, vec![1.0, 2.0]);
}

#[test]
fn a_backward_through_an_op_without_derivative_adds_nothing_and_consumes_nothing() {
    let pool = test_pool(16);
    let (w1, w2) = (
        Param::from_slice(&pool, &[2, 2], &[1.0f64; 4]),
        Param::from_slice(&pool, &[2, 2], &[1.0f64; 4]),
    );
    pool.train(|s| {
        let x = s.ones::<f64>(&[1, 2]);
        let mut acc = Gradients::new(s);
        x.matmul(&w2)
            .try_sum(1)
            .unwrap()
            .try_sum(0)
            .unwrap()
            .backward_into(&mut acc)
            .unwrap();
        let before = acc.get(&w2).unwrap().to_vec();
        // w2's branch differentiates; w1's goes through a `map`, which has no derivative.
        let loss = (x.matmul(&w2) + x.matmul(&w1).map(|v| v * 2.0))
            .try_sum(1)
            .unwrap()
            .try_sum(0)
            .unwrap();
        let err = loss.backward_into(&mut acc).unwrap_err();
        assert_eq!(err, Error::NotDifferentiable { op: "map" });
        assert_eq!(acc.get(&w2).unwrap().to_vec(), before, "nothing added");
        assert!(acc.get(&w1).is_none());
        // Checked before any rule ran: the graph is intact, and says the same again.
        assert_eq!(loss.backward_into(&mut acc).unwrap_err(), err);
    });
}

#[test]
fn the_gradient_check_never_passes_a_nan_and_gives_zeros_without_dependence() {
    let pool = test_pool(16);
    let x = input(&[3], 5);
    let nan = check_gradients(&pool, std::slice::from_ref(&x), 1e-6, |xs| {
        (&xs[0])
            .try_map_with_derivative(|v| v * v, |_| f64::NAN)?
            .try_sum(0)
    })
    .unwrap();
    assert!(nan.max_error().is_nan(), "{nan:?}");
    let c = weights(&[3]);
    let none = check_gradients(&pool, &[x], 1e-6, |xs| xs[0].bind(&c).try_sum(0)).unwrap();
    assert_eq!(none.max_error(), 0.0);
    assert_eq!(none.analytic[0].as_slice().unwrap(), &[0.0; 3]);
}

#[test]
fn gradients_never_alias_a_tensor_of_a_shorter_scope() {
    // The seed of `backward_with` flows unchanged to a marked leaf, and a hand-written gradient is
    // added by `accumulate`: if the gradients took those buffers, a tensor of a scope that ends
    // would live on under the gradients' (longer) brand without ever being escaped.
    let pool = test_pool(16);
    let w = Param::from_slice(&pool, &[4], &[0.0f32; 4]);
    pool.scope(|s| {
        let anchor = s.zeros::<f32>(&[4]).requires_grad();
        let mut kept = Gradients::new(s);
        let (seeded, inner) = s.scope_with_stats(|i| {
            let deep = i.full::<f32>(&[4], 9.0);
            let grads = anchor.backward_with(&deep).unwrap();
            let seeded = grads.of(&anchor).unwrap().clone();
            assert!(!seeded.shares_buffer_with(&deep), "the seed was copied");
            kept.accumulate(&w, deep.clone()).unwrap();
            assert!(!kept.get(&w).unwrap().shares_buffer_with(&deep));
            seeded.to_vec()
        });
        assert_eq!(seeded, vec![9.0; 4]);
        assert_eq!((inner.escaped, inner.leaked), (0, 0), "{inner:?}");
        assert_eq!(kept.get(&w).unwrap().to_vec(), vec![9.0; 4]);
    });
    assert_eq!(pool.stats().bytes_in_use, w.allocated_bytes());
}

#[test]
fn data_bound_without_grad_crosses_ops_without_a_derivative() {
    let pool = Pool::with_max_memory_mb(16);
    let w = Param::from_slice(&pool, &[2], &[1.0f32, 2.0]);
    let labels = Param::from_slice(&pool, &[2], &[0.0f32, 1.0]);
    pool.train(|s| {
        // Bound in a training scope, a parameter is a gradient leaf: the cast is on the path.
        let leaf = s.bind(&labels).cast::<f64>().cast::<f32>();
        let err = (&leaf * &w).sum_all().backward().unwrap_err();
        assert_eq!(err, Error::NotDifferentiable { op: "cast" });
        assert!(err.to_string().contains("without_grad()"), "{err}");
        let data = s.bind(&labels).without_grad().cast::<f64>().cast::<f32>();
        let grads = (&data * &w).sum_all().backward().unwrap();
        assert_eq!(grads.get(&w).unwrap().to_vec(), vec![0.0, 1.0]);
    });
}
