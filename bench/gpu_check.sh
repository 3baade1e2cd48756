#!/usr/bin/env bash
# gpu_check.sh: are xtc's CUDA modules right on a real GPU? Small models compiled with
# --target cuda in f32, bf16 and fp16 (--dtype), run forward, as a training step (loss and every
# gradient) and as KV-cache decoding, each compared with what the CPU computed from the same
# weights and tokens. One PASS/FAIL line per case, then a summary; exit status 1 when a case
# failed. Times nothing.
#
#   bench/gpu_check.sh --prepare     (here, with LLVM and NVRTC: builds xtc if needed, then the
#                                     kit: the modules, the CPU's reference outputs, gpu_check)
#   bench/gpu_check.sh               (on the GPU machine, with build/gpu_check carried there: a C
#                                     compiler, the NVIDIA driver and Python are all it needs)
#   bench/gpu_check.sh --dry-run     (anywhere: the rows marked for it, tiny shapes, through the
#                                     CUDA emulator; what tests/test_gpu_check.sh runs)
# Options: --kit DIR (build/gpu_check), --build DIR (build), --arch sm_XY (sm_90), --jobs J
# (cases run at once: the driver's JIT compiling of the PTX is the slow part; 6), --only REGEX
# (cases whose "name dtype" matches). Each case is stopped after 60 s on a GPU.
#
# The reference: the same model compiled --target cpu (f32), run here by the same program
# (bench/gpu_check.c) on the same inputs: weights xtc_session_init_weights(seed), tokens and
# targets drawn from the seed. The kit keeps of each output its size, largest |value| and up to
# 16384 values at an odd stride (the kit stays a few MB; every row and column position is
# visited). A case passes when those values are within 1e-7 + rtol max|ref| of the device's, its
# largest |value| too, and every element of its every output is finite. rtol (forward, decode;
# gradients) per dtype, those of the emulator's tests (tests/test_cuda_mma.c: tiny_gpt through
# the tensor cores; tests/parity_run.h): f32 1e-4, 1e-3; bf16 2e-2, 5e-2; fp16 4e-3, 2e-2 (fp16
# training with the session's dynamic loss scaling).
#
# To add a case: one line in the table below (a new model: a function writing its .xtf, or a
# file under models/).
set -u
cd "$(dirname "$0")/.."
build=build kit= dry=0 prepare=0 arch=sm_90 jobs=6 only=
while [ $# -gt 0 ]; do
  case $1 in
    --dry-run) dry=1 ;;
    --prepare) prepare=1 ;;
    --build) build=$2; shift ;;
    --kit) kit=$2; shift ;;
    --arch) arch=$2; shift ;;
    --jobs) jobs=$2; shift ;;
    --only) only=$2; shift ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check.sh: unknown option '$1' (--help)"; exit 2 ;;
  esac
  shift
done

