#!/usr/bin/env bash
# What to run on a machine with an NVIDIA GPU to verify the CUDA backend (issue 3) and measure
# it against PyTorch (issue 6). Each stage fits in one 10-minute call of the device tool.
#
#   ../shared/tools/offline-kit.sh          # here, once: bundles the header deps into .devkit
#   bash scripts/gpu_verify.sh build        # there (carry .devkit): configure + build build-gpu/
#   bash scripts/gpu_verify.sh test         # ctest, test_cuda included (it must not skip)
#   bash scripts/gpu_verify.sh sanitize     # compute-sanitizer memcheck, racecheck, synccheck, initcheck
#   bash scripts/gpu_verify.sh bench        # bench/compare.py on cuda: VGG16 and MLP vs PyTorch
#   bash scripts/gpu_verify.sh all          # the four in order
#
# Logs and results go to $OUT (the device tool's folder) or, without it, to gpu-results/.
# Environment: CUDA_ARCH (default 90), BUILD_DIR (default build-gpu), PYTHON (default python3:
# the one with a CUDA PyTorch), SANITIZE_FILTER (doctest -tc filter for the sanitizer runs).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-results}
build=${BUILD_DIR:-build-gpu}
py=${PYTHON:-python3}
mkdir -p "$out"
status=0

note() { echo "[gpu_verify] $*" | tee -a "$out/summary.txt"; }

stage_build() {
  [ -f .devkit/gpu-build.sh ] || { note "build: .devkit missing (run ../shared/tools/offline-kit.sh here and carry .devkit)"; return 1; }
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/gpu.txt" 2>&1 || true
  # gpu-build.sh configures, builds and runs ctest; the ctest run is the test stage's job.
  CTEST_ARGS="-R ^$" BUILD_DIR="$build" CUDA_ARCH="${CUDA_ARCH:-90}" bash .devkit/gpu-build.sh \
    -DMINIGRAD_CUDA=ON >"$out/build.log" 2>&1
  local rc=$?
  note "build: exit $rc ($(cat "$out/gpu.txt" 2>/dev/null | head -1))"
  return $rc
}

stage_test() {
  (cd "$build" && ctest --output-on-failure --timeout 900) >"$out/ctest.log" 2>&1
  local rc=$?
  note "ctest: exit $rc; $(grep -E 'tests passed|tests failed' "$out/ctest.log" | tail -1)"
  if grep -q "test_cuda .*Skipped" "$out/ctest.log"; then
    note "ctest: test_cuda SKIPPED: the GPU was not seen (see $out/ctest.log)"
    rc=1
  fi
  "$build/bin/test_cuda" --duration=true >"$out/test_cuda.log" 2>&1
  note "test_cuda alone: exit $?; $(grep -E 'test cases:' "$out/test_cuda.log" | tail -1)"
  return $rc
}

stage_sanitize() {
  local rc=0 filter=()
  [ -n "${SANITIZE_FILTER:-}" ] && filter=(-tc="$SANITIZE_FILTER")
  for tool in memcheck racecheck synccheck initcheck; do
    timeout 540 compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 \
      "$build/bin/test_cuda" "${filter[@]}" >"$out/sanitizer_$tool.log" 2>&1
    local r=$?
    note "compute-sanitizer $tool: exit $r; $(grep -E 'ERROR SUMMARY' "$out/sanitizer_$tool.log" | tail -1)"
    [ $r -ne 0 ] && rc=1
  done
  return $rc
}

stage_bench() {
  "$py" bench/compare.py --device cuda --build-dir "$build" --tf32 conv --cudnn-benchmark off \
    --mlp-repeats 2 --mirror-sqrt --torch-python "$py" \
    --out "$out/cuda.jsonl" --md "$out/cuda.md" --png "$out/cuda_plans.png" >"$out/bench.log" 2>&1
  local rc=$?
  note "bench: exit $rc (table: $out/cuda.md)"
  return $rc
}

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(all)
[ "${stages[0]}" = all ] && stages=(build test sanitize bench)
for s in "${stages[@]}"; do
  case "$s" in
    build | test | sanitize | bench) "stage_$s" || status=1 ;;
    *) echo "gpu_verify.sh: unknown stage '$s' (expected build, test, sanitize, bench or all)" >&2; exit 2 ;;
  esac
done
exit $status
