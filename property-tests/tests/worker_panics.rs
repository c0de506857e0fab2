//! Kernels of user closures (`map`, `zip_map`, `map_with_derivative`) that panic on random elements
//! of tensors large enough to be split over the worker threads, with random payloads: a string, a
//! value of another type, or a value whose destructor panics too. Checked on every case:
//!
//! - the caller's panic carries a payload of the kind thrown (the first part's that panicked);
//! - it reaches the caller only after every part has finished, so nothing the closure borrowed is
//!   used after the call (a part that outlived it would write into a freed buffer: the poisoned
//!   pool's next rent would show it);
//! - every buffer the scope rented is back in the pool, and the next op on the worker threads
//!   writes every element of its output.
//!
//! With one thread (`TENSORSCOPE_THREADS=1`, or a one-core machine) the same programs run on the
//! caller alone and the same must hold.

use std::panic::{catch_unwind, panic_any, AssertUnwindSafe};

use proptest::prelude::*;
use tensorscope::{Pool, PoolConfig, TensorOps};

/// A panic payload whose destructor panics.
struct Bomb;

impl Drop for Bomb {
    fn drop(&mut self) {
        panic!("a payload that panics when dropped");
    }
}

/// A payload of a type of its own.
#[derive(Debug, PartialEq)]
struct Code(u32);

/// Panics with a payload of `kind` (0: a `&str`, 1: a `Code`, 2: a `Bomb`).
fn throw(kind: u8) -> ! {
    match kind {
        0 => panic!("a kernel fails"),
        1 => panic_any(Code(7)),
        _ => panic_any(Bomb),
    }
}

/// Keeps the panic hook from printing the panics thrown on purpose (hundreds per run); any other
/// panic, a failing case's among them, prints as usual.
fn quiet_panics() {
    static QUIET: std::sync::Once = std::sync::Once::new();
    QUIET.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let ours = payload.is::<Code>()
                || payload.is::<Bomb>()
                || payload.downcast_ref::<&str>().is_some_and(|m| {
                    *m == "a kernel fails" || *m == "a payload that panics when dropped"
                });
            if !ours {
                default(info);
            }
        }));
    });
}

proptest! {
    // 64 cases unless `PROPTEST_CASES` says otherwise: each splits a large tensor over the threads.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|n| n.parse().ok()).unwrap_or(64),
        ..ProptestConfig::default()
    })]

    #[test]
    fn panicking_kernels_unwind_after_every_part_with_every_buffer_back(
        // 2^17 to 2^19 elements: split over two or more threads (2^16 a part at least).
        len in (1usize << 17)..(1 << 19),
        // Elements that panic, as fractions of the length: in one part, or in several.
        at in prop::collection::vec(0.0f64..1.0, 1..4),
        kind in 0u8..3,
        op in 0u8..3,
    ) {
        quiet_panics();
        let pool = Pool::new(PoolConfig::with_max_bytes(64 << 20).poisoned(true));
        let panics: Vec<f32> = at.iter().map(|f| (f * len as f64) as usize as f32).collect();
        let before = pool.stats().bytes_in_use;
        let payload = catch_unwind(AssertUnwindSafe(|| {
            pool.scope(|s| {
                let x = s.arange(0.0f32, len as f32, 1.0);
                let fails = |v: f32| {
                    if panics.contains(&v) {
                        throw(kind)
                    }
                    v + 1.0
                };
                let y = match op {
                    0 => x.map(fails),
                    1 => x.zip_map(&s.ones::<f32>(&[len]), move |v, _| fails(v)),
                    _ => x.map_with_derivative(
                        {
                            let panics = panics.clone();
                            move |v| if panics.contains(&v) { throw(kind) } else { v + 1.0 }
                        },
                        |_| 1.0,
                    ),
                };
                y.len()
            })
        }))
        .expect_err("a kernel's panic reaches the caller");
        match kind {
            0 => prop_assert_eq!(payload.downcast_ref::<&str>(), Some(&"a kernel fails")),
            1 => prop_assert_eq!(payload.downcast_ref::<Code>(), Some(&Code(7))),
            _ => prop_assert!(payload.is::<Bomb>()),
        }
        if kind == 2 {
            // Dropping it would panic: it is the test's to keep.
            std::mem::forget(payload);
        }
        prop_assert_eq!(pool.stats().bytes_in_use, before, "every buffer went back");
        // The workers serve the next op, and write all of its output: `map` on a borrowed tensor
        // writes a fresh rent, whose poison (NaN) shows wherever a part did not write.
        let (total, poisoned) = pool.scope(|s| {
            let x = s.ones::<f32>(&[len]);
            let y = (&x).map(|v| v * 2.0);
            (y.sum_all().item(), y.as_slice().unwrap().iter().filter(|v| v.is_nan()).count())
        });
        prop_assert_eq!((total, poisoned), (2.0 * len as f32, 0));
    }
}
