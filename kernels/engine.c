/* engine.c — the engine's C API (kernels/engine.h): status names, the spec's numerics, and one
 * routed GEMM, which is the grouped GEMM of kernels/grouped.c with one segment: the per-call path
 * and the grouped path are one store, one kernel and one arithmetic.
 *
 * Nothing here allocates, synchronizes or reads device memory back: mt_gemm only enqueues work on
 * the caller's stream, so it is legal inside CUDA graph capture (once the modules are loaded in the
 * context; a first call while capturing answers MT_ERR_CAPTURE).
 */
#include "kernels/engine.h"

const char *mt_status_name(enum mt_status s) {
  switch (s) {
  case MT_OK:
    return "ok";
  case MT_ERR_NO_DRIVER:
    return "no CUDA driver";
  case MT_ERR_NO_DEVICE:
    return "no sm_90 device";
  case MT_ERR_UNSUPPORTED:
    return "unsupported shape, type or stride";
  case MT_ERR_CAPTURE:
    return "stream capture";
  case MT_ERR_NOMEM:
    return "workspace too small";
  case MT_ERR_CUDA:
    return "CUDA error";
  }
  return "unknown status";
}

void mt_numerics_from_spec(const mt_spec *s, mt_numerics *n) {
  n->act_scale = s->act_scale;
  n->weight_scale = s->weight_scale;
  n->weight_block = s->weight_block;
}

int mt_gemm(const mt_gemm_args *a, mt_stream stream) {
  if (!a) return MT_ERR_UNSUPPORTED;
  mt_grouped_args g = {
      .nseg = 1,
      .n = a->n,
      .k = a->k,
      .w = a->w,
      .m = a->m,
      .seg_rows = a->m,
      .x = a->x,
      .ldx = a->ldx,
      .xtype = a->xtype,
      .y = a->y,
      .ldy = a->ldy,
      .ytype = a->ytype,
      .c = a->c,
      .ldc = a->ldc,
      .bias = a->bias,
      .biastype = a->biastype,
      .alpha = a->alpha,
      .beta = a->beta,
      .workspace = a->workspace,
      .workspace_bytes = a->workspace_bytes,
      .bn = a->bn,
      .cb = a->cb,
  };
  return mt_gemm_grouped(&g, stream);
}
