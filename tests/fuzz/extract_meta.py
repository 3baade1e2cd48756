#!/usr/bin/env python3
# extract_meta.py OUT_DIR MODULE.so...: writes the metadata text each compiled module embeds (from
# "xtc-module 1" to its NUL terminator, include/abi/rt_abi.h) to OUT_DIR/<module name>.meta: the seed
# corpus of fuzz_module_meta (tests/fuzz/README.md says how it was made).
import os
import sys

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
for path in sys.argv[2:]:
    data = open(path, "rb").read()
    start = data.find(b"xtc-module 1\n")
    if start < 0:
        sys.exit(f"{path}: no metadata")
    end = data.index(b"\0", start)
    name = os.path.splitext(os.path.basename(path))[0] + ".meta"
    with open(os.path.join(out, name), "wb") as f:
        f.write(data[start:end])
