# gen.py PARITY_DIR OUT_DIR: writes the hostile weights and input files of test_bad_inputs.sh,
# derived from the decoder_plain and continuous parity cases (weights.safetensors, inputs.safetensors).
# w_*: weights (the container, then the contents against the model); i_*: inputs.
# Standard library only, through the cases' own safetensors_lite.py.
import json
import os
import struct
import sys

parity, out = sys.argv[1], sys.argv[2]
sys.path.insert(0, parity)
import safetensors_lite as st
T = st.Tensor
case = parity + "/decoder_plain"
W, _ = st.read(case + "/weights.safetensors")
I, _ = st.read(case + "/inputs.safetensors")
wbytes = open(case + "/weights.safetensors", "rb").read()

def path(name):
    return os.path.join(out, name)

def raw(name, data):
    with open(path(name), "wb") as f:
        f.write(data)

def header_file(name, header, body=b"", hlen=None):
    h = json.dumps(header, separators=(",", ":")).encode()
    raw(name, struct.pack("<Q", len(h) if hlen is None else hlen) + h + body)

def weights(name, change):
    w = dict(W)
    change(w)
    st.write(path(name), w)

def inputs(name, tensors):
    st.write(path(name), tensors)

tokens = I["tokens"]  # I64 [2, 16]
def tok(values, shape, dtype="I64"):
    return T(dtype, shape, values)

