/* torch.c — the torch._grouped_mm hook (see torch.h). */
#include "shim/torch.h"

#include <stdatomic.h>
#include <stddef.h>
#include <string.h>

#include "base/log.h"
#include "shim/real.h"
#include "shim/shim.h"

#define MT_EXPORT __attribute__((visibility("default")))

/* Exported under the symbol of hooks.def's MT_HAND line (tests/cpu/test_exports.sh compares
 * them). */
MT_EXPORT void
mt_torch_grouped_mm(void *mat_a, void *mat_b, void *offs, void *bias, void *out) __asm__(
    "_ZN2at4cuda6detail19bf16bf16_grouped_mmENS_6TensorES2_St8optionalIS2_ES4_RS2_");

/* --- reading the arguments ---------------------------------------------------------------- */

typedef struct {
  void *data;
  int64_t dim;
  const int64_t *size, *stride;
  int32_t dtype;
} tensor;

static int read_tensor(const mt_torch_api *api, void *t, tensor *out) {
  int64_t *size, *stride;
  memset(out, 0, sizeof *out);
  /* dim first: it never fails, and a dim out of 1..3 means this is no tensor of the real call's */
  if (api->dim(t, &out->dim) || out->dim < 1 || out->dim > 3 || api->sizes(t, &size) ||
      api->strides(t, &stride) || api->dtype(t, &out->dtype) || api->data_ptr(t, &out->data))
    return -1;
  out->size = size, out->stride = stride;
  return 0;
}

/* libstdc++'s std::optional<at::Tensor>: the Tensor (an intrusive pointer), then the flag. 0 or 1,
 * or -1 for any other byte: another layout. */
static int engaged(const void *opt) {
  unsigned char flag;
  memcpy(&flag, (const char *)opt + sizeof(void *), 1);
  return flag <= 1 ? flag : -1;
}

static int cuda_type(const mt_torch_api *api, int32_t dtype) {
  return dtype == api->bf16   ? CUDA_R_16BF
         : dtype == api->fp16 ? CUDA_R_16F
         : dtype == api->fp32 ? CUDA_R_32F
                              : -1;
}

static int64_t last(const int64_t *v, int64_t dim, int back) { return v[dim - back]; }

/* A group's matrix (the last two dims) in cuBLAS's column-major terms: op N when row-major (as the
 * real kernel decides: stride(-1) == 1), op T when column-major, with its leading dimension. */
static int matrix_op(const tensor *t, int *op, int64_t *ld) {
  if (last(t->stride, t->dim, 1) == 1) {
    *op = MT_OP_N, *ld = last(t->stride, t->dim, 2);
    return 0;
  }
  *op = 1, *ld = last(t->stride, t->dim, 1);
  return last(t->stride, t->dim, 2) == 1 ? 0 : -1;
}

static const float one = 1.0f, zero = 0.0f;

/* The dims, batch and strides of each mode (torch.h); 0, or -1 when the shapes disagree. */
static int mode_dims(const tensor *a, const tensor *b, const tensor *o, mt_call *c) {
  if (a->dim == 2 && b->dim == 3) {
    c->batch = b->size[0], c->ragged = MT_RAGGED_N;
    c->m = b->size[2], c->n = a->size[0], c->k = a->size[1];
    c->stride_a = b->stride[0];
    return b->size[1] == c->k && o->dim == 2 && o->size[0] == c->n && o->size[1] == c->m ? 0 : -1;
  }
  if (a->dim == 3 && b->dim == 3) {
    c->batch = a->size[0];
    c->m = b->size[2], c->n = a->size[1], c->k = a->size[2];
    c->stride_a = b->stride[0], c->stride_b = a->stride[0];
    c->stride_c = c->stride_d = o->dim == 3 ? o->stride[0] : 0;
    return b->size[0] == c->batch && b->size[1] == c->k && o->dim == 3 && o->size[0] == c->batch &&
                   o->size[1] == c->n && o->size[2] == c->m
               ? 0
               : -1;
  }
  if (a->dim == 2 && b->dim == 2) {
    c->ragged = MT_RAGGED_K; /* batch: the offsets' length */
    c->m = b->size[1], c->n = a->size[0], c->k = a->size[1];
    c->stride_c = c->stride_d = o->dim == 3 ? o->stride[0] : 0;
    return b->size[0] == c->k && o->dim == 3 && o->size[1] == c->n && o->size[2] == c->m ? 0 : -1;
  }
  if (a->dim == 3 && b->dim == 2) {
    c->batch = a->size[0], c->ragged = MT_RAGGED_M;
    c->m = b->size[1], c->n = a->size[1], c->k = a->size[2];
    c->stride_b = a->stride[0];
    return b->size[0] == c->k && o->dim == 2 && o->size[0] == c->n && o->size[1] == c->m ? 0 : -1;
  }
  return -1;
}

