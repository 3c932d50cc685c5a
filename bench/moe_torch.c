/* moe_torch.c — the grouped engine for bench/bench_moe_torch.py, as a shared library its ctypes
 * calls (build/bench/libmt_bench.so, bench-only: the product, libminite.so, exports the hooks and
 * nothing else). Numerics of the nvfp4-row built-in: per-row activation scale, tensor weight scale,
 * 1x16 weight blocks. Each function returns an mt_status (mtb_status names it) or a size. */
#include <stddef.h>
#include <stdint.h>

#include "bench/moe_args.h"
#include "kernels/engine.h"

#define MTB_EXPORT __attribute__((visibility("default")))

static const mt_numerics num = {MT_SCALE_ROW, MT_SCALE_TENSOR, MT_WBLOCK_1X16};

MTB_EXPORT const char *mtb_status(int st) { return mt_status_name((enum mt_status)st); }

/* Bytes of device memory the store of `count` experts of n x k takes (0: a shape it cannot
 * hold). */
MTB_EXPORT size_t mtb_store_bytes(int count, int n, int k) {
  return mt_wstore_bytes(count, n, k, &num);
}

/* Quantize the BF16 expert tensor w (count x n x k, contiguous) into the store at mem. */
MTB_EXPORT int mtb_store_quantize(const void *w, int count, int n, int k, void *mem, void *stream) {
  mt_wstore ws;
  int st = mt_wstore_bind(&ws, count, n, k, &num, mem);
  if (st != MT_OK)
    return st;
  return mt_wstore_quantize(w, MT_DTYPE_BF16, (size_t)k, (size_t)n * k, &ws, stream);
}

MTB_EXPORT size_t mtb_workspace_bytes(int m, int k) {
  return mt_grouped_workspace_bytes(m, k, &num);
}

/* y[m][n] = x[m][k] . W_e^T for the rows of each expert e (offs: count int32 cumulative row ends on
 * the device, as torch._grouped_mm takes them), BF16 in and out, contiguous; one grouped launch
 * after the activations' quantization, on `stream` (legal in graph capture once a first call has
 * loaded the kernels). */
MTB_EXPORT int mtb_grouped(int count, int n, int k, void *mem, const int32_t *offs, int m,
                           const void *x, void *y, void *workspace, size_t workspace_bytes,
                           void *stream) {
  mt_wstore ws;
  int st = mt_wstore_bind(&ws, count, n, k, &num, mem);
  if (st != MT_OK)
    return st;
  mt_grouped_args a = mtb_layer_args(&ws, count, n, k, offs, m, x, y, workspace, workspace_bytes);
  return mt_gemm_grouped(&a, stream);
}

/* Bytes of device memory the dispatch lists of `m` rows over `count` experts take. */
MTB_EXPORT size_t mtb_lists_bytes(int m, int count, int weighted) {
  return mt_moe_lists_bytes(m, count, weighted);
}

/* vLLM's fused-MoE dispatch (kernels/engine.h, mt_moe_dispatch): y row id = x row id / top_k .
 * W_e^T (times weights[id] where given) for each valid slot of sorted (NULL: one pair a block) in
 * the blocks < `blocks` that *padded reaches, e the block's expert; m = the valid ids (vLLM's
 * num_valid_tokens); x rows of k at stride ldx, y rows of n at stride ldy, BF16. One dispatch
 * launch, the activations' quantization and one grouped GEMM launch, as the launch door runs a
 * fused_moe_kernel launch (but the frozen store's refresh). */
MTB_EXPORT int mtb_dispatched(int count, int n, int k, void *mem, const int32_t *sorted,
                              const int32_t *experts, const int32_t *padded, const float *weights,
                              int blocks, int block_m, int top_k, int m, const void *x, int ldx,
                              void *y, int ldy, void *lists, void *workspace,
                              size_t workspace_bytes, void *stream) {
  mt_wstore ws;
  int st = mt_wstore_bind(&ws, count, n, k, &num, mem);
  if (st != MT_OK)
    return st;
  mt_moe_dispatch d = {.sorted = sorted,
                       .experts = experts,
                       .post_padded = padded,
                       .weights = weights,
                       .blocks = blocks,
                       .block_m = block_m,
                       .top_k = top_k,
                       .lists = mt_moe_lists_at(lists, m, count, weights != NULL)};
  mt_grouped_args a =
      mtb_layer_args(&ws, count, n, k, d.lists.offs, m, x, y, workspace, workspace_bytes);
  a.ldx = (size_t)ldx, a.ldy = (size_t)ldy, a.dispatch = &d;
  return mt_gemm_grouped(&a, stream);
}
