//! Printing values: the one `Display` format of [`Tensor`](crate::Tensor) and
//! [`Param`](crate::Param), after PyTorch's and candle's.
//!
//! The values come first, nested in brackets by axis (rows on their own lines, a blank line
//! between the blocks of a 3-D tensor, two between those of a 4-D one), right-aligned to one width;
//! then a line naming the kind, the shape and the element type, `Tensor[2, 3; f32]`.
//!
//! - Floats share one notation per tensor, chosen from the nonzero finite values shown, as PyTorch
//!   chooses: fixed with 4 decimals, or scientific (`1.0000e+08`) when the largest magnitude passes
//!   1e8, the smallest is below 1e-4, or the largest is over 1000 times the smallest. A precision in
//!   the format (`{:.2}`) replaces the 4. NaN and infinities print as `NaN`, `inf` and `-inf`.
//! - Integers print as integers; a precision does not apply to them.
//! - A tensor of more than 1000 elements shows the first and last 3 indices of every axis longer
//!   than 6, with `...` in place of the rest.
//! - Rows wrap at 80 columns. A rank-0 tensor prints its value without brackets; a tensor with no
//!   elements prints `[]` (its shape line tells which).

use std::fmt::{self, Write};

use crate::element::{is_integer, DType};

/// A tensor of more elements than this is summarized.
const SUMMARIZE_ABOVE: usize = 1000;
/// The indices shown at each end of a summarized axis.
const EDGE_ITEMS: usize = 3;
/// The default number of decimals of floats.
const DEFAULT_PRECISION: usize = 4;
/// The column rows wrap at.
const LINE_WIDTH: usize = 80;

/// How every element of one tensor prints.
#[derive(Clone, Copy)]
enum Notation {
    Integer,
    Fixed(usize),
    Scientific(usize),
}

impl Notation {
    /// The notation of a tensor of `T` whose shown values are `shown`.
    fn choose<T: DType>(shown: &[T], precision: usize) -> Notation {
        if is_integer::<T>() {
            return Notation::Integer;
        }
        let magnitudes = shown
            .iter()
            .map(|x| x.to_f64().abs())
            .filter(|m| m.is_finite() && *m != 0.0);
        let (min, max) = magnitudes.fold((f64::INFINITY, 0.0f64), |(lo, hi), m| {
            (lo.min(m), hi.max(m))
        });
        if max > 0.0 && (max / min > 1000.0 || max > 1e8 || min < 1e-4) {
            Notation::Scientific(precision)
        } else {
            Notation::Fixed(precision)
        }
    }

    fn text<T: DType>(self, x: T) -> String {
        let v = x.to_f64();
        match self {
            Notation::Integer => x.to_string(),
            _ if v.is_nan() => "NaN".to_string(),
            _ if v.is_infinite() => if v > 0.0 { "inf" } else { "-inf" }.to_string(),
            Notation::Fixed(p) => format!("{v:.p$}"),
            Notation::Scientific(p) => {
                // Rust writes `1.0000e8`; PyTorch and C write `1.0000e+08`.
                let text = format!("{v:.p$e}");
                let (mantissa, exponent) = text.split_once('e').expect("`e` format has an `e`");
                let (sign, digits) = match exponent.strip_prefix('-') {
                    Some(digits) => ('-', digits),
                    None => ('+', exponent),
                };
                format!("{mantissa}e{sign}{digits:0>2}")
            }
        }
    }
}

/// The indices of an axis that print: all of them, or, when summarized, the first and last
/// [`EDGE_ITEMS`] with `...` between.
#[derive(Clone, Copy)]
struct Axis {
    len: usize,
    /// Elements between consecutive indices of the axis.
    stride: usize,
    summarized: bool,
}

impl Axis {
    /// How many entries print, `...` counting as one.
    fn entries(self) -> usize {
        if self.summarized {
            2 * EDGE_ITEMS + 1
        } else {
            self.len
        }
    }

