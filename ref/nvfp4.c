/* nvfp4.c — the CPU reference of minite's NVFP4 numerics: scalar conversions, quantization,
 * dequantization and the reference W4A4 GEMM. This file *defines* the numerics bit for bit; the
 * GPU kernels are tested against it (tests/cpu/test_nvfp4.c checks it by hand, and
 * tests/cpu/test_nvfp4_numpy.py against an independent numpy + ml_dtypes implementation).
 *
 * Every FP32 operation of the quantizer is written as its own rounded step (mul32, div32) so that
 * the compiler can neither fuse two into an FMA nor reassociate them: the GPU kernels must perform
 * the same IEEE operations in the same order, with denormals kept (no -ftz, no fast math) and
 * correctly rounded division (not rcp.approx), or they will not match in rare cases.
 */
#include "ref/nvfp4.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__FAST_MATH__)
#error "ref/nvfp4.c defines the numerics bit for bit: build it without -ffast-math"
#endif
/* Excess precision (x87) would round some products twice; SSE evaluates FP32 in FP32. */
_Static_assert(FLT_EVAL_METHOD == 0, "the reference needs FP32 evaluated in FP32");

/* ---- single rounded FP32 steps ---------------------------------------------------------------
 * The volatile store forces each result to be rounded to FP32 on its own, whatever contraction
 * or optimisation flags the compiler was given. */
static float mul32(float a, float b) {
  volatile float r = a * b;
  return r;
}

static float div32(float a, float b) {
  volatile float r = a / b;
  return r;
}

static uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

static float bits_float(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* ---- BF16 --------------------------------------------------------------------------------- */

float mt_bf16_to_float(uint16_t h) { return bits_float((uint32_t)h << 16); }

uint16_t mt_float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if (isnan(f)) /* truncating could clear every payload bit and give Inf: set the quiet bit */
    return (uint16_t)((u >> 16) | 0x0040u);
  /* RNE on the 16 dropped bits: add just under half, plus one when the kept LSB is odd. A carry
   * into the exponent is the correct next binade; past the largest finite value it gives Inf. */
  uint32_t lsb = (u >> 16) & 1u;
  return (uint16_t)((u + 0x7fffu + lsb) >> 16);
}

/* ---- FP16 --------------------------------------------------------------------------------- */

float mt_fp16_to_float(uint16_t h) {
  float sign = (h & 0x8000u) ? -1.0f : 1.0f;
  int exp = (h >> 10) & 0x1f;
  int man = h & 0x3ff;
  if (exp == 0x1f) { /* Inf or NaN: keep the payload, it is part of "NaN preserved" */
    uint32_t nan_or_inf = ((uint32_t)(h & 0x8000u) << 16) | 0x7f800000u | ((uint32_t)man << 13);
    return bits_float(nan_or_inf);
  }
  if (exp == 0) /* zero or subnormal: man * 2^-24, exact in FP32 */
    return sign * ldexpf((float)man, -24);
  return sign * ldexpf((float)(man | 0x400), exp - 25);
}

uint16_t mt_float_to_fp16(float f) {
  uint32_t u = float_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  float a = fabsf(f);
  if (isnan(f))
    return (uint16_t)(sign | 0x7e00u | ((u >> 13) & 0x3ffu));
  if (a < 0x1p-14f) {
    /* Subnormal range: the FP16 code is the number of 2^-24 quanta, rounded to even. The scaling
     * is exact; 1024 quanta is the smallest normal, whose code is 0x400 as well. */
    return (uint16_t)(sign | (uint16_t)rintf(a * 0x1p24f));
  }
  if (a >= 65520.0f) /* at or past the midpoint between 65504 and 2^16: RNE overflows to Inf */
    return (uint16_t)(sign | 0x7c00u);
  /* Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even; a
   * carry into the exponent field is the correct next binade. */
  uint32_t rebiased = float_bits(a) - (112u << 23);
  uint32_t lsb = (rebiased >> 13) & 1u;
  return (uint16_t)(sign | ((rebiased + 0xfffu + lsb) >> 13));
}

/* ---- E4M3 ("fn": no Inf, S.1111.111 is NaN, max 448, subnormals m * 2^-9) ---------------- */

float mt_e4m3_to_float(uint8_t v) {
  float sign = (v & 0x80) ? -1.0f : 1.0f;
  int exp = (v >> 3) & 0xf;
  int man = v & 7;
  if (exp == 0xf && man == 7)
    return NAN;
  if (exp == 0)
    return sign * ldexpf((float)man, -9);
  return sign * ldexpf((float)(8 + man), exp - 10);
}

