"""test_grouped_mm.py — the MoE calls real PyTorch programs make reach the shim (issue "Grouped
front doors"): torch._grouped_mm (HF transformers' default experts) through the hook of its sm90
kernel entry, and batched cuBLAS forms as one grouped call.

    make && make build/tests/cpu/nvfp4_tool && python3 tests/gpu/test_grouped_mm.py      (H200)

Each case runs tests/gpu/grouped_child.py in a process of its own, with and without
LD_PRELOAD=build/libminite.so, and checks:
- HF Qwen3-MoE with its default experts (grouped_mm), a learner step (forward + backward) and a
  greedy generate: under MINITE_SPEC=bf16, every tensor bitwise equal to the run without the shim
  (PyTorch run twice alone first: deterministic here), the census names "torch grouped_mm" calls,
  the expert shapes are suggested routes; with the routes given, forward expert calls count as
  routed and the backward ones as "backward dgrad"/"backward wgrad".
- the same learner step under nvfp4-row with the expert routes, MINITE_PROBE=1 and
  MINITE_DIGEST=1: forward expert calls routed, backward passing through as backward, loss within
  2% of BF16's, the grouped calls probed (rows > 0) with no probed row differing, digests written.
- torch._grouped_mm directly, random routings (an expert with no token, one with one): under bf16
  bit-exact; under nvfp4-row within the reference bound of ref/nvfp4.c, bitwise equal to each
  expert's rows run as their own routed F.linear, and one engine GEMM launch for the call.
- a capacity-style MoE through torch.bmm (cublasGemmStridedBatchedEx; with
  TORCH_BLAS_PREFER_CUBLASLT=1 an Lt matmul with a batch count): under nvfp4-row every call
  routed, bitwise equal to each expert's routed F.linear, a captured graph replaying what eager
  calls give; one engine GEMM launch per call; the batched call's shadow error (rerun through
  cuBLAS) computed, never skipped as "entry", between 0.05 and 0.25.
- the instruments of grouped calls: the same rows through the same experts in a learner-like
  process (one torch._grouped_mm with offsets, requantize) and a sampler-like one (expert 0 as
  F.linear, the rest over two grouped calls, frozen-sampled), plus a 3-D call in both: every row
  digested in both, all matched by tools/minite-compare and 100% bitwise equal, the outputs equal,
  the probe of each process at 0 of >= 8 rows differing, the shadow of torch._grouped_mm calls
  (8 rows a call against the product the instruments' kernel forms: no cuBLAS call to rerun)
  never skipped as "entry", its relative L2 between 0.05 and 0.25.
Skips (not passes) without torch, transformers or a GPU.
"""
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shim_child import (ROOT, compare, harness, need_gpu, reference_bound,  # noqa: E402
                        reference_gemm, route_stats, run_child, run_tests)

CHILD = os.path.join(ROOT, "tests", "gpu", "grouped_child.py")
TMP = tempfile.mkdtemp(prefix="mt_grouped_")
ROUTE = "256x512"
DETERMINISM = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "TORCH_BLAS_PREFER_CUBLASLT": None}


def need_transformers():
    try:
        import transformers  # noqa: F401
    except ImportError:
        harness.skip("transformers is not installed")


def child(case, tag, minite=None, extra=None):
    arrays, files, summary = run_child(CHILD, case, tag, TMP, minite,
                                       dict(DETERMINISM, **(extra or {})))
    if minite is not None:
        harness.check(len(files) == 1 and summary is not None, f"{tag}: no statistics summary")
    return arrays, summary or {}


def info(arrays):
    return json.loads(arrays["info"].tobytes().decode())


def same(a, b, what, keys=None):
    keys = [k for k in a.files if k not in ("info", "launches")] if keys is None else keys
    differ = [k for k in keys if a[k].shape != b[k].shape or a[k].tobytes() != b[k].tobytes()]
    harness.check(not differ,
                  f"{what}: {len(differ)} of {len(keys)} arrays differ, e.g. {differ[:4]}")
    return not differ


