/* shim.h — the shim's state: inert or active, and the path of an active call.
 *
 * Inert (MINITE_SPEC unset, or a bad configuration) means every hook is a load, a branch and a
 * tail call into cuBLAS. Active means each call is normalised, routed, counted, and then run by
 * the engine (mt_exec_routed) or forwarded to cuBLAS unchanged.
 */
#ifndef MT_SHIM_H
#define MT_SHIM_H

#include <stdatomic.h>

#include "shim/call.h"
#include "shim/router.h"
#include "spec/spec.h"

#define MT_VERSION "0.1.0"

extern atomic_int mt_shim_on;

static inline int mt_shim_active(void) {
  return atomic_load_explicit(&mt_shim_on, memory_order_relaxed);
}

/* Read the environment and start (the library constructor calls it). Returns 0 when active or
 * inert by choice, -1 after a configuration error (the shim is then inert). With MINITE_STRICT=1
 * a configuration error ends the program with exit status 2 instead of returning. */
int mt_shim_init(void);

/* mt_shim_init's work with the secure-execution decision passed in (mt_shim_init passes
 * getauxval(AT_SECURE)), so that a test can make it: when `secure`, the shim reads no path and
 * writes no file, says so once (unless MINITE_LOG_LEVEL=NONE) and stays inert. */
int mt_shim_start(int secure);

/* Write the summary (the library destructor calls it). */
void mt_shim_fini(void);

/* Route, count and possibly run one active call. Returns 1 when the call was executed (its result
 * in *status), 0 when the hook must forward it to cuBLAS unchanged. */
int mt_shim_begin(mt_call *c, cublasStatus_t *status);

/* Count an active call whose arguments could not be read, with the reason it passes through
 * (the torch hook's "torch abi"); nothing else is done with it. */
void mt_shim_unread(enum mt_reason r);

#endif
