# tiny_setup.sh BUILD_DIR SOURCE_DIR: sourced (". tiny_setup.sh "$@"") by the script tests that
# train the tiny byte-level GPT (test_train.sh, test_mpi.sh, test_nccl.sh). Sets build, src and
# xtc; makes $tmp (removed on exit); ok/bad print a result line and count it (checks.sh's pass and
# fail); writes $tmp/tiny.xtf (one decoder layer of dim 16, 256 byte tokens, 32 positions) and
# $tmp/data.txt (the project's own C sources, the first 60 kB: not the README, whose prose and
# tables change from one change to the next, and with them how far the tiny model gets).
# tiny_compile OUT ARGS... compiles $tmp/tiny.xtf for training with ARGS (OUT an absolute path);
# when that fails the test says so and exits 1. It compiles from inside $tmp by the bare name: a
# module records its source's name, so the tests' modules of the same ARGS are the same bytes, and
# the module cache (XTC_MODULE_CACHE, set by .ci/run) compiles each once for all of them.
build=$1
src=$2
xtc=$build/xtc
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$src/tests/checks.sh" # the pass and fail counters
ok() {
  echo "ok   $1"
  pass=$((pass + 1))
}
bad() {
  echo "FAIL $1"
  fail=$((fail + 1))
}
cat > "$tmp/tiny.xtf" <<'EOF_TINY'
tiny = TransformerWrapper(num_tokens = 256, max_seq_len = 32,
    attn_layers = Decoder(dim = 16, depth = 1, heads = 2))
EOF_TINY
cat "$src"/cli/*.c "$src"/runtime/*.c | head -c 60000 > "$tmp/data.txt"
tiny_compile() {
  local out=$1
  shift
  if ! (cd "$tmp" && "$xtc" compile tiny.xtf --train "$@" -o "$out") 2> "$tmp/err"; then
    bad "xtc compile --train $*: $(cat "$tmp/err")"
    exit 1
  fi
}
