#!/usr/bin/env bash
# Hostile flags (issue 15): the apps' command lines, as rows of one table, so the list only grows
# (the files the library reads have theirs: tests/test_hostile.cpp). Each row runs an app under
# `timeout` with a bad flag value, or a bad file or folder named by a flag, and passes when the app
#   - exits by itself (not killed by a signal, not timed out) with a non-zero status, and
#   - prints the row's fragment and the flag's name.
# ctest runs it when the apps are built (tests/CMakeLists.txt):
#   tests/hostile_flags.sh build/bin/mnist_ga build/bin/vgg_ckpt build/bin/gpt_train
# Every run is small (generated data, a 64th-width VGG on 32x32 images): the table takes seconds.
set -u
MNIST_GA=${1:?usage: hostile_flags.sh MNIST_GA VGG_CKPT}
VGG_CKPT=${2:?usage: hostile_flags.sh MNIST_GA VGG_CKPT GPT_TRAIN}
GPT_TRAIN=${3:?usage: hostile_flags.sh MNIST_GA VGG_CKPT GPT_TRAIN}
T=$(mktemp -d "${TMPDIR:-/tmp}/mg_hostile_flags.XXXXXX")
trap 'rm -rf "$T"' EXIT
export OMP_NUM_THREADS=2

# Runs that do work do as little as possible.
M="--synthetic --limit-train 64 --limit-test 32 --epochs 1 --batch-size 32"  # mnist_ga, generated data
MD="--limit-train 8 --limit-test 8 --epochs 1 --batch-size 8"                 # mnist_ga with --data
V="--width-div 64 --image-size 32 --batch-size 2 --steps 1"                   # vgg_ckpt
G="--steps 1 --batch-size 2 --seq-len 8"                                       # gpt_train, tiny

die() { echo "hostile_flags: setup: $*" >&2; exit 1; }

# ---- fixtures ------------------------------------------------------------------------------------
# Valid runs to corrupt: weights and state of an SGD run and of an Adam run.
"$MNIST_GA" $M --save-dir "$T/sgd" >/dev/null || die "mnist_ga run failed"
"$MNIST_GA" $M --optimizer adam --save-dir "$T/adam" >/dev/null || die "mnist_ga adam run failed"
state=$T/sgd/epoch_1.state.safetensors

