//! The ops current models need, against PyTorch: `sin`, `cos` and rotary embeddings, `maximum`
//! and `minimum`, `pow` of two tensors, `cumsum`, `logsumexp`, `var` and `std`, `expand` and
//! `repeat`, `pad` (constant and reflect), `one_hot`, and arithmetic on integer tensors. The
//! references are `tests/fixtures/model_ops.safetensors`, written by
//! `scripts/model_ops_fixture.py`: forwards within 1e-5 relative, gradients within 1e-4 of the
//! largest, and the gradients also against central finite differences. A checkpointed forward
//! made of them all replays bit for bit, and each op's errors are typed and worded.

use std::path::PathBuf;

use ndarray::ArrayD;
use tensorscope::autograd::{check_gradients, GradCheck};
use tensorscope::nn::SafeTensorsFile;
use tensorscope::ops::Cmp;
use tensorscope::prelude::*;
use tensorscope::{CheckpointConfig, Checkpointer, Policy, Result};

use super::{assert_close_tol, assert_panics_with, axis_out_of_range, shape_mismatch};
use crate::checkpoint_training::gradients;
use crate::common::test_pool;
use tensorscope::{Error, Shape};

fn fixture() -> SafeTensorsFile {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/model_ops.safetensors");
    SafeTensorsFile::open(path).unwrap()
}

/// The fixture's tensor `name`.
fn load<T: tensorscope::DType>(file: &SafeTensorsFile, pool: &Pool, name: &str) -> Param<T> {
    file.param::<T>(pool, name)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Checks `f` on the inputs of the fixture's case `name`: its output against PyTorch's within
/// 1e-5 relative, and the gradients of `sum(out * grad_out)` against PyTorch's within 1e-4 of the
/// largest. Returns the gradient check at those inputs (analytic against finite differences).
#[track_caller]
fn parity(
    name: &str,
    inputs: usize,
    f: impl for<'s> Fn(&[Tensor<'s, f64>]) -> Result<Tensor<'s, f64>>,
) -> GradCheck {
    let file = fixture();
    let pool = test_pool(16);
    let xs: Vec<ArrayD<f64>> = (0..inputs)
        .map(|i| load::<f64>(&file, &pool, &format!("{name}.in{i}")).to_array())
        .collect();
    let want = load::<f64>(&file, &pool, &format!("{name}.out")).to_array();
    pool.scope(|s| {
        let xs: Vec<_> = xs.iter().map(|x| s.tensor(x)).collect();
        let out = f(&xs).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_close_tol(&format!("{name}: forward"), &out, &want, 1e-5, 1e-12);
    });
    let upstream = load::<f64>(&file, &pool, &format!("{name}.grad_out"));
    let check = check_gradients(&pool, &xs, 1e-6, |xs| {
        f(xs)?.try_mul(&upstream)?.try_sum_all()
    })
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    for (i, got) in check.analytic.iter().enumerate() {
        let want = load::<f64>(&file, &pool, &format!("{name}.grad{i}")).to_array();
        let largest = want.iter().fold(0.0f64, |m, g| m.max(g.abs()));
        let error = (got - &want).iter().fold(0.0f64, |m, d| m.max(d.abs())) / largest;
        assert!(
            error <= 1e-4,
            "{name}: gradient {i} is {error:e} of the largest off PyTorch's\n{got}\n{want}"
        );
    }
    check
}

/// [`parity`], and the gradients within 1e-6 of central finite differences.
#[track_caller]
fn case(
    name: &str,
    inputs: usize,
    f: impl for<'s> Fn(&[Tensor<'s, f64>]) -> Result<Tensor<'s, f64>>,
) {
    let check = parity(name, inputs, f);
    assert!(
        check.max_error() < 1e-6,
        "{name}: finite differences off by {:?} at {:?}",
        check.errors,
        check.worst
    );
}

#[test]
fn sin_and_cos_match_pytorch() {
    case("sin", 1, |x| (&x[0]).try_sin());
    case("cos", 1, |x| (&x[0]).try_cos());
}

