/* test_kernels.c — GPU tests of the engine (kernels/): quantization bit for bit against the CPU
 * reference (ref/nvfp4.c), the W4A4 GEMM against mt_ref_gemm within the FP32-accumulation bound,
 * bitwise batch invariance, strides, epilogue variants, NaN rows, and the argument checks.
 *
 * Fresh random inputs every run (the seed is printed; MT_TEST_SEED=N repeats a run); every output
 * buffer is poisoned with a random byte before each launch, so an element never written cannot
 * pass; every CUDA status is checked. Without an sm_90 GPU the GPU tests report skipped.
 * Uses the CUDA runtime for allocation and copies (the engine itself uses only the driver table).
 *
 * GEMM accuracy bound (docs/numerics.md, "What the tests mean by ... within the bound"). Every
 * dequantized element e2m1 * s_b is exact in BF16 and every product of two is exact in FP32. Within
 * one 16-element K block both operands share their block scales, so the block's sum is s_a * s_w *
 * sum(q_a * q_w): the code products are multiples of 1/4 up to 36, sixteen of them fit in 12 bits,
 * and s_a * s_w (E4M3 significands, 4 bits each) adds at most 8: at most 20 significant bits, exact
 * in FP32 however the tensor core adds them.
 * Only the K/16 additions of block sums into the FP32 accumulator round, each by at most one unit
 * in the last place of the running sum (2^-23 relative: tensor cores may truncate), so
 *     |acc - exact| <= (K/16) * 2^-23 * sum_k |products|.
 * The epilogue adds four FP32 roundings (1/S_a, 1/S_w, their product and the two multiplies are
 * 2^-24 each; we allow 4 * 2^-23), the beta*C and bias terms two more of their own size, and the
 * final cast to the output type half an ulp: at most u = 2^-8 of the value for BF16 (8 significant
 * bits), 2^-11 for FP16, plus half the smallest subnormal. Hence, with A = mt_ref_gemm_abs*|alpha|:
 *     |y - ref| <= (K/16 + 4) * 2^-23 * A + 2^-22 * (|beta*C| + |bias|) + u * (|ref| + err) + tiny
 * where err is the FP32 part before it. In practice the output rounding dominates: the worst case
 * seen is about 0.99 of this bound (a half-ulp at the bottom of a binade), the FP32 part is tiny.
 */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/driver.h"
#include "kernels/engine.h"
#include "kernels/gemm_args.h"
#include "kernels/quant.h"
#include "ref/nvfp4.h"
#include "tests/harness.h"

#include "tests/gpu/gpu_test.h"

/* ---- quantization -------------------------------------------------------------------------- */

typedef struct {
  int rows, cols;
  size_t ld;
  int fp16;
  enum mt_scale outer;
  int tile16;
} qcase;

/* Quantize x on the GPU (with and without codes and scales, and into the weight store) and
 * compare every output with mt_ref_quantize. */
static void check_quant(const qcase *qc, const uint16_t *x) {
  size_t rows = (size_t)qc->rows, cols = (size_t)qc->cols,
         nouter = qc->outer == MT_SCALE_ROW ? rows : 1;
  float *xf = malloc(rows * qc->ld * sizeof *xf);
  uint16_t *xhat = malloc(rows * cols * 2), *xhat2 = malloc(rows * cols * 2);
  uint8_t *codes = malloc(rows * cols / 2), *scales = malloc(rows * cols / 16);
  float *outer_h = malloc(nouter * sizeof(float)), *outer2 = malloc(nouter * sizeof(float));
  uint8_t *rec_h = NULL;
  mt_nvfp4 ref;
  int ok_alloc = mt_nvfp4_alloc(&ref, qc->rows, qc->cols, qc->outer,
                                qc->tile16 ? MT_WBLOCK_16X16 : MT_WBLOCK_1X16) == 0;
  CHECK(ok_alloc);
  if (!ok_alloc)
    goto out;
  for (size_t i = 0; i < rows * qc->ld; i++)
    xf[i] = from_half(x[i], qc->fp16);
  mt_ref_quantize(xf, qc->ld, &ref);

  void *dx = dev_alloc(rows * qc->ld * 2), *dxhat = dev_alloc(rows * cols * 2);
  void *dcodes = dev_alloc(rows * cols / 2), *dscales = dev_alloc(rows * cols / 16);
  void *douter = dev_alloc((nouter + 1) * sizeof(float));
  CHECK(dx && dxhat && dcodes && dscales && douter);
  if (!(dx && dxhat && dcodes && dscales && douter))
    goto out;
  CU(cudaMemcpy(dx, x, rows * qc->ld * 2, cudaMemcpyHostToDevice));
  mt_quant_params p = {
      .x = dx,
      .ldx = (int64_t)qc->ld,
      .rows = qc->rows,
      .cols = qc->cols,
      .fp16 = qc->fp16,
      .row_outer = qc->outer == MT_SCALE_ROW,
      .xhat = dxhat,
      .codes = dcodes,
      .scales = dscales,
      .outer = douter,
      .amax = (uint32_t *)douter + nouter,
  };
  CHECK(poison(dxhat, rows * cols * 2) && poison(dcodes, rows * cols / 2) &&
        poison(dscales, rows * cols / 16) && poison(douter, (nouter + 1) * sizeof(float)));
  MT(mt_quantize(&p, qc->tile16, NULL));
  CU(sync_check());
  CU(cudaMemcpy(xhat, dxhat, rows * cols * 2, cudaMemcpyDeviceToHost));
  CU(cudaMemcpy(codes, dcodes, rows * cols / 2, cudaMemcpyDeviceToHost));
  CU(cudaMemcpy(scales, dscales, rows * cols / 16, cudaMemcpyDeviceToHost));
  CU(cudaMemcpy(outer_h, douter, nouter * sizeof(float), cudaMemcpyDeviceToHost));

  /* The hot path: no codes, no scales; xhat and S must not change. */
  p.codes = NULL;
  p.scales = NULL;
  CHECK(poison(dxhat, rows * cols * 2) && poison(douter, (nouter + 1) * sizeof(float)));
  MT(mt_quantize(&p, qc->tile16, NULL));
  CU(sync_check());
  CU(cudaMemcpy(xhat2, dxhat, rows * cols * 2, cudaMemcpyDeviceToHost));
  CU(cudaMemcpy(outer2, douter, nouter * sizeof(float), cudaMemcpyDeviceToHost));

  long bad_rec = 0;
  if (!qc->tile16 || qc->outer == MT_SCALE_TENSOR) { /* the store: the same codes, scales and S */
    size_t rec_bytes = MT_WS_SLICE_BYTES(rows, cols, qc->outer == MT_SCALE_ROW);
    rec_h = malloc(rec_bytes);
    void *drec = dev_alloc(rec_bytes);
    CHECK(rec_h && drec);
    if (!rec_h || !drec)
      goto out;
    p.xhat = NULL;
    p.store = drec;
    p.slice_bytes = (int64_t)rec_bytes;
    p.batch_rows = qc->rows;
    CHECK(poison(drec, rec_bytes));
    MT(mt_quantize(&p, qc->tile16, NULL));
    CU(sync_check());
    CU(cudaMemcpy(rec_h, drec, rec_bytes, cudaMemcpyDeviceToHost));
    bad_rec = check_store(rec_h, &ref);
  }

  long bad_codes = 0, bad_scales = 0, bad_outer = 0, bad_xhat = 0, bad_hot = 0;
  for (size_t i = 0; i < nouter; i++) {
    if (!same_float(outer_h[i], ref.outer[i]) && bad_outer++ == 0)
      CHECKF(0, "S[%zu] = %a, reference %a", i, outer_h[i], ref.outer[i]);
    bad_hot += !same_float(outer2[i], outer_h[i]);
  }
  for (size_t i = 0; i < rows * cols / 2; i++)
    if (codes[i] != ref.codes[i] && bad_codes++ == 0)
      CHECKF(0, "codes byte (row %zu, col %zu) = %02x, reference %02x", i / (cols / 2),
             2 * (i % (cols / 2)), codes[i], ref.codes[i]);
  for (size_t i = 0; i < rows * cols / 16; i++)
    if (scales[i] != ref.scales[i] && bad_scales++ == 0)
      CHECKF(0, "scale (row %zu, block %zu) = %02x, reference %02x", i / (cols / 16),
             i % (cols / 16), scales[i], ref.scales[i]);
  for (size_t r = 0; r < rows; r++)
    for (size_t c = 0; c < cols; c++) {
      uint16_t want = mt_float_to_bf16(mt_ref_dequant(&ref, (int)r, (int)c));
      uint16_t got = xhat[r * cols + c];
      if (got != want && bad_xhat++ == 0)
        CHECKF(0, "xhat[%zu][%zu] = %04x, reference %04x (x = %04x)", r, c, got, want,
               x[r * qc->ld + c]);
      bad_hot += xhat2[r * cols + c] != got;
    }
  CHECKF(!bad_codes && !bad_scales && !bad_outer && !bad_xhat && !bad_hot && !bad_rec,
         "%dx%d ld %zu %s %s %s: %ld codes, %ld scales, %ld S, %ld xhat differ; %ld hot-path "
         "differences; %ld in the store",
         qc->rows, qc->cols, qc->ld, qc->fp16 ? "fp16" : "bf16", mt_scale_name(qc->outer),
         qc->tile16 ? "16x16" : "1x16", bad_codes, bad_scales, bad_outer, bad_xhat, bad_hot,
         bad_rec);
out:
  mt_nvfp4_free(&ref);
  free(xf);
  free(xhat);
  free(xhat2);
  free(codes);
  free(scales);
  free(outer_h);
  free(outer2);
  free(rec_h);
  dev_free_all();
}

static void run_quant(int rows, int cols, size_t ld, int fp16, enum mt_scale outer, int tile16,
                      const enum row_kind *kinds, int nkinds) {
  qcase qc = {rows, cols, ld, fp16, outer, tile16};
  uint16_t *x = make_matrix(rows, cols, ld, fp16, kinds, nkinds, tile16);
  check_quant(&qc, x);
  free(x);
}

/* Per-row S, 1x16: the activations' hot path, every row kind, K across the kernel variants: few
 * rows (one block per thread up to K = 8192, then 2, 4, 8) and many (2, 4 or 8 per thread). */
