//! Element types a tensor can hold, and the scalar kernels of their transcendental functions
//! ([`kernels`]).

pub(crate) mod kernels;

use std::fmt::{Debug, Display};

use half::slice::HalfFloatSliceExt;

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

    /// The type attention computes its scores, softmax and sums in: `f32` for `f16` and `bf16`
    /// (as PyTorch's CPU attention does: their 65504 and 8 bits of precision are no place for a
    /// score), the type itself for `f32` and `f64`.
    #[doc(hidden)]
    type Wide: Element;

    /// `src` converted into `dst` (of its length), exactly: how attention widens its operands
    /// (for the half types through `half`'s slice conversions, which use F16C where the CPU has
    /// it).
    #[doc(hidden)]
    fn widen(src: &[Self], dst: &mut [Self::Wide]);

    /// `src` rounded to nearest into `dst` (of its length): how attention rounds its results.
    #[doc(hidden)]
    fn narrow(src: &[Self::Wide], dst: &mut [Self]);

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

/// `x` rounded to `f32` toward zero, its last bit set if that was inexact ("round to odd"): an
/// intermediate from which rounding to nearest at 13 or more bits fewer gives what rounding `x`
/// to nearest directly gives. How `f64`s reach `f16` and `bf16`: half's own `from_f64` drops the
/// last 32 bits of the `f64` before rounding, so a value just above a tie rounds down
/// (`-1.1914068` to bf16 gave `-1.1875`, not the nearer `-1.1953125`).
fn to_f32_odd(x: f64) -> f32 {
    let nearest = x as f32;
    if f64::from(nearest) == x || x.is_nan() {
        return nearest;
    }
    // Inexact: the neighbour toward zero if rounding went away from it (which also turns an
    // overflow to infinity into `f32::MAX`), then the sticky last bit.
    let toward_zero = match f64::from(nearest).abs() > x.abs() {
        true => f32::from_bits(nearest.to_bits() - 1),
        false => nearest,
    };
    f32::from_bits(toward_zero.to_bits() | 1)
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
dtype!(
    half::f16,
    "f16",
    |v| half::f16::from_f32(to_f32_odd(v)),
    |s| s.to_f64()
);
dtype!(
    half::bf16,
    "bf16",
    |v| half::bf16::from_f32(to_f32_odd(v)),
    |s| s.to_f64()
);
dtype!(i64, "i64", |v| v as i64, |s| s as f64, integer);
dtype!(i32, "i32", |v| v as i32, |s| f64::from(s), integer);
dtype!(u8, "u8", |v| v as u8, |s| f64::from(s), integer);

/// `f32` and the half types run the kernels of [`kernels`], the half types through `f32` (as
/// `half`'s own `tanh` goes through `f32`).
macro_rules! f32_kernels {
    ($t:ty, $gemm:literal, $widen:expr, $narrow:expr, |$x:ident| $to_f32:expr, |$y:ident| $from_f32:expr) => {
        impl Element for $t {
            const GEMM: bool = $gemm;
            type Wide = f32;
            fn widen(src: &[Self], dst: &mut [f32]) {
                $widen(src, dst)
            }
            fn narrow(src: &[f32], dst: &mut [Self]) {
                $narrow(dst, src)
            }
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
f32_kernels!(
    f32,
    true,
    |src: &[f32], dst: &mut [f32]| dst.copy_from_slice(src),
    |dst: &mut [f32], src: &[f32]| dst.copy_from_slice(src),
    |x| x,
    |y| y
);
f32_kernels!(
    half::f16,
    false,
    |src: &[half::f16], dst| src.convert_to_f32_slice(dst),
    |dst: &mut [half::f16], src| dst.convert_from_f32_slice(src),
    |x| x.to_f32(),
    |y| half::f16::from_f32(y)
);
f32_kernels!(
    half::bf16,
    false,
    |src: &[half::bf16], dst| src.convert_to_f32_slice(dst),
    |dst: &mut [half::bf16], src| dst.convert_from_f32_slice(src),
    |x| x.to_f32(),
    |y| half::bf16::from_f32(y)
);

/// `f64` keeps libm's functions (through `std` where it has them).
impl Element for f64 {
    const GEMM: bool = true;
    type Wide = f64;

    fn widen(src: &[f64], dst: &mut [f64]) {
        dst.copy_from_slice(src)
    }

    fn narrow(src: &[f64], dst: &mut [f64]) {
        dst.copy_from_slice(src)
    }

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

#[cfg(test)]
mod tests {
    use super::*;

    /// The nearest of `x`'s neighbours among the finite values a type's bits give (ties to the
    /// even bit pattern), by exact distances in `f64`; beyond the largest, infinity.
    fn nearest<T: DType>(x: f64, bits: impl Fn(u16) -> T, around: u16) -> T {
        let candidates = [around.wrapping_sub(1), around, around.wrapping_add(1)];
        let finite = candidates
            .map(&bits)
            .into_iter()
            .filter(|c| c.to_f64().is_finite());
        let best = finite.min_by(|a, b| {
            let (da, db) = ((a.to_f64() - x).abs(), (b.to_f64() - x).abs());
            da.total_cmp(&db).then_with(|| {
                // A tie: the even pattern first.
                let even = |c: &T| bytemuck::cast::<T, u16>(*c) & 1;
                even(a).cmp(&even(b))
            })
        });
        best.expect("a finite neighbour")
    }

    #[test]
    fn f64s_round_to_the_nearest_f16_and_bf16() {
        // Exact f32s just above, at and below ties, random f64s, tiny and huge ones.
        let mut values = vec![f64::from(f32::from_bits(0xbf98_8005)), 1.0 + 2f64.powi(-9)];
        values.extend((0..16).map(|i| f64::from(f32::from_bits(0x3f80_8000 + i - 8))));
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20_000 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            let exponent = (state >> 58) as i32 - 32;
            values.push(f64::from_bits(state >> 12 | 0x3ff0_0000_0000_0000) * 2f64.powi(exponent));
        }
        for &x in &values {
            for x in [x, -x] {
                let b = <half::bf16 as DType>::from_f64(x);
                let want = nearest(x, half::bf16::from_bits, b.to_bits());
                assert_eq!(b.to_bits(), want.to_bits(), "bf16 of {x:e}");
                let h = <half::f16 as DType>::from_f64(x);
                if x.abs() < 65504.0 {
                    let want = nearest(x, half::f16::from_bits, h.to_bits());
                    assert_eq!(h.to_bits(), want.to_bits(), "f16 of {x:e}");
                }
            }
        }
        assert_eq!(
            <half::bf16 as DType>::from_f64(f64::from(f32::from_bits(0xbf98_8005))).to_f64(),
            -1.1953125
        );
    }
}
