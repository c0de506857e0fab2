//! Binary elementwise ops with NumPy broadcasting, as operators and methods. Their example is in
//! the `ops` module docs: this module's are not rendered.
//!
//! `+ - * /` are implemented for every mix of `Tensor` and `&Tensor`, with a `&Param` on the right
//! (`&h + &bias`), and with an element scalar on the right (`&x * 2.0`); `f32` and `f64` scalars also
//! work on the left (`2.0 * &x`). A by-value operand that is unique and already has the output's shape
//! receives the result in place (a parameter never does).

use std::ops::{Add, Div, Mul, Sub};

use crate::dims::{Dims, Walk};

use super::pointwise::{map, zip_kernel};
use super::reduce::reduce_to;
use super::{broadcast_shape, rows, work, Operand};
use crate::autograd::{self, args, Arg, Backward, Forward, Grads, Op, Saved};
use crate::element::Element;
use crate::error::{or_panic, panicking, Result};
use crate::param::Param;
use crate::tensor::Tensor;

/// `a + b`, `a - b`, `a * b`, `a / b`, `maximum(a, b)`, `minimum(a, b)` and `a ^ b` with
/// broadcasting: one record for them all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Binary {
    Add,
    Sub,
    Mul,
    Div,
    Maximum,
    Minimum,
    Pow,
}

impl<T: Element> Op<T> for Binary {
    /// The inputs' shapes (to reduce a broadcast gradient to), and the inputs for the ops whose
    /// derivative reads them (all but `+` and `-`).
    type Saved<'s> = (Dims, Dims, Option<(Saved<'s, T>, Saved<'s, T>)>);

