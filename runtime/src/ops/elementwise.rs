//! Binary elementwise ops with NumPy broadcasting, as operators and methods. Their example is in
//! the `ops` module docs: this module's are not rendered.
//!
//! `+ - * /` are implemented for every mix of `Tensor` and `&Tensor`, with a `&Param` on the right
//! (`&h + &bias`), and with an element scalar on the right (`&x * 2.0`); `f32` and `f64` scalars also
//! work on the left (`2.0 * &x`). A by-value operand that is unique and already has the output's shape
//! receives the result in place (a parameter never does).

use std::ops::{Add, Div, Mul, Neg, Sub};

use ndarray::{Dimension, IxDyn, Zip};

use super::tensor_ops::{scalar, unary};
use super::{broadcast_shape, rows, simd, work, Arg, Operand};
use crate::autograd::{self, Recorder, Rule, Scalar, Unary};
use crate::element::Element;
use crate::error::{or_panic, Result};
use crate::param::Param;
use crate::scope::deeper;
use crate::tensor::Tensor;

/// The binary ops, for their names and backward rules.
#[derive(Clone, Copy)]
pub(crate) enum Binary {
    Add,
    Sub,
    Mul,
    Div,
    /// A user's function: no derivative.
    ZipMap,
}

impl Binary {
    fn name(self) -> &'static str {
        match self {
            Binary::Add => "add",
            Binary::Sub => "sub",
            Binary::Mul => "mul",
            Binary::Div => "div",
            Binary::ZipMap => "zip_map",
        }
    }

    /// The rule, made from the inputs before the op runs (so what it saves is not overwritten).
    fn rule<T: Element>(self, a: &Tensor<'_, T>, b: &Tensor<'_, T>) -> Rule<T> {
        let shape = |t: &Tensor<'_, T>| IxDyn(t.shape());
        match self {
            Binary::Add => Rule::Add(shape(a), shape(b)),
            Binary::Sub => Rule::Sub(shape(a), shape(b)),
            Binary::Mul => Rule::Mul(a.saved(), b.saved()),
            Binary::Div => Rule::Div(a.saved(), b.saved()),
            Binary::ZipMap => Rule::NotDifferentiable("zip_map"),
        }
    }
}

/// `f(a, b)` elementwise over the broadcast shape, written into a unique owned operand if one fits,
/// with `op`'s backward rule recorded.
pub(crate) fn zip_with<'s, T: Element>(
    op: Binary,
    a: Arg<'_, 's, T>,
    b: Arg<'_, 's, T>,
    f: impl Fn(T, T) -> T + Sync,
) -> Result<Tensor<'s, T>> {
    let shape = broadcast_shape(op.name(), a.tensor().shape(), b.tensor().shape())?;
    let shape = shape.slice();
    let recorder = Recorder::of(&[a.tensor(), b.tensor()]);
    let rule = recorder.as_ref().map(|_| op.rule(a.tensor(), b.tensor()));
    let out = zip_kernel(shape, a, b, f)?;
    Ok(autograd::finish(recorder, out, |_| {
        rule.expect("made when recording")
    }))
}

// The closures that only call `f` are on purpose (see below).
#[allow(clippy::redundant_closure)]
fn zip_kernel<'s, T: Element>(
    shape: &[usize],
    a: Arg<'_, 's, T>,
    b: Arg<'_, 's, T>,
    f: impl Fn(T, T) -> T + Sync,
) -> Result<Tensor<'s, T>> {
    let scope = deeper(&a.tensor().rents_in, &b.tensor().rents_in).clone();
    if shape.contains(&0) {
        // Nothing to compute; a broadcast walk over the empty shape could still loop over rows.
        return Tensor::try_rent_in(&scope, shape);
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
            return Ok(dst.with_scope(&scope));
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
            return Ok(dst.with_scope(&scope));
        }
        Err(b) => b,
    };
    let (a, b) = (a.tensor(), b.tensor());
    let mut out = Tensor::try_rent_in(&scope, shape)?;
    if a.shape() == shape && b.shape() == shape {
        simd::zip_into(out.unique_slice_mut(), a.as_slice(), b.as_slice(), f);
    } else {
        work::visit(rows(shape));
        Zip::from(out.unique_view_mut())
            .and_broadcast(&a.view())
            .and_broadcast(&b.view())
            .for_each(|o, &x, &y| *o = f(x, y));
    }
    Ok(out)
}

