"""grouped_child.py CASE OUT — one workload of tests/gpu/test_grouped_mm.py, run in a process of its
own (the parent sets LD_PRELOAD, the MINITE_* variables and TORCH_BLAS_PREFER_CUBLASLT). Writes
OUT.npz with what the parent compares. Nothing here knows whether libminite.so is preloaded.
Not a test by itself.

Cases:
  hf_train     a small random Qwen3-MoE from transformers with its default experts
               implementation (grouped_mm: torch._grouped_mm), one learner step: forward and
               backward; logits, loss and every gradient
  hf_generate  the same model, greedy generate of 8 tokens: the tokens and every step's logits
  direct       torch._grouped_mm x . W^T on random routings (8 experts, some with no token,
               weight 256 x 512), the 3-D x 3-D form, and each expert's rows again as its own
               F.linear (the per-call path); then one call under the profiler: its kernels
  bmm          a capacity-style MoE: torch.bmm(x [E, C, 512], W.transpose(1, 2)) (strided
               batched, or an Lt matmul with a batch count under TORCH_BLAS_PREFER_CUBLASLT=1),
               each expert's F.linear, the call captured in a CUDA graph and replayed on new
               inputs, and one call under the profiler
  digest       the same rows through the same experts in one grouped call, or split over the
               per-call path and two grouped calls (MT_BATCHING=one or split), then a 3-D call
  jax_rows     the expert rows of tests/gpu/jax_child.py's file MT_NPZ (x [E, C, K], w [E, N, K])
               through one torch._grouped_mm call with offsets, as HF's experts make it
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

from shim_child import f32, rand

torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
# index_add_ combines the experts' results: atomics unless deterministic algorithms are on
torch.use_deterministic_algorithms(True, warn_only=True)

E, N, K = 8, 256, 512  # the routed weight: N x K (MINITE_ROUTE=256x512)
H, I = 256, 64  # the HF model: gate_up [E, 2I, H] = 128x256, down [E, H, I] = 256x64
HF_ROUTES = f"{2 * I}x{H},{H}x{I}"


def hf_model():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    config = Qwen3MoeConfig(
        vocab_size=512, hidden_size=H, intermediate_size=512, moe_intermediate_size=I,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        num_experts=E, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[],
        norm_topk_prob=True, max_position_embeddings=256, tie_word_embeddings=False)
    try:
        config._attn_implementation = "eager"  # plain matmuls, a deterministic backward
    except Exception:
        pass
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(config).to("cuda", torch.bfloat16)
    impl = model.get_experts_implementation() if hasattr(model, "get_experts_implementation") \
        else getattr(config, "_experts_implementation", "?")
    # transformers 5 answers per sub-config ({"": "grouped_mm"}): kept as JSON, not as its str()
    return model, config, impl if isinstance(impl, dict) else str(impl)


def info(out, **kv):
    out["info"] = np.frombuffer(json.dumps(kv).encode(), dtype=np.uint8)
    return out


def case_hf_train():
    model, config, impl = hf_model()
    model.train()
    g = torch.Generator(device="cpu").manual_seed(1)
    ids = torch.randint(0, config.vocab_size, (2, 48), generator=g).to("cuda")
    result = model(input_ids=ids, labels=ids)
    result.loss.backward()
    out = {"logits": f32(result.logits.detach()), "loss": f32(result.loss.detach())}
    for name, p in model.named_parameters():
        if p.grad is not None:
            out["grad." + name] = f32(p.grad)
    return info(out, experts_implementation=impl, routes=HF_ROUTES)


def case_hf_generate():
    model, config, impl = hf_model()
    model.eval()
    g = torch.Generator(device="cpu").manual_seed(2)
    ids = torch.randint(0, config.vocab_size, (2, 16), generator=g).to("cuda")
    with torch.no_grad():
        res = model.generate(ids, max_new_tokens=8, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, pad_token_id=0)
    out = {"tokens": res.sequences.cpu().numpy()}
    for i, step in enumerate(res.logits):
        out[f"logits{i}"] = f32(step)
    return info(out, experts_implementation=impl, routes=HF_ROUTES)


def gemm_launches(fn):
    """The kernels of one call of fn (after a warm-up), from the profiler: how many of them are
    the engine's GEMMs (mt_gemm*, mt_grouped*), and all their names."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sum(n.startswith(("mt_gemm", "mt_grouped")) for n in names), names


