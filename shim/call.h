/* call.h — one GEMM call, whatever entry point it came through, in one record.
 *
 * Dimensions are cuBLAS's column-major ones: C (m x n) = alpha * op(A) (m x k) * op(B) (k x n)
 * + beta * C. For a PyTorch F.linear (docs/design.md, "The call record"): m = output channels,
 * n = tokens, k = input channels, A = the weight (op T), B = the activations (op N).
 *
 * The hooks fill the cheap part (entry, ops, dims, types, pointers: what the census and the
 * "does this involve a routed weight" test need); mt_norm_details() fills the rest (pointer mode,
 * stream, Lt epilogue, orders, batch attributes), and is called only for calls that involve a
 * routed weight, because for cuBLASLt each field costs a call into the library.
 */
#ifndef MT_CALL_H
#define MT_CALL_H

#include <stdint.h>

#include "shim/real.h"

#define MT_OP_N 0 /* cublasOperation_t; T (1) and C (2) are the same for real types */

enum mt_ptr_mode {
  MT_PTR_UNKNOWN = -1,
  MT_PTR_HOST = 0,
  MT_PTR_DEVICE = 1 /* or any vector mode */
};

typedef struct {
  enum mt_fn entry;
  int transa, transb; /* cublasOperation_t values */
  int64_t m, n, k;
  int atype, btype, ctype, dtype; /* cudaDataType values; dtype is Lt's D (== ctype elsewhere) */
  int compute;           /* cublasComputeType_t, or the legacy cudaDataType PyTorch passes */
  int scale_type;        /* Lt's scale type; -1 elsewhere */
  const void *a, *b, *c; /* data, or device arrays of pointers when pointer_arrays */
  void *d;               /* output (== c except in Lt) */
  int64_t lda, ldb, ldc, ldd;
  int64_t batch; /* problems in the call: 1, batchCount, or Lt's BATCH_COUNT */
  int64_t stride_a, stride_b, stride_c, stride_d; /* strided batch: elements between problems */
  int pointer_arrays;       /* A/B/C are device arrays of pointers (BatchedEx, Lt POINTER_ARRAY) */
  int algo;                 /* cublasGemmAlgo_t (cuBLAS entry points) */
  const void *alpha, *beta; /* host or device, by ptr_mode */
  int ptr_mode;             /* enum mt_ptr_mode; the Lt value itself when > 1 */
  void *handle;             /* cublasHandle_t or cublasLtHandle_t */
  void *stream;             /* cudaStream_t; read with the details */
  int device;               /* -1: not read (the shim makes no CUDA call for it yet) */

  /* cublasLtMatmul only */
  void *lt_desc, *lt_adesc, *lt_bdesc, *lt_cdesc, *lt_ddesc;
  const void *lt_algo;
  void *workspace;
  uint64_t workspace_bytes;
  uint32_t epilogue; /* cublasLtEpilogue_t; 1 (DEFAULT) elsewhere */
  const void *bias;
  int bias_type;                          /* cudaDataType; -1: the default (the output type) */
  int order_a, order_b, order_c, order_d; /* cublasLtOrder_t; 0 (column) elsewhere */

  /* cublasGemmGroupedBatchedEx: host arrays of group_count entries, int or int64_t by wide */
  int64_t group_count;
  int wide;
  const void *g_transa, *g_transb, *g_m, *g_n, *g_k, *g_lda, *g_ldb, *g_ldc, *g_size;

  int details;    /* mt_norm_details has filled its part */
  int details_ok; /* ... and could read everything (else: layout unknown) */
} mt_call;

/* The details of a call that involves a routed weight (see above). */
void mt_norm_details(mt_call *c);

/* Problem g of a grouped call, as a call of its own (dims, ops and lds of group g). */
void mt_call_group(const mt_call *grouped, int64_t g, mt_call *one);

#endif
