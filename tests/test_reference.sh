#!/usr/bin/env bash
# test_reference.sh BUILD_DIR SOURCE_DIR: xtc against an independent PyTorch reference of
# ../shared/XT-SEMANTICS.md (tests/reference/xt_ref.py) on models that mix several options per
# layer (tests/reference/cases.py). First the reference itself is checked against the cases that
# x-transformers 0.23.0 produced (../shared/parity, tests/reference/check_library.py: outputs,
# loss and every gradient). Then the combination cases are generated into a temporary folder, run by
# `xtc run` (the reference interpreter, double precision) and graded with the shared
# compare.py at the DESIGN.md tolerance (max|a-e| <= 1e-5 + 1e-3 max|e| per tensor); then again
# through compiled modules (`xtc compile`, float32, at $XTC_REFERENCE_OPT, default -O0;
# XTC_REFERENCE_COMPILED=0 skips them). Transformer-XL cases run segment by segment, each fed the
# reference's memories of the one before. Gradients (grad.<param>) are graded when `xtc run --help`
# offers --grads; otherwise the forward outputs and the loss only. Every case must run: a
# refusal is a failure.
set -u
build=$1
src=$2
shared=${XTC_SHARED_DIR:-$src/../shared}
compare=$shared/parity/compare.py
py=/usr/bin/python3
[ -x $py ] || py=python3
xtc=$build/xtc
opt=${XTC_REFERENCE_OPT:--O0}
if [ ! -f "$compare" ]; then
  echo "FAIL: $compare not found (set XTC_SHARED_DIR)"
  exit 1
fi
if ! $py -c 'import torch' 2>/dev/null; then
  echo "SKIP: $py cannot import torch (Debian python3-torch)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# the oracle first: xt_ref.py must reproduce the library's own cases
if ! lib=$(XTC_SHARED_DIR=$shared $py "$src/tests/reference/check_library.py" "$shared/parity" 2>&1); then
  echo "FAIL: the PyTorch reference disagrees with x-transformers' own cases:"
  echo "$lib" | grep -v '^ok' | sed 's/^/    /'
  exit 1
fi
echo "$lib" | tail -1

XTC_SHARED_DIR=$shared $py "$src/tests/reference/cases.py" "$tmp" > "$tmp/cases.txt" || {
  echo "FAIL: tests/reference/cases.py could not generate the cases"
  exit 1
}

grads=0
if "$xtc" run --help 2>&1 | grep -q -- '--grads'; then
  grads=1
  echo "grading outputs, loss and gradients"
else
  echo "grading outputs and loss only: gradients NOT graded (xtc run has no --grads yet)"
fi

# masks.py IN OUT MODULE_INPUTS...: the stage's inputs as a module compiled with --mask reads
# them: the mask inputs it has but the case lacks are all true
cat > "$tmp/masks.py" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import safetensors_lite as st
inp, meta = st.read(sys.argv[2])
want = sys.argv[4:]
like = {"mask": "tokens", "context_mask": "context", "src_mask": "src", "tgt_mask": "tgt"}
for m, of in like.items():
    if m in want and m not in inp and of in inp:
        shape = list(inp[of].shape[:2])
        inp[m] = st.Tensor("BOOL", shape, [True] * (shape[0] * shape[1]))
st.write(sys.argv[3], inp, meta)
PY

# has_mask.py PARITY_DIR FILES...: exit 0 when an input file holds a mask
cat > "$tmp/has_mask.py" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import safetensors_lite as st
sys.exit(0 if any(k.endswith("mask") for f in sys.argv[2:] for k in st.read(f)[0]) else 1)
PY

inputs_of() { # the input names of a module, from xtc info
  "$xtc" info "$1" | awk '/^inputs:/ { on = 1; next } /^[a-z]/ { on = 0 } on { print $1 }'
}

# compile CASE: the case's modules for the compiled pass: $case.fwd.so for stages without
# gradients, $case.train.so (--train) for the others; --mask when any stage has a mask input
compile_case() {
  local case=$1 d=$tmp/$1 flags=()
  if $py "$tmp/has_mask.py" "$shared/parity" $(awk -v d="$d" '{ print d "/" $1 }' "$d/stages"); then
    flags=(--mask)
  fi
  if grep -q ' nograds$' "$d/stages"; then
    "$xtc" compile "$d/$case.xtf" $opt "${flags[@]}" -o "$tmp/$case.fwd.so" 2> "$tmp/$case.fwd.err" || return 1
  fi
  if [ $grads = 1 ] && grep -q ' grads$' "$d/stages"; then
    "$xtc" compile "$d/$case.xtf" $opt --train "${flags[@]}" -o "$tmp/$case.train.so" 2> "$tmp/$case.train.err" || return 1
  fi
  return 0
}

