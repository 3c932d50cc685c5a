#!/usr/bin/env python3
"""instr_cost.py — what the shim and its instruments cost in a MoE block, eager and captured:
layer 0's sparse MoE block of the demo model (Qwen3-30B-A3B geometry, demo/demo_model.py) run
forward on T random hidden states, T = 1 .. 8192, on both experts paths (grouped_mm, eager), GPU
busy time per forward from the PyTorch profiler (demo/demo_profile.py says why the profiler: the
eager path synchronises and cannot be captured), and the time the shim's mt_instr_* kernels add
to it apart (overlapping kernels counted once: demo_profile.added_us).

    python3 lab/instr_cost.py OUT.json [--lib build/libminite.so] [--old OLD_LIB]
        [--also NAME=LIB ...] [--tokens 1,16] [--only "nvfp4-row,nvfp4-row+stats old"]

Each setting runs in its own process (the grouped_mm block also as a CUDA-graph replay, whose
captured calls digest at one replay in ceil(1 / MINITE_DIGEST_REPLAYS), which the environment
may set, 1 for every replay: CUDA events for its wall time, the profiler for its
instrument kernels): no shim; the shim under bf16 and under nvfp4-row, each
without a statistics file, with one at the default rates (MINITE_STATS), and with one where every
uncaptured call is digested ("+stats all": MINITE_DIGEST_CALLS=all, where by default calls of
fewer rows than 1 / MINITE_DIGEST are sampled), frozen-sampled weights; with --old, nvfp4-row and bf16 with statistics again under OLD_LIB (an earlier build, the
same run and card); each --also NAME=LIB (a variant for an A/B), the same two again under
LIB, labelled NAME; --only runs just the settings it names (a process each costs ~30 s of
device time). Prints, per path and T, µs per forward of each setting and the instruments'
share of the block, (with statistics - without) / without, and writes OUT.json with each
instrument kernel's µs per forward (by_kernel), so that a rate can be picked by its cost.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "demo"))
TOKENS = (1, 16, 128, 1024, 8192)
WARMUP, ITERS = 2, 5
CHILD_LIMIT = 240


def settings(lib, old, also=()):
    """(name, environment) of each process; lib None: no shim."""
    base = {"MINITE_ROUTE": "1536x2048,2048x768", "MINITE_WEIGHT_CACHE": "frozen-sampled"}
    every_call = {"MINITE_DIGEST_CALLS": "all"}
    rows = [("none", None, None, False, {})]
    for spec in ("bf16", "nvfp4-row"):
        rows += [(spec, lib, spec, False, {}), (f"{spec}+stats", lib, spec, True, {}),
                 (f"{spec}+stats all", lib, spec, True, every_call)]
    for label, path in ([("old", old)] if old else []) + list(also):
        rows += [(f"{spec}+stats {label}", path, spec, True, {}) for spec in ("bf16", "nvfp4-row")]
    out = []
    for name, path, spec, stats, extra in rows:
        env = {}
        if path:
            env = dict(base, LD_PRELOAD=os.path.abspath(path), MINITE_SPEC=spec, **extra)
            if stats:
                env["MINITE_STATS"] = os.path.join(tempfile.mkdtemp(prefix="mt_cost_"), "s.jsonl")
        out.append((name, env))
    return out


# ---- the child: one setting, every path and T -------------------------------------------------

def child(out, tokens):
    import torch
    import demo_model
    import demo_profile
    model = demo_model.build(layers=1)
    block = model.model.layers[0].mlp
    x = demo_profile.hidden_states(torch, model, max(tokens))
    result = {"device": torch.cuda.get_device_name(), "us": {}, "instr_us": {}, "by_kernel": {}}
    for path in demo_model.EXPERTS:
        model.set_experts_implementation(path)
        rows = [demo_profile.block_us(torch, block, x[:, :t].contiguous(), ITERS, WARMUP)
                for t in tokens]  # (µs of every kernel, {instrument kernel: µs}) a forward
        result["us"][path] = [r[0] for r in rows]
        result["instr_us"][path] = [sum(r[1].values()) for r in rows]
        result["by_kernel"][path] = [r[1] for r in rows]
    # captured: the grouped_mm block as a graph replay (its digests at its digesting replays)
    model.set_experts_implementation("grouped_mm")
    replays = [demo_profile.replay_profile(torch, block, x[:, :t].contiguous()) for t in tokens]
    result["replay_us"] = [r[0] for r in replays]
    result["replay_instr_us"] = [r[1] for r in replays]
    with open(out, "w") as f:
        json.dump(result, f)


# ---- the parent -------------------------------------------------------------------------------

def run_setting(name, env, tokens):
    fd, out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    full = dict(os.environ, **env)
    if not env:
        full.pop("LD_PRELOAD", None)
    argv = [sys.executable, os.path.abspath(__file__), "--child", out,
            "--tokens", ",".join(map(str, tokens))]
    try:
        res = subprocess.run(argv, env=full, capture_output=True, text=True, timeout=CHILD_LIMIT)
    except subprocess.TimeoutExpired:
        print(f"[cost] {name}: over {CHILD_LIMIT} s", file=sys.stderr)
        return None
    if res.returncode != 0:
        print(f"[cost] {name}: exit {res.returncode}: {res.stderr.strip()[-800:]}", file=sys.stderr)
        return None
    with open(out) as f:
        return json.load(f)


def share(a, b):
    return f"{100.0 * (a - b) / b:+.1f}%" if a is not None and b else "-"


def print_table(title, names, tokens, cell):
    """A row per T, a column per setting: cell(name, i) gives (µs or None, the instrument kernels'
    µs), printed as "µs (instruments)"; then each spec's instruments' share."""
    print(f"\n{title}; instruments' share = +stats (+stats all) vs the same spec without")
    print("T".rjust(6) + "".join(n.rjust(20) for n in names) +
          "  bf16 share (all)  nvfp4 share (all)")
    for i, t in enumerate(tokens):
        cells = {n: cell(n, i) for n in names}
        us = {n: c[0] for n, c in cells.items()}
        text = "".join((f"{u:.1f} ({instr:.0f})" if u else "-").rjust(20)
                       for u, instr in cells.values())
        shares = [f"{share(us.get(spec + '+stats'), us.get(spec))} "
                  f"({share(us.get(spec + '+stats all'), us.get(spec))})"
                  for spec in ("bf16", "nvfp4-row")]
        print(f"{t:6d}{text}  {shares[0]:>17}  {shares[1]:>17}")


def table(results, tokens):
    names = [n for n in results if results[n]]
    for path in ("grouped_mm", "eager"):
        print_table(f"{path}: µs per forward (profiler busy time)", names, tokens,
                    lambda n, i: (results[n]["us"][path][i], results[n]["instr_us"][path][i]))
    print_table("grouped_mm captured: graph-replay wall µs per forward (median of demo_profile's "
                "runs)", names, tokens,
                lambda n, i: (replay_median(results[n], i), replay_instr(results[n], i)))
    print("\n(in parentheses: µs the mt_instr_* kernels add to the profiler's busy time)")


def replay_instr(result, i):
    """µs the instrument kernels add to one replay's busy time, 0 where none were profiled."""
    return sum((result.get("replay_instr_us") or [{}] * (i + 1))[i].values())