def grouped_rows(summary):
    return [c for c in summary.get("census", []) if c["entry"] == "torch grouped_mm"]


# ---- HF Qwen3-MoE, default experts -----------------------------------------------------------

def hf_bf16(case):
    need_gpu()
    need_transformers()
    base1, _ = child(case, f"{case}_base1")
    base2, _ = child(case, f"{case}_base2")
    if not same(base1, base2, f"{case}: PyTorch alone, twice"):
        harness.skip(f"{case}: PyTorch is not deterministic here; no bitwise comparison possible")
    meta = info(base1)
    print(f"    experts implementation: {meta['experts_implementation']}")
    impl = meta["experts_implementation"]  # per sub-config ({"": "grouped_mm"}) in transformers 5
    kinds = set(impl.values()) if isinstance(impl, dict) else {impl}
    harness.check(kinds == {"grouped_mm"}, f"the default experts are {impl}, not grouped_mm")
    shim, summary = child(case, f"{case}_bf16", dict(MINITE_SPEC="bf16"))
    same(base1, shim, f"{case}: bf16 under the shim vs without")
    rows = grouped_rows(summary)
    print(f"    census: {len(rows)} torch grouped_mm rows of {len(summary.get('census', []))}")
    harness.check(rows, f"{case}: no torch grouped_mm call in the census "
                        f"{[c['entry'] for c in summary.get('census', [])]}")
    for route in meta["routes"].split(","):
        harness.check(f"route {route}" in summary.get("suggested_routes", []),
                      f"{case}: {route} not suggested: {summary.get('suggested_routes')}")
    routed, rsum = child(case, f"{case}_bf16_routed", dict(MINITE_SPEC="bf16",
                                                          MINITE_ROUTE=meta["routes"]))
    same(base1, routed, f"{case}: bf16 with the expert routes vs without the shim")
    fb = rsum.get("fallbacks", {})
    print(f"    routed {rsum.get('routed')}, fallbacks {fb}")
    harness.check(rsum.get("routed", 0) > 0, f"{case}: no forward expert call counted routed")
    if case == "hf_train":
        harness.check(fb.get("backward dgrad", 0) > 0 and fb.get("backward wgrad", 0) > 0,
                      f"{case}: backward grouped calls not recognised: {fb}")


def hf_train_bf16_bitwise():
    hf_bf16("hf_train")


def hf_generate_bf16_bitwise():
    hf_bf16("hf_generate")


def hf_train_nvfp4_routes_forward_experts():
    need_gpu()
    need_transformers()
    base, _ = child("hf_train", "hf_train_ref")
    routes = info(base)["routes"]
    got, summary = child("hf_train", "hf_train_nvfp4",
                         dict(MINITE_SPEC="nvfp4-row", MINITE_ROUTE=routes, MINITE_PROBE="1",
                              MINITE_DIGEST="1"))
    fb = summary.get("fallbacks", {})
    print(f"    routed {summary.get('routed')}, fallbacks {fb}")
    harness.check(fb.get("backward dgrad", 0) > 0 and fb.get("backward wgrad", 0) > 0,
                  f"backward grouped calls not passed through as backward: {fb}")
    harness.check(summary.get("routed", 0) > 0, "no forward expert call routed")
    loss, ref = float(got["loss"]), float(base["loss"])
    print(f"    loss {loss:.5f}, BF16 {ref:.5f}")
    harness.check(abs(loss - ref) <= 0.02 * abs(ref), f"loss {loss} more than 2% from BF16's {ref}")
    probes = summary.get("instruments", {}).get("routes", {})
    differing = sum(r.get("probe", {}).get("differing", 0) for r in probes.values())
    probed = sum(r.get("probe", {}).get("rows", 0) for r in probes.values())
    calls = sum(r.get("probe", {}).get("calls", 0) for r in probes.values())
    skipped = summary.get("instruments", {}).get("probe", {}).get("skipped", {})
    # the model's expert calls are all grouped: every probed row is a grouped call's
    print(f"    probe: {calls} calls, {differing} of {probed} rows differ, skipped {skipped}")
    harness.check(probed > 0, f"no grouped call probed: {summary.get('instruments')}")
    harness.check(differing == 0, f"probe: {differing} of {probed} rows differ")
    dig = summary.get("digests", {})
    print(f"    digests {dig}")
    harness.check(dig.get("written", 0) > 0, f"no digest of a grouped call: {dig}")