    fn name(&self) -> &'static str {
        match self {
            Binary::Add => "add",
            Binary::Sub => "sub",
            Binary::Mul => "mul",
            Binary::Div => "div",
            Binary::Maximum => "maximum",
            Binary::Minimum => "minimum",
            Binary::Pow => "pow",
        }
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        let (a, b) = (cx.input(0), cx.input(1));
        let shape = broadcast_shape(Op::<T>::name(self), a.shape(), b.shape())?;
        // Saved before the kernel runs: an alias keeps an input from being written over.
        let saved = cx.saving().then(|| {
            let reads = !matches!(self, Binary::Add | Binary::Sub);
            let values = reads.then(|| (cx.save(a), cx.save(b)));
            (
                Dims::from_slice(a.shape()),
                Dims::from_slice(b.shape()),
                values,
            )
        });
        let (a, b) = (cx.take(0), cx.take(1));
        let (scope, shape) = (cx.scope(), shape.slice());
        let out = match self {
            Binary::Add => zip_kernel(
                scope,
                shape,
                a,
                b,
                #[inline(always)]
                |x, y| x + y,
            ),
            Binary::Sub => zip_kernel(
                scope,
                shape,
                a,
                b,
                #[inline(always)]
                |x, y| x - y,
            ),
            Binary::Mul => zip_kernel(
                scope,
                shape,
                a,
                b,
                #[inline(always)]
                |x, y| x * y,
            ),
            Binary::Div => zip_kernel(
                scope,
                shape,
                a,
                b,
                #[inline(always)]
                |x, y| x / y,
            ),
            // NaN wins, as in `torch.maximum`: `x > NaN` is false, so a NaN `y` is taken.
            Binary::Maximum => zip_kernel(
                scope,
                shape,
                a,
                b,
                #[inline(always)]
                |x, y| if x > y || x.is_nan() { x } else { y },
            ),
            Binary::Minimum => zip_kernel(
                scope,
                shape,
                a,
                b,
                #[inline(always)]
                |x, y| if x < y || x.is_nan() { x } else { y },
            ),
            Binary::Pow => zip_kernel(
                scope,
                shape,
                a,
                b,
                #[inline(always)]
                |x, y| x.powf(y),
            ),
        }?;
        Ok((out, saved))
    }

    fn backward<'b>(
        &self,
        (a_shape, b_shape, values): Self::Saved<'b>,
        g: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
        let (da, db) = match (self, values) {
            (Binary::Add, _) => (
                cx.needs(0).then(|| reduce_to(g.clone(), a_shape.slice())),
                cx.needs(1).then(|| reduce_to(g, b_shape.slice())),
            ),
            (Binary::Sub, _) => (
                cx.needs(0).then(|| reduce_to(g.clone(), a_shape.slice())),
                cx.needs(1)
                    .then(|| reduce_to(negated(g, cx)?, b_shape.slice())),
            ),
            (Binary::Mul, Some((a, b))) => {
                let (a, b) = (a.get(cx), b.get(cx));
                (
                    cx.needs(0).then(|| reduce_to(g.try_mul(&b)?, a.shape())),
                    cx.needs(1).then(|| reduce_to(g.try_mul(&a)?, b.shape())),
                )
            }
            (Binary::Div, Some((a, b))) => {
                let (a, b) = (a.get(cx), b.get(cx));
                (
                    cx.needs(0).then(|| reduce_to(g.try_div(&b)?, a.shape())),
                    cx.needs(1).then(|| {
                        // d(a / b)/db = -a / b^2
                        let q = g.try_mul(&a)?.try_div(&b)?.try_div(&b)?;
                        reduce_to(negated(q, cx)?, b.shape())
                    }),
                )
            }
            (Binary::Maximum | Binary::Minimum, Some((a, b))) => {
                let (a, b) = (a.get(cx), b.get(cx));
                let max = *self == Binary::Maximum;
                (
                    cx.needs(0)
                        .then(|| grad_of(&g, &a, &b, a.shape(), |g, a, b| won(g, a, b, max))),
                    cx.needs(1)
                        .then(|| grad_of(&g, &a, &b, b.shape(), |g, a, b| won(g, b, a, max))),
                )
            }
            // As PyTorch's `pow_backward_self` and `pow_backward_exponent`: `x^0` is constant (its
            // gradient 0 even at x = 0, where `0 * 0^-1` is NaN), and `x^e` for `e >= 0` is taken
            // as constant in `e` at x = 0 (where `0 * ln 0` is NaN).
            (Binary::Pow, Some((x, e))) => {
                let (x, e) = (x.get(cx), e.get(cx));
                let zero = T::zero();
                (
                    cx.needs(0).then(|| {
                        grad_of(&g, &x, &e, x.shape(), |g, x, e| match e == zero {
                            true => zero,
                            false => g * e * x.powf(e - T::one()),
                        })
                    }),
                    cx.needs(1).then(|| {
                        grad_of(&g, &x, &e, e.shape(), |g, x, e| {
                            match e >= zero && x == zero {
                                true => zero,
                                false => g * x.powf(e) * x.ln(),
                            }
                        })
                    }),
                )
            }
            (_, None) => unreachable!("the ops whose derivative reads their inputs save them"),
        };
        Ok(Grads::from([da.transpose()?, db.transpose()?]))
    }
}

/// The share of `g` that reaches an input of `maximum` (`max`) or `minimum` holding `mine` against
/// `other`, as PyTorch's derivatives: all of it where `mine` is taken, none where `other` is, half
/// on a tie (and all of it where either is NaN, which compares neither way).
#[inline(always)]
fn won<T: Element>(g: T, mine: T, other: T, max: bool) -> T {
    if mine == other {
        g / T::from_f64(2.0)
    } else if (max && mine < other) || (!max && mine > other) {
        T::zero()
    } else {
        g
    }
}

/// `f(g, a, b)` for every element of `g`, with `a` and `b` broadcast to its shape, summed to
/// `shape`: the gradient of an input of shape `shape` of a binary op whose derivative reads both
/// inputs.
fn grad_of<'b, T: Element>(
    g: &Tensor<'b, T>,
    a: &Tensor<'b, T>,
    b: &Tensor<'b, T>,
    shape: &[usize],
    f: impl Fn(T, T, T) -> T,
) -> Result<Tensor<'b, T>> {
    let shape_g = g.shape();
    let mut out = Tensor::try_rent_in(&g.rents_in, shape_g)?;
    if !out.is_empty() {
        work::visit(rows(shape_g));
        let steps = [g, a, b].map(|t| t.steps_over(shape_g));
        let [(g, g_at), (a, a_at), (b, b_at)] = [g, a, b].map(|t| t.buffer());
        let walk = Walk::new(shape_g, [g_at, a_at, b_at], steps.each_ref().map(|s| &**s));
        let values = out.unique_slice_mut();
        walk.for_each_run(|at, [g_at, a_at, b_at], len, [sg, sa, sb]| {
            for (i, o) in values[at..at + len].iter_mut().enumerate() {
                *o = f(g[g_at + i * sg], a[a_at + i * sa], b[b_at + i * sb]);
            }
        });
    }
    reduce_to(out, shape)
}

