#!/usr/bin/env bash
# lab/gpu_ab.sh — compare kernel variants against the working tree in one device call: each built
# beside the others, their benchmarks run interleaved, one table of the GEMM's or the layer's µs.
#
#   lab/gpu_ab.sh prepare NAME REF   (here, with git) ab/NAME/ gets the files REF changed
#                                    since it left HEAD's history, as REF has them (rebase REF
#                                    on HEAD first; deleted files are not supported)
#   lab/gpu_ab.sh run NAME...        (device machine) builds the tree as "main" and each ab/NAME
#                                    (the tree with ab/NAME's files over it) in build dirs of its
#                                    own, then runs bench_kernels on each in turn, AB_REPEATS
#                                    times (default 2), and prints per benchmark row (M <=
#                                    AB_MAX_M, default 1024) the GEMM's µs for each, one column a
#                                    variant (the median of the repeats; of two, the lower); with
#                                    AB_BENCH=moe bench_moe instead (AB_MOE_ARGS passed on, e.g.
#                                    "--only qwen3"), per geometry and T the layer's µs (the
#                                    grouped engine: activation quantization and GEMMs) alone,
#                                    served under frozen-sampled and served after a weight sync
#   lab/gpu_ab.sh table NAME...      the table again from $OUT's logs
#
# ab/ must travel to the device: it is untracked, so leave it out of .gitignore or name it in the
# device tool's carry. AB_PROBES="floor ..." builds lab/probe_P.cu in every tree, main's too
# (the probes include the kernels, so each runs that tree's kernel: ~20 s to build, seconds to run).
# AB_TESTS=1 then runs test_kernels on each variant (~80 s each; main's own run is make gputest's;
# with AB_BENCH=moe test_grouped, ~60 s each), AB_TESTS=all on main too. Logs go to $OUT (or
# build/gpu-ab): build-NAME.log, bench-NAME-i.log, probe-P-NAME.log, test_kernels-NAME.log
# (test_grouped-NAME.log), ab.txt. Repeats of A/B runs made this way agreed within 0.05 µs
# (lab/NOTES.md, "Measurement method and noise").
set -u
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-build/gpu-ab}
work=/tmp/gpu-ab

prepare() { # NAME REF
  local name=$1 ref=$2 f
  [ "$(git merge-base HEAD "$ref")" = "$(git rev-parse HEAD)" ] ||
    echo "gpu_ab: $ref is not based on HEAD: its files lack HEAD's later changes (rebase it)" >&2
  rm -rf "ab/$name"
  for f in $(git diff --name-only HEAD..."$ref"); do
    mkdir -p "ab/$name/$(dirname "$f")"
    git show "$ref:$f" >"ab/$name/$f" || return 1
  done
  echo "ab/$name: $(find "ab/$name" -type f | wc -l) files from $ref"
}

tree_of() { [ "$1" = main ] && pwd || echo "$work/$1"; }

