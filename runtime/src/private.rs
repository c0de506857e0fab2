//! Support for the code `tensorscope-macros` generates. Not a public API: it may change in any
//! release. The facade pins the macros crate to its own version, so the two always match.

use std::marker::PhantomData;
use std::rc::Rc;

use crate::checkpoint::{self, CheckpointConfig, CheckpointError, Checkpointer};
use crate::element::Element;
use crate::scope::{current_pool, run, Scope, ScopeState};
use crate::tensor::Tensor;

/// The scope a `#[dispose_scope]` function opens its child in, with `'p` the brand its return value
/// escapes to. Holds no borrow, so the parameter it came from can be moved into the body.
pub struct Parent<'p> {
    /// `None`: a new outermost scope on the current pool.
    state: Option<Rc<ScopeState>>,
    _brand: PhantomData<&'p ()>,
}

impl<'p> Parent<'p> {
    /// A `&Scope` parameter: the child is a child of that scope.
    pub fn of_scope(scope: &'p Scope<'_>) -> Self {
        Parent {
            state: Some(Rc::clone(scope.state())),
            _brand: PhantomData,
        }
    }

    /// A tensor parameter: the child is a child of the scope its ops rent in.
    pub fn of_tensor<T: Element>(tensor: &Tensor<'p, T>) -> Self {
        Parent {
            state: Some(Rc::clone(&tensor.scope)),
            _brand: PhantomData,
        }
    }

    /// Runs `f` in the new child scope, with a byte limit if `max_bytes` is given.
    pub fn open<R>(
        self,
        max_bytes: Option<usize>,
        f: impl for<'i> FnOnce(&'i Scope<'p>) -> R,
    ) -> R {
        let state = match self.state {
            Some(parent) => ScopeState::child(&parent, max_bytes),
            None => ScopeState::root(&current_pool(), max_bytes),
        };
        run(state, f).0
    }
}

impl Parent<'static> {
    /// No scope or tensor parameter: an outermost scope on the pool of the innermost scope open on
    /// this thread ([`crate::Pool::global`] if none); the return value is detached.
    pub fn current() -> Self {
        Parent {
            state: None,
            _brand: PhantomData,
        }
    }
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

/// Runs the layer loop of a `#[checkpoint]` function: `step(segment_scope, activation, layer)` for
/// each of `layers` in order, the layers grouped into segments by the policy's plan and each segment
/// run in its own child scope of the activation's (so its temporaries are that scope's to release).
/// The input of each segment's first layer is saved into `ckpt`, else into the checkpointer installed
/// on this thread ([`Checkpointer::install`]); with neither, nothing is stored (inference).
pub fn checkpoint_layers<'s, T: Element, L>(
    config: CheckpointConfig,
    ckpt: Option<&mut Checkpointer<T>>,
    input: Tensor<'s, T>,
    layers: Vec<L>,
    step: impl for<'b> FnMut(&'b Scope<'s>, Tensor<'b, T>, L) -> Tensor<'b, T>,
) -> Result<Tensor<'s, T>, CheckpointError> {
    match ckpt {
        Some(ckpt) => run_layers(config, Some(ckpt), input, layers, step),
        None => checkpoint::with_active(|active| run_layers(config, active, input, layers, step)),
    }
}

fn run_layers<'s, T: Element, L>(
    mut config: CheckpointConfig,
    mut ckpt: Option<&mut Checkpointer<T>>,
    input: Tensor<'s, T>,
    layers: Vec<L>,
    mut step: impl for<'b> FnMut(&'b Scope<'s>, Tensor<'b, T>, L) -> Tensor<'b, T>,
) -> Result<Tensor<'s, T>, CheckpointError> {
    let n = layers.len();
    let ids: Vec<usize> = (0..n).collect();
    let plan = match ckpt.as_deref_mut() {
        Some(ckpt) => {
            ckpt.set_config(config);
            ckpt.begin(&ids, &input)?;
            ckpt.planned().to_vec()
        }
        None => {
            // Nothing is stored, so there is no limit to respect: the plan only groups segments.
            config.max_checkpoints = None;
            Checkpointer::<T>::new(config).plan(n, input.len())?.0
        }
    };
    let mut x = input;
    let mut layers = layers.into_iter().enumerate();
    for (j, &start) in plan.iter().enumerate() {
        let end = plan.get(j + 1).copied().unwrap_or(n);
        let parent = Parent::of_tensor(&x);
        x = parent.open(None, |segment| {
            let mut a = segment.rebind_owned(x);
            for (pos, layer) in layers.by_ref().take(end - start) {
                if let Some(ckpt) = ckpt.as_deref_mut() {
                    ckpt.record(pos, &a)?;
                }
                a = step(segment, a, layer);
            }
            Ok::<_, CheckpointError>(segment.escape(a))
        })?;
    }
    Ok(x)
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
