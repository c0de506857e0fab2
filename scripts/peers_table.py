"""The tables of docs/benchmarks.md ("Matrix products against peers") from the criterion results of
`peers/benches/matmul.rs` and, optionally, the output of `scripts/matmul_torch.py`: one row per
shape, one column per candidate; first the median time per product over the samples with its
GFLOP/s (2mkn / time), then the GFLOP/s of the fastest sample, which a loaded machine disturbs
least.

Run after the bench (from the repository root; CI never runs Python):
  python3 scripts/matmul_torch.py > /tmp/torch.txt      # optional
  python3 scripts/peers_table.py [--threads 1] [--torch /tmp/torch.txt] [CRITERION_DIR]
CRITERION_DIR defaults to $CARGO_TARGET_DIR/criterion, else peers/target/criterion. `--threads N`
reads the bench's `peers_tN` groups (run with `PEERS_THREADS=N`); shapes without results are left
out, so a filtered bench gives a table of its shapes.
"""
import argparse
import json
import os
import re
from pathlib import Path

SHAPES = ["M", "E", "T_fwd", "T_dx", "T_dw", "S",
          "qkv384", "fc384", "fc_dx384", "fc_dw384", "scores384", "av384",
          "qkv768", "fc768", "fc_dx768", "fc_dw768", "scores768", "av768"]
CANDIDATES = ["tensorscope", "matrixmultiply", "matrixmultiply_avx512", "gemm", "gemm_avx512",
              "faer", "openblas"]
TORCH_LINE = re.compile(r"^(\S+)\s.*median ([\d.]+) ms .*fastest batch ([\d.]+) ms")


def time_text(seconds):
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"


def criterion_results(root, group):
    """{(shape, candidate): (flop, median s, fastest s)} for every result of `group` found."""
    results = {}
    for shape in SHAPES:
        for candidate in CANDIDATES:
            run = root / f"{group}_{shape}" / candidate / "new"
            if not run.is_dir():
                continue
            flop = json.loads((run / "benchmark.json").read_text())["throughput"]["Elements"]
            median = json.loads((run / "estimates.json").read_text())["median"]["point_estimate"]
            sample = json.loads((run / "sample.json").read_text())
            fastest = min(t / i for t, i in zip(sample["times"], sample["iters"]))
            results[shape, candidate] = (flop, median * 1e-9, fastest * 1e-9)
    return results


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("criterion_dir", nargs="?")
    parser.add_argument("--torch", help="output of scripts/matmul_torch.py")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.criterion_dir:
        root = Path(args.criterion_dir)
    elif os.environ.get("CARGO_TARGET_DIR"):
        root = Path(os.environ["CARGO_TARGET_DIR"]) / "criterion"
    else:
        root = Path(__file__).resolve().parent.parent / "peers" / "target" / "criterion"
    results = criterion_results(root, "peers" if args.threads == 2 else f"peers_t{args.threads}")
    shapes = [s for s in SHAPES if any(s2 == s for s2, _ in results)]
    columns = [c for c in CANDIDATES if any((s, c) in results for s in shapes)]
    if args.torch:
        flop = {s: next(f for (s2, _), (f, _, _) in results.items() if s2 == s) for s in shapes}
        for line in Path(args.torch).read_text().splitlines():
            match = TORCH_LINE.match(line)
            if match and match.group(1) in flop:
                name = match.group(1)
                median, fastest = float(match.group(2)) * 1e-3, float(match.group(3)) * 1e-3
                results[name, "pytorch"] = (flop[name], median, fastest)
        columns.append("pytorch")

    def table(title, cell):
        print(f"| {title} | " + " | ".join(columns) + " |")
        print("|---|" + "---:|" * len(columns))
        for shape in shapes:
            cells = [cell(*results[shape, c]) if (shape, c) in results else "-" for c in columns]
            print(f"| {shape} | " + " | ".join(cells) + " |")

    table("median (GFLOP/s)", lambda f, m, _: f"{time_text(m)} ({f / m / 1e9:.0f})")
    print()
    table("fastest sample, GFLOP/s", lambda f, _, b: f"{f / b / 1e9:.0f}")


if __name__ == "__main__":
    main()
