#!/usr/bin/env bash
# demo.sh: builds xtc and runs the main job on its embedded default (xtc demo).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)"
./build/xtc demo "$@"
