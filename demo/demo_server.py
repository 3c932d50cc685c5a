"""demo_server.py — the sampler as a server: transformers' own continuous-batching engine (the
one `transformers serve` runs) on the demo model (demo/demo_model.py), fed by a client that
submits REQUESTS requests of mixed prompt and output lengths while the engine runs and collects
each one's tokens and per-token log-probs as it finishes; measures generated tokens per second.

    python3 demo/demo_server.py --out server.jsonl [--requests 256] [--prompt-len 32:256]
        [--new-tokens 16:256] [--concurrency all] [--repeats 3] [--warmup-rounds 1]
        [--sampling sample|greedy] [--cuda-graph auto|on|off] [--attn sdpa]
        [--max-batch-tokens 4096] [--num-blocks N] [--block-size 256]
        [--experts grouped_mm|eager] [--layers auto] [--seed 0] [--sample-seed 1]
        [--busy-window 2]

How it differs from demo/demo_sampler.py: that one decodes one fixed batch in lockstep over a
StaticCache, every sequence with the same prompt and output length, the decode step one captured
CUDA graph. Here the engine schedules: each forward packs the prompt chunks of newly admitted
requests with one token of every decoding request (up to --max-batch-tokens tokens), a request
leaves the batch when it has its tokens and a waiting one takes its place, the KV lives in a
paged cache (--num-blocks blocks of --block-size tokens). So the expert GEMMs see a token count
that changes from step to step, and prefill and decode share the forwards.

The engine's API used (transformers 5.17): model.init_continuous_batching(generation_config,
continuous_batching_config) gives a ContinuousBatchingManager; start() runs its generation loop
in a background thread; add_request(prompt, request_id, max_new_tokens, record_timestamps) and
get_result() are the client's side; ContinuousBatchingConfig(return_logprobs=True) makes each
result carry the log-prob of every generated token. The engine computes it as
log(softmax(logits in FP32)[token]) of the raw logits (no logits processor is active: the script
refuses to run if one is), i.e. the log_softmax of the minite-logprobs format up to FP32
rounding; a probability that underflows to 0 would be -inf (written null). The log-probs are
the engine's own: nothing is recomputed here.

Attention: the engine needs a paged implementation, "paged|<attn>". Left alone it would look for
flash-attention (and the `kernels` hub fallback, which needs a network) and otherwise take
"paged|sdpa"; the script sets "paged|" + --attn itself (default sdpa, which the device has).
paged|sdpa packs all the batch's queries against all of their KV with a block-diagonal mask, so
its attention costs (tokens in the batch) x (KV of the batch): at large batches this, not the
experts, can dominate. With paged|sdpa the engine by default runs without CUDA graphs (it turns
them on by default only for flash-attention, where no mask is needed); --cuda-graph on forces
them (the "varlen" path padded to fixed sizes, one graph per padded size: the largest captured
at start, the others on first use), off forbids them; the summary reports the engine's resolved
(varlen, decode) choice.

Experts: the engine runs the model's forward as built and leaves experts_implementation alone
(only model.generate() swaps grouped_mm for batched_mm while decoding, and the engine does not go
through it); the summary reports demo_model.experts_implementation(model) after the run.

Sampling: --sampling sample (default) is ancestral sampling at temperature 1 over the full
vocabulary (torch.multinomial on the softmax), the engine seeded once with --sample-seed; which
draw a request gets depends on how the scheduler packed the batches, so the tokens are not
reproducible from run to run (reported: "repeats_identical"). --sampling greedy takes the argmax.
No end-of-sequence token: each request generates its drawn number of tokens.

The workload: prompt lengths, output lengths and prompt tokens drawn from --prompt-seed (Python's
random, the same in every run), lengths uniform in the given ranges ("N" or "LOW:HIGH").
The client: one thread submits the requests in order, at most --concurrency in flight (default
all: every request is submitted at once, as a burst of users would), while the calling thread
collects results as they finish and releases a slot for each. A round is all REQUESTS requests;
--warmup-rounds untimed rounds first (they warm the engine up, fill the shim's weight cache
when it is loaded and capture the graphs when they are on), then --repeats timed rounds.
Throughput of a round: generated tokens over the wall time from the first submit to the last
result; reported is the median over rounds with the minimum and maximum, with the mean time to
first token (the engine's own timestamps: first token minus submission) and the engine's forward
steps per round. Block sharing (prefix caching) is off so that a repeated round recomputes what
the first computed.

Is the GPU what bounds it? After the timed rounds, one more round runs with the PyTorch profiler
(CUDA activity only, process-wide: the engine's thread's kernels too) on for --busy-window
seconds from its first second: "gpu_busy" gives the share of that window during which the GPU ran
anything (kernel intervals merged, not summed) and the engine's steps a second in it beside the
timed rounds' (the profiler's own host cost slows a host-bound loop, so the share is a lower
bound where the two rates differ). A share well below 1 means the host bounds the server, and a
faster GPU kernel cannot show in its throughput.

Writes OUT in the minite-logprobs format (tools/logprobs.py, role "sampler"): one sequence per
request of the first timed round, seq = the request's index, with its prompt: demo/demo_learner.py
--logprobs scores it (requests of one shape batched together) and tools/gap-report compares the two.
Prints one line of JSON to stdout: {"demo": "server", "tokens_per_s": ..., ...}. Runs unchanged with
or without the shim (LD_PRELOAD=build/libminite.so MINITE_SPEC=... MINITE_ROUTE=1536x2048,2048x768).
Exit status 0; 1 with a message on stderr when it cannot run, a request failed, or a log-prob is
missing or not finite (the JSON is printed first).
"""
import argparse
import json
import math
import os
import random
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))),
                                "tools"))
