#!/usr/bin/env bash
# The test command of the README: set up (install, configure, build), then run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cd "${BUILD_DIR:-build}" && ctest --output-on-failure -j 2 --timeout 1800
