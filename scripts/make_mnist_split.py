#!/usr/bin/env python3
"""Writes the real-MNIST split that mnist_ga and bench/reference/mnist_ga_torch.py use, as the four
standard IDX file names, from the 10k MNIST test set alone (what ../shared/data/mnist holds):
the first 8,000 images become train-*, the last 2,000 t10k-*. Standard library only.

  python3 scripts/make_mnist_split.py [--src ../shared/data/mnist] [--dest /tmp/mnist_split] [--train 8000]
  build/bin/mnist_ga --data /tmp/mnist_split ...

mnist_ga does the same split in memory when --data points at a folder with only t10k-* files
(data::load_mnist_test_split), so this script is needed only to give the split to other tools.
"""
import argparse
import gzip
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    if raw[0:3] != b"\x00\x00\x08":
        raise SystemExit(f"{path}: wrong magic {raw[0:4].hex()}, expected 000008NN")
    ndim = raw[3]
    dims = list(struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim]))
    data = raw[4 + 4 * ndim:]
    n = 1
    for d in dims:
        n *= d
    if len(data) != n:
        raise SystemExit(f"{path}: {len(data)} data bytes, header promises {n}")
    return dims, data


def write_idx(path, dims, data):
    hdr = b"\x00\x00\x08" + bytes([len(dims)]) + struct.pack(">" + "I" * len(dims), *dims)
    tmp = path + ".tmp"
    with gzip.open(tmp, "wb") as f:
        f.write(hdr + data)
    os.replace(tmp, path)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", default=os.path.normpath(os.path.join(HERE, "../../shared/data/mnist")))
    ap.add_argument("--dest", default="/tmp/mnist_split")
    ap.add_argument("--train", type=int, default=8000)
    a = ap.parse_args()
    idims, images = read_idx(os.path.join(a.src, "t10k-images-idx3-ubyte.gz"))
    ldims, labels = read_idx(os.path.join(a.src, "t10k-labels-idx1-ubyte.gz"))
    n = idims[0]
    if ldims[0] != n:
        raise SystemExit(f"{n} images but {ldims[0]} labels")
    if not 0 < a.train < n:
        raise SystemExit(f"--train must be in 1..{n - 1}")
    px = idims[1] * idims[2]
    os.makedirs(a.dest, exist_ok=True)
    write_idx(os.path.join(a.dest, "train-images-idx3-ubyte.gz"), [a.train] + idims[1:], images[:a.train * px])
    write_idx(os.path.join(a.dest, "train-labels-idx1-ubyte.gz"), [a.train], labels[:a.train])
    write_idx(os.path.join(a.dest, "t10k-images-idx3-ubyte.gz"), [n - a.train] + idims[1:], images[a.train * px:])
    write_idx(os.path.join(a.dest, "t10k-labels-idx1-ubyte.gz"), [n - a.train], labels[a.train:])
    print(f"{a.dest}: train {a.train}, t10k {n - a.train} (from {a.src})")


if __name__ == "__main__":
    main()
