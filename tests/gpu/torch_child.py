"""torch_child.py — one PyTorch workload, run in a child process by test_torch_passthrough.py.

    python3 tests/gpu/torch_child.py CASE OUT.pt

CASE is linear | linear_bias | bmm | moe. Saves every output and gradient to OUT.pt (CPU tensors)
so that the parent can compare runs with and without the shim bit for bit. Inputs come from fixed
seeds; nothing here knows whether libminite.so is preloaded.
"""
import json
import sys

import torch
import torch.nn.functional as F

# PyTorch's default, set explicitly so that both runs of a comparison agree whatever changes it.
torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
# The eager experts combine token results with index_add_, atomics unless deterministic
# algorithms are on; cuBLAS needs the workspace setting for them (the parent sets it).
torch.use_deterministic_algorithms(True, warn_only=True)

DEV = "cuda"
DT = torch.bfloat16


def randn(*shape, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float32).to(DEV, DT)


def linear(bias):
    out = {}
    # tokens x in, weight out x in: token counts like an expert's (1, odd, large)
    for t in (1, 7, 64, 333):
        x = randn(t, 256, seed=t).requires_grad_(True)
        w = randn(384, 256, seed=1000 + t).requires_grad_(True)
        b = randn(384, seed=2000 + t).requires_grad_(True) if bias else None
        y = F.linear(x, w, b)
        y.float().square().sum().backward()
        out[f"y{t}"] = y.detach()
        out[f"dx{t}"] = x.grad
        out[f"dw{t}"] = w.grad
        if bias:
            out[f"db{t}"] = b.grad
    return out


def bmm():
    out = {}
    for batch, m, k, n in ((4, 32, 64, 48), (3, 17, 128, 5)):
        a = randn(batch, m, k, seed=m)
        b = randn(batch, k, n, seed=n)
        out[f"c{batch}x{m}x{k}x{n}"] = torch.bmm(a, b)
    return out


def moe_config():
    from transformers import Qwen3MoeConfig
    # Every weight shape distinct, so that the census tells the expert GEMMs apart:
    # experts gate_up [2I, H] = 96x128 and down [H, I] = 128x48.
    config = Qwen3MoeConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, moe_intermediate_size=48,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        num_experts=8, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[],
        norm_topk_prob=True, max_position_embeddings=256, tie_word_embeddings=False)
    # Eager attention: plain matmuls (more cuBLAS calls to check) and a deterministic backward,
    # where SDPA's fused kernels may use atomics.
    try:
        config._attn_implementation = "eager"
    except Exception:  # an older or newer config without the setter: SDPA it is
        pass
    return config


def moe(info_path):
    from transformers import Qwen3MoeForCausalLM
    config = moe_config()
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(config).to(DEV, DT)
    if hasattr(model, "set_experts_implementation"):
        model.set_experts_implementation("eager")
    impl = model.get_experts_implementation() if hasattr(model, "get_experts_implementation") \
        else "per-expert modules (transformers 4.x)"
    model.train()
    g = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (2, 24), generator=g).to(DEV)
    result = model(input_ids=ids, labels=ids)
    result.loss.backward()
    out = {"logits": result.logits.detach(), "loss": result.loss.detach()}
    for name, p in model.named_parameters():
        if p.grad is not None:
            out["grad." + name] = p.grad
    with open(info_path, "w") as f:
        json.dump({"experts_implementation": str(impl),
                   "expert_routes": [f"{2 * config.moe_intermediate_size}x{config.hidden_size}",
                                     f"{config.hidden_size}x{config.moe_intermediate_size}"]}, f)
    return out


def main():
    case, path = sys.argv[1], sys.argv[2]
    if case == "linear":
        out = linear(False)
    elif case == "linear_bias":
        out = linear(True)
    elif case == "bmm":
        out = bmm()
    elif case == "moe":
        out = moe(path + ".info.json")
    else:
        sys.exit(f"unknown case {case}")
    torch.cuda.synchronize()
    torch.save({k: v.detach().cpu() for k, v in out.items()}, path)


if __name__ == "__main__":
    main()
