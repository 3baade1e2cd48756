#!/usr/bin/env bash
# test_mpi.sh BUILD_DIR SOURCE_DIR: data-parallel training, `mpirun -np 2 xtc train`, on a tiny
# byte-level GPT (the ranks oversubscribe the machine's cores; every mpirun under a hang guard):
#   (a) 2 ranks x 4 sequences give the losses, validation losses and final weights of 1 process x
#       8 sequences (plain `xtc train`, no MPI) within f32 rounding over 50 steps, and both ranks
#       hold bit-identical weights after every step (XTC_TRAIN_HASHES: a hash per rank and step);
#       the validation windows split unevenly; the gradients go in 4 KiB buckets there, so that many sums start during the backward pass
#       (XTC_COMM_BUCKET_BYTES), and the bits equal those of the default buckets of (b);
#   (b) a checkpoint written by 2 ranks at step 25 resumes with 2 ranks to the uninterrupted
#       2-rank run bit for bit (losses and final checkpoint), and with 1 process to the
#       uninterrupted 1-process run within f32 rounding;
#   (d) ZeRO-1 (--zero1: each rank keeps the optimizer state of its shard) on a model of 9 blocks
#       of the optimizer's vector: stopped at step 15 and resumed with --zero1, both ranks hold the
#       weights of the replicated optimizer bit for bit after every step, and the final
#       checkpoint (the state gathered from the shards on save) is the replicated run's, byte for byte;
#   a CUDA module (through the CUDA emulator) sums after its run, with the same results; with a
#   stand-in NCCL (tests/fake_nccl.c) one rank sums on the "device" with the plain run's bits, and
#   a missing NCCL falls back to MPI, saying so once; a user's
#   MPI program (examples/train_mpi.c) trains the same on 2 ranks as on 1;
#   (c) SIGTERM to one rank stops both at the same step with one checkpoint (exit 143) that
#       resumes; a rank killed (SIGKILL) ends the job non-zero within 60 s with mpirun's message;
#       a batch smaller than the ranks is refused on every rank without a hang.
# Skipped (exit 77, ctest's SKIP) only when xtc was built without MPI or mpirun is absent.
set -u
if ! grep -q '^XTC_WITH_MPI:BOOL=ON' "$1/CMakeCache.txt" 2>/dev/null || ! command -v mpirun > /dev/null; then
  echo "SKIP: xtc built without MPI or no mpirun (apt-get install libopenmpi-dev openmpi-bin; .ci/setup.sh)"
  exit 77
fi
# the tiny GPT, the text (the project's own C sources) and ok/bad
. "$(dirname "$0")/tiny_setup.sh" "$@"
mpi=(timeout 120 mpirun --oversubscribe --allow-run-as-root -np 2)
tiny_compile "$tmp/tiny.so" -O1
# 3 validation windows: rank 0 evaluates 1, rank 1 two (the training session, its sums paused)
common=(--data "$tmp/data.txt" --steps 50 --batch 8 --seq 32 --threads 1 --val-every 25 --val-tokens 96
  --seed 3 --quiet --lr 3e-3)

# max|a-e| <= 1e-5 + 1e-3 max|e| for every tensor of two checkpoints (weights and optimizer state)
cat > "$tmp/close.py" <<'EOF'
import json, struct, sys
import numpy as np
def load(path):
    with open(path, 'rb') as f:
        n = struct.unpack('<Q', f.read(8))[0]
        head = json.loads(f.read(n))
        body = f.read()
    head.pop('__metadata__', None)
    return {k: np.frombuffer(body[v['data_offsets'][0]:v['data_offsets'][1]], np.float32) for k, v in head.items()}
