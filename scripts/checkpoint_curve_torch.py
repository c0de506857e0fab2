"""PyTorch's side of issue 29's checkpointing memory/time curve: for the three models of the Rust
side, the step time, the allocator's peak step memory and the bytes saved for backward without
checkpointing, under `torch.utils.checkpoint.checkpoint_sequential` at several segment counts, and
under `torch.compile` at several `torch._functorch.config.activation_memory_budget` fractions.

The models, built as the Rust examples build them (same architecture, sizes, initial scales, loss,
optimizer; PyTorch's own random numbers):

- `mlp`: the deep residual MLP of `examples/checkpointed_training.rs` (`examples/common/
  pre_norm_mlp.rs`): 64 pre-norm blocks `x + W2 gelu(W1 LayerNorm(x))`, width 128, hidden 256,
  affine LayerNorm (eps 1e-5), GELU's tanh form; W1 of std 1/sqrt(width), W2 of std
  0.5/sqrt(hidden * blocks), biases zero. Batch 32 of `x ~ N(0, 1)`, target the fixed random
  teacher `tanh(x A)` (A of std 0.2), mean squared error, Adam lr 1e-3. The checkpointed layers:
  the 64 blocks (the Rust `#[checkpoint]` loop).
- `gpt`: the GPT-2-style decoder of `examples/common/gpt.rs` at 6 blocks, width 384, context 256,
  6 heads of 64 (the heads `examples/attention.rs` gives this width; `examples/gpt.rs` keeps
  `Config::TINY`'s 4 heads at its width 64), with `examples/gpt.rs`'s training setup: vocabulary
  96 (`Config::TINY`), batch 4 rows of its synthetic counting sequences (`batch()` there), mean
  next-token cross-entropy, Adam lr 3e-3, GPT-2 initialisation (normal 0.02, biases 0, LayerNorms
  1 and 0), fused causal attention (`F.scaled_dot_product_attention`, as the Rust default
  `Attention::Fused`), the LM head tied to the token embedding. The checkpointed layers: the 6
  blocks (`blocks_checkpointed`); the embeddings and the head are outside.
- `denoiser`: the convolutional denoiser of `examples/common/denoiser.rs` as
  `examples/diffusion_denoise.rs` sizes it: latent 4, 64 channels, 64x64, group norm of 8 groups
  (no affine), SiLU, no conv biases, a stride-2 conv down, nearest 2x upsampling back and the skip
  from the first layer's output. Trained one step at a time on `[1, 4, 64, 64]` noise against a
  random target, mean squared error, Adam lr 1e-3 (no Rust example on main trains it yet; the
  Rust side of the curve is to train it the same way). The
  checkpointed layers are the 5 that `predict_noise_checkpointed`'s `#[checkpoint]` sequence
  covers: stride-2 block, mid conv block, upsample + skip, up conv block, output conv (the first
  conv block runs before it; its output `h1`, the chain's input, is read by the third layer).
- `unet`: the UNet of `examples/common/unet.rs` (`--unet C:SIZE:BATCH`, default 32:32:4): a 3x3
  convolution in, residual blocks (group norm of 8, SiLU, 3x3 convolution, twice, plus the input
  or its 1x1 projection) at C, 2C and 4C channels with stride-2 convolutions between, a middle
  block, up blocks on concatenations with the down path's values (long skips) after nearest
  upsampling and a 3x3 convolution, and a convolution out; no biases, no time embedding.
  `[B, 3, S, S]` noise against a random target, MSE, Adam lr 1e-3. The Rust side checkpoints
  its 12 layers after `conv_in` as one chain; skips cross every sequence of segments, so
  `checkpoint_sequential` cannot run it: `ckpt each` checkpoints each layer on its own (the
  skips it reads stored as its inputs, as diffusers' `gradient_checkpointing` does per block),
  `ckpt halves` the down path and the up path as two checkpoints.

Configurations per model (each from the same seed, in a model of its own):
- `eager`: no checkpointing.
- `ckpt_seq N`: `checkpoint_sequential(layers, N, x, use_reentrant=False)` over the checkpointed
  layers, N the powers of 2 below the layer count n, sqrt(n) rounded down and up, and n (the MLP
  2, 4, 8, 16, 32, 64; the GPT 2, 3, 4, 6; the denoiser 2, 3, 4, 5; the UNet: see above). PyTorch runs the last segment
  without checkpointing (as the Rust checkpointer keeps the last segment's graph), so N = 1 is
  the same as eager and is not run; N = n stores every layer's input.
- `compile`: `torch.compile` of the forward and loss (the default partitioner; the budget left at
  its default, printed), then `compile budget B` for each B in {1.0, 0.8, 0.6, 0.5, 0.3, 0.1,
  0.0}, each a fresh compile (`torch._dynamo.reset()` first, the budget set before the first call,
  when AOTAutograd partitions the joint graph). The optimizer is not compiled.

A step is: the batch made, forward, loss, `loss.backward()`, `Adam.step()` (`foreach=False`, the
per-parameter loop, what PyTorch picks by default for CPU tensors),
`zero_grad(set_to_none=False)`: the gradient buffers persist from step to step, as the Rust
side's `Gradients` do, so what a step allocates
beyond what it starts with is activations, the gradients a backward hands over before they are
accumulated, and the optimizer's temporaries. Each configuration runs `--warmup` steps (the first
compiles), one profiled step (peak and held bytes), one step under saved-tensor hooks (saved bytes),
then timed steps, at least `--rounds` of them and at least `--min-seconds` of them, whose median
is `step_ms` (`step_ms_quartiles` the first and third quartiles, `steps_timed` their count). A
configuration's steps run one after another (the compiled ones cannot take turns: each budget
needs `torch._dynamo.reset()`), so a drift in the machine's speed is not spread evenly across
configurations.

How the figures are measured:
- `peak_bytes`: the profiled step runs under `torch.profiler.profile(profile_memory=True)`; every
  allocation and free of c10's CPU allocator is an Allocation event of the profiler's event tree
  (`prof.profiler.kineto_results.experimental_event_tree()`, `alloc_size` signed), and the running
  sum of those sizes in time order, which starts at 0 with the step, has the maximum reported. The
  allocator reports frees only of blocks it saw allocated while profiling, so blocks allocated
  before the step are neither counted nor subtracted (the step frees none of them: its loss is
  taken with `.item()` and the previous batch is gone). The method is checked at start-up on
  known cases (`torch.empty(1 << 20)` must read 4 MiB; a sequence of allocations and frees its
  known peak). It sees tensor storage; scratch memory a kernel takes from malloc directly (oneDNN's
  scratchpad, buffers local to an Inductor C++ kernel) is not seen.
- `held_after_forward_bytes`: in the same profiled step, the running sum at the end of the
  forward and loss (a `record_function` range around them): what the step holds when backward
  starts, everything the graph keeps included.
- `saved_bytes`: the forward and loss of one step run under
  `torch.autograd.graph.saved_tensors_hooks`, whose pack hook records each packed tensor's
  storage (`untyped_storage()`; distinct storages counted once, at their full size; parameters'
  storages left out); at the end of the forward, the storages still alive (`StorageWeakRef`) are
  summed. For `ckpt_seq`, the non-reentrant checkpoint packs each segment's inputs through the
  same hooks (`_NoopSaveInputs`), and inside a segment its own hooks pack nothing; to be sure, the
  inputs given to `torch.utils.checkpoint.checkpoint` are recorded too (it is wrapped for that
  step). A segment none of whose ops saves a tensor (the denoiser's upsample + skip) is never
  recomputed, and its input is let go during the forward: hence "still alive". For
  `torch.compile`, AOTAutograd's compiled function saves its activations with
  `ctx.save_for_backward`, which the hooks see; the step checks that running under the hooks
  compiled nothing new (else the figure would be another graph's and is reported as null).

Output: a table on stdout and a JSON list (`--out`, default `docs/checkpoint_curves_torch.json`)
of {model, config, family, param, step_ms, step_ms_quartiles, steps_timed, peak_bytes,
saved_bytes, held_after_forward_bytes, loss, other_load, threads, torch_version, cpu}; `family`
is `eager`, `checkpoint_sequential` or `torch.compile`, `param` the segment count or budget (null
for eager and the default compile).
`other_load` is the CPU the rest of the machine used during the timed steps, in cores (from
/proc/stat less this process's own time). Two threads on two cores slow down many times over when
another job takes a core, so while it is above 0.25 the timed steps run again (`--retries`, each
after waiting up to `--max-wait` seconds for the machine to be quiet; the least disturbed attempt
kept), and a row still above it is flagged as not to be trusted. `loss` is the loss of the
profiled step, the same step from the same seeds in every configuration of a model: equal, to
rounding, when the configurations compute the same thing.

Run (from the repository root; CI never runs Python; on 2 cores about 3 minutes with Inductor's
cache warm, 10 to 15 with it cold, most of it compiling the 64-block MLP at each budget):
  /work/venv/bin/python scripts/checkpoint_curve_torch.py [--threads 2] [--rounds 7]
      [--min-seconds 2] [--warmup 2] [--retries 3] [--max-wait 30] [--models mlp,gpt,denoiser]
      [--no-compile] [--out docs/checkpoint_curves_torch.json]
"""
import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback
from contextlib import contextmanager, nullcontext

