#!/usr/bin/env bash
# What to run on a machine with an NVIDIA GPU to verify the CUDA backend (issue 3), measure it
# against PyTorch (issue 6) and run NCCL (issue 13). One call of the device tool runs one or more
# stages, and must fit in its 10 minutes.
#
#   ../shared/tools/offline-kit.sh libjpeg62-turbo-dev libjpeg62-turbo
#                                           # here, once: bundles the build deps into .devkit
#   bash scripts/gpu_verify.sh build test   # there (carry .devkit): configure, build, ctest + the GPU tests
#   bash scripts/gpu_verify.sh quick        # the GPU tests side by side and NCCL over one rank, on a carried build
#   bash scripts/gpu_verify.sh sanitize     # compute-sanitizer (SANITIZE_TOOLS, default memcheck; SANITIZE_PARALLEL=1)
#   bash scripts/gpu_verify.sh bench        # bench/compare.py on cuda: VGG16 and MLP vs PyTorch; VGG16 --profile
#   bash scripts/gpu_verify.sh gpt          # GPT-2 124M, context 1024: step time and memory vs PyTorch; --profile
#   bash scripts/gpu_verify.sh gpt_batch    # its largest batch with and without the planner
#   bash scripts/gpu_verify.sh peers        # GPT-2 against PyTorch and llm.c; losses from the same weights
#   bash scripts/gpu_verify.sh cnn          # VGG16 and ResNet-50 against PyTorch, every plan and precision
#   bash scripts/gpu_verify.sh memory_record  # the largest batch that trains, PyTorch and ours (MEMREC_MODELS)
#   bash scripts/gpu_verify.sh overlap      # issue 13: NCCL over one rank, the buckets' timeline
#   bash scripts/gpu_verify.sh offload      # issue 38: offload against recompute at equal budgets, 4x the batch
#   bash scripts/gpu_verify.sh precision    # issue 35: GPT-2 and VGG16 in bf16 against fp32/tf32
#   bash scripts/gpu_verify.sh cliff        # issue 36: VGG16 at B 32 and 64, cuDNN's choices, cudaMalloc per step
#   bash scripts/gpu_verify.sh layout       # issue 36: channels first against last, TF32 and bf16, vs PyTorch
#   GPU_VERIFY_CMD=... bash scripts/gpu_verify.sh exec   # a command with the stages' environment
#   bash scripts/gpu_verify.sh pack         # $OUT/gpu-build.tgz from the build there (the build stage does it too)
#
# The device machine stays warm 30 s after a call: a later call usually starts a fresh one, with
# the working tree but no build. Every stage therefore builds first when build-gpu/ is missing
# (a minute or two on 16 cores), so any stage can open a call; unless the call carries the build
# of an earlier one: the build stage leaves its programs and libraries in $OUT/gpu-build.tgz
# (with an id of the sources they were built from); copy it into the repository's root and name
# gpu-build.tgz in the next calls' carry, and a stage unpacks it instead of building, when the
# sources are still the same.
#
# What comes back: the device tool returns at most 8 files from $OUT. The logs are written to
# $GPU_VERIFY_LOGS (default /tmp/gpu_verify) and packed at exit into $OUT/logs.tgz, beside
# $OUT/summary.txt (also printed). Without $OUT (a machine of your own) both go to gpu-results/.
# Environment: CUDA_ARCH (default 90), BUILD_DIR (default build-gpu), PYTHON (default python3:
# the one with a CUDA PyTorch), SANITIZE_TOOLS (default memcheck; also racecheck, synccheck,
# initcheck), SANITIZE_TESTS (which GPU test executables, default all), SANITIZE_FILTER (doctest
# -tc filter for the sanitizer runs), SANITIZE_TIMEOUT (seconds per run, default 150),
# SANITIZE_PARALLEL (1: every tool and test side by side). The quick, test and sanitize stages
# start a test executable again after a case that crashed it or left a sticky CUDA error
# (scripts/run_resumable.sh; MG_RESUME_MOST, default 8).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-results}
log=${GPU_VERIFY_LOGS:-/tmp/gpu_verify}
build=${BUILD_DIR:-build-gpu}
py=${PYTHON:-python3}
mkdir -p "$out" "$log"
status=0

pack() {
  cp "$log/summary.txt" "$out/summary.txt" 2>/dev/null
  tar czf "$out/logs.tgz" -C "$log" . 2>/dev/null
}
trap pack EXIT

# The GPU tests: the executables whose source includes tests/cuda_helpers.h, and test_ops, which
# runs CUDA against CPU for every op of the op table. Without a device they would skip (exit 77;
# test_ops would pass); MG_REQUIRE_GPU=1 below makes them fail instead, saying why.
gpu_tests=($(grep -l '^#include "cuda_helpers.h"' tests/test_*.cpp | xargs -n1 basename | sed 's/\.cpp$//') test_ops)

note() { echo "[gpu_verify] $*" | tee -a "$log/summary.txt"; }

# run_resumable: a test executable started again after a case that crashed it or left a sticky
# CUDA error, within the same time limit (the quick and test stages).
source scripts/run_resumable.sh
# A test log's doctest totals, one per part when run_resumable started it again.
totals() { grep -E 'test cases:' "$1" | sed 's/^\[doctest\] //' | paste -sd ';' | sed 's/;/; then /g'; }

# The tools and libraries the stages need, for every process they start: the toolkit's binaries
# (compute-sanitizer), the Python with PyTorch (tests/with_reference.sh reads PYTHON), and the
# libraries that may come from wheels rather than the toolkit.
export PATH="/usr/local/cuda/bin:$PATH"
export PYTHON="$(command -v "$py" || echo "$py")"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# A GPU test that finds no device fails here instead of skipping (tests/cuda_helpers.h, test_ops),
# and says why: the runtime's error, the driver's and the runtime's CUDA versions.
export MG_REQUIRE_GPU=1
wheel_dir() {  # the folder of a wheel's package, e.g. nvidia.nccl
  "$py" -c "import importlib.util as u; s = u.find_spec('$1'); print(list(s.submodule_search_locations)[0] if s else '')" \
    2>/dev/null
}
# NCCL (issue 13): the toolkit's, or else the nvidia-nccl-cu13 wheel's (the image's PyTorch has
# one), which holds libnccl.so.2 only; CMake takes that name from NCCL_ROOT. No MPI is needed for
# one rank (Note [a world of one] in include/minigrad/dist/dist.h).
if [ -z "${NCCL_ROOT:-}" ] && [ ! -f /usr/local/cuda/include/nccl.h ]; then
  NCCL_ROOT=$(wheel_dir nvidia.nccl)
  [ -n "$NCCL_ROOT" ] && [ -f "$NCCL_ROOT/include/nccl.h" ] || NCCL_ROOT=""
