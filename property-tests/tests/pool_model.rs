//! Model-based tests of the buffer pool.
//!
//! Random sequences of rents, zeroed rents, over-budget rents, returns and clears are applied both to
//! a real [`Pool`] and to a plain reference model kept in `Vec`s. After every step every
//! [`PoolStats`] field must match the model exactly, hits must hand out exactly the buffer the model
//! predicts, and the buffers held must be aligned, disjoint and still hold the values written into
//! them.
//!
//! One point the documentation leaves open is pinned here as the pool implements it: idle buffers
//! returned between the same two rentals are equally old, and eviction takes the smaller size class
//! first among them.

use std::mem;
use std::thread;

use proptest::prelude::*;
use tensorscope::{
    bf16, f16, Element, Error, Pool, PoolBuffer, PoolConfig, PoolStats, Trace, TraceEventKind,
    ALIGN,
};

// ---------------------------------------------------------------------------------------------
// Element types and tagging
// ---------------------------------------------------------------------------------------------

/// An element type whose values can be written from, and compared as, raw bit patterns.
trait Tagged: Element {
    fn from_tag(tag: u16) -> Self;
    fn bits(self) -> u64;
    fn wrap(buf: PoolBuffer<Self>) -> Held;
}

impl Tagged for f32 {
    fn from_tag(tag: u16) -> Self {
        f32::from_bits(0x3f80_0000 | u32::from(tag))
    }
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
    fn wrap(buf: PoolBuffer<Self>) -> Held {
        Held::F32(buf)
    }
}

impl Tagged for f64 {
    fn from_tag(tag: u16) -> Self {
        f64::from_bits(0x3ff0_0000_0000_0000 | u64::from(tag))
    }
    fn bits(self) -> u64 {
        self.to_bits()
    }
    fn wrap(buf: PoolBuffer<Self>) -> Held {
        Held::F64(buf)
    }
}

impl Tagged for f16 {
    fn from_tag(tag: u16) -> Self {
        // Finite, non-zero patterns: exponent field 1..=30.
        f16::from_bits(0x0400 + tag % 0x7800)
    }
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
    fn wrap(buf: PoolBuffer<Self>) -> Held {
        Held::F16(buf)
    }
}

impl Tagged for bf16 {
    fn from_tag(tag: u16) -> Self {
        // Finite, non-zero patterns: exponent field 1..=254.
        bf16::from_bits(0x0080 + tag % 0x7e00)
    }
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
    fn wrap(buf: PoolBuffer<Self>) -> Held {
        Held::Bf16(buf)
    }
}

/// The four element types, as picked by the strategies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    F32,
    F64,
    F16,
    Bf16,
}

impl Ty {
    fn size(self) -> usize {
        match self {
            Ty::F32 => mem::size_of::<f32>(),
            Ty::F64 => mem::size_of::<f64>(),
            Ty::F16 => mem::size_of::<f16>(),
            Ty::Bf16 => mem::size_of::<bf16>(),
        }
    }
}

/// A rented buffer of any of the four element types.
enum Held {
    F32(PoolBuffer<f32>),
    F64(PoolBuffer<f64>),
    F16(PoolBuffer<f16>),
    Bf16(PoolBuffer<bf16>),
}

macro_rules! each {
    ($held:expr, $b:ident => $e:expr) => {
        match $held {
            Held::F32($b) => $e,
            Held::F64($b) => $e,
            Held::F16($b) => $e,
            Held::Bf16($b) => $e,
        }
    };
}

fn fill_tag<T: Tagged>(buf: &mut [T], tag: u16) {
    buf.fill(T::from_tag(tag));
}

fn has_tag<T: Tagged>(buf: &[T], tag: u16) -> bool {
    let want = T::from_tag(tag).bits();
    buf.iter().all(|&x| x.bits() == want)
}

fn all_zero_bits<T: Tagged>(buf: &[T]) -> bool {
    buf.iter().all(|&x| x.bits() == 0)
}

impl Held {
    fn rent(pool: &Pool, ty: Ty, shape: &[usize], zeroed: bool) -> Result<Held, Error> {
        fn go<T: Tagged>(pool: &Pool, shape: &[usize], zeroed: bool) -> Result<Held, Error> {
            let buf = if zeroed {
                pool.try_rent_zeroed::<T>(shape)?
            } else {
                pool.try_rent::<T>(shape)?
            };
            Ok(T::wrap(buf))
        }
        match ty {
            Ty::F32 => go::<f32>(pool, shape, zeroed),
            Ty::F64 => go::<f64>(pool, shape, zeroed),
            Ty::F16 => go::<f16>(pool, shape, zeroed),
            Ty::Bf16 => go::<bf16>(pool, shape, zeroed),
        }
    }

