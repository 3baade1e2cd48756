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

# ---- end runtime ----

# ---- files: FIFOs, device nodes, symlinks, same-file outputs, the module cache (items 5, 7, 9, 12, 15, 18) ----

# ---- end files ----

# ---- training and generation (items 8, 10, 11, 16, 19, 24) ----

# ---- end training ----

# ---- compiling (items 3, 13, 17, 20) ----

# item 20: every bundled model passes compile -> init -> run (encdec's tied embedding was written
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

# item 3: an unknown --cpu aborted inside LLVM (exit 134); now one line, and valid names compile
refuse_t cpu_typo "did you mean 'skylake-avx512'" "$xtc" compile "$src/models/tiny_gpt.xtf" -O0 -o "$tmp/c.so" \
    --cpu=skylake-avx51
refuse_t cpu_32bit "32-bit" "$xtc" compile "$src/models/tiny_gpt.xtf" -O0 -o "$tmp/c.so" --cpu=i686
refuse_t cpu_unknown "unknown CPU 'nosuch'" "$xtc" compile "$src/models/tiny_gpt.xtf" -O0 -o "$tmp/c.so" --cpu=nosuch
check cpu_help sh -c "'$xtc' compile --cpu=help | grep -qx '  znver4'"
for cpu in generic native x86-64-v3 skylake-avx512 znver4; do
    check "cpu_$cpu" "$xtc" compile "$src/models/tiny_gpt.xtf" -O0 -o "$tmp/c.so" --cpu=$cpu
done

# item 17: `xtc check` said "ok" to what lowering (and so `compile`) refuses; now one verdict
printf 'm = TransformerWrapper(num_tokens = 16, max_seq_len = 8, num_memory_tokens = 2, max_mem_len = 4,\n    attn_layers = Decoder(dim = 8, depth = 1, heads = 2))\n' > "$tmp/memtok.xtf"
refuse_t check_memtok_mem_len "num_memory_tokens together with max_mem_len" "$xtc" check "$tmp/memtok.xtf"
refuse_t compile_memtok_mem_len "num_memory_tokens together with max_mem_len" "$xtc" compile "$tmp/memtok.xtf" \
    -O0 -o "$tmp/c.so"
printf 'm = TransformerWrapper(num_tokens = 16, max_seq_len = 8, emb_dim = 4, tie_embedding = true,\n    attn_layers = Decoder(dim = 8, depth = 1, heads = 2))\n' > "$tmp/tie.xtf"
refuse_t check_tie_emb_dim "tie_embedding needs emb_dim" "$xtc" check "$tmp/tie.xtf"
for m in "$src"/models/*.xtf; do
    check "check_$(basename "$m" .xtf)" "$xtc" check "$m"
done

# item 13: `compile --train` left the model's dropout out, so `train model.so` trained otherwise
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

# ---- the command line (items 22, 23, 24) ----

# ---- end command line ----

checks_done hostile
