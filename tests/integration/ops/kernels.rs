//! The vectorised `f32` kernels of the transcendental ops, and their derivatives as backward
//! computes them, against `f64` references: every `2^-12` step of a range (every 997th `f32` for
//! `log`), plus the IEEE special values. The bounds asserted here are the errors `docs/benchmarks.md`
//! states; `cargo test --release --test integration ops::kernels -- --nocapture --test-threads=1`
//! prints the table.

use std::f64::consts::{FRAC_2_SQRT_PI, PI, SQRT_2};

use tensorscope::prelude::*;

use super::{gelu_ref, sigmoid_ref};

/// Every multiple of 2^-12 in [lo, hi].
fn sweep(lo: f32, hi: f32) -> Vec<f32> {
    let step = 1.0 / 4096.0;
    let n = ((hi - lo) / step) as usize;
    (0..=n).map(|i| lo + i as f32 * step).collect()
}

/// Every 997th positive `f32` from the smallest subnormal to the largest finite value: all
/// exponents, subnormals included.
fn positives() -> Vec<f32> {
    (1..f32::MAX.to_bits())
        .step_by(997)
        .map(f32::from_bits)
        .collect()
}

type Op = dyn for<'s> Fn(&Tensor<'s, f32>) -> Tensor<'s, f32>;
type LaneRef = dyn Fn(&[f64], &[f64]) -> Vec<f64>;

/// `op` of every element of `xs`.
fn forward(xs: &[f32], op: &Op) -> Vec<f32> {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|s| op(&s.from_slice::<f32>(&[xs.len()], xs)).to_vec())
}

/// The gradient of `sum(op(x) * w)` with respect to `x`, as backward computes it; `xs` is reshaped
/// to `shape`, and `w` is all ones unless given.
fn backward(xs: &[f32], shape: &[usize], w: Option<&[f32]>, op: &Op) -> Vec<f32> {
    let pool = Pool::with_max_memory_mb(64);
    pool.train(|s| {
        let x = s.from_slice::<f32>(shape, xs).requires_grad();
        let y = op(&x);
        let w = match w {
            Some(w) => s.from_slice::<f32>(shape, w),
            None => s.ones::<f32>(shape),
        };
        let grads = y.backward_with(&w).unwrap();
        grads.of(&x).unwrap().to_vec()
    })
}

/// The largest errors of `got` against `want`: absolute, and relative where `want` is a normal
/// `f32` (below that, `f32` has fewer significant bits), with the index of the worst relative one.
struct Errors {
    abs: f64,
    rel: f64,
    at: usize,
}

fn errors(got: &[f32], want: &[f64]) -> Errors {
    let mut e = Errors {
        abs: 0.0,
        rel: 0.0,
        at: 0,
    };
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let d = (f64::from(g) - w).abs();
        assert!(!d.is_nan(), "NaN at {i}: got {g}, want {w}");
        e.abs = e.abs.max(d);
        if w.abs() >= f64::from(f32::MIN_POSITIVE) && d / w.abs() > e.rel {
            e.rel = d / w.abs();
            e.at = i;
        }
    }
    e
}

/// Prints a table row for `name` and asserts its bounds (`INFINITY` where the measure does not
/// apply: the relative error of a value that rounds to 0 or the absolute error of `exp`).
#[track_caller]
fn report(name: &str, xs: &[f32], e: Errors, max_abs: f64, max_rel: f64) {
    println!(
        "| {name} | {:.2e} | {:.2e} (at {}) |",
        e.abs, e.rel, xs[e.at]
    );
    assert!(
        e.abs <= max_abs && e.rel <= max_rel,
        "{name}: abs {:e} (bound {max_abs:e}), rel {:e} (bound {max_rel:e}) at {}",
        e.abs,
        e.rel,
        xs[e.at]
    );
}

/// `op` of `xs` against `reference`.
#[track_caller]
fn function(name: &str, xs: &[f32], op: &Op, reference: fn(f64) -> f64, abs: f64, rel: f64) {
    let want: Vec<f64> = xs.iter().map(|&x| reference(f64::from(x))).collect();
    report(name, xs, errors(&forward(xs, op), &want), abs, rel);
}

