/* vllm.c — vLLM's fused_moe_kernel at the launch door (see vllm.h). */
#include "shim/vllm.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "kernels/driver.h"
#include "kernels/gemm_args.h"
#include "shim/shim.h"

/* --- the layouts the door decodes --------------------------------------------------------------
 *
 * The pointer parameters in vLLM's order (fused_moe.py, fused_moe_kernel): a, b, c, b_bias,
 * a_scale, b_scale, topk_weights, sorted_token_ids, expert_ids, num_tokens_post_padded; in an
 * unquantized launch without bias the three after c are None, which Triton drops. Then the
 * integers: N, K, EM, num_valid_tokens and the strides, less the three that are 1 in every launch
 * vLLM makes (stride_ak, stride_bk, stride_cn: contiguous rows, which Triton compiles in); the
 * scale and bias strides are 0. Then Triton's two scratch pointers (global, profile). */
enum role { R_A, R_B, R_C, R_W, R_SORTED, R_EXPERTS, R_PADDED, NROLES };
enum { I_N, I_K, I_EM, I_VALID, I_AM, I_BE, I_BN, I_CM, I_ZERO, NINTS = I_ZERO + 7 };
#define SCRATCH 2
#define MAX_PARAMS 32

typedef struct {
  int nptr;
  signed char ptr[NROLES]; /* the role of each pointer parameter, in order */
  const char *what;
} layout;

/* Checked against vLLM 0.33.0 (invoke_fused_moe_triton_kernel) under Triton 3.6.0: BF16 or FP16,
 * unquantized, no bias. GEMM1 of the modular TritonExperts passes no router weights;
 * fused_experts() passes them to both GEMMs; the naive dispatch has no sorted token ids. Two
 * layouts of six pointers have the same sizes: the probe tells them apart. */
static const layout layouts[] = {
    {7, {R_A, R_B, R_C, R_W, R_SORTED, R_EXPERTS, R_PADDED}, "sorted, router weights"},
    {6, {R_A, R_B, R_C, R_SORTED, R_EXPERTS, R_PADDED}, "sorted"},
    {6, {R_A, R_B, R_C, R_W, R_EXPERTS, R_PADDED}, "naive, router weights"},
    {5, {R_A, R_B, R_C, R_EXPERTS, R_PADDED}, "naive"},
};
#define NLAYOUTS ((int)(sizeof layouts / sizeof layouts[0]))
#define CHECKED "vLLM 0.33.0 with Triton 3.6.0"

/* The parameter that holds role r in layout lay, or -1 (an optional pointer Triton dropped). */
static int param_of(const layout *lay, enum role r) {
  for (int p = 0; p < lay->nptr; p++)
    if (lay->ptr[p] == (int)r)
      return p;
  return -1;
}

enum { S_NEW, S_LAYOUT, S_READY, S_REFUSED };

struct mt_vllm_fn {
  CUfunction f;
  enum mt_origin origin;
  pthread_mutex_t lock; /* the decoding and the probe */
  _Atomic int state;
  enum mt_reason refused;
  int ncand;
  const layout *cand[NLAYOUTS];
  /* S_READY: what the probe established */
  const layout *lay;
  int block_m, top_k, mul, fp16;
};

int mt_vllm_named(const char *name) { return strcmp(name, "fused_moe_kernel") == 0; }

/* The directories in a Triton image's line table (the Python source files of its kernels). */
enum mt_origin mt_vllm_origin(const void *image, size_t size) {
  if (memmem(image, size, "vllm/model_executor/layers/fused_moe", 36))
    return MT_ORIGIN_VLLM;
  if (memmem(image, size, "sglang/", 7))
    return MT_ORIGIN_SGLANG;
  return MT_ORIGIN_UNKNOWN;
}

mt_vllm_fn *mt_vllm_fn_new(CUfunction f, enum mt_origin origin) {
  mt_vllm_fn *v = calloc(1, sizeof *v);
  if (!v)
    return NULL;
  v->f = f;
  v->origin = origin;
  pthread_mutex_init(&v->lock, NULL);
  return v;
}

static int refuse(mt_vllm_fn *v, enum mt_reason r) {
  v->refused = r;
  return S_REFUSED;
}

