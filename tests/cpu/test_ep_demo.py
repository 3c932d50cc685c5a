"""test_ep_demo.py — demo/ep_demo.py where there is no GPU: bad arguments are refused (exit 2), and
without torch it says to install it (exit 1). Where torch and transformers are installed (not in
CI), two ranks of a tiny geometry run on the CPU over gloo under torchrun (--cpu-smoke), in both
layouts: every rank writes its result, the expert split holds half the experts on each rank, the
two ranks together run every token's top-k expert rows once, and the expert-parallel losses agree
with the data-parallel ones (the same tokens through the same weights, only batched otherwise).
"""
import glob
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import harness  # noqa: E402

DEMO = os.path.join(ROOT, "demo", "ep_demo.py")
TMP = harness.temp_dir("mt-ep-demo-")


def have_torch():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def run(*args, launcher=()):
    res = subprocess.run([sys.executable] + list(launcher) + [DEMO] + [str(a) for a in args],
                         capture_output=True, text=True, cwd=TMP, timeout=600)
    return res.returncode, res.stdout, res.stderr


def test_bad_arguments():
    for args in (["--mode", "tp"], ["--mode", ""], ["--layers", "0"], ["--steps", "-1"],
                 ["--experts", "cutlass"]):
        rc, out, err = run(*args)
        harness.check(rc == 2 and "ep_demo.py" in err and out == "", f"{args}: exit {rc}: {err}")
    rc, out, err = run("--mode", "tp")
    harness.check("ddp, ep" in err, f"the message names the modes: {err}")


def test_without_torch():
    if have_torch():
        harness.skip("torch is installed here")
    rc, out, err = run("--out", TMP)
    harness.check(rc == 1 and "pip install torch transformers" in err and out == "",
                  f"exit {rc}: {err}")


def test_two_ranks_on_the_cpu():
    if not have_torch():
        harness.skip("torch and transformers are not installed (CI): the CPU smoke run needs them")
    out = os.path.join(TMP, "smoke")
    batch, seq, k = 2, 16, 2
    rc, stdout, err = run("--cpu-smoke", "--mode", "ddp,ep", "--out", out, "--batch", batch,
                          "--seq", seq, "--steps", 2, "--layers", 2,
                          launcher=("-m", "torch.distributed.run", "--standalone",
                                    "--nproc-per-node=2"))
    harness.check(rc == 0, f"exit {rc}: {err[-3000:]}")
    res = {}
    for path in glob.glob(os.path.join(out, "rank*-*.json")):
        with open(path) as f:
            r = json.load(f)
        res[(r["mode"], r["rank"])] = r
    harness.check(sorted(res) == [("ddp", 0), ("ddp", 1), ("ep", 0), ("ep", 1)], str(sorted(res)))
    if len(res) != 4:
        return
    rows = batch * seq * k * 2  # tokens x top-k x layers
    harness.check(res[("ep", 0)]["experts_held"] == [0, 4] and
                  res[("ep", 1)]["experts_held"] == [4, 8], "the split")
    harness.check(res[("ep", 0)]["expert_rows_step0"] + res[("ep", 1)]["expert_rows_step0"] ==
                  2 * rows, f"EP rows {[res[('ep', r)]['expert_rows_step0'] for r in (0, 1)]}")
    harness.check(all(res[("ddp", r)]["expert_rows_step0"] == rows for r in (0, 1)), "DDP rows")
    for r in (0, 1):
        d, e = res[("ddp", r)], res[("ep", r)]
        harness.check(d["finite"] and e["finite"] and d["world"] == 2 and d["backend"] == "gloo",
                      str(d))
        for step, (a, b) in enumerate(zip(d["losses"], e["losses"])):
            harness.check(abs(a - b) <= 2e-2 * abs(a),
                          f"rank {r} step {step}: DDP loss {a}, EP loss {b}")
    summary = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else {}
    harness.check(summary.get("world") == 2 and set(summary.get("modes", {})) == {"ddp", "ep"},
                  f"rank 0's line: {stdout}")


for t in (test_bad_arguments, test_without_torch, test_two_ranks_on_the_cpu):
    harness.run(t)
sys.exit(harness.done())
