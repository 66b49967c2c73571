#!/usr/bin/env python3
"""CPU data-parallel scaling (docs/distributed.md): the same global batch trained by one process
and by K ranks under mpirun, in one run on one machine.

  python3 bench/dist_scaling.py --build build-cpu [--ranks 2] [--repeats 3]

Rows: the MLP of mnist_ga (one epoch of 8,000 digits, global batch 64: one process at 1 and at K
threads, K ranks of 1 thread, without and with accumulation) and the scaled VGG16 of vgg_ckpt
(width/8, 224x224, global batch 16, 4 steps). Throughput is samples per second (the MLP: the
app's epoch figure; VGG: global batch / median step time). Each configuration runs `repeats`
times, interleaved; the table has the medians. Writes bench/results/dist_scaling/{runs.jsonl,table.md}.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def mpi_env(threads):
    env = dict(os.environ)
    env.update({"OMP_NUM_THREADS": str(threads), "OMPI_ALLOW_RUN_AS_ROOT": "1",
                "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", "OMPI_MCA_rmaps_base_oversubscribe": "1"})
    return env


def run(cmd, threads):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        full = cmd + ["--json", f.name]
        p = subprocess.run(full, env=mpi_env(threads), capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit("failed: %s\n%s%s" % (" ".join(full), p.stdout[-2000:], p.stderr[-2000:]))
        with open(f.name) as j:
            return json.load(j)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/dist_scaling"))
    a = ap.parse_args()
    k = a.ranks
    mnist = os.path.join(ROOT, a.build, "bin/mnist_ga")
    vgg = os.path.join(ROOT, a.build, "bin/vgg_ckpt")
    mpirun = ["mpirun", "-np", str(k)]
    mlp_common = ["--epochs", "1", "--lr", "0.02"]
    vgg_common = ["--width-div", "8", "--steps", "4", "--checkpoint", "none"]
    configs = [
        ("MLP", "1 process, 1 thread, batch 64", [mnist] + mlp_common + ["--batch-size", "64"], 1),
        ("MLP", "1 process, %d threads, batch 64" % k, [mnist] + mlp_common + ["--batch-size", "64"], k),
        ("MLP", "%d ranks x 1 thread, %d per rank" % (k, 64 // k), mpirun + [mnist] + mlp_common + ["--batch-size", str(64 // k)], 1),
        ("MLP", "1 process, %d threads, 2 x 32 accumulated" % k, [mnist] + mlp_common + ["--batch-size", "32", "--accum", "2"], k),
        ("MLP", "%d ranks x 1 thread, 2 x %d accumulated" % (k, 32 // k), mpirun + [mnist] + mlp_common + ["--batch-size", str(32 // k), "--accum", "2"], 1),
        ("VGG16/8", "1 process, 1 thread, batch 16", [vgg] + vgg_common + ["--batch-size", "16"], 1),
        ("VGG16/8", "1 process, %d threads, batch 16" % k, [vgg] + vgg_common + ["--batch-size", "16"], k),
        ("VGG16/8", "%d ranks x 1 thread, %d per rank" % (k, 16 // k), mpirun + [vgg] + vgg_common + ["--batch-size", str(16 // k)], 1),
    ]
    os.makedirs(a.out, exist_ok=True)
    results = {i: [] for i in range(len(configs))}
    with open(os.path.join(a.out, "runs.jsonl"), "w") as log:
        for r in range(a.repeats):
            for i, (model, name, cmd, threads) in enumerate(configs):
                j = run(cmd, threads)
                if model == "MLP":
                    sps = j["epochs"][0]["samples_per_s"]
                else:
                    sps = j["global_batch"] * 1000.0 / j["median_step_ms"]
                results[i].append(sps)
                log.write(json.dumps({"model": model, "config": name, "repeat": r, "samples_per_s": sps,
                                      "threads_per_process": threads, "command": " ".join(cmd)}) + "\n")
                print("%-8s %-45s %9.0f samples/s" % (model, name, sps), flush=True)
    lines = ["# CPU data-parallel scaling", "",
             "Command: `python3 bench/dist_scaling.py --build %s --ranks %d --repeats %d` on %s (%d cores); "
             "medians of %d runs, interleaved." % (a.build, k, a.repeats, platform.machine(), os.cpu_count(), a.repeats),
             "", "| model | configuration | samples/s | vs 1 process, %d threads |" % k, "| --- | --- | ---: | ---: |"]
    base = {}
    for i, (model, name, _, _) in enumerate(configs):
        med = statistics.median(results[i])
        if name.startswith("1 process, %d threads" % k) and model not in base:
            base[model] = med
    for i, (model, name, _, _) in enumerate(configs):
        med = statistics.median(results[i])
        lines.append("| %s | %s | %.0f | %.2f |" % (model, name, med, med / base[model]))
    with open(os.path.join(a.out, "table.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
