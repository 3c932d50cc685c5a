"""test_multi_gpu.py — the shim on every rank of a torchrun job (demo/ep_demo.py: HF Qwen3-MoE with
Qwen3-30B-A3B's expert geometry, a data-parallel learner and an expert-parallel split whose tokens
travel by all_to_all_single), statistics per rank through MINITE_STATS=stats.%r.jsonl, merged by
tools/minite-merge.

    make && python3 tests/gpu/test_multi_gpu.py [NAME ...]     (NAME: a part of a test's name)

With one GPU or more:
- two_ranks_share_one_gpu: two ranks on the first visible GPU (CUDA_VISIBLE_DEVICES set to it;
  gloo, NCCL refuses two ranks on one GPU), each layout run without the shim, under bf16 and under
  nvfp4-row with the expert routes. Asserts on every rank and layout: the step-0 logits and loss
  under bf16 bitwise those without the shim; under nvfp4-row expert calls routed on every rank,
  the step-0 loss within 2% of BF16's, everything finite; the EP split's bookkeeping (each rank
  holds half the experts, and the two ranks together ran every token's top-8 expert rows once);
  under nvfp4-row the EP layout's step-0 logits bitwise those of the data-parallel layout (the
  engine is batch invariant: a row's bits do not depend on the other rows of its GEMM); one
  statistics file per rank whose start record names its rank, world size 2 and the GPU (device
  0 and the PCI address nvidia-smi gives); minite-merge's totals equal to the sum of the ranks'.
  Prints tokens/s per rank with and without the shim.
- device_follows_cuda_visible_devices: one process (world of one) with CUDA_VISIBLE_DEVICES
  inherited, and with it set to the last visible GPU's index: the start record and the summary's
  engine context name device 0 and the PCI address of the GPU that CUDA_VISIBLE_DEVICES chose
  (CUDA_DEVICE_ORDER=PCI_BUS_ID, nvidia-smi's numbering), with expert calls routed there.
With two GPUs or more (skipped otherwise):
- several_gpus: N ranks, one GPU each (NCCL), the same checks with device = local rank and N
  distinct PCI addresses; then the scaling of the job's tokens/s from 1 to N GPUs (powers of two;
  the same batch per rank, so ideal is N times one GPU's), with and without the shim, printed.

Every launch uses one decoder layer, 2 sequences of 256 tokens per rank and 3 steps, so that each
takes well under two minutes. Skips (not passes) without torch, transformers or a GPU.
"""
import glob
import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
from demo_common import (LIB, ROUTE, TMP, harness, probe_torch, records,  # noqa: E402
                         require_lib)

DEMO = os.path.join(ROOT, "demo", "ep_demo.py")
MERGE = os.path.join(ROOT, "tools", "minite-merge")
LAYERS, BATCH, SEQ, STEPS, TOP_K, EXPERTS = 1, 2, 256, 3, 8, 128
ARGS = ["--layers", LAYERS, "--batch", BATCH, "--seq", SEQ, "--steps", STEPS]
LOSS_RTOL = 0.02
LAUNCH_TIMEOUT = 300


# ---- the machine ------------------------------------------------------------------------------

def gpu_count():
    """GPUs torch sees; skips without torch, transformers or a GPU, fails without the library."""
    n = int(probe_torch("torch.cuda.device_count()") or 0)
    if n == 0:
        harness.skip("torch sees no CUDA GPU")
    require_lib()
    return n


def bus(text):
    """A PCI address as "bb:dd.f" (nvidia-smi writes an 8-digit domain, CUDA a 4-digit one)."""
    parts = (text or "").strip().lower().split(":")
    return ":".join(parts[-2:]) if len(parts) >= 2 else ""


def smi_buses():
    """nvidia-smi's GPUs: {index: "bb:dd.f"} in its (PCI) numbering."""
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=index,pci.bus_id",
                              "--format=csv,noheader"], capture_output=True, text=True)
    except OSError:
        return {}
    out = {}
    for line in res.stdout.splitlines():
        if "," in line:
            i, b = line.split(",", 1)
            out[int(i)] = bus(b)
    return out


def visible_indices():
    """The nvidia-smi indices of the GPUs this process may use (CUDA_VISIBLE_DEVICES as numbers,
    else all)."""
    v = os.environ.get("CUDA_VISIBLE_DEVICES")
    if v is None or not v.strip():
        return sorted(smi_buses()) or [0]
    try:
        return [int(x) for x in v.split(",") if x.strip()]
    except ValueError:
        harness.skip(f"CUDA_VISIBLE_DEVICES={v} names GPUs by UUID: give indices")