static void quant_row_scale(void) {
  NEED_GPU();
  static const int ks[] = {16, 48, 256, 512, 768, 2048, 4096, 7168, 12288, 24576, 40960};
  for (int fp16 = 0; fp16 < 2; fp16++)
    for (int i = 0; i < NKINDS(ks); i++) {
      run_quant(ks[i] > 8192 ? 37 : 301, ks[i], rnd_ld(ks[i]), fp16, MT_SCALE_ROW, 0, all_kinds,
                NKINDS(all_kinds));
      run_quant(513 + rnd_below(300), ks[i], rnd_ld(ks[i]), fp16, MT_SCALE_ROW, 0, all_kinds,
                NKINDS(all_kinds));
    }
}

/* Exact E2M1 midpoints everywhere: every tie rule of the reference, with S = 2^j per row. */
static void quant_ties(void) {
  NEED_GPU();
  static const enum row_kind ties[] = {ROW_TIES};
  for (int fp16 = 0; fp16 < 2; fp16++) {
    run_quant(256, 512, 512, fp16, MT_SCALE_ROW, 0, ties, 1);
    run_quant(256, 512, 520, fp16, MT_SCALE_TENSOR, 0, ties, 1); /* one j for the matrix */
    run_quant(64, 512, 512, fp16, MT_SCALE_TENSOR, 1, ties, 1);
  }
}

/* One S for the matrix: an amax pass first; a NaN or Inf anywhere zeroes everything. */
static void quant_tensor_scale(void) {
  NEED_GPU();
  static const int ks[] = {16, 96, 2048, 7168};
  static const enum row_kind nan_rows[] = {ROW_RANDOM, ROW_NAN};
  static const enum row_kind inf_rows[] = {ROW_RANDOM, ROW_INF};
  for (int fp16 = 0; fp16 < 2; fp16++)
    for (int i = 0; i < NKINDS(ks); i++) {
      for (int kind = 0; kind < NKINDS(finite_kinds); kind++) /* one kind: its own extremes */
        run_quant(33, ks[i], rnd_ld(ks[i]), fp16, MT_SCALE_TENSOR, 0, &finite_kinds[kind], 1);
      run_quant(300, ks[i], rnd_ld(ks[i]), fp16, MT_SCALE_TENSOR, 0, finite_kinds,
                NKINDS(finite_kinds));
      run_quant(40, ks[i], rnd_ld(ks[i]), fp16, MT_SCALE_TENSOR, 0, nan_rows, 2);
      run_quant(40, ks[i], rnd_ld(ks[i]), fp16, MT_SCALE_TENSOR, 0, inf_rows, 2);
    }
}

/* Weights: 16x16 tiles under one S, and per-row S with 1x16 blocks. */
static void quant_weight_blocks(void) {
  NEED_GPU();
  static const int ks[] = {16, 48, 768, 2048};
  static const enum row_kind nan_rows[] = {ROW_RANDOM, ROW_NAN};
  for (int fp16 = 0; fp16 < 2; fp16++)
    for (int i = 0; i < NKINDS(ks); i++) {
      for (int kind = 0; kind < NKINDS(finite_kinds); kind++)
        run_quant(32, ks[i], rnd_ld(ks[i]), fp16, MT_SCALE_TENSOR, 1, &finite_kinds[kind], 1);
      run_quant(160, ks[i], rnd_ld(ks[i]), fp16, MT_SCALE_TENSOR, 1, finite_kinds,
                NKINDS(finite_kinds));
      run_quant(32, ks[i], rnd_ld(ks[i]), fp16, MT_SCALE_TENSOR, 1, nan_rows, 2);
    }
}

/* ---- the GEMM ------------------------------------------------------------------------------ */

/* A quantized weight on the GPU and its reference. */
typedef struct {
  void *mem;
  mt_qweight q;
  mt_nvfp4 ref;
} weight;

/* Elements of the GPU's quantized weight (codes, scales, S, xhat) that differ from the reference;
 * -1 when the copies fail. */
static long qweight_diff(const mt_qweight *q, const mt_nvfp4 *ref) {
  int n = q->n, k = q->k;
  size_t ncodes = (size_t)n * (size_t)k / 2, nscales = ncodes / 8;
  size_t nouter = q->num.weight_scale == MT_SCALE_ROW ? (size_t)n : 1;
  uint8_t *codes = malloc(ncodes), *scales = malloc(nscales);
  float *outer = malloc(nouter * sizeof *outer);
  uint16_t *xhat = malloc((size_t)n * (size_t)k * 2);
  long bad = -1;
  if (cudaMemcpy(codes, q->codes, ncodes, cudaMemcpyDeviceToHost) == cudaSuccess &&
      cudaMemcpy(scales, q->scales, nscales, cudaMemcpyDeviceToHost) == cudaSuccess &&
      cudaMemcpy(outer, q->outer, nouter * sizeof *outer, cudaMemcpyDeviceToHost) == cudaSuccess &&
      cudaMemcpy(xhat, q->xhat, (size_t)n * (size_t)k * 2, cudaMemcpyDeviceToHost) == cudaSuccess) {
    bad = 0;
    for (size_t i = 0; i < ncodes; i++)
      bad += codes[i] != ref->codes[i];
    for (size_t i = 0; i < nscales; i++)
      bad += scales[i] != ref->scales[i];
    for (size_t i = 0; i < nouter; i++)
      bad += !same_float(outer[i], ref->outer[i]);
    for (int r = 0; r < n; r++)
      for (int c = 0; c < k; c++)
        bad +=
            xhat[(size_t)r * (size_t)k + (size_t)c] != mt_float_to_bf16(mt_ref_dequant(ref, r, c));
  }
  free(codes);
  free(scales);
  free(outer);
  free(xhat);
  return bad;
}

/* Quantize a random n x k weight both ways and check the GPU copy bit for bit. */
static int make_weight(weight *w, int n, int k, const mt_numerics *num, int fp16) {
  size_t ld = rnd_ld(k);
  /* magnitudes that keep every output finite in FP16 */
  static const enum row_kind kinds[] = {ROW_RANDOM, ROW_RANDOM, ROW_RANDOM, ROW_ZERO_BLKS};
  uint16_t *x = make_matrix(n, k, ld, fp16, kinds, NKINDS(kinds), 0);
  float *xf = malloc((size_t)n * ld * sizeof *xf);
  int ok = 0;
  for (size_t i = 0; i < (size_t)n * ld; i++)
    xf[i] = from_half(x[i], fp16);
  size_t bytes = mt_qweight_bytes(n, k, num);
  void *dw = dev_alloc((size_t)n * ld * 2);
  w->mem = dev_alloc(bytes);
  if (mt_nvfp4_alloc(&w->ref, n, k, num->weight_scale, num->weight_block) != 0 || !dw || !w->mem ||
      !bytes)
    goto done;
  mt_ref_quantize(xf, ld, &w->ref);
  if (mt_qweight_bind(&w->q, n, k, num, w->mem) != MT_OK || !poison(w->mem, bytes) ||
      cudaMemcpy(dw, x, (size_t)n * ld * 2, cudaMemcpyHostToDevice) != cudaSuccess)
    goto done;
  int st = mt_quantize_weight(dw, fp16 ? MT_DTYPE_FP16 : MT_DTYPE_BF16, ld, &w->q, NULL);
  CHECKF(st == MT_OK, "mt_quantize_weight: %s", mt_status_name((enum mt_status)st));
  if (st != MT_OK || sync_check() != cudaSuccess)
    goto done;
  long bad = qweight_diff(&w->q, &w->ref);
  CHECKF(bad == 0, "mt_quantize_weight %dx%d differs from the reference (%ld)", n, k, bad);
  ok = bad == 0;
done:
  free(x);
  free(xf);
  return ok;
}

/* Activations: random rows (optionally some NaN rows) on the host, the GPU copy, the reference. */
typedef struct {
  uint16_t *host; /* [m][ld] */
  void *dev;
  size_t ld;
  mt_nvfp4 ref;
} acts;

static int make_acts(acts *a, int m, int k, size_t ld, int fp16, enum mt_scale outer,
                     const int *nan_rows, int nnan) {
  static const enum row_kind kinds[] = {ROW_RANDOM, ROW_RANDOM, ROW_RANDOM, ROW_ZERO_BLKS,
                                        ROW_ZEROS};
  a->ld = ld;
  a->host = make_matrix(m, k, ld, fp16, kinds, NKINDS(kinds), 0);
  for (int i = 0; i < nnan; i++)
    a->host[(size_t)nan_rows[i] * ld + (size_t)rnd_below(k)] = fp16 ? 0x7e00 : 0x7fc0;
  float *xf = malloc((size_t)m * ld * sizeof *xf);
  for (size_t i = 0; i < (size_t)m * ld; i++)
    xf[i] = from_half(a->host[i], fp16);
  int ok = mt_nvfp4_alloc(&a->ref, m, k, outer, MT_WBLOCK_1X16) == 0;
  if (ok)
    mt_ref_quantize(xf, ld, &a->ref);
  free(xf);
  a->dev = dev_alloc((size_t)m * ld * 2);
  return ok && a->dev &&
         cudaMemcpy(a->dev, a->host, (size_t)m * ld * 2, cudaMemcpyHostToDevice) == cudaSuccess;
}

static void free_acts(acts *a) {
  free(a->host);
  mt_nvfp4_free(&a->ref);
}

typedef struct {
  int m, n, k;
  mt_numerics num;
  int xfp16;
  enum mt_dtype ytype, biastype;
  int with_bias, in_place; /* in_place: C is y */
  float alpha, beta;
  size_t ldx, ldy;
  int nan_rows[2], nnan;
  enum mt_gemm_path path; /* AUTO, or forced */
} gcase;

static const char *const path_names[] = {"", " fused", " large"};

