//! Seeded sampling for generation: [`Tensor::multinomial`] draws ids from probabilities, and
//! [`Tensor::sample_logits`] draws the next token from logits as Hugging Face's generation does
//! (temperature, then top-k, then top-p). Both take a [`Generator`]: `&mut Generator::new(seed)`
//! for a fixed seed, `&mut Generator::from_thread()` for the thread's generator
//! ([`manual_seed`](crate::manual_seed)). The same generator state gives the same ids. Their
//! outputs are `i64` ids, with no gradient. The inputs are checked whole before anything is
//! rented or drawn; the arithmetic is in `f64`.

use std::cmp::Ordering;

use ndarray::{Axis, Dimension, IxDyn, RemoveAxis};

use super::work;
use crate::element::{DType, Element};
use crate::error::{panicking, Error, Result, Shape};
use crate::init::Generator;
use crate::tensor::Tensor;

/// Checks the settings of [`Tensor::sample_logits`] for `op`: a finite `temperature` of at least 0,
/// a `top_k` other than 0, a `top_p` in `[0, 1]`.
pub(crate) fn check_sampling(
    op: &'static str,
    temperature: f32,
    top_k: Option<usize>,
    top_p: Option<f32>,
) -> Result<()> {
    let invalid = |arg, reason: String| Error::InvalidArgument { op, arg, reason };
    if !(temperature >= 0.0 && temperature.is_finite()) {
        let reason = format!("{temperature} is not a finite number of at least 0");
        return Err(invalid("temperature", reason));
    }
    if top_k == Some(0) {
        return Err(invalid(
            "top_k",
            "0 keeps no token; None keeps them all".into(),
        ));
    }
    if let Some(p) = top_p.filter(|p| !(0.0..=1.0).contains(p)) {
        return Err(invalid("top_p", format!("{p} is outside [0, 1]")));
    }
    Ok(())
}

/// One draw from `weights` (non-negative, summing to `total` > 0, added in order): the first
/// position whose running sum passes a uniform draw in `[0, total)`, so a zero weight is never
/// drawn. A draw that rounding puts at `total` takes the last positive weight.
fn draw(weights: &[f64], total: f64, rng: &mut Generator) -> usize {
    let u = rng.next_f64() * total;
    let mut sum = 0.0;
    for (i, &w) in weights.iter().enumerate() {
        sum += w;
        if sum > u {
            return i;
        }
    }
    weights
        .iter()
        .rposition(|&w| w > 0.0)
        .expect("a positive weight")
}

/// What a row of probabilities (finite, at least 0, one positive) is divided by so that its sum
/// stays finite: 1, unless the sum in `f64` overflows (`[f64::MAX, f64::MAX]`), then its largest
/// value, so that every weight is at most 1 and the sum at most the row's length. Dividing only
/// then keeps the draws of every other row as they were.
fn row_divisor<T: Element>(row: &[T]) -> f64 {
    let sum: f64 = row.iter().map(|&p| DType::to_f64(p)).sum();
    match sum.is_finite() {
        true => 1.0,
        false => row.iter().map(|&p| DType::to_f64(p)).fold(0.0, f64::max),
    }
}

/// The weight a draw gives probability `p` of a row whose [`row_divisor`] is `divisor`.
fn weight<T: Element>(p: T, divisor: f64) -> f64 {
    DType::to_f64(p) / divisor
}

