//! Products with few rows of `a`, as a decode step makes them (one token, or a batch of a few, times
//! every weight of the model): `b` is read where it lies instead of packed. Packing costs a read
//! and a write of `b`, and the 12-row tile computes mostly zeros at one row; a product this short
//! is bound by reading `b` from memory, so the aim is to read it once, at the memory's speed, on
//! every thread.
//!
//! Two layouts of `b` are read in place:
//!
//! - **`b.rs == 1`**: `b` is the transposed view of a row-major `W: [n, k]` (PyTorch's `[out, in]`
//!   weights, read through `.t()`), so `c[i][j]` is the dot product of row `i` of `a` with row `j`
//!   of `W`. Blocks of [`DOT_ROWS`] rows of `a` by [`DOT_COLS`] rows of `W` (one row of `W` at a
//!   time when `a` has one row: a single stream through memory) are summed in vectors of 512 bits
//!   along `k`, each sum's lanes added in a fixed tree at the end, then the elements past the
//!   last whole vector in order.
//! - **`b.cs == 1`**: `b` is row-major `[k, n]`, so a block of `c`'s row is `sum_p a[i][p] b[p]`
//!   over the rows of `b`: blocks of [`AXPY_COLS`] columns, summed in order along `k` in an array
//!   that stays in the L1 cache while `b` streams past, row by row.
//!
//! Either way each element of `c` is summed in the same order whatever the blocking, the split over
//! threads or the instruction set (the blocks only decide which sums share a pass over `b`), so a
//! shape gives the same bits on any number of threads.

use super::super::lanes;
use super::super::simd::{self, FmaKernel};
use super::{Matrix, Window, PER_PART};
use crate::element::Element;

/// The most rows of `a` a product with `b = W^T` takes this path with. Measured against the
/// packed path on 2 threads of the AMD EPYC (`tests::skinny_against_packed`), this one was
/// faster at every `m` tried up to 64: 3-10x at 1, 2.5-3.3x at 8, 2x at 16, 1.3-1.5x at 32 and
/// 1.1-1.2x at 64 (the packed path packs the transposed `W` by strided reads); 32 keeps a margin.
/// Those weights were larger than the caches; past [`CACHED_ROWS`] rows, a `W` that fits in the L2
/// cache keeps the packed path (below).
pub(super) const MAX_ROWS: usize = 32;
/// The most rows of `a` this path takes with a `W` smaller than [`CACHED_BYTES`]. Such a product
/// is not bound by reading `W`, and the packed 12-row tile computes it faster from two rows on:
/// on this path the backward of the 64-block MLP of `checkpointed_training` (`[32, 128] x [128,
/// 128]^T`) took its step from 16.5 to 17.9 ms, and the tiny GPT's attention tiles (8 query rows,
/// head dimension 8) its training step from 3.28 to 3.54 million instructions (0.998x the
/// commit before issue 28 with one row).
const CACHED_ROWS: usize = 1;
/// Bytes of `W` below which it stays in a core's L2 cache between products (1 MiB).
const CACHED_BYTES: usize = 1 << 20;
/// Rows of `a` summed against the same rows of `W` in one pass.
const DOT_ROWS: usize = 4;
/// Rows of `W` (columns of `c`) summed in one pass: `DOT_ROWS x DOT_COLS` sums of one 512-bit
/// vector each, 16 of the 32 AVX-512 registers.
const DOT_COLS: usize = 4;
/// The most rows of `a` a product with a row-major `b` takes this path with: one. It read `b` 1.2-
/// 1.8x as fast as the packed path at one row, but at two rows it was 0.9-1.2x as fast, and at
/// four 0.5-0.7x (`tests::skinny_against_packed`): the sums go through the L1 cache at every row
/// of `b`, where the packed tile keeps them in registers.
pub(super) const AXPY_MAX_ROWS: usize = 1;
/// Columns of `c` per block in the row-major layout: 1 KiB of `f32` sums per row.
const AXPY_COLS: usize = 256;

