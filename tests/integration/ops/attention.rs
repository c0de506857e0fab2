//! `scaled_dot_product_attention`, the fused op: values and gradients against the same attention
//! written with the unfused ops (`matmul`, `masked_fill`, `softmax`) on shapes around the tiles,
//! against PyTorch (`scripts/attention_fixture.py`), against finite differences, `f16` and `bf16`
//! against `f32`, a checkpointed replay bit for bit, the memory its graph holds against the
//! unfused form's, and the errors.

use tensorscope::ops::AttentionOptions;
use tensorscope::prelude::*;
use tensorscope::{Error, Result, Shape};

use super::checks::{assert_checkpoint_replays_exactly, Fixture};
use super::{assert_panics_with, shape_mismatch};
use crate::autograd::check;
use crate::common::{assert_fully_written, close, test_pool};

const CAUSAL: AttentionOptions = AttentionOptions {
    causal: true,
    scale: None,
};
const ALL: AttentionOptions = AttentionOptions {
    causal: false,
    scale: None,
};

/// The attention of `q`, `k` and `v` written with the unfused ops, the causal mask aligned
/// bottom-right (query `i` sees keys `j <= i + tk - tq`).
fn unfused<'s>(
    s: &Scope<'s, '_>,
    (q, k, v): (&Tensor<'s>, &Tensor<'s>, &Tensor<'s>),
    options: AttentionOptions,
) -> Tensor<'s> {
    let [.., tq, d] = *q.shape() else {
        unreachable!("[.., tq, d]")
    };
    let tk = k.shape()[k.ndim() - 2];
    let scale = options.scale.unwrap_or(1.0 / (d as f64).sqrt()) as f32;
    let scores = q.matmul(&k.t()) * scale;
    let scores = match options.causal {
        true => {
            let future = s.ones::<u8>(&[tq, tk]).triu(1 + tk as i64 - tq as i64);
            scores.masked_fill(&future, f32::NEG_INFINITY)
        }
        false => scores,
    };
    scores.softmax(-1).matmul(v)
}

/// Asserts `got` within `rtol` of `want`, relative to each element (above an absolute floor of
/// `rtol / 10` of the largest, for elements near zero).
#[track_caller]
fn assert_within(what: &str, got: &[f32], want: &[f32], rtol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let largest = want.iter().fold(0.0f64, |m, &w| m.max(f64::from(w).abs()));
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            close(g.into(), w.into(), rtol, rtol / 10.0 * largest),
            "{what}: [{i}] {g}, unfused {w}"
        );
    }
}

/// Asserts that every element of `got` is within `tol` of the largest element of `want`.
#[track_caller]
fn assert_within_largest(what: &str, got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let largest = want.iter().fold(0.0f32, |m, w| m.max(w.abs()));
    let error = got
        .iter()
        .zip(want)
        .fold(0.0f32, |m, (g, w)| m.max((g - w).abs()));
    assert!(
        error <= tol * largest,
        "{what}: off by {error:e}, the largest element is {largest:e}"
    );
}

/// Compares the fused op with the unfused ops on random `q: [lead.., tq, d]`, `k: [lead.., tk,
/// d]`, `v: [lead.., tk, dv]`: the output within 1e-5 relative, and the gradients of `sum(y *
/// gy)` for a random `gy` within 1e-4 of each gradient's largest element.
#[track_caller]
fn compare(
    lead: &[usize],
    (tq, tk, d, dv): (usize, usize, usize, usize),
    options: AttentionOptions,
) {
    let what = format!("{lead:?} tq {tq} tk {tk} d {d} dv {dv} {options:?}");
    let shape = |t, w| [lead, &[t, w]].concat();
    let pool = test_pool(64);
    let run = |fused: bool| {
        pool.scope(|s| {
            let q = (s.randn::<f32>(&shape(tq, d), 1) * 1.5).requires_grad();
            let k = s.randn::<f32>(&shape(tk, d), 2).requires_grad();
            let v = s.randn::<f32>(&shape(tk, dv), 3).requires_grad();
            let y = match fused {
                true => q.scaled_dot_product_attention(&k, &v, options),
                false => unfused(s, (&q, &k, &v), options),
            };
            assert_eq!(y.shape(), &shape(tq, dv)[..], "{what}: shape");
            assert_fully_written(&what, &y);
            let grads = y.backward_with(&s.randn::<f32>(y.shape(), 4)).unwrap();
            let grad = |x: &Tensor<'_>| {
                let g = grads.of(x).expect("every input has a gradient");
                assert_fully_written(&what, g);
                g.to_vec()
            };
            [y.to_vec(), grad(&q), grad(&k), grad(&v)]
        })
    };
    let ([y, dq, dk, dv], [want, want_dq, want_dk, want_dv]) = (run(true), run(false));
    assert_within(&format!("{what}: y"), &y, &want, 1e-5);
    for (name, got, want) in [
        ("dq", dq, want_dq),
        ("dk", dk, want_dk),
        ("dv", dv, want_dv),
    ] {
        assert_within_largest(&format!("{what}: {name}"), &got, &want, 1e-4);
    }
}

