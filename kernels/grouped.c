/* grouped.c — host side of the grouped GEMM (kernels/grouped.cu): the weight store's layout,
 * quantization and refresh, and one grouped problem (validate, quantize all its activation rows in
 * one launch, refresh the store where asked, describe them, launch the GEMM). Nothing here
 * allocates, synchronizes or reads device memory back: legal inside CUDA graph capture once the
 * modules are loaded. */
#include <stdint.h>
#include <stdio.h>

#include "kernels/driver.h"
#include "kernels/engine.h"
#include "kernels/gemm.h"
#include "kernels/gemm_args.h"
#include "kernels/quant.h"
#include "kernels/wcheck.h"
#include "kernels/whash.h"
#include "kernels/wstore.h"

/* mt_gemm_tensor_map's paired box is two K blocks deep: a stage of the grouped kernel's kpair
 * mode. */
_Static_assert(MT_LARGE_KS_64 == 2, "a paired activation box must be one grouped stage");

static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }
/* Sections of the workspace and of the dispatch's lists: 256-byte aligned. */
static size_t section(size_t b) { return (b + 255) / 256 * 256; }
static int is_half(enum mt_dtype t) { return t == MT_DTYPE_BF16 || t == MT_DTYPE_FP16; }

static int wstore_shape_ok(int count, int n, int k, const mt_numerics *num) {
  if (!num || count <= 0 || n <= 0 || k <= 0 || k % 16)
    return 0;
  if ((long long)count * n > INT_MAX)
    return 0; /* the quantizer's rows are count * n, an int */
  if (num->weight_scale != MT_SCALE_ROW && num->weight_scale != MT_SCALE_TENSOR)
    return 0;
  if (num->weight_block == MT_WBLOCK_16X16) /* a tile's 16 rows share one S */
    return num->weight_scale == MT_SCALE_TENSOR && n % 16 == 0;
  return num->weight_block == MT_WBLOCK_1X16;
}

size_t mt_wstore_bytes(int count, int n, int k, const mt_numerics *num) {
  if (!wstore_shape_ok(count, n, k, num))
    return 0;
  return (size_t)count * MT_WS_SLICE_BYTES(n, k, num->weight_scale == MT_SCALE_ROW);
}

int mt_wstore_bind(mt_wstore *w, int count, int n, int k, const mt_numerics *num, void *mem) {
  if (!w || !mem || ((uintptr_t)mem % 256) || !wstore_shape_ok(count, n, k, num))
    return MT_ERR_UNSUPPORTED;
  w->count = count;
  w->n = n;
  w->k = k;
  w->num = *num;
  w->base = mem;
  w->slice_bytes = MT_WS_SLICE_BYTES(n, k, num->weight_scale == MT_SCALE_ROW);
  w->in_out = 0;
  return MT_OK;
}

const float *mt_wstore_outer(const mt_wstore *w, int e) {
  return (const float *)(w->base + (size_t)e * w->slice_bytes +
                         MT_WS_SECTION(MT_WS_RECORD_BYTES(w->n, w->k)));
}

/* A source weight's stored rows and their length: n of k, or k of n stored [in][out]. */
static size_t stored_rows(const mt_wstore *w) { return (size_t)(w->in_out ? w->k : w->n); }
static size_t stored_cols(const mt_wstore *w) { return (size_t)(w->in_out ? w->n : w->k); }

/* The store mode's quantization of w's count weights (strided: slice e at wt + e * stride). */
static mt_quant_params store_params(const void *wt, enum mt_dtype type, size_t ldw, size_t stride,
                                    const mt_wstore *w) {
  return (mt_quant_params){
      .x = wt,
      .ldx = (int64_t)ldw,
      .rows = w->count * w->n,
      .cols = w->k,
      .fp16 = type == MT_DTYPE_FP16,
      .row_outer = w->num.weight_scale == MT_SCALE_ROW,
      .batch_rows = w->n,
      .batch_stride = (int64_t)(w->count > 1 ? stride : stored_rows(w) * ldw),
      .store = w->base,
      .slice_bytes = (int64_t)w->slice_bytes,
      .in_out = w->in_out,
  };
}

