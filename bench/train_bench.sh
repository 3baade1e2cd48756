#!/usr/bin/env bash
# train_bench.sh [BUILD_DIR] [--text] [--threads T]: the training and generation benchmarks of
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
#
# The machines are shared and noisy: compare ratios taken in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
text=0
threads=2
while [ $# -gt 0 ]; do
  case $1 in
    --text) text=1 ;;
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

if [ $text = 1 ]; then
  echo
  echo "== training on ~1 MB of text: models/tiny_gpt.xtf on the project's own README and sources =="
  git ls-files 'README.md' '*.c' '*.h' '*.y' '*.l' '*.def' '*.md' 2>/dev/null | xargs cat > "$tmp/text.txt" ||
    cat README.md */*.c */*.h > "$tmp/text.txt"
  "$xtc" train models/tiny_gpt.xtf --data "$tmp/text.txt" --steps 1500 --batch 16 --seq 128 --lr 3e-3 \
    --threads "$threads" --val-every 250 --val-tokens 0 --quiet
fi
