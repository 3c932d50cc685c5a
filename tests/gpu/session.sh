#!/usr/bin/env bash
# tests/gpu/session.sh [STEP...] — everything the device machine is for, step by step: build, GPU
# tests, benchmarks and the demo run, each step under its own time limit so that one hang does not
# cost the others. Logs go to $OUT (the device tool's output folder) or build/gpu-session.
# KERNELS_LIMIT, SANITIZE_LIMIT, TORCH_LIMIT, RUN_LIMIT: seconds for those steps. A device call has
# 600 s, so pick steps: build ~60 s, kernels ~80, sanitize ~80, bench ~10, and the torch step (the
# Python GPU tests only: the kernels step runs test_kernels) ~580 in all on the H200 (the
# demos, instruments and routed tests ~360, test_torch_passthrough.py ~220), so over two calls
# with GPU_PY.
# Steps: build kernels torch sanitize bench benchshim ncu probe ab run (default: all but sanitize,
# ncu, probe and ab). ab: the benchmark rows AB_ROWS ("qwen3_gate_up:4096 ...") one at a time,
# their table lines into ab.log (with TAG, ab-TAG.log; set a knob beside it to compare). GPU_PY="tests/gpu/test_a.py ..." narrows the torch step to those Python tests;
# TAG=-x appends -x to the log names (the same steps again under another setting, e.g.
# MT_LARGE_VARIANT=v6 TAG=-v6 tests/gpu/session.sh kernels sanitize). PROBES="feed ..." narrows the
# probe step, PROBE_ARGS passes them an argument (probe_feed: mc); NCU_ROWS names the ncu step's
# benchmark rows, NCU_BLAS=1 adds cuBLAS's kernels of those rows.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-build/gpu-session}
mkdir -p "$out"
steps=${*:-build kernels bench benchshim torch run}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.used --format=csv \
    >"$out/gpu.txt" 2>&1

step() { # name, limit in seconds, command...
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name${TAG:-}.log" 2>&1
  local rc=$?
  echo "== $name${TAG:-}: exit $rc in $((SECONDS - t0)) s"
  tail -n 25 "$out/$name${TAG:-}.log"
}

# the test binary that the kernels and sanitize steps run ("build" makes only the library)
kernels_bin() {
  make -s build/tests/gpu/test_kernels >"$out/kernels-build${TAG:-}.log" 2>&1 ||
    { echo "== test_kernels: build failed (kernels-build${TAG:-}.log)"; false; }
}

for s in $steps; do
  case $s in
  build) step build 240 make -j16 all ;;
  kernels) kernels_bin && step kernels ${KERNELS_LIMIT:-180} build/tests/gpu/test_kernels ;;
  torch) step torch ${TORCH_LIMIT:-420} make gputest GPU_TESTS= ${GPU_PY:+GPUTEST_PY="$GPU_PY"} ;;
  sanitize) kernels_bin && step sanitize ${SANITIZE_LIMIT:-300} compute-sanitizer --tool memcheck build/tests/gpu/test_kernels ;;
  bench) step bench 300 make bench && cp build/bench.json "$out/" 2>/dev/null ;;
  benchshim) step benchshim 120 make bench-shim ;;
  ncu) # the GEMM kernels of two rows of the benchmark under Nsight Compute (clocks left alone)
    for cfg in ${NCU_ROWS:-qwen3_gate_up:4096 qwen3_gate_up:1}; do
      step "ncu-${cfg/:/-}" 240 env MT_BENCH_ONLY="$cfg" ncu --clock-control none \
          --kernel-name 'regex:mt_gemm_(large|small)' --launch-count 1 --section SpeedOfLight \
          --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
          --section LaunchStats --section Occupancy --section SourceCounters \
          build/bench/bench_kernels "$out/ncu.json"
      [ -n "${NCU_BLAS:-}" ] && step "ncu-blas-${cfg/:/-}" 240 env MT_BENCH_ONLY="$cfg" ncu --clock-control none \
          --kernel-name 'regex:nvjet|xmma|cutlass|gemm_kernel|splitK|gemv' --launch-count 2 --section SpeedOfLight \
          --section MemoryWorkloadAnalysis --section LaunchStats build/bench/bench_kernels "$out/ncu.json"
    done ;;
  probe) # the experiments behind lab/NOTES.md's floors (lab/probe_*.cu; PROBES names some)
    mkdir -p build
    for p in ${PROBES:-mma chain phases feed wgchain kloop floor}; do
      nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I. -o "build/probe_$p" "lab/probe_$p.cu" -lcuda -lcublas &&
        step "probe-$p${PROBE_ARGS:+-$PROBE_ARGS}" 60 "build/probe_$p" ${PROBE_ARGS:-}
    done ;;
  ab)
    make -s build/bench/bench_kernels >/dev/null 2>&1
    for r in ${AB_ROWS:-}; do
      echo "== ab${TAG:-} $r"
      MT_BENCH_ONLY=$r timeout 60 build/bench/bench_kernels "$out/ab.json" 2>&1 | grep -E "^${r%%:*} |rror"
    done >"$out/ab${TAG:-}.log" 2>&1
    cat "$out/ab${TAG:-}.log" ;;
  run) step run ${RUN_LIMIT:-540} make run ${RUN_ARGS:+RUN_ARGS="$RUN_ARGS"} && cp build/run/table.md build/run/gap.png "$out/" 2>/dev/null ;;
  *) echo "unknown step $s" ;;
  esac
done
