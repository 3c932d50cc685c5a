/* real.h — finding the real functions behind the hooks.
 *
 * Each function listed in hooks.def is looked up once, on first use, and cached in an atomic
 * pointer: the hot path is one acquire load. The lookup tries dlsym(RTLD_NEXT) (the library linked
 * into the program or loaded RTLD_GLOBAL), then the copy that is already loaded, by soname (dlopen
 * RTLD_NOLOAD: PyTorch loads cuBLAS with RTLD_LOCAL, where RTLD_NEXT finds nothing). It never
 * loads a library itself: a second cuBLAS would be a second cuBLAS state.
 *
 * The shim exports dlsym and dlvsym (shim/dl.c), so its own lookups must not go through them: every
 * lookup here uses the loader's own functions (base/loader.h).
 */
#ifndef MT_REAL_H
#define MT_REAL_H

#include <stdatomic.h>

#include "base/loader.h"
#include <cuda.h>

#include "shim/cuda_api.h"

enum mt_fn {
#define MT_HOOK(name, lib, params, ...) MT_FN_##name,
#define MT_REAL(name, lib, ret, params) MT_FN_##name,
#define MT_HAND(name, symbol, lib, display, ret, params) MT_FN_##name,
#define MT_DRIVER(name, ret, params) MT_FN_##name,
#define MT_KERNEL(name, display) MT_FN_##name,
#include "shim/hooks.def"
  MT_FN_COUNT
};

#define MT_HOOK(name, lib, params, ...) typedef cublasStatus_t(*mt_fn_##name) params;
#define MT_REAL(name, lib, ret, params) typedef ret(*mt_fn_##name) params;
#define MT_HAND(name, symbol, lib, display, ret, params) typedef ret(*mt_fn_##name) params;
#define MT_DRIVER(name, ret, params) typedef ret(*mt_fn_##name) params;
#include "shim/hooks.def"

extern void *_Atomic mt_real_ptr[MT_FN_COUNT];

/* The dynamic loader's dlsym or dlvsym (id MT_FN_dlsym, MT_FN_dlvsym) for the shim's own to forward
 * to, found on first use and cached as every real function is; NULL when absent
 * (MT_BEFORE_INIT). */
void *mt_real_loader(enum mt_fn id);

/* The slow path of mt_real: look the function up; NULL when it is nowhere. */
void *mt_real_find(enum mt_fn id);

static inline void *mt_real(enum mt_fn id) {
  void *p = atomic_load_explicit(&mt_real_ptr[id], memory_order_acquire);
  return p ? p : mt_real_find(id);
}

/* The typed real function, e.g. MT_REAL_FN(cublasGemmEx)(handle, ...). */
#define MT_REAL_FN(name) ((mt_fn_##name)mt_real(MT_FN_##name))

/* The typed real function when it is known already, else NULL: a hook's fast path, one acquire
 * load and no call. */
#define MT_REAL_KNOWN(name)                                                                        \
  ((mt_fn_##name)atomic_load_explicit(&mt_real_ptr[MT_FN_##name], memory_order_acquire))

/* The real function `id` as the object holding `addr` sees it (its own definition or one of its
 * dependencies'), adopted as the real function when none is known yet: for a hook reached from a
 * library that is neither global nor loaded under a known soname. NULL when not found. */
void *mt_real_near(enum mt_fn id, const void *addr);

/* `p`, the definition of `id` that a lookup by handle found, made the real function when none is
 * known yet. Returns the real function in force afterwards (p, or the one known before). */
void *mt_real_adopt(enum mt_fn id, void *p);

/* The symbol `name` as the object that defines `fn` sees it (its scope: itself and its
 * dependencies), through the loader's own dlsym; NULL when absent. */
void *mt_real_beside(const void *fn, const char *name);

/* What a cuBLAS hook returns when its real function cannot be found: warns once per function. */
cublasStatus_t mt_real_missing(enum mt_fn id);

/* The same for a driver hook (a program that calls the driver has it loaded: this cannot happen in
 * one that runs). */
CUresult mt_real_driver_missing(enum mt_fn id);

/* The name in logs and statistics ("cublasGemmEx", "torch grouped_mm"). */
const char *mt_fn_name(enum mt_fn id);

#endif
