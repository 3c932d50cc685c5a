"""run_demo.py — what `make run` runs (demo/run.mk): the demo sampler and learner without the shim
and under it for each spec, on HF's default experts implementation (grouped_mm) and on the eager
one, the continuous-batching server without and under nvfp4-row, and four tables of what came out.

    python3 demo/run_demo.py [--quick] [--specs bf16,nvfp4-row]
        [--eager-specs none,nvfp4-row] [--out build/run] [--layers auto] [--train-layers auto]
        [--eager-layers 4] [--batch 128] [--prompt-len 128] [--new-tokens 128] [--repeats 3]
        [--train-batch 8] [--train-seq 1024] [--train-steps 4] [--train-warmup 2]
        [--sampler-cache frozen-sampled] [--learner-cache requantize]
        [--profile-tokens 1,16,128,1024,8192 | --no-profile] [--breakdown 1,16,128]
        [--server-requests 32] [--nondeterministic] [--overhead-spec SPEC]

Without a GPU (no nvidia-smi, or torch sees no CUDA device) it prints one line saying so and
exits 0. Otherwise a row is a spec and an experts path: "none" (no LD_PRELOAD: the baseline) and
each of --specs on grouped_mm, then each of --eager-specs ("none" allowed; no row by default, which
keeps a full run within 10 minutes) on eager. The model is Qwen3-30B-A3B's geometry at the depth
that fits (demo/demo_model.py: --layers auto, 48 on an H200), the eager rows at --eager-layers
(HF's eager experts loop over the experts hit). For each row, children:
  1. demo/demo_sampler.py   prefill + static-cache decode of BATCH sequences (the decode step a
                            CUDA graph on grouped_mm), per-token log-probs -> OUT/sampler-ROW.jsonl;
                            on grouped_mm rows also --moe-profile OUT/moe-ROW.json (one MoE layer's
                            GPU time at each T, both experts paths, in that process), and on the
                            none and nvfp4-row rows --step-breakdown (the decode step by component)
  2. demo/demo_learner.py   --logprobs: score the sampler's tokens at the sampler's depth
                            -> OUT/learner-ROW.jsonl
  3. demo/demo_learner.py   --train (AdamW, REPEATS windows of STEPS steps) at --train-layers,
                            as many layers as fit with AdamW's states and the activations
each as a child process with PYTHONUNBUFFERED=1 and, for a spec, LD_PRELOAD=<abs>/libminite.so
MINITE_SPEC=<spec> MINITE_ROUTE=1536x2048,2048x768 MINITE_ROLE=sampler|learner
MINITE_WEIGHT_CACHE=<--sampler-cache|--learner-cache> MINITE_STATS=OUT/stats/ROW-<role>-%p.jsonl
(and for a sampler MINITE_INSTR_SLOTS=2048: the graphs of its decode step, layer table and step
breakdown keep a slot for each of ~14 x layers captured calls, past the default pool's half):
weights handled as a user would, the sampler's frozen between weight syncs and sampled-checked,
the learner's requantized at every call since every step changes them. The samplers and scoring
learners run PyTorch's deterministic algorithms (--deterministic; --nondeterministic turns it
off), so that the no-shim run repeats bit for bit and bf16 can show its identity with it. Then
demo/demo_server.py (transformers' continuous batching) for none and nvfp4-row, tools/gap-report
per row (OUT/gap-ROW.json) and over all rows (OUT/gap.png).

Table 1: learner training tokens/s and sampler decode tokens/s, each the median of its repeats
with the minimum and maximum, and the median's ratio to the no-shim row of the same experts path
(the no-shim spread and the bf16 row, which runs the no-shim computation, bound the noise); routed
GEMM calls (the shim's summary record, the last line of each stats file); the log-prob gap
(|dlogp| mean / p99 / max, KL, share of importance ratios above 2, and NeMo-RL's
token_mult_prob_error and verl's k3_kl under those names); the instruments (shim/instr.c, at their
default rates): the learner's shadow error, the invariance probe, the learner-sampler digest join
of tools/minite-compare. A grouped call's shadow (torch._grouped_mm has no cuBLAS call to rerun)
compares 8 of its rows with the product the instruments' kernel forms.
Table 2: one MoE layer (layer 0's sparse block forward, demo/demo_profile.py) at each T for each
spec: the grouped_mm block's wall time as a CUDA-graph replay (CUDA events, median and spread), then
the profiler's GPU busy time of both paths (labelled; overlapping kernels counted once), each with
its speed against grouped_mm without the shim, and the time the instruments add to it.
Table 3: the server rows. Table 4: the decode step by component (demo/demo_step.py).
With --overhead-spec SPEC, the eager learner of SPEC runs once more with
MINITE_SHADOW=MINITE_PROBE=MINITE_DIGEST=0: the instruments' cost in training tokens/s.
--quick: smaller sizes (4 sampler and 2 training layers among them), rows none / bf16 / nvfp4-row on
grouped_mm and nvfp4-row on eager, T = 1, 128, 8192: a smoke run. The tables are printed and written
to OUT/table.md, every number to OUT/summary.json, each child's stdout and stderr to OUT/logs/, one
progress line per child. A child that fails is reported with the tail of its stderr; the tables
still show what finished, also when a signal (SIGTERM from `timeout` or a scheduler, Ctrl-C) stops
the run: the child running is killed and the rows after it are listed as not run. Exit status 0 when
everything ran, 1 when something failed or was stopped.
"""
import argparse
import datetime
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(HERE)
TOOLS = os.path.join(ROOT, "tools")
sys.path.insert(0, HERE)
sys.path.insert(0, TOOLS)
import demo_model  # noqa: E402  (standard library only at import time)
import demo_profile  # noqa: E402  (likewise)
import demo_server  # noqa: E402  (likewise)

