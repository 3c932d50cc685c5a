/* wcheck.c — the frozen cache's refresh (engine.h: mt_refresh_weight): the change check of
 * kernels/wcheck.cu, then the weight's quantization, which runs only when the check found a
 * change. */
#include <stddef.h>

#include "kernels/driver.h"
#include "kernels/engine.h"
#include "kernels/wcheck.h"

_Static_assert(sizeof(mt_wcheck_state) <= MT_REFRESH_STATE_BYTES, "refresh state too small");

/* Enough CTAs of 256 threads to keep every SM streaming, few enough that the last-CTA handoff
 * stays cheap. */
#define CHECK_CTAS 264

/* The check of rows x cols (row stride ldw) against `state`, sampled by `step`: sets its dirty word
 * on the device. */
static int check(const void *w, size_t ldw, int rows, int cols, void *state, unsigned step, mt_stream stream) {
  if (!w || !state || cols % 16 || ldw % 8 || ((uintptr_t)w & 15)) return MT_ERR_UNSUPPORTED;
  CUfunction f;
  int st = mt_kernel_get("wcheck", "mt_wcheck", (CUstream)stream, &f);
  if (st != MT_OK) return st;
  mt_wcheck_args a = {w, (int64_t)ldw, rows, cols, (mt_wcheck_state *)state, step ? step : 1};
  return mt_launch(f, CHECK_CTAS, 1, 256, 1, 0, 0, (CUstream)stream, &a) == MT_OK ? MT_OK : MT_ERR_CUDA;
}

int mt_refresh_weight(const void *w, enum mt_dtype type, size_t ldw, mt_qweight *q, void *state, unsigned step,
                      mt_stream stream) {
  int st = q ? check(w, ldw, q->n, q->k, state, step, stream) : MT_ERR_UNSUPPORTED;
  if (st != MT_OK) return st;
  return mt_quantize_weight_if(w, type, ldw, q, &((mt_wcheck_state *)state)->dirty, stream);
}

int mt_wstore_refresh(const void *w, enum mt_dtype type, size_t ldw, mt_wstore *ws, void *state, unsigned step,
                      mt_stream stream) {
  /* the slices back to back: one matrix of count * n rows */
  int st = ws ? check(w, ldw, ws->count * ws->n, ws->k, state, step, stream) : MT_ERR_UNSUPPORTED;
  if (st != MT_OK) return st;
  return mt_wstore_quantize(w, type, ldw, (size_t)ws->n * ldw, ws, &((mt_wcheck_state *)state)->dirty, stream);
}