#[test]
fn rope_rotates_as_hugging_face_llama() {
    case("rope", 3, |x| x[0].try_rope(&x[1], &x[2]));
    let file = fixture();
    let pool = test_pool(16);
    pool.scope(|s| {
        for name in ["tables_count", "tables_ids"] {
            let ids = load::<i64>(&file, &pool, &format!("rope.{name}.positions"));
            let ids: Vec<usize> = ids.as_slice().iter().map(|&p| p as usize).collect();
            let tables = |count: bool| match count {
                true => s.rope_tables::<f64>(0..ids.len(), 8, 10_000.0),
                false => s.rope_tables::<f64>(ids.iter().copied(), 8, 10_000.0),
            };
            let (cos, sin) = tables(name == "tables_count");
            // In f32, the same angles rounded once.
            let (cos32, sin32) = s.rope_tables::<f32>(ids.iter().copied(), 8, 10_000.0);
            for (got, got32, table) in [(&cos, &cos32, "cos"), (&sin, &sin32, "sin")] {
                let want = load::<f64>(&file, &pool, &format!("rope.{name}.{table}")).to_array();
                assert_close_tol(name, got, &want, 1e-12, 1e-15);
                assert_close_tol(name, got32, &want, 1e-7, 1e-7);
            }
        }
    });
}

#[test]
fn maximum_and_minimum_match_pytorch_with_ties_split() {
    case("maximum", 2, |x| x[0].try_maximum(&x[1]));
    case("minimum", 2, |x| x[0].try_minimum(&x[1]));
}

#[test]
fn maximum_propagates_nan_and_its_gradient_reaches_both() {
    // PyTorch 2.15: torch.maximum([1, nan, 2, 3], [1, 1, nan, 2]) is [1, nan, nan, 3], and the
    // gradient of its sum is [0.5, 1, 1, 1] and [0.5, 1, 1, 0].
    let pool = test_pool(4);
    pool.scope(|s| {
        let a = s
            .from_slice::<f32>(&[4], &[1.0, f32::NAN, 2.0, 3.0])
            .requires_grad();
        let b = s
            .from_slice::<f32>(&[4], &[1.0, 1.0, f32::NAN, 2.0])
            .requires_grad();
        let m = a.maximum(&b);
        let bits = |v: Vec<f32>| v.iter().map(|x| x.is_nan()).collect::<Vec<_>>();
        assert_eq!(bits(m.to_vec()), [false, true, true, false]);
        assert_eq!((m.to_vec()[0], m.to_vec()[3]), (1.0, 3.0));
        let grads = m.sum_all().backward().unwrap();
        assert_eq!(grads.of(&a).unwrap().to_vec(), [0.5, 1.0, 1.0, 1.0]);
        assert_eq!(grads.of(&b).unwrap().to_vec(), [0.5, 1.0, 1.0, 0.0]);
        let n = a.minimum(&b);
        assert_eq!(bits(n.to_vec()), [false, true, true, false]);
        assert_eq!(n.to_vec()[3], 2.0);
    });
}

#[test]
fn pow_of_two_tensors_matches_pytorch_and_its_masks_at_zero() {
    case("pow", 2, |x| x[0].try_pow_tensor(&x[1]));
    // Bases of 0 (with exponents 0 and 2.5): finite differences would step below 0, into NaN.
    parity("pow_zero", 2, |x| x[0].try_pow_tensor(&x[1]));
    // PyTorch 2.15: pow([0, 0, 2, -1], [0, -1, 0.5, 2]) is [1, inf, 1.4142, 1]; the gradients of
    // its sum are [0, -inf, 0.3536, -2] for the base and [0, -inf, 0.9803, nan] for the exponent.
    let pool = test_pool(4);
    pool.scope(|s| {
        let x = s
            .from_slice::<f64>(&[4], &[0.0, 0.0, 2.0, -1.0])
            .requires_grad();
        let e = s
            .from_slice::<f64>(&[4], &[0.0, -1.0, 0.5, 2.0])
            .requires_grad();
        let y = x.pow_tensor(&e);
        assert_eq!(y.to_vec(), [1.0, f64::INFINITY, 2f64.sqrt(), 1.0]);
        let grads = y.sum_all().backward().unwrap();
        let dx = grads.of(&x).unwrap().to_vec();
        assert_eq!([dx[0], dx[1], dx[3]], [0.0, f64::NEG_INFINITY, -2.0]);
        assert!((dx[2] - 0.5 / 2f64.sqrt()).abs() < 1e-15);
        let de = grads.of(&e).unwrap().to_vec();
        assert_eq!(de[..2], [0.0, f64::NEG_INFINITY]);
        assert!((de[2] - 2f64.sqrt() * 2f64.ln()).abs() < 1e-15);
        assert!(de[3].is_nan());
    });
}

