#!/usr/bin/env bash
# test_parity_newer.sh BUILD_DIR SOURCE_DIR [PATHS]: parity with x-transformers 1.29.2 and 2.26.4.
# The cases in tests/parity_newer were made by those libraries themselves (make_cases.py there);
# each has its .xtf beside it, written from the same constructor under a first statement
# xtransformers = "<version>". Every case must reproduce the library's logits, loss and every
# parameter gradient within the DESIGN.md tolerance (graded by ../shared/parity/compare.py)
# through each path of PATHS: the reference interpreter (`xtc run model.xtf --grads`), a compiled
# CPU training module and an emulated CUDA training module (`xtc compile --train [--mask]
# --target T -O0`, then `xtc run model.so --grads`). By default every case runs through all three
# (the emulated compiles are ~3.5 s a module); in the sanitizer build (XTC_PARITY_EMU=some) only
# the combined cases go through the emulator.
set -u
. "$2/tests/parity_lib.sh" "$1" "$2"
paths=${3:-interp cpu cuda-emu}
combined=" v1_gqa_swiglu_rms_rotary v2_gqa_swiglu_rms_rotary v2_qk_norm_rotary_mqa_mask v1_rotary_xpos v2_xpos_gqa_qk_norm_mask "
# XTC_PARITY_EMU=some (the sanitizer build, tests/CMakeLists.txt): the emulator for the combined cases only
emu_cases=""
[ "${XTC_PARITY_EMU:-all}" = some ] && [ $# -lt 3 ] && emu_cases=$combined
cases_dir=$src/tests/parity_newer

# run_case CASE: every path of the case, one line per path into $tmp/CASE.log
run_case() {
  local c=$1 dir=$cases_dir/$1 x=$cases_dir/$1.xtf these=$paths p flags
  [ -n "$emu_cases" ] && [[ "$emu_cases" != *" $c "* ]] && these=${these/cuda-emu/}
  for p in $these; do
    if [ "$p" = interp ]; then
      "$xtc" run "$x" --weights "$dir/weights.safetensors" --input "$dir/inputs.safetensors" \
        --output "$tmp/$c.$p.safetensors" --grads 2> "$tmp/$c.err"
    else
      flags="--train"
      grep -q '"mask_lengths"' "$dir/config.json" && flags="$flags --mask"
      "$xtc" compile "$x" -O0 --target "$p" $flags -o "$tmp/$c.$p.so" 2> "$tmp/$c.err" &&
        "$xtc" run "$tmp/$c.$p.so" --weights "$dir/weights.safetensors" --input "$dir/inputs.safetensors" \
          --output "$tmp/$c.$p.safetensors" --grads 2>> "$tmp/$c.err"
    fi
    if [ $? -ne 0 ]; then
      echo "FAIL $c ($p): xtc failed:"
      sed 's/^/    /' "$tmp/$c.err"
      continue
    fi
    parity_grade "$c ($p)" "$dir" "$tmp/$c.$p.safetensors" --skip '^grad\.logits$'
  done > "$tmp/$c.log"
}
export -f run_case
export xtc tmp cases_dir paths emu_cases

# two cases at a time (CI has two processors)
ls -d "$cases_dir"/*/ | xargs -n1 basename | xargs -P 2 -I{} bash -c 'run_case {}'
ncases=$(ls -d "$cases_dir"/*/ | wc -l)
cat "$tmp"/*.log
pass=$(cat "$tmp"/*.log | grep -c '^ok')
fail=$(cat "$tmp"/*.log | grep -c '^FAIL')
echo "parity with x-transformers 1.29.2 and 2.26.4 ($paths${emu_cases:+; cuda-emu only for$emu_cases}): $pass passed, $fail failed ($ncases cases)"
[ $fail -eq 0 ] && [ $pass -gt 0 ] && [ $ncases -gt 0 ]
