/* gemm_args.h — the by-value arguments of the GEMM kernel (kernels/grouped.cu, passed whole through
 * cuLaunchKernelEx; kernels/grouped.c fills them) and its tile and shared-memory sizes. Plain C,
 * included by both. */
#ifndef MT_GEMM_ARGS_H
#define MT_GEMM_ARGS_H

#include <cuda.h>
#include <stdint.h>

/* The grouped GEMM (kernels/grouped.cu, launched by kernels/grouped.c): segments seg0 .. seg0 +
 * nseg - 1 of a grouped problem, each y_s = x_s . W_s^T with the epilogue
 *   y[i][j] = RNE_out((acc * ((1/S_a[i]) * (1/S_w[j]))) * alpha + beta * c[i][j] + bias[j])
 * each operation rounded to FP32 in this order; c is not read when beta == 0 (then c == NULL). At
 * most MT_GROUPED_MAX_SEG segments a launch (the kernel's tile table); the launcher splits larger
 * problems. */
#define MT_GROUPED_MAX_SEG 512
/* Tiles of 128 channels x BN tokens (8 to 256), or of 64 channels (BN <= 32: the _c64 kernels,
 * one consumer warpgroup, for grids that would leave SMs idle; they use half of each stage's
 * records). A stage: MT_GROUPED_KS 64-wide K blocks, each an activation box of BN rows x 128 bytes
 * (1024-aligned for the swizzle) and the tile's 4608 (or 2304) bytes of weight records; then the ring's barriers and the tile table (3 x MT_GROUPED_MAX_SEG + 1 ints).
 * Up to 32 tokens two CTAs share an SM (the weight decode runs on the consumer warps' ALUs, and
 * four warps a scheduler hide its latencies better than two), each with stages filling ~96 KB;
 * from 64 one CTA an SM with ~200 KB; at most 16 stages. */
#define MT_GROUPED_KS(bn) ((bn) <= 64 ? 2 : 1)
#define MT_GROUPED_CTAS(bn) ((bn) <= 32 ? 2 : 1)
#define MT_GROUPED_REC_BLOCK 4608
#define MT_GROUPED_SB(bn) ((MT_GROUPED_KS(bn) * ((bn)*128 + MT_GROUPED_REC_BLOCK) + 1023) / 1024 * 1024)
#define MT_GROUPED_RING(bn) (MT_GROUPED_CTAS(bn) == 2 ? 98304 : 204800)
#define MT_GROUPED_STAGES(bn)                                                                                          \
  (MT_GROUPED_RING(bn) / MT_GROUPED_SB(bn) < 16 ? MT_GROUPED_RING(bn) / MT_GROUPED_SB(bn) : 16)
#define MT_GROUPED_SMEM(bn) (1024 + MT_GROUPED_STAGES(bn) * (MT_GROUPED_SB(bn) + 16) + (3 * MT_GROUPED_MAX_SEG + 1) * 4)
typedef struct {
  CUtensorMap ta;      /* xhat [m][k] BF16, box 64 columns x BN rows (kpair: rank 3, 64 x m x k / 64,
                             a box two blocks deep) */
  const uint8_t *ws;   /* the weight store (kernels/wstore.h): slice g at ws + g * ws_slice */
  long long ws_slice;  /* bytes of a slice */
  long long ws_band;   /* bytes of a band's records: MT_WS_BAND_BYTES(k) */
  long long ws_outer;  /* a slice's S from its start */
  const int32_t *offs; /* device: cumulative row ends of the segments (segment g: offs[g-1] .. offs[g],
                             offs[-1] = 0), or NULL: seg_rows rows each, segment g at row g * seg_rows */
  int seg0, nseg, seg_rows;
  int m, n, k;        /* m: rows of xhat (bounds offs) */
  const float *sa;    /* S_a: per row of xhat, or one */
  int sa_row, sw_row; /* S_w: per channel of a slice, or one a slice */
  void *y;            /* segment g's token r: y + g * stride_y + (offs ? offs[g-1] + r : r) * ldy */
  long long ldy, stride_y;
  const void *c; /* beta's operand, laid out as y (NULL when beta == 0) */
  long long ldc, stride_c;
  const void *bias; /* [n] a segment, stride_bias elements apart, or NULL */
  long long stride_bias;
  int ytype, biastype; /* enum mt_dtype */
  float alpha, beta;
  int kpair; /* ta is of rank 3 */
} mt_grouped_kargs;

#endif
