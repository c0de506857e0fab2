//! Memory traces: every rent, return and eviction of a pool, with the bytes in use after it, tagged
//! with the scope, checkpoint segment and op it happened in, and the scopes themselves as slices.
//! The rules are on [`Trace`], where they are rendered (this module is private).
//!
//! The pool records the events under its lock; what they are tagged with comes from this thread's
//! tags, which scopes, ops and the checkpoint driver set only while some pool is tracing
//! ([`active`]): with none, each of those places costs one load and one branch.

use std::cell::Cell;
use std::fmt;
use std::io::{self, Write};
use std::panic::Location;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// The name of a scope in a [`Trace`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ScopeName {
    /// A name given with [`Pool::scope_named`](crate::Pool::scope_named) or
    /// [`Scope::scope_named`](crate::Scope::scope_named), or a `#[dispose_scope]` function's path
    /// (`my_crate::model::block`).
    Named(&'static str),
    /// A scope opened without a name: where it was opened.
    At(&'static Location<'static>),
}

impl fmt::Display for ScopeName {
    /// The name, or `scope at FILE:LINE` for an unnamed scope.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScopeName::Named(name) => f.write_str(name),
            ScopeName::At(at) => write!(f, "scope at {}:{}", at.file(), at.line()),
        }
    }
}

/// Where in a checkpointed forward (a `#[checkpoint]` loop or
/// [`Checkpointer::checkpointed_forward`](crate::Checkpointer::checkpointed_forward)) an event
/// happened: the layer's position in the loop, and the segment it belongs to, named by the position
/// of its first layer. A layer that runs on a tape (`replayed`) belongs to the region a backward
/// replays from one stored input; the others (the last segment of a training forward, whose graph
/// is recorded; every layer of an inference) to a segment of the forward's plan. The backward's
/// replays of a taped layer carry its segment too (with [`TraceEvent::backward`] set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Segment {
    /// The position of the segment's first layer, from 0.
    pub start: usize,
    /// The layer's position in the loop, from 0.
    pub layer: usize,
    /// Whether the layer runs on a tape, to be replayed by the backward from a stored input.
    pub replayed: bool,
}

/// What happened at one [`TraceEvent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TraceEventKind {
    /// A buffer was handed out: `requested` bytes asked for, `class_bytes` (its size class) taken
    /// from the budget; `hit` if an idle buffer served it, else a fresh allocation (recorded when
    /// its bytes are reserved, before the allocation, which can still fail:
    /// [`TraceEventKind::AllocationFailed`]). Replaying the kinds in order from the figures at
    /// the start gives every event's figures, whatever the threads.
    Rent {
        /// Bytes asked for.
        requested: usize,
        /// Bytes of the size class, what the budget counts.
        class_bytes: usize,
        /// Served from the cache (else a fresh allocation).
        hit: bool,
    },
    /// A rent was refused: the buffers in use and the new one would pass the budget.
    FailedRent {
        /// Bytes asked for.
        requested: usize,
        /// Bytes of the size class.
        class_bytes: usize,
    },
    /// The system allocator refused the fresh buffer of the `Rent` (a miss) recorded before it on
    /// the same thread: its bytes are no longer in use, and the rent failed.
    AllocationFailed {
        /// Bytes of the size class.
        class_bytes: usize,
    },
    /// A buffer came back: kept idle for a later rent, or `freed` if caching is off.
    Return {
        /// Bytes of the buffer (its size class).
        class_bytes: usize,
        /// Freed rather than kept ([`Pool::set_caching`](crate::Pool::set_caching) off).
        freed: bool,
    },
    /// An idle buffer was freed to make room for a fresh allocation (least recently returned).
    Evict {
        /// Bytes of the buffer.
        class_bytes: usize,
    },
    /// [`Pool::clear`](crate::Pool::clear) freed every idle buffer.
    Clear {
        /// Bytes freed.
        bytes: usize,
    },
    /// A scope opened on the event's thread (its name is the event's `scope`).
    ScopeOpen,
    /// The scope named by the event's `scope` closed.
    ScopeClose,
}

