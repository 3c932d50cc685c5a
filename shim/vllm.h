/* vllm.h — vLLM's Triton MoE kernel, fused_moe_kernel, at the launch door (shim/launch.h).
 *
 * vLLM runs unquantized MoE on Hopper through one Triton kernel launched twice a layer: GEMM1 (the
 * gate and up projections, w13 [E, N, K]) and GEMM2 (the down projection, w2, which multiplies by
 * the router weights). Its launch carries pointers, sizes and strides; what it does with them
 * depends on compile-time constants that are not parameters: top_k (GEMM1 reads activation row
 * id / top_k, GEMM2 row id), MUL_ROUTED_WEIGHT, BLOCK_SIZE_M (which slots a block's expert covers),
 * the element type, and whether the dispatch is vLLM's sorted one (moe_align_block_size: slots of
 * token ids sorted by expert, block_m a block) or its naive one (one (token, expert) pair a
 * block). A function is decoded in two steps, each once, and then routed on every launch:
 *
 *   1. its parameter layout, from the driver (cuFuncGetParamInfo: each parameter's size), matched
 *      against the layouts in the table of shim/vllm.c, which names the vLLM and Triton versions
 *      it was checked against. Triton drops None arguments and integers equal to 1 from a launch,
 *      so the layout also tells which optional pointers are present (the router weights, the
 *      sorted token ids); a layout outside the table passes through ("triton layout");
 *   2. its constants, by running the launched function once, outside any capture, on data of the
 *      shim's own (activations whose row r reads r + 1, a weight that picks that value out, router
 *      weights 2, 3 and 4, token ids 0 .. 255) and reading what it wrote: which rows (block_m),
 *      which value a row got (the row it read: id / top_k; times its weight or not), in which type.
 *      The output must match one hypothesis of the layout exactly, every element, and nothing else
 *      may be written; else the function passes through for good ("triton layout"). The probe
 *      keeps every other parameter in the class Triton compiled it for (divisible by 16 or not),
 *      uses the launch's own scratch pointers, and synchronizes the launch's stream once.
 *
 * SGLang's fused_moe_kernel has the same name and, for a BF16 launch, parameters of the same sizes;
 * its module is told apart by the source file names in the line table Triton emits into the image
 * (mt_vllm_origin), and its launches pass through ("sglang kernel"). Without a line table an
 * SGLang launch fails the probe.
 *
 * A decoded launch becomes a grouped call (shim/call.h: entry MT_FN_vllm_fused_moe, mt_call.moe)
 * that the router and the engine take as any other: the weight B [E, N, K] is the route's N x K
 * weight, kept in the 4.5-bit store; the engine runs vLLM's dispatch on the device (kernels/
 * engine.h, mt_moe_dispatch), so nothing is read back and the call captures in a CUDA graph. The
 * expert count E is not a parameter: the weight's allocation bounds it (mt_vllm_experts).
 */
#ifndef MT_VLLM_H
#define MT_VLLM_H

#include <cuda.h>
#include <stddef.h>

/* Where a module's image says its kernels come from (its line table's file names). */
enum mt_origin { MT_ORIGIN_UNKNOWN, MT_ORIGIN_VLLM, MT_ORIGIN_SGLANG };
enum mt_origin mt_vllm_origin(const void *image, size_t size);

/* 1 for the kernel names the door decodes. */
int mt_vllm_named(const char *name);

/* One function's decoding state (opaque: shim/vllm.c). */
typedef struct mt_vllm_fn mt_vllm_fn;

/* A new state for function f of a module of the given origin; NULL when out of memory. */
mt_vllm_fn *mt_vllm_fn_new(CUfunction f, enum mt_origin origin);

/* One launch as the door sees it (cuLaunchKernel's arguments in the same form): the stream is
 * the per-thread default stream where a _ptsz entry point was called with NULL. */
typedef struct {
  CUfunction f;
  CUlaunchConfig config;
  void **params;
  void **extra;
} mt_launch_args;

/* Route one launch: 1 when the engine ran it (the hook returns CUDA_SUCCESS without launching),
 * 0 when the hook must launch it unchanged (counted, with its reason, where it is not routed). */
int mt_vllm_launch(mt_vllm_fn *v, const mt_launch_args *l);

/* The experts an expert weight at b may hold, slices of slice_bytes: how many whole slices lie
 * between b and the end of its allocation, where the allocation's address range is all mapped
 * (a cuMemAlloc'd block, or a virtual reservation mapped whole); 0 when that cannot be told. */
int mt_vllm_experts(const void *b, size_t slice_bytes);

#endif
