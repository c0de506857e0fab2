//! `multinomial` and `sample_logits`: the frequencies of many draws against the distributions they
//! follow (for `sample_logits`, Hugging Face's warpers, `scripts/sample_fixture.py`) within five
//! standard deviations, tokens that top-k and top-p remove never drawn, greedy decoding, the same
//! ids for the same seed, and the errors.

use tensorscope::prelude::*;
use tensorscope::{manual_seed, Error, Generator, Shape};

use super::checks::Fixture;
use crate::common::test_pool;

/// Asserts that `ids` (draws from classes `0..probs.len()`) come at `probs`' rates, each within
/// five standard deviations, and never where a probability is 0.
#[track_caller]
fn assert_frequencies(what: &str, ids: impl Iterator<Item = i64>, probs: &[f64]) {
    let mut counts = vec![0usize; probs.len()];
    ids.for_each(|id| counts[id as usize] += 1);
    let n = counts.iter().sum::<usize>() as f64;
    for (i, (&count, &p)) in counts.iter().zip(probs).enumerate() {
        let f = count as f64 / n;
        let bound = 5.0 * (p * (1.0 - p) / n).sqrt();
        assert!(
            (f - p).abs() <= bound,
            "{what}: class {i} drawn at {f}, expected {p} (+- {bound})"
        );
    }
}

#[test]
fn sample_logits_follows_hugging_faces_warpers() {
    let fixture = Fixture::open("sample");
    let draws = 10_000;
    for name in ["temperature", "top_k", "top_p", "top_k_top_p"] {
        let logits = fixture.values::<f64>(&format!("{name}.logits"));
        let probs = fixture.values::<f64>(&format!("{name}.probs"));
        let [temperature, k, p] = fixture.values::<f64>(&format!("{name}.config"))[..]
            .try_into()
            .expect("three settings");
        let top_k = (k > 0.0).then_some(k as usize);
        let top_p = (p < 1.0).then_some(p as f32);
        test_pool(16).scope(|s| {
            // Every row repeated: one call draws `draws` ids per row.
            let repeated = logits.repeat(draws);
            let x = s.from_slice::<f64>(&[draws, 3, 10], &repeated);
            let mut rng = Generator::new(5);
            let ids = x.sample_logits(temperature as f32, top_k, top_p, &mut rng);
            assert_eq!(ids.shape(), &[draws, 3]);
            let ids = ids.to_vec();
            for row in 0..3 {
                assert_frequencies(
                    &format!("{name}, row {row}"),
                    ids.iter().skip(row).step_by(3).copied(),
                    &probs[row * 10..][..10],
                );
            }
        });
    }
}

#[test]
fn temperature_zero_and_a_single_kept_token_are_greedy() {
    test_pool(16).scope(|s| {
        let logits = s.from_slice::<f32>(
            &[3, 4],
            &[
                0.5,
                2.0,
                2.0,
                -1.0,
                f32::NEG_INFINITY,
                -3.0,
                -2.0,
                -9.0,
                1.0,
                1.0,
                1.0,
                1.0,
            ],
        );
        let rng = &mut Generator::new(3);
        assert_eq!(
            logits.sample_logits(0.0, None, None, rng).to_vec(),
            vec![1, 2, 0]
        );
        for _ in 0..20 {
            let top1 = logits.sample_logits(1.0, Some(1), None, rng).to_vec();
            // Equal logits all stay with top-k = 1 (as Hugging Face keeps ties with the k-th).
            assert!(matches!(top1[..], [1 | 2, 2, _]), "{top1:?}");
            let top0 = logits.sample_logits(1.0, None, Some(0.0), rng).to_vec();
            assert_eq!(
                top0,
                vec![1, 2, 0],
                "top-p 0 keeps the likeliest, lowest id first"
            );
        }
        // A 1-D row gives one id, a rank-0 tensor.
        let row = s.from_slice::<f32>(&[3], &[0.0, 5.0, 1.0]);
        let id = row.sample_logits(0.0, None, None, rng);
        assert_eq!((id.shape(), id.item()), (&[][..], 1));
    });
}

#[test]
fn the_same_seed_gives_the_same_ids() {
    test_pool(16).scope(|s| {
        let logits = s.randn::<f32>(&[64, 50], 1);
        let probs = (&logits).softmax(-1);
        let run = |rng: &mut Generator| {
            let a = logits.sample_logits(0.9, Some(20), Some(0.9), rng).to_vec();
            (a, probs.multinomial(3, false, rng).to_vec())
        };
        let first = run(&mut Generator::new(8));
        assert_eq!(run(&mut Generator::new(8)), first);
        assert_ne!(run(&mut Generator::new(9)), first);
        manual_seed(4);
        let thread = run(&mut Generator::from_thread());
        assert_ne!(run(&mut Generator::from_thread()), thread, "the next draw");
        manual_seed(4);
        assert_eq!(run(&mut Generator::from_thread()), thread);
    });
}

