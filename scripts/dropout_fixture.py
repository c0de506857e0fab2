"""PyTorch reference for tensorscope's dropout: the scaling of kept elements and the gradient rule.

PyTorch's random numbers cannot be matched, so the fixture shows what dropout does with its own
mask: writes tests/fixtures/dropout.safetensors (float64, about 4 KiB) holding the input `x`
(nonzero, so the mask shows in the output), the probability `p` ([1]), PyTorch's output
`y = F.dropout(x, p)` in training, a fixed random upstream gradient `gy`, and the gradient of
`sum(y * gy)`, `dx`. The test reads PyTorch's mask off `y` (nonzero where kept) and checks that
tensorscope scales kept elements alike and that both gradients are `gy * mask / (1 - p)`.
Read by tests/integration/ops/dropout.rs; CI never runs Python, the fixture is committed.

Regenerate (from the repository root):
  /work/venv/bin/python scripts/dropout_fixture.py
(any Python with torch, numpy and safetensors will do).
"""
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

torch.manual_seed(0)
P = 0.3
x = torch.randn(8, 16, dtype=torch.float64, requires_grad=True)
y = F.dropout(x, P, training=True)
gy = torch.randn(y.shape, dtype=torch.float64)
(y * gy).sum().backward()
tensors = dict(x=x, p=torch.tensor([P], dtype=torch.float64), y=y, gy=gy, dx=x.grad)
save_file({k: v.detach().contiguous() for k, v in tensors.items()},
          "tests/fixtures/dropout.safetensors", metadata={"torch": torch.__version__})
