#!/usr/bin/env bash
# test_train.sh BUILD_DIR SOURCE_DIR: the training and sampling commands end to end on a tiny
# byte-level GPT:
#   - `xtc train` learns (the validation loss falls below the text's unigram entropy);
#   - a run stopped at step 1000 and resumed from its checkpoint gives the losses and the final
#     checkpoint (weights, optimizer state, run state) of the uninterrupted 2000-step run, bit for
#     bit (threads fixed);
#   - Ctrl-C (SIGINT) saves a checkpoint and exits 130; --resume continues from the next step;
#     a checkpoint that cannot be written (full disk, a directory in the way) is an error that
#     leaves the previous one intact;
#   - `xtc generate` greedy with the KV cache equals greedy by full recomputation (--no-cache),
#     from the .xtf and from a module compiled with --kv-cache; sampling is reproducible by seed;
#   - `xtc demo` (the README's main job) runs in miniature;
#   - models and data that cannot work are refused with a clear message.
set -u
# the tiny GPT, the text (the project's own C sources) and ok/bad
. "$(dirname "$0")/tiny_setup.sh" "$@"
tiny_compile "$tmp/tiny_train.so" -O1
common=(--data "$tmp/data.txt" --steps 2000 --batch 4 --seq 32 --threads 2 --val-every 500 --val-tokens 2048
  --seed 7 --quiet --lr 3e-3)
"$xtc" train "$tmp/tiny_train.so" "${common[@]}" --ckpt "$tmp/a.safetensors" > "$tmp/a.out" 2> "$tmp/a.err" ||
  bad "xtc train (2000 steps): $(cat "$tmp/a.err")"
"$xtc" train "$tmp/tiny_train.so" "${common[@]}" --ckpt "$tmp/b.safetensors" --stop-at 1000 > "$tmp/b1.out" \
  2> "$tmp/b1.err" || bad "xtc train --stop-at 1000: $(cat "$tmp/b1.err")"
"$xtc" train "$tmp/tiny_train.so" "${common[@]}" --ckpt "$tmp/b.safetensors" --resume "$tmp/b.safetensors" \
  > "$tmp/b2.out" 2> "$tmp/b2.err" || bad "xtc train --resume: $(cat "$tmp/b2.err")"

# learning: the final validation loss (bits/byte) is below the unigram entropy
read -r final unigram < <(sed -n 's/^done:.* = \([0-9.]*\) bits\/byte (unigram entropy \([0-9.]*\).*/\1 \2/p' "$tmp/a.out")
if [ -n "${final:-}" ] && awk -v f="$final" -v u="$unigram" 'BEGIN { exit !(f < u - 0.5) }'; then
  ok "training learns: validation $final bits/byte, unigram entropy $unigram"
else
  bad "training did not get below the unigram entropy:"
  cat "$tmp/a.out"
fi
# resuming: the same losses after step 1000 and the same final checkpoint
# (the lines without their last field, tokens/s)
grep '^step' "$tmp/a.out" | awk '$2 > 1000 { NF -= 2; print }' > "$tmp/a.steps"
grep '^step' "$tmp/b2.out" | awk '{ NF -= 2; print }' > "$tmp/b.steps"
if [ -s "$tmp/a.steps" ] && cmp -s "$tmp/a.steps" "$tmp/b.steps" && grep -q "resumed" "$tmp/b2.out"; then
  ok "resume: steps 1001-2000 give the same losses ($(wc -l < "$tmp/a.steps") validations)"
else
  bad "resume: the losses differ from the uninterrupted run:"
  diff "$tmp/a.steps" "$tmp/b.steps" | sed 's/^/    /'
fi
if cmp -s "$tmp/a.safetensors" "$tmp/b.safetensors"; then
  ok "resume: the final checkpoints are identical"
else
  bad "resume: the final checkpoints differ"
fi
at1000() { awk '$1 == "step" && $2 == 1000 { NF -= 2; print }' "$1"; }
[ -n "$(at1000 "$tmp/a.out")" ] && [ "$(at1000 "$tmp/b1.out")" = "$(at1000 "$tmp/a.out")" ] &&
  ok "stop-at: step 1000 matches the uninterrupted run" || bad "stop-at: step 1000 differs"

# Ctrl-C: SIGINT once a step is logged; exit 130 with a checkpoint of the last finished step,
# equal to the one --stop-at at that step writes, from which --resume carries on at the next step
long=(--data "$tmp/data.txt" --steps 100000 --batch 4 --seq 32 --threads 2 --val-tokens 2048 --seed 7 --lr 3e-3)
"$xtc" train "$tmp/tiny_train.so" "${long[@]}" --log-every 1 --ckpt "$tmp/c.safetensors" > "$tmp/c.out" 2> "$tmp/c.err" &
pid=$!
while kill -0 "$pid" 2> /dev/null && ! grep -q '^step ' "$tmp/c.err"; do sleep 0.05; done
kill -INT "$pid" 2> /dev/null
wait "$pid"
rc=$?
n=$(sed -n 's/^interrupted by SIGINT after step \([0-9]*\); continue with --resume .*c\.safetensors$/\1/p' "$tmp/c.out")
if [ "$rc" -eq 130 ] && [ -n "$n" ] && [ -s "$tmp/c.safetensors" ]; then
  ok "Ctrl-C: exit status 130 after step $n, checkpoint written"
