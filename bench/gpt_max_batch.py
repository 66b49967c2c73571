#!/usr/bin/env python3
"""The largest batch of GPT-2 sequences one device trains, with and without the planner (issue 17):
doubles B from --start until a run fails, for

  pytorch       bench/reference/gpt_torch.py (eager; --sdpa for its fused attention)
  ours none     apps/gpt_train --checkpoint none
  ours min      apps/gpt_train --checkpoint min (the planner's smallest plan)

then runs ours at B = --budget-batch sequences per step under --memory-budget free (the joint
planner picks micro-batch, accumulation and checkpoints for what the device has) and reports its
plan. One JSON line per run to --out, a markdown table on stdout. A run counts as fitting when it
finishes two steps; any failure (out of memory, above all) ends that column.

    python3 bench/gpt_max_batch.py --device cuda --build-dir build-gpu --config gpt2 --seq-len 1024 \\
        --torch-python python3 --sdpa --out gpu-results/gpt_max_batch.jsonl
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def attempt(cmd, timeout):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"timeout after {timeout} s"
    if p.returncode != 0:
        return False, (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1][:300]
    return True, p.stdout


def ours(a, batch, extra):
    fd, js = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    ok, why = attempt([os.path.join(a.build_dir, "bin", "gpt_train"), "--config", a.config, "--device", a.device,
                       "--batch-size", str(batch), "--seq-len", str(a.seq_len), "--steps", "2", "--json", js] + extra,
                      a.timeout)
    rec = {}
    if ok:
        with open(js) as f:
            rec = json.load(f)
    os.unlink(js)
    return ok, why, rec


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--config", default="gpt2")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--start", type=int, default=4)
    ap.add_argument("--max", type=int, default=1024)
    ap.add_argument("--budget-batch", type=int, default=512)
    ap.add_argument("--timeout", type=int, default=240, help="seconds per run")
    ap.add_argument("--torch-python", default="python3")
    ap.add_argument("--sdpa", action="store_true")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    records = []

    def emit(rec):
        records.append(rec)
        print(json.dumps(rec), file=sys.stderr, flush=True)
        if a.out:
            os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
            with open(a.out, "a") as f:
                f.write(json.dumps(rec) + "\n")

    largest = {}
    for who in ("pytorch", "ours none", "ours min"):
        b = a.start
        while b <= a.max:
            if who == "pytorch":
                ok, why = attempt([a.torch_python, os.path.join(REPO, "bench/reference/gpt_torch.py"), "--config",
                                   a.config, "--device", a.device, "--batch-size", str(b), "--seq-len", str(a.seq_len),
                                   "--steps", "1", "--warmup", "1"] + (["--sdpa"] if a.sdpa else []), a.timeout)
                rec = {"who": who, "batch": b, "fits": ok}
                if ok:
                    t = json.loads(why.strip().splitlines()[-1])
                    rec.update(tokens_per_s=t["tokens_per_s"], peak_bytes=t.get("peak_cuda_bytes"))
            else:
                ok, why, r = ours(a, b, ["--checkpoint", who.split()[1]])
                rec = {"who": who, "batch": b, "fits": ok}
                if ok:
                    rec.update(tokens_per_s=r["tokens_per_s"], peak_bytes=r["peak_in_use_bytes"], plan=r["plan"])
            if not ok:
                rec["why"] = why
            emit(rec)
            if not ok:
                break
            largest[who] = rec
            b *= 2
    ok, why, r = ours(a, a.budget_batch, ["--memory-budget", "free"])
    rec = {"who": "ours --memory-budget free", "batch": a.budget_batch, "fits": ok}
    if ok:
        rec.update(tokens_per_s=r["tokens_per_s"], peak_bytes=r["peak_in_use_bytes"], plan=r["plan"],
                   micro_batch=r["micro_batch"], accumulation=r["accumulation"])
    else:
        rec["why"] = why
    emit(rec)
    largest[rec["who"]] = rec if ok else None

    print("| run | largest batch that fits | tokens/s there | peak MiB | plan |")
    print("|---|---|---|---|---|")
    for who, r in largest.items():
        if not r:
            print(f"| {who} | none | | | |")
            continue
        plan = r.get("plan", "")
        if "micro_batch" in r:
            plan = f"micro-batch {r['micro_batch']} x {r['accumulation']}, {plan}"
        peak = f"{r['peak_bytes'] / 2**20:.0f}" if r.get("peak_bytes") else "—"
        print(f"| {who} | {r['batch']} | {r['tokens_per_s']:.0f} | {peak} | {plan} |")


if __name__ == "__main__":
    main()
