//! Scopes: regions of work whose tensors carry the region's lifetime brand.
//!
//! A scope is only ever handed to a closure, as with [`std::thread::scope`]; see [`Scope`] for the
//! rules and why they hold.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::marker::PhantomData;
use std::panic::Location;
use std::rc::Rc;

use ndarray::{ArrayViewMutD, AsArray, Dimension};

use crate::autograd::{self, Mode};
use crate::element::{DType, Element};
use crate::error::{panicking, Error, Result};
use crate::escape::{Escape, EscapeTarget};
use crate::init::SplitMix64;
use crate::param::Param;
use crate::pool::{check_length, class_bytes, Pool};
use crate::recycle::RecycledRc;
use crate::tensor::Tensor;
use crate::trace::ScopeName;

/// Per-scope counters; see [`Scope::stats`] and [`Scope::scope_with_stats`].
///
/// Counts are of buffers (a tensor and its aliases share one), bytes are allocated bytes. While the
/// scope is open `rented + adopted = released + escaped + live`; when it ends, the buffers still live
/// (only possible through `mem::forget` or a reference cycle) are counted in `leaked`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ScopeStats {
    /// Buffers rented in this scope.
    pub rented: u64,
    /// Buffers whose last handle dropped while this scope owned them.
    pub released: u64,
    /// Buffers this scope handed to its parent (or detached).
    pub escaped: u64,
    /// Buffers handed to this scope by an escaping child.
    pub adopted: u64,
    /// Buffers still owned by this scope when it ended; 0 while it is open.
    pub leaked: u64,
    /// Bytes of the buffers this scope owns now.
    pub bytes_in_use: usize,
    /// The highest `bytes_in_use` of this scope.
    pub peak_bytes_in_use: usize,
}

impl ScopeStats {
    /// Buffers this scope owns now: `rented + adopted - released - escaped`.
    pub fn live(&self) -> u64 {
        (self.rented + self.adopted) - (self.released + self.escaped)
    }
}

/// The shared state behind a [`Scope`]; tensors keep it alive for their accounting.
pub(crate) struct ScopeState {
    pool: Pool,
    parent: Option<State>,
    depth: usize,
    /// When the scope was made, in this thread's order of making scopes. Scopes on a thread nest
    /// dynamically, each being a closure, so of two open scopes the one made first closes last.
    opened: u64,
    /// Whether the scope's closure has returned (or unwound).
    closed: Cell<bool>,
    stats: Cell<ScopeStats>,
    /// The final counters of the child scope that ended last.
    last_child: Cell<Option<ScopeStats>>,
    /// The byte limits this scope's rents count against: its own and its ancestors', outermost first.
    budgets: Vec<Rc<Budget>>,
}

/// A handle on a scope's state: its record is reused by a later scope once nothing holds it (a
/// tensor saved for backward keeps its scope's state until the backward has run).
pub(crate) type State = RecycledRc<ScopeState>;

/// A byte limit shared by a scope and its descendants (see [`Scope::scope_with_budget`]).
pub(crate) struct Budget {
    limit: usize,
    used: Cell<usize>,
}

impl ScopeState {
    /// The state of a fresh outermost scope (depth 1) on `pool`, with a byte limit if `budget` is
    /// given.
    pub(crate) fn outermost(pool: &Pool, budget: Option<usize>) -> State {
        ScopeState::new(pool, None, budget)
    }

    /// The state of a new child of `parent`, with an extra byte limit if `budget` is given.
    pub(crate) fn child(parent: &State, budget: Option<usize>) -> State {
        ScopeState::new(parent.pool(), Some(parent), budget)
    }

    fn new(pool: &Pool, parent: Option<&State>, budget: Option<usize>) -> State {
        let mut budgets = parent.map(|p| p.budgets.clone()).unwrap_or_default();
        budgets.extend(budget.map(|limit| {
            Rc::new(Budget {
                limit,
                used: Cell::new(0),
            })
        }));
        let state = ScopeState {
            pool: pool.clone(),
            parent: parent.cloned(),
            depth: parent.map_or(1, |p| p.depth + 1),
            opened: NEXT_OPENED.replace(NEXT_OPENED.get() + 1),
            closed: Cell::new(false),
            stats: Cell::default(),
            last_child: Cell::new(None),
            budgets,
        };
        State::new(state)
    }

