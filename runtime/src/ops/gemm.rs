//! Matrix products of `f32` and `f64`: packed, cache-blocked kernels in the manner of BLIS and
//! `matrixmultiply`, split over the worker threads of [`crate::threads`]. The tile is chosen at run
//! time: `12 x 32` of `f32` in AVX-512 registers, written with intrinsics
//! ([`simd::tile_f32_avx512`]), on CPUs that have it; else `6 x 16` (`f32`) or `6 x 8` (`f64`) in
//! safe Rust that compiles to AVX2 + FMA code, or to the baseline elsewhere.
//!
//! Unlike the crates it replaces (`matrixmultiply` allocates its packing buffer on every call,
//! `gemm` several buffers and rayon jobs), the packing buffers are per thread, made once at their
//! full size, so no product after a thread's first allocates.
//!
//! The split: each thread computes a window of `c` ([`window::Window`]), its columns when `c` is
//! at least as wide as tall, else its rows, and packs what that window reads itself, so that no
//! packed block crosses between cores and the threads meet once per product.
//!
//! The blocking, within a thread's window: `NC`-column panels, each in `KC`-deep steps; per step,
//! `KC x NC` of `b` packed into `NR`-wide slivers, and `MC`-row blocks of `a` packed into
//! `MR`-tall slivers (with the 6-row tiles, read in place when its rows are short); each sliver of
//! `a` stays in the L1 cache while the panel's slivers of `b` stream past it from L2, and every
//! sliver pair is an `MR x NR` tile kept in registers and added to `c` (with the 12-row tile, a
//! part's last rows get a tile of 4 or 8).
//!
//! Operands are strided ([`Matrix`]), so a transposed operand is packed from where it lies instead
//! of being copied first.
//!
//! Products with few rows of `a` (a decode step's) do not pack: [`skinny`] reads `b` where it
//! lies, once, which bounds their time.
//!
//! What a packed step holds is a [`Packing`] ([`pack`]): the elements as they are, or, for
//! [`bf16::product_bf16`], the `f32` operands rounded to bf16 as they are packed, multiplied by
//! the AVX512-BF16 tile where the CPU has it and by the `f32` tiles elsewhere; both sum in `f32`.

use std::cell::RefCell;

use std::marker::PhantomData;

use super::simd::{self, FmaKernel, TileOut as _};
use crate::element::Element;
use crate::pool::Block;
use pack::{pack, pack_wide, Exact, Packing};
use window::Window;

pub(crate) mod bf16;
mod pack;
mod skinny;
mod window;

/// Rows of `a` per packed block: `MC x KC` of `f32` is 144 KiB, inside a core's L2 cache.
const MC: usize = 144;
/// Depth of one packed step: a sliver of `a`, `12 x KC` of `f32`, is 12 KiB, in the L1 cache with
/// the slivers of `b` passing through (deeper steps measured slower with the AVX-512 tile: 384 and
/// 512 lost 10-20% on M's product).
///
/// Counted in packed slots, so a step of bf16 pairs is 512 elements deep, as many bytes as one of
/// `f32`: 0-7% faster than 256 elements deep, never slower, on one thread of the AMD EPYC
/// (alternated in one process, twice, on the `d = 384` and `d = 768`, `3d` products of
/// `bf16::tests::bf16_products_against_f32`).
const KC: usize = 256;
/// Columns of `b` per packed panel: `KC x NC` of `f32` is 1 MiB, inside a core's L2 cache.
const NC: usize = 1024;

