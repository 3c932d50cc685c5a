/* norm.c — the call record from each entry point's arguments; Lt fields read through the real
 * cublasLt*GetAttribute functions, the expensive ones only on request (mt_norm_details). */
#include "shim/norm.h"

#include <string.h>

static void gemm_common(mt_call *c, enum mt_fn entry, cublasHandle_t handle, int transa, int transb,
                        int64_t m, int64_t n, int64_t k, const void *alpha, const void *a,
                        int atype, int64_t lda, const void *b, int btype, int64_t ldb,
                        const void *beta, void *cc, int ctype, int64_t ldc, int compute, int algo) {
  *c = (mt_call){
      .entry = entry,
      .transa = transa,
      .transb = transb,
      .m = m,
      .n = n,
      .k = k,
      .atype = atype,
      .btype = btype,
      .ctype = ctype,
      .dtype = ctype,
      .compute = compute,
      .scale_type = -1,
      .a = a,
      .b = b,
      .c = cc,
      .d = cc,
      .lda = lda,
      .ldb = ldb,
      .ldc = ldc,
      .ldd = ldc,
      .batch = 1,
      .algo = algo,
      .alpha = alpha,
      .beta = beta,
      .ptr_mode = MT_PTR_UNKNOWN,
      .handle = handle,
      .device = -1,
      .epilogue = CUBLASLT_EPILOGUE_DEFAULT,
      .bias_type = -1,
  };
}

void mt_norm_cublasGemmEx(mt_call *call, cublasHandle_t handle, cublasOperation_t transa,
                          cublasOperation_t transb, int m, int n, int k, const void *alpha,
                          const void *A, cudaDataType Atype, int lda, const void *B,
                          cudaDataType Btype, int ldb, const void *beta, void *C,
                          cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                          cublasGemmAlgo_t algo) {
  gemm_common(call, MT_FN_cublasGemmEx, handle, transa, transb, m, n, k, alpha, A, Atype, lda, B,
              Btype, ldb, beta, C, Ctype, ldc, computeType, algo);
}

void mt_norm_cublasGemmEx_64(mt_call *call, cublasHandle_t handle, cublasOperation_t transa,
                             cublasOperation_t transb, int64_t m, int64_t n, int64_t k,
                             const void *alpha, const void *A, cudaDataType Atype, int64_t lda,
                             const void *B, cudaDataType Btype, int64_t ldb, const void *beta,
                             void *C, cudaDataType Ctype, int64_t ldc,
                             cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  gemm_common(call, MT_FN_cublasGemmEx_64, handle, transa, transb, m, n, k, alpha, A, Atype, lda, B,
              Btype, ldb, beta, C, Ctype, ldc, computeType, algo);
}

void mt_norm_cublasGemmStridedBatchedEx(
    mt_call *call, cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m,
    int n, int k, const void *alpha, const void *A, cudaDataType Atype, int lda,
    long long int strideA, const void *B, cudaDataType Btype, int ldb, long long int strideB,
    const void *beta, void *C, cudaDataType Ctype, int ldc, long long int strideC, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  gemm_common(call, MT_FN_cublasGemmStridedBatchedEx, handle, transa, transb, m, n, k, alpha, A,
              Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc, computeType, algo);
  call->batch = batchCount;
  call->stride_a = strideA, call->stride_b = strideB, call->stride_c = call->stride_d = strideC;
}

void mt_norm_cublasGemmStridedBatchedEx_64(mt_call *call, cublasHandle_t handle,
                                           cublasOperation_t transa, cublasOperation_t transb,
                                           int64_t m, int64_t n, int64_t k, const void *alpha,
                                           const void *A, cudaDataType Atype, int64_t lda,
                                           long long int strideA, const void *B, cudaDataType Btype,
                                           int64_t ldb, long long int strideB, const void *beta,
                                           void *C, cudaDataType Ctype, int64_t ldc,
                                           long long int strideC, int64_t batchCount,
                                           cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  gemm_common(call, MT_FN_cublasGemmStridedBatchedEx_64, handle, transa, transb, m, n, k, alpha, A,
              Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc, computeType, algo);
  call->batch = batchCount;
  call->stride_a = strideA, call->stride_b = strideB, call->stride_c = call->stride_d = strideC;
}

