"""PyTorch's convolutions (oneDNN on x86) on the shapes of `examples/conv_table.rs`, the
convolutions of a diffusion UNet (issue 40), for the table in docs/benchmarks.md ("Convolutions
at a UNet's shapes").

For each shape: the forward under `torch.no_grad()`; the forward and backward to the input (`x`
requires a gradient, the weight does not); the forward and backward to the weight. `f32`,
`torch.set_num_threads(THREADS)` (2, or `--threads N`), values in [-1, 1) (the weight scaled by
1/sqrt(fan-in)), the output's gradient all ones, as the Rust example does. Each case runs for
about 0.3 s per round; the table gives the median over the rounds of each round's median.

`--vs BINARY` (the example built in release: `cargo build --release --example conv_table`, then
`target/release/examples/conv_table`) runs that binary for one round between each of this
script's rounds, with `TENSORSCOPE_THREADS` set to the same thread count, so that both sides'
rounds alternate in one session, and prints both sides' medians and their ratio.

Run (from the repository root; CI never runs Python):
  python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch numpy
  /tmp/venv/bin/python scripts/conv_torch.py [--threads 1] [--batch 4] [--rounds 5] \
      [--vs target/release/examples/conv_table]
"""
import argparse
import json
import os
import statistics
import subprocess
import time

import torch
import torch.nn.functional as F

# Name, input channels, image side, output channels, kernel side, stride; padding kernel // 2.
# Keep in step with SHAPES in examples/conv_table.rs.
SHAPES = [
    ("in3", 3, 64, 64, 3, 1),
    ("r64", 64, 64, 64, 3, 1),
    ("down64", 64, 64, 64, 3, 2),
    ("r128", 128, 32, 128, 3, 1),
    ("r256", 256, 16, 256, 3, 1),
    ("p64to128", 64, 32, 128, 1, 1),
    ("p128to64", 128, 64, 64, 1, 1),
]
MODES = ["fwd", "fwd+dx", "fwd+dw"]


def timed(f, budget=0.3):
    """The median milliseconds of calls to `f` over about `budget` seconds (at least three)."""
    f()
    times = []
    start = time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < budget:
        t = time.perf_counter()
        f()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def uniform(shape, generator):
    return torch.rand(shape, generator=generator) * 2 - 1


def torch_round(batch):
    """One round: each case's median milliseconds, keyed by (shape, mode)."""
    generator = torch.Generator().manual_seed(0)
    out = {}
    for name, c_in, side, c_out, k, stride in SHAPES:
        x = uniform((batch, c_in, side, side), generator)
        w = uniform((c_out, c_in, k, k), generator) / (c_in * k * k) ** 0.5
        pad = k // 2

        def forward():
            with torch.no_grad():
                F.conv2d(x, w, stride=stride, padding=pad)

        def backward(to_input):
            xs = x.detach().requires_grad_(to_input)
            ws = w.detach().requires_grad_(not to_input)
            y = F.conv2d(xs, ws, stride=stride, padding=pad)
            y.backward(torch.ones_like(y))

        out[(name, "fwd")] = timed(forward)
        out[(name, "fwd+dx")] = timed(lambda: backward(True))
        out[(name, "fwd+dw")] = timed(lambda: backward(False))
    return out


def rust_round(binary, batch, threads):
    env = dict(os.environ, TENSORSCOPE_THREADS=str(threads))
    run = subprocess.run(
        [binary, "--batch", str(batch), "--rounds", "1", "--json"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    out = {}
    for line in run.stdout.splitlines():
        row = json.loads(line)
        out[(row["shape"], row["mode"])] = row["ms"]
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--vs", help="the release conv_table binary, run between rounds")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ours, theirs = [], []
    for _ in range(args.rounds):
        theirs.append(torch_round(args.batch))
        if args.vs:
            ours.append(rust_round(args.vs, args.batch, args.threads))
    print(
        f"batch {args.batch}, {args.threads} threads, {args.rounds} alternated rounds, "
        f"torch {torch.__version__}: median ms"
    )
    if args.vs:
        print("| shape | case | tensorscope | PyTorch | ratio |")
        print("| --- | --- | --- | --- | --- |")
    else:
        print("| shape | case | PyTorch |")
        print("| --- | --- | --- |")
    for name, *_ in SHAPES:
        for mode in MODES:
            t = statistics.median(r[(name, mode)] for r in theirs)
            if args.vs:
                o = statistics.median(r[(name, mode)] for r in ours)
                print(f"| {name} | {mode} | {o:.3f} | {t:.3f} | {o / t:.2f}x |")
            else:
                print(f"| {name} | {mode} | {t:.3f} |")


if __name__ == "__main__":
    main()
