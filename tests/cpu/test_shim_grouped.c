/* test_shim_grouped.c — the grouped front doors' records, in-process: a torch._grouped_mm call's
 * view in cuBLAS's terms (shim/torch.h: mt_torch_view, on tensors laid out as libtorch's, through
 * accessors that read them), and the mt_grouped_call of every routed call of several problems
 * (shim/norm.h: mt_norm_grouped) that the grouped seam (shim/exec.h) receives. */
#include <stdint.h>
#include <string.h>

#include "shim/norm.h"
#include "shim/torch.h"
#include "tests/cpu/fake/fake_torch.h"
#include "tests/harness.h"

/* --- tensors and libtorch's accessors on them ------------------------------------------------ */

#define IMPL(t) (((fake_tensor *)(t))->impl)
static int32_t get_data(void *t, void **o) { return *o = IMPL(t)->data, 0; }
static int32_t get_dim(void *t, int64_t *o) { return *o = IMPL(t)->dim, 0; }
static int32_t get_sizes(void *t, int64_t **o) { return *o = IMPL(t)->sizes, 0; }
static int32_t get_strides(void *t, int64_t **o) { return *o = IMPL(t)->strides, 0; }
static int32_t get_dtype(void *t, int32_t *o) { return *o = IMPL(t)->dtype, 0; }
static int32_t get_device(void *t, int32_t *o) { return *o = IMPL(t)->device, 0; }
static int32_t get_stream(int32_t device, void **o) {
  return *o = (void *)(uintptr_t)(0x9000 + device), 0;
}

static const mt_torch_api api = {get_data,        get_dim,         get_sizes,       get_strides,
                                 get_dtype,       get_device,      get_stream,      FAKE_TORCH_BF16,
                                 FAKE_TORCH_FP16, FAKE_TORCH_FP32, FAKE_TORCH_INT32};

typedef struct {
  fake_impl impl;
  fake_tensor t;
} tensor;

static void make(tensor *x, void *data, int dim, int64_t s0, int64_t s1, int64_t s2, int64_t t0,
                 int64_t t1, int64_t t2) {
  *x = (tensor){.impl = {.data = data,
                         .dim = dim,
                         .sizes = {s0, s1, s2},
                         .strides = {t0, t1, t2},
                         .dtype = FAKE_TORCH_BF16,
                         .device = 1}};
  x->t.impl = &x->impl;
}

/* Addresses only: nothing is ever read through them. */
static _Alignas(16) char mem[8][16];
#define W mem[0]
#define X mem[1]
#define Y mem[2]
#define OFFS mem[3]

enum { E = 4, OUT = 64, IN = 32, T = 40 };

static void offs_tensor(tensor *o) {
  make(o, OFFS, 1, E, 0, 0, 1, 0, 0);
  o->impl.dtype = FAKE_TORCH_INT32;
}

static fake_optional some(const tensor *t) { return (fake_optional){t->t, 1}; }
static fake_optional none = {{NULL}, 0};

/* --- torch views -------------------------------------------------------------------------- */

static void forward_view_and_its_record(void) {
  tensor x, w_t, y, o;
  offs_tensor(&o);
  make(&x, X, 2, T, IN, 0, IN, 1, 0);
  make(&w_t, W, 3, E, IN, OUT, OUT * IN, 1, IN); /* W [E, OUT, IN] transposed */
  make(&y, Y, 2, T, OUT, 0, OUT, 1, 0);
  fake_optional offs = some(&o), bias = none;
  mt_call c;
  CHECK(mt_torch_view(&api, &x.t, &w_t.t, &offs, &bias, &y.t, &c) == MT_R_ROUTED);
  CHECK(c.entry == MT_FN_torch_grouped_mm && c.details_ok && c.details);
  CHECK(c.transa == 1 && c.transb == MT_OP_N); /* TN: the weight transposed */
  CHECK(c.m == OUT && c.n == T && c.k == IN && c.batch == E && c.ragged == MT_RAGGED_N);
  CHECK(c.a == W && c.lda == IN && c.stride_a == OUT * IN);
  CHECK(c.b == X && c.ldb == IN && c.c == Y && c.d == Y && c.ldc == OUT && c.ldd == OUT);
  CHECK(c.offs == (const int32_t *)OFFS);
  CHECK(c.atype == CUDA_R_16BF && c.btype == CUDA_R_16BF && c.dtype == CUDA_R_16BF);
  CHECK(c.ptr_mode == MT_PTR_HOST && *(const float *)c.alpha == 1.0f &&
        *(const float *)c.beta == 0);
  CHECK(c.stream == (void *)(uintptr_t)0x9001 && c.device == 1); /* out's device's stream */
  CHECK(c.epilogue == CUBLASLT_EPILOGUE_DEFAULT);
  mt_grouped_call g;
  CHECK(mt_norm_grouped(&c, &g) == MT_R_ROUTED);
  CHECK(g.call == &c && g.groups == E && g.n == OUT && g.k == IN);
  CHECK(g.w == W && g.w_stride == OUT * IN && g.ldw == IN && !g.w_ptrs && g.wtype == CUDA_R_16BF);
  CHECK(g.offs == (const int32_t *)OFFS && g.total_rows == T && g.rows == 0);
  CHECK(g.x == X && g.ldx == IN && g.y == Y && g.ldy == OUT && !g.c && !g.bias);
  CHECK(g.alpha == 1.0f && g.beta == 0.0f && g.stream == c.stream);
}

