//! Elementwise loops compiled three times (AVX-512, AVX2, baseline) and chosen at run time by the
//! CPU's features, so that one build vectorises as wide as the machine allows: the kernels of
//! `element::kernels` run 2x faster with AVX2 and 4x faster with AVX-512 than with the SSE2 that every
//! x86-64 has (measured in `docs/benchmarks.md`). Other targets run the baseline loop.
//!
//! The same IEEE operations run at every width (Rust never fuses `a * b + c` into an FMA on its
//! own, and sums over a lane keep a fixed order, `ops::lanes`), so every level gives the same
//! bits, NaN payloads aside (tested below for every kernel loop and its backward). Loops that
//! want FMA say so ([`FmaKernel`]: the matrix products) and get an AVX2 + FMA variant.
//!
//! Large loops are split over the worker threads ([`crate::threads`]).
//!
//! The `unsafe` here is calling a function compiled for features the CPU is first checked to have.
#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::__m512;

use crate::element::Element;

/// A loop to run at the widest vector width the CPU has. `run` must be `#[inline(always)]`, and so
/// must the closures it calls, so that the whole loop compiles inside each width's function rather
/// than being called from it: `for` loops, not `Iterator::for_each`, whose closure would not be
/// inlined across codegen units.
pub(crate) trait Kernel {
    type Out;
    fn run(self) -> Self::Out;
}

/// The instruction sets [`dispatch`] compiles a loop for, narrowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Level {
    /// The target's baseline (SSE2 on x86-64).
    Baseline,
    /// AVX2.
    Avx2,
    /// AVX-512 (F, VL, DQ, BW).
    Avx512,
    /// AVX-512 with BF16: loops run as at [`Level::Avx512`], and the bf16 products multiply pairs
    /// of bf16s with `vdpbf16ps` ([`tile_bf16_avx512`]).
    Avx512Bf16,
}

#[cfg(test)]
thread_local! {
    /// The widest level [`dispatch`] may use on this thread: tests lower it to run each variant.
    static WIDEST: std::cell::Cell<Level> = const { std::cell::Cell::new(Level::Avx512Bf16) };
    /// The level [`dispatch`] last ran a loop at on this thread.
    static USED: std::cell::Cell<Option<Level>> = const { std::cell::Cell::new(None) };
}

/// Notes that a loop runs at `level` (in tests, for checking the levels they ask for).
#[inline(always)]
fn note(level: Level) {
    #[cfg(test)]
    USED.set(Some(level));
    #[cfg(not(test))]
    let _ = level;
}

/// Runs `f` with [`dispatch`] (and the products' choice of tile) held to `level` on this thread.
#[cfg(test)]
pub(crate) fn with_widest<R>(level: Level, f: impl FnOnce() -> R) -> R {
    crate::autograd::with_local(&WIDEST, level, f)
}

/// The widest level [`dispatch`] may use: all of them, except in a test that lowers it.
#[inline(always)]
fn widest() -> Level {
    #[cfg(test)]
    return WIDEST.get();
    #[cfg(not(test))]
    Level::Avx512Bf16
}

/// Runs `k` compiled for the widest instruction set this CPU has.
#[inline]
pub(crate) fn dispatch<K: Kernel>(k: K) -> K::Out {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx512() {
            note(Level::Avx512);
            // SAFETY: the CPU has every feature `avx512` is compiled for (checked just above),
            // which is the only requirement of calling it.
            return unsafe { avx512(k) };
        }
        if widest() >= Level::Avx2 && std::is_x86_feature_detected!("avx2") {
            note(Level::Avx2);
            // SAFETY: the CPU has AVX2 (checked just above), the only feature `avx2` needs.
            return unsafe { avx2(k) };
        }
    }
    note(Level::Baseline);
    k.run()
}

/// A loop using `mul_add`, which compiles to one instruction with FMA and to a slow library call
/// without it: with `FMA` false it must use `a * b + c` instead. Inline as for [`Kernel`].
pub(crate) trait FmaKernel {
    type Out;
    fn run<const FMA: bool>(self) -> Self::Out;
}

/// Runs `k` with FMA, compiled for AVX2 and FMA, if the CPU has both; else without, at the baseline.
#[inline]
pub(crate) fn dispatch_fma<K: FmaKernel>(k: K) -> K::Out {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX2 and FMA (checked just above), all `avx2_fma` needs.
            return unsafe { avx2_fma(k) };
        }
    }
    k.run::<false>()
}

