//! Packing a product's operands: lines of a matrix (rows of `a`, or columns of `b`) gathered into
//! slivers of `W` lines, each packed step of `k` holding the `W` lines' slots side by side, so
//! that a tile reads both operands in order.
//!
//! What a slot holds is the [`Packing`]: an element as it is ([`Exact`]), or, for the bf16
//! products, an element rounded to bf16 (`bf16::Rounded`) or a pair of them along `k`
//! (`bf16::Pairs`). Rounding happens here, once per packed element, so the tiles never convert.

use std::marker::PhantomData;

use super::super::simd;
use super::Matrix;
use crate::element::Element;

/// How a product packs its operands and what one step of a packed line holds; the tiles multiply
/// slots with [`Packing::mul_add`].
pub(super) trait Packing<T: Element>: 'static {
    /// What one line holds at one packed step.
    type Slot: bytemuck::Pod + Send + Sync;
    /// Elements along `k` one slot holds: 1, or 2 (a pair).
    const K: usize;
    /// Whether a slot is its element unchanged: then `a`'s short rows may be read where they lie
    /// instead of packed, and packing may move the elements without looking at them.
    const AS_IS: bool;

    /// The slot of one line's elements `at(0), .., at(K - 1)` along `k` (the caller gives zeros
    /// past the end of `k`).
    fn slot(at: impl Fn(usize) -> T) -> Self::Slot;

    /// The slots of one step of `W` lines whose elements lie in rows: `rows[h][w]` is element `h`
    /// of line `w`'s step (`rows[1]` is read only if `K` is 2). A packing may convert whole rows
    /// first, where converting slot by slot would not vectorise.
    #[inline(always)]
    fn step<const W: usize>(rows: [&[T; W]; 2], slots: &mut [Self::Slot; W]) {
        for (w, slot) in slots.iter_mut().enumerate() {
            *slot = Self::slot(
                #[inline(always)]
                |h| rows[h][w],
            );
        }
    }

    /// The slots of a run of one line's elements along `k` that lie in order, `slots.len()` of
    /// them from `line`, the last padded with zeros past the line's end.
    #[inline(always)]
    fn run(line: &[T], slots: &mut [Self::Slot]) {
        let elements = line.chunks_exact(Self::K);
        let rest = elements.remainder();
        let (whole, last) = slots.split_at_mut(elements.len().min(slots.len()));
        for (slot, elements) in whole.iter_mut().zip(elements) {
            *slot = Self::slot(
                #[inline(always)]
                |h| elements[h],
            );
        }
        if let (Some(slot), false) = (last.first_mut(), rest.is_empty()) {
            *slot = Self::slot(
                #[inline(always)]
                |h| rest.get(h).copied().unwrap_or(T::zero()),
            );
        }
    }

    /// `acc` plus the products of the elements of `a` and `b` (slots of one step of a line of `a`
    /// and a line of `b`), as the tiles sum them: with one rounding per product and sum, or with
    /// `mul_add` if `FMA`.
    fn mul_add<const FMA: bool>(a: Self::Slot, b: Self::Slot, acc: T) -> T;
}

/// Elements packed as they are.
pub(super) struct Exact;

impl<T: Element> Packing<T> for Exact {
    type Slot = T;
    const K: usize = 1;
    const AS_IS: bool = true;

    #[inline(always)]
    fn slot(at: impl Fn(usize) -> T) -> T {
        at(0)
    }

    /// A copy of the row (element by element, through [`Packing::slot`], LLVM moved one element
    /// at a time).
    #[inline(always)]
    fn step<const W: usize>(rows: [&[T; W]; 2], slots: &mut [T; W]) {
        *slots = *rows[0];
    }

    #[inline(always)]
    fn mul_add<const FMA: bool>(a: T, b: T, acc: T) -> T {
        if FMA {
            a.mul_add(b, acc)
        } else {
            a * b + acc
        }
    }
}

/// `W` lines of `f32` (`T`; `W` a multiple of 4: the 12 rows of a sliver of `a`, the 32 of a
/// transposed `b`) packed into `sliver`, the slots (of 32 bits, as `f32`s) step by step:
/// transposed in AVX2 registers ([`simd::transpose_f32`]) as they lie if a slot is its
/// element, else converted `RUN` steps at a time into a buffer first (written `W` apart one at a
/// time instead, the bf16 product `[2048, 384] x [384, 1152]` took 19.4 ms on one thread of the
/// AMD EPYC, against 11.2 ms). `false`, with nothing written, if the CPU lacks AVX2.
#[inline(always)]
fn transpose<T: Element, P: Packing<T>, const W: usize>(
    lines: [&[T]; W],
    sliver: &mut [[f32; W]],
) -> bool {
    if P::AS_IS {
        return simd::transpose_f32(lines.map(bytemuck::cast_slice), sliver);
    }
    let mut runs = [[<P::Slot as bytemuck::Zeroable>::zeroed(); RUN]; W];
    for (r, out) in sliver.chunks_mut(RUN).enumerate() {
        for (line, run) in lines.iter().zip(&mut runs) {
            P::run(&line[r * RUN * P::K..], &mut run[..out.len()]);
        }
        let runs = std::array::from_fn(|w| bytemuck::cast_slice(&runs[w][..out.len()]));
        if !simd::transpose_f32(runs, out) {
            return false;
        }
    }
    true
}