SPECS = ["bf16", "nvfp4-tensor", "nvfp4-row"]
BASELINE = "none"
SAMPLER_SLOTS = 2048  # MINITE_INSTR_SLOTS of the samplers (child_env)
BREAKDOWN_SPECS = (BASELINE, "nvfp4-row")   # the samplers whose decode step is broken down
EAGER_NEW_TOKENS = 32
GROUPED, EAGER = demo_model.EXPERTS
STDERR_TAIL = 25
CACHE_MODES = ("requantize", "frozen", "frozen-sampled")
# (full run, --quick); an option given on the command line wins over both
SIZES = {
    "specs": ("bf16,nvfp4-row", "bf16,nvfp4-row"),
    # the eager rows (HF's eager experts loop, 4 layers) add ~140 s, past the 10 minutes that a
    # full run is held to; the layer table still times the eager path in every grouped process
    "eager_specs": ("", "nvfp4-row"),
    "batch": (128, 64),
    "prompt_len": (128, 64),
    "new_tokens": (128, 32),
    "repeats": (3, 3),
    "train_batch": (8, 4),
    "train_seq": (1024, 512),
    "train_steps": (4, 2),
    "train_warmup": (2, 1),
    "profile_tokens": ("1,16,128,1024,8192", "1,128,8192"),
    "layers": ("auto", "4"),
    "train_layers": ("auto", "2"),
}


def spec_list(text):
    return [s for s in text.split(",") if s]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="make run: the demos without and under the shim, "
                                "on HF's grouped_mm and eager experts; two tables.")
    p.add_argument("--lib", default=os.path.join(ROOT, "build", "libminite.so"),
                   help="the shim (default build/libminite.so)")
    p.add_argument("--out", default=os.path.join(ROOT, "build", "run"),
                   help="directory for logs, log-prob files, JSON, PNG (default build/run)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: smaller sizes, fewer rows (the defaults below: full / quick)")

    def opt(name, kind, what):
        full, quick = SIZES[name.replace("-", "_")]
        p.add_argument("--" + name, type=kind, default=None,
                       help=f"{what} (default {full or repr('')} / {quick or repr('')})")
    opt("specs", str, "comma-separated specs run on grouped_mm")
    opt("eager-specs", str, "comma-separated specs run on eager ('none' allowed; '' for no row)")
    p.add_argument("--python", default=sys.executable, help="interpreter of the demos")
    p.add_argument("--timeout", type=demo_model.positive_int, default=600,
                   help="seconds one child may run (default 600)")
    opt("layers", demo_model.layers_arg, "layers of the grouped_mm samplers and their scoring "
        "learners; auto: as many as fit the GPU, at most 48")
    opt("train-layers", demo_model.layers_arg, "layers of the grouped_mm training runs; auto: as "
        "many as fit with AdamW")
    p.add_argument("--eager-layers", type=demo_model.positive_int, default=4,
                   help="layers of the eager rows, sampler and learner (default 4: HF's eager "
                        "experts run a Python loop of three GEMMs per expert hit)")
    # 64 took the server's two rows and their scorers ~250 s at 45 layers (H100), and make run
    # past its 10 minutes
    p.add_argument("--server-requests", type=demo_model.nonnegative_int, default=32,
                   help="requests of the continuous-batching server rows (demo/demo_server.py: "
                        "prompts of 32-256 tokens, 16-128 new), none and nvfp4-row; 0 for none "
                        "(default 32)")
    p.add_argument("--nondeterministic", action="store_true",
                   help="run the samplers and the scoring learners without PyTorch's "
                        "deterministic algorithms (by default on, so that bf16 can show its "
                        "bitwise identity with no shim)")
    p.add_argument("--breakdown", type=str, default="1,16,128",
                   help="batch sizes of the decode-step breakdown of the none and nvfp4-row "
                        "samplers ('' for none; default 1,16,128)")
    p.add_argument("--seed", type=int, default=0)
    opt("batch", demo_model.positive_int, "sampler sequences")
    opt("prompt-len", demo_model.positive_int, "sampler prompt tokens")
    opt("new-tokens", demo_model.positive_int, "sampled tokens per sequence")
    opt("repeats", demo_model.positive_int, "timed sampler runs and training windows")
    opt("train-batch", demo_model.positive_int, "training sequences per step")
    opt("train-seq", demo_model.positive_int, "tokens per training sequence")
    opt("train-steps", demo_model.positive_int, "training steps per timed window")
    opt("train-warmup", demo_model.nonnegative_int, "untimed training steps")
    opt("profile-tokens", str, "T values of the MoE layer profile")
    p.add_argument("--no-profile", action="store_true", help="skip the MoE layer profile")
    p.add_argument("--sampler-cache", choices=CACHE_MODES, default="frozen-sampled",
                   help="MINITE_WEIGHT_CACHE of the samplers (default frozen-sampled)")
    p.add_argument("--learner-cache", choices=CACHE_MODES, default="requantize",
                   help="MINITE_WEIGHT_CACHE of the learners (default requantize)")
    p.add_argument("--overhead-spec", default=BASELINE,
                   help="spec of --eager-specs whose eager learner runs again with every "
                        "instrument off, to measure their overhead (default none: skip)")
    args = p.parse_args(argv)
    for key, (full, quick) in SIZES.items():
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    args.out = os.path.abspath(args.out)  # children run from the repository root
    args.spec_list = spec_list(args.specs)
    args.eager_list = spec_list(args.eager_specs)
    if not args.spec_list or BASELINE in args.spec_list:
        p.error(f"--specs: give spec names (e.g. {','.join(SPECS)}); the no-shim run "
                f"'{BASELINE}' is always made")
    if args.new_tokens < 2:
        p.error("--new-tokens: at least 2 (one from the prefill, the rest decoded)")
    try:
        args.profile_list = [int(x) for x in args.profile_tokens.split(",") if x]
    except ValueError:
        p.error(f"--profile-tokens {args.profile_tokens!r}: give token counts like 1,128,8192")
    if not args.profile_list or min(args.profile_list) < 1:
        p.error(f"--profile-tokens {args.profile_tokens!r}: give positive token counts")
    if args.overhead_spec != BASELINE and args.overhead_spec not in args.eager_list:
        p.error(f"--overhead-spec {args.overhead_spec}: the instruments run on eager rows only; "
                f"give a spec of --eager-specs ({args.eager_specs or 'empty'}) or none")
    try:
        args.breakdown_list = [int(x) for x in args.breakdown.split(",") if x]
    except ValueError:
        p.error(f"--breakdown {args.breakdown!r}: give batch sizes like 1,16,128")
    if args.breakdown_list and min(args.breakdown_list) < 1:
        p.error(f"--breakdown {args.breakdown!r}: give positive batch sizes")
    grouped = {"experts": GROUPED, "layers": args.layers, "train_layers": args.train_layers}
    eager = {"experts": EAGER, "layers": args.eager_layers, "train_layers": args.eager_layers}
    args.rows = [dict(grouped, name=BASELINE, spec=BASELINE)]
    args.rows += [dict(grouped, name=s, spec=s) for s in args.spec_list]
    args.rows += [dict(eager, name=f"{s}-eager", spec=s) for s in args.eager_list]
    return args