static void backward_and_other_modes(void) {
  tensor dy, w, dx, dy_t, x, dw, x3, w_t, y3, b2, y4, o;
  offs_tensor(&o);
  fake_optional offs = some(&o), bias = none;
  mt_call c;
  /* dgrad: dy [T, OUT] . W [E, OUT, IN] */
  make(&dy, Y, 2, T, OUT, 0, OUT, 1, 0);
  make(&w, W, 3, E, OUT, IN, OUT * IN, IN, 1);
  make(&dx, X, 2, T, IN, 0, IN, 1, 0);
  CHECK(mt_torch_view(&api, &dy.t, &w.t, &offs, &bias, &dx.t, &c) == MT_R_ROUTED);
  CHECK(c.transa == MT_OP_N && c.transb == MT_OP_N && c.m == IN && c.k == OUT && c.n == T);
  CHECK(c.ragged == MT_RAGGED_N && c.details_ok);
  /* wgrad: dy.t() [OUT, T] (column-major) . x [T, IN] -> [E, OUT, IN] */
  make(&dy_t, Y, 2, OUT, T, 0, 1, OUT, 0);
  make(&x, X, 2, T, IN, 0, IN, 1, 0);
  make(&dw, W, 3, E, OUT, IN, OUT * IN, IN, 1);
  CHECK(mt_torch_view(&api, &dy_t.t, &x.t, &offs, &bias, &dw.t, &c) == MT_R_ROUTED);
  CHECK(c.transa == MT_OP_N && c.transb == 1 && c.m == IN && c.n == OUT && c.k == T);
  CHECK(c.ragged == MT_RAGGED_K && c.batch == E && c.ldb == OUT && c.stride_d == OUT * IN);
  /* a 3-D batch: no offsets, every group 5 rows */
  make(&x3, X, 3, E, 5, IN, 5 * IN, IN, 1);
  make(&w_t, W, 3, E, IN, OUT, OUT * IN, 1, IN);
  make(&y3, Y, 3, E, 5, OUT, 5 * OUT, OUT, 1);
  CHECK(mt_torch_view(&api, &x3.t, &w_t.t, &none, &bias, &y3.t, &c) == MT_R_ROUTED);
  CHECK(c.ragged == MT_RAGGED_NONE && c.batch == E && c.n == 5 && !c.offs && c.details_ok);
  CHECK(c.stride_a == OUT * IN && c.stride_b == 5 * IN && c.stride_c == 5 * OUT);
  mt_grouped_call g;
  CHECK(mt_norm_grouped(&c, &g) == MT_R_ROUTED);
  CHECK(g.rows == 5 && !g.offs && g.x_stride == 5 * IN && g.y_stride == 5 * OUT);
  /* 3-D x 2-D: the output's columns vary by group */
  make(&b2, W, 2, IN, T, 0, T, 1, 0);
  make(&y4, Y, 2, 5, T, 0, T, 1, 0);
  CHECK(mt_torch_view(&api, &x3.t, &b2.t, &offs, &bias, &y4.t, &c) == MT_R_ROUTED);
  CHECK(c.ragged == MT_RAGGED_M && c.m == T && c.n == 5 && c.k == IN && c.details_ok);
}