import torch
import torch._functorch.config
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as torch_checkpoint
from torch._C._profiler import _EventType
from torch.multiprocessing.reductions import StorageWeakRef
from torch.profiler import ProfilerActivity, profile, record_function

from machine import cpu_name

BUDGETS = [1.0, 0.8, 0.6, 0.5, 0.3, 0.1, 0.0]
FORWARD_RANGE = "checkpoint_curve::forward"
MIB = float(1 << 20)
# Cores the rest of the machine may keep busy during timed steps before they are timed again.
BUSY = 0.25


# ----------------------------------------------------------------------------------------------
# The models


def run_layers(layers, x, segments):
    """The layers in turn on `x`; with `segments`, under `checkpoint_sequential`."""
    if segments is None:
        for layer in layers:
            x = layer(x)
        return x
    return torch_checkpoint.checkpoint_sequential(layers, segments, x, use_reentrant=False)


class MlpBlock(nn.Module):
    """`x + W2 gelu(W1 LayerNorm(x))`, as `examples/common/pre_norm_mlp.rs`'s `Block`."""

    def __init__(self, blocks, width):
        super().__init__()
        hidden = 2 * width
        self.norm = nn.LayerNorm(width, eps=1e-5)
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)
        with torch.no_grad():
            self.fc1.weight.normal_(0.0, 1.0 / math.sqrt(width))
            self.fc2.weight.normal_(0.0, 0.5 / math.sqrt(hidden * blocks))
            self.fc1.bias.zero_()
            self.fc2.bias.zero_()

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x)), approximate="tanh"))


