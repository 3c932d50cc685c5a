/* wcache.h — the engine's device memory in the shim, per CUDA context: a scratch buffer per
 * stream, the memory of captured calls, and the quantized weights kept under weight_cache = frozen.
 *
 * Scratch holds a call's quantized activations (and, under requantize, its quantized weight). It
 * belongs to one stream and is leased to one call at a time (mt_wcache_prepare takes the lease,
 * mt_wcache_release gives it back once the call's launches are enqueued), so stream order keeps
 * a call from overwriting what an earlier call on that stream still reads, and threads on
 * different streams never wait for each other. It only grows, to the largest call seen; growing
 * waits for that stream alone.
 *
 * A call on a stream that is capturing a CUDA graph never touches that scratch: it takes its
 * memory with stream-ordered allocation on the capturing stream (cuMemAllocAsync, then
 * cuMemFreeAsync after the call's kernels), which the capture turns into the graph's own memory
 * nodes. A graph thus owns what its routed calls use: replays do not depend on which stream ran
 * the warm-up, on later growth of any scratch, or on other streams, and its memory lives as long
 * as the graph. MINITE_CAPTURE=off sends captured calls to cuBLAS instead (reason "capture").
 *
 * Frozen entries are keyed by the weight's address, shape, row stride, type and numerics, and are
 * refreshed at every call on the device (mt_refresh_weight: a hash of the whole weight, compared
 * with the one of its last quantization). The guarantee: a frozen weight is never stale, whatever
 * wrote it; the cost per call: one read of the BF16 weight instead of a full requantization.
 * MINITE_CACHE_MB bounds the entries (not the scratch); past it, weights are requantized in
 * scratch instead. An entry is made outside captures only: a weight first seen inside a capture
 * is requantized into the graph's memory at every replay (correct, slower). An entry is shared by
 * every stream, and so is its check's state: two streams checking one entry at the same moment
 * (nothing orders them on the GPU) mix their sums, which costs requantizations of identical bytes,
 * and after a change of the weight may leave both streams' quantizations skipped (one stream's
 * check stores the new hash before the other's compares it): a stale weight. A state per stream
 * (the quantized data shared) would close that; not done here.
 *
 * State lives per context slot (kernels/driver.h mt_ctx): a context found destroyed has its state
 * dropped (its memory went with it). A process forked after the engine ran routes nothing (CUDA
 * does not survive fork): its routed calls go to cuBLAS with the reason "no engine".
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

/* What one routed problem gets, and holds until mt_wcache_release. */
typedef struct {
  void *workspace;
  size_t workspace_bytes;
  mt_qweight *q;        /* quantized (or refreshed) on the stream, ready for mt_gemm */
  const uint64_t *wsum; /* frozen: the device word holding the weight's content hash as of this
                           call (kernels/wcheck.h, mt_wcheck_state.hash); NULL under requantize */
  /* the hold: the stream's scratch lease, or the captured call's stream-ordered memory */
  void *lease;
  uint64_t graph_mem;
  mt_stream stream;
  mt_qweight own; /* a weight quantized for this call alone (requantize, cache full, capture) */
} mt_engine_mem;

/* Read MINITE_WEIGHT_CACHE (overrides the spec's weight_cache), MINITE_CACHE_MB and
 * MINITE_CAPTURE. Returns the number of invalid values (each warned about). */
int mt_wcache_init(const mt_spec *s);

/* Device memory for a problem of m tokens on `stream`, with W quantized as the cache mode says.
 * A reason other than MT_R_ROUTED means the call goes to cuBLAS (nothing was written to its
 * output). Whatever it returns, mt_wcache_release(out) follows, after the call's launches. */
enum mt_reason mt_wcache_prepare(const mt_weight_ref *w, int m, mt_stream stream, int capturing,
                                 mt_engine_mem *out);

/* 1 (said once) in a process forked from one whose engine ran: it must make no CUDA call at all
 * (a driver call there is undefined, and may wait forever on a lock of the parent's threads). */
int mt_wcache_forked(void);

/* Give back what mt_wcache_prepare took (the stream's lease; a captured call's memory, freed in
 * stream order after the kernels enqueued so far). */
void mt_wcache_release(mt_engine_mem *mem);

/* "requantize" or "frozen": the mode in force. */
const char *mt_wcache_mode(void);

/* The fallback reason of an engine status (MT_OK: MT_R_ROUTED). */
enum mt_reason mt_engine_reason(int status);

/* The summary's "engine" part (shim/stats.h: mt_stats_part): the mode, device bytes held, frozen
 * entries, calls that found the cache full, and calls routed inside graph captures. */
void mt_wcache_summary(void (*emit)(void *ctx, const char *text), void *ctx);

#endif
