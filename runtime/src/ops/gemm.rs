//! Matrix products of `f32` and `f64`: packed, cache-blocked kernels in the manner of BLIS and
//! `matrixmultiply`, written in safe Rust that compiles to FMA vector code (AVX2 + FMA, chosen at
//! run time; the baseline elsewhere), split by rows over the worker threads of
//! [`crate::threads`].
//!
//! Unlike the crates it replaces (`matrixmultiply` allocates its packing buffer on every call,
//! `gemm` several buffers and rayon jobs), the packing buffers are per thread and only grow, so a
//! steady-state forward makes no heap allocation here.
//!
//! The blocking: `c` is computed in `NC`-column panels; each panel in `KC`-deep steps, for which
//! `KC x NC` of `b` is packed into `NR`-wide slivers; each step in `MC`-row blocks of `a`, packed
//! into `MR`-tall slivers; and every sliver pair is an `MR x NR` tile kept in registers.

use std::cell::RefCell;

use super::simd::{self, FmaKernel};
use crate::element::Element;
use crate::pool::Block;
use crate::threads;

/// Rows of `a` per packed block: `MC x KC` of `f32` is 216 KiB, inside a core's L2 cache.
const MC: usize = 144;
/// Depth of one packed step: a packed sliver of `b`, `KC x 16` of `f32`, is 24 KiB, inside L1.
const KC: usize = 384;
/// Columns of `b` per packed panel: `KC x NC` of `f32` is 1.5 MiB (L2/L3).
const NC: usize = 1024;

/// Multiply-adds per part below which a product is not split over threads: waking a worker costs
/// about as much as computing this many.
const PER_PART: usize = 1 << 19;

thread_local! {
    /// This thread's packing buffers (`a`'s block, then `b`'s panel); grown, never shrunk.
    static PACKED: RefCell<Vec<Block>> = const { RefCell::new(Vec::new()) };
}

/// `c = a b` for row-major `a: [m, k]`, `b: [k, n]`, `c: [m, n]`, with `T` `f32` or `f64`
/// ([`Element::GEMM`]).
pub(crate) fn product<T: Element>(a: &[T], b: &[T], c: &mut [T], (m, k, n): (usize, usize, usize)) {
    assert!(
        a.len() >= m * k && b.len() >= k * n && c.len() >= m * n,
        "gemm: slices shorter than [{m}, {k}] x [{k}, {n}] -> [{m}, {n}]"
    );
    let c = &mut c[..m * n];
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        // An empty sum: zeros, whatever the buffer held.
        c.fill(T::zero());
        return;
    }
    if std::mem::size_of::<T>() == 4 {
        split::<T, 6, 16>(a, b, c, (k, n));
    } else {
        split::<T, 6, 8>(a, b, c, (k, n));
    }
}

/// Splits `c` by runs of `MR` rows over the threads and computes each run's rows.
fn split<T: Element, const MR: usize, const NR: usize>(
    a: &[T],
    b: &[T],
    c: &mut [T],
    (k, n): (usize, usize),
) {
    let per_granule = MR * k * n;
    let min_granules = PER_PART.div_ceil(per_granule);
    threads::split_mut(c, MR * n, min_granules, |start, c| {
        let (row, rows) = (start / n, c.len() / n);
        let a = &a[row * k..(row + rows) * k];
        PACKED.with_borrow_mut(|packed| {
            let (pa, pb) = buffers::<T, MR, NR>(packed, (rows, k, n));
            simd::dispatch_fma(Blocked::<T, MR, NR>((a, b, c), (rows, k, n), (pa, pb)));
        });
    });
}

/// This thread's packing buffers for an `[m, k] x [k, n]` product, as `T`.
fn buffers<T: Element, const MR: usize, const NR: usize>(
    packed: &mut Vec<Block>,
    (m, k, n): (usize, usize, usize),
) -> (&mut [T], &mut [T]) {
    let kc = k.min(KC);
    let a_len = m.min(MC).next_multiple_of(MR) * kc;
    let b_len = n.min(NC).next_multiple_of(NR) * kc;
    let bytes = (a_len + b_len) * std::mem::size_of::<T>();
    let blocks = bytes.div_ceil(std::mem::size_of::<Block>());
    if packed.len() < blocks {
        packed.resize(blocks, bytemuck::Zeroable::zeroed());
    }
    let all: &mut [T] = bytemuck::cast_slice_mut(&mut packed[..blocks]);
    let (pa, rest) = all.split_at_mut(a_len);
    (pa, &mut rest[..b_len])
}

/// One thread's product, compiled with or without FMA (`mul_add` is a slow library call without
/// it).
struct Blocked<'a, T, const MR: usize, const NR: usize>(
    (&'a [T], &'a [T], &'a mut [T]),
    (usize, usize, usize),
    (&'a mut [T], &'a mut [T]),
);

