#!/usr/bin/env bash
# test_hostile.sh BUILD_DIR SOURCE_DIR: the reproductions of issue 24 (hardening round 2), run
# against the real `xtc` as a hostile or careless user would: cache/position bounds, empty batches,
# FIFOs, device nodes and symlinks as outputs, an output that is also an input, damaged module-cache
# entries, diverging training, signals. Each case must end with a clean one-line error (exit 1 or
# 2) or succeed as stated; a crash (exit >= 128), a hang (bounded by `timeout`) or a sanitizer
# report fails it.
set -u
build=$1
src=$2
xtc=$build/xtc
parity=${XTC_SHARED_DIR:-$src/../shared}/parity
py=/usr/bin/python3
[ -x $py ] || py=python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$src/tests/checks.sh"

check() { # check NAME COMMAND...: the command must succeed (within 300 s) without a sanitizer report
  local name=$1; shift
  timeout 300 "$@" > "$tmp/out" 2>&1
  local rc=$?
  if [ $rc -eq 0 ] && ! grep -qE 'Sanitizer|runtime error:' "$tmp/out"; then pass=$((pass + 1)); echo "ok   $name"
  else fail=$((fail + 1)); echo "FAIL $name (exit $rc):"; sed 's/^/    /' "$tmp/out" | head -20; fi
}
refuse_t() { # refuse_t NAME EXPECTED COMMAND...: `refuse` bounded by 120 s (a hang is a failure)
  local name=$1 want=$2; shift 2
  refuse "$name" "$want" timeout 120 "$@"
  if grep -qE 'Sanitizer|runtime error:' "$tmp/out"; then
    pass=$((pass - 1)); fail=$((fail + 1)); echo "FAIL $name: sanitizer report"
  fi
}
expect() { # expect NAME CONDITION...: a plain shell condition (test, cmp, grep) must hold
  local name=$1; shift
  if "$@"; then pass=$((pass + 1)); echo "ok   $name"
  else fail=$((fail + 1)); echo "FAIL $name"; fi
}

# ---- the runtime: bounds of a call (items 1, 2, 4, 6, 24) ----

# h-sys:
# item 22: xtc train's default thread count follows the affinity mask (it said "2 threads" under
# `taskset -c 0` on 2 CPUs: sysconf counts the machine's)
if command -v taskset > /dev/null; then
  head -c 20000 "$src/README.md" > "$tmp/affinity.txt"
  first_cpu=$(taskset -pc $$ | sed 's/.*: *//; s/[,-].*//')
  check "train under taskset: one thread by default" taskset -c "$first_cpu" $xtc train "$src/models/tiny_gpt.xtf" \
    --data "$tmp/affinity.txt" --steps 1 --batch 1 --seq 16
  expect "train under taskset says 1 thread" grep -q ', 1 thread$' "$tmp/out"
else
  echo "skip train under taskset: no taskset here"
fi
# ---- end runtime ----

# ---- files: FIFOs, device nodes, symlinks, same-file outputs, the module cache (items 5, 7, 9, 12, 15, 18) ----

# ---- end files ----

# ---- training and generation (items 8, 10, 11, 16, 19, 24) ----

# ---- end training ----

# ---- compiling (items 3, 13, 17, 20) ----

# ---- end compiling ----

# ---- the command line (items 22, 23, 24) ----

# ---- end command line ----

checks_done hostile
