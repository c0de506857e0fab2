//! The buffer pool: rent and return of aligned buffers under one memory budget. The rules are in
//! [`Pool`]'s docs, where they are rendered (this module is private).

use std::collections::VecDeque;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::{fmt, mem};

use crate::element::DType;
use crate::error::{panicking, Error, Result, Shape};
use crate::trace::{self, Restore, ScopeName, Trace, TraceEventKind};

/// Alignment of every pooled buffer, in bytes (one cache line; enough for any SIMD width in use).
pub const ALIGN: usize = 64;

/// One aligned unit of pool storage. Buffers are boxed slices of blocks, so their start is 64-byte
/// aligned and `bytemuck` can view them as slices of any [`DType`] without `unsafe`.
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
pub(crate) struct Block([u8; ALIGN]);

/// Default budget of a pool, as in the C# `ActivationPool` the design follows: 4096 MiB.
pub const DEFAULT_MAX_MEMORY_MB: usize = 4096;

const MIB: usize = 1 << 20;

/// The byte every unzeroed rent of a poisoned pool is filled with (see [`PoolConfig::poisoned`]).
/// A float of all-ones bytes is a NaN whose payload bits are all set, a value that arithmetic on
/// ordinary inputs never produces, so a surviving sentinel is easy to tell from a computed NaN.
pub const POISON_BYTE: u8 = 0xFF;

/// Settings of a [`Pool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolConfig {
    /// Upper bound on bytes in use plus bytes cached.
    pub max_bytes: usize,
    /// Fill every buffer of an unzeroed rent with [`POISON_BYTE`] (NaN for every float type), so
    /// that reading memory an op never wrote shows up as NaN. For tests; off by default.
    pub poison: bool,
}

impl PoolConfig {
    /// A config with a budget of `max_bytes` bytes and no poisoning.
    pub fn with_max_bytes(max_bytes: usize) -> Self {
        PoolConfig {
            max_bytes,
            poison: false,
        }
    }

    /// A config with a budget of `mb` mebibytes (saturating at `usize::MAX` bytes).
    pub fn with_max_memory_mb(mb: usize) -> Self {
        PoolConfig::with_max_bytes(mb.saturating_mul(MIB))
    }

    /// The same config with poisoning on or off (see [`PoolConfig::poison`]).
    pub fn poisoned(mut self, poison: bool) -> Self {
        self.poison = poison;
        self
    }
}

impl Default for PoolConfig {
    /// A budget of [`DEFAULT_MAX_MEMORY_MB`].
    fn default() -> Self {
        PoolConfig::with_max_memory_mb(DEFAULT_MAX_MEMORY_MB)
    }
}

/// Counters and gauges of a pool; see [`Pool::stats`].
///
/// Byte figures are in allocated bytes (the size class), except `requested_bytes`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// Rents served by an idle buffer.
    pub hits: u64,
    /// Rents that needed a fresh allocation.
    pub misses: u64,
    /// Buffers given back to the pool.
    pub returns: u64,
    /// Idle buffers freed to stay within the budget.
    pub evictions: u64,
    /// Rents refused because the buffers in use alone would pass the budget (or the system allocator
    /// failed).
    pub failed_rents: u64,
    /// Bytes rented out and not yet returned.
    pub bytes_in_use: usize,
    /// Bytes held idle, ready to be rented again.
    pub bytes_cached: usize,
    /// The highest `bytes_in_use` seen since the pool was made.
    pub peak_bytes_in_use: usize,
    /// Total bytes asked for by successful rents.
    pub requested_bytes: u64,
    /// Total bytes handed out by successful rents (`requested_bytes` plus size-class slack).
    pub rented_bytes: u64,
    /// Total bytes freshly allocated from the system (the misses).
    pub allocated_bytes: u64,
}

impl PoolStats {
    /// Fraction of rents served from the cache, `hits / (hits + misses)`; 0 before the first rent.
    pub fn hit_ratio(&self) -> f64 {
        let rents = self.hits + self.misses;
        if rents == 0 {
            0.0
        } else {
            self.hits as f64 / rents as f64
        }
    }
}

