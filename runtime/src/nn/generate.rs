//! Text generation with a key/value cache: a [`CausalLm`] reads each prompt once (its prefill),
//! then every sequence of the batch one token per step, each step in a scope of its own.

use std::time::{Duration, Instant};

use super::kv_cache::KvCache;
use crate::error::{Error, Result};
use crate::init::Generator;
use crate::ops::sample::check_sampling;
use crate::scope::{Scope, ScopeStats};
use crate::tensor::Tensor;

/// The caches a [`CausalLm`] decodes with: one [`KvCache`] per layer, each position `kv_heads`
/// keys and values of `head_dim` elements, at most `max_positions` positions per sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLayout {
    /// Attention layers (caches).
    pub layers: usize,
    /// Key/value heads per position.
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Positions the model has position embeddings for.
    pub max_positions: usize,
}

impl CacheLayout {
    /// Checks the arguments of a [`CausalLm::forward_cached`] of a model of this layout, `op`
    /// naming it in the errors: `ids` of shape `[rows, t]`, `keep` at most `t`, one cache per
    /// layer. Returns `(rows, t)`. Fails with [`Error::InvalidShape`] for `ids` of another rank
    /// and with [`Error::InvalidArgument`] for the others.
    pub fn check_forward(
        &self,
        op: &'static str,
        ids: &[usize],
        caches: usize,
        keep: usize,
    ) -> Result<(usize, usize)> {
        let &[rows, t] = ids else {
            return Err(Error::InvalidShape {
                op,
                shape: ids.into(),
                reason: "token ids are [rows, t]".into(),
            });
        };
        let invalid = |arg, reason: String| Error::InvalidArgument { op, arg, reason };
        if keep > t {
            return Err(invalid(
                "keep",
                format!("{keep} positions of {t} asked for"),
            ));
        }
        if caches != self.layers {
            let reason = format!("{caches} caches for {} layers", self.layers);
            return Err(invalid("caches", reason));
        }
        Ok((rows, t))
    }
}

/// A decoder-only language model that reads tokens after those its key/value caches hold.
pub trait CausalLm {
    /// The caches it decodes with.
    fn cache_layout(&self) -> CacheLayout;

    /// The logits of the last `keep` positions of `ids` (`[rows, t]`), `[rows, keep, vocab]`,
    /// rented in `scope`, appending the keys and values of the `t` tokens to `caches` (one per
    /// layer): `ids` are the tokens after those the caches hold, for every sequence of their
    /// batch (`seq` is `None`, `rows` the batch) or for sequence `seq` alone (`rows` is 1; a
    /// prompt's prefill). An implementation fails with an error, not a panic, for `ids` of
    /// another rank, a `keep` above `t`, or caches that do not match its layers.
    fn forward_cached<'a, 'c: 'a>(
        &self,
        scope: &Scope<'a, '_>,
        ids: &Tensor<'a, i64>,
        caches: &mut [KvCache<'c>],
        seq: Option<usize>,
        keep: usize,
    ) -> Result<Tensor<'a>>;
}

/// How the next token is chosen from the logits, as Hugging Face's `generate` samples
/// ([`Tensor::sample_logits`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sampling {
    /// The logits are divided by it; 0 is greedy (the largest logit, nothing drawn).
    pub temperature: f32,
    /// Only the `k` most likely tokens are kept.
    pub top_k: Option<usize>,
    /// Only the most likely tokens whose probabilities add up to `p` are kept (nucleus).
    pub top_p: Option<f32>,
    /// The seed of the draws: a generation is reproducible.
    pub seed: u64,
}

impl Default for Sampling {
    /// [`Sampling::GREEDY`].
    fn default() -> Self {
        Sampling::GREEDY
    }
}

impl Sampling {
    /// The most likely token every step.
    pub const GREEDY: Sampling = Sampling {
        temperature: 0.0,
        top_k: None,
        top_p: None,
        seed: 0,
    };
}

/// What [`generate`] does: how many tokens, how they are chosen, when a sequence stops.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOptions {
    /// Tokens generated per prompt at most.
    pub max_new_tokens: usize,
    /// How each token is chosen.
    pub sampling: Sampling,
    /// A sequence stops after generating one of these (which ends its tokens).
    pub stop_tokens: Vec<i64>,
}

