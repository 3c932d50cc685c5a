#!/usr/bin/env python3
"""bench_moe_torch.py — `make bench` (device machine): one MoE layer's expert GEMMs (gate_up, then
down) through HF's default path, torch._grouped_mm BF16, against the grouped NVFP4 engine on the
same routing in the same process.

Geometries and routing are bench/bench_moe.c's: Qwen3-30B-A3B (128 experts, top-8, 1536x2048 and
2048x768) and DeepSeek-V3 (256 experts, top-8, 4096x7168 and 7168x2048), T tokens each sent to 8
distinct experts at random, the rows sorted by expert with int32 cumulative ends (as
transformers' grouped_mm experts call it: torch._grouped_mm(x, w.transpose(-2, -1), offs)). Ours:
the engine's mt_gemm_grouped per GEMM through build/bench/libmt_bench.so (bench/moe_torch.c),
weights resident in the 4.5-bit store, activation quantization included.

Method (bench/bench_common.h's): one CUDA graph per side holding ROUTINGS layer calls, each with
its own routing (16, or 4 from T = 1024), warmed up by two eager calls and one replay; then
REPLAYS replays of each graph, the two sides alternating, all enqueued at once, each timed by CUDA
events on the stream; the median per layer. Per row: µs, the ratio torch / ours, TFLOP/s
(2 * 8T * (N1 K1 + N2 K2)), the bytes/s of the active experts' weights (4.5 bits an element for
ours, 16 for torch's) and, as a sanity check, the relative L2 difference of our outputs against
torch's on the last routing, gate_up's and the layer's (NVFP4 W4A4 against BF16: ~0.14 and ~0.19 on
these data). Writes JSON.

    python3 bench/bench_moe_torch.py [--only qwen3|dsv3] [--tokens T] [--lib PATH] [OUT.json]
"""
import argparse
import ctypes
import json
import os
import random
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPK = 8
REPLAYS = 7
GEOMETRIES = {"qwen3": (128, 2048, 768), "dsv3": (256, 7168, 2048)}  # experts, hidden, width
TOKENS = (1, 16, 128, 1024, 8192)
STORE_BYTES_PER_ELEM = 0.5625  # 4.5 bits: E2M1 codes and an E4M3 scale per 16


def routing_rows(experts, tokens, rng):
    """Rows per expert of `tokens` tokens, each sent to TOPK distinct experts at random."""
    rows = [0] * experts
    for _ in range(tokens):
        for e in rng.sample(range(experts), TOPK):
            rows[e] += 1
    return rows


def cumulative_ends(rows):
    ends, at = [], 0
    for r in rows:
        at += r
        ends.append(at)
    return ends


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=sorted(GEOMETRIES), help="one geometry")
    p.add_argument("--tokens", type=int, choices=TOKENS, help="one T")
    p.add_argument("--lib", default=os.path.join(ROOT, "build", "bench", "libmt_bench.so"),
                   help="the engine's bench library (make bench-build)")
    p.add_argument("out", nargs="?", default=os.path.join(ROOT, "build", "bench_moe_torch.json"))
    return p.parse_args(argv)


def load_lib(path):
    lib = ctypes.CDLL(path)
    c_int, c_size, ptr = ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p
    lib.mtb_status.restype, lib.mtb_status.argtypes = ctypes.c_char_p, [c_int]
    lib.mtb_store_bytes.restype, lib.mtb_store_bytes.argtypes = c_size, [c_int, c_int, c_int]
    lib.mtb_store_quantize.argtypes = [ptr, c_int, c_int, c_int, ptr, ptr]
    lib.mtb_workspace_bytes.restype, lib.mtb_workspace_bytes.argtypes = c_size, [c_int, c_int]
    lib.mtb_grouped.argtypes = [c_int, c_int, c_int, ptr, ptr, c_int, ptr, ptr, ptr, c_size, ptr]
    return lib