build_all() { # NAME...
  local v jobs=$((16 / ($# + 1) > 1 ? 16 / ($# + 1) : 1))
  rm -rf "$work" && mkdir -p "$work"
  for v in "$@"; do
    # the tree without its builds and variants, then the variant's files over it
    mkdir -p "$work/$v" && tar --exclude=./build --exclude=./build-san --exclude=./ab \
      --exclude=./.git -cf - . |
      tar -C "$work/$v" -xf - && cp -r "ab/$v/." "$work/$v/"
  done
  # main builds in place: on a machine kept warm between calls its build/ outputs can look newer
  # than the sources copied since, and make would skip what changed
  find . \( -path ./build -o -path ./build-san -o -path ./ab -o -path ./.git \) -prune \
    -o -type f -exec touch {} +
  for v in main "$@"; do
    (cd "$(tree_of "$v")" && make -j"$jobs" all build/tests/gpu/test_kernels \
      build/tests/gpu/test_grouped build/bench/bench_kernels build/bench/bench_moe \
      >"$out/build-$v.log" 2>&1; echo "build $v: exit $?") &
  done
  wait
}

# the GEMM column (the routed call's second part) of one bench log: "name M us" per row
gemm_rows() { awk -v max="${AB_MAX_M:-1024}" 'NF == 18 && $2 <= max { print $1, $2, $12 }' "$1"; }
# the layer's columns of one bench_moe log: "geometry T:column us" per row and column (alone: "ours
# us"; served: the layer under frozen-sampled, nothing changed; srvsync: served after a weight sync;
# the last two where the line has them), the geometry from the line that opens its table ("qwen3:
# 128 experts, ...")
moe_rows() {
  awk '/^[a-z0-9_]+: [0-9]+ experts/ { g = substr($1, 1, length($1) - 1) }
    g != "" && $2 == "|" && $1 ~ /^[0-9]+$/ {
      print g, $1 ":alone", $3
      if (NF >= 21) { print g, $1 ":served", $19; print g, $1 ":srvsync", $21 } }' "$1"
}
moe() { [ "${AB_BENCH:-kernels}" = moe ]; }

table() { # NAME... (main first): the median of the repeats, per row and variant
  local v i
  for v in "$@"; do
    for i in $(seq "${AB_REPEATS:-2}"); do
      if moe; then moe_rows "$out/bench-$v-$i.log"; else gemm_rows "$out/bench-$v-$i.log"; fi |
        sed "s/^/$v /"
    done
  done | awk -v order="$*" \
    -v title="$(moe && echo "layer us (median)" || echo "GEMM us (median)")" '
    { key = $2 " " $3; v[key, $1] = v[key, $1] " " $4
      if (!(key in seen)) { seen[key] = 1; keys[++n] = key } }
    function med(s,   a, k, i, j, t) {
      k = split(s, a, " ")
      for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++)
        if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
      return k ? a[int((k + 1) / 2)] : "-"
    }
    END {
      m = split(order, names, " ")
      printf "%-22s", title; for (j = 1; j <= m; j++) printf " %10s", names[j]; print ""
      for (i = 1; i <= n; i++) {
        printf "%-22s", keys[i]
        for (j = 1; j <= m; j++) printf " %10s", med(v[keys[i], names[j]]); print ""
      }
    }'
}

run() { # NAME...
  local v i
  for v in "$@"; do
    [ -d "ab/$v" ] || {
      echo "gpu_ab: no ab/$v (run \"lab/gpu_ab.sh prepare $v REF\" first, and carry ab)"
      return 1
    }
  done
  mkdir -p "$out"
  build_all "$@"
  for i in $(seq "${AB_REPEATS:-2}"); do
    for v in main "$@"; do
      if moe; then
        # shellcheck disable=SC2086 # AB_MOE_ARGS: none or several words
        (cd "$(tree_of "$v")" && timeout 120 build/bench/bench_moe ${AB_MOE_ARGS:-} \
          "$work/bench-$v-$i.json")
      else
        (cd "$(tree_of "$v")" && timeout 120 build/bench/bench_kernels "$work/bench-$v-$i.json")
      fi >"$out/bench-$v-$i.log" 2>&1 || echo "bench $v ($i): exit $?"
    done
  done
  table main "$@" | tee "$out/ab.txt"
  [ -n "${AB_PROBES:-}" ] && probes main "$@"
  case ${AB_TESTS:-0} in
  1) tests "$@" ;;
  all) tests main "$@" ;;
  esac
}

probes() { # NAME...: each of AB_PROBES built in every tree in parallel, then run one at a time
  local v p
  for v in "$@"; do
    for p in $AB_PROBES; do
      (cd "$(tree_of "$v")" && nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I. \
        -o "build/probe_$p" "lab/probe_$p.cu" -lcuda -lcublas >"$out/probe-$p-$v.log" 2>&1 ||
        echo "probe $p $v: build exit $?") &
    done
  done
  wait
  for p in $AB_PROBES; do
    for v in "$@"; do
      (cd "$(tree_of "$v")" && timeout 60 "build/probe_$p") >>"$out/probe-$p-$v.log" 2>&1
      echo "probe $p $v: exit $?"
    done
  done
}

tests() { # NAME...
  local v t
  t=$(moe && echo test_grouped || echo test_kernels)
  for v in "$@"; do
    (cd "$(tree_of "$v")" && timeout 150 "build/tests/gpu/$t") >"$out/$t-$v.log" 2>&1
    echo "$t $v: exit $?, $(grep -c '^ok' "$out/$t-$v.log") ok"
  done
}

case ${1:-} in
prepare) [ $# -eq 3 ] && prepare "$2" "$3" ;;
run) shift && [ $# -ge 1 ] && run "$@" ;;
table) shift && table main "$@" ;; # the table again from $OUT's logs
*) sed -n '2,/^set -u/{/^#/p}' "$0" | sed 's/^# \{0,1\}//' && false ;;
esac
