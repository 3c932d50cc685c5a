/* engine.c — the engine's C API (kernels/engine.h): status names, the quantized weight's layout,
 * weight quantization, and one routed GEMM (validate, quantize the activations into the caller's
 * workspace, hand over to the GEMM launcher of kernels/gemm.c; for a few tokens the small-M kernel
 * quantizes them itself).
 *
 * Nothing here allocates, synchronizes or reads device memory back: mt_gemm and mt_quantize_weight
 * only enqueue work on the caller's stream, so both are legal inside CUDA graph capture (once the
 * modules are loaded in the context; a first call while capturing answers MT_ERR_CAPTURE).
 */
#include "kernels/engine.h"

#include "kernels/driver.h"
#include "kernels/gemm.h"
#include "kernels/gemm_args.h"
#include "kernels/quant.h"

/* Every section starts on 256 bytes: TMA wants 16, wide loads 16, and 256 keeps sections on
 * separate cache lines and DRAM bursts. */
#define SECTION_ALIGN 256

static size_t section(size_t bytes) {
  return (bytes + SECTION_ALIGN - 1) / SECTION_ALIGN * SECTION_ALIGN;
}

/* The outer-scale section: S per row, or per tensor S followed by the amax word the per-tensor
 * quantizer builds (so neither quantization needs memory beyond what the caller gave). */
