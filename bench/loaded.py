#!/usr/bin/env python3
"""Training throughput on a quiet and on a loaded CPU, libminigrad beside PyTorch, same run: the
MLP 784-512-512-10 (mlp_bench), or with --workload vgg the scaled VGG16 (vgg_ckpt, width/8,
224x224, --checkpoint none).

The load is as many busy processes as the machine has cores (pure Python spin loops), started
before and stopped after each measurement by this script. Each configuration is measured
--rounds times, alternating frameworks; two tables show the median samples/s, from the median
step and over the whole timed run (the figure to use under load: BENCHMARKS.md, "The MLP under
load, ten rounds").

  /usr/bin/python3 bench/loaded.py --app build/bin/mlp_bench
  /usr/bin/python3 bench/loaded.py --app build/bin/mlp_bench --other old=path/to/older/mlp_bench
  /usr/bin/python3 bench/loaded.py --workload vgg --app build/bin/vgg_ckpt --steps 20

--other NAME=PATH adds another mlp_bench binary (an older build, say) to compare under the same load.
Output: Markdown tables on stdout, one JSON line per run in --out (default
bench/results/loaded/runs.jsonl).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def start_load(n):
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop_load(procs):
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def run(cmd, env):
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_vgg_ckpt(cmd, env, warmup):
    """vgg_ckpt writes its summary to --json: step_ms holds every step, the first `warmup` untimed."""
    fd, path = tempfile.mkstemp(suffix=".json", prefix="vgg_ckpt_")
    os.close(fd)
    try:
        out = subprocess.run(cmd + ["--json", path], env=env, capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{out.stderr}")
        with open(path) as f:
            j = json.load(f)
    finally:
        os.unlink(path)
    times = [t / 1000.0 for t in j["step_ms"][warmup:]]
    batch = j.get("batch_size", j.get("batch"))
    med = statistics.median(times)
    return {"median_step_s": med, "samples_per_s": batch / med, "run_samples_per_s": batch * len(times) / sum(times),
            "steps": len(times), "batch": batch}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=["mlp", "vgg"], default="mlp")
    ap.add_argument("--app", required=True, help="libminigrad's mlp_bench (or vgg_ckpt with --workload vgg)")
    ap.add_argument("--other", action="append", default=[], help="NAME=PATH of another mlp_bench build")
    ap.add_argument("--torch-python", default="/usr/bin/python3")
    ap.add_argument("--batch", type=int, default=None, help="default 64 (mlp), 8 (vgg)")
    ap.add_argument("--accum", type=int, default=1)
    ap.add_argument("--steps", type=int, default=150, help="timed steps (vgg: after 3 untimed)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--load", type=int, default=os.cpu_count(), help="busy processes in the loaded runs")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "loaded", "runs.jsonl"))
    args = ap.parse_args()
    if args.batch is None:
        args.batch = 64 if args.workload == "mlp" else 8
    vgg = args.workload == "vgg"
    vgg_flags = ["--width-div", "8", "--image-size", "224", "--batch-size", str(args.batch), "--checkpoint", "none"]
    warmup = 3

    apps = [("libminigrad", args.app)] + [tuple(o.split("=", 1)) for o in args.other]
    threads = [int(t) for t in args.threads.split(",")]
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    results = {}
    with open(args.out, "a") as log:
        for load in (0, args.load):
            for rnd in range(args.rounds):
                for t in threads:
                    if vgg:
                        jobs = [(name, [path, "--device", "cpu", "--seed", "0"] + vgg_flags +
                                 ["--steps", str(args.steps + warmup)]) for name, path in apps]
                        jobs.append(("pytorch", [args.torch_python, os.path.join(HERE, "reference", "vgg_bench_torch.py"),
                                                 "--device", "cpu"] + vgg_flags +
                                     ["--steps", str(args.steps), "--warmup", str(warmup), "--threads", str(t)]))
                    else:
                        jobs = [(name, [path, "--device", "cpu", "--batch", str(args.batch), "--accum", str(args.accum),
                                        "--steps", str(args.steps)]) for name, path in apps]
                        jobs.append(("pytorch", [args.torch_python, os.path.join(HERE, "reference", "mlp_torch.py"),
                                                 "--batch", str(args.batch), "--accum", str(args.accum),
                                                 "--steps", str(args.steps), "--threads", str(t)]))
                    for name, cmd in jobs:
                        env = dict(os.environ, OMP_NUM_THREADS=str(t))
                        env.pop("OMP_WAIT_POLICY", None)
                        procs = start_load(load)
                        try:
                            time.sleep(0.5 if load else 0)
                            r = run_vgg_ckpt(cmd, env, warmup) if vgg and name != "pytorch" else run(cmd, env)
                        finally:
                            stop_load(procs)
                        r.update(framework=name, threads=t, load=load, round=rnd,
                                 when=time.strftime("%Y-%m-%d %H:%M:%S"))
                        log.write(json.dumps(r) + "\n")
                        log.flush()
                        results.setdefault((load, name, t), []).append(r["samples_per_s"])
                        results.setdefault((load, name, t, "run"), []).append(r.get("run_samples_per_s", float("nan")))
                        if "fraction_of_sgemm" in r and name == "libminigrad":
                            results.setdefault((load, "frac", t), []).append(r["fraction_of_sgemm"])
                        print(f"load {load} {name} threads {t}: {r['samples_per_s']:.0f} samples/s "
                              f"(median step), {r.get('run_samples_per_s', float('nan')):.0f} (whole run)", file=sys.stderr)

    names = [n for n, _ in apps] + ["pytorch"]
    what = (f"VGG16/8 at 224x224, batch {args.batch}, --checkpoint none" if vgg
            else f"MLP 784-512-512-10, batch {args.batch} x {args.accum}")
    print(f"{what}, median samples/s of {args.rounds} runs "
          f"(load: {args.load} busy processes on {os.cpu_count()} cores)")
    # Two measures of throughput. From the median step: what a step takes when it is not
    # interrupted. Over the whole run (samples / summed wall time of all timed steps): what a user
    # gets. They agree on a quiet machine; under load only the second counts the time the load
    # takes, since a step shorter than the scheduler's slice often runs untouched.
    for key, title in ((None, "from the median step"), ("run", "over the whole run")):
        print(f"\nsamples/s {title}:\n")
        print("| load | threads | " + " | ".join(names) + " | libminigrad / pytorch | 2 threads / 1 thread |"
              + (" libminigrad, fraction of SGEMM rate |" if key is None else ""))
        print("|---|---|" + "---|" * (len(names) + 2 + (key is None)))
        for load in (0, args.load):
            for t in threads:
                med = {n: statistics.median(results[(load, n, t) + ((key,) if key else ())]) for n in names}
                one = statistics.median(results[(load, "libminigrad", 1) + ((key,) if key else ())]) if 1 in threads else None
                cells = " | ".join(f"{med[n]:.0f}" for n in names)
                scale = f"{med['libminigrad'] / one:.2f}" if one and t != 1 else "-"
                row = f"| {load} | {t} | {cells} | {med['libminigrad'] / med['pytorch']:.2f} | {scale} |"
                if key is None:
                    frac = results.get((load, "frac", t))
                    row += f" {statistics.median(frac):.2f} |" if frac else " - |"
                print(row)

if __name__ == "__main__":
    main()
