//! A Llama-style decoder written with tensorscope's ops, loaded from a safetensors file of Hugging
//! Face's `LlamaForCausalLM` names: RMSNorm, rotary position embeddings, grouped-query attention
//! over a [`KvCache`] per layer, a SwiGLU MLP, an untied LM head. It serves (inference with a
//! cache): [`Llama::forward_cached`] reads tokens after those the caches hold, and
//! [`tensorscope::nn::generate`] drives it.
//!
//! Every weight stays in the file's (PyTorch's) `[out, in]` layout and is read through a
//! transposed view, `x.matmul(&w.t())`, as PyTorch's `F.linear` reads it: nothing is copied at load
//! or per forward.
//!
//! Shared by `examples/llama.rs`, `tests/integration/llama_parity.rs` and `tests/allocations.rs`
//! through `#[path]`; the weights come from `scripts/llama_fixture.py`.

#![allow(dead_code)] // each user needs a different part

use std::collections::HashMap;
use std::path::Path;

use tensorscope::nn::{CacheLayout, CausalLm, KvCache, SafeTensorsFile};
use tensorscope::prelude::*;
use tensorscope::Result;

/// The model's sizes, as Hugging Face's `LlamaConfig` names them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Config {
    pub(crate) vocab_size: usize,
    pub(crate) hidden_size: usize,
    pub(crate) num_hidden_layers: usize,
    pub(crate) num_attention_heads: usize,
    pub(crate) num_key_value_heads: usize,
    pub(crate) intermediate_size: usize,
    pub(crate) max_position_embeddings: usize,
    pub(crate) rope_theta: f64,
    pub(crate) rms_norm_eps: f32,
    /// The LM head is the token embedding (`lm_head.weight` absent from the file).
    pub(crate) tie_word_embeddings: bool,
}

impl Config {
    /// Elements per attention head.
    pub(crate) fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// The config from string values under Hugging Face's names: a safetensors file's metadata
    /// (`scripts/llama_fixture.py` writes it there) or a `config.json`'s fields.
    pub(crate) fn from_values(get: impl Fn(&str) -> Option<String>) -> Result<Config, String> {
        fn value<T: std::str::FromStr>(
            get: &impl Fn(&str) -> Option<String>,
            key: &str,
        ) -> Result<T, String> {
            let text = get(key).ok_or_else(|| format!("the config has no `{key}`"))?;
            text.trim_matches('"')
                .parse()
                .map_err(|_| format!("the config's `{key}` is not a number: {text}"))
        }
        let config = Config {
            vocab_size: value(&get, "vocab_size")?,
            hidden_size: value(&get, "hidden_size")?,
            num_hidden_layers: value(&get, "num_hidden_layers")?,
            num_attention_heads: value(&get, "num_attention_heads")?,
            num_key_value_heads: value(&get, "num_key_value_heads")?,
            intermediate_size: value(&get, "intermediate_size")?,
            max_position_embeddings: value(&get, "max_position_embeddings")?,
            rope_theta: value(&get, "rope_theta").or_else(|_| {
                // transformers 5 writes it inside `rope_parameters`.
                get("rope_parameters")
                    .and_then(|p| serde_json::from_str::<serde_json::Value>(&p).ok())
                    .and_then(|p| p["rope_theta"].as_f64())
                    .ok_or_else(|| "the config has no `rope_theta`".to_string())
            })?,
            rms_norm_eps: value(&get, "rms_norm_eps")?,
            tie_word_embeddings: value(&get, "tie_word_embeddings").unwrap_or(false),
        };
        // What this model does not implement, refused rather than run with other results: a
        // Llama 3.1 checkpoint's scaled rotary frequencies, projections with biases, another
        // activation.
        let text = |key: &str| get(key).map(|v| v.trim_matches('"').to_string());
        let unsupported = |key: &str, value: String| {
            Err(format!(
                "the config's `{key}` is {value}; this model supports only the plain Llama"
            ))
        };
        if let Some(act) = text("hidden_act").filter(|a| a != "silu") {
            return unsupported("hidden_act", act);
        }
        for key in ["attention_bias", "mlp_bias"] {
            if let Some(bias) = text(key).filter(|b| b != "false") {
                return unsupported(key, bias);
            }
        }
        if let Some(scaling) = text("rope_scaling").filter(|r| r != "null" && r != "None") {
            return unsupported("rope_scaling", scaling);
        }
        let rope_type = text("rope_parameters")
            .and_then(|p| serde_json::from_str::<serde_json::Value>(&p).ok())
            .and_then(|p| p["rope_type"].as_str().map(str::to_string));
        if let Some(kind) = rope_type.filter(|t| t != "default") {
            return unsupported("rope_parameters.rope_type", kind);
        }
        if config.num_hidden_layers == 0 {
            return Err("the config has no layer (`num_hidden_layers` is 0)".into());
        }
        let (heads, kv) = (config.num_attention_heads, config.num_key_value_heads);
        if heads == 0
            || kv == 0
            || !config.hidden_size.is_multiple_of(heads)
            || !heads.is_multiple_of(kv)
        {
            return Err(format!(
                "hidden_size {} over {heads} heads sharing {kv} key/value heads does not divide evenly",
                config.hidden_size
            ));
        }
        Ok(config)
    }

