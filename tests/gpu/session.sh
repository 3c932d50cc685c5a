#!/usr/bin/env bash
# tests/gpu/session.sh [STEP...] — everything the device machine is for, step by step: build, GPU
# tests, benchmarks, lab probes and the demo run, each step under its own time limit so that one
# hang does not cost the others. Each step prints its exit status, its time and the tail of its
# log. The logs go to build/gpu-session/PID, a folder an invocation; where $OUT is set (the device
# tool's output folder, which brings back at most 8 files), they are packed into one file at the
# end, $OUT/session-STEPS$TAG.tgz (STEPS: the steps' names joined by '-').
#
# Steps (default: build kernels bench benchshim torch run):
#   build      make all
#   kernels    the C GPU tests, build/tests/gpu/test_* (KERNELS_LIMIT s, default 240)
#   sanitize   under compute-sanitizer memcheck (SANITIZE_LIMIT each, default 300): test_kernels,
#              and test_grouped's cases that reach every grouped kernel path (few rows and the
#              warp MMAs, every token-tile width and the n256 kernel's split, strided and
#              pointer-array segments, NaN rows, the store's refresh in clusters and the
#              grouped calls that run it, the GEMM beside it and after it, over one launch and
#              two, and back to back; its layer cases add only size)
#   torch      the Python GPU tests through make gputest (TORCH_LIMIT, default 420);
#              GPU_PY="tests/gpu/test_a.py ..." narrows them
#   bench      make bench; its JSON files into the logs
#   benchshim  make bench-shim
#   door       the launch door: test_grouped's vLLM dispatch case, then tests/gpu/test_vllm_moe.py
#              (DOOR_LIMIT, default 420) on the vLLM sources of `make vllm-sources`
#   benchvllm  make bench-vllm: vLLM's Triton MoE kernel against the engine; its JSON into the logs
#   ncu        two rows of the benchmark (NCU_ROWS) under Nsight Compute; NCU_BLAS=1 adds the
#              cuBLAS kernels of those rows
#   probe      make lab, then each probe (PROBES="feed floor ..." narrows them, default all of
#              lab/probe_*.cu; PROBE_ARGS is passed to each, e.g. mc for probe_feed)
#   ab         the benchmark rows AB_ROWS ("qwen3_gate_up:4096 ...") one at a time, their table
#              lines into ab.log
#   instrncu   lab/instr_replay.py (one MoE block captured and replayed under nvfp4-row with
#              statistics, INSTR_T tokens, default 128) under lab/ncu_pick.sh: the first launch of
#              INSTR_NCU_KERNEL (default mt_instr_digest) of at least 5 µs, full sections and SASS
#   trace      bench_moe's Qwen3 layer at TRACE_TOKENS (default "1 16") under lab/trace.c: every
#              kernel's start and end on the GPU, one replay of each graph printed by
#              lab/timeline.py (the layer alone, served, the checks, cuBLAS), ~15 s a T
#   instr      lab/instr_cost.py: the instruments' cost on a MoE block, eager and captured, each
#              setting in its own process (INSTR_ARGS passed on, split at spaces, e.g. "--old
#              build/old/libminite.so"; INSTR_ONLY its --only, whose names may hold a space:
#              "nvfp4-row,nvfp4-row+digest old"); ~30 s a setting on an H100 (11, 13 with --old)
#   server     demo/demo_server.py (transformers' continuous batching) without the shim and under
#              nvfp4-row, SERVER_ARGS passed on (default 32 requests, 2 layers), the census of
#              the shim's run into the logs (SERVER_LIMIT each, default 240)
#   serverab   lab/server_ab.sh: the server under the settings SERVERAB (default "none nvfp4-row"),
#              each in PROCS processes (default 3) taken in turn, SERVER_ARGS passed on (default
#              8 layers, 64 requests); SERVERAB_LIMIT, default 540 (~45 s a process on an H100)
#   run        make run (RUN_LIMIT, default 590: a call has 600 s; RUN_ARGS passed on); the table,
#              its JSON files, and each child's summary line (build/run/logs/*.out) even when the
#              limit stops it
# TAG=-x appends -x to the log names: the same steps again under another setting, side by side.
# A device call has at most 600 s, so pick the steps of each call: on the H200 build takes ~40 s,
# kernels ~150 (test_kernels ~90, test_grouped ~60), sanitize ~100, bench ~10, probe ~20 to build,
# torch ~1000 in all: three calls with GPU_PY. Per program, s: test_grouped_mm.py ~265,
# test_multi_gpu.py ~160, test_torch_passthrough.py ~145, test_demo_sampler.py ~95,
# test_demo_learner.py ~90, test_reliability.py ~75 (its sanitizers alone, MT_SANITIZE=1 and
# MT_TEST_ONLY=sanitizers, ~40), test_instruments.py ~70, test_routed.py ~45, test_jax_moe.py ~60,
# test_ptr_arrays.py ~2.
set -u
cd "$(dirname "$0")/../.." || exit 1
out=build/gpu-session/$$
mkdir -p "$out"
steps=${*:-build kernels bench benchshim torch run}
if [ -n "${OUT:-}" ]; then
  pack="$OUT/session-${steps// /-}${TAG:-}.tgz"
  trap 'tar -czf "$pack" -C "$out" . && echo "== logs: $pack"' EXIT
