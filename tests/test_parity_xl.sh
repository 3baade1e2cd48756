#!/usr/bin/env bash
# test_parity_xl.sh BUILD_DIR SOURCE_DIR [PATHS]: Transformer-XL (with memory tokens) against
# x-transformers 0.23.0, 1.29.2 and 2.26.4 themselves (cases in tests/parity_xl, made by
# make_cases.py there; the `xl` kind of ../shared/parity; 1.x/2.x normalise the memories with the
# layer's pre-norm, 0.23.0 does not). Per case and path: segment 1 on `tokens` with empty
# memories, segment 2 on `tokens2` with segment 1's memories (DESIGN.md: recurrence), graded by
# ../shared/parity/compare.py: both segments' logits and memories, segment 2's loss and every
# parameter gradient. Paths: the reference interpreter (`xtc run model.xtf`), compiled CPU modules
# and emulated CUDA modules (a forward module for segment 1, a --train module for segment 2). By
# default every case runs through all three; in the sanitizer build (XTC_PARITY_EMU=some) only the
# combined cases go through the emulator; PATHS given, every case runs through those.
set -u
. "$2/tests/parity_lib.sh" "$1" "$2"
paths=${3:-interp cpu cuda-emu}
combined=" xl_memory_tokens_rotary v2_xl_memory_tokens_gqa_rotary "
# XTC_PARITY_EMU=some (the sanitizer build, tests/CMakeLists.txt): the emulator for the combined cases only
emu_cases=""
[ "${XTC_PARITY_EMU:-all}" = some ] && [ $# -lt 3 ] && emu_cases=$combined
cases_dir=$src/tests/parity_xl

# run_case CASE: every path of the case, one line per path into $tmp/CASE.log
run_case() {
  local c=$1 x=$cases_dir/$1.xtf d=$cases_dir/$1 these=$paths p o
  [ -n "$emu_cases" ] && [[ "$emu_cases" != *" $c "* ]] && these=${these/cuda-emu/}
  for p in $these; do
    o=$tmp/$c.$p
    : > "$o.err"
    if [ "$p" = interp ]; then
      run1=("$xtc" run "$x") run2=("$xtc" run "$x")
    else
      "$xtc" compile "$x" -O0 --target "$p" -o "$o.fwd.so" 2>> "$o.err" &&
        "$xtc" compile "$x" -O0 --target "$p" --train -o "$o.train.so" 2>> "$o.err"
      run1=("$xtc" run "$o.fwd.so") run2=("$xtc" run "$o.train.so")
    fi
    if { [ "$p" = interp ] || [ -f "$o.train.so" ]; } &&
      $py "$tmp/xl.py" "$d" "$o.in1.safetensors" in1 2>> "$o.err" &&
      "${run1[@]}" --weights "$d/weights.safetensors" --input "$o.in1.safetensors" --output "$o.out1.safetensors" 2>> "$o.err" &&
      $py "$tmp/xl.py" "$d" "$o.in2.safetensors" in2 "$o.out1.safetensors" 2>> "$o.err" &&
      "${run2[@]}" --weights "$d/weights.safetensors" --input "$o.in2.safetensors" --output "$o.out2.safetensors" --grads 2>> "$o.err" &&
      $py "$tmp/xl.py" "$d" "$o.safetensors" merge "$o.out1.safetensors" "$o.out2.safetensors" 2>> "$o.err"; then
      parity_grade "$c ($p)" "$d" "$o.safetensors" --skip '^grad\.logits2$'
    else
      echo "FAIL $c ($p): xtc failed:"
      sed 's/^/    /' "$o.err"
    fi
  done > "$tmp/$c.log"
}
export -f run_case
export xtc tmp cases_dir paths emu_cases

# two cases at a time (CI has two processors)
ls "$cases_dir"/*.xtf | xargs -n1 basename | sed 's/\.xtf$//' | xargs -P 2 -I{} bash -c 'run_case {}'
cat "$tmp"/*.log
pass=$(cat "$tmp"/*.log | grep -c '^ok')
fail=$(cat "$tmp"/*.log | grep -c '^FAIL')
echo "Transformer-XL with memory tokens, parity with x-transformers 0.23.0, 1.29.2 and 2.26.4 ($paths${emu_cases:+; cuda-emu only for$emu_cases}): $pass passed, $fail failed"
[ $fail -eq 0 ] && [ $pass -gt 0 ]