a, e = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == e.keys(), (sorted(a), sorted(e))
worst = max((float(np.abs(a[k] - e[k]).max()) / (1e-5 + 1e-3 * float(np.abs(e[k]).max())), k) for k in e)
print('%.3g of the tolerance (%s)' % worst)
sys.exit(worst[0] > 1)
EOF
# the losses of two hash files (step loss hash) agree within f32 rounding from step $3 on
losses_close() {
  join <(awk -v s="$3" '$1 >= s { print $1, $2 }' "$1") <(awk -v s="$3" '$1 >= s { print $1, $2 }' "$2") |
    awk 'BEGIN { n = 0; bad = 0 } { n++; d = $2 - $3; if (d < 0) d = -d; if (d > 1e-5 + 1e-4 * $3) bad++ }
         END { exit !(n > 0 && bad == 0) }'
}
vals() { sed -n 's/^step *\([0-9]*\) .*val loss \([0-9.]*\).*/\1 \2/p' "$1"; }

# (a) 1 process x 8 against 2 ranks x 4
XTC_TRAIN_HASHES=$tmp/h1 "$xtc" train "$tmp/tiny.so" "${common[@]}" --ckpt "$tmp/a1.safetensors" > "$tmp/a1.out" \
  2> "$tmp/a1.err" || bad "xtc train (1 process): $(cat "$tmp/a1.err")"
XTC_COMM_BUCKET_BYTES=4096 XTC_TRAIN_HASHES=$tmp/h2 "${mpi[@]}" "$xtc" train "$tmp/tiny.so" "${common[@]}" \
  --ckpt "$tmp/a2.safetensors" > "$tmp/a2.out" 2> "$tmp/a2.err" || bad "mpirun -np 2 xtc train: $(cat "$tmp/a2.err")"
if [ "$(wc -l < "$tmp/h2.0" 2> /dev/null)" = 50 ] && cmp -s "$tmp/h2.0" "$tmp/h2.1"; then
  ok "2 ranks: bit-identical weights on both ranks after each of the 50 steps"
else
  bad "2 ranks: the ranks' weights differ (or steps are missing)"
  diff "$tmp/h2.0" "$tmp/h2.1" | head -4
fi
if losses_close "$tmp/h1.0" "$tmp/h2.0" 1; then
  ok "2 ranks x 4 sequences: the losses of 1 process x 8 over 50 steps"
else
  bad "2 ranks x 4 against 1 x 8: losses differ"
  paste "$tmp/h1.0" "$tmp/h2.0" | head -5
fi
if [ "$(vals "$tmp/a1.out" | wc -l)" = 2 ] && losses_close <(vals "$tmp/a1.out") <(vals "$tmp/a2.out") 1; then
  ok "2 ranks: the validation losses of 1 process (windows split over the ranks)"
else
  bad "validation losses differ: $(vals "$tmp/a1.out" | tr '\n' ' ') / $(vals "$tmp/a2.out" | tr '\n' ' ')"
fi
if r=$(/usr/bin/python3 "$tmp/close.py" "$tmp/a2.safetensors" "$tmp/a1.safetensors"); then
  ok "2 ranks: the final weights and optimizer state of 1 process: $r"
else
  bad "2 ranks: final checkpoint differs from 1 process: $r"
fi
grep -q '^data parallel: 2 ranks' "$tmp/a2.out" && [ "$(grep -c '^model' "$tmp/a2.out")" = 1 ] &&
  ok "rank 0 alone prints" || bad "output of the 2 ranks: $(head -5 "$tmp/a2.out")"

# (b) checkpoint from 2 ranks at step 25, resumed with 2 ranks and with 1
XTC_TRAIN_HASHES=$tmp/h3 "${mpi[@]}" "$xtc" train "$tmp/tiny.so" "${common[@]}" --ckpt "$tmp/b.safetensors" \
  --stop-at 25 > "$tmp/b.out" 2> "$tmp/b.err" || bad "mpirun -np 2 xtc train --stop-at 25: $(cat "$tmp/b.err")"
