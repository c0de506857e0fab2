"""The table of docs/benchmarks.md ("Matrix products against peers") from the criterion results of
`peers/benches/matmul.rs`: for each shape and candidate, the median time per product over the
samples, its GFLOP/s (2mkn / time), and the fastest sample's time, which a loaded machine disturbs
least.

Run after the bench (from the repository root; CI never runs Python):
  python3 scripts/peers_table.py [CRITERION_DIR]
CRITERION_DIR defaults to $CARGO_TARGET_DIR/criterion, else peers/target/criterion.
"""
import json
import os
import sys
from pathlib import Path

SHAPES = ["M", "E", "T_fwd", "T_dx", "T_dw", "S"]
CANDIDATES = ["tensorscope", "matrixmultiply", "matrixmultiply_avx512", "gemm", "faer", "openblas"]


def time_text(seconds):
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def main():
    if len(sys.argv) > 1:
        root = Path(sys.argv[1])
    elif os.environ.get("CARGO_TARGET_DIR"):
        root = Path(os.environ["CARGO_TARGET_DIR"]) / "criterion"
    else:
        root = Path(__file__).resolve().parent.parent / "peers" / "target" / "criterion"
    print("| shape | candidate | median | GFLOP/s | fastest sample | GFLOP/s |")
    print("|---|---|---:|---:|---:|---:|")
    for shape in SHAPES:
        for candidate in CANDIDATES:
            run = root / f"peers_{shape}" / candidate / "new"
            if not run.is_dir():
                continue
            flops = json.loads((run / "benchmark.json").read_text())["throughput"]["Elements"]
            median = json.loads((run / "estimates.json").read_text())["median"]["point_estimate"]
            sample = json.loads((run / "sample.json").read_text())
            fastest = min(t / i for t, i in zip(sample["times"], sample["iters"]))
            median, fastest = median * 1e-9, fastest * 1e-9
            print(f"| {shape} | {candidate} | {time_text(median)} | {flops / median / 1e9:.0f} "
                  f"| {time_text(fastest)} | {flops / fastest / 1e9:.0f} |")


if __name__ == "__main__":
    main()
