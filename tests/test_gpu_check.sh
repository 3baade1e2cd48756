#!/usr/bin/env bash
# test_gpu_check.sh BUILD_DIR SOURCE_DIR: bench/gpu_check.sh without a GPU, so that the call a
# session with a lent GPU makes works the first time.
#  1. --dry-run: the kit built (the table's rows marked for it, at their tiny shapes, compiled
#     for cuda-emu; references from the CPU modules), every case run through the emulator and
#     passing: forward, training step and decoding, f32 and 16-bit storage.
#  2. the same kit on the device side alone (no --dry-run: what runs on the GPU machine), one
#     case (--only) given another seed than its reference was made with: it must FAIL, name the
#     output and exit non-zero (a check that cannot fail checks nothing).
set -u
build=$(cd "$1" && pwd)
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$src/tests/checks.sh"
expect() { # expect NAME PATTERN FILE: grep -E must find PATTERN in FILE
  if grep -Eq -- "$2" "$3"; then pass=$((pass + 1)); echo "ok   $1"
  else fail=$((fail + 1)); echo "FAIL $1 (no '$2' in):"; sed 's/^/    /' "$3"; fi
}
py=/usr/bin/python3
if ! $py -c 'import gzip' 2> /dev/null; then
  echo "SKIP test_gpu_check: no $py (the device side unpacks the modules with Python)"
  exit 77
fi

XTC_PYTHON=$py bash "$src/bench/gpu_check.sh" --dry-run --build "$build" --kit "$tmp/kit" > "$tmp/log" 2>&1
rc=$?
expect "dry run: exit 0 (was $rc)" "^gpu_check: 7 passed, 0 failed of 7 " "$tmp/log"
expect "dry run: the kit" "^kit: 7 cases, 7 modules for cuda-emu" "$tmp/log"
for c in "tiny_fwd +fp16" "tiny_train +f32" "tiny_decode +f32" "gqa_fwd +f32" "pos_rot +bf16" "pos_alibi +bf16" "pos_rotdec +fp16"; do
  expect "dry run: $c passes" "^PASS $c +[0-9]+ tensors; worst [0-9.e+-]+ of max\|ref\| at .* on the xtc CUDA emulator" "$tmp/log"
done
expect "dry run: the training step compares every gradient" "^PASS tiny_train +f32 +(5[0-9]|6[0-9]) tensors" "$tmp/log"
expect "dry run: decoding compares each call's logits and the caches" "^PASS tiny_decode .*1[0-9] tensors" "$tmp/log"
# rotary's inverse frequencies stay f32 in 16-bit storage: rounded, they turn the rotated k
# and v of the caches past position ~60 by more than fp16's tolerance (the logits hide it)
expect "dry run: rotary decoding in fp16 keeps the caches" "^PASS pos_rotdec +fp16 +5 tensors" "$tmp/log"

# the device side on a kit whose reference does not match: tiny_fwd's seed changed
sed -i 's/^\(tiny_fwd fp16 fwd [0-9x]*\) [0-9]* /\1 99 /' "$tmp/kit/cases.txt"
XTC_PYTHON=$py bash "$src/bench/gpu_check.sh" --kit "$tmp/kit" --only '^tiny_fwd' > "$tmp/bad" 2>&1
rc=$?
expect "a wrong reference: exit 1 (was $rc)" "^gpu_check: 0 passed, 1 failed of 1 " "$tmp/bad"
[ $rc = 1 ] && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL exit status $rc, not 1"; }
expect "a wrong reference: its FAIL line" "^FAIL tiny_fwd +fp16 +\(status 1\)" "$tmp/bad"
expect "a wrong reference: the element and tolerance" "output 'logits': element [0-9]+ is .*tolerance" "$tmp/bad"
checks_done test_gpu_check
