"""demo_profile.py — GPU time of one MoE layer of the demo model: layer 0's Qwen3MoeSparseMoeBlock
(router, expert dispatch, gate_up and down of every expert hit, combine) run forward on T random
hidden states, for each experts implementation, under whatever the process runs (the shim's own
kernels count: the profiler records CUDA activity whoever launched it, kernels, copies and sets).

Two measures. The grouped_mm path is captured in a CUDA graph (as a GPU-bound sampler runs its
decode step) and timed with CUDA events over REPLAYS replays, the median of REPEATS such runs with
their minimum and maximum: wall time of the block on the GPU, kernels that overlap counted once.
Both paths also get the profiler's GPU busy time: HF's eager experts loop asks the host which
experts were hit (a synchronisation), so it cannot be captured, and event timing of an uncaptured
eager loop measures its launch gaps, not the GPU. Busy time is the union of the device events'
spans: a kernel beside another (the engine's weight refresh beside its GEMM) or launched dependent
and waiting resident for the one before it (the instruments' digest and finish) counts once, where
a sum of durations counted it twice. Each event's share of it is its added time (added_us): its
span past the end of every event that started before it. Both measures count the shim's
instruments (a captured call digests at one replay in 1/MINITE_DIGEST_REPLAYS); their added times
give each instrument kernel's cost apart (INSTRUMENTS), so that a rate can be picked by its cost.

The demo sampler calls profile() after sampling (demo_sampler.py --moe-profile FILE), so each
spec's numbers come from a process with the shim under that spec and its sampler's weight cache.
The hidden states are drawn from a fixed seed on the GPU and the router is never routed by the
shim, so every process profiles the same routing. torch is imported by the caller.
"""
import json
import statistics

TOKENS = (1, 16, 128, 1024, 8192)
WARMUP = 2
ITERS = 3
REPLAYS = 20
REPEATS = 5
SEED = 5
INSTRUMENTS = ("mt_instr_digest", "mt_instr_finish", "mt_instr_probe", "mt_instr_shadow",
               "mt_instr_offs")  # the shim's instrument kernels (kernels/instr.cu)


def device_events(torch, prof):
    """The device events of a profile: kernels, copies, sets."""
    cuda = torch.autograd.DeviceType.CUDA
    return [e for e in prof.events() if e.device_type == cuda]


def spans(torch, prof):
    """[(start, end, name)] of the device events of a profile (kernels, copies, sets)."""
    return [(e.time_range.start, e.time_range.end, e.name) for e in device_events(torch, prof)]


def added_us(events, prefix=""):
    """The µs that the (start, end, name) events whose name starts with `prefix` add to the union
    of all events' spans: in order of start, each event's span past the latest end of those
    before it. Over all events (prefix "") it is the union's length, the time covered by at least
    one; a kernel launched dependent, resident while the one before it ends, adds only what it
    runs after that end."""
    total, covered = 0.0, float("-inf")
    for a, b, name in sorted(events, key=lambda e: (e[0], e[1])):
        added = max(0.0, b - max(a, covered))
        covered = max(covered, b)
        if name.startswith(prefix):
            total += added
    return total


def busy_us(torch, prof):
    """µs during which the GPU ran at least one device event of a profile (kernels, copies, sets;
    those that overlap counted once)."""
    return added_us(spans(torch, prof))


def block_profile(torch, block, hidden, iters=ITERS, warmup=WARMUP):
    """The profile of `iters` block forwards on `hidden` [1, T, H], after `warmup` more."""
    from torch.profiler import ProfilerActivity, profile
    with torch.no_grad():
        for _ in range(warmup):
            block(hidden)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(iters):
                block(hidden)
            torch.cuda.synchronize()
    return prof


