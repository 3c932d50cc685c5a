"""ep_demo.py — a learner on several ranks under the shim: HF Qwen3-MoE with Qwen3-30B-A3B's
expert geometry (hidden 2048, 128 experts, top-8, expert width 768; the shapes of
demo/demo_model.py), trained a few steps by every rank of a torchrun job, in two layouts:

  ddp  data parallel: every rank holds the whole model and its own batch; the gradients are
       averaged (DistributedDataParallel with NCCL; with gloo, an all_reduce of their CPU copies);
  ep   expert parallel: rank r of N holds experts [r E/N, (r+1) E/N) of every layer, the rest of
       the model whole; each layer sends every token's hidden state to the ranks of its top-8
       experts and back with torch.distributed.all_to_all_single, so the expert GEMMs a rank runs
       are those of its slice on the tokens of all ranks (a real EP layout). The replicated
       parameters' gradients are averaged; each expert's come from all ranks' tokens.

    torchrun --standalone --nproc-per-node N demo/ep_demo.py --mode ddp,ep --out DIR
    (with the shim: LD_PRELOAD=build/libminite.so MINITE_SPEC=nvfp4-row
     MINITE_ROUTE=1536x2048,2048x768 MINITE_STATS=DIR/stats.%r.jsonl)

Both layouts replace HF's experts module by one of this file (the router, attention and
everything else stay HF's), whose expert GEMMs are F.linear per expert (one cublasGemmEx each,
routed by MINITE_ROUTE=1536x2048,2048x768) or, with --experts grouped_mm, one torch._grouped_mm
per projection over the rank's experts. It combines each token's top-8 results in a fixed order
(no atomics), and the run sets PyTorch's deterministic algorithms, so that a run under
MINITE_SPEC=bf16 can be compared bit for bit with one without the shim.

Devices: rank r uses cuda:LOCAL_RANK with NCCL when the host shows at least as many GPUs as it has
ranks; otherwise every rank of the host shares cuda:(LOCAL_RANK mod GPUs) over gloo (NCCL refuses
two ranks on one GPU), the exchanges staged through host memory: two processes on one GPU.
--backend forces one. The embeddings and the LM head are frozen (the gloo path averages the
gradients through host memory; their 620M parameters would dominate it).

Each rank writes DIR/rank<r>-<mode>.json: rank, device (ordinal and PCI address as torch sees
it), backend, the experts it holds, the loss of every step, the SHA-256 of the step-0 logits
(bf16 bytes) and of the losses' bits, whether everything stayed finite, the expert rows it ran at
step 0, and tokens/s (its own batch over the mean time of the steps after the first). Rank 0
prints one JSON line with every rank's figures and the job's tokens/s (the sum).
"""
import argparse
import hashlib
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
from demo_model import GEOMETRY  # noqa: E402  (Qwen3-30B-A3B's shapes; standard library only)