#[test]
fn it_computes_what_the_unfused_ops_compute() {
    for options in [ALL, CAUSAL] {
        // One tile, several heads.
        compare(&[2, 3], (7, 7, 5, 3), options);
        // Fewer queries than keys: a cache's.
        compare(&[1, 2], (5, 9, 8, 4), options);
        // Sizes past a tile (64) and not multiples of it, in both directions.
        compare(&[1, 2], (130, 130, 16, 24), options);
        compare(&[2], (67, 150, 9, 7), options);
        // Head dimension 1, and no leading axes.
        compare(&[2, 2], (6, 6, 1, 1), options);
        compare(&[], (20, 20, 4, 4), options);
        // One query over many keys: decoding.
        compare(&[1, 3], (1, 70, 8, 8), options);
    }
    // More queries than keys, every query seeing every key.
    compare(&[1, 2], (9, 5, 4, 3), ALL);
    compare(&[3], (100, 33, 6, 6), ALL);
    // A scale of one's own.
    let scaled = AttentionOptions {
        scale: Some(0.05),
        ..CAUSAL
    };
    compare(&[1, 2], (70, 80, 6, 5), scaled);
}

#[test]
fn it_matches_pytorch() {
    let fixture = Fixture::open("attention");
    let cases = [
        ("plain", ALL),
        (
            "more_queries",
            AttentionOptions {
                scale: Some(0.3),
                ..ALL
            },
        ),
        ("causal", CAUSAL),
        ("causal_cache", CAUSAL),
        ("rank3", CAUSAL),
    ];
    for (prefix, options) in cases {
        fixture.check(prefix, &["q", "k", "v"], |x| {
            x[0].scaled_dot_product_attention(&x[1], &x[2], options)
        });
    }
}

#[test]
fn its_gradients_match_finite_differences() {
    fn attention<'s>(x: &[Tensor<'s, f64>], options: AttentionOptions) -> Result<Tensor<'s, f64>> {
        x[0].try_scaled_dot_product_attention(&x[1], &x[2], options)
    }
    let one_tile: [&[usize]; 3] = [&[1, 2, 4, 3], &[1, 2, 6, 3], &[1, 2, 6, 2]];
    check("one tile", &one_tile, |x| attention(x, ALL));
    check("causal", &[&[2, 4, 3], &[2, 6, 3], &[2, 6, 2]], |x| {
        attention(x, CAUSAL)
    });
    let past: [&[usize]; 3] = [&[1, 66, 2], &[1, 70, 2], &[1, 70, 2]];
    check("past a tile", &past, |x| attention(x, CAUSAL));
}

