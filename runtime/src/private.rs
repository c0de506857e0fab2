//! Support for the code `tensorscope-macros` generates. Not a public API: it may change in any
//! release. The facade pins the macros crate to its own version, so the two always match.

use std::marker::PhantomData;
use std::rc::Rc;

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