fi
[ -n "${NCCL_ROOT:-}" ] && export NCCL_ROOT LD_LIBRARY_PATH="$NCCL_ROOT/lib:$LD_LIBRARY_PATH"
# cuDNN likewise (gpu-build.sh finds it for the build; the programs need it at run time too).
if [ ! -f /usr/local/cuda/include/cudnn.h ]; then
  cudnn_root=$(wheel_dir nvidia.cudnn)
  [ -n "$cudnn_root" ] && export LD_LIBRARY_PATH="$cudnn_root/lib:$LD_LIBRARY_PATH"
fi

# libjpeg-turbo from the kit, where the machine has none: its jconfig.h sits in the multiarch
# include folder, which the compiler searches only under /usr, and its library is loaded at run time.
if [ -d .devkit/usr/include/x86_64-linux-gnu ]; then
  export CPATH="$PWD/.devkit/usr/include/x86_64-linux-gnu:$PWD/.devkit/usr/include${CPATH:+:$CPATH}"
  export LD_LIBRARY_PATH="$PWD/.devkit/usr/lib/x86_64-linux-gnu:$LD_LIBRARY_PATH"
fi

stage_build() {
  [ -f .devkit/gpu-build.sh ] || { note "build: .devkit missing (run ../shared/tools/offline-kit.sh here and carry .devkit)"; return 1; }
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$log/gpu.txt" 2>&1 || true
  # The kit's libz.so is Debian 12's absolute link to libz.so.1.2.13, broken on an image with
  # another zlib; CMake would then take the kit's libz.a, which cannot go into a shared library.
  local zlib=() t0=$SECONDS
  for z in /usr/lib/x86_64-linux-gnu/libz.so.1 /lib/x86_64-linux-gnu/libz.so.1; do
    [ -e "$z" ] && zlib=(-DZLIB_LIBRARY="$z") && break
  done
  # gpu-build.sh configures, builds and runs ctest; the ctest run is the test stage's job. The
  # build is marked with the sources it is made of once it succeeded (have_build, stage_pack).
  mkdir -p "$build" && rm -f "$build/source_id"
  local id
  id=$(source_id)
  CTEST_ARGS="-R ^$" BUILD_DIR="$build" CUDA_ARCH="${CUDA_ARCH:-90}" bash .devkit/gpu-build.sh \
    -DMINIGRAD_CUDA=ON "${zlib[@]}" >"$log/build.log" 2>&1
  local rc=$?
  [ $rc -eq 0 ] && echo "$id" >"$build/source_id"
  note "build: exit $rc after $((SECONDS - t0)) s ($(head -1 "$log/gpu.txt" 2>/dev/null))"
  [ $rc -ne 0 ] && note "build: $(grep -m3 -E 'error|Error' "$log/build.log" | tr '\n' ' ' | cut -c1-600)"
  # Issue 13: NCCL over one rank needs no MPI (ctest nccl_world_of_one); mpi_training_1rank runs
  # the same case under mpirun where MPI is there.
  note "nccl: ${NCCL_ROOT:-/usr/local/cuda}; $(grep -o 'libminigrad: MPI [A-Z]*, NCCL [A-Z]*' "$log/build.log" | tail -1)"
  note "mpi: mpirun $(command -v mpirun || echo none); $(ldconfig -p 2>/dev/null | grep -c 'libmpi\.so') libmpi in ldconfig"
  [ $rc -eq 0 ] && stage_pack
  return $rc
}

# The sources a build is made of, as one id (no git on the device machine): every file CMake
# compiles or reads, by path and content, the architecture, and the kit's build script.
source_id() {
  {
    find . \( -path './build*' -o -path ./.devkit -o -path ./.peers -o -path ./.git -o -path ./.whl -o -path ./gpu-results \) -prune \
      -o -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' -o -name 'CMakeLists.txt' \
      -o -name '*.cmake' -o -name '*.in' \) -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
    echo "CUDA_ARCH=${CUDA_ARCH:-90}"
    sha256sum .devkit/gpu-build.sh 2>/dev/null
  } | sha256sum | cut -c1-16
}

# The build's id, when it was built (or carried) from these sources; else nothing.
build_is_current() {
  [ -x "$build/bin/test_ops" ] && [ -f "$build/source_id" ] && [ "$(cat "$build/source_id")" = "$(source_id)" ]
}

# $OUT/gpu-build.tgz: the build's programs and libraries (what every stage runs) and its id.
stage_pack() {
  build_is_current || { note "pack: no build of these sources in $build"; return 1; }
  if ! tar czf "$out/gpu-build.tgz" -C "$build" bin lib source_id; then
    rm -f "$out/gpu-build.tgz"
    note "pack: tar failed"
    return 1
  fi
  local mib=$(($(stat -c %s "$out/gpu-build.tgz") >> 20))
  if [ $mib -ge 16 ]; then  # the device tool returns files of up to 16 MiB
    rm -f "$out/gpu-build.tgz"
    note "pack: $mib MiB, over the 16 MiB a returned file may have: not kept"
    return 1
  fi
  note "pack: gpu-build.tgz ($mib MiB, sources $(cat "$build/source_id")): copy it into the repository's root and carry it"
}

# A build carried from an earlier call (gpu-build.tgz in the repository's root), when it was made
# from these sources: unpacked beside, checked, then put in place. Its programs find its libraries
# through LD_LIBRARY_PATH, wherever it lies now. It has no ctest files (stage_test builds).
unpack_build() {
  [ -f gpu-build.tgz ] || return 1
  local id tmp missing
  id=$(tar xzf gpu-build.tgz -O source_id 2>/dev/null)
  if [ "$id" != "$(source_id)" ]; then
    note "gpu-build.tgz was built from other sources (${id:-no id}, these are $(source_id)): not used"
    return 1
  fi
  tmp=$(mktemp -d "${build%/}.unpack.XXXXXX") || return 1
  if ! tar xzf gpu-build.tgz -C "$tmp"; then
    rm -rf "$tmp"
    note "gpu-build.tgz: tar failed: not used"
    return 1
  fi
  missing=$(LD_LIBRARY_PATH="$(cd "$tmp" && pwd)/lib:$LD_LIBRARY_PATH" ldd "$tmp/bin/test_ops" 2>&1) || missing="ldd failed: $missing"
  case $missing in
    *"not found"* | "ldd failed"*)
      rm -rf "$tmp"
      note "gpu-build.tgz: $(echo "$missing" | grep -E 'not found|ldd failed' | head -3 | tr '\n' ' '): not used"
      return 1 ;;
  esac
  rm -rf "$build" && mv "$tmp" "$build" || return 1
  export LD_LIBRARY_PATH="$(cd "$build" && pwd)/lib:$LD_LIBRARY_PATH"
  note "unpacked the carried build (sources $id) into $build"
}