void mt_norm_cublasGemmBatchedEx(mt_call *call, cublasHandle_t handle, cublasOperation_t transa,
                                 cublasOperation_t transb, int m, int n, int k, const void *alpha,
                                 const void *const Aarray[], cudaDataType Atype, int lda,
                                 const void *const Barray[], cudaDataType Btype, int ldb,
                                 const void *beta, void *const Carray[], cudaDataType Ctype,
                                 int ldc, int batchCount, cublasComputeType_t computeType,
                                 cublasGemmAlgo_t algo) {
  gemm_common(call, MT_FN_cublasGemmBatchedEx, handle, transa, transb, m, n, k, alpha, Aarray,
              Atype, lda, Barray, Btype, ldb, beta, (void *)Carray, Ctype, ldc, computeType, algo);
  call->batch = batchCount;
  call->pointer_arrays = MT_PA_ALL;
}

void mt_norm_cublasGemmBatchedEx_64(mt_call *call, cublasHandle_t handle, cublasOperation_t transa,
                                    cublasOperation_t transb, int64_t m, int64_t n, int64_t k,
                                    const void *alpha, const void *const Aarray[],
                                    cudaDataType Atype, int64_t lda, const void *const Barray[],
                                    cudaDataType Btype, int64_t ldb, const void *beta,
                                    void *const Carray[], cudaDataType Ctype, int64_t ldc,
                                    int64_t batchCount, cublasComputeType_t computeType,
                                    cublasGemmAlgo_t algo) {
  gemm_common(call, MT_FN_cublasGemmBatchedEx_64, handle, transa, transb, m, n, k, alpha, Aarray,
              Atype, lda, Barray, Btype, ldb, beta, (void *)Carray, Ctype, ldc, computeType, algo);
  call->batch = batchCount;
  call->pointer_arrays = MT_PA_ALL;
}

static void grouped_common(mt_call *c, enum mt_fn entry, cublasHandle_t handle, int wide,
                           const void *ta, const void *tb, const void *m, const void *n,
                           const void *k, const void *alpha, const void *a, int atype,
                           const void *lda, const void *b, int btype, const void *ldb,
                           const void *beta, void *cc, int ctype, const void *ldc,
                           int64_t group_count, const void *group_size, int compute) {
  gemm_common(c, entry, handle, 0, 0, 0, 0, 0, alpha, a, atype, 0, b, btype, 0, beta, cc, ctype, 0,
              compute, -1);
  c->pointer_arrays = MT_PA_ALL;
  c->wide = wide;
  c->group_count = group_count;
  c->g_transa = ta, c->g_transb = tb, c->g_m = m, c->g_n = n, c->g_k = k;
  c->g_lda = lda, c->g_ldb = ldb, c->g_ldc = ldc, c->g_size = group_size;
  c->batch = 0;
}

void mt_norm_cublasGemmGroupedBatchedEx(
    mt_call *call, cublasHandle_t handle, const cublasOperation_t transa_array[],
    const cublasOperation_t transb_array[], const int m_array[], const int n_array[],
    const int k_array[], const void *alpha_array, const void *const Aarray[], cudaDataType_t Atype,
    const int lda_array[], const void *const Barray[], cudaDataType_t Btype, const int ldb_array[],
    const void *beta_array, void *const Carray[], cudaDataType_t Ctype, const int ldc_array[],
    int group_count, const int group_size[], cublasComputeType_t computeType) {
  grouped_common(call, MT_FN_cublasGemmGroupedBatchedEx, handle, 0, transa_array, transb_array,
                 m_array, n_array, k_array, alpha_array, Aarray, Atype, lda_array, Barray, Btype,
                 ldb_array, beta_array, (void *)Carray, Ctype, ldc_array, group_count, group_size,
                 computeType);
}

void mt_norm_cublasGemmGroupedBatchedEx_64(
    mt_call *call, cublasHandle_t handle, const cublasOperation_t transa_array[],
    const cublasOperation_t transb_array[], const int64_t m_array[], const int64_t n_array[],
    const int64_t k_array[], const void *alpha_array, const void *const Aarray[],
    cudaDataType_t Atype, const int64_t lda_array[], const void *const Barray[],
    cudaDataType_t Btype, const int64_t ldb_array[], const void *beta_array, void *const Carray[],
    cudaDataType_t Ctype, const int64_t ldc_array[], int64_t group_count,
    const int64_t group_size[], cublasComputeType_t computeType) {
  grouped_common(call, MT_FN_cublasGemmGroupedBatchedEx_64, handle, 1, transa_array, transb_array,
                 m_array, n_array, k_array, alpha_array, Aarray, Atype, lda_array, Barray, Btype,
                 ldb_array, beta_array, (void *)Carray, Ctype, ldc_array, group_count, group_size,
                 computeType);
}

