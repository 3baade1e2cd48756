#!/usr/bin/python3
"""bench/compare.py: xtc beside PyTorch on one GPT shape, in one run.

Runs `xtc bench MODEL --json` (the model compiled fused and unfused, run alternately) and
../shared/bench/torch_gpt.py (PyTorch in its tuned setting: the OpenMP OpenBLAS build with the
SkylakeX kernels, see ../shared/bench/README.md) on the same sizes, alternating the two tools
--rounds times, and prints the medians and their ratios: fusion's speed-up (unfused / fused) and
xtc against PyTorch (torch / xtc, above 1 when xtc is faster). The machines are shared and
noisy: compare ratios of medians taken in the same run, never figures from different runs.
Each side is timed by the wall clock and by the process's CPU time (user + system, every
thread's: `xtc bench`'s "cpu_ms", and for PyTorch bench/torch_cputime.py, which runs torch_gpt.py's
own timed loop with time.process_time() around each iteration), and both ratios are printed (the
JSON keys ending in _cpu_ms and _cpu; "rounds_ms" and "rounds_cpu_ms" hold each round's medians).
Other processes on a loaded machine move the wall clock far more than the CPU time: quote the
ratio by CPU time beside the wall one. But with --threads above 1 on a loaded machine PyTorch's
CPU time grows too: its OpenMP threads split each operation statically and spin-wait at its end
for a preempted partner (about 60 % of its CPU time at load 10), while xtc's pool lets the
running threads take the preempted one's chunks. There the work is compared by --threads 1, or
with OMP_WAIT_POLICY=passive in the environment (PyTorch's threads then sleep instead of
spinning; xtc does not use OpenMP): both shown in bench/RESULTS.md ("GPT-M beside PyTorch by CPU
time").

  bench/compare.py [--xtc build/xtc] [--model models/gpt.xtf] [--batch 1] [--seq 1024]
                   [--threads 2] [--repeat 5] [--rounds 1] [--train] [--mma bf16] [--dtype bf16]
                   [--decode C] [-O N] [--json]

The PyTorch model is torch_gpt.py's x-transformers-style decoder with the vocabulary, width,
depth and heads read from the .xtf (num_tokens, dim, depth, heads); --train compares xtc's
training step (loss and every gradient) with PyTorch's forward + backward ('fwdbwd'). --mma bf16
compiles xtc's matmuls with bf16 operands and f32 sums (xtc compile --mma=bf16) and runs PyTorch
under its bf16 autocast (torch_gpt.py --bf16-autocast, oneDNN's bf16 kernels). --dtype bf16
compiles xtc with bf16 weights and bf16 matmuls (xtc compile --dtype bf16), runs xtc in f32 too
in each round, and compares the three: xtc bf16, xtc f32 and PyTorch's bf16 autocast.

--decode C times KV-cache decoding after a context of C tokens instead, batch 1, --threads
(use 1), each round alternating `xtc bench --decode C` (f32, and --dtype bf16 with --dtype bf16;
--repeat x 8 one-token calls) and bench/gpu_torch.py decode --device cpu (the same model with a
KV cache per layer, on xtc's weights; bf16 there is its weights and caches stored in bf16; as
many one-token steps), and prints the medians of tokens/s and xtc / PyTorch, by the wall clock
and by the process's CPU time (every thread's; a loaded machine moves it far less). First it checks that
both compute the same model: the logits after the context (the first token's) of xtc's compiled
f32 module and of PyTorch on the same weights (`xtc init --seed 1`) and tokens (i * 7 mod vocab)
must agree within 1e-4 of their largest; the bf16 ones are printed beside them.
"""
import argparse
import json
import os
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--xtc", default=os.path.join(ROOT, "build", "xtc"))
    p.add_argument("--model", default=os.path.join(ROOT, "models", "gpt.xtf"))
    p.add_argument("--torch-script", default=os.path.join(ROOT, "..", "shared", "bench", "torch_gpt.py"))
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--rounds", type=int, default=1, help="alternate xtc and torch this many times")
    p.add_argument("--train", action="store_true")
    p.add_argument("--mma", choices=["off", "bf16"], default="off",
                   help="bf16: xtc's matmul operands in bf16, PyTorch under bf16 autocast")
    p.add_argument("--dtype", choices=["f32", "bf16"], default="f32",
                   help="bf16: xtc's weights and matmuls in bf16 (beside xtc f32), PyTorch under bf16 autocast")
    p.add_argument("--decode", type=int, default=0, help="KV-cache decoding after a context of this many tokens")
    p.add_argument("-O", dest="opt", type=int, choices=range(4), help="xtc bench's -O level (default its own, -O2; "
                   "-O0 compiles fastest: for tests, not for figures)")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--json", action="store_true")
    return p.parse_args()


