#!/usr/bin/env bash
# test_convert.sh BUILD_DIR SOURCE_DIR: `xtc convert` between x-transformers versions. A checkpoint
# converted to another version runs there to the same logits and loss (checked against the
# library's own expected outputs of the source version, or against the source model run by xtc);
# where the versions compute the model differently, or a bias the target lacks is not zero, the
# conversion is refused with the reason.
set -u
build=$1
src=$2
shared=${XTC_SHARED_DIR:-$src/../shared}
compare=$shared/parity/compare.py
cases=$src/tests/parity_newer
py=/usr/bin/python3
[ -x $py ] || py=python3
xtc=$build/xtc
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=$((fail + 1)); }

# with_version XTF VERSION OUT: the model file stating another version
with_version() {
  grep -v '^xtransformers = ' "$1" | { echo "xtransformers = \"$2\""; cat; } > "$3"
}

# 1.29.2 <-> 2.26.4: names agree, 2.x stores norm gains minus one; the library's outputs hold
for pair in "v1 1.29.2 2.26.4" "v2 2.26.4 1.29.2"; do
  set -- $pair
  for c in decoder_plain use_rmsnorm attn_kv_heads ff_swiglu encoder_mask attn_qk_norm attn_gate_values; do
    d=$cases/${1}_$c
    [ "${1}_$c" = v1_attn_gate_values ] && continue # its non-zero gate bias: refused below
    with_version "$cases/${1}_$c.xtf" "$3" "$tmp/$c.xtf"
    if "$xtc" convert "$cases/${1}_$c.xtf" --weights "$d/weights.safetensors" --to "$3" -o "$tmp/$c.st" > /dev/null &&
       "$xtc" run "$tmp/$c.xtf" --weights "$tmp/$c.st" --input "$d/inputs.safetensors" --output "$tmp/$c.out" &&
       $py "$compare" "$d" "$tmp/$c.out" --skip '^grad' > "$tmp/$c.cmp"; then
      ok "${1}_$c: $2 -> $3 runs to the library's logits and loss"
    else
      bad "${1}_$c: $2 -> $3"; cat "$tmp/$c.cmp" 2>/dev/null
    fi
  done
done

# gate values: 1.x has a bias on to_v_gate, 2.x none: a non-zero one is refused
if "$xtc" convert "$cases/v1_attn_gate_values.xtf" --weights "$cases/v1_attn_gate_values/weights.safetensors" \
    --to 2.26.4 -o "$tmp/g.st" 2> "$tmp/g.err"; then
  bad "a non-zero to_v_gate.bias converted to 2.26.4"
elif grep -q "to_v_gate.bias is not zero" "$tmp/g.err"; then ok "non-zero to_v_gate.bias refused"
else bad "to_v_gate.bias refused for another reason: $(cat "$tmp/g.err")"; fi

# refusals where the math differs
expect_refusal() { # XTF WEIGHTS VERSION TEXT
  if "$xtc" convert "$1" --weights "$2" --to "$3" -o "$tmp/r.st" 2> "$tmp/r.err"; then
    bad "$(basename "$1") -> $3 converted, expected: $4"
  elif grep -q "$4" "$tmp/r.err"; then ok "$(basename "$1") -> $3 refused: $4"
  else bad "$(basename "$1") -> $3: expected '$4', got: $(cat "$tmp/r.err")"; fi
}
expect_refusal "$cases/v1_rotary_pos_emb.xtf" "$cases/v1_rotary_pos_emb/weights.safetensors" 2.26.4 "pairs dimensions"
expect_refusal "$cases/v1_attn_qk_norm.xtf" "$cases/v1_attn_qk_norm/weights.safetensors" 0.23.0 "learns a temperature"
expect_refusal "$cases/v1_use_rmsnorm.xtf" "$cases/v1_use_rmsnorm/weights.safetensors" 0.23.0 "final norm"
expect_refusal "$cases/v1_ff_swiglu.xtf" "$cases/v1_ff_swiglu/weights.safetensors" 0.23.0 "'ff_swish' has no counterpart"
expect_refusal "$src/tests/parity/decoder_plain.xtf" "$shared/parity/decoder_plain/weights.safetensors" 2.26.4 \
  "is not zero"

# 0.23.0 -> 2.26.4 -> 1.29.2 on a 0.23.0 model whose LayerNorm, to_out and to_logits biases are
# zero: every version runs it to the same logits and loss (xtc's 0.23.0 run as the reference)
d=$shared/parity/decoder_plain
$py - "$shared/parity" "$d/weights.safetensors" "$tmp/w0.st" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import safetensors_lite as st
w, _ = st.read(sys.argv[2])
for k, t in w.items():
    if k.endswith(".bias") and ".net." not in k:
        w[k] = st.Tensor(t.dtype, t.shape, [0.0] * len(t.values))
st.write(sys.argv[3], w)
PY
with_version "$src/tests/parity/decoder_plain.xtf" 0.23.0 "$tmp/p0.xtf"
with_version "$src/tests/parity/decoder_plain.xtf" 2.26.4 "$tmp/p2.xtf"
with_version "$src/tests/parity/decoder_plain.xtf" 1.29.2 "$tmp/p1.xtf"
if "$xtc" run "$tmp/p0.xtf" --weights "$tmp/w0.st" --input "$d/inputs.safetensors" --output "$tmp/p0.out" &&
   "$xtc" convert "$tmp/p0.xtf" --weights "$tmp/w0.st" --to 2.26.4 -o "$tmp/w2.st" > /dev/null &&
   "$xtc" run "$tmp/p2.xtf" --weights "$tmp/w2.st" --input "$d/inputs.safetensors" --output "$tmp/p2.out" &&
   "$xtc" convert "$tmp/p2.xtf" --weights "$tmp/w2.st" --to 1.29.2 -o "$tmp/w1.st" > /dev/null &&
   "$xtc" run "$tmp/p1.xtf" --weights "$tmp/w1.st" --input "$d/inputs.safetensors" --output "$tmp/p1.out" &&
   $py "$compare" "$tmp/p0.out" "$tmp/p2.out" --quiet > "$tmp/c2" && $py "$compare" "$tmp/p0.out" "$tmp/p1.out" --quiet > "$tmp/c1"
then ok "0.23.0 -> 2.26.4 -> 1.29.2 with zero biases: the same logits"
else bad "0.23.0 -> 2.26.4 -> 1.29.2"; cat "$tmp/c2" "$tmp/c1" 2>/dev/null; fi

echo "xtc convert: $fail failed"
[ $fail -eq 0 ]