/// Whether [`product`] computes `a b`: `b` is a transposed row-major matrix, `a` has at most
/// [`MAX_ROWS`] rows ([`CACHED_ROWS`] if `b` fits in the L2 cache) and each is contiguous; or `b`
/// is row-major and `a` has at most [`AXPY_MAX_ROWS`].
pub(super) fn takes<T>(a: &Matrix<'_, T>, b: &Matrix<'_, T>) -> bool {
    let resident = b.rows * b.cols * size_of::<T>() < CACHED_BYTES;
    let rows = if resident { CACHED_ROWS } else { MAX_ROWS };
    (a.rows <= rows && dots(a, b)) || (a.rows <= AXPY_MAX_ROWS && b.cs == 1)
}

/// Whether [`product`] sums dot products (else rows of `b`): `b` is a transposed row-major `W`
/// and `a`'s rows are contiguous.
fn dots<T>(a: &Matrix<'_, T>, b: &Matrix<'_, T>) -> bool {
    b.rs == 1 && a.cs == 1
}

/// `c = a b`, or `c += a b` if `add`, for operands [`takes`] accepts and `k > 0`: split over the
/// threads by columns of `c`, each part at least [`PER_PART`] multiply-adds.
pub(super) fn product<T: Element>(a: Matrix<'_, T>, b: Matrix<'_, T>, c: Window<'_, T>, add: bool) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let dots = dots(&a, &b);
    let width = if dots { DOT_COLS } else { AXPY_COLS };
    let granules = n.div_ceil(width);
    let min = PER_PART.div_ceil(width * m * k);
    let split = |parts: usize| c.split_columns(granules.div_ceil(parts) * width);
    let each = |part: Window<'_, T>| {
        if dots {
            simd::dispatch_fma_wide(Dots { a, b, c: part, add })
        } else {
            simd::dispatch_fma_wide(Axpy { a, b, c: part, add })
        }
    };
    super::super::for_each_part(granules, min, split, each);
}

/// `x y + acc`, fused if `FMA`.
#[inline(always)]
fn mul_add<T: Element, const FMA: bool>(x: T, y: T, acc: T) -> T {
    if FMA {
        x.mul_add(y, acc)
    } else {
        x * y + acc
    }
}

/// A part of `c` as dot products of rows of `a` with rows of `W` (`b = W^T`).
struct Dots<'a, 'c, T> {
    a: Matrix<'a, T>,
    b: Matrix<'a, T>,
    c: Window<'c, T>,
    add: bool,
}

impl<T: Element> FmaKernel for Dots<'_, '_, T> {
    type Out = ();

    #[inline(always)]
    fn run<const FMA: bool>(self) {
        if std::mem::size_of::<T>() == 4 {
            self.blocks::<16, FMA>()
        } else {
            self.blocks::<8, FMA>()
        }
    }
}

impl<T: Element> Dots<'_, '_, T> {
    /// The part in blocks of `DOT_ROWS x DOT_COLS`, vectors of `L` lanes (512 bits).
    #[inline(always)]
    fn blocks<const L: usize, const FMA: bool>(self) {
        let Dots { a, b, mut c, add } = self;
        let k = a.cols;
        let rows = c.rows();
        let cols = c.cols();
        // Row `i` of `a`, and row `j` of `W` (column `j` of `b`).
        let a_row = |i: usize| &a.data[i * a.rs..][..k];
        let w_row = |j: usize| &b.data[j * b.cs..][..k];
        let mut j = cols.start;
        while j < cols.end {
            // The part's last columns, fewer than `DOT_COLS`, one at a time; and with one row of
            // `a`, every column: `W` is then read in one sequential stream, where four rows side
            // by side are four streams 4 `k` apart (one row at a time read the 32000 x 768 head
            // at 20 GB/s on one thread and 35 on two, against 12 and 23 four rows at a time; at
            // 8 rows of `a`, four rows of `W` at a time stayed faster, 15-20 GB/s against 12-14).
            let width = if rows.len() > 1 && cols.end - j >= DOT_COLS {
                DOT_COLS
            } else {
                1
            };
            let mut i = rows.start;
            while i < rows.end {
                let height = DOT_ROWS.min(rows.end - i);
                let out = c.sub(i..i + height, j..j + width);
                macro_rules! block {
                    ($r:literal, $c:literal) => {
                        store(
                            out,
                            add,
                            &sums::<T, $r, $c, L, FMA>(
                                std::array::from_fn(|r| a_row(i + r)),
                                std::array::from_fn(|q| w_row(j + q)),
                            ),
                        )
                    };
                }
                match (height, width) {
                    (4, 4) => block!(4, 4),
                    (3, 4) => block!(3, 4),
                    (2, 4) => block!(2, 4),
                    (1, 4) => block!(1, 4),
                    (4, _) => block!(4, 1),
                    (3, _) => block!(3, 1),
                    (2, _) => block!(2, 1),
                    _ => block!(1, 1),
                }
                i += height;
            }
            j += width;
        }
    }
}

