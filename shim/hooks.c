/* hooks.c — the exported cuBLAS entry points, one per MT_HOOK line of hooks.def.
 *
 * Inert: one load for the real function, one for the state, a branch, a tail call. Active: the
 * call is normalised into a record, and mt_shim_begin either runs it (the engine) or leaves it
 * to the real function, which always receives the caller's arguments untouched.
 */
#include "shim/norm.h"
#include "shim/real.h"
#include "shim/shim.h"

#define MT_EXPORT __attribute__((visibility("default")))

#define MT_HOOK(name, lib, params, ...)                                                            \
  MT_EXPORT cublasStatus_t name params {                                                           \
    mt_fn_##name real = MT_REAL_FN(name);                                                          \
    if (!real)                                                                                     \
      return mt_real_missing(MT_FN_##name);                                                        \
    if (!mt_shim_active())                                                                         \
      return real(__VA_ARGS__);                                                                    \
    mt_call call;                                                                                  \
    cublasStatus_t status;                                                                         \
    mt_norm_##name(&call, __VA_ARGS__);                                                            \
    if (mt_shim_begin(&call, &status))                                                             \
      return status;                                                                               \
    return real(__VA_ARGS__);                                                                      \
  }
#define MT_REAL(name, lib, ret, params)
#include "shim/hooks.def"
#undef MT_HOOK
#undef MT_REAL
