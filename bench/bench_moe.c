/* bench_moe.c — `make bench` (device machine): one MoE layer's expert GEMMs (gate_up, then down) at
 * the geometries of Qwen3-30B-A3B (128 experts, top-8, 1536x2048 and 2048x768) and DeepSeek-V3 (256
 * experts, top-8, 4096x7168 and 7168x2048), T tokens routed top-8 at random: the grouped NVFP4
 * engine (weights resident in the 4.5-bit store, activation quantization included: one
 * mt_gemm_grouped per GEMM) against cuBLAS BF16 cublasGemmGroupedBatchedEx (one group per active
 * expert) on the same routing in the same run.
 *
 * Method (bench/bench_common.h): a graph of ROUTINGS layer calls, each with its own random routing
 * (so that a replay does not find the last call's experts in L2), median of REPLAYS replays. Per
 * row: µs per layer, the ratio cuBLAS / ours, TFLOP/s (2 * 8T * (N1 K1 + N2 K2) per layer) and the
 * weight bytes read per second (the active experts' weights: 4.5 bits an element for ours, 16 for
 * cuBLAS's). A sanity column gives the relative L2 difference of our output against cuBLAS's on
 * the last routing (NVFP4 W4A4 against BF16: ~0.1 on these Gaussian-like data), and the frozen
 * caches' refresh of the layer's weights for the routing (nothing changed: the check of the
 * routed experts' slices, every byte or the sample; "synced": the sampled refresh after a weight
 * sync, every routed expert requantized), and the layer as served under frozen-sampled (each
 * weight's grouped call running its refresh, nothing changed: "served", and its time over the
 * layer's alone, "check"; and served after a weight sync, every routed expert requantized by the
 * call that uses it: "srv sync"). Writes JSON to argv[1] (default build/bench_moe.json);
 * `--only NAME` runs one geometry, `--tokens T` one T, any (a sweep, a profiler), `--bn BN` forces
 * the grouped kernel's token tile (an A/B of the launcher's choice). */
#include <cublas_v2.h>
#include <math.h>
#include <string.h>

#include "bench/bench_common.h"
#include "bench/moe_args.h"
#include "kernels/engine.h"

#define TOPK 8
#define MAX_ROUTINGS 16

typedef struct {
  const char *name;
  int experts, hidden, width; /* gate_up: 2 width x hidden; down: hidden x width */
} geometry;

static const geometry geometries[] = {{"qwen3", 128, 2048, 768}, {"dsv3", 256, 7168, 2048}};
static const int tokens[] = {1, 16, 128, 1024, 8192};

static cublasHandle_t blas;
static int only_tokens; /* --tokens */
static int force_bn;    /* --bn: the grouped kernel's token tile (0: the launcher's choice) */

/* One GEMM of the layer: E experts' weights (BF16 for cuBLAS, the store for ours). */
typedef struct {
  int n, k;
  uint16_t *w; /* E x n x k */
  void *qmem;  /* the store */
  mt_wstore ws;
} layer_gemm;

/* One routing: rows per expert (sorted by expert, as a sorted dispatch gives them), the device
 * offsets our engine reads, and the pointer arrays cuBLAS's grouped form reads (one problem per
 * active expert). */
typedef struct {
  int rows[512], active;
  int32_t *offs;     /* device */
  const void **ptrs; /* device: A (weights), B (x), C (y) of each active expert, for both GEMMs */
  int m[512], ldab[512];
} routing;

typedef struct {
  const geometry *g;
  int t, routings;
  layer_gemm up, down;
  routing r[MAX_ROUTINGS];
  uint16_t *x, *h, *y; /* 8T x hidden, 8T x 2 width, 8T x hidden */
  void *ws;
  size_t ws_bytes;
} moe_ctx;

static void make_gemm(layer_gemm *l, int experts, int n, int k) {
  mt_numerics num = {MT_SCALE_ROW, MT_SCALE_TENSOR, MT_WBLOCK_1X16};
  l->n = n, l->k = k;
  l->w = dmalloc((size_t)experts * n * k * 2);
  fill(l->w, (size_t)experts * n * k);
  l->qmem = dmalloc(mt_wstore_bytes(experts, n, k, &num));
  if (mt_wstore_bind(&l->ws, experts, n, k, &num, l->qmem) != MT_OK ||
      mt_wstore_quantize(l->w, MT_DTYPE_BF16, (size_t)k, (size_t)n * k, &l->ws,
                         (mt_stream)stream) != MT_OK) {
    fprintf(stderr, "bench_moe: quantizing %d x %dx%d failed\n", experts, n, k);
    exit(1);
  }
}

