//! The vectorised `f32` kernels of the transcendental ops against `f64`: every `2^-12` step of a
//! range, plus the special values. The bounds asserted here are the errors the README states.

use tensorscope::prelude::*;

/// Every multiple of 2^-12 in [lo, hi].
fn sweep(lo: f32, hi: f32) -> Vec<f32> {
    let step = 1.0 / 4096.0;
    let n = ((hi - lo) / step) as usize;
    (0..=n).map(|i| lo + i as f32 * step).collect()
}

/// The largest absolute and relative errors of `op` on `xs` against `reference` in f64, and the
/// `x` of the largest relative error.
fn errors(
    xs: &[f32],
    op: impl for<'s> Fn(&Tensor<'s, f32>) -> Tensor<'s, f32>,
    reference: impl Fn(f64) -> f64,
) -> (f64, f64, f32) {
    let pool = Pool::with_max_memory_mb(64);
    let got = pool.scope(|s| op(&s.from_slice::<f32>(&[xs.len()], xs)).to_vec());
    let (mut abs, mut rel, mut at) = (0.0f64, 0.0f64, 0.0f32);
    for (&x, &g) in xs.iter().zip(&got) {
        let want = reference(f64::from(x));
        let e = (f64::from(g) - want).abs();
        abs = abs.max(e);
        let r = e / want.abs().max(f64::MIN_POSITIVE);
        if r > rel {
            rel = r;
            at = x;
        }
    }
    (abs, rel, at)
}

fn gelu_tanh(x: f64) -> f64 {
    0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044_715 * x.powi(3))).tanh())
}

#[test]
fn kernels_are_within_their_stated_errors_of_f64() {
    let xs = sweep(-20.0, 20.0);
    let report = |name: &str, (abs, rel, at): (f64, f64, f32), max_abs: f64, max_rel: f64| {
        println!("{name}: max abs {abs:.2e}, max rel {rel:.2e} (at {at})");
        assert!(
            abs <= max_abs && rel <= max_rel,
            "{name}: abs {abs:e}, rel {rel:e} at {at}"
        );
    };
    // Bounds just above the errors measured on 2026-11-23 (the README states them).
    report("tanh", errors(&xs, |t| t.tanh(), f64::tanh), 1e-7, 3e-7);
    // GELU's relative error is 1 where its value is below f32's resolution (gelu(-7.2) is 2e-16,
    // and 0 in f32, as with libm's tanh): the absolute error is the measure.
    report(
        "gelu",
        errors(&xs, |t| t.gelu(), gelu_tanh),
        5e-7,
        f64::INFINITY,
    );
    let logistic = |x: f64| 1.0 / (1.0 + (-x).exp());
    report(
        "sigmoid",
        errors(&xs, |t| t.sigmoid(), logistic),
        1e-7,
        2e-7,
    );
    report(
        "silu",
        errors(&xs, |t| t.silu(), |x| x * logistic(x)),
        1.5e-6,
        2e-7,
    );
    let exp_range = sweep(-87.0, 88.0);
    report(
        "exp",
        errors(&exp_range, |t| t.exp(), f64::exp),
        f64::INFINITY,
        1e-7,
    );
}

#[test]
fn special_values_follow_ieee() {
    let pool = Pool::with_max_memory_mb(8);
    pool.scope(|s| {
        let specials = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 89.0];
        let x = s.from_slice::<f32>(&[6], &specials);
        let tanh = (&x).tanh().to_vec();
        assert!(tanh[0].is_nan());
        assert_eq!(tanh[1..], [1.0, -1.0, 0.0, 0.0, 1.0]);
        let exp = (&x).exp().to_vec();
        assert!(exp[0].is_nan());
        assert_eq!(exp[1..], [f32::INFINITY, 0.0, 1.0, 1.0, f32::INFINITY]);
        assert_eq!(s.from_slice::<f32>(&[1], &[-104.0]).exp().item(), 0.0);
        let gelu = (&x).gelu().to_vec();
        assert!(gelu[0].is_nan());
        assert_eq!(gelu[3], 0.0);
        // The half types compute through the f32 kernels.
        let half = s.from_slice::<tensorscope::f16>(&[1], &[tensorscope::f16::from_f32(0.5)]);
        assert_eq!(
            half.tanh().item(),
            tensorscope::f16::from_f32(0.5f32.tanh())
        );
    });
}
