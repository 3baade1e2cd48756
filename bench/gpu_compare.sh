#!/usr/bin/env bash
# gpu_compare.sh: xtc beside PyTorch on one GPU, in one call: medians and ratios, written to a
# results file. Measurements for the notes, never asserted by a test.
#
#   bench/gpu_compare.sh --prepare        (here, with LLVM and NVRTC: builds xtc and the kit)
#   bench/gpu_compare.sh                  (on the GPU machine, with build/gpu_kit carried there)
#   bench/gpu_compare.sh --dry-run        (anywhere: tiny shapes, PyTorch on the CPU, xtc through
#                                          the CUDA emulator; what tests/test_gpu_compare.sh runs)
# Options: --budget S (seconds for the whole call), --rounds R, --out FILE (bench/gpu_results.txt;
# the raw JSON lines beside it, .jsonl), --kit DIR, --build DIR, --arch sm_XY (sm_90), --no-xtc
# (PyTorch only). $XTC_PYTHON names the Python with PyTorch (else python3, /usr/bin/python3).
#
# The kit (build/gpu_kit, or --kit DIR) is what the GPU machine needs of xtc: the modules compiled
# with --target cuda (PTX; the driver JIT-compiles it) and gpu_bench (bench/gpu_bench.c linked
# with the runtime alone: no LLVM). Without a kit the script builds one first (cmake, then
# --prepare), which needs LLVM 19 and NVRTC on that machine. Sections, in this order, each under a
# time limit (the whole call stays under --budget seconds, 450 by default; what ran is printed
# and written whatever happens after):
#   gpt     GPT as models/gpt.xtf (vocab 20000, dim 512, 12 layers, 8 heads) at batch 8 and 1,
#           seq 1024: forward and training step (forward, backward, AdamW with clipping), f32
#           and bf16: xtc (--dtype bf16) against PyTorch eager (SDPA; bf16 autocast; fused AdamW)
#   gptm    GPT-M (vocab 20000, dim 512, 6 layers, 8 heads) at batch 8, seq 512, the same four
#   attn    causal attention alone (8 heads of 64, bf16), seq 1024 .. 16384 at 16384 tokens:
#           xtc's attention and attention_grad kernels (CUDA events) against SDPA forward and
#           backward
#   matmul  one bf16 product alone, M x K x N: 4096^3 and GPT's training-step shapes at batch 8 x
#           seq 1024 (forward with B transposed as a Linear's weight (t), the inputs' gradients,
#           the weights' gradients g^T x): xtc's tensor-core kernel (a module of that one matmul,
#           --dtype bf16) against torch.matmul (cuBLAS), device time by CUDA events, TFLOP/s
#   decode  GPT with a KV cache: tokens/s of one-token calls at context 1024 (bf16 also through
#           CUDA graphs, XTC_CUDA_GRAPHS=1)
#   compile torch.compile of the gpt section's bf16 shapes (often slow to compile: last)
# xtc and PyTorch alternate in each section, --rounds times (1 on a GPU, to stay in the budget;
# the medians of the rounds are reported). Ratios are PyTorch / xtc: above 1 when xtc is faster.
set -u
cd "$(dirname "$0")/.."
build=build kit= budget=450 rounds= dry=0 prepare=0 out= arch=sm_90 noxtc=0
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) dry=1 ;;
    --prepare) prepare=1 ;;
    --no-xtc) noxtc=1 ;;
    --build) build=$2; shift ;;
    --kit) kit=$2; shift ;;
    --budget) budget=$2; shift ;;
    --rounds) rounds=$2; shift ;;
    --out) out=$2; shift ;;
    --arch) arch=$2; shift ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_compare.sh: unknown option '$1' (--help)"; exit 2 ;;
  esac
  shift
done
start=$(date +%s)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
touch "$tmp/raw" "$tmp/log"
if [ $dry = 1 ]; then
  target=cuda-emu dev=cpu iters=1 warmup=0 tword=1 rounds=${rounds:-1}
  kit=${kit:-$tmp/kit} out=${out:-$tmp/gpu_results.txt}
  gpt_shapes=2x8,1x16 gptm_shapes=1x8 seqs=8,16 attn_tokens=16 ctx=12 ntok=4
  mm_shapes=40x64x48t,24x40x16
