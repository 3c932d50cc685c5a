"""test_demo_scripts.py — the demo programs and the `make run` driver where there is no GPU:
run_demo.py says so in one line and exits 0; the demos reject bad arguments (exit 2) and bad
input files (exit 1, before touching torch) with messages that say what to do; without torch they
say to install it; the two tables of run_demo.py, the profiler's busy time of demo_profile.py and
its split by demo_step.py, on made-up results. Where torch and transformers are installed (not in
CI), the real HF code paths run too, on the CPU with a tiny geometry: the static-cache sampler
(grouped_mm and eager experts) -> learner --logprobs and --train -> gap-report, whose gap must be
0 (the decode loop computes what a full forward computes), and the make run driver with a pretend
GPU.
"""
import json
import os
import shutil
import subprocess
import sys

from demo_cpu import ROOT, SCRIPTS, TINY, gap_within, have_torch, tiny_driver
import harness  # tests/, demo/ and tools/ are on the path: demo_cpu put them there
import logprobs

TMP = harness.temp_dir("mt-demo-")


def script(name, *args, env=None):
    res = subprocess.run([sys.executable, os.path.join(SCRIPTS, name)] + [str(a) for a in args],
                         capture_output=True, text=True, env=env, cwd=TMP, timeout=600)
    return res.returncode, res.stdout, res.stderr


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
        ("demo_sampler.py", "--out", "x.jsonl", "--new-tokens", "1"),
        ("demo_sampler.py", "--out", "x.jsonl", "--experts", "loop"),
        ("demo_sampler.py", "--out", "x.jsonl", "--profile-tokens", "1,x"),
        ("demo_learner.py", "--train", "--repeats", "0"),
        ("run_demo.py", "--specs", "none"),
        ("run_demo.py", "--specs", ""),
        ("run_demo.py", "--profile-tokens", "0"),
        ("run_demo.py", "--new-tokens", "1"),
        ("run_demo.py", "--sampler-cache", "sometimes"),
        ("run_demo.py", "--overhead-spec", "nvfp4-tensor"),   # not an eager row
    ]
    for args in cases:
        rc, out, err = script(*args)
        harness.check(rc == 2, f"{args}: exit {rc}, expected 2 ({err.strip()[-150:]})")
    for name in ("demo_sampler.py", "demo_learner.py", "run_demo.py", "demo_model.py"):
        rc, out, err = script(name, "--help")
        harness.check(rc == 0 and "usage" in out, f"{name} --help: exit {rc}")