#[test]
fn cumsum_matches_pytorch_along_any_axis() {
    case("cumsum1", 1, |x| x[0].try_cumsum(1));
    case("cumsum_last", 1, |x| x[0].try_cumsum(-1));
}

#[test]
fn logsumexp_matches_pytorch_and_does_not_overflow() {
    case("logsumexp1", 1, |x| x[0].try_logsumexp(1));
    case("logsumexp_keepdim", 1, |x| x[0].try_logsumexp_keepdim(-1));
    let pool = test_pool(4);
    pool.scope(|s| {
        let x = s.from_slice::<f32>(
            &[3, 2],
            &[
                1000.0,
                1000.0,
                f32::NEG_INFINITY,
                f32::NEG_INFINITY,
                0.0,
                f32::INFINITY,
            ],
        );
        let y = x.logsumexp(1).to_vec();
        assert_eq!(y, [1000.0 + 2f32.ln(), f32::NEG_INFINITY, f32::INFINITY]);
        // An empty axis sums nothing: ln 0.
        let empty = s.zeros::<f32>(&[2, 0]).logsumexp(1);
        assert_eq!(empty.to_vec(), [f32::NEG_INFINITY; 2]);
    });
}

#[test]
fn var_and_std_match_pytorch_with_every_correction() {
    case("var1", 1, |x| x[0].try_var(1, 1));
    case("var0_keepdim", 1, |x| x[0].try_var_keepdim(0, 0));
    case("std1", 1, |x| x[0].try_std(-1, 1));
    case("std2_keepdim", 1, |x| x[0].try_std_keepdim(0, 2));
    let pool = test_pool(4);
    pool.scope(|s| {
        // One element with the unbiased correction: 0/0, as PyTorch.
        assert!(s
            .ones::<f32>(&[2, 1])
            .var(1, 1)
            .to_vec()
            .iter()
            .all(|v| v.is_nan()));
        assert_eq!(s.ones::<f32>(&[2, 1]).var(1, 0).to_vec(), [0.0, 0.0]);
        // Equal values, whose mean summed in f32 is not the value: 0 exactly, along either axis.
        for (len, value) in [(1000, 33333.3f32), (9, 410184.03)] {
            let x = s.full::<f32>(&[2, len], value);
            assert_eq!(x.var(1, 1).to_vec(), [0.0, 0.0], "{len} x {value}");
            assert_eq!(x.t().std(0, 0).to_vec(), [0.0, 0.0], "{len} x {value}");
        }
    });
}

#[test]
fn expand_and_repeat_match_pytorch() {
    case("expand", 1, |x| x[0].try_expand(&[2, 3, 2]));
    case("repeat", 1, |x| x[0].try_repeat(&[2, 1, 2]));
    let pool = test_pool(4);
    pool.scope(|s| {
        let ids = s.from_slice::<i64>(&[2], &[4, 5]);
        assert_eq!(ids.repeat(&[2]).to_vec(), [4, 5, 4, 5]);
        assert_eq!(ids.expand(&[2, 2]).to_vec(), [4, 5, 4, 5]);
        assert_eq!(ids.repeat(&[0, 1]).shape(), [0, 2]);
    });
}

#[test]
fn pad_matches_pytorch_in_both_modes() {
    case("pad_constant", 1, |x| x[0].try_pad(&[1, 2, 0, 1], 0.5));
    case("pad_reflect", 1, |x| x[0].try_pad_reflect(&[2, 1, 1, 2]));
    let pool = test_pool(4);
    pool.scope(|s| {
        let x = s.from_slice::<i32>(&[3], &[1, 2, 3]);
        assert_eq!(x.pad_reflect(&[2, 1]).to_vec(), [3, 2, 1, 2, 3, 2]);
        assert_eq!(x.pad(&[0, 2], -1).to_vec(), [1, 2, 3, -1, -1]);
        assert_eq!(x.pad(&[0, 0], 9).to_vec(), [1, 2, 3]);
    });
}