# A stage that needs the build makes it when this machine has none of these sources (a fresh
# machine, or a warm one with an older build), unless the call carried one.
# Its programs find its libraries through LD_LIBRARY_PATH, wherever it was built or carried from.
have_build() {
  build_is_current || unpack_build || {
    note "no build of these sources in $build on this machine: building first"
    stage_build
  } || return 1
  export LD_LIBRARY_PATH="$(cd "$build" && pwd)/lib:$LD_LIBRARY_PATH"
}

stage_test() {
  have_build || return 1
  # A carried build has no ctest files: the suite needs a build made here.
  if [ ! -f "$build/CTestTestfile.cmake" ]; then
    note "test: the carried build has no ctest files: building"
    stage_build || return 1
  fi
  (cd "$build" && ctest --output-on-failure --timeout 240 --no-tests=error) >"$log/ctest.log" 2>&1
  local rc=$?
  note "ctest: exit $rc; $(grep -E 'tests passed|tests failed' "$log/ctest.log" | tail -1)"
  # The GPU tests and NCCL's may not skip on a GPU machine: a skip means the GPU was not seen.
  # Others (a PyTorch reference the image cannot run) are reported.
  local skipped must t r
  skipped=$(grep -E '\*\*\*Skipped' "$log/ctest.log" | sed -E 's/.*Test +#[0-9]+: ([^ ]+).*/\1/' | tr '\n' ' ')
  for t in $skipped; do
    must=0
    for g in "${gpu_tests[@]}" nccl_world_of_one; do [ "$t" = "$g" ] && must=1; done
    if [ $must = 1 ]; then
      note "ctest: SKIPPED $t: the GPU was not seen"
      rc=1
    else
      note "ctest: skipped $t (see ctest.log)"
    fi
  done
  # Issue 13's case alone, for its figures (doctest prints MESSAGE lines of passing cases too).
  if [ -x "$build/bin/mpi_training" ]; then
    MG_DIST_WORLD_OF_ONE=1 MG_DIST_TIMEOUT=60 timeout 240 "$build/bin/mpi_training" -tc="CUDA*" \
      >"$log/nccl_world_of_one.log" 2>&1
    r=$?
    note "nccl_world_of_one alone: exit $r; $(grep -E 'test cases:' "$log/nccl_world_of_one.log" | tail -1)"
    grep -E 'relative error|began a reduction' "$log/nccl_world_of_one.log" | cut -c1-300 >>"$log/summary.txt"
    [ $r -ne 0 ] && rc=1
  fi
  for t in "${gpu_tests[@]}"; do
    run_resumable 240 "$log/$t.log" "$build/bin/$t"
    r=$?
    note "$t alone: exit $r; $(totals "$log/$t.log")"
    grep '^\[run_resumable\]' "$log/$t.log" >>"$log/summary.txt"
    grep -m1 -oE 'no CUDA device \(.*\)|MG_REQUIRE_GPU=1, but .*' "$log/$t.log" | cut -c1-300 >>"$log/summary.txt"
    [ $r -ne 0 ] && rc=1
  done
  return $rc
}

# The GPU tests and NCCL over one rank, on a build made here or carried (no ctest files needed),
# for a call that has little device time: the tests that leave the device's memory alone run side
# by side, test_cuda_allocator (which fills the device on purpose) after them, each under
# QUICK_TIMEOUT seconds (default 150). The whole CPU suite is CI's.
stage_quick() {
  have_build || return 1
  local rc=0 t r limit=${QUICK_TIMEOUT:-150} t0=$SECONDS
  local side=() pids=()
  # A test's exit, why it saw no device, its first failures (for the reply's tail), NCCL's figures.
  report() {
    note "$1: exit $2; $(totals "$log/$1.log")"
    grep '^\[run_resumable\]' "$log/$1.log" | tee -a "$log/summary.txt"
    grep -m1 -oE 'no CUDA device \(.*\)|MG_REQUIRE_GPU=1, but .*' "$log/$1.log" | cut -c1-300 | tee -a "$log/summary.txt"
    grep -m6 -E 'ERROR:|error:|FATAL|what\(\)|Segmentation|Aborted' "$log/$1.log" | cut -c1-400 | tee -a "$log/summary.txt"
    [ "$1" = nccl_world_of_one ] && grep -E 'relative error|began a reduction' "$log/$1.log" | cut -c1-300 | tee -a "$log/summary.txt"
    [ "$2" -eq 0 ] || rc=1
  }
  for t in "${gpu_tests[@]}"; do [ "$t" != test_cuda_allocator ] && side+=("$t"); done
  for t in "${side[@]}"; do
    run_resumable "$limit" "$log/$t.log" "$build/bin/$t" &
    pids+=($!)
  done
  if [ -x "$build/bin/mpi_training" ]; then
    MG_DIST_WORLD_OF_ONE=1 MG_DIST_TIMEOUT=60 run_resumable "$limit" "$log/nccl_world_of_one.log" \
      "$build/bin/mpi_training" -tc="CUDA*" &
    pids+=($!)
    side+=(nccl_world_of_one)
  fi
  local i
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    report "${side[$i]}" $?
  done
  run_resumable "$limit" "$log/test_cuda_allocator.log" "$build/bin/test_cuda_allocator"
  report test_cuda_allocator $?
  note "quick: $((SECONDS - t0)) s"
  return $rc
}

stage_sanitize() {
  have_build || return 1
  local rc=0 filter=() t r tests tools limit=${SANITIZE_TIMEOUT:-150}
  local names=() pids=()
  [ -n "${SANITIZE_FILTER:-}" ] && filter=(-tc="$SANITIZE_FILTER")
  read -r -a tests <<<"${SANITIZE_TESTS:-${gpu_tests[*]}}"
  read -r -a tools <<<"${SANITIZE_TOOLS:-memcheck}"
  # One run: its exit and the sanitizer's summary line.
  sanitize_report() {
    local f="$log/sanitizer_${1/ /_}.log"
    note "compute-sanitizer $1: exit $2; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$f" | paste -sd ';' | sed 's/;/; then /g')"
    grep '^\[run_resumable\]' "$f" >>"$log/summary.txt"
    [ "$2" -ne 0 ] && rc=1
  }
  for tool in "${tools[@]}"; do
    for t in "${tests[@]}"; do
      # The allocator's out-of-memory cases make cudaMalloc fail on purpose (and fill the device):
      # the sanitizer would count the refusals as errors, and needs device memory of its own.
      local skip=()
      [ "$t" = test_cuda_allocator ] && skip=(-tce="*out of memory*,*full device*")
      # SANITIZE_PARALLEL=1 runs every (tool, test) pair side by side (the device has the memory
      # and the cores; these are checks, not timings), each under SANITIZE_TIMEOUT seconds.
      run_resumable "$limit" "$log/sanitizer_${tool}_$t.log" compute-sanitizer --tool "$tool" \
        --error-exitcode 99 --print-limit 20 "$build/bin/$t" "${filter[@]}" "${skip[@]}" &
      if [ "${SANITIZE_PARALLEL:-0}" = 1 ]; then
        pids+=($!) names+=("$tool $t")
      else
        wait $!
        sanitize_report "$tool $t" $?
      fi
    done
  done
  local i
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    sanitize_report "${names[$i]}" $?
  done
  return $rc
}

