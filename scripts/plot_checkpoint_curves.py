"""Draws issue 29's checkpointing memory/time curves as an SVG, from the two measured tables:
PyTorch's (`scripts/checkpoint_curve_torch.py` writes `docs/checkpoint_curves_torch.json`) and
tensorscope's (`docs/checkpoint_curves_tensorscope.json`, a list of {model, config, step_ms,
peak_bytes}, written by the Rust side).

One panel per model (`mlp`, `gpt`, `denoiser`, then any other model name found, in the order
found), x the peak step memory in MiB (the allocator's or the pool's peak during a training step
above what the step starts with), y the median step time in ms, both from 0 (a point slower than
2.5x the panel's 80th percentile time is an outlier, drawn at the top of the axis with its time
in its label). The series:

- tensorscope, memory budget: the configurations whose name starts with `memory` (`memory 1.04
  MiB`: checkpoints chosen to fit that many bytes), a line through them in the order of the number
  after `memory` (else of their peak), each point labelled with that number;
- tensorscope, `Budget(n)`: the configurations whose name starts with `budget` (`budget 8`: room
  for n activations, the binomial schedule), a thinner line in the order of n, labelled;
- tensorscope, fixed policies: every other configuration (`none`, `every 4`, `sqrt`, ...), a
  marker each, labelled with its name;
- PyTorch eager: a marker;
- PyTorch `checkpoint_sequential`: a line through the segment counts, in increasing order, each
  point labelled with its count;
- PyTorch `torch.compile` budgets: a line through `activation_memory_budget` from 1.0 down, each
  point labelled with its budget; the compile without a budget a hollow marker;
- the `torch.compile` budgets once more, placed at their bytes saved for backward rather than
  their peak (dashed, hollow; `--no-saved` leaves them out): what the budget cuts against what the
  allocator sees.

A PyTorch row whose timed steps another process disturbed (`other_load` above 0.25 cores) is
drawn hollow and its label starred. A missing input file, model or series is left out (a
missing file with a note on stderr); nothing is invented.

Pure Python, no plotting library. Run from the repository root:
  /work/venv/bin/python scripts/plot_checkpoint_curves.py
      [--torch docs/checkpoint_curves_torch.json]
      [--tensorscope docs/checkpoint_curves_tensorscope.json] [--out docs/checkpoint_curves.svg]
      [--no-saved]
"""
import argparse
import json
import math
import re
import sys
from xml.sax.saxutils import escape

MIB = float(1 << 20)
BUSY = 0.25
WIDTH = 1000
PANEL_H = 380
MARGIN = dict(left=78, right=24, top=46, bottom=48)
FONT = "font-family=\"Helvetica, Arial, sans-serif\""

TITLES = {
    "mlp": "64-block pre-norm residual MLP (width 128, batch 32)",
    "gpt": "GPT (6 blocks, width 384, context 256)",
    "denoiser": "convolutional denoiser (64 channels, 64x64)",
}
ORDER = ["mlp", "gpt", "denoiser"]

# name, colour, dashed, drawn as a line
SERIES = {
    "ts_memory": ("tensorscope, memory budget (MiB)", "#d62728", False, True),
    "ts_budget": ("tensorscope, Budget(n activations)", "#ff7f0e", True, True),
    "ts_fixed": ("tensorscope, fixed policies", "#d62728", False, False),
    "pt_eager": ("PyTorch eager", "#333333", False, False),
    "pt_ckpt": ("PyTorch checkpoint_sequential (segments)", "#1f77b4", False, True),
    "pt_compile": ("PyTorch torch.compile, activation_memory_budget", "#2ca02c", False, True),
    "pt_compile_default": ("PyTorch torch.compile, no budget", "#2ca02c", False, False),
    "pt_saved": ("torch.compile budgets placed at saved bytes (not a peak)",
                 "#98df8a", True, True),
}


def load(path, what):
    try:
        with open(path) as f:
            rows = json.load(f)
    except FileNotFoundError:
        print(f"{path}: not found; {what} left out", file=sys.stderr)
        return []
    except (OSError, ValueError) as e:
        print(f"{path}: cannot read ({e}); {what} left out", file=sys.stderr)
        return []
    if not isinstance(rows, list):
        print(f"{path}: not a list of rows; {what} left out", file=sys.stderr)
        return []
    good = []
    for r in rows:
        try:
            float(r["step_ms"]), float(r["peak_bytes"]), str(r["model"]), str(r["config"])
        except (KeyError, TypeError, ValueError):
            print(f"{path}: a row without model, config, step_ms and peak_bytes skipped: {r}",
                  file=sys.stderr)
            continue
        good.append(r)
    return good


