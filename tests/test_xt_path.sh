#!/usr/bin/env bash
# test_xt_path.sh BUILD_DIR SOURCE_DIR: the README's path from x-transformers to xtc, run as the
# README writes it, with Debian's python3-torch and tools/xtc_safetensors.py on PYTHONPATH.
#   1. Every .xtf example of the README passes `xtc check`.
#   2. The section "From x-transformers to xtc": its first Python block saves a state_dict and
#      integer tokens (here `model` holds the weights of the x-transformers reference case
#      decoder_plain, read by the cases' own safetensors_lite.py), its shell block compiles and
#      runs the model, its second Python block reads the logits back.
#   3. The same steps on the case's own tokens give x-transformers' logits (compare.py's
#      tolerance, 1e-5 + 1e-3 max|e|), and the tool lists the output file from the shell.
#   4. save_file / load_file against safetensors_lite.py, an independent reader and writer: every
#      dtype xtc reads (F32, F64, F16, BF16, I64, I32, BOOL), tied and non-contiguous tensors,
#      empty ones, metadata.
# About 3 s (one small compile).
set -u
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
shared=${XTC_SHARED_DIR:-$src/../shared}
case_dir=$shared/parity/decoder_plain
py=/usr/bin/python3
[ -x $py ] || py=python3
if [ ! -f "$case_dir/expected.safetensors" ]; then
  echo "FAIL: $case_dir not found (set XTC_SHARED_DIR)"
  exit 1
fi
if ! $py -c 'import torch, numpy' 2>/dev/null; then
  echo "FAIL: $py cannot import torch and numpy (Debian python3-torch, python3-numpy: .ci/setup.sh)"
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export PATH="$build:$PATH" PYTHONPATH="$src/tools:$shared/parity"
fails=0
pass() { echo "ok   $1"; }
fail() { echo "FAIL $1"; fails=$((fails + 1)); }

# the README's blocks: every .xtf example, and the section's blocks by language
$py - "$src/README.md" "$tmp" <<'PY' || { echo "FAIL: README.md: the blocks of 'From x-transformers to xtc' not found"; exit 1; }
import re, sys, textwrap
readme, tmp = open(sys.argv[1], encoding="utf-8").read(), sys.argv[2]
blocks = re.findall(r"^([ \t]*)```(\w*)\n(.*?)^[ \t]*```", readme, re.S | re.M)
xtf = [textwrap.dedent(b) for _, lang, b in blocks if lang == "" and "TransformerWrapper(" in b]
for i, b in enumerate(xtf):
    open("%s/readme_%d.xtf" % (tmp, i), "w").write(b)
sec = re.search(r"^## From x-transformers to xtc\n(.*?)(?=^## )", readme, re.S | re.M).group(1)
sb = re.findall(r"^([ \t]*)```(\w*)\n(.*?)^[ \t]*```", sec, re.S | re.M)
pyb = [textwrap.dedent(b) for _, lang, b in sb if lang == "python"]
shb = [textwrap.dedent(b) for _, lang, b in sb if lang == "sh"]
assert len(xtf) >= 2 and len(pyb) == 2 and len(shb) == 1, (len(xtf), len(pyb), len(shb))
open(tmp + "/save.py", "w").write(pyb[0])
open(tmp + "/read.py", "w").write(pyb[1])
open(tmp + "/run.sh", "w").write(shb[0])
print("README: %d .xtf examples, 2 Python blocks and a shell block in the x-transformers section" % len(xtf))
PY

# 1. the .xtf examples
for f in "$tmp"/readme_*.xtf; do
  if xtc check "$f" > "$tmp/check.out" 2>&1; then pass "xtc check $(basename "$f")"; else
    fail "xtc check on a README .xtf example:"; sed 's/^/    /' "$tmp/check.out"; fi
done

# 2. the section as written, in a folder of its own with the case's model as model.xtf
work=$tmp/work
mkdir "$work"
cp "$src/tests/parity/decoder_plain.xtf" "$work/model.xtf"
cat > "$tmp/as_readme.py" <<'PY'
# `model` for the README's block: the reference case's state_dict as torch tensors
import sys, torch
import safetensors_lite as st
weights, _ = st.read(sys.argv[1])
sd = {k: torch.tensor(t.values, dtype=torch.float32).reshape(t.shape) for k, t in weights.items()}
class Model:
    def state_dict(self):
        return dict(sd)
model = Model()
exec(compile(open(sys.argv[2]).read(), "README save block", "exec"))
PY
if (cd "$work" && $py "$tmp/as_readme.py" "$case_dir/weights.safetensors" "$tmp/save.py") > "$tmp/out" 2>&1; then
  pass "README: saving the state_dict and the tokens"; else fail "README: the save block:"; sed 's/^/    /' "$tmp/out"; fi
if (cd "$work" && bash -e "$tmp/run.sh") > "$tmp/out" 2>&1; then
  pass "README: xtc compile and xtc run"; else fail "README: the shell block:"; sed 's/^/    /' "$tmp/out"; fi
if (cd "$work" && $py "$tmp/read.py") > "$tmp/out" 2>&1 && grep -q 'torch.Size(\[1, 4, 64\])' "$tmp/out"; then
  pass "README: reading the logits ($(head -1 "$tmp/out"))"; else fail "README: the read block:"; sed 's/^/    /' "$tmp/out"; fi

