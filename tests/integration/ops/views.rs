//! Views: `t()`, `transpose`, `permute`, `narrow` and `expand` share their input's buffer and rent
//! nothing; every op reads them as the tensors they show (the product where they lie, the others
//! through a contiguous copy); nothing writes through one into the buffer it shares; gradients
//! through views are those through copies.

use ndarray::ArrayD;
use tensorscope::autograd::check_gradients;
use tensorscope::ops::Cmp;
use tensorscope::prelude::*;
use tensorscope::{Generator, Result};

use super::iota;
use crate::common::test_pool;

#[test]
fn view_ops_share_the_buffer_and_rent_nothing() {
    test_pool(16).scope(|s| {
        let x = iota(s, &[2, 3, 4]);
        let rented = s.stats().rented;
        let views = [
            ("t", x.t()),
            ("transpose", x.transpose(0, 2)),
            ("permute", x.permute(&[2, 0, 1])),
            ("narrow", x.narrow(1, 1, 2)),
            ("expand", x.narrow(0, 0, 1).expand(&[5, 3, 4])),
        ];
        assert_eq!(s.stats().rented, rented, "a view rents nothing");
        for (what, v) in &views {
            assert!(v.shares_buffer_with(&x), "{what}");
            assert!(!v.is_contiguous(), "{what}");
            assert!(v.as_slice().is_none(), "{what}");
        }
        // Their values, in row-major order of their own shapes.
        let want = x.to_array();
        let t = &views[0].1;
        assert_eq!(t.shape(), &[2, 4, 3]);
        assert_eq!(t.to_array(), want.clone().permuted_axes(vec![0, 2, 1]));
        assert_eq!(
            views[2].1.to_array(),
            want.clone().permuted_axes(vec![2, 0, 1])
        );
        let rows_1_and_2: Vec<f32> = (4..12).chain(16..24).map(|v| v as f32).collect();
        assert_eq!(views[3].1.to_vec(), rows_1_and_2);
        let expanded = &views[4].1;
        assert_eq!(expanded.len(), 60);
        assert!(expanded.to_vec().chunks(12).all(|c| c == &x.to_vec()[..12]));
        // A narrow along the first axis is contiguous: a slice of the buffer.
        let rows = x.narrow(0, 1, 1);
        assert_eq!(rows.as_slice().unwrap(), &x.to_vec()[12..]);
        // `contiguous` copies a view and aliases a contiguous tensor.
        let copy = t.contiguous();
        assert!(copy.is_contiguous() && !copy.shares_buffer_with(&x));
        assert_eq!(copy.to_vec(), t.to_vec());
        assert!(rows.contiguous().shares_buffer_with(&x));
    });
}

#[test]
fn ops_read_views_as_the_tensors_they_show() {
    test_pool(16).scope(read_as_shown);
}

fn read_as_shown<'s>(s: &Scope<'s, '_>) {
    {
        let x = s.randn::<f32>(&[3, 4, 5], 7);
        let w = s.randn::<f32>(&[3, 5, 4], 8);
        let copies = |v: &Tensor<'s>| v.contiguous();
        for v in [x.t(), x.permute(&[1, 0, 2]).transpose(0, 1)] {
            let c = copies(&v);
            // Elementwise, with a scalar, reductions, lanes: the copy's values.
            assert_eq!((&v + &c).to_vec(), (&c * 2.0).to_vec());
            assert_eq!((&v).exp().to_vec(), (&c).exp().to_vec());
            assert_eq!(v.sum(-1).to_vec(), c.sum(-1).to_vec());
            assert_eq!((&v).softmax(1).to_vec(), (&c).softmax(1).to_vec());
            assert_eq!(v.reshape(&[v.len()]).to_vec(), c.to_vec());
        }
        // Products read views where they lie, with the bits of the copies' products.
        let (a, b) = (x.t(), w.t()); // [3, 5, 4] and [3, 4, 5]
        assert_eq!(
            a.matmul(&b).to_vec(),
            copies(&a).matmul(&copies(&b)).to_vec()
        );
        let heads = x.reshape(&[3, 4, 5, 1]).permute(&[0, 3, 1, 2]); // [3, 1, 4, 5]
        let keys = w.reshape(&[3, 1, 5, 4]);
        assert_eq!(
            heads.matmul(&keys).to_vec(),
            copies(&heads).matmul(&keys).to_vec()
        );
        let column = x.narrow(2, 1, 3); // [3, 4, 3], rows 5 apart
        let m = s.randn::<f32>(&[3, 2], 9);
        assert_eq!(
            column.matmul(&m).to_vec(),
            copies(&column).matmul(&m).to_vec()
        );
        // A broadcast right operand from `expand`, steps of 0 along its batch.
        let shared = s.randn::<f32>(&[1, 5, 2], 10).expand(&[3, 5, 2]);
        assert_eq!(
            x.matmul(&shared).to_vec(),
            x.matmul(&copies(&shared)).to_vec()
        );
    }
}

