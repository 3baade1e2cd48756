#!/usr/bin/env bash
# run.sh SECONDS [BUILD_DIR]: bounded libFuzzer runs of every target in tests/fuzz.
# Configures BUILD_DIR (default build-fuzz/) with clang and -DXTC_FUZZ=ON, builds the targets,
# and runs each for SECONDS from its committed seed corpus (corpus/<target>/) plus the working
# corpus kept in BUILD_DIR/fuzz-work/<target>/, side by side, one per processor. Prints
# executions, coverage and corpus size per target (-print_final_stats=1) and fails when a target
# crashes, leaks, times out or runs out of memory; the input is left in
# BUILD_DIR/fuzz-crashes/<target>/. To keep a crash as a test, fix it and copy the input into
# regress/<target>/ (replayed by ctest: fuzz_<target>_replay).
set -uo pipefail
secs=${1:?usage: tests/fuzz/run.sh SECONDS [BUILD_DIR]}
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../.." && pwd)
build=${2:-$src/build-fuzz}
targets="fuzz_xtf fuzz_safetensors fuzz_ir_text fuzz_module_meta"
cc=${XTC_FUZZ_CC:-$(command -v clang || command -v clang-14)}
if [ -z "$cc" ] || ! command -v "$cc" >/dev/null; then
  echo "fuzz: FAIL: $cc not found (bash .ci/setup.sh installs clang and libclang-rt-14-dev)"
  exit 1
fi
compiler=()
[ -f "$build/CMakeCache.txt" ] || compiler=(-DCMAKE_C_COMPILER="$cc")
if ! cmake -S "$src" -B "$build" "${compiler[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DXTC_FUZZ=ON >/dev/null; then
  echo "fuzz: FAIL: cmake could not configure $build"
  exit 1
fi
cmake --build "$build" -j"$(nproc)" --target $targets >/dev/null || { echo "fuzz: FAIL: build"; exit 1; }

# the targets run side by side, as many at a time as there are processors (each is one process)
jobs=$(nproc 2>/dev/null || echo 1)
fuzz_one() {
  local t=$1 work=$build/fuzz-work/$1 crashes=$build/fuzz-crashes/$1 dict=()
  mkdir -p "$work" "$crashes"
  [ -f "$here/$t.dict" ] && dict=(-dict="$here/$t.dict")
  "$build/fuzz/$t" "$work" "$here/corpus/$t" "${dict[@]}" -max_total_time="$secs" -print_final_stats=1 \
    -artifact_prefix="$crashes/" -timeout=10 -rss_limit_mb=2048 > "$build/fuzz-$t.log" 2>&1
  echo $? > "$build/fuzz-$t.rc"
}
for t in $targets; do
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  fuzz_one "$t" &
done
wait

failed=0
for t in $targets; do
  work=$build/fuzz-work/$t
  log=$build/fuzz-$t.log
  rc=$(cat "$build/fuzz-$t.rc" 2>/dev/null || echo "?")
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$log" | tail -1)
  ncorpus=$(find "$work" -type f | wc -l)
  if [ "$rc" != 0 ] || grep -q 'ERROR: \|runtime error:' "$log"; then
    echo "fuzz: FAIL $t (exit status $rc):"
    grep -E 'ERROR|runtime error|SUMMARY|Test unit written|fuzz_[a-z_]+: ' "$log" | head -20 | sed 's/^/    /'
    echo "    log: $log"
    failed=1
  else
    echo "fuzz: ok   $t: ${secs} s, ${execs:-?} executions (${speed:-?}/s), ${cov:-cov ?}, corpus $ncorpus inputs"
  fi
done
[ $failed -eq 0 ]
