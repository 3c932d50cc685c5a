#!/usr/bin/env python3
"""bench_moe_vllm.py — `make bench-vllm` (device machine): one MoE layer's expert GEMMs as a vLLM
sampler runs them, vLLM's BF16 Triton kernel (fused_moe_kernel, launched by vLLM's own launcher
from the real source of vLLM 0.33.0: `make vllm-sources`) against the grouped NVFP4 engine as the
launch door runs it, on the same dispatch, in the same process.

Geometries (bench_moe_torch.py's): Qwen3-30B-A3B (128 experts, top-8, w13 1536x2048, w2 2048x768)
and DeepSeek-V3 (256 experts, top-8, w13 4096x7168, w2 7168x2048); T tokens each sent to 8
distinct experts at random. vLLM's side: GEMM1, then GEMM2 multiplying by the router weights, each
with vLLM's config for the shape: its default (get_default_config) and, where vLLM ships a tuned
file for this GPU, the tuned one (try_get_optimal_moe_config); vLLM's naive dispatch where vLLM
takes it (num_tokens * top_k * 4 <= experts), else the sorted one. Ours: for each GEMM the
engine's dispatch, the activations' quantization and the grouped GEMM (build/bench/libmt_bench.so,
mtb_dispatched), the weights resident in the 4.5-bit store, on the same sorted token ids, expert
ids and slots, with the block_m of the tuned config (else the default's). Not timed on either
side: the dispatch's align step (moe_align_block_size, a CUDA op of vLLM's C extension, which needs
PyTorch 2.14: written here with torch ops) and the activation between the GEMMs, which both
paths share; the frozen store's sampled check (docs/performance.md gives its cost).

Method (bench_moe_torch.py's Bench): one CUDA graph per side holding ROUTINGS layer calls (16, or
4 from T = 1024), each with its own routing; REPLAYS replays of each graph, the sides alternating,
the median per layer. Per row: µs, the ratio vLLM / ours for each vLLM config, and the relative L2
difference of our GEMM1 output against vLLM's (NVFP4 W4A4 against BF16: ~0.14). Writes JSON.

    python3 bench/bench_moe_vllm.py [--only qwen3|dsv3] [--tokens T] [--lib PATH] [OUT.json]
"""
import argparse
import ctypes
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "gpu"))
from bench_moe_torch import GEOMETRIES, TOKENS, TOPK, Bench, compare, load_lib  # noqa: E402


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=sorted(GEOMETRIES), help="one geometry")
    p.add_argument("--tokens", type=int, choices=TOKENS, help="one T")
    p.add_argument("--lib", default=os.path.join(ROOT, "build", "bench", "libmt_bench.so"))
    p.add_argument("out", nargs="?", default=os.path.join(ROOT, "build", "bench_moe_vllm.json"))
    return p.parse_args(argv)


def with_dispatch(lib):
    c_int, c_size, ptr = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p
    lib.mtb_lists_bytes.restype, lib.mtb_lists_bytes.argtypes = c_size, [c_int, c_int, c_int]
    lib.mtb_dispatched.argtypes = [c_int, c_int, c_int, ptr, ptr, ptr, ptr, ptr, c_int, c_int,
                                   c_int, c_int, ptr, c_int, ptr, c_int, ptr, ptr, c_size, ptr]
    return lib


def routing(torch, experts, tokens, rng):
    ids = torch.tensor([rng.sample(range(experts), TOPK) for _ in range(tokens)], dtype=torch.int32)
    w = torch.rand(tokens, TOPK,
                   generator=torch.Generator().manual_seed(rng.randrange(1 << 30))) + 0.0625
    return ids.cuda(), (w / w.sum(1, keepdim=True)).cuda()