uint8_t mt_e4m3_rne_satfinite(float f) {
  if (isnan(f)) /* the canonical NaN, as CUDA's __nv_cvt_float_to_fp8 gives */
    return 0x7f;
  uint8_t sign = signbit(f) ? 0x80 : 0;
  float a = fabsf(f);
  if (a > MT_E4M3_MAX) /* satfinite: every finite or infinite overflow becomes the largest finite */
    return sign | 0x7e;
  /* The quantum (value of one mantissa step) is 2^-9 in the subnormal range below 2^-6, else
   * 2^(e-3) for a in [2^e, 2^(e+1)). Scaling by a power of two is exact, so rintf (ties to even in
   * the default rounding mode) rounds to the nearest representable value, ties to an even
   * mantissa; n == 16 is the carry into the next binade. */
  int e;
  frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1): a lies in [2^(e-1), 2^e) */
  int quantum_exp = (a < 0x1p-6f) ? -9 : (e - 1) - 3;
  float n = rintf(ldexpf(a, -quantum_exp));
  float r = ldexpf(n, quantum_exp);
  if (r < 0x1p-6f) /* subnormal: the code is the count of 2^-9 quanta (8 would be 0x08 anyway) */
    return sign | (uint8_t)n;
  frexpf(r, &e);
  int exp_field = (e - 1) + 7;
  int man_field = (int)ldexpf(r, -((e - 1) - 3)) - 8;
  return sign | (uint8_t)(exp_field << 3) | (uint8_t)man_field;
}

/* ---- E2M1 (no Inf or NaN; magnitudes 0 .5 1 1.5 2 3 4 6) -------------------------------- */

float mt_e2m1_to_float(uint8_t code) {
  static const float magnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  float m = magnitude[code & 7];
  return (code & 8) ? -m : m;
}

uint8_t mt_e2m1_rne_satfinite(float f) {
  /* NaN has no E2M1 code: like CUDA's __nv_cvt_float_to_fp4 it becomes +6 whatever its sign bit
   * (x86 and CUDA make NaNs of different signs, so the sign must not leak through). */
  if (isnan(f))
    return 0x7;
  uint8_t sign = signbit(f) ? 8 : 0;
  float a = fabsf(f);
  /* The midpoints between neighbouring values; a tie goes to the even code (codes 0, 2, 4, 6), so
   * the comparison is <= below an even code and < below an odd one. Everything above 5 (Inf
   * included) saturates to 6. */
  uint8_t mag;
  if (a <= 0.25f)
    mag = 0;
  else if (a < 0.75f)
    mag = 1;
  else if (a <= 1.25f)
    mag = 2;
  else if (a < 1.75f)
    mag = 3;
  else if (a <= 2.5f)
    mag = 4;
  else if (a < 3.5f)
    mag = 5;
  else if (a <= 5.0f)
    mag = 6;
  else
    mag = 7;
  return sign | mag;
}

/* ---- quantization ------------------------------------------------------------------------- */

float mt_nvfp4_outer_scale(float amax) {
  if (!isfinite(amax))
    return NAN;
  if (amax == 0.0f) /* an all-zero domain: any S works; 1 keeps every later step finite */
    return 1.0f;
  float s = div32(2688.0f, amax); /* 448 * 6: the block amax maps onto E4M3 max times E2M1 max */
  return (s > FLT_MAX) ? FLT_MAX : s; /* 2688 / tiny amax overflows to Inf; clamp as TE does */
}

/* The FP32 constant nearest 1/6 (0x3e2aaaab), written in hex so nobody "fixes" its last bit. */
static const float one_sixth = 0x1.555556p-3f;

/* max |x| over rows r0..r1-1, columns c0..c1-1. NaN propagates (fmaxf would drop it), so a domain
 * or block holding NaN has amax NaN; Inf gives Inf. */
static float amax_of(const float *x, size_t ld, int r0, int r1, int c0, int c1) {
  float amax = 0.0f;
  for (int r = r0; r < r1; r++)
    for (int c = c0; c < c1; c++) {
      float a = fabsf(x[(size_t)r * ld + (size_t)c]);
      if (isnan(a))
        return NAN;
      if (a > amax)
        amax = a;
    }
  return amax;
}

/* The E4M3 block decode scale s_b = e4m3(amax_b * (S * (1/6))): the product S * one_sixth is
 * rounded to FP32 first, then multiplied by amax_b and rounded again (TE's order). */
static uint8_t block_scale(float amax_b, float outer) {
  float outer_over_6 = mul32(outer, one_sixth);
  return mt_e4m3_rne_satfinite(mul32(amax_b, outer_over_6));
}

