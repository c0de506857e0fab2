//! Runtime of [tensorscope](https://docs.rs/tensorscope): pooled buffers, scopes, scope-branded
//! tensors and their ops. Use it through the `tensorscope` crate, which re-exports all of this.
//!
//! - [`Pool`]: rents aligned buffers, takes them back, reuses them, and keeps one memory budget.
//! - [`Scope`]: a region of work handed to a closure; its tensors carry its lifetime brand, so
//!   keeping one past the scope is a compile error unless it is [escaped](Scope::escape).
//! - [`Tensor`]: an n-d array on a pooled buffer; dropping its last handle returns the buffer at once.
//! - [`Param`]: a value kept outside every scope (weights), `Send + Sync`, with no ops of its own.
//! - [`Trace`]: a pool's memory over time (rents, returns, evictions, bytes in use), per scope,
//!   checkpoint segment and op, as Chrome trace JSON for Perfetto ([`Pool::start_trace`]).
//! - [`ops`]: arithmetic with broadcasting, matmul, activations, softmax, layer norm, reductions.
//! - Threads: an op on a large tensor splits its work over one thread per core, its caller's
//!   included. `TENSORSCOPE_THREADS=n` in the environment, or [`set_threads`] in code, sets how
//!   many (`1` runs every op on the thread that calls it); [`threads`] says how many now. Results
//!   are the same bits on any number.
//!
//! ```
//! use tensorscope::{Param, Pool, TensorOps};
//!
//! let pool = Pool::with_max_memory_mb(64);
//! let w = Param::from_array(&pool, &ndarray::Array2::<f32>::eye(4));
//! let forward = || {
//!     pool.scope(|s| {
//!         let x = s.ones::<f32>(&[2, 4]);
//!         let y = x.matmul(&w).relu(); // `relu` runs in the matmul's output buffer
//!         assert_eq!(y.sum(1).to_vec(), vec![4.0, 4.0]);
//!     })
//! };
//! forward();
//! let after_first = pool.stats();
//! for _ in 0..10 {
//!     forward();
//! }
//! // Every pass after the first is served from the pool: no new allocation.
//! assert_eq!(pool.stats().misses, after_first.misses);
//! assert_eq!(pool.stats().hits, after_first.hits + 10 * 3);
//! ```

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;
pub mod autograd;
pub mod checkpoint;
mod dims;
mod display;
mod element;
mod error;
mod escape;
mod init;
pub mod nn;
pub mod ops;
mod param;
mod pool;
mod recycle;
mod scope;
mod storage;
mod tensor;
mod threads;
mod trace;

pub use autograd::Gradients;
pub use checkpoint::{CheckpointConfig, CheckpointError, Checkpointer, Policy, Precision};
pub use element::{DType, Element};
pub use error::{Error, Result, Shape};
pub use escape::{Escape, EscapeTarget};
pub use init::{manual_seed, Generator};
pub use ops::{Operand, TensorOps};
pub use param::{Param, ParamPath, Parameters};
pub use pool::{
    Pool, PoolBuffer, PoolConfig, PoolStats, ALIGN, DEFAULT_MAX_MEMORY_MB, POISON_BYTE,
};
pub use scope::{current_pool, scope, Scope, ScopeStats};
pub use tensor::Tensor;
pub use threads::{set_threads, threads};
pub use trace::{ScopeName, Segment, TimelinePoint, Trace, TraceEvent, TraceEventKind};

#[doc(no_inline)]
pub use half::{bf16, f16};
#[doc(no_inline)]
pub use ndarray;
