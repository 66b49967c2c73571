#!/usr/bin/env python3
"""PyTorch's largest training batch on one CUDA device, searched inside one process (issue 40,
item 5): probes double from --start until one runs out of memory (or --max), then a bisection
down to 3% between the last that trained and the first that did not. Each probe is --steps
training steps (forward, backward, SGD or AdamW) after one untimed step; out of memory is caught
(torch.cuda.OutOfMemoryError), the cache emptied, and the search goes on. --cap-bytes caps the
process with torch.cuda.set_per_process_memory_fraction (the card's memory otherwise).

    python3 bench/reference/max_batch_torch.py --model vgg16 --checkpoint none --cap-bytes 17179869184

Models: vgg16, resnet50 (bench/reference/vgg_bench_torch.py's, 224x224 by default, 2 classes) and
gpt2 (bench/reference/gpt_torch.py's GPT-2 124M at --seq-len, SDPA attention). --checkpoint
segments=2 runs torch.utils.checkpoint.checkpoint_sequential(..., 2) over the chain (GPT-2: over
its blocks). Prints one JSON line per probe and a last one with max_batch.
"""
import argparse
import json
import os
import sys
import time

import torch
import torch.nn.functional as F
import torch.utils.checkpoint as tuc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def build(a, dev):
    if a.model == "gpt2":
        from gpt_torch import GPT, PRESETS, Attention, adamw
        Attention.use_sdpa = True
        model = GPT(**PRESETS["gpt2"]).to(dev)
        return model, adamw(model, 3e-4, 0.1)
    from vgg_bench_torch import make_resnet, make_vgg16
    model = (make_vgg16(2, 1) if a.model == "vgg16" else make_resnet(a.model, 2, 1)).to(dev)
    return model, torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)


def step_fn(a, model, opt, batch, dev):
    segments = int(a.checkpoint.split("=")[1]) if a.checkpoint.startswith("segments=") else 0
    if a.model == "gpt2":
        t = a.seq_len
        x = torch.randint(0, 50257, (batch, t), device=dev)
        y = torch.randint(0, 50257, (batch, t), device=dev)

        def forward():
            tr = model.transformer
            h = tr.wte(x) + tr.wpe(torch.arange(t, device=dev))
            h = tuc.checkpoint_sequential(torch.nn.Sequential(*tr.h), segments, h, use_reentrant=False) if segments \
                else torch.nn.Sequential(*tr.h)(h)
            return F.cross_entropy(model.lm_head(tr.ln_f(h)).view(-1, 50257), y.view(-1))
    else:
        x = torch.randn(batch, 3, a.image_size, a.image_size, device=dev)
        y = torch.randint(0, 2, (batch,), device=dev)

        def forward():
            out = tuc.checkpoint_sequential(model, segments, x, use_reentrant=False) if segments else model(x)
            return F.cross_entropy(out, y)

    def step():
        opt.zero_grad(set_to_none=False)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.precision == "bf16"):
            loss = forward()
        loss.backward()
        opt.step()
    return step


def probe(a, model, opt, batch, dev):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(dev)
    try:
        step = step_fn(a, model, opt, batch, dev)
        step()  # untimed
        torch.cuda.synchronize(dev)
        times = []
        for _ in range(a.steps):
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize(dev)
            times.append(time.perf_counter() - t0)
        times.sort()
        return {"batch": batch, "ok": True, "median_step_s": times[len(times) // 2],
                "peak_bytes": torch.cuda.max_memory_allocated(dev)}
    except torch.cuda.OutOfMemoryError:
        return {"batch": batch, "ok": False}
    finally:
        opt.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=["vgg16", "resnet50", "gpt2"], default="vgg16")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--checkpoint", default="none", help="none | segments=K")
    ap.add_argument("--cap-bytes", type=int, default=0, help="0: the whole card")
    ap.add_argument("--start", type=int, default=8)
    ap.add_argument("--max", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per probe")
    ap.add_argument("--tf32", choices=["on", "off", "conv"], default="conv")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    a = ap.parse_args()
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = a.tf32 == "on"
    torch.backends.cudnn.allow_tf32 = a.tf32 in ("on", "conv")
    total = torch.cuda.get_device_properties(dev).total_memory
    if a.cap_bytes:
        torch.cuda.set_per_process_memory_fraction(min(1.0, a.cap_bytes / total), dev)
    torch.manual_seed(0)
    model, opt = build(a, dev)
    model.train()
    ok, bad, probes = 0, None, []
    b = a.start
    while b <= a.max:  # double until out of memory
        r = probe(a, model, opt, b, dev)
        probes.append(r)
        print(json.dumps(r), flush=True)
        if not r["ok"]:
            bad = b
            break
        ok, b = b, b * 2
    while bad is not None and bad - ok > max(1, int(0.03 * ok)):  # bisect
        mid = (ok + bad) // 2
        r = probe(a, model, opt, mid, dev)
        probes.append(r)
        print(json.dumps(r), flush=True)
        ok, bad = (mid, bad) if r["ok"] else (ok, mid)
    best = next((p for p in probes if p["ok"] and p["batch"] == ok), None)
    print(json.dumps({"framework": "pytorch", "torch_version": torch.__version__, "model": a.model,
                      "checkpoint": a.checkpoint, "max_batch": ok, "first_failed": bad,
                      "memory_cap_bytes": a.cap_bytes or total, "median_step_s": best and best["median_step_s"],
                      "peak_bytes": best and best["peak_bytes"], "precision": a.precision, "tf32": a.tf32,
                      "gpu_name": torch.cuda.get_device_name(dev), "probes": len(probes)}), flush=True)


if __name__ == "__main__":
    main()