import demo_model  # noqa: E402
import demo_profile  # noqa: E402
import logprobs  # noqa: E402
from demo_sampler import spread  # noqa: E402

ATTN = ("sdpa", "eager", "flash_attention_2", "flash_attention_3")
# The engine's FIFO scheduler stops admitting prompts when fewer than 15% of the blocks are free;
# the default cache leaves that margin above what the requests in flight hold.
SAFETY_MARGIN = 0.15
MAX_REQUESTS_PER_BATCH = 1024   # the engine's own cap


def length_range(text):
    """"N" or "LOW:HIGH" (1 <= LOW <= HIGH) as (LOW, HIGH)."""
    parts = text.split(":")
    try:
        values = [int(x) for x in parts]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or min(values) < 1 or values[0] > values[-1]:
        raise argparse.ArgumentTypeError(f"{text!r}: give a length N or a range LOW:HIGH of "
                                         "positive integers with LOW <= HIGH, like 32:256")
    return values[0], values[-1]


def concurrency(text):
    if text == "all":
        return None
    return demo_model.positive_int(text)


def at_least_4(text):
    return demo_model._int_at_least(text, 4, "must be at least 4 (the engine's smallest block)")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Serve requests of mixed lengths from the demo model "
                                "with transformers' continuous-batching engine; write per-token "
                                "log-probs (minite-logprobs) and print tokens/s as JSON.")
    p.add_argument("--out", required=True, help="the log-prob file to write")
    p.add_argument("--requests", type=demo_model.positive_int, default=256,
                   help="requests per round (default 256)")
    p.add_argument("--prompt-len", type=length_range, default=(32, 256),
                   help="prompt tokens, N or LOW:HIGH drawn uniformly (default 32:256)")
    p.add_argument("--new-tokens", type=length_range, default=(16, 256),
                   help="tokens generated per request, N or LOW:HIGH (default 16:256)")
    p.add_argument("--concurrency", type=concurrency, default=None,
                   help="requests in flight at once, or all (default all)")
    p.add_argument("--repeats", type=demo_model.positive_int, default=3,
                   help="timed rounds; the median is reported (default 3)")
    p.add_argument("--warmup-rounds", type=demo_model.nonnegative_int, default=1,
                   help="untimed rounds before them (default 1)")
    p.add_argument("--sampling", choices=("sample", "greedy"), default="sample",
                   help="temperature-1 sampling over the full vocabulary, or argmax "
                        "(default sample)")
    p.add_argument("--sample-seed", type=int, default=1, help="seed of the engine (default 1)")
    p.add_argument("--prompt-seed", type=int, default=2,
                   help="seed of the lengths and prompt tokens (default 2)")
    p.add_argument("--cuda-graph", choices=("auto", "on", "off"), default="auto",
                   help="the engine's CUDA graphs (auto: the engine decides; off with sdpa)")
    p.add_argument("--attn", choices=ATTN, default="sdpa",
                   help="attention, run as paged|ATTN (default sdpa)")
    p.add_argument("--max-batch-tokens", type=demo_model.positive_int, default=4096,
                   help="tokens one forward takes at most (default 4096)")
    p.add_argument("--num-blocks", type=demo_model.positive_int, default=None,
                   help="KV cache blocks (default: the requests in flight at their full "
                        "length, plus the scheduler's margin)")
    p.add_argument("--block-size", type=at_least_4, default=256,
                   help="tokens per KV cache block (default 256, the engine's)")
    p.add_argument("--busy-window", type=demo_model.nonnegative_float, default=2.0,
                   help="seconds of one more round profiled for the GPU's busy share, from its "
                        "first second; 0 for none (default 2)")
    p.add_argument("--timeout", type=demo_model.positive_float, default=600.0,
                   help="seconds without a finished request before giving up (default 600)")
    demo_model.add_model_args(p)
    return p.parse_args(argv)


