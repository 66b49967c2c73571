#!/usr/bin/env python3
"""The benchmark suite (issue 6): every workload on one device, libminigrad and PyTorch run
alternately (never in parallel), one JSON line per run appended to --out.

    /usr/bin/python3 bench/suite.py --device cpu  --out bench/results/cpu.jsonl
    /usr/bin/python3 bench/suite.py --device cuda --out bench/results/cuda.jsonl --tf32 off

Workloads
  mlp   MLP 784-512-512-10, SGD step, batch 64 and batch 16 x 4 accumulated
        (build/bin/mlp_bench against bench/reference/mlp_torch.py), --mlp-repeats times each.
  vgg   VGG16 (cuda: full size, 224x224, batch 64; cpu: --width-div 8 --image-size 224
        --batch-size 8), plans none, segments=2, sqrt and two budgets (build/bin/vgg_ckpt
        against bench/reference/vgg_bench_torch.py). Budgets (--budgets auto): 1/3 and 2/3 of the
        way from our sqrt plan's predicted peak up to the none plan's (from the smallest
        feasible peak the planner reports when sqrt is not below none); --budgets 0.6x,0.8x: those
        fractions of the none run's measured peak in use; --budgets 90MiB,...: as given. PyTorch runs none,
        checkpoint_sequential(..., 2), checkpoint_sequential(..., round(sqrt(n))), and for each
        budget plan the same segments as ours (its `bounds=` mode): same plan, PyTorch's executor.
        --model resnet18|resnet34|resnet50 runs the same plans on a ResNet instead (blocks as
        units; PyTorch: torchvision's blocks in the same flat chain). --nhwc adds ours channels
        last (vgg_ckpt --layout nhwc), plan none; --torch-bf16 adds PyTorch under
        autocast(bfloat16) with channels_last and ours with --precision bf16 --layout nhwc, plan
        none (issue 36's bf16 target). Every vgg record says its "layout".

Every record has the common schema: framework, workload, device, batch, accum, steps, plan,
median_step_s, samples_per_s, peak_in_use_bytes, peak_reserved_bytes (allocator; PyTorch on CPU
has none: null), predicted_peak_bytes (our planner; null elsewhere), peak_rss_bytes (the child
process's ru_maxrss, read by this driver with os.wait4, the same way for both frameworks), plus
cmd, load_avg_1m (os.getloadavg() before the run: other processes may share the cores) and
error (only when the run failed; the suite goes on).

Math mode on CUDA is pinned and recorded in every record: --tf32 on|off|conv for both frameworks
(PyTorch: allow_tf32 of cuBLAS and cuDNN; conv = TF32 convolutions, FP32 matmuls, the default
of both libraries; libminigrad: mlp_bench --tf32, and vgg_ckpt's --tf32 when the app has that
flag, else it runs its default, conv, and the record says so and flags a mismatch),
--cudnn-benchmark on|off (PyTorch; vgg_ckpt likewise when it has the flag).
CPU threads: OMP_NUM_THREADS=--threads for both, torch.set_num_threads(--threads) for PyTorch's VGG and
--torch-mlp-threads (default 1, its OpenBLAS using every core) for PyTorch's MLP.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH_PY = "/usr/bin/python3"  # Debian's python3 with python3-torch (CPU); --torch-python overrides


def log(msg):
    print(f"[suite {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_child(cmd, env, timeout_s):
    """Runs cmd; returns (rc, stdout, stderr, peak_rss_bytes of the child, wall seconds)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=REPO)
        deadline = t0 + timeout_s
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                p.kill()
                pid, status, ru = os.wait4(p.pid, 0)
                break
            time.sleep(0.05)
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - t0
        out.seek(0)
        err.seek(0)
        timed_out = wall > timeout_s
        rc = 124 if timed_out else p.returncode
        return rc, out.read().decode(errors="replace"), err.read().decode(errors="replace"), ru.ru_maxrss * 1024, wall


def last_json_line(text):
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                pass
    return None


def first_key(d, *names, default=None):
    for n in names:
        if n in d and d[n] is not None:
            return d[n]
    return default


