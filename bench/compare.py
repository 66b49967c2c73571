#!/usr/bin/env python3
"""Runs the benchmark suite (bench/suite.py) for both frameworks, or reads its JSON lines, then
prints ONE markdown table of ratios libminigrad / PyTorch per workload and plan, checks the
issue-6 targets that the figures allow, and draws the memory-versus-time curve of the
checkpoint plans of both frameworks into a PNG.

    /usr/bin/python3 bench/compare.py --device cpu --build-dir build --mlp-repeats 2 \\
        --png bench/results/cpu_plans.png --md bench/results/cpu.md          # runs the suite first
    /usr/bin/python3 bench/compare.py --from bench/results/cpu.jsonl --png cpu_plans.png   # no run
    /usr/bin/python3 bench/compare.py --spread bench/results/cpu.jsonl bench/results/cpu_run2.jsonl  # runs side by side

Every suite flag (--parts, --vgg-steps, --mlp-repeats, --budgets, --tf32, ...) passes through.
Ratios are libminigrad / PyTorch: below 1 is better for libminigrad in time and memory, above 1 in
samples/s. Step times are medians over the timed steps; "min-step ratio" compares the fastest
timed step of each. On CPU PyTorch has no allocator statistics, so memory is compared as the
processes' peak RSS (os.wait4 of each benchmark process), our allocator's peak in use beside it.
"""
import argparse
import json
import os
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import suite  # noqa: E402

MIB = float(1 << 20)


# The apps/vgg_ckpt workloads (--model): chains whose checkpoint plans are compared.
CHAIN_WORKLOADS = ("vgg", "resnet")

def mib(v):
    return "—" if v is None else f"{v / MIB:.1f}"


def ms(v):
    return "—" if v is None else (f"{v * 1e3:.1f}" if v < 10 else f"{v * 1e3:.0f}")


def ratio(a, b, fmt="{:.2f}"):
    if a is None or b is None or b == 0:
        return "—"
    return fmt.format(a / b)


def load(path, since=None):
    recs = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                recs.append(json.loads(line))
    return recs


def pair_up(records):
    """(workload, plan, repeat) -> {"libminigrad": rec, "pytorch": rec}, in first-seen order.
    A later record of the same key replaces an earlier one (re-runs appended to the file)."""
    pairs = OrderedDict()
    for r in records:
        key = (r.get("workload"), r.get("plan"), r.get("repeat", 0))
        pairs.setdefault(key, {})[r.get("framework")] = r
    # PyTorch running one of our plans' segments under another label: pair it with that plan.
    for (w, p, rep), fw in pairs.items():
        t = fw.get("pytorch") or {}
        mirrored = pairs.get((w, t.get("mirrors"), rep), {}).get("libminigrad")
        if "libminigrad" not in fw and mirrored:
            fw["libminigrad"] = mirrored
    return pairs


def floor_record(r):
    """Our plain run of plan none (channels first, float32 or TF32, tiles measured), whose smallest
    feasible peak is the workload's floor: the layout and bf16 variants measure no tiles, and
    their floors are other models' (bench/suite.py)."""
    app = r.get("app") or {}
    return (r.get("framework") == "libminigrad" and r.get("plan") == "none" and bool(app.get("min_feasible_peak_bytes"))
            and r.get("layout", "nchw") == "nchw" and r.get("precision") != "bf16" and app.get("tiles", True))


def plan_label(plan, repeat, repeats):
    if plan and plan.startswith("budget="):
        try:
            plan = f"budget={int(plan.split('=')[1]) / MIB:.1f}MiB"
        except ValueError:
            pass
    return f"{plan} (run {repeat + 1})" if repeats > 1 else plan


