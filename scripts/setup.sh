#!/usr/bin/env bash
# Installs what is missing (Debian 12), configures and builds libminigrad into build/.
# Environment: BUILD_DIR (default build), CMAKE_ARGS (extra -D options), MG_SKIP_APT=1 to skip apt,
# MG_EXTRA_PACKAGES (more Debian packages to install, e.g. scripts/fuzz.sh's clang).
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(build-essential cmake ninja-build pkg-config libeigen3-dev doctest-dev libcli11-dev
      nlohmann-json3-dev zlib1g-dev libstb-dev libjpeg-dev libopenblas-dev libopenmpi-dev openmpi-bin ${MG_EXTRA_PACKAGES:-})
if [ "${MG_SKIP_APT:-0}" != 1 ]; then
  missing=()
  for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    sudo=""; [ "$(id -u)" = 0 ] || sudo=sudo
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
  fi
fi
build=${BUILD_DIR:-build}
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
[ -f "$build/CMakeCache.txt" ] && gen=()
# shellcheck disable=SC2086
cmake -S . -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
cmake --build "$build" -j "$(nproc)"