else
  echo "== logs: $out"
fi
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
  return $rc
}

# the test binaries that the kernels and sanitize steps run ("build" makes only the library)
gpu_bins=$(for f in tests/gpu/test_*.c; do f=${f#tests/gpu/}; echo "build/tests/gpu/${f%.c}"; done)
kernels_bin() {
  # shellcheck disable=SC2086 # one word per binary
  make -s -j16 $gpu_bins >"$out/kernels-build${TAG:-}.log" 2>&1 ||
    { echo "== GPU tests: build failed (kernels-build${TAG:-}.log)"; false; }
}

for s in $steps; do
  case $s in
  build) step build 240 make -j16 all ;;
  kernels)
    # shellcheck disable=SC2086 # one word per binary
    kernels_bin && step kernels "${KERNELS_LIMIT:-240}" env MT_BUILD=build tests/run $gpu_bins ;;
  torch) step torch "${TORCH_LIMIT:-420}" make gputest GPU_TESTS= ${GPU_PY:+GPUTEST_PY="$GPU_PY"} ;;
  sanitize)
    kernels_bin || continue
    step sanitize "${SANITIZE_LIMIT:-300}" compute-sanitizer --tool memcheck --error-exitcode 99 \
        build/tests/gpu/test_kernels
    step sanitize-grouped "${SANITIZE_LIMIT:-300}" env \
        MT_TEST_ONLY="grouped_few_rows grouped_widths grouped_strided grouped_pointer_arrays \
grouped_nan store_refresh_modes store_refresh_rounds grouped_after_refresh \
grouped_many_segments grouped_back_to_back" \
        compute-sanitizer --tool memcheck --error-exitcode 99 build/tests/gpu/test_grouped ;;
  bench) step bench 400 make bench &&
    cp build/bench.json build/bench_moe.json build/bench_moe_torch.json "$out/" 2>/dev/null ;;
  benchshim) step benchshim 120 make bench-shim ;;
  door) # the launch door on vLLM's real kernel (build/third_party: make vllm-sources, carried)
    make -s -j16 build/tests/gpu/test_grouped build/tests/cpu/nvfp4_tool \
        >"$out/door-build${TAG:-}.log" 2>&1 ||
      { echo "== door: build failed (door-build${TAG:-}.log)"; continue; }
    step door-dispatch 240 env MT_BUILD=build MT_TEST_ONLY="grouped_moe_dispatch" \
        build/tests/gpu/test_grouped
    step door-vllm "${DOOR_LIMIT:-420}" env PYTHONUNBUFFERED=1 python3 tests/gpu/test_vllm_moe.py ;;
  benchvllm) step bench-vllm 400 make bench-vllm &&
    cp build/bench_moe_vllm.json "$out/" 2>/dev/null ;;
  ncu) # the GEMM kernels of two rows of the benchmark under Nsight Compute (clocks left alone)
    for cfg in ${NCU_ROWS:-qwen3_gate_up:4096 qwen3_gate_up:1}; do
      step "ncu-${cfg/:/-}" 240 env MT_BENCH_ONLY="$cfg" ncu --clock-control none \
          --kernel-name 'regex:mt_gemm_(large|small)' --launch-count 1 --section SpeedOfLight \
          --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
          --section WarpStateStats --section LaunchStats --section Occupancy \
          --section SourceCounters build/bench/bench_kernels "$out/ncu.json"
      [ -n "${NCU_BLAS:-}" ] && step "ncu-blas-${cfg/:/-}" 240 env MT_BENCH_ONLY="$cfg" ncu \
          --clock-control none --kernel-name 'regex:nvjet|xmma|cutlass|gemm_kernel|splitK|gemv' \
          --launch-count 2 --section SpeedOfLight --section MemoryWorkloadAnalysis \
          --section LaunchStats build/bench/bench_kernels "$out/ncu.json"
    done ;;
  probe) # the experiments behind lab/NOTES.md (lab/probe_*.cu)
    step probe-build 300 make -j16 lab || continue
    all=$(for f in lab/probe_*.cu; do f=${f#lab/probe_}; echo "${f%.cu}"; done)
    for p in ${PROBES:-$all}; do
      # shellcheck disable=SC2086 # PROBE_ARGS: none or several words
      step "probe-$p${PROBE_ARGS:+-$PROBE_ARGS}" 60 "build/lab/probe_$p" ${PROBE_ARGS:-}
    done ;;
  ab)
    make -s build/bench/bench_kernels >/dev/null 2>&1
    for r in ${AB_ROWS:-}; do
      echo "== ab${TAG:-} $r"
      MT_BENCH_ONLY=$r timeout 60 build/bench/bench_kernels "$out/ab.json" 2>&1 |
        grep -E "^${r%%:*} |rror"
    done >"$out/ab${TAG:-}.log" 2>&1
    cat "$out/ab${TAG:-}.log" ;;
  instr)
    # shellcheck disable=SC2086 # INSTR_ARGS: several words
    step instr "${INSTR_LIMIT:-560}" python3 lab/instr_cost.py "$out/instr_cost${TAG:-}.json" \
        ${INSTR_ONLY:+--only "$INSTR_ONLY"} ${INSTR_ARGS:-} ;;
  instrncu) # one replayed MoE block's instrument kernel under Nsight Compute: lab/ncu_pick.sh's
    # first launch of >= 5 µs (a warm-up's or a replay's: the same grid and arguments)
    # shellcheck disable=SC2016 # expanded by the sh that ncu starts, after its LD_PRELOAD is set
    run='LD_PRELOAD="${LD_PRELOAD:+$LD_PRELOAD:}$0" exec python3 lab/instr_replay.py --tokens "$1"'
    step "instrncu${TAG:-}" 300 env OUT="$out/ncu-instr${TAG:-}" MINITE_SPEC=nvfp4-row \
        MINITE_ROUTE=1536x2048,2048x768 MINITE_WEIGHT_CACHE=frozen-sampled \
        MINITE_STATS="$out/instrncu-stats.jsonl" \
        lab/ncu_pick.sh "${INSTR_NCU_KERNEL:-mt_instr_digest}" 5 any -- \
        sh -c "$run" "$PWD/build/libminite.so" "${INSTR_T:-128}" ;;
  trace)
    make -s build/lab/libtrace.so build/bench/bench_moe >"$out/trace-build${TAG:-}.log" 2>&1 ||
      { echo "== trace: build failed (trace-build${TAG:-}.log)"; continue; }
    for t in ${TRACE_TOKENS:-1 16}; do
      step "trace-$t" 120 env MT_TRACE="$out/trace-$t${TAG:-}.csv" \
          LD_PRELOAD=build/lab/libtrace.so \
          build/bench/bench_moe --only qwen3 --tokens "$t" "$out/trace-$t.json" &&
        python3 lab/timeline.py "$out/trace-$t${TAG:-}.csv" >"$out/timeline-$t${TAG:-}.txt" &&
        grep -A30 "(served)" "$out/timeline-$t${TAG:-}.txt" | head -n 40
    done ;;
  server)
    make -s -j16 all >"$out/server-build${TAG:-}.log" 2>&1 ||
      { echo "== server: build failed (server-build${TAG:-}.log)"; continue; }
    sargs=${SERVER_ARGS:---requests 32 --layers 2}
    # shellcheck disable=SC2086 # SERVER_ARGS: several words
    step server-none "${SERVER_LIMIT:-240}" python3 demo/demo_server.py \
        --out "$out/server-none.jsonl" $sargs
    # shellcheck disable=SC2086
    step server-nvfp4-row "${SERVER_LIMIT:-240}" env LD_PRELOAD="$PWD/build/libminite.so" \
        MINITE_SPEC=nvfp4-row MINITE_ROUTE=1536x2048,2048x768 MINITE_ROLE=sampler \
        MINITE_WEIGHT_CACHE=frozen-sampled MINITE_STATS="$out/server-stats.jsonl" \
        python3 demo/demo_server.py --out "$out/server-row.jsonl" $sargs ;;
  serverab) # lab/server_ab.sh: SERVERAB settings, each in PROCS processes taken in turn
    make -s -j16 all >"$out/serverab-build${TAG:-}.log" 2>&1 ||
      { echo "== serverab: build failed (serverab-build${TAG:-}.log)"; continue; }
    # shellcheck disable=SC2086 # SERVERAB: several settings
    step "serverab" "${SERVERAB_LIMIT:-540}" env OUT="$out/server-ab${TAG:-}" \
        lab/server_ab.sh ${SERVERAB:-none nvfp4-row} ;;
  run)
    step run "${RUN_LIMIT:-590}" make run ${RUN_ARGS:+RUN_ARGS="$RUN_ARGS"}
    mkdir -p "$out/run${TAG:-}"
    cp build/run/*.json build/run/*.md build/run/gap.png "$out/run${TAG:-}/" 2>/dev/null
    tail -qn 1 build/run/logs/*.out >"$out/run-summaries${TAG:-}.jsonl" 2>/dev/null ;;
  *) echo "unknown step $s" ;;
  esac
done
