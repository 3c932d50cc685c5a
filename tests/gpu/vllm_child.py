"""vllm_child.py CASE OUT — one workload of tests/gpu/test_vllm_moe.py in a process of its own (the
parent sets LD_PRELOAD and the MINITE_* variables). Writes OUT.npz with what the parent compares.
Nothing here knows whether libminite.so is preloaded. Not a test by itself.

A small MoE layer (64 experts, top-4, hidden 512, width 128: w13 [64, 256, 512] and w2 [64, 512,
128], the routes 256x512 and 512x128) at 1, 3, 40 and 300 tokens (vLLM's naive dispatch at 1 and
3: num_tokens * top_k * 4 <= experts), each GEMM launched by vLLM's own launcher,
invoke_fused_moe_triton_kernel, with vLLM's config for the shape (get_default_config: no tuned file
has these shapes), on a dispatch built as vLLM's moe_align_block_size builds it:

  vllm      GEMM1 as TritonExperts launches it (no router weights) and again as fused_experts()
            does (router weights given, not multiplied), GEMM2 with the router weights
            multiplied, on SiLU(gate) * up of GEMM1's output; every output, the inputs, and the
            same layer's launches captured in a CUDA graph and replayed on new activations
  learner   the same rows through torch._grouped_mm (HF transformers' grouped_mm experts): each
            (token, expert) pair's row sorted by expert, GEMM1 on the token's activations, GEMM2
            on the vllm case's GEMM2 input (MT_GEMM2_FROM: its npz), so that both compute from the
            same bits
  old       vLLM 0.8.5's fused_moe_kernel (before b_bias joined its parameters), launched with its
            own argument list: a layout outside the launch door's table
  sglang    SGLang's fused_moe_kernel (the same name, its own parameters), launched likewise
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_sources  # noqa: E402
from shim_child import child_main, f32, rand  # noqa: E402

E, TOPK, H, I = 64, 4, 512, 128
TOKENS = (1, 3, 40, 300)


def routing(tokens, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.stack([torch.randperm(E, generator=g)[:TOPK]
                       for _ in range(tokens)]).to(torch.int32)
    w = torch.rand(tokens, TOPK, generator=g) + 0.0625
    return ids.cuda(), (w / w.sum(1, keepdim=True)).cuda()


def weights():
    return rand(E, 2 * I, H, seed=40) * 0.1, rand(E, H, I, seed=41) * 0.1


def dispatch(fm, ids, tokens, w13, w2):
    """vLLM's config for these shapes and its dispatch, naive where vLLM takes it."""
    config = fm.try_get_optimal_moe_config(w13.size(), w2.size(), TOPK, None, tokens)
    return (config,) + vllm_sources.dispatch(ids, config["BLOCK_SIZE_M"], E)


def layer(fm, x, w13, w2, ids, topk_w, config, sorted_ids, expert_ids, padded, out):
    """GEMM1 (TritonExperts: no router weights), its activation, GEMM2 (router weights
    multiplied); the outputs into out's tensors."""
    vllm_sources.invoke(fm, x, w13, out["c1"], None, sorted_ids, expert_ids, padded, False, TOPK,
                        config)
    gate, up = out["c1"].view(-1, 2 * I).chunk(2, dim=-1)
    out["a2"].copy_(F.silu(gate) * up)
    vllm_sources.invoke(fm, out["a2"], w2, out["c2"], topk_w, sorted_ids, expert_ids, padded, True,
                        1, config)


def case_vllm():
    fm = vllm_sources.vllm()
    w13, w2 = weights()
    result = {}
    for t in TOKENS:
        x, (ids, topk_w) = rand(t, H, seed=50 + t), routing(t, 60 + t)
        config, sorted_ids, expert_ids, padded = dispatch(fm, ids, t, w13, w2)
        out = {"c1": torch.full((t, TOPK, 2 * I), float("nan"), dtype=torch.bfloat16,
                                device="cuda"),
               "a2": torch.empty(t * TOPK, I, dtype=torch.bfloat16, device="cuda"),
               "c2": torch.full((t, TOPK, H), float("nan"), dtype=torch.bfloat16, device="cuda")}
        layer(fm, x, w13, w2, ids, topk_w, config, sorted_ids, expert_ids, padded, out)
        c1w = torch.full_like(out["c1"], float("nan"))
        vllm_sources.invoke(fm, x, w13, c1w, topk_w, sorted_ids, expert_ids, padded, False, TOPK,
                            config)
        # the layer captured (warmed up eagerly just above), replayed on new activations
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        xs = x.clone()
        gout = {k: torch.empty_like(v) for k, v in out.items()}
        with torch.cuda.stream(s):
            layer(fm, xs, w13, w2, ids, topk_w, config, sorted_ids, expert_ids, padded, gout)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(graph, stream=s):
            layer(fm, xs, w13, w2, ids, topk_w, config, sorted_ids, expert_ids, padded, gout)
        x2 = rand(t, H, seed=70 + t)
        xs.copy_(x2)
        graph.replay()
        eager = {k: torch.empty_like(v) for k, v in out.items()}
        layer(fm, x2, w13, w2, ids, topk_w, config, sorted_ids, expert_ids, padded, eager)
        torch.cuda.synchronize()
        result.update({f"x{t}": f32(x), f"ids{t}": ids.cpu().numpy(),
                       f"w{t}": topk_w.float().cpu().numpy(),
                       f"c1_{t}": f32(out["c1"]), f"c1w_{t}": f32(c1w), f"a2_{t}": f32(out["a2"]),
                       f"c2_{t}": f32(out["c2"]), f"replay_c2_{t}": f32(gout["c2"]),
                       f"eager_c2_{t}": f32(eager["c2"]), f"replay_c1_{t}": f32(gout["c1"]),
                       f"eager_c1_{t}": f32(eager["c1"]),
                       f"block_m{t}": np.array(config["BLOCK_SIZE_M"]),
                       f"naive{t}": np.array(sorted_ids is None)})
    result["w13"], result["w2"] = f32(w13), f32(w2)
    return result