/* T tokens, each to TOPK distinct experts at random: the rows of each expert. */
static void make_routing(routing *r, int experts, int t) {
  memset(r->rows, 0, sizeof r->rows);
  for (int i = 0; i < t; i++) {
    int chosen[TOPK];
    for (int j = 0; j < TOPK; j++) {
      int e, dup;
      do {
        e = (int)(rnd() % (uint64_t)experts);
        dup = 0;
        for (int u = 0; u < j; u++)
          dup |= chosen[u] == e;
      } while (dup);
      chosen[j] = e;
      r->rows[e]++;
    }
  }
  int32_t offs[512];
  int at = 0;
  r->active = 0;
  for (int e = 0; e < experts; e++) {
    at += r->rows[e];
    offs[e] = at;
    r->active += r->rows[e] > 0;
  }
  r->offs = dmalloc((size_t)experts * 4);
  CUDA_OK(cudaMemcpyAsync(r->offs, offs, (size_t)experts * 4, cudaMemcpyHostToDevice, stream));
}

/* cuBLAS's pointer arrays for one GEMM (weights w, inputs in, outputs out): 3 x active. */
static void make_ptrs(const moe_ctx *c, routing *r, const layer_gemm *l, const uint16_t *in,
                      uint16_t *out, const void **dev) {
  const void **h = malloc(3 * (size_t)r->active * sizeof *h);
  int at = 0, p = 0;
  for (int e = 0; e < c->g->experts; e++) {
    if (r->rows[e]) {
      h[p] = l->w + (size_t)e * l->n * l->k;
      h[r->active + p] = in + (size_t)at * l->k;
      h[2 * r->active + p] = out + (size_t)at * l->n;
      r->m[p] = r->rows[e];
      p++;
    }
    at += r->rows[e];
  }
  CUDA_OK(
      cudaMemcpyAsync(dev, h, 3 * (size_t)r->active * sizeof *h, cudaMemcpyHostToDevice, stream));
  free(h);
}

/* One grouped GEMM of the layer; with refresh, the call refreshes the store first. */
static int ours_gemm_refreshed(moe_ctx *c, const routing *r, const layer_gemm *l,
                               const uint16_t *in, uint16_t *out,
                               const mt_wstore_refresh_args *refresh) {
  mt_grouped_args a = mtb_layer_args(&l->ws, c->g->experts, l->n, l->k, r->offs, TOPK * c->t, in,
                                     out, c->ws, c->ws_bytes);
  a.bn = force_bn;
  a.refresh = refresh;
  int st = mt_gemm_grouped(&a, (mt_stream)stream);
  if (st != MT_OK)
    fprintf(stderr, "bench_moe: mt_gemm_grouped: %s\n", mt_status_name((enum mt_status)st));
  return st;
}

static int ours_gemm(moe_ctx *c, const routing *r, const layer_gemm *l, const uint16_t *in,
                     uint16_t *out) {
  return ours_gemm_refreshed(c, r, l, in, out, NULL);
}

static int call_ours(void *p, int i) {
  moe_ctx *c = p;
  const routing *r = &c->r[i % c->routings];
  return ours_gemm(c, r, &c->up, c->x, c->h) || ours_gemm(c, r, &c->down, c->h, c->y);
}

static int blas_gemm(const routing *r, const layer_gemm *l, const void **ptrs) {
  static cublasOperation_t ta[512], tb[512];
  static int nn[512], kk[512], lda[512], ldc[512], one[512];
  static float alpha[512], beta[512];
  for (int p = 0; p < r->active; p++) {
    ta[p] = CUBLAS_OP_T, tb[p] = CUBLAS_OP_N, nn[p] = l->n, kk[p] = l->k, lda[p] = l->k,
    ldc[p] = l->n;
    one[p] = 1, alpha[p] = 1.0f, beta[p] = 0.0f;
  }
  cublasStatus_t st = cublasGemmGroupedBatchedEx(
      blas, ta, tb, nn, r->m, kk, alpha, ptrs, CUDA_R_16BF, lda, ptrs + r->active, CUDA_R_16BF, lda,
      beta, (void *const *)(ptrs + 2 * r->active), CUDA_R_16BF, ldc, r->active, one,
      CUBLAS_COMPUTE_32F);
  if (st != CUBLAS_STATUS_SUCCESS)
    fprintf(stderr, "bench_moe: cublasGemmGroupedBatchedEx: %d\n", (int)st);
  return st != CUBLAS_STATUS_SUCCESS;
}

