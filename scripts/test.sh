#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite
# (lit + FileCheck compiler tests and GoogleTest suites, all under ctest),
# then the runtime's unit tests and fuzz targets under ASan + UBSan
# (scripts/fuzz.sh --ci: a runtime-only build in build-fuzz/, each target over its
# regression inputs and seeds, then a fixed seed for a fixed number of runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
ctest --test-dir "${PTC_BUILD_DIR:-build}" --output-on-failure -j "$(nproc)"
bash scripts/fuzz.sh --ci