def test_run_demo_rows_and_quick():
    import run_demo
    args = run_demo.parse_args([])
    rows = [(r["name"], r["spec"], r["experts"]) for r in args.rows]
    harness.check(rows == [("none", "none", "grouped_mm"), ("bf16", "bf16", "grouped_mm"),
                           ("nvfp4-row", "nvfp4-row", "grouped_mm")], f"default rows {rows}")
    eager = run_demo.parse_args(["--eager-specs", "none,nvfp4-row"])
    rows = [(r["name"], r["spec"], r["experts"], r["layers"]) for r in eager.rows[3:]]
    harness.check(rows == [("none-eager", "none", "eager", 4),
                           ("nvfp4-row-eager", "nvfp4-row", "eager", 4)], f"eager rows {rows}")
    harness.check(args.batch == 128 and args.repeats >= 3 and args.profile_list ==
                  [1, 16, 128, 1024, 8192], f"full sizes {vars(args)}")
    harness.check((args.sampler_cache, args.learner_cache) == ("frozen-sampled", "requantize"),
                  "weights as a user runs them: sampler frozen-sampled, learner requantize")
    quick = run_demo.parse_args(["--quick", "--batch", "16"])
    harness.check((args.layers, args.train_layers, quick.layers, quick.train_layers) ==
                  ("auto", "auto", "4", "2") and quick.rows[0]["layers"] == "4",
                  f"full depth by default, a few layers for --quick: {vars(quick)}")
    harness.check(quick.batch == 16 and quick.new_tokens < args.new_tokens and
                  quick.repeats >= 3 and [r["name"] for r in quick.rows] ==
                  ["none", "bf16", "nvfp4-row", "nvfp4-row-eager"],
                  f"--quick: smaller, an explicit option wins: {vars(quick)}")
    none = run_demo.parse_args(["--eager-specs", ""])
    harness.check(all(r["experts"] == "grouped_mm" for r in none.rows), "--eager-specs ''")
    env = run_demo.child_env(args, "nvfp4-row", "sampler", "nvfp4-row-sampler")
    harness.check(env["MINITE_WEIGHT_CACHE"] == "frozen-sampled" and
                  env["MINITE_ROLE"] == "sampler", "sampler env")
    layers = 48  # a sampler's captured calls: decode step, layer table, 3 breakdown steps
    harness.check(int(env["MINITE_INSTR_SLOTS"]) // 2 >= 2 * layers + 10 + 3 * 4 * layers,
                  f"sampler env: {env.get('MINITE_INSTR_SLOTS')} slots, half for captured calls")
    env = run_demo.child_env(args, "nvfp4-row", "learner", "nvfp4-row-learner")
    harness.check(env["MINITE_WEIGHT_CACHE"] == "requantize" and "MINITE_INSTR_SLOTS" not in env,
                  "learner env")
    env = run_demo.child_env(args, "none", "learner", "none-learner")
    harness.check(not any(k.startswith("MINITE_") for k in env) and
                  "libminite" not in env.get("LD_PRELOAD", ""), "no shim for none")


def fake_run(name, spec, experts, learner, sampler, gap=None, instruments=None, profile=None,
             breakdown=None):
    summary_s = {"decode_tokens_per_s": {"median": sampler[0], "min": sampler[1],
                                         "max": sampler[2]}, "cuda_graph": True, "layers": 45,
                 "step_breakdown": breakdown}
    summary_l = {"train_tokens_per_s": learner[0], "train_tokens_per_s_min": learner[1],
                 "train_tokens_per_s_max": learner[2], "layers": 7}
    path = None
    if profile is not None:
        path = os.path.join(TMP, f"moe-{name}.json")
        with open(path, "w") as f:
            json.dump(profile, f)
    return {"name": name, "spec": spec, "experts": experts,
            "sampler": {"summary": summary_s, "ok": True, "name": "s"},
            "learner": {"summary": summary_l, "ok": True, "name": "l"},
            "scorer": {"summary": {"demo": "learner"}, "ok": True, "name": "c"},
            "stats": {"sampler": {"routed": 10, "fallbacks": {}},
                      "learner": {"routed": 5, "fallbacks": {"backward dgrad": 3}}},
            "files": {"profile": path or os.path.join(TMP, "absent.json")},
            "gap": gap, "instruments": instruments or {}, "join": None}


