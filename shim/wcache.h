/* wcache.h — the engine's device memory in the shim, per CUDA context: a scratch buffer per
 * stream, the memory of captured calls, and the quantized weights kept under
 * MINITE_WEIGHT_CACHE=frozen.
 *
 * Scratch holds a call's quantized activations (and, under requantize, its quantized weight). It
 * belongs to one stream and is leased to one call at a time (mt_wcache_prepare takes the lease,
 * mt_wcache_release gives it back once the call's launches are enqueued), so stream order keeps
 * a call from overwriting what an earlier call on that stream still reads, and threads on
 * different streams never wait for each other. It only grows, to a quarter more than the largest
 * call seen; growing waits for that stream alone.
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
 * Under frozen-sampled the hash covers one 1 KB run of lines in MT_SAMPLE_STEP (kernels/wcheck.h):
 * a call costs 1/64 of that read, and a change that misses every sampled line goes unseen (the
 * guarantee holds for weights changed as a whole, as an optimizer step changes them). A grouped
 * call's weights (all its experts, one tensor) make one entry: a store of slices
 * (kernels/wstore.h), refreshed slice by slice in one launch (mt_wstore_refresh), a call with
 * segment offsets refreshing only the slices with rows in it (the others are checked by the next
 * call that uses them). A call whose
 * weights are behind device pointer arrays (cublasGemmBatchedEx, cublasGemmGroupedBatchedEx,
 * cuBLASLt POINTER_ARRAY batches) has no address the host could key an entry by: it is
 * requantized at every call, whatever the mode.
 * MINITE_CACHE_MB bounds the entries of each context (not the scratch): each GPU has its own
 * memory, so a process driving several GPUs may keep that much on each; past it, weights are requantized in
 * scratch instead. An entry is made outside captures only: a weight first seen inside a capture
 * is requantized into the graph's memory at every replay (correct, slower).
 *
 * An entry is shared by every stream, its check's state and its quantized data alike, so its calls
 * run one at a time on the GPU: a call on another stream than the entry's last call first makes
 * its stream wait for that call's end (cuStreamWaitEvent), and every call records the entry's
 * event after its launches (one cuEventRecord a call); the context's kept-weight lock, held from
 * the entry's lookup to the release, keeps one thread's wait, launches and record together.
 * Unordered, two streams would mix their checks' sums and could read a slice the other still
 * requantizes: a stale weight. Streams are told apart by kernels/driver.h's mt_stream_key (two
 * threads' per-thread default streams are two streams, each with its own scratch, kept after the
 * thread ends: 64 streams a context have scratch, calls on more fall back). Calls inside a
 * capture neither wait (the other stream's work would join the graph) nor record: a graph's
 * replay checks the entry whenever it runs, ordered only as the program orders that replay.
 *
 * State lives per context slot (kernels/driver.h mt_ctx): a context found destroyed has its state
 * dropped (its memory went with it). A process forked after the engine ran routes nothing (CUDA
 * does not survive fork): its routed calls go to cuBLAS with the reason "no engine".
 */
#ifndef MT_WCACHE_H
#define MT_WCACHE_H

#include <stddef.h>
#include <stdint.h>

#include "base/params.h"
#include "kernels/engine.h"
#include "shim/router.h"

typedef struct {
  const void *w; /* the weight, [n][k] with row stride ldw */
  int n, k;
  size_t ldw;
  enum mt_dtype type;
  mt_numerics num;
} mt_weight_ref;

/* What a call holds until mt_wcache_release: its stream's scratch lease, or (captured) its
 * stream-ordered memory. */
typedef struct {
  void *lease;
  uint64_t graph_mem;
  mt_stream stream;
  void *state; /* the context's state (its counters); NULL when none was found */
  void *kept;  /* a kept weight's call: its context's lock, held; its order (shim/wcache.c) */
  void *order;
  int ordered; /* the stream waits for the weight's last call: the release records this one's end */
  int tracked; /* the release records the lease's end (a context of many streams: shim/wcache.c) */
} mt_wcache_hold;

/* What one routed problem gets. */
typedef struct {
  void *workspace;
  size_t workspace_bytes;
  mt_qweight *q;        /* quantized (or refreshed) on the stream, ready for mt_gemm */
  const uint64_t *wsum; /* frozen: the device word holding the weight's content hash as of this
                           call (kernels/wcheck.h, mt_wcheck_slice.hash); NULL under requantize
                           and frozen-sampled (whose hash covers a sample of the weight) */
  mt_wcache_hold hold;
  mt_qweight own; /* a weight quantized for this call alone (requantize, cache full, capture) */
} mt_engine_mem;

/* Take the settings of MINITE_WEIGHT_CACHE, MINITE_CACHE_MB and MINITE_CAPTURE. */
void mt_wcache_init(const mt_params *p);

/* Device memory for a problem of m tokens on `stream`, with W quantized as the cache mode says.
 * A reason other than MT_R_ROUTED means the call goes to cuBLAS (nothing was written to its
 * output). Whatever it returns, mt_wcache_release(&out->hold) follows, after the call's launches. */
enum mt_reason mt_wcache_prepare(const mt_weight_ref *w, int m, mt_stream stream, int capturing,
                                 mt_engine_mem *out);

/* A grouped call's weights: `groups` weights of n x k at row stride ldw, w_stride elements apart
 * (0: one weight for every group), or (w_ptrs) behind a device array of `groups` pointers. */
typedef struct {
  const void *w;
  int64_t w_stride;
  const void *const *w_ptrs;
  int groups, n, k;
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

/* In the child of any fork (shim/fork.h): a child of a process whose engine ran routes nothing. */
void mt_wcache_fork_child(void);

/* 1 (said once) in a process forked from one whose engine ran: it must make no CUDA call at all
 * (a driver call there is undefined, and may wait forever on a lock of the parent's threads). */
int mt_wcache_forked(void);

/* Give back what mt_wcache_prepare or mt_wcache_prepare_grouped took (the stream's lease; a
 * captured call's memory, freed in stream order after the kernels enqueued so far). */
void mt_wcache_release(mt_wcache_hold *hold);

/* Count the call as run by the engine in the context it got its memory from (before the release). */
void mt_wcache_ran(const mt_wcache_hold *hold);

/* "requantize", "frozen" or "frozen-sampled": the mode in force. */
const char *mt_wcache_mode(void);

/* The fallback reason of an engine status (MT_OK: MT_R_ROUTED). */
enum mt_reason mt_engine_reason(int status);

/* The summary's "engine" part (shim/stats.h: mt_stats_part): the mode, device bytes held, frozen
 * entries, calls that found the cache full, calls routed inside graph captures, grouped calls
 * whose weights were behind pointer arrays (requantized whatever the mode), the bytes per
 * weight element of the frozen grouped stores, and "contexts": for each CUDA context the engine
 * ran in, its device (ordinal and PCI address), the calls it ran there and the bytes it holds there. */
void mt_wcache_summary(void (*emit)(void *ctx, const char *text), void *ctx);

#endif
