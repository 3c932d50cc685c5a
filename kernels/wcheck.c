/* wcheck.c — the frozen cache's refresh (engine.h: mt_refresh_weight, mt_wstore_refresh): the
 * change check of kernels/wcheck.cu, then the quantization of the slices it found changed. */
#include <stddef.h>
#include <stdint.h>

#include "kernels/driver.h"
#include "kernels/engine.h"
#include "kernels/wcheck.h"

size_t mt_refresh_state_bytes(int slices) { return slices > 0 ? MT_WCHECK_STATE_BYTES(slices) : 0; }

/* Enough CTAs of 256 threads to keep every SM streaming, few enough that the last-CTA handoff
 * stays cheap; the same for every launch, whatever the call covers, because the state's count of
 * finished CTAs, shared by every check of the weight, is read against gridDim.x. */
#define CHECK_CTAS 264

/* A call's covered slices are listed in each CTA's shared memory, 4 bytes a slice, within the 48 KB
 * a launch gets without asking; a store of more slices (no model has so many experts) is checked
 * whole. */
#define MAX_LISTED (48 * 1024 / 4)

/* The check of `slices` slices of rows x cols (row stride ldw, back to back) against `state`,
 * sampled by `step`, only the slices with rows under offs (when given): lists the changed ones on
 * the device, zeroing their amax words (`amax`, `amax_stride` apart) when given. */
static int check(const void *w, size_t ldw, int slices, int rows, int cols, void *state, unsigned step,
                 const int32_t *offs, int m, uint32_t *amax, size_t amax_stride, mt_stream stream) {
  if (!w || !state || slices <= 0 || rows <= 0 || cols % 16 || ldw % 8 || ((uintptr_t)w & 15) || (offs && m < 0))
    return MT_ERR_UNSUPPORTED;
  if ((uint64_t)rows * (uint64_t)((cols / 8 + 7) / 8) > UINT32_MAX / 2) return MT_ERR_UNSUPPORTED; /* 32-bit lines */
  if (slices > MAX_LISTED) offs = NULL;
  CUfunction f;
  int st = mt_kernel_get("wcheck", "mt_wcheck", (CUstream)stream, &f);
  if (st != MT_OK) return st;
  mt_wcheck_args a = {.w = w,
                      .ldw = (int64_t)ldw,
                      .rows = rows,
                      .cols = cols,
                      .slices = slices,
                      .step = step ? step : 1,
                      .offs = offs,
                      .m = m,
                      .state = state,
                      .amax = amax,
                      .amax_stride = (int64_t)amax_stride};
  const unsigned smem = offs ? 4u * (unsigned)slices : 0;
  return mt_launch(f, CHECK_CTAS, 1, 256, 1, smem, 0, (CUstream)stream, &a) == MT_OK ? MT_OK : MT_ERR_CUDA;
}

int mt_refresh_weight(const void *w, enum mt_dtype type, size_t ldw, mt_qweight *q, void *state, unsigned step,
                      mt_stream stream) {
  int st = q ? check(w, ldw, 1, q->n, q->k, state, step, NULL, 0, NULL, 0, stream) : MT_ERR_UNSUPPORTED;
  if (st != MT_OK) return st;
  return mt_quantize_weight_if(w, type, ldw, q, mt_wcheck_list(state, 1), stream);
}

int mt_wstore_refresh(const void *w, enum mt_dtype type, size_t ldw, mt_wstore *ws, void *state, unsigned step,
                      const int32_t *offs, int m, mt_stream stream) {
  if (!ws) return MT_ERR_UNSUPPORTED;
  /* per-tensor S: the check zeroes a changed slice's amax word (mt_wstore_quantize under a list) */
  uint32_t *amax = ws->num.weight_scale == MT_SCALE_TENSOR ? (uint32_t *)(mt_wstore_outer(ws, 0) + 1) : NULL;
  int st = check(w, ldw, ws->count, ws->n, ws->k, state, step, offs, m, amax, ws->slice_bytes, stream);
  if (st != MT_OK) return st;
  return mt_wstore_quantize(w, type, ldw, (size_t)ws->n * ldw, ws, mt_wcheck_list(state, ws->count), stream);
}