/// Multiply-adds per part below which a product is not split over threads: waking a worker costs
/// about as much as computing this many.
pub(crate) const PER_PART: usize = 1 << 19;
/// Rows of `c` the parts of a product split by rows are counted in, with the 12-row tile: a part's
/// last rows get a tile of 4 or 8 rows, so 300 rows split over two threads are 152 and 148, not
/// 156 and 144 (a 12-row tile of which 4 rows are zeros costs as much as a full one).
const PART_ROWS: usize = 4;
/// With the 6-row tiles, `a` is read in place, not packed, when its rows lie at most this many
/// bytes apart: the `MR` rows of a sliver then share a few cache lines' worth of sets instead of
/// conflicting in one (rows 4 KiB apart all map to the same set of the L1 cache), and packing them
/// one element at a time cost more than it saved. The 12-row tile always packs `a`: its packing is
/// a transpose in registers ([`simd::transpose_f32`]), and reading in place measured slower at
/// every shape tried (E's product 0.70 -> 0.60 ms, `[32, 128] x [128, 256]` 14 -> 10 µs).
const DIRECT_ROW_BYTES: usize = 1024;

/// Bytes of the largest block of `a` and panel of `b` a thread packs (of `f64`): the packing
/// buffers are made this large the first time a thread uses them, whatever the product, so that no
/// later product (a larger one, or a part of another size) allocates.
const A_BYTES: usize = MC * KC * 8;
const B_BYTES: usize = NC * KC * 8;

thread_local! {
    /// This thread's packing buffer for blocks of `a`.
    static PACKED_A: RefCell<Vec<Block>> = const { RefCell::new(Vec::new()) };
    /// This thread's packing buffer for panels of `b`.
    static PACKED_B: RefCell<Vec<Block>> = const { RefCell::new(Vec::new()) };
}

/// Makes this thread's packing buffers, as its first product would: worker threads call it when
/// they start, so that which thread takes which part of a product never decides whether a step
/// allocates.
pub(crate) fn reserve_scratch() {
    super::with_buffer::<_, f64, _>(&PACKED_A, (0, A_BYTES), |_| ());
    super::with_buffer::<_, f64, _>(&PACKED_B, (0, B_BYTES), |_| ());
}

/// A matrix in a slice: element `(i, j)` at `data[i * rs + j * cs]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Matrix<'a, T> {
    pub(crate) data: &'a [T],
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    /// Step between rows.
    pub(crate) rs: usize,
    /// Step between columns.
    pub(crate) cs: usize,
}

impl<'a, T> Matrix<'a, T> {
    /// `data` as a row-major `[rows, cols]` matrix.
    pub(crate) fn row_major(data: &'a [T], rows: usize, cols: usize) -> Self {
        Matrix {
            data,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }

    /// The transpose, reading the same elements.
    pub(crate) fn t(self) -> Self {
        Matrix {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }

    /// The `len` elements of row `i` from column `j`, when columns are contiguous.
    #[inline(always)]
    fn row(&self, i: usize, j: usize, len: usize) -> &'a [T] {
        &self.data[i * self.rs + j..][..len]
    }
}

impl<T: Copy> Matrix<'_, T> {
    #[inline(always)]
    fn at(&self, i: usize, j: usize) -> T {
        self.data[i * self.rs + j * self.cs]
    }
}

/// `c = a b` for `a: [m, k]`, `b: [k, n]` and a row-major `c: [m, n]`, with `T` `f32` or `f64`
/// ([`Element::GEMM`]). The ops call [`product_band`] (through `linalg`), of which this is the
/// whole-width case; the tests call this.
#[cfg(test)]
pub(crate) fn product<T: Element>(a: Matrix<'_, T>, b: Matrix<'_, T>, c: &mut [T]) {
    multiply::<T, Exact>(a, b, c, false)
}

/// `c += a b`, as [`product`] otherwise: the sums go into what `c` holds, as the tiles of the
/// later steps along `k` do, so an accumulation over many products (attention's tiles) needs no
/// temporary and no pass of its own.
#[cfg(test)]
pub(crate) fn product_add<T: Element>(a: Matrix<'_, T>, b: Matrix<'_, T>, c: &mut [T]) {
    multiply::<T, Exact>(a, b, c, true)
}

/// `c[.., first..first + n] = a b` (or `+=` if `add`) for `a: [m, k]`, `b: [k, n]` and a
/// row-major `c` of `width` columns: a product into a band of columns of a wider output (a
/// convolution's tile of output positions), as [`product`] otherwise.
pub(crate) fn product_band<T: Element>(
    a: Matrix<'_, T>,
    b: Matrix<'_, T>,
    c: &mut [T],
    band: (usize, usize),
    add: bool,
) {
    multiply_band::<T, Exact>(a, b, c, band, add)
}