static int64_t group_int(const mt_call *c, const void *array, int64_t g) {
  return c->wide ? ((const int64_t *)array)[g] : ((const int *)array)[g];
}

void mt_call_group(const mt_call *grouped, int64_t g, mt_call *one) {
  *one = *grouped;
  one->transa = ((const cublasOperation_t *)grouped->g_transa)[g];
  one->transb = ((const cublasOperation_t *)grouped->g_transb)[g];
  one->m = group_int(grouped, grouped->g_m, g);
  one->n = group_int(grouped, grouped->g_n, g);
  one->k = group_int(grouped, grouped->g_k, g);
  one->lda = group_int(grouped, grouped->g_lda, g);
  one->ldb = group_int(grouped, grouped->g_ldb, g);
  one->ldc = one->ldd = group_int(grouped, grouped->g_ldc, g);
  one->batch = group_int(grouped, grouped->g_size, g);
  one->group_count = 0;
}

/* --- cublasLtMatmul ---------------------------------------------------------------------- */

/* An attribute of exactly `size` bytes, or -1: a size mismatch means the library disagrees with
 * the header we were built against, and then nothing read from it can be trusted. */
static int desc_get(const mt_call *c, cublasLtMatmulDescAttributes_t attr, void *buf, size_t size) {
  mt_fn_cublasLtMatmulDescGetAttribute get = MT_REAL_FN(cublasLtMatmulDescGetAttribute);
  size_t written = 0;
  if (!get || get(c->lt_desc, attr, buf, size, &written) != CUBLAS_STATUS_SUCCESS ||
      written != size)
    return -1;
  return 0;
}

static int layout_get(void *layout, cublasLtMatrixLayoutAttribute_t attr, void *buf, size_t size) {
  mt_fn_cublasLtMatrixLayoutGetAttribute get = MT_REAL_FN(cublasLtMatrixLayoutGetAttribute);
  size_t written = 0;
  if (!get || get(layout, attr, buf, size, &written) != CUBLAS_STATUS_SUCCESS || written != size)
    return -1;
  return 0;
}

/* An operand in row order is the same memory as the column-order transpose with the same leading
 * dimension (rows x cols row-major, ld >= cols == cols x rows column-major): fold the order into
 * the op, so that an XLA call (row-major A, op N: the weight [out][in] as PyTorch holds it) reads
 * as the TN call the routes name. Other orders (COL32, ...) stay, for the layout check to
 * refuse. */
static int fold_order(int32_t op, int32_t order, int *order_out) {
  if (order != CUBLASLT_ORDER_ROW) {
    *order_out = order;
    return op;
  }
  *order_out = CUBLASLT_ORDER_COL;
  return op == MT_OP_N ? 1 : MT_OP_N; /* N <-> T (C is T for real types) */
}

