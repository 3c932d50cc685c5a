"""demo_model.py — the model of the demos: HF transformers Qwen3-MoE with random weights and
Qwen3-30B-A3B's geometry (hidden 2048, 128 experts, top-8, expert width 768, vocabulary 151936,
32 query heads, 4 KV heads, head_dim 128), BF16 on the GPU, up to its 48 layers: --layers N, or
"auto" (the default), as many as fit the GPU for the process's role (fit_layers below).

Experts run with HF's default experts implementation, "grouped_mm" (--experts grouped_mm): per
layer one torch._grouped_mm for gate_up_proj (1536x2048 per expert) and one for down_proj
(2048x768), which the shim hooks at its kernel entry and runs as one grouped NVFP4 launch each.
"eager" (--experts eager) is the other front door: a Python loop over the experts hit, each expert
one F.linear per weight, so each expert GEMM is one cublasGemmEx. Both are routed by
MINITE_ROUTE=1536x2048,2048x768 (docs/design.md, "Interposition facts measured on the H200").

The weights are drawn from one CUDA generator seeded with --seed, parameter by parameter in name
order, so every process that builds the model with the same seed, layer count and GPU type holds
the same weights; describe() records a float64 checksum so that gap-report can refuse to compare
log-probs of two different models. Normal(0, 0.02) (HF's initializer_range) keeps activations near
unit scale through the layers: every projection reads an RMS-normalised input, 0.02 * sqrt(2048)
is about 0.9.

Depth. --layers auto picks the layer count from the GPU's total memory (not its free memory, so
that a run with the shim and one without pick the same count), by a byte budget per layer that
fit_layers spells out: the sampler holds BF16 weights, their NVFP4 copy in the shim's weight store
(counted with or without the shim) and its KV cache; the learner adds gradients, AdamW's two
states (BF16, as the weights) and the activations kept for the backward of its tokens.
Each process reports its peak memory, which checks the budget.

Run it alone to check a model builds and gives finite logits:
    python3 demo/demo_model.py [--layers auto] [--seed 0]
torch and transformers are imported only when a model is built, so the argument parsing and the
file formats of the demos can be tested on a machine without them.
"""
import argparse
import json
import math
import os
import sys
import time

ROUTE = "1536x2048,2048x768"
GEOMETRY = {
    "vocab_size": 151936,
    "hidden_size": 2048,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 768,
}
MODEL_LAYERS = 48        # Qwen3-30B-A3B's depth
DEFAULT_LAYERS = "auto"
DEFAULT_SEED = 0
DEFAULT_INIT_STD = 0.02
EXPERTS = ("grouped_mm", "eager")   # the first is HF's default
DEFAULT_EXPERTS = EXPERTS[0]
# The demos run on the GPU; only the CPU smoke test of the HF calls sets "cpu" (with a small
# GEOMETRY) to exercise the same code where there is no GPU.
DEVICE = "cuda"


class DemoError(Exception):
    """A condition the demo cannot run under; the message says what to do."""


def add_model_args(parser, defaults=True):
    """--layers/--seed/--init-std/--experts; with defaults=False they stay None (taken from a
    file)."""
    parser.add_argument("--layers", type=layers_arg, default=DEFAULT_LAYERS if defaults else None,
                        help=f"decoder layers, or auto: as many as fit the GPU, at most "
                             f"{MODEL_LAYERS} (default {DEFAULT_LAYERS})")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED if defaults else None,
                        help=f"seed of the random weights (default {DEFAULT_SEED})")
    parser.add_argument("--init-std", type=positive_float,
                        default=DEFAULT_INIT_STD if defaults else None,
                        help=f"standard deviation of the weights (default {DEFAULT_INIT_STD})")
    parser.add_argument("--experts", choices=EXPERTS,
                        default=DEFAULT_EXPERTS if defaults else None,
                        help=f"HF experts implementation (default {DEFAULT_EXPERTS}, HF's own)")
    parser.add_argument("--deterministic", action="store_true",
                        help="PyTorch's deterministic algorithms and a fixed cuBLAS workspace, "
                             "so that a run without the shim repeats bit for bit")


def _int_at_least(text, low, what):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{value} {what}")
    return value


def positive_int(text):
    return _int_at_least(text, 1, "must be at least 1")


def nonnegative_int(text):
    return _int_at_least(text, 0, "must not be negative")


def layers_arg(text):
    """A layer count, or "auto"."""
    return text if text == "auto" else positive_int(text)


def _float_where(text, ok, why):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not ok(value):  # NaN fails both
        raise argparse.ArgumentTypeError(f"{value} {why}")
    return value


def positive_float(text):
    return _float_where(text, lambda v: v > 0, "must be positive")


def nonnegative_float(text):
    return _float_where(text, lambda v: 0 <= v < math.inf, "must be a finite number, at least 0")


