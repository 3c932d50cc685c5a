/* instr.c — the instruments as a routed call runs them (see instr.h): the settings, the sampling,
 * the choice of what a call gets, and the kernels enqueued on its stream into a result slot of
 * shim/instr_writer.h, which the background writer turns into records.
 *
 * The calling thread never synchronizes, allocates only at the first instrumented call of a
 * context (never while capturing: instruments are skipped then), and never reads device memory.
 *
 * The shadow's output and the probe's rows go to one scratch buffer per context (MINITE_INSTR_MB,
 * allocated once). A call on another stream than the buffer's last user takes it only when that
 * user's slot has been published (its flag, read from host memory); else it skips the shadow and
 * probe with the reason "busy". Same-stream reuse is ordered by the stream itself.
 *
 * Locks: the writer's lock (mt_iw_lock) guards the sampling counters and is taken briefly to
 * choose a call's instruments; a context's scratch_lock is held while a call enqueues its probe
 * or shadow (a second caller skips them as "busy" rather than wait); slots are claimed with a
 * compare-and-swap. Threads routing at once on different streams therefore enqueue their
 * instruments in parallel.
 */
#include "shim/instr.h"

#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/params.h"
#include "kernels/driver.h"
#include "kernels/instr.h"
#include "kernels/wcheck.h"
#include "shim/instr_writer.h"
#include "shim/real.h"

/* The most rows an uncaptured call needs to be digested at every call (MINITE_DIGEST_CALLS
 * sampled): the default rate's period. A lower rate (a smaller file) then samples no more calls,
 * so the rows of calls this large stay joinable by content at any rate. */
#define DIGEST_CALL_ROWS 64

typedef struct {
  unsigned long long shadow, probe; /* the route's calls */
  uint64_t rows;                    /* the rows of its uncaptured calls */
} seen_count;

static double rate_digest;
static uint64_t period_shadow, period_probe, period_digest, digest_threshold;
static uint32_t replay_every; /* a captured call digests one replay in this many; 0: none */
static int digest_all, digest_every_call, enabled;
static seen_count seen[MT_SPEC_MAX_ROUTES]; /* the sampling counters, under mt_iw_lock */

/* The child of a fork has no writer thread and no usable CUDA: it instruments nothing, whether
 * it was forked before the first call or after it. */
void mt_instr_fork_child(void) { enabled = 0; }

void mt_instr_fork_lock(void) { mt_iw_before_fork(); }

void mt_instr_fork_unlock(int child) {
  if (child)
    mt_iw_after_fork_child();
  else
    mt_iw_after_fork_parent();
}
static uint64_t period_of(double rate) {
  if (rate <= 0)
    return 0;
  double p = ceil(1.0 / rate - 1e-9);
  return p < 1 ? 1 : p > 1e18 ? (uint64_t)1e18 : (uint64_t)p;
}

/* A rate set in the environment to more than 0. */
static int asked(const mt_params *p, enum mt_param_id id, double rate) {
  return p->from[id] != MT_FROM_DEFAULT && rate > 0;
}

void mt_instr_init(const mt_spec *s, const mt_params *p) {
  int stats_on = p->stats != NULL;
  const double rate_shadow = p->shadow, rate_probe = p->probe, rate_replays = p->digest_replays;
  rate_digest = p->digest;
  const uint64_t replay_period = period_of(rate_replays);
  replay_every = replay_period < UINT32_MAX ? (uint32_t)replay_period : UINT32_MAX;
  size_t scratch_limit = (size_t)p->instr_mb << 20;
  period_shadow = period_of(rate_shadow);
  period_probe = period_of(rate_probe);
  period_digest = period_of(rate_digest);
  if (period_digest > DIGEST_CALL_ROWS)
    period_digest = DIGEST_CALL_ROWS;
  digest_every_call = p->digest_calls == MT_DIGEST_CALLS_ALL;
  if (!period_shadow && !period_probe)
    scratch_limit = 0; /* only the digests: no scratch */
  mt_iw_configure(&(mt_iw_config){.spec = s,
                                  .nslots = (int)p->instr_slots,
                                  .scratch_bytes = scratch_limit,
                                  .rates = {rate_shadow, rate_probe, rate_digest},
                                  .replay_rate = rate_replays});
  digest_all = rate_digest >= 1.0;
  digest_threshold = rate_digest > 0 && !digest_all ? (uint64_t)ldexp(rate_digest, 64) : 0;
  enabled = stats_on && (period_shadow || period_probe || rate_digest > 0);
  if (!stats_on &&
      (asked(p, MT_P_MINITE_SHADOW, rate_shadow) || asked(p, MT_P_MINITE_PROBE, rate_probe) ||
       asked(p, MT_P_MINITE_DIGEST, rate_digest)))
    MT_WARN("MINITE_SHADOW, MINITE_PROBE and MINITE_DIGEST write to the statistics file: set "
            "MINITE_STATS=PATH to get them");
  if (enabled) {
    char calls[128] = "every call";
    if (!digest_every_call && period_digest > 1)
      snprintf(calls, sizeof calls,
               "every call of %llu rows or more, one in about %llu / m of others",
               (unsigned long long)period_digest, (unsigned long long)period_digest);
    MT_INFO("instruments: shadow %g of calls, probe %g of calls with M > 1, digests %g of rows "
            "(of %s; %g of a captured call's replays); scratch %zu MiB per GPU",
            rate_shadow, rate_probe, rate_digest, calls, rate_replays, scratch_limit >> 20);
  }
}

