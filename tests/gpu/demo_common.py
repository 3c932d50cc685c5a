"""demo_common.py — what the GPU tests of the demos (test_demo_learner.py, test_demo_sampler.py,
test_multi_gpu.py) share: skip without torch or a GPU, run a demo as a child process with or
without the shim preloaded, read its JSON summary and the shim's summary record. Not a test itself
(tests/run runs only test_*.py).
"""
import glob
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPTS = os.path.join(ROOT, "demo")
TOOLS = os.path.join(ROOT, "tools")
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, SCRIPTS)
sys.path.insert(0, TOOLS)
import harness  # noqa: E402

LIB = os.path.abspath(os.path.join(ROOT, os.environ.get("MT_BUILD", "build"), "libminite.so"))
ROUTE = "1536x2048,2048x768"
TMP = tempfile.mkdtemp(prefix="mt-gpu-demo-")


def probe_torch(expr):
    """What a child Python that imported torch and transformers prints for `expr`; skips (not
    fails) when they cannot be imported."""
    probe = f"import torch, transformers; print({expr})"
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    if res.returncode != 0:
        harness.skip("torch/transformers not importable: " +
                     (res.stderr.strip().splitlines() or ["?"])[-1])
    return res.stdout.strip()


def require_lib():
    if not os.path.exists(LIB):
        raise AssertionError(f"{LIB} not found: build it with make")


def require_gpu():
    """Skip (not fail) without torch, transformers or a CUDA GPU; fail without the library."""
    if probe_torch("torch.cuda.is_available()") != "True":
        harness.skip("torch sees no CUDA GPU")
    require_lib()


def records(path):
    """The start and the summary record of a statistics file (None where missing)."""
    start = summary = None
    with open(path, errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if isinstance(rec, dict) and rec.get("event") == "start":
                start = rec
            elif isinstance(rec, dict) and rec.get("event") == "summary":
                summary = rec
    return start, summary


def run_demo(name, args, spec=None, role="learner", tag=None, extra=None):
    """Run demo/<name> (with the shim under `spec`, and the MINITE_* variables of `extra`);
    returns (rc, summary or None, stats summary record or None, stderr)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("LD_PRELOAD", None)
    for key in [k for k in env if k.startswith("MINITE_")]:
        del env[key]
    stats_glob = None
    if spec:
        tag = tag or f"{spec}-{role}"
        env.update(LD_PRELOAD=LIB, MINITE_SPEC=spec, MINITE_ROUTE=ROUTE, MINITE_ROLE=role,
                   MINITE_STATS=os.path.join(TMP, f"stats-{tag}-%p.jsonl"))
        env.update(extra or {})
        stats_glob = os.path.join(TMP, f"stats-{tag}-*.jsonl")
    argv = [sys.executable, os.path.join(SCRIPTS, name)] + [str(a) for a in args]
    res = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=TMP, timeout=900)
    summary = None
    for line in res.stdout.splitlines():
        if line.startswith("{"):
            try:
                summary = json.loads(line)
            except ValueError:
                pass
    if res.returncode != 0:
        print(f"    {name} ({spec or 'no shim'}) exit {res.returncode}; stderr tail:\n" +
              "\n".join("      " + x for x in res.stderr.splitlines()[-20:]))
    stats = None
    if stats_glob:
        for path in sorted(glob.glob(stats_glob), key=os.path.getmtime)[-1:]:
            stats = records(path)[1]
    return res.returncode, summary, stats, res.stderr


def path(name):
    return os.path.join(TMP, name)