GB = 1e9
# Bytes an element of a routed weight takes in the shim's weight store: a 4-bit code and an E4M3
# scale per 16 elements (kernels/wstore.h: 144-byte records of 8 x 32 elements).
STORE_BYTES = 144 / 256
# Sampler: bytes of memory left over besides the budget below: the CUDA context, cuBLAS and the
# shim's workspaces, the prefill's activations, the MoE profile's blocks, allocator slack.
SAMPLER_SPARE = 8 * GB
# Learner: the same, plus the largest transient of a step, the loss over the vocabulary: BF16
# logits, their FP32 copy, the saved log-softmax and its gradient, 14 bytes a token and word.
LEARNER_SPARE = 6 * GB
LOSS_BYTES = 14
# Activations a learner layer keeps for the backward, bytes a token: the routed copies of the
# token (top-8 of them: the gathered input, gate_up's output and its masked copy, the activation,
# down's output, its masked and weighted copies, 2H + 4I + 3H elements) and attention's
# inputs and outputs (about 6 x 4096). BF16.
def _layer_activation_bytes():
    g = GEOMETRY
    h, i, k = g["hidden_size"], g["moe_intermediate_size"], g["num_experts_per_tok"]
    return 2 * (k * (5 * h + 5 * i) + 6 * g["num_attention_heads"] * g["head_dim"])


def layer_params():
    """(attention and norms, router, experts) parameters of one decoder layer."""
    g = GEOMETRY
    h, d = g["hidden_size"], g["head_dim"]
    q, kv = g["num_attention_heads"] * d, g["num_key_value_heads"] * d
    attn = 2 * h * q + 2 * h * kv + 2 * d + 2 * h
    return attn, g["num_experts"] * h, 3 * g["num_experts"] * h * g["moe_intermediate_size"]


