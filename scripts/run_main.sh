#!/usr/bin/env bash
# The main job of the README: set up (install, configure, build), then the experiment of the
# gradient-accumulation tutorials on MNIST: MLP 784-512-512-10, SGD, batch 64 against batch 16
# with 4 micro-batches accumulated, from the same seed. With exact accumulation both runs end
# with the same weights (up to float rounding); the usual "divide each loss by N" recipe does not
# (its last, shorter window of each epoch is weighted wrongly).
# Real digits are used when ../shared/data/mnist is present (first 8,000 train, last 2,000 held
# out), else MNIST is fetched first where the internet is reachable (scripts/get_data.sh, into
# DATA_DIR); otherwise generated MNIST-like data, and the output says which. Training uses 7,992
# samples, not a multiple of 64, so each epoch ends with a short window (16+16+16+8 samples).
# Over many more steps, float rounding can eventually flip a ReLU whose input is within rounding
# of 0, after which any two summation orders drift apart (docs/accumulation.md); one epoch is
# the demonstration the tutorials make.
# Then the two other techniques, on a scaled VGG16 (width / 8, 64x64 images, generated data,
# apps/vgg_ckpt through mg::Trainer): checkpointing (plan sqrt against none: less memory, the same
# bits), and an effective batch of 64 that does not fit a memory budget of half its plain peak,
# planned jointly (micro-batch, accumulation and checkpoint plan chosen together): the predicted
# and measured peak, and the same bits as the plain batch. One table sums it all up at the end.
# Environment: EPOCHS (default 1), DEVICE (default auto), OUT (default runs/main).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bin=${BUILD_DIR:-build}/bin
out=${OUT:-runs/main}
epochs=${EPOCHS:-1}
mkdir -p "$out"
common=(--epochs "$epochs" --limit-train 7992 --lr 0.01 --momentum 0.9 --seed 1 --device "${DEVICE:-auto}")
# The data: the shared copy (mnist_ga finds it), else MNIST from the internet, else generated.
if ! [ -e ../shared/data/mnist/t10k-images-idx3-ubyte.gz ]; then
  data_dir=${DATA_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/minigrad-data}
  if [ -s "$data_dir/mnist/t10k-labels-idx1-ubyte.gz" ] ||
     { command -v curl >/dev/null && curl -fsI --connect-timeout 3 --max-time 6 \
         https://ossci-datasets.s3.amazonaws.com/mnist/t10k-labels-idx1-ubyte.gz >/dev/null 2>&1 &&
       echo "== fetching MNIST into $data_dir (scripts/get_data.sh) ==" && bash scripts/get_data.sh "$data_dir" mnist; }; then
    common+=(--data "$data_dir/mnist")
  else
    echo "== no MNIST here (../shared/data/mnist) and no internet: mnist_ga trains on generated MNIST-like data =="
  fi
fi

echo "== batch 64 =="
"$bin/mnist_ga" "${common[@]}" --batch-size 64 --accum 1 --save-dir "$out/b64" --json "$out/b64.json"
echo "== batch 16 x 4 accumulated (normalised by samples) =="
"$bin/mnist_ga" "${common[@]}" --batch-size 16 --accum 4 --save-dir "$out/b16x4" --json "$out/b16x4.json" \
  --compare "$out/b64/epoch_${epochs}.safetensors"
echo "== batch 16 x 4, the usual recipe: mean loss / N =="
"$bin/mnist_ga" "${common[@]}" --batch-size 16 --accum 4 --divide-by-n --json "$out/b16x4_divn.json" \
  --compare "$out/b64/epoch_${epochs}.safetensors"

vgg=(--width-div 8 --image-size 64 --steps 4 --seed 1 --device "${DEVICE_VGG:-cpu}")
echo "== VGG16 / 8, 64x64, batch 16: no checkpointing, then the sqrt plan =="
"$bin/vgg_ckpt" "${vgg[@]}" --batch-size 16 --checkpoint none --save-dir "$out/vgg_none" --json "$out/vgg_none.json"
"$bin/vgg_ckpt" "${vgg[@]}" --batch-size 16 --checkpoint sqrt --save-dir "$out/vgg_sqrt" --json "$out/vgg_sqrt.json"
echo "== VGG16 / 8, batch 64: plain, then under a budget of half its peak, planned jointly =="
"$bin/vgg_ckpt" "${vgg[@]}" --batch-size 64 --checkpoint none --save-dir "$out/vgg64" --json "$out/vgg64.json"
half=$(python3 -c "import json; print(json.load(open('$out/vgg64.json'))['peak_in_use_bytes'] // 2)")
"$bin/vgg_ckpt" "${vgg[@]}" --batch-size 64 --memory-budget "$half" --save-dir "$out/vgg64_budget" \
  --json "$out/vgg64_budget.json"

python3 - "$out" <<'PY'
import filecmp, json, os, sys
out = sys.argv[1]
j = lambda name: json.load(open(os.path.join(out, name + ".json")))
same = lambda a, b: filecmp.cmp(os.path.join(out, a, "final.safetensors"), os.path.join(out, b, "final.safetensors"),
                                shallow=False)
mib = lambda b: f"{b / 2**20:.1f} MiB"
b64, acc, divn = j("b64"), j("b16x4"), j("b16x4_divn")
none, sqrt, plain, budget = j("vgg_none"), j("vgg_sqrt"), j("vgg64"), j("vgg64_budget")
def diff(r):
    return f"{r['compare_max_abs_diff']:.3g}"
rows = [
    ("MNIST MLP, batch 16 x 4 accumulated against 64", f"max |w - w64| = {diff(acc)}", "exact (0 or float rounding)"),
    ("  the usual recipe (mean loss / N)", f"max |w - w64| = {diff(divn)}", "off: short windows weighted wrong"),
    ("VGG16/8 batch 16, sqrt plan against none",
     f"peak {mib(sqrt['peak_in_use_bytes'])} vs {mib(none['peak_in_use_bytes'])}, "
     f"step {sqrt['median_step_ms']:.0f} vs {none['median_step_ms']:.0f} ms",
     "same bits" if same("vgg_sqrt", "vgg_none") else "WEIGHTS DIFFER"),
    ("VGG16/8 batch 64 under a budget of " + mib(budget.get("memory_budget_bytes", 0)),
     f"{budget['micro_batch']} x {budget['accumulation']}, plan {budget['plan']}; peak predicted "
     f"{mib(budget['predicted_peak_bytes'])}, measured {mib(budget['peak_in_use_bytes'])} "
     f"(plain batch 64: {mib(plain['peak_in_use_bytes'])})",
     "same bits as plain" if same("vgg64_budget", "vgg64") else "WEIGHTS DIFFER"),
]
w = max(len(r[0]) for r in rows)
print("\n== summary ==")
print(f"MNIST data: {b64['data']}; used {b64['train_samples']} to train, {b64['test_samples']} to test")
for name, what, verdict in rows:
    print(f"{name:<{w}}  {what}  [{verdict}]")
PY
echo "summaries: $out/*.json"
