/* wcache.h — the weights the engine keeps across calls (MINITE_WEIGHT_CACHE = frozen or
 * frozen-sampled), per CUDA context, and what a routed call gets for its weight: kept, refreshed,
 * or quantized into the call's own memory (requantize, and whatever cannot be kept), which
 * shim/devmem.h provides.
 *
 * Frozen entries are keyed by the weight's address, shape, layout ([out][in] or [in][out]), row
 * stride, type and numerics, and are refreshed at every call on the device (mt_refresh_weight: a
 * hash of the whole weight, compared with the one of its last quantization). The guarantee: a
 * frozen weight is never stale, whatever wrote it; the cost per call: one read of the BF16 weight
 * instead of a full requantization.
 * Under frozen-sampled the hash covers one 1 KB run of lines in MT_SAMPLE_STEP (kernels/whash.h):
 * a call costs 1/512 of that read, and a change that misses every sampled line goes unseen (the
 * guarantee holds for weights changed as a whole, as an optimizer step changes them). A grouped
 * call's weights (all its experts, one tensor) make one entry: a store of slices
 * (kernels/wstore.h), refreshed slice by slice in one launch (mt_wstore_refresh), a call with
 * segment offsets refreshing only the slices with rows in it (the others are checked by the next
 * call that uses them). A call whose weights are behind device pointer arrays
 * (cublasGemmBatchedEx, cublasGemmGroupedBatchedEx, cuBLASLt POINTER_ARRAY batches) has no address
 * the host could key an entry by: it is requantized at every call, whatever the mode.
 * MINITE_CACHE_MB bounds the entries of each context (not the scratch): each GPU has its own
 * memory, so a process driving several GPUs may keep that much on each; past it, weights are
 * requantized in scratch instead. An entry is made outside captures only: a weight first seen
 * inside a capture is requantized into the graph's memory at every replay (correct, slower).
 *
 * An entry is shared by every stream, its check's state and its quantized data alike, so its calls
 * run one at a time on the GPU: a call on another stream than the entry's last call first makes
 * its stream wait for that call's end (cuStreamWaitEvent), and every call records the entry's
 * event after its launches (one cuEventRecord a call); the context's kept-weight lock, held from
 * the entry's lookup to the release, keeps one thread's wait, launches and record together.
 * Unordered, two streams would mix their checks' sums and could read a slice the other still
 * requantizes: a stale weight. Streams are told apart by kernels/driver.h's mt_stream_key. Calls
 * inside a capture neither wait (the other stream's work would join the graph) nor record: a
 * graph's replay checks the entry whenever it runs, ordered only as the program orders that
 * replay. A context found destroyed has its kept weights dropped with its device memory.
 */
#ifndef MT_WCACHE_H
#define MT_WCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "base/params.h"
#include "kernels/engine.h"
#include "shim/devmem.h"
#include "shim/router.h"

typedef struct {
  const void *w; /* the weight, [n][k] with row stride ldw; [k][n] where in_out */
  int n, k;
  int in_out; /* stored [in][out] (kernels/engine.h, mt_qweight.in_out): part of an entry's key */
  size_t ldw;
  enum mt_dtype type;
  mt_numerics num;
} mt_weight_ref;

/* What a call holds until mt_wcache_release: its memory (shim/devmem.h), and on a kept weight its
 * context's kept-weight lock and the weight's order. */
typedef struct {
  mt_devmem_hold mem;
  void *kept; /* a kept weight's call: its context's lock, held; its order (shim/wcache.c) */
  void *order;
  int ordered; /* the stream waits for the weight's last call: the release records this one's end */
} mt_wcache_hold;

