#!/usr/bin/env python3
"""The joint planner against a sweep of memory budgets (issue 12): scaled VGG16 on one device,
effective batch B, budgets from just above the smallest any plan needs up to the plain step's
peak.

    /usr/bin/python3 bench/joint_sweep.py --out bench/results/joint_sweep

For each budget X it runs
  joint  build/bin/vgg_ckpt --memory-budget X --memory-limit X ...  (the allocator capped at X:
         a plan that passed its budget would fail with out-of-memory, not just report it)
  fixed  build/bin/vgg_ckpt --checkpoint budget=X' ...  (micro-batch fixed at B, the same usable
         budget X' = X less the joint planner's headroom of 1/64), where some plan at B fits
         (segments in tiles included: "[0,10)/1" runs layers 0-9 one sample at a time)
and once the plain reference (--checkpoint none, batch B, no cap). Every run trains --steps
steps from the same seed on the same samples; the joint run's final weights are compared with
the reference's (max |w - w_ref| / max |w_ref|). Writes runs.jsonl, table.md and plot.svg
(predicted and measured peak, predicted and measured step time, against the budget) to --out.
Runs one at a time; the machine should be otherwise idle (timings).
"""
import argparse
import array
import json
import math
import os
import re
import struct
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADROOM = 1.0 / 64  # TrainPlanOptions::headroom's default


def load_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", (path, name, t["dtype"])
        b, e = t["data_offsets"]
        out[name] = array.array("f", data[b:e])  # little-endian float32, as on every machine we run
    return out


def run(app, args, json_path):
    cmd = [app] + args + ["--json", json_path]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return None, p.stdout + p.stderr, " ".join(cmd)
    with open(json_path) as f:
        return json.load(f), p.stdout, " ".join(cmd)


def rel_diff(a_dir, b_dir):
    a, b = load_safetensors(os.path.join(a_dir, "final.safetensors")), load_safetensors(os.path.join(b_dir, "final.safetensors"))
    assert a.keys() == b.keys()
    worst = max(max((abs(x - y) for x, y in zip(a[k], b[k])), default=0.0) for k in a)
    scale = max(max((abs(y) for y in b[k]), default=0.0) for k in b)
    return worst / scale


