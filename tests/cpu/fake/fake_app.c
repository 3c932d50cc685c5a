/* fake_app.c — the "application" of the shim's CPU tests: a fixed battery of GEMM calls through
 * every hooked entry point, linked against the fake cuBLAS libraries.
 *
 * fake_app_run(out, expect) makes each call, checks that the fake received exactly the arguments
 * the app passed (the shim must forward them untouched), appends each call's status and output
 * bytes to `out` (compared bitwise across runs with and without the shim), and writes one line
 * "<entry> <reason>" per call to `expect`: the reason the router must give under a spec routing
 * the weights 64x32 and 48x24 (ROUTED stands for "routed" under bf16 and "no engine" under nvfp4).
 * FAKE_APP_FORK=1 adds a fork()ed child that makes one call; FAKE_APP_THREADS=N adds N threads
 * making THREAD_CALLS routed-shape calls each, at the same time; FAKE_APP_CHDIR=DIR changes the
 * directory before the first call, as programs do after the shim has started. Built twice: into
 * the direct-link test program, and into libfakeapp.so, which a program dlopen()s with
 * RTLD_LOCAL as PyTorch loads cuBLAS.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/cpu/fake/fake.h"

#define EXPORT __attribute__((visibility("default")))
#define U(x) ((uint64_t)(uintptr_t)(x))
#define I(x) ((uint64_t)(int64_t)(x))
#define BF CUDA_R_16BF
#define HF CUDA_R_16F
#define FF CUDA_R_32F
#define OPN CUBLAS_OP_N
#define OPT CUBLAS_OP_T

static FILE *out_file, *expect_file;
static int failures;
static uint32_t seed = 12345;

/* Values k/64 in [-1, 1): exact in BF16 and FP16, so no input depends on conversion code. */
static void *matrix(int type, int64_t elems) {
  size_t size = (size_t)elems * (type == FF ? 4 : 2);
  void *p = aligned_alloc(64, (size + 63) / 64 * 64);
  for (int64_t i = 0; i < elems; i++) {
    seed = seed * 1664525u + 1013904223u;
    fake_store(p, type, i, (float)((int)(seed >> 25) - 64) / 64.0f);
  }
  return p;
}

static void emit(const char *entry, const char *reason, cublasStatus_t st, const void *c, int type,
                 int64_t elems) {
  fprintf(expect_file, "%s %s\n", entry, reason);
  fwrite(&st, sizeof st, 1, out_file);
  fwrite(c, (size_t)elems * (type == FF ? 4 : 2), 1, out_file);
  if (st != CUBLAS_STATUS_SUCCESS) {
    fprintf(stderr, "fake_app: %s (expect %s) returned status %d\n", entry, reason, st);
    failures++;
  }
}

static void check_args(int lt, const char *entry, const uint64_t *want, int n) {
  fake_record r;
  if (lt)
    fake_cublasLt_last(&r);
  else
    fake_cublas_last(&r);
  if (strcmp(r.fn, entry) != 0 || r.nargs != n) {
    fprintf(stderr, "fake_app: expected a call of %s with %d arguments, the fake saw %s with %d\n",
            entry, n, r.fn, r.nargs);
    failures++;
    return;
  }
  for (int i = 0; i < n; i++)
    if (r.args[i] != want[i]) {
      fprintf(stderr, "fake_app: %s argument %d changed: passed %#llx, received %#llx\n", entry, i,
              (unsigned long long)want[i], (unsigned long long)r.args[i]);
      failures++;
    }
}

static cublasHandle_t handle;
static const float one = 1.0f, zero = 0.0f, half = 0.5f;