/// One event of a [`Trace`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TraceEvent {
    /// Nanoseconds since the trace started.
    pub nanos: u64,
    /// The thread it happened on: a number from 1, the same for a thread throughout the process.
    pub thread: u64,
    /// What happened.
    pub kind: TraceEventKind,
    /// Bytes rented out after the event.
    pub bytes_in_use: usize,
    /// Bytes held idle after the event.
    pub bytes_cached: usize,
    /// The innermost scope open on the thread (opened since the trace started), or for a scope's
    /// own open and close that scope; `None` outside every traced scope.
    pub scope: Option<ScopeName>,
    /// The checkpoint segment and layer of a checkpointed forward that was running, if any.
    pub segment: Option<Segment>,
    /// The op that was running (`"matmul"`; in a backward, the op whose backward it is), if any.
    pub op: Option<&'static str>,
    /// Whether a backward was running.
    pub backward: bool,
}

impl TraceEvent {
    /// Whether the event is of the pool (a rent, return, eviction, clear), not a scope's edge.
    pub fn is_pool_event(&self) -> bool {
        !matches!(
            self.kind,
            TraceEventKind::ScopeOpen | TraceEventKind::ScopeClose
        )
    }
}

/// One point of a pool's memory timeline (see [`Trace::timeline`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimelinePoint {
    /// Microseconds since the trace started.
    pub micros: u64,
    /// Bytes rented out at that moment.
    pub bytes_in_use: usize,
    /// Bytes held idle at that moment.
    pub bytes_cached: usize,
}

/// The memory trace of a [`Pool`](crate::Pool), from [`Pool::start_trace`](crate::Pool::start_trace)
/// to [`Pool::finish_trace`](crate::Pool::finish_trace): every rent (hit or miss, bytes asked for
/// and its size class), failed rent, return, eviction and clear, with the bytes in use and cached
/// after it, and the scopes opened and closed while it ran. Each event is tagged with its thread,
/// the innermost scope open on that thread, the segment and layer of a checkpointed forward, and
/// the op that rented (see [`TraceEvent`]).
///
/// [`Trace::write_chrome_json`] and [`Trace::save`] write it in Chrome's trace event format,
/// which [Perfetto](https://ui.perfetto.dev) and `chrome://tracing` open: the scopes are nested
/// slices on their thread's track, each pool event an instant on it whose arguments hold its bytes,
/// class, scope, segment and op, and the bytes in use and cached a counter track.
///
/// ```
/// use tensorscope::{Pool, TraceEventKind};
///
/// let pool = Pool::with_max_memory_mb(64);
/// pool.start_trace();
/// pool.scope_named("step", |s| {
///     let x = s.ones::<f32>(&[64, 64]);
///     let y = x.matmul(&x);
///     assert_eq!(y.to_vec()[0], 64.0);
/// });
/// let trace = pool.finish_trace();
/// let rents: Vec<_> = trace
///     .events()
///     .iter()
///     .filter(|e| matches!(e.kind, TraceEventKind::Rent { .. }))
///     .map(|e| (e.scope.unwrap().to_string(), e.op.unwrap_or("none")))
///     .collect();
/// assert_eq!(rents, [("step".to_string(), "none"), ("step".to_string(), "matmul")]);
/// let mut json = Vec::new();
/// trace.write_chrome_json(&mut json).unwrap();
/// assert!(json.starts_with(b"{\"traceEvents\":["));
/// ```
///
/// # What it tags
///
/// A scope's name is the one given to [`Pool::scope_named`](crate::Pool::scope_named) or
/// [`Scope::scope_named`](crate::Scope::scope_named); a `#[dispose_scope]` function's scope is
/// named by its path (`module_path!()` and the function's name) without a word from the user; any
/// other scope by where it was opened (`scope at src/main.rs:12`). An event is tagged with the
/// innermost scope open on its thread, as a profiler attributes a sample to the function running,
/// so a rent shows up inside the slice it happened in; the scope that accounts for the buffer
/// (see [`ScopeStats`](crate::ScopeStats)) is usually that one, and otherwise the scope of an
/// operand from outside. Only scopes opened while the trace runs are tagged (and shown).
///
/// # Cost
///
/// Off, the pool checks for a trace under the lock it takes anyway, and scopes, ops and the
/// checkpointed layer loop check one flag: no allocation and no clock read. On, every event reads
/// the clock and is pushed to a list under the pool's lock, where it stays (128 bytes an event)
/// until [`Pool::finish_trace`](crate::Pool::finish_trace): trace a few steps, not a whole run.
#[derive(Debug, Clone, Default)]
pub struct Trace {
    /// The bytes in use and cached when the trace started.
    pub(crate) start: (usize, usize),
    pub(crate) events: Vec<TraceEvent>,
    /// The threads seen, with their names.
    pub(crate) threads: Vec<(u64, Option<String>)>,
}