    /// The config of a Hugging Face `config.json`.
    pub(crate) fn from_json(text: &str) -> Result<Config, String> {
        let json: HashMap<String, serde_json::Value> =
            serde_json::from_str(text).map_err(|e| format!("config.json: {e}"))?;
        Config::from_values(|key| json.get(key).map(|v| v.to_string()))
    }
}

/// An attention layer's projections, `[out, in]`.
struct Attention {
    q_proj: Param,
    k_proj: Param,
    v_proj: Param,
    o_proj: Param,
}

/// The SwiGLU MLP's projections, `[out, in]`.
struct Mlp {
    gate_proj: Param,
    up_proj: Param,
    down_proj: Param,
}

/// One decoder layer.
struct Layer {
    input_layernorm: Param,
    self_attn: Attention,
    post_attention_layernorm: Param,
    mlp: Mlp,
}

/// The decoder.
pub(crate) struct Llama {
    pub(crate) config: Config,
    embed_tokens: Param,
    layers: Vec<Layer>,
    norm: Param,
    lm_head: Param,
    /// The rotary tables of every position, `[max_positions, head_dim]`: a forward gathers its
    /// positions' rows.
    cos: Param,
    sin: Param,
}

/// `x w^T` for a weight `w` in PyTorch's `[out, in]` layout, read where it lies.
fn linear<'a>(x: &Tensor<'a>, w: &Param) -> Result<Tensor<'a>> {
    x.try_matmul(&x.bind(w).t())
}

/// `rms_norm(x) * weight`.
fn rms_norm<'a>(x: &Tensor<'a>, weight: &Param, eps: f32) -> Result<Tensor<'a>> {
    x.try_rms_norm(eps)?.try_mul(&x.bind(weight))
}

impl Llama {
    /// Loads a model from `path` (safetensors, Hugging Face's names) into `pool`, its config from
    /// the file's metadata or, if it has none, the `config.json` beside it. Every tensor's name
    /// and shape is checked against the config; the errors name the tensor.
    pub(crate) fn load(pool: &Pool, path: &Path) -> Result<Llama, String> {
        Llama::open(pool, path).map(|(model, _)| model)
    }

    /// [`Llama::load`], also handing back the open file, for its other tensors (a fixture's
    /// reference values) without reading it again.
    pub(crate) fn open(pool: &Pool, path: &Path) -> Result<(Llama, SafeTensorsFile), String> {
        let fail = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
        let file = SafeTensorsFile::open(path).map_err(|e| fail(&e))?;
        let config = match file.metadata().contains_key("hidden_size") {
            true => Config::from_values(|key| file.metadata().get(key).cloned()),
            false => {
                let json = path.with_file_name("config.json");
                let text = std::fs::read_to_string(&json)
                    .map_err(|e| format!("{}: {e}", json.display()))?;
                Config::from_json(&text)
            }
        }
        .map_err(|e| fail(&e))?;
        let model = Llama::from_file(pool, &file, config).map_err(|e| fail(&e))?;
        Ok((model, file))
    }

    /// The model of `config` from the tensors of `file`.
    pub(crate) fn from_file(
        pool: &Pool,
        file: &SafeTensorsFile,
        config: Config,
    ) -> Result<Llama, String> {
        let c = config;
        let (d, hd) = (c.hidden_size, c.head_dim());
        let param = |name: &str, shape: &[usize]| -> Result<Param, String> {
            let p = file.param::<f32>(pool, name).map_err(|e| e.to_string())?;
            match p.shape() == shape {
                true => Ok(p),
                false => Err(format!(
                    "tensor \"{name}\" is {:?}; the config needs {shape:?}",
                    p.shape()
                )),
            }
        };
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let p = |s: &str| format!("model.layers.{i}.{s}");
                Ok(Layer {
                    input_layernorm: param(&p("input_layernorm.weight"), &[d])?,
                    self_attn: Attention {
                        q_proj: param(&p("self_attn.q_proj.weight"), &[d, d])?,
                        k_proj: param(
                            &p("self_attn.k_proj.weight"),
                            &[c.num_key_value_heads * hd, d],
                        )?,
                        v_proj: param(
                            &p("self_attn.v_proj.weight"),
                            &[c.num_key_value_heads * hd, d],
                        )?,
                        o_proj: param(&p("self_attn.o_proj.weight"), &[d, d])?,
                    },
                    post_attention_layernorm: param(&p("post_attention_layernorm.weight"), &[d])?,
                    mlp: Mlp {
                        gate_proj: param(&p("mlp.gate_proj.weight"), &[c.intermediate_size, d])?,
                        up_proj: param(&p("mlp.up_proj.weight"), &[c.intermediate_size, d])?,
                        down_proj: param(&p("mlp.down_proj.weight"), &[d, c.intermediate_size])?,
                    },
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        let (cos, sin) = pool
            .scope(|s| -> Result<(Param, Param)> {
                let positions = 0..c.max_position_embeddings;
                let (cos, sin) = s.try_rope_tables::<f32>(positions, hd, c.rope_theta)?;
                Ok((cos.try_detach()?, sin.try_detach()?))
            })
            .map_err(|e| e.to_string())?;
        let embed_tokens = param("model.embed_tokens.weight", &[c.vocab_size, d])?;
        // A tied head is the embedding itself (a second handle, no copy), read transposed.
        let lm_head = match c.tie_word_embeddings {
            true => embed_tokens.clone(),
            false => param("lm_head.weight", &[c.vocab_size, d])?,
        };
        Ok(Llama {
            config,
            embed_tokens,
            layers,
            norm: param("model.norm.weight", &[d])?,
            lm_head,
            cos,
            sin,
        })
    }

    /// The logits of every position of `ids` (`[batch, t]`), `[batch, t, vocab]`, without a
    /// cache kept: one is made for the call.
    pub(crate) fn forward<'a>(
        &self,
        s: &Scope<'a, '_>,
        ids: &Tensor<'a, i64>,
    ) -> Result<Tensor<'a>> {
        let c = self.config;
        let layers = c.num_hidden_layers;
        let (batch, t) = self
            .cache_layout()
            .check_forward("Llama", ids.shape(), layers, 0)?;
        // Rented in `s`, given back to the pool when they drop at the return.
        let mut caches = (0..c.num_hidden_layers)
            .map(|_| KvCache::try_new(s, batch, c.num_key_value_heads, t, c.head_dim()))
            .collect::<Result<Vec<_>>>()?;
        self.forward_cached(s, ids, &mut caches, None, t)
    }
}