    /// The index entry `n` shows, `None` for the `...`.
    fn index(self, n: usize) -> Option<usize> {
        match n {
            _ if !self.summarized || n < EDGE_ITEMS => Some(n),
            EDGE_ITEMS => None,
            _ => Some(self.len - self.entries() + n),
        }
    }
}

/// One step of the walk over the shown values, in print order.
enum Step {
    /// The `[` of a block of an axis before the last.
    Open,
    /// Its `]`.
    Close,
    /// Between two entries of this axis (one before the last).
    Separator(usize),
    /// The `...` of an axis before the last.
    Ellipsis,
    /// A block of the last axis, whose index 0 is at this offset in the data.
    Row(usize),
}

/// Where the elements of a tensor lie in its buffer: the first at `offset`, neighbours along each
/// axis `steps` apart (row-major if `None`). An expanded axis has step 0: printing reads each
/// shown element where it lies, so a view of 2^40 elements over one prints without a copy.
pub(crate) struct Layout<'a> {
    pub(crate) offset: usize,
    pub(crate) steps: Option<&'a [usize]>,
}

impl Layout<'_> {
    /// A row-major buffer of exactly the elements.
    pub(crate) const ROW_MAJOR: Layout<'static> = Layout {
        offset: 0,
        steps: None,
    };
}

/// Writes the elements of `shape` lying in `data` as `layout` says, then `kind[shape; dtype]`:
/// the `Display` of tensors and parameters.
pub(crate) fn fmt_values<T: DType>(
    f: &mut fmt::Formatter<'_>,
    kind: &str,
    shape: &[usize],
    data: &[T],
    layout: Layout<'_>,
) -> fmt::Result {
    if shape.contains(&0) {
        // Nothing to visit: an empty tensor's other axes may be 2^40 long.
        f.write_str("[]\n")?;
        return write_footer(f, kind, shape, T::NAME);
    }
    // A view's elements may outnumber its buffer's (an expanded axis); saturating is enough to
    // decide whether to summarize.
    let count = shape.iter().fold(1usize, |n, &len| n.saturating_mul(len));
    let summarize = count > SUMMARIZE_ABOVE;
    let mut axes: Vec<Axis> = Vec::with_capacity(shape.len());
    let mut row_major = 1;
    for (axis, &len) in shape.iter().enumerate().rev() {
        axes.push(Axis {
            len,
            stride: layout.steps.map_or(row_major, |steps| steps[axis]),
            summarized: summarize && len > 2 * EDGE_ITEMS,
        });
        // Used only without steps, where the product of the lengths is `data.len()`.
        row_major = row_major.saturating_mul(len);
    }
    axes.reverse();
    let mut printer = Printer {
        axes,
        data,
        offset: layout.offset,
        notation: Notation::Integer,
        width: 0,
    };

    let mut shown = Vec::new();
    match shape {
        [] => shown.push(data[layout.offset]),
        _ => printer.walk(|step| {
            if let Step::Row(offset) = step {
                shown.extend(printer.row(offset).flatten());
            }
            Ok(())
        })?,
    }
    printer.notation = Notation::choose(&shown, f.precision().unwrap_or(DEFAULT_PRECISION));
    printer.width = shown
        .iter()
        .map(|&x| printer.notation.text(x).chars().count())
        .max()
        .unwrap_or(0);

    let mut out = String::new();
    match shape {
        [] => out.push_str(&printer.notation.text(data[layout.offset])),
        _ => printer.write_blocks(&mut out)?,
    }
    out.push('\n');
    write_footer(&mut out, kind, shape, T::NAME)?;
    f.write_str(&out)
}

/// Writes `kind[shape; dtype]`, the last line of every print.
fn write_footer(out: &mut impl Write, kind: &str, shape: &[usize], dtype: &str) -> fmt::Result {
    write!(out, "{kind}[")?;
    for (axis, len) in shape.iter().enumerate() {
        if axis > 0 {
            out.write_str(", ")?;
        }
        write!(out, "{len}")?;
    }
    write!(out, "; {dtype}]")
}