    fn ty(&self) -> Ty {
        match self {
            Held::F32(_) => Ty::F32,
            Held::F64(_) => Ty::F64,
            Held::F16(_) => Ty::F16,
            Held::Bf16(_) => Ty::Bf16,
        }
    }

    fn ptr(&self) -> usize {
        each!(self, b => b.as_ptr() as usize)
    }

    fn len(&self) -> usize {
        each!(self, b => b.len())
    }

    fn allocated_bytes(&self) -> usize {
        each!(self, b => b.allocated_bytes())
    }

    fn pool(&self) -> &Pool {
        each!(self, b => b.pool())
    }

    fn fill_tag(&mut self, tag: u16) {
        each!(self, b => fill_tag(b, tag))
    }

    fn has_tag(&self, tag: u16) -> bool {
        each!(self, b => has_tag(b, tag))
    }

    fn is_all_zero(&self) -> bool {
        each!(self, b => all_zero_bits(b))
    }
}

// ---------------------------------------------------------------------------------------------
// The reference model
// ---------------------------------------------------------------------------------------------

/// The size class of a request, in 64-byte blocks; `None` for zero bytes. Written from the
/// documented rule: whole blocks, then quarter steps between powers of two.
fn class_blocks(bytes: usize) -> Option<usize> {
    if bytes == 0 {
        return None;
    }
    let blocks = bytes.div_ceil(64);
    if blocks <= 4 {
        return Some(blocks);
    }
    let step = 1usize << (blocks.ilog2() - 2);
    Some(blocks.div_ceil(step) * step)
}

/// An idle buffer as the model sees it.
#[derive(Debug, Clone)]
struct ModelIdle {
    ptr: usize,
    blocks: usize,
}

/// What the model says a rent must do.
#[derive(Debug)]
enum Expect {
    /// Zero bytes: an empty buffer, the pool untouched.
    Empty,
    /// Served from the cache by exactly this buffer.
    Hit { ptr: usize },
    /// A fresh allocation.
    Miss,
    /// Refused with exactly this error.
    Fail(Error),
}

/// The pool as plain data: idle buffers in the order they were returned and the expected counters.
struct Model {
    max_bytes: usize,
    idle: Vec<ModelIdle>,
    stats: PoolStats,
}

impl Model {
    fn new(max_bytes: usize) -> Self {
        Model {
            max_bytes,
            idle: Vec::new(),
            stats: PoolStats::default(),
        }
    }

    fn rent(&mut self, bytes: usize) -> Expect {
        let Some(blocks) = class_blocks(bytes) else {
            return Expect::Empty;
        };
        let class_bytes = blocks * 64;

        // Hit: the most recently returned idle buffer of the same class.
        if let Some(i) = self.idle.iter().rposition(|b| b.blocks == blocks) {
            let b = self.idle.remove(i);
            self.stats.hits += 1;
            self.stats.bytes_cached -= class_bytes;
            self.take(bytes, class_bytes);
            return Expect::Hit { ptr: b.ptr };
        }

        // Miss: refused if the buffers in use alone would pass the budget.
        if self.stats.bytes_in_use + class_bytes > self.max_bytes {
            self.stats.failed_rents += 1;
            return Expect::Fail(Error::BudgetExceeded {
                requested: bytes,
                class_bytes,
                in_use: self.stats.bytes_in_use,
                cached: self.stats.bytes_cached,
                limit: self.max_bytes,
            });
        }

        // Otherwise evict idle buffers, least recently returned first, until the new one fits.
        while self.stats.bytes_in_use + self.stats.bytes_cached + class_bytes > self.max_bytes {
            if self.idle.is_empty() {
                break;
            }
            let b = self.idle.remove(0);
            self.stats.bytes_cached -= b.blocks * 64;
            self.stats.evictions += 1;
        }
        self.stats.misses += 1;
        self.stats.allocated_bytes += class_bytes as u64;
        self.take(bytes, class_bytes);
        Expect::Miss
    }

