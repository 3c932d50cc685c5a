/* router.h — does the spec route this GEMM, and if not, why not.
 *
 * A call "involves" a routed weight when its ops and dims are those of one of the three GEMMs
 * PyTorch runs with a weight W of out x in (docs/design.md, "The router"):
 *   forward  TN  m = out, k = in      y = x W^T     (A = W transposed, B = activations)
 *   dgrad    NN  m = in,  k = out     dx = dy W
 *   wgrad    NT  m = in,  n = out     dW = dy^T x   (C has the weight's shape)
 * and one more with the weight stored the other way, [in][out] (JAX's and Flax's Dense kernels,
 * y = x @ W, and torch._grouped_mm's x @ W on [E, in, out]):
 *   forward  NN  m = out, k = in      y = x W       (A = W as stored, B = activations)
 * The shapes tell it from PyTorch's dgrad: a dgrad's (m, k) is a route's (in, out), this
 * forward's its (out, in). Where both fit (a square route, or a route whose transpose is a route
 * too) the call is ambiguous, and MINITE_WEIGHT_LAYOUT (base/params.h) says which layout the
 * program uses: out-in or auto read it as the dgrad, in-out as the forward; the census marks such
 * calls (mt_route_ambiguous) and auto says so once. Both forwards are routed alike: the engine
 * reads an [in][out] weight transposed (shim/call.h, mt_call_in_out) and computes the same bits.
 * A forward call is routed when the engine can take it; every other call that involves a routed
 * weight passes through to cuBLAS with a named reason, which the statistics count. A grouped call
 * whose group sizes are on the device (mt_call.ragged) claims only the roles whose dims are all
 * known: forward and dgrad when n (tokens) varies, wgrad when k does, none when m does.
 */
#ifndef MT_ROUTER_H
#define MT_ROUTER_H

#include "base/params.h"
#include "shim/call.h"
#include "spec/spec.h"

enum mt_reason {
  MT_R_UNROUTED = 0, /* involves no routed weight: plain pass-through, no reason counted */
  MT_R_ROUTED,       /* a forward expert GEMM the spec routes */
  MT_R_DGRAD,        /* the spec's backward = bf16: cuBLAS computes it */
  MT_R_WGRAD,
  MT_R_DTYPE,         /* A, B not both BF16 or both FP16; C not BF16/FP16 */
  MT_R_COMPUTE,       /* compute type not FP32 (68 or legacy 0); Lt scale type not FP32 */
  MT_R_LAYOUT,        /* order, leading dimension, alignment or batch layout */
  MT_R_EPILOGUE,      /* Lt epilogue other than DEFAULT or BIAS, or an odd bias type */
  MT_R_POINTER_MODE,  /* alpha/beta on the device */
  MT_R_K_ALIGN,       /* k not a multiple of the 16-element NVFP4 block */
  MT_R_NO_ENGINE,     /* routed, but no engine can run it here (no CUDA driver, no sm_90 device) */
  MT_R_CAPTURE,       /* would have to load kernels, allocate or read back while capturing */
  MT_R_NOMEM,         /* the engine's device memory could not be had (or MINITE_CACHE_MB) */
  MT_R_ENGINE,        /* the engine refused the problem or a launch failed */
  MT_R_PTR_ARRAYS,    /* a pointer-array form the grouped engine does not take: GroupedBatchedEx
                        groups differing in more than their rows, an Lt call mixing strided and
                        POINTER_ARRAY layouts or with a bias (shim/norm.h, mt_norm_grouped) */
  MT_R_TORCH_ABI,     /* torch._grouped_mm's arguments cannot be read: libtorch lacks an accessor
                        the shim needs (another PyTorch version), or its layout differs */
  MT_R_CONTEXT,       /* the call's stream belongs to a CUDA context other than the current one */
  MT_R_TRITON_LAYOUT, /* a launch of a kernel the door recognises by name whose parameters it does
                         not decode (shim/vllm.h: another vLLM or Triton version, a quantized or
                         biased variant), or whose compile-time constants it could not establish */
  MT_R_SGLANG,        /* SGLang's fused_moe_kernel: recognised, not routed (shim/vllm.h) */
  MT_R_EXPERTS, /* the launch door cannot bound the expert count of the weight (shim/vllm.h) */
  MT_R_COUNT
};

/* "backward dgrad", "k alignment", ...: the names in logs and statistics. */
const char *mt_reason_name(enum mt_reason r);

enum mt_role {
  MT_ROLE_NONE,
  MT_ROLE_FORWARD,
  MT_ROLE_DGRAD,
  MT_ROLE_WGRAD,
  MT_ROLE_FORWARD_IN_OUT /* y = x W, W stored [in][out] */
};

/* Take MINITE_WEIGHT_LAYOUT; until called, the reading is auto's. */
void mt_router_init(const mt_params *p);

/* Which GEMM of a routed weight this is, from ops and dims only (cheap: no details needed). */
enum mt_role mt_route_role(const mt_spec *s, const mt_call *c);

/* A forward of either layout (the roles the engine takes). */
int mt_route_is_forward(enum mt_role r);

/* The call is an NN call that both readings fit (see above); mt_route_role decided it by
 * MINITE_WEIGHT_LAYOUT. */
int mt_route_ambiguous(const mt_spec *s, const mt_call *c);

/* "forward", "dgrad", "wgrad", "forward [in, out]"; NULL for MT_ROLE_NONE (the census's names). */
const char *mt_route_role_name(enum mt_role r);

/* JAX's ragged_dot as XLA hands it to cuBLAS: one dense NN whose m is a route's out and whose k
 * is E > 1 times its in (the [in, out] kernels of E experts stacked). The route's index, with E in
 * *experts; -1 when the call is no such GEMM. Not routed: named in the census only. */
int mt_route_ragged_dot(const mt_spec *s, const mt_call *c, int64_t *experts);

/* The decision for one problem (not a grouped call: split it with mt_call_group). A forward call
 * must have its details read (mt_norm_details) first. */
enum mt_reason mt_route_decide(const mt_spec *s, const mt_call *c);

#endif
