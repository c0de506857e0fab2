"""PyTorch peer of the digits classifier example: a small CNN on scikit-learn's 8x8 digits
(`examples/data/digits.safetensors`, written by `scripts/digits_data.py`), for comparison with the
Rust example built to the same spec.

Spec (kept literally on both sides):
  input [B, 1, 8, 8], pixels in [0, 1]
  conv1  Conv2d(1, 16, 3, padding=1) + ReLU + MaxPool2d(2)   -> [B, 16, 4, 4]
  conv2  Conv2d(16, 32, 3, padding=1) + ReLU + MaxPool2d(2)  -> [B, 32, 2, 2]
  flatten in (C, H, W) order -> 128; Linear(128, 64) + ReLU; Linear(64, 10)
  loss   cross-entropy, mean over the batch
  init   PyTorch's default, after torch.manual_seed(seed); modules built in the order above
  optim  AdamW, lr 3e-3, betas (0.9, 0.999), eps 1e-8; weight decay 0.01 on the four weights
         (conv1, conv2, fc1, fc2), 0 on the four biases (two parameter groups)
  data   batch 64; epoch e (0-based) visits the 1437 training images in the order
         torch.randperm(1437, generator=torch.Generator().manual_seed(seed + e)), in slices of
         64; the last partial batch (1437 = 22 * 64 + 29) is kept: 23 steps per epoch
  lr     set before each optimizer step from its 0-based global index (see `lr_at`): linear
         warm-up over the first 50 steps, then cosine decay
  clip   torch.nn.utils.clip_grad_norm_(params, 1.0) (global L2 norm) before each step

Per epoch it prints the mean training loss (the mean over the epoch's 1437 examples, i.e. the
batch losses weighted by batch size, each taken before that batch's step) and the accuracy on the
360 held-out images after the epoch. At the end: the held-out accuracy, the median and mean step
time in ms, the thread count, the torch version and the CPU model. A timed step is zero_grad +
forward + loss + backward + clip + optimizer step on one batch (time.perf_counter around exactly
that; gathering the batch and setting the lr are outside); the first epoch is warm-up and not
counted.

Run (from the repository root; CI never runs Python):
  python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch numpy safetensors
  /tmp/venv/bin/python scripts/digits_torch.py [--seed 0] [--epochs 30] [--threads 2] [--json PATH]
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file

from machine import cpu_name

BATCH = 64
BASE_LR = 3e-3
WARMUP = 50
WEIGHT_DECAY = 0.01


class DigitsCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(128, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)  # [B, 16, 4, 4]
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)  # [B, 32, 2, 2]
        x = x.flatten(1)                            # [B, 128], (C, H, W) order
        return self.fc2(F.relu(self.fc1(x)))        # [B, 10]


def lr_at(step, total):
    """The lr of the optimizer step with 0-based global index `step` (0 <= step < total), set
    before that step:
      step < 50:  BASE_LR * step / 50, so step 0 gets 0 (its step still updates Adam's moments),
                  step 1 gets 6e-5, ..., step 49 gets 2.94e-3;
      step >= 50: BASE_LR * 0.5 * (1 + cos(pi * (step - 50) / (total - 50))), so step 50 gets
                  3e-3 exactly, and the formula would reach 0 at step == total, one past the last:
                  the last step (total - 1) gets BASE_LR * 0.5 * (1 + cos(pi * (total - 51) /
                  (total - 50))), about 1.8e-8 for total = 690 (30 epochs).
    """
    if step < WARMUP:
        return BASE_LR * step / WARMUP
    return BASE_LR * 0.5 * (1.0 + math.cos(math.pi * (step - WARMUP) / (total - WARMUP)))


def accuracy(model, images, labels):
    with torch.no_grad():
        return (model(images).argmax(1) == labels).float().mean().item() * 100.0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default="examples/data/digits.safetensors")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=BATCH,
                        help="images per step (64 in the spec; larger to time a bigger step)")
    parser.add_argument("--json", metavar="PATH", help="write per-epoch curves and timings here")
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error("--epochs must be at least 2: the first epoch is warm-up and not timed")

    torch.set_num_threads(args.threads)
    data = load_file(args.data)
    x_train, y_train = data["train.images"], data["train.labels"]
    x_test, y_test = data["test.images"], data["test.labels"]
    n = x_train.shape[0]
    steps_per_epoch = math.ceil(n / args.batch)
    total = steps_per_epoch * args.epochs

    torch.manual_seed(args.seed)
    model = DigitsCnn()
    weights = [m.weight for m in (model.conv1, model.conv2, model.fc1, model.fc2)]
    biases = [m.bias for m in (model.conv1, model.conv2, model.fc1, model.fc2)]
    params = weights + biases
    optimizer = torch.optim.AdamW(
        [{"params": weights, "weight_decay": WEIGHT_DECAY}, {"params": biases, "weight_decay": 0.0}],
        lr=BASE_LR, betas=(0.9, 0.999), eps=1e-8)

    print(f"digits CNN, PyTorch {torch.__version__}, {torch.get_num_threads()} threads, seed "
          f"{args.seed}: {n} train / {x_test.shape[0]} test images, batch {args.batch}, "
          f"{args.epochs} epochs x {steps_per_epoch} steps = {total} AdamW steps")
    step = 0
    epochs, step_losses, step_lrs, times_ms = [], [], [], []
    for epoch in range(args.epochs):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(args.seed + epoch))
        loss_sum = 0.0
        for start in range(0, n, args.batch):
            idx = order[start:start + args.batch]
            xb, yb = x_train[idx], y_train[idx]
            lr = lr_at(step, total)
            for group in optimizer.param_groups:
                group["lr"] = lr
            t0 = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            elapsed_ms = (time.perf_counter() - t0) * 1e3
            if epoch > 0:
                times_ms.append(elapsed_ms)
            value = loss.item()
            loss_sum += value * idx.numel()
            step_losses.append(value)
            step_lrs.append(lr)
            step += 1
        train_loss = loss_sum / n
        test_acc = accuracy(model, x_test, y_test)
        epochs.append({"epoch": epoch + 1, "train_loss": train_loss, "test_accuracy": test_acc})
        print(f"epoch {epoch + 1:3d}  train loss {train_loss:.4f}  held-out accuracy {test_acc:6.2f}%")

    final = epochs[-1]["test_accuracy"]
    correct = round(final * x_test.shape[0] / 100.0)
    median, mean = statistics.median(times_ms), statistics.fmean(times_ms)
    cpu = cpu_name()
    print(f"held-out accuracy {final:.2f}% ({correct}/{x_test.shape[0]})")
    print(f"step time: median {median:.3f} ms, mean {mean:.3f} ms over {len(times_ms)} steps "
          f"(epochs 2..{args.epochs}; epoch 1 is warm-up)")
    print(f"threads {torch.get_num_threads()}, torch {torch.__version__}, CPU {cpu}")

    if args.json:
        summary = {
            "framework": "pytorch",
            "torch": torch.__version__,
            "cpu": cpu,
            "threads": torch.get_num_threads(),
            "seed": args.seed,
            "epochs": args.epochs,
            "batch": args.batch,
            "steps_per_epoch": steps_per_epoch,
            "total_steps": total,
            "per_epoch": epochs,
            "train_loss": [e["train_loss"] for e in epochs],
            "test_accuracy": [e["test_accuracy"] for e in epochs],
            "step_loss": step_losses,
            "step_lr": step_lrs,
            "final_test_accuracy": final,
            "timing": {
                "median_step_ms": median,
                "mean_step_ms": mean,
                "timed_steps": len(times_ms),
                "excluded": "epoch 1 (warm-up)",
                "step": "zero_grad + forward + loss + backward + clip_grad_norm_ + AdamW step",
            },
        }
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
