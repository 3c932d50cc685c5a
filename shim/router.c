/* router.c — the routing rules, as one ordered list of checks per call. */
#include "shim/router.h"

#include <stdint.h>

static const char *const reason_names[MT_R_COUNT] = {
    [MT_R_UNROUTED] = "unrouted",
    [MT_R_ROUTED] = "routed",
    [MT_R_DGRAD] = "backward dgrad",
    [MT_R_WGRAD] = "backward wgrad",
    [MT_R_DTYPE] = "dtype",
    [MT_R_COMPUTE] = "compute type",
    [MT_R_LAYOUT] = "layout",
    [MT_R_EPILOGUE] = "epilogue",
    [MT_R_POINTER_MODE] = "pointer mode",
    [MT_R_K_ALIGN] = "k alignment",
    [MT_R_NO_ENGINE] = "no engine",
    [MT_R_CAPTURE] = "capture",
    [MT_R_NOMEM] = "out of memory",
    [MT_R_ENGINE] = "engine error",
    [MT_R_PTR_ARRAYS] = "pointer arrays",
    [MT_R_TORCH_ABI] = "torch abi",
    [MT_R_CONTEXT] = "other context",
    [MT_R_TRITON_LAYOUT] = "triton layout",
    [MT_R_SGLANG] = "sglang kernel",
    [MT_R_EXPERTS] = "expert count",
};

const char *mt_reason_name(enum mt_reason r) {
  return r >= 0 && r < MT_R_COUNT ? reason_names[r] : "?";
}

/* Rows of 16 bytes: what TMA loads need. The engine may relax or tighten this; it is the one
 * place to change. Element sizes here are 2 bytes (BF16/FP16 only reach the check). */
#define MT_ALIGN_BYTES 16
#define MT_ALIGN_ELEMS (MT_ALIGN_BYTES / 2)
/* NVFP4 scales one E4M3 factor per 16 consecutive K elements (docs/numerics.md, "The knobs"). */
#define MT_K_BLOCK 16

static int routed(const mt_spec *s, int64_t out, int64_t in) {
  if (out <= 0 || in <= 0 || out > UINT32_MAX || in > UINT32_MAX)
    return 0;
  return mt_spec_routes(s, (uint32_t)out, (uint32_t)in);
}

static enum mt_wlayout layout = MT_WLAYOUT_AUTO;

void mt_router_init(const mt_params *p) { layout = p->weight_layout; }

/* An NN call whose m and k are known, as (out, in) and as (in, out) of a route. */
static void nn_fits(const mt_spec *s, const mt_call *c, int *forward, int *dgrad) {
  *forward = *dgrad = 0;
  if (c->transa != MT_OP_N || c->transb != MT_OP_N || c->ragged == MT_RAGGED_M ||
      c->ragged == MT_RAGGED_K)
    return;
  *forward = routed(s, c->m, c->k);
  *dgrad = routed(s, c->k, c->m);
}

int mt_route_ambiguous(const mt_spec *s, const mt_call *c) {
  int forward, dgrad;
  nn_fits(s, c, &forward, &dgrad);
  return forward && dgrad;
}

enum mt_role mt_route_role(const mt_spec *s, const mt_call *c) {
  if (!mt_op_known(c->transa) || !mt_op_known(c->transb))
    return MT_ROLE_NONE;
  int ta = c->transa != MT_OP_N, tb = c->transb != MT_OP_N;
  int mk_known = c->ragged != MT_RAGGED_M && c->ragged != MT_RAGGED_K;
  int mn_known = c->ragged != MT_RAGGED_M && c->ragged != MT_RAGGED_N;
  if (ta && !tb && mk_known && routed(s, c->m, c->k))
    return MT_ROLE_FORWARD;
  int forward, dgrad;
  nn_fits(s, c, &forward, &dgrad);
  if (forward && dgrad)
    return layout == MT_WLAYOUT_IN_OUT ? MT_ROLE_FORWARD_IN_OUT : MT_ROLE_DGRAD;
  if (forward || dgrad)
    return forward ? MT_ROLE_FORWARD_IN_OUT : MT_ROLE_DGRAD;
  if (!ta && tb && mn_known && routed(s, c->n, c->m))
    return MT_ROLE_WGRAD;
  return MT_ROLE_NONE;
}

int mt_route_is_forward(enum mt_role r) {
  return r == MT_ROLE_FORWARD || r == MT_ROLE_FORWARD_IN_OUT;
}

const char *mt_route_role_name(enum mt_role r) {
  static const char *const names[] = {
      [MT_ROLE_FORWARD] = "forward",
      [MT_ROLE_DGRAD] = "dgrad",
      [MT_ROLE_WGRAD] = "wgrad",
      [MT_ROLE_FORWARD_IN_OUT] = "forward [in, out]",
  };
  return r > MT_ROLE_NONE && r <= MT_ROLE_FORWARD_IN_OUT ? names[r] : NULL;
}

