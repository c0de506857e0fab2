//! A GPT-2-style decoder written with tensorscope's ops: token and position embeddings, pre-LayerNorm
//! blocks of causal multi-head attention (from one fused qkv projection) and a GELU MLP, a final
//! LayerNorm and an LM head tied to the token embedding, read in place (`h.matmul(&wte.t())`). Every
//! forward is `#[dispose_scope]`; the block loop is also written with `#[checkpoint]` for training,
//! and the model decodes through a key/value cache per block (`CausalLm`, for `nn::generate`).
//!
//! Parameter names and shapes follow `scripts/gpt_fixture.py` (GPT-2's names, PyTorch `nn.Linear`
//! layout in the file); [`Gpt::load`] transposes the Linear weights to tensorscope's `[in, out]`.
//!
//! Shared by `examples/gpt.rs` and `tests/integration/gpt_parity.rs` through `#[path]`.

#![allow(dead_code)] // each user needs a different part

use std::path::Path;

use tensorscope::nn::{CacheLayout, CausalLm, KvCache, LoadOptions, NnError, ParamStore};
use tensorscope::ops::AttentionOptions;
use tensorscope::prelude::*;
use tensorscope::{Checkpointer, Parameters, Result};

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
pub(crate) struct Block {
    ln_1: Norm,
    c_attn: Dense,
    c_proj: Dense,
    ln_2: Norm,
    c_fc: Dense,
    mlp_proj: Dense,
    heads: usize,
    eps: f32,
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
        // [b, t, 3c] -> q, k, v, each [b, t, c] -> [b, h, t, d]. Three narrows rather than
        // `chunk(3, -1)`, whose `Vec` would be the step's one heap allocation.
        let qkv = self.c_attn.forward(x);
        let heads = |i: usize| {
            qkv.narrow(-1, i * c, c)
                .reshape(&[b, t, h, d])
                .transpose(1, 2)
        };
        let y = attend(&heads(0), &heads(1), &heads(2))?;
        Ok(self.c_proj.forward(&y.transpose(1, 2).reshape(&[b, t, c])))
    }
}

/// The decoder.
pub(crate) struct Gpt {
    pub(crate) config: Config,
    wte: Param,
    wpe: Param,
    pub(crate) blocks: Vec<Block>,
    ln_f: Norm,
    /// 1 above the diagonal: the future a query must not attend to.
    future: Param<u8>,
}

impl Gpt {
    /// Loads the model from a safetensors file of GPT-2's names (PyTorch layout), into `pool`.
    pub(crate) fn load(pool: &Pool, path: &Path, config: Config) -> Result<Gpt, NnError> {
        let options = LoadOptions::new().pytorch_linear(is_linear_weight);
        let mut store = ParamStore::<f32>::new(pool);
        for (name, shape) in Gpt::shapes(&config) {
            store.zeros(&name, &shape)?;
        }
        store.load_safetensors(path, &options)?;
        Gpt::from_store(&mut store, config)
    }

    /// A model of random weights initialised as GPT-2's (normal, std 0.02; LayerNorms at 1 and 0),
    /// reproducible from `seed`.
    pub(crate) fn random(pool: &Pool, config: Config, seed: u64) -> Result<Gpt, NnError> {
        let mut store = ParamStore::<f32>::new(pool);
        for (i, (name, shape)) in Gpt::shapes(&config).into_iter().enumerate() {
            if name.contains("ln_") && name.ends_with(".weight") {
                store.ones(&name, &shape)?;
            } else if name.contains("ln_") || name.ends_with(".bias") {
                store.zeros(&name, &shape)?;
            } else {
                store.randn(&name, &shape, 0.02, seed + i as u64)?;
            }
        }
        Gpt::from_store(&mut store, config)
    }

    /// Every parameter's name and shape (Linear weights as `[in, out]`), in GPT-2's order.
    pub(crate) fn shapes(c: &Config) -> Vec<(String, Vec<usize>)> {
        let (v, n, d) = (c.vocab, c.n_ctx, c.dim);
        let mut all = vec![
            ("wte".to_string(), vec![v, d]),
            ("wpe".to_string(), vec![n, d]),
        ];
        for i in 0..c.layers {
            let p = |s: &str| format!("h.{i}.{s}");
            all.extend([
                (p("ln_1.weight"), vec![d]),
                (p("ln_1.bias"), vec![d]),
                (p("attn.c_attn.weight"), vec![d, 3 * d]),
                (p("attn.c_attn.bias"), vec![3 * d]),
                (p("attn.c_proj.weight"), vec![d, d]),
                (p("attn.c_proj.bias"), vec![d]),
                (p("ln_2.weight"), vec![d]),
                (p("ln_2.bias"), vec![d]),
                (p("mlp.c_fc.weight"), vec![d, 4 * d]),
                (p("mlp.c_fc.bias"), vec![4 * d]),
                (p("mlp.c_proj.weight"), vec![4 * d, d]),
                (p("mlp.c_proj.bias"), vec![d]),
            ]);
        }
        all.extend([
            ("ln_f.weight".to_string(), vec![d]),
            ("ln_f.bias".to_string(), vec![d]),
        ]);
        all
    }