/// Runs `k` with FMA at the widest level: compiled for AVX-512 (whose 32 registers hold more
/// sums) where [`dispatch`] would use it, else as [`dispatch_fma`].
#[inline]
pub(crate) fn dispatch_fma_wide<K: FmaKernel>(k: K) -> K::Out {
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        note(Level::Avx512);
        // SAFETY: the CPU has every feature `avx512_fma` is compiled for (checked just above:
        // AVX-512 F, VL, DQ and BW, and F implies FMA), which is the only requirement of calling
        // it.
        return unsafe { avx512_fma(k) };
    }
    dispatch_fma(k)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512dq,avx512bw,fma")]
unsafe fn avx512_fma<K: FmaKernel>(k: K) -> K::Out {
    k.run::<true>()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn avx2_fma<K: FmaKernel>(k: K) -> K::Out {
    k.run::<true>()
}

/// Whether [`dispatch`] runs loops at the AVX-512 level, and the matrix products use
/// [`tile_f32_avx512`]: the CPU has AVX-512 F, VL, DQ and BW (and no test lowered the level).
#[inline]
pub(crate) fn has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    return widest() >= Level::Avx512
        && std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("avx512vl")
        && std::is_x86_feature_detected!("avx512dq")
        && std::is_x86_feature_detected!("avx512bw");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the bf16 products multiply pairs of bf16s with [`tile_bf16_avx512`]: the CPU has
/// AVX512-BF16 besides what [`has_avx512`] asks (and no test lowered the level).
#[inline]
pub(crate) fn has_avx512_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    return widest() >= Level::Avx512Bf16
        && has_avx512()
        && std::is_x86_feature_detected!("avx512bf16");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Where a product's tile goes (`ops::gemm`'s output window implements it): the tile code here
/// names no type of the product's, so the products depend on these loops and not the reverse.
pub(crate) trait TileOut<'c, T: 'c>: Sized {
    /// The rows and columns of the tile that are stored.
    fn size(&self) -> (usize, usize);
    /// Whether the sums are added to what is there (the sums of earlier steps along `k`).
    fn adds(&self) -> bool;
    /// Stores (or adds) `tile`, the part of it that fits.
    fn store<const MR: usize, const NR: usize>(self, tile: &[[T; NR]; MR]);
    /// The rows of the window the tile covers, first to last.
    fn into_rows(self) -> impl Iterator<Item = &'c mut [T]>;
}

