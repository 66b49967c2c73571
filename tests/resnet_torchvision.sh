#!/usr/bin/env bash
# ctest's test_resnet_torchvision: makes the reference with torchvision
# (tests/reference/resnet18_torchvision.py), then runs the test binary on it.
# Usage: resnet_torchvision.sh TEST_BINARY SCRIPT OUT_DIR. Exit 77 (skipped) when the script cannot
# import torch, torchvision or safetensors.
set -uo pipefail
bin=$1 script=$2 out=$3
python=${PYTHON:-/usr/bin/python3}
[ -x "$python" ] || python=python3
"$python" "$script" "$out"
rc=$?
[ $rc = 0 ] || exit $rc
MG_RESNET_REFERENCE=$out exec "$bin"
