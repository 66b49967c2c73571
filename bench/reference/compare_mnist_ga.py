#!/usr/bin/python3
"""Runs build/bin/mnist_ga with the recipes of mnist_ga_torch.py (same seeds, same data split) and
compares the mean held-out accuracy with PyTorch's. Passes (exit 0) when every recipe is within
--tolerance points (default 1).

  /usr/bin/python3 bench/reference/mnist_ga_torch.py --json /tmp/torch_ref.json
  OMP_NUM_THREADS=1 /usr/bin/python3 bench/reference/compare_mnist_ga.py \
      --torch-json /tmp/torch_ref.json --bin build/bin/mnist_ga --out-dir /tmp/mnist_ga_runs
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--torch-json", required=True)
    ap.add_argument("--bin", default="build/bin/mnist_ga")
    ap.add_argument("--data", default="", help="passed to mnist_ga --data (default: its own search)")
    ap.add_argument("--out-dir", default="/tmp/mnist_ga_runs")
    ap.add_argument("--tolerance", type=float, default=1.0)
    ap.add_argument("--reuse", action="store_true", help="read existing JSON files instead of running")
    args = ap.parse_args()
    ref = json.load(open(args.torch_json))
    os.makedirs(args.out_dir, exist_ok=True)
    rows, ok = [], True
    for name, r in ref["recipes"].items():
        rec = r["recipe"]
        accs = []
        for run in r["runs"]:
            seed = run["seed"]
            out = os.path.join(args.out_dir, f"recipe{name}_seed{seed}.json")
            if not (args.reuse and os.path.exists(out)):
                cmd = [args.bin, "--epochs", str(rec["epochs"]), "--batch-size", str(rec["batch"]),
                       "--accum", str(rec["accum"]), "--lr", str(rec["lr"]), "--momentum", "0",
                       "--optimizer", "sgd", "--seed", str(seed), "--json", out]
                if args.data:
                    cmd += ["--data", args.data]
                print("$", " ".join(cmd), flush=True)
                subprocess.run(cmd, check=True)
            j = json.load(open(out))
            if "held out" not in j["data"] and not args.data:
                sys.exit(f"mnist_ga did not use the real-MNIST split ({j['data']}); pass --data")
            accs.append(j["final_test_accuracy"])
        ours, theirs = float(np.mean(accs)), r["mean_accuracy"]
        good = abs(ours - theirs) <= args.tolerance
        ok &= good
        rows.append((name, rec, accs, ours, r["accuracies"], theirs, good))
    print()
    print("| recipe | mnist_ga per seed | mnist_ga mean | PyTorch per seed | PyTorch mean | difference |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, rec, accs, ours, taccs, theirs, good in rows:
        desc = f"{name}: batch {rec['batch']} x {rec['accum']}, SGD lr {rec['lr']:g}, {rec['epochs']} epochs"
        print(f"| {desc} | {', '.join(f'{a:.2f}' for a in accs)} | {ours:.2f} | "
              f"{', '.join(f'{a:.2f}' for a in taccs)} | {theirs:.2f} | {ours - theirs:+.2f}"
              f"{'' if good else ' (OVER TOLERANCE)'} |")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
