/* exec.c — a routed call on the NVFP4 engine (kernels/engine.h).
 *
 * A forward expert GEMM in cuBLAS's terms is TN: C[m][n] (column-major) = W^T x with W the A
 * operand (lda = W's row stride), x the B operand; in the engine's row-major terms that is
 * y[tokens = n][out = m] = x[n][k] . W[m][k]^T with the same strides. Each problem gets its
 * quantized weight and scratch from shim/wcache.c and runs on the call's stream with the call's
 * alpha, beta, C, output and (Lt) bias.
 *
 * Every launch of one problem is enqueued under its stream's scratch lease (shim/wcache.h): the
 * scratch is reused by the next call on that stream, so two threads on one stream must not
 * interleave their launches; threads on different streams run at once. Any failure before the
 * GEMM kernel is launched leaves the output untouched, and the hook forwards the call to cuBLAS
 * with the reason. Batched calls with beta != 0 are not routed: a failure after some problems ran
 * could not be undone, and cuBLAS would then read outputs the engine already overwrote. After the
 * GEMM, the sampled instruments of shim/instr.c are enqueued behind it, under the same lease (the
 * probe reuses the call's workspace and quantized weight).
 */
#include "shim/exec.h"

#include <limits.h>
#include <pthread.h>
#include <stdlib.h>

#include "kernels/driver.h"
#include "shim/instr.h"
#include "base/log.h"
#include "shim/wcache.h"

static enum mt_dtype dtype_of(int cuda_type) {
  return cuda_type == CUDA_R_16F   ? MT_DTYPE_FP16
         : cuda_type == CUDA_R_32F ? MT_DTYPE_FP32
                                   : MT_DTYPE_BF16;
}

static int fits_int(const mt_call *c) {
  return c->m <= INT_MAX && c->n <= INT_MAX && c->k <= INT_MAX;
}

/* One TN problem with its own A, B, C/D pointers and host scalars. */
static enum mt_reason run_problem(const mt_spec *s, const mt_call *c, const void *A, const void *B,
                                  const void *C, void *D, const float *alpha, const float *beta,
                                  int capturing) {
  if (!fits_int(c))
    return MT_R_LAYOUT;
  mt_weight_ref w = {
      .w = A, .n = (int)c->m, .k = (int)c->k, .ldw = (size_t)c->lda, .type = dtype_of(c->atype)};
  mt_numerics_from_spec(s, &w.num);
  mt_engine_mem mem;
  enum mt_reason r = mt_wcache_prepare(&w, (int)c->n, c->stream, capturing, &mem);
  if (r != MT_R_ROUTED) {
    mt_wcache_release(&mem);
    return r;
  }
  int bias = c->entry == MT_FN_cublasLtMatmul && c->epilogue == CUBLASLT_EPILOGUE_BIAS;
  mt_gemm_args a = {
      .m = (int)c->n,
      .n = (int)c->m,
      .k = (int)c->k,
      .x = B,
      .ldx = (size_t)c->ldb,
      .xtype = dtype_of(c->btype),
      .w = mem.q,
      .y = D,
      .ldy = (size_t)c->ldd,
      .ytype = dtype_of(c->dtype),
      .c = C,
      .ldc = (size_t)c->ldc,
      .bias = bias ? c->bias : NULL,
      .biastype = !bias || c->bias_type == -1 ? dtype_of(c->dtype) : dtype_of(c->bias_type),
      .alpha = *alpha,
      .beta = *beta,
      .workspace = mem.workspace,
      .workspace_bytes = mem.workspace_bytes,
  };
  int st = mt_gemm(&a, c->stream);
  if (st == MT_OK && mt_instr_enabled()) {
    mt_instr_call ic;
    mt_instr_from_call(s, c, alpha, beta, &ic);
    ic.engine = &a;
    ic.frozen_sum = mem.wsum;
    ic.w = A, ic.x = B, ic.y = D;
    ic.capturing = capturing;
    mt_instr_after(&ic);
  }
  mt_wcache_release(&mem);
  if (st != MT_OK && st != MT_ERR_CAPTURE)
    MT_WARN_ONCE("the NVFP4 engine could not run a routed GEMM (m=%lld n=%lld k=%lld): %s; such "
                 "calls fall back to cuBLAS",
                 (long long)c->m, (long long)c->n, (long long)c->k,
                 mt_status_name((enum mt_status)st));
  return mt_engine_reason(st);
}

static const char *advance(const void *p, int64_t elems) { return (const char *)p + 2 * elems; }

/* cublasGemmStridedBatchedEx: problem i at A + i strideA, and so on (strideA 0 shares W). */
static enum mt_reason run_strided(const mt_spec *s, const mt_call *c, int capturing) {
  const float *alpha = c->alpha, *beta = c->beta;
  if (c->batch > 1 && *beta != 0.0f)
    return MT_R_LAYOUT;
  for (int64_t i = 0; i < c->batch; i++) {
    enum mt_reason r = run_problem(s, c, advance(c->a, i * c->stride_a),
                                   advance(c->b, i * c->stride_b), advance(c->c, i * c->stride_c),
                                   (void *)advance(c->d, i * c->stride_d), alpha, beta, capturing);
    if (r != MT_R_ROUTED) {
      if (i)
        MT_WARN_ONCE("a batched GEMM failed after %lld of its problems ran on the engine",
                     (long long)i);
      return r;
    }
  }
  return MT_R_ROUTED;
}