int mt_route_ragged_dot(const mt_spec *s, const mt_call *c, int64_t *experts) {
  if (c->transa != MT_OP_N || c->transb != MT_OP_N || c->ragged != MT_RAGGED_NONE)
    return -1;
  for (int i = 0; i < s->nroutes; i++) {
    const mt_route *r = &s->routes[i];
    if (c->m == (int64_t)r->out && c->k > (int64_t)r->in && c->k % (int64_t)r->in == 0) {
      *experts = c->k / (int64_t)r->in;
      return i;
    }
  }
  return -1;
}

static int half_type(int t) { return t == CUDA_R_16BF || t == CUDA_R_16F; }

static int dtype_ok(const mt_call *c) {
  return half_type(c->atype) && c->atype == c->btype && half_type(c->ctype) && c->dtype == c->ctype;
}

static int compute_ok(const mt_call *c) {
  /* PyTorch casts CUDA_R_32F (0) into the compute-type argument (docs/design.md, "Interposition
   * facts measured on the H200"). */
  if (c->compute != CUBLAS_COMPUTE_32F && c->compute != CUDA_R_32F)
    return 0;
  return c->scale_type == -1 || c->scale_type == CUDA_R_32F;
}

static int aligned(const void *p) { return ((uintptr_t)p % MT_ALIGN_BYTES) == 0; }

/* Several problems from bases and strides: each problem's operands aligned as one call's, and
 * no two problems writing the same output (a weight or input shared by all has stride 0). */
static int strides_ok(const mt_call *c) {
  if (c->batch <= 1 || c->pointer_arrays)
    return 1;
  if (c->stride_a % MT_ALIGN_ELEMS || c->stride_b % MT_ALIGN_ELEMS ||
      c->stride_c % MT_ALIGN_ELEMS || c->stride_d % MT_ALIGN_ELEMS || c->stride_a < 0 ||
      c->stride_b < 0)
    return 0;
  if (c->ragged == MT_RAGGED_N) /* the groups are consecutive rows of one output */
    return 1;
  int64_t span;
  return !__builtin_mul_overflow(c->ldd, c->n, &span) && c->stride_d >= span;
}

static int layout_ok(const mt_call *c) {
  if (!c->details_ok)
    return 0; /* something could not be read: never guess a layout */
  if (!c->alpha || !c->beta)
    return 0; /* cuBLAS refuses NULL scalars (INVALID_VALUE): its to answer */
  if (c->order_a || c->order_b || c->order_c || c->order_d)
    return 0;
  /* No problem (an Lt batch count of 0) or a negative count: whatever cuBLAS answers to it. */
  if (c->batch < 1)
    return 0;
  if (!strides_ok(c))
    return 0;
  /* No tokens, or a negative count (cuBLAS refuses it; an Lt layout can say so): cuBLAS's. */
  if (c->n <= 0)
    return 0;
  /* TN: A is k x m (NN, an [in][out] weight: m x k), B is k x n, C is m x n, all column-major. */
  if (c->lda < (mt_call_in_out(c) ? c->m : c->k) || c->ldb < c->k || c->ldc < c->m || c->ldd < c->m)
    return 0;
  if (c->lda % MT_ALIGN_ELEMS || c->ldb % MT_ALIGN_ELEMS || c->ldc % MT_ALIGN_ELEMS ||
      c->ldd % MT_ALIGN_ELEMS)
    return 0;
  if (!c->pointer_arrays && !(aligned(c->a) && aligned(c->b) && aligned(c->c) && aligned(c->d)))
    return 0;
  return 1;
}

static int epilogue_ok(const mt_call *c) {
  if (c->epilogue == CUBLASLT_EPILOGUE_DEFAULT)
    return 1;
  if (c->epilogue != CUBLASLT_EPILOGUE_BIAS)
    return 0;
  return c->bias_type == -1 || half_type(c->bias_type) || c->bias_type == CUDA_R_32F;
}

enum mt_reason mt_route_decide(const mt_spec *s, const mt_call *c) {
  switch (mt_route_role(s, c)) {
  case MT_ROLE_NONE:
    return MT_R_UNROUTED;
  case MT_ROLE_DGRAD:
    return MT_R_DGRAD;
  case MT_ROLE_WGRAD:
    return MT_R_WGRAD;
  case MT_ROLE_FORWARD_IN_OUT:
  case MT_ROLE_FORWARD:
    break;
  }
  if (!dtype_ok(c))
    return MT_R_DTYPE;
  if (!compute_ok(c))
    return MT_R_COMPUTE;
  if (c->ptr_mode != MT_PTR_HOST && c->details_ok)
    return MT_R_POINTER_MODE;
  if (!epilogue_ok(c))
    return MT_R_EPILOGUE;
  if (!layout_ok(c))
    return MT_R_LAYOUT;
  /* the block does not tile the weight (spec/spec.h: mt_spec_route_unusable) */
  if (c->k % MT_K_BLOCK || (s->weight_block == MT_WBLOCK_16X16 && c->m % MT_K_BLOCK))
    return MT_R_K_ALIGN;
  /* an [in][out] weight's stored rows (of m) are what the change check hashes in 16-byte pieces
   * (kernels/whash.h) */
  if (mt_call_in_out(c) && c->m % MT_K_BLOCK)
    return MT_R_LAYOUT;
  return MT_R_ROUTED;
}