void mt_norm_cublasLtMatmul(mt_call *call, cublasLtHandle_t lightHandle,
                            cublasLtMatmulDesc_t computeDesc, const void *alpha, const void *A,
                            cublasLtMatrixLayout_t Adesc, const void *B,
                            cublasLtMatrixLayout_t Bdesc, const void *beta, const void *C,
                            cublasLtMatrixLayout_t Cdesc, void *D, cublasLtMatrixLayout_t Ddesc,
                            const cublasLtMatmulAlgo_t *algo, void *workspace,
                            size_t workspaceSizeInBytes, cudaStream_t stream) {
  mt_call *c = call;
  *c = (mt_call){
      .entry = MT_FN_cublasLtMatmul,
      .m = -1,
      .n = -1,
      .k = -1,
      .atype = -1,
      .btype = -1,
      .ctype = -1,
      .dtype = -1,
      .compute = -1,
      .scale_type = -1,
      .a = A,
      .b = B,
      .c = C,
      .d = D,
      .batch = 1,
      .algo = -1,
      .alpha = alpha,
      .beta = beta,
      .ptr_mode = MT_PTR_UNKNOWN,
      .handle = lightHandle,
      .stream = stream,
      .device = -1,
      .lt_desc = computeDesc,
      .lt_adesc = Adesc,
      .lt_bdesc = Bdesc,
      .lt_cdesc = Cdesc,
      .lt_ddesc = Ddesc,
      .lt_algo = algo,
      .workspace = workspace,
      .workspace_bytes = workspaceSizeInBytes,
      .epilogue = CUBLASLT_EPILOGUE_DEFAULT,
      .bias_type = -1,
  };
  /* The census needs ops, dims, types, the batch and A's and B's orders: twelve attribute reads.
   * A failed read leaves m = -1, which no route matches, so the call is only counted. */
  int32_t ta, tb, batch, aorder, border;
  uint32_t at, bt, dt;
  uint64_t arows, acols, drows, dcols;
  if (desc_get(c, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta) ||
      desc_get(c, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) ||
      layout_get(Adesc, CUBLASLT_MATRIX_LAYOUT_TYPE, &at, sizeof at) ||
      layout_get(Adesc, CUBLASLT_MATRIX_LAYOUT_ROWS, &arows, sizeof arows) ||
      layout_get(Adesc, CUBLASLT_MATRIX_LAYOUT_COLS, &acols, sizeof acols) ||
      layout_get(Adesc, CUBLASLT_MATRIX_LAYOUT_ORDER, &aorder, sizeof aorder) ||
      layout_get(Bdesc, CUBLASLT_MATRIX_LAYOUT_TYPE, &bt, sizeof bt) ||
      layout_get(Bdesc, CUBLASLT_MATRIX_LAYOUT_ORDER, &border, sizeof border) ||
      layout_get(Ddesc, CUBLASLT_MATRIX_LAYOUT_TYPE, &dt, sizeof dt) ||
      layout_get(Ddesc, CUBLASLT_MATRIX_LAYOUT_ROWS, &drows, sizeof drows) ||
      layout_get(Ddesc, CUBLASLT_MATRIX_LAYOUT_COLS, &dcols, sizeof dcols) ||
      layout_get(Ddesc, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch))
    return;
  /* op(A) is m x k: an A whose other dimension is not D's rows is cuBLASLt's to refuse (k = -1
   * matches no route) */
  c->k = (ta != MT_OP_N ? acols : arows) == drows ? (int64_t)(ta != MT_OP_N ? arows : acols) : -1;
  c->transa = fold_order(ta, aorder, &c->order_a);
  c->transb = fold_order(tb, border, &c->order_b);
  c->batch = batch;
  c->atype = (int)at, c->btype = (int)bt, c->dtype = c->ctype = (int)dt;
  c->m = (int64_t)drows, c->n = (int64_t)dcols;
}

/* Order, leading dimension and batch of one Lt layout; 0 or -1. The batch count must be D's (read
 * with the census): cuBLASLt's batches do not broadcast an operand. */
static int lt_layout_details(const mt_call *c, void *layout, int *order, int64_t *ld,
                             int64_t *stride, int *pointer_array, int operand, int folded) {
  int32_t ord, count;
  uint32_t mode = CUBLASLT_BATCH_MODE_STRIDED;
  if (layout_get(layout, CUBLASLT_MATRIX_LAYOUT_ORDER, &ord, sizeof ord) ||
      layout_get(layout, CUBLASLT_MATRIX_LAYOUT_LD, ld, sizeof *ld) ||
      layout_get(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count) ||
      count != c->batch)
    return -1;
  *stride = 0; /* meaningless for one problem: not read, one library call fewer */
  if (count > 1 &&
      layout_get(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, stride, sizeof *stride))
    return -1;
  /* BATCH_MODE is recent (pointer-array batches); a cuBLASLt without it only has strided ones. */
  if (layout_get(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof mode))
    mode = CUBLASLT_BATCH_MODE_STRIDED;
  if (!folded) /* A's and B's were read with the census, a row order folded into the op */
    *order = ord;
  if (mode == CUBLASLT_BATCH_MODE_POINTER_ARRAY)
    *pointer_array |= operand;
  return 0;
}

/* op(B) is k x n and C is m x n, as D: cuBLASLt refuses other shapes (the engine would read past
 * them), and a NULL handle. 0 or -1. */