impl GenerateOptions {
    /// `max_new_tokens` greedy tokens per prompt, no stop token.
    pub fn greedy(max_new_tokens: usize) -> Self {
        GenerateOptions {
            max_new_tokens,
            sampling: Sampling::GREEDY,
            stop_tokens: Vec::new(),
        }
    }
}

/// What [`generate`] made, and what it took.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Generation {
    /// The new tokens of each prompt, in the prompts' order (a stop token ends a sequence's).
    pub tokens: Vec<Vec<i64>>,
    /// The prompts' forwards and their first tokens: the time to the batch's first tokens.
    pub prefill: Duration,
    /// The decode steps: one forward of every sequence each, those that stopped included (their
    /// rows are computed and their tokens dropped: the batch keeps its shape).
    pub decode: Duration,
    /// Decode steps run.
    pub steps: usize,
    /// The pool bytes of the caches, rented for the whole generation.
    pub cache_bytes: usize,
    /// The most pool bytes one forward's own scope held at once (a prefill's or a step's
    /// temporaries, its logits and sampled ids included). Buffers of scopes the model opens
    /// inside its forward are counted there, not here: for a model that opens none, the
    /// generation's peak is `cache_bytes` plus this.
    pub step_peak_bytes: usize,
}

/// Generates up to `options.max_new_tokens` tokens after each of `prompts` with `model`, in a
/// child scope of `scope` (under its budget): the caches for the whole batch are rented first,
/// the prompts are read in one forward if they have one length and else each in a forward of its
/// own (prompts of different lengths need no padding), then every sequence still going gets one
/// token per step, all in one forward per step (a sequence that stopped stays in the step's batch,
/// its token dropped). Each forward runs in a scope of its own, so a step holds only the caches
/// and its own temporaries; a steady-state step makes no heap allocation.
///
/// Fails, before renting anything, with [`Error::InvalidArgument`] for no prompt, an empty prompt,
/// a prompt that with its new tokens would pass the model's positions, or sampling settings
/// [`Tensor::sample_logits`] refuses; with a budget error if the caches do not fit (or
/// [`Error::SizeOverflow`] if their size does not fit in memory at all); with
/// [`Error::InvalidArgument`] naming `max_new_tokens` if the room for the tokens cannot be
/// reserved; and with the model's errors. Nothing is allocated by the count `max_new_tokens`
/// before the caches it sizes are rented under the budget.
pub fn generate<M: CausalLm + ?Sized>(
    model: &M,
    scope: &Scope<'_, '_>,
    prompts: &[&[i64]],
    options: &GenerateOptions,
) -> Result<Generation> {
    let layout = model.cache_layout();
    let invalid = |reason: String| Error::InvalidArgument {
        op: "generate",
        arg: "prompts",
        reason,
    };
    if prompts.is_empty() {
        return Err(invalid("no prompt given".into()));
    }
    if let Some(i) = prompts.iter().position(|p| p.is_empty()) {
        return Err(invalid(format!("prompt {i} is empty")));
    }
    let longest = prompts.iter().map(|p| p.len()).max().unwrap_or(0);
    let max_len = longest.saturating_add(options.max_new_tokens);
    if max_len > layout.max_positions {
        return Err(invalid(format!(
            "the longest prompt ({longest} tokens) and {} new tokens pass the model's {} positions",
            options.max_new_tokens, layout.max_positions
        )));
    }
    let sampling = options.sampling;
    let (t, k, p) = (sampling.temperature, sampling.top_k, sampling.top_p);
    check_sampling("generate", t, k, p)?;
    let batch = prompts.len();
    let mut rng = Generator::new(sampling.seed);
    let mut seqs = Sequences {
        tokens: vec![Vec::new(); batch],
        going: vec![options.max_new_tokens > 0; batch],
        last: vec![0; batch],
    };
    let start = Instant::now();
    let (mut cache_bytes, mut step_peak_bytes) = (0, 0);
    let result = scope.scope(|s| -> Result<(Duration, usize)> {
        let mut caches = (0..layout.layers)
            .map(|_| KvCache::try_new(s, batch, layout.kv_heads, max_len, layout.head_dim))
            .collect::<Result<Vec<_>>>()?;
        cache_bytes = caches.iter().map(KvCache::allocated_bytes).sum();
        // Reserved only now that the caches fit the budget: a cache holds at least 8 bytes a
        // position (a key and a value of one `f32`), as much as a token, so the budget bounds the
        // reservation too. With no cache (a model without attention) the allocator bounds it,
        // through `try_reserve`: a count no host can hold is an error, not an abort. Reserved
        // whole, so that no decode step reallocates.
        seqs.reserve(options.max_new_tokens)?;
        let mut step = |result: Result<()>, stats: ScopeStats| {
            step_peak_bytes = step_peak_bytes.max(stats.peak_bytes_in_use);
            result
        };
        let mut forward = Forward {
            model,
            caches: &mut caches,
            sampling,
            rng: &mut rng,
            options,
        };
        let same_length = prompts.iter().all(|p| p.len() == prompts[0].len());
        if !seqs.going[0] {
            // Nothing to generate.
        } else if same_length {
            // One forward for the batch: larger products, and no padding to need one.
            let len = prompts[0].len();
            let (result, stats) = s.scope_with_stats(|p| {
                let ids = p.try_rent_with::<i64>(&[batch, len], |mut ids| {
                    let ids = ids.as_slice_mut().expect("a fresh tensor is row-major");
                    for (row, prompt) in ids.chunks_exact_mut(len).zip(prompts) {
                        row.copy_from_slice(prompt);
                    }
                })?;
                forward.run(p, &ids, None, &mut seqs)
            });
            step(result, stats)?;
        } else {
            for (seq, prompt) in prompts.iter().enumerate() {
                let (result, stats) = s.scope_with_stats(|p| {
                    let ids = p.try_from_slice::<i64>(&[1, prompt.len()], prompt)?;
                    forward.run(p, &ids, Some(seq), &mut seqs)
                });
                step(result, stats)?;
            }
        }
        let prefill = start.elapsed();
        let mut steps = 0;
        while seqs.going.contains(&true) {
            let (result, stats) = s.scope_with_stats(|p| {
                let ids = p.try_from_slice::<i64>(&[batch, 1], &seqs.last)?;
                forward.run(p, &ids, None, &mut seqs)
            });
            step(result, stats)?;
            steps += 1;
        }
        Ok((prefill, steps))
    });
    let (prefill, steps) = result?;
    Ok(Generation {
        tokens: seqs.tokens,
        prefill,
        decode: start.elapsed() - prefill,
        steps,
        cache_bytes,
        step_peak_bytes,
    })
}

