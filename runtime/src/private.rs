//! Support for the code `tensorscope-macros` generates: re-exports of every runtime name it uses, and
//! thin adapters over the runtime. Not a public API: it may change in any release. The facade pins
//! the macros crate to its own version, so the two always match.

use std::marker::PhantomData;

pub use crate::checkpoint::{
    CheckpointConfig, CheckpointError, Checkpointer, Policy, Precision, Saving,
};
pub use crate::element::{DType, Element};
pub use crate::escape::{Escape, EscapeTarget};
pub use crate::param::BindFirst;
pub use crate::scope::Scope;
pub use crate::tensor::Tensor;

use crate::checkpoint;
use crate::scope::{current_pool, deeper, run_named, ScopeState, State};
use crate::trace::ScopeName;

/// The scope a `#[dispose_scope]` function opens its child in, with `'p` the brand its return value
/// escapes to. Holds no borrow, so the parameter it came from can be moved into the body.
pub struct Parent<'p> {
    state: State,
    _brand: PhantomData<&'p ()>,
}

impl<'p> Parent<'p> {
    /// A `&Scope` parameter: the child is a child of that scope.
    pub fn of_scope(scope: &Scope<'p, '_>) -> Self {
        Parent {
            state: scope.state().clone(),
            _brand: PhantomData,
        }
    }

    /// A tensor parameter: the child is a child of the scope its ops rent in.
    pub fn of_tensor<T: DType>(tensor: &Tensor<'p, T>) -> Self {
        Parent {
            state: tensor.rents_in.clone(),
            _brand: PhantomData,
        }
    }

    /// This parent or the scope `tensor`'s ops rent in, whichever is deeper: with no `&Scope`
    /// parameter, the child opens in the deepest scope of the tensor parameters, as an op's output
    /// rents in the deepest of its operands' scopes. Called for every tensor parameter beside the
    /// first: all of their brands outlive the result's (each is rebound into the child).
    pub fn or_deeper<T: DType>(self, tensor: &Tensor<'p, T>) -> Self {
        Parent {
            state: deeper(&self.state, &tensor.rents_in).clone(),
            _brand: PhantomData,
        }
    }

    /// Runs `f` in the new child scope, named `name` in a trace (the function's path), with a
    /// byte limit if `max_bytes` is given.
    pub fn open<R>(
        self,
        name: &'static str,
        max_bytes: Option<usize>,
        f: impl for<'i> FnOnce(&Scope<'i, 'p>) -> R,
    ) -> R {
        let state = ScopeState::child(&self.state, max_bytes);
        run_named(state, || ScopeName::Named(name), f).0
    }
}

/// A `#[dispose_scope]` function with no scope or tensor parameter: its body runs in a new outermost
/// scope named `name` on the pool of the innermost scope open on this thread
/// ([`crate::Pool::global`] if none), whose parent brand is as local as its own, so only values
/// without a brand can be returned.
pub fn open_root<R>(
    name: &'static str,
    max_bytes: Option<usize>,
    f: impl for<'i, 'p> FnOnce(&Scope<'i, 'p>) -> R,
) -> R {
    let state = ScopeState::outermost(&current_pool(), max_bytes);
    run_named(state, || ScopeName::Named(name), f).0
}

/// Calls `f`: the function body runs in a closure so that `return` and `?` land where the result
/// is escaped.
#[inline(always)]
pub fn call<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// `mb` mebibytes in bytes, saturating.
pub const fn mib(mb: usize) -> usize {
    mb.saturating_mul(1 << 20)
}

/// Runs the layer loop of a `#[checkpoint]` function; see `checkpoint::run_layers`. The input of
/// each segment's first layer is saved into `ckpt`, else into the checkpointer installed on this
/// thread ([`Checkpointer::install`]); with neither, nothing is stored (inference).
pub fn checkpoint_layers<'s, T: Element, L>(
    config: Option<CheckpointConfig>,
    ckpt: Option<&mut Checkpointer<T>>,
    input: Tensor<'s, T>,
    layers: impl IntoIterator<Item = L>,
    reads: &'static [&'static [usize]],
    step: impl for<'b> FnMut(&Scope<'b, 's>, Tensor<'b, T>, &[Tensor<'b, T>], L) -> Tensor<'b, T>,
) -> Result<Tensor<'s, T>, CheckpointError> {
    match ckpt {
        Some(ckpt) => checkpoint::run_layers(config, Some(ckpt), input, layers, reads, step),
        None => checkpoint::with_active(|active| {
            checkpoint::run_layers(config, active, input, layers, reads, step)
        }),
    }
}

/// Unwraps the result of a `#[checkpoint]` loop in a function that does not return `Result`.
#[track_caller]
pub fn checkpoint_or_panic<T>(result: Result<T, CheckpointError>) -> T {
    match result {
        Ok(v) => v,
        Err(e) => panic!("#[checkpoint]: {e}"),
    }
}

/// Kernel visits counted on this thread so far (lanes, slices, matrices, images; debug builds only,
/// 0 in release): the tests check that an op's visits never exceed the elements it reads and writes.
pub fn kernel_visits() -> u64 {
    crate::ops::work::visits()
}

/// Allows at most `more` kernel visits from now on this thread (`None`: no limit); past it the
/// count panics. Debug builds only: a test's guard against an op looping over empty lanes forever.
pub fn limit_kernel_visits(more: Option<u64>) {
    crate::ops::work::limit(more);
}

/// Whether this thread is one of the library's worker threads: a test's counting allocator counts
/// their allocations beside its own thread's, and not those of threads running other tests.
pub fn is_worker_thread() -> bool {
    crate::threads::is_worker()
}
