/* gpu_test.h — what the GPU test programs share: random numbers, the GPU plumbing (a test without
 * an sm_90 GPU is skipped, every CUDA status checked, outputs poisoned), the input generators (rows
 * of every kind the quantizer must get right) and the GEMM bound's absolute sums (test_kernels.c's
 * header derives the bound). Static functions: each test program includes it once. */
#ifndef MT_TESTS_GPU_TEST_H
#define MT_TESTS_GPU_TEST_H

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "kernels/engine.h"
#include "kernels/wstore.h"
#include "ref/nvfp4.h"
#include "tests/harness.h"

/* ---- random numbers ------------------------------------------------------------------------ */

static uint64_t rng_state;

static uint64_t rnd(void) { /* xorshift64* */
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * 0x2545F4914F6CDD1DULL;
}

/* Seed from MT_TEST_SEED, else the clock; the seed is printed, so a failing run can be repeated. */
static void seed_rng(void) {
  const char *seed_env = getenv("MT_TEST_SEED");
  uint64_t seed = seed_env ? strtoull(seed_env, NULL, 0) : (uint64_t)time(NULL) ^ (uint64_t)clock();
  printf("seed %llu (MT_TEST_SEED repeats it)\n", (unsigned long long)seed);
  rng_state = seed * 2654435761ULL + 0x9E3779B97F4A7C15ULL;
}

static int rnd_below(int n) { return (int)(rnd() % (uint64_t)n); }

static float rnd_unit(void) { return (float)(rnd() >> 40) * 0x1p-24f; } /* [0, 1) */

/* ---- GPU plumbing -------------------------------------------------------------------------- */

static int gpu_state = -1; /* -1 unknown, 0 none, 1 usable */

static int have_gpu(void) {
  if (gpu_state < 0) {
    int count = 0;
    struct cudaDeviceProp prop;
    gpu_state = cudaGetDeviceCount(&count) == cudaSuccess && count > 0 &&
                cudaGetDeviceProperties(&prop, 0) == cudaSuccess && prop.major == 9 &&
                prop.minor == 0 && cudaSetDevice(0) == cudaSuccess && cudaFree(0) == cudaSuccess;
  }
  return gpu_state;
}

#define NEED_GPU()                                                                                 \
  do {                                                                                             \
    if (!have_gpu())                                                                               \
      SKIP("no sm_90 GPU");                                                                        \
  } while (0)

/* A failed CUDA call ends the test as failed (the caller returns). */
#define CU(call)                                                                                   \
  do {                                                                                             \
    cudaError_t cu_err_ = (call);                                                                  \
    CHECKF(cu_err_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(cu_err_));                  \
    if (cu_err_ != cudaSuccess)                                                                    \
      goto out;                                                                                    \
  } while (0)