# ---- the cases ----
# name: unique; model: models/NAME.xtf or a function below; mode: fwd (BxN), train (BxN: loss and
# gradients), decode (PxT: a prompt of P tokens, then T one-token calls); dtypes: of --dtype;
# dry: the dtypes the --dry-run runs at the dry shape ("-": none).
# Paths they take on the GPU: ragged M, N, K (77, 333, 1003, ...); M = 1 (decode); M and N of 256
# and more (128 x 128 tensor-core tiles); seq >= 256 (the flash attention kernels, forward and
# backward); heads of 32, 64 and 128; causal and not; T5 relative bias and ALiBi; rotary; GLU;
# GQA (the 2.x syntax).
cases=(
# name          model           mode    shape    dry shape  dtypes          dry
  "tiny_fwd     tiny_gpt        fwd     3x77     2x5        f32,bf16,fp16   fp16"
  "tiny_train   tiny_gpt        train   5x128    2x6        f32,bf16,fp16   f32"
  "tiny_decode  tiny_gpt        decode  100x8    5x3        f32,bf16,fp16   f32"
  "rot_fwd      gpt_rotary      fwd     4x512    -          f32,bf16,fp16   -"
  "rot_train    gpt_rotary      train   2x300    -          f32,bf16        -"
  "rot_decode   gpt_rotary      decode  300x6    -          f32,bf16,fp16   -"
  "enc_fwd      enc_relpos      fwd     2x333    -          f32,bf16,fp16   -"
  "enc_train    enc_relpos      train   3x257    -          f32,bf16,fp16   -"
  "alibi_fwd    dec_alibi       fwd     1x1000   -          f32,bf16,fp16   -"
  "alibi_train  dec_alibi       train   2x384    -          f32,bf16        -"
  "alibi_decode dec_alibi       decode  260x5    -          f32,fp16        -"
  "gqa_fwd      gqa2            fwd     2x400    2x7        f32,bf16,fp16   f32"
  "gqa_train    gqa2            train   2x256    -          f32,bf16,fp16   -"
  "gqa_decode   gqa2            decode  270x6    -          f32,bf16        -"
  "h128_fwd     dec_h128        fwd     1x1024   -          f32,bf16,fp16   -"
  "h128_train   dec_h128        train   1x700    -          f32,bf16        -"
  "h128_decode  dec_h128        decode  513x4    -          f32,bf16,fp16   -"
  "pos_rot      pos_rotary      train   2x600    1x300      bf16,fp16       bf16"
  "pos_alibi    pos_alibi       train   2x400    1x300      bf16,fp16       bf16"
  "pos_rotdec   pos_rotary      decode  300x6    100x2      fp16            fp16"
)
# rtol forward/decode, rtol gradients
tol_f32="1e-4 1e-3" tol_bf16="2e-2 5e-2" tol_fp16="4e-3 2e-2"

# the custom models (models/*.xtf are used as they are)
enc_relpos() { # non-causal, T5 relative position bias, GEGLU, heads of 128, a ragged vocabulary
  echo 'enc_relpos = TransformerWrapper(num_tokens = 1003, max_seq_len = 512,
    attn_layers = Encoder(dim = 256, depth = 2, heads = 2, rel_pos_bias = true, ff_glu = true))'
}
dec_alibi() { # causal, ALiBi, heads of 64, 3 of them
  echo 'dec_alibi = TransformerWrapper(num_tokens = 515, max_seq_len = 1024,
    attn_layers = Decoder(dim = 192, depth = 2, heads = 3, alibi_pos_bias = true))'
}
gqa2() { # x-transformers 2.x: 8 query heads over 2 key/value heads of 64, SwiGLU, RMSNorm, rotary
  echo 'xtransformers = "2.26.4"
gqa2 = TransformerWrapper(num_tokens = 777, max_seq_len = 512,
    attn_layers = Decoder(dim = 256, depth = 2, heads = 8, attn_dim_head = 64, attn_kv_heads = 2,
        ff_swish = true, ff_glu = true, use_rmsnorm = true, rotary_pos_emb = true))'
}
# positions past 256 (bf16 holds integers exactly only up to 256): tables of positions (rotary
# angles, ALiBi distances) must stay f32 under 16-bit storage, and so must the inverse
# frequencies they read: rounded, they turn the rotated k and v that the caches keep (the
# decoding case; its logits hide it)
pos_rotary() {
  echo 'pos_rotary = TransformerWrapper(num_tokens = 97, max_seq_len = 1024,
    attn_layers = Decoder(dim = 32, depth = 1, heads = 2, rotary_pos_emb = true))'
}
pos_alibi() {
  echo 'pos_alibi = TransformerWrapper(num_tokens = 97, max_seq_len = 1024,
    attn_layers = Decoder(dim = 32, depth = 1, heads = 2, alibi_pos_bias = true))'
}
dec_h128() { # causal, heads of 128
  echo 'dec_h128 = TransformerWrapper(num_tokens = 1000, max_seq_len = 1024,
    attn_layers = Decoder(dim = 256, depth = 2, heads = 2))'
}

start=$(date +%s)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ $dry = 1 ]; then
  target=cuda-emu kit=${kit:-$tmp/kit} limit=600
else
  target=cuda kit=${kit:-$build/gpu_check} limit=60
fi
py=${XTC_PYTHON:-}
for p in python3 /usr/bin/python3; do
  [ -z "$py" ] && command -v "$p" > /dev/null && py=$p
done

