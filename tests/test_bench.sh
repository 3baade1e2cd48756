#!/usr/bin/env bash
# test_bench.sh BUILD_DIR SOURCE_DIR: `xtc bench` end to end on a tiny model, for each target
# that runs here: cpu, and cuda-emu (the CUDA launch path with the emulated driver's events);
# --target cuda without a driver must fail with the runtime's message. On a machine with a GPU
# the same bench runs on it (CUDA events). Times are checked for presence and consistency
# (positive, per-kernel rows summing to the kernels' total), never against a limit.
set -u
build=$1
src=$2
xtc=$build/xtc
py=/usr/bin/python3
[ -x $py ] || py=python3
model=$src/tests/parity/decoder_plain.xtf
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export TMPDIR=$tmp
. "$src/tests/checks.sh"
check() { # check NAME COMMAND...: the command must succeed
  local name=$1; shift
  if "$@" > "$tmp/out" 2> "$tmp/err"; then pass=$((pass + 1)); echo "ok   $name"
  else fail=$((fail + 1)); echo "FAIL $name:"; sed 's/^/    /' "$tmp/out" "$tmp/err"; fi
}
expect() { # expect NAME PATTERN FILE: grep -E must find PATTERN in FILE
  if grep -Eq -- "$2" "$3"; then pass=$((pass + 1)); echo "ok   $1"
  else fail=$((fail + 1)); echo "FAIL $1 (no '$2' in):"; sed 's/^/    /' "$3"; fi
}

# validate.py JSON TARGET DEVICE TIMER REPEAT: the report's fields, both variants run, positive
# totals, one row per kernel, the rows covering every step, and (one run) the rows summing to the
# kernels' total
cat > "$tmp/validate.py" << 'EOF'
import json, sys
path, target, device, timer, repeat = sys.argv[1:6]
r = json.load(open(path))
def need(cond, what):
    if not cond:
        sys.exit("bench JSON: " + what + "\n" + json.dumps(r, indent=1)[:3000])
need(r["target"] == target, "target is %r" % r["target"])
need(device == "*" and r["device"] not in ("", "emulated", "cpu") or r["device"] == device, "device is %r" % r["device"])
need(r["kernel_timer"] == timer, "kernel_timer is %r" % r["kernel_timer"])
need(r["repeat"] == int(repeat), "repeat is %r" % r["repeat"])
need(r["speedup"] > 0 and r["speedup_kernels"] > 0, "no speed-up")
# the process's CPU time around the runs: on the cpu target only (elsewhere not the kernels' work)
pos = lambda x: isinstance(x, (int, float)) and 0 < x < float("inf")
cpu_keys = ("speedup_cpu", "speedup_pairs_cpu")
if target == "cpu":
    need(pos(r["speedup_cpu"]), "speedup_cpu is %r" % r["speedup_cpu"])
    sc = r["speedup_pairs_cpu"]
    need(all(pos(sc[k]) for k in ("min", "median", "max")) and sc["min"] <= sc["median"] <= sc["max"],
         "speedup_pairs_cpu min/median/max")
else:
    need(not any(k in r for k in cpu_keys), "CPU-time keys on target %s" % target)
sp = r["speedup_pairs"]
need(0 < sp["min"] <= sp["median"] <= sp["max"], "speedup_pairs min/median/max")
runs = [u / f for f, u in zip(r["fused"]["total_ms"]["runs"], r["unfused"]["total_ms"]["runs"])]
need(abs(sp["min"] - min(runs)) <= 1e-2 * min(runs) and abs(sp["max"] - max(runs)) <= 1e-2 * max(runs),
     "speedup_pairs are not the ratios of neighbouring runs")