else
  bad "Ctrl-C: exit status $rc, step '${n}': $(cat "$tmp/c.out" "$tmp/c.err" | tail -5)"
  n=1
fi
cp "$tmp/c.safetensors" "$tmp/c_at_n.safetensors"
"$xtc" train "$tmp/tiny_train.so" "${long[@]}" --quiet --stop-at "$n" --ckpt "$tmp/d.safetensors" > /dev/null 2>&1 &&
  cmp -s "$tmp/c.safetensors" "$tmp/d.safetensors" &&
  ok "Ctrl-C: the checkpoint equals the one of --stop-at $n" ||
  bad "Ctrl-C: the checkpoint differs from the one of --stop-at $n"
"$xtc" train "$tmp/tiny_train.so" "${long[@]}" --log-every 1 --resume "$tmp/c.safetensors" \
  --ckpt "$tmp/c.safetensors" --stop-at $((n + 2)) > "$tmp/c2.out" 2> "$tmp/c2.err" ||
  bad "Ctrl-C: --resume failed: $(cat "$tmp/c2.err")"
steps=$(sed -n 's/^step \([0-9]*\)\/100000 .*/\1/p' "$tmp/c2.err" | tr '\n' ' ')
if grep -q "resumed" "$tmp/c2.out" && [ "$steps" = "$((n + 1)) " ] && grep -q "^step *$((n + 2)) " "$tmp/c2.out"; then
  ok "Ctrl-C: --resume continues at step $((n + 1)) and stops after $((n + 2))"
else
  bad "Ctrl-C: --resume after step $n logged steps '$steps': $(cat "$tmp/c2.out")"
fi

# a checkpoint that cannot be written is an error and leaves the previous one intact: a full
# disk (a file size limit: write fails with EFBIG), a directory in the way (refused at the start); no
# temporary file stays behind
cp "$tmp/c.safetensors" "$tmp/c_prev.safetensors"
(trap '' XFSZ; ulimit -f 16; exec "$xtc" train "$tmp/tiny_train.so" "${long[@]}" --quiet --resume "$tmp/c_at_n.safetensors" \
  --ckpt "$tmp/c.safetensors" --stop-at $((n + 1))) > "$tmp/f.out" 2> "$tmp/f.err"
rc=$?
if [ "$rc" -ne 0 ] && grep -q "c.safetensors: write failed: File too large" "$tmp/f.err" &&
  cmp -s "$tmp/c.safetensors" "$tmp/c_prev.safetensors" && ! ls "$tmp"/.c.safetensors.xtc-tmp.* > /dev/null 2>&1; then
  ok "full disk: $(head -1 "$tmp/f.err" | sed 's/^xtc train: //'); the previous checkpoint is intact"
else
  bad "full disk: status $rc, $(cat "$tmp/f.err"); $(ls "$tmp")"
fi
mkdir "$tmp/ckdir"
"$xtc" train "$tmp/tiny_train.so" "${long[@]}" --quiet --stop-at 1 --ckpt "$tmp/ckdir" > "$tmp/f.out" 2> "$tmp/f.err"
rc=$?
if [ "$rc" -ne 0 ] && grep -q "ckdir is a directory" "$tmp/f.err" && [ -d "$tmp/ckdir" ] &&
  ! ls "$tmp"/.ckdir.xtc-tmp.* > /dev/null 2>&1; then
  ok "directory as checkpoint: $(head -1 "$tmp/f.err" | sed 's/^xtc train: //')"
else
  bad "directory as checkpoint: status $rc, $(cat "$tmp/f.err")"
fi

# generation: KV cache vs recomputation, greedy, within max_seq_len (9 + 20 < 32), through
# compiled modules (the demo below compiles from .xtf)
"$xtc" compile "$tmp/tiny.xtf" --kv-cache -O1 -o "$tmp/tiny_kv.so" 2> "$tmp/err" || bad "compile --kv-cache: $(cat "$tmp/err")"
"$xtc" compile "$tmp/tiny.xtf" -O1 -o "$tmp/tiny_fwd.so" 2> "$tmp/err" || bad "compile: $(cat "$tmp/err")"
gen=(--weights "$tmp/a.safetensors" --prompt "int main(" --tokens 20 --temperature 0 --ids --quiet --threads 2)
kv=$("$xtc" generate "$tmp/tiny_kv.so" "${gen[@]}" 2> "$tmp/g1.err") || bad "generate: $(cat "$tmp/g1.err")"
full=$("$xtc" generate "$tmp/tiny_fwd.so" "${gen[@]}" --no-cache 2> "$tmp/g2.err") || bad "generate --no-cache: $(cat "$tmp/g2.err")"
if [ -n "$kv" ] && [ "$kv" = "$full" ] && [ "$(echo "$kv" | wc -w)" -eq 20 ]; then
  ok "generate: greedy with the KV cache equals full recomputation ($kv)"
