#!/usr/bin/env bash
# kill -9 during saves (issue 15): mnist_ga trains with --save-dir and is killed at a random moment,
# KILLS times, each time restarted from the folder (--resume DIR). fsync is slowed down by an
# LD_PRELOAD shim (tests/slow_fsync.cpp) so that a save takes most of an epoch and kills land in it.
# After every kill the next start must
#   - leave no temporary file in the folder and every training state with its weights beside it
#     (Note [a pair of files as one unit], src/optim/train_state.cpp),
#   - resume from the newest complete pair, whose weights file holds exactly the resumed weights;
# and the run, once let finish, must end with files byte-identical to an uninterrupted run's.
#
#   tests/kill_during_save.sh build/bin/mnist_ga build/lib/libslow_fsync.so [KILLS]
set -euo pipefail
app=$1 shim=$2 kills=${3:-20}
epochs=40
work=$(mktemp -d "${TMPDIR:-/tmp}/mg_kill.XXXXXX")
trap 'rm -rf "$work"' EXIT
common=(--synthetic --limit-train 512 --limit-test 64 --batch-size 64 --accum 2 --optimizer adam --seed 5)
fail() { echo "FAIL: $*" >&2; exit 1; }

"$app" "${common[@]}" --epochs "$epochs" --save-dir "$work/ref" >"$work/ref.log"
"$app" "${common[@]}" --epochs 1 --save-dir "$work/run" >"$work/first.log"

# A start that only tidies, resumes and stops (--epochs 1 is done): how long start-up takes on
# this machine now. Kills land that long plus a pseudo-random 0.05 to 0.44 s after a start, so
# they fall among the epochs and saves on a loaded machine as on a quiet one. Every check run
# below measures it again.
startup_s() {
  local t0=$EPOCHREALTIME
  "$app" "${common[@]}" --epochs 1 --resume "$work/run" --save-dir "$work/run" >"$work/check.log" 2>&1 ||
    { cat "$work/check.log" >&2; fail "$1"; }
  startup=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3f", b - a }')
}
startup_s "the first start after the first epoch failed"
RANDOM=42  # the kill moments are pseudo-random but the same from run to run
delivered=0 tmp_left=0 state_alone=0 attempts=0
while [ "$delivered" -lt "$kills" ]; do
  attempts=$((attempts + 1))
  [ "$attempts" -le $((kills * 3)) ] || fail "only $delivered of $kills kills reached a live process"
  MG_SLOW_FSYNC_MS=40 LD_PRELOAD="$shim" \
    "$app" "${common[@]}" --epochs "$epochs" --resume "$work/run" --save-dir "$work/run" >"$work/run.log" 2>&1 &
  pid=$!
  sleep "$(awk -v s="$startup" -v r=$((5 + RANDOM % 40)) 'BEGIN { printf "%.3f", s + r / 100 }')"  # some epochs, some saves
  if kill -9 "$pid" 2>/dev/null; then delivered=$((delivered + 1)); fi
  wait "$pid" 2>/dev/null || true
  grep -q "Epoch $epochs/$epochs" "$work/run.log" && fail "training finished before $kills kills; raise epochs"

  # What the kill left: a temporary (killed inside a write) or a state without its weights
  # (killed between the two files of a pair).
  compgen -G "$work/run/*.tmp.*" >/dev/null && tmp_left=$((tmp_left + 1))
  for s in "$work"/run/*.state.safetensors; do
    [ -e "${s%.state.safetensors}.safetensors" ] || { state_alone=$((state_alone + 1)); break; }
  done

  # The next start: --epochs 1 is already done, so it tidies the folder, resumes and stops.
  startup_s "the start after kill $delivered failed"
  compgen -G "$work/run/*.tmp.*" >/dev/null && fail "temporaries left after the start following kill $delivered: $(ls "$work/run")"
  for s in "$work"/run/*.state.safetensors; do
    [ -e "${s%.state.safetensors}.safetensors" ] || fail "$s has no weights file after the start following kill $delivered"
  done
  state=$(sed -n 's/^resumed from \(.*\): .*/\1/p' "$work/check.log")
  [ -n "$state" ] || { cat "$work/check.log" >&2; fail "no 'resumed from' line after kill $delivered"; }
  weights=${state%.state.safetensors}.safetensors
  "$app" "${common[@]}" --epochs 1 --resume "$state" --compare "$weights" >"$work/compare.log" 2>&1 ||
    { cat "$work/compare.log" >&2; fail "comparing $weights after kill $delivered failed"; }
  grep -q "max |w - w(.*)| = 0 over" "$work/compare.log" ||
    { cat "$work/compare.log" >&2; fail "$weights does not hold the weights of $state"; }
done

"$app" "${common[@]}" --epochs "$epochs" --resume "$work/run" --save-dir "$work/run" >"$work/last.log"
for f in "epoch_$epochs.safetensors" "epoch_$epochs.state.safetensors"; do
  cmp -s "$work/ref/$f" "$work/run/$f" || fail "$f after $kills kills differs from the uninterrupted run's"
done
compgen -G "$work/run/*.tmp.*" >/dev/null && fail "temporaries left at the end"
echo "kill_during_save: $delivered kills (of $attempts starts): $tmp_left left a temporary, $state_alone a state" \
     "without its weights (one kill can leave both); every next start tidied the folder and resumed from a loadable pair, and" \
     "the run ended byte-identical to an uninterrupted one ($epochs epochs)"
[ $((tmp_left + state_alone)) -gt 0 ] || fail "no kill landed inside a save: the test did not test it"
