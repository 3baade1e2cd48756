#!/usr/bin/env bash
# test_install.sh BUILD_DIR SOURCE_DIR: what `cmake --install` puts in a prefix is what a user
# builds against: bin/xtc, include/xtc.h, lib/libxtc.so (soname libxtc.so.MAJOR, exporting xtc_*
# only) and libxtc.a, lib/pkgconfig/xtc.pc and xtc-static.pc, share/xtc/{models,examples}.
# The examples compile with `cc X.c $(pkg-config --cflags --libs xtc)` (and --static, and
# xtc-static) and run: the installed xtc compiles the bundled tiny_gpt, train_loop trains it from
# fresh weights (the loss halves) and writes a checkpoint, predict reads it back, and kv_decode's
# cached decoding picks the tokens that recomputing the whole sequence picks.
set -u
build=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$src/tests/checks.sh"
check() { # check NAME COMMAND...: the command must succeed; its output is kept in $tmp/out
  local name=$1; shift
  "$@" > "$tmp/out" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then pass=$((pass + 1)); echo "ok   $name"
  else fail=$((fail + 1)); echo "FAIL $name (exit $rc):"; sed 's/^/    /' "$tmp/out" | head -20; fi
}
expect() { # expect NAME COMMAND...: a condition (no output kept)
  local name=$1; shift
  if "$@"; then pass=$((pass + 1)); echo "ok   $name"
  else fail=$((fail + 1)); echo "FAIL $name"; sed 's/^/    /' "$tmp/out" | head -20; fi
}

p=$tmp/prefix
version=$(sed -n 's/^#define XTC_VERSION "\(.*\)"$/\1/p' "$src/include/xtc.h")
check "cmake --install --prefix" cmake --install "$build" --prefix "$p"
for f in bin/xtc include/xtc.h lib/libxtc.a lib/pkgconfig/xtc.pc lib/pkgconfig/xtc-static.pc \
         share/xtc/models/tiny_gpt.xtf share/xtc/examples/predict.c share/xtc/examples/train_loop.c \
         share/xtc/examples/kv_decode.c; do
  [ -f "$p/$f" ] || { fail=$((fail + 1)); echo "FAIL $f installed"; }
done

# the shared library: libxtc.so -> libxtc.so.MAJOR (the soname) -> libxtc.so.VERSION
lib=$p/lib
expect "libxtc.so -> libxtc.so.${version%%.*}" [ "$(readlink "$lib/libxtc.so")" = "libxtc.so.${version%%.*}" ]
expect "libxtc.so.${version%%.*} -> libxtc.so.$version" [ "$(readlink "$lib/libxtc.so.${version%%.*}")" = "libxtc.so.$version" ]
readelf -d "$lib/libxtc.so.$version" > "$tmp/out" 2>&1
expect "its soname is libxtc.so.${version%%.*}" grep -q "(SONAME) *Library soname: \[libxtc.so.${version%%.*}\]" "$tmp/out"
nm -D --defined-only "$lib/libxtc.so" | awk 'NF == 3 {print $3}' > "$tmp/syms"
grep -v '^xtc_' "$tmp/syms" > "$tmp/out"
expect "libxtc.so exports xtc_* only" [ ! -s "$tmp/out" ]
expect "libxtc.so exports xtc_version and xtc_session_init_weights" \
  grep -qx 'xtc_version' "$tmp/syms" && grep -qx 'xtc_session_init_weights' "$tmp/syms"

# the command line, run from the prefix
xtc=$p/bin/xtc
check "xtc --version" "$xtc" --version
expect "it names the version, LLVM and the CUDA path" \
  grep -q "^xtc $version" "$tmp/out" && grep -q "^libxtc $version" "$tmp/out" &&
  grep -q "^LLVM [0-9]" "$tmp/out" && grep -q "^CUDA: " "$tmp/out"
check "xtc -V" "$xtc" -V
expect "the same" grep -q "^xtc $version" "$tmp/out"

# compiled as a user compiles, with cc; a sanitizer build's libraries need its compiler (whose
# sanitizer run time they were built for) and its -fsanitize
san=$(sed -n 's/^XTC_SANITIZE:STRING=//p' "$build/CMakeCache.txt" 2>/dev/null)
flags=${san:+-fsanitize=$san}
cc() { if [ -n "$san" ]; then "$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")" "$@"; else command cc "$@"; fi; }
export PKG_CONFIG_PATH=$lib/pkgconfig
check "pkg-config --modversion xtc" pkg-config --modversion xtc
expect "is $version" grep -qx "$version" "$tmp/out"
ex=$p/share/xtc/examples
w=$tmp/work
mkdir -p "$w"
cd "$w" || exit 1
for e in predict train_loop kv_decode; do
  check "cc $e.c \$(pkg-config --cflags --libs xtc)" cc $flags "$ex/$e.c" $(pkg-config --cflags --libs xtc) -o "$e"