class Mlp(nn.Module):
    def __init__(self, blocks, width):
        super().__init__()
        self.blocks = nn.ModuleList(MlpBlock(blocks, width) for _ in range(blocks))

    def forward(self, x, segments=None):
        return run_layers(list(self.blocks), x, segments)


class GptBlock(nn.Module):
    """A pre-LayerNorm block of `examples/common/gpt.rs`: fused qkv, causal attention, GELU MLP."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(dim, eps=1e-5)
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.c_proj = nn.Linear(dim, dim)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-5)
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.mlp_proj = nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=-1)

        def heads(z):
            return z.view(b, t, self.heads, c // self.heads).transpose(1, 2)

        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        h = x + self.c_proj(y.transpose(1, 2).reshape(b, t, c))
        return h + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(h)), approximate="tanh"))


class Gpt(nn.Module):
    def __init__(self, vocab, ctx, dim, heads, layers):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(ctx, dim)
        self.blocks = nn.ModuleList(GptBlock(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim, eps=1e-5)
        # GPT-2's initialisation, as `Gpt::random`: weights N(0, 0.02), biases 0, LayerNorms 1, 0.
        with torch.no_grad():
            for name, p in self.named_parameters():
                if "ln_" in name:
                    p.fill_(1.0 if name.endswith("weight") else 0.0)
                elif name.endswith("bias"):
                    p.zero_()
                else:
                    p.normal_(0.0, 0.02)

    def forward(self, ids, segments=None):
        x = self.wte(ids) + self.wpe.weight[: ids.shape[1]]
        x = run_layers(list(self.blocks), x, segments)
        return self.ln_f(x) @ self.wte.weight.T


class Denoiser(nn.Module):
    """`examples/common/denoiser.rs`: 3x3 convolutions (no bias), group norm (no affine), SiLU."""

    def __init__(self, latent, channels, groups):
        super().__init__()
        self.groups = groups

        def kernel(out, inp, scale=1.0):
            return nn.Parameter(torch.randn(out, inp, 3, 3) * (scale / math.sqrt(inp * 9)))

        self.conv_in = kernel(channels, latent)
        self.down = kernel(channels, channels)
        self.mid = kernel(channels, channels)
        self.up = kernel(channels, channels)
        self.conv_out = kernel(latent, channels, 0.1)

    def block(self, h, w, stride=1):
        return F.silu(F.group_norm(F.conv2d(h, w, stride=stride, padding=1), self.groups, eps=1e-5))

    def forward(self, x, segments=None):
        h1 = self.block(x, self.conv_in)
        # The layers of the Rust `#[checkpoint]` sequence; the third reads `h1` (the skip).
        layers = [
            lambda h: self.block(h, self.down, stride=2),
            lambda h: self.block(h, self.mid),
            lambda h: F.interpolate(h, scale_factor=2, mode="nearest") + h1,
            lambda h: self.block(h, self.up),
            lambda h: F.conv2d(h, self.conv_out, padding=1),
        ]
        return run_layers(layers, h, segments)


class ResBlock(nn.Module):
    """`examples/common/unet.rs`'s `ResBlock`: group norm, SiLU, 3x3 convolution, twice, plus the
    input (a 1x1 convolution when the channels change); no biases, no affine norms."""

    def __init__(self, inp, out, groups):
        super().__init__()
        self.groups = groups

        def kernel(o, i, k):
            return nn.Parameter(torch.randn(o, i, k, k) / math.sqrt(i * k * k))

        self.conv1, self.conv2 = kernel(out, inp, 3), kernel(out, out, 3)
        self.skip = kernel(out, inp, 1) if inp != out else None

    def forward(self, x):
        g = self.groups
        h = F.conv2d(F.silu(F.group_norm(x, g, eps=1e-5)), self.conv1, padding=1)
        h = F.conv2d(F.silu(F.group_norm(h, g, eps=1e-5)), self.conv2, padding=1)
        return h + (x if self.skip is None else F.conv2d(x, self.skip))


class Unet(nn.Module):
    """`examples/common/unet.rs`: a convolution in, three levels down, a middle block, three
    levels up on concatenations with the down path's values (long skips), a convolution out. Its
    12 layers after `conv_in` are the Rust side's one `#[checkpoint]` chain."""

    def __init__(self, latent, c, groups):
        super().__init__()
        self.groups = groups

        def kernel(o, i):
            return nn.Parameter(torch.randn(o, i, 3, 3) / math.sqrt(i * 9))

        self.conv_in = kernel(c, latent)
        self.down1, self.downsample1 = ResBlock(c, c, groups), kernel(c, c)
        self.down2, self.downsample2 = ResBlock(c, 2 * c, groups), kernel(2 * c, 2 * c)
        self.down3, self.mid = ResBlock(2 * c, 4 * c, groups), ResBlock(4 * c, 4 * c, groups)
        self.up3, self.upsample2 = ResBlock(8 * c, 4 * c, groups), kernel(2 * c, 4 * c)
        self.up2, self.upsample1 = ResBlock(4 * c, 2 * c, groups), kernel(c, 2 * c)
        self.up1, self.conv_out = ResBlock(2 * c, c, groups), kernel(latent, c)

    @staticmethod
    def up(x, w):
        return F.conv2d(F.interpolate(x, scale_factor=2, mode="nearest"), w, padding=1)

    def down_path(self, h):
        d1 = self.down1(h)
        d2 = self.down2(F.conv2d(d1, self.downsample1, stride=2, padding=1))
        d3 = self.down3(F.conv2d(d2, self.downsample2, stride=2, padding=1))
        return d1, d2, d3

    def up_path(self, d1, d2, d3):
        u3 = self.up3(torch.cat([self.mid(d3), d3], 1))
        u2 = self.up2(torch.cat([self.up(u3, self.upsample2), d2], 1))
        u1 = self.up1(torch.cat([self.up(u2, self.upsample1), d1], 1))
        return F.conv2d(F.silu(F.group_norm(u1, self.groups, eps=1e-5)), self.conv_out, padding=1)

    def forward(self, x, segments=None):
        """`segments`: None (no checkpointing), "each" (each of the 12 layers checkpointed on
        its own, its inputs, the skip it reads included, stored: what `gradient_checkpointing`
        does for diffusers' blocks) or "halves" (the down path and the up path each one
        checkpoint, the skips passed from one to the other)."""
        h = F.conv2d(x, self.conv_in, padding=1)
        if segments is None:
            return self.up_path(*self.down_path(h))
        if segments == "halves":
            d = torch_checkpoint.checkpoint(self.down_path, h, use_reentrant=False)
            return torch_checkpoint.checkpoint(self.up_path, *d, use_reentrant=False)
        ck = lambda f, *a: torch_checkpoint.checkpoint(f, *a, use_reentrant=False)  # noqa: E731
        g = self.groups
        d1 = ck(self.down1, h)
        s1 = ck(lambda t: F.conv2d(t, self.downsample1, stride=2, padding=1), d1)
        d2 = ck(self.down2, s1)
        s2 = ck(lambda t: F.conv2d(t, self.downsample2, stride=2, padding=1), d2)
        d3 = ck(self.down3, s2)
        m = ck(self.mid, d3)
        u3 = ck(lambda a, b: self.up3(torch.cat([a, b], 1)), m, d3)
        p2 = ck(lambda t: self.up(t, self.upsample2), u3)
        u2 = ck(lambda a, b: self.up2(torch.cat([a, b], 1)), p2, d2)
        p1 = ck(lambda t: self.up(t, self.upsample1), u2)
        u1 = ck(lambda a, b: self.up1(torch.cat([a, b], 1)), p1, d1)
        # The last layer runs without checkpointing, as the Rust chain keeps its last segment.
        return F.conv2d(F.silu(F.group_norm(u1, g, eps=1e-5)), self.conv_out, padding=1)


