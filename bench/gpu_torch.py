#!/usr/bin/env python3
"""gpu_torch.py: the PyTorch half of bench/gpu_compare.sh (self-contained: the lent GPU machine
gets the repository only). One JSON line per measurement on stdout.

The model is x-transformers' GPT as xtc compiles it from a TransformerWrapper + Decoder (pre-norm
LayerNorm, causal attention through scaled_dot_product_attention, to_q/k/v (here one to_qkv)
without bias, to_out with bias, GELU feed-forward x4 with bias, learned absolute positions scaled
by dim**-0.5, final LayerNorm, logits with bias), the model of ../shared/bench/torch_gpt.py with
SDPA and a KV cache.

  gpu_torch.py gpt --vocab V --dim D --depth L --heads H --shapes 8x1024,1x1024
                   [--dtypes f32,bf16] [--modes fwd,train] [--compile] [--device cuda]
  gpu_torch.py attn --seqs 1024,4096 --tokens 16384 [--heads 8 --dim-head 64] [--dtype bf16]
  gpu_torch.py matmul --shapes 4096x4096x4096,8192x512x1536t [--dtype bf16]
  gpu_torch.py decode --vocab V --dim D --depth L --heads H --context 1024 --tokens 64 [--dtypes f32,bf16]
                      [--dim-head 64] [--device cpu --threads 1] [--weights W.safetensors] [--logits-out F.npy]

gpt times eager mode (or torch.compile with --compile): 'fwd' is a no-grad forward, 'train' a
whole step (forward, cross-entropy, backward, AdamW: fused=True on CUDA). bf16 is autocast with
f32 master weights, as mixed-precision training is run. attn times causal attention alone,
(B, H, N, 64) with B = tokens / N: forward, and forward + backward (backward = the difference).
matmul times torch.matmul alone on M x K x N shapes (a [M, K] times b [K, N], or with a t suffix
times b [N, K] transposed, F.linear as an nn.Linear runs): on CUDA the median of per-call CUDA
events (the device's time, as xtc's "kernels_ms"), the wall median beside it.
decode times one-token steps with a KV cache after a prompt of context - tokens (token i is
i * 7 mod vocab, as `xtc bench --decode` feeds them), median per token over --passes passes.
--weights loads xtc's weights (x-transformers' state_dict names: `xtc init model.so -o W`) so
that both run the same model; --logits-out writes the prompt's logits at its last position (the
first token's, f32) for a check against xtc's. bf16 is autocast on CUDA and weights and caches
stored in bf16 on the CPU (what `xtc compile --target cpu --dtype bf16` stores).
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

if __name__ == "__main__" and "--threads" in sys.argv:  # before torch starts its thread pools
    os.environ["OMP_NUM_THREADS"] = sys.argv[sys.argv.index("--threads") + 1]

import torch
import torch.nn as nn
import torch.nn.functional as F


def sdpa(q, k, v, causal):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return F._scaled_dot_product_attention(q, k, v, None, 0.0, False, causal)[0]  # torch 1.13


class Attention(nn.Module):
    def __init__(self, dim, heads, dim_head=None):
        super().__init__()
        self.heads, self.dh = heads, dim_head or dim // heads
        self.to_qkv = nn.Linear(dim, 3 * heads * self.dh, bias=False)
        self.to_out = nn.Linear(heads * self.dh, dim)

    def forward(self, x, cache=None, pos=0):
        b, n, d = x.shape
        q, k, v = self.to_qkv(x).view(b, n, 3, self.heads, self.dh).permute(2, 0, 3, 1, 4)
        if cache is not None:  # cache: (k, v) buffers (b, h, max, dh), filled up to pos
            cache[0][:, :, pos:pos + n] = k
            cache[1][:, :, pos:pos + n] = v
            k, v = cache[0][:, :, :pos + n], cache[1][:, :, :pos + n]
        o = sdpa(q, k, v, causal=n > 1)
        return self.to_out(o.transpose(1, 2).reshape(b, n, self.heads * self.dh))


class Block(nn.Module):
    def __init__(self, dim, heads, dim_head=None):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, dim_head)
        self.ln2 = nn.LayerNorm(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x, cache=None, pos=0):
        x = x + self.attn(self.ln1(x), cache, pos)
        return x + self.ff(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, dim, depth, heads, seq, dim_head=None):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.pos_scale = dim ** -0.5
        self.blocks = nn.ModuleList([Block(dim, heads, dim_head) for _ in range(depth)])
        self.ln_f = nn.LayerNorm(dim)
        self.to_logits = nn.Linear(dim, vocab)

    def forward(self, idx, caches=None, pos=0):
        n = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(pos, pos + n, device=idx.device)) * self.pos_scale
        for i, blk in enumerate(self.blocks):
            x = blk(x, caches[i] if caches is not None else None, pos)
        return self.to_logits(self.ln_f(x))


def load_xtc(model, path):
    """xtc's weights (a safetensors file of F32 tensors by x-transformers' names) into model"""
    import numpy as np
    with open(path, "rb") as f:
        raw = f.read()
    size = int.from_bytes(raw[:8], "little")
    head = json.loads(raw[8:8 + size])
    w = {}
    for name, t in head.items():
        if name != "__metadata__":
            lo, hi = t["data_offsets"]
            assert t["dtype"] == "F32", "%s: %s, not F32" % (name, t["dtype"])
            a = np.frombuffer(raw, dtype=np.float32, count=(hi - lo) // 4, offset=8 + size + lo)
            w[name] = torch.from_numpy(a.reshape(t["shape"]).copy())
    sd = {"tok.weight": w["token_emb.weight"], "pos.weight": w["pos_emb.emb.weight"],
          "ln_f.weight": w["norm.weight"], "ln_f.bias": w["norm.bias"],
          "to_logits.weight": w["to_logits.weight"], "to_logits.bias": w["to_logits.bias"]}
    for i in range(len(model.blocks)):  # layers 2i (norm, attention) and 2i + 1 (norm, feed-forward)
        a, f = "attn_layers.layers.%d." % (2 * i), "attn_layers.layers.%d." % (2 * i + 1)
        b = "blocks.%d." % i
        sd.update({b + "ln1.weight": w[a + "0.0.weight"], b + "ln1.bias": w[a + "0.0.bias"],
                   b + "attn.to_qkv.weight": torch.cat([w[a + "1.to_%s.weight" % x] for x in "qkv"]),
                   b + "attn.to_out.weight": w[a + "1.to_out.weight"], b + "attn.to_out.bias": w[a + "1.to_out.bias"],
                   b + "ln2.weight": w[f + "0.0.weight"], b + "ln2.bias": w[f + "0.0.bias"],
                   b + "ff.0.weight": w[f + "1.net.0.0.weight"], b + "ff.0.bias": w[f + "1.net.0.0.bias"],
                   b + "ff.2.weight": w[f + "1.net.3.weight"], b + "ff.2.bias": w[f + "1.net.3.bias"]})
    sd["pos.weight"] = sd["pos.weight"][:model.pos.weight.shape[0]]
    model.load_state_dict(sd)


def sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def timeit(fn, iters, warmup, dev):
    for _ in range(warmup):
        fn()
    sync(dev)
    ts = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync(dev)
        ts.append(time.perf_counter() - t0)
    ts.sort()
    mid = len(ts) // 2
    med = ts[mid] if len(ts) % 2 else 0.5 * (ts[mid - 1] + ts[mid])
    return 1e3 * med, 1e3 * ts[0]


def autocast(dev, dtype):
    if dtype != "bf16":
        return torch.autocast(dev, enabled=False) if hasattr(torch, "autocast") else nullctx()
    return torch.autocast(dev, dtype=torch.bfloat16)


class nullctx:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def emit(**kw):
    kw["torch"] = torch.__version__
    print(json.dumps(kw), flush=True)


def shapes_of(text):
    return [tuple(int(v) for v in s.split("x")) for s in text.split(",") if s]


def run_gpt(a):
    dev = a.device
    torch.manual_seed(0)
    maxseq = max(n for _, n in shapes_of(a.shapes))
    model = GPT(a.vocab, a.dim, a.depth, a.heads, maxseq).to(dev)
    impl = "compile" if a.compile else "eager"
    fused = dev == "cuda"
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)
    except (TypeError, RuntimeError):
        fused = False
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    net = torch.compile(model) if a.compile else model
    for b, n in shapes_of(a.shapes):
        idx = torch.randint(0, a.vocab, (b, n), device=dev)
        tgt = torch.randint(0, a.vocab, (b, n), device=dev)
        for dtype in a.dtypes.split(","):
            for mode in a.modes.split(","):
                if mode == "fwd":
                    def step():
                        with torch.no_grad(), autocast(dev, dtype):
                            net(idx)
                else:
                    def step():
                        opt.zero_grad(set_to_none=True)
                        with autocast(dev, dtype):
                            logits = net(idx)
                        loss = F.cross_entropy(logits.float().view(-1, a.vocab), tgt.view(-1))
                        loss.backward()
                        opt.step()
                model.train(mode == "train")
                med, mn = timeit(step, a.iters, a.warmup, dev)
                emit(kind="gpt", impl=impl, mode=mode, dtype=dtype, batch=b, seq=n, median_ms=med, min_ms=mn,
                     fused_adamw=fused, device=dev, tok_per_s=b * n / med * 1e3)


def run_attn(a):
    dev = a.device
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    for n in [int(s) for s in a.seqs.split(",") if s]:
        b = max(1, a.tokens // n)
        q, k, v = (torch.randn(b, a.heads, n, a.dim_head, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
        g = torch.randn(b, a.heads, n, a.dim_head, device=dev, dtype=dt)

        def fwd():
            with torch.no_grad():
                sdpa(q, k, v, True)

        def fwdbwd():
            o = sdpa(q, k, v, True)
            o.backward(g)

        fm, _ = timeit(fwd, a.iters, 1, dev)
        bm, _ = timeit(fwdbwd, a.iters, 1, dev)
        flop = 4.0 * b * a.heads * n * n * a.dim_head / 2  # causal: half of QK^T and PV
        emit(kind="attn", dtype=a.dtype, batch=b, heads=a.heads, seq=n, dim_head=a.dim_head, fwd_ms=fm,
             bwd_ms=max(bm - fm, 0.0), fwd_tflops=flop / fm * 1e-9, device=dev)


def run_matmul(a):
    dev = a.device
    dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    for spec in [s for s in a.shapes.split(",") if s]:
        trans = spec.endswith("t")
        m, k, n = (int(v) for v in spec.rstrip("t").split("x"))
        x = torch.rand(m, k, device=dev, dtype=dt) * 2 - 1
        w = torch.rand(*((n, k) if trans else (k, n)), device=dev, dtype=dt) * 2 - 1
        fn = (lambda: F.linear(x, w)) if trans else (lambda: torch.matmul(x, w))
        wall, _ = timeit(fn, a.iters, a.warmup, dev)
        dms = wall
        if dev == "cuda":
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(a.iters)]
            for e0, e1 in ev:
                e0.record()
                fn()
                e1.record()
            torch.cuda.synchronize()
            dms = statistics.median(e0.elapsed_time(e1) for e0, e1 in ev)
        emit(kind="matmul", dtype=a.dtype, m=m, k=k, n=n, b_transposed=int(trans), median_ms=dms, wall_ms=wall,
             tflops=2.0 * m * n * k / dms * 1e-9, device=dev)
        del x, w


def run_decode(a):
    dev = a.device
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = GPT(a.vocab, a.dim, a.depth, a.heads, a.context, a.dim_head).to(dev).eval()
    if a.weights:
        load_xtc(model, a.weights)
    dh = a.dim_head or a.dim // a.heads
    prompt = a.context - a.tokens
    idx = (torch.arange(a.context, device=dev) * 7 % a.vocab).view(1, -1)
    for dtype in a.dtypes.split(","):
        stored = dtype == "bf16" and dev == "cpu"  # bf16 weights and caches, no autocast
        cdt = torch.bfloat16 if dtype == "bf16" and dev in ("cuda", "cpu") else torch.float32
        m = GPT(a.vocab, a.dim, a.depth, a.heads, a.context, a.dim_head).to(dev).eval() if stored else model
        if stored:
            m.load_state_dict(model.state_dict())
            m = m.to(torch.bfloat16)
        # a first pass warms up (cuBLAS handles, autocast caches, lazy kernel loading); then
        # --passes timed passes of the one-token steps, their median per token
        per_token, cpu_per_token = [], []
        for rep in range(1 + a.passes):
            with torch.no_grad(), autocast(dev, "f32" if stored else dtype):
                caches = [(torch.zeros(1, a.heads, a.context, dh, device=dev, dtype=cdt),
                           torch.zeros(1, a.heads, a.context, dh, device=dev, dtype=cdt)) for _ in range(a.depth)]
                t0 = time.perf_counter()
                first = m(idx[:, :prompt], caches, 0)[0, -1].float().cpu()
                sync(dev)
                t1, c1 = time.perf_counter(), time.process_time()
                for i in range(a.tokens if rep else min(a.tokens, 4)):
                    logits = m(idx[:, prompt + i:prompt + i + 1], caches, prompt + i)
                    logits.float().cpu()  # read back, as a sampler would
                sync(dev)
                t2, c2 = time.perf_counter(), time.process_time()
            if rep:
                per_token.append((t2 - t1) / a.tokens)
                cpu_per_token.append((c2 - c1) / a.tokens)  # the process's CPU time, every thread's
        if a.logits_out:
            import numpy as np
            np.save(a.logits_out.replace("DTYPE", dtype), first.numpy())
        if not per_token:  # --passes 0: the logits only
            continue
        med, cpu_med = statistics.median(per_token), statistics.median(cpu_per_token)
        extra = {"cpu_tok_per_s": 1 / cpu_med} if dev == "cpu" and cpu_med > 0 else {}
        emit(kind="decode", dtype=dtype, context=a.context, tokens=a.tokens, prompt_ms=1e3 * (t1 - t0),
             ms_per_token=1e3 * med, tok_per_s=1 / med, passes=a.passes, threads=torch.get_num_threads(), device=dev,
             **extra)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("gpt", "attn", "decode"):
        s = sub.add_parser(name)
        s.add_argument("--device", default="cuda")
        s.add_argument("--iters", type=int, default=10)
        s.add_argument("--warmup", type=int, default=3)
        if name in ("gpt", "decode"):
            for k in ("vocab", "dim", "depth", "heads"):
                s.add_argument("--" + k, type=int, required=True)
            s.add_argument("--dtypes", default="f32,bf16")
    g = sub.choices["gpt"]
    g.add_argument("--shapes", required=True)
    g.add_argument("--modes", default="fwd,train")
    g.add_argument("--compile", action="store_true")
    t = sub.choices["attn"]
    t.add_argument("--seqs", required=True)
    t.add_argument("--tokens", type=int, default=16384)
    t.add_argument("--heads", type=int, default=8)
    t.add_argument("--dim-head", type=int, default=64)
    t.add_argument("--dtype", default="bf16")
    mm = sub.add_parser("matmul")
    mm.add_argument("--device", default="cuda")
    mm.add_argument("--iters", type=int, default=10)
    mm.add_argument("--warmup", type=int, default=3)
    mm.add_argument("--shapes", required=True, help="MxKxN[t],...: t for b given as [N, K] (F.linear)")
    mm.add_argument("--dtype", default="bf16")
    d = sub.choices["decode"]
    d.add_argument("--context", type=int, default=1024)
    d.add_argument("--tokens", type=int, default=64)
    d.add_argument("--passes", type=int, default=1, help="timed passes of --tokens steps")
    d.add_argument("--dim-head", type=int, default=0, help="the heads' width (0: dim / heads)")
    d.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: PyTorch's default)")
    d.add_argument("--weights", help="xtc's weights (safetensors, x-transformers' names)")
    d.add_argument("--logits-out", help="the prompt's last logits as .npy (DTYPE in the name: f32 or bf16)")
    a = p.parse_args()
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_torch.py: no CUDA device for PyTorch %s" % torch.__version__)
    if a.cmd == "gpt" and a.compile and not hasattr(torch, "compile"):
        emit(kind="gpt", impl="compile", skipped="torch.compile is not in PyTorch %s" % torch.__version__)
        return
    torch.backends.cuda.matmul.allow_tf32 = False  # f32 means f32, as xtc's default (--mma off)
    {"gpt": run_gpt, "attn": run_attn, "decode": run_decode, "matmul": run_matmul}[a.cmd](a)


if __name__ == "__main__":
    main()
