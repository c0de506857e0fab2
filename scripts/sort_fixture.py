"""PyTorch reference for tensorscope's sort, argsort and topk.

Writes tests/fixtures/sort.safetensors (float64 values, int64 positions, about 4 KiB): for each
case `NAME`, the input `NAME.x`, the arguments `NAME.args` (int64: axis, k, and 1 for descending
or largest, 0 otherwise; k is -1 for a sort), PyTorch's values `NAME.y` and positions
`NAME.indices`, a fixed random upstream gradient `NAME.gy`, and the gradient of `sum(y * gy)`,
`NAME.dx`. Sorts run with stable=True (equal values keep their order), and their inputs hold ties
and a NaN; topk inputs hold distinct values, since PyTorch leaves topk's order of ties unspecified.
Read by tests/integration/ops/sort.rs; CI never runs Python, the fixture is committed.

Regenerate (from the repository root):
  /work/venv/bin/python scripts/sort_fixture.py
(any Python with torch, numpy and safetensors will do).
"""
import torch
from safetensors.torch import save_file

torch.manual_seed(0)
out = {}


def case(name, x, axis, k, flag):
    x = x.to(torch.float64).requires_grad_()
    if k < 0:
        y, indices = torch.sort(x, dim=axis, descending=bool(flag), stable=True)
    else:
        y, indices = torch.topk(x, k, dim=axis, largest=bool(flag), sorted=True)
    gy = torch.randn(y.shape, dtype=torch.float64)
    (y * gy).sum().backward()
    tensors = dict(x=x, args=torch.tensor([axis, k, flag]), y=y, indices=indices, gy=gy, dx=x.grad)
    out.update({f"{name}.{key}": v.detach().contiguous() for key, v in tensors.items()})


rows = torch.randint(-3, 4, (3, 6)).double() / 2  # ties
rows[1, 2] = float("nan")
case("sort_rows", rows, 1, -1, 0)
columns = torch.randint(-2, 3, (5, 3)).double()
columns[3, 1] = float("nan")
case("sort_columns_descending", columns, 0, -1, 1)
case("topk_largest", torch.randn(4, 7), 1, 3, 1)
case("topk_smallest", torch.randn(6, 2, 3), 0, 2, 0)
save_file(out, "tests/fixtures/sort.safetensors", metadata={"torch": torch.__version__})
