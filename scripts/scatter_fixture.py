"""PyTorch reference for tensorscope's index_add and scatter_add.

Writes tests/fixtures/scatter.safetensors (float64 values, int64 positions, about 8 KiB): for each
case `NAME`, the input `NAME.x`, the positions `NAME.ids` (index_add) or `NAME.index`
(scatter_add), the source `NAME.src`, the axis `NAME.axis` (int64), PyTorch's output `NAME.y`, a
fixed random upstream gradient `NAME.gy`, and the gradients of `sum(y * gy)`, `NAME.dx` and
`NAME.dsrc`. In `scatter_small` the index is smaller than the source: PyTorch rejects the source's
gradient there (its backward gives the index's shape), so the case holds `dx` only.
Read by tests/integration/ops/scatter.rs; CI never runs Python, the fixture is committed.

Regenerate (from the repository root):
  /work/venv/bin/python scripts/scatter_fixture.py
(any Python with torch, numpy and safetensors will do).
"""
import torch
from safetensors.torch import save_file

torch.manual_seed(0)
f64 = dict(dtype=torch.float64)
out = {}


def case(name, op, axis, x, positions, src, src_grad=True):
    x, src = x.requires_grad_(), src.requires_grad_(src_grad)
    y = getattr(x, op)(axis, positions, src)
    gy = torch.randn(y.shape, **f64)
    (y * gy).sum().backward()
    key = "ids" if op == "index_add" else "index"
    tensors = {"x": x, key: positions, "src": src, "axis": torch.tensor([axis]), "y": y, "gy": gy,
               "dx": x.grad}
    if src_grad:
        tensors["dsrc"] = src.grad
    out.update({f"{name}.{k}": v.detach().contiguous() for k, v in tensors.items()})


ids = torch.tensor([3, 0, 3, 1, 3])  # repeated ids add up
case("index_add_rows", "index_add", 0, torch.randn(4, 3, **f64), ids, torch.randn(5, 3, **f64))
case("index_add_middle", "index_add", 1, torch.randn(2, 5, 3, **f64), torch.tensor([2, 4, 2]),
     torch.randn(2, 3, 3, **f64))
case("scatter_lanes", "scatter_add", 1, torch.randn(3, 5, **f64), torch.randint(0, 5, (3, 4)),
     torch.randn(3, 4, **f64))
case("scatter_rows", "scatter_add", 0, torch.randn(4, 2, 3, **f64), torch.randint(0, 4, (6, 2, 3)),
     torch.randn(6, 2, 3, **f64))
case("scatter_small", "scatter_add", 0, torch.randn(4, 3, **f64), torch.randint(0, 4, (2, 2)),
     torch.randn(3, 3, **f64), src_grad=False)
save_file(out, "tests/fixtures/scatter.safetensors", metadata={"torch": torch.__version__})
