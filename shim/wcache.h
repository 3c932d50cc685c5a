/* wcache.h — the engine's device memory in the shim, per CUDA context: a scratch buffer per
 * stream, and the quantized weights kept under weight_cache = frozen.
 *
 * Scratch holds a call's quantized activations (and, under requantize, its quantized weight). It
 * belongs to one stream, so stream order alone keeps one call from overwriting what an earlier
 * call on that stream still reads; it only grows, to the largest call seen. Growing (and creating
 * a frozen entry) allocates, so it is refused while the stream is capturing: a program that
 * captures CUDA graphs runs its routed shapes once before capturing (PyTorch's warm-up does), or
 * the captured calls fall back to cuBLAS with the reason "capture".
 *
 * Frozen entries are keyed by the weight's address, shape, row stride, type and numerics, and are
 * refreshed at every call on the device (mt_refresh_weight: a hash of the whole weight, compared
 * with the one of its last quantization). The guarantee: a frozen weight is never stale, whatever
 * wrote it; the cost per call: one read of the BF16 weight instead of a full requantization.
 * MINITE_CACHE_MB bounds the entries (not the scratch); past it, weights are requantized in
 * scratch instead.
 *
 * Not thread-safe by itself: shim/exec.c calls it under its lock.
 */
#ifndef MT_WCACHE_H
#define MT_WCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/engine.h"
#include "shim/router.h"

typedef struct {
  const void *w; /* the weight, [n][k] with row stride ldw */
  int n, k;
  size_t ldw;
  enum mt_dtype type;
  mt_numerics num;
} mt_weight_ref;

/* What one routed problem gets. */
typedef struct {
  void *workspace;
  size_t workspace_bytes;
  mt_qweight *q;        /* quantized (or refreshed) on the stream, ready for mt_gemm */
  const uint64_t *wsum; /* frozen: the device word holding the weight's content hash as of this
                           call (kernels/wcheck.h, mt_wcheck_state.hash); NULL under requantize */
} mt_engine_mem;

/* Read MINITE_WEIGHT_CACHE (overrides the spec's weight_cache) and MINITE_CACHE_MB. Returns the
 * number of invalid values (each warned about). */
int mt_wcache_init(const mt_spec *s);

/* Device memory for a problem of m tokens on `stream`, with W quantized as the cache mode says. A
 * reason other than MT_R_ROUTED means the call goes to cuBLAS (nothing was written to its
 * output). */
enum mt_reason mt_wcache_prepare(const mt_weight_ref *w, int m, mt_stream stream, int capturing,
                                 mt_engine_mem *out);

/* A grouped call's weights: `groups` weights of n x k at row stride ldw, w_stride elements apart
 * (0: one weight for every group). */
typedef struct {
  const void *w;
  int64_t w_stride;
  int groups, n, k;
  size_t ldw;
  enum mt_dtype type;
  mt_numerics num;
} mt_wgroup_ref;

/* What a grouped call gets: the activations' workspace and the weights' store, quantized (or
 * refreshed) on the stream. A store of one slice serves all groups when w_stride is 0. */
typedef struct {
  void *workspace;
  size_t workspace_bytes;
  mt_wstore store;
} mt_grouped_mem;

/* The same for a grouped call of `rows` activation rows in all. Frozen: a store per weight tensor,
 * refreshed at every call by a hash of the whole tensor (the slices must lie back to back; else
 * and past MINITE_CACHE_MB, requantized in scratch). */
enum mt_reason mt_wcache_prepare_grouped(const mt_wgroup_ref *w, int rows, mt_stream stream,
                                         int capturing, mt_grouped_mem *out);

/* "requantize" or "frozen": the mode in force. */
const char *mt_wcache_mode(void);

/* The fallback reason of an engine status (MT_OK: MT_R_ROUTED). */
enum mt_reason mt_engine_reason(int status);

/* The summary's "engine" part (shim/stats.h: mt_stats_part): the mode, device bytes held, frozen
 * entries, and calls that found the cache full. */
void mt_wcache_summary(void (*emit)(void *ctx, const char *text), void *ctx);

#endif
