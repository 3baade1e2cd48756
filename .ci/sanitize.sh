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
ctest --test-dir build-asan --output-on-failure -j"$(nproc)" "${exclude[@]}" && exit 0

# A failure is final unless it is LeakSanitizer's own crash at exit: the tracer (the thread that
# stops the process to scan it for leaks) sometimes dies of a SIGSEGV ("Tracer caught signal 11")
# after the test has run to its end, a known fault of the sanitizer runtime (google/sanitizers
# #1353; once in test_cuda, whose Check suites had all passed). The leak check did not run then,
# so those tests, and only those, run once more, and that run decides. Any other failure in the
# same output (a test's, ASan's, UBSan's, a leak report) ends the run here.
tmp=build-asan/Testing/Temporary
[ -s "$tmp/LastTestsFailed.log" ] || exit 1
while IFS= read -r line; do
    name=${line#*:}
    out=$(awk -v t="$name" '$0 ~ "^[0-9]+/[0-9]+ Test: " t "$" {on = 1} on && /^<end of output>/ {exit} on' \
        "$tmp/LastTest.log" | tr -d '\r' | grep -vE '^100%: Checks: [0-9]+, Failures: 0, Errors: 0$' || true)
    if ! grep -q 'Tracer caught signal' <<<"$out" || ! grep -q 'LeakSanitizer has encountered a fatal error' <<<"$out" ||
        grep -qE 'ERROR: (Address|Leak|Undefined)Sanitizer|runtime error:|^[0-9]+%: Checks:' <<<"$out"; then
        echo "sanitize.sh: $name failed" >&2
        exit 1
    fi
done <"$tmp/LastTestsFailed.log"
echo "sanitize.sh: LeakSanitizer's tracer crashed at exit in: $(cut -d: -f2 "$tmp/LastTestsFailed.log" | tr '\n' ' ')- running them again" >&2
ctest --test-dir build-asan --output-on-failure --rerun-failed
