//! [`Window`]: a rectangle of a row-major matrix, borrowed mutably, that splits into disjoint
//! windows by rows or by columns, so that threads can write the columns of one product's output
//! side by side (a split of a slice gives only runs of whole rows).
//!
//! The one `unsafe` here makes the slices of a window's rows.
#![allow(unsafe_code)]

use std::marker::PhantomData;
use std::ops::Range;
use std::ptr::NonNull;

/// Rows `rows` and columns `cols` of a row-major matrix of `n` columns, borrowed mutably for `'a`.
///
/// A window is made from the matrix's whole slice, or a band of its columns ([`Window::band`]),
/// and split into windows that do not overlap ([`Window::split_rows`], [`Window::split_columns`]),
/// or lends out a part of itself ([`Window::sub`]); no two windows made from one slice share an element while they live,
/// and the rows of a window are slices ([`Window::into_rows`]).
pub(crate) struct Window<'a, T> {
    /// The matrix's first element.
    data: NonNull<T>,
    /// The matrix's columns: the distance between rows.
    n: usize,
    rows: Range<usize>,
    cols: Range<usize>,
    /// The window acts as the `&mut` borrow it came from.
    borrow: PhantomData<&'a mut [T]>,
}

// SAFETY: a window reaches only its own elements, which no other window or value reaches while it
// lives (see `into_rows`), so it crosses threads as the `&mut [T]` it stands for does.
unsafe impl<T: Send> Send for Window<'_, T> {}

impl<'a, T> Window<'a, T> {
    /// All of `data` as a matrix of `n` columns (its length a multiple of `n`, `n > 0`): the
    /// whole-width [`Window::band`].
    #[cfg(test)]
    pub(crate) fn new(data: &'a mut [T], n: usize) -> Self {
        Window::band(data, n, 0, n)
    }

    /// Columns `first..first + cols` of all of `data` as a matrix of `n` columns, as a window of
    /// `cols` columns numbered from 0 (a product's output band: its columns are `b`'s). The
    /// window's element `(i, j)` is `data[first + i n + j]`.
    pub(crate) fn band(data: &'a mut [T], n: usize, first: usize, cols: usize) -> Self {
        assert!(
            n > 0 && data.len().is_multiple_of(n) && first + cols <= n,
            "a band of columns {first}..{} of {n} over {} elements",
            first + cols,
            data.len()
        );
        Window {
            rows: 0..data.len() / n,
            cols: 0..cols,
            n,
            data: NonNull::from(&mut data[first..]).cast(),
            borrow: PhantomData,
        }
    }

    /// The matrix rows this window covers.
    pub(crate) fn rows(&self) -> Range<usize> {
        self.rows.clone()
    }

    /// The matrix columns this window covers.
    pub(crate) fn cols(&self) -> Range<usize> {
        self.cols.clone()
    }

    /// The part of this window in `rows` and `cols` (matrix indices, inside this window's), for as
    /// long as the result is borrowed.
    #[inline(always)]
    pub(crate) fn sub(&mut self, rows: Range<usize>, cols: Range<usize>) -> Window<'_, T> {
        let inside = |part: &Range<usize>, whole: &Range<usize>| {
            whole.start <= part.start && part.start <= part.end && part.end <= whole.end
        };
        if !(inside(&rows, &self.rows) && inside(&cols, &self.cols)) {
            self.outside(&rows, &cols);
        }
        Window {
            data: self.data,
            n: self.n,
            rows,
            cols,
            borrow: PhantomData,
        }
    }

    /// Panics: `rows` x `cols` is not inside the window (kept out of line, away from the products'
    /// loops).
    #[cold]
    #[inline(never)]
    fn outside(&self, rows: &Range<usize>, cols: &Range<usize>) -> ! {
        panic!(
            "{rows:?} x {cols:?} is outside the window {:?} x {:?}",
            self.rows, self.cols
        )
    }

    /// The window's rows, first to last, each the slice of its columns.
    #[inline(always)]
    pub(crate) fn into_rows(self) -> impl Iterator<Item = &'a mut [T]> {
        let Window {
            data,
            n,
            rows,
            cols,
            ..
        } = self;
        rows.map(move |i| {
            // SAFETY: the `cols` of row `i` are elements of this window, so they lie in the slice
            // the window came from (`band`: rows below `len / n`, columns below `n - first` from
            // `first`; splits and `sub` only narrow the ranges), which is borrowed mutably for
            // `'a`; no other window shares them (splits consume the window and give disjoint
            // ranges, and `sub` borrows its window for as long as the part lives), and this
            // iterator, which took the window, gives each row once.
            unsafe {
                std::slice::from_raw_parts_mut(data.as_ptr().add(i * n + cols.start), cols.len())
            }
        })
    }

    /// The window in runs of `height` rows (the last may be shorter), first to last.
    pub(crate) fn split_rows(self, height: usize) -> impl Iterator<Item = Self> {
        self.split(height, |w| &mut w.rows)
    }

    /// The window in runs of `width` columns (the last may be narrower), first to last.
    pub(crate) fn split_columns(self, width: usize) -> impl Iterator<Item = Self> {
        self.split(width, |w| &mut w.cols)
    }

    /// Runs of `size` along the range `axis` picks: each run takes the front of what is left.
    fn split(
        self,
        size: usize,
        axis: fn(&mut Self) -> &mut Range<usize>,
    ) -> impl Iterator<Item = Self> {
        assert!(size > 0, "a window split into empty runs");
        let mut rest = Some(self);
        std::iter::from_fn(move || {
            let mut front = rest.take()?;
            let range = axis(&mut front);
            if range.len() > size {
                let cut = range.start + size;
                let mut back = Window {
                    rows: front.rows(),
                    cols: front.cols(),
                    ..front
                };
                *axis(&mut back) = cut..axis(&mut front).end;
                axis(&mut front).end = cut;
                rest = Some(back);
            }
            Some(front)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_cover_every_element_once() {
        let mut data = vec![0u32; 7 * 10];
        for (p, part) in Window::new(&mut data, 10).split_columns(4).enumerate() {
            for row in part.into_rows() {
                row.iter_mut().for_each(|v| *v += 1 + p as u32);
            }
        }
        // Columns 0-3 in part 0, 4-7 in part 1, 8-9 in part 2, every row.
        for (e, &v) in data.iter().enumerate() {
            assert_eq!(v, 1 + (e % 10 / 4) as u32, "element {e}");
        }
        let mut data = vec![0u8; 5 * 3];
        let runs: Vec<_> = Window::new(&mut data, 3)
            .split_rows(2)
            .map(|w| (w.rows(), w.cols()))
            .collect();
        assert_eq!(runs, [(0..2, 0..3), (2..4, 0..3), (4..5, 0..3)]);
    }

    #[test]
    fn a_part_writes_its_rows_and_columns_only() {
        let mut data = vec![0u8; 4 * 5];
        let mut right = Window::new(&mut data, 5).split_columns(2).nth(1).unwrap();
        for row in right.sub(1..3, 3..4).into_rows() {
            row[0] = 1;
        }
        let ones: Vec<_> = (0..20).filter(|&e| data[e] == 1).collect();
        assert_eq!(ones, [8, 13]);
    }

    #[test]
    #[should_panic(expected = "is outside the window 0..4 x 2..4")]
    fn a_part_outside_the_window_panics() {
        let mut data = vec![0u8; 4 * 5];
        let mut middle = Window::new(&mut data, 5).split_columns(2).nth(1).unwrap();
        middle.sub(0..1, 1..3);
    }
}
