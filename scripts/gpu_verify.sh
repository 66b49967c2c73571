#!/usr/bin/env bash
# What to run on a machine with an NVIDIA GPU to verify the CUDA backend (issue 3) and measure
# it against PyTorch (issue 6). Each stage fits in one 10-minute call of the device tool.
#
#   ../shared/tools/offline-kit.sh libjpeg62-turbo-dev libjpeg62-turbo
#                                           # here, once: bundles the build deps into .devkit
#   bash scripts/gpu_verify.sh build        # there (carry .devkit): configure + build build-gpu/
#   bash scripts/gpu_verify.sh test         # ctest, the GPU tests included (none may skip)
#   bash scripts/gpu_verify.sh sanitize     # compute-sanitizer memcheck, racecheck, synccheck, initcheck
#   bash scripts/gpu_verify.sh bench        # bench/compare.py on cuda: VGG16 and MLP vs PyTorch
#   bash scripts/gpu_verify.sh gpt          # GPT-2 124M, context 1024: step time and memory vs PyTorch
#   bash scripts/gpu_verify.sh gpt_batch    # its largest batch with and without the planner
#   bash scripts/gpu_verify.sh overlap      # issue 13: NCCL over one rank, the buckets' timeline
#   bash scripts/gpu_verify.sh all          # build, test, sanitize, bench in order (gpt: its own call)
#
# Logs and results go to $OUT (the device tool's folder) or, without it, to gpu-results/.
# Environment: CUDA_ARCH (default 90), BUILD_DIR (default build-gpu), PYTHON (default python3:
# the one with a CUDA PyTorch), SANITIZE_FILTER (doctest -tc filter for the sanitizer runs),
# SANITIZE_TESTS (which GPU test executables the sanitizer runs, default all: a subset per call
# when the four tools over all of them do not fit in one).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-results}
build=${BUILD_DIR:-build-gpu}
py=${PYTHON:-python3}
mkdir -p "$out"
status=0

# The GPU tests: the executables whose source includes tests/cuda_helpers.h (they skip, exit 77,
# without a device), and test_ops, which runs CUDA against CPU for every op of the op table when
# it finds a device and passes without one.
gpu_tests=($(grep -l '^#include "cuda_helpers.h"' tests/test_*.cpp | xargs -n1 basename | sed 's/\.cpp$//') test_ops)

note() { echo "[gpu_verify] $*" | tee -a "$out/summary.txt"; }

# NCCL (issue 13): the toolkit's, or else the nvidia-nccl-cu13 wheel's (the image's PyTorch has
# one), which holds libnccl.so.2 only; CMake takes that name from NCCL_ROOT. No MPI is needed for
# one rank (Note [a world of one] in include/minigrad/dist/dist.h).
if [ -z "${NCCL_ROOT:-}" ] && [ ! -f /usr/local/cuda/include/nccl.h ]; then
  NCCL_ROOT=$("$py" -c 'import importlib.util as u; s = u.find_spec("nvidia.nccl"); print(list(s.submodule_search_locations)[0] if s else "")' 2>/dev/null)
  [ -n "$NCCL_ROOT" ] && [ -f "$NCCL_ROOT/include/nccl.h" ] || NCCL_ROOT=""
fi
if [ -n "${NCCL_ROOT:-}" ]; then
  export NCCL_ROOT LD_LIBRARY_PATH="$NCCL_ROOT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# libjpeg-turbo from the kit, where the machine has none: its jconfig.h sits in the multiarch
# include folder, which the compiler searches only under /usr, and its library is loaded at run time.
if [ -d .devkit/usr/include/x86_64-linux-gnu ]; then
  export CPATH="$PWD/.devkit/usr/include/x86_64-linux-gnu:$PWD/.devkit/usr/include${CPATH:+:$CPATH}"
  export LD_LIBRARY_PATH="$PWD/.devkit/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

