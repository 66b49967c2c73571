#!/usr/bin/env bash
# ctest's tests against PyTorch references made at test time (test_resnet_torchvision, test_gpt):
# runs the reference script into OUT_DIR, then the test binary with VAR=OUT_DIR.
# Usage: with_reference.sh TEST_BINARY SCRIPT OUT_DIR VAR. Exit 77 (skipped) when the script
# cannot import what it needs (torch, torchvision, safetensors).
set -uo pipefail
bin=$1 script=$2 out=$3 var=$4
python=${PYTHON:-/usr/bin/python3}
[ -x "$python" ] || python=python3
"$python" "$script" "$out"
rc=$?
[ $rc = 0 ] || exit $rc
env "$var=$out" "$bin"
