#!/usr/bin/env bash
# The apps' --profile (minigrad/core/profiler.h, apps/common/profile.h), on the CPU:
#   - gpt_train under the sqrt plan: the JSON's profile has every op of a step by pass, the
#     checkpointed blocks' forwards again as "replay", the optimizer's scopes once per profiled
#     step, a total within the profiled steps' wall time; and the losses are the bits of a run
#     without --profile (profiling changes no result);
#   - vgg_ckpt: the table is printed;
#   - mnist_ga over two epochs: the optimizer steps after the first, every micro-batch of them
#     and no evaluation's forward, the same losses as without --profile.
# Exit 77 (skipped) without python3.
#   tests/app_profile.sh build/bin/gpt_train build/bin/vgg_ckpt build/bin/mnist_ga
set -u
usage="usage: app_profile.sh GPT_TRAIN VGG_CKPT MNIST_GA"
GPT_TRAIN=${1:?$usage} VGG_CKPT=${2:?$usage} MNIST_GA=${3:?$usage}
T=$(mktemp -d "${TMPDIR:-/tmp}/mg_app_profile.XXXXXX")
trap 'rm -rf "$T"' EXIT
export OMP_NUM_THREADS=2
fail() { echo "app_profile: $*" >&2; exit 1; }
command -v python3 >/dev/null || { echo "app_profile: skipped: no python3 to read the JSON"; exit 77; }

# run_pair NAME BINARY ARGS...: the app without and with --profile, JSON in $T/NAME_plain.json and
# $T/NAME_prof.json; the second must print the table.
run_pair() {
  local name=$1 bin=$2
  shift 2
  timeout 90 "$bin" "$@" --json "$T/${name}_plain.json" > "$T/${name}_plain.log" 2>&1 \
    || fail "$name failed: $(tail -3 "$T/${name}_plain.log")"
  timeout 90 "$bin" "$@" --profile --json "$T/${name}_prof.json" > "$T/${name}_prof.log" 2>&1 \
    || fail "$name --profile failed: $(tail -3 "$T/${name}_prof.log")"
  grep -q '^op or scope' "$T/${name}_prof.log" || fail "$name --profile printed no table: $(tail -5 "$T/${name}_prof.log")"
}

run_pair gpt_train "$GPT_TRAIN" --config tiny --batch-size 4 --steps 4 --accum 2 --checkpoint sqrt
python3 - "$T/gpt_train_plain.json" "$T/gpt_train_prof.json" <<'PY' || fail "gpt_train --profile: see above"
import json, sys
plain, prof = (json.load(open(p)) for p in sys.argv[1:3])
errors = []
if plain["losses"] != prof["losses"]:
    errors.append(f"losses {prof['losses']} with --profile, {plain['losses']} without")
p = prof.get("profile", {})
rows = {(r["name"], r["pass"]): r for r in p.get("rows", [])}
steps = p.get("steps")
if steps != 3:
    errors.append(f"{steps} profiled steps, expected 3 (4 steps, the first left out)")
micro = 2 * (steps or 0)  # --accum 2
for key in [("linear", "forward"), ("linear", "backward"), ("linear", "replay"), ("causal_self_attention", "forward"),
            ("causal_self_attention", "backward"), ("causal_self_attention", "replay"), ("cross_entropy", "forward"),
            ("cross_entropy", "backward"), ("embedding", "forward"), ("embedding", "backward")]:
    if key not in rows:
        errors.append(f"no row for {key}")
for name, calls in [("optimizer.step", steps), ("optimizer.zero_grad", steps)]:
    got = rows.get((name, ""), {}).get("calls")
    if got != calls:
        errors.append(f"{name}: {got} calls, expected {calls}")
for name, per_micro in [("cross_entropy", 1), ("embedding", 2)]:  # the loss; the tokens' and positions' tables
    for pass_ in ["forward", "backward"]:
        got = rows.get((name, pass_), {}).get("calls")
        if got != per_micro * micro:
            errors.append(f"{name} {pass_}: {got} calls, expected {per_micro * micro}")
