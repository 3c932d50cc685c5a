/* exec.h — the seam between the router and the NVFP4 engine (kernels/engine.h).
 *
 * mt_exec_routed is the only place a routed call leaves cuBLAS (shim/exec.c: the TN call mapped
 * onto mt_gemm_args, the weight from shim/wcache.c, the call's stream and scalars); anything
 * that stops it is a fallback reason, and the hook then forwards the call to cuBLAS unchanged.
 * Calls of several problems (strided and pointer-array batches, cublasGemmGroupedBatchedEx, Lt
 * batches, torch._grouped_mm) become one mt_grouped_call (shim/call.h, shim/norm.c) and go to
 * mt_exec_grouped.
 */
#ifndef MT_EXEC_H
#define MT_EXEC_H

#include "shim/call.h"
#include "shim/router.h"
#include "spec/spec.h"

/* Run a call the router routed. Returns MT_R_ROUTED when the engine ran it, with its result in
 * *status; otherwise the fallback reason, and the caller forwards the call to cuBLAS (or to
 * torch) unchanged. Never called for format = bf16: there cuBLAS itself is the routed engine. */
enum mt_reason mt_exec_routed(const mt_spec *s, mt_call *c, cublasStatus_t *status);

/* THE grouped seam: run every segment of a routed grouped call on the stream g->stream, in one
 * launch of the grouped engine where it can take the record, with no host read-back of anything
 * on the device (pointer arrays, offsets) and nothing that a CUDA graph capture refuses once the
 * shapes were seen (allocation, module loads). Returns MT_R_ROUTED when the outputs are written;
 * otherwise the fallback reason, with nothing written to any output (the caller then runs the
 * original call), except where a failure came after a launch (warned, "engine error").
 *
 * The grouped engine (kernels/engine.h, mt_gemm_grouped) runs segments with strides, with device
 * offsets and behind device pointer arrays (read by its kernels only). Weights behind pointers are
 * quantized into the call's memory at every call; rows that differ by group (mt_grouped_call's
 * group_rows) get a segment table in the call's memory, written by a kernel whose parameters carry
 * the host's counts, before the activations are quantized. */
enum mt_reason mt_exec_grouped(const mt_spec *s, const mt_grouped_call *g);

#endif