# ---- torch._grouped_mm directly ----------------------------------------------------------------

def direct_bf16_bitwise():
    need_gpu()
    base, _ = child("direct", "direct_base")
    shim, summary = child("direct", "direct_bf16", dict(MINITE_SPEC="bf16", MINITE_ROUTE=ROUTE))
    same(base, shim, "direct: bf16 under the shim vs without", ["y", "y3", "per_call"])
    rows = grouped_rows(summary)
    harness.check(any(r["ops"] == "TN" and r["m"] == 256 and r["k"] == 512 and r["batch"] == 8
                      for r in rows), f"direct: census rows {rows}")


def direct_nvfp4_is_the_per_call_engine():
    need_gpu()
    got, summary = child("direct", "direct_nvfp4",
                         dict(MINITE_SPEC="nvfp4-row", MINITE_ROUTE=ROUTE))
    print(f"    routed {summary.get('routed')}, fallbacks {summary.get('fallbacks')}")
    ends = got["offs"].tolist()
    x, w, y = got["x"], got["w"], got["y"].astype(np.float64)
    start = 0
    for e, end in enumerate(ends):
        if end > start:
            ref = reference_gemm(x[start:end], w[e])
            err = np.abs(y[start:end] - ref)
            harness.check(np.all(err <= reference_bound(x[start:end], w[e], ref)),
                          f"expert {e}: error over the reference bound")
        start = end
    harness.check(np.array_equal(got["y"].view(np.uint8), got["per_call"].view(np.uint8)),
                  "the grouped call's rows differ from each expert's own routed F.linear")
    harness.check(int(got["launches"]) == 1,
                  f"{int(got['launches'])} engine GEMM launches for one grouped call")


# ---- capacity MoE through bmm: strided batched, and Lt with a batch count ---------------------

def bmm_case(lt):
    need_gpu()
    tag = "bmm_lt" if lt else "bmm"
    extra = {"TORCH_BLAS_PREFER_CUBLASLT": "1"} if lt else {}
    got, summary = child("bmm", tag, dict(MINITE_SPEC="nvfp4-row", MINITE_ROUTE=ROUTE), extra)
    fb = summary.get("fallbacks", {})
    entry = "cublasLtMatmul" if lt else "cublasGemmStridedBatchedEx"
    rows = [c for c in summary.get("census", []) if c["entry"] == entry and c.get("batch") == 8]
    print(f"    routed {summary.get('routed')}, fallbacks {fb}, engine launches per call "
          f"{int(got['launches'])}")
    harness.check(rows, f"{tag}: no {entry} call of batch 8 in the census")
    harness.check(summary.get("routed", 0) >= 4 + 8 and not fb,
                  f"{tag}: routed {summary.get('routed')}, fallbacks {fb}")
    harness.check(np.array_equal(got["y"].view(np.uint8), got["per_call"].view(np.uint8)),
                  f"{tag}: the batched call differs from each expert's own routed F.linear")
    for i in range(2):
        harness.check(np.array_equal(got[f"replay{i}"].view(np.uint8),
                                     got[f"eager{i}"].view(np.uint8)),
                      f"{tag}: graph replay {i} differs from the eager call")
    harness.check(int(got["launches"]) == 1,
                  f"{tag}: {int(got['launches'])} engine GEMM launches per batched call, not one")
    # the first call of the route (the batched one) gets the shadow at the default rate: a strided
    # batch reruns through cuBLAS, so none is skipped as "entry"; NVFP4 W4A4 on Gaussian operands
    # is about 0.13 off BF16 (tests/gpu/test_instruments.py)
    ins = summary.get("instruments", {})
    shadow = ins.get("routes", {}).get(ROUTE, {}).get("shadow", {})
    print(f"    shadow {shadow}, skipped {ins.get('shadow', {}).get('skipped')}")
    harness.check(shadow.get("calls", 0) >= 1 and
                  not ins.get("shadow", {}).get("skipped", {}).get("entry"),
                  f"{tag}: the batched call got no shadow: {ins.get('shadow')}")
    harness.check(0.05 < (shadow.get("rel_l2_max") or 0) < 0.25,
                  f"{tag}: shadow rel-L2 {shadow.get('rel_l2_max')} outside 0.05 .. 0.25")


