"""test_jax_moe.py — an unmodified JAX MoE program under the shim (issue "Grouped front doors"):
XLA's CUDA plugin dlopens cuBLAS and cuBLASLt and looks every entry point up with dlsym, which the
shim answers with its hooks (shim/dl.h).

    make && python3 tests/gpu/test_jax_moe.py        (H200, JAX with its CUDA plugin)

tests/gpu/jax_child.py (a capacity einsum over an expert axis, jax.lax.ragged_dot, per-expert
dots; weights 256 x 512) runs with XLA_FLAGS=--xla_gpu_enable_triton_gemm=false (so that cuBLAS
gets the dots), --xla_gpu_autotune_level=0 (one algorithm, the same in every run) and
--xla_gpu_enable_cublaslt=true, then =false, and --xla_gpu_enable_command_buffer= (none: see
child()). For each setting:
- without the shim twice (XLA deterministic here, else skipped), then under MINITE_SPEC=bf16 with
  the route 256x512: every result bitwise equal, the census sees the program's GEMM calls (Lt
  under cublaslt=true; XLA 0.11 calls Lt under false too) and counts the expert forward calls
  routed (XLA gives the weight as a row-order A with op N, which the shim reads as op T);
- under nvfp4-row with the route: the expert calls routed (routed > 0; the fallbacks printed); the
  capacity and per-expert results within the reference bound of ref/nvfp4.c (nvfp4_tool) for
  every expert, and bitwise equal to each other (a row's bits do not depend on the call form);
  ragged_dot (not an expert call the route names) bitwise equal to BF16;
- the same expert layers written as a Flax user writes them (kernels stored [in, out]: a capacity
  einsum and per-expert dots on W_io [E, 512, 256]): under bf16 bitwise BF16's, in the census as
  "forward [in, out]"; under nvfp4-row routed, within the reference bound per expert and bitwise
  equal to the [out, in] forms' rows (the engine reads the weight transposed into the same bits).
And across frameworks: the JAX program's row digests under nvfp4-row (MINITE_DIGEST=1/4) join those
of the same rows through torch._grouped_mm in a PyTorch process (tests/gpu/grouped_child.py
jax_rows), as a JAX learner's and a PyTorch sampler's would: every row PyTorch digested is in the
JAX file, bitwise equal.
Skips (not passes) without JAX or a GPU.
"""
import glob
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shim_child import (HERE, LIB, TOOL, compare, harness, last_summary,  # noqa: E402
                        reference_bound, reference_gemm, run_child, run_tests, shim_env)

CHILD = os.path.join(HERE, "jax_child.py")
GROUPED_CHILD = os.path.join(HERE, "grouped_child.py")
TMP = tempfile.mkdtemp(prefix="mt_jax_")
ROUTE = "256x512"
KEYS = ("capacity", "ragged", "per_expert", "capacity_io", "per_expert_io")


def need_jax_gpu():
    probe = "import jax; print(jax.default_backend())"
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false"))
    if res.returncode != 0:
        harness.skip("JAX is not importable: " + (res.stderr.strip().splitlines() or ["?"])[-1])
    if res.stdout.strip() != "gpu":
        harness.skip(f"JAX's backend is {res.stdout.strip()}, not gpu")
    for path in (LIB, TOOL):
        if not os.path.exists(path):
            raise RuntimeError(f"{path} missing: run make && make build/tests/cpu/nvfp4_tool first")


