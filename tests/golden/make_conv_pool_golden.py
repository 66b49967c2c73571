#!/usr/bin/python3
"""Golden values for tests/test_conv_pool.cpp: conv2d, max_pool2d and adaptive_avg_pool2d,
forward and backward, from PyTorch (1.13, CPU, float32).

Inputs are deterministic (x[i] = sin(0.37 i + 0.1), ...) and are written into the JSON as well,
so the C++ test uses exactly the same float32 values.

    /usr/bin/python3 tests/golden/make_conv_pool_golden.py   # writes tests/golden/conv_pool.json
"""
import json
import math
import os

import torch
import torch.nn.functional as F


def wave(shape, a, b, scale=1.0, fn=math.sin):
    n = math.prod(shape)
    return torch.tensor([scale * fn(a * i + b) for i in range(n)], dtype=torch.float64) \
        .to(torch.float32).reshape(shape)


def flat(t):
    # 9 significant digits round-trip float32 exactly and keep the file small.
    return [float(f"{v:.9g}") for v in t.detach().reshape(-1).tolist()]


def conv_case(name, x_shape, w_shape, stride, pad, bias=True):
    x = wave(x_shape, 0.37, 0.1).requires_grad_()
    w = wave(w_shape, 0.23, 0.2, 0.5, math.cos).requires_grad_()
    b = (torch.arange(w_shape[0], dtype=torch.float32) * 0.1 - 0.2).requires_grad_() if bias else None
    y = F.conv2d(x, w, b, stride=stride, padding=pad)
    dy = wave(y.shape, 0.11, 0.3)
    y.backward(dy)
    return {
        "name": name, "stride": stride, "pad": pad,
        "x_shape": list(x_shape), "x": flat(x), "w_shape": list(w_shape), "w": flat(w),
        "b": flat(b) if bias else None,
        "y_shape": list(y.shape), "y": flat(y), "dy": flat(dy),
        "dx": flat(x.grad), "dw": flat(w.grad), "db": flat(b.grad) if bias else None,
    }


def max_pool_case(name, x_shape, kernel, stride, pad):
    x = wave(x_shape, 0.37, 0.1).requires_grad_()
    y, idx = F.max_pool2d(x, kernel, stride, pad, return_indices=True)
    dy = wave(y.shape, 0.11, 0.3)
    y.backward(dy)
    return {
        "name": name, "kernel": kernel, "stride": stride, "pad": pad,
        "x_shape": list(x_shape), "x": flat(x), "y_shape": list(y.shape), "y": flat(y),
        "idx": [int(v) for v in idx.reshape(-1).tolist()], "dy": flat(dy), "dx": flat(x.grad),
    }


def adaptive_case(name, x_shape, out_hw):
    x = wave(x_shape, 0.37, 0.1).requires_grad_()
    y = F.adaptive_avg_pool2d(x, out_hw)
    dy = wave(y.shape, 0.11, 0.3)
    y.backward(dy)
    return {
        "name": name, "out_h": out_hw[0], "out_w": out_hw[1],
        "x_shape": list(x_shape), "x": flat(x), "y_shape": list(y.shape), "y": flat(y),
        "dy": flat(dy), "dx": flat(x.grad),
    }


def main():
    torch.set_num_threads(1)
    golden = {
        "torch_version": torch.__version__,
        "conv2d": [
            conv_case("3x3 s1 p1", (2, 3, 7, 5), (4, 3, 3, 3), 1, 1),
            conv_case("3x3 s1 p0", (2, 3, 7, 5), (4, 3, 3, 3), 1, 0),
            conv_case("3x3 s2 p0", (2, 3, 7, 5), (4, 3, 3, 3), 2, 0),
            conv_case("3x3 s2 p1 no bias", (2, 3, 7, 5), (4, 3, 3, 3), 2, 1, bias=False),
            conv_case("3x2 s2 p1", (3, 2, 6, 9), (5, 2, 3, 2), 2, 1),
            conv_case("1x1 s1 p0", (2, 3, 7, 5), (4, 3, 1, 1), 1, 0),
            conv_case("1x1 s2 p1", (2, 3, 7, 5), (4, 3, 1, 1), 2, 1),
            conv_case("5x5 s3 p2", (3, 5, 11, 10), (6, 5, 5, 5), 3, 2),
        ],
        "max_pool2d": [
            max_pool_case("k2 s2 p0", (2, 3, 7, 5), 2, 2, 0),
            max_pool_case("k3 s2 p1", (2, 3, 7, 5), 3, 2, 1),
            max_pool_case("k3 s1 p1", (2, 3, 7, 5), 3, 1, 1),
            max_pool_case("k2 s1 p1", (1, 2, 6, 4), 2, 1, 1),
        ],
        "adaptive_avg_pool2d": [
            adaptive_case("7x5 -> 3x2", (2, 3, 7, 5), (3, 2)),
            adaptive_case("5x5 -> 7x7", (2, 3, 5, 5), (7, 7)),
            adaptive_case("7x5 -> 1x1", (2, 3, 7, 5), (1, 1)),
            adaptive_case("9x6 -> 4x4", (1, 2, 9, 6), (4, 4)),
        ],
    }
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "conv_pool.json")
    with open(path, "w") as f:
        json.dump(golden, f)
        f.write("\n")
    print("wrote", path)


if __name__ == "__main__":
    main()
