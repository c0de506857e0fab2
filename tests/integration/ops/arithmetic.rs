//! Binary elementwise arithmetic (`+ - * /` in every owned and borrowed mix, scalars on either
//! side, negation, `zip_map`) with NumPy broadcasting, against ndarray's own operators; and operands
//! that do not broadcast, as errors and as the operators' panics.

use ndarray::{concatenate, ArrayD, Axis, IxDyn, Zip};
use tensorscope::{Tensor, TensorOps};

use super::{assert_close, assert_close_tol, assert_panics_with, shape_mismatch};
use crate::common::test_pool;

/// Checks `a $op b` for every mix of owned (unique and shared) and borrowed operands, and the
/// `try_` method, against ndarray's own broadcasting operator on the same inputs.
macro_rules! check_operator_mixes {
    ($s:expr, $op:tt, $try_method:ident, $a_shape:expr, $b_shape:expr) => {{
        let s = $s;
        let a_shape: &[usize] = &$a_shape;
        let b_shape: &[usize] = &$b_shape;
        // `b` stays away from zero so division is well conditioned.
        let fresh = || {
            (
                s.randn::<f32>(a_shape, 11),
                s.uniform::<f32>(b_shape, 0.5, 2.0, 12),
            )
        };
        let what = format!("{:?} {} {:?}", a_shape, stringify!($op), b_shape);
        let (a, b) = fresh();
        let want = &a.to_array() $op &b.to_array();

        assert_close(&format!("&a {what} &b"), &(&a $op &b), &want);
        let try_what = format!("a.{}(&b) {what}", stringify!($try_method));
        assert_close(&try_what, &a.$try_method(&b).unwrap(), &want);
        // Owned but shared: the op must not write over the other handle.
        assert_close(&format!("shared a {what} shared b"), &(a.clone() $op b.clone()), &want);
        assert_close(&format!("shared a {what} &b"), &(a.clone() $op &b), &want);
        assert_close(&format!("&a {what} shared b"), &(&a $op b.clone()), &want);
        // Owned and unique: may be written in place.
        let (a2, b2) = fresh();
        assert_close(&format!("a {what} b"), &(a2 $op b2), &want);
        let (a2, b2) = fresh();
        assert_close(&format!("a {what} &b"), &(a2 $op &b2), &want);
        let (a2, b2) = fresh();
        assert_close(&format!("&a {what} b"), &(&a2 $op b2), &want);
        // The inputs the shared forms used are intact.
        assert_eq!(a.to_array(), fresh().0.to_array(), "{what}: lhs changed");
        assert_eq!(b.to_array(), fresh().1.to_array(), "{what}: rhs changed");
    }};
}

macro_rules! check_all_operators {
    ($s:expr, $a_shape:expr, $b_shape:expr) => {{
        check_operator_mixes!($s, +, try_add, $a_shape, $b_shape);
        check_operator_mixes!($s, -, try_sub, $a_shape, $b_shape);
        check_operator_mixes!($s, *, try_mul, $a_shape, $b_shape);
        check_operator_mixes!($s, /, try_div, $a_shape, $b_shape);
    }};
}

#[test]
fn arithmetic_same_shape_matches_ndarray_for_every_operand_mix() {
    let pool = test_pool(16);
    pool.scope(|s| check_all_operators!(s, [2, 3], [2, 3]));
}

#[test]
fn arithmetic_broadcasts_a_row_vector_over_a_matrix_either_side() {
    let pool = test_pool(16);
    pool.scope(|s| {
        check_all_operators!(s, [2, 3], [3]);
        check_all_operators!(s, [3], [2, 3]);
    });
}

#[test]
fn arithmetic_broadcasts_both_operands_4x1x3_with_5x1() {
    let pool = test_pool(16);
    pool.scope(|s| {
        check_all_operators!(s, [4, 1, 3], [5, 1]);
        check_all_operators!(s, [5, 1], [4, 1, 3]);
    });
}

#[test]
fn arithmetic_broadcasts_a_one_element_tensor_like_a_scalar() {
    let pool = test_pool(16);
    pool.scope(|s| {
        check_all_operators!(s, [2, 3], [1]);
        check_all_operators!(s, [1], [2, 3]);
        check_all_operators!(s, [1], [1]);
    });
}

