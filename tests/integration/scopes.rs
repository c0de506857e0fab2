//! Scopes and tensors working with the pool: reuse, steady state, escape accounting, panics, budgets.

use tensorscope::ops::Cmp;
use tensorscope::prelude::*;
use tensorscope::{Error, PoolConfig};

use crate::common::{max_abs_diff, panic_message};

/// A fixed little forward: rents a few temporaries of mixed sizes and types, returns a scalar.
fn forward(s: &Scope<'_, '_>, w: &Param) -> f32 {
    s.scope(|inner| {
        let x = inner.randn::<f32>(&[16, 32], 3);
        let h = x.matmul(w).relu();
        let p = h.softmax(1);
        let lowp = inner.full::<tensorscope::f16>(&[300], tensorscope::f16::ONE);
        let total = p.sum(1).sum(0).to_vec()[0];
        total + lowp.len() as f32
    })
}

#[test]
fn second_run_of_a_fixed_forward_has_zero_misses() {
    let pool = Pool::with_max_memory_mb(64);
    let w = pool.scope(|s| s.randn::<f32>(&[32, 8], 1).detach());
    let first = pool.scope(|s| forward(s, &w));
    let after_first = pool.stats();
    assert!(after_first.misses > 0);
    for _ in 0..100 {
        let again = pool.scope(|s| forward(s, &w));
        assert_eq!(again, first);
    }
    let after = pool.stats();
    assert_eq!(
        after.misses, after_first.misses,
        "no fresh allocation after the first run"
    );
    assert_eq!(after.bytes_in_use, w.allocated_bytes());
    assert_eq!(after.peak_bytes_in_use, after_first.peak_bytes_in_use);
    assert!(after.hits >= 100 * 4);
}

#[test]
fn a_dropped_buffer_is_handed_out_again() {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|s| {
        let a = s.zeros::<f32>(&[1024]);
        let addr = a.as_slice().unwrap().as_ptr() as usize;
        drop(a);
        let b = s.ones::<f32>(&[32, 32]);
        assert_eq!(b.as_slice().unwrap().as_ptr() as usize, addr);
        assert_eq!(
            b.to_vec(),
            vec![1.0; 1024],
            "a reused buffer is fully overwritten"
        );
    });
    assert_eq!(pool.stats().hits, 1);
    assert_eq!(pool.stats().misses, 1);
}

#[test]
fn escaped_result_is_all_that_stays_in_use() {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|s| {
        let x = s.randn::<f32>(&[8, 8], 5);
        let in_use_before = pool.stats().bytes_in_use;
        let (y, child) = s.scope_with_stats(|inner| {
            let x = inner.rebind(&x);
            let a = &x * 2.0;
            let b = (&a + &x).tanh();
            let _unused = inner.zeros::<f64>(&[100]);
            inner.escape(b.matmul(&x))
        });
        assert_eq!(
            child.rented, 4,
            "a, the tanh output, the f64 zeros and the matmul output"
        );
        assert_eq!(child.released + child.escaped, child.rented);
        assert_eq!((child.escaped, child.leaked, child.bytes_in_use), (1, 0, 0));
        assert_eq!(
            pool.stats().bytes_in_use,
            in_use_before + y.allocated_bytes(),
            "the pool holds exactly the escaped result beyond what was there"
        );
        let expected = {
            let xv = x.to_array().into_dimensionality::<ndarray::Ix2>().unwrap();
            (&xv * 3.0).mapv(f32::tanh).dot(&xv)
        };
        let got = y.to_array().into_dimensionality::<ndarray::Ix2>().unwrap();
        let max_err = max_abs_diff(got.as_slice().unwrap(), expected.as_slice().unwrap());
        assert!(max_err < 1e-4, "max abs error {max_err}");
        assert_eq!(s.stats().adopted, 1);
    });
    assert_eq!(pool.stats().bytes_in_use, 0);
}