    /// Fails with [`Error::ScopeBudgetExceeded`] if renting `shape` of `T` here would pass a budget.
    pub(crate) fn check_budgets<T: DType>(&self, shape: &[usize]) -> Result<()> {
        if self.budgets.is_empty() {
            return Ok(());
        }
        let requested = class_bytes::<T>(shape)?;
        match self
            .budgets
            .iter()
            .find(|b| b.used.get().saturating_add(requested) > b.limit)
        {
            Some(b) => Err(Error::ScopeBudgetExceeded {
                requested,
                in_use: b.used.get(),
                limit: b.limit,
            }),
            None => Ok(()),
        }
    }

    /// Moves `bytes` from the budgets of `from` to those of `to`, skipping the budgets both share.
    pub(crate) fn transfer_budgets(from: &ScopeState, to: &ScopeState, bytes: usize) {
        let shared =
            |b: &Rc<Budget>, other: &ScopeState| other.budgets.iter().any(|o| Rc::ptr_eq(o, b));
        for b in from.budgets.iter().filter(|b| !shared(b, to)) {
            b.used.set(b.used.get() - bytes);
        }
        for b in to.budgets.iter().filter(|b| !shared(b, from)) {
            b.used.set(b.used.get() + bytes);
        }
    }

    pub(crate) fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Whether a buffer this scope owns should be counted in `target` when one of its handles is
    /// escaped there: when `target` lives longer. A closed owner lives no longer; of two open scopes
    /// the one made first closes last. That covers escapes up the tree (an ancestor was made first)
    /// and across it: into a sibling opened inside the owner, or into a scope of another tree, the
    /// buffer stays with the owner, which still holds its other handles.
    pub(crate) fn hands_over_to(&self, target: &ScopeState) -> bool {
        self.closed.get() || target.opened < self.opened
    }

    /// Whether `other` is this scope or one of its ancestors.
    pub(crate) fn is_within(&self, other: &ScopeState) -> bool {
        let mut state = self;
        loop {
            if std::ptr::eq(state, other) {
                return true;
            }
            match &state.parent {
                Some(parent) => state = parent,
                None => return false,
            }
        }
    }

    fn update(&self, f: impl FnOnce(&mut ScopeStats)) {
        let mut s = self.stats.get();
        f(&mut s);
        s.peak_bytes_in_use = s.peak_bytes_in_use.max(s.bytes_in_use);
        self.stats.set(s);
    }

    pub(crate) fn on_rent(&self, bytes: usize) {
        self.update(|s| {
            s.rented += 1;
            s.bytes_in_use += bytes;
        });
        for b in &self.budgets {
            b.used.set(b.used.get() + bytes);
        }
    }

    pub(crate) fn on_release(&self, bytes: usize) {
        self.update(|s| {
            s.released += 1;
            s.bytes_in_use -= bytes;
        });
        for b in &self.budgets {
            b.used.set(b.used.get() - bytes);
        }
    }

    pub(crate) fn on_escape(&self, bytes: usize) {
        self.update(|s| {
            s.escaped += 1;
            s.bytes_in_use -= bytes;
        });
    }

    /// A buffer of this scope moved into a [`crate::Param`]: escaped, and off the budgets.
    pub(crate) fn on_detach(&self, bytes: usize) {
        self.on_escape(bytes);
        for b in &self.budgets {
            b.used.set(b.used.get() - bytes);
        }
    }

    pub(crate) fn on_adopt(&self, bytes: usize) {
        self.update(|s| {
            s.adopted += 1;
            s.bytes_in_use += bytes;
        });
    }
}

/// Of two scope states, the one made later, which closes first (scopes on a thread nest): where
/// the result of an op on tensors of both belongs, since its brand is the shorter of the two.
/// (Depth would do within one tree, but not for two trees, one opened inside the other's closure.)
pub(crate) fn deeper<'a>(a: &'a State, b: &'a State) -> &'a State {
    if b.opened > a.opened {
        b
    } else {
        a
    }
}