#[test]
fn nothing_writes_through_a_view_into_the_buffer_it_shares() {
    test_pool(16).scope(|s| {
        let x = iota(s, &[4, 4]);
        let before = x.to_vec();
        // A by-value op on a view takes a new buffer.
        let doubled = x.t() * 2.0;
        let relu = x.narrow(1, 1, 2).relu();
        assert_eq!(x.to_vec(), before);
        assert_eq!(
            doubled.to_vec(),
            x.t().to_vec().iter().map(|v| v * 2.0).collect::<Vec<_>>()
        );
        assert_eq!(relu.shape(), &[4, 2]);
        // The only handle on a buffer, as a view of part of it, is not written in place either.
        let part = iota(s, &[4, 4]).narrow(0, 1, 2);
        let bumped = part + 1.0;
        assert_eq!(
            bumped.to_vec(),
            (5..13).map(|v| v as f32).collect::<Vec<_>>()
        );
        // `view_mut` of a view writes a copy of its own.
        let mut v = x.t();
        v.view_mut()[[0, 1]] = -1.0;
        assert_eq!(x.to_vec(), before);
        assert_eq!(v.to_vec()[1], -1.0);
        assert!(v.is_contiguous() && !v.shares_buffer_with(&x));
        // A detached view keeps its values in a buffer of its own.
        let p = x.t().detach();
        assert_eq!(p.to_vec(), x.t().to_vec());
    });
}

/// Products of transposes, of a permuted and of a narrowed operand, and an expanded factor.
fn through_views<'s>(xs: &[Tensor<'s, f64>]) -> Result<Tensor<'s, f64>> {
    let (a, b) = (&xs[0], &xs[1]);
    let p = a.try_t()?.try_matmul(&a.try_narrow(2, 0, 3)?)?; // [2, 4, 3]
    let q = p.try_permute(&[1, 0, 2])?.try_matmul(&b.try_t()?)?; // [4, 2, 4]
    let e = b.try_narrow(1, 0, 1)?.try_expand(&[4, 4])?;
    ((&q * &q).try_sum(1)? * e).try_sum_all()
}

#[test]
fn gradients_through_views_are_those_through_copies() {
    let pool = test_pool(16);
    let a = ArrayD::from_shape_fn(vec![2, 3, 4], |i| {
        (i[0] * 12 + i[1] * 4 + i[2]) as f64 * 0.1 - 1.0
    });
    let b = ArrayD::from_shape_fn(vec![4, 3], |i| 0.3 - (i[0] * 3 + i[1]) as f64 * 0.05);
    let check = check_gradients(&pool, &[a.clone(), b.clone()], 1e-6, through_views).unwrap();
    assert!(check.max_error() < 1e-6, "{check:?}");
    // The same function on contiguous copies: the same gradients, bit for bit.
    let grads = |copy: bool| {
        pool.train(|s| {
            let (x, y) = (s.tensor(&a).requires_grad(), s.tensor(&b).requires_grad());
            let (xs, ys) = match copy {
                true => (x.contiguous(), y.contiguous()),
                false => (x.clone(), y.clone()),
            };
            let g = through_views(&[xs, ys]).unwrap().backward().unwrap();
            (g.of(&x).unwrap().to_vec(), g.of(&y).unwrap().to_vec())
        })
    };
    assert_eq!(grads(false), grads(true));
}

