"""test_torch_passthrough.py — PyTorch under the shim with MINITE_SPEC=bf16 computes bit for bit
what it computes without it.

    make && python3 tests/gpu/test_torch_passthrough.py        (from the repo root, on a GPU)

For each workload of torch_child.py (F.linear without and with bias, bmm, and a small random
Qwen3-MoE from transformers with eager experts, forward and backward), and for
TORCH_BLAS_PREFER_CUBLASLT unset and =1, runs a child process twice without the shim (to show that
PyTorch itself is deterministic there) and once with LD_PRELOAD=build/libminite.so
MINITE_SPEC=bf16 MINITE_STATS=..., and compares every saved tensor bitwise. It also checks the
statistics: the expected entry point was intercepted, and the MoE run's census suggests the
expert shapes as routes; a second MoE run with those routes counts routed forward calls and
backward dgrad/wgrad fallbacks. Skips (not passes) without torch, transformers or a GPU.
"""
import glob
import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import harness  # noqa: E402
from shim_child import run_tests  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.environ.get("MT_BUILD", "build")
LIB = os.path.join(ROOT, BUILD, "libminite.so")
CHILD = os.path.join(ROOT, "tests", "gpu", "torch_child.py")
TMP = tempfile.mkdtemp(prefix="mt_torch_")

try:
    import torch
    HAVE_CUDA = torch.cuda.is_available()
except ImportError:
    torch = None
    HAVE_CUDA = False

try:
    import transformers  # noqa: F401
    HAVE_TRANSFORMERS = True
except ImportError:
    HAVE_TRANSFORMERS = False


def need_gpu():
    if torch is None:
        harness.skip("torch is not installed")
    if not HAVE_CUDA:
        harness.skip("no CUDA device")
    if not os.path.exists(LIB):
        raise RuntimeError(f"{LIB} missing: run make first")


def child(case, tag, lt, shim, extra_env=None):
    """Run one workload; returns (path of the saved tensors, stats summary or None)."""
    out = os.path.join(TMP, f"{tag}.pt")
    stats_dir = os.path.join(TMP, tag + ".stats")
    os.makedirs(stats_dir, exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MINITE_") and k != "TORCH_BLAS_PREFER_CUBLASLT"}
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    if lt:
        env["TORCH_BLAS_PREFER_CUBLASLT"] = "1"
    if shim:
        # Appended, as a user would, to whatever LD_PRELOAD the environment already has.
        env["LD_PRELOAD"] = (env["LD_PRELOAD"] + ":" if env.get("LD_PRELOAD") else "") + LIB
        env["MINITE_SPEC"] = "bf16"
        env["MINITE_STATS"] = os.path.join(stats_dir, "stats.%p.jsonl")
    env.update(extra_env or {})
    proc = subprocess.run([sys.executable, CHILD, case, out], env=env, capture_output=True,
                          text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{tag}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    if shim and "minite WARN" in proc.stderr:
        print(f"    {tag}: shim warnings:\n{proc.stderr[-2000:]}")
    summary = None
    files = glob.glob(os.path.join(stats_dir, "stats.*.jsonl"))
    if shim:
        harness.check(len(files) == 1, f"{tag}: {len(files)} stats files, expected 1")
        if files:
            lines = [json.loads(line) for line in open(files[0])]
            harness.check(lines and lines[0]["event"] == "start", f"{tag}: no start record")
            harness.check(lines and lines[-1]["event"] == "summary", f"{tag}: no summary record")
            summary = lines[-1] if lines else None
    return out, summary


def bitwise_equal(a_path, b_path, what):
    a, b = torch.load(a_path), torch.load(b_path)
    if a.keys() != b.keys():
        harness.check(False, f"{what}: different tensors saved")
        return False
    def raw(t):  # the bytes: NaNs compare equal to themselves, -0.0 differs from 0.0
        return t.contiguous().reshape(-1).view(torch.uint8)
    differing = [k for k in a if a[k].shape != b[k].shape or a[k].dtype != b[k].dtype
                 or not torch.equal(raw(a[k]), raw(b[k]))]
    harness.check(not differing, f"{what}: {len(differing)} of {len(a)} tensors differ, "
                                 f"e.g. {differing[:5]}")
    return not differing


# the entry point each workload must reach (docs/design.md, "Interposition facts measured on the
# H200")
ENTRY = {
    ("linear", False): "cublasGemmEx",
    ("linear_bias", False): "cublasLtMatmul",
    ("bmm", False): "cublasGemmStridedBatchedEx",
    ("moe", False): "cublasGemmEx",
}


def compare(case, lt):
    need_gpu()
    if case == "moe" and not HAVE_TRANSFORMERS:
        harness.skip("transformers is not installed")
    tag = f"{case}_lt{int(lt)}"
    # the three runs are independent processes: run them side by side (most of each is start-up)
    with ThreadPoolExecutor(3) as pool:
        runs = [pool.submit(child, case, tag + suffix, lt, shim)
                for suffix, shim in (("_base1", False), ("_base2", False), ("_shim", True))]
        (base1, _), (base2, _), (shimmed, summary) = [r.result() for r in runs]
    if not bitwise_equal(base1, base2, f"{tag}: PyTorch alone, run twice"):
        harness.skip(f"{tag}: PyTorch is not deterministic here without the shim; "
                     "no bitwise comparison is possible")
    print(f"    {tag}: {summary and summary['gemm_calls']} GEMM calls through the shim")
    bitwise_equal(base1, shimmed, f"{tag}: with the shim vs without")
    if not summary:
        return
    harness.check(summary["gemm_calls"] > 0, f"{tag}: the shim saw no GEMM")
    harness.check(summary["routed"] == 0 and not summary["fallbacks"],
                  f"{tag}: no routes given, yet routed/fallbacks: {summary['fallbacks']}")
    entries = {c["entry"] for c in summary["census"]}
    want = "cublasLtMatmul" if lt else ENTRY[(case, False)]
    harness.check(want in entries, f"{tag}: {want} not in the census entries {sorted(entries)}")
    if case == "moe":
        info = json.load(open(base1 + ".info.json"))
        print(f"    experts implementation: {info['experts_implementation']}")
        for route in info["expert_routes"]:
            harness.check(f"route {route}" in summary["suggested_routes"],
                          f"{tag}: expert shape {route} not in suggested_routes "
                          f"{summary['suggested_routes']}")
        routed_run(tag, lt, info["expert_routes"], base1)


def routed_run(tag, lt, routes, base):
    """With the expert shapes routed (bf16: cuBLAS still computes them), forward expert GEMMs
    count as routed and their backward GEMMs as dgrad/wgrad fallbacks; results stay identical."""
    out, summary = child("moe", tag + "_routed", lt, True, {"MINITE_ROUTE": ",".join(routes)})
    bitwise_equal(base, out, f"{tag}: routed run vs without the shim")
    if not summary:
        return
    fb = summary["fallbacks"]
    print(f"    {tag} routed: {summary['routed']} routed, fallbacks {fb}")
    harness.check(summary["routed"] > 0, f"{tag}: no expert GEMM routed")
    harness.check(fb.get("backward dgrad", 0) > 0 and fb.get("backward wgrad", 0) > 0,
                  f"{tag}: backward GEMMs not recognised: {fb}")


def make_test(case, lt):
    def test():
        compare(case, lt)
    test.__name__ = f"{case}_{'cublaslt' if lt else 'default_backend'}_bitwise"
    return test


def main():
    return run_tests([make_test(case, lt) for case in ("linear", "linear_bias", "bmm", "moe")
                      for lt in (False, True)], TMP)


if __name__ == "__main__":
    sys.exit(main())
