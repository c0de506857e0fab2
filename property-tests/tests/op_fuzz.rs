//! Random op sequences on a poisoned pool, against naive reference implementations.
//!
//! Every unzeroed rent of the pool is filled with the poison sentinel (NaN for floats, in debug
//! builds), so an op that leaves any output element unwritten shows the sentinel. Each step applies a
//! random op (by value or by reference, so in-place paths run too) to the current tensor and
//! operands made to fit it (broadcast shapes, batched matmul, convolution kernels, ...), with
//! zero-length axes, and zero-length axes next to axes of 2^40, mixed in. Each result is checked:
//!
//! - its values against a reference computed here in `f64` by plain loops from the op's actual
//!   inputs, so errors never compound along the sequence;
//! - no element is the sentinel;
//! - the kernel visits it cost (lanes, slices, matrices, images; counted in debug builds) are at most
//!   the elements it read and wrote: none at all on tensors with no elements, however long their
//!   other axes are;
//! - ops whose output cannot exist (2^40 elements) fail with a size or budget error, and ops on
//!   shapes that do not fit fail with a shape error.

#[path = "../../tests/integration/common/close.rs"]
mod close;
#[path = "../../tests/integration/common/poison.rs"]
mod poison;

use ndarray::{ArrayD, Axis, Dimension, IxDyn, Slice};
use proptest::prelude::*;
use tensorscope::__private::{kernel_visits, limit_kernel_visits};
use tensorscope::{Error, Scope, Tensor, TensorOps};

use poison::{is_poison, test_pool};

/// An axis length no buffer can hold: only ever next to a zero-length axis.
const HUGE: usize = 1 << 40;
/// Axes longer than this derive from `HUGE`; the fuzzer's own axes are at most 4 (times a few).
const LONG: usize = 1 << 20;
/// Outputs with more elements than this cannot fit the test pool: the op must fail to rent them.
const TOO_MANY: u128 = 1 << 24;
const EPS: f32 = 1e-5;

/// One step of a program; its numbers are turned into axes and lengths that fit the current shape.
#[derive(Debug, Clone)]
enum Step {
    Fresh(Vec<usize>, u64),
    Unary(u8, bool),
    Scalar(u8, f32, bool),
    Binary {
        op: u8,
        axes: Vec<u8>,
        prepend: Vec<usize>,
        drop: usize,
        swap: bool,
        owned: u8,
        seed: u64,
    },
    Softmax(bool, usize, bool),
    LayerNorm(bool),
    Reduce(bool, usize),
    Matmul(usize, bool, u64),
    Transpose,
    Reshape(bool),
    Concat(usize, usize, u64),
    Conv {
        c_out: usize,
        k: (usize, usize),
        stride: usize,
        padding: usize,
        seed: u64,
    },
    GroupNorm(usize),
    Upsample(usize),
    MapLanes(usize, bool),
    Cast,
    /// `narrow(axis, start, len)`, the numbers fitted to the shape.
    Narrow(usize, usize, usize),
    /// A permutation of the axes drawn from the seed.
    Permute(u64),
    /// `max`, `min`, `argmax` or `argmin` along an axis (negative: counted from the back).
    Extreme(u8, isize, bool),
    /// `index_select` along an axis of this many ids drawn from the seed.
    IndexSelect(usize, usize, u64),
    /// `tril(k)` or `triu(k)`.
    Triangle(i64, bool),
    /// `max_pool2d` or `avg_pool2d` with this kernel and stride.
    Pool(bool, usize, usize),
    /// `masked_fill` with a mask of the last axis drawn from the seed.
    MaskedFill(u64),
    /// Layer norm (or group norm, if the flag is set) of lanes of one large value plus noise of a
    /// few units in its last place: a fresh tensor, on which a mean rounded to `f32` is wrong by as
    /// much as the noise.
    NearlyEqualNorm(NearlyEqual),
    /// Greedy `sample_logits` of the last axis, or `multinomial` with this many draws where its
    /// ids are known (no row to draw from) or it must fail (no class).
    Sample(bool, usize),
}

/// The lanes of [`Step::NearlyEqualNorm`]: `rows` lanes of `len` values, each
/// `±10^exponent + ulps` units in its last place times a uniform draw from [-1, 1].
#[derive(Debug, Clone)]
struct NearlyEqual {
    rows: usize,
    len: usize,
    exponent: i32,
    negative: bool,
    ulps: u8,
    group: bool,
    seed: u64,
}

fn shape_strategy() -> impl Strategy<Value = Vec<usize>> {
    let small = prop::collection::vec(prop_oneof![4 => 1usize..5, 1 => Just(0usize)], 0..5);
    // A zero-length axis next to a huge one, in random places.
    let huge = (
        2usize..5,
        any::<prop::sample::Index>(),
        any::<prop::sample::Index>(),
    )
        .prop_map(|(rank, zero, huge)| {
            let mut shape = vec![2; rank];
            let z = zero.index(rank);
            let h = (z + 1 + huge.index(rank - 1)) % rank;
            shape[z] = 0;
            shape[h] = HUGE;
            shape
        });
    prop_oneof![5 => small, 1 => huge]
}

