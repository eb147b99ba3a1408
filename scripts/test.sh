#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite
# (lit + FileCheck compiler tests and GoogleTest suites, all under ctest).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ctest --test-dir "${PTC_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)"