/* The layouts whose parameter sizes are the function's. */
static int layout_of(mt_vllm_fn *v) {
  if (v->origin == MT_ORIGIN_SGLANG) {
    MT_INFO("SGLang's fused_moe_kernel is recognised and not routed: its launches run unchanged "
            "(reason \"sglang kernel\")");
    return refuse(v, MT_R_SGLANG);
  }
  const mt_driver *d = mt_driver_get();
  if (!d || !d->func_get_param_info) {
    MT_WARN_ONCE("the CUDA driver has no cuFuncGetParamInfo (it needs CUDA 12.4 or later): "
                 "launches of fused_moe_kernel run unchanged (reason \"triton layout\")");
    return refuse(v, MT_R_TRITON_LAYOUT);
  }
  size_t off, size[MAX_PARAMS + 1];
  int n = 0;
  while (n <= MAX_PARAMS && d->func_get_param_info(v->f, (size_t)n, &off, &size[n]) == CUDA_SUCCESS)
    n++;
  for (int i = 0; i < NLAYOUTS; i++) {
    const layout *l = &layouts[i];
    int ok = n == l->nptr + NINTS + SCRATCH;
    for (int p = 0; ok && p < n; p++)
      ok = size[p] == (p < l->nptr || p >= l->nptr + NINTS ? 8u : 4u);
    if (ok)
      v->cand[v->ncand++] = l;
  }
  if (v->ncand)
    return S_LAYOUT;
  MT_WARN_ONCE("a launch of fused_moe_kernel has %d parameters in a layout the launch door does "
               "not know (it was checked against " CHECKED "; quantized and biased variants are "
               "not routed): such launches run unchanged (reason \"triton layout\")",
               n);
  return refuse(v, MT_R_TRITON_LAYOUT);
}

static int decode(mt_vllm_fn *v) {
  pthread_mutex_lock(&v->lock);
  int st = atomic_load_explicit(&v->state, memory_order_relaxed);
  if (st == S_NEW)
    atomic_store_explicit(&v->state, st = layout_of(v), memory_order_release);
  pthread_mutex_unlock(&v->lock);
  return st;
}

/* --- the probe ---------------------------------------------------------------------------------
 *
 * Rows of 256 slots: activation row r reads r + 1 in its first element and 0 elsewhere, each
 * weight row 1 then 0 (so an output is its activation row's first element), router weight i is
 * 2^(1 + i % 3) (every product exact in BF16 and FP16), token ids 0 .. 255, every block expert 0.
 * Sorted: one CTA (program 0 runs block 0, its first BLOCK_SIZE_N columns, whatever the grouping),
 * which writes rows 0 .. block_m - 1. Naive: 64 CTAs over 16 columns (one column block: program p
 * runs pair p), which write rows 0 .. 63; again with 256 slots in use, rows 0 .. 256 / block_m - 1.
 */
#define PROBE_ROWS 256
#define NAIVE_CTAS 64
/* Room past what a hypothesis reads and writes, so that a kernel of another layout indexes into
 * the probe's own memory: twice the output rows (each poisoned, each checked), and lists of as
 * many slots as 64 blocks of 256 (token ids past the first 256 invalid). */
#define C_ROWS (2 * PROBE_ROWS)
#define LIST 16384

typedef struct {
  CUdeviceptr a, b, c, w, sorted, experts, padded;
  int am, bn, cm, cols; /* strides (elements) and the output columns */
} probe_mem;

static uint16_t half_of(float f, int fp16) {
  uint32_t u;
  memcpy(&u, &f, 4);
  if (!fp16)
    return (uint16_t)(u >> 16); /* every value here is exact in BF16 */
  const uint32_t e = (u >> 23) & 0xff, m = (u >> 13) & 0x3ff;
  return f == 0.0f ? 0 : (uint16_t)((e - 112) << 10 | m); /* normal, exact in FP16 */
}