impl Trace {
    /// Every event, in the order the pool saw them (their times never decrease).
    pub fn events(&self) -> &[TraceEvent] {
        &self.events
    }

    /// The bytes in use and cached when the trace started, then after each pool event: what
    /// to plot.
    pub fn timeline(&self) -> Vec<TimelinePoint> {
        let first = TimelinePoint {
            micros: 0,
            bytes_in_use: self.start.0,
            bytes_cached: self.start.1,
        };
        let points = self
            .events
            .iter()
            .filter(|e| e.is_pool_event())
            .map(|e| TimelinePoint {
                micros: e.nanos / 1000,
                bytes_in_use: e.bytes_in_use,
                bytes_cached: e.bytes_cached,
            });
        std::iter::once(first).chain(points).collect()
    }

    /// Writes the trace as Chrome trace event JSON (see [`Trace`]). Fails only as `out` does.
    pub fn write_chrome_json(&self, out: impl Write) -> io::Result<()> {
        let mut out = io::BufWriter::new(out);
        let w = &mut out;
        w.write_all(b"{\"traceEvents\":[\n")?;
        w.write_all(
            b"{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":1,\"tid\":0,\
              \"args\":{\"name\":\"tensorscope pool\"}}",
        )?;
        for (tid, name) in &self.threads {
            write!(
                w,
                ",\n{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":1,\"tid\":{tid},\"args\":{{\"name\":"
            )?;
            match name {
                Some(name) => string(w, name)?,
                None => write!(w, "\"thread {tid}\"")?,
            }
            w.write_all(b"}}")?;
        }
        counter(w, 0, self.start.0, self.start.1)?;
        for e in &self.events {
            let name = match e.kind {
                TraceEventKind::Rent { hit: true, .. } => "rent (hit)",
                TraceEventKind::Rent { hit: false, .. } => "rent (miss)",
                TraceEventKind::FailedRent { .. } => "failed rent",
                TraceEventKind::AllocationFailed { .. } => "allocation failed",
                TraceEventKind::Return { freed: false, .. } => "return",
                TraceEventKind::Return { freed: true, .. } => "free",
                TraceEventKind::Evict { .. } => "evict",
                TraceEventKind::Clear { .. } => "clear",
                TraceEventKind::ScopeOpen | TraceEventKind::ScopeClose => "",
            };
            w.write_all(b",\n{\"name\":")?;
            match e.kind {
                TraceEventKind::ScopeOpen | TraceEventKind::ScopeClose => {
                    string(w, &scope_label(e.scope))?;
                    let ph = if e.kind == TraceEventKind::ScopeOpen {
                        "B"
                    } else {
                        "E"
                    };
                    write!(w, ",\"cat\":\"scope\",\"ph\":\"{ph}\"")?;
                }
                _ => {
                    string(w, name)?;
                    w.write_all(b",\"cat\":\"pool\",\"ph\":\"i\",\"s\":\"t\"")?;
                }
            }
            write!(
                w,
                ",\"ts\":{},\"pid\":1,\"tid\":{}",
                Micros(e.nanos),
                e.thread
            )?;
            w.write_all(b",\"args\":{")?;
            match e.kind {
                TraceEventKind::Rent {
                    requested,
                    class_bytes,
                    hit,
                } => write!(
                    w,
                    "\"bytes\":{requested},\"class\":{class_bytes},\"hit\":{hit},"
                )?,
                TraceEventKind::FailedRent {
                    requested,
                    class_bytes,
                } => write!(w, "\"bytes\":{requested},\"class\":{class_bytes},")?,
                TraceEventKind::Return { class_bytes, .. }
                | TraceEventKind::Evict { class_bytes }
                | TraceEventKind::AllocationFailed { class_bytes } => {
                    write!(w, "\"bytes\":{class_bytes},\"class\":{class_bytes},")?
                }
                TraceEventKind::Clear { bytes } => write!(w, "\"bytes\":{bytes},")?,
                TraceEventKind::ScopeOpen | TraceEventKind::ScopeClose => {}
            }
            w.write_all(b"\"scope\":")?;
            string(w, &scope_label(e.scope))?;
            w.write_all(b",\"op\":")?;
            string(w, e.op.unwrap_or("none"))?;
            if let Some(segment) = e.segment {
                write!(
                    w,
                    ",\"segment\":{},\"layer\":{},\"replayed\":{}",
                    segment.start, segment.layer, segment.replayed
                )?;
            }
            let pass = if e.backward { "backward" } else { "forward" };
            write!(w, ",\"pass\":\"{pass}\"")?;
            if e.is_pool_event() {
                write!(
                    w,
                    ",\"in_use\":{},\"cached\":{}}}}}",
                    e.bytes_in_use, e.bytes_cached
                )?;
                counter(w, e.nanos, e.bytes_in_use, e.bytes_cached)?;
            } else {
                w.write_all(b"}}")?;
            }
        }
        w.write_all(b"\n]}\n")?;
        out.flush()
    }