int mt_instr_enabled(void) { return enabled; }

void mt_instr_off(void) { enabled = 0; }

/* --- the calling side ---------------------------------------------------------------------- */

static int route_index(const mt_spec *s, int out, int in) {
  for (int i = 0; i < s->nroutes; i++)
    if ((int)s->routes[i].out == out && (int)s->routes[i].in == in)
      return i;
  return -1;
}

static int stream_capturing(const mt_driver *d, mt_stream stream) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  if (d->stream_is_capturing((CUstream)stream, &st) != CUDA_SUCCESS)
    return 1;
  return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

static int single_problem(const mt_call *c) {
  return (c->entry == MT_FN_cublasGemmEx || c->entry == MT_FN_cublasGemmEx_64 ||
          c->entry == MT_FN_cublasLtMatmul) &&
         c->batch == 1 && !c->pointer_arrays && c->group_count == 0;
}

/* The call again through the real cuBLAS, tokens [row, row + rows) of it, output into `out`
 * (row stride ldo) with beta = 0. Lt reruns only whole calls (its layouts fix the token count). */
static int rerun_cublas(const mt_call *c, int64_t row, int64_t rows, void *out, int64_t ldo) {
  static const float zero = 0.0f;
  const char *b = (const char *)c->b + 2 * row * c->ldb;
  if (c->entry == MT_FN_cublasGemmEx) {
    mt_fn_cublasGemmEx f = MT_REAL_FN(cublasGemmEx);
    return f && f(c->handle, c->transa, c->transb, (int)c->m, (int)rows, (int)c->k, c->alpha, c->a,
                  c->atype, (int)c->lda, b, c->btype, (int)c->ldb, &zero, out, c->ctype, (int)ldo,
                  c->compute, c->algo) == CUBLAS_STATUS_SUCCESS;
  }
  if (c->entry == MT_FN_cublasGemmEx_64) {
    mt_fn_cublasGemmEx_64 f = MT_REAL_FN(cublasGemmEx_64);
    return f && f(c->handle, c->transa, c->transb, c->m, rows, c->k, c->alpha, c->a, c->atype,
                  c->lda, b, c->btype, c->ldb, &zero, out, c->ctype, ldo, c->compute,
                  c->algo) == CUBLAS_STATUS_SUCCESS;
  }
  if (c->entry == MT_FN_cublasLtMatmul && row == 0 && rows == c->n && ldo == c->ldd) {
    mt_fn_cublasLtMatmul f = MT_REAL_FN(cublasLtMatmul);
    return f && f(c->handle, c->lt_desc, c->alpha, c->a, c->lt_adesc, c->b, c->lt_bdesc, &zero,
                  c->c, c->lt_cdesc, out, c->lt_ddesc, c->lt_algo, c->workspace,
                  (size_t)c->workspace_bytes, c->stream) == CUBLAS_STATUS_SUCCESS;
  }
  return 0;
}

/* A strided batch (cuBLAS strided or Lt batched: the host knows every problem) whose shadow can
 * rerun the call as it came; torch._grouped_mm has no cuBLAS call to rerun. */
static int batch_rerunnable(const mt_call *c) {
  return (c->entry == MT_FN_cublasGemmStridedBatchedEx ||
          c->entry == MT_FN_cublasGemmStridedBatchedEx_64 || c->entry == MT_FN_cublasLtMatmul) &&
         c->batch > 1 && !c->pointer_arrays && c->group_count == 0 && !c->ragged;
}

/* The shadow a call can have: its cuBLAS call rerun into scratch (SHADOW_RERUN), or, for a grouped
 * call with no cuBLAS call to rerun (torch._grouped_mm), a few rows' product formed on the device
 * (SHADOW_ROWS: no scratch); SHADOW_NONE where a grouped call's bias differs by segment or its rows
 * are vLLM's dispatch's (scattered, weighted). */
enum { SHADOW_NONE, SHADOW_RERUN, SHADOW_ROWS };

static int shadow_kind(const mt_instr_call *ic) {
  if (!ic->grouped)
    return single_problem(ic->call) ? SHADOW_RERUN : SHADOW_NONE;
  if (!ic->grouped->offs && batch_rerunnable(ic->call))
    return SHADOW_RERUN;
  return ic->w && !ic->bias && !ic->grouped->dispatch ? SHADOW_ROWS : SHADOW_NONE;
}

/* The instruments that use the scratch (the probe, a rerun shadow), of `kinds`. */
static int scratch_kinds(const mt_instr_call *ic, int kinds) {
  return kinds & (MT_IW_PROBE | (shadow_kind(ic) == SHADOW_RERUN ? MT_IW_SHADOW : 0));
}

/* A strided batch again through the real cuBLAS, with beta = 0, its output into `out` in the
 * call's own layout (leading dimension and stride). */
