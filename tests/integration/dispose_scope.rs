//! `#[dispose_scope]` behaviour: release and escape accounting, every return path, methods,
//! generics, nesting, budgets, panics and the steady state of a loop.

use tensorscope::prelude::*;
use tensorscope::{Element, Error};

use crate::common::{assert_all_released_or_escaped, panic_message};

struct Block {
    w1: Param,
    w2: Param,
}

impl Block {
    fn new(pool: &Pool, width: usize, hidden: usize) -> Self {
        pool.scope(|s| Block {
            w1: (s.randn::<f32>(&[width, hidden], 1) * 0.1).detach(),
            w2: (s.randn::<f32>(&[hidden, width], 2) * 0.1).detach(),
        })
    }

    #[dispose_scope]
    fn forward<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        let h = x.matmul(&self.w1).gelu();
        &h.matmul(&self.w2) + x
    }

    /// The same computation written by hand against the runtime API.
    fn forward_by_hand<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        x.child_scope(|inner| {
            let x = inner.rebind(x);
            let h = x.matmul(&self.w1).gelu();
            inner.escape(&h.matmul(&self.w2) + &x)
        })
    }
}

#[test]
fn child_scope_releases_everything_but_the_escaped_result() {
    let pool = Pool::with_max_memory_mb(64);
    let block = Block::new(&pool, 16, 64);
    pool.scope(|s| {
        let x = s.randn::<f32>(&[8, 16], 3);
        let before = pool.stats().bytes_in_use;
        let y = block.forward(&x);
        let child = s.last_child_stats().expect("forward opened a child scope");
        assert_eq!(
            (child.rented, child.escaped),
            (3, 1),
            "matmul, matmul, add; gelu is in place"
        );
        assert_all_released_or_escaped(child);
        assert_eq!(pool.stats().bytes_in_use, before + y.allocated_bytes());
        assert_eq!(y.to_vec(), block.forward_by_hand(&x).to_vec());
        assert_eq!(
            s.stats().adopted,
            2,
            "both results are owned by the caller's scope"
        );
    });
    assert_eq!(pool.stats().bytes_in_use, 2 * 16 * 64 * 4);
}

#[test]
fn a_thousand_calls_stay_flat_with_no_miss_after_the_first() {
    let pool = Pool::with_max_memory_mb(64);
    let block = Block::new(&pool, 32, 128);
    pool.scope(|s| {
        let x = s.randn::<f32>(&[16, 32], 4);
        let first = block.forward(&x);
        drop(first);
        let after_first = pool.stats();
        for _ in 0..1000 {
            let y = block.forward(&x);
            assert_eq!(
                pool.stats().bytes_in_use,
                after_first.bytes_in_use + y.allocated_bytes()
            );
        }
        let end = pool.stats();
        assert_eq!(end.misses, after_first.misses);
        assert_eq!(end.bytes_in_use, after_first.bytes_in_use);
        assert_eq!(end.peak_bytes_in_use, after_first.peak_bytes_in_use);
    });
}

#[derive(Debug, PartialEq)]
enum ForwardError {
    Empty,
    Shape(Error),
}

impl From<Error> for ForwardError {
    fn from(e: Error) -> Self {
        ForwardError::Shape(e)
    }
}

#[dispose_scope]
fn checked<'a>(x: &Tensor<'a>, w: &Tensor<'a>) -> Result<Tensor<'a>, ForwardError> {
    if x.is_empty() {
        return Err(ForwardError::Empty);
    }
    let h = x.try_matmul(w)?;
    if h.as_slice().unwrap()[0] > 100.0 {
        return Ok(h * 0.5);
    }
    Ok(h.relu())
}