impl<'s, T: Element> Tensor<'s, T> {
    /// `n` ids drawn from each row of probabilities `[.., classes]` (PyTorch's
    /// `torch.multinomial`): the result is `[.., n]`, `i64`. The rows need not sum to 1 (each is
    /// divided by its sum); with `replacement` an id may come again, without it each draw excludes
    /// the ids drawn before in its row. Draws come from `rng`, row after row; a row whose sum overflows
    /// (`[f64::MAX, f64::MAX]`) is first divided by its largest value. Fails with
    /// [`Error::InvalidShape`] for a tensor of rank 0 or with no class (an empty last axis), and
    /// with [`Error::InvalidArgument`] for a row holding a negative or non-finite value or summing to 0, or, without replacement, for
    /// more draws than a row has positive probabilities.
    ///
    /// ```
    /// use tensorscope::{Generator, Pool};
    /// let pool = Pool::with_max_memory_mb(16);
    /// pool.scope(|s| {
    ///     let probs = s.from_slice::<f32>(&[2, 3], &[0.0, 1.0, 0.0, 0.5, 0.0, 0.5]);
    ///     let ids = probs.multinomial(4, true, &mut Generator::new(7)).to_vec();
    ///     assert_eq!(ids[..4], [1, 1, 1, 1]);
    ///     assert!(ids[4..].iter().all(|&id| id == 0 || id == 2));
    ///     let both = probs.narrow(0, 1, 1).multinomial(2, false, &mut Generator::new(7));
    ///     assert!(matches!(both.to_vec()[..], [0, 2] | [2, 0]));
    /// });
    /// ```
    pub fn try_multinomial(
        &self,
        n: usize,
        replacement: bool,
        rng: &mut Generator,
    ) -> Result<Tensor<'s, i64>> {
        let op = "multinomial";
        let classes = self.last_axis(op)?;
        // Read row by row: a view (`logits.narrow(1, t - 1, 1)`) is copied first.
        let values = self.try_contiguous()?;
        let invalid = |arg, reason| Error::InvalidArgument { op, arg, reason };
        for (r, row) in values.slice().chunks_exact(classes).enumerate() {
            if let Some(&v) = row.iter().find(|&&v| !(v >= T::zero() && v.is_finite())) {
                let reason = format!("row {r} holds {v}; probabilities are finite and at least 0");
                return Err(invalid("probabilities", reason));
            }
            // Counted as drawn: a value that the row's divisor takes to 0 is never drawn.
            let divisor = row_divisor(row);
            let positive = row.iter().filter(|&&v| weight(v, divisor) > 0.0).count();
            if positive == 0 {
                return Err(invalid("probabilities", format!("row {r} sums to 0")));
            }
            if !replacement && n > positive {
                let reason = format!(
                    "{n} draws without replacement from row {r}, which has {positive} positive \
                     probabilities"
                );
                return Err(invalid("n", reason));
            }
        }
        let mut shape = IxDyn(self.shape());
        shape[self.ndim() - 1] = n;
        let mut out = Tensor::<i64>::try_rent_in(&self.rents_in, shape.slice())?;
        if out.is_empty() {
            return Ok(out);
        }
        let mut scratch = Tensor::<f64>::try_rent_in(&self.rents_in, &[classes])?;
        let weights = scratch.unique_slice_mut();
        work::visit(out.len());
        let rows = values.slice().chunks_exact(classes);
        for (ids, row) in out.unique_slice_mut().chunks_exact_mut(n).zip(rows) {
            let divisor = row_divisor(row);
            weights
                .iter_mut()
                .zip(row)
                .for_each(|(w, &p)| *w = weight(p, divisor));
            for id in ids {
                let i = draw(weights, weights.iter().sum(), rng);
                *id = i as i64;
                if !replacement {
                    weights[i] = 0.0;
                }
            }
        }
        Ok(out)
    }

    /// The next token of each row of logits `[.., vocab]`, drawn as Hugging Face's generation
    /// samples it: the logits divided by `temperature`; with `top_k`, only the `k` largest kept
    /// (and any equal to the `k`-th); with `top_p` below 1, only the smallest set of the most
    /// likely of those whose probabilities add up to at least `top_p` (nucleus sampling; always at
    /// least one token; equal probabilities taken lower id first); then one id drawn from the
    /// softmax of what is kept. A `temperature` of 0 is greedy: the id of the largest logit (the
    /// first of equal ones), nothing drawn. The result is `[..]` (the leading axes), `i64`; a
    /// removed token is never drawn. Logits may be `-inf` (a masked token). Fails with
    /// [`Error::InvalidShape`] for a tensor of rank 0 or with no token (an empty last axis), and
    /// with [`Error::InvalidArgument`] for a negative or non-finite `temperature`, a `top_k` of 0, a `top_p` outside `[0, 1]`, or a row
    /// holding NaN or `+inf`, or no finite logit.
    ///
    /// ```
    /// use tensorscope::{Generator, Pool};
    /// let pool = Pool::with_max_memory_mb(16);
    /// pool.scope(|s| {
    ///     let logits = s.from_slice::<f32>(&[2, 4], &[0.0, 3.0, 1.0, 2.9, 5.0, 1.0, 0.0, 4.0]);
    ///     let mut rng = Generator::new(1);
    ///     assert_eq!(logits.sample_logits(0.0, None, None, &mut rng).to_vec(), vec![1, 0]);
    ///     let ids = logits.sample_logits(1.0, Some(2), None, &mut rng).to_vec();
    ///     assert!(matches!(ids[..], [1 | 3, 0 | 3]));
    /// });
    /// ```
    pub fn try_sample_logits(
        &self,
        temperature: f32,
        top_k: Option<usize>,
        top_p: Option<f32>,
        rng: &mut Generator,
    ) -> Result<Tensor<'s, i64>> {
        let op = "sample_logits";
        let invalid = |arg, reason: &str| Error::InvalidArgument {
            op,
            arg,
            reason: reason.into(),
        };
        check_sampling(op, temperature, top_k, top_p)?;
        let vocab = self.last_axis(op)?;
        // Read row by row: a view (`logits.narrow(1, t - 1, 1)`) is copied first.
        let values = self.try_contiguous()?;
        for (r, row) in values.slice().chunks_exact(vocab).enumerate() {
            if let Some(&v) = row.iter().find(|&&v| v.is_nan() || v == T::infinity()) {
                return Err(invalid("logits", &format!("row {r} holds {v}")));
            }
            if row.iter().all(|v| v.is_infinite()) {
                return Err(invalid("logits", &format!("row {r} has no finite logit")));
            }
        }
        let shape = IxDyn(self.shape()).remove_axis(Axis(self.ndim() - 1));
        let mut out = Tensor::<i64>::try_rent_in(&self.rents_in, shape.slice())?;
        if out.is_empty() {
            return Ok(out);
        }
        let mut weights = Tensor::<f64>::try_rent_in(&self.rents_in, &[vocab])?;
        let filter = top_k.is_some() || top_p.is_some_and(|p| p < 1.0);
        let mut order =
            Tensor::<i64>::try_rent_in(&self.rents_in, &[if filter { vocab } else { 0 }])?;
        let (weights, order) = (weights.unique_slice_mut(), order.unique_slice_mut());
        work::visit(out.len());
        let rows = values.slice().chunks_exact(vocab);
        for (id, row) in out.unique_slice_mut().iter_mut().zip(rows) {
            let logits = || row.iter().map(|&v| DType::to_f64(v));
            let max = logits().fold(f64::NEG_INFINITY, f64::max);
            if temperature == 0.0 {
                *id = logits().position(|v| v == max).expect("a finite logit") as i64;
                continue;
            }
            // Unnormalized probabilities: exp((logit - max) / temperature), in (0, 1].
            let t = f64::from(temperature);
            weights
                .iter_mut()
                .zip(logits())
                .for_each(|(w, v)| *w = ((v - max) / t).exp());
            if filter {
                keep_top(weights, order, top_k, top_p.map(f64::from));
            }
            *id = draw(weights, weights.iter().sum(), rng) as i64;
        }
        Ok(out)
    }

    panicking! {
        /// `n` ids drawn from each row of probabilities.
        pub fn multinomial(&self, n: usize, replacement: bool, rng: &mut Generator) -> Tensor<'s, i64> = try_multinomial;
        /// The next token of each row of logits.
        pub fn sample_logits(&self, temperature: f32, top_k: Option<usize>, top_p: Option<f32>, rng: &mut Generator) -> Tensor<'s, i64> = try_sample_logits;
    }

    /// The length of the last axis, the one sampled from; [`Error::InvalidShape`] naming `op` for
    /// a tensor of rank 0 or an empty last axis (with rows or without: there is no class to draw).
    fn last_axis(&self, op: &'static str) -> Result<usize> {
        let invalid = |reason: &str| Error::InvalidShape {
            op,
            shape: Shape::from(self.shape()),
            reason: reason.into(),
        };
        match self.shape().last() {
            None => Err(invalid(
                "the last axis holds the classes; a rank-0 tensor has none",
            )),
            Some(0) => Err(invalid(
                "the last axis holds the classes, and it is empty: there is no class to draw",
            )),
            Some(&classes) => Ok(classes),
        }
    }
}