def table(records, device):
    pairs = pair_up(records)
    repeats = {}
    for (w, p, rep) in pairs:
        repeats[(w, p)] = max(repeats.get((w, p), 0), rep + 1)
    if device == "cuda":
        head = ["workload", "plan", "ours step ms", "PyTorch step ms", "time ratio", "samples/s ratio",
                "min-step ratio", "ours peak in use MiB", "ours predicted MiB", "PyTorch max_allocated MiB", "in-use ratio",
                "ours peak reserved MiB", "PyTorch max_reserved MiB", "reserved ratio"]
    else:
        head = ["workload", "plan", "ours step ms", "PyTorch step ms", "time ratio", "samples/s ratio",
                "min-step ratio", "ours peak in use MiB (allocator)", "ours predicted MiB", "ours peak RSS MiB",
                "PyTorch peak RSS MiB", "RSS ratio"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
    notes = []
    for (w, p, rep), fw in pairs.items():
        o, t = fw.get("libminigrad", {}), fw.get("pytorch", {})
        for who, r in (("libminigrad", o), ("PyTorch", t)):
            if r.get("error"):
                notes.append(f"- {w} {p}: {who} failed: {r['error'][:300]}")
        if o.get("math_mode_mismatch"):
            notes.append(f"- {w} {p}: math modes differ: {o['math_mode_mismatch']}")
        ot, tt = o.get("median_step_s"), t.get("median_step_s")
        row = [w, plan_label(p, rep, repeats[(w, p)]), ms(ot), ms(tt), ratio(ot, tt),
               ratio(o.get("samples_per_s"), t.get("samples_per_s")), ratio(o.get("min_step_s"), t.get("min_step_s"))]
        if device == "cuda":
            row += [mib(o.get("peak_in_use_bytes")), mib(o.get("predicted_peak_bytes")),
                    mib(t.get("peak_in_use_bytes")), ratio(o.get("peak_in_use_bytes"), t.get("peak_in_use_bytes")),
                    mib(o.get("peak_reserved_bytes")), mib(t.get("peak_reserved_bytes")),
                    ratio(o.get("peak_reserved_bytes"), t.get("peak_reserved_bytes"))]
        else:
            row += [mib(o.get("peak_in_use_bytes")), mib(o.get("predicted_peak_bytes")), mib(o.get("peak_rss_bytes")),
                    mib(t.get("peak_rss_bytes")), ratio(o.get("peak_rss_bytes"), t.get("peak_rss_bytes"))]
        lines.append("| " + " | ".join(row) + " |")
        segs_o, segs_t = o.get("segments"), t.get("segments")
        if (segs_o or segs_t) and p != "none":
            fmt = lambda s: " ".join(f"[{a},{b})" for a, b in s) if s else "none"  # noqa: E731
            notes.append(f"- {w} {plan_label(p, rep, 1)}: checkpointed layers, ours {fmt(segs_o)}; "
                         f"PyTorch {fmt(segs_t)}")
    for r in records:
        app = r.get("app") or {}
        if floor_record(r):
            notes.append(f"- {r['workload']}: the planner's smallest feasible peak is {mib(app['min_feasible_peak_bytes'])} MiB"
                         + (f" (plan {app['min_feasible_plan']})" if app.get("min_feasible_plan") else "")
                         + f"; fixed part (parameters, gradient buffers, optimizer state, targets): {mib(app.get('fixed_bytes'))} MiB")
    if device == "cpu":
        seen = OrderedDict()
        for r in records:
            if r.get("framework") == "pytorch" and r.get("rss_after_setup_bytes"):
                seen.setdefault(r.get("workload"), []).append(r["rss_after_setup_bytes"])
        for w, v in seen.items():
            notes.append(f"- {w}: PyTorch's RSS once set up (libraries, model, optimizer, data; before the first "
                         f"step): {mib(min(v))} to {mib(max(v))} MiB of its peak RSS")
    return lines, notes


def target_checks(records, device):
    """The issue-6 targets these figures speak to, each stated with the numbers it rests on."""
    out = []
    pairs = pair_up(records)
    for (w, p, rep), fw in pairs.items():
        o, t = fw.get("libminigrad", {}), fw.get("pytorch", {})
        if w == "mlp_b64" and o.get("samples_per_s") and t.get("samples_per_s"):
            r = o["samples_per_s"] / t["samples_per_s"]
            goal = 4.0 if device == "cpu" else 1.0
            out.append(f"- MLP batch 64 (run {rep + 1}): {o['samples_per_s']:.0f} vs {t['samples_per_s']:.0f} samples/s, "
                       f"{r:.2f}x PyTorch (target {'>= 4x on CPU' if device == 'cpu' else 'step time well under PyTorch'}): "
                       f"{'met' if r >= goal else 'NOT met'}")
        if p and p.startswith("budget=") and o.get("peak_in_use_bytes"):
            try:
                b = int(p.split("=")[1])
            except ValueError:
                continue
            ok = o["peak_in_use_bytes"] <= b
            out.append(f"- {w} {plan_label(p, rep, 1)}: measured peak in use {mib(o['peak_in_use_bytes'])} MiB "
                       f"{'within' if ok else 'OVER'} the budget {mib(b)} MiB")
    vgg = [(k, v) for k, v in pairs.items() if k[0] and k[0].startswith(CHAIN_WORKLOADS)]
    mem = "peak_in_use_bytes" if device == "cuda" else "peak_rss_bytes"
    for (w, p, rep), fw in vgg:
        if p == "none" and fw.get("libminigrad", {}).get(mem) and fw.get("pytorch", {}).get(mem):
            o, t = fw["libminigrad"][mem], fw["pytorch"][mem]
            out.append(f"- {w} none: our peak {'in use' if device == 'cuda' else 'RSS'} {mib(o)} MiB vs PyTorch "
                       f"{mib(t)} MiB ({o / t:.2f}x; target <= 1x{'' if device == 'cuda' else ', GPU target, RSS shown on CPU'})")
        if p == "none" and device == "cuda":
            o, t = fw.get("libminigrad", {}).get("median_step_s"), fw.get("pytorch", {}).get("median_step_s")
            if o and t:
                out.append(f"- {w} none: step time {o / t:.2f}x PyTorch eager (target <= 1.0x)")
    ours_seg2 = {k[0]: v.get("libminigrad") for k, v in vgg if k[1] == "segments=2"}
    for w, o2 in ours_seg2.items():
        if not o2 or not o2.get("peak_in_use_bytes") or not o2.get("median_step_s"):
            continue
        winners = [p for (w2, p, _), fw in vgg if w2 == w and fw.get("libminigrad", {}).get("plan") == p
                   and (fw["libminigrad"].get("peak_in_use_bytes") or 1e30) < o2["peak_in_use_bytes"]
                   and (fw["libminigrad"].get("median_step_s") or 1e30) < o2["median_step_s"]]
        out.append(f"- {w}: our plans beating PyTorch's split (segments=2) run by libminigrad on both peak in use "
                   f"and step time: {', '.join(plan_label(p, 0, 1) for p in winners) if winners else 'none'}")
    ref = {k[0]: v.get("pytorch") for k, v in vgg if k[1] == "segments=2"}
    for w, t in ref.items():
        if not t or not t.get(mem) or not t.get("median_step_s"):
            continue
        winners = [p for (w2, p, _), fw in vgg if w2 == w and fw.get("libminigrad", {}).get("plan") == p
                   and fw.get("libminigrad", {}).get(mem)
                   and fw["libminigrad"][mem] < t[mem] and fw["libminigrad"].get("median_step_s")
                   and fw["libminigrad"]["median_step_s"] < t["median_step_s"]]
        out.append(f"- {w}: our plans beating PyTorch checkpoint_sequential(..., 2) on both "
                   f"{'peak in use' if device == 'cuda' else 'peak RSS'} and step time: "
                   f"{', '.join(plan_label(p, 0, 1) for p in winners) if winners else 'none'}")
    return out


def spread(paths):
    """One row per workload and plan: each run's time ratio and our/PyTorch median step times,
    across several suite runs (files), to show how much the figures move between runs."""
    runs = [pair_up(load(p)) for p in paths]
    keys = OrderedDict()
    for pairs in runs:
        for (w, p, _rep) in pairs:
            keys[(w, p)] = True
    head = ["workload", "plan"] + [f"run {i + 1}: ours / PyTorch ms (ratio)" for i in range(len(runs))] + \
        ["time ratio min..max"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] * len(head)) + "|"]
    for (w, p) in keys:
        cells, ratios = [], []
        for pairs in runs:
            items = [fw for (w2, p2, _), fw in pairs.items() if (w2, p2) == (w, p)]
            txt = []
            for fw in items:
                o, t = fw.get("libminigrad", {}).get("median_step_s"), fw.get("pytorch", {}).get("median_step_s")
                if o and t:
                    ratios.append(o / t)
                    txt.append(f"{ms(o)} / {ms(t)} ({o / t:.2f})")
            cells.append("; ".join(txt) or "—")
        rng = f"{min(ratios):.2f}..{max(ratios):.2f}" if ratios else "—"
        lines.append("| " + " | ".join([w, plan_label(p, 0, 1)] + cells + [rng]) + " |")
    return lines


