/* nvfp4.h — the CPU reference of the spec's numerics: the executable definition of NVFP4.
 *
 * The GPU kernels are tested against this code: codes, block scales and outer scales bit for bit,
 * GEMM results within FP32-accumulation error of mt_ref_gemm (which accumulates in double). It
 * favours clarity over speed. The order of FP32 operations follows Transformer Engine; see
 * docs/numerics.md, "Quantization, step by step", and the comments in nvfp4.c.
 *
 * Layout of a quantized matrix of `rows` x `cols` (cols = K, a multiple of 16), row-major:
 *   codes  rows * cols/2 bytes; element 2i of a row in the low nibble of byte i, 2i+1 in the high;
 *          a code is sign(bit 3) | E2M1 magnitude (bits 0-2)
 *   scales rows * cols/16 E4M3 bytes; scale of row r, block b at [r * cols/16 + b]. With 16x16
 *          blocks every row of a tile holds the tile's scale (so consumers read one layout).
 *   outer  the FP32 encode scale S: one per row (MT_SCALE_ROW) or one for the matrix (TENSOR).
 *          A domain holding NaN or Inf gets S = NaN and all its codes and scales 0: its GEMM
 *          outputs are NaN (through 1/S in the epilogue), as BF16 would give.
 *
 * Quantization of one domain (all FP32, each step rounded to nearest even on its own, in this
 * order; no FMA, denormals kept, division correctly rounded):
 *   S = mt_nvfp4_outer_scale(max |x|)
 *   per block: s_b = e4m3(amax_b * fl(S * 0x1.555556p-3))
 *              c_b = s_b == 0 ? 0 : fl(1 / fl(float(s_b) * fl(1 / S)))
 *              code = e2m1(fl(x * c_b))
 * Below a domain amax of about 3e-35, 1/S is an FP32 subnormal and c_b may overflow to +Inf: then
 * nonzero x encode as +-6 and zeros as +6 (0 * Inf = NaN -> +6). This is what TE's steps give.
 */
#ifndef MT_NVFP4_H
#define MT_NVFP4_H

#include <stddef.h>
#include <stdint.h>

#include "spec/spec.h"

#define MT_NVFP4_BLOCK 16
#define MT_E4M3_MAX 448.0f
#define MT_E2M1_MAX 6.0f

/* Scalar conversions. All RNE; "satfinite" saturates finite overflow to the largest magnitude. */
float mt_bf16_to_float(uint16_t h);
uint16_t mt_float_to_bf16(float f); /* RNE; NaN stays NaN */
float mt_fp16_to_float(uint16_t h);
uint16_t mt_float_to_fp16(float f);     /* RNE; overflow to Inf, NaN stays NaN */
float mt_e4m3_to_float(uint8_t v);      /* E4M3 "fn": no Inf, 0x7f/0xff NaN */
uint8_t mt_e4m3_rne_satfinite(float f); /* sign kept; |f| > 448 -> 448; NaN -> 0x7f */
float mt_e2m1_to_float(uint8_t code);   /* low 4 bits */
/* 4-bit code; sign = sign bit of f (so -0 and tiny negatives -> 0x8); |f| > 5 and Inf -> 6;
 * NaN -> 0x7 (+6) whatever its sign, as CUDA's __nv_cvt_float_to_fp4. */
uint8_t mt_e2m1_rne_satfinite(float f);

/* S for a domain with this amax: 2688 / amax clamped to FLT_MAX; 1 when amax == 0; NaN when amax
 * is NaN or Inf. */
float mt_nvfp4_outer_scale(float amax);

typedef struct {
  int rows, cols;
  enum mt_scale outer_kind; /* row: outer[rows]; tensor: outer[1] */
  enum mt_wblock block;     /* 1x16, or 16x16 (needs outer_kind tensor, rows % 16 == 0) */
  uint8_t *codes;           /* rows * cols / 2 */
  uint8_t *scales;          /* rows * cols / 16 */
  float *outer;             /* rows or 1 */
} mt_nvfp4;

/* Allocate the three arrays for rows x cols; returns -1 on bad shape or no memory. */
int mt_nvfp4_alloc(mt_nvfp4 *q, int rows, int cols, enum mt_scale outer_kind, enum mt_wblock block);
void mt_nvfp4_free(mt_nvfp4 *q);

/* Quantize x (rows x cols floats, each exactly a BF16 or FP16 value, row stride ld) into q, which
 * mt_nvfp4_alloc prepared (left untouched if it was not). Per-row outer scales make a row's
 * result independent of the other rows. */
void mt_ref_quantize(const float *x, size_t ld, mt_nvfp4 *q);

/* The dequantized element e2m1(code) * float(scale), without the outer scale (exact in BF16 and
 * FP16): what the tensor cores multiply. */
float mt_ref_dequant(const mt_nvfp4 *q, int r, int c);

/* Reference W4A4 GEMM, y[i][j] for i < M, j < N, K = a->cols = w->cols:
 *   acc = sum_k dequant(a,i,k) * dequant(w,j,k)            exact products, double accumulation
 *   y   = acc * ((1/S_a[i]) * (1/S_w[j])) * alpha + beta * c[i][j] + bias[j]
 * in double after the FP32 scale product (1/S_a, 1/S_w and their product rounded to FP32 as the
 * kernels do). c and bias may be NULL. The result is not rounded to the output type: callers
 * compare or round as they need. y has row stride ldy, c row stride ldc. When beta == 0, c is
 * not read (as cuBLAS: NaN in C does not propagate). A NaN S_a[i] makes row i NaN; a NaN
 * per-tensor S_w makes every output NaN. */
void mt_ref_gemm(const mt_nvfp4 *a, const mt_nvfp4 *w, float alpha, float beta, const float *c,
                 size_t ldc, const float *bias, double *y, size_t ldy);

/* sum_k |dequant(a,i,k) * dequant(w,j,k)| * |(1/S_a[i]) * (1/S_w[j])|: the scale of the FP32
 * accumulation error bound for element (i, j). */
double mt_ref_gemm_abs(const mt_nvfp4 *a, const mt_nvfp4 *w, int i, int j);

#endif
