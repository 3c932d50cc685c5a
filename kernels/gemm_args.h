/* gemm_args.h — the by-value arguments of the GEMM kernels: kernels/gemm.c fills them, the kernels
 * of kernels/gemm_small.cu and kernels/gemm_large.cu read them (one struct per kernel, passed whole
 * through cuLaunchKernelEx). Plain C, included by both. */
#ifndef MT_GEMM_ARGS_H
#define MT_GEMM_ARGS_H

#include <cuda.h>
#include <stdint.h>

#include "kernels/hostdev.h"

/* The epilogue, shared by every path so that a row's bits never depend on the path:
 *   y[i][j] = RNE_out((acc * ((1/S_a[i]) * (1/S_w[j]))) * alpha + beta * c[i][j] + bias[j])
 * each operation rounded to FP32 in this order; c is not read when beta == 0 (then c == NULL). */
typedef struct {
  int m, n, k;
  const float *sa; /* S_a: m floats when sa_row, else 1 */
  const float *sw; /* S_w: n floats when sw_row, else 1 */
  int sa_row, sw_row;
  void *y;
  long long ldy;
  const void *c;
  long long ldc;
  const void *bias;
  int ytype, biastype; /* enum mt_dtype */
  float alpha, beta;
} mt_epilogue_args;

/* Large M: TMA maps of the BF16 dequantized operands (128B swizzle, boxes of 64 along K). */
typedef struct {
  CUtensorMap ta;      /* activations [m][k], box 64 x (the tile's rows): the bands but the last */
  CUtensorMap ta_last; /* the same, box 64 x last_rows rows: the last band */
  CUtensorMap tw;      /* weight [n][k], box 64 x BN rows */
  /* (mt_gemm_large_m64p_nBN: ta, ta_last and tw of rank 3, 64 columns by the rows by k / 64
   * blocks 128 bytes apart, a box two blocks deep: one box a stage and operand) */
  CUtensorMap ty; /* output [m][n] (the TMA-store kernels only), box 64 x 64 rows */
  mt_epilogue_args e;
  /* Rows of ta_last's box: the last band's rows rounded up to 8, so that a stage's activation
   * load does not zero-fill the rows no token has (the rows past it keep stale shared memory; row
   * i of the output reads row i of A alone, and rows past m are never stored). */
  int last_rows;
} mt_large_args;

/* The few-token kernel mt_gemm_small_q4: the weight in fragment order and the raw activations,
 * which the kernel quantizes itself (so e.sa is not read). */
typedef struct {
  const uint8_t *frag; /* mt_qweight.frag */
  mt_epilogue_args e;
  const void *x; /* [m][k] BF16 or FP16 activations, row stride ldx elements */
  long long ldx;
  int xfp16;
} mt_small_args;

/* Repacking a quantized weight into fragment order. */
typedef struct {
  const uint8_t *codes;  /* [n][k/2] */
  const uint8_t *scales; /* [n][k/16] */
  uint8_t *frag;
  const uint32_t *only_if; /* NULL, or a device word: nothing to do when it reads 0 */
  int n, k;
} mt_pack_args;

/* Tiles and shared memory of the kernels, one definition for the launcher and the kernels.
 * Large M: 128 tokens x BN channels, K in steps of 64 (one 128-byte swizzle span of BF16), a ring
 * of stages sized to fill ~200 KB. Small M: 2 warps x 8 channels, stages of 512 columns. */
#define MT_LARGE_BM 128
#define MT_LARGE_BK 64
#define MT_LARGE_STAGES(bn)                                                                        \
  ((bn) == 256 ? 4 : (bn) == 192 ? 5 : (bn) == 128 ? 6 : (bn) == 96 ? 7 : 8)
#define MT_LARGE_STAGE_BYTES(bn) (MT_LARGE_BM * MT_LARGE_BK * 2 + (bn)*MT_LARGE_BK * 2)
/* stages, their two barriers, and per consumer warpgroup 1/S_w and bias of BN columns (floats) */
#define MT_LARGE_SMEM(bn)                                                                          \
  (1024 + MT_LARGE_STAGES(bn) * (MT_LARGE_STAGE_BYTES(bn) + 16) + 2 * 2 * (bn)*4)