#[test]
fn every_return_path_is_escaped() {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|s| {
        let w = s.ones::<f32>(&[2, 2]);
        let ok = checked(&s.full::<f32>(&[1, 2], 1.0), &w).unwrap();
        assert_eq!(ok.to_vec(), vec![2.0, 2.0]);
        assert_all_released_or_escaped(s.last_child_stats().unwrap());
        let early = checked(&s.full::<f32>(&[1, 2], 100.0), &w).unwrap();
        assert_eq!(early.to_vec(), vec![100.0, 100.0]);
        assert_eq!(
            checked(&s.zeros::<f32>(&[0, 2]), &w).unwrap_err(),
            ForwardError::Empty
        );
        let err = checked(&s.ones::<f32>(&[1, 3]), &w).unwrap_err();
        assert!(matches!(
            err,
            ForwardError::Shape(Error::ShapeMismatch { op: "matmul", .. })
        ));
        assert_all_released_or_escaped(s.last_child_stats().unwrap());
        drop((ok, early));
    });
    assert_eq!(pool.stats().bytes_in_use, 0);
}

#[dispose_scope]
fn first_above<'a>(xs: &[Tensor<'a>], x: &Tensor<'a>, limit: f32) -> Option<Tensor<'a>> {
    for t in xs {
        let scaled = t * x;
        if scaled.as_slice().unwrap().iter().all(|&v| v > limit) {
            return Some(scaled); // early return from inside a loop
        }
    }
    None
}

#[test]
fn early_return_from_a_loop_is_escaped() {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|s| {
        let xs: Vec<Tensor<'_>> = (1..=4).map(|i| s.full::<f32>(&[3], i as f32)).collect();
        let x = s.full::<f32>(&[3], 2.0);
        let found = first_above(&xs, &x, 5.0).unwrap();
        assert_eq!(found.to_vec(), vec![6.0; 3]);
        let child = s.last_child_stats().unwrap();
        assert_eq!((child.rented, child.released, child.escaped), (3, 2, 1));
        assert!(first_above(&xs, &x, 100.0).is_none());
        assert_all_released_or_escaped(s.last_child_stats().unwrap());
    });
}

#[derive(Escape)]
struct Heads<'s, T: Element = f32> {
    logits: Tensor<'s, T>,
    extra: (Tensor<'s, T>, [Tensor<'s, T>; 2]),
    all: Vec<Tensor<'s, T>>,
    label: String,
}

#[dispose_scope]
fn heads<'a, T: Element>(x: Tensor<'a, T>) -> Heads<'a, T> {
    let y = (&x).exp();
    let z = x.relu(); // by value: x was rebound without a copy, so this runs in place
    Heads {
        logits: &y + &z,
        extra: (y.clone(), [z.clone(), &z * T::from_f64(2.0)]),
        all: vec![y, z],
        label: "heads".to_string(),
    }
}

#[test]
fn tuples_arrays_vecs_generics_and_derived_structs_are_escaped() {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|s| {
        let x = s.from_slice::<f64>(&[2], &[-1.0, 1.0]);
        let ptr = x.as_slice().unwrap().as_ptr();
        let h = heads(x);
        assert_eq!(
            h.all[1].as_slice().unwrap().as_ptr(),
            ptr,
            "relu ran in the argument's buffer"
        );
        assert_eq!(h.logits.to_vec(), vec![(-1f64).exp(), 1f64.exp() + 1.0]);
        assert_eq!(h.extra.1[1].to_vec(), vec![0.0, 2.0]);
        assert_eq!(h.label, "heads");
        assert_all_released_or_escaped(s.last_child_stats().unwrap());
    });
}

struct Counter {
    calls: usize,
}

impl Counter {
    #[dispose_scope]
    fn step<'a>(&mut self, s: &Scope<'a, '_>, n: usize) -> (Tensor<'a>, usize) {
        self.calls += 1;
        let t = s.full::<f32>(&[n], self.calls as f32); // `s` is the function's own scope here
        let _scratch = s.zeros::<f32>(&[1024]);
        (t, self.calls)
    }
}

#[test]
fn methods_with_a_scope_parameter_rent_in_the_child() {
    let pool = Pool::with_max_memory_mb(64);
    let mut counter = Counter { calls: 0 };
    pool.scope(|s| {
        let (t, calls) = counter.step(s, 3);
        assert_eq!((t.to_vec(), calls), (vec![1.0; 3], 1));
        let child = s.last_child_stats().unwrap();
        assert_eq!((child.rented, child.released, child.escaped), (2, 1, 1));
        assert_eq!(
            s.stats().rented,
            0,
            "nothing was rented in the caller's scope itself"
        );
        assert_eq!(counter.step(s, 1).1, 2);
    });
}

