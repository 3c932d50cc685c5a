"""demo_cpu.py — what the CPU tests of the demos (test_demo_scripts.py, test_demo_server.py)
share: the paths, whether torch and transformers are here, a driver that runs a demo's main() on
the CPU with a tiny geometry, and the check that a learner's log-probs match a sampler's. Not a
test itself (the Makefile runs only test_*.py).
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPTS = os.path.join(ROOT, "demo")
TOOLS = os.path.join(ROOT, "tools")
sys.path.insert(0, os.path.join(ROOT, "tests"))
sys.path.insert(0, SCRIPTS)
sys.path.insert(0, TOOLS)
import harness  # noqa: E402


def have_torch():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


# `python3 tiny.py sampler|learner|server ARGS`: that demo's main(ARGS), on the CPU, the model
# shrunk to a geometry the CPU runs in seconds.
TINY = """
import sys
sys.path.insert(0, {scripts!r})
import demo_model, demo_sampler, demo_learner, demo_server
demo_model.DEVICE = "cpu"
demo_model.GEOMETRY.update(vocab_size=512, hidden_size=64, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=32, num_experts=8,
                           num_experts_per_tok=2, moe_intermediate_size=32)
main = {{"sampler": demo_sampler.main, "learner": demo_learner.main,
         "server": demo_server.main}}[sys.argv[1]]
sys.exit(main(sys.argv[2:]))
"""


def tiny_driver(directory):
    """Write the TINY driver into `directory`; its path."""
    path = os.path.join(directory, "tiny.py")
    with open(path, "w") as f:
        f.write(TINY.format(scripts=SCRIPTS))
    return path


def gap_within(learner, sampler, cwd):
    """The sampler computes what the learner's full forward computes: on the CPU their log-probs
    agree (a wrong position, mask or cache slot moves them by O(1)). gap-report's metrics, or
    None when it failed."""
    res = subprocess.run([sys.executable, os.path.join(TOOLS, "gap-report"), "--json", learner,
                          sampler], capture_output=True, text=True, cwd=cwd, timeout=600)
    harness.check(res.returncode == 0, f"gap-report: exit {res.returncode}: {res.stderr}")
    if res.returncode != 0:
        return None
    m = json.loads(res.stdout)["runs"][0]["metrics"]
    harness.check(m["abs_dlogp_max"] < 0.02, f"gap on CPU {learner} / {sampler}: {m}")
    return m
