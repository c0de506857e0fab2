"""PyTorch eager on the training step of `examples/checkpointed_training.rs`, for comparison with
`cargo run --release --example checkpointed_training`.

64 pre-norm residual blocks `x + W2 gelu(W1 LayerNorm(x))` (affine layer norm, GELU's tanh form,
hidden width 2x), width 128, batch 32, f32, on 2 threads; the loss is the mean squared error against
a fixed random teacher `tanh(x A)`; Adam with lr 1e-3. Rows: no checkpointing; `checkpoint_sequential`
with 8 segments (sqrt of 64 blocks, as the `sqrt` row of the Rust example), both with PyTorch's
default Adam (`foreach`) and with `fused=True`. Each row runs its steps in chunks of 5, the rows
taking turns as the Rust example's do; the first 2 steps of a row are not timed. Prints the median
step time per row and its ratio to the unchecked row with the same optimizer.

Run (from the repository root; CI never runs Python):
  python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch numpy
  /tmp/venv/bin/python scripts/training_step_torch.py
"""
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint_sequential

BLOCKS, WIDTH, BATCH, STEPS, CHUNK = 64, 128, 32, 60, 5


class Block(nn.Module):
    def __init__(self, i):
        super().__init__()
        hidden = 2 * WIDTH
        g = torch.Generator().manual_seed(10 * i)
        self.ln = nn.LayerNorm(WIDTH, eps=1e-5)
        self.w1 = nn.Parameter(torch.randn(WIDTH, hidden, generator=g) / WIDTH ** 0.5)
        self.b1 = nn.Parameter(torch.zeros(hidden))
        self.w2 = nn.Parameter(torch.randn(hidden, WIDTH, generator=g) * 0.5 / (hidden * BLOCKS) ** 0.5)
        self.b2 = nn.Parameter(torch.zeros(WIDTH))

    def forward(self, x):
        h = F.gelu(self.ln(x) @ self.w1 + self.b1, approximate="tanh")
        return x + h @ self.w2 + self.b2


class Row:
    def __init__(self, name, segments, fused):
        self.name, self.segments = name, segments
        self.model = nn.Sequential(*[Block(i) for i in range(BLOCKS)])
        self.adam = torch.optim.Adam(self.model.parameters(), lr=1e-3, fused=fused)
        self.teacher = torch.randn(WIDTH, WIDTH, generator=torch.Generator().manual_seed(7)) * 0.2
        self.times, self.losses = [], []

    def step(self, step):
        x = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(1000 + step))
        target = torch.tanh(x @ self.teacher)
        start = time.perf_counter()
        if self.segments:
            y = checkpoint_sequential(self.model, self.segments, x, use_reentrant=False)
        else:
            y = self.model(x)
        loss = F.mse_loss(y, target)
        self.adam.zero_grad(set_to_none=False)
        loss.backward()
        self.adam.step()
        elapsed = time.perf_counter() - start
        if step >= 2:
            self.times.append(elapsed * 1e3)
        self.losses.append(loss.item())


def main():
    torch.set_num_threads(2)
    rows = [Row("none", 0, False), Row("sqrt (8 segments)", 8, False),
            Row("none, fused Adam", 0, True), Row("sqrt, fused Adam", 8, True)]
    for start in range(0, STEPS, CHUNK):
        for row in rows:
            for step in range(start, min(start + CHUNK, STEPS)):
                row.step(step)
    medians = [statistics.median(r.times) for r in rows]
    print(f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads: {BLOCKS} blocks, "
          f"width {WIDTH}, batch {BATCH}, {STEPS} Adam steps per row")
    for row, median in zip(rows, medians):
        base = medians[2] if "fused" in row.name else medians[0]
        print(f"{row.name:<20} median step {median:7.2f} ms  {median / base:5.2f}x  "
              f"loss {row.losses[0]:.5f} -> {row.losses[-1]:.5f}")


if __name__ == "__main__":
    main()