class Request:
    __slots__ = ("prompt", "new_tokens")

    def __init__(self, prompt, new_tokens):
        self.prompt, self.new_tokens = prompt, new_tokens


def draw_requests(count, prompt_len, new_tokens, vocab, seed):
    """`count` requests, lengths uniform in the (low, high) ranges and prompt tokens uniform in
    the vocabulary, all from one generator seeded with `seed`."""
    rng = random.Random(seed)
    requests = []
    for _ in range(count):
        p = rng.randint(*prompt_len)
        n = rng.randint(*new_tokens)
        requests.append(Request([rng.randrange(vocab) for _ in range(p)], n))
    return requests


def in_flight(args):
    return args.requests if args.concurrency is None else min(args.concurrency, args.requests)


def default_num_blocks(requests, block_size, flight):
    """Blocks for the `flight` longest requests at their full length, over the scheduler's
    margin."""
    need = sorted((math.ceil((len(r.prompt) + r.new_tokens) / block_size) for r in requests),
                  reverse=True)
    return math.ceil(sum(need[:flight]) / (1 - SAFETY_MARGIN)) + 1


class BusyWindow:
    """The profiler on for `length` s of a round from its `after`-th second (tick() is called from
    the round's collecting loop, every 0.5 s at most): the GPU's busy share of that window and the
    engine's steps in it."""

    def __init__(self, torch, manager, after, length):
        self.torch, self.manager, self.after, self.length = torch, manager, after, length
        self.prof, self.result = None, None

    def tick(self, elapsed):
        if self.prof is None and self.result is None and elapsed >= self.after:
            profiler = self.torch.profiler
            self.prof = profiler.profile(activities=[profiler.ProfilerActivity.CUDA])
            self.prof.start()
            self.t0, self.steps0 = time.perf_counter(), getattr(self.manager, "current_batch", 0)
        elif self.prof is not None and elapsed >= self.after + self.length:
            self.stop()

    def stop(self):
        """End the window (the round's end ends it early); {"window_s", "busy_s", "share",
        "steps", "steps_per_s"} into result."""
        if self.prof is None:
            return
        wall = time.perf_counter() - self.t0
        steps = getattr(self.manager, "current_batch", 0) - self.steps0
        self.prof.stop()
        busy = demo_profile.busy_us(self.torch, self.prof) / 1e6
        self.prof = None
        self.result = {"window_s": wall, "busy_s": busy, "share": busy / wall if wall > 0 else None,
                       "steps": steps, "steps_per_s": steps / wall if wall > 0 else None}