# Safetensors files: garbage; a bfloat16 tensor where the model has float32; a state whose
# epoch count is not a number (same length: the header stays valid); a state holding NaN.
printf 'garbage%.0s' $(seq 100) > "$T/garbage.safetensors"
cp "$T/garbage.safetensors" "$T/garbage.state.safetensors"
le64() { local v=$1 i; for i in 0 1 2 3 4 5 6 7; do printf "\\x$(printf %02x $(( (v >> (8 * i)) & 255 )))"; done; }
json='{"1.weight":{"dtype":"BF16","shape":[512,784],"data_offsets":[0,802816]}}'
{ le64 ${#json}; printf '%s' "$json"; head -c 802816 /dev/zero; } > "$T/bf16.safetensors"
LC_ALL=C sed 's/"minigrad.epoch":"1"/"minigrad.epoch":"-"/' "$state" > "$T/bad_epoch.state.safetensors"
cmp -s "$state" "$T/bad_epoch.state.safetensors" && die "the epoch count was not found in $state"
header_len=$(od -An -t u8 -N8 "$state" | tr -d ' ')
cp "$state" "$T/nan.state.safetensors"
printf '\x00\x00\xc0\x7f' | dd of="$T/nan.state.safetensors" bs=1 seek=$((8 + header_len)) conv=notrunc status=none
cp "$T/sgd/epoch_1.safetensors" "$T/weights.state.safetensors"  # weights, named as a state
mkfifo "$T/fifo.state.safetensors" "$T/fifo.safetensors"
mkdir -p "$T/folder.state.safetensors" "$T/empty"
echo "a file" > "$T/file"

# MNIST folders of 10 images: a valid one, and one damaged file in a copy of it each.
idx_images() { printf '\x00\x00\x08\x03\x00\x00\x00\x0a\x00\x00\x00\x1c\x00\x00\x00\x1c'; head -c 7840 /dev/zero; }
idx_labels() { printf '\x00\x00\x08\x01\x00\x00\x00\x0a'; printf '\x00\x01\x02\x03\x04\x05\x06\x07\x08\x09'; }
mnist_dir() {
  mkdir -p "$1"
  for s in train t10k; do
    idx_images | gzip -c > "$1/$s-images-idx3-ubyte.gz"
    idx_labels | gzip -c > "$1/$s-labels-idx1-ubyte.gz"
  done
}
mnist_dir "$T/mnist"
"$MNIST_GA" --data "$T/mnist" $MD >/dev/null || die "mnist_ga on $T/mnist failed"
mnist_dir "$T/mnist_trailing"; printf 'garbage' >> "$T/mnist_trailing/train-images-idx3-ubyte.gz"
mnist_dir "$T/mnist_label"
{ printf '\x00\x00\x08\x01\x00\x00\x00\x0a'; printf '\x00\x01\x02\x0c\x04\x05\x06\x07\x08\x09'; } | gzip -c > "$T/mnist_label/train-labels-idx1-ubyte.gz"
mnist_dir "$T/mnist_3gib"
printf '\x00\x00\x08\x03\x00\x3d\x09\x00\x00\x00\x00\x1c\x00\x00\x00\x1c' | gzip -c > "$T/mnist_3gib/train-images-idx3-ubyte.gz"
mnist_dir "$T/mnist_fifo"; rm "$T/mnist_fifo/train-images-idx3-ubyte.gz"; mkfifo "$T/mnist_fifo/train-images-idx3-ubyte.gz"
mnist_dir "$T/mnist_no_t10k"; rm "$T/mnist_no_t10k"/t10k-*
mnist_dir "$T/mnist_magic"; idx_labels | gzip -c > "$T/mnist_magic/t10k-images-idx3-ubyte.gz"

# llm.c token files: a header of 256 little-endian int32 (magic 20240520, version 1, count), then
# uint16 tokens. Valid (10 tokens), a wrong magic, a count the file does not hold, a token past the
# tiny vocabulary of 512.
le32() { local v=$1 i; for i in 0 1 2 3; do printf "\\x$(printf %02x $(( (v >> (8 * i)) & 255 )))"; done; }
tokfile() {  # MAGIC VERSION COUNT TOKEN...
  local magic=$1 version=$2 count=$3; shift 3
  { le32 "$magic"; le32 "$version"; le32 "$count"; head -c 1012 /dev/zero
    for t in "$@"; do printf "\\x$(printf %02x $((t & 255)))\\x$(printf %02x $((t >> 8)))"; done; }
}
tokfile 20240520 1 40 $(seq 1 40) > "$T/tokens.bin"
"$GPT_TRAIN" $G --data "$T/tokens.bin" >/dev/null || die "gpt_train on $T/tokens.bin failed"
tokfile 12345 1 40 $(seq 1 40) > "$T/tokens_magic.bin"
tokfile 20240520 1 41 $(seq 1 40) > "$T/tokens_count.bin"
tokfile 20240520 1 40 $(seq 1 39) 600 > "$T/tokens_vocab.bin"
tokfile 20240520 1 10 $(seq 1 10) > "$T/tokens_few.bin"

# Hugging Face GPT-2 folders for gpt_train --init-from: a config of another activation; a config
# without weights beside it.
mkdir -p "$T/hf_relu" "$T/hf_noweights"
echo '{"vocab_size": 512, "n_positions": 64, "n_layer": 2, "n_head": 4, "n_embd": 64, "activation_function": "relu"}' > "$T/hf_relu/config.json"
echo '{"vocab_size": 512, "n_positions": 64, "n_layer": 2, "n_head": 4, "n_embd": 64}' > "$T/hf_noweights/config.json"

# Image folders for vgg_ckpt: three classes; two classes of one image; two classes of garbage.
mkdir -p "$T/img3/a" "$T/img3/b" "$T/img3/c" "$T/img1/a" "$T/img1/b" "$T/imgbad/a" "$T/imgbad/b"
for d in img3/a img3/b img3/c img1/a imgbad/a imgbad/b; do echo "not an image" > "$T/$d/x.jpg"; done

# ---- the table -----------------------------------------------------------------------------------
# app | the flag the message must name | a fragment of the message | the arguments (bash words)
rows=$(cat <<'TABLE'
mnist_ga | --epochs       | Value 0 not in range 1 to 1048576          | --epochs 0
mnist_ga | --epochs       | Value -1 not in range                      | --epochs -1
mnist_ga | --epochs       | Value 1048577 not in range                 | --epochs 1048577
mnist_ga | --epochs       | not in range                               | --epochs 99999999999999999999
mnist_ga | --epochs       | Value abc not in range                     | --epochs abc
mnist_ga | --epochs       | required                                   | --epochs
mnist_ga | --batch-size   | Value 0 not in range 1 to 16777216         | --batch-size 0
mnist_ga | --batch-size   | Value 9223372036854775807 not in range     | --batch-size 9223372036854775807
mnist_ga | --batch-size   | Value 9223372036854775806 not in range     | --batch-size 9223372036854775806
mnist_ga | --batch-size   | Value -5 not in range                      | --batch-size -5
mnist_ga | --batch-size   | Value 1.5 not in range                     | --batch-size 1.5
mnist_ga | --accum        | Value 0 not in range 1 to 1048576          | --accum 0
mnist_ga | --accum        | Value 2305843009213693952 not in range     | --accum 2305843009213693952
mnist_ga | --accum        | Value 9223372036854775807 not in range     | --accum 9223372036854775807
mnist_ga | --accum        | excludes --accum-schedule                  | --accum 2 --accum-schedule 0:2
mnist_ga | --accum-schedule | N must be >= 1                           | $M --accum-schedule 0:0
mnist_ga | --accum-schedule | epoch 0 appears twice                    | $M --accum-schedule 0:8,0:2
mnist_ga | --accum-schedule | is not a non-negative integer            | $M --accum-schedule abc
mnist_ga | --accum-schedule | is not a non-negative integer            | $M --accum-schedule 0:-2
mnist_ga | --accum-schedule | empty entry (stray comma)                | $M --accum-schedule 0:8,
mnist_ga | --accum-schedule | is not "epoch:N"                         | $M --accum-schedule 0:8,4
mnist_ga | --accum-schedule | is too large                             | $M --accum-schedule 0:99999999999
mnist_ga | --accum-schedule | an empty value names nothing             | $M --accum-schedule ''
mnist_ga | --lr           | Value nan is not a finite number           | --lr nan
mnist_ga | --lr           | Value NaN is not a finite number           | --lr NaN
mnist_ga | --lr           | Value inf is not a finite number           | --lr inf
mnist_ga | --lr           | Value -inf is not a finite number          | --lr -inf
mnist_ga | --lr           | Value -1 is not a finite number in [0      | --lr -1
mnist_ga | --lr           | Value 1e39 is not a finite number          | --lr 1e39
mnist_ga | --lr           | Value abc is not a finite number           | --lr abc
mnist_ga | --lr           | is not a finite number                     | --lr ''
mnist_ga | --lr           | Value 0x1p200 is not a finite number       | --lr 0x1p200
mnist_ga | --momentum     | Value 1.5 is not a finite number in [0, 1] | --momentum 1.5
mnist_ga | --momentum     | Value -0.1 is not a finite number          | --momentum -0.1
mnist_ga | --momentum     | Value nan is not a finite number           | --momentum nan
mnist_ga | --clip-norm    | Value -1 is not a finite number            | --clip-norm -1
mnist_ga | --clip-norm    | Value nan is not a finite number           | --clip-norm nan
mnist_ga | --clip-norm    | Value inf is not a finite number           | --clip-norm inf
mnist_ga | --seed         | Value -1 is not an integer in [0, 2^64)    | --seed -1
mnist_ga | --seed         | Value 18446744073709551616 is not an integer | --seed 18446744073709551616
mnist_ga | --seed         | Value abc is not an integer                | --seed abc
mnist_ga | --seed         | Value 1.5 is not an integer                | --seed 1.5
mnist_ga | --device       | unknown device 'bogus'                     | $M --device bogus
mnist_ga | --device       | unknown device 'cuda:x'                    | $M --device cuda:x
mnist_ga | --device       | unknown device 'cuda:-1'                   | $M --device cuda:-1
mnist_ga | --device       | an empty value names nothing               | $M --device ''
mnist_ga | --dataset      | bogus not in {mnist,fashion}               | --dataset bogus
mnist_ga | --optimizer    | rmsprop not in {sgd,adam}                  | --optimizer rmsprop
mnist_ga | --limit-train  | Value -1 not in range                      | --limit-train -1
mnist_ga | --limit-test   | Value 1099511627777 not in range           | --limit-test 1099511627777
mnist_ga | --bogus        | not expected: --bogus                      | --bogus
mnist_ga | --synthetic    | --data excludes --synthetic                | --synthetic --data "$T/mnist"
mnist_ga | --json         | the folder /nonexistent does not exist     | $M --json /nonexistent/x.json
mnist_ga | --json         | is a folder, expected a file name          | $M --json "$T/empty"
mnist_ga | --json         | the folder $T/file does not exist          | $M --json "$T/file/x.json"
mnist_ga | --json         | an empty value names nothing               | $M --json ''
mnist_ga | --save-dir     | filesystem error                           | $M --save-dir "$T/file/sub"
mnist_ga | --save-dir     | an empty value names nothing               | $M --save-dir ''
mnist_ga | --resume       | No such file or directory                  | $M --resume "$T/missing.state.safetensors"
mnist_ga | --resume       | No such file or directory                  | $M --resume "$T/sgd/epoch_9.safetensors"
mnist_ga | --resume       | exceeds the format's limit                 | $M --resume "$T/garbage.state.safetensors"
mnist_ga | --resume       | not a regular file (a FIFO)                | $M --resume "$T/fifo.state.safetensors"
mnist_ga | --resume       | holds no complete epoch_K.state.safetensors | $M --resume "$T/folder.state.safetensors"
mnist_ga | --resume       | holds no complete epoch_K.state.safetensors | $M --resume "$T/empty"
mnist_ga | --resume       | "minigrad.epoch" = "-" is not an integer   | $M --resume "$T/bad_epoch.state.safetensors"
mnist_ga | --resume       | holds nan at element 0                     | $M --resume "$T/nan.state.safetensors"
mnist_ga | --resume       | not a libminigrad training-state file      | $M --resume "$T/weights.state.safetensors"
mnist_ga | --resume       | unexpected tensor "optim.0.exp_avg"        | $M --resume "$T/adam/epoch_1.state.safetensors"
mnist_ga | --resume       | tensor "optim.0.exp_avg" is missing        | $M --optimizer adam --resume "$T/sgd/epoch_1.state.safetensors"
mnist_ga | --resume       | an empty value names nothing               | $M --resume ''
mnist_ga | --compare      | (it has [512, 784] bfloat16)               | $M --compare "$T/bf16.safetensors"
mnist_ga | --compare      | exceeds the format's limit                 | $M --compare "$T/garbage.safetensors"
mnist_ga | --compare      | No such file or directory                  | $M --compare "$T/missing.safetensors"
mnist_ga | --compare      | not a regular file (a FIFO)                | $M --compare "$T/fifo.safetensors"
mnist_ga | --compare      | not a regular file (a folder)              | $M --compare "$T/empty"
mnist_ga | --compare      | has no tensor 1.weight                     | $M --compare "$state"
mnist_ga | --compare      | an empty value names nothing               | $M --compare ''
mnist_ga | --data         | not a folder                               | $MD --data "$T/missing"
mnist_ga | --data         | not a folder                               | $MD --data "$T/file"
mnist_ga | --data         | no MNIST files                             | $MD --data "$T/empty"
mnist_ga | --data         | trailing bytes after the gzip data         | $MD --data "$T/mnist_trailing"
mnist_ga | --data         | label 3 is 12, expected a class in 0..9    | $MD --data "$T/mnist_label"
mnist_ga | --data         | deflate expands at most 1032:1             | $MD --data "$T/mnist_3gib"
mnist_ga | --data         | not a regular file (a FIFO)                | $MD --data "$T/mnist_fifo"
mnist_ga | --data         | missing t10k-                              | $MD --data "$T/mnist_no_t10k"
mnist_ga | --data         | wrong number of dimensions                 | $MD --data "$T/mnist_magic"
mnist_ga | --data         | an empty value names nothing               | $MD --data ''
mnist_ga | --memory-budget | no plan fits a budget of                  | $M --memory-budget 1kB
mnist_ga | --memory-budget | --accum excludes --memory-budget          | $M --memory-budget 1GB --accum 2
mnist_ga | --memory-budget | unknown unit 'apples'                     | $M --memory-budget 12apples
mnist_ga | --memory-limit | cpu out of memory                          | $M --memory-limit 100kB
vgg_ckpt | --model        | not in {vgg16,resnet18,resnet34,resnet50}   | $V --model resnet101
vgg_ckpt | --layout       | nhwq not in {nchw,nhwc}                    | $V --layout nhwq
vgg_ckpt | --memory-budget | no plan fits a budget of                  | $V --layout nhwc --fuse-relu --memory-budget 1kB
vgg_ckpt | --checkpoint   | is below the smallest feasible peak        | $V --model resnet18 --layout nhwc --fuse-relu --checkpoint budget=1B
vgg_ckpt | --checkpoint   | expected none, sqrt, min, segments=K, budget=SIZE | $V --checkpoint bogus
vgg_ckpt | --checkpoint   | segments must be >= 1, got 0               | $V --checkpoint segments=0
vgg_ckpt | --checkpoint   | segments=K needs a positive integer K      | $V --checkpoint segments=x
vgg_ckpt | --checkpoint   | segments=K needs a positive integer K      | $V --checkpoint segments=-3
vgg_ckpt | --checkpoint   | expected a number with an optional unit    | $V --checkpoint budget=abc
vgg_ckpt | --checkpoint   | is below the smallest feasible peak        | $V --checkpoint budget=1B
vgg_ckpt | --checkpoint   | an empty value names nothing               | $V --checkpoint ''
vgg_ckpt | --memory-budget | expected a number with an optional unit   | $V --memory-budget lots
vgg_ckpt | --memory-budget | no plan fits a budget of                  | $V --memory-budget 1kB
vgg_ckpt | --memory-budget | --checkpoint excludes --memory-budget      | $V --memory-budget 1GB --checkpoint sqrt
vgg_ckpt | --memory-budget | an empty value names nothing              | $V --memory-budget ''
vgg_ckpt | --memory-limit | expected a number with an optional unit    | $V --memory-limit -5MB
vgg_ckpt | --memory-limit | an empty value names nothing               | $V --memory-limit ''
vgg_ckpt | --memory-limit | cpu out of memory                          | $V --memory-limit 64kB
vgg_ckpt | --device       | unknown device 'bogus'                     | $V --device bogus
vgg_ckpt | --device       | unknown device 'cuda:-1'                   | $V --device cuda:-1
vgg_ckpt | --batch-size   | Value 0 not in range                       | $V --batch-size 0
vgg_ckpt | --batch-size   | Value 9223372036854775807 not in range     | $V --batch-size 9223372036854775807
vgg_ckpt | --steps        | Value 0 not in range                       | --steps 0
vgg_ckpt | --epochs       | Value 0 not in range                       | --epochs 0
vgg_ckpt | --steps        | excludes --epochs                          | --steps 1 --epochs 1
vgg_ckpt | --width-div    | Value 0 not in range                       | --width-div 0
vgg_ckpt | --width-div    | Value 65 not in range                      | --width-div 65
vgg_ckpt | --image-size   | Value 31 not in range                      | --image-size 31
vgg_ckpt | --image-size   | Value 4097 not in range                    | --image-size 4097
vgg_ckpt | --tf32         | x not in {on,off,conv}                     | --tf32 x
vgg_ckpt | --conv-workspace-limit | expected a number with an optional unit | $V --conv-workspace-limit lots
vgg_ckpt | --conv-workspace-limit | expected a number with an optional unit | $V --conv-workspace-limit -1GiB
vgg_ckpt | --conv-workspace-limit | an empty value names nothing       | $V --conv-workspace-limit ''
vgg_ckpt | --prefetch     | bogus not in {auto,on,off}                 | $V --prefetch bogus
vgg_ckpt | --plan-timings | not in range                               | $V --memory-budget 100MB --plan-timings 0
gpt_train | --plan-timings | two not in range                           | $G --plan-timings two
vgg_ckpt | --data         | is neither a JPEG nor a PNG file           | $V --data "$T/imgbad" --prefetch on
mnist_ga | --prefetch     | yes not in {auto,on,off}                   | $M --prefetch yes
gpt_train | --prefetch    | 1 not in {auto,on,off}                     | $G --prefetch 1
gpt_train | --fused-head  | x not in {on,off}                          | $G --fused-head x
gpt_train | --fused-gelu  | x not in {on,off}                          | $G --fused-gelu x
gpt_train | --fused-residual | 1 not in {on,off}                       | $G --fused-residual 1
gpt_train | --memory-budget | no plan fits a budget of                 | $G --fused-residual on --memory-budget 1kB
gpt_train | --memory-budget | no plan fits a budget of                 | $G --fused-gelu on --memory-budget 1kB
gpt_train | --memory-budget | no plan fits a budget of                 | $G --fused-head on --memory-budget 1kB
gpt_train | --memory-limit | and no plan fits what the device has      | $G --fused-head on --memory-limit 2.2MB
vgg_ckpt | --seed         | Value -1 is not an integer in [0, 2^64)    | --seed -1
vgg_ckpt | --bogus        | not expected: --bogus                      | --bogus
vgg_ckpt | --data         | is not a directory                         | $V --data "$T/missing"
vgg_ckpt | --data         | is not a directory                         | $V --data "$T/file"
vgg_ckpt | --data         | has no class sub-folders                   | $V --data "$T/empty"
vgg_ckpt | --data         | expected 2 class folders, found 3          | $V --data "$T/img3"
vgg_ckpt | --data         | fewer than one batch of 2                  | $V --data "$T/img1"
vgg_ckpt | --data         | is neither a JPEG nor a PNG file           | $V --data "$T/imgbad"
vgg_ckpt | --data         | an empty value names nothing               | $V --data ''
vgg_ckpt | --json         | the folder /nonexistent does not exist     | $V --json /nonexistent/x.json
vgg_ckpt | --json         | is a folder, expected a file name          | $V --json "$T/empty"
vgg_ckpt | --save-dir     | filesystem error                           | $V --save-dir "$T/file/sub"
vgg_ckpt | --save-dir     | an empty value names nothing               | $V --save-dir ''
gpt_train | --config      | bogus not in {tiny,small,gpt2,ops}         | $G --config bogus
gpt_train | --seq-len     | is longer than the context of 64           | --steps 1 --seq-len 65
gpt_train | --n-head      | must divide                                | $G --n-head 5
gpt_train | --lr          | is not a finite number                     | $G --lr nan
gpt_train | --checkpoint  | expected none, sqrt, min, segments=K, budget=SIZE | $G --checkpoint bogus
gpt_train | --checkpoint  | is below the smallest feasible peak        | $G --checkpoint budget=1B
gpt_train | --memory-budget | no plan fits a budget of                 | $G --memory-budget 1kB
gpt_train | --memory-limit | cpu out of memory                         | $G --memory-limit 10kB
gpt_train | --memory-limit | and no plan fits what the device has      | $G --memory-limit 2.2MB
gpt_train | --checkpoint  | expected none, sqrt, min, segments=K, budget=SIZE | $G --checkpoint bogus --memory-limit 2.25MB
gpt_train | --memory-budget | --accum excludes --memory-budget         | $G --memory-budget 1GB --accum 2
gpt_train | --data        | cannot open                                | $G --data "$T/missing.bin"
gpt_train | --data        | not a regular file                         | $G --data "$T/empty"
gpt_train | --data        | magic 12345, expected 20240520             | $G --data "$T/tokens_magic.bin"
gpt_train | --data        | the header says 41 tokens                  | $G --data "$T/tokens_count.bin"
gpt_train | --data        | token 600 is outside the vocabulary of 512 | $G --data "$T/tokens_vocab.bin"
gpt_train | --data        | fewer than one step                        | $G --data "$T/tokens_few.bin"
gpt_train | --json        | the folder /nonexistent does not exist     | $G --json /nonexistent/x.json
gpt_train | --device      | unknown device 'bogus'                     | $G --device bogus
gpt_train | --dropout     | is not a finite number in [0, 0.99]        | $G --dropout 1
gpt_train | --dropout     | is not a finite number                     | $G --dropout nan
gpt_train | --init-from   | cannot open                                | $G --init-from "$T/missing_hf"
gpt_train | --init-from   | activation_function                        | $G --init-from "$T/hf_relu"
gpt_train | --init-from   | model.safetensors                          | $G --init-from "$T/hf_noweights"
gpt_train | --init-from   | --config excludes --init-from              | $G --config small --init-from "$T/hf_relu"
gpt_train | --init-from   | excludes --init-from                       | $G --n-layer 3 --init-from "$T/hf_relu"
gpt_train | --timeline    | records the reductions of CUDA tensors     | $G --timeline "$T/trace.json"
vgg_ckpt  | --timeline    | records the reductions of CUDA tensors     | $V --timeline "$T/trace.json"
vgg_ckpt  | --timeline    | an empty value names nothing               | $V --timeline ""
TABLE
)

# Settings read from the environment (mg::dist's): the same checks, the variable as the "flag".
env_rows=$(cat <<'TABLE'
mnist_ga  | MG_DIST_TIMEOUT      | expected a number of seconds > 0 | MG_DIST_TIMEOUT=soon
vgg_ckpt  | MG_DIST_TIMEOUT      | expected a number of seconds > 0 | MG_DIST_TIMEOUT=-1
gpt_train | MG_DIST_TIMEOUT      | expected a number of seconds > 0 | MG_DIST_TIMEOUT=1e99
mnist_ga  | MG_DIST_WORLD_OF_ONE | expected 1                       | MG_DIST_WORLD_OF_ONE=yes
vgg_ckpt  | MG_DIST_WORLD_OF_ONE | expected 1                       | MG_DIST_WORLD_OF_ONE=2
TABLE
)

# ---- the runs ------------------------------------------------------------------------------------
trim() { local s=$1; s=${s#"${s%%[![:space:]]*}"}; printf '%s' "${s%"${s##*[![:space:]]}"}"; }
n=0 failed=0
# check APP FLAG FRAGMENT ARGS [VAR=VALUE]: runs the app (with the variable set, when given).
check() {
  local app=$1 flag=$2 fragment=${3//'$T'/$T} args=$4 setting=${5:-} bin out rc problem
  n=$((n + 1))
  eval "set -- $args"
  case $app in
    mnist_ga) bin=$MNIST_GA ;;
    vgg_ckpt) bin=$VGG_CKPT ;;
    gpt_train) bin=$GPT_TRAIN ;;
    *) echo "hostile_flags: row $n: unknown app '$app'" >&2; failed=$((failed + 1)); return ;;
  esac
  out=$(env ${setting:+"$setting"} timeout -k 5 60 "$bin" "$@" 2>&1 </dev/null)
  rc=$?
  problem=""
  if [ $rc -eq 0 ]; then problem="accepted (exit status 0)"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then problem="HUNG (killed by timeout after 60 s)"
  elif [ $rc -ge 128 ]; then problem="CRASHED (exit status $rc: signal $((rc - 128)))"
  elif [[ $out != *"$fragment"* ]]; then problem="the output lacks \"$fragment\""
  elif [[ $out != *"$flag"* ]]; then problem="the output does not name $flag"
  fi
  if [ -n "$problem" ]; then
    failed=$((failed + 1))
    printf 'FAIL row %d: %s %s %s\n  %s\n  output: %s\n' "$n" "$setting" "$app" "$args" "$problem" \
      "$(printf '%s' "$out" | tail -n 5)"
  fi
}
while IFS='|' read -r app flag fragment args; do
  check "$(trim "$app")" "$(trim "$flag")" "$(trim "$fragment")" "$(trim "$args")"
done <<< "$rows"
while IFS='|' read -r app flag fragment setting; do
  check "$(trim "$app")" "$(trim "$flag")" "$(trim "$fragment")" "" "$(trim "$setting")"
done <<< "$env_rows"
echo "hostile_flags: $n rows (app flags, the files they name, and mg::dist's environment), $failed failed"
[ "$failed" -eq 0 ]
