/* bench_kernels.c — `make bench` (device machine): time the engine's W4A4 GEMM (mt_gemm, weights
 * pre-quantized, activation quantization included as a routed call does it) against cuBLAS BF16
 * (cublasGemmEx TN) on MoE expert shapes, the quantization kernels in GB/s, and at 1-16 tokens
 * every GEMM path forced beside AUTO's choice (the table AUTO's thresholds come from).
 *
 * Method (bench/bench_common.h): random data; each measurement is a CUDA graph of many calls whose
 * weights rotate over the experts of a layer (128, so they stream from HBM rather than sit in L2),
 * timed with CUDA events around whole replays after one warm-up replay; the median of REPLAYS
 * replays divided by the calls per graph is the time per call. Both sides run in the same process
 * on the same buffers' shapes. Prints a table and writes JSON to argv[1] (default
 * build/bench.json). MT_BENCH_EXPERTS=E (1 to 128) rotates over E experts instead: with 1 the
 * weights stay in L2, which says what streaming them from HBM costs a call (an experiment, not the
 * benchmark's method).
 */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/driver.h"
#include "kernels/engine.h"
#include "kernels/gemm.h"
#include "kernels/gemm_args.h"
#include "kernels/quant.h"
#include "kernels/wstore.h"

#include "bench/bench_common.h"

#define EXPERTS 128

typedef struct {
  const char *name;
  int n, k;
} shape;

static const shape shapes[] = {
    {"qwen3_gate_up", 1536, 2048},
    {"qwen3_down", 2048, 768},
    {"dsv3_gate_up", 4096, 7168},
    {"dsv3_down", 7168, 2048},
};
static const int ms[] = {1, 4, 16, 64, 256, 300, 1024, 4096, 16384}; /* 300: a ragged last band */
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))
#define NMS ((int)(sizeof ms / sizeof ms[0]))

static cublasHandle_t blas;

/* ---- GEMMs --------------------------------------------------------------------------------- */

typedef struct {
  const shape *s;
  int m;
  uint16_t *w_bf16; /* EXPERTS x n x k */
  mt_qweight q[EXPERTS];
  mt_qweight kept[EXPERTS]; /* the same codes and scales in the kept form (no xhat, no fragments) */
  int use_kept;
  uint16_t *x, *y;
  void *ws;
  size_t ws_bytes;
  int experts; /* rotated over */
  enum mt_gemm_path path;
} gemm_ctx;

static mt_gemm_args ours_args(const gemm_ctx *g, int i);

static int call_ours(void *p, int i) {
  gemm_ctx *g = p;
  mt_gemm_args a = ours_args(g, i);
  int st = mt_gemm(&a, (mt_stream)stream);
  if (st != MT_OK)
    fprintf(stderr, "bench: mt_gemm %s m=%d: %s\n", g->s->name, g->m, mt_status_name(st));
  return st;
}

/* The two halves of call_ours: the activation quantization alone, and the GEMM launcher alone on
 * activations quantized once beforehand (the workspace keeps them): xhat, then S after it in the
 * engine's layout (kernels/engine.c). */
static mt_gemm_args ours_args(const gemm_ctx *g, int i) {
  mt_gemm_args a = {.m = g->m,
                    .n = g->s->n,
                    .k = g->s->k,
                    .x = g->x,
                    .ldx = (size_t)g->s->k,
                    .xtype = MT_DTYPE_BF16,
                    .w = g->use_kept ? &g->kept[i % g->experts] : &g->q[i % g->experts],
                    .y = g->y,
                    .ldy = (size_t)g->s->n,
                    .ytype = MT_DTYPE_BF16,
                    .alpha = 1.0f,
                    .workspace = g->ws,
                    .workspace_bytes = g->ws_bytes,
                    .path = g->path};
  return a;
}

static float *act_outer(const gemm_ctx *g) {
  return (float *)((char *)g->ws + ((size_t)g->m * g->s->k * 2 + 255) / 256 * 256);
}

static int call_act_quant(void *p, int i) {
  gemm_ctx *g = p;
  (void)i;
  mt_quant_params q = {.x = g->x,
                       .ldx = g->s->k,
                       .rows = g->m,
                       .cols = g->s->k,
                       .row_outer = 1,
                       .xhat = g->ws,
                       .outer = act_outer(g)};
  return mt_quantize(&q, 0, (mt_stream)stream);
}