#[test]
fn rank_0_and_empty_tensors_broadcast_like_ndarray() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let scalar = s.from_slice::<f32>(&[], &[2.5]);
        let row = s.randn::<f32>(&[3], 100);
        let (sa, ra) = (scalar.to_array(), row.to_array());
        assert_close("rank-0 + [3]", &(&scalar + &row), &(&sa + &ra));
        assert_close("[3] * rank-0", &(&row * &scalar), &(&ra * &sa));
        assert_close("rank-0 - rank-0", &(&scalar - &scalar), &(&sa - &sa));

        let empty = s.from_slice::<f32>(&[0, 3], &[]);
        let ea = empty.to_array();
        assert_close("[0, 3] + [3]", &(&empty + &row), &(&ea + &ra));
        assert_close("[0, 3] relu", &(&empty).relu(), &ea);
        assert_close("[0, 3] transpose", &empty.t(), &ea.t().to_owned());
        assert_close("[0, 3] sum 0", &empty.sum(0), &ea.sum_axis(Axis(0)));
        assert_close("[0, 3] sum 1", &empty.sum(1), &ea.sum_axis(Axis(1)));
        let mean0 = empty.mean(0);
        assert_eq!(mean0.shape(), &[3]);
        assert!(
            mean0.as_slice().unwrap().iter().all(|v| v.is_nan()),
            "0/0: {mean0:?}"
        );

        let two = s.randn::<f32>(&[2, 3], 101);
        let ta = two.to_array();
        let want = concatenate(Axis(0), &[ea.view(), ta.view(), ea.view()]).unwrap();
        assert_close(
            "concat with empty pieces",
            &Tensor::concat(&[&empty, &two, &empty], 0),
            &want,
        );
    });
}

#[test]
fn scalar_on_the_right_matches_ndarray() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.randn::<f32>(&[2, 3], 3);
        let xa = x.to_array();
        assert_close("&x * 2", &(&x * 2.0), &(&xa * 2.0));
        assert_close("&x + 1", &(&x + 1.0), &(&xa + 1.0));
        assert_close("&x - 0.5", &(&x - 0.5), &(&xa - 0.5));
        assert_close("&x / 4", &(&x / 4.0), &(&xa / 4.0));
        assert_close("x + 1", &(x.clone() + 1.0), &(&xa + 1.0));
        assert_close("x - 3", &(x.clone() - 3.0), &(&xa - 3.0));
        assert_close("x * -1.5", &(x.clone() * -1.5), &(&xa * -1.5));
        assert_close("x / 0.25", &(x.clone() / 0.25), &(&xa / 0.25));
        assert_eq!(
            x.to_array(),
            xa,
            "the borrowed and shared forms leave x as it was"
        );
        let y = s.randn::<f32>(&[2, 3], 3);
        assert_close("unique y + 1", &(y + 1.0), &(&xa + 1.0));
    });
}

#[test]
fn f32_and_f64_scalars_on_the_left_match_ndarray() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.uniform::<f32>(&[2, 3], 0.5, 2.0, 4);
        let xa = x.to_array();
        assert_close("2 * &x", &(2.0f32 * &x), &xa.mapv(|v| 2.0 * v));
        assert_close("2 + &x", &(2.0f32 + &x), &xa.mapv(|v| 2.0 + v));
        assert_close("2 - &x", &(2.0f32 - &x), &xa.mapv(|v| 2.0 - v));
        assert_close("2 / &x", &(2.0f32 / &x), &xa.mapv(|v| 2.0 / v));
        assert_close("1 - x", &(1.0f32 - x.clone()), &xa.mapv(|v| 1.0 - v));
        assert_close("1 / x", &(1.0f32 / x.clone()), &xa.mapv(|v| 1.0 / v));
        assert_eq!(x.to_array(), xa);

        let y = s.uniform::<f64>(&[3, 2], 0.5, 2.0, 5);
        let ya = y.to_array();
        let tight = |what: &str, got: &Tensor<'_, f64>, want: &ArrayD<f64>| {
            assert_close_tol(what, got, want, 1e-14, 0.0)
        };
        tight("3 * &y (f64)", &(3.0f64 * &y), &ya.mapv(|v| 3.0 * v));
        tight("3 - &y (f64)", &(3.0f64 - &y), &ya.mapv(|v| 3.0 - v));
        tight("3 / &y (f64)", &(3.0f64 / &y), &ya.mapv(|v| 3.0 / v));
        tight("3 + y (f64)", &(3.0f64 + y.clone()), &ya.mapv(|v| 3.0 + v));
        tight("1 - y (f64)", &(1.0f64 - y), &ya.mapv(|v| 1.0 - v));
    });
}

