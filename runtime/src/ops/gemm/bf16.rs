//! Products of `f32` matrices computed in bf16: the operands rounded to bf16 (to nearest, ties to
//! even) as they are packed, their products summed in `f32` (mixed precision: `f32` master
//! weights and activations, bf16 arithmetic, `f32` accumulation).
//!
//! On a CPU with AVX512-BF16, packing puts each pair of consecutive elements along `k` in one
//! 32-bit slot ([`Pairs`]): `a`'s pairs are broadcast, `b`'s lie 32 columns to two registers, and
//! one `vdpbf16ps` adds 32 products into 16 sums ([`simd::tile_bf16_avx512`]). Elsewhere the
//! rounded values are packed as `f32` ([`Rounded`]) and go through the `f32` tiles: the same
//! products (a product of two bf16s is exact in `f32`), summed in another order.

use super::super::simd;
use super::pack::{Exact, Packing};
use super::{multiply, Matrix};

/// `c = a b`, or `c += a b` if `add`, for `f32` operands `a: [m, k]` and `b: [k, n]` of any
/// strides and a row-major `c: [m, n]`, each element of `a` and `b` rounded to bf16 as
/// `half::bf16::from_f32` rounds it, the products summed in `f32`. The blocking, the split over
/// threads and the packing buffers are [`super::product`]'s.
///
/// With AVX512-BF16 the sums go through `vdpbf16ps`, which adds each pair's odd product first,
/// reads subnormal bf16s as zero and flushes subnormal sums to zero; elsewhere the `f32` tiles
/// add the same products one at a time in order along `k`, subnormals kept, so the two agree up
/// to the rounding of the sums.
///
/// Panics, as [`super::product`] does, if the operands do not fit their shapes or `c` is shorter
/// than `m n`.
pub(crate) fn product_bf16(a: Matrix<'_, f32>, b: Matrix<'_, f32>, c: &mut [f32], add: bool) {
    if simd::has_avx512_bf16() {
        multiply::<f32, Pairs>(a, b, c, add)
    } else {
        multiply::<f32, Rounded>(a, b, c, add)
    }
}

/// `x` rounded to bf16, to nearest with ties to even (a NaN stays a NaN, made quiet), as
/// `half::bf16::from_f32` rounds it: the bf16's bits in the high half of the result, the low half
/// zero (so the result's bits are the bf16's value as an `f32`). Integer operations and a select
/// of two values, no branch, so that the packing loops vectorise.
#[inline(always)]
fn round(x: f32) -> u32 {
    let bits = x.to_bits();
    // Adding just under half a unit of the last kept bit, plus that bit, carries into it exactly
    // when the dropped bits are over half, or half and the kept value odd.
    let nearest = bits.wrapping_add(0x7FFF + ((bits >> 16) & 1)) & 0xFFFF_0000;
    let quiet_nan = (bits | 0x0040_0000) & 0xFFFF_0000;
    if bits & 0x7FFF_FFFF > 0x7F80_0000 {
        quiet_nan
    } else {
        nearest
    }
}

/// The bits of `x` rounded to bf16.
#[inline(always)]
fn bf16_bits(x: f32) -> u16 {
    (round(x) >> 16) as u16
}

/// Slots whose halves were written as `[even, odd]` in memory, made `even | odd << 16` (already
/// so on a little-endian target).
#[inline(always)]
fn in_order(slots: &mut [u32]) {
    if cfg!(target_endian = "big") {
        slots.iter_mut().for_each(|s| *s = s.rotate_left(16));
    }
}

/// Elements rounded to bf16 and packed as the `f32`s they equal, for the `f32` tiles.
pub(super) struct Rounded;

impl Packing<f32> for Rounded {
    type Slot = f32;
    const K: usize = 1;
    const AS_IS: bool = false;

    #[inline(always)]
    fn slot(at: impl Fn(usize) -> f32) -> f32 {
        f32::from_bits(round(at(0)))
    }

    #[inline(always)]
    fn mul_add<const FMA: bool>(a: f32, b: f32, acc: f32) -> f32 {
        <Exact as Packing<f32>>::mul_add::<FMA>(a, b, acc)
    }
}