# ---- is there a GPU? ----------------------------------------------------------------------------

def gpu_check(python):
    """(state, message): "ok"; "none" (no GPU here: say so, exit 0); "error" (a GPU machine that
    cannot run the demos)."""
    if shutil.which("nvidia-smi") is None:
        return "none", ("make run: no GPU on this machine (nvidia-smi not found); the demo "
                        "runs on a GPU machine (H200) - nothing to do here")
    probe = "import torch, transformers; print(torch.cuda.is_available())"
    try:
        res = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        return "error", f"make run: could not run {python} to look for torch: {e}"
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["?"])[-1]
        return "error", (f"make run: {python} cannot import torch and transformers ({last}); "
                         "install torch with CUDA and transformers>=5")
    if res.stdout.strip().splitlines()[-1:] != ["True"]:
        return "none", ("make run: torch sees no CUDA GPU here (nvidia-smi exists; check "
                        "CUDA_VISIBLE_DEVICES) - nothing to do")
    return "ok", None


# ---- children -----------------------------------------------------------------------------------

def child_env(args, spec, role, tag, instruments=True):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    kept = [x for x in env.get("LD_PRELOAD", "").split(":")
            if x and not os.path.basename(x).startswith("libminite")]
    if spec == BASELINE:
        for key in [k for k in env if k.startswith("MINITE_")]:
            del env[key]
        if kept:
            env["LD_PRELOAD"] = ":".join(kept)
        else:
            env.pop("LD_PRELOAD", None)
        return env
    env["LD_PRELOAD"] = ":".join([os.path.abspath(args.lib)] + kept)
    env["MINITE_SPEC"] = spec
    env["MINITE_ROUTE"] = demo_model.ROUTE
    env["MINITE_ROLE"] = role
    env["MINITE_WEIGHT_CACHE"] = args.sampler_cache if role == "sampler" else args.learner_cache
    env["MINITE_STATS"] = os.path.join(args.out, "stats", f"{tag}-%p.jsonl")
    if role == "sampler":  # its graphs keep a slot a captured call (README, MINITE_INSTR_SLOTS)
        env["MINITE_INSTR_SLOTS"] = str(SAMPLER_SLOTS)
    if not instruments:  # the overhead run: every instrument off (their defaults are on)
        env.update(MINITE_SHADOW="0", MINITE_PROBE="0", MINITE_DIGEST="0")
    else:  # the defaults, whatever the caller's environment says
        for key in ("MINITE_SHADOW", "MINITE_PROBE", "MINITE_DIGEST", "MINITE_DIGEST_CALLS"):
            env.pop(key, None)
    return env


def show(path):
    """A path as the user reads it: relative to the repository root when it lies inside."""
    path = os.path.abspath(path)
    return os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path


def tail(path, lines):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def last_json(path, key):
    """The last line of the file that is a JSON object holding `key`, or None."""
    found = None
    try:
        with open(path, errors="replace") as f:
            for line in f:
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    obj = json.loads(line)
                except ValueError:
                    continue
                if isinstance(obj, dict) and key in obj:
                    found = obj
    except OSError:
        pass
    return found


def run_child(args, name, argv, env):
    """Run one child; returns {"name", "ok", "rc", "seconds", "pid", "summary", "stderr_tail"}."""
    logs = os.path.join(args.out, "logs")
    out_path, err_path = os.path.join(logs, name + ".out"), os.path.join(logs, name + ".err")
    shown = [os.path.relpath(a, ROOT) if a.startswith(ROOT + os.sep) else a for a in argv]
    print(f"[run] {name}: {' '.join(shown)}", flush=True)
    start = time.time()
    rc = None
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env, cwd=ROOT)
        try:
            rc = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = "timeout"
        except BaseException:  # stopped: the child goes with us
            proc.kill()
            proc.wait()
            raise
    result = {"name": name, "rc": rc, "seconds": time.time() - start, "pid": proc.pid,
              "summary": last_json(out_path, "demo"), "stderr_tail": ""}
    result["ok"] = rc == 0 and result["summary"] is not None
    if not result["ok"]:
        result["stderr_tail"] = tail(err_path, STDERR_TAIL)
        why = f"timed out after {args.timeout} s" if rc == "timeout" else f"exit {rc}"
        if rc == 0:
            why = "printed no JSON summary"
        print(f"[run] {name} FAILED ({why}); last lines of {show(err_path)}:\n"
              + "".join("    " + x + "\n" for x in result["stderr_tail"].splitlines()),
              flush=True)
    else:
        print(f"[run] {name}: ok in {result['seconds']:.1f} s", flush=True)
    return result


def stats_file(args, row, role, pid):
    """The statistics file of the child `pid` (or the newest of the row and role), or None."""
    if row["spec"] == BASELINE:
        return None
    pattern = os.path.join(args.out, "stats", f"{row['name']}-{role}-*.jsonl")
    exact = os.path.join(args.out, "stats", f"{row['name']}-{role}-{pid}.jsonl")
    files = [exact] if os.path.exists(exact) else sorted(glob.glob(pattern), key=os.path.getmtime)
    return files[-1] if files else None


def shim_summary(args, row, role, pid):
    """The shim's summary record of the child `pid` (or of the newest file of row and role)."""
    path = stats_file(args, row, role, pid)
    if not path:
        return None
    rec = last_json(path, "event")
    return rec if rec and rec.get("event") == "summary" else None


def model_args(args, row, layers):
    return ["--layers", str(layers), "--seed", str(args.seed), "--experts", row["experts"]]


def train_args(args):
    return ["--train", "--batch", str(args.train_batch), "--seq", str(args.train_seq),
            "--steps", str(args.train_steps), "--repeats", str(args.repeats),
            "--warmup", str(args.train_warmup)]


def sampler_argv(args, row, files):
    # HF's eager experts decode uncaptured, a Python loop of three GEMMs per expert hit: their
    # rows sample fewer tokens (100 s a row at 128 on an H100)
    new_tokens = args.new_tokens if row["experts"] == GROUPED else min(args.new_tokens,
                                                                       EAGER_NEW_TOKENS)
    argv = [args.python, os.path.join(HERE, "demo_sampler.py"), "--out", files["sampler"],
            "--batch", str(args.batch), "--prompt-len", str(args.prompt_len),
            "--new-tokens", str(new_tokens), "--repeats", str(args.repeats)]
    if row["experts"] == GROUPED and not args.no_profile:
        argv += ["--moe-profile", files["profile"],
                 "--profile-tokens", ",".join(map(str, args.profile_list))]
    if row["experts"] == GROUPED and row["spec"] in BREAKDOWN_SPECS and args.breakdown_list:
        argv += ["--step-breakdown", ",".join(map(str, args.breakdown_list))]
    return argv + model_args(args, row, row["layers"]) + determinism(args)


