"""PyTorch peer of `examples/ddpm.rs`: the same DDPM recipe on scikit-learn's digits, for its
samples and its step time beside the Rust example's.

Same on both sides: the data (the 1437 training digits of `examples/data/digits.safetensors`,
upsampled to 16x16 by `F.interpolate(mode="bilinear", align_corners=False)`, scaled to [-1, 1]),
the UNet (`examples/common/ddpm_unet.rs`: time embedding, residual blocks with group norm, SiLU
and the timestep per channel, attention at 4x4, stride-2 convolutions down, nearest upsampling
and a convolution up, concatenated skips), the schedule (1000 betas linear from 1e-4 to 0.02),
the loss (MSE of the predicted noise), AdamW (lr 2e-3, weight decay 0.01 except on biases and
norms), a 100-step warm-up and cosine decay, clipping at norm 1, an EMA of 0.999, and the
samplers (DDPM over every timestep, or DDIM over `--ddim N`, the predicted clean image clipped
to [-1, 1]). Not the same: the initial weights and the random draws (each side's own generator).

A timed step is forward + loss + backward + clip + optimizer step + EMA update on one batch
(time.perf_counter around exactly that); the first 5 steps are warm-up and not counted. At the
end: the median step time, the sampling time, and a PNG grid of the samples.

Run (from the repository root; CI never runs Python):
  python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch numpy safetensors
  /tmp/venv/bin/python scripts/ddpm_torch.py [--steps 3000] [--batch 64] [--threads 2]
      [--ddim 0] [--samples 64] [--png target/ddpm_torch.png] [--compile] [--seed 0]
"""
import argparse
import copy
import math
import statistics
import struct
import time
import zlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file

from machine import cpu_name


class ResBlock(nn.Module):
    def __init__(self, inp, out, emb):
        super().__init__()
        self.norm1, self.conv1 = nn.GroupNorm(8, inp), nn.Conv2d(inp, out, 3, padding=1)
        self.time = nn.Linear(emb, out)
        self.norm2, self.conv2 = nn.GroupNorm(8, out), nn.Conv2d(out, out, 3, padding=1)
        self.skip = nn.Conv2d(inp, out, 1) if inp != out else nn.Identity()

    def forward(self, x, t):
        h = self.conv1(F.silu(self.norm1(x))) + self.time(t)[:, :, None, None]
        return self.conv2(F.silu(self.norm2(h))) + self.skip(x)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.norm, self.qkv, self.out = nn.GroupNorm(8, c), nn.Conv2d(c, 3 * c, 1), nn.Conv2d(c, c, 1)

    def forward(self, x):
        b, c, h, w = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, 3, c, h * w).permute(1, 0, 3, 2)
        y = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, c, h, w)
        return self.out(y) + x


class Unet(nn.Module):
    def __init__(self, inp=1, c=32):
        super().__init__()
        c2, emb = 2 * c, 4 * c
        self.half = c // 2
        self.time1, self.time2 = nn.Linear(c, emb), nn.Linear(emb, emb)
        self.conv_in = nn.Conv2d(inp, c, 3, padding=1)
        self.down1, self.pool1 = ResBlock(c, c, emb), nn.Conv2d(c, c, 3, stride=2, padding=1)
        self.down2, self.pool2 = ResBlock(c, c2, emb), nn.Conv2d(c2, c2, 3, stride=2, padding=1)
        self.down3, self.attn3 = ResBlock(c2, c2, emb), Attention(c2)
        self.mid1, self.mid_attn, self.mid2 = ResBlock(c2, c2, emb), Attention(c2), ResBlock(c2, c2, emb)
        self.up3, self.up_attn3 = ResBlock(2 * c2, c2, emb), Attention(c2)
        self.unpool2, self.up2 = nn.Conv2d(c2, c2, 3, padding=1), ResBlock(2 * c2, c2, emb)
        self.unpool1, self.up1 = nn.Conv2d(c2, c2, 3, padding=1), ResBlock(c2 + c, c, emb)
        self.norm_out, self.conv_out = nn.GroupNorm(8, c), nn.Conv2d(c, inp, 3, padding=1)

    def forward(self, x, t):
        f = torch.exp(torch.arange(self.half) * (-math.log(10000.0) / self.half))
        angles = t[:, None] * f[None]
        t = F.silu(self.time2(F.silu(self.time1(torch.cat([angles.sin(), angles.cos()], 1)))))
        s1 = self.down1(self.conv_in(x), t)
        s2 = self.down2(self.pool1(s1), t)
        s3 = self.attn3(self.down3(self.pool2(s2), t))
        h = self.mid2(self.mid_attn(self.mid1(s3, t)), t)
        h = self.up_attn3(self.up3(torch.cat([h, s3], 1), t))
        h = self.up2(torch.cat([self.unpool2(F.interpolate(h, scale_factor=2.0)), s2], 1), t)
        h = self.up1(torch.cat([self.unpool1(F.interpolate(h, scale_factor=2.0)), s1], 1), t)
        return self.conv_out(F.silu(self.norm_out(h)))


