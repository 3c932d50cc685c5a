"""demo_sampler.py — the sampler of the demo: BATCH random prompts of PROMPT_LEN tokens through
the demo model (demo/demo_model.py), then NEW tokens sampled after each with a decode loop over a
static KV cache, recording the log-prob of every sampled token under the sampler's own logits and
measuring decode tokens per second.

    python3 demo/demo_sampler.py --out sampler.jsonl [--batch 128] [--prompt-len 128]
        [--new-tokens 128] [--repeats 3] [--cuda-graph auto|on|off] [--moe-profile FILE]
        [--experts grouped_mm|eager] [--layers auto] [--seed 0] [--sample-seed 1]

The decode loop is the one a GPU-bound server runs: one prefill forward writes the prompts into a
transformers StaticCache, and each later token is one forward of BATCH x 1 tokens whose inputs,
attention mask, position, cache slots and sampled outputs all live in fixed device buffers, so the
whole step (model, log-softmax, sampling, bookkeeping) is captured once in a CUDA graph and
replayed NEW-1 times. --cuda-graph auto captures on the GPU with the grouped_mm experts; HF's
eager experts loop asks the host which experts were hit (a synchronisation), so with --experts
eager the same step runs uncaptured. Under the shim the captured routed calls run with memory the
graph owns (MINITE_CAPTURE=graph, its default); the prefill before the capture loads the engine
and fills the weight cache, so replays find the quantized weights. The step's attention is one
batched GEMM per KV head (--attention, demo_model.gqa_decode_attention), as a serving engine's
decode kernel reads the cache: HF's sdpa with a mask copies every KV head to its 8 query heads at
every step, which made attention half of a 128-sequence step. The prefill keeps sdpa.

Sampling is plain ancestral sampling at temperature 1 over the full vocabulary: the Gumbel-max
draw argmax(log_softmax(logits) + G), G = -log(-log U), U uniform from torch's generator, which
picks token i with probability softmax(logits)_i; the recorded log-prob is that log_softmax (FP32)
at the token. No end-of-sequence token: every sequence has NEW tokens. Each repeat reseeds with
--sample-seed and starts again from the prefill, so every repeat samples the same tokens (checked:
"repeats_identical"); the file holds the first. Throughput: BATCH*(NEW-1) decode tokens over the
wall time of the NEW-1 decode steps (the GPU synchronised at both ends), the median of --repeats,
with the minimum and maximum; the prefill is timed apart.

--step-breakdown 1,16,128 then times the captured decode step by component at those batch sizes
(demo/demo_step.py), and --moe-profile FILE writes the GPU time of one MoE layer at T = 1 .. 8192
tokens for both experts implementations (demo/demo_profile.py), from this process, under its spec.

Writes OUT in the minite-logprobs format (tools/logprobs.py, role "sampler") and prints one
line of JSON to stdout: {"demo": "sampler", "tokens_per_s": ..., "tokens": ..., ...}. It runs
unchanged with or without the shim (LD_PRELOAD=build/libminite.so MINITE_SPEC=...); the header
records the spec the shim ran (or "none"). Exit status 0, or 1 with a message on stderr.
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))),
                                "tools"))
import demo_model  # noqa: E402
import logprobs  # noqa: E402


def at_least_2(text):
    return demo_model._int_at_least(text, 2, "must be at least 2 (one token from the prefill, "
                                    "the rest from decode steps)")


def token_list(text):
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give token counts like 1,16,128") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive token counts like 1,16,128")
    return values


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Sample from the demo model with a static-cache "
                                "decode loop; write per-token log-probs (minite-logprobs) and "
                                "print decode tokens/s as JSON.")
    p.add_argument("--out", required=True, help="the log-prob file to write")
    p.add_argument("--batch", type=demo_model.positive_int, default=128,
                   help="sequences decoded together (default 128)")
    p.add_argument("--prompt-len", type=demo_model.positive_int, default=128,
                   help="tokens per prompt (default 128)")
    p.add_argument("--new-tokens", type=at_least_2, default=128,
                   help="tokens sampled per sequence (default 128)")
    p.add_argument("--sample-seed", type=int, default=1, help="seed of the sampling (default 1)")
    p.add_argument("--prompt-seed", type=int, default=2,
                   help="seed of the random prompts (default 2)")
    p.add_argument("--repeats", type=demo_model.positive_int, default=3,
                   help="timed prefill + decode runs; the median is reported (default 3)")
    p.add_argument("--cuda-graph", choices=("auto", "on", "off"), default="auto",
                   help="capture the decode step in a CUDA graph (auto: on the GPU with "
                        "grouped_mm experts)")
    p.add_argument("--attention", choices=("sdpa", demo_model.DECODE_ATTENTION),
                   default=demo_model.DECODE_ATTENTION,
                   help="attention of the decode step: HF's sdpa, which copies each KV head to "
                        "its 8 query heads at every step, or one batched GEMM per KV head "
                        f"(default {demo_model.DECODE_ATTENTION}: demo_model.gqa_decode_attention)")
    p.add_argument("--moe-profile", metavar="FILE",
                   help="also write the GPU time of one MoE layer per T and experts path")
    p.add_argument("--profile-tokens", type=token_list, default=None,
                   help="T values of --moe-profile (default 1,16,128,1024,8192)")
    p.add_argument("--step-breakdown", type=token_list, default=None, metavar="B,B,...",
                   help="also time the captured decode step by component at these batch sizes "
                        "(demo/demo_step.py), e.g. 1,16,128")
    demo_model.add_model_args(p)
    return p.parse_args(argv)


class Decoder:
    """Prefill and one-token decode steps over a StaticCache, every tensor a step reads or writes
    in a fixed buffer so that the step can be captured and replayed."""

    def __init__(self, torch, model, batch, prompt_len, new_tokens):
        from transformers import StaticCache
        self.torch, self.model = torch, model
        self.batch, self.prompt_len, self.new_tokens = batch, prompt_len, new_tokens
        length = prompt_len + new_tokens
        dev = demo_model.DEVICE
        self.cache = StaticCache(config=model.config, max_cache_len=length)
        self.ids = torch.zeros((batch, 1), dtype=torch.long, device=dev)
        self.pos = torch.zeros((1,), dtype=torch.long, device=dev)   # position of self.ids
        self.step_index = torch.zeros((1,), dtype=torch.long, device=dev)
        self.mask = torch.zeros((batch, 1, 1, length), dtype=torch.bool, device=dev)
        self.tokens = torch.zeros((batch, new_tokens), dtype=torch.long, device=dev)
        self.lps = torch.zeros((batch, new_tokens), dtype=torch.float32, device=dev)
        keys = torch.arange(length, device=dev)
        rows = torch.arange(prompt_len, device=dev)
        # the prompt attends causally to itself and to no slot past it
        self.prefill_mask = ((keys[None, :] <= rows[:, None]) & (keys[None, :] < prompt_len))
        self.prefill_mask = self.prefill_mask[None, None].expand(batch, 1, prompt_len, length)
        self.prefill_pos = rows[None, :]
        self.graph = None

    def pick(self, logits):
        """Sample one token per row (Gumbel-max over the FP32 log-softmax); record it at
        self.step_index and make it the next input."""
        torch = self.torch
        lp_all = torch.log_softmax(logits.float(), dim=-1)
        gumbel = -torch.log(-torch.log(torch.rand_like(lp_all)))
        tok = (lp_all + gumbel).argmax(dim=-1, keepdim=True)
        self.tokens.index_copy_(1, self.step_index, tok)
        self.lps.index_copy_(1, self.step_index, lp_all.gather(-1, tok))
        self.ids.copy_(tok)

    def prefill(self, prompts):
        self.cache.reset()
        self.mask.zero_()
        self.mask[..., :self.prompt_len] = True
        self.step_index.zero_()
        self.pos.fill_(self.prompt_len)
        out = self.model(input_ids=prompts, attention_mask=self.prefill_mask,
                         position_ids=self.prefill_pos, past_key_values=self.cache,
                         use_cache=True, logits_to_keep=1)
        self.pick(out.logits[:, -1, :])

    def eager_step(self):
        self.mask.index_fill_(3, self.pos, True)
        out = self.model(input_ids=self.ids, attention_mask=self.mask,
                         position_ids=self.pos.view(1, 1), past_key_values=self.cache,
                         use_cache=True)
        self.step_index.add_(1)
        self.pick(out.logits[:, -1, :])
        self.pos.add_(1)

    def capture(self, warmup=2):
        """Warm the step up on a side stream (allocator, cuBLAS, the shim's grouped path), then
        capture it. Call after a prefill; the next prefill resets what the warm-up advanced."""
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                self.eager_step()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.eager_step()

    def step(self):
        if self.graph is not None:
            self.graph.replay()
        else:
            self.eager_step()


def use_graph(args, model):
    if demo_model.DEVICE != "cuda" or args.cuda_graph == "off":
        return False
    if args.cuda_graph == "on":
        return True
    return demo_model.experts_implementation(model) == "grouped_mm"


def spread(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "all": values}


def sample(torch, args, model, prompts):
    """Repeated prefill + decode; (tokens, log-probs, timing summary)."""
    dec = Decoder(torch, model, args.batch, args.prompt_len, args.new_tokens)
    lap = demo_model.cuda_timer(torch)
    graph = use_graph(args, model)
    with torch.no_grad():
        torch.manual_seed(args.sample_seed + 1000003)
        dec.prefill(prompts)
        graph_error = None
        if graph:
            try:
                dec.capture()
            except Exception as e:  # noqa: BLE001 (any refusal: decode uncaptured, say why)
                graph_error = f"{type(e).__name__}: {e}"[:400]
                print(f"demo_sampler: warning: the decode step could not be captured in a CUDA "
                      f"graph ({graph_error}); decoding uncaptured", file=sys.stderr)
                dec.graph = None
                torch.cuda.synchronize()
        if dec.graph is None:
            dec.eager_step()
        prefill_s, decode_s, first, identical = [], [], None, True
        for _ in range(args.repeats):
            torch.manual_seed(args.sample_seed)
            lap()
            dec.prefill(prompts)
            prefill_s.append(lap())
            for _ in range(args.new_tokens - 1):
                dec.step()
            decode_s.append(lap())
            if first is None:
                first = (dec.tokens.clone(), dec.lps.clone())
            else:
                identical = identical and bool(torch.equal(first[0], dec.tokens)) and \
                    bool(torch.equal(first[1], dec.lps))
    decode_tokens = args.batch * (args.new_tokens - 1)
    timing = {
        "cuda_graph": dec.graph is not None, "graph_error": graph_error,
        "repeats_identical": identical,
        "decode_tokens": decode_tokens,
        "decode_tokens_per_s": spread([decode_tokens / s for s in decode_s]),
        "decode_step_ms": spread([1e3 * s / (args.new_tokens - 1) for s in decode_s]),
        "prefill_tokens_per_s": spread([args.batch * args.prompt_len / s for s in prefill_s]),
    }
    return first[0], first[1], timing


def moe_profile(torch, args, model, env):
    import demo_profile
    tokens = args.profile_tokens or demo_profile.TOKENS
    result = demo_profile.profile(torch, model, demo_model.EXPERTS, tokens)
    demo_profile.write(args.moe_profile, result,
                       {"spec": env["spec"], "device": env["device"], "torch": env["torch"],
                        "transformers": env["transformers"]})
    return result


def run(args):
    torch, _ = demo_model.require_torch()
    if args.deterministic:
        demo_model.deterministic(torch)
    args.layers = demo_model.resolve_layers(torch, args.layers, "sampler",
                                            args.batch * (args.prompt_len + args.new_tokens))
    model = demo_model.build(args.layers, args.seed, args.init_std, args.experts, args.attention)
    vocab = demo_model.GEOMETRY["vocab_size"]
    gen = torch.Generator().manual_seed(args.prompt_seed)
    prompts = torch.randint(0, vocab, (args.batch, args.prompt_len), generator=gen)
    prompts = prompts.to(demo_model.DEVICE)
    tokens, lp, timing = sample(torch, args, model, prompts)
    env = demo_model.environment()
    with open(args.out, "w") as f:
        info = demo_model.describe(model, args.layers, args.seed, args.init_std)
        logprobs.write_header(
            f, "sampler", env["spec"], info, args.seed,
            sampling={"temperature": 1.0, "top_k": 0, "top_p": 1.0, "method": "gumbel-max",
                      "sample_seed": args.sample_seed, "prompt_seed": args.prompt_seed},
            sizes={"batch": args.batch, "prompt_len": args.prompt_len,
                   "new_tokens": args.new_tokens},
            env=env)
        prompts_l, tokens_l, lp_l = prompts.tolist(), tokens.tolist(), lp.tolist()
        for i in range(args.batch):
            logprobs.write_seq(f, i, tokens_l[i], lp_l[i], prompt=prompts_l[i])
    summary = {
        "demo": "sampler", "spec": env["spec"], "shim": env["shim"], "out": args.out,
        "experts": demo_model.experts_implementation(model), "batch": args.batch,
        "deterministic": args.deterministic, "attention": args.attention,
        "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
        "tokens": args.batch * args.new_tokens,
        "tokens_per_s": timing["decode_tokens_per_s"]["median"], **timing,
        "logprob_mean": float(lp.mean()), "logprobs_finite": bool(torch.isfinite(lp).all()),
        "device": env["device"], "torch": env["torch"], "transformers": env["transformers"],
    }
    if args.step_breakdown:
        import demo_step
        summary["step_breakdown"] = demo_step.breakdown(torch, model, args.step_breakdown)
    if args.moe_profile:
        summary["moe_profile"] = moe_profile(torch, args, model, env)
    used, peak = demo_model.memory_used(torch)
    summary.update({"layers": args.layers, "gpu_memory_used": used, "torch_peak_reserved": peak})
    return summary


def main(argv=None):
    args = parse_args(argv)
    try:
        summary = run(args)
    except demo_model.DemoError as e:
        return demo_model.fail("demo_sampler", e)
    print(json.dumps(summary), flush=True)
    if not summary["logprobs_finite"]:
        return demo_model.fail("demo_sampler", "some sampled log-probs are not finite")
    return 0


if __name__ == "__main__":
    sys.exit(main())
