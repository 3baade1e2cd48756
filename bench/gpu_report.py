#!/usr/bin/env python3
"""gpu_report.py RAW [SECONDS_LEFT [GPT_DIMS GPTM_DIMS]]: the tables of bench/gpu_compare.sh from its raw lines
(section, tool, round, variant, then the JSON line of gpu_bench or gpu_torch.py, tab-separated).
Medians over the rounds; ratios are PyTorch / xtc (above 1: xtc is faster). Plain Python: no
PyTorch needed."""
import json
import statistics
import sys


def load(path):
    rows = []
    for line in open(path):
        parts = line.rstrip("\n").split("\t", 4)
        if len(parts) == 5:
            try:
                rows.append((parts[0], parts[1], parts[3], json.loads(parts[4])))
            except ValueError:
                pass
    return rows


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ms(v):
    return "%10.2f" % v if v is not None else "%10s" % "-"


def ratio(a, b):
    return "%7.2fx" % (a / b) if a and b else "%8s" % "-"


def gpt_table(rows, section, title):
    out = []
    shapes = sorted({(r[3]["batch"], r[3]["seq"]) for r in rows if r[0] == section and "batch" in r[3]},
                    reverse=True)
    if not shapes:
        return out
    out.append("## %s (ms per call; wall = the call through the API, synchronised, reading the loss of a "
               "training step; +outs = the same reading every output (logits, gradients); kernels = the sum of "
               "xtc's kernels by CUDA events)" % title)
    out.append("%-22s %10s %10s %10s %10s %10s %9s %9s %9s" % ("", "xtc wall", "xtc +outs", "xtc kern", "eager",
                                                                "compile", "eager/xtc", "eag/kern", "comp/xtc"))
    for b, n in shapes:
        for mode in ("fwd", "train"):
            for dtype in ("f32", "bf16"):
                mod = "%s_%s_%s" % (section, mode, dtype)
                x = [r[3] for r in rows if r[0] == section and r[1] == "xtc" and r[2] == mod and
                     r[3].get("batch") == b and r[3].get("seq") == n]
                t = lambda impl: [r[3]["median_ms"] for r in rows if r[0] == section and r[1] == "torch" and
                                  r[2] == impl and r[3].get("batch") == b and r[3].get("seq") == n and
                                  r[3].get("mode") == mode and r[3].get("dtype") == dtype]
                xw, xk = med([v["median_ms"] for v in x]), med([v["kernels_ms"] for v in x])
                xa = med([v["read_all_ms"] for v in x if "read_all_ms" in v])
                te, tc = med(t("eager")), med(t("compile"))
                if xw is None and te is None:
                    continue
                name = "%dx%d %s %s" % (b, n, "forward" if mode == "fwd" else "train step", dtype)
                out.append("%-22s %s %s %s %s %s %s %s %s" % (name, ms(xw), ms(xa), ms(xk), ms(te), ms(tc),
                                                              ratio(te, xw), ratio(te, xk), ratio(tc, xw)))
    return out + [""]


def attn_table(rows):
    x = [r[3] for r in rows if r[0] == "attn" and r[1] == "xtc"]
    t = [r[3] for r in rows if r[0] == "attn" and r[1] == "torch"]
    seqs = sorted({v["seq"] for v in x + t if "seq" in v})
    if not seqs:
        return []
    out = ["## causal attention alone, bf16 (ms; xtc: its attention / attention_grad kernels by CUDA events)",
           "%-12s %10s %10s %10s %10s %9s %9s" % ("seq (batch)", "xtc fwd", "sdpa fwd", "xtc bwd", "sdpa bwd",
                                                 "fwd s/x", "bwd s/x")]
    for n in seqs:
        xf = med([v["attention_ms"] for v in x if v["seq"] == n])
        xb = med([v["attention_grad_ms"] for v in x if v["seq"] == n])
        tf = med([v["fwd_ms"] for v in t if v["seq"] == n])
        tb = med([v["bwd_ms"] for v in t if v["seq"] == n])
        b = next((v["batch"] for v in x + t if v.get("seq") == n), 0)
        out.append("%-12s %s %s %s %s %s %s" % ("%d (%d)" % (n, b), ms(xf), ms(tf), ms(xb), ms(tb), ratio(tf, xf),
                                               ratio(tb, xb)))
    return out + [""]


