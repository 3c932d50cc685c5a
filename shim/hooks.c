/* hooks.c — the exported cuBLAS entry points, one per MT_HOOK line of hooks.def.
 *
 * Inert: one load for the real function, one for the state, a branch, the call (about 9 ns over
 * a direct call, `make bench-shim`: lab/NOTES.md, "Shim and instrument overhead"). Active: the
 * call is normalised into a record, and mt_shim_begin either runs it (the engine) or leaves it
 * to the real function, which always receives the caller's arguments untouched.
 */
#include "shim/norm.h"
#include "shim/real.h"
#include "shim/shim.h"

#define MT_EXPORT __attribute__((visibility("default")))

/* Set while a hook of this thread is inside the real cuBLAS: should one cuBLAS entry point ever
 * call another through its PLT (libcublas calling cublasLtMatmul), the inner call goes straight
 * through, so that one GEMM is never counted or routed twice. Initial-exec TLS: the library is
 * preloaded, so its TLS is in the static block and costs one memory access. */
static _Thread_local int in_real __attribute__((tls_model("initial-exec")));

/* Everything but the common case lives in a function of its own — the first lookup, a missing
 * real function, the active path — so that the inert hook holds no call but the real one. */
#define MT_HOOK(name, lib, params, ...)                                                            \
  __attribute__((noinline)) static cublasStatus_t slow_##name params {                             \
    mt_fn_##name real = MT_REAL_FN(name);                                                          \
    if (!real)                                                                                     \
      return mt_real_missing(MT_FN_##name);                                                        \
    if (!mt_shim_active() || in_real)                                                              \
      return real(__VA_ARGS__);                                                                    \
    mt_call call;                                                                                  \
    cublasStatus_t status;                                                                         \
    mt_norm_##name(&call, __VA_ARGS__);                                                            \
    in_real = 1;                                                                                   \
    if (!mt_shim_begin(&call, &status))                                                            \
      status = real(__VA_ARGS__);                                                                  \
    in_real = 0;                                                                                   \
    return status;                                                                                 \
  }                                                                                                \
  MT_EXPORT cublasStatus_t name params {                                                           \
    mt_fn_##name real = MT_REAL_KNOWN(name);                                                       \
    if (__builtin_expect(real && !mt_shim_active(), 1))                                            \
      return real(__VA_ARGS__);                                                                    \
    return slow_##name(__VA_ARGS__);                                                               \
  }
#include "shim/hooks.def"
