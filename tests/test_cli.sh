#!/usr/bin/env bash
# test_cli.sh BUILD_DIR SOURCE_DIR: the command line end to end: compile a parity model, describe
# it, initialise weights, run it on the case's inputs and grade the logits with compare.py;
# the demo; and the one-line errors with a non-zero exit for misuse.
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
  if "$@" > "$tmp/out" 2>&1; then pass=$((pass + 1)); echo "ok   $name"
  else fail=$((fail + 1)); echo "FAIL $name:"; sed 's/^/    /' "$tmp/out"; fi
}

case=$parity/rotary_pos_emb
check "compile --train" "$xtc" compile "$src/tests/parity/rotary_pos_emb.xtf" -o "$tmp/m.so" --train
check "info" "$xtc" info "$tmp/m.so"
grep -q "attn_layers.rotary_pos_emb.inv_freq" "$tmp/out" || { fail=$((fail + 1)); echo "FAIL info lists the buffers"; }
! grep -q "loss_scale" "$tmp/out" || { fail=$((fail + 1)); echo "FAIL an f32 training module has no loss scale"; }
check "info --source" "$xtc" info "$tmp/m.so" --source
grep -q "rotary_pos_emb = true" "$tmp/out" || { fail=$((fail + 1)); echo "FAIL the module embeds its source"; }
check "compile transformer_xl" "$xtc" compile "$src/models/transformer_xl.xtf" -O0 -o "$tmp/xl.so"
check "info transformer_xl" "$xtc" info "$tmp/xl.so"
grep -qF "symbols: b, n <= 512, p <= 512, q = min(n + p, 512)" "$tmp/out" ||
  { fail=$((fail + 1)); echo "FAIL info prints a derived symbol's definition"; }
check "run compiled --grads" "$xtc" run "$tmp/m.so" --weights "$case/weights.safetensors" \
  --input "$case/inputs.safetensors" --output "$tmp/o.safetensors" --threads 2 --grads
check "compiled logits, loss and gradients match x-transformers" $py "$parity/compare.py" "$case" \
  "$tmp/o.safetensors" --skip '^grad\.logits$'
check "init" "$xtc" init "$tmp/m.so" -o "$tmp/w.safetensors" --seed 3
check "run on fresh weights" "$xtc" run "$tmp/m.so" --weights "$tmp/w.safetensors" \
  --input "$case/inputs.safetensors" --output "$tmp/o2.safetensors"
check "compile a byte-level model" "$xtc" compile "$src/models/gpt_rotary.xtf" -o "$tmp/byte.so"
check "init it" "$xtc" init "$tmp/byte.so" -o "$tmp/byte.safetensors"
check "example program (examples/predict.c)" "$build/predict" "$tmp/byte.so" "$tmp/byte.safetensors" "hello"
grep -q "predicted next" "$tmp/out" && [ "$(grep -c '^ *[0-9]' "$tmp/out")" -eq 5 ] ||
  { fail=$((fail + 1)); echo "FAIL predict prints one prediction per position"; }
check "demo" "$xtc" demo --inference --prompt "hello"
grep -q "check .*: ok" "$tmp/out" || { fail=$((fail + 1)); echo "FAIL demo agrees with the interpreter"; }

# half_parity DTYPE U ATOL RTOL5 RTOL10: run $tmp/DTYPE.so with --grads on the parity case; logits
# and loss within 5 units of the format's roundoff U (RTOL5), gradients within 10 (RTOL10)
half_parity() {
  check "run the $1 module --grads" "$xtc" run "$tmp/$1.so" --weights "$case/weights.safetensors" \
    --input "$case/inputs.safetensors" --output "$tmp/$1.safetensors" --grads
  check "$1 logits and loss match x-transformers within 5 x $2" $py "$parity/compare.py" "$case" \
    "$tmp/$1.safetensors" --atol "$3" --rtol "$4" --skip '^grad\.'
  check "$1 gradients match x-transformers within 10 x $2" $py "$parity/compare.py" "$case" \
    "$tmp/$1.safetensors" --atol "$3" --rtol "$5" --skip '^grad\.logits$' --skip '^logits$' --skip '^loss$'
}