/* Run one GEMM case and check every output against mt_ref_gemm within the bound of the header. */
static void check_gemm(const gcase *g) {
  weight w = {0};
  acts a = {0};
  size_t ysize = (size_t)g->m * g->ldy;
  uint16_t *y0 = malloc(ysize * 2), *y = malloc(ysize * 2);
  float *cf = malloc(ysize * sizeof *cf), *biasf = malloc((size_t)g->n * sizeof *biasf);
  void *bias_h = malloc((size_t)g->n * 4);
  if (!make_weight(&w, g->n, g->k, &g->num, 0) ||
      !make_acts(&a, g->m, g->k, g->ldx, g->xfp16, g->num.act_scale, g->nan_rows, g->nnan)) {
    CHECKF(0, "setting up %dx%dx%d failed", g->m, g->n, g->k);
    goto out;
  }
  /* y's initial contents: C when in place, else poison (then y0 records what is there). */
  for (size_t i = 0; i < ysize; i++) {
    y0[i] = to_half((rnd_unit() - 0.5f) * 4.0f, g->ytype == MT_DTYPE_FP16);
    cf[i] = out_value(y0, i, g->ytype);
  }
  for (int j = 0; j < g->n; j++) {
    float b = (rnd_unit() - 0.5f) * 2.0f;
    if (g->biastype == MT_DTYPE_FP32) {
      ((float *)bias_h)[j] = b;
    } else {
      ((uint16_t *)bias_h)[j] = to_half(b, g->biastype == MT_DTYPE_FP16);
      b = from_half(((uint16_t *)bias_h)[j], g->biastype == MT_DTYPE_FP16);
    }
    biasf[j] = b;
  }
  void *dy = dev_alloc(ysize * 2), *dc = dev_alloc(ysize * 2), *dbias = dev_alloc((size_t)g->n * 4);
  size_t ws_bytes = mt_gemm_workspace_bytes(g->m, g->k, &g->num);
  void *ws = dev_alloc(ws_bytes);
  if (!dy || !dc || !dbias || !ws)
    goto out;
  CU(cudaMemcpy(dc, y0, ysize * 2, cudaMemcpyHostToDevice));
  if (g->in_place)
    CU(cudaMemcpy(dy, y0, ysize * 2, cudaMemcpyHostToDevice));
  else {
    CHECK(poison(dy, ysize * 2));
    CU(cudaMemcpy(y0, dy, ysize * 2, cudaMemcpyDeviceToHost));
  }
  CU(cudaMemcpy(dbias, bias_h, (size_t)g->n * 4, cudaMemcpyHostToDevice));
  CHECK(poison(ws, ws_bytes));
  mt_gemm_args args = {
      .m = g->m,
      .n = g->n,
      .k = g->k,
      .x = a.dev,
      .ldx = g->ldx,
      .xtype = g->xfp16 ? MT_DTYPE_FP16 : MT_DTYPE_BF16,
      .w = &w.q,
      .y = dy,
      .ldy = g->ldy,
      .ytype = g->ytype,
      .c = g->in_place ? dy : dc,
      .ldc = g->ldy,
      .bias = g->with_bias ? dbias : NULL,
      .biastype = g->biastype,
      .alpha = g->alpha,
      .beta = g->beta,
      .workspace = ws,
      .workspace_bytes = ws_bytes,
      .path = g->path,
  };
  MT(mt_gemm(&args, NULL));
  CU(sync_check());
  CU(cudaMemcpy(y, dy, ysize * 2, cudaMemcpyDeviceToHost));

  char *nan_row = calloc((size_t)g->m, 1);
  for (int t = 0; t < g->nnan; t++)
    nan_row[g->nan_rows[t]] = 1;
  out_check oc = {0};
  check_outputs(&a.ref, &w.ref, y, y0, g->ldy, g->ytype, g->alpha, g->beta, cf,
                g->with_bias ? biasf : NULL, nan_row, &oc);
  free(nan_row);
  long bad = oc.bad, bad_pad = oc.pad, bad_nan = oc.nan;
  double worst = oc.worst;
  CHECKF(!bad && !bad_pad && !bad_nan,
         "%dx%dx%d act %s weight %s %s, y %s: %ld outside the bound, %ld padding written, %ld "
         "not NaN",
         g->m, g->n, g->k, mt_scale_name(g->num.act_scale), mt_scale_name(g->num.weight_scale),
         mt_wblock_name(g->num.weight_block), g->ytype == MT_DTYPE_FP16 ? "fp16" : "bf16", bad,
         bad_pad, bad_nan);
  printf("    %dx%dx%d act %s weight %s %s y %s%s%s%s: worst error %.3f of the bound\n", g->m, g->n,
         g->k, mt_scale_name(g->num.act_scale), mt_scale_name(g->num.weight_scale),
         mt_wblock_name(g->num.weight_block), g->ytype == MT_DTYPE_FP16 ? "fp16" : "bf16",
         g->beta != 0 ? (g->in_place ? " beta C=y" : " beta") : "", g->with_bias ? " bias" : "",
         path_names[g->path], worst);
out:
  mt_nvfp4_free(&w.ref);
  free_acts(&a);
  free(y0);
  free(y);
  free(cf);
  free(biasf);
  free(bias_h);
  dev_free_all();
}

static const mt_numerics numerics_row = {MT_SCALE_ROW, MT_SCALE_TENSOR, MT_WBLOCK_1X16};

/* Shapes across the three paths (up to 4 tokens the fused kernel that quantizes the activations
 * itself and the small kernel that streams the packed weight, forced in turn; up to 8 the small
 * kernel, forced; more, AUTO: the large path, which reads xhat by TMA), every spec numerics, both
 * output types. The small kernels need the packed weight, which exists for k <= 1024 here
 * (mt_gemm_frag_bytes): k = 784 and 1008 end on an odd k16 step (a half record, a partial chunk);
 * 12 and 16 rows take the large path's one row of tiles, k = 2080 a last K step of 32 columns;
 * at k = 1088 and 2048 the 64-token tiles load by rank-3 maps (mt_large_args.kpair: k % 64 == 0
 * and more stages than their ring), and at 1088 (17 64-wide blocks) the last stage's second block
 * lies past the map's third dimension. */
static void gemm_accuracy(void) {
  NEED_GPU();
  static const int shapes[][3] = {{1, 256, 512},   {7, 1536, 256},  {64, 384, 768},
                                  {65, 256, 512},  {96, 256, 1024}, {129, 272, 160},
                                  {3, 256, 784},   {12, 512, 2048}, {2, 256, 1008},
                                  {16, 256, 2080}, {24, 256, 1088}, {96, 256, 2048}};
  static const mt_numerics nums[] = {
      {MT_SCALE_ROW, MT_SCALE_TENSOR, MT_WBLOCK_1X16},
      {MT_SCALE_ROW, MT_SCALE_ROW, MT_WBLOCK_1X16},
      {MT_SCALE_TENSOR, MT_SCALE_TENSOR, MT_WBLOCK_1X16},
      {MT_SCALE_ROW, MT_SCALE_TENSOR, MT_WBLOCK_16X16},
  };
  for (int s = 0; s < NKINDS(shapes); s++)
    for (int v = 0; v < NKINDS(nums); v++) {
      gcase g = {.m = shapes[s][0],
                 .n = shapes[s][1],
                 .k = shapes[s][2],
                 .num = nums[v],
                 .xfp16 = (s + v) % 3 == 2,
                 .ytype = (s + v) % 2 ? MT_DTYPE_FP16 : MT_DTYPE_BF16,
                 .biastype = MT_DTYPE_FP32,
                 .alpha = 1.0f,
                 .beta = 0.0f};
      if (g.m <= MT_SMALL_FUSE_M && v % 2 == 0)
        g.path = MT_PATH_FUSED;
      g.ldx = (size_t)g.k;
      g.ldy = (size_t)g.n;
      check_gemm(&g);
    }
}

/* ldx != k, ldy != n (padding must stay untouched), alpha, beta with C != y and C == y, biases of
 * every type, FP16 activations. */
static void gemm_epilogue_and_strides(void) {
  NEED_GPU();
  static const int ms[] = {5, 130};
  for (int s = 0; s < NKINDS(ms); s++)
    for (int v = 0; v < 6; v++) {
      gcase g = {.m = ms[s],
                 .n = 256,
                 .k = 512,
                 .num = numerics_row,
                 .xfp16 = v % 2,
                 .ytype = v % 3 == 1 ? MT_DTYPE_FP16 : MT_DTYPE_BF16,
                 .biastype = v < 2   ? MT_DTYPE_FP32
                             : v < 4 ? MT_DTYPE_BF16
                                     : MT_DTYPE_FP16,
                 .with_bias = v != 5,
                 .in_place = v % 2,
                 .alpha = 0.75f - 0.5f * (float)v,
                 .beta = v == 2 ? 0.0f : 1.25f - 0.5f * (float)v};
      g.ldx = (size_t)g.k + 8 * (size_t)(1 + v);
      g.ldy = (size_t)g.n + 8 * (size_t)(2 + v);
      check_gemm(&g);
    }
}

/* A row holding NaN gives NaN in that row only; the others stay within the bound (3 rows: the
 * fused small kernel quantizes them itself). */
static void gemm_nan_rows(void) {
  NEED_GPU();
  static const int ms[] = {3, 8, 130};
  for (int s = 0; s < NKINDS(ms); s++) {
    gcase g = {.m = ms[s],
               .n = 256,
               .k = 256,
               .num = numerics_row,
               .ytype = MT_DTYPE_BF16,
               .biastype = MT_DTYPE_FP32,
               .alpha = 1.0f,
               .nan_rows = {1, ms[s] - 1},
               .nnan = 2};
    g.ldx = (size_t)g.k;
    g.ldy = (size_t)g.n;
    check_gemm(&g);
  }
}

/* A batch invariance run: an n x k weight, rows x k activations, an output and a workspace for
 * all of them, and the arguments of a call. */
typedef struct {
  weight w;
  acts a;
  void *dy;
  mt_gemm_args args;
} inv_case;

static int inv_setup(inv_case *c, int rows, int n, int k) {
  if (!make_weight(&c->w, n, k, &numerics_row, 0) ||
      !make_acts(&c->a, rows, k, k, 0, MT_SCALE_ROW, NULL, 0)) {
    CHECKF(0, "setup failed");
    return 0;
  }
  size_t ws_bytes = mt_gemm_workspace_bytes(rows, k, &numerics_row);
  void *ws = dev_alloc(ws_bytes);
  c->dy = dev_alloc((size_t)rows * n * 2);
  c->args = (mt_gemm_args){.m = rows,
                           .n = n,
                           .k = k,
                           .x = c->a.dev,
                           .ldx = k,
                           .xtype = MT_DTYPE_BF16,
                           .w = &c->w.q,
                           .y = c->dy,
                           .ldy = n,
                           .ytype = MT_DTYPE_BF16,
                           .alpha = 1.0f,
                           .workspace = ws,
                           .workspace_bytes = ws_bytes};
  return c->dy && ws;
}

