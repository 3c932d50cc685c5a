/* fake_cublas.c — a fake libcublas.so.13 for CPU tests: the GEMM entry points the shim hooks,
 * computed on host memory with cuBLAS's semantics (column-major, op(A), lda, alpha/beta, beta = 0
 * never reads C), plus the handle functions the shim calls (stream, pointer mode).
 *
 * Built with the real soname and a version script naming the node libcublas.so.13, like the
 * real library, so that programs and the shim bind to it exactly as they bind to cuBLAS.
 */
#include <stdlib.h>
#include <string.h>

#include "tests/cpu/fake/fake.h"

#define EXPORT __attribute__((visibility("default")))

struct cublasContext {
  cudaStream_t stream;
  cublasPointerMode_t mode;
};

/* Per thread: the app checks the record of its own last call, whatever other threads do. */
static _Thread_local fake_record last;

EXPORT void fake_cublas_last(fake_record *out) { *out = last; }

#define ARGS_MAX FAKE_MAX_ARGS
static void record(const char *fn, int n, const uint64_t *args) {
  strncpy(last.fn, fn, sizeof last.fn - 1);
  last.nargs = n;
  memcpy(last.args, args, sizeof(uint64_t) * (size_t)n);
  last.calls++;
}
#define U(x) ((uint64_t)(uintptr_t)(x))
#define I(x) ((uint64_t)(int64_t)(x))

EXPORT cublasStatus_t cublasCreate_v2(cublasHandle_t *handle) {
  *handle = calloc(1, sizeof **handle);
  return *handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

EXPORT cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  free(handle);
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t *stream) {
  *stream = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode) {
  handle->mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasGetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t *mode) {
  *mode = handle->mode;
  return CUBLAS_STATUS_SUCCESS;
}

/* FP32 compute in every spelling the fakes take; the legacy CUDA_R_32F (0) is what PyTorch
 * passes. */
static int compute_ok(int compute) {
  return compute == CUBLAS_COMPUTE_32F || compute == CUDA_R_32F ||
         compute == CUBLAS_COMPUTE_32F_PEDANTIC || compute == CUBLAS_COMPUTE_32F_FAST_TF32 ||
         compute == CUBLAS_COMPUTE_32F_FAST_16BF || compute == CUBLAS_COMPUTE_32F_FAST_16F;
}

/* One problem: C = alpha op(A) op(B) + beta C; host memory, float accumulation in K order. */
static cublasStatus_t gemm1(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                            const void *a, int at, int64_t lda, const void *b, int bt, int64_t ldb,
                            float beta, void *c, int ct, int64_t ldc) {
  if (m < 0 || n < 0 || k < 0 || lda < (ta ? k : m) || ldb < (tb ? n : k) || ldc < m)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (!fake_type_ok(at) || !fake_type_ok(bt) || !fake_type_ok(ct))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  for (int64_t j = 0; j < n; j++)
    for (int64_t i = 0; i < m; i++) {
      float acc = 0;
      for (int64_t l = 0; l < k; l++)
        acc += fake_load(a, at, ta ? l + i * lda : i + l * lda) *
               fake_load(b, bt, tb ? j + l * ldb : l + j * ldb);
      float out = alpha * acc;
      if (beta != 0)
        out += beta * fake_load(c, ct, i + j * ldc);
      fake_store(c, ct, i + j * ldc, out);
    }
  return CUBLAS_STATUS_SUCCESS;
}

static int elem_size(int t) { return t == CUDA_R_32F ? 4 : 2; }

static cublasStatus_t strided(cublasHandle_t h, int ta, int tb, int64_t m, int64_t n, int64_t k,
                              const void *alpha, const void *a, int at, int64_t lda, int64_t sa,
                              const void *b, int bt, int64_t ldb, int64_t sb, const void *beta,
                              void *c, int ct, int64_t ldc, int64_t sc, int64_t batch,
                              int compute) {
  (void)h; /* pointer mode DEVICE reads the same (host) memory in the fake */
  if (!alpha || !beta || ta < 0 || ta > 2 || tb < 0 || tb > 2)
    return CUBLAS_STATUS_INVALID_VALUE;
  if (!compute_ok(compute))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  float al = *(const float *)alpha, be = *(const float *)beta;
  for (int64_t p = 0; p < batch; p++) {
    cublasStatus_t st = gemm1(ta, tb, m, n, k, al, (const char *)a + p * sa * elem_size(at), at,
                              lda, (const char *)b + p * sb * elem_size(bt), bt, ldb, be,
                              (char *)c + p * sc * elem_size(ct), ct, ldc);
    if (st != CUBLAS_STATUS_SUCCESS)
      return st;
  }
  return CUBLAS_STATUS_SUCCESS;
}