static int rerun_batch(const mt_call *c, void *out) {
  static const float zero = 0.0f;
  if (c->entry == MT_FN_cublasGemmStridedBatchedEx) {
    mt_fn_cublasGemmStridedBatchedEx f = MT_REAL_FN(cublasGemmStridedBatchedEx);
    return f && f(c->handle, c->transa, c->transb, (int)c->m, (int)c->n, (int)c->k, c->alpha, c->a,
                  c->atype, (int)c->lda, c->stride_a, c->b, c->btype, (int)c->ldb, c->stride_b,
                  &zero, out, c->ctype, (int)c->ldc, c->stride_c, (int)c->batch, c->compute,
                  c->algo) == CUBLAS_STATUS_SUCCESS;
  }
  if (c->entry == MT_FN_cublasGemmStridedBatchedEx_64) {
    mt_fn_cublasGemmStridedBatchedEx_64 f = MT_REAL_FN(cublasGemmStridedBatchedEx_64);
    return f && f(c->handle, c->transa, c->transb, c->m, c->n, c->k, c->alpha, c->a, c->atype,
                  c->lda, c->stride_a, c->b, c->btype, c->ldb, c->stride_b, &zero, out, c->ctype,
                  c->ldc, c->stride_c, c->batch, c->compute, c->algo) == CUBLAS_STATUS_SUCCESS;
  }
  return rerun_cublas(c, 0, c->n, out, c->ldd);
}

/* Elements the shadow's output spans: the routed output's layout. */
static size_t shadow_elems(const mt_instr_call *ic) {
  const mt_grouped_args *g = ic->grouped;
  if (!g)
    return (size_t)(ic->m - 1) * ic->ldy + (size_t)ic->n;
  return (size_t)(g->nseg - 1) * (size_t)g->stride_y + (size_t)(g->seg_rows - 1) * ic->ldy +
         (size_t)ic->n;
}

/* The probe's rows in the scratch: 16-byte aligned, as the router requires of a routed output. */
static int probe_ld(int n) { return (n + 7) / 8 * 8; }

static size_t probe_rows_bytes(int n) {
  return mt_iw_round256((size_t)MT_INSTR_PROBE_ROWS * probe_ld(n) * 2);
}

/* The probe's scratch: its rows, then (a grouped call with offsets) each row's one-row offsets. */
static size_t probe_bytes_of(const mt_instr_call *ic) {
  const mt_grouped_args *g = ic->grouped;
  size_t offs = g && g->offs ? (size_t)MT_INSTR_PROBE_ROWS * (size_t)g->nseg * 4 : 0;
  return probe_rows_bytes(ic->n) + mt_iw_round256(offs);
}

/* Rows the probe recomputes: first, last and two spread between, distinct. */
static int probe_rows_of(int m, int32_t rows[MT_INSTR_PROBE_ROWS]) {
  int cand[MT_INSTR_PROBE_ROWS] = {0, m / 3, (2 * m) / 3, m - 1}, n = 0;
  for (int i = 0; i < MT_INSTR_PROBE_ROWS; i++) {
    int dup = 0;
    for (int j = 0; j < n; j++)
      dup |= rows[j] == cand[i];
    if (!dup)
      rows[n++] = cand[i];
  }
  return n;
}

/* Probed row r of a grouped call alone through the grouped engine (M = 1, the call's store and
 * workspace): with offsets, the one-row offsets `offs1` that mt_instr_offs built for it (the row
 * keeps its segment, found on the device); else the segment's slice of the store, as a call of one
 * segment. Sets the in-batch row's offset in y. */
static int probe_grouped_row(const mt_instr_call *ic, int i, const int32_t *offs1, void *out,
                             mt_instr_probe_args *pa) {
  const mt_grouped_args *g = ic->grouped;
  const int r = pa->rows[i];
  mt_grouped_args one = *g;
  mt_wstore slice = *g->w;
  one.m = 1;
  one.y = out;
  one.ldy = (size_t)pa->ld_alone;
  one.c = NULL;
  one.beta = 0.0f;
  one.bn = 0;
  one.refresh = NULL; /* the call itself refreshed the store */
  if (g->offs) {
    one.offs = offs1 + (size_t)i * (size_t)g->nseg;
    one.x = (const char *)g->x + 2 * (size_t)r * g->ldx;
    pa->yoff[i] = (int64_t)r * (int64_t)g->ldy;
  } else {
    const int seg = r / g->seg_rows;
    size_t belem = g->biastype == MT_DTYPE_FP32 ? 4 : 2;
    slice.base += (size_t)seg * slice.slice_bytes; /* slice_bytes 0: one slice for all */
    slice.count = 1;
    one.w = &slice;
    one.nseg = 1;
    one.seg_rows = 1;
    one.x = (const char *)g->x +
            2 * (size_t)mt_instr_row_offset(seg, g->seg_rows, g->stride_x, (int64_t)g->ldx, r);
    one.bias =
        g->bias ? (const char *)g->bias + belem * (size_t)seg * (size_t)g->stride_bias : NULL;
    pa->yoff[i] = mt_instr_row_offset(seg, g->seg_rows, g->stride_y, (int64_t)g->ldy, r);
  }
  return mt_gemm_grouped(&one, (mt_stream)ic->call->stream) == MT_OK;
}

/* A grouped call's probe: the one-row offsets of every probed row in one launch (offsets only),
 * then each row alone. */
static int probe_grouped(const mt_instr_call *ic, CUdeviceptr scratch, mt_instr_probe_args *pa) {
  const mt_grouped_args *g = ic->grouped;
  int32_t *offs1 = (int32_t *)(scratch + (CUdeviceptr)probe_rows_bytes(ic->n));
  if (g->offs) {
    mt_instr_offs_args oa = {.offs = g->offs, .out = offs1, .nrows = pa->nrows, .nseg = g->nseg};
    memcpy(oa.rows, pa->rows, sizeof oa.rows);
    if (mt_instr_launch_offs(&oa, (mt_stream)ic->call->stream) != MT_OK)
      return 0;
    pa->offs = g->offs;
    pa->nseg = g->nseg;
  }
  for (int i = 0; i < pa->nrows; i++) {
    void *out = (void *)(scratch + (CUdeviceptr)(2 * (size_t)i * pa->ld_alone));
    if (!probe_grouped_row(ic, i, offs1, out, pa))
      return 0;
  }
  return 1;
}

