"""PyTorch on the GPT training step of `examples/attention.rs`, for comparison with
`cargo run --release --example attention` (its second table).

The model of `examples/common/gpt.rs`: GPT-2 blocks (pre-LayerNorm, one fused qkv projection,
causal attention, GELU's tanh form), learned positions, a final LayerNorm and a head tied to the
token embedding; 6 blocks of width 384, 6 heads, context 256, vocabulary 256, batch 8, f32. The
step: logits, the mean next-token cross-entropy against the input ids (the same synthetic ids as
the Rust example), backward, Adam (lr 3e-4). Rows: eager with `F.scaled_dot_product_attention`
(PyTorch's fused attention), and the same step under `torch.compile` when it compiles here. Each
row runs its steps in rounds of 5, then 5 forwards alone (`torch.no_grad()`; the compiled row
compiles the model for them), the rows taking turns, the first of each 5 not timed; prints the
median step and forward times per row.

Run (from the repository root; CI never runs Python):
  python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch numpy
  /tmp/venv/bin/python scripts/gpt_step_torch.py [--threads 2] [--rounds 5] [--vocab 256]
  (--vocab 50257: GPT-2's vocabulary, as the Rust example's --vocab; --bf16: rows under
  torch.autocast('cpu', dtype=torch.bfloat16), beside the Rust example's --bf16 row;
  --adamw-clip: AdamW (weight decay 0.1) with no decay on biases and LayerNorms, and
  clip_grad_norm_(1.0) before each step, as the Rust example's --adamw-clip; --no-compile: the
  eager rows only)
"""
import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, CTX, DIM, HEADS, LAYERS, BATCH, CHUNK = 256, 256, 384, 6, 6, 8, 5


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(DIM, eps=1e-5)
        self.c_attn = nn.Linear(DIM, 3 * DIM)
        self.c_proj = nn.Linear(DIM, DIM)
        self.ln_2 = nn.LayerNorm(DIM, eps=1e-5)
        self.c_fc = nn.Linear(DIM, 4 * DIM)
        self.mlp_proj = nn.Linear(4 * DIM, DIM)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=-1)
        heads = lambda z: z.view(b, t, HEADS, c // HEADS).transpose(1, 2)
        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        h = x + self.c_proj(y.transpose(1, 2).reshape(b, t, c))
        return h + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(h)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, DIM)
        self.wpe = nn.Embedding(CTX, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(DIM, eps=1e-5)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe.weight[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.T


def set_vocab(vocab):
    global VOCAB
    VOCAB = vocab


def loss_of(model, ids):
    logits = model(ids)
    return F.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--adamw-clip", action="store_true",
                        help="AdamW with decay off biases and LayerNorms, gradients clipped to 1")
    parser.add_argument("--no-compile", action="store_true", help="the eager rows only")
    parser.add_argument("--bf16", action="store_true",
                        help="add rows under torch.autocast('cpu', dtype=torch.bfloat16)")
    args = parser.parse_args()
    set_vocab(args.vocab)
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    i = torch.arange(BATCH * CTX)
    ids = ((i * 7 + i // CTX) % VOCAB).reshape(BATCH, CTX)

    rows = {}
    names = ["eager", "torch.compile"]
    if args.bf16:
        names += ["eager, bf16 autocast", "torch.compile, bf16 autocast"]
    if args.no_compile:
        names = [n for n in names if not n.startswith("torch.compile")]
    for name in names:
        model = Gpt()
        if args.adamw_clip:
            # Biases and LayerNorm scales are the 1-D parameters; the embeddings and weights decay.
            decay = [p for p in model.parameters() if p.dim() >= 2]
            no_decay = [p for p in model.parameters() if p.dim() < 2]
            groups = [{"params": decay, "weight_decay": 0.1},
                      {"params": no_decay, "weight_decay": 0.0}]
            adam = torch.optim.AdamW(groups, lr=3e-4)
        else:
            adam = torch.optim.Adam(model.parameters(), lr=3e-4)
        compiled = name.startswith("torch.compile")
        step_loss = torch.compile(loss_of) if compiled else loss_of
        # f32 weights and optimizer either way; under autocast the products compute in bf16.
        cast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=name.endswith("autocast"))

        def step(model=model, adam=adam, step_loss=step_loss, cast=cast):
            adam.zero_grad(set_to_none=True)
            with cast:
                loss = step_loss(model, ids)
            loss.backward()
            if args.adamw_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            adam.step()
            return loss.item()

        try:
            step()  # warm-up (and compilation)
        except Exception as e:  # noqa: BLE001: a compiler missing here is a row left out
            print(f"{name}: not run ({type(e).__name__}: {str(e)[:80]})")
            continue
        forward = torch.compile(model) if compiled else model

        def infer(forward=forward, cast=cast):
            with torch.no_grad(), cast:
                return forward(ids).shape

        infer()  # warm-up (and compilation for inference)
        rows[name] = (step, infer, [], [], [])
    for _ in range(args.rounds):
        for step, infer, times, forwards, losses in rows.values():
            for j in range(CHUNK):
                start = time.perf_counter()
                losses.append(step())
                if j > 0:
                    times.append((time.perf_counter() - start) * 1e3)
            for j in range(CHUNK):
                start = time.perf_counter()
                infer()
                if j > 0:
                    forwards.append((time.perf_counter() - start) * 1e3)
    print(f"GPT training step: {LAYERS} blocks, width {DIM}, {HEADS} heads, context {CTX}, "
          f"batch {BATCH}, vocabulary {VOCAB}, "
          f"{'AdamW with groups, clipped to norm 1' if args.adamw_clip else 'Adam'}; PyTorch {torch.__version__}, "
          f"{args.threads} threads")
    print("\n| row | step ms | forward ms | last loss |\n|---|---:|---:|---:|")
    for name, (_, _, times, forwards, losses) in rows.items():
        print(f"| {name} | {statistics.median(times):.1f} | {statistics.median(forwards):.1f} "
              f"| {losses[-1]:.4f} |")


if __name__ == "__main__":
    main()