    fn take(&mut self, bytes: usize, class_bytes: usize) {
        let s = &mut self.stats;
        s.bytes_in_use += class_bytes;
        s.peak_bytes_in_use = s.peak_bytes_in_use.max(s.bytes_in_use);
        s.requested_bytes += bytes as u64;
        s.rented_bytes += class_bytes as u64;
    }

    fn give_back(&mut self, ptr: usize, blocks: usize) {
        self.idle.push(ModelIdle { ptr, blocks });
        self.stats.returns += 1;
        self.stats.bytes_in_use -= blocks * 64;
        self.stats.bytes_cached += blocks * 64;
    }

    fn clear(&mut self) {
        self.idle.clear();
        self.stats.bytes_cached = 0;
    }
}

/// A buffer held by the test, with what the model knows about it.
struct Slot {
    buf: Held,
    tag: u16,
    /// Size class in blocks; `None` for an empty buffer, which does not belong to the pool.
    blocks: Option<usize>,
    ptr: usize,
}

// ---------------------------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Rent {
        ty: Ty,
        shape: Vec<usize>,
        zeroed: bool,
    },
    /// Return the held buffer at this index modulo the number held (nothing if none is held).
    Drop(usize),
    Clear,
}

fn ty_strategy() -> impl Strategy<Value = Ty> {
    prop_oneof![Just(Ty::F32), Just(Ty::F64), Just(Ty::F16), Just(Ty::Bf16)]
}

fn op_strategy() -> impl Strategy<Value = Op> {
    // Small axes, so that many requests share a size class; zero-length axes are common.
    let small_shape = prop::collection::vec(0usize..=7, 0..=3);
    // One long axis: often more than the whole budget.
    let big_shape = (256usize..=4096).prop_map(|n| vec![n]);
    prop_oneof![
        12 => (ty_strategy(), small_shape, prop::bool::weighted(0.25))
            .prop_map(|(ty, shape, zeroed)| Op::Rent { ty, shape, zeroed }),
        1 => (ty_strategy(), big_shape, any::<bool>())
            .prop_map(|(ty, shape, zeroed)| Op::Rent { ty, shape, zeroed }),
        10 => any::<usize>().prop_map(Op::Drop),
        1 => Just(Op::Clear),
    ]
}

fn max_bytes_strategy() -> impl Strategy<Value = usize> {
    prop_oneof![
        1 => Just(0usize),
        2 => 1usize..=1024,
        6 => 512usize..=3072,
    ]
}

fn do_rent(
    pool: &Pool,
    model: &mut Model,
    slots: &mut Vec<Slot>,
    ty: Ty,
    shape: &[usize],
    zeroed: bool,
    tag: u16,
) {
    let elems: usize = shape.iter().product();
    let bytes = elems * ty.size();
    let expect = model.rent(bytes);
    let got = Held::rent(pool, ty, shape, zeroed);
    let mut buf = match (expect, got) {
        (Expect::Fail(want), Err(err)) => {
            assert_eq!(err, want, "rent of {bytes} bytes failed differently");
            return;
        }
        (Expect::Fail(want), Ok(buf)) => {
            panic!(
                "rent of {bytes} bytes succeeded ({} bytes at {:#x}), model expected {want:?}",
                buf.allocated_bytes(),
                buf.ptr()
            )
        }
        (expect, Err(err)) => {
            panic!("rent of {bytes} bytes failed with {err:?}, model expected {expect:?}")
        }
        (Expect::Empty, Ok(buf)) => {
            assert_eq!(buf.allocated_bytes(), 0, "empty rent took pool memory");
            buf
        }
        (Expect::Hit { ptr }, Ok(buf)) => {
            assert_eq!(
                buf.ptr(),
                ptr,
                "hit of {bytes} bytes did not get the most recently returned buffer of its class"
            );
            buf
        }
        (Expect::Miss, Ok(buf)) => {
            // A fresh allocation cannot overlap a buffer the model says is still cached.
            let (lo, hi) = (buf.ptr(), buf.ptr() + buf.allocated_bytes());
            for idle in &model.idle {
                let (ilo, ihi) = (idle.ptr, idle.ptr + idle.blocks * 64);
                assert!(
                    hi <= ilo || ihi <= lo,
                    "fresh buffer {lo:#x}..{hi:#x} overlaps idle buffer {ilo:#x}..{ihi:#x}: \
                     the pool evicted a different buffer than the model"
                );
            }
            buf
        }
    };
    let blocks = class_blocks(bytes);
    assert_eq!(buf.ty(), ty);
    assert_eq!(buf.len(), elems, "length of a rent of shape {shape:?}");
    assert_eq!(buf.allocated_bytes(), blocks.unwrap_or(0) * 64);
    assert_eq!(
        buf.ptr() % ALIGN,
        0,
        "buffer at {:#x} is not aligned",
        buf.ptr()
    );
    assert!(buf.pool().ptr_eq(pool));
    if zeroed {
        assert!(
            buf.is_all_zero(),
            "rent_zeroed gave a buffer that is not zero"
        );
    }
    buf.fill_tag(tag);
    slots.push(Slot {
        ptr: buf.ptr(),
        buf,
        tag,
        blocks,
    });
}

