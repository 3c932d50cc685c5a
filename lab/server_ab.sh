#!/usr/bin/env bash
# lab/server_ab.sh — demo/demo_server.py under several shim settings, each in PROCS processes
# taken in turn (setting 1, 2, ..., then 1, 2, ... again): the served throughput moves by up to
# ~40% from one process to the next (lab/NOTES.md, "The server from one process to the next"), so
# one process a setting compares nothing.
#
#   lab/server_ab.sh NAME[:VAR=VALUE,...] ...      (device machine; after make)
#
# NAME "none" runs without the shim; any other name runs under build/libminite.so with nvfp4-row,
# both Qwen3 routes, frozen-sampled weights, role sampler, statistics into $OUT/NAME-P-stats.jsonl
# (kept: its start and summary records) and the default pool of slots (make run's samplers have
# 2048), then its VAR=VALUE pairs; a pair "-VAR" unsets VAR ("-MINITE_STATS": no statistics).
# SERVER_ARGS is passed to every run (default "--requests 64 --layers 8 --new-tokens 16:128");
# PROCS processes a setting (default 3). Prints a line a process (generated tok/s median of its
# rounds, min-max, time to first token, the GPU's busy share in its profiled window) and, at the
# end, a line a setting: the median of its processes' medians and their range. Each process's
# output: $OUT/NAME-P.log (its summary the last line) and NAME-P.err.
set -u
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-build/server-ab}
mkdir -p "$out"
args=${SERVER_ARGS:---requests 64 --layers 8 --new-tokens 16:128}
lib=$PWD/build/libminite.so

run_one() { # setting, process number
  local setting=$1 p=$2 name=${1%%:*} envs=() unset=() extra=() e i
  if [ "$name" != none ]; then
    # shellcheck disable=SC2054 # the comma is MINITE_ROUTE's
    envs=(LD_PRELOAD="$lib" MINITE_SPEC=nvfp4-row MINITE_ROUTE=1536x2048,2048x768
          MINITE_ROLE=sampler MINITE_WEIGHT_CACHE=frozen-sampled
          MINITE_STATS="$out/$name-$p-stats.jsonl")
    [ "$setting" != "$name" ] && IFS=, read -r -a extra <<<"${setting#*:}"
    for e in "${extra[@]}"; do
      case $e in
        -*) # dropped from the defaults too
          unset+=(-u "${e#-}")
          for i in "${!envs[@]}"; do [ "${envs[i]%%=*}" = "${e#-}" ] && unset 'envs[i]'; done ;;
        *) envs+=("$e") ;;
      esac
    done
  fi
  # shellcheck disable=SC2086 # SERVER_ARGS: several words
  env "${unset[@]}" "${envs[@]}" python3 demo/demo_server.py --out "$out/$name-$p.jsonl" $args \
      >"$out/$name-$p.log" 2>"$out/$name-$p.err"
  local rc=$? stats=$out/$name-$p-stats.jsonl
  # its start and summary records only: the digests of a served run are tens of MB
  [ -f "$stats" ] && grep -E '"event": "(start|summary)"' "$stats" >"$stats.head" &&
    mv "$stats.head" "$stats"
  return $rc
}

for p in $(seq "${PROCS:-3}"); do
  for setting in "$@"; do
    t0=$SECONDS
    run_one "$setting" "$p"
    echo "${setting%%:*} $p $? $((SECONDS - t0))"
  done
done | python3 -c '
import json, statistics, sys
out, per = sys.argv[1], {}
for line in sys.stdin:
    name, p, rc, secs = line.split()
    try:
        d = json.loads(open(f"{out}/{name}-{p}.log").read().strip().splitlines()[-1])
        g = d["generated_tokens_per_s"]
    except (OSError, ValueError, KeyError, IndexError) as e:  # the .err says why
        print(f"{name} #{p}: exit {rc}, no summary ({e}), {secs} s", flush=True)
        continue
    med, lo, hi, ttft = g["median"], g["min"], g["max"], d["ttft_mean_ms"]["median"]
    per.setdefault(name, []).append(med)
    share = (d.get("gpu_busy") or {}).get("share")
    busy = f", GPU busy {100 * share:.0f}%" if share is not None else ""
    print(f"{name} #{p}: {med:.1f} tok/s ({lo:.1f}-{hi:.1f}), ttft {ttft:.0f} ms{busy}, {secs} s",
          flush=True)
for name, v in per.items():
    print(f"{name}: {statistics.median(v):.1f} tok/s, processes {min(v):.1f}-{max(v):.1f} "
          f"({len(v)})")
' "$out"