/* The bodies of each entry point and its _64 twin: the same argument record (the 64-bit form
 * widens the integers, as recorded) and the same computation. */
#define EX_BODY                                                                                    \
  uint64_t args[] = {U(handle), I(transa), I(transb), I(m),           I(n),     I(k),   U(alpha),  \
                     U(A),      I(Atype),  I(lda),    U(B),           I(Btype), I(ldb), U(beta),   \
                     U(C),      I(Ctype),  I(ldc),    I(computeType), I(algo)};                    \
  record(__func__, sizeof args / sizeof args[0], args);                                            \
  return strided(handle, transa, transb, m, n, k, alpha, A, Atype, lda, 0, B, Btype, ldb, 0, beta, \
                 C, Ctype, ldc, 0, 1, computeType)

#define STRIDED_BODY                                                                               \
  uint64_t args[] = {U(handle), I(transa),  I(transb),     I(m),           I(n),       I(k),       \
                     U(alpha),  U(A),       I(Atype),      I(lda),         I(strideA), U(B),       \
                     I(Btype),  I(ldb),     I(strideB),    U(beta),        U(C),       I(Ctype),   \
                     I(ldc),    I(strideC), I(batchCount), I(computeType), I(algo)};               \
  record(__func__, sizeof args / sizeof args[0], args);                                            \
  return strided(handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb,    \
                 strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType)

#define BATCHED_BODY                                                                               \
  uint64_t args[] = {U(handle), I(transa), I(transb),     I(m),           I(n),                    \
                     I(k),      U(alpha),  U(Aarray),     I(Atype),       I(lda),                  \
                     U(Barray), I(Btype),  I(ldb),        U(beta),        U(Carray),               \
                     I(Ctype),  I(ldc),    I(batchCount), I(computeType), I(algo)};                \
  record(__func__, sizeof args / sizeof args[0], args);                                            \
  return batched(transa, transb, m, n, k, alpha, Aarray, Atype, lda, Barray, Btype, ldb, beta,     \
                 Carray, Ctype, ldc, batchCount, computeType)

EXPORT cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                                   cublasOperation_t transb, int m, int n, int k, const void *alpha,
                                   const void *A, cudaDataType Atype, int lda, const void *B,
                                   cudaDataType Btype, int ldb, const void *beta, void *C,
                                   cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                                   cublasGemmAlgo_t algo) {
  EX_BODY;
}

EXPORT cublasStatus_t cublasGemmEx_64(cublasHandle_t handle, cublasOperation_t transa,
                                      cublasOperation_t transb, int64_t m, int64_t n, int64_t k,
                                      const void *alpha, const void *A, cudaDataType Atype,
                                      int64_t lda, const void *B, cudaDataType Btype, int64_t ldb,
                                      const void *beta, void *C, cudaDataType Ctype, int64_t ldc,
                                      cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  EX_BODY;
}

EXPORT cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
    const void *alpha, const void *A, cudaDataType Atype, int lda, long long int strideA,
    const void *B, cudaDataType Btype, int ldb, long long int strideB, const void *beta, void *C,
    cudaDataType Ctype, int ldc, long long int strideC, int batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  STRIDED_BODY;
}

EXPORT cublasStatus_t cublasGemmStridedBatchedEx_64(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int64_t m, int64_t n,
    int64_t k, const void *alpha, const void *A, cudaDataType Atype, int64_t lda,
    long long int strideA, const void *B, cudaDataType Btype, int64_t ldb, long long int strideB,
    const void *beta, void *C, cudaDataType Ctype, int64_t ldc, long long int strideC,
    int64_t batchCount, cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  STRIDED_BODY;
}

static cublasStatus_t batched(int ta, int tb, int64_t m, int64_t n, int64_t k, const void *alpha,
                              const void *const a[], int at, int64_t lda, const void *const b[],
                              int bt, int64_t ldb, const void *beta, void *const c[], int ct,
                              int64_t ldc, int64_t batch, int compute) {
  if (!compute_ok(compute))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  for (int64_t p = 0; p < batch; p++) {
    cublasStatus_t st = gemm1(ta, tb, m, n, k, *(const float *)alpha, a[p], at, lda, b[p], bt, ldb,
                              *(const float *)beta, c[p], ct, ldc);
    if (st != CUBLAS_STATUS_SUCCESS)
      return st;
  }
  return CUBLAS_STATUS_SUCCESS;
}

EXPORT cublasStatus_t cublasGemmBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void *alpha, const void *const Aarray[],
                                          cudaDataType Atype, int lda, const void *const Barray[],
                                          cudaDataType Btype, int ldb, const void *beta,
                                          void *const Carray[], cudaDataType Ctype, int ldc,
                                          int batchCount, cublasComputeType_t computeType,
                                          cublasGemmAlgo_t algo) {
  BATCHED_BODY;
}

