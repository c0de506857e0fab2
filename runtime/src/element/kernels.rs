//! Branch-free `f32` kernels for the transcendental functions (`tanh`, `exp`, `ln`, `erf`, `erfc`),
//! written so that a loop over a slice of them compiles to SIMD (no calls, no branches: clamps,
//! polynomials, bit operations and selects), unlike libm's `tanhf`/`expf`/`logf`/`erff`, which run
//! one element at a time. [`Element`](crate::Element) routes `f32` (and, through `f32`, `f16` and
//! `bf16`) to them; `f64` keeps libm's.
//!
//! Their largest errors against `f64`, over every 2^-12 step of a range, are asserted in
//! `tests/integration/ops/kernels.rs` and stated in `docs/benchmarks.md`.

/// The polynomial with coefficients `c` (highest degree first) at `x`, by Horner's rule:
/// `((c0 x + c1) x + c2) ...`, one multiply and one add a step, never fused.
#[inline(always)]
fn horner(x: f32, c: &[f32]) -> f32 {
    let mut p = c[0];
    for &k in &c[1..] {
        p = p * x + k;
    }
    p
}

/// `tanh(x)`: below 0.625 in magnitude the rational approximation of Eigen's `ptanh_float`
/// (degree 13 over degree 6, exact to a few `f32` ulps there, `x` itself below `4e-4`); above, `1 -
/// 2 / (e^{2|x|} + 1)` with the sign of `x`, which saturates to exactly `+-1` where `tanh` rounds
/// to it (the rational form alone is a few ulps short of 1 near 8, which GELU turns into a nonzero
/// value where the true one is 1e-16). Both are computed and one is selected: no branch. NaN stays
/// NaN.
#[inline(always)]
pub(crate) fn tanh_f32(x: f32) -> f32 {
    let a = x.abs();
    let c = x.clamp(-0.625, 0.625);
    let x2 = c * c;
    let p = c * horner(
        x2,
        &[
            -2.760_768_5e-16,
            2.000_188e-13,
            -8.604_672e-11,
            5.122_297e-8,
            1.485_722_4e-5,
            6.372_619_3e-4,
            4.893_524_6e-3,
        ],
    );
    let q = horner(
        x2,
        &[1.198_258_4e-6, 1.185_347e-4, 2.268_434_7e-3, 4.893_525e-3],
    );
    let small = if a < 4e-4 { x } else { p / q };
    let l = 1.0 - 2.0 / (exp_f32(a + a) + 1.0);
    let large = if x < 0.0 { -l } else { l };
    if a < 0.625 {
        small
    } else {
        large
    }
}

/// `e^x`: Cephes' `expf` (range reduction by `ln 2` in two parts, a degree-5 polynomial, the power
/// of two built in the exponent bits), with a round-to-nearest by the `1.5 * 2^23` trick so that it
/// needs no SSE4.1. The power of two is applied as two halves, so that results below `2^-126`
/// come out as the subnormals they are (one rounding) and `2^128` does not overflow on the way.
/// `inf` above 88.72, 0 below -103.97, NaN stays NaN.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // 1.5 * 2^23
    const ROUND: f32 = 12_582_912.0;
    // `n` stays within [-150, 128]: each half of 2^n is then a normal number.
    let c = x.clamp(-104.0, 88.8);
    let t = c * LOG2_E + ROUND;
    let n = t - ROUND;
    let r = c - n * LN2_HI - n * LN2_LO;
    let p = horner(
        r,
        &[
            1.987_569_1e-4,
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            1.666_666_5e-1,
            0.5,
        ],
    );
    let y = p * (r * r) + r + 1.0;
    // `n` is a whole number, held in the low mantissa bits of `t`: read as an integer without a
    // float-to-int conversion (which would not vectorise), split as `n1 + n2`, and each made a
    // power of two in the exponent bits. `y * 2^n1` is exact; the second product rounds once.
    let n = t.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    let n1 = n >> 1;
    let pow2 = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
    let e = y * pow2(n1) * pow2(n - n1);
    if x > 88.722_84 {
        f32::INFINITY
    } else if x < -103.972_08 {
        0.0
    } else {
        e
    }
}

