//! A pool that poisons what it hands out, so an op that leaves part of its output unwritten shows
//! it. Shared with `property-tests/tests/op_fuzz.rs` through `#[path]`.

use tensorscope::{DType, Pool, PoolConfig, POISON_BYTE};

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