# 3. x-transformers' numbers through the same tools
cat > "$tmp/grade.py" <<'PY'
import subprocess, sys, torch
import safetensors_lite as st
from xtc_safetensors import save_file, load_file
case, work = sys.argv[1], sys.argv[2]
inputs, _ = st.read(case + "/inputs.safetensors")
t = inputs["tokens"]
save_file({"tokens": torch.tensor(t.values, dtype=torch.int64).reshape(t.shape)}, work + "/case_in.safetensors")
subprocess.run(["xtc", "run", work + "/model.so", "--weights", work + "/model.safetensors", "--input",
                work + "/case_in.safetensors", "--output", work + "/case_out.safetensors"], check=True)
got = load_file(work + "/case_out.safetensors")["logits"]
e = st.read(case + "/expected.safetensors")[0]["logits"]
exp = torch.tensor(e.values, dtype=torch.float64).reshape(e.shape)
assert got.dtype == torch.float32 and list(got.shape) == e.shape, (got.dtype, got.shape, e.shape)
err, tol = (got.double() - exp).abs().max().item(), 1e-5 + 1e-3 * exp.abs().max().item()
print("logits max|a-e| %.3g (tolerance %.3g)" % (err, tol))
sys.exit(0 if err <= tol else 1)
PY
if $py "$tmp/grade.py" "$case_dir" "$work" > "$tmp/out" 2>&1; then
  pass "x-transformers' logits through save_file, xtc run, load_file: $(tail -1 "$tmp/out")"; else
  fail "x-transformers' logits:"; sed 's/^/    /' "$tmp/out"; fi
if $py "$src/tools/xtc_safetensors.py" "$work/out.safetensors" > "$tmp/out" 2>&1 &&
   grep -q '^logits  float32 \[1, 4, 64\]  \[' "$tmp/out"; then
  pass "tools/xtc_safetensors.py lists the outputs"; else fail "tools/xtc_safetensors.py FILE:"; sed 's/^/    /' "$tmp/out"; fi

# 4. the tool against an independent reader and writer
cat > "$tmp/roundtrip.py" <<'PY'
import math, sys, torch
import safetensors_lite as st
from xtc_safetensors import save_file, load_file
tmp = sys.argv[1]
g = torch.Generator().manual_seed(3)
emb = torch.randn(5, 3, generator=g)
x = {
    "f32": torch.randn(2, 3, generator=g), "f64": torch.randn(4, generator=g, dtype=torch.float64),
    "f16": torch.randn(3, 2, generator=g).half(), "bf16": torch.randn(3, generator=g).bfloat16(),
    "i64": torch.tensor([[1, 5, 9, 2], [-100, 0, 2**40, 7]]), "i32": torch.tensor([3, -4], dtype=torch.int32),
    "bool": torch.tensor([[True, False, True]]), "empty": torch.zeros(0, 4), "scalar": torch.tensor(2.5),
    "tied.a": emb, "tied.b": emb,                           # one storage, two names
    "transposed": torch.randn(4, 6, generator=g).t(),     # not contiguous
    "sliced": torch.arange(12.0).reshape(3, 4)[:, 1::2],
}
save_file(x, tmp + "/rt.safetensors", metadata={"format": "pt"})
seen, meta = st.read(tmp + "/rt.safetensors")
assert meta == {"format": "pt"}, meta
assert list(seen) == list(x), list(seen)
tags = {"f32": "F32", "f64": "F64", "f16": "F16", "bf16": "BF16", "i64": "I64", "i32": "I32", "bool": "BOOL"}
for k, t in x.items():
    s = seen[k]
    assert s.shape == list(t.shape), (k, s.shape, t.shape)
    assert s.dtype == tags.get(k, "F32"), (k, s.dtype)
    want = t.reshape(-1).tolist() if t.dtype != torch.bfloat16 else t.float().reshape(-1).tolist()
    assert s.values == want, (k, s.values[:4], want[:4])
back = load_file(tmp + "/rt.safetensors")
for k, t in x.items():
    assert back[k].dtype == t.dtype and torch.equal(back[k], t), k
# a file of the independent writer, read by load_file
st.write(tmp + "/lite.safetensors", {"tokens": st.Tensor("I64", [1, 3], [4, -1, 2**35]),
                                     "w": st.Tensor("F32", [2], [0.5, -1.25]),
                                     "m": st.Tensor("BOOL", [2], [True, False])})
r = load_file(tmp + "/lite.safetensors")
assert r["tokens"].dtype == torch.int64 and r["tokens"].tolist() == [[4, -1, 2**35]], r["tokens"]
assert r["w"].dtype == torch.float32 and r["w"].tolist() == [0.5, -1.25], r["w"]
assert r["m"].dtype == torch.bool and r["m"].tolist() == [True, False], r["m"]
print("%d tensors both ways" % (len(x) + len(r)))
PY
if $py "$tmp/roundtrip.py" "$tmp" > "$tmp/out" 2>&1; then
  pass "save_file / load_file against safetensors_lite: $(tail -1 "$tmp/out")"; else
  fail "save_file / load_file:"; sed 's/^/    /' "$tmp/out"; fi

if [ $fails -ne 0 ]; then
  echo "$fails check(s) failed"
  exit 1
fi
echo "all checks passed"