/// The `MR x 32` tile `sum_p a(p)[i] b[p][j]` over `p < depth` of `f32` (as `ops::gemm`'s generic
/// tile computes it), in two 512-bit registers per row, stored to `out`; `Err(out)` untouched if
/// the CPU lacks AVX-512. LLVM does not keep a tile this wide in registers when it vectorises the
/// generic loop itself (it stored every accumulator at every step), so this one is written with
/// AVX-512 intrinsics; the sums are the same FMAs in the same order, so the bits are the generic
/// tile's with FMA.
#[inline(always)]
pub(crate) fn tile_f32_avx512<'c, T: Element, O: TileOut<'c, T>, const MR: usize>(
    depth: usize,
    b: &[[f32; 32]],
    a: impl Fn(usize) -> [f32; MR],
    out: O,
) -> Result<(), O> {
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: the CPU has AVX-512F (checked just above, with more), the one feature
        // `tile_avx512` is compiled for.
        unsafe { tile_avx512(depth, b, a, out) };
        return Ok(());
    }
    let _ = (depth, b, a);
    Err(out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn tile_avx512<'c, T: Element, O: TileOut<'c, T>, const MR: usize>(
    depth: usize,
    b: &[[f32; 32]],
    a: impl Fn(usize) -> [f32; MR],
    out: O,
) {
    use std::arch::x86_64::{_mm512_add_ps, _mm512_fmadd_ps, _mm512_set1_ps};
    tile_zmm(
        (depth, b, a, out),
        #[inline(always)]
        |acc, a, b| _mm512_fmadd_ps(_mm512_set1_ps(a), b, acc),
        #[inline(always)]
        |x, y| _mm512_add_ps(x, y),
    )
}

/// The `MR x 32` tile of `f32` sums `sum_q a(q)[i] . b[q][j]` over the packed steps `q < steps`,
/// each slot a pair of bf16s along `k` (the even element in the low half): in two 512-bit
/// registers per row, each step of a row one `vdpbf16ps` per register, which adds both products
/// of 16 pairs, the odd one first (products of bf16s are exact in `f32`; the instruction reads
/// subnormal inputs as zero and flushes subnormal sums to zero). Stored to `out`; `Err(out)`
/// untouched if the CPU lacks AVX512-BF16.
#[inline(always)]
pub(crate) fn tile_bf16_avx512<'c, T: Element, O: TileOut<'c, T>, const MR: usize>(
    steps: usize,
    b: &[[u32; 32]],
    a: impl Fn(usize) -> [u32; MR],
    out: O,
) -> Result<(), O> {
    #[cfg(target_arch = "x86_64")]
    if has_avx512_bf16() {
        // SAFETY: the CPU has AVX-512F and AVX512-BF16 (checked just above), the features
        // `tile_bf16` is compiled for.
        unsafe { tile_bf16(steps, b, a, out) };
        return Ok(());
    }
    let _ = (steps, b, a);
    Err(out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
fn tile_bf16<'c, T: Element, O: TileOut<'c, T>, const MR: usize>(
    steps: usize,
    b: &[[u32; 32]],
    a: impl Fn(usize) -> [u32; MR],
    out: O,
) {
    use std::arch::x86_64::{__m512bh, _mm512_add_ps, _mm512_dpbf16_ps, _mm512_set1_epi32};
    tile_zmm(
        (steps, b, a, out),
        #[inline(always)]
        |acc, a: u32, b| {
            let a: __m512bh = bytemuck::cast(_mm512_set1_epi32(a as i32));
            _mm512_dpbf16_ps(acc, a, bytemuck::cast(b))
        },
        #[inline(always)]
        |x, y| _mm512_add_ps(x, y),
    )
}

/// The `MR x 32` tile of `f32` sums over the packed steps of a sliver of `a` (step `p` given by
/// `a(p)`) and a sliver `b`, two 512-bit registers of sums per row, stored to `out`: each step
/// adds `a(p)[i]` times `b[p]` into row `i` with `step(sums, a(p)[i], half of b[p])`, and `add`
/// adds two registers. Written once for both tiles, which compile it inside their own features
/// (the two closures, made there, call the instructions; this function calls none).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn tile_zmm<'c, T: Element, O: TileOut<'c, T>, S: bytemuck::Pod, const MR: usize>(
    (steps, b, a, out): (usize, &[[S; 32]], impl Fn(usize) -> [S; MR], O),
    step: impl Fn(__m512, S, __m512) -> __m512,
    add: impl Fn(__m512, __m512) -> __m512,
) {
    let mut acc = [[<__m512 as bytemuck::Zeroable>::zeroed(); 2]; MR];
    for (p, b) in b[..steps].iter().enumerate() {
        let [lo, hi]: [__m512; 2] = bytemuck::cast(*b);
        let a = a(p);
        for i in 0..MR {
            acc[i][0] = step(acc[i][0], a[i], lo);
            acc[i][1] = step(acc[i][1], a[i], hi);
        }
    }
    // `T` is `f32` (the casts check it).
    if out.size() != (MR, 32) {
        return out.store::<MR, 32>(&bytemuck::cast(acc));
    }
    // A whole tile: each row of `c` read (when adding) and written as two vectors. (The sums are
    // taken by value: iterated by reference, LLVM kept them in a stack array it zeroed on every
    // call.)
    let adds = out.adds();
    for ([lo_sum, hi_sum], row) in acc.into_iter().zip(out.into_rows()) {
        let row: &mut [f32; 32] = bytemuck::cast_slice_mut::<T, f32>(row)
            .try_into()
            .expect("32 columns");
        let sum = if adds {
            let [lo, hi]: [__m512; 2] = bytemuck::cast(*row);
            [add(lo, lo_sum), add(hi, hi_sum)]
        } else {
            [lo_sum, hi_sum]
        };
        *row = bytemuck::cast(sum);
    }
}

/// `W` lines of `f32` (`W` a multiple of 4: the rows of `a` a sliver of the 12-row tile holds, or
/// the rows of a transposed `b` a 32-wide sliver holds) into `sliver`, step by step:
/// `sliver[p][w] = lines[w][p]`, each line at least `sliver.len()` long. Eight steps of eight
/// lines at a time are transposed in AVX2 registers (a last four lines, four at a time), where LLVM
/// moved the generic loop's elements one at a time through the stack. `false`, with nothing
/// written, if the CPU lacks AVX2 or `W` is not a multiple of 4.
#[inline(always)]
pub(crate) fn transpose_f32<const W: usize>(lines: [&[f32]; W], sliver: &mut [[f32; W]]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if W.is_multiple_of(4) && std::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked just above), the one feature `transpose_avx2` is
        // compiled for.
        unsafe { transpose_avx2(lines, sliver) };
        return true;
    }
    let _ = (lines, sliver);
    false
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn transpose_avx2<const W: usize>(lines: [&[f32]; W], sliver: &mut [[f32; W]]) {
    use std::arch::x86_64::{
        __m256, _mm256_permute2f128_ps as lanes, _mm256_shuffle_ps as shuffle,
        _mm256_unpackhi_ps as high, _mm256_unpacklo_ps as low,
    };
    let (blocks, rest) = sliver.as_chunks_mut::<8>();
    let load = |w: usize, i: usize| {
        bytemuck::cast::<[f32; 8], __m256>(lines[w][8 * i..][..8].try_into().expect("8"))
    };
    let u = |a: __m256, b: __m256| [shuffle::<0x44>(a, b), shuffle::<0xEE>(a, b)];
    for (i, block) in blocks.iter_mut().enumerate() {
        for g in 0..W / 8 {
            let r: [__m256; 8] = std::array::from_fn(|w| load(8 * g + w, i));
            // Pairs interleaved, then fours (step s of four lines in the low half, s + 4 in the
            // high), then halves swapped between the fours: step q of all eight lines.
            let t: [__m256; 8] = std::array::from_fn(|j| {
                let (a, b) = (r[2 * (j / 2)], r[2 * (j / 2) + 1]);
                if j % 2 == 0 {
                    low(a, b)
                } else {
                    high(a, b)
                }
            });
            let [u0, u1] = u(t[0], t[2]);
            let [u2, u3] = u(t[1], t[3]);
            let [u4, u5] = u(t[4], t[6]);
            let [u6, u7] = u(t[5], t[7]);
            let eight: [[f32; 8]; 8] = [
                lanes::<0x20>(u0, u4),
                lanes::<0x20>(u1, u5),
                lanes::<0x20>(u2, u6),
                lanes::<0x20>(u3, u7),
                lanes::<0x31>(u0, u4),
                lanes::<0x31>(u1, u5),
                lanes::<0x31>(u2, u6),
                lanes::<0x31>(u3, u7),
            ]
            .map(bytemuck::cast);
            for (q, step) in block.iter_mut().enumerate() {
                step[8 * g..][..8].copy_from_slice(&eight[q]);
            }
        }
        if W % 8 == 4 {
            // The last four lines: steps q and q + 4 of the four in one register.
            let r: [__m256; 4] = std::array::from_fn(|w| load(W - 4 + w, i));
            let [v0, v1] = u(low(r[0], r[1]), low(r[2], r[3]));
            let [v2, v3] = u(high(r[0], r[1]), high(r[2], r[3]));
            let four: [[f32; 8]; 4] = [v0, v1, v2, v3].map(bytemuck::cast);
            for (q, step) in block.iter_mut().enumerate() {
                step[W - 4..].copy_from_slice(&four[q % 4][4 * (q / 4)..][..4]);
            }
        }
    }
    let done = 8 * blocks.len();
    for (q, step) in rest.iter_mut().enumerate() {
        *step = std::array::from_fn(|w| lines[w][done + q]);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vl,avx512dq,avx512bw")]
unsafe fn avx512<K: Kernel>(k: K) -> K::Out {
    k.run()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn avx2<K: Kernel>(k: K) -> K::Out {
    k.run()
}

/// Elements per thread below which an elementwise loop is not split: waking a worker costs about
/// as much as this many elements of the cheapest op.
const PER_PART: usize = 1 << 16;

/// `x = f(x)` for every element, split over the threads when `xs` is large.
pub(crate) fn map_in_place<T: Copy + Send>(xs: &mut [T], f: impl Fn(T) -> T + Sync) {
    struct Map<'a, T, F>(&'a mut [T], &'a F);
    impl<T: Copy, F: Fn(T) -> T> Kernel for Map<'_, T, F> {
        type Out = ();
        #[inline(always)]
        fn run(self) {
            let Map(xs, f) = self;
            for x in xs {
                *x = (*f)(*x);
            }
        }
    }
    super::split_mut(xs, 1, PER_PART, |_, xs| dispatch(Map(xs, &f)));
}

/// `dst[i] = f(src[i])`, split over the threads when large.
pub(crate) fn map_into<T: Copy + Sync, U: Send>(
    dst: &mut [U],
    src: &[T],
    f: impl Fn(T) -> U + Sync,
) {
    struct Map<'a, T, U, F>(&'a mut [U], &'a [T], &'a F);
    impl<T: Copy, U, F: Fn(T) -> U> Kernel for Map<'_, T, U, F> {
        type Out = ();
        #[inline(always)]
        fn run(self) {
            let Map(dst, src, f) = self;
            for (d, &x) in dst.iter_mut().zip(src) {
                *d = (*f)(x);
            }
        }
    }
    super::split_mut(dst, 1, PER_PART, |start, dst| {
        dispatch(Map(dst, &src[start..], &f))
    });
}

/// `(w[i], s(i)) = f(w[i], s(i), g[i])` for every element: an optimizer's update of a parameter
/// `w` and its states `S` (one slice, or a pair) from the gradient `g`, compiled for the widest
/// instruction set (not split over threads).
pub(crate) fn update<T: Copy, S: States<T>>(
    w: &mut [T],
    states: S,
    g: &[T],
    f: impl Fn(T, S::Values, T) -> (T, S::Values),
) {
    struct Update<'a, T, S, F>(&'a mut [T], S, &'a [T], &'a F);
    impl<T: Copy, S: States<T>, F: Fn(T, S::Values, T) -> (T, S::Values)> Kernel
        for Update<'_, T, S, F>
    {
        type Out = ();
        #[inline(always)]
        fn run(self) {
            let Update(w, states, g, f) = self;
            states.zip(w, g, f);
        }
    }
    dispatch(Update(w, states, g, &f));
}