static int lt_shapes_ok(const mt_call *c) {
  int32_t tb;
  uint64_t brows, bcols, crows, ccols;
  if (!c->handle || desc_get(c, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb) ||
      layout_get(c->lt_bdesc, CUBLASLT_MATRIX_LAYOUT_ROWS, &brows, sizeof brows) ||
      layout_get(c->lt_bdesc, CUBLASLT_MATRIX_LAYOUT_COLS, &bcols, sizeof bcols) ||
      layout_get(c->lt_cdesc, CUBLASLT_MATRIX_LAYOUT_ROWS, &crows, sizeof crows) ||
      layout_get(c->lt_cdesc, CUBLASLT_MATRIX_LAYOUT_COLS, &ccols, sizeof ccols))
    return -1;
  const uint64_t k = (uint64_t)c->k, m = (uint64_t)c->m, n = (uint64_t)c->n;
  int ok = (tb != MT_OP_N ? bcols : brows) == k && (tb != MT_OP_N ? brows : bcols) == n &&
           crows == m && ccols == n;
  return ok ? 0 : -1;
}

static int lt_details(mt_call *c) {
  int32_t compute, scale, ptr_mode, bias_type;
  uint32_t epilogue, ctype;
  const void *bias;
  if (desc_get(c, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, &compute, sizeof compute) ||
      desc_get(c, CUBLASLT_MATMUL_DESC_SCALE_TYPE, &scale, sizeof scale) ||
      desc_get(c, CUBLASLT_MATMUL_DESC_POINTER_MODE, &ptr_mode, sizeof ptr_mode) ||
      desc_get(c, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue) ||
      desc_get(c, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias) ||
      desc_get(c, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type) ||
      layout_get(c->lt_cdesc, CUBLASLT_MATRIX_LAYOUT_TYPE, &ctype, sizeof ctype))
    return -1;
  c->compute = compute, c->scale_type = scale, c->ptr_mode = ptr_mode;
  c->epilogue = epilogue, c->bias = bias, c->bias_type = bias_type, c->ctype = (int)ctype;
  if (c->batch > 1 && epilogue == CUBLASLT_EPILOGUE_BIAS &&
      desc_get(c, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &c->bias_stride, sizeof c->bias_stride))
    return -1;
  int *pa = &c->pointer_arrays;
  if (lt_layout_details(c, c->lt_adesc, &c->order_a, &c->lda, &c->stride_a, pa, MT_PA_A, 1) ||
      lt_layout_details(c, c->lt_bdesc, &c->order_b, &c->ldb, &c->stride_b, pa, MT_PA_B, 1) ||
      lt_layout_details(c, c->lt_cdesc, &c->order_c, &c->ldc, &c->stride_c, pa, MT_PA_C, 0) ||
      lt_layout_details(c, c->lt_ddesc, &c->order_d, &c->ldd, &c->stride_d, pa, MT_PA_D, 0))
    return -1;
  return lt_shapes_ok(c);
}

/* For the cuBLAS entry points the pointer mode and stream live in the handle. */
static int handle_details(mt_call *c) {
  mt_fn_cublasGetPointerMode_v2 get_mode = MT_REAL_FN(cublasGetPointerMode_v2);
  mt_fn_cublasGetStream_v2 get_stream = MT_REAL_FN(cublasGetStream_v2);
  cublasPointerMode_t mode;
  cudaStream_t stream;
  if (!get_mode || !get_stream || get_mode(c->handle, &mode) != CUBLAS_STATUS_SUCCESS ||
      get_stream(c->handle, &stream) != CUBLAS_STATUS_SUCCESS)
    return -1;
  c->ptr_mode = mode;
  c->stream = stream;
  return 0;
}

int mt_call_in_out(const mt_call *c) { return c->transa == MT_OP_N; }

void mt_norm_details(mt_call *c) {
  if (c->details)
    return;
  c->details = 1;
  c->details_ok = (c->entry == MT_FN_cublasLtMatmul ? lt_details(c) : handle_details(c)) == 0;
}

/* --- a routed call of several problems as one grouped record -------------------------------- */

/* Pointer arrays the grouped engine takes: none, or A, B and D (and C when beta reads it). A
 * cuBLASLt call mixing strided and pointer-array layouts is not. */
static int arrays_ok(const mt_call *c, float beta) {
  const int abd = MT_PA_A | MT_PA_B | MT_PA_D, pa = c->pointer_arrays;
  if (!pa)
    return 1;
  /* an Lt bias of pointer-array batches: not taken */
  return (pa & abd) == abd && (beta == 0.0f || (pa & MT_PA_C)) &&
         c->epilogue != CUBLASLT_EPILOGUE_BIAS;
}