static int call_gemm_only(void *p, int i) {
  gemm_ctx *g = p;
  mt_gemm_args a = ours_args(g, i);
  mt_qact q = {.xhat = g->ws, .outer = act_outer(g)};
  return mt_gemm_launch(&a, &q, (mt_stream)stream);
}

static int call_cublas(void *p, int i) {
  gemm_ctx *g = p;
  const float alpha = 1.0f, beta = 0.0f;
  const uint16_t *w = g->w_bf16 + (size_t)(i % g->experts) * g->s->n * g->s->k;
  cublasStatus_t st = cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, g->s->n, g->m, g->s->k, &alpha,
                                   w, CUDA_R_16BF, g->s->k, g->x, CUDA_R_16BF, g->s->k, &beta, g->y,
                                   CUDA_R_16BF, g->s->n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS)
    fprintf(stderr, "bench: cublasGemmEx %s m=%d: status %d\n", g->s->name, g->m, (int)st);
  return st != CUBLAS_STATUS_SUCCESS;
}

/* MT_BENCH_ONLY=NAME:M runs that one row alone (any M; no quantization or path table): for a
 * profiler. */
static const char *only_name;
static int only_m;

/* Few tokens, each path forced (mt_gemm_args.path) and AUTO's choice: the table that sets AUTO's
 * thresholds (kernels/gemm.c, mt_gemm_path_of). Printed after the main table. Graphs of 256 calls,
 * as the main table's rows of few tokens. */
static const int path_ms[] = {1, 2, 3, 4, 5, 6, 8, 12, 16};
#define NPATH_MS ((int)(sizeof path_ms / sizeof path_ms[0]))
static char path_table[8192];

/* A time for the path table: "-" (text) or null (JSON) where the path cannot take the call. */
static const char *path_us(char *buf, size_t size, double t, int json_form) {
  if (t > 0)
    snprintf(buf, size, json_form ? "%.3f" : "%7.2f", t * 1e6);
  else
    snprintf(buf, size, json_form ? "null" : "%7s", "-");
  return buf;
}

static void bench_paths(gemm_ctx *g) {
  static const char *names[] = {"auto", "fused", "large"};
  g->m = 1; /* a graph run and dropped: the first after the weights' quantization runs slow
              * (lab/NOTES.md, "Measurement method and noise") */
  g->path = MT_PATH_LARGE;
  time_calls(call_ours, g, 256);
  for (int i = 0; i < NPATH_MS; i++) {
    double t[3];
    g->m = path_ms[i];
    for (int p = MT_PATH_FUSED; p <= MT_PATH_LARGE + 1; p++) { /* AUTO last */
      g->path = (enum mt_gemm_path)(p % (MT_PATH_LARGE + 1));
      mt_gemm_args a = ours_args(g, 0);
      t[g->path] = mt_gemm_path_of(&a) < 0 ? 0 : time_calls(call_ours, g, 256);
    }
    g->path = MT_PATH_AUTO;
    mt_gemm_args a = ours_args(g, 0);
    const char *pick = names[mt_gemm_path_of(&a)];
    char b[2][16];
    size_t used = strlen(path_table);
    snprintf(path_table + used, sizeof path_table - used, "%-14s %3d | %s %s | %-5s %7.2f\n",
             g->s->name, g->m, path_us(b[0], 16, t[MT_PATH_FUSED], 0),
             path_us(b[1], 16, t[MT_PATH_LARGE], 0), pick, t[0] * 1e6);
    char row[384];
    snprintf(row, sizeof row,
             "{\"kind\": \"path\", \"shape\": \"%s\", \"m\": %d, \"fused_us\": %s, "
             "\"large_us\": %s, \"auto\": \"%s\", \"auto_us\": %.3f}",
             g->s->name, g->m, path_us(b[0], 16, t[MT_PATH_FUSED], 1),
             path_us(b[1], 16, t[MT_PATH_LARGE], 1), pick, t[0] * 1e6);
    json_row(row);
  }
}