static void odd_arguments(void) {
  tensor x, w_t, y, o;
  offs_tensor(&o);
  make(&x, X, 2, T, IN, 0, IN, 1, 0);
  make(&w_t, W, 3, E, IN, OUT, OUT * IN, 1, IN);
  make(&y, Y, 2, T, OUT, 0, OUT, 1, 0);
  fake_optional offs = some(&o), bias = none, odd = {o.t, 7};
  mt_call c;
  CHECK(mt_torch_view(&api, &x.t, &w_t.t, &odd, &bias, &y.t, &c) == MT_R_TORCH_ABI);
  /* offsets missing where the mode needs them (PyTorch refuses that before the kernel) */
  CHECK(mt_torch_view(&api, &x.t, &w_t.t, &none, &bias, &y.t, &c) == MT_R_ROUTED && !c.details_ok);
  /* no unit stride in the weight's matrix */
  w_t.impl.strides[1] = 2;
  CHECK(mt_torch_view(&api, &x.t, &w_t.t, &offs, &bias, &y.t, &c) == MT_R_ROUTED && !c.details_ok);
  w_t.impl.strides[1] = 1;
  /* a bias (which the real kernel ignores) is never routed */
  fake_optional with_bias = some(&o);
  CHECK(mt_torch_view(&api, &x.t, &w_t.t, &offs, &with_bias, &y.t, &c) == MT_R_ROUTED);
  CHECK(c.epilogue != CUBLASLT_EPILOGUE_DEFAULT && c.epilogue != CUBLASLT_EPILOGUE_BIAS);
  /* shapes that disagree */
  y.impl.sizes[1] = OUT + 8;
  CHECK(mt_torch_view(&api, &x.t, &w_t.t, &offs, &bias, &y.t, &c) == MT_R_ROUTED && !c.details_ok);
  /* a 1-D operand is no tensor of this call */
  x.impl.dim = 1;
  CHECK(mt_torch_view(&api, &x.t, &w_t.t, &offs, &bias, &y.t, &c) == MT_R_TORCH_ABI);
}

/* --- cuBLAS forms --------------------------------------------------------------------------- */

static const float one = 1.0f, zero = 0.0f, half = 0.5f;

static void strided_batch_record(void) {
  mt_call c;
  mt_norm_cublasGemmStridedBatchedEx(&c, NULL, CUBLAS_OP_T, CUBLAS_OP_N, OUT, 5, IN, &one, W,
                                     CUDA_R_16BF, IN, OUT * IN, X, CUDA_R_16BF, IN, 5 * IN, &half,
                                     Y, CUDA_R_16BF, OUT, 5 * OUT, E, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT);
  c.ptr_mode = MT_PTR_HOST, c.details = c.details_ok = 1, c.stream = (void *)0x42;
  mt_grouped_call g;
  CHECK(mt_norm_grouped(&c, &g) == MT_R_ROUTED);
  CHECK(g.groups == E && g.n == OUT && g.k == IN && g.rows == 5 && !g.offs);
  CHECK(g.w == W && g.w_stride == OUT * IN && g.ldw == IN);
  CHECK(g.x == X && g.x_stride == 5 * IN && g.ldx == IN);
  CHECK(g.y == Y && g.y_stride == 5 * OUT && g.ldy == OUT);
  CHECK(g.c == Y && g.c_stride == 5 * OUT && g.beta == 0.5f && g.alpha == 1.0f);
  CHECK(g.stream == (void *)0x42 && !g.w_ptrs && !g.x_ptrs && !g.y_ptrs && !g.c_ptrs);
}