static int store_source_ok(const void *wt, enum mt_dtype type, size_t ldw, size_t stride,
                           const mt_wstore *w) {
  return wt && w && w->base && wstore_shape_ok(w->count, w->n, w->k, &w->num) && is_half(type) &&
         aligned16(wt) && ldw >= stored_cols(w) && ldw % 8 == 0 &&
         (w->count == 1 || (stride >= stored_rows(w) * ldw && stride % 8 == 0));
}

int mt_wstore_quantize(const void *wt, enum mt_dtype type, size_t ldw, size_t stride, mt_wstore *w,
                       mt_stream stream) {
  if (!store_source_ok(wt, type, ldw, stride, w))
    return MT_ERR_UNSUPPORTED;
  mt_quant_params p = store_params(wt, type, ldw, stride, w);
  return mt_quantize(&p, w->num.weight_block == MT_WBLOCK_16X16, stream);
}

/* The refresh kernel's arguments for r: on its own, or chained into a grouped call. */
static int refresh_kargs(const mt_wstore_refresh_args *r, int chained, mt_refresh_args *k) {
  const mt_wstore *ws = r ? r->ws : NULL;
  const size_t stride = ws ? stored_rows(ws) * r->ldw : 0;
  if (!r || !store_source_ok(r->w, r->type, r->ldw, stride, ws) || !r->state ||
      !mt_whash_lines_fit((int)stored_rows(ws), (int)stored_cols(ws)))
    return MT_ERR_UNSUPPORTED;
  *k = (mt_refresh_args){.q = store_params(r->w, r->type, r->ldw, stride, ws),
                         .offs = r->offs,
                         .m = r->m,
                         .step = r->step ? r->step : 1,
                         .state = r->state,
                         .chained = chained};
  return MT_OK;
}

static int launch_refresh(const mt_wstore_refresh_args *r, const mt_refresh_args *k,
                          mt_stream stream) {
  return mt_quantize_refresh(k, r->ws->num.weight_block == MT_WBLOCK_16X16, stream);
}

int mt_wstore_refresh(const mt_wstore_refresh_args *r, mt_stream stream) {
  mt_refresh_args k;
  const int st = refresh_kargs(r, MT_REFRESH_ALONE, &k);
  return st == MT_OK ? launch_refresh(r, &k, stream) : st;
}

int mt_wstore_quantize_ptrs(const void *const *w_ptrs, enum mt_dtype type, size_t ldw, mt_wstore *w,
                            mt_stream stream) {
  if (!w_ptrs || !w || !w->base || !wstore_shape_ok(w->count, w->n, w->k, &w->num) ||
      !is_half(type) || ldw < stored_cols(w) || ldw % 8)
    return MT_ERR_UNSUPPORTED;
  mt_quant_params p = {
      .in_out = w->in_out,
      .ldx = (int64_t)ldw,
      .rows = w->count * w->n,
      .cols = w->k,
      .fp16 = type == MT_DTYPE_FP16,
      .row_outer = w->num.weight_scale == MT_SCALE_ROW,
      .batch_rows = w->n,
      .batch_ptrs = w_ptrs,
      .store = w->base,
      .slice_bytes = (int64_t)w->slice_bytes,
  };
  return mt_quantize(&p, w->num.weight_block == MT_WBLOCK_16X16, stream);
}

int mt_grouped_seg_ends(int32_t *offs, int seg0, int row0, int nruns, const int32_t *size,
                        const int32_t *rows, mt_stream stream) {
  if (!offs || seg0 < 0 || row0 < 0 || nruns < 0 || (nruns && (!size || !rows)))
    return MT_ERR_UNSUPPORTED;
  long long seg = seg0, row = row0;
  for (int j = 0; j < nruns; j++) {
    if (size[j] < 0 || rows[j] < 0)
      return MT_ERR_UNSUPPORTED;
    seg += size[j], row += (long long)size[j] * rows[j];
    if (seg > INT32_MAX || row > INT32_MAX)
      return MT_ERR_UNSUPPORTED;
  }
  CUfunction f;
  int st = mt_kernel_get("grouped", "mt_seg_ends", (CUstream)stream, &f);
  mt_seg_ends_args a = {.offs = offs, .seg0 = seg0, .row0 = row0};
  for (int j0 = 0; j0 < nruns && st == MT_OK; j0 += MT_SEG_ENDS_RUNS) {
    a.nruns = nruns - j0 < MT_SEG_ENDS_RUNS ? nruns - j0 : MT_SEG_ENDS_RUNS;
    for (int j = 0; j < a.nruns; j++)
      a.size[j] = size[j0 + j], a.rows[j] = rows[j0 + j];
    st = mt_launch(f, 1, 1, 128, 1, 0, 0, (CUstream)stream, &a);
    for (int j = 0; j < a.nruns; j++)
      a.seg0 += a.size[j], a.row0 += a.size[j] * a.rows[j];
  }
  return st;
}

