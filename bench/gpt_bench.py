#!/usr/bin/env python3
"""GPT-2 training throughput on one device, libminigrad (apps/gpt_train) against PyTorch eager
(bench/reference/gpt_torch.py): the same model, optimizer, clipping and batch, the two run
alternately (never in parallel), --repeats times each. Appends one JSON line per run to --out and
prints a markdown table of tokens/s.

    OMP_NUM_THREADS=2 /usr/bin/python3 bench/gpt_bench.py --build-dir build --config small \
        --batch-size 8 --seq-len 128 --repeats 3 --out bench/results/gpt/cpu_small.jsonl
    python3 bench/gpt_bench.py --device cuda --build-dir build-gpu --config gpt2 --batch-size 4 \
        --seq-len 1024 --steps 10 --repeats 2 --torch-python python3 --sdpa    # GPT-2 124M on a GPU

On CUDA the memory columns are our allocator's peak in use and PyTorch's
torch.cuda.max_memory_allocated over the timed steps. --sdpa gives PyTorch its fused attention
(PyTorch >= 2.0; ours is always fused).

Timed: the median step after the first (ours) / after --warmup untimed steps (PyTorch's); each
step is forward, backward, clipping and the AdamW update of B x T tokens. Data: ours its synthetic
stream, PyTorch random tokens (the speed does not depend on the values).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, env):
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        raise SystemExit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stderr[-2000:]}")
    return p.stdout, time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    ap.add_argument("--config", default="small")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--torch-threads", type=int, default=0,
                    help="torch.set_num_threads (default --threads; Debian's PyTorch runs matmuls in OpenBLAS, "
                         "which threads by itself: 1 may be its faster setting)")
    ap.add_argument("--checkpoint", default="none", help="our plan (PyTorch runs without checkpointing)")
    ap.add_argument("--torch-python", default="/usr/bin/python3")
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--sdpa", action="store_true", help="PyTorch with scaled_dot_product_attention")
    a = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    rows = []
    for r in range(a.repeats):
        fd, js = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        ours_cmd = [os.path.join(a.build_dir, "bin", "gpt_train"), "--config", a.config, "--batch-size", str(a.batch_size),
                    "--seq-len", str(a.seq_len), "--steps", str(a.steps + 1), "--checkpoint", a.checkpoint, "--json", js,
                    "--device", a.device]
        run(ours_cmd, env)
        with open(js) as f:
            ours = json.load(f)
        os.unlink(js)
        out, _ = run([a.torch_python, os.path.join(REPO, "bench/reference/gpt_torch.py"), "--config", a.config,
                      "--batch-size", str(a.batch_size), "--seq-len", str(a.seq_len), "--steps", str(a.steps),
                      "--threads", str(a.torch_threads or a.threads), "--device", a.device]
                     + (["--sdpa"] if a.sdpa else []), env)
        torch_rec = json.loads(out.strip().splitlines()[-1])
        rec = {"repeat": r, "config": a.config, "batch": a.batch_size, "seq_len": a.seq_len, "threads": a.threads,
               "load_avg_1m": os.getloadavg()[0], "ours_tokens_per_s": ours["tokens_per_s"],
               "ours_median_step_ms": ours["median_step_ms"], "ours_peak_in_use_bytes": ours["peak_in_use_bytes"],
               "ours_plan": ours["plan"], "ours_final_loss": ours["losses"][-1],
               "torch_tokens_per_s": torch_rec["tokens_per_s"], "torch_median_step_ms": 1000 * torch_rec["median_step_s"],
               "torch_version": torch_rec["torch_version"], "torch_threads": torch_rec["threads"],
               "params": torch_rec["params"], "device": a.device, "torch_sdpa": a.sdpa,
               "torch_peak_cuda_bytes": torch_rec.get("peak_cuda_bytes")}
        rows.append(rec)
        if a.out:
            os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
            with open(a.out, "a") as f:
                f.write(json.dumps(rec) + "\n")
        print(json.dumps(rec), file=sys.stderr)
    mib = lambda b: f"{b / 2**20:.1f}" if b else "—"
    print(f"| run | ours tokens/s | PyTorch tokens/s | ratio | ours step ms | PyTorch step ms | ours peak MiB | "
          f"PyTorch peak MiB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['repeat'] + 1} | {r['ours_tokens_per_s']:.0f} | {r['torch_tokens_per_s']:.0f} | "
              f"{r['ours_tokens_per_s'] / r['torch_tokens_per_s']:.2f} | {r['ours_median_step_ms']:.1f} | "
              f"{r['torch_median_step_ms']:.1f} | {mib(r['ours_peak_in_use_bytes'])} | "
              f"{mib(r['torch_peak_cuda_bytes'])} |")


if __name__ == "__main__":
    main()
