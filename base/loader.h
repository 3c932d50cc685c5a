/* loader.h — the dynamic loader's own functions (dlsym, dlvsym), read from its symbol table.
 *
 * The shim exports dlsym and dlvsym (shim/dl.c) to answer programs that look cuBLAS and the CUDA
 * driver up by name, so the library's own lookups must never go through them: a lookup of a
 * hooked name would return the hook, and the engine's own driver calls would come back into the
 * shim. Every part of the library that looks a symbol up (shim/real.c, kernels/driver.c,
 * kernels/instr.c) uses these instead. The bottom of the library: libc alone.
 */
#ifndef MT_LOADER_H
#define MT_LOADER_H

/* Code that may run before anything is set up: a sanitizer runtime preloaded before the shim
 * looks its interceptors' real functions up with dlsym while it starts, before its own
 * instrumentation works, and that dlsym is the shim's. Such code is not instrumented and calls
 * nothing that is. */
#define MT_BEFORE_INIT __attribute__((no_sanitize("address", "undefined")))

typedef void *(*mt_dlsym_fn)(void *handle, const char *name);

/* The loader's own function `name` (in the object that defines dladdr1: libc.so.6 since glibc
 * 2.34, libdl.so.2 before), or NULL. Not cached (MT_BEFORE_INIT). */
void *mt_loader_function(const char *name);

/* The loader's own dlsym, found once and cached; NULL when absent (it cannot be, in a process
 * that runs). */
mt_dlsym_fn mt_loader_dlsym(void);

/* `name` in the object behind `handle`, through the loader's own dlsym; NULL when absent. */
void *mt_loader_sym(void *handle, const char *name);

#endif