fn step_strategy() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (shape_strategy(), any::<u64>()).prop_map(|(s, seed)| Step::Fresh(s, seed)),
        3 => (0u8..7, any::<bool>()).prop_map(|(k, o)| Step::Unary(k, o)),
        1 => (0u8..4, -2.0f32..2.0, any::<bool>()).prop_map(|(k, v, o)| Step::Scalar(k, v, o)),
        4 => (
            0u8..5,
            prop::collection::vec(0u8..3, 5),
            prop::collection::vec(1usize..4, 0..2),
            0usize..3,
            any::<bool>(),
            0u8..4,
            any::<u64>()
        )
            .prop_map(|(op, axes, prepend, drop, swap, owned, seed)| Step::Binary {
                op,
                axes,
                prepend,
                drop,
                swap,
                owned,
                seed
            }),
        2 => (any::<bool>(), 0usize..4, any::<bool>()).prop_map(|(l, a, o)| Step::Softmax(l, a, o)),
        1 => any::<bool>().prop_map(Step::LayerNorm),
        2 => (any::<bool>(), 0usize..4).prop_map(|(m, a)| Step::Reduce(m, a)),
        2 => (0usize..4, any::<bool>(), any::<u64>()).prop_map(|(n, b, s)| Step::Matmul(n, b, s)),
        1 => Just(Step::Transpose),
        1 => any::<bool>().prop_map(Step::Reshape),
        1 => (0usize..4, 0usize..3, any::<u64>()).prop_map(|(a, e, s)| Step::Concat(a, e, s)),
        2 => (0usize..3, (1usize..4, 1usize..4), 1usize..3, 0usize..3, any::<u64>()).prop_map(
            |(c_out, k, stride, padding, seed)| Step::Conv {
                c_out,
                k,
                stride,
                padding,
                seed
            }
        ),
        1 => (1usize..5).prop_map(Step::GroupNorm),
        1 => (1usize..4).prop_map(Step::Upsample),
        1 => (0usize..4, any::<bool>()).prop_map(|(a, o)| Step::MapLanes(a, o)),
        1 => Just(Step::Cast),
        2 => (0usize..4, any::<usize>(), any::<usize>()).prop_map(|(a, st, l)| Step::Narrow(a, st, l)),
        1 => any::<u64>().prop_map(Step::Permute),
        2 => (0u8..4, -4isize..4, any::<bool>()).prop_map(|(w, a, k)| Step::Extreme(w, a, k)),
        2 => (0usize..4, 0usize..5, any::<u64>()).prop_map(|(a, n, s)| Step::IndexSelect(a, n, s)),
        1 => (-3i64..4, any::<bool>()).prop_map(|(k, u)| Step::Triangle(k, u)),
        1 => (any::<bool>(), 1usize..4, 1usize..3).prop_map(|(m, k, st)| Step::Pool(m, k, st)),
        1 => any::<u64>().prop_map(Step::MaskedFill),
        1 => (
            1usize..4,
            prop_oneof![1usize..20, Just(100usize)],
            2i32..8,
            any::<bool>(),
            0u8..64,
            any::<bool>(),
            any::<u64>()
        )
            .prop_map(|(rows, len, exponent, negative, ulps, group, seed)| {
                Step::NearlyEqualNorm(NearlyEqual {
                    rows,
                    len,
                    exponent,
                    negative,
                    ulps,
                    group,
                    seed,
                })
            }),
        1 => (any::<bool>(), 0usize..3).prop_map(|(m, n)| Step::Sample(m, n)),
    ]
}

// --- The reference ---------------------------------------------------------------------------

/// What an op must give.
enum Want {
    /// These values (compared as `f32`).
    Values(ArrayD<f64>),
    /// A size or budget error: the output cannot exist.
    TooLarge,
    /// A shape error: the operands do not fit.
    Invalid,
}

/// `Want::TooLarge` if an output of `shape` cannot be rented, else `values(shape)`; `values` only
/// runs for outputs that exist, and is not called at all for an empty one.
fn output(shape: Vec<usize>, values: impl FnOnce(&[usize]) -> ArrayD<f64>) -> Want {
    let nonzero: u128 = shape
        .iter()
        .filter(|&&d| d != 0)
        .map(|&d| d as u128)
        .product();
    if nonzero > TOO_MANY {
        if shape.contains(&0) && nonzero.saturating_mul(4) <= isize::MAX as u128 {
            Want::Values(ArrayD::zeros(IxDyn(&shape)))
        } else {
            Want::TooLarge
        }
    } else if shape.contains(&0) {
        Want::Values(ArrayD::zeros(IxDyn(&shape)))
    } else {
        Want::Values(values(&shape))
    }
}

fn from_fn(shape: &[usize], f: impl Fn(&[usize]) -> f64) -> ArrayD<f64> {
    ArrayD::from_shape_fn(IxDyn(shape), |idx| f(idx.slice()))
}

fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let at = |s: &[usize], i: usize| {
        if i + s.len() >= n {
            s[i + s.len() - n]
        } else {
            1
        }
    };
    (0..n)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// `x` read at the output index `idx`, broadcasting (axes aligned from the right, length 1 repeats).
fn broadcast_at(x: &ArrayD<f64>, idx: &[usize]) -> f64 {
    let off = idx.len() - x.ndim();
    let i: Vec<usize> = (0..x.ndim())
        .map(|a| if x.shape()[a] == 1 { 0 } else { idx[off + a] })
        .collect();
    x[IxDyn(&i)]
}

fn ref_binary(a: &ArrayD<f64>, b: &ArrayD<f64>, f: impl Fn(f64, f64) -> f64) -> Want {
    match broadcast_shape(a.shape(), b.shape()) {
        None => Want::Invalid,
        Some(shape) => output(shape, |s| {
            from_fn(s, |i| f(broadcast_at(a, i), broadcast_at(b, i)))
        }),
    }
}

/// The indices of the lane along `axis` through `idx`.
fn lane(x: &ArrayD<f64>, idx: &[usize], axis: usize) -> Vec<f64> {
    (0..x.shape()[axis])
        .map(|k| {
            let mut i = idx.to_vec();
            i[axis] = k;
            x[IxDyn(&i)]
        })
        .collect()
}

fn ref_lanes(x: &ArrayD<f64>, axis: usize, f: impl Fn(&[f64], usize) -> f64) -> Want {
    if axis >= x.ndim() {
        return Want::Invalid;
    }
    output(x.shape().to_vec(), |s| {
        from_fn(s, |i| f(&lane(x, i, axis), i[axis]))
    })
}

