"""test_vllm_moe.py — vLLM's Triton MoE kernel through the launch door (shim/launch.h, shim/vllm.h),
on the real kernel, run by the device's Triton exactly as vLLM launches it.

    make && make build/tests/cpu/nvfp4_tool && make vllm-sources &&
        python3 tests/gpu/test_vllm_moe.py

vLLM is not installed: `make vllm-sources` (on a machine that reaches the package registry) puts the
kernel files of pinned releases into build/third_party, which travels to the device; the children
(tests/gpu/vllm_child.py) import them with the rest of vLLM stubbed (tests/gpu/vllm_sources.py) and
call vLLM's own launcher, invoke_fused_moe_triton_kernel, with vLLM's own config for the shape. A
small layer (64 experts, top-4, w13 256x512, w2 512x128) at 1 and 3 tokens (vLLM's naive dispatch)
and 40 and 300 (its sorted one), GEMM1 launched as TritonExperts does and as fused_experts() does,
GEMM2 with the router weights multiplied, and the layer captured in a CUDA graph.

- under bf16: every output bitwise the run without the shim; the launches counted as routed
  calls of "vllm fused_moe_kernel" in the census, the expert shapes suggested as routes;
- under nvfp4-row (frozen-sampled, as a sampler runs): every launch routed, none falls back; the
  door logs the constants it decoded, and they are the launcher's (block_m, top_k); GEMM1's rows
  within ref/nvfp4.c's bound of the CPU reference, whichever way it was launched;
- the learner's rows: the same pairs through torch._grouped_mm under nvfp4-row in another process
  (HF transformers' grouped_mm experts): GEMM1's rows bitwise vLLM's; GEMM2's rows, rounded then
  times the router weight in FP32 and rounded again, bitwise vLLM's; the row digests of the two
  processes joined by minite-compare: every matched row bitwise equal;
- the captured layer's replays bitwise what eager launches give;
- vLLM 0.8.5's kernel (a layout outside the door's table) and SGLang's of the same name: under
  nvfp4-row nothing routed, every output bitwise the run without the shim, the launches counted
  as "triton layout" and "sglang kernel" (or "triton layout" where Triton's image has no line
  table to tell SGLang's by).
Skips (not passes) without torch, triton, the vLLM sources or a GPU.
"""
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shim_child import (ROOT, compare, harness, need_gpu, reference_bound,  # noqa: E402
                        reference_gemm, run_child, run_tests)

CHILD = os.path.join(ROOT, "tests", "gpu", "vllm_child.py")
SOURCES = os.path.join(ROOT, os.environ.get("MT_BUILD", "build"), "third_party", ".stamp")
TMP = tempfile.mkdtemp(prefix="mt_vllm_")
E, TOPK, H, I = 64, 4, 512, 128
TOKENS = (1, 3, 40, 300)
ROUTES = f"{2 * I}x{H},{H}x{I}"
NVFP4 = dict(MINITE_SPEC="nvfp4-row", MINITE_ROUTE=ROUTES, MINITE_LOG_LEVEL="INFO")
# A call keeps at most 128 digested rows (shim/instr_writer.h, MT_IW_ROWS), each side the first to
# claim a place, so at rate 1 the 1,200 rows of T = 300 keep different subsets in the two
# processes; at 1/16 about 75 are picked (by content: the same rows on both sides), under the cap.
# Every call is looked at (MINITE_DIGEST_CALLS=all): by default the calls of 4 and 12 rows, fewer
# than 16, would be sampled by each process's count of rows, and the two processes' calls differ.
DIGEST = dict(MINITE_DIGEST="1/16", MINITE_DIGEST_CALLS="all")


def need_sources():
    need_gpu()
    try:
        import triton  # noqa: F401
    except ImportError:
        harness.skip("triton is not installed")
    if not os.path.exists(SOURCES):
        harness.skip("no vLLM sources: run `make vllm-sources` where the package registry is "
                     "reachable and carry build/third_party")


_runs = {}