/* The experts the weights rotate over: EXPERTS, or MT_BENCH_EXPERTS where set to 1 .. EXPERTS. */
static int bench_experts(void) {
  const char *env = getenv("MT_BENCH_EXPERTS");
  int e = env ? atoi(env) : EXPERTS;
  if (e < 1 || e > EXPERTS) {
    fprintf(stderr, "bench: MT_BENCH_EXPERTS=%s is not 1 to %d; using %d\n", env, EXPERTS, EXPERTS);
    e = EXPERTS;
  }
  return e;
}

static void bench_shape(const shape *s, const mt_numerics *num) {
  if (only_name && strcmp(only_name, s->name) != 0)
    return;
  static gemm_ctx g;
  memset(&g, 0, sizeof g);
  g.s = s;
  g.experts = bench_experts();
  size_t wn = (size_t)s->n * (size_t)s->k, qbytes = mt_qweight_bytes(s->n, s->k, num);
  int max_m = only_name && only_m > ms[NMS - 1] ? only_m : ms[NMS - 1];
  g.w_bf16 = dmalloc(wn * 2 * EXPERTS);
  fill(g.w_bf16, wn * EXPERTS);
  char *qmem = dmalloc(qbytes * EXPERTS);
  for (int e = 0; e < EXPERTS; e++) {
    if (mt_qweight_bind(&g.q[e], s->n, s->k, num, qmem + qbytes * e) != MT_OK ||
        mt_quantize_weight(g.w_bf16 + wn * e, MT_DTYPE_BF16, (size_t)s->k, &g.q[e],
                           (mt_stream)stream) != MT_OK) {
      fprintf(stderr, "bench: quantizing %s failed\n", s->name);
      exit(1);
    }
    g.kept[e] = g.q[e];
    g.kept[e].xhat = NULL;
    g.kept[e].frag = NULL;
  }
  CUDA_OK(cudaStreamSynchronize(stream));
  g.x = dmalloc((size_t)max_m * s->k * 2);
  fill(g.x, (size_t)max_m * s->k);
  g.y = dmalloc((size_t)max_m * s->n * 2);
  g.ws_bytes = mt_gemm_workspace_bytes(max_m, s->k, num) + mt_qweight_xhat_bytes(s->n, s->k);
  g.ws = dmalloc(g.ws_bytes);
  if (!only_name) /* first: after the M = 16384 rows the clocks need a while to recover */
    bench_paths(&g);

  for (int i = 0; i < (only_name ? 1 : NMS); i++) {
    g.m = only_name ? only_m : ms[i];
    /* enough calls that a replay runs well past launch gaps, few when each is long */
    int calls = g.m <= 256 ? 256 : g.m <= 1024 ? 64 : 16;
    double t_ours = time_calls(call_ours, &g, calls);
    double t_blas = time_calls(call_cublas, &g, calls);
    double t_quant = time_calls(call_act_quant, &g, calls);
    double t_gemm = time_calls(call_gemm_only, &g, calls);
    g.use_kept = 1;
    double t_kept = time_calls(call_ours, &g, calls);
    g.use_kept = 0;
    double flop = 2.0 * g.m * s->n * s->k;
    double wbytes_ours = (double)wn * 0.5 + (double)wn / 16; /* codes + E4M3 scales */
    double wbytes_blas = (double)wn * 2;
    printf("%-14s %6d %5d %5d | %9.2f %9.2f | %6.2f | %7.2f %7.2f | %7.1f %7.1f | %7.0f %7.0f | "
           "%8.2f %6.2f\n",
           s->name, g.m, s->n, s->k, t_ours * 1e6, t_blas * 1e6, t_ours > 0 ? t_blas / t_ours : 0,
           t_quant * 1e6, t_gemm * 1e6, t_ours > 0 ? flop / t_ours * 1e-12 : 0,
           flop / t_blas * 1e-12, t_ours > 0 ? wbytes_ours / t_ours * 1e-9 : 0,
           wbytes_blas / t_blas * 1e-9, t_kept * 1e6, t_kept > 0 ? t_blas / t_kept : 0);
    fflush(stdout);
    char row[768];
    snprintf(row, sizeof row,
             "{\"kind\": \"gemm\", \"shape\": \"%s\", \"m\": %d, \"n\": %d, \"k\": %d, "
             "\"calls_per_graph\": %d, \"experts\": %d, \"ours_us\": %.3f, \"cublas_bf16_us\": "
             "%.3f, \"speedup\": %.3f, \"ours_tflops\": %.2f, \"cublas_tflops\": %.2f, "
             "\"ours_weight_gbps\": %.1f, \"cublas_weight_gbps\": %.1f, \"act_quant_us\": %.3f, "
             "\"gemm_only_us\": %.3f, \"kept_us\": %.3f}",
             s->name, g.m, s->n, s->k, calls, g.experts, t_ours * 1e6, t_blas * 1e6,
             t_ours > 0 ? t_blas / t_ours : 0, t_ours > 0 ? flop / t_ours * 1e-12 : 0,
             flop / t_blas * 1e-12, t_ours > 0 ? wbytes_ours / t_ours * 1e-9 : 0,
             wbytes_blas / t_blas * 1e-9, t_quant * 1e6, t_gemm * 1e6, t_kept * 1e6);
    json_row(row);
  }
  cudaFree(g.w_bf16);
  cudaFree(qmem);
  cudaFree(g.x);
  cudaFree(g.y);
  cudaFree(g.ws);
}