EXPORT cublasStatus_t cublasGemmBatchedEx_64(
    cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int64_t m, int64_t n,
    int64_t k, const void *alpha, const void *const Aarray[], cudaDataType Atype, int64_t lda,
    const void *const Barray[], cudaDataType Btype, int64_t ldb, const void *beta,
    void *const Carray[], cudaDataType Ctype, int64_t ldc, int64_t batchCount,
    cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  BATCHED_BODY;
}

/* Grouped: group g's problems share its ops, dims, lds, alpha[g] and beta[g]; the pointer arrays
 * run over all problems of all groups in order. */
#define GROUPED_BODY(IT)                                                                           \
  if (!compute_ok(computeType))                                                                    \
    return CUBLAS_STATUS_NOT_SUPPORTED;                                                            \
  int64_t p = 0;                                                                                   \
  for (IT g = 0; g < group_count; g++)                                                             \
    for (IT q = 0; q < group_size[g]; q++, p++) {                                                  \
      cublasStatus_t st =                                                                          \
          gemm1(transa_array[g], transb_array[g], m_array[g], n_array[g], k_array[g],              \
                ((const float *)alpha_array)[g], Aarray[p], Atype, lda_array[g], Barray[p], Btype, \
                ldb_array[g], ((const float *)beta_array)[g], Carray[p], Ctype, ldc_array[g]);     \
      if (st != CUBLAS_STATUS_SUCCESS)                                                             \
        return st;                                                                                 \
    }                                                                                              \
  return CUBLAS_STATUS_SUCCESS

EXPORT cublasStatus_t cublasGemmGroupedBatchedEx(
    cublasHandle_t handle, const cublasOperation_t transa_array[],
    const cublasOperation_t transb_array[], const int m_array[], const int n_array[],
    const int k_array[], const void *alpha_array, const void *const Aarray[], cudaDataType_t Atype,
    const int lda_array[], const void *const Barray[], cudaDataType_t Btype, const int ldb_array[],
    const void *beta_array, void *const Carray[], cudaDataType_t Ctype, const int ldc_array[],
    int group_count, const int group_size[], cublasComputeType_t computeType) {
  uint64_t args[] = {U(handle),  U(transa_array), U(transb_array), U(m_array),    U(n_array),
                     U(k_array), U(alpha_array),  U(Aarray),       I(Atype),      U(lda_array),
                     U(Barray),  I(Btype),        U(ldb_array),    U(beta_array), U(Carray),
                     I(Ctype),   U(ldc_array),    I(group_count),  U(group_size), I(computeType)};
  record(__func__, sizeof args / sizeof args[0], args);
  GROUPED_BODY(int);
}

EXPORT cublasStatus_t cublasGemmGroupedBatchedEx_64(
    cublasHandle_t handle, const cublasOperation_t transa_array[],
    const cublasOperation_t transb_array[], const int64_t m_array[], const int64_t n_array[],
    const int64_t k_array[], const void *alpha_array, const void *const Aarray[],
    cudaDataType_t Atype, const int64_t lda_array[], const void *const Barray[],
    cudaDataType_t Btype, const int64_t ldb_array[], const void *beta_array, void *const Carray[],
    cudaDataType_t Ctype, const int64_t ldc_array[], int64_t group_count,
    const int64_t group_size[], cublasComputeType_t computeType) {
  uint64_t args[] = {U(handle),  U(transa_array), U(transb_array), U(m_array),    U(n_array),
                     U(k_array), U(alpha_array),  U(Aarray),       I(Atype),      U(lda_array),
                     U(Barray),  I(Btype),        U(ldb_array),    U(beta_array), U(Carray),
                     I(Ctype),   U(ldc_array),    I(group_count),  U(group_size), I(computeType)};
  record(__func__, sizeof args / sizeof args[0], args);
  GROUPED_BODY(int64_t);
}

/* The fake's own entry points under names the shim's dlsym does not answer (it returns its hooks
 * for the cuBLAS names, shim/dl.h): what a test calls to compute the result without the shim. */
#define OWN(name) EXPORT __typeof__(name) fake_own_##name __attribute__((alias(#name)))
OWN(cublasGemmEx);
OWN(cublasGemmEx_64);
OWN(cublasGemmStridedBatchedEx);
OWN(cublasGemmStridedBatchedEx_64);
OWN(cublasGemmBatchedEx);
OWN(cublasGemmBatchedEx_64);
OWN(cublasGemmGroupedBatchedEx);
OWN(cublasGemmGroupedBatchedEx_64);
