#!/usr/bin/env bash
# nccl_check.sh: NCCL end to end on one GPU: a GPT training module compiled for --target cuda
# trains STEPS steps alone and with a one-rank NCCL communicator (gradients all-reduced on the
# device by ncclAllReduce, then the device's AdamW step); PASS when the losses and weights agree
# (bench/nccl_check.c prints the per-step times of both too). A check for the notes and the
# lent GPU machines, not a ctest entry (tests/test_nccl.sh runs nccl_check through the emulator).
#
#   bench/nccl_check.sh --prepare     (here, with LLVM: builds xtc and the kit build/nccl_kit:
#                                      nccl_check linked with libxtc_rt.a, and the module)
#   bench/nccl_check.sh               (on the GPU machine, build/nccl_kit carried there: no LLVM,
#                                      no MPI needed)
#   bench/nccl_check.sh --dry-run     (anywhere: the kit for cuda-emu in a temporary folder, run
#                                      with the stand-in libnccl of the tests, build/libfake_nccl.so)
# Options: --kit DIR, --build DIR, --arch sm_XY (sm_90), --steps N (20).
# NCCL: the file $XTC_NCCL names; else PyTorch's (python3 -c 'import nvidia.nccl, os;
# print(os.path.dirname(nvidia.nccl.__file__))' + /lib/libnccl.so.2, with $XTC_PYTHON, python3 or
# /usr/bin/python3); else libnccl.so.2 from the loader's path. Exit 0 on PASS.
set -u
cd "$(dirname "$0")/.."
build=build kit= arch=sm_90 steps=20 prepare=0 dry=0
while [ $# -gt 0 ]; do
  case $1 in
    --prepare) prepare=1 ;;
    --dry-run) dry=1 ;;
    --kit) kit=$2; shift ;;
    --build) build=$2; shift ;;
    --arch) arch=$2; shift ;;
    --steps) steps=$2; shift ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "nccl_check.sh: unknown option '$1' (--help)"; exit 2 ;;
  esac
  shift
done
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ $dry = 1 ]; then
  target=(--target cuda-emu) kit=${kit:-$tmp/kit} shape=(3 2 16) prepare=1
  model='gpt = TransformerWrapper(num_tokens = 256, max_seq_len = 32,
    attn_layers = Decoder(dim = 32, depth = 1, heads = 2))'
else
  target=(--target cuda --cuda-arch "$arch") kit=${kit:-$build/nccl_kit} shape=("$steps" 8 256)
  model='gpt = TransformerWrapper(num_tokens = 4096, max_seq_len = 256,
    attn_layers = Decoder(dim = 256, depth = 4, heads = 4))'
fi

if [ $prepare = 1 ]; then
  if [ ! -x "$build/xtc" ] || [ ! -f "$build/libxtc_rt.a" ]; then
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release > "$tmp/cmake.log" 2>&1 &&
      cmake --build "$build" -j"$(nproc)" --target xtc xtc_rt >> "$tmp/cmake.log" 2>&1 ||
      { echo "cannot build xtc here: $(tail -3 "$tmp/cmake.log")"; exit 1; }
  fi
  mkdir -p "$kit" &&
    cc -O2 -Iinclude bench/nccl_check.c "$build/libxtc_rt.a" -lm -ldl -lpthread -o "$kit/nccl_check" &&
    echo "$model" > "$kit/gpt.xtf" &&
    "$build/xtc" compile "$kit/gpt.xtf" --train "${target[@]}" -o "$kit/gpt_train.so" ||
    { echo "nccl_check.sh: cannot make the kit in $kit"; exit 1; }
  echo "kit: $kit (nccl_check, gpt_train.so for ${target[*]})"
  [ $dry = 1 ] || exit 0
fi

[ -x "$kit/nccl_check" ] && [ -f "$kit/gpt_train.so" ] ||
  { echo "nccl_check.sh: no kit in $kit: run bench/nccl_check.sh --prepare where xtc builds, and carry $kit"; exit 1; }
if [ $dry = 1 ]; then
  export XTC_NCCL=${XTC_NCCL:-$build/libfake_nccl.so}
elif [ -z "${XTC_NCCL:-}" ]; then
  for py in ${XTC_PYTHON:-} python3 /usr/bin/python3; do
    d=$("$py" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2> /dev/null) &&
      [ -f "$d/lib/libnccl.so.2" ] && { export XTC_NCCL=$d/lib/libnccl.so.2; break; }
  done
fi
echo "NCCL: ${XTC_NCCL:-libnccl.so.2, from the loader path}"
"$kit/nccl_check" "$kit/gpt_train.so" "${shape[@]}"
