//! Shape ops, which move elements and do no arithmetic: concat, stack, reshape, narrow, split,
//! chunk, permute, transpose, `t`, squeeze, unsqueeze and flatten, against ndarray or by position;
//! and shapes that do not fit, with the op and shapes named.

use ndarray::{concatenate, Axis, IxDyn};
use tensorscope::prelude::*;
use tensorscope::{Error, Shape};

use super::{assert_close, assert_panics_with, axis_out_of_range, iota, shape_mismatch};
use crate::common::{assert_fully_written, panic_message, test_pool};

#[test]
fn concat_of_three_tensors_along_axes_0_and_1_matches_ndarray_concatenate() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let (a, b, c) = (
            s.randn::<f32>(&[1, 3], 51),
            s.randn::<f32>(&[2, 3], 52),
            s.randn::<f32>(&[3, 3], 53),
        );
        let (aa, ba, ca) = (a.to_array(), b.to_array(), c.to_array());
        let want = concatenate(Axis(0), &[aa.view(), ba.view(), ca.view()]).unwrap();
        assert_close("concat axis 0", &Tensor::concat(&[&a, &b, &c], 0), &want);

        let (a, b, c) = (
            s.randn::<f32>(&[2, 1, 2], 54),
            s.randn::<f32>(&[2, 2, 2], 55),
            s.randn::<f32>(&[2, 4, 2], 56),
        );
        let (aa, ba, ca) = (a.to_array(), b.to_array(), c.to_array());
        let want = concatenate(Axis(1), &[aa.view(), ba.view(), ca.view()]).unwrap();
        assert_close(
            "concat axis 1",
            &Tensor::try_concat(&[&a, &b, &c], 1).unwrap(),
            &want,
        );
    });
}

#[test]
fn concat_with_mismatched_shapes_names_both_shapes() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let a = s.zeros::<f32>(&[2, 3]);
        let b = s.zeros::<f32>(&[4, 3]);
        let c = s.zeros::<f32>(&[2, 4]);
        let err = Tensor::try_concat(&[&a, &b, &c], 0).unwrap_err();
        assert_eq!(
            err,
            shape_mismatch(
                "concat",
                &[2, 3],
                &[2, 4],
                "axis 1 differs (3 and 4); only the joined axis 0 may"
            )
        );
        assert_eq!(
            err.to_string(),
            "concat: incompatible shapes [2, 3] and [2, 4]: axis 1 differs (3 and 4); only the joined axis 0 may"
        );
        assert_panics_with(&err, || drop(Tensor::concat(&[&a, &b, &c], 0)));

        // Different ranks never fit.
        let v = s.zeros::<f32>(&[3]);
        let err = Tensor::try_concat(&[&a, &v], 0).unwrap_err();
        assert_eq!(
            err,
            shape_mismatch("concat", &[2, 3], &[3], "ranks differ (2 and 1)")
        );
    });
}

#[test]
fn concat_of_an_empty_list_is_a_no_inputs_error() {
    let pool = test_pool(16);
    pool.scope(|_s| {
        let err = Tensor::<f32>::try_concat(&[], 0).unwrap_err();
        assert_eq!(err, Error::NoInputs { op: "concat" });
        assert_eq!(
            err.to_string(),
            "concat: needs at least one tensor, got an empty list"
        );
        assert_panics_with(&err, || drop(Tensor::<f32>::concat(&[], 0)));
    });
}

#[test]
fn concat_along_a_bad_axis_reports_axis_out_of_range() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.zeros::<f32>(&[2, 3, 4]);
        let err = Tensor::try_concat(&[&x, &x], 3).unwrap_err();
        assert_eq!(err, axis_out_of_range("concat", 3, 3));
        assert_panics_with(&err, || drop(Tensor::concat(&[&x, &x], 3)));
    });
}

