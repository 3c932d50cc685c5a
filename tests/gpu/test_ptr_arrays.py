"""test_ptr_arrays.py — the pointer-array cuBLAS forms on the grouped engine through the real cuBLAS
(tests/gpu/ptr_arrays_app.c under the shim, MINITE_SPEC=nvfp4-row, route 512x1024, 4 experts of 24
tokens, beta 0.5 with C):

    make && make build/tests/gpu/ptr_arrays_app
    python3 tests/gpu/test_ptr_arrays.py                          (H200; seconds)

- cublasGemmBatchedEx, cublasGemmGroupedBatchedEx (every group 24 rows; and 9 rows in the first
  group: rows differing by group) and cublasLtMatmul with POINTER_ARRAY batches give bitwise the
  outputs of the same problems as one cublasGemmStridedBatchedEx under the shim (a row's bits
  depend on nothing but its inputs; the ragged call's rows past 9 keep C), eagerly and in two
  replays of a CUDA graph captured around the call;
- every call is routed (no fallback), the engine ran each once (its context's routed count is the
  summary's), the captured calls are counted, and each captured graph holds exactly one grouped
  GEMM kernel node (mt_grouped_nBN), no per-problem GEMM node and no kernel that is not the
  engine's: one grouped launch per call, the pointer arrays read on the device;
- the pointer-array calls are counted (pointer_array_calls), under requantize and under frozen
  (which keeps no entry for them, and says so once at INFO);
- without the shim (and without graphs) the program runs through cuBLAS (the cuBLAS forms accepted;
  cuBLASLt may refuse its pointer-array batch with NOT_SUPPORTED) and the reference differs from the
  routed one (the routed results are the engine's).
Skips (not passes) without a CUDA device.
"""
import ctypes
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shim_child import BUILD, LIB, ROOT, harness, run_app  # noqa: E402

APP = os.path.join(ROOT, BUILD, "tests", "gpu", "ptr_arrays_app")
TMP = tempfile.mkdtemp(prefix="mt_ptr_arrays_")
FORMS = ("batched", "grouped", "ragged", "lt")


def need_device():
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        harness.skip("no CUDA driver")
    count = ctypes.c_int(0)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
        harness.skip("no CUDA device")
    for path in (LIB, APP):
        if not os.path.exists(path):
            raise RuntimeError(f"{path} missing: run make && make {BUILD}/tests/gpu/ptr_arrays_app")


def app(tag, shim=True, extra=None):
    """Run the program (without the shim: no graphs); returns (exit status, #info values, reference
    output, summary, stderr)."""
    out = os.path.join(TMP, tag + ".bin")
    minite = dict(MINITE_SPEC="nvfp4-row", MINITE_ROUTE="512x1024") if shim else None
    return run_app([APP, out] + ([] if shim else ["eager"]), out, tag, TMP, minite, extra,
                   timeout=300)


def routed_forms(cache):
    rc, info, data, summary, err = app("shim_" + cache, extra={"MINITE_WEIGHT_CACHE": cache,
                                                               "MINITE_LOG_LEVEL": "INFO"})
    harness.check(rc == 0, f"{cache}: exit {rc}: {err[-3000:]}")
    for f in FORMS:
        harness.check(info.get(f"status_{f}") == 0,
                      f"{cache}/{f}: status {info.get(f'status_{f}')}")
        harness.check(info.get(f"differing_{f}") == 0,
                      f"{cache}/{f}: {info.get(f'differing_{f}')} outputs differ from the strided "
                      "call's")
        harness.check(info.get(f"differing_graph_{f}") == 0,
                      f"{cache}/{f}: graph replays: {info.get(f'differing_graph_{f}')} outputs "
                      "differ from the strided call's")
        nodes = (info.get(f"grouped_nodes_{f}"), info.get(f"gemm_nodes_{f}"),
                 info.get(f"other_nodes_{f}"))
        harness.check(nodes == (1, 0, 0), f"{cache}/{f}: the captured graph's kernels (grouped "
                      f"GEMM, per-problem GEMM, not the engine's): {nodes}")
    calls = info.get("calls", -1)
    harness.check(calls == 1 + 2 * len(FORMS), f"{cache}: {calls} calls")
    harness.check(summary.get("routed") == calls and not summary.get("fallbacks"),
                  f"{cache}: routed {summary.get('routed')} of {calls}, fallbacks "
                  f"{summary.get('fallbacks')}")
    engine = summary.get("engine", {})
    ran = sum(c.get("routed", 0) for c in engine.get("contexts", []))
    harness.check(ran == calls, f"{cache}: the engine ran {ran} times for {calls} calls: {engine}")
    harness.check(engine.get("captured_calls") == len(FORMS) and
                  engine.get("pointer_array_calls") == 2 * len(FORMS),
                  f"{cache}: captured_calls and pointer_array_calls: {engine}")
    said = err.count("requantized at every call")
    harness.check(said == (1 if cache == "frozen" else 0),
                  f"{cache}: said {said} times: {err[-2000:]}")
    return data


def forms_bitwise_and_graphed():
    need_device()
    routed = routed_forms("requantize")
    frozen = routed_forms("frozen")
    harness.check(np.array_equal(routed, frozen) and routed.size > 0,
                  "the strided reference differs between requantize and frozen")
    rc, info, plain, _, err = app("plain", shim=False)
    harness.check(rc == 0, f"without the shim: exit {rc}: {err[-3000:]}")
    for f in FORMS[:3]:
        harness.check(info.get(f"status_{f}") == 0,
                      f"cuBLAS refused the {f} call as the program makes it: {info}")
    # cuBLASLt may not offer pointer-array batches of this type: refusing is its right
    harness.check(info.get("status_lt") in (0, 15), f"cublasLtMatmul without the shim: {info}")
    harness.check(plain.size == routed.size and not np.array_equal(plain, routed),
                  "the routed reference is cuBLAS's: nothing was routed")


harness.run(forms_bitwise_and_graphed)
sys.exit(harness.done())