class Task:
    """A model to train: how to build it, its batches, its loss, its checkpointed layer count."""

    def __init__(self, name, describe, build, batch, loss, layers, lr):
        self.name, self.describe, self.build = name, describe, build
        self.batch, self.loss, self.layers, self.lr = batch, loss, layers, lr


def mlp_task(blocks=64, width=128, batch=32):
    gen = torch.Generator().manual_seed(7)
    teacher = torch.randn(width, width, generator=gen) * 0.2

    def make_batch(step):
        g = torch.Generator().manual_seed(1000 + step)
        x = torch.randn(batch, width, generator=g)
        with torch.no_grad():
            target = torch.tanh(x @ teacher)
        return x, target

    def loss(model, x, target, segments=None):
        return F.mse_loss(model(x, segments), target)

    return Task("mlp", f"{blocks} pre-norm residual blocks, width {width} (hidden {2 * width}), "
                f"batch {batch}, MSE, Adam lr 1e-3",
                lambda: Mlp(blocks, width), make_batch, loss, blocks, 1e-3)


def gpt_task(layers=6, dim=384, ctx=256, heads=6, vocab=96, rows=4):
    def make_batch(step):
        # `examples/gpt.rs`'s `batch()`: rows counting up by a stride, mod the vocabulary.
        r = torch.arange(rows).unsqueeze(1)
        t = torch.arange(ctx).unsqueeze(0)
        start = (step * 7 + r * 13) % vocab
        stride = 1 + (r + step) % 3
        return ((start + stride * t) % vocab,)

    def loss(model, ids, segments=None):
        logits = model(ids, segments)
        return F.cross_entropy(logits[:, :-1].reshape(-1, vocab), ids[:, 1:].reshape(-1))

    return Task("gpt", f"GPT: {layers} blocks, width {dim}, {heads} heads of {dim // heads}, "
                f"context {ctx}, vocabulary {vocab}, batch {rows}, cross-entropy, Adam lr 3e-3",
                lambda: Gpt(vocab, ctx, dim, heads, layers), make_batch, loss, layers, 3e-3)