static float float_of(uint16_t h, int fp16) {
  uint32_t u;
  if (!fp16) {
    u = (uint32_t)h << 16;
  } else {
    const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f)
      u = 0x7fc00000u;
    else if (e == 0)
      u = m ? 0x7fc00000u : 0; /* no subnormal is an expected value */
    else
      u = (e + 112) << 23 | m << 13;
    u |= (uint32_t)(h & 0x8000) << 16;
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static float router_weight(int i) { return (float)(2 << (i % 3)); }

/* A value of the launch's class for an integer parameter: Triton compiled the function for its
 * launch's values being divisible by 16 or not. */
static int32_t same_class(int32_t want, int32_t launch) {
  return (want % 16 == 0) == (launch % 16 == 0) ? want : want + 1;
}

#define SECTION(b) (((b) + 255) / 256 * 256)

/* The probe's inputs into mem (device) through host (staging of `bytes`). */
static int probe_fill(const mt_driver *d, const probe_mem *m, int fp16, uint8_t *host, size_t bytes,
                      CUdeviceptr base) {
  memset(host, 0, bytes);
  uint16_t *a = (uint16_t *)(host + (m->a - base)), *b = (uint16_t *)(host + (m->b - base));
  uint16_t *c = (uint16_t *)(host + (m->c - base));
  float *w = (float *)(host + (m->w - base));
  int32_t *sorted = (int32_t *)(host + (m->sorted - base));
  for (int r = 0; r < PROBE_ROWS; r++) {
    a[(size_t)r * m->am] = half_of((float)(r + 1), fp16);
    b[(size_t)r * m->bn] = half_of(1.0f, fp16);
    w[r] = router_weight(r);
  }
  for (int i = 0; i < LIST; i++)
    sorted[i] = i < PROBE_ROWS ? i : INT32_MAX;
  for (size_t i = 0; i < (size_t)C_ROWS * m->cm; i++)
    c[i] = 0xffff; /* NaN in both types: never an expected value */
  return d->memcpy_htod(base, host, bytes) == CUDA_SUCCESS;
}

/* What a launch wrote: rows 0 .. *rows - 1 each columns 0 .. *cols - 1 with one value val[r], and
 * nothing else; -1 when the output is of no such shape. */
static int written(const uint16_t *c, const probe_mem *m, int fp16, int *rows, int *cols,
                   float *val) {
  *rows = 0, *cols = 0;
  for (int r = 0; r < C_ROWS; r++) {
    const uint16_t *row = c + (size_t)r * m->cm;
    int n = 0;
    while (n < m->cols && row[n] != 0xffff)
      n++;
    for (int j = n; j < m->cm; j++)
      if (row[j] != 0xffff)
        return -1;
    if (n == 0)
      continue;
    if (r != *rows || r >= PROBE_ROWS || (*rows && n != *cols))
      return -1;
    for (int j = 1; j < n; j++)
      if (row[j] != row[0])
        return -1;
    val[r] = float_of(row[0], fp16);
    *rows = r + 1, *cols = n;
  }
  return *rows ? 0 : -1;
}

/* mul and top_k from the rows' values: row i read activation row i / top_k (pair id i), times its
 * router weight with mul. -1 when the values fit neither. */
static int constants_of(const float *val, int rows, int *mul, int *top_k) {
  if (val[0] == 1.0f)
    *mul = 0;
  else if (val[0] == router_weight(0))
    *mul = 1;
  else
    return -1;
  *top_k = 0;
  for (int i = 0; i < rows; i++) {
    const float u = val[i] / (*mul ? router_weight(i) : 1.0f);
    if (!(u >= 1.0f && u <= (float)PROBE_ROWS) || u != (float)(int)u)
      return -1;
    const int src = (int)u - 1;
    if (!*top_k && src == 1)
      *top_k = i;
    if (*top_k ? src != i / *top_k : src != 0)
      return -1;
  }
  return *top_k ? 0 : -1; /* top_k < rows: else it cannot be told */
}

typedef struct {
  const mt_driver *d;
  const mt_launch_args *l;
  const int32_t *ints;
  probe_mem m;
  CUdeviceptr base;
  uint8_t *host;
  size_t bytes;
} probe;

/* One launch of the function on the probe's data, as layout `lay` reads its parameters, over
 * `ctas` CTAs with `padded` slots in use; its output back into pr->host. */
static int probe_run(probe *pr, const layout *lay, int ctas, int32_t padded, int32_t n,
                     int32_t em) {
  const int32_t *li = pr->ints;
  int32_t ints[NINTS] = {0};
  ints[I_N] = n, ints[I_K] = li[I_K], ints[I_EM] = em;
  ints[I_VALID] = same_class(PROBE_ROWS, li[I_VALID]);
  ints[I_AM] = pr->m.am, ints[I_BE] = same_class(0, li[I_BE]), ints[I_BN] = pr->m.bn,
  ints[I_CM] = pr->m.cm;
  CUdeviceptr ptr[NROLES] = {pr->m.a,      pr->m.b,       pr->m.c,     pr->m.w,
                             pr->m.sorted, pr->m.experts, pr->m.padded};
  void *params[MAX_PARAMS];
  for (int p = 0; p < lay->nptr; p++)
    params[p] = &ptr[(int)lay->ptr[p]];
  for (int i = 0; i < NINTS; i++)
    params[lay->nptr + i] = &ints[i];
  /* the launch's own scratch: valid for its grid, ours is smaller */
  for (int s = 0; s < SCRATCH; s++)
    params[lay->nptr + NINTS + s] = pr->l->params[lay->nptr + NINTS + s];
  CUlaunchConfig cfg = pr->l->config;
  cfg.gridDimX = (unsigned)ctas, cfg.gridDimY = cfg.gridDimZ = 1;
  const mt_driver *d = pr->d;
  return d->memcpy_htod(pr->m.padded, &padded, 4) == CUDA_SUCCESS &&
         d->launch_kernel_ex(&cfg, pr->l->f, params, NULL) == CUDA_SUCCESS &&
         d->stream_synchronize(cfg.hStream) == CUDA_SUCCESS &&
         d->memcpy_dtoh(pr->host + (pr->m.c - pr->base), pr->m.c, (size_t)C_ROWS * pr->m.cm * 2) ==
             CUDA_SUCCESS;
}

/* The constants under one hypothesis (layout, element type): 1 when the output says them exactly,
 * 0 when it does not, -1 on a driver failure. */
static int probe_try(probe *pr, mt_vllm_fn *v, const layout *lay, int fp16) {
  const int naive = param_of(lay, R_SORTED) < 0;
  const int32_t *li = pr->ints;
  const uint16_t *c = (const uint16_t *)(pr->host + (pr->m.c - pr->base));
  float val[PROBE_ROWS];
  int rows, cols, mul, top_k, block_m;
  const int32_t n = same_class(naive ? 16 : PROBE_ROWS, li[I_N]);
  pr->m.cols = n;
  if (!probe_fill(pr->d, &pr->m, fp16, pr->host, pr->bytes, pr->base))
    return -1;
  if (!naive) {
    if (!probe_run(pr, lay, 1, PROBE_ROWS, n, li[I_EM]))
      return -1;
    if (written(c, &pr->m, fp16, &rows, &cols, val) || constants_of(val, rows, &mul, &top_k))
      return 0;
    block_m = rows;
  } else {
    /* a TD variant's scratch is sized by the launch's grid: no more CTAs than it */
    const void *scratch = *(void *const *)pr->l->params[lay->nptr + NINTS];
    const int ctas =
        scratch && pr->l->config.gridDimX < NAIVE_CTAS ? (int)pr->l->config.gridDimX : NAIVE_CTAS;
    const int32_t em = same_class(16384, li[I_EM]);
    if (ctas < 16 || !probe_run(pr, lay, ctas, 1 << 20, n, em))
      return ctas < 16 ? 0 : -1;
    if (written(c, &pr->m, fp16, &rows, &cols, val) || rows != ctas || cols != n ||
        constants_of(val, rows, &mul, &top_k))
      return 0;
    if (!probe_fill(pr->d, &pr->m, fp16, pr->host, pr->bytes, pr->base) ||
        !probe_run(pr, lay, ctas, PROBE_ROWS, n, em))
      return -1;
    if (written(c, &pr->m, fp16, &rows, &cols, val) || rows >= ctas)
      return 0;
    block_m = PROBE_ROWS / rows;
  }
  if (block_m < 16 || block_m > PROBE_ROWS || (block_m & (block_m - 1)))
    return 0;
  v->lay = lay, v->block_m = block_m, v->top_k = top_k, v->mul = mul, v->fp16 = fp16;
  return 1;
}

/* The probe's memory: sections for A, B, C, the router weights, the token ids, the experts and
 * the slots in use; 0 when it cannot be had. */
static CUdeviceptr probe_alloc(probe *pr) {
  const int32_t *li = pr->ints;
  probe_mem *m = &pr->m;
  m->am = same_class(li[I_K], li[I_AM]);
  m->bn = same_class(li[I_K], li[I_BN]);
  m->cm = same_class(PROBE_ROWS, li[I_CM]);
  const size_t a = SECTION((size_t)PROBE_ROWS * m->am * 2),
               b = SECTION((size_t)PROBE_ROWS * m->bn * 2), c = SECTION((size_t)C_ROWS * m->cm * 2),
               small = SECTION((size_t)LIST * 4);
  pr->bytes = a + b + c + 4 * small;
  CUdeviceptr base;
  if (!(pr->host = malloc(pr->bytes)) || pr->d->mem_alloc(&base, pr->bytes) != CUDA_SUCCESS)
    return 0;
  m->a = base, m->b = m->a + a, m->c = m->b + b, m->w = m->c + c;
  m->sorted = m->w + small, m->experts = m->sorted + small, m->padded = m->experts + small;
  return pr->base = base;
}

/* Every hypothesis until one holds. S_READY, S_REFUSED, or S_LAYOUT with *why (try again at a
 * later launch: a capture, no memory, a driver failure). */
static int calibrate_locked(mt_vllm_fn *v, const mt_launch_args *l, const int32_t *ints,
                            enum mt_reason *why) {
  probe pr = {.d = mt_driver_get(), .l = l, .ints = ints};
  CUstreamCaptureStatus cap = CU_STREAM_CAPTURE_STATUS_NONE;
  *why = MT_R_CAPTURE;
  if (!pr.d || pr.d->stream_is_capturing(l->config.hStream, &cap) != CUDA_SUCCESS ||
      cap != CU_STREAM_CAPTURE_STATUS_NONE)
    return S_LAYOUT;
  const int relaxed = mt_capture_relax();
  int found = 0;
  *why = MT_R_NOMEM;
  if (probe_alloc(&pr)) {
    *why = MT_R_ENGINE;
    for (int i = 0; !found && i < v->ncand; i++)
      for (int fp16 = 0; found >= 0 && !found && fp16 < 2; fp16++)
        found = probe_try(&pr, v, v->cand[i], fp16);
    pr.d->mem_free(pr.base);
  }
  free(pr.host);
  mt_capture_restore(relaxed);
  if (found > 0) {
    MT_INFO("vLLM's fused_moe_kernel %p decoded: parameters %s; BLOCK_SIZE_M %d, top_k %d, "
            "MUL_ROUTED_WEIGHT %d, %s",
            (void *)v->f, v->lay->what, v->block_m, v->top_k, v->mul, v->fp16 ? "FP16" : "BF16");
    return S_READY;
  }
  if (found < 0 || !pr.base)
    return S_LAYOUT;
  MT_WARN_ONCE(
      "a fused_moe_kernel's compile-time constants could not be established by running it on "
      "probe data (another kernel of that name, or a version other than " CHECKED "): its "
      "launches run unchanged (reason \"triton layout\")");
  return refuse(v, MT_R_TRITON_LAYOUT);
}

static int calibrate(mt_vllm_fn *v, const mt_launch_args *l, const int32_t *ints,
                     enum mt_reason *why) {
  pthread_mutex_lock(&v->lock);
  int st = atomic_load_explicit(&v->state, memory_order_relaxed);
  if (st == S_LAYOUT) {
    st = calibrate_locked(v, l, ints, why);
    atomic_store_explicit(&v->state, st, memory_order_release);
  }
  pthread_mutex_unlock(&v->lock);
  return st;
}

/* --- a decoded launch as a grouped call ------------------------------------------------------- */

int mt_vllm_experts(const void *b, size_t slice_bytes) {
  const mt_driver *d = mt_driver_get();
  CUdeviceptr start = 0, base = 0, p = (CUdeviceptr)(uintptr_t)b;
  size_t size = 0, mapped = 0;
  if (!d || !d->pointer_get_attribute || !d->mem_get_address_range || !slice_bytes ||
      d->pointer_get_attribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p) != CUDA_SUCCESS ||
      d->pointer_get_attribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p) != CUDA_SUCCESS ||
      d->mem_get_address_range(&base, &mapped, p) != CUDA_SUCCESS)
    return 0;
  /* a reservation mapped piece by piece (expandable segments): the weight may run past the piece */
  if (base != start || mapped != size || p < start || p - start > size)
    return 0;
  const size_t n = (size_t)(start + size - p) / slice_bytes;
  return n > INT_MAX ? INT_MAX : (int)n;
}

