//! Branch-free `f32` kernels for the transcendental functions, written so that a loop over a slice
//! of them compiles to SIMD (no calls, no branches: clamps, polynomials and selects), unlike libm's
//! `tanhf`/`expf`, which run one element at a time. [`Element`](crate::Element) routes `f32` (and,
//! through `f32`, `f16` and `bf16`) to them; `f64` keeps libm's.
//!
//! Their largest errors against `f64`, over every 2^-12 step of a range, are asserted in
//! `tests/kernels.rs` and stated in the README.

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
    let mut p = -2.760_768_5e-16_f32;
    p = p * x2 + 2.000_188e-13;
    p = p * x2 - 8.604_672e-11;
    p = p * x2 + 5.122_297e-8;
    p = p * x2 + 1.485_722_4e-5;
    p = p * x2 + 6.372_619_3e-4;
    p = p * x2 + 4.893_524_6e-3;
    p *= c;
    let mut q = 1.198_258_4e-6_f32;
    q = q * x2 + 1.185_347e-4;
    q = q * x2 + 2.268_434_7e-3;
    q = q * x2 + 4.893_525e-3;
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
/// needs no SSE4.1. `inf` above 88.72, 0 below -103.9, NaN stays NaN.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23
                                     // Keep 2^n a normal number; the results out of range are selected at the end.
    let c = x.clamp(-87.336_54, 88.376_26);
    let t = c * LOG2_E + ROUND;
    let n = t - ROUND;
    let r = c - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * (r * r) + r + 1.0;
    // `n` is a whole number in [-126, 127], held in the low mantissa bits of `t`: the exponent
    // bits of 2^n, without a float-to-int conversion (which would not vectorise).
    let scale = f32::from_bits(t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23);
    let e = y * scale;
    if x > 88.722_84 {
        f32::INFINITY
    } else if x < -103.972_08 {
        0.0
    } else {
        e
    }
}
