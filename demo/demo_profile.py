"""demo_profile.py — GPU time of one MoE layer of the demo model: layer 0's Qwen3MoeSparseMoeBlock
(router, expert dispatch, gate_up and down of every expert hit, combine) run forward on T random
hidden states, for each experts implementation, with the kernels it launched summed by the
PyTorch profiler (CUDA activity only: kernels, copies and sets, whoever launched them, so the
shim's own kernels count).

Why the profiler and not CUDA events over graph replays: HF's eager experts loop asks the host
which experts were hit (a synchronisation), so it cannot be captured in a graph, and event timing
of an uncaptured eager loop measures its launch gaps, not the GPU. Summed kernel time treats both
paths alike and is what a GPU-bound run pays.

The demo sampler calls profile() after sampling (demo_sampler.py --moe-profile FILE), so each
spec's numbers come from a process with the shim under that spec and its sampler's weight cache.
The hidden states are drawn from a fixed seed on the GPU and the router is never routed by the
shim, so every process profiles the same routing. torch is imported by the caller.
"""
import json

TOKENS = (1, 16, 128, 1024, 8192)
WARMUP = 2
ITERS = 3
SEED = 5


def kernel_us(torch, prof):
    """Summed duration (µs) of the device events of a profile: kernels, copies, sets."""
    cuda = torch.autograd.DeviceType.CUDA
    return sum(e.time_range.elapsed_us() for e in prof.events() if e.device_type == cuda)


def block_us(torch, block, hidden, iters=ITERS, warmup=WARMUP):
    """Mean GPU time (µs) of one block forward on `hidden` [1, T, H]."""
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad():
        for _ in range(warmup):
            block(hidden)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                block(hidden)
            torch.cuda.synchronize()
    total = kernel_us(torch, prof)
    return total / iters if total > 0 else None


def profile(torch, model, paths, tokens=TOKENS, iters=ITERS):
    """{"tokens": [...], "us": {path: [µs per T]}, ...} for layer 0's MoE block under each experts
    implementation in `paths`; the model's implementation is restored afterwards."""
    block = model.model.layers[0].mlp
    hidden = model.config.hidden_size
    before = model.config._experts_implementation
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    x = torch.randn((1, max(tokens), hidden), generator=gen, device="cuda", dtype=torch.bfloat16)
    result = {"tokens": list(tokens), "iters": iters, "warmup": WARMUP, "us": {}}
    try:
        for path in paths:
            model.set_experts_implementation(path)
            result["us"][path] = [block_us(torch, block, x[:, :t].contiguous(), iters)
                                  for t in tokens]
    finally:
        model.set_experts_implementation(before)
    return result


def write(path, result, extra):
    with open(path, "w") as f:
        json.dump(dict(result, **extra), f, indent=1)