def test_tables_from_made_up_results():
    import run_demo
    prof = {"tokens": [1, 128], "us": {"grouped_mm": [100.0, 400.0], "eager": [300.0, 5000.0]},
            "replay_us": {"grouped_mm": [[80.0, 79.0, 82.0], [300.0, 290.0, 310.0]]}}
    prof_row = {"tokens": [1, 128], "us": {"grouped_mm": [50.0, 200.0], "eager": [500.0, 8000.0]},
                "replay_us": {"grouped_mm": [[40.0, 39.0, 41.0], "not captured: boom"]},
                "instr_us": {"eager": [{"mt_instr_digest": 20.0, "mt_instr_finish": 30.0},
                                       {"mt_instr_digest": 0.0}]}}
    gap = {"metrics": {"abs_dlogp_mean": 0.02, "abs_dlogp_p99": 0.1, "abs_dlogp_max": 0.2,
                       "kl": -0.001, "ratio_above_2": 0},
           "nemo_rl": {"train/token_mult_prob_error": 1.01234},
           "verl": {"rollout_corr/k3_kl": None}}
    older = {"metrics": gap["metrics"]}          # a report from before the frameworks' metrics
    runs = [fake_run("none", "none", "grouped_mm", (1000, 900, 1100), (20000, 19000, 21000),
                     gap, profile=prof),
            fake_run("nvfp4-row", "nvfp4-row", "grouped_mm", (900, 850, 950),
                     (30000, 29000, 31000), gap, {"probe_rows": 12, "probe_differing": 0},
                     profile=prof_row),
            fake_run("nvfp4-row-eager", "nvfp4-row", "eager", (300, 290, 310), (2000, 1900, 2100),
                     older, {"shadow_calls": 4, "shadow_mean": 0.13, "shadow_max": 0.14,
                           "probe_rows": 8, "probe_differing": 0})]
    text = run_demo.table(runs)
    lines = text.splitlines()
    harness.check(len(lines) == 5, f"header, rule, 3 rows:\n{text}")
    row = [c.strip() for c in lines[3].split("|")]
    harness.check(row[1:4] == ["nvfp4-row", "grouped_mm", "45 / 7"], f"row {row}")
    harness.check(row[4] == "900 (850-950) **0.90x**" and row[5] == "30,000 (29,000-31,000) "
                  "**1.50x**", f"median (min-max) and ratio to none: {row}")
    harness.check(row[10] == "1.0123 / inf", f"NeMo-RL's and verl's (null: inf) {row}")
    harness.check(row[11:14] == ["-", "0 / 12", "-"],
                  f"instruments on grouped_mm: a probe, no shadow in that summary: {row}")
    eager = [c.strip() for c in lines[4].split("|")]
    harness.check(eager[4:6] == ["300 (290-310)", "2,000 (1,900-2,100)"],
                  f"no ratio without a no-shim eager row (another depth): {eager}")
    harness.check(eager[10] == "- / -", f"a report without the frameworks' metrics: {eager}")
    harness.check(eager[11] == "0.13 / 0.14 (4 calls)" and eager[12] == "0 / 8",
                  f"instruments on eager: {eager}")
    moe = run_demo.profile_table(runs).splitlines()
    harness.check(len(moe) == 2 + 2 + 4 + 1,
                  f"2 specs replayed, then 2 specs x 2 paths, one with instruments:\n{moe}")
    harness.check(moe[-1] == "| of which instruments, µs | eager | nvfp4-row | 50 (10.0%) | "
                  "0 (0.0%) |", f"the instruments' time and share after their busy time: {moe[-1]}")
    harness.check(moe[2] == "| graph replay, wall µs | grouped_mm | none (no shim) | 80 (79-82) "
                  "1.00x | 300 (290-310) 1.00x |", f"replayed baseline: {moe[2]}")
    harness.check("| 40 (39-41) 2.00x | not captured: boom |" in moe[3], f"replayed: {moe[3]}")
    harness.check("| GPU busy, µs | grouped_mm | none (no shim) | 100 | 400 |" in moe[4],
                  f"baseline: {moe[4]}")
    harness.check("50 (2.00x)" in moe[5] and "200 (2.00x)" in moe[5], f"row: {moe[5]}")
    harness.check(moe[6].startswith("| GPU busy, µs | eager | none") and
                  "5,000 (0.08x)" in moe[6], moe[6])