def fit_layers(total_bytes, role, tokens):
    """How many layers (1 .. MODEL_LAYERS) fit a GPU of total_bytes for `role`: "sampler" with
    `tokens` KV-cache slots (sequences x their length), "learner" training on `tokens` tokens a
    step with AdamW."""
    g = GEOMETRY
    attn, router, experts = layer_params()
    params = attn + router + experts
    store = STORE_BYTES * experts
    embed = 2 * g["vocab_size"] * g["hidden_size"]          # embedding and LM head
    if role == "sampler":
        kv = 2 * g["num_key_value_heads"] * g["head_dim"] * 2 * tokens
        per_layer = 2 * params + store + kv
        fixed = 2 * embed + SAMPLER_SPARE
    elif role == "learner":
        per_layer = 8 * params + store + tokens * _layer_activation_bytes()
        fixed = 8 * embed + LOSS_BYTES * tokens * g["vocab_size"] + LEARNER_SPARE
    else:
        raise ValueError(role)
    return max(1, min(MODEL_LAYERS, int((total_bytes - fixed) // per_layer)))


def resolve_layers(torch, layers, role, tokens):
    """`layers`, or for "auto" fit_layers on this GPU."""
    if layers != "auto":
        return layers
    if DEVICE != "cuda":
        return 1  # the CPU smoke tests' tiny geometry
    return fit_layers(torch.cuda.get_device_properties(0).total_memory, role, tokens)


def memory_used(torch):
    """Bytes in use on the GPU by every allocator of this process (torch's and the shim's) and
    the peak of torch's own: (used now, torch's peak)."""
    if DEVICE != "cuda":
        return None, None
    free, total = torch.cuda.mem_get_info()
    return total - free, torch.cuda.max_memory_reserved()


def require_torch():
    """(torch, transformers), or DemoError saying what is missing."""
    try:
        import torch
    except ImportError:
        raise DemoError("torch is not installed: the demos need torch with CUDA and "
                        "transformers >= 5 (pip install torch transformers)") from None
    try:
        import transformers
    except ImportError:
        raise DemoError("transformers is not installed: pip install 'transformers>=5'") from None
    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise DemoError("torch sees no CUDA GPU: the demos run on a GPU machine "
                        "(check nvidia-smi and CUDA_VISIBLE_DEVICES)")
    return torch, transformers


def deterministic(torch):
    """PyTorch's deterministic algorithms (warning, not failing, on an op without one) and
    cuBLAS's fixed workspace configuration (read when a handle is made: before the first GEMM),
    so that two runs of one program on one GPU give the same bits. Memory is not filled on
    allocation (its default under deterministic algorithms): the demos read no memory they did
    not write, and filling would add a kernel to every allocation of a step."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False


def shim_path():
    """Path of the preloaded libminite.so in this process, or None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                if os.path.basename(path).startswith("libminite"):
                    return path
    except OSError:
        pass
    return None


def spec_name():
    """The spec the shim runs under: MINITE_SPEC when the shim is loaded, else "none"."""
    if shim_path() is None:
        return "none"
    return os.environ.get("MINITE_SPEC") or "none"


def build(layers=DEFAULT_LAYERS, seed=DEFAULT_SEED, init_std=DEFAULT_INIT_STD,
          experts=DEFAULT_EXPERTS, attention="sdpa"):
    """The model, on cuda in BF16, in eval mode, weights drawn from `seed`, experts run by
    `experts` (grouped_mm or eager), attention by `attention` ("sdpa" or DECODE_ATTENTION)."""
    if experts not in EXPERTS:
        raise DemoError(f"experts implementation {experts!r}: use one of {', '.join(EXPERTS)}")
    torch, transformers = require_torch()
    from transformers import AutoModelForCausalLM, Qwen3MoeConfig

    config = Qwen3MoeConfig(
        num_hidden_layers=layers,
        intermediate_size=6144,          # dense MLP width; unused: every layer is MoE
        decoder_sparse_step=1,
        mlp_only_layers=[],
        norm_topk_prob=True,             # as Qwen3-30B-A3B: top-8 weights sum to 1
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        tie_word_embeddings=False,
        initializer_range=init_std,
        attention_dropout=0.0,
        use_cache=True,
        bos_token_id=None,
        eos_token_id=None,               # no end token: every sequence runs to its length
        pad_token_id=None,
        attn_implementation="sdpa",     # the decode attention, if asked, is set on the model
        experts_implementation=experts,
        **GEOMETRY,
    )
    with torch.device(DEVICE):  # weights made on the GPU: building 1.9e9 of them on the CPU is slow
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.to(DEVICE)  # a no-op unless this transformers version built something elsewhere
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation(experts)
    if attention != "sdpa":
        register_decode_attention()
        model.set_attn_implementation(attention)
    check_structure(model, layers, transformers.__version__, experts)
    wrong = [n for n, p in model.named_parameters()
             if p.dtype != torch.bfloat16 or p.device.type != DEVICE]
    if wrong:
        raise DemoError(f"transformers {transformers.__version__} built {wrong[0]} (and "
                        f"{len(wrong) - 1} more) in another dtype than BF16; the demo needs "
                        "from_config(config, dtype=torch.bfloat16) to build BF16 weights")
    init_weights(torch, model, seed, init_std)
    model.eval()
    return model


DECODE_ATTENTION = "minite_gqa_decode"


def gqa_decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                         is_causal=None, **kwargs):
    """HF's sdpa attention, except for one query token against a boolean 4-D mask (a decode step
    over a static cache): there sdpa cannot take the KV heads as they are and HF copies each one
    to the 8 query heads that share it (repeat_kv), so a step reads and writes 8 copies of the
    whole cache per layer. Here the 8 queries of a KV head are the rows of one batched GEMM
    against that head's keys and values, read once: scores in FP32 (bf16 operands, FP32
    accumulate and output, as sdpa's kernels keep them), the mask, an FP32 softmax, the
    probabilities in BF16 against the values (as sdpa's kernels do). Registered with
    transformers' AttentionInterface by build(attention=DECODE_ATTENTION);
    tests/gpu/test_demo_sampler.py compares it with sdpa, and the CPU smoke test's sampler runs
    it (scores from FP32 copies there) against the learner's full forward."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    b, h, q_len, d = query.shape
    g, length = key.shape[1], key.shape[2]
    if (q_len != 1 or attention_mask is None or attention_mask.dtype.is_floating_point or
            attention_mask.dim() != 4 or dropout or h % g):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    import torch
    rep = h // g
    q = query.reshape(b * g, rep, d)              # query head j reads KV head j // rep
    k = key.reshape(b * g, length, d)
    if query.device.type == "cuda":
        scores = torch.bmm(q, k.transpose(1, 2), out_dtype=torch.float32)
    else:  # the CPU smoke tests: no BF16-in, FP32-out bmm there
        scores = torch.bmm(q.float(), k.float().transpose(1, 2))
    scores.mul_(scaling if scaling is not None else d ** -0.5)
    keep = attention_mask[:, :, -1:, :].expand(b, g, 1, length).reshape(b * g, 1, length)
    scores.masked_fill_(~keep, float("-inf"))
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    out = torch.bmm(probs, value.reshape(b * g, length, d))
    return out.view(b, h, 1, d).transpose(1, 2).contiguous(), None


def register_decode_attention():
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(DECODE_ATTENTION, gqa_decode_attention)
    AttentionMaskInterface.register(DECODE_ATTENTION, sdpa_mask)


def experts_implementation(model):
    return getattr(model.config, "_experts_implementation", None)


def check_structure(model, layers, tf_version, experts):
    impl = experts_implementation(model)
    if impl != experts:
        raise DemoError(f"transformers {tf_version}: experts implementation is {impl!r}, not "
                        f"{experts!r}; this demo needs transformers >= 5 with "
                        "experts_implementation (grouped_mm and eager)")
    experts = [m for m in model.modules() if hasattr(m, "gate_up_proj") and
               hasattr(m, "down_proj") and getattr(m.gate_up_proj, "dim", lambda: 0)() == 3]
    if len(experts) != layers:
        raise DemoError(f"transformers {tf_version}: found {len(experts)} expert modules with 3-D "
                        f"gate_up_proj/down_proj, expected {layers}; this demo needs the "
                        "transformers >= 5 layout (gate_up_proj [E, 2I, H], down_proj [E, H, I])")
    e, i, h = GEOMETRY["num_experts"], GEOMETRY["moe_intermediate_size"], GEOMETRY["hidden_size"]
    for m in experts:
        if tuple(m.gate_up_proj.shape) != (e, 2 * i, h) or tuple(m.down_proj.shape) != (e, h, i):
            raise DemoError(f"expert weights are {tuple(m.gate_up_proj.shape)} and "
                            f"{tuple(m.down_proj.shape)}, expected {(e, 2 * i, h)} and "
                            f"{(e, h, i)}")
    q_out = model.model.layers[0].self_attn.q_proj.out_features
    want = GEOMETRY["num_attention_heads"] * GEOMETRY["head_dim"]
    if q_out != want:
        raise DemoError(f"q_proj has {q_out} outputs, expected {want} (head_dim 128 not taken "
                        "by this transformers version's Qwen3MoeConfig)")


def init_weights(torch, model, seed, init_std):
    gen = torch.Generator(device=DEVICE)
    gen.manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):   # RMSNorm gains (layer, q/k and final norms)
                p.fill_(1.0)
            else:
                p.normal_(0.0, init_std, generator=gen)


def checksum(torch, model):
    """float64 sum of all weights: equal in two processes iff (in practice) the weights are."""
    with torch.no_grad():
        sums = [p.detach().sum(dtype=torch.float64) for _, p in sorted(model.named_parameters())]
        return float(torch.stack(sums).sum().item())


def describe(model, layers, seed, init_std):
    """The "model" object of the log-prob file header."""
    import torch
    return {
        "name": "qwen3-moe-random",
        "layers": layers,
        "hidden": GEOMETRY["hidden_size"],
        "experts": GEOMETRY["num_experts"],
        "top_k": GEOMETRY["num_experts_per_tok"],
        "expert_width": GEOMETRY["moe_intermediate_size"],
        "vocab": GEOMETRY["vocab_size"],
        "heads": GEOMETRY["num_attention_heads"],
        "kv_heads": GEOMETRY["num_key_value_heads"],
        "head_dim": GEOMETRY["head_dim"],
        "experts_implementation": experts_implementation(model),
        "dtype": "bfloat16",
        "seed": seed,
        "init_std": init_std,
        "checksum": checksum(torch, model),
    }


def environment():
    """Versions and device, for headers and summaries."""
    import torch
    import transformers
    device = torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "device": device, "shim": shim_path(), "spec": spec_name()}


def cuda_timer(torch):
    """A callable returning seconds since the previous call, the GPU synchronised at each call."""
    state = {"t": None}

    def lap():
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()
        prev, state["t"] = state["t"], now
        return None if prev is None else now - prev
    return lap


def fail(prog, err):
    print(f"{prog}: {err}", file=sys.stderr)
    return 1


def main(argv=None):
    p = argparse.ArgumentParser(description="Build the demo model and check its logits.")
    add_model_args(p)
    p.add_argument("--tokens", type=positive_int, default=128, help="tokens of the check batch")
    args = p.parse_args(argv)
    try:
        torch, _ = require_torch()
        lap = cuda_timer(torch)
        lap()
        model = build(args.layers, args.seed, args.init_std, args.experts)
        build_s = lap()
        gen = torch.Generator().manual_seed(args.seed + 1)
        ids = torch.randint(0, GEOMETRY["vocab_size"], (2, args.tokens), generator=gen)
        ids = ids.to(DEVICE)
        with torch.no_grad():
            out = model(input_ids=ids, output_hidden_states=True)
        logits = out.logits.float()
        rms = [float(h.float().pow(2).mean().sqrt()) for h in out.hidden_states]
        info = {"demo": "model", "params": sum(p.numel() for p in model.parameters()),
                "build_s": build_s, "logits_finite": bool(torch.isfinite(logits).all()),
                "logits_std": float(logits.std()), "hidden_rms_by_layer": rms,
                "model": describe(model, args.layers, args.seed, args.init_std),
                **environment()}
    except DemoError as e:
        return fail("demo_model", e)
    print(json.dumps(info))
    if not info["logits_finite"]:
        return fail("demo_model", "logits are not finite: lower --init-std")
    return 0


if __name__ == "__main__":
    sys.exit(main())