# grade CASE MODE: every stage of the case through the interpreter (MODE interp: xtc run on the
# .xtf) or through its compiled modules (MODE compiled); prints one line, returns 0 when all pass
grade() {
  local case=$1 mode=$2 d=$tmp/$1 worst="" ntensors=0 bad=""
  local inputs expected stage_grads
  while read -r inputs expected stage_grads; do
    local flags=() skip=() model=$d/$case.xtf in=$d/$inputs
    if [ $grads = 1 ] && [ "$stage_grads" = grads ]; then
      flags=(--grads)
    else
      skip=(--skip '^grad\.')
    fi
    if [ $mode = compiled ]; then
      model=$tmp/$case.fwd.so
      [ ${#flags[@]} -gt 0 ] && model=$tmp/$case.train.so
      in=$tmp/$case.${inputs%.safetensors}.masked.safetensors
      $py "$tmp/masks.py" "$shared/parity" "$d/$inputs" "$in" $(inputs_of "$model") || {
        bad="cannot prepare $inputs"
        break
      }
      flags+=(--threads 2)
    fi
    local out=$tmp/$case.$mode.${inputs%.safetensors}.out.safetensors
    if ! "$xtc" run "$model" --weights "$d/weights.safetensors" --input "$in" \
        --output "$out" "${flags[@]}" 2> "$tmp/err"; then
      bad="xtc run failed on $inputs:
$(sed 's/^/    /' "$tmp/err")"
      break
    fi
    local res rc w
    res=$($py "$compare" "$d/$expected" "$out" "${skip[@]}" 2>&1)
    rc=$?
    ntensors=$((ntensors + $(echo "$res" | grep -c '^ok')))
    # worst tensor: the largest max_abs_err / limit
    w=$(echo "$res" | awk '/max_abs_err/ { for (i = 1; i < NF; i++) { if ($i == "max_abs_err") e = $(i+1); if ($i == "limit") l = $(i+1) }
          r = e / l; if (r >= wr) { wr = r; we = e; wn = $2 } }
          END { if (wn != "") printf "%.2e of limit (max_abs_err %.2e, %s)", wr, we, wn }')
    if [ -n "$w" ]; then worst="$worst${worst:+; }$w"; fi
    if [ $rc -ne 0 ]; then
      bad="$expected:
$(echo "$res" | grep -v '^ok' | sed 's/^/    /')"
      break
    fi
  done < "$d/stages"
  local tag=""
  [ $mode = compiled ] && tag=" [compiled $opt]"
  if [ -z "$bad" ]; then
    echo "ok   $case$tag ($ntensors tensors; worst $worst)"
    return 0
  fi
  echo "FAIL $case$tag: $bad"
  return 1
}

pass=0
fail=0
while read -r case; do
  if grade "$case" interp; then pass=$((pass + 1)); else fail=$((fail + 1)); fi
done < "$tmp/cases.txt"
what="forward"
[ $grads = 1 ] && what="forward and gradients"
echo "reference combinations ($what), interpreter: $pass passed, $fail failed"

# the same stages through compiled modules (LLVM at $XTC_REFERENCE_OPT, default -O0: the same
# kernels, 0.2 s a module instead of 3; Transformer-XL segments chain their mems as above)
cpass=0
cfail=0
if [ "${XTC_REFERENCE_COMPILED:-1}" = 1 ] && "$xtc" compile --help 2>&1 | grep -q -- '--train'; then
  while read -r case; do
    if ! compile_case "$case"; then
      echo "FAIL $case [compiled $opt]: xtc compile failed:"
      cat "$tmp/$case".*.err 2>/dev/null | sed 's/^/    /'
      cfail=$((cfail + 1))
    elif grade "$case" compiled; then
      cpass=$((cpass + 1))
    else
      cfail=$((cfail + 1))
    fi
  done < "$tmp/cases.txt"
  echo "reference combinations ($what), compiled modules ($opt): $cpass passed, $cfail failed"
else
  echo "compiled modules NOT graded (XTC_REFERENCE_COMPILED=0, or no xtc compile --train)"
fi
[ $fail -eq 0 ] && [ $pass -gt 0 ] && [ $cfail -eq 0 ]