def test_a_signal_stops_the_children_and_keeps_what_finished():
    import signal
    import threading
    import time
    import run_demo
    args = run_demo.parse_args(["--out", os.path.join(TMP, "stopped")])
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    started = []

    def fake_row(args, row):
        if row["name"] != "none":   # the second row hangs until the signal
            argv = [sys.executable, "-c", "import time; time.sleep(60)"]
            started.append(run_demo.run_child(args, "hangs", argv, dict(os.environ)))
        return {"name": row["name"]}
    real, run_demo.run_row = run_demo.run_row, fake_row
    timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGTERM))
    t0 = time.time()
    timer.start()
    try:
        runs, servers, overhead, stopped = run_demo.run_children(args)
    finally:
        run_demo.run_row = real
        timer.cancel()
    harness.check(stopped == "stopped by SIGTERM" and [r["name"] for r in runs] == ["none"] and
                  not servers and not started and time.time() - t0 < 20,
                  f"stopped {stopped!r}, rows {runs}, in {time.time() - t0:.1f} s")
    harness.check(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, "the handler is put back")
    left = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"time.sleep(60)" in f.read():
                    left.append(pid)
        except OSError:
            pass
    harness.check(not left, f"the running child is killed with the run: {left}")


def test_fit_layers():
    import demo_model
    fit = demo_model.fit_layers
    harness.check(fit(150e9, "sampler", 128 * 256) == demo_model.MODEL_LAYERS,
                  "the whole model samples on an H200-sized GPU")
    harness.check(fit(10e9, "learner", 8192) == 1, "at least one layer, whatever the memory")
    for total in (40e9, 85e9, 150e9):
        s, a, b = fit(total, "sampler", 128 * 256), fit(total, "learner", 8192), \
            fit(total, "learner", 2048)
        harness.check(a < s and a <= b, f"{total:.0f} B: sampler {s}, learner {a} (8192 tokens) "
                      f"{b} (2048): AdamW and activations cost more than inference")
    harness.check(fit(85e9, "sampler", 128 * 256) < fit(150e9, "sampler", 128 * 256),
                  "more memory, more layers")


def test_breakdown_table():
    import demo_step
    import run_demo

    def part(step, experts, gemm_share):
        out = {"batch": 16, "step": [step, step - 1, step + 1], "dense GEMMs": [100.0] * 3,
               "router": [20.0] * 3, "experts": [experts] * 3, "LM head": [50.0] * 3,
               "sampling": [30.0] * 3,
               "experts_split": (gemm_share, 0.1, 0.9 - gemm_share),
               "step GPU busy": step * 0.9}
        return demo_step.summarise(out)
    none = part(1000.0, 600.0, 0.75)
    harness.check(none["attention, rest"] == 1000 - 800 and none["experts GEMMs"] == 450 and
                  abs(none["experts instruments"] - 60) < 1e-9 and
                  abs(none["experts dispatch, combine"] - 90) < 1e-9 and
                  none["step GPU busy"] == 900,
                  f"the rest is the step minus the parts; experts split by the GEMM share: {none}")
    harness.check(abs(none["ceiling"] - 1000 / 550) < 1e-12, f"ceiling {none['ceiling']}")
    runs = [fake_run("none", "none", "grouped_mm", (1, 1, 1), (1, 1, 1), breakdown=[none]),
            fake_run("nvfp4-row", "nvfp4-row", "grouped_mm", (1, 1, 1), (1, 1, 1),
                     breakdown=[part(700.0, 300.0, 0.5)]),
            fake_run("bf16", "bf16", "grouped_mm", (1, 1, 1), (1, 1, 1),
                     breakdown=[part(900.0, 500.0, 0.5)])]
    lines = run_demo.breakdown_table(runs).splitlines()
    harness.check(lines[0] == "| component, µs | B=16 none (no shim) | B=16 nvfp4-row |",
                  f"the none and nvfp4-row samplers only: {lines[0]}")
    harness.check(lines[2] == "| step | 1,000 (999-1,001) | 700 (699-701) |", lines[2])
    harness.check(lines[-1] == "| ceiling | 1.82x | 1.27x |", lines[-1])
    harness.check(run_demo.breakdown_table(runs[2:]) is None, "no table without breakdowns")