/// The output and the gradients of `q`, `k` and `v` (for the upstream gradient `gy`) of the fused
/// op in `T`, as `f32`.
fn in_precision<T: tensorscope::Element>(
    x: [&Tensor<'_>; 4],
    options: AttentionOptions,
) -> [Vec<f32>; 4] {
    let [q, k, v, gy] = x.map(|t| t.cast::<T>());
    let [q, k, v] = [q, k, v].map(Tensor::requires_grad);
    let y = q.scaled_dot_product_attention(&k, &v, options);
    let grads = y.backward_with(&gy).unwrap();
    let [dq, dk, dv] = [&q, &k, &v].map(|x| grads.of(x).unwrap());
    [&y, dq, dk, dv].map(|t| t.cast::<f32>().to_vec())
}

#[test]
fn half_precisions_run_the_same_tiles_in_f32() {
    let pool = test_pool(16);
    pool.scope(|s| {
        // Past a tile of queries and of keys, so that the tiles' products accumulate.
        let x = [1, 2, 3, 4].map(|seed| s.randn::<f32>(&[2, 70, 8], seed));
        let x = [&x[0], &x[1], &x[2], &x[3]];
        let exact = in_precision::<f32>(x, CAUSAL);
        let half = [
            ("f16", in_precision::<tensorscope::f16>(x, CAUSAL), 1e-2),
            ("bf16", in_precision::<tensorscope::bf16>(x, CAUSAL), 5e-2),
        ];
        for (name, got, tol) in half {
            for (what, (got, want)) in ["y", "dq", "dk", "dv"].iter().zip(got.iter().zip(&exact)) {
                assert_within_largest(&format!("{name} {what}"), got, want, tol);
            }
        }
    });
}

#[test]
fn half_precision_scores_past_65504_are_computed_in_f32_as_pytorch_does() {
    let pool = test_pool(16);
    pool.scope(|s| {
        // Scores q k^T of up to about 2.5e5, past f16's 65504, scaled by 1e-4 to a softmax that
        // is not one-hot. The reference is f32 on the same (rounded) inputs: what is left is the
        // rounding of the results.
        let x = [1, 2, 3, 4].map(|seed| s.randn::<f32>(&[2, 70, 8], seed));
        let x = [&x[0] * 150.0, &x[1] * 150.0, x[2].clone(), x[3].clone()];
        let scores = x[0].matmul(&x[1].t()).to_vec();
        let largest = scores.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert!(largest > 65504.0, "the scores reach {largest}");
        let options = AttentionOptions {
            causal: true,
            scale: Some(1e-4),
        };
        for (name, tol) in [("f16", 4e-3), ("bf16", 3e-2)] {
            let (rounded, got) = match name {
                "f16" => (
                    x.each_ref()
                        .map(|t| t.cast::<tensorscope::f16>().cast::<f32>()),
                    in_precision::<tensorscope::f16>(x.each_ref(), options),
                ),
                _ => (
                    x.each_ref()
                        .map(|t| t.cast::<tensorscope::bf16>().cast::<f32>()),
                    in_precision::<tensorscope::bf16>(x.each_ref(), options),
                ),
            };
            let exact = in_precision::<f32>(rounded.each_ref(), options);
            for (what, (got, want)) in ["y", "dq", "dk", "dv"].iter().zip(got.iter().zip(&exact)) {
                let bad = got.iter().filter(|x| !x.is_finite()).count();
                assert_eq!(bad, 0, "{name} {what}: elements not finite");
                assert_within_largest(&format!("{name} {what}"), got, want, tol);
            }
        }
    });
}

#[test]
fn a_scale_past_the_score_types_range_is_an_error_naming_both_types() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let huge = AttentionOptions {
            causal: false,
            scale: Some(1e300),
        };
        let q = s.randn::<f32>(&[3, 4], 1);
        let reason = |t: &str| {
            format!("1e300 is not a finite f32 (attention of {t} computes its scores in f32)")
        };
        let err = |t: &str| Error::InvalidArgument {
            op: "scaled_dot_product_attention",
            arg: "scale",
            reason: reason(t),
        };
        assert_eq!(
            q.try_scaled_dot_product_attention(&q, &q, huge)
                .unwrap_err(),
            err("f32")
        );
        let half = q.cast::<tensorscope::f16>();
        assert_eq!(
            half.try_scaled_dot_product_attention(&half, &half, huge)
                .unwrap_err(),
            err("f16")
        );
        // Finite in f64, which computes in f64: every query attends to its largest score.
        let wide = q.cast::<f64>();
        let y = wide.scaled_dot_product_attention(&wide, &wide, huge);
        assert!(y.to_vec().iter().all(|x| x.is_finite()));
    });
}

