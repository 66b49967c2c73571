#!/usr/bin/env python3
"""The memory record (issue 40, item 5): the largest batch that trains, and the time per sample
there, for PyTorch (without checkpointing, and checkpoint_sequential(..., 2)) and for libminigrad
(plans none and sqrt, and the joint planner), at the card's memory and under a cap.

    python3 bench/memory_record.py --build-dir build-gpu --models vgg16,resnet50,gpt2 --caps full,16GiB \
        --out $OUT/memory_record.jsonl --png $OUT/memory_record.png

PyTorch searches inside one process (bench/reference/max_batch_torch.py). Ours needs no search:
the peak of a plan is linear in the batch (the planner's cost model, which its measured peaks
matched to the byte), so two runs at small batches b and 2b give the fixed bytes and the bytes per
sample, hence the largest batch under the cap; one run there must train and one 3% above must run
out of memory (where it trains, the record says so). The cap is --memory-limit (ours) and
set_per_process_memory_fraction (PyTorch); "full" is the card's total memory for both (ours:
what the allocator may take of it). The joint planner trains any batch in micro-batches: its row
is a batch of twice PyTorch's largest under the same cap, with the plan it chose and its time per
sample. One JSON line per result (issue 40's schema) and, with --png, time per sample against
batch for every framework and plan.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def log(msg):
    print(f"[memory_record {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_cap(s):
    if s == "full":
        return 0
    for u, m in UNITS.items():
        if s.endswith(u):
            return int(float(s[:-len(u)]) * m)
    return int(s)


class Record:
    def __init__(self, a):
        self.a = a
        self.out = open(a.out, "a") if a.out else None
        self.rows = []
        try:
            self.gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                                      capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            self.gpu = None
        self.total = int(self.gpu.split(",")[1]) << 20 if self.gpu else 0

    def emit(self, rec):
        rec.update(gpu_name=self.gpu, commit=self.a.commit or os.environ.get("MG_COMMIT"),
                   precision=self.a.precision, time_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        self.rows.append(rec)
        if self.out:
            self.out.write(json.dumps(rec) + "\n")
            self.out.flush()
        log(json.dumps({k: rec.get(k) for k in ("framework", "workload", "plan", "memory_cap_bytes", "max_batch",
                                                "median_step_s", "error") if rec.get(k) is not None}))

    # ---- ours ----------------------------------------------------------------------------------
    def ours_cmd(self, model, batch, plan, cap, js):
        a = self.a
        if model == "gpt2":
            cmd = [os.path.join(a.build_dir, "bin", "gpt_train"), "--config", "gpt2", "--seq-len", str(a.seq_len),
                   "--steps", str(a.steps + 1), "--tf32", "on" if a.tf32 == "on" else "off"]
        else:
            cmd = [os.path.join(a.build_dir, "bin", "vgg_ckpt"), "--model", model, "--image-size", str(a.image_size),
                   "--width-div", str(a.width_div), "--steps", str(a.steps + 1), "--tf32", a.tf32]
        cmd += ["--device", a.device, "--batch-size", str(batch), "--json", js]
        cmd += ["--memory-budget", plan.split("=", 1)[1]] if plan.startswith("joint=") else ["--checkpoint", plan]
        if cap:
            cmd += ["--memory-limit", str(cap)]
        return cmd

    def ours_run(self, model, batch, plan, cap):
        """(ok, the app's JSON or the error's last line)."""
        fd, js = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            p = subprocess.run(self.ours_cmd(model, batch, plan, cap, js), capture_output=True, text=True,
                               timeout=self.a.timeout)
            if p.returncode != 0:
                return False, (p.stderr or p.stdout).strip().splitlines()[-1:] or ["?"]
            with open(js) as f:
                j = json.load(f)
            # Under a cap the apps re-plan a batch that does not fit (micro-batches): for plans none
            # and sqrt that is "did not fit as asked".
            if not plan.startswith("joint=") and (j.get("replans") or j.get("micro_batch", batch) != batch):
                return False, [f"re-planned to micro-batch {j.get('micro_batch')}: does not fit as {plan}"]
            return True, j
        except subprocess.TimeoutExpired:
            return False, ["timed out"]
        finally:
            os.unlink(js)

    @staticmethod
    def peak_of(j):
        return j.get("measured_peak_in_use_bytes") or j.get("peak_in_use_bytes")

    def ours_search(self, model, plan, cap):
        a, b0 = self.a, self.a.ours_start
        probes = []
        ok1, j1 = self.ours_run(model, b0, plan, cap)
        ok2, j2 = self.ours_run(model, 2 * b0, plan, cap)
        if not (ok1 and ok2):
            return self.emit({"framework": "libminigrad", "workload": model, "plan": plan, "memory_cap_bytes": cap,
                              "error": f"the runs at {b0} and {2 * b0} failed: {(j1 if not ok1 else j2)[-1]}"})
        per_sample = (self.peak_of(j2) - self.peak_of(j1)) / b0
        fixed = self.peak_of(j1) - per_sample * b0
        room = (cap or self.total or 0) * a.room
        b = max(1, int((room - fixed) / per_sample)) if per_sample > 0 else 0
        log(f"ours {model} {plan}: fixed {fixed / 2**20:.0f} MiB, {per_sample / 2**20:.2f} MiB per sample: batch {b} "
            f"predicted to fit {room / 2**20:.0f} MiB")
        best = None
        ok, j = self.ours_run(model, b, plan, cap)  # the prediction
        probes.append({"batch": b, "ok": ok, **({} if ok else {"why": j[-1]})})
        if ok:
            best = (b, j)
            above = int(math.ceil(b * 1.03)) + 1  # and one 3% above, which must not train as asked
            ok_above, _ = self.ours_run(model, above, plan, cap)
            probes.append({"batch": above, "ok": ok_above})
        else:  # bisect between 2 b0 (trained) and the prediction, to 3%
            lo, hi, best, ok_above = 2 * b0, b, (2 * b0, j2), False
            while hi - lo > max(1, int(0.03 * lo)):
                mid = (lo + hi) // 2
                ok, j = self.ours_run(model, mid, plan, cap)
                probes.append({"batch": mid, "ok": ok, **({} if ok else {"why": j[-1]})})
                if ok:
                    lo, best = mid, (mid, j)
                else:
                    hi = mid
        rec = {"framework": "libminigrad", "workload": model, "plan": plan, "memory_cap_bytes": cap or self.total,
               "predicted_max_batch": int((room - fixed) / per_sample) if per_sample > 0 else None,
               "fixed_bytes": fixed, "bytes_per_sample": per_sample, "probes": probes,
               "above_also_trained": ok_above}
        if best:
            j = best[1]
            med = j["median_step_ms"] / 1000
            rec.update(max_batch=best[0], median_step_s=med, peak_bytes=self.peak_of(j),
                       samples_per_s=best[0] / med)
        else:
            rec["error"] = "no probe trained"
        self.emit(rec)

    def ours_joint(self, model, batch, cap):
        budget = str(cap) if cap else "free"
        ok, j = self.ours_run(model, batch, "joint=" + budget, cap)
        rec = {"framework": "libminigrad", "workload": model, "plan": "joint", "memory_cap_bytes": cap or self.total,
               "batch": batch}
        if ok:
            med = j["median_step_ms"] / 1000
            rec.update(max_batch=batch, median_step_s=med, samples_per_s=batch / med, peak_bytes=self.peak_of(j),
                       micro_batch=j.get("micro_batch"), accumulation=j.get("accumulation"),
                       checkpoint=j.get("segments"))
        else:
            rec["error"] = j[-1]
        self.emit(rec)

    # ---- PyTorch -------------------------------------------------------------------------------
    def torch_search(self, model, plan, cap):
        a = self.a
        cmd = [a.torch_python, os.path.join(REPO, "bench/reference/max_batch_torch.py"), "--model", model,
               "--checkpoint", plan, "--cap-bytes", str(cap), "--image-size", str(a.image_size), "--seq-len",
               str(a.seq_len), "--steps", str(a.steps), "--tf32", a.tf32, "--precision", a.precision, "--start",
               str(a.torch_start)]
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout * 4)
            lines = [json.loads(s) for s in p.stdout.splitlines() if s.startswith("{")]
        except subprocess.TimeoutExpired:
            lines = []
        last = lines[-1] if lines and "max_batch" in lines[-1] else None
        rec = {"framework": "pytorch", "workload": model, "plan": "none" if plan == "none" else "checkpoint_sequential(2)",
               "memory_cap_bytes": cap or self.total, "probes": [l for l in lines if "ok" in l]}
        if last:
            rec.update(max_batch=last["max_batch"], median_step_s=last["median_step_s"], peak_bytes=last["peak_bytes"],
                       torch_version=last["torch_version"])
            if last["median_step_s"]:
                rec["samples_per_s"] = last["max_batch"] / last["median_step_s"]
        else:
            rec["error"] = f"no result: {(p.stderr or '')[-300:] if lines is not None else 'timed out'}"
        self.emit(rec)
        return rec.get("max_batch")


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    models = sorted({r["workload"] for r in rows})
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, m in zip(axes[0], models):
        for r in rows:
            if r["workload"] != m or not r.get("median_step_s"):
                continue
            label = f"{r['framework']} {r['plan']} ({r['memory_cap_bytes'] / 2**30:.0f} GiB)"
            ax.scatter([r["max_batch"]], [1000 * r["median_step_s"] / r["max_batch"]], label=label)
        ax.set_xscale("log")
        ax.set_title(f"{m}: the largest batch, and its time per sample")
        ax.set_xlabel("batch (largest that trains)")
        ax.set_ylabel("ms per sample")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build-gpu"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--models", default="vgg16,resnet50,gpt2")
    ap.add_argument("--caps", default="full,16GiB")
    ap.add_argument("--frameworks", default="pytorch,libminigrad")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--width-div", type=int, default=1, help="ours only (a small CPU try of the script)")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per probe")
    ap.add_argument("--tf32", choices=["on", "off", "conv"], default="conv")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="PyTorch's (ours: fp32)")
    ap.add_argument("--ours-start", type=int, default=4, help="ours: the two runs at b and 2b")
    ap.add_argument("--torch-start", type=int, default=8)
    ap.add_argument("--room", type=float, default=0.97, help="ours: the share of the cap a batch is planned to")
    ap.add_argument("--torch-python", default="python3")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per run of ours (PyTorch's search: 4x)")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--png", default=None)
    a = ap.parse_args()
    a.build_dir = os.path.abspath(a.build_dir)
    r = Record(a)
    fws = a.frameworks.split(",")
    for model in [m for m in a.models.split(",") if m]:
        for cap in [parse_cap(c) for c in a.caps.split(",") if c]:
            torch_max = None
            if "pytorch" in fws:
                torch_max = r.torch_search(model, "none", cap)
                r.torch_search(model, "segments=2", cap)
            if "libminigrad" in fws:
                r.ours_search(model, "none", cap)
                r.ours_search(model, "sqrt", cap)
                r.ours_joint(model, 2 * (torch_max or 64), cap)
    if a.png and r.rows:
        plot(r.rows, a.png)
    for row in r.rows:
        print(json.dumps({k: row.get(k) for k in ("framework", "workload", "plan", "memory_cap_bytes", "max_batch",
                                                  "median_step_s", "peak_bytes", "error")}))


if __name__ == "__main__":
    main()