/// The derivative of `op` as backward computes it, against `reference`.
#[track_caller]
fn derivative(name: &str, xs: &[f32], op: &Op, reference: fn(f64) -> f64, abs: f64, rel: f64) {
    let want: Vec<f64> = xs.iter().map(|&x| reference(f64::from(x))).collect();
    let got = backward(xs, &[xs.len()], None, op);
    report(name, xs, errors(&got, &want), abs, rel);
}

fn gelu_tanh_grad(x: f64) -> f64 {
    let c = (2.0 / PI).sqrt();
    let t = (c * (x + 0.044_715 * x.powi(3))).tanh();
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * 0.044_715 * x * x)
}

/// `Phi(x)`, from libm's `erfc` in `f64`.
fn normal_cdf(x: f64) -> f64 {
    0.5 * libm::erfc(-x / SQRT_2)
}

fn normal_pdf(x: f64) -> f64 {
    (-0.5 * x * x).exp() / (2.0 * PI).sqrt()
}

// Bounds just above the errors measured on 2026-11-24 (docs/benchmarks.md states them).

#[test]
fn functions_are_within_their_stated_errors_of_f64() {
    println!("| function | largest absolute error | largest relative error |");
    let xs = sweep(-20.0, 20.0);
    function("tanh", &xs, &|t| t.tanh(), f64::tanh, 1e-7, 3e-7);
    // GELU (tanh form) keeps its relative accuracy down to x = -10 (value -1e-37); below, where
    // its value nears f32's smallest normal, `e^(-2u)` overflows and it rounds to 0.
    function("gelu", &xs, &|t| t.gelu(), gelu_ref, 6e-7, f64::INFINITY);
    function(
        "gelu above -10",
        &sweep(-10.0, 20.0),
        &|t| t.gelu(),
        gelu_ref,
        6e-7,
        1.2e-5,
    );
    // The exact GELU keeps its relative accuracy down to its smallest normal values (x near -13).
    function(
        "gelu_erf",
        &xs,
        &|t| t.gelu_erf(),
        |x| x * normal_cdf(x),
        5e-7,
        2e-5,
    );
    function("erf", &xs, &|t| t.erf(), libm::erf, 1.5e-7, 3e-7);
    function("sigmoid", &xs, &|t| t.sigmoid(), sigmoid_ref, 1e-7, 2e-7);
    function(
        "silu",
        &xs,
        &|t| t.silu(),
        |x| x * sigmoid_ref(x),
        1.5e-6,
        2e-7,
    );
    // exp over its whole finite range: relative where the result is normal, absolute where it is
    // subnormal (2^-149 is the last bit there).
    let normal = sweep(-87.33, 88.72);
    function(
        "exp",
        &normal,
        &|t| t.exp(),
        f64::exp,
        f64::INFINITY,
        1.5e-7,
    );
    let subnormal = sweep(-103.97, -87.34);
    let last_bit = f64::from(f32::from_bits(1));
    function(
        "exp (subnormal)",
        &subnormal,
        &|t| t.exp(),
        f64::exp,
        last_bit,
        0.0,
    );
    function(
        "log",
        &positives(),
        &|t| t.log(),
        f64::ln,
        f64::INFINITY,
        1e-7,
    );
}

