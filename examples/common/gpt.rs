//! A GPT-2-style decoder written with tensorscope's ops: token and position embeddings, pre-LayerNorm
//! blocks of causal multi-head attention (from one fused qkv projection) and a GELU MLP, a final
//! LayerNorm and an LM head tied to the token embedding, read in place (`h.matmul(&wte.t())`), or,
//! by [`Gpt::tie_head`], a field of its own holding the same parameter (tied fields). Every
//! forward is `#[dispose_scope]`; the block loop is also written with `#[checkpoint]` for training,
//! and the model decodes through a key/value cache per block (`CausalLm`, for `nn::generate`).
//!
//! Parameter names are the structs' field paths (`#[derive(Parameters)]`), renamed where GPT-2's
//! differ (`h.0.attn.c_attn.weight`), so the model loads and saves `scripts/gpt_fixture.py`'s files by
//! itself; [`Gpt::load`] transposes the Linear weights from PyTorch's `[out, in]` to `[in, out]`.
//!
//! Shared by `examples/gpt.rs` and `tests/integration/gpt_parity.rs` through `#[path]`.

#![allow(dead_code)] // each user needs a different part

use std::path::Path;

use tensorscope::nn::{CacheLayout, CausalLm, KvCache, LoadOptions, NnError};
use tensorscope::ops::AttentionOptions;
use tensorscope::prelude::*;
use tensorscope::{Checkpointer, ParamPath, Parameters, Result};

/// The model's sizes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Config {
    pub(crate) vocab: usize,
    pub(crate) n_ctx: usize,
    pub(crate) dim: usize,
    pub(crate) heads: usize,
    pub(crate) layers: usize,
    pub(crate) eps: f32,
    /// How the blocks compute their attention.
    pub(crate) attention: Attention,
}

/// The two forms of the blocks' attention: the same values, to rounding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attention {
    /// `scaled_dot_product_attention`: no `[b, h, t, t]` matrix made or kept.
    Fused,
    /// `matmul`, `masked_fill` of the future, `softmax`, `matmul`: scores and probabilities made,
    /// and kept for the backward.
    Unfused,
}

impl Attention {
    /// Causal attention of `q`, `k` and `v` (`[b, h, t, d]`) in this form; the unfused form reads
    /// `future` (at least `[t, t]`, 1 above the diagonal) for its mask.
    pub(crate) fn apply<'a>(
        self,
        (q, k, v): (&Tensor<'a>, &Tensor<'a>, &Tensor<'a>),
        future: &Param<u8>,
    ) -> Tensor<'a> {
        let &[.., t, d] = q.shape() else {
            panic!("attention takes [.., t, d], got {:?}", q.shape())
        };
        match self {
            Attention::Fused => {
                let causal = AttentionOptions {
                    causal: true,
                    ..AttentionOptions::default()
                };
                q.scaled_dot_product_attention(k, v, causal)
            }
            Attention::Unfused => {
                let mask = q.bind(future).narrow(0, 0, t).narrow(1, 0, t);
                let scores = q.matmul(&k.t()) * (1.0 / (d as f32).sqrt()); // [.., t, t]
                let weights = scores.masked_fill(&mask, f32::NEG_INFINITY).softmax(-1);
                weights.matmul(v)
            }
        }
    }
}

impl Config {
    /// The tiny model of the committed fixture.
    pub(crate) const TINY: Config = Config {
        vocab: 96,
        n_ctx: 16,
        dim: 32,
        heads: 4,
        layers: 2,
        eps: 1e-5,
        attention: Attention::Fused,
    };
}

/// Whether the parameter `name` is an `nn.Linear` weight (stored `[out, in]` by PyTorch).
pub(crate) fn is_linear_weight(name: &str) -> bool {
    name.ends_with(".weight") && (name.contains(".attn.") || name.contains(".mlp."))
}

/// A LayerNorm's scale and shift.
#[derive(Parameters)]
pub(crate) struct Norm {
    weight: Param,
    bias: Param,
}

impl Norm {
    #[dispose_scope]
    fn forward<'a>(&self, x: &Tensor<'a>, eps: f32) -> Tensor<'a> {
        x.layer_norm(eps) * &self.weight + &self.bias
    }
}