done
# the library's version against the header's, linked --static (adds the libraries libxtc.a needs)
cat > version.c <<'C'
#include <stdio.h>
#include <string.h>
#include "xtc.h"
int main(void)
{
    printf("header %s, library %s\n", XTC_VERSION, xtc_version());
    return strcmp(XTC_VERSION, xtc_version()) != 0;
}
C
check "cc version.c \$(pkg-config --cflags --libs --static xtc)" cc $flags version.c $(pkg-config --cflags --libs --static xtc) -o version
check "xtc_version() is the header's" env LD_LIBRARY_PATH="$lib" ./version
# xtc-static: libxtc.a inside the program, which runs without libxtc.so
check "cc predict.c \$(pkg-config --cflags --libs xtc-static)" \
  cc $flags "$ex/predict.c" $(pkg-config --cflags --libs xtc-static) -o predict_static
readelf -d predict_static > "$tmp/out" 2>&1
expect "it does not need libxtc.so" eval '! grep -q "NEEDED.*libxtc" "$tmp/out"'
# the other way to find libxtc.so than LD_LIBRARY_PATH: a run path
check "cc kv_decode.c with -Wl,-rpath,\$(pkg-config --variable=libdir xtc)" \
  cc $flags "$ex/kv_decode.c" $(pkg-config --cflags --libs xtc) -Wl,-rpath,"$(pkg-config --variable=libdir xtc)" -o kv_decode_rpath

# the installed xtc compiles the installed model, in its three forms (the two that only run a
# few short calls at -O0: a tenth of the compile time)
models=$p/share/xtc/models
check "xtc compile --train tiny_gpt" "$xtc" compile --train "$models/tiny_gpt.xtf" -o train.so
check "xtc compile --kv-cache tiny_gpt" "$xtc" compile --kv-cache -O0 "$models/tiny_gpt.xtf" -o kv.so
check "xtc compile tiny_gpt" "$xtc" compile -O0 "$models/tiny_gpt.xtf" -o fwd.so

check "train_loop: 40 AdamW steps from fresh weights" env LD_LIBRARY_PATH="$lib" ./train_loop train.so ckpt.safetensors 40
cp "$tmp/out" train.out
first=$(sed -n 's/^loss \([0-9.]*\) -> \([0-9.]*\)$/\1/p' train.out)
last=$(sed -n 's/^loss \([0-9.]*\) -> \([0-9.]*\)$/\2/p' train.out)
expect "the loss halves ($first -> $last)" awk -v a="$first" -v b="$last" 'BEGIN { exit !(a > 4 && b > 0 && b < a / 2) }'
expect "a checkpoint at step 40" grep -q "^checkpoint ckpt.safetensors (step 40)$" train.out

check "predict reads the checkpoint into the forward module" env LD_LIBRARY_PATH="$lib" ./predict fwd.so ckpt.safetensors "the ca"
cp "$tmp/out" predict.out
# positions 0..5; after "the ca" (position 5, 'a' = 97) the trained model says 't' (116)
expect "one prediction per position, 't' after \"the ca\"" \
  eval '[ "$(grep -c "^ *[0-9]" predict.out)" -eq 6 ] && grep -qE "^ +5 +97 +116$" predict.out'
check "the same program with libxtc.a runs without LD_LIBRARY_PATH" env -u LD_LIBRARY_PATH ./predict_static fwd.so ckpt.safetensors "the ca"
expect "and prints the same" cmp -s "$tmp/out" predict.out

check "kv_decode: 24 tokens with the KV cache, checked by recomputing" \
  env LD_LIBRARY_PATH="$lib" ./kv_decode kv.so ckpt.safetensors "the cat" 24 fwd.so
expect "every token the same" grep -q "^recomputed: 24 of 24 tokens the same" "$tmp/out"
check "kv_decode linked with a run path, without LD_LIBRARY_PATH" \
  env -u LD_LIBRARY_PATH ./kv_decode_rpath kv.so ckpt.safetensors "the cat" 24 fwd.so
refuse "kv_decode refuses a module without caches" "has no cache inputs" \
  env LD_LIBRARY_PATH="$lib" ./kv_decode fwd.so ckpt.safetensors "the cat" 4
refuse "train_loop refuses a forward module" "not a training module" \
  env LD_LIBRARY_PATH="$lib" ./train_loop fwd.so x.safetensors

checks_done install