/* ---- quantization -------------------------------------------------------------------------- */

#define QSETS 4 /* input/output sets rotated over, 4 x 64 MB: far past L2 */

typedef struct {
  mt_quant_params p[QSETS];
  int tile16;
} quant_ctx;

static int call_quant(void *p, int i) {
  quant_ctx *q = p;
  return mt_quantize(&q->p[i % QSETS], q->tile16, (mt_stream)stream);
}

static int call_copy(void *p, int i) {
  quant_ctx *q = p;
  size_t bytes = (size_t)q->p[0].rows * (size_t)q->p[0].cols * 2;
  return cudaMemcpyAsync(q->p[i % QSETS].xhat, q->p[i % QSETS].x, bytes, cudaMemcpyDeviceToDevice,
                         stream) != cudaSuccess;
}

static void bench_quant(void) {
  enum { ROWS = 8192, COLS = 2048 };
  static quant_ctx q;
  /* the weight store: 8 slices (experts) of 1024 rows */
  size_t elems = (size_t)ROWS * COLS, store_bytes = 8 * MT_WS_SLICE_BYTES(ROWS / 8, COLS, 1);
  uint8_t *stores[QSETS];
  for (int i = 0; i < QSETS; i++) {
    stores[i] = dmalloc(store_bytes);
    void *x = dmalloc(elems * 2);
    fill(x, elems);
    q.p[i] = (mt_quant_params){.x = x,
                               .ldx = COLS,
                               .rows = ROWS,
                               .cols = COLS,
                               .xhat = dmalloc(elems * 2),
                               .codes = dmalloc(elems / 2),
                               .scales = dmalloc(elems / 16),
                               .outer = dmalloc(ROWS * 4 + 256)};
    q.p[i].amax = (uint32_t *)(q.p[i].outer + ROWS);
  }
  struct {
    const char *name;
    int row_outer, codes, tile16, store, in_out;
    call_fn fn;
  } variants[] = {
      {"act_row_scale (xhat + S)", 1, 0, 0, 0, 0, call_quant},
      {"act_tensor_scale (amax pass + xhat)", 0, 0, 0, 0, 0, call_quant},
      {"weight store, row S (4.5 bits + S)", 1, 0, 0, 1, 0, call_quant},
      {"weight store, row S, [in, out] weights", 1, 0, 0, 1, 1, call_quant},
      {"weight store, tensor S (amax + 4.5 bits)", 0, 0, 0, 1, 0, call_quant},
      {"weight store, 16x16 tiles", 0, 0, 1, 1, 0, call_quant},
      {"weight_row_1x16 (xhat+codes+scales)", 1, 1, 0, 0, 0, call_quant},
      {"weight_tensor_16x16 (all outputs)", 0, 1, 1, 0, 0, call_quant},
      {"cudaMemcpy D2D (ceiling)", 1, 0, 0, 0, 0, call_copy},
  };
  printf("quantization %dx%d BF16 (GB/s of bytes read + written, each input read once)\n", ROWS,
         COLS);
  for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
    uint8_t *codes[QSETS], *scales[QSETS];
    for (int i = 0; i < QSETS; i++) {
      codes[i] = q.p[i].codes;
      scales[i] = q.p[i].scales;
      q.p[i].row_outer = variants[v].row_outer;
      if (!variants[v].codes)
        q.p[i].codes = NULL, q.p[i].scales = NULL;
      q.p[i].store = variants[v].store ? stores[i] : NULL;
      q.p[i].batch_rows = variants[v].store ? ROWS / 8 : 0;
      /* each slice its own 1024 rows (with no stride all eight would read the first, from L2) */
      q.p[i].batch_stride = variants[v].store ? (int64_t)(ROWS / 8) * COLS : 0;
      /* [in, out]: a slice's element (r, c) at c * 1024 + r */
      q.p[i].in_out = variants[v].in_out;
      q.p[i].ldx = variants[v].in_out ? ROWS / 8 : COLS;
      q.p[i].slice_bytes = (int64_t)(store_bytes / 8);
    }
    q.tile16 = variants[v].tile16;
    double t = time_calls(variants[v].fn, &q, 64);
    double bytes = (double)elems * 2 * (variants[v].store ? 1 : 2) +
                   (variants[v].fn == call_copy ? 0 : ROWS * 4.0);
    if (variants[v].store)
      bytes += (double)store_bytes;
    if (variants[v].codes)
      bytes += (double)elems / 2 + (double)elems / 16;
    printf("  %-38s %8.2f us %8.0f GB/s\n", variants[v].name, t * 1e6, bytes / t * 1e-9);
    char row[384];
    snprintf(row, sizeof row,
             "{\"kind\": \"quant\", \"variant\": \"%s\", \"rows\": %d, \"cols\": %d, \"us\": %.3f, "
             "\"gbps\": %.1f}",
             variants[v].name, ROWS, COLS, t * 1e6, bytes / t * 1e-9);
    json_row(row);
    for (int i = 0; i < QSETS; i++)
      q.p[i].codes = codes[i], q.p[i].scales = scales[i], q.p[i].store = NULL,
      q.p[i].batch_rows = 0;
  }
  for (int i = 0; i < QSETS; i++) {
    cudaFree(stores[i]);
    cudaFree((void *)q.p[i].x);
    cudaFree(q.p[i].xhat);
    cudaFree(q.p[i].codes);
    cudaFree(q.p[i].scales);
    cudaFree(q.p[i].outer);
  }
}