/* The frozen caches' refresh (check, then the quantization of changed slices: none here). The
 * whole of gate_up's tensor (every slice); or the layer's two weights for a routing, which covers
 * only the experts with rows in it. */
typedef struct {
  moe_ctx *c;
  void *state[2]; /* gate_up's, down's */
  unsigned step;
  int whole;
  int synced; /* each state zeroed first: every slice requantized, as after a weight sync */
} check_ctx;

/* Weight l's refresh (state: its state) for routing r, or for every slice. */
static mt_wstore_refresh_args refresh_of(const check_ctx *k, const layer_gemm *l, void *state,
                                         const routing *r) {
  return (mt_wstore_refresh_args){.w = l->w,
                                  .type = MT_DTYPE_BF16,
                                  .ldw = (size_t)l->k,
                                  .ws = &l->ws,
                                  .state = state,
                                  .step = k->step,
                                  .offs = r ? r->offs : NULL,
                                  .m = TOPK * k->c->t};
}

/* A weight's state zeroed first where the calls are timed after a weight sync (k->synced). */
static int sync_state(const check_ctx *k, void *state) {
  return k->synced && cudaMemsetAsync(state, 0, mt_refresh_state_bytes(k->c->g->experts), stream);
}

static int refresh(check_ctx *k, layer_gemm *l, void *state, const routing *r) {
  if (sync_state(k, state))
    return 1;
  const mt_wstore_refresh_args a = refresh_of(k, l, state, r);
  return mt_wstore_refresh(&a, (mt_stream)stream);
}

/* The layer as the shim serves it under a frozen mode: each weight's grouped call with its
 * refresh (kernels/engine.h, mt_grouped_args.refresh: the refresh beside the activations'
 * quantization, the GEMM starting before it ends). */
static int call_served(void *p, int i) {
  check_ctx *k = p;
  moe_ctx *c = k->c;
  const routing *r = &c->r[i % c->routings];
  if (sync_state(k, k->state[0]) || sync_state(k, k->state[1]))
    return 1;
  const mt_wstore_refresh_args up = refresh_of(k, &c->up, k->state[0], r),
                               down = refresh_of(k, &c->down, k->state[1], r);
  return ours_gemm_refreshed(c, r, &c->up, c->x, c->h, &up) ||
         ours_gemm_refreshed(c, r, &c->down, c->h, c->y, &down);
}

static int call_check(void *p, int i) {
  check_ctx *k = p;
  moe_ctx *c = k->c;
  if (k->whole)
    return refresh(k, &c->up, k->state[0], NULL);
  const routing *r = &c->r[i % c->routings];
  return refresh(k, &c->up, k->state[0], r) || refresh(k, &c->down, k->state[1], r);
}

/* The states of both weights under `step`, each weight quantized once by its first refresh. */
static void check_init(check_ctx *k, moe_ctx *c, unsigned step) {
  const size_t bytes = mt_refresh_state_bytes(c->g->experts);
  k->c = c, k->step = step, k->whole = 1, k->synced = 0;
  for (int j = 0; j < 2; j++) {
    k->state[j] = dmalloc(bytes);
    /* on the bench's stream: it does not wait for the legacy default stream, and a state read
     * before its zeroing lands is whatever memory the last geometry left there */
    CUDA_OK(cudaMemsetAsync(k->state[j], 0, bytes, stream));
  }
  if (refresh(k, &c->up, k->state[0], NULL) || refresh(k, &c->down, k->state[1], NULL)) {
    fprintf(stderr, "bench_moe: the first refresh failed\n");
    exit(1);
  }
}

static int call_blas(void *p, int i) {
  moe_ctx *c = p;
  routing *r = &c->r[i % c->routings];
  return blas_gemm(r, &c->up, r->ptrs) || blas_gemm(r, &c->down, r->ptrs + 3 * r->active);
}