/* Tiles of 64 tokens (mt_gemm_large_m64_nBN, BN 32 to 64: one consumer warpgroup), for calls
 * whose 128-token tiles leave SMs idle: stages of two 64-wide K blocks (MT_LARGE_KS_64: the two A
 * blocks, then the two weight blocks), as many as fill ~192 KB, at most 16. */
#define MT_LARGE_KS_64 2
#define MT_LARGE_STAGE_BYTES_64(bn) (MT_LARGE_KS_64 * (64 + (bn)) * MT_LARGE_BK * 2)
#define MT_LARGE_STAGES_64(bn)                                                                     \
  (196608 / MT_LARGE_STAGE_BYTES_64(bn) < 16 ? 196608 / MT_LARGE_STAGE_BYTES_64(bn) : 16)
/* Whether they load a stage's blocks of an operand in one box (mt_gemm_large_m64p_nBN, rank-3
 * maps): k % 64 == 0 and more stages than the ring holds (kernels/gemm.c: mt_gemm_kpair). */
#define MT_LARGE_KPAIR_64(k, bn)                                                                   \
  ((k) % 64 == 0 && ((k) / 64 + MT_LARGE_KS_64 - 1) / MT_LARGE_KS_64 > MT_LARGE_STAGES_64(bn))
/* ... then the columns' 1/S_w and bias, and the epilogue's row scales and their two mbarriers
 * (scales64 in gemm_large.cu: 16 + 4 + 64 x 4 bytes, rounded up) */
#define MT_LARGE_SMEM_64(bn)                                                                       \
  (1024 + MT_LARGE_STAGES_64(bn) * (MT_LARGE_STAGE_BYTES_64(bn) + 16) + 2 * (bn)*4 + 280)
/* The TMA-store kernels: one stage fewer, then a 1024-aligned staging tile of 128 x bn outputs. */
#define MT_LARGE_STAGES_TS(bn) (MT_LARGE_STAGES(bn) - 1)
#define MT_LARGE_SMEM_TS(bn)                                                                       \
  (1024 + MT_LARGE_STAGES_TS(bn) * (MT_LARGE_STAGE_BYTES(bn) + 16) + 2 * 2 * (bn)*4 + 1024 +       \
   128 * (bn)*2)
#define MT_SMALL_WARPS 2 /* one CTA per 16 output channels, 8 per warp */
#define MT_SMALL_KC 512  /* columns per stage: 4 chunk turns (barrier, requests) for k = 2048 */
#define MT_SMALL_WBYTES (MT_SMALL_WARPS * (MT_SMALL_KC / 32) * MT_FRAG_REC)
/* A stage of the ring and one record after it that nothing writes: the step loop's look-ahead past
 * a stage's last record reads it, not the next stage, which cp.async may be filling meanwhile */
#define MT_SMALL_WSTAGE (MT_SMALL_WBYTES + MT_FRAG_REC)
#define MT_SMALL_PITCH (MT_SMALL_KC * 2 + 16) /* 16 extra bytes spread 8 tokens over all banks */
/* the step loop loads a record (two steps) ahead without a bound check: slack past the end */
#define MT_SMALL_SLACK 256
/* The fused kernel (activation quantization inside, m <= MT_SMALL_FUSE_M): the weight ring, one
 * zero A row, per-row S and amax (64 bytes), and the whole quantized activations, m rows of 2k + 16
 * bytes, in MT_SMALL_FUSE_XHAT bytes (4 rows of k = 4096; 1 row of k = 16384). One fixed size, so
 * the function's shared-memory limit is set once. */
