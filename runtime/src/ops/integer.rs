//! Arithmetic on integer tensors (`i64`, `i32`): `+ - *` with broadcasting and with a scalar,
//! wrapping on overflow as PyTorch's, and floor division ([`Tensor::div_floor`], PyTorch's `//`).
//! Integer results carry no gradient, so these are plain kernels, not recorded ops; the output
//! rents in the deeper of the operands' scopes. Comparisons are [`Tensor::cmp`]'s, for every type.
//!
//! ```
//! use tensorscope::Pool;
//! let pool = Pool::with_max_memory_mb(16);
//! pool.scope(|s| {
//!     let ids = s.from_slice::<i64>(&[2, 2], &[7, -7, 7, -7]);
//!     let step = s.from_slice::<i64>(&[2], &[2, -2]);
//!     assert_eq!((&ids + 1).to_vec(), vec![8, -6, 8, -6]);
//!     assert_eq!((&ids * &step).to_vec(), vec![14, 14, 14, 14]);
//!     assert_eq!(ids.div_floor(&step).to_vec(), vec![3, 3, 3, 3]);
//!     assert_eq!(ids.div_floor_scalar(2).to_vec(), vec![3, -4, 3, -4]);
//! });
//! ```

use std::ops::{Add, Mul, Sub};

use super::broadcast_shape;
use super::mask::zip_broadcast;
use crate::element::DType;
use crate::error::{or_panic, panicking, Error, Result};
use crate::tensor::Tensor;

/// An integer element type with arithmetic: every op wraps on overflow, as PyTorch's integer
/// kernels (two's complement).
trait Integer: DType + Ord {
    fn wrapping_add(self, b: Self) -> Self;
    fn wrapping_sub(self, b: Self) -> Self;
    fn wrapping_mul(self, b: Self) -> Self;
    /// `floor(self / b)` for a non-zero `b` (`MIN // -1` wraps to `MIN`, as PyTorch).
    fn div_floor(self, b: Self) -> Self;
    const ZERO: Self;
}

macro_rules! integer {
    ($($t:ty),*) => {$(
        impl Integer for $t {
            #[inline(always)]
            fn wrapping_add(self, b: Self) -> Self {
                <$t>::wrapping_add(self, b)
            }
            #[inline(always)]
            fn wrapping_sub(self, b: Self) -> Self {
                <$t>::wrapping_sub(self, b)
            }
            #[inline(always)]
            fn wrapping_mul(self, b: Self) -> Self {
                <$t>::wrapping_mul(self, b)
            }
            #[inline(always)]
            fn div_floor(self, b: Self) -> Self {
                let q = self.wrapping_div(b);
                // Truncation rounds toward 0: one lower where a remainder is left and the signs
                // differ.
                if self.wrapping_rem(b) != 0 && (self < 0) != (b < 0) {
                    q - 1
                } else {
                    q
                }
            }
            const ZERO: Self = 0;
        }
    )*};
}
integer!(i64, i32);

/// An arithmetic op on integers.
#[derive(Clone, Copy)]
enum IntOp {
    Add,
    Sub,
    Mul,
    DivFloor,
}

impl IntOp {
    fn name(self) -> &'static str {
        match self {
            IntOp::Add => "add",
            IntOp::Sub => "sub",
            IntOp::Mul => "mul",
            IntOp::DivFloor => "div_floor",
        }
    }

    #[inline(always)]
    fn apply<I: Integer>(self, a: I, b: I) -> I {
        match self {
            IntOp::Add => a.wrapping_add(b),
            IntOp::Sub => a.wrapping_sub(b),
            IntOp::Mul => a.wrapping_mul(b),
            IntOp::DivFloor => a.div_floor(b),
        }
    }

    /// Checks a divisor: [`Error::InvalidArgument`] for a zero one (PyTorch's
    /// `ZeroDivisionError`), unless the output is empty.
    fn check<I: Integer>(self, divisors: &[I], output_empty: bool) -> Result<()> {
        match self {
            IntOp::DivFloor if !output_empty && divisors.contains(&I::ZERO) => {
                Err(Error::InvalidArgument {
                    op: "div_floor",
                    arg: "divisor",
                    reason: "division by zero".into(),
                })
            }
            _ => Ok(()),
        }
    }

    /// `a <op> b` with broadcasting, in the deeper of their scopes.
    fn tensors<'s, I: Integer>(
        self,
        a: &Tensor<'s, I>,
        b: &Tensor<'s, I>,
    ) -> Result<Tensor<'s, I>> {
        let shape = broadcast_shape(self.name(), a.shape(), b.shape())?;
        // The kernels read slices: views are copied first.
        let (a, b) = (&a.try_contiguous()?, &b.try_contiguous()?);
        self.check(b.slice(), shape.slice().contains(&0))?;
        zip_broadcast(self.name(), a, b, |x, y| self.apply(x, y))
    }

    /// `a <op> c` for every element of `a`, in its scope.
    fn scalar<'s, I: Integer>(self, a: &Tensor<'s, I>, c: I) -> Result<Tensor<'s, I>> {
        self.check(&[c], a.is_empty())?;
        let a = &a.try_contiguous()?;
        let mut out = Tensor::try_rent_in(&a.rents_in, a.shape())?;
        for (o, &x) in out.unique_slice_mut().iter_mut().zip(a.slice()) {
            *o = self.apply(x, c);
        }
        Ok(out)
    }
}