/// A region of work on a [`Pool`]. It is handed to a closure as `&Scope<'s, 'p>`, where `'s` brands
/// the tensors made in it and `'p` is the parent's brand.
///
/// ```
/// use tensorscope::{Param, Pool};
///
/// let pool = Pool::with_max_memory_mb(64);
/// let kept: Param = pool.scope(|s| {
///     let x = s.ones::<f32>(&[2, 3]);
///     let (y, inner) = s.scope_with_stats(|inner| {
///         let x = inner.rebind(&x); // ops on this alias rent in the inner scope
///         let t = &x * 2.0; // a temporary, released when the closure ends
///         inner.escape(&t + 1.0) // the result, handed to the outer scope on purpose
///     });
///     // Two rents in the inner scope: `t`, released, and the result, escaped. Nothing leaked.
///     assert_eq!((inner.rented, inner.released, inner.escaped, inner.leaked), (2, 1, 1, 0));
///     assert_eq!(s.stats().adopted, 1);
///     y.detach() // kept past every scope: a parameter, with no ops of its own
/// });
/// assert_eq!(kept.to_vec(), vec![3.0; 6]);
/// assert_eq!(pool.stats().bytes_in_use, kept.allocated_bytes());
/// ```
///
/// An op's output rents in the deeper of its operands' scopes: without the
/// [`rebind`](Scope::rebind), `&x * 2.0` would rent in the outer scope, like `x`, and need no
/// escape. A `#[dispose_scope]` function gets the rebinds and the escape written for it.
///
/// # Lifetimes
///
/// The closure receives `&Scope<'s, 'p>` and must accept every `'s` (it is `for<'s>`, as with
/// [`std::thread::scope`]). Inside it `'s` is a lifetime the compiler knows only to end with the
/// closure, so nothing typed `Tensor<'s>` can leave it: not as the return value, not pushed into an
/// outer `Vec` or `HashMap`, not stored in an outer struct, `Cell`, `RefCell`, thread-local or
/// `Box<dyn Any>`, not swapped out with `mem::swap`, not captured by a closure kept outside. What may
/// leave does so on purpose: [`Scope::escape`] re-brands a value for the parent scope `'p`, and
/// [`Tensor::detach`] turns a tensor into a [`Param`], which has no brand and no ops.
///
/// An outermost scope's parent brand `'p` is just as universal (`for<'s, 'p>`): escaping from it gives
/// tensors still confined to the closure. So no tensor outlives every scope, and parameters, which
/// do, compute only beside a scoped tensor (`x.matmul(&w)`) or bound into a scope ([`Scope::bind`]):
/// whatever is computed belongs to a scope that the compiler tracks.
///
/// ```compile_fail
/// use tensorscope::Pool;
/// let pool = Pool::with_max_memory_mb(64);
/// let leaked = pool.scope(|s| s.zeros::<f32>(&[4])); // error: the tensor would outlive its scope
/// ```
///
/// ```compile_fail
/// use tensorscope::{Pool, Tensor};
/// let pool = Pool::with_max_memory_mb(64);
/// pool.scope(|s| {
///     let mut acc: Vec<Tensor<'_>> = Vec::new();
///     for _ in 0..3 {
///         s.scope(|step| acc.push(step.ones::<f32>(&[4]))); // error: `step` tensors die with `step`
///     }
/// });
/// ```
///
/// ```compile_fail
/// use tensorscope::Pool;
/// let pool = Pool::with_max_memory_mb(64);
/// let escaped = pool.scope(|s| s.escape(s.zeros::<f32>(&[4]))); // error: an outermost scope's
/// // parent brand is as local to the closure as its own
/// ```
///
/// ```compile_fail
/// use tensorscope::Pool;
/// let pool = Pool::with_max_memory_mb(64);
/// pool.scope(|outer| {
///     // error: `outer` can escape only its own tensors, not those of `inner`
///     let kept = outer.scope(|inner| outer.escape(inner.zeros::<f32>(&[4])));
/// });
/// ```
///
/// `Scope` is neither `Send` nor `Sync`: a scope and its tensors stay on the thread that opened it.
///
/// # Memory safety
///
/// Memory safety never rests on the brand or on the scope's exit: buffers are reference counted and
/// go back to the pool when their last handle drops, at once, whatever the scope is doing. A scope
/// does nothing at its end but count: a tensor still alive then (only possible through
/// `mem::forget` or a reference cycle) is reported in [`ScopeStats::leaked`] and its buffer is never
/// handed out again. The brand is for discipline and for the per-scope accounting in [`ScopeStats`].
pub struct Scope<'s, 'p> {
    state: State,
    /// `'s` is invariant: a scope's brand can be neither shortened nor lengthened, so
    /// [`Scope::escape`] and [`Scope::rebind`] accept exactly the tensors of this scope and of the
    /// scopes around it. `'p: 's` is implied wherever a `Scope<'s, 'p>` appears.
    _brand: PhantomData<(Invariant<'s>, &'s &'p ())>,
}

/// A marker invariant in `'s`.
pub(crate) type Invariant<'s> = fn(&'s ()) -> &'s ();