/* The integer parameters, where the layout's sizes put them; 0 when they are not those of an
 * unquantized launch without bias that the engine could take. */
static int read_ints(const mt_vllm_fn *v, const mt_launch_args *l, int32_t *ints) {
  const int nptr = v->cand[0]->nptr; /* the same for every candidate: their sizes are the same */
  for (int i = 0; i < NINTS; i++)
    memcpy(&ints[i], l->params[nptr + i], 4);
  for (int i = I_ZERO; i < NINTS; i++)
    if (ints[i])
      return 0;
  return ints[I_N] > 0 && ints[I_K] > 0 && ints[I_EM] > 0 && ints[I_VALID] > 0 &&
         ints[I_AM] >= ints[I_K] && ints[I_BN] >= ints[I_K] && ints[I_CM] >= ints[I_N] &&
         ints[I_BE] > 0;
}

static const void *role_ptr(const mt_vllm_fn *v, const mt_launch_args *l, enum role r) {
  const int p = param_of(v->lay, r);
  return p < 0 ? NULL : *(void *const *)l->params[p];
}

static const float one = 1.0f, zero = 0.0f;

/* The decoded launch as the router and the engine take a grouped call (shim/call.h). */
static void call_of(const mt_vllm_fn *v, const mt_launch_args *l, const int32_t *ints, int experts,
                    mt_moe_dispatch *moe, mt_call *c) {
  *moe = (mt_moe_dispatch){.sorted = role_ptr(v, l, R_SORTED),
                           .experts = role_ptr(v, l, R_EXPERTS),
                           .post_padded = role_ptr(v, l, R_PADDED),
                           .weights = v->mul ? role_ptr(v, l, R_W) : NULL,
                           .blocks = (ints[I_EM] + v->block_m - 1) / v->block_m,
                           .block_m = v->block_m,
                           .top_k = v->top_k};
  const int type = v->fp16 ? CUDA_R_16F : CUDA_R_16BF;
  *c = (mt_call){.entry = MT_FN_vllm_fused_moe,
                 .transa = 1,
                 .transb = MT_OP_N,
                 .m = ints[I_N],
                 .n = ints[I_VALID],
                 .k = ints[I_K],
                 .atype = type,
                 .btype = type,
                 .ctype = type,
                 .dtype = type,
                 .compute = CUBLAS_COMPUTE_32F,
                 .scale_type = -1,
                 .a = role_ptr(v, l, R_B),
                 .b = role_ptr(v, l, R_A),
                 .c = role_ptr(v, l, R_C),
                 .d = (void *)role_ptr(v, l, R_C),
                 .lda = ints[I_BN],
                 .ldb = ints[I_AM],
                 .ldc = ints[I_CM],
                 .ldd = ints[I_CM],
                 .batch = experts,
                 .stride_a = ints[I_BE],
                 .ragged = MT_RAGGED_N,
                 .algo = -1,
                 .alpha = &one,
                 .beta = &zero,
                 .ptr_mode = MT_PTR_HOST,
                 .stream = l->config.hStream,
                 .device = -1,
                 .epilogue = CUBLASLT_EPILOGUE_DEFAULT,
                 .bias_type = -1,
                 .moe = moe,
                 .details = 1,
                 .details_ok = 1};
}