/// `R x C` dot products `a[r] . w[q]` (all of one length `k`): `k / L` vectors of `L` products
/// summed lane by lane, the lanes added in halves, then the last `k % L` products in order.
#[inline(always)]
fn sums<T: Element, const R: usize, const C: usize, const L: usize, const FMA: bool>(
    a: [&[T]; R],
    w: [&[T]; C],
) -> [[T; C]; R] {
    let k = a[0].len();
    let whole = k / L;
    let av: [&[[T; L]]; R] = std::array::from_fn(|r| &a[r].as_chunks::<L>().0[..whole]);
    let wv: [&[[T; L]]; C] = std::array::from_fn(|q| &w[q].as_chunks::<L>().0[..whole]);
    let mut acc = [[[T::zero(); L]; C]; R];
    for p in 0..whole {
        let x: [[T; L]; R] = std::array::from_fn(|r| av[r][p]);
        let y: [[T; L]; C] = std::array::from_fn(|q| wv[q][p]);
        for r in 0..R {
            for q in 0..C {
                for l in 0..L {
                    acc[r][q][l] = mul_add::<T, FMA>(x[r][l], y[q][l], acc[r][q][l]);
                }
            }
        }
    }
    // The sums taken by value and written out in loops: through `array::from_fn`'s closures,
    // LLVM kept them in memory, storing every one at every step.
    let mut out = [[T::zero(); C]; R];
    for (r, (acc, out)) in acc.into_iter().zip(&mut out).enumerate() {
        for (q, (acc, out)) in acc.into_iter().zip(out).enumerate() {
            let mut sum = lanes_sum(acc);
            for p in whole * L..k {
                sum = mul_add::<T, FMA>(a[r][p], w[q][p], sum);
            }
            *out = sum;
        }
    }
    out
}

/// The sum of `L` lanes (a power of two) in halves ([`lanes::halves`]). Out of line: inlined,
/// LLVM vectorised the loop of [`sums`] for this tree, two lanes wide.
#[inline(never)]
fn lanes_sum<T: Element, const L: usize>(lanes: [T; L]) -> T {
    lanes::halves(lanes)
}

/// Writes (or with `add` adds) the sums into `out`, the part of each row that fits.
#[inline(always)]
fn store<T: Element, const R: usize, const C: usize>(
    out: Window<'_, T>,
    add: bool,
    sums: &[[T; C]; R],
) {
    for (row, sums) in out.into_rows().zip(sums) {
        for (c, &s) in row.iter_mut().zip(sums) {
            *c = if add { *c + s } else { s };
        }
    }
}

/// A part of `c` as sums of rows of a row-major `b` scaled by elements of `a`.
struct Axpy<'a, 'c, T> {
    a: Matrix<'a, T>,
    b: Matrix<'a, T>,
    c: Window<'c, T>,
    add: bool,
}

impl<T: Element> FmaKernel for Axpy<'_, '_, T> {
    type Out = ();