else
  target=cuda dev=cuda iters=10 warmup=2 tword=3 rounds=${rounds:-1}
  kit=${kit:-$build/gpu_kit} out=${out:-bench/gpu_results.txt}
  gpt_shapes=8x1024,1x1024 gptm_shapes=8x512 seqs=1024,2048,4096,8192,16384 attn_tokens=16384 ctx=1024 ntok=64
  # 4096^3; GPT's forward (qkv, out, ff1, ff2, logits); the inputs' gradients g W of ff1, ff2,
  # logits; the weights' gradients g^T x of out, ff1, ff2, logits (the step transposes g first)
  mm_shapes=4096x4096x4096,8192x512x1536t,8192x512x512t,8192x512x2048t,8192x2048x512t,8192x512x20000t
  mm_shapes=$mm_shapes,8192x2048x512,8192x512x2048,8192x20000x512,512x8192x512,2048x8192x512,512x8192x2048,20000x8192x512
fi
left() { echo $((budget - ($(date +%s) - start))); }
say() { echo "$*" | tee -a "$tmp/log"; }

# ---- the models: name vocab dim depth heads max_seq (dry: one tiny model plays every part) ----
if [ $dry = 1 ]; then
  gpt=(64 32 1 2 32) gptm=(64 32 1 2 32) attn=(64 32 1 2 32)
else
  gpt=(20000 512 12 8 1024) gptm=(20000 512 6 8 512) attn=(256 512 1 8 16384)
fi
xtf() { # xtf NAME vocab dim depth heads max_seq
  printf '%s = TransformerWrapper(num_tokens = %s, max_seq_len = %s,\n    attn_layers = Decoder(dim = %s, depth = %s, heads = %s))\n' \
    "$1" "$2" "$6" "$3" "$4" "$5"
}