/// `-g`, in `g`'s buffer when it is unique (a backward's: nothing records).
fn negated<'b, T: Element>(g: Tensor<'b, T>, cx: &Backward<'b>) -> Result<Tensor<'b, T>> {
    map(
        Arg::Owned(g),
        cx.at(),
        #[inline(always)]
        |v: T| -v,
    )
}

/// `x <op> c` (or `c <op> x`) for a scalar `c`: one record for every such op.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scalar<T> {
    pub(crate) kind: ScalarKind,
    pub(crate) c: T,
}

/// Which op a [`Scalar`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScalarKind {
    /// `x + c` (and `c + x`).
    Add,
    /// `x - c`.
    Sub,
    /// `c - x`.
    SubFrom,
    /// `x * c` (and `c * x`).
    Mul,
    /// `x / c`.
    Div,
    /// `c / x`: its backward needs `x`.
    DivInto,
    /// `x ^ c`: its backward needs `x`.
    Pow,
}

impl<T: Element> Op<T> for Scalar<T> {
    /// The input, for `c / x` and `x ^ c`.
    type Saved<'s> = Option<Saved<'s, T>>;

    fn name(&self) -> &'static str {
        match self.kind {
            ScalarKind::Pow => "pow",
            _ => "scalar",
        }
    }

    fn forward<'s>(
        &self,
        cx: &mut Forward<'_, 's, T>,
    ) -> Result<(Tensor<'s, T>, Option<Self::Saved<'s>>)> {
        use ScalarKind::*;
        let saves = matches!(self.kind, DivInto | Pow);
        let saved = cx.saving().then(|| saves.then(|| cx.save(cx.input(0))));
        let x = cx.take(0);
        let (scope, c) = (cx.scope(), self.c);
        let out = match self.kind {
            Add => map(
                x,
                scope,
                #[inline(always)]
                move |v| v + c,
            ),
            Sub => map(
                x,
                scope,
                #[inline(always)]
                move |v| v - c,
            ),
            SubFrom => map(
                x,
                scope,
                #[inline(always)]
                move |v| c - v,
            ),
            Mul => map(
                x,
                scope,
                #[inline(always)]
                move |v| v * c,
            ),
            Div => map(
                x,
                scope,
                #[inline(always)]
                move |v| v / c,
            ),
            DivInto => map(
                x,
                scope,
                #[inline(always)]
                move |v| c / v,
            ),
            Pow => map(
                x,
                scope,
                #[inline(always)]
                move |v| v.powf(c),
            ),
        }?;
        Ok((out, saved))
    }

    fn backward<'b>(
        &self,
        x: Self::Saved<'b>,
        g: Tensor<'b, T>,
        cx: &Backward<'b>,
    ) -> Result<Grads<'b, T>> {
        use ScalarKind::*;
        let (c, at, shape) = (self.c, cx.at(), Dims::from_slice(g.shape()));
        let x = || x.as_ref().expect("`c / x` and `x ^ c` save `x`").get(cx);
        let shape = shape.slice();
        let dx = match self.kind {
            Add | Sub => g,
            SubFrom => negated(g, cx)?,
            Mul => map(
                Arg::Owned(g),
                at,
                #[inline(always)]
                move |v| v * c,
            )?,
            Div => map(
                Arg::Owned(g),
                at,
                #[inline(always)]
                move |v| v / c,
            )?,
            DivInto => zip_kernel(
                at,
                shape,
                Arg::Owned(g),
                Arg::Owned(x()),
                #[inline(always)]
                move |g, x| -g * c / (x * x),
            )?,
            // `x^0` is constant: its gradient is 0, also at x = 0 (where `0 * 0^-1` is NaN).
            Pow if c == T::zero() => map(
                Arg::Owned(g),
                at,
                #[inline(always)]
                |_| T::zero(),
            )?,
            Pow => zip_kernel(
                at,
                shape,
                Arg::Owned(g),
                Arg::Owned(x()),
                #[inline(always)]
                move |g, x| g * c * x.powf(c - T::one()),
            )?,
        };
        Ok(Grads::from([Some(dx)]))
    }
}

