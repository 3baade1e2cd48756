#!/usr/bin/env bash
# test_gpu_compare.sh BUILD_DIR SOURCE_DIR: bench/gpu_compare.sh without a GPU, so that the call
# a session with a lent GPU makes works the first time.
#  1. --dry-run: the kit built (cuda-emu modules of a tiny GPT and the matmul section's
#     one-product modules compiled from IR text, gpu_bench), every section run through the
#     emulator and PyTorch on the CPU, and the report's tables filled from both tools (numbers
#     in the xtc and PyTorch columns of each section).
#  2. --no-xtc with a PyTorch that hangs after its first line and a budget of 5 s: the section
#     is cut at the budget, its partial line still reported, the later sections skipped, and the
#     script ends with its table and status 0.
# Times are never checked against a limit (the emulator's figures are not GPU figures).
set -u
build=$(cd "$1" && pwd)
src=$2
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$src/tests/checks.sh"
expect() { # expect NAME PATTERN FILE: grep -E must find PATTERN in FILE
  if grep -Eq -- "$2" "$3"; then pass=$((pass + 1)); echo "ok   $1"
  else fail=$((fail + 1)); echo "FAIL $1 (no '$2' in):"; sed 's/^/    /' "$3"; fi
}
if ! $py -c 'import torch' 2> /dev/null; then
  echo "SKIP test_gpu_compare: $py has no PyTorch (apt-get install python3-torch)"
  exit 77
fi
num='[0-9]+\.[0-9]+'

bash "$src/bench/gpu_compare.sh" --dry-run --build "$build" --kit "$tmp/kit" --out "$tmp/r.txt" > "$tmp/log" 2>&1
rc=$?
expect "dry run: exit 0 (was $rc)" "^gpu_compare: [0-9]+ s; results in" "$tmp/log"
expect "dry run: the kit" "kit: 5 of 5 modules compiled for cuda-emu into .* \(2 of them the matmul section's\)" "$tmp/r.txt"
expect "dry run: a matmul module's IR (B transposed)" '%c = matmul %a, %b \[transpose_b=1\] : f32\[40, 48\]' "$tmp/kit/mm_40x64x48t.ir"
expect "dry run: on the emulator" "xtc device: the xtc CUDA emulator" "$tmp/r.txt"
for row in "2x8 forward f32" "2x8 forward bf16" "1x16 train step f32" "1x16 train step bf16" "1x8 train step bf16"; do
  expect "dry run: gpt/gptm row '$row' from both tools" "^$row +$num +$num +$num +$num +- +$num" "$tmp/r.txt"
done
expect "dry run: attention from both tools" "^16 \(1\) +$num +$num +$num +$num" "$tmp/r.txt"
for row in "40x64x48t" "24x40x16"; do
  expect "dry run: matmul row '$row' from both tools" "^$row +$num +$num +$num +$num +${num}x" "$tmp/r.txt"
done
expect "dry run: matmul's xtc line (bf16 module, emulated)" '^matmul	xtc	1	bf16	\{"mode": "matmul", .*"m": 40, "k": 64, "n": 48, .*"kernels_ms": [0-9]' "$tmp/r.jsonl"
expect "dry run: matmul's PyTorch line" '^matmul	torch	1	cublas	\{"kind": "matmul", .*"m": 24, "k": 40, "n": 16, "b_transposed": 0' "$tmp/r.jsonl"
expect "dry run: decode from both tools" "^context 12 f32 +xtc +[0-9]+ +PyTorch eager +[0-9]+" "$tmp/r.txt"
expect "dry run: bf16 decode also through CUDA graphs" "^context 12 bf16 +xtc +[0-9]+ .* graphs +[0-9]+" "$tmp/r.txt"
expect "dry run: the step reading every output timed" '^gpt	xtc	1	gpt_train_bf16	\{.*"read_all_ms": [0-9]' "$tmp/r.jsonl"
expect "dry run: torch.compile's section ran" "note: torch.compile is not in PyTorch|compile" "$tmp/r.txt"
expect "dry run: raw lines kept" '^attn	torch	1	sdpa	\{' "$tmp/r.jsonl"
if grep -Eq "failed|timed out|no module|skipped" "$tmp/r.txt"; then
  fail=$((fail + 1)); echo "FAIL dry run: a section failed:"; sed 's/^/    /' "$tmp/r.txt"
else pass=$((pass + 1)); echo "ok   dry run: no section failed"; fi

cat > "$tmp/hangpy" << EOF
#!/bin/sh
case "\$*" in
  *gpu_torch.py*) echo '{"kind": "gpt", "impl": "eager", "mode": "fwd", "dtype": "f32", "batch": 2, "seq": 8, "median_ms": 1.5, "min_ms": 1.0, "device": "cpu", "torch": "hung"}'
                  exec sleep 60 ;;
  *) exec $py "\$@" ;;
esac
EOF
chmod +x "$tmp/hangpy"
XTC_PYTHON=$tmp/hangpy bash "$src/bench/gpu_compare.sh" --dry-run --no-xtc --budget 5 --out "$tmp/h.txt" > "$tmp/hlog" 2>&1
rc=$?
expect "budget: exit 0 (was $rc)" "^gpu_compare: [0-9]+ s; results in" "$tmp/hlog"
expect "budget: the hung section cut" "gpt	torch	1	eager: timed out after [0-9]+s \(partial results kept\)" "$tmp/h.txt"
expect "budget: its partial line reported" "^2x8 forward f32 +- +- +- +1\.50 +-" "$tmp/h.txt"
expect "budget: the later sections skipped" "skipped \(budget spent\)" "$tmp/h.txt"
checks_done test_gpu_compare