#define MT(call)                                                                                   \
  do {                                                                                             \
    int mt_st_ = (call);                                                                           \
    CHECKF(mt_st_ == MT_OK, "%s: %s", #call, mt_status_name((enum mt_status)mt_st_));              \
    if (mt_st_ != MT_OK)                                                                           \
      goto out;                                                                                    \
  } while (0)

/* Device buffers of one test, freed together. A buffer that cannot be had is a failed check, so
 * that a caller that gives up on NULL never skips its checks silently. */
#define MAX_BUFS 64
static void *bufs[MAX_BUFS];
static int nbufs;

static void *dev_alloc(size_t bytes) {
  void *p = NULL;
  CHECKF(nbufs < MAX_BUFS, "more than %d device buffers in one test (dev_free_all frees them)",
         MAX_BUFS);
  if (nbufs == MAX_BUFS)
    return NULL;
  const cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
  CHECKF(e == cudaSuccess, "cudaMalloc(%zu): %s", bytes, cudaGetErrorString(e));
  if (e != cudaSuccess)
    return NULL;
  bufs[nbufs++] = p;
  return p;
}

static void dev_free_all(void) {
  for (int i = 0; i < nbufs; i++)
    cudaFree(bufs[i]);
  nbufs = 0;
}

static int poison(void *p, size_t bytes) {
  return cudaMemset(p, 1 + rnd_below(255), bytes) == cudaSuccess;
}

/* Launch errors surface at the next synchronisation: check both. */
static cudaError_t sync_check(void) {
  cudaError_t e = cudaGetLastError();
  return e != cudaSuccess ? e : cudaDeviceSynchronize();
}

static uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

/* ---- inputs -------------------------------------------------------------------------------- */

static uint16_t to_half(float f, int fp16) {
  return fp16 ? mt_float_to_fp16(f) : mt_float_to_bf16(f);
}
static float from_half(uint16_t h, int fp16) {
  return fp16 ? mt_fp16_to_float(h) : mt_bf16_to_float(h);
}

/* A random finite normal value of the type, |x| in about [2^lo, 2^hi). */
static uint16_t rnd_value(int fp16, int lo, int hi) {
  float m = 1.0f + rnd_unit();
  float v = ldexpf(m, lo + rnd_below(hi - lo));
  return to_half((rnd() & 1) ? -v : v, fp16);
}

enum row_kind {
  ROW_RANDOM,    /* values over a few binades */
  ROW_WIDE,      /* every binade of the type: zero and subnormal E4M3 scales */
  ROW_TIES,      /* S = 2^j and s_b = 2^p, so x * c_b lands exactly on E2M1 midpoints */
  ROW_ZEROS,     /* +0 and -0 only */
  ROW_ZERO_BLKS, /* random, with all-zero blocks */
  ROW_SUBNORMAL, /* subnormals of the input type and zeros: S clamps, c_b overflows (BF16) */
  ROW_TINY,      /* normal but below 2688 / FLT_MAX (BF16): S = FLT_MAX */
  ROW_HUGE,      /* near the type's largest value */
  ROW_NAN,       /* one NaN */
  ROW_INF,       /* one +-Inf */
  ROW_KINDS
};

static const float tie_points[] = {0.0f, 0.25f, 0.5f, 0.75f, 1.0f, 1.25f, 1.5f, 1.75f,
                                   2.0f, 2.5f,  3.0f, 3.5f,  4.0f, 5.0f,  6.0f};

/* Fill one row of `cols` halves. tie_j: the exponent j of S = 2^j the ties rows are built for (the
 * row or the whole matrix holds 2688 * 2^-j as its amax); tie_p: the block exponent p of s_b. */
static void fill_row(uint16_t *row, int cols, int fp16, enum row_kind kind, int tie_j,
                     const int *tie_p) {
  int max_exp = fp16 ? 15 : 127;
  for (int c = 0; c < cols; c++) {
    uint16_t h = 0;
    switch (kind) {
    case ROW_RANDOM:
      h = rnd_value(fp16, -4, 4);
      break;
    case ROW_WIDE:
      h = fp16 ? (uint16_t)(rnd() % 0x7c00u) : (uint16_t)(rnd() % 0x7f80u);
      h |= (uint16_t)((rnd() & 1) << 15);
      break;
    case ROW_TIES: {
      int p = tie_p[c / 16];
      float t = tie_points[rnd_below((int)(sizeof tie_points / sizeof tie_points[0]))];
      if (c % 16 == 0)
        t = 6.0f; /* the block's amax: s_b = e4m3(6 * 2^p * (1/6)) = 2^p */
      float v = ldexpf(t, p - tie_j);
      h = to_half((rnd() & 1) ? -v : v, fp16);
      break;
    }
    case ROW_ZEROS:
      h = (uint16_t)((rnd() & 1) << 15);
      break;
    case ROW_ZERO_BLKS:
      h = (c / 16) % 3 == 1 ? (uint16_t)((rnd() & 1) << 15) : rnd_value(fp16, -3, 3);
      break;
    case ROW_SUBNORMAL:
      h = rnd_below(3) == 0 ? 0 : (uint16_t)(1 + rnd() % (fp16 ? 0x3ffu : 0x7fu));
      h |= (uint16_t)((rnd() & 1) << 15);
      break;
    case ROW_TINY:
      h = fp16 ? rnd_value(1, -14, -12) : rnd_value(0, -126, -118);
      break;
    case ROW_HUGE:
      h = rnd_value(fp16, max_exp - 3, max_exp);
      break;
    case ROW_NAN:
    case ROW_INF:
    case ROW_KINDS:
      h = rnd_value(fp16, -4, 4);
      break;
    }
    row[c] = h;
  }
  if (kind == ROW_TIES) /* the row's amax 2688 * 2^-j: S = 2^j, and block 0 saturates to 448 */
    row[0] = to_half(ldexpf(2688.0f, -tie_j), fp16);
  if (kind == ROW_NAN)
    row[rnd_below(cols)] = fp16 ? 0x7e00 : 0x7fc0;
  if (kind == ROW_INF)
    row[rnd_below(cols)] = (uint16_t)((fp16 ? 0x7c00 : 0x7f80) | ((rnd() & 1) << 15));
}

/* rows x cols in a row stride ld; the padding holds NaN, so reading it would show. kinds: the row
 * kinds to cycle through (shuffled). For 16x16 tiles, tie exponents are shared by a tile. */
static uint16_t *make_matrix(int rows, int cols, size_t ld, int fp16, const enum row_kind *kinds,
                             int nkinds, int tile16) {
  uint16_t *x = malloc((size_t)rows * ld * sizeof *x);
  int *tie_p = malloc((size_t)(cols / 16) * sizeof *tie_p);
  int tie_j = rnd_below(11);
  for (int r = 0; r < rows; r++) {
    if (!tile16 || r % 16 == 0)
      for (int b = 0; b < cols / 16; b++)
        tie_p[b] = -9 + rnd_below(18); /* s_b from E4M3's smallest subnormal to 256 */
    enum row_kind kind = kinds[rnd_below(nkinds)];
    if (tile16 && kinds[0] == ROW_TIES)
      kind = ROW_TIES;
    fill_row(x + (size_t)r * ld, cols, fp16, kind, tie_j, tie_p);
    for (size_t c = (size_t)cols; c < ld; c++)
      x[(size_t)r * ld + c] = fp16 ? 0x7e00 : 0x7fc0;
  }
  free(tie_p);
  return x;
}

static int same_float(float a, float b) {
  return (isnan(a) && isnan(b)) || float_bits(a) == float_bits(b);
}

static const enum row_kind finite_kinds[] = {ROW_RANDOM,    ROW_WIDE,      ROW_TIES, ROW_ZEROS,
                                             ROW_ZERO_BLKS, ROW_SUBNORMAL, ROW_TINY, ROW_HUGE};
static const enum row_kind all_kinds[] = {ROW_RANDOM,    ROW_WIDE,      ROW_TIES, ROW_ZEROS,
                                          ROW_ZERO_BLKS, ROW_SUBNORMAL, ROW_TINY, ROW_HUGE,
                                          ROW_NAN,       ROW_INF};
#define NKINDS(a) ((int)(sizeof(a) / sizeof((a)[0])))

static size_t rnd_ld(int cols) {
  return (size_t)cols + (rnd() & 1 ? 8u * (size_t)(1 + rnd_below(5)) : 0u);
}

static float out_value(const void *y, size_t i, enum mt_dtype t) {
  uint16_t h = ((const uint16_t *)y)[i];
  return t == MT_DTYPE_FP16 ? mt_fp16_to_float(h) : mt_bf16_to_float(h);
}

/* sum_k |a[i][k] * w[j][k]| * |(1/S_a[i]) * (1/S_w[j])| for every (i, j): mt_ref_gemm_abs, from
 * dequantized copies (mt_ref_gemm_abs per element would double the reference's cost). */
static double *abs_sums(const mt_nvfp4 *a, const mt_nvfp4 *w) {
  int m = a->rows, n = w->rows, k = a->cols;
  float *ad = malloc((size_t)m * k * sizeof *ad), *wd = malloc((size_t)n * k * sizeof *wd);
  double *out = malloc((size_t)m * n * sizeof *out);
  for (int i = 0; i < m; i++)
    for (int c = 0; c < k; c++)
      ad[(size_t)i * k + c] = fabsf(mt_ref_dequant(a, i, c));
  for (int j = 0; j < n; j++)
    for (int c = 0; c < k; c++)
      wd[(size_t)j * k + c] = fabsf(mt_ref_dequant(w, j, c));
  for (int i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      double acc = 0;
      for (int c = 0; c < k; c++)
        acc += (double)ad[(size_t)i * k + c] * wd[(size_t)j * k + c];
      double sa = a->outer[a->outer_kind == MT_SCALE_ROW ? i : 0];
      double sw = w->outer[w->outer_kind == MT_SCALE_ROW ? j : 0];
      out[(size_t)i * n + j] = acc / fabs(sa * sw);
    }
  free(ad);
  free(wd);
  return out;
}

/* One slice of the weight store (kernels/wstore.h) against the reference quantization of its
 * weight: every record of the layout read back (lane 4g + q's code word: mt_ws_word of code bytes
 * q and q + 4 of row 8H + g's blocks 2P and 2P + 1; row g's scale bytes at 128 + 2g:
 * mt_ws_scale_byte of the reference scales), rows past `rows` and blocks past cols / 16 zero
 * records, and S after the records. Returns the number of wrong words, bytes and floats (the
 * first one reported). */
static long check_store(const uint8_t *slice, const mt_nvfp4 *ref) {
  const int rows = ref->rows, cols = ref->cols;
  const size_t pairs = MT_WS_PAIRS(cols), nblk = (size_t)cols / 16, groups = MT_WS_BAND / 8;
  const size_t rows_pad = MT_WS_BANDS(rows) * MT_WS_BAND;
  long bad = 0;
  for (size_t r = 0; r < rows_pad; r++)
    for (size_t P = 0; P < pairs; P++) {
      const uint8_t *at =
          slice + ((r / MT_WS_BAND * pairs + P) * groups + (r / 8) % groups) * MT_WS_REC;
      const size_t g = r % 8;
      /* code byte q of block b (zero past the weight) */
      uint8_t code[2][8];
      for (int half = 0; half < 2; half++) {
        size_t b = 2 * P + (size_t)half;
        int real = r < (size_t)rows && b < nblk;
        for (int q = 0; q < 8; q++)
          code[half][q] = real ? ref->codes[r * (size_t)cols / 2 + b * 8 + (size_t)q] : 0;
        uint8_t got_s = at[128 + 2 * g + (size_t)half];
        uint32_t want_s =
            real ? mt_ws_scale_byte(float_bits(mt_e4m3_to_float(ref->scales[r * nblk + b]))) : 0;
        if (got_s != want_s && bad++ == 0)
          CHECKF(0, "store scale byte (row %zu, block %zu) = %02x, reference %02x", r, b, got_s,
                 want_s);
      }
      for (int q = 0; q < 4; q++) {
        uint32_t got,
            want = mt_ws_word(code[0][q] | (uint32_t)code[0][q + 4] << 8 |
                              (uint32_t)code[1][q] << 16 | (uint32_t)code[1][q + 4] << 24);
        memcpy(&got, at + 16 * g + 4 * (size_t)q, 4);
        if (got != want && bad++ == 0)
          CHECKF(0, "store code word (row %zu, pair %zu, lane %zu) = %08x, reference %08x", r, P,
                 4 * g + (size_t)q, got, want);
      }
    }
  const float *outer = (const float *)(slice + MT_WS_SECTION(MT_WS_RECORD_BYTES(rows, cols)));
  const int nouter = ref->outer_kind == MT_SCALE_ROW ? rows : 1;
  for (int i = 0; i < nouter; i++)
    if (!same_float(outer[i], ref->outer[i]) && bad++ == 0)
      CHECKF(0, "store S[%d] = %a, reference %a", i, outer[i], ref->outer[i]);
  return bad;
}

/* The outputs y[i][j] (i < a->rows, j < ldy; row stride ldy, BF16 or FP16) of a W4A4 GEMM of the
 * quantized operands a and w against mt_ref_gemm within the bound of test_kernels.c's header: y0
 * holds what y held before (columns past w->rows must still hold it), cf and biasf C and the bias
 * as floats (NULL: none), rows where nan_row[i] (NULL: none) or the reference is NaN must be NaN.
 * Returns the outputs outside the bound and adds to *worst (largest error / bound), *pad (padding
 * written) and *nan (NaN rows not NaN); the first of each is reported. */
typedef struct {
  double worst;
  long bad, pad, nan;
} out_check;

static void check_outputs(const mt_nvfp4 *a, const mt_nvfp4 *w, const uint16_t *y,
                          const uint16_t *y0, size_t ldy, enum mt_dtype ytype, float alpha,
                          float beta, const float *cf, const float *biasf, const char *nan_row,
                          out_check *oc) {
  const int m = a->rows, n = w->rows;
  double *ref = malloc((size_t)m * ldy * sizeof *ref), *abs_all = abs_sums(a, w);
  mt_ref_gemm(a, w, alpha, beta, cf, ldy, biasf, ref, ldy);
  const double u = ytype == MT_DTYPE_FP16 ? 0x1p-11 : 0x1p-8,
               tiny = ytype == MT_DTYPE_FP16 ? 0x1p-24 : 0x1p-133;
  for (int i = 0; i < m; i++)
    for (size_t j = 0; j < ldy; j++) {
      size_t at = (size_t)i * ldy + j;
      if (j >= (size_t)n) { /* padding past n: untouched */
        oc->pad += y[at] != y0[at];
        continue;
      }
      float got = out_value(y, at, ytype);
      if ((nan_row && nan_row[i]) || isnan(ref[at])) {
        if (!isnan(got) && oc->nan++ == 0)
          CHECKF(0, "y[%d][%zu] = %g, want NaN (NaN row)", i, j, got);
        continue;
      }
      double abs_sum = abs_all[(size_t)i * n + j] * fabs((double)alpha), side = 0;
      if (beta != 0.0f)
        side += fabs((double)beta * cf[at]);
      if (biasf)
        side += fabs((double)biasf[j]);
      double err32 = ((double)a->cols / 16 + 4) * 0x1p-23 * abs_sum + 0x1p-22 * side;
      double bound = err32 + u * (fabs(ref[at]) + err32) + tiny, err = fabs((double)got - ref[at]);
      if (!(err <= bound) && oc->bad++ == 0)
        CHECKF(0, "y[%d][%zu] = %.9g, reference %.9g, error %.3g > bound %.3g", i, j, got, ref[at],
               err, bound);
      if (bound > 0 && err / bound > oc->worst)
        oc->worst = err / bound;
    }
  free(ref);
  free(abs_all);
}

#endif