for name in ("fused", "unfused"):
    v = r[name]
    need(v["ran"], name + " did not run")
    need(v["arena_bytes"] > 0, name + ": no arena")
    need(len(v["total_ms"]["runs"]) == int(repeat), name + ": %d runs" % len(v["total_ms"]["runs"]))
    need(all(t > 0 for t in v["total_ms"]["runs"]), name + ": a run took no time")
    need(v["total_ms"]["min"] <= v["total_ms"]["median"] <= v["total_ms"]["max"], name + ": total min/median/max")
    need(v["kernels_ms"]["median"] > 0, name + ": the kernels took no time")
    if target == "cpu":
        c = v["cpu_ms"]
        need(len(c["runs"]) == int(repeat) and all(pos(t) for t in c["runs"]), name + ": cpu_ms runs")
        need(all(pos(c[k]) for k in ("min", "median", "max")) and c["min"] <= c["median"] <= c["max"],
             name + ": cpu_ms min/median/max")
    else:
        need("cpu_ms" not in v, name + ": cpu_ms on target " + target)
    rows = v["kernel_ms"]
    need(len(rows) == v["kernels"], name + ": %d kernel rows for %d kernels" % (len(rows), v["kernels"]))
    need(all(k["kernel"].startswith("xtc_k") and k["median_ms"] >= 0 and k["steps"] >= 1 for k in rows),
         name + ": a bad kernel row")
    need(sum(k["steps"] for k in rows) == v["steps"], name + ": the rows do not cover every step")
    need(sum(o["steps"] for o in v["ops"]) == v["steps"], name + ": the ops do not cover every step")
    total = sum(k["median_ms"] for k in rows)
    need(total > 0, name + ": every kernel took no time")
    if int(repeat) == 1:  # medians of one run: the rows add up to the kernels' total (4-decimal rounding)
        need(abs(total - v["kernels_ms"]["median"]) <= 1e-4 * (len(rows) + 1), name + ": rows sum to %g, kernels %g"
             % (total, v["kernels_ms"]["median"]))
    need(v["kernels_ms"]["median"] <= v["total_ms"]["max"] + 1e-4 or int(repeat) > 1,
         name + ": the kernels took longer than the run")
print("bench JSON ok: %s on %s, %s" % (r["target"], r["device"], r["kernel_timer"]))
EOF

# the CPU
check "bench --target cpu --json" "$xtc" bench "$model" --batch 1 --seq 8 --repeat 1 --target cpu --json
cp "$tmp/out" "$tmp/cpu.json"
check "its JSON" $py "$tmp/validate.py" "$tmp/cpu.json" cpu "$(grep -m1 '^model name' /proc/cpuinfo | sed 's/^[^:]*: //')" \
  wall-clock 1
# the default target is the CPU
check "bench (text)" "$xtc" bench "$model" --batch 1 --seq 8 --repeat 2
cp "$tmp/out" "$tmp/cpu.txt"
expect "text: target cpu" "target cpu, 1 thread, 2 runs after 1 warm-up" "$tmp/cpu.txt"
expect "text: wall-clock kernel times" "^kernel times: wall clock per step" "$tmp/cpu.txt"
expect "text: cpu time" "^  cpu [0-9.]+ ms median \(min [0-9.]+, max [0-9.]+\): the process's CPU time" "$tmp/cpu.txt"
expect "text: speed-up by cpu time" "^speed-up \(unfused / fused median\): [0-9.]+x total, [0-9.]+x kernels, [0-9.]+x cpu$" \
  "$tmp/cpu.txt"
expect "text: neighbours by cpu time" "^speed-up of neighbouring runs: .*; by cpu: median [0-9.]+x, from [0-9.]+x to" "$tmp/cpu.txt"

# --decode C: KV-cache decoding after C tokens, --dtype bf16 against f32, alternating
check "bench --decode --dtype bf16" "$xtc" bench "$model" --decode 12 --dtype bf16 --repeat 2 -O0
cp "$tmp/out" "$tmp/decode.txt"
expect "decode: header" "^KV-cache decoding: .*, context 12 \(\+16 tokens timed per variant\), 1 thread, batch 1" "$tmp/decode.txt"
expect "decode: f32 row" "^  f32 +[0-9.]+ ms/token +[0-9.]+ tokens/s +cpu +[0-9.]+ ms/token +[0-9.]+ tokens/s$" "$tmp/decode.txt"
expect "decode: bf16 row" "^  --dtype bf16 +[0-9.]+ ms/token .* cpu .* tokens/s +[0-9.]+x f32, [0-9.]+x by cpu$" "$tmp/decode.txt"
# bench/compare.py --decode: the same model in PyTorch with a KV cache on xtc's weights (its first
# token's logits must agree with xtc's, else compare.py fails), tokens/s of both
if $py -c "import torch, numpy" 2> /dev/null; then
  check "compare.py --decode (PyTorch)" $py "$src/bench/compare.py" --xtc "$xtc" --model "$model" --decode 12 \
    --threads 1 --repeat 1
  cp "$tmp/out" "$tmp/cmp.txt"
  expect "compare.py --decode: logits agree" "^  PyTorch f32 +[0-9.]+e[-+][0-9]+$" "$tmp/cmp.txt"
  expect "compare.py --decode: tokens/s" "^  f32 +xtc +[0-9.]+ +PyTorch +[0-9.]+ +xtc / PyTorch [0-9.]+x" "$tmp/cmp.txt"
