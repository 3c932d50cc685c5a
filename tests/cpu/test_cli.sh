#!/usr/bin/env bash
# shellcheck disable=SC2016,SC2034 # conditions are single-quoted strings that check() evaluates
# test_cli.sh — build/minite spec list|show|check and env: outputs, exit codes, and where each
# goes (results on stdout, errors on stderr). Runs $MT_BUILD/minite (default build/minite) on
# fixtures written into a temporary directory.
set -u
minite="${MT_BUILD:-build}/minite"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
passed=0 failed=0

# check LABEL CONDITION: one assertion. The condition is a string evaluated here, after the run
# it checks, so it is written in single quotes and its variables expand late.
check() {
  local label=$1 condition=$2
  if eval "$condition"; then
    passed=$((passed + 1))
    echo "ok   $label"
  else
    failed=$((failed + 1))
    echo "FAIL $label: $condition"
    echo "     stdout: $(head -c 600 "$dir/out")"
    echo "     stderr: $(head -c 600 "$dir/err")"
  fi
}

# run ARGS...: runs minite, leaving stdout, stderr and the exit status in $dir/out, $dir/err, $rc.
run() {
  "$minite" "$@" >"$dir/out" 2>"$dir/err"
  rc=$?
}

if [ ! -x "$minite" ]; then
  echo "FAIL $minite not built"
  echo "#mt-counts 0 1 0"
  exit 1
fi

# --- spec list
run spec list
check "list exits 0" '[ $rc -eq 0 ] && [ ! -s "$dir/err" ]'
check "list has three lines" '[ "$(wc -l <"$dir/out")" -eq 3 ]'
for name in bf16 nvfp4-row nvfp4-tensor; do
  check "list names $name with a description" 'grep -Eq "^$name +[A-Z].{10,}" "$dir/out"'
done

# --- spec show of the built-ins
run spec show nvfp4-row
check "show nvfp4-row exits 0" '[ $rc -eq 0 ] && [ ! -s "$dir/err" ]'
check "show starts with the name" '[ "$(head -n 1 "$dir/out")" = "# name: nvfp4-row" ]'
check "show ends with the fingerprint" \
  'tail -n 1 "$dir/out" | grep -Eqx "fingerprint: [0-9a-f]{16}"'
order="format,element,block,block_scale,act_scale,weight_scale,weight_block,rounding,accumulate,"
order+="backward,fingerprint:,"
check "show holds the canonical knobs in order" \
  '[ "$(sed -n "2,12p" "$dir/out" | cut -d" " -f1 | tr "\n" ,)" = "$order" ]'
check "show of a built-in holds no weight_cache" '! grep -q weight_cache "$dir/out"'
check "nvfp4-row has per-row activation scales" 'grep -qx "act_scale = row" "$dir/out"'
fp_row=$(tail -n 1 "$dir/out")
run spec show nvfp4-tensor
check "nvfp4-tensor has per-tensor activation scales" 'grep -qx "act_scale = tensor" "$dir/out"'
check "nvfp4-row and nvfp4-tensor differ in fingerprint" \
  '[ "$(tail -n 1 "$dir/out")" != "$fp_row" ]'
run spec show bf16
check "show bf16 is format = bf16 alone" \
  '[ "$(head -n 2 "$dir/out" | tr "\n" ,)" = "# name: bf16,format = bf16," ] &&
   [ "$(wc -l <"$dir/out")" -eq 3 ]'

# --- spec show of a file: the canonical text re-parses to the same fingerprint
cat >"$dir/mine.spec" <<'EOF'
# my spec, written untidily
name=mine
weight_cache = frozen   # sampler
format   =   nvfp4
element = e2m1
block = 16
block_scale = e4m3
act_scale = row
weight_scale = tensor
weight_block = 16x16
rounding = rne
accumulate = fp32
backward = bf16
route 2048x768
route   1536x2048
EOF
run spec show "$dir/mine.spec"
check "show of a file exits 0" '[ $rc -eq 0 ]'
check "show of a file with a weight_cache line warns that it is ignored, with its line" \
  'grep -q "^$dir/mine.spec:3: warning: weight_cache .*MINITE_WEIGHT_CACHE.*ignored" "$dir/err" &&
   [ "$(wc -l <"$dir/err")" -eq 1 ]'
check "show of a file leaves weight_cache out of the canonical text" \
  '! grep -q weight_cache "$dir/out"'
check "show of a file names it" '[ "$(head -n 1 "$dir/out")" = "# name: mine" ]'
check "show sorts routes" \
  '[ "$(grep "^route" "$dir/out" | tr "\n" ,)" = "route 1536x2048,route 2048x768," ]'
fp_mine=$(tail -n 1 "$dir/out" | cut -d" " -f2)
grep -v '^fingerprint' "$dir/out" >"$dir/canonical.spec"
run spec show "$dir/canonical.spec"
check "canonical text re-parses to the same fingerprint" \
  '[ "$(tail -n 1 "$dir/out")" = "fingerprint: $fp_mine" ]'
check "a file without a name shows (none)" '[ "$(head -n 1 "$dir/out")" = "# name: (none)" ]'

# --- --route adds routes as MINITE_ROUTE does
run spec show bf16 --route "1536x2048, 2048x768"
check "show --route adds routes" '[ $rc -eq 0 ] && [ "$(grep -c "^route" "$dir/out")" -eq 2 ]'
run spec show bf16 --route "1536x"
check "show --route with a bad item exits 2" '[ $rc -eq 2 ] && grep -q "\"1536x\"" "$dir/err"'