/// `c = a b`, or `c += a b` if `add`, the operands packed as `P` says.
fn multiply<T: Element, P: Packing<T>>(a: Matrix<'_, T>, b: Matrix<'_, T>, c: &mut [T], add: bool) {
    multiply_band::<T, P>(a, b, c, (b.cols, 0), add)
}

/// [`multiply`] into columns `first..first + n` of a row-major `c` of `width` columns.
fn multiply_band<T: Element, P: Packing<T>>(
    a: Matrix<'_, T>,
    b: Matrix<'_, T>,
    c: &mut [T],
    (width, first): (usize, usize),
    add: bool,
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let last = |x: &Matrix<'_, T>| (x.rows - 1) * x.rs + (x.cols - 1) * x.cs;
    assert!(
        b.rows == k
            && first + n <= width
            && c.len() >= m * width
            && (m * k == 0 || last(&a) < a.data.len())
            && (k * n == 0 || last(&b) < b.data.len()),
        "gemm: operands do not fit [{m}, {k}] x [{}, {n}] -> columns {first}.. of [{m}, {width}]",
        b.rows
    );
    if m == 0 || n == 0 {
        return;
    }
    let c = Window::band(&mut c[..m * width], width, first, n);
    if k == 0 {
        // An empty sum: zeros, whatever the buffer held (or nothing added).
        if !add {
            c.into_rows().for_each(|row| row.fill(T::zero()));
        }
        return;
    }
    if P::AS_IS && skinny::takes(&a, &b) {
        return skinny::product(a, b, c, add);
    }
    if std::mem::size_of::<T>() == 4 && simd::has_avx512() {
        split::<T, P, 12, 32>(a, b, c, add);
    } else if std::mem::size_of::<T>() == 4 {
        split::<T, P, 6, 16>(a, b, c, add);
    } else {
        split::<T, P, 6, 8>(a, b, c, add);
    }
}

/// The product split over the threads: by columns of `c` when `c` is at least as wide as it is
/// tall, else by rows. Each thread packs what its part reads, its columns of `b` and all of `a`
/// (or its rows of `a` and all of `b`), the smaller operand packed by every thread: no packed
/// block is shared between threads, so the threads meet once per product, not twice per panel,
/// and each reads its packed blocks from its own core's caches.
fn split<T: Element, P: Packing<T>, const MR: usize, const NR: usize>(
    a: Matrix<'_, T>,
    b: Matrix<'_, T>,
    c: Window<'_, T>,
    add: bool,
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let each = |part: Window<'_, T>| blocked::<T, P, MR, NR>(a, b, part, add);
    if n >= m {
        let granules = n.div_ceil(NR);
        let min = PER_PART.div_ceil(NR * m * k);
        let split = |parts: usize| c.split_columns(granules.div_ceil(parts) * NR);
        super::for_each_part(granules, min, split, each);
    } else {
        let height = if MR == 12 { PART_ROWS } else { MR };
        let granules = m.div_ceil(height);
        let min = PER_PART.div_ceil(height * k * n);
        let split = |parts: usize| c.split_rows(granules.div_ceil(parts) * height);
        super::for_each_part(granules, min, split, each);
    }
}