impl<'s, T: Element> Tensor<'s, T> {
    /// `self + other` written into this tensor's buffer when it is the only handle on it.
    pub(crate) fn try_add_owned(self, other: &Tensor<'_, T>) -> Result<Tensor<'s, T>> {
        let other = other.alias_in(&self.rents_in);
        zip_with(
            Binary::Add,
            Arg::Owned(self),
            Arg::Borrowed(&other),
            #[inline(always)]
            |x, y| x + y,
        )
    }

    /// This tensor repeated along its length-1 axes (and new leading axes) to `shape`, in a new
    /// buffer. Not recorded: for backward rules.
    pub(crate) fn try_broadcast_to(&self, shape: &[usize]) -> Result<Tensor<'s, T>> {
        let out_shape = broadcast_shape("broadcast_to", self.shape(), shape)?;
        let mut out = Tensor::try_rent_in(&self.rents_in, out_shape.slice())?;
        if !out.is_empty() {
            work::visit(rows(out_shape.slice()));
            Zip::from(out.unique_view_mut())
                .and_broadcast(&self.view())
                .for_each(|o, &x| *o = x);
        }
        Ok(out)
    }
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
        simd::zip_in_place(dst.unique_slice_mut(), other.as_slice(), f);
    } else {
        work::visit(rows(dst.shape()));
        Zip::from(dst.unique_view_mut())
            .and_broadcast(&other.view())
            .for_each(|d, &o| *d = f(*d, o));
    }
}

impl<'s, T: Element> Tensor<'s, T> {
    /// `f(a, b)` for every pair of elements of `self` and `other` broadcast together. Fails with
    /// [`Error::ShapeMismatch`](crate::Error::ShapeMismatch) if the shapes do not broadcast. `f` has
    /// no known derivative: a backward through the result fails.
    pub fn try_zip_map(
        &self,
        other: &impl Operand<'s, T>,
        f: impl Fn(T, T) -> T + Sync,
    ) -> Result<Tensor<'s, T>> {
        let other = other.bind_beside(self);
        zip_with(
            Binary::ZipMap,
            Arg::Borrowed(self),
            Arg::Borrowed(&other),
            f,
        )
    }

    /// `f(a, b)` elementwise with broadcasting; see [`Tensor::try_zip_map`].
    ///
    /// # Panics
    /// If the shapes do not broadcast or the budget is exhausted, with the error's message.
    #[track_caller]
    pub fn zip_map(
        &self,
        other: &impl Operand<'s, T>,
        f: impl Fn(T, T) -> T + Sync,
    ) -> Tensor<'s, T> {
        or_panic(self.try_zip_map(other, f))
    }
}