class Bench:
    def __init__(self, torch, lib):
        self.torch, self.lib = torch, lib
        self.stream = torch.cuda.Stream()

    def ok(self, st, what):
        if st != 0:
            raise RuntimeError(f"{what}: {self.lib.mtb_status(st).decode()}")

    def after_setup(self):
        """The bench's stream waits for the work enqueued on the current stream (the tensors made
        there): torch's side streams do not synchronize with the default stream, and a kernel of
        ours would read a weight or the routing before they are written."""
        self.stream.wait_stream(self.torch.cuda.current_stream())

    def store(self, w):
        """w (experts x n x k, BF16) in the engine's store: a uint8 tensor of its bytes."""
        e, n, k = w.shape
        nbytes = self.lib.mtb_store_bytes(e, n, k)
        if not nbytes:
            raise RuntimeError(f"the store cannot hold {e} x {n}x{k}")
        mem = self.torch.empty(nbytes, dtype=self.torch.uint8, device="cuda")
        self.after_setup()
        with self.torch.cuda.stream(self.stream):
            self.ok(self.lib.mtb_store_quantize(w.data_ptr(), e, n, k, mem.data_ptr(),
                                                self.stream.cuda_stream), "quantizing")
        self.stream.synchronize()
        return mem

    def graph(self, fn, calls):
        """A graph of fn(0) .. fn(calls - 1) on the bench's stream, after two eager calls."""
        torch = self.torch
        self.after_setup()
        with torch.cuda.stream(self.stream):
            fn(0), fn(1 % calls)
        self.stream.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=self.stream):
            for i in range(calls):
                fn(i)
        g.replay()
        return g

    def time_pair(self, graphs, calls):
        """Median seconds per call of each graph over REPLAYS replays each, the graphs alternating,
        all enqueued before the first is waited for (no host gap between replays)."""
        torch = self.torch
        marks = []
        with torch.cuda.stream(self.stream):
            for _ in range(REPLAYS):
                for g in graphs:
                    a, b = (torch.cuda.Event(enable_timing=True),
                            torch.cuda.Event(enable_timing=True))
                    a.record(self.stream)
                    g.replay()
                    b.record(self.stream)
                    marks.append((a, b))
        self.stream.synchronize()
        n = len(graphs)
        return [statistics.median(a.elapsed_time(b) * 1e-3 / calls for a, b in marks[j::n])
                for j in range(n)]


def compare(torch, what, ours, ref):
    """Relative L2 difference of ours against ref over the elements finite in both; a line on
    stderr for non-finite elements in either (none expected: the data are Gaussian)."""
    a, r = ours.float(), ref.float()
    fa, fr = torch.isfinite(a), torch.isfinite(r)
    bad_a, bad_r = (~fa).sum().item(), (~fr).sum().item()
    if bad_a or bad_r:
        rows_a = (~fa).any(dim=1).nonzero().flatten().tolist()
        rows_r = (~fr).any(dim=1).nonzero().flatten().tolist()
        print(f"bench_moe_torch: {what}: {bad_a} non-finite outputs of ours (rows {rows_a[:8]}), "
              f"{bad_r} of torch's (rows {rows_r[:8]})", file=sys.stderr)
    both = fa & fr
    a, r = a[both], r[both]
    return ((a - r).norm() / r.norm()).item()