#define MT_SMALL_FUSE_M 4
#define MT_SMALL_FUSE_STAGES 4
#define MT_SMALL_FUSE_META (MT_SMALL_PITCH + 64)
#define MT_SMALL_FUSE_XHAT (4 * (2 * 4096 + 16))
#define MT_SMALL_FUSE_SMEM                                                                         \
  (MT_SMALL_FUSE_STAGES * MT_SMALL_WSTAGE + MT_SMALL_FUSE_META + MT_SMALL_FUSE_XHAT +              \
   MT_SMALL_SLACK)

/* Fragment order (mt_qweight.frag), for n % 16 == 0: records of 8 rows H (8H .. 8H+7) x 32
 * columns P (two k16 steps), record (H, P) at byte (H * ceil(k/32) + P) * 160, so a warp's rows
 * are contiguous over K. A record: 128 code bytes, lane l = 4g + q of the warp owning bytes
 * 4l..4l+3 in the order of mma.sync's B registers: code byte q of row 8H+g's block 2P (elements
 * 2q, 2q+1), its byte q+4 (2q+8, 2q+9), then the same two of block 2P+1; then 32 scale bytes, 4
 * per g: row 8H+g's block scales 2P and 2P+1 as BF16 (exact; one byte more per 16 elements than
 * E4M3, so no conversion in the GEMM). Blocks past k are zero. 5 bits per weight. */
#define MT_FRAG_REC 160
#define MT_FRAG_BYTES(n, k) ((size_t)(n) / 8 * (((size_t)(k) + 31) / 32) * MT_FRAG_REC)

/* Rows as records (written by the quantization kernels' record mode, mt_quant_params.records): the
 * record above with tokens as its rows
 * (lane l = 4g + q: code bytes q and q+4 of token 8H+g's blocks 2P and 2P+1, then the 8 tokens'
 * BF16 scale pairs), arranged by bands of 128 tokens so that one stage of the large kernel (128
 * tokens x 64 columns: 16 row groups x 2 records) is 32 contiguous records, 5120 bytes, one bulk
 * copy: record (H, P) at ((H / 16 * MT_ACT_PAIRS(k) + P) * 16 + H % 16) * 160. Pairs run to a
 * whole 64 columns and tokens to a whole band: those past k or m are zero records (written). */
#define MT_ACT_PAIRS(k) (2 * (((size_t)(k) + 63) / 64))
#define MT_ACT_BAND 128
#define MT_ACT_REC_BYTES(m, k)                                                                     \
  (((size_t)(m) + MT_ACT_BAND - 1) / MT_ACT_BAND * (MT_ACT_BAND / 8) * MT_ACT_PAIRS(k) *           \
   MT_FRAG_REC)

/* The grouped GEMM (kernels/grouped.cu, launched by kernels/grouped.c): segments seg0 .. seg0 +
 * nseg - 1 of a grouped problem, each y_s = x_s . W_s^T with the epilogue of mt_epilogue_args. At
 * most MT_GROUPED_MAX_SEG segments a launch (the kernel's tile table); the launcher splits larger
 * problems. */
#define MT_GROUPED_MAX_SEG 512
/* Tiles of 128 channels x BN tokens (8 to 256). A stage: MT_GROUPED_KS 64-wide K blocks, each an
 * activation box of BN rows x 128 bytes (1024-aligned for the swizzle) and the tile's 4608 bytes of
 * weight records; then the ring's barriers and the tile table (16 bytes, then
 * 4 x MT_GROUPED_MAX_SEG + 1 ints). Up to 32 tokens two CTAs share an SM (the weight decode runs on
 * the consumer warps' ALUs, and four warps a scheduler hide its latencies better than two), each
 * with stages filling ~96 KB; from 64 one CTA an SM with ~200 KB; at most 16 stages. */
#define MT_GROUPED_KS(bn) ((bn) <= 64 ? 2 : 1)
#define MT_GROUPED_CTAS(bn) ((bn) <= 32 ? 2 : 1)
/* The n256 kernel has one wgmma width (kernels/grouped.cu, narrowest), so a segment's last tile of
 * a few rows would cost a whole tile's tensor time: its launch leaves a last tile of fewer than
 * MT_GROUPED_TAIL rows to a second launch of the n(MT_GROUPED_TAIL_BN) kernel (mt_grouped_kargs,
 * split). */