#[test]
fn multinomial_draws_at_the_rows_rates() {
    test_pool(16).scope(|s| {
        // Rows need not sum to 1.
        let weights = [0.2f32, 0.4, 0.0, 0.6, 0.8];
        let probs = weights.map(|w| f64::from(w) / 2.0);
        let x = s.from_slice::<f32>(&[2, 5], &weights.repeat(2));
        let ids = x.multinomial(10_000, true, &mut Generator::new(1));
        assert_eq!(ids.shape(), &[2, 10_000]);
        let ids = ids.to_vec();
        assert_frequencies("row 0", ids[..10_000].iter().copied(), &probs);
        assert_frequencies("row 1", ids[10_000..].iter().copied(), &probs);

        // Without replacement: the first draw at the rates, then each id at most once.
        let many = s.from_slice::<f32>(&[4000, 5], &weights.repeat(4000));
        let ids = many.multinomial(4, false, &mut Generator::new(2)).to_vec();
        for draw in ids.chunks_exact(4) {
            let mut sorted = draw.to_vec();
            sorted.sort_unstable();
            assert_eq!(sorted, vec![0, 1, 3, 4], "every positive id once");
        }
        assert_frequencies("first draws", ids.iter().step_by(4).copied(), &probs);
    });
}

#[test]
fn bad_settings_and_rows_are_invalid_arguments() {
    test_pool(16).scope(|s| {
        let logits = s.zeros::<f32>(&[2, 3]);
        let rng = &mut Generator::new(0);
        let invalid = |arg, reason: &str| Error::InvalidArgument {
            op: "sample_logits",
            arg,
            reason: reason.into(),
        };
        assert_eq!(
            logits.try_sample_logits(-1.0, None, None, rng).unwrap_err(),
            invalid("temperature", "-1 is not a finite number of at least 0")
        );
        assert_eq!(
            logits
                .try_sample_logits(1.0, Some(0), None, rng)
                .unwrap_err(),
            invalid("top_k", "0 keeps no token; None keeps them all")
        );
        assert_eq!(
            logits
                .try_sample_logits(1.0, None, Some(1.5), rng)
                .unwrap_err()
                .to_string(),
            "sample_logits: invalid top_p: 1.5 is outside [0, 1]"
        );
        let bad = s.from_slice::<f32>(&[2, 2], &[0.0, 1.0, f32::NEG_INFINITY, f32::NEG_INFINITY]);
        assert_eq!(
            bad.try_sample_logits(1.0, None, None, rng).unwrap_err(),
            invalid("logits", "row 1 has no finite logit")
        );
        let nan = s.from_slice::<f32>(&[2], &[0.0, f32::NAN]);
        assert_eq!(
            nan.try_sample_logits(1.0, None, None, rng).unwrap_err(),
            invalid("logits", "row 0 holds NaN")
        );
        assert_eq!(
            s.zeros::<f32>(&[])
                .try_sample_logits(1.0, None, None, rng)
                .unwrap_err(),
            Error::InvalidShape {
                op: "sample_logits",
                shape: Shape(vec![]),
                reason: "the last axis holds the classes; a rank-0 tensor has none".into()
            }
        );

        let multinomial = |data: &[f32], n, replacement| {
            let probs = s.from_slice::<f32>(&[2, 2], data);
            probs
                .try_multinomial(n, replacement, &mut Generator::new(0))
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            multinomial(&[0.5, 0.5, -0.1, 1.0], 1, true),
            "multinomial: invalid probabilities: row 1 holds -0.1; probabilities are finite and \
             at least 0"
        );
        assert_eq!(
            multinomial(&[0.5, 0.5, 0.0, 0.0], 1, true),
            "multinomial: invalid probabilities: row 1 sums to 0"
        );
        assert_eq!(
            multinomial(&[0.5, 0.5, 0.0, 1.0], 2, false),
            "multinomial: invalid n: 2 draws without replacement from row 1, which has 1 \
             positive probabilities"
        );
    });
}

#[test]
fn an_empty_class_axis_is_an_invalid_shape() {
    test_pool(16).scope(|s| {
        let rng = &mut Generator::new(0);
        for shape in [[2, 0], [0, 0]] {
            let x = s.zeros::<f32>(&shape);
            let empty = |op| Error::InvalidShape {
                op,
                shape: Shape(shape.to_vec()),
                reason: "the last axis holds the classes, and it is empty: there is no class to \
                         draw"
                    .into(),
            };
            assert_eq!(
                x.try_sample_logits(1.0, None, None, rng).unwrap_err(),
                empty("sample_logits")
            );
            for n in [0, 1] {
                assert_eq!(
                    x.try_multinomial(n, true, rng).unwrap_err(),
                    empty("multinomial")
                );
            }
        }
        // Rows of none: nothing drawn, no error.
        let none = s.zeros::<f32>(&[0, 3]);
        assert_eq!(none.sample_logits(1.0, None, None, rng).shape(), &[0]);
        assert_eq!(none.multinomial(2, true, rng).shape(), &[0, 2]);
    });
}

#[test]
fn multinomial_of_probabilities_whose_sum_overflows_draws_at_their_rates() {
    test_pool(16).scope(|s| {
        let rows = [
            ([f64::MAX, f64::MAX, 0.0], [0.5, 0.5, 0.0]),
            ([f64::MAX, f64::MAX / 2.0, f64::MAX], [0.4, 0.2, 0.4]),
        ];
        for (row, probs) in rows {
            let x = s.from_slice::<f64>(&[3], &row);
            let ids = x.multinomial(10_000, true, &mut Generator::new(3)).to_vec();
            assert_frequencies(&format!("{row:?}"), ids.into_iter(), &probs);
        }
        // Without replacement every positive class comes once, whatever its scale.
        let x = s.from_slice::<f64>(&[3], &[f64::MAX, 1.0, f64::MAX]);
        let mut ids = x.multinomial(3, false, &mut Generator::new(4)).to_vec();
        ids.sort_unstable();
        assert_eq!(ids, [0, 1, 2]);
    });
}