fn ref_softmax(x: &ArrayD<f64>, axis: usize, log: bool) -> Want {
    ref_lanes(x, axis, |lane, k| {
        let max = lane.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = lane.iter().map(|v| (v - max).exp()).sum();
        if log {
            lane[k] - max - sum.ln()
        } else {
            (lane[k] - max).exp() / sum
        }
    })
}

fn normalize(values: &[f64], v: f64) -> f64 {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = values.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    (v - mean) / (var + f64::from(EPS)).sqrt()
}

fn ref_reduce(x: &ArrayD<f64>, axis: usize, mean: bool) -> Want {
    if axis >= x.ndim() {
        return Want::Invalid;
    }
    let mut shape = x.shape().to_vec();
    let len = shape.remove(axis);
    output(shape, |s| {
        from_fn(s, |i| {
            let mut full = i.to_vec();
            full.insert(axis, 0);
            let sum: f64 = lane(x, &full, axis).iter().sum();
            if mean {
                sum / len as f64
            } else {
                sum
            }
        })
    })
}

fn ref_matmul(a: &ArrayD<f64>, b: &ArrayD<f64>) -> Want {
    // PyTorch's rule for ranks >= 2: `[.., m, k] x [.., k, n]`, the batch axes broadcast.
    let (Some(ab), Some(bb)) = (a.ndim().checked_sub(2), b.ndim().checked_sub(2)) else {
        return Want::Invalid;
    };
    let (m, k, k2, n) = (
        a.shape()[ab],
        a.shape()[ab + 1],
        b.shape()[bb],
        b.shape()[bb + 1],
    );
    let Some(batch) = broadcast_shape(&a.shape()[..ab], &b.shape()[..bb]).filter(|_| k == k2)
    else {
        return Want::Invalid;
    };
    let mut shape = batch.clone();
    shape.extend([m, n]);
    // The index of an operand of batch axes `own` at output batch index `at` (1-axes broadcast).
    let pick = |own: &[usize], at: &[usize], tail: [usize; 2]| -> Vec<usize> {
        let lead = at.len() - own.len();
        let mut i: Vec<usize> = own
            .iter()
            .zip(&at[lead..])
            .map(|(&l, &p)| if l == 1 { 0 } else { p })
            .collect();
        i.extend(tail);
        i
    };
    output(shape, |s| {
        from_fn(s, |i| {
            let (at, rc) = i.split_at(i.len() - 2);
            (0..k)
                .map(|j| {
                    let av = a[IxDyn(&pick(&a.shape()[..ab], at, [rc[0], j]))];
                    let bv = b[IxDyn(&pick(&b.shape()[..bb], at, [j, rc[1]]))];
                    av * bv
                })
                .sum()
        })
    })
}

fn ref_conv(x: &ArrayD<f64>, w: &ArrayD<f64>, stride: usize, pad: usize) -> Want {
    let (&[n, c, h, wd], &[co, wc, kh, kw]) = (x.shape(), w.shape()) else {
        return Want::Invalid;
    };
    if wc != c || kh > h + 2 * pad || kw > wd + 2 * pad {
        return Want::Invalid;
    }
    let (ho, wo) = (
        (h + 2 * pad - kh) / stride + 1,
        (wd + 2 * pad - kw) / stride + 1,
    );
    output(vec![n, co, ho, wo], |s| {
        from_fn(s, |i| {
            let [b, o, oy, ox] = [i[0], i[1], i[2], i[3]];
            let mut acc = 0.0;
            for ci in 0..c {
                for ky in 0..kh {
                    for kx in 0..kw {
                        let (py, px) = (oy * stride + ky, ox * stride + kx);
                        if py >= pad && px >= pad && py - pad < h && px - pad < wd {
                            acc += x[[b, ci, py - pad, px - pad]] * w[[o, ci, ky, kx]];
                        }
                    }
                }
            }
            acc
        })
    })
}

fn ref_group_norm(x: &ArrayD<f64>, groups: usize) -> Want {
    let &[_, c, h, w] = x.shape() else {
        return Want::Invalid;
    };
    if c % groups != 0 {
        return Want::Invalid;
    }
    let per = c / groups;
    output(x.shape().to_vec(), |s| {
        from_fn(s, |i| {
            let g = i[1] / per;
            let mut values = Vec::new();
            for ci in g * per..(g + 1) * per {
                for y in 0..h {
                    for xx in 0..w {
                        values.push(x[[i[0], ci, y, xx]]);
                    }
                }
            }
            normalize(&values, x[IxDyn(i)])
        })
    })
}

// --- Running a program -----------------------------------------------------------------------

fn values(t: &Tensor<'_>) -> ArrayD<f64> {
    t.to_array().mapv(f64::from)
}

/// Whether `g` is `w` within `tol * (1 + |w|)`, by the suite's rule ([`close::close`]); a reference
/// beyond `f32`'s range is the infinity an `f32` op gives for it.
fn matches_reference(g: f32, w: f64, tol: f64) -> bool {
    let w32 = w as f32;
    let w = if w32.is_infinite() { f64::from(w32) } else { w };
    close::close(f64::from(g), w, tol, tol)
}

