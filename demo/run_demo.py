"""run_demo.py — what `make run` runs (demo/run.mk): the demo sampler and learner under the
shim for each spec, once without it, and one table of what came out.

    python3 demo/run_demo.py [--specs bf16,nvfp4-tensor,nvfp4-row] [--out build/run]
        [--layers 2] [--batch 8] [--prompt-len 64] [--new-tokens 64]
        [--train-batch 8] [--train-seq 256] [--train-steps 10] [--train-warmup 2]
        [--overhead-spec nvfp4-row | --overhead-spec none]

Without a GPU (no nvidia-smi, or torch sees no CUDA device) it prints one line saying so and
exits 0. Otherwise, for "none" (no LD_PRELOAD: the throughput baseline) and then each spec:
  1. demo/demo_sampler.py   generate, per-token log-probs -> OUT/sampler-<spec>.jsonl
  2. demo/demo_learner.py   --logprobs (score the sampler's tokens) -> OUT/learner-<spec>.jsonl,
                               then --train (AdamW steps, training tokens/s)
each as a child process with PYTHONUNBUFFERED=1 and, for a spec, LD_PRELOAD=<abs>/libminite.so
MINITE_SPEC=<spec> MINITE_ROUTE=1536x2048,2048x768 MINITE_ROLE=sampler|learner
MINITE_STATS=OUT/stats/<spec>-<role>-%p.jsonl. Then tools/gap-report per spec
(OUT/gap-<spec>.json) and over all specs (OUT/gap.png), and the table: learner and sampler
tokens/s with their ratio to the no-shim run, routed GEMM calls (from the shim's summary record,
the last line of each stats file), the log-prob gap (|dlogp| mean / p99 / max, KL, share of
importance ratios above 2), and the instruments (shim/instr.c, at their default rates): the
learner's shadow error (relative L2 of the routed GEMMs against BF16 cuBLAS, mean / max over the
sampled calls), the invariance probe (rows that differ when recomputed alone / rows probed, learner
and sampler together), and the learner-sampler digest join of tools/minite-compare (rows in
both, and the share of them bitwise equal). Last, the instruments' overhead: the learner once more
under --overhead-spec (default nvfp4-row) with MINITE_SHADOW=MINITE_PROBE=MINITE_DIGEST=0, its
training tokens/s against the run with the instruments at their defaults. The table is printed and written to OUT/table.md, every number to
OUT/summary.json, each child's stdout and stderr to OUT/logs/. A child that fails is reported with
the tail of its stderr; the table still shows what finished. Exit status 0 when everything ran,
1 when something failed.
"""
import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.realpath(__file__))
ROOT = os.path.dirname(HERE)
TOOLS = os.path.join(ROOT, "tools")
sys.path.insert(0, HERE)
sys.path.insert(0, TOOLS)
import demo_model  # noqa: E402  (standard library only at import time)

SPECS = ["bf16", "nvfp4-tensor", "nvfp4-row"]
BASELINE = "none"
STDERR_TAIL = 25


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="make run: the demos under the shim, one table.")
    p.add_argument("--lib", default=os.path.join(ROOT, "build", "libminite.so"),
                   help="the shim (default build/libminite.so)")
    p.add_argument("--out", default=os.path.join(ROOT, "build", "run"),
                   help="directory for logs, log-prob files, JSON, PNG (default build/run)")
    p.add_argument("--specs", default=",".join(SPECS),
                   help=f"comma-separated specs (default {','.join(SPECS)})")
    p.add_argument("--python", default=sys.executable, help="interpreter of the demos")
    p.add_argument("--timeout", type=demo_model.positive_int, default=600,
                   help="seconds one child may run (default 600)")
    p.add_argument("--layers", type=demo_model.positive_int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=demo_model.positive_int, default=8, help="sampler prompts")
    p.add_argument("--prompt-len", type=demo_model.positive_int, default=64)
    p.add_argument("--new-tokens", type=demo_model.positive_int, default=64)
    p.add_argument("--repeats", type=demo_model.positive_int, default=3,
                   help="timed generate calls of the sampler; the median counts (default 3)")
    p.add_argument("--train-batch", type=demo_model.positive_int, default=8)
    p.add_argument("--train-seq", type=demo_model.positive_int, default=256)
    p.add_argument("--train-steps", type=demo_model.positive_int, default=10)
    p.add_argument("--train-warmup", type=demo_model.nonnegative_int, default=2)
    p.add_argument("--overhead-spec", default="nvfp4-row",
                   help="spec whose learner runs again with every instrument off, to measure "
                        "their overhead ('none': skip; default nvfp4-row)")
    args = p.parse_args(argv)
    args.out = os.path.abspath(args.out)  # children run from the repository root
    args.spec_list = [s for s in args.specs.split(",") if s]
    if not args.spec_list or BASELINE in args.spec_list:
        p.error(f"--specs: give spec names (e.g. {','.join(SPECS)}); the no-shim run "
                f"'{BASELINE}' is always made")
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