stage_build() {
  [ -f .devkit/gpu-build.sh ] || { note "build: .devkit missing (run ../shared/tools/offline-kit.sh here and carry .devkit)"; return 1; }
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$out/gpu.txt" 2>&1 || true
  # gpu-build.sh configures, builds and runs ctest; the ctest run is the test stage's job.
  CTEST_ARGS="-R ^$" BUILD_DIR="$build" CUDA_ARCH="${CUDA_ARCH:-90}" bash .devkit/gpu-build.sh \
    -DMINIGRAD_CUDA=ON >"$out/build.log" 2>&1
  local rc=$?
  note "build: exit $rc ($(cat "$out/gpu.txt" 2>/dev/null | head -1))"
  # Issue 13: NCCL over one rank needs no MPI (ctest nccl_world_of_one); mpi_training_1rank runs
  # the same case under mpirun where MPI is there.
  note "nccl: ${NCCL_ROOT:-/usr/local/cuda} ($(ls /usr/local/cuda/include/nccl.h "${NCCL_ROOT:-/nonexistent}/include/nccl.h" 2>/dev/null | head -1))"
  note "mpi: mpirun $(command -v mpirun || echo none); $(ldconfig -p 2>/dev/null | grep -c 'libmpi\.so') libmpi in ldconfig; $(grep -o 'libminigrad: MPI [A-Z]*, NCCL [A-Z]*' "$out/build.log" | tail -1)"
  "$py" -c 'import mpi4py; print("mpi4py", mpi4py.__version__, mpi4py.get_config())' >>"$out/summary.txt" 2>&1 || true
  return $rc
}

stage_test() {
  (cd "$build" && ctest --output-on-failure --timeout 900) >"$out/ctest.log" 2>&1
  local rc=$?
  note "ctest: exit $rc; $(grep -E 'tests passed|tests failed' "$out/ctest.log" | tail -1)"
  # In a CUDA build on a GPU machine nothing may skip: a skip means the GPU was not seen.
  local skipped
  skipped=$(grep -E '\*\*\*Skipped' "$out/ctest.log" | sed -E 's/.*Test +#[0-9]+: ([^ ]+).*/\1/' | tr '\n' ' ' | sed 's/ $//')
  if [ -n "$skipped" ]; then
    note "ctest: SKIPPED: $skipped: the GPU was not seen (see $out/ctest.log)"
    rc=1
  fi
  note "ctest nccl_world_of_one: $(grep -E 'nccl_world_of_one' "$out/ctest.log" | tail -1 | sed -E 's/ +/ /g' || echo 'not built (no NCCL)')"
  local t r
  for t in "${gpu_tests[@]}"; do
    "$build/bin/$t" --duration=true >"$out/$t.log" 2>&1
    r=$?
    note "$t alone: exit $r; $(grep -E 'test cases:' "$out/$t.log" | tail -1)"
    [ $r -ne 0 ] && rc=1
  done
  return $rc
}