def serve_round(manager, requests, flight, tag, timeout, window=None):
    """Submit every request from a thread, at most `flight` in flight; collect the results here
    (ticking `window`, a BusyWindow, as they come). {"outputs": [GenerationOutput by request
    index], "wall_s", "steps"}."""
    slots = threading.Semaphore(flight)
    submit_error = []

    def submit():
        try:
            for i, r in enumerate(requests):
                slots.acquire()
                rid = manager.add_request(r.prompt, request_id=f"{tag}-{i}",
                                          max_new_tokens=r.new_tokens, record_timestamps=True)
                if rid is None:
                    raise demo_model.DemoError("the engine refused a request (it is stopping)")
        except Exception as e:  # noqa: BLE001 (reported by the collecting thread)
            submit_error.append(e)

    steps0 = getattr(manager, "current_batch", 0)
    outputs = [None] * len(requests)
    done = 0
    submitter = threading.Thread(target=submit, daemon=True)
    start = last = time.perf_counter()
    submitter.start()
    while done < len(requests):
        if window:
            window.tick(time.perf_counter() - start)
        out = manager.get_result(timeout=0.5)
        if out is None:
            if submit_error:
                raise demo_model.DemoError(f"submitting failed: {submit_error[0]}")
            if not manager.is_running():
                fatal = manager.background_thread_status.fatal_error
                raise demo_model.DemoError(f"the engine's generation loop stopped ({fatal}); "
                                           "its log above says why")
            if time.perf_counter() - last > timeout:
                raise demo_model.DemoError(f"no request finished in {timeout:.0f} s ({done} of "
                                           f"{len(requests)} done): raise --timeout")
            continue
        prefix, _, index = out.request_id.rpartition("-")
        if prefix != tag or not out.is_finished() or outputs[int(index)] is not None:
            continue  # not this round's, or a partial result
        outputs[int(index)] = out
        done += 1
        last = time.perf_counter()
        slots.release()
    submitter.join()
    steps = getattr(manager, "current_batch", 0) - steps0
    return {"outputs": outputs, "wall_s": last - start, "steps": steps}


def round_figures(result):
    """The numbers of one round: generated tokens, tokens/s, mean time to first token, failures."""
    outs = result["outputs"]
    generated = sum(len(o.generated_tokens) for o in outs)
    ttft = [o.timestamps[0] - o.created_time for o in outs if o.timestamps]
    return {"generated_tokens": generated, "wall_s": result["wall_s"],
            "tokens_per_s": generated / result["wall_s"] if result["wall_s"] > 0 else None,
            "ttft_mean_ms": 1e3 * statistics.fmean(ttft) if ttft else None,
            "steps": result["steps"],
            "failed": sum(1 for o in outs if o.error is not None),
            "first_error": next((str(o.error) for o in outs if o.error is not None), None)}


def timing_summary(rounds):
    """The timed rounds' figures: medians with min/max (demo_sampler's spread)."""
    rates = [r["tokens_per_s"] for r in rounds if r["tokens_per_s"] is not None]
    ttft = [r["ttft_mean_ms"] for r in rounds if r["ttft_mean_ms"] is not None]
    return {
        "tokens_per_s": statistics.median(rates) if rates else None,
        "generated_tokens_per_s": spread(rates) if rates else None,
        "wall_s": spread([r["wall_s"] for r in rounds]),
        "ttft_mean_ms": spread(ttft) if ttft else None,
        "steps": [r["steps"] for r in rounds],
        "generated_tokens": rounds[0]["generated_tokens"],
        "requests_failed": max(r["failed"] for r in rounds),
        "first_error": next((r["first_error"] for r in rounds if r["first_error"]), None),
    }


def sequences(requests, outputs):
    """(index, prompt, tokens, log-probs) of each request that came back whole, and the count of
    those that came back without one log-prob per token."""
    seqs, missing = [], 0
    for i, (r, o) in enumerate(zip(requests, outputs)):
        if o.error is not None:
            continue
        if len(o.logprobs) != len(o.generated_tokens):
            missing += 1
            continue
        seqs.append((i, r.prompt, list(o.generated_tokens), list(o.logprobs)))
    return seqs, missing


