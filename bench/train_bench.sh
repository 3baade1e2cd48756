#!/usr/bin/env bash
# train_bench.sh [BUILD_DIR] [--text] [--threads T] [--int8 [--only-int8]]: the training and generation benchmarks of
# (measurements for the note, never asserted by a test).
#
#  1. A training step (forward, backward, AdamW) of GPT-S and GPT-M (../shared/bench/README.md),
#     xtc (bench/train_step.c on a module from `xtc compile --train`) and PyTorch
#     (../shared/bench/torch_gpt.py --phases train, in its tuned setting: OpenMP OpenBLAS with the
#     SkylakeX kernels) side by side in this one run, alternating, on T threads (2): medians and
#     the ratio PyTorch / xtc (> 1: xtc is faster).
#  2. KV-cache generation speed: a GPT-S-sized model with max_seq_len 2048 (random weights),
#     greedy, 64 new tokens after prompts of 64 and 1024 bytes: tokens/s of the cached path, and of
#     full recomputation at 1024 for contrast.
#  3. With --text: `xtc train` of models/tiny_gpt.xtf on about 1 MB of the project's own text
#     (README and sources), reporting the validation loss and the text's unigram entropy in bits
#     per byte. Takes several minutes.
#  4. With --int8 (--only-int8: this alone): int8 weights (xtc compile --weights-dtype int8).
#     Decode speed: the model of 2. at context 1024 on 1 thread, f32 and int8 weights, ROUNDS (7)
#     alternating runs of bench/gpu_bench.c decode (a prompt of 768 tokens, then 256 one-token
#     calls, each reading its logits): medians of tokens/s and of the CPU time per token, and the
#     kernels' profile of one run each. Accuracy: models/tiny_gpt.xtf trained by `xtc demo`
#     (500 steps, seed 1), on the held-out last 10 % of the demo's text (cli/corpus.c, seed 1) in
#     windows of 128 bytes: perplexity with f32 weights and with int8 weights (per output row, and
#     in groups of 32), and the largest |logit difference| from f32; then the same windows decoded
#     with the KV cache (bench/kv_ppl.c) with f32, bf16 and int8 caches (--kv-dtype). Takes a few minutes
#     (DEMO_CKPT=PATH: that demo's checkpoint instead of training it again).
#
# The machines are shared and noisy: compare ratios taken in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
text=0
threads=2
int8=0
only=0
while [ $# -gt 0 ]; do
  case $1 in
    --text) text=1 ;;
    --int8) int8=1 ;;
    --only-int8) int8=1; only=1 ;;
    --threads) threads=$2; shift ;;
    *) build=$1 ;;
  esac
  shift
done
xtc=$build/xtc
shared=${XTC_SHARED_DIR:-../shared}
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
[ -x "$xtc" ] || { echo "train_bench: no $xtc (build first: cmake -S . -B $build && cmake --build $build)"; exit 1; }
cc -O2 -Iinclude bench/train_step.c "$build/libxtc_rt.a" -lm -ldl -lpthread -o "$tmp/train_step"
torch_env=(env LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp OPENBLAS_CORETYPE=SkylakeX)
field() { $py -c "import json,sys; d=json.loads(sys.stdin.read().strip().splitlines()[-1]); print(eval(sys.argv[1]))" "$1"; }

if [ $only = 0 ]; then
echo "== training step: forward + backward + AdamW, $threads threads (medians) =="
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg)"
# config: name vocab dim depth heads seq batch
for cfg in "S 256 256 4 4 256 4" "M 20000 512 6 8 512 2"; do
  read -r name vocab dim depth heads seq batch <<< "$cfg"
  cat > "$tmp/gpt_$name.xtf" <<EOF
gpt_$name = TransformerWrapper(num_tokens = $vocab, max_seq_len = $seq,
    attn_layers = Decoder(dim = $dim, depth = $depth, heads = $heads))