/// Checks one op's result against `want`; returns the new current tensor if it gave one.
fn check<'s>(
    what: &str,
    got: Result<Tensor<'s>, Error>,
    want: Want,
    visits_before: u64,
    elements_in: u128,
    tol: f64,
) -> Result<Option<Tensor<'s>>, TestCaseError> {
    let visits = kernel_visits() - visits_before;
    let out = match (got, want) {
        (Ok(t), Want::Values(w)) => {
            prop_assert_eq!(t.shape(), w.shape(), "{}: shape", what);
            if let Some(i) = t.view().iter().position(|&v| is_poison(v)) {
                return Err(TestCaseError::fail(format!(
                    "{what}: element {i} of {:?} was never written",
                    t.shape()
                )));
            }
            for ((idx, &g), &wv) in t.view().indexed_iter().zip(w.iter()) {
                prop_assert!(
                    matches_reference(g, wv, tol),
                    "{}: at {:?} got {}, want {}",
                    what,
                    idx,
                    g,
                    wv
                );
            }
            Some(t)
        }
        (
            Err(
                Error::BudgetExceeded { .. }
                | Error::SizeOverflow { .. }
                | Error::DimensionOverflow { .. },
            ),
            Want::TooLarge,
        ) => None,
        (
            Err(
                Error::ShapeMismatch { .. }
                | Error::InvalidShape { .. }
                | Error::InvalidArgument { .. }
                | Error::AxisOutOfRange { .. },
            ),
            Want::Invalid,
        ) => None,
        (got, want) => {
            let want = match want {
                Want::Values(w) => format!("values of shape {:?}", w.shape()),
                Want::TooLarge => "a size or budget error".into(),
                Want::Invalid => "a shape error".into(),
            };
            return Err(TestCaseError::fail(format!(
                "{what}: got {:?}, want {want}",
                got.map(|t| t.shape().to_vec())
            )));
        }
    };
    let elements_out = out.as_ref().map_or(0, |t| t.len() as u128);
    prop_assert!(
        u128::from(visits) <= elements_in + elements_out,
        "{}: {} kernel visits for {} elements in and {} out",
        what,
        visits,
        elements_in,
        elements_out
    );
    Ok(out)
}

/// Whether `shape` has an axis longer than `LONG`: one that came from `HUGE` (perhaps halved by a
/// stride or grown by upsampling), on which a free length must stay 0 for the output to exist.
fn has_long_axis(shape: &[usize]) -> bool {
    shape.iter().any(|&d| d > LONG)
}

/// `shape` with long axes made 1 if it holds elements: such a tensor could not be rented.
fn tame(mut shape: Vec<usize>) -> Vec<usize> {
    if !shape.contains(&0) {
        shape.iter_mut().filter(|d| **d > LONG).for_each(|d| *d = 1);
    }
    shape
}

/// The tensor of [`Step::NearlyEqualNorm`]: `[rows, len]`, or `[1, 2, rows, len]` for group norm.
fn nearly_equal<'s>(s: &Scope<'s, '_>, lanes: &NearlyEqual) -> Tensor<'s> {
    let magnitude = 10f32.powi(lanes.exponent);
    let ulp = f32::from_bits(magnitude.to_bits() + 1) - magnitude;
    let value = if lanes.negative {
        -magnitude
    } else {
        magnitude
    };
    let shape = match lanes.group {
        true => vec![1, 2, lanes.rows, lanes.len],
        false => vec![lanes.rows, lanes.len],
    };
    let noise = s.uniform::<f32>(&shape, -1.0, 1.0, lanes.seed) * (f32::from(lanes.ulps) * ulp);
    noise + value
}

fn random<'s>(s: &Scope<'s, '_>, shape: &[usize], seed: u64) -> Tensor<'s> {
    s.uniform::<f32>(&tame(shape.to_vec()), -2.0, 2.0, seed)
}

/// A shape that broadcasts with `x` (or, sometimes, not: an axis set to a third length).
fn broadcast_partner(x: &[usize], axes: &[u8], prepend: &[usize], drop: usize) -> Vec<usize> {
    let mut shape: Vec<usize> = prepend.to_vec();
    for (i, &d) in x.iter().enumerate().skip(drop.min(x.len())) {
        shape.push(match axes[i % axes.len()] {
            0 => d,
            1 => 1,
            _ if d == 1 => 3,
            _ => d + 1, // does not broadcast
        });
    }
    tame(shape)
}

fn unary(kind: u8) -> (&'static str, fn(f64) -> f64) {
    match kind {
        0 => ("relu", |x| if x <= 0.0 { 0.0 } else { x }),
        1 => ("gelu", |x| {
            0.5 * x
                * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x.powi(3))).tanh())
        }),
        2 => ("silu", |x| x / (1.0 + (-x).exp())),
        3 => ("sigmoid", |x| 1.0 / (1.0 + (-x).exp())),
        4 => ("tanh", f64::tanh),
        5 => ("exp", f64::exp),
        _ => ("neg", |x| -x),
    }
}

fn apply_unary<'s>(x: impl TensorOps<'s, f32>, kind: u8) -> Result<Tensor<'s>, Error> {
    match kind {
        0 => Ok(x.relu()),
        1 => Ok(x.gelu()),
        2 => Ok(x.silu()),
        3 => Ok(x.sigmoid()),
        4 => Ok(x.tanh()),
        5 => Ok(x.exp()),
        _ => x.try_map(|v| -v),
    }
}

