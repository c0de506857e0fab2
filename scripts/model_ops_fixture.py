"""Generate the PyTorch reference fixture for the ops of current models in tensorscope.

Writes: tests/fixtures/model_ops.safetensors (a few KiB). For every differentiable case NAME:
  - `NAME.in0`, `NAME.in1`, ... float64: the inputs,
  - `NAME.out` float64: PyTorch's output,
  - `NAME.grad_out` float64: a fixed random upstream gradient of the output's shape,
  - `NAME.grad0`, `NAME.grad1`, ... float64: the inputs' gradients for that upstream gradient.
Cases: sin, cos, rope (x, cos table, sin table) and the tables of Hugging Face's
LlamaRotaryEmbedding (`rope.tables_count.*` for positions 0..5, `rope.tables_ids.*` for listed
ones), maximum and minimum (broadcast, with ties), pow of two tensors (broadcast; `pow_zero` with
zero bases and exponents, where PyTorch masks the gradients), cumsum along two axes, logsumexp
(with and without keepdim, large values), var and std (corrections 0, 1, 2, keepdim), expand,
repeat, pad (constant and reflect).
Integer cases: `one_hot.ids`/`one_hot.out`, and i64 and i32 arithmetic (`int64.a`, `int64.b`,
`int64.add`, `.sub`, `.mul`, `.div_floor`, wrapping at the type's bounds; `.lt`, `.eq` as u8).

Why: the Rust test `tests/integration/ops/model_ops.rs` loads this file and checks forwards
within 1e-5 relative and gradients within 1e-4 of the largest. CI never runs Python; the fixture
is committed.

Regenerate (from the repository root, with the venv of torch, numpy and safetensors):
  /work/venv/bin/python scripts/model_ops_fixture.py
(or: python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch numpy safetensors \
   && /tmp/venv/bin/python scripts/model_ops_fixture.py)
"""
import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

OUT = os.path.join("tests", "fixtures", "model_ops.safetensors")
torch.manual_seed(0)
tensors = {}


def randn(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def case(name, inputs, f):
    """Records f(*inputs), and the inputs' gradients for a random upstream gradient."""
    inputs = [x.clone().requires_grad_(True) for x in inputs]
    out = f(*inputs)
    grad_out = randn(*out.shape)
    grads = torch.autograd.grad(out, inputs, grad_out)
    for i, (x, g) in enumerate(zip(inputs, grads)):
        tensors[f"{name}.in{i}"] = x.detach()
        tensors[f"{name}.grad{i}"] = g
    tensors[f"{name}.out"] = out.detach()
    tensors[f"{name}.grad_out"] = grad_out


# Hugging Face's LlamaRotaryEmbedding and apply_rotary_pos_emb (transformers 4.4x), in float64.
def rope_tables(position_ids, dim, base):
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).double() / dim))
    inv_freq_expanded = inv_freq[None, :, None].expand(position_ids.shape[0], -1, 1)
    position_ids_expanded = position_ids[:, None, :].double()
    freqs = (inv_freq_expanded @ position_ids_expanded).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos()[0], emb.sin()[0]


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(x, cos, sin):
    return x * cos + rotate_half(x) * sin


case("sin", [randn(3, 4) * 2], torch.sin)
case("cos", [randn(3, 4) * 2], torch.cos)

for name, ids in [("tables_count", torch.arange(5)), ("tables_ids", torch.tensor([3, 0, 7, 11, 2]))]:
    cos, sin = rope_tables(ids[None, :], 8, 10000.0)
    tensors[f"rope.{name}.positions"] = ids.to(torch.int64)
    tensors[f"rope.{name}.cos"], tensors[f"rope.{name}.sin"] = cos, sin
cos, sin = rope_tables(torch.tensor([[3, 0, 7, 11, 2]]), 8, 10000.0)
case("rope", [randn(2, 5, 8), cos, sin], apply_rotary_pos_emb)

a, b = randn(3, 4), randn(4)
a[0, 1] = b[1]  # a tie: the gradient splits in half
a[2, 3] = b[3]
case("maximum", [a, b], torch.maximum)
case("minimum", [a, b], torch.minimum)

case("pow", [torch.rand(3, 4, dtype=torch.float64) * 1.5 + 0.5, randn(3, 1)], torch.pow)
x = torch.rand(3, 4, dtype=torch.float64) + 0.5
x[0, 0] = x[1, 2] = 0.0
e = torch.tensor([[0.0], [2.5], [1.0]], dtype=torch.float64)
case("pow_zero", [x, e], torch.pow)

case("cumsum1", [randn(2, 3, 4)], lambda x: torch.cumsum(x, 1))
case("cumsum_last", [randn(2, 3, 4)], lambda x: torch.cumsum(x, -1))

case("logsumexp1", [randn(2, 3, 4)], lambda x: torch.logsumexp(x, 1))
case("logsumexp_keepdim", [randn(2, 3, 4) * 50 + 1000], lambda x: torch.logsumexp(x, -1, keepdim=True))

case("var1", [randn(3, 5)], lambda x: torch.var(x, 1))  # correction 1, PyTorch's default
case("var0_keepdim", [randn(3, 5)], lambda x: torch.var(x, 0, correction=0, keepdim=True))
case("std1", [randn(3, 5)], lambda x: torch.std(x, -1))
case("std2_keepdim", [randn(3, 5)], lambda x: torch.std(x, 0, correction=2, keepdim=True))

case("expand", [randn(3, 1)], lambda x: x.expand(2, 3, 2))
case("repeat", [randn(2, 3)], lambda x: x.repeat(2, 1, 2))

case("pad_constant", [randn(2, 2, 3)], lambda x: F.pad(x, (1, 2, 0, 1), value=0.5))
# PyTorch's reflect pads 2 axes of a 3-D or 4-D input.
case("pad_reflect", [randn(1, 3, 4)], lambda x: F.pad(x, (2, 1, 1, 2), mode="reflect"))

ids = torch.tensor([[0, 4, 2], [1, 1, 3]])
tensors["one_hot.ids"] = ids
tensors["one_hot.out"] = F.one_hot(ids, 5)

for dtype, name in [(torch.int64, "int64"), (torch.int32, "int32")]:
    info = torch.iinfo(dtype)
    a = torch.tensor([[7, -7, 0], [info.max, info.min, info.max // 3]], dtype=dtype)
    b = torch.tensor([2, -3, info.max], dtype=dtype)
    tensors[f"{name}.a"], tensors[f"{name}.b"] = a, b
    tensors[f"{name}.add"] = a + b  # wraps at the bounds
    tensors[f"{name}.sub"] = a - b
    tensors[f"{name}.mul"] = a * b
    tensors[f"{name}.div_floor"] = a // b
    tensors[f"{name}.lt"] = (a < b).to(torch.uint8)
    tensors[f"{name}.eq"] = (a == b).to(torch.uint8)

save_file({k: v.contiguous() for k, v in tensors.items()}, OUT,
          metadata={"torch": torch.__version__})
print(f"wrote {OUT}: {len(tensors)} tensors, {os.path.getsize(OUT)} bytes")
