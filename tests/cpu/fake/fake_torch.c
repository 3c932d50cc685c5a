/* fake_torch.c — a fake libtorch_cuda.so for the CPU tests of the torch._grouped_mm hook: the
 * kernel entry at::cuda::detail::bf16bf16_grouped_mm under its mangled name (it computes
 * torch._grouped_mm on host memory in every mode, and records the five pointers it received), the
 * op that calls it through the PLT as libtorch_cuda does, and libtorch's AOTInductor C accessors on
 * fake tensors (fake_torch.h). Built with -DFAKE_TORCH_NO_STREAM it lacks
 * aoti_torch_get_current_cuda_stream, as another PyTorch version might.
 */
#include <stdint.h>
#include <string.h>

#include "tests/cpu/fake/fake.h"
#include "tests/cpu/fake/fake_torch.h"

#define EXPORT __attribute__((visibility("default")))

static fake_torch_record last;
static void *current_stream = (void *)(uintptr_t)0x7000;

EXPORT void fake_torch_last(fake_torch_record *out) { *out = last; }
EXPORT void fake_torch_set_stream(void *stream) { current_stream = stream; }

/* --- torch._grouped_mm on the host ------------------------------------------------------------ */

static int cuda_type(int32_t dtype) {
  return dtype == FAKE_TORCH_BF16   ? CUDA_R_16BF
         : dtype == FAKE_TORCH_FP16 ? CUDA_R_16F
                                    : CUDA_R_32F;
}

/* A matrix inside a tensor: element (i, j) at offset + i * rs + j * cs. */
typedef struct {
  const fake_impl *t;
  int64_t offset, rows, cols, rs, cs;
} view;

static view view_of(const fake_impl *t, int64_t offset, int64_t rows, int64_t cols) {
  return (view){t, offset, rows, cols, t->strides[t->dim - 2], t->strides[t->dim - 1]};
}

static void matmul(view a, view b, view o) {
  for (int64_t i = 0; i < o.rows; i++)
    for (int64_t j = 0; j < o.cols; j++) {
      float acc = 0;
      for (int64_t l = 0; l < a.cols; l++)
        acc += fake_load(a.t->data, cuda_type(a.t->dtype), a.offset + i * a.rs + l * a.cs) *
               fake_load(b.t->data, cuda_type(b.t->dtype), b.offset + l * b.rs + j * b.cs);
      fake_store(o.t->data, cuda_type(o.t->dtype), o.offset + i * o.rs + j * o.cs, acc);
    }
}

/* Group g: its range [s, e) of the ragged dimension (offs are each group's end). */
static void group(const fake_impl *a, const fake_impl *b, const int32_t *offs, fake_impl *o,
                  int64_t g) {
  int64_t s = offs && g ? offs[g - 1] : 0, e = offs ? offs[g] : 0;
  int64_t k = a->sizes[a->dim - 1], n = b->sizes[b->dim - 1];
  if (a->dim == 2 && b->dim == 3)
    matmul(view_of(a, s * a->strides[0], e - s, k), view_of(b, g * b->strides[0], k, n),
           view_of(o, s * o->strides[0], e - s, n));
  else if (a->dim == 3 && b->dim == 3)
    matmul(view_of(a, g * a->strides[0], a->sizes[1], k), view_of(b, g * b->strides[0], k, n),
           view_of(o, g * o->strides[0], a->sizes[1], n));
  else if (a->dim == 2 && b->dim == 2)
    matmul(view_of(a, s * a->strides[1], a->sizes[0], e - s),
           view_of(b, s * b->strides[0], e - s, n), view_of(o, g * o->strides[0], a->sizes[0], n));
  else
    matmul(view_of(a, g * a->strides[0], a->sizes[1], k), view_of(b, s * b->strides[1], k, e - s),
           view_of(o, s * o->strides[1], a->sizes[1], e - s));
}

/* The kernel entry: at::cuda::detail::bf16bf16_grouped_mm(Tensor, Tensor, optional<Tensor>,
 * optional<Tensor>, Tensor&). */