def bench_geometry(b, name, experts, hidden, width, only_tokens, rows_out):
    torch = b.torch
    gen = torch.Generator(device="cuda").manual_seed(1)
    rng = random.Random(1)
    w_up = torch.randn(experts, 2 * width, hidden, device="cuda", dtype=torch.bfloat16,
                       generator=gen) * 0.02
    w_down = torch.randn(experts, hidden, width, device="cuda", dtype=torch.bfloat16,
                         generator=gen) * 0.02
    q_up, q_down = b.store(w_up), b.store(w_down)
    elems = experts * 3 * width * hidden
    print(f"{name}: {experts} experts, top-{TOPK}, gate_up {2 * width}x{hidden}, down "
          f"{hidden}x{width}; weights {elems * 2 / 1e6:.0f} MB BF16, "
          f"{(q_up.numel() + q_down.numel()) / 1e6:.0f} MB in the store "
          f"({(q_up.numel() + q_down.numel()) / elems:.3f} bytes an element)")
    print(f"{'T':>6} | {'ours us':>10} {'torch us':>10} {'ratio':>7} | {'TF/s':>8} {'TF/s':>8} | "
          f"{'wGB/s':>9} {'wGB/s':>9} | {'rel L2':>7} {'layer':>7}")
    for t in TOKENS:
        if only_tokens and t != only_tokens:
            continue
        rows, calls = TOPK * t, (4 if t >= 1024 else 16)
        routings = [routing_rows(experts, t, rng) for _ in range(calls)]
        offs = [torch.tensor(cumulative_ends(r), dtype=torch.int32, device="cuda")
                for r in routings]
        active = sum(sum(1 for r in rt if r) for rt in routings) / calls
        x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16, generator=gen)
        h = torch.empty(rows, 2 * width, device="cuda", dtype=torch.bfloat16)
        y = torch.empty(rows, hidden, device="cuda", dtype=torch.bfloat16)
        ws_bytes = max(b.lib.mtb_workspace_bytes(rows, hidden),
                       b.lib.mtb_workspace_bytes(rows, width))
        ws = torch.empty(ws_bytes, dtype=torch.uint8, device="cuda")
        out = {}

        def ours(i):
            s = b.stream.cuda_stream
            b.ok(b.lib.mtb_grouped(experts, 2 * width, hidden, q_up.data_ptr(), offs[i].data_ptr(),
                                   rows, x.data_ptr(), h.data_ptr(), ws.data_ptr(), ws_bytes, s),
                 "gate_up")
            b.ok(b.lib.mtb_grouped(experts, hidden, width, q_down.data_ptr(), offs[i].data_ptr(),
                                   rows, h.data_ptr(), y.data_ptr(), ws.data_ptr(), ws_bytes, s),
                 "down")

        def torch_layer(i):
            hh = out["h"] = torch._grouped_mm(x, w_up.transpose(-2, -1), offs=offs[i])
            # down reads the first rows x width elements of gate_up's output as its input, as
            # ours does (and bench_moe): the layer's activation function is not timed
            hh = hh.view(-1)[:rows * width].view(rows, width)
            out["y"] = torch._grouped_mm(hh, w_down.transpose(-2, -1), offs=offs[i])

        g_ours, g_torch = b.graph(ours, calls), b.graph(torch_layer, calls)
        t_ours, t_torch = b.time_pair([g_ours, g_torch], calls)
        # the sanity column: the last routing's layer, eagerly, ours against torch's
        with torch.cuda.stream(b.stream):
            ours(calls - 1)
            torch_layer(calls - 1)
        b.stream.synchronize()
        rel_h = compare(torch, f"{name} T={t} gate_up", h, out["h"])
        rel = compare(torch, f"{name} T={t} layer", y, out["y"])
        flops = 2.0 * rows * (2 * width * hidden + hidden * width)
        wbytes = active / experts * elems * 2
        print(f"{t:>6} | {t_ours * 1e6:>10.2f} {t_torch * 1e6:>10.2f} {t_torch / t_ours:>7.2f} | "
              f"{flops / t_ours * 1e-12:>8.1f} {flops / t_torch * 1e-12:>8.1f} | "
              f"{wbytes / 2 * STORE_BYTES_PER_ELEM / t_ours * 1e-9:>9.0f} "
              f"{wbytes / t_torch * 1e-9:>9.0f} | {rel_h:>7.4f} {rel:>7.4f}", flush=True)
        rows_out.append({"kind": "moe_layer_torch", "geometry": name, "tokens": t,
                         "ours_us": round(t_ours * 1e6, 3),
                         "grouped_mm_us": round(t_torch * 1e6, 3),
                         "ratio": round(t_torch / t_ours, 4), "active_experts": round(active, 1),
                         "rel_l2_gate_up": round(rel_h, 5), "rel_l2_layer": round(rel, 5)})


def main(argv):
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("bench_moe_torch: needs PyTorch (pip install torch) with CUDA", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("bench_moe_torch: no GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 1
    if not hasattr(torch, "_grouped_mm"):
        print(f"bench_moe_torch: this PyTorch ({torch.__version__}) has no torch._grouped_mm "
              "(2.9 or later)", file=sys.stderr)
        return 1
    if not os.path.exists(args.lib):
        print(f"bench_moe_torch: {args.lib} not found: run `make bench-build` first",
              file=sys.stderr)
        return 1
    b = Bench(torch, load_lib(args.lib))
    rows = []
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    for name, (experts, hidden, width) in GEOMETRIES.items():
        if not args.only or args.only == name:
            bench_geometry(b, name, experts, hidden, width, args.tokens, rows)
    with open(args.out, "w") as f:
        json.dump({"replays": REPLAYS, "torch": torch.__version__, "results": rows}, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