/* The device arrays of A, B and C pointers of a call with `count` problems, copied to the host:
 * a read-back, so it waits for the stream and is refused while capturing. */
static enum mt_reason read_pointers(const mt_call *c, int64_t count, int capturing, void ***out) {
  const mt_driver *d = mt_driver_get();
  if (!d)
    return MT_R_NO_ENGINE;
  if (capturing)
    return MT_R_CAPTURE;
  void **p = malloc(3 * (size_t)count * sizeof *p);
  if (!p)
    return MT_R_NOMEM;
  const void *arrays[3] = {c->a, c->b, c->c};
  for (int i = 0; i < 3; i++)
    if (d->memcpy_dtoh_async(p + i * count, (CUdeviceptr)arrays[i], (size_t)count * sizeof *p,
                             (CUstream)c->stream) != CUDA_SUCCESS) {
      free(p);
      return MT_R_ENGINE;
    }
  if (d->stream_synchronize((CUstream)c->stream) != CUDA_SUCCESS) {
    free(p);
    return MT_R_ENGINE;
  }
  *out = p;
  return MT_R_ROUTED;
}

/* Group g of a call with device arrays of pointers: its dims, and its host alpha and beta (one
 * per group in a grouped call; a batched call is one group). */
static void group_of(const mt_call *c, int64_t g, mt_call *one, const float **alpha,
                     const float **beta) {
  if (c->group_count > 0) {
    mt_call_group(c, g, one);
    *alpha = (const float *)c->alpha + g;
    *beta = (const float *)c->beta + g;
  } else {
    *one = *c;
    *alpha = c->alpha;
    *beta = c->beta;
  }
}

/* cublasGemmBatchedEx and cublasGemmGroupedBatchedEx: device arrays of pointers, and (grouped)
 * host arrays of shapes and scalars, one per group. */
static enum mt_reason run_arrays(const mt_spec *s, mt_call *c, int capturing) {
  int64_t groups = c->group_count > 0 ? c->group_count : 1, count = 0;
  int reads_c = 0; /* across the whole call: a problem of any group may fail after others ran */
  mt_call one;
  const float *alpha, *beta;
  for (int64_t g = 0; g < groups; g++) {
    group_of(c, g, &one, &alpha, &beta);
    reads_c |= one.batch > 0 && *beta != 0.0f;
    count += one.batch;
  }
  if (count > 1 && reads_c)
    return MT_R_LAYOUT;
  void **p;
  enum mt_reason r = read_pointers(c, count, capturing, &p);
  if (r != MT_R_ROUTED)
    return r;
  int64_t at = 0;
  for (int64_t g = 0; g < groups && r == MT_R_ROUTED; g++) {
    group_of(c, g, &one, &alpha, &beta);
    for (int64_t i = 0; i < one.batch && r == MT_R_ROUTED; i++, at++)
      r = run_problem(s, &one, p[at], p[count + at], p[2 * count + at], p[2 * count + at], alpha,
                      beta, capturing);
  }
  free(p);
  return r;
}

static int stream_capturing(const mt_call *c) {
  const mt_driver *d = mt_driver_get();
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  if (!d || d->stream_is_capturing((CUstream)c->stream, &st) != CUDA_SUCCESS)
    return 1; /* an error here means a capture in global mode elsewhere: treat as capturing */
  return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

enum mt_reason mt_exec_routed(const mt_spec *s, mt_call *c, cublasStatus_t *status) {
  if (mt_wcache_forked())
    return MT_R_NO_ENGINE;
  if (!mt_driver_get()) {
    MT_WARN_ONCE("no CUDA driver (libcuda.so.1) in this process: routed GEMMs run in cuBLAS "
                 "(reason \"no engine\")");
    return MT_R_NO_ENGINE;
  }
  int capturing = stream_capturing(c);
  enum mt_reason r;
  switch (c->entry) {
  case MT_FN_cublasGemmStridedBatchedEx:
  case MT_FN_cublasGemmStridedBatchedEx_64:
    r = run_strided(s, c, capturing);
    break;
  case MT_FN_cublasGemmBatchedEx:
  case MT_FN_cublasGemmBatchedEx_64:
  case MT_FN_cublasGemmGroupedBatchedEx:
  case MT_FN_cublasGemmGroupedBatchedEx_64:
    r = run_arrays(s, c, capturing);
    break;
  default: /* cublasGemmEx, its _64 form, cublasLtMatmul: one problem */
    r = run_problem(s, c, c->a, c->b, c->c, c->d, c->alpha, c->beta, capturing);
  }
  if (r == MT_R_ROUTED)
    *status = CUBLAS_STATUS_SUCCESS;
  return r;
}