# ---- the kit: modules + gpu_bench ----
make_kit() {
  [ -x "$build/xtc" ] && [ -f "$build/libxtc_rt.a" ] || {
    say "building xtc in $build"
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release > "$tmp/cmake.log" 2>&1 &&
      cmake --build "$build" -j"$(nproc)" --target xtc xtc_rt >> "$tmp/cmake.log" 2>&1 ||
      { say "cannot build xtc here: $(tail -3 "$tmp/cmake.log" | tr '\n' ' ')"; return 1; }
  }
  mkdir -p "$kit" || return 1
  cc -O2 -Iinclude bench/gpu_bench.c "$build/libxtc_rt.a" -lm -ldl -lpthread -o "$kit/gpu_bench" || return 1
  local a=() jobs=()
  [ $target = cuda ] && a=(--cuda-arch "$arch")
  for m in gpt gptm attn; do
    local -n d=$m
    xtf "$m" "${d[@]}" > "$kit/$m.xtf"
  done
  # name xtf flags...
  local list=("gpt_fwd_f32 gpt" "gpt_fwd_bf16 gpt --dtype bf16" "gpt_train_f32 gpt --train"
    "gpt_train_bf16 gpt --train --dtype bf16" "gpt_kv_f32 gpt --kv-cache" "gpt_kv_bf16 gpt --kv-cache --dtype bf16"
    "gptm_fwd_f32 gptm" "gptm_fwd_bf16 gptm --dtype bf16" "gptm_train_f32 gptm --train"
    "gptm_train_bf16 gptm --train --dtype bf16" "attn_train_bf16 attn --train --dtype bf16")
  # dry: three f32 modules of the tiny model play every part (the paths are the same; the
  # emulated 16-bit kernels are slow, and tested by the CUDA suites)
  [ $dry = 1 ] && list=("${list[0]}" "${list[2]}" "${list[4]}")
  # the matmul section's modules: one product each, c = a b, as IR text (xtc compile *.ir)
  local nmm=0
  for sh in ${mm_shapes//,/ }; do
    local mkn=(${sh//[xt]/ }) bt=0
    [ "${sh%t}" != "$sh" ] && bt=1
    local bs="${mkn[1]}, ${mkn[2]}"
    [ $bt = 1 ] && bs="${mkn[2]}, ${mkn[1]}"
    printf 'graph mm {\n  %%a = input "a" : f32[%s, %s]\n  %%b = input "b" : f32[%s]\n  %%c = matmul %%a, %%b [transpose_b=%s] : f32[%s, %s]\n  output c = %%c\n}\n' \
      "${mkn[0]}" "${mkn[1]}" "$bs" $bt "${mkn[0]}" "${mkn[2]}" > "$kit/mm_$sh.ir"
    list+=("mm_$sh mm_$sh.ir --dtype bf16")
    nmm=$((nmm + 1))
  done
  local ok=0
  for e in "${list[@]}"; do
    set -- $e
    local name=$1 model=$2
    shift 2
    [ "${model%.ir}" = "$model" ] && model=$model.xtf
    "$build/xtc" compile "$kit/$model" --target $target "${a[@]}" "$@" -o "$kit/$name.so" \
      > "$kit/$name.log" 2>&1 &
    jobs+=($!)
    [ ${#jobs[@]} -ge "$(nproc)" ] && { wait "${jobs[0]}" && ok=$((ok + 1)); jobs=("${jobs[@]:1}"); }
  done
  for j in "${jobs[@]}"; do wait "$j" && ok=$((ok + 1)); done
  if [ $dry = 1 ]; then
    for p in fwd train kv; do ln -sf "gpt_${p}_f32.so" "$kit/gpt_${p}_bf16.so"; done
    for p in fwd_f32 fwd_bf16 train_f32 train_bf16; do ln -sf "gpt_$p.so" "$kit/gptm_$p.so"; done
    ln -sf gpt_train_f32.so "$kit/attn_train_bf16.so"
  fi
  echo "target=$target arch=$arch commit=$(git rev-parse --short HEAD 2>/dev/null)" > "$kit/kit.txt"
  say "kit: $ok of ${#list[@]} modules compiled for $target into $kit ($nmm of them the matmul section's)"
}

if [ $prepare = 1 ]; then
  make_kit
  exit $?
fi
[ $noxtc = 1 ] || [ -x "$kit/gpu_bench" ] || make_kit || say "no xtc kit: the xtc columns stay empty"
# gpu_bench was linked here: where this C library is older than the kit's, it is built again from
# the runtime's sources (plain C: no LLVM, no cmake)
bench=$kit/gpu_bench
if [ $noxtc = 0 ] && [ -x "$bench" ]; then
  "$bench" > /dev/null 2>&1
  if [ $? != 2 ]; then
    say "the kit's gpu_bench does not run here ($("$bench" 2>&1 | head -1 | cut -c1-200)): building it again"
    cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Iinclude/abi -Iruntime runtime/*.c bench/gpu_bench.c -lm -ldl -lpthread \
      -o "$tmp/gpu_bench" > "$tmp/cc.log" 2>&1 && bench=$tmp/gpu_bench || say "cannot: $(tail -2 "$tmp/cc.log")"
  fi
fi

# ---- the Python with PyTorch ----
py=${XTC_PYTHON:-}
for p in python3 /usr/bin/python3; do
  [ -z "$py" ] && command -v "$p" > /dev/null && "$p" -c 'import torch' 2> /dev/null && py=$p
done
[ -n "$py" ] || say "no Python with PyTorch: the PyTorch columns stay empty"

say "gpu_compare: $(date -u '+%Y-%m-%d %H:%M UTC'), $([ $dry = 1 ] && echo 'dry run (CPU, emulator)' || echo "target $target")"
if [ $dry = 0 ]; then
  say "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
  # A driver older than the PTX NVRTC wrote (CUDA 13 writes ISA 9.0) refuses to load it: the
  # kernels use nothing past ISA 8.0 (sm_80/sm_90 mma, ldmatrix, cp.async), so copies say 8.0.
  cv=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -1)
  if [ -n "$cv" ] && [ "$cv" -lt 13 ] && [ -d "$kit" ]; then
    say "driver supports CUDA $cv: the kit's PTX ISA 9.0 relabelled 8.0 (copies in $tmp/kit)"
    mkdir -p "$tmp/kit" && cp "$kit"/* "$tmp/kit/" && kit=$tmp/kit
    for f in "$kit"/*.so; do
      "${py:-python3}" - "$f" << 'EOF'
import sys
p = sys.argv[1]
b = open(p, "rb").read()
open(p, "wb").write(b.replace(b".version 9.0\n", b".version 8.0\n"))
EOF
    done
  fi
fi

# guard SECONDS TAG COMMAND...: runs it under the smaller of SECONDS and the budget left, its JSON
# lines tagged into the raw results; a failure or a timeout is reported and the script goes on.
guard() {
  local secs=$1 tag=$2
  shift 2
  local l
  l=$(left)
  [ "$secs" -gt "$l" ] && secs=$l
  if [ "$secs" -lt 3 ]; then say "  $tag: skipped (budget spent)"; return 1; fi
  timeout -k 5 "$secs" "$@" > "$tmp/o" 2> "$tmp/e"
  local rc=$?
  grep '^{' "$tmp/o" | sed "s/^/$tag\t/" >> "$tmp/raw"
  if [ $rc = 124 ] || [ $rc = 137 ]; then say "  $tag: timed out after ${secs}s (partial results kept)"
  elif [ $rc != 0 ]; then say "  $tag: failed ($rc): $(tail -2 "$tmp/e" | tr '\n' ' ' | cut -c1-300)"; fi
  return $rc
}
xb() { # xb SECS SECTION ROUND MODE MODULE ARGS...: gpu_bench
  local secs=$1 tag="$2	xtc	$3	$5"
  shift 3
  [ $noxtc = 0 ] || return
  [ -x "$bench" ] && [ -f "$kit/$2.so" ] || { say "  $tag: no module"; return; }
  local mode=$1 mod=$2
  shift 2
  guard "$secs" "$tag" "$bench" "$mode" "$kit/$mod.so" "$@"
}
pt() { # pt SECS SECTION ROUND IMPL ARGS...: gpu_torch.py
  local secs=$1 tag="$2	torch	$3	$4"
  shift 4
  [ -n "$py" ] || return
  guard "$secs" "$tag" "$py" bench/gpu_torch.py "$@" --device $dev --iters $iters --warmup $tword
}
title() { local -n d=$1; echo "vocab ${d[0]}, dim ${d[1]}, ${d[2]} layers, ${d[3]} heads"; }
dims() { local -n d=$1; echo --vocab "${d[0]}" --dim "${d[1]}" --depth "${d[2]}" --heads "${d[3]}"; }

for r in $(seq "$rounds"); do
  say "== gpt, round $r ($(left) s left)"
  for v in fwd_f32 fwd_bf16 train_f32 train_bf16; do
    xb 60 gpt "$r" "${v%%_*}" "gpt_$v" $iters $warmup ${gpt_shapes//,/ }
  done
  pt 90 gpt "$r" eager gpt $(dims gpt) --shapes $gpt_shapes
done
for r in $(seq "$rounds"); do
  say "== gptm, round $r ($(left) s left)"
  for v in fwd_f32 fwd_bf16 train_f32 train_bf16; do
    xb 40 gptm "$r" "${v%%_*}" "gptm_$v" $iters $warmup ${gptm_shapes//,/ }
  done
  pt 40 gptm "$r" eager gpt $(dims gptm) --shapes $gptm_shapes
done
for r in $(seq "$rounds"); do
  say "== attn, round $r ($(left) s left)"
  shapes=
  for n in ${seqs//,/ }; do b=$((attn_tokens / n)); shapes="$shapes $((b > 0 ? b : 1))x$n"; done
  xb 60 attn "$r" train attn_train_bf16 $((iters < 3 ? iters : 3)) 1 $shapes
  pt 40 attn "$r" sdpa attn --seqs $seqs --tokens $attn_tokens --heads "${attn[3]}" --dim-head $((attn[1] / attn[3]))
done
for r in $(seq "$rounds"); do
  say "== matmul, round $r ($(left) s left)"
  mods=()
  for sh in ${mm_shapes//,/ }; do [ -f "$kit/mm_$sh.so" ] && mods+=("$kit/mm_$sh.so"); done
  if [ $noxtc = 0 ] && [ -x "$bench" ] && [ ${#mods[@]} -gt 0 ]; then
    guard 14 "matmul	xtc	$r	bf16" "$bench" matmul "${mods[0]}" $iters $warmup "${mods[@]:1}"
  elif [ $noxtc = 0 ]; then
    say "  matmul	xtc	$r: no module"
  fi
  pt 11 matmul "$r" cublas matmul --shapes $mm_shapes --dtype bf16
done
for r in $(seq "$rounds"); do
  say "== decode, round $r ($(left) s left)"
  xb 30 decode "$r" decode gpt_kv_f32 $ctx $ntok
  xb 30 decode "$r" decode gpt_kv_bf16 $ctx $ntok
  XTC_CUDA_GRAPHS=1 xb 30 decode "$r" decode gpt_kv_bf16 $ctx $ntok # the same through CUDA graphs
  pt 30 decode "$r" eager decode $(dims gpt) --context $ctx --tokens $ntok
done
say "== compile ($(left) s left)"
pt 150 gpt 1 compile gpt $(dims gpt) --shapes $gpt_shapes --dtypes bf16 --compile

# ---- the table ----
{
  echo "# xtc beside PyTorch: bench/gpu_compare.sh$([ $dry = 1 ] && echo ' --dry-run')"
  echo
  sed 's/^/    /' "$tmp/log"
  echo
  "${py:-python3}" bench/gpu_report.py "$tmp/raw" "$(left)" "$(title gpt)" "$(title gptm)" 2>&1 || echo "(no report: $(wc -l < "$tmp/raw") raw lines)"
} > "$tmp/results.txt"
cat "$tmp/results.txt"
mkdir -p "$(dirname "$out")" && cp "$tmp/results.txt" "$out" && cp "$tmp/raw" "${out%.*}.jsonl" 2> /dev/null
[ -n "${OUT:-}" ] && [ -d "${OUT:-}" ] && cp "$tmp/results.txt" "$tmp/raw" "$OUT/" # the device tool's return folder
echo "gpu_compare: $(( $(date +%s) - start )) s; results in $out"
