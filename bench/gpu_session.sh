#!/usr/bin/env bash
# gpu_session.sh: everything a session lent a GPU runs, in one call of a known length: the
# correctness check (gpu_check.sh), NCCL end to end (nccl_check.sh), xtc beside PyTorch
# (gpu_compare.sh) and per-kernel profiles of the bf16 training step, the bf16 forward, the
# attention-alone module and bf16 decoding. Every part writes to the output folder; a part that fails or runs out of
# time is reported and the next one runs.
#
#   bench/gpu_session.sh --prepare        (here, with LLVM and NVRTC: the three kits)
#   bench/gpu_session.sh OUTDIR [BUDGET]  (on the GPU machine, build/gpu_check, build/gpu_kit and
#                                          build/nccl_kit carried there; BUDGET: seconds for
#                                          gpu_compare, 230 by default; the whole call takes about
#                                          BUDGET + 120 s)
# Writes OUTDIR/gpu_check.txt, nccl_check.txt, gpu_results.txt (+ .jsonl), profile.txt.
set -u
cd "$(dirname "$0")/.."
if [ "${1:-}" = --prepare ]; then
  bash bench/gpu_check.sh --prepare && bash bench/gpu_compare.sh --prepare &&
    bash bench/nccl_check.sh --prepare
  exit $?
fi
case ${1:-} in ''|-h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;; esac
out=$1 budget=${2:-230}
mkdir -p "$out"
part() { # part SECONDS FILE COMMAND...
  local secs=$1 file=$out/$2
  shift 2
  echo "== $* ($(date -u +%T))"
  timeout -k 5 "$secs" "$@" > "$file" 2>&1
  echo "rc $?" >> "$file"
  tail -3 "$file"
}
part 120 gpu_check.txt bash bench/gpu_check.sh
part 60 nccl_check.txt bash bench/nccl_check.sh
part $((budget + 30)) gpu_compare.log bash bench/gpu_compare.sh --budget "$budget" --out "$out/gpu_results.txt"
kit=build/gpu_kit
for m in "train gpt_train_bf16 3 1 8x1024" "train gpt_train_f32 3 1 8x1024" \
  "fwd gpt_fwd_bf16 3 1 8x1024" "train attn_train_bf16 3 1 4x4096" "decode gpt_kv_bf16 1024 64"; do
  set -- $m
  echo "=== $m" >> "$out/profile.txt"
  GPU_BENCH_PROFILE=1 timeout -k 5 60 "$kit/gpu_bench" "$1" "$kit/$2.so" "${@:3}" >> "$out/profile.txt" 2>&1
done
echo "== done ($(date -u +%T))"
