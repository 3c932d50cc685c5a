/* wcheck.c — the launch of the frozen cache's change check (kernels/wcheck.cu); the refresh that
 * runs it before the weight's conditional quantization is mt_wstore_refresh (kernels/grouped.c). */
#include <stddef.h>

#include "kernels/driver.h"
#include "kernels/engine.h"
#include "kernels/wcheck.h"

_Static_assert(sizeof(mt_wcheck_state) <= MT_REFRESH_STATE_BYTES, "refresh state too small");

/* Enough CTAs of 256 threads to keep every SM streaming, few enough that the last-CTA handoff
 * stays cheap. */
#define CHECK_CTAS 264

int mt_wcheck_launch(const mt_wcheck_args *a, mt_stream stream) {
  if (!a->w || !a->state || a->cols % 16 || a->ldw % 8 || ((uintptr_t)a->w & 15) || !a->step ||
      (a->amax && (a->amax_count <= 0 || ((uintptr_t)a->amax & 3) || a->amax_stride % 4)))
    return MT_ERR_UNSUPPORTED;
  CUfunction f;
  int st = mt_kernel_get("wcheck", "mt_wcheck", (CUstream)stream, &f);
  if (st != MT_OK) return st;
  return mt_launch(f, CHECK_CTAS, 1, 256, 1, 0, 0, (CUstream)stream, (void *)a) == MT_OK ? MT_OK : MT_ERR_CUDA;
}
