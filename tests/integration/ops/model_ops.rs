//! The ops real models need (slicing, permuting, indexing by ids, masks, reductions with positions,
//! pooling, the extra elementwise functions, broadcasting matmul): values against hand-computed or
//! naive references, on a poisoned pool in debug builds (so an output left partly unwritten shows
//! the sentinel), and each op's errors with their messages. Gradients are checked in
//! `tests/autograd.rs`.

use tensorscope::ops::Cmp;
use tensorscope::prelude::*;
use tensorscope::{Error, Shape};

use crate::common::{assert_fully_written, panic_message, test_pool};

/// `0, 1, 2, ...` as f32 in `shape`.
fn iota<'s>(s: &Scope<'s, '_>, shape: &[usize]) -> Tensor<'s, f32> {
    let n: usize = shape.iter().product();
    s.arange(0.0f32, n as f32, 1.0).reshape(shape)
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
        let qkv = x.chunk(3, 1);
        assert_eq!(qkv.len(), 3);
        assert_eq!(qkv[2].to_vec(), parts[1].to_vec());
        // Fewer chunks than asked when the axis is short, as in PyTorch; an empty axis gives as
        // many empty chunks as asked, and one empty split.
        assert_eq!(iota(s, &[2]).chunk(3, 0).len(), 2);
        let empty = s.zeros::<f32>(&[0, 2]);
        let pieces = empty.chunk(3, 0);
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
fn integer_tensors_share_the_pool_and_budget() {
    let pool = test_pool(1);
    pool.scope(|s| {
        let ids = s.from_slice::<i64>(&[2, 3], &[5, 0, 2, 2, 1, 4]);
        assert_eq!(ids.len(), 6);
        assert_eq!(s.arange(0i64, 5, 1).to_vec(), vec![0, 1, 2, 3, 4]);
        assert_eq!(s.arange(5i32, 0, -2).to_vec(), vec![5, 3, 1]);
        assert_eq!(s.arange(0i64, 0, 1).len(), 0);
        assert_eq!(s.arange(3u8, 1, 1).len(), 0);
        // Integers count and step exactly, past f64's 2^53 and up to the type's end.
        let big = 1i64 << 53;
        assert_eq!(
            s.arange(big, big + 4, 1).to_vec(),
            vec![big, big + 1, big + 2, big + 3]
        );
        assert_eq!(
            s.arange(i64::MAX - 3, i64::MAX, 1).to_vec(),
            vec![i64::MAX - 3, i64::MAX - 2, i64::MAX - 1]
        );
        assert_eq!(
            s.arange(0.0f32, 1.0, 0.25).to_vec(),
            vec![0.0, 0.25, 0.5, 0.75]
        );
        assert_eq!(ids.narrow(1, 1, 2).to_vec(), vec![0, 2, 1, 4]);
        assert_eq!(ids.t().to_vec(), vec![5, 2, 0, 1, 2, 4]);
        assert_eq!(
            ids.cast::<f32>().to_vec(),
            vec![5.0, 0.0, 2.0, 2.0, 1.0, 4.0]
        );
        assert_eq!(
            s.from_slice::<f32>(&[4], &[-1.7, 2.9, f32::NAN, 1e30])
                .cast::<i32>()
                .to_vec(),
            vec![-1, 2, 0, i32::MAX]
        );
        // An integer rent past the budget fails like a float one.
        let err = s.try_zeros::<i64>(&[1 << 18]).unwrap_err();
        assert!(matches!(err, Error::BudgetExceeded { .. }), "{err}");
        assert!(pool.stats().bytes_in_use > 0);
    });
    assert_eq!(pool.stats().bytes_in_use, 0);
    let err = test_pool(1).scope(|s| s.try_arange(0i64, 3, 0).unwrap_err());
    assert_eq!(
        err.to_string(),
        "arange: invalid step: from 0 to 3 by 0 is not a finite range"
    );
}

#[test]
fn embedding_index_select_and_gather_pick_by_id() {
    test_pool(16).scope(|s| {
        let table = iota(s, &[5, 3]);
        let ids = s.from_slice::<i64>(&[2, 2], &[4, 0, 4, 1]);
        let e = table.embedding(&ids);
        assert_fully_written("embedding", &e);
        assert_eq!(e.shape(), &[2, 2, 3]);
        assert_eq!(
            e.to_vec(),
            [12.0, 13.0, 14.0, 0.0, 1.0, 2.0, 12.0, 13.0, 14.0, 3.0, 4.0, 5.0]
        );
        let cols = table.index_select(1, &s.from_slice::<i64>(&[2], &[2, 2]));
        assert_eq!(cols.shape(), &[5, 2]);
        assert_eq!(cols.to_vec()[..4], [2.0, 2.0, 5.0, 5.0]);

        let labels = s.from_slice::<i64>(&[5, 1], &[0, 2, 1, 1, 0]);
        let picked = table.gather(1, &labels);
        assert_eq!(picked.to_vec(), [0.0, 5.0, 7.0, 10.0, 12.0]);

        let err = table
            .try_embedding(&s.from_slice::<i64>(&[2], &[1, 5]))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "embedding: index 5 is out of range for axis 0 of length 5"
        );
        let err = table
            .try_index_select(0, &s.from_slice::<i64>(&[1], &[9]))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "index_select: index 9 is out of range for axis 0 of length 5"
        );
        let err = table
            .try_gather(1, &s.from_slice::<i64>(&[1, 1], &[-1]))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "gather: index -1 is out of range for axis 1 of length 3"
        );
        let err = table
            .try_gather(0, &s.from_slice::<i64>(&[2], &[0, 1]))
            .unwrap_err();
        assert!(
            err.to_string()
                .starts_with("gather: incompatible shapes [5, 3] and [2]"),
            "{err}"
        );
        let err = table.try_index_select(0, &ids).unwrap_err();
        assert_eq!(
            err.to_string(),
            "index_select: invalid shape [2, 2]: the ids must be 1-D"
        );
        assert_eq!(
            panic_message(|| drop(iota(s, &[3]).embedding(&ids))),
            "embedding: invalid shape [3]: the table must be 2-D ([vocab, dim])"
        );
    });
}