size_t mt_grouped_workspace_bytes(int m, int k, const mt_numerics *num) {
  if (!num || m <= 0 || k <= 0)
    return 0;
  return section((size_t)m * (size_t)k * 2) +
         section((num->act_scale == MT_SCALE_ROW ? (size_t)m : 2) * 4);
}

/* The lists: the segment ends, then src, dst and (weighted) w, each a section. */
size_t mt_moe_lists_bytes(int m, int nseg, int weighted) {
  if (m <= 0 || nseg <= 0)
    return 0;
  return section((size_t)nseg * 4) + (weighted ? 3 : 2) * section((size_t)m * 4);
}

mt_moe_lists mt_moe_lists_at(void *mem, int m, int nseg, int weighted) {
  char *p = mem;
  const size_t ends = section((size_t)nseg * 4), rows = section((size_t)m * 4);
  return (mt_moe_lists){.offs = (int32_t *)p,
                        .src = (int32_t *)(p + ends),
                        .dst = (int32_t *)(p + ends + rows),
                        .w = weighted ? (float *)(p + ends + 2 * rows) : NULL};
}

/* vLLM's dispatch: the lists' memory, what they cover, and a call the epilogue's scatter takes (no
 * C, no bias, no pointer arrays). */
static int dispatch_ok(const mt_grouped_args *a) {
  const mt_moe_dispatch *d = a->dispatch;
  return d->experts && d->post_padded && d->blocks >= 0 && d->block_m > 0 && d->top_k > 0 &&
         d->lists.offs && d->lists.src && d->lists.dst && !d->weights == !d->lists.w &&
         a->offs == d->lists.offs && a->nseg <= MT_MOE_MAX_EXPERTS && !a->x_ptrs && !a->y_ptrs &&
         !a->c_ptrs && a->beta == 0.0f && !a->bias && a->y && aligned16(a->y) &&
         (!d->sorted || (long long)d->blocks * d->block_m <= INT_MAX);
}

static int grouped_args_ok(const mt_grouped_args *a) {
  const mt_wstore *w = a->w;
  if (a->nseg <= 0 || a->m <= 0 || a->n <= 0 || a->k <= 0 || a->m > MT_GEMM_DIM_MAX ||
      a->n > MT_GEMM_DIM_MAX || !w || w->n != a->n || w->k != a->k || w->count < a->nseg ||
      !w->base)
    return 0;
  if (a->offs ? a->seg_rows != 0 : (a->seg_rows <= 0 || (long long)a->seg_rows * a->nseg != a->m))
    return 0;
  if (!is_half(a->xtype) || a->ldx < (size_t)a->k || a->ldx % 8)
    return 0;
  if (!a->x_ptrs && (!a->x || !aligned16(a->x)))
    return 0;
  if (!a->x_ptrs && !a->offs && a->nseg > 1 &&
      (a->stride_x < (long long)a->seg_rows * (long long)a->ldx || a->stride_x % 8))
    return 0;
  if ((!a->y && !a->y_ptrs) || !is_half(a->ytype) || a->ldy < (size_t)a->n)
    return 0;
  if (a->beta != 0.0f && ((!a->c && !a->c_ptrs) || a->ldc < (size_t)a->n))
    return 0;
  if (a->bias && !is_half(a->biastype) && a->biastype != MT_DTYPE_FP32)
    return 0;
  return !a->dispatch || dispatch_ok(a);
}

