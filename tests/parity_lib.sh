# parity_lib.sh BUILD_DIR SOURCE_DIR: sourced (". parity_lib.sh "$1" "$2"") by the scripts that
# use the parity cases (test_parity_interp.sh, test_parity_train.sh, test_bad_inputs.sh,
# test_parity_newer.sh, test_parity_xl.sh). Sets build, src, shared (../shared unless
# XTC_SHARED_DIR), parity ($shared/parity: the cases, their grader compare.py and
# safetensors_lite), compare, py and xtc; makes $tmp (removed on exit) and $tmp/xl.py; exits 1
# when the grader is missing. parity_grade grades one output file.
build=$1
src=$2
shared=${XTC_SHARED_DIR:-$src/../shared}
parity=$shared/parity
compare=$parity/compare.py
if [ ! -f "$compare" ]; then
  echo "FAIL: the parity cases and their grader are not at $parity (set XTC_SHARED_DIR)"
  exit 1
fi
py=/usr/bin/python3
[ -x $py ] || py=python3
xtc=$build/xtc
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export PARITY_LIB=$parity
# each emulated CUDA module runs once: cc -O0 compiles it ~3x faster than the default -O1
export XTC_EMU_OPT=${XTC_EMU_OPT:-0}

# xl.py CASE_DIR OUT in1|in2|merge [SEG1 [SEG2]]: Transformer-XL's two segments (DESIGN.md:
# recurrence): in1 the inputs of segment 1 (`tokens`, empty memories), in2 those of segment 2
# (`tokens2`, `targets2`, segment 1's memories), merge the graded file: logits and mems.<l> of
# segment 1, logits2, mems2.<l>, loss and the gradients of segment 2. The memories are num_mems
# of case.json (one a layer without it) of the layers' dim.
cat > "$tmp/xl.py" <<'PY'
import json, os, sys
sys.path.insert(0, os.environ["PARITY_LIB"])
import safetensors_lite as st
d, out, step = sys.argv[1], sys.argv[2], sys.argv[3]
info = json.load(open(d + "/case.json"))
layers = info["config"]["attn_layers_kwargs"]
nmems, dim = info.get("num_mems", layers["depth"]), layers["dim"]
inp, _ = st.read(d + "/inputs.safetensors")
if step == "in1":
    res = {"tokens": inp["tokens"]}
    for l in range(nmems):
        res["mems.%d" % l] = st.Tensor("F32", [inp["tokens"].shape[0], 0, dim], [])
elif step == "in2":
    o1, _ = st.read(sys.argv[4])
    res = {"tokens": inp["tokens2"], "targets": inp["targets2"]}
    for l in range(nmems):
        res["mems.%d" % l] = o1["mems.%d" % l]
else:
    o1, _ = st.read(sys.argv[4])
    o2, _ = st.read(sys.argv[5])
    res = {k: v for k, v in o2.items() if k.startswith("grad.")}
    res.update({"logits": o1["logits"], "logits2": o2["logits"], "loss": o2["loss"]})
    for l in range(nmems):
        res["mems.%d" % l] = o1["mems.%d" % l]
        res["mems2.%d" % l] = o2["mems.%d" % l]
st.write(out, res)
PY

# parity_grade LABEL CASE_DIR OUTPUTS [compare.py options...]: one line, "ok   LABEL (N tensors, G
# gradients; worst max_abs_err W)", or "FAIL LABEL:" and the tensors that failed; status 0 on ok.
parity_grade() {
  local label=$1 dir=$2 got=$3 out
  shift 3
  if out=$($py "$compare" "$dir" "$got" "$@" 2>&1); then
    echo "ok   $label ($(echo "$out" | grep -c '^ok') tensors, $(echo "$out" | grep -c '^ok *grad\.') gradients;" \
      "worst max_abs_err $(echo "$out" | awk '/max_abs_err/ { if ($4 > w) w = $4 } END { printf "%.3e", w }'))"
  else
    echo "FAIL $label:"
    echo "$out" | grep -v '^ok' | sed 's/^/    /'
    return 1
  fi
}
export -f parity_grade
export py compare
