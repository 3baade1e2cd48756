#!/usr/bin/env python3
"""xtc_safetensors.py: .safetensors files from and to PyTorch tensors, without the safetensors
package (needs only torch and numpy, as Debian's python3-torch has them).

    from xtc_safetensors import save_file, load_file   # the names of safetensors.torch
    save_file(model.state_dict(), "model.safetensors") # weights, every dtype kept
    save_file({"tokens": torch.tensor([[1, 5, 9]])}, "in.safetensors")   # int64 stays I64
    out = load_file("out.safetensors")                 # {"logits": float32 tensor, ...}

Unlike safetensors.torch.save_file, tensors that share memory (tied embeddings) and
non-contiguous ones are accepted: each name is written with its own copy of the values, as
xtc expects a tied weight under each of its state_dict names.

From the shell, `python3 tools/xtc_safetensors.py FILE...` lists each tensor: name, dtype,
shape and, for small ones, the values (else the first few, min and max).
"""
import json
import struct
import sys

import numpy as np
import torch

# torch dtype <-> safetensors dtype tag <-> little-endian numpy dtype (BF16 travels as its bits)
_DTYPES = [
    (torch.float32, "F32", "<f4"), (torch.float64, "F64", "<f8"), (torch.float16, "F16", "<f2"),
    (torch.bfloat16, "BF16", "<i2"), (torch.int64, "I64", "<i8"), (torch.int32, "I32", "<i4"),
    (torch.int16, "I16", "<i2"), (torch.int8, "I8", "i1"), (torch.uint8, "U8", "u1"),
    (torch.bool, "BOOL", "?"),
]
_TAG = {t: (tag, np_dt) for t, tag, np_dt in _DTYPES}
_TORCH = {tag: (t, np_dt) for t, tag, np_dt in _DTYPES}


def _raw(name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError("%s: not a torch.Tensor (%s)" % (name, type(t).__name__))
    if t.dtype not in _TAG:
        raise TypeError("%s: dtype %s has no safetensors tag here" % (name, t.dtype))
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return np.ascontiguousarray(t.numpy(), dtype=_TAG[t.dtype][1]).tobytes()


def save_file(tensors, path, metadata=None):
    """Writes a {name: tensor} mapping (a state_dict, a dict of inputs) to path, in its order."""
    header, blobs, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise TypeError("tensor names must be strings, got %r" % (name,))
        b = _raw(name, t)
        header[name] = {"dtype": _TAG[t.dtype][0], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * (-len(h) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def load_file(path):
    """Reads a .safetensors file into {name: tensor} (file order, the file's dtypes)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError("%s: too short for a safetensors file" % path)
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError("%s: header length %d does not fit the file (%d bytes)" % (path, n, len(data)))
    header = json.loads(data[8:8 + n].decode("utf-8"))
    header.pop("__metadata__", None)
    base, out = 8 + n, {}
    for name, h in header.items():
        if h["dtype"] not in _TORCH:
            raise ValueError("%s: tensor %r has dtype %s, not read here" % (path, name, h["dtype"]))
        dt, np_dt = _TORCH[h["dtype"]]
        b, e = h["data_offsets"]
        arr = np.frombuffer(data[base + b: base + e], dtype=np_dt).copy()
        t = torch.from_numpy(arr.astype(arr.dtype.newbyteorder("="), copy=False))
        if dt == torch.bfloat16:
            t = t.view(torch.bfloat16)
        out[name] = t.to(dt).reshape(h["shape"])
    return out


def _show(path):
    for name, t in load_file(path).items():
        line = "%s  %s %s" % (name, str(t.dtype).replace("torch.", ""), list(t.shape))
        flat = t.reshape(-1)
        if flat.numel() <= 8:
            line += "  %s" % flat.tolist()
        else:
            v = flat.double() if t.dtype != torch.bool else flat.long()
            line += "  [%s, ...] min %g max %g" % (", ".join("%g" % x for x in v[:4].tolist()),
                                                   v.min().item(), v.max().item())
        print(line)


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print("usage: python3 tools/xtc_safetensors.py FILE.safetensors...")
        sys.exit(0 if len(sys.argv) >= 2 else 2)
    for p in sys.argv[1:]:
        if len(sys.argv) > 2:
            print("== %s" % p)
        _show(p)