static void inv_free(inv_case *c) {
  mt_nvfp4_free(&c->w.ref);
  free_acts(&c->a);
  dev_free_all();
}

/* Activation rows [offset, offset + m) through one m-row call, into out (host). */
static int inv_run(inv_case *c, int m, int offset, uint16_t *out) {
  size_t bytes = (size_t)m * (size_t)c->args.n * 2;
  c->args.m = m;
  c->args.x = (const uint16_t *)c->a.dev + (size_t)offset * (size_t)c->args.k;
  CHECK(poison(c->dy, bytes));
  MT(mt_gemm(&c->args, NULL));
  CU(sync_check());
  CU(cudaMemcpy(out, c->dy, bytes, cudaMemcpyDeviceToHost));
  return 1;
out:
  return 0;
}

/* The rows of an m-row call at offset (into part) that differ from those of the full_rows-row
 * call `full`, the first of them reported; 0 when the call failed (reported as such). */
static long inv_differ(inv_case *c, int m, int offset, const uint16_t *full, int full_rows,
                       uint16_t *part) {
  size_t n = (size_t)c->args.n;
  long bad = 0;
  if (!inv_run(c, m, offset, part))
    return 0;
  for (int r = 0; r < m; r++)
    if (memcmp(part + (size_t)r * n, full + (size_t)(offset + r) * n, n * 2) != 0 && bad++ == 0)
      CHECKF(0, "n = %zu, M = %d at row offset %d: row %d differs from the %d-row call", n, m,
             offset, r, full_rows);
  return bad;
}

/* The rows of one rows-row call on an n x k weight against calls of each M in ms (at random
 * offsets), bit for bit. */
static void invariance_against_one_call(int n, int k, int rows, const int *ms, int nms) {
  inv_case c = {0};
  uint16_t *full = malloc((size_t)rows * n * 2), *part = malloc((size_t)rows * n * 2);
  if (inv_setup(&c, rows, n, k) && inv_run(&c, rows, 0, full)) {
    long bad = 0;
    for (int i = 0; i < nms; i++)
      bad += inv_differ(&c, ms[i], rnd_below(rows - ms[i] + 1), full, rows, part);
    CHECKF(bad == 0, "%ld rows not batch invariant at n = %d, k = %d", bad, n, k);
  }
  inv_free(&c);
  free(full);
  free(part);
}

/* A wide output (n = 4096) across every kernel kind: rows of the 4096-row call (tiles of
 * 128 x 256: the TMA-store kernel, or ra under MT_LARGE_VARIANT=ra) against M = 1 (the fused
 * small kernel), 7 and 64 (tiles of 64 x 32), 257 (128 x 96: v6) and 512 (4 x 32 tiles of
 * 128 x 128 fill one wave of 132 SMs: the TMA-store kernel). */
static void batch_invariance_wide(void) {
  static const int ms[] = {1, 7, 64, 257, 512};
  invariance_against_one_call(4096, 512, 4096, ms, NKINDS(ms));
}

/* The 64-token tiles that load two K blocks a box (mt_gemm_large_m64p_*, at k = 2112: 33 64-wide
 * blocks) against the 128-token tiles' boxes of one block (the 4096-row call, tiles of 128 x 64):
 * M = 1, 7, 64 (one band, its box of 8 or 64 rows), 65 and 200 (full bands, then a last band of
 * 8 rows: its second block 8 rows on) and 2048 (tiles of 64 x 64). */
static void batch_invariance_kpair(void) {
  static const int ms[] = {1, 7, 64, 65, 200, 2048};
  invariance_against_one_call(256, 2112, 4096, ms, NKINDS(ms));
}

/* Row r's bits do not depend on M, on its position, or on the path: every run below is compared
 * bit for bit with one 4096-row GEMM and with 1-row GEMMs. Then the same at n = 4096
 * (batch_invariance_wide) and at k = 2112 (batch_invariance_kpair). */
static void gemm_batch_invariance(void) {
  NEED_GPU();
  enum { ROWS = 4096 + 320, N = 320, K = 512 };
  inv_case c = {0};
  uint16_t *full = malloc((size_t)ROWS * N * 2), *part = malloc((size_t)ROWS * N * 2);
  /* Reference: rows [0, 4096) in one call, rows [4096, ROWS) as a second 4096-row call that
   * starts 320 rows earlier (the overlap is checked too). */
  if (inv_setup(&c, ROWS, N, K) && inv_run(&c, 4096, 0, full) && inv_run(&c, 4096, 320, part)) {
    CHECKF(memcmp(part, full + (size_t)320 * N, (size_t)(4096 - 320) * N * 2) == 0,
           "rows 320..4095 differ when they sit 320 rows earlier in the call");
    memcpy(full + (size_t)4096 * N, part + (size_t)(4096 - 320) * N, (size_t)320 * N * 2);
    static const int ms[] = {1, 2, 3, 7, 12, 64, 257, 4096};
    long bad = 0;
    for (int i = 0; i < NKINDS(ms); i++) {
      int offsets[3] = {0, 1 + rnd_below(63), rnd_below(ROWS - ms[i] + 1)};
      for (int o = 0; o < 3; o++)
        bad += inv_differ(&c, ms[i], offsets[o], full, 4096, part);
    }
    for (int t = 0; t < 48; t++) /* single rows, anywhere */
      bad += inv_differ(&c, 1, t < 2 ? t * (ROWS - 1) : rnd_below(ROWS), full, 4096, part);
    CHECKF(bad == 0, "%ld rows not batch invariant", bad);
  }
  inv_free(&c);
  free(full);
  free(part);
  batch_invariance_wide();
  batch_invariance_kpair();
}

/* Every path that takes a call gives its bits (mt_gemm_args.path forced): the fused kernel (up to
 * MT_SMALL_FUSE_M rows) and the large one, at every M they share, on rows at a random offset.
 * k = 944 ends on an odd k16 step in a partial chunk, is an odd number of 64-wide blocks (15: the
 * 64-token tiles' last stage of two holds a block wholly past k, of TMA's zeros), and has the
 * packed weight the fused kernel needs. A path past its rows refuses the call
 * (MT_ERR_UNSUPPORTED) and leaves the output alone. */
static void gemm_paths_agree(void) {
  NEED_GPU();
  enum { ROWS = MT_SMALL_FUSE_M + 1, N = 256, K = 944 };
  inv_case c = {0};
  uint16_t *want = malloc((size_t)ROWS * N * 2), *got = malloc((size_t)ROWS * N * 2);
  if (inv_setup(&c, ROWS, N, K)) {
    long bad = 0;
    for (int m = 1; m <= ROWS; m++) {
      int offset = rnd_below(ROWS - m + 1);
      c.args.path = MT_PATH_LARGE;
      if (!inv_run(&c, m, offset, want))
        break;
      for (int p = MT_PATH_FUSED; p <= MT_PATH_FUSED; p++) {
        int fits = m <= MT_SMALL_FUSE_M;
        c.args.path = (enum mt_gemm_path)p;
        if (!fits) {
          CHECK(poison(c.dy, (size_t)m * N * 2));
          CHECKF(mt_gemm(&c.args, NULL) == MT_ERR_UNSUPPORTED, "path %d took M = %d", p, m);
          continue;
        }
        if (!inv_run(&c, m, offset, got))
          break;
        if (memcmp(got, want, (size_t)m * N * 2) != 0 && bad++ == 0)
          CHECKF(0, "M = %d: path %d differs from the large path", m, p);
      }
    }
    CHECKF(bad == 0, "%ld calls differ between paths", bad);
  }
  c.args.path = MT_PATH_AUTO;
  inv_free(&c);
  free(want);
  free(got);
}

/* The large path's persistent grid walks several tiles per CTA when there are more tiles than
 * SMs (here 33 x 8 = 264 tiles of 128 x 192, the last row of tiles partial): every output is
 * written (two runs under different poison agree), and sampled rows are bitwise those of 1-row
 * calls (the small path); K = 256 and K = 160 (a last K step of 32 columns). Then an odd N with
 * per-row S_w against the reference (tiles of 128 x 64, the last one partial, its last column
 * stored alone), without and with beta and bias. */
static void large_tiles_case(int K) {
  enum { M = 4096 + 37, N = 1536 };
  weight w = {0};
  acts a = {0};
  size_t ybytes = (size_t)M * N * 2;
  uint16_t *y1 = malloc(ybytes), *y2 = malloc(ybytes), *row = malloc((size_t)N * 2);
  if (!make_weight(&w, N, K, &numerics_row, 0) ||
      !make_acts(&a, M, K, K, 0, MT_SCALE_ROW, NULL, 0)) {
    CHECKF(0, "setup failed");
    goto out;
  }
  void *dy = dev_alloc(ybytes);
  size_t ws_bytes = mt_gemm_workspace_bytes(M, K, &numerics_row);
  void *ws = dev_alloc(ws_bytes);
  if (!dy || !ws)
    goto out;
  mt_gemm_args args = {.m = M,
                       .n = N,
                       .k = K,
                       .x = a.dev,
                       .ldx = K,
                       .xtype = MT_DTYPE_BF16,
                       .w = &w.q,
                       .y = dy,
                       .ldy = N,
                       .ytype = MT_DTYPE_BF16,
                       .alpha = 1.0f,
                       .workspace = ws,
                       .workspace_bytes = ws_bytes};
  CU(cudaMemset(dy, 0x11, ybytes));
  MT(mt_gemm(&args, NULL));
  CU(sync_check());
  CU(cudaMemcpy(y1, dy, ybytes, cudaMemcpyDeviceToHost));
  CU(cudaMemset(dy, 0xEE, ybytes));
  MT(mt_gemm(&args, NULL));
  CU(sync_check());
  CU(cudaMemcpy(y2, dy, ybytes, cudaMemcpyDeviceToHost));
  CHECKF(memcmp(y1, y2, ybytes) == 0, "%dx%dx%d: outputs left unwritten or not deterministic", M, N,
         K);
  long bad = 0;
  for (int t = 0; t < 40; t++) {
    int r = t < 2 ? t * (M - 1) : rnd_below(M);
    args.m = 1;
    args.x = (const uint16_t *)a.dev + (size_t)r * K;
    CHECK(poison(dy, (size_t)N * 2));
    MT(mt_gemm(&args, NULL));
    CU(sync_check());
    CU(cudaMemcpy(row, dy, (size_t)N * 2, cudaMemcpyDeviceToHost));
    if (memcmp(row, y1 + (size_t)r * N, (size_t)N * 2) != 0 && bad++ == 0)
      CHECKF(0, "the 1-row GEMM of row %d differs from the %d-row call", r, M);
  }
  CHECKF(bad == 0, "%ld rows differ between the paths (K = %d)", bad, K);
out:
  mt_nvfp4_free(&w.ref);
  free_acts(&a);
  free(y1);
  free(y2);
  free(row);
  dev_free_all();
}