# ---- launches ---------------------------------------------------------------------------------

def launch(tag, nproc, spec=None, modes="ddp,ep", env_extra=None, torchrun=True, args=ARGS):
    """Run demo/ep_demo.py on nproc ranks (torchrun) or as one plain process. Returns
    {"rc", "wall", "ranks": {(mode, rank): result}, "stats": {rank: path}, "summary", "err"}."""
    out = os.path.join(TMP, tag)
    os.makedirs(out, exist_ok=True)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("MINITE_") and k not in ("LD_PRELOAD", "RANK", "LOCAL_RANK",
                                                       "WORLD_SIZE", "LOCAL_WORLD_SIZE")}
    # NVLink multicast stays off (it can put a shared host's GPUs out of service; the device
    # machines set these, and a launch keeps them whatever the caller's environment says)
    env.update(PYTHONUNBUFFERED="1", CUDA_DEVICE_ORDER="PCI_BUS_ID", NCCL_NVLS_ENABLE="0",
               TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1")
    if spec:
        env.update(LD_PRELOAD=LIB, MINITE_SPEC=spec, MINITE_ROUTE=ROUTE, MINITE_ROLE="learner",
                   MINITE_STATS=os.path.join(out, "stats.%r.jsonl"))
    env.update(env_extra or {})
    cmd = [sys.executable]
    if torchrun:
        cmd += ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    cmd += [DEMO, "--mode", modes, "--out", out] + [str(a) for a in args]
    t0 = time.time()
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=out,
                             timeout=LAUNCH_TIMEOUT)
        rc, stdout, stderr = res.returncode, res.stdout, res.stderr
    except subprocess.TimeoutExpired as e:
        rc, stdout, stderr = 124, e.stdout or "", str(e.stderr or "")
    wall = time.time() - t0
    if rc != 0:
        tail = stderr.splitlines()[-25:] if isinstance(stderr, str) else []
        print(f"    {tag}: exit {rc} after {wall:.0f} s; stderr tail:\n" +
              "\n".join("      " + x for x in tail))
    ranks = {}
    for path in glob.glob(os.path.join(out, "rank*-*.json")):
        with open(path) as f:
            r = json.load(f)
        ranks[(r["mode"], r["rank"])] = r
    stats = {}
    for path in glob.glob(os.path.join(out, "stats.*.jsonl")):
        stats[int(path.rsplit(".", 2)[-2])] = path
    summary = None
    for line in (stdout or "").splitlines():
        if line.startswith("{"):
            summary = json.loads(line)
    print(f"    {tag}: {nproc} rank(s), {spec or 'no shim'}, exit {rc}, {wall:.0f} s")
    return {"rc": rc, "wall": wall, "ranks": ranks, "stats": stats, "summary": summary,
            "err": stderr}


def merged(paths):
    res = subprocess.run([sys.executable, MERGE, "--json"] + list(paths), capture_output=True,
                         text=True)
    harness.check(res.returncode == 0, f"minite-merge exit {res.returncode}: {res.stderr}")
    if res.returncode != 0:
        return None
    table = subprocess.run([sys.executable, MERGE] + list(paths), capture_output=True, text=True)
    print("\n".join("      " + x for x in table.stdout.splitlines()[:12]))
    return json.loads(res.stdout)


# ---- the checks of one job --------------------------------------------------------------------