#[test]
fn derivatives_are_within_their_stated_errors_of_f64() {
    println!("| derivative | largest absolute error | largest relative error |");
    let xs = sweep(-20.0, 20.0);
    // From the output y: 1 - y^2 loses the relative accuracy of small values as y nears 1.
    derivative(
        "tanh'",
        &xs,
        &|t| t.tanh(),
        |x| 1.0 - x.tanh().powi(2),
        2e-7,
        f64::INFINITY,
    );
    derivative(
        "gelu'",
        &xs,
        &|t| t.gelu(),
        gelu_tanh_grad,
        6e-7,
        f64::INFINITY,
    );
    derivative(
        "gelu_erf'",
        &xs,
        &|t| t.gelu_erf(),
        |x| normal_cdf(x) + x * normal_pdf(x),
        6e-7,
        f64::INFINITY,
    );
    derivative(
        "erf'",
        &xs,
        &|t| t.erf(),
        |x| FRAC_2_SQRT_PI * (-x * x).exp(),
        1.5e-7,
        3e-5,
    );
    // From the output y: y (1 - y) loses the relative accuracy of small values as y nears 1.
    derivative(
        "sigmoid'",
        &xs,
        &|t| t.sigmoid(),
        |x| sigmoid_ref(x) * (1.0 - sigmoid_ref(x)),
        1e-7,
        f64::INFINITY,
    );
    derivative(
        "silu'",
        &xs,
        &|t| t.silu(),
        |x| sigmoid_ref(x) * (1.0 + x * (1.0 - sigmoid_ref(x))),
        2.5e-7,
        f64::INFINITY,
    );
    let exp_range = sweep(-87.0, 88.0);
    derivative(
        "exp'",
        &exp_range,
        &|t| t.exp(),
        f64::exp,
        f64::INFINITY,
        1.5e-7,
    );
    let log_range: Vec<f32> = positives()
        .into_iter()
        .filter(|x| x.is_normal() && *x < 1e38)
        .collect();
    derivative(
        "log'",
        &log_range,
        &|t| t.log(),
        |x| 1.0 / x,
        f64::INFINITY,
        1e-7,
    );
}

fn softmax(x: &[f64]) -> Vec<f64> {
    let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = x.iter().map(|v| (v - max).exp()).sum();
    x.iter().map(|v| (v - max).exp() / sum).collect()
}

/// Softmax and log-softmax along lanes of 1000 values spread over [-20, 20], and their backward
/// passes for an upstream gradient `w` that varies along the lane.
#[test]
fn softmax_lanes_are_within_their_stated_errors_of_f64() {
    println!("| lane op | largest absolute error | largest relative error |");
    const LANE: usize = 1000;
    let xs = sweep(-20.0, 20.0);
    let xs = &xs[..xs.len() / LANE * LANE];
    let shape = [xs.len() / LANE, LANE];
    let w: Vec<f32> = (0..xs.len())
        .map(|i| ((i % 7) as f32 - 3.0) / 3.0)
        .collect();
    // The reference of every lane, from its x and w.
    let lanes = |f: &LaneRef| -> Vec<f64> {
        let wide = |v: &[f32]| v.iter().map(|&v| f64::from(v)).collect::<Vec<_>>();
        let (x, w) = (wide(xs), wide(&w));
        x.chunks(LANE)
            .zip(w.chunks(LANE))
            .flat_map(|(x, w)| f(x, w))
            .collect()
    };
    let op_softmax: &Op = &|t| t.softmax(-1);
    let op_log_softmax: &Op = &|t| t.log_softmax(-1);
    let softmax_forward = |op: &Op| {
        let pool = Pool::with_max_memory_mb(64);
        pool.scope(|s| op(&s.from_slice::<f32>(&shape, xs)).to_vec())
    };

    let want = lanes(&|x, _| softmax(x));
    let e = errors(&softmax_forward(op_softmax), &want);
    report("softmax", xs, e, 3e-8, 3e-7);
    let want = lanes(&|x, _| softmax(x).iter().map(|y| y.ln()).collect());
    let e = errors(&softmax_forward(op_log_softmax), &want);
    report("log_softmax", xs, e, 3e-6, 2e-7);

    // y (w - sum(w y)) and w - softmax(x) sum(w)
    let want = lanes(&|x, w| {
        let y = softmax(x);
        let dot: f64 = y.iter().zip(w).map(|(y, w)| y * w).sum();
        y.iter().zip(w).map(|(y, w)| y * (w - dot)).collect()
    });
    let e = errors(&backward(xs, &shape, Some(&w), op_softmax), &want);
    report("softmax'", xs, e, 3e-8, f64::INFINITY);
    let want = lanes(&|x, w| {
        let total: f64 = w.iter().sum();
        softmax(x)
            .iter()
            .zip(w)
            .map(|(y, w)| w - y * total)
            .collect()
    });
    let e = errors(&backward(xs, &shape, Some(&w), op_log_softmax), &want);
    report("log_softmax'", xs, e, 1e-7, f64::INFINITY);
}

