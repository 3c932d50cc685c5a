#!/usr/bin/env bash
# lab/ncu_pick.sh — one launch of a kernel, picked by its duration and grid among all of a run's
# launches, under Nsight Compute: for kernels that run many times in a bench (graph replays,
# warm-up, several columns) where the launch of interest is one kind among them (lab/NOTES.md, "The
# requantization after a sync": the refresh after a sync among the refreshes that find nothing).
#
#   lab/ncu_pick.sh REGEX MIN_US GRID -- COMMAND...     (device machine)
#
# First lists every launch of the kernels whose name matches REGEX with its duration and grid
# (one metric a launch), then profiles the first one that ran at least MIN_US µs on a grid of GRID
# CTAs ("32" for (32, 1, 1); "any" for any grid) with the full section set and writes its
# per-instruction counts (SASS, stall samples) as CSV. Clocks are left alone (--clock-control
# none), as in tests/gpu/session.sh. Output in $OUT (or build/ncu-pick): launches.csv (and
# launches.err), pick.txt (the chosen launch: its index among the matches, µs, grid),
# report.ncu-rep (and report.log, COMMAND's output), report.txt, sass.csv. COMMAND must run the
# same launches in the same order both times (bench_moe and bench_kernels do).
set -u
if [ $# -lt 5 ] || [ "$4" != "--" ]; then
  echo "usage: lab/ncu_pick.sh REGEX MIN_US GRID -- COMMAND..." >&2
  exit 2
fi
regex=$1 min_us=$2 grid=$3
shift 4
out=${OUT:-build/ncu-pick}
mkdir -p "$out"

ncu --csv --clock-control none --metrics gpu__time_duration.sum --kernel-name "regex:$regex" \
  "$@" >"$out/launches.csv" 2>"$out/launches.err" ||
  { echo "ncu_pick: listing failed (launches.err)" >&2; exit 1; }

# the CSV's rows start with a quote; ncu scales the unit per row
python3 - "$out/launches.csv" "$min_us" "$grid" >"$out/pick.txt" <<'EOF' || exit 1
import csv, sys
rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
if len(rows) < 2:
    sys.exit("ncu_pick: no launch matched")
head, rows = rows[0], rows[1:]
col = {name: head.index(name) for name in ("ID", "Grid Size", "Metric Value", "Metric Unit")}
scale = {"nsecond": 1e-3, "usecond": 1, "msecond": 1e3}
want = None if sys.argv[3] == "any" else "(%s, 1, 1)" % sys.argv[3]
for r in rows:
    us = float(r[col["Metric Value"]].replace(",", "")) * scale.get(r[col["Metric Unit"]], 1)
    if us >= float(sys.argv[2]) and (want is None or r[col["Grid Size"]] == want):
        print(r[col["ID"]], "%.1f" % us, r[col["Grid Size"]])
        break
else:
    sys.exit("ncu_pick: no launch of at least %s us on grid %s among %d"
             % (sys.argv[2], sys.argv[3], len(rows)))
EOF
read -r id us g <"$out/pick.txt"
echo "ncu_pick: launch $id of the matches, $us us, grid $g"

ncu --clock-control none --kernel-name "regex:$regex" --launch-skip "$id" --launch-count 1 \
  --set full --import-source no -o "$out/report" -f "$@" >"$out/report.log" 2>&1 ||
  { echo "ncu_pick: profile failed" >&2; exit 1; }
ncu -i "$out/report.ncu-rep" >"$out/report.txt" 2>&1
ncu -i "$out/report.ncu-rep" --page source --csv --print-source sass >"$out/sass.csv" 2>&1
echo "ncu_pick: $out/report.txt, $out/sass.csv"