else
  bad "generate: KV cache '$kv' vs recomputation '$full'"
fi
# a module of the wrong form is recompiled from the source it carries
kv2=$("$xtc" generate "$tmp/tiny_train.so" "${gen[@]}" 2> "$tmp/g3.err") || bad "generate (training .so): $(cat "$tmp/g3.err")"
[ "$kv2" = "$full" ] && ok "generate: from a training module (recompiled) the same tokens" ||
  bad "generate (training .so): '$kv2' vs '$full'"
s1=$("$xtc" generate "$tmp/tiny_kv.so" --weights "$tmp/a.safetensors" --prompt "int" --tokens 40 --temperature 1 --top-k 5 \
  --seed 3 --quiet 2>&1)
s2=$("$xtc" generate "$tmp/tiny_kv.so" --weights "$tmp/a.safetensors" --prompt "int" --tokens 40 --temperature 1 --top-k 5 \
  --seed 3 --quiet 2>&1)
[ -n "$s1" ] && [ "$s1" = "$s2" ] && ok "generate: sampling is reproducible by seed" || bad "sampling: '$s1' vs '$s2'"

# the main job (xtc demo) in miniature: compile the bundled tiny GPT, train, sample
if "$xtc" demo --steps 6 --tokens 12 --threads 2 > "$tmp/demo.out" 2> "$tmp/demo.err" &&
  grep -q "^done: 6 steps" "$tmp/demo.out" && grep -q "^sample" "$tmp/demo.out"; then
  ok "xtc demo: trains the bundled tiny GPT and samples from it"
else
  bad "xtc demo:"
  sed 's/^/    /' "$tmp/demo.out" "$tmp/demo.err"
fi

# refusals, each with its message
expect_fail() { # NAME PATTERN COMMAND...
  local name=$1 pattern=$2
  shift 2
  if "$@" > "$tmp/r.out" 2> "$tmp/r.err"; then
    bad "$name: succeeded"
  elif grep -q -- "$pattern" "$tmp/r.err"; then
    ok "$name: $(grep -m1 -- "$pattern" "$tmp/r.err" | sed 's/^xtc [a-z]*: //')"
  else
    bad "$name: no '$pattern' in: $(cat "$tmp/r.err")"
  fi
}
cat > "$tmp/small.xtf" <<'EOF'
small = TransformerWrapper(num_tokens = 100, max_seq_len = 32, attn_layers = Decoder(dim = 16, depth = 1))
EOF
cat > "$tmp/enc.xtf" <<'EOF'
enc = TransformerWrapper(num_tokens = 256, max_seq_len = 32, attn_layers = Encoder(dim = 16, depth = 1))
EOF
head -c 20 "$tmp/data.txt" > "$tmp/short.txt"
expect_fail "train refuses num_tokens < 256" "num_tokens = 100" "$xtc" train "$tmp/small.xtf" --data "$tmp/data.txt"
expect_fail "generate refuses num_tokens < 256" "num_tokens = 100" "$xtc" generate "$tmp/small.xtf" \
  --weights "$tmp/a.safetensors"
expect_fail "train refuses an Encoder" "causal" "$xtc" train "$tmp/enc.xtf" --data "$tmp/data.txt"
expect_fail "train refuses too little data" "too few" "$xtc" train "$tmp/tiny_train.so" --data "$tmp/short.txt"
expect_fail "train needs --data" "usage" "$xtc" train "$tmp/tiny.xtf"
head -c 30000 "$tmp/data.txt" > "$tmp/half.txt"
expect_fail "resume refuses other data" "other data" "$xtc" train "$tmp/tiny_train.so" --data "$tmp/half.txt" \
  --resume "$tmp/a.safetensors"
"$xtc" compile "$tmp/small.xtf" -O0 -o "$tmp/small.so" && "$xtc" init "$tmp/small.so" -o "$tmp/small.safetensors" ||
  bad "compile and init of small.xtf"
expect_fail "generate refuses the weights of another model" "the model expects" "$xtc" generate "$tmp/tiny_kv.so" \
  --weights "$tmp/small.safetensors"
expect_fail "generate refuses a file that is not safetensors" "tiny_train.so" "$xtc" generate "$tmp/tiny_kv.so" \
  --weights "$tmp/tiny_train.so"
expect_fail "bad option values" "--temperature: expected a number" "$xtc" generate "$tmp/tiny_kv.so" --weights x --temperature -1

echo "train and generate: $fail failed"
[ $fail -eq 0 ]