EOF
  "$xtc" compile "$tmp/gpt_$name.xtf" --train -o "$tmp/gpt_$name.so"
  iters=10
  [ "$name" = M ] && iters=5
  xs=()
  ts=()
  for round in 1 2; do # alternate, so both see the same machine
    x=$("$tmp/train_step" "$tmp/gpt_$name.so" "$batch" "$seq" "$threads" "$iters" 2)
    t=$("${torch_env[@]}" $py "$shared/bench/torch_gpt.py" model --config "$name" --threads "$threads" --json \
      --phases train --iters "$iters")
    xs+=("$(echo "$x" | field 'd["median_s"]')")
    ts+=("$(echo "$t" | field 'd["train"]["median_s"]')")
    echo "  GPT-$name round $round: xtc $(echo "$x" | field '"%.1f ms (forward+backward %.1f, AdamW %.1f; clean %d/%d)" % (1e3*d["median_s"], 1e3*d["fwdbwd_median_s"], 1e3*d["adamw_median_s"], d["clean_iters"], d["iters"])')," \
      "PyTorch $(echo "$t" | field '"%.1f ms (clean %d/%d)" % (1e3*d["train"]["median_s"], d["train"]["clean_iters"], d["train"]["iters"])')"
  done
  # the better round of each (the machine was quieter)
  xm=$(printf '%s\n' "${xs[@]}" | sort -g | head -1)
  tm=$(printf '%s\n' "${ts[@]}" | sort -g | head -1)
  awk -v n="$name" -v x="$xm" -v t="$tm" -v b="$batch" -v s="$seq" 'BEGIN {
    printf "GPT-%s training step: xtc %.1f ms (%.0f tok/s), PyTorch %.1f ms (%.0f tok/s), ratio PyTorch/xtc %.2f\n",
      n, 1e3 * x, b * s / x, 1e3 * t, b * s / t, t / x }'
done

echo
echo "== KV-cache generation: greedy, 64 new tokens after the prompt =="
cat > "$tmp/gen.xtf" <<'EOF'
gen = TransformerWrapper(num_tokens = 256, max_seq_len = 2048,
    attn_layers = Decoder(dim = 256, depth = 4, heads = 4))