def short(plan):
    if plan.startswith("budget="):
        try:
            return f"budget {int(plan.split('=')[1]) / MIB:.0f}MiB"
        except ValueError:
            return plan
    return plan.replace("segments=", "seg ")


def plot(records, device, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    vgg = [r for r in records if (r.get("workload") or "").startswith(CHAIN_WORKLOADS) and not r.get("error")
           and r.get("median_step_s")]
    if not vgg:
        print(f"(no VGG16/ResNet records: {path} not drawn)", file=sys.stderr)
        return False
    latest = OrderedDict()
    for r in vgg:
        latest[(r["workload"], r["plan"], r["framework"])] = r
    vgg = list(latest.values())
    second = ("peak_reserved_bytes", "peak reserved (allocator)") if device == "cuda" else \
        ("peak_rss_bytes", "process peak RSS (getrusage via wait4)")
    order = {}
    for r in vgg:
        if r["framework"] == "libminigrad" and (r.get("predicted_peak_bytes") or r.get("peak_in_use_bytes")):
            order[r["plan"]] = (r.get("predicted_peak_bytes") or r["peak_in_use_bytes"]) / MIB
    for r in vgg:
        if r.get("mirrors") in order:
            order.setdefault(r["plan"], order[r["mirrors"]])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    panels = [(axes[0], "peak_in_use_bytes", "peak bytes in use (allocator)"), (axes[1],) + second]
    styles = {"libminigrad": dict(color="tab:blue", marker="o"), "pytorch": dict(color="tab:red", marker="s")}
    for ax, key, title in panels:
        for fw, st in styles.items():
            # The plans in the order of our planner's peak (none down to the leanest plan), the
            # same order in both panels and for both frameworks: a trade-off curve per framework.
            pts = sorted(((r["median_step_s"], r[key] / MIB, r["plan"]) for r in vgg
                          if r["framework"] == fw and r.get(key)), key=lambda p: -order.get(p[2], p[1]))
            if not pts:
                continue
            ax.plot([p[0] for p in pts], [p[1] for p in pts], linestyle="-", alpha=0.8,
                    label="libminigrad" if fw == "libminigrad" else "PyTorch " + ("(max_memory_allocated)"
                                                                                 if key == "peak_in_use_bytes" else ""),
                    **st)
            for x, y, p in pts:
                ax.annotate(short(p), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7, color=st["color"])
        if key == "peak_in_use_bytes":
            pred = sorted((r["median_step_s"], r["predicted_peak_bytes"] / MIB, (r.get(key) or 0) / MIB) for r in vgg
                          if r["framework"] == "libminigrad" and r.get("predicted_peak_bytes"))
            if pred:
                ax.scatter([p[0] for p in pred], [p[1] for p in pred], marker="x", color="tab:green",
                           label="libminigrad predicted (planner)", zorder=3)
                for x, y_pred, y_meas in pred:
                    if y_meas:
                        ax.plot([x, x], [y_pred, y_meas], linestyle=":", color="tab:green", alpha=0.7)
            floors = [r["app"]["min_feasible_peak_bytes"] / MIB for r in vgg if floor_record(r)]
            if floors:
                ax.axhline(floors[-1], linestyle="--", color="gray", linewidth=1,
                           label=f"planner's smallest feasible peak ({floors[-1]:.1f} MiB)")
        ax.set_xlabel("median step time (s)")
        ax.set_ylabel("MiB")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    w = vgg[0]["workload"]
    when = vgg[-1].get("suite_time_utc", "")
    fig.suptitle(f"Checkpoint plans, {w} on {device} — memory vs time ({when})", fontsize=11)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90)
    return True


