"""test_routed.py — routed GEMMs of an unmodified PyTorch program run on the NVFP4 engine and give
the spec's numbers (docs/numerics.md).

    make && make build/tests/cpu/nvfp4_tool && python3 tests/gpu/test_routed.py     (H200)

Each case runs tests/gpu/routed_child.py under LD_PRELOAD=build/libminite.so with
MINITE_SPEC=nvfp4-row and the child's weight routed (256x512), then checks:
- a routed F.linear at M = 1, 7, 64, 300 equals the CPU reference (ref/nvfp4.c through
  nvfp4_tool) within the FP32-accumulation bound (docs/numerics.md), and the calls were routed;
- frozen cache: a weight overwritten in place is seen by the next call (bitwise equal to a fresh
  copy of the new weight), as it is under requantize;
- a routed call captured in a CUDA graph replays with the engine's bits for new inputs and for a
  weight changed in place (requantize and frozen), and a capture with no warm-up falls back with
  the reason "capture" and still gives cuBLAS's result.
Skips (not passes) without torch or a GPU.
"""
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shim_child import ROOT, harness, need_gpu, reference_gemm, run_child  # noqa: E402

CHILD = os.path.join(ROOT, "tests", "gpu", "routed_child.py")
TMP = tempfile.mkdtemp(prefix="mt_routed_")
N, K = 256, 512


def child(case, tag, cache="requantize", shim=True):
    """Run a case; returns (arrays, stats summary or None)."""
    minite = dict(MINITE_SPEC="nvfp4-row", MINITE_ROUTE=f"{N}x{K}", MINITE_WEIGHT_CACHE=cache)
    arrays, _, summary = run_child(CHILD, case, tag, TMP, minite if shim else None)
    harness.check(not shim or summary is not None, f"{tag}: no statistics summary")
    return arrays, summary


def routed_linear_matches_the_reference():
    need_gpu()
    got, summary = child("linear", "linear")
    w = got["w"]
    for m in (1, 7, 64, 300):
        x, y = got[f"x{m}"], got[f"y{m}"].astype(np.float64)
        ref = reference_gemm(x, w)
        # FP32 accumulation of exact block sums (docs/numerics.md, the FP32-accumulation bound); the
        # sum of |x||w| stands for the dequantized products' (each within a factor 2 of x w), and
        # 2^-8 is BF16 output
        bound = (K / 16 + 4) * 2.0 ** -23 * 2 * (np.abs(x) @ np.abs(w).T) + 2.0 ** -8 * np.abs(ref)
        worst = float(np.max(np.abs(y - ref) / np.maximum(bound, 1e-30)))
        print(f"    M={m}: worst error {worst:.3f} of the bound")
        harness.check(np.all(np.abs(y - ref) <= bound),
                      f"M={m}: error over the bound ({worst:.3f})")
    if summary:
        harness.check(summary["routed"] == 4, f"routed {summary['routed']} of 4, "
                                               f"fallbacks {summary['fallbacks']}")


def frozen_weight_overwritten_in_place_is_seen():
    need_gpu()
    frozen, sf = child("inplace", "inplace_frozen", "frozen")
    requant, _ = child("inplace", "inplace_requantize", "requantize")
    harness.check(not np.array_equal(frozen["y1"], frozen["y2"]), "the new weight changed nothing")
    harness.check(np.array_equal(frozen["y2"], frozen["y3"]),
                  "frozen: after an in-place overwrite the output differs from a fresh copy's")
    for k in ("y1", "y2", "y3"):
        harness.check(np.array_equal(frozen[k], requant[k]), f"frozen and requantize differ in {k}")
    if sf:
        harness.check(sf["routed"] == 3 and sf["engine"]["frozen_weights"] == 2,
                      f"frozen run: routed {sf['routed']}, engine {sf['engine']}")


def graph_replays_routed_calls(cache):
    need_gpu()
    got, summary = child("graph", "graph_" + cache, cache)
    for i in range(3):
        harness.check(np.array_equal(got[f"replay{i}"], got[f"eager{i}"]),
                      f"{cache}: replay {i} differs from the eager call on the same inputs")
    if summary:
        harness.check("capture" not in summary["fallbacks"] and summary["routed"] >= 5,
                      f"{cache}: routed {summary['routed']}, fallbacks {summary['fallbacks']}")


def graph_requantize():
    graph_replays_routed_calls("requantize")


def graph_frozen():
    graph_replays_routed_calls("frozen")


def cold_capture_falls_back_to_cublas():
    need_gpu()
    got, summary = child("graph_cold", "graph_cold")
    plain, _ = child("graph_cold", "graph_cold_plain", shim=False)
    harness.check(np.array_equal(got["replay0"], plain["replay0"]),
                  "the fallen-back captured call is not cuBLAS's result")
    if summary:
        harness.check(summary["fallbacks"].get("capture", 0) == 1,
                      f"fallbacks {summary['fallbacks']}: expected one 'capture'")


for t in (routed_linear_matches_the_reference, frozen_weight_overwritten_in_place_is_seen,
          graph_requantize, graph_frozen, cold_capture_falls_back_to_cublas):
    harness.run(t)
sys.exit(harness.done())