#[test]
fn ops_on_outer_tensors_rent_in_the_deeper_scope() {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|outer| {
        let a = outer.ones::<f32>(&[4]);
        let ((), inner_stats) = outer.scope_with_stats(|inner| {
            let b = inner.ones::<f32>(&[4]);
            let c = &a + &b; // mixes brands: rented in the inner scope
            assert_eq!(c.to_vec(), vec![2.0; 4]);
        });
        assert_eq!(inner_stats.rented, 2);
        assert_eq!(outer.stats().rented, 1);
    });
}

#[test]
fn escape_carries_tuples_vecs_options_and_results() {
    let pool = Pool::with_max_memory_mb(64);
    let out = pool.scope(|s| {
        let (pair, v, o, r, n) = s.scope(|inner| {
            let t = || inner.ones::<f32>(&[2]);
            let r: Result<Tensor<'_>, String> = Ok(t());
            inner.escape(((t(), t()), vec![t(), t(), t()], Some([t(), t()]), r, 7usize))
        });
        assert_eq!(s.stats().adopted, 8);
        assert_eq!(n, 7);
        let total = &(&pair.0 + &pair.1) + &(&v[2] + &o.unwrap()[1]);
        (&total + &r.unwrap()).to_vec()
    });
    assert_eq!(out.to_vec(), vec![5.0, 5.0]);
}

#[test]
fn a_detached_tensor_is_a_parameter_that_outlives_its_scope() {
    let pool = Pool::with_max_memory_mb(64);
    // The only handle: its buffer moves into the parameter, counted as escaped.
    let (kept, stats) = pool.scope_with_stats(|s| s.full::<f64>(&[3], 1.5).detach());
    assert_eq!((stats.rented, stats.escaped, stats.leaked), (1, 1, 0));
    assert_eq!(kept.to_vec(), vec![1.5; 3]);
    assert_eq!(pool.stats().bytes_in_use, 64);
    // A shared handle is copied: the alias keeps its buffer, the parameter gets its own.
    let (copy, stats) = pool.scope_with_stats(|s| {
        let t = s.full::<f32>(&[4], 2.0);
        let alias = t.clone();
        let p = t.detach();
        assert_eq!(alias.to_vec(), p.to_vec());
        assert_ne!(alias.as_slice().unwrap().as_ptr(), p.as_slice().as_ptr());
        p
    });
    assert_eq!((stats.rented, stats.released, stats.escaped), (1, 1, 0));
    // Computing with a parameter needs a scope: bound (no copy), never written through.
    pool.scope(|s| {
        let bound = s.bind(&kept);
        assert_eq!(bound.as_slice().unwrap().as_ptr(), kept.as_slice().as_ptr());
        assert!(!bound.is_unique());
        let doubled = bound * 2.0; // by value, but the buffer is the parameter's: rents
        assert_eq!(doubled.to_vec(), vec![3.0; 3]);
        assert_eq!(s.stats().rented, 1);
    });
    assert_eq!(kept.to_vec(), vec![1.5; 3]);
    // Nor do in-place ops and writable views: a bound tensor is never unique.
    pool.scope(|s| {
        let x = s.full::<f64>(&[3], -1.0);
        let relu = s.bind(&kept).relu();
        let sum = s.bind(&kept) + &x;
        let softmax = s.bind(&kept).softmax(0);
        let mut written = s.bind(&kept);
        written.view_mut()[[0]] = 9.0;
        assert_eq!(written.to_vec(), vec![9.0, 1.5, 1.5]);
        assert_eq!((relu.to_vec(), sum.to_vec()), (vec![1.5; 3], vec![0.5; 3]));
        assert!((softmax.to_vec()[0] - 1.0 / 3.0).abs() < 1e-12);
    });
    assert_eq!(kept.to_vec(), vec![1.5; 3]);
    drop((kept, copy));
    assert_eq!(pool.stats().bytes_in_use, 0);
    let p = Param::from_array(&pool, &ndarray::arr2(&[[1.0f32, 2.0], [3.0, 4.0]]));
    assert_eq!(p.shape(), &[2, 2]);
    assert_eq!(p.to_vec(), vec![1.0, 2.0, 3.0, 4.0]);
}