expect "compare.py --decode: tokens/s by cpu" " by cpu: xtc +[0-9.]+ +PyTorch +[0-9.]+ +[0-9.]+x$" "$tmp/cmp.txt"
  # forward / training step beside PyTorch: both sides by the wall clock and by CPU time (PyTorch's
  # through bench/torch_cputime.py); 1 thread, so no run's CPU time can exceed its wall time
  check "compare.py --train --dtype bf16 --json" $py "$src/bench/compare.py" --xtc "$xtc" --model "$model" --batch 1 \
    --seq 8 --threads 1 --repeat 2 --rounds 1 --train --dtype bf16 -O 0 --json
  cp "$tmp/out" "$tmp/cmp.json"
  cat > "$tmp/cmp_cpu.py" << 'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
def need(cond, what):
    if not cond:
        sys.exit("compare.py JSON: " + what + "\n" + json.dumps(r, indent=1)[:3000])
pos = lambda x: isinstance(x, (int, float)) and 0 < x < float("inf")
for s in ("xtc_fused", "xtc_unfused", "torch", "xtc_f32_fused"):
    wall, cpu = r[s + "_ms"], r[s + "_cpu_ms"]
    need(pos(wall) and pos(cpu), "%s: wall %r, cpu %r" % (s, wall, cpu))
    need(r["rounds_ms"][s] == [wall] and r["rounds_cpu_ms"][s] == [cpu], s + ": one round's medians")
    need(cpu <= 1.1 * wall + 1.0, "%s: %g ms of CPU time in %g ms on 1 thread" % (s, cpu, wall))
for key, num, den in (("fusion_speedup", "xtc_unfused", "xtc_fused"), ("torch_over_xtc_fused", "torch", "xtc_fused"),
                      ("torch_over_xtc_unfused", "torch", "xtc_unfused"),
                      ("xtc_f32_over_xtc_fused", "xtc_f32_fused", "xtc_fused")):
    for suf in ("", "_cpu"):
        want = r[num + suf + "_ms"] / r[den + suf + "_ms"]
        need(abs(r[key + suf] - want) <= 1e-9 * want, "%s%s is %r, not %r" % (key, suf, r[key + suf], want))
need(r["train"] and r["dtype"] == "bf16" and r["threads"] == 1 and r["rounds"] == 1, "the settings")
print("compare.py JSON ok: PyTorch / xtc fused %.2fx, by cpu %.2fx" % (r["torch_over_xtc_fused"],
                                                                    r["torch_over_xtc_fused_cpu"]))
EOF
  check "its JSON: wall and CPU medians, both ratios" $py "$tmp/cmp_cpu.py" "$tmp/cmp.json"
else
  echo "skip compare.py --decode and forward / training: no PyTorch and numpy for $py"
fi
# the text: each side's wall and CPU medians, each ratio both ways (xtc alone here)
check "compare.py --dtype bf16 --no-torch" $py "$src/bench/compare.py" --xtc "$xtc" --model "$model" --batch 1 --seq 8 \
  --threads 1 --repeat 1 --dtype bf16 --no-torch -O 0
cp "$tmp/out" "$tmp/cmp.txt"
expect "compare.py text: header" "^decoder_plain.xtf: batch 1, seq 8, 1 threads, forward, .* by the wall clock and by the process's CPU time" \
  "$tmp/cmp.txt"