impl CausalLm for Llama {
    fn cache_layout(&self) -> CacheLayout {
        CacheLayout {
            layers: self.config.num_hidden_layers,
            kv_heads: self.config.num_key_value_heads,
            head_dim: self.config.head_dim(),
            max_positions: self.config.max_position_embeddings,
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
        let c = self.config;
        let layout = self.cache_layout();
        let (rows, t) = layout.check_forward("Llama", ids.shape(), caches.len(), keep)?;
        // Each row's positions follow those its sequence's cache holds.
        let positions = caches[0].try_positions(s, seq, t)?;
        let hd = c.head_dim();
        let table = |t_: &Param| -> Result<Tensor<'a>> {
            s.bind(t_)
                .try_embedding(&positions)?
                .try_reshape(&[rows, 1, t, hd])
        };
        let rotary = (table(&self.cos)?, table(&self.sin)?);
        let mut x = s.bind(&self.embed_tokens).try_embedding(ids)?;
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            x = layer.forward(&c, x, &rotary, cache, seq)?;
        }
        let x = x.try_narrow(1, t - keep, keep)?;
        linear(&rms_norm(&x, &self.norm, c.rms_norm_eps)?, &self.lm_head)
    }
}

impl Layer {
    /// `x` (`[rows, t, hidden]`) through the layer, its keys and values appended to `cache`.
    fn forward<'a, 'c: 'a>(
        &self,
        c: &Config,
        x: Tensor<'a>,
        (cos, sin): &(Tensor<'a>, Tensor<'a>),
        cache: &mut KvCache<'c>,
        seq: Option<usize>,
    ) -> Result<Tensor<'a>> {
        let (rows, t) = (x.shape()[0], x.shape()[1]);
        let hd = c.head_dim();
        let heads = |y: Tensor<'a>, n: usize| -> Result<Tensor<'a>> {
            y.try_reshape(&[rows, t, n, hd])?.try_permute(&[0, 2, 1, 3])
        };
        let h = rms_norm(&x, &self.input_layernorm, c.rms_norm_eps)?;
        let a = &self.self_attn;
        let q = heads(linear(&h, &a.q_proj)?, c.num_attention_heads)?.try_rope(cos, sin)?;
        let k = heads(linear(&h, &a.k_proj)?, c.num_key_value_heads)?.try_rope(cos, sin)?;
        let v = heads(linear(&h, &a.v_proj)?, c.num_key_value_heads)?;
        let o = match seq {
            Some(seq) => {
                cache.try_append_to(seq, &k, &v)?;
                cache.try_attend_to(seq, &q, None)?
            }
            None => {
                cache.try_append(&k, &v)?;
                cache.try_attend(&q, None)?
            }
        };
        let o = o
            .try_permute(&[0, 2, 1, 3])?
            .try_reshape(&[rows, t, c.hidden_size])?;
        let x = x.try_add(&linear(&o, &a.o_proj)?)?;
        let h = rms_norm(&x, &self.post_attention_layernorm, c.rms_norm_eps)?;
        let m = &self.mlp;
        let gated = linear(&h, &m.gate_proj)?
            .try_silu()?
            .try_mul(&linear(&h, &m.up_proj)?)?;
        x.try_add(&linear(&gated, &m.down_proj)?)
    }
}