/// One thread's part of the product, the rows and columns of `c`'s window: in panels of `NC`
/// columns and steps of `KC` along `k`, each step's panel of `b` packed into this thread's buffer;
/// added to what the window holds if `add`.
fn blocked<T: Element, P: Packing<T>, const MR: usize, const NR: usize>(
    a: Matrix<'_, T>,
    b: Matrix<'_, T>,
    mut c: Window<'_, T>,
    add: bool,
) {
    let k = a.cols;
    let (rows, cols) = (c.rows(), c.cols());
    let widest = cols.len().min(NC).next_multiple_of(NR);
    let tallest = rows.len().min(MC).next_multiple_of(MR);
    // Elements along `k` per step: `KC` slots.
    let kcs = KC * P::K;
    let deepest = k.min(kcs).div_ceil(P::K);
    super::with_buffer::<_, P::Slot, _>(&PACKED_B, (widest * deepest, B_BYTES), |pb| {
        super::with_buffer::<_, P::Slot, _>(&PACKED_A, (tallest * deepest, A_BYTES), |pa| {
            for jc in cols.clone().step_by(NC) {
                let nc = NC.min(cols.end - jc);
                for pc in (0..k).step_by(kcs) {
                    let kc = kcs.min(k - pc);
                    let pb = &mut pb[..nc.next_multiple_of(NR) * kc.div_ceil(P::K)];
                    pack_wide::<T, P, NR>(pb, b.t(), (pc, kc), jc);
                    simd::dispatch_fma(Step::<T, P, MR, NR> {
                        a,
                        pb,
                        cols: (jc, nc),
                        depth: (pc, kc),
                        add: add || pc > 0,
                        c: &mut c,
                        pa: &mut *pa,
                        packing: PhantomData,
                    });
                }
            }
        })
    });
}

/// One `KC`-deep step of one `NC`-column panel of a thread's part, the panel of `b` packed.
struct Step<'a, 'c, T: Element, P: Packing<T>, const MR: usize, const NR: usize> {
    a: Matrix<'a, T>,
    pb: &'a [P::Slot],
    /// The panel's first column and width.
    cols: (usize, usize),
    /// The step's first index along `k` and depth.
    depth: (usize, usize),
    /// Whether the step's sums are added to what `c` holds (the earlier steps' sums, or what the
    /// caller accumulates into).
    add: bool,
    /// The thread's part of `c`: the step's sums for the panel's columns of it.
    c: &'a mut Window<'c, T>,
    /// This thread's packing buffer for `a`.
    pa: &'a mut [P::Slot],
    packing: PhantomData<P>,
}

impl<T: Element, P: Packing<T>, const MR: usize, const NR: usize> FmaKernel
    for Step<'_, '_, T, P, MR, NR>
{
    type Out = ();

    #[inline(always)]
    fn run<const FMA: bool>(self) {
        let Step {
            a,
            pb,
            cols: (jc, nc),
            depth: (pc, kc),
            add,
            c,
            pa,
            packing: _,
        } = self;
        let rows = c.rows();
        let direct = P::AS_IS
            && MR != 12
            && a.cs == 1
            && a.rs * std::mem::size_of::<T>() <= DIRECT_ROW_BYTES;
        // Packed steps: `kc` elements of `k`, `P::K` to a step.
        let steps = kc.div_ceil(P::K);
        for ic in rows.clone().step_by(MC) {
            let mc = MC.min(rows.end - ic);
            if !direct {
                pack::<T, P, MR>(&mut pa[..mc.next_multiple_of(MR) * steps], a, (pc, kc), ic);
            }
            for ir in (0..mc).step_by(MR) {
                let height = MR.min(mc - ir);
                let r = ic + ir;
                for (jr, b) in pb.chunks_exact(NR * steps).enumerate() {
                    let col = jc + jr * NR;
                    let b = b.as_chunks::<NR>().0;
                    let out = Out {
                        c: c.sub(r..r + height, col..col + NR.min(jc + nc - col)),
                        add,
                    };
                    // Read in place (`direct`), a slot is its element.
                    if direct && height == MR {
                        let lines: [&[T]; MR] = std::array::from_fn(|i| a.row(r + i, pc, kc));
                        tile::<T, P, MR, NR, FMA>(
                            kc,
                            b,
                            #[inline(always)]
                            |p| std::array::from_fn(|i| P::slot(|_| lines[i][p])),
                            out,
                        )
                    } else if direct {
                        partial_tile::<T, P, MR, NR, FMA>(
                            kc,
                            b,
                            #[inline(always)]
                            |i, p| {
                                P::slot(|_| {
                                    if i < height {
                                        a.data[(r + i) * a.rs + pc + p]
                                    } else {
                                        T::zero()
                                    }
                                })
                            },
                            out,
                        )
                    } else {
                        // Packed: rows past `height` are zeros.
                        let sliver = &pa[ir * steps..][..MR * steps].as_chunks::<MR>().0[..steps];
                        if height == MR {
                            tile::<T, P, MR, NR, FMA>(
                                steps,
                                b,
                                #[inline(always)]
                                |p| sliver[p],
                                out,
                            )
                        } else {
                            partial_tile::<T, P, MR, NR, FMA>(
                                steps,
                                b,
                                #[inline(always)]
                                |i, p| sliver[p][i],
                                out,
                            )
                        }
                    }
                }
            }
        }
    }
}

