#!/usr/bin/env bash
# test_nccl.sh BUILD_DIR SOURCE_DIR: NCCL for CUDA training modules without a GPU: a cuda-emu
# module (its device memory is host memory) with libfake_nccl.so (tests/fake_nccl.c, a stand-in
# for libnccl.so.2 of one rank) named by XTC_NCCL. bench/nccl_check.c (the device check of
# bench/nccl_check.sh) trains the module alone and with a one-rank NCCL communicator: the same
# losses and weights bit for bit, every gradient all-reduced through the library at every step
# (its count), the device's AdamW step in both. XTC_NCCL naming a missing file, and a CPU module,
# are refused with the reason. The runs under mpirun (bootstrap, fallback message) are in test_mpi.sh.
set -u
# the tiny GPT and ok/bad
. "$(dirname "$0")/tiny_setup.sh" "$@"
tiny_compile "$tmp/emu.so" --target cuda-emu -O1
tiny_compile "$tmp/cpu.so" -O1

XTC_NCCL=$build/libfake_nccl.so "$build/nccl_check" "$tmp/emu.so" 4 2 16 > "$tmp/a.out" 2> "$tmp/a.err"
rc=$?
n=$(sed -n 's/^fake nccl: \([0-9]*\) all-reduces.*/\1/p' "$tmp/a.err")
if [ $rc = 0 ] && grep -q '^PASS' "$tmp/a.out" && grep -q 'bit-identical at 4 of 4 steps' "$tmp/a.out" &&
  grep -q 'weights: 0 (two runs alone: 0)' "$tmp/a.out" && [ -n "$n" ] && [ "$n" -gt 0 ] && [ $((n % 4)) = 0 ]; then
  ok "one-rank NCCL (stand-in) on cuda-emu: the losses and weights of the session alone, bit for bit ($n all-reduces in 4 steps)"
else
  bad "nccl_check with the stand-in: exit $rc: $(cat "$tmp/a.out" "$tmp/a.err" | head -8)"
fi

XTC_NCCL=$tmp/missing.so "$build/nccl_check" "$tmp/emu.so" 2 2 16 > "$tmp/b.out" 2>&1
rc=$?
if [ $rc = 1 ] && grep -q "^FAIL: NCCL cannot be used: no NCCL: cannot load $tmp/missing.so" "$tmp/b.out"; then
  ok "XTC_NCCL naming a missing file: refused, saying so"
else
  bad "XTC_NCCL missing: exit $rc: $(cat "$tmp/b.out")"
fi

XTC_NCCL=$build/libfake_nccl.so "$build/nccl_check" "$tmp/cpu.so" 2 2 16 > "$tmp/c.out" 2>&1
rc=$?
if [ $rc = 1 ] && grep -q "not a CUDA module" "$tmp/c.out"; then
  ok "a CPU module: NCCL refused, saying why"
else
  bad "CPU module with NCCL: exit $rc: $(cat "$tmp/c.out")"
fi

env -u XTC_NCCL "$build/nccl_check" "$tmp/emu.so" 2 2 16 > "$tmp/d.out" 2>&1
if grep -q "the CUDA emulator's device memory is host memory" "$tmp/d.out"; then
  ok "cuda-emu without XTC_NCCL: no NCCL (a real one would be handed host memory)"
else
  bad "cuda-emu without XTC_NCCL: $(cat "$tmp/d.out")"
fi
[ $fail -eq 0 ] && echo "all NCCL checks passed" || echo "$fail NCCL check(s) failed"
exit $((fail > 0))