macro_rules! binary_op {
    ($Trait:ident, $method:ident, $try_method:ident, $kind:ident, $op:tt, $scalar:ident, $scalar_lhs:ident) => {
        impl<'s, T: Element> Tensor<'s, T> {
            #[doc = concat!("`self ", stringify!($op), " other` elementwise with broadcasting, for a tensor or a")]
            #[doc = "[`Param`] `other`. Fails with [`Error::ShapeMismatch`](crate::Error::ShapeMismatch)"]
            #[doc = "if the shapes do not broadcast."]
            pub fn $try_method(&self, other: &impl Operand<'s, T>) -> Result<Tensor<'s, T>> {
                let other = other.bind_beside(self);
                zip_with(Binary::$kind, Arg::Borrowed(self), Arg::Borrowed(&other), #[inline(always)] |x, y| x $op y)
            }
        }

        impl<'s, T: Element> $Trait<&Param<T>> for Tensor<'s, T> {
            type Output = Tensor<'s, T>;
            #[track_caller]
            fn $method(self, rhs: &Param<T>) -> Tensor<'s, T> {
                let rhs = self.bind(rhs);
                or_panic(zip_with(Binary::$kind, Arg::Owned(self), Arg::Borrowed(&rhs), #[inline(always)] |x, y| x $op y))
            }
        }

        impl<'s, T: Element> $Trait<&Param<T>> for &Tensor<'s, T> {
            type Output = Tensor<'s, T>;
            #[track_caller]
            fn $method(self, rhs: &Param<T>) -> Tensor<'s, T> {
                or_panic(self.$try_method(rhs))
            }
        }

        binary_op!(@impl $Trait, $method, $kind, $op, Tensor<'s, T>, Tensor<'s, T>, Owned, Owned);
        binary_op!(@impl $Trait, $method, $kind, $op, Tensor<'s, T>, &Tensor<'s, T>, Owned, Borrowed);
        binary_op!(@impl $Trait, $method, $kind, $op, &Tensor<'s, T>, Tensor<'s, T>, Borrowed, Owned);
        binary_op!(@impl $Trait, $method, $kind, $op, &Tensor<'s, T>, &Tensor<'s, T>, Borrowed, Borrowed);

        impl<'s, T: Element> $Trait<T> for Tensor<'s, T> {
            type Output = Tensor<'s, T>;
            #[track_caller]
            fn $method(self, rhs: T) -> Tensor<'s, T> {
                or_panic(scalar(Arg::Owned(self), Scalar::$scalar, rhs, move |x| x $op rhs))
            }
        }

        impl<'s, T: Element> $Trait<T> for &Tensor<'s, T> {
            type Output = Tensor<'s, T>;
            #[track_caller]
            fn $method(self, rhs: T) -> Tensor<'s, T> {
                or_panic(scalar(Arg::Borrowed(self), Scalar::$scalar, rhs, move |x| x $op rhs))
            }
        }

        binary_op!(@scalar_lhs $Trait, $method, $op, $scalar_lhs, f32);
        binary_op!(@scalar_lhs $Trait, $method, $op, $scalar_lhs, f64);
    };
    (@impl $Trait:ident, $method:ident, $kind:ident, $op:tt, $L:ty, $R:ty, $lw:ident, $rw:ident) => {
        impl<'s, T: Element> $Trait<$R> for $L {
            type Output = Tensor<'s, T>;
            #[track_caller]
            fn $method(self, rhs: $R) -> Tensor<'s, T> {
                or_panic(zip_with(Binary::$kind, Arg::$lw(self), Arg::$rw(rhs), #[inline(always)] |x, y| x $op y))
            }
        }
    };
    (@scalar_lhs $Trait:ident, $method:ident, $op:tt, $scalar_lhs:ident, $t:ty) => {
        impl<'s> $Trait<Tensor<'s, $t>> for $t {
            type Output = Tensor<'s, $t>;
            #[track_caller]
            fn $method(self, rhs: Tensor<'s, $t>) -> Tensor<'s, $t> {
                or_panic(scalar(Arg::Owned(rhs), Scalar::$scalar_lhs, self, move |x| self $op x))
            }
        }

        impl<'s> $Trait<&Tensor<'s, $t>> for $t {
            type Output = Tensor<'s, $t>;
            #[track_caller]
            fn $method(self, rhs: &Tensor<'s, $t>) -> Tensor<'s, $t> {
                or_panic(scalar(Arg::Borrowed(rhs), Scalar::$scalar_lhs, self, move |x| self $op x))
            }
        }
    };
}

binary_op!(Add, add, try_add, Add, +, Add, Add);
binary_op!(Sub, sub, try_sub, Sub, -, Sub, SubFrom);
binary_op!(Mul, mul, try_mul, Mul, *, Mul, Mul);
binary_op!(Div, div, try_div, Div, /, Div, DivInto);

impl<'s, T: Element> Neg for Tensor<'s, T> {
    type Output = Tensor<'s, T>;
    #[track_caller]
    fn neg(self) -> Tensor<'s, T> {
        or_panic(unary(Arg::Owned(self), Unary::Neg))
    }
}

impl<'s, T: Element> Neg for &Tensor<'s, T> {
    type Output = Tensor<'s, T>;
    #[track_caller]
    fn neg(self) -> Tensor<'s, T> {
        or_panic(unary(Arg::Borrowed(self), Unary::Neg))
    }
}