/// Writes `c` `n` times, without making a string of them: a separator of a tensor of rank 100,000
/// is 100,000 characters, and one string per axis would be quadratic in the rank.
fn push_n(out: &mut String, c: char, n: usize) {
    out.extend(std::iter::repeat_n(c, n));
}

struct Printer<'a, T> {
    /// Of rank 1 or more.
    axes: Vec<Axis>,
    data: &'a [T],
    /// Where the first element is in `data`.
    offset: usize,
    notation: Notation,
    /// The width every element is right-aligned to.
    width: usize,
}

impl<T: DType> Printer<'_, T> {
    /// The shown values of the block of the last axis at `offset`, `None` for the `...`.
    fn row(&self, offset: usize) -> impl Iterator<Item = Option<T>> + '_ {
        let last = self.axes[self.axes.len() - 1];
        (0..last.entries()).map(move |n| last.index(n).map(|i| self.data[offset + i * last.stride]))
    }

    /// Calls `step` with every step of printing the values, in order.
    ///
    /// An odometer over the axes before the last, not a recursion per axis: a one-element tensor of
    /// rank 100,000 is valid, and its print must not need a stack frame per axis.
    fn walk(&self, mut step: impl FnMut(Step) -> fmt::Result) -> fmt::Result {
        let last = self.axes.len() - 1;
        // The entry of each axis before the last being printed, and where the block of each axis
        // being printed starts in the data.
        let mut entry = vec![0; last];
        let mut start = vec![self.offset; last + 1];
        // The axis whose block is to be printed from its first entry.
        let mut axis = 0;
        loop {
            while axis < last {
                step(Step::Open)?;
                // Entry 0 always shows index 0.
                entry[axis] = 0;
                start[axis + 1] = start[axis];
                axis += 1;
            }
            step(Step::Row(start[last]))?;
            // The block of `axis` is done: move to the next entry of the innermost axis that has
            // one, closing the blocks that are done.
            'done: loop {
                let Some(outer) = axis.checked_sub(1) else {
                    return Ok(());
                };
                loop {
                    entry[outer] += 1;
                    if entry[outer] == self.axes[outer].entries() {
                        step(Step::Close)?;
                        axis = outer;
                        continue 'done;
                    }
                    step(Step::Separator(outer))?;
                    match self.axes[outer].index(entry[outer]) {
                        Some(i) => {
                            start[axis] = start[outer] + i * self.axes[outer].stride;
                            break 'done;
                        }
                        None => step(Step::Ellipsis)?,
                    }
                }
            }
        }
    }

    /// Writes the values in their brackets.
    fn write_blocks(&self, out: &mut String) -> fmt::Result {
        let rank = self.axes.len();
        self.walk(|step| {
            match step {
                Step::Open => out.push('['),
                Step::Close => out.push(']'),
                Step::Separator(axis) => {
                    // A blank line between blocks per axis below the next: none between rows.
                    out.push(',');
                    push_n(out, '\n', rank - axis - 1);
                    push_n(out, ' ', axis + 1);
                }
                Step::Ellipsis => out.push_str("..."),
                Step::Row(offset) => self.write_row(out, offset)?,
            }
            Ok(())
        })
    }

    /// Writes the block of the last axis at `offset`, with its brackets.
    fn write_row(&self, out: &mut String, offset: usize) -> fmt::Result {
        let axis = self.axes.len() - 1;
        // Rows wrap at the line width, counting an element with its ", ".
        let per_line = ((LINE_WIDTH.saturating_sub(axis)) / (self.width + 2)).max(1);
        out.push('[');
        for (n, value) in self.row(offset).enumerate() {
            if n > 0 {
                out.push(',');
                if n % per_line == 0 {
                    out.push('\n');
                    push_n(out, ' ', axis + 1);
                } else {
                    out.push(' ');
                }
            }
            let text = match value {
                Some(x) => self.notation.text(x),
                None => "...".to_string(),
            };
            write!(out, "{text:>width$}", width = self.width)?;
        }
        out.push(']');
        Ok(())
    }
}