/// `x W + b`, with `W` as `[in, out]`.
#[derive(Parameters)]
pub(crate) struct Dense {
    weight: Param,
    bias: Param,
}

impl Dense {
    #[dispose_scope]
    fn forward<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        x.matmul(&self.weight) + &self.bias
    }
}

/// One pre-LayerNorm block.
#[derive(Parameters)]
pub(crate) struct Block {
    ln_1: Norm,
    #[param(rename = "attn.c_attn")]
    c_attn: Dense,
    #[param(rename = "attn.c_proj")]
    c_proj: Dense,
    ln_2: Norm,
    #[param(rename = "mlp.c_fc")]
    c_fc: Dense,
    #[param(rename = "mlp.c_proj")]
    mlp_proj: Dense,
    #[param(skip)]
    heads: usize,
    #[param(skip)]
    eps: f32,
    #[param(skip)]
    attention: Attention,
}

impl Block {
    /// `x + attn(ln_1(x))`, then `+ mlp(ln_2(.))`; `future` marks the positions a query must not
    /// see (`[n_ctx, n_ctx]`, 1 above the diagonal).
    #[dispose_scope]
    pub(crate) fn forward<'a>(&self, x: &Tensor<'a>, future: &Param<u8>) -> Tensor<'a> {
        let a = self.attention(&self.ln_1.forward(x, self.eps), |q, k, v| {
            Ok(self.attention.apply((q, k, v), future))
        });
        self.mlp(x + &a.expect("the uncached attention returns its tensor"))
    }

    /// The block over the tokens after those `cache` holds (of every sequence, or of `seq`),
    /// their keys and values appended to it.
    pub(crate) fn forward_cached<'a, 'c: 'a>(
        &self,
        x: &Tensor<'a>,
        cache: &mut KvCache<'c>,
        seq: Option<usize>,
    ) -> Result<Tensor<'a>> {
        let attend = |q: &Tensor<'a>, k: &Tensor<'a>, v: &Tensor<'a>| match seq {
            Some(seq) => {
                cache.try_append_to(seq, k, v)?;
                cache.try_attend_to(seq, q, None)
            }
            None => {
                cache.try_append(k, v)?;
                cache.try_attend(q, None)
            }
        };
        let a = self.attention(&self.ln_1.forward(x, self.eps), attend)?;
        Ok(self.mlp(x + &a))
    }

    /// `h + mlp(ln_2(h))`, in the caller's scope.
    fn mlp<'a>(&self, h: Tensor<'a>) -> Tensor<'a> {
        let m = self.c_fc.forward(&self.ln_2.forward(&h, self.eps)).gelu();
        h + &self.mlp_proj.forward(&m)
    }

    /// Multi-head self-attention over `[batch, t, dim]`: the heads of q, k and v (`[b, h, t,
    /// d]`) attended by `attend` (causal), the result merged and projected.
    fn attention<'a>(
        &self,
        x: &Tensor<'a>,
        attend: impl FnOnce(&Tensor<'a>, &Tensor<'a>, &Tensor<'a>) -> Result<Tensor<'a>>,
    ) -> Result<Tensor<'a>> {
        let &[b, t, c] = x.shape() else {
            panic!("attention takes [batch, t, dim], got {:?}", x.shape())
        };
        let (h, d) = (self.heads, c / self.heads);
        // [b, t, 3c] -> q, k, v, each [b, t, c] -> [b, h, t, d]: views, and an array (no heap).
        let qkv = self.c_attn.forward(x).chunk::<3>(-1);
        let [q, k, v] = qkv.map(|p| p.reshape(&[b, t, h, d]).transpose(1, 2));
        let y = attend(&q, &k, &v)?;
        Ok(self.c_proj.forward(&y.transpose(1, 2).reshape(&[b, t, c])))
    }
}

