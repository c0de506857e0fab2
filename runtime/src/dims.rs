//! Shapes and steps of any rank without a heap allocation in steady state.
//!
//! ndarray's `IxDyn` holds up to 4 axes inline and allocates beyond, so a rank-5 tensor (heads
//! split PyTorch's way, `[b, t, 3, h, d]`) allocated for its shape, its steps, and every shape an
//! op computed from them. [`Dims`] holds up to [`INLINE`] axes in place and longer lists in a
//! [`RecycledVec`], whose buffer the thread reuses: no rank allocates once a step has warmed up.
//!
//! [`Walk`] goes over tensors laid out with any steps (views, broadcasts) together, run by run,
//! with no ndarray view of rank above 4 (which would allocate its shape and steps).

use std::fmt;
use std::ops::{Deref, DerefMut};

use crate::recycle::RecycledVec;

/// Axes held in place: every rank models use (a rank-5 head split, a rank-6 window attention)
/// without touching the thread's spares.
pub(crate) const INLINE: usize = 6;

/// A list of lengths or steps, one per axis.
pub(crate) enum Dims {
    /// Up to [`INLINE`] axes; the first `len` are the list.
    Inline { len: usize, axes: [usize; INLINE] },
    /// More axes, in a recycled buffer.
    Spilled(RecycledVec<usize>),
}

impl Dims {
    /// The list `axes`.
    pub(crate) fn from_slice(axes: &[usize]) -> Dims {
        match axes.len() {
            len @ 0..=INLINE => {
                let mut inline = [0; INLINE];
                inline[..len].copy_from_slice(axes);
                Dims::Inline { len, axes: inline }
            }
            _ => {
                let mut spilled = RecycledVec::new();
                spilled.extend_from_slice(axes);
                Dims::Spilled(spilled)
            }
        }
    }

    /// `n` zeros.
    pub(crate) fn zeros(n: usize) -> Dims {
        match n {
            0..=INLINE => Dims::Inline {
                len: n,
                axes: [0; INLINE],
            },
            _ => {
                let mut spilled = RecycledVec::new();
                spilled.resize(n, 0);
                Dims::Spilled(spilled)
            }
        }
    }

    /// The row-major steps of `shape`.
    pub(crate) fn row_major(shape: &[usize]) -> Dims {
        let mut steps = Dims::zeros(shape.len());
        let mut step = 1;
        for (s, &len) in steps.iter_mut().zip(shape).rev() {
            *s = step;
            step *= len;
        }
        steps
    }

    /// This list without entry `axis`.
    pub(crate) fn removed(&self, axis: usize) -> Dims {
        let mut out = Dims::zeros(self.len() - 1);
        out[..axis].copy_from_slice(&self[..axis]);
        out[axis..].copy_from_slice(&self[axis + 1..]);
        out
    }

    /// This list with `len` inserted before entry `axis`.
    pub(crate) fn inserted(&self, axis: usize, len: usize) -> Dims {
        let mut out = Dims::zeros(self.len() + 1);
        out[..axis].copy_from_slice(&self[..axis]);
        out[axis] = len;
        out[axis + 1..].copy_from_slice(&self[axis..]);
        out
    }

    /// The list as a slice (as `IxDyn::slice`, whose uses `Dims` took over).
    pub(crate) fn slice(&self) -> &[usize] {
        self
    }

    /// The list as a mutable slice.
    pub(crate) fn slice_mut(&mut self) -> &mut [usize] {
        self
    }

    /// The product of the lengths: the number of elements of a shape.
    pub(crate) fn size(&self) -> usize {
        self.iter().product()
    }
}

impl Deref for Dims {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        match self {
            Dims::Inline { len, axes } => &axes[..*len],
            Dims::Spilled(axes) => axes,
        }
    }
}

impl DerefMut for Dims {
    fn deref_mut(&mut self) -> &mut [usize] {
        match self {
            Dims::Inline { len, axes } => &mut axes[..*len],
            Dims::Spilled(axes) => axes,
        }
    }
}

impl Clone for Dims {
    fn clone(&self) -> Dims {
        match self {
            Dims::Inline { len, axes } => Dims::Inline {
                len: *len,
                axes: *axes,
            },
            Dims::Spilled(axes) => Dims::from_slice(axes),
        }
    }
}

impl PartialEq for Dims {
    fn eq(&self, other: &Dims) -> bool {
        **self == **other
    }
}

impl fmt::Debug for Dims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

