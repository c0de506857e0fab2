//! The pointwise kernels the elementwise ops and the elementwise functions share, recording
//! nothing: `f` of every element, and `f` of every pair of two broadcast tensors, each written in
//! place into an operand that can take it.

use super::{rows, simd, work};
use crate::autograd::Arg;
use crate::dims::{Dims, Walk};
use crate::element::Element;
use crate::error::Result;
use crate::scope::State;
use crate::tensor::Tensor;

/// `f` of every element of `src`: in its buffer when it is owned and unique, else into a new
/// tensor of `scope`. Records nothing.
pub(crate) fn map<'s, T: Element>(
    src: Arg<'_, 's, T>,
    scope: &State,
    f: impl Fn(T) -> T + Sync,
) -> Result<Tensor<'s, T>> {
    let shape = Dims::from_slice(src.tensor().shape());
    match src.into_writable(shape.slice()) {
        Ok(mut t) => {
            simd::map_in_place(t.unique_slice_mut(), f);
            Ok(t.with_scope(scope))
        }
        Err(src) => {
            let mut out = Tensor::try_rent_in(scope, shape.slice())?;
            simd::map_into(out.unique_slice_mut(), src.tensor().slice(), f);
            Ok(out)
        }
    }
}

/// `f(a, b)` elementwise over the broadcast `shape`, written into a unique owned operand that has
/// the output's shape, else into a new tensor of `scope`. Records nothing: the kernel of
/// [`Binary`], `zip_map` and backward rules.
// The closures that only call `f` are on purpose (see below).
#[allow(clippy::redundant_closure)]
pub(crate) fn zip_kernel<'s, T: Element>(
    scope: &State,
    shape: &[usize],
    a: Arg<'_, 's, T>,
    b: Arg<'_, 's, T>,
    f: impl Fn(T, T) -> T + Sync,
) -> Result<Tensor<'s, T>> {
    if shape.contains(&0) {
        // Nothing to compute; a broadcast walk over the empty shape could still loop over rows.
        return Tensor::try_rent_in(scope, shape);
    }
    // The closures passed on call `f` itself: a `&F` passed as the function would be called
    // through core's out-of-line `Fn for &F` shim, outside the vectorised loop.
    let a = match a.into_writable(shape) {
        Ok(mut dst) => {
            write_over(
                &mut dst,
                b.tensor(),
                #[inline(always)]
                |x, y| f(x, y),
            );
            return Ok(dst.with_scope(scope));
        }
        Err(a) => a,
    };
    let b = match b.into_writable(shape) {
        Ok(mut dst) => {
            write_over(
                &mut dst,
                a.tensor(),
                #[inline(always)]
                |y, x| f(x, y),
            );
            return Ok(dst.with_scope(scope));
        }
        Err(b) => b,
    };
    let (a, b) = (a.tensor(), b.tensor());
    let mut out = Tensor::try_rent_in(scope, shape)?;
    if a.shape() == shape && b.shape() == shape {
        simd::zip_into(out.unique_slice_mut(), a.slice(), b.slice(), f);
    } else {
        work::visit(rows(shape));
        let ((x, x_at), (y, y_at)) = (a.buffer(), b.buffer());
        let walk = Walk::new(
            shape,
            [x_at, y_at],
            [&a.steps_over(shape), &b.steps_over(shape)],
        );
        let out_values = out.unique_slice_mut();
        walk.for_each_run(|at, [x_at, y_at], len, [sx, sy]| {
            let dst = &mut out_values[at..at + len];
            simd::zip_strided(dst, (&x[x_at..], sx), (&y[y_at..], sy), |x, y| f(x, y))
        });
    }
    Ok(out)
}

/// Whether `small` broadcasts over `big` as a repeated trailing block (`[64]` over `[n, 64]`), so
/// that both can be walked as plain slices.
fn is_trailing_block(big: &[usize], small: &[usize]) -> bool {
    small.len() <= big.len() && big[big.len() - small.len()..] == *small && !small.is_empty()
}

/// `dst = f(dst, other)` elementwise, `other` broadcast to `dst`'s shape (already checked, and not
/// empty).
fn write_over<T: Element>(
    dst: &mut Tensor<'_, T>,
    other: &Tensor<'_, T>,
    f: impl Fn(T, T) -> T + Sync,
) {
    if dst.shape() == other.shape() || is_trailing_block(dst.shape(), other.shape()) {
        // The same shape, or a row vector (or trailing block) added to every row: contiguous
        // chunks, no index math.
        simd::zip_in_place(dst.unique_slice_mut(), other.slice(), f);
    } else {
        work::visit(rows(dst.shape()));
        let (o, o_at) = other.buffer();
        let walk = Walk::new(dst.shape(), [o_at], [&other.steps_over(dst.shape())]);
        let values = dst.unique_slice_mut();
        walk.for_each_run(|at, [o_at], len, [so]| {
            let run = &mut values[at..at + len];
            for (i, d) in run.iter_mut().enumerate() {
                *d = f(*d, o[o_at + i * so]);
            }
        });
    }
}
