"""PyTorch's f32 matrix product on the shapes of `peers/benches/matmul.rs`, for its tables in
docs/benchmarks.md ("Matrix products against peers", "Products at transformer shapes").

`torch.matmul(a, b, out=c)` into a preallocated `c`, `torch.set_num_threads(THREADS)` (2, or
`--threads N`), standard normal operands; an operand marked transposed is stored transposed and
passed as its `.mT` view, as a backward passes it. For each shape: warm-up calls for about 0.3 s, then timed calls for about 2 s in batches
of at least 1 ms each; prints the median time per call over the batches and GFLOP/s = 2mkn / time,
and the fastest batch's (which a loaded machine disturbs least).

Run (from the repository root; CI never runs Python):
  python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch numpy
  /tmp/venv/bin/python scripts/matmul_torch.py [--threads 1] [--decode] [--only NAME,NAME]
"""
import argparse
import re
import statistics
import time

import torch

# Name, batch, m, k, n, A stored transposed, B stored transposed: `batch` products of
# [m, k] x [k, n]. Keep in step with SHAPES and TRANSFORMER_SHAPES in peers/src/lib.rs.
SHAPES = [
    ("M", 1, 256, 1024, 1024, False, False),
    ("E", 1, 16384, 64, 64, False, False),
    ("T_fwd", 1, 32, 128, 256, False, False),
    ("T_dx", 1, 32, 256, 128, False, False),
    ("T_dw", 1, 128, 32, 256, False, False),
    ("S", 1, 1024, 1024, 1024, False, False),
    ("qkv384", 1, 2048, 384, 1152, False, False),
    ("fc384", 1, 2048, 384, 1536, False, False),
    ("fc_dx384", 1, 2048, 1536, 384, False, True),
    ("fc_dw384", 1, 384, 2048, 1536, True, False),
    ("scores384", 48, 256, 64, 256, False, True),
    ("av384", 48, 256, 256, 64, False, False),
    ("qkv768", 1, 2048, 768, 2304, False, False),
    ("fc768", 1, 2048, 768, 3072, False, False),
    ("fc_dx768", 1, 2048, 3072, 768, False, True),
    ("fc_dw768", 1, 768, 2048, 3072, True, False),
    ("scores768", 96, 256, 64, 256, False, True),
    ("av768", 96, 256, 256, 64, False, False),
]
# `--decode`: the products of a decode step (issue 28), `[m, k] x [n, k]^T` as `x @ w.T` with `w`
# a PyTorch `[out, in]` weight; keep in step with DECODE in benches/matmul.rs.
DECODE = [
    ("head_gpt2_m1", 1, 1, 768, 50257, False, True),
    ("head_gpt2_m512", 1, 512, 768, 50257, False, True),
    ("q_m1", 1, 1, 768, 768, False, True),
    ("q_m8", 1, 8, 768, 768, False, True),
    ("kv_m1", 1, 1, 768, 256, False, True),
    ("kv_m8", 1, 8, 768, 256, False, True),
    ("up_m1", 1, 1, 768, 2048, False, True),
    ("up_m8", 1, 8, 768, 2048, False, True),
    ("down_m1", 1, 1, 2048, 768, False, True),
    ("down_m8", 1, 8, 2048, 768, False, True),
    ("head_llama_m1", 1, 1, 768, 32000, False, True),
    ("head_llama_m8", 1, 8, 768, 32000, False, True),
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


def operand(batch, rows, cols, transposed):
    """A standard normal [batch,] rows x cols operand, stored transposed (and passed as a view of
    its transpose) if asked."""
    lead = (batch,) if batch > 1 else ()
    if transposed:
        return torch.randn(*lead, cols, rows).mT
    return torch.randn(*lead, rows, cols)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=THREADS)
    parser.add_argument("--only", help="comma-separated shape names")
    parser.add_argument("--decode", action="store_true",
                        help="the decode step's shapes (benches/matmul.rs, group decode)")
    args = parser.parse_args()
    only = set(args.only.split(",")) if args.only else None
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = torch.__config__.show()
    blas = re.search(r"BLAS_INFO=(\w+)", config)
    cpu = re.search(r"CPU capability usage: (\w+)", config)
    print(f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"BLAS {blas.group(1) if blas else '?'}, CPU capability {cpu.group(1) if cpu else '?'}")
    for name, batch, m, k, n, a_t, b_t in DECODE if args.decode else SHAPES:
        if only and name not in only:
            continue
        a, b = operand(batch, m, k, a_t), operand(batch, k, n, b_t)
        c = torch.empty(*((batch,) if batch > 1 else ()), m, n)
        if not torch.allclose(torch.matmul(a, b, out=c), (a.double() @ b.double()).float(),
                              rtol=1e-4, atol=1e-3):
            raise SystemExit(f"{name}: torch.matmul disagrees with the f64 product")
        with torch.no_grad():
            median, fastest, calls = seconds_per_call(lambda: torch.matmul(a, b, out=c))
        flop = 2 * batch * m * k * n
        form = f"{batch} x " if batch > 1 else ""
        form += f"[{m}, {k}]{'^T' if a_t else ''} x [{k}, {n}]{'^T' if b_t else ''}"
        print(f"{name:6} {form}: median {median * 1e3:.4f} ms "
              f"({flop / median / 1e9:.1f} GFLOP/s), fastest batch {fastest * 1e3:.4f} ms "
              f"({flop / fastest / 1e9:.1f} GFLOP/s), {calls} calls")


if __name__ == "__main__":
    main()
