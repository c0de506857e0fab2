//! The one rule by which a computed value matches its reference. Shared with
//! `property-tests/tests/op_fuzz.rs` through `#[path]`.

/// Whether `got` is within `atol + rtol * |want|` of `want`. NaN matches only NaN and an infinity
/// only the same infinity: no tolerance makes a finite value match an infinite one.
pub(crate) fn close(got: f64, want: f64, rtol: f64, atol: f64) -> bool {
    if got.is_nan() || want.is_nan() {
        return got.is_nan() && want.is_nan();
    }
    if got.is_infinite() || want.is_infinite() {
        return got == want;
    }
    (got - want).abs() <= atol + rtol * want.abs()
}
