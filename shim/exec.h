/* exec.h — the seam between the router and the NVFP4 engine (kernels/engine.h).
 *
 * mt_exec_routed is the only place a routed call can leave cuBLAS. Until the engine is connected
 * (issue 5) it runs nothing and says "no engine", and the hook forwards the call to cuBLAS.
 * Issue 5 replaces its body: map the TN call onto mt_gemm_args (x = B, W = A quantized through
 * the weight cache, y = D, c = C, the Lt bias), read alpha/beta from the host (the router only
 * routes host pointer mode), launch on c->stream, and turn each mt_status into a fallback reason.
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
