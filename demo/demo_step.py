"""demo_step.py — where the GPU time of the sampler's captured decode step goes, by component, at
a few batch sizes: the whole step and each component captured in a CUDA graph of its own and timed
with CUDA events over graph replays (what a GPU-bound server pays), the profiler's GPU busy time
of one step replay beside it as the cross-check.

Components, each over all layers on fixed inputs of the step's shapes ([B, 1, hidden]):
  dense GEMMs      the attention projections q, k, v, o (cuBLAS, never routed)
  router           each MoE block's gate: the router GEMM, softmax, top-8
  experts          each block's experts module: dispatch (sort, gather), gate_up and down
                   (torch._grouped_mm, or the shim's engine), the activation, combine; split by
                   the profiler into its GEMM kernels (the engine's quantizers included), the
                   shim's instruments (mt_instr_*: a captured call digests at one replay in
                   1/MINITE_DIGEST_REPLAYS) and the rest (dispatch and combine), each by the
                   time its kernels add to the GPU's busy time (demo_profile.added_us: a
                   kernel launched dependent and resident while the one before it ends counts
                   only what it runs after that end)
  LM head          the final norm and the vocabulary projection
  sampling         log-softmax, the Gumbel draw, the argmax and the bookkeeping (Decoder.pick)
  attention, rest  the step minus the above: attention itself over the static cache, RoPE,
                   the norms, residual adds, the KV-cache writes and the embedding
A component captured alone runs with caches and launch queues unlike in the step, so the rest is
an estimate: it is reported, never negative-clipped, and the cross-check says how far the parts
are from the whole. The ceiling of a faster experts GEMM is the step without its GEMM time:
step / (step - experts GEMMs).

breakdown() is called by the demo sampler (demo_sampler.py --step-breakdown B,B,...) after its own
run, under whatever spec the process has; torch is imported by the caller.
"""
import demo_model
import demo_profile

REPLAYS = 20   # replays timed together, µs per replay
REPEATS = 3    # such timings; the median is reported with the minimum and maximum
PROMPT_LEN = 128
GEMM_KERNELS = ("mt_", "nvjet", "cutlass", "gemm", "Gemm", "sm90_xmma", "grouped")


def _profiled(torch, graph):
    """The profile of one replay of `graph`."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    return prof


def _split_us(torch, prof):
    """(GEMM kernels' µs, the shim's instruments' (mt_instr_*), everything else's) of a profile:
    the time each group's device events add to the GPU's busy time (demo_profile.added_us)."""
    def group(name):
        if name.startswith("mt_instr"):
            return "i"
        return "g" if any(k in name for k in GEMM_KERNELS) else "o"
    events = [(a, b, group(name)) for a, b, name in demo_profile.spans(torch, prof)]
    return tuple(demo_profile.added_us(events, g) for g in "gio")


def _parts(torch, model, batch, gen):
    """{component: fn} over all layers on fixed random inputs of the step's shapes."""
    cfg, layers = model.config, model.model.layers
    dev, bf16 = demo_model.DEVICE, torch.bfloat16
    h = cfg.hidden_size
    x = torch.randn((batch, 1, h), generator=gen, device=dev, dtype=bf16)
    attn_out = torch.randn((batch, 1, cfg.num_attention_heads * cfg.head_dim), generator=gen,
                           device=dev, dtype=bf16)
    flat = x.view(-1, h)
    with torch.no_grad():
        _, weights, index = layers[0].mlp.gate(flat)

    def dense():
        for layer in layers:
            a = layer.self_attn
            for proj, inp in ((a.q_proj, x), (a.k_proj, x), (a.v_proj, x), (a.o_proj, attn_out)):
                proj(inp)

    def router():
        for layer in layers:
            layer.mlp.gate(flat)

    def experts():
        for layer in layers:
            layer.mlp.experts(flat, index, weights)

    def lm_head():
        model.lm_head(model.model.norm(x))

    return {"dense GEMMs": dense, "router": router, "experts": experts, "LM head": lm_head}


def breakdown_one(torch, model, batch, new_tokens):
    """The breakdown at `batch` sequences (a Decoder of PROMPT_LEN + new_tokens slots)."""
    from demo_sampler import Decoder
    gen = torch.Generator(device=demo_model.DEVICE).manual_seed(11)
    vocab = model.config.vocab_size
    dec = Decoder(torch, model, batch, PROMPT_LEN, new_tokens)
    prompts = torch.randint(0, vocab, (batch, PROMPT_LEN), generator=gen,
                            device=demo_model.DEVICE)
    out = {"batch": batch}
    with torch.no_grad():
        dec.prefill(prompts)
        dec.capture()
        # each timing starts from a fresh prefill so that the replays stay inside the cache
        out["step"] = demo_profile.timed(torch, dec.graph, REPEATS, REPLAYS,
                                         before=lambda: dec.prefill(prompts))
        dec.prefill(prompts)
        out["step GPU busy"] = demo_profile.busy_us(torch, _profiled(torch, dec.graph))
        logits = torch.randn((batch, vocab), generator=gen, device=demo_model.DEVICE,
                             dtype=torch.bfloat16)
        parts = _parts(torch, model, batch, gen)
        parts["sampling"] = lambda: dec.pick(logits)
        for name, fn in parts.items():
            graph = demo_profile.capture(torch, fn)
            out[name] = demo_profile.timed(torch, graph, REPEATS, REPLAYS)
            if name == "experts":
                out["experts_split"] = _split_us(torch, _profiled(torch, graph))
            del graph
    return summarise(out)


def summarise(out):
    """Adds "attention, rest" (the step minus the parts, medians), the experts' GEMM and
    instruments' µs (their replay median times the profiler's shares) and the ceiling."""
    parts = ("dense GEMMs", "router", "experts", "LM head", "sampling")
    step = out["step"][0]
    out["attention, rest"] = step - sum(out[p][0] for p in parts)
    gemm, instr, other = out.pop("experts_split")
    total = gemm + instr + other
    experts = out["experts"][0]
    out["experts GEMMs"] = experts * gemm / total if total > 0 else 0.0
    out["experts instruments"] = experts * instr / total if total > 0 else 0.0
    out["experts dispatch, combine"] = experts - out["experts GEMMs"] - out["experts instruments"]
    out["ceiling"] = step / (step - out["experts GEMMs"]) if step > out["experts GEMMs"] else None
    return out


def breakdown(torch, model, batches, new_tokens=2 + REPLAYS):
    """[breakdown_one(B) for B in batches]; a batch whose capture fails gets {"batch", "error"}."""
    result = []
    for b in batches:
        try:
            result.append(breakdown_one(torch, model, b, new_tokens))
        except RuntimeError as e:
            torch.cuda.synchronize()
            result.append({"batch": b, "error": str(e).splitlines()[0][:300]})
        torch.cuda.empty_cache()
    return result