/* The probe's rows alone: through the engine (M = 1 each, the call's own quantized weight and
 * workspace, ordered after the call on its stream) or, for bf16, through cuBLAS. */
static int run_probe(const mt_instr_call *ic, CUdeviceptr scratch, mt_instr_probe_args *pa) {
  pa->nrows = probe_rows_of(ic->m, pa->rows);
  pa->ld_alone = probe_ld(ic->n);
  pa->y = ic->y;
  pa->alone = (const void *)scratch;
  pa->n = ic->n;
  pa->type = ic->ytype;
  if (ic->grouped)
    return probe_grouped(ic, scratch, pa);
  /* a kept weight: the rows read the copy the call dequantized (their activations' sections,
   * of one row, end before it) */
  const mt_qweight *w = ic->engine ? ic->engine->w : NULL;
  mt_qweight copy;
  if (w && !w->xhat) {
    copy = *w;
    copy.xhat = mt_gemm_kept_copy(ic->engine);
    w = &copy;
  }
  for (int i = 0; i < pa->nrows; i++) {
    void *out = (void *)(scratch + (CUdeviceptr)(2 * (size_t)i * pa->ld_alone));
    pa->yoff[i] = (int64_t)pa->rows[i] * (int64_t)ic->ldy;
    if (ic->engine) {
      mt_gemm_args one = *ic->engine;
      one.w = w;
      one.m = 1;
      one.x = (const char *)ic->x + 2 * (size_t)pa->rows[i] * ic->ldx;
      one.y = out;
      one.ldy = (size_t)pa->ld_alone;
      one.c = NULL;
      one.beta = 0.0f;
      if (mt_gemm(&one, (mt_stream)ic->call->stream) != MT_OK)
        return 0;
    } else if (!rerun_cublas(ic->call, pa->rows[i], 1, out, pa->ld_alone)) {
      return 0;
    }
  }
  return 1;
}

/* Can the scratch serve this stream now (see the file comment)? Under scratch_lock. */
static int scratch_free(mt_iw_context *c, CUstream stream) {
  if (!c->scratch_used || c->scratch_stream == mt_stream_key(stream))
    return 1;
  /* the slot may have been published again since: its sequence only grows (31 bits, the flag's
   * top one marking an empty publication) */
  const uint32_t flag = __atomic_load_n(c->scratch_slot->flag, __ATOMIC_ACQUIRE) & ~MT_INSTR_EMPTY;
  return (int32_t)((flag - c->scratch_seq) << 1) >= 0;
}

typedef struct {
  int route, captured, shadow, probe, digest;
} sampled;

/* Whether an uncaptured call of m rows is digested: when its route's rows, counted over its
 * uncaptured calls, reach a multiple of the period (ceil(1 / rate), at most DIGEST_CALL_ROWS)
 * within this call. A call of at least a period's rows always is; a smaller one, which chooses no
 * row most of the time and would still pay the digest's two kernels (a few µs of round trips:
 * lab/NOTES.md, "What 3% of an eager block allows a call"), about once in period / m of its
 * calls. Which rows a digested call keeps is still its rows' content alone. */
static int digest_due(seen_count *r, int m) {
  const uint64_t before = r->rows;
  const uint64_t next = (before + period_digest - 1) / period_digest * period_digest;
  r->rows += (uint64_t)m;
  return digest_every_call || next < before + (uint64_t)m;
}

static int call_captured(const mt_instr_call *ic, const mt_driver *d) {
  return ic->capturing || (d && stream_capturing(d, (mt_stream)ic->call->stream));
}

/* Which instruments this call gets (the per-route counters advance here; captured calls do not
 * count rows: their replays are sampled on the device). `captured` is asked of the driver here
 * only when the digests need it; choose() asks it otherwise, for a call that gets an instrument.
 * Under lock. */
static sampled sample(const mt_instr_call *ic, const mt_driver *d) {
  sampled p = {route_index(ic->spec, ic->n, ic->k), 0, 0, 0, 0};
  if (p.route < 0)
    return p;
  seen_count *r = &seen[p.route];
  if (period_shadow)
    p.shadow = r->shadow++ % period_shadow == 0;
  if (period_probe && ic->m > 1)
    p.probe = r->probe++ % period_probe == 0;
  if (period_digest) {
    p.captured = call_captured(ic, d);
    p.digest = p.captured || digest_due(r, ic->m);
  }
  return p;
}

/* The digest's threshold for a call of m rows: rate x 2^64, lowered for a call of more than
 * 96 / rate rows to 96 / m x 2^64. Such a call chooses 96 rows on average, past its block's
 * MT_IW_ROWS (128) about once in 2,000 calls (3.3 standard deviations), where a cut at 128 kept
 * the chosen rows that won the slot's atomic, an arbitrary subset. The thresholds nest: the rows
 * a large call keeps are among those a smaller call of the same rows keeps, so a learner's digests
 * meet a sampler's whatever the batch sizes of both. Rate 1 ("every row") is left as it is. */
static uint64_t digest_threshold_of(int m) {
  if (digest_all || !digest_threshold || m <= 0)
    return digest_threshold;
  const double cut = ldexp(MT_IW_ROWS * 0.75 / m, 64);
  return cut < (double)digest_threshold ? (uint64_t)cut : digest_threshold;
}

