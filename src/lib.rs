#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

pub use tensorscope_macros::{checkpoint, dispose_scope, Escape, Parameters};
// The glob makes every runtime item reachable from here (`__private` too, which generated code
// calls). It is hidden from the docs because rustdoc inlines whatever a glob from another crate
// brings, `doc(no_inline)` or not (rust-lang/rust#131180), which copied all of ndarray's and
// half's pages into these docs. The named re-exports below are what the docs show: the same
// items, with ndarray and half as links to their own docs. A new runtime item is named here too.
#[doc(hidden)]
pub use tensorscope_runtime::*;
pub use tensorscope_runtime::{
    autograd, checkpoint, current_pool, manual_seed, nn, ops, scope, set_threads, threads,
    CheckpointConfig, CheckpointError, Checkpointer, DType, Element, Error, Escape, EscapeTarget,
    Generator, Gradients, Operand, Param, ParamPath, Parameters, Policy, Pool, PoolBuffer,
    PoolConfig, PoolStats, Precision, Result, Scope, ScopeName, ScopeStats, Segment, Shape, Tensor,
    TensorOps, TimelinePoint, Trace, TraceEvent, TraceEventKind, ALIGN, DEFAULT_MAX_MEMORY_MB,
    POISON_BYTE,
};
#[doc(no_inline)]
pub use tensorscope_runtime::{bf16, f16, ndarray};

/// The names a forward function usually needs: `use tensorscope::prelude::*;`.
pub mod prelude {
    // Links to the items' own pages, as std's prelude does, rather than second copies of them.
    // `checkpoint` is named from the macro crate: `crate::checkpoint` is also the module.
    #[doc(no_inline)]
    pub use crate::nn::{Module, Weights};
    #[doc(no_inline)]
    pub use crate::{
        dispose_scope, scope, Escape, Param, ParamPath, Parameters, Pool, Scope, Tensor, TensorOps,
    };
    #[doc(no_inline)]
    pub use tensorscope_macros::checkpoint;
}