/* What one routed problem gets. */
typedef struct {
  void *workspace;
  size_t workspace_bytes;
  mt_qweight *q;        /* quantized (or refreshed) on the stream, ready for mt_gemm */
  const uint64_t *wsum; /* frozen-sampled: the device word holding the weight's sampled hash as
                           of this call (kernels/wcheck.h, mt_wcheck_slice.hash), which is the
                           digests' weight sum (kernels/instr.h); NULL under requantize and
                           frozen (whose hash covers every line) */
  mt_wcache_hold hold;
  mt_qweight own; /* a weight quantized for this call alone (requantize, cache full, capture) */
} mt_engine_mem;

/* Take the settings of MINITE_WEIGHT_CACHE and MINITE_CACHE_MB. */
void mt_wcache_init(const mt_params *p);

/* Device memory for a problem of m tokens on `stream`, with W quantized as the cache mode says.
 * A reason other than MT_R_ROUTED means the call goes to cuBLAS (nothing was written to its
 * output). Whatever it returns, mt_wcache_release(&out->hold) follows, after the call's
 * launches. */
enum mt_reason mt_wcache_prepare(const mt_weight_ref *w, int m, mt_stream stream, int capturing,
                                 mt_engine_mem *out);

/* A grouped call's weights: `groups` weights of n x k at row stride ldw, w_stride elements apart
 * (0: one weight for every group), or (w_ptrs) behind a device array of `groups` pointers. */
typedef struct {
  const void *w;
  int64_t w_stride;
  const void *const *w_ptrs;
  int groups, n, k;
  int in_out; /* each weight stored [in][out], k rows of n (w_stride then k * ldw back to back) */
  size_t ldw;
  enum mt_dtype type;
  mt_numerics num;
  size_t extra_bytes; /* more of the call's own memory it needs (a segment table) */
} mt_wgroup_ref;

/* What a grouped call gets: the activations' workspace, extra_bytes of its own (NULL when none
 * were asked) and the weights' store, quantized on the stream or, frozen, to be refreshed by the
 * call (refresh.ws set: mt_grouped_args.refresh, which runs it beside the activations'
 * quantization; it covers every slice until the caller sets refresh.offs to the call's segment
 * table). A store of one slice serves all groups when w_stride is 0 (and there is no w_ptrs); the
 * refresh then covers that slice (refreshed: the store as the entry keeps it). */
typedef struct {
  void *workspace;
  size_t workspace_bytes;
  void *extra;
  mt_wstore store;
  mt_wstore refreshed;
  mt_wstore_refresh_args refresh;
  mt_wcache_hold hold;
} mt_grouped_mem;

/* The same for a grouped call of `rows` activation rows in all. Frozen: a store per weight tensor,
 * refreshed by every call as the mode says (the slices must lie back to back; else, past
 * MINITE_CACHE_MB or in a capture, requantized in the call's own memory). Weights behind pointer
 * arrays are requantized in the call's own memory at every call whatever the mode (a frozen entry
 * is keyed by addresses the host never sees; said once at INFO, counted in the summary's
 * pointer_array_calls). Whatever it returns, mt_wcache_release(&out->hold) follows, after the
 * call's launches. */
enum mt_reason mt_wcache_prepare_grouped(const mt_wgroup_ref *w, int rows, mt_stream stream,
                                         int capturing, mt_grouped_mem *out);

/* Give back what mt_wcache_prepare or mt_wcache_prepare_grouped took (the kept weight's lock, after
 * recording the call's end for the weight's next call; the call's memory: mt_devmem_release). */
void mt_wcache_release(mt_wcache_hold *hold);

/* "requantize", "frozen" or "frozen-sampled": the mode in force. */
const char *mt_wcache_mode(void);

/* The summary's "engine" part (shim/stats.h: mt_stats_part): the mode, device bytes held, frozen
 * entries, calls that found the cache full, calls routed inside graph captures, grouped calls
 * whose weights were behind pointer arrays (requantized whatever the mode), the bytes per
 * weight element of the frozen grouped stores, and "contexts" (mt_devmem_summary). */
void mt_wcache_summary(void (*emit)(void *ctx, const char *text), void *ctx);

#endif