fn do_drop(model: &mut Model, slots: &mut Vec<Slot>, which: usize) {
    if slots.is_empty() {
        return;
    }
    let slot = slots.remove(which % slots.len());
    assert!(slot.buf.has_tag(slot.tag));
    if let Some(blocks) = slot.blocks {
        model.give_back(slot.ptr, blocks);
    }
    drop(slot.buf);
}

fn check(pool: &Pool, model: &Model, slots: &[Slot]) {
    let stats = pool.stats();
    assert_eq!(stats, model.stats, "pool stats differ from the model");
    assert_eq!(pool.memory_usage(), stats.bytes_in_use + stats.bytes_cached);
    assert!(pool.memory_usage() <= pool.max_bytes());
    let rents = stats.hits + stats.misses;
    if rents == 0 {
        assert_eq!(stats.hit_ratio(), 0.0);
    } else {
        assert_eq!(stats.hit_ratio(), stats.hits as f64 / rents as f64);
        assert!((0.0..=1.0).contains(&stats.hit_ratio()));
    }

    // The model's own bookkeeping adds up.
    let held_bytes: usize = slots.iter().map(|s| s.blocks.unwrap_or(0) * 64).sum();
    let idle_bytes: usize = model.idle.iter().map(|b| b.blocks * 64).sum();
    assert_eq!(held_bytes, stats.bytes_in_use);
    assert_eq!(idle_bytes, stats.bytes_cached);

    // Every held buffer is where it was, aligned, and still holds its own value.
    for s in slots {
        assert_eq!(s.buf.ptr(), s.ptr);
        assert_eq!(s.ptr % ALIGN, 0);
        assert!(
            s.buf.has_tag(s.tag),
            "a held {:?} buffer at {:#x} was overwritten",
            s.buf.ty(),
            s.ptr
        );
    }

    // No two held (non-empty) buffers overlap.
    let mut ranges: Vec<(usize, usize)> = slots
        .iter()
        .filter(|s| s.buf.allocated_bytes() > 0)
        .map(|s| (s.ptr, s.ptr + s.buf.allocated_bytes()))
        .collect();
    ranges.sort_unstable();
    for w in ranges.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "held buffers {:#x?} and {:#x?} overlap",
            w[0],
            w[1]
        );
    }
}

/// Checks `trace`, of a pool that started empty and ended with `stats`, against itself and the
/// counters: replaying its events' kinds from zero gives the bytes in use and cached that each
/// event records, and it holds as many rents, returns, evictions and failures as the pool counted.
fn check_trace(trace: &Trace, stats: &PoolStats) {
    let (mut in_use, mut cached) = (0usize, 0usize);
    let mut counted = PoolStats::default();
    for e in trace.events() {
        match e.kind {
            TraceEventKind::Rent {
                class_bytes, hit, ..
            } => {
                in_use += class_bytes;
                if hit {
                    cached -= class_bytes;
                    counted.hits += 1;
                } else {
                    counted.misses += 1;
                }
            }
            TraceEventKind::FailedRent { .. } => counted.failed_rents += 1,
            TraceEventKind::AllocationFailed { class_bytes } => {
                in_use -= class_bytes;
                counted.misses -= 1;
                counted.failed_rents += 1;
            }
            TraceEventKind::Return { class_bytes, freed } => {
                in_use -= class_bytes;
                if !freed {
                    cached += class_bytes;
                }
                counted.returns += 1;
            }
            TraceEventKind::Evict { class_bytes } => {
                cached -= class_bytes;
                counted.evictions += 1;
            }
            TraceEventKind::Clear { bytes } => {
                assert_eq!(bytes, cached, "a clear frees every idle byte");
                cached = 0;
            }
            other => panic!("no scope is opened here: {other:?}"),
        }
        assert_eq!((in_use, cached), (e.bytes_in_use, e.bytes_cached), "{e:?}");
        assert!(e.scope.is_none() && e.op.is_none() && e.segment.is_none());
    }
    assert_eq!(
        (
            counted.hits,
            counted.misses,
            counted.returns,
            counted.evictions,
            counted.failed_rents
        ),
        (
            stats.hits,
            stats.misses,
            stats.returns,
            stats.evictions,
            stats.failed_rents
        )
    );
}

