/* exec.c — a routed call on the NVFP4 engine (kernels/engine.h).
 *
 * A forward expert GEMM in cuBLAS's terms is TN: C[m][n] (column-major) = W^T x with W the A
 * operand (lda = W's row stride), x the B operand; in the engine's row-major terms that is
 * y[tokens = n][out = m] = x[n][k] . W[m][k]^T with the same strides. Each problem gets its
 * quantized weight from shim/wcache.c and its scratch from shim/devmem.c and runs on the call's
 * stream with the call's alpha, beta, C, output and (Lt) bias.
 *
 * Every launch of one problem is enqueued under its stream's scratch lease (shim/devmem.h): the
 * scratch is reused by the next call on that stream, so two threads on one stream must not
 * interleave their launches; threads on different streams run at once. Any failure before the
 * GEMM kernel is launched leaves the output untouched, and the hook forwards the call to cuBLAS
 * with the reason. A call of several problems becomes one mt_grouped_call (shim/norm.c) for
 * mt_exec_grouped, which runs it on the grouped engine: one activation quantization and one GEMM
 * launch for all its problems, the weights' store from shim/wcache.c; nothing on the device is
 * ever read back to the host. After a single problem's GEMM, the sampled instruments of
 * shim/instr.c are enqueued behind it, under the same lease (the probe reuses the call's workspace
 * and quantized weight); after a grouped call's, its probe, digests and (strided cuBLAS batches)
 * shadow (none after a pointer-array call's: shim/instr.c skips it as "entry").
 */
#include "shim/exec.h"

#include <limits.h>

#include "kernels/driver.h"
#include "shim/instr.h"
#include "base/log.h"
#include "shim/norm.h"
#include "shim/devmem.h"
#include "shim/wcache.h"

static enum mt_dtype dtype_of(int cuda_type) {
  return cuda_type == CUDA_R_16F   ? MT_DTYPE_FP16
         : cuda_type == CUDA_R_32F ? MT_DTYPE_FP32
                                   : MT_DTYPE_BF16;
}

static int fits_int(const mt_call *c) {
  return c->m <= INT_MAX && c->n <= INT_MAX && c->k <= INT_MAX;
}

/* One problem's operands: W (A), x (B), C and the output (D), and the bias (Lt's BIAS epilogue). */
typedef struct {
  const void *w, *x, *c;
  void *y;
  const void *bias;
} operands;

/* One TN problem of `c`'s dims, types and stream, on its own operands and host scalars. */
static enum mt_reason run_problem(const mt_spec *s, const mt_call *c, const operands *o,
                                  const float *alpha, const float *beta, int capturing) {
  if (!fits_int(c))
    return MT_R_LAYOUT;
  mt_weight_ref w = {.w = o->w,
                     .n = (int)c->m,
                     .k = (int)c->k,
                     .in_out = mt_call_in_out(c),
                     .ldw = (size_t)c->lda,
                     .type = dtype_of(c->atype)};
  mt_numerics_from_spec(s, &w.num);
  mt_engine_mem mem;
  enum mt_reason r = mt_wcache_prepare(&w, (int)c->n, c->stream, capturing, &mem);
  if (r != MT_R_ROUTED) {
    mt_wcache_release(&mem.hold);
    return r;
  }
  mt_gemm_args a = {
      .m = (int)c->n,
      .n = (int)c->m,
      .k = (int)c->k,
      .x = o->x,
      .ldx = (size_t)c->ldb,
      .xtype = dtype_of(c->btype),
      .w = mem.q,
      .y = o->y,
      .ldy = (size_t)c->ldd,
      .ytype = dtype_of(c->dtype),
      .c = o->c,
      .ldc = (size_t)c->ldc,
      .bias = o->bias,
      .biastype = !o->bias || c->bias_type == -1 ? dtype_of(c->dtype) : dtype_of(c->bias_type),
      .alpha = *alpha,
      .beta = *beta,
      .workspace = mem.workspace,
      .workspace_bytes = mem.workspace_bytes,
  };
  int st = mt_gemm(&a, c->stream);
  if (st == MT_OK)
    mt_devmem_ran(&mem.hold.mem);
  if (st == MT_OK && mt_instr_enabled()) {
    mt_instr_call ic;
    mt_instr_from_call(s, c, alpha, beta, &ic);
    ic.engine = &a;
    ic.frozen_sum = mem.wsum;
    ic.w = o->w, ic.x = o->x, ic.y = o->y;
    ic.capturing = capturing;
    mt_instr_after(&ic);
  }
  mt_wcache_release(&mem.hold);
  if (st != MT_OK && st != MT_ERR_CAPTURE)
    MT_WARN_ONCE("the NVFP4 engine could not run a routed GEMM (m=%lld n=%lld k=%lld): %s; such "
                 "calls fall back to cuBLAS",
                 (long long)c->m, (long long)c->n, (long long)c->k,
                 mt_status_name((enum mt_status)st));
  return mt_engine_reason(st);
}

