//! The worker threads that large ops split their work over: one per core beyond the caller's,
//! started on first use, spinning briefly between jobs and then asleep, so that an op on a large
//! tensor uses every core and a steady-state forward still makes no heap allocation (a job is a
//! borrowed closure, posted under a mutex into one of a fixed number of slots; nothing is boxed or
//! queued).
//!
//! Up to [`MAX_JOBS`] ops, from different threads, run on the team at once: a worker takes parts
//! of any posted job, and each caller runs parts of its own job and waits for the rest. An op called
//! from inside a part (a nested op), or while every slot is taken, runs its parts itself, one after
//! another, so nesting is always correct, only not faster.
//!
//! The number of threads ([`threads`]) is the count given to [`set_threads`], else
//! `TENSORSCOPE_THREADS`, else the machine's available parallelism; `1` runs everything on the
//! calling thread. The count can change at any time: the next op splits by the new one, workers are
//! started when it grows past the team, and the workers beyond it sleep until it grows again.
//!
//! The one `unsafe` here lends a borrowed closure to the workers for the length of a call; see
//! [`Team::post`] for why that is sound on every path out of the call, panics included.
#![allow(unsafe_code)]

use std::any::Any;
use std::cell::Cell;
use std::marker::PhantomData;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};

/// Splits `data` into runs of whole `granule`s (the last may be short), each at least
/// `min_granules` long, and calls `f(start, run)` for every run, `start` being the run's index in
/// `data`; the runs go to different threads (see [`for_each_part`]). Small data runs as one call
/// on this thread; empty data, as none.
pub(crate) fn split_mut<T: Send>(
    data: &mut [T],
    granule: usize,
    min_granules: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let granule = granule.max(1);
    let granules = data.len().div_ceil(granule);
    for_each_part(
        granules,
        min_granules,
        |parts| {
            let run = granules.div_ceil(parts) * granule;
            data.chunks_mut(run.max(1))
                .enumerate()
                .map(move |(i, run_data)| (i * run, run_data))
        },
        |(start, run_data)| f(start, run_data),
    );
}

/// Runs an op of `granules` units of work, each part at least `min_granules` of them: `split(n)`
/// makes the parts for `n` threads, and `f(part)` runs for each, on different threads, this one
/// included; returns when all are done. `n` is 1 for work too small to split, and at most this
/// caller's share of the team: the threads, divided evenly among the callers running ops this size
/// or larger at the time (two requests served at once on two cores run one thread each rather
/// than three threads on two cores, preempting each other's parts). A panic in any part is raised
/// again here, with its payload, once every part has finished.
pub(crate) fn for_each_part<P: Send, I: Iterator<Item = P>>(
    granules: usize,
    min_granules: usize,
    split: impl FnOnce(usize) -> I,
    f: impl Fn(P) + Sync,
) {
    let most = (granules / min_granules.max(1)).clamp(1, MAX_PARTS);
    let limit = threads();
    if most == 1 || limit == 1 || IN_PART.get() {
        return split(1).for_each(f);
    }
    let team = team(limit);
    let busy = Busy::enter(team);
    let threads = most.min(busy.share());
    if threads == 1 {
        return split(1).for_each(f);
    }
    // One slot per part, each taken by exactly one thread: parts that are `&mut` borrows move to
    // the threads without `unsafe`.
    let slots: [Mutex<Option<P>>; MAX_PARTS] = std::array::from_fn(|_| Mutex::new(None));
    let mut count = 0;
    for part in split(threads) {
        assert!(count < MAX_PARTS, "more than {MAX_PARTS} parts");
        *lock(&slots[count]) = Some(part);
        count += 1;
    }
    team.run(count, &|i| {
        if let Some(part) = lock(&slots[i]).take() {
            f(part);
        }
    });
}

/// The most parts an op is split into, and so the most threads an op can use.
const MAX_PARTS: usize = 64;

/// The count [`set_threads`] gave, or 0 if it has not been called.
static SET_THREADS: AtomicUsize = AtomicUsize::new(0);