def case_learner():
    """HF's grouped_mm experts' GEMMs on the same pairs: rows sorted by expert, offsets."""
    w13, w2 = weights()
    other = np.load(os.environ["MT_GEMM2_FROM"])
    result = {}
    for t in TOKENS:
        x, (ids, _) = rand(t, H, seed=50 + t), routing(t, 60 + t)
        flat = ids.flatten().to(torch.int64)
        order = torch.argsort(flat, stable=True)
        offs = torch.cumsum(torch.bincount(flat, minlength=E), 0).to(torch.int32)
        y1 = torch._grouped_mm(x[order // TOPK], w13.transpose(-2, -1), offs=offs)
        a2 = torch.from_numpy(other[f"a2_{t}"]).to("cuda", torch.bfloat16)
        y2 = torch._grouped_mm(a2[order], w2.transpose(-2, -1), offs=offs)
        r1, r2 = torch.empty_like(y1), torch.empty_like(y2)
        r1[order], r2[order] = y1, y2  # back to pair order: row id = token * top_k + j
        result[f"y1_{t}"], result[f"y2_{t}"] = f32(r1), f32(r2)
    return result


def old_or_sglang(kernel, launch):
    """One GEMM1 of each size through `kernel` launched by `launch`, outputs by T."""
    w13, w2 = weights()
    result = {}
    for t in TOKENS[2:]:
        x, (ids, _) = rand(t, H, seed=50 + t), routing(t, 60 + t)
        sorted_ids, expert_ids, padded = vllm_sources.moe_align(ids, 16, E)
        c = torch.full((t, TOPK, 2 * I), float("nan"), dtype=torch.bfloat16, device="cuda")
        launch(kernel, x, w13, c, sorted_ids, expert_ids, padded, t * TOPK)
        result[f"c1_{t}"] = f32(c)
    return result


def launch_old(kernel, a, b, c, sorted_ids, expert_ids, padded, valid):
    import triton
    import triton.language as tl
    em, n = sorted_ids.numel(), b.size(1)
    grid = (triton.cdiv(em, 16) * triton.cdiv(n, 64),)
    kernel[grid](a, b, c, None, None, None, sorted_ids, expert_ids, padded, n, b.size(2), em, valid,
                 a.stride(0), a.stride(1), b.stride(0), b.stride(2), b.stride(1), c.stride(1),
                 c.stride(2), 0, 0, 0, 0, 0, 0, 0, BLOCK_SIZE_M=16, BLOCK_SIZE_N=64,
                 BLOCK_SIZE_K=64, GROUP_SIZE_M=1,
                 MUL_ROUTED_WEIGHT=False, top_k=TOPK, compute_type=tl.bfloat16, use_fp8_w8a8=False,
                 use_int8_w8a8=False, use_int8_w8a16=False, per_channel_quant=False)


def launch_sglang(kernel, a, b, c, sorted_ids, expert_ids, padded, valid):
    import triton
    import triton.language as tl
    em, n = sorted_ids.numel(), b.size(1)
    grid = (triton.cdiv(em, 16) * triton.cdiv(n, 64),)
    kernel[grid](a, None, b, None, None, c, None, None, None, sorted_ids, expert_ids, padded, None,
                 n, b.size(2), em, valid, a.stride(0), a.stride(1), b.stride(0), b.stride(2),
                 b.stride(1), 0, 0, c.stride(1), c.stride(2), 0, 0, 0, 0, 0, 0, 0, BLOCK_SIZE_M=16,
                 BLOCK_SIZE_N=64, BLOCK_SIZE_K=64,
                 GROUP_SIZE_M=1, MUL_ROUTED_WEIGHT=False, top_k=TOPK, compute_type=tl.bfloat16,
                 use_fp8_w8a8=False, use_int8_w8a8=False, use_int8_w8a16=False,
                 per_channel_quant=False, even_Ks=True, c_sorted=False, swap_ab=False,
                 FUSE_ADD_TO_OUTPUT=False, MASK_OUTPUT=False, FUSE_SUM_ALL_REDUCE=False,
                 ROUTER_TOPK=TOPK)


def case_old():
    return old_or_sglang(vllm_sources.vllm(vllm_sources.VLLM_OLD).fused_moe_kernel, launch_old)


def case_sglang():
    return old_or_sglang(vllm_sources.sglang().fused_moe_kernel, launch_sglang)


if __name__ == "__main__":
    child_main({"vllm": case_vllm, "learner": case_learner, "old": case_old, "sglang": case_sglang})