def bmm_strided_batched_routed_and_captured():
    bmm_case(False)


def lt_batched_routed_and_captured():
    bmm_case(True)


# ---- the instruments of grouped calls -------------------------------------------------------

def grouped_digests_join_across_batchings_and_paths():
    """Learner-like process A (one grouped call, requantize) and sampler-like process B (the same
    rows over F.linear and two grouped calls, frozen-sampled): every row digested in both, every
    one matched by minite-compare and bitwise equal (nvfp4-row); the probe of both at 0 rows
    differing; the shadow of every call (torch._grouped_mm's on 8 rows) in NVFP4's range."""
    need_gpu()
    minite = dict(MINITE_SPEC="nvfp4-row", MINITE_ROUTE=ROUTE, MINITE_DIGEST="1",
                  MINITE_PROBE="1", MINITE_SHADOW="1")
    a, fa, sa = run_child(CHILD, "digest", "digest_a", TMP, dict(minite), {"MT_BATCHING": "one"})
    b, fb, sb = run_child(CHILD, "digest", "digest_b", TMP,
                          dict(minite, MINITE_WEIGHT_CACHE="frozen-sampled"),
                          {"MT_BATCHING": "split"})
    rows = int(a["counts"].sum()) + 8 * 8
    harness.check(np.array_equal(a["y"].view(np.uint8), b["y"].view(np.uint8)),
                  "the two batchings' outputs differ")
    for tag, s in (("A", sa), ("B", sb)):
        dig, probe = s.get("digests", {}), route_stats(s, ROUTE, "probe")
        shadow = route_stats(s, ROUTE, "shadow")
        print(f"    {tag}: digests {dig}, probe {probe}, shadow {shadow}, skipped "
              f"{s.get('instruments', {}).get('shadow', {}).get('skipped')}")
        harness.check(dig.get("written") == rows and dig.get("dropped") == 0,
                      f"{tag}: digests {dig}, want {rows} written")
        harness.check(probe.get("rows", 0) >= 8 and probe.get("differing") == 0,
                      f"{tag}: probe {probe}")
        harness.check(not s.get("instruments", {}).get("shadow", {}).get("skipped", {})
                      .get("entry") and shadow.get("calls", 0) >= 2,
                      f"{tag}: grouped calls not shadowed: {s.get('instruments', {})}")
        harness.check(0.05 < (shadow.get("rel_l2_mean") or 0) and
                      (shadow.get("rel_l2_max") or 1) < 0.25,
                      f"{tag}: shadow rel-L2 {shadow} outside 0.05 .. 0.25")
    total = compare(fa[-1], fb[-1])["total"]
    print(f"    matched {total['matched']} of {rows}, equal {total['equal_pct']}%")
    harness.check(total["matched"] == rows, f"{total['matched']} of {rows} rows matched")
    harness.check(total["equal_pct"] == 100.0, f"{total['equal_pct']}% of matched rows equal")


def main():
    return run_tests((hf_train_bf16_bitwise, hf_generate_bf16_bitwise,
              hf_train_nvfp4_routes_forward_experts, direct_bf16_bitwise,
              direct_nvfp4_is_the_per_call_engine, bmm_strided_batched_routed_and_captured,
              lt_batched_routed_and_captured, grouped_digests_join_across_batchings_and_paths), TMP)


if __name__ == "__main__":
    sys.exit(main())