/// The sequences of a generation: the tokens each has made, whether it goes on, its last token.
struct Sequences {
    tokens: Vec<Vec<i64>>,
    going: Vec<bool>,
    last: Vec<i64>,
}

impl Sequences {
    /// Reserves room for `n` tokens in every sequence; [`Error::InvalidArgument`] naming
    /// `max_new_tokens` if the allocator cannot give it.
    fn reserve(&mut self, n: usize) -> Result<()> {
        for tokens in &mut self.tokens {
            tokens
                .try_reserve_exact(n)
                .map_err(|e| Error::InvalidArgument {
                    op: "generate",
                    arg: "max_new_tokens",
                    reason: format!("room for {n} tokens per prompt cannot be reserved: {e}"),
                })?;
        }
        Ok(())
    }

    /// Sequence `seq` made token `id`: it stops at `options`' length or at a stop token.
    fn take(&mut self, seq: usize, id: i64, options: &GenerateOptions) {
        let tokens = &mut self.tokens[seq];
        tokens.push(id);
        self.last[seq] = id;
        self.going[seq] =
            tokens.len() < options.max_new_tokens && !options.stop_tokens.contains(&id);
    }
}

/// What each forward of a generation uses.
struct Forward<'m, 'c, 'x, M: ?Sized> {
    model: &'m M,
    caches: &'x mut [KvCache<'c>],
    sampling: Sampling,
    rng: &'x mut Generator,
    options: &'m GenerateOptions,
}