#[test]
fn max_min_and_their_positions() {
    test_pool(16).scope(|s| {
        let x = s.from_slice::<f32>(&[2, 4], &[1.0, 7.0, 7.0, -2.0, f32::NAN, 3.0, -5.0, 0.0]);
        assert_eq!(x.argmax(1).to_vec(), vec![1, 0]); // the first of equal maxima; NaN wins
        assert_eq!(x.argmin(-1).to_vec(), vec![3, 0]);
        assert_eq!(x.argmax(0).to_vec(), vec![1, 0, 0, 1]);
        let m = x.max(1).to_vec();
        assert_eq!(m[0], 7.0);
        assert!(m[1].is_nan());
        assert_eq!(x.min_keepdim(0).shape(), &[1, 4]);
        assert_eq!(x.min_keepdim(0).to_vec()[1..], [3.0, -5.0, -2.0]);
        let ids = s.from_slice::<i64>(&[3], &[4, 9, 2]);
        assert_eq!(ids.argmax(0).item(), 1);
        let err = s.zeros::<f32>(&[3, 0]).try_argmax(1).unwrap_err();
        assert_eq!(
            err.to_string(),
            "argmax: invalid shape [3, 0]: axis 1 is empty: it has no max position"
        );
        assert_eq!(s.zeros::<f32>(&[0, 3]).argmax(1).shape(), &[0]);
        let err = s.zeros::<f32>(&[3, 0]).try_max(-1).unwrap_err();
        assert_eq!(
            err.to_string(),
            "max: invalid shape [3, 0]: axis 1 is empty: it has no max position"
        );
    });
}

#[test]
fn reductions_keep_axes_and_take_negative_axes() {
    test_pool(16).scope(|s| {
        let x = iota(s, &[2, 3]);
        assert_eq!(x.sum(-1).to_vec(), vec![3.0, 12.0]);
        assert_eq!(x.sum_keepdim(-1).shape(), &[2, 1]);
        assert_eq!(x.mean_keepdim(0).to_vec(), vec![1.5, 2.5, 3.5]);
        assert_eq!(x.sum_all().shape(), &[] as &[usize]);
        assert_eq!(x.sum_all().item(), 15.0);
        assert_eq!(x.mean_all().item(), 2.5);
        assert_eq!((&x).softmax(-1).to_vec(), (&x).softmax(1).to_vec());
        assert_eq!(Tensor::concat(&[&x, &x], -2).shape(), &[4, 3]);
        let err = x.try_sum(-3).unwrap_err();
        assert_eq!(
            err.to_string(),
            "sum: axis -3 is out of range for a tensor of rank 2"
        );
        assert_eq!(
            err,
            Error::AxisOutOfRange {
                op: "sum",
                axis: -3,
                ndim: 2
            }
        );
        let err = x.try_unsqueeze(3).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unsqueeze: axis 3 is out of range for a tensor of rank 3"
        );
    });
}

