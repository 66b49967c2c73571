#!/usr/bin/env python3
"""GPT-2 124M on one GPU against its strongest peers (issue 40, item 4): libminigrad
(apps/gpt_train), PyTorch eager (bench/reference/gpt_torch.py, SDPA attention) and llm.c
(train_gpt2cu in bf16 with cuDNN attention, train_gpt2fp32cu in fp32 with TF32 matmuls), one after
another (never side by side), on the same random token files, for each --batches at T = --seq-len.

    python3 bench/gpt_peers.py --build-dir build-gpu --llmc-dir .peers/llmc --batches 4,16 \
        --steps 12 --out $OUT/gpt2_peers.jsonl --md $OUT/gpt2_peers.md

Precisions: ours fp32 (strict), tf32 (gpt_train --tf32 on) and bf16 (--precision bf16: autocast
with float32 masters); PyTorch fp32, tf32 and bf16 (torch.autocast); llm.c bf16 (train_gpt2cu, -r 0:
no recompute) and tf32 (train_gpt2fp32cu turns TF32 on by itself on sm_80 and later: that is the
only way it runs). --ours-variants runs ours again with its fusions (`fused`: --fused-head,
--fused-gelu and --fused-residual on), each a row of its own.

MFU, as llm.c counts it: (6 N + 6 L C T) FLOPs a token (N = 124,439,808, GPT-2 124M's parameters
with the 50,257-token vocabulary, for every framework alike) over the GPU's dense peak for the
precision (PEAK_TFLOPS: NVIDIA's datasheet figures for the H100 SXM and H200; none elsewhere).

--device cpu --config tiny runs ours and PyTorch on the CPU (llm.c is skipped: it is CUDA and
GPT-2 124M only), to try the script end to end without a GPU (tests/peer_scripts.py).

One JSON line per run (issue 40's schema): framework, workload, precision, batch, seq_len, plan,
median_step_s, tokens_per_s, peak_bytes (ours: the allocator's peak in use; PyTorch:
max_memory_allocated; llm.c: what it reports, named in peak_bytes_source), device_used_max_bytes
(nvidia-smi's memory.used sampled every 100 ms during the run, minus what it read before: the same
yardstick for all three, context and library workspaces included), gpu_name, commit (--commit or
$MG_COMMIT), cmd, and error when a run failed (the others go on).

Timing: ours the median of the steps after the first; PyTorch after 2 untimed steps; llm.c the
median of its printed step times after the first 3 (llm.c times each step with a host clock after
a device synchronisation, as the other two do).
"""
import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB, CTX, LAYERS, HEADS, WIDTH = 50257, 1024, 12, 12, 768
# (vocab, context, layers, width) of gpt_train's and gpt_torch.py's --config presets.
CONFIGS = {"tiny": (512, 64, 2, 64), "small": (8192, 256, 4, 128), "gpt2": (VOCAB, CTX, LAYERS, WIDTH)}
# Dense TFLOP/s by precision (NVIDIA's datasheets; the H200 has the H100 SXM's compute).
PEAK_TFLOPS = {"H100": {"bf16": 989.4, "tf32": 494.7, "fp32": 66.9},
               "H200": {"bf16": 989.4, "tf32": 494.7, "fp32": 66.9}}
# Ours run again with these flags where --ours-variants names them.
VARIANTS = {"plain": [], "fused": ["--fused-head", "on", "--fused-gelu", "on", "--fused-residual", "on"]}


def params_of(config):
    """GPT-2's parameter count: tied wte, wpe, 12 C^2 + 13 C per block, ln_f."""
    v, t, layers, c = CONFIGS[config]
    return v * c + t * c + layers * (12 * c * c + 13 * c) + 2 * c


def flops_per_token(config, seq_len):
    _, _, layers, c = CONFIGS[config]
    return 6 * params_of(config) + 6 * layers * c * seq_len


def peak_tflops(gpu, precision):
    for name, table in PEAK_TFLOPS.items():
        if gpu and name in gpu:
            return table.get(precision)
    return None


