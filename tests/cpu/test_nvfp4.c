/* test_nvfp4.c — hand-checked cases of the CPU reference of the NVFP4 numerics (ref/nvfp4.c).
 *
 * Expected values are worked out in the comments. Where a sweep is needed, the reference is
 * compared with a second formulation written here (nearest representable value, ties to the even
 * code, by table search) and, when the CUDA headers are present, with NVIDIA's own host-side
 * conversions (cuda_fp4.h, cuda_fp8.h). The numpy + ml_dtypes cross-check is test_nvfp4_numpy.py.
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ref/nvfp4.h"
#include "tests/cpu/floatbits.h"
#include "tests/harness.h"

#if defined(__has_include)
#if __has_include(<cuda_fp4.h>) && __has_include(<cuda_fp8.h>)
#define HAVE_CUDA_FP_HEADERS 1
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter" /* in NVIDIA's headers, not ours */
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#pragma GCC diagnostic pop
#endif
#endif

static int same_bits(float a, float b) { return bits_of(a) == bits_of(b); }

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void) { /* splitmix64: small, fixed seed, the same on every machine */
  uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

static float rng_uniform(void) { return (float)(rng_next() >> 40) * 0x1p-24f; } /* [0, 1) */

/* A random BF16 value, roughly normal(0, scale): the sum of four uniforms, rounded to BF16. */
static float rng_bf16(float scale) {
  float s = rng_uniform() + rng_uniform() + rng_uniform() + rng_uniform() - 2.0f;
  return mt_bf16_to_float(mt_float_to_bf16(s * scale));
}

/* ---- a second formulation of rounding: nearest value of a table, ties to the even code ---- */

/* Code of the nearest of the `n` non-negative values (ascending, code i has value[i]); a value
 * exactly at a midpoint (computed exactly in double) goes to the even code; past the largest
 * value saturates. */
static int nearest_even(const float *value, int n, float a) {
  for (int i = 0; i + 1 < n; i++) {
    double mid = ((double)value[i] + (double)value[i + 1]) / 2;
    if ((double)a < mid || ((double)a == mid && i % 2 == 0))
      return i;
  }
  return n - 1;
}

static float e2m1_values[8], e4m3_values[127]; /* codes 0..7 and 0x00..0x7e */

static void fill_tables(void) {
  for (int i = 0; i < 8; i++)
    e2m1_values[i] = mt_e2m1_to_float((uint8_t)i);
  for (int i = 0; i < 127; i++)
    e4m3_values[i] = mt_e4m3_to_float((uint8_t)i);
}

static uint8_t e2m1_by_table(float f) {
  if (isnan(f))
    return 7;
  return (uint8_t)((signbit(f) ? 8 : 0) | nearest_even(e2m1_values, 8, fabsf(f)));
}

static uint8_t e4m3_by_table(float f) {
  if (isnan(f))
    return 0x7f;
  return (uint8_t)((signbit(f) ? 0x80 : 0) | nearest_even(e4m3_values, 127, fabsf(f)));
}

/* ---- E2M1 ------------------------------------------------------------------------------- */

static void e2m1_values_and_ties(void) {
  /* magnitudes of codes 0..7 */
  const float expect_value[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (int c = 0; c < 16; c++) {
    float v = mt_e2m1_to_float((uint8_t)c);
    CHECKF(fabsf(v) == expect_value[c & 7] && (signbit(v) != 0) == (c >= 8), "code %d -> %g", c, v);
    CHECKF(mt_e2m1_rne_satfinite(v) == c, "code %d does not round-trip", c);
  }
  /* Each midpoint t with the codes just below, at and just above it (1 FP32 ulp). A tie goes to
   * the even code: .25 -> 0 (not .5), .75 -> 1.0 (code 2), 1.25 -> 1.0 (code 2), 1.75 -> 2.0
   * (code 4), 2.5 -> 2.0 (code 4), 3.5 -> 4.0 (code 6), 5 -> 4.0 (code 6). */
  const struct {
    float tie;
    uint8_t below, at, above;
  } ties[] = {{0.25f, 0, 0, 1}, {0.75f, 1, 2, 2}, {1.25f, 2, 2, 3}, {1.75f, 3, 4, 4},
              {2.5f, 4, 4, 5},  {3.5f, 5, 6, 6},  {5.0f, 6, 6, 7}};
  for (size_t i = 0; i < sizeof ties / sizeof ties[0]; i++)
    for (int neg = 0; neg < 2; neg++) {
      float t = neg ? -ties[i].tie : ties[i].tie;
      uint8_t sign = neg ? 8 : 0;
      float toward_zero = nextafterf(t, 0.0f), away = nextafterf(t, neg ? -INFINITY : INFINITY);
      CHECKF(mt_e2m1_rne_satfinite(toward_zero) == (sign | ties[i].below), "just inside %g", t);
      CHECKF(mt_e2m1_rne_satfinite(t) == (sign | ties[i].at), "tie %g", t);
      CHECKF(mt_e2m1_rne_satfinite(away) == (sign | ties[i].above), "just outside %g", t);
    }
}

static void e2m1_saturation_sign_and_nan(void) {
  CHECK(mt_e2m1_rne_satfinite(6.0f) == 0x7);
  CHECK(mt_e2m1_rne_satfinite(6.5f) == 0x7); /* satfinite: never NaN or Inf, always +-6 */
  CHECK(mt_e2m1_rne_satfinite(1e30f) == 0x7);
  CHECK(mt_e2m1_rne_satfinite(INFINITY) == 0x7);
  CHECK(mt_e2m1_rne_satfinite(-INFINITY) == 0xf);
  CHECK(mt_e2m1_rne_satfinite(0.0f) == 0x0);
  CHECK(mt_e2m1_rne_satfinite(-0.0f) == 0x8);     /* the sign bit of -0 is kept */
  CHECK(mt_e2m1_rne_satfinite(-1e-30f) == 0x8);   /* a tiny negative rounds to -0 */
  CHECK(mt_e2m1_rne_satfinite(-0.25f) == 0x8);    /* the tie at -.25 too */
  CHECK(mt_e2m1_rne_satfinite(NAN) == 0x7);       /* NaN -> +6, as CUDA's host conversion */
  CHECK(mt_e2m1_rne_satfinite(-NAN) == 0x7);      /* whatever the NaN's sign bit */
  CHECK(mt_e2m1_rne_satfinite(0x1p-149f) == 0x0); /* smallest FP32 subnormal */
}

/* Every FP32 of a strided sweep over all bit patterns, against the table search. */
static void e2m1_sweep_against_table(void) {
  for (uint64_t u = 0; u < (1ull << 32); u += 4099) {
    float f = float_of((uint32_t)u);
    uint8_t got = mt_e2m1_rne_satfinite(f), want = e2m1_by_table(f);
    CHECKF(got == want, "0x%08x (%g): 0x%x, table says 0x%x", (unsigned)u, f, got, want);
  }
}

/* ---- E4M3 ------------------------------------------------------------------------------- */

static void e4m3_decode(void) {
  CHECK(mt_e4m3_to_float(0x00) == 0.0f && !signbit(mt_e4m3_to_float(0x00)));
  CHECK(mt_e4m3_to_float(0x80) == 0.0f && signbit(mt_e4m3_to_float(0x80)));
  CHECK(mt_e4m3_to_float(0x01) == 0x1p-9f);     /* smallest subnormal: 1 * 2^-9 */
  CHECK(mt_e4m3_to_float(0x07) == 7 * 0x1p-9f); /* largest subnormal */
  CHECK(mt_e4m3_to_float(0x08) == 0x1p-6f);     /* smallest normal: exponent 1 - 7 */
  CHECK(mt_e4m3_to_float(0x38) == 1.0f);        /* exponent field 7 is 2^0 */
  CHECK(mt_e4m3_to_float(0x3a) == 1.25f);
  CHECK(mt_e4m3_to_float(0x77) == 240.0f); /* 1.875 * 2^7 */
  CHECK(mt_e4m3_to_float(0x78) == 256.0f); /* S.1111.000 is finite ("fn": no Inf) */
  CHECK(mt_e4m3_to_float(0x7e) == 448.0f); /* 1.75 * 2^8, the largest */
  CHECK(mt_e4m3_to_float(0xfe) == -448.0f);
  CHECK(isnan(mt_e4m3_to_float(0x7f)) && isnan(mt_e4m3_to_float(0xff)));
  /* every non-NaN code round-trips, and the finite values ascend with the code */
  for (int c = 0; c < 256; c++)
    if ((c & 0x7f) != 0x7f)
      CHECKF(mt_e4m3_rne_satfinite(mt_e4m3_to_float((uint8_t)c)) == c, "code 0x%02x", c);
  for (int c = 1; c < 127; c++)
    CHECKF(mt_e4m3_to_float((uint8_t)c) > mt_e4m3_to_float((uint8_t)(c - 1)), "code 0x%02x", c);
}

static void e4m3_rounding_cases(void) {
  /* subnormals: the quantum is 2^-9; a tie between n and n+1 quanta goes to the even n */
  CHECK(mt_e4m3_rne_satfinite(0x1p-10f) == 0x00);                   /* 0.5 q: tie -> 0 */
  CHECK(mt_e4m3_rne_satfinite(nextafterf(0x1p-10f, 1.0f)) == 0x01); /* just above -> 1 q */
  CHECK(mt_e4m3_rne_satfinite(3 * 0x1p-10f) == 0x02);               /* 1.5 q -> 2 q */
  CHECK(mt_e4m3_rne_satfinite(5 * 0x1p-10f) == 0x02);               /* 2.5 q -> 2 q */
  CHECK(mt_e4m3_rne_satfinite(7 * 0x1p-10f) == 0x04);               /* 3.5 q -> 4 q */
  CHECK(mt_e4m3_rne_satfinite(13 * 0x1p-10f) == 0x06);              /* 6.5 q -> 6 q */
  CHECK(mt_e4m3_rne_satfinite(15 * 0x1p-10f) == 0x08); /* 7.5 q -> 8 q = 2^-6, smallest normal */
  CHECK(mt_e4m3_rne_satfinite(nextafterf(15 * 0x1p-10f, 0.0f)) == 0x07);
  CHECK(mt_e4m3_rne_satfinite(0x1p-6f) == 0x08);
  CHECK(mt_e4m3_rne_satfinite(1e-30f) == 0x00);
  CHECK(mt_e4m3_rne_satfinite(-1e-30f) == 0x80); /* sign kept on underflow */
  CHECK(mt_e4m3_rne_satfinite(-0.0f) == 0x80);
  /* normals: in [1, 2) the quantum is 1/8 */
  CHECK(mt_e4m3_rne_satfinite(1.0625f) == 0x38); /* tie 1.0 (m=0) | 1.125 (m=1) -> 1.0 */
  CHECK(mt_e4m3_rne_satfinite(1.1875f) == 0x3a); /* 1.125 (m=1) vs 1.25 (m=2) -> 1.25 */
  CHECK(mt_e4m3_rne_satfinite(nextafterf(1.0625f, 2.0f)) == 0x39);
  CHECK(mt_e4m3_rne_satfinite(1.9375f) == 0x40); /* 1.875 vs 2.0 -> 2.0, carry into the exponent */
  CHECK(mt_e4m3_rne_satfinite(248.0f) == 0x78);  /* 240 vs 256 -> 256 (m=0) */
  /* saturation: in [256, 448] the quantum is 32; 448 is 1.75 * 2^8, the largest */
  CHECK(mt_e4m3_rne_satfinite(432.0f) == 0x7e); /* 416 (m=5) vs 448 (m=6) -> 448 */
  CHECK(mt_e4m3_rne_satfinite(448.0f) == 0x7e);
  CHECK(mt_e4m3_rne_satfinite(nextafterf(448.0f, 1e9f)) == 0x7e);
  CHECK(mt_e4m3_rne_satfinite(464.0f) == 0x7e); /* would round to 480 = the NaN slot: saturate */
  CHECK(mt_e4m3_rne_satfinite(500.0f) == 0x7e);
  CHECK(mt_e4m3_rne_satfinite(FLT_MAX) == 0x7e);
  CHECK(mt_e4m3_rne_satfinite(INFINITY) == 0x7e); /* satfinite: Inf -> the largest finite */
  CHECK(mt_e4m3_rne_satfinite(-INFINITY) == 0xfe);
  CHECK(mt_e4m3_rne_satfinite(-1000.0f) == 0xfe);
  CHECK(mt_e4m3_rne_satfinite(NAN) == 0x7f);
  CHECK(mt_e4m3_rne_satfinite(-NAN) == 0x7f); /* the canonical NaN, whatever the sign */
}

static void e4m3_sweep_against_table(void) {
  for (uint64_t u = 0; u < (1ull << 32); u += 4099) {
    float f = float_of((uint32_t)u);
    uint8_t got = mt_e4m3_rne_satfinite(f), want = e4m3_by_table(f);
    CHECKF(got == want, "0x%08x (%g): 0x%02x, table says 0x%02x", (unsigned)u, f, got, want);
  }
  /* every midpoint between neighbouring finite values, and its FP32 neighbours */
  for (int c = 0; c + 1 < 127; c++) {
    float mid = (e4m3_values[c] + e4m3_values[c + 1]) / 2; /* exact: a few significant bits */
    float probe[3] = {nextafterf(mid, 0.0f), mid, nextafterf(mid, 1e9f)};
    for (int p = 0; p < 3; p++)
      CHECKF(mt_e4m3_rne_satfinite(probe[p]) == e4m3_by_table(probe[p]), "near %g", mid);
  }
}

/* NVIDIA's host conversions (cuda_fp4.h/cuda_fp8.h, what CUDA does where there is no cvt): a third
 * implementation, written by someone else. */
static void conversions_against_cuda_headers(void) {
#ifdef HAVE_CUDA_FP_HEADERS
  for (uint64_t u = 0; u < (1ull << 32); u += 65537) {
    float f = float_of((uint32_t)u);
    uint8_t fp4 = (uint8_t)__nv_cvt_float_to_fp4(f, __NV_E2M1, cudaRoundNearest);
    uint8_t fp8 = (uint8_t)__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
    CHECKF(mt_e2m1_rne_satfinite(f) == fp4, "e2m1 0x%08x: 0x%x, CUDA 0x%x", (unsigned)u,
           mt_e2m1_rne_satfinite(f), fp4);
    CHECKF(mt_e4m3_rne_satfinite(f) == fp8, "e4m3 0x%08x: 0x%02x, CUDA 0x%02x", (unsigned)u,
           mt_e4m3_rne_satfinite(f), fp8);
  }
  const float edge[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 6.0f, 0x1p-10f, 464.0f};
  for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
    for (int s = -1; s <= 1; s += 2) {
      float e = s * edge[i];
      float probe[3] = {nextafterf(e, 0.0f), e, nextafterf(e, s * 1e9f)};
      for (int p = 0; p < 3; p++) {
        CHECK(mt_e2m1_rne_satfinite(probe[p]) ==
              (uint8_t)__nv_cvt_float_to_fp4(probe[p], __NV_E2M1, cudaRoundNearest));
        CHECK(mt_e4m3_rne_satfinite(probe[p]) ==
              (uint8_t)__nv_cvt_float_to_fp8(probe[p], __NV_SATFINITE, __NV_E4M3));
      }
    }
#else
  SKIP("cuda_fp4.h / cuda_fp8.h not found (CUDA toolkit headers)");
#endif
}

/* ---- BF16 and FP16 ---------------------------------------------------------------------- */

static void bf16_conversions(void) {
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = mt_bf16_to_float((uint16_t)h);
    CHECKF(bits_of(f) == h << 16, "0x%04x", h);
    if (!isnan(f))
      CHECKF(mt_float_to_bf16(f) == h, "0x%04x does not round-trip", h);
    else
      CHECKF(isnan(mt_bf16_to_float(mt_float_to_bf16(f))), "NaN 0x%04x lost", h);
  }
  CHECK(mt_float_to_bf16(1.0f) == 0x3f80);
  CHECK(mt_float_to_bf16(float_of(0x3f808000)) == 0x3f80); /* tie, kept LSB even: down */
  CHECK(mt_float_to_bf16(float_of(0x3f818000)) == 0x3f82); /* tie, kept LSB odd: up */
  CHECK(mt_float_to_bf16(float_of(0x3f808001)) == 0x3f81); /* past the tie: up */
  CHECK(mt_float_to_bf16(FLT_MAX) == 0x7f80);              /* rounds past the largest BF16: Inf */
  CHECK(mt_float_to_bf16(float_of(0x7f800001)) != 0x7f80); /* payload only in dropped bits */
  CHECK(isnan(mt_bf16_to_float(mt_float_to_bf16(float_of(0xff800001)))));
  CHECK(mt_float_to_bf16(float_of(0xff800001)) & 0x8000); /* NaN sign kept */
  CHECK(mt_float_to_bf16(-0.0f) == 0x8000);
}

static void fp16_conversions(void) {
  for (uint32_t h = 0; h < 0x10000; h++) {
    float f = mt_fp16_to_float((uint16_t)h);
    if (isnan(f))
      CHECKF(isnan(mt_fp16_to_float(mt_float_to_fp16(f))), "NaN 0x%04x lost", h);
    else
      CHECKF(mt_float_to_fp16(f) == h, "0x%04x does not round-trip", h);
  }
  CHECK(mt_fp16_to_float(0x3c00) == 1.0f);
  CHECK(mt_fp16_to_float(0x0001) == 0x1p-24f); /* smallest subnormal */
  CHECK(mt_fp16_to_float(0x7bff) == 65504.0f);
  CHECK(mt_fp16_to_float(0x7c00) == INFINITY);
  CHECK(mt_float_to_fp16(0x1p-25f) == 0x0000);            /* half a quantum: tie -> 0 */
  CHECK(mt_float_to_fp16(3 * 0x1p-25f) == 0x0002);        /* 1.5 quanta -> 2 */
  CHECK(mt_float_to_fp16(0x1p-14f - 0x1p-25f) == 0x0400); /* 1023.5 quanta -> smallest normal */
  CHECK(mt_float_to_fp16(65519.0f) == 0x7bff);
  CHECK(mt_float_to_fp16(65520.0f) == 0x7c00); /* the midpoint to 2^16 rounds to even: Inf */
  CHECK(mt_float_to_fp16(1e30f) == 0x7c00);
  CHECK(mt_float_to_fp16(-INFINITY) == 0xfc00);
  CHECK(mt_float_to_fp16(1.0f + 0x1p-11f) == 0x3c00);     /* tie, even: down */
  CHECK(mt_float_to_fp16(1.0f + 3 * 0x1p-11f) == 0x3c02); /* tie, odd: up */
#ifdef __FLT16_MAX__
  /* the compiler's own _Float16 conversion (libgcc / F16C) over a strided sweep */
  for (uint64_t u = 0; u < (1ull << 32); u += 4099) {
    float f = float_of((uint32_t)u);
    _Float16 g = (_Float16)f;
    uint16_t gb;
    memcpy(&gb, &g, sizeof gb);
    if (isnan(f))
      CHECK((mt_float_to_fp16(f) & 0x7fff) > 0x7c00);
    else
      CHECKF(mt_float_to_fp16(f) == gb, "0x%08x: 0x%04x, _Float16 0x%04x", (unsigned)u,
             mt_float_to_fp16(f), gb);
  }
#endif
}

/* ---- the outer scale -------------------------------------------------------------------- */

static void outer_scale_cases(void) {
  CHECK(mt_nvfp4_outer_scale(0.0f) == 1.0f);    /* an all-zero domain */
  CHECK(mt_nvfp4_outer_scale(2688.0f) == 1.0f); /* 448 * 6 / 2688 */
  CHECK(mt_nvfp4_outer_scale(1.0f) == 2688.0f);
  CHECK(mt_nvfp4_outer_scale(6.0f) == 448.0f);
  CHECK(mt_nvfp4_outer_scale(3.0f) == 896.0f);
  CHECK(same_bits(mt_nvfp4_outer_scale(7.0f), 2688.0f / 7.0f)); /* one FP32 division */
  CHECK(mt_nvfp4_outer_scale(1e-38f) == FLT_MAX);   /* 2688 / 1e-38 overflows: clamped */
  CHECK(mt_nvfp4_outer_scale(7.9e-36f) < FLT_MAX);  /* 2688/7.9e-36 = 3.4025e38: still finite */
  CHECK(mt_nvfp4_outer_scale(7.8e-36f) == FLT_MAX); /* 3.446e38 overflows: clamped */
  CHECK(isnan(mt_nvfp4_outer_scale(INFINITY)));
  CHECK(isnan(mt_nvfp4_outer_scale(NAN)));
}

/* ---- quantization ----------------------------------------------------------------------- */

static uint8_t code_at(const mt_nvfp4 *q, int r, int c) {
  uint8_t byte = q->codes[(size_t)r * (size_t)(q->cols / 2) + (size_t)(c / 2)];
  return (c % 2) ? byte >> 4 : byte & 0xf;
}

static uint8_t scale_at(const mt_nvfp4 *q, int r, int b) {
  return q->scales[(size_t)r * (size_t)(q->cols / 16) + (size_t)b];
}

/* Quantize one row of `cols` values with a per-row scale into *q (allocated here). */
static void quantize_row(const float *x, int cols, mt_nvfp4 *q) {
  CHECK(mt_nvfp4_alloc(q, 1, cols, MT_SCALE_ROW, MT_WBLOCK_1X16) == 0);
  mt_ref_quantize(x, (size_t)cols, q);
}

/* Every E2M1 tie and its neighbours through the whole quantizer. With the row amax 2688 * 2^-k,
 * S = 2^k exactly; a block whose amax is 1536 * 2^-k gets t = 1536 * 2^k * fl(1/6) / 2^k =
 * 256 * (1 + 2^-25), which rounds to 256 in FP32, so s_b = 256 (0x78) and c_b = 1/(256 * 2^-k) =
 * 2^(k-8): x * c_b is exact, and x = v * 2^(8-k) lands x * c_b exactly on v. */
static void quantize_e2m1_ties_exactly(void) {
  const float tie[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const int ks[4] = {0, 7, -20, 30};
  for (int ki = 0; ki < 4; ki++) {
    int k = ks[ki];
    float x[32];
    x[0] = ldexpf(2688.0f, -k); /* block 0: holds the row amax */
    for (int i = 1; i < 16; i++)
      x[i] = 0.0f;
    x[16] = ldexpf(1536.0f, -k); /* block 1: its amax, code 6 after scaling */
    for (int i = 0; i < 15; i++) {
      float v = tie[i % 7];
      if (i / 7 == 1)
        v = nextafterf(v, 0.0f); /* the FP32 just inside each tie */
      if (i / 7 == 2)
        v = nextafterf(v, 10.0f);
      x[17 + i] = ldexpf(i % 2 ? -v : v, 8 - k);
    }
    mt_nvfp4 q;
    quantize_row(x, 32, &q);
    CHECKF(q.outer[0] == ldexpf(1.0f, k), "k %d: S %a", k, q.outer[0]);
    CHECKF(scale_at(&q, 0, 1) == 0x78, "k %d: s_b 0x%02x", k, scale_at(&q, 0, 1));
    CHECK(code_at(&q, 0, 16) == 0x7);
    for (int i = 0; i < 15; i++) {
      float v = ldexpf(x[17 + i], k - 8); /* what x * c_b must be */
      CHECKF(code_at(&q, 0, 17 + i) == mt_e2m1_rne_satfinite(v), "k %d, %a", k, v);
      CHECKF(code_at(&q, 0, 17 + i) == e2m1_by_table(v), "k %d, %a", k, v);
    }
    mt_nvfp4_free(&q);
  }
}

static void quantize_all_zero_row(void) {
  float x[32] = {0};
  mt_nvfp4 q;
  quantize_row(x, 32, &q);
  CHECK(q.outer[0] == 1.0f); /* amax 0 -> S = 1 */
  for (int b = 0; b < 2; b++)
    CHECK(scale_at(&q, 0, b) == 0); /* amax_b = 0 -> s_b = e4m3(0) = 0 -> c_b = 0 */
  for (int i = 0; i < 16; i++)
    CHECK(q.codes[i] == 0);
  for (int c = 0; c < 32; c++)
    CHECK(same_bits(mt_ref_dequant(&q, 0, c), 0.0f));
  mt_nvfp4_free(&q);
}

static void quantize_negative_zero(void) {
  /* -0 in a zero block: c_b = 0 and -0 * 0 = -0 -> code 0x8. -0 in a live block: -0 * c_b = -0 ->
   * 0x8, dequantized -0. A tiny negative rounds to 0x8 as well. */
  float x[32] = {0};
  x[0] = -0.0f;
  x[16] = 1.0f;
  x[17] = -0.0f;
  x[18] = -1e-6f;
  mt_nvfp4 q;
  quantize_row(x, 32, &q);
  CHECK(code_at(&q, 0, 0) == 0x8 && code_at(&q, 0, 1) == 0x0);
  CHECK(code_at(&q, 0, 16) == 0x7);
  CHECK(code_at(&q, 0, 17) == 0x8 && code_at(&q, 0, 18) == 0x8);
  CHECK(mt_ref_dequant(&q, 0, 17) == 0.0f && signbit(mt_ref_dequant(&q, 0, 17)));
  mt_nvfp4_free(&q);
}

/* One huge value: x0 = BF16 0x7f62 = 0x1.c4p127 (3.004e38) and 1.0 elsewhere.
 *   S   = fl(2688 / 0x1.c4p127)           = 0x1.7c9a0ep-117 (8.95e-36)
 *   t_0 = fl(0x1.c4p127 * fl(S * fl(1/6))) = 0x1.c00002p8 (448.00003) -> saturates to 448 (0x7e)
 *   c_0 = 1 / fl(448 * fl(1/S))            = 0x1.b2f934p-126; x0 * c_0 = 6.0 exactly -> code 7
 *   1.0 * c_0 = 2e-38 -> code 0; block 1 (all 1.0): t = 1.49e-36 -> s_b = 0, c_b = 0, codes 0 */
static void quantize_one_huge_value(void) {
  float x[32];
  for (int i = 0; i < 32; i++)
    x[i] = 1.0f;
  x[0] = mt_bf16_to_float(0x7f62);
  mt_nvfp4 q;
  quantize_row(x, 32, &q);
  CHECKF(same_bits(q.outer[0], 0x1.7c9a0ep-117f), "S %a", q.outer[0]);
  CHECK(scale_at(&q, 0, 0) == 0x7e && scale_at(&q, 0, 1) == 0);
  CHECK(code_at(&q, 0, 0) == 0x7);
  for (int c = 1; c < 32; c++)
    CHECKF(code_at(&q, 0, c) == 0, "column %d", c);
  mt_nvfp4_free(&q);
}

/* BF16 subnormals (below 2^-126) in a row of ordinary amax vanish: with amax 1, S = 2688, a block
 * of subnormals has t ~ 2^-130 * 448 ~ 4e-37 -> s_b = 0 -> codes +-0. In the live block the
 * subnormal times c_b (~6) is far below .25 -> +-0. */
static void quantize_bf16_subnormals_in_normal_row(void) {
  float x[32];
  for (int i = 0; i < 32; i++)
    x[i] = mt_bf16_to_float((uint16_t)((i % 2 ? 0x8000 : 0) | (1 + i))); /* 1..32 * 2^-133 */
  x[0] = 1.0f;
  mt_nvfp4 q;
  quantize_row(x, 32, &q);
  CHECK(q.outer[0] == 2688.0f);
  CHECK(scale_at(&q, 0, 0) == 0x7e && scale_at(&q, 0, 1) == 0);
  for (int c = 1; c < 32; c++)
    CHECKF(code_at(&q, 0, c) == (c % 2 ? 0x8 : 0x0), "column %d: 0x%x", c, code_at(&q, 0, c));
  mt_nvfp4_free(&q);
}

/* A row made only of tiny values (amax 2^-126, the smallest BF16 normal): TE's FP32 steps leave
 * the usual range, and this case pins down what they give.
 *   S   = 2688 / 2^-126 overflows -> FLT_MAX;  S * fl(1/6) = 0x1.555554p+125
 *   t   = 2^-126 * 0x1.555554p125 = 0.6666665 -> E4M3 11/16 = 0.6875 (0x33)
 *   1/S = 2^-128 (a subnormal);  0.6875 * 2^-128 = 11 * 2^-132 (subnormal, exact)
 *   c_b = 2^132 / 11 = 4.9e38 > FLT_MAX -> +Inf
 * so every nonzero x gives x * Inf = +-Inf -> +-6, and x = 0 gives 0 * Inf = NaN -> +6 (code 7).
 * Kernels must keep denormals and divide exactly to reproduce it. */
static void quantize_tiny_row_overflows_coefficient(void) {
  float x[16] = {0};
  x[0] = 0x1p-126f;
  x[1] = -mt_bf16_to_float(0x0001); /* -2^-133 */
  x[2] = 0x1p-130f;
  x[3] = -0.0f;
  mt_nvfp4 q;
  quantize_row(x, 16, &q);
  CHECK(q.outer[0] == FLT_MAX);
  CHECKF(scale_at(&q, 0, 0) == 0x33, "s_b 0x%02x", scale_at(&q, 0, 0));
  CHECK(code_at(&q, 0, 0) == 0x7 && code_at(&q, 0, 1) == 0xf && code_at(&q, 0, 2) == 0x7);
  for (int c = 3; c < 16; c++) /* zeros of either sign: NaN -> +6 */
    CHECKF(code_at(&q, 0, c) == 0x7, "column %d: 0x%x", c, code_at(&q, 0, c));
  mt_nvfp4_free(&q);
}

/* Two rows where TE's order of FP32 operations decides the result (found by search; any other
 * order gives the other answer).
 * Row A: amax 736, second block amax 138.  S = fl(2688/736) = 0x1.d37a7p+1, fl(S * fl(1/6)) =
 *   0x1.37a6f6p-1, t = fl(138 * that) = 0x1.500002p+6 = 84.00001 -> E4M3 88 (0x6b); the order
 *   fl(fl(138 * S) * fl(1/6)) gives exactly 84, the tie between 80 and 88, -> 80 (0x6a).
 * Row B: amax 2.15625 (the only block), element 1.2578125. s_b = 448, fl(1/S) = 0x1.a4924ap-11,
 *   fl(448 * fl(1/S)) = 0x1.7p-2, c_b = fl(1 / that) = 0x1.642c86p+1 and x * c_b = 3.5 exactly: the
 *   tie 3 | 4 -> 4 (code 6). c_b = fl(S / 448) would be 0x1.642c84p+1, x * c_b = 3.4999998 -> 3. */
static void te_order_of_operations(void) {
  float a[32] = {0};
  a[0] = 736.0f;
  a[16] = 138.0f;
  mt_nvfp4 q;
  quantize_row(a, 32, &q);
  CHECKF(scale_at(&q, 0, 1) == 0x6b, "s_b 0x%02x", scale_at(&q, 0, 1));
  mt_nvfp4_free(&q);
  float b[16] = {0};
  b[0] = 2.15625f;
  b[7] = 1.2578125f;
  quantize_row(b, 16, &q);
  CHECK(scale_at(&q, 0, 0) == 0x7e);
  CHECKF(code_at(&q, 0, 7) == 0x6, "code 0x%x", code_at(&q, 0, 7));
  mt_nvfp4_free(&q);
}

static void packing_order(void) {
  /* Row amax 6 -> S = 448; block amax 6 -> t = fl(6 * fl(448 * fl(1/6))) = 448 -> s_b = 448,
   * 1/S = fl(1/448), c_b = 1/fl(448 * fl(1/448)) = 1: the codes are those of x itself. */
  const float x[16] = {0.5f, 1, 1.5f, 2, 3, 4, 6, 0, -0.5f, -1, -1.5f, -2, -3, -4, -6, 0};
  mt_nvfp4 q;
  quantize_row(x, 16, &q);
  CHECK(q.outer[0] == 448.0f && scale_at(&q, 0, 0) == 0x7e);
  /* element 2i low nibble, 2i+1 high nibble */
  const uint8_t want[8] = {0x21, 0x43, 0x65, 0x07, 0xa9, 0xcb, 0xed, 0x0f};
  for (int i = 0; i < 8; i++)
    CHECKF(q.codes[i] == want[i], "byte %d: 0x%02x, want 0x%02x", i, q.codes[i], want[i]);
  for (int c = 0; c < 16; c++)
    CHECK(mt_ref_dequant(&q, 0, c) == x[c] * 448.0f); /* e2m1 * s_b; the 1/S stays outside */
  mt_nvfp4_free(&q);
}

/* Rows with NaN or Inf: S = NaN, codes and scales all 0; the other rows exactly as alone. */
static void quantize_nan_inf_rows(void) {
  enum { R = 4, K = 32 };
  float x[R * K];
  for (int i = 0; i < R * K; i++)
    x[i] = rng_bf16(3.0f);
  x[1 * K + 5] = NAN;
  x[2 * K + 31] = -INFINITY;
  mt_nvfp4 q, alone;
  CHECK(mt_nvfp4_alloc(&q, R, K, MT_SCALE_ROW, MT_WBLOCK_1X16) == 0);
  memset(q.codes, 0xee, (size_t)R * K / 2); /* poison: every byte must be written */
  memset(q.scales, 0xee, (size_t)R * K / 16);
  mt_ref_quantize(x, K, &q);
  for (int r = 0; r < R; r++) {
    int bad = (r == 1 || r == 2);
    CHECKF(isnan(q.outer[r]) == bad, "row %d", r);
    quantize_row(x + r * K, K, &alone);
    for (int b = 0; b < K / 16; b++)
      CHECK(scale_at(&q, r, b) == (bad ? 0 : scale_at(&alone, 0, b)));
    for (int i = 0; i < K / 2; i++)
      CHECK(q.codes[r * K / 2 + i] == (bad ? 0 : alone.codes[i]));
    mt_nvfp4_free(&alone);
  }
  mt_nvfp4_free(&q);
  /* per tensor: one NaN poisons the whole matrix */
  CHECK(mt_nvfp4_alloc(&q, R, K, MT_SCALE_TENSOR, MT_WBLOCK_1X16) == 0);
  mt_ref_quantize(x, K, &q);
  CHECK(isnan(q.outer[0]));
  for (int i = 0; i < R * K / 2; i++)
    CHECK(q.codes[i] == 0);
  mt_nvfp4_free(&q);
}

static void per_tensor_vs_per_row(void) {
  enum { R = 3, K = 48 };
  float x[R * K];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < K; c++)
      x[r * K + c] = rng_bf16(r == 0 ? 100.0f : 0.01f);
  mt_nvfp4 row, tensor, alone;
  CHECK(mt_nvfp4_alloc(&row, R, K, MT_SCALE_ROW, MT_WBLOCK_1X16) == 0);
  CHECK(mt_nvfp4_alloc(&tensor, R, K, MT_SCALE_TENSOR, MT_WBLOCK_1X16) == 0);
  mt_ref_quantize(x, K, &row);
  mt_ref_quantize(x, K, &tensor);
  float amax = 0;
  for (int i = 0; i < R * K; i++)
    amax = fmaxf(amax, fabsf(x[i]));
  CHECK(same_bits(tensor.outer[0], mt_nvfp4_outer_scale(amax)));
  for (int r = 0; r < R; r++) {
    /* per row: row r's result is that of the row alone (batch invariance) */
    quantize_row(x + r * K, K, &alone);
    CHECK(same_bits(row.outer[r], alone.outer[0]));
    CHECK(!memcmp(row.scales + r * K / 16, alone.scales, K / 16));
    CHECK(!memcmp(row.codes + r * K / 2, alone.codes, K / 2));
    mt_nvfp4_free(&alone);
  }
  /* per tensor: the small rows share row 0's S, so they differ from their per-row result */
  CHECK(row.outer[1] > tensor.outer[0]);
  CHECK(memcmp(row.scales + K / 16, tensor.scales + K / 16, K / 16) != 0);
  mt_nvfp4_free(&row);
  mt_nvfp4_free(&tensor);
}

static void blocks_16x16(void) {
  enum { R = 32, K = 32 };
  float x[R * K];
  for (int i = 0; i < R * K; i++)
    x[i] = rng_bf16(1.0f);
  x[5 * K + 3] = 40.0f; /* the amax of tile (0, 0), in its row 5 */
  mt_nvfp4 q, rows;
  CHECK(mt_nvfp4_alloc(&q, R, K, MT_SCALE_TENSOR, MT_WBLOCK_16X16) == 0);
  CHECK(mt_nvfp4_alloc(&rows, R, K, MT_SCALE_TENSOR, MT_WBLOCK_1X16) == 0);
  mt_ref_quantize(x, K, &q);
  mt_ref_quantize(x, K, &rows);
  CHECK(same_bits(q.outer[0], rows.outer[0]) && q.outer[0] == 2688.0f / 40.0f);
  for (int tr = 0; tr < R / 16; tr++)
    for (int tc = 0; tc < K / 16; tc++) {
      /* the tile's scale is the largest of its rows' 1x16 scales (same S, same rounding) */
      uint8_t most = 0;
      for (int r = tr * 16; r < tr * 16 + 16; r++)
        most = scale_at(&rows, r, tc) > most ? scale_at(&rows, r, tc) : most;
      for (int r = tr * 16; r < tr * 16 + 16; r++)
        CHECKF(scale_at(&q, r, tc) == most, "tile (%d, %d) row %d", tr, tc, r);
    }
  CHECK(scale_at(&q, 0, 0) == scale_at(&rows, 5, 0) && scale_at(&rows, 0, 0) < scale_at(&q, 0, 0));
  /* codes of a row under the tile's scale: x * c_b with the tile's c_b */
  float inv = 1.0f / q.outer[0];
  volatile float decode = mt_e4m3_to_float(scale_at(&q, 0, 0)) * inv;
  float coef = 1.0f / decode;
  for (int c = 0; c < 16; c++)
    CHECK(code_at(&q, 0, c) == mt_e2m1_rne_satfinite(x[c] * coef));
  mt_nvfp4_free(&q);
  mt_nvfp4_free(&rows);
}

/* The row stride ld is honoured: a matrix inside a wider buffer quantizes as the compact one. */
static void quantize_row_stride(void) {
  enum { R = 3, K = 32, LD = 40 };
  float compact[R * K], wide[R * LD];
  for (int r = 0; r < R; r++)
    for (int c = 0; c < LD; c++) {
      wide[r * LD + c] = (c < K) ? rng_bf16(1.0f) : NAN; /* the padding must never be read */
      if (c < K)
        compact[r * K + c] = wide[r * LD + c];
    }
  for (int kind = 0; kind < 2; kind++) {
    mt_nvfp4 a, b;
    enum mt_scale outer = kind ? MT_SCALE_TENSOR : MT_SCALE_ROW;
    CHECK(mt_nvfp4_alloc(&a, R, K, outer, MT_WBLOCK_1X16) == 0);
    CHECK(mt_nvfp4_alloc(&b, R, K, outer, MT_WBLOCK_1X16) == 0);
    mt_ref_quantize(compact, K, &a);
    mt_ref_quantize(wide, LD, &b);
    CHECK(!memcmp(a.codes, b.codes, R * K / 2) && !memcmp(a.scales, b.scales, R * K / 16));
    CHECK(!memcmp(a.outer, b.outer, (kind ? 1 : R) * sizeof(float)) && !isnan(b.outer[0]));
    mt_nvfp4_free(&a);
    mt_nvfp4_free(&b);
  }
}

static void alloc_rejects_bad_shapes(void) {
  mt_nvfp4 q;
  CHECK(mt_nvfp4_alloc(&q, 16, 24, MT_SCALE_ROW, MT_WBLOCK_1X16) == -1); /* K % 16 */
  CHECK(mt_nvfp4_alloc(&q, 0, 16, MT_SCALE_ROW, MT_WBLOCK_1X16) == -1);
  CHECK(mt_nvfp4_alloc(&q, -16, 16, MT_SCALE_ROW, MT_WBLOCK_1X16) == -1);
  CHECK(mt_nvfp4_alloc(&q, 16, 16, MT_SCALE_ROW, MT_WBLOCK_16X16) == -1); /* tiles need tensor S */
  CHECK(mt_nvfp4_alloc(&q, 24, 16, MT_SCALE_TENSOR, MT_WBLOCK_16X16) == -1); /* rows % 16 */
  CHECK(q.codes == NULL && q.scales == NULL && q.outer == NULL);
  CHECK(mt_nvfp4_alloc(NULL, 16, 16, MT_SCALE_ROW, MT_WBLOCK_1X16) == -1);
  CHECK(mt_nvfp4_alloc(&q, 16, 16, MT_SCALE_TENSOR, MT_WBLOCK_16X16) == 0);
  mt_nvfp4_free(&q);
  mt_nvfp4_free(&q); /* twice is harmless */
}

/* Every (code, scale) product is exact in BF16 and FP16: at most 2 + 4 significant bits, within
 * [2^-10, 2688]. Checked exhaustively, then on quantized random data. */
static void dequant_exact_in_bf16_and_fp16(void) {
  for (int code = 0; code < 16; code++)
    for (int s = 0; s < 256; s++) {
      if ((s & 0x7f) == 0x7f)
        continue;
      float v = mt_e2m1_to_float((uint8_t)code) * mt_e4m3_to_float((uint8_t)s);
      CHECKF(same_bits(mt_bf16_to_float(mt_float_to_bf16(v)), v), "code %d scale 0x%02x", code, s);
      CHECKF(same_bits(mt_fp16_to_float(mt_float_to_fp16(v)), v), "code %d scale 0x%02x", code, s);
    }
  enum { R = 16, K = 256 };
  static float x[R * K];
  for (int i = 0; i < R * K; i++)
    x[i] = rng_bf16(ldexpf(1.0f, (int)(rng_next() % 40) - 20));
  mt_nvfp4 q;
  CHECK(mt_nvfp4_alloc(&q, R, K, MT_SCALE_ROW, MT_WBLOCK_1X16) == 0);
  mt_ref_quantize(x, K, &q);
  for (int r = 0; r < R; r++)
    for (int c = 0; c < K; c++) {
      float v = mt_ref_dequant(&q, r, c);
      CHECK(same_bits(mt_bf16_to_float(mt_float_to_bf16(v)), v));
      CHECK(same_bits(mt_fp16_to_float(mt_float_to_fp16(v)), v));
    }
  mt_nvfp4_free(&q);
}

/* ---- the reference GEMM ----------------------------------------------------------------- */

enum { GM = 5, GN = 7, GK = 64 };

static void make_operands(mt_nvfp4 *a, mt_nvfp4 *w, enum mt_scale w_outer, enum mt_wblock w_block,
                          float *xa, int wrows) {
  static float xw[16 * GK];
  for (int i = 0; i < GM * GK; i++)
    xa[i] = rng_bf16(2.0f);
  for (int i = 0; i < wrows * GK; i++)
    xw[i] = rng_bf16(0.05f);
  CHECK(mt_nvfp4_alloc(a, GM, GK, MT_SCALE_ROW, MT_WBLOCK_1X16) == 0);
  CHECK(mt_nvfp4_alloc(w, wrows, GK, w_outer, w_block) == 0);
  mt_ref_quantize(xa, GK, a);
  mt_ref_quantize(xw, GK, w);
}

/* The GEMM, computed directly: reversed K order (the sums are exact, so order cannot matter), the
 * epilogue spelled out. */
static double direct(const mt_nvfp4 *a, const mt_nvfp4 *w, int i, int j, float alpha) {
  double acc = 0;
  for (int k = GK - 1; k >= 0; k--)
    acc += (double)mt_ref_dequant(a, i, k) * (double)mt_ref_dequant(w, j, k);
  float inv_a = 1.0f / a->outer[i];
  float inv_w = 1.0f / w->outer[w->outer_kind == MT_SCALE_ROW ? j : 0];
  volatile float s = inv_a * inv_w;
  return acc * (double)s * (double)alpha;
}

static void gemm_against_direct(void) {
  const struct {
    enum mt_scale outer;
    enum mt_wblock block;
    int rows;
  } kinds[] = {{MT_SCALE_TENSOR, MT_WBLOCK_1X16, GN},
               {MT_SCALE_ROW, MT_WBLOCK_1X16, GN},
               {MT_SCALE_TENSOR, MT_WBLOCK_16X16, 16}};
  for (size_t kind = 0; kind < 3; kind++) {
    float xa[GM * GK], c[GM * 16], bias[16];
    mt_nvfp4 a, w;
    make_operands(&a, &w, kinds[kind].outer, kinds[kind].block, xa, kinds[kind].rows);
    int n = kinds[kind].rows;
    for (int i = 0; i < GM * 16; i++)
      c[i] = rng_bf16(1.0f);
    for (int j = 0; j < 16; j++)
      bias[j] = rng_bf16(1.0f);
    double y[GM * 16], y2[GM * 16];
    mt_ref_gemm(&a, &w, 1.5f, 0.0f, NULL, 0, NULL, y, 16);
    mt_ref_gemm(&a, &w, 1.5f, -0.25f, c, 16, bias, y2, 16);
    for (int i = 0; i < GM; i++)
      for (int j = 0; j < n; j++) {
        double want = direct(&a, &w, i, j, 1.5f);
        CHECKF(y[i * 16 + j] == want, "kind %zu (%d, %d): %a vs %a", kind, i, j, y[i * 16 + j],
               want);
        CHECK(y2[i * 16 + j] == want + -0.25 * (double)c[i * 16 + j] + (double)bias[j]);
        CHECK(mt_ref_gemm_abs(&a, &w, i, j) >= fabs(want / 1.5) * (1 - 1e-12));
      }
    double mag = 0;
    for (int i = 0; i < GM; i++)
      for (int j = 0; j < n; j++)
        mag += fabs(y[i * 16 + j]);
    CHECK(mag > 0); /* random data: not a product of zeros */
    mt_nvfp4_free(&a);
    mt_nvfp4_free(&w);
  }
}

static void gemm_nan_row_and_beta_zero(void) {
  float xa[GM * GK];
  mt_nvfp4 a, w;
  make_operands(&a, &w, MT_SCALE_TENSOR, MT_WBLOCK_1X16, xa, GN);
  xa[2 * GK + 7] = INFINITY; /* row 2 of the activations holds Inf */
  mt_ref_quantize(xa, GK, &a);
  float c[GM * GN];
  for (int i = 0; i < GM * GN; i++)
    c[i] = NAN; /* beta == 0: C must not be read, so its NaNs must not appear */
  double y[GM * GN];
  mt_ref_gemm(&a, &w, 1.0f, 0.0f, c, GN, NULL, y, GN);
  for (int i = 0; i < GM; i++)
    for (int j = 0; j < GN; j++)
      CHECKF(isnan(y[i * GN + j]) == (i == 2), "(%d, %d): %g", i, j, y[i * GN + j]);
  /* beta != 0 reads C */
  mt_ref_gemm(&a, &w, 1.0f, 1.0f, c, GN, NULL, y, GN);
  CHECK(isnan(y[0]));
  mt_nvfp4_free(&a);
  mt_nvfp4_free(&w);
}

int main(void) {
  fill_tables();
  RUN(e2m1_values_and_ties);
  RUN(e2m1_saturation_sign_and_nan);
  RUN(e2m1_sweep_against_table);
  RUN(e4m3_decode);
  RUN(e4m3_rounding_cases);
  RUN(e4m3_sweep_against_table);
  RUN(conversions_against_cuda_headers);
  RUN(bf16_conversions);
  RUN(fp16_conversions);
  RUN(outer_scale_cases);
  RUN(quantize_e2m1_ties_exactly);
  RUN(quantize_all_zero_row);
  RUN(quantize_negative_zero);
  RUN(quantize_one_huge_value);
  RUN(quantize_bf16_subnormals_in_normal_row);
  RUN(quantize_tiny_row_overflows_coefficient);
  RUN(te_order_of_operations);
  RUN(packing_order);
  RUN(quantize_nan_inf_rows);
  RUN(per_tensor_vs_per_row);
  RUN(blocks_16x16);
  RUN(quantize_row_stride);
  RUN(alloc_rejects_bad_shapes);
  RUN(dequant_exact_in_bf16_and_fp16);
  RUN(gemm_against_direct);
  RUN(gemm_nan_row_and_beta_zero);
  return mt_test_done();
}