def denoiser_task(latent=4, channels=64, size=64, groups=8):
    def make_batch(step):
        g = torch.Generator().manual_seed(42 + step)
        x = torch.randn(1, latent, size, size, generator=g)
        target = torch.randn(1, latent, size, size, generator=g)
        return x, target

    def loss(model, x, target, segments=None):
        return F.mse_loss(model(x, segments), target)

    return Task("denoiser", f"denoiser: [1, {latent}, {size}, {size}] in, {channels} channels, "
                f"group norm of {groups}, MSE against random targets, Adam lr 1e-3",
                lambda: Denoiser(latent, channels, groups), make_batch, loss, 5, 1e-3)


def unet_task(channels=32, size=32, batch=4, groups=8):
    def make_batch(step):
        g = torch.Generator().manual_seed(42 + step)
        x = torch.randn(batch, 3, size, size, generator=g)
        target = torch.randn(batch, 3, size, size, generator=g)
        return x, target

    def loss(model, x, target, segments=None):
        return F.mse_loss(model(x, segments), target)

    return Task("unet", f"UNet: [{batch}, 3, {size}, {size}] in, {channels}/{2 * channels}/"
                f"{4 * channels} channels, group norm of {groups}, long skips, MSE against random "
                f"targets, Adam lr 1e-3", lambda: Unet(3, channels, groups), make_batch, loss, 12,
                1e-3)