# run_jobs FILE CMD: runs the lines of FILE (one shell command each) $jobs at a time; each
# line's output in FILE.N, its status in FILE.N.rc
run_jobs() {
  local list=$1 i=0 pids=()
  while IFS= read -r line; do
    ( bash -c "$line" > "$list.$i" 2>&1; echo $? > "$list.$i.rc" ) &
    pids+=($!)
    i=$((i + 1))
    if [ ${#pids[@]} -ge "$jobs" ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
  done < "$list"
  wait
}

# ---- the kit: modules (gzip), references, gpu_check, cases.txt ----
make_kit() {
  [ -x "$build/xtc" ] && [ -f "$build/libxtc_rt.a" ] || {
    echo "building xtc in $build"
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release > "$tmp/cmake.log" 2>&1 &&
      cmake --build "$build" -j"$(nproc)" --target xtc xtc_rt >> "$tmp/cmake.log" 2>&1 ||
      { echo "cannot build xtc here: $(tail -3 "$tmp/cmake.log" | tr '\n' ' ')"; return 1; }
  }
  rm -rf "$kit" && mkdir -p "$kit" || return 1
  cc -O2 -std=c11 -Iinclude bench/gpu_check.c "$build/libxtc_rt.a" -lm -ldl -lpthread -o "$kit/gpu_check" || return 1
  local a=() seed=0 line
  [ $target = cuda ] && a=(--cuda-arch "$arch")
  : > "$tmp/compile" && : > "$tmp/refs" && : > "$kit/cases.txt"
  declare -A done_mod
  for line in "${cases[@]}"; do
    set -- $line
    local name=$1 model=$2 mode=$3 shape=$4 dtypes=$6
    seed=$((seed + 1))
    if [ $dry = 1 ]; then shape=$5 dtypes=$7; fi
    [ "$dtypes" = - ] && continue
    if [ -z "${done_mod[$model]:-}" ]; then
      if [ -f "models/$model.xtf" ]; then cp "models/$model.xtf" "$kit/$model.xtf"; else "$model" > "$kit/$model.xtf"; fi
      done_mod[$model]=1
    fi
    local flags=
    [ $mode = train ] && flags=--train
    [ $mode = decode ] && flags=--kv-cache
    local cpu=$tmp/${model}_$mode.cpu.so
    if [ -z "${done_mod[$cpu]:-}" ]; then
      echo "'$build/xtc' compile '$kit/$model.xtf' $flags -o '$cpu'" >> "$tmp/compile"
      done_mod[$cpu]=1
    fi
    echo "'$kit/gpu_check' ref '$cpu' '$kit/$name.ref' $mode $shape $seed" >> "$tmp/refs"
    for dt in ${dtypes//,/ }; do
      local mod=${model}_${mode}_$dt.so
      if [ -z "${done_mod[$mod]:-}" ]; then
        echo "'$build/xtc' compile '$kit/$model.xtf' --target $target ${a[*]} $flags --dtype $dt -o '$tmp/$mod' && gzip -9 -n -c '$tmp/$mod' > '$kit/$mod.gz'" >> "$tmp/compile"
        done_mod[$mod]=1
      fi
      local tol=tol_$dt
      echo "$name $dt $mode $shape $seed ${!tol} $mod $name.ref" >> "$kit/cases.txt"
    done
  done
  jobs=$(nproc) run_jobs "$tmp/compile"
  local bad=0 i=0
  while IFS= read -r line; do
    [ "$(cat "$tmp/compile.$i.rc")" = 0 ] || { echo "compile failed: $line"; sed 's/^/    /' "$tmp/compile.$i"; bad=1; }
    i=$((i + 1))
  done < "$tmp/compile"
  [ $bad = 0 ] || return 1
  i=0
  while IFS= read -r line; do # the CPU runs use every core: one at a time
    bash -c "$line" > "$tmp/ref.log" 2>&1 || { echo "reference failed: $line"; sed 's/^/    /' "$tmp/ref.log"; return 1; }
  done < "$tmp/refs"
  echo "target=$target arch=$arch commit=$(git rev-parse --short HEAD 2>/dev/null) cases=$(wc -l < "$kit/cases.txt")" > "$kit/kit.txt"
  echo "kit: $(wc -l < "$kit/cases.txt") cases, $(ls "$kit"/*.so.gz | wc -l) modules for $target, $(du -sh "$kit" | cut -f1) in $kit ($(( $(date +%s) - start )) s)"
}

if [ $prepare = 1 ] || [ $dry = 1 ] || [ ! -f "$kit/cases.txt" ]; then
  make_kit || { echo "gpu_check: no kit"; exit 2; }
  [ $prepare = 1 ] && exit 0
fi

# ---- on the device ----
# CUDA graphs are opt-in (XTC_CUDA_GRAPHS=1): checked here by default, since the second run of each
# case replays its graph (XTC_CUDA_GRAPHS=0 bench/gpu_check.sh: launched step by step)
export XTC_CUDA_GRAPHS=${XTC_CUDA_GRAPHS:-1}
echo "gpu_check: $(date -u '+%Y-%m-%d %H:%M UTC'), $(cat "$kit/kit.txt")"
grep -q '^target=cuda-emu' "$kit/kit.txt" && limit=600 # the emulator: a hang guard only
[ $dry = 0 ] && echo "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
# gpu_check was linked where the kit was made: where this C library is older, it is built again
# from the runtime's sources (plain C: no LLVM, no cmake)
check=$kit/gpu_check
"$check" > /dev/null 2>&1
if [ $? != 2 ]; then
  echo "the kit's gpu_check does not run here ($("$check" 2>&1 | head -1 | cut -c1-200)): building it again"
  cc -O2 -std=c11 -D_GNU_SOURCE -Iinclude -Iinclude/abi -Iruntime runtime/*.c bench/gpu_check.c -lm -ldl -lpthread \
    -o "$tmp/gpu_check" > "$tmp/cc.log" 2>&1 && check=$tmp/gpu_check || { echo "cannot: $(tail -2 "$tmp/cc.log")"; exit 2; }
fi
# The modules, unpacked. A driver older than the PTX NVRTC wrote (CUDA 13 writes ISA 9.0) refuses
# to load it: the kernels use nothing past ISA 8.0 (sm_80/sm_90 mma, ldmatrix, cp.async), so
# where the driver supports CUDA < 13 the copies say 8.0.
relabel=0
cv=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -1)
if [ $dry = 0 ] && [ -n "$cv" ] && [ "$cv" -lt 13 ]; then
  echo "driver supports CUDA $cv: the PTX ISA 9.0 relabelled 8.0"
  relabel=1
fi
mkdir -p "$tmp/mods"
"$py" - "$kit" "$tmp/mods" $relabel << 'EOF' || { echo "gpu_check: cannot unpack the modules"; exit 2; }
import gzip, os, sys
kit, out, relabel = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
for f in os.listdir(kit):
    if f.endswith(".so.gz"):
        b = gzip.open(os.path.join(kit, f)).read()
        if relabel:
            b = b.replace(b".version 9.0\n", b".version 8.0\n")
        p = os.path.join(out, f[:-3])
        open(p, "wb").write(b)
        os.chmod(p, 0o755)
EOF

: > "$tmp/run"
while read -r name dt mode shape seed rtol rtolg mod ref; do
  [ -n "$only" ] && ! echo "$name $dt" | grep -Eq -- "$only" && continue
  echo "$name $dt" >> "$tmp/names"
  echo "timeout -k 5 $limit '$check' check '$tmp/mods/$mod' '$kit/$ref' $mode $shape $seed $rtol $rtolg" >> "$tmp/run"
done < "$kit/cases.txt"
[ -s "$tmp/run" ] || { echo "gpu_check: no case matches"; exit 2; }
run_jobs "$tmp/run"
pass=0 fail=0 i=0
while read -r name dt; do
  rc=$(cat "$tmp/run.$i.rc")
  if [ "$rc" = 0 ]; then
    pass=$((pass + 1))
    printf 'PASS %-13s %-5s %s\n' "$name" "$dt" "$(tail -1 "$tmp/run.$i")"
  else
    fail=$((fail + 1))
    why=$([ "$rc" = 124 ] && echo "timed out" || echo "status $rc")
    printf 'FAIL %-13s %-5s (%s)\n' "$name" "$dt" "$why"
    sed 's/^/       /' "$tmp/run.$i"
  fi
  i=$((i + 1))
done < "$tmp/names"
echo "gpu_check: $pass passed, $fail failed of $((pass + fail)) ($(( $(date +%s) - start )) s)"
[ $fail = 0 ]