def model_dims(path):
    """num_tokens, dim, depth, heads (and attn_dim_head, x-transformers' 64 by default) of the (last)
    model in an .xtf file"""
    text = open(path).read()
    dims = {"dim_head": 64}
    for key, name in (("num_tokens", "vocab"), ("dim", "dim"), ("depth", "depth"), ("heads", "heads"),
                      ("attn_dim_head", "dim_head")):
        found = re.findall(r"\b%s\s*=\s*(\d+)" % key, text)
        if not found and name != "dim_head":
            sys.exit("compare.py: %s has no '%s = N'" % (path, key))
        if found:
            dims[name] = int(found[-1])
    return dims


def run_xtc(a, dtype=None):
    dtype = a.dtype if dtype is None else dtype
    cmd = [a.xtc, "bench", a.model, "--batch", str(a.batch), "--seq", str(a.seq), "--threads",
           str(a.threads), "--repeat", str(a.repeat), "--json", "--mma", a.mma if dtype == "f32" else "auto",
           "--dtype", dtype] + (["--train"] if a.train else []) + (["-O%d" % a.opt] if a.opt is not None else [])
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.exit("compare.py: %s failed:\n%s" % (" ".join(cmd), out.stderr))
    return json.loads(out.stdout)


def run_torch(a, dims):
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = "/usr/lib/x86_64-linux-gnu/openblas-openmp"
    env["OPENBLAS_CORETYPE"] = "SkylakeX"
    phase = "fwdbwd" if a.train else "fwd"
    # torch_gpt.py's own timed loop, each iteration also by the process's CPU time (torch_cputime.py)
    cmd = ["/usr/bin/python3", os.path.join(HERE, "torch_cputime.py"), a.torch_script, "model", "--config",
           "custom", "--vocab", str(dims["vocab"]),
           "--dim", str(dims["dim"]), "--depth", str(dims["depth"]), "--heads", str(dims["heads"]), "--seq",
           str(a.seq), "--batch", str(a.batch), "--threads", str(a.threads), "--iters", str(a.repeat),
           "--phases", phase, "--json"] + (["--bf16-autocast"] if a.mma == "bf16" or a.dtype == "bf16" else [])
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if out.returncode != 0:
        sys.exit("compare.py: %s failed:\n%s" % (" ".join(cmd), out.stderr))
    line = [l for l in out.stdout.splitlines() if l.strip().startswith("{")][-1]
    return json.loads(line)[phase]


def sh(cmd, env=None):
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if out.returncode != 0:
        sys.exit("compare.py: %s failed:\n%s" % (" ".join(cmd), out.stderr))
    return out.stdout


def torch_env():
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = "/usr/lib/x86_64-linux-gnu/openblas-openmp"
    env["OPENBLAS_CORETYPE"] = "SkylakeX"
    return env


