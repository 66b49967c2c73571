#!/usr/bin/env python3
"""Golden values from PyTorch for whole training steps, checked by tests/test_golden.cpp.

The MLP 784-32-16-10 (Flatten, Linear, ReLU, Linear, ReLU, Linear: the layout of
mg::nn::make_mlp, parameter names "1.weight", ...) starts from weights given by a formula, rounded
to float32 and written into the JSON, so both sides start bit-identical. A fixed batch of 5
inputs and labels then trains for 3 steps under each optimizer configuration; the JSON records
the loss of each step (computed before that step's update) and the parameters after the last.

The reference runs in float64 from the float32 start (the exact answer the float32 C++ code
approximates). The same run in float32 is done too, and its distance to float64 is recorded
(`torch_f32_rel_err`) and asserted small, which shows the problem is well conditioned enough
for the C++ test's 1e-5 tolerance to be meaningful rather than lucky.

Float arrays are stored as base64 of little-endian float32 (a 784x32 layer in decimal would
make the file several MB).

    /usr/bin/python3 tests/golden/make_golden.py          # writes tests/golden/mlp_steps.json
"""
import base64
import json
import math
import os

import numpy as np
import torch

SIZES = [784, 32, 16, 10]
BATCH = 5
STEPS = 3
LABELS = [3, 7, 0, 9, 1]

CONFIGS = {
    "sgd": ("SGD", dict(lr=0.1)),
    "sgd_momentum": ("SGD", dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=1e-3)),
    "sgd_nesterov": ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    "adam": ("Adam", dict(lr=0.01, weight_decay=0.01)),
    "adamw": ("AdamW", dict(lr=0.01, weight_decay=0.01)),
}


def b64(a):
    return base64.b64encode(np.ascontiguousarray(a, dtype="<f4").tobytes()).decode("ascii")


def make_model(dtype):
    layers = [torch.nn.Flatten()]
    for i in range(len(SIZES) - 1):
        layers.append(torch.nn.Linear(SIZES[i], SIZES[i + 1]))
        if i + 2 < len(SIZES):
            layers.append(torch.nn.ReLU())
    return torch.nn.Sequential(*layers).to(dtype)


def initial_params(model):
    """Parameter k, element i: sin(0.61803 i + 1.3 k) / sqrt(fan_in), rounded to float32."""
    out = {}
    for k, (name, p) in enumerate(model.named_parameters()):
        fan_in = SIZES[(int(name.split(".")[0]) - 1) // 2]
        i = np.arange(p.numel(), dtype=np.float64)
        out[name] = (np.sin(0.61803 * i + 1.3 * k) / math.sqrt(fan_in)).astype(np.float32).reshape(p.shape)
    return out


def make_batch():
    n = np.arange(BATCH, dtype=np.float64)[:, None]
    j = np.arange(SIZES[0], dtype=np.float64)[None, :]
    x = (0.5 + 0.5 * np.sin(0.37 * j * (n + 1) + n)).astype(np.float32)  # MNIST-like, in [0, 1]
    return x.reshape(BATCH, 1, 28, 28), np.array(LABELS, dtype=np.int64)


def run(config, dtype, init, x, y):
    opt_name, kwargs = CONFIGS[config]
    model = make_model(dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.from_numpy(init[name]).to(dtype))
    opt = getattr(torch.optim, opt_name)(model.parameters(), **kwargs)
    xt, yt = torch.from_numpy(x).to(dtype), torch.from_numpy(y)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xt), yt)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {n: p.detach().to(torch.float64).numpy() for n, p in model.named_parameters()}


def rel_err(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main():
    torch.manual_seed(0)  # unused (everything is given), but makes any accident reproducible
    init = initial_params(make_model(torch.float32))
    x, y = make_batch()
    # How many hidden units are active: a golden test through a dead network proves little.
    with torch.no_grad():
        m = make_model(torch.float64)
        for name, p in m.named_parameters():
            p.copy_(torch.from_numpy(init[name]).double())
        h1 = m[2](m[1](m[0](torch.from_numpy(x).double())))
        h2 = m[4](m[3](h1))
        active = (float((h1 > 0).double().mean()), float((h2 > 0).double().mean()))
    out = {
        "generator": "tests/golden/make_golden.py (torch %s, reference in float64)" % torch.__version__,
        "sizes": SIZES,
        "steps": STEPS,
        "float_encoding": "base64 of little-endian float32, row-major",
        "inputs": {"shape": list(x.shape), "data": b64(x)},
        "labels": LABELS,
        "active_fraction_hidden": active,
        "initial": {n: {"shape": list(a.shape), "data": b64(a)} for n, a in init.items()},
        "runs": {},
    }
    for config, (opt_name, kwargs) in CONFIGS.items():
        losses, params = run(config, torch.float64, init, x, y)
        losses32, params32 = run(config, torch.float32, init, x, y)
        err32 = max([rel_err(params32[n], params[n]) for n in params] +
                    [abs(a - b) / abs(b) for a, b in zip(losses32, losses)])
        assert err32 < 1e-6, f"{config}: torch float32 is {err32:.2e} from float64; ill-conditioned"
        moved = min(rel_err(params[n], init[n].astype(np.float64)) for n in params)
        assert moved > 1e-4, f"{config}: parameters barely moved ({moved:.1e}); the test would be weak"
        out["runs"][config] = {
            "optimizer": opt_name,
            "options": kwargs,
            "losses": losses,
            "torch_f32_rel_err": err32,
            "min_param_rel_change": moved,
            "final": {n: {"shape": list(a.shape), "data": b64(a)} for n, a in params.items()},
        }
        print(f"{config:<13} losses {['%.6f' % l for l in losses]}  f32-vs-f64 {err32:.1e}  "
              f"min rel change {moved:.1e}")
    print("active hidden fractions:", active)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mlp_steps.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("wrote", path, os.path.getsize(path), "bytes")


if __name__ == "__main__":
    main()
