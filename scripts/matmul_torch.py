"""PyTorch's f32 matrix product on the shapes of `peers/benches/matmul.rs`, for its table in
docs/benchmarks.md ("Matrix products against peers").

`torch.matmul(a, b, out=c)` into a preallocated `c`, `torch.set_num_threads(2)`, standard normal
operands. For each shape: warm-up calls for about 0.3 s, then timed calls for about 2 s in batches
of at least 1 ms each; prints the median time per call over the batches and GFLOP/s = 2mkn / time,
and the fastest batch's (which a loaded machine disturbs least).

Run (from the repository root; CI never runs Python):
  python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch numpy
  /tmp/venv/bin/python scripts/matmul_torch.py
"""
import re
import statistics
import time

import torch

# Name, m, k, n: [m, k] x [k, n]. Keep in step with SHAPES in peers/src/lib.rs.
SHAPES = [
    ("M", 256, 1024, 1024),
    ("E", 16384, 64, 64),
    ("T_fwd", 32, 128, 256),
    ("T_dx", 32, 256, 128),
    ("T_dw", 128, 32, 256),
    ("S", 1024, 1024, 1024),
]
THREADS = 2
WARM_UP_S = 0.3
MEASURE_S = 2.0
BATCH_S = 1e-3


def seconds_per_call(call):
    """Median and least seconds per call, over batches of calls that each take at least BATCH_S,
    and the number of calls timed."""
    start = time.perf_counter()
    while time.perf_counter() - start < WARM_UP_S:
        call()
    calls = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        if time.perf_counter() - t0 >= BATCH_S:
            break
        calls *= 2
    per_call = []
    start = time.perf_counter()
    while time.perf_counter() - start < MEASURE_S or len(per_call) < 20:
        t0 = time.perf_counter()
        for _ in range(calls):
            call()
        per_call.append((time.perf_counter() - t0) / calls)
    return statistics.median(per_call), min(per_call), len(per_call) * calls


def main():
    torch.set_num_threads(THREADS)
    torch.manual_seed(0)
    config = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=(\w+)", config)
    cpu = re.search(r"CPU capability usage: (\w+)", config)
    print(f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"BLAS {blas.group(1) if blas else '?'}, CPU capability {cpu.group(1) if cpu else '?'}")
    for name, m, k, n in SHAPES:
        a, b = torch.randn(m, k), torch.randn(k, n)
        c = torch.empty(m, n)
        if not torch.allclose(torch.matmul(a, b, out=c), (a.double() @ b.double()).float(),
                              rtol=1e-4, atol=1e-3):
            raise SystemExit(f"{name}: torch.matmul disagrees with the f64 product")
        with torch.no_grad():
            median, fastest, calls = seconds_per_call(lambda: torch.matmul(a, b, out=c))
        flop = 2 * m * k * n
        print(f"{name:6} [{m}, {k}] x [{k}, {n}]: median {median * 1e3:.4f} ms "
              f"({flop / median / 1e9:.1f} GFLOP/s), fastest batch {fastest * 1e3:.4f} ms "
              f"({flop / fastest / 1e9:.1f} GFLOP/s), {calls} calls")


if __name__ == "__main__":
    main()