thread_local! {
    /// The scopes open on this thread, innermost last; only read by [`current_pool`].
    static OPEN: RefCell<Vec<State>> = const { RefCell::new(Vec::new()) };
    /// The `opened` number of the next scope made on this thread.
    static NEXT_OPENED: Cell<u64> = const { Cell::new(1) };
}

/// Closes this thread's innermost open scope when `run` ends, by return or by unwinding.
struct Opened;

impl Drop for Opened {
    fn drop(&mut self) {
        if let Some(state) = OPEN.with_borrow_mut(Vec::pop) {
            state.closed.set(true);
        }
    }
}

/// Runs `f` in a scope with `state`, then records what it leaked. A trace names the scope by
/// where `run` was called from (see [`run_named`]).
#[track_caller]
pub(crate) fn run<'p, R>(
    state: State,
    f: impl for<'s> FnOnce(&Scope<'s, 'p>) -> R,
) -> (R, ScopeStats) {
    let at = Location::caller();
    run_named(state, move || ScopeName::At(at), f)
}

/// Runs `f` in a scope with `state`, then records what it leaked. A trace of the pool, if one
/// is being recorded, shows the scope as a slice named by `name`.
pub(crate) fn run_named<'p, R>(
    state: State,
    name: impl FnOnce() -> ScopeName,
    f: impl for<'s> FnOnce(&Scope<'s, 'p>) -> R,
) -> (R, ScopeStats) {
    let _traced = state.pool().trace_scope(name);
    OPEN.with_borrow_mut(|open| open.push(state.clone()));
    let _opened = Opened;
    let scope = Scope {
        state,
        _brand: PhantomData,
    };
    let result = f(&scope);
    let state = &scope.state;
    state.update(|s| s.leaked = s.live());
    let stats = state.stats.get();
    if let Some(parent) = &state.parent {
        parent.last_child.set(Some(stats));
    }
    (result, stats)
}

/// The pool of the innermost scope open on this thread, or [`Pool::global`] if none is.
pub fn current_pool() -> Pool {
    OPEN.with_borrow(|open| open.last().map(|s| s.pool().clone()))
        .unwrap_or_else(|| Pool::global().clone())
}

impl Pool {
    /// Runs `f` in a new outermost scope on this pool and returns what it returns.
    ///
    /// Tensors made in the scope cannot be returned from `f`: results leave as plain values
    /// (`to_vec`, numbers) or as parameters ([`Tensor::detach`]). See [`Scope`] for why.
    #[track_caller]
    pub fn scope<R>(&self, f: impl for<'s, 'p> FnOnce(&Scope<'s, 'p>) -> R) -> R {
        self.scope_with_stats(f).0
    }

    /// Like [`Pool::scope`], and also returns the scope's final [`ScopeStats`].
    #[track_caller]
    pub fn scope_with_stats<R>(
        &self,
        f: impl for<'s, 'p> FnOnce(&Scope<'s, 'p>) -> R,
    ) -> (R, ScopeStats) {
        run(ScopeState::outermost(self, None), f)
    }