int mt_grouped_bn(int m, int nseg) {
  /* the rows a segment gets on average, with a quarter more for the ones above it */
  long long want = ((long long)m * 5 / 4 + nseg - 1) / nseg;
  int bn = 8;
  while (bn < 256 && bn < want)
    bn *= 2;
  return bn;
}

/* Whether the call's GEMM runs beside its refresh (MT_REFRESH_BESIDE): at most BESIDE_ROWS rows,
 * per-row S (the activations' quantizer one kernel, launched dependent). Else the GEMM waits for
 * the refresh before its K loops: beside it above 64 rows, Qwen3's layer took 0.6-1.6% longer at
 * 16-64 tokens (gained 2.6% at 128 alone) and DeepSeek's 3% at 16 and 128 (lab/NOTES.md, "The
 * sampled refresh's clusters"). */
#define BESIDE_ROWS 64
static int gemm_beside_refresh(const mt_grouped_args *a) {
  return a->refresh && a->w->num.act_scale == MT_SCALE_ROW && a->m <= BESIDE_ROWS;
}

/* The count of the call's activations' quantizer's running CTAs, where the GEMM runs beside the
 * refresh (it waits for that count, not for the grid before it), else NULL. */
static uint32_t *acts_running(const mt_grouped_args *a) {
  return gemm_beside_refresh(a) ? &((mt_wcheck_head *)a->refresh->state)->acts : NULL;
}

/* The call's activations into xhat and S: one kernel launched dependent where S is per row, which
 * lets the kernels after it start at once, or with a refresh after it (which reads the weights and
 * its state before it waits) only once the kernel before the call has ended, counting its CTAs
 * while they run. */
static int quantize_acts(const mt_grouped_args *a, uint16_t *xhat, float *outer, mt_stream stream) {
  mt_quant_params p = {
      .x = a->x,
      .ldx = (int64_t)a->ldx,
      .rows = a->m,
      .cols = a->k,
      .fp16 = a->xtype == MT_DTYPE_FP16,
      .row_outer = a->w->num.act_scale == MT_SCALE_ROW,
      .xhat = xhat,
      .outer = outer,
      .amax = (uint32_t *)(outer + 1), /* per tensor: S, then the amax word */
      .batch_rows = a->offs || (a->nseg == 1 && !a->x_ptrs) ? 0 : a->seg_rows,
      .batch_stride = a->stride_x,
      .batch_ptrs = a->x_ptrs,
      .batch_offs = a->x_ptrs ? a->offs : NULL,
      .nbatch = a->nseg,
      .gather = a->dispatch ? a->dispatch->lists.src : NULL,
      .dependents_after_wait = a->refresh != NULL,
      .running = acts_running(a),
  };
  return mt_quantize_dependent(&p, stream);
}

static void fill_kargs(const mt_grouped_args *a, const float *sa, mt_grouped_kargs *k) {
  const mt_wstore *w = a->w;
  k->ws = w->base;
  k->ws_slice = (long long)w->slice_bytes;
  k->ws_band = (long long)MT_WS_BAND_BYTES(w->k);
  k->ws_outer = (long long)MT_WS_SECTION(MT_WS_RECORD_BYTES(w->n, w->k));
  k->gen = a->refresh ? &((mt_wcheck_head *)a->refresh->state)->gen : NULL;
  k->acts = acts_running(a);
  k->offs = a->offs;
  k->seg_rows = a->seg_rows;
  k->m = a->m;
  k->n = a->n;
  k->k = a->k;
  k->sa = sa;
  k->sa_row = w->num.act_scale == MT_SCALE_ROW;
  k->sw_row = w->num.weight_scale == MT_SCALE_ROW;
  k->y = a->y;
  k->ldy = (long long)a->ldy;
  k->stride_y = a->offs ? 0 : a->stride_y;
  k->c = a->beta != 0.0f ? a->c : NULL; /* beta == 0: C is not read, as in cuBLAS */
  k->ldc = (long long)a->ldc;
  k->stride_c = a->offs ? 0 : a->stride_c;
  k->y_ptrs = a->y_ptrs;
  k->c_ptrs = a->beta != 0.0f ? a->c_ptrs : NULL;
  k->y_rows = a->dispatch ? a->dispatch->lists.dst : NULL;
  k->row_w = a->dispatch ? a->dispatch->lists.w : NULL;
  k->bias = a->bias;
  k->stride_bias = a->stride_bias;
  k->ytype = (int)a->ytype;
  k->biastype = (int)a->biastype;
  k->alpha = a->alpha;
  k->beta = a->beta;
}