/// Sets the number of threads that large ops split their work over, the calling thread included,
/// for the whole process: `1` runs every op on the thread that calls it. It overrides
/// `TENSORSCOPE_THREADS` and the machine's parallelism (see [`threads`]); a count above 64, the
/// most parts an op is split into, is taken as 64.
///
/// It may be called at any time, from any thread. Ops already running finish with the count they
/// started with; the next op splits by the new one. Raising the count past the threads started so
/// far starts more at the next op that splits; lowering it puts the workers beyond it to sleep
/// (they are not ended, and wake when it is raised again). Results do not depend on the count:
/// an op splits its output into parts that are each computed as they would be on one thread, so
/// the same inputs give the same bits on any number of threads.
///
/// # Panics
///
/// If `n` is 0: the count includes the calling thread, so it is at least 1.
///
/// ```
/// use tensorscope::{set_threads, threads, Pool, TensorOps};
///
/// let pool = Pool::with_max_memory_mb(64);
/// let product = || pool.scope(|s| {
///     let a = s.randn::<f32>(&[256, 512], 1);
///     a.matmul(&s.randn::<f32>(&[512, 256], 2)).to_vec()
/// });
/// set_threads(1); // every op on this thread from here on
/// assert_eq!(threads(), 1);
/// let alone = product();
/// set_threads(2);
/// assert_eq!(threads(), 2);
/// assert_eq!(product(), alone); // the same bits on two threads
/// ```
pub fn set_threads(n: usize) {
    assert!(
        n > 0,
        "set_threads(0): the count includes the calling thread, so it is at least 1 \
         (1 runs every op on the calling thread)"
    );
    SET_THREADS.store(n.min(MAX_PARTS), Ordering::Relaxed);
}

/// The number of threads that large ops split their work over, the calling thread included: the
/// count last given to [`set_threads`]; else the environment variable `TENSORSCOPE_THREADS`, read
/// once, if it is a whole number of at least 1; else the machine's available parallelism
/// ([`std::thread::available_parallelism`]); at most 64.
///
/// Ops called at the same time from several threads share these threads: each splits into its
/// share of them (two requests served at once on a count of 2 run one thread each). An op on a
/// small tensor runs on its calling thread whatever the count.
///
/// ```
/// let n = tensorscope::threads();
/// assert!((1..=64).contains(&n));
/// ```
pub fn threads() -> usize {
    match SET_THREADS.load(Ordering::Relaxed) {
        0 => default_threads(),
        n => n,
    }
}