impl<'c, M: CausalLm + ?Sized> Forward<'_, 'c, '_, M> {
    /// Reads `ids` (`[rows, t]`) after what the caches hold, for sequence `seq` alone or for
    /// every one, and gives each of those sequences still going its next token.
    fn run<'a>(
        &mut self,
        scope: &Scope<'a, '_>,
        ids: &Tensor<'a, i64>,
        seq: Option<usize>,
        seqs: &mut Sequences,
    ) -> Result<()>
    where
        'c: 'a,
    {
        let logits = self.model.forward_cached(scope, ids, self.caches, seq, 1)?;
        // What the model returned decides which sequence each id goes to: a wrong shape would
        // give one sequence another's token, or index past the batch.
        if !matches!(logits.shape(), &[rows, 1, _] if rows == ids.shape()[0]) {
            return Err(Error::InvalidShape {
                op: "generate",
                shape: logits.shape().into(),
                reason: format!(
                    "the model's logits must be [rows, 1, vocab], one row per row of the ids \
                     (of shape {:?}) and the last position only",
                    ids.shape()
                ),
            });
        }
        let s = self.sampling;
        let next = logits.try_sample_logits(s.temperature, s.top_k, s.top_p, self.rng)?;
        let next = next.as_slice().expect("sampled ids are a fresh tensor");
        for (row, &id) in next.iter().enumerate() {
            let seq = seq.unwrap_or(row);
            if seqs.going[seq] {
                seqs.take(seq, id, self.options);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Pool;

    /// A model of `layers` layers of one key/value head of one element, as many positions as
    /// `usize` counts, whose logits always make token 1 the most likely of 2; with `extra`, its
    /// logits have that many rows and positions more than asked for (a model's defect).
    struct Unbounded {
        layers: usize,
        extra: [usize; 2],
    }

    impl CausalLm for Unbounded {
        fn cache_layout(&self) -> CacheLayout {
            CacheLayout {
                layers: self.layers,
                kv_heads: 1,
                head_dim: 1,
                max_positions: usize::MAX,
            }
        }

        fn forward_cached<'a, 'c: 'a>(
            &self,
            scope: &Scope<'a, '_>,
            ids: &Tensor<'a, i64>,
            caches: &mut [KvCache<'c>],
            _seq: Option<usize>,
            keep: usize,
        ) -> Result<Tensor<'a>> {
            let (rows, _) =
                self.cache_layout()
                    .check_forward("Unbounded", ids.shape(), caches.len(), keep)?;
            let [rows, keep] = [rows + self.extra[0], keep + self.extra[1]];
            let logits: Vec<f32> = (0..rows * keep).flat_map(|_| [0.0, 1.0]).collect();
            scope.try_from_slice(&[rows, keep, 2], &logits)
        }
    }

    fn generate_with(layers: usize, max_new_tokens: usize) -> Result<Generation> {
        let pool = Pool::with_max_memory_mb(16);
        let model = Unbounded {
            layers,
            extra: [0, 0],
        };
        pool.scope(|s| generate(&model, s, &[&[0]], &GenerateOptions::greedy(max_new_tokens)))
    }

    #[test]
    fn a_huge_max_new_tokens_is_refused_by_the_budget_or_the_allocator() {
        // Caches of 2^40 positions: the budget refuses them, before the tokens' room (8 TiB) is
        // asked of the allocator.
        let e = generate_with(1, 1 << 40).unwrap_err();
        assert!(matches!(e, Error::BudgetExceeded { .. }), "{e}");
        assert!(e.to_string().contains("limit 16777216 bytes"), "{e}");
        // A cache of `usize::MAX` positions has a byte size past any memory.
        let e = generate_with(1, usize::MAX - 1).unwrap_err();
        assert!(matches!(e, Error::SizeOverflow { .. }), "{e}");
        // No cache to bound it: the reservation itself fails, naming the count.
        let e = generate_with(0, usize::MAX - 1).unwrap_err();
        let Error::InvalidArgument { arg, reason, .. } = &e else {
            panic!("{e}")
        };
        assert_eq!(*arg, "max_new_tokens");
        assert!(reason.contains("capacity exceeded"), "{e}");
    }

    #[test]
    fn a_model_without_caches_generates_its_tokens() {
        let g = generate_with(0, 3).unwrap();
        assert_eq!(g.tokens, [[1, 1, 1]]);
        assert_eq!((g.steps, g.cache_bytes), (2, 0));
    }

    #[test]
    fn logits_of_another_shape_than_the_ids_ask_for_are_an_error_naming_it() {
        let pool = Pool::with_max_memory_mb(16);
        for extra in [[1, 0], [0, 1]] {
            let model = Unbounded { layers: 1, extra };
            let prompts: [&[i64]; 2] = [&[0, 1], &[0]];
            let e = pool
                .scope(|s| generate(&model, s, &prompts, &GenerateOptions::greedy(3)))
                .unwrap_err();
            let Error::InvalidShape { op, shape, .. } = &e else {
                panic!("{e}")
            };
            assert_eq!(*op, "generate");
            // The first forward is the prefill of the first prompt alone: one row.
            assert_eq!(shape.0[..2], [1 + extra[0], 1 + extra[1]], "{e}");
        }
    }
}