static void grouped_record(const mt_call *c, const mt_call *dims, mt_grouped_call *g) {
  float beta = *(const float *)dims->beta;
  int bias = dims->epilogue == CUBLASLT_EPILOGUE_BIAS;
  int ragged = dims->ragged == MT_RAGGED_N;
  *g = (mt_grouped_call){
      .call = c,
      .groups = dims->batch,
      .n = dims->m,
      .k = dims->k,
      .w = dims->a,
      .w_stride = dims->stride_a,
      .ldw = dims->lda,
      .wtype = dims->atype,
      .w_in_out = mt_call_in_out(dims),
      .rows = ragged ? 0 : dims->n,
      .offs = ragged ? dims->offs : NULL,
      .total_rows = ragged ? dims->n : 0,
      .x = dims->b,
      .x_stride = dims->stride_b,
      .ldx = dims->ldb,
      .xtype = dims->btype,
      .y = dims->d,
      .y_stride = dims->stride_d,
      .ldy = dims->ldd,
      .ytype = dims->dtype,
      .c = beta != 0.0f ? dims->c : NULL,
      .c_stride = dims->stride_c,
      .ldc = dims->ldc,
      .bias = bias ? dims->bias : NULL,
      .bias_stride = bias ? dims->bias_stride : 0,
      .bias_type = dims->bias_type == -1 ? dims->dtype : dims->bias_type,
      .alpha = *(const float *)dims->alpha,
      .beta = beta,
      .stream = dims->stream,
      .moe = dims->moe,
  };
  if (dims->pointer_arrays) {
    g->w_ptrs = (const void *const *)g->w, g->x_ptrs = (const void *const *)g->x;
    g->y_ptrs = (void *const *)g->y, g->c_ptrs = (const void *const *)g->c;
    g->w = g->x = g->c = NULL, g->y = NULL;
  }
}

/* Group i of a cublasGemmGroupedBatchedEx against the first: the same weight shape, leading
 * dimensions, ops and scalars (the router checked each group alone, not that they agree). */
static int same_group(const mt_call *c, const mt_call *first, const mt_call *one, int64_t i) {
  const float *alpha = c->alpha, *beta = c->beta;
  return one->transa == first->transa && one->transb == first->transb && one->m == first->m &&
         one->k == first->k && one->lda == first->lda && one->ldb == first->ldb &&
         one->ldc == first->ldc && alpha[i] == alpha[0] && beta[i] == beta[0] && one->batch >= 0;
}

/* cublasGemmGroupedBatchedEx as one record: every problem one segment, in order; the rows
 * (cuBLAS's n) may differ by group. */
static enum mt_reason grouped_batched(const mt_call *c, mt_grouped_call *g) {
  mt_call first, one;
  int64_t problems = 0, total = 0, rows = -1;
  int same_rows = 1;
  mt_call_group(c, 0, &first);
  for (int64_t i = 0; i < c->group_count; i++) {
    mt_call_group(c, i, &one);
    if (!same_group(c, &first, &one, i))
      return MT_R_PTR_ARRAYS;
    if (one.batch == 0)
      continue;
    if (rows >= 0 && one.n != rows)
      same_rows = 0;
    rows = one.n;
    int64_t group_rows;
    if (__builtin_mul_overflow(one.batch, one.n, &group_rows) ||
        __builtin_add_overflow(total, group_rows, &total) ||
        __builtin_add_overflow(problems, one.batch, &problems))
      return MT_R_LAYOUT; /* sizes no device holds: cuBLAS's to answer */
  }
  if (problems == 0)
    return MT_R_LAYOUT; /* nothing to compute: cuBLAS's to answer */
  first.batch = problems;
  grouped_record(c, &first, g);
  if (!same_rows)
    g->rows = 0, g->group_rows = 1, g->total_rows = total;
  return MT_R_ROUTED;
}

enum mt_reason mt_norm_grouped(const mt_call *c, mt_grouped_call *g) {
  if (!arrays_ok(c, *(const float *)c->beta))
    return MT_R_PTR_ARRAYS;
  if (c->group_count > 0)
    return grouped_batched(c, g);
  grouped_record(c, c, g);
  return MT_R_ROUTED;
}
