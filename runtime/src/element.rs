//! Element types a tensor can hold.

use std::fmt::{Debug, Display};

/// Any element type a [`crate::Tensor`] can hold: the floating-point [`Element`]s, and the integer
/// types `i64`, `i32` and `u8` for token ids, labels, indices and masks.
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
}

/// A floating-point element type: `f32`, `f64`, [`half::f16`] and [`half::bf16`]. Every op with
/// arithmetic, and every gradient, is over these.
pub trait Element: DType + num_traits::Float + std::iter::Sum {}

mod sealed {
    pub trait Sealed {}
}

/// Whether `T` is an integer type (`i64`, `i32`, `u8`): a float type holds 0.5, an integer type
/// truncates it.
pub(crate) fn is_integer<T: DType>() -> bool {
    T::from_f64(0.5).to_f64() != 0.5
}

macro_rules! dtype {
    ($t:ty, $name:literal, |$v:ident| $from:expr, |$s:ident| $to:expr) => {
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
        }
    };
}

dtype!(f32, "f32", |v| v as f32, |s| f64::from(s));
dtype!(f64, "f64", |v| v, |s| s);
dtype!(half::f16, "f16", |v| half::f16::from_f64(v), |s| s.to_f64());
dtype!(half::bf16, "bf16", |v| half::bf16::from_f64(v), |s| s
    .to_f64());
dtype!(i64, "i64", |v| v as i64, |s| s as f64);
dtype!(i32, "i32", |v| v as i32, |s| f64::from(s));
dtype!(u8, "u8", |v| v as u8, |s| f64::from(s));

impl Element for f32 {}
impl Element for f64 {}
impl Element for half::f16 {}
impl Element for half::bf16 {}