/* cublasGemmEx / _64 with the given ops and types; A, B, C sized from the dims and lds. */
static void gemm_ex(int wide, const char *reason, int ta, int tb, int m, int n, int k, int at,
                    int bt, int ct, int lda, int ldb, int ldc, int compute, const float *beta) {
  void *a = matrix(at, (int64_t)lda * (ta ? m : k)), *b = matrix(bt, (int64_t)ldb * (tb ? k : n));
  void *c = matrix(ct, (int64_t)ldc * n);
  cublasStatus_t st;
  const char *entry = wide ? "cublasGemmEx_64" : "cublasGemmEx";
  if (wide)
    st = cublasGemmEx_64(handle, ta, tb, m, n, k, &one, a, at, lda, b, bt, ldb, beta, c, ct, ldc,
                         compute, CUBLAS_GEMM_DEFAULT);
  else
    st = cublasGemmEx(handle, ta, tb, m, n, k, &one, a, at, lda, b, bt, ldb, beta, c, ct, ldc,
                      compute, CUBLAS_GEMM_DEFAULT_TENSOR_OP);
  uint64_t want[] = {U(handle),
                     I(ta),
                     I(tb),
                     I(m),
                     I(n),
                     I(k),
                     U(&one),
                     U(a),
                     I(at),
                     I(lda),
                     U(b),
                     I(bt),
                     I(ldb),
                     U(beta),
                     U(c),
                     I(ct),
                     I(ldc),
                     I(compute),
                     I(wide ? CUBLAS_GEMM_DEFAULT : CUBLAS_GEMM_DEFAULT_TENSOR_OP)};
  check_args(0, entry, want, sizeof want / sizeof want[0]);
  emit(entry, reason, st, c, ct, (int64_t)ldc * n);
  free(a), free(b), free(c);
}

static void gemm_ex_calls(void) {
  gemm_ex(0, "ROUTED", OPT, OPN, 64, 5, 32, BF, BF, BF, 32, 32, 64, CUBLAS_COMPUTE_32F, &zero);
  gemm_ex(0, "ROUTED", OPT, OPN, 64, 5, 32, BF, BF, BF, 32, 32, 64, CUDA_R_32F, &half);
  gemm_ex(0, "ROUTED", OPT, OPN, 64, 7, 32, HF, HF, HF, 32, 40, 64, CUBLAS_COMPUTE_32F, &zero);
  gemm_ex(0, "backward_dgrad", OPN, OPN, 32, 5, 64, BF, BF, BF, 32, 64, 32, CUBLAS_COMPUTE_32F,
          &zero);
  gemm_ex(0, "backward_wgrad", OPN, OPT, 32, 64, 5, BF, BF, BF, 32, 64, 32, CUBLAS_COMPUTE_32F,
          &one);
  gemm_ex(0, "dtype", OPT, OPN, 64, 5, 32, FF, FF, FF, 32, 32, 64, CUBLAS_COMPUTE_32F, &zero);
  gemm_ex(0, "dtype", OPT, OPN, 64, 5, 32, BF, BF, FF, 32, 32, 64, CUBLAS_COMPUTE_32F, &zero);
  gemm_ex(0, "compute_type", OPT, OPN, 64, 5, 32, BF, BF, BF, 32, 32, 64,
          CUBLAS_COMPUTE_32F_FAST_TF32, &zero);
  cublasSetPointerMode_v2(handle, CUBLAS_POINTER_MODE_DEVICE);
  gemm_ex(0, "pointer_mode", OPT, OPN, 64, 5, 32, BF, BF, BF, 32, 32, 64, CUBLAS_COMPUTE_32F,
          &zero);
  cublasSetPointerMode_v2(handle, CUBLAS_POINTER_MODE_HOST);
  gemm_ex(0, "layout", OPT, OPN, 64, 5, 32, BF, BF, BF, 36, 32, 64, CUBLAS_COMPUTE_32F, &zero);
  gemm_ex(0, "k_alignment", OPT, OPN, 48, 5, 24, BF, BF, BF, 24, 24, 48, CUBLAS_COMPUTE_32F, &zero);
  gemm_ex(0, "unrouted", OPT, OPN, 16, 4, 16, BF, BF, BF, 16, 16, 16, CUBLAS_COMPUTE_32F, &zero);
  /* x @ W with W stored [in][out]: the route's forward, read transposed */
  gemm_ex(0, "ROUTED", OPN, OPN, 64, 5, 32, BF, BF, BF, 64, 32, 64, CUBLAS_COMPUTE_32F, &zero);
  gemm_ex(1, "ROUTED", OPT, OPN, 64, 3, 32, BF, BF, BF, 32, 32, 64, CUBLAS_COMPUTE_32F, &zero);
  gemm_ex(1, "backward_dgrad", OPN, OPN, 32, 3, 64, BF, BF, BF, 32, 64, 32, CUBLAS_COMPUTE_32F,
          &zero);
}

