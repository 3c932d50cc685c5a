"""demo_learner.py — the learner of the demo, on the demo model (demo/demo_model.py).

    python3 demo/demo_learner.py --logprobs SAMPLER_FILE OUT      frozen policy: score tokens
    python3 demo/demo_learner.py --train [--batch 8] [--seq 1024] [--steps 4] [--repeats 3]
        [--warmup 2] [--experts grouped_mm|eager]
    (both in one run: the log-probs first, with the weights the sampler had)

--logprobs reads a sampler's minite-logprobs file, builds the model the sampler had (layers, seed,
init scale and experts implementation from the file's header, unless given here, and then they
must agree; --layers auto takes the file's), teacher-forces every sequence (prompt + sampled
tokens) through it, --score-batch sequences a forward (the learner's choice of batch, as in RL;
under nvfp4-row a token's result does not depend on it), and writes the log-prob of each sampled
token (log_softmax in FP32 over the full vocabulary) in the same format with role "learner".
tools/gap-report LEARNER SAMPLER then says how far the two are apart.

--train runs a plain PyTorch training loop: AdamW on all weights, cross-entropy of next-token
prediction on random token batches of BATCH x SEQ, forward + backward + step. Without --logprobs,
--layers auto trains as many layers as fit the GPU with AdamW at BATCH x SEQ tokens a step
(demo_model.fit_layers). After WARMUP untimed steps come REPEATS timed windows of STEPS steps
each, the GPU synchronised at both ends of each; training tokens/s is the median over the windows
of STEPS*BATCH*SEQ over the window's wall time, reported with the minimum and maximum. Step 0
always sees the same batch and the same weights, so its loss compares runs with and without the
shim.

Prints one line of JSON to stdout ({"demo": "learner", ...}: tokens/s, losses, gradient norms).
Runs unchanged with or without the shim. Exit status 0; 1 with a message on stderr when it cannot
run, or when a loss or gradient norm is not finite (the JSON is printed first).
"""
import argparse
import json
import math
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.realpath(__file__))),
                                "tools"))
import demo_model  # noqa: E402
import logprobs  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Score a sampler's tokens (--logprobs) and/or train "
                                "the demo model (--train); print a JSON summary.")
    p.add_argument("--logprobs", nargs=2, metavar=("SAMPLER_FILE", "OUT"),
                   help="score the sampled tokens of SAMPLER_FILE; write OUT")
    p.add_argument("--train", action="store_true", help="run the training loop")
    p.add_argument("--batch", type=demo_model.positive_int, default=8,
                   help="training sequences per step (default 8)")
    p.add_argument("--seq", type=demo_model.positive_int, default=1024,
                   help="tokens per training sequence (default 1024)")
    p.add_argument("--steps", type=demo_model.positive_int, default=4,
                   help="training steps of one timed window (default 4)")
    p.add_argument("--repeats", type=demo_model.positive_int, default=3,
                   help="timed windows; the median counts (default 3)")
    p.add_argument("--warmup", type=demo_model.nonnegative_int, default=2,
                   help="untimed training steps before them (default 2)")
    p.add_argument("--score-batch", type=demo_model.positive_int, default=16,
                   help="sequences per scoring forward of --logprobs (default 16)")
    p.add_argument("--lr", type=demo_model.positive_float, default=1e-4,
                   help="AdamW learning rate (default 1e-4)")
    p.add_argument("--data-seed", type=int, default=3, help="seed of the random batches")
    demo_model.add_model_args(p, defaults=False)
    args = p.parse_args(argv)
    if not args.logprobs and not args.train:
        p.error("nothing to do: give --logprobs SAMPLER_FILE OUT, --train, or both")
    return args