cp "$tmp/b.safetensors" "$tmp/c.safetensors"
XTC_TRAIN_HASHES=$tmp/h4 "${mpi[@]}" "$xtc" train "$tmp/tiny.so" "${common[@]}" --ckpt "$tmp/b.safetensors" \
  --resume "$tmp/b.safetensors" > "$tmp/b2.out" 2> "$tmp/b2.err" || bad "mpirun -np 2 --resume: $(cat "$tmp/b2.err")"
if cat "$tmp/h3.0" "$tmp/h4.0" | cmp -s - "$tmp/h2.0" && cmp -s "$tmp/b.safetensors" "$tmp/a2.safetensors"; then
  ok "2 ranks, stopped at 25 and resumed with 2: the uninterrupted 2-rank run bit for bit"
else
  bad "2 ranks resumed with 2 differ from the uninterrupted run"
fi
XTC_TRAIN_HASHES=$tmp/h5 "$xtc" train "$tmp/tiny.so" "${common[@]}" --ckpt "$tmp/c.safetensors" \
  --resume "$tmp/c.safetensors" > "$tmp/c.out" 2> "$tmp/c.err" || bad "1 process --resume: $(cat "$tmp/c.err")"
if [ "$(head -c 3 "$tmp/h5.0")" = "26 " ] && losses_close "$tmp/h1.0" "$tmp/h5.0" 26 &&
  r=$(/usr/bin/python3 "$tmp/close.py" "$tmp/c.safetensors" "$tmp/a1.safetensors"); then
  ok "2 ranks, stopped at 25 and resumed with 1 process: the uninterrupted run within f32 rounding: $r"
else
  bad "the 2-rank checkpoint resumed by 1 process differs from the uninterrupted run ${r:-}"
fi

# (d) ZeRO-1 against the replicated optimizer: a model of 0.07M parameters, 9 blocks of 8192
cat > "$tmp/small.xtf" <<'EOF2'
small = TransformerWrapper(num_tokens = 256, max_seq_len = 32,
    attn_layers = Decoder(dim = 32, depth = 2, heads = 2))
EOF2
z=(--data "$tmp/data.txt" --steps 30 --batch 8 --seq 32 --threads 1 --val-every 15 --val-tokens 96 --seed 3 --quiet
  --lr 3e-3)
if "$xtc" compile "$tmp/small.xtf" --train -O1 -o "$tmp/small.so" 2> "$tmp/err"; then
  XTC_TRAIN_HASHES=$tmp/zr "${mpi[@]}" "$xtc" train "$tmp/small.so" "${z[@]}" --ckpt "$tmp/zr.safetensors" > /dev/null 2>&1
  XTC_TRAIN_HASHES=$tmp/z1 "${mpi[@]}" "$xtc" train "$tmp/small.so" "${z[@]}" --zero1 --stop-at 15 \
    --ckpt "$tmp/z.safetensors" > "$tmp/z1.out" 2>&1
  XTC_TRAIN_HASHES=$tmp/z2 "${mpi[@]}" "$xtc" train "$tmp/small.so" "${z[@]}" --zero1 --resume "$tmp/z.safetensors" \
    --ckpt "$tmp/z.safetensors" > "$tmp/z2.out" 2>&1
  if [ "$(wc -l < "$tmp/zr.0" 2> /dev/null)" = 30 ] && cat "$tmp/z1.0" "$tmp/z2.0" | cmp -s - "$tmp/zr.0" &&
    cat "$tmp/z1.1" "$tmp/z2.1" | cmp -s - "$tmp/zr.0" && cmp -s "$tmp/z.safetensors" "$tmp/zr.safetensors" &&
    grep -q 'ZeRO-1' "$tmp/z1.out"; then
    ok "ZeRO-1 (stopped at 15, resumed): the replicated optimizer's weights bit for bit on both ranks, the same checkpoint"
  else
    bad "ZeRO-1 differs from the replicated optimizer: $(cat "$tmp/z1.out" "$tmp/z2.out" | head -12)"
  fi
else
  bad "xtc compile small.xtf: $(cat "$tmp/err")"
fi