#[test]
fn reshape_keeps_row_major_order_and_shares_the_buffer() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.randn::<f32>(&[2, 3, 4], 59);
        let xa = x.to_array();
        let r = x.reshape(&[6, 4]);
        let want = xa.to_shape((6, 4)).unwrap().to_owned();
        assert_close("reshape [6, 4]", &r, &want);
        assert!(r.shares_buffer_with(&x));
        let flat = r.try_reshape(&[24]).unwrap();
        assert_eq!(flat.to_vec(), xa.iter().copied().collect::<Vec<_>>());
        assert_close(
            "reshape [4, 1, 6]",
            &x.reshape(&[4, 1, 6]),
            &xa.to_shape((4, 1, 6)).unwrap().to_owned(),
        );
    });
}

#[test]
fn reshape_to_a_different_element_count_names_both_shapes() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let x = s.zeros::<f32>(&[2, 3]);
        let err = x.try_reshape(&[4, 2]).unwrap_err();
        assert_eq!(
            err,
            shape_mismatch(
                "reshape",
                &[2, 3],
                &[4, 2],
                "6 elements cannot be viewed as 8"
            )
        );
        assert_panics_with(&err, || drop(x.reshape(&[4, 2])));
    });
}

#[test]
fn transpose_swaps_the_last_two_axes_in_2d_and_3d() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let a = s.randn::<f32>(&[3, 4], 28);
        let want = a.to_array().t().to_owned();
        assert_close("2-D transpose", &a.t(), &want);
        assert_close("2-D try_transpose", &a.try_t().unwrap(), &want);

        let b = s.randn::<f32>(&[2, 3, 4], 29);
        let want = b.to_array().permuted_axes(IxDyn(&[0, 2, 1]));
        assert_close("3-D transpose", &b.t(), &want);
        assert_close("transpose twice", &b.t().t(), &b.to_array());
    });
}

#[test]
fn t_of_a_1d_tensor_is_an_invalid_shape() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let v = s.zeros::<f32>(&[5]);
        let err = v.try_t().unwrap_err();
        assert_eq!(
            err,
            Error::InvalidShape {
                op: "t",
                shape: Shape(vec![5]),
                reason: "needs at least two axes".into(),
            }
        );
        assert_eq!(
            err.to_string(),
            "t: invalid shape [5]: needs at least two axes"
        );
        assert_panics_with(&err, || drop(v.t()));
    });
}

#[test]
fn permute_and_transpose_move_every_element() {
    test_pool(16).scope(|s| {
        let x = iota(s, &[2, 3, 4]);
        let p = x.permute(&[2, 0, 1]);
        assert_fully_written("permute", &p);
        assert_eq!(p.shape(), &[4, 2, 3]);
        let (xv, pv) = (x.view(), p.view());
        for i in 0..2 {
            for j in 0..3 {
                for k in 0..4 {
                    assert_eq!(pv[[k, i, j]], xv[[i, j, k]]);
                }
            }
        }
        let t = x.transpose(0, -1);
        assert_eq!(t.shape(), &[4, 3, 2]);
        assert_eq!(t.view()[[3, 1, 0]], xv[[0, 1, 3]]);
        assert_eq!(x.t().shape(), &[2, 4, 3]);
        assert_eq!(x.t().t().to_vec(), x.to_vec());
        // Heads: [b, t, h, d] -> [b, h, t, d] and back.
        let heads = iota(s, &[2, 5, 3, 4]);
        assert_eq!(
            heads.transpose(1, 2).transpose(1, 2).to_vec(),
            heads.to_vec()
        );
    });
}