/// Pairs of consecutive elements along `k`, each rounded to bf16, in one `u32`: the first (even)
/// in the low half, as `vdpbf16ps` reads them.
pub(super) struct Pairs;

impl Packing<f32> for Pairs {
    type Slot = u32;
    const K: usize = 2;
    const AS_IS: bool = false;

    #[inline(always)]
    fn slot(at: impl Fn(usize) -> f32) -> u32 {
        (round(at(0)) >> 16) | round(at(1))
    }

    /// Each row rounded as a whole, then the halves put together: slot by slot, LLVM vectorised
    /// each pair (two lanes) instead of the slots.
    #[inline(always)]
    fn step<const W: usize>(rows: [&[f32; W]; 2], slots: &mut [u32; W]) {
        let mut odd = [0; W];
        for (slot, &x) in slots.iter_mut().zip(rows[0]) {
            *slot = round(x) >> 16;
        }
        for (odd, &x) in odd.iter_mut().zip(rows[1]) {
            *odd = round(x);
        }
        for (slot, odd) in slots.iter_mut().zip(odd) {
            *slot |= odd;
        }
    }

    /// The line's bf16s written in order as the halves of the slots, a loop that vectorises
    /// (slot by slot, LLVM vectorised each pair instead).
    #[inline(always)]
    fn run(line: &[f32], slots: &mut [u32]) {
        let halves: &mut [u16] = bytemuck::cast_slice_mut(slots);
        let (rounded, past) = halves.split_at_mut(line.len().min(halves.len()));
        for (half, &x) in rounded.iter_mut().zip(line) {
            *half = bf16_bits(x);
        }
        past.fill(0);
        in_order(slots);
    }

