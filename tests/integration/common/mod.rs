//! Helpers that more than one module of the suite uses, one copy each: a poisoned pool and the check
//! that an output was fully written, the rule by which a value matches its reference, the largest
//! difference of two runs of values, the message a panic carries, and a scope's balance.

mod close;
mod poison;

use std::panic::{catch_unwind, AssertUnwindSafe};

use tensorscope::{DType, ScopeStats, Tensor};

pub(crate) use close::close;
use poison::is_poison;
pub(crate) use poison::test_pool;

/// Asserts that no element of `t` is the poison sentinel of a [`test_pool`]: the op wrote its whole
/// output.
#[track_caller]
pub(crate) fn assert_fully_written<T: DType>(what: &str, t: &Tensor<'_, T>) {
    if let Some(i) = t.view().iter().position(|&x| is_poison(x)) {
        panic!("{what}: element {i} of {:?} was never written", t.shape());
    }
}

/// The largest absolute difference between `got` and `want`, which must be as long.
#[track_caller]
pub(crate) fn max_abs_diff(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

/// The message `f` panics with; fails if it does not panic.
#[track_caller]
pub(crate) fn panic_message(f: impl FnOnce()) -> String {
    let payload = catch_unwind(AssertUnwindSafe(f)).expect_err("expected a panic");
    if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else {
        panic!("panic payload is not a string")
    }
}

/// Asserts that a closed scope gave back everything it rented or adopted, but what it escaped, and
/// holds nothing.
#[track_caller]
pub(crate) fn assert_all_released_or_escaped(stats: ScopeStats) {
    assert_eq!(
        stats.rented + stats.adopted,
        stats.released + stats.escaped,
        "{stats:?}"
    );
    assert_eq!((stats.leaked, stats.bytes_in_use), (0, 0), "{stats:?}");
}