stage_bench() {
  have_build || return 1
  timeout 360 "$py" bench/compare.py --device cuda --build-dir "$build" --tf32 conv --cudnn-benchmark off \
    --mlp-repeats 2 --mirror-sqrt --torch-python "$py" --timeout 120 \
    --out "$log/cuda.jsonl" --md "$log/cuda.md" --png "$log/cuda_plans.png" >"$log/bench.log" 2>&1
  local rc=$?
  note "bench: exit $rc"
  cat "$log/cuda.md" >>"$log/summary.txt" 2>/dev/null
  # VGG16's step op by op (minigrad/core/profiler.h): the header and the ten longest rows.
  local r
  # --tiles off here and in the other runs of plan none: a tile size measured is only the report's
  # floor for that plan, and measuring them all costs about one more measurement of the batch
  # (on cuDNN, each tile a new shape) outside the steps (item 22).
  timeout 60 "$build/bin/vgg_ckpt" --device cuda --batch-size 32 --steps 5 --tf32 conv --profile --tiles off \
    >"$log/vgg16_profile.log" 2>&1
  r=$?
  note "vgg16 B=32 --profile: exit $r"
  grep -A10 '^op or scope' "$log/vgg16_profile.log" >>"$log/summary.txt"
  [ $r -ne 0 ] && rc=1
  return $rc
}

# GPT-2 124M at context 1024 (issue 17): ours against PyTorch eager with its fused attention, plain
# and under our sqrt plan (stage gpt), then the largest batch that fits (stage gpt_batch,
# bench/gpt_max_batch.py). llm.c's published figures go beside these in docs/gpt.md; llm.c itself
# is not run here.
stage_gpt() {
  have_build || return 1
  local rc=0 r
  for plan in none sqrt; do
    timeout 170 "$py" bench/gpt_bench.py --device cuda --build-dir "$build" --config gpt2 --batch-size 4 \
      --seq-len 1024 --steps 10 --repeats 1 --checkpoint "$plan" --torch-python "$py" --sdpa \
      --out "$log/gpt2_bench.jsonl" >"$log/gpt2_bench_$plan.md" 2>"$log/gpt2_bench_$plan.log"
    r=$?
    note "gpt2 B=4 T=1024 plan $plan: exit $r; $(tail -1 "$log/gpt2_bench_$plan.md")"
    [ $r -ne 0 ] && rc=1
  done
  # Where the step goes, op by op (minigrad/core/profiler.h): the header and the ten longest rows.
  timeout 100 "$build/bin/gpt_train" --device cuda --config gpt2 --batch-size 4 --seq-len 1024 --steps 4 --profile \
    --json "$log/gpt2_profile.json" >"$log/gpt2_profile.log" 2>&1
  r=$?
  note "gpt2 B=4 T=1024 --profile: exit $r"
  grep -A10 '^op or scope' "$log/gpt2_profile.log" >>"$log/summary.txt"
  grep '^in no op or scope' "$log/gpt2_profile.log" >>"$log/summary.txt"
  [ $r -ne 0 ] && rc=1
  return $rc
}

stage_gpt_batch() {
  have_build || return 1
  local r
  timeout 420 "$py" bench/gpt_max_batch.py --device cuda --build-dir "$build" --config gpt2 --seq-len 1024 \
    --start 8 --max 256 --budget-batch 512 --timeout 120 --torch-python "$py" --sdpa \
    --out "$log/gpt2_max_batch.jsonl" >"$log/gpt2_max_batch.md" 2>"$log/gpt2_max_batch.log"
  r=$?
  note "gpt2 largest batch: exit $r"
  cat "$log/gpt2_max_batch.md" >>"$log/summary.txt" 2>/dev/null
  return $r
}

# Issue 40, item 4: GPT-2 124M at T = 1024 against PyTorch eager (SDPA; fp32, tf32, autocast bf16)
# and llm.c (train_gpt2cu bf16, train_gpt2fp32cu with TF32), B = 4 and 16, one after another on
# the same token files (bench/gpt_peers.py); then our losses against PyTorch's from the same
# weights over 50 steps (bench/gpt_loss_match.py). llm.c is built here (docs/cuda.md) and carried
# in LLMC_DIR (default .peers/llmc-bin).
stage_peers() {
  have_build || return 1
  local rc=0 r
  # Ours in fp32, tf32 and bf16, each plain and with its fusions (PEERS_VARIANTS): 22 runs at two
  # batches, about 330 s on the H200.
  timeout "${PEERS_TIMEOUT:-420}" "$py" bench/gpt_peers.py --build-dir "$build" --llmc-dir "${LLMC_DIR:-.peers/llmc-bin}" \
    --torch-python "$py" --batches "${PEERS_BATCHES:-4,16}" --steps "${PEERS_STEPS:-12}" --timeout 100 \
    --ours-precisions "${PEERS_OURS:-fp32,tf32,bf16}" --ours-variants "${PEERS_VARIANTS:-plain,fused}" \
    --out "$log/gpt2_peers.jsonl" --md "$log/gpt2_peers.md" --logs "$log/gpt2_peers_logs" >"$log/gpt2_peers.out" 2>"$log/gpt2_peers.log"
  r=$?
  note "gpt2 against PyTorch and llm.c: exit $r"
  cat "$log/gpt2_peers.md" >>"$log/summary.txt" 2>/dev/null
  [ $r -ne 0 ] && rc=1
  timeout "${LOSS_TIMEOUT:-150}" "$py" bench/gpt_loss_match.py --build-dir "$build" --device cuda --config gpt2 \
    --batch-size 4 --seq-len 1024 --steps 50 --out "$log/gpt2_loss_match.jsonl" --md "$log/gpt2_loss_match.md" \
    >"$log/gpt2_loss_match.out" 2>"$log/gpt2_loss_match.log"
  r=$?
  note "gpt2 losses against PyTorch's from the same weights: exit $r"
  cat "$log/gpt2_loss_match.md" >>"$log/summary.txt" 2>/dev/null
  [ $r -ne 0 ] && rc=1
  return $rc
}

