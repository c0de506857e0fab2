//! Element types a tensor can hold, and the scalar kernels of their transcendental functions
//! ([`kernels`]).

pub(crate) mod kernels;

use std::fmt::{Debug, Display};

/// Any element type a [`Tensor`](crate::Tensor) can hold: the floating-point [`Element`]s, and the
/// integer types `i64`, `i32` and `u8` for token ids, labels, indices and masks.
///
/// Integer tensors live in the same pool and budget as float ones. They have no arithmetic and never
/// carry a gradient: they are what ids and masks need (made with [`Scope::from_slice`], `zeros`,
/// `ones` or [`Scope::arange`]; reshaped, sliced, compared, cast) and what index ops
/// ([`Tensor::index_select`], [`Tensor::gather`]) and reductions ([`Tensor::argmax`]) take or give.
/// Comparisons give `u8` masks holding 0 or 1.
///
/// Sealed: the pool reinterprets its raw aligned blocks as slices of these types, which is only
/// valid for plain-old-data types (`bytemuck::Pod`) whose alignment is at most 64 bytes.
///
/// [`Scope::from_slice`]: crate::Scope::from_slice
/// [`Scope::arange`]: crate::Scope::arange
/// [`Tensor::index_select`]: crate::Tensor::index_select
/// [`Tensor::gather`]: crate::Tensor::gather
/// [`Tensor::argmax`]: crate::Tensor::argmax
pub trait DType:
    bytemuck::Pod + Debug + Display + Default + PartialOrd + Send + Sync + 'static + sealed::Sealed
{
    /// The type's name as users write it, e.g. `"f32"`.
    const NAME: &'static str;
    /// Converts from `f64`: rounding to the nearest representable value for floats, truncating
    /// toward zero and saturating at the type's bounds for integers (as `as` does).
    fn from_f64(v: f64) -> Self;
    /// Converts to `f64` (exactly, except for integers beyond 2^53).
    fn to_f64(self) -> f64;

    /// The count of the values `start + i step` below `end` (above it for a negative step), for
    /// `arange`; `None` for a zero or non-finite step or bound. Floats compute in `f64`, integers
    /// exactly in `i128`.
    #[doc(hidden)]
    fn arange_len(start: Self, end: Self, step: Self) -> Option<usize> {
        let (a, b, d) = (start.to_f64(), end.to_f64(), step.to_f64());
        let finite = d != 0.0 && d.is_finite() && a.is_finite() && b.is_finite();
        finite.then(|| ((b - a) / d).ceil().max(0.0) as usize)
    }

    /// The `i`-th value of `arange(start, _, step)`; see [`DType::arange_len`].
    #[doc(hidden)]
    fn arange_at(start: Self, step: Self, i: usize) -> Self {
        Self::from_f64(start.to_f64() + i as f64 * step.to_f64())
    }

    /// `self + x` as a backward adds gradients: the type's own addition for floats. Ops that move
    /// elements (index, gather) have backward passes for every type, though only floats carry
    /// gradients; for integers this adds wrapping, and is never used.
    #[doc(hidden)]
    fn add_gradient(self, x: Self) -> Self;
}

/// A floating-point element type: `f32`, `f64`, [`f16`](half::f16) and [`bf16`](half::bf16). Every
/// op with arithmetic, and every gradient, is over these.
pub trait Element: DType + num_traits::Float + std::iter::Sum {
    /// Whether matrix products run on the library's packed FMA kernels (`f32`, `f64`); `f16` and
    /// `bf16` run on ndarray's generic `general_mat_mul`.
    #[doc(hidden)]
    const GEMM: bool = false;

    /// `tanh` as the ops compute it: for `f32`, `f16` and `bf16` a branch-free kernel that loops
    /// vectorise (see `element::kernels`); for `f64`, libm's.
    ///
    /// For kernels of your own (the closure of [`Tensor::try_zip_map`](crate::Tensor::try_zip_map)
    /// or [`TensorOps::try_map`](crate::TensorOps::try_map), an [`Op`](crate::autograd::Op)'s
    /// forward): `Float::tanh` calls libm once per element, which stops the loop from vectorising;
    /// these do not. Their errors against `f64` are tested and tabled in `docs/benchmarks.md`.
    fn tanh_kernel(self) -> Self;

    /// `e^x` as the ops compute it; see [`Element::tanh_kernel`].
    fn exp_kernel(self) -> Self;

    /// The natural logarithm as the ops compute it; see [`Element::tanh_kernel`].
    fn ln_kernel(self) -> Self;

