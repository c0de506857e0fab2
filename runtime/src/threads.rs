//! The worker threads that large ops split their work over: one per core beyond the caller's,
//! started on first use, spinning briefly between jobs and then asleep, so that an op on a large
//! tensor uses every core and a steady-state forward still makes no heap allocation (a job is a
//! borrowed closure, handed over under a mutex; nothing is boxed or queued).
//!
//! One op runs on the team at a time. A caller that finds it busy (another thread's op, or an op
//! called from inside a part) runs its parts itself, one after another, so nesting and concurrent
//! callers are always correct, only not faster.
//!
//! The number of threads is the machine's available parallelism, or `TENSORSCOPE_THREADS` if set
//! (`1` runs everything on the calling thread).
//!
//! The one `unsafe` here lends a borrowed closure to the workers for the length of a call.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock, PoisonError};

/// Threads an op may use, the caller's included.
pub(crate) fn count() -> usize {
    team().map_or(1, |t| t.workers + 1)
}

/// Splits `data` into at most [`count`] runs of whole `granule`s (the last may be short), each at
/// least `min_granules` long, and calls `f(start, run)` for every run, `start` being the run's index
/// in `data`; the runs go to different threads. Small data runs as one call on this thread.
pub(crate) fn split_mut<T: Send>(
    data: &mut [T],
    granule: usize,
    min_granules: usize,
    f: impl Fn(usize, &mut [T]) + Sync,
) {
    let granules = data.len().div_ceil(granule.max(1));
    let parts = parts(granules, min_granules);
    if parts <= 1 {
        f(0, data);
        return;
    }
    let run = granules.div_ceil(parts) * granule;
    for_each_part(data.chunks_mut(run).enumerate(), |(i, run_data)| {
        f(i * run, run_data)
    });
}

/// How many parts `granules` of work are split into when each part must have at least
/// `min_granules`: at most [`count`], at least 1.
pub(crate) fn parts(granules: usize, min_granules: usize) -> usize {
    count()
        .min(granules / min_granules.max(1))
        .clamp(1, MAX_PARTS)
}

/// Calls `f(part)` for every one of `parts` (at most [`MAX_PARTS`] of them; more are an error),
/// each on a different thread, this one included; returns when all are done.
pub(crate) fn for_each_part<P: Send>(parts: impl Iterator<Item = P>, f: impl Fn(P) + Sync) {
    // One slot per part, each taken by exactly one thread: parts that are `&mut` borrows move to
    // the threads without `unsafe`.
    let slots: [Mutex<Option<P>>; MAX_PARTS] = std::array::from_fn(|_| Mutex::new(None));
    let mut count = 0;
    for part in parts {
        assert!(count < MAX_PARTS, "more than {MAX_PARTS} parts");
        *lock(&slots[count]) = Some(part);
        count += 1;
    }
    run_parts(count, &|i| {
        if let Some(part) = lock(&slots[i]).take() {
            f(part);
        }
    });
}

/// The most parts an op is split into.
const MAX_PARTS: usize = 64;

/// Checks of an atomic a thread waiting for a job, or for a job's parts, makes before it sleeps:
/// about 50 µs here (a `pause` each). Ops come one after another in a forward, so the next job usually arrives
/// while a worker spins, and posting it costs a store instead of a wake-up through the kernel (a
/// few µs each way, as long as a small product); a worker idle for longer sleeps.
const SPINS: u32 = 1 << 11;

/// Runs `f(0..parts)`, the parts spread over the team and this thread; returns when all are done.
/// A panic in any part is raised again here, with its payload, once every part has finished.
fn run_parts(parts: usize, f: &(dyn Fn(usize) + Sync)) {
    let Some(team) = team().filter(|_| parts > 1) else {
        return (0..parts).for_each(f);
    };
    if team
        .busy
        .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        return (0..parts).for_each(f);
    }
    // SAFETY: the job's lifetime is erased so that the workers can hold it, and the erasure is
    // sound because this function does not return, or unwind, until the job has been taken down
    // again (`task = None` below) with every part finished: a worker only calls the job between
    // claiming a part (under `team.job`'s lock, while the job is posted) and counting it finished
    // (`team.unfinished`), and this function waits for `unfinished == 0` after catching any panic
    // of this thread's own parts, before it takes the job down.
    let task: Task = Task(unsafe {
        std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static (dyn Fn(usize) + Sync)>(f)
    });
    {
        let mut job = lock(&team.job);
        job.task = Some(task);
        job.parts = parts;
        job.next = 0;
        team.unfinished.store(parts, Ordering::Release);
        team.posted.fetch_add(1, Ordering::Release);
        if job.sleepers > 0 {
            team.start.notify_all();
        }
    }
    // This thread takes parts too, then waits for the ones the workers took.
    while team.run_one() {}
    if !team.spin_until(|| team.unfinished.load(Ordering::Acquire) == 0) {
        let mut job = lock(&team.job);
        job.caller_sleeps = true;
        while team.unfinished.load(Ordering::Acquire) > 0 {
            job = team.done.wait(job).unwrap_or_else(PoisonError::into_inner);
        }
        job.caller_sleeps = false;
    }
    let panic = {
        let mut job = lock(&team.job);
        job.task = None;
        job.panic.take()
    };
    team.busy.store(false, Ordering::Release);
    if let Some(payload) = panic {
        panic::resume_unwind(payload);
    }
}