# Issue 40, items 3, 6 and 7: VGG16 (224, batch 64) and ResNet-50 (224, batch 128) against PyTorch
# eager, plans none / segments=2 / sqrt / a budget at 0.6x of none's peak, TF32 convolutions
# (both libraries' default), PyTorch's autocast(bfloat16) + channels_last beside them; VGG16's
# none plan in strict FP32 and in TF32 everywhere; vgg_ckpt with both cuDNN flags. Benchmark mode
# off on both unless said.
stage_cnn() {
  have_build || return 1
  local rc=0 r m steps=${CNN_STEPS:-10}
  local suite=("$py" bench/suite.py --device cuda --parts vgg --build-dir "$build" --torch-python "$py"
               --vgg-steps "$steps" --vgg-warmup 2 --timeout 90 --cudnn-benchmark off --out "$log/cnn.jsonl")
  for m in ${CNN_MODELS:-vgg16:64 resnet50:128}; do
    timeout 200 "${suite[@]}" --model "${m%%:*}" --batch-size "${m##*:}" --tf32 conv --budgets 0.6x --torch-bf16 \
      >>"$log/cnn.log" 2>&1
    r=$?
    note "cnn ${m%%:*} batch ${m##*:}, TF32 convolutions, every plan: exit $r"
    [ $r -ne 0 ] && rc=1
  done
  for t in off on; do
    timeout 60 "${suite[@]}" --model vgg16 --batch-size 64 --tf32 $t --plans none >>"$log/cnn.log" 2>&1
    r=$?
    note "cnn vgg16 batch 64, --tf32 $t, plan none: exit $r"
    [ $r -ne 0 ] && rc=1
  done
  "$py" - "$log/cnn.jsonl" >>"$log/summary.txt" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    pk = r.get("peak_bytes")
    print(f"  {r['framework']:11} {r['workload']:22} {r.get('precision', '?'):5} {str(r.get('tf32')):5} {r['plan'][:28]:28} "
          + (f"{1000 * r['median_step_s']:8.1f} ms {pk / 2**30 if pk else float('nan'):6.2f} GiB" if not r.get("error")
             else "error: " + r["error"][:150]))
PY
  # Item 7: both cuDNN flags at once (cut off by the last call's limit).
  timeout 60 "$build/bin/vgg_ckpt" --device cuda --batch-size 64 --steps 6 --tf32 conv --cudnn-benchmark \
    --cudnn-nondeterministic --tiles off >"$log/vgg16_both_cudnn_flags.log" 2>&1
  r=$?
  note "vgg16 B=64 --cudnn-benchmark --cudnn-nondeterministic: exit $r; $(grep -E '^median step' "$log/vgg16_both_cudnn_flags.log" | tail -1)"
  return $rc
}

# Issue 40, item 5: the memory record (bench/memory_record.py): the largest batch that trains and
# its time per sample, PyTorch (none, checkpoint_sequential(2)) and ours (none, sqrt, the joint
# planner), at the card's memory and under 16 GiB. One model per call: MEMREC_MODELS (default
# vgg16), MEMREC_CAPS (default full,16GiB), MEMREC_PRECISION (fp32 or bf16, both frameworks),
# MEMREC_TIMEOUT (default 540 s). GPT-2 (issue 37, item 3) adds ours with every block checkpointed
# and llm.c at -r 0, 1, 2 from LLMC_DIR (default .peers/llmc-bin) when it is there:
# MEMREC_MODELS=gpt2 MEMREC_PRECISION=bf16 MEMREC_CAPS=16GiB.
stage_memory_record() {
  have_build || return 1
  local llmc=()
  [ -x "${LLMC_DIR:-.peers/llmc-bin}/train_gpt2cu" ] && llmc=(--llmc "${LLMC_DIR:-.peers/llmc-bin}")
  timeout "${MEMREC_TIMEOUT:-540}" "$py" bench/memory_record.py --build-dir "$build" --models "${MEMREC_MODELS:-vgg16}" \
    --caps "${MEMREC_CAPS:-full,16GiB}" --precision "${MEMREC_PRECISION:-fp32}" "${llmc[@]}" \
    --torch-python "$py" --out "$log/memory_record.jsonl" \
    --png "$log/memory_record.png" >"$log/memory_record.out" 2>"$log/memory_record.log"
  local r=$?
  note "memory record ${MEMREC_MODELS:-vgg16}: exit $r"
  cat "$log/memory_record.out" >>"$log/summary.txt" 2>/dev/null
  return $r
}

# Issue 13 on one GPU: NCCL over one rank (MG_DIST_WORLD_OF_ONE=1, no MPI needed), VGG16 and
# GPT-2 124M with a --timeline each (bench/timeline.py: how many buckets began before backward
# ended), and the step time against the same run without data parallelism (what the buckets cost).
stage_overlap() {
  have_build || return 1
  local rc=0 r name
  local vgg=(--device cuda --batch-size 32 --steps 8 --tf32 conv)
  local gpt=(--device cuda --config gpt2 --batch-size 4 --seq-len 1024 --accum 2 --steps 6)
  for name in vgg16 gpt2; do
    local bin=vgg_ckpt args=("${vgg[@]}")
    [ $name = gpt2 ] && bin=gpt_train args=("${gpt[@]}")
    timeout "${OVERLAP_TIMEOUT:-150}" env MG_DIST_WORLD_OF_ONE=1 "$build/bin/$bin" "${args[@]}" --timeline "$log/timeline_$name.json" \
      >"$log/overlap_$name.log" 2>&1
    r=$?
    note "overlap $name (NCCL, one rank): exit $r; $(grep -E '^median step' "$log/overlap_$name.log" | tail -1)"
    [ $r -ne 0 ] && rc=1 && continue
    "$py" bench/timeline.py "$log/timeline_$name.json" >"$log/timeline_$name.md" 2>&1 || rc=1
    note "  $(tail -1 "$log/timeline_$name.md")"
    timeout "${OVERLAP_TIMEOUT:-150}" "$build/bin/$bin" "${args[@]}" >"$log/overlap_${name}_plain.log" 2>&1
    note "  without data parallelism: exit $?; $(grep -E '^median step' "$log/overlap_${name}_plain.log" | tail -1)"
  done
  return $rc
}