def child(case, tag, minite=None, extra=None):
    """One child run (its log in TMP/TAG.log), kept for the other tests that compare with it."""
    if tag not in _runs:
        if minite is not None:
            minite = dict(minite, MINITE_LOG_FILE=os.path.join(TMP, tag + ".log"))
        arrays, files, summary = run_child(CHILD, case, tag, TMP, minite, extra)
        _runs[tag] = (arrays, files, summary or {})
    return _runs[tag]


def log_of(tag):
    path = os.path.join(TMP, tag + ".log")
    return open(path).read() if os.path.exists(path) else ""


def bits(a):
    return a.astype(np.float32).view(np.uint32)


def same(a, b, keys, what):
    differ = [k for k in keys
              if a[k].shape != b[k].shape or not np.array_equal(bits(a[k]), bits(b[k]))]
    harness.check(not differ,
                  f"{what}: {len(differ)} of {len(keys)} arrays differ, e.g. {differ[:4]}")


def output_keys(arrays):
    return [k for k in arrays.files if k.startswith(("c1", "c2", "a2", "replay", "eager"))]


def fallbacks(summary):
    return summary.get("fallbacks", {})


def vllm_bf16_bitwise_and_counted():
    need_sources()
    base, _, _ = child("vllm", "base")
    shim, _, summary = child("vllm", "bf16", dict(MINITE_SPEC="bf16", MINITE_ROUTE=ROUTES))
    same(base, shim, output_keys(base), "bf16 under the shim against no shim")
    rows = [c for c in summary.get("census", []) if c["entry"] == "vllm fused_moe_kernel"]
    print(f"    routed {summary.get('routed')}, fallbacks {fallbacks(summary)}, census {rows[:3]}")
    harness.check(rows and all(c["batch"] >= E for c in rows), f"census: {rows}")
    harness.check(summary.get("routed", 0) >= 3 * len(TOKENS) and not fallbacks(summary),
                  f"routed {summary.get('routed')}, fallbacks {fallbacks(summary)}")
    harness.check(f"route {2 * I}x{H}" in summary.get("suggested_routes", []),
                  f"suggested routes {summary.get('suggested_routes')}")


def sampler():
    return child("vllm", "nvfp4", dict(NVFP4, MINITE_WEIGHT_CACHE="frozen-sampled", **DIGEST))


def pairs_by_expert(arr, t):
    ids = arr[f"ids{t}"].reshape(-1)
    return {e: np.nonzero(ids == e)[0] for e in range(E) if (ids == e).any()}