/// The per-element states of an optimizer: one slice, or a pair of them, walked beside the
/// parameter and the gradient.
pub(crate) trait States<T> {
    /// The states of one element.
    type Values: Copy;
    /// `(w[i], states of i) = f(w[i], states of i, g[i])` for every element, the slices zipped so
    /// that the loop vectorises.
    fn zip(self, w: &mut [T], g: &[T], f: &impl Fn(T, Self::Values, T) -> (T, Self::Values));
}

impl<T: Copy> States<T> for &mut [T] {
    type Values = T;
    #[inline(always)]
    fn zip(self, w: &mut [T], g: &[T], f: &impl Fn(T, T, T) -> (T, T)) {
        for ((w, s), &g) in w.iter_mut().zip(self).zip(g) {
            (*w, *s) = f(*w, *s, g);
        }
    }
}

impl<T: Copy> States<T> for (&mut [T], &mut [T]) {
    type Values = (T, T);
    #[inline(always)]
    fn zip(self, w: &mut [T], g: &[T], f: &impl Fn(T, (T, T), T) -> (T, (T, T))) {
        for ((w, (s, t)), &g) in w.iter_mut().zip(self.0.iter_mut().zip(self.1)).zip(g) {
            (*w, (*s, *t)) = f(*w, (*s, *t), g);
        }
    }
}