#[test]
fn one_hot_matches_pytorch() {
    let file = fixture();
    let pool = test_pool(4);
    let ids = load::<i64>(&file, &pool, "one_hot.ids");
    let want = load::<i64>(&file, &pool, "one_hot.out");
    pool.scope(|s| {
        let got = s.bind(&ids).one_hot(5);
        assert_eq!(got.shape(), want.shape());
        assert_eq!(got.as_slice().unwrap(), want.as_slice());
    });
}

/// Integer arithmetic and comparisons of one type against the fixture's `$name.*`.
macro_rules! integer_case {
    ($t:ty, $name:literal) => {{
        let file = fixture();
        let pool = test_pool(4);
        let (a, b) = (
            load::<$t>(&file, &pool, concat!($name, ".a")),
            load::<$t>(&file, &pool, concat!($name, ".b")),
        );
        let want = |op: &str| load::<$t>(&file, &pool, &format!("{}.{op}", $name)).to_vec();
        pool.scope(|s| {
            let (a, b) = (s.bind(&a), s.bind(&b));
            assert_eq!((&a + &b).to_vec(), want("add"), "add");
            assert_eq!((&a - &b).to_vec(), want("sub"), "sub");
            assert_eq!((&a * &b).to_vec(), want("mul"), "mul");
            assert_eq!(a.div_floor(&b).to_vec(), want("div_floor"), "div_floor");
            let mask =
                |m: Tensor<'_, u8>| m.to_vec().into_iter().map(<$t>::from).collect::<Vec<_>>();
            assert_eq!(mask(a.cmp(&b, Cmp::Lt)), want("lt"), "lt");
            assert_eq!(mask(a.cmp(&b, Cmp::Eq)), want("eq"), "eq");
            // Scalars, and every mix of owned and borrowed operands.
            let c = a.clone();
            assert_eq!((c + 1).to_vec(), (&a + &s.ones::<$t>(&[1])).to_vec());
            assert_eq!(
                (&a * 3).to_vec(),
                (a.clone() * s.full::<$t>(&[3], 3)).to_vec()
            );
            assert_eq!((&a - 2).to_vec(), (&a - s.full::<$t>(&[1], 2)).to_vec());
            assert_eq!(
                s.from_slice::<$t>(&[2], &[7, -7])
                    .div_floor_scalar(-2)
                    .to_vec(),
                [-4, 3]
            );
        });
    }};
}

#[test]
fn integer_arithmetic_wraps_and_floors_as_pytorch() {
    integer_case!(i64, "int64");
    integer_case!(i32, "int32");
}

/// A forward that uses every differentiable op above, a layer step at a time.
#[derive(Parameters)]
struct AllOps {
    w: Param,
    cos: Param,
    sin: Param,
    #[param(skip)]
    steps: usize,
}

impl AllOps {
    fn new(pool: &Pool) -> Self {
        pool.scope(|s| {
            let (cos, sin) = s.rope_tables::<f32>(0..4, 8, 10_000.0);
            AllOps {
                w: (s.randn::<f32>(&[8, 8], 5) * 0.4).detach(),
                cos: cos.detach(),
                sin: sin.detach(),
                steps: 4,
            }
        })
    }

    /// One step on `[2, 4, 8]`.
    fn layer<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        let h = x
            .matmul(&self.w)
            .rope(&x.bind(&self.cos), &x.bind(&self.sin));
        let h = h.maximum(&(&h).sin()).minimum(&((&h).cos() + 1.0));
        let h = h.pad_reflect(&[1, 1]).pad(&[0, 0, 1, 0], 0.5).cumsum(-1);
        let h = h.narrow(-1, 1, 8).narrow(-2, 1, 4) * 0.3;
        let h = &h - &h.logsumexp_keepdim(-1);
        let h = &h / &(h.std_keepdim(-1, 1) + 1.0) + h.var(-2, 0).unsqueeze(-2);
        let h = h.sigmoid().pow_tensor(&((&x).abs() + 0.5));
        let tiled = h.narrow(-1, 0, 4).repeat(&[1, 1, 2]);
        (&h + &tiled + h.mean_keepdim(-1).expand(&[2, 4, 8])).tanh()
    }

    #[checkpoint]
    fn forward<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let mut x = x;
        for _ in 0..self.steps {
            x = self.layer(x);
        }
        x
    }

    fn plain<'a>(&self, x: Tensor<'a>) -> Tensor<'a> {
        (0..self.steps).fold(x, |x, _| self.layer(x))
    }
}

