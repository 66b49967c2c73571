#!/usr/bin/env bash
# The tiled attention kernels of 2026-11-26 (Note [attention tiles] in src/kernels/cuda/attention.cu)
# on a GPU, in one short device call, after `gpu_verify.sh quick` has run the GPU tests:
#   GPU_VERIFY_CMD="bash scripts/gpu_attention_check.sh" bash scripts/gpu_verify.sh exec
# compute-sanitizer's racecheck and memcheck on the tiles' own test case, the kernels alone against
# the row kernels (bench/attention_bench.cpp), GPT-2 124M against PyTorch
# (B = 4, T = 1024) and op by op, and VGG16's step under cuDNN's four modes (deterministic or not,
# heuristic or timed), which bench/compare.py leaves at our defaults. Writes its tables under $OUT (or gpu-results), the logs beside gpu_verify.sh's.
set -uo pipefail
out=${OUT:-gpu-results}
build=${build:-build-gpu}
py=${PYTHON:-python3}
logs=${log:-$out}  # the sanitizers' and the benchmark's own logs (gpu_verify.sh packs its log folder)
mkdir -p "$out" "$logs"
for tool in racecheck memcheck; do
  timeout 120 compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 10 "$build/bin/test_cuda_ops" \
    -tc="*attention's tiles*" >"$logs/sanitizer_$tool.log" 2>&1
  echo "compute-sanitizer $tool (attention's tiles): exit $?; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$logs/sanitizer_$tool.log" | tail -1)"
done
# The kernels alone: the tiles against the row kernels on the same inputs (bench/attention_bench.cpp).
for args in "--batch 4 --seq-len 1024" "--batch 4 --seq-len 1024 --dropout 0.1" "--batch 16 --seq-len 256"; do
  # shellcheck disable=SC2086
  timeout 60 "$build/bin/attention_bench" --device cuda --heads 12 $args
  echo "attention_bench $args: exit $?"
done 2>&1 | tee "$out/attention_bench.txt"
timeout 90 "$py" bench/gpt_bench.py --device cuda --build-dir "$build" --config gpt2 --batch-size 4 --seq-len 1024 \
  --steps 10 --repeats 1 --checkpoint none --torch-python "$py" --sdpa --out "$out/gpt2_bench.jsonl" \
  >"$out/gpt2_bench.md" 2>"$logs/gpt2_bench.log"
echo "gpt2 B=4 T=1024: exit $?"
cat "$out/gpt2_bench.md"
timeout 60 "$build/bin/gpt_train" --device cuda --config gpt2 --batch-size 4 --seq-len 1024 --steps 4 --profile \
  >"$out/gpt2_profile.log" 2>&1
echo "gpt2 --profile: exit $?"
grep -A8 '^op or scope' "$out/gpt2_profile.log"
for f in "" "--cudnn-nondeterministic" "--cudnn-benchmark" "--cudnn-benchmark --cudnn-nondeterministic"; do
  # shellcheck disable=SC2086
  r=$(timeout 45 "$build/bin/vgg_ckpt" --device cuda --batch-size 64 --steps 6 --tf32 conv $f 2>&1 | grep -E '^median step|rror' | head -2)
  echo "vgg16 B=64 ${f:-(defaults)}: $r"
done | tee "$out/vgg16_cudnn_modes.txt"