/* The element encode coefficient c_b = 1 / (float(s_b) * (1 / S)), three FP32 roundings in this
 * order (TE's FP32 path). A zero scale (the block's values are all below E4M3's smallest step,
 * typically an all-zero block) gives c_b = 0, so its codes are +-0. When S is huge (domain amax
 * below ~2688/2^126) 1/S is subnormal and c_b may overflow to +Inf: x * Inf then saturates to +-6,
 * and 0 * Inf = NaN encodes as +6 (mt_e2m1_rne_satfinite). Kernels must do the same. */
static float encode_coefficient(uint8_t scale, float outer) {
  if (scale == 0)
    return 0.0f;
  float inv_outer = div32(1.0f, outer);
  float decode = mul32(mt_e4m3_to_float(scale), inv_outer);
  return div32(1.0f, decode);
}

static void put_code(mt_nvfp4 *q, int r, int c, uint8_t code) {
  /* element 2i in the low nibble of byte i, 2i+1 in the high nibble (TE and torchao agree) */
  uint8_t *byte = &q->codes[(size_t)r * (size_t)(q->cols / 2) + (size_t)(c / 2)];
  if (c % 2 == 0)
    *byte = (uint8_t)((*byte & 0xf0) | code);
  else
    *byte = (uint8_t)((*byte & 0x0f) | (code << 4));
}

static uint8_t get_code(const mt_nvfp4 *q, int r, int c) {
  uint8_t byte = q->codes[(size_t)r * (size_t)(q->cols / 2) + (size_t)(c / 2)];
  return (c % 2 == 0) ? (byte & 0x0f) : (byte >> 4);
}

static uint8_t *scale_at(const mt_nvfp4 *q, int r, int b) {
  return &q->scales[(size_t)r * (size_t)(q->cols / MT_NVFP4_BLOCK) + (size_t)b];
}

/* Quantize the block of rows r0..r1-1 (1 row for 1x16 blocks, 16 for 16x16) and columns
 * c0..c0+15 under outer scale S. Every row of the block stores the block's one scale. */
static void quantize_block(const float *x, size_t ld, mt_nvfp4 *q, int r0, int r1, int c0,
                           float outer) {
  float amax_b = amax_of(x, ld, r0, r1, c0, c0 + MT_NVFP4_BLOCK);
  uint8_t scale = block_scale(amax_b, outer);
  float coef = encode_coefficient(scale, outer);
  for (int r = r0; r < r1; r++) {
    *scale_at(q, r, c0 / MT_NVFP4_BLOCK) = scale;
    for (int c = c0; c < c0 + MT_NVFP4_BLOCK; c++)
      put_code(q, r, c, mt_e2m1_rne_satfinite(mul32(x[(size_t)r * ld + (size_t)c], coef)));
  }
}

/* Rows r0..r1-1 all under outer scale S (one row per domain for per-row scales, all rows for
 * per-tensor). A NaN S means the domain held NaN or Inf: its codes and scales are all 0 (which
 * dequantize to 0), and the NaN S alone makes its GEMM outputs NaN, as BF16 would. */
static void quantize_rows(const float *x, size_t ld, mt_nvfp4 *q, int r0, int r1, float outer) {
  int tile_rows = (q->block == MT_WBLOCK_16X16) ? MT_NVFP4_BLOCK : 1;
  for (int r = r0; r < r1; r += tile_rows)
    for (int c0 = 0; c0 < q->cols; c0 += MT_NVFP4_BLOCK) {
      if (isnan(outer)) {
        for (int rr = r; rr < r + tile_rows; rr++) {
          *scale_at(q, rr, c0 / MT_NVFP4_BLOCK) = 0;
          for (int c = c0; c < c0 + MT_NVFP4_BLOCK; c++)
            put_code(q, rr, c, 0);
        }
      } else {
        quantize_block(x, ld, q, r, r + tile_rows, c0, outer);
      }
    }
}

static int shape_ok(int rows, int cols, enum mt_scale outer_kind, enum mt_wblock block) {
  if (rows <= 0 || cols <= 0 || cols % MT_NVFP4_BLOCK != 0)
    return 0;
  if (outer_kind != MT_SCALE_ROW && outer_kind != MT_SCALE_TENSOR)
    return 0;
  if (block == MT_WBLOCK_16X16) /* a tile spans 16 rows, so they must share one outer scale */
    return outer_kind == MT_SCALE_TENSOR && rows % MT_NVFP4_BLOCK == 0;
  return block == MT_WBLOCK_1X16;
}