#[test]
fn a_checkpointed_forward_of_these_ops_replays_them_bit_for_bit() {
    let pool = Pool::with_max_memory_mb(64);
    let model = AllOps::new(&pool);
    let plain = gradients(
        &pool,
        &[2, 4, 8],
        |x| model.plain(x),
        |f| model.visit_params(&ParamPath::ROOT, &mut |_, p| f(p)),
    );
    assert!(plain.1.iter().flatten().all(|g| g.is_finite()));
    assert!(
        plain.1.iter().all(|g| g.iter().any(|&v| v != 0.0)),
        "every parameter gets a gradient"
    );
    for policy in [Policy::Every(1), Policy::Every(2), Policy::Sqrt] {
        let mut ckpt = Checkpointer::new(CheckpointConfig::new(policy.clone()));
        let got = gradients(
            &pool,
            &[2, 4, 8],
            |x| model.forward(&mut ckpt, x),
            |f| model.visit_params(&ParamPath::ROOT, &mut |_, p| f(p)),
        );
        assert!(got == plain, "{policy:?}");
        assert!(
            ckpt.last_backward().unwrap().replayed_steps > 0,
            "{policy:?}"
        );
    }
}

#[test]
fn rope_tables_per_sequence_rotate_each_at_its_own_positions() {
    let pool = test_pool(4);
    pool.scope(|s| {
        // Two sequences of 2 heads, 3 new positions each: one from 0, one from 5.
        let x = s.randn::<f32>(&[2, 2, 3, 8], 1);
        let (cos, sin) = s.rope_tables::<f32>((0..3).chain(5..8), 8, 10_000.0);
        let both = x.rope(&cos.reshape(&[2, 1, 3, 8]), &sin.reshape(&[2, 1, 3, 8]));
        for (row, start) in [(0, 0), (1, 5)] {
            let (cos, sin) = s.rope_tables::<f32>(start..start + 3, 8, 10_000.0);
            let want = x.narrow(0, row, 1).rope(&cos, &sin);
            assert_eq!(both.narrow(0, row, 1).to_vec(), want.to_vec());
        }
    });
}