/// The decoder.
#[derive(Parameters)]
pub(crate) struct Gpt {
    #[param(skip)]
    pub(crate) config: Config,
    wte: Param,
    wpe: Param,
    #[param(rename = "h")]
    pub(crate) blocks: Vec<Block>,
    ln_f: Norm,
    /// The LM head's weight as a field of its own, as Hugging Face's GPT-2 keeps it: `None` reads
    /// `wte` in place (the tie by hand); [`Gpt::tie_head`] makes it a clone of `wte` (tied
    /// fields: one parameter under two names).
    #[param(rename = "lm_head.weight")]
    lm_head: Option<Param>,
    /// 1 above the diagonal: the future a query must not attend to.
    #[param(skip)]
    future: Param<u8>,
}

impl Gpt {
    /// Loads the model from a safetensors file of GPT-2's names (PyTorch layout), into `pool`.
    pub(crate) fn load(pool: &Pool, path: &Path, config: Config) -> Result<Gpt, NnError> {
        let mut model = Gpt::zeros(pool, config)?;
        model.load_safetensors(path, &LoadOptions::new().pytorch_linear(is_linear_weight))?;
        Ok(model)
    }

    /// A model of random weights initialised as GPT-2's (normal, std 0.02; LayerNorms at 1 and 0),
    /// reproducible from `seed`: the `i`-th parameter of the walk from `seed + i`.
    pub(crate) fn random(pool: &Pool, config: Config, seed: u64) -> Result<Gpt, NnError> {
        let mut model = Gpt::zeros(pool, config)?;
        let mut i = 0;
        let mut failure = None;
        model.visit_params_mut(&ParamPath::ROOT, &mut |path, p| {
            let name = path.to_string();
            let init = pool.scope(|s| {
                let values = if name.contains("ln_") && name.ends_with(".weight") {
                    s.try_full::<f32>(p.shape(), 1.0)?
                } else if name.contains("ln_") || name.ends_with(".bias") {
                    return Ok(());
                } else {
                    s.try_randn::<f32>(p.shape(), seed + i)? * 0.02
                };
                p.try_view_mut()?.assign(&values.view());
                Ok(())
            });
            if let Err(e) = init {
                failure.get_or_insert(e);
            }
            i += 1;
        });
        failure.map_or(Ok(model), |e: tensorscope::Error| Err(e.into()))
    }

    /// A model of zeros, its shapes from `config` (Linear weights as `[in, out]`).
    pub(crate) fn zeros(pool: &Pool, config: Config) -> Result<Gpt, NnError> {
        let (v, n, d) = (config.vocab, config.n_ctx, config.dim);
        let zeros = |shape: &[usize]| Param::try_zeros(pool, shape);
        let norm = || -> Result<Norm> {
            Ok(Norm {
                weight: zeros(&[d])?,
                bias: zeros(&[d])?,
            })
        };
        let dense = |inputs: usize, outputs: usize| -> Result<Dense> {
            Ok(Dense {
                weight: zeros(&[inputs, outputs])?,
                bias: zeros(&[outputs])?,
            })
        };
        let blocks = (0..config.layers)
            .map(|_| {
                Ok(Block {
                    ln_1: norm()?,
                    c_attn: dense(d, 3 * d)?,
                    c_proj: dense(d, d)?,
                    ln_2: norm()?,
                    c_fc: dense(d, 4 * d)?,
                    mlp_proj: dense(4 * d, d)?,
                    heads: config.heads,
                    eps: config.eps,
                    attention: config.attention,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let future = pool.scope(|s| s.try_full::<u8>(&[n, n], 1)?.try_triu(1)?.try_detach())?;
        Ok(Gpt {
            config,
            wte: zeros(&[v, d])?,
            wpe: zeros(&[n, d])?,
            blocks,
            ln_f: norm()?,
            lm_head: None,
            future,
        })
    }

    /// The same model with its head a field of its own tied to `wte` (a clone of it, as PyTorch
    /// ties `lm_head.weight = wte.weight`): one parameter under the names `wte` and
    /// `lm_head.weight`.
    pub(crate) fn tie_head(mut self) -> Gpt {
        self.lm_head = Some(self.wte.clone());
        self
    }

    /// The token and position embeddings of `ids` (`[batch, t]`): `[batch, t, dim]`.
    #[dispose_scope]
    fn embed<'a>(&self, ids: &Tensor<'a, i64>) -> Tensor<'a> {
        let t = ids.shape()[1];
        ids.bind(&self.wte).embedding(ids) + &ids.bind(&self.wpe).narrow(0, 0, t)
    }

    /// The logits of the tied head: `ln_f(x) wte^T`, `[batch, t, vocab]`.
    #[dispose_scope]
    fn head<'a>(&self, x: &Tensor<'a>) -> Tensor<'a> {
        let h = self.ln_f.forward(x, self.config.eps);
        h.matmul(&x.bind(self.lm_head.as_ref().unwrap_or(&self.wte)).t())
    }