static void gemm_large_tiles(void) {
  NEED_GPU();
  large_tiles_case(256);
  large_tiles_case(160);
  static const mt_numerics w_row = {MT_SCALE_ROW, MT_SCALE_ROW, MT_WBLOCK_1X16};
  for (int v = 0; v < 2; v++) {
    gcase g = {.m = 200,
               .n = 271,
               .k = 256,
               .num = w_row,
               .ytype = v ? MT_DTYPE_FP16 : MT_DTYPE_BF16,
               .biastype = MT_DTYPE_BF16,
               .with_bias = v,
               .alpha = 1.5f,
               .beta = v ? 0.5f : 0.0f};
    g.ldx = (size_t)g.k;
    g.ldy = 280;
    check_gemm(&g);
  }
  /* a wide output: 4 x 32 tiles of 128 x 128 (one wave of 132 SMs) by the TMA-store kernel, or
   * by ra under MT_LARGE_VARIANT=ra */
  gcase wide = {.m = 400,
                .n = 4096,
                .k = 256,
                .num = numerics_row,
                .ytype = MT_DTYPE_BF16,
                .biastype = MT_DTYPE_FP32,
                .alpha = 1.0f};
  wide.ldx = (size_t)wide.k;
  wide.ldy = (size_t)wide.n;
  check_gemm(&wide);
}

/* More tiles than SMs with S_a per row, against the reference: FP16 and BF16 activations with
 * ldx != k, NaN rows, a last band of 96 rows, C, bias and FP16 output. k = 64 keeps the CPU
 * reference short (at k = 256 the two cases took ~2 minutes on the device's CPU). */
static void gemm_many_tiles(void) {
  NEED_GPU();
  for (int v = 0; v < 2; v++) {
    gcase g = {.m = 2400,
               .n = 2048,
               .k = 64,
               .num = numerics_row,
               .xfp16 = !v,
               .ytype = v ? MT_DTYPE_BF16 : MT_DTYPE_FP16,
               .biastype = MT_DTYPE_BF16,
               .with_bias = 1,
               .alpha = 1.0f,
               .beta = v ? 0.0f : 0.5f,
               .nan_rows = {v ? 5 : 1600, 2399},
               .nnan = 2};
    g.ldx = (size_t)g.k + 24;
    g.ldy = (size_t)g.n;
    check_gemm(&g);
  }
}

/* ---- conditional weight quantization (the frozen cache's refresh) -------------------------- */

/* With the device word at 0 nothing of the quantized weight changes (even with another W); at 1
 * it is W's quantization, bit for bit. */
static void quant_weight_only_if(void) {
  NEED_GPU();
  enum { N = 64, K = 512 };
  static const mt_numerics nums[] = {
      {MT_SCALE_ROW, MT_SCALE_TENSOR, MT_WBLOCK_1X16},
      {MT_SCALE_ROW, MT_SCALE_ROW, MT_WBLOCK_1X16},
      {MT_SCALE_ROW, MT_SCALE_TENSOR, MT_WBLOCK_16X16},
  };
  static const enum row_kind kinds[] = {ROW_RANDOM, ROW_ZERO_BLKS, ROW_WIDE};
  for (int v = 0; v < NKINDS(nums); v++) {
    uint16_t *wh[2] = {NULL, NULL};
    float *wf = malloc((size_t)N * K * sizeof *wf);
    mt_nvfp4 ref[2] = {{0}, {0}};
    size_t bytes = mt_qweight_bytes(N, K, &nums[v]);
    unsigned char *snap[2] = {malloc(bytes), malloc(bytes)};
    void *dw[2] = {NULL, NULL}, *mem = dev_alloc(bytes);
    uint32_t *flag = dev_alloc(sizeof *flag);
    mt_qweight q;
    for (int i = 0; i < 2; i++) {
      wh[i] =
          make_matrix(N, K, K, 0, kinds, NKINDS(kinds), nums[v].weight_block == MT_WBLOCK_16X16);
      for (size_t e = 0; e < (size_t)N * K; e++)
        wf[e] = mt_bf16_to_float(wh[i][e]);
      CHECK(mt_nvfp4_alloc(&ref[i], N, K, nums[v].weight_scale, nums[v].weight_block) == 0);
      mt_ref_quantize(wf, K, &ref[i]);
      dw[i] = dev_alloc((size_t)N * K * 2);
      if (dw[i])
        CU(cudaMemcpy(dw[i], wh[i], (size_t)N * K * 2, cudaMemcpyHostToDevice));
    }
    if (!mem || !flag || !dw[0] || !dw[1] || !ref[0].codes || !ref[1].codes)
      goto out;
    MT(mt_qweight_bind(&q, N, K, &nums[v], mem));
    /* the per-tensor amax word is scratch that the quantizer zeroes either way */
    size_t scratch = (size_t)((unsigned char *)(q.outer + 1) - (unsigned char *)mem);
    CHECK(poison(mem, bytes));
    CU(cudaMemset(flag, 0, sizeof *flag));
    CU(cudaMemset(flag, 1, 1));
    MT(mt_quantize_weight_if(dw[0], MT_DTYPE_BF16, K, &q, flag, NULL));
    CU(sync_check());
    CHECKF(qweight_diff(&q, &ref[0]) == 0, "%s %s: flag 1 did not quantize W",
           mt_scale_name(nums[v].weight_scale), mt_wblock_name(nums[v].weight_block));
    CU(cudaMemcpy(snap[0], mem, bytes, cudaMemcpyDeviceToHost));
    CU(cudaMemset(flag, 0, sizeof *flag));
    MT(mt_quantize_weight_if(dw[1], MT_DTYPE_BF16, K, &q, flag, NULL));
    CU(sync_check());
    CU(cudaMemcpy(snap[1], mem, bytes, cudaMemcpyDeviceToHost));
    if (nums[v].weight_scale == MT_SCALE_TENSOR)
      memset(snap[0] + scratch, 0, 4), memset(snap[1] + scratch, 0, 4);
    CHECKF(memcmp(snap[0], snap[1], bytes) == 0, "%s %s: flag 0 changed the quantized weight",
           mt_scale_name(nums[v].weight_scale), mt_wblock_name(nums[v].weight_block));
    CU(cudaMemset(flag, 0xff, sizeof *flag));
    MT(mt_quantize_weight_if(dw[1], MT_DTYPE_BF16, K, &q, flag, NULL));
    CU(sync_check());
    CHECKF(qweight_diff(&q, &ref[1]) == 0, "%s %s: flag set did not requantize",
           mt_scale_name(nums[v].weight_scale), mt_wblock_name(nums[v].weight_block));
  out:
    for (int i = 0; i < 2; i++) {
      free(wh[i]);
      free(snap[i]);
      mt_nvfp4_free(&ref[i]);
    }
    free(wf);
    dev_free_all();
  }
}

/* ---- a weight kept as codes and scales (the frozen cache's form) ---------------------------- */

/* Bytes of device memory at a and b that differ. */
static long dev_diff(const void *a, const void *b, size_t bytes) {
  unsigned char *ha = malloc(bytes), *hb = malloc(bytes);
  long bad = -1;
  if (ha && hb && cudaMemcpy(ha, a, bytes, cudaMemcpyDeviceToHost) == cudaSuccess &&
      cudaMemcpy(hb, b, bytes, cudaMemcpyDeviceToHost) == cudaSuccess) {
    bad = 0;
    for (size_t i = 0; i < bytes; i++)
      bad += ha[i] != hb[i];
  }
  free(ha);
  free(hb);
  return bad;
}

/* BF16 outputs equal bit for bit, NaN taken as one value (the paths need not agree on its
 * payload). */
static int same_bf16(const uint16_t *a, const uint16_t *b, size_t count) {
  for (size_t i = 0; i < count; i++) {
    int nan_a = (a[i] & 0x7fff) > 0x7f80, nan_b = (b[i] & 0x7fff) > 0x7f80;
    if (nan_a != nan_b || (!nan_a && a[i] != b[i]))
      return 0;
  }
  return 1;
}

/* One GEMM of m rows of x on q into y (poisoned first), AUTO's path, with tile t ({0, 0}: AUTO's);
 * the call's status. */
static int kept_gemm(const mt_qweight *q, const void *x, int m, void *y, void *ws, size_t ws_bytes,
                     mt_gemm_tile t) {
  mt_gemm_args a = {.m = m,
                    .n = q->n,
                    .k = q->k,
                    .x = x,
                    .ldx = (size_t)q->k,
                    .w = q,
                    .y = y,
                    .ldy = (size_t)q->n,
                    .alpha = 1.0f,
                    .workspace = ws,
                    .workspace_bytes = ws_bytes,
                    .tile = t};
  if (!poison(y, (size_t)m * q->n * 2))
    return MT_ERR_CUDA;
  int st = mt_gemm(&a, NULL);
  return st == MT_OK && sync_check() != cudaSuccess ? MT_ERR_CUDA : st;
}

/* The kept form of a weight (mt_qweight_bind_kept: codes, scales and S, no dequantized copy, no
 * fragment copy) against the full form, from the same W: the same codes, scales and S, bit for bit;
 * mt_dequantize writes the full form's xhat bit for bit (every row kind: the zeros of a NaN or Inf
 * row's domain, -0 codes, subnormal scales); and a GEMM on it, which dequantizes into its workspace
 * first, gives the full form's outputs (AUTO's tiles, where the full form may take the fused path)
 * bit for bit at every M, on every tile kind (64 tokens x 32, 48, 64: partial tiles at N = 208;
 * 128 x 64; two tiles a CTA at M = 1100 with 64 x 32). A workspace without room for the copy is
 * refused (MT_ERR_NOMEM), as is a forced fused path (no fragment copy). Every weight numerics;
 * BF16 and FP16 weights; K = 768 (Qwen3's down, which AUTO fuses at one token in the full form) and
 * 944 (a partial K step). */