def determinism(args):
    return [] if args.nondeterministic else ["--deterministic"]


def fresh(files):
    """`files`, none of them left from an earlier run (a stale file must not be reported as this
    run's)."""
    for path in files.values():
        if os.path.exists(path):
            os.remove(path)
    return files


def run_scorer(args, name, spec, files, tag, sampler):
    """The learner scoring the tokens of files["sampler"] at the sampler's depth (from its file)
    into files["learner"], when the sampler ran; else a record of the child skipped."""
    if not sampler["ok"]:
        return {"ok": False, "summary": None, "pid": None, "name": name, "skipped": True}
    argv = [args.python, os.path.join(HERE, "demo_learner.py"), "--logprobs", files["sampler"],
            files["learner"]] + determinism(args)
    return run_child(args, name, argv, child_env(args, spec, "learner", tag))


def run_row(args, row):
    """For one row (a spec, or the no-shim baseline, on one experts path): the sampler, the
    learner scoring its tokens (the sampler's depth, from its file), and the learner training
    (its own depth: AdamW needs several times the sampler's memory a layer)."""
    name, spec = row["name"], row["spec"]
    files = fresh({"sampler": os.path.join(args.out, f"sampler-{name}.jsonl"),
                   "learner": os.path.join(args.out, f"learner-{name}.jsonl"),
                   "profile": os.path.join(args.out, f"moe-{name}.json")})
    children = {"sampler": run_child(args, f"sampler-{name}", sampler_argv(args, row, files),
                                     child_env(args, spec, "sampler", f"{name}-sampler"))}
    children["scorer"] = run_scorer(args, f"scorer-{name}", spec, files, f"{name}-scorer",
                                    children["sampler"])
    children["learner"] = run_child(
        args, f"learner-{name}", [args.python, os.path.join(HERE, "demo_learner.py")] +
        train_args(args) + model_args(args, row, row["train_layers"]),
        child_env(args, spec, "learner", f"{name}-learner"))
    return dict(row, files=files, **children,
                stats={k: shim_summary(args, row, k, c["pid"]) for k, c in children.items()},
                stats_files={k: stats_file(args, row, k, c["pid"]) for k, c in children.items()})


def run_server(args, row):
    """The continuous-batching server (demo/demo_server.py) at the sampler's depth under the
    row's spec, then the learner scoring what it served: {"name", "spec", "child", "stats",
    "files", "sampler", "scorer"} (the last three as a row's, for gap_report)."""
    name = f"server-{row['name']}"
    files = fresh({"sampler": os.path.join(args.out, f"{name}.jsonl"),
                   "learner": os.path.join(args.out, f"learner-{name}.jsonl")})
    argv = demo_server.child_argv(args.python, files["sampler"], args.server_requests, "32:256",
                                  "16:128", args.repeats) + model_args(args, row, row["layers"])
    child = run_child(args, name, argv,
                      child_env(args, row["spec"], "sampler", f"{row['name']}-server"))
    scorer = run_scorer(args, f"scorer-{name}", row["spec"], files, f"{row['name']}-server-scorer",
                        child)
    return {"name": name, "spec": row["spec"], "child": child, "sampler": child,
            "scorer": scorer, "files": files,
            "stats": shim_summary(args, row, "server", child["pid"])}


def busy_cell(busy):
    """A server's GPU busy share in its profiled window, with its steps a second there against
    the timed rounds' (demo/demo_server.py, BusyWindow)."""
    if not isinstance(busy, dict) or busy.get("share") is None:
        return "-"
    rates = (busy.get("steps_per_s"), busy.get("timed_steps_per_s"))
    tail = f" ({rates[0]:.1f} / {rates[1]:.1f})" if None not in rates else ""
    return f"{100 * busy['share']:.0f}%{tail}"


def server_table(servers):
    """Table 4: the server rows, tokens/s against the no-shim server."""
    if not servers:
        return None
    def rate(srv):
        d = (srv["child"]["summary"] or {}).get("generated_tokens_per_s")
        return (d["median"], d["min"], d["max"]) if isinstance(d, dict) else None
    base = next((s for s in servers if s["spec"] == BASELINE), None)
    head = ["spec", "layers", "generated tok/s median (min-max) vs none",
            "time to first token, ms (median of rounds)", "forward steps a round",
            "GPU busy (steps/s profiled / timed)", "experts path", "routed calls (fallbacks)",
            "abs(dlogp) mean / p99 / max",
            "token_mult_prob_error (NeMo-RL) / k3_kl (verl)"]
    rows = []
    for srv in servers:
        s = srv["child"]["summary"] or {}
        ttft = s.get("ttft_mean_ms")
        rows.append([label(srv), str(s.get("layers", "?")),
                     rate_cell(rate(srv), rate(base) if base and srv is not base else None),
                     f"{ttft['median']:,.0f}" if isinstance(ttft, dict) else "-",
                     " / ".join(map(str, s.get("steps") or [])) or "-",
                     busy_cell(s.get("gpu_busy")), str(s.get("experts", "-")),
                     routed_of(srv["stats"]) if srv["spec"] != BASELINE else "-"] +
                    [gap_cells(srv)[i] for i in (0, 3)])
    return markdown(head, rows)


def run_overhead(args, runs):
    """The eager learner of --overhead-spec again with every instrument off: training tokens/s
    with the instruments at their defaults (the row's run) and without, and the relative cost."""
    spec = args.overhead_spec
    run = next((r for r in runs if r["spec"] == spec and r["experts"] == EAGER), None)
    if run is None or spec == BASELINE:
        return None
    argv = [args.python, os.path.join(HERE, "demo_learner.py")] + train_args(args) + \
        model_args(args, run, run["train_layers"])
    child = run_child(args, f"learner-{run['name']}-instruments-off", argv,
                      child_env(args, spec, "overhead", f"{run['name']}-overhead",
                                instruments=False))
    on = (run["learner"]["summary"] or {}).get("train_tokens_per_s")
    off = (child["summary"] or {}).get("train_tokens_per_s")
    return {"spec": spec, "child": child, "on": on, "off": off,
            "overhead_pct": 100.0 * (off / on - 1.0) if on and off else None}


