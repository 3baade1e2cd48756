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
# the input files: KV caches of c positions with n new tokens, empty batches of huge b
cat > "$tmp/rt_inputs.py" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import safetensors_lite as st
out = sys.argv[2]
def kv(name, c, n):  # decoder_plain --kv-cache: 2 layers, 2 heads of 32
    t = {"tokens": st.Tensor("I64", [1, n], [1] * n)}
    for l in range(2):
        for kind in "kv":
            t["cache.%d.%s" % (l, kind)] = st.Tensor("F32", [1, c, 2, 32], [0.0] * (c * 64))
    st.write("%s/%s.safetensors" % (out, name), t)
kv("kv_fits", 12, 20)
kv("kv_over", 20, 20)
PY
$py "$tmp/rt_inputs.py" "$parity" "$tmp"
$xtc compile $src/tests/parity/decoder_plain.xtf --kv-cache -o $tmp/rt_kv.so > /dev/null 2>&1
$xtc init $tmp/rt_kv.so -o $tmp/rt_kv_w.safetensors > /dev/null 2>&1
# item 1: c + n <= max_seq_len (32), not c and n each
check rt_kv_fits $xtc run $tmp/rt_kv.so --weights $tmp/rt_kv_w.safetensors --input $tmp/kv_fits.safetensors --output $tmp/rt_out.safetensors
refuse_t rt_kv_over "n+c = 40 exceeds 32 (the model's max_seq_len): n = 20 (input 'tokens'), c = 20 (input 'cache.0.k')" \
  $xtc run $tmp/rt_kv.so --weights $tmp/rt_kv_w.safetensors --input $tmp/kv_over.safetensors --output $tmp/rt_out.safetensors

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
