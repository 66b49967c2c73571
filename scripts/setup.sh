#!/usr/bin/env bash
# Installs what is missing (Debian 12), configures and builds libminigrad into build/.
# Environment: BUILD_DIR (default build), CMAKE_ARGS (extra -D options), MG_SKIP_APT=1 to skip apt,
# MG_EXTRA_PACKAGES (more Debian packages to install, e.g. scripts/fuzz.sh's clang), MG_TEST_DEPS=1
# to install what only the tests use as well (scripts/run_tests.sh sets it): PyTorch, torchvision
# and NumPy for the reference scripts, safetensors and transformers from PyPI. The main job
# (scripts/run_main.sh) needs none of them. Where the CUDA backend is built, the cuDNN frontend's
# headers (PyPI's nvidia-cudnn-frontend) too, for cuDNN's fused attention (docs/cuda.md).
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(build-essential cmake ninja-build pkg-config libeigen3-dev doctest-dev libcli11-dev
      nlohmann-json3-dev zlib1g-dev libstb-dev libjpeg-dev libopenblas-dev libdnnl-dev libopenmpi-dev openmpi-bin
      python3 ${MG_EXTRA_PACKAGES:-})
test_deps=${MG_TEST_DEPS:-0}
[ "$test_deps" = 1 ] && pkgs+=(python3-torch python3-torchvision python3-numpy python3-pip)
if [ "${MG_SKIP_APT:-0}" != 1 ]; then
  missing=()
  for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
  fi
  # The reference scripts' safetensors writer (tests/reference/*.py) and Hugging Face's transformers
  # (tests/reference/gpt2_hf.py; 4.30.2 is the last release that runs on Debian's torch 1.13) are
  # on PyPI only. Without them those tests are skipped, with a message.
  if [ "$test_deps" = 1 ] && ! /usr/bin/python3 -c "import safetensors.torch" >/dev/null 2>&1; then
    echo "setup: installing the safetensors Python package (pip)"
    /usr/bin/python3 -m pip install -q --break-system-packages safetensors ||
      echo "setup: pip could not install safetensors; the PyTorch reference tests will be skipped"
  fi
  # cuDNN's fused attention (src/kernels/cuda/attention_cudnn.cpp) compiles against the cuDNN
  # frontend's C++ headers, which PyPI's wheel puts under site-packages/include (CMake looks there).
  # Without them CMake says so and bf16/f16 attention runs our own kernels: not a build failure.
  cuda_build=0
  case " ${CMAKE_ARGS:-} " in
    *"MINIGRAD_CUDA=OFF"*) ;;
    *) { [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null; } && cuda_build=1 ;;
  esac
  if [ "$cuda_build" = 1 ] && [ -z "${CUDNN_FRONTEND_INCLUDE:-}" ] &&
     ! /usr/bin/python3 -c "import sysconfig, os, sys; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()['purelib'], 'include', 'cudnn_frontend.h')))" 2>/dev/null; then
    echo "setup: installing the cuDNN frontend's headers (pip: nvidia-cudnn-frontend)"
    /usr/bin/python3 -m pip install -q --no-deps --break-system-packages nvidia-cudnn-frontend ||
      echo "setup: pip could not install nvidia-cudnn-frontend; bf16/f16 attention on CUDA will run our own kernels"
  fi
  if [ "$test_deps" = 1 ] && ! /usr/bin/python3 -c "import transformers" >/dev/null 2>&1; then
    echo "setup: installing the transformers Python package 4.30.2 (pip)"
    /usr/bin/python3 -m pip install -q --break-system-packages "transformers==4.30.2" ||
      echo "setup: pip could not install transformers; test_gpt_hf will be skipped"
  fi
fi
build=${BUILD_DIR:-build}
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
[ -f "$build/CMakeCache.txt" ] && gen=()
# shellcheck disable=SC2086
cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
cmake --build "$build" -j "$(nproc)"