def bench_geometry(b, fm, vs, name, experts, hidden, width, only_tokens, rows_out):
    torch = b.torch
    gen = torch.Generator(device="cuda").manual_seed(1)
    rng = random.Random(1)
    w13 = torch.randn(experts, 2 * width, hidden, device="cuda", dtype=torch.bfloat16,
                      generator=gen) * 0.02
    w2 = torch.randn(experts, hidden, width, device="cuda", dtype=torch.bfloat16,
                     generator=gen) * 0.02
    q13, q2 = b.store(w13), b.store(w2)
    print(f"{name}: {experts} experts, top-{TOPK}, w13 {2 * width}x{hidden}, w2 {hidden}x{width}")
    print(f"{'T':>6} {'block_m':>7} | {'ours us':>9} {'default':>9} {'ratio':>6} {'tuned':>9} "
          f"{'ratio':>6} | {'rel L2':>7}")
    for t in TOKENS:
        if only_tokens and t != only_tokens:
            continue
        calls, rows = (4 if t >= 1024 else 16), TOPK * t
        default = fm.get_default_config(t, experts, width, hidden, TOPK, None)
        tuned = fm.try_get_optimal_moe_config(w13.size(), w2.size(), TOPK, None, t)
        configs = {"default": default}
        if tuned != default:
            configs["tuned"] = tuned
        bm = (tuned or default)["BLOCK_SIZE_M"]
        x = torch.randn(t, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
        a2 = torch.randn(rows, width, device="cuda", dtype=torch.bfloat16, generator=gen)
        routes = [routing(torch, experts, t, rng) for _ in range(calls)]
        disp = {}
        for cname, cfg in dict(configs, ours=dict(default, BLOCK_SIZE_M=bm)).items():
            disp[cname] = []
            for ids, _ in routes:
                disp[cname].append(vs.dispatch(ids, cfg["BLOCK_SIZE_M"], experts))
        naive = disp["ours"][0][0] is None  # vLLM's naive dispatch: no sorted token ids
        out = {k: (torch.empty(t, TOPK, 2 * width, device="cuda", dtype=torch.bfloat16),
                   torch.empty(t, TOPK, hidden, device="cuda", dtype=torch.bfloat16))
               for k in list(configs) + ["ours"]}
        ws_bytes = max(b.lib.mtb_workspace_bytes(rows, hidden),
                       b.lib.mtb_workspace_bytes(rows, width))
        ws = torch.empty(ws_bytes, dtype=torch.uint8, device="cuda")
        lists = torch.empty(b.lib.mtb_lists_bytes(rows, experts, 1), dtype=torch.uint8,
                            device="cuda")

        def vllm_layer(cname):
            cfg = configs[cname]

            def run(i):
                sorted_ids, expert_ids, padded = disp[cname][i]
                c1, c2 = out[cname]
                for a, w, c, mul, top_k in ((x, w13, c1, False, TOPK), (a2, w2, c2, True, 1)):
                    vs.invoke(fm, a, w, c, routes[i][1], sorted_ids, expert_ids, padded, mul,
                              top_k, cfg)
            return run

        def ours(i):
            sorted_ids, expert_ids, padded = disp["ours"][i]
            c1, c2 = out["ours"]
            # vLLM's grid rows: cdiv(EM, block_m), EM = numel * block_m naive, else the ids' length
            blocks = expert_ids.numel() if naive else (sorted_ids.numel() + bm - 1) // bm
            s = b.stream.cuda_stream
            for q, n, k, a, c, top_k, wts in ((q13, 2 * width, hidden, x, c1, TOPK, None),
                                             (q2, hidden, width, a2, c2, 1, routes[i][1])):
                b.ok(b.lib.mtb_dispatched(experts, n, k, q.data_ptr(),
                                          sorted_ids.data_ptr() if sorted_ids is not None else None,
                                          expert_ids.data_ptr(), padded.data_ptr(),
                                          wts.data_ptr() if wts is not None else None, blocks, bm,
                                          top_k, rows, a.data_ptr(), k, c.data_ptr(), n,
                                          lists.data_ptr(), ws.data_ptr(), ws_bytes, s), name)

        graphs = [b.graph(ours, calls)] + [b.graph(vllm_layer(c), calls) for c in configs]
        times = b.time_pair(graphs, calls)
        with torch.cuda.stream(b.stream):
            ours(calls - 1)
            vllm_layer("default")(calls - 1)
        b.stream.synchronize()
        rel = compare(torch, f"{name} T={t} GEMM1", out["ours"][0].view(rows, -1),
                      out["default"][0].view(rows, -1))
        t_ours = times[0]
        ratios = {c: times[1 + j] / t_ours for j, c in enumerate(configs)}
        tuned_us = (f"{times[2] * 1e6:>9.2f} {ratios['tuned']:>6.2f}" if "tuned" in configs
                    else f"{'-':>9} {'-':>6}")
        print(f"{t:>6} {bm:>7} | {t_ours * 1e6:>9.2f} {times[1] * 1e6:>9.2f} "
              f"{ratios['default']:>6.2f} {tuned_us} | "
              f"{rel:>7.4f}", flush=True)
        rows_out.append({"kind": "moe_layer_vllm", "geometry": name, "tokens": t, "naive": naive,
                         "block_m": bm,
                         "ours_us": round(t_ours * 1e6, 3),
                         "vllm_us": {c: round(times[1 + j] * 1e6, 3)
                                     for j, c in enumerate(configs)},
                         "ratio": {c: round(r, 4) for c, r in ratios.items()},
                         "configs": {c: configs[c] for c in configs},
                         "rel_l2_gemm1": round(rel, 5)})


def main(argv):
    args = parse_args(argv)
    try:
        import torch
        import vllm_sources as vs
    except ImportError as e:
        print(f"bench_moe_vllm: needs PyTorch and Triton ({e})", file=sys.stderr)
        return 1
    if not torch.cuda.is_available() or not os.path.exists(args.lib):
        print(f"bench_moe_vllm: needs a GPU and {args.lib} (make bench-build)", file=sys.stderr)
        return 1
    try:
        fm = vs.vllm()
    except FileNotFoundError as e:
        print(f"bench_moe_vllm: {e}", file=sys.stderr)
        return 1
    b = Bench(torch, with_dispatch(load_lib(args.lib)))
    rows = []
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, "
          f"vLLM {vs.VLLM}'s fused_moe_kernel")
    for name, (experts, hidden, width) in GEOMETRIES.items():
        if not args.only or args.only == name:
            bench_geometry(b, fm, vs, name, experts, hidden, width, args.tokens, rows)
    with open(args.out, "w") as f:
        json.dump({"results": rows}, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
