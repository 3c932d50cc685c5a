#!/usr/bin/env python3
"""instr_cost.py — what the shim and its instruments cost in a MoE block, eager and captured:
layer 0's sparse MoE block of the demo model (Qwen3-30B-A3B geometry, demo/demo_model.py) run
forward on T random hidden states, T = 1 .. 8192, on both experts paths (grouped_mm, eager), GPU
busy time per forward from the PyTorch profiler (demo/demo_profile.py says why the profiler: the
eager path synchronises and cannot be captured), and the time the shim's mt_instr_* kernels add
to it apart (overlapping kernels counted once: demo_profile.added_us).

    python3 lab/instr_cost.py OUT.json [--lib build/libminite.so] [--old OLD_LIB]
        [--also NAME=LIB ...] [--tokens 1,16] [--only "nvfp4-row,nvfp4-row+digest old"]

Each setting runs in its own process (the grouped_mm block also as a CUDA-graph replay, whose
captured calls digest at one replay in ceil(1 / MINITE_DIGEST_REPLAYS), which the environment
may set, 1 for every replay: CUDA events for its wall time, the profiler for its instrument
kernels), frozen-sampled weights: no shim; then under bf16 and under nvfp4-row each, the shim
without a statistics file, and with one and a single instrument: "+digest" (the digests at their
default rate, small calls sampled), "+digest all" (every call looked at: MINITE_DIGEST_CALLS=all),
"+shadow 1" and "+probe 1" (the shadow, the probe on every call). A 1/64 instrument falls on no
call or one in a few profiled forwards, so its cost is measured on every call and scaled: the
share at the default rates is that of "+digest" plus 1/64 of those of "+shadow 1" and "+probe 1".
With --old, "+digest" under both specs again ("+digest old") with OLD_LIB (an earlier build, the
same run and card); each --also NAME=LIB (a variant for an A/B) the same with LIB, labelled NAME;
--only runs just the settings it names (a process each costs ~30 s of device time). Prints, per
path and T, µs per forward of each setting, and each instrument's share of the block, (with it -
without) / without, and writes OUT.json with each instrument kernel's µs per forward (by_kernel),
so that a rate can be picked by its cost.
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


RATE = 1 / 64  # MINITE_SHADOW's and MINITE_PROBE's default
ONE = {"+digest": {"MINITE_SHADOW": "0", "MINITE_PROBE": "0"},
       "+digest all": {"MINITE_SHADOW": "0", "MINITE_PROBE": "0", "MINITE_DIGEST_CALLS": "all"},
       "+shadow 1": {"MINITE_SHADOW": "1", "MINITE_PROBE": "0", "MINITE_DIGEST": "0"},
       "+probe 1": {"MINITE_SHADOW": "0", "MINITE_PROBE": "1", "MINITE_DIGEST": "0"}}


def settings(lib, old, also=()):
    """(name, environment) of each process; lib None: no shim."""
    base = {"MINITE_ROUTE": "1536x2048,2048x768", "MINITE_WEIGHT_CACHE": "frozen-sampled"}
    rows = [("none", None, None, None)]  # name, library, spec, instruments' settings (None: off)
    for spec in ("bf16", "nvfp4-row"):
        rows += [(spec, lib, spec, None)] + [(spec + k, lib, spec, v) for k, v in ONE.items()]
    for label, path in ([("old", old)] if old else []) + list(also):
        rows += [(f"{spec}+digest {label}", path, spec, ONE["+digest"])
                 for spec in ("bf16", "nvfp4-row")]
    out = []
    for name, path, spec, instruments in rows:
        env = {}
        if path:
            env = dict(base, LD_PRELOAD=os.path.abspath(path), MINITE_SPEC=spec)
            if instruments is not None:
                env.update(instruments, MINITE_STATS=os.path.join(
                    tempfile.mkdtemp(prefix="mt_cost_"), "s.jsonl"))
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
    """(a - b) / b, None where either is missing."""
    return (a - b) / b if a is not None and b else None


def pct(v):
    return f"{100.0 * v:+.1f}%" if v is not None else "-"


def print_table(title, names, tokens, cell):
    """A row per T, a column per setting: cell(name, i) gives (µs or None, the instrument kernels'
    µs), printed as "µs (instruments)"."""
    print(f"\n{title}")
    print("T".rjust(6) + "".join(n.rjust(22) for n in names))
    for i, t in enumerate(tokens):
        text = "".join((f"{u:.1f} ({instr:.0f})" if u else "-").rjust(22)
                       for u, instr in (cell(n, i) for n in names))
        print(f"{t:6d}{text}")


def print_shares(title, tokens, us):
    """Each instrument's share of the block per spec and T (us(name, i): µs or None), and the
    share at the default rates: the digests' plus RATE of the shadow's and the probe's."""
    print(f"\n{title}: the instruments' share of the block without them")
    print("spec".ljust(10) + "T".rjust(6) + "".join(k.rjust(13) for k in ONE) +
          "defaults".rjust(13))
    for spec in ("bf16", "nvfp4-row"):
        for i, t in enumerate(tokens):
            one = {k: share(us(spec + k, i), us(spec, i)) for k in ONE}
            parts = (one["+digest"], one["+shadow 1"], one["+probe 1"])
            total = None if None in parts else parts[0] + RATE * (parts[1] + parts[2])
            print(spec.ljust(10) + f"{t:6d}" + "".join(pct(v).rjust(13) for v in one.values()) +
                  pct(total).rjust(13))


def table(results, tokens):
    names = [n for n in results if results[n]]
    for path in ("grouped_mm", "eager"):
        title = f"{path}: µs per forward (profiler busy time)"
        print_table(title, names, tokens,
                    lambda n, i: (results[n]["us"][path][i], results[n]["instr_us"][path][i]))
        print_shares(title, tokens,
                     lambda n, i: results[n]["us"][path][i] if results.get(n) else None)
    title = "grouped_mm captured: graph-replay wall µs per forward (median of demo_profile's runs)"
    print_table(title, names, tokens,
                lambda n, i: (replay_median(results[n], i), replay_instr(results[n], i)))
    print_shares(title, tokens,
                 lambda n, i: replay_median(results[n], i) if results.get(n) else None)
    print("\n(in parentheses: µs the mt_instr_* kernels add to the profiler's busy time; a "
          "captured call skips the shadow and the probe)")


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