/// `dst[i] = f(dst[i], other[i % other.len()])`: `other` the same length as `dst`, or a block
/// repeated along it (a bias row over a batch). Split over the threads when large.
pub(crate) fn zip_in_place<T: Copy + Send + Sync>(
    dst: &mut [T],
    other: &[T],
    f: impl Fn(T, T) -> T + Sync,
) {
    struct Zip<'a, T, F>(&'a mut [T], &'a [T], &'a F);
    impl<T: Copy, F: Fn(T, T) -> T> Kernel for Zip<'_, T, F> {
        type Out = ();
        #[inline(always)]
        fn run(self) {
            let Zip(dst, other, f) = self;
            for chunk in dst.chunks_exact_mut(other.len()) {
                for (d, &o) in chunk.iter_mut().zip(other) {
                    *d = (*f)(*d, o);
                }
            }
        }
    }
    if other.is_empty() {
        return;
    }
    if other.len() == dst.len() {
        // Same length: any split lines up.
        super::split_mut(dst, 1, PER_PART, |start, dst| {
            dispatch(Zip(dst, &other[start..][..dst.len()], &f))
        });
    } else {
        // Runs of whole repeats of `other`.
        let repeats = PER_PART.div_ceil(other.len());
        super::split_mut(dst, other.len(), repeats, |_, dst| {
            dispatch(Zip(dst, other, &f))
        });
    }
}

