#!/usr/bin/python3
"""bench/compare.py: xtc beside PyTorch on one GPT shape, in one run.

Runs `xtc bench MODEL --json` (the model compiled fused and unfused, run alternately) and
../shared/bench/torch_gpt.py (PyTorch in its tuned setting: the OpenMP OpenBLAS build with the
SkylakeX kernels, see ../shared/bench/README.md) on the same sizes, alternating the two tools
--rounds times, and prints the medians and their ratios: fusion's speed-up (unfused / fused) and
xtc against PyTorch (torch / xtc, above 1 when xtc is faster). The machines are shared and
noisy: compare ratios of medians taken in the same run, never figures from different runs.

  bench/compare.py [--xtc build/xtc] [--model models/gpt.xtf] [--batch 1] [--seq 1024]
                   [--threads 2] [--repeat 5] [--rounds 1] [--train] [--mma bf16] [--dtype bf16]
                   [--decode C] [--json]

The PyTorch model is torch_gpt.py's x-transformers-style decoder with the vocabulary, width,
depth and heads read from the .xtf (num_tokens, dim, depth, heads); --train compares xtc's
training step (loss and every gradient) with PyTorch's forward + backward ('fwdbwd'). --mma bf16
compiles xtc's matmuls with bf16 operands and f32 sums (xtc compile --mma=bf16) and runs PyTorch
under its bf16 autocast (torch_gpt.py --bf16-autocast, oneDNN's bf16 kernels). --dtype bf16
compiles xtc with bf16 weights and bf16 matmuls (xtc compile --dtype bf16), runs xtc in f32 too
in each round, and compares the three: xtc bf16, xtc f32 and PyTorch's bf16 autocast. --decode C
times KV-cache decoding after a context of C tokens instead (`xtc bench --decode`: batch 1, f32
against --dtype bf16 when given, alternating; PyTorch is not run).
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

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
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--json", action="store_true")
    return p.parse_args()


def model_dims(path):
    """num_tokens, dim, depth, heads of the (last) model in an .xtf file"""
    text = open(path).read()
    dims = {}
    for key, name in (("num_tokens", "vocab"), ("dim", "dim"), ("depth", "depth"), ("heads", "heads")):
        found = re.findall(r"\b%s\s*=\s*(\d+)" % key, text)
        if not found:
            sys.exit("compare.py: %s has no '%s = N'" % (path, key))
        dims[name] = int(found[-1])
    return dims


def run_xtc(a, dtype=None):
    dtype = a.dtype if dtype is None else dtype
    cmd = [a.xtc, "bench", a.model, "--batch", str(a.batch), "--seq", str(a.seq), "--threads",
           str(a.threads), "--repeat", str(a.repeat), "--json", "--mma", a.mma if dtype == "f32" else "auto",
           "--dtype", dtype] + (["--train"] if a.train else [])
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if out.returncode != 0:
        sys.exit("compare.py: %s failed:\n%s" % (" ".join(cmd), out.stderr))
    return json.loads(out.stdout)


def run_torch(a, dims):
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = "/usr/lib/x86_64-linux-gnu/openblas-openmp"
    env["OPENBLAS_CORETYPE"] = "SkylakeX"
    phase = "fwdbwd" if a.train else "fwd"
    cmd = ["/usr/bin/python3", a.torch_script, "model", "--config", "custom", "--vocab", str(dims["vocab"]),
           "--dim", str(dims["dim"]), "--depth", str(dims["depth"]), "--heads", str(dims["heads"]), "--seq",
           str(a.seq), "--batch", str(a.batch), "--threads", str(a.threads), "--iters", str(a.repeat),
           "--phases", phase, "--json"] + (["--bf16-autocast"] if a.mma == "bf16" or a.dtype == "bf16" else [])
    out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if out.returncode != 0:
        sys.exit("compare.py: %s failed:\n%s" % (" ".join(cmd), out.stderr))
    line = [l for l in out.stdout.splitlines() if l.strip().startswith("{")][-1]
    return json.loads(line)[phase]


def decode(a):
    cmd = [a.xtc, "bench", a.model, "--decode", str(a.decode), "--threads", str(a.threads), "--repeat",
           str(a.repeat)] + (["--dtype", "bf16"] if a.dtype == "bf16" else [])
    for _ in range(a.rounds):
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if out.returncode != 0:
            sys.exit("compare.py: %s failed:\n%s" % (" ".join(cmd), out.stderr))
        print(out.stdout, end="")


def main():
    a = parse()
    if a.decode:
        return decode(a)
    dims = model_dims(a.model)
    fused, unfused, torch, f32 = [], [], [], []
    arena = {}
    torch_peak = None
    for _ in range(a.rounds):
        x = run_xtc(a)
        if x["fused"]["ran"]:
            fused.append(x["fused"]["total_ms"]["median"])
        if x["unfused"]["ran"]:
            unfused.append(x["unfused"]["total_ms"]["median"])
        arena = {"fused": x["fused"]["arena_bytes"], "unfused": x["unfused"]["arena_bytes"]}
        if a.dtype == "bf16":  # xtc's own f32 in the same round
            y = run_xtc(a, "f32")
            if y["fused"]["ran"]:
                f32.append(y["fused"]["total_ms"]["median"])
        if not a.no_torch:
            t = run_torch(a, dims)
            torch.append(1e3 * t["median_s"])
            torch_peak = t.get("peak_delta")
    med = lambda v: statistics.median(v) if v else None
    res = {
        "model": a.model, "batch": a.batch, "seq": a.seq, "threads": a.threads, "train": a.train,
        "dims": dims, "rounds": a.rounds, "mma": a.mma, "dtype": a.dtype,
        "xtc_fused_ms": med(fused), "xtc_unfused_ms": med(unfused), "torch_ms": med(torch),
        "xtc_f32_fused_ms": med(f32),
        "xtc_arena_bytes": arena, "torch_peak_delta_bytes": torch_peak,
    }
    if res["xtc_fused_ms"] and res["xtc_unfused_ms"]:
        res["fusion_speedup"] = res["xtc_unfused_ms"] / res["xtc_fused_ms"]
    if res["xtc_fused_ms"] and res["torch_ms"]:
        res["torch_over_xtc_fused"] = res["torch_ms"] / res["xtc_fused_ms"]
    if res["xtc_fused_ms"] and res["xtc_f32_fused_ms"]:
        res["xtc_f32_over_xtc_fused"] = res["xtc_f32_fused_ms"] / res["xtc_fused_ms"]
    if res["xtc_unfused_ms"] and res["torch_ms"]:
        res["torch_over_xtc_unfused"] = res["torch_ms"] / res["xtc_unfused_ms"]
    if a.json:
        print(json.dumps(res))
        return
    what = "training step (loss + gradients)" if a.train else "forward"
    if a.dtype == "bf16":
        what += ", xtc bf16 weights and matmuls (PyTorch: bf16 autocast)"
    elif a.mma == "bf16":
        what += ", bf16 matmuls (PyTorch: bf16 autocast)"
    print("%s: batch %d, seq %d, %d threads, %s; medians of %d round(s) x %d runs" %
          (os.path.basename(a.model), a.batch, a.seq, a.threads, what, a.rounds, a.repeat))
    fmt = lambda v: "%10.1f ms" % v if v else "%13s" % "-"
    print("  xtc fused    %s   arena %8.1f MiB" % (fmt(res["xtc_fused_ms"]), arena.get("fused", 0) / 2**20))
    print("  xtc unfused  %s   arena %8.1f MiB" % (fmt(res["xtc_unfused_ms"]), arena.get("unfused", 0) / 2**20))
    if f32:
        print("  xtc f32 fused%s" % fmt(res["xtc_f32_fused_ms"]))
    if torch:
        peak = " peak RSS +%.1f MiB" % (torch_peak / 2**20) if torch_peak else ""
        print("  PyTorch      %s  %s" % (fmt(res["torch_ms"]), peak))
    if "fusion_speedup" in res:
        print("  fusion speed-up (unfused / fused):   %.2fx" % res["fusion_speedup"])
    if "torch_over_xtc_fused" in res:
        print("  PyTorch / xtc fused:                 %.2fx" % res["torch_over_xtc_fused"])
        print("  PyTorch / xtc unfused:               %.2fx" % res["torch_over_xtc_unfused"])
    if "xtc_f32_over_xtc_fused" in res:
        print("  xtc f32 / xtc bf16 (fused):          %.2fx" % res["xtc_f32_over_xtc_fused"])


if __name__ == "__main__":
    main()
