"""Writes `examples/data/digits.safetensors`: scikit-learn's bundled 8x8 digits, split for training.

The 1797 images of `sklearn.datasets.load_digits` (shipped inside the scikit-learn package, no
download) are permuted by `numpy.random.default_rng(0).permutation(1797)`; the first 1437 of that
order are the training set and the last 360 the held-out test set. Tensors:

  train.images  F32 [1437, 1, 8, 8]   pixel counts 0..16 divided by 16, so in [0, 1]
  train.labels  I64 [1437]            the digit, 0..9
  test.images   F32 [360, 1, 8, 8]
  test.labels   I64 [360]

The safetensors header's metadata names the source, the licences and this script.

Run (from the repository root; CI never runs Python):
  python3 -m venv /tmp/venv && /tmp/venv/bin/pip install numpy safetensors scikit-learn
  /tmp/venv/bin/python scripts/digits_data.py
"""
import argparse
import json
import os
import struct

import numpy as np
import sklearn
from safetensors.numpy import save
from sklearn.datasets import load_digits

N_TRAIN, N_TEST = 1437, 360


def serialize(tensors, metadata):
    """safetensors bytes with the metadata keys in sorted order: the library writes them in hash
    order, which changes from run to run, and the file should come out byte-identical."""
    blob = save(tensors, metadata=metadata)
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    assert len(text) <= n
    return blob[:8] + text.ljust(n, b" ") + blob[8 + n:]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="examples/data/digits.safetensors")
    args = parser.parse_args()

    digits = load_digits()
    images = digits.images  # float64 [1797, 8, 8], integer values 0..16
    labels = digits.target  # int [1797]
    n = images.shape[0]
    assert n == N_TRAIN + N_TEST == 1797, n
    assert images.min() == 0 and images.max() == 16

    order = np.random.default_rng(0).permutation(n)
    train, test = order[:N_TRAIN], order[N_TRAIN:]

    def x(rows):
        return np.ascontiguousarray((images[rows] / 16.0).astype(np.float32).reshape(-1, 1, 8, 8))

    def y(rows):
        return np.ascontiguousarray(labels[rows].astype(np.int64))

    tensors = {
        "train.images": x(train),
        "train.labels": y(train),
        "test.images": x(test),
        "test.labels": y(test),
    }
    metadata = {
        "source": f"sklearn.datasets.load_digits (scikit-learn {sklearn.__version__}): the 1797 test "
                  "images (optdigits.tes) of the UCI 'Optical Recognition of Handwritten Digits' "
                  "data set, E. Alpaydin and C. Kaynak, 1998",
        "licence": "data: CC BY 4.0 (UCI Machine Learning Repository, doi:10.24432/C50P49); "
                   "scikit-learn: BSD-3-Clause",
        "script": "scripts/digits_data.py",
        "split": "numpy.random.default_rng(0).permutation(1797): first 1437 train, last 360 test",
        "scale": "pixel counts 0..16 divided by 16",
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "wb") as f:
        f.write(serialize(tensors, metadata))
    for name, t in tensors.items():
        print(f"{name}: {t.dtype} {list(t.shape)}")
    print(f"train label counts {np.bincount(tensors['train.labels'], minlength=10).tolist()}")
    print(f"test label counts {np.bincount(tensors['test.labels'], minlength=10).tolist()}")
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")


if __name__ == "__main__":
    main()