def model_settings(args, sampler):
    """(layers, seed, init_std, experts): explicit arguments, else the sampler file's header,
    else the defaults; an explicit one that contradicts the file is an error."""
    model = sampler.header.get("model", {}) if sampler else {}
    given = {"layers": args.layers, "seed": args.seed, "init_std": args.init_std,
             "experts_implementation": args.experts}
    defaults = {"layers": demo_model.DEFAULT_LAYERS, "seed": demo_model.DEFAULT_SEED,
                "init_std": demo_model.DEFAULT_INIT_STD,
                "experts_implementation": demo_model.DEFAULT_EXPERTS}
    flags = {"experts_implementation": "--experts"}
    if given["layers"] == "auto":  # the file's depth when there is one, else fit_layers's
        given["layers"] = None
    chosen = {}
    for key, value in given.items():
        in_file = model.get(key) if isinstance(model, dict) else None
        if value is not None and in_file is not None and value != in_file:
            flag = flags.get(key, "--" + key.replace("_", "-"))
            raise demo_model.DemoError(
                f"{sampler.path} was sampled from a model with {key} {in_file}, but {flag} "
                f"{value} was given: drop {flag} or give {in_file}")
        chosen[key] = value if value is not None else in_file if in_file is not None \
            else defaults[key]
    return (chosen["layers"], chosen["seed"], chosen["init_std"],
            chosen["experts_implementation"])


def read_sampler(path):
    try:
        f = logprobs.read(path)
    except logprobs.FormatError as e:
        raise demo_model.DemoError(str(e)) from None
    if f.role != "sampler":
        raise demo_model.DemoError(f"{path} has role {f.role}; --logprobs reads a sampler's file")
    if not f.seqs:
        raise demo_model.DemoError(f"{path} holds no readable sequence")
    if f.corrupt or f.duplicates:
        print(f"demo_learner: {path}: skipped {f.corrupt + f.duplicates} bad lines "
              f"({'; '.join(f.problems)})", file=sys.stderr)
    seqs = [f.seqs[k] for k in sorted(f.seqs)]
    empty = next((s for s in seqs if not s.prompt or not s.tokens), None)
    if empty is not None:
        raise demo_model.DemoError(f"{path}: sequences need a prompt and sampled tokens "
                                   f"(sequence {empty.seq} has {len(empty.prompt)} and "
                                   f"{len(empty.tokens)})")
    return f, seqs


def score_equal(torch, model, seqs, chunk):
    """Log-probs [B, T] of the sampled tokens of seqs, all of one prompt and token count,
    `chunk` full sequences a forward (no padding: a padded row would change no bit of the others
    under nvfp4-row, but would under the BF16 specs' batch-dependent GEMMs)."""
    prompt_len = len(seqs[0].prompt)
    new_tokens = len(seqs[0].tokens)
    ids = torch.tensor([s.prompt + s.tokens for s in seqs], dtype=torch.long,
                       device=demo_model.DEVICE)
    parts = []
    with torch.no_grad():
        for part in ids.split(chunk):
            # logits at positions P-1 .. P+T-2 predict the T sampled tokens; the last T+1 are kept
            out = model(input_ids=part, attention_mask=torch.ones_like(part),
                        logits_to_keep=new_tokens + 1, use_cache=False)
            logits = out.logits[:, -(new_tokens + 1):-1, :].float()
            targets = part[:, prompt_len:]
            parts.append(torch.log_softmax(logits, dim=-1).gather(
                -1, targets.unsqueeze(-1)).squeeze(-1))
    return torch.cat(parts)


def score(torch, model, seqs, chunk):
    """[log-probs of each sequence's sampled tokens] in the order of seqs: sequences of equal
    prompt and token counts batched together (a server's requests differ in both)."""
    shapes = {}
    for i, s in enumerate(seqs):
        shapes.setdefault((len(s.prompt), len(s.tokens)), []).append(i)
    out = [None] * len(seqs)
    for rows in shapes.values():
        for i, lp in zip(rows, score_equal(torch, model, [seqs[i] for i in rows], chunk)):
            out[i] = lp
    return out


