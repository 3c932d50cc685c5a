"""shim_child.py — what the GPU tests that run a workload in a child process under the shim share
(test_routed.py, test_instruments.py, test_grouped_mm.py, and for their C programs and JAX child
test_reliability.py, test_ptr_arrays.py and test_jax_moe.py): the paths, the skip without torch or
a GPU, a child's environment under the shim, running one case of a child script or a C program
with the shim preloaded and reading its statistics, the CPU reference GEMM, and joining two
statistics files with minite-compare.
The child scripts (routed_child.py, instr_child.py) use its child half: rand, f32, child_main.
Not a test itself (tests/run runs only test_*.py).
"""
import glob
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness  # noqa: E402

BUILD = os.environ.get("MT_BUILD", "build")
LIB = os.path.join(ROOT, BUILD, "libminite.so")
TOOL = os.path.join(ROOT, BUILD, "tests", "cpu", "nvfp4_tool")
COMPARE = os.path.join(ROOT, "tools", "minite-compare")

# ---- the parent's half ---------------------------------------------------------------------


def need_gpu():
    """Skip (not pass) without torch or a CUDA device; fail without the library or the tool."""
    try:
        import torch
    except ImportError:
        harness.skip("torch is not installed")
    if not torch.cuda.is_available():
        harness.skip("no CUDA device")
    for path, how in ((LIB, "make"), (TOOL, f"make {BUILD}/tests/cpu/nvfp4_tool")):
        if not os.path.exists(path):
            raise RuntimeError(f"{path} missing: run {how} first")


def shim_env(tag, tmp, minite=None, extra=None):
    """A child's environment: the caller's without its MINITE_* and `extra` keys; the shim
    preloaded with `minite` (a dict of MINITE_* settings; the statistics go to tmp/TAG.PID.jsonl)
    unless minite is None; then `extra` (a value None unsets it)."""
    drop = set(extra or {})
    env = {k: v for k, v in os.environ.items() if not k.startswith("MINITE_") and k not in drop}
    if minite is not None:
        env["LD_PRELOAD"] = (env["LD_PRELOAD"] + ":" if env.get("LD_PRELOAD") else "") + LIB
        env.update(minite, MINITE_STATS=os.path.join(tmp, tag + ".%p.jsonl"))
    env.update({k: v for k, v in (extra or {}).items() if v is not None})
    return env


def last_summary(tag, tmp):
    """The summary record of the last of tmp/TAG.*.jsonl that ends with one, or None."""
    summary = None
    for f in sorted(glob.glob(os.path.join(tmp, tag + ".*.jsonl"))):
        records = [json.loads(line) for line in open(f)]
        if records and records[-1].get("event") == "summary":
            summary = records[-1]
    return summary


def run_child(script, case, tag, tmp, minite=None, extra=None):
    """Run `script CASE OUT.npz` in its own process, in shim_env(tag, tmp, minite, extra).
    Returns (arrays, statistics files, the last file's summary record or None)."""
    out = os.path.join(tmp, tag + ".npz")
    proc = subprocess.run([sys.executable, script, case, out],
                          env=shim_env(tag, tmp, minite, extra),
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"{tag}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    files = sorted(glob.glob(os.path.join(tmp, tag + ".*.jsonl")))
    summary = None
    for f in files:
        lines = [json.loads(line) for line in open(f)]
        summary = lines[-1] if lines and lines[-1].get("event") == "summary" else None
    return np.load(out), files, summary


def run_app(cmd, out, tag, tmp, minite=None, extra=None, timeout=600):
    """Run the C program `cmd` (whose output file is `out`, uint16 words) in shim_env(tag, tmp,
    minite, extra). Returns (exit status, its "#info KEY VALUE" lines as a dict, the output words,
    last_summary or {}, stderr)."""
    proc = subprocess.run(cmd, env=shim_env(tag, tmp, minite, extra), capture_output=True,
                          text=True, timeout=timeout)
    info = {}
    for line in proc.stdout.splitlines():
        if line.startswith("#info "):
            _, key, value = line.split(" ", 2)
            info[key] = int(value)
    data = np.fromfile(out, dtype=np.uint16) if os.path.exists(out) else np.zeros(0, np.uint16)
    return proc.returncode, info, data, last_summary(tag, tmp) or {}, proc.stderr


def reference_gemm(x, w):
    """ref/nvfp4.c's GEMM (double, unrounded) for y = x w^T under nvfp4-row (per-row activation
    scale, per-tensor weight scale, 1x16 blocks), through tests/cpu/nvfp4_tool."""
    (m, k), n = x.shape, w.shape[0]
    args = [TOOL, "gemm", str(m), str(n), str(k), "row", "tensor", "1x16",
            float(1.0).hex(), float(0.0).hex(), "0", "0"]
    data = x.astype(np.float32).tobytes() + w.astype(np.float32).tobytes()
    proc = subprocess.run(args, input=data, capture_output=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"nvfp4_tool: {proc.stderr.decode()}")
    return np.frombuffer(proc.stdout, dtype=np.float64).reshape(m, n)


def reference_bound(x, w, ref):
    """The largest error ref/nvfp4.c allows a GPU result of reference_gemm(x, w) = ref: FP32
    accumulation over k / 16 block sums and the epilogue's roundings, then the output's BF16
    rounding (docs/numerics.md)."""
    k = x.shape[1]
    return (k / 16 + 4) * 2.0 ** -23 * 2 * (np.abs(x) @ np.abs(w).T) + 2.0 ** -8 * np.abs(ref)


def compare(a, b):
    """minite-compare's JSON document for the statistics files a and b."""
    proc = subprocess.run([sys.executable, COMPARE, a, b, "--json"], capture_output=True,
                          text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"minite-compare exit {proc.returncode}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)


def route_stats(summary, route, what):
    """The instrument `what` (probe, shadow, ...) of `route` in a summary record; {} when absent."""
    return summary.get("instruments", {}).get("routes", {}).get(route, {}).get(what, {})

def run_tests(tests, tmp):
    """Run each test through the harness; remove tmp when all passed (kept for inspection when
    one failed). Returns the harness's exit status."""
    for t in tests:
        harness.run(t)
    if not harness._failed:
        subprocess.run(["rm", "-rf", tmp])
    else:
        print(f"    kept {tmp} for inspection")
    return harness.done()

# ---- the child's half (torch is imported here only, inside the child process) -----------------


def rand(*shape, seed):
    """Gaussian BF16 on the GPU from a seeded generator: the same values in every process."""
    import torch
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32).to(torch.bfloat16)


def f32(t):
    return t.float().cpu().numpy()


def child_main(cases):
    """A child script's entry point: argv = CASE OUT; runs cases[CASE]() and saves its arrays."""
    import torch
    case, path = sys.argv[1], sys.argv[2]
    result = cases[case]()
    torch.cuda.synchronize()
    np.savez(path, **result)