def engine_configs(args, requests, flight, blocks):
    """(GenerationConfig, ContinuousBatchingConfig) of the run, its cache `blocks` blocks."""
    from transformers import ContinuousBatchingConfig, GenerationConfig
    if args.sampling == "sample":
        gen = GenerationConfig(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)
    else:
        gen = GenerationConfig(do_sample=False)
    gen.max_new_tokens = max(r.new_tokens for r in requests)
    gen.eos_token_id = -1  # the engine's "no end token": every request runs to its length
    # Both sizes given: left out, either is solved for so that the cache and the attention mask
    # fill 90% of the free GPU memory, which would leave the shim none for its weight cache.
    cb = ContinuousBatchingConfig(
        block_size=args.block_size, num_blocks=blocks, max_batch_tokens=args.max_batch_tokens,
        max_requests_per_batch=min(flight, MAX_REQUESTS_PER_BATCH),
        use_cuda_graph={"auto": None, "on": True, "off": False}[args.cuda_graph],
        allow_block_sharing=False, return_logprobs=True, seed=args.sample_seed)
    return gen, cb


def start_engine(torch, args, model, requests, flight, blocks):
    """The started manager and what the engine resolved."""
    try:
        model.set_attn_implementation(f"paged|{args.attn}")
    except (ImportError, ValueError) as e:
        raise demo_model.DemoError(f"attention paged|{args.attn} is not available ({e}); use "
                                   "--attn sdpa or install it") from None
    gen, cb = engine_configs(args, requests, flight, blocks)
    manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
    if manager.logit_processor.do_processing:
        raise demo_model.DemoError("the engine set up a logits processor: its log-probs would not "
                                   "be those of the raw logits (check the GenerationConfig)")
    t = time.perf_counter()
    try:
        manager.warmup()  # sizes and allocates the paged cache (and captures graphs when on)
    except (MemoryError, ValueError, torch.cuda.OutOfMemoryError) as e:
        raise demo_model.DemoError(f"the engine cannot allocate its cache ({e}); lower "
                                   "--max-batch-tokens or --num-blocks") from None
    warmup_s = time.perf_counter() - t
    manager.start()
    resolved = manager.continuous_batching_config
    varlen, decode = resolved.cuda_graph_booleans
    engine = {
        "attn_implementation": model.config._attn_implementation,
        "cuda_graph": {"setting": args.cuda_graph, "varlen": varlen, "decode": decode},
        "async_batching": bool(resolved.use_async_batching),
        "block_size": resolved.block_size, "num_blocks": resolved.num_blocks,
        "max_batch_tokens": resolved.max_batch_tokens,
        "max_requests_per_batch": resolved.max_requests_per_batch,
        "decode_fast_path": bool(resolved.max_blocks_per_request),
        "engine_warmup_s": warmup_s,
    }
    return manager, engine


def write_file(path, model, args, env, engine, seqs):
    with open(path, "w") as f:
        info = demo_model.describe(model, args.layers, args.seed, args.init_std)
        logprobs.write_header(
            f, "sampler", env["spec"], info, args.seed,
            sampling={"temperature": 1.0, "top_k": 0, "top_p": 1.0,
                      "method": "multinomial" if args.sampling == "sample" else "greedy",
                      "sample_seed": args.sample_seed, "prompt_seed": args.prompt_seed},
            sizes={"requests": args.requests, "prompt_len": list(args.prompt_len),
                   "new_tokens": list(args.new_tokens)},
            engine=dict(engine, name="transformers continuous batching"), env=env)
        for i, prompt, tokens, lps in seqs:
            logprobs.write_seq(f, i, tokens, lps, prompt=prompt)


def busy_round(torch, manager, requests, flight, args):
    """One more round with the profiler on for --busy-window s of it (BusyWindow); its figures,
    or None with no window."""
    if args.busy_window <= 0:
        return None
    window = BusyWindow(torch, manager, 1.0, args.busy_window)
    try:
        serve_round(manager, requests, flight, "busy", args.timeout, window)
    finally:
        window.stop()
    return window.result


