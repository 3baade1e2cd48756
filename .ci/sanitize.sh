#!/usr/bin/env bash
# sanitize.sh: builds xtc in build-asan/ with AddressSanitizer + UndefinedBehaviorSanitizer
# (cmake -DXTC_SANITIZE=address,undefined: every target, -fno-sanitize-recover=all) and runs the
# whole ctest suite there. Leaks fail the run: Check suites run in-process (CK_FORK=no, set by
# tests/CMakeLists.txt) so LeakSanitizer's report reaches their exit status.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DXTC_SANITIZE=address,undefined >/dev/null
cmake --build build-asan -j"$(nproc)"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:check_initialization_order=1:detect_invalid_pointer_pairs=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export CK_FORK=no
# XTC_SANITIZE_EXCLUDE: a ctest -E regex of tests to leave out (none by default)
exclude=()
[ -n "${XTC_SANITIZE_EXCLUDE:-}" ] && exclude=(-E "$XTC_SANITIZE_EXCLUDE")
ctest --test-dir build-asan --output-on-failure -j"$(nproc)" "${exclude[@]}"
