#!/usr/bin/env bash
# The apps' --prefetch and the records issue 36's cliff stage reads (scripts/gpu_verify.sh cliff),
# on the CPU:
#   - vgg_ckpt, mnist_ga (an accumulation schedule, the epochs' short last windows) and gpt_train
#     (windows of a token stream) with --prefetch on give the losses of --prefetch off, to the bit
#     (Note [prefetched micro-batches]), and say in --json whether they read ahead;
#   - vgg_ckpt's --json has, per step, the wait for data, the peaks and the system allocations;
#     every app's, where its wall time went (phases_ms, plan_preflight_ms, plan_measure_ms);
#     --conv-workspace-limit 2GiB is the JSON's limit; --conv-algos says that no convolution ran
#     on a GPU and lists none.
# Exit 77 (skipped) without python3.
#   tests/app_records.sh build/bin/vgg_ckpt build/bin/mnist_ga build/bin/gpt_train
set -u
usage="usage: app_records.sh VGG_CKPT MNIST_GA GPT_TRAIN"
VGG_CKPT=${1:?$usage} MNIST_GA=${2:?$usage} GPT_TRAIN=${3:?$usage}
T=$(mktemp -d "${TMPDIR:-/tmp}/mg_app_records.XXXXXX")
trap 'rm -rf "$T"' EXIT
export OMP_NUM_THREADS=2
fail() { echo "app_records: $*" >&2; exit 1; }
command -v python3 >/dev/null || { echo "app_records: skipped: no python3 to read the JSON"; exit 77; }

# run NAME BINARY ARGS...: the app with --json $T/NAME.json, its output in $T/NAME.log.
run() {
  local name=$1 bin=$2
  shift 2
  timeout 120 "$bin" "$@" --json "$T/$name.json" > "$T/$name.log" 2>&1 || fail "$name failed: $(tail -3 "$T/$name.log")"
}
V=(--width-div 16 --image-size 32 --batch-size 8 --steps 3 --checkpoint sqrt --conv-algos --conv-workspace-limit 2GiB)
for p in off on; do
  run "vgg_$p" "$VGG_CKPT" "${V[@]}" --prefetch $p
  run "mnist_$p" "$MNIST_GA" --synthetic --limit-train 100 --limit-test 20 --epochs 2 --batch-size 16 \
    --accum-schedule 0:2,1:3 --prefetch $p
  run "gpt_$p" "$GPT_TRAIN" --config tiny --batch-size 4 --steps 3 --accum 2 --prefetch $p
done
grep -q "conv algorithms: none chosen (no convolution ran on a GPU)" "$T/vgg_on.log" \
  || fail "vgg_ckpt --conv-algos did not say that nothing was chosen: $(tail -5 "$T/vgg_on.log")"

python3 - "$T" <<'PY' || fail "see above"
import json, os, sys
T = sys.argv[1]
rd = lambda n: json.load(open(os.path.join(T, n + ".json")))
errors = []
for app in ("vgg", "mnist", "gpt"):
    off, on = rd(app + "_off"), rd(app + "_on")
    if off["losses"] != on["losses"]:
        errors.append(f"{app}: losses {on['losses']} with --prefetch on, {off['losses']} off")
    if (off["prefetch"], on["prefetch"]) != (False, True):
        errors.append(f"{app}: prefetch {off['prefetch']} / {on['prefetch']} in the JSON, expected false / true")
    steps = len(on["step_ms"])
    for key in ("step_data_ms", "step_peak_in_use_bytes", "step_peak_reserved_bytes", "step_system_allocs"):
        if len(on.get(key, [])) != steps:
            errors.append(f"{app}: {key} has {len(on.get(key, []))} entries for {steps} steps")
    if max(on["step_peak_in_use_bytes"]) != on["peak_in_use_bytes"]:
        errors.append(f"{app}: the steps' peaks {on['step_peak_in_use_bytes']} against {on['peak_in_use_bytes']}")
    # Where the wall time went (apps/common/phases.h): the phases in order, the plan's own split
    # within its phase, the steps within the training's.
    phases = on.get("phases_ms", {})
    expected = ["start", "device", "data", "model", "plan", "train"]
    if list(phases)[:6] != expected:
        errors.append(f"{app}: phases_ms {list(phases)}, expected {expected} first")
    elif min(phases.values()) < 0 or phases["start"] > 60e3:
        errors.append(f"{app}: phases_ms {phases}")
    elif on["plan_preflight_ms"] + on["plan_measure_ms"] > phases["plan"] or on["plan_measure_ms"] <= 0:
        errors.append(f"{app}: plan_preflight_ms {on['plan_preflight_ms']} + plan_measure_ms {on['plan_measure_ms']} "
                      f"against the plan phase's {phases['plan']}")
    elif sum(on["step_ms"]) > phases["train"]:
        errors.append(f"{app}: the steps' {sum(on['step_ms'])} ms against the train phase's {phases['train']}")
v = rd("vgg_on")
if v.get("conv_workspace_limit_bytes") != 2 << 30:
    errors.append(f"vgg: conv_workspace_limit_bytes {v.get('conv_workspace_limit_bytes')}, expected {2 << 30}")
if v.get("conv_algorithms") != []:
    errors.append(f"vgg: conv_algorithms {v.get('conv_algorithms')!r} on the CPU, expected []")
# The next micro-batch is part of the fixed bytes with prefetch on: 8 images of 3x32x32 and their labels.
extra = rd("vgg_on")["fixed_bytes"] - rd("vgg_off")["fixed_bytes"]
if extra != 8 * (3 * 32 * 32 * 4 + 8):
    errors.append(f"vgg: prefetch adds {extra} fixed bytes, expected {8 * (3 * 32 * 32 * 4 + 8)}")
for e in errors:
    print("app_records:", e)
sys.exit(1 if errors else 0)
PY
echo "app_records: the same losses with --prefetch on and off (vgg_ckpt, mnist_ga, gpt_train); the per-step records, the phases and the conv flags in --json"