/* A bound on the tiles of segments s0 .. s0 + nseg - 1, the persistent grid's size where it is
 * below the SMs' CTAs: with offsets at most min(m, nseg) of them have rows, and a segment of r
 * rows takes ceil(r / bn) token tiles (a split's tails: at most one last tile a segment, of fewer
 * than MT_GROUPED_TAIL rows). CTAs without a tile are not free: at one token they cost
 * Qwen3's layer over a quarter of its time (lab/NOTES.md, "The grid at one token"). */
static long long tile_bound(const mt_grouped_args *a, int nseg, int bn, int split) {
  const long long blocks = (a->n + 127) / 128, used = a->m < nseg ? a->m : nseg;
  if (split == 2) { /* a last tile of fewer than MT_GROUPED_TAIL rows a segment */
    const long long tail_tiles = (MT_GROUPED_TAIL - 1 + bn - 1) / bn;
    return (a->offs ? used : nseg) * tail_tiles * blocks;
  }
  if (!a->offs)
    return (long long)nseg * ((a->seg_rows + bn - 1) / bn) * blocks;
  return ((long long)a->m / bn + used) * blocks;
}

/* Launches of at most MT_GROUPED_MAX_SEG segments (the kernel's tile table), the persistent grid
 * at most MT_GROUPED_CTAS(bn) CTAs an SM (their shared memory fills it). */
static int launch_gemm(const mt_grouped_args *a, mt_grouped_kargs *k, int bn, mt_stream stream) {
  char fn[32];
  snprintf(fn, sizeof fn, "mt_grouped_n%d", bn);
  CUfunction f;
  int st = mt_kernel_get("grouped", fn, (CUstream)stream, &f);
  if (st != MT_OK)
    return st;
  const long long sms = (long long)mt_sm_count() * MT_GROUPED_CTAS(bn);
  for (int s0 = 0; s0 < a->nseg && st == MT_OK; s0 += MT_GROUPED_MAX_SEG) {
    k->seg0 = s0;
    k->nseg = a->nseg - s0 < MT_GROUPED_MAX_SEG ? a->nseg - s0 : MT_GROUPED_MAX_SEG;
    const long long tiles = tile_bound(a, k->nseg, bn, k->split);
    unsigned grid = (unsigned)(tiles < sms ? tiles : sms);
    st = mt_launch(f, grid, 1, 384, 1, MT_GROUPED_SMEM(bn), 1, (CUstream)stream, k);
    k->acts = NULL; /* a later launch waits for the one before it */
  }
  return st;
}

/* The activations' tensor map for token tile bn: boxes two 64-column blocks deep (rank 3) where a
 * stage is two blocks and k fills them; boxes of one block (rank 2) where the driver refuses
 * rank 3 (the kernel loads a stage's two blocks by two requests then). */
static int act_map(mt_grouped_kargs *k, uint16_t *xhat, const mt_grouped_args *a, int bn) {
  k->kpair = MT_GROUPED_KS(bn) == 2 && a->k % 64 == 0;
  int st = mt_gemm_tensor_map(&k->ta, xhat, a->m, a->k, bn, k->kpair);
  if (st != MT_OK && k->kpair) {
    k->kpair = 0;
    st = mt_gemm_tensor_map(&k->ta, xhat, a->m, a->k, bn, 0);
  }
  return st;
}

/* A refresh the call can run: of the call's store, or of the one slice its segments share; with
 * offs, the call's own table, a segment a slice (the refresh reads an end for each of its
 * slices). */
static int refresh_fits(const mt_grouped_args *a) {
  const mt_wstore *r = a->refresh->ws, *w = a->w;
  const int32_t *offs = a->refresh->offs;
  return r && r->base == w->base && r->n == w->n && r->k == w->k &&
         r->num.weight_scale == w->num.weight_scale && r->num.weight_block == w->num.weight_block &&
         (r->count == w->count || (r->count == 1 && w->slice_bytes == 0)) &&
         (!offs || (offs == a->offs && r->count == a->nseg));
}