    /// The error function as the ops compute it; see [`Element::tanh_kernel`].
    fn erf_kernel(self) -> Self;

    /// `erfc(x) = 1 - erf(x)`, accurate relative to its value where it is small; see
    /// [`Element::tanh_kernel`].
    fn erfc_kernel(self) -> Self;
}

mod sealed {
    pub trait Sealed {}
}

/// Whether `T` is an integer type (`i64`, `i32`, `u8`): a float type holds 0.5, an integer type
/// truncates it.
pub(crate) fn is_integer<T: DType>() -> bool {
    T::from_f64(0.5).to_f64() != 0.5
}

macro_rules! dtype {
    ($t:ty, $name:literal, |$v:ident| $from:expr, |$s:ident| $to:expr $(, $integer:ident)?) => {
        impl sealed::Sealed for $t {}
        impl DType for $t {
            const NAME: &'static str = $name;
            #[inline]
            fn from_f64($v: f64) -> Self {
                $from
            }
            #[inline]
            fn to_f64(self) -> f64 {
                let $s = self;
                $to
            }
            $(dtype!(@$integer);)?
            #[inline(always)]
            fn add_gradient(self, x: Self) -> Self {
                dtype!(@add self, x $(, $integer)?)
            }
        }
    };
    (@add $a:ident, $b:ident) => { $a + $b };
    (@add $a:ident, $b:ident, integer) => { $a.wrapping_add($b) };
    // Integers count and step exactly, in `i128` (in `f64`, `2^53 + 1` is lost).
    (@integer) => {
        fn arange_len(start: Self, end: Self, step: Self) -> Option<usize> {
            let (a, b, d) = (i128::from(start), i128::from(end), i128::from(step));
            // The count rounded up, and 0 when `end` is not past `start` in the step's direction.
            (d != 0).then(|| usize::try_from((b - a + d - d.signum()) / d).unwrap_or(0))
        }
        fn arange_at(start: Self, step: Self, i: usize) -> Self {
            // In range: `i` is below the count `arange_len` gave.
            (i128::from(start) + i as i128 * i128::from(step)) as Self
        }
    };
}

dtype!(f32, "f32", |v| v as f32, |s| f64::from(s));
dtype!(f64, "f64", |v| v, |s| s);
dtype!(half::f16, "f16", |v| half::f16::from_f64(v), |s| s.to_f64());
dtype!(half::bf16, "bf16", |v| half::bf16::from_f64(v), |s| s
    .to_f64());
dtype!(i64, "i64", |v| v as i64, |s| s as f64, integer);
dtype!(i32, "i32", |v| v as i32, |s| f64::from(s), integer);
dtype!(u8, "u8", |v| v as u8, |s| f64::from(s), integer);

/// `f32` and the half types run the kernels of [`kernels`], the half types through `f32` (as
/// `half`'s own `tanh` goes through `f32`).
macro_rules! f32_kernels {
    ($t:ty, $gemm:literal, |$x:ident| $to_f32:expr, |$y:ident| $from_f32:expr) => {
        impl Element for $t {
            const GEMM: bool = $gemm;
            f32_kernels!(@fn $t, |$x| $to_f32, |$y| $from_f32, tanh_kernel tanh_f32, exp_kernel exp_f32,
                ln_kernel log_f32, erf_kernel erf_f32, erfc_kernel erfc_f32);
        }
    };
    (@fn $t:ty, |$x:ident| $to_f32:expr, |$y:ident| $from_f32:expr, $($name:ident $kernel:ident),*) => {$(
        #[inline(always)]
        fn $name(self) -> Self {
            let $x = self;
            let $y = kernels::$kernel($to_f32);
            $from_f32
        }
    )*};
}
f32_kernels!(f32, true, |x| x, |y| y);
f32_kernels!(half::f16, false, |x| x.to_f32(), |y| half::f16::from_f32(y));
f32_kernels!(half::bf16, false, |x| x.to_f32(), |y| half::bf16::from_f32(
    y
));

/// `f64` keeps libm's functions (through `std` where it has them).
impl Element for f64 {
    const GEMM: bool = true;

    #[inline(always)]
    fn tanh_kernel(self) -> Self {
        self.tanh()
    }

    #[inline(always)]
    fn exp_kernel(self) -> Self {
        self.exp()
    }

    #[inline(always)]
    fn ln_kernel(self) -> Self {
        self.ln()
    }

    #[inline(always)]
    fn erf_kernel(self) -> Self {
        libm::erf(self)
    }

    #[inline(always)]
    fn erfc_kernel(self) -> Self {
        libm::erfc(self)
    }
}