class Suite:
    def __init__(self, args):
        self.args = args
        self.bin = os.path.join(os.path.abspath(args.build_dir), "bin")
        self.out = None if args.dry_run else open(args.out, "a")
        self.records = []
        self.git = self.git_state()
        self.gpu_name = self.query_gpu() if args.device == "cuda" else None
        self.env = dict(os.environ)
        if args.device == "cpu":
            self.env["OMP_NUM_THREADS"] = str(args.threads)

    @staticmethod
    def query_gpu():
        try:
            return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            return None

    @staticmethod
    def git_state():
        """The commit the binaries were presumably built from, with -dirty when the tree differs."""
        try:
            head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                  text=True, timeout=10).stdout.strip()
            # bench/results/ is where the suite writes; its own output does not make the tree dirty.
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=normal", "--", ".",
                                    ":!bench/results"], cwd=REPO, capture_output=True, text=True,
                                   timeout=10).stdout.strip()
            return head + ("-dirty" if dirty else "")
        except (OSError, subprocess.SubprocessError):
            return None

    def emit(self, rec):
        if self.args.dry_run:
            log("(dry run) " + json.dumps({k: rec.get(k) for k in ("framework", "workload", "plan", "error")}))
            return rec
        rec.setdefault("device", self.args.device)
        # Issue 40's common fields: precision, peak_bytes, gpu_name, commit, image_size.
        tf32 = rec.get("tf32")
        if isinstance(tf32, str) and "precision" not in rec:
            rec["precision"] = "fp32" if tf32 == "off" or self.args.device == "cpu" else "tf32"
            if rec["precision"] == "tf32":
                rec["tf32_scope"] = "all" if tf32 == "on" else "convolutions (matmuls strict FP32)"
        rec.setdefault("peak_bytes", rec.get("peak_in_use_bytes"))
        rec.setdefault("image_size", self.args.image_size)
        rec["gpu_name"] = self.gpu_name
        rec["commit"] = os.environ.get("MG_COMMIT") or self.git
        rec["suite_time_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        rec["git"] = self.git
        self.records.append(rec)
        self.out.write(json.dumps(rec) + "\n")
        self.out.flush()
        shown = {k: rec.get(k) for k in ("framework", "workload", "plan", "median_step_s", "peak_in_use_bytes",
                                         "peak_rss_bytes", "error") if rec.get(k) is not None}
        log(json.dumps(shown))
        return rec

    def run(self, base, cmd, parse):
        """Runs one benchmark process and emits its record (base + parsed fields)."""
        load = os.getloadavg()[0]
        log("run: " + " ".join(shlex.quote(c) for c in cmd))
        if self.args.dry_run:
            return dict(base, cmd=" ".join(shlex.quote(c) for c in cmd), error="dry run")
        rc, out, err, rss, wall = run_child(cmd, self.env, self.args.timeout)
        rec = dict(base)
        rec.update({"cmd": " ".join(shlex.quote(c) for c in cmd), "load_avg_1m": load, "wall_s": wall})
        if rc != 0:
            tail = (err.strip() or out.strip())[-600:]
            rec["error"] = f"exit {rc}" + (" (timed out)" if rc == 124 else "") + f": {tail}"
            return self.emit(rec)
        try:
            rec.update(parse(out))
        except Exception as e:  # a malformed result is reported, not fatal to the suite
            rec["error"] = f"could not parse the result: {e}: {out.strip()[-300:]}"
        rec["peak_rss_bytes"] = rss  # wait4's figure, the same for both frameworks
        return self.emit(rec)

    # ---- MLP -------------------------------------------------------------------------------------
    def mlp(self):
        a = self.args
        for batch, accum in ((64, 1), (16, 4)):
            workload = f"mlp_b{batch}" + (f"x{accum}" if accum > 1 else "")
            common = ["--device", a.device, "--batch", str(batch), "--accum", str(accum),
                      "--steps", str(a.mlp_steps), "--warmup", str(a.mlp_warmup)]
            tf32 = {"tf32": a.tf32}
            for rep in range(a.mlp_repeats):
                base = {"workload": workload, "plan": "none", "batch": batch, "accum": accum, "repeat": rep}
                exe = os.path.join(self.bin, "mlp_bench")
                if not os.path.exists(exe):
                    self.emit(dict(base, framework="libminigrad", error=f"{exe} not found (build it first)"))
                else:
                    self.run(dict(base, framework="libminigrad", **tf32), [exe] + common + ["--tf32", a.tf32],
                             self.parse_mlp)
                torch_cmd = [self.args.torch_python, os.path.join(REPO, "bench/reference/mlp_torch.py")] + common
                if a.device == "cpu":
                    torch_cmd += ["--threads", str(a.torch_mlp_threads)]
                if a.device == "cuda" and a.tf32 == "on":  # the MLP has no convolutions: conv = off
                    torch_cmd += ["--tf32"]
                self.run(dict(base, framework="pytorch", **tf32), torch_cmd, self.parse_mlp)

    @staticmethod
    def parse_mlp(out):
        j = last_json_line(out)
        if j is None:
            raise ValueError("no JSON line on stdout")
        j.setdefault("peak_in_use_bytes", None)
        j.setdefault("peak_reserved_bytes", None)
        j["predicted_peak_bytes"] = None
        j["self_reported_peak_rss_bytes"] = j.pop("peak_rss_bytes", None)
        return j

    # ---- VGG16 -----------------------------------------------------------------------------------
    def vgg_shape(self):
        a = self.args
        if a.device == "cuda":
            return a.width_div or 1, a.image_size, a.batch_size or 64
        return a.width_div or 8, a.image_size, a.batch_size or 8

    def vgg_ours(self, plan, workload, shape, layout="nchw", bf16=False, fuse_relu=False, tiles=True):
        """One run of ours. tiles=False measures no tiles: for a run of plan none whose floor (the
        smallest feasible peak, which tiles lower) nothing reads; on CUDA each tile is a new
        shape for cuDNN, so measuring them costs start-up time."""
        a = self.args
        wd, size, batch = shape
        exe = os.path.join(self.bin, "vgg_ckpt")
        base = {"framework": "libminigrad", "workload": workload, "plan": plan, "batch": batch, "accum": 1,
                "layout": layout, "fuse_relu": fuse_relu}
        if not os.path.exists(exe):
            return self.emit(dict(base, error=f"{exe} not found (apps/vgg_ckpt not built)"))
        fd, json_path = tempfile.mkstemp(suffix=".json", prefix="vgg_ckpt_")
        os.close(fd)
        cmd = [exe, "--device", a.device, "--model", a.model, "--width-div", str(wd), "--image-size", str(size),
               "--batch-size", str(batch), "--checkpoint", plan, "--seed", str(a.seed), "--json", json_path]
        math_flags, math_mode = self.vgg_math_args()
        cmd += math_flags
        base.update(math_mode)
        if layout != "nchw":
            cmd += ["--layout", layout]
        if fuse_relu:  # Note [fused relu]: vgg_ckpt --fuse-relu
            cmd += ["--fuse-relu"]
        if bf16:  # autocast(bfloat16) as PyTorch's recipe (our --precision bf16: fp32 masters)
            cmd += ["--precision", "bf16"]
            base["precision"] = "bf16"
        if not tiles:
            cmd += ["--tiles", "off"]
        if self.vgg_has_warmup():
            cmd += ["--steps", str(a.vgg_steps), "--warmup", str(a.vgg_warmup)]
        else:  # the app times every step; the warm-up steps are then part of --steps
            cmd += ["--steps", str(a.vgg_steps + a.vgg_warmup)]

        def parse(_out):
            with open(json_path) as f:
                return self.normalize_vgg_ckpt(json.load(f), 0 if self.vgg_has_warmup() else a.vgg_warmup)
        try:
            return self.run(base, cmd, parse)
        finally:
            os.unlink(json_path)

    _help = None

    def vgg_help(self):
        if self._help is None:
            try:
                h = subprocess.run([os.path.join(self.bin, "vgg_ckpt"), "--help"], capture_output=True, text=True,
                                   timeout=30)
                self._help = h.stdout
            except (OSError, subprocess.SubprocessError):
                self._help = ""
        return self._help

    def vgg_has_warmup(self):
        return "--warmup" in self.vgg_help()

    def vgg_math_args(self):
        """(flags for vgg_ckpt, what its math mode then is): the app's flags when it has them."""
        a, flags, mode = self.args, [], {}
        if "--tf32" in self.vgg_help():
            flags += ["--tf32", a.tf32]
            mode["tf32"] = a.tf32
        else:
            mode["tf32"] = "conv (vgg_ckpt has no --tf32: its default, matmul FP32, conv TF32)"
            if a.device == "cuda" and a.tf32 != "conv":
                mode["math_mode_mismatch"] = f"PyTorch ran --tf32 {a.tf32}; vgg_ckpt cannot be set and ran conv"
        if "--cudnn-benchmark" in self.vgg_help():  # a flag without a value
            flags += ["--cudnn-benchmark"] if a.cudnn_benchmark == "on" else []
            mode["cudnn_benchmark"] = a.cudnn_benchmark
        else:
            mode["cudnn_benchmark"] = "app default (off: cuDNN heuristics)"
        return flags, mode

    @staticmethod
    def normalize_vgg_ckpt(j, warmup=0):
        """apps/vgg_ckpt's --json, mapped onto the suite schema (its own fields kept under 'app').
        The median step time is taken over step_ms without the first `warmup` steps."""
        mem = j.get("memory", {}) if isinstance(j.get("memory"), dict) else {}
        times = j.get("step_ms")
        if times and len(times) > warmup:
            timed = sorted(t / 1000.0 for t in times[warmup:])
            median = timed[len(timed) // 2] if len(timed) % 2 else 0.5 * (timed[len(timed) // 2 - 1] + timed[len(timed) // 2])
        elif j.get("median_step_ms") is not None:
            timed, median = [], j["median_step_ms"] / 1000.0
        else:
            timed, median = [], first_key(j, "median_step_s")
        cpu = j.get("step_cpu_ms")
        cpu = sorted(cpu[warmup:]) if cpu and len(cpu) > warmup else None
        rec = {
            "median_step_s": median,
            "median_step_cpu_s": cpu[len(cpu) // 2] / 1000.0 if cpu else None,
            "min_step_s": timed[0] if timed else None,
            "max_step_s": timed[-1] if timed else None,
            "peak_in_use_bytes": first_key(j, "measured_peak_bytes", "peak_in_use_bytes", "measured_peak_in_use_bytes",
                                           default=first_key(mem, "peak_in_use", "peak_in_use_bytes")),
            "peak_reserved_bytes": first_key(j, "peak_reserved_bytes", "measured_peak_reserved_bytes",
                                             default=first_key(mem, "peak_reserved", "peak_reserved_bytes")),
            "predicted_peak_bytes": first_key(j, "predicted_peak_bytes", "predicted_peak_in_use_bytes"),
            "segments": first_key(j, "segments", "segment_boundaries", "boundaries"),
            "final_loss": first_key(j, "final_loss", "loss"),
            "steps": len(timed) if timed else first_key(j, "steps", "timed_steps"),
            "app": {k: v for k, v in j.items() if k != "units"},
        }
        if rec["median_step_s"] is None:
            raise ValueError("no median step time in vgg_ckpt's JSON (keys: %s)" % sorted(j))
        batch = first_key(j, "batch_size", "batch")
        if batch:
            rec["samples_per_s"] = batch / rec["median_step_s"]
        return rec

    def vgg_torch(self, plan, workload, shape, label=None, mirrors=None, bf16=False):
        a = self.args
        wd, size, batch = shape
        base = {"framework": "pytorch", "workload": workload, "plan": label or plan, "batch": batch, "accum": 1,
                "tf32": a.tf32, "cudnn_benchmark": a.cudnn_benchmark, "layout": "nhwc" if bf16 else "nchw"}
        if mirrors:
            base["mirrors"] = mirrors  # runs our `mirrors` plan's segments
        cmd = [a.torch_python, os.path.join(REPO, "bench/reference/vgg_bench_torch.py"), "--device", a.device,
               "--model", a.model,
               "--width-div", str(wd), "--image-size", str(size), "--batch-size", str(batch),
               "--checkpoint", plan, "--steps", str(a.vgg_steps), "--warmup", str(a.vgg_warmup),
               "--seed", str(a.seed), "--tf32", a.tf32, "--cudnn-benchmark", a.cudnn_benchmark]
        if a.device == "cpu":
            cmd += ["--threads", str(a.threads)]
        if bf16:  # PyTorch's mixed-precision recipe: autocast(bfloat16), channels_last
            cmd += ["--precision", "bf16", "--channels-last"]
            base["precision"] = "bf16"

        def parse(out):
            j = last_json_line(out)
            if j is None:
                raise ValueError("no JSON line on stdout")
            j["torch_plan"] = j.pop("plan")
            # The script's precision is its autocast dtype; the record's is the math of the run
            # (emit derives it from tf32 unless bf16 set it in base).
            j["autocast"] = j.pop("precision", "fp32")
            j["self_reported_peak_rss_bytes"] = j.pop("peak_rss_bytes", None)
            return j
        return self.run(base, cmd, parse)

    @staticmethod
    def bounds_of(rec):
        """Our record's checkpointed segments as PyTorch's bounds=A:B,... (None if unknown)."""
        segs = rec.get("segments")
        if not segs:
            return None
        parts = []
        for s in segs:
            if isinstance(s, dict):
                a, b = first_key(s, "begin", "start", "first"), first_key(s, "end", "stop")
                if s.get("checkpointed") is False:
                    continue
            else:
                a, b = s[0], s[1]
            if a is None or b is None:
                return None
            parts.append(f"{int(a)}:{int(b)}")
        return "bounds=" + ",".join(parts) if parts else None

    def vgg(self):
        shape = self.vgg_shape()
        workload = f"{self.args.model}_w{shape[0]}_s{shape[1]}_b{shape[2]}"
        plans = [p for p in self.args.plans.split(",") if p]
        none = sqrt = {}
        if "none" in plans or "budgets" in plans:
            none = self.vgg_ours("none", workload, shape)
            self.vgg_torch("none", workload, shape)
        if "segments=2" in plans:
            self.vgg_ours("segments=2", workload, shape)
            self.vgg_torch("segments=2", workload, shape)
        if "sqrt" in plans or "budgets" in plans:
            sqrt = self.vgg_ours("sqrt", workload, shape)
            self.vgg_torch("sqrt", workload, shape)
            if self.args.mirror_sqrt and not sqrt.get("error") and self.bounds_of(sqrt):
                self.vgg_torch(self.bounds_of(sqrt), workload, shape, label="sqrt (ours mirrored)", mirrors="sqrt")
        if "budgets" in plans:
            self.vgg_budgets(workload, shape, none, sqrt)
        # The variants of plan none below: only their step times and peaks are read, not floors.
        if self.args.nhwc:  # channels last in our default math (issue 36's layout)
            self.vgg_ours("none", workload, shape, layout="nhwc", tiles=False)
            if self.args.fuse_relu:
                self.vgg_ours("none", workload, shape, layout="nhwc", fuse_relu=True, tiles=False)
        if self.args.torch_bf16:  # both under autocast(bfloat16), channels last: the bf16 targets
            self.vgg_torch("none", workload, shape, bf16=True)
            self.vgg_ours("none", workload, shape, layout="nhwc", bf16=True, tiles=False)
            if self.args.fuse_relu:
                self.vgg_ours("none", workload, shape, layout="nhwc", bf16=True, fuse_relu=True, tiles=False)

    def budget_values(self, none, sqrt):
        """The budgets to run, in bytes, as --budgets asks (see the module doc)."""
        spec = self.args.budgets
        if spec == "auto":
            top = none.get("predicted_peak_bytes") or none.get("peak_in_use_bytes")
            s_pred = sqrt.get("predicted_peak_bytes")
            floor = (none.get("app") or {}).get("min_feasible_peak_bytes")
            lo = s_pred if s_pred and top and s_pred < top else floor
            if not top or not lo:
                raise ValueError("the none/sqrt runs reported no peaks to place the budgets between")
            return [int(lo + f * (top - lo)) for f in (1 / 3, 2 / 3)]
        out = []
        for part in spec.split(","):
            if part.endswith("x"):
                if not none.get("peak_in_use_bytes"):
                    raise ValueError("no measured peak of the none run to scale")
                out.append(int(float(part[:-1]) * none["peak_in_use_bytes"]))
            else:
                out.append(part)  # a size the app parses (90MiB, 100000000)
        return out

    def vgg_budgets(self, workload, shape, none, sqrt):
        try:
            budgets = self.budget_values(none, sqrt)
        except ValueError as e:
            self.emit({"framework": "libminigrad", "workload": workload, "plan": "budget=?", "error": str(e)})
            return
        for budget in budgets:
            plan = f"budget={budget}"
            rec = self.vgg_ours(plan, workload, shape)
            if rec.get("error"):
                continue
            bounds = self.bounds_of(rec)
            if bounds is None:  # a budget plan may checkpoint nothing: PyTorch then runs plain
                bounds = "none"
            self.vgg_torch(bounds, workload, shape, label=plan, mirrors=plan)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--out", default=None, help="JSON-lines file to append to (default bench/results/<device>.jsonl)")
    ap.add_argument("--build-dir", default=os.path.join(REPO, "build"), help="where bin/mlp_bench and bin/vgg_ckpt are")
    ap.add_argument("--parts", default="mlp,vgg", help="comma list of: mlp, vgg")
    ap.add_argument("--threads", type=int, default=2, help="CPU threads for both frameworks")
    # Debian's PyTorch runs its matmuls in OpenBLAS (pthreads), which uses every core by itself:
    # with torch.set_num_threads(2) on top, the two pools oversubscribe the 2 cores and the MLP
    # runs ~1.5x slower than with 1 intra-op thread (measured: 13-15k against 15-27k samples/s).
    # The VGG convolutions run in oneDNN on torch's own threads, where 2 is faster (0.23 against
    # 0.30 s per step). Each workload gets PyTorch's faster setting.
    ap.add_argument("--torch-mlp-threads", type=int, default=1,
                    help="torch.set_num_threads for PyTorch's MLP on CPU (default 1: its BLAS threads itself)")
    ap.add_argument("--mlp-steps", type=int, default=200)
    ap.add_argument("--mlp-warmup", type=int, default=20)
    ap.add_argument("--mlp-repeats", type=int, default=1, help="run each MLP pair this many times (spread)")
    ap.add_argument("--vgg-steps", type=int, default=20, help="timed steps (issue 6: at least 20)")
    ap.add_argument("--vgg-warmup", type=int, default=2)
    ap.add_argument("--model", choices=["vgg16", "resnet18", "resnet34", "resnet50"], default="vgg16",
                    help="the vgg part's network (vgg_ckpt --model)")
    ap.add_argument("--width-div", type=int, default=0, help="0: 8 on cpu, 1 on cuda")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--batch-size", type=int, default=0, help="0: 8 on cpu, 64 on cuda")
    ap.add_argument("--budgets", default="auto",
                    help="auto | 0.6x,0.8x (of the none run's measured peak) | sizes (90MiB,...)")
    ap.add_argument("--mirror-sqrt", action="store_true",
                    help="also run our sqrt plan's segments with PyTorch's checkpoint")
    ap.add_argument("--tf32", choices=["on", "off", "conv"], default="conv",
                    help="CUDA TF32 for both frameworks: on, off (strict FP32), conv (convolutions only: "
                         "both libraries' default)")
    ap.add_argument("--cudnn-benchmark", choices=["on", "off"], default="off")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plans", default="none,segments=2,sqrt,budgets",
                    help="the vgg part's plans, a comma list of none, segments=2, sqrt, budgets")
    ap.add_argument("--torch-bf16", action="store_true",
                    help="also PyTorch under autocast(bfloat16) with channels_last, and ours with --precision bf16 "
                         "--layout nhwc, plan none")
    ap.add_argument("--nhwc", action="store_true", help="also ours with --layout nhwc (plan none, the --tf32 math)")
    ap.add_argument("--fuse-relu", action="store_true",
                    help="with --nhwc and --torch-bf16: those runs of ours once more with vgg_ckpt --fuse-relu")
    ap.add_argument("--torch-python", default=TORCH_PY,
                    help="the Python whose torch runs the references (a CUDA build on a GPU machine)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run and record nothing")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per benchmark process")
    args = ap.parse_args(argv)
    args.parts = [p for p in args.parts.split(",") if p]
    if args.out is None:
        args.out = os.path.join(REPO, "bench", "results", f"{args.device}.jsonl")
    if not args.dry_run:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    return args


def run_suite(args):
    suite = Suite(args)
    log(f"device {args.device}, results appended to {args.out}")
    for part in args.parts:
        if part not in ("mlp", "vgg"):
            raise SystemExit(f"--parts: unknown part {part!r} (expected mlp, vgg)")
        getattr(suite, part)()
    return suite.records


def main(argv=None):
    run_suite(parse_args(argv))


if __name__ == "__main__":
    main()