/* The bound on the weight's experts, or 0 (said once). */
static int experts_of(const void *b, int32_t stride_be) {
  const int relaxed = mt_capture_relax(); /* vLLM captures its decode steps, in global mode */
  const int e = mt_vllm_experts(b, (size_t)stride_be * 2);
  mt_capture_restore(relaxed);
  if (e > 0 && e <= MT_MOE_MAX_EXPERTS)
    return e;
  MT_WARN_ONCE("a vLLM expert weight's expert count cannot be bounded (its memory is %s): such "
               "launches run unchanged (reason \"expert count\"); allocate the weights with "
               "cudaMalloc (PyTorch's default allocator, without expandable_segments)",
               e ? "large enough for more than the engine's 1024 experts"
                 : "part of a reservation mapped piece by piece");
  return 0;
}

int mt_vllm_launch(mt_vllm_fn *v, const mt_launch_args *l) {
  int st = atomic_load_explicit(&v->state, memory_order_acquire);
  if (st == S_NEW)
    st = decode(v);
  enum mt_reason why = v->refused;
  int32_t ints[NINTS];
  if (st == S_REFUSED || l->extra || !l->params || !read_ints(v, l, ints)) {
    mt_shim_unread(st == S_REFUSED ? why : MT_R_TRITON_LAYOUT);
    return 0;
  }
  if (st == S_LAYOUT)
    st = calibrate(v, l, ints, &why);
  if (st != S_READY) {
    mt_shim_unread(st == S_REFUSED ? v->refused : why);
    return 0;
  }
  const int experts = experts_of(role_ptr(v, l, R_B), ints[I_BE]);
  if (!experts) {
    mt_shim_unread(MT_R_EXPERTS);
    return 0;
  }
  mt_moe_dispatch moe;
  mt_call c;
  call_of(v, l, ints, experts, &moe, &c);
  cublasStatus_t status;
  return mt_shim_begin(&c, &status);
}
