/* real.c — the lookup of real cuBLAS functions: RTLD_NEXT, then the already-loaded library. */
#include "shim/real.h"

#include <dlfcn.h>
#include <stddef.h>

#include "base/log.h"

enum lib { CUBLAS, CUBLASLT };

static const struct {
  const char *name;
  enum lib lib;
} fns[MT_FN_COUNT] = {
#define MT_HOOK(name, lib, params, ...) {#name, lib},
#define MT_REAL(name, lib, ret, params) {#name, lib},
#include "shim/hooks.def"
#undef MT_HOOK
#undef MT_REAL
};

/* CUDA 13 first: a process holds one cuBLAS, and when it is 13 the 12 name is never there. */
static const char *const sonames[2][3] = {
    [CUBLAS] = {"libcublas.so.13", "libcublas.so.12", NULL},
    [CUBLASLT] = {"libcublasLt.so.13", "libcublasLt.so.12", NULL},
};

void *_Atomic mt_real_ptr[MT_FN_COUNT];
static atomic_flag missing_warned[MT_FN_COUNT];

const char *mt_fn_name(enum mt_fn id) { return fns[id].name; }

void *mt_real_find(enum mt_fn id) {
  void *p = dlsym(RTLD_NEXT, fns[id].name);
  for (int i = 0; !p && sonames[fns[id].lib][i]; i++) {
    /* The handle is kept open on purpose: it pins the library, so the cached pointer cannot
     * outlive the code it points to if the program dlcloses its own handle. */
    void *h = dlopen(sonames[fns[id].lib][i], RTLD_NOW | RTLD_NOLOAD);
    if (h)
      p = dlsym(h, fns[id].name);
  }
  /* Racing threads find the same address, so a plain store is enough. */
  if (p)
    atomic_store_explicit(&mt_real_ptr[id], p, memory_order_release);
  return p;
}

cublasStatus_t mt_real_missing(enum mt_fn id) {
  if (!atomic_flag_test_and_set(&missing_warned[id]))
    MT_WARN("cannot find the real %s: it is neither next in the symbol search order nor in an "
            "already loaded %s or %s; returning CUBLAS_STATUS_NOT_INITIALIZED. Load cuBLAS "
            "before calling it, or remove libminite.so from LD_PRELOAD",
            fns[id].name, sonames[fns[id].lib][0], sonames[fns[id].lib][1]);
  return CUBLAS_STATUS_NOT_INITIALIZED;
}