/// Where a tile goes: the window of `c` it covers (its top-left part, where `c` ends before the
/// tile), written, or with `add` added to what is there (the sums of the earlier steps along `k`).
pub(crate) struct Out<'a, T> {
    pub(crate) c: Window<'a, T>,
    pub(crate) add: bool,
}

impl<'c, T: Element> simd::TileOut<'c, T> for Out<'c, T> {
    #[inline(always)]
    fn size(&self) -> (usize, usize) {
        (self.c.rows().len(), self.c.cols().len())
    }

    #[inline(always)]
    fn adds(&self) -> bool {
        self.add
    }

    #[inline(always)]
    fn store<const MR: usize, const NR: usize>(self, tile: &[[T; NR]; MR]) {
        let add = self.add;
        for (out, tile_row) in self.c.into_rows().zip(tile) {
            match (<&mut [T; NR]>::try_from(&mut *out), add) {
                // A whole row of the tile: fixed-length moves, no `memcpy` call.
                (Ok(out), false) => *out = *tile_row,
                (Ok(out), true) => {
                    for (o, &t) in out.iter_mut().zip(tile_row) {
                        *o = *o + t;
                    }
                }
                (Err(_), false) => {
                    let cols = out.len();
                    out.copy_from_slice(&tile_row[..cols])
                }
                (Err(_), true) => {
                    for (o, &t) in out.iter_mut().zip(tile_row) {
                        *o = *o + t;
                    }
                }
            }
        }
    }

    #[inline(always)]
    fn into_rows(self) -> impl Iterator<Item = &'c mut [T]> {
        self.c.into_rows()
    }
}

/// A tile of the last rows of a part, `out.size.0` of them, fewer than `MR` (the slot of row `i`
/// at step `p` of `a` given by `at`, zero past them): with the 12-row tile, one of 4 or 8 rows (a
/// part's rows are counted by 4; see `PART_ROWS`), else `MR` rows.
#[inline(always)]
fn partial_tile<T: Element, P: Packing<T>, const MR: usize, const NR: usize, const FMA: bool>(
    steps: usize,
    b: &[[P::Slot; NR]],
    at: impl Fn(usize, usize) -> P::Slot,
    out: Out<'_, T>,
) {
    let height = out.size().0;
    if MR == 12 && height <= 4 {
        tile::<T, P, 4, NR, FMA>(
            steps,
            b,
            #[inline(always)]
            |p| std::array::from_fn(|i| at(i, p)),
            out,
        )
    } else if MR == 12 && height <= 8 {
        tile::<T, P, 8, NR, FMA>(
            steps,
            b,
            #[inline(always)]
            |p| std::array::from_fn(|i| at(i, p)),
            out,
        )
    } else {
        tile::<T, P, MR, NR, FMA>(
            steps,
            b,
            #[inline(always)]
            |p| std::array::from_fn(|i| at(i, p)),
            out,
        )
    }
}