/* The sampled instruments of a grouped call (probe, digests, shadow), enqueued behind its GEMM
 * under the same lease: the probe reuses the call's workspace and weight store. */
static void instrument_grouped(const mt_spec *s, const mt_grouped_call *g, const mt_grouped_args *a,
                               int capturing) {
  mt_instr_call ic = {.spec = s,
                      .call = g->call,
                      .w = g->w,
                      .ldw = (size_t)g->ldw,
                      .wtype = dtype_of(g->wtype),
                      .in_out = g->w_in_out,
                      .m = a->m,
                      .n = a->n,
                      .k = a->k,
                      .x = g->x,
                      .ldx = (size_t)g->ldx,
                      .xtype = a->xtype,
                      .y = g->y,
                      .ldy = (size_t)g->ldy,
                      .ytype = a->ytype,
                      .alpha = g->alpha,
                      .beta = g->beta,
                      .bias = g->bias,
                      .biastype = a->biastype,
                      .capturing = capturing,
                      .grouped = a,
                      .w_stride = g->w_stride};
  mt_instr_after(&ic);
}

/* The segment table of a call whose rows differ by group (mt_grouped_call.group_rows): each
 * problem's row end, from the call's host arrays, written on the device by kernels that carry the
 * values in their parameters (nothing copied from the host: legal in a capture). */
#define ENDS_RUNS 64
static int write_seg_ends(const mt_grouped_call *g, int32_t *offs) {
  const mt_call *c = g->call;
  int32_t size[ENDS_RUNS], rows[ENDS_RUNS];
  int seg = 0, row = 0, n = 0, st = MT_OK;
  for (int64_t i = 0; i < c->group_count && st == MT_OK; i++) {
    mt_call one;
    mt_call_group(c, i, &one);
    size[n] = (int32_t)one.batch, rows[n] = (int32_t)one.n, n++;
    if (n < ENDS_RUNS && i + 1 < c->group_count)
      continue;
    st = mt_grouped_seg_ends(offs, seg, row, n, size, rows, (mt_stream)g->stream);
    for (int j = 0; j < n; j++)
      seg += size[j], row += size[j] * rows[j];
    n = 0;
  }
  return st;
}

/* The call's own memory beyond its workspace: a segment table (rows differing by group), or vLLM's
 * dispatch lists. */
static size_t extra_bytes(const mt_grouped_call *g, int64_t rows) {
  if (g->moe)
    return mt_moe_lists_bytes((int)rows, (int)g->groups, g->moe->weights != NULL);
  return g->group_rows ? (size_t)g->groups * 4 : 0;
}

/* Rows of all segments: 0 when they do not fit the engine's ints. */
static int64_t grouped_rows(const mt_grouped_call *g) {
  const int64_t rows = g->offs || g->group_rows || g->moe ? g->total_rows : g->groups * g->rows;
  if (rows <= 0 || rows > INT_MAX || g->n > INT_MAX || g->k > INT_MAX || g->groups > INT_MAX ||
      g->rows > INT_MAX)
    return 0;
  return rows;
}

/* A grouped call on the grouped engine: one activation quantization and one GEMM launch for all
 * its segments (kernels/engine.h, mt_gemm_grouped), a frozen store's refresh between them; else
 * the weights' store quantized for the call (and, rows differing by group, the segment table
 * written) first. */