expect "compare.py text: xtc fused by wall and cpu" "^  xtc fused +[0-9.]+ ms   cpu +[0-9.]+ ms   arena" "$tmp/cmp.txt"
expect "compare.py text: xtc f32 by wall and cpu" "^  xtc f32 fused +[0-9.]+ ms   cpu +[0-9.]+ ms$" "$tmp/cmp.txt"
expect "compare.py text: ratio by wall and cpu" "^  xtc f32 / xtc bf16 \(fused\): +[0-9.]+x   by cpu [0-9.]+x$" "$tmp/cmp.txt"
refuse "decode with --train" "without --train" "$xtc" bench "$model" --decode 4 --train
refuse "decode of an encoder" "a KV cache needs a causal Decoder" "$xtc" bench "$src/models/bert.xtf" --decode 4 -O0

# --against PASS: the second variant runs every pass but PASS (cosine-sim attention, the bound)
check "bench --against cosine_sim" "$xtc" bench "$src/tests/parity_newer/v2_qk_norm_rotary_mqa_mask.xtf" --batch 1 --seq 8 \
  --repeat 1 --against cosine_sim
cp "$tmp/out" "$tmp/against.txt"
expect "text: the variant without the pass" "^without-cosine_sim: [0-9]+ nodes" "$tmp/against.txt"
expect "text: its speed-up" "^speed-up \(without-cosine_sim / fused median\)" "$tmp/against.txt"
# ... with --decode: KV-cache decoding without the pass against every pass (the cached attention bounded)
check "bench --decode --against cosine_sim" "$xtc" bench "$src/bench/cosine4k.xtf" --decode 4 --repeat 1 -O0 --against cosine_sim
cp "$tmp/out" "$tmp/dagainst.txt"
expect "decode: the variant without the pass" "^  without-cosine_sim +[0-9.]+ ms/token" "$tmp/dagainst.txt"
expect "decode: every pass against it" "^  every pass +[0-9.]+ ms/token .* [0-9.]+x without-cosine_sim, [0-9.]+x by cpu$" "$tmp/dagainst.txt"
refuse "decode --against with --dtype" "and --against without --dtype" "$xtc" bench "$model" --decode 4 --against cosine_sim \
  --dtype bf16
refuse "--against an unknown pass" "xtc bench: --against: unknown pass 'cosine' (passes: fold" "$xtc" bench "$model" --batch 1 \
  --seq 8 --against cosine

# the CUDA path, emulated
check "bench --target cuda-emu" "$xtc" bench "$model" --batch 1 --seq 8 --repeat 2 --target cuda-emu
cp "$tmp/out" "$tmp/emu.txt"
expect "text: target cuda-emu" "target cuda-emu, dtype f32, 2 runs after 1 warm-up" "$tmp/emu.txt"
expect "text: the device is emulated" "^device: emulated \(the xtc CUDA emulator" "$tmp/emu.txt"
expect "text: emulated CUDA events" "^kernel times: emulated CUDA events \(host clock: not GPU figures\)" "$tmp/emu.txt"
expect "text: fused total" "^  total [0-9.]+ ms median \(min [0-9.]+, max [0-9.]+, spread [0-9.]+%\), arena [0-9.]+ MiB of device memory" \
  "$tmp/emu.txt"
expect "text: kernels' total" "^  kernels [0-9.]+ ms median per run" "$tmp/emu.txt"
expect "text: per-kernel rows" "^ +[0-9]+\.[0-9]+ +[0-9.]+% +[0-9]+  attention +xtc_k[0-9]+_attention$" "$tmp/emu.txt"
expect "text: unfused per-kernel rows" "^ +[0-9]+\.[0-9]+ +[0-9.]+% +[0-9]+  softmax +xtc_k[0-9]+_softmax$" "$tmp/emu.txt"
expect "text: speed-up" "^speed-up \(unfused / fused median\): [0-9.]+x total, [0-9.]+x kernels$" "$tmp/emu.txt"
check "bench --target cuda-emu --json" "$xtc" bench "$model" --batch 2 --seq 5 --repeat 1 --target cuda-emu --json
cp "$tmp/out" "$tmp/emu.json"
check "its JSON" $py "$tmp/validate.py" "$tmp/emu.json" cuda-emu emulated emulated-cuda-events 1
check "bench --target cuda-emu --train --json" "$xtc" bench "$model" --batch 1 --seq 4 --repeat 2 --target cuda-emu \
  --train --json