/// The `MR x NR` tile `sum_p a(p)[i] b[p][j]` over the packed steps `p < steps`, of a sliver of
/// `a` (step `p` given by `a(p)`) and a packed sliver `b`, held in registers, then stored to
/// `out`: 32 columns of `f32` by the AVX-512 tiles ([`simd::tile_f32_avx512`], or
/// [`simd::tile_bf16_avx512`] for pairs of bf16), else a loop that LLVM vectorises.
#[inline(always)]
fn tile<T: Element, P: Packing<T>, const MR: usize, const NR: usize, const FMA: bool>(
    steps: usize,
    b: &[[P::Slot; NR]],
    a: impl Fn(usize) -> [P::Slot; MR],
    out: Out<'_, T>,
) {
    if FMA && NR == 32 && std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() {
        // `T` is `f32` and `NR` 32, and a slot is an `f32` or (a pair of bf16s) a `u32`: the
        // casts are between identical types.
        let wide = if P::K == 1 {
            simd::tile_f32_avx512(
                steps,
                bytemuck::cast_slice(b),
                #[inline(always)]
                |p| bytemuck::cast::<[P::Slot; MR], [f32; MR]>(a(p)),
                out,
            )
        } else {
            simd::tile_bf16_avx512(
                steps,
                bytemuck::cast_slice(b),
                #[inline(always)]
                |p| bytemuck::cast::<[P::Slot; MR], [u32; MR]>(a(p)),
                out,
            )
        };
        let Err(out) = wide else {
            return;
        };
        return out.store(&tile_sum::<T, P, MR, NR, FMA>(steps, b, a));
    }
    out.store(&tile_sum::<T, P, MR, NR, FMA>(steps, b, a));
}

