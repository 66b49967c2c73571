#!/usr/bin/env python3
"""PyTorch reference for apps/vgg_ckpt: the same VGG16 (torchvision layout as one flat
nn.Sequential, channels and hidden sizes divided by --width-div, 2 classes), SGD (lr 0.001,
momentum 0.9), cross-entropy, synthetic data, trained with and without
torch.utils.checkpoint.checkpoint_sequential(model, SEGMENTS, x).

  /usr/bin/python3 bench/reference/vgg_ckpt_torch.py --device cuda --batch-size 64 --json torch_vgg.json
  /usr/bin/python3 bench/reference/vgg_ckpt_torch.py --device cpu --width-div 8 --batch-size 8 --steps 5

On CUDA it reports torch.cuda.max_memory_allocated per mode (the counterpart of our
peak_in_use) and max_memory_reserved; on CPU only step times (PyTorch has no CPU allocator
statistics). Times are medians over the steps after the first (warm-up).

torch 1.13's checkpoint_sequential uses reentrant checkpointing, which gives no gradient to the
parameters of a segment whose input does not require grad, so in checkpoint mode the input batch
is marked requires_grad (as is usual with it); newer torch gets use_reentrant=False instead.
"""
import argparse
import inspect
import json
import statistics
import time

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint_sequential


def make_vgg16(num_classes=2, width_div=1, dropout=0.5):
    cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]
    layers, c_in = [], 3
    for v in cfg:
        if v == "M":
            layers.append(nn.MaxPool2d(2, 2))
            continue
        c_out = max(1, v // width_div)
        layers += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU()]
        c_in = c_out
    hidden = max(1, 4096 // width_div)
    layers += [nn.AdaptiveAvgPool2d((7, 7)), nn.Flatten(),
               nn.Linear(c_in * 49, hidden), nn.ReLU(), nn.Dropout(dropout),
               nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout),
               nn.Linear(hidden, num_classes)]
    return nn.Sequential(*layers)


def synthetic_batch(n, size, seed, step):
    g = torch.Generator().manual_seed(seed * 100003 + step)
    y = torch.arange(n) % 2
    ramp = torch.linspace(0, 1, size)
    pattern = torch.where(y.view(n, 1, 1, 1) == 0, ramp.view(1, 1, 1, size), ramp.view(1, 1, size, 1))
    x = 0.6 * pattern + 0.4 * torch.rand(n, 3, size, size, generator=g)
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)
    return (x - mean) / std, y


def run(mode, args, device):
    torch.manual_seed(args.seed)
    model = make_vgg16(2, args.width_div).to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    kwargs = {}
    if "use_reentrant" in inspect.signature(checkpoint_sequential).parameters:
        kwargs["use_reentrant"] = False
    times, losses = [], []
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    for step in range(args.steps):
        x, y = synthetic_batch(args.batch_size, args.image_size, args.seed, step)
        x, y = x.to(device), y.to(device)
        if mode != "none" and not kwargs:
            x.requires_grad_(True)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        out = model(x) if mode == "none" else checkpoint_sequential(model, args.segments, x, **kwargs)
        loss = nn.functional.cross_entropy(out, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000.0)
        print(f"{mode:>12} step {step + 1}/{args.steps}  loss {losses[-1]:.5f}  {times[-1]:.1f} ms", flush=True)
    res = {"mode": mode, "median_step_ms": statistics.median(times[1:] if len(times) > 1 else times),
           "step_ms": times, "final_loss": losses[-1]}
    if device.type == "cuda":
        res["max_memory_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        res["max_memory_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    return res


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--width-div", type=int, default=1)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--segments", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default="")
    args = p.parse_args()
    device = torch.device(args.device)
    results = [run("none", args, device), run(f"checkpoint_sequential({args.segments})", args, device)]
    summary = {"torch": torch.__version__, "device": str(device), "batch_size": args.batch_size,
               "image_size": args.image_size, "width_div": args.width_div, "segments": args.segments,
               "results": results}
    for r in results:
        mem = r.get("max_memory_allocated_bytes")
        print(f"{r['mode']:>26}: median step {r['median_step_ms']:.1f} ms"
              + (f", max_memory_allocated {mem / 2**20:.1f} MiB" if mem is not None else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)


if __name__ == "__main__":
    main()