    /// Like [`Pool::scope`], with a name for the scope in a [`Trace`](crate::Trace) of the pool
    /// (where an unnamed scope is named by the place it was opened).
    pub fn scope_named<R>(
        &self,
        name: &'static str,
        f: impl for<'s, 'p> FnOnce(&Scope<'s, 'p>) -> R,
    ) -> R {
        run_named(
            ScopeState::outermost(self, None),
            || ScopeName::Named(name),
            f,
        )
        .0
    }

    /// Like [`Pool::scope`], with a byte limit on the scope and its descendants; see
    /// [`Scope::scope_with_budget`].
    #[track_caller]
    pub fn scope_with_budget<R>(
        &self,
        max_bytes: usize,
        f: impl for<'s, 'p> FnOnce(&Scope<'s, 'p>) -> R,
    ) -> R {
        run(ScopeState::outermost(self, Some(max_bytes)), f).0
    }
}

impl Pool {
    /// Like [`Pool::scope`], for a training step: while `f` runs, every parameter an op uses (bound
    /// with [`Scope::bind`] or given as an operand) is a leaf of the gradient graph, so a loss
    /// computed from them can [`backward`](Tensor::backward) to their gradients. Outside, the same
    /// forward records nothing.
    #[track_caller]
    pub fn train<R>(&self, f: impl for<'s, 'p> FnOnce(&Scope<'s, 'p>) -> R) -> R {
        let at = Location::caller();
        let state = ScopeState::outermost(self, None);
        autograd::with_mode(Mode::Train, || run_named(state, || ScopeName::At(at), f).0)
    }
}

/// Runs `f` in a new outermost scope on the process-wide default pool, [`Pool::global`].
#[track_caller]
pub fn scope<R>(f: impl for<'s, 'p> FnOnce(&Scope<'s, 'p>) -> R) -> R {
    Pool::global().scope(f)
}

impl<'s, 'p> Scope<'s, 'p> {
    /// Runs `f` in a child scope and returns what it returns. Tensors of this scope are usable in the
    /// child; the child's own tensors reach this scope only through the child's [`Scope::escape`].
    #[track_caller]
    pub fn scope<R>(&self, f: impl for<'i> FnOnce(&Scope<'i, 's>) -> R) -> R {
        self.scope_with_stats(f).0
    }

    /// Like [`Scope::scope`], and also returns the child scope's final [`ScopeStats`].
    #[track_caller]
    pub fn scope_with_stats<R>(
        &self,
        f: impl for<'i> FnOnce(&Scope<'i, 's>) -> R,
    ) -> (R, ScopeStats) {
        run(ScopeState::child(&self.state, None), f)
    }

    /// Like [`Scope::scope`], with a name for the child in a [`Trace`](crate::Trace) of the pool
    /// (where an unnamed scope is named by the place it was opened).
    pub fn scope_named<R>(
        &self,
        name: &'static str,
        f: impl for<'i> FnOnce(&Scope<'i, 's>) -> R,
    ) -> R {
        run_named(
            ScopeState::child(&self.state, None),
            || ScopeName::Named(name),
            f,
        )
        .0
    }

    /// Like [`Scope::scope`], with a byte limit: tensors owned by the child and its descendants may
    /// hold at most `max_bytes` (size-class bytes) at once. A rent past it fails with
    /// [`Error::ScopeBudgetExceeded`] (the panicking forms panic with that message); the pool's own
    /// budget still applies. Bytes escaped to the parent stop counting.
    #[track_caller]
    pub fn scope_with_budget<R>(
        &self,
        max_bytes: usize,
        f: impl for<'i> FnOnce(&Scope<'i, 's>) -> R,
    ) -> R {
        run(ScopeState::child(&self.state, Some(max_bytes)), f).0
    }

    /// Like [`Scope::scope`], for a training step: while `f` runs, parameters used by ops are
    /// leaves of the gradient graph (see [`Pool::train`]).
    #[track_caller]
    pub fn train<R>(&self, f: impl for<'i> FnOnce(&Scope<'i, 's>) -> R) -> R {
        let at = Location::caller();
        let state = ScopeState::child(&self.state, None);
        autograd::with_mode(Mode::Train, || run_named(state, || ScopeName::At(at), f).0)
    }