def matmul_table(rows):
    """Rows keyed by (M, K, N, B transposed): xtc's from its module's name (mm_MxKxN[t].so)."""
    def key(section_tool, v):
        if section_tool == "torch":
            return (v["m"], v["k"], v["n"], v.get("b_transposed", 0))
        name = v.get("module", "").rsplit("/", 1)[-1]
        return (v["m"], v["k"], v["n"], int(name.endswith("t.so")))
    got = {}
    for r in rows:
        if r[0] == "matmul" and "m" in r[3] and "median_ms" in r[3]:
            ms_ = r[3]["kernels_ms"] if r[1] == "xtc" else r[3]["median_ms"]
            got.setdefault(key(r[1], r[3]), {}).setdefault(r[1], []).append(ms_)
    if not got:
        return []
    out = ["## matmul alone, bf16 (ms of the product on the device by CUDA events: xtc's kernel, torch.matmul's "
           "cuBLAS; TFLOP/s = 2 M N K / time; ratio = cuBLAS ms / xtc ms, xtc's share of cuBLAS's TFLOP/s; "
           "t: B given as [N, K])",
           "%-20s %10s %9s %10s %9s %10s" % ("M x K x N", "xtc ms", "xtc TF/s", "cuBLAS ms", "cuBLAS TF", "xtc/cuBLAS")]
    order = [k for r in rows if r[0] == "matmul" and "m" in r[3] for k in [key(r[1], r[3])]]
    for k in sorted(got, key=order.index):
        x, t = med(got[k].get("xtc", [])), med(got[k].get("torch", []))
        flop = 2.0 * k[0] * k[1] * k[2]
        tf = lambda v: "%9.1f" % (flop / v * 1e-9) if v else "%9s" % "-"
        ms4 = lambda v: "%10.4f" % v if v is not None else "%10s" % "-"
        out.append("%-20s %s %s %s %s %s" % ("%dx%dx%d%s" % (k[0], k[1], k[2], "t" if k[3] else ""), ms4(x), tf(x),
                                            ms4(t), tf(t), " " + ratio(t, x)))
    return out + [""]


def decode_table(rows):
    out = []
    for dtype in ("f32", "bf16"):
        xr = [r[3] for r in rows if r[0] == "decode" and r[1] == "xtc" and r[2].endswith(dtype)]
        x = med([v["tok_per_s"] for v in xr if not v.get("graphs", 0)])
        xg = med([v["tok_per_s"] for v in xr if v.get("graphs", 0)])
        t = med([r[3]["tok_per_s"] for r in rows if r[0] == "decode" and r[1] == "torch" and
                 r[3].get("dtype") == dtype])
        ctx = next((r[3]["context"] for r in rows if r[0] == "decode"), 0)
        if x is None and t is None:
            continue
        if not out:
            out.append("## KV-cache decode, batch 1 (tokens/s; ratio xtc / PyTorch; xtc with CUDA graphs "
                       "(XTC_CUDA_GRAPHS=1) where measured)")
        out.append("%-22s xtc %s   PyTorch eager %s   %s%s" % (
            "context %d %s" % (ctx, dtype), "%8.0f" % x if x else "%8s" % "-", "%8.0f" % t if t else "%8s" % "-",
            ratio(x, t), "   graphs %8.0f" % xg if xg else ""))
    return out + [""] if out else []


def main():
    rows = load(sys.argv[1])
    dev = next((r[3].get("device") for r in rows if r[1] == "xtc"), "-")
    tv = next((r[3].get("torch") for r in rows if r[1] == "torch"), "-")
    out = ["xtc device: %s; PyTorch %s" % (dev, tv), ""]
    titles = sys.argv[3:5] + ["", ""]
    out += gpt_table(rows, "gpt", "GPT (%s)" % titles[0])
    out += gpt_table(rows, "gptm", "GPT-M (%s)" % titles[1])
    out += attn_table(rows)
    out += matmul_table(rows)
    out += decode_table(rows)
    skipped = [r[3]["skipped"] for r in rows if "skipped" in r[3]]
    out += ["note: " + s for s in skipped]
    if len(sys.argv) > 2:
        out.append("budget left at the end: %s s" % sys.argv[2])
    print("\n".join(out))


if __name__ == "__main__":
    main()
