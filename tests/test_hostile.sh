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
def tok(name, shape, values, targets=None):
    t = {"tokens": st.Tensor("I64", shape, values)}
    if targets is not None:
        t["targets"] = st.Tensor("I64", shape, targets)
    st.write("%s/%s.safetensors" % (out, name), t)
tok("empty_2e40", [2**40, 0], [])             # an 88-byte file
tok("empty_2e20", [2**20, 0], [])
tok("empty_2e40_t", [2**40, 0], [], [])
tok("tok_only", [2, 8], [3] * 16)
tok("target_300", [2, 8], [3] * 16, [4] * 5 + [300] + [-100] * 10)
tok("target_neg", [2, 8], [3] * 16, [4] * 5 + [-100] * 11)
PY
$py "$tmp/rt_inputs.py" "$parity" "$tmp"
$xtc compile $src/tests/parity/decoder_plain.xtf --kv-cache -o $tmp/rt_kv.so > /dev/null 2>&1
$xtc init $tmp/rt_kv.so -o $tmp/rt_kv_w.safetensors > /dev/null 2>&1
# item 1: c + n <= max_seq_len (32), not c and n each
check rt_kv_fits $xtc run $tmp/rt_kv.so --weights $tmp/rt_kv_w.safetensors --input $tmp/kv_fits.safetensors --output $tmp/rt_out.safetensors
refuse_t rt_kv_over "n+c = 40 exceeds 32 (the model's max_seq_len): n = 20 (input 'tokens'), c = 20 (input 'cache.0.k')" \
  $xtc run $tmp/rt_kv.so --weights $tmp/rt_kv_w.safetensors --input $tmp/kv_over.safetensors --output $tmp/rt_out.safetensors
# item 2: no output elements, no work; absurd loops refused before running
dp=$src/tests/parity/decoder_plain.xtf
$xtc compile $dp -o $tmp/rt_dp.so > /dev/null 2>&1
$xtc compile $dp --train -o $tmp/rt_dp_train.so > /dev/null 2>&1
$xtc compile $src/tests/parity/num_memory_tokens.xtf -o $tmp/rt_mem.so > /dev/null 2>&1
$xtc init $tmp/rt_mem.so -o $tmp/rt_mem_w.safetensors > /dev/null 2>&1
dpw=$parity/decoder_plain/weights.safetensors
check rt_empty_batch_2e40 timeout 20 $xtc run $tmp/rt_dp.so --weights $dpw --input $tmp/empty_2e40.safetensors --output $tmp/rt_out.safetensors
check rt_empty_mem_tokens timeout 20 $xtc run $tmp/rt_mem.so --weights $tmp/rt_mem_w.safetensors --input $tmp/empty_2e20.safetensors --output $tmp/rt_out.safetensors
refuse_t rt_empty_batch_train "b = 1099511627776, n = 0 are too large" \
  $xtc run $tmp/rt_dp_train.so --weights $dpw --input $tmp/empty_2e40_t.safetensors --output $tmp/rt_out.safetensors
# items 23 and 24: targets checked when bound; a training module's logits without targets
refuse_t rt_target_range "input 'targets': value 300 at \[0, 5\] is outside \[0, 64)" \
  $xtc run $tmp/rt_dp_train.so --weights $dpw --input $tmp/target_300.safetensors --output $tmp/rt_out.safetensors
check rt_target_negative $xtc run $tmp/rt_dp_train.so --weights $dpw --input $tmp/target_neg.safetensors --output $tmp/rt_out.safetensors
check rt_train_no_targets $xtc run $tmp/rt_dp_train.so --weights $dpw --input $tmp/tok_only.safetensors --output $tmp/rt_out.safetensors
expect rt_train_no_targets_logits $py -c "import sys; sys.path.insert(0, '$parity'); import safetensors_lite as st; sys.exit(list(st.read('$tmp/rt_out.safetensors')[0]) != ['logits'])"

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