/// Zeroes the weights (unnormalized probabilities) of the tokens that top-k and top-p remove, as
/// Hugging Face's `TopKLogitsWarper` then `TopPLogitsWarper` do: top-k keeps the `k` largest
/// and any equal to the `k`-th; top-p (below 1) keeps, in decreasing order, each token whose
/// predecessors hold less than `p` of the kept mass (the smallest set reaching `p`, at least
/// one). `order` is scratch for the tokens sorted by decreasing weight, ties lower id first.
fn keep_top(weights: &mut [f64], order: &mut [i64], top_k: Option<usize>, top_p: Option<f64>) {
    order
        .iter_mut()
        .enumerate()
        .for_each(|(i, o)| *o = i as i64);
    let weight = |i: &i64| weights[*i as usize];
    order.sort_unstable_by(|a, b| {
        weight(b)
            .partial_cmp(&weight(a))
            .unwrap_or(Ordering::Equal)
            .then(a.cmp(b))
    });
    if let Some(k) = top_k.filter(|&k| k < order.len()) {
        let kth = weight(&order[k - 1]);
        for &i in &order[k..] {
            if weights[i as usize] < kth {
                weights[i as usize] = 0.0;
            }
        }
    }
    if let Some(p) = top_p.filter(|&p| p < 1.0) {
        let total: f64 = weights.iter().sum();
        let mut before = 0.0;
        for (rank, &i) in order.iter().enumerate() {
            let w = &mut weights[i as usize];
            if rank > 0 && before >= p * total {
                *w = 0.0;
            }
            before += *w;
        }
    }
}