def number_after(config, word):
    m = re.search(re.escape(word) + r"\s*([0-9.eE+-]+)", config)
    try:
        return float(m.group(1)) if m else None
    except ValueError:
        return None


def point(row, x_key="peak_bytes", label=""):
    disturbed = (row.get("other_load") or 0) > BUSY
    return {
        "x": float(row[x_key]) / MIB,
        "y": float(row["step_ms"]),
        "label": label + ("*" if disturbed else ""),
        "hollow": disturbed,
    }


def series_of(model, torch_rows, ts_rows, saved):
    """{series key: [points]} for one model; empty series left out."""
    out = {}
    ts = [r for r in ts_rows if r["model"] == model]

    def prefixed(word):
        rows = [r for r in ts if str(r["config"]).strip().lower().startswith(word)]
        rows.sort(key=lambda r: (number_after(r["config"], word) is None,
                                 number_after(r["config"], word) or 0.0,
                                 float(r["peak_bytes"])))
        return rows

    def short(r, word):
        n = number_after(r["config"], word)
        return f"{n:g}" if n is not None else str(r["config"])

    memory, budget = prefixed("memory"), prefixed("budget")
    fixed = [r for r in ts if r not in memory and r not in budget]
    out["ts_memory"] = [point(r, label=short(r, "memory")) for r in memory]
    out["ts_budget"] = [point(r, label=f"n={short(r, 'budget')}") for r in budget]
    out["ts_fixed"] = [point(r, label=str(r["config"])) for r in fixed]

    pt = [r for r in torch_rows if r["model"] == model]

    def family(r):
        f = r.get("family")
        if f:
            return f
        c = str(r["config"])
        return ("checkpoint_sequential" if c.startswith("ckpt_seq")
                else "torch.compile" if c.startswith("compile") else "eager")

    def param(r, word):
        p = r.get("param")
        return float(p) if isinstance(p, (int, float)) else number_after(str(r["config"]), word)

    out["pt_eager"] = [point(r, label="eager") for r in pt if family(r) == "eager"]
    ckpt = [r for r in pt if family(r) == "checkpoint_sequential" and param(r, "ckpt_seq")]
    ckpt.sort(key=lambda r: param(r, "ckpt_seq"))
    out["pt_ckpt"] = [point(r, label=f"{param(r, 'ckpt_seq'):g}") for r in ckpt]
    compiled = [r for r in pt if family(r) == "torch.compile"]
    budgets = [r for r in compiled if param(r, "budget") is not None]
    budgets.sort(key=lambda r: -param(r, "budget"))
    out["pt_compile"] = [point(r, label=f"{param(r, 'budget'):g}") for r in budgets]
    out["pt_compile_default"] = [point(r, label="compile") for r in compiled
                                 if param(r, "budget") is None]
    if saved:
        out["pt_saved"] = [point(r, "saved_bytes", f"{param(r, 'budget'):g}") for r in budgets
                           if isinstance(r.get("saved_bytes"), (int, float))]
    return {k: v for k, v in out.items() if v}


def nice_step(span, ticks=6):
    """A step of 1, 2 or 5 times a power of ten giving about `ticks` ticks over `span`."""
    if span <= 0:
        return 1.0
    raw = span / ticks
    power = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * power:
            return m * power
    return 10 * power


def tick_label(v, step):
    digits = max(0, -int(math.floor(math.log10(step)))) if step < 1 else 0
    return f"{v:.{digits}f}"


def marker(kind, x, y, colour, hollow, size=5.0):
    fill = "white" if hollow else colour
    style = f'fill="{fill}" stroke="{colour}" stroke-width="1.6"'
    if kind == "ts_fixed":  # a diamond
        s = size * 1.3
        return (f'<path d="M{x:.1f},{y - s:.1f}L{x + s:.1f},{y:.1f}L{x:.1f},{y + s:.1f}'
                f'L{x - s:.1f},{y:.1f}Z" {style}/>')
    if kind == "pt_eager":  # a square
        return (f'<rect x="{x - size:.1f}" y="{y - size:.1f}" width="{2 * size:.1f}" '
                f'height="{2 * size:.1f}" {style}/>')
    if kind == "pt_compile_default":  # a triangle, hollow
        s = size * 1.3
        return (f'<path d="M{x:.1f},{y - s:.1f}L{x + s:.1f},{y + s * 0.8:.1f}'
                f'L{x - s:.1f},{y + s * 0.8:.1f}Z" fill="white" stroke="{colour}" '
                f'stroke-width="1.6"/>')
    if kind == "pt_saved":
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{size - 1:.1f}" fill="white" ' \
               f'stroke="{colour}" stroke-width="1.4"/>'
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="{size - 0.5:.1f}" {style}/>'