/* Every weight numerics, and two weights: Qwen3's down (768, which AUTO fuses at one token in the
 * full form), and 944 (a partial K step) in FP16 with rows that fill no band. */
static const mt_numerics weight_nums[] = {
    {MT_SCALE_ROW, MT_SCALE_TENSOR, MT_WBLOCK_1X16},
    {MT_SCALE_ROW, MT_SCALE_ROW, MT_WBLOCK_1X16},
    {MT_SCALE_ROW, MT_SCALE_TENSOR, MT_WBLOCK_16X16},
};
static const struct { int n, k, fp16; } weight_shapes[] = {{256, 768, 0}, {208, 944, 1}};

static void kept_weight_dequant(void) {
  NEED_GPU();
  const mt_numerics *nums = weight_nums;
  __typeof__(weight_shapes[0]) *shapes = weight_shapes;
  static const int ms[] = {1, 3, 16, 65, 300, 1100};
  static const mt_gemm_tile tiles[] = {{0, 0}, {64, 32}, {64, 48}, {64, 64}, {128, 64}};
  enum { MAX_M = 1100 };
  for (int v = 0; v < NKINDS(weight_nums); v++)
    for (int sh = 0; sh < NKINDS(weight_shapes); sh++) {
      const int n = shapes[sh].n, k = shapes[sh].k, fp16 = shapes[sh].fp16;
      const int tile16 = nums[v].weight_block == MT_WBLOCK_16X16;
      /* per-tensor S: one NaN anywhere makes every output NaN, which says little */
      const int row_s = nums[v].weight_scale == MT_SCALE_ROW;
      uint16_t *wh = make_matrix(n, k, (size_t)k, fp16, row_s ? all_kinds : finite_kinds,
                                 row_s ? NKINDS(all_kinds) : NKINDS(finite_kinds), tile16);
      static const enum row_kind akinds[] = {ROW_RANDOM, ROW_ZERO_BLKS};
      uint16_t *xh = make_matrix(MAX_M, k, (size_t)k, 0, akinds, NKINDS(akinds), 0);
      const size_t full = mt_qweight_bytes(n, k, &nums[v]),
                   kept = mt_qweight_kept_bytes(n, k, &nums[v]);
      const size_t xbytes = mt_qweight_xhat_bytes(n, k), elems = (size_t)n * k;
      const size_t ws_bytes = mt_gemm_workspace_bytes(MAX_M, k, &nums[v]) + xbytes;
      void *dw = dev_alloc(elems * 2), *dx = dev_alloc((size_t)MAX_M * k * 2);
      void *mf = dev_alloc(full), *mk = dev_alloc(kept), *copy = dev_alloc(xbytes);
      void *ws = dev_alloc(ws_bytes), *yf = dev_alloc((size_t)MAX_M * n * 2),
           *yk = dev_alloc((size_t)MAX_M * n * 2);
      uint16_t *hf = malloc((size_t)MAX_M * n * 2), *hk = malloc((size_t)MAX_M * n * 2);
      mt_qweight qf, qk;
      const enum mt_dtype type = fp16 ? MT_DTYPE_FP16 : MT_DTYPE_BF16;
      const char *scale = mt_scale_name(nums[v].weight_scale),
                 *block = mt_wblock_name(nums[v].weight_block);
      if (!dw || !dx || !mf || !mk || !copy || !ws || !yf || !yk || !hf || !hk)
        goto out;
      CU(cudaMemcpy(dw, wh, elems * 2, cudaMemcpyHostToDevice));
      CU(cudaMemcpy(dx, xh, (size_t)MAX_M * k * 2, cudaMemcpyHostToDevice));
      CHECKF(kept < full && kept <= elems * 6 / 10, "%dx%d: kept %zu bytes, full %zu", n, k, kept,
             full);
      MT(mt_qweight_bind(&qf, n, k, &nums[v], mf));
      MT(mt_qweight_bind_kept(&qk, n, k, &nums[v], mk));
      CHECK(!qk.xhat && !qk.frag && qk.codes && qk.scales && qk.outer);
      CHECK(poison(mf, full) && poison(mk, kept) && poison(copy, xbytes));
      MT(mt_quantize_weight(dw, type, (size_t)k, &qf, NULL));
      MT(mt_quantize_weight(dw, type, (size_t)k, &qk, NULL));
      MT(mt_dequantize(&qk, copy, NULL));
      CU(sync_check());
      const size_t nouter = row_s ? (size_t)n : 1;
      CHECKF(dev_diff(qf.codes, qk.codes, elems / 2) == 0 &&
                 dev_diff(qf.scales, qk.scales, elems / 16) == 0 &&
                 dev_diff(qf.outer, qk.outer, nouter * 4) == 0,
             "%s %s %dx%d: the kept form's codes, scales or S differ from the full form's", scale,
             block, n, k);
      long bad = dev_diff(qf.xhat, copy, elems * 2);
      CHECKF(bad == 0, "%s %s %dx%d: mt_dequantize differs from the quantizer's xhat in %ld bytes",
             scale, block, n, k, bad);
      for (int i = 0; i < NKINDS(ms); i++) {
        const int m = ms[i];
        if (kept_gemm(&qf, dx, m, yf, ws, ws_bytes, tiles[0]) != MT_OK) {
          CHECKF(0, "%dx%dx%d: the full form's GEMM failed", m, n, k);
          break;
        }
        CU(cudaMemcpy(hf, yf, (size_t)m * n * 2, cudaMemcpyDeviceToHost));
        for (int ti = 0; ti < NKINDS(tiles); ti++) {
          if (m == MAX_M && ti != 1 && ti != 4)
            continue; /* the two-tiles-a-CTA case and the 128-token tiles only */
          int st = kept_gemm(&qk, dx, m, yk, ws, ws_bytes, tiles[ti]);
          CHECKF(st == MT_OK, "%dx%dx%d tile %dx%d: %s", m, n, k, tiles[ti].bm, tiles[ti].bn,
                 mt_status_name((enum mt_status)st));
          if (st != MT_OK)
            continue;
          CU(cudaMemcpy(hk, yk, (size_t)m * n * 2, cudaMemcpyDeviceToHost));
          CHECKF(same_bf16(hf, hk, (size_t)m * n),
                 "%s %s %dx%dx%d tile %dx%d: kept and full forms differ", scale, block, m, n, k,
                 tiles[ti].bm, tiles[ti].bn);
        }
      }
      const size_t acts1 = mt_gemm_workspace_bytes(1, k, &nums[v]);
      CHECK(kept_gemm(&qk, dx, 1, yk, ws, acts1 + xbytes - 1, tiles[1]) == MT_ERR_NOMEM);
      CHECK(kept_gemm(&qk, dx, 1, yk, ws, acts1 + xbytes, tiles[1]) == MT_OK);
      mt_gemm_args fused = {.m = 1,
                            .n = n,
                            .k = k,
                            .x = dx,
                            .ldx = (size_t)k,
                            .w = &qk,
                            .y = yk,
                            .ldy = (size_t)n,
                            .alpha = 1.0f,
                            .workspace = ws,
                            .workspace_bytes = ws_bytes,
                            .path = MT_PATH_FUSED};
      CHECK(mt_gemm(&fused, NULL) == MT_ERR_UNSUPPORTED);
      printf("    %s %s %dx%d %s: kept %.3f bytes an element, full %.3f\n", scale, block, n, k,
             fp16 ? "fp16" : "bf16", (double)kept / (double)elems, (double)full / (double)elems);
    out:
      free(wh);
      free(xh);
      free(hf);
      free(hk);
      dev_free_all();
    }
}

/* A weight stored [in][out] (mt_qweight.in_out: element (r, c) at w[c * ldw + r], JAX's Dense
 * kernel) against the same weight stored [out][in]: the full form's codes, scales, S, dequantized
 * copy and fragment copy bit for bit, both the reference's (qweight_diff), and the GEMM's outputs
 * bit for bit at every M; through mt_refresh_weight too (a kept form: its check hashes the stored
 * rows). Every weight numerics, BF16 and FP16, stored rows padded (ldw = n + 8). */
