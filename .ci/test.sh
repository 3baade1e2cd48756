#!/usr/bin/env bash
# test.sh: builds xtc in build/ and runs every test (Check suites and script tests via ctest).
# The last lines say how many tests passed and failed; the exit status is non-zero on failure.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
ctest --test-dir build --output-on-failure -j"$(nproc)"