def y_limit(points):
    """The top of the time axis: above the slowest point, unless some are outliers (slower than
    2.5x the panel's 80th percentile time), which are then drawn at the top."""
    ys = sorted(p["y"] for p in points)
    limit = 2.5 * ys[int(0.8 * (len(ys) - 1))]
    return max(y for y in ys if y <= limit) * 1.1


class Labels:
    """Places point labels where they overlap no label placed before and no marker, trying a few
    positions around the point."""

    OFFSETS = [(7, -7, "start"), (7, 14, "start"), (-7, -7, "end"), (-7, 14, "end"),
               (7, -19, "start"), (-7, -19, "end"), (7, 26, "start"), (-7, 26, "end")]

    def __init__(self, markers):
        self.boxes = [(x - 5, y - 5, x + 5, y + 5) for x, y in markers]

    def place(self, x, y, text, size=11, below=False):
        w, h = 0.6 * size * len(text), size
        first = None
        offsets = self.OFFSETS[1::2] + self.OFFSETS[::2] if below else self.OFFSETS
        for dx, dy, anchor in offsets:
            x0 = x + dx if anchor == "start" else x + dx - w
            box = (x0, y + dy - h + 2, x0 + w, y + dy + 2)
            first = first or (x + dx, y + dy, anchor, box)
            if not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3]
                       for b in self.boxes):
                self.boxes.append(box)
                return x + dx, y + dy, anchor
        self.boxes.append(first[3])
        return first[:3]


def panel(model, series, top):
    """The SVG of one model's panel, its top at `top`."""
    left, right = MARGIN["left"], WIDTH - MARGIN["right"]
    y0, y1 = top + MARGIN["top"], top + PANEL_H - MARGIN["bottom"]
    points = [p for ps in series.values() for p in ps]
    max_x = max(p["x"] for p in points) * 1.08
    max_y = y_limit(points)
    sx, sy = nice_step(max_x), nice_step(max_y, 5)
    max_x = math.ceil(max_x / sx) * sx or 1.0
    max_y = math.ceil(max_y / sy) * sy or 1.0

    def px(v):
        return left + (right - left) * v / max_x

    def py(v):
        return y1 - (y1 - y0) * min(v, max_y) / max_y

    title = TITLES.get(model, model)
    out = [f'<g class="panel" id="panel-{escape(model)}">',
           f'<text x="{left}" y="{top + 22}" font-size="16" font-weight="bold">'
           f'{escape(title)}</text>']
    # Grid and ticks.
    i = 0
    while i * sx <= max_x + 1e-9:
        v = i * sx
        out.append(f'<line x1="{px(v):.1f}" y1="{y0}" x2="{px(v):.1f}" y2="{y1}" '
                   f'stroke="#e5e5e5"/>')
        out.append(f'<text x="{px(v):.1f}" y="{y1 + 17}" font-size="12" text-anchor="middle">'
                   f'{tick_label(v, sx)}</text>')
        i += 1
    i = 0
    while i * sy <= max_y + 1e-9:
        v = i * sy
        out.append(f'<line x1="{left}" y1="{py(v):.1f}" x2="{right}" y2="{py(v):.1f}" '
                   f'stroke="#e5e5e5"/>')
        out.append(f'<text x="{left - 7}" y="{py(v) + 4:.1f}" font-size="12" text-anchor="end">'
                   f'{tick_label(v, sy)}</text>')
        i += 1
    out.append(f'<path d="M{left},{y0}V{y1}H{right}" fill="none" stroke="black"/>')
    out.append(f'<text x="{(left + right) / 2:.0f}" y="{y1 + 38}" font-size="13" '
               f'text-anchor="middle">peak step memory (MiB)</text>')
    cy = (y0 + y1) / 2
    out.append(f'<text x="20" y="{cy:.0f}" font-size="13" text-anchor="middle" '
               f'transform="rotate(-90 20 {cy:.0f})">step time (ms)</text>')
    # Lines first, then markers, then labels on top.
    for key, ps in series.items():
        _, colour, dashed, line = SERIES[key]
        if line and len(ps) > 1:
            d = "".join(f'{"M" if k == 0 else "L"}{px(p["x"]):.1f},{py(p["y"]):.1f}'
                        for k, p in enumerate(ps))
            dash = ' stroke-dasharray="6 4"' if dashed else ""
            width = 1.5 if dashed else 2
            out.append(f'<path d="{d}" fill="none" stroke="{colour}" stroke-width="{width}"'
                       f'{dash}/>')
    labels = Labels([(px(p["x"]), py(p["y"])) for p in points])
    texts = []
    for key, ps in series.items():
        _, colour, _, _ = SERIES[key]
        for p in ps:
            x, y = px(p["x"]), py(p["y"])
            out.append(marker(key, x, y, colour, p["hollow"]))
            text, clipped = p["label"], p["y"] > max_y
            if clipped:  # an outlier, drawn at the top: its time in the label
                out.append(f'<path d="M{x - 4:.1f},{y - 7:.1f}L{x:.1f},{y - 13:.1f}'
                           f'L{x + 4:.1f},{y - 7:.1f}" fill="none" stroke="{colour}"/>')
                text = f"{text}: {p['y']:.0f} ms".lstrip(": ")
            if text:
                lx, ly, anchor = labels.place(x, y, text, below=clipped)
                fill = colour if key != "pt_saved" else "#5a9a50"
                texts.append(f'<text x="{lx:.1f}" y="{ly:.1f}" font-size="11" '
                             f'text-anchor="{anchor}" fill="{fill}">{escape(text)}</text>')
    out += texts
    out.append("</g>")
    return out