# a CUDA module's path (no step hook: the sums start after the run, through host memory), on the
# CPU through the CUDA emulator: 3 steps of 2 ranks against 1 process
if "$xtc" compile "$tmp/tiny.xtf" --train --target cuda-emu -O1 -o "$tmp/tiny_emu.so" 2> "$tmp/err"; then
  emu=(--data "$tmp/data.txt" --steps 3 --batch 4 --seq 16 --threads 1 --val-every 0 --val-tokens 16 --seed 3 --quiet)
  XTC_TRAIN_HASHES=$tmp/e1 "$xtc" train "$tmp/tiny_emu.so" "${emu[@]}" > /dev/null 2>&1
  XTC_TRAIN_HASHES=$tmp/e2 "${mpi[@]}" "$xtc" train "$tmp/tiny_emu.so" "${emu[@]}" > "$tmp/emu.out" 2>&1
  if [ "$(wc -l < "$tmp/e2.0" 2> /dev/null)" = 3 ] && cmp -s "$tmp/e2.0" "$tmp/e2.1" && losses_close "$tmp/e1.0" "$tmp/e2.0" 1; then
    ok "a cuda-emu module (sums after the run): 2 ranks equal 1 process over 3 steps, ranks bit-identical"
  else
    bad "cuda-emu module on 2 ranks: $(tail -3 "$tmp/emu.out")"
  fi
  # NCCL through MPI's bootstrap: one rank with the stand-in library (tests/fake_nccl.c) trains
  # the losses and weights of the plain run bit for bit; XTC_NCCL naming a missing file falls back
  # to the sums through host memory, saying so once, with the bits of the run above
  XTC_NCCL=$build/libfake_nccl.so XTC_TRAIN_HASHES=$tmp/e3 "${mpi[@]:0:5}" -np 1 "$xtc" train "$tmp/tiny_emu.so" \
    "${emu[@]}" > "$tmp/e3.out" 2>&1
  if grep -q '^gradient sums: on the device with NCCL' "$tmp/e3.out" && grep -q '^fake nccl: [1-9]' "$tmp/e3.out" &&
    cmp -s "$tmp/e1.0" "$tmp/e3.0"; then
    ok "NCCL (stand-in) under mpirun -np 1: the plain run's losses and weights bit for bit"
  else
    bad "NCCL under mpirun -np 1: $(head -5 "$tmp/e3.out")"
  fi
  XTC_NCCL=$tmp/missing.so XTC_TRAIN_HASHES=$tmp/e4 "${mpi[@]}" "$xtc" train "$tmp/tiny_emu.so" "${emu[@]}" \
    > "$tmp/e4.out" 2>&1
  if [ "$(grep -c 'not NCCL: no NCCL: cannot load' "$tmp/e4.out")" = 1 ] && cmp -s "$tmp/e2.0" "$tmp/e4.0"; then
    ok "XTC_NCCL missing on 2 ranks: sums through host memory, said once, the same bits"
  else
    bad "XTC_NCCL missing on 2 ranks: $(head -5 "$tmp/e4.out")"
  fi
else
  bad "xtc compile --target cuda-emu --train: $(cat "$tmp/err")"
fi

# a user's own MPI program (examples/train_mpi.c: libxtc_mpi + libxtc.a): 2 ranks against 1
if [ -x "$build/train_mpi" ] && "$xtc" init "$tmp/tiny.so" -o "$tmp/w.safetensors" --seed 2 > /dev/null 2>&1; then
  "${mpi[@]:0:5}" -np 1 "$build/train_mpi" "$tmp/tiny.so" "$tmp/w.safetensors" 10 > "$tmp/u1.out" 2>&1
  "${mpi[@]}" "$build/train_mpi" "$tmp/tiny.so" "$tmp/w.safetensors" 10 > "$tmp/u2.out" 2>&1
  if [ "$(grep -c '^rank' "$tmp/u2.out")" = 2 ] && [ "$(grep '^rank' "$tmp/u2.out" | cut -d' ' -f4 | sort -u | wc -l)" = 1 ] &&
    [ "$(grep -c '^step' "$tmp/u2.out")" = 10 ] &&
    losses_close <(awk '/^step/ { print $2, $4 }' "$tmp/u1.out") <(awk '/^step/ { print $2, $4 }' "$tmp/u2.out") 1; then
    ok "examples/train_mpi.c: 2 ranks equal 1 over 10 steps, identical weights on both ranks"
  else
    bad "examples/train_mpi.c: $(cat "$tmp/u1.out" "$tmp/u2.out" | head -30)"
  fi
