"""reliability_child.py CASE OUT — one CUDA-graph workload of tests/gpu/test_reliability.py, in a
process of its own (the parent sets LD_PRELOAD and the MINITE_* variables). Writes OUT.npz with
the tensors the parent compares. Not a test by itself.

The routed weights are 1536 x 2048 (Qwen3-30B-A3B's gate_up); "experts" are bias-free nn.Linear
layers, whose forward is one cublasGemmEx each (docs/design.md, "Interposition facts measured
on the H200").

Cases:
  grow        a call captured on stream s after a warm-up on s; then an eager call of 4096 tokens on
              s (the stream's scratch grows: the old one is freed) and a new tensor allocated and
              filled; replays with new inputs: equal to eager calls, and the new tensor untouched
  side        PyTorch's documented pattern: warm-up on a side stream, then torch.cuda.graph(g)
              without stream= (PyTorch captures on a stream of its own)
  graphed     torch.cuda.make_graphed_callables on a module of routed experts: forward outputs
              and input gradients of replays against the eager module
  compiled    torch.compile(mode="reduce-overhead") on the same module: outputs against eager
"""
import numpy as np
import torch
import torch.nn.functional as F

from shim_child import child_main, f32, rand

N, K, E = 1536, 2048, 4


class Experts(torch.nn.Module):
    """E routed experts applied to the same tokens, their outputs side by side (no arithmetic
    after the GEMMs, so that a compiled graph's outputs can be compared bit for bit): one
    cublasGemmEx per expert."""

    def __init__(self):
        super().__init__()
        self.experts = torch.nn.ModuleList(torch.nn.Linear(K, N, bias=False) for _ in range(E))
        for i, e in enumerate(self.experts):
            e.weight.data = rand(N, K, seed=40 + i) * 0.05

    def forward(self, x):
        return torch.cat([e(x) for e in self.experts], dim=1)


def case_grow():
    x, w = rand(5, K, seed=1), rand(N, K, seed=2)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        F.linear(x, w)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        y = F.linear(x, w)
    with torch.cuda.stream(s):  # grows s's scratch: the old buffer is freed
        big = F.linear(rand(4096, K, seed=3), w)
    torch.cuda.synchronize()
    del big
    bystander = torch.full((64 << 20,), 7, dtype=torch.int32, device="cuda")  # 256 MB, refilled
    out = {}
    for i in range(3):
        x.copy_(rand(5, K, seed=10 + i))
        g.replay()
        torch.cuda.synchronize()
        out[f"replay{i}"] = f32(y)
        out[f"eager{i}"] = f32(F.linear(x.clone(), w))
    out["bystander_intact"] = torch.tensor([bool((bystander == 7).all())]).numpy()
    return out


def case_side():
    x, w = rand(5, K, seed=4), rand(N, K, seed=5)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # PyTorch's docs: warm up on a side stream
        for _ in range(3):
            F.linear(x, w)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):  # no stream=: PyTorch captures on a stream of its own
        y = F.linear(x, w)
    out = {}
    for i in range(3):
        x.copy_(rand(5, K, seed=20 + i))
        g.replay()
        torch.cuda.synchronize()
        out[f"replay{i}"] = f32(y)
        out[f"eager{i}"] = f32(F.linear(x.clone(), w))
    return out


def case_graphed():
    torch.manual_seed(0)
    model = Experts().cuda()
    eager = Experts().cuda()
    eager.load_state_dict(model.state_dict())
    sample = rand(16, K, seed=6).requires_grad_(True)
    graphed = torch.cuda.make_graphed_callables(model, (sample,))
    out = {}
    for i in range(3):
        x = rand(16, K, seed=30 + i).requires_grad_(True)
        y = graphed(x)
        y.float().pow(2).sum().backward()
        xe = x.detach().clone().requires_grad_(True)
        ye = eager(xe)
        ye.float().pow(2).sum().backward()
        out[f"y{i}"], out[f"ye{i}"] = f32(y.detach()), f32(ye.detach())
        out[f"g{i}"], out[f"ge{i}"] = f32(x.grad), f32(xe.grad)
    return out


def case_compiled():
    try:
        import triton  # noqa: F401  (inductor's kernels)
    except ImportError:
        return {"no_triton": np.ones(1)}
    torch.manual_seed(0)
    model = Experts().cuda().eval()
    compiled = torch.compile(model, mode="reduce-overhead")
    out = {}
    with torch.no_grad():
        for i in range(6):  # warm-up runs, then the recorded graph replays
            x = rand(16, K, seed=50 + i)
            out[f"y{i}"], out[f"ye{i}"] = f32(compiled(x).clone()), f32(model(x))
    return out


CASES = {"grow": case_grow, "side": case_side, "graphed": case_graphed, "compiled": case_compiled}

if __name__ == "__main__":
    child_main(CASES)