fn run_program(steps: &[Step]) -> Result<(), TestCaseError> {
    let pool = test_pool(64);
    pool.scope(|s| {
        let mut x = random(s, &[2, 3], 1);
        for step in steps {
            let xv = values(&x);
            let rank = x.ndim();
            let mut visits = kernel_visits();
            let mut elements = x.len() as u128;
            // No output the pool can hold has more than TOO_MANY elements: an op that is about to
            // loop over 2^40 empty lanes panics here instead of running for hours. The exact bound
            // is checked after the op.
            limit_kernel_visits(Some(elements as u64 + TOO_MANY as u64));
            let (what, got, want, tol): (String, Result<Tensor<'_>, Error>, Want, f64) = match step
            {
                Step::Fresh(shape, seed) => {
                    x = random(s, shape, *seed);
                    continue;
                }
                &Step::Unary(kind, owned) => {
                    let (name, f) = unary(kind);
                    let want = output(x.shape().to_vec(), |_| xv.mapv(f));
                    let got = if owned {
                        apply_unary(x, kind)
                    } else {
                        apply_unary(&x, kind)
                    };
                    (name.into(), got, want, 1e-5)
                }
                &Step::Scalar(kind, v, owned) => {
                    let w = f64::from(v);
                    let (name, f): (&str, fn(f64, f64) -> f64) = match kind {
                        0 => ("+ scalar", |a, b| a + b),
                        1 => ("- scalar", |a, b| a - b),
                        2 => ("* scalar", |a, b| a * b),
                        _ => ("/ scalar", |a, b| a / b),
                    };
                    let want = output(x.shape().to_vec(), |_| xv.mapv(|a| f(a, w)));
                    let got = match (kind, owned) {
                        (0, true) => x + v,
                        (0, false) => &x + v,
                        (1, true) => x - v,
                        (1, false) => &x - v,
                        (2, true) => x * v,
                        (2, false) => &x * v,
                        (_, true) => x / v,
                        (_, false) => &x / v,
                    };
                    (name.into(), Ok(got), want, 1e-5)
                }
                &Step::Binary {
                    op,
                    ref axes,
                    ref prepend,
                    drop,
                    swap,
                    owned,
                    seed,
                } => {
                    let y = random(s, &broadcast_partner(x.shape(), axes, prepend, drop), seed);
                    let yv = values(&y);
                    let (a, b, av, bv) = if swap {
                        (y, x, &yv, &xv)
                    } else {
                        (x, y, &xv, &yv)
                    };
                    let (name, f): (&str, fn(f64, f64) -> f64) = match op {
                        0 => ("add", |p, q| p + q),
                        1 => ("sub", |p, q| p - q),
                        2 => ("mul", |p, q| p * q),
                        3 => ("div", |p, q| p / q),
                        _ => ("zip_map", |p, q| p.max(q) - q),
                    };
                    let want = ref_binary(av, bv, f);
                    let fits = !matches!(want, Want::Invalid);
                    let got = match (op, owned, fits) {
                        (4, _, _) => a.try_zip_map(&b, |p, q| p.max(q) - q),
                        (_, _, false) | (_, 0, _) => match op {
                            0 => a.try_add(&b),
                            1 => a.try_sub(&b),
                            2 => a.try_mul(&b),
                            _ => a.try_div(&b),
                        },
                        // The operator forms, which write into a unique owned operand.
                        (0, 1, _) => Ok(a + &b),
                        (0, 2, _) => Ok(&a + b),
                        (0, _, _) => Ok(a + b),
                        (1, 1, _) => Ok(a - &b),
                        (1, 2, _) => Ok(&a - b),
                        (1, _, _) => Ok(a - b),
                        (2, 1, _) => Ok(a * &b),
                        (2, 2, _) => Ok(&a * b),
                        (2, _, _) => Ok(a * b),
                        (_, 1, _) => Ok(a / &b),
                        (_, 2, _) => Ok(&a / b),
                        (_, _, _) => Ok(a / b),
                    };
                    (name.into(), got, want, 1e-5)
                }
                &Step::Softmax(log, axis, owned) => {
                    let axis = axis % rank.max(1);
                    let want = ref_softmax(&xv, axis, log);
                    let got = match (log, owned) {
                        (false, true) => x.try_softmax(axis),
                        (false, false) => (&x).try_softmax(axis),
                        (true, true) => x.try_log_softmax(axis),
                        (true, false) => (&x).try_log_softmax(axis),
                    };
                    (format!("softmax(log {log}, axis {axis})"), got, want, 1e-5)
                }
                &Step::LayerNorm(owned) => {
                    let want = match rank {
                        0 => Want::Invalid,
                        _ => ref_lanes(&xv, rank - 1, |lane, k| normalize(lane, lane[k])),
                    };
                    let got = if owned {
                        x.try_layer_norm(EPS)
                    } else {
                        (&x).try_layer_norm(EPS)
                    };
                    ("layer_norm".into(), got, want, 1e-3)
                }
                &Step::Reduce(mean, axis) => {
                    let axis = axis % rank.max(1);
                    let want = ref_reduce(&xv, axis, mean);
                    let got = if mean {
                        x.try_mean(axis)
                    } else {
                        x.try_sum(axis)
                    };
                    (format!("reduce(mean {mean}, axis {axis})"), got, want, 1e-5)
                }
                &Step::Matmul(n, batched, seed) => {
                    let shape = x.shape();
                    let k = shape.last().copied().unwrap_or(1);
                    // A free length stays 0 next to a huge axis, so the output can exist.
                    let n = if has_long_axis(shape) { 0 } else { n };
                    // Batched: the same batch axes, or each one broadcast from 1 (odd seeds).
                    let other = match (shape.len(), batched) {
                        (r, true) if r >= 3 => {
                            let mut o: Vec<usize> = shape[..r - 2]
                                .iter()
                                .enumerate()
                                .map(|(i, &l)| if (seed >> i) & 1 == 1 { 1 } else { l })
                                .collect();
                            o.extend([k, n]);
                            o
                        }
                        _ => vec![k, n],
                    };
                    let y = random(s, &other, seed);
                    let want = ref_matmul(&xv, &values(&y));
                    let got = x.try_matmul(&y);
                    (
                        format!("matmul {:?} x {:?}", xv.shape(), y.shape()),
                        got,
                        want,
                        1e-4,
                    )
                }
                Step::Transpose => {
                    let want = if rank < 2 {
                        Want::Invalid
                    } else {
                        let mut v = xv.clone();
                        v.swap_axes(rank - 2, rank - 1);
                        output(v.shape().to_vec(), |_| v.as_standard_layout().into_owned())
                    };
                    ("transpose".into(), x.try_t(), want, 0.0)
                }
                &Step::Reshape(flat) => {
                    let shape = if flat {
                        vec![x.len()]
                    } else {
                        [&[1], x.shape()].concat()
                    };
                    let want = output(shape.clone(), |s| {
                        ArrayD::from_shape_vec(IxDyn(s), xv.iter().copied().collect()).unwrap()
                    });
                    ("reshape".into(), x.try_reshape(&shape), want, 0.0)
                }
                &Step::Concat(axis, extra, seed) => {
                    let axis = axis % rank.max(1);
                    let mut shape = x.shape().to_vec();
                    if let Some(d) = shape.get_mut(axis) {
                        *d = extra;
                    }
                    if !shape.contains(&0) && has_long_axis(&shape) {
                        shape[axis] = 0; // the only way such an operand exists
                    }
                    let y = random(s, &shape, seed);
                    let yv = values(&y);
                    let want = if rank == 0 {
                        Want::Invalid
                    } else {
                        let mut joined = xv.shape().to_vec();
                        joined[axis] += yv.shape()[axis];
                        output(joined, |_| {
                            ndarray::concatenate(Axis(axis), &[xv.view(), yv.view()]).unwrap()
                        })
                    };
                    let got = Tensor::try_concat(&[&x, &y], axis);
                    (format!("concat(axis {axis})"), got, want, 0.0)
                }
                &Step::Conv {
                    c_out,
                    k: (kh, kw),
                    stride,
                    padding,
                    seed,
                } => {
                    let c = x.shape().get(1).copied().unwrap_or(1);
                    let c_out = if has_long_axis(x.shape()) { 0 } else { c_out };
                    let w = random(s, &[c_out, c, kh, kw], seed);
                    let want = ref_conv(&xv, &values(&w), stride, padding);
                    let got = x.try_conv2d(&w, stride, padding);
                    let what = format!(
                        "conv2d {:?} * {:?} s{stride} p{padding}",
                        xv.shape(),
                        w.shape()
                    );
                    (what, got, want, 1e-4)
                }
                Step::NearlyEqualNorm(lanes) => {
                    x = nearly_equal(s, lanes);
                    // The visits and elements of this step are the norm's, not the fresh tensor's.
                    (visits, elements) = (kernel_visits(), x.len() as u128);
                    let xv = values(&x);
                    match lanes.group {
                        true => (
                            "group_norm(2) of nearly equal values".into(),
                            x.try_group_norm(2, EPS),
                            ref_group_norm(&xv, 2),
                            1e-3,
                        ),
                        false => (
                            "layer_norm of nearly equal values".into(),
                            x.try_layer_norm(EPS),
                            ref_lanes(&xv, 1, |lane, k| normalize(lane, lane[k])),
                            1e-3,
                        ),
                    }
                }
                &Step::GroupNorm(groups) => {
                    let c = x.shape().get(1).copied().unwrap_or(0);
                    // A divisor of the channels, when there are any.
                    let groups = (1..=groups).rev().find(|g| c % g == 0).unwrap_or(1);
                    let want = ref_group_norm(&xv, groups);
                    let got = x.try_group_norm(groups, EPS);
                    (format!("group_norm({groups})"), got, want, 1e-3)
                }
                &Step::Upsample(scale) => {
                    let want = match *xv.shape() {
                        [n, c, h, w] => output(vec![n, c, h * scale, w * scale], |sh| {
                            from_fn(sh, |i| xv[[i[0], i[1], i[2] / scale, i[3] / scale]])
                        }),
                        _ => Want::Invalid,
                    };
                    (
                        "upsample".into(),
                        x.try_upsample_nearest2d(scale),
                        want,
                        0.0,
                    )
                }
                &Step::MapLanes(axis, owned) => {
                    let axis = axis % rank.max(1);
                    let want = ref_lanes(&xv, axis, |lane, k| lane[lane.len() - 1 - k]);
                    let mut calls = 0u128;
                    let reverse = |mut lane: ndarray::ArrayViewMut1<'_, f32>| {
                        calls += 1;
                        let v: Vec<f32> = lane.iter().rev().copied().collect();
                        lane.iter_mut().zip(v).for_each(|(d, s)| *d = s);
                    };
                    let got = if owned {
                        x.try_map_lanes(axis, reverse)
                    } else {
                        (&x).try_map_lanes(axis, reverse)
                    };
                    prop_assert!(calls <= elements, "map_lanes: {} kernel calls", calls);
                    (format!("map_lanes(axis {axis})"), got, want, 0.0)
                }
                Step::Cast => {
                    let got = x.try_cast::<f64>().and_then(|d| d.try_cast::<f32>());
                    let want = output(x.shape().to_vec(), |_| xv.clone());
                    ("cast".into(), got, want, 0.0)
                }
                &Step::Narrow(axis, start, len) => {
                    let axis = axis % rank.max(1);
                    let full = x.shape().get(axis).copied().unwrap_or(0);
                    let start = start % (full + 1);
                    let len = len % (full - start + 1);
                    let want = if axis >= rank {
                        Want::Invalid
                    } else {
                        let mut shape = x.shape().to_vec();
                        shape[axis] = len;
                        output(shape, |_| {
                            xv.slice_axis(Axis(axis), Slice::from(start..start + len))
                                .to_owned()
                        })
                    };
                    let got = x.try_narrow(axis, start, len);
                    (format!("narrow({axis}, {start}, {len})"), got, want, 0.0)
                }
                &Step::Permute(seed) => {
                    let mut axes: Vec<usize> = (0..rank).collect();
                    for i in (1..rank).rev() {
                        axes.swap(i, (seed >> (4 * i)) as usize % (i + 1));
                    }
                    let v = xv.clone().permuted_axes(IxDyn(&axes));
                    let want = output(v.shape().to_vec(), |_| v.as_standard_layout().into_owned());
                    (
                        format!("permute({axes:?})"),
                        x.try_permute(&axes),
                        want,
                        0.0,
                    )
                }
                &Step::Extreme(which, axis, keepdim) => {
                    let name = ["max", "min", "argmax", "argmin"][which as usize];
                    let resolved = if axis < 0 { rank as isize + axis } else { axis };
                    let want = match usize::try_from(resolved).ok().filter(|&a| a < rank) {
                        Some(a) if x.shape()[a] > 0 => {
                            let mut shape = x.shape().to_vec();
                            if keepdim {
                                shape[a] = 1;
                            } else {
                                shape.remove(a);
                            }
                            output(shape, |sh| {
                                from_fn(sh, |i| {
                                    let mut at = i.to_vec();
                                    if !keepdim {
                                        at.insert(a, 0);
                                    }
                                    let lane = lane(&xv, &at, a);
                                    let best = (0..lane.len()).fold(0, |b, k| {
                                        let better = if which % 2 == 0 {
                                            lane[k] > lane[b]
                                        } else {
                                            lane[k] < lane[b]
                                        };
                                        if better {
                                            k
                                        } else {
                                            b
                                        }
                                    });
                                    if which < 2 {
                                        lane[best]
                                    } else {
                                        best as f64
                                    }
                                })
                            })
                        }
                        _ => Want::Invalid,
                    };
                    let got = match (which, keepdim) {
                        (0, false) => x.try_max(axis),
                        (0, true) => x.try_max_keepdim(axis),
                        (1, false) => x.try_min(axis),
                        (1, true) => x.try_min_keepdim(axis),
                        (2, _) => x.try_argmax(axis).and_then(|p| p.try_cast::<f32>()),
                        _ => x.try_argmin(axis).and_then(|p| p.try_cast::<f32>()),
                    };
                    // The positions have no kept axis: compare their shape without it.
                    let got = match (which, keepdim) {
                        (2.., true) => got.and_then(|p| {
                            let a = (if axis < 0 { rank as isize + axis } else { axis }) as usize;
                            p.try_unsqueeze(a)
                        }),
                        _ => got,
                    };
                    (format!("{name}({axis}, keepdim {keepdim})"), got, want, 0.0)
                }
                &Step::IndexSelect(axis, n, seed) => {
                    let axis = axis % rank.max(1);
                    let len = x.shape().get(axis).copied().unwrap_or(0);
                    let n = if len == 0 || has_long_axis(x.shape()) {
                        0
                    } else {
                        n
                    };
                    let ids: Vec<i64> = (0..n)
                        .map(|k| ((seed >> (8 * k)) as usize % len.max(1)) as i64)
                        .collect();
                    let want = if axis >= rank {
                        Want::Invalid
                    } else {
                        let mut shape = x.shape().to_vec();
                        shape[axis] = n;
                        output(shape, |sh| {
                            from_fn(sh, |i| {
                                let mut at = i.to_vec();
                                at[axis] = ids[i[axis]] as usize;
                                xv[IxDyn(&at)]
                            })
                        })
                    };
                    let id_tensor = s.from_slice::<i64>(&[n], &ids);
                    let got = x.try_index_select(axis, &id_tensor);
                    (format!("index_select({axis}, {ids:?})"), got, want, 0.0)
                }
                &Step::Triangle(k, upper) => {
                    let want = if rank < 2 {
                        Want::Invalid
                    } else {
                        output(x.shape().to_vec(), |sh| {
                            from_fn(sh, |i| {
                                let d = i[rank - 1] as i64 - i[rank - 2] as i64;
                                let keep = if upper { d >= k } else { d <= k };
                                if keep {
                                    xv[IxDyn(i)]
                                } else {
                                    0.0
                                }
                            })
                        })
                    };
                    let got = if upper { x.try_triu(k) } else { x.try_tril(k) };
                    (format!("tri(k {k}, upper {upper})"), got, want, 0.0)
                }
                &Step::Pool(max, kernel, stride) => {
                    let want = match *xv.shape() {
                        [n, c, h, w] if kernel <= h && kernel <= w => {
                            let (ho, wo) = ((h - kernel) / stride + 1, (w - kernel) / stride + 1);
                            output(vec![n, c, ho, wo], |sh| {
                                from_fn(sh, |i| {
                                    let window = (0..kernel)
                                        .flat_map(|dy| (0..kernel).map(move |dx| (dy, dx)));
                                    let vals = window.map(|(dy, dx)| {
                                        xv[[i[0], i[1], i[2] * stride + dy, i[3] * stride + dx]]
                                    });
                                    if max {
                                        vals.fold(f64::NEG_INFINITY, f64::max)
                                    } else {
                                        vals.sum::<f64>() / (kernel * kernel) as f64
                                    }
                                })
                            })
                        }
                        _ => Want::Invalid,
                    };
                    let got = if max {
                        x.try_max_pool2d(kernel, stride)
                    } else {
                        x.try_avg_pool2d(kernel, stride)
                    };
                    (
                        format!("pool(max {max}, {kernel}, {stride})"),
                        got,
                        want,
                        1e-5,
                    )
                }
                &Step::MaskedFill(seed) => {
                    // One bit per position of the last axis (one for all on a long axis).
                    let last = x.shape().last().copied().filter(|&l| l <= 64).unwrap_or(1);
                    let bits: Vec<u8> = (0..last).map(|k| ((seed >> k) & 1) as u8).collect();
                    let mask_shape = if rank == 0 { vec![] } else { vec![last] };
                    let mask = s.from_slice::<u8>(
                        &mask_shape,
                        &bits[..mask_shape.iter().product::<usize>()],
                    );
                    let want = output(x.shape().to_vec(), |sh| {
                        from_fn(sh, |i| {
                            let k = i.last().copied().unwrap_or(0) % last;
                            if bits[k] != 0 {
                                0.5
                            } else {
                                xv[IxDyn(i)]
                            }
                        })
                    });
                    (
                        "masked_fill".into(),
                        x.try_masked_fill(&mask, 0.5),
                        want,
                        0.0,
                    )
                }
                &Step::Sample(multinomial, n) => {
                    let last = x.shape().last().copied();
                    let rows = x.shape().iter().rev().skip(1).product::<usize>();
                    let lead = x.shape()[..rank.saturating_sub(1)].to_vec();
                    let rng = &mut tensorscope::Generator::new(n as u64);
                    // An empty class axis has nothing to draw, with rows or without.
                    let invalid = matches!(last, None | Some(0));
                    if multinomial && (invalid || rows == 0) {
                        let want = match invalid {
                            true => Want::Invalid,
                            false => output([&lead[..], &[n]].concat(), |_| unreachable!()),
                        };
                        let got = x.try_multinomial(n, true, rng).and_then(|t| t.try_cast());
                        (format!("multinomial({n})"), got, want, 0.0)
                    } else {
                        let want = match invalid {
                            true => Want::Invalid,
                            false => output(lead, |sh| {
                                from_fn(sh, |i| {
                                    let mut at = i.to_vec();
                                    at.push(0);
                                    let lane = lane(&xv, &at, rank - 1);
                                    let best = (0..lane.len()).fold(0, |b, k| {
                                        if lane[k] > lane[b] {
                                            k
                                        } else {
                                            b
                                        }
                                    });
                                    best as f64
                                })
                            }),
                        };
                        let got = x
                            .try_sample_logits(0.0, None, None, rng)
                            .and_then(|t| t.try_cast());
                        ("greedy sample_logits".into(), got, want, 0.0)
                    }
                }
            };
            limit_kernel_visits(None);
            let next = check(&what, got, want, visits, elements, tol)?;
            // Keep going from the result if it is small and finite (so that rounding stays well
            // inside the tolerances); else from a fresh tensor.
            x = match next {
                Some(t) if t.view().iter().all(|v| v.abs() < 10.0) => t,
                _ => random(s, &[2, 1, 3, 2], steps.len() as u64),
            };
        }
        Ok(())
    })
}

