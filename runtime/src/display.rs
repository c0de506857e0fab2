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

/// The indices of an axis of length `len` that print, `None` standing for the `...` between.
fn shown_indices(len: usize, summarize: bool) -> Vec<Option<usize>> {
    if summarize && len > 2 * EDGE_ITEMS {
        (0..EDGE_ITEMS)
            .map(Some)
            .chain([None])
            .chain((len - EDGE_ITEMS..len).map(Some))
            .collect()
    } else {
        (0..len).map(Some).collect()
    }
}

/// Writes `data`, row-major of `shape`, then `kind[shape; dtype]`: the `Display` of tensors and
/// parameters.
pub(crate) fn fmt_values<T: DType>(
    f: &mut fmt::Formatter<'_>,
    kind: &str,
    shape: &[usize],
    data: &[T],
) -> fmt::Result {
    let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
    let footer = format!("{kind}[{}; {}]", dims.join(", "), T::NAME);
    if data.is_empty() {
        // Nothing to visit: an empty tensor's other axes may be 2^40 long.
        return write!(f, "[]\n{footer}");
    }
    let mut printer = Printer {
        shape,
        strides: strides(shape),
        data,
        axes: shape
            .iter()
            .map(|&len| shown_indices(len, data.len() > SUMMARIZE_ABOVE))
            .collect(),
        notation: Notation::Integer,
        width: 0,
    };
    let mut shown = Vec::new();
    printer.visit(0, 0, &mut |i| shown.push(data[i]));
    printer.notation = Notation::choose(&shown, f.precision().unwrap_or(DEFAULT_PRECISION));
    printer.width = shown
        .iter()
        .map(|&x| printer.notation.text(x).chars().count())
        .max()
        .unwrap_or(0);

    let mut out = String::new();
    match (shape, data) {
        ([], [x]) => out.push_str(&printer.notation.text(*x)),
        _ => printer.write_axis(&mut out, 0, 0)?,
    }
    write!(out, "\n{footer}")?;
    f.write_str(&out)
}

/// Row-major strides of `shape`, in elements.
fn strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for axis in (0..shape.len().saturating_sub(1)).rev() {
        strides[axis] = strides[axis + 1] * shape[axis + 1];
    }
    strides
}

struct Printer<'a, T> {
    shape: &'a [usize],
    strides: Vec<usize>,
    data: &'a [T],
    /// The shown indices of each axis.
    axes: Vec<Vec<Option<usize>>>,
    notation: Notation,
    /// The width every element is right-aligned to.
    width: usize,
}

impl<T: DType> Printer<'_, T> {
    /// Calls `f` with the flat index of every shown element from `axis` on, in order.
    fn visit(&self, axis: usize, offset: usize, f: &mut impl FnMut(usize)) {
        if axis == self.shape.len() {
            f(offset);
            return;
        }
        for i in self.axes[axis].iter().flatten() {
            self.visit(axis + 1, offset + i * self.strides[axis], f);
        }
    }

    /// Writes the sub-tensor at `offset` from `axis` on; `axis` brackets are open before it.
    fn write_axis(&self, out: &mut String, axis: usize, offset: usize) -> fmt::Result {
        let last = axis + 1 == self.shape.len();
        let indent = " ".repeat(axis + 1);
        out.push('[');
        if last {
            // Rows wrap at the line width, counting an element with its ", ".
            let per_line = ((LINE_WIDTH.saturating_sub(axis)) / (self.width + 2)).max(1);
            for (n, i) in self.axes[axis].iter().enumerate() {
                if n > 0 {
                    out.push(',');
                    match n % per_line {
                        0 => write!(out, "\n{indent}")?,
                        _ => out.push(' '),
                    }
                }
                let text = match i {
                    Some(i) => self
                        .notation
                        .text(self.data[offset + i * self.strides[axis]]),
                    None => "...".to_string(),
                };
                write!(out, "{text:>width$}", width = self.width)?;
            }
        } else {
            // A blank line between blocks per axis below the next: none between rows.
            let separator = format!(",{}{indent}", "\n".repeat(self.shape.len() - axis - 1));
            for (n, i) in self.axes[axis].iter().enumerate() {
                if n > 0 {
                    out.push_str(&separator);
                }
                match i {
                    Some(i) => self.write_axis(out, axis + 1, offset + i * self.strides[axis])?,
                    None => out.push_str("..."),
                }
            }
        }
        out.push(']');
        Ok(())
    }
}