/// A job: a borrowed closure with its lifetime erased (see [`run_parts`]).
#[derive(Clone, Copy)]
struct Task(&'static (dyn Fn(usize) + Sync));

/// The current job, shared by the caller and the workers.
#[derive(Default)]
struct Job {
    task: Option<Task>,
    parts: usize,
    /// The next part to claim.
    next: usize,
    /// The payload of the first part that panicked.
    panic: Option<Box<dyn std::any::Any + Send>>,
    /// Workers asleep on `start`.
    sleepers: usize,
    /// The caller is asleep on `done`.
    caller_sleeps: bool,
}

struct Team {
    workers: usize,
    job: Mutex<Job>,
    /// Jobs posted so far: a spinning worker watches it change.
    posted: AtomicU64,
    /// Parts of the current job, claimed or not, that have not finished.
    unfinished: AtomicUsize,
    /// Signalled when a job is posted while a worker sleeps.
    start: Condvar,
    /// Signalled when a job's last part finishes while its caller sleeps.
    done: Condvar,
    /// A job is running: other callers run theirs alone.
    busy: AtomicBool,
}

impl Team {
    /// Claims the next part of the current job and runs it, counting it finished; `false` if no
    /// part is left to claim.
    fn run_one(&self) -> bool {
        let (task, i) = {
            let mut job = lock(&self.job);
            let (Some(task), i) = (job.task, job.next) else {
                return false;
            };
            if i >= job.parts {
                return false;
            }
            job.next += 1;
            (task, i)
        };
        let result = panic::catch_unwind(AssertUnwindSafe(|| (task.0)(i)));
        if let Err(payload) = result {
            lock(&self.job).panic.get_or_insert(payload);
        }
        if self.unfinished.fetch_sub(1, Ordering::AcqRel) == 1 {
            // The last part: wake the caller if it stopped spinning. Taking the lock orders this
            // after the caller's check of `unfinished` made under it.
            if lock(&self.job).caller_sleeps {
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

    /// A worker: takes parts of whatever job is posted, forever; between jobs it spins a while,
    /// then sleeps until the next is posted.
    fn work(&self) {
        WORKER.set(true);
        crate::ops::reserve_scratch();
        loop {
            let seen = self.posted.load(Ordering::Acquire);
            while self.run_one() {}
            if !self.spin_until(|| self.posted.load(Ordering::Acquire) != seen) {
                let mut job = lock(&self.job);
                job.sleepers += 1;
                while self.posted.load(Ordering::Acquire) == seen {
                    job = self.start.wait(job).unwrap_or_else(PoisonError::into_inner);
                }
                job.sleepers -= 1;
            }
        }
    }
}

thread_local! {
    /// This thread is one of the team's workers.
    static WORKER: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is one of the team's workers.
pub(crate) fn is_worker() -> bool {
    WORKER.get()
}

/// Locks `m`; no code panics while holding one of these locks, so poisoning carries no meaning.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The process's team, started on first use; `None` with one thread.
fn team() -> Option<&'static Team> {
    static TEAM: OnceLock<Option<&'static Team>> = OnceLock::new();
    *TEAM.get_or_init(|| {
        let threads = std::env::var("TENSORSCOPE_THREADS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
            .or_else(|| std::thread::available_parallelism().ok().map(usize::from))
            .unwrap_or(1);
        if threads <= 1 {
            return None;
        }
        let team: &'static Team = Box::leak(Box::new(Team {
            workers: threads - 1,
            job: Mutex::default(),
            posted: AtomicU64::new(0),
            unfinished: AtomicUsize::new(0),
            start: Condvar::new(),
            done: Condvar::new(),
            busy: AtomicBool::new(false),
        }));
        for i in 0..threads - 1 {
            // A worker that cannot start only leaves its parts to the others and the caller.
            let _ = std::thread::Builder::new()
                .name(format!("tensorscope-{i}"))
                .spawn(|| team.work());
        }
        Some(team)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