    /// The logits for `ids` (`[batch, t]`, `t <= n_ctx`): `[batch, t, vocab]`.
    #[dispose_scope]
    pub(crate) fn forward<'a>(&self, ids: &Tensor<'a, i64>) -> Tensor<'a> {
        let mut x = self.embed(ids);
        for block in &self.blocks {
            x = block.forward(&x, &self.future);
        }
        self.head(&x)
    }

    /// The same forward, its block loop checkpointed as `ckpt` says.
    #[dispose_scope]
    pub(crate) fn forward_checkpointed<'a>(
        &self,
        ckpt: &mut Checkpointer,
        ids: &Tensor<'a, i64>,
    ) -> Tensor<'a> {
        let x = self.blocks_checkpointed(ckpt, self.embed(ids));
        self.head(&x)
    }

    #[checkpoint]
    fn blocks_checkpointed<'a>(&self, ckpt: &mut Checkpointer, x: Tensor<'a>) -> Tensor<'a> {
        let mut x = x;
        for block in &self.blocks {
            x = block.forward(&x, &self.future);
        }
        x
    }

    /// The mean next-token cross-entropy of `logits` (`[batch, t, vocab]`) against `ids`.
    pub(crate) fn loss<'a>(logits: &Tensor<'a>, ids: &Tensor<'a, i64>) -> Tensor<'a> {
        let &[b, t, v] = logits.shape() else {
            panic!("logits are [batch, t, vocab], got {:?}", logits.shape())
        };
        let predicted = logits.narrow(1, 0, t - 1).reshape(&[b * (t - 1), v]);
        predicted.cross_entropy_ids(&ids.narrow(1, 1, t - 1).flatten())
    }

    /// `prompt` followed by `new` tokens, each the argmax of the logits at the last position
    /// (the whole sequence recomputed each step, no cache: the reference the cached generation
    /// is tested against).
    pub(crate) fn generate(&self, pool: &Pool, prompt: &[i64], new: usize) -> Vec<i64> {
        let mut tokens = prompt.to_vec();
        for _ in 0..new {
            let next = pool.scope(|s| {
                let n = tokens.len();
                let ids = s.from_slice::<i64>(&[1, n], &tokens);
                self.forward(&ids).narrow(1, n - 1, 1).argmax(-1).item()
            });
            tokens.push(next);
        }
        tokens
    }
}

impl CausalLm for Gpt {
    fn cache_layout(&self) -> CacheLayout {
        let c = self.config;
        CacheLayout {
            layers: c.layers,
            kv_heads: c.heads,
            head_dim: c.dim / c.heads,
            max_positions: c.n_ctx,
        }
    }

    fn forward_cached<'a, 'c: 'a>(
        &self,
        s: &Scope<'a, '_>,
        ids: &Tensor<'a, i64>,
        caches: &mut [KvCache<'c>],
        seq: Option<usize>,
        keep: usize,
    ) -> Result<Tensor<'a>> {
        let layout = self.cache_layout();
        let (_, t) = layout.check_forward("Gpt", ids.shape(), caches.len(), keep)?;
        let positions = caches[0].try_positions(s, seq, t)?;
        let tokens = s.bind(&self.wte).try_embedding(ids)?;
        let mut x = tokens.try_add(&s.bind(&self.wpe).try_embedding(&positions)?)?;
        for (block, cache) in self.blocks.iter().zip(caches.iter_mut()) {
            x = block.forward_cached(&x, cache, seq)?;
        }
        Ok(self.head(&x.try_narrow(1, t - keep, keep)?))
    }
}