def vllm_nvfp4_routed_within_the_reference():
    need_sources()
    got, files, summary = sampler()
    print(f"    routed {summary.get('routed')}, fallbacks {fallbacks(summary)}")
    harness.check(summary.get("routed", 0) >= 3 * len(TOKENS) and not fallbacks(summary),
                  f"routed {summary.get('routed')}, fallbacks {fallbacks(summary)}")
    w13 = got["w13"]
    worst = 0.0
    for t in TOKENS:
        x = got[f"x{t}"]
        c1 = got[f"c1_{t}"].reshape(-1, 2 * I).astype(np.float64)
        harness.check(np.array_equal(bits(got[f"c1_{t}"]), bits(got[f"c1w_{t}"])),
                      f"T={t}: GEMM1 with router weights given differs from without")
        for e, p in pairs_by_expert(got, t).items():
            xr = x[p // TOPK]
            ref = reference_gemm(xr, w13[e])
            err = np.abs(c1[p] - ref)
            bound = reference_bound(xr, w13[e], ref)
            harness.check(np.all(err <= bound), f"T={t} expert {e}: error over the reference bound")
            worst = max(worst, float(np.max(err / np.maximum(bound, 1e-30))))
    print(f"    GEMM1 rows: worst error {worst:.3f} of the bound")


def decoded_constants_are_the_launchers():
    need_sources()
    got, files, summary = sampler()
    lines = [line for line in log_of("nvfp4").splitlines() if "decoded:" in line]
    print("    " + "\n    ".join(lines[:8]))
    harness.check(lines, "the door logged no decoded function")
    for t in TOKENS:
        bm = int(got[f"block_m{t}"])
        harness.check(any(f"BLOCK_SIZE_M {bm}," in line for line in lines),
                      f"T={t}: no function of block_m {bm}")
    harness.check(any("naive" in line for line in lines)
                  and any("parameters sorted" in line for line in lines),
                  "not both dispatches decoded")
    harness.check(any("top_k 4, MUL_ROUTED_WEIGHT 0" in line for line in lines) and
                  any("top_k 1, MUL_ROUTED_WEIGHT 1" in line for line in lines),
                  "GEMM1's or GEMM2's constants")


def sampler_rows_bitwise_the_learners():
    need_sources()
    got, sfiles, _ = sampler()
    learner, lfiles, lsummary = child("learner", "learner", dict(NVFP4, **DIGEST),
                                      {"MT_GEMM2_FROM": os.path.join(TMP, "nvfp4.npz")})
    print(f"    learner routed {lsummary.get('routed')}, fallbacks {fallbacks(lsummary)}")
    for t in TOKENS:
        c1 = got[f"c1_{t}"].reshape(-1, 2 * I)
        harness.check(np.array_equal(bits(c1), bits(learner[f"y1_{t}"])),
                      f"T={t}: GEMM1 rows differ from the learner's torch._grouped_mm rows")
        import torch
        y2 = torch.from_numpy(learner[f"y2_{t}"])
        w = torch.from_numpy(got[f"w{t}"].reshape(-1, 1))
        want = (y2.to(torch.bfloat16).float() * w).to(torch.bfloat16).float().numpy()
        c2 = got[f"c2_{t}"].reshape(-1, H)
        harness.check(np.array_equal(bits(c2), bits(want)),
                      f"T={t}: GEMM2 rows differ from the learner's rows times the router weight")
    total = compare(lfiles[-1], sfiles[-1])["total"]
    print(f"    digests: learner {total['rows_a']}, sampler {total['rows_b']}, matched "
          f"{total['matched']}, equal {total['equal_pct']}%")
    # every row the sampler digested, the learner digested too (the learner also digests its GEMM2,
    # whose rows the sampler's kernel multiplies by the router weight: no expert's own rows there)
    harness.check(0 < total["matched"] == total["rows_b"] <= total["rows_a"],
                  f"learner {total['rows_a']}, sampler {total['rows_b']}, "
                  f"matched {total['matched']}: "
                  "rows picked by content must be picked on both sides")
    harness.check(total["equal_pct"] == 100.0, f"{total['equal_pct']}% of matched rows equal")


def captured_replays_equal_eager():
    need_sources()
    got, _, _ = sampler()
    for t in TOKENS:
        harness.check(np.array_equal(bits(got[f"replay_c1_{t}"]), bits(got[f"eager_c1_{t}"])) and
                      np.array_equal(bits(got[f"replay_c2_{t}"]), bits(got[f"eager_c2_{t}"])),
                      f"T={t}: the captured layer's replay differs from eager launches")


def passes_through(case, reasons):
    need_sources()
    try:
        base, _, _ = child(case, case + "_base")
    except RuntimeError as e:
        harness.check(False, f"{case}: the kernel did not run without the shim: {str(e)[-600:]}")
        return
    got, _, summary = child(case, case + "_nvfp4", NVFP4)
    fb = fallbacks(summary)
    print(f"    routed {summary.get('routed')}, fallbacks {fb}")
    same(base, got, list(base.files), f"{case}: nvfp4-row against no shim")
    harness.check(summary.get("routed", 0) == 0 and sum(fb.get(r, 0) for r in reasons) >= 2,
                  f"{case}: routed {summary.get('routed')}, fallbacks {fb}")


def version_outside_the_table_unchanged():
    passes_through("old", ["triton layout"])


def sglang_passes_through_unchanged():
    passes_through("sglang", ["sglang kernel", "triton layout"])


def main():
    return run_tests((vllm_bf16_bitwise_and_counted, vllm_nvfp4_routed_within_the_reference,
              decoded_constants_are_the_launchers, sampler_rows_bitwise_the_learners,
              captured_replays_equal_eager, version_outside_the_table_unchanged,
              sglang_passes_through_unchanged), TMP)


if __name__ == "__main__":
    sys.exit(main())