#[test]
fn comparisons_masks_and_triangles() {
    test_pool(16).scope(|s| {
        let x = s.from_slice::<f32>(&[2, 2], &[1.0, 2.0, f32::NAN, 4.0]);
        let row = s.from_slice::<f32>(&[2], &[1.0, 3.0]);
        assert_eq!(x.eq(&row).to_vec(), vec![1, 0, 0, 0]);
        assert_eq!(x.ne(&row).to_vec(), vec![0, 1, 1, 1]);
        assert_eq!(x.lt(&row).to_vec(), vec![0, 1, 0, 0]);
        assert_eq!(x.le(&row).to_vec(), vec![1, 1, 0, 0]);
        assert_eq!(x.gt(&row).to_vec(), vec![0, 0, 0, 1]);
        assert_eq!(x.ge(&row).to_vec(), vec![1, 0, 0, 1]);
        assert_eq!(x.cmp_scalar(Cmp::Ge, 2.0).to_vec(), vec![0, 1, 0, 1]);
        let pos = s.arange(0i64, 3, 1);
        let causal = pos.unsqueeze(1).ge(&pos.unsqueeze(0));
        assert_eq!(causal.to_vec(), vec![1, 0, 0, 1, 1, 0, 1, 1, 1]);
        assert_eq!(s.ones::<u8>(&[3, 3]).tril(0).to_vec(), causal.to_vec());
        assert_eq!(
            s.ones::<u8>(&[2, 3]).triu(1).to_vec(),
            vec![0, 1, 1, 0, 0, 1]
        );
        assert_eq!(
            iota(s, &[2, 2, 2]).tril(-1).to_vec(),
            [0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 6.0, 0.0]
        );

        let a = iota(s, &[2, 3]);
        let b = s.full::<f32>(&[1], -1.0);
        let mask = s.from_slice::<u8>(&[3], &[1, 0, 1]);
        assert_eq!(
            mask.where_cond(&a, &b).to_vec(),
            [0.0, -1.0, 2.0, 3.0, -1.0, 5.0]
        );
        assert_eq!(
            a.masked_fill(&mask, 9.0).to_vec(),
            [9.0, 1.0, 9.0, 9.0, 4.0, 9.0]
        );

        let err = a.try_masked_fill(&s.ones::<u8>(&[3, 3]), 0.0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "masked_fill: incompatible shapes [2, 3] and [3, 3]: cannot broadcast: axis 0 of the \
             result has lengths 2 and 3, neither is 1"
        );
        let err = a
            .try_masked_fill(&s.ones::<u8>(&[2, 2, 3]), 0.0)
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "masked_fill: incompatible shapes [2, 3] and [2, 2, 3]: the mask must broadcast to \
             the tensor's shape"
        );
        let err = a.try_cmp(&s.zeros::<f32>(&[2]), Cmp::Lt).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cmp: incompatible shapes [2, 3] and [2]"),
            "{err}"
        );
        assert_eq!(
            iota(s, &[3]).try_tril(0).unwrap_err().to_string(),
            "tril: invalid shape [3]: needs at least two axes"
        );
    });
}

