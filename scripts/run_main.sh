#!/usr/bin/env bash
# The main job of the README: set up (install, configure, build), then the experiment of the
# gradient-accumulation tutorials on MNIST: MLP 784-512-512-10, SGD, batch 64 against batch 16
# with 4 micro-batches accumulated, from the same seed. With exact accumulation both runs end
# with the same weights (up to float rounding); the usual "divide each loss by N" recipe does not
# (its last, shorter window of each epoch is weighted wrongly).
# Real digits are used when ../shared/data/mnist is present (first 8,000 train, last 2,000 held
# out); otherwise generated MNIST-like data, and the output says which. Training uses 7,992
# samples, not a multiple of 64, so each epoch ends with a short window (16+16+16+8 samples).
# Over many more steps, float rounding can eventually flip a ReLU whose input is within rounding
# of 0, after which any two summation orders drift apart (docs/accumulation.md); one epoch is
# the demonstration the tutorials make.
# Environment: EPOCHS (default 1), DEVICE (default auto), OUT (default runs/main).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bin=${BUILD_DIR:-build}/bin
out=${OUT:-runs/main}
epochs=${EPOCHS:-1}
mkdir -p "$out"
common=(--epochs "$epochs" --limit-train 7992 --lr 0.01 --momentum 0.9 --seed 1 --device "${DEVICE:-auto}")

echo "== batch 64 =="
"$bin/mnist_ga" "${common[@]}" --batch-size 64 --accum 1 --save-dir "$out/b64" --json "$out/b64.json"
echo "== batch 16 x 4 accumulated (normalised by samples) =="
"$bin/mnist_ga" "${common[@]}" --batch-size 16 --accum 4 --save-dir "$out/b16x4" --json "$out/b16x4.json" \
  --compare "$out/b64/epoch_${epochs}.safetensors"
echo "== batch 16 x 4, the usual recipe: mean loss / N =="
"$bin/mnist_ga" "${common[@]}" --batch-size 16 --accum 4 --divide-by-n --json "$out/b16x4_divn.json" \
  --compare "$out/b64/epoch_${epochs}.safetensors"
echo "summaries: $out/*.json"