def segment_counts(layers):
    """2, 4, 8, ... below the layer count, sqrt(n) rounded down and up, and n itself (1 is eager:
    see above)."""
    counts = {2 ** k for k in range(1, 12) if 2 ** k < layers}
    counts |= {math.floor(math.sqrt(layers)), math.ceil(math.sqrt(layers)), layers}
    return sorted(c for c in counts if 2 <= c <= layers)


# ----------------------------------------------------------------------------------------------
# Measuring


def allocation_events(prof):
    """(start ns, signed bytes) of every CPU Allocation event of a profile, in time order, and the
    end (ns) of the forward's range if it was recorded."""
    events, forward_end = [], None
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        node = stack.pop()
        if node.tag == _EventType.Allocation:
            extra = node.extra_fields
            if extra.device.type == "cpu" and extra.alloc_size != 0:
                events.append((node.start_time_ns, extra.alloc_size))
        elif node.name == FORWARD_RANGE:
            forward_end = node.end_time_ns
        stack.extend(node.children)
    events.sort(key=lambda e: e[0])
    return events, forward_end


def profiled_peak(fn):
    """Runs `fn` under the memory profiler: (peak, held at the forward's end, left at the end),
    bytes above what was allocated when `fn` started."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events, forward_end = allocation_events(prof)
    current = peak = 0
    held = None
    for start, size in events:
        if forward_end is not None and held is None and start > forward_end:
            held = current
        current += size
        peak = max(peak, current)
    if forward_end is not None and held is None:
        held = current
    return peak, held, current


def check_peak_method():
    """The profiler-based peak on cases whose answer is known; exits if it reads them wrong."""

    def one():
        a = torch.empty(1 << 20)  # 4 MiB
        del a

    def several():
        a = torch.empty(1 << 20)  # 4 MiB
        b = torch.empty(1 << 18)  # + 1 MiB: peak 5 MiB
        del a
        c = torch.empty(1 << 19)  # 1 + 2 MiB
        del b, c

    for fn, want in [(one, 4 << 20), (several, 5 << 20)]:
        peak, _, left = profiled_peak(fn)
        if peak != want or left != 0:
            sys.exit(f"the profiler's allocation events read a peak of {peak} B (left {left} B) "
                     f"where {want} B is known: this torch build cannot measure peaks this way")
    print("peak method checked: torch.empty(1 << 20) reads 4194304 B; a 5 MiB sequence reads 5 MiB")


@contextmanager
def saved_storages(model):
    """Records the distinct storages (not parameters') that autograd packs for backward in the
    `with` body, and the inputs `torch.utils.checkpoint.checkpoint` is given. Yields a dict that,
    after the body, maps the data pointer of each such storage still alive to its bytes."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    packed = {}

    def record(t):
        s = t.untyped_storage()
        ptr = s.data_ptr()
        if ptr != 0 and ptr not in params:
            # A later storage at the same address replaces a dead one.
            packed[ptr] = (s.nbytes(), StorageWeakRef(s))

    def pack(t):
        record(t)
        return t

    original = torch_checkpoint.checkpoint

    def recording_checkpoint(function, *args, **kwargs):
        for a in args:
            if isinstance(a, torch.Tensor):
                record(a)
        return original(function, *args, **kwargs)

    alive = {}
    torch_checkpoint.checkpoint = recording_checkpoint
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            yield alive
    finally:
        torch_checkpoint.checkpoint = original
    # What nothing keeps is not kept for backward: a checkpointed segment none of whose ops
    # saves a tensor (upsample + add) is never recomputed, and its input is let go.
    alive.update((ptr, n) for ptr, (n, ref) in packed.items() if not ref.expired())


def compiled_graphs():
    """How many graphs Dynamo has compiled since the last reset."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def measure(task, config, segments, budget, compiled, args):
    """One configuration: warm-up, profiled step, saved-bytes step, timed steps."""
    torch.manual_seed(1)
    model = task.build()
    adam = torch.optim.Adam(model.parameters(), lr=task.lr, foreach=False)
    if compiled:
        torch._dynamo.reset()
        if budget is not None:
            torch._functorch.config.activation_memory_budget = budget
        loss_fn = torch.compile(task.loss)
    else:
        loss_fn = task.loss
    step_no = [0]

    def step(forward_ctx=nullcontext):
        batch = task.batch(step_no[0])
        step_no[0] += 1
        with forward_ctx():
            if compiled:
                loss = loss_fn(model, *batch)
            else:
                loss = loss_fn(model, *batch, segments=segments)
        loss.backward()
        adam.step()
        adam.zero_grad(set_to_none=False)
        return loss.item()

    started = time.perf_counter()
    for _ in range(args.warmup):
        step()
    warm_s = time.perf_counter() - started

    # The loss of this step (the same step of the same seeds in every configuration) shows that
    # they all compute the same thing.
    loss_box = []
    peak, held, left = profiled_peak(
        lambda: loss_box.append(step(lambda: record_function(FORWARD_RANGE))))

    graphs = compiled_graphs() if compiled else 0
    seen = {}

    @contextmanager
    def hooked():
        # Only the forward and loss under the hooks: the backward's recomputation packs nothing
        # that stays.
        with saved_storages(model) as recorded:
            yield
        seen.update(recorded)

    step(hooked)
    saved = sum(seen.values())
    if compiled and compiled_graphs() != graphs:
        print(f"  {config}: the hooks made Dynamo compile again; saved bytes not reported")
        saved = None

    # The timed steps, again (up to --retries times) while another process was busy during them;
    # the attempt the rest of the machine disturbed least is kept.
    best = None
    for attempt in range(1 + args.retries):
        if attempt > 0:
            wait_for_quiet(args.max_wait)
        times = []
        others = OtherLoad()
        began = time.perf_counter()
        while len(times) < args.rounds or time.perf_counter() - began < args.min_seconds:
            started = time.perf_counter()
            step()
            times.append((time.perf_counter() - started) * 1e3)
        load = others.cores()
        if best is None or (load is not None and load < best[1]):
            best = (times, load)
        if load is None or load <= BUSY:
            break
    times, other_load = best
    if compiled and budget is not None:
        torch._functorch.config.activation_memory_budget = DEFAULT_BUDGET
    return {
        "step_ms": statistics.median(times),
        "step_ms_quartiles": [round(q, 3) for q in statistics.quantiles(times, n=4)[::2]],
        "steps_timed": len(times),
        "peak_bytes": peak,
        "saved_bytes": saved,
        "held_after_forward_bytes": held,
        "left_bytes": left,
        "loss": loss_box[0],
        "other_load": other_load,
        "warmup_s": warm_s,
    }


class OtherLoad:
    """The CPU time the rest of the machine used from its making to `cores()`, in cores busy on
    average (from /proc/stat, less this process's own time): another job running during a
    configuration's timed steps shows here, and its times are not to be trusted."""

    def __init__(self):
        self.wall, self.busy, self.own = time.perf_counter(), self.machine_busy(), self.own_cpu()

    @staticmethod
    def machine_busy():
        try:
            with open("/proc/stat") as f:
                fields = [int(v) for v in f.readline().split()[1:]]
        except OSError:
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def own_cpu():
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def cores(self):
        busy = self.machine_busy()
        if busy is None or self.busy is None:
            return None
        wall = time.perf_counter() - self.wall
        return max(0.0, (busy - self.busy) - (self.own_cpu() - self.own)) / wall


def wait_for_quiet(most_s):
    """Waits, up to `most_s` seconds, until the rest of the machine keeps less than `BUSY` cores
    busy over a second."""
    deadline = time.perf_counter() + most_s
    while time.perf_counter() < deadline:
        others = OtherLoad()
        time.sleep(1.0)
        load = others.cores()
        if load is None or load <= BUSY:
            return


def fmt(value, scale=1.0, digits=2):
    return "n/a" if value is None else f"{value / scale:.{digits}f}"


DEFAULT_BUDGET = torch._functorch.config.activation_memory_budget


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7,
                        help="timed steps per configuration, at least")
    parser.add_argument("--min-seconds", type=float, default=2.0,
                        help="seconds of timed steps per configuration, at least")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps first (compile)")
    parser.add_argument("--retries", type=int, default=3,
                        help="times the timed steps are run again while another process is busy")
    parser.add_argument("--max-wait", type=float, default=30.0,
                        help="seconds to wait for the machine to be quiet before a retry")
    parser.add_argument("--models", default="mlp,gpt,denoiser,unet")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    parser.add_argument("--mlp-blocks", type=int, default=64)
    parser.add_argument("--gpt-layers", type=int, default=6)
    parser.add_argument("--gpt-heads", type=int, default=6)
    parser.add_argument("--gpt-vocab", type=int, default=96)
    parser.add_argument("--gpt-batch", type=int, default=4)
    parser.add_argument("--unet", default="32:32:4", help="CHANNELS:SIZE:BATCH of the UNet")
    parser.add_argument("--out", default="docs/checkpoint_curves_torch.json")
    args = parser.parse_args()
    args.warmup = max(args.warmup, 2)  # the first step compiles and allocates the state
    torch.set_num_threads(args.threads)

    cpu = cpu_name()
    print(f"PyTorch {torch.__version__}, {args.threads} threads, CPU: {cpu}")
    print(f"activation_memory_budget default: {DEFAULT_BUDGET}")
    check_peak_method()

    tasks = {
        "mlp": lambda: mlp_task(blocks=args.mlp_blocks),
        "gpt": lambda: gpt_task(layers=args.gpt_layers, heads=args.gpt_heads,
                                vocab=args.gpt_vocab, rows=args.gpt_batch),
        "denoiser": denoiser_task,
        "unet": lambda: unet_task(*(int(v) for v in args.unet.split(":"))),
    }
    rows = []
    run_started = time.perf_counter()
    for name in args.models.split(","):
        task = tasks[name]()
        print(f"\n{name}: {task.describe}; {task.layers} checkpointed layers")
        configs = [("eager", "eager", None, None, False)]
        if name == "unet":
            # Skips cross any sequence of segments: each layer, or the two halves, checkpointed.
            configs += [(f"ckpt {k}", "torch.utils.checkpoint", k, None, False)
                        for k in ("each", "halves")]
        else:
            configs += [(f"ckpt_seq {n}", "checkpoint_sequential", n, None, False)
                        for n in segment_counts(task.layers)]
        if not args.no_compile:
            configs.append(("compile", "torch.compile", None, None, True))
            configs += [(f"compile budget {b}", "torch.compile", None, b, True) for b in BUDGETS]
        for config, family, segments, budget, compiled in configs:
            try:
                m = measure(task, config, segments, budget, compiled, args)
            except Exception as e:  # noqa: BLE001: a configuration failing here is a row left out
                print(f"  {config}: not run ({type(e).__name__}: {str(e)[:200]})")
                traceback.print_exc()
                continue
            row = {
                "model": name,
                "config": config,
                "family": family,
                "param": segments if segments is not None else budget,
                **m,
                "threads": args.threads,
                "torch_version": torch.__version__,
                "cpu": cpu,
            }
            rows.append(row)
            print(f"  {config:<20} {m['step_ms']:9.1f} ms  "
                  f"peak {fmt(m['peak_bytes'], MIB):>8} MiB  "
                  f"saved {fmt(m['saved_bytes'], MIB):>7} MiB  held after fwd "
                  f"{fmt(m['held_after_forward_bytes'], MIB):>8}"
                  f" MiB  loss {m['loss']:.4f}  (warm-up {m['warmup_s']:.1f} s, other load "
                  f"{fmt(m['other_load'])} cores)", flush=True)
            if m["other_load"] is not None and m["other_load"] > BUSY:
                print(f"    warning: other processes kept {m['other_load']:.2f} cores busy during "
                      "the timed steps; the time is not to be trusted")
            if m["left_bytes"] != 0:
                print(f"    note: the profiled step ended {m['left_bytes']} B above its start")

    print(f"\nPyTorch {torch.__version__}, {args.threads} threads, CPU: {cpu}; "
          f"median of at least {args.rounds} steps and {args.min_seconds:g} s; "
          f"{time.perf_counter() - run_started:.0f} s in all")
    print("\n| model | config | step ms | peak MiB | saved MiB | held after forward MiB "
          "| other load (cores) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['config']} | {r['step_ms']:.1f} | {fmt(r['peak_bytes'], MIB)} "
              f"| {fmt(r['saved_bytes'], MIB)} | {fmt(r['held_after_forward_bytes'], MIB)} "
              f"| {fmt(r['other_load'])} |")
    for r in rows:
        del r["left_bytes"], r["warmup_s"]
    with open(args.out, "w") as f:  # a row a line
        f.write("[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]\n")
    print(f"\nwrote {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
