#!/usr/bin/env bash
# test_cpu_bf16_models.sh BUILD_DIR SOURCE_DIR: every bundled model (models/*.xtf) compiled for the
# CPU with --dtype bf16 (the matmul weights stored in bf16, read by bf16 matmuls into f32 sums)
# stores some weights so ("storage" records), and on x-transformers' initial weights and random
# inputs gives
#   - bit for bit the outputs of the same model compiled with --mma=bf16 and f32 storage (which
#     rounds the same operands to bf16 as it reads them; test_cpu_bf16 and test_kv_cache check
#     that path against the interpreter), and
#   - the f32 module's outputs within 1e-4 + 2e-2 max|f32| (the bf16 bound of test_cpu_bf16's
#     parity cases), not equal to them.
# Modules at -O0 (the same kernels, compiled several times faster).
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

check() { # check NAME COMMAND...: the command must succeed
  local name=$1; shift
  "$@" > "$tmp/out" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then pass=$((pass + 1)); echo "ok   $name"; tail -1 "$tmp/out" | sed 's/^/    /'
  else fail=$((fail + 1)); echo "FAIL $name (exit $rc):"; sed 's/^/    /' "$tmp/out" | head -20; fi
}

# random inputs from `xtc info`: b=2, n=5, other symbols 3; token ids within their range
cat > "$tmp/mkinput.py" <<'PY'
import random, re, subprocess, sys
sys.path.insert(0, sys.argv[3])
import safetensors_lite as st
random.seed(7)
info = subprocess.run([sys.argv[1], "info", sys.argv[2]], capture_output=True, text=True, check=True).stdout
tensors, inputs = {}, False
for line in info.splitlines():
    if re.match(r"^\w", line):
        inputs = line.startswith("inputs:")
        continue
    m = re.match(r"^\s+(\S+)\s+(\w+)\s+\[([^\]]*)\](?:\s+values in \[(-?\d+), (\d+)\))?", line) if inputs else None
    if not m:
        continue
    name, dtype, dims, lo, hi = m.groups()
    size = {"b": 2, "n": 5}
    sym = lambda v: str(size.get(v.group(0), 3))
    shape = [eval(re.sub(r"[a-z_]\w*", sym, d)) for d in dims.split(",")] if dims.strip() else []
    numel = 1
    for d in shape:
        numel *= d
    tag = {"f32": "F32", "i64": "I64", "i32": "I32", "bool": "BOOL", "u8": "U8"}[dtype]
    if tag == "F32":
        vals = [random.uniform(-1, 1) for _ in range(numel)]
    elif tag in ("BOOL", "U8"):
        vals = [True] * numel
    else:
        lo, hi = int(lo or 0), int(hi or 2)
        vals = [random.randrange(max(lo, 0), hi) for _ in range(numel)]
    tensors[name] = st.Tensor(tag, shape, vals)
st.write(sys.argv[4], tensors)
PY

# compare.py OUT_BF16 OUT_MMA OUT_F32: bf16 == mma bit for bit; bf16 ~ f32
cat > "$tmp/compare.py" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import safetensors_lite as st
bf, mma, f32 = (st.read(p)[0] for p in sys.argv[2:5])
assert bf.keys() == mma.keys() == f32.keys(), "outputs differ in names"
worst, differs = 0.0, False
for k in f32:
    a, b, e = bf[k].values, mma[k].values, f32[k].values
    assert a == b, "%s: --dtype bf16 and --mma=bf16 differ (%d of %d elements)" % (k, sum(x != y for x, y in zip(a, b)), len(a))
    m = max(abs(v) for v in e) if e else 0.0
    err = max((abs(x - y) for x, y in zip(a, e)), default=0.0)
    assert err <= 1e-4 + 2e-2 * m, "%s: %g from the f32 module's (max|f32| %g)" % (k, err, m)
    differs |= a != e
    worst = max(worst, err / m if m else 0)
assert differs, "the bf16 module gave the f32 outputs: were the weights rounded?"
print("outputs bit for bit --mma=bf16's; within %.2g of max|f32|" % worst)
PY

one_model() { # one_model MODEL.xtf NAME
  local m=$1 b=$2
  "$xtc" compile "$m" -O0 -o "$tmp/$b.f32.so" &&
    "$xtc" compile "$m" -O0 --mma=bf16 -o "$tmp/$b.mma.so" &&
    "$xtc" compile "$m" -O0 --dtype bf16 -o "$tmp/$b.bf16.so" || return 1
  grep -aq '^storage [0-9]* bf16$' "$tmp/$b.bf16.so" || { echo "no storage record in the bf16 module"; return 1; }
  "$xtc" init "$tmp/$b.f32.so" -o "$tmp/$b.w.safetensors" --seed 3 &&
    $py "$tmp/mkinput.py" "$xtc" "$tmp/$b.f32.so" "$parity" "$tmp/$b.in.safetensors" || return 1
  for v in f32 mma bf16; do
    "$xtc" run "$tmp/$b.$v.so" --threads 2 --weights "$tmp/$b.w.safetensors" --input "$tmp/$b.in.safetensors" \
      --output "$tmp/$b.$v.out.safetensors" || return 1
  done
  $py "$tmp/compare.py" "$parity" "$tmp/$b.bf16.out.safetensors" "$tmp/$b.mma.out.safetensors" "$tmp/$b.f32.out.safetensors"
}
for m in "$src"/models/*.xtf; do
  b=$(basename "$m" .xtf)
  check "model_$b" one_model "$m" "$b"
  rm -f "$tmp/$b".*
done
# --dtype fp16 is for the CUDA targets
refuse "fp16 on the cpu" "stores in f32 or bf16" "$xtc" compile "$src/models/tiny_gpt.xtf" -O0 -o "$tmp/x.so" --dtype fp16
checks_done cpu_bf16_models