/// The count before any [`set_threads`]: `TENSORSCOPE_THREADS`, else the machine's parallelism,
/// else 1; at most [`MAX_PARTS`] (more threads than an op has parts would never get one).
fn default_threads() -> usize {
    static DEFAULT: OnceLock<usize> = OnceLock::new();
    *DEFAULT.get_or_init(|| {
        std::env::var("TENSORSCOPE_THREADS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
            .or_else(|| std::thread::available_parallelism().ok().map(usize::from))
            .unwrap_or(1)
            .min(MAX_PARTS)
    })
}

/// The most jobs the team runs at once; a caller finding every slot taken runs its parts alone.
/// Each concurrent caller of an op on a large tensor takes one (a server's requests on a shared
/// model), so this is a bound on concurrent requests that get help, not on requests.
const MAX_JOBS: usize = 8;

/// Checks of an atomic a thread waiting for a job, or for a job's parts, makes before it sleeps:
/// about 50 µs here (a `pause` each). Ops come one after another in a forward, so the next job usually arrives
/// while a worker spins, and posting it costs a store instead of a wake-up through the kernel (a
/// few µs each way, as long as a small product); a worker idle for longer sleeps.
const SPINS: u32 = 1 << 11;

/// A panic's payload, carried from a part to the op's caller.
type Payload = Box<dyn Any + Send>;

/// A job: a borrowed closure with its lifetime erased (see [`Team::post`]).
#[derive(Clone, Copy)]
struct Task(&'static (dyn Fn(usize) + Sync));

/// One slot of [`Jobs`]: a posted job, or none.
#[derive(Default)]
struct Job {
    task: Option<Task>,
    parts: usize,
    /// The next part to claim.
    next: usize,
    /// The payload of the first part that panicked.
    panic: Option<Payload>,
    /// The job's caller is asleep on [`Team::done`].
    caller_sleeps: bool,
}

/// The jobs posted to the team, under one lock.
#[derive(Default)]
struct Jobs {
    slots: [Job; MAX_JOBS],
    /// The slot a worker looks at first for a part: the one after its last claim's, so that
    /// concurrent jobs share the workers in turn.
    turn: usize,
    /// Workers asleep on [`Team::start`].
    sleepers: usize,
    /// Workers asleep on [`Team::resized`]: those beyond [`Team::active`].
    parked: usize,
}

struct Team {
    /// The workers that take parts: those numbered below it. The others sleep on
    /// [`Team::resized`]; the team's share of an op is this plus the caller.
    active: AtomicUsize,
    /// The workers started so far, numbered from 0; the team grows, never shrinks.
    started: Mutex<usize>,
    /// Callers running an op large enough to split, split or not (see [`Busy`]).
    callers: AtomicUsize,
    jobs: Mutex<Jobs>,
    /// Jobs posted so far: a spinning worker watches it change.
    posted: AtomicU64,
    /// Per slot: the parts of its job, claimed or not, that have not finished. Outside the lock,
    /// so that a caller can spin on it.
    unfinished: [AtomicUsize; MAX_JOBS],
    /// Signalled when a job is posted while a worker sleeps.
    start: Condvar,
    /// Signalled when a job's last part finishes while its caller sleeps.
    done: Condvar,
    /// Signalled when [`Team::active`] changes.
    resized: Condvar,
}

/// A posted job, held by the call that posted it until [`Posted::take_down`] has run: on return,
/// or from `Drop` if the call unwinds.
struct Posted<'t, 'f> {
    team: &'t Team,
    slot: usize,
    /// Whether the job has been taken down.
    down: bool,
    /// The job is the caller's closure, borrowed for `'f`.
    _job: PhantomData<&'f ()>,
}

impl Team {
    /// A team of `workers` threads, started now; it lives as long as the process.
    fn start(workers: usize) -> &'static Team {
        let team: &'static Team = Box::leak(Box::new(Team {
            active: AtomicUsize::new(0),
            started: Mutex::new(0),
            callers: AtomicUsize::new(0),
            jobs: Mutex::default(),
            posted: AtomicU64::new(0),
            unfinished: Default::default(),
            start: Condvar::new(),
            done: Condvar::new(),
            resized: Condvar::new(),
        }));
        team.set_active(workers);
        team
    }

    /// Makes the first `workers` workers take parts, starting those not started yet; the others
    /// finish what they hold and sleep until a later call wakes them. A job posted before keeps its
    /// parts: its caller runs those that no worker takes.
    fn set_active(&'static self, workers: usize) {
        let mut started = lock(&self.started);
        while *started < workers {
            let i = *started;
            // A worker that cannot start only leaves its parts to the others and the callers.
            let _ = std::thread::Builder::new()
                .name(format!("tensorscope-{i}"))
                .spawn(move || self.work(i));
            *started += 1;
        }
        // Under the lock that a worker checks `active` under before it sleeps, so that none
        // misses the change: those beyond it leave their wait for a job, and park.
        let _jobs = lock(&self.jobs);
        self.active.store(workers, Ordering::Release);
        self.resized.notify_all();
        self.start.notify_all();
    }

    /// Runs `f(0..parts)`, the parts spread over the team and this thread; returns when all are
    /// done. A panic in any part is raised again here, with its payload, once every part has
    /// finished. With every slot taken, this thread runs all the parts.
    fn run(&self, parts: usize, f: &(dyn Fn(usize) + Sync)) {
        let Some(mut job) = self.post(parts, f) else {
            return (0..parts).for_each(f);
        };
        // This thread takes parts of its own job too, then waits for the ones the workers took.
        while self.run_one(Some(job.slot)) {}
        if let Some(payload) = job.take_down() {
            panic::resume_unwind(payload);
        }
    }

    /// Posts `f` as a job of `parts` parts for the workers to take; `None` if every slot is taken.
    ///
    /// The job's lifetime is erased so that the workers can hold it. That is sound because the job
    /// is taken down ([`Posted::take_down`]: no part is claimed once it starts, and it returns only
    /// when every claimed part has finished) before `f`'s borrow ends, on every path out of
    /// [`Team::run`]: `run` takes it down before it returns, and the [`Posted`]'s `Drop` does if
    /// `run` unwinds instead. The `Posted` is `run`'s own local, never handed to other code, so
    /// nothing can leak it (`mem::forget`) to skip that. A worker calls the job only between
    /// claiming a part (under the lock, while the job is posted) and counting it finished. Nothing
    /// in `run` is meant to unwind between the post and the take-down (parts run inside
    /// `catch_unwind`, and a payload not passed on is dropped inside one too); the guard is there so
    /// that soundness does not rest on that. If the process aborts instead, the workers end with it.
    fn post<'f>(&self, parts: usize, f: &'f (dyn Fn(usize) + Sync)) -> Option<Posted<'_, 'f>> {
        let mut jobs = lock(&self.jobs);
        let slot = jobs.slots.iter().position(|job| job.task.is_none())?;
        // SAFETY: the job is taken down before `'f` ends, on every path (see above).
        let task = Task(unsafe {
            std::mem::transmute::<&'f (dyn Fn(usize) + Sync), &'static (dyn Fn(usize) + Sync)>(f)
        });
        jobs.slots[slot] = Job {
            task: Some(task),
            parts,
            ..Job::default()
        };
        self.unfinished[slot].store(parts, Ordering::Release);
        self.posted.fetch_add(1, Ordering::Release);
        if jobs.sleepers > 0 {
            self.start.notify_all();
        }
        Some(Posted {
            team: self,
            slot,
            down: false,
            _job: PhantomData,
        })
    }

    /// Claims the next part of the job in `slot` (of any job, in turn, if `None`).
    fn claim(&self, slot: Option<usize>) -> Option<(Task, usize, usize)> {
        let mut jobs = lock(&self.jobs);
        let (first, looked_at) = slot.map_or((jobs.turn, MAX_JOBS), |s| (s, 1));
        for s in (first..first + looked_at).map(|s| s % MAX_JOBS) {
            let job = &mut jobs.slots[s];
            let Some(task) = job.task.filter(|_| job.next < job.parts) else {
                continue;
            };
            let part = job.next;
            job.next += 1;
            if slot.is_none() {
                jobs.turn = (s + 1) % MAX_JOBS;
            }
            return Some((task, s, part));
        }
        None
    }

    /// Claims a part of the job in `slot` (of any job if `None`) and runs it, counting it
    /// finished; `false` if there was no part to claim. Never unwinds: a part's panic is kept for
    /// the job's caller.
    fn run_one(&self, slot: Option<usize>) -> bool {
        let Some((task, slot, part)) = self.claim(slot) else {
            return false;
        };
        IN_PART.set(true);
        let result = panic::catch_unwind(AssertUnwindSafe(|| (task.0)(part)));
        IN_PART.set(false);
        if let Err(payload) = result {
            let refused = {
                let mut jobs = lock(&self.jobs);
                let kept = &mut jobs.slots[slot].panic;
                if kept.is_none() {
                    *kept = Some(payload);
                    None
                } else {
                    Some(payload)
                }
            };
            // Outside the lock: a payload's destructor is the user's code.
            drop_payload(refused);
        }
        if self.unfinished[slot].fetch_sub(1, Ordering::AcqRel) == 1 {
            // The last part: wake the caller if it stopped spinning. Taking the lock orders this
            // after the caller's check of `unfinished` made under it.
            if lock(&self.jobs).slots[slot].caller_sleeps {
                self.done.notify_all();
            }
        }
        true
    }

    /// Spins until `ready` or for [`SPINS`] checks; whether `ready` held.
    fn spin_until(&self, ready: impl Fn() -> bool) -> bool {
        for _ in 0..SPINS {
            if ready() {
                return true;
            }
            std::hint::spin_loop();
        }
        ready()
    }

    /// Worker `index`: takes parts of whatever jobs are posted, forever; between jobs it spins a
    /// while, then sleeps until the next is posted. While `index` is not below [`Team::active`] it
    /// sleeps until that changes.
    fn work(&self, index: usize) {
        WORKER.set(true);
        if let Some(start) = WORKER_START.get() {
            start();
        }
        loop {
            if index >= self.active.load(Ordering::Acquire) {
                let mut jobs = lock(&self.jobs);
                jobs.parked += 1;
                while index >= self.active.load(Ordering::Acquire) {
                    jobs = self
                        .resized
                        .wait(jobs)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                jobs.parked -= 1;
                continue;
            }
            let seen = self.posted.load(Ordering::Acquire);
            while self.run_one(None) {}
            // Until a job is posted, or this worker is no longer one that takes parts.
            let idle = || {
                self.posted.load(Ordering::Acquire) == seen
                    && index < self.active.load(Ordering::Acquire)
            };
            if !self.spin_until(|| !idle()) {
                let mut jobs = lock(&self.jobs);
                jobs.sleepers += 1;
                while idle() {
                    jobs = self
                        .start
                        .wait(jobs)
                        .unwrap_or_else(PoisonError::into_inner);
                }
                jobs.sleepers -= 1;
            }
        }
    }
}