# --- spec check
run spec check "$dir/mine.spec"
check "check of a good file exits 0, warning only of its weight_cache line" \
  '[ $rc -eq 0 ] && grep -q "^$dir/mine.spec:3: warning: weight_cache" "$dir/err" &&
   [ "$(wc -l <"$dir/err")" -eq 1 ]'
check "check prints ok and the fingerprint" \
  '[ "$(cat "$dir/out")" = "$dir/mine.spec: ok (fingerprint $fp_mine)" ]'

printf 'format = nvfp4\r\nact_scal = row\r\nact_scale = rows\r\n' >"$dir/bad.spec"
run spec check "$dir/bad.spec"
check "check of a bad file exits 2" '[ $rc -eq 2 ] && [ ! -s "$dir/out" ]'
check "bad file: unknown knob on line 2" \
  'grep -q "^$dir/bad.spec:2: unknown knob \"act_scal\"" "$dir/err"'
check "bad file: bad value on line 3" \
  'grep -q "^$dir/bad.spec:3: act_scale: bad value \"rows\" (expected row or tensor)" "$dir/err"'
check "bad file: missing knob without a line number" \
  'grep -q "^$dir/bad.spec: missing required knob \"weight_block\"" "$dir/err"'

: >"$dir/empty.spec"
run spec check "$dir/empty.spec"
check "empty file exits 2" '[ $rc -eq 2 ] && grep -q "^$dir/empty.spec: empty spec" "$dir/err"'

head -c 3000 /dev/urandom >"$dir/garbage.spec"
run spec check "$dir/garbage.spec"
check "garbage exits 2 without crashing" '[ $rc -eq 2 ] && [ -s "$dir/err" ]'

run spec check "$dir/missing.spec"
check "missing file exits 2" \
  '[ $rc -eq 2 ] && grep -q "^$dir/missing.spec: file not found: $dir/missing.spec" "$dir/err"'

run spec check "$dir/mine.spec" "$dir/bad.spec"
check "check of several files: 2 when any is bad" \
  '[ $rc -eq 2 ] && grep -q ": ok" "$dir/out" && grep -q "bad.spec:2:" "$dir/err"'

run spec show no-such-spec
check "show of an unknown name exits 2 and lists the built-ins" \
  '[ $rc -eq 2 ] && grep -q "nvfp4-row" "$dir/err" && [ ! -s "$dir/out" ]'

# --- env: every variable of base/params.def, in its order, with its value and where it came from
# run_env VAR=VALUE...: minite env with only those MINITE_* variables set.
run_env() {
  (
    for v in $(compgen -e | grep '^MINITE_'); do unset "$v"; done
    env "$@" "$minite" env >"$dir/out" 2>"$dir/err"
  )
  rc=$?
}
declared=$(grep -o '^MT_PARAM_[A-Z]*(MINITE_[A-Z_]*' base/params.def | sed 's/.*(//' | tr '\n' ,)
run_env
check "env exits 0" '[ $rc -eq 0 ] && [ ! -s "$dir/err" ]'
check "env lists every declared variable in order" \
  '[ "$(tail -n +2 "$dir/out" | cut -d" " -f1 | tr "\n" ,)" = "$declared" ]'
check "env: all from the default when none is set" \
  '[ "$(tail -n +2 "$dir/out" | awk "{print \$NF}" | sort -u)" = default ]'
check "env shows defaults" \
  'grep -Eqx "MINITE_SHADOW +1/64 +default" "$dir/out" &&
   grep -Eqx "MINITE_CAPTURE +graph +default" "$dir/out"'
run_env MINITE_SHADOW=1/8 MINITE_LOG_LEVEL=info MINITE_CACHE_MB=8192 MINITE_ROLE=learner
check "env: set values come from the environment" \
  '[ $rc -eq 0 ] && grep -Eqx "MINITE_SHADOW +1/8 +environment" "$dir/out" &&
   grep -Eqx "MINITE_LOG_LEVEL +INFO +environment" "$dir/out" &&
   grep -Eqx "MINITE_ROLE +learner +environment" "$dir/out"'
check "env: a value equal to the default still comes from the environment" \
  'grep -Eqx "MINITE_CACHE_MB +8192 +environment" "$dir/out"'
run_env MINITE_CAPTURE=sometimes
check "env: an invalid value exits 2, shows the default and the accepted values" \
  '[ $rc -eq 2 ] && grep -Eq "^MINITE_CAPTURE +graph +default: invalid value .sometimes. for MINITE_CAPTURE: use one of off, graph; using the default graph$" "$dir/out"'
run env extra
check "env takes no arguments" '[ $rc -eq 2 ] && grep -q "^usage: minite" "$dir/err"'

# --- usage
run --help
check "--help exits 0 with the usage on stdout" \
  '[ $rc -eq 0 ] && grep -q "usage: minite spec list" "$dir/out" &&
   grep -q "minite env" "$dir/out"'
for args in "" "spec" "spec frob" "frob" "spec list extra" "spec show" "spec check" \
  "spec show a b"; do
  # shellcheck disable=SC2086
  run $args
  check "usage error \"$args\" exits 2 with the usage on stderr" \
    '[ $rc -eq 2 ] && grep -q "^usage: minite" "$dir/err" && [ ! -s "$dir/out" ]'
done

echo "#mt-counts $passed $failed 0"
[ "$failed" -eq 0 ]
