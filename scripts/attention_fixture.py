"""Generate the PyTorch reference fixture for tensorscope's fused scaled-dot-product attention.

Writes: tests/fixtures/attention.safetensors (a few KiB). For every case NAME, float64:
  - `NAME.q`, `NAME.k`, `NAME.v`: the inputs, [.., tq, d], [.., tk, d], [.., tk, dv],
  - `NAME.y`: torch.nn.functional.scaled_dot_product_attention(q, k, v, ...),
  - `NAME.gy`: a fixed random upstream gradient of y's shape,
  - `NAME.dq`, `NAME.dk`, `NAME.dv`: the inputs' gradients of sum(y * gy).
Cases: `plain` (tq < tk, no mask), `more_queries` (tq > tk, no mask, scale 0.3), `causal`
(tq == tk, is_causal=True), `causal_cache` (tq < tk: tensorscope aligns its causal mask
bottom-right, query i seeing keys j <= i + tk - tq, so PyTorch is given that mask explicitly;
its own is_causal aligns top-left when tq != tk), `rank3` (one leading axis, causal, d = 1).

Why: the Rust test `tests/integration/ops/attention.rs` loads this file and checks forwards within
1e-5 relative and gradients within 1e-4 of the largest. CI never runs Python; the fixture is
committed.

Regenerate (from the repository root, with the venv of torch, numpy and safetensors):
  /work/venv/bin/python scripts/attention_fixture.py
(or: python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch numpy safetensors \
   && /tmp/venv/bin/python scripts/attention_fixture.py)
"""
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

OUT = os.path.join("tests", "fixtures", "attention.safetensors")
torch.set_default_dtype(torch.float64)
torch.manual_seed(0)
tensors = {}


def bottom_right(tq, tk):
    """True where query i may attend key j: j <= i + tk - tq."""
    i = torch.arange(tq)[:, None]
    j = torch.arange(tk)[None, :]
    return j <= i + (tk - tq)


def case(name, lead, tq, tk, d, dv, **options):
    """Records PyTorch's attention of random q, k, v of these sizes, and its gradients."""
    q, k, v = (torch.randn(*lead, t, w, requires_grad=True) for t, w in [(tq, d), (tk, d), (tk, dv)])
    y = F.scaled_dot_product_attention(q, k, v, **options)
    gy = torch.randn(*y.shape)
    dq, dk, dv_ = torch.autograd.grad(y, (q, k, v), gy)
    for key, value in dict(q=q, k=k, v=v, y=y, gy=gy, dq=dq, dk=dk, dv=dv_).items():
        tensors[f"{name}.{key}"] = value.detach()


case("plain", (1, 2), 3, 5, 4, 3)
case("more_queries", (1, 2), 5, 3, 4, 2, scale=0.3)
case("causal", (1, 2), 4, 4, 3, 3, is_causal=True)
case("causal_cache", (1, 2), 3, 6, 4, 2, attn_mask=bottom_right(3, 6))
case("rank3", (2,), 4, 4, 1, 2, is_causal=True)

save_file({k: v.contiguous() for k, v in tensors.items()}, OUT,
          metadata={"torch": torch.__version__})
print(f"wrote {OUT}: {len(tensors)} tensors, {os.path.getsize(OUT)} bytes")
