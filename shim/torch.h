/* torch.h — the hook of torch._grouped_mm's sm90 BF16 kernel entry, the one MoE front door of
 * PyTorch that never reaches cuBLAS (HF transformers' default "grouped_mm" experts; docs/design.md,
 * "Interposition facts measured on the H200").
 *
 * PyTorch 2.9-2.13 run a BF16 torch._grouped_mm on sm90 through
 *   void at::cuda::detail::bf16bf16_grouped_mm(at::Tensor mat_a, at::Tensor mat_b,
 *       std::optional<at::Tensor> offs, std::optional<at::Tensor> bias, at::Tensor& out)
 * exported by libtorch_cuda.so and called through its PLT, so the preloaded definition (hooks.def,
 * MT_HAND torch_grouped_mm) receives the call. Under the Itanium C++ ABI the two tensors and the
 * two optionals, classes with non-trivial copies, are passed as pointers to the caller's
 * temporaries, and the void return takes no hidden pointer: the hook is a C function of five
 * pointers and forwards exactly those five to the real function. It holds no lock and leaves no
 * state behind across the real call, so a C++ exception from it unwinds through the hook's frame
 * (unwind tables are on by default) with nothing to undo.
 *
 * The tensors are read through libtorch's AOTInductor C shim (torch/csrc/inductor/aoti_torch/c/
 * shim.h: a stable C ABI on at::Tensor* handles), found at the first call by dlsym in the library
 * that defines the real function. A std::optional<at::Tensor> is libstdc++'s: the Tensor (one
 * pointer) first, then the engaged flag. If an accessor is missing, or that flag is neither 0 nor
 * 1, one warning, and every call passes through counted as "torch abi". The library never links
 * libtorch: in a process without torch the hook is never reached.
 *
 * The modes of torch._grouped_mm (offs: device int32, each group's end, cumulative), in cuBLAS's
 * terms (call.h: A = mat_b's groups, B = mat_a's, C = out's; op T where a matrix is column-major):
 *   2-D x 3-D, offs  mat_a [sum M_g, K], mat_b [G, K, N], out [sum M_g, N]: n = tokens varies. The
 *                    MoE forward is x . W^T with mat_b = W.transpose(-2, -1) (TN, m = out,
 *                    k = in); its dgrad is grad . W (NN, m = in, k = out).
 *   3-D x 3-D        mat_a [G, M, K], mat_b [G, K, N], out [G, M, N]: a batch.
 *   2-D x 2-D, offs  mat_a [M, sum K_g], mat_b [sum K_g, N], out [G, M, N]: k varies. The wgrad,
 *                    dy^T . x per expert (NT, m = in, n = out).
 *   3-D x 2-D, offs  mat_a [G, M, K], mat_b [K, sum N_g], out [M, sum N_g]: m varies (no role).
 * Forward expert calls whose weight shape the spec routes go to the grouped engine (shim/exec.h);
 * backward and anything else go to the real function, counted by reason.
 */
#ifndef MT_TORCH_H
#define MT_TORCH_H

#include <stdint.h>

#include "shim/call.h"
#include "shim/router.h"

/* libtorch's accessors (AOTITorchError: 0 is success), and the dtype codes it reports. */
typedef struct {
  int32_t (*data_ptr)(void *tensor, void **out);
  int32_t (*dim)(void *tensor, int64_t *out);
  int32_t (*sizes)(void *tensor, int64_t **out);
  int32_t (*strides)(void *tensor, int64_t **out);
  int32_t (*dtype)(void *tensor, int32_t *out);
  int32_t (*device_index)(void *tensor, int32_t *out);
  int32_t (*current_stream)(int32_t device, void **out);
  int32_t bf16, fp16, fp32, int32;
} mt_torch_api;

/* One call's arguments as a call record in cuBLAS's terms (entry "torch grouped_mm", batch = the
 * groups, ragged and offs as the mode says, alpha 1 and beta 0 on the host, the current stream of
 * out's device). MT_R_ROUTED when read (a layout the real kernel would not take is recorded with
 * details_ok = 0); MT_R_TORCH_ABI when the arguments do not read as this ABI's. */
enum mt_reason mt_torch_view(const mt_torch_api *api, void *mat_a, void *mat_b, void *offs,
                             void *bias, void *out, mt_call *c);

#endif