#[dispose_scope]
fn inner_layer<'a>(x: &Tensor<'a>) -> Tensor<'a> {
    (x * 3.0).relu()
}

#[dispose_scope]
fn outer_layer<'a>(x: &Tensor<'a>) -> (Tensor<'a>, usize) {
    let a = inner_layer(x);
    let b = inner_layer(&a);
    // `x` was rebound into this function's scope, so a scope opened from it is one level deeper.
    let child_depth = x.child_scope(|probe| probe.depth());
    (&a + &b, child_depth)
}

#[test]
fn nested_annotated_calls_nest_scopes() {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|s| {
        let x = s.from_slice::<f32>(&[2], &[1.0, -1.0]);
        let (y, child_depth) = outer_layer(&x);
        assert_eq!(y.to_vec(), vec![12.0, 0.0]);
        assert_eq!(child_depth, 3, "caller 1, outer_layer 2, its children 3");
        let outer = s.last_child_stats().unwrap();
        // `a` and `b` adopted from the two inner calls; the sum rented and escaped.
        assert_eq!((outer.adopted, outer.rented, outer.escaped), (2, 1, 1));
        assert_all_released_or_escaped(outer);
    });
}

#[dispose_scope(max_memory_mb = 1)]
fn bounded<'a>(s: &Scope<'a, '_>, x: &Tensor<'a>, floats: usize) -> Result<Tensor<'a>, Error> {
    let big = s.try_zeros::<f32>(&[floats])?; // `s` is the function's own, budgeted scope
    s.scope(|child| child.try_zeros::<f32>(&[floats]).map(|t| t.len()))?; // so are its children
    Ok(&big.sum(0) + x)
}

#[test]
fn max_memory_mb_bounds_the_function_scope_and_its_children() {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|s| {
        let x = s.ones::<f32>(&[1]);
        let fits = bounded(s, &x, 128 * 1024).unwrap(); // 2 x 512 KiB at once: exactly 1 MiB
        assert_eq!(fits.to_vec(), vec![1.0]);
        let err = bounded(s, &x, 160 * 1024).unwrap_err(); // 2 x 640 KiB: the child's rent fails
        assert_eq!(
            err,
            Error::ScopeBudgetExceeded {
                requested: 640 << 10,
                in_use: 640 << 10,
                limit: 1 << 20
            }
        );
        let err = bounded(s, &x, 512 * 1024).unwrap_err(); // 2 MiB: the first rent fails
        assert_eq!(
            err.to_string(),
            "scope budget exceeded: requested 2097152 bytes (size class) while the scope and its \
             children hold 0, scope limit 1048576 bytes"
        );
        assert_eq!(
            pool.stats().failed_rents,
            0,
            "the pool itself was never short"
        );
    });
    assert_eq!(pool.stats().bytes_in_use, 0);
}

#[dispose_scope]
fn no_params() -> Param {
    // The body runs in an outermost scope on the current pool; only brand-free values leave it.
    tensorscope::current_pool().scope(|s| (s.ones::<f32>(&[4]) * 2.0).detach())
}

#[test]
fn a_function_without_scope_or_tensor_uses_the_current_pool_and_returns_brand_free_values() {
    let pool = Pool::with_max_memory_mb(64);
    let kept = pool.scope(|_| {
        assert!(tensorscope::current_pool().ptr_eq(&pool));
        no_params()
    });
    assert_eq!(kept.to_vec(), vec![2.0; 4]);
    assert!(kept.pool().ptr_eq(&pool));
    assert!(tensorscope::current_pool().ptr_eq(Pool::global()));
}

#[dispose_scope]
fn panics_midway<'a>(x: &Tensor<'a>, fail: bool) -> Tensor<'a> {
    let h = x * 2.0;
    let _big = h.child_scope(|c| c.escape(c.zeros::<f32>(&[4096])));
    assert!(!fail, "failure in the middle of a forward");
    h + 1.0
}