/* Relative L2 difference of two BF16 matrices on the device. */
static double rel_l2(const uint16_t *a, const uint16_t *b, size_t n) {
  uint16_t *ha = malloc(n * 2), *hb = malloc(n * 2);
  CUDA_OK(cudaMemcpy(ha, a, n * 2, cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(hb, b, n * 2, cudaMemcpyDeviceToHost));
  double num = 0, den = 0;
  for (size_t i = 0; i < n; i++) {
    uint32_t ua = (uint32_t)ha[i] << 16, ub = (uint32_t)hb[i] << 16;
    float fa, fb;
    memcpy(&fa, &ua, 4);
    memcpy(&fb, &ub, 4);
    num += ((double)fa - fb) * ((double)fa - fb);
    den += (double)fb * fb;
  }
  free(ha);
  free(hb);
  return den > 0 ? sqrt(num / den) : 0;
}

static void bench_geometry(const geometry *g) {
  static moe_ctx c;
  memset(&c, 0, sizeof c);
  c.g = g;
  make_gemm(&c.up, g->experts, 2 * g->width, g->hidden);
  make_gemm(&c.down, g->experts, g->hidden, g->width);
  size_t bf16_bytes =
      (size_t)g->experts * 3 * g->width * g->hidden * 2; /* both GEMMs: 3 x width x hidden */
  size_t store_bytes = c.up.ws.slice_bytes * g->experts + c.down.ws.slice_bytes * g->experts;
  printf("%s: %d experts, top-%d, gate_up %dx%d, down %dx%d; weights %.0f MB BF16, %.0f MB in the "
         "store "
         "(%.3f bytes an element)\n",
         g->name, g->experts, TOPK, 2 * g->width, g->hidden, g->hidden, g->width, bf16_bytes / 1e6,
         store_bytes / 1e6, (double)store_bytes / (bf16_bytes / 2));
  check_ctx full, sampled;
  check_init(&full, &c, 1);
  check_init(&sampled, &c, MT_SAMPLE_STEP);
  double t_full = time_calls(call_check, &full, 4),
         t_whole_sampled = time_calls(call_check, &sampled, 16);
  full.whole = sampled.whole = 0;
  double gate_up_bytes = (double)g->experts * 2 * g->width * g->hidden * 2;
  printf("gate_up's whole check: frozen %.1f us (%.2f TB/s of its BF16 bytes), frozen-sampled %.2f "
         "us\n",
         t_full * 1e6, gate_up_bytes / t_full * 1e-12, t_whole_sampled * 1e6);
  char crow[256];
  snprintf(crow, sizeof crow,
           "{\"kind\": \"moe_check\", \"geometry\": \"%s\", \"frozen_us\": %.3f, \"frozen_tbps\": "
           "%.3f, \"sampled_us\": %.3f}",
           g->name, t_full * 1e6, gate_up_bytes / t_full * 1e-12, t_whole_sampled * 1e6);
  json_row(crow);
  printf("%6s | %10s %10s %7s | %8s %8s | %9s %9s | %7s | %9s %9s %9s | %9s %6s %9s\n", "T",
         "ours us", "cuBLAS us", "ratio", "TF/s", "TF/s", "wGB/s", "wGB/s", "rel L2", "frozen us",
         "sampled", "synced", "served us", "check", "srv sync");
  const int *ts = only_tokens ? &only_tokens : tokens;
  const size_t nts = only_tokens ? 1 : sizeof tokens / sizeof tokens[0];
  for (size_t ti = 0; ti < nts; ti++) {
    c.t = ts[ti];
    size_t rows = (size_t)TOPK * c.t;
    c.routings = c.t >= 1024 ? 4 : MAX_ROUTINGS;
    c.x = dmalloc(rows * g->hidden * 2);
    c.h = dmalloc(rows * 2 * g->width * 2);
    c.y = dmalloc(rows * g->hidden * 2);
    uint16_t *yb = dmalloc(rows * g->hidden * 2), *hb = dmalloc(rows * 2 * g->width * 2);
    fill(c.x, rows * g->hidden);
    size_t w1 = mt_grouped_workspace_bytes((int)rows, g->hidden, &c.up.ws.num);
    size_t w2 = mt_grouped_workspace_bytes((int)rows, g->width, &c.up.ws.num);
    c.ws_bytes = w1 > w2 ? w1 : w2;
    c.ws = dmalloc(c.ws_bytes);
    double active_frac = 0;
    for (int i = 0; i < c.routings; i++) {
      routing *r = &c.r[i];
      make_routing(r, g->experts, c.t);
      r->ptrs = dmalloc(6 * (size_t)r->active * sizeof(void *));
      make_ptrs(&c, r, &c.up, c.x, hb, r->ptrs);
      make_ptrs(&c, r, &c.down, hb, yb, r->ptrs + 3 * r->active);
      active_frac += (double)r->active / g->experts / c.routings;
    }
    double t_ours = time_calls(call_ours, &c, c.routings),
           t_blas = time_calls(call_blas, &c, c.routings);
    /* the refresh of the layer's weights under each frozen mode, nothing changed: the routing's
     * experts only */
    double t_fz = time_calls(call_check, &full, c.routings),
           t_fs = time_calls(call_check, &sampled, c.routings);
    /* ... and after a weight sync: the routing's experts requantized (a memset of each state
     * first, counted in the column) */
    sampled.synced = 1;
    double t_sync = time_calls(call_check, &sampled, c.routings),
           t_served_sync = time_calls(call_served, &sampled, c.routings);
    sampled.synced = 0;
    double t_served = time_calls(call_served, &sampled, c.routings);
    /* the sanity column: gate_up's outputs of the last routing, ours against cuBLAS's */
    double diff = -1;
    if (t_ours > 0 && t_blas > 0) {
      routing *r = &c.r[c.routings - 1];
      ours_gemm(&c, r, &c.up, c.x, c.h);
      blas_gemm(r, &c.up, r->ptrs);
      CUDA_OK(cudaStreamSynchronize(stream));
      diff = rel_l2(c.h, hb, rows * 2 * g->width);
    }
    double flops = 2.0 * rows * (2.0 * g->width * g->hidden + (double)g->hidden * g->width);
    double wbytes = active_frac * (double)bf16_bytes;
    printf("%6d | %10.2f %10.2f %7.2f | %8.1f %8.1f | %9.0f %9.0f | %7.4f | %9.2f %9.2f %9.2f | "
           "%9.2f %5.0f%% %9.2f\n",
           c.t, t_ours * 1e6, t_blas * 1e6, t_blas / t_ours, flops / t_ours * 1e-12,
           flops / t_blas * 1e-12, wbytes * 0.28125 / t_ours * 1e-9, wbytes / t_blas * 1e-9, diff,
           t_fz * 1e6, t_fs * 1e6, t_sync * 1e6, t_served * 1e6, (t_served / t_ours - 1) * 100,
           t_served_sync * 1e6);
    char row[768];
    snprintf(row, sizeof row,
             "{\"kind\": \"moe_layer\", \"geometry\": \"%s\", \"tokens\": %d, \"ours_us\": %.3f, "
             "\"cublas_us\": %.3f, "
             "\"ratio\": %.4f, \"ours_tflops\": %.2f, \"cublas_tflops\": %.2f, \"active_experts\": "
             "%.1f, "
             "\"rel_l2_vs_bf16\": %.5f, \"frozen_refresh_us\": %.3f, \"sampled_refresh_us\": %.3f, "
             "\"synced_refresh_us\": %.3f, \"sampled_served_us\": %.3f, "
             "\"synced_served_us\": %.3f}",
             g->name, c.t, t_ours * 1e6, t_blas * 1e6, t_blas / t_ours, flops / t_ours * 1e-12,
             flops / t_blas * 1e-12, active_frac * g->experts, diff, t_fz * 1e6, t_fs * 1e6,
             t_sync * 1e6, t_served * 1e6, t_served_sync * 1e6);
    json_row(row);
    for (int i = 0; i < c.routings; i++) {
      cudaFree(c.r[i].offs);
      cudaFree(c.r[i].ptrs);
    }
    cudaFree(c.x), cudaFree(c.h), cudaFree(c.y), cudaFree(yb), cudaFree(hb), cudaFree(c.ws);
  }
  for (int j = 0; j < 2; j++)
    cudaFree(full.state[j]), cudaFree(sampled.state[j]);
  cudaFree(c.up.w), cudaFree(c.up.qmem), cudaFree(c.down.w), cudaFree(c.down.qmem);
}

int main(int argc, char **argv) {
  const char *only = NULL, *out = "build/bench_moe.json";
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--only") && i + 1 < argc)
      only = argv[++i];
    else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
      only_tokens = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--bn") && i + 1 < argc)
      force_bn = atoi(argv[++i]);
    else
      out = argv[i];
  }
  int known = !only;
  for (size_t i = 0; i < sizeof geometries / sizeof geometries[0]; i++)
    known |= only && !strcmp(only, geometries[i].name);
  if (!known || only_tokens < 0 || only_tokens > 65536) {
    fprintf(stderr, "bench_moe: %s\n",
            known ? "--tokens wants a count of tokens from 1 to 65536"
                  : "--only wants a geometry: qwen3 or dsv3");
    return 2;
  }
  bench_open("bench_moe", out, &blas);
  fprintf(json, "{\"replays\": %d, \"results\": [", REPLAYS);
  for (size_t i = 0; i < sizeof geometries / sizeof geometries[0]; i++)
    if (!only || !strcmp(only, geometries[i].name))
      bench_geometry(&geometries[i]);
  fprintf(json, "\n]}\n");
  fclose(json);
  return 0;
}