static void strided(int wide, const char *reason, int ta, int tb, int m, int n, int k, int lda,
                    int ldb, int ldc, int batch) {
  int64_t sa = (int64_t)lda * (ta ? m : k), sb = (int64_t)ldb * (tb ? k : n), sc = (int64_t)ldc * n;
  void *a = matrix(BF, sa * batch), *b = matrix(BF, sb * batch), *c = matrix(BF, sc * batch);
  cublasStatus_t st;
  const char *entry = wide ? "cublasGemmStridedBatchedEx_64" : "cublasGemmStridedBatchedEx";
  if (wide)
    st = cublasGemmStridedBatchedEx_64(handle, ta, tb, m, n, k, &one, a, BF, lda, sa, b, BF, ldb,
                                       sb, &zero, c, BF, ldc, sc, batch, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT);
  else
    st = cublasGemmStridedBatchedEx(handle, ta, tb, m, n, k, &one, a, BF, lda, sa, b, BF, ldb, sb,
                                    &zero, c, BF, ldc, sc, batch, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT);
  uint64_t want[] = {U(handle),
                     I(ta),
                     I(tb),
                     I(m),
                     I(n),
                     I(k),
                     U(&one),
                     U(a),
                     I(BF),
                     I(lda),
                     I(sa),
                     U(b),
                     I(BF),
                     I(ldb),
                     I(sb),
                     U(&zero),
                     U(c),
                     I(BF),
                     I(ldc),
                     I(sc),
                     I(batch),
                     I(CUBLAS_COMPUTE_32F),
                     I(CUBLAS_GEMM_DEFAULT)};
  check_args(0, entry, want, sizeof want / sizeof want[0]);
  emit(entry, reason, st, c, BF, sc * batch);
  free(a), free(b), free(c);
}