#[test]
fn a_panic_inside_an_annotated_forward_leaves_the_pool_consistent() {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|s| {
        let x = s.ones::<f32>(&[8]);
        let before = pool.stats().bytes_in_use;
        assert_eq!(
            panic_message(|| drop(panics_midway(&x, true))),
            "failure in the middle of a forward"
        );
        assert_eq!(pool.stats().bytes_in_use, before);
        let y = panics_midway(&x, false);
        assert_eq!(y.to_vec(), vec![3.0; 8]);
        assert_all_released_or_escaped(s.last_child_stats().unwrap());
    });
    let stats = pool.stats();
    assert_eq!(
        (stats.bytes_in_use, stats.returns),
        (0, stats.hits + stats.misses)
    );
}

mod reexported {
    pub(crate) use tensorscope as ts;
}

#[dispose_scope(crate = "reexported::ts")]
fn through_a_reexport<'a>(x: &Tensor<'a>) -> Tensor<'a> {
    x + 1.0
}

#[test]
fn the_crate_option_names_a_reexported_path() {
    tensorscope::scope(|s| {
        assert_eq!(
            through_a_reexport(&s.zeros::<f32>(&[2])).to_vec(),
            vec![1.0; 2]
        );
    });
}

#[dispose_scope]
fn linear<'a>(w: &Param, x: &Tensor<'a>) -> Tensor<'a> {
    x.matmul(w) // the weights come first; the result's brand picks `x` as the parent
}

#[dispose_scope]
fn pick_and_halve<'a>(mut x: &Tensor<'a>, other: &Tensor<'a>, mut y: Tensor<'a>) -> Tensor<'a> {
    if y.as_slice().unwrap()[0] > 1.0 {
        x = other; // a `mut` reference parameter, reassigned
    }
    y = y * 0.5; // a `mut` owned parameter, updated in place
    &y + x
}

#[test]
fn the_parent_is_the_parameter_that_carries_the_return_brand() {
    let pool = Pool::with_max_memory_mb(64);
    let w = pool.scope(|s| s.ones::<f32>(&[2, 2]).detach());
    pool.scope(|s| {
        let x = s.ones::<f32>(&[1, 2]);
        let y = linear(&w, &x);
        assert_eq!(y.to_vec(), vec![2.0, 2.0]);
        let child = s
            .last_child_stats()
            .expect("opened under `x`'s scope, not the weights'");
        assert_eq!((child.rented, child.escaped, child.leaked), (1, 1, 0));
        assert_eq!(s.stats().adopted, 1);

        let other = s.full::<f32>(&[1, 2], 10.0);
        let picked = pick_and_halve(&x, &other, s.full::<f32>(&[1, 2], 8.0));
        assert_eq!(picked.to_vec(), vec![14.0, 14.0]);
    });
}

#[derive(Escape, Debug, PartialEq)]
struct Metrics {
    mean: f32,
}

#[dispose_scope]
fn summary<'a>(x: &Tensor<'a>) -> f32 {
    (x * 2.0).mean(0).to_vec()[0] // no lifetime in the return type: nothing to escape
}

#[dispose_scope]
fn with_metrics<'a>(x: &Tensor<'a>) -> (Tensor<'a>, Metrics) {
    let y = x.exp();
    let mean = y.mean(0).to_vec()[0];
    (y, Metrics { mean })
}

#[test]
fn plain_return_values_need_no_escape_and_lifetimeless_structs_pass_through() {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|s| {
        let x = s.from_slice::<f32>(&[2], &[1.0, 3.0]);
        assert_eq!(summary(&x), 4.0);
        assert_all_released_or_escaped(s.last_child_stats().unwrap());
        let (y, metrics) = with_metrics(&x);
        assert_eq!(y.len(), 2);
        assert_eq!(
            metrics,
            Metrics {
                mean: (1f32.exp() + 3f32.exp()) / 2.0
            }
        );
    });
}

#[derive(Escape)]
struct Pair<'s> {
    a: Tensor<'s>,
    b: Tensor<'s>,
}

impl<'s> Pair<'s> {
    #[dispose_scope]
    fn swapped(&self, x: &Tensor<'s>) -> Self {
        Pair {
            a: &self.b + x,
            b: &self.a + x,
        }
    }
}

