//! `nn::KvCache`: appends in place, attention over each sequence's filled part (grouped-query,
//! causal per sequence) against the fused attention on the same keys, resets, the memory it
//! holds, and its errors.

use std::cell::Cell;

use tensorscope::nn::KvCache;
use tensorscope::ops::AttentionOptions;
use tensorscope::prelude::*;
use tensorscope::{f16, Error};

use crate::common::{max_abs_diff, test_pool};

const CAUSAL: AttentionOptions = AttentionOptions {
    causal: true,
    scale: None,
};

/// `x` (`[1, kv_heads, t, d]`) with each head repeated `group` times in a row: the keys of
/// `kv_heads * group` query heads.
fn repeat_heads<'s>(x: &Tensor<'s>, group: usize) -> Tensor<'s> {
    let [_, heads, t, d] = *x.shape() else {
        unreachable!("rank 4")
    };
    x.unsqueeze(2)
        .expand(&[1, heads, group, t, d])
        .reshape(&[1, heads * group, t, d])
}

#[test]
fn attend_is_the_fused_attention_over_each_sequences_filled_keys() {
    let pool = test_pool(64);
    // 3 sequences filled to different lengths by prompts, then decoded together; 6 query heads
    // on 2 key/value heads; lengths across the 64-key blocks of the kernel.
    let (kv_heads, group, d, max) = (2, 3, 8, 160);
    let prompts = [5usize, 70, 129];
    pool.scope(|s| {
        let mut cache = KvCache::<f32>::new(s, prompts.len(), kv_heads, max, d);
        let seed = Cell::new(0);
        for (seq, &len) in prompts.iter().enumerate() {
            s.scope(|p| {
                let (k, v) = (
                    draw(p, &[1, kv_heads, len, d], &seed),
                    draw(p, &[1, kv_heads, len, d], &seed),
                );
                cache.append_to(seq, &k, &v);
                // A prompt's queries: all its positions, causal.
                let q = draw(p, &[1, kv_heads * group, len, d], &seed);
                let want = q.scaled_dot_product_attention(
                    &repeat_heads(&k, group),
                    &repeat_heads(&v, group),
                    CAUSAL,
                );
                let got = cache.attend_to(seq, &q, None);
                assert!(max_abs_diff(&got.to_vec(), &want.to_vec()) < 1e-5);
            });
        }
        // Decode steps of 1 and then 2 positions for every sequence at once.
        for n in [1, 2] {
            s.scope(|step| {
                let batch = prompts.len();
                let k = draw(step, &[batch, kv_heads, n, d], &seed);
                let v = draw(step, &[batch, kv_heads, n, d], &seed);
                cache.append(&k, &v);
                let q = draw(step, &[batch, kv_heads * group, n, d], &seed);
                let got = cache.attend(&q, None);
                assert_eq!(got.shape(), &[batch, kv_heads * group, n, d]);
                for seq in 0..batch {
                    let keys = repeat_heads(&cache.keys(seq), group);
                    let values = repeat_heads(&cache.values(seq), group);
                    let want = q
                        .narrow(0, seq, 1)
                        .scaled_dot_product_attention(&keys, &values, CAUSAL);
                    let got = got.narrow(0, seq, 1).contiguous();
                    assert!(max_abs_diff(&got.to_vec(), &want.to_vec()) < 1e-5);
                }
            });
        }
        assert_eq!(cache.lens(), &[8, 73, 132]);
    });
}

/// Normal values of `shape` from the next seed.
fn draw<'s>(s: &Scope<'s, '_>, shape: &[usize], seed: &Cell<u64>) -> Tensor<'s> {
    seed.set(seed.get() + 1);
    s.randn::<f32>(shape, seed.get())
}

