/* fake_cublasLt.c — a fake libcublasLt.so.13 for CPU tests: handles, matmul descriptors and matrix
 * layouts that store their attributes (with the real sizes and defaults), and cublasLtMatmul on
 * host memory: op(A)/op(B), column- or row-major order, strided batches, alpha/beta, and the
 * DEFAULT, BIAS, RELU and RELU_BIAS epilogues (bias of the bias type, else of D's type).
 */
#include <stdlib.h>
#include <string.h>

#include "tests/cpu/fake/fake.h"

#define EXPORT __attribute__((visibility("default")))
#define NATTR 64

typedef struct {
  unsigned char val[NATTR][8];
  size_t size[NATTR]; /* 0: not an attribute the fake knows */
} attrs;

/* Per thread: the app checks the record of its own last call, whatever other threads do. */
static _Thread_local fake_record last;
EXPORT void fake_cublasLt_last(fake_record *out) { *out = last; }

static void put(attrs *a, int id, const void *v, size_t size) {
  memcpy(a->val[id], v, size);
  a->size[id] = size;
}

static void put32(attrs *a, int id, int32_t v) { put(a, id, &v, 4); }
static void put64(attrs *a, int id, int64_t v) { put(a, id, &v, 8); }

static cublasStatus_t get_attr(const attrs *a, int id, void *buf, size_t size, size_t *written) {
  last.attr_gets++;
  if (id < 0 || id >= NATTR || !a->size[id])
    return CUBLAS_STATUS_INVALID_VALUE;
  if (size == 0 && written) {
    *written = a->size[id];
    return CUBLAS_STATUS_SUCCESS;
  }
  if (size < a->size[id] || !buf)
    return CUBLAS_STATUS_INVALID_VALUE;
  memcpy(buf, a->val[id], a->size[id]);
  if (written)
    *written = a->size[id];
  return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t set_attr(attrs *a, int id, const void *buf, size_t size) {
  if (id < 0 || id >= NATTR || !a->size[id] || size != a->size[id])
    return CUBLAS_STATUS_INVALID_VALUE;
  memcpy(a->val[id], buf, size);
  return CUBLAS_STATUS_SUCCESS;
}

static int32_t i32(const attrs *a, int id) {
  int32_t v;
  memcpy(&v, a->val[id], 4);
  return v;
}

static int64_t i64(const attrs *a, int id) {
  int64_t v;
  memcpy(&v, a->val[id], 8);
  return v;
}

struct cublasLtContext {
  int unused;
};

EXPORT cublasStatus_t cublasLtCreate(cublasLtHandle_t *handle) {
  *handle = calloc(1, sizeof **handle);
  return *handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

EXPORT cublasStatus_t cublasLtDestroy(cublasLtHandle_t handle) {
  free(handle);
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *desc,
                                               cublasComputeType_t computeType,
                                               cudaDataType_t scaleType) {
  attrs *a = calloc(1, sizeof *a);
  if (!a)
    return CUBLAS_STATUS_ALLOC_FAILED;
  put32(a, CUBLASLT_MATMUL_DESC_COMPUTE_TYPE, computeType);
  put32(a, CUBLASLT_MATMUL_DESC_SCALE_TYPE, scaleType);
  put32(a, CUBLASLT_MATMUL_DESC_POINTER_MODE, CUBLASLT_POINTER_MODE_HOST);
  put32(a, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_N);
  put32(a, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  put32(a, CUBLASLT_MATMUL_DESC_TRANSC, CUBLAS_OP_N);
  put32(a, CUBLASLT_MATMUL_DESC_EPILOGUE, CUBLASLT_EPILOGUE_DEFAULT);
  put64(a, CUBLASLT_MATMUL_DESC_BIAS_POINTER, 0);
  put64(a, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, 0);
  put32(a, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, -1);
  put32(a, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, 0);
  *desc = (cublasLtMatmulDesc_t)a;
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  free(desc);
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                                     cublasLtMatmulDescAttributes_t attr,
                                                     const void *buf, size_t sizeInBytes) {
  return set_attr((attrs *)desc, attr, buf, sizeInBytes);
}

EXPORT cublasStatus_t cublasLtMatmulDescGetAttribute(cublasLtMatmulDesc_t desc,
                                                     cublasLtMatmulDescAttributes_t attr, void *buf,
                                                     size_t sizeInBytes, size_t *sizeWritten) {
  return get_attr((const attrs *)desc, attr, buf, sizeInBytes, sizeWritten);
}

EXPORT cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *layout, cudaDataType type,
                                                 uint64_t rows, uint64_t cols, int64_t ld) {
  attrs *a = calloc(1, sizeof *a);
  if (!a)
    return CUBLAS_STATUS_ALLOC_FAILED;
  put32(a, CUBLASLT_MATRIX_LAYOUT_TYPE, type);
  put32(a, CUBLASLT_MATRIX_LAYOUT_ORDER, CUBLASLT_ORDER_COL);
  put64(a, CUBLASLT_MATRIX_LAYOUT_ROWS, (int64_t)rows);
  put64(a, CUBLASLT_MATRIX_LAYOUT_COLS, (int64_t)cols);
  put64(a, CUBLASLT_MATRIX_LAYOUT_LD, ld);
  put32(a, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, 1);
  put64(a, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, 0);
  put64(a, CUBLASLT_MATRIX_LAYOUT_PLANE_OFFSET, 0);
  put32(a, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, CUBLASLT_BATCH_MODE_STRIDED);
  *layout = (cublasLtMatrixLayout_t)a;
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  free(layout);
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                       cublasLtMatrixLayoutAttribute_t attr,
                                                       const void *buf, size_t sizeInBytes) {
  return set_attr((attrs *)layout, attr, buf, sizeInBytes);
}

EXPORT cublasStatus_t cublasLtMatrixLayoutGetAttribute(cublasLtMatrixLayout_t layout,
                                                       cublasLtMatrixLayoutAttribute_t attr,
                                                       void *buf, size_t sizeInBytes,
                                                       size_t *sizeWritten) {
  return get_attr((const attrs *)layout, attr, buf, sizeInBytes, sizeWritten);
}

/* Element (i, j) of a stored matrix of layout l in batch p. */
static int64_t at(const attrs *l, int64_t i, int64_t j, int64_t p) {
  int64_t ld = i64(l, CUBLASLT_MATRIX_LAYOUT_LD);
  int64_t off =
      i32(l, CUBLASLT_MATRIX_LAYOUT_ORDER) == CUBLASLT_ORDER_ROW ? i * ld + j : i + j * ld;
  return off + p * i64(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET);
}

EXPORT cublasStatus_t cublasLtMatmul(cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc,
                                     const void *alpha, const void *A, cublasLtMatrixLayout_t Adesc,
                                     const void *B, cublasLtMatrixLayout_t Bdesc, const void *beta,
                                     const void *C, cublasLtMatrixLayout_t Cdesc, void *D,
                                     cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t *algo,
                                     void *workspace, size_t workspaceSizeInBytes,
                                     cudaStream_t stream) {
  uint64_t args[] = {
      (uintptr_t)lightHandle, (uintptr_t)computeDesc, (uintptr_t)alpha,     (uintptr_t)A,
      (uintptr_t)Adesc,       (uintptr_t)B,           (uintptr_t)Bdesc,     (uintptr_t)beta,
      (uintptr_t)C,           (uintptr_t)Cdesc,       (uintptr_t)D,         (uintptr_t)Ddesc,
      (uintptr_t)algo,        (uintptr_t)workspace,   workspaceSizeInBytes, (uintptr_t)stream};
  strncpy(last.fn, __func__, sizeof last.fn - 1);
  last.nargs = sizeof args / sizeof args[0];
  memcpy(last.args, args, sizeof args);
  last.calls++;

  const attrs *d = (const attrs *)computeDesc, *la = (const attrs *)Adesc,
              *lb = (const attrs *)Bdesc, *lc = (const attrs *)Cdesc, *ld = (const attrs *)Ddesc;
  int ta = i32(d, CUBLASLT_MATMUL_DESC_TRANSA) != CUBLAS_OP_N;
  int tb = i32(d, CUBLASLT_MATMUL_DESC_TRANSB) != CUBLAS_OP_N;
  int at_ = i32(la, CUBLASLT_MATRIX_LAYOUT_TYPE), bt = i32(lb, CUBLASLT_MATRIX_LAYOUT_TYPE);
  int ct = i32(lc, CUBLASLT_MATRIX_LAYOUT_TYPE), dt = i32(ld, CUBLASLT_MATRIX_LAYOUT_TYPE);
  int64_t m = i64(ld, CUBLASLT_MATRIX_LAYOUT_ROWS), n = i64(ld, CUBLASLT_MATRIX_LAYOUT_COLS);
  int64_t k = ta ? i64(la, CUBLASLT_MATRIX_LAYOUT_ROWS) : i64(la, CUBLASLT_MATRIX_LAYOUT_COLS);
  int64_t batch = i32(ld, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT);
  uint32_t epi = (uint32_t)i32(d, CUBLASLT_MATMUL_DESC_EPILOGUE);
  const void *bias = (const void *)(uintptr_t)i64(d, CUBLASLT_MATMUL_DESC_BIAS_POINTER);
  int bias_t = i32(d, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE);
  if (bias_t == -1)
    bias_t = dt;
  if (!fake_type_ok(at_) || !fake_type_ok(bt) || !fake_type_ok(ct) || !fake_type_ok(dt) ||
      !fake_type_ok(bias_t) || i32(d, CUBLASLT_MATMUL_DESC_SCALE_TYPE) != CUDA_R_32F)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (epi != CUBLASLT_EPILOGUE_DEFAULT && epi != CUBLASLT_EPILOGUE_BIAS &&
      epi != CUBLASLT_EPILOGUE_RELU && epi != CUBLASLT_EPILOGUE_RELU_BIAS)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (i32(ld, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE) != CUBLASLT_BATCH_MODE_STRIDED)
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (!lightHandle)
    return CUBLAS_STATUS_NOT_INITIALIZED;
  /* op(A) m x k, op(B) k x n, C m x n */
  int64_t am = ta ? i64(la, CUBLASLT_MATRIX_LAYOUT_COLS) : i64(la, CUBLASLT_MATRIX_LAYOUT_ROWS);
  int64_t bk = tb ? i64(lb, CUBLASLT_MATRIX_LAYOUT_COLS) : i64(lb, CUBLASLT_MATRIX_LAYOUT_ROWS);
  int64_t bn = tb ? i64(lb, CUBLASLT_MATRIX_LAYOUT_ROWS) : i64(lb, CUBLASLT_MATRIX_LAYOUT_COLS);
  if (!alpha || !beta || am != m || bk != k || bn != n ||
      i64(lc, CUBLASLT_MATRIX_LAYOUT_ROWS) != m || i64(lc, CUBLASLT_MATRIX_LAYOUT_COLS) != n)
    return CUBLAS_STATUS_INVALID_VALUE;
  float al = *(const float *)alpha, be = *(const float *)beta;
  for (int64_t p = 0; p < batch; p++)
    for (int64_t j = 0; j < n; j++)
      for (int64_t i = 0; i < m; i++) {
        float acc = 0;
        for (int64_t l = 0; l < k; l++)
          acc += fake_load(A, at_, ta ? at(la, l, i, p) : at(la, i, l, p)) *
                 fake_load(B, bt, tb ? at(lb, j, l, p) : at(lb, l, j, p));
        float out = al * acc;
        if (be != 0)
          out += be * fake_load(C, ct, at(lc, i, j, p));
        if (epi & CUBLASLT_EPILOGUE_BIAS) /* BIAS (4) and RELU_BIAS (6) */
          out += fake_load(bias, bias_t, i);
        if ((epi & CUBLASLT_EPILOGUE_RELU) && out < 0) /* RELU (2) and RELU_BIAS (6) */
          out = 0;
        fake_store(D, dt, at(ld, i, j, p), out);
      }
  return CUBLAS_STATUS_SUCCESS;
}

/* The fake's own cublasLtMatmul under a name the shim's dlsym does not answer (fake_cublas.c). */
EXPORT __typeof__(cublasLtMatmul) fake_own_cublasLtMatmul __attribute__((alias("cublasLtMatmul")));