static void batched(int wide, const char *reason, int ta, int tb, int m, int n, int k, int lda,
                    int ldb, int ldc) {
  enum { BATCH = 2 };
  void *a[BATCH], *b[BATCH], *c[BATCH];
  for (int p = 0; p < BATCH; p++) {
    a[p] = matrix(BF, (int64_t)lda * (ta ? m : k));
    b[p] = matrix(BF, (int64_t)ldb * (tb ? k : n));
    c[p] = matrix(BF, (int64_t)ldc * n);
  }
  cublasStatus_t st;
  const char *entry = wide ? "cublasGemmBatchedEx_64" : "cublasGemmBatchedEx";
  if (wide)
    st = cublasGemmBatchedEx_64(handle, ta, tb, m, n, k, &one, (const void *const *)a, BF, lda,
                                (const void *const *)b, BF, ldb, &zero, c, BF, ldc, BATCH,
                                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  else
    st = cublasGemmBatchedEx(handle, ta, tb, m, n, k, &one, (const void *const *)a, BF, lda,
                             (const void *const *)b, BF, ldb, &zero, c, BF, ldc, BATCH,
                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  uint64_t want[] = {U(handle),
                     I(ta),
                     I(tb),
                     I(m),
                     I(n),
                     I(k),
                     U(&one),
                     U(a),
                     I(BF),
                     I(lda),
                     U(b),
                     I(BF),
                     I(ldb),
                     U(&zero),
                     U(c),
                     I(BF),
                     I(ldc),
                     I(BATCH),
                     I(CUBLAS_COMPUTE_32F),
                     I(CUBLAS_GEMM_DEFAULT)};
  check_args(0, entry, want, sizeof want / sizeof want[0]);
  for (int p = 0; p < BATCH; p++) {
    emit(p ? "-" : entry, p ? "-" : reason, st, c[p], BF, (int64_t)ldc * n);
    free(a[p]), free(b[p]), free(c[p]);
  }
}

/* Two groups: group 0 is TN 64x32 (routed) with one problem, group 1 as given with two. */
static void grouped(int wide, const char *reason, int ta1, int tb1, int m1, int n1, int k1) {
  int ta[2] = {OPT, ta1}, tb[2] = {OPN, tb1}, m[2] = {64, m1}, n[2] = {6, n1}, k[2] = {32, k1};
  int lda[2] = {32, ta1 ? k1 : m1}, ldb[2] = {32, tb1 ? n1 : k1}, ldc[2] = {64, m1};
  int size[2] = {1, 2};
  int64_t m64[2], n64[2], k64[2], lda64[2], ldb64[2], ldc64[2], size64[2];
  cublasOperation_t opa[2], opb[2];
  float alpha[2] = {1.0f, 0.5f}, beta[2] = {0.0f, 1.0f};
  void *a[3], *b[3], *c[3];
  int64_t celems[3];
  for (int g = 0, p = 0; g < 2; g++) {
    m64[g] = m[g], n64[g] = n[g], k64[g] = k[g], lda64[g] = lda[g], ldb64[g] = ldb[g];
    ldc64[g] = ldc[g], size64[g] = size[g], opa[g] = ta[g], opb[g] = tb[g];
    for (int q = 0; q < size[g]; q++, p++) {
      a[p] = matrix(BF, (int64_t)lda[g] * (ta[g] ? m[g] : k[g]));
      b[p] = matrix(BF, (int64_t)ldb[g] * (tb[g] ? k[g] : n[g]));
      c[p] = matrix(BF, celems[p] = (int64_t)ldc[g] * n[g]);
    }
  }
  cublasStatus_t st;
  const char *entry = wide ? "cublasGemmGroupedBatchedEx_64" : "cublasGemmGroupedBatchedEx";
  uint64_t want[20];
  if (wide) {
    st = cublasGemmGroupedBatchedEx_64(
        handle, opa, opb, m64, n64, k64, alpha, (const void *const *)a, BF, lda64,
        (const void *const *)b, BF, ldb64, beta, c, BF, ldc64, 2, size64, CUBLAS_COMPUTE_32F);
    uint64_t w[] = {U(handle), U(opa),   U(opb),   U(m64),    U(n64),
                    U(k64),    U(alpha), U(a),     I(BF),     U(lda64),
                    U(b),      I(BF),    U(ldb64), U(beta),   U(c),
                    I(BF),     U(ldc64), I(2),     U(size64), I(CUBLAS_COMPUTE_32F)};
    memcpy(want, w, sizeof w);
  } else {
    st = cublasGemmGroupedBatchedEx(handle, opa, opb, m, n, k, alpha, (const void *const *)a, BF,
                                    lda, (const void *const *)b, BF, ldb, beta, c, BF, ldc, 2, size,
                                    CUBLAS_COMPUTE_32F);
    uint64_t w[] = {U(handle), U(opa),   U(opb), U(m),    U(n),
                    U(k),      U(alpha), U(a),   I(BF),   U(lda),
                    U(b),      I(BF),    U(ldb), U(beta), U(c),
                    I(BF),     U(ldc),   I(2),   U(size), I(CUBLAS_COMPUTE_32F)};
    memcpy(want, w, sizeof w);
  }
  check_args(0, entry, want, 20);
  for (int p = 0; p < 3; p++) {
    emit(p ? "-" : entry, p ? "-" : reason, st, c[p], BF, celems[p]);
    free(a[p]), free(b[p]), free(c[p]);
  }
}

/* --- cublasLtMatmul ----------------------------------------------------------------------- */

typedef struct {
  int ta, tb, m, n, k, type, ctype, compute, order, batch, ptr_mode;
  uint32_t epilogue;
  int bias_type; /* -1: not set */
  int a_row;     /* A alone in row order (as XLA gives it), the others in `order` */
} lt_case;

static void lt_set_layout(cublasLtMatrixLayout_t l, const lt_case *t, int row, int64_t stride) {
  int32_t order = row ? CUBLASLT_ORDER_ROW : t->order, batch = t->batch;
  cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof order);
  cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch);
  cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                   sizeof stride);
}

