//! Helpers shared by the integration tests; each test crate uses its own subset.
#![allow(dead_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};

use tensorscope::{DType, Pool, PoolConfig, Tensor, POISON_BYTE};

/// A pool of `mb` MiB that, in debug builds, fills every unzeroed rent with [`POISON_BYTE`] (NaN for
/// floats): an op that leaves part of its output unwritten then shows the sentinel, never another
/// tensor's old values.
pub(crate) fn test_pool(mb: usize) -> Pool {
    Pool::new(PoolConfig::with_max_memory_mb(mb).poisoned(cfg!(debug_assertions)))
}

/// Whether `x` is the poison sentinel, bit for bit (a computed NaN has other bits).
pub(crate) fn is_poison<T: DType>(x: T) -> bool {
    bytemuck::bytes_of(&x).iter().all(|&b| b == POISON_BYTE)
}

/// Asserts that no element of `t` is the poison sentinel: the op wrote its whole output.
#[track_caller]
pub(crate) fn assert_fully_written<T: DType>(what: &str, t: &Tensor<'_, T>) {
    if let Some(i) = t.as_slice().iter().position(|&x| is_poison(x)) {
        panic!("{what}: element {i} of {:?} was never written", t.shape());
    }
}

/// The message `f` panics with.
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