# Issue 38 (docs/gpu-queue.md item 9): VGG16 224 at OFFLOAD_BATCH (default 64) without
# checkpointing; then the same batch under a budget of its fixed part and OFFLOAD_BUDGET (default
# 0.6) of the activations above it,
# offload on against off (the planner's best recompute-only plan); then 4x the batch under a cap of
# the plain run's peak, offload on, against the plain run's time per sample. Each run's --json and
# --explain-memory under $log/offload_*.
stage_offload() {
  have_build || return 1
  local rc=0 r b=${OFFLOAD_BATCH:-64} frac=${OFFLOAD_BUDGET:-0.6}
  local vgg=("$build/bin/vgg_ckpt" --device cuda --steps 6 --tf32 conv --explain-memory)
  timeout 120 "${vgg[@]}" --batch-size "$b" --checkpoint none --json "$log/offload_none.json" >"$log/offload_none.log" 2>&1
  r=$?
  note "offload: vgg16 B=$b, no checkpointing: exit $r; $(grep -E '^median step' "$log/offload_none.log" | tail -1)"
  [ $r -ne 0 ] && return 1
  local peak budget
  peak=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['peak_in_use_bytes'])" "$log/offload_none.json")
  # The fixed part and OFFLOAD_BUDGET of the activations above it.
  budget=$("$py" -c "import json,sys; j=json.load(open(sys.argv[1])); f=j['fixed_bytes']; print(int(f + $frac * (j['peak_in_use_bytes'] - f)))" \
    "$log/offload_none.json")
  for o in on off; do
    timeout 150 "${vgg[@]}" --batch-size "$b" --checkpoint "budget=$budget" --offload $o --json "$log/offload_budget_$o.json" \
      >"$log/offload_budget_$o.log" 2>&1
    r=$?
    note "offload: vgg16 B=$b, budget $budget (x$frac of plain), --offload $o: exit $r; $(grep -E '^plan budget|^median step' "$log/offload_budget_$o.log" | tr '\n' ' ')"
    [ $r -ne 0 ] && rc=1
  done
  timeout 240 "${vgg[@]}" --batch-size $((4 * b)) --memory-limit "$peak" --checkpoint "budget=$peak" --offload on \
    --json "$log/offload_4x.json" >"$log/offload_4x.log" 2>&1
  r=$?
  note "offload: vgg16 B=$((4 * b)) under the plain B=$b run's peak ($peak bytes), --offload on: exit $r; $(grep -E '^plan budget|^median step' "$log/offload_4x.log" | tr '\n' ' ')"
  [ $r -ne 0 ] && rc=1
  "$py" - "$log" "$b" >>"$log/summary.txt" <<'PY'
import json, os, sys
log, b = sys.argv[1], int(sys.argv[2])
def rd(n):
    p = os.path.join(log, n)
    return json.load(open(p)) if os.path.exists(p) else None
none, on, off, four = rd("offload_none.json"), rd("offload_budget_on.json"), rd("offload_budget_off.json"), rd("offload_4x.json")
if on and off:
    print(f"  equal budgets: offload on {on['median_step_ms']:.1f} ms ({on['plan']}), off {off['median_step_ms']:.1f} ms: "
          f"on/off {on['median_step_ms'] / off['median_step_ms']:.3f}; host {on.get('host_peak_in_use_bytes')} bytes, "
          f"link {on.get('host_link_bytes_per_ms')} B/ms, unhidden copies predicted {on.get('offload_ms')} ms")
if none and four:
    per = lambda j, n: j['median_step_ms'] / n
    print(f"  4x batch: {per(four, 4 * b):.3f} ms/sample against {per(none, b):.3f} without checkpointing "
          f"({per(four, 4 * b) / per(none, b):.3f}x; the issue asks <= 1.15), peak {four['peak_in_use_bytes']} of {none['peak_in_use_bytes']}")
PY
  return $rc
}

# Issue 35 on the GPU: GPT-2 124M (B=PRECISION_GPT_BATCH, default 4, T=1024) in fp32, tf32 and
# bf16, and VGG16 224 (B=PRECISION_VGG_BATCH, default 64) in tf32 and bf16, each our JSON record;
# the summary gives tokens or samples per second, the peak in use against the prediction, and
# bf16's speed and activation bytes against fp32's (the issue: at least 3x the tokens/s, about half
# the activations). About 3 minutes.
stage_precision() {
  have_build || return 1
  local rc=0 r p gb=${PRECISION_GPT_BATCH:-4} vb=${PRECISION_VGG_BATCH:-64}
  for p in fp32 tf32 bf16; do
    timeout 100 "$build/bin/gpt_train" --device cuda --config gpt2 --batch-size "$gb" --seq-len 1024 --steps 12 \
      --precision $p --json "$log/precision_gpt2_$p.json" >"$log/precision_gpt2_$p.log" 2>&1
    r=$?
    note "precision: gpt2 B=$gb T=1024 $p: exit $r; $(grep -E '^median step' "$log/precision_gpt2_$p.log" | tail -1)"
    [ $r -ne 0 ] && rc=1
  done
  # The head fused into the loss (issue 37, Note [chunked classifier]): the logits never held.
  timeout 100 "$build/bin/gpt_train" --device cuda --config gpt2 --batch-size "$gb" --seq-len 1024 --steps 12 \
    --precision bf16 --fused-head on --json "$log/precision_gpt2_bf16_fused.json" >"$log/precision_gpt2_bf16_fused.log" 2>&1
  r=$?
  note "precision: gpt2 B=$gb T=1024 bf16 --fused-head on: exit $r; $(grep -E '^median step' "$log/precision_gpt2_bf16_fused.log" | tail -1)"
  [ $r -ne 0 ] && rc=1
  # c_fc and its GELU as one cuBLASLt product (issue 37, Note [fused gelu]).
  timeout 100 "$build/bin/gpt_train" --device cuda --config gpt2 --batch-size "$gb" --seq-len 1024 --steps 12 \
    --precision bf16 --fused-gelu on --json "$log/precision_gpt2_bf16_gelu.json" >"$log/precision_gpt2_bf16_gelu.log" 2>&1
  r=$?
  note "precision: gpt2 B=$gb T=1024 bf16 --fused-gelu on: exit $r; $(grep -E '^median step' "$log/precision_gpt2_bf16_gelu.log" | tail -1)"
  [ $r -ne 0 ] && rc=1
  # Each block's first residual add and ln_2 in one pass (issue 37, Note [fused residual layer_norm]).
  timeout 100 "$build/bin/gpt_train" --device cuda --config gpt2 --batch-size "$gb" --seq-len 1024 --steps 12 \
    --precision bf16 --fused-residual on --json "$log/precision_gpt2_bf16_resid.json" >"$log/precision_gpt2_bf16_resid.log" 2>&1
  r=$?
  note "precision: gpt2 B=$gb T=1024 bf16 --fused-residual on: exit $r; $(grep -E '^median step' "$log/precision_gpt2_bf16_resid.log" | tail -1)"
  [ $r -ne 0 ] && rc=1
  for p in tf32 bf16; do
    timeout 100 "$build/bin/vgg_ckpt" --device cuda --image-size 224 --batch-size "$vb" --steps 8 --tiles off --precision $p \
      --json "$log/precision_vgg16_$p.json" >"$log/precision_vgg16_$p.log" 2>&1
    r=$?
    note "precision: vgg16 224 B=$vb $p: exit $r; $(grep -E '^median step' "$log/precision_vgg16_$p.log" | tail -1)"
    [ $r -ne 0 ] && rc=1
  done
  "$py" - "$log" >>"$log/summary.txt" <<'PY'
import json, os, sys
log = sys.argv[1]
def rd(n):
    p = os.path.join(log, n)
    return json.load(open(p)) if os.path.exists(p) else None
for model in ("gpt2", "vgg16"):
    runs = {p: rd(f"precision_{model}_{p}.json") for p in ("fp32", "tf32", "bf16")}
    for p, j in runs.items():
        if j:
            # The host's time to issue the step against the step (docs/gpt.md, "The cost of an op"):
            # near 1, the GPU waits for the host and a CUDA graph would pay.
            issue = j.get("median_step_issue_ms")
            print(f"  {model} {p}: {j['median_step_ms']:.1f} ms a step, peak {j['peak_in_use_bytes']} "
                  f"(predicted {j['predicted_peak_bytes']}), fixed {j['fixed_bytes']}; issued in "
                  f"{issue if issue is not None else float('nan'):.1f} ms "
                  f"({(issue or float('nan')) / j['median_step_ms']:.2f} of the step)")
            # Where the run's time outside its steps went (apps/common/phases.h; item 22).
            ph = j.get("phases_ms")
            if ph:
                print("    wall time: " + ", ".join(f"{k} {v / 1e3:.1f} s" for k, v in ph.items() if v >= 0) +
                      f" (the plan's pre-flight {j['plan_preflight_ms'] / 1e3:.1f} s, measuring "
                      f"{j['plan_measure_ms'] / 1e3:.1f} s)")
    base = runs["fp32"] or runs["tf32"]
    low = runs["bf16"]
    if base and low:
        act = lambda j: j["peak_in_use_bytes"] - j["fixed_bytes"]
        print(f"  {model} bf16 against {base['precision']}: {base['median_step_ms'] / low['median_step_ms']:.2f}x the speed, "
              f"activations {act(low) / max(act(base), 1):.3f}x")
fused, low = rd("precision_gpt2_bf16_fused.json"), rd("precision_gpt2_bf16.json")
if fused and low:
    print(f"  gpt2 bf16 --fused-head on: {fused['median_step_ms']:.1f} ms a step ({low['median_step_ms'] / fused['median_step_ms']:.2f}x "
          f"the speed of lm_head + cross_entropy), peak {fused['peak_in_use_bytes']} (predicted {fused['predicted_peak_bytes']}) "
          f"against {low['peak_in_use_bytes']}")
gelu = rd("precision_gpt2_bf16_gelu.json")
if gelu and low:
    print(f"  gpt2 bf16 --fused-gelu on: {gelu['median_step_ms']:.1f} ms a step ({low['median_step_ms'] / gelu['median_step_ms']:.2f}x "
          f"the speed of linear + gelu), losses {gelu['losses'][-1]:.4f} against {low['losses'][-1]:.4f}")
resid = rd("precision_gpt2_bf16_resid.json")
if resid and low:  # the same bits: the losses must be equal
    print(f"  gpt2 bf16 --fused-residual on: {resid['median_step_ms']:.1f} ms a step ({low['median_step_ms'] / resid['median_step_ms']:.2f}x "
          f"the speed of add + layer_norm), losses equal: {resid['losses'] == low['losses']}")
PY
  return $rc
}

