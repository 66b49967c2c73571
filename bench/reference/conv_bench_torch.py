#!/usr/bin/env python3
"""PyTorch reference for bench/conv_bench.cpp: conv2d forward and forward+backward for each
convolution of VGG16 (widths / --width-div), same JSON schema. Run with Debian's python3:

    /usr/bin/python3 bench/reference/conv_bench_torch.py --batch 8 --width-div 8 --size 224
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F

STAGES = [[64, 64], [128, 128], [256, 256, 256], [512, 512, 512], [512, 512, 512]]


def vgg16_convs(width_div, size):
    layers, cin = [], 3
    for stage in STAGES:
        for c in stage:
            layers.append((cin, c // width_div, size))
            cin = c // width_div
        size //= 2
    return layers


def median(v):
    return sorted(v)[len(v) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--width-div", type=int, default=8)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    torch.manual_seed(1)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    total_fwd = total_step = total_gflop = total_min_fwd = total_min_step = 0.0
    for l, (cin, cout, size) in enumerate(vgg16_convs(args.width_div, args.size)):
        x = (torch.rand(args.batch, cin, size, size, device=dev) * 2 - 1).requires_grad_(l > 0)
        w = ((torch.rand(cout, cin, 3, 3, device=dev) * 2 - 1) * 0.1).requires_grad_()
        b = ((torch.rand(cout, device=dev) * 2 - 1) * 0.1).requires_grad_()
        dy = torch.rand(args.batch, cout, size, size, device=dev) * 2 - 1
        w.grad = torch.zeros_like(w)
        b.grad = torch.zeros_like(b)
        fwd, step = [], []
        for r in range(args.warmup + args.reps):
            t0 = time.perf_counter()
            with torch.no_grad():
                F.conv2d(x, w, b, 1, 1)
                sync()
            t1 = time.perf_counter()
            y = F.conv2d(x, w, b, 1, 1)
            y.backward(dy)
            sync()
            t2 = time.perf_counter()
            x.grad = None
            if r >= args.warmup:
                fwd.append(t1 - t0)
                step.append(t2 - t1)
        fwd_gflop = 2.0 * args.batch * cout * size * size * cin * 9 * 1e-9
        step_gflop = fwd_gflop * (3 if l > 0 else 2)
        mf, ms = median(fwd), median(step)
        total_fwd += mf
        total_step += ms
        total_gflop += step_gflop
        total_min_fwd += min(fwd)
        total_min_step += min(step)
        print(json.dumps({"framework": "pytorch", "workload": f"conv_vgg16_l{l}", "device": str(dev),
                          "batch": args.batch, "in": cin, "out": cout, "size": size,
                          "median_fwd_s": mf, "median_fwd_bwd_s": ms, "min_fwd_s": min(fwd),
                          "min_fwd_bwd_s": min(step), "fwd_bwd_gflops": step_gflop / ms}),
              flush=True)
    print(json.dumps({"framework": "pytorch", "workload": "conv_vgg16_total", "device": str(dev),
                      "batch": args.batch, "width_div": args.width_div, "size": args.size,
                      "median_fwd_s": total_fwd, "median_fwd_bwd_s": total_step,
                      "min_fwd_s": total_min_fwd, "min_fwd_bwd_s": total_min_step,
                      "fwd_bwd_gflops": total_gflop / total_step, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