static void lt(const char *reason, lt_case t) {
  static cublasLtHandle_t lth;
  if (!lth)
    cublasLtCreate(&lth);
  int64_t arows = t.ta ? t.k : t.m, acols = t.ta ? t.m : t.k;
  int64_t brows = t.tb ? t.n : t.k, bcols = t.tb ? t.k : t.n;
  int row = t.order == CUBLASLT_ORDER_ROW, arow = row || t.a_row;
  int64_t lda = arow ? acols : arows, ldb = row ? bcols : brows, ldc = row ? t.n : t.m;
  int64_t sa = arows * acols, sb = brows * bcols, sc = (int64_t)t.m * t.n;
  void *a = matrix(t.type, sa * t.batch), *b = matrix(t.type, sb * t.batch);
  void *c = matrix(t.ctype, sc * t.batch), *d = matrix(t.ctype, sc * t.batch);
  void *bias = matrix(t.bias_type == -1 ? t.ctype : t.bias_type, t.m);
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc, ld;
  cublasLtMatmulDescCreate(&desc, t.compute, CUDA_R_32F);
  int32_t ta = t.ta, tb = t.tb, pm = t.ptr_mode;
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof pm);
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &t.epilogue,
                                 sizeof t.epilogue);
  if (t.epilogue & CUBLASLT_EPILOGUE_BIAS)
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
  if (t.bias_type != -1)
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &t.bias_type,
                                   sizeof t.bias_type);
  cublasLtMatrixLayoutCreate(&la, t.type, arows, acols, lda);
  cublasLtMatrixLayoutCreate(&lb, t.type, brows, bcols, ldb);
  cublasLtMatrixLayoutCreate(&lc, t.ctype, t.m, t.n, ldc);
  cublasLtMatrixLayoutCreate(&ld, t.ctype, t.m, t.n, ldc);
  lt_set_layout(la, &t, t.a_row, sa), lt_set_layout(lb, &t, 0, sb);
  lt_set_layout(lc, &t, 0, sc), lt_set_layout(ld, &t, 0, sc);
  char workspace[64];
  cudaStream_t stream = (cudaStream_t)(uintptr_t)0x5000;
  cublasStatus_t st = cublasLtMatmul(lth, desc, &one, a, la, b, lb, &half, c, lc, d, ld, NULL,
                                     workspace, sizeof workspace, stream);
  uint64_t want[] = {U(lth),           U(desc),  U(&one), U(a), U(la), U(b),    U(lb),
                     U(&half),         U(c),     U(lc),   U(d), U(ld), U(NULL), U(workspace),
                     sizeof workspace, U(stream)};
  check_args(1, "cublasLtMatmul", want, sizeof want / sizeof want[0]);
  emit("cublasLtMatmul", reason, st, d, t.ctype, sc * t.batch);
  cublasLtMatmulDescDestroy(desc);
  cublasLtMatrixLayoutDestroy(la), cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc), cublasLtMatrixLayoutDestroy(ld);
  free(a), free(b), free(c), free(d), free(bias);
}

static void lt_calls(void) {
  const lt_case fwd = {OPT,
                       OPN,
                       64,
                       5,
                       32,
                       BF,
                       BF,
                       CUBLAS_COMPUTE_32F,
                       CUBLASLT_ORDER_COL,
                       1,
                       CUBLASLT_POINTER_MODE_HOST,
                       CUBLASLT_EPILOGUE_DEFAULT,
                       -1,
                       0};
  lt_case t = fwd;
  lt("ROUTED", t);
  t.epilogue = CUBLASLT_EPILOGUE_BIAS;
  lt("ROUTED", t);
  t.bias_type = FF;
  lt("ROUTED", t);
  t = fwd, t.epilogue = CUBLASLT_EPILOGUE_RELU;
  lt("epilogue", t);
  t = fwd, t.order = CUBLASLT_ORDER_ROW; /* D in row order; A's op T folds to N: no role */
  lt("unrouted", t);
  t = fwd, t.ta = OPN, t.tb = OPT, t.order = CUBLASLT_ORDER_ROW; /* folds to TN, D in row order */
  lt("layout", t);
  t = fwd, t.ta = OPN, t.a_row = 1; /* XLA: the [out][in] weight as a row-order A, op N */
  lt("ROUTED", t);
  t = fwd, t.ta = OPN, t.a_row = 1, t.batch = 2;
  lt("ROUTED", t);
  t = fwd, t.a_row = 1; /* row order and op T: the weight [in][out], XLA's x @ W */
  lt("ROUTED", t);
  t = fwd, t.a_row = 1, t.batch = 2; /* XLA's capacity einsum: a strided batch of them */
  lt("ROUTED", t);
  t = fwd, t.batch = 2; /* a strided batch: routed as one grouped call */
  lt("ROUTED", t);
  t = fwd, t.ptr_mode = CUBLASLT_POINTER_MODE_DEVICE;
  lt("pointer_mode", t);
  t = fwd, t.m = 16, t.k = 16;
  lt("unrouted", t);
  t = fwd, t.ta = OPN, t.m = 32, t.k = 64;
  lt("backward_dgrad", t);
  t = fwd, t.type = t.ctype = HF;
  lt("ROUTED", t);
  t = fwd, t.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  lt("compute_type", t);
  t = fwd, t.ctype = FF;
  lt("dtype", t);
}