def write_learner_file(path, sampler, seqs, lp, model_info, seed, env):
    with open(path, "w") as f:
        logprobs.write_header(f, "learner", env["spec"], model_info, seed,
                              source=sampler.path, env=env)
        for s, row in zip(seqs, lp):
            logprobs.write_seq(f, s.seq, s.tokens, row.tolist(), prompt=s.prompt)


def train(torch, model, args):
    vocab = demo_model.GEOMETRY["vocab_size"]
    total = args.warmup + args.steps * args.repeats
    gen = torch.Generator().manual_seed(args.data_seed)
    batches = torch.randint(0, vocab, (total, args.batch, args.seq), generator=gen)
    batches = batches.to(demo_model.DEVICE)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    losses, norms, seconds = [], [], []
    lap = demo_model.cuda_timer(torch)
    for step in range(total):
        if step >= args.warmup and (step - args.warmup) % args.steps == 0:
            lap()
        ids = batches[step]
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(params, float("inf")).detach())
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        if step >= args.warmup and (step - args.warmup) % args.steps == args.steps - 1:
            seconds.append(lap())
    model.eval()
    losses = [float(x) for x in torch.stack(losses).float().tolist()]
    norms = [float(x) for x in torch.stack(norms).float().tolist()]
    rates = [args.steps * args.batch * args.seq / s for s in seconds]
    return {"train_batch": args.batch, "train_seq": args.seq, "train_steps": args.steps,
            "train_repeats": args.repeats, "train_warmup": args.warmup,
            "train_seconds": seconds, "train_tokens_per_s": statistics.median(rates),
            "train_tokens_per_s_min": min(rates), "train_tokens_per_s_max": max(rates),
            "train_tokens_per_s_all": rates,
            "losses": losses, "grad_norms": norms, "first_loss": losses[0],
            "finite": all(math.isfinite(x) for x in losses + norms)}


def run(args):
    sampler, seqs = read_sampler(args.logprobs[0]) if args.logprobs else (None, None)
    layers, seed, init_std, experts = model_settings(args, sampler)
    torch, _ = demo_model.require_torch()
    if args.deterministic:
        demo_model.deterministic(torch)
    layers = demo_model.resolve_layers(torch, layers, "learner", args.batch * args.seq)
    model = demo_model.build(layers, seed, init_std, experts)
    env = demo_model.environment()
    summary = {"demo": "learner", "spec": env["spec"], "shim": env["shim"], "layers": layers,
               "seed": seed, "experts": experts, "deterministic": args.deterministic,
               "device": env["device"], "torch": env["torch"],
               "transformers": env["transformers"]}
    if args.logprobs:
        info = demo_model.describe(model, layers, seed, init_std)
        lp = score(torch, model, seqs, args.score_batch)
        write_learner_file(args.logprobs[1], sampler, seqs, lp, info, seed, env)
        summary.update({"out": args.logprobs[1], "scored_tokens": sum(x.numel() for x in lp),
                        "logprobs_finite": all(bool(torch.isfinite(x).all()) for x in lp)})
    if args.train:
        summary.update(train(torch, model, args))
    used, peak = demo_model.memory_used(torch)
    summary.update({"gpu_memory_used": used, "torch_peak_reserved": peak})
    return summary


def main(argv=None):
    args = parse_args(argv)
    try:
        summary = run(args)
    except demo_model.DemoError as e:
        return demo_model.fail("demo_learner", e)
    print(json.dumps(summary), flush=True)
    if not summary.get("finite", True):
        bad = next(i for i, (a, b) in enumerate(zip(summary["losses"], summary["grad_norms"]))
                   if not (math.isfinite(a) and math.isfinite(b)))
        return demo_model.fail("demo_learner", f"loss or gradient norm not finite at step {bad}")
    if not summary.get("logprobs_finite", True):
        return demo_model.fail("demo_learner", "some scored log-probs are not finite")
    return 0


if __name__ == "__main__":
    sys.exit(main())