static enum mt_reason run_grouped(const mt_spec *s, const mt_grouped_call *g, int capturing) {
  const int64_t rows = grouped_rows(g);
  if (!rows)
    return MT_R_LAYOUT;
  mt_wgroup_ref w = {.w = g->w,
                     .w_stride = g->w_stride,
                     .w_ptrs = g->w_ptrs,
                     .groups = (int)g->groups,
                     .n = (int)g->n,
                     .k = (int)g->k,
                     .in_out = g->w_in_out,
                     .ldw = (size_t)g->ldw,
                     .type = dtype_of(g->wtype),
                     .extra_bytes = extra_bytes(g, rows)};
  mt_numerics_from_spec(s, &w.num);
  mt_grouped_mem mem;
  enum mt_reason r = mt_wcache_prepare_grouped(&w, (int)rows, g->stream, capturing, &mem);
  if (r == MT_R_ROUTED && g->group_rows)
    r = mt_engine_reason(write_seg_ends(g, mem.extra));
  if (r != MT_R_ROUTED) {
    mt_wcache_release(&mem.hold);
    return r;
  }
  mt_moe_dispatch moe;
  if (g->moe) {
    moe = *g->moe;
    moe.lists = mt_moe_lists_at(mem.extra, (int)rows, (int)g->groups, g->moe->weights != NULL);
  }
  const int32_t *offs = g->moe ? moe.lists.offs : g->group_rows ? mem.extra : g->offs;
  if (g->w_stride) /* slices one a group: a frozen store's refresh covers those with rows */
    mem.refresh.offs = offs;
  mt_grouped_args a = {.nseg = (int)g->groups,
                       .n = (int)g->n,
                       .k = (int)g->k,
                       .w = &mem.store,
                       .offs = offs,
                       .m = (int)rows,
                       .seg_rows = offs ? 0 : (int)g->rows,
                       .x = g->x,
                       .ldx = (size_t)g->ldx,
                       .stride_x = g->x_stride,
                       .xtype = dtype_of(g->xtype),
                       .y = g->y,
                       .ldy = (size_t)g->ldy,
                       .stride_y = g->y_stride,
                       .ytype = dtype_of(g->ytype),
                       .c = g->c,
                       .ldc = (size_t)g->ldc,
                       .stride_c = g->c_stride,
                       .bias = g->bias,
                       .stride_bias = g->bias_stride,
                       .biastype = g->bias ? dtype_of(g->bias_type) : MT_DTYPE_BF16,
                       .alpha = g->alpha,
                       .beta = g->beta,
                       .workspace = mem.workspace,
                       .workspace_bytes = mem.workspace_bytes,
                       .x_ptrs = g->x_ptrs,
                       .y_ptrs = g->y_ptrs,
                       .c_ptrs = g->c_ptrs,
                       .refresh = mem.refresh.ws ? &mem.refresh : NULL,
                       .dispatch = g->moe ? &moe : NULL};
  int st = mt_gemm_grouped(&a, g->stream);
  if (st == MT_OK) {
    mt_devmem_ran(&mem.hold.mem);
    if (mt_instr_enabled())
      instrument_grouped(s, g, &a, capturing);
  }
  mt_wcache_release(&mem.hold);
  if (st != MT_OK && st != MT_ERR_CAPTURE)
    MT_WARN_ONCE("the NVFP4 engine could not run a routed grouped GEMM (%lld groups, n=%lld "
                 "k=%lld): %s; such calls fall back",
                 (long long)g->groups, (long long)g->n, (long long)g->k,
                 mt_status_name((enum mt_status)st));
  return mt_engine_reason(st);
}

static int stream_capturing(const mt_call *c) {
  const mt_driver *d = mt_driver_get();
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  if (!d || d->stream_is_capturing((CUstream)c->stream, &st) != CUDA_SUCCESS)
    return 1; /* an error here means a capture in global mode elsewhere: treat as capturing */
  return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

/* 1 (said once) when this process cannot run the engine: no driver, or forked after CUDA ran. */
static int no_engine(void) {
  if (mt_devmem_forked())
    return 1;
  if (mt_driver_get())
    return 0;
  MT_WARN_ONCE("no CUDA driver (libcuda.so.1) in this process: routed GEMMs run in cuBLAS "
               "(reason \"no engine\")");
  return 1;
}

/* The engine's state is the current context's: a call whose stream is another context's (said once)
 * goes to cuBLAS as it came. */
static int foreign_stream(mt_stream stream) {
  if (!mt_stream_foreign((CUstream)stream))
    return 0;
  MT_WARN_ONCE("a routed GEMM's stream belongs to a CUDA context other than the current one (the "
               "cuBLAS handle's device is not the current device): such calls run in cuBLAS "
               "(reason \"other context\"); make the stream's device current before the call");
  return 1;
}

enum mt_reason mt_exec_grouped(const mt_spec *s, const mt_grouped_call *g) {
  if (no_engine())
    return MT_R_NO_ENGINE;
  if (foreign_stream(g->stream))
    return MT_R_CONTEXT;
  return run_grouped(s, g, stream_capturing(g->call));
}

/* A call of several problems, or of groups whose sizes only the device knows. */
static int grouped_form(const mt_call *c) {
  return c->batch != 1 || c->pointer_arrays || c->group_count > 0 || c->ragged;
}

enum mt_reason mt_exec_routed(const mt_spec *s, mt_call *c, cublasStatus_t *status) {
  enum mt_reason r;
  mt_grouped_call g;
  if (no_engine()) {
    r = MT_R_NO_ENGINE;
  } else if (foreign_stream(c->stream)) {
    r = MT_R_CONTEXT;
  } else if (grouped_form(c)) {
    r = mt_norm_grouped(c, &g);
    if (r == MT_R_ROUTED)
      r = mt_exec_grouped(s, &g);
  } else {
    int bias = c->entry == MT_FN_cublasLtMatmul && c->epilogue == CUBLASLT_EPILOGUE_BIAS;
    operands o = {.w = c->a, .x = c->b, .c = c->c, .y = c->d, .bias = bias ? c->bias : NULL};
    r = run_problem(s, c, &o, c->alpha, c->beta, stream_capturing(c));
  }
  if (r == MT_R_ROUTED)
    *status = CUBLAS_STATUS_SUCCESS;
  return r;
}