/* The offsets of a ragged mode: a 1-D int32 tensor of one end per group. */
static int read_offs(const mt_torch_api *api, void *offs, int on, mt_call *c) {
  tensor t;
  if (!c->ragged)
    return on ? -1 : 0;
  if (!on || read_tensor(api, offs, &t) || t.dim != 1 || t.dtype != api->int32)
    return -1;
  if (c->ragged == MT_RAGGED_K)
    c->batch = t.size[0];
  c->offs = t.data;
  return t.size[0] == c->batch ? 0 : -1;
}

/* The current stream of out's device, which the real kernel runs on. */
static int read_stream(const mt_torch_api *api, void *out, mt_call *c) {
  int32_t device;
  if (api->device_index(out, &device) || api->current_stream(device, &c->stream))
    return -1;
  c->device = device;
  return 0;
}

enum mt_reason mt_torch_view(const mt_torch_api *api, void *mat_a, void *mat_b, void *offs,
                             void *bias, void *out, mt_call *c) {
  int on = engaged(offs), bn = engaged(bias);
  tensor a, b, o;
  if (on < 0 || bn < 0 || read_tensor(api, mat_a, &a) || read_tensor(api, mat_b, &b) ||
      read_tensor(api, out, &o) || a.dim < 2 || b.dim < 2 || o.dim < 2)
    return MT_R_TORCH_ABI;
  *c = (mt_call){
      .entry = MT_FN_torch_grouped_mm,
      .atype = cuda_type(api, b.dtype),
      .btype = cuda_type(api, a.dtype),
      .ctype = cuda_type(api, o.dtype),
      .dtype = cuda_type(api, o.dtype),
      .compute = CUBLAS_COMPUTE_32F,
      .scale_type = -1,
      .a = b.data,
      .b = a.data,
      .c = o.data,
      .d = o.data,
      .batch = 1,
      .algo = -1,
      .alpha = &one,
      .beta = &zero,
      .ptr_mode = MT_PTR_HOST,
      .device = -1,
      /* the real kernel takes no bias (PyTorch refuses one before it): never routed with one */
      .epilogue = bn ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_DEFAULT,
      .bias_type = -1,
      .details = 1,
      .details_ok = 1,
  };
  int op_o;
  if (matrix_op(&b, &c->transa, &c->lda) || matrix_op(&a, &c->transb, &c->ldb) ||
      matrix_op(&o, &op_o, &c->ldc) || op_o != MT_OP_N)
    c->details_ok = 0;
  c->ldd = c->ldc;
  if (mode_dims(&a, &b, &o, c) || read_offs(api, offs, on, c) || read_stream(api, out, c))
    c->details_ok = 0;
  return MT_R_ROUTED;
}

/* --- finding libtorch's accessors ----------------------------------------------------------- */

static const struct {
  const char *name;
  size_t offset;
} accessors[] = {
    {"aoti_torch_get_data_ptr", offsetof(mt_torch_api, data_ptr)},
    {"aoti_torch_get_dim", offsetof(mt_torch_api, dim)},
    {"aoti_torch_get_sizes", offsetof(mt_torch_api, sizes)},
    {"aoti_torch_get_strides", offsetof(mt_torch_api, strides)},
    {"aoti_torch_get_dtype", offsetof(mt_torch_api, dtype)},
    {"aoti_torch_get_device_index", offsetof(mt_torch_api, device_index)},
    {"aoti_torch_get_current_cuda_stream", offsetof(mt_torch_api, current_stream)},
};

static const struct {
  const char *name;
  size_t offset;
} dtypes[] = {
    {"aoti_torch_dtype_bfloat16", offsetof(mt_torch_api, bf16)},
    {"aoti_torch_dtype_float16", offsetof(mt_torch_api, fp16)},
    {"aoti_torch_dtype_float32", offsetof(mt_torch_api, fp32)},
    {"aoti_torch_dtype_int32", offsetof(mt_torch_api, int32)},
};