def child_env(args, spec, role, instruments=True):
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
    env["MINITE_STATS"] = os.path.join(args.out, "stats", f"{spec}-{role}-%p.jsonl")
    if not instruments:  # the overhead run: every instrument off (their defaults are on)
        env.update(MINITE_SHADOW="0", MINITE_PROBE="0", MINITE_DIGEST="0")
    else:  # the defaults, whatever the caller's environment says
        for key in ("MINITE_SHADOW", "MINITE_PROBE", "MINITE_DIGEST"):
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


def stats_file(args, spec, role, pid):
    """The statistics file of the child `pid` (or the newest of spec and role), or None."""
    if spec == BASELINE:
        return None
    pattern = os.path.join(args.out, "stats", f"{spec}-{role}-*.jsonl")
    exact = os.path.join(args.out, "stats", f"{spec}-{role}-{pid}.jsonl")
    files = [exact] if os.path.exists(exact) else sorted(glob.glob(pattern), key=os.path.getmtime)
    return files[-1] if files else None


def shim_summary(args, spec, role, pid):
    """The shim's summary record of the child `pid` (or of the newest file of spec and role)."""
    path = stats_file(args, spec, role, pid)
    if not path:
        return None
    rec = last_json(path, "event")
    return rec if rec and rec.get("event") == "summary" else None


def model_args(args):
    return ["--layers", str(args.layers), "--seed", str(args.seed)]


def run_spec(args, spec):
    """Sampler then learner for one spec (or the no-shim baseline)."""
    files = {"sampler": os.path.join(args.out, f"sampler-{spec}.jsonl"),
             "learner": os.path.join(args.out, f"learner-{spec}.jsonl")}
    for path in files.values():
        if os.path.exists(path):
            os.remove(path)  # a stale file from an earlier run must not be reported as this one
    sampler = run_child(args, f"sampler-{spec}", [
        args.python, os.path.join(HERE, "demo_sampler.py"), "--out", files["sampler"],
        "--batch", str(args.batch), "--prompt-len", str(args.prompt_len),
        "--new-tokens", str(args.new_tokens), "--repeats", str(args.repeats)] + model_args(args),
        child_env(args, spec, "sampler"))
    learner_argv = [args.python, os.path.join(HERE, "demo_learner.py")]
    if sampler["ok"]:
        learner_argv += ["--logprobs", files["sampler"], files["learner"]]
    learner_argv += ["--train", "--batch", str(args.train_batch), "--seq", str(args.train_seq),
                     "--steps", str(args.train_steps), "--warmup", str(args.train_warmup)]
    learner_argv += model_args(args)
    learner = run_child(args, f"learner-{spec}", learner_argv, child_env(args, spec, "learner"))
    return {
        "spec": spec, "files": files, "sampler": sampler, "learner": learner,
        "stats": {"sampler": shim_summary(args, spec, "sampler", sampler["pid"]),
                  "learner": shim_summary(args, spec, "learner", learner["pid"])},
        "stats_files": {"sampler": stats_file(args, spec, "sampler", sampler["pid"]),
                        "learner": stats_file(args, spec, "learner", learner["pid"])},
    }


def run_overhead(args, runs):
    """The learner of --overhead-spec again with every instrument off: training tokens/s with the
    instruments at their defaults (the spec's run) and without, and the relative cost."""
    spec = args.overhead_spec
    run = next((r for r in runs if r["spec"] == spec), None)
    if run is None or spec == BASELINE:
        return None
    child = run_child(args, f"learner-{spec}-instruments-off", [
        args.python, os.path.join(HERE, "demo_learner.py"), "--train", "--batch",
        str(args.train_batch), "--seq", str(args.train_seq), "--steps", str(args.train_steps),
        "--warmup", str(args.train_warmup)] + model_args(args),
        child_env(args, spec, "overhead", instruments=False))
    on = (run["learner"]["summary"] or {}).get("train_tokens_per_s")
    off = (child["summary"] or {}).get("train_tokens_per_s")
    return {"spec": spec, "child": child, "on": on, "off": off,
            "overhead_pct": 100.0 * (off / on - 1.0) if on and off else None}


# ---- the instruments' figures -----------------------------------------------------------------