static void quant_weight_in_out(void) {
  NEED_GPU();
  const mt_numerics *nums = weight_nums;
  __typeof__(weight_shapes[0]) *shapes = weight_shapes;
  static const int ms[] = {1, 16, 300};
  enum { MAX_M = 300 };
  for (int v = 0; v < NKINDS(weight_nums); v++)
    for (int sh = 0; sh < NKINDS(weight_shapes); sh++) {
      const int n = shapes[sh].n, k = shapes[sh].k, fp16 = shapes[sh].fp16;
      const int tile16 = nums[v].weight_block == MT_WBLOCK_16X16;
      const int row_s = nums[v].weight_scale == MT_SCALE_ROW;
      const size_t ldt = (size_t)n + 8, elems = (size_t)n * k;
      uint16_t *wh = make_matrix(n, k, (size_t)k, fp16, row_s ? all_kinds : finite_kinds,
                                 row_s ? NKINDS(all_kinds) : NKINDS(finite_kinds), tile16);
      uint16_t *wt = calloc((size_t)k * ldt, 2);
      static const enum row_kind akinds[] = {ROW_RANDOM, ROW_ZERO_BLKS};
      uint16_t *xh = make_matrix(MAX_M, k, (size_t)k, 0, akinds, NKINDS(akinds), 0);
      float *wf = malloc(elems * sizeof *wf);
      const size_t full = mt_qweight_bytes(n, k, &nums[v]),
                   kept = mt_qweight_kept_bytes(n, k, &nums[v]);
      const size_t ws_bytes =
          mt_gemm_workspace_bytes(MAX_M, k, &nums[v]) + mt_qweight_xhat_bytes(n, k);
      void *dw = dev_alloc(elems * 2), *dt = dev_alloc((size_t)k * ldt * 2);
      void *dx = dev_alloc((size_t)MAX_M * k * 2), *m1 = dev_alloc(full), *m2 = dev_alloc(full);
      void *mk = dev_alloc(kept), *state = dev_alloc(mt_refresh_state_bytes(1));
      void *ws = dev_alloc(ws_bytes), *y1 = dev_alloc((size_t)MAX_M * n * 2),
           *y2 = dev_alloc((size_t)MAX_M * n * 2);
      uint16_t *h1 = malloc((size_t)MAX_M * n * 2), *h2 = malloc((size_t)MAX_M * n * 2);
      mt_qweight q1, q2, qk;
      mt_nvfp4 ref = {0};
      const enum mt_dtype type = fp16 ? MT_DTYPE_FP16 : MT_DTYPE_BF16;
      const char *scale = mt_scale_name(nums[v].weight_scale),
                 *block = mt_wblock_name(nums[v].weight_block);
      if (!wt || !wf || !dw || !dt || !dx || !m1 || !m2 || !mk || !state || !ws || !y1 || !y2 ||
          !h1 || !h2 || mt_nvfp4_alloc(&ref, n, k, nums[v].weight_scale, nums[v].weight_block))
        goto out;
      for (int r = 0; r < n; r++)
        for (int c = 0; c < k; c++)
          wt[(size_t)c * ldt + r] = wh[(size_t)r * k + c];
      for (size_t i = 0; i < elems; i++)
        wf[i] = from_half(wh[i], fp16);
      mt_ref_quantize(wf, (size_t)k, &ref);
      CU(cudaMemcpy(dw, wh, elems * 2, cudaMemcpyHostToDevice));
      CU(cudaMemcpy(dt, wt, (size_t)k * ldt * 2, cudaMemcpyHostToDevice));
      CU(cudaMemcpy(dx, xh, (size_t)MAX_M * k * 2, cudaMemcpyHostToDevice));
      MT(mt_qweight_bind(&q1, n, k, &nums[v], m1));
      MT(mt_qweight_bind(&q2, n, k, &nums[v], m2));
      MT(mt_qweight_bind_kept(&qk, n, k, &nums[v], mk));
      q2.in_out = qk.in_out = 1;
      const int byte = 1 + rnd_below(255); /* one poison for both: their padding compares too */
      CU(cudaMemset(m1, byte, full));
      CU(cudaMemset(m2, byte, full));
      CHECK(poison(mk, kept));
      CU(cudaMemset(state, 0, mt_refresh_state_bytes(1)));
      MT(mt_quantize_weight(dw, type, (size_t)k, &q1, NULL));
      MT(mt_quantize_weight(dt, type, ldt, &q2, NULL));
      MT(mt_refresh_weight(dt, type, ldt, &qk, state, 1, NULL));
      CU(sync_check());
      long bad = dev_diff(m1, m2, full);
      CHECKF(bad == 0, "%s %s %dx%d %s: [in][out] quantized differs from [out][in] in %ld bytes",
             scale, block, n, k, fp16 ? "fp16" : "bf16", bad);
      bad = qweight_diff(&q2, &ref);
      CHECKF(bad == 0, "%s %s %dx%d: [in][out] differs from the reference (%ld)", scale, block, n,
             k, bad);
      CHECKF(dev_diff(q1.codes, qk.codes, elems / 2) == 0 &&
                 dev_diff(q1.scales, qk.scales, elems / 16) == 0 &&
                 dev_diff(q1.outer, qk.outer, (row_s ? (size_t)n : 1) * 4) == 0,
             "%s %s %dx%d: the refreshed [in][out] kept form differs", scale, block, n, k);
      CHECK(mt_quantize_weight(dt, type, (size_t)n - 8, &q2, NULL) == MT_ERR_UNSUPPORTED);
      for (int i = 0; i < NKINDS(ms); i++) {
        const int m = ms[i];
        int st1 = kept_gemm(&q1, dx, m, y1, ws, ws_bytes, (mt_gemm_tile){0, 0});
        int st2 = kept_gemm(&q2, dx, m, y2, ws, ws_bytes, (mt_gemm_tile){0, 0});
        CHECKF(st1 == MT_OK && st2 == MT_OK, "%dx%dx%d: GEMM %s / %s", m, n, k,
               mt_status_name((enum mt_status)st1), mt_status_name((enum mt_status)st2));
        if (st1 != MT_OK || st2 != MT_OK)
          continue;
        CU(cudaMemcpy(h1, y1, (size_t)m * n * 2, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(h2, y2, (size_t)m * n * 2, cudaMemcpyDeviceToHost));
        CHECKF(same_bf16(h1, h2, (size_t)m * n), "%s %s %dx%dx%d: outputs differ by layout", scale,
               block, m, n, k);
      }
    out:
      mt_nvfp4_free(&ref);
      free(wh), free(wt), free(xh), free(wf), free(h1), free(h2);
      dev_free_all();
    }
}

/* ---- several contexts, and stream capture ------------------------------------------------- */

/* Driver entry points the engine's table does not carry, for this test only. */
static struct {
  __typeof__(&cuDeviceGet) device_get;
  __typeof__(&cuCtxCreate) ctx_create;
  __typeof__(&cuCtxDestroy) ctx_destroy;
  __typeof__(&cuStreamCreate) stream_create;
  __typeof__(&cuStreamDestroy) stream_destroy;
  __typeof__(&cuStreamBeginCapture) begin_capture;
  __typeof__(&cuStreamEndCapture) end_capture;
  __typeof__(&cuGraphInstantiate) graph_instantiate;
  __typeof__(&cuGraphLaunch) graph_launch;
  __typeof__(&cuGraphDestroy) graph_destroy;
  __typeof__(&cuGraphExecDestroy) graph_exec_destroy;
  __typeof__(&cuStreamSynchronize) stream_synchronize;
} cu;

static int load_cu(void) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!lib)
    return 0;
  void *sym;
  int missing = 0;
#define CU_SYM(field, name)                                                                        \
  sym = dlsym(lib, name);                                                                          \
  memcpy(&cu.field, &sym, sizeof sym);                                                             \
  missing |= sym == NULL;
  CU_SYM(device_get, "cuDeviceGet")
  CU_SYM(ctx_create, "cuCtxCreate_v4")
  CU_SYM(ctx_destroy, "cuCtxDestroy_v2")
  CU_SYM(stream_create, "cuStreamCreate")
  CU_SYM(stream_destroy, "cuStreamDestroy_v2")
  CU_SYM(begin_capture, "cuStreamBeginCapture_v2")
  CU_SYM(end_capture, "cuStreamEndCapture")
  CU_SYM(graph_instantiate, "cuGraphInstantiateWithFlags")
  CU_SYM(graph_launch, "cuGraphLaunch")
  CU_SYM(graph_destroy, "cuGraphDestroy")
  CU_SYM(graph_exec_destroy, "cuGraphExecDestroy")
  CU_SYM(stream_synchronize, "cuStreamSynchronize")
#undef CU_SYM
  return !missing;
}