#[test]
fn negation_by_value_and_by_reference_matches_ndarray() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.randn::<f32>(&[3, 4], 6);
        let xa = x.to_array();
        assert_close("-&x", &(-&x), &xa.mapv(|v| -v));
        assert_close("-x (shared)", &(-x.clone()), &xa.mapv(|v| -v));
        assert_close("-x (unique)", &(-x), &xa.mapv(|v| -v));
    });
}

#[test]
fn zip_map_broadcasts_both_operands() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let a = s.randn::<f32>(&[4, 1, 3], 57);
        let b = s.randn::<f32>(&[5, 1], 58);
        let f = |x: f32, y: f32| x.max(y) * 2.0 - y;
        let (aa, ba) = (a.to_array(), b.to_array());
        let shape = IxDyn(&[4, 5, 3]);
        let want = Zip::from(&aa.broadcast(shape.clone()).unwrap())
            .and(&ba.broadcast(shape).unwrap())
            .map_collect(|&x, &y| f(x, y));
        assert_close("zip_map", &a.zip_map(&b, f), &want);
        assert_close("try_zip_map", &a.try_zip_map(&b, f).unwrap(), &want);
        // Argument order is kept when the smaller operand is on the left.
        let rev = b.zip_map(&a, f);
        let want = Zip::from(&ba.broadcast(IxDyn(&[4, 5, 3])).unwrap())
            .and(&aa.broadcast(IxDyn(&[4, 5, 3])).unwrap())
            .map_collect(|&x, &y| f(x, y));
        assert_close("zip_map reversed", &rev, &want);
    });
}

/// A `try_` binary op with its result dropped.
type TryBinary = fn(&Tensor<'_, f32>, &Tensor<'_, f32>) -> tensorscope::Result<()>;

#[test]
fn elementwise_broadcast_failure_names_the_op_and_both_shapes() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let a = s.zeros::<f32>(&[2, 3]);
        let b = s.zeros::<f32>(&[2]);
        let reason = "cannot broadcast: axis 1 of the result has lengths 3 and 2, neither is 1";
        let cases: [(&'static str, TryBinary); 5] = [
            ("add", |a, b| a.try_add(b).map(drop)),
            ("sub", |a, b| a.try_sub(b).map(drop)),
            ("mul", |a, b| a.try_mul(b).map(drop)),
            ("div", |a, b| a.try_div(b).map(drop)),
            ("zip_map", |a, b| a.try_zip_map(b, |x, y| x + y).map(drop)),
        ];
        for (op, f) in cases {
            let err = f(&a, &b).unwrap_err();
            assert_eq!(err, shape_mismatch(op, &[2, 3], &[2], reason));
            assert_eq!(
                err.to_string(),
                format!("{op}: incompatible shapes [2, 3] and [2]: {reason}")
            );
        }
        // The operators panic with the same message, in every operand mix.
        let add = shape_mismatch("add", &[2, 3], &[2], reason);
        assert_panics_with(&add, || drop(&a + &b));
        assert_panics_with(&add, || drop(a.clone() + b.clone()));
        assert_panics_with(&add, || drop(a.clone() + &b));
        assert_panics_with(&add, || drop(&a + b.clone()));
        let sub = shape_mismatch("sub", &[2, 3], &[2], reason);
        assert_panics_with(&sub, || drop(&a - &b));
        let mul = shape_mismatch("mul", &[2, 3], &[2], reason);
        assert_panics_with(&mul, || drop(&a * &b));
        let div = shape_mismatch("div", &[2, 3], &[2], reason);
        assert_panics_with(&div, || drop(a.clone() / b.clone()));
        let zip = shape_mismatch("zip_map", &[2, 3], &[2], reason);
        assert_panics_with(&zip, || drop(a.zip_map(&b, |x, _| x)));

        // Reversed operands keep their order in the message.
        let err = b.try_add(&a).unwrap_err();
        assert_eq!(
            err,
            shape_mismatch(
                "add",
                &[2],
                &[2, 3],
                "cannot broadcast: axis 1 of the result has lengths 2 and 3, neither is 1"
            )
        );
    });
}
