"""routed_child.py CASE OUT — one workload of tests/gpu/test_routed.py, run in a process of its own
(the parent sets LD_PRELOAD and the MINITE_* variables). Writes OUT.npz with the tensors the parent
compares. Not a test by itself.

Cases:
  linear   y = F.linear(x, W) for M in 1, 7, 64, 300 (both GEMM paths), weight 256 x 512
  inplace  y1 = F.linear(x, W); W.copy_(W2) in place; y2 = F.linear(x, W); y3 = F.linear(x, W2'),
           W2' a separate copy of W2 (another address, so another cache entry)
  graph    a routed F.linear captured in a CUDA graph after a warm-up on the capture stream; x and
           W overwritten in place between replays; eager results for the same inputs
  graph_cold  the same capture with no routed warm-up (only an FP32 GEMM, so that cuBLAS has its
           handle): the shim must fall back (reason "capture") and the graph must still compute
           cuBLAS's result
"""
import torch
import torch.nn.functional as F

from shim_child import child_main, f32, rand

N, K = 256, 512


def case_linear():
    w = rand(N, K, seed=1)
    out = {"w": f32(w)}
    for m in (1, 7, 64, 300):
        x = rand(m, K, seed=100 + m)
        out[f"x{m}"], out[f"y{m}"] = f32(x), f32(F.linear(x, w))
    return out


def case_inplace():
    x, w, w2 = rand(5, K, seed=2), rand(N, K, seed=3), rand(N, K, seed=4)
    y1 = F.linear(x, w)
    w.copy_(w2)
    y2 = F.linear(x, w)
    y3 = F.linear(x, w2.clone())
    return {"y1": f32(y1), "y2": f32(y2), "y3": f32(y3)}


def capture(warm):
    x, w = rand(5, K, seed=5), rand(N, K, seed=6)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        if warm:  # PyTorch's own pattern: run once on the capture stream before capturing
            F.linear(x, w)
        else:  # cuBLAS itself cannot create its handle while capturing: make it with an FP32
            torch.mm(x.float(), w.float().t())  # GEMM, which the shim never routes
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        y = F.linear(x, w)
    out = {}
    for i, (xs, ws) in enumerate(((7, 6), (8, 6), (8, 9))):  # new x, then new W, in place
        x.copy_(rand(5, K, seed=xs))
        w.copy_(rand(N, K, seed=ws))
        g.replay()
        torch.cuda.synchronize()
        out[f"replay{i}"] = f32(y)
        out[f"eager{i}"] = f32(F.linear(x.clone(), w.clone()))
    return out


CASES = {"linear": case_linear, "inplace": case_inplace,
         "graph": lambda: capture(True), "graph_cold": lambda: capture(False)}

if __name__ == "__main__":
    child_main(CASES)