static size_t outer_bytes(int rows, enum mt_scale kind) {
  return section((kind == MT_SCALE_ROW ? (size_t)rows : 2) * sizeof(float));
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

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

static int weight_shape_ok(int n, int k, const mt_numerics *num) {
  if (!num || n <= 0 || k <= 0 || k % 16)
    return 0;
  if (num->weight_scale != MT_SCALE_ROW && num->weight_scale != MT_SCALE_TENSOR)
    return 0;
  if (num->weight_block == MT_WBLOCK_16X16) /* a tile's 16 rows share one S */
    return num->weight_scale == MT_SCALE_TENSOR && n % 16 == 0;
  return num->weight_block == MT_WBLOCK_1X16;
}

/* The kept sections: codes, scales, outer; then, in the full form, the small-M kernels' copy
 * (where AUTO may use it) and the dequantized copy last. */
static size_t kept_bytes(int n, int k, const mt_numerics *num) {
  size_t elems = (size_t)n * (size_t)k;
  return section(elems / 2) + section(elems / 16) + outer_bytes(n, num->weight_scale);
}

size_t mt_qweight_bytes(int n, int k, const mt_numerics *num) {
  if (!weight_shape_ok(n, k, num))
    return 0;
  return kept_bytes(n, k, num) + section(mt_gemm_frag_bytes(n, k)) + mt_qweight_xhat_bytes(n, k);
}

size_t mt_qweight_kept_bytes(int n, int k, const mt_numerics *num) {
  return weight_shape_ok(n, k, num) ? kept_bytes(n, k, num) : 0;
}

size_t mt_qweight_xhat_bytes(int n, int k) {
  return n > 0 && k > 0 ? section((size_t)n * (size_t)k * 2) : 0;
}

static int bind(mt_qweight *q, int n, int k, const mt_numerics *num, void *mem, int full) {
  if (!q || !mem || ((uintptr_t)mem % SECTION_ALIGN) || !weight_shape_ok(n, k, num))
    return MT_ERR_UNSUPPORTED;
  size_t elems = (size_t)n * (size_t)k;
  char *at = mem;
  q->n = n;
  q->k = k;
  q->in_out = 0;
  q->num = *num;
  q->codes = (uint8_t *)at;
  at += section(elems / 2);
  q->scales = (uint8_t *)at;
  at += section(elems / 16);
  q->outer = (float *)at;
  at += outer_bytes(n, num->weight_scale);
  q->frag = full && mt_gemm_frag_bytes(n, k) ? (uint8_t *)at : NULL;
  at += section(full ? mt_gemm_frag_bytes(n, k) : 0);
  q->xhat = full ? (uint16_t *)at : NULL;
  return MT_OK;
}

int mt_qweight_bind(mt_qweight *q, int n, int k, const mt_numerics *num, void *mem) {
  return bind(q, n, k, num, mem, 1);
}

int mt_qweight_bind_kept(mt_qweight *q, int n, int k, const mt_numerics *num, void *mem) {
  return bind(q, n, k, num, mem, 0);
}

/* The amax word of a per-tensor outer section (see outer_bytes). */
static uint32_t *amax_word(float *outer) { return (uint32_t *)(outer + 1); }

/* The quantizer's arguments for W into q, or MT_ERR_UNSUPPORTED; the launch shape is
 * mt_quantize's to find (a kernel name built a call), so a call that launches asks for it once. */
static int weight_params(const void *w, enum mt_dtype type, size_t ldw, const mt_qweight *q,
                         const uint32_t *only_if, mt_quant_params *out) {
  if (!w || !q || !q->codes || !q->scales || !weight_shape_ok(q->n, q->k, &q->num) ||
      (type != MT_DTYPE_BF16 && type != MT_DTYPE_FP16) || !aligned16(w) ||
      ldw < (size_t)(q->in_out ? q->n : q->k) || ldw % 8)
    return MT_ERR_UNSUPPORTED;
  *out = (mt_quant_params){
      .in_out = q->in_out,
      .x = w,
      .ldx = (int64_t)ldw,
      .rows = q->n,
      .cols = q->k,
      .fp16 = type == MT_DTYPE_FP16,
      .row_outer = q->num.weight_scale == MT_SCALE_ROW,
      .xhat = q->xhat,
      .codes = q->codes,
      .scales = q->scales,
      .outer = q->outer,
      .amax = amax_word(q->outer),
      .only_if = only_if,
  };
  return MT_OK;
}

int mt_quantize_weight_accepts(const void *w, enum mt_dtype type, size_t ldw, const mt_qweight *q) {
  mt_quant_params p;
  int status = weight_params(w, type, ldw, q, NULL, &p);
  return status == MT_OK ? mt_quantize_accepts(&p, q->num.weight_block == MT_WBLOCK_16X16) : status;
}

/* The kernels read *only_if themselves (the per-tensor amax word is zeroed regardless: scratch). */
int mt_quantize_weight_if(const void *w, enum mt_dtype type, size_t ldw, mt_qweight *q,
                          const uint32_t *only_if, mt_stream stream) {
  mt_quant_params p;
  int status = weight_params(w, type, ldw, q, only_if, &p);
  if (status == MT_OK)
    status = mt_quantize(&p, q->num.weight_block == MT_WBLOCK_16X16, stream);
  if (status != MT_OK)
    return status;
  return mt_gemm_pack_weight(q, only_if, stream);
}

int mt_quantize_weight(const void *w, enum mt_dtype type, size_t ldw, mt_qweight *q,
                       mt_stream stream) {
  return mt_quantize_weight_if(w, type, ldw, q, NULL, stream);
}

size_t mt_gemm_workspace_bytes(int m, int k, const mt_numerics *num) {
  if (!num || m <= 0 || k <= 0)
    return 0;
  return section((size_t)m * (size_t)k * 2) + outer_bytes(m, num->act_scale);
}

static int is_half(enum mt_dtype t) { return t == MT_DTYPE_BF16 || t == MT_DTYPE_FP16; }

/* What the quantizer and the GEMM kernels take; anything else is a counted fallback. Rows and
 * pointers on 16 bytes: the kernels move 16-byte vectors. */
static int gemm_args_ok(const mt_gemm_args *a) {
  const mt_qweight *w = a->w;
  if (a->m <= 0 || a->n <= 0 || a->k <= 0 || a->k % 16 || a->m > MT_GEMM_DIM_MAX ||
      a->n > MT_GEMM_DIM_MAX || !w || w->n != a->n || w->k != a->k || !w->codes || !w->scales ||
      !weight_shape_ok(w->n, w->k, &w->num))
    return 0;
  if (!a->x || !is_half(a->xtype) || !aligned16(a->x) || a->ldx < (size_t)a->k || a->ldx % 8)
    return 0;
  if (!a->y || !is_half(a->ytype) || !aligned16(a->y) || a->ldy < (size_t)a->n || a->ldy % 8)
    return 0;
  if (a->beta != 0.0f && (!a->c || !aligned16(a->c) || a->ldc < (size_t)a->n || a->ldc % 8))
    return 0;
  if (a->bias && (!aligned16(a->bias) || (!is_half(a->biastype) && a->biastype != MT_DTYPE_FP32)))
    return 0;
  return 1;
}

/* The workspace a call takes: its activations' sections, and after them, for a weight kept without
 * its dequantized copy, that copy (written by every call on the large path). */
static size_t call_workspace_bytes(const mt_gemm_args *a) {
  size_t acts = mt_gemm_workspace_bytes(a->m, a->k, &a->w->num);
  return acts + (a->w->xhat ? 0 : mt_qweight_xhat_bytes(a->n, a->k));
}

uint16_t *mt_gemm_kept_copy(const mt_gemm_args *a) {
  if (!a || !a->w || a->w->xhat || !a->workspace)
    return NULL;
  return (uint16_t *)((char *)a->workspace + mt_gemm_workspace_bytes(a->m, a->k, &a->w->num));
}

int mt_gemm(const mt_gemm_args *a, mt_stream stream) {
  if (!a || !gemm_args_ok(a))
    return MT_ERR_UNSUPPORTED;
  int path = mt_gemm_path_of(a);
  if (path < 0)
    return MT_ERR_UNSUPPORTED;
  const mt_numerics *num = &a->w->num;
  if (!a->workspace || ((uintptr_t)a->workspace % SECTION_ALIGN) ||
      a->workspace_bytes < call_workspace_bytes(a))
    return MT_ERR_NOMEM;
  if (!mt_driver_get())
    return MT_ERR_NO_DRIVER;
  if (path == MT_PATH_FUSED) /* few tokens: the GEMM quantizes them itself, bit for bit the same */
    return mt_gemm_launch_fused(a, stream);
  /* the path chosen once: the calls below ask mt_gemm_path_of again, which for a forced path only
   * checks that it fits */
  mt_gemm_args resolved = *a;
  resolved.path = (enum mt_gemm_path)path;
  a = &resolved;
  char *ws = a->workspace;
  mt_qweight dq;
  if (!a->w->xhat) { /* kept as codes and scales: their dequantized copy into the workspace first */
    dq = *a->w;
    dq.xhat = mt_gemm_kept_copy(a);
    int status = mt_dequantize(a->w, dq.xhat, stream);
    if (status != MT_OK)
      return status;
    resolved.w = &dq;
  }
  float *outer = (float *)(ws + section((size_t)a->m * (size_t)a->k * 2));
  mt_quant_params p = {
      .x = a->x,
      .ldx = (int64_t)a->ldx,
      .rows = a->m,
      .cols = a->k,
      .fp16 = a->xtype == MT_DTYPE_FP16,
      .row_outer = num->act_scale == MT_SCALE_ROW,
      .xhat = (uint16_t *)ws,
      .outer = outer,
      .amax = amax_word(outer),
  };
  int status = mt_quantize(&p, 0, stream);
  if (status != MT_OK)
    return status;
  mt_qact q = {.xhat = p.xhat, .outer = outer};
  return mt_gemm_launch(a, &q, stream);
}