def lr_at(step, total, base, warmup=100):
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return base * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


@torch.no_grad()
def sample(model, alpha_bar, n, ddim, generator):
    total = len(alpha_bar)
    steps = min(max(ddim, 1), total) if ddim else total
    at = (lambda i: i * total // steps) if ddim else (lambda i: i)
    x = torch.randn(n, 1, 16, 16, generator=generator)
    for i in reversed(range(steps)):
        t = at(i)
        ab, ab_prev = alpha_bar[t].item(), alpha_bar[at(i - 1)].item() if i > 0 else 1.0
        eps = model(x, torch.full((n,), float(t)))
        x0 = ((x - math.sqrt(1 - ab) * eps) / math.sqrt(ab)).clamp(-1, 1)
        if ddim:
            eps = (x - math.sqrt(ab) * x0) / math.sqrt(1 - ab)
            x = math.sqrt(ab_prev) * x0 + math.sqrt(1 - ab_prev) * eps
        else:
            beta = 1 - ab / ab_prev
            x = (math.sqrt(ab_prev) * beta / (1 - ab)) * x0 + (math.sqrt(1 - beta) * (1 - ab_prev) / (1 - ab)) * x
            if t > 0:
                x = x + math.sqrt(beta * (1 - ab_prev) / (1 - ab)) * torch.randn(x.shape, generator=generator)
    return x


def write_png(path, images):
    """`images` [n, 1, 16, 16] in [-1, 1] as a grayscale grid, as `examples/ddpm.rs` draws it."""
    n, side = images.shape[0], images.shape[-1]
    columns = math.ceil(math.sqrt(n))
    rows, cell = math.ceil(n / columns), 2 * side + 2
    width, height = columns * cell + 2, rows * cell + 2
    pixels = torch.zeros(height, width, dtype=torch.uint8)
    big = ((images[:, 0] + 1) * 127.5).round().clamp(0, 255).to(torch.uint8)
    big = big.repeat_interleave(2, 1).repeat_interleave(2, 2)
    for k in range(n):
        top, left = 2 + k // columns * cell, 2 + k % columns * cell
        pixels[top:top + 2 * side, left:left + 2 * side] = big[k]
    raw = b"".join(b"\0" + bytes(row.tolist()) for row in pixels)
    chunk = lambda kind, data: struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--ddim", type=int, default=0)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--png", default="target/ddpm_torch.png")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    digits = load_file("examples/data/digits.safetensors")["train.images"]
    data = F.interpolate(digits, size=(16, 16), mode="bilinear", align_corners=False) * 2 - 1
    betas = torch.linspace(1e-4, 0.02, 1000, dtype=torch.float64)
    alpha_bar = torch.cumprod(1 - betas, 0)
    signal, noise_scale = alpha_bar.sqrt().float(), (1 - alpha_bar).sqrt().float()

    model = Unet()
    ema = copy.deepcopy(model).requires_grad_(False)
    decay = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "norm" in n)]
    rest = [p for n, p in model.named_parameters() if n.endswith("bias") or "norm" in n]
    adam = torch.optim.AdamW([{"params": decay}, {"params": rest, "weight_decay": 0.0}], lr=2e-3, weight_decay=0.01)
    step_fn = torch.compile(model) if a.compile else model
    print(f"ddpm (PyTorch {torch.__version__}, {a.threads} threads, {cpu_name()}): "
          f"{sum(p.numel() for p in model.parameters())} parameters")
    times, running = [], None
    for step in range(a.steps):
        ids = torch.randint(0, data.shape[0], (a.batch,))
        t = torch.randint(0, 1000, (a.batch,))
        x0, eps = data[ids], torch.randn(a.batch, 1, 16, 16)
        noisy = signal[t][:, None, None, None] * x0 + noise_scale[t][:, None, None, None] * eps
        for group in adam.param_groups:
            group["lr"] = lr_at(step, a.steps, 2e-3)
        start = time.perf_counter()
        loss = F.mse_loss(step_fn(noisy, t.float()), eps)
        adam.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        adam.step()
        with torch.no_grad():
            for e, p in zip(ema.parameters(), model.parameters()):
                e.mul_(0.999).add_(p, alpha=0.001)
        if step >= 5:
            times.append((time.perf_counter() - start) * 1e3)
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        if (step + 1) % 500 == 0 or step + 1 == a.steps:
            print(f"step {step + 1:5}  loss (running mean) {running:.4f}", flush=True)
    if times:
        print(f"median step {statistics.median(times):.1f} ms over {len(times)} steps")
    start = time.perf_counter()
    images = sample(ema, alpha_bar, a.samples, a.ddim, torch.Generator().manual_seed(a.seed + 1))
    sampler = f"DDIM ({a.ddim} steps)" if a.ddim else "DDPM"
    print(f"sampled {a.samples} digits with {sampler} in {time.perf_counter() - start:.1f} s")
    write_png(a.png, images)
    print(f"wrote {a.png}")


if __name__ == "__main__":
    main()