EOF
"$xtc" compile "$tmp/gen.xtf" --kv-cache -o "$tmp/gen_kv.so"
"$xtc" compile "$tmp/gen.xtf" -o "$tmp/gen_full.so"
"$xtc" init "$tmp/gen_kv.so" -o "$tmp/gen.safetensors" --seed 1
cat README.md cli/*.c > "$tmp/prompt_src.txt"
for ctx in 64 1024; do
  prompt=$(head -c $((ctx * 4)) "$tmp/prompt_src.txt" | tr -c 'a-zA-Z0-9 .,' ' ' | head -c "$ctx")
  for t in 1 "$threads"; do
    line=$("$xtc" generate "$tmp/gen_kv.so" --weights "$tmp/gen.safetensors" --prompt "$prompt" --tokens 65 \
      --temperature 0 --threads "$t" 2>&1 >/dev/null | tail -1)
    echo "  context $ctx, $t thread(s), KV cache: $line"
  done
done
line=$("$xtc" generate "$tmp/gen_full.so" --no-cache --weights "$tmp/gen.safetensors" --prompt "$prompt" --tokens 17 \
  --temperature 0 --threads "$threads" 2>&1 >/dev/null | tail -1)
echo "  context 1024, recomputed (for contrast): $line"

fi # only

int8_bench() {
  echo
  echo "== int8 weights: decode at context 1024, 1 thread, f32 and int8 alternating (medians) =="
  echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg)"
  cat > "$tmp/gen.xtf" <<'EOF2'
gen = TransformerWrapper(num_tokens = 256, max_seq_len = 2048,
    attn_layers = Decoder(dim = 256, depth = 4, heads = 4))
EOF2
  cc -O2 -Iinclude bench/gpu_bench.c "$build/libxtc_rt.a" -lm -ldl -lpthread -o "$tmp/gpu_bench"
  "$xtc" compile "$tmp/gen.xtf" --kv-cache -o "$tmp/gen_f32.so"
  "$xtc" compile "$tmp/gen.xtf" --kv-cache --weights-dtype int8 -o "$tmp/gen_int8.so"
  for round in $(seq "${ROUNDS:-7}"); do
    for w in f32 int8; do
      GPU_BENCH_THREADS=1 "$tmp/gpu_bench" decode "$tmp/gen_$w.so" 1024 256 >> "$tmp/decode_$w.jsonl"
    done
  done
  $py - "$tmp" <<'EOF2'
import json, statistics, sys
med = {}
for w in ("f32", "int8"):
    rows = [json.loads(l) for l in open(f"{sys.argv[1]}/decode_{w}.jsonl")]
    med[w] = (statistics.median(r["tok_per_s"] for r in rows), statistics.median(r["cpu_ms_per_token"] for r in rows))
    print(f"  {w:5s} weights: {med[w][0]:7.1f} tokens/s, {med[w][1]:.3f} ms of CPU per token ({len(rows)} runs)")
print(f"  int8 / f32: {med['int8'][0] / med['f32'][0]:.2f}x tokens/s, {med['f32'][1] / med['int8'][1]:.2f}x CPU time")
EOF2
  for w in f32 int8; do
    echo "  profile, $w weights (one run):"
    GPU_BENCH_PROFILE=1 GPU_BENCH_THREADS=1 "$tmp/gpu_bench" decode "$tmp/gen_$w.so" 1024 256 2>&1 >/dev/null | sed -n '3,9p'
  done

  echo
  echo "== int8 weights: accuracy of the demo model on the demo text's held-out 10 % =="
  cat > "$tmp/corpus.c" <<'EOF2'
#include <stdio.h>
#include <stdlib.h>
#include "train.h"
int main(void) /* the text xtc demo trains on (cli/demo_train.c: 400 kB, seed 1) */
{
    unsigned char *t = malloc(400000);
    cli_corpus(t, 400000, 1);
    fwrite(t, 1, 400000, stdout);
    return 0;
}
EOF2
  cc -O1 -Icli -Iruntime -Iinclude -Iinclude/abi -Iir -Ifrontend "$tmp/corpus.c" cli/corpus.c "$build/libxtc_rt.a" \
    -lm -ldl -lpthread -o "$tmp/corpus"
  "$tmp/corpus" > "$tmp/demo.txt"
  if [ -n "${DEMO_CKPT:-}" ]; then # a checkpoint of the same demo run (xtc demo --steps 500 --seed 1 --ckpt)
    cp "$DEMO_CKPT" "$tmp/demo.safetensors"
  else
    "$xtc" demo --steps 500 --seed 1 --tokens 1 --threads "$threads" --ckpt "$tmp/demo.safetensors" > "$tmp/demo.log"
  fi
  "$xtc" compile models/tiny_gpt.xtf -o "$tmp/t_f32.so"
  "$xtc" compile models/tiny_gpt.xtf --weights-dtype int8 -o "$tmp/t_int8.so"
  "$xtc" compile models/tiny_gpt.xtf --weights-dtype int8 --group 32 -o "$tmp/t_int8g.so"
  "$xtc" quantize models/tiny_gpt.xtf "$tmp/demo.safetensors" -o "$tmp/demo.q8.safetensors" > /dev/null
  $py - "$tmp" <<'EOF2'