static void pointer_array_records(void) {
  const void *a[E] = {0}, *b[E] = {0};
  void *y[E] = {0};
  mt_call c;
  mt_norm_cublasGemmBatchedEx(&c, NULL, CUBLAS_OP_T, CUBLAS_OP_N, OUT, 5, IN, &one, a, CUDA_R_16BF,
                              IN, b, CUDA_R_16BF, IN, &zero, y, CUDA_R_16BF, OUT, E,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  c.ptr_mode = MT_PTR_HOST, c.details = c.details_ok = 1;
  mt_grouped_call g;
  CHECK(mt_norm_grouped(&c, &g) == MT_R_ROUTED);
  CHECK(g.w_ptrs == (const void *const *)a && g.x_ptrs == (const void *const *)b);
  CHECK(g.y_ptrs == (void *const *)y && !g.c_ptrs && !g.w && !g.x && !g.y && g.rows == 5);
  /* beta != 0: C through the output array */
  mt_norm_cublasGemmBatchedEx(&c, NULL, CUBLAS_OP_T, CUBLAS_OP_N, OUT, 5, IN, &one, a, CUDA_R_16BF,
                              IN, b, CUDA_R_16BF, IN, &half, y, CUDA_R_16BF, OUT, E,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  CHECK(mt_norm_grouped(&c, &g) == MT_R_ROUTED && g.c_ptrs == (const void *const *)y);
}

/* cublasGemmGroupedBatchedEx: one segment per problem, in order; rows may differ by group, the
 * rest must agree. */
static void grouped_batched_records(void) {
  const void *a[E] = {0}, *b[E] = {0};
  void *y[E] = {0};
  int m[2] = {OUT, OUT}, n[2] = {5, 5}, k[2] = {IN, IN}, ld[2] = {IN, IN}, ldc[2] = {OUT, OUT};
  int size[2] = {1, E - 1};
  cublasOperation_t ta[2] = {CUBLAS_OP_T, CUBLAS_OP_T}, tb[2] = {CUBLAS_OP_N, CUBLAS_OP_N};
  float alpha[2] = {1, 1}, beta[2] = {0, 0};
  mt_call c;
  mt_grouped_call g;
#define GROUPED()                                                                                  \
  (mt_norm_cublasGemmGroupedBatchedEx(&c, NULL, ta, tb, m, n, k, alpha, a, CUDA_R_16BF, ld, b,     \
                                      CUDA_R_16BF, ld, beta, y, CUDA_R_16BF, ldc, 2, size,         \
                                      CUBLAS_COMPUTE_32F),                                         \
   c.ptr_mode = MT_PTR_HOST, c.details = c.details_ok = 1, mt_norm_grouped(&c, &g))
  CHECK(GROUPED() == MT_R_ROUTED);
  CHECK(g.call == &c && g.groups == E && g.rows == 5 && !g.group_rows && !g.offs);
  CHECK(g.n == OUT && g.k == IN && g.ldw == IN && g.ldx == IN && g.ldy == OUT);
  CHECK(g.w_ptrs == (const void *const *)a && g.x_ptrs == (const void *const *)b);
  CHECK(g.y_ptrs == (void *const *)y && !g.c_ptrs && !g.w && !g.x && !g.y);
  n[1] = 9; /* rows by group: from the call's arrays */
  CHECK(GROUPED() == MT_R_ROUTED);
  CHECK(g.groups == E && g.rows == 0 && g.group_rows && g.total_rows == 5 + 9 * (E - 1));
  size[1] = 0; /* an empty group adds nothing and differs in nothing */
  CHECK(GROUPED() == MT_R_ROUTED && g.groups == 1 && g.rows == 5 && !g.group_rows);
  size[0] = 0;
  CHECK(GROUPED() == MT_R_LAYOUT); /* no problem at all: cuBLAS's */
  size[0] = 1, size[1] = E - 1;
  beta[0] = beta[1] = 0.5f;
  CHECK(GROUPED() == MT_R_ROUTED && g.c_ptrs == (const void *const *)y && g.beta == 0.5f);
  beta[1] = 0.25f;
  CHECK(GROUPED() == MT_R_PTR_ARRAYS);
  beta[1] = 0.5f, alpha[1] = 2;
  CHECK(GROUPED() == MT_R_PTR_ARRAYS);
  alpha[1] = 1, ldc[1] = OUT + 8;
  CHECK(GROUPED() == MT_R_PTR_ARRAYS);
  ldc[1] = OUT, k[1] = ld[1] = 2 * IN;
  CHECK(GROUPED() == MT_R_PTR_ARRAYS);
  k[1] = ld[1] = IN, ta[1] = CUBLAS_OP_N;
  CHECK(GROUPED() == MT_R_PTR_ARRAYS);
#undef GROUPED
  /* the _64 form: its arrays are int64_t */
  int64_t m64[2] = {OUT, OUT}, n64[2] = {5, 9}, k64[2] = {IN, IN}, ld64[2] = {IN, IN};
  int64_t ldc64[2] = {OUT, OUT}, size64[2] = {1, E - 1};
  ta[1] = CUBLAS_OP_T;
  mt_norm_cublasGemmGroupedBatchedEx_64(&c, NULL, ta, tb, m64, n64, k64, alpha, a, CUDA_R_16BF,
                                        ld64, b, CUDA_R_16BF, ld64, beta, y, CUDA_R_16BF, ldc64, 2,
                                        size64, CUBLAS_COMPUTE_32F);
  c.ptr_mode = MT_PTR_HOST, c.details = c.details_ok = 1;
  CHECK(mt_norm_grouped(&c, &g) == MT_R_ROUTED && g.groups == E && g.group_rows &&
        g.total_rows == 5 + 9 * (E - 1) && g.n == OUT && g.k == IN && g.ldy == OUT);
}

/* cuBLASLt: the layouts' batch modes, one by one. */
static void lt_pointer_array_modes(void) {
  mt_call c = {.entry = MT_FN_cublasLtMatmul,
               .transa = CUBLAS_OP_T,
               .m = OUT,
               .n = 5,
               .k = IN,
               .a = W,
               .b = X,
               .c = Y,
               .d = mem[4],
               .lda = IN,
               .ldb = IN,
               .ldc = OUT,
               .ldd = OUT,
               .batch = E,
               .alpha = &one,
               .beta = &zero,
               .pointer_arrays = MT_PA_ALL};
  mt_grouped_call g;
  CHECK(mt_norm_grouped(&c, &g) == MT_R_ROUTED && g.y_ptrs == (void *const *)mem[4] && !g.c_ptrs);
  c.pointer_arrays = MT_PA_A | MT_PA_B | MT_PA_D; /* C not read at beta 0 */
  CHECK(mt_norm_grouped(&c, &g) == MT_R_ROUTED);
  c.beta = &half;
  CHECK(mt_norm_grouped(&c, &g) == MT_R_PTR_ARRAYS);
  c.pointer_arrays = MT_PA_ALL;
  CHECK(mt_norm_grouped(&c, &g) == MT_R_ROUTED && g.c_ptrs == (const void *const *)Y);
  c.pointer_arrays = MT_PA_B | MT_PA_C | MT_PA_D; /* A strided */
  CHECK(mt_norm_grouped(&c, &g) == MT_R_PTR_ARRAYS);
  c.pointer_arrays = MT_PA_ALL, c.epilogue = CUBLASLT_EPILOGUE_BIAS;
  CHECK(mt_norm_grouped(&c, &g) == MT_R_PTR_ARRAYS);
}

static void lt_batch_with_bias_record(void) {
  mt_call c = {.entry = MT_FN_cublasLtMatmul,
               .transa = CUBLAS_OP_T,
               .m = OUT,
               .n = 5,
               .k = IN,
               .atype = CUDA_R_16BF,
               .btype = CUDA_R_16BF,
               .ctype = CUDA_R_16BF,
               .dtype = CUDA_R_16BF,
               .a = W,
               .b = X,
               .c = Y,
               .d = mem[4],
               .lda = IN,
               .ldb = IN,
               .ldc = OUT,
               .ldd = OUT,
               .batch = E,
               .stride_a = OUT * IN,
               .stride_b = 5 * IN,
               .stride_c = 5 * OUT,
               .stride_d = 5 * OUT,
               .alpha = &one,
               .beta = &zero,
               .epilogue = CUBLASLT_EPILOGUE_BIAS,
               .bias = mem[5],
               .bias_type = CUDA_R_32F,
               .bias_stride = OUT};
  mt_grouped_call g;
  CHECK(mt_norm_grouped(&c, &g) == MT_R_ROUTED);
  CHECK(g.y == mem[4] && !g.c); /* beta 0: C is not read */
  CHECK(g.bias == mem[5] && g.bias_stride == OUT && g.bias_type == CUDA_R_32F);
  c.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  CHECK(mt_norm_grouped(&c, &g) == MT_R_ROUTED && !g.bias);
}

int main(void) {
  RUN(forward_view_and_its_record);
  RUN(backward_and_other_modes);
  RUN(odd_arguments);
  RUN(strided_batch_record);
  RUN(pointer_array_records);
  RUN(grouped_batched_records);
  RUN(lt_pointer_array_modes);
  RUN(lt_batch_with_bias_record);
  return mt_test_done();
}