#define MT_GROUPED_SPLITS(bn) ((bn) == 256)
#define MT_GROUPED_TAIL 64
#define MT_GROUPED_TAIL_BN 32
#define MT_GROUPED_REC_BLOCK 4608
#define MT_GROUPED_SB(bn)                                                                          \
  ((MT_GROUPED_KS(bn) * ((bn)*128 + MT_GROUPED_REC_BLOCK) + 1023) / 1024 * 1024)
#define MT_GROUPED_RING(bn) (MT_GROUPED_CTAS(bn) == 2 ? 98304 : 204800)
#define MT_GROUPED_STAGES(bn)                                                                      \
  (MT_GROUPED_RING(bn) / MT_GROUPED_SB(bn) < 16 ? MT_GROUPED_RING(bn) / MT_GROUPED_SB(bn) : 16)
#define MT_GROUPED_SMEM(bn)                                                                        \
  (1024 + MT_GROUPED_STAGES(bn) * (MT_GROUPED_SB(bn) + 16) + 16 + (4 * MT_GROUPED_MAX_SEG + 1) * 4)
typedef struct {
  CUtensorMap ta;     /* xhat [m][k] BF16, box 64 columns x BN rows (kpair: rank 3, 64 x m x k / 64,
                             a box two blocks deep) */
  const uint8_t *ws;  /* the weight store (kernels/wstore.h): slice g at ws + g * ws_slice */
  long long ws_slice; /* bytes of a slice */
  long long ws_band;  /* bytes of a band's records: MT_WS_BAND_BYTES(k) */
  long long ws_outer; /* a slice's S from its start */
  const uint32_t *gen; /* NULL, or the generation word of the call's refresh (kernels/wcheck.h) */
  /* NULL, or the count of the call's activations' quantizer's running CTAs (mt_wcheck_head.acts),
   * for the first launch after the call's refresh: it reads the activations once the count is 0
   * and waits for the grid before it (the refresh) only before it ends */
  const uint32_t *acts;
  const int32_t
      *offs; /* device: cumulative row ends of the segments (segment g: offs[g-1] .. offs[g],
                             offs[-1] = 0), or NULL: seg_rows rows each, segment g at row
                             g * seg_rows */
  int seg0, nseg, seg_rows;
  int m, n, k;        /* m: rows of xhat (bounds offs) */
  const float *sa;    /* S_a: per row of xhat, or one */
  int sa_row, sw_row; /* S_w: per channel of a slice, or one a slice */
  void *y;            /* segment g's token r: y + g * stride_y + (offs ? offs[g-1] + r : r) * ldy */
  long long ldy, stride_y;
  const void *c; /* beta's operand, laid out as y (NULL when beta == 0) */
  long long ldc, stride_c;
  /* NULL, or device arrays of each segment's own output (and C): segment g's token r at
   * y_ptrs[g] + r * ldy (c_ptrs[g] + r * ldc), whatever offs says; y (c) is then not used */
  void *const *y_ptrs;
  const void *const *c_ptrs;
  const void *bias; /* [n] a segment, stride_bias elements apart, or NULL */
  long long stride_bias;
  int ytype, biastype; /* enum mt_dtype */
  float alpha, beta;
  /* NULL, or (vLLM's dispatch, mt_moe_dispatch_args) the output row of each row of xhat: row r's
   * outputs go to y + y_rows[r] * ldy, not to row r (offs still says which segment r is in) */
  const int32_t *y_rows;
  /* NULL, or with y_rows each row's router weight: the row's outputs, rounded to y's type as any
   * row's, times it in FP32, rounded again (the expert's row is the unweighted one's bits) */
  const float *row_w;
  int kpair; /* ta is of rank 3 */
  /* Which tiles of each segment this launch runs: 0 all; 1 all but a last tile of fewer than
   * MT_GROUPED_TAIL rows (tiles of split_bn rows from the segment's first); 2 only that last tile's
   * rows (MT_GROUPED_SPLITS) */
  int split, split_bn;
} mt_grouped_kargs;

