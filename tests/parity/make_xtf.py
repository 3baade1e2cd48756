#!/usr/bin/env python3
"""make_xtf.py SHARED_PARITY_DIR OUT_DIR: writes one .xtf per parity case from its config.json.

The .xtf text is the x-transformers constructor call of the case, written in xtc's language;
the committed files in tests/parity/ were produced by this script (re-run it when the shared
cases change)."""
import json
import os
import sys


def lit(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (list, tuple)):
        return "(" + ", ".join(lit(x) for x in v) + ("," if len(v) == 1 else "") + ")"
    if isinstance(v, str):
        return '"%s"' % v
    return repr(v)


def call(name, kwargs, indent):
    """A constructor call; values starting with '@' are nested calls, written as is."""
    pad = " " * (indent + 4)
    lines = []
    for k, v in kwargs.items():
        text = v[1:] if isinstance(v, str) and v.startswith("@") else lit(v)
        lines.append("%s%s = %s," % (pad, k, text))
    return "%s(\n%s\n%s)" % (name, "\n".join(lines), " " * indent)


def main():
    src, out = sys.argv[1], sys.argv[2]
    for case in sorted(os.listdir(src)):
        cfg_path = os.path.join(src, case, "config.json")
        if not os.path.exists(cfg_path):
            continue
        cfg = json.load(open(cfg_path))
        wk = dict(cfg.get("wrapper_kwargs") or {})
        text = "# %s: %s\n" % (case, cfg.get("description", ""))
        if cfg.get("attn_layers"):
            inner = call(cfg["attn_layers"], cfg["attn_layers_kwargs"], 4)
            wk["attn_layers"] = "@" + inner
        text += "model = " + call(cfg["wrapper"], wk, 0) + "\n"
        with open(os.path.join(out, case + ".xtf"), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