else
  bad "no $build/train_mpi, or xtc init failed"
fi

# (c) SIGTERM to one rank; a rank killed; a batch too small for the ranks
long=(--data "$tmp/data.txt" --steps 1000000 --batch 4 --seq 32 --threads 1 --val-every 0 --val-tokens 256 --quiet)
XTC_TRAIN_HASHES=$tmp/h6 "${mpi[@]}" "$xtc" train "$tmp/tiny.so" "${long[@]}" --ckpt "$tmp/d.safetensors" \
  > "$tmp/d.out" 2> "$tmp/d.err" &
job=$!
for _ in $(seq 100); do [ -s "$tmp/h6.1" ] && break; sleep 0.1; done
ranks=($(pgrep -P "$(pgrep -P $job)")) # timeout -> mpirun -> the two ranks
kill -TERM "${ranks[1]}"
wait $job
rc=$?
step=$(sed -n 's/^interrupted by SIGTERM after step \([0-9]*\) (on another rank).*/\1/p' "$tmp/d.out")
if [ $rc -ne 0 ] && [ -n "$step" ] && [ "$(tail -n1 "$tmp/h6.0" | cut -d' ' -f1)" = "$step" ] &&
  [ "$(tail -n1 "$tmp/h6.1" | cut -d' ' -f1)" = "$step" ] &&
  "${mpi[@]}" "$xtc" train "$tmp/tiny.so" "${long[@]}" --resume "$tmp/d.safetensors" --stop-at $((step + 2)) \
    > "$tmp/d2.out" 2>&1 && grep -q 'resumed' "$tmp/d2.out"; then
  ok "SIGTERM to rank 1: both ranks stop after step $step, rank 0's checkpoint resumes (exit $rc)"
else
  bad "SIGTERM to one rank (exit $rc, step '${step:-}'): $(cat "$tmp/d.out" "$tmp/d.err" | head -8)"
fi

XTC_TRAIN_HASHES=$tmp/h7 "${mpi[@]}" "$xtc" train "$tmp/tiny.so" "${long[@]}" > "$tmp/e.out" 2>&1 &
job=$!
for _ in $(seq 100); do [ -s "$tmp/h7.1" ] && break; sleep 0.1; done
ranks=($(pgrep -P "$(pgrep -P $job)"))
t0=$(date +%s)
kill -KILL "${ranks[1]}"
wait $job
rc=$?
secs=$(($(date +%s) - t0))
if [ $rc -ne 0 ] && [ $secs -le 60 ] && grep -q 'exited on signal 9' "$tmp/e.out"; then
  ok "a rank killed: the job ends with exit $rc in ${secs}s, saying so"
else
  bad "a rank killed: exit $rc after ${secs}s: $(head -c 600 "$tmp/e.out")"
fi

t0=$(date +%s)
"${mpi[@]}" "$xtc" train "$tmp/tiny.so" --data "$tmp/data.txt" --batch 1 --steps 2 > "$tmp/f.out" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q 'fewer sequences than the 2 ranks' "$tmp/f.out"; then
  ok "--batch 1 on 2 ranks: refused in $(($(date +%s) - t0))s (exit $rc)"
else
  bad "--batch 1 on 2 ranks: exit $rc: $(head -c 400 "$tmp/f.out")"
fi

[ $fail -eq 0 ] && echo "all MPI checks passed" || echo "$fail MPI check(s) failed"
exit $((fail > 0))