def replay_median(result, i):
    """The median of a graph replay's [median, min, max], None where it was not captured."""
    v = (result.get("replay_us") or [None] * (i + 1))[i]
    return v[0] if isinstance(v, list) else None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?")
    p.add_argument("--lib", default=os.path.join(ROOT, "build", "libminite.so"))
    p.add_argument("--old", help="an earlier libminite.so, measured beside")
    p.add_argument("--also", action="append", default=[], metavar="NAME=LIB",
                   help="a variant library, measured with statistics under both specs")
    p.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    p.add_argument("--only", help="comma-separated setting names to run (default: all)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    if args.child:
        child(args.child, tokens)
        return 0
    if not args.out:
        p.error("OUT.json is required")
    also = [tuple(a.split("=", 1)) for a in args.also]
    if any(len(a) != 2 for a in also):
        p.error("--also takes NAME=LIB")
    chosen = settings(args.lib, args.old, also)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        known = [name for name, _ in chosen]
        unknown = [n for n in names if n not in known]
        if unknown:
            p.error(f"--only: no setting {', '.join(map(repr, unknown))}; the settings are "
                    f"{', '.join(map(repr, known))}")
        chosen = [(name, env) for name, env in chosen if name in names]
    results = {name: run_setting(name, env, tokens) for name, env in chosen}
    with open(args.out, "w") as f:
        json.dump({"tokens": tokens, "results": results}, f, indent=1)
    device = next((r["device"] for r in results.values() if r), "?")
    print(f"device: {device}; {WARMUP} warm-up and {ITERS} profiled forwards a T")
    table(results, tokens)
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