/// `dst[i] = f(a[i], b[i])`, the three of one length, split over the threads when large.
pub(crate) fn zip_into<T: Copy + Sync, U: Send>(
    dst: &mut [U],
    a: &[T],
    b: &[T],
    f: impl Fn(T, T) -> U + Sync,
) {
    struct Zip<'a, T, U, F>(&'a mut [U], &'a [T], &'a [T], &'a F);
    impl<T: Copy, U, F: Fn(T, T) -> U> Kernel for Zip<'_, T, U, F> {
        type Out = ();
        #[inline(always)]
        fn run(self) {
            let Zip(dst, a, b, f) = self;
            for (d, (&x, &y)) in dst.iter_mut().zip(a.iter().zip(b)) {
                *d = (*f)(x, y);
            }
        }
    }
    super::split_mut(dst, 1, PER_PART, |start, dst| {
        dispatch(Zip(dst, &a[start..], &b[start..], &f))
    });
}

/// One strided operand of a walk's run: element `i` at `values[i * step]` (`step` 0: the same
/// element throughout, a broadcast).
pub(crate) type Strided<'a, T> = (&'a [T], usize);

/// `dst[i] = f(a[i], b[i])` for one run of a [`Walk`](crate::dims::Walk), its operands strided;
/// contiguous and broadcast operands get loops that vectorise. Not split over threads: runs are
/// short, and the walk's callers count their rows as one visit.
pub(crate) fn zip_strided<T: Copy>(
    dst: &mut [T],
    a: Strided<'_, T>,
    b: Strided<'_, T>,
    f: impl Fn(T, T) -> T,
) {
    struct Zip<'a, T, F>(&'a mut [T], Strided<'a, T>, Strided<'a, T>, &'a F);
    impl<T: Copy, F: Fn(T, T) -> T> Kernel for Zip<'_, T, F> {
        type Out = ();
        #[inline(always)]
        fn run(self) {
            let Zip(dst, (a, sa), (b, sb), f) = self;
            let n = dst.len();
            match (sa, sb) {
                (1, 1) => {
                    for (d, (&x, &y)) in dst.iter_mut().zip(a[..n].iter().zip(&b[..n])) {
                        *d = (*f)(x, y);
                    }
                }
                (1, 0) => {
                    for (d, &x) in dst.iter_mut().zip(&a[..n]) {
                        *d = (*f)(x, b[0]);
                    }
                }
                (0, 1) => {
                    for (d, &y) in dst.iter_mut().zip(&b[..n]) {
                        *d = (*f)(a[0], y);
                    }
                }
                _ => {
                    for (i, d) in dst.iter_mut().enumerate() {
                        *d = (*f)(a[i * sa], b[i * sb]);
                    }
                }
            }
        }
    }
    dispatch(Zip(dst, a, b, &f));
}