/// A shared handle on a buffer pool. Cloning it is cheap and gives another handle on the same pool;
/// it is `Send + Sync`, so threads can share one pool (each running its own scopes).
///
/// The pool keeps buffers that were returned (dropped) and hands them out again to later rents of
/// the same size class, so a steady-state loop makes no system allocations. Buffers are raw 64-byte
/// aligned blocks, so one buffer can serve `f32` now and `f16` later, and one byte budget covers
/// every element type.
///
/// ```
/// use tensorscope::Pool;
///
/// let pool = Pool::with_max_memory_mb(64);
/// for _ in 0..3 {
///     pool.scope(|s| {
///         let x = s.ones::<f32>(&[256, 256]);
///         assert_eq!((&x * 2.0).to_vec()[0], 2.0);
///     });
/// }
/// let stats = pool.stats();
/// assert_eq!((stats.misses, stats.hits), (2, 4)); // the first pass allocated, the others reused
/// assert_eq!((stats.bytes_in_use, stats.bytes_cached), (0, 2 * 256 * 256 * 4));
/// ```
///
/// # Size classes and budget
///
/// A request is rounded up to a class: whole 64-byte blocks, then quarter steps between powers of
/// two (4, 5, 6, 7, 8, 10, 12, 14, 16, 20 ... blocks). The slack is at most 25% of the request
/// (plus the rounding to one block), and a rent is only served by a buffer of its own class, so it
/// never gets a buffer much larger than it asked for.
///
/// The budget, [`Pool::max_bytes`], bounds the bytes in use plus the bytes cached. Before a fresh
/// allocation would pass it, idle buffers are evicted least recently used first: in the order they
/// were returned, counted by the pool, never by wall time. If the buffers in use alone would pass
/// it, the rent fails with [`Error::BudgetExceeded`] naming the requested, in-use, cached and limit
/// bytes (the panicking forms panic with that message).
///
/// ```
/// use tensorscope::{Error, Pool};
///
/// let pool = Pool::with_max_memory_mb(1);
/// pool.scope(|s| {
///     let _a = s.zeros::<f32>(&[256, 256]); // 256 KiB in use
///     drop(s.zeros::<f32>(&[128, 256])); // 128 KiB rented and returned: cached
///     let err = s.try_zeros::<f32>(&[1024, 256]).unwrap_err(); // 1 MiB more cannot fit
///     assert!(matches!(err, Error::BudgetExceeded { in_use: 262_144, cached: 131_072, .. }));
///     let _b = s.zeros::<f32>(&[768, 256]); // 768 KiB fits once the cached buffer is freed
/// });
/// let stats = pool.stats();
/// assert_eq!((stats.failed_rents, stats.evictions), (1, 1));
/// ```
///
/// # Threads
///
/// A pool holds memory, not threads. The threads that ops on large tensors split their work over
/// are the process's, shared by every pool: one per core by default, the calling thread included.
/// The environment variable `TENSORSCOPE_THREADS` sets their number when the process starts, and
/// [`set_threads`](crate::set_threads) at any time (`1` runs every op on the thread that calls
/// it); [`threads`](crate::threads) says how many there are now. Several threads can run scopes
/// on one pool at once (a server's requests); their ops then share those threads.
///
/// # Traces
///
/// [`Pool::start_trace`] and [`Pool::finish_trace`] record a [`Trace`] of the pool's memory: every
/// rent, return and eviction with the bytes in use after it, tagged with its thread, scope,
/// checkpoint segment and op, written as Chrome trace JSON for Perfetto or `chrome://tracing`
/// ([`Trace::save`]). Off (the default) it costs a flag check per scope, op and checkpointed layer.
///
/// # Poison
///
/// A pool made with [`PoolConfig::poisoned`] (or switched with [`Pool::set_poison`]) fills every
/// buffer of an unzeroed rent with [`POISON_BYTE`], which reads as NaN in every float type: an op
/// that forgets to write part of its output then shows NaN instead of another tensor's old values.
/// The tests run with it on; it is off by default.
///
/// # Memory safety
///
/// A buffer is handed out to one owner at a time and goes back when its [`PoolBuffer`] drops; the pool
/// never takes a buffer back on its own initiative (not at a scope's end, not on [`Pool::clear`], which
/// frees idle buffers only). So safety rests on ownership alone, never on a destructor running: a
/// buffer whose owner is leaked with `mem::forget` stays out of the pool for good, counted in
/// `bytes_in_use`, and is never handed to anyone else. The pool has no `unsafe` code: buffers are
/// boxed slices of 64-byte blocks, viewed as `f32`/`f64`/`f16`/`bf16` through `bytemuck`.
#[derive(Clone)]
pub struct Pool {
    shared: Arc<Shared>,
}

struct Shared {
    max_bytes: usize,
    poison: AtomicBool,
    /// Whether a trace is being recorded: read without the lock when a scope opens.
    tracing: AtomicBool,
    state: Mutex<State>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        if state.trace.is_some() {
            trace::stopped();
        }
    }
}

/// A trace being recorded (see [`Pool::start_trace`]).
struct Recording {
    start: std::time::Instant,
    /// Which trace of this pool it is, so that a scope opened during an earlier one does not
    /// close in it.
    generation: u64,
    trace: Trace,
}

#[derive(Default)]
struct State {
    /// The trace being recorded, if any.
    trace: Option<Box<Recording>>,
    /// The number of traces started on this pool.
    traces: u64,
    /// Returned buffers are freed instead of kept (see [`Pool::set_caching`]).
    uncached: bool,
    /// Idle buffers per size class, oldest at the front.
    idle: Vec<VecDeque<Idle>>,
    stats: PoolStats,
}

thread_local! {
    /// This thread's gauge of the pool it probes (see [`Pool::probe`]).
    static PROBE: std::cell::Cell<Probe> = const {
        std::cell::Cell::new(Probe { pool: 0, level: 0, peak: 0, step_peak: 0 })
    };
}