def legend(keys, top):
    out = []
    cols = 2
    col_w = (WIDTH - MARGIN["left"] - MARGIN["right"]) / cols
    for i, key in enumerate(keys):
        name, colour, dashed, line = SERIES[key]
        x = MARGIN["left"] + (i % cols) * col_w
        y = top + 18 + (i // cols) * 20
        if line:
            dash = ' stroke-dasharray="6 4"' if dashed else ""
            out.append(f'<path d="M{x:.1f},{y}h28" stroke="{colour}" stroke-width="2"{dash}/>')
        out.append(marker(key, x + 14, y, colour, False))
        out.append(f'<text x="{x + 36:.1f}" y="{y + 4}" font-size="13">{escape(name)}</text>')
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch", default="docs/checkpoint_curves_torch.json")
    parser.add_argument("--tensorscope", default="docs/checkpoint_curves_tensorscope.json")
    parser.add_argument("--out", default="docs/checkpoint_curves.svg")
    parser.add_argument("--no-saved", dest="saved", action="store_false",
                        help="leave out the torch.compile budgets placed at their saved bytes")
    args = parser.parse_args()

    torch_rows = load(args.torch, "PyTorch's series")
    ts_rows = load(args.tensorscope, "tensorscope's series")
    found = []
    for r in ts_rows + torch_rows:
        if r["model"] not in found:
            found.append(r["model"])
    models = [m for m in ORDER if m in found] + [m for m in found if m not in ORDER]
    panels = [(m, series_of(m, torch_rows, ts_rows, args.saved)) for m in models]
    panels = [(m, s) for m, s in panels if s]
    if not panels:
        sys.exit("nothing to plot: no rows in either input")
    used = [k for k in SERIES if any(k in s for _, s in panels)]

    info = [r for r in torch_rows if r.get("torch_version")]
    subtitle = []
    if info:
        r = info[0]
        subtitle.append(f"PyTorch {r['torch_version']}, {r.get('threads', '?')} threads, "
                        f"CPU {r.get('cpu', '?')}")
    if not ts_rows:
        subtitle.append("no tensorscope rows given")
    if any((r.get("other_load") or 0) > BUSY for r in torch_rows):
        subtitle.append("* hollow: timed while another process was busy")
    head = 30 + (18 if subtitle else 0)
    legend_h = 24 + 20 * math.ceil(len(used) / 2)
    height = head + legend_h + PANEL_H * len(panels)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" {FONT}>',
           f'<rect width="{WIDTH}" height="{height}" fill="white"/>',
           f'<text x="{WIDTH / 2}" y="24" font-size="18" text-anchor="middle" '
           f'font-weight="bold">Activation checkpointing: step time against peak step memory'
           f'</text>']
    if subtitle:
        svg.append(f'<text x="{WIDTH / 2}" y="44" font-size="12" text-anchor="middle" '
                   f'fill="#555">{escape("; ".join(subtitle))}</text>')
    svg += legend(used, head)
    for i, (model, series) in enumerate(panels):
        svg += panel(model, series, head + legend_h + i * PANEL_H)
    svg.append("</svg>")
    with open(args.out, "w") as f:
        f.write("\n".join(svg) + "\n")
    print(f"wrote {args.out}: {len(panels)} panels ({', '.join(m for m, _ in panels)}), "
          f"series: {', '.join(used)}")


if __name__ == "__main__":
    main()
