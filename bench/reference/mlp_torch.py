#!/usr/bin/env python3
"""PyTorch reference for bench/mlp_bench.cpp: the same MLP 784-512-512-10 training step (SGD
momentum 0.9, cross-entropy), same JSON schema. Run with Debian's python3 (python3-torch):

    /usr/bin/python3 bench/reference/mlp_torch.py --device cpu --batch 64
"""
import argparse
import json
import os
import resource
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave)")
    ap.add_argument("--tf32", action="store_true", help="allow TF32 matmuls on CUDA")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 512), torch.nn.ReLU(),
                                torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss(reduction="sum")
    pool = [(torch.rand(args.batch, 784, device=dev) * 2 - 1, torch.randint(0, 10, (args.batch,), device=dev))
            for _ in range(8)]
    k = 0

    def step():
        nonlocal k
        opt.zero_grad()
        for _ in range(args.accum):
            x, y = pool[k % len(pool)]
            k += 1
            loss = loss_fn(model(x), y) / (args.batch * args.accum)
            loss.backward()
        opt.step()

    with open("/proc/self/statm") as f:  # resident bytes once set up: torch's own share of the RSS
        rss_setup = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    for _ in range(args.warmup):
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times, cpu_times = [], []  # wall; process CPU time of all threads (CPU only)
    for _ in range(args.steps):
        if dev.type == "cuda":  # CUDA events, as issue 6 asks for GPU timing
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000.0)
            continue
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - t0)
        cpu_times.append(time.process_time() - c0)
    total = sum(times)  # whole-run throughput, as mlp_bench reports it
    times.sort()
    med = times[len(times) // 2]
    out = {"framework": "pytorch", "torch_version": torch.__version__, "threads": torch.get_num_threads(),
           "workload": f"mlp_b{args.batch}" + (f"x{args.accum}" if args.accum > 1 else ""),
           "device": str(dev), "batch": args.batch, "accum": args.accum, "steps": args.steps,
           "median_step_s": med, "samples_per_s": args.batch * args.accum / med,
           "run_samples_per_s": args.batch * args.accum * args.steps / total,
           "min_step_s": times[0],
           "median_step_cpu_s": sorted(cpu_times)[len(cpu_times) // 2] if cpu_times else None,
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "rss_after_setup_bytes": rss_setup}
    if dev.type == "cuda":
        out["peak_in_use_bytes"] = torch.cuda.max_memory_allocated()
        out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        out["gpu_name"] = torch.cuda.get_device_name()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