# Each block's attention runs once forward and, checkpointed, once again in backward.
fwd = rows.get(("causal_self_attention", "forward"), {}).get("calls", 0)
rep = rows.get(("causal_self_attention", "replay"), {}).get("calls", 0)
if fwd != micro * 2 or rep == 0 or rep > fwd:  # tiny: 2 layers
    errors.append(f"attention: {fwd} forwards, {rep} replays for {micro} micro-batches of 2 layers")
total = sum(r["ms"] for r in p.get("rows", []))
if not 0 < total <= p.get("steps_ms", 0):
    errors.append(f"the table's total {total} ms is not within the profiled steps' {p.get('steps_ms')} ms")
for e in errors:
    print("app_profile:", e, file=sys.stderr)
print(f"gpt_train --profile: {len(rows)} rows, {total:.1f} of {p.get('steps_ms', 0):.1f} ms; losses unchanged")
sys.exit(1 if errors else 0)
PY
timeout 90 "$VGG_CKPT" --width-div 64 --image-size 32 --batch-size 2 --steps 2 --checkpoint sqrt --profile \
  > "$T/vgg.log" 2>&1 || fail "vgg_ckpt --profile failed: $(tail -3 "$T/vgg.log")"
grep -q '^conv2d  *replay' "$T/vgg.log" || fail "vgg_ckpt --profile: no conv2d replay row: $(grep -A30 '^op or scope' "$T/vgg.log")"

# 200 samples in micro-batches of 16: 13 a epoch, in 3 windows of 4 and a short one of 1; two
# epochs are 8 steps, 7 profiled, over 13 - 4 + 13 = 22 micro-batches.
run_pair mnist_ga "$MNIST_GA" --synthetic --limit-train 200 --limit-test 50 --batch-size 16 --accum 4 --epochs 2
python3 - "$T/mnist_ga_plain.json" "$T/mnist_ga_prof.json" <<'PY' || fail "mnist_ga --profile: see above"
import json, sys
plain, prof = (json.load(open(p)) for p in sys.argv[1:3])
errors = []
losses = lambda j: [(e["train_loss"], e["test_loss"]) for e in j["epochs"]]
if losses(plain) != losses(prof):
    errors.append(f"losses {losses(prof)} with --profile, {losses(plain)} without")
p = prof.get("profile", {})
rows = {(r["name"], r["pass"]): r["calls"] for r in p.get("rows", [])}
if p.get("steps") != 7:
    errors.append(f"{p.get('steps')} profiled steps, expected 7 (8 steps, the first left out)")
# 3 linear layers per micro-batch; an evaluation's forward would add 3 calls an epoch.
for key, calls in [(("optimizer.step", ""), 7), (("linear", "forward"), 66), (("linear", "backward"), 66),
                   (("cross_entropy", "forward"), 22)]:
    if rows.get(key) != calls:
        errors.append(f"{key}: {rows.get(key)} calls, expected {calls}")
total = sum(r["ms"] for r in p.get("rows", []))
if not 0 < total <= p.get("steps_ms", 0):
    errors.append(f"the table's total {total} ms is not within the profiled steps' {p.get('steps_ms')} ms")
for e in errors:
    print("app_profile:", e, file=sys.stderr)
sys.exit(1 if errors else 0)
PY
# A run of one optimizer step profiles that step (4 micro-batches of 3 linear layers).
timeout 90 "$MNIST_GA" --synthetic --limit-train 64 --limit-test 16 --batch-size 16 --accum 4 --epochs 1 --profile \
  > "$T/mnist_one.log" 2>&1 || fail "mnist_ga --profile, one step, failed: $(tail -3 "$T/mnist_one.log")"
grep -q '^profile of 1 steps (the only one)' "$T/mnist_one.log" && grep -Eq '^linear +forward +cpu +12 ' "$T/mnist_one.log" \
  || fail "mnist_ga --profile, one step: $(grep -A6 '^profile' "$T/mnist_one.log")"
echo "app_profile: gpt_train, vgg_ckpt and mnist_ga profiled their steps"