# CUDA through the emulator: bf16 storage (and so, by default, the matmuls on bf16 tensor cores),
# the arch and the CUDA C written out; logits and loss within 5 units of bf16's roundoff (2^-8)
# of x-transformers' numbers, gradients within 10
check "compile --target cuda-emu --dtype bf16" "$xtc" compile "$src/tests/parity/rotary_pos_emb.xtf" \
  -o "$tmp/bf16.so" --train --target cuda-emu --dtype bf16 --cuda-arch=sm_90 --emit-cuda="$tmp/bf16.cu"
grep -q "storage of floating-point tensors: bf16" "$tmp/bf16.cu" && grep -q "XTC_KERNEL" "$tmp/bf16.cu" ||
  { fail=$((fail + 1)); echo "FAIL --emit-cuda writes the bf16 CUDA C"; }
check "info of a bf16 module" "$xtc" info "$tmp/bf16.so"
grep -q "option dtype = bf16" "$tmp/out" && grep -q "option arch = sm_90" "$tmp/out" &&
  grep -q "option mma = bf16" "$tmp/out" && grep -q "tensor cores: operands in bf16" "$tmp/bf16.cu" ||
  { fail=$((fail + 1)); echo "FAIL info shows the dtype, the arch and the tensor cores --dtype bf16 implies"; }
! grep -q "loss_scale" "$tmp/out" || { fail=$((fail + 1)); echo "FAIL a bf16 training module has no loss scale"; }
half_parity bf16 2^-8 1e-3 0.0195 0.039
# fp16 training: the module has the loss-scale input, which xtc run leaves to the session (2^16,
# the gradients divided by it on the host): within 5 and 10 units of fp16's roundoff (2^-11)
check "compile --train --dtype fp16" "$xtc" compile "$src/tests/parity/rotary_pos_emb.xtf" -o "$tmp/fp16.so" \
  --train --target cuda-emu --dtype fp16
check "info of an fp16 training module" "$xtc" info "$tmp/fp16.so"
grep -q "^  loss_scale  *f32  \[\]" "$tmp/out" ||
  { fail=$((fail + 1)); echo "FAIL an fp16 training module has the scalar input loss_scale"; }
half_parity fp16 2^-11 1e-4 0.00244 0.0049
refuse "--dtype fp16 on the cpu" "stores in f32 or bf16" "$xtc" compile "$src/models/gpt.xtf" -o "$tmp/x.so" \
  --dtype fp16
refuse "unknown --dtype" "unknown dtype 'f64'" "$xtc" compile "$src/models/gpt.xtf" -o "$tmp/x.so" \
  --target cuda-emu --dtype f64
refuse "bad --cuda-arch" "--cuda-arch" "$xtc" compile "$src/models/gpt.xtf" -o "$tmp/x.so" --target cuda-emu \
  --cuda-arch=banana
refuse "--cuda-arch on the cpu" "apply to --target cuda" "$xtc" compile "$src/models/gpt.xtf" -o "$tmp/x.so" \
  --cuda-arch=sm_90

refuse "unknown command" "unknown command" "$xtc" frobnicate
refuse "compile without -o" "usage: xtc compile" "$xtc" compile "$src/models/gpt.xtf"
refuse "unknown target" "unknown target" "$xtc" compile "$src/models/gpt.xtf" -o "$tmp/x.so" --target tpu
refuse "unknown pass" "unknown pass" "$xtc" compile "$src/models/gpt.xtf" -o "$tmp/x.so" --disable-pass=nope
refuse "unknown --mma" "expected bf16, fp16 or off" "$xtc" compile "$src/models/gpt.xtf" -o "$tmp/x.so" --mma=tf32
refuse "--mma=fp16 on the cpu" "bf16 or off" "$xtc" compile "$src/models/gpt.xtf" -o "$tmp/x.so" --mma=fp16
check "compile --target cuda-emu --mma=bf16" "$xtc" compile "$src/models/tiny_gpt.xtf" -o "$tmp/mma.so" \
  --target cuda-emu --mma=bf16
