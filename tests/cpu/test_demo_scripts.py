"""test_demo_scripts.py — the demo programs and the `make run` driver where there is no GPU:
run_demo.py says so in one line and exits 0; the demos reject bad arguments (exit 2) and bad
input files (exit 1, before touching torch) with messages that say what to do; without torch they
say to install it. Where torch and transformers are installed (not in CI), the real HF code paths
run too, on the CPU with a tiny geometry: sampler -> learner --logprobs and --train -> gap-report.
"""
import json
import os
import shutil
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
import logprobs  # noqa: E402

TMP = harness.temp_dir("mt-demo-")


def script(name, *args, env=None):
    res = subprocess.run([sys.executable, os.path.join(SCRIPTS, name)] + [str(a) for a in args],
                         capture_output=True, text=True, env=env, cwd=TMP, timeout=600)
    return res.returncode, res.stdout, res.stderr


def have_torch():
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def test_run_demo_without_gpu_says_so_and_succeeds():
    if shutil.which("nvidia-smi"):
        harness.skip("nvidia-smi is here: `make run` would run the demos (GPU machine)")
    out_dir = os.path.join(TMP, "run")
    rc, out, err = script("run_demo.py", "--out", out_dir)
    harness.check(rc == 0, f"exit {rc}, expected 0: {err}")
    lines = out.strip().splitlines()
    harness.check(len(lines) == 1 and "no GPU" in lines[0], f"one line saying so: {out!r}")
    harness.check(not os.path.exists(out_dir), "nothing written without a GPU")


def test_bad_arguments_exit_2():
    cases = [
        ("demo_sampler.py",),                                  # --out missing
        ("demo_sampler.py", "--out", "x.jsonl", "--batch", "0"),
        ("demo_sampler.py", "--out", "x.jsonl", "--layers", "two"),
        ("demo_learner.py",),                                  # nothing to do
        ("demo_learner.py", "--train", "--steps", "-1"),
        ("demo_learner.py", "--logprobs", "only-one-file"),
        ("run_demo.py", "--specs", "none"),
        ("run_demo.py", "--specs", ""),
    ]
    for args in cases:
        rc, out, err = script(*args)
        harness.check(rc == 2, f"{args}: exit {rc}, expected 2 ({err.strip()[-150:]})")
    for name in ("demo_sampler.py", "demo_learner.py", "run_demo.py", "demo_model.py"):
        rc, out, err = script(name, "--help")
        harness.check(rc == 0 and "usage" in out, f"{name} --help: exit {rc}")


def write_sampler_file(name, role="sampler", layers=2):
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        logprobs.write_header(f, role, "none", {"name": "qwen3-moe-random", "layers": layers,
                                                "seed": 0, "init_std": 0.02}, 0)
        logprobs.write_seq(f, 0, [5, 6], [-1.0, -2.0], prompt=[1, 2, 3])
    return path


def test_learner_refuses_bad_input_before_loading_a_model():
    rc, out, err = script("demo_learner.py", "--logprobs", "missing.jsonl", "out.jsonl")
    harness.check(rc == 1 and "cannot read" in err, f"missing file: exit {rc}: {err}")
    not_logprobs = os.path.join(TMP, "notes.txt")
    with open(not_logprobs, "w") as f:
        f.write("hello\n")
    rc, out, err = script("demo_learner.py", "--logprobs", not_logprobs, "out.jsonl")
    harness.check(rc == 1 and "not a minite-logprobs file" in err, f"wrong file: exit {rc}: {err}")
    learner_file = write_sampler_file("learner-role.jsonl", role="learner")
    rc, out, err = script("demo_learner.py", "--logprobs", learner_file, "out.jsonl")
    harness.check(rc == 1 and "role learner" in err, f"role: exit {rc}: {err}")
    four = write_sampler_file("four-layers.jsonl", layers=4)
    rc, out, err = script("demo_learner.py", "--logprobs", four, "out.jsonl", "--layers", "2")
    harness.check(rc == 1 and "layers 4" in err and "--layers" in err,
                  f"conflicting --layers: exit {rc}: {err}")
    harness.check(not os.path.exists(os.path.join(TMP, "out.jsonl")), "no output on refusal")


def test_demos_without_torch_say_what_to_install():
    if have_torch():
        harness.skip("torch and transformers are installed here")
    rc, out, err = script("demo_sampler.py", "--out", "s.jsonl")
    harness.check(rc == 1 and "torch is not installed" in err, f"sampler: exit {rc}: {err}")
    rc, out, err = script("demo_learner.py", "--train")
    harness.check(rc == 1 and "torch is not installed" in err, f"learner: exit {rc}: {err}")


TINY = """
import sys
sys.path.insert(0, {scripts!r})
import demo_model, demo_sampler, demo_learner
demo_model.DEVICE = "cpu"
demo_model.GEOMETRY.update(vocab_size=512, hidden_size=64, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=32, num_experts=8,
                           num_experts_per_tok=2, moe_intermediate_size=32)
main = {{"sampler": demo_sampler.main, "learner": demo_learner.main}}[sys.argv[1]]
sys.exit(main(sys.argv[2:]))
"""


