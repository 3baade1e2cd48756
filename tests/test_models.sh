#!/usr/bin/env bash
# test_models.sh BUILD_DIR SOURCE_DIR: every model in models/ checks, lowers, verifies, and its
# IR text round-trips exactly (print -> parse -> print), in inference and training form.
set -u
build=$1
src=$2
xtc=$build/xtc
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
for m in "$src"/models/*.xtf; do
  name=$(basename "$m" .xtf)
  variants=("" "--train --mask")
  # Transformer-XL refuses a padding mask (x-transformers 0.23.0 crashes on mask + mems)
  [ "$name" = transformer_xl ] && variants=("" "--train")
  for flags in "${variants[@]}"; do
    if ! "$xtc" ir "$m" $flags > "$tmp/$name.ir" 2> "$tmp/$name.err"; then
      echo "FAIL $name $flags: xtc ir failed"; sed 's/^/    /' "$tmp/$name.err"
      fail=$((fail + 1)); continue
    fi
    if ! "$build/ir_roundtrip" "$tmp/$name.ir" > "$tmp/$name.ir2" 2> "$tmp/$name.err"; then
      echo "FAIL $name $flags: the printed IR does not parse"; sed 's/^/    /' "$tmp/$name.err"
      fail=$((fail + 1)); continue
    fi
    if cmp -s "$tmp/$name.ir" "$tmp/$name.ir2"; then
      echo "ok   $name $flags ($(grep -c ' = ' "$tmp/$name.ir") IR lines round-trip)"
      pass=$((pass + 1))
    else
      echo "FAIL $name $flags: round trip differs:"; diff "$tmp/$name.ir" "$tmp/$name.ir2" | head -20
      fail=$((fail + 1))
    fi
  done
done
echo "models: $pass passed, $fail failed"
[ $fail -eq 0 ]