def log(msg):
    print(f"[gpt_peers {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def write_tokens(path, n, seed, vocab=VOCAB):
    """llm.c's token file: 256 int32 (20240520, 1, count), then count uint16 tokens below vocab."""
    import numpy as np
    rng = np.random.default_rng(seed)
    header = np.zeros(256, dtype=np.int32)
    header[:3] = (20240520, 1, n)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(rng.integers(0, vocab, n, dtype=np.uint16).tobytes())
    os.replace(tmp, path)


LLMC_BF16_STEP = re.compile(r"step\s+(\d+)/\d+ \| loss ([0-9.naif]+) .*\| ([0-9.]+) ms \|")
LLMC_FP32_STEP = re.compile(r"step\s+(\d+)/\d+: train loss ([0-9.naif]+) \(([0-9.]+) ms")


def parse_llmc(out, precision, skip):
    """llm.c's printed steps and memory: the median step (s) after the first `skip`, the last loss,
    and its device memory (what it reports, and where that came from)."""
    pat = LLMC_BF16_STEP if precision == "bf16" else LLMC_FP32_STEP
    steps = [(int(m.group(1)), float(m.group(2)), float(m.group(3))) for m in pat.finditer(out)]
    if len(steps) <= skip:
        raise ValueError(f"{len(steps)} step lines")
    times = sorted(s[2] / 1000 for s in steps[skip:])
    rec = {"median_step_s": statistics.median(times), "final_loss": steps[-1][1], "steps_timed": len(times)}
    rec.update(llmc_memory(out))
    return rec


def llmc_memory(out):
    """llm.c's own account of its device memory: 'device memory usage: N MiB / M MiB' (cudaMemGetInfo
    after its allocations), else the sum of its 'allocated N MiB for ...' lines."""
    m = re.search(r"device memory usage: (\d+) MiB", out)
    if m:
        return {"peak_bytes": int(m.group(1)) << 20,
                "peak_bytes_source": "llm.c 'device memory usage' (cudaMemGetInfo after its allocations)"}
    mib = [int(x) for x in re.findall(r"allocated (\d+) MiB", out)]
    return {"peak_bytes": sum(mib) << 20 if mib else None,
            "peak_bytes_source": "llm.c: the sum of its 'allocated N MiB' lines"}


def llmc_bf16_cmd(exe, train, val, batch, seq_len, steps, recompute=0):
    """train_gpt2cu from scratch (-e d12) in bf16 with cuDNN attention, no evaluation, sampling or
    checkpoints; -r: 0 keeps every activation, 1 recomputes GELU, 2 also LayerNorm."""
    # No -o: with -o "" (../shared/peers/README.md's example) it stops before its first step,
    # "could not create directory: " (H200, 2026-11-27).
    return [exe, "-i", train, "-j", val, "-e", "d12", "-b", str(batch), "-t", str(seq_len), "-d", str(batch * seq_len),
            "-x", str(steps), "-v", "0", "-s", "0", "-h", "0", "-r", str(recompute), "-z", "0", "-f", "1", "-l", "3e-4",
            "-u", "0"]


def write_llmc_checkpoint(path, seed):
    """A random GPT-2 124M in llm.c's fp32 checkpoint format (header 20240326, version 3), which
    train_gpt2fp32cu needs (it cannot start from scratch). The values follow GPT-2's initialisation
    scale; the speed does not depend on them."""
    import numpy as np
    vp = 50304
    sizes = [vp * WIDTH, CTX * WIDTH, LAYERS * WIDTH, LAYERS * WIDTH, LAYERS * 3 * WIDTH * WIDTH, LAYERS * 3 * WIDTH,
             LAYERS * WIDTH * WIDTH, LAYERS * WIDTH, LAYERS * WIDTH, LAYERS * WIDTH, LAYERS * 4 * WIDTH * WIDTH,
             LAYERS * 4 * WIDTH, LAYERS * WIDTH * 4 * WIDTH, LAYERS * WIDTH, WIDTH, WIDTH]
    rng = np.random.default_rng(seed)
    header = np.zeros(256, dtype=np.int32)
    header[:8] = (20240326, 3, CTX, VOCAB, LAYERS, HEADS, WIDTH, vp)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        for i, n in enumerate(sizes):
            if i in (2, 8, 14):  # LayerNorm weights
                f.write(np.ones(n, dtype=np.float32).tobytes())
            elif i in (3, 5, 7, 9, 11, 13, 15):  # biases
                f.write(np.zeros(n, dtype=np.float32).tobytes())
            else:
                f.write((rng.standard_normal(n, dtype=np.float32) * 0.02).tobytes())
    os.replace(tmp, path)


class MemSampler:
    """nvidia-smi's memory.used (MiB) every 100 ms while a run lasts; the most it saw."""

    def __init__(self):
        self.peak = None
        self.base = self.read()

    @staticmethod
    def read():
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                                 capture_output=True, text=True, timeout=10).stdout
            return int(out.strip().splitlines()[0]) << 20
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            return None

    def __enter__(self):
        self.stop = threading.Event()
        self.t = threading.Thread(target=self.loop, daemon=True)
        self.t.start()
        return self

    def loop(self):
        while not self.stop.is_set():
            v = self.read()
            if v is not None:
                self.peak = v if self.peak is None else max(self.peak, v)
            self.stop.wait(0.1)

    def __exit__(self, *exc):
        self.stop.set()
        self.t.join()

    def used(self):
        if self.peak is None:
            return None
        return self.peak - (self.base or 0)