def main():
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--from", dest="src", default=None, help="read these JSON lines instead of running the suite")
    ap.add_argument("--spread", nargs="+", default=None, metavar="JSONL",
                    help="only print the time ratios of several recorded runs side by side")
    ap.add_argument("--png", default=None, help="where to draw the plans' memory-vs-time curve")
    ap.add_argument("--md", default=None, help="also write the markdown here")
    ap.add_argument("-h", "--help", action="store_true")
    mine, rest = ap.parse_known_args()
    if mine.help:
        print(__doc__)
        suite.parse_args(["--help"])
    if mine.spread:
        print("\n".join(spread(mine.spread)))
        return
    if mine.src:
        records = load(mine.src)
        devices = {r.get("device", "cpu").split(":")[0] for r in records}
        device = "cuda" if devices == {"cuda"} else "cpu"
        source = f"from {mine.src}"
    else:
        args = suite.parse_args(rest)
        records = suite.run_suite(args)
        device = args.device
        source = f"suite run, raw records appended to {args.out}"
    lines, notes = table(records, device)
    gpus = sorted({r["gpu_name"] for r in records if r.get("gpu_name")})
    where = device + (f", {', '.join(gpus)}" if gpus else "")
    md = [f"Ratios libminigrad / PyTorch ({where}; {source}):", ""] + lines
    if notes:
        md += ["", "Notes:"] + notes
    checks = target_checks(records, device)
    if checks:
        md += ["", "Targets (issue 6):"] + checks
    load_avgs = [r["load_avg_1m"] for r in records if r.get("load_avg_1m") is not None]
    if load_avgs:
        md += ["", f"1-minute load average before each run: {min(load_avgs):.1f} to {max(load_avgs):.1f} "
                   f"(other processes shared the machine when above the thread count)."]
    text = "\n".join(md)
    print(text)
    if mine.md:
        with open(mine.md, "w") as f:
            f.write(text + "\n")
    if mine.png:
        if plot(records, device, mine.png):
            print(f"\n(memory-vs-time curve: {mine.png})", file=sys.stderr)


if __name__ == "__main__":
    main()
