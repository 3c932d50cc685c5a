/* dl.c — the exported dlsym, dlvsym and cuGetProcAddress (see dl.h). */
#include "shim/dl.h"

#include <dlfcn.h>

#include "base/log.h"
#include "shim/launch.h"
#include "shim/shim.h"

#define MT_EXPORT __attribute__((visibility("default")))

static const struct {
  const char *name;
  enum mt_fn id;
  void *hook;
} hooked[] = {
#define MT_HOOK(name, lib, params, ...) {#name, MT_FN_##name, (void *)name},
#define MT_DRIVER(name, ret, params) {#name, MT_FN_##name, (void *)name},
#include "shim/hooks.def"
};

#define NHOOKED ((int)(sizeof hooked / sizeof hooked[0]))

MT_BEFORE_INIT static int same_name(const char *a, const char *b) {
  while (*a && *a == *b)
    a++, b++;
  return *a == *b;
}

MT_BEFORE_INIT enum mt_fn mt_dl_hooked(const char *name, void **hook) {
  for (int i = 0; i < NHOOKED; i++)
    if (same_name(name, hooked[i].name)) {
      *hook = hooked[i].hook;
      return hooked[i].id;
    }
  return MT_FN_COUNT;
}

/* The answer to a lookup of a hooked name on a handle: p is what the handle itself defines. */
static void *answer(enum mt_fn id, void *hook, void *p) {
  if (!p || p == hook)
    return p;
  void *real = mt_real_adopt(id, p);
  if (real == p)
    return hook;
  if (mt_shim_active()) { /* an inert shim sees no call of either copy: nothing to say */
    Dl_info mine = {0}, theirs = {0};
    dladdr(real, &mine), dladdr(p, &theirs);
    MT_WARN_ONCE("this process holds two copies of the library that defines %s (%s and %s): "
                 "the hooks forward to the first, so lookups of %s and the other hooked names in "
                 "the second get its own functions, and its calls are not seen; load one copy only",
                 mt_fn_name(id), mine.dli_fname ? mine.dli_fname : "?",
                 theirs.dli_fname ? theirs.dli_fname : "?", mt_fn_name(id));
  }
  return p;
}

/* What a lookup returns when the loader's own function is missing (it cannot be, in a process
 * that runs). */
static void *no_loader(enum mt_fn id) {
  MT_WARN_ONCE("cannot find the dynamic loader's %s: lookups through it return NULL",
               mt_fn_name(id));
  return NULL;
}

/* A lookup on a handle of a hooked name: the answer; NOT_HOOKED for any other name. Kept out of
 * the hooks' own frames: a local whose address is taken there would keep the compiler from the
 * tail calls that let the loader see the caller (RTLD_NEXT, RTLD_DEFAULT). */
#define NOT_HOOKED ((void *)-1)

MT_BEFORE_INIT __attribute__((noinline)) static void *hooked_dlsym(mt_fn_dlsym next, void *handle,
                                                                   const char *name) {
  void *hook;
  enum mt_fn id = mt_dl_hooked(name, &hook);
  return id == MT_FN_COUNT ? NOT_HOOKED : answer(id, hook, next(handle, name));
}

MT_BEFORE_INIT __attribute__((noinline)) static void *
hooked_dlvsym(mt_fn_dlvsym next, void *handle, const char *name, const char *version) {
  void *hook;
  enum mt_fn id = mt_dl_hooked(name, &hook);
  return id == MT_FN_COUNT ? NOT_HOOKED : answer(id, hook, next(handle, name, version));
}

/* The two hooks run before anything is set up when a sanitizer runtime is preloaded first
 * (MT_BEFORE_INIT, real.h): their path to the loader's function touches nothing instrumented. */
MT_BEFORE_INIT MT_EXPORT void *dlsym(void *handle, const char *name) {
  mt_fn_dlsym next = (mt_fn_dlsym)mt_real_loader(MT_FN_dlsym);
  if (!next)
    return no_loader(MT_FN_dlsym);
  if (handle != RTLD_NEXT && handle != RTLD_DEFAULT) {
    void *p = hooked_dlsym(next, handle, name);
    if (p != NOT_HOOKED)
      return p;
  }
  return next(handle, name); /* a tail call: the loader reads the caller's return address */
}

MT_BEFORE_INIT MT_EXPORT void *dlvsym(void *handle, const char *name, const char *version) {
  mt_fn_dlvsym next = (mt_fn_dlvsym)mt_real_loader(MT_FN_dlvsym);
  if (!next)
    return no_loader(MT_FN_dlvsym);
  if (handle != RTLD_NEXT && handle != RTLD_DEFAULT) {
    void *p = hooked_dlvsym(next, handle, name, version);
    if (p != NOT_HOOKED)
      return p;
  }
  return next(handle, name, version);
}

/* --- cuGetProcAddress ------------------------------------------------------------------------ */

/* The hook that stands for p, a real function a lookup of the driver returned: the shim's own
 * where p is the real function of a hooked name, else p. */
static void *hook_for(void *p) {
  for (int i = 0; i < NHOOKED; i++)
    if (p == mt_real(hooked[i].id))
      return hooked[i].hook;
  return p;
}

MT_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                       cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *symbolStatus) {
  mt_fn_cuGetProcAddress_v2 real = (mt_fn_cuGetProcAddress_v2)mt_real(MT_FN_cuGetProcAddress_v2);
  if (!real)
    return mt_real_driver_missing(MT_FN_cuGetProcAddress_v2);
  const CUresult r = real(symbol, pfn, cudaVersion, flags, symbolStatus);
  if (r == CUDA_SUCCESS && pfn && *pfn)
    *pfn = hook_for(*pfn);
  return r;
}

MT_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags) {
  mt_fn_cuGetProcAddress real = (mt_fn_cuGetProcAddress)mt_real(MT_FN_cuGetProcAddress);
  if (!real)
    return mt_real_driver_missing(MT_FN_cuGetProcAddress);
  const CUresult r = real(symbol, pfn, cudaVersion, flags);
  if (r == CUDA_SUCCESS && pfn && *pfn)
    *pfn = hook_for(*pfn);
  return r;
}