#[test]
fn appends_write_in_place_and_resets_start_a_sequence_again() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let mut cache = KvCache::<f32>::new(s, 2, 1, 4, 2);
        let bytes = cache.allocated_bytes();
        assert_eq!(bytes, 2 * 2 * 4 * 2 * 4, "two [2, 1, 4, 2] f32 tensors");
        assert!(cache.is_empty());
        let before = pool.stats().misses;
        for t in 0..3 {
            s.scope(|step| {
                let k =
                    step.from_slice::<f32>(&[2, 1, 1, 2], &[t as f32, 0.5, 10.0 + t as f32, 0.5]);
                cache.append(&k, &(&k * 2.0));
            });
        }
        assert_eq!(cache.lens(), &[3, 3]);
        assert_eq!(cache.keys(0).to_vec(), [0.0, 0.5, 1.0, 0.5, 2.0, 0.5]);
        assert_eq!(cache.values(1).to_vec(), [20.0, 1.0, 22.0, 1.0, 24.0, 1.0]);
        cache.reset(0);
        assert_eq!(cache.lens(), &[0, 3]);
        let k = s.from_slice::<f32>(&[1, 1, 1, 2], &[7.0, 8.0]);
        cache.append_to(0, &k, &k);
        assert_eq!(cache.keys(0).to_vec(), [7.0, 8.0]);
        assert_eq!(cache.keys(1).shape(), &[1, 1, 3, 2]);
        // The steps rented their operands from the pool; the cache itself rented nothing more.
        assert_eq!(cache.allocated_bytes(), bytes);
        assert!(pool.stats().misses - before <= 4);
        cache.clear();
        assert!(cache.is_empty());
    });
}

#[test]
fn the_cache_counts_in_its_scope_and_fails_at_once_past_the_budget() {
    let pool = test_pool(64);
    let ((), stats) = pool.scope_with_stats(|s| {
        let cache = KvCache::<f32>::new(s, 1, 2, 64, 16);
        assert_eq!(s.stats().live(), 2);
        assert_eq!(s.stats().bytes_in_use, cache.allocated_bytes());
    });
    assert_eq!(stats.leaked, 0);
    // 2 x [4, 8, 1024, 64] f32 = 16 MiB, over a 1 MiB request budget: the request fails when it
    // makes its cache, naming the budget.
    let err = pool
        .scope_with_budget(1 << 20, |s| {
            KvCache::<f32>::try_new(s, 4, 8, 1024, 64).map(drop)
        })
        .unwrap_err();
    assert!(matches!(err, Error::ScopeBudgetExceeded { .. }), "{err}");
}