#[test]
fn by_value_chain_on_a_unique_tensor_rents_nothing() {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|s| {
        let x = s.randn::<f32>(&[64, 64], 9);
        let reference = (&x).relu().exp();
        let misses = pool.stats().misses;
        let hits = pool.stats().hits;
        let y = (x * 2.0 + 1.0).relu().exp() - 1.0;
        assert_eq!((pool.stats().misses, pool.stats().hits), (misses, hits));
        assert_eq!(y.shape(), reference.shape());
    });
}

#[test]
fn a_panic_inside_scopes_returns_every_buffer() {
    let pool = Pool::with_max_memory_mb(64);
    let kept = pool.scope(|s| s.ones::<f32>(&[256]).detach());
    let message = panic_message(|| {
        pool.scope(|s| {
            let _a = s.ones::<f32>(&[1000]);
            s.scope(|inner| {
                let _b = inner.zeros::<f64>(&[10, 10]);
                let c = inner.ones::<f32>(&[3, 4]);
                let _ = c.matmul(&inner.ones::<f32>(&[5, 6])); // shape error: panics
            });
        })
    });
    assert_eq!(
        message,
        "matmul: incompatible shapes [3, 4] and [5, 6]: inner dimensions differ (4 and 5)"
    );
    let stats = pool.stats();
    assert_eq!(stats.bytes_in_use, kept.allocated_bytes());
    assert_eq!(
        stats.returns,
        stats.hits + stats.misses - 1,
        "all but `kept` came back"
    );
    // The pool keeps working.
    let sum = pool.scope(|s| s.ones::<f32>(&[1000]).sum(0).to_vec()[0]);
    assert_eq!(sum, 1000.0);
}

#[test]
fn budget_errors_name_the_figures_and_the_pool_recovers() {
    let pool = Pool::new(PoolConfig::with_max_bytes(1 << 20));
    pool.scope(|s| {
        let big = s.zeros::<f32>(&[192 * 1024]); // 768 KiB
        let err = s.try_rent::<f32>(&[128 * 1024]).unwrap_err();
        assert_eq!(
            err,
            Error::BudgetExceeded {
                requested: 512 * 1024,
                class_bytes: 512 * 1024,
                in_use: 768 * 1024,
                cached: 0,
                limit: 1 << 20,
            }
        );
        let message = panic_message(|| drop(s.zeros::<f32>(&[128 * 1024])));
        assert_eq!(message, err.to_string());
        drop(big);
        assert_eq!(s.ones::<f32>(&[128 * 1024]).len(), 128 * 1024);
    });
    assert_eq!(pool.stats().failed_rents, 2);
}

#[test]
fn default_scope_uses_the_global_pool() {
    // Other tests of this binary rent from the global pool at the same time, so its counts only
    // grow; the scope's own pool is the exact check.
    let before = Pool::global().stats();
    let total = tensorscope::scope(|s| {
        assert!(s.pool().ptr_eq(Pool::global()));
        s.ones::<f32>(&[10]).sum(0).to_vec()[0]
    });
    assert_eq!(total, 10.0);
    let after = Pool::global().stats();
    assert!(after.hits + after.misses > before.hits + before.misses);
    assert_eq!(Pool::global().max_bytes(), 4096 << 20);
}

#[test]
fn zero_sized_tensors_work_without_touching_the_pool() {
    let pool = Pool::with_max_memory_mb(1);
    pool.scope(|s| {
        let e = s.zeros::<f32>(&[0, 5]);
        assert!(e.is_empty());
        let f = &e + &s.ones::<f32>(&[5]);
        assert_eq!(f.shape(), &[0, 5]);
        assert_eq!(e.sum(0).to_vec(), vec![0.0; 5]);
    });
    let stats = pool.stats();
    assert_eq!(
        stats.hits + stats.misses,
        2,
        "only the [5] ones and the [5] sum were pooled"
    );
}

