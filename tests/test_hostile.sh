#!/usr/bin/env bash
# test_hostile.sh BUILD_DIR SOURCE_DIR: the real `xtc` used as a hostile or careless user would:
# cache/position bounds, empty batches, FIFOs, device nodes and symlinks as outputs, an output that is also an input, damaged module-cache
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

# ---- the runtime: bounds of a call ----
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
# v2_attn_qk_norm --kv-cache (cosine-sim: 1 layer, 2 heads of 8): unit keys, then one key of norm 1e3
def cos(name, last):
    st.write("%s/%s.safetensors" % (out, name), {"tokens": st.Tensor("I64", [1, 1], [1]),
             "cache.0.k": st.Tensor("F32", [1, 2, 2, 8], ([1.0] + [0.0] * 7) * 3 + [last] + [0.0] * 7),
             "cache.0.v": st.Tensor("F32", [1, 2, 2, 8], [0.5] * 32)})
cos("cos_unit", 1.0)
cos("cos_big", 1e3)
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
# c + n <= max_seq_len (32), not c and n each
check rt_kv_fits $xtc run $tmp/rt_kv.so --weights $tmp/rt_kv_w.safetensors --input $tmp/kv_fits.safetensors --output $tmp/rt_out.safetensors
refuse_t rt_kv_over "n+c = 40 exceeds 32 (the model's max_seq_len): n = 20 (input 'tokens'), c = 20 (input 'cache.0.k')" \
  $xtc run $tmp/rt_kv.so --weights $tmp/rt_kv_w.safetensors --input $tmp/kv_over.safetensors --output $tmp/rt_out.safetensors
# a cosine-sim model's key cache holds keys it normalised (its decoding takes the bound): a file's
# cache with a key of norm 1e3 is refused by name, not decoded into overflow
$xtc compile $src/tests/parity_newer/v2_attn_qk_norm.xtf --kv-cache -O0 -o $tmp/rt_cos.so > /dev/null 2>&1
$xtc init $tmp/rt_cos.so -o $tmp/rt_cos_w.safetensors > /dev/null 2>&1
check rt_cos_unit_cache $xtc run $tmp/rt_cos.so --weights $tmp/rt_cos_w.safetensors --input $tmp/cos_unit.safetensors --output $tmp/rt_out.safetensors
refuse_t rt_cos_hostile_cache "input 'cache.0.k': row 3 has L2 norm 1000, above the 1 the model's cosine-sim attention relies on" \
  $xtc run $tmp/rt_cos.so --weights $tmp/rt_cos_w.safetensors --input $tmp/cos_big.safetensors --output $tmp/rt_out.safetensors
# no output elements, no work; absurd loops refused before running
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
# targets checked when bound; a training module's logits without targets
refuse_t rt_target_range "input 'targets': value 300 at \[0, 5\] is outside \[0, 64)" \
  $xtc run $tmp/rt_dp_train.so --weights $dpw --input $tmp/target_300.safetensors --output $tmp/rt_out.safetensors
check rt_target_negative $xtc run $tmp/rt_dp_train.so --weights $dpw --input $tmp/target_neg.safetensors --output $tmp/rt_out.safetensors
check rt_train_no_targets $xtc run $tmp/rt_dp_train.so --weights $dpw --input $tmp/tok_only.safetensors --output $tmp/rt_out.safetensors
expect rt_train_no_targets_logits $py -c "import sys; sys.path.insert(0, '$parity'); import safetensors_lite as st; sys.exit(list(st.read('$tmp/rt_out.safetensors')[0]) != ['logits'])"

# h-sys:
# xtc train's default thread count follows the affinity mask (it said "2 threads" under
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

# ---- files: FIFOs, device nodes, symlinks, same-file outputs, the module cache ----
# Readers never block on a FIFO (modules, weights and cache entries must be regular files; a .xtf
# source or training text from a FIFO nobody writes reads as empty); writers replace a regular
# target atomically through symlinks keeping its mode, write /dev/null in place, and clean the
# temporary files of a killed writer; an output that is an input is refused; a damaged cache entry
# is rebuilt; the embedded source is the text compiled, whatever it came from; sources are capped.
fl=$tmp/fl
mkdir -p "$fl"
fl_not_cached() { ! grep -q 'from the module cache' "$tmp/out"; }
fl_xtf=$src/models/tiny_gpt.xtf
if timeout 300 "$xtc" compile "$fl_xtf" -o "$fl/m.so" > "$tmp/fl.out" 2>&1 &&
   timeout 120 "$xtc" init "$fl/m.so" -o "$fl/w.safetensors" >> "$tmp/fl.out" 2>&1; then
  $py - "$fl/in.safetensors" <<'PYEOF'