check "info of the --mma module" "$xtc" info "$tmp/mma.so"
grep -q "option mma = bf16" "$tmp/out" && grep -q "option dtype = f32" "$tmp/out" ||
  { fail=$((fail + 1)); echo "FAIL info shows the matmul precision"; }
check "--dtype fp16 --mma=off" "$xtc" compile "$src/models/tiny_gpt.xtf" -o "$tmp/nomma.so" --target cuda-emu \
  --dtype fp16 --mma=off --emit-cuda="$tmp/nomma.cu"
! grep -q "tensor cores: operands in" "$tmp/nomma.cu" && grep -q "fp16 storage" "$tmp/nomma.cu" ||
  { fail=$((fail + 1)); echo "FAIL --mma=off keeps f32 matmuls"; }
check "--dtype bf16 below sm_80: no tensor cores" "$xtc" compile "$src/models/tiny_gpt.xtf" -o "$tmp/sm75.so" \
  --target cuda-emu --dtype bf16 --cuda-arch=sm_75
check "info of the sm_75 module" "$xtc" info "$tmp/sm75.so"
grep -q "option mma = off" "$tmp/out" && grep -q "option dtype = bf16" "$tmp/out" ||
  { fail=$((fail + 1)); echo "FAIL --dtype bf16 on sm_75 falls back to f32 matmuls"; }
refuse "--mma of the other 16-bit format" "rounded a second time" "$xtc" compile "$src/models/tiny_gpt.xtf" \
  -o "$tmp/x.so" --target cuda-emu --dtype fp16 --mma=bf16
refuse "--mma below sm_80" "sm_80 or newer" "$xtc" compile "$src/models/tiny_gpt.xtf" -o "$tmp/x.so" \
  --target cuda --mma=bf16 --cuda-arch=sm_75
refuse "not a module" "" "$xtc" info "$src/README.md"
check "compile inference" "$xtc" compile "$src/tests/parity/rotary_pos_emb.xtf" -o "$tmp/inf.so"
refuse "grads of an inference module" "compile it with --train" "$xtc" run "$tmp/inf.so" --grads \
  --weights "$case/weights.safetensors" --input "$case/inputs.safetensors" --output "$tmp/o3.safetensors"
refuse "weights of another model" "missing tensor\|unexpected tensor\|shape" "$xtc" run "$tmp/m.so" \
  --weights "$parity/decoder_plain/weights.safetensors" --input "$case/inputs.safetensors" --output "$tmp/o4.safetensors"
# xtc ir shows the graph the target's compile gets: heads of 512 fuse for cuda, whose attention
# kernels take heads up to 1024, and not for the cpu (256); fp16 training adds the loss scale
printf 'wide = TransformerWrapper(num_tokens = 11, max_seq_len = 8,\n    attn_layers = Decoder(dim = 16, depth = 1, heads = 1, attn_dim_head = 512))\n' > "$tmp/wide.xtf"
check "ir --target cuda --dtype fp16 --train" "$xtc" ir "$tmp/wide.xtf" --after=all --train --target cuda --dtype fp16
grep -q "= attention " "$tmp/out" && grep -q "= attention_grad " "$tmp/out" && grep -q "%loss_scale = input" "$tmp/out" ||
  { fail=$((fail + 1)); echo "FAIL heads of 512 fuse for cuda, and fp16 training has the loss-scale input"; }
check "ir --train (the cpu)" "$xtc" ir "$tmp/wide.xtf" --after=all --train
! grep -q "= attention" "$tmp/out" && ! grep -q "loss_scale" "$tmp/out" ||
  { fail=$((fail + 1)); echo "FAIL heads of 512 stay unfused for the cpu, whose kernel takes up to 256"; }
