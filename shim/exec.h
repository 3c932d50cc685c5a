/* exec.h — the seam between the router and the NVFP4 engine (kernels/engine.h).
 *
 * mt_exec_routed is the only place a routed call leaves cuBLAS (shim/exec.c: the TN call mapped
 * onto mt_gemm_args, the weight from shim/wcache.c, the call's stream and scalars); anything
 * that stops it is a fallback reason, and the hook then forwards the call to cuBLAS unchanged.
 */
#ifndef MT_EXEC_H
#define MT_EXEC_H

#include "shim/call.h"
#include "shim/router.h"
#include "spec/spec.h"

/* Run a call the router routed (for a grouped call: every group routed). Returns MT_R_ROUTED when
 * the engine ran it, with its result in *status; otherwise the fallback reason, and the caller
 * forwards the call to cuBLAS unchanged. Never called for format = bf16: there cuBLAS itself is
 * the routed engine. */
enum mt_reason mt_exec_routed(const mt_spec *s, mt_call *c, cublasStatus_t *status);

#endif