impl<T: Element, const MR: usize, const NR: usize> FmaKernel for Blocked<'_, T, MR, NR> {
    type Out = ();

    #[inline(always)]
    fn run<const FMA: bool>(self) {
        let Blocked((a, b, c), (m, k, n), (pa, pb)) = self;
        for jc in (0..n).step_by(NC) {
            let nc = NC.min(n - jc);
            for pc in (0..k).step_by(KC) {
                let kc = KC.min(k - pc);
                let pb = &mut pb[..nc.next_multiple_of(NR) * kc];
                pack::<T, NR>(pb, b, n, (pc, kc), (jc, nc), Layout::RowsAlongK);
                for ic in (0..m).step_by(MC) {
                    let mc = MC.min(m - ic);
                    let pa = &mut pa[..mc.next_multiple_of(MR) * kc];
                    pack::<T, MR>(pa, a, k, (pc, kc), (ic, mc), Layout::ColumnsAlongK);
                    for (jr, b_sliver) in pb.chunks_exact(NR * kc).enumerate() {
                        for (ir, a_sliver) in pa.chunks_exact(MR * kc).enumerate() {
                            let tile = tile::<T, MR, NR, FMA>(a_sliver, b_sliver);
                            let (row, col) = (ic + ir * MR, jc + jr * NR);
                            let (rows, cols) = (MR.min(m - row), NR.min(n - col));
                            for (i, tile_row) in tile.iter().enumerate().take(rows) {
                                let out = &mut c[(row + i) * n + col..][..cols];
                                match (<&mut [T; NR]>::try_from(&mut *out), pc) {
                                    // A whole row of the tile: fixed-length moves, no `memcpy` call.
                                    (Ok(out), 0) => *out = *tile_row,
                                    (Ok(out), _) => add(out, tile_row),
                                    (Err(_), 0) => out.copy_from_slice(&tile_row[..cols]),
                                    (Err(_), _) => add(out, tile_row),
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// How the matrix being packed lies: `b` has a row per step of `k`; `a` a column.
#[derive(Clone, Copy)]
enum Layout {
    RowsAlongK,
    ColumnsAlongK,
}

/// Packs the `depth` steps from `p0` of the `len` lines from `l0` of `src` (row stride `stride`)
/// into slivers of `W` lines, each step's `W` values together; lines past `len` are zeros.
#[inline(always)]
fn pack<T: Element, const W: usize>(
    dst: &mut [T],
    src: &[T],
    stride: usize,
    (p0, depth): (usize, usize),
    (l0, len): (usize, usize),
    layout: Layout,
) {
    for (s, sliver) in dst.chunks_exact_mut(W * depth).enumerate() {
        let first = l0 + s * W;
        let width = W.min(l0 + len - first);
        match layout {
            Layout::RowsAlongK => {
                for (p, step) in sliver.chunks_exact_mut(W).enumerate() {
                    step[..width].copy_from_slice(&src[(p0 + p) * stride + first..][..width]);
                    step[width..].fill(T::zero());
                }
            }
            Layout::ColumnsAlongK => {
                // Each line read in order (a row of `a`), written with a stride of `W`.
                for w in 0..W {
                    let line = (w < width).then(|| &src[(first + w) * stride + p0..][..depth]);
                    for (p, step) in sliver.chunks_exact_mut(W).enumerate() {
                        step[w] = line.map_or(T::zero(), |line| line[p]);
                    }
                }
            }
        }
    }
}

/// `out += tile_row`, over `out`'s length.
#[inline(always)]
fn add<T: Element>(out: &mut [T], tile_row: &[T]) {
    for (o, &t) in out.iter_mut().zip(tile_row) {
        *o = *o + t;
    }
}

/// The `MR x NR` tile `sum_p a[p][i] b[p][j]` of a packed sliver pair, held in registers.
#[inline(always)]
fn tile<T: Element, const MR: usize, const NR: usize, const FMA: bool>(
    a: &[T],
    b: &[T],
) -> [[T; NR]; MR] {
    let mut acc = [[T::zero(); NR]; MR];
    for (a, b) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
        for i in 0..MR {
            for j in 0..NR {
                acc[i][j] = if FMA {
                    a[i].mul_add(b[j], acc[i][j])
                } else {
                    a[i] * b[j] + acc[i][j]
                };
            }
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values in [-1, 1) from a fixed sequence.
    fn values<T: Element>(len: usize, seed: u64) -> Vec<T> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                T::from_f64((x >> 11) as f64 / (1u64 << 52) as f64 - 1.0)
            })
            .collect()
    }

    /// Largest error of `product` against a sum in `f64`, relative to `k` (each term is below 1).
    fn error<T: Element>(m: usize, k: usize, n: usize) -> f64 {
        let (a, b) = (values::<T>(m * k, 1), values::<T>(k * n, 2));
        // The output starts as garbage: every element must be written.
        let mut c = vec![T::from_f64(7.0); m * n];
        product(&a, &b, &mut c, (m, k, n));
        let mut worst = 0f64;
        for i in 0..m {
            for j in 0..n {
                let exact: f64 = (0..k)
                    .map(|p| a[i * k + p].to_f64() * b[p * n + j].to_f64())
                    .sum();
                worst = worst.max((c[i * n + j].to_f64() - exact).abs() / k.max(1) as f64);
            }
        }
        worst
    }

    #[test]
    fn products_of_every_edge_shape_match_a_sum_in_f64() {
        // Sizes around the tile (6 x 16 or 6 x 8) and past each block edge (144 rows, 384 deep,
        // 1024 columns); the last is split over threads.
        let shapes = [
            (1, 1, 1),
            (5, 3, 7),
            (6, 16, 16),
            (7, 17, 33),
            (13, 385, 9),
            (150, 40, 17),
            (145, 390, 20),
            (7, 390, 1030),
            (300, 64, 64),
        ];
        for (m, k, n) in shapes {
            let (e32, e64) = (error::<f32>(m, k, n), error::<f64>(m, k, n));
            assert!(e32 < 1e-6, "f32 [{m}, {k}] x [{k}, {n}]: error {e32:e}");
            assert!(e64 < 1e-14, "f64 [{m}, {k}] x [{k}, {n}]: error {e64:e}");
        }
    }

    #[test]
    fn an_empty_sum_writes_zeros_and_empty_outputs_write_nothing() {
        let mut c = vec![3.0f32; 6];
        product(&[], &[], &mut c, (2, 0, 3));
        assert_eq!(c, [0.0; 6]);
        product(&[], &[1.0; 4], &mut c, (0, 2, 2));
        assert_eq!(c, [0.0; 6]);
    }
}