#[test]
fn elementwise_functions_match_f64() {
    test_pool(16).scope(|s| {
        let v = [-3.0f32, -0.5, 0.0, 0.25, 2.0, 9.0];
        let x = s.from_slice::<f32>(&[6], &v);
        let close = |what: &str, got: Vec<f32>, want: &dyn Fn(f64) -> f64| {
            for (g, &x) in got.iter().zip(&v) {
                let w = want(f64::from(x));
                let ok = f64::from(*g) == w
                    || (w.is_nan() && g.is_nan())
                    || (f64::from(*g) - w).abs() <= 1e-6 * w.abs().max(1.0);
                assert!(ok, "{what}({x}) = {g}, want {w}");
            }
        };
        close("log", (&x).log().to_vec(), &f64::ln);
        close("sqrt", (&x).sqrt().to_vec(), &f64::sqrt);
        close("abs", (&x).abs().to_vec(), &f64::abs);
        close("pow", (&x).pow(3.0).to_vec(), &|x| x.powi(3));
        close("clamp", (&x).clamp(-1.0, 1.0).to_vec(), &|x| {
            x.clamp(-1.0, 1.0)
        });
        // Exact GELU against values from PyTorch's F.gelu (float64).
        let want = [
            -0.004_049_694_094_890_31,
            -0.154_268_769_362_993_44,
            0.0,
            0.149_676_581_420_730_93,
            1.954_499_736_103_641_6,
            9.0,
        ];
        for (g, w) in (&x).gelu_erf().to_vec().iter().zip(want) {
            assert!((f64::from(*g) - w).abs() < 1e-6, "gelu_erf: {g} vs {w}");
        }
        let rms = s
            .from_slice::<f32>(&[2, 2], &[3.0, 4.0, 1.0, 1.0])
            .rms_norm(0.0)
            .to_vec();
        let r = (12.5f32).sqrt();
        assert_eq!(rms, vec![3.0 / r, 4.0 / r, 1.0, 1.0]);
        let nan = s
            .from_slice::<f32>(&[1], &[f32::NAN])
            .clamp(0.0, 1.0)
            .item();
        assert!(nan.is_nan(), "clamp keeps NaN");
        // Every elementwise function has a `try_` form that reports an exhausted budget.
        let tight = Pool::with_max_memory_mb(1);
        tight.scope(|t| {
            let big = t.zeros::<f32>(&[200_000]);
            let err = (&big).try_sqrt().unwrap_err();
            assert!(matches!(err, Error::BudgetExceeded { .. }), "{err}");
            assert!((&big).try_gelu_erf().is_err() && (&big).try_pow(2.0).is_err());
            assert!(big.try_log().is_ok(), "in place: nothing to rent");
        });
        assert_eq!(
            panic_message(|| drop((&x).clamp(1.0, 0.0))),
            "clamp: invalid bounds: min 1 is not at most max 0"
        );
    });
}

#[test]
fn matmul_broadcasts_leading_axes_as_pytorch() {
    test_pool(16).scope(|s| {
        let a = s.randn::<f32>(&[2, 1, 3, 4], 1);
        let b = s.randn::<f32>(&[3, 4, 5], 2);
        let c = a.matmul(&b);
        assert_fully_written("matmul", &c);
        assert_eq!(c.shape(), &[2, 3, 3, 5]);
        // Each output matrix is the 2-D product of the matrices it broadcasts from.
        for i in 0..2 {
            for h in 0..3 {
                let ai = a.narrow(0, i, 1).reshape(&[3, 4]);
                let bh = b.narrow(0, h, 1).reshape(&[4, 5]);
                let want = ai.matmul(&bh).to_vec();
                let got = c.narrow(0, i, 1).narrow(1, h, 1).to_vec();
                assert_eq!(got, want, "matrix ({i}, {h})");
            }
        }
        let err = s.zeros::<f32>(&[2, 3, 4]).try_matmul(&b).unwrap_err();
        assert_eq!(
            err.to_string(),
            "matmul: incompatible shapes [2, 3, 4] and [3, 4, 5]: batch axes [2] and [3] do not \
             broadcast"
        );
        let err = a.try_matmul(&s.zeros::<f32>(&[4])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "matmul: incompatible shapes [2, 1, 3, 4] and [4]: operands need rank 2 or more, got \
             ranks 4 and 1"
        );
    });
}

#[test]
fn pooling_takes_each_windows_max_or_mean() {
    test_pool(16).scope(|s| {
        let x = iota(s, &[1, 1, 4, 5]);
        let m = x.max_pool2d(2, 2);
        assert_fully_written("max_pool2d", &m);
        assert_eq!(m.shape(), &[1, 1, 2, 2]);
        assert_eq!(m.to_vec(), [6.0, 8.0, 16.0, 18.0]);
        assert_eq!(x.avg_pool2d(2, 2).to_vec(), [3.0, 5.0, 13.0, 15.0]);
        assert_eq!(x.max_pool2d(3, 1).shape(), &[1, 1, 2, 3]);
        let err = x.try_max_pool2d(5, 1).unwrap_err();
        assert_eq!(
            err.to_string(),
            "max_pool2d: invalid kernel: 5 is larger than the image side 4"
        );
        let err = x.try_avg_pool2d(2, 0).unwrap_err();
        assert_eq!(
            err.to_string(),
            "avg_pool2d: invalid stride: must be at least 1"
        );
        let err = iota(s, &[4, 5]).try_max_pool2d(2, 2).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("max_pool2d: invalid shape [4, 5]"),
            "{err}"
        );
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
