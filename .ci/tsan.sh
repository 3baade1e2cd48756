#!/usr/bin/env bash
# tsan.sh: builds the concurrency test in build-tsan/ with ThreadSanitizer
# (cmake -DXTC_SANITIZE=thread; gcc or clang) and runs it there: several threads each load a
# module, create their own sessions (with pool threads) and train at once, checked bitwise against
# the same jobs run alone (tests/test_threads.c). Any data race TSan sees in xtc fails the run; the
# one suppression (.ci/tsan.supp) is for races reported inside the uninstrumented libLLVM. Only that test and the libraries it links are built, to keep CI short.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DXTC_SANITIZE=thread >/dev/null
cmake --build build-tsan -j"$(nproc)" --target test_threads
export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/.ci/tsan.supp"
export CK_FORK=no
ctest --test-dir build-tsan --output-on-failure -R '^test_threads$'
