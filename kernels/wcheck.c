/* wcheck.c — the frozen cache's refresh of a per-call weight (engine.h: mt_refresh_weight): the
 * change check of kernels/wcheck.cu, then the quantization if it found a change. A grouped store's
 * refresh is one launch of its own (kernels/grouped.c: mt_wstore_refresh, or inside the grouped
 * call). */
#include <stddef.h>
#include <stdint.h>

#include "kernels/driver.h"
#include "kernels/engine.h"
#include "kernels/wcheck.h"
#include "kernels/whash.h"

size_t mt_refresh_state_bytes(int slices) { return slices > 0 ? MT_WCHECK_STATE_BYTES(slices) : 0; }

/* Enough CTAs of 256 threads to keep every SM streaming, few enough that the last-CTA handoff
 * stays cheap; the same for every launch, because the state's count of finished CTAs, shared by
 * every check of the weight, is read against gridDim.x. */
#define CHECK_CTAS 264

/* The check of a weight of rows x cols (row stride ldw) against `state`, sampled by `step`: its
 * dirty word on the device (mt_wcheck_list). */
static int check(const void *w, size_t ldw, int rows, int cols, void *state, unsigned step,
                 mt_stream stream) {
  if (!w || !state || rows <= 0 || cols % 16 || ldw % 8 || ((uintptr_t)w & 15))
    return MT_ERR_UNSUPPORTED;
  if (!mt_whash_lines_fit(rows, cols))
    return MT_ERR_UNSUPPORTED;
  CUfunction f;
  int st = mt_kernel_get("wcheck", "mt_wcheck", (CUstream)stream, &f);
  if (st != MT_OK)
    return st;
  mt_wcheck_args a = {.w = w,
                      .ldw = (int64_t)ldw,
                      .rows = rows,
                      .cols = cols,
                      .slices = 1,
                      .step = step ? step : 1,
                      .state = state};
  return mt_launch(f, CHECK_CTAS, 1, 256, 1, 0, 0, (CUstream)stream, &a) == MT_OK ? MT_OK
                                                                                  : MT_ERR_CUDA;
}

/* The check has stored the new hash as the quantization's: after a failed launch it must not
 * stand, or every later check would find the weight unchanged and keep what q holds. */
static void forget(void *state, mt_stream stream) {
  const mt_driver *d = mt_driver_get();
  uint32_t *valid = &mt_wcheck_slices(state)[0].valid;
  if (d)
    d->memset_d8_async((CUdeviceptr)valid, 0, sizeof *valid, (CUstream)stream);
}

int mt_refresh_weight(const void *w, enum mt_dtype type, size_t ldw, mt_qweight *q, void *state,
                      unsigned step, mt_stream stream) {
  int st = mt_quantize_weight_accepts(w, type, ldw, q);
  if (st == MT_OK)
    st = check(w, ldw, q->in_out ? q->k : q->n, q->in_out ? q->n : q->k, state, step, stream);
  if (st != MT_OK)
    return st;
  st = mt_quantize_weight_if(w, type, ldw, q, mt_wcheck_list(state, 1), stream);
  if (st != MT_OK)
    forget(state, stream);
  return st;
}