    #[inline(always)]
    fn run<const FMA: bool>(self) {
        let Axpy { a, b, mut c, add } = self;
        let k = a.cols;
        let rows = c.rows();
        let cols = c.cols();
        let at = |i: usize, p: usize| a.data[i * a.rs + p * a.cs];
        for j in cols.clone().step_by(AXPY_COLS) {
            let width = AXPY_COLS.min(cols.end - j);
            let mut sums = [[T::zero(); AXPY_COLS]; AXPY_MAX_ROWS];
            let sums = &mut sums[..rows.len()];
            for p in 0..k {
                let line = &b.data[p * b.rs + j..][..width];
                for (i, sums) in rows.clone().zip(sums.iter_mut()) {
                    let x = at(i, p);
                    for (s, &y) in sums[..width].iter_mut().zip(line) {
                        *s = mul_add::<T, FMA>(x, y, *s);
                    }
                }
            }
            let out = c.sub(rows.clone(), j..j + width);
            for (row, sums) in out.into_rows().zip(sums.iter()) {
                for (c, &s) in row.iter_mut().zip(sums) {
                    *c = if add { *c + s } else { s };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::pack::Exact;
    use super::super::tests::{matrix, values};
    use super::*;

    /// Rows of `a` up to past [`MAX_ROWS`] (the last ones take the packed path), depths around
    /// the 16 and 8 lanes of a vector and none, widths around the blocks of [`DOT_COLS`] and
    /// [`AXPY_COLS`], each layout of `a` and `b`, written and added: against sums in `f64`.
    #[test]
    fn few_rows_of_every_layout_match_a_sum_in_f64() {
        fn check<T: Element>(tolerance: f64) {
            // Around the vectors along `k`, past the row-major path's 256-column blocks, and either
            // side of the row limits (1 for these small weights: the 4 x 4 blocks of larger ones
            // are the next test's).
            for m in (1..=9).chain([16, 17, 31, 32, 33]) {
                for k in [0, 1, 7, 16, 17, 40, 300] {
                    for n in [1, 3, 4, 9, 33, 257] {
                        for (ta, tb) in [(false, true), (false, false), (true, true), (true, false)]
                        {
                            let (a_data, b_data) = (values::<T>(m * k, 1), values::<T>(k * n, 2));
                            let (a, b) = (matrix(&a_data, (m, k), ta), matrix(&b_data, (k, n), tb));
                            let before = values::<T>(m * n, 3);
                            for add in [false, true] {
                                let mut c = before.clone();
                                if add {
                                    super::super::product_add(a, b, &mut c);
                                } else {
                                    super::super::product(a, b, &mut c);
                                }
                                for i in 0..m {
                                    for j in 0..n {
                                        let start =
                                            if add { before[i * n + j].to_f64() } else { 0.0 };
                                        let exact: f64 = start
                                            + (0..k)
                                                .map(|p| a.at(i, p).to_f64() * b.at(p, j).to_f64())
                                                .sum::<f64>();
                                        let error = (c[i * n + j].to_f64() - exact).abs();
                                        assert!(
                                            error <= tolerance * (k + 1) as f64,
                                            "[{m}, {k}] x [{k}, {n}] transposed {:?} add {add} \
                                             ({i}, {j}): {} against {exact}",
                                            (ta, tb),
                                            c[i * n + j].to_f64()
                                        );
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        check::<f32>(1e-6);
        check::<f64>(1e-14);
    }

    /// Past one row, a weight that fits in the L2 cache keeps the packed path; a larger one takes
    /// this path up to 32 rows (every remainder of its 4 x 4 blocks here), and its sums, written or
    /// added, match the f64 ones.
    #[test]
    fn rows_past_one_take_this_path_only_with_a_weight_past_the_cache() {
        let (k, small, large) = (300, 600, 1101);
        let w = values::<f32>(k * large, 2);
        let takes_at = |m: usize, n: usize| {
            let a = vec![0.0f32; m * k];
            super::takes(
                &matrix(&a, (m, k), false),
                &matrix(&w[..k * n], (k, n), true),
            )
        };
        assert!(takes_at(1, small) && !takes_at(2, small) && !takes_at(32, small));
        assert!(takes_at(2, large) && takes_at(32, large) && !takes_at(33, large));
        for m in [2, 3, 5, 9, 32] {
            let a_data = values::<f32>(m * k, 1);
            let (a, b) = (matrix(&a_data, (m, k), false), matrix(&w, (k, large), true));
            let before = values::<f32>(m * large, 3);
            for add in [false, true] {
                let mut c = before.clone();
                match add {
                    true => super::super::product_add(a, b, &mut c),
                    false => super::super::product(a, b, &mut c),
                }
                for (i, j) in (0..m).flat_map(|i| (0..large).map(move |j| (i, j))) {
                    let start = if add {
                        before[i * large + j] as f64
                    } else {
                        0.0
                    };
                    let exact: f64 = start
                        + (0..k)
                            .map(|p| a.at(i, p) as f64 * b.at(p, j) as f64)
                            .sum::<f64>();
                    let error = (c[i * large + j] as f64 - exact).abs();
                    assert!(
                        error <= 1e-6 * (k + 1) as f64,
                        "[{m}, {k}] add {add} ({i}, {j})"
                    );
                }
            }
        }
    }

    /// An element's sum does not depend on the block it is computed in nor on the threads' split:
    /// each column of `c` computed alone (a product of one column of `b`) has the bits it has in
    /// the whole product, at every level of instructions.
    #[test]
    fn each_element_has_the_same_bits_in_any_block_and_at_any_level() {
        for (m, k, n) in [(1, 300, 37), (7, 45, 9), (13, 768, 70), (32, 17, 5)] {
            for tb in [true, false] {
                let (a_data, b_data) = (values::<f32>(m * k, 1), values::<f32>(k * n, 2));
                let (a, b) = (matrix(&a_data, (m, k), false), matrix(&b_data, (k, n), tb));
                let mut whole = vec![0f32; m * n];
                super::super::product(a, b, &mut whole);
                let bits = |c: &[f32]| c.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                let narrow = simd::with_widest(simd::Level::Avx2, || {
                    let mut c = vec![0f32; m * n];
                    super::super::product(a, b, &mut c);
                    c
                });
                assert_eq!(bits(&narrow), bits(&whole), "[{m}, {k}] x [{k}, {n}] {tb}");
                for j in 0..n {
                    let column = Matrix {
                        data: &b.data[j * b.cs..],
                        cols: 1,
                        ..b
                    };
                    let mut c = vec![0f32; m];
                    super::super::product(a, column, &mut c);
                    let want: Vec<f32> = (0..m).map(|i| whole[i * n + j]).collect();
                    assert_eq!(
                        bits(&c),
                        bits(&want),
                        "[{m}, {k}] x [{k}, {n}] {tb} column {j}"
                    );
                }
            }
        }
    }

    /// The crossover: this path against the packed one, `[m, k] x [k, n]` with `b` stored as
    /// `W: [n, k]` (transposed) and as `[k, n]`, at m = 1 to 16, on all threads; medians of
    /// alternated rounds. `cargo test --release -p tensorscope-runtime skinny_against_packed --
    /// --ignored --nocapture`
    #[test]
    #[ignore = "a measurement"]
    fn skinny_against_packed() {
        use std::time::Instant;
        for (k, n) in [
            (768, 768),
            (768, 2304),
            (768, 3072),
            (3072, 768),
            (768, 50257),
        ] {
            let w = values::<f32>(k * n, 2);
            let x = values::<f32>(64 * k, 1);
            for transposed in [true, false] {
                let b = super::super::tests::matrix(&w, (k, n), transposed);
                let rows: &[usize] = if transposed {
                    &[1, 4, 8, 16, 24, 32, 48, 64]
                } else {
                    &[1, 2, 4]
                };
                for &m in rows {
                    let a = Matrix::row_major(&x[..m * k], m, k);
                    let mut c = vec![0f32; m * n];
                    let mut times = [Vec::new(), Vec::new()];
                    let reps = (200_000_000 / (m * k * n).max(1)).clamp(1, 2000);
                    for round in 0..14 {
                        for (path, times) in times.iter_mut().enumerate() {
                            let start = Instant::now();
                            for _ in 0..reps {
                                let c = Window::new(&mut c, n);
                                if path == 0 {
                                    product(a, b, c, false);
                                } else {
                                    super::super::split::<f32, Exact, 12, 32>(a, b, c, false);
                                }
                            }
                            if round >= 2 {
                                times.push(start.elapsed().as_secs_f64() / reps as f64);
                            }
                        }
                    }
                    let [skinny, packed] = times.map(|mut t| {
                        t.sort_by(f64::total_cmp);
                        t[t.len() / 2] * 1e6
                    });
                    let form = if transposed { "W^T" } else { "B" };
                    println!(
                        "[{m:2}, {k}] x {form} [{k}, {n}]: skinny {skinny:9.1} us, packed \
                         {packed:9.1} us, {:.2}x",
                        packed / skinny
                    );
                }
            }
        }
    }
}