/// The methods and operators of one integer type (the methods cannot be generic over the integer
/// types: the float types have methods of the same names).
macro_rules! integer_tensor {
    ($($t:ty),*) => {$(
        impl<'s> Tensor<'s, $t> {
            /// `self + other` elementwise with broadcasting, wrapping on overflow. Fails with
            /// [`Error::ShapeMismatch`] if the shapes do not broadcast.
            pub fn try_add(&self, other: &Tensor<'s, $t>) -> Result<Tensor<'s, $t>> {
                IntOp::Add.tensors(self, other)
            }

            /// `self - other` elementwise with broadcasting, wrapping on overflow. Fails with
            /// [`Error::ShapeMismatch`] if the shapes do not broadcast.
            pub fn try_sub(&self, other: &Tensor<'s, $t>) -> Result<Tensor<'s, $t>> {
                IntOp::Sub.tensors(self, other)
            }

            /// `self * other` elementwise with broadcasting, wrapping on overflow. Fails with
            /// [`Error::ShapeMismatch`] if the shapes do not broadcast.
            pub fn try_mul(&self, other: &Tensor<'s, $t>) -> Result<Tensor<'s, $t>> {
                IntOp::Mul.tensors(self, other)
            }

            /// `floor(self / other)` elementwise with broadcasting (PyTorch's `//`: `-7 // 2` is
            /// -4). Fails with [`Error::ShapeMismatch`] if the shapes do not broadcast, and
            /// [`Error::InvalidArgument`] if a divisor is 0.
            pub fn try_div_floor(&self, other: &Tensor<'s, $t>) -> Result<Tensor<'s, $t>> {
                IntOp::DivFloor.tensors(self, other)
            }

            /// `floor(self / c)` elementwise. Fails with [`Error::InvalidArgument`] if `c` is 0 (and
            /// the tensor not empty).
            pub fn try_div_floor_scalar(&self, c: $t) -> Result<Tensor<'s, $t>> {
                IntOp::DivFloor.scalar(self, c)
            }

            // The panicking forms of `try_add`, `try_sub` and `try_mul` are the operators.
            panicking! {
                /// `floor(self / other)` elementwise with broadcasting.
                pub fn div_floor(&self, other: &Tensor<'s, $t>) -> Tensor<'s, $t> = try_div_floor;
                /// `floor(self / c)` elementwise.
                pub fn div_floor_scalar(&self, c: $t) -> Tensor<'s, $t> = try_div_floor_scalar;
            }
        }

        integer_tensor!(@op $t, Add add, Sub sub, Mul mul);
    )*};
    (@op $t:ty, $($Trait:ident $method:ident),*) => {$(
        integer_tensor!(@pair $t, $Trait $method, Tensor<'s, $t>, Tensor<'s, $t>, (&), (&));
        integer_tensor!(@pair $t, $Trait $method, Tensor<'s, $t>, &Tensor<'s, $t>, (&), ());
        integer_tensor!(@pair $t, $Trait $method, &Tensor<'s, $t>, Tensor<'s, $t>, (), (&));
        integer_tensor!(@pair $t, $Trait $method, &Tensor<'s, $t>, &Tensor<'s, $t>, (), ());

        impl<'s> $Trait<$t> for Tensor<'s, $t> {
            type Output = Tensor<'s, $t>;
            #[track_caller]
            fn $method(self, c: $t) -> Tensor<'s, $t> {
                or_panic(IntOp::$Trait.scalar(&self, c))
            }
        }

        impl<'s> $Trait<$t> for &Tensor<'s, $t> {
            type Output = Tensor<'s, $t>;
            #[track_caller]
            fn $method(self, c: $t) -> Tensor<'s, $t> {
                or_panic(IntOp::$Trait.scalar(self, c))
            }
        }
    )*};
    (@pair $t:ty, $Trait:ident $method:ident, $L:ty, $R:ty, ($($l:tt)?), ($($r:tt)?)) => {
        impl<'s> $Trait<$R> for $L {
            type Output = Tensor<'s, $t>;
            #[track_caller]
            fn $method(self, rhs: $R) -> Tensor<'s, $t> {
                or_panic(IntOp::$Trait.tensors($($l)? self, $($r)? rhs))
            }
        }
    };
}
integer_tensor!(i64, i32);