#[test]
fn only_the_inputs_that_need_a_gradient_get_one() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let q = s.randn::<f64>(&[2, 5, 3], 1).requires_grad();
        let (k, v) = (s.randn::<f64>(&[2, 5, 3], 2), s.randn::<f64>(&[2, 5, 4], 3));
        let grads = q
            .scaled_dot_product_attention(&k, &v, CAUSAL)
            .sum_all()
            .backward()
            .unwrap();
        assert!(grads.of(&k).is_none() && grads.of(&v).is_none());
        // The gradient of the first query is 0 (to rounding: `D` and `dP` are sums in other
        // orders): it sees one key, whatever its score.
        let dq = grads.of(&q).unwrap().to_vec();
        assert!(dq[..3].iter().all(|g| g.abs() < 1e-15), "{dq:?}");
        assert!(dq[3..].iter().all(|g| g.is_finite()) && dq[3..].iter().any(|&g| g != 0.0));
    });
}

#[test]
fn empty_outputs_give_zero_gradients() {
    let pool = test_pool(16);
    pool.scope(|s| {
        // No query: the keys and values get zeros.
        let q = s.zeros::<f32>(&[2, 0, 3]).requires_grad();
        let k = s.randn::<f32>(&[2, 4, 3], 1).requires_grad();
        let v = s.randn::<f32>(&[2, 4, 2], 2).requires_grad();
        let y = q.scaled_dot_product_attention(&k, &v, CAUSAL);
        assert_eq!(y.shape(), &[2, 0, 2]);
        let grads = y.sum_all().backward().unwrap();
        assert_eq!(grads.of(&k).unwrap().to_vec(), vec![0.0; 24]);
        assert_eq!(grads.of(&v).unwrap().to_vec(), vec![0.0; 16]);
        // Values of width 0.
        let q = s.randn::<f32>(&[2, 3, 3], 3).requires_grad();
        let v = s.zeros::<f32>(&[2, 4, 0]);
        let y = q.scaled_dot_product_attention(&k, &v, ALL);
        assert_eq!(y.shape(), &[2, 3, 0]);
        let grads = y.sum_all().backward().unwrap();
        assert_eq!(grads.of(&q).unwrap().to_vec(), vec![0.0; 18]);
    });
}

#[test]
fn a_checkpointed_attention_replays_it_bit_for_bit() {
    // Self-attention blocks over `[batch, t, 8]`: a product to q, k and v of 2 heads of 4, the
    // fused attention, the heads merged, a residual.
    assert_checkpoint_replays_exactly(
        &[2, 70, 8],
        &[8, 24],
        |_, x, w| {
            let qkv = x.matmul(w);
            let heads = |i: usize| {
                qkv.narrow(-1, 8 * i, 8)
                    .reshape(&[2, 70, 2, 4])
                    .transpose(1, 2)
            };
            let y = heads(0).scaled_dot_product_attention(&heads(1), &heads(2), CAUSAL);
            x + y.transpose(1, 2).reshape(&[2, 70, 8])
        },
        || (),
    );
}

/// The pool bytes a training forward's graph holds beyond its inputs: those in use while the
/// output lives, less those before.
fn held(
    forward: impl for<'s> Fn(&Scope<'s, '_>, (&Tensor<'s>, &Tensor<'s>, &Tensor<'s>)) -> Tensor<'s>,
) -> usize {
    let pool = Pool::with_max_memory_mb(64);
    pool.scope(|s| {
        let q = s.randn::<f32>(&[1, 2, 64, 16], 1).requires_grad();
        let k = s.randn::<f32>(&[1, 2, 64, 16], 2).requires_grad();
        let v = s.randn::<f32>(&[1, 2, 64, 16], 3).requires_grad();
        let before = pool.stats().bytes_in_use;
        let y = forward(s, (&q, &k, &v));
        let held = pool.stats().bytes_in_use - before;
        drop(y);
        assert_eq!(pool.stats().bytes_in_use, before, "the graph released");
        held
    })
}

