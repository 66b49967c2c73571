#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/; clang, MINIGRAD_FUZZ=ON, AddressSanitizer +
# UndefinedBehaviorSanitizer, CPU only), writes their seed corpus, runs each target for a bounded
# time, prints what each did (executions, coverage) and exits non-zero when any found something:
# a crash, a sanitizer report, an exception other than mg::Error, a hang, an out-of-memory or a
# failed property check. docs/fuzzing.md says what each target covers.
# Environment:
#   FUZZ_SECONDS   seconds per target (default 60)
#   FUZZ_JOBS      targets run at a time (default 2)
#   FUZZ_TARGETS   which targets (default: all eight, see `targets` below)
#   FUZZ_TIMEOUT   seconds one input may take before it counts as a hang (default 10)
#   FUZZ_BUILD_DIR the fuzz build (default build-fuzz; not BUILD_DIR, which names the normal one)
#   FUZZ_OUT       where a run keeps seeds/, corpus/, logs/, artifacts/ and summary.txt
#                  (default $FUZZ_BUILD_DIR/fuzz-run; emptied first unless FUZZ_KEEP_CORPUS=1)
#   MG_SKIP_APT=1  install nothing
set -euo pipefail
cd "$(dirname "$0")/.."
build=${FUZZ_BUILD_DIR:-build-fuzz}
# libFuzzer and clang's OpenMP runtime, installed by setup.sh with the rest.
MG_EXTRA_PACKAGES="clang libclang-rt-14-dev libomp-dev" BUILD_DIR=$build CMAKE_ARGS="-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMINIGRAD_FUZZ=ON \
-DMINIGRAD_CUDA=OFF -DMINIGRAD_BUILD_TESTS=OFF -DMINIGRAD_BUILD_APPS=OFF" bash scripts/setup.sh

secs=${FUZZ_SECONDS:-60}
jobs_max=${FUZZ_JOBS:-2}
timeout_s=${FUZZ_TIMEOUT:-10}
targets=(${FUZZ_TARGETS:-safetensors train_state idx idx_gz image checkpoint_plan parse_bytes tokens})
out=${FUZZ_OUT:-$build/fuzz-run}
bin=$(cd "$build/bin" && pwd)
[ "${FUZZ_KEEP_CORPUS:-0}" = 1 ] || rm -rf "$out"
rm -rf "$out/seeds" "$out/logs" "$out/artifacts"
mkdir -p "$out/logs" "$out/artifacts" "$out/corpus"
out=$(cd "$out" && pwd)
"$bin/fuzz_make_corpus" "$out/seeds" >/dev/null

# Per target: the largest input. Readers of files get room for their seeds to grow; the parsers
# read one short text. Memory: 2 GiB for every target (fuzz_image bounds what an image may
# declare: docs/fuzzing.md).
declare -A max_len=([safetensors]=8192 [train_state]=8192 [idx]=8192 [idx_gz]=8192 [image]=16384
                    [checkpoint_plan]=512 [parse_bytes]=512 [tokens]=4096)
run_one() {
  local t=$1 dict=fuzz/dicts/$1.dict rc=0
  local extra=()
  [ -f "$dict" ] && extra+=("-dict=$dict")
  mkdir -p "$out/corpus/$t" "$out/artifacts/$t"
  # OMP_NUM_THREADS=1: one core per target; the readers have no parallel work worth a team.
  OMP_NUM_THREADS=1 timeout $((secs + 300)) "$bin/fuzz_$t" -max_total_time="$secs" -timeout="$timeout_s" \
    -rss_limit_mb=2048 -malloc_limit_mb=2048 -max_len="${max_len[$t]:-4096}" -print_final_stats=1 \
    -artifact_prefix="$out/artifacts/$t/" "${extra[@]}" "$out/corpus/$t" "$out/seeds/$t" \
    >"$out/logs/$t.log" 2>&1 || rc=$?
  echo "$rc" >"$out/logs/$t.rc"
}

echo "== fuzzing ${#targets[@]} targets, ${secs} s each, ${jobs_max} at a time (logs: $out/logs) =="
for t in "${targets[@]}"; do
  [ -x "$bin/fuzz_$t" ] || { echo "fuzz: no target fuzz_$t in $bin" >&2; exit 2; }
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done
  run_one "$t" &
done
wait

# libFuzzer's final statistics and its last status line ("#N DONE cov: C ft: F corp: K/B ...").
stat() { sed -n "s/^stat::$1: *//p" "$2" | tail -1; }
field() { grep -E '^#[0-9]+' "$2" | tail -1 | sed -n "s/.* $1: \([^ ]*\).*/\1/p"; }
failed=0
summary="$out/summary.txt"
printf '%-16s %-8s %12s %8s %7s %7s %14s %8s\n' target result executions exec/s cov ft corpus peak-rss | tee "$summary"
for t in "${targets[@]}"; do
  log=$out/logs/$t.log
  rc=$(cat "$out/logs/$t.rc")
  found=$(find "$out/artifacts/$t" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)
  result=ok
  if [ "$rc" != 0 ] || [ "$found" != 0 ]; then result=FOUND; failed=1; fi
  printf '%-16s %-8s %12s %8s %7s %7s %14s %8s\n' "$t" "$result" "$(stat number_of_executed_units "$log")" \
    "$(stat average_exec_per_sec "$log")" "$(field cov "$log")" "$(field ft "$log")" "$(field corp "$log")" \
    "$(stat peak_rss_mb "$log")MB" | tee -a "$summary"
done
if [ "$failed" != 0 ]; then
  for t in "${targets[@]}"; do
    [ "$(cat "$out/logs/$t.rc")" = 0 ] && [ -z "$(ls -A "$out/artifacts/$t")" ] && continue
    echo "== fuzz_$t found something (exit $(cat "$out/logs/$t.rc")); the end of $out/logs/$t.log:"
    tail -n 40 "$out/logs/$t.log"
    echo "== its input: $(ls "$out/artifacts/$t"/* 2>/dev/null | tr '\n' ' ')"
    echo "== reproduce: $bin/fuzz_$t <that file>"
  done
  echo "fuzz: FOUND something; the inputs are kept in $out/artifacts" >&2
  exit 1
fi
echo "fuzz: no findings (summary: $summary)"
