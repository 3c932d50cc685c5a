"""demo_sampler.py — the sampler of the demo: `model.generate` on the demo model
(demo/demo_model.py) samples NEW tokens after each of BATCH random prompts of PROMPT_LEN
tokens, records the log-prob of every sampled token under the sampler's own logits, and measures
generated tokens per second.

    python3 demo/demo_sampler.py --out sampler.jsonl [--batch 8] [--prompt-len 64]
        [--new-tokens 64] [--layers 2] [--seed 0] [--sample-seed 1] [--repeats 1]

Sampling is plain ancestral sampling: temperature 1, no top-k and no top-p truncation, so the
recorded log-prob (log_softmax in FP32 of the logits generate returns with output_logits=True) is
that of the full distribution the token was drawn from; the program checks that generate applied
no logits processor. There is no end-of-sequence token, so every sequence has NEW tokens.
Throughput is BATCH*NEW over the wall time of one generate call (prefill included), the GPU
synchronised before and after, after one short warm-up generate; with --repeats N, the median of
N calls, each from the same sampling seed (the file holds the first).

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
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))), "tools"))
import demo_model  # noqa: E402
import logprobs  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Sample from the demo model; write per-token "
                                "log-probs (minite-logprobs) and print tokens/s as JSON.")
    p.add_argument("--out", required=True, help="the log-prob file to write")
    p.add_argument("--batch", type=demo_model.positive_int, default=8, help="prompts (default 8)")
    p.add_argument("--prompt-len", type=demo_model.positive_int, default=64,
                   help="tokens per prompt (default 64)")
    p.add_argument("--new-tokens", type=demo_model.positive_int, default=64,
                   help="tokens sampled per prompt (default 64)")
    p.add_argument("--sample-seed", type=int, default=1, help="seed of the sampling (default 1)")
    p.add_argument("--prompt-seed", type=int, default=2,
                   help="seed of the random prompts (default 2)")
    p.add_argument("--repeats", type=demo_model.positive_int, default=1,
                   help="timed generate calls; the median is reported (default 1)")
    p.add_argument("--warmup-tokens", type=demo_model.nonnegative_int, default=4,
                   help="tokens of the untimed warm-up generate; 0 skips it (default 4)")
    demo_model.add_model_args(p)
    return p.parse_args(argv)


def generate(torch, model, prompts, new_tokens):
    return model.generate(
        input_ids=prompts,
        attention_mask=torch.ones_like(prompts),
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=new_tokens,
        output_logits=True,
        output_scores=True,
        return_dict_in_generate=True,
        pad_token_id=0,
        use_cache=True,
    )


def sampled_logprobs(torch, out, prompt_len, batch, new_tokens):
    """(tokens [B, T], log-probs [B, T]) of the sampled tokens, checked for shape and truncation."""
    tokens = out.sequences[:, prompt_len:]
    if tuple(tokens.shape) != (batch, new_tokens) or len(out.logits) != new_tokens:
        raise demo_model.DemoError(
            f"generate returned {tuple(tokens.shape)} tokens and {len(out.logits)} logit steps, "
            f"expected ({batch}, {new_tokens}); it stopped early (an end token?)")
    for step, (raw, processed) in enumerate(zip(out.logits, out.scores)):
        if not torch.equal(raw.float(), processed.float()):
            raise demo_model.DemoError(
                f"generate changed the logits at step {step} (a logits processor ran); the "
                "recorded log-probs would not be those of the distribution sampled from")
    logits = torch.stack([x.float() for x in out.logits], dim=1)
    lp = torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return tokens, lp


def run(args):
    torch, _ = demo_model.require_torch()
    model = demo_model.build(args.layers, args.seed, args.init_std)
    vocab = demo_model.GEOMETRY["vocab_size"]
    gen = torch.Generator().manual_seed(args.prompt_seed)
    prompts = torch.randint(0, vocab, (args.batch, args.prompt_len), generator=gen)
    prompts = prompts.to(demo_model.DEVICE)
    lap = demo_model.cuda_timer(torch)
    with torch.no_grad():
        if args.warmup_tokens:
            torch.manual_seed(args.sample_seed + 1000003)
            generate(torch, model, prompts, args.warmup_tokens)
        seconds, first = [], None
        for _ in range(args.repeats):
            torch.manual_seed(args.sample_seed)
            lap()
            out = generate(torch, model, prompts, args.new_tokens)
            seconds.append(lap())
            if first is None:
                first = out
        tokens, lp = sampled_logprobs(torch, first, args.prompt_len, args.batch, args.new_tokens)
    env = demo_model.environment()
    with open(args.out, "w") as f:
        info = demo_model.describe(model, args.layers, args.seed, args.init_std)
        logprobs.write_header(
            f, "sampler", env["spec"], info, args.seed,
            sampling={"temperature": 1.0, "top_k": 0, "top_p": 1.0,
                      "sample_seed": args.sample_seed, "prompt_seed": args.prompt_seed},
            sizes={"batch": args.batch, "prompt_len": args.prompt_len,
                   "new_tokens": args.new_tokens},
            env=env)
        prompts_l, tokens_l, lp_l = prompts.tolist(), tokens.tolist(), lp.tolist()
        for i in range(args.batch):
            logprobs.write_seq(f, i, tokens_l[i], lp_l[i], prompt=prompts_l[i])
    median = statistics.median(seconds)
    finite = bool(torch.isfinite(lp).all())
    return {
        "demo": "sampler", "spec": env["spec"], "shim": env["shim"], "out": args.out,
        "batch": args.batch, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
        "tokens": args.batch * args.new_tokens, "seconds": median, "all_seconds": seconds,
        "tokens_per_s": args.batch * args.new_tokens / median,
        "logprob_mean": float(lp.mean()), "logprobs_finite": finite,
        "device": env["device"], "torch": env["torch"], "transformers": env["transformers"],
    }


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
