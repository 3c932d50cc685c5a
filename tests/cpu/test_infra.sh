#!/usr/bin/env bash
# shellcheck disable=SC2016,SC2034 # conditions are single-quoted strings that check() evaluates
# test_infra.sh — the test machinery itself. tests/run: sums the programs' "#mt-counts" lines,
# counts a program without counts and one that fails without saying so as failed, kills a program
# that outlives MT_TEST_TIMEOUT together with what it started and counts it failed, refuses a
# limit that is not a number, and fails a run in which no test ran. make gputest: without a GPU it
# says so and fails before building anything; with one it runs the tests. The GPU's presence is
# faked through GPU_CHECK, so the result is the same on a machine that has one.
set -u
cd "$(dirname "$0")/../.." || exit 1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
passed=0 failed=0

# check LABEL CONDITION: one assertion, evaluated after the run it checks (single-quoted).
check() {
  local label=$1 condition=$2
  if eval "$condition"; then
    passed=$((passed + 1))
    echo "ok   $label"
  else
    failed=$((failed + 1))
    echo "FAIL $label: $condition"
    echo "     output: $(head -c 800 "$dir/out")"
  fi
}

# runner ARGS...: tests/run with its output in $dir/out, its status in $rc, its seconds in $took.
runner() {
  local t0=$SECONDS
  tests/run "$@" >"$dir/out" 2>&1
  rc=$?
  took=$((SECONDS - t0))
}

# gputest ARGS...: make gputest as a user would start it, not as a child of the make running this.
gputest() {
  env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make --no-print-directory gputest SAN="${MT_SAN:-0}" \
    "$@" >"$dir/out" 2>&1
  rc=$?
}

last() { tail -n 1 "$dir/out"; }

# gone PID: within 2 s, no such process or a zombie (killed, waiting for an init that may never
# reap it).
gone() {
  for _ in $(seq 20); do
    kill -0 "$1" 2>/dev/null || return 0
    case $(ps -o stat= -p "$1") in Z*) return 0 ;; esac
    sleep 0.1
  done
  return 1
}

runner 'echo "#mt-counts 2 0 1"' 'echo "#mt-counts 3 0 0"'
check "counts of two programs summed" \
  '[ "$(last)" = "tests: 5 passed, 0 failed, 1 skipped" ] && [ $rc -eq 0 ]'

runner 'echo "#mt-counts 1 0 0"' 'exit 3'
check "a program without counts fails" \
  'grep -qx "FAIL exit 3: exited 3 without reporting counts" "$dir/out" &&
   [ "$(last)" = "tests: 1 passed, 1 failed, 0 skipped" ] && [ $rc -ne 0 ]'

runner 'echo "#mt-counts 1 0 0"; exit 124'
check "exit 124 within the limit is a failure, not a timeout" \
  'grep -q "exited 124 after reporting no failure" "$dir/out" && ! grep -q "timed out" "$dir/out" &&
   [ "$(last)" = "tests: 1 passed, 1 failed, 0 skipped" ] && [ $rc -ne 0 ]'

MT_TEST_TIMEOUT=1 runner "sleep 60 & echo \$! >$dir/child; wait" 'echo "#mt-counts 1 0 0"'
check "a program past MT_TEST_TIMEOUT is killed and counted failed" \
  'grep -q "timed out after [0-9]* s (limit MT_TEST_TIMEOUT=1 s)" "$dir/out" &&
   [ "$(last)" = "tests: 1 passed, 1 failed, 0 skipped" ] && [ $rc -ne 0 ] && [ $took -lt 20 ]'
check "what the timed-out program started is killed too" 'gone "$(cat "$dir/child")"'

runner 'echo "#mt-counts 0 0 0"' 'echo "#mt-counts 0 0 0"'
check "a run in which no test ran fails" \
  'grep -q "FAIL tests/run: no test ran (2 programs)" "$dir/out" &&
   [ "$(last)" = "tests: 0 passed, 1 failed, 0 skipped" ] && [ $rc -ne 0 ]'

runner
check "a run of no program fails" \
  '[ "$(last)" = "tests: 0 passed, 1 failed, 0 skipped" ] && [ $rc -ne 0 ]'

MT_TEST_TIMEOUT=soon runner 'echo "#mt-counts 1 0 0"'
check "a limit that is not a number is refused" \
  'grep -q "MT_TEST_TIMEOUT=soon is not a whole number" "$dir/out" && [ $rc -eq 2 ]'

gputest GPU_CHECK=false
check "make gputest without a GPU says so and fails, building nothing" \
  'grep -q "no GPU found" "$dir/out" && grep -q "device machine" "$dir/out" && [ $rc -ne 0 ] &&
   ! grep -q "^tests:" "$dir/out" && ! grep -qE "(^| )(cc|nvcc) " "$dir/out"'

gputest GPU_CHECK=true GPU_TESTS= GPUTEST_PY=
check "make gputest with a GPU runs tests/run (which fails: no test given)" \
  '! grep -q "no GPU found" "$dir/out" && grep -q "no test ran" "$dir/out" &&
   grep -qx "tests: 0 passed, 1 failed, 0 skipped" "$dir/out" && [ $rc -ne 0 ]'

echo "#mt-counts $passed $failed 0"
[ "$failed" -eq 0 ]