import json, struct, sys, numpy as np
d = sys.argv[1]
text = np.frombuffer(open(f"{d}/demo.txt", "rb").read(), dtype=np.uint8)
held = text[len(text) * 9 // 10:]
W = (len(held) - 1) // 129
win = np.stack([held[i * 129:(i + 1) * 129] for i in range(W)]).astype(np.int64)
def write(path, tensors):
    hdr, off, blobs = {}, 0, []
    for k, a in tensors.items():
        b = np.ascontiguousarray(a).tobytes()
        hdr[k] = {"dtype": "I64", "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b); blobs.append(b)
    h = json.dumps(hdr).encode(); h += b" " * ((8 - len(h) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
write(f"{d}/held.safetensors", {"tokens": win[:, :128]})
np.save(f"{d}/targets.npy", win[:, 1:])
print(f"  {W} windows of 128 bytes ({W * 128} predictions) from the last {len(held)} bytes")
EOF2
  "$xtc" run "$tmp/t_f32.so" --weights "$tmp/demo.safetensors" --input "$tmp/held.safetensors" --output "$tmp/l_f32.safetensors" --threads "$threads"
  "$xtc" run "$tmp/t_int8.so" --weights "$tmp/demo.safetensors" --input "$tmp/held.safetensors" --output "$tmp/l_int8.safetensors" --threads "$threads"
  "$xtc" run "$tmp/t_int8.so" --weights "$tmp/demo.q8.safetensors" --input "$tmp/held.safetensors" --output "$tmp/l_int8q.safetensors" --threads "$threads"
  "$xtc" run "$tmp/t_int8g.so" --weights "$tmp/demo.safetensors" --input "$tmp/held.safetensors" --output "$tmp/l_int8g.safetensors" --threads "$threads"
  $py - "$tmp" <<'EOF2'
import json, struct, sys, numpy as np
d = sys.argv[1]
def logits(name):
    b = open(f"{d}/{name}.safetensors", "rb").read(); n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])["logits"]; s, e = h["data_offsets"]
    return np.frombuffer(b[8 + n + s:8 + n + e], dtype=np.float32).reshape(h["shape"]).astype(np.float64)
t = np.load(f"{d}/targets.npy")
def ppl(z):
    z = z - z.max(-1, keepdims=True); lse = np.log(np.exp(z).sum(-1))
    picked = z[np.arange(t.shape[0])[:, None], np.arange(t.shape[1])[None, :], t]
    return float(np.exp(np.mean(lse - picked)))
f = logits("l_f32"); pf = ppl(f)
print(f"  f32 weights:  perplexity {pf:.4f} (bits per byte {np.log2(pf):.4f})")
for name, what in (("l_int8", "int8, a scale per row"), ("l_int8g", "int8, groups of 32")):
    z = logits(name); p = ppl(z)
    print(f"  {what:22s}: perplexity {p:.4f} ({100 * (p / pf - 1):+.3f} % of f32), max |logit - f32| {np.abs(z - f).max():.4f} (logits up to {np.abs(f).max():.1f})")
same = np.array_equal(logits("l_int8"), logits("l_int8q"))
print(f"  the xtc quantize file gives the same logits as the f32 file quantized at load: {same}")
EOF2
  echo "  KV-cache decoding of the same windows (bench/kv_ppl.c: a prompt of 64 bytes, then one a call),"
  echo "  the caches in f32, bf16 and int8 (--kv-dtype), with f32 and int8 weights, against f32:"
  cc -O2 -Iinclude bench/kv_ppl.c "$build/libxtc_rt.a" -lm -ldl -lpthread -o "$tmp/kv_ppl"
  tail -c 40000 "$tmp/demo.txt" > "$tmp/held.txt" # the held-out 10 % above
  "$xtc" compile models/tiny_gpt.xtf --kv-cache -o "$tmp/k_f32.so"
  "$xtc" compile models/tiny_gpt.xtf --kv-cache --kv-dtype bf16 -o "$tmp/k_kv16.so"
  "$xtc" compile models/tiny_gpt.xtf --kv-cache --kv-dtype int8 -o "$tmp/k_kv8.so"
  "$xtc" compile models/tiny_gpt.xtf --kv-cache --weights-dtype int8 --kv-dtype int8 -o "$tmp/k_w8kv8.so"
  "$tmp/kv_ppl" "$tmp/demo.safetensors" "$tmp/held.txt" 64 "$tmp/k_f32.so" "$tmp/k_kv16.so" "$tmp/k_kv8.so" "$tmp/k_w8kv8.so" |
    sed "s|$tmp/||"
}
[ $int8 = 1 ] && int8_bench

if [ $text = 1 ]; then
  echo
  echo "== training on ~1 MB of text: models/tiny_gpt.xtf on the project's own README and sources =="
  git ls-files 'README.md' '*.c' '*.h' '*.y' '*.l' '*.def' '*.md' 2>/dev/null | xargs cat > "$tmp/text.txt" ||
    cat README.md */*.c */*.h > "$tmp/text.txt"
  "$xtc" train models/tiny_gpt.xtf --data "$tmp/text.txt" --steps 1500 --batch 16 --seq 128 --lr 3e-3 \
    --threads "$threads" --val-every 250 --val-tokens 0 --quiet
fi