EXPORT void
fake_bf16bf16_grouped_mm(void *mat_a, void *mat_b, void *offs, void *bias, void *out) __asm__(
    "_ZN2at4cuda6detail19bf16bf16_grouped_mmENS_6TensorES2_St8optionalIS2_ES4_RS2_");

void fake_bf16bf16_grouped_mm(void *mat_a, void *mat_b, void *offs, void *bias, void *out) {
  void *args[5] = {mat_a, mat_b, offs, bias, out};
  memcpy(last.args, args, sizeof args);
  last.calls++;
  const fake_impl *a = ((fake_tensor *)mat_a)->impl, *b = ((fake_tensor *)mat_b)->impl;
  const fake_optional *o = offs;
  fake_impl *y = ((fake_tensor *)out)->impl;
  const int32_t *ends = o->engaged ? o->value.impl->data : NULL;
  int64_t groups = a->dim == 3 ? a->sizes[0] : b->dim == 3 ? b->sizes[0] : o->value.impl->sizes[0];
  for (int64_t g = 0; g < groups; g++)
    group(a, b, ends, y, g);
}

/* The same entry under a name the tests call directly, for the result without the shim. */
EXPORT __typeof__(fake_bf16bf16_grouped_mm) fake_own_grouped_mm __attribute__((
    alias("_ZN2at4cuda6detail19bf16bf16_grouped_mmENS_6TensorES2_St8optionalIS2_ES4_RS2_")));

/* at::native::_grouped_mm_cuda's call: by-value arguments are the caller's temporaries, passed by
 * address (Itanium C++ ABI), through the PLT (the entry is exported and interposable). */
EXPORT void fake_torch_grouped_mm_op(const fake_tensor *a, const fake_tensor *b,
                                     const fake_optional *offs, const fake_optional *bias,
                                     fake_tensor *out, void *passed[5]) {
  fake_tensor ta = *a, tb = *b;
  fake_optional toffs = *offs, tbias = *bias;
  void *args[5] = {&ta, &tb, &toffs, &tbias, out};
  memcpy(passed, args, sizeof args);
  fake_bf16bf16_grouped_mm(&ta, &tb, &toffs, &tbias, out);
}

/* --- the AOTInductor C accessors -------------------------------------------------------------- */

#define IMPL(t) (((fake_tensor *)(t))->impl)

EXPORT int32_t aoti_torch_get_data_ptr(void *t, void **out) {
  *out = IMPL(t)->data;
  return 0;
}

EXPORT int32_t aoti_torch_get_dim(void *t, int64_t *out) {
  *out = IMPL(t)->dim;
  return 0;
}

EXPORT int32_t aoti_torch_get_sizes(void *t, int64_t **out) {
  *out = IMPL(t)->sizes;
  return 0;
}

EXPORT int32_t aoti_torch_get_strides(void *t, int64_t **out) {
  *out = IMPL(t)->strides;
  return 0;
}

EXPORT int32_t aoti_torch_get_dtype(void *t, int32_t *out) {
  *out = IMPL(t)->dtype;
  return 0;
}

EXPORT int32_t aoti_torch_get_device_index(void *t, int32_t *out) {
  *out = IMPL(t)->device;
  return 0;
}

#ifndef FAKE_TORCH_NO_STREAM
EXPORT int32_t aoti_torch_get_current_cuda_stream(int32_t device, void **out) {
  *out = (char *)current_stream + device;
  return 0;
}
#endif

EXPORT int32_t aoti_torch_dtype_bfloat16(void) { return FAKE_TORCH_BF16; }
EXPORT int32_t aoti_torch_dtype_float16(void) { return FAKE_TORCH_FP16; }
EXPORT int32_t aoti_torch_dtype_float32(void) { return FAKE_TORCH_FP32; }
EXPORT int32_t aoti_torch_dtype_int32(void) { return FAKE_TORCH_INT32; }
