/* dl.h — the shim's dlsym and dlvsym, for programs that load cuBLAS with dlopen and look its entry
 * points up by name (JAX/XLA's CUDA plugin does that for every one of them): a symbol that a
 * preloaded library defines is never found that way, so the lookups themselves are answered. Also
 * the driver's own lookup, cuGetProcAddress (the CUDA runtime's way to its entry points): a
 * function it returns that is the real one of a hooked name becomes the shim's hook.
 *
 * A lookup of a hooked cuBLAS or driver name (an MT_HOOK or MT_DRIVER line of hooks.def; Triton
 * looks cuLaunchKernelEx up this way, shim/launch.h) on a handle returns the hook
 * when the handle's definition is the real function the hooks forward to (shim/real.c), adopting
 * it when none is known yet. A handle whose definition is another copy of cuBLAS gets that copy's
 * own function, unhooked, and one warning names both copies: the hooks have one real function
 * each, and calls of the second copy must not reach the first. Every other lookup, and any lookup
 * with RTLD_DEFAULT or RTLD_NEXT (which find the hooks, or skip them, by the loader's own rules),
 * goes to the real function as a tail call, so that the loader still sees the caller's return
 * address: RTLD_NEXT and the caller's local scope depend on it. Nothing else about dynamic loading
 * changes.
 */
#ifndef MT_DL_H
#define MT_DL_H

#include "shim/real.h"

/* The hooked cuBLAS or driver entry point called `name`: its id and the hook's address;
 * MT_FN_COUNT when the name is not hooked. */
enum mt_fn mt_dl_hooked(const char *name, void **hook);

#endif
