/* real.c — the lookup of real functions: RTLD_NEXT, then the already-loaded library, through the
 * loader's own dlsym (base/loader.h). */
#include "shim/real.h"

#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>

#include "base/loader.h"
#include "base/log.h"

enum lib { CUBLAS, CUBLASLT, TORCH, LIBC, CUDA, NONE };

static const struct {
  const char *symbol, *display;
  enum lib lib;
} fns[MT_FN_COUNT] = {
#define MT_HOOK(name, lib, params, ...) {#name, #name, lib},
#define MT_REAL(name, lib, ret, params) {#name, #name, lib},
#define MT_HAND(name, symbol, lib, display, ret, params) {#symbol, display, lib},
#define MT_DRIVER(name, ret, params) {#name, #name, CUDA},
#define MT_KERNEL(name, display) {NULL, display, NONE},
#include "shim/hooks.def"
};

/* CUDA 13 first: a process holds one cuBLAS, and when it is 13 the 12 name is never there. */
static const char *const sonames[][3] = {
    [CUBLAS] = {"libcublas.so.13", "libcublas.so.12", NULL},
    [CUBLASLT] = {"libcublasLt.so.13", "libcublasLt.so.12", NULL},
    [TORCH] = {"libtorch_cuda.so", NULL, NULL},
    [LIBC] = {NULL, NULL, NULL},
    [CUDA] = {"libcuda.so.1", NULL, NULL},
    [NONE] = {NULL, NULL, NULL},
};

void *_Atomic mt_real_ptr[MT_FN_COUNT];
static atomic_flag missing_warned[MT_FN_COUNT];

const char *mt_fn_name(enum mt_fn id) { return fns[id].display; }

/* dlsym and dlvsym for the hooks to forward to: the next definition after this library (another
 * interposer preloaded after it keeps seeing the calls), else the loader's own. */
MT_BEFORE_INIT void *mt_real_loader(enum mt_fn id) {
  void *p = atomic_load_explicit(&mt_real_ptr[id], memory_order_acquire);
  if (p)
    return p;
  mt_fn_dlsym sym = (mt_fn_dlsym)mt_loader_function("dlsym");
  const char *name = id == MT_FN_dlsym ? "dlsym" : "dlvsym";
  void *own = id == MT_FN_dlsym ? (void *)sym : mt_loader_function(name);
  void *next = sym ? sym(RTLD_NEXT, name) : NULL;
  p = next ? next : own;
  if (p)
    atomic_store_explicit(&mt_real_ptr[id], p, memory_order_release);
  return p;
}

/* --- everything else ------------------------------------------------------------------------ */

void *mt_real_find(enum mt_fn id) {
  void *p = NULL;
  if (fns[id].lib == NONE)
    return NULL;
  if (fns[id].lib == LIBC) {
    p = mt_real_loader(id);
  } else {
    mt_dlsym_fn sym = mt_loader_dlsym();
    p = sym ? sym(RTLD_NEXT, fns[id].symbol) : NULL;
    for (int i = 0; sym && !p && sonames[fns[id].lib][i]; i++) {
      /* The handle is kept open on purpose: it pins the library, so the cached pointer cannot
       * outlive the code it points to if the program dlcloses its own handle. */
      void *h = dlopen(sonames[fns[id].lib][i], RTLD_NOW | RTLD_NOLOAD);
      if (h)
        p = sym(h, fns[id].symbol);
    }
  }
  /* Racing threads find the same address, so a plain store is enough. */
  if (p)
    atomic_store_explicit(&mt_real_ptr[id], p, memory_order_release);
  return p;
}

void *mt_real_adopt(enum mt_fn id, void *p) {
  void *cur = mt_real(id);
  if (!cur && !atomic_compare_exchange_strong(&mt_real_ptr[id], &cur, p))
    return cur; /* another thread adopted first: cur holds its choice */
  return cur ? cur : p;
}

/* The object holding `addr`, opened again without loading anything (kept open: it pins it). */
static void *object_of(const void *addr) {
  Dl_info info;
  if (!addr || !dladdr(addr, &info) || !info.dli_fname)
    return NULL;
  return dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
}

void *mt_real_beside(const void *fn, const char *name) {
  return mt_loader_sym(object_of(fn), name);
}

void *mt_real_near(enum mt_fn id, const void *addr) {
  void *p = mt_real_beside(addr, fns[id].symbol);
  return p ? mt_real_adopt(id, p) : NULL;
}

cublasStatus_t mt_real_missing(enum mt_fn id) {
  if (!atomic_flag_test_and_set(&missing_warned[id]))
    MT_WARN("cannot find the real %s: it is neither next in the symbol search order nor in an "
            "already loaded %s or %s; returning CUBLAS_STATUS_NOT_INITIALIZED. Load cuBLAS "
            "before calling it, or remove libminite.so from LD_PRELOAD",
            fns[id].symbol, sonames[fns[id].lib][0], sonames[fns[id].lib][1]);
  return CUBLAS_STATUS_NOT_INITIALIZED;
}

CUresult mt_real_driver_missing(enum mt_fn id) {
  if (!atomic_flag_test_and_set(&missing_warned[id]))
    MT_WARN("cannot find the real %s in the process's libcuda.so.1: returning "
            "CUDA_ERROR_NOT_INITIALIZED",
            fns[id].symbol);
  return CUDA_ERROR_NOT_INITIALIZED;
}
