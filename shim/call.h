/* call.h — one GEMM call, whatever entry point it came through, in one record; and a routed
 * batched or grouped call in the engine's terms (mt_grouped_call).
 *
 * Dimensions are cuBLAS's column-major ones: C (m x n) = alpha * op(A) (m x k) * op(B) (k x n)
 * + beta * C. For a PyTorch F.linear (docs/design.md, "The call record"): m = output channels,
 * n = tokens, k = input channels, A = the weight (op T), B = the activations (op N).
 * torch._grouped_mm calls (shim/torch.c) are written in the same terms: A = mat_b's groups, B =
 * mat_a's, C = out's.
 *
 * The hooks fill the cheap part (entry, ops, dims, types, pointers: what the census and the
 * "does this involve a routed weight" test need); mt_norm_details() fills the rest (pointer mode,
 * stream, Lt epilogue, orders, batch attributes), and is called only for calls that involve a
 * routed weight, because for cuBLASLt each field costs a call into the library.
 */
#ifndef MT_CALL_H
#define MT_CALL_H

#include <stdint.h>

#include "kernels/engine.h"
#include "shim/real.h"

#define MT_OP_N 0 /* cublasOperation_t; T (1) and C (2) are the same for real types */
/* N, T or C (C the same as T for real types); any other value is cuBLAS's to refuse. */
static inline int mt_op_known(int op) { return op >= MT_OP_N && op <= 2; }

/* Which dimension of a grouped call differs between groups, its sizes on the device (the record
 * holds the total over the groups): torch._grouped_mm with offsets. */
enum mt_ragged { MT_RAGGED_NONE = 0, MT_RAGGED_M, MT_RAGGED_N, MT_RAGGED_K };

/* Which operands are device arrays of pointers (mt_call.pointer_arrays): all four in the cuBLAS
 * pointer-array forms; in cuBLASLt, each layout whose BATCH_MODE is POINTER_ARRAY. */
enum { MT_PA_A = 1, MT_PA_B = 2, MT_PA_C = 4, MT_PA_D = 8, MT_PA_ALL = 15 };

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
  int64_t batch; /* problems in the call: 1, batchCount, Lt's BATCH_COUNT, grouped_mm's groups */
  int64_t stride_a, stride_b, stride_c, stride_d; /* strided batch: elements between problems */
  int pointer_arrays;       /* MT_PA_* of the operands that are device arrays of pointers */
  int ragged;               /* enum mt_ragged */
  const int32_t *offs;      /* ragged: device int32[batch], each group's end in the ragged dim */
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
  int64_t bias_stride;                    /* Lt BIAS_BATCH_STRIDE: elements between problems */
  int order_a, order_b, order_c, order_d; /* cublasLtOrder_t; 0 (column) elsewhere */

  /* cublasGemmGroupedBatchedEx: host arrays of group_count entries, int or int64_t by wide */
  int64_t group_count;
  int wide;
  const void *g_transa, *g_transb, *g_m, *g_n, *g_k, *g_lda, *g_ldb, *g_ldc, *g_size;

  /* A launch of vLLM's fused_moe_kernel (shim/vllm.h): its dispatch, NULL elsewhere. The call is
   * then a grouped forward with its tokens (n: the kernel's num_valid_tokens) dispatched on the
   * device, ragged MT_RAGGED_N, batch the experts the weight may hold. */
  const mt_moe_dispatch *moe;

  int details;    /* mt_norm_details has filled its part */
  int details_ok; /* ... and could read everything (else: layout unknown) */
} mt_call;

/* A routed forward call of several problems in the engine's row-major terms (kernels/engine.h):
 * for each segment g in [0, groups), one expert,
 *
 *     y_g[rows_g][n] = (x_g[rows_g][k] . W_g[n][k]^T) * alpha + beta * c_g + bias_g
 *
 * with every W_g of the same n x k. Each operand is either strided from a base, or (pointer-array
 * forms) a DEVICE array of `groups` pointers, never read on the host. Element types are
 * cudaDataType values (CUDA_R_16BF, CUDA_R_16F; bias also CUDA_R_32F); strides and leading
 * dimensions are in elements. */
typedef struct {
  const mt_call *call; /* the call it came from (entry, handle, Lt descriptors, instruments) */
  int64_t groups;
  int64_t n, k;

  /* W_g = w + g * w_stride, n rows of k elements at row stride ldw (w_stride 0: one W for all);
   * or W_g = w_ptrs[g]. A torch 3-D weight [E][n][k] has w_stride = n * k, ldw = k. */
  const void *w;
  int64_t w_stride, ldw;
  const void *const *w_ptrs;
  int wtype;
  int w_in_out; /* each W_g stored [in][out], k rows of n at row stride ldw (mt_call_in_out) */

  /* Rows of segment g: `rows` each when offs is NULL; otherwise offs (device int32[groups], as
   * torch._grouped_mm gives them: the end of each segment, non-decreasing) puts segment g at rows
   * [g ? offs[g-1] : 0, offs[g]) of x and y, with total_rows rows allocated (offs[groups-1] <=
   * total_rows; rows past offs[groups-1] are not written). */
  int64_t rows;
  const int32_t *offs;
  int64_t total_rows;
  /* cublasGemmGroupedBatchedEx whose rows differ by group (rows 0, offs NULL): segment g is
   * problem g of the call's groups in order, with its group's rows (the call's host arrays),
   * total_rows their sum; x, y and c are then pointer arrays. */
  int group_rows;

  /* x_g = x + g * x_stride (offs: x + start_g * ldx), rows of k at row stride ldx; or x_ptrs[g]. */
  const void *x;
  int64_t x_stride, ldx;
  const void *const *x_ptrs;
  int xtype;

  /* y_g likewise (rows of n at row stride ldy); c_g, beta's operand, likewise (NULL when beta is
   * 0; may equal y). */
  void *y;
  int64_t y_stride, ldy;
  void *const *y_ptrs;
  int ytype;
  const void *c;
  int64_t c_stride, ldc;
  const void *const *c_ptrs;

  /* bias_g = bias + g * bias_stride, n elements of bias_type; NULL: none. */
  const void *bias;
  int64_t bias_stride;
  int bias_type;

  float alpha, beta; /* read from the host (the router routes host pointer mode only) */
  void *stream;      /* cudaStream_t */
  /* vLLM's dispatch (mt_call.moe): rows total_rows, offs NULL; the engine writes the segment
   * table and row lists (kernels/engine.h, mt_moe_dispatch) into the call's own memory */
  const mt_moe_dispatch *moe;
} mt_grouped_call;

/* The details of a call that involves a routed weight (see above). */
void mt_norm_details(mt_call *c);

/* Problem g of a grouped call, as a call of its own (dims, ops and lds of group g). */
void mt_call_group(const mt_call *grouped, int64_t g, mt_call *one);

/* A routed forward's weight is stored [in][out] (shim/router.h): A is not transposed (column-major
 * m x k, element (r, c) of the [out][in] weight at a[c * lda + r]). */
int mt_call_in_out(const mt_call *c);

#endif