/// Ops that read their ids, masks, labels or values row by row outside the op core (integer
/// arithmetic, comparisons, sampling, one-hot, the ids of gathers and losses) read a view as the
/// tensor it shows: the results of its contiguous copy, exactly.
#[test]
fn ops_on_ids_masks_labels_and_logits_read_views() {
    test_pool(16).scope(|s| {
        let tokens = s.from_slice::<i64>(&[2, 5], &[3, 1, 4, 1, 5, 2, 6, 5, 3, 5]);
        // A language model's targets: the tokens shifted by one, a view.
        let targets = tokens.narrow(1, 1, 4);
        let copy = targets.contiguous();
        assert!(!targets.is_contiguous());
        let table = s.randn::<f32>(&[7, 3], 11);
        assert_eq!(
            table.embedding(&targets).to_vec(),
            table.embedding(&copy).to_vec()
        );
        assert_eq!(
            table.index_select(0, &targets.reshape(&[8])).to_vec(),
            table.index_select(0, &copy.reshape(&[8])).to_vec()
        );
        let logits = s.randn::<f32>(&[2, 4, 7], 12);
        // One label for every row, a view with a step of 0.
        let labels = tokens
            .narrow(1, 2, 1)
            .narrow(0, 0, 1)
            .reshape(&[1])
            .expand(&[8]);
        assert!(!labels.is_contiguous());
        let rows = logits.reshape(&[8, 7]);
        assert_eq!(
            rows.cross_entropy_ids(&labels).item(),
            rows.cross_entropy_ids(&labels.contiguous()).item()
        );
        assert_eq!(targets.one_hot(7).to_vec(), copy.one_hot(7).to_vec());
        assert_eq!(
            (&targets + &targets.t().t()).to_vec(),
            (&copy + &copy).to_vec()
        );
        assert_eq!(
            targets.t().div_floor_scalar(2).to_vec(),
            copy.t().contiguous().div_floor_scalar(2).to_vec()
        );
        let x = s.randn::<f32>(&[4, 6], 13);
        let xt = x.t();
        assert_eq!(
            xt.cmp_scalar(Cmp::Gt, 0.0).to_vec(),
            xt.contiguous().cmp_scalar(Cmp::Gt, 0.0).to_vec()
        );
        let mask = xt.cmp_scalar(Cmp::Gt, 0.0).t(); // a transposed mask
        assert_eq!(
            x.masked_fill(&mask, -1.0).to_vec(),
            x.masked_fill(&mask.contiguous(), -1.0).to_vec()
        );
        assert_eq!(
            xt.cast::<f64>().to_vec(),
            xt.contiguous().cast::<f64>().to_vec()
        );
        assert_eq!(
            xt.narrow(0, 2, 1).narrow(1, 3, 1).item(),
            x.to_vec()[3 * 6 + 2]
        );
        let (values, positions) = xt.sort(-1, true);
        let (want_values, want_positions) = xt.contiguous().sort(-1, true);
        assert_eq!(values.to_vec(), want_values.to_vec());
        assert_eq!(positions.to_vec(), want_positions.to_vec());
        // Generation samples from the last position's logits, a view.
        let last = logits.narrow(1, 3, 1).reshape(&[2, 7]);
        let sample = |l: &Tensor<'_>| {
            let mut rng = Generator::new(5);
            (
                l.sample_logits(0.8, Some(4), Some(0.9), &mut rng).to_vec(),
                l.softmax(-1).multinomial(3, false, &mut rng).to_vec(),
            )
        };
        assert_eq!(sample(&logits.narrow(1, 3, 1).squeeze(1)), sample(&last));
        assert_eq!(
            sample(&logits.transpose(0, 1).narrow(0, 3, 1).squeeze(0)),
            sample(&last)
        );
    });
}

