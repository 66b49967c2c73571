#!/usr/bin/env bash
# The test command of the README: set up (install, configure, build), then run every test; then
# the same tests once more in an AddressSanitizer + UndefinedBehaviorSanitizer build (CPU
# backend, no apps; about 8 minutes on 2 cores) so that memory errors and undefined behaviour
# fail CI, not only wrong results; then a short run of every fuzz target (scripts/fuzz.sh: a clang
# build of its own, 60 s per target, two at a time; about 8 minutes on 2 cores; docs/fuzzing.md).
# Environment: BUILD_DIR (default build), SANITIZE_BUILD_DIR (default build-asan),
# MG_SKIP_SANITIZE=1 to run the release build's tests only, MG_SKIP_FUZZ=1 to skip the fuzzing
# (FUZZ_SECONDS and the rest of scripts/fuzz.sh's settings pass through).
set -euo pipefail
cd "$(dirname "$0")/.."
MG_TEST_DEPS=1 bash scripts/setup.sh
(cd "${BUILD_DIR:-build}" && ctest --output-on-failure -j 2 --timeout 1800)
if [ "${MG_SKIP_SANITIZE:-0}" != 1 ]; then
  echo "== the tests under AddressSanitizer + UndefinedBehaviorSanitizer =="
  BUILD_DIR=${SANITIZE_BUILD_DIR:-build-asan} MG_SKIP_APT=1 \
    CMAKE_ARGS="-DCMAKE_BUILD_TYPE=RelWithDebInfo -DMINIGRAD_CUDA=OFF -DMINIGRAD_SANITIZE=ON -DMINIGRAD_BUILD_APPS=OFF" \
    bash scripts/setup.sh
  # package_link_demo builds an outside program against the installed library: the release
  # build's run covers it, and a sanitized library would need the sanitizer flags there too.
  (cd "${SANITIZE_BUILD_DIR:-build-asan}" && ctest --output-on-failure -j 2 --timeout 1800 -E package_link_demo)
fi
if [ "${MG_SKIP_FUZZ:-0}" != 1 ]; then
  echo "== a short run of every fuzz target (scripts/fuzz.sh) =="
  bash scripts/fuzz.sh
fi