import json, struct, sys
h = json.dumps({"tokens": {"dtype": "I64", "shape": [1, 4], "data_offsets": [0, 32]}}).encode()
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + struct.pack("<4q", 1, 2, 3, 4))
PYEOF
  fl_run=(run "$fl/m.so" --weights "$fl/w.safetensors" --input "$fl/in.safetensors")
  # FIFOs nobody writes
  mkfifo "$fl/fifo"
  refuse_t files_fifo_module 'not a regular file' "$xtc" info "$fl/fifo"
  refuse_t files_fifo_model_run 'defines no model' "$xtc" run "$fl/fifo" --weights "$fl/w.safetensors" \
    --input "$fl/in.safetensors" --output "$fl/o.safetensors"
  refuse_t files_fifo_weights 'not a regular file' "$xtc" run "$fl/m.so" --weights "$fl/fifo" \
    --input "$fl/in.safetensors" --output "$fl/o.safetensors"
  refuse_t files_fifo_input 'not a regular file' "$xtc" run "$fl/m.so" --weights "$fl/w.safetensors" \
    --input "$fl/fifo" --output "$fl/o.safetensors"
  check files_fifo_source timeout 60 "$xtc" check "$fl/fifo"
  refuse_t files_fifo_data 'too few' "$xtc" train "$fl/m.so" --data "$fl/fifo" --steps 1 --quiet
  # symlinks, modes, /dev/null, stale temporary files
  check files_out_ref "$xtc" "${fl_run[@]}" --output "$fl/ref.safetensors"
  ln -s o.safetensors "$fl/link.safetensors"
  check files_out_symlink "$xtc" "${fl_run[@]}" --output "$fl/link.safetensors"
  expect files_out_symlink_kept test -L "$fl/link.safetensors"
  expect files_out_symlink_target cmp -s "$fl/o.safetensors" "$fl/ref.safetensors"
  chmod 0640 "$fl/o.safetensors"
  check files_out_mode "$xtc" init "$fl/m.so" -o "$fl/link.safetensors" --seed 3
  expect files_out_mode_kept test "$(stat -c %a "$fl/o.safetensors")" = 640
  expect files_out_mode_symlink test -L "$fl/link.safetensors"
  chmod 0640 "$fl/m.so"
  check files_out_mode_compile "$xtc" compile "$fl_xtf" -o "$fl/m.so"
  expect files_out_mode_compile_kept test "$(stat -c %a "$fl/m.so")" = 640
  # a private null device where we may make one (as root, a regression would otherwise replace
  # the machine's /dev/null); elsewhere /dev/null itself, which a user cannot replace
  fl_null=$fl/null
  mknod -m 666 "$fl_null" c 1 3 2> /dev/null || fl_null=/dev/null
  if [ -c "$fl_null" ] && [ -w "$fl_null" ]; then
    check files_devnull_run "$xtc" "${fl_run[@]}" --output "$fl_null"
    check files_devnull_run_finite "$xtc" "${fl_run[@]}" --output "$fl_null" --check-finite
    check files_devnull_init "$xtc" init "$fl/m.so" -o "$fl_null"
    check files_devnull_compile "$xtc" compile "$fl_xtf" -o "$fl_null"
    expect files_devnull_still_device test -c "$fl_null"
  else
    echo "skip files_devnull_*: /dev/null is not a writable character device here"
  fi
  sh -c 'exit 0' & fl_dead=$!
  wait $fl_dead
  while kill -0 $fl_dead 2>/dev/null; do fl_dead=$((fl_dead + 1)); done
  : > "$fl/.o.safetensors.xtc-tmp.$fl_dead.0badf00d"
  : > "$fl/.o.safetensors.xtc-tmp.$$.0badf00d" # a live writer's: kept
  check files_stale_tmp "$xtc" init "$fl/m.so" -o "$fl/o.safetensors"
  expect files_stale_tmp_removed test ! -e "$fl/.o.safetensors.xtc-tmp.$fl_dead.0badf00d"
  expect files_live_tmp_kept test -e "$fl/.o.safetensors.xtc-tmp.$$.0badf00d"
  # an output that is an input
  cp "$fl_xtf" "$fl/t.xtf"
  cp "$fl/in.safetensors" "$fl/in2.safetensors"
  refuse_t files_same_compile 'is the same file as the source' "$xtc" compile "$fl/t.xtf" -o "$fl/t.xtf"
  refuse_t files_same_init 'is the same file as the module' "$xtc" init "$fl/m.so" -o "$fl/m.so"
  refuse_t files_same_run_input 'is the same file as --input' "$xtc" "${fl_run[@]}" --output "$fl/in.safetensors"
  refuse_t files_same_run_weights 'is the same file as --weights' "$xtc" "${fl_run[@]}" --output "$fl/w.safetensors"
  refuse_t files_same_run_module 'is the same file as the module' "$xtc" "${fl_run[@]}" --output "$fl/m.so"
  ln -s in2.safetensors "$fl/in2.link"
  refuse_t files_same_run_symlink 'is the same file as --input' "$xtc" run "$fl/t.xtf" --weights "$fl/w.safetensors" \
    --input "$fl/in2.safetensors" --output "$fl/in2.link"
  refuse_t files_same_train 'is the same file as --data' "$xtc" train "$fl/m.so" --data "$fl/t.xtf" --ckpt "$fl/t.xtf"
  expect files_same_inputs_intact cmp -s "$fl/t.xtf" "$fl_xtf"
  expect files_same_inputs_intact2 cmp -s "$fl/in2.safetensors" "$fl/in.safetensors"
  # a damaged module-cache entry is a miss, rebuilt, and the module right
  export XTC_MODULE_CACHE=$fl/cache
  check files_cache_store "$xtc" compile "$fl_xtf" -o "$fl/c.so"
  fl_entry=$(ls "$fl/cache"/*.so 2>/dev/null | head -1)
  if [ -n "$fl_entry" ]; then
    truncate -s 20000 "$fl_entry"
    check files_cache_truncated "$xtc" compile "$fl_xtf" -o "$fl/c2.so" -v
    expect files_cache_truncated_rebuilt fl_not_cached
    printf '\x55' | dd of="$fl_entry" bs=1 seek=30000 conv=notrunc 2>/dev/null
    check files_cache_flipped "$xtc" compile "$fl_xtf" -o "$fl/c3.so" -v
    expect files_cache_flipped_rebuilt fl_not_cached
    check files_cache_hit "$xtc" compile "$fl_xtf" -o "$fl/c4.so" -v
    expect files_cache_hit_cached grep -q 'from the module cache' "$tmp/out"
    check files_cache_run "$xtc" run "$fl/c3.so" --weights "$fl/w.safetensors" --input "$fl/in.safetensors" \
      --output "$fl/c3.safetensors"
    expect files_cache_run_same cmp -s "$fl/c3.safetensors" "$fl/ref.safetensors"
    rm -f "$fl_entry" && mkfifo "$fl_entry"
    check files_cache_fifo timeout 120 "$xtc" compile "$fl_xtf" -o "$fl/c5.so"
  else
    fail=$((fail + 1)); echo "FAIL files_cache_store: no entry in $fl/cache"
  fi
  unset XTC_MODULE_CACHE
  # the embedded source is the text compiled, from a file, a redirect or a pipe
  check files_source_redirect sh -c '"$0" compile /dev/stdin -o "$1" < "$2"' "$xtc" "$fl/s1.so" "$fl_xtf"
  "$xtc" info "$fl/s1.so" --source > "$fl/s1.xtf" 2>&1
  expect files_source_redirect_embedded cmp -s "$fl/s1.xtf" "$fl_xtf"
  check files_source_pipe sh -c 'cat "$2" | "$0" compile /dev/stdin -o "$1"' "$xtc" "$fl/s2.so" "$fl_xtf"
  "$xtc" info "$fl/s2.so" --source > "$fl/s2.xtf" 2>&1
  expect files_source_pipe_embedded cmp -s "$fl/s2.xtf" "$fl_xtf"
  { cat "$fl_xtf"; printf '# a\0b\n'; } > "$fl/nul.xtf"
  refuse_t files_source_nul_pipe 'NUL byte in the source' sh -c 'cat "$1" | "$0" compile /dev/stdin -o "$2"' \
    "$xtc" "$fl/nul.xtf" "$fl/s3.so"
  # a size cap on sources, for files, pipes and devices alike
  refuse_t files_source_cap_dev 'larger than 4 MiB' "$xtc" check /dev/zero
  head -c 5000000 /dev/zero | tr '\0' ' ' > "$fl/big.xtf"
  refuse_t files_source_cap_file 'larger than 4 MiB' "$xtc" check "$fl/big.xtf"
  refuse_t files_source_cap_pipe 'larger than 4 MiB' sh -c 'cat "$1" | "$0" check /dev/stdin' "$xtc" "$fl/big.xtf"
else
  fail=$((fail + 1)); echo "FAIL files_setup:"; sed 's/^/    /' "$tmp/fl.out" | head -20
fi

# ---- end files ----

# ---- training and generation ----
cat > "$tmp/tr.xtf" <<'EOF'
tr = TransformerWrapper(num_tokens = 256, max_seq_len = 32, emb_dropout = 0.1,
    attn_layers = Decoder(dim = 16, depth = 1, heads = 2, attn_dropout = 0.1, ff_dropout = 0.1))
EOF
cat "$src"/cli/*.c | head -c 30000 > "$tmp/tr_data.txt"
tr_common=(--data "$tmp/tr_data.txt" --batch 2 --seq 16 --threads 1)
# a diverging run stops naming the step and the last good checkpoint stays (every step
# wrote NaN weights over it)
check tr_good $xtc train "$tmp/tr.xtf" "${tr_common[@]}" --quiet --steps 2 --ckpt "$tmp/tr_nan.safetensors"
cp "$tmp/tr_nan.safetensors" "$tmp/tr_good.safetensors"
refuse_t tr_diverge "training diverged at step" $xtc train "$tmp/tr.xtf" "${tr_common[@]}" --quiet --steps 20 \
  --lr 1000 --ckpt-every 1 --ckpt "$tmp/tr_nan.safetensors"
expect tr_diverge_no_nan_ckpt $py -c "import sys, math; sys.path.insert(0, '$parity'); import safetensors_lite as st
t = st.read('$tmp/tr_nan.safetensors')[0]
sys.exit(any(not math.isfinite(v) for x in t.values() for v in x.values))"
# ... and generate refuses NaN weights instead of printing NUL bytes
$py -c "import sys; sys.path.insert(0, '$parity'); import safetensors_lite as st
t = st.read('$tmp/tr_good.safetensors')[0]
t['token_emb.weight'].values[3] = float('nan')
st.write('$tmp/tr_nanw.safetensors', t)"
refuse_t tr_generate_nan "weight 'token_emb.weight' holds nan" $xtc generate "$tmp/tr.xtf" \
  --weights "$tmp/tr_nanw.safetensors" --tokens 5
# --tokens 0 prints no negative time
check tr_generate_0 $xtc generate "$tmp/tr.xtf" --weights "$tmp/tr_good.safetensors" --tokens 0
expect tr_generate_0_no_negative_time sh -c "! grep -q -- ' -[0-9]' '$tmp/out'"
# a --ckpt directory that is missing or unwritable, or a directory as --ckpt: refused
# before compiling and training
refuse_t tr_ckpt_missing_dir "directory $tmp/no/such: No such file" $xtc train "$tmp/tr.xtf" "${tr_common[@]}" \
  --steps 2 --ckpt "$tmp/no/such/c.safetensors"
expect tr_ckpt_missing_dir_early sh -c "! grep -q '^compiling' '$tmp/out'"
mkdir -p "$tmp/ro" && chmod 555 "$tmp/ro"
if [ "$(id -u)" != 0 ]; then
  refuse_t tr_ckpt_readonly_dir "Permission denied" $xtc train "$tmp/tr.xtf" "${tr_common[@]}" --steps 2 \
    --ckpt "$tmp/ro/c.safetensors"
fi
refuse_t tr_ckpt_is_dir "is a directory" $xtc train "$tmp/tr.xtf" "${tr_common[@]}" --steps 2 --ckpt "$tmp/ro"
chmod 755 "$tmp/ro"
# SIGTERM and SIGHUP save the resumable checkpoint and stop (exit 128 + the signal)
$xtc compile "$tmp/tr.xtf" --train -O1 -o "$tmp/tr_train.so" > /dev/null 2>&1
for sig in TERM HUP; do
  rm -f "$tmp/tr_sig.safetensors"
  timeout 120 $xtc train "$tmp/tr_train.so" "${tr_common[@]}" --log-every 1 --steps 100000 --val-tokens 64 \
    --ckpt "$tmp/tr_sig.safetensors" > "$tmp/tr_sig.out" 2> "$tmp/tr_sig.err" &
  pid=$!
  for _ in $(seq 1200); do grep -q '^step ' "$tmp/tr_sig.err" && break; kill -0 $pid 2> /dev/null || break; sleep 0.05; done
  kill -$sig $pid
  wait $pid
  rc=$?
  want=$((128 + $(kill -l $sig)))
  n=$(sed -n "s/^interrupted by SIG$sig after step \([0-9]*\); continue with --resume .*/\1/p" "$tmp/tr_sig.out")
  expect "tr_sig$sig: exit $want (got $rc), a checkpoint of step '$n'" \
    test "$rc" = "$want" -a -n "$n" -a -s "$tmp/tr_sig.safetensors"
  check "tr_sig${sig}_resume" $xtc train "$tmp/tr_train.so" "${tr_common[@]}" --steps 100000 --val-tokens 64 \
    --resume "$tmp/tr_sig.safetensors" --stop-at $((${n:-0} + 1))
  expect "tr_sig${sig}_resume_from_$n" grep -q "^step *$((${n:-0} + 1)) " "$tmp/out"
done
# --resume takes the checkpoint's seed (the dropout masks): 4 steps straight with
# --seed 9 equal 2 steps and a resume without --seed; another --seed is refused
tr_seed=("${tr_common[@]}" --quiet --steps 4 --val-every 2 --val-tokens 64)
$xtc train "$tmp/tr.xtf" "${tr_seed[@]}" --seed 9 --ckpt "$tmp/tr_s1.safetensors" > /dev/null 2>&1
$xtc train "$tmp/tr.xtf" "${tr_seed[@]}" --seed 9 --stop-at 2 --ckpt "$tmp/tr_s2.safetensors" > /dev/null 2>&1
check tr_resume_seed $xtc train "$tmp/tr.xtf" "${tr_seed[@]}" --resume "$tmp/tr_s2.safetensors" \
  --ckpt "$tmp/tr_s2.safetensors"
expect tr_resume_seed_same_weights cmp "$tmp/tr_s1.safetensors" "$tmp/tr_s2.safetensors"
refuse_t tr_resume_other_seed "differs from the seed of" $xtc train "$tmp/tr.xtf" "${tr_seed[@]}" --seed 3 \
  --resume "$tmp/tr_s2.safetensors"
# a checkpoint loads wherever weights load (its optimizer state ignored)
$xtc compile "$tmp/tr.xtf" -O1 -o "$tmp/tr_fwd.so" > /dev/null 2>&1
$py -c "import sys; sys.path.insert(0, '$parity'); import safetensors_lite as st
st.write('$tmp/tr_in.safetensors', {'tokens': st.Tensor('I64', [1, 8], list(range(60, 68)))})"
check tr_ckpt_run_so $xtc run "$tmp/tr_fwd.so" --weights "$tmp/tr_good.safetensors" --input "$tmp/tr_in.safetensors" \
  --output "$tmp/tr_o1.safetensors"
check tr_ckpt_run_xtf $xtc run "$tmp/tr.xtf" --weights "$tmp/tr_good.safetensors" --input "$tmp/tr_in.safetensors" \
  --output "$tmp/tr_o2.safetensors"
check tr_ckpt_predict "$build/predict" "$tmp/tr_fwd.so" "$tmp/tr_good.safetensors" "int main"
# ---- end training ----

# ---- compiling ----

# every bundled model passes compile -> init -> run (encdec's tied embedding was written
# under one name only, and `xtc run` refused the file). Inputs from `xtc info`: b=1, n=4, p=2.
cat > "$tmp/mkinput.py" <<'EOF'
import re, subprocess, sys
sys.path.insert(0, sys.argv[3])
import safetensors_lite as st
info = subprocess.run([sys.argv[1], "info", sys.argv[2]], capture_output=True, text=True, check=True).stdout
tensors, inputs = {}, False
for line in info.splitlines():
    if re.match(r"^\w", line):
        inputs = line.startswith("inputs:")
        continue
    m = re.match(r"^\s+(\S+)\s+(\w+)\s+\[([^\]]*)\]", line) if inputs else None
    if not m:
        continue
    name, dtype, dims = m.groups()
    size = {"b": 1, "n": 4, "p": 2}
    sym = lambda v: str(size.get(v.group(0), 2))
    shape = [eval(re.sub(r"[a-z_]\w*", sym, d)) for d in dims.split(",")] if dims.strip() else []
    numel = 1
    for d in shape:
        numel *= d
    tag = {"f32": "F32", "i64": "I64", "i32": "I32", "bool": "BOOL", "u8": "U8"}[dtype]
    tensors[name] = st.Tensor(tag, shape, [0.25 if tag == "F32" else True if tag == "BOOL" else 1] * numel)
st.write(sys.argv[4], tensors)
EOF
for m in "$src"/models/*.xtf; do
    b=$(basename "$m" .xtf)
    check "model_$b" sh -c "timeout 120 '$xtc' compile '$m' -O0 -o '$tmp/$b.so' &&
        '$xtc' init '$tmp/$b.so' -o '$tmp/$b.w.safetensors' &&
        $py '$tmp/mkinput.py' '$xtc' '$tmp/$b.so' '$parity' '$tmp/$b.in.safetensors' &&
        '$xtc' run '$tmp/$b.so' --weights '$tmp/$b.w.safetensors' --input '$tmp/$b.in.safetensors' \
            --output '$tmp/$b.out.safetensors'"
    rm -f "$tmp/$b".*
done

# an unknown --cpu aborted inside LLVM (exit 134); now one line, and valid names compile
refuse_t cpu_typo "did you mean 'skylake-avx512'" "$xtc" compile "$src/models/tiny_gpt.xtf" -O0 -o "$tmp/c.so" \
    --cpu=skylake-avx51
refuse_t cpu_32bit "32-bit" "$xtc" compile "$src/models/tiny_gpt.xtf" -O0 -o "$tmp/c.so" --cpu=i686
refuse_t cpu_unknown "unknown CPU 'nosuch'" "$xtc" compile "$src/models/tiny_gpt.xtf" -O0 -o "$tmp/c.so" --cpu=nosuch
check cpu_help sh -c "'$xtc' compile --cpu=help | grep -qx '  znver4'"
for cpu in generic native x86-64-v3 skylake-avx512 znver4; do
    check "cpu_$cpu" "$xtc" compile "$src/models/tiny_gpt.xtf" -O0 -o "$tmp/c.so" --cpu=$cpu
done

# `xtc check` said "ok" to what lowering (and so `compile`) refuses; now one verdict
printf 'm = TransformerWrapper(num_tokens = 16, max_seq_len = 8, num_memory_tokens = 2, max_mem_len = 4,\n    attn_layers = Decoder(dim = 8, depth = 1, heads = 2))\n' > "$tmp/memtok.xtf"
check check_memtok_mem_len "$xtc" check "$tmp/memtok.xtf"
check compile_memtok_mem_len "$xtc" compile "$tmp/memtok.xtf" -O0 -o "$tmp/c.so"
printf 'm = TransformerWrapper(num_tokens = 16, max_seq_len = 8, emb_dim = 4, tie_embedding = true,\n    attn_layers = Decoder(dim = 8, depth = 1, heads = 2))\n' > "$tmp/tie.xtf"
refuse_t check_tie_emb_dim "tie_embedding needs emb_dim" "$xtc" check "$tmp/tie.xtf"
for m in "$src"/models/*.xtf; do
    check "check_$(basename "$m" .xtf)" "$xtc" check "$m"
done

# `compile --train` left the model's dropout out, so `train model.so` trained otherwise
# than `train model.xtf`; now the module has dropout_seed (the seed decides the masks)
printf 'm = TransformerWrapper(num_tokens = 256, max_seq_len = 16,\n    attn_layers = Decoder(dim = 16, depth = 1, heads = 2, attn_dropout = 0.3, ff_dropout = 0.3))\n' > "$tmp/drop.xtf"
check drop_compile "$xtc" compile "$tmp/drop.xtf" --train -O0 -o "$tmp/drop.so"
check drop_seed_input sh -c "'$xtc' info '$tmp/drop.so' | grep -q 'dropout_seed .*i64  \[\]'"
cat > "$tmp/drop.py" <<'EOF'
import subprocess, sys
xtc, tmp = sys.argv[1], sys.argv[2]
sys.path.insert(0, sys.argv[3])
import safetensors_lite as st
subprocess.run([xtc, "init", tmp + "/drop.so", "-o", tmp + "/drop.w.safetensors"], check=True)
loss = []
for k in (1, 2, 1):
    st.write(tmp + "/drop.in.safetensors", {"tokens": st.Tensor("I64", [1, 4], [1, 2, 3, 4]),
             "targets": st.Tensor("I64", [1, 4], [2, 3, 4, 5]), "dropout_seed": st.Tensor("I64", [], [k])})
    subprocess.run([xtc, "run", tmp + "/drop.so", "--weights", tmp + "/drop.w.safetensors", "--input",
                    tmp + "/drop.in.safetensors", "--output", tmp + "/drop.out.safetensors"], check=True)
    loss.append(st.read(tmp + "/drop.out.safetensors")[0]["loss"].values)
assert loss[0] != loss[1] and loss[0] == loss[2], loss
EOF
check drop_seed_decides $py "$tmp/drop.py" "$xtc" "$tmp" "$parity"
head -c 3000 "$src/README.md" > "$tmp/drop.txt"
for f in xtf so; do
    timeout 120 "$xtc" train "$tmp/drop.$f" --data "$tmp/drop.txt" --steps 3 --batch 2 --seq 8 --seed 5 \
        --val-every 0 2>&1 | grep -o 'loss [0-9.]*' > "$tmp/drop.$f.losses"
done
expect drop_train_so_equals_xtf sh -c "[ -s '$tmp/drop.xtf.losses' ] && cmp -s '$tmp/drop.xtf.losses' '$tmp/drop.so.losses'"

# ---- end compiling ----

# ---- the command line ----
# One option parser for every subcommand (cli/cli_opts.c): unknown options named as such with the
# nearest spelling, a missing or bad value in one line, --threads=2 and --threads 2 alike wherever
# threads apply, a module or binary file given as .xtf source refused in one line, no internal
# function names, a warning above the CPUs this process may use.
cl_xtf=$src/models/tiny_gpt.xtf
cl_so=$tmp/cl_tiny.so
if timeout 300 "$xtc" compile "$cl_xtf" -o "$cl_so" > "$tmp/cl_compile.out" 2>&1 &&
   timeout 120 "$xtc" init "$cl_so" -o "$tmp/cl_w.safetensors" > "$tmp/cl_init.out" 2>&1; then
  $py - "$tmp" <<'PYEOF'
import json, struct, sys
def st(path, tensors):  # name -> (dtype, shape, bytes)
    h, off, blob = {}, 0, b""
    for k, (dt, shape, data) in tensors.items():
        h[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data); blob += data
    hj = json.dumps(h).encode()
    open(path, "wb").write(struct.pack("<Q", len(hj)) + hj + blob)
st(sys.argv[1] + "/cl_in.safetensors", {"tokens": ("I64", [1, 4], struct.pack("<4q", 1, 2, 3, 4))})
st(sys.argv[1] + "/cl_in_f32.safetensors", {"tokens": ("F32", [1, 4], struct.pack("<4f", 1, 2, 3, 4))})
PYEOF
  cl_run=(run "$cl_so" --weights "$tmp/cl_w.safetensors" --input "$tmp/cl_in.safetensors" --output "$tmp/cl_out.safetensors")
  refuse_t cli_unknown_suggest "unknown option '--thread' (did you mean '--threads'?)" "$xtc" "${cl_run[@]}" --thread 2
  refuse_t cli_unknown_suggest_compile "unknown option '--trian' (did you mean '--train'?)" \
    "$xtc" compile "$cl_xtf" -o "$tmp/cl_x.so" --trian
  refuse_t cli_unknown_so_not_apply "unknown option '--bogus'" "$xtc" "${cl_run[@]}" --bogus
  expect cli_unknown_so_not_apply_wording [ "$(grep -c "does not apply" "$tmp/out")" -eq 0 ]
  refuse_t cli_unknown_command "unknown command 'complie' (did you mean 'compile'?)" "$xtc" complie
  refuse_t cli_unknown_abbrev "unknown option '--temp' (did you mean '--temperature'?)" "$xtc" generate "$cl_so" --temp 1
  refuse_t cli_model_on_so "--model does not apply to a compiled module" "$xtc" "${cl_run[@]}" --model gpt
  refuse_t cli_missing_value "--weights needs a value" "$xtc" run "$cl_so" --input "$tmp/cl_in.safetensors" \
    --output "$tmp/cl_out.safetensors" --weights
  refuse_t cli_missing_value_before_option "--output needs a value" "$xtc" run "$cl_so" --output --weights x
  refuse_t cli_missing_required "no output given" "$xtc" compile "$cl_xtf"
  expect cli_missing_required_one_line [ "$(wc -l < "$tmp/out")" -eq 1 ]
  refuse_t cli_bad_int "--threads: expected a positive integer" "$xtc" "${cl_run[@]}" --threads x
  refuse_t cli_bad_int_zero "--threads: expected a positive integer" "$xtc" bench "$cl_xtf" --batch 1 --seq 4 --threads 0
  refuse_t cli_bad_int_train "--steps: expected a positive integer, got '1.5'" "$xtc" train "$cl_xtf" --data "$cl_xtf" \
    --steps 1.5
  refuse_t cli_bad_number "--temperature: expected a number" "$xtc" generate "$cl_so" --weights x --temperature hot
  refuse_t cli_flag_with_value "--train takes no value" "$xtc" compile "$cl_xtf" -o "$tmp/cl_x.so" --train=1
  # --threads=2 and --threads 2 reach every command that takes threads: parsing goes on to the
  # next argument, an unknown option, which is then the one refused
  for form in "--threads=2" "--threads 2"; do
    for c in "run $cl_so" "run $cl_xtf" "bench $cl_xtf" "train $cl_xtf" "generate $cl_so" "demo" "demo --inference"; do
      # shellcheck disable=SC2086
      refuse_t "cli_threads_accepted: $c $form" "unknown option '--zz'" "$xtc" $c $form --zz
    done
  done
  check cli_threads_eq_runs "$xtc" "${cl_run[@]}" --threads=2
  check cli_threads_space_runs "$xtc" "${cl_run[@]}" --threads 2
  check cli_threads_999_runs "$xtc" "${cl_run[@]}" --threads 999
  expect cli_threads_999_warns grep -q "warning: --threads 999 is more than the" "$tmp/out"
  # a compiled module (or another binary file) where a .xtf source belongs: one line, no bytes
  head -c 3000 /dev/urandom > "$tmp/cl_random.xtf"
  for c in compile ir check bench; do
    extra=(); [ $c = compile ] && extra=(-o "$tmp/cl_y.so"); [ $c = bench ] && extra=(--batch 1 --seq 4)
    refuse_t "cli_so_as_source_$c" "cl_tiny.so is a compiled module, not a .xtf source" "$xtc" $c "$cl_so" "${extra[@]}"
    expect "cli_so_as_source_${c}_one_line" [ "$(wc -l < "$tmp/out")" -eq 1 ]
    expect "cli_so_as_source_${c}_printable" [ "$(LC_ALL=C grep -c '[^[:print:][:space:]]' "$tmp/out")" -eq 0 ]
    refuse_t "cli_binary_as_source_$c" "is not a text file" "$xtc" $c "$tmp/cl_random.xtf" "${extra[@]}"
    expect "cli_binary_as_source_${c}_printable" [ "$(LC_ALL=C grep -c '[^[:print:][:space:]]' "$tmp/out")" -eq 0 ]
  done
  # messages name the file and the tensor, never an internal function
  refuse_t cli_no_internal_names "tensor 'tokens' is F32, not an integer type" "$xtc" run "$cl_so" \
    --weights "$tmp/cl_w.safetensors" --input "$tmp/cl_in_f32.safetensors" --output "$tmp/cl_out.safetensors"
  expect cli_no_internal_names_rt [ "$(grep -c "rt_st_" "$tmp/out")" -eq 0 ]
else
  fail=$((fail + 1)); echo "FAIL cli_setup: compile or init of tiny_gpt"; cat "$tmp/cl_compile.out" "$tmp/cl_init.out" 2>/dev/null
fi

# ---- end command line ----

checks_done hostile