refuse "ir --dtype fp16 on the cpu" "stores in f32 or bf16" "$xtc" ir "$tmp/wide.xtf" --dtype fp16
# int8 weights: xtc quantize, a module compiled with --weights-dtype int8 on the I8 file and on the
# f32 file (the same logits, bit for bit), the interpreter on the I8 file (within f32 rounding),
# and the refusals
printf 'q = TransformerWrapper(num_tokens = 40, max_seq_len = 16,\n    attn_layers = Decoder(dim = 16, depth = 1, heads = 2))\n' > "$tmp/q.xtf"
check "compile --weights-dtype int8 --group 8" "$xtc" compile "$tmp/q.xtf" --weights-dtype int8 --group 8 -O1 -o "$tmp/q8.so"
check "info of an int8 module" "$xtc" info "$tmp/q8.so"
grep -q "option weights = int8" "$tmp/out" && grep -q "to_q.weight  *i8  *\[128, 16\]" "$tmp/out" &&
  grep -q "to_q.weight.scale  *f32  *\[128, 2\]" "$tmp/out" || { fail=$((fail + 1)); echo "FAIL info shows the int8 weights"; }
check "init (f32 weights for an int8 module)" "$xtc" init "$tmp/q8.so" -o "$tmp/qw.safetensors"
check "quantize --group 8" "$xtc" quantize "$tmp/q.xtf" "$tmp/qw.safetensors" -o "$tmp/qw8.safetensors" --group 8
grep -q "7 matmul weights quantized" "$tmp/out" || { fail=$((fail + 1)); echo "FAIL quantize counts the weights"; }
$py -c "
import json, struct
t = [[1, 2, 3, 4, 5, 6, 7]]
b = struct.pack('<7q', *t[0]); h = json.dumps({'tokens': {'dtype': 'I64', 'shape': [1, 7], 'data_offsets': [0, 56]}}).encode()
h += b' ' * ((8 - len(h) % 8) % 8); open('$tmp/qin.safetensors', 'wb').write(struct.pack('<Q', len(h)) + h + b)"
check "run the int8 module on the I8 file" "$xtc" run "$tmp/q8.so" --weights "$tmp/qw8.safetensors" --input "$tmp/qin.safetensors" --output "$tmp/qo1.safetensors"
check "run it on the f32 file" "$xtc" run "$tmp/q8.so" --weights "$tmp/qw.safetensors" --input "$tmp/qin.safetensors" --output "$tmp/qo2.safetensors"
cmp -s "$tmp/qo1.safetensors" "$tmp/qo2.safetensors" || { fail=$((fail + 1)); echo "FAIL the I8 file and the f32 file give other logits"; }
check "the interpreter on the I8 file" "$xtc" run "$tmp/q.xtf" --weights-dtype int8 --group 8 --weights "$tmp/qw8.safetensors" \
  --input "$tmp/qin.safetensors" --output "$tmp/qo3.safetensors"
check "compare the module with the interpreter" $py "$parity/compare.py" "$tmp/qo3.safetensors" "$tmp/qo1.safetensors"
check "quantize (a scale per row)" "$xtc" quantize "$tmp/q.xtf" "$tmp/qw.safetensors" -o "$tmp/qwr.safetensors"
refuse "the per-row file into a module of groups" "mis-shaped" "$xtc" run "$tmp/q8.so" --weights "$tmp/qwr.safetensors" \
  --input "$tmp/qin.safetensors" --output "$tmp/qo4.safetensors"
refuse "the interpreter wants the I8 file" "quantize the file first" "$xtc" run "$tmp/q.xtf" --weights-dtype int8 --group 8 \
  --weights "$tmp/qw.safetensors" --input "$tmp/qin.safetensors" --output "$tmp/qo5.safetensors"