/* A captured call's replay count on the device, which gates its digests to one replay in
 * replay_every (kernels/instr.h); NULL where every use digests. */
static uint32_t *replay_tick(const mt_iw_slot *s) {
  return s->captured && replay_every > 1 ? (uint32_t *)(s->dev + MT_IW_TICK_OFFSET) : NULL;
}

/* The digest's arguments for slot s (its rows after the slot's header). */
static void digest_args(const mt_instr_call *ic, mt_iw_slot *s, mt_instr_digest_args *da) {
  *da = (mt_instr_digest_args){.x = ic->x,
                               .y = ic->y,
                               .ldx = (int64_t)ic->ldx,
                               .ldy = (int64_t)ic->ldy,
                               .m = ic->m,
                               .n = ic->n,
                               .k = ic->k,
                               .xtype = ic->xtype,
                               .ytype = ic->ytype,
                               .all = digest_all,
                               .threshold = digest_threshold_of(ic->m),
                               .hdr = (mt_instr_header *)s->dev,
                               .rows = (mt_instr_row *)(s->dev + sizeof(mt_instr_header)),
                               .cap = MT_IW_ROWS,
                               .every = replay_every,
                               .tick = replay_tick(s)};
  const mt_grouped_args *g = ic->grouped;
  if (!g)
    return;
  da->offs = g->offs;
  da->nseg = g->nseg;
  da->seg_rows = g->seg_rows;
  da->stride_x = g->stride_x;
  da->stride_y = g->stride_y;
  if (g->dispatch) {
    da->x_rows = g->dispatch->lists.src;
    da->y_rows = g->dispatch->lists.dst;
  }
}

/* A grouped call's shadow on MT_INSTR_SHADOW_ROWS rows spread evenly over its m (every row of a
 * smaller call), each against the product the kernel forms from x and the row's own expert. */
static int shadow_rows(const mt_instr_call *ic, mt_iw_slot *s, mt_instr_header *hdr) {
  const mt_grouped_args *g = ic->grouped;
  mt_instr_shadow_rows_args a = {.x = ic->x,
                                 .y = ic->y,
                                 .w = ic->w,
                                 .ldx = (int64_t)ic->ldx,
                                 .ldy = (int64_t)ic->ldy,
                                 .ldw = (int64_t)ic->ldw,
                                 .stride_x = g->stride_x,
                                 .stride_y = g->stride_y,
                                 .w_stride = ic->w_stride,
                                 .offs = g->offs,
                                 .nseg = g->nseg,
                                 .seg_rows = g->seg_rows,
                                 .n = ic->n,
                                 .k = ic->k,
                                 .xtype = ic->xtype,
                                 .ytype = ic->ytype,
                                 .wtype = ic->wtype,
                                 .in_out = ic->in_out,
                                 .alpha = ic->alpha,
                                 .hdr = hdr};
  const int rows = ic->m < MT_INSTR_SHADOW_ROWS ? ic->m : MT_INSTR_SHADOW_ROWS;
  for (int i = 0; i < rows; i++)
    a.rows[i] = rows < MT_INSTR_SHADOW_ROWS
                    ? i
                    : (int32_t)((2 * (int64_t)i + 1) * ic->m / (2 * MT_INSTR_SHADOW_ROWS));
  a.nrows = s->shadow_rows = rows;
  return mt_instr_launch_shadow_rows(&a, (mt_stream)ic->call->stream);
}

/* Enqueue the chosen probe and shadow into slot s on the call's stream (the digest goes last, with
 * the publication: publish()); returns the kinds still on (0 when the memset failed: nothing was
 * enqueued). The probe and shadow under scratch_lock. */
static int enqueue(const mt_instr_call *ic, mt_iw_context *c, mt_iw_slot *s, int kinds,
                   const mt_driver *d) {
  CUstream stream = (CUstream)ic->call->stream;
  mt_instr_header *hdr = (mt_instr_header *)s->dev;
  /* not the replay count, which a captured slot keeps across replays (kernels/instr.h) */
  if (!s->used &&
      d->memset_d8_async(s->dev, 0, offsetof(mt_instr_header, replays), stream) != CUDA_SUCCESS)
    return 0;
  s->used = 1;
  CUdeviceptr scratch = mt_iw_scratch(c) /* the probe's rows, then the shadow's */;
  if (kinds & MT_IW_PROBE) {
    mt_instr_probe_args pa = {.hdr = hdr};
    if (!run_probe(ic, scratch, &pa) || mt_instr_launch_probe(&pa, (mt_stream)stream) != MT_OK) {
      mt_iw_count_skips(MT_IW_PROBE, MT_IW_ERROR);
      kinds &= ~MT_IW_PROBE;
    } else {
      s->probe_rows = pa.nrows;
    }
  }
  if ((kinds & MT_IW_SHADOW) && shadow_kind(ic) == SHADOW_ROWS) {
    if (shadow_rows(ic, s, hdr) != MT_OK) {
      mt_iw_count_skips(MT_IW_SHADOW, MT_IW_ERROR);
      kinds &= ~MT_IW_SHADOW;
    }
  } else if (kinds & MT_IW_SHADOW) {
    CUdeviceptr ref = scratch + (CUdeviceptr)probe_bytes_of(ic);
    mt_instr_shadow_args sa = {.y = ic->y,
                               .ref = (const void *)ref,
                               .ld = (int64_t)ic->ldy,
                               .stride = ic->grouped ? ic->grouped->stride_y : 0,
                               .m = ic->m,
                               .n = ic->n,
                               .type = ic->ytype,
                               .seg_rows = ic->grouped ? ic->grouped->seg_rows : 0,
                               .hdr = hdr};
    int rerun = ic->grouped ? rerun_batch(ic->call, (void *)ref)
                            : rerun_cublas(ic->call, 0, ic->m, (void *)ref, (int64_t)ic->ldy);
    if (!rerun || mt_instr_launch_shadow(&sa, (mt_stream)stream) != MT_OK) {
      mt_iw_count_skips(MT_IW_SHADOW, MT_IW_ERROR);
      kinds &= ~MT_IW_SHADOW;
    }
  }
  return kinds;
}

