#!/usr/bin/env bash
# test_cpu_bf16_models.sh BUILD_DIR SOURCE_DIR: every bundled model (models/*.xtf) compiled for the
# CPU with --dtype bf16 (the matmul weights stored in bf16, read by bf16 matmuls into f32 sums)
# stores some weights so ("storage" records), and on x-transformers' initial weights and random
# inputs gives
#   - the outputs of the same model compiled with --mma=bf16 and f32 storage (which rounds the
#     same operands to bf16 as it reads them; test_cpu_bf16 and test_kv_cache check that path
#     against the interpreter): bit for bit where the blocked matmul runs (the same sums in the
#     same order); where a matmul of <= 4 rows takes the matrix-vector path (the same products
#     summed in another order, whose last bit can move the bf16 rounding of the next matmul's
#     operand: encdec's decoder, vit's head) within the bound below, and
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
worst, differs, same = 0.0, False, 0
for k in f32:
    a, b, e = bf[k].values, mma[k].values, f32[k].values
    m = max(abs(v) for v in e) if e else 0.0
    # the same products; the matrix-vector path (<= 4 rows) sums them in another order
    dm = max((abs(x - y) for x, y in zip(a, b)), default=0.0)
    assert dm <= 1e-4 + 2e-2 * m, "%s: --dtype bf16 and --mma=bf16 differ by %g (max|f32| %g)" % (k, dm, m)
    same += a == b
    err = max((abs(x - y) for x, y in zip(a, e)), default=0.0)
    assert err <= 1e-4 + 2e-2 * m, "%s: %g from the f32 module's (max|f32| %g)" % (k, err, m)
    differs |= a != e
    worst = max(worst, err / m if m else 0)
assert differs, "the bf16 module gave the f32 outputs: were the weights rounded?"
print("%d of %d outputs bit for bit --mma=bf16's; within %.2g of max|f32|" % (same, len(f32), worst))
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
# --dtype bf16 --mma=off: bf16 weights, f32 arithmetic (the matmul widens them as it packs them,
# exactly): the f32 module's outputs on the same weights rounded to bf16, bit for bit (b x n = 10
# rows: the blocked matmul, whose sums run in the same order in both)
cat > "$tmp/round.py" <<'PY'
import re, struct, sys
sys.path.insert(0, sys.argv[1])
import safetensors_lite as st
def bf16(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    u = (u + 0x7fff + ((u >> 16) & 1)) >> 16 << 16
    return struct.unpack("<f", struct.pack("<I", u & 0xffffffff))[0]
# the weights the module stores in bf16: its metadata's "storage" records name their buffers
text = open(sys.argv[4], "rb").read().decode("latin-1")
ids = set(re.findall(r"(?m)^storage (\d+) bf16$", text))
names = {m.group(2) for m in re.finditer(r"(?m)^buffer (\d+) param (\S+) ", text) if m.group(1) in ids}
assert len(names) == len(ids), "storage records of buffers that are not parameters"
assert names, "no stored weight"
t, meta = st.read(sys.argv[2])
st.write(sys.argv[3], {k: st.Tensor(v.dtype, v.shape, [bf16(x) for x in v.values] if k in names else v.values)
                       for k, v in t.items()})
PY
f32_compute() {
  local m=$src/models/tiny_gpt.xtf b=tiny
  "$xtc" compile "$m" -O0 -o "$tmp/$b.f32.so" && "$xtc" compile "$m" -O0 --dtype bf16 --mma=off -o "$tmp/$b.w16.so" &&
    "$xtc" init "$tmp/$b.f32.so" -o "$tmp/$b.w.safetensors" --seed 4 &&
    $py "$tmp/round.py" "$parity" "$tmp/$b.w.safetensors" "$tmp/$b.wr.safetensors" "$tmp/$b.w16.so" &&
    $py "$tmp/mkinput.py" "$xtc" "$tmp/$b.f32.so" "$parity" "$tmp/$b.in.safetensors" &&
    "$xtc" run "$tmp/$b.w16.so" --weights "$tmp/$b.w.safetensors" --input "$tmp/$b.in.safetensors" --output "$tmp/a.st" &&
    "$xtc" run "$tmp/$b.f32.so" --weights "$tmp/$b.wr.safetensors" --input "$tmp/$b.in.safetensors" --output "$tmp/e.st" &&
    $py -c "import sys; sys.path.insert(0, sys.argv[1]); import safetensors_lite as st
a, e = st.read(sys.argv[2])[0], st.read(sys.argv[3])[0]
assert a.keys() == e.keys() and all(a[k].values == e[k].values for k in a), 'outputs differ'" "$parity" "$tmp/a.st" "$tmp/e.st" &&
    echo "tiny_gpt --dtype bf16 --mma=off: the f32 module's outputs on rounded weights"
}
check "bf16 weights, f32 arithmetic" f32_compute
# --dtype fp16 is for the CUDA targets
refuse "fp16 on the cpu" "stores in f32 or bf16" "$xtc" compile "$src/models/tiny_gpt.xtf" -O0 -o "$tmp/x.so" --dtype fp16
checks_done cpu_bf16_models