def mib(b):
    return f"{b / 2**20:.0f}" if b else "—"


def gpu_name():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


class Runner:
    def __init__(self, a):
        self.a = a
        self.out = open(a.out, "a") if a.out else None
        self.rows = []
        self.gpu = gpu_name() if a.device == "cuda" else None
        self.common = {"workload": "gpt2_124m" if a.config == "gpt2" else f"gpt_{a.config}", "seq_len": a.seq_len,
                       "device": a.device, "gpu_name": self.gpu, "commit": a.commit or os.environ.get("MG_COMMIT")}

    def emit(self, rec):
        rec = dict(self.common, **rec)
        rec["time_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.rows.append(rec)
        if self.out:
            self.out.write(json.dumps(rec) + "\n")
            self.out.flush()
        log(json.dumps({k: rec.get(k) for k in ("framework", "precision", "batch", "median_step_s", "tokens_per_s",
                                                "peak_bytes", "device_used_max_bytes", "error") if rec.get(k) is not None}))

    def run(self, base, cmd, parse, cwd=None):
        log("run: " + " ".join(shlex.quote(c) for c in cmd))
        t0 = time.time()
        with MemSampler() as mem:
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=self.a.timeout, cwd=cwd)
                rc, out, err = p.returncode, p.stdout, p.stderr
            except OSError as e:
                rc, out, err = 127, "", str(e)
            except subprocess.TimeoutExpired as e:
                rc, out, err = 124, (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), "timed out"
        rec = dict(base, cmd=" ".join(shlex.quote(c) for c in cmd), wall_s=time.time() - t0,
                   device_used_max_bytes=mem.used())
        if self.a.logs:
            name = f"{base['framework']}_{base['precision']}_b{base['batch']}.log"
            with open(os.path.join(self.a.logs, name), "w") as f:
                f.write(out + "\n--- stderr ---\n" + err)
        if rc != 0:
            rec["error"] = f"exit {rc}: {(err.strip() or out.strip())[-600:]}"
        else:
            try:
                rec.update(parse(out))
            except Exception as e:  # reported, not fatal
                rec["error"] = f"could not parse: {e}: {out.strip()[-400:]}"
        if rec.get("median_step_s"):
            rec["tokens_per_s"] = base["batch"] * self.a.seq_len / rec["median_step_s"]
            peak = peak_tflops(self.gpu, base["precision"])
            if peak:
                rec["mfu"] = rec["tokens_per_s"] * flops_per_token(self.a.config, self.a.seq_len) / (peak * 1e12)
        self.emit(rec)

    def ours(self, batch, precision, variant="plain"):
        fd, js = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        cmd = [os.path.join(self.a.build_dir, "bin", "gpt_train"), "--device", self.a.device, "--config", self.a.config,
               "--batch-size", str(batch), "--seq-len", str(self.a.seq_len), "--steps", str(self.a.steps + 1),
               "--data", self.train_file, "--tf32", "on" if precision == "tf32" else "off", "--json", js]
        cmd += ["--precision", "bf16"] if precision == "bf16" else []
        cmd += VARIANTS[variant]

        def parse(_out):
            with open(js) as f:
                j = json.load(f)
            times = sorted(t / 1000 for t in j["step_ms"][1:])
            return {"median_step_s": statistics.median(times), "peak_bytes": j["peak_in_use_bytes"],
                    "peak_bytes_source": "libminigrad allocator peak in use", "final_loss": j["losses"][-1],
                    "losses": j["losses"]}
        base = {"framework": "libminigrad", "precision": precision, "batch": batch, "plan": "none"}
        if variant != "plain":
            base["variant"] = variant
        try:
            self.run(base, cmd, parse)
        finally:
            os.unlink(js)

    def torch(self, batch, precision):
        cmd = [self.a.torch_python, os.path.join(REPO, "bench/reference/gpt_torch.py"), "--config", self.a.config,
               "--batch-size", str(batch), "--seq-len", str(self.a.seq_len), "--steps", str(self.a.steps),
               "--device", self.a.device] + (["--sdpa"] if self.a.device == "cuda" else [])  # 1.13 on CPUs has none
        if precision == "tf32":
            cmd += ["--tf32"]
        if precision == "bf16":
            cmd += ["--precision", "bf16"]

        def parse(out):
            j = json.loads(out.strip().splitlines()[-1])
            return {"median_step_s": j["median_step_s"], "peak_bytes": j["peak_cuda_bytes"],
                    "peak_bytes_source": "torch.cuda.max_memory_allocated", "final_loss": j["final_loss"],
                    "torch_version": j["torch_version"]}
        self.run({"framework": "pytorch", "precision": precision, "batch": batch, "plan": "none"}, cmd, parse)

    def llmc(self, batch, precision):
        skip = 3
        base = {"framework": "llm.c", "precision": precision, "batch": batch, "plan": "none"}
        if self.a.device != "cuda" or self.a.config != "gpt2":
            return self.emit(dict(base, error="llm.c runs GPT-2 124M on CUDA only (--device cuda --config gpt2)"))
        if precision == "bf16":
            exe = os.path.join(self.a.llmc_dir, "train_gpt2cu")
            cmd = llmc_bf16_cmd(exe, self.train_file, self.val_file, batch, self.a.seq_len, self.a.steps + skip)
            cwd = None
        else:
            exe = os.path.join(self.a.llmc_dir, "train_gpt2fp32cu")
            # It trains one epoch of the training file: size it to steps + skip windows.
            train = os.path.join(self.tmp, f"llmc_fp32_b{batch}.bin")
            write_tokens(train, (self.a.steps + skip) * batch * self.a.seq_len + 1, 11)
            cmd = [exe, "-i", train, "-j", self.val_file, "-b", str(batch), "-t", str(self.a.seq_len),
                   "-v", "100000", "-m", "1", "-s", "100000", "-g", "1", "-l", "3e-4"]
            cwd = self.tmp  # it reads gpt2_124M.bin from the working directory
        if not os.path.exists(exe):
            return self.emit(dict(base, error=f"{exe} not found (bash ../shared/peers/llm.c/build.sh {self.a.llmc_dir})"))
        self.run(base, cmd, lambda out: parse_llmc(out, precision, skip), cwd=cwd)

    def all(self):
        a = self.a
        self.tmp = tempfile.mkdtemp(prefix="gpt_peers_")
        self.train_file = os.path.join(self.tmp, "train.bin")
        self.val_file = os.path.join(self.tmp, "val.bin")
        biggest = max(a.batches) * a.seq_len
        vocab = CONFIGS[a.config][0]
        write_tokens(self.train_file, (a.steps + 8) * biggest + 1, 1, vocab)
        write_tokens(self.val_file, biggest + 1, 2, vocab)
        if "llm.c" in a.frameworks and "tf32" in a.llmc_precisions and a.config == "gpt2" and a.device == "cuda":
            write_llmc_checkpoint(os.path.join(self.tmp, "gpt2_124M.bin"), 3)
        for batch in a.batches:
            for fw in a.frameworks:
                if fw == "libminigrad":
                    for p in a.ours_precisions:
                        for v in a.ours_variants:
                            self.ours(batch, p, v)
                elif fw == "pytorch":
                    for p in a.torch_precisions:
                        self.torch(batch, p)
                elif fw == "llm.c":
                    for p in a.llmc_precisions:
                        self.llmc(batch, p)

    def table(self):
        lines = ["| framework | precision | batch | step ms | tokens/s | MFU | peak (own) MiB | device used MiB | final loss |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for r in self.rows:
            who = r["framework"] + (f" ({r['variant']})" if r.get("variant") else "")
            if r.get("error"):
                lines.append(f"| {who} | {r['precision']} | {r['batch']} | error: "
                             f"{r['error'][:120].replace('|', '/').replace(chr(10), ' ')} | | | | | |")
                continue
            mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "—"
            lines.append(f"| {who} | {r['precision']} | {r['batch']} | {1000 * r['median_step_s']:.1f} | "
                         f"{r['tokens_per_s']:.0f} | {mfu} | {mib(r.get('peak_bytes'))} | {mib(r.get('device_used_max_bytes'))} | "
                         f"{r.get('final_loss', float('nan')):.3f} |")
        return "\n".join(lines)

    def ratios(self):
        """Issue 37's targets at each batch: ours over llm.c and over PyTorch in bf16 (tokens/s), ours
        over PyTorch in fp32, ours TF32 over llm.c's TF32 path; our best variant where several ran."""
        lines = []
        ok = [r for r in self.rows if not r.get("error") and r.get("tokens_per_s")]
        for batch in sorted({r["batch"] for r in ok}):
            def best(fw, p):
                rs = [r for r in ok if r["batch"] == batch and r["framework"] == fw and r["precision"] == p]
                return max(rs, key=lambda r: r["tokens_per_s"]) if rs else None
            for p, peer, p2 in (("bf16", "llm.c", "bf16"), ("bf16", "pytorch", "bf16"), ("fp32", "pytorch", "fp32"),
                                ("tf32", "llm.c", "tf32")):
                o, q = best("libminigrad", p), best(peer, p2)
                if o and q:
                    v = f" ({o['variant']})" if o.get("variant") else ""
                    lines.append(f"B {batch}: ours {p}{v} / {peer} {p2}: {o['tokens_per_s'] / q['tokens_per_s']:.2f}x "
                                 f"tokens/s, peak {mib(o.get('peak_bytes'))} against {mib(q.get('peak_bytes'))} MiB")
        return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build-gpu"))
    ap.add_argument("--llmc-dir", "--llmc", default=os.path.join(REPO, ".peers", "llmc"),
                    help="where llm.c's train_gpt2cu and train_gpt2fp32cu are (../shared/peers/llm.c/build.sh DIR)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--config", choices=sorted(CONFIGS), default="gpt2", help="ours and PyTorch (llm.c: gpt2 only)")
    ap.add_argument("--torch-python", default="python3")
    ap.add_argument("--batches", default="4,16")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=12, help="timed steps per run")
    ap.add_argument("--frameworks", default="libminigrad,pytorch,llm.c")
    ap.add_argument("--ours-precisions", default="fp32,tf32,bf16")
    ap.add_argument("--ours-variants", default="plain", help=f"ours again with flags: {', '.join(VARIANTS)}")
    ap.add_argument("--torch-precisions", default="fp32,tf32,bf16")
    ap.add_argument("--llmc-precisions", default="bf16,tf32")
    ap.add_argument("--timeout", type=float, default=120, help="seconds per run")
    ap.add_argument("--commit", default=None)
    ap.add_argument("--out", default=None, help="JSON lines appended here")
    ap.add_argument("--md", default=None, help="the table written here too")
    ap.add_argument("--logs", default=None, help="each run's output in this folder")
    a = ap.parse_args()
    a.batches = [int(b) for b in a.batches.split(",")]
    a.build_dir, a.llmc_dir = os.path.abspath(a.build_dir), os.path.abspath(a.llmc_dir)
    for k in ("frameworks", "ours_precisions", "ours_variants", "torch_precisions", "llmc_precisions"):
        setattr(a, k, [x for x in getattr(a, k).split(",") if x])
    for v in a.ours_variants:
        if v not in VARIANTS:
            ap.error(f"--ours-variants: {v!r} is not one of {', '.join(VARIANTS)}")
    if a.logs:
        os.makedirs(a.logs, exist_ok=True)
    r = Runner(a)
    r.all()
    t = r.table()
    q = r.ratios()
    print(t)
    print(q)
    if a.md:
        with open(a.md, "w") as f:
            f.write(f"GPT ({a.config}), T = {a.seq_len}, {a.steps} timed steps; {r.common['gpu_name'] or a.device}; commit "
                    f"{r.common['commit']}\n\n{t}\n\n{q}\n")


if __name__ == "__main__":
    main()