    /// Like [`Scope::scope`], with recording off while `f` runs: no op records a gradient graph,
    /// whatever its inputs carry (PyTorch's `no_grad`). For evaluation inside a training loop.
    #[track_caller]
    pub fn no_grad<R>(&self, f: impl for<'i> FnOnce(&Scope<'i, 's>) -> R) -> R {
        let at = Location::caller();
        let state = ScopeState::child(&self.state, None);
        autograd::with_mode(Mode::Off, || run_named(state, || ScopeName::At(at), f).0)
    }

    pub(crate) fn state(&self) -> &State {
        &self.state
    }

    /// Like [`Scope::rebind`] for an owned tensor: no new handle is made, so a tensor that was unique
    /// stays unique and by-value ops on it still write in place.
    pub fn rebind_owned<T: DType>(&self, tensor: Tensor<'s, T>) -> Tensor<'s, T> {
        tensor.with_scope(&self.state)
    }

    /// Hands `value` (a tensor, or a tuple, array, `Vec`, `Option` or `Result` of them) to the parent
    /// scope: the result carries the parent's brand and its buffers are counted as the parent's. No
    /// data is copied. An outermost scope has no parent scope: its tensors stay its own (and its
    /// parent brand is as confined to the closure as its own; see [`Scope`]).
    ///
    /// Only this scope's values (and those of the scopes around it, which pass through) can be
    /// escaped here: a deeper, sibling or unrelated scope's tensor does not compile, so no scope can
    /// carry another's tensors past the end of the scope that made them. A deeper scope's tensor
    /// leaves level by level.
    pub fn escape<E: Escape<'s, 'p>>(&self, value: E) -> E::Escaped {
        let parent = self.state.parent.as_ref().unwrap_or(&self.state);
        value.escape_to(&EscapeTarget::new(parent))
    }

    /// A zero-copy tensor of `param`'s values whose ops rent in this scope: how a parameter takes
    /// part in any op (ops also take `&param` as their second operand directly). Nothing is rented
    /// or counted; ops on it, in-place ones included, never write through to the parameter.
    pub fn bind<T: DType>(&self, param: &Param<T>) -> Tensor<'s, T> {
        Tensor::bound(&self.state, param)
    }

    /// A zero-copy alias of `tensor` whose ops rent their outputs in this scope. Use it to bring an
    /// outer tensor in, so that everything derived from it is this scope's to release.
    pub fn rebind<T: DType>(&self, tensor: &Tensor<'s, T>) -> Tensor<'s, T> {
        tensor.alias_in(&self.state)
    }

    /// A snapshot of this scope's counters.
    pub fn stats(&self) -> ScopeStats {
        self.state.stats.get()
    }

    /// The final counters of the child scope of this one that ended most recently, if any: how to see
    /// what a `#[dispose_scope]` function released and escaped after it returns.
    pub fn last_child_stats(&self) -> Option<ScopeStats> {
        self.state.last_child.get()
    }

    /// The pool this scope rents from.
    pub fn pool(&self) -> &Pool {
        self.state.pool()
    }

    /// Nesting depth: 1 for an outermost scope.
    pub fn depth(&self) -> usize {
        self.state.depth
    }

    /// Rents a tensor of `shape` whose contents are unspecified (but initialized); see
    /// [`Pool::try_rent`] for the errors.
    pub fn try_rent<T: DType>(&self, shape: &[usize]) -> Result<Tensor<'s, T>> {
        Tensor::try_rent_in(&self.state, shape)
    }

    panicking! {
        /// Rents a tensor with unspecified contents.
        pub fn rent<T: DType>(&self, shape: &[usize]) -> Tensor<'s, T> = try_rent;
    }

    /// Rents a tensor of `shape` and lets `kernel` write it: the way to fill a pooled buffer with a
    /// custom computation. The view starts with unspecified contents. The result carries no gradient
    /// graph: whatever `kernel` reads from other tensors is a constant to
    /// [`backward`](Tensor::backward).
    pub fn try_rent_with<T: DType>(
        &self,
        shape: &[usize],
        kernel: impl FnOnce(ArrayViewMutD<'_, T>),
    ) -> Result<Tensor<'s, T>> {
        let mut t = self.try_rent(shape)?;
        kernel(t.unique_view_mut());
        Ok(t)
    }