#[test]
fn errors_name_the_op_and_the_values_at_fault() {
    let pool = test_pool(4);
    pool.scope(|s| {
        let x = s.zeros::<f32>(&[2, 3, 4]);
        let table = s.zeros::<f32>(&[3, 4]);
        let err = |r: Result<Tensor<'_, f32>>| r.unwrap_err();

        let rank1 = s.zeros::<f32>(&[4]);
        assert_eq!(
            err(rank1.try_rope(&table, &table)).to_string(),
            "rope: invalid shape [4]: needs at least two axes, [.., positions, dim]"
        );
        assert_eq!(
            err(s.zeros::<f32>(&[3, 5]).try_rope(&table, &table)).to_string(),
            "rope: invalid shape [3, 5]: the last axis (5) must have an even length to be halved"
        );
        let wrong = s.zeros::<f32>(&[4, 4]);
        assert_eq!(
            err(x.try_rope(&table, &wrong)),
            shape_mismatch(
                "rope",
                &[2, 3, 4],
                &[4, 4],
                "the cos and sin tables must be [3, 4], or [.., 3, 4] with leading axes that \
                 broadcast to the tensor's (a table per sequence)"
            )
        );
        let other_batch = s.zeros::<f32>(&[3, 3, 4]);
        assert!(matches!(
            err(x.try_rope(&other_batch, &other_batch)),
            Error::ShapeMismatch { .. }
        ));
        assert_eq!(
            s.try_rope_tables::<f32>(0..3, 5, 10_000.0)
                .unwrap_err()
                .to_string(),
            "rope_tables: invalid dim: 5 is not a positive even number"
        );
        assert_eq!(
            s.try_rope_tables::<f32>(0..3, 4, 0.0)
                .unwrap_err()
                .to_string(),
            "rope_tables: invalid base: 0 is not a finite positive number"
        );

        let e = err(x.try_maximum(&s.zeros::<f32>(&[3])));
        assert!(
            e.to_string()
                .starts_with("maximum: incompatible shapes [2, 3, 4] and [3]"),
            "{e}"
        );
        let e = err(x.try_pow_tensor(&s.zeros::<f32>(&[2])));
        assert!(e.to_string().starts_with("pow: incompatible shapes"), "{e}");

        assert_eq!(err(x.try_cumsum(3)), axis_out_of_range("cumsum", 3, 3));
        assert_eq!(
            err(x.try_logsumexp(-4)),
            axis_out_of_range("logsumexp", -4, 3)
        );
        assert_eq!(err(x.try_var(5, 1)), axis_out_of_range("var", 5, 3));
        assert_eq!(err(x.try_std_keepdim(3, 1)), axis_out_of_range("std", 3, 3));

        assert_eq!(
            err(x.try_expand(&[2, 5, 4])),
            shape_mismatch(
                "expand",
                &[2, 3, 4],
                &[2, 5, 4],
                "axis 1 of the result has length 5, which the input's 3 cannot broadcast to"
            )
        );
        assert_eq!(
            err(x.try_expand(&[3, 4])),
            shape_mismatch(
                "expand",
                &[2, 3, 4],
                &[3, 4],
                "the shape has fewer axes than the tensor"
            )
        );
        assert_eq!(
            err(x.try_repeat(&[2, 2])).to_string(),
            "repeat: invalid reps: 2 repetitions for a tensor of rank 3: one per axis at least"
        );
        assert_eq!(
            err(x.try_repeat(&[1, 1, usize::MAX])),
            Error::DimensionOverflow {
                op: "repeat",
                operand: "repetitions",
                value: usize::MAX,
                shape: Shape(vec![2, 3, 4]),
            }
        );

        assert_eq!(
            err(x.try_pad(&[1, 1, 1], 0.0)).to_string(),
            "pad: invalid pads: 3 values for a tensor of rank 3: a (before, after) pair per axis, \
             from the last, at most one per axis"
        );
        assert_eq!(
            err(x.try_pad_reflect(&[0; 8])).to_string(),
            "pad_reflect: invalid pads: 8 values for a tensor of rank 3: a (before, after) pair \
             per axis, from the last, at most one per axis"
        );
        assert_eq!(
            err(x.try_pad_reflect(&[1, 1, 3, 0])).to_string(),
            "pad_reflect: invalid pads: 3 before and 0 after axis 1 of length 3: a reflection pads \
             less than the length"
        );
        let e = Error::InvalidArgument {
            op: "pad_reflect",
            arg: "pads",
            reason:
                "4 before and 0 after axis 2 of length 4: a reflection pads less than the length"
                    .into(),
        };
        assert_panics_with(&e, || drop(x.pad_reflect(&[4, 0])));

        let ids = s.from_slice::<i64>(&[2, 2], &[0, 4, 5, 1]);
        let e = ids.try_one_hot(5).unwrap_err();
        assert_eq!(
            e.to_string(),
            "one_hot: index 5 is out of range for axis 2 of length 5"
        );
        assert_eq!(
            s.from_slice::<i64>(&[1], &[-1])
                .try_one_hot(3)
                .unwrap_err()
                .to_string(),
            "one_hot: index -1 is out of range for axis 1 of length 3"
        );

        let (a, zero) = (
            s.from_slice::<i64>(&[2], &[4, 5]),
            s.from_slice::<i64>(&[2], &[1, 0]),
        );
        let e = a.try_div_floor(&zero).unwrap_err();
        assert_eq!(
            e.to_string(),
            "div_floor: invalid divisor: division by zero"
        );
        assert_panics_with(&e, || drop(a.div_floor_scalar(0)));
        let e = a.try_add(&s.zeros::<i64>(&[3])).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("add: incompatible shapes [2] and [3]"),
            "{e}"
        );
        assert_panics_with(&e, || drop(&a + &s.zeros::<i64>(&[3])));
    });
}
