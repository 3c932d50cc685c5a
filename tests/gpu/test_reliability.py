"""test_reliability.py — the shim in real jobs on the GPU (issue "Reliability"): CUDA graphs in
every way PyTorch makes them, threads, forks, context resets, two contexts, exhausted device memory.

    make && make build/tests/cpu/nvfp4_tool build/tests/gpu/reliability_app
    python3 tests/gpu/test_reliability.py                         (H200; about 3 minutes)
    MT_SANITIZE=1 python3 tests/gpu/test_reliability.py           (adds compute-sanitizer runs)

Graph cases (tests/gpu/reliability_child.py under the shim, routes 1536x2048):
- grow: a captured call's replays stay right after its stream's scratch grew and the memory was
  handed out again, and the new owner's tensor is untouched (the graph owns its memory);
- side: warm-up on a side stream, torch.cuda.graph(g) without stream=: routed in the graph (no
  "capture" fallback), replays equal eager calls bit for bit;
- graphed: make_graphed_callables on a module of routed experts: outputs bitwise, input gradients
  (cuBLAS BF16 backward) close;
- compiled: torch.compile(mode="reduce-overhead") on that module: outputs bitwise.
C program cases (tests/gpu/reliability_app.c, real cuBLAS, with and without the shim):
- threads: 16 threads on 16 streams, shared and own weights: bitwise equal to the same calls one
  after another, every call routed;
- swap (frozen and frozen-sampled caches): the same threads in rounds, the shared weight rewritten
  in place between rounds: every round bitwise equal to its version's calls made one after
  another (the streams' checks of the changed weight are ordered, none keeps a stale weight);
- fork: a child forked while another thread routes comes back (no hang) as often as without the
  shim; a child forked before CUDA was used routes and gets the parent's bits; the parent goes on;
- reset: the primary context reset three times and a created context destroyed and re-created
  three times: every call routed, bits unchanged;
- contexts: two created contexts on the one GPU, alternately and from two threads at once: bits
  equal to the primary context's, every call routed;
- oom (frozen cache): with device memory exhausted, calls on a weight not seen before fall back
  ("out of memory": no cache entry to be had) with cuBLAS's bits (those of the run without the
  shim); once memory is back they are routed.
With MT_SANITIZE=1: compute-sanitizer memcheck and racecheck on the threads case (fewer calls) and
on the graph cases grow and side: memcheck without error, racecheck without a hazard in an engine
kernel (one in a cuBLAS kernel is printed), the threads' results still bitwise; and racecheck on
test_kernels' gemm_paths_agree (build/tests/gpu/test_kernels), whose fused few-token kernel reads
past a stage of its cp.async ring: no hazard.
Skips (not passes) without torch or a GPU.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shim_child import BUILD, LIB, ROOT, harness, need_gpu, run_app, run_child  # noqa: E402

CHILD = os.path.join(ROOT, "tests", "gpu", "reliability_child.py")
APP = os.path.join(ROOT, BUILD, "tests", "gpu", "reliability_app")
TMP = tempfile.mkdtemp(prefix="mt_reliability_")
ROUTE = "1536x2048"


def graph_child(case, cache="requantize"):
    minite = dict(MINITE_SPEC="nvfp4-row", MINITE_ROUTE=ROUTE, MINITE_WEIGHT_CACHE=cache)
    arrays, _, summary = run_child(CHILD, case, f"{case}_{cache}", TMP, minite)
    harness.check(summary is not None, f"{case}: no statistics summary")
    return arrays, summary or {}


def no_capture_fallback(case, summary):
    harness.check(summary.get("routed", 0) > 0 and "capture" not in summary.get("fallbacks", {}),
                  f"{case}: routed {summary.get('routed')}, fallbacks {summary.get('fallbacks')}")
    harness.check(summary.get("engine", {}).get("captured_calls", 0) > 0,
                  f"{case}: no call routed inside a capture: {summary.get('engine')}")


def replays_equal_eager(case, got, n=3):
    for i in range(n):
        harness.check(np.array_equal(got[f"replay{i}"], got[f"eager{i}"]),
                      f"{case}: replay {i} differs from the eager call")


def graph_outlives_scratch_growth():
    need_gpu()
    for cache in ("requantize", "frozen"):
        got, summary = graph_child("grow", cache)
        replays_equal_eager(f"grow/{cache}", got)
        harness.check(bool(got["bystander_intact"][0]),
                      f"grow/{cache}: a replay wrote into memory the graph does not own")
        no_capture_fallback(f"grow/{cache}", summary)


def graph_without_stream_argument():
    need_gpu()
    for cache in ("requantize", "frozen"):
        got, summary = graph_child("side", cache)
        replays_equal_eager(f"side/{cache}", got)
        no_capture_fallback(f"side/{cache}", summary)


def make_graphed_callables_routes():
    need_gpu()
    got, summary = graph_child("graphed")
    for i in range(3):
        harness.check(np.array_equal(got[f"y{i}"], got[f"ye{i}"]), f"graphed: output {i} differs")
        harness.check(np.allclose(got[f"g{i}"], got[f"ge{i}"], rtol=2e-2, atol=1e-2),
                      f"graphed: input gradient {i} differs")
    no_capture_fallback("graphed", summary)


def torch_compile_reduce_overhead_routes():
    need_gpu()
    got, summary = graph_child("compiled")
    if "no_triton" in got:
        harness.skip("torch.compile needs triton, which is not installed")
    for i in range(6):
        harness.check(np.array_equal(got[f"y{i}"], got[f"ye{i}"]), f"compiled: output {i} differs")
    no_capture_fallback("compiled", summary)

# ---- the C program -------------------------------------------------------------------------


def app(mode, tag, shim=True, extra=None, wrap=None, timeout=600):
    """Run reliability_app MODE; returns (exit status, #info values, outputs, summary, stderr)."""
    if not os.path.exists(APP):
        raise RuntimeError(f"{APP} missing: run make {BUILD}/tests/gpu/reliability_app first")
    out = os.path.join(TMP, tag + ".bin")
    minite = dict(MINITE_SPEC="nvfp4-row", MINITE_ROUTE=ROUTE) if shim else None
    return run_app((wrap or []) + [APP, mode, out], out, tag, TMP, minite, extra, timeout)


def all_routed(tag, summary, calls):
    harness.check(summary.get("routed") == calls and not summary.get("fallbacks"),
                  f"{tag}: routed {summary.get('routed')} of {calls}, "
                  f"fallbacks {summary.get('fallbacks')}")


def routed_and_equal(mode, caches):
    """reliability_app MODE under each weight cache: its own comparison finds nothing differing and
    every call is routed. Returns the last run's outputs."""
    data = None
    for cache in caches:
        rc, info, data, summary, err = app(mode, f"{mode}_{cache}",
                                           extra={"MINITE_WEIGHT_CACHE": cache})
        harness.check(rc == 0 and info.get("differing") == 0,
                      f"{mode}/{cache}: exit {rc}, {info}: {err[-2000:]}")
        all_routed(f"{mode}/{cache}", summary, info.get("calls"))
    return data


def threads_bitwise_equal_to_one_thread():
    need_gpu()
    data = routed_and_equal("threads", ("requantize", "frozen"))
    rc, info, plain, _, err = app("threads", "threads_plain", shim=False)
    harness.check(rc == 0, f"threads without the shim: exit {rc}: {err[-2000:]}")
    harness.check(plain.size == data.size and not np.array_equal(plain, data),
                  "the routed results are cuBLAS's: nothing was routed")


def kept_weight_changed_under_threads():
    need_gpu()
    routed_and_equal("swap", ("frozen", "frozen-sampled"))


def forks_come_back():
    need_gpu()
    rc0, plain, _, _, _ = app("fork", "fork_plain", shim=False, timeout=900)
    rc, info, _, summary, err = app("fork", "fork", timeout=900)
    hung, hung_plain = info.get("hung_children", 99), plain.get("hung_children", 0)
    harness.check(hung == 0 or hung <= hung_plain,
                  f"fork: {info} (without the shim: {plain}): {err[-2000:]}")
    harness.check(info.get("early_child_status") == 0 and info.get("early_child_same") == 1,
                  f"fork: the child forked before CUDA: {info}")
    harness.check(info.get("parent_after_forks_same") == 1, f"fork: the parent after: {info}")
    harness.check(rc == 0 or rc0 != 0, f"fork: exit {rc} (without the shim {rc0})")


def reset_and_recreated_contexts():
    need_gpu()
    rc, info, _, summary, err = app("reset", "reset")
    rc0, _, _, _, err0 = app("reset", "reset_plain", shim=False)
    harness.check(rc0 == 0, f"reset without the shim: exit {rc0}: {err0[-1500:]}")
    harness.check(rc == 0 and info.get("differing") == 0,
                  f"reset: exit {rc}, {info}: {err[-2000:]}")
    all_routed("reset", summary, 12 * 7)


def two_contexts_on_one_gpu():
    need_gpu()
    rc, info, _, summary, err = app("contexts", "contexts")
    harness.check(rc == 0 and info.get("differing") == 0,
                  f"contexts: exit {rc}, {info}: {err[-2000:]}")
    all_routed("contexts", summary, 12 * 5 + 2 * 2 * 12)


def out_of_memory_falls_back():
    need_gpu()
    rc, info, data, summary, err = app("oom", "oom", extra={"MINITE_WEIGHT_CACHE": "frozen"})
    rc0, _, plain, _, _ = app("oom", "oom_plain", shim=False)
    harness.check(rc == 0 and rc0 == 0 and info.get("hog_chunks", 0) > 0,
                  f"oom: exit {rc} / {rc0}, {info}: {err[-2000:]}")
    half = data.size // 2
    harness.check(data.size == plain.size and np.array_equal(data[:half], plain[:half]),
                  "oom: the calls made without memory are not cuBLAS's")
    harness.check(not np.array_equal(data[half:], plain[half:]),
                  "oom: the calls made once memory was back were not routed")
    falls = summary.get("fallbacks", {})
    harness.check(falls.get("out of memory", 0) >= 1 and summary.get("routed", 0) >= 5,
                  f"oom: routed {summary.get('routed')}, fallbacks {falls}")


def sanitizer_report(tool, log):
    """(clean, what to print) for one compute-sanitizer log (every process of the run writes its
    own summary line: --target-processes all). memcheck: every summary "ERROR SUMMARY: 0 errors".
    racecheck: no hazard in an engine kernel (mt_*). racecheck analyses each kernel's own shared
    memory, so a hazard inside one of cuBLAS's kernels (racecheck has reported one in an nvjet
    kernel, which the shadow instrument's cuBLAS rerun launches here) is cuBLAS's, whatever else
    runs: printed, not counted against the shim."""
    text = "".join(open(f, errors="replace").read()
                   for f in sorted(glob.glob(log.replace("%p", "*"))))
    summaries = [line for line in text.splitlines() if "SUMMARY:" in line]
    if tool == "memcheck":
        ok = bool(summaries) and all("ERROR SUMMARY: 0 errors" in line for line in summaries)
    else:
        kernels = set(re.findall(r"access at (\S+?)\+0x", text))
        ok = bool(summaries) and not any(k.startswith("mt_") for k in kernels)
        if kernels:
            summaries.append(f"hazards in {sorted(kernels)}")
    return ok, "\n".join(summaries) + "\n" + text[:3000]


def sanitizers_clean():
    need_gpu()
    if os.environ.get("MT_SANITIZE") != "1":
        harness.skip("set MT_SANITIZE=1 to run compute-sanitizer (several minutes)")
    sanitizer = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not os.path.exists(sanitizer):
        harness.skip("no compute-sanitizer")
    small = {"RELIABILITY_THREADS": "4", "RELIABILITY_CALLS": "3"}
    for tool in ("memcheck", "racecheck"):
        def wrap(case):
            log = os.path.join(TMP, f"san_{tool}_{case}.%p.log")
            return log, [sanitizer, "--tool", tool, "--error-exitcode", "99",
                         "--target-processes", "all", "--print-limit", "20", "--log-file", log]
        log, cmd = wrap("threads")
        rc, info, _, _, _ = app("threads", f"san_{tool}", extra=small, wrap=cmd, timeout=1800)
        ok, report = sanitizer_report(tool, log)
        print(f"    {tool} on threads: exit {rc}; " + " / ".join(report.splitlines()[:2]))
        # 99: the sanitizer found something (ok says whether it was the engine's)
        harness.check(rc in (0, 99) and info.get("differing") == 0 and ok,
                      f"{tool} on threads: exit {rc}, {info}:\n{report}")
        for case in ("grow", "side"):
            log, cmd = wrap(case)
            env = {k: v for k, v in os.environ.items() if not k.startswith("MINITE_")}
            env.update(LD_PRELOAD=LIB, MINITE_SPEC="nvfp4-row", MINITE_ROUTE=ROUTE)
            proc = subprocess.run(cmd + [sys.executable, CHILD, case, os.path.join(TMP, "san.npz")],
                                  env=env, capture_output=True, text=True, timeout=1800)
            ok, report = sanitizer_report(tool, log)
            print(f"    {tool} on graph case {case}: exit {proc.returncode}; "
                  + " / ".join(report.splitlines()[:2]))
            harness.check(proc.returncode in (0, 99) and ok,
                          f"{tool} on graph case {case}: exit {proc.returncode}:\n{report}\n"
                          f"{proc.stderr[-1500:]}")


def fused_kernel_racecheck_clean():
    """The fused few-token kernel (mt_gemm_small_q4) loads a record ahead of its step loop, past a
    stage's last record: into slack, not the next stage that cp.async may be filling."""
    need_gpu()
    if os.environ.get("MT_SANITIZE") != "1":
        harness.skip("set MT_SANITIZE=1 to run compute-sanitizer (about a minute)")
    sanitizer = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    tests = os.path.join(ROOT, BUILD, "tests", "gpu", "test_kernels")
    if not os.path.exists(sanitizer) or not os.path.exists(tests):
        harness.skip(f"no compute-sanitizer or no {tests} (make {BUILD}/tests/gpu/test_kernels)")
    log = os.path.join(TMP, "san_racecheck_kernels.log")
    env = dict(os.environ, MT_TEST_ONLY="gemm_paths_agree")
    proc = subprocess.run([sanitizer, "--tool", "racecheck", "--error-exitcode", "99",
                           "--print-limit", "20", "--log-file", log, tests],
                          env=env, capture_output=True, text=True, timeout=900)
    ok, report = sanitizer_report("racecheck", log)
    hazards = re.findall(r"RACECHECK SUMMARY: (\d+) hazard", report)
    print(f"    racecheck on gemm_paths_agree: exit {proc.returncode}; "
          + " / ".join(report.splitlines()[:2]))
    harness.check(proc.returncode == 0 and ok and hazards and all(h == "0" for h in hazards)
                  and "ok   gemm_paths_agree" in proc.stdout,
                  f"racecheck on gemm_paths_agree: exit {proc.returncode}:\n{report}\n"
                  f"{proc.stdout[-800:]}")


for t in (graph_outlives_scratch_growth, graph_without_stream_argument,
          make_graphed_callables_routes,
          torch_compile_reduce_overhead_routes, threads_bitwise_equal_to_one_thread,
          kept_weight_changed_under_threads, forks_come_back, reset_and_recreated_contexts,
          two_contexts_on_one_gpu, out_of_memory_falls_back, sanitizers_clean,
          fused_kernel_racecheck_clean):
    harness.run(t)
sys.exit(harness.done())