static void forked_child(void) {
  fflush(NULL);
  pid_t pid = fork();
  if (pid == 0) {
    /* A GEMM in the child, then a normal exit: the shim's exit code runs here too, and must not
     * write the parent's statistics file. */
    void *a = matrix(BF, 32 * 64), *b = matrix(BF, 32 * 2), *c = matrix(BF, 64 * 2);
    cublasGemmEx(handle, OPT, OPN, 64, 2, 32, &one, a, BF, 32, b, BF, 32, &zero, c, BF, 64,
                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    free(a), free(b), free(c);
    exit(0);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status)) {
    fprintf(stderr, "fake_app: the forked child failed (status %#x)\n", status);
    failures++;
  }
}

#define THREAD_CALLS 500

static void *thread_calls(void *arg) {
  (void)arg;
  void *a = matrix(BF, 32 * 64), *b = matrix(BF, 32 * 5), *c = matrix(BF, 64 * 5);
  long bad = 0;
  for (int i = 0; i < THREAD_CALLS; i++) {
    bad += cublasGemmEx(handle, OPT, OPN, 64, 5, 32, &one, a, BF, 32, b, BF, 32, &zero, c, BF, 64,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS;
    uint64_t want[] = {U(handle),
                       I(OPT),
                       I(OPN),
                       64,
                       5,
                       32,
                       U(&one),
                       U(a),
                       I(BF),
                       32,
                       U(b),
                       I(BF),
                       32,
                       U(&zero),
                       U(c),
                       I(BF),
                       64,
                       I(CUBLAS_COMPUTE_32F),
                       I(CUBLAS_GEMM_DEFAULT)};
    fake_record r;
    fake_cublas_last(&r);
    bad += r.nargs != 19 || memcmp(r.args, want, sizeof want) != 0;
  }
  free(a), free(b), free(c);
  return (void *)bad;
}

/* The threads share the handle, as threads of a program sharing one cuBLAS handle do (a real
 * program serialises them on one stream; the fake has no state to race on). */
static void threads(int n) {
  pthread_t t[64];
  n = n > 64 ? 64 : n;
  for (int i = 0; i < n; i++)
    pthread_create(&t[i], NULL, thread_calls, NULL);
  for (int i = 0; i < n; i++) {
    void *bad;
    pthread_join(t[i], &bad);
    if (bad) {
      fprintf(stderr, "fake_app: thread %d: %ld calls failed or changed arguments\n", i, (long)bad);
      failures++;
    }
  }
  for (int i = 0; i < n * THREAD_CALLS; i++)
    fprintf(expect_file, "cublasGemmEx ROUTED\n");
}

EXPORT int fake_app_run(const char *out_path, const char *expect_path) {
  out_file = fopen(out_path, "wb");
  expect_file = fopen(expect_path, "w");
  if (!out_file || !expect_file) {
    fprintf(stderr, "fake_app: cannot write %s or %s\n", out_path, expect_path);
    return 1;
  }
  const char *dir = getenv("FAKE_APP_CHDIR");
  if (dir && chdir(dir) != 0) {
    fprintf(stderr, "fake_app: cannot change to %s\n", dir);
    return 1;
  }
  cublasCreate_v2(&handle);
  cublasSetStream_v2(handle, (cudaStream_t)(uintptr_t)0x4000);
  const char *fork_env = getenv("FAKE_APP_FORK");
  if (fork_env && fork_env[0] == '1')
    forked_child();
  gemm_ex_calls();
  strided(0, "ROUTED", OPT, OPN, 64, 3, 32, 32, 32, 64, 3);
  strided(0, "unrouted", OPN, OPN, 8, 8, 16, 8, 16, 8, 2);
  strided(1, "ROUTED", OPT, OPN, 64, 4, 32, 32, 32, 64, 2);
  batched(0, "ROUTED", OPT, OPN, 64, 3, 32, 32, 32, 64);
  batched(1, "backward_wgrad", OPN, OPT, 32, 64, 3, 32, 64, 32);
  grouped(0, "ROUTED", OPT, OPN, 64, 9, 32);
  grouped(1, "layout", OPT, OPN, 16, 4, 16);
  lt_calls();
  const char *threads_env = getenv("FAKE_APP_THREADS");
  if (threads_env)
    threads(atoi(threads_env));
  cublasDestroy_v2(handle);
  fclose(out_file);
  fclose(expect_file);
  return failures;
}