    /// Writes the trace as Chrome trace event JSON to the file `path` (see [`Trace`]), replacing
    /// it. Fails with the I/O error, its message naming the file.
    pub fn save(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let path = path.as_ref();
        let named = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!("cannot write the trace to {}: {e}", path.display()),
            )
        };
        let file = std::fs::File::create(path).map_err(named)?;
        self.write_chrome_json(file).map_err(named)
    }
}

/// What a trace names a scope, `"none"` for no scope.
fn scope_label(scope: Option<ScopeName>) -> String {
    scope.map_or_else(|| "none".to_owned(), |s| s.to_string())
}

/// `s` as a JSON string.
fn string(w: &mut impl Write, s: &str) -> io::Result<()> {
    serde_json::to_writer(w, s).map_err(io::Error::other)
}

/// A counter event of the pool's bytes at `nanos`.
fn counter(w: &mut impl Write, nanos: u64, in_use: usize, cached: usize) -> io::Result<()> {
    write!(
        w,
        ",\n{{\"name\":\"pool bytes\",\"ph\":\"C\",\"ts\":{},\"pid\":1,\"tid\":0,\
         \"args\":{{\"in use\":{in_use},\"cached\":{cached}}}}}",
        Micros(nanos)
    )
}

/// Nanoseconds printed as microseconds with three decimals: the trace format's unit.
struct Micros(u64);

impl fmt::Display for Micros {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:03}", self.0 / 1000, self.0 % 1000)
    }
}

/// How many pools are tracing: while none is, the tags are never set or read.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// The next thread number.
static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

/// What this thread is doing, as the events it causes are tagged.
struct Tags {
    scope: Cell<Option<ScopeName>>,
    segment: Cell<Option<Segment>>,
    op: Cell<Option<&'static str>>,
    backward: Cell<bool>,
    thread: Cell<u64>,
}

thread_local! {
    static TAGS: Tags = const {
        Tags {
            scope: Cell::new(None),
            segment: Cell::new(None),
            op: Cell::new(None),
            backward: Cell::new(false),
            thread: Cell::new(0),
        }
    };
}

/// Whether some pool is tracing.
#[inline(always)]
pub(crate) fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed) != 0
}

/// A pool started tracing.
pub(crate) fn started() {
    ACTIVE.fetch_add(1, Ordering::Relaxed);
}

/// A pool stopped tracing.
pub(crate) fn stopped() {
    ACTIVE.fetch_sub(1, Ordering::Relaxed);
}

/// This thread's number.
pub(crate) fn thread() -> u64 {
    TAGS.with(|t| match t.thread.get() {
        0 => {
            let n = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
            t.thread.set(n);
            n
        }
        n => n,
    })
}

/// An event of `kind` tagged with this thread's tags, at `nanos`, with the pool's figures after it.
pub(crate) fn event(
    kind: TraceEventKind,
    nanos: u64,
    bytes_in_use: usize,
    bytes_cached: usize,
) -> TraceEvent {
    let thread = thread();
    TAGS.with(|t| TraceEvent {
        nanos,
        thread,
        kind,
        bytes_in_use,
        bytes_cached,
        scope: t.scope.get(),
        segment: t.segment.get(),
        op: t.op.get(),
        backward: t.backward.get(),
    })
}