def steps_per_s(rounds):
    """The timed rounds' engine steps a second (the median round's)."""
    rates = [r["steps"] / r["wall_s"] for r in rounds if r["wall_s"] > 0]
    return statistics.median(rates) if rates else None


def run(args):
    torch, _ = demo_model.require_torch()
    if args.deterministic:
        demo_model.deterministic(torch)
    requests = draw_requests(args.requests, args.prompt_len, args.new_tokens,
                             demo_model.GEOMETRY["vocab_size"], args.prompt_seed)
    flight = in_flight(args)
    blocks = args.num_blocks or default_num_blocks(requests, args.block_size, flight)
    args.layers = demo_model.resolve_layers(torch, args.layers, "sampler",
                                            blocks * args.block_size)
    model = demo_model.build(args.layers, args.seed, args.init_std, args.experts)
    manager, engine = start_engine(torch, args, model, requests, flight, blocks)
    try:
        t = time.perf_counter()
        for w in range(args.warmup_rounds):
            serve_round(manager, requests, flight, f"w{w}", args.timeout)
        warmup_s = time.perf_counter() - t
        rounds, first, identical = [], None, True
        for k in range(args.repeats):
            result = serve_round(manager, requests, flight, f"r{k}", args.timeout)
            rounds.append(round_figures(result))
            tokens = [list(o.generated_tokens) for o in result["outputs"]]
            if first is None:
                first, first_tokens = result["outputs"], tokens
            else:
                identical = identical and tokens == first_tokens
        busy = busy_round(torch, manager, requests, flight, args)
    finally:
        manager.stop(block=True, timeout=60)
        manager.destroy()
    seqs, missing = sequences(requests, first)
    env = demo_model.environment()
    write_file(args.out, model, args, env, engine, seqs)
    lps = [v for s in seqs for v in s[3]]
    timing = timing_summary(rounds)
    return {
        "demo": "server", "spec": env["spec"], "shim": env["shim"], "out": args.out,
        "layers": args.layers,
        "experts": demo_model.experts_implementation(model), **engine,
        "sampling": args.sampling, "requests": args.requests,
        "concurrency": args.concurrency or "all", "prompt_len": list(args.prompt_len),
        "new_tokens": list(args.new_tokens),
        "prompt_tokens": sum(len(r.prompt) for r in requests),
        "requests_finished": sum(1 for o in first if o.error is None),
        **timing, "warmup_rounds": args.warmup_rounds, "warmup_s": warmup_s,
        "gpu_busy": busy and dict(busy, timed_steps_per_s=steps_per_s(rounds)),
        "repeats_identical": identical,
        "logprobs_missing": missing, "logprob_mean": statistics.fmean(lps) if lps else None,
        "logprobs_finite": all(math.isfinite(v) for v in lps),
        "device": env["device"], "torch": env["torch"], "transformers": env["transformers"],
    }


def problems(summary):
    """What makes the run a failure, in words; empty when it is not."""
    found = []
    if summary["requests_failed"]:
        found.append(f"{summary['requests_failed']} requests failed (the first: "
                     f"{summary.get('first_error')})")
    if summary["logprobs_missing"]:
        found.append(f"{summary['logprobs_missing']} requests came back without a log-prob per "
                     "token (not written to the file)")
    if not summary["logprobs_finite"]:
        found.append("some log-probs are not finite")
    return found


def child_argv(python, out, requests=256, prompt_len="32:256", new_tokens="16:256", repeats=3,
               extra=()):
    """The command line of this script as a child of demo/run_demo.py (which adds the model
    arguments and the environment of a spec, as for the sampler)."""
    return [python, os.path.realpath(__file__), "--out", out, "--requests", str(requests),
            "--prompt-len", str(prompt_len), "--new-tokens", str(new_tokens),
            "--repeats", str(repeats), *extra]


def main(argv=None):
    args = parse_args(argv)
    try:
        summary = run(args)
    except demo_model.DemoError as e:
        return demo_model.fail("demo_server", e)
    print(json.dumps(summary), flush=True)
    found = problems(summary)
    if found:
        return demo_model.fail("demo_server", "; ".join(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