/* NULL when every accessor is there, else the name of the first one missing. */
static const char *resolve(const void *real, mt_torch_api *api) {
  for (size_t i = 0; i < sizeof accessors / sizeof accessors[0]; i++) {
    void *f = mt_real_beside(real, accessors[i].name);
    if (!f)
      return accessors[i].name;
    memcpy((char *)api + accessors[i].offset, &f, sizeof f);
  }
  for (size_t i = 0; i < sizeof dtypes / sizeof dtypes[0]; i++) {
    int32_t (*f)(void) = (int32_t(*)(void))mt_real_beside(real, dtypes[i].name);
    if (!f)
      return dtypes[i].name;
    int32_t code = f();
    memcpy((char *)api + dtypes[i].offset, &code, sizeof code);
  }
  return NULL;
}

/* The accessors, looked up at the first call. No lock, so that a fork can never copy one held:
 * each thread that finds them not yet published looks them up itself (the lookups are pure and
 * give every thread the same answer) and uses its own copy for its call; the first to claim the
 * slot publishes its copy and warns. A fork in the middle of publishing leaves a child that looks
 * them up at each call, no more. */
static mt_torch_api api;
static atomic_int api_claimed;
static atomic_int api_state; /* 0 not published yet, 1 complete, -1 incomplete (warned) */

static const mt_torch_api *api_get(const void *real, mt_torch_api *mine) {
  int state = atomic_load_explicit(&api_state, memory_order_acquire);
  if (state)
    return state > 0 ? &api : NULL;
  const char *missing = resolve(real, mine);
  if (!atomic_exchange(&api_claimed, 1)) {
    if (missing)
      MT_WARN("libtorch has no %s (a PyTorch other than 2.9-2.13?): torch._grouped_mm calls "
              "pass through unread, counted as \"torch abi\"; cuBLAS calls are still seen",
              missing);
    api = *mine;
    atomic_store_explicit(&api_state, missing ? -1 : 1, memory_order_release);
  }
  return missing ? NULL : mine;
}

/* --- the hook -------------------------------------------------------------------------------- */

/* The real function: the known one, else the one the calling library (libtorch_cuda.so, through
 * its PLT) itself defines, whatever scope it was loaded in. */
static mt_fn_torch_grouped_mm real_of(const void *caller) {
  void *p = mt_real(MT_FN_torch_grouped_mm);
  return (mt_fn_torch_grouped_mm)(p ? p : mt_real_near(MT_FN_torch_grouped_mm, caller));
}

/* 1 when the engine ran the call; 0 when the real function must. */
static int active_call(mt_fn_torch_grouped_mm real, void *mat_a, void *mat_b, void *offs,
                       void *bias, void *out) {
  mt_torch_api mine;
  const mt_torch_api *a = api_get((const void *)real, &mine);
  mt_call c;
  if (!a || mt_torch_view(a, mat_a, mat_b, offs, bias, out, &c) == MT_R_TORCH_ABI) {
    if (a)
      MT_WARN_ONCE("torch._grouped_mm's arguments do not read as libstdc++'s std::optional and "
                   "at::Tensor: such calls pass through unread, counted as \"torch abi\"");
    mt_shim_unread(MT_R_TORCH_ABI);
    return 0;
  }
  cublasStatus_t status;
  return mt_shim_begin(&c, &status);
}

__attribute__((noinline)) static void slow(void *mat_a, void *mat_b, void *offs, void *bias,
                                           void *out, const void *caller) {
  mt_fn_torch_grouped_mm real = real_of(caller);
  if (!real) {
    MT_WARN_ONCE("cannot find the real at::cuda::detail::bf16bf16_grouped_mm: torch._grouped_mm "
                 "calls return without computing. Remove libminite.so from LD_PRELOAD");
    return;
  }
  if (mt_shim_active() && active_call(real, mat_a, mat_b, offs, bias, out))
    return;
  real(mat_a, mat_b, offs, bias, out);
}

void mt_torch_grouped_mm(void *mat_a, void *mat_b, void *offs, void *bias, void *out) {
  mt_fn_torch_grouped_mm real = MT_REAL_KNOWN(torch_grouped_mm);
  if (__builtin_expect(real && !mt_shim_active(), 1)) {
    real(mat_a, mat_b, offs, bias, out);
    return;
  }
  slow(mat_a, mat_b, offs, bias, out, __builtin_return_address(0));
}
