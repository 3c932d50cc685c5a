/* fake_torch.h — what the fake libtorch_cuda.so (tests/cpu/fake/fake_torch.c) and the CPU tests of
 * the torch._grouped_mm hook share: a tensor laid out as libtorch's is where the shim looks
 * (at::Tensor is one pointer to its TensorImpl; libstdc++'s std::optional<at::Tensor> is that
 * pointer, then the engaged flag), PyTorch's dtype codes, and the fake's test functions.
 *
 * "Device" memory is host memory here: the fake computes torch._grouped_mm on the host, so that a
 * test can compare results bit for bit with and without the shim.
 */
#ifndef MT_FAKE_TORCH_H
#define MT_FAKE_TORCH_H

#include <stdint.h>

/* c10::ScalarType values */
#define FAKE_TORCH_INT32 3
#define FAKE_TORCH_FP16 5
#define FAKE_TORCH_FP32 6
#define FAKE_TORCH_BF16 15

typedef struct {
  void *data;
  int64_t dim;
  int64_t sizes[3], strides[3];
  int32_t dtype, device;
} fake_impl;

typedef struct {
  fake_impl *impl;
} fake_tensor; /* at::Tensor: an intrusive pointer */

typedef struct {
  fake_tensor value;
  unsigned char engaged; /* 0 or 1; anything else is what another ABI might look like */
} fake_optional;         /* std::optional<at::Tensor>, libstdc++ */

/* The five pointers the real bf16bf16_grouped_mm received last, and its calls so far. */
typedef struct {
  void *args[5];
  long calls;
} fake_torch_record;

/* torch._grouped_mm's op as libtorch_cuda runs it: temporaries of the arguments, then the kernel
 * entry through the PLT. passed[] receives the five pointers it passed. */
typedef void (*fake_torch_op_fn)(const fake_tensor *a, const fake_tensor *b,
                                 const fake_optional *offs, const fake_optional *bias,
                                 fake_tensor *out, void *passed[5]);
typedef void (*fake_torch_last_fn)(fake_torch_record *out);
/* The kernel entry itself (fake_own_grouped_mm: its computation without any hook). */
typedef void (*fake_torch_entry_fn)(void *mat_a, void *mat_b, void *offs, void *bias, void *out);
/* The stream aoti_torch_get_current_cuda_stream reports from now on. */
typedef void (*fake_torch_set_stream_fn)(void *stream);

#endif