/* The frozen-sampled cache's stored hashes, which are the digests' weight sums (kernels/instr.h):
 * a single problem's (shim/wcache.c gives it), a grouped call's slices' (its store's refresh
 * state: a slice a segment, or one for all); NULL where the finish sums the weight itself. */
static const uint64_t *stored_sums(const mt_instr_call *ic, int64_t *stride) {
  const mt_wstore_refresh_args *r = ic->grouped ? ic->grouped->refresh : NULL;
  *stride = 0;
  if (ic->in_out) /* the cache hashes an [in][out] weight's stored lines, not the sum's */
    return NULL;
  if (!ic->grouped)
    return ic->frozen_sum;
  if (!r || r->step != MT_SAMPLE_STEP)
    return NULL;
  *stride = ic->w_stride ? (int64_t)(sizeof(mt_wcheck_slice) / sizeof(uint64_t)) : 0;
  return &mt_wcheck_slices(r->state)->hash;
}

/* The finish's arguments: the weight's identity when rows are digested, then the publication of
 * the block under the slot's next sequence (kernels/instr.h). */
static void finish_args(const mt_instr_call *ic, mt_iw_slot *s, int kinds,
                        mt_instr_finish_args *fa) {
  size_t bias_elem = ic->biastype == MT_DTYPE_FP32 ? 4 : 2;
  int digest_on = kinds & MT_IW_DIGEST;
  int64_t frozen_stride;
  const uint64_t *frozen = stored_sums(ic, &frozen_stride);
  /* 0 is a captured call's (kernels/instr.h): an uncaptured slot's sequence skips it, and stays
   * below MT_INSTR_EMPTY */
  if (s->captured)
    s->seq = 0;
  else if ((s->seq = (s->seq + 1) & ~MT_INSTR_EMPTY) == 0)
    s->seq = 1;
  *fa =
      (mt_instr_finish_args){.w = digest_on ? ic->w : NULL,
                             .ldw = (int64_t)ic->ldw,
                             .w_stride = ic->w_stride,
                             .grouped = ic->grouped != NULL,
                             .in_out = ic->in_out,
                             .frozen_sum = digest_on ? frozen : NULL,
                             .frozen_stride = frozen_stride,
                             .bias = digest_on ? ic->bias : NULL,
                             .bias_bytes = digest_on && ic->bias ? (int64_t)(bias_elem * ic->n) : 0,
                             .n = ic->n,
                             .k = ic->k,
                             .hdr = (mt_instr_header *)s->dev,
                             .dst = (void *)s->host_dev,
                             .flag = (uint32_t *)s->flag_dev,
                             .cap = MT_IW_ROWS,
                             .seq = s->seq,
                             .empty_ok = kinds == MT_IW_DIGEST,
                             .tick = digest_on ? replay_tick(s) : NULL};
}

/* The call's last launches: the digest, when on, then the finish (the publication). A digest that
 * cannot be launched is dropped (counted); MT_OK with *kinds those published (0: nothing was), or
 * an mt_status when the finish could not be launched. */
static int publish(const mt_instr_call *ic, mt_iw_slot *s, int *kinds) {
  const mt_stream stream = (mt_stream)ic->call->stream;
  if (*kinds & MT_IW_DIGEST) {
    mt_instr_digest_args da;
    digest_args(ic, s, &da);
    if (mt_instr_launch_digest(&da, stream) != MT_OK) {
      mt_iw_count_skips(MT_IW_DIGEST, MT_IW_ERROR);
      *kinds &= ~MT_IW_DIGEST;
    }
  }
  if (!*kinds)
    return MT_OK;
  mt_instr_finish_args fa;
  finish_args(ic, s, *kinds, &fa);
  return mt_instr_launch_finish(&fa, stream);
}

/* The scratch's room and availability for the probe and shadow. When they stay on, the
 * context's scratch_lock is held (*held set) until the call has enqueued them. */
static int scratch_gate(const mt_instr_call *ic, mt_iw_context *c, int kinds, int *held) {
  size_t probe_bytes = probe_bytes_of(ic);
  size_t shadow_bytes = 2 * shadow_elems(ic);
  *held = 0;
  if ((scratch_kinds(ic, kinds) & MT_IW_SHADOW) && probe_bytes + shadow_bytes > c->scratch_bytes) {
    mt_iw_count_skips(MT_IW_SHADOW, MT_IW_SCRATCH);
    kinds &= ~MT_IW_SHADOW;
  }
  if ((kinds & MT_IW_PROBE) && probe_bytes > c->scratch_bytes) {
    mt_iw_count_skips(MT_IW_PROBE, MT_IW_SCRATCH);
    kinds &= ~MT_IW_PROBE;
  }
  const int needs = scratch_kinds(ic, kinds);
  if (!needs)
    return kinds;
  /* another thread enqueueing its own probe or shadow: skip rather than wait for it */
  if (pthread_mutex_trylock(&c->scratch_lock) == 0) {
    if (scratch_free(c, (CUstream)ic->call->stream))
      return *held = 1, kinds;
    pthread_mutex_unlock(&c->scratch_lock);
  }
  mt_iw_count_skips(needs, MT_IW_BUSY);
  return kinds & ~needs;
}