stage_sanitize() {
  local rc=0 filter=() t r tests
  [ -n "${SANITIZE_FILTER:-}" ] && filter=(-tc="$SANITIZE_FILTER")
  read -r -a tests <<<"${SANITIZE_TESTS:-${gpu_tests[*]}}"
  for tool in memcheck racecheck synccheck initcheck; do
    for t in "${tests[@]}"; do
      # The allocator's out-of-memory cases make cudaMalloc fail on purpose (and fill the device):
      # the sanitizer would count the refusals as errors, and needs device memory of its own.
      local skip=()
      [ "$t" = test_cuda_allocator ] && skip=(-tce="*out of memory*,*full device*")
      timeout 540 compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 \
        "$build/bin/$t" "${filter[@]}" "${skip[@]}" >"$out/sanitizer_${tool}_$t.log" 2>&1
      r=$?
      note "compute-sanitizer $tool $t: exit $r; $(grep -E 'ERROR SUMMARY' "$out/sanitizer_${tool}_$t.log" | tail -1)"
      [ $r -ne 0 ] && rc=1
    done
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

# GPT-2 124M at context 1024 (issue 17): ours against PyTorch eager with its fused attention, plain
# and under our sqrt plan (stage gpt), then the largest batch that fits (stage gpt_batch,
# bench/gpt_max_batch.py). llm.c's published figures go beside these in docs/gpt.md; llm.c itself
# is not run here.
stage_gpt() {
  local rc=0 r
  for plan in none sqrt; do
    timeout 280 "$py" bench/gpt_bench.py --device cuda --build-dir "$build" --config gpt2 --batch-size 4 \
      --seq-len 1024 --steps 10 --repeats 1 --checkpoint "$plan" --torch-python "$py" --sdpa \
      --out "$out/gpt2_bench.jsonl" >"$out/gpt2_bench_$plan.md" 2>"$out/gpt2_bench_$plan.log"
    r=$?
    note "gpt2 B=4 T=1024 plan $plan: exit $r; $(tail -1 "$out/gpt2_bench_$plan.md")"
    [ $r -ne 0 ] && rc=1
  done
  return $rc
}

stage_gpt_batch() {
  local r
  timeout 540 "$py" bench/gpt_max_batch.py --device cuda --build-dir "$build" --config gpt2 --seq-len 1024 \
    --start 8 --max 256 --budget-batch 512 --timeout 120 --torch-python "$py" --sdpa \
    --out "$out/gpt2_max_batch.jsonl" >"$out/gpt2_max_batch.md" 2>"$out/gpt2_max_batch.log"
  r=$?
  note "gpt2 largest batch: exit $r (table: $out/gpt2_max_batch.md)"
  return $r
}

# Issue 13 on one GPU: NCCL over one rank (MG_DIST_WORLD_OF_ONE=1, no MPI needed), VGG16 and
# GPT-2 124M with a --timeline each (bench/timeline.py: how many buckets began before backward
# ended), and the step time against the same run without data parallelism (what the buckets cost).
stage_overlap() {
  local rc=0 r name
  local vgg=(--device cuda --batch-size 32 --steps 8 --tf32 conv)
  local gpt=(--device cuda --config gpt2 --batch-size 4 --seq-len 1024 --accum 2 --steps 6)
  for name in vgg16 gpt2; do
    local bin=vgg_ckpt args=("${vgg[@]}")
    [ $name = gpt2 ] && bin=gpt_train args=("${gpt[@]}")
    timeout 200 env MG_DIST_WORLD_OF_ONE=1 "$build/bin/$bin" "${args[@]}" --timeline "$out/timeline_$name.json" \
      >"$out/overlap_$name.log" 2>&1
    r=$?
    note "overlap $name (NCCL, one rank): exit $r; $(grep -E '^median step' "$out/overlap_$name.log" | tail -1)"
    [ $r -ne 0 ] && rc=1 && continue
    "$py" bench/timeline.py "$out/timeline_$name.json" >"$out/timeline_$name.md" 2>&1 || rc=1
    note "  $(tail -1 "$out/timeline_$name.md")"
    timeout 200 "$build/bin/$bin" "${args[@]}" >"$out/overlap_${name}_plain.log" 2>&1
    note "  without data parallelism: exit $?; $(grep -E '^median step' "$out/overlap_${name}_plain.log" | tail -1)"
  done
  return $rc
}

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(all)
[ "${stages[0]}" = all ] && stages=(build test sanitize bench)
for s in "${stages[@]}"; do
  case "$s" in
    build | test | sanitize | bench | gpt | gpt_batch | overlap) "stage_$s" || status=1 ;;
    *) echo "gpu_verify.sh: unknown stage '$s' (expected build, test, sanitize, bench, gpt, gpt_batch, overlap or all)" >&2; exit 2 ;;
  esac
done
exit $status