#[test]
fn slicing_splitting_stacking() {
    test_pool(16).scope(|s| {
        let x = iota(s, &[2, 3, 4]);
        let mid = x.narrow(-1, 1, 2);
        assert_fully_written("narrow", &mid);
        assert_eq!(mid.shape(), &[2, 3, 2]);
        assert_eq!(mid.to_vec()[..4], [1.0, 2.0, 5.0, 6.0]);

        let parts = x.split(2, 1);
        assert_eq!(
            parts.iter().map(|p| p.shape()[1]).collect::<Vec<_>>(),
            vec![2, 1]
        );
        assert_eq!(
            parts[1].to_vec(),
            [8.0, 9.0, 10.0, 11.0, 20.0, 21.0, 22.0, 23.0]
        );
        let [_, _, v] = x.chunk::<3>(1);
        assert_eq!(v.to_vec(), parts[1].to_vec());
        // An axis too short for as many pieces gives empty ones at the end (where PyTorch gives
        // fewer); an empty axis gives empty chunks, and one empty split.
        let short = iota(s, &[2]).chunk::<3>(0).map(|p| p.to_vec());
        assert_eq!(short, [vec![0.0], vec![1.0], vec![]]);
        let five = iota(s, &[5]).chunk::<3>(0).map(|p| p.to_vec());
        assert_eq!(five, [vec![0.0, 1.0], vec![2.0, 3.0], vec![4.0]]);
        let empty = s.zeros::<f32>(&[0, 2]);
        let pieces = empty.chunk::<3>(0);
        assert_eq!(
            pieces
                .iter()
                .map(|p| p.shape().to_vec())
                .collect::<Vec<_>>(),
            vec![vec![0, 2]; 3]
        );
        assert_eq!(empty.split(2, 0).len(), 1);

        let a = iota(s, &[2, 2]);
        let b = &a + 10.0;
        let st = Tensor::stack(&[&a, &b], 1);
        assert_eq!(st.shape(), &[2, 2, 2]);
        assert_eq!(st.to_vec(), [0.0, 1.0, 10.0, 11.0, 2.0, 3.0, 12.0, 13.0]);
        assert_eq!(Tensor::stack(&[&a, &b], -1).shape(), &[2, 2, 2]);
        assert_eq!(Tensor::stack(&[&a], 0).shape(), &[1, 2, 2]);

        assert_eq!(x.unsqueeze(0).shape(), &[1, 2, 3, 4]);
        assert_eq!(x.unsqueeze(-1).shape(), &[2, 3, 4, 1]);
        assert_eq!(x.unsqueeze(-1).squeeze(3).to_vec(), x.to_vec());
        assert!(
            x.unsqueeze(1).shares_buffer_with(&x),
            "unsqueeze is an alias"
        );
        assert_eq!(x.flatten().shape(), &[24]);
    });
}

#[test]
fn shape_op_errors_name_the_op_and_shapes() {
    test_pool(16).scope(|s| {
        let x = iota(s, &[2, 3]);
        assert_eq!(
            x.try_narrow(1, 2, 2).unwrap_err().to_string(),
            "narrow: invalid shape [2, 3]: positions 2..4 of axis 1 pass its length 3"
        );
        assert_eq!(
            x.try_permute(&[0, 0]).unwrap_err().to_string(),
            "permute: invalid shape [2, 3]: axes [0, 0] are not a permutation of the 2 axes"
        );
        assert_eq!(
            x.try_squeeze(0).unwrap_err().to_string(),
            "squeeze: invalid shape [2, 3]: axis 0 has length 2, not 1"
        );
        assert_eq!(
            x.try_split(0, 0).unwrap_err().to_string(),
            "split: invalid shape [2, 3]: pieces of size 0"
        );
        let y = iota(s, &[3, 2]);
        assert_eq!(
            Tensor::try_stack(&[&x, &y], 0).unwrap_err(),
            Error::ShapeMismatch {
                op: "stack",
                lhs: Shape(vec![2, 3]),
                rhs: Shape(vec![3, 2]),
                reason: "stacked tensors must have the same shape".into(),
            }
        );
        assert_eq!(
            panic_message(|| drop(x.transpose(0, 2))),
            "transpose: axis 2 is out of range for a tensor of rank 2"
        );
    });
}
