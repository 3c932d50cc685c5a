"""test_bench_moe_torch.py — the Python MoE bench where there is no GPU: its routing (every token
to 8 distinct experts, the ends torch._grouped_mm takes), its bench library (exactly the mtb_*
functions exported; the store's size at the bench's shapes within the 0.6 bytes an element of
"NVFP4 economics"; a launch without a GPU refused with a status, not a crash) and its messages
(without torch: say so and exit 1; a bad argument: exit 2). The timing itself needs the device
machine (`make bench`).
"""
import os
import random
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import harness  # noqa: E402
import bench_moe_torch as bench  # noqa: E402

BUILD = os.path.join(ROOT, os.environ.get("MT_BUILD", "build"))
LIB = os.path.join(BUILD, "bench", "libmt_bench.so")
SCRIPT = os.path.join(ROOT, "bench", "bench_moe_torch.py")
TMP = harness.temp_dir("mt-bench-torch-")


def test_routing():
    rng = random.Random(7)
    for experts, tokens in ((128, 1), (128, 16), (256, 300)):
        rows = bench.routing_rows(experts, tokens, rng)
        harness.check(len(rows) == experts and sum(rows) == bench.TOPK * tokens,
                      f"{experts} experts, {tokens} tokens: {sum(rows)} rows")
        # distinct experts a token: no expert gets more rows than there are tokens
        harness.check(max(rows) <= tokens, f"an expert has {max(rows)} rows of {tokens} tokens")
        ends = bench.cumulative_ends(rows)
        harness.check(ends[-1] == sum(rows) and all(a <= b for a, b in zip(ends, ends[1:])),
                      "the ends are not cumulative")
    harness.check(bench.routing_rows(8, 1, rng).count(1) == 8, "one token over 8 experts: all 8")


# Run in a child: under SAN=1 the library needs the sanitizer's runtime loaded first.
LIB_CHECK = r"""
import ctypes, sys
sys.path.insert(0, sys.argv[2])
import bench_moe_torch as bench
lib = bench.load_lib(sys.argv[1])
for experts, hidden, width in bench.GEOMETRIES.values():
    for n, k in ((2 * width, hidden), (hidden, width)):
        size = lib.mtb_store_bytes(experts, n, k)
        print("store", n, k, size / (experts * n * k))
print("bad", lib.mtb_store_bytes(4, 64, 40))
print("ws", lib.mtb_workspace_bytes(8, 2048))
st = lib.mtb_grouped(4, 256, 256, 1 << 12, 1 << 16, 8, 1 << 20, 1 << 21, 1 << 22, 1 << 20, None)
print("launch", st, lib.mtb_status(st).decode())
"""


def preload_env():
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=0")
    first = os.path.join(BUILD, "tests", "cpu", "fake", "preload_first.txt")
    if os.path.exists(first):
        with open(first) as f:
            path = f.read().strip()
        if path:
            env["LD_PRELOAD"] = path
    return env


def test_library():
    if not harness.check(os.path.exists(LIB), f"{LIB} not built (make bench-build)"):
        return
    nm = subprocess.run(["nm", "-D", "--defined-only", LIB], capture_output=True, text=True)
    exported = sorted(line.split()[-1] for line in nm.stdout.splitlines()
                      if line.split()[-2:-1] and line.split()[-2] in "TDB")
    harness.check(exported == ["mtb_dispatched", "mtb_grouped", "mtb_lists_bytes", "mtb_status",
                               "mtb_store_bytes", "mtb_store_quantize", "mtb_workspace_bytes"],
                  f"exports {exported}")
    res = subprocess.run([sys.executable, "-c", LIB_CHECK, LIB, os.path.join(ROOT, "bench")],
                         capture_output=True, text=True, env=preload_env(), timeout=120)
    if not harness.check(res.returncode == 0, f"exit {res.returncode}: {res.stderr[-2000:]}"):
        return
    lines = [line.split() for line in res.stdout.splitlines()]
    stores = [float(w[3]) for w in lines if w[0] == "store"]
    harness.check(len(stores) == 4 and all(0.5625 <= s <= 0.6 for s in stores),
                  f"store bytes an element {stores}")
    harness.check(["bad", "0"] in lines, "k = 40 (not a multiple of 16) gives a store size")
    harness.check(any(w[0] == "ws" and int(w[1]) > 0 for w in lines), "no workspace size")
    launch = next((w for w in lines if w[0] == "launch"), None)
    harness.check(launch is not None and launch[1] != "0" and
                  " ".join(launch[2:]) in ("no CUDA driver", "no sm_90 device"),
                  f"a launch without a GPU: {launch}")


def test_messages():
    fake = os.path.join(TMP, "notorch")
    os.makedirs(fake, exist_ok=True)
    with open(os.path.join(fake, "torch.py"), "w") as f:
        f.write("raise ImportError('no torch here')\n")
    env = dict(os.environ, PYTHONPATH=fake)
    res = subprocess.run([sys.executable, SCRIPT, os.path.join(TMP, "out.json")],
                         capture_output=True, text=True, env=env, timeout=60)
    harness.check(res.returncode == 1 and "needs PyTorch" in res.stderr and not res.stdout,
                  f"without torch: exit {res.returncode}, {res.stderr!r}, {res.stdout!r}")
    res = subprocess.run([sys.executable, SCRIPT, "--tokens", "7"], capture_output=True,
                         text=True, env=env, timeout=60)
    harness.check(res.returncode == 2 and "--tokens" in res.stderr,
                  f"--tokens 7: exit {res.returncode}, {res.stderr!r}")


if __name__ == "__main__":
    harness.run(test_routing)
    harness.run(test_library)
    harness.run(test_messages)
    sys.exit(harness.done())