cp "$tmp/out" "$tmp/emu_train.json"
check "its JSON" $py "$tmp/validate.py" "$tmp/emu_train.json" cuda-emu emulated emulated-cuda-events 2

# 16-bit storage: the device arena is planned at 2 bytes per element, about half the f32 one
# (the same sizes as emu.json); with --max-gib below it, the planned figure is the device's too
check "bench --target cuda-emu --dtype bf16 --json" "$xtc" bench "$model" --batch 2 --seq 5 --repeat 1 --target cuda-emu \
  --dtype bf16 --json
cp "$tmp/out" "$tmp/emu_bf16.json"
check "its JSON" $py "$tmp/validate.py" "$tmp/emu_bf16.json" cuda-emu emulated emulated-cuda-events 1
cat > "$tmp/half.py" << 'EOF'
import json, sys
f32, half = (json.load(open(p)) for p in sys.argv[1:3])
if f32["dtype"] != "f32" or half["dtype"] != "bf16":
    sys.exit("dtype fields %r, %r" % (f32["dtype"], half["dtype"]))
for v in ("fused", "unfused"):
    a, b = f32[v]["arena_bytes"], half[v]["arena_bytes"]
    if not 0 < b <= 0.6 * a:
        sys.exit("%s: device arena %d bytes with bf16 storage, %d with f32" % (v, b, a))
    print("%s: device arena %d bytes with f32 storage, %d with bf16 (%.3f)" % (v, a, b, b / a))
EOF
check "bf16 halves the device arena" $py "$tmp/half.py" "$tmp/emu.json" "$tmp/emu_bf16.json"
check "bench --dtype bf16 --max-gib (planned, not run)" "$xtc" bench "$model" --batch 2 --seq 5 --target cuda-emu \
  --dtype bf16 --max-gib 1e-9
cp "$tmp/out" "$tmp/emu_bf16.txt"
expect "text: target and dtype" "target cuda-emu, dtype bf16, " "$tmp/emu_bf16.txt"
expect "text: not run" "^  not run: the arena would exceed --max-gib 1e-09; planned arena" "$tmp/emu_bf16.txt"
expect "text: the device arena with its storage" "^arena \(device memory, bf16 storage\): fused [0-9.]+ MiB" "$tmp/emu_bf16.txt"

# misuse
refuse "--dtype fp16 on the cpu" "the cpu backend stores in f32 or bf16" "$xtc" bench "$model" --batch 1 --seq 8 --dtype fp16
refuse "unknown --dtype" "xtc bench: --dtype: " "$xtc" bench "$model" --batch 1 --seq 8 --target cuda-emu --dtype f64
refuse "unknown target" "unknown target 'tpu'" "$xtc" bench "$model" --batch 1 --seq 8 --target tpu
refuse "no target name" "--target needs a value" "$xtc" bench "$model" --batch 1 --seq 8 --target

# a GPU: without a driver, the runtime's message; with one, the bench on it
if "$xtc" compile "$model" -o "$tmp/ptx.so" --target cuda > "$tmp/nvrtc" 2>&1; then
  XTC_LIBCUDA=$tmp/no_such_libcuda.so.1 refuse "bench --target cuda without a driver" \
    "no CUDA driver: cannot load .*no_such_libcuda.so.1" "$xtc" bench "$model" --batch 1 --seq 8 --target cuda
  "$xtc" bench "$model" --batch 1 --seq 8 --repeat 2 --target cuda --json > "$tmp/gpu.json" 2> "$tmp/gpu.err"
  rc=$?
  if [ $rc -eq 0 ]; then
    check "bench --target cuda on the GPU: its JSON" $py "$tmp/validate.py" "$tmp/gpu.json" cuda "*" cuda-events 2
  elif [ $rc -eq 1 ] && grep -q "no CUDA driver\|no CUDA device" "$tmp/gpu.err"; then
    echo "SKIPPED bench on a GPU: $(head -c 160 "$tmp/gpu.err")"
  else
    fail=$((fail + 1)); echo "FAIL bench --target cuda (exit $rc):"; sed 's/^/    /' "$tmp/gpu.err"
  fi
else
  echo "SKIPPED bench --target cuda: no PTX without NVRTC: $(head -c 200 "$tmp/nvrtc")"
fi
checks_done bench