MODES = ("ddp", "ep")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", default="ddp,ep",
                   help="ddp, ep or both in turn (ddp,ep; the default)")
    p.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    p.add_argument("--batch", type=int, default=4, help="sequences per rank (default 4)")
    p.add_argument("--seq", type=int, default=256, help="tokens per sequence (default 256)")
    p.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
    p.add_argument("--lr", type=float, default=1e-3, help="SGD learning rate (default 1e-3)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights (default 0)")
    p.add_argument("--experts", choices=("linear", "grouped_mm"), default="linear",
                   help="expert GEMMs: F.linear per expert (default) or torch._grouped_mm")
    p.add_argument("--backend", choices=("auto", "nccl", "gloo"), default="auto")
    p.add_argument("--out", default=".", help="folder of the per-rank JSON files")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="a CPU run of a tiny geometry over gloo: checks the exchange and the "
                        "bookkeeping where there is no GPU (the figures mean nothing)")
    args = p.parse_args(argv)
    args.modes = [m for m in args.mode.split(",") if m]
    bad = [m for m in args.modes if m not in MODES]
    if bad or not args.modes:
        p.error(f"--mode takes {', '.join(MODES)} or both separated by a comma, not {args.mode}")
    for name in ("layers", "batch", "seq", "steps"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1")
    return args


# ---- the world ------------------------------------------------------------------------------


class World:
    """Rank, device and the process group; a single process (no torchrun) is a world of one."""

    def __init__(self, torch, backend, cpu=False):
        import torch.distributed as dist
        self.torch, self.dist, self.cpu = torch, dist, cpu
        self.rank = int(os.environ.get("RANK", "0"))
        self.size = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        local_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        gpus = 0 if cpu else torch.cuda.device_count()
        if gpus == 0 and not cpu:
            raise SystemExit("ep_demo: torch sees no CUDA GPU")
        if backend == "auto":
            backend = "nccl" if gpus >= local_size else "gloo"
        self.backend = backend
        self.device_index = self.local_rank if backend == "nccl" else self.local_rank % max(gpus, 1)
        self.device = torch.device("cpu") if cpu else torch.device("cuda", self.device_index)
        if not cpu:
            torch.cuda.set_device(self.device)
        self.shared_gpu = not cpu and gpus < local_size
        if self.size > 1:
            kw = {"device_id": self.device} if backend == "nccl" else {}
            dist.init_process_group(backend=backend, **kw)

    def staged(self):
        """gloo: exchanges go through host memory as bytes (also on the CPU, where the copies are
        no-ops, so that the smoke run takes the path of the shared GPU)."""
        return self.backend == "gloo"

    def sync(self):
        if not self.cpu:
            self.torch.cuda.synchronize()

    def all_to_all(self, x, send, recv):
        """Rows of x, send[d] of them to rank d; recv[s] come from rank s."""
        torch = self.torch
        if self.size == 1:
            return x.clone()
        shape = (sum(recv),) + tuple(x.shape[1:])
        if not self.staged():
            out = x.new_empty(shape)
            self.dist.all_to_all_single(out, x.contiguous(), recv, send)
            return out
        # gloo moves bytes: any dtype goes as its bytes, rows stay rows
        src = x.contiguous().cpu()
        flat = src.view(torch.uint8).reshape(src.shape[0], -1) if src.numel() else \
            torch.empty((0, x[0:1].numel() * x.element_size()), dtype=torch.uint8)
        out = torch.empty((shape[0], flat.shape[1]), dtype=torch.uint8)
        self.dist.all_to_all_single(out, flat, recv, send)
        return out.view(x.dtype).reshape(shape).to(x.device)

    def counts_exchange(self, send_counts):
        """How many rows each rank will send here, given how many this rank sends to each."""
        torch = self.torch
        if self.size == 1:
            return send_counts.clone()
        t = send_counts.to(torch.int64)
        if self.staged():
            t = t.cpu()
        out = torch.empty_like(t)
        self.dist.all_to_all_single(out, t)
        return out

    def average(self, tensors, bucket=1 << 26):
        """Average the tensors over the ranks in place, in fp32 buckets of about `bucket`
        elements (every rank passes the same tensors in the same order)."""
        if self.size == 1:
            return
        group, count = [], 0
        for t in tensors + [None]:
            if t is not None:
                group.append(t)
                count += t.numel()
            if group and (t is None or count >= bucket):
                self._average_flat(group)
                group, count = [], 0

    def _average_flat(self, tensors):
        torch = self.torch
        flat = torch.cat([t.float().flatten() for t in tensors])
        buf = flat.cpu() if self.staged() else flat
        self.dist.all_reduce(buf)
        buf = buf.to(flat.device) / self.size
        at = 0
        for t in tensors:
            n = t.numel()
            t.copy_(buf[at:at + n].view_as(t).to(t.dtype))
            at += n

    def gather(self, obj):
        if self.size == 1:
            return [obj]
        out = [None] * self.size
        self.dist.all_gather_object(out, obj)
        return out

    def barrier(self):
        if self.size > 1:
            self.dist.barrier()

    def close(self):
        if self.size > 1:
            self.dist.destroy_process_group()


# ---- the experts ----------------------------------------------------------------------------


def make_experts_class(torch):
    nn, F = torch.nn, torch.nn.functional

    class Exchange(torch.autograd.Function):
        """all_to_all_single that autograd runs backwards (the gradients take the way back)."""

        @staticmethod
        def forward(ctx, x, world, send, recv):
            ctx.world, ctx.send, ctx.recv = world, send, recv
            return world.all_to_all(x, send, recv)

        @staticmethod
        def backward(ctx, g):
            return ctx.world.all_to_all(g, ctx.recv, ctx.send), None, None, None

    class Experts(nn.Module):
        """HF's experts interface (hidden [T, H], top_k_index [T, k], top_k_weights [T, k]) over
        experts [first, first + count) of the layer held here; the others are on other ranks."""

        def __init__(self, gate_up, down, first, count, world, use_grouped):
            super().__init__()
            self.gate_up_proj = nn.Parameter(gate_up[first:first + count].detach().clone())
            self.down_proj = nn.Parameter(down[first:first + count].detach().clone())
            self.first, self.count, self.world = first, count, world
            self.use_grouped = use_grouped
            self.rows_run = 0  # expert rows this rank ran at its last forward

        def run_local(self, x, local_ids):
            """x [R, H] rows for local experts local_ids [R]: the experts' outputs, same order."""
            order = torch.argsort(local_ids, stable=True)
            xs = x[order]
            counts = torch.bincount(local_ids, minlength=self.count)
            self.rows_run = int(xs.shape[0])
            if self.use_grouped:
                offs = torch.cumsum(counts, 0).to(torch.int32)
                h = torch._grouped_mm(xs, self.gate_up_proj.transpose(-2, -1), offs=offs)
                gate, up = h.chunk(2, dim=-1)
                ys = torch._grouped_mm(F.silu(gate) * up, self.down_proj.transpose(-2, -1),
                                       offs=offs)
            else:
                pieces, at = [], 0
                for e, n in enumerate(counts.tolist()):
                    if n:
                        gate, up = F.linear(xs[at:at + n], self.gate_up_proj[e]).chunk(2, dim=-1)
                        pieces.append(F.linear(F.silu(gate) * up, self.down_proj[e]))
                    at += n
                ys = torch.cat(pieces) if pieces else xs.new_zeros((0, xs.shape[1]))
            return ys[torch.argsort(order)]

        def exchange(self, x, send, recv):
            return Exchange.apply(x, self.world, send, recv) if self.world.size > 1 else x

        def forward(self, hidden, top_k_index, top_k_weights):
            tokens, k = top_k_index.shape
            experts = top_k_index.reshape(-1)
            dest = torch.div(experts, self.count, rounding_mode="floor")
            order = torch.argsort(experts, stable=True)  # by destination rank, then expert
            src_rows = torch.div(order, k, rounding_mode="floor")
            send_counts = torch.bincount(dest, minlength=self.world.size)
            recv_counts = self.world.counts_exchange(send_counts)
            send, recv = send_counts.tolist(), recv_counts.tolist()
            x = self.exchange(hidden[src_rows], send, recv)
            ids = self.world.all_to_all(experts[order], send, recv) - self.first
            y = self.exchange(self.run_local(x, ids), recv, send)
            back = y[torch.argsort(order)].view(tokens, k, -1)  # assignment order again
            w = top_k_weights.to(back.dtype).unsqueeze(-1)
            return (back * w).sum(dim=1)  # the k results of a token added in a fixed order

    return Experts


# ---- the model ------------------------------------------------------------------------------


TINY = {"vocab_size": 512, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 16, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32}


def build(torch, args, world, mode):
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig
    geometry = TINY if args.cpu_smoke else GEOMETRY
    config = Qwen3MoeConfig(
        num_hidden_layers=args.layers, intermediate_size=6144, decoder_sparse_step=1,
        mlp_only_layers=[], norm_topk_prob=True, max_position_embeddings=40960,
        rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=False, initializer_range=0.02, attention_dropout=0.0,
        use_cache=False, output_router_logits=False, bos_token_id=None, eos_token_id=None,
        pad_token_id=None, attn_implementation="sdpa", experts_implementation="eager",
        **geometry)
    with torch.device(world.device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.to(world.device)
    gen = torch.Generator(device=world.device)
    gen.manual_seed(args.seed)
    with torch.no_grad():  # the same weights on every rank: one generator, name order
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    Experts = make_experts_class(torch)
    e = geometry["num_experts"]
    ep = mode == "ep" and world.size > 1
    if ep and e % world.size:
        raise SystemExit(f"ep_demo: {e} experts do not split over {world.size} ranks")
    count = e // world.size if ep else e
    first = world.rank * count if ep else 0
    layers = []
    for layer in model.model.layers:
        old = layer.mlp.experts
        if tuple(old.gate_up_proj.shape) != (e, 2 * geometry["moe_intermediate_size"],
                                             geometry["hidden_size"]):
            raise SystemExit(f"ep_demo: unexpected expert layout {tuple(old.gate_up_proj.shape)}")
        layer.mlp.experts = Experts(old.gate_up_proj, old.down_proj, first, count,
                                    world if ep else Solo(world), args.experts == "grouped_mm")
        layers.append(layer.mlp.experts)
        del old
    for p in list(model.model.embed_tokens.parameters()) + list(model.lm_head.parameters()):
        p.requires_grad_(False)
    if not world.cpu:
        torch.cuda.empty_cache()
    model.train()
    return model, layers, (first, first + count)


class Solo:
    """The experts' world when every expert is local: exchanges are the identity."""

    def __init__(self, world):
        self.size, self.torch = 1, world.torch

    def all_to_all(self, x, send, recv):
        return x

    def counts_exchange(self, c):
        return c


# ---- the run --------------------------------------------------------------------------------


def sha256_of(torch, t):
    return hashlib.sha256(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes()) \
        .hexdigest()


def run_mode(torch, args, world, mode):
    model, experts, held = build(torch, args, world, mode)
    split = mode == "ep" and world.size > 1
    sliced = [p for n, p in model.named_parameters()
              if split and (n.endswith("experts.gate_up_proj") or n.endswith("experts.down_proj"))]
    replicated = [p for p in model.parameters()
                  if p.requires_grad and not any(p is q for q in sliced)]
    step_model = model
    ddp = mode == "ddp" and world.size > 1 and world.backend == "nccl"
    if ddp:
        from torch.nn.parallel import DistributedDataParallel
        step_model = DistributedDataParallel(model, device_ids=[world.device_index],
                                             find_unused_parameters=True)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=args.lr)
    gen = torch.Generator().manual_seed(args.seed + 1 + world.rank)  # each rank its own batch
    vocab = (TINY if args.cpu_smoke else GEOMETRY)["vocab_size"]
    ids = torch.randint(0, vocab, (args.batch, args.seq), generator=gen)
    ids = ids.to(world.device)
    losses, step_s, finite, logits_sha, rows_run = [], [], True, None, 0
    for step in range(args.steps):
        world.sync()
        world.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        out = step_model(input_ids=ids, labels=ids)
        if step == 0:
            logits_sha = sha256_of(torch, out.logits)
            rows_run = sum(e.rows_run for e in experts)
        out.loss.backward()
        for p in sliced:  # the exchange brought every rank's gradient: their sum, where the
            if p.grad is not None:  # data-parallel learner averages over the ranks
                p.grad.div_(world.size)
        if not ddp:
            for p in replicated:  # an expert no token reached has no gradient: zero, so that
                if p.grad is None:  # every rank averages the same tensors
                    p.grad = torch.zeros_like(p)
            world.average([p.grad for p in replicated])
        opt.step()
        world.sync()
        step_s.append(time.perf_counter() - t0)
        loss = float(out.loss.detach())
        finite &= loss == loss and abs(loss) != float("inf")
        losses.append(loss)
    timed = step_s[1:] or step_s
    props = None if world.cpu else torch.cuda.get_device_properties(world.device)
    result = {
        "mode": mode, "rank": world.rank, "world": world.size, "local_rank": world.local_rank,
        "backend": world.backend, "shared_gpu": world.shared_gpu,
        "device": world.device_index, "device_name": props.name if props else "cpu",
        "pci_bus_id": getattr(props, "pci_bus_id", None),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "experts_held": list(held), "experts_impl": args.experts,
        "losses": losses, "first_loss": losses[0],
        "losses_sha256": hashlib.sha256(json.dumps([x.hex() for x in losses]).encode())
        .hexdigest(),
        "logits_sha256": logits_sha, "finite": bool(finite), "expert_rows_step0": rows_run,
        "step_s": step_s, "tokens_per_s": args.batch * args.seq / (sum(timed) / len(timed)),
        "shim": shim_loaded(), "spec": os.environ.get("MINITE_SPEC") if shim_loaded() else None,
    }
    del step_model, model, opt, experts
    if not world.cpu:
        torch.cuda.empty_cache()
    return result


def shim_loaded():
    try:
        with open("/proc/self/maps") as f:
            return any("libminite" in line for line in f)
    except OSError:
        return False


def main(argv=None):
    args = parse_args(argv)
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"ep_demo: {e.name} is not installed: the demo needs torch with CUDA and "
              "transformers >= 5 (pip install torch transformers)", file=sys.stderr)
        return 1
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    world = World(torch, "gloo" if args.cpu_smoke else args.backend, cpu=args.cpu_smoke)
    os.makedirs(args.out, exist_ok=True)
    summary = {"world": world.size, "backend": world.backend, "modes": {}}
    for mode in args.modes:
        r = run_mode(torch, args, world, mode)
        with open(os.path.join(args.out, f"rank{world.rank}-{mode}.json"), "w") as f:
            json.dump(r, f)
        every = world.gather(r)
        summary["modes"][mode] = {
            "job_tokens_per_s": sum(x["tokens_per_s"] for x in every),
            "ranks": [{k: x[k] for k in ("rank", "device", "first_loss", "tokens_per_s",
                                         "expert_rows_step0", "finite")} for x in every]}
    world.barrier()
    world.close()
    if world.rank == 0:
        print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