/// Applies `ops` to a fresh pool and to the model, checking after every step (and, if `traced`,
/// the pool's trace of them all at the end); returns the stats as they were after the last op
/// (before the final returns).
fn run_ops(max_bytes: usize, ops: &[Op], traced: bool) -> PoolStats {
    let pool = Pool::new(PoolConfig::with_max_bytes(max_bytes));
    if traced {
        pool.start_trace();
    }
    let mut model = Model::new(max_bytes);
    let mut slots: Vec<Slot> = Vec::new();
    check(&pool, &model, &slots);
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Rent { ty, shape, zeroed } => {
                let tag = u16::try_from(i).unwrap() + 1;
                do_rent(&pool, &mut model, &mut slots, *ty, shape, *zeroed, tag);
            }
            Op::Drop(which) => do_drop(&mut model, &mut slots, *which),
            Op::Clear => {
                model.clear();
                pool.clear();
            }
        }
        check(&pool, &model, &slots);
    }
    let last = pool.stats();

    // Returning everything leaves nothing in use, and the pool within its budget.
    while !slots.is_empty() {
        do_drop(&mut model, &mut slots, 0);
        check(&pool, &model, &slots);
    }
    assert_eq!(pool.stats().bytes_in_use, 0);
    if traced {
        check_trace(&pool.finish_trace(), &pool.stats());
    }
    last
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn pool_matches_model(
        max_bytes in max_bytes_strategy(),
        ops in prop::collection::vec(op_strategy(), 1..=200),
        traced in any::<bool>(),
    ) {
        run_ops(max_bytes, &ops, traced);
    }
}

#[test]
fn model_size_classes_match_the_documented_sequence() {
    // 4, 5, 6, 7, 8, 10, 12, 14, 16, 20 ... blocks, as the module documentation lists.
    let mut classes: Vec<usize> = (1..=24 * 64).filter_map(class_blocks).collect();
    classes.dedup();
    assert_eq!(classes, [1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24]);
    // And the pool agrees with the model's rounding (probed with 2-byte elements).
    let pool = Pool::new(PoolConfig::with_max_bytes(1 << 20));
    for n in (1..=20_000).step_by(37) {
        let buf = pool.rent::<f16>(&[n]);
        assert_eq!(buf.allocated_bytes(), class_blocks(2 * n).unwrap() * 64);
    }
}

/// Runs the model over a fixed sequence that makes eviction order and ties matter, so a regression
/// there shows up even without the random search.
#[test]
fn eviction_order_on_a_fixed_sequence() {
    let small = |n: usize| Op::Rent {
        ty: Ty::F32,
        shape: vec![n],
        zeroed: false,
    };
    let ops = vec![
        small(16),   // 64 bytes
        small(64),   // 256 bytes
        small(128),  // 512 bytes
        Op::Drop(2), // 512 bytes,
        Op::Drop(0), // then 64,
        Op::Drop(0), // then 256, all between the same two rents
        // 1600 -> 1792 bytes: 576 cached bytes must go, in return order: the 512 and the 64-byte
        // buffers; the 256-byte one stays.
        small(400),
        // 64 bytes: its class was just evicted, so a miss, and now the 256-byte buffer must go.
        small(16),
        Op::Clear,
        small(300),  // 1200 -> 1280 bytes: 1856 in use, so refused
        Op::Drop(1), // the 64-byte buffer
        small(16),   // hit: the buffer just returned
    ];
    let s = run_ops(2048, &ops, true);
    assert_eq!(
        (s.hits, s.misses, s.evictions, s.failed_rents),
        (1, 5, 3, 1)
    );
}