#[test]
fn methods_returning_self_are_escaped() {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|s| {
        let pair = Pair {
            a: s.zeros::<f32>(&[1]),
            b: s.ones::<f32>(&[1]),
        };
        let swapped = pair.swapped(&s.full::<f32>(&[1], 10.0));
        assert_eq!(
            (swapped.a.to_vec(), swapped.b.to_vec()),
            (vec![11.0], vec![10.0])
        );
        assert_all_released_or_escaped(s.last_child_stats().unwrap());
    });
}

#[dispose_scope(max_memory_mb = 1)]
fn add_bias_first<'a>(bias: &Param, x: &Tensor<'a>) -> Result<Tensor<'a>, Error> {
    x.try_add(bias)
}

#[dispose_scope(max_memory_mb = 1)]
fn add_bias_last<'a>(x: &Tensor<'a>, bias: &Param) -> Result<Tensor<'a>, Error> {
    x.try_add(bias)
}

#[test]
fn a_budget_holds_whatever_the_order_of_weights_and_tensors() {
    // 8 MiB of output under a 1 MiB budget: refused either way (a weight first used to make the
    // result the weight's, outside the budget).
    let pool = Pool::with_max_memory_mb(64);
    let bias = Param::zeros(&pool, &[1024]);
    pool.scope(|s| {
        let x = s.ones::<f32>(&[2048, 1024]);
        for result in [add_bias_first(&bias, &x), add_bias_last(&x, &bias)] {
            assert!(
                matches!(
                    result,
                    Err(Error::ScopeBudgetExceeded {
                        limit: 1_048_576,
                        ..
                    })
                ),
                "{result:?}"
            );
        }
        let small = s.ones::<f32>(&[2, 1024]);
        assert_eq!(add_bias_first(&bias, &small).unwrap().shape(), &[2, 1024]);
    });
}

/// Two tensors in, their sum out: which argument comes from the caller's innermost scope varies.
#[dispose_scope]
fn sum_of<'a>(a: &Tensor<'a>, b: &Tensor<'a>) -> Tensor<'a> {
    a + b
}

/// A mask through a parameter named as unused (`_m`) but used: it counts in the parent's choice.
#[dispose_scope]
fn masked<'a>(x: &Tensor<'a>, _m: &Tensor<'a, u8>) -> Tensor<'a> {
    x.masked_fill(_m, 0.0)
}

/// As `sum_of`, with the ids of a second element type as the first argument.
#[dispose_scope]
fn picked<'a>(ids: &Tensor<'a, i64>, table: &Tensor<'a>) -> Tensor<'a> {
    table.index_select(0, ids) * 2.0
}

#[test]
fn the_child_opens_in_the_deepest_scope_of_the_tensor_arguments() {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|outer| {
        let big = outer.ones::<f32>(&[1 << 18]); // 1 MiB
        let table = outer.ones::<f32>(&[1 << 16, 4]); // 1 MiB
                                                      // Under a 64 KiB budget, each argument order is refused: the child opens in the inner
                                                      // scope, under its budget, whichever argument is the inner one.
        outer.scope_with_budget(64 << 10, |inner| {
            let one = inner.ones::<f32>(&[1]);
            let ids = inner.from_slice::<i64>(&[1], &[3]);
            let mask = inner.ones::<u8>(&[1]);
            for (name, result) in [
                ("outer first", panic_message(|| drop(sum_of(&big, &one)))),
                ("inner first", panic_message(|| drop(sum_of(&one, &big)))),
                ("inner `_m`", panic_message(|| drop(masked(&big, &mask)))),
            ] {
                assert!(
                    result.starts_with("scope budget exceeded"),
                    "{name}: {result}"
                );
            }
            // A small result fits, and is the inner scope's: its stats and last child show it.
            let before = inner.stats();
            let rows = picked(&ids, &table);
            assert_eq!(rows.to_vec(), [2.0; 4]);
            let child = inner
                .last_child_stats()
                .expect("the call's child is the inner scope's");
            assert_eq!(
                (child.rented, child.escaped),
                (1, 1),
                "the doubling is in place"
            );
            assert_eq!(inner.stats().adopted, before.adopted + 1);
        });
    });
}