/// The tile of [`tile`], as a loop that LLVM vectorises.
#[inline(always)]
fn tile_sum<T: Element, P: Packing<T>, const MR: usize, const NR: usize, const FMA: bool>(
    steps: usize,
    b: &[[P::Slot; NR]],
    a: impl Fn(usize) -> [P::Slot; MR],
) -> [[T; NR]; MR] {
    let b = &b[..steps];
    let mut acc = [[T::zero(); NR]; MR];
    for p in 0..steps {
        let (a, b) = (a(p), &b[p]);
        for i in 0..MR {
            for j in 0..NR {
                acc[i][j] = P::mul_add::<FMA>(a[i], b[j], acc[i][j]);
            }
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values in [-1, 1) from a fixed sequence.
    pub(super) fn values<T: Element>(len: usize, seed: u64) -> Vec<T> {
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

    /// Sizes around the tiles (12 x 32 with AVX-512, 6 x 16, 6 x 8) and past each block edge (144
    /// rows, 256 deep, 1024 columns), rows short enough to be read in place and long enough to be
    /// packed; the large ones are split over threads.
    pub(super) const EDGE_SHAPES: [(usize, usize, usize); 13] = [
        (1, 1, 1),
        (5, 3, 7),
        (6, 16, 16),
        (7, 17, 33),
        (11, 31, 31),
        (12, 32, 32),
        (25, 70, 65),
        (13, 385, 9),
        (150, 40, 17),
        (145, 390, 20),
        (7, 300, 1030),
        (300, 64, 64),
        (64, 1024, 40),
    ];

    /// Operands of `(m, k, n)`, each stored transposed if asked, and their product (into an output
    /// that starts as garbage: every element must be written).
    fn operands_and_product<T: Element>(
        (m, k, n): (usize, usize, usize),
        (ta, tb): (bool, bool),
    ) -> (Vec<T>, Vec<T>, Vec<T>) {
        let (a_data, b_data) = (values::<T>(m * k, 1), values::<T>(k * n, 2));
        let mut c = vec![T::from_f64(7.0); m * n];
        product(
            matrix(&a_data, (m, k), ta),
            matrix(&b_data, (k, n), tb),
            &mut c,
        );
        (a_data, b_data, c)
    }

    /// `data` as a `[rows, cols]` matrix, stored row-major or (`transposed`) column-major.
    pub(super) fn matrix<T>(
        data: &[T],
        (rows, cols): (usize, usize),
        transposed: bool,
    ) -> Matrix<'_, T> {
        if transposed {
            Matrix::row_major(data, cols, rows).t()
        } else {
            Matrix::row_major(data, rows, cols)
        }
    }

    /// Largest error of `product` against a sum in `f64`, relative to `k` (each term is below 1),
    /// with each operand stored row-major (`false`) or as the transpose of a row-major matrix.
    fn error<T: Element>((m, k, n): (usize, usize, usize), (ta, tb): (bool, bool)) -> f64 {
        let (a_data, b_data, c) = operands_and_product::<T>((m, k, n), (ta, tb));
        let (a, b) = (matrix(&a_data, (m, k), ta), matrix(&b_data, (k, n), tb));
        let mut worst = 0f64;
        for i in 0..m {
            for j in 0..n {
                let exact: f64 = (0..k)
                    .map(|p| a.at(i, p).to_f64() * b.at(p, j).to_f64())
                    .sum();
                worst = worst.max((c[i * n + j].to_f64() - exact).abs() / k.max(1) as f64);
            }
        }
        worst
    }

    #[test]
    fn products_of_every_edge_shape_and_layout_match_a_sum_in_f64() {
        for shape in EDGE_SHAPES {
            for layout in [(false, false), (true, false), (false, true), (true, true)] {
                let (e32, e64) = (error::<f32>(shape, layout), error::<f64>(shape, layout));
                assert!(
                    e32 < 1e-6,
                    "f32 {shape:?} transposed {layout:?}: error {e32:e}"
                );
                assert!(
                    e64 < 1e-14,
                    "f64 {shape:?} transposed {layout:?}: error {e64:e}"
                );
            }
        }
    }

    /// The AVX-512 tile sums the same products in the same order as the others: the same bits
    /// (where the CPU has AVX-512; elsewhere both runs take the same path).
    #[test]
    fn the_avx512_tile_gives_the_bits_of_the_avx2_tile() {
        for shape in EDGE_SHAPES {
            for layout in [(false, false), (true, false), (false, true), (true, true)] {
                let wide = operands_and_product::<f32>(shape, layout).2;
                let narrow = simd::with_widest(simd::Level::Avx2, || {
                    operands_and_product::<f32>(shape, layout).2
                });
                let bits = |c: Vec<f32>| c.into_iter().map(f32::to_bits).collect::<Vec<_>>();
                assert_eq!(bits(wide), bits(narrow), "{shape:?} transposed {layout:?}");
            }
        }
    }

    #[test]
    fn product_add_adds_the_product_to_what_c_holds() {
        for shape @ (m, k, n) in EDGE_SHAPES {
            for layout @ (ta, tb) in [(false, false), (true, true)] {
                let (a_data, b_data, product) = operands_and_product::<f64>(shape, layout);
                let before = values::<f64>(m * n, 3);
                let mut c = before.clone();
                product_add(
                    matrix(&a_data, (m, k), ta),
                    matrix(&b_data, (k, n), tb),
                    &mut c,
                );
                for (i, ((&c, &p), &b)) in c.iter().zip(&product).zip(&before).enumerate() {
                    let error = (c - (b + p)).abs() / k as f64;
                    assert!(
                        error < 1e-14,
                        "{shape:?} {layout:?} [{i}]: {c} != {b} + {p}"
                    );
                }
            }
        }
    }

    #[test]
    fn an_empty_sum_writes_zeros_or_adds_nothing_and_empty_outputs_write_nothing() {
        type Product = fn(Matrix<'_, f32>, Matrix<'_, f32>, &mut [f32]);
        for (multiply, want) in [(product as Product, 0.0), (product_add, 3.0)] {
            let mut c = vec![3.0f32; 6];
            let (a, b) = (Matrix::row_major(&[], 2, 0), Matrix::row_major(&[], 0, 3));
            multiply(a, b, &mut c);
            assert_eq!(c, [want; 6]);
        }
        let mut c = vec![0.0f32; 6];
        product(
            Matrix::row_major(&[], 0, 2),
            Matrix::row_major(&[1.0; 4], 2, 2),
            &mut c,
        );
        assert_eq!(c, [0.0; 6]);
    }
}
