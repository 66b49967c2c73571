#!/usr/bin/env bash
# A batch of a million images (issue 34): vgg_ckpt at 32x32, width / 16, --batch-size 1000000 and no
# budget. One micro-batch of that cannot fit the machine, so the Trainer plans the step jointly for
# what the device has (measuring stops once larger micro-batches are no faster per sample), then
# trains with a progress line every 5 s. The test waits for the re-plan and the first progress
# line (at most 120 s), then stops the run: nothing long may run silent.
#   tests/huge_batch.sh build/bin/vgg_ckpt
set -u
VGG_CKPT=${1:?usage: huge_batch.sh VGG_CKPT}
log=$(mktemp "${TMPDIR:-/tmp}/mg_huge_batch.XXXXXX")
"$VGG_CKPT" --image-size 32 --width-div 16 --steps 1 --batch-size 1000000 > "$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 240); do
  grep -q "the step's ETA" "$log" && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.5
done
fail() { echo "huge_batch: $*" >&2; cat "$log" >&2; exit 1; }
grep -q "needs about .* the device cpu has" "$log" || fail "no line saying the micro-batch cannot fit the device"
grep -q "re-planned: micro-batch" "$log" || fail "no joint plan"
grep -q "the step's ETA" "$log" || fail "no progress line within 120 s"
echo "huge_batch: $(grep -m1 're-planned' "$log" | sed 's/^ *//'); $(grep -m1 "the step's ETA" "$log" | sed 's/^ *//')"