#[test]
fn bad_appends_and_queries_are_errors_that_change_nothing() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let mut cache = KvCache::<f32>::new(s, 2, 2, 3, 4);
        let k = s.zeros::<f32>(&[2, 2, 2, 4]);
        cache.append(&k, &k);
        let text = |e: Error| e.to_string();
        // No room for 2 more of 3 positions.
        let full = text(cache.try_append(&k, &k).unwrap_err());
        assert!(
            full.contains("sequence 0 holds 2 of its 3 positions; 2 more do not fit"),
            "{full}"
        );
        // Shapes: another head dimension, k and v of different lengths, a sequence past the batch.
        let wide = s.zeros::<f32>(&[2, 2, 1, 5]);
        assert!(matches!(
            cache.try_append(&wide, &wide),
            Err(Error::ShapeMismatch { .. })
        ));
        let one = s.zeros::<f32>(&[2, 2, 1, 4]);
        assert!(matches!(
            cache.try_append(&one, &k),
            Err(Error::ShapeMismatch { .. })
        ));
        let single = s.zeros::<f32>(&[1, 2, 1, 4]);
        assert!(matches!(
            cache.try_append_to(2, &single, &single),
            Err(Error::IndexOutOfRange {
                index: 2,
                len: 2,
                ..
            })
        ));
        // A live view forbids an append; dropping it allows it again.
        let view = cache.keys(0);
        let busy = text(cache.try_append(&one, &one).unwrap_err());
        assert!(busy.contains("a view of the cache"), "{busy}");
        drop(view);
        cache.append(&one, &one);
        assert_eq!(cache.lens(), &[3, 3]);
        // Queries: 3 heads on 2 key/value heads, more queries than positions, a graph.
        let q = s.zeros::<f32>(&[2, 3, 1, 4]);
        assert!(text(cache.try_attend(&q, None).unwrap_err()).contains("cannot share"));
        let one_q = s.zeros::<f32>(&[1, 2, 1, 4]);
        assert!(matches!(
            cache.try_attend_to(2, &one_q, None),
            Err(Error::IndexOutOfRange {
                index: 2,
                len: 2,
                ..
            })
        ));
        assert_eq!(cache.attend_to(1, &one_q, None).shape(), &[1, 2, 1, 4]);
        let q = s.zeros::<f32>(&[2, 4, 4, 4]);
        assert!(text(cache.try_attend(&q, None).unwrap_err()).contains("fewer than the 4 queries"));
        assert!(matches!(
            KvCache::<f32>::try_new(s, 0, 2, 3, 4),
            Err(Error::InvalidArgument { .. })
        ));
    });
    pool.train(|s| {
        let mut cache = KvCache::<f32>::new(s, 1, 1, 2, 2);
        let w = Param::from_slice(&pool, &[1, 1, 1, 2], &[1.0, 2.0]);
        let k = s.bind(&w) * 1.0;
        let err = cache.try_append(&k, &k).unwrap_err().to_string();
        assert!(err.contains("carries a gradient graph"), "{err}");
    });
}

#[test]
fn an_f16_cache_computes_its_scores_in_f32_and_refuses_a_scale_infinite_there() {
    let pool = test_pool(16);
    pool.scope(|s| {
        let (heads, d) = (2, 8);
        // Two sequences filled to 70 and 20 of 96 positions, scores of up to about 2.5e5, past
        // f16's 65504; the reference is an f32 cache of the same rounded values.
        let mut exact = KvCache::<f32>::new(s, 2, heads, 96, d);
        let mut half = KvCache::<f16>::new(s, 2, heads, 96, d);
        for (seq, t) in [(0, 70), (1, 20)] {
            let x = [1, 2].map(|seed| s.randn::<f32>(&[1, heads, t, d], seed + seq as u64) * 150.0);
            let rounded = x.each_ref().map(|x| x.cast::<f16>().cast::<f32>());
            exact.append_to(seq, &rounded[0], &rounded[1]);
            half.append_to(seq, &x[0].cast::<f16>(), &x[1].cast::<f16>());
        }
        let q = (s.randn::<f32>(&[2, heads, 1, d], 3) * 150.0).cast::<f16>();
        let scores = q
            .cast::<f32>()
            .narrow(0, 0, 1)
            .matmul(&exact.keys(0).t())
            .to_vec();
        let largest = scores.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert!(largest > 65504.0, "the scores reach {largest}");
        let scale = Some(1e-4);
        let want = exact.attend(&q.cast::<f32>(), scale).to_vec();
        let got = half.attend(&q, scale).cast::<f32>().to_vec();
        let bad = got.iter().filter(|x| !x.is_finite()).count();
        assert_eq!(bad, 0, "elements not finite");
        let largest = want.iter().fold(0.0f32, |m, w| m.max(w.abs()));
        assert!(max_abs_diff(&got, &want) < 4e-3 * largest);

        let err = half.try_attend(&q, Some(1e300)).unwrap_err();
        assert_eq!(
            err,
            Error::InvalidArgument {
                op: "KvCache::attend",
                arg: "scale",
                reason: "1e300 is not a finite f32 (attention of f16 computes its scores in f32)"
                    .into(),
            }
        );
        let err = exact.try_attend(&q.cast::<f32>(), Some(1e300)).unwrap_err();
        assert!(
            err.to_string().contains("1e300 is not a finite f32"),
            "{err}"
        );
    });
}
