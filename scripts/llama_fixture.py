"""Generate the PyTorch reference fixture for a Llama-style decoder (and, with --bench, random
bench weights for serving throughput).

Writes: tests/fixtures/llama_tiny.safetensors (well under 1 MiB), containing
  - every parameter of a tiny `transformers.LlamaForCausalLM` under its Hugging Face name, exactly
    as `model.state_dict()` gives it (float32, contiguous, nn.Linear layout [out, in], applied as
    x @ W.T; no biases; untied `lm_head.weight`; the rotary `inv_freq` buffers are not stored):
      model.embed_tokens.weight                      [128, 64]
      model.layers.{i}.self_attn.q_proj.weight       [64, 64]   (4 heads of 16)
      model.layers.{i}.self_attn.{k,v}_proj.weight   [32, 64]   (2 key/value heads of 16: GQA)
      model.layers.{i}.self_attn.o_proj.weight       [64, 64]
      model.layers.{i}.mlp.{gate,up}_proj.weight     [176, 64]
      model.layers.{i}.mlp.down_proj.weight          [64, 176]
      model.layers.{i}.{input,post_attention}_layernorm.weight [64]
      model.norm.weight [64], lm_head.weight [128, 64]
  - `ref.input_ids` int64 [2, 12] (random ids) and `ref.logits` float32 [2, 12, 128]: a plain
    forward, no cache, no attention mask (positions 0..11); the script checks it against the
    forward written out by hand in `plain_forward`, which states the conventions (RoPE layout,
    GQA head grouping, RMSNorm);
  - `ref.prompt.{0,1,2}` int64 [3], [7], [5] and `ref.generated.{0,1,2}` int64 [10]: greedy
    decoding of 10 new tokens (only the new ones) through the KV cache, batch 1 each, by
    `model.generate(do_sample=False, use_cache=True)`; the script checks that a hand loop feeding
    one token at a time (prompt included) through a DynamicCache gives the same tokens and the
    same step logits (to 1e-4), and that the cached logits match a full recompute (to 1e-4);
  - `ref.decode_logits` float32 [128]: the logits of the last decode step of prompt 0, i.e. of the
    forward that feeds ref.generated.0[8] at position 3 + 8 = 11 with the cache holding
    positions 0..10; its argmax is ref.generated.0[9];
  - string metadata: the config values (one key each), the init, the seed, and the torch and
    transformers versions.

Why: a Rust Llama implementation (RMSNorm, rotary positions, grouped-query attention, SwiGLU MLP,
a KV cache) can load this file and check its forward, its greedy decoding and its cached decode
step against transformers. CI never runs Python; the fixture is committed.

Init: HF's std 0.02 makes a model this small give nearly flat logits, so greedy tokens would be
decided by float32 rounding. Instead every matrix (embeddings, projections, lm_head) is drawn
N(0, 0.4^2) and every RMSNorm weight 1 + 0.1*N(0, 1) so the norm weights matter, in the order of
`model.named_parameters()` after torch.manual_seed(0); then ref.input_ids, then the prompts.
The script prints the smallest top-1/top-2 logit margin over all 30 greedy steps and asserts it
is > 1e-2 (std 0.2 gave 0.003, 0.3 gave 0.008; 0.4 gives 0.106, with |logits| up to 11.6).

The config sets bos_token_id and eos_token_id to None so that generation never stops early.

Regenerate (from the repository root):
  python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch numpy safetensors transformers \
    && /tmp/venv/bin/python scripts/llama_fixture.py

Bench weights (not committed; for scripts/llama_serve_torch.py and the Rust serving bench):
  /tmp/venv/bin/python scripts/llama_fixture.py --bench /tmp/llama_bench
writes DIR/model.safetensors (HF names, float32, ~500 MB) and DIR/config.json (the HF config, with
a top-level "rope_theta" added beside transformers 5's "rope_parameters" for readers that expect
either) for a random 12-layer model: vocab 32000, hidden 768, 12 heads, 4 key/value heads,
intermediate 2048, context 2048, untied; HF's default init (std 0.02, norms 1) after
torch.manual_seed(0).
"""
import argparse
import json
import os
import struct

import torch
import torch.nn.functional as F
import transformers
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

OUT = os.path.join("tests", "fixtures", "llama_tiny.safetensors")
SEED, STD, NORM_STD = 0, 0.4, 0.1
B, T, NEW = 2, 12, 10
PROMPT_LENS = [3, 7, 5]

TINY = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=176, max_position_embeddings=64,
            rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu",
            attention_bias=False, mlp_bias=False)