#define DRV(call)                                                                                  \
  do {                                                                                             \
    CUresult drv_r_ = (call);                                                                      \
    CHECKF(drv_r_ == CUDA_SUCCESS, "%s: CUresult %d", #call, (int)drv_r_);                         \
    if (drv_r_ != CUDA_SUCCESS)                                                                    \
      goto out;                                                                                    \
  } while (0)

enum { CTX_M = 37, CTX_N = 256, CTX_K = 512 };

/* In the current context, with driver memory only: quantize the weight and run the GEMM on a
 * stream of its own, then the same GEMM again from a captured graph; y from both must be equal.
 * fresh: the engine has never run in this context, so its first calls inside a capture must
 * refuse (loading a module there is not legal) and leave nothing behind. */
static void engine_run(const uint16_t *wh, const uint16_t *xh, uint16_t *yh, int fresh) {
  const mt_driver *d = mt_driver_get();
  const mt_numerics *num = &numerics_row;
  size_t qbytes = mt_qweight_bytes(CTX_N, CTX_K, num),
         ws_bytes = mt_gemm_workspace_bytes(CTX_M, CTX_K, num);
  size_t ybytes = (size_t)CTX_M * CTX_N * 2;
  CUdeviceptr dw = 0, dq = 0, dx = 0, dy = 0, dws = 0;
  CUstream s = NULL;
  CUgraph graph = NULL;
  CUgraphExec exec = NULL;
  uint16_t *y2 = malloc(ybytes);
  mt_qweight q;
  DRV(d->mem_alloc(&dw, (size_t)CTX_N * CTX_K * 2));
  DRV(d->mem_alloc(&dq, qbytes));
  DRV(d->mem_alloc(&dx, (size_t)CTX_M * CTX_K * 2));
  DRV(d->mem_alloc(&dy, ybytes));
  DRV(d->mem_alloc(&dws, ws_bytes));
  DRV(d->memcpy_htod(dw, wh, (size_t)CTX_N * CTX_K * 2));
  DRV(d->memcpy_htod(dx, xh, (size_t)CTX_M * CTX_K * 2));
  DRV(cu.stream_create(&s, CU_STREAM_NON_BLOCKING));
  MT(mt_qweight_bind(&q, CTX_N, CTX_K, num, (void *)dq));
  mt_gemm_args args = {.m = CTX_M,
                       .n = CTX_N,
                       .k = CTX_K,
                       .x = (void *)dx,
                       .ldx = CTX_K,
                       .xtype = MT_DTYPE_BF16,
                       .w = &q,
                       .y = (void *)dy,
                       .ldy = CTX_N,
                       .ytype = MT_DTYPE_BF16,
                       .alpha = 1.0f,
                       .workspace = (void *)dws,
                       .workspace_bytes = ws_bytes};
  if (fresh) {
    DRV(cu.begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    int st_w = mt_quantize_weight((void *)dw, MT_DTYPE_BF16, CTX_K, &q, s);
    int st_g = mt_gemm(&args, s);
    DRV(cu.end_capture(s, &graph));
    CHECKF(st_w == MT_ERR_CAPTURE && st_g == MT_ERR_CAPTURE,
           "first calls in a capture: %s and %s, want stream capture",
           mt_status_name((enum mt_status)st_w), mt_status_name((enum mt_status)st_g));
    DRV(cu.graph_destroy(graph));
    graph = NULL;
  }
  DRV(d->memset_d8_async(dy, 0xA5, ybytes, s));
  MT(mt_quantize_weight((void *)dw, MT_DTYPE_BF16, CTX_K, &q, s));
  MT(mt_gemm(&args, s));
  DRV(cu.stream_synchronize(s));
  DRV(d->memcpy_dtoh(yh, dy, ybytes));
  /* Once loaded, the same calls inside a capture are fine. */
  DRV(d->memset_d8_async(dy, 0x5A, ybytes, s));
  DRV(cu.stream_synchronize(s));
  DRV(cu.begin_capture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
  int st = mt_gemm(&args, s);
  DRV(cu.end_capture(s, &graph));
  MT(st);
  DRV(cu.graph_instantiate(&exec, graph, 0));
  DRV(cu.graph_launch(exec, s));
  DRV(cu.stream_synchronize(s));
  DRV(d->memcpy_dtoh(y2, dy, ybytes));
  CHECKF(memcmp(y2, yh, ybytes) == 0, "the captured GEMM differs from the direct one");
out:
  if (exec)
    cu.graph_exec_destroy(exec);
  if (graph)
    cu.graph_destroy(graph);
  if (s)
    cu.stream_destroy(s);
  CUdeviceptr all[] = {dw, dq, dx, dy, dws};
  for (int i = 0; i < 5; i++)
    if (all[i])
      d->mem_free(all[i]);
  free(y2);
}

/* The engine in a second context of the same device: its own modules (loaded outside capture
 * only), the same bits as in the primary context. */
static void engine_contexts_and_capture(void) {
  NEED_GPU();
  CUcontext ctx = NULL;
  static const enum row_kind kinds[] = {ROW_RANDOM};
  uint16_t *wh = make_matrix(CTX_N, CTX_K, CTX_K, 0, kinds, 1, 0);
  uint16_t *xh = make_matrix(CTX_M, CTX_K, CTX_K, 0, kinds, 1, 0);
  uint16_t *y_primary = malloc((size_t)CTX_M * CTX_N * 2),
           *y_second = malloc((size_t)CTX_M * CTX_N * 2);
  CHECK(load_cu() && mt_driver_get());
  if (!cu.ctx_create || !mt_driver_get())
    goto out;
  engine_run(wh, xh, y_primary, 0);
  CUdevice dev;
  CUctxCreateParams params;
  memset(&params, 0, sizeof params);
  DRV(cu.device_get(&dev, 0));
  DRV(cu.ctx_create(&ctx, &params, 0, dev)); /* now current on this thread */
  engine_run(wh, xh, y_second, 1);
  CHECKF(memcmp(y_primary, y_second, (size_t)CTX_M * CTX_N * 2) == 0,
         "the GEMM in a second context differs from the primary context's");
out:
  if (ctx)
    cu.ctx_destroy(ctx); /* pops it: the primary context is current again */
  free(wh);
  free(xh);
  free(y_primary);
  free(y_second);
}

/* ---- argument checks (no GPU needed: they fail before any launch) ---------------------------- */

static void gemm_rejects_bad_arguments(void) {
  static _Alignas(256) unsigned char fake[4096]; /* never touched: every call must refuse */
  mt_qweight w = {.n = 64,
                  .k = 64,
                  .num = numerics_row,
                  .xhat = (uint16_t *)fake,
                  .codes = fake,
                  .scales = fake};
  mt_gemm_args good = {.m = 4,
                       .n = 64,
                       .k = 64,
                       .x = fake,
                       .ldx = 64,
                       .xtype = MT_DTYPE_BF16,
                       .w = &w,
                       .y = fake,
                       .ldy = 64,
                       .ytype = MT_DTYPE_BF16,
                       .alpha = 1.0f,
                       .workspace = fake,
                       .workspace_bytes = 0};
  mt_gemm_args a = good;
  CHECK(mt_gemm(&a, NULL) == MT_ERR_NOMEM); /* workspace too small */
  a.workspace_bytes = mt_gemm_workspace_bytes(4, 64, &numerics_row) - 1;
  CHECK(mt_gemm(&a, NULL) == MT_ERR_NOMEM);
  good.workspace_bytes = sizeof fake;
  a = good, a.k = 40, w.k = 40, a.ldx = 40;
  CHECK(mt_gemm(&a, NULL) == MT_ERR_UNSUPPORTED); /* k % 16 */
  w.k = 64;
  a = good, a.ldx = 60;
  CHECK(mt_gemm(&a, NULL) == MT_ERR_UNSUPPORTED); /* ldx < k */
  a = good, a.ldx = 68;
  CHECK(mt_gemm(&a, NULL) == MT_ERR_UNSUPPORTED); /* rows not on 16 bytes */
  a = good, a.x = fake + 2;
  CHECK(mt_gemm(&a, NULL) == MT_ERR_UNSUPPORTED);
  a = good, a.xtype = MT_DTYPE_FP32;
  CHECK(mt_gemm(&a, NULL) == MT_ERR_UNSUPPORTED);
  a = good, a.ytype = MT_DTYPE_FP32;
  CHECK(mt_gemm(&a, NULL) == MT_ERR_UNSUPPORTED);
  a = good, a.n = 48;
  CHECK(mt_gemm(&a, NULL) == MT_ERR_UNSUPPORTED); /* weight shape */
  a = good, a.m = 0;
  CHECK(mt_gemm(&a, NULL) == MT_ERR_UNSUPPORTED);
  a = good, a.beta = 1.0f;
  CHECK(mt_gemm(&a, NULL) == MT_ERR_UNSUPPORTED); /* beta without C */
  a = good, a.ldy = 32;
  CHECK(mt_gemm(&a, NULL) == MT_ERR_UNSUPPORTED);
  a = good, a.path = MT_PATH_FUSED;
  CHECK(mt_gemm(&a, NULL) == MT_ERR_UNSUPPORTED); /* the fused kernel without the packed weight */
  a = good, a.path = (enum mt_gemm_path)7;
  CHECK(mt_gemm(&a, NULL) == MT_ERR_UNSUPPORTED);
  a = good, a.path = MT_PATH_LARGE, a.workspace_bytes = 0;
  CHECK(mt_gemm(&a, NULL) == MT_ERR_NOMEM); /* the large path takes it: the next check refuses */
  /* the kept form (no xhat): the workspace must hold its dequantized copy too */
  mt_qweight kept = w;
  kept.xhat = NULL;
  a = good, a.w = &kept, a.workspace_bytes = mt_gemm_workspace_bytes(4, 64, &numerics_row);
  CHECK(mt_gemm(&a, NULL) == MT_ERR_NOMEM);
  a.workspace_bytes += mt_qweight_xhat_bytes(64, 64) - 1;
  CHECK(mt_gemm(&a, NULL) == MT_ERR_NOMEM);
  kept.codes = NULL;
  a.workspace_bytes = sizeof fake;
  CHECK(mt_gemm(&a, NULL) == MT_ERR_UNSUPPORTED); /* no codes: nothing to multiply */
  CHECK(mt_gemm(NULL, NULL) == MT_ERR_UNSUPPORTED);

  mt_numerics tile_row = {MT_SCALE_ROW, MT_SCALE_ROW, MT_WBLOCK_16X16};
  CHECK(mt_qweight_bytes(64, 64, &tile_row) == 0); /* 16x16 needs one S per matrix */
  mt_numerics tile = {MT_SCALE_ROW, MT_SCALE_TENSOR, MT_WBLOCK_16X16};
  CHECK(mt_qweight_bytes(40, 64, &tile) == 0); /* rows % 16 */
  CHECK(mt_qweight_bytes(64, 40, &numerics_row) == 0);
  size_t bytes = mt_qweight_bytes(64, 64, &numerics_row);
  CHECK(bytes >= 64 * 64 * 2 + 64 * 32 + 64 * 4 + 4);
  mt_qweight q;
  CHECK(mt_qweight_bind(&q, 64, 64, &numerics_row, fake + 16) == MT_ERR_UNSUPPORTED);
  CHECK(mt_qweight_bind(&q, 64, 64, &numerics_row, fake) == MT_OK);
  CHECK((void *)q.codes == (void *)fake && (uintptr_t)q.scales % 256 == 0 &&
        (uintptr_t)q.outer % 256 == 0 && (uintptr_t)q.xhat % 256 == 0);
  CHECK((size_t)((unsigned char *)q.xhat - fake) + 64 * 64 * 2 <= bytes);
  /* the kept form: the same sections up to S, no dequantized or fragment copy */
  size_t kept_bytes = mt_qweight_kept_bytes(64, 64, &numerics_row);
  mt_qweight qk;
  CHECK(kept_bytes >= 64 * 32 + 64 * 4 + 4 && kept_bytes < bytes &&
        mt_qweight_kept_bytes(40, 64, &tile) == 0);
  CHECK(mt_qweight_bind_kept(&qk, 64, 64, &numerics_row, fake + 16) == MT_ERR_UNSUPPORTED);
  CHECK(mt_qweight_bind_kept(&qk, 64, 64, &numerics_row, fake) == MT_OK);
  CHECK(qk.codes == q.codes && qk.scales == q.scales && qk.outer == q.outer && !qk.xhat &&
        !qk.frag && (size_t)((unsigned char *)qk.outer - fake) + 4 <= kept_bytes);
  CHECK(mt_quantize_weight(fake + 2, MT_DTYPE_BF16, 64, &q, NULL) == MT_ERR_UNSUPPORTED);
  CHECK(mt_quantize_weight(fake, MT_DTYPE_FP32, 64, &q, NULL) == MT_ERR_UNSUPPORTED);
  CHECK(strcmp(mt_status_name(MT_ERR_CAPTURE), "stream capture") == 0);
}

int main(void) {
  seed_rng();
  RUN(gemm_rejects_bad_arguments);
  RUN(quant_row_scale);
  RUN(quant_ties);
  RUN(quant_tensor_scale);
  RUN(quant_weight_blocks);
  RUN(quant_weight_only_if);
  RUN(kept_weight_dequant);
  RUN(quant_weight_in_out);
  RUN(gemm_accuracy);
  RUN(gemm_epilogue_and_strides);
  RUN(gemm_nan_rows);
  RUN(gemm_batch_invariance);
  RUN(gemm_paths_agree);
  RUN(gemm_large_tiles);
  RUN(gemm_many_tiles);
  RUN(engine_contexts_and_capture);
  return mt_test_done();
}