def block_us(torch, block, hidden, iters=ITERS, warmup=WARMUP):
    """(mean GPU busy time (µs) of one block forward on `hidden` [1, T, H] or None, {instrument
    kernel: the µs it adds to that}) from one profile."""
    prof = block_profile(torch, block, hidden, iters, warmup)
    events = spans(torch, prof)
    total = added_us(events)
    return (total / iters if total > 0 else None,
            {k: added_us(events, k) / iters for k in INSTRUMENTS})


def capture(torch, fn, warmup=WARMUP):
    """`fn` run `warmup` times on a side stream (allocator, cuBLAS, the shim's first calls), then
    captured in a CUDA graph; the graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def timed(torch, graph, repeats=REPEATS, replays=REPLAYS, before=None):
    """[median, min, max] µs of one replay of `graph`: CUDA events around `replays` replays,
    `repeats` times, `before()` run untimed ahead of each."""
    runs = []
    for _ in range(repeats):
        if before:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        runs.append(start.elapsed_time(end) * 1000.0 / replays)
    return [statistics.median(runs), min(runs), max(runs)]


def replay_profile(torch, block, hidden, instruments=True):
    """([median, min, max] µs of one block forward captured in a CUDA graph (events over REPLAYS
    replays, REPEATS times), or the capture's error as a string; {instrument kernel: the µs it
    adds to a replay's busy time}, profiled over REPLAYS more replays, or {} without `instruments`
    or a graph)."""
    try:
        with torch.no_grad():
            graph = capture(torch, lambda: block(hidden))
    except RuntimeError as e:
        torch.cuda.synchronize()
        return f"not captured: {str(e).splitlines()[0][:200]}", {}
    graph.replay()
    torch.cuda.synchronize()
    wall, by_kernel = timed(torch, graph), {}
    if instruments:
        from torch.profiler import ProfilerActivity, profile as torch_profile
        with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(REPLAYS):
                graph.replay()
            torch.cuda.synchronize()
        events = spans(torch, prof)
        by_kernel = {k: added_us(events, k) / REPLAYS for k in INSTRUMENTS}
    del graph
    return wall, by_kernel


def replay_us(torch, block, hidden):
    """[median, min, max] µs of one block forward captured in a CUDA graph, or the capture's
    error as a string (replay_profile)."""
    return replay_profile(torch, block, hidden, instruments=False)[0]


def hidden_states(torch, model, tokens):
    """[1, tokens, hidden] BF16 random hidden states on the GPU, drawn from SEED: every process
    profiles the same rows (and the same routing)."""
    gen = torch.Generator(device="cuda").manual_seed(SEED)
    return torch.randn((1, tokens, model.config.hidden_size), generator=gen, device="cuda",
                       dtype=torch.bfloat16)


def profile(torch, model, paths, tokens=TOKENS, iters=ITERS):
    """{"tokens": [...], "us": {path: [µs per T]}, "instr_us": {path: [{instrument kernel: µs}
    per T]}, "replay_us": {"grouped_mm": [[median, min, max] or the capture's error, per T]}, ...}
    for layer 0's MoE block under each experts implementation in `paths`; the model's
    implementation is restored afterwards."""
    block = model.model.layers[0].mlp
    before = model.config._experts_implementation
    x = hidden_states(torch, model, max(tokens))
    result = {"tokens": list(tokens), "iters": iters, "warmup": WARMUP, "us": {},
              "instr_us": {}, "replays": REPLAYS, "repeats": REPEATS, "replay_us": {}}
    try:
        for path in paths:
            model.set_experts_implementation(path)
            sums = [block_us(torch, block, x[:, :t].contiguous(), iters) for t in tokens]
            result["us"][path] = [total for total, _ in sums]
            result["instr_us"][path] = [by_kernel for _, by_kernel in sums]
            if path == "grouped_mm":  # the eager loop synchronises: not capturable
                result["replay_us"][path] = [replay_us(torch, block, x[:, :t].contiguous())
                                             for t in tokens]
    finally:
        model.set_experts_implementation(before)
    return result


def write(path, result, extra):
    with open(path, "w") as f:
        json.dump(dict(result, **extra), f, indent=1)