BENCH = dict(vocab_size=32000, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
             num_key_value_heads=4, intermediate_size=2048, max_position_embeddings=2048,
             rope_theta=10000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, hidden_act="silu",
             attention_bias=False, mlp_bias=False)


def build(cfg, attn="eager"):
    config = LlamaConfig(**cfg, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.config._attn_implementation = attn
    return model.eval()


@torch.no_grad()
def init_tiny(model):
    """Deterministic init in the order of named_parameters (see the module docstring)."""
    for name, p in model.named_parameters():
        if p.dim() == 1:  # RMSNorm weights
            p.copy_(1 + NORM_STD * torch.randn(p.shape))
        else:
            p.copy_(STD * torch.randn(p.shape))


@torch.no_grad()
def hand_greedy(model, prompt, n_new):
    """One token at a time through a DynamicCache, the prompt included; returns the new tokens
    and the logits of every step that chose one (the last prompt token's step, then n_new - 1
    decode steps)."""
    cache = DynamicCache(config=model.config)
    seq = prompt.tolist()
    new, step_logits = [], []
    pos = 0
    feed = seq[:]
    while len(new) < n_new:
        for tok in feed:
            out = model(input_ids=torch.tensor([[tok]]), cache=cache, use_cache=True,
                        position_ids=torch.tensor([[pos]]))
            cache = out.cache
            pos += 1
        logits = out.logits[0, -1]
        nxt = int(logits.argmax())
        new.append(nxt)
        step_logits.append(logits.clone())
        feed = [nxt]
    return torch.tensor(new, dtype=torch.int64), torch.stack(step_logits)


def plain_forward(p, ids, cfg):
    """The Llama forward written out from the parameters alone, to pin down the conventions the
    fixture follows: RMSNorm x * rsqrt(mean(x^2) + eps) * w; rotary positions in HF's
    "rotate_half" layout (dimension i pairs with i + head_dim/2, inv_freq[i] = theta^(-2i/head_dim));
    query head h reads key/value head h // (heads / kv_heads); causal softmax(q k^T / sqrt(head_dim));
    MLP down(silu(gate(x)) * up(x)); no biases; untied lm_head."""
    nh, nkv, c = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    d, eps = c // nh, cfg["rms_norm_eps"]
    b, t = ids.shape
    rms = lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
    inv_freq = cfg["rope_theta"] ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)  # [d/2]
    ang = torch.arange(t, dtype=torch.float32)[:, None] * inv_freq                     # [t, d/2]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()        # [t, d]
    rope = lambda z: z * cos + torch.cat([-z[..., d // 2:], z[..., :d // 2]], -1) * sin
    x = p["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        w = lambda n: p[f"model.layers.{i}.{n}.weight"]
        h = rms(x, w("input_layernorm"))
        q = (h @ w("self_attn.q_proj").T).view(b, t, nh, d).transpose(1, 2)
        k = (h @ w("self_attn.k_proj").T).view(b, t, nkv, d).transpose(1, 2)
        v = (h @ w("self_attn.v_proj").T).view(b, t, nkv, d).transpose(1, 2)
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(nh // nkv, 1), v.repeat_interleave(nh // nkv, 1)
        att = (q @ k.transpose(-2, -1)) / d ** 0.5
        att = att.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), float("-inf"))
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c)
        x = x + y @ w("self_attn.o_proj").T
        h = rms(x, w("post_attention_layernorm"))
        x = x + (F.silu(h @ w("mlp.gate_proj").T) * (h @ w("mlp.up_proj").T)) @ w("mlp.down_proj").T
    return rms(x, p["model.norm.weight"]) @ p["lm_head.weight"].T


def margin(logits):
    top2 = logits.topk(2, dim=-1).values
    return (top2[..., 0] - top2[..., 1]).min().item()


def sort_metadata(path):
    """safetensors writes `__metadata__` in hash-map order, which changes from run to run; rewrite
    the header in place with the keys sorted (same length, so the data offsets are unchanged) so
    that regenerating gives identical bytes."""
    with open(path, "r+b") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
        new = json.dumps(header, separators=(",", ":")).encode()
        assert len(new) <= n, (len(new), n)
        f.seek(8)
        f.write(new + b" " * (n - len(new)))


def write_tiny():
    torch.manual_seed(SEED)
    model = build(TINY, "eager")
    torch.manual_seed(SEED)
    init_tiny(model)
    ids = torch.randint(0, TINY["vocab_size"], (B, T), dtype=torch.int64)
    prompts = [torch.randint(0, TINY["vocab_size"], (n,), dtype=torch.int64) for n in PROMPT_LENS]

    tensors = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    assert not any("rotary" in k or "inv_freq" in k for k in tensors), tensors.keys()
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits
    diff = (plain_forward(tensors, ids, TINY) - logits).abs().max().item()
    assert diff < 1e-4, f"hand-written forward differs from transformers by {diff}"
    print(f"|plain forward - transformers| = {diff:.2e}")
    tensors["ref.input_ids"] = ids.contiguous()
    tensors["ref.logits"] = logits.contiguous()

    smallest = float("inf")
    for i, prompt in enumerate(prompts):
        with torch.no_grad():
            out = model.generate(prompt[None], do_sample=False, max_new_tokens=NEW, min_new_tokens=NEW,
                                 use_cache=True, return_dict_in_generate=True, output_logits=True,
                                 attention_mask=torch.ones(1, len(prompt), dtype=torch.int64))
        gen = out.sequences[0, len(prompt):]
        gen_logits = torch.stack(out.logits)[:, 0]           # [NEW, V], raw (unprocessed) logits
        assert gen.shape == (NEW,), gen.shape
        hand, hand_logits = hand_greedy(model, prompt, NEW)
        assert torch.equal(hand, gen), (i, hand.tolist(), gen.tolist())
        diff = (hand_logits - gen_logits).abs().max().item()
        assert diff < 1e-4, (i, diff)
        # the cached decode logits against a full recompute (no cache) of the same sequence
        with torch.no_grad():
            full = model(input_ids=out.sequences[:, :-1], use_cache=False).logits[0, len(prompt) - 1:]
        diff_full = (full - gen_logits).abs().max().item()
        assert diff_full < 1e-4, (i, diff_full)
        m = margin(gen_logits)
        smallest = min(smallest, m)
        print(f"prompt {i} {prompt.tolist()} -> {gen.tolist()}  min margin {m:.4f}  "
              f"|hand - generate| {diff:.2e}  |cache - full| {diff_full:.2e}")
        tensors[f"ref.prompt.{i}"] = prompt.contiguous()
        tensors[f"ref.generated.{i}"] = gen.contiguous()
        if i == 0:
            tensors["ref.decode_logits"] = gen_logits[-1].contiguous()
            assert int(gen_logits[-1].argmax()) == int(gen[-1])
    assert smallest > 1e-2, f"greedy margin too small: {smallest}"

    meta = {k: v for k, v in TINY.items()}
    meta.update({"head_dim": TINY["hidden_size"] // TINY["num_attention_heads"],
                 "attn_implementation": "eager", "dtype": "float32", "seed": SEED,
                 "init_std": STD, "norm_init": f"1 + {NORM_STD} * randn", "max_new_tokens": NEW,
                 "torch_version": torch.__version__, "transformers_version": transformers.__version__})
    meta = {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in meta.items()}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    save_file(tensors, OUT, metadata=meta)
    sort_metadata(OUT)

    back = load_file(OUT)
    assert back.keys() == tensors.keys(), "key mismatch after reload"
    with safe_open(OUT, "pt") as f:
        assert f.metadata() == meta, "metadata mismatch after reload"
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v), k
    size = os.path.getsize(OUT)
    assert size < 1 << 20, f"fixture too large: {size} bytes"
    print(f"torch {torch.__version__}, transformers {transformers.__version__}: wrote {OUT} "
          f"({len(tensors)} tensors, {size} bytes)")
    print(f"max|logit| = {logits.abs().max().item():.4f}   smallest greedy margin = {smallest:.4f}")


def write_bench(out_dir):
    torch.manual_seed(SEED)
    model = build(BENCH, "sdpa")                            # HF default init, std 0.02
    os.makedirs(out_dir, exist_ok=True)
    tensors = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    path = os.path.join(out_dir, "model.safetensors")
    save_file(tensors, path, metadata={"format": "pt"})
    os.chmod(path, 0o644)
    cfg_path = os.path.join(out_dir, "config.json")
    model.config.architectures = ["LlamaForCausalLM"]
    model.config.to_json_file(cfg_path)
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["rope_theta"] = BENCH["rope_theta"]
    cfg.pop("_attn_implementation", None)
    cfg["dtype"] = "float32"
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    n = sum(v.numel() for v in tensors.values())
    print(f"wrote {path} ({len(tensors)} tensors, {n / 1e6:.1f} M parameters, "
          f"{os.path.getsize(path) / 2**20:.0f} MiB) and {cfg_path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", metavar="DIR", help="write the random bench model into DIR instead")
    args = ap.parse_args()
    if args.bench:
        write_bench(args.bench)
    else:
        write_tiny()


if __name__ == "__main__":
    main()