# ---- weights: the container ----
raw("w_truncated.safetensors", wbytes[: len(wbytes) - 100])
hlen = struct.unpack("<Q", wbytes[:8])[0]
raw("w_header_beyond.safetensors", struct.pack("<Q", len(wbytes)) + wbytes[8:])
raw("w_header_absurd.safetensors", struct.pack("<Q", 1 << 62) + wbytes[8:])
raw("w_short.safetensors", b"\x10\x00\x00")
raw("w_empty.safetensors", b"")
raw("w_not_json.safetensors", struct.pack("<Q", 8) + b"not json")
raw("w_not_utf8.safetensors", struct.pack("<Q", 8) + b'{"\xff\xfe":1}')
raw("w_text.safetensors", b"# this is a text file, not safetensors\n" * 4)
dup = b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}'
raw("w_duplicate_name.safetensors", struct.pack("<Q", len(dup)) + dup + b"\0" * 8)
header_file("w_overlap.safetensors", {
    "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
    "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, b"\0" * 12)
header_file("w_offsets_mismatch.safetensors", {
    "norm.weight": {"dtype": "F32", "shape": [32], "data_offsets": [0, 64]}}, b"\0" * 128)
header_file("w_offsets_beyond.safetensors", {
    "norm.weight": {"dtype": "F32", "shape": [32], "data_offsets": [0, 128]}}, b"\0" * 64)
header_file("w_negative_dim.safetensors", {
    "norm.weight": {"dtype": "F32", "shape": [-32], "data_offsets": [0, 0]}})
header_file("w_huge_shape.safetensors", {
    "norm.weight": {"dtype": "F32", "shape": [1 << 40, 1 << 40], "data_offsets": [0, 0]}})
header_file("w_huge_offsets.safetensors", {
    "norm.weight": {"dtype": "F32", "shape": [32], "data_offsets": [18446744073709551488, 18446744073709551616]}})
header_file("w_unknown_dtype.safetensors", {
    "norm.weight": {"dtype": "F8_E4M3", "shape": [32], "data_offsets": [0, 32]}}, b"\0" * 32)
header_file("w_rank9.safetensors", {
    "norm.weight": {"dtype": "F32", "shape": [1] * 9, "data_offsets": [0, 4]}}, b"\0" * 4)
header_file("w_control_name.safetensors", {
    "norm\nweight": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4)
header_file("w_metadata_not_object.safetensors", {"__metadata__": [1, 2]})
# ---- weights: the contents against the model ----
weights("w_missing.safetensors", lambda w: w.pop("norm.bias"))
weights("w_extra.safetensors", lambda w: w.__setitem__("extra.weight", T("F32", [2], [0.0, 0.0])))
weights("w_misshaped.safetensors", lambda w: w.__setitem__("norm.weight", T("F32", [31], [1.0] * 31)))
weights("w_rank.safetensors", lambda w: w.__setitem__("norm.weight", T("F32", [1, 32], [1.0] * 32)))
weights("w_int_dtype.safetensors", lambda w: w.__setitem__("norm.weight", T("I64", [32], [1] * 32)))
def nan(w):
    v = list(w["attn_layers.layers.0.1.to_q.weight"].values)
    v[5] = float("nan")
    w["attn_layers.layers.0.1.to_q.weight"] = T("F32", [64, 32], v)
weights("w_nan.safetensors", nan)
def inf(w):
    v = list(w["norm.bias"].values)
    v[3] = float("-inf")
    w["norm.bias"] = T("F32", [32], v)
weights("w_inf.safetensors", inf)
weights("w_f64_overflow.safetensors", lambda w: w.__setitem__("norm.weight", T("F64", [32], [1e300] * 32)))
def overflow(w):  # finite weights whose logits overflow float32: 32 * 1e30 * 1e30
    w["norm.bias"] = T("F32", [32], [1e30] * 32)
    w["to_logits.weight"] = T("F32", [64, 32], [1e30] * (64 * 32))
weights("w_logits_overflow.safetensors", overflow)

# ---- inputs ----
targets = I["targets"]
inputs("i_f32_tokens.safetensors", {"tokens": T("F32", [2, 16], [float(v) for v in tokens.values])})
inputs("i_f64_tokens.safetensors", {"tokens": T("F64", [2, 16], [float(v) for v in tokens.values])})
inputs("i_token_70.safetensors", {"tokens": tok([70] + tokens.values[1:], [2, 16])})
inputs("i_token_neg.safetensors", {"tokens": tok(tokens.values[:20] + [-1] + tokens.values[21:], [2, 16])})
inputs("i_token_i32_range.safetensors", {"tokens": tok([64] * 32, [2, 16], "I32")})
inputs("i_too_long.safetensors", {"tokens": tok([1] * 80, [2, 40])})
inputs("i_mask_shape.safetensors", {"tokens": tokens, "mask": T("BOOL", [2, 15], [True] * 30)})
inputs("i_mask_batch.safetensors", {"tokens": tokens, "mask": T("BOOL", [3, 16], [True] * 48)})
inputs("i_mask_f32.safetensors", {"tokens": tokens, "mask": T("F32", [2, 16], [1.0] * 32)})
inputs("i_mask_rank.safetensors", {"tokens": tokens, "mask": T("BOOL", [32], [True] * 32)})
inputs("i_no_tokens.safetensors", {"targets": targets})
inputs("i_tokens_rank1.safetensors", {"tokens": tok(tokens.values, [32])})
inputs("i_tokens_rank3.safetensors", {"tokens": tok(tokens.values, [2, 16, 1])})
inputs("i_targets_range.safetensors", {"tokens": tokens, "targets": tok([70] * 32, [2, 16])})
inputs("i_targets_shape.safetensors", {"tokens": tokens, "targets": tok([1] * 30, [2, 15])})
inputs("i_targets_batch.safetensors", {"tokens": tokens, "targets": tok([1] * 16, [1, 16])})
header_file("i_bool_byte.safetensors", {
    "tokens": {"dtype": "I64", "shape": [2, 16], "data_offsets": [0, 256]},
    "mask": {"dtype": "BOOL", "shape": [2, 16], "data_offsets": [256, 288]}},
    struct.pack("<32q", *tokens.values) + bytes([1] * 31 + [2]))
header_file("i_truncated.safetensors", {"tokens": {"dtype": "I64", "shape": [2, 16], "data_offsets": [0, 256]}},
            struct.pack("<16q", *tokens.values[:16]))
# continuous model: a NaN in the float input x
C, _ = st.read(parity + "/continuous/inputs.safetensors")
x = list(C["x"].values)
x[17] = float("nan")
inputs("i_nan_x.safetensors", {"x": T("F32", C["x"].shape, x), "mask": C["mask"]})
# ... trained through the caller's gradient of its output: finite, but the parameters' gradients
# (sums of many 3e38) overflow float32
inputs("i_grad_overflow.safetensors", {"x": C["x"], "mask": C["mask"],
                                       "grad.output": T("F32", [2, 16, 6], [3e38] * 192)})

# ---- edge cases that are valid: they must run ----
# tokens whose data is not 8-byte aligned in the file (after a 3-byte tensor)
header_file("ok_misaligned.safetensors", {
    "pad": {"dtype": "U8", "shape": [3], "data_offsets": [0, 3]},
    "tokens": {"dtype": "I64", "shape": [2, 16], "data_offsets": [3, 259]}},
    b"\0\0\0" + struct.pack("<32q", *tokens.values))
header_file("ok_i16_tokens.safetensors", {"tokens": {"dtype": "I16", "shape": [2, 16], "data_offsets": [0, 64]}},
            struct.pack("<32h", *tokens.values))
inputs("ok_empty_seq.safetensors", {"tokens": tok([], [2, 0])})
inputs("ok_empty_batch.safetensors", {"tokens": tok([], [0, 16])})
inputs("ok_i32_tokens.safetensors", {"tokens": tok(tokens.values, [2, 16], "I32")})
inputs("ok_ignored_target.safetensors", {"tokens": tokens, "targets": tok([-100] * 32, [2, 16])})
weights("ok_f64_weights.safetensors", lambda w: w.update({k: T("F64", v.shape, v.values) for k, v in W.items()}))
