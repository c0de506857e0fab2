"""Generate the PyTorch reference fixture for tensorscope's GPT-2-style parity test.

Writes: tests/fixtures/gpt_tiny.safetensors (well under 1 MiB), containing
  - every parameter of a tiny GPT-2-style decoder (float32, PyTorch/nn.Linear
    layout: Linear weights are [out, in] and are applied as x @ W.T + b),
  - `input_ids` int64 [2, 12], `logits` float32 [2, 12, 96], `loss` float32 [],
  - `grad.<name>` float32 for a subset of parameters (from loss.backward()),
  - `generated` int64 [12]: greedy decoding of 8 tokens from input_ids[0, :4],
  - string metadata: the model config and the torch version.

Why: the Rust test `tests/integration/gpt_parity.rs` loads this file and checks that
tensorscope's forward pass, loss, gradients and greedy generation match
PyTorch. CI never runs Python; the fixture is committed.

Regenerate (from the repository root):
  python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch numpy safetensors \
    && /tmp/venv/bin/python scripts/gpt_fixture.py
"""
import math
import os

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

V, N_CTX, C, H, N_LAYER, EPS = 96, 16, 32, 4, 2, 1e-5
D = C // H  # head dim = 8
B, T, PROMPT, NEW = 2, 12, 4, 8
OUT = os.path.join("tests", "fixtures", "gpt_tiny.safetensors")
GRAD_NAMES = ["wte", "wpe", "h.0.attn.c_attn.weight", "h.0.attn.c_attn.bias",
              "h.1.mlp.c_fc.weight", "h.1.ln_2.weight", "ln_f.weight", "ln_f.bias"]


def init_params():
    """Parameters in a fixed order (the order of the random draws)."""
    # Linear weights, embeddings and linear biases. GPT-2 draws them with std 0.02, but a model that
    # small gives nearly uniform logits, and greedy decoding then repeats one token (the tied head
    # favours the last input): std 0.2 makes the greedy tokens vary, each chosen by a margin of at
    # least 0.019, far above float32 rounding.
    def normal(*shape):
        return torch.randn(*shape) * 0.2

    def ln(prefix):  # LayerNorm: weight ~ 1 + 0.1*randn, bias ~ 0.1*randn
        return {f"{prefix}.weight": 1 + 0.1 * torch.randn(C), f"{prefix}.bias": 0.1 * torch.randn(C)}

    p = {"wte": normal(V, C), "wpe": normal(N_CTX, C)}
    for i in range(N_LAYER):
        h = f"h.{i}"
        p.update(ln(f"{h}.ln_1"))
        p[f"{h}.attn.c_attn.weight"], p[f"{h}.attn.c_attn.bias"] = normal(3 * C, C), normal(3 * C)
        p[f"{h}.attn.c_proj.weight"], p[f"{h}.attn.c_proj.bias"] = normal(C, C), normal(C)
        p.update(ln(f"{h}.ln_2"))
        p[f"{h}.mlp.c_fc.weight"], p[f"{h}.mlp.c_fc.bias"] = normal(4 * C, C), normal(4 * C)
        p[f"{h}.mlp.c_proj.weight"], p[f"{h}.mlp.c_proj.bias"] = normal(C, 4 * C), normal(C)
    p.update(ln("ln_f"))
    return {k: v.contiguous().requires_grad_(True) for k, v in p.items()}


def linear(x, p, name):
    return x @ p[f"{name}.weight"].T + p[f"{name}.bias"]


def layer_norm(x, p, name):
    return F.layer_norm(x, (C,), p[f"{name}.weight"], p[f"{name}.bias"], eps=EPS)


def attn(x, p, h):
    b, t, _ = x.shape
    qkv = linear(x, p, f"{h}.attn.c_attn")                      # [B,T,3C]
    q, k, v = qkv.split(C, dim=-1)                              # 3 x [B,T,C], in order
    q, k, v = (z.view(b, t, H, D).transpose(1, 2) for z in (q, k, v))  # [B,H,T,D]
    att = (q @ k.transpose(-2, -1)) / math.sqrt(D)              # [B,H,T,T]
    future = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)  # j > i
    att = att.masked_fill(future, float("-inf")).softmax(dim=-1)
    y = (att @ v).transpose(1, 2).reshape(b, t, C)              # [B,T,C]
    return linear(y, p, f"{h}.attn.c_proj")


def mlp(x, p, h):
    return linear(F.gelu(linear(x, p, f"{h}.mlp.c_fc"), approximate="tanh"), p, f"{h}.mlp.c_proj")


def forward(ids, p):
    x = p["wte"][ids] + p["wpe"][torch.arange(ids.shape[1])]
    for i in range(N_LAYER):
        x = x + attn(layer_norm(x, p, f"h.{i}.ln_1"), p, f"h.{i}")
        x = x + mlp(layer_norm(x, p, f"h.{i}.ln_2"), p, f"h.{i}")
    return layer_norm(x, p, "ln_f") @ p["wte"].T                # tied head -> [B,T,V]


@torch.no_grad()
def greedy(prompt, p, n_new):
    seq = prompt.clone()                                         # [1, PROMPT]
    for _ in range(n_new):                                       # full recompute, no KV cache
        nxt = forward(seq, p)[:, -1].argmax(dim=-1, keepdim=True)
        seq = torch.cat([seq, nxt], dim=1)
    return seq[0]


def main():
    torch.manual_seed(0)
    p = init_params()                                            # draws first ...
    ids = torch.randint(0, V, (B, T), dtype=torch.int64)         # ... then the input ids

    logits = forward(ids, p)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, V), ids[:, 1:].reshape(-1))
    loss.backward()
    generated = greedy(ids[0:1, :PROMPT], p, NEW)

    tensors = {k: v.detach().contiguous() for k, v in p.items()}
    tensors.update({"input_ids": ids.contiguous(), "logits": logits.detach().contiguous(),
                    "loss": loss.detach().reshape(()).contiguous(), "generated": generated.contiguous()})
    for name in GRAD_NAMES:
        tensors[f"grad.{name}"] = p[name].grad.contiguous()
    meta = {"vocab_size": V, "n_ctx": N_CTX, "n_embd": C, "n_head": H, "n_layer": N_LAYER,
            "layer_norm_eps": EPS, "gelu": "tanh", "tied_lm_head": "true", "batch": B, "seq_len": T,
            "prompt_len": PROMPT, "max_new_tokens": NEW, "seed": 0, "torch_version": torch.__version__}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    save_file(tensors, OUT, metadata={k: str(v) for k, v in meta.items()})

    # Round-trip check: reloading must give back bit-identical tensors.
    back = load_file(OUT)
    assert back.keys() == tensors.keys(), "key mismatch after reload"
    for k, v in tensors.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v), k

    size = os.path.getsize(OUT)
    assert size < 1 << 20, f"fixture too large: {size} bytes"
    print(f"torch {torch.__version__}: wrote {OUT} ({len(tensors)} tensors, {size} bytes)")
    print(f"loss = {loss.item():.6f}   max|logit| = {logits.abs().max().item():.6f}")
    print(f"generated = {generated.tolist()}")


if __name__ == "__main__":
    main()
