"""PyTorch reference for tensorscope's conv1d and conv2d with stride, padding, dilation and groups.

Writes tests/fixtures/conv.safetensors (float64, about 16 KiB): for each case `caseN`, the input
`caseN.x`, the weight `caseN.w`, the options `caseN.options` (int64: stride, padding, dilation,
groups), PyTorch's output `caseN.y`, a fixed random upstream gradient `caseN.gy`, and the
gradients of `sum(y * gy)` with respect to the input and the weight, `caseN.dx` and `caseN.dw`.
Read by tests/integration/ops/conv.rs; CI never runs Python, the fixture is committed.

Regenerate (from the repository root):
  /work/venv/bin/python scripts/conv_fixture.py
(any Python with torch, numpy and safetensors will do).
"""
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

# (input shape, weight shape, stride, padding, dilation, groups): 2-D cases are 4-D shapes.
CASES = [
    ([2, 4, 6, 5], [6, 2, 3, 2], 2, 1, 2, 2),  # groups, dilation, stride and padding together
    ([1, 3, 5, 5], [3, 1, 2, 3], 1, 2, 1, 3),  # depthwise, padding wider than the kernel
    ([2, 4, 9], [4, 2, 3], 2, 2, 2, 2),        # 1-D, every option
    ([1, 3, 8], [5, 3, 4], 1, 0, 1, 1),        # 1-D, plain
]

torch.manual_seed(0)
out = {}
for i, (xs, ws, stride, padding, dilation, groups) in enumerate(CASES):
    x = torch.randn(xs, dtype=torch.float64, requires_grad=True)
    w = torch.randn(ws, dtype=torch.float64, requires_grad=True)
    conv = F.conv2d if len(xs) == 4 else F.conv1d
    y = conv(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)
    gy = torch.randn(y.shape, dtype=torch.float64)
    (y * gy).sum().backward()
    options = torch.tensor([stride, padding, dilation, groups], dtype=torch.int64)
    tensors = dict(x=x, w=w, options=options, y=y, gy=gy, dx=x.grad, dw=w.grad)
    out.update({f"case{i}.{k}": v.detach().contiguous() for k, v in tensors.items()})
save_file(out, "tests/fixtures/conv.safetensors", metadata={"torch": torch.__version__})
