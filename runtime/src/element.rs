//! Element types a tensor can hold.

use std::fmt::{Debug, Display};

/// A floating-point element type a [`crate::Tensor`] can hold: `f32`, `f64`, [`half::f16`] and
/// [`half::bf16`].
///
/// Sealed: the pool reinterprets its raw aligned blocks as slices of these types, which is only
/// valid for plain-old-data types (`bytemuck::Pod`) whose alignment is at most 64 bytes.
pub trait Element:
    num_traits::Float
    + bytemuck::Pod
    + Debug
    + Display
    + Default
    + Send
    + Sync
    + std::iter::Sum
    + 'static
    + sealed::Sealed
{
    /// The type's name as users write it, e.g. `"f32"`.
    const NAME: &'static str;
    /// Converts from `f64`, rounding to the nearest representable value.
    fn from_f64(v: f64) -> Self;
    /// Converts to `f64` exactly.
    fn to_f64(self) -> f64;
}

mod sealed {
    pub trait Sealed {}
}

macro_rules! element {
    ($t:ty, $name:literal, |$v:ident| $from:expr, |$s:ident| $to:expr) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
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

element!(f32, "f32", |v| v as f32, |s| f64::from(s));
element!(f64, "f64", |v| v, |s| s);
element!(half::f16, "f16", |v| half::f16::from_f64(v), |s| s.to_f64());
element!(half::bf16, "bf16", |v| half::bf16::from_f64(v), |s| s
    .to_f64());
