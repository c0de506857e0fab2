"""PyTorch eager on the reference forwards of `examples/common/reference_model.rs`, for comparison
with `cargo run --release --example reference_forward -- pooled <E|M> 10`.

16 residual MLP blocks `y = LayerNorm(x + gelu_tanh(x W1 + b1) W2 + b2)`, f32, under `no_grad`,
on 2 threads. Prints the median time per forward over 10 forwards after 2 warm-up forwards.

Run (from the repository root; CI never runs Python):
  python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch numpy
  /tmp/venv/bin/python scripts/reference_forward_torch.py
"""
import statistics
import time

import torch
import torch.nn.functional as F

SHAPES = {"E": (16384, 64), "M": (256, 1024)}
BLOCKS = 16


def main():
    torch.set_num_threads(2)
    torch.manual_seed(0)
    for name, (batch, width) in SHAPES.items():
        scale = width ** -0.5
        weights = [(torch.randn(width, width) * scale, torch.randn(width) * 0.1,
                    torch.randn(width, width) * scale, torch.randn(width) * 0.1)
                   for _ in range(BLOCKS)]
        x0 = torch.randn(batch, width)

        def forward():
            x = x0
            for w1, b1, w2, b2 in weights:
                h = F.gelu(x @ w1 + b1, approximate="tanh")
                x = F.layer_norm(x + h @ w2 + b2, (width,), eps=1e-5)
            return x

        with torch.no_grad():
            for _ in range(2):
                forward()
            times = []
            for _ in range(10):
                start = time.perf_counter()
                forward()
                times.append((time.perf_counter() - start) * 1e3)
        print(f"PyTorch {torch.__version__} eager {name}: median {statistics.median(times):.2f} ms "
              f"per forward over 10 forwards ({torch.get_num_threads()} threads)")


if __name__ == "__main__":
    main()
