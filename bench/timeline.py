#!/usr/bin/env python3
"""Where the gradient reductions ran against backward, window by window, from a trace that
`vgg_ckpt --timeline FILE` or `gpt_train --timeline FILE` wrote (Note [reduction timeline] in
include/minigrad/dist/dist.h; data parallel on CUDA, NCCL).

    python3 bench/timeline.py trace.json [--skip 1]

Per optimizer window (the Accumulator's marks on the compute stream cut the trace):
  - buckets: reductions started for the window, and how many began (on NCCL's stream) before
    the last micro-batch's backward ended: those ran beside backward (Note [overlapped reduction]);
  - lead: how long before backward ended the first bucket began;
  - after backward: from backward's end until the compute stream passed step()'s wait, the
    communication the overlap did not hide (plus the window header's small reduction).
A window that ended short starts its buckets at step() ("step starts the buckets"): none overlaps.
With one rank (MG_DIST_WORLD_OF_ONE=1) NCCL has nothing to exchange: the buckets show where the
reductions were placed, not what overlapping them saves; that needs two GPUs or more.
"""
import argparse
import json
import statistics
import sys


def windows(events):
    """The trace's windows: dicts of begins, ends, waited (ms) and buckets [(begin, end, name)]."""
    out = []
    for e in events:
        name, ph = e.get("name", ""), e.get("ph")
        if ph == "M":
            continue
        t = e["ts"] / 1000.0
        if name == "backward begins":
            out.append({"begins": t, "ends": None, "waited": None, "buckets": []})
        elif name == "step starts the buckets":
            out.append({"begins": t, "ends": t, "waited": None, "buckets": [], "short": True})
        elif not out:
            continue  # broadcasts before the first window
        elif name == "backward ends":
            out[-1]["ends"] = t
        elif name == "reductions waited":
            out[-1]["waited"] = t
        elif name.startswith("bucket "):
            out[-1]["buckets"].append((t, t + e.get("dur", 0.0) / 1000.0, name))
    return [w for w in out if w["ends"] is not None and w["waited"] is not None and w["buckets"]]


def bucket_bytes(name):
    # "bucket 3: 2 tensors, 4194304 bytes"
    try:
        return int(name.rsplit(",", 1)[1].split()[0])
    except (IndexError, ValueError):
        return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", help="the --timeline file")
    ap.add_argument("--skip", type=int, default=1, help="leading windows left out of the medians (warm-up)")
    args = ap.parse_args()
    try:
        with open(args.trace) as f:
            events = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        sys.exit(f"timeline.py: {args.trace}: not a trace written by --timeline ({e})")
    ws = windows(events)
    if not ws:
        sys.exit(f"timeline.py: {args.trace}: no window with buckets (was it a data-parallel CUDA run?)")
    print("| window | buckets | MB | began before backward ended | backward (ms) | first bucket's lead (ms) | "
          "after backward (ms) |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for i, w in enumerate(ws):
        b = w["buckets"]
        early = sum(1 for (t0, _, _) in b if t0 < w["ends"])
        lead = max(0.0, w["ends"] - b[0][0])
        after = w["waited"] - w["ends"]
        mb = sum(bucket_bytes(n) for (_, _, n) in b) / 1e6
        rows.append((len(b), early, w["ends"] - w["begins"], lead, after))
        note = " (short window)" if w.get("short") else ""
        print(f"| {i + 1}{note} | {len(b)} | {mb:.1f} | {early} | {w['ends'] - w['begins']:.2f} | {lead:.2f} | "
              f"{after:.2f} |")
    kept = rows[args.skip:] or rows
    med = lambda k: statistics.median(r[k] for r in kept)
    print(f"\nmedian of {len(kept)} windows: {med(1):.0f} of {med(0):.0f} buckets began before backward ended, "
          f"the first {med(3):.2f} ms before; backward {med(2):.2f} ms; {med(4):.2f} ms from backward's end to "
          f"the end of step()'s wait")


if __name__ == "__main__":
    main()