def case_direct():
    g = torch.Generator(device="cpu").manual_seed(3)
    counts = torch.randint(0, 80, (E,), generator=g)
    counts[2] = 0  # an expert with no token
    counts[5] = 1
    offs = torch.cumsum(counts, 0).to(torch.int32).cuda()
    t = int(counts.sum())
    x, w = rand(t, K, seed=10), rand(E, N, K, seed=11)
    y = torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
    per_call = torch.empty_like(y)
    start = 0
    for e, c in enumerate(counts.tolist()):
        if c:
            per_call[start:start + c] = F.linear(x[start:start + c], w[e])
        start += c
    x3 = rand(E, 24, K, seed=12)
    y3 = torch._grouped_mm(x3, w.transpose(-2, -1))
    launches, names = gemm_launches(lambda: torch._grouped_mm(x, w.transpose(-2, -1), offs=offs))
    out = {"x": f32(x), "w": f32(w), "offs": offs.cpu().numpy(), "y": f32(y),
           "per_call": f32(per_call), "x3": f32(x3), "y3": f32(y3),
           "launches": np.array(launches)}
    return info(out, kernels=names)


def case_bmm():
    c = 32  # capacity: tokens per expert
    x, w = rand(E, c, K, seed=20), rand(E, N, K, seed=21)
    y = torch.bmm(x, w.transpose(1, 2))
    per_call = torch.stack([F.linear(x[e], w[e]) for e in range(E)])
    # captured: a warm-up on the capture stream first, as PyTorch's own pattern does
    xs, ws = x.clone(), w.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.bmm(xs, ws.transpose(1, 2))
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        ys = torch.bmm(xs, ws.transpose(1, 2))
    out = {"y": f32(y), "per_call": f32(per_call)}
    for i, (xseed, wseed) in enumerate(((22, 21), (23, 24))):
        xs.copy_(rand(E, c, K, seed=xseed))
        ws.copy_(rand(E, N, K, seed=wseed))
        graph.replay()
        torch.cuda.synchronize()
        out[f"replay{i}"] = f32(ys)
        out[f"eager{i}"] = f32(torch.bmm(xs.clone(), ws.clone().transpose(1, 2)))
    launches, names = gemm_launches(lambda: torch.bmm(x, w.transpose(1, 2)))
    out["launches"] = np.array(launches)
    return info(out, kernels=names, lt=os.environ.get("TORCH_BLAS_PREFER_CUBLASLT", ""))


def case_digest():
    """The same token rows through the same experts (8, each with 1..15 rows), batched as
    MT_BATCHING says: "one", one torch._grouped_mm call with offsets; "split", expert 0's rows as
    its own F.linear (the per-call path), experts 1..3 in a grouped call, 4..7 in another (each
    with zero rows for the other experts), then the strided 3-D form on the first 8 rows of every
    expert as one more call in both modes."""
    g = torch.Generator(device="cpu").manual_seed(5)
    counts = torch.randint(1, 16, (E,), generator=g)  # at most 120 rows: a call keeps 128
    x, w = rand(int(counts.sum()), K, seed=30), rand(E, N, K, seed=31)
    wt = w.transpose(-2, -1)
    ends = torch.cumsum(counts, 0)
    if os.environ.get("MT_BATCHING", "one") == "one":
        y = torch._grouped_mm(x, wt, offs=ends.to(torch.int32).cuda())
    else:
        c0, mid = int(ends[0]), int(ends[3])
        low = torch.where(torch.arange(E) < 4, ends, ends[3]) - c0
        low[0] = 0
        high = torch.where(torch.arange(E) < 4, 0, ends - mid)
        y = torch.cat([F.linear(x[:c0], w[0]),
                       torch._grouped_mm(x[c0:mid], wt, offs=low.to(torch.int32).cuda()),
                       torch._grouped_mm(x[mid:], wt, offs=high.to(torch.int32).cuda())])
    x3 = rand(E, 8, K, seed=32)
    y3 = torch._grouped_mm(x3, wt)
    return {"y": f32(y), "y3": f32(y3), "counts": counts.numpy()}


def case_jax_rows():
    src = np.load(os.environ["MT_NPZ"])
    x = torch.from_numpy(src["x"]).cuda().to(torch.bfloat16)  # BF16 values kept as float32
    w = torch.from_numpy(src["w"]).cuda().to(torch.bfloat16)
    e, c, k = x.shape
    ends = torch.arange(1, e + 1, dtype=torch.int32, device="cuda") * c
    y = torch._grouped_mm(x.reshape(e * c, k), w.transpose(-2, -1), offs=ends)
    return {"y": f32(y)}


CASES = {"hf_train": case_hf_train, "hf_generate": case_hf_generate, "direct": case_direct,
         "bmm": case_bmm, "digest": case_digest, "jax_rows": case_jax_rows}

if __name__ == "__main__":
    case, path = sys.argv[1], sys.argv[2]
    result = CASES[case]()
    torch.cuda.synchronize()
    np.savez(path, **result)