/* vLLM's dispatch into the call's segment ends and row lists (mt_moe_dispatch_args): one CTA,
 * launched in order (the kernel before it wrote the slots). */
static int launch_dispatch(const mt_grouped_args *a, mt_stream stream) {
  const mt_moe_dispatch *d = a->dispatch;
  CUfunction f;
  int st = mt_kernel_get("grouped", "mt_moe_dispatch", (CUstream)stream, &f);
  mt_moe_dispatch_args k = {.sorted = d->sorted,
                            .experts = d->experts,
                            .post_padded = d->post_padded,
                            .weights = d->weights,
                            .blocks = d->blocks,
                            .block_m = d->block_m,
                            .top_k = d->top_k,
                            .valid = a->m,
                            .nseg = a->nseg,
                            .offs = d->lists.offs,
                            .src = d->lists.src,
                            .dst = d->lists.dst,
                            .w = d->lists.w,
                            .y = a->y,
                            .ldy = (long long)a->ldy,
                            .n = a->n};
  return st == MT_OK ? mt_launch(f, 1, 1, MT_MOE_THREADS, 1, 0, 0, (CUstream)stream, &k) : st;
}

int mt_gemm_grouped(const mt_grouped_args *a, mt_stream stream) {
  if (!a || !grouped_args_ok(a))
    return MT_ERR_UNSUPPORTED;
  mt_refresh_args rk;
  const int chained = gemm_beside_refresh(a) ? MT_REFRESH_BESIDE : MT_REFRESH_CHAINED;
  if (a->refresh && (!refresh_fits(a) || refresh_kargs(a->refresh, chained, &rk) != MT_OK))
    return MT_ERR_UNSUPPORTED;
  int bn = a->bn ? a->bn : mt_grouped_bn(a->m, a->nseg);
  if (bn != 8 && bn != 16 && bn != 32 && bn != 64 && bn != 128 && bn != 256)
    return MT_ERR_UNSUPPORTED;
  const mt_numerics *num = &a->w->num;
  if (!a->workspace || ((uintptr_t)a->workspace % 256) ||
      a->workspace_bytes < mt_grouped_workspace_bytes(a->m, a->k, num))
    return MT_ERR_NOMEM;
  if (!mt_driver_get())
    return MT_ERR_NO_DRIVER;
  uint16_t *xhat = a->workspace;
  float *outer = (float *)((char *)a->workspace + section((size_t)a->m * (size_t)a->k * 2));
  static mt_grouped_kargs proto; /* only for its alignment: CUtensorMap must be 64-byte aligned */
  mt_grouped_kargs k = proto;
  fill_kargs(a, outer, &k);
  /* A call that reads C runs whole in one launch: y may be C, and if a second launch failed after
   * the first had written its rows, the caller's fallback would read those rows as C. */
  const int split = MT_GROUPED_SPLITS(bn) && !k.c && !k.c_ptrs, tail_bn = MT_GROUPED_TAIL_BN;
  int st = act_map(&k, xhat, a, bn);
  /* the segments' tiles of bn rows, then their short last tiles on the narrower kernel (the same
   * bits: a row's output does not depend on the token tile). The second launch's every CTA waits
   * for the first's grid before it reads the activations, so its end is the call's end for a
   * kernel that waits for it (kernels/engine.h). */
  mt_grouped_kargs tail = k;
  tail.acts = NULL; /* it waits for the first launch */
  if (split) {
    k.split = 1, tail.split = 2;
    k.split_bn = tail.split_bn = bn;
    if (st == MT_OK)
      st = act_map(&tail, xhat, a, tail_bn);
  }
  if (st == MT_OK && a->dispatch)
    st = launch_dispatch(a, stream);
  if (st == MT_OK)
    st = quantize_acts(a, xhat, outer, stream);
  if (st == MT_OK && a->refresh)
    st = launch_refresh(a->refresh, &rk, stream);
  if (st == MT_OK)
    st = launch_gemm(a, &k, bn, stream);
  if (st == MT_OK && split)
    st = launch_gemm(a, &tail, tail_bn, stream);
  return st;
}
