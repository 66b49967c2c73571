#!/usr/bin/env python3
"""PyTorch reference for apps/vgg_ckpt: VGG16 (torchvision layout, as ONE flat nn.Sequential, as
mg::nn::make_vgg16 builds it), or with --model resnet18|resnet34|resnet50 a ResNet as ONE flat
nn.Sequential of torchvision's own blocks (stem, BasicBlock/Bottleneck, head: the chain
mg::nn::make_resnet* builds, widths divided by --width-div), trained with SGD(lr 0.001, momentum 0.9) and mean cross-entropy on
synthetic data, with or without gradient checkpointing. One JSON line on stdout, the schema of
bench/suite.py (framework, workload, device, batch, accum, steps, median_step_s, samples_per_s,
peak_in_use_bytes, peak_reserved_bytes, peak_rss_bytes, plan, segments, ...).

    /usr/bin/python3 bench/reference/vgg_bench_torch.py --device cpu --width-div 8 --image-size 224 \
        --batch-size 8 --checkpoint segments=2 --threads 2

--checkpoint:
  none          plain eager training
  segments=K    torch.utils.checkpoint.checkpoint_sequential(model, K, x): K chunks of
                len(model)//K layers, all but the last chunk checkpointed (PyTorch's own split)
  sqrt          checkpoint_sequential with K = round(sqrt(number of layers))
  bounds=A:B,.. checkpoint exactly the layer ranges [A, B) given (used to run libminigrad's plan,
                e.g. a budget plan, with PyTorch's checkpoint); other layers run normally

PyTorch 1.13's checkpoint_sequential uses the re-entrant checkpoint: a segment whose input does
not require grad gets no parameter gradients, so the input batch is marked requires_grad=True
when any segment is checkpointed (as the PyTorch docs ask). That adds the gradient of the first
conv's input. --reentrant off runs the same ranges with checkpoint(..., use_reentrant=False)
instead, which needs no input gradient (to see what that extra work costs).
"""
import argparse
import json
import math
import os
import resource
import time

import torch
import torch.utils.checkpoint as tuc


