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

GPT-2 (issue 37, item 3) adds ours with every block its own segment (plan `blocks`) and llm.c
(--llmc DIR: train_gpt2cu in bf16 at each --llmc-recompute level, -r 0 keeping every activation,
1 recomputing GELU, 2 LayerNorm too). llm.c allocates everything before its first step and prints
it ('device memory usage'); its bytes are linear in the batch too, so it is searched as ours is:
runs at b and 2b, the largest batch predicted under the cap, one run there and one 3% above. It has
no cap of its own: under a cap a run fits when it trains and the most device memory it used (its
report or nvidia-smi's, whichever is more) is within the cap; at the card's memory, when it trains
without falling back to cudaMallocManaged (which it does rather than fail, running from host
memory). The joint planner's batch is then at least 1.5x llm.c's largest at -r 2, and the summary
gives its tokens/s against llm.c's there (issue 37: at least 0.85x). Use --precision bf16 for
GPT-2 against llm.c: it applies to ours and PyTorch alike.

--device cpu --gpt-config tiny tries the GPT-2 path on a CPU build, with a stand-in for llm.c
(tests/peer_scripts.py).
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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpt_peers  # noqa: E402  llm.c's command, token files, output and nvidia-smi's memory
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
            cmd = [os.path.join(a.build_dir, "bin", "gpt_train"), "--config", a.gpt_config, "--seq-len", str(a.seq_len),
                   "--steps", str(a.steps + 1), "--tf32", "on" if a.tf32 == "on" else "off"]
        else:
            cmd = [os.path.join(a.build_dir, "bin", "vgg_ckpt"), "--model", model, "--image-size", str(a.image_size),
                   "--width-div", str(a.width_div), "--steps", str(a.steps + 1), "--tf32", a.tf32]
        cmd += ["--device", a.device, "--batch-size", str(batch), "--json", js]
        if a.precision != "fp32":
            cmd += ["--precision", a.precision]
        if plan.startswith("joint="):
            cmd += ["--memory-budget", plan.split("=", 1)[1]]
        elif plan == "blocks":  # GPT: every block its own segment (units: embeddings, the blocks, ln_f, head)
            layers = gpt_peers.CONFIGS[a.gpt_config][2]
            cmd += ["--checkpoint", " ".join(f"[{i},{i + 1})" for i in range(1, layers + 1))]
        else:
            cmd += ["--checkpoint", plan]
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

    def search(self, run, used, room, label):
        """The largest batch that trains: runs at b and 2b (--ours-start), whose bytes used(record)
        are linear in the batch, give the batch predicted to fit `room`; one run there and one 3%
        above. Where the prediction does not train, a second fit from a run at half of it, then a
        bisection, to 3%. run(batch) -> (ok, the record or [why])."""
        b0 = self.a.ours_start
        ok1, r1 = run(b0)
        ok2, r2 = run(2 * b0)
        if not (ok1 and ok2):
            return {"error": f"the runs at {b0} and {2 * b0} failed: {(r1 if not ok1 else r2)[-1]}"}
        per_sample = (used(r2) - used(r1)) / b0
        fixed = used(r1) - per_sample * b0
        b = max(1, int((room - fixed) / per_sample)) if per_sample > 0 else 2 * b0
        log(f"{label}: fixed {fixed / 2**20:.0f} MiB, {per_sample / 2**20:.2f} MiB per sample: batch {b} "
            f"predicted to fit {room / 2**20:.0f} MiB")
        probes = []

        def probe(batch):
            ok, r = run(batch)
            probes.append({"batch": batch, "ok": ok, **({} if ok else {"why": r[-1]})})
            return ok, r
        ok, r = probe(b)  # the prediction
        ok_above = False
        if ok:
            best = (b, r)
            ok_above, _ = probe(int(math.ceil(b * 1.03)) + 1)  # and one 3% above, which must not train as asked
        else:
            lo, hi, best = 2 * b0, b, (2 * b0, r2)
            # The small runs' bytes that do not grow with the batch (per-thread scratch, workspaces)
            # make the first fit too flat: fit again from a run at half the prediction, try that
            # fit's batch, then step up by the search's resolution (3%) a few times while it trains;
            # a bisection finishes what is left. VGG16/16 at 32x32 under 24 MiB on the CPU, runs
            # after the first failed prediction: plan sqrt 6 -> 4, plan none 6 -> 4.
            mid = max(lo + 1, b // 2)
            if mid < hi:
                ok_mid, r_mid = probe(mid)
                if not ok_mid:
                    hi = mid
                else:
                    lo, best = mid, (mid, r_mid)
                    per = (used(r_mid) - used(r2)) / (mid - 2 * b0)
                    guess = int((room - (used(r_mid) - per * mid)) / per) if per > 0 else hi
                    for _ in range(3):
                        if not lo < guess < hi:
                            break
                        ok_g, r_g = probe(guess)
                        if not ok_g:
                            hi = guess
                            break
                        lo, best = guess, (guess, r_g)
                        guess = lo + max(1, int(0.03 * lo))
            while hi - lo > max(1, int(0.03 * lo)):
                mid = (lo + hi) // 2
                ok, r = probe(mid)
                if ok:
                    lo, best = mid, (mid, r)
                else:
                    hi = mid
        return {"predicted_max_batch": b, "fixed_bytes": fixed, "bytes_per_sample": per_sample, "probes": probes,
                "above_also_trained": ok_above, "best": best}

    def ours_search(self, model, plan, cap):
        found = self.search(lambda b: self.ours_run(model, b, plan, cap), self.peak_of,
                            (cap or self.total or 0) * self.a.room, f"ours {model} {plan}")
        rec = {"framework": "libminigrad", "workload": model, "plan": plan, "memory_cap_bytes": cap or self.total}
        best = found.pop("best", None)
        rec.update(found)
        if best:
            j = best[1]
            med = j["median_step_ms"] / 1000
            rec.update(max_batch=best[0], median_step_s=med, peak_bytes=self.peak_of(j), samples_per_s=best[0] / med)
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
        return rec

    # ---- llm.c (GPT-2 only) --------------------------------------------------------------------
    def llmc_run(self, batch, recompute, cap):
        """(ok, {median_step_s, used_bytes, ...} or [why])."""
        a, skip = self.a, 2
        exe = os.path.join(a.llmc, "train_gpt2cu")
        if not os.path.exists(exe):
            return False, [f"{exe} not found (bash ../shared/peers/llm.c/build.sh DIR)"]
        tmp = tempfile.mkdtemp(prefix="memrec_llmc_")
        train, val = os.path.join(tmp, "train.bin"), os.path.join(tmp, "val.bin")
        gpt_peers.write_tokens(train, (a.steps + skip + 2) * batch * a.seq_len + 1, 1)
        gpt_peers.write_tokens(val, batch * a.seq_len + 1, 2)
        cmd = gpt_peers.llmc_bf16_cmd(exe, train, val, batch, a.seq_len, a.steps + skip, recompute)
        try:
            with gpt_peers.MemSampler() as mem:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
            out = p.stdout + p.stderr
            if p.returncode != 0:
                return False, [f"exit {p.returncode}: " + (out.strip().splitlines() or ["?"])[-1][:200]]
            if "cudaMallocManaged" in out:  # it ran, but from host memory
                return False, ["fell back to cudaMallocManaged: does not fit the device"]
            r = gpt_peers.parse_llmc(out, "bf16", skip)
            r["used_bytes"] = max(r.get("peak_bytes") or 0, mem.used() or 0)
            if cap and r["used_bytes"] > cap:
                return False, [f"used {r['used_bytes'] / 2**20:.0f} MiB, over the cap"]
            return True, r
        except subprocess.TimeoutExpired:
            return False, ["timed out"]
        except ValueError as e:
            return False, [f"could not read its output: {e}"]
        finally:
            for f in os.listdir(tmp):
                os.unlink(os.path.join(tmp, f))
            os.rmdir(tmp)

    def llmc_search(self, recompute, cap):
        plan = f"-r {recompute}"
        # Under a cap a run fits when its bytes do (llmc_run): the whole cap is the room.
        room = cap or (self.total or 0) * self.a.room
        found = self.search(lambda b: self.llmc_run(b, recompute, cap), lambda r: r["used_bytes"], room, f"llm.c {plan}")
        rec = {"framework": "llm.c", "workload": "gpt2", "plan": plan, "memory_cap_bytes": cap or self.total}
        best = found.pop("best", None)
        rec.update(found)
        if not best:
            self.emit(rec)
            return None
        b, r = best
        rec.update(max_batch=b, median_step_s=r["median_step_s"], peak_bytes=r["used_bytes"],
                   samples_per_s=b / r["median_step_s"], tokens_per_s=b * self.a.seq_len / r["median_step_s"])
        self.emit(rec)
        return rec

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
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="PyTorch's and ours")
    ap.add_argument("--gpt-config", choices=sorted(gpt_peers.CONFIGS), default="gpt2",
                    help="ours' GPT (tiny: a CPU try; PyTorch and llm.c run GPT-2 124M only)")
    ap.add_argument("--llmc", default=None, help="llm.c's build (train_gpt2cu): GPT-2 against it too")
    ap.add_argument("--llmc-recompute", default="0,1,2", help="llm.c's -r levels")
    ap.add_argument("--ours-plans", default="none,sqrt", help="ours' plans searched (GPT-2 adds blocks)")
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
    if a.llmc and "llm.c" not in fws:
        fws.append("llm.c")
    for model in [m for m in a.models.split(",") if m]:
        for cap in [parse_cap(c) for c in a.caps.split(",") if c]:
            torch_max, llmc_r2 = None, None
            if "pytorch" in fws:
                torch_max = r.torch_search(model, "none", cap)
                r.torch_search(model, "segments=2", cap)
            if "llm.c" in fws and model == "gpt2":
                for level in [int(x) for x in a.llmc_recompute.split(",") if x]:
                    got = r.llmc_search(level, cap)
                    if level == 2 and got:
                        llmc_r2 = got
            if "libminigrad" in fws:
                plans = [p for p in a.ours_plans.split(",") if p]
                for plan in plans + (["blocks"] if model == "gpt2" and "blocks" not in plans else []):
                    r.ours_search(model, plan, cap)
                joint = 2 * (torch_max or 64)
                if llmc_r2:  # issue 37: at least 1.5x llm.c's largest batch at -r 2
                    joint = max(joint, int(math.ceil(1.5 * llmc_r2["max_batch"])))
                got = r.ours_joint(model, joint, cap)
                if llmc_r2 and got and got.get("samples_per_s"):
                    print(f"{model} under {(cap or r.total) / 2**20:.0f} MiB: the joint planner trains "
                          f"{got['max_batch']} ({got['max_batch'] / llmc_r2['max_batch']:.2f}x llm.c -r 2's largest, "
                          f"{llmc_r2['max_batch']}) at {got['samples_per_s'] / llmc_r2['samples_per_s']:.2f}x its tokens/s")
    if a.png and r.rows:
        plot(r.rows, a.png)
    for row in r.rows:
        print(json.dumps({k: row.get(k) for k in ("framework", "workload", "plan", "memory_cap_bytes", "max_batch",
                                                  "median_step_s", "peak_bytes", "error")}))


if __name__ == "__main__":
    main()