/// The checkpointer's measure of one thread's use of one pool: a level that rises with the bytes
/// this thread rents and falls with those it returns, and its highest point since the last
/// [`Pool::probe_start`]. Per thread, so that another thread training on the same pool does not
/// disturb the measurements; apart from the public peak, which they must not disturb either. The
/// level starts far from zero (only differences mean anything), so that returning buffers rented
/// before the thread began probing never takes it below.
#[derive(Clone, Copy)]
struct Probe {
    /// The pool's address (`0`: none yet).
    pool: usize,
    level: usize,
    peak: usize,
    /// The highest since [`Pool::probe_step_start`]: a training step's peak, which the
    /// measurements inside the step restart `peak` without disturbing.
    step_peak: usize,
}

const PROBE_ORIGIN: usize = usize::MAX / 2;

struct Idle {
    blocks: Box<[Block]>,
    /// The pool's return count when this buffer came back: its age, unique and increasing.
    returned_at: u64,
}

/// The size class of a request of `bytes`: its index and its size in blocks; `None` for zero bytes.
fn size_class(bytes: usize) -> Option<(usize, usize)> {
    if bytes == 0 {
        return None;
    }
    let blocks = bytes.div_ceil(ALIGN);
    if blocks <= 4 {
        return Some((blocks - 1, blocks));
    }
    let mut exp = blocks.ilog2() as usize;
    let step = 1usize << (exp - 2);
    let mut quarters = blocks.div_ceil(step);
    if quarters == 8 {
        exp += 1;
        quarters = 4;
    }
    let class_blocks = quarters << (exp - 2);
    Some((3 + 4 * (exp - 2) + (quarters - 4), class_blocks))
}

/// The element count of `shape`, or [`Error::SizeOverflow`] unless the product of its non-zero
/// lengths times the element size fits in `isize::MAX` bytes. That is ndarray's rule for a valid
/// shape, so every tensor shape is one ndarray can view, even with a zero-length axis.
pub(crate) fn element_count<T: DType>(shape: &[usize]) -> Result<usize> {
    let elem_bytes = mem::size_of::<T>();
    let nonzero = shape
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .filter(|n| {
            n.checked_mul(elem_bytes)
                .is_some_and(|b| b <= isize::MAX as usize)
        });
    match nonzero {
        Some(_) if shape.contains(&0) => Ok(0),
        Some(n) => Ok(n),
        None => Err(Error::SizeOverflow {
            shape: Shape::from(shape),
            elem_bytes,
        }),
    }
}

/// Checks that `data` holds exactly the elements of `shape` (for `op`'s error), as a copy into a
/// buffer of that shape needs: [`Error::LengthMismatch`] or [`Error::SizeOverflow`] otherwise.
pub(crate) fn check_length<T: DType>(op: &'static str, shape: &[usize], data: &[T]) -> Result<()> {
    let expected = element_count::<T>(shape)?;
    if expected == data.len() {
        Ok(())
    } else {
        Err(Error::LengthMismatch {
            op,
            shape: Shape::from(shape),
            expected,
            got: data.len(),
        })
    }
}

/// Bytes needed for `shape` elements of `T`, or [`Error::SizeOverflow`].
pub(crate) fn shape_bytes<T: DType>(shape: &[usize]) -> Result<usize> {
    Ok(element_count::<T>(shape)? * mem::size_of::<T>())
}

/// Bytes of budget a rent of `shape` elements of `T` takes: its size class.
pub(crate) fn class_bytes<T: DType>(shape: &[usize]) -> Result<usize> {
    Ok(class_bytes_of(shape_bytes::<T>(shape)?))
}

/// Bytes of budget a rent of `bytes` bytes takes: its size class (0 for 0 bytes).
pub(crate) fn class_bytes_of(bytes: usize) -> usize {
    size_class(bytes).map_or(0, |(_, blocks)| blocks * ALIGN)
}

impl State {
    /// Adds an event of `kind` with the figures as they are now to the trace, if one is being
    /// recorded: tagged with this thread's scope, segment and op.
    #[inline]
    fn note(&mut self, kind: TraceEventKind) {
        if let Some(recording) = &mut self.trace {
            recording.push(kind, &self.stats);
        }
    }

    /// Counts a buffer of `class_bytes` handed out for a request of `bytes` (a hit, or the
    /// reservation of a miss). The peak is the caller's to update once the buffer exists.
    fn hand_out(&mut self, bytes: usize, class_bytes: usize) {
        let s = &mut self.stats;
        s.bytes_in_use += class_bytes;
        s.requested_bytes += bytes as u64;
        s.rented_bytes += class_bytes as u64;
    }

    /// Raises the peak to the bytes in use now.
    fn note_peak(&mut self) {
        let s = &mut self.stats;
        s.peak_bytes_in_use = s.peak_bytes_in_use.max(s.bytes_in_use);
    }

    /// Takes the least recently returned idle buffer out of the cache.
    fn evict_lru(&mut self) -> Option<Box<[Block]>> {
        let class = self
            .idle
            .iter()
            .enumerate()
            .filter_map(|(class, q)| q.front().map(|b| (b.returned_at, class)))
            .min()?
            .1;
        let idle = self.idle[class].pop_front()?;
        let bytes = idle.blocks.len() * ALIGN;
        self.stats.bytes_cached -= bytes;
        self.stats.evictions += 1;
        self.note(TraceEventKind::Evict { class_bytes: bytes });
        Some(idle.blocks)
    }
}

