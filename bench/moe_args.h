/* moe_args.h — the grouped GEMM of one weight of a MoE layer as the benches run it: y = x . W_e^T
 * for each expert e's rows, the activations contiguous and sorted by expert (offs: the experts'
 * cumulative row ends, int32 on the device, as torch._grouped_mm takes them), BF16 in and out.
 * Shared by bench_moe.c and moe_torch.c (the library of bench_moe_torch.py, which links no CUDA
 * runtime), so that both benches time the same call. */
#ifndef MT_BENCH_MOE_ARGS_H
#define MT_BENCH_MOE_ARGS_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/engine.h"

static inline mt_grouped_args mtb_layer_args(const mt_wstore *ws, int count, int n, int k,
                                             const int32_t *offs, int m, const void *x, void *y,
                                             void *workspace, size_t workspace_bytes) {
  return (mt_grouped_args){.nseg = count,
                           .n = n,
                           .k = k,
                           .w = ws,
                           .offs = offs,
                           .m = m,
                           .x = x,
                           .ldx = (size_t)k,
                           .xtype = MT_DTYPE_BF16,
                           .y = y,
                           .ldy = (size_t)n,
                           .ytype = MT_DTYPE_BF16,
                           .alpha = 1.0f,
                           .workspace = workspace,
                           .workspace_bytes = workspace_bytes};
}

#endif