refuse "int8 weights on cuda" "the cuda backend has no int8 matmul" "$xtc" compile "$tmp/q.xtf" --target cuda --weights-dtype int8 -o "$tmp/x.so"
refuse "int8 weights for training" "is for inference" "$xtc" compile "$tmp/q.xtf" --train --weights-dtype int8 -o "$tmp/x.so"
refuse "--group without int8" "--group applies to --weights-dtype int8" "$xtc" compile "$tmp/q.xtf" --group 32 -o "$tmp/x.so"
refuse "quantize an I8 file" "quantized already" "$xtc" quantize "$tmp/q.xtf" "$tmp/qw8.safetensors" -o "$tmp/x.safetensors"
# KV caches in bf16: with int8 weights (recorded), off again under --dtype bf16, and the refusals
check "compile --kv-cache --weights-dtype int8 --kv-dtype bf16" "$xtc" compile "$tmp/q.xtf" --kv-cache --weights-dtype int8 \
  --kv-dtype bf16 -O1 -o "$tmp/qkv.so"
check "info of a module with bf16 caches" "$xtc" info "$tmp/qkv.so"
grep -q "option kv_dtype = bf16" "$tmp/out" || { fail=$((fail + 1)); echo "FAIL info shows the bf16 caches"; }
check "compile --kv-cache --dtype bf16 --kv-dtype f32" "$xtc" compile "$tmp/q.xtf" --kv-cache --dtype bf16 --kv-dtype f32 -O0 \
  -o "$tmp/qkv32.so"
check "info of a module with f32 caches" "$xtc" info "$tmp/qkv32.so"
! grep -q "kv_dtype" "$tmp/out" || { fail=$((fail + 1)); echo "FAIL --kv-dtype f32 keeps the caches f32"; }
# ... and as int8 rows: recorded, with int8 weights too; refused without --kv-cache and on cuda
check "compile --kv-cache --weights-dtype int8 --kv-dtype int8" "$xtc" compile "$tmp/q.xtf" --kv-cache --weights-dtype int8 \
  --kv-dtype int8 -O1 -o "$tmp/qkv8.so"
check "info of a module with int8 caches" "$xtc" info "$tmp/qkv8.so"
grep -q "option kv_dtype = int8" "$tmp/out" || { fail=$((fail + 1)); echo "FAIL info shows the int8 caches"; }
refuse "--kv-dtype int8 without --kv-cache" "applies with --kv-cache" "$xtc" compile "$tmp/q.xtf" --kv-dtype int8 -o "$tmp/x.so"
refuse "--kv-dtype int8 on cuda" "applies to the cpu target" "$xtc" compile "$tmp/q.xtf" --kv-cache --target cuda \
  --kv-dtype int8 -o "$tmp/x.so"
refuse "bench --kv-dtype int8 without --decode" "apply with --decode" "$xtc" bench "$tmp/q.xtf" --batch 1 --seq 8 \
  --kv-dtype int8
refuse "--kv-dtype without --kv-cache" "applies with --kv-cache" "$xtc" compile "$tmp/q.xtf" --kv-dtype bf16 -o "$tmp/x.so"
refuse "--kv-dtype fp16" "expected f32, bf16 or int8" "$xtc" compile "$tmp/q.xtf" --kv-cache --kv-dtype fp16 -o "$tmp/x.so"
refuse "--kv-dtype on cuda" "applies to the cpu target" "$xtc" compile "$tmp/q.xtf" --kv-cache --target cuda-emu \
  --kv-dtype bf16 -o "$tmp/x.so"
check "help lists quantize" "$xtc" help
grep -q "quantize" "$tmp/out" || { fail=$((fail + 1)); echo "FAIL xtc help lists quantize"; }
check "compile --help" "$xtc" compile --help
grep -q -- "--weights-dtype" "$tmp/out" || { fail=$((fail + 1)); echo "FAIL compile --help shows --weights-dtype"; }
checks_done cli