#[test]
fn its_graph_holds_the_output_and_a_number_per_query_not_the_scores() {
    let fused = held(|_, (q, k, v)| q.scaled_dot_product_attention(k, v, CAUSAL));
    let unfused = held(|s, x| unfused(s, x, CAUSAL));
    // The output [1, 2, 64, 16] and each query's log-sum-exp [1, 2, 64], in f32.
    let (output, lse) = (2 * 64 * 16 * 4, 2 * 64 * 4);
    assert_eq!(fused, output + lse);
    // The unfused form keeps the output, the probabilities [1, 2, 64, 64] (saved by the softmax
    // and by the second product) and the mask [64, 64] of `u8`; `k^T` is a view of `k`, which
    // the product saves as it is.
    let (probabilities, mask) = (2 * 64 * 64 * 4, 64 * 64);
    assert_eq!(unfused, output + probabilities + mask);
}

/// Asserts that attention of zeros of `shapes` (`q`, `k`, `v`) with `options` fails with `want`
/// before renting anything, and that the panicking form panics with its message.
#[track_caller]
fn assert_fails(shapes: [&[usize]; 3], options: AttentionOptions, want: Error) {
    let pool = test_pool(16);
    pool.scope(|s| {
        let [q, k, v] = shapes.map(|shape| s.zeros::<f32>(shape));
        let rented = pool.stats().bytes_in_use;
        let err = q
            .try_scaled_dot_product_attention(&k, &v, options)
            .unwrap_err();
        assert_eq!(err, want);
        assert_eq!(pool.stats().bytes_in_use, rented, "{want}: nothing rented");
        assert_panics_with(&want, || {
            q.scaled_dot_product_attention(&k, &v, options);
        });
    });
}

#[test]
fn bad_shapes_and_options_are_the_ops_errors_before_anything_is_rented() {
    let op = "scaled_dot_product_attention";
    let invalid = |shape: &[usize], reason: &str| Error::InvalidShape {
        op,
        shape: Shape(shape.to_vec()),
        reason: reason.into(),
    };
    let rank = "q needs at least two axes, [.., tq, d]";
    assert_fails([&[4], &[4, 4], &[4, 4]], ALL, invalid(&[4], rank));
    let no_width = "the head dimension (the last axis) is 0: a score needs one element at least";
    assert_fails([&[3, 0], &[5, 0], &[5, 4]], ALL, invalid(&[3, 0], no_width));
    let scale = AttentionOptions {
        scale: Some(f64::NAN),
        ..ALL
    };
    let not_finite = Error::InvalidArgument {
        op,
        arg: "scale",
        reason: "NaN is not a finite f32 (attention of f32 computes its scores in f32)".into(),
    };
    assert_fails([&[3, 4], &[3, 4], &[3, 4]], scale, not_finite);
    // Shapes that do not fit together: q, k and v, the options, the two shapes the error names
    // (of q, k and v) and why.
    type Mismatch<'a> = ([&'a [usize]; 3], AttentionOptions, [usize; 2], &'a str);
    let mismatches: [Mismatch<'_>; 6] = [
        (
            [&[2, 3, 4], &[3, 5, 4], &[3, 5, 4]],
            ALL,
            [0, 1],
            "the leading (batch and head) axes of q and k differ, [2] and [3]; they must be equal \
             (they are not broadcast)",
        ),
        (
            [&[2, 3, 4], &[2, 5, 4], &[1, 5, 4]],
            ALL,
            [0, 2],
            "the leading (batch and head) axes of q and v differ, [2] and [1]; they must be equal \
             (they are not broadcast)",
        ),
        (
            [&[3, 4], &[5, 6], &[5, 4]],
            ALL,
            [0, 1],
            "q and k have head dimensions 4 and 6 (their last axes); they must be equal",
        ),
        (
            [&[3, 4], &[5, 4], &[6, 4]],
            ALL,
            [1, 2],
            "k has 5 keys and v 6 values (axis -2); they must be equal",
        ),
        (
            [&[3, 4], &[0, 4], &[0, 4]],
            ALL,
            [0, 1],
            "3 queries and no key: every query needs a key to attend to",
        ),
        (
            [&[5, 4], &[3, 4], &[3, 4]],
            CAUSAL,
            [0, 1],
            "causal attention aligns the last query with the last key, so of 5 queries and 3 keys \
             the first 2 would see no key; causal needs at most as many queries as keys",
        ),
    ];
    for (shapes, options, [lhs, rhs], reason) in mismatches {
        let want = shape_mismatch(op, shapes[lhs], shapes[rhs], reason);
        assert_fails(shapes, options, want);
    }
}