# Issue 36 (docs/gpu-queue.md item 13): the batch-64 cliff (VGG16 224: 31.1 ms a step at B 32,
# 80.0 ms at B 64 on an H200). vgg_ckpt at B 32 and 64, at 64 with CLIFF_LIMIT (default 8GiB) of
# cuDNN workspace instead of 1 GiB, and at 64 with --prefetch off, each with --conv-algos and its
# --json: the summary gives ms per sample, cudaMalloc calls and reserved bytes per step after the
# first, the wait for data, and the layers whose algorithm differs between B 32 and 64 and between
# the two limits. CLIFF_DEVICE (default cuda) and CLIFF_MODEL_ARGS (default --image-size 224) run
# it elsewhere: CLIFF_DEVICE=cpu CLIFF_MODEL_ARGS="--width-div 16 --image-size 32" on a CPU build.
# About 3 minutes on the H200 (each run spends 25 to 40 s planning).
stage_cliff() {
  have_build || return 1
  local rc=0 r name b lim extra
  # shellcheck disable=SC2206
  local vgg=("$build/bin/vgg_ckpt" --device "${CLIFF_DEVICE:-cuda}" ${CLIFF_MODEL_ARGS:---image-size 224}
             --steps "${CLIFF_STEPS:-8}" --tf32 conv --conv-algos --tiles off)
  for spec in "b32:32::" "b64:64::" "b64_limit:64:${CLIFF_LIMIT:-8GiB}:" "b64_no_prefetch:64::--prefetch off"; do
    IFS=: read -r name b lim extra <<<"$spec"
    # shellcheck disable=SC2086
    timeout "${CLIFF_TIMEOUT:-150}" "${vgg[@]}" --batch-size "$b" ${lim:+--conv-workspace-limit "$lim"} $extra \
      --json "$log/cliff_$name.json" >"$log/cliff_$name.log" 2>&1
    r=$?
    note "cliff: vgg16 B=$b${lim:+, workspace limit $lim}${extra:+, $extra}: exit $r; $(grep -E '^median step' "$log/cliff_$name.log" | tail -1)"
    [ $r -ne 0 ] && rc=1
  done
  "$py" - "$log" >>"$log/summary.txt" 2>&1 <<'PY'
import json, os, statistics, sys
log = sys.argv[1]
def rd(name):
    p = os.path.join(log, f"cliff_{name}.json")
    return json.load(open(p)) if os.path.exists(p) else None
runs = {n: rd(n) for n in ("b32", "b64", "b64_limit", "b64_no_prefetch")}
def gib(b): return f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"
def after_first(v): return v[1:] if len(v) > 1 else v
for name, j in runs.items():
    if not j:
        print(f"  {name}: no record")
        continue
    b = j["batch_size"]
    allocs = after_first(j.get("step_system_allocs", []))
    reserved = after_first(j.get("step_peak_reserved_bytes", []))
    in_use = after_first(j.get("step_peak_in_use_bytes", []))
    data = after_first(j.get("step_data_ms", []))
    print(f"  {name}: {j['median_step_ms']:.1f} ms a step, {j['median_step_ms'] / b:.3f} ms/sample; cudaMalloc per step "
          f"after the first {allocs}; peak in use {gib(max(in_use or [0]))}, reserved {gib(max(reserved or [0]))} "
          f"(predicted {gib(j['predicted_peak_bytes'])}); data wait median {statistics.median(data or [0]):.2f} ms; "
          f"prefetch {j.get('prefetch')}; workspace limit {gib(j.get('conv_workspace_limit_bytes', 0))}")
    ph = j.get("phases_ms")  # where the run's time outside its steps went (item 22)
    if ph:
        print("    wall time: " + ", ".join(f"{k} {v / 1e3:.1f} s" for k, v in ph.items() if v >= 0) +
              f" (the plan's pre-flight {j['plan_preflight_ms'] / 1e3:.1f} s, measuring {j['plan_measure_ms'] / 1e3:.1f} s)")
# The step's own choices (x's batch = the step's), by layer shape and pass.
def choices(j):
    if not j:
        return {}
    b = j["micro_batch"]
    return {(tuple(a["x"][1:]), tuple(a["w"]), a["stride"], a["pad"], a["pass"]): a
            for a in j.get("conv_algorithms", []) if a["x"][0] == b}
def differ(a, b, what):
    ca, cb = choices(runs[a]), choices(runs[b])
    if not ca or not cb:
        print(f"  {what}: no conv_algorithms to compare")
        return []
    rows = []
    for key in sorted(set(ca) & set(cb)):
        x, y = ca[key], cb[key]
        if (x["algo_name"], x["math"]) != (y["algo_name"], y["math"]):
            rows.append(f"x[1:] {list(key[0])} w {list(key[1])} {key[4]}: {x['algo_name']} ({x['math']}, {gib(x['workspace_bytes'])}) "
                        f"-> {y['algo_name']} ({y['math']}, {gib(y['workspace_bytes'])})"
                        + ("; passed over at " + b + ": " + ", ".join(f"{s['algo_name']} ({s['why']}, {gib(s['workspace_bytes'])})"
                                                                     for s in y["skipped"]) if y["skipped"] else ""))
    print(f"  {what}: {len(rows)} of {len(set(ca) & set(cb))} (layer, pass) differ")
    for r in rows:
        print("    " + r)
    return rows
d1 = differ("b32", "b64", "algorithms B=32 -> B=64")
d2 = differ("b64", "b64_limit", "algorithms B=64 -> B=64 with the larger workspace limit")
over = sum(1 for a in choices(runs["b64"]).values() for s in a["skipped"] if s["why"] == "workspace over the limit")
r32, r64, rl = runs["b32"], runs["b64"], runs["b64_limit"]
if r32 and r64:
    ratio = (r64["median_step_ms"] / 64) / (r32["median_step_ms"] / 32)
    allocs64 = sum(after_first(r64.get("step_system_allocs", [])))
    print(f"cliff: ms/sample B=64 / B=32 = {ratio:.2f}; B=64 with the larger limit "
          f"{(rl['median_step_ms'] / 64) / (r32['median_step_ms'] / 32) if rl else float('nan'):.2f}; "
          f"{len(d1)} (layer, pass) change algorithm 32->64, {len(d2)} with the larger limit; "
          f"{over} choices at B=64 passed over a faster algorithm for its workspace; "
          f"cudaMalloc calls in B=64's steps after the first: {allocs64}")
PY
  return $rc
}