/// `x <kind> c` on a tensor given by value or by reference.
pub(crate) fn scalar<'s, T: Element>(
    x: Arg<'_, 's, T>,
    kind: ScalarKind,
    c: T,
) -> Result<Tensor<'s, T>> {
    autograd::run(Scalar { kind, c }, &mut args([x]))
}

impl<'s, T: Element> Tensor<'s, T> {
    /// `self + other` written into this tensor's buffer when it is the only handle on it.
    pub(crate) fn try_add_owned(self, other: &Tensor<'_, T>) -> Result<Tensor<'s, T>> {
        let other = other.alias_in(&self.rents_in);
        autograd::run(
            Binary::Add,
            &mut args([Arg::Owned(self), Arg::Borrowed(&other)]),
        )
    }

    /// This tensor repeated along its length-1 axes (and new leading axes) to `shape`, in a new
    /// buffer. Not recorded: for backward rules.
    pub(crate) fn try_broadcast_to(&self, shape: &[usize]) -> Result<Tensor<'s, T>> {
        let out_shape = broadcast_shape("broadcast_to", self.shape(), shape)?;
        let mut out = Tensor::try_rent_in(&self.rents_in, out_shape.slice())?;
        if !out.is_empty() {
            work::visit(rows(out_shape.slice()));
            out.copy_from(self);
        }
        Ok(out)
    }
}