def test_profile_busy_time_and_what_each_kernel_adds():
    import demo_profile
    import demo_step

    class Kind:
        CUDA, CPU = "cuda", "cpu"

    class Span:
        def __init__(self, start, end):
            self.start, self.end = start, end

    class Event:
        def __init__(self, kind, start, end, name):
            self.device_type, self.time_range, self.name = kind, Span(start, end), name

    class Prof:
        # a quantizer, a GEMM, the digest launched dependent (resident from 12 while the GEMM
        # runs to 20, then 2 µs of its own), the finish likewise, a host op over all of it, and
        # the refresh beside the GEMM (starting after it: adds nothing), then HF's gather
        def events(self):
            return [Event(Kind.CUDA, 0.0, 4.0, "mt_quant_rows"),
                    Event(Kind.CUDA, 5.0, 20.0, "mt_grouped_gemm"),
                    Event(Kind.CUDA, 12.0, 22.0, "mt_instr_digest"),
                    Event(Kind.CPU, 0.0, 100.0, "mt_instr_host"),
                    Event(Kind.CUDA, 6.0, 9.0, "mt_wcheck_refresh"),
                    Event(Kind.CUDA, 21.0, 25.0, "mt_instr_finish"),
                    Event(Kind.CUDA, 30.0, 32.0, "indexSelectLargeIndex")]

    class Torch:
        class autograd:
            DeviceType = Kind
    harness.check(demo_profile.busy_us(Torch, Prof()) == 4 + 15 + 2 + 3 + 2,
                  "the union of the device events' spans: the gaps not, the host op not")
    events = demo_profile.spans(Torch, Prof())
    harness.check(demo_profile.added_us(events, "mt_instr_") == 2 + 3,
                  "the instruments add their time past the GEMM's end and each other's, not "
                  "their 10 + 4 µs of durations")
    harness.check(demo_profile.added_us(events, "mt_instr_digest") == 2 and
                  demo_profile.added_us(events, "mt_wcheck") == 0,
                  "a kernel inside another's span adds nothing")
    gemm, instr, other = demo_step._split_us(Torch, Prof())
    harness.check((gemm, instr, other) == (4.0 + 15.0, 5.0, 2.0),
                  "the engine's kernels (its quantizer included), the instruments and the rest, "
                  f"adding up to the busy time: {(gemm, instr, other)}")


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