void mt_ref_quantize(const float *x, size_t ld, mt_nvfp4 *q) {
  if (!x || !q || !q->codes || !q->scales || !q->outer || ld < (size_t)q->cols ||
      !shape_ok(q->rows, q->cols, q->outer_kind, q->block))
    return; /* not what mt_nvfp4_alloc prepared: leave it untouched rather than overrun */
  if (q->outer_kind == MT_SCALE_TENSOR) {
    q->outer[0] = mt_nvfp4_outer_scale(amax_of(x, ld, 0, q->rows, 0, q->cols));
    quantize_rows(x, ld, q, 0, q->rows, q->outer[0]);
    return;
  }
  for (int r = 0; r < q->rows; r++) {
    q->outer[r] = mt_nvfp4_outer_scale(amax_of(x, ld, r, r + 1, 0, q->cols));
    quantize_rows(x, ld, q, r, r + 1, q->outer[r]);
  }
}

/* ---- allocation --------------------------------------------------------------------------- */

int mt_nvfp4_alloc(mt_nvfp4 *q, int rows, int cols, enum mt_scale outer_kind,
                   enum mt_wblock block) {
  if (!q)
    return -1;
  memset(q, 0, sizeof *q);
  if (!shape_ok(rows, cols, outer_kind, block))
    return -1;
  size_t n_outer = (outer_kind == MT_SCALE_ROW) ? (size_t)rows : 1;
  q->codes = calloc((size_t)rows, (size_t)cols / 2);
  q->scales = calloc((size_t)rows, (size_t)cols / MT_NVFP4_BLOCK);
  q->outer = calloc(n_outer, sizeof(float));
  if (!q->codes || !q->scales || !q->outer) {
    mt_nvfp4_free(q);
    return -1;
  }
  q->rows = rows;
  q->cols = cols;
  q->outer_kind = outer_kind;
  q->block = block;
  return 0;
}

void mt_nvfp4_free(mt_nvfp4 *q) {
  if (!q)
    return;
  free(q->codes);
  free(q->scales);
  free(q->outer);
  q->codes = NULL;
  q->scales = NULL;
  q->outer = NULL;
  q->rows = q->cols = 0;
}

/* ---- dequantization and the reference GEMM ------------------------------------------------ */

float mt_ref_dequant(const mt_nvfp4 *q, int r, int c) {
  /* at most 2 x 4 significant bits, within [2^-10, 2688]: exact in FP32, BF16 and FP16 */
  return mt_e2m1_to_float(get_code(q, r, c)) *
         mt_e4m3_to_float(*scale_at(q, r, c / MT_NVFP4_BLOCK));
}

static float outer_of(const mt_nvfp4 *q, int r) {
  return q->outer[q->outer_kind == MT_SCALE_ROW ? r : 0];
}

/* (1/S_a[i]) * (1/S_w[j]) with three FP32 roundings, as the kernels' epilogue forms it. */
static float output_scale(const mt_nvfp4 *a, const mt_nvfp4 *w, int i, int j) {
  float inv_a = div32(1.0f, outer_of(a, i));
  float inv_w = div32(1.0f, outer_of(w, j));
  return mul32(inv_a, inv_w);
}

/* sum_k of the exact products (each product of two FP32 values is exact in double). */
static double dot_dequant(const mt_nvfp4 *a, const mt_nvfp4 *w, int i, int j, int absolute) {
  double acc = 0.0;
  for (int k = 0; k < a->cols; k++) {
    double p = (double)mt_ref_dequant(a, i, k) * (double)mt_ref_dequant(w, j, k);
    acc += absolute ? fabs(p) : p;
  }
  return acc;
}

void mt_ref_gemm(const mt_nvfp4 *a, const mt_nvfp4 *w, float alpha, float beta, const float *c,
                 size_t ldc, const float *bias, double *y, size_t ldy) {
  if (!a || !w || !y || a->cols != w->cols)
    return;
  for (int i = 0; i < a->rows; i++)
    for (int j = 0; j < w->rows; j++) {
      double v = dot_dequant(a, w, i, j, 0) * (double)output_scale(a, w, i, j) * (double)alpha;
      if (beta != 0.0f && c) /* as cuBLAS: with beta == 0, C is not read (NaN in C stays out) */
        v += (double)beta * (double)c[(size_t)i * ldc + (size_t)j];
      if (bias)
        v += (double)bias[j];
      y[(size_t)i * ldy + (size_t)j] = v;
    }
}

double mt_ref_gemm_abs(const mt_nvfp4 *a, const mt_nvfp4 *w, int i, int j) {
  return dot_dequant(a, w, i, j, 1) * fabs((double)output_scale(a, w, i, j));
}