/// Applies `kernel(lane, [the same lane of each of srcs])` to every `lane`-long run of `dst` (the
/// lanes along a last axis), `srcs` as long as `dst`; split over the threads when large. `lane`
/// is not 0.
pub(crate) fn lanes<T: Send + Sync, const N: usize>(
    dst: &mut [T],
    srcs: [&[T]; N],
    lane: usize,
    kernel: impl Fn(&mut [T], [&[T]; N]) + Sync,
) {
    struct Lanes<'a, T, F, const N: usize>(&'a mut [T], [&'a [T]; N], usize, &'a F);
    impl<T, F: Fn(&mut [T], [&[T]; N]), const N: usize> Kernel for Lanes<'_, T, F, N> {
        type Out = ();
        #[inline(always)]
        fn run(self) {
            let Lanes(dst, srcs, lane, f) = self;
            for (i, d) in dst.chunks_exact_mut(lane).enumerate() {
                (*f)(d, std::array::from_fn(|k| &srcs[k][i * lane..][..lane]));
            }
        }
    }
    let per_part = PER_PART.div_ceil(lane);
    super::split_mut(dst, lane, per_part, |start, dst| {
        dispatch(Lanes(dst, srcs.map(|s| &s[start..]), lane, &kernel))
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Pool, Tensor, TensorOps};

    /// The levels this CPU runs.
    fn levels() -> Vec<Level> {
        let mut levels = vec![Level::Baseline];
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2") {
                levels.push(Level::Avx2);
            }
            if has_avx512() {
                levels.push(Level::Avx512);
            }
        }
        levels
    }

    type Op = dyn for<'s> Fn(&Tensor<'s, f32>) -> Tensor<'s, f32>;

    /// The bits of `op` of `xs` (as `[.., 100]`), NaNs made one, and of its input's gradient for an upstream
    /// gradient `w`, with `dispatch` held to `level`. Small enough to run as one part, on this
    /// thread.
    fn run(level: Level, xs: &[f32], w: &[f32], op: &Op) -> Vec<u32> {
        let pool = Pool::with_max_memory_mb(16);
        let out = with_widest(level, || {
            pool.train(|s| {
                let shape = [xs.len() / 100, 100];
                let x = s.from_slice::<f32>(&shape, xs).requires_grad();
                let y = op(&x);
                let g = y.backward_with(&s.from_slice::<f32>(&shape, w)).unwrap();
                let mut out = y.to_vec();
                out.extend(g.of(&x).unwrap().to_vec());
                out
            })
        });
        assert_eq!(
            USED.get(),
            Some(level),
            "the loops ran at the level asked for"
        );
        USED.set(None);
        // A NaN's sign and payload depend on which operand an instruction passed on, which the
        // vectoriser may order differently: every NaN counts as one value.
        out.into_iter()
            .map(|v| if v.is_nan() { f32::NAN } else { v }.to_bits())
            .collect()
    }

    #[test]
    fn lines_transposed_step_by_step() {
        fn check<const W: usize>() {
            // 19 steps: two blocks of eight in registers and three left over.
            let data: Vec<Vec<f32>> = (0..W)
                .map(|w| (0..19).map(|p| (100 * w + p) as f32).collect())
                .collect();
            let lines: [&[f32]; W] = std::array::from_fn(|w| &data[w][..]);
            let mut sliver = [[0.0f32; W]; 19];
            if transpose_f32(lines, &mut sliver) {
                for (p, step) in sliver.iter().enumerate() {
                    assert_eq!(
                        *step,
                        std::array::from_fn(|w| data[w][p]),
                        "{W} lines, step {p}"
                    );
                }
            } else {
                assert_eq!(sliver, [[0.0; W]; 19], "nothing written without AVX2");
            }
        }
        check::<4>();
        check::<12>();
        check::<16>();
        check::<32>();
    }

    #[test]
    fn every_level_gives_the_same_bits() {
        let mut xs: Vec<f32> = (0..8000).map(|i| (i as f32 - 4000.0) / 150.0).collect();
        xs.extend([
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            1e-40,
            -1e-40,
            100.0,
        ]);
        xs.resize(8100, 0.5);
        let w: Vec<f32> = (0..xs.len()).map(|i| (i % 13) as f32 / 6.0 - 1.0).collect();
        let ops: [(&str, &Op); 17] = [
            ("tanh", &|t| t.tanh()),
            ("exp", &|t| t.exp()),
            ("log", &|t| t.abs().log()),
            ("erf", &|t| t.erf()),
            ("gelu", &|t| t.gelu()),
            ("gelu_erf", &|t| t.gelu_erf()),
            ("sigmoid", &|t| t.sigmoid()),
            ("silu", &|t| t.silu()),
            ("relu", &|t| t.relu()),
            ("sqrt", &|t| t.abs().sqrt()),
            ("clamp", &|t| t.clamp(-1.0, 2.0)),
            ("product", &|t| t * &t.tanh()),
            ("softmax", &|t| t.softmax(-1)),
            ("log_softmax", &|t| t.log_softmax(-1)),
            ("softmax axis 0", &|t| t.softmax(0)),
            ("layer_norm", &|t| t.layer_norm(1e-5)),
            ("rms_norm", &|t| t.rms_norm(1e-5)),
        ];
        let levels = levels();
        for (name, op) in ops {
            let baseline = run(Level::Baseline, &xs, &w, op);
            for &level in &levels[1..] {
                let got = run(level, &xs, &w, op);
                let first = got.iter().zip(&baseline).position(|(a, b)| a != b);
                assert_eq!(first, None, "{name}: {level:?} differs from the baseline");
            }
        }
    }
}