def child(tag, lt, minite=None):
    """Run jax_child.py; returns (its arrays, the last statistics file's summary or {})."""
    out = os.path.join(TMP, tag + ".npz")
    # no autotuning: one algorithm per GEMM, the same in every run (and no timing of candidates)
    # no command buffers: XLA adds a captured cuBLAS call to its graph as a child graph, which may
    # hold no memory allocation, and a routed call captured there allocates graph memory
    xla = dict(XLA_PYTHON_CLIENT_PREALLOCATE="false",
               XLA_FLAGS=("--xla_gpu_enable_triton_gemm=false --xla_gpu_autotune_level=0 "
                          "--xla_gpu_enable_command_buffer= "
                          f"--xla_gpu_enable_cublaslt={'true' if lt else 'false'}"))
    proc = subprocess.run([sys.executable, CHILD, out], env=shim_env(tag, TMP, minite, xla),
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{tag}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    if minite is not None and "minite WARN" in proc.stderr:
        print(f"    {tag}: shim warnings:\n{proc.stderr[-1500:]}")
    summary = last_summary(tag, TMP)
    if minite is not None:
        harness.check(summary is not None, f"{tag}: no statistics summary (no GEMM call seen?)")
    return np.load(out), summary or {}


def equal(a, b):
    return all(np.array_equal(a[k].view(np.uint8), b[k].view(np.uint8)) for k in KEYS)


def run_setting(lt):
    need_jax_gpu()
    name = f"cublaslt_{'on' if lt else 'off'}"
    base1, _ = child(name + "_base1", lt)
    base2, _ = child(name + "_base2", lt)
    if not equal(base1, base2):
        harness.skip(f"{name}: XLA alone gives different bits twice; no bitwise comparison")
    bf16, summary = child(name + "_bf16", lt, dict(MINITE_SPEC="bf16", MINITE_ROUTE=ROUTE))
    differ = [k for k in KEYS
              if not np.array_equal(base1[k].view(np.uint8), bf16[k].view(np.uint8))]
    harness.check(not differ, f"{name}: bf16 under the shim differs in {differ}")
    entries = sorted({c["entry"] for c in summary.get("census", [])})
    print(f"    {name} bf16: {summary.get('gemm_calls')} GEMM calls, "
          f"routed {summary.get('routed')}, "
          f"entries {entries}, fallbacks {summary.get('fallbacks')}")
    for c in summary.get("census", []):
        print(f"      {c}")
    harness.check(summary.get("gemm_calls", 0) > 0, f"{name}: the shim saw no GEMM call")
    if lt:  # XLA 0.11 calls cuBLASLt for these dots whatever the flag says; false is not checked
        harness.check("cublasLtMatmul" in entries, f"{name}: no cublasLtMatmul in {entries}")
    harness.check(summary.get("routed", 0) > 0, f"{name}: no expert call counted routed under bf16")
    roles = [c.get("role", "") for c in summary.get("census", [])]
    harness.check(any(r.startswith("forward [in, out]") for r in roles),
                  f"{name}: no [in, out] forward in the census (roles {sorted(set(roles))})")
    fp4, s4 = child(name + "_nvfp4", lt, dict(MINITE_SPEC="nvfp4-row", MINITE_ROUTE=ROUTE))
    print(f"    {name} nvfp4-row: routed {s4.get('routed')}, fallbacks {s4.get('fallbacks')}")
    harness.check(s4.get("routed", 0) > 0, f"{name}: no expert call routed under nvfp4-row")
    harness.check(not equal(base1, fp4), f"{name}: nvfp4-row gave BF16's bits everywhere")
    check_nvfp4(name, base1, fp4)


def check_nvfp4(name, base, fp4):
    x, w = fp4["x"].astype(np.float64), fp4["w"].astype(np.float64)
    for k in ("capacity", "per_expert", "capacity_io", "per_expert_io"):
        worst = 0.0
        for e in range(x.shape[0]):
            ref = reference_gemm(x[e], w[e])
            err = np.abs(fp4[k][e].astype(np.float64) - ref) / reference_bound(x[e], w[e], ref)
            worst = max(worst, float(err.max()))
        rel = np.linalg.norm(fp4[k] - base[k]) / max(np.linalg.norm(base[k]), 1e-30)
        print(f"      {k}: error / reference bound at most {worst:.3f}; "
              f"relative L2 to BF16 {rel:.4f}")
        harness.check(worst <= 1.0, f"{name} {k}: error {worst:.3f} times the reference bound")
    harness.check(np.array_equal(fp4["capacity"].view(np.uint8), fp4["per_expert"].view(np.uint8)),
                  f"{name}: the capacity batch's rows differ from the per-expert dots'")
    for k in ("capacity_io", "per_expert_io"):
        harness.check(not np.array_equal(fp4[k].view(np.uint8), base[k].view(np.uint8)),
                      f"{name}: {k} ([in, out] kernels) gave BF16's bits: not routed")
        harness.check(np.array_equal(fp4["capacity"].view(np.uint8), fp4[k].view(np.uint8)),
                      f"{name}: {k} ([in, out] kernels) differs from the [out, in] rows")
    harness.check(np.array_equal(fp4["ragged"].view(np.uint8), base["ragged"].view(np.uint8)),
                  f"{name}: ragged_dot (not routed) differs from BF16")


def cublaslt_on():
    run_setting(True)


def cublaslt_off():
    run_setting(False)


def joins_torch_grouped_mm():
    need_jax_gpu()
    minite = dict(MINITE_SPEC="nvfp4-row", MINITE_ROUTE=ROUTE, MINITE_DIGEST="1/4")
    got, _ = child("join_jax", True, minite)
    jax_files = sorted(glob.glob(os.path.join(TMP, "join_jax.*.jsonl")))
    _, torch_files, summary = run_child(GROUPED_CHILD, "jax_rows", "join_torch", TMP, minite,
                                        {"MT_NPZ": os.path.join(TMP, "join_jax.npz")})
    harness.check(len(jax_files) == 1 and len(torch_files) == 1,
                  f"statistics files: JAX {jax_files}, PyTorch {torch_files}")
    if len(jax_files) != 1 or len(torch_files) != 1:
        return
    total = compare(torch_files[0], jax_files[0])["total"]
    print(f"    PyTorch rows {total['rows_a']}, JAX rows {total['rows_b']}, matched "
          f"{total['matched']}, equal {total['equal_pct']}%; "
          f"PyTorch routed {(summary or {}).get('routed')}")
    harness.check(0 < total["matched"] == total["rows_a"],
                  f"{total['matched']} of PyTorch's {total['rows_a']} rows in the JAX file")
    harness.check(total["equal_pct"] == 100.0,
                  f"{total['equal_pct']}% of the joined rows bitwise equal, want 100")
    harness.check(total["inconsistent_b"] == 0,  # JAX's four routed forms of each row agree
                  f"{total['inconsistent_b']} JAX rows with two different hashes")
    harness.check(got["x"].shape[0] * got["x"].shape[1] > total["rows_a"],
                  "the rate 1/4 chose every row: the rows were not chosen by content")


def main():
    return run_tests((cublaslt_on, cublaslt_off, joins_torch_grouped_mm), TMP)


if __name__ == "__main__":
    sys.exit(main())