#[test]
fn pool_is_shared_across_threads() {
    fn assert_send_sync<T: Send + Sync + Clone>() {}
    assert_send_sync::<Pool>();
    let pool = Pool::with_max_memory_mb(64);
    let sums: Vec<f32> = std::thread::scope(|t| {
        let handles: Vec<_> = (0..2)
            .map(|i| {
                let pool = pool.clone();
                t.spawn(move || pool.scope(|s| s.full::<f32>(&[100], i as f32).sum(0).to_vec()[0]))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(sums, vec![0.0, 100.0]);
    assert_eq!(pool.stats().bytes_in_use, 0);
    assert!(Pool::global().ptr_eq(&Pool::global().clone()));
    assert!(!pool.ptr_eq(Pool::global()));
}

#[test]
fn everything_computed_from_parameters_belongs_to_a_scope() {
    let pool = Pool::with_max_memory_mb(64);
    let w = Param::from_array(&pool, &ndarray::Array2::<f32>::eye(8));
    let ((), stats) = pool.scope_with_stats(|s| {
        let x = s.ones::<f32>(&[2, 8]);
        let y = x.matmul(&w); // the parameter beside a scoped tensor: rents in its scope
        let bound = s.bind(&w); // no rent: the parameter's own buffer
        let view = bound.t(); // a view of the parameter's buffer: no rent either
        assert_eq!(
            s.stats().rented,
            2,
            "x and y; the binding and its view rent nothing"
        );
        let t = view.contiguous();
        assert_eq!(s.stats().rented, 3, "x, y and t, the view's copy");
        assert_eq!(y.to_vec(), vec![1.0; 16]);
        drop((x, y, bound, view, t));
    });
    assert_eq!((stats.rented, stats.released, stats.leaked), (3, 3, 0));
    assert_eq!(pool.stats().bytes_in_use, w.allocated_bytes());
}

#[test]
fn escaping_a_bound_parameter_moves_no_accounting() {
    let pool = Pool::with_max_memory_mb(64);
    let w = Param::from_slice(&pool, &[16], &[1.0f32; 16]);
    let (values, stats) = pool.scope_with_stats(|s| {
        let inner = s.scope(|i| i.escape(i.bind(&w)));
        assert_eq!(s.stats().adopted, 0);
        assert_eq!(inner.as_slice().unwrap().as_ptr(), w.as_slice().as_ptr());
        inner.to_vec()
    });
    assert_eq!((stats.adopted, stats.escaped, stats.leaked), (0, 0, 0));
    assert_eq!(values, vec![1.0; 16]);
}

/// Runs each `name: op;` with the stats of `outer` and `inner` read before and after: every op
/// must rent in `inner` and nothing in `outer`.
macro_rules! assert_rents_in {
    ($outer:expr, $inner:expr, $($name:literal: $op:expr;)*) => {$(
        let (outer_before, inner_before) = ($outer.stats().rented, $inner.stats().rented);
        let result = $op;
        assert!(result.is_ok(), "{}: {:?}", $name, result.err());
        assert_eq!($outer.stats().rented, outer_before, "{}: rented in the outer scope", $name);
        assert!($inner.stats().rented > inner_before, "{}: rented nothing in the inner scope", $name);
    )*};
}

#[test]
fn every_op_of_several_tensors_rents_in_the_deepest_of_their_scopes() {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|outer| {
        let o = outer.ones::<f32>(&[4, 4]);
        let o_image = outer.ones::<f32>(&[1, 2, 5, 5]);
        let o_kernel = outer.ones::<f32>(&[3, 2, 3, 3]);
        let o_ids = outer.from_slice::<i64>(&[4], &[0, 1, 2, 3]);
        let o_mask = outer.ones::<u8>(&[4, 4]);
        let mut o_unique = Some(outer.ones::<f32>(&[4, 4]));
        outer.scope(|inner| {
            let i = inner.ones::<f32>(&[4, 4]);
            let i_image = inner.ones::<f32>(&[1, 2, 5, 5]);
            let i_kernel = inner.ones::<f32>(&[3, 2, 3, 3]);
            let i_ids = inner.from_slice::<i64>(&[4], &[3, 2, 1, 0]);
            let i_mask = inner.ones::<u8>(&[4, 4]);
            // Whichever operand is the inner one, and whatever its element type.
            assert_rents_in!(outer, inner,
                "add": o.try_add(&i); "add, inner first": i.try_add(&o);
                "sub": o.try_sub(&i); "mul": o.try_mul(&i); "div": o.try_div(&i);
                "zip_map": o.try_zip_map(&i, |a, b| a - b);
                "matmul": o.try_matmul(&i); "matmul, inner first": i.try_matmul(&o);
                "conv2d": o_image.try_conv2d(&i_kernel, 1, 0);
                "conv2d, inner first": i_image.try_conv2d(&o_kernel, 1, 0);
                "mse": o.try_mse(&i); "mse, inner first": i.try_mse(&o);
                "concat": Tensor::try_concat(&[&o, &i], 0);
                "stack": Tensor::try_stack(&[&o, &i], 1);
                "cmp": o.try_cmp(&i, Cmp::Lt); "cmp, inner first": i.try_cmp(&o, Cmp::Ge);
                "where_cond, inner mask": i_mask.try_where_cond(&o, &o);
                "where_cond, inner value": o_mask.try_where_cond(&o, &i);
                "masked_fill, inner mask": o.try_masked_fill(&i_mask, 0.0);
                "masked_fill, outer mask": i.try_masked_fill(&o_mask, 0.0);
                "index_select, inner ids": o.try_index_select(0, &i_ids);
                "index_select, outer ids": i.try_index_select(0, &o_ids);
                "embedding, inner ids": o.try_embedding(&i_ids);
                "gather, inner positions": o.try_gather(1, &i_ids.reshape(&[4, 1]));
                "cross_entropy_ids, inner labels": o.try_cross_entropy_ids(&i_ids);
                "cross_entropy_ids, outer labels": i.try_cross_entropy_ids(&o_ids);
                // An outer tensor written in place (owned and unique) hands its result to the
                // inner scope: the next op on it rents there.
                "in place, then an op": (o_unique.take().expect("once") + &i).try_add(&i);
            );
        });
    });
}

#[test]
fn an_inner_budget_bounds_ops_on_outer_tensors() {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|outer| {
        let big = outer.ones::<f32>(&[1 << 18]); // 1 MiB
        let logits = outer.zeros::<f32>(&[4096, 64]); // 1 MiB
        let total = outer.ones::<f32>(&[1 << 18]).requires_grad().sum_all(); // its gradient: 1 MiB
        outer.scope_with_budget(64 << 10, |inner| {
            let mask = inner.ones::<u8>(&[1]);
            let one = inner.ones::<f32>(&[1]);
            let labels = inner.zeros::<i64>(&[4096]); // 32 KiB
            let refused = |name: &str, result: tensorscope::Result<usize>| {
                assert!(
                    matches!(result, Err(Error::ScopeBudgetExceeded { limit: 65536, .. })),
                    "{name}: {result:?}"
                );
            };
            refused(
                "masked_fill",
                big.try_masked_fill(&mask, 0.0).map(|t| t.len()),
            );
            refused("add", big.try_add(&one).map(|t| t.len()));
            refused(
                "cross_entropy_ids",
                logits.try_cross_entropy_ids(&labels).map(|t| t.len()),
            );
            // A backward from an outer tensor with an inner seed: its gradients are the inner
            // scope's, as the result of an op on the two would be.
            let seed = inner.ones::<f32>(&[]);
            refused("backward_with", total.backward_with(&seed).map(|g| g.len()));
        });
    });
}
