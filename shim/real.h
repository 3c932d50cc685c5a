/* real.h — finding the real cuBLAS functions behind the hooks.
 *
 * Each function listed in hooks.def is looked up once, on first use, and cached in an atomic
 * pointer: the hot path is one acquire load. The lookup tries dlsym(RTLD_NEXT) (cuBLAS linked
 * into the program or loaded RTLD_GLOBAL), then the copy of cuBLAS that is already loaded, by
 * soname (dlopen RTLD_NOLOAD: PyTorch loads cuBLAS with RTLD_LOCAL, where RTLD_NEXT finds
 * nothing). It never loads cuBLAS itself: a second copy would be a second cuBLAS state.
 */
#ifndef MT_REAL_H
#define MT_REAL_H

#include <stdatomic.h>

#include "shim/cuda_api.h"

enum mt_fn {
#define MT_HOOK(name, lib, params, ...) MT_FN_##name,
#define MT_REAL(name, lib, ret, params) MT_FN_##name,
#include "shim/hooks.def"
#undef MT_HOOK
#undef MT_REAL
  MT_FN_COUNT
};

#define MT_HOOK(name, lib, params, ...) typedef cublasStatus_t(*mt_fn_##name) params;
#define MT_REAL(name, lib, ret, params) typedef ret(*mt_fn_##name) params;
#include "shim/hooks.def"
#undef MT_HOOK
#undef MT_REAL

extern void *_Atomic mt_real_ptr[MT_FN_COUNT];

/* The slow path of mt_real: look the function up; NULL when it is nowhere. */
void *mt_real_find(enum mt_fn id);

static inline void *mt_real(enum mt_fn id) {
  void *p = atomic_load_explicit(&mt_real_ptr[id], memory_order_acquire);
  return p ? p : mt_real_find(id);
}

/* The typed real function, e.g. MT_REAL_FN(cublasGemmEx)(handle, ...). */
#define MT_REAL_FN(name) ((mt_fn_##name)mt_real(MT_FN_##name))

/* What a hook returns when its real function cannot be found: warns once per function. */
cublasStatus_t mt_real_missing(enum mt_fn id);

const char *mt_fn_name(enum mt_fn id);

#endif