impl<'s, T: Element> Tensor<'s, T> {
    /// `self <kind> other`, recorded.
    fn binary(&self, kind: Binary, other: &impl Operand<'s, T>) -> Result<Tensor<'s, T>> {
        let other = other.bind_beside(self);
        autograd::run(
            kind,
            &mut args([Arg::Borrowed(self), Arg::Borrowed(&*other)]),
        )
    }

    /// The larger of `self` and `other` elementwise, with broadcasting, for a tensor or a
    /// [`Param`] `other` (PyTorch's `torch.maximum`): NaN where either is NaN. The gradient goes to
    /// the larger, split in half on a tie. Fails with
    /// [`Error::ShapeMismatch`](crate::Error::ShapeMismatch) if the shapes do not broadcast.
    pub fn try_maximum(&self, other: &impl Operand<'s, T>) -> Result<Tensor<'s, T>> {
        self.binary(Binary::Maximum, other)
    }

    /// The smaller of `self` and `other` elementwise; as [`Tensor::try_maximum`] otherwise.
    pub fn try_minimum(&self, other: &impl Operand<'s, T>) -> Result<Tensor<'s, T>> {
        self.binary(Binary::Minimum, other)
    }

    /// `self` to the power `exponent` elementwise, with broadcasting (PyTorch's `torch.pow` of two
    /// tensors; [`TensorOps::pow`](crate::TensorOps::pow) takes a number). Both operands get a
    /// gradient: `e x^(e-1)` for the base and `x^e ln x` for the exponent, 0 for the base where
    /// `e = 0` and for the exponent where `x = 0` and `e >= 0`, as in PyTorch (a negative base
    /// gives NaN where the exponent is fractional, and in the exponent's gradient). Fails with
    /// [`Error::ShapeMismatch`](crate::Error::ShapeMismatch) if the shapes do not broadcast.
    pub fn try_pow_tensor(&self, exponent: &impl Operand<'s, T>) -> Result<Tensor<'s, T>> {
        self.binary(Binary::Pow, exponent)
    }

    panicking! {
        /// The larger of `self` and `other` elementwise.
        pub fn maximum(&self, other: &impl Operand<'s, T>) -> Tensor<'s, T> = try_maximum;
        /// The smaller of `self` and `other` elementwise.
        pub fn minimum(&self, other: &impl Operand<'s, T>) -> Tensor<'s, T> = try_minimum;
        /// `self` to the power `exponent` elementwise.
        pub fn pow_tensor(&self, exponent: &impl Operand<'s, T>) -> Tensor<'s, T> = try_pow_tensor;
    }

    /// `f(a, b)` for every pair of elements of `self` and `other` broadcast together. Fails with
    /// [`Error::ShapeMismatch`](crate::Error::ShapeMismatch) if the shapes do not broadcast. `f` has
    /// no known derivative: a backward through the result fails.
    pub fn try_zip_map(
        &self,
        other: &impl Operand<'s, T>,
        f: impl Fn(T, T) -> T + Sync,
    ) -> Result<Tensor<'s, T>> {
        let other = other.bind_beside(self);
        let inputs = &mut args([Arg::Borrowed(self), Arg::Borrowed(&*other)]);
        autograd::run_opaque("zip_map", inputs, |cx| {
            let shape = broadcast_shape("zip_map", cx.input(0).shape(), cx.input(1).shape())?;
            let (a, b) = (cx.take(0), cx.take(1));
            zip_kernel(cx.scope(), shape.slice(), a, b, f)
        })
    }

    panicking! {
        /// `f(a, b)` elementwise with broadcasting.
        pub fn zip_map(&self, other: &impl Operand<'s, T>, f: impl Fn(T, T) -> T + Sync) -> Tensor<'s, T> = try_zip_map;
    }
}

macro_rules! binary_op {
    ($Trait:ident, $method:ident, $try_method:ident, $kind:ident, $op:tt, $scalar:ident, $scalar_lhs:ident) => {
        impl<'s, T: Element> Tensor<'s, T> {
            #[doc = concat!("`self ", stringify!($op), " other` elementwise with broadcasting, for a tensor or a")]
            #[doc = "[`Param`] `other`. Fails with [`Error::ShapeMismatch`](crate::Error::ShapeMismatch)"]
            #[doc = "if the shapes do not broadcast."]
            pub fn $try_method(&self, other: &impl Operand<'s, T>) -> Result<Tensor<'s, T>> {
                self.binary(Binary::$kind, other)
            }
        }

        impl<'s, T: Element> $Trait<&Param<T>> for Tensor<'s, T> {
            type Output = Tensor<'s, T>;
            #[track_caller]
            fn $method(self, rhs: &Param<T>) -> Tensor<'s, T> {
                let rhs = self.bind(rhs);
                or_panic(autograd::run(Binary::$kind, &mut args([Arg::Owned(self), Arg::Borrowed(&rhs)])))
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
                or_panic(scalar(Arg::Owned(self), ScalarKind::$scalar, rhs))
            }
        }

        impl<'s, T: Element> $Trait<T> for &Tensor<'s, T> {
            type Output = Tensor<'s, T>;
            #[track_caller]
            fn $method(self, rhs: T) -> Tensor<'s, T> {
                or_panic(scalar(Arg::Borrowed(self), ScalarKind::$scalar, rhs))
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
                or_panic(autograd::run(Binary::$kind, &mut args([Arg::$lw(self), Arg::$rw(rhs)])))
            }
        }
    };
    (@scalar_lhs $Trait:ident, $method:ident, $op:tt, $scalar_lhs:ident, $t:ty) => {
        impl<'s> $Trait<Tensor<'s, $t>> for $t {
            type Output = Tensor<'s, $t>;
            #[track_caller]
            fn $method(self, rhs: Tensor<'s, $t>) -> Tensor<'s, $t> {
                or_panic(scalar(Arg::Owned(rhs), ScalarKind::$scalar_lhs, self))
            }
        }

        impl<'s> $Trait<&Tensor<'s, $t>> for $t {
            type Output = Tensor<'s, $t>;
            #[track_caller]
            fn $method(self, rhs: &Tensor<'s, $t>) -> Tensor<'s, $t> {
                or_panic(scalar(Arg::Borrowed(rhs), ScalarKind::$scalar_lhs, self))
            }
        }
    };
}

binary_op!(Add, add, try_add, Add, +, Add, Add);
binary_op!(Sub, sub, try_sub, Sub, -, Sub, SubFrom);
binary_op!(Mul, mul, try_mul, Mul, *, Mul, Mul);
binary_op!(Div, div, try_div, Div, /, Div, DivInto);