# Any command with the stages' environment (the build's libraries, NCCL's and cuDNN's, PYTHON),
# after the build is made or unpacked: GPU_VERIFY_CMD="..." bash scripts/gpu_verify.sh exec.
# $build and $log name the build and the log folder for it.
# Issue 36's layout (Note [channels last] in src/ops/conv2d.cpp): per model (LAYOUT_MODELS, default
# "vgg16:64 resnet50:128"), plan none, on bench/suite.py: ours NCHW and NHWC in TF32 convolutions,
# PyTorch NCHW; PyTorch autocast(bfloat16) + channels_last and ours --precision bf16 --layout nhwc.
# About 4 minutes a model. The summary gives each run's step time and peak, and our NHWC's and
# bf16's time over PyTorch's at the same math (the issue's targets: at most 0.8x for VGG16, at
# least 1.0x PyTorch's images/s for ResNet-50 in bf16).
stage_layout() {
  have_build || return 1
  local rc=0 r m steps=${LAYOUT_STEPS:-10}
  for m in ${LAYOUT_MODELS:-vgg16:64 resnet50:128}; do
    timeout "${LAYOUT_TIMEOUT:-300}" "$py" bench/suite.py --device cuda --parts vgg --build-dir "$build" \
      --torch-python "$py" --vgg-steps "$steps" --vgg-warmup 2 --timeout 90 --cudnn-benchmark off --tf32 conv \
      --plans none --nhwc --torch-bf16 --fuse-relu --model "${m%%:*}" --batch-size "${m##*:}" --out "$log/layout.jsonl" \
      >>"$log/layout.log" 2>&1
    r=$?
    note "layout ${m%%:*} batch ${m##*:}: NCHW, NHWC, bf16 NHWC against PyTorch: exit $r"
    [ $r -ne 0 ] && rc=1
  done
  "$py" - "$log/layout.jsonl" >>"$log/summary.txt" <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
for r in recs:
    pk = r.get("peak_in_use_bytes")
    print(f"  {r['framework']:11} {r['workload']:24} {r.get('layout', '?'):4} {r.get('precision', '?'):5} "
          f"{'fused' if r.get('fuse_relu') else '     '} "
          + (f"{1000 * r['median_step_s']:8.1f} ms {pk / 2**30 if pk else float('nan'):6.2f} GiB" if not r.get("error")
             else "error: " + r["error"][:150]))
def find(w, fw, layout, prec, fused=False):
    for r in recs:
        if ((r["workload"], r["framework"], r.get("layout"), r.get("precision"), bool(r.get("fuse_relu"))) ==
                (w, fw, layout, prec, fused) and not r.get("error")):
            return r["median_step_s"]
for w in sorted({r["workload"] for r in recs}):
    torch_tf32, torch_bf16 = find(w, "pytorch", "nchw", "tf32"), find(w, "pytorch", "nhwc", "bf16")
    for label, ours, ref in (("ours NCHW tf32", find(w, "libminigrad", "nchw", "tf32"), torch_tf32),
                             ("ours NHWC tf32", find(w, "libminigrad", "nhwc", "tf32"), torch_tf32),
                             ("ours NHWC bf16", find(w, "libminigrad", "nhwc", "bf16"), torch_bf16),
                             ("ours NHWC tf32 fused ReLUs", find(w, "libminigrad", "nhwc", "tf32", True), torch_tf32),
                             ("ours NHWC bf16 fused ReLUs", find(w, "libminigrad", "nhwc", "bf16", True), torch_bf16)):
        if ours and ref:
            print(f"  {w}: {label} / PyTorch at the same math: {ours / ref:.2f}x its step time")
PY
  return $rc
}

stage_exec() {
  have_build || return 1
  build="$build" log="$log" bash -c "${GPU_VERIFY_CMD:?exec: set GPU_VERIFY_CMD}"
  local r=$?
  note "exec: exit $r"
  return $r
}

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build test)
for s in "${stages[@]}"; do
  case "$s" in
    build | test | quick | sanitize | bench | gpt | gpt_batch | peers | cnn | memory_record | overlap | offload | precision | cliff | layout | pack | exec) "stage_$s" || status=1 ;;
    *) echo "gpu_verify.sh: unknown stage '$s' (expected build, test, quick, sanitize, bench, gpt, gpt_batch, peers, cnn, memory_record, overlap, offload, precision, cliff, layout, pack or exec)" >&2; exit 2 ;;
  esac
done
exit $status
