#!/usr/bin/env python3
"""timeline.py — read lab/trace.c's kernel timeline and print, for each CUDA graph the program
replayed, one replay's kernels in start order: when each started and ended after the replay's first
start (µs), how long it ran, and the gap since the kernel before it ended (negative: they
overlapped), then the replays' spans (median, min, max).

    python3 lab/timeline.py timeline.csv [--graphs N] [--replay K]

A graph's replays are told apart by its nodes: a replay is as many kernels as the graph has nodes,
in start order (replays on one stream do not overlap). --replay picks which (default: the middle
one); --graphs prints at most N graphs (default all). Kernels launched outside graphs are left out.
The kind of a graph (cuBLAS, layer, served, check) is guessed from its kernels' names."""
import csv
import statistics
import sys


def short(name):
    name = name.split("(")[0]
    for p in ("void ", "mt_"):
        name = name.removeprefix(p)
    return name[:48]


def kind(names):
    has = lambda s: any(s in n for n in names)
    if not has("mt_"):
        return "cuBLAS"
    if has("refresh") and has("grouped"):
        return "served"
    if has("refresh"):
        return "check"
    return "layer"


def read(path):
    graphs = {}
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            if r["graph"] == "0":
                continue
            graphs.setdefault(r["graph"], []).append(
                (int(r["start_ns"]), int(r["end_ns"]), r["node"], r["grid"], r["cluster"],
                 r["name"]))
    return graphs


def replays(recs):
    recs.sort()
    nodes = len({r[2] for r in recs})
    return [recs[i:i + nodes] for i in range(0, len(recs) - nodes + 1, nodes)], nodes


def show(gid, recs, pick):
    reps, nodes = replays(recs)
    if not reps:
        return
    spans = [(max(r[1] for r in rep) - rep[0][0]) / 1e3 for rep in reps]
    rep = reps[pick if pick is not None and pick < len(reps) else len(reps) // 2]
    t0 = rep[0][0]
    print(f"graph {gid} ({kind([r[5] for r in rep])}): {nodes} kernels a replay, "
          f"{len(reps)} replays, "
          f"span median {statistics.median(spans):.2f} us "
          f"(min {min(spans):.2f}, max {max(spans):.2f})")
    print(f"  {'kernel':48} {'grid':>9} {'cl':>2} {'start':>8} {'end':>8} {'ran':>7} {'gap':>7}")
    last_end = None
    for s, e, _, grid, cl, name in rep:
        gap = "" if last_end is None else f"{(s - last_end) / 1e3:7.2f}"
        print(f"  {short(name):48} {grid:>9} {cl:>2} {(s - t0) / 1e3:8.2f} {(e - t0) / 1e3:8.2f} "
              f"{(e - s) / 1e3:7.2f} {gap:>7}")
        last_end = e if last_end is None else max(last_end, e)


def main(argv):
    if not argv or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    opts = dict(zip(argv[1::2], argv[2::2]))
    unknown = set(opts) - {"--graphs", "--replay"}
    if unknown or len(argv[1:]) % 2:
        print(f"timeline.py: unknown or incomplete options {sorted(unknown) or argv[-1:]}",
              file=sys.stderr)
        return 2
    graphs = read(argv[0])
    limit = int(opts.get("--graphs", len(graphs)))
    pick = int(opts["--replay"]) if "--replay" in opts else None
    for gid in sorted(graphs, key=lambda g: min(r[0] for r in graphs[g]))[:limit]:
        show(gid, graphs[gid], pick)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