# ---- the instruments' figures -----------------------------------------------------------------

def instrument_figures(run):
    """From the summary records: the learner's shadow error (mean over sampled calls, weighted
    by calls, and max; its scoring and training processes), the probe's rows differing / probed
    (every process of the row)."""
    fig = {"shadow_calls": 0, "shadow_mean": None, "shadow_max": None, "probe_rows": 0,
           "probe_differing": 0}
    weighted = 0.0
    for role in ("scorer", "learner", "sampler"):
        rec = run["stats"].get(role) or {}
        for r in (rec.get("instruments") or {}).get("routes", {}).values():
            sh, pr = r.get("shadow", {}), r.get("probe", {})
            fig["probe_rows"] += pr.get("rows") or 0
            fig["probe_differing"] += pr.get("differing") or 0
            if role != "sampler" and sh.get("calls") and sh.get("rel_l2_mean") is not None:
                fig["shadow_calls"] += sh["calls"]
                weighted += sh["rel_l2_mean"] * sh["calls"]
                fig["shadow_max"] = max(fig["shadow_max"] or 0.0, sh.get("rel_l2_max") or 0.0)
    if fig["shadow_calls"]:
        fig["shadow_mean"] = weighted / fig["shadow_calls"]
    return fig


def digest_join(run):
    """tools/minite-compare of the scoring learner's and the sampler's statistics files
    (--json): the rows both computed from the same tokens."""
    a, b = run["stats_files"].get("scorer"), run["stats_files"].get("sampler")
    if run["spec"] == BASELINE or not a or not b:
        return None
    res = subprocess.run([sys.executable, os.path.join(TOOLS, "minite-compare"), a, b, "--json"],
                         capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        print(f"[run] minite-compare {run['name']} FAILED (exit {res.returncode}): "
              f"{res.stderr.strip()[-500:]}", flush=True)
        return None
    return json.loads(res.stdout)["total"]


# ---- gap reports ------------------------------------------------------------------------------

def scored(run):
    """The learner wrote its log-prob file (it does so before training, which may still fail)."""
    return run["sampler"]["ok"] and os.path.exists(run["files"]["learner"])


def gap_report(args, run):
    if not scored(run):
        return None
    argv = [sys.executable, os.path.join(TOOLS, "gap-report"), "--json", "--label", run["name"],
            run["files"]["learner"], run["files"]["sampler"]]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        print(f"[run] gap-report {run['name']} FAILED (exit {res.returncode}): "
              f"{res.stderr.strip()}", flush=True)
        return None
    doc = json.loads(res.stdout)
    with open(os.path.join(args.out, f"gap-{run['name']}.json"), "w") as f:
        f.write(res.stdout)
    return doc["runs"][0]


def gap_png(args, runs):
    items = [f"{r['name']}:{r['files']['learner']}:{r['files']['sampler']}"
             for r in runs if r.get("gap")]
    if not items:
        return None
    png = os.path.join(args.out, "gap.png")
    argv = [sys.executable, os.path.join(TOOLS, "gap-report"), "--json", "--png", png, "--runs"]
    res = subprocess.run(argv + items, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        print(f"[run] gap-report --png FAILED (exit {res.returncode}): {res.stderr.strip()}",
              flush=True)
        return None
    return png


def same_sampler_output(a_path, b_path):
    """Are two sampler files equal in tokens and log-probs? (None when one cannot be read.)"""
    import logprobs
    try:
        a, b = logprobs.read(a_path), logprobs.read(b_path)
    except logprobs.FormatError:
        return None
    if set(a.seqs) != set(b.seqs):
        return {"identical": False, "why": "different sequences"}
    worst = 0.0
    for k in a.seqs:
        if a.seqs[k].tokens != b.seqs[k].tokens:
            return {"identical": False, "why": f"sequence {k} sampled different tokens"}
        for x, y in zip(a.seqs[k].logprobs, b.seqs[k].logprobs):
            worst = max(worst, abs(x - y))
    return {"identical": worst == 0.0, "max_abs_diff": worst}


# ---- the tables -----------------------------------------------------------------------------

def throughput(run, role):
    """(median, min, max) tokens/s of a role's child, or None."""
    s = run[role]["summary"]
    if not s:
        return None
    if role == "learner":
        key = "train_tokens_per_s"
        if s.get(key) is None:
            return None
        return s[key], s.get(key + "_min", s[key]), s.get(key + "_max", s[key])
    d = s.get("decode_tokens_per_s")
    if isinstance(d, dict):
        return d["median"], d["min"], d["max"]
    return (s["tokens_per_s"],) * 3 if s.get("tokens_per_s") else None


def rate_cell(value, base):
    if value is None:
        return "failed"
    med, lo, hi = value
    cell = f"{med:,.0f} ({lo:,.0f}-{hi:,.0f})"
    return cell if not base else cell + f" **{med / base[0]:.2f}x**"


def routed_of(rec):
    """A summary record's routed calls, with its fallbacks when there are any; ? without one."""
    if rec is None:
        return "?"
    fallbacks = sum(v for v in (rec.get("fallbacks") or {}).values() if isinstance(v, int))
    return f"{rec.get('routed', '?')}" + (f" ({fallbacks} fb)" if fallbacks else "")


def routed_cell(run):
    if run["spec"] == BASELINE:
        return "-"
    return " / ".join(routed_of(run["stats"][role]) for role in ("learner", "sampler"))


def num(x):
    return "0" if x == 0 else f"{x:.3g}"


def framework_cell(g):
    """NeMo-RL's token_mult_prob_error (4 decimals: it sits near 1) / verl's k3_kl; null in the
    report is a value beyond a double, "-" a report without them."""
    cells = []
    for key, name, show in (("nemo_rl", "train/token_mult_prob_error", "{:.4f}".format),
                            ("verl", "rollout_corr/k3_kl", num)):
        metrics = g.get(key) or {}
        v = metrics.get(name)
        cells.append("-" if name not in metrics else "inf" if v is None else show(v))
    return " / ".join(cells)


def gap_cells(run):
    g = run.get("gap")
    if not g:
        return ["-", "-", "-", "-"]
    m = g["metrics"]
    return [" / ".join(num(m[k]) for k in ("abs_dlogp_mean", "abs_dlogp_p99", "abs_dlogp_max")),
            num(m["kl"]), num(m["ratio_above_2"]), framework_cell(g)]


def instrument_cells(run):
    if run["spec"] == BASELINE:
        return ["-", "-", "-"]
    f = run.get("instruments") or {}
    j = run.get("join")
    shadow = (f"{num(f['shadow_mean'])} / {num(f['shadow_max'])} ({f['shadow_calls']} calls)"
              if f.get("shadow_mean") is not None else "-")
    probe = f"{f['probe_differing']} / {f['probe_rows']}" if f.get("probe_rows") else "-"
    join = "-" if not j or not j.get("matched") else (
        f"{j['matched']} / " + ("-" if j["equal_pct"] is None else f"{j['equal_pct']:.1f}"))
    return [shadow, probe, join]


def label(run):
    return "none (no shim)" if run["spec"] == BASELINE else run["spec"]


def depth_cell(run):
    """The layers the sampler and the training learner ran with (each resolves "auto")."""
    cells = [str((run[role]["summary"] or {}).get("layers", "?")) for role in ("sampler",
                                                                              "learner")]
    return " / ".join(cells)


def table(runs):
    """Table 1; each row's speed against the no-shim row of its experts path (same depth)."""
    head = ["spec", "experts", "layers sampler / learner",
            "learner tok/s median (min-max) vs none",
            "sampler decode tok/s median (min-max) vs none", "routed calls learner / sampler",
            "abs(dlogp) mean / p99 / max", "KL", "ratio>2 share",
            "token_mult_prob_error (NeMo-RL) / k3_kl (verl)", "shadow rel-L2 mean / max",
            "probe rows differing / probed", "digest join: rows / equal %"]
    rows = []
    for r in runs:
        base = next((b for b in runs if b["spec"] == BASELINE and b["experts"] == r["experts"]),
                    None)
        base_l = throughput(base, "learner") if base and base is not r else None
        base_s = throughput(base, "sampler") if base and base is not r else None
        rows.append([label(r), r["experts"], depth_cell(r),
                     rate_cell(throughput(r, "learner"), base_l),
                     rate_cell(throughput(r, "sampler"), base_s),
                     routed_cell(r)] + gap_cells(r) + instrument_cells(r))
    return markdown(head, rows)


def markdown(head, rows):
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def read_profile(run):
    try:
        with open(run["files"]["profile"]) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def replay_cell(v, base):
    """A replay's median µs (min-max), its speed against the baseline's median; "-" or the
    capture's error otherwise."""
    if not isinstance(v, list):
        return "-" if v is None else str(v)
    cell = f"{v[0]:,.0f} ({v[1]:,.0f}-{v[2]:,.0f})"
    return cell + (f" {base[0] / v[0]:.2f}x" if isinstance(base, list) and v[0] else "")


def profile_table(runs):
    """Table 2: one MoE layer per T, each spec: the grouped_mm block's graph-replay wall µs, then
    every path's profiler GPU busy µs, both against grouped_mm no shim."""
    profiles = [(r, read_profile(r)) for r in runs if r["experts"] == GROUPED]
    profiles = [(r, p) for r, p in profiles if p]
    if not profiles:
        return None
    tokens = profiles[0][1]["tokens"]
    profiles = [(r, p) for r, p in profiles if p.get("tokens") == tokens]
    base = next((p for r, p in profiles if r["spec"] == BASELINE), {})
    head = ["measure", "experts", "spec"] + [f"T={t}" for t in tokens]
    rows = []
    base_replay = base.get("replay_us", {}).get(GROUPED) or [None] * len(tokens)
    for r, p in profiles:
        replay = p.get("replay_us", {}).get(GROUPED)
        if replay:
            rows.append(["graph replay, wall µs", GROUPED, label(r)] +
                        [replay_cell(v, b) for v, b in zip(replay, base_replay)])
    base_us = base.get("us", {}).get(GROUPED)
    for path in (GROUPED, EAGER):
        for r, p in profiles:
            us = p.get("us", {}).get(path)
            if not us:
                continue
            cells = []
            for i, v in enumerate(us):
                if v is None:
                    cells.append("-")
                elif base_us and base_us[i] and not (r["spec"] == BASELINE and path == GROUPED):
                    cells.append(f"{v:,.0f} ({base_us[i] / v:.2f}x)")
                else:
                    cells.append(f"{v:,.0f}")
            rows.append(["GPU busy, µs", path, label(r)] + cells)
            instr = instrument_sums(p, path)
            if any(instr):
                rows.append(["of which instruments, µs", path, label(r)] +
                            [f"{v:,.0f} ({100 * v / t:.1f}%)" if t else "-"
                             for v, t in zip(instr, us)])
    return markdown(head, rows)


def instrument_sums(profile, path):
    """The µs the shim's instrument kernels add to each T's busy time (0 where the profile has
    none)."""
    by_t = profile.get("instr_us", {}).get(path) or []
    return [sum((d or {}).values()) for d in by_t]


BREAKDOWN_ROWS = ("step", "dense GEMMs", "router", "experts", "experts GEMMs",
                  "experts instruments", "experts dispatch, combine", "LM head", "sampling",
                  "attention, rest",
                  "step GPU busy", "ceiling")


def breakdown_cell(value):
    if isinstance(value, list):
        return f"{value[0]:,.0f} ({value[1]:,.0f}-{value[2]:,.0f})"
    if isinstance(value, float):
        return f"{value:,.0f}"
    return "-" if value is None else str(value)


def breakdown_table(runs):
    """Table 3: the captured decode step by component (demo/demo_step.py), µs, per batch size,
    each spec of BREAKDOWN_SPECS side by side."""
    found = [(label(r), (r["sampler"]["summary"] or {}).get("step_breakdown")) for r in runs
             if r["experts"] == GROUPED and r["spec"] in BREAKDOWN_SPECS]
    found = [(name, b) for name, b in found if b]
    if not found:
        return None
    batches = [b["batch"] for b in found[0][1]]
    head = ["component, µs"] + [f"B={b} {name}" for b in batches for name, _ in found]
    rows = []
    for key in BREAKDOWN_ROWS:
        cells = []
        for i in range(len(batches)):
            for _, parts in found:
                part = parts[i] if i < len(parts) else {}
                value = part.get(key, part.get("error"))
                if key == "ceiling" and isinstance(value, float):
                    value = f"{value:.2f}x"
                cells.append(breakdown_cell(value))
        rows.append([key] + cells)
    return markdown(head, rows)


def server_notes(args):
    return [f"Server (demo/demo_server.py): transformers' continuous-batching engine (paged|sdpa "
            f"attention, its default of no CUDA graphs with sdpa) at the sampler's depth, "
            f"{args.server_requests} requests of 32-256 prompt and 16-128 new tokens submitted at "
            "once by a client thread, per-token log-probs back; generated tokens over the "
            f"round's wall time, median (min-max) of {args.repeats} rounds after one untimed; "
            "GPU busy: the share of a profiled window of one more round (2 s from its first "
            "second) in which the GPU ran anything, with the engine's steps a second in that "
            "window and in the timed rounds (the profiler slows a host-bound loop: where they "
            "differ, the share is a lower bound); "
            "the experts path and the routed calls say how its experts reached the shim; the "
            "learner scores the served tokens (requests of one shape batched together) and "
            "gap-report compares them, as for the sampler rows."]


def breakdown_notes():
    return ["Decode step by component (demo/demo_step.py): the sampler's captured step at B "
            "sequences and each component captured alone over all layers on inputs of the "
            "step's shapes, CUDA events over graph replays, µs per step, median (min-max) of "
            "3 timings of 20 replays. experts = dispatch, both expert GEMMs, activation and "
            "combine; its GEMM share (the engine's quantizers included) and the shim's "
            "instruments (mt_instr_*: captured calls digest at one replay in "
            "1/MINITE_DIGEST_REPLAYS) are split off by the profiler's kernel names, each by the "
            "time its kernels add to the GPU's busy time (a kernel launched dependent, resident "
            "while the one before it ends, counts what it runs after that end). attention, rest "
            "= the step minus the components (attention over the static cache, RoPE, norms, "
            "residuals, KV writes, embedding): an estimate, since a component alone runs with "
            "other caches. step GPU busy: the profiler's busy time of one step replay, "
            "overlapping kernels counted once (the cross-check). ceiling: step / (step - experts "
            "GEMMs), the speed-up if the expert GEMMs took no time."]


def command_line(argv):
    shown = [os.path.relpath(a, ROOT) if a.startswith(ROOT + os.sep) else a
             for a in (sys.argv[1:] if argv is None else argv)]
    return "python3 demo/run_demo.py " + " ".join(shown)


def notes_for(args, runs, overhead, png, passthrough, argv):
    sampler = next((r["sampler"]["summary"] for r in runs if r["sampler"]["summary"]), {}) or {}
    device = sampler.get("device", "?")
    notes = [
        f"{datetime.date.today().isoformat()}, {device}, torch {sampler.get('torch', '?')}, "
        f"transformers {sampler.get('transformers', '?')}: `{command_line(argv)}`",
        "Model: HF Qwen3-MoE with Qwen3-30B-A3B's geometry (48 layers at full depth; 128 "
        "experts, top-8, gate_up 1536x2048, down 2048x768; vocabulary 151936), random weights "
        f"(seed {args.seed}), BF16; the layers column gives each row's depth (--layers "
        f"{args.layers}, --train-layers {args.train_layers}: auto = as many as fit this GPU, "
        f"demo/demo_model.py fit_layers; eager rows {args.eager_layers}). The learner scores "
        "the sampler's tokens at the sampler's depth, in its own process. "
        f"Sampler: {args.batch} sequences, {args.prompt_len}-token prompts, {args.new_tokens} "
        "sampled tokens, static KV cache, decode step in a CUDA graph on grouped_mm (eager "
        "experts cannot be captured: uncaptured there), weights "
        f"MINITE_WEIGHT_CACHE={args.sampler_cache}. Learner: {args.train_batch} x "
        f"{args.train_seq} tokens a step, AdamW, {args.repeats} windows of {args.train_steps} "
        f"steps after {args.train_warmup} warm-up, weights {args.learner_cache}.",
        f"tok/s: median of {args.repeats} repeats (min-max); the ratio is the median against "
        "the no-shim row of the same experts path. The no-shim spread and the bf16 row (the "
        "no-shim computation under the shim) show the noise.",
        "routed calls: GEMM calls (a torch._grouped_mm call is one) the shim ran on its engine, "
        "fb: passed to cuBLAS/torch with a reason (the learner's are its backward calls); ? = no "
        "summary written.",
        "abs(dlogp), KL = mean(lp_sampler - lp_learner), ratio>2 share: gap-report over the "
        "sampled tokens (the learner scores the sampler's tokens with the same weights). "
        "token_mult_prob_error = mean(exp(abs(lp_learner - lp_sampler))), NeMo-RL's (its tests "
        "want it below 1.05); k3_kl = mean(exp(r) - r - 1), r = lp_learner - lp_sampler, "
        "verl's; both from the same gap-report, whose docstring defines and cites them and the "
        "other metrics of verl, NeMo-RL and slime it reports (OUT/gap-ROW.json).",
    ]
    if passthrough is not None:
        if passthrough.get("identical"):
            verdict = "bit-identical"
        else:
            why = passthrough.get("why") or f"max |dlogp| {passthrough['max_abs_diff']:.3g}"
            verdict = f"DIFFERENT ({why})"
        notes.append("bf16 under the shim vs no shim, sampler output (grouped_mm): " + verdict)
    uncaptured = [f"{r['name']} ({(r['sampler']['summary'] or {}).get('graph_error')})"
                  for r in runs if r["experts"] == GROUPED and
                  (r["sampler"]["summary"] or {}).get("cuda_graph") is False]
    if uncaptured:
        notes.append("decode step NOT captured in a CUDA graph (slower, launch-bound): "
                     + "; ".join(uncaptured))
    unrepeatable = [r["name"] for r in runs if (r["sampler"]["summary"] or {}).get(
        "repeats_identical") is False]
    if unrepeatable:
        notes.append("sampler repeats from the same seed sampled different tokens: "
                     + ", ".join(unrepeatable))
    notes.append("shadow: relative L2 of the learner's routed GEMMs against BF16 cuBLAS on the "
                 "sampled calls (MINITE_SHADOW default 1/64); probe: rows recomputed alone that "
                 "differ bitwise, learner and sampler (MINITE_PROBE 1/64); digest join: "
                 "tools/minite-compare learner vs sampler, rows digested by both (MINITE_DIGEST "
                 "1/64 of rows, picked by content) and the share bitwise equal; grouped calls "
                 "are shadowed (8 rows a call, against the product the instruments' kernel "
                 "forms: torch._grouped_mm has no cuBLAS call to rerun), probed and digested "
                 "too.")
    if overhead:
        if overhead["overhead_pct"] is not None:
            notes.append(f"instruments' overhead ({overhead['spec']} eager learner, training "
                         f"tokens/s): {overhead['on']:,.0f} at the default rates vs "
                         f"{overhead['off']:,.0f} with all three off: "
                         f"{overhead['overhead_pct']:+.1f}% time per step")
        else:
            notes.append(f"instruments' overhead: not measured ({overhead['spec']} learner "
                         "run failed)")
    if png:
        notes.append(f"abs(dlogp) distributions: {show(png)}")
    return notes


def profile_notes(args):
    return [f"One MoE layer (layer 0's Qwen3MoeSparseMoeBlock forward: router, dispatch, experts, "
            "combine) on T random hidden states, in each grouped_mm row's sampler process (so "
            f"under its spec, weights {args.sampler_cache}). Graph replay: the grouped_mm block "
            "captured in a CUDA graph, CUDA events over "
            f"{demo_profile.REPLAYS} replays, median (min-max) of {demo_profile.REPEATS} runs, "
            "µs per forward: the GPU's wall time, what a captured decode step pays (its "
            "instruments included: captured calls digest at one replay in "
            "1/MINITE_DIGEST_REPLAYS while the pool has slots for them, README). GPU busy: the "
            f"time the kernels of {demo_profile.ITERS} eager forwards (after "
            f"{demo_profile.WARMUP}) kept the GPU busy, by torch.profiler, per forward, for both "
            "experts paths (HF's eager loop cannot be captured); kernels that overlap (the "
            "engine's weight refresh beside its GEMM, a kernel launched dependent waiting for "
            "the one before it) count once; the instruments count. x: speed against grouped_mm "
            "without the shim (its time / this time), by the same measure. Of which "
            "instruments: the time the shim's mt_instr_* kernels add to it (each kernel's span "
            "past the end of those that started before it), and their share of it (each "
            "kernel's µs: OUT/moe-ROW.json, instr_us)."]


def failures(args, runs, servers, overhead, png):
    failed = [c["name"] for r in runs for c in (r["sampler"], r["scorer"], r["learner"])
              if not c["ok"] and not c.get("skipped")]
    failed += [c["name"] for s in servers for c in (s["child"], s["scorer"])
               if not c["ok"] and not c.get("skipped")]
    if overhead and not overhead["child"]["ok"]:
        failed.append(overhead["child"]["name"])
    failed += [f"gap-report {r['name']}" for r in runs if scored(r) and not r.get("gap")]
    if png is None and any(r.get("gap") for r in runs):
        failed.append("gap-report --png")
    if not args.no_profile:
        failed += [f"moe profile {r['name']}" for r in runs
                   if r["experts"] == GROUPED and r["sampler"]["ok"] and not read_profile(r)]
    return failed


class Stopped(Exception):
    """A signal to stop (SIGTERM from `timeout`, a job scheduler, Ctrl-C): the children that
    finished still make their tables."""


def stop_on_signal(signum, frame):
    raise Stopped(f"stopped by {signal.Signals(signum).name}")


def run_children(args):
    """(runs, servers, overhead, why stopped or None): every child, until a signal stops them."""
    runs, servers, overhead = [], [], None
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop_on_signal)
    try:
        for row in args.rows:
            runs.append(run_row(args, row))
        for row in args.rows:
            if args.server_requests and row["experts"] == GROUPED and \
                    row["spec"] in BREAKDOWN_SPECS:
                servers.append(run_server(args, row))
        if args.overhead_spec != BASELINE:
            overhead = run_overhead(args, runs)
    except Stopped as e:
        print(f"[run] {e}: the tables show the rows that finished", flush=True)
        return runs, servers, overhead, str(e)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
    return runs, servers, overhead, None


def main(argv=None):
    args = parse_args(argv)
    state, message = gpu_check(args.python)
    if state != "ok":
        print(message, file=sys.stdout if state == "none" else sys.stderr)
        return 0 if state == "none" else 1
    if not os.path.exists(args.lib):
        print(f"make run: {args.lib} not found: build it with make", file=sys.stderr)
        return 1
    for sub in ("", "logs", "stats"):
        os.makedirs(os.path.join(args.out, sub), exist_ok=True)
    for old in glob.glob(os.path.join(args.out, "stats", "*.jsonl")):
        os.remove(old)
    start = time.time()
    runs, servers, overhead, stopped = run_children(args)
    for r in runs:
        r["gap"] = gap_report(args, r)
        r["instruments"] = instrument_figures(r)
        r["join"] = digest_join(r)
    for srv in servers:
        srv["gap"] = gap_report(args, srv)
    png = gap_png(args, runs)
    bf16 = next((r for r in runs if r["spec"] == "bf16" and r["experts"] == GROUPED), None)
    passthrough = None
    if bf16 and runs[0]["sampler"]["ok"] and bf16["sampler"]["ok"]:
        passthrough = same_sampler_output(runs[0]["files"]["sampler"], bf16["files"]["sampler"])
    notes = notes_for(args, runs, overhead, png, passthrough, argv)
    failed = failures(args, runs, servers, overhead, png)
    if stopped:
        failed.append(f"{stopped}: the rows after the last one shown did not run")
    if failed:
        logs = show(os.path.join(args.out, "logs"))
        notes.append("FAILED: " + ", ".join(failed) + f" (logs in {logs})")
    notes.append(f"wall time {time.time() - start:.0f} s")
    report = table(runs) + "\n\n" + "\n".join("- " + n for n in notes) + "\n"
    moe = profile_table(runs)
    if moe:
        report += "\n" + moe + "\n\n" + "\n".join("- " + n for n in profile_notes(args)) + "\n"
    served = server_table(servers)
    if served:
        report += "\n" + served + "\n\n" + "\n".join("- " + n for n in server_notes(args)) + "\n"
    steps = breakdown_table(runs)
    if steps:
        report += "\n" + steps + "\n\n" + "\n".join("- " + n for n in breakdown_notes()) + "\n"
    print("\n" + report, end="")
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(report)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"args": {k: v for k, v in vars(args).items()}, "runs": runs, "png": png,
                   "servers": servers,
                   "bf16_passthrough": passthrough, "overhead": overhead, "failed": failed,
                   "profiles": {r["name"]: read_profile(r) for r in runs
                                if r["experts"] == GROUPED}}, f, indent=1, default=str)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