def write_tokens(path, tokens):
    """a safetensors file holding tokens: I64 [1, n]"""
    data = struct.pack("<%dq" % len(tokens), *tokens)
    head = json.dumps({"tokens": {"dtype": "I64", "shape": [1, len(tokens)], "data_offsets": [0, len(data)]}})
    head += " " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head.encode() + data)


def last_logits(path):
    """logits [1, n, V] of a safetensors file: the row at position n - 1"""
    import numpy as np
    raw = open(path, "rb").read()
    size = struct.unpack("<Q", raw[:8])[0]
    t = json.loads(raw[8:8 + size])["logits"]
    lo, hi = t["data_offsets"]
    return np.frombuffer(raw, dtype=np.float32, count=(hi - lo) // 4, offset=8 + size + lo).reshape(t["shape"])[0, -1]


def decode(a):
    import numpy as np
    dims = model_dims(a.model)
    dtypes = ["f32", "bf16"] if a.dtype == "bf16" else ["f32"]
    ntok = 8 * a.repeat  # xtc bench --decode times --repeat rounds of 8 one-token calls
    tmp = tempfile.mkdtemp(prefix="compare_decode")
    try:
        w, inp = os.path.join(tmp, "w.safetensors"), os.path.join(tmp, "in.safetensors")
        torch_cmd = ["/usr/bin/python3", os.path.join(HERE, "gpu_torch.py"), "decode", "--device", "cpu"]
        torch_cmd += ["--%s=%d" % (k.replace("_", "-"), v) for k, v in sorted(dims.items())]
        torch_cmd += ["--context", str(a.decode + ntok), "--tokens", str(ntok), "--threads", str(a.threads),
                      "--dtypes", ",".join(dtypes), "--weights", w]
        # the same model: the first token's logits of xtc's compiled modules and of PyTorch
        write_tokens(inp, [i * 7 % dims["vocab"] for i in range(a.decode)])
        first = {}
        for d in dtypes:
            so, out = os.path.join(tmp, "full_%s.so" % d), os.path.join(tmp, "out_%s.safetensors" % d)
            sh([a.xtc, "compile", a.model, "-o", so] + (["--dtype", d] if d != "f32" else []))
            if d == "f32":
                sh([a.xtc, "init", so, "-o", w, "--seed", "1"])
            sh([a.xtc, "run", so, "--weights", w, "--input", inp, "--output", out])
            first["xtc " + d] = last_logits(out)
        if not a.no_torch:
            sh(torch_cmd + ["--passes", "0", "--logits-out", os.path.join(tmp, "torch_DTYPE.npy")], torch_env())
            for d in dtypes:
                first["PyTorch " + d] = np.load(os.path.join(tmp, "torch_%s.npy" % d))
        ref = first["xtc f32"]
        scale = float(np.max(np.abs(ref)))
        print("first-token logits after %d tokens, max |x - xtc f32| / max |xtc f32| (%.3g):" % (a.decode, scale))
        for k, v in first.items():
            if k != "xtc f32":
                print("  %-14s %.2e" % (k, float(np.max(np.abs(v - ref))) / scale))
        if not a.no_torch and float(np.max(np.abs(first["PyTorch f32"] - ref))) > 1e-4 * scale:
            sys.exit("compare.py: PyTorch's f32 logits differ from xtc's: not the same model")
        # alternating rounds: xtc (f32 [and bf16]), then PyTorch (f32 [and bf16])
        rate, cpu_rate = {}, {}  # tokens/s by the wall clock, by the process's CPU time
        xcmd = [a.xtc, "bench", a.model, "--decode", str(a.decode), "--threads", str(a.threads), "--repeat",
                str(a.repeat)] + (["--dtype", "bf16"] if a.dtype == "bf16" else [])
        for _ in range(a.rounds):
            for line in sh(xcmd).splitlines():
                m = re.match(r"\s+(\S.*?)\s+[\d.]+ ms/token\s+([\d.]+) tokens/s\s+cpu\s+[\d.]+ ms/token\s+([\d.]+) "
                             r"tokens/s", line)
                if m:
                    name = "xtc " + ("f32" if m.group(1) == "f32" else "bf16")
                    rate.setdefault(name, []).append(float(m.group(2)))
                    cpu_rate.setdefault(name, []).append(float(m.group(3)))
            if not a.no_torch:
                for line in sh(torch_cmd + ["--passes", "1"], torch_env()).splitlines():
                    if line.startswith("{"):
                        r = json.loads(line)
                        rate.setdefault("PyTorch " + r["dtype"], []).append(r["tok_per_s"])
                        if "cpu_tok_per_s" in r:
                            cpu_rate.setdefault("PyTorch " + r["dtype"], []).append(r["cpu_tok_per_s"])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in rate.items()}
    cpu_med = {k: statistics.median(v) for k, v in cpu_rate.items()}
    if a.json:
        print(json.dumps({"model": a.model, "context": a.decode, "threads": a.threads, "rounds": a.rounds,
                          "tokens_per_round": ntok, "tokens_per_s": med, "cpu_tokens_per_s": cpu_med,
                          "first_logits_rel_err": {k: float(np.max(np.abs(v - ref))) / scale
                                                   for k, v in first.items()}}))
        return
    print("KV-cache decoding, %s: context %d, %d thread(s), tokens/s, medians of %d round(s) x %d tokens "
          "(by the wall clock; by the process's CPU time, every thread's)" %
          (os.path.basename(a.model), a.decode, a.threads, a.rounds, ntok))
    for d in dtypes:
        x, t = med.get("xtc " + d), med.get("PyTorch " + d)
        line = "  %-5s xtc %8.1f" % (d, x)
        if t:
            line += "   PyTorch %8.1f   xtc / PyTorch %.2fx" % (t, x / t)
        xc, tc = cpu_med.get("xtc " + d), cpu_med.get("PyTorch " + d)
        if xc and tc:
            line += "   by cpu: xtc %8.1f   PyTorch %8.1f   %.2fx" % (xc, tc, xc / tc)
        print(line)
    if "xtc bf16" in med:
        print("  xtc bf16 / xtc f32 %.2fx" % (med["xtc bf16"] / med["xtc f32"]) +
              ("   by cpu %.2fx" % (cpu_med["xtc bf16"] / cpu_med["xtc f32"]) if "xtc bf16" in cpu_med else ""))