/* Segment g's rows under offs (offs[g-1] .. offs[g], offs[-1] = 0) clamped into [0, m], so that a
 * bad table computes nothing out of bounds: the one reading of a table that the grouped GEMM and
 * the frozen check (kernels/wcheck.cu: which slices a call uses) share. mt_offs_clamp takes the two
 * ends already read (the grouped GEMM reads many segments' ends before it uses any). */
MT_HD void mt_offs_clamp(int lo, int hi, int m, int *start, int *rows) {
  lo = lo < 0 ? 0 : lo > m ? m : lo;
  hi = hi < lo ? lo : hi > m ? m : hi;
  *start = lo;
  *rows = hi - lo;
}
MT_HD void mt_offs_span(const int32_t *offs, int g, int m, int *start, int *rows) {
  mt_offs_clamp(g > 0 ? offs[g - 1] : 0, offs[g], m, start, rows);
}

/* The tokens first .. end - 1 of a segment of `rows` that a grouped launch runs (mt_grouped_kargs,
 * split): all of them; all but a last tile of split_bn of fewer than MT_GROUPED_TAIL rows; or only
 * that tile's. The kernel's tile table and the tests' fake GPU read a split alike. */
MT_HD void mt_grouped_part(int rows, int split, int split_bn, int *first, int *end) {
  const int tail = split ? rows % split_bn : 0, cut = tail < MT_GROUPED_TAIL ? tail : 0;
  *first = split == 2 ? rows - cut : 0;
  *end = split == 1 ? rows - cut : rows;
}

/* mt_moe_dispatch (kernels/grouped.cu): vLLM's fused-MoE dispatch (vllm/model_executor/layers/
 * fused_moe: moe_align_block_size's sorted token ids, block_m slots a block and one expert a
 * block; or, naive, one (token, expert) pair a block) turned into the grouped GEMM's segments and
 * row lists, by one CTA: the slots of the blocks the Triton kernel would run (block b with
 * b < blocks and b * block_m < *post_padded) whose id is valid (0 <= id < valid) and whose
 * expert e is in [0, nseg), by expert: offs[e] (cumulative ends), src[r] = id / top_k (the
 * activation row), dst[r] = id (the output row), and with weights, w[r] = weights[id]. Rows past
 * the last segment's end (to valid) get src = src[0], dst = -1. A valid slot of a block of
 * expert -1 (not on this rank) has its output row zeroed, as the Triton kernel does. */
#define MT_MOE_MAX_EXPERTS 1024
#define MT_MOE_THREADS 1024
typedef struct {
  const int32_t *sorted;      /* [blocks * block_m] slots' token ids, or NULL: naive */
  const int32_t *experts;     /* [blocks] each block's expert */
  const int32_t *post_padded; /* device word: slots in use */
  const float *weights;       /* [valid] router weights by id, or NULL */
  int32_t blocks, block_m, top_k, valid, nseg;
  int32_t *offs, *src, *dst; /* out: [nseg], [valid], [valid] */
  float *w;                  /* out: [valid], or NULL (no weights) */
  void *y;                   /* the output, for the rows of expert -1: n elements of 2 bytes */
  long long ldy;
  int32_t n, pad;
} mt_moe_dispatch_args;

/* mt_seg_ends (kernels/grouped.cu): the segments' cumulative row ends from counts the host knows,
 * carried in the kernel's parameters (so the table is written inside a graph capture without a
 * host copy): runs j = 0 .. nruns-1 of size[j] segments of rows[j] rows each, written from
 * offs[seg0] on, the first segment starting at row row0. */
#define MT_SEG_ENDS_RUNS 96
typedef struct {
  int32_t *offs;
  int32_t seg0, row0, nruns;
  int32_t size[MT_SEG_ENDS_RUNS], rows[MT_SEG_ENDS_RUNS];
} mt_seg_ends_args;

#endif