impl Pool {
    /// A new, empty pool with the given settings.
    pub fn new(config: PoolConfig) -> Self {
        Pool {
            shared: Arc::new(Shared {
                max_bytes: config.max_bytes,
                poison: AtomicBool::new(config.poison),
                tracing: AtomicBool::new(false),
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// A new, empty pool with a budget of `mb` mebibytes.
    pub fn with_max_memory_mb(mb: usize) -> Self {
        Pool::new(PoolConfig::with_max_memory_mb(mb))
    }

    /// The process-wide default pool (budget [`DEFAULT_MAX_MEMORY_MB`]), used by
    /// [`crate::scope()`]. Created on first use.
    pub fn global() -> &'static Pool {
        static GLOBAL: OnceLock<Pool> = OnceLock::new();
        GLOBAL.get_or_init(|| Pool::new(PoolConfig::default()))
    }

    /// The budget in bytes.
    pub fn max_bytes(&self) -> usize {
        self.shared.max_bytes
    }

    /// A snapshot of the pool's counters and gauges.
    pub fn stats(&self) -> PoolStats {
        self.lock().stats
    }

    /// Bytes held by the pool: in use plus cached.
    pub fn memory_usage(&self) -> usize {
        let stats = self.stats();
        stats.bytes_in_use + stats.bytes_cached
    }

    /// Starts recording a memory [`Trace`] of this pool: every rent, return, eviction and clear,
    /// from any thread, and the scopes opened from now on, until [`Pool::finish_trace`]. A trace
    /// already being recorded is discarded and started again.
    pub fn start_trace(&self) {
        let mut state = self.lock();
        let state = &mut *state;
        state.traces += 1;
        let recording = Recording {
            start: std::time::Instant::now(),
            generation: state.traces,
            trace: Trace {
                start: (state.stats.bytes_in_use, state.stats.bytes_cached),
                ..Trace::default()
            },
        };
        if state.trace.replace(Box::new(recording)).is_none() {
            trace::started();
            self.shared.tracing.store(true, Ordering::Relaxed);
        }
    }

    /// Stops recording and returns the trace (an empty one if none was started).
    pub fn finish_trace(&self) -> Trace {
        let mut state = self.lock();
        match state.trace.take() {
            Some(recording) => {
                self.shared.tracing.store(false, Ordering::Relaxed);
                trace::stopped();
                recording.trace
            }
            None => Trace {
                start: (state.stats.bytes_in_use, state.stats.bytes_cached),
                ..Trace::default()
            },
        }
    }

    /// Whether a trace is being recorded ([`Pool::start_trace`]).
    pub fn is_tracing(&self) -> bool {
        self.shared.tracing.load(Ordering::Relaxed)
    }

    /// Records the opening of a scope named `name` on this thread, if a trace is being recorded:
    /// the guard records its closing and puts back the thread's scope tag when dropped.
    #[inline]
    pub(crate) fn trace_scope(&self, name: impl FnOnce() -> ScopeName) -> Option<TracedScope> {
        if !self.is_tracing() {
            return None;
        }
        self.trace_scope_open(name())
    }

    #[inline(never)]
    fn trace_scope_open(&self, name: ScopeName) -> Option<TracedScope> {
        let restore = trace::enter_scope(name);
        let mut state = self.lock();
        let generation = state.trace.as_ref()?.generation;
        state.note(TraceEventKind::ScopeOpen);
        Some(TracedScope {
            pool: self.clone(),
            generation,
            _restore: restore,
        })
    }

    /// Turns keeping returned buffers on (the default) or off. With caching off every rent is a fresh
    /// allocation and every return frees its buffer: the same program without pooling, for measuring
    /// what the pool saves. Turning it off also frees the idle buffers.
    pub fn set_caching(&self, enabled: bool) {
        self.lock().uncached = !enabled;
        if !enabled {
            self.clear();
        }
    }

    /// Turns poisoning on or off (see [`PoolConfig::poison`]); affects rents from now on.
    pub fn set_poison(&self, poison: bool) {
        self.shared.poison.store(poison, Ordering::Relaxed);
    }

    /// Whether unzeroed rents are filled with [`POISON_BYTE`].
    pub fn is_poisoned(&self) -> bool {
        self.shared.poison.load(Ordering::Relaxed)
    }

    /// Restarts the peak: `peak_bytes_in_use` becomes the bytes in use now. For measuring the peak of
    /// one phase of a program (one training step, say) on a pool that has been in use before.
    pub fn reset_peak(&self) {
        let mut state = self.lock();
        state.stats.peak_bytes_in_use = state.stats.bytes_in_use;
    }

    /// Restarts this thread's profiling peak and returns its level now: the start of a phase whose
    /// pool bytes the checkpointer measures (see [`Pool::probe`]).
    pub(crate) fn probe_start(&self) -> usize {
        let mut probe = self.probe_gauge();
        probe.peak = probe.level;
        PROBE.set(probe);
        probe.level
    }

    /// Restarts this thread's step peak (see [`Pool::probe_step`]) and returns its level now.
    pub(crate) fn probe_step_start(&self) -> usize {
        let mut probe = self.probe_gauge();
        probe.step_peak = probe.level;
        PROBE.set(probe);
        probe.level
    }

    /// This thread's highest level since [`Pool::probe_step_start`].
    pub(crate) fn probe_step(&self) -> usize {
        self.probe_gauge().step_peak
    }

    /// This thread's level now and its highest since [`Pool::probe_start`]: the bytes it rented
    /// from this pool and has not returned, from an arbitrary origin (so only differences mean
    /// anything).
    pub(crate) fn probe(&self) -> (usize, usize) {
        let probe = self.probe_gauge();
        (probe.level, probe.peak)
    }

    /// This thread's gauge of this pool, started at the origin if it was of another pool.
    fn probe_gauge(&self) -> Probe {
        let pool = Arc::as_ptr(&self.shared) as usize;
        let probe = PROBE.get();
        if probe.pool == pool {
            return probe;
        }
        let fresh = Probe {
            pool,
            level: PROBE_ORIGIN,
            peak: PROBE_ORIGIN,
            step_peak: PROBE_ORIGIN,
        };
        PROBE.set(fresh);
        fresh
    }

    /// Counts `class_bytes` rented (`rented`) or returned by this thread on its gauge, if it
    /// probes this pool.
    fn probe_count(&self, class_bytes: usize, rented: bool) {
        let mut probe = PROBE.get();
        if probe.pool != Arc::as_ptr(&self.shared) as usize {
            return;
        }
        if rented {
            probe.level = probe.level.wrapping_add(class_bytes);
            probe.peak = probe.peak.max(probe.level);
            probe.step_peak = probe.step_peak.max(probe.level);
        } else {
            probe.level = probe.level.wrapping_sub(class_bytes);
        }
        PROBE.set(probe);
    }

    /// Frees every idle buffer. Buffers in use are untouched and return to the pool as usual; the
    /// counters are kept.
    pub fn clear(&self) {
        let freed: Vec<VecDeque<Idle>> = {
            let mut state = self.lock();
            let bytes = mem::take(&mut state.stats.bytes_cached);
            state.note(TraceEventKind::Clear { bytes });
            mem::take(&mut state.idle)
        };
        drop(freed);
    }

    /// Rents a buffer for `shape` elements of `T`. Its contents are unspecified (the values of an
    /// earlier use, or zeros; [`POISON_BYTE`]s in a poisoned pool) but always initialized.
    ///
    /// Fails with [`Error::SizeOverflow`] if the byte count overflows, [`Error::BudgetExceeded`] if
    /// the buffers in use alone would pass the budget, and [`Error::AllocationFailed`] if the system
    /// allocator refuses. An empty shape (a zero-length axis) needs no memory and does not touch the pool.
    pub fn try_rent<T: DType>(&self, shape: &[usize]) -> Result<PoolBuffer<T>> {
        let mut buf = self.rent_typed::<T>(shape)?.0;
        if self.is_poisoned() {
            bytemuck::cast_slice_mut::<T, u8>(&mut buf).fill(POISON_BYTE);
        }
        Ok(buf)
    }

    /// Like [`Pool::try_rent`], but the buffer is zeroed. A fresh allocation comes zeroed from the
    /// allocator and is not written again.
    pub fn try_rent_zeroed<T: DType>(&self, shape: &[usize]) -> Result<PoolBuffer<T>> {
        let (mut buf, fresh) = self.rent_typed::<T>(shape)?;
        if !fresh {
            buf.fill(T::zeroed());
        }
        Ok(buf)
    }

    /// A buffer for `shape`, and whether it is a fresh (zeroed) allocation.
    fn rent_typed<T: DType>(&self, shape: &[usize]) -> Result<(PoolBuffer<T>, bool)> {
        let bytes = shape_bytes::<T>(shape)?;
        let (blocks, fresh) = self.rent_blocks(bytes)?;
        let buf = PoolBuffer {
            blocks,
            len: bytes / mem::size_of::<T>(),
            pool: self.clone(),
            _elem: PhantomData,
        };
        Ok((buf, fresh))
    }

    panicking! {
        /// Rents a buffer.
        pub fn rent<T: DType>(&self, shape: &[usize]) -> PoolBuffer<T> = try_rent;
    }

    panicking! {
        /// Rents a zeroed buffer.
        pub fn rent_zeroed<T: DType>(&self, shape: &[usize]) -> PoolBuffer<T> = try_rent_zeroed;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // No user code runs under the lock, so a poisoned lock still holds consistent figures.
        self.shared
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn rent_blocks(&self, bytes: usize) -> Result<(Box<[Block]>, bool)> {
        let Some((class, class_blocks)) = size_class(bytes) else {
            return Ok((Box::default(), true));
        };
        let class_bytes = class_blocks * ALIGN;
        let max = self.shared.max_bytes;
        let mut evicted = Vec::new();
        {
            let mut guard = self.lock();
            let state = &mut *guard;
            if let Some(idle) = state.idle.get_mut(class).and_then(VecDeque::pop_back) {
                let s = &mut state.stats;
                s.hits += 1;
                s.bytes_cached -= class_bytes;
                state.hand_out(bytes, class_bytes);
                state.note_peak();
                state.note(TraceEventKind::Rent {
                    requested: bytes,
                    class_bytes,
                    hit: true,
                });
                drop(guard);
                self.probe_count(class_bytes, true);
                return Ok((idle.blocks, false));
            }
            let s = state.stats;
            if s.bytes_in_use.saturating_add(class_bytes) > max {
                state.stats.failed_rents += 1;
                state.note(TraceEventKind::FailedRent {
                    requested: bytes,
                    class_bytes,
                });
                return Err(Error::BudgetExceeded {
                    requested: bytes,
                    class_bytes,
                    in_use: s.bytes_in_use,
                    cached: s.bytes_cached,
                    limit: max,
                });
            }
            while state.stats.bytes_in_use + state.stats.bytes_cached + class_bytes > max {
                match state.evict_lru() {
                    Some(blocks) => evicted.push(blocks),
                    None => break,
                }
            }
            // Reserve the bytes now; the allocation itself happens outside the lock.
            let s = &mut state.stats;
            s.misses += 1;
            s.allocated_bytes += class_bytes as u64;
            state.hand_out(bytes, class_bytes);
            // Recorded with the reservation, so that the figures of every later event (of any
            // thread) follow from the events before it.
            state.note(TraceEventKind::Rent {
                requested: bytes,
                class_bytes,
                hit: false,
            });
        }
        drop(evicted);
        let allocated = bytemuck::allocation::try_zeroed_slice_box::<Block>(class_blocks);
        let mut state = self.lock();
        match allocated {
            Ok(blocks) => {
                // Only a buffer that exists counts towards the peak.
                state.note_peak();
                drop(state);
                self.probe_count(class_bytes, true);
                Ok((blocks, true))
            }
            Err(()) => {
                let s = &mut state.stats;
                s.misses -= 1;
                s.bytes_in_use -= class_bytes;
                s.requested_bytes -= bytes as u64;
                s.rented_bytes -= class_bytes as u64;
                s.allocated_bytes -= class_bytes as u64;
                s.failed_rents += 1;
                state.note(TraceEventKind::AllocationFailed { class_bytes });
                Err(Error::AllocationFailed { bytes: class_bytes })
            }
        }
    }

    fn give_back(&self, blocks: Box<[Block]>) {
        let bytes = blocks.len() * ALIGN;
        let Some((class, _)) = size_class(bytes) else {
            return;
        };
        self.probe_count(bytes, false);
        let mut guard = self.lock();
        if guard.uncached {
            guard.stats.returns += 1;
            guard.stats.bytes_in_use -= bytes;
            guard.note(TraceEventKind::Return {
                class_bytes: bytes,
                freed: true,
            });
            drop(guard);
            drop(blocks); // freed outside the lock
            return;
        }
        let state = &mut *guard;
        if state.idle.len() <= class {
            state.idle.resize_with(class + 1, VecDeque::new);
        }
        let s = &mut state.stats;
        s.returns += 1;
        state.idle[class].push_back(Idle {
            blocks,
            returned_at: s.returns,
        });
        s.bytes_in_use -= bytes;
        s.bytes_cached += bytes;
        state.note(TraceEventKind::Return {
            class_bytes: bytes,
            freed: false,
        });
    }

    /// Whether two handles refer to the same pool.
    pub fn ptr_eq(&self, other: &Pool) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }
}

impl Default for Pool {
    /// A new pool with [`PoolConfig::default`] (not the global pool).
    fn default() -> Self {
        Pool::new(PoolConfig::default())
    }
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("max_bytes", &self.shared.max_bytes)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Recording {
    /// Adds an event of `kind`, tagged with this thread's tags, with the figures of `stats`.
    fn push(&mut self, kind: TraceEventKind, stats: &PoolStats) {
        let nanos = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let event = trace::event(kind, nanos, stats.bytes_in_use, stats.bytes_cached);
        let threads = &mut self.trace.threads;
        if !threads.iter().any(|&(t, _)| t == event.thread) {
            threads.push((event.thread, trace::thread_name()));
        }
        self.trace.events.push(event);
    }
}

/// A scope open in a pool's trace: records its closing when dropped (see [`Pool::trace_scope`]).
pub(crate) struct TracedScope {
    pool: Pool,
    generation: u64,
    /// Dropped after the closing is recorded, so the closing carries the scope's own name.
    _restore: Restore,
}

impl Drop for TracedScope {
    fn drop(&mut self) {
        let mut state = self.pool.lock();
        if state
            .trace
            .as_ref()
            .is_some_and(|r| r.generation == self.generation)
        {
            state.note(TraceEventKind::ScopeClose);
        }
    }
}

/// A buffer of `T` rented from a [`Pool`]; it dereferences to `[T]` and goes back to its pool when
/// dropped. The start is aligned to [`ALIGN`] bytes.
pub struct PoolBuffer<T: DType> {
    blocks: Box<[Block]>,
    len: usize,
    pool: Pool,
    _elem: PhantomData<T>,
}

impl<T: DType> PoolBuffer<T> {
    /// A buffer of no elements, which holds no memory and returns nothing to `pool`.
    pub(crate) fn empty(pool: &Pool) -> Self {
        PoolBuffer {
            blocks: Box::default(),
            len: 0,
            pool: pool.clone(),
            _elem: PhantomData,
        }
    }

    /// The pool this buffer returns to.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Bytes this buffer takes from the budget (its size class).
    pub fn allocated_bytes(&self) -> usize {
        self.blocks.len() * ALIGN
    }
}

impl<T: DType> Deref for PoolBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        &bytemuck::cast_slice(&self.blocks)[..self.len]
    }
}

impl<T: DType> DerefMut for PoolBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        &mut bytemuck::cast_slice_mut(&mut self.blocks)[..self.len]
    }
}

