# checks.sh: sourced by the shell test scripts (after setting $tmp, a scratch directory): the
# pass/fail counters, `refuse` for the commands that must fail cleanly, and `checks_done` for the
# summary line and the exit status. Each script keeps its own `check`, which differs in how it
# keeps the command's output.
pass=0
fail=0
refuse() { # refuse NAME EXPECTED COMMAND...: must fail (exit 1 or 2, no crash) saying EXPECTED
  local name=$1 want=$2; shift 2
  "$@" > "$tmp/out" 2>&1
  local rc=$?
  if [ $rc -ge 1 ] && [ $rc -le 2 ] && grep -q -- "$want" "$tmp/out"; then pass=$((pass + 1)); echo "ok   $name"
  else fail=$((fail + 1)); echo "FAIL $name (exit $rc, wanted '$want'):"; sed 's/^/    /' "$tmp/out"; fi
}
checks_done() { # checks_done WHAT: the summary; the status is the script's
  echo "$1: $pass passed, $fail failed"
  [ $fail -eq 0 ]
}