/// Slots a packing converts at a time, in a buffer on the stack.
const RUN: usize = 64;

/// [`pack`], compiled for the widest instruction set the CPU has (its copies then move 64 bytes
/// at a time instead of the baseline's 16).
pub(super) fn pack_wide<T: Element, P: Packing<T>, const W: usize>(
    dst: &mut [P::Slot],
    m: Matrix<'_, T>,
    depth: (usize, usize),
    l0: usize,
) {
    struct Pack<'a, 'm, T: Element, P: Packing<T>, const W: usize>(
        &'a mut [P::Slot],
        Matrix<'m, T>,
        (usize, usize),
        usize,
        PhantomData<P>,
    );
    impl<T: Element, P: Packing<T>, const W: usize> simd::Kernel for Pack<'_, '_, T, P, W> {
        type Out = ();
        #[inline(always)]
        fn run(self) {
            let Pack(dst, m, depth, l0, _) = self;
            pack::<T, P, W>(dst, m, depth, l0);
        }
    }
    simd::dispatch(Pack::<T, P, W>(dst, m, depth, l0, PhantomData));
}

/// Packs lines `l0..` of `m` (its rows; as many as `dst` holds slivers of `W`), elements
/// `p0..p0 + depth` of each, into slivers of `W` lines, each step's `W` slots together (a step is
/// `P::K` elements, the last padded with zeros); lines past `m`'s are zeros. A block of `a` is its
/// rows; a panel of `b`, the rows of its transpose.
#[inline(always)]
pub(super) fn pack<T: Element, P: Packing<T>, const W: usize>(
    dst: &mut [P::Slot],
    m: Matrix<'_, T>,
    (p0, depth): (usize, usize),
    l0: usize,
) {
    let steps = depth.div_ceil(P::K);
    let zero = <P::Slot as bytemuck::Zeroable>::zeroed();
    let mut full = 0;
    if m.rs == 1 {
        // The lines' elements of one step lie together (a row of `b`). Eight steps at a time,
        // sliver by sliver: eight rows read side by side, each sliver written in order. A step
        // at a time, the writes go to every sliver, a sliver's length apart, and step by step
        // within a sliver the reads go a row apart: either way to addresses a multiple of 4 KiB
        // apart, which share one set of the L1 cache and evict each other (packing a weight from
        // memory ran at 5 GB/s).
        full = (dst.len() / (W * steps)).min(m.rows.saturating_sub(l0) / W);
        let zeros = [T::zero(); W];
        for s0 in (0..steps).step_by(8) {
            let count = 8.min(steps - s0);
            for s in 0..full {
                let sliver = &mut dst[(s * steps + s0) * W..][..count * W];
                for (q, step) in sliver.as_chunks_mut::<W>().0.iter_mut().enumerate() {
                    // The rows of `m`'s transpose this step reads (at most a pair), zeros past
                    // `depth`: fixed-length reads.
                    let rows: [&[T; W]; 2] = std::array::from_fn(|h| {
                        let p = (s0 + q) * P::K + h;
                        if h < P::K && p < depth {
                            m.data[(p0 + p) * m.cs + l0 + s * W..][..W]
                                .try_into()
                                .expect("W values")
                        } else {
                            &zeros
                        }
                    });
                    P::step(rows, step);
                }
            }
        }
    }
    for (s, sliver) in dst.chunks_exact_mut(W * steps).enumerate().skip(full) {
        let first = l0 + s * W;
        let height = W.min(m.rows - first);
        let (sliver, _) = sliver.as_chunks_mut::<W>();
        if m.cs == 1
            && height == W
            && W.is_multiple_of(4)
            && std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()
            && size_of::<P::Slot>() == 4
            && transpose::<T, P, W>(
                std::array::from_fn(|w| m.row(first + w, p0, depth)),
                bytemuck::cast_slice_mut(sliver),
            )
        {
            // Lines of `f32` (12 of `a`, or 32 of a transposed `b`), their slots transposed in
            // registers.
        } else if m.cs == 1 {
            // Each line lies in order: read it in order, written `W` apart.
            for w in 0..W {
                let line = || m.row(first + w, p0, depth);
                if w < height && P::AS_IS {
                    for (step, &v) in sliver.iter_mut().zip(line()) {
                        step[w] = P::slot(|_| v);
                    }
                } else if w < height {
                    let line = line();
                    // A run of slots at a time, made in order, then written `W` apart.
                    let mut run = [zero; RUN];
                    for (r, steps) in sliver.chunks_mut(RUN).enumerate() {
                        P::run(&line[r * RUN * P::K..], &mut run[..steps.len()]);
                        for (step, &slot) in steps.iter_mut().zip(&run) {
                            step[w] = slot;
                        }
                    }
                } else {
                    sliver.iter_mut().for_each(|step| step[w] = zero);
                }
            }
        } else {
            for (q, step) in sliver.iter_mut().enumerate() {
                for (w, v) in step.iter_mut().enumerate() {
                    *v = if w < height {
                        P::slot(
                            #[inline(always)]
                            |h| {
                                let p = q * P::K + h;
                                if p < depth {
                                    m.at(first + w, p0 + p)
                                } else {
                                    T::zero()
                                }
                            },
                        )
                    } else {
                        zero
                    };
                }
            }
        }
    }
}