def main():
    a = parse()
    if a.decode:
        return decode(a)
    dims = model_dims(a.model)
    # each side's median per round, by the wall clock and by the process's CPU time (every thread's)
    fused, unfused, torch, f32 = [], [], [], []
    fused_cpu, unfused_cpu, torch_cpu, f32_cpu = [], [], [], []
    arena = {}
    torch_peak = None
    for _ in range(a.rounds):
        x = run_xtc(a)
        if x["fused"]["ran"]:
            fused.append(x["fused"]["total_ms"]["median"])
            fused_cpu.append(x["fused"]["cpu_ms"]["median"])
        if x["unfused"]["ran"]:
            unfused.append(x["unfused"]["total_ms"]["median"])
            unfused_cpu.append(x["unfused"]["cpu_ms"]["median"])
        arena = {"fused": x["fused"]["arena_bytes"], "unfused": x["unfused"]["arena_bytes"]}
        if a.dtype == "bf16":  # xtc's own f32 in the same round
            y = run_xtc(a, "f32")
            if y["fused"]["ran"]:
                f32.append(y["fused"]["total_ms"]["median"])
                f32_cpu.append(y["fused"]["cpu_ms"]["median"])
        if not a.no_torch:
            t = run_torch(a, dims)
            torch.append(1e3 * t["median_s"])
            torch_cpu.append(1e3 * t["cpu_median_s"])
            torch_peak = t.get("peak_delta")
    med = lambda v: statistics.median(v) if v else None
    res = {
        "model": a.model, "batch": a.batch, "seq": a.seq, "threads": a.threads, "train": a.train,
        "dims": dims, "rounds": a.rounds, "mma": a.mma, "dtype": a.dtype,
        "xtc_fused_ms": med(fused), "xtc_unfused_ms": med(unfused), "torch_ms": med(torch),
        "xtc_f32_fused_ms": med(f32),
        "xtc_arena_bytes": arena, "torch_peak_delta_bytes": torch_peak,
        "xtc_fused_cpu_ms": med(fused_cpu), "xtc_unfused_cpu_ms": med(unfused_cpu), "torch_cpu_ms": med(torch_cpu),
        "xtc_f32_fused_cpu_ms": med(f32_cpu),
        "rounds_ms": {"xtc_fused": fused, "xtc_unfused": unfused, "torch": torch, "xtc_f32_fused": f32},
        "rounds_cpu_ms": {"xtc_fused": fused_cpu, "xtc_unfused": unfused_cpu, "torch": torch_cpu,
                          "xtc_f32_fused": f32_cpu},
    }
    # the ratios by the wall clock (the keys without _cpu) and by CPU time
    for key, num, den in (("fusion_speedup", "xtc_unfused", "xtc_fused"),
                          ("torch_over_xtc_fused", "torch", "xtc_fused"),
                          ("xtc_f32_over_xtc_fused", "xtc_f32_fused", "xtc_fused"),
                          ("torch_over_xtc_unfused", "torch", "xtc_unfused")):
        for suffix in ("", "_cpu"):
            n, d = res[num + suffix + "_ms"], res[den + suffix + "_ms"]
            if n and d:
                res[key + suffix] = n / d
    if a.json:
        print(json.dumps(res))
        return
    what = "training step (loss + gradients)" if a.train else "forward"
    if a.dtype == "bf16":
        what += ", xtc bf16 weights and matmuls (PyTorch: bf16 autocast)"
    elif a.mma == "bf16":
        what += ", bf16 matmuls (PyTorch: bf16 autocast)"
    print("%s: batch %d, seq %d, %d threads, %s; medians of %d round(s) x %d runs, by the wall clock and by "
          "the process's CPU time (every thread's)" %
          (os.path.basename(a.model), a.batch, a.seq, a.threads, what, a.rounds, a.repeat))
    fmt = lambda v: "%10.1f ms" % v if v else "%13s" % "-"
    row = lambda name, key: "  %-13s%s   cpu %s" % (name, fmt(res[key + "_ms"]), fmt(res[key + "_cpu_ms"]))
    print(row("xtc fused", "xtc_fused") + "   arena %8.1f MiB" % (arena.get("fused", 0) / 2**20))
    print(row("xtc unfused", "xtc_unfused") + "   arena %8.1f MiB" % (arena.get("unfused", 0) / 2**20))
    if f32:
        print(row("xtc f32 fused", "xtc_f32_fused"))
    if torch:
        peak = "   peak RSS +%.1f MiB" % (torch_peak / 2**20) if torch_peak else ""
        print(row("PyTorch", "torch") + peak)
    ratio = lambda key: "%.2fx   by cpu %s" % (res[key], "%.2fx" % res[key + "_cpu"] if key + "_cpu" in res else "-")
    if "fusion_speedup" in res:
        print("  fusion speed-up (unfused / fused):   " + ratio("fusion_speedup"))
    if "torch_over_xtc_fused" in res:
        print("  PyTorch / xtc fused:                 " + ratio("torch_over_xtc_fused"))
    if "torch_over_xtc_unfused" in res:
        print("  PyTorch / xtc unfused:               " + ratio("torch_over_xtc_unfused"))
    if "xtc_f32_over_xtc_fused" in res:
        print("  xtc f32 / xtc bf16 (fused):          " + ratio("xtc_f32_over_xtc_fused"))

if __name__ == "__main__":
    main()