    panicking! {
        /// Rents a tensor and fills it with `kernel`.
        pub fn rent_with<T: DType>(&self, shape: &[usize], kernel: impl FnOnce(ArrayViewMutD<'_, T>),) -> Tensor<'s, T> = try_rent_with;
    }

    /// A tensor of `shape` filled with `value`.
    pub fn try_full<T: DType>(&self, shape: &[usize], value: T) -> Result<Tensor<'s, T>> {
        self.try_rent_with(shape, |mut v| v.fill(value))
    }

    panicking! {
        /// A tensor of `shape` filled with `value`.
        pub fn full<T: DType>(&self, shape: &[usize], value: T) -> Tensor<'s, T> = try_full;
    }

    /// The values `start, start + step, ...` below `end` (above it for a negative step), as
    /// PyTorch's `arange`: `s.arange(0i64, 5, 1)` is `[0, 1, 2, 3, 4]`, positions for an embedding;
    /// `s.arange(0.0f32, 1.0, 0.25)` is `[0, 0.25, 0.5, 0.75]`. Fails with
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a zero or non-finite step.
    pub fn try_arange<T: DType>(&self, start: T, end: T, step: T) -> Result<Tensor<'s, T>> {
        let len = T::arange_len(start, end, step).ok_or_else(|| crate::Error::InvalidArgument {
            op: "arange",
            arg: "step",
            reason: format!("from {start} to {end} by {step} is not a finite range"),
        })?;
        self.try_rent_with(&[len], |mut v| {
            v.iter_mut()
                .enumerate()
                .for_each(|(i, x)| *x = T::arange_at(start, step, i));
        })
    }

    panicking! {
        /// The values from `start` below `end` by `step`.
        pub fn arange<T: DType>(&self, start: T, end: T, step: T) -> Tensor<'s, T> = try_arange;
    }

    /// A tensor of zeros (see [`Pool::try_rent_zeroed`]).
    pub fn try_zeros<T: DType>(&self, shape: &[usize]) -> Result<Tensor<'s, T>> {
        Tensor::try_rent_zeroed_in(&self.state, shape)
    }

    panicking! {
        /// A tensor of zeros.
        pub fn zeros<T: DType>(&self, shape: &[usize]) -> Tensor<'s, T> = try_zeros;
    }

    /// A tensor of ones.
    ///
    /// # Panics
    /// On a bad shape or an exhausted budget, with the error's message.
    #[track_caller]
    pub fn ones<T: DType>(&self, shape: &[usize]) -> Tensor<'s, T> {
        self.full(shape, T::from_f64(1.0))
    }

    /// A tensor holding a copy of `array`: a reference to an ndarray array (`&array`) or a view, of
    /// any dimension. Fails with a budget error if the pool or scope cannot hold it.
    pub fn try_tensor<'a, T: DType, D: Dimension>(
        &self,
        array: impl AsArray<'a, T, D>,
    ) -> Result<Tensor<'s, T>> {
        Tensor::try_copy_of(&self.state, array.into())
    }

    panicking! {
        /// A tensor holding a copy of `array`.
        pub fn tensor<'a, T: DType, D: Dimension>(&self, array: impl AsArray<'a, T, D>,) -> Tensor<'s, T> = try_tensor;
    }

    /// A tensor of `shape` holding a copy of `data` in row-major order. Fails with
    /// [`Error::LengthMismatch`] if `data` has not exactly as many elements as `shape` holds,
    /// [`Error::SizeOverflow`] for a shape too large to address, and with a budget error if the pool
    /// or scope cannot hold it.
    pub fn try_from_slice<T: DType>(&self, shape: &[usize], data: &[T]) -> Result<Tensor<'s, T>> {
        check_length("from_slice", shape, data)?;
        let mut t = self.try_rent(shape)?;
        t.unique_slice_mut().copy_from_slice(data);
        Ok(t)
    }

    panicking! {
        /// A tensor of `shape` holding a copy of `data`.
        pub fn from_slice<T: DType>(&self, shape: &[usize], data: &[T]) -> Tensor<'s, T> = try_from_slice;
    }

    /// A tensor of standard normal samples from a deterministic generator seeded with `seed`
    /// (SplitMix64 and Box-Muller: reproducible across platforms, not for cryptography). Fails with a
    /// shape or budget error.
    pub fn try_randn<T: Element>(&self, shape: &[usize], seed: u64) -> Result<Tensor<'s, T>> {
        let mut rng = SplitMix64::new(seed);
        self.try_rent_with(shape, |mut v| {
            v.iter_mut().for_each(|x| *x = T::from_f64(rng.normal()))
        })
    }

    panicking! {
        /// Standard normal samples.
        pub fn randn<T: Element>(&self, shape: &[usize], seed: u64) -> Tensor<'s, T> = try_randn;
    }

    /// A tensor of samples uniform in `[low, high)` from a deterministic generator seeded with `seed`.
    /// The samples are drawn in `f64` and rounded to `T`, so `high` itself can occur after rounding
    /// (about once in 2^25 samples for `f32`, 2^12 for `f16`). Fails with a shape or budget error.
    pub fn try_uniform<T: Element>(
        &self,
        shape: &[usize],
        low: f64,
        high: f64,
        seed: u64,
    ) -> Result<Tensor<'s, T>> {
        let mut rng = SplitMix64::new(seed);
        self.try_rent_with(shape, |mut v| {
            v.iter_mut()
                .for_each(|x| *x = T::from_f64(low + (high - low) * rng.next_f64()))
        })
    }

    panicking! {
        /// Uniform samples.
        pub fn uniform<T: Element>(&self, shape: &[usize], low: f64, high: f64, seed: u64,) -> Tensor<'s, T> = try_uniform;
    }
}