def svg_plot(rows, path):
    """Two panels: peaks (MiB) and step times (s) against the budget (MiB), as plain SVG."""
    W, H, M = 900, 380, 60
    budgets = [r["budget"] / 2**20 for r in rows]
    x0, x1 = min(budgets) * 0.95, max(budgets) * 1.02

    def panel(ox, title, series, ylabel):
        vals = [v for _, pts, _, _ in series for v in pts if v is not None]
        y0, y1 = 0, max(vals) * 1.1
        pw, ph = W / 2 - M - 20, H - 2 * M
        sx = lambda x: ox + M + (x - x0) / (x1 - x0) * pw
        sy = lambda y: M + ph - (y - y0) / (y1 - y0) * ph
        out = [f'<text x="{ox + M + pw / 2}" y="{M - 25}" text-anchor="middle" font-size="14">{title}</text>',
               f'<rect x="{ox + M}" y="{M}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>',
               f'<text x="{ox + M + pw / 2}" y="{H - 15}" text-anchor="middle" font-size="12">budget (MiB)</text>',
               f'<text x="{ox + 15}" y="{M + ph / 2}" text-anchor="middle" font-size="12" transform="rotate(-90 {ox + 15} {M + ph / 2})">{ylabel}</text>']
        for k in range(6):
            xv = x0 + (x1 - x0) * k / 5
            yv = y0 + (y1 - y0) * k / 5
            out.append(f'<text x="{sx(xv)}" y="{M + ph + 15}" text-anchor="middle" font-size="10">{xv:.0f}</text>')
            out.append(f'<text x="{ox + M - 5}" y="{sy(yv) + 3}" text-anchor="end" font-size="10">{yv:.3g}</text>')
        for li, (name, pts, color, dash) in enumerate(series):
            xy = [(sx(b), sy(v)) for b, v in zip(budgets, pts) if v is not None]
            if xy:
                d = " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)
                out.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>')
                out += [f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}"/>' for x, y in xy]
            out.append(f'<text x="{ox + M + 10}" y="{M + 15 + 14 * li}" font-size="11" fill="{color}">{name}</text>')
        return out

    peaks = [("budget", budgets, "#999", "2,3"),
             ("joint: predicted peak", [r["joint_predicted_peak"] / 2**20 for r in rows], "#1f77b4", "5,3"),
             ("joint: measured peak", [r["joint_measured_peak"] / 2**20 for r in rows], "#1f77b4", "")]
    times = [("joint: predicted step", [r["joint_predicted_ms"] / 1e3 for r in rows], "#d62728", "5,3"),
             ("joint: measured step", [r["joint_median_ms"] / 1e3 for r in rows], "#d62728", ""),
             ("batch fixed at B: measured step", [r["fixed_median_ms"] / 1e3 if r["fixed_median_ms"] else None for r in rows],
              "#2ca02c", "")]
    body = panel(0, "peak memory in use", peaks, "MiB") + panel(W / 2, "time per optimizer step", times, "s")
    with open(path, "w") as f:
        f.write(f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif">\n'
                f'<rect width="{W}" height="{H}" fill="white"/>\n' + "\n".join(body) + "\n</svg>\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench/results/joint_sweep"))
    ap.add_argument("--app", default=os.path.join(ROOT, "build/bin/vgg_ckpt"))
    ap.add_argument("--width-div", type=int, default=8)
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batch", type=int, default=32, help="the effective batch B")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--budgets", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lo-factor", type=float, default=1.12, help="the lowest budget: this times the smallest feasible peak, plus the headroom")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    common = ["--width-div", str(a.width_div), "--image-size", str(a.image_size), "--batch-size", str(a.batch),
              "--seed", str(a.seed), "--steps", str(a.steps)]
    log = open(os.path.join(a.out, "runs.jsonl"), "w")

    ref_dir = os.path.join(a.out, "w_ref")
    ref, out, cmd = run(a.app, common + ["--checkpoint", "none", "--save-dir", ref_dir], os.path.join(a.out, "ref.json"))
    if ref is None:
        sys.exit(f"reference run failed: {cmd}\n{out}")
    log.write(json.dumps({"run": "reference", "cmd": cmd, **ref}) + "\n")
    top = ref["peak_in_use_bytes"]
    # The least any plan needs: from the joint planner's refusal of a budget of 1 kB.
    _, out, _ = run(a.app, common + ["--memory-budget", "1kB"], os.path.join(a.out, "floor.json"))
    m = re.search(r"the least any plan needs is [^(]*\((\d+) bytes\)", out) or re.search(r"the least any plan needs is ([\d.]+) (KiB|MiB|GiB)", out)
    if m is None:
        sys.exit("could not read the smallest feasible peak from:\n" + out)
    floor = int(m.group(1)) if len(m.groups()) == 1 else int(float(m.group(1)) * {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}[m.group(2)])
    # The lowest budget starts a little above the floor: measuring micro-batch 1 (under the cap,
    # as every joint run does) holds a little more than the floor plan's step (docs/checkpointing.md).
    lo, hi = floor * a.lo_factor / (1 - HEADROOM), top * 1.02 / (1 - HEADROOM)
    budgets = [int(lo * (hi / lo) ** (k / (a.budgets - 1))) for k in range(a.budgets)]
    print(f"reference (batch {a.batch}, no checkpointing): peak {top / 2**20:.2f} MiB, median step {ref['median_step_ms']:.0f} ms")
    print(f"smallest feasible peak {floor / 2**20:.2f} MiB; budgets {', '.join(f'{b / 2**20:.1f}' for b in budgets)} MiB")

    rows = []
    for X in budgets:
        jdir = os.path.join(a.out, f"w_{X}")
        j, out, jcmd = run(a.app, common + ["--memory-budget", str(X), "--memory-limit", str(X), "--save-dir", jdir],
                           os.path.join(a.out, f"joint_{X}.json"))
        if j is None:
            sys.exit(f"joint run failed at budget {X}: {jcmd}\n{out}")
        log.write(json.dumps({"run": "joint", "cmd": jcmd, **j}) + "\n")
        usable = X - int(X * HEADROOM)
        f, fout, fcmd = run(a.app, common + ["--checkpoint", f"budget={usable}"], os.path.join(a.out, f"fixed_{X}.json"))
        log.write(json.dumps({"run": "fixed", "cmd": fcmd, **(f or {"error": fout[-400:]})}) + "\n")
        r = {"budget": X, "micro_batch": j["micro_batch"], "accumulation": j["accumulation"],
             "last_micro_batch": j["last_micro_batch"], "segments": j["segments"],
             "joint_predicted_peak": j["predicted_peak_bytes"], "joint_measured_peak": j["peak_in_use_bytes"],
             "joint_predicted_ms": j["predicted_step_ms"], "joint_median_ms": j["median_step_ms"],
             "weights_rel_diff": rel_diff(jdir, ref_dir),
             "fixed_segments": f["segments"] if f else None, "fixed_measured_peak": f["peak_in_use_bytes"] if f else None,
             "fixed_median_ms": f["median_step_ms"] if f else None}
        rows.append(r)
        print(f"budget {X / 2**20:7.2f} MiB: b {r['micro_batch']:>2} x {r['accumulation']:>2}, {len(r['segments'])} segments; "
              f"peak {r['joint_measured_peak'] / 2**20:.2f} (predicted {r['joint_predicted_peak'] / 2**20:.2f}); step "
              f"{r['joint_median_ms']:.0f} ms (predicted {r['joint_predicted_ms']:.0f}); weights {r['weights_rel_diff']:.2e}; "
              f"fixed b={a.batch}: " + (f"{r['fixed_median_ms']:.0f} ms" if f else "does not fit"), flush=True)

    with open(os.path.join(a.out, "table.md"), "w") as t:
        t.write(f"VGG16 width/{a.width_div}, {a.image_size}x{a.image_size}, effective batch {a.batch}, {a.steps} steps, seed {a.seed}. "
                f"Reference (batch {a.batch}, no checkpointing): peak {top / 2**20:.2f} MiB, median step {ref['median_step_ms']:.0f} ms. "
                f"Smallest feasible peak (micro-batch 1, plan `min`): {floor / 2**20:.2f} MiB.\n\n")
        t.write("| budget MiB | joint plan: b x N | checkpointed ranges | predicted peak MiB | measured peak MiB | "
                "predicted step ms | measured step ms | measured / predicted | weights vs reference | "
                f"batch fixed at {a.batch}: ranges | step ms |\n|" + "---|" * 11 + "\n")
        for r in rows:
            ranges = lambda segments: " ".join(f"[{s[0]},{s[1]})" + (f"/{s[2]}" if len(s) > 2 else "") for s in segments) or "-"
            segs = ranges(r["segments"])
            fixed = (f"{ranges(r['fixed_segments'])} | {r['fixed_median_ms']:.0f}" if r["fixed_median_ms"]
                     else "does not fit | -")
            t.write(f"| {r['budget'] / 2**20:.2f} | {r['micro_batch']} x {r['accumulation']} | {segs} | "
                    f"{r['joint_predicted_peak'] / 2**20:.2f} | {r['joint_measured_peak'] / 2**20:.2f} | "
                    f"{r['joint_predicted_ms']:.0f} | {r['joint_median_ms']:.0f} | {r['joint_median_ms'] / r['joint_predicted_ms']:.2f} | "
                    f"{r['weights_rel_diff']:.1e} | {fixed} |\n")
    svg_plot(rows, os.path.join(a.out, "plot.svg"))
    print(f"wrote {a.out}/table.md, plot.svg, runs.jsonl")


if __name__ == "__main__":
    main()