/// The steps that show a tensor of `shape` laid out with `steps` as `new` (as many elements)
/// without moving an element, if there are any: each run of axes that lie one inside the other in
/// memory may be split or joined, never axes across two runs (PyTorch's `view` rule). `None` when
/// a copy is needed (`[2, 3]` transposed cannot be flattened in place).
pub(crate) fn view_steps(shape: &[usize], steps: &[usize], new: &[usize]) -> Option<Dims> {
    let mut out = Dims::row_major(new);
    if shape.contains(&0) || shape.is_empty() {
        // No element to find, or one: any steps.
        return Some(out);
    }
    // From the innermost axis out, in chunks of old axes that are contiguous among themselves.
    let mut view_axis = new.len();
    let mut chunk_step = steps[shape.len() - 1];
    let (mut chunk_len, mut view_len) = (1usize, 1usize);
    for axis in (0..shape.len()).rev() {
        chunk_len *= shape[axis];
        let chunk_ends = axis == 0
            || (shape[axis - 1] != 1 && steps[axis - 1] != chunk_len.wrapping_mul(chunk_step));
        if !chunk_ends {
            continue;
        }
        while view_axis > 0 && (view_len < chunk_len || new[view_axis - 1] == 1) {
            view_axis -= 1;
            out[view_axis] = view_len.wrapping_mul(chunk_step);
            view_len *= new[view_axis];
        }
        if view_len != chunk_len {
            return None;
        }
        if axis > 0 {
            chunk_step = steps[axis - 1];
            (chunk_len, view_len) = (1, 1);
        }
    }
    (view_axis == 0).then_some(out)
}

/// `N` operands walked together over a common shape, each from a start with a step per axis (0
/// repeats an axis: a broadcast): the axes that can be merged are merged, so that the walk is a
/// loop over runs as long as the layouts allow.
pub(crate) struct Walk<const N: usize> {
    /// The merged lengths, outermost first; axes of length 1 are gone.
    shape: Dims,
    /// Each operand's step along each merged axis.
    steps: [Dims; N],
    /// Where each operand's first element is.
    starts: [usize; N],
}

impl<const N: usize> Walk<N> {
    /// The walk over `shape` of operands that start at `starts` and step by `steps` (one list per
    /// operand, one step per axis of `shape`).
    pub(crate) fn new(shape: &[usize], starts: [usize; N], steps: [&[usize]; N]) -> Walk<N> {
        let mut merged = Dims::zeros(shape.len());
        let mut merged_steps: [Dims; N] = std::array::from_fn(|_| Dims::zeros(shape.len()));
        // From the innermost axis out: an axis joins the one inside it when every operand steps
        // over it by exactly the inner axis' span.
        let mut n = 0;
        for axis in (0..shape.len()).rev() {
            let len = shape[axis];
            if len == 1 {
                continue;
            }
            let joins = n > 0
                && (0..N)
                    .all(|k| steps[k][axis] == merged_steps[k][n - 1].wrapping_mul(merged[n - 1]));
            if joins {
                merged[n - 1] *= len;
            } else {
                merged[n] = len;
                for k in 0..N {
                    merged_steps[k][n] = steps[k][axis];
                }
                n += 1;
            }
        }
        let outermost_first = |mut d: Dims| {
            d[..n].reverse();
            Dims::from_slice(&d[..n])
        };
        Walk {
            shape: outermost_first(merged),
            steps: merged_steps.map(outermost_first),
            starts,
        }
    }