/// A caller counted in [`Team::callers`] while it runs an op large enough to split.
struct Busy<'t>(&'t Team);

impl<'t> Busy<'t> {
    fn enter(team: &'t Team) -> Self {
        team.callers.fetch_add(1, Ordering::Relaxed);
        Busy(team)
    }

    /// The threads this caller's op may use: the team's, divided evenly among the callers
    /// running ops (rounded down: a thread left idle costs less than one more than the cores,
    /// whose preempted parts stall every thread of their job), at least 1.
    fn share(&self) -> usize {
        let callers = self.0.callers.load(Ordering::Relaxed).max(1);
        ((self.0.active.load(Ordering::Relaxed) + 1) / callers).max(1)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.0.callers.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Posted<'_, '_> {
    /// Takes the job down: no part is claimed from now on, and once every claimed part has
    /// finished the slot is free again. Returns the payload of the first part that panicked.
    fn take_down(&mut self) -> Option<Payload> {
        let (team, slot) = (self.team, self.slot);
        let unfinished = &team.unfinished[slot];
        {
            // Parts nobody claimed will not run: there are some only if the caller is unwinding.
            let mut jobs = lock(&team.jobs);
            let job = &mut jobs.slots[slot];
            unfinished.fetch_sub(job.parts - job.next, Ordering::AcqRel);
            job.next = job.parts;
        }
        if !team.spin_until(|| unfinished.load(Ordering::Acquire) == 0) {
            let mut jobs = lock(&team.jobs);
            jobs.slots[slot].caller_sleeps = true;
            while unfinished.load(Ordering::Acquire) > 0 {
                jobs = team.done.wait(jobs).unwrap_or_else(PoisonError::into_inner);
            }
            jobs.slots[slot].caller_sleeps = false;
        }
        let mut jobs = lock(&team.jobs);
        let job = &mut jobs.slots[slot];
        job.task = None;
        self.down = true;
        job.panic.take()
    }
}

impl Drop for Posted<'_, '_> {
    /// Takes the job down if the caller leaves without doing so (by unwinding).
    fn drop(&mut self) {
        if !self.down {
            drop_payload(self.take_down());
        }
    }
}

/// Drops a panic payload that is not passed on. Its destructor is the user's code and may panic
/// in turn: that panic is caught, and its own payload is leaked rather than dropped (dropping it
/// could panic again). No panic leaves this function, so a worker always counts its part finished.
fn drop_payload(payload: Option<Payload>) {
    if let Err(again) = panic::catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        std::mem::forget(again);
    }
}

/// What every worker runs when it starts, registered by the layer that splits its work here (the
/// ops: the products' packing buffers), so that which thread takes which part of a product never
/// decides whether a step allocates. A hook rather than a call, so that this layer names none above.
static WORKER_START: OnceLock<fn()> = OnceLock::new();

/// Registers `hook` as what every worker runs when it starts; the first registration stands. It
/// must come before the first split, which starts the workers.
pub(crate) fn on_worker_start(hook: fn()) {
    // A second registration is the same hook: nothing to do.
    let _ = WORKER_START.set(hook);
}

thread_local! {
    /// This thread is one of the team's workers.
    static WORKER: Cell<bool> = const { Cell::new(false) };
    /// This thread is running a part of a job: an op it calls runs its parts itself.
    static IN_PART: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is one of the team's workers.
pub(crate) fn is_worker() -> bool {
    WORKER.get()
}

/// Locks `m`; no code panics while holding one of these locks, so poisoning carries no meaning.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The process's team, started by the first op that splits, with `threads - 1` workers taking
/// parts (the caller is the other thread): a count changed by [`set_threads`] since the last op is
/// applied here.
fn team(threads: usize) -> &'static Team {
    static TEAM: OnceLock<&'static Team> = OnceLock::new();
    let workers = threads - 1;
    let team = *TEAM.get_or_init(|| Team::start(workers));
    if team.active.load(Ordering::Relaxed) != workers {
        team.set_active(workers);
    }
    team
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::atomic::Ordering::SeqCst;
    use std::time::{Duration, Instant};

    #[test]
    fn every_element_is_visited_once_with_its_index() {
        for len in [0, 1, 5, 1000, 100_003] {
            let mut data = vec![0usize; len];
            split_mut(&mut data, 7, 2, |start, run| {
                for (i, v) in run.iter_mut().enumerate() {
                    *v += start + i + 1;
                }
            });
            assert!(
                data.iter().enumerate().all(|(i, &v)| v == i + 1),
                "len {len}"
            );
        }
    }

    #[test]
    fn nested_and_concurrent_calls_complete() {
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    let mut outer = vec![1u32; 4096];
                    split_mut(&mut outer, 64, 1, |_, run| {
                        let mut inner = vec![1u32; 4096];
                        split_mut(&mut inner, 64, 1, |_, r| r.iter_mut().for_each(|v| *v *= 2));
                        let inner: u32 = inner.iter().sum();
                        total.fetch_add(inner as usize, Ordering::Relaxed);
                        run.iter_mut().for_each(|v| *v += 1);
                    });
                    assert!(outer.iter().all(|&v| v == 2));
                });
            }
        });
        // Each outer part ran one inner job of 4096 doubled ones.
        assert_eq!(total.load(Ordering::Relaxed) % 8192, 0);
        assert!(total.load(Ordering::Relaxed) >= 4 * 8192);
    }

    #[test]
    fn a_panicking_part_panics_the_caller_with_its_message() {
        let mut data = vec![0u8; 1 << 16];
        let result = panic::catch_unwind(AssertUnwindSafe(|| {
            split_mut(&mut data, 1024, 1, |_, _| panic!("a part fails"))
        }));
        let payload = result.expect_err("the part's panic reaches the caller");
        assert_eq!(payload.downcast_ref::<&str>(), Some(&"a part fails"));
        // The team is usable afterwards.
        let mut again = vec![1u8; 1 << 16];
        split_mut(&mut again, 1024, 1, |_, run| {
            run.iter_mut().for_each(|v| *v = 3)
        });
        assert!(again.iter().all(|&v| v == 3));
    }

    /// Waits until `ready`, failing the test after 20 s rather than hanging it.
    fn wait_until(what: &str, ready: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ready() {
            assert!(Instant::now() < deadline, "timed out waiting until {what}");
            std::thread::yield_now();
        }
    }

    /// Asserts that no job is left posted on `team` and that each of its workers still takes
    /// parts: a job of one part per thread, each waiting for all the others, completes.
    fn assert_every_thread_serves(team: &'static Team) {
        assert!(
            lock(&team.jobs).slots.iter().all(|job| job.task.is_none()),
            "a job was left posted"
        );
        let threads = team.active.load(SeqCst) + 1;
        let started = AtomicUsize::new(0);
        team.run(threads, &|_| {
            started.fetch_add(1, SeqCst);
            wait_until("every thread took a part", || {
                started.load(SeqCst) == threads
            });
        });
    }

    /// Runs `f` on a thread of its own and fails if it has not returned within 60 s: a test of a
    /// hang fails rather than hangs.
    fn without_hanging(f: impl FnOnce() + Send + 'static) {
        let (done, finished) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            f();
            let _ = done.send(());
        });
        match finished.recv_timeout(Duration::from_secs(60)) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("hung for 60 s"),
            _ => thread.join().unwrap_or_else(|p| panic::resume_unwind(p)),
        }
    }

    /// A panic payload whose destructor panics.
    struct Bomb;

    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("a panic payload that panics when dropped");
        }
    }

    #[test]
    fn payloads_that_panic_when_dropped_are_contained_on_every_thread() {
        let team = Team::start(3);
        without_hanging(move || {
            for round in 0..20 {
                let started = AtomicUsize::new(0);
                let finished: [AtomicBool; 4] = Default::default();
                let result = panic::catch_unwind(AssertUnwindSafe(|| {
                    team.run(4, &|i| {
                        // Each part runs on a thread of its own (the caller's and three workers'),
                        // so four payloads meet the job: three are dropped where they were caught.
                        started.fetch_add(1, SeqCst);
                        wait_until("the four parts run at once", || started.load(SeqCst) == 4);
                        std::thread::sleep(Duration::from_millis(1));
                        finished[i].store(true, SeqCst);
                        panic::panic_any(Bomb);
                    })
                }));
                let payload = result.expect_err("a part's panic reaches the caller");
                assert!(payload.is::<Bomb>(), "round {round}");
                // Dropping it would panic: the payload passed on is the caller's to handle.
                std::mem::forget(payload);
                // The caller unwound only after every part had finished: `started` and `finished`,
                // on its stack, outlived every use.
                assert!(finished.iter().all(|f| f.load(SeqCst)), "round {round}");
            }
            assert_every_thread_serves(team);
        });
    }

    #[test]
    fn a_caller_unwinding_with_its_job_posted_waits_for_the_claimed_parts() {
        /// Sets its flag when dropped: when the caller below starts to unwind.
        struct SetOnDrop<'a>(&'a AtomicBool);
        impl Drop for SetOnDrop<'_> {
            fn drop(&mut self) {
                self.0.store(true, SeqCst);
            }
        }
        let team = Team::start(2);
        let (started, finished) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let leaving = AtomicBool::new(false);
        let part = |_| {
            started.fetch_add(1, SeqCst);
            wait_until("the caller unwinds", || leaving.load(SeqCst));
            std::thread::sleep(Duration::from_millis(20));
            finished.fetch_add(1, SeqCst);
        };
        let result = panic::catch_unwind(AssertUnwindSafe(|| {
            let _job = team.post(8, &part).expect("a free slot");
            let _leaving = SetOnDrop(&leaving); // dropped before the job
            wait_until("both workers took a part", || started.load(SeqCst) == 2);
            panic!("the caller leaves before its job is done");
        }));
        assert!(result.is_err());
        // The parts the workers had claimed (one each, or two if one finished as the unwinding
        // began) finished before the unwinding went on past the job; the rest never ran.
        let done = finished.load(SeqCst);
        assert_eq!(done, started.load(SeqCst));
        assert!((2..=4).contains(&done), "{done} parts ran");
        assert_every_thread_serves(team);
    }

    #[test]
    fn a_team_grows_and_its_workers_beyond_the_count_sleep_until_raised() {
        let team = Team::start(1);
        let parked = || lock(&team.jobs).parked;
        without_hanging(move || {
            assert_every_thread_serves(team); // the caller and one worker
            team.set_active(3);
            assert_every_thread_serves(team); // and two workers started now
            team.set_active(1);
            wait_until("the two workers beyond the count sleep", || parked() == 2);
            for _ in 0..3 {
                assert_every_thread_serves(team); // a job of two parts, the caller's and one worker's
                assert_eq!(parked(), 2, "a parked worker took a part");
            }
            team.set_active(2);
            wait_until("one worker woke", || parked() == 1);
            assert_every_thread_serves(team);
            assert_eq!(*lock(&team.started), 3);
        });
    }

    #[test]
    fn a_job_posted_while_the_workers_are_busy_gets_them_once_free() {
        let team = Team::start(1);
        let release = AtomicBool::new(false);
        let a_started = AtomicUsize::new(0);
        std::thread::scope(|s| {
            // Job A holds its caller and the one worker until released.
            s.spawn(|| {
                team.run(2, &|_| {
                    a_started.fetch_add(1, SeqCst);
                    wait_until("job A is released", || release.load(SeqCst));
                })
            });
            wait_until("job A holds the worker", || a_started.load(SeqCst) == 2);
            // Job B's two parts each wait for the other, so B needs a second thread: only the
            // worker, once A lets it go, can be that thread.
            let b = s.spawn(|| {
                let b_started = AtomicUsize::new(0);
                team.run(2, &|_| {
                    b_started.fetch_add(1, SeqCst);
                    wait_until("both parts of job B run at once", || {
                        b_started.load(SeqCst) == 2
                    });
                })
            });
            wait_until("job B is posted", || {
                let jobs = lock(&team.jobs);
                jobs.slots.iter().filter(|job| job.task.is_some()).count() == 2
            });
            release.store(true, SeqCst);
            b.join().expect("job B completes with the worker's help");
        });
        assert_every_thread_serves(team);
    }
}