/// Past the axes held inline (6), in the layouts that do not merge: a reversed rank-7 view
/// broadcast against a rank-3 operand, summed along a middle axis, narrowed, joined and copied.
/// ndarray computes the same from the same values.
#[test]
fn views_of_rank_seven_read_as_ndarray_reads_them() {
    test_pool(16).scope(|s| {
        let shape = [2, 3, 2, 1, 2, 3, 2];
        let x = s.randn::<f32>(&shape, 11);
        let reversed: Vec<usize> = (0..7).rev().collect();
        let v = x.permute(&reversed); // [2, 3, 2, 1, 2, 3, 2], steps reversed
        let want = x.to_array().permuted_axes(reversed.clone());
        assert_eq!(v.contiguous().to_array(), want);
        let b = s.randn::<f32>(&[2, 1, 2], 12);
        let want_sum = (&want * &b.to_array()).sum_axis(ndarray::Axis(2));
        assert_eq!((&v * &b).sum(2).to_array(), want_sum);
        assert_eq!((&b + &v).to_array(), &b.to_array() + &want);
        let narrow = v.narrow(5, 1, 2);
        let want_narrow = want.slice_axis(ndarray::Axis(5), ndarray::Slice::from(1..3));
        assert_eq!(narrow.to_array(), want_narrow);
        let joined = Tensor::concat(&[&narrow, &v], 5);
        let want_joined =
            ndarray::concatenate(ndarray::Axis(5), &[want_narrow.view(), want.view()]).unwrap();
        assert_eq!(joined.to_array(), want_joined);
    });
}

/// A reversed rank-7 view times a rank-3 operand, narrowed, joined, tiled, summed along a middle
/// axis; and the rank-3 operand expanded to rank 5.
fn rank_seven<'s>(xs: &[Tensor<'s, f64>]) -> Result<Tensor<'s, f64>> {
    let v = xs[0].try_permute(&[6, 5, 4, 3, 2, 1, 0])?;
    let y = (&v * &xs[1]).try_tanh()?;
    let joined = Tensor::try_concat(&[&y.try_narrow(5, 1, 2)?, &y], 5)?;
    let tiled = joined.try_repeat(&[1, 2, 1, 1, 1, 1, 1])?; // [2, 6, 2, 1, 2, 5, 2]
    let spread = xs[1].try_expand(&[6, 2, 2, 3, 2])?; // [2, 1, 2] along new and unit axes
    let tail = (&spread * &spread).try_sum_all()?;
    let sum = (&tiled * &tiled)
        .try_sum(2)?
        .try_unsqueeze(1)?
        .try_sum_all()?;
    Ok(sum + &tail)
}

/// Rank-7 views, broadcasts, a middle-axis sum, a narrow, a concat, a repeat and an expand,
/// differentiated: the gradients match finite differences.
#[test]
fn gradients_through_rank_seven_views_match_finite_differences() {
    let pool = test_pool(16);
    let x = ArrayD::from_shape_fn(vec![2, 3, 2, 1, 2, 3, 2], |i| {
        let weighted: usize = (0..7).map(|k| (k + 1) * i[k]).sum();
        weighted as f64 * 0.05 - 0.7
    });
    let b = ArrayD::from_shape_fn(vec![2, 1, 2], |i| 0.4 - (i[0] * 2 + i[2]) as f64 * 0.3);
    let check = check_gradients(&pool, &[x, b], 1e-6, rank_seven).unwrap();
    assert!(check.max_error() < 1e-6, "{check:?}");
}