/// The bits of `op` at each of `xs`.
fn bits(xs: &[f32], op: &Op) -> Vec<u32> {
    forward(xs, op).iter().map(|v| v.to_bits()).collect()
}

#[test]
fn special_values_follow_ieee() {
    let tiny = f32::from_bits(1); // the smallest subnormal
    let sub = 1e-40f32; // a subnormal
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        sub,
        -sub,
    ];
    let b = |v: f32| v.to_bits();
    // Each op's bits at the specials above; NaN compared by its being NaN.
    let check = |name: &str, op: &Op, want: [f32; 7]| {
        let got = bits(&specials, op);
        for ((&g, w), x) in got.iter().zip(want).zip(specials) {
            let ok = if w.is_nan() {
                f32::from_bits(g).is_nan()
            } else {
                g == b(w)
            };
            assert!(ok, "{name}({x:e}) = {:e}, want {w:e}", f32::from_bits(g));
        }
    };
    check(
        "tanh",
        &|t| t.tanh(),
        [f32::NAN, 1.0, -1.0, 0.0, -0.0, sub, -sub],
    );
    check(
        "exp",
        &|t| t.exp(),
        [f32::NAN, f32::INFINITY, 0.0, 1.0, 1.0, 1.0, 1.0],
    );
    check(
        "log",
        &|t| t.log(),
        [
            f32::NAN,
            f32::INFINITY,
            f32::NAN,
            f32::NEG_INFINITY,
            f32::NEG_INFINITY,
            f64::from(sub).ln() as f32,
            f32::NAN,
        ],
    );
    let erf_sub = (FRAC_2_SQRT_PI * f64::from(sub)) as f32;
    check(
        "erf",
        &|t| t.erf(),
        [f32::NAN, 1.0, -1.0, 0.0, -0.0, erf_sub, -erf_sub],
    );
    check(
        "sigmoid",
        &|t| t.sigmoid(),
        [f32::NAN, 1.0, 0.0, 0.5, 0.5, 0.5, 0.5],
    );
    // At -inf the formulas give -inf * 0, NaN, as PyTorch's do.
    let x_times_half = [
        f32::NAN,
        f32::INFINITY,
        f32::NAN,
        0.0,
        -0.0,
        sub / 2.0,
        -sub / 2.0,
    ];
    check("silu", &|t| t.silu(), x_times_half);
    check("gelu", &|t| t.gelu(), x_times_half);
    check("gelu_erf", &|t| t.gelu_erf(), x_times_half);

    // Around the ends of exp's range, and log at its exact points.
    let edges = [-104.0, -103.0, -100.0, -87.5, 88.7, 88.73, 89.0];
    let want = edges.map(|x: f32| (f64::from(x)).exp() as f32);
    assert_eq!(bits(&edges, &|t| t.exp()), want.map(b));
    assert_eq!(forward(&[tiny], &|t| t.exp()), [1.0]);
    let exact = [1.0, 2.0, 0.5, tiny, f32::MAX];
    let want = exact.map(|x: f32| (f64::from(x)).ln() as f32);
    assert_eq!(bits(&exact, &|t| t.log()), want.map(b));

    // Softmax over lanes with infinities: -inf entries get 0, a lane of -inf is NaN (0 / 0).
    let pool = Pool::with_max_memory_mb(8);
    pool.scope(|s| {
        let x = s.from_slice::<f32>(
            &[2, 3],
            &[
                0.0,
                f32::NEG_INFINITY,
                0.0,
                f32::NEG_INFINITY,
                f32::NEG_INFINITY,
                f32::NEG_INFINITY,
            ],
        );
        let y = x.softmax(-1).to_vec();
        assert_eq!(y[..3], [0.5, 0.0, 0.5]);
        assert!(y[3..].iter().all(|v| v.is_nan()));
        // The half types compute through the f32 kernels.
        let half = s.from_slice::<tensorscope::f16>(&[1], &[tensorscope::f16::from_f32(0.5)]);
        assert_eq!(
            half.tanh().item(),
            tensorscope::f16::from_f32(0.5f32.tanh())
        );
    });
}