/* ---- CTA shapes of the per-row quantization kernel (--sweep) ------------------------------- */

typedef struct {
  mt_quant_params p[QSETS];
  CUfunction f;
  unsigned tx, ty;
} shaped_ctx;

static int call_shaped(void *p, int i) {
  shaped_ctx *c = p;
  const mt_quant_params *q = &c->p[i % QSETS];
  CUlaunchConfig cfg = {0};
  cfg.gridDimX = ((unsigned)q->rows + c->ty - 1) / c->ty;
  cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = c->tx;
  cfg.blockDimY = c->ty;
  cfg.blockDimZ = 1;
  cfg.hStream = (CUstream)stream;
  void *args[] = {(void *)q};
  return mt_driver_get()->launch_kernel_ex(&cfg, c->f, args, NULL) != CUDA_SUCCESS;
}

static unsigned threads_for(unsigned blocks) {
  unsigned t = 1;
  if (blocks > 32)
    return (blocks + 31) / 32 * 32;
  while (t < blocks)
    t <<= 1;
  return t;
}

/* The row kernel (BF16, xhat + S only) over blocks per thread and rows per CTA, to choose the
 * launcher's shapes: GB/s at large M, microseconds at M = 1. */
static void sweep_quant(void) {
  static const int ks[] = {768, 2048, 7168};
  static const int nbs[] = {1, 2, 4, 8};
  static const unsigned tys[] = {1, 2, 4, 8, 16};
  static shaped_ctx c;
  printf("\nper-row quantization kernel shapes (BF16 in, xhat + S out)\n");
  for (int ki = 0; ki < 3; ki++) {
    int k = ks[ki], rows = (int)(((size_t)64 << 20) / ((size_t)k * 2)); /* 64 MB of input */
    size_t elems = (size_t)rows * k;
    for (int i = 0; i < QSETS; i++) {
      void *x = dmalloc(elems * 2);
      fill(x, elems);
      c.p[i] = (mt_quant_params){.x = x,
                                 .ldx = k,
                                 .rows = rows,
                                 .cols = k,
                                 .row_outer = 1,
                                 .xhat = dmalloc(elems * 2),
                                 .outer = dmalloc((size_t)rows * 4)};
    }
    for (int n = 0; n < 4; n++) {
      unsigned blocks = (unsigned)(k / 16 + nbs[n] - 1) / (unsigned)nbs[n];
      c.tx = threads_for(blocks);
      char name[64];
      snprintf(name, sizeof name, "mt_quant_row_bf16_nb%d", nbs[n]);
      if (c.tx > 512 || mt_kernel_get("quant", name, (CUstream)stream, &c.f) != MT_OK)
        continue;
      for (int t = 0; t < 5; t++) {
        c.ty = tys[t];
        if (c.tx * c.ty > 512 || c.tx * c.ty < 32)
          continue;
        for (int i = 0; i < QSETS; i++)
          c.p[i].rows = rows;
        double t_big = time_calls(call_shaped, &c, 32);
        for (int i = 0; i < QSETS; i++)
          c.p[i].rows = 1;
        double t_one = time_calls(call_shaped, &c, 256);
        printf("  K %5d nb %d  %3u x %2u threads: %6.0f GB/s (%d rows), M=1 %5.2f us\n", k, nbs[n],
               c.tx, c.ty, (double)elems * 4 / t_big * 1e-9, rows, t_one * 1e6);
      }
    }
    for (int i = 0; i < QSETS; i++) {
      cudaFree((void *)c.p[i].x);
      cudaFree(c.p[i].xhat);
      cudaFree(c.p[i].outer);
    }
  }
}