/* Under the writer's lock: 1 when the writer runs; a writer that cannot start turns the
 * instruments off. */
static int writer_running(void) {
  int w = mt_iw_writer_start();
  if (w < 0)
    enabled = 0;
  return w > 0;
}

/* Drop the instruments `which` from *kinds, counting those it held as skipped for `why`. */
static void skip(int *kinds, int which, enum mt_iw_skip why) {
  which &= *kinds;
  if (which) {
    mt_iw_count_skips(which, why);
    *kinds &= ~which;
  }
}

/* The instruments of `kinds` this call's form can take; the others counted as skipped. */
static int supported(const mt_instr_call *ic, int kinds) {
  /* beta != 0: y is beta C + ..., and C may be y itself, already overwritten */
  if (ic->beta != 0.0f)
    skip(&kinds, kinds, MT_IW_BETA);
  /* behind pointer arrays the rows' addresses are on the device only: nothing to digest, probe
   * or rerun from the host's side (and nothing read back to find them) */
  if (ic->call->pointer_arrays)
    skip(&kinds, kinds, MT_IW_ENTRY);
  if ((kinds & MT_IW_SHADOW) && shadow_kind(ic) == SHADOW_NONE)
    skip(&kinds, MT_IW_SHADOW, MT_IW_ENTRY);
  /* a grouped call's bias differs by segment: its digests' keys would need one sum a row; rows
   * times a router weight (vLLM's dispatch) are no expert's own rows to compare */
  const mt_moe_dispatch *moe = ic->grouped ? ic->grouped->dispatch : NULL;
  if (ic->grouped && (ic->bias || (moe && moe->weights)))
    skip(&kinds, MT_IW_DIGEST, MT_IW_ENTRY);
  /* a weight whose lines the sample cannot number in 32 bits (kernels/whash.h) has no id */
  if (!mt_whash_lines_fit(ic->n, ic->k))
    skip(&kinds, MT_IW_DIGEST, MT_IW_ENTRY);
  /* vLLM's dispatch: a row alone would need a dispatch of its own; an Lt call under bf16 fixes
   * its token count in its layouts */
  if (moe || (!ic->engine && !ic->grouped && ic->call->entry == MT_FN_cublasLtMatmul))
    skip(&kinds, MT_IW_PROBE, MT_IW_ENTRY);
  return kinds;
}

/* Which instruments this call gets, and its slot's context; 0 when none. Takes the writer's
 * lock briefly. */
static int choose(const mt_instr_call *ic, const mt_driver *d, const mt_instr_driver *e, sampled *p,
                  mt_iw_context **c, int *capturing) {
  mt_iw_lock();
  *p = sample(ic, d);
  int kinds = (p->shadow ? MT_IW_SHADOW : 0) | (p->probe ? MT_IW_PROBE : 0) |
              (p->digest ? MT_IW_DIGEST : 0);
  if (p->route >= 0)
    mt_iw_count_passed(((period_shadow ? MT_IW_SHADOW : 0) | (period_probe ? MT_IW_PROBE : 0) |
                        (period_digest ? MT_IW_DIGEST : 0)) &
                       ~kinds);
  if (p->route < 0 || !kinds || !d || !e || mt_iw_stopped()) {
    mt_iw_unlock();
    return 0;
  }
  mt_iw_count_calls(kinds);
  kinds = supported(ic, kinds);
  if (kinds && !period_digest)
    p->captured = call_captured(ic, d);
  *capturing = kinds && p->captured;
  /* captured: the digests run in the graph (at one replay in replay_every; none when it is 0);
   * the probe and the shadow rerun the call from the host's side, and the pool is set up
   * (allocated) by an uncaptured call only */
  if (*capturing)
    skip(&kinds, kinds & ~(replay_every ? MT_IW_DIGEST : 0), MT_IW_CAPTURE);
  if (kinds && *capturing && !(*c = mt_iw_context_ready()))
    skip(&kinds, kinds, MT_IW_CAPTURE);
  else if (kinds && !*capturing && !(*c = mt_iw_context_get(d, e)))
    skip(&kinds, kinds, MT_IW_ERROR);
  if (kinds && !writer_running())
    skip(&kinds, kinds, MT_IW_ERROR);
  mt_iw_unlock();
  return kinds;
}

/* The slot's fields the writer needs, from the call. */
static void slot_fill(mt_iw_slot *s, const mt_instr_call *ic, int route, int kinds) {
  s->kinds = kinds;
  s->route = route;
  s->m = ic->m, s->n = ic->n, s->k = ic->k;
  s->xtype = ic->xtype, s->ytype = ic->ytype, s->wtype = ic->wtype;
  s->has_bias = ic->bias != NULL, s->biastype = ic->biastype;
  s->alpha = ic->alpha;
  s->probe_rows = s->shadow_rows = 0;
  s->grouped = ic->grouped != NULL;
  s->shared_w = ic->grouped && !ic->w_stride;
}