impl<'s, T: DType> Tensor<'s, T> {
    /// Runs `f` in a child scope of the scope this tensor's ops rent in, typed as a child of the
    /// tensor's brand: what a function that receives tensors but no [`Scope`] uses to open its own.
    #[track_caller]
    pub fn child_scope<R>(&self, f: impl for<'i> FnOnce(&Scope<'i, 's>) -> R) -> R {
        self.child_scope_with_stats(f).0
    }

    /// Like [`Tensor::child_scope`], and also returns the child scope's final [`ScopeStats`].
    #[track_caller]
    pub fn child_scope_with_stats<R>(
        &self,
        f: impl for<'i> FnOnce(&Scope<'i, 's>) -> R,
    ) -> (R, ScopeStats) {
        run(ScopeState::child(&self.rents_in, None), f)
    }
}

impl fmt::Debug for Scope<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scope")
            .field("depth", &self.state.depth)
            .field("stats", &self.stats())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_balance_after_rent_release_escape() {
        let pool = Pool::with_max_memory_mb(8);
        let (kept, outer) = pool.scope_with_stats(|s| {
            let a = s.zeros::<f32>(&[16]);
            let (b, inner) = s.scope_with_stats(|i| {
                let t = i.ones::<f32>(&[16]);
                let _dropped = i.ones::<f32>(&[32]);
                i.escape(t)
            });
            assert_eq!(
                inner,
                ScopeStats {
                    rented: 2,
                    released: 1,
                    escaped: 1,
                    adopted: 0,
                    leaked: 0,
                    bytes_in_use: 0,
                    peak_bytes_in_use: 64 + 128,
                }
            );
            drop(a);
            b.detach()
        });
        assert_eq!(outer.rented, 1);
        assert_eq!(outer.adopted, 1);
        assert_eq!(outer.released, 1);
        assert_eq!(outer.escaped, 1, "moved into the parameter");
        assert_eq!(outer.leaked, 0);
        assert_eq!(pool.stats().bytes_in_use, 64);
        drop(kept);
        assert_eq!(pool.stats().bytes_in_use, 0);
    }

    #[test]
    fn forgotten_tensor_is_counted_as_leaked_and_never_reused() {
        let pool = Pool::with_max_memory_mb(8);
        let ((), stats) = pool.scope_with_stats(|s| std::mem::forget(s.ones::<f32>(&[4])));
        assert_eq!(stats.leaked, 1);
        assert_eq!(pool.stats().bytes_in_use, 64);
        assert_eq!(pool.stats().bytes_cached, 0);
    }
}