int main(int argc, char **argv) {
  int sweep = argc > 1 && strcmp(argv[1], "--sweep") == 0;
  if (sweep)
    argc--, argv++;
  const char *out = argc > 1 ? argv[1] : "build/bench.json";
  bench_open("bench", out, &blas);
  struct cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  fprintf(json, "{\"device\": \"%s\", \"experts\": %d, \"replays\": %d, \"results\": [", prop.name,
          EXPERTS, REPLAYS);

  if (sweep) {
    sweep_quant();
    return 0;
  }
  static char only[64];
  const char *env = getenv("MT_BENCH_ONLY");
  if (env && snprintf(only, sizeof only, "%s", env) < (int)sizeof only && strchr(only, ':')) {
    *strchr(only, ':') = '\0';
    only_name = only;
    only_m = atoi(only + strlen(only) + 1);
  } else {
    bench_quant();
  }
  mt_numerics num = {MT_SCALE_ROW, MT_SCALE_TENSOR, MT_WBLOCK_1X16}; /* nvfp4-row */
  printf("\n");
  printf("W4A4 GEMM (nvfp4-row, weights pre-quantized, activation quantization included) vs "
         "cuBLAS BF16, %s\n",
         prop.name);
  printf("ours = quant + gemm (each also timed alone); ratio = cublas / ours; TF/s and weight GB/s "
         "ours, cublas; kept: the weight in the kept form (codes and scales, dequantized into the\n"
         "workspace at each call: the frozen cache's single calls), us and cublas / kept\n");
  printf("%-14s %6s %5s %5s | %9s %9s | %6s | %7s %7s | %7s %7s | %7s %7s | %8s %6s\n", "shape",
         "M", "N", "K", "ours us", "cublas us", "ratio", "quant", "gemm", "TF/s", "TF/s", "wGB/s",
         "wGB/s", "kept us", "ratio");
  for (int s = 0; s < NSHAPES; s++)
    bench_shape(&shapes[s], &num);
  if (!only_name) {
    printf(
        "\nfew tokens: each path forced, and AUTO's choice (us per call, quantization included)\n");
    printf("%-14s %3s | %7s %7s | %-5s %7s\n", "shape", "M", "fused", "large", "auto", "us");
    printf("%s", path_table);
  }
  fprintf(json, "\n]}\n");
  fclose(json);
  printf("\nwrote %s\n", out);
  return 0;
}
