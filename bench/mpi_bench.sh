#!/usr/bin/env bash
# mpi_bench.sh [BUILD_DIR] [--steps K]: data-parallel scaling of `xtc train` (measurements for the
# note, never asserted by a test) on GPT-S (vocab 256, dim 256, depth 4, heads 4; batch 4 x 256
# tokens, as bench/train_bench.sh), the same global batch each way:
#   - 1 process x 2 threads against `mpirun -np 2` x 1 thread each: tokens/s (the training line's
#     running average over the last steps) and their ratio (2 ranks / 1 process);
#   - 2 ranks with --zero1 (each rank keeps the AdamW state of its half): tokens/s against the
#     replicated optimizer's 2 ranks (the all-gather of the weights after each step costs that);
#   - the time per step the gradient sums take, during the backward pass (copies and starts in
#     the step hook) and after it (the rest and the wait, which includes waiting for the slower
#     rank), as `xtc train` reports it.
# Two alternating rounds, the better of each kept. The machines are shared: compare ratios taken
# in the same run.
set -euo pipefail
cd "$(dirname "$0")/.."
build=build
steps=30
while [ $# -gt 0 ]; do
  case $1 in
    --steps) steps=$2; shift ;;
    *) build=$1 ;;
  esac
  shift
done
xtc=$build/xtc
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
command -v mpirun > /dev/null || { echo "mpi_bench: no mpirun (apt-get install openmpi-bin)"; exit 1; }
cat > "$tmp/gpt_S.xtf" <<'XTF'
gpt_S = TransformerWrapper(num_tokens = 256, max_seq_len = 256,
    attn_layers = Decoder(dim = 256, depth = 4, heads = 4))
XTF
"$xtc" compile "$tmp/gpt_S.xtf" --train -o "$tmp/gpt_S.so"
cat README.md cli/*.c runtime/*.c > "$tmp/text.txt"
args=(--data "$tmp/text.txt" --steps "$steps" --batch 4 --seq 256 --val-every 0 --val-tokens 256 --quiet --seed 1)
tps() { sed -n 's/^step .* \([0-9]*\) tok\/s.*/\1/p' "$1" | tail -1; }
echo "machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load $(cut -d' ' -f1-3 /proc/loadavg)"
one=()
two=()
zero=()
for round in 1 2; do
  "$xtc" train "$tmp/gpt_S.so" "${args[@]}" --threads 2 > "$tmp/one.out"
  mpirun --oversubscribe --allow-run-as-root -np 2 "$xtc" train "$tmp/gpt_S.so" "${args[@]}" --threads 1 > "$tmp/two.out"
  mpirun --oversubscribe --allow-run-as-root -np 2 "$xtc" train "$tmp/gpt_S.so" "${args[@]}" --threads 1 --zero1 \
    > "$tmp/zero.out"
  one+=("$(tps "$tmp/one.out")")
  two+=("$(tps "$tmp/two.out")")
  zero+=("$(tps "$tmp/zero.out")")
  echo "  round $round: 1 process x 2 threads ${one[-1]} tok/s; 2 ranks x 1 thread ${two[-1]} tok/s," \
    "with --zero1 ${zero[-1]}; $(grep '^gradient sums' "$tmp/two.out")"
done
o=$(printf '%s\n' "${one[@]}" | sort -g | tail -1)
t=$(printf '%s\n' "${two[@]}" | sort -g | tail -1)
z=$(printf '%s\n' "${zero[@]}" | sort -g | tail -1)
awk -v o="$o" -v t="$t" -v z="$z" 'BEGIN { printf "GPT-S, global batch 4 x 256: 1 process x 2 threads %d tok/s, " \
  "2 ranks x 1 thread %d tok/s, ratio %.2f; with --zero1 %d tok/s (%.2f of the replicated optimizer)\n",
  o, t, t / o, z, z / t }'