def check_job(none, bf16, nvfp4, nproc, buses_of_rank, shared_gpu):
    """The assertions two_ranks_share_one_gpu and several_gpus share. buses_of_rank[r]: the PCI
    address rank r's GPU must have."""
    for name, run in (("no shim", none), ("bf16", bf16), ("nvfp4-row", nvfp4)):
        harness.check(run["rc"] == 0, f"{name}: exit {run['rc']}")
        want = {(m, r) for m in ("ddp", "ep") for r in range(nproc)}
        harness.check(set(run["ranks"]) == want,
                      f"{name}: results of {sorted(run['ranks'])}, want {sorted(want)}")
    for (mode, rank), base in sorted(none["ranks"].items()):
        b, q = bf16["ranks"].get((mode, rank)), nvfp4["ranks"].get((mode, rank))
        if not b or not q:
            continue
        label = f"{mode} rank {rank}"
        harness.check(base["world"] == nproc and base["shared_gpu"] == shared_gpu,
                      f"{label}: world {base['world']}, shared GPU {base['shared_gpu']}")
        harness.check(b["shim"] and q["shim"] and not base["shim"], f"{label}: shim loaded?")
        harness.check(b["logits_sha256"] == base["logits_sha256"] and
                      b["first_loss"] == base["first_loss"],
                      f"{label}: bf16 step 0 not bitwise the run without the shim "
                      f"(loss {b['first_loss']!r} vs {base['first_loss']!r})")
        print(f"    {label}: bf16 later steps "
              f"{'equal' if b['losses'] == base['losses'] else 'differ'}"
              " to the run without the shim")
        rel = abs(q["first_loss"] - base["first_loss"]) / base["first_loss"]
        harness.check(q["finite"] and base["finite"] and rel <= LOSS_RTOL,
                      f"{label}: nvfp4-row loss {q['first_loss']:.6f} vs {base['first_loss']:.6f} "
                      f"({rel:.3%}), finite {q['finite']}")
        print(f"    {label}: step-0 loss {base['first_loss']:.6f} / nvfp4-row {q['first_loss']:.6f}"
              f" ({rel:.3%}); tokens/s {base['tokens_per_s']:.0f} / {q['tokens_per_s']:.0f}"
              f" ({q['tokens_per_s'] / base['tokens_per_s']:.2f}x)")
    per_rank = BATCH * SEQ * TOP_K * LAYERS
    for run in (none, nvfp4):
        ep = [run["ranks"].get(("ep", r)) for r in range(nproc)]
        if all(ep):
            harness.check(sum(r["expert_rows_step0"] for r in ep) == nproc * per_rank,
                          f"EP: expert rows {[r['expert_rows_step0'] for r in ep]}, want "
                          f"{nproc * per_rank} in all")
            harness.check([r["experts_held"] for r in ep] ==
                          [[r * EXPERTS // nproc, (r + 1) * EXPERTS // nproc]
                           for r in range(nproc)],
                          f"EP: experts held {[r['experts_held'] for r in ep]}")
        ddp = [run["ranks"].get(("ddp", r)) for r in range(nproc)]
        if all(ddp):
            harness.check(all(r["expert_rows_step0"] == per_rank for r in ddp),
                          f"DDP: expert rows {[r['expert_rows_step0'] for r in ddp]}")
    for r in range(nproc):
        d, e = nvfp4["ranks"].get(("ddp", r)), nvfp4["ranks"].get(("ep", r))
        if d and e:
            harness.check(d["logits_sha256"] == e["logits_sha256"],
                          f"rank {r}: nvfp4-row logits of the EP layout differ from the DDP "
                          f"layout's (loss {e['first_loss']!r} vs {d['first_loss']!r})")
    check_stats(nvfp4, nproc, buses_of_rank)


def check_stats(run, nproc, buses_of_rank):
    harness.check(sorted(run["stats"]) == list(range(nproc)),
                  f"statistics files of ranks {sorted(run['stats'])}")
    routed = {}
    for rank, path in sorted(run["stats"].items()):
        start, summary = records(path)
        harness.check(start is not None and summary is not None, f"{path}: records missing")
        if not start or not summary:
            continue
        harness.check(start["rank"] == rank and start["world_size"] == nproc and
                      start["local_rank"] == rank, f"rank {rank}: start record {start}")
        ctxs = (summary.get("engine") or {}).get("contexts") or []
        want_dev = 0 if len(set(buses_of_rank)) == 1 else rank
        want_bus = buses_of_rank[rank] or bus(start["pci_bus"])  # None: nvidia-smi said nothing
        harness.check(start["device"] == want_dev and bus(start["pci_bus"]) == want_bus,
                      f"rank {rank}: device {start['device']} at {start['pci_bus']}, want "
                      f"{want_dev} at {want_bus}")
        harness.check(len(ctxs) == 1 and bus(ctxs[0]["pci_bus"]) == want_bus and
                      ctxs[0]["routed"] == summary["routed"],
                      f"rank {rank}: contexts {ctxs}, routed {summary['routed']}")
        routed[rank] = summary["routed"]
        harness.check(summary["routed"] > 0, f"rank {rank}: nothing routed: "
                      f"{summary.get('fallbacks')}")
        print(f"    rank {rank}: {summary['gemm_calls']} GEMM calls, {summary['routed']} routed, "
              f"fallbacks {summary.get('fallbacks')}")
    doc = merged([run["stats"][r] for r in sorted(run["stats"])])
    if doc:
        harness.check(doc["processes"] == nproc and doc["missing_ranks"] == [] and
                      doc["total"]["routed"] == sum(routed.values()),
                      f"merged: {doc['processes']} processes, missing {doc['missing_ranks']}, "
                      f"routed {doc['total']['routed']} vs {routed}")


# ---- the tests --------------------------------------------------------------------------------

def test_two_ranks_share_one_gpu():
    gpu_count()
    first = visible_indices()[0]
    env = {"CUDA_VISIBLE_DEVICES": str(first)}
    runs = [launch(f"shared-{s or 'none'}", 2, s, env_extra=env)
            for s in (None, "bf16", "nvfp4-row")]
    check_job(*runs, 2, [smi_buses().get(first)] * 2, shared_gpu=True)


def test_device_follows_cuda_visible_devices():
    gpu_count()
    buses = smi_buses()
    if not buses:
        harness.skip("nvidia-smi lists no GPU: the PCI addresses cannot be checked")
    vis = visible_indices()
    cases = [("inherited", None, vis[0]), ("last", str(vis[-1]), vis[-1])]
    for tag, value, physical in cases:
        env = {"CUDA_VISIBLE_DEVICES": value} if value is not None else {}
        run = launch(f"cvd-{tag}", 1, "nvfp4-row", modes="ddp", env_extra=env, torchrun=False,
                     args=ARGS[:-1] + [1])
        harness.check(run["rc"] == 0 and sorted(run["stats"]) == [0], f"{tag}: {run['stats']}")
        if not run["stats"]:
            continue
        start, summary = records(run["stats"][0])
        ctxs = ((summary or {}).get("engine") or {}).get("contexts") or []
        harness.check(start and start["device"] == 0 and bus(start["pci_bus"]) == buses[physical],
                      f"{tag}: start {start}, want device 0 at {buses[physical]} (nvidia-smi "
                      f"index {physical})")
        harness.check(len(ctxs) == 1 and bus(ctxs[0]["pci_bus"]) == buses[physical] and
                      ctxs[0]["routed"] > 0, f"{tag}: contexts {ctxs}")
        print(f"    CUDA_VISIBLE_DEVICES {value if value is not None else '(inherited)'}: device "
              f"{start and start['device']} at {start and start['pci_bus']}")


def test_several_gpus():
    n = gpu_count()
    if n < 2:
        harness.skip(f"{n} GPU visible: the several-GPU job needs 2 or more")
    buses = smi_buses()
    vis = visible_indices()[:n]
    if len(vis) < n:
        vis = list(range(n))
    runs = {s: launch(f"n{n}-{s or 'none'}", n, s) for s in (None, "bf16", "nvfp4-row")}
    check_job(runs[None], runs["bf16"], runs["nvfp4-row"], n, [buses.get(i) for i in vis],
              shared_gpu=False)
    # scaling: the job's tokens/s (sum over ranks) against one GPU's, same batch per rank
    sizes = [1 << i for i in range(int(math.log2(n)) + 1)]
    if sizes[-1] != n:
        sizes.append(n)
    table = {}
    for size in sizes:
        for spec in (None, "nvfp4-row"):
            run = runs[spec] if size == n else launch(f"scale{size}-{spec or 'none'}", size, spec)
            harness.check(run["rc"] == 0 and run["summary"],
                          f"{size} GPUs {spec}: exit {run['rc']}")
            if run["summary"]:
                for mode, m in run["summary"]["modes"].items():
                    table[(mode, size, spec)] = m["job_tokens_per_s"]
    print("    scaling (job tokens/s; efficiency = tokens/s / (GPUs x one GPU's)):")
    for mode in ("ddp", "ep"):
        for spec in (None, "nvfp4-row"):
            one = table.get((mode, 1, spec))
            row = []
            for size in sizes:
                t = table.get((mode, size, spec))
                if t and one:
                    row.append(f"{size}: {t:.0f} ({t / (size * one):.2f})")
            print(f"      {mode} {spec or 'no shim'}: " + ", ".join(row))


# Arguments pick tests by a part of their name (several_gpus: the N-GPU job alone; harness.run).
for t in (test_two_ranks_share_one_gpu, test_device_follows_cuda_visible_devices,
          test_several_gpus):
    harness.run(t)
sys.exit(harness.done())