void mt_instr_after(const mt_instr_call *ic) {
  if (!enabled || ic->m <= 0 || ic->n <= 0)
    return;
  const mt_driver *d = mt_driver_get();
  const mt_instr_driver *e = mt_instr_driver_get();
  sampled p;
  mt_iw_context *c = NULL;
  int capturing;
  int kinds = choose(ic, d, e, &p, &c, &capturing);
  mt_iw_slot *s = NULL;
  if (kinds && !(s = mt_iw_slot_take(c))) {
    mt_iw_count_skips(kinds, MT_IW_NO_SLOT);
    mt_iw_count_dropped_call();
    kinds = 0;
  }
  if (kinds && capturing && !mt_iw_capture(s)) {
    mt_iw_count_skips(kinds, MT_IW_NO_SLOT);
    kinds = 0;
  }
  int held = 0;
  if (kinds)
    kinds = scratch_gate(ic, c, kinds, &held);
  if (!kinds) {
    if (s)
      mt_iw_give_back(s, MT_IW_FREE);
    return;
  }
  slot_fill(s, ic, p.route, kinds);
  int got = enqueue(ic, c, s, kinds, d);
  mt_iw_count_skips(kinds & ~got, MT_IW_ERROR);
  if (got && publish(ic, s, &got) != MT_OK) {
    /* enqueued work whose end cannot be known: the slot is never reused */
    mt_iw_count_skips(got, MT_IW_ERROR);
    mt_iw_give_back(s, MT_IW_LOST);
    got = 0;
  } else if (!got) {
    mt_iw_give_back(s, MT_IW_FREE);
  }
  if (scratch_kinds(ic, got)) {
    c->scratch_used = 1;
    c->scratch_stream = mt_stream_key((CUstream)ic->call->stream);
    c->scratch_slot = s;
    c->scratch_seq = s->seq;
  }
  if (held)
    pthread_mutex_unlock(&c->scratch_lock);
  if (got) {
    s->kinds = got;
    mt_iw_publish(s);
  }
}

/* --- bf16: cuBLAS is the routed engine ------------------------------------------------------ */

static enum mt_dtype dtype_of(int cuda_type) {
  return cuda_type == CUDA_R_16F   ? MT_DTYPE_FP16
         : cuda_type == CUDA_R_32F ? MT_DTYPE_FP32
                                   : MT_DTYPE_BF16;
}

void mt_instr_from_call(const mt_spec *s, const mt_call *c, const float *alpha, const float *beta,
                        mt_instr_call *out) {
  int bias = c->entry == MT_FN_cublasLtMatmul && c->epilogue == CUBLASLT_EPILOGUE_BIAS;
  *out = (mt_instr_call){.spec = s,
                         .call = c,
                         .w = c->a,
                         .ldw = (size_t)c->lda,
                         .wtype = dtype_of(c->atype),
                         .in_out = mt_call_in_out(c),
                         .m = (int)c->n,
                         .n = (int)c->m,
                         .k = (int)c->k,
                         .x = c->b,
                         .ldx = (size_t)c->ldb,
                         .xtype = dtype_of(c->btype),
                         .y = c->d,
                         .ldy = (size_t)c->ldd,
                         .ytype = dtype_of(c->dtype),
                         .alpha = *alpha,
                         .beta = *beta,
                         .bias = bias ? c->bias : NULL,
                         .biastype = !bias || c->bias_type == -1 ? dtype_of(c->dtype)
                                                                 : dtype_of(c->bias_type)};
}

int mt_instr_bf16(const mt_spec *s, const mt_call *c, cublasStatus_t *status) {
  if (!enabled || !single_problem(c) || c->m > INT32_MAX || c->n > INT32_MAX || c->k > INT32_MAX ||
      !mt_driver_get() || !mt_instr_driver_get())
    return 0;
  if (c->entry == MT_FN_cublasLtMatmul) {
    mt_fn_cublasLtMatmul f = MT_REAL_FN(cublasLtMatmul);
    if (!f)
      return 0;
    *status = f(c->handle, c->lt_desc, c->alpha, c->a, c->lt_adesc, c->b, c->lt_bdesc, c->beta,
                c->c, c->lt_cdesc, c->d, c->lt_ddesc, c->lt_algo, c->workspace,
                (size_t)c->workspace_bytes, c->stream);
  } else if (c->entry == MT_FN_cublasGemmEx) {
    mt_fn_cublasGemmEx f = MT_REAL_FN(cublasGemmEx);
    if (!f)
      return 0;
    *status = f(c->handle, c->transa, c->transb, (int)c->m, (int)c->n, (int)c->k, c->alpha, c->a,
                c->atype, (int)c->lda, c->b, c->btype, (int)c->ldb, c->beta, (void *)c->c, c->ctype,
                (int)c->ldc, c->compute, c->algo);
  } else {
    mt_fn_cublasGemmEx_64 f = MT_REAL_FN(cublasGemmEx_64);
    if (!f)
      return 0;
    *status =
        f(c->handle, c->transa, c->transb, c->m, c->n, c->k, c->alpha, c->a, c->atype, c->lda, c->b,
          c->btype, c->ldb, c->beta, (void *)c->c, c->ctype, c->ldc, c->compute, c->algo);
  }
  if (*status == CUBLAS_STATUS_SUCCESS) {
    mt_instr_call ic;
    mt_instr_from_call(s, c, (const float *)c->alpha, (const float *)c->beta, &ic);
    mt_instr_after(&ic);
  }
  return 1;
}

void mt_instr_drain(void) { mt_iw_drain(); }

void mt_instr_summary(void (*emit)(void *ctx, const char *text), void *ctx) {
  mt_iw_summary(emit, ctx);
}