/// `ln(x)`: Cephes' `logf` (the mantissa `m` in `[sqrt(1/2), sqrt(2))` and the exponent `e` read
/// from the bits, `ln(1 + (m - 1))` by a degree-8 polynomial, `e ln 2` added in two parts).
/// Subnormals are scaled by `2^23` first. `-inf` at `+-0`, NaN below 0 and for NaN, `inf` at `inf`.
#[inline(always)]
pub(crate) fn log_f32(x: f32) -> f32 {
    let subnormal = x < f32::MIN_POSITIVE;
    let scaled = if subnormal { x * 8_388_608.0 } else { x }; // 2^23
    let bits = scaled.to_bits();
    // `scaled = m 2^e` with `m` in [0.5, 1), as `frexp` gives them.
    let m = f32::from_bits((bits & 0x007f_ffff) | 0x3f00_0000);
    let e = (((bits >> 23) & 0xff) as i32 - 126) as f32 - if subnormal { 23.0 } else { 0.0 };
    let low = m < std::f32::consts::FRAC_1_SQRT_2;
    let f = if low { m + m - 1.0 } else { m - 1.0 };
    let e = if low { e - 1.0 } else { e };
    let z = f * f;
    let p = horner(
        f,
        &[
            7.037_683_6e-2,
            -1.151_461e-1,
            1.167_699_9e-1,
            -1.242_014_1e-1,
            1.424_932_3e-1,
            -1.666_805_8e-1,
            2.000_071_4e-1,
            -2.499_999_4e-1,
            3.333_333e-1,
        ],
    );
    let y = p * f * z - 2.121_944_4e-4 * e - 0.5 * z;
    let l = f + y + 0.693_359_4 * e;
    if x == f32::INFINITY {
        x
    } else if x > 0.0 {
        l
    } else if x == 0.0 {
        f32::NEG_INFINITY
    } else {
        f32::NAN
    }
}

/// `(erf(a), erfc(a))` of `a = |x|`, each where it is accurate: Cephes' `erff` polynomial
/// `a P(a^2)` for `a < 1`, and `erfc(a) = e^{-a^2} P(1/a^2) / a` (two polynomials, split at 2)
/// for `a >= 1`. The other half of each pair is computed at a clamped argument and is to be
/// discarded; NaN flows into the second.
#[inline(always)]
fn erf_parts(a: f32) -> (f32, f32) {
    let s = if a < 1.0 { a } else { 1.0 };
    let z = s * s;
    let t = horner(
        z,
        &[
            7.853_861_4e-5,
            -8.010_193_6e-4,
            5.188_327_7e-3,
            -2.685_381_3e-2,
            1.128_358_5e-1,
            -3.761_262_6e-1,
            std::f32::consts::FRAC_2_SQRT_PI,
        ],
    );
    let b = if a < 1.0 { 1.0 } else { a };
    let q = 1.0 / b;
    let y = q * q;
    // 1 <= a < 2
    let p = horner(
        y,
        &[
            2.326_82e-2,
            -1.387_039_4e-1,
            3.687_424_6e-1,
            -5.824_733e-1,
            6.210_004_6e-1,
            -4.944_515_3e-1,
            3.404_88e-1,
            -2.741_127e-1,
            5.638_259_6e-1,
        ],
    );
    // a >= 2
    let r = horner(
        y,
        &[
            -1.047_766_4e1,
            1.297_72e1,
            -7.495_518_7,
            2.921_019,
            -1.015_265_3,
            4.218_463_3e-1,
            -2.820_767_4e-1,
            5.641_895e-1,
        ],
    );
    let poly = if b < 2.0 { p } else { r };
    (s * t, exp_f32(-(b * b)) * q * poly)
}

/// `erf(x)`, from [`erf_parts`]: `a P(a^2)` below 1 in magnitude, `1 - erfc(a)` above, with the
/// sign of `x` (so `-0` stays `-0`); `+-1` at `+-inf`, NaN stays NaN.
#[inline(always)]
pub(crate) fn erf_f32(x: f32) -> f32 {
    let a = x.abs();
    let (small, big) = erf_parts(a);
    let e = if a < 1.0 { small } else { 1.0 - big };
    e.copysign(x)
}

/// `erfc(x) = 1 - erf(x)`, from [`erf_parts`], accurate relative to its value for large `x`
/// (where `1 - erf(x)` would cancel): `erfc(|x|)` directly above 1, and `2 - erfc(|x|)` for
/// negative `x`. 0 at `inf`, 2 at `-inf`, NaN stays NaN.
#[inline(always)]
pub(crate) fn erfc_f32(x: f32) -> f32 {
    let a = x.abs();
    let (small, big) = erf_parts(a);
    let e = if a < 1.0 { 1.0 - small } else { big };
    if x < 0.0 {
        2.0 - e
    } else {
        e
    }
}