// 256 cases by default; `PROPTEST_CASES=20000` for a longer search.
proptest! {
    #[test]
    fn random_op_sequences_match_the_reference_and_write_every_element(
        steps in prop::collection::vec(step_strategy(), 1..12)
    ) {
        run_program(&steps)?;
    }
}

/// The fuzzer's own checks can fail: an op result with a poisoned element, or a wrong value, is
/// reported.
#[test]
fn the_checks_catch_unwritten_and_wrong_elements() {
    let pool = test_pool(8);
    pool.scope(|s| {
        if cfg!(debug_assertions) {
            let unwritten = s.rent::<f32>(&[2]);
            let want = Want::Values(ArrayD::zeros(IxDyn(&[2])));
            let err = check("rent", Ok(unwritten), want, kernel_visits(), 0, 0.0).unwrap_err();
            assert!(err.to_string().contains("was never written"), "{err}");
        }
        let wrong = s.from_slice::<f32>(&[2], &[1.0, 2.0]);
        let want = Want::Values(ArrayD::from_elem(IxDyn(&[2]), 1.0));
        let err = check("values", Ok(wrong), want, kernel_visits(), 0, 1e-5).unwrap_err();
        assert!(err.to_string().contains("got 2, want 1"), "{err}");
    });
}

/// A view of a random tensor of shape `base`: its length-1 axes expanded to `lens`, axis
/// `huge_at` (if it has length 1) to 2^40 where `huge` and else to 2000 (more than the 1000
/// elements past which a print is summarized, so that both views summarize), then its axes
/// permuted as `perm` draws.
fn expanded_view<'s>(
    s: &Scope<'s, '_>,
    (base, lens, huge_at, perm): (&[usize], &[usize], usize, u64),
    huge: bool,
    seed: u64,
) -> Tensor<'s> {
    let x = random(s, base, seed);
    let target: Vec<usize> = base
        .iter()
        .zip(lens)
        .enumerate()
        .map(|(axis, (&d, &len))| match d {
            1 if axis == huge_at && huge => HUGE,
            1 if axis == huge_at => 2000,
            1 => len,
            d => d,
        })
        .collect();
    let mut axes: Vec<usize> = (0..base.len()).collect();
    let mut state = perm;
    for i in (1..axes.len()).rev() {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        axes.swap(i, (state >> 33) as usize % (i + 1));
    }
    x.expand(&target).permute(&axes)
}

// Display of views that read their buffer out of order or many times over: what a copy prints, and
// with an axis of 2^40 (which no copy could hold) what the view with 2000 there prints, read
// through the steps.
proptest! {
    #[test]
    fn random_expanded_views_print_as_their_copies_without_one(
        base in prop::collection::vec(prop_oneof![2 => Just(1usize), 1 => 2usize..4], 1..4),
        lens in prop::collection::vec(1usize..9, 3),
        huge_at in 0usize..4,
        perm in any::<u64>(),
        seed in any::<u64>(),
    ) {
        let pool = test_pool(64);
        pool.scope(|s| {
            let view = |huge| expanded_view(s, (&base, &lens, huge_at, perm), huge, seed);
            let small = view(false);
            let printed = small.to_string();
            prop_assert_eq!(&printed, &small.contiguous().to_string());
            let huge = view(true);
            let footer = |t: &Tensor<'_>| format!("Tensor{:?}", t.shape()).replace(']', "; f32]");
            let values = printed.strip_suffix(&footer(&small)).expect("the footer last");
            prop_assert_eq!(huge.to_string(), format!("{values}{}", footer(&huge)));
            Ok(())
        })?;
    }
}
