#!/usr/bin/env bash
# test_symbols.sh BUILD_DIR SOURCE_DIR: the libraries a program links export the xtc_* API only
# libxtc.a (one object, a partial link of the runtime with every other symbol
# made local), libxtc.so (a version script) and examples/predict (linked with libxtc.a) define no
# global symbol of the runtime's internals (rt_*, json_*, ...); a program with its own
# json_object_get, json_parse and rt_pool_new (as one linking json-c would have) links with
# libxtc.a and both its functions and the runtime work. It failed to link before ("multiple
# definition of `json_object_get'").
set -u
build=$1
src=$2
xtc=$build/xtc
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$src/tests/checks.sh"

check() { # check NAME COMMAND...: the command must succeed (within 300 s)
  local name=$1; shift
  timeout 300 "$@" > "$tmp/out" 2>&1
  local rc=$?
  if [ $rc -eq 0 ]; then pass=$((pass + 1)); echo "ok   $name"
  else fail=$((fail + 1)); echo "FAIL $name (exit $rc):"; sed 's/^/    /' "$tmp/out" | head -20; fi
}
only_xtc() { # only_xtc NAME FILE: lists the symbols of $FILE (nm output on stdin) not xtc_*
  local name=$1
  grep -v -E '^(xtc_|_|main$|data_start$|[a-z_]+@GLIBC)' > "$tmp/extra"
  if [ ! -s "$tmp/extra" ]; then pass=$((pass + 1)); echo "ok   $name"
  else fail=$((fail + 1)); echo "FAIL $name: global symbols without the xtc_ prefix:"; head -20 "$tmp/extra" | sed 's/^/    /'; fi
}

nm -g --defined-only "$build/libxtc.a" | awk 'NF == 3 {print $3}' > "$tmp/a.syms"
grep -q '^xtc_module_load$' "$tmp/a.syms" && grep -q '^xtc_session_run$' "$tmp/a.syms" &&
  pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL libxtc.a defines the API"; }
only_xtc "libxtc.a exports xtc_* only" < "$tmp/a.syms"
nm -D --defined-only "$build/libxtc.so" | awk 'NF == 3 {print $3}' > "$tmp/so.syms"
grep -q '^xtc_session_new$' "$tmp/so.syms" && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL libxtc.so exports the API"; }
only_xtc "libxtc.so exports xtc_* only" < "$tmp/so.syms"
# a sanitizer's run-time library defines malloc and friends in every program: only the libraries then
if ! nm "$build/predict" | grep -q ' __asan_init\| __tsan_init\| __ubsan_handle'; then
  nm -g --defined-only "$build/predict" | awk 'NF == 3 {print $3}' | only_xtc "examples/predict defines xtc_* only"
fi

# a program that defines names the runtime uses inside
cat > "$tmp/clash.c" <<'C'
#include "xtc.h"
#include <stdio.h>
/* json-c's, and two more of the runtime's internal names */
int json_object_get(int x) { return x + 1; }
int json_parse(void) { return 7; }
int rt_pool_new(void) { return 9; }
int main(int argc, char **argv)
{
    XtcModule *m = NULL;
    XtcSession *s = NULL;
    if (argc < 3 || xtc_module_load(argv[1], &m)) {
        fprintf(stderr, "%s\n", xtc_module_error(m));
        return 1;
    }
    /* the weights' header is JSON: read by the runtime's own parser */
    if (xtc_session_new(m, &(XtcSessionOptions){.threads = 2}, &s) || xtc_session_load_weights(s, argv[2])) {
        fprintf(stderr, "%s\n", xtc_session_error(s));
        return 1;
    }
    int64_t tokens[4] = {104, 101, 108, 108}, shape[2] = {1, 4};
    XtcTensor logits;
    if (xtc_session_set_input(s, "tokens", XTC_I64, 2, shape, tokens) || xtc_session_run(s) ||
        xtc_session_get_output(s, "logits", &logits)) {
        fprintf(stderr, "%s\n", xtc_session_error(s));
        return 1;
    }
    printf("%s logits [%lld, %lld, %lld]; own functions %d %d %d\n", xtc_module_name(m), (long long)logits.shape[0],
           (long long)logits.shape[1], (long long)logits.shape[2], json_object_get(1), json_parse(), rt_pool_new());
    xtc_session_free(s);
    xtc_module_free(m);
    return 0;
}
C
san=$(sed -n 's/^XTC_SANITIZE:STRING=//p' "$build/CMakeCache.txt" 2>/dev/null)
flags=${san:+-fsanitize=$san}
check "a program defining json_object_get links with libxtc.a" \
  cc -std=c11 $flags -I"$src/include" "$tmp/clash.c" "$build/libxtc.a" -lm -ldl -lpthread -o "$tmp/clash"
check "its module" "$xtc" compile "$src/models/tiny_gpt.xtf" -o "$tmp/m.so"
check "its weights" "$xtc" init "$tmp/m.so" -o "$tmp/w.safetensors"
check "the runtime and the program's functions both work" "$tmp/clash" "$tmp/m.so" "$tmp/w.safetensors"
grep -q 'tiny_gpt logits \[1, 4, 256\]; own functions 2 7 9' "$tmp/out" && pass=$((pass + 1)) ||
  { fail=$((fail + 1)); echo "FAIL the program's output:"; sed 's/^/    /' "$tmp/out"; }
# libxtc.so too
check "the same program links with libxtc.so" \
  cc -std=c11 $flags -I"$src/include" "$tmp/clash.c" -L"$build" -lxtc -lm -ldl -lpthread -o "$tmp/clash_so"
check "and runs" env LD_LIBRARY_PATH="$build" "$tmp/clash_so" "$tmp/m.so" "$tmp/w.safetensors"
grep -q 'own functions 2 7 9' "$tmp/out" && pass=$((pass + 1)) || { fail=$((fail + 1)); echo "FAIL libxtc.so output"; }

checks_done symbols