def test_tiny_model_through_the_real_hf_calls_on_cpu():
    if not have_torch():
        harness.skip("torch/transformers not installed (the demos' HF calls run on the GPU box)")
    driver = tiny_driver(TMP)

    def tiny(*args):
        res = subprocess.run([sys.executable, driver] + [str(a) for a in args],
                             capture_output=True, text=True, cwd=TMP, timeout=600)
        summary = json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else None
        harness.check(res.returncode == 0, f"{args[0]}: exit {res.returncode}: {res.stderr}")
        return summary
    s = tiny("sampler", "--out", "s.jsonl", "--batch", 3, "--prompt-len", 5, "--new-tokens", 6,
             "--repeats", 2)
    if s is None:
        return
    harness.check(s["tokens"] == 18 and s["tokens_per_s"] > 0 and s["logprobs_finite"], str(s))
    harness.check(s["experts"] == "grouped_mm" and s["decode_tokens"] == 15 and
                  len(s["decode_tokens_per_s"]["all"]) == 2 and s["repeats_identical"] and
                  s["cuda_graph"] is False, f"default experts, 2 repeats alike, no graph on CPU: "
                  f"{s}")
    sampled = logprobs.read(os.path.join(TMP, "s.jsonl"))
    harness.check(sorted(sampled.seqs) == [0, 1, 2], f"sequences {sorted(sampled.seqs)}")
    harness.check(all(len(x.tokens) == 6 and len(x.prompt) == 5 for x in sampled.seqs.values()),
                  "6 sampled tokens after a 5-token prompt")
    harness.check(all(-20 < v < 0 for x in sampled.seqs.values() for v in x.logprobs),
                  "log-probs of a 512-token vocabulary are negative and finite")
    learner = tiny("learner", "--logprobs", "s.jsonl", "l.jsonl", "--train", "--batch", 2,
                   "--seq", 16, "--steps", 2, "--warmup", 1, "--repeats", 2, "--score-batch", 2)
    if learner is None:
        return
    harness.check(learner["finite"] and len(learner["losses"]) == 5, str(learner))
    harness.check(len(learner["train_tokens_per_s_all"]) == 2 and
                  learner["train_tokens_per_s_min"] <= learner["train_tokens_per_s"] <=
                  learner["train_tokens_per_s_max"], f"2 windows, median between: {learner}")
    harness.check(learner["layers"] == sampled.header["model"]["layers"] == 1 and
                  learner["scored_tokens"] == 18 and
                  learner["experts"] == "grouped_mm", str(learner))
    gap_within("l.jsonl", "s.jsonl", TMP)
    # the other front door: eager experts, the learner taking the path from the sampler's file
    s = tiny("sampler", "--out", "se.jsonl", "--batch", 2, "--prompt-len", 4, "--new-tokens", 3,
             "--repeats", 1, "--experts", "eager")
    learner = tiny("learner", "--logprobs", "se.jsonl", "le.jsonl")
    if s is None or learner is None:
        return
    harness.check(s["experts"] == "eager" and learner["experts"] == "eager",
                  f"eager sampler {s['experts']}, learner {learner['experts']}")
    gap_within("le.jsonl", "se.jsonl", TMP)


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
                             "--repeats", 1, "--specs", "bf16,nvfp4-row", "--eager-specs",
                             "nvfp4-row", "--no-profile", "--breakdown", "",
                             "--server-requests", 2, env=env)
    harness.check(rc == 0, f"exit {rc}: {stdout[-2000:]} {err[-2000:]}")
    for name, spec, experts in (("none", "none (no shim)", "grouped_mm"),
                                ("bf16", "bf16", "grouped_mm"),
                                ("nvfp4-row", "nvfp4-row", "grouped_mm"),
                                ("nvfp4-row-eager", "nvfp4-row", "eager")):
        harness.check(f"| {spec} | {experts} |" in stdout, f"table row {name}:\n{stdout}")
        for f in (f"sampler-{name}.jsonl", f"learner-{name}.jsonl", f"gap-{name}.json"):
            harness.check(os.path.exists(os.path.join(out, f)), f"{f} written")
    for name in ("table.md", "summary.json"):
        harness.check(os.path.exists(os.path.join(out, name)), f"{name} written")
    harness.check("bit-identical" in stdout, f"bf16 pass-through noted:\n{stdout}")
    harness.check("| none (no shim) | 1 | " in stdout and "| nvfp4-row | 1 | " in stdout and
                  "generated tok/s" in stdout, f"the server rows, none and nvfp4-row:\n{stdout}")
    served = [line for line in stdout.splitlines() if line.startswith("| nvfp4-row | 1 | ")]
    harness.check(served and served[0].count(" / ") >= 3 and
                  os.path.exists(os.path.join(out, "gap-server-nvfp4-row.json")),
                  f"the served tokens scored and compared: {served}")


for t in (test_run_demo_without_gpu_says_so_and_succeeds, test_bad_arguments_exit_2,
          test_learner_refuses_bad_input_before_loading_a_model,
          test_demos_without_torch_say_what_to_install,
          test_run_demo_rows_and_quick, test_tables_from_made_up_results,
          test_a_signal_stops_the_children_and_keeps_what_finished, test_fit_layers,
          test_breakdown_table,
          test_profile_busy_time_and_what_each_kernel_adds,
          test_tiny_model_through_the_real_hf_calls_on_cpu,
          test_make_run_driver_on_cpu_with_a_pretend_gpu):
    harness.run(t)
sys.exit(harness.done())