def test_tiny_model_through_the_real_hf_calls_on_cpu():
    if not have_torch():
        harness.skip("torch/transformers not installed (the demos' HF calls run on the GPU box)")
    driver = os.path.join(TMP, "tiny.py")
    with open(driver, "w") as f:
        f.write(TINY.format(scripts=SCRIPTS))

    def tiny(*args):
        res = subprocess.run([sys.executable, driver] + [str(a) for a in args],
                             capture_output=True, text=True, cwd=TMP, timeout=600)
        summary = json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else None
        harness.check(res.returncode == 0, f"{args[0]}: exit {res.returncode}: {res.stderr}")
        return summary
    s = tiny("sampler", "--out", "s.jsonl", "--batch", 3, "--prompt-len", 5, "--new-tokens", 6)
    if s is None:
        return
    harness.check(s["tokens"] == 18 and s["tokens_per_s"] > 0 and s["logprobs_finite"], str(s))
    sampled = logprobs.read(os.path.join(TMP, "s.jsonl"))
    harness.check(sorted(sampled.seqs) == [0, 1, 2], f"sequences {sorted(sampled.seqs)}")
    harness.check(all(len(x.tokens) == 6 and len(x.prompt) == 5 for x in sampled.seqs.values()),
                  "6 sampled tokens after a 5-token prompt")
    harness.check(all(-20 < v < 0 for x in sampled.seqs.values() for v in x.logprobs),
                  "log-probs of a 512-token vocabulary are negative and finite")
    learner = tiny("learner", "--logprobs", "s.jsonl", "l.jsonl", "--train", "--batch", 2,
                   "--seq", 16, "--steps", 2, "--warmup", 1)
    if learner is None:
        return
    harness.check(learner["finite"] and len(learner["losses"]) == 3, str(learner))
    harness.check(learner["layers"] == 2 and learner["scored_tokens"] == 18, str(learner))
    rc, out, err = script("gap-report", "--json", "l.jsonl", "s.jsonl")
    harness.check(rc == 0, f"gap-report: exit {rc}: {err}")
    if rc == 0:
        m = json.loads(out)["runs"][0]["metrics"]
        harness.check(m["tokens"] == 18 and m["abs_dlogp_max"] < 0.5, f"gap on CPU: {m}")


SITECUSTOMIZE = TINY.split("main = ")[0] + """
if sys.argv and sys.argv[0] == "-c":  # run_demo's GPU probe
    import torch
    torch.cuda.is_available = lambda: True
"""


def test_make_run_driver_on_cpu_with_a_pretend_gpu():
    if not have_torch():
        harness.skip("torch/transformers not installed")
    lib = os.path.join(ROOT, os.environ.get("MT_BUILD", "build"), "libminite.so")
    if not os.path.exists(lib):
        harness.skip(f"{lib} not built")
    fake = os.path.join(TMP, "fake")
    os.makedirs(os.path.join(fake, "bin"), exist_ok=True)
    smi = os.path.join(fake, "bin", "nvidia-smi")
    with open(smi, "w") as f:
        f.write("#!/bin/sh\necho 'GPU 0: pretend'\n")
    os.chmod(smi, 0o755)
    with open(os.path.join(fake, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE.format(scripts=SCRIPTS))
    env = dict(os.environ, PATH=os.path.join(fake, "bin") + os.pathsep + os.environ["PATH"],
               PYTHONPATH=fake)
    out = os.path.join(TMP, "run")
    rc, stdout, err = script("run_demo.py", "--lib", lib, "--out", out, "--batch", 2,
                             "--prompt-len", 4, "--new-tokens", 3, "--train-batch", 2,
                             "--train-seq", 8, "--train-steps", 1, "--train-warmup", 0,
                             "--repeats", 1, env=env)
    harness.check(rc == 0, f"exit {rc}: {stdout[-2000:]} {err[-2000:]}")
    for spec in ("none", "bf16", "nvfp4-tensor", "nvfp4-row"):
        harness.check(f"| {spec}" in stdout, f"table row {spec}:\n{stdout}")
        for name in (f"sampler-{spec}.jsonl", f"learner-{spec}.jsonl", f"gap-{spec}.json"):
            harness.check(os.path.exists(os.path.join(out, name)), f"{name} written")
    for name in ("table.md", "summary.json"):
        harness.check(os.path.exists(os.path.join(out, name)), f"{name} written")
    harness.check("bit-identical" in stdout, f"bf16 pass-through noted:\n{stdout}")


for t in (test_run_demo_without_gpu_says_so_and_succeeds, test_bad_arguments_exit_2,
          test_learner_refuses_bad_input_before_loading_a_model,
          test_demos_without_torch_say_what_to_install,
          test_tiny_model_through_the_real_hf_calls_on_cpu,
          test_make_run_driver_on_cpu_with_a_pretend_gpu):
    harness.run(t)
sys.exit(harness.done())
