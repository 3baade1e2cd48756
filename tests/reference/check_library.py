#!/usr/bin/env python3
"""check_library.py [PARITY_DIR]: the reference (xt_ref.py) against x-transformers itself.

Runs xt_ref on every case of ../shared/parity (produced by the real library 0.23.0, float32)
with the case's own weights and inputs, and grades its outputs, loss and every gradient with
the case's compare.py at the DESIGN.md tolerance. This is what makes xt_ref a trustworthy
oracle for the combination cases of cases.py. Cases that use features xt_ref does not model
(none at present: NOT_MODELLED) are skipped. The weights file must hold exactly the tensors
xt_ref asks for (like load_state_dict(strict=True)).
Exit status 0 when every graded case passes.
"""
import json
import os
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
import xt_ref  # noqa: E402
from xt_ref import Call  # noqa: E402

SHARED = os.environ.get("XTC_SHARED_DIR") or os.path.join(HERE, "..", "..", "..", "shared")
NOT_MODELLED = ()


def read(st, path):
    """safetensors file -> {name: torch tensor} (floats as float64)."""
    out = {}
    for k, t in st.read(path)[0].items():
        if t.dtype == "BOOL":
            v = torch.tensor(t.values, dtype=torch.bool)
        elif t.dtype in ("I64", "I32"):
            v = torch.tensor(t.values, dtype=torch.int64)
        else:
            v = torch.tensor(t.values, dtype=torch.float64)
        out[k] = v.reshape(t.shape)
    return out


def model_of(cfg):
    kw = dict(cfg.get("wrapper_kwargs") or {})
    if cfg.get("attn_layers"):
        kw["attn_layers"] = Call(cfg["attn_layers"], **cfg["attn_layers_kwargs"])
    return Call(cfg["wrapper"], **kw)


def run_case(case_dir, st):
    cfg = json.load(open(os.path.join(case_dir, "config.json")))
    call = model_of(cfg)
    P = xt_ref.Params(0)
    P.preset = read(st, os.path.join(case_dir, "weights.safetensors"))
    inp = read(st, os.path.join(case_dir, "inputs.safetensors"))
    exp = {}
    if call.get("max_mem_len"):  # two segments; the loss is segment 2's (mems detached)
        with torch.no_grad():
            out1, _ = xt_ref.run_model(P, call, {"tokens": inp["tokens"]})
        seg2 = {"tokens": inp["tokens2"], "targets": inp["targets2"]}
        seg2.update({k: v for k, v in out1.items() if k.startswith("mems.")})
        out2, loss = xt_ref.run_model(P, call, seg2)
        exp["logits"] = out1["logits"]
        exp["logits2"] = out2["logits"]
        exp["grad.logits2"], = torch.autograd.grad(loss, out2["logits"], retain_graph=True)
        for k, v in out1.items():
            if k.startswith("mems."):
                exp[k] = v
                exp["mems2." + k[5:]] = out2[k]
    else:
        outs, loss = xt_ref.run_model(P, call, inp)
        exp.update(outs)
        (name, out), = outs.items()  # d loss / d output, a debugging aid of the cases
        exp["grad." + name], = torch.autograd.grad(loss, out, retain_graph=True)
    exp["loss"] = loss
    for k, v in xt_ref.gradients(P, loss).items():
        exp["grad." + k] = v
    extra = set(P.preset) - set(P.values)
    if extra:
        raise ValueError("weights the reference never used: %s" % sorted(extra))
    return exp


def main():
    parity = sys.argv[1] if len(sys.argv) > 1 else os.path.join(SHARED, "parity")
    sys.path.insert(0, parity)
    import safetensors_lite as st
    torch.set_num_threads(1)
    npass = nfail = nskip = 0
    with tempfile.TemporaryDirectory() as tmp:
        for case in sorted(os.listdir(parity)):
            d = os.path.join(parity, case)
            if not os.path.exists(os.path.join(d, "config.json")):
                continue
            cfg_text = open(os.path.join(d, "config.json")).read()
            if any(k in cfg_text for k in NOT_MODELLED):
                print("skip %s (not modelled)" % case)
                nskip += 1
                continue
            try:
                exp = run_case(d, st)
            except Exception as e:  # noqa: BLE001 - report and go on
                print("FAIL %s: %s: %s" % (case, type(e).__name__, e))
                nfail += 1
                continue
            path = os.path.join(tmp, case + ".safetensors")
            st.write(path, {k: st.Tensor("F64", list(v.shape), v.detach().reshape(-1).tolist())
                            for k, v in exp.items()})
            # compare.py grades the case's expected tensors (every one, gradients included)
            r = subprocess.run([sys.executable, os.path.join(parity, "compare.py"), d, path],
                               capture_output=True, text=True)
            worst = max((float(line.split("max_abs_err")[1].split()[0]) /
                         float(line.split("limit")[1].split()[0])
                         for line in r.stdout.splitlines() if "max_abs_err" in line), default=0)
            if r.returncode == 0:
                print("ok   %s (%s; worst %.2e of limit)" % (case, r.stdout.strip().splitlines()[-1],
                                                           worst))
                npass += 1
            else:
                print("FAIL %s:" % case)
                for line in r.stdout.splitlines():
                    if not line.startswith("ok"):
                        print("    " + line)
                nfail += 1
    print("reference vs x-transformers 0.23.0: %d passed, %d failed, %d skipped" % (npass, nfail, nskip))
    sys.exit(1 if nfail else 0)


if __name__ == "__main__":
    main()