    /// As `vdpbf16ps` sums a pair, the odd product first (each product is exact, so `FMA` changes
    /// nothing).
    #[inline(always)]
    fn mul_add<const FMA: bool>(a: u32, b: u32, acc: f32) -> f32 {
        let [even, odd] = [
            |x: u32| f32::from_bits(x << 16),
            |x: u32| f32::from_bits(x & 0xFFFF_0000),
        ];
        let acc = <Exact as Packing<f32>>::mul_add::<FMA>(odd(a), odd(b), acc);
        <Exact as Packing<f32>>::mul_add::<FMA>(even(a), even(b), acc)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::super::tests::{matrix, values, EDGE_SHAPES};
    use super::super::{blocked, Window};
    use super::*;
    use crate::ops::simd::{with_widest, Level};

    /// Shapes besides the `f32` products' edge shapes: `k` of 1, odd `k` ending a step of `KC`
    /// (256 elements of `f32`, 512 of pairs) in half a pair, one row, one column.
    const SHAPES: [(usize, usize, usize); 8] = [
        (37, 1, 45),
        (1, 1, 40),
        (1, 257, 70),
        (70, 255, 1),
        (12, 515, 33),
        (5, 1025, 40),
        (29, 3, 1),
        (300, 129, 97),
    ];

    /// The paths of a bf16 product, by the level the products are held to: pairs through
    /// `vdpbf16ps` (where the CPU has AVX512-BF16; elsewhere this is the next), the rounded
    /// values through the `f32` 12 x 32 AVX-512 tile, and through the 6 x 16 tile.
    const PATHS: [Level; 3] = [Level::Avx512Bf16, Level::Avx512, Level::Avx2];

    /// `x` rounded to bf16 by `half`, as an `f64`.
    fn rounded(x: f32) -> f64 {
        half::bf16::from_f32(x).to_f64()
    }

    /// Largest error of [`product_bf16`] (held to `level`) against a sum in `f64` of the rounded
    /// operands' products, relative to the sum of their magnitudes (and of what `c` held, if
    /// `add`): the bound of a sum in `f32` is that sum times `k` roundings.
    fn error(
        (m, k, n): (usize, usize, usize),
        (ta, tb): (bool, bool),
        add: bool,
        level: Level,
    ) -> f64 {
        let (a_data, b_data) = (values::<f32>(m * k, 1), values::<f32>(k * n, 2));
        let (a, b) = (matrix(&a_data, (m, k), ta), matrix(&b_data, (k, n), tb));
        let before = if add {
            values::<f32>(m * n, 3)
        } else {
            vec![7.0; m * n]
        };
        let mut c = before.clone();
        with_widest(level, || product_bf16(a, b, &mut c, add));
        let mut worst = 0f64;
        for i in 0..m {
            for j in 0..n {
                let terms = (0..k).map(|p| rounded(a.at(i, p)) * rounded(b.at(p, j)));
                let start = if add {
                    f64::from(before[i * n + j])
                } else {
                    0.0
                };
                let (exact, size) =
                    terms.fold((start, start.abs()), |(s, z), t| (s + t, z + t.abs()));
                let error = (f64::from(c[i * n + j]) - exact).abs();
                worst = worst.max(if size > 0.0 { error / size } else { error });
            }
        }
        worst
    }

    #[test]
    fn rounding_to_bf16_is_halfs() {
        let halves = [0x0000, 0x7FFF, 0x8000, 0x8001, 0xFFFF];
        let edges = (0..=0x1FFu32)
            .flat_map(|high| halves.map(move |low| (high << 23) | ((high & 1) << 16) | low));
        let specials = [
            f32::NAN,
            -f32::NAN,
            f32::INFINITY,
            f32::MAX,
            f32::MIN_POSITIVE,
            1e-40,
        ]
        .map(f32::to_bits);
        let spread = (0..u32::MAX / 65521).map(|i| i * 65521);
        for bits in
            edges
                .chain(specials)
                .chain(spread)
                .chain([0x7F7F_FFFF, 0x7FC0_0001, 0xFF80_0001])
        {
            let x = f32::from_bits(bits);
            assert_eq!(
                round(x) >> 16,
                u32::from(half::bf16::from_f32(x).to_bits()),
                "{bits:#010x}"
            );
            assert_eq!(round(x) & 0xFFFF, 0, "{bits:#010x}");
        }
    }

    #[test]
    fn bf16_products_match_a_sum_in_f64_of_the_rounded_operands() {
        for shape in EDGE_SHAPES.into_iter().chain(SHAPES) {
            for layout in [(false, false), (true, false), (false, true), (true, true)] {
                for add in [false, true] {
                    for level in PATHS {
                        let e = error(shape, layout, add, level);
                        assert!(
                            e < 1e-6,
                            "{shape:?} transposed {layout:?} add {add} {level:?}: error {e:e}"
                        );
                    }
                }
            }
        }
    }

    /// `vdpbf16ps` sums as [`Pairs::mul_add`] says: the pairs' tile gives the bits of the loop
    /// (where the CPU lacks AVX512-BF16, both runs are the loop).
    #[test]
    fn the_bf16_tile_gives_the_bits_of_the_pairs_loop() {
        for shape @ (m, k, n) in EDGE_SHAPES.into_iter().chain(SHAPES) {
            for layout @ (ta, tb) in [(false, false), (true, true)] {
                let (a_data, b_data) = (values::<f32>(m * k, 1), values::<f32>(k * n, 2));
                let (a, b) = (matrix(&a_data, (m, k), ta), matrix(&b_data, (k, n), tb));
                let run = || {
                    let mut c = vec![7.0f32; m * n];
                    multiply::<f32, Pairs>(a, b, &mut c, false);
                    c.into_iter().map(f32::to_bits).collect::<Vec<_>>()
                };
                let tile = run();
                let looped = with_widest(Level::Avx512, run);
                assert_eq!(tile, looped, "{shape:?} transposed {layout:?}");
            }
        }
    }

    /// The windows a product is split into for the threads (by columns, in 32s; by rows, in 4s),
    /// each computed on its own, give the bits of the whole product.
    #[test]
    fn a_bf16_product_in_windows_gives_the_bits_of_the_whole() {
        fn by_windows<P: Packing<f32>>(
            (a, b): (Matrix<'_, f32>, Matrix<'_, f32>),
            columns: bool,
            c: &mut [f32],
        ) {
            let n = b.cols;
            let window = Window::new(c, n);
            let parts: Vec<_> = if columns {
                window.split_columns(64).collect()
            } else {
                window.split_rows(28).collect()
            };
            for part in parts {
                blocked::<f32, P, 12, 32>(a, b, part, true);
            }
        }
        for shape @ (m, k, n) in [(300, 129, 97), (53, 300, 1030), (150, 385, 40)] {
            for layout @ (ta, tb) in [(false, false), (true, false), (false, true)] {
                let (a_data, b_data) = (values::<f32>(m * k, 1), values::<f32>(k * n, 2));
                let operands = (matrix(&a_data, (m, k), ta), matrix(&b_data, (k, n), tb));
                let before = values::<f32>(m * n, 3);
                let mut whole = before.clone();
                product_bf16(operands.0, operands.1, &mut whole, true);
                for columns in [true, false] {
                    let mut parts = before.clone();
                    if simd::has_avx512() && simd::has_avx512_bf16() {
                        by_windows::<Pairs>(operands, columns, &mut parts);
                    } else if simd::has_avx512() {
                        by_windows::<Rounded>(operands, columns, &mut parts);
                    } else {
                        // The 12 x 32 tile is not this CPU's: the sums would differ in order.
                        return;
                    }
                    let bits = |c: &[f32]| c.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&parts), bits(&whole), "{shape:?} {layout:?} {columns}");
                }
            }
        }
    }

    /// The measurement of `docs/benchmarks.md`, "bf16 products (issue 27)": the products of a
    /// transformer's training step, `f32` against bf16, median times of alternated rounds. Threads:
    /// `TENSORSCOPE_THREADS`. `cargo test --release -p tensorscope-runtime --lib
    /// bf16_products_against_f32 -- --ignored --nocapture`.
    #[test]
    #[ignore = "a measurement: prints a table"]
    fn bf16_products_against_f32() {
        const ROWS: usize = 2048;
        const ROUNDS: usize = 9;
        println!(
            "threads {}, AVX512-BF16 {}",
            std::env::var("TENSORSCOPE_THREADS").unwrap_or_else(|_| "all".into()),
            simd::has_avx512_bf16()
        );
        println!(
            "| product | shape | f32 ms | f32 GFLOP/s | bf16 ms | bf16 GFLOP/s | f32 / bf16 |"
        );
        println!("|---|---|---:|---:|---:|---:|---:|");
        for d in [384, 768] {
            for wide in [3 * d, 4 * d] {
                // (name, m, k, n, a transposed, b transposed): `x w`, `g w^T`, `x^T g`.
                let forms = [
                    ("A B", ROWS, d, wide, false, false),
                    ("A B^T", ROWS, wide, d, false, true),
                    ("A^T B", d, ROWS, wide, true, false),
                ];
                for (name, m, k, n, ta, tb) in forms {
                    let (a_data, b_data) = (values::<f32>(m * k, 1), values::<f32>(k * n, 2));
                    let (a, b) = (matrix(&a_data, (m, k), ta), matrix(&b_data, (k, n), tb));
                    let mut c = vec![0.0f32; m * n];
                    let mut time = |bf16: bool| {
                        let start = Instant::now();
                        if bf16 {
                            product_bf16(a, b, &mut c, false);
                        } else {
                            super::super::product(a, b, &mut c);
                        }
                        start.elapsed().as_secs_f64()
                    };
                    // A round of each first, not counted.
                    time(false);
                    time(true);
                    let (mut f32s, mut bf16s) = (Vec::new(), Vec::new());
                    for _ in 0..ROUNDS {
                        f32s.push(time(false));
                        bf16s.push(time(true));
                    }
                    let median = |mut t: Vec<f64>| {
                        t.sort_by(f64::total_cmp);
                        t[t.len() / 2]
                    };
                    let (f, h) = (median(f32s), median(bf16s));
                    let flops = 2.0 * (m * k * n) as f64;
                    println!(
                        "| {name} | [{m}, {k}] x [{k}, {n}] | {:.2} | {:.0} | {:.2} | {:.0} | {:.2} |",
                        f * 1e3,
                        flops / f / 1e9,
                        h * 1e3,
                        flops / h / 1e9,
                        f / h
                    );
                }
            }
        }
    }
}