/// Sets this thread's checkpoint segment to what `segment` gives (the position of the segment's
/// first layer, of the layer, and whether it runs on a tape; `None` once the forward is over), if a pool is tracing: the checkpoint
/// driver's hook.
#[inline(always)]
pub(crate) fn set_segment(segment: impl FnOnce() -> Option<(usize, usize, bool)>) {
    if active() {
        let segment = segment().map(|(start, layer, replayed)| Segment {
            start,
            layer,
            replayed,
        });
        TAGS.with(|t| t.segment.set(segment));
    }
}

/// Puts back a tag of this thread when dropped; does nothing if no pool was tracing when it was
/// made.
#[must_use]
pub(crate) struct Restore(Option<Previous>);

enum Previous {
    Scope(Option<ScopeName>),
    Op(Option<&'static str>),
    Backward(bool),
}

impl Drop for Restore {
    #[inline(always)]
    fn drop(&mut self) {
        if let Some(previous) = self.0.take() {
            TAGS.with(|t| match previous {
                Previous::Scope(s) => t.scope.set(s),
                Previous::Op(o) => t.op.set(o),
                Previous::Backward(b) => t.backward.set(b),
            });
        }
    }
}

/// Tags this thread's events with the op `name` gives until the guard drops, if a pool is tracing.
#[inline(always)]
pub(crate) fn op(name: impl FnOnce() -> &'static str) -> Restore {
    if !active() {
        return Restore(None);
    }
    Restore(Some(Previous::Op(
        TAGS.with(|t| t.op.replace(Some(name()))),
    )))
}

/// Tags this thread's events as a backward's until the guard drops, if a pool is tracing.
#[inline(always)]
pub(crate) fn backward() -> Restore {
    if !active() {
        return Restore(None);
    }
    Restore(Some(Previous::Backward(
        TAGS.with(|t| t.backward.replace(true)),
    )))
}

/// Tags this thread's events with the scope `name` until the guard drops. Called by the pool
/// when a scope opens while it traces.
pub(crate) fn enter_scope(name: ScopeName) -> Restore {
    Restore(Some(Previous::Scope(
        TAGS.with(|t| t.scope.replace(Some(name))),
    )))
}

/// This thread's name, for a trace's thread track.
pub(crate) fn thread_name() -> Option<String> {
    std::thread::current().name().map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Pool;

    #[test]
    #[cfg(target_pointer_width = "64")]
    fn an_event_takes_the_bytes_the_docs_say() {
        assert_eq!(std::mem::size_of::<TraceEvent>(), 128);
    }

    #[test]
    fn names_are_escaped_and_scopes_nest_in_the_json() {
        let pool = Pool::with_max_memory_mb(1);
        pool.start_trace();
        pool.scope_named("a \"quoted\" \\ name\n", |s| {
            s.scope_named("inner", |i| drop(i.zeros::<f32>(&[3])));
        });
        let trace = pool.finish_trace();
        let mut json = Vec::new();
        trace.write_chrome_json(&mut json).unwrap();
        let parsed: serde_json::Value = serde_json::from_slice(&json).unwrap();
        let phases: Vec<(String, String)> = parsed["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v["ph"] != "M" && v["ph"] != "C")
            .map(|v| {
                let name = v["name"].as_str().unwrap().to_owned();
                (v["ph"].as_str().unwrap().to_owned(), name)
            })
            .collect();
        let outer = "a \"quoted\" \\ name\n".to_owned();
        let expected = [
            ("B", outer.as_str()),
            ("B", "inner"),
            ("i", "rent (miss)"),
            ("i", "return"),
            ("E", "inner"),
            ("E", outer.as_str()),
        ];
        let expected: Vec<(String, String)> = expected
            .iter()
            .map(|(p, n)| (p.to_string(), n.to_string()))
            .collect();
        assert_eq!(phases, expected);
        let rent = &parsed["traceEvents"].as_array().unwrap()[5];
        assert_eq!(rent["args"]["bytes"], 12);
        assert_eq!(rent["args"]["class"], 64);
        assert_eq!(rent["args"]["scope"], "inner");
        assert_eq!(rent["args"]["op"], "none");
        assert!(
            rent["args"].get("segment").is_none(),
            "outside a checkpointed loop"
        );
    }
}