def instrument_figures(run):
    """From the summary records: the learner's shadow error (mean over sampled calls, weighted
    by calls, and max), the probe's rows differing / probed (both roles)."""
    fig = {"shadow_calls": 0, "shadow_mean": None, "shadow_max": None, "probe_rows": 0,
           "probe_differing": 0}
    weighted = 0.0
    for role in ("learner", "sampler"):
        rec = run["stats"].get(role) or {}
        for r in (rec.get("instruments") or {}).get("routes", {}).values():
            sh, pr = r.get("shadow", {}), r.get("probe", {})
            fig["probe_rows"] += pr.get("rows") or 0
            fig["probe_differing"] += pr.get("differing") or 0
            if role == "learner" and sh.get("calls") and sh.get("rel_l2_mean") is not None:
                fig["shadow_calls"] += sh["calls"]
                weighted += sh["rel_l2_mean"] * sh["calls"]
                fig["shadow_max"] = max(fig["shadow_max"] or 0.0, sh.get("rel_l2_max") or 0.0)
    if fig["shadow_calls"]:
        fig["shadow_mean"] = weighted / fig["shadow_calls"]
    return fig


def digest_join(run):
    """tools/minite-compare of the learner's and the sampler's statistics files (--json)."""
    a, b = run["stats_files"].get("learner"), run["stats_files"].get("sampler")
    if run["spec"] == BASELINE or not a or not b:
        return None
    res = subprocess.run([sys.executable, os.path.join(TOOLS, "minite-compare"), a, b, "--json"],
                         capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        print(f"[run] minite-compare {run['spec']} FAILED (exit {res.returncode}): "
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
    argv = [sys.executable, os.path.join(TOOLS, "gap-report"), "--json", "--label", run["spec"],
            run["files"]["learner"], run["files"]["sampler"]]
    res = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if res.returncode != 0:
        print(f"[run] gap-report {run['spec']} FAILED (exit {res.returncode}): "
              f"{res.stderr.strip()}", flush=True)
        return None
    doc = json.loads(res.stdout)
    with open(os.path.join(args.out, f"gap-{run['spec']}.json"), "w") as f:
        f.write(res.stdout)
    return doc["runs"][0]


def gap_png(args, runs):
    items = [f"{r['spec']}:{r['files']['learner']}:{r['files']['sampler']}"
             for r in runs if r["spec"] != BASELINE and r.get("gap")]
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


# ---- the table ------------------------------------------------------------------------------

def ratio_cell(value, base):
    if value is None:
        return "failed"
    if not base:
        return f"{value:,.0f}"
    return f"{value:,.0f} ({value / base:.2f}x)"


def routed_cell(run):
    if run["spec"] == BASELINE:
        return "-"
    parts = []
    for role in ("learner", "sampler"):
        rec = run["stats"][role]
        if rec is None:
            parts.append("?")
            continue
        fallbacks = sum(v for v in (rec.get("fallbacks") or {}).values() if isinstance(v, int))
        parts.append(f"{rec.get('routed', '?')}" + (f" ({fallbacks} fb)" if fallbacks else ""))
    return " / ".join(parts)


def num(x):
    return "0" if x == 0 else f"{x:.3g}"


def gap_cells(run):
    g = run.get("gap")
    if not g:
        return ["-", "-", "-"]
    m = g["metrics"]
    return [" / ".join(num(m[k]) for k in ("abs_dlogp_mean", "abs_dlogp_p99", "abs_dlogp_max")),
            num(m["kl"]), num(m["ratio_above_2"])]


def instrument_cells(run):
    if run["spec"] == BASELINE:
        return ["-", "-", "-"]
    f = run.get("instruments") or {}
    shadow = (f"{num(f['shadow_mean'])} / {num(f['shadow_max'])} ({f['shadow_calls']} calls)"
              if f.get("shadow_mean") is not None else "-")
    probe = f"{f['probe_differing']} / {f['probe_rows']}" if f.get("probe_rows") else "-"
    j = run.get("join")
    join = "-" if not j else (f"{j['matched']} / " + ("-" if j["equal_pct"] is None
                                                       else f"{j['equal_pct']:.1f}"))
    return [shadow, probe, join]


def table(runs):
    base = next((r for r in runs if r["spec"] == BASELINE), None)

    def tps(run, role, key):
        s = run[role]["summary"]
        return s.get(key) if s else None
    base_l = tps(base, "learner", "train_tokens_per_s") if base else None
    base_s = tps(base, "sampler", "tokens_per_s") if base else None
    head = ["spec", "learner tok/s (vs no shim)", "sampler tok/s (vs no shim)",
            "routed calls learner / sampler", "abs(dlogp) mean / p99 / max", "KL",
            "ratio>2 share", "shadow rel-L2 mean / max", "probe rows differing / probed",
            "digest join: rows / equal %"]
    rows = []
    for r in runs:
        label = "none (no shim)" if r["spec"] == BASELINE else r["spec"]
        rows.append([label,
                     ratio_cell(tps(r, "learner", "train_tokens_per_s"),
                                None if r is base else base_l),
                     ratio_cell(tps(r, "sampler", "tokens_per_s"), None if r is base else base_s),
                     routed_cell(r)] + gap_cells(r) + instrument_cells(r))
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(" --- " for _ in head) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


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
    runs = [run_spec(args, spec) for spec in [BASELINE] + args.spec_list]
    overhead = None
    if args.overhead_spec != BASELINE:
        overhead = run_overhead(args, runs)
    for r in runs:
        r["gap"] = gap_report(args, r)
        r["instruments"] = instrument_figures(r)
        r["join"] = digest_join(r)
    png = gap_png(args, runs)
    bf16 = next((r for r in runs if r["spec"] == "bf16"), None)
    passthrough = None
    if bf16 and runs[0]["sampler"]["ok"] and bf16["sampler"]["ok"]:
        passthrough = same_sampler_output(runs[0]["files"]["sampler"], bf16["files"]["sampler"])
    text = table(runs)
    notes = [
        f"Model: Qwen3-MoE, {args.layers} layers, Qwen3-30B-A3B expert geometry, random weights "
        f"(seed {args.seed}); sampler {args.batch} prompts x {args.prompt_len} tokens + "
        f"{args.new_tokens} sampled; learner {args.train_batch} x {args.train_seq} tokens, "
        f"{args.train_steps} timed AdamW steps.",
        "learner tok/s: training tokens/s (forward + backward + step); sampler tok/s: generated "
        "tokens/s of model.generate; ratios against the no-shim run.",
        "routed calls: GEMM calls the shim ran in NVFP4 (fb: fallbacks to cuBLAS), from its "
        "summary record; ? = no summary written.",
        "abs(dlogp), KL = mean(lp_sampler - lp_learner), ratio>2 share: gap-report over the "
        "sampled tokens (learner scores the sampler's tokens with the same weights).",
    ]
    if passthrough is not None:
        if passthrough.get("identical"):
            verdict = "bit-identical"
        else:
            why = passthrough.get("why") or f"max |dlogp| {passthrough['max_abs_diff']:.3g}"
            verdict = f"DIFFERENT ({why})"
        notes.append("bf16 under the shim vs no shim, sampler output: " + verdict)
    notes.append("shadow: relative L2 of the learner's routed GEMMs against BF16 cuBLAS on the "
                 "sampled calls (MINITE_SHADOW default 1/64); probe: rows recomputed alone that "
                 "differ bitwise, learner and sampler (MINITE_PROBE 1/64); digest join: "
                 "tools/minite-compare learner vs sampler, rows digested by both (MINITE_DIGEST "
                 "1/64 of rows, picked by content) and the share bitwise equal")
    if overhead:
        if overhead["overhead_pct"] is not None:
            notes.append(f"instruments' overhead ({overhead['spec']} learner, training tokens/s): "
                         f"{overhead['on']:,.0f} at the default rates vs {overhead['off']:,.0f} "
                         f"with all three off: {overhead['overhead_pct']:+.1f}% time per step "
                         "(target: within 5%)")
        else:
            notes.append(f"instruments' overhead: not measured ({overhead['spec']} learner "
                         "run failed)")
    if png:
        notes.append(f"abs(dlogp) distributions: {show(png)}")
    failed = [c["name"] for r in runs for c in (r["sampler"], r["learner"]) if not c["ok"]]
    if overhead and not overhead["child"]["ok"]:
        failed.append(overhead["child"]["name"])
    failed += [f"gap-report {r['spec']}" for r in runs if scored(r) and not r.get("gap")]
    if png is None and any(r.get("gap") for r in runs if r["spec"] != BASELINE):
        failed.append("gap-report --png")
    if failed:
        logs = show(os.path.join(args.out, "logs"))
        notes.append("FAILED: " + ", ".join(failed) + f" (logs in {logs})")
    notes.append(f"wall time {time.time() - start:.0f} s")
    report = text + "\n\n" + "\n".join("- " + n for n in notes) + "\n"
    print("\n" + report, end="")
    with open(os.path.join(args.out, "table.md"), "w") as f:
        f.write(report)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"args": {k: v for k, v in vars(args).items()}, "runs": runs, "png": png,
                   "bf16_passthrough": passthrough, "overhead": overhead, "failed": failed}, f,
                  indent=1, default=str)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