    /// Calls `run(done, starts, len, steps)` for every run along the innermost merged axis, in
    /// row-major order of the walked shape: `len` elements, operand `k`'s at `starts[k] + i *
    /// steps[k]`, after `done` elements of earlier runs (so the run's first element is element
    /// `done` of the shape in row-major order: where it goes in a row-major output).
    pub(crate) fn for_each_run(&self, mut run: impl FnMut(usize, [usize; N], usize, [usize; N])) {
        let rank = self.shape.len();
        if self.shape.contains(&0) {
            return;
        }
        let Some((&len, outer)) = self.shape.split_last() else {
            // No axis longer than 1: one element.
            return run(0, self.starts, 1, [0; N]);
        };
        let inner = std::array::from_fn(|k| self.steps[k][rank - 1]);
        let mut at = self.starts;
        let mut index = Dims::zeros(outer.len());
        let mut done = 0;
        loop {
            run(done, at, len, inner);
            done += len;
            // The next run: an odometer over the outer axes, each operand's start moved with it.
            let mut axis = outer.len();
            loop {
                if axis == 0 {
                    return;
                }
                axis -= 1;
                index[axis] += 1;
                for (start, steps) in at.iter_mut().zip(&self.steps) {
                    *start = start.wrapping_add(steps[axis]);
                }
                if index[axis] < outer[axis] {
                    break;
                }
                for (start, steps) in at.iter_mut().zip(&self.steps) {
                    *start = start.wrapping_sub(steps[axis].wrapping_mul(outer[axis]));
                }
                index[axis] = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_reads_back_what_it_was_given() {
        for rank in 0..=2 * INLINE {
            let axes: Vec<usize> = (1..=rank).collect();
            let dims = Dims::from_slice(&axes);
            assert_eq!(&*dims, &axes[..]);
            assert_eq!(dims.size(), axes.iter().product::<usize>());
            assert_eq!(dims.clone(), dims);
            assert_eq!(&*Dims::zeros(rank), &vec![0; rank][..]);
            if rank > 0 {
                let mut expected = axes.clone();
                expected.remove(rank / 2);
                assert_eq!(&*dims.removed(rank / 2), &expected[..]);
                assert_eq!(
                    &*dims.removed(rank / 2).inserted(rank / 2, rank / 2 + 1),
                    &axes[..]
                );
            }
        }
    }

    /// The elements a walk visits, as (operand 0's index, operand 1's index) pairs.
    fn visits(shape: &[usize], starts: [usize; 2], steps: [&[usize]; 2]) -> Vec<[usize; 2]> {
        let mut seen = Vec::new();
        Walk::new(shape, starts, steps).for_each_run(|done, at, len, step| {
            assert_eq!(done, seen.len(), "runs in row-major order");
            seen.extend((0..len).map(|i| [at[0] + i * step[0], at[1] + i * step[1]]))
        });
        seen
    }

    /// The same pairs by a plain row-major index loop.
    fn expected(shape: &[usize], starts: [usize; 2], steps: [&[usize]; 2]) -> Vec<[usize; 2]> {
        let total: usize = shape.iter().product();
        (0..total)
            .map(|mut flat| {
                let mut at = starts;
                for axis in (0..shape.len()).rev() {
                    let i = flat % shape[axis];
                    flat /= shape[axis];
                    for k in 0..2 {
                        at[k] += i * steps[k][axis];
                    }
                }
                at
            })
            .collect()
    }

    /// A shape, its steps, a new shape, and the steps that show it in place, if any.
    type Reshape = (
        &'static [usize],
        &'static [usize],
        &'static [usize],
        Option<&'static [usize]>,
    );

    #[test]
    fn a_reshape_is_a_view_exactly_when_no_axis_crosses_a_gap() {
        let cases: [Reshape; 7] = [
            // Contiguous: any reshape, row-major.
            (&[2, 3, 4], &[12, 4, 1], &[6, 4], Some(&[4, 1])),
            // A narrowed last axis (rows 12 apart, 4 of them used) split into heads.
            (
                &[2, 3, 4],
                &[36, 12, 1],
                &[2, 3, 2, 2],
                Some(&[36, 12, 2, 1]),
            ),
            // ...and the two outer axes joined, but not across the gap.
            (&[2, 3, 4], &[36, 12, 1], &[6, 4], Some(&[12, 1])),
            (&[2, 3, 4], &[36, 12, 1], &[2, 12], None),
            // A transpose splits its axes but cannot flatten them.
            (&[3, 2], &[1, 3], &[3, 2, 1], Some(&[1, 3, 3])),
            (&[3, 2], &[1, 3], &[6], None),
            // Axes of length 1 come and go anywhere.
            (&[4, 1, 5], &[5, 99, 1], &[1, 4, 5, 1], Some(&[20, 5, 1, 1])),
        ];
        for (shape, steps, new, want) in cases {
            let got = view_steps(shape, steps, new);
            assert_eq!(got.as_deref(), want, "{shape:?} by {steps:?} as {new:?}");
        }
    }

    /// A walked shape, its two operands' steps, and the rank the walk merges it to.
    type Case = (&'static [usize], [&'static [usize]; 2], usize);

    #[test]
    fn a_walk_visits_what_an_index_loop_visits_and_merges_what_it_can() {
        // Row-major against a reversed view of rank 7 (past the inline axes), a broadcast, a
        // narrowed view, an axis of length 1 between two that merge, one element, no element.
        let cases: [Case; 6] = [
            (
                &[2, 3, 2, 2, 2, 3, 2],
                [&[144, 48, 24, 12, 6, 2, 1], &[1, 2, 6, 12, 24, 48, 144]],
                7,
            ),
            (&[4, 2, 3], [&[6, 3, 1], &[0, 1, 0]], 3),
            (&[3, 4, 5], [&[20, 5, 1], &[40, 5, 1]], 2),
            (&[2, 1, 3], [&[3, 99, 1], &[3, 5, 1]], 1),
            (&[1, 1, 1], [&[1, 1, 1], &[5, 5, 5]], 0),
            (&[3, 0, 2], [&[0, 2, 1], &[0, 2, 1]], 1),
        ];
        for (shape, steps, merged_rank) in cases {
            let walk = Walk::new(shape, [0, 3], steps);
            assert_eq!(walk.shape.len(), merged_rank, "{shape:?} {steps:?}");
            assert_eq!(
                visits(shape, [0, 3], steps),
                expected(shape, [0, 3], steps),
                "{shape:?} {steps:?}"
            );
        }
    }
}