def make_vgg16(num_classes, width_div, dropout_p=0.5):
    cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]
    layers, c_in = [], 3
    for c in cfg:
        if c == "M":
            layers.append(torch.nn.MaxPool2d(2, 2))
            continue
        c_out = max(1, c // width_div)
        layers += [torch.nn.Conv2d(c_in, c_out, 3, 1, 1), torch.nn.ReLU()]
        c_in = c_out
    hidden = max(1, 4096 // width_div)
    layers += [torch.nn.AdaptiveAvgPool2d((7, 7)), torch.nn.Flatten(),
               torch.nn.Linear(c_in * 49, hidden), torch.nn.ReLU(), torch.nn.Dropout(dropout_p),
               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Dropout(dropout_p),
               torch.nn.Linear(hidden, num_classes)]
    return torch.nn.Sequential(*layers)


def make_resnet(name, num_classes, width_div, dropout_p=0.0):
    """torchvision's ResNet as a flat chain: conv1, bn1, relu, maxpool, the blocks, avgpool, flatten,
    (dropout,) fc. torchvision's blocks take any inplanes/planes; only the widths are divided."""
    from torchvision.models.resnet import BasicBlock, Bottleneck
    block, layers = {"resnet18": (BasicBlock, [2, 2, 2, 2]), "resnet34": (BasicBlock, [3, 4, 6, 3]),
                     "resnet50": (Bottleneck, [3, 4, 6, 3])}[name]
    width = lambda c: max(1, c // width_div)
    inplanes = width(64)
    chain = [torch.nn.Conv2d(3, inplanes, 7, 2, 3, bias=False), torch.nn.BatchNorm2d(inplanes),
             torch.nn.ReLU(inplace=True), torch.nn.MaxPool2d(3, 2, 1)]
    for stage, n in enumerate(layers):
        planes = width(64 << stage)
        for b in range(n):
            stride = 2 if stage > 0 and b == 0 else 1
            down = None
            if stride != 1 or inplanes != planes * block.expansion:
                down = torch.nn.Sequential(torch.nn.Conv2d(inplanes, planes * block.expansion, 1, stride, bias=False),
                                           torch.nn.BatchNorm2d(planes * block.expansion))
            chain.append(block(inplanes, planes, stride, down))
            inplanes = planes * block.expansion
    chain += [torch.nn.AdaptiveAvgPool2d((1, 1)), torch.nn.Flatten()]
    if dropout_p > 0:
        chain.append(torch.nn.Dropout(dropout_p))
    chain.append(torch.nn.Linear(inplanes, num_classes))
    return torch.nn.Sequential(*chain)


def sequential_ranges(n_layers, segments):
    """The layer ranges [a, b) that checkpoint_sequential(model, segments, x) checkpoints."""
    size = n_layers // segments
    return [(s, s + size) for s in range(0, size * (segments - 1), size)]


def parse_plan(spec, n_layers):
    """-> (ranges [(a, b)], use checkpoint_sequential's K or None)."""
    if spec == "none":
        return [], None
    if spec == "sqrt":
        k = max(1, round(math.sqrt(n_layers)))
        return sequential_ranges(n_layers, k), k
    if spec.startswith("segments="):
        k = int(spec.split("=", 1)[1])
        if not 1 <= k <= n_layers:
            raise SystemExit(f"--checkpoint segments=K: K must be in [1, {n_layers}], got {k}")
        return sequential_ranges(n_layers, k), k
    if spec.startswith("bounds="):
        ranges = []
        for part in spec.split("=", 1)[1].split(","):
            if not part:
                continue
            a, b = (int(v) for v in part.split(":"))
            if not (0 <= a < b <= n_layers) or (ranges and a < ranges[-1][1]):
                raise SystemExit(f"--checkpoint bounds: bad or overlapping range {a}:{b} (model has {n_layers} layers)")
            ranges.append((a, b))
        return ranges, None
    raise SystemExit(f"--checkpoint: expected none | sqrt | segments=K | bounds=A:B,..., got {spec!r}")


def run_range(model, a, b):
    def fwd(x):
        for j in range(a, b):
            x = model[j](x)
        return x
    return fwd


def forward_with_plan(model, x, ranges, k_sequential, reentrant=True):
    if k_sequential is not None and reentrant:
        return tuc.checkpoint_sequential(model, k_sequential, x)
    i = 0
    for a, b in ranges:
        x = run_range(model, i, a)(x)
        x = tuc.checkpoint(run_range(model, a, b), x, use_reentrant=reentrant)
        i = b
    return run_range(model, i, len(model))(x)


def current_rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", choices=["vgg16", "resnet18", "resnet34", "resnet50"], default="vgg16")
    ap.add_argument("--width-div", type=int, default=1)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--num-classes", type=int, default=2)
    ap.add_argument("--checkpoint", default="none")
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave)")
    ap.add_argument("--tf32", choices=["on", "off", "conv"], default="off",
                    help="TF32 on CUDA: on (matmuls and convolutions), off (strict FP32), conv "
                         "(convolutions only: PyTorch's and libminigrad's defaults)")
    ap.add_argument("--cudnn-benchmark", choices=["on", "off"], default="off")
    ap.add_argument("--reentrant", choices=["on", "off"], default="on",
                    help="on: checkpoint_sequential / re-entrant checkpoint (input requires grad); "
                         "off: use_reentrant=False on the same ranges")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: forward and loss under torch.autocast(bfloat16), parameters and SGD in fp32")
    ap.add_argument("--channels-last", action="store_true",
                    help="model and inputs in torch.channels_last (NHWC), as PyTorch's mixed-precision recipe has it")
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32 == "on"
    torch.backends.cudnn.allow_tf32 = args.tf32 in ("on", "conv")
    torch.backends.cudnn.benchmark = args.cudnn_benchmark == "on"
    torch.manual_seed(args.seed)

    if args.model == "vgg16":
        model = make_vgg16(args.num_classes, args.width_div).to(dev)
    else:
        model = make_resnet(args.model, args.num_classes, args.width_div).to(dev)
    if args.channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=args.precision == "bf16")
    ranges, k_seq = parse_plan(args.checkpoint, len(model))
    opt = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(args.seed + 1)
    # Batches live on the host; one at a time is copied to the device outside the timed region,
    # as apps/vgg_ckpt does, so both hold one batch on the device.
    pool = [(torch.randn(args.batch_size, 3, args.image_size, args.image_size, generator=g),
             torch.randint(0, args.num_classes, (args.batch_size,), generator=g)) for _ in range(2)]
    k = 0
    batch = None

    def next_batch():
        nonlocal k, batch
        batch = None
        x, y = pool[k % len(pool)]
        k += 1
        x = x.to(dev)
        if args.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        if ranges and args.reentrant == "on":
            x = x.detach().requires_grad_(True)
        batch = (x, y.to(dev))

    def step():
        x, y = batch
        opt.zero_grad(set_to_none=False)
        with autocast:
            loss = loss_fn(forward_with_plan(model, x, ranges, k_seq, args.reentrant == "on"), y)
        loss.backward()
        opt.step()
        return loss

    rss_setup = current_rss_bytes()
    for _ in range(args.warmup):
        next_batch()
        step()
    if dev.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times, cpu_times = [], []  # wall; process CPU time of all threads (CPU only)
    for _ in range(args.steps):
        next_batch()
        if dev.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            loss = step()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000.0)
        else:
            t0, c0 = time.perf_counter(), time.process_time()
            loss = step()
            times.append(time.perf_counter() - t0)
            cpu_times.append(time.process_time() - c0)
    loss_value = float(loss.item())
    total = sum(times)  # whole-run throughput: the timed steps' samples over their summed wall time
    times.sort()
    med = times[len(times) // 2]
    out = {"framework": "pytorch", "torch_version": torch.__version__, "threads": torch.get_num_threads(),
           "workload": f"{args.model}_w{args.width_div}_s{args.image_size}_b{args.batch_size}",
           "device": str(dev), "batch": args.batch_size, "accum": 1, "steps": args.steps,
           "warmup": args.warmup, "plan": args.checkpoint,
           "segments": [list(r) for r in ranges], "n_layers": len(model),
           "median_step_s": med, "samples_per_s": args.batch_size / med,
           "run_samples_per_s": args.batch_size * len(times) / total,
           "median_step_cpu_s": sorted(cpu_times)[len(cpu_times) // 2] if cpu_times else None,
           "min_step_s": times[0], "max_step_s": times[-1],
           "predicted_peak_bytes": None,
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "rss_after_setup_bytes": rss_setup,
           "final_loss": loss_value,
           "tf32": args.tf32, "cudnn_benchmark": args.cudnn_benchmark,
           "precision": args.precision, "channels_last": args.channels_last,
           "reentrant_checkpoint": args.reentrant == "on" if ranges else None}
    if dev.type == "cuda":
        out["peak_in_use_bytes"] = torch.cuda.max_memory_allocated()
        out["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
        out["gpu_name"] = torch.cuda.get_device_name()
    else:
        out["peak_in_use_bytes"] = None
        out["peak_reserved_bytes"] = None
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