impl<T: DType> Drop for PoolBuffer<T> {
    fn drop(&mut self) {
        if !self.blocks.is_empty() {
            self.pool.give_back(mem::take(&mut self.blocks));
        }
    }
}

impl<T: DType> fmt::Debug for PoolBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolBuffer")
            .field("elem", &T::NAME)
            .field("len", &self.len)
            .field("allocated_bytes", &self.allocated_bytes())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_have_bounded_slack_and_increasing_indices() {
        let mut last = None;
        for bytes in (1..200_000).step_by(7).chain([1 << 20, (1 << 26) + 1]) {
            let (idx, blocks) = size_class(bytes).unwrap();
            let class_bytes = blocks * ALIGN;
            assert!(class_bytes >= bytes);
            let rounded = bytes.div_ceil(ALIGN) * ALIGN;
            assert!(
                class_bytes * 4 <= rounded * 5,
                "{bytes} -> {class_bytes} exceeds 25% slack"
            );
            if let Some((last_idx, last_blocks)) = last {
                assert!(idx >= last_idx);
                assert_eq!(idx == last_idx, blocks == last_blocks);
            }
            last = Some((idx, blocks));
        }
        assert_eq!(size_class(0), None);
        assert_eq!(size_class(64), Some((0, 1)));
        assert_eq!(size_class(4 * 64 + 1), Some((4, 5)));
        assert_eq!(size_class(8 * 64 + 1), Some((8, 10)));
    }

    #[test]
    fn returned_buffer_is_handed_out_again() {
        let pool = Pool::with_max_memory_mb(16);
        let a = pool.rent::<f32>(&[1000]);
        let ptr = a.as_ptr() as usize;
        assert_eq!(ptr % ALIGN, 0);
        drop(a);
        // Same class, other element type: the same allocation comes back.
        let b = pool.rent::<half::f16>(&[2000]);
        assert_eq!(b.as_ptr() as usize, ptr);
        let s = pool.stats();
        assert_eq!((s.hits, s.misses, s.returns), (1, 1, 1));
    }

    #[test]
    fn budget_evicts_lru_then_fails_with_figures() {
        let pool = Pool::new(PoolConfig::with_max_bytes(4096));
        let a = pool.rent::<f32>(&[256]); // 1024 bytes
        let b = pool.rent::<f32>(&[512]); // 2048 bytes
        drop(a);
        drop(b);
        assert_eq!(pool.stats().bytes_cached, 3072);
        // A fresh 3072-byte buffer fits only once both idle buffers are evicted.
        let c = pool.rent::<f32>(&[768]);
        let s = pool.stats();
        assert_eq!((s.evictions, s.bytes_cached, s.bytes_in_use), (2, 0, 3072));
        let err = pool.try_rent::<f32>(&[512]).unwrap_err();
        assert_eq!(
            err,
            Error::BudgetExceeded {
                requested: 2048,
                class_bytes: 2048,
                in_use: 3072,
                cached: 0,
                limit: 4096
            }
        );
        assert!(err.to_string().contains("limit 4096 bytes"));
        drop(c);
        assert_eq!(pool.stats().failed_rents, 1);
        let d = pool.rent::<f32>(&[512]);
        assert_eq!(d.len(), 512);
    }

    #[test]
    fn eviction_takes_the_least_recently_returned() {
        let pool = Pool::new(PoolConfig::with_max_bytes(3 * 1024));
        let a = pool.rent::<f32>(&[256]);
        let b = pool.rent::<f32>(&[256]);
        let b_ptr = b.as_ptr() as usize;
        drop(b); // returned first: oldest
        drop(a);
        let _c = pool.rent::<f32>(&[512]); // needs 2048: one eviction, of b
        assert_eq!(pool.stats().evictions, 1);
        let again = pool.rent::<f32>(&[256]);
        assert_ne!(again.as_ptr() as usize, b_ptr);
        assert_eq!(pool.stats().hits, 1);
    }

    #[test]
    fn the_trace_records_every_rent_return_and_eviction_with_the_figures_after_it() {
        let pool = Pool::new(PoolConfig::with_max_bytes(4096));
        pool.start_trace();
        let a = pool.rent::<f32>(&[256]);
        let b = pool.rent::<f32>(&[500]); // 2000 bytes: a class of 2048
        drop(a);
        drop(b);
        let c = pool.rent::<f32>(&[256]);
        let d = pool.rent::<f32>(&[768]); // 3072 bytes: the idle 2048 must go
        assert!(pool.try_rent::<f32>(&[1024]).is_err());
        let trace = pool.finish_trace();
        let figures: Vec<(usize, usize)> = trace
            .timeline()
            .iter()
            .map(|p| (p.bytes_in_use, p.bytes_cached))
            .collect();
        assert_eq!(
            figures,
            vec![
                (0, 0),
                (1024, 0),
                (3072, 0),
                (2048, 1024),
                (0, 3072),
                (1024, 2048),
                (1024, 0),
                (4096, 0),
                (4096, 0)
            ]
        );
        let kinds: Vec<TraceEventKind> = trace.events().iter().map(|e| e.kind).collect();
        assert_eq!(
            kinds,
            vec![
                TraceEventKind::Rent {
                    requested: 1024,
                    class_bytes: 1024,
                    hit: false
                },
                TraceEventKind::Rent {
                    requested: 2000,
                    class_bytes: 2048,
                    hit: false
                },
                TraceEventKind::Return {
                    class_bytes: 1024,
                    freed: false
                },
                TraceEventKind::Return {
                    class_bytes: 2048,
                    freed: false
                },
                TraceEventKind::Rent {
                    requested: 1024,
                    class_bytes: 1024,
                    hit: true
                },
                TraceEventKind::Evict { class_bytes: 2048 },
                TraceEventKind::Rent {
                    requested: 3072,
                    class_bytes: 3072,
                    hit: false
                },
                TraceEventKind::FailedRent {
                    requested: 4096,
                    class_bytes: 4096
                },
            ]
        );
        let e = &trace.events()[0];
        assert_eq!(
            (e.scope, e.op, e.segment, e.backward),
            (None, None, None, false)
        );
        assert!(trace.events().windows(2).all(|w| w[0].nanos <= w[1].nanos));
        assert!(!pool.is_tracing());
        drop((c, d));
        assert!(pool.finish_trace().events().is_empty(), "recording stopped");
    }

    #[test]
    fn without_caching_every_rent_allocates() {
        let pool = Pool::with_max_memory_mb(16);
        drop(pool.rent::<f32>(&[1000]));
        pool.set_caching(false);
        assert_eq!(pool.stats().bytes_cached, 0, "idle buffers freed");
        drop(pool.rent::<f32>(&[1000]));
        drop(pool.rent::<f32>(&[1000]));
        let s = pool.stats();
        assert_eq!(
            (s.hits, s.misses, s.returns, s.bytes_in_use, s.bytes_cached),
            (0, 3, 3, 0, 0)
        );
        pool.set_caching(true);
        drop(pool.rent::<f32>(&[1000]));
        drop(pool.rent::<f32>(&[1000]));
        assert_eq!(pool.stats().hits, 1);
    }

    #[test]
    fn a_failed_system_allocation_leaves_the_figures_as_they_were() {
        // The budget allows 2^62 bytes; no system provides them.
        let pool = Pool::new(PoolConfig::with_max_bytes(usize::MAX));
        let kept = pool.rent::<f32>(&[16]);
        let before = pool.stats();
        let err = pool.try_rent::<f32>(&[1 << 60]).unwrap_err();
        assert_eq!(err, Error::AllocationFailed { bytes: 1 << 62 });
        let after = pool.stats();
        assert_eq!(after.peak_bytes_in_use, 64, "not the failed reservation");
        assert_eq!(
            after,
            PoolStats {
                failed_rents: 1,
                ..before
            }
        );
        drop(kept);
    }

    #[test]
    fn a_poisoned_pool_fills_unzeroed_rents_with_nan() {
        let pool = Pool::new(PoolConfig::with_max_memory_mb(1).poisoned(true));
        drop(pool.rent_zeroed::<f32>(&[8]));
        let fresh = pool.rent::<f64>(&[3]); // a hit on the zeroed buffer, poisoned again
        assert!(fresh.iter().all(|x| x.is_nan() && x.to_bits() == u64::MAX));
        let zeroed = pool.rent_zeroed::<half::bf16>(&[5]);
        assert!(zeroed.iter().all(|x| x.to_f32() == 0.0));
        pool.set_poison(false);
        assert!(!pool.is_poisoned());
        drop(zeroed);
        assert!(pool.rent::<f32>(&[5]).iter().all(|&x| x == 0.0));
    }

    #[test]
    fn overflowing_shape_is_an_error() {
        let pool = Pool::default();
        let err = pool.try_rent::<f64>(&[usize::MAX / 4, 3]).unwrap_err();
        assert!(matches!(err, Error::SizeOverflow { elem_bytes: 8, .. }));
        assert_eq!(pool.stats(), PoolStats::default());
    }
}