#[test]
fn strategies_exercise_hits_evictions_and_failures() {
    // A small batch of cases of its own, totalling what the random sequences exercised.
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 32,
        ..ProptestConfig::default()
    });
    let total = std::cell::Cell::new(PoolStats::default());
    runner
        .run(
            &(
                max_bytes_strategy(),
                prop::collection::vec(op_strategy(), 1..=200),
            ),
            |(max_bytes, ops)| {
                let s = run_ops(max_bytes, &ops, false);
                let mut t = total.get();
                t.hits += s.hits;
                t.misses += s.misses;
                t.evictions += s.evictions;
                t.failed_rents += s.failed_rents;
                total.set(t);
                Ok(())
            },
        )
        .unwrap();
    let t = total.get();
    assert!(t.hits > 0, "no hits: {t:?}");
    assert!(t.misses > 0, "no misses: {t:?}");
    assert!(t.evictions > 0, "no evictions: {t:?}");
    assert!(t.failed_rents > 0, "no failed rents: {t:?}");
}

// ---------------------------------------------------------------------------------------------
// Threads
// ---------------------------------------------------------------------------------------------

/// A tiny xorshift generator, so each thread's sequence is reproducible.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    fn below(&mut self, n: u64) -> usize {
        (self.next() % n) as usize
    }
}

#[test]
fn threads_share_one_pool() {
    const THREADS: usize = 4;
    const CYCLES: usize = 3000;
    const MAX_HELD: usize = 3;
    let pool = Pool::new(PoolConfig::with_max_bytes(48 * 1024));
    // Traced: events are recorded under the lock that changes the figures, so the trace replays
    // exactly whatever the threads' interleaving.
    pool.start_trace();

    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let pool = pool.clone();
            thread::spawn(move || {
                let mut rng = XorShift(0x9e37_79b9_7f4a_7c15 ^ ((t as u64 + 1) * 0x1234_5678_9abc));
                let mut held: Vec<(Held, u16)> = Vec::new();
                let (mut ok, mut failed) = (0u64, 0u64);
                for i in 0..CYCLES {
                    let ty = [Ty::F32, Ty::F64, Ty::F16, Ty::Bf16][rng.below(4)];
                    let len = rng.below(1536);
                    let zeroed = rng.below(4) == 0;
                    match Held::rent(&pool, ty, &[len], zeroed) {
                        Ok(mut buf) => {
                            assert!(buf.pool().ptr_eq(&pool));
                            assert_eq!(buf.len(), len);
                            assert_eq!(buf.ptr() % ALIGN, 0);
                            if zeroed {
                                assert!(buf.is_all_zero());
                            }
                            // Thread above, cycle below: unique among the live buffers.
                            let tag = ((t as u16) << 12) | (i as u16 & 0x0fff);
                            buf.fill_tag(tag);
                            if len > 0 {
                                ok += 1;
                            }
                            held.push((buf, tag));
                        }
                        Err(Error::BudgetExceeded { .. }) => failed += 1,
                        Err(e) => panic!("unexpected error {e}"),
                    }
                    for (buf, tag) in &held {
                        assert!(
                            buf.has_tag(*tag),
                            "thread {t}: a held buffer was overwritten"
                        );
                    }
                    while held.len() >= MAX_HELD || (!held.is_empty() && rng.below(2) == 0) {
                        let (buf, tag) = held.swap_remove(rng.below(held.len() as u64));
                        assert!(buf.has_tag(tag));
                        drop(buf);
                    }
                }
                for (buf, tag) in held {
                    assert!(buf.has_tag(tag));
                }
                (ok, failed)
            })
        })
        .collect();

    let (mut ok, mut failed) = (0u64, 0u64);
    for h in handles {
        let (o, f) = h.join().unwrap();
        ok += o;
        failed += f;
    }
    let s = pool.stats();
    assert_eq!(s.bytes_in_use, 0);
    assert_eq!(s.hits + s.misses, ok);
    assert_eq!(s.returns, s.hits + s.misses);
    assert_eq!(s.failed_rents, failed);
    assert_eq!(pool.memory_usage(), s.bytes_cached);
    assert!(s.bytes_cached <= pool.max_bytes());
    assert!(s.peak_bytes_in_use <= pool.max_bytes());
    assert!(s.hits > 0 && s.misses > 0, "{s:?}");
    let trace = pool.finish_trace();
    check_trace(&trace, &s);
    let threads: std::collections::BTreeSet<u64> =
        trace.events().iter().map(|e| e.thread).collect();
    assert_eq!(threads.len(), THREADS);
}