    /// The model from a store holding every parameter of [`Gpt::shapes`] (taken out of it).
    pub(crate) fn from_store(store: &mut ParamStore, config: Config) -> Result<Gpt, NnError> {
        let mut take = |name: String| store.take(&name);
        let norm = |take: &mut dyn FnMut(String) -> Result<Param, NnError>, p: &str| {
            Ok::<_, NnError>(Norm {
                weight: take(format!("{p}.weight"))?,
                bias: take(format!("{p}.bias"))?,
            })
        };
        let dense = |take: &mut dyn FnMut(String) -> Result<Param, NnError>, p: &str| {
            Ok::<_, NnError>(Dense {
                weight: take(format!("{p}.weight"))?,
                bias: take(format!("{p}.bias"))?,
            })
        };
        let wte = take("wte".into())?;
        let wpe = take("wpe".into())?;
        let blocks = (0..config.layers)
            .map(|i| {
                let p = |s: &str| format!("h.{i}.{s}");
                Ok(Block {
                    ln_1: norm(&mut take, &p("ln_1"))?,
                    c_attn: dense(&mut take, &p("attn.c_attn"))?,
                    c_proj: dense(&mut take, &p("attn.c_proj"))?,
                    ln_2: norm(&mut take, &p("ln_2"))?,
                    c_fc: dense(&mut take, &p("mlp.c_fc"))?,
                    mlp_proj: dense(&mut take, &p("mlp.c_proj"))?,
                    heads: config.heads,
                    eps: config.eps,
                    attention: config.attention,
                })
            })
            .collect::<Result<Vec<_>, NnError>>()?;
        let ln_f = norm(&mut take, "ln_f")?;
        let n = config.n_ctx;
        let future = store
            .pool()
            .scope(|s| s.ones::<u8>(&[n, n]).triu(1).detach());
        Ok(Gpt {
            config,
            wte,
            wpe,
            blocks,
            ln_f,
            future,
        })
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
        h.matmul(&x.bind(&self.wte).t())
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

    /// The named parameter (for comparing gradients), with its name in GPT-2's scheme.
    pub(crate) fn param(&self, name: &str) -> Option<&Param> {
        let block = |i: usize| self.blocks.get(i);
        let parts: Vec<&str> = name.splitn(3, '.').collect();
        match parts[..] {
            ["wte"] => Some(&self.wte),
            ["wpe"] => Some(&self.wpe),
            ["ln_f", "weight"] => Some(&self.ln_f.weight),
            ["ln_f", "bias"] => Some(&self.ln_f.bias),
            ["h", i, rest] => {
                let b = block(i.parse().ok()?)?;
                Some(match rest {
                    "ln_1.weight" => &b.ln_1.weight,
                    "ln_1.bias" => &b.ln_1.bias,
                    "attn.c_attn.weight" => &b.c_attn.weight,
                    "attn.c_attn.bias" => &b.c_attn.bias,
                    "attn.c_proj.weight" => &b.c_proj.weight,
                    "attn.c_proj.bias" => &b.c_proj.bias,
                    "ln_2.weight" => &b.ln_2.weight,
                    "ln_2.bias" => &b.ln_2.bias,
                    "mlp.c_fc.weight" => &b.c_fc.weight,
                    "mlp.c_fc.bias" => &b.c_fc.bias,
                    "mlp.c_proj.weight" => &b.mlp_proj.weight,
                    "mlp.c_proj.bias" => &b.mlp_proj.bias,
                    _ => return None,
                })
            }
            _ => None,
        }
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

impl Parameters<f32> for Gpt {
    fn for_each_param(&mut self, f: &mut dyn FnMut(&mut Param)) {
        f(&mut self.wte);
        f(&mut self.wpe);
        for b in &mut self.blocks {
            for n in [&mut b.ln_1, &mut b.ln_2] {
                f(&mut n.weight);
                f(&mut n.bias);
            }
            for d in [&mut b.c_attn, &mut b.c_proj, &mut b.c_fc, &mut b.mlp_proj] {
                f(&mut d.weight);
                f(&mut d.bias);
            }
        }
        f(&mut self.ln_f.weight);
        f(&mut self.ln_f.bias);
    }
}
