/* gemm_args.h — the by-value arguments of the GEMM kernels: kernels/gemm.c fills them, the kernels
 * of kernels/gemm_small.cu and kernels/gemm_large.cu read them (one struct per kernel, passed whole through cuLaunchKernelEx).
 * Plain C, included by both. */
#ifndef MT_GEMM_ARGS_H
#define MT_GEMM_ARGS_H

#include <cuda.h>
#include <stdint.h>

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
  CUtensorMap ta; /* activations [m][k], box 64 x 128 rows */
  CUtensorMap tw; /* weight [n][k], box 64 x BN rows */
  mt_epilogue_args e;
} mt_large_args;

/* Small M: the weight in fragment order, the activations read directly. */
typedef struct {
  const uint16_t *xa;   /* [m][k] BF16 dequantized activations, row stride k */
  const uint8_t *frag;  /* mt_qweight.frag */
  mt_epilogue_args e;
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
 * of stages sized to fill ~200 KB. Small M: 4 warps x 16 channels, stages of 256 columns. */
#define MT_LARGE_BM 128
#define MT_LARGE_BK 64
#define MT_LARGE_STAGES(bn) ((bn) == 256 ? 4 : (bn) == 192 ? 5 : 6)
#define MT_LARGE_STAGE_BYTES(bn) (MT_LARGE_BM * MT_LARGE_BK * 2 + (bn) * MT_LARGE_BK * 2)
/* stages, their two barriers, and per consumer warpgroup 1/S_w and bias of BN columns (floats) */
#define MT_LARGE_SMEM(bn) (1024 + MT_LARGE_STAGES(bn) * (MT_LARGE_STAGE_BYTES(bn) + 16) + 2 * 2 * (bn)*4)
#define MT_SMALL_GROUPS 4 /* groups of 16 output channels per CTA */
#define MT_SMALL_WARPS 8  /* two per group: one for each 8 rows */
#define MT_SMALL_KC 256
#define MT_SMALL_STAGES(nt) ((nt) <= 2 ? 8 : (nt) == 4 ? 6 : 4) /* deep: few SMs stream the weight */
#define MT_SMALL_CODES (MT_SMALL_GROUPS * (MT_SMALL_KC / 64) * 512)
#define MT_SMALL_SCALES (MT_SMALL_GROUPS * (MT_SMALL_KC / 128) * 128)
#define MT_SMALL_PITCH (MT_SMALL_KC * 2 + 16) /* 16 extra bytes spread 8 tokens over all banks */
#define MT_SMALL_STAGE_BYTES(nt) (MT_SMALL_CODES + MT_SMALL_SCALES + (nt) * 8 * MT_SMALL_PITCH)
#define MT_SMALL_SMEM(nt) (MT_SMALL_STAGES(nt) * MT_SMALL_STAGE_BYTES(nt))

/* Fragment order (mt_qweight.frag), for n % 16 == 0. Codes: for each group of 16 rows R and 64
 * columns S, 512 bytes: lane l = 4g + q of the warp owns bytes 16l..16l+15, four per k16 step s,
 * in the order of mma.sync's A registers: code bytes q of rows 16R+g and 16R+g+8, then bytes q+4
 * of the same rows (byte q of a 16-block holds elements 2q and 2q+1). Scales: for each R and 128
 * columns, 128 bytes: 16 per g, the 8 scales of row 16R+g then the 8 of row 16R+g+8. Blocks past
 * k are zero. */
#define MT_FRAG_CODES_BYTES(n, k) ((size_t)(n) / 16 * (((size_t)(k) + 63) / 64) * 512)
#define MT_FRAG_SCALES_BYTES(n, k) ((size_t)(n) / 16 * (((size_t)(k) + 127) / 128) * 128)

#endif
