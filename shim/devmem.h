/* devmem.h — the device memory every routed call uses, per CUDA context: a scratch buffer per
 * stream, the memory of captured calls, the per-context state (its device, its counters), and the
 * engine gate of a call (a usable sm_90 context, a process not forked after its engine ran). The
 * weights kept across calls are shim/wcache.h's, which takes its calls' memory from here.
 *
 * Scratch holds a call's quantized activations (and, under requantize, its quantized weight). It
 * belongs to one stream and is leased to one call at a time (mt_devmem_take takes the lease,
 * mt_devmem_release gives it back once the call's launches are enqueued), so stream order keeps
 * a call from overwriting what an earlier call on that stream still reads, and threads on
 * different streams never wait for each other. It only grows, to a quarter more than the largest
 * call seen; growing waits for that stream alone. Streams are told apart by kernels/driver.h's
 * mt_stream_key (two threads' per-thread default streams are two streams, each with its own
 * scratch, kept after the thread ends: 64 streams a context have scratch, calls on more fall
 * back).
 *
 * A call on a stream that is capturing a CUDA graph never touches that scratch: it takes its
 * memory with stream-ordered allocation on the capturing stream (cuMemAllocAsync, then
 * cuMemFreeAsync after the call's kernels), which the capture turns into the graph's own memory
 * nodes. A graph thus owns what its routed calls use: replays do not depend on which stream ran
 * the warm-up, on later growth of any scratch, or on other streams, and its memory lives as long
 * as the graph. MINITE_CAPTURE=off sends captured calls to cuBLAS instead (reason "capture").
 *
 * State lives per context slot (kernels/driver.h mt_ctx): a context found destroyed has its state
 * dropped (its memory went with it). A process forked after the engine ran routes nothing (CUDA
 * does not survive fork): its routed calls go to cuBLAS with the reason "no engine".
 */
#ifndef MT_DEVMEM_H
#define MT_DEVMEM_H

#include <stddef.h>
#include <stdint.h>

#include "base/params.h"
#include "kernels/driver.h"
#include "kernels/engine.h"
#include "shim/router.h"

/* A context's state (shim/devmem.c). */
typedef struct mt_devctx mt_devctx;

/* What a call holds until mt_devmem_release: its stream's scratch lease, or (captured) its
 * stream-ordered memory. */
typedef struct {
  void *lease;
  uint64_t graph_mem;
  mt_stream stream;
  mt_devctx *state; /* the context's state (its counters); NULL when none was found */
  int tracked; /* the release records the lease's end (a context of many streams: shim/devmem.c) */
} mt_devmem_hold;

/* Take the setting of MINITE_CAPTURE. */
void mt_devmem_init(const mt_params *p);

/* The current context's state, locked (mt_devmem_take or mt_devmem_unlock releases it); NULL
 * (said once) when there is none to be had: no driver, a forked process, no usable context, or
 * not an sm_90 device. *x gets the context. */
mt_devctx *mt_devmem_current(const mt_driver *d, mt_ctx *x);

void mt_devmem_unlock(mt_devctx *c);

/* `bytes` of the call's memory at *mem: the graph's memory when capturing, else the stream's
 * scratch, leased (hold->lease). Releases the context's lock. */
enum mt_reason mt_devmem_take(const mt_driver *d, mt_devctx *c, const mt_ctx *x, mt_stream stream,
                              size_t bytes, int capturing, mt_devmem_hold *hold, CUdeviceptr *mem);

/* Give back what mt_devmem_take took (the stream's lease; a captured call's memory, freed in
 * stream order after the kernels enqueued so far). */
void mt_devmem_release(mt_devmem_hold *hold);

/* Count the call as run by the engine in the context it got its memory from (before the
 * release). */
void mt_devmem_ran(const mt_devmem_hold *hold);

/* Device memory outside scratch, for what a caller keeps in a context: an allocation (relaxed
 * around another thread's capture; a failure warned once: MT_R_NOMEM), its release, and the bytes
 * counted as the context's (negative: given back). */
enum mt_reason mt_devmem_alloc(const mt_driver *d, size_t bytes, CUdeviceptr *out);
void mt_devmem_free(const mt_driver *d, CUdeviceptr p);
void mt_devmem_count(mt_devctx *c, long long bytes);

/* The end of a call's launches recorded on its stream in *ev, created at the first end it records
 * (NULL while it cannot be); whether it was. */
int mt_devmem_record_end(const mt_driver *d, CUevent *ev, CUstream s);

/* The fallback reason of an engine status (MT_OK: MT_R_ROUTED). */
enum mt_reason mt_engine_reason(int status);

/* In the child of any fork (shim/fork.h): a child of a process whose engine ran routes nothing. */
void mt_devmem_fork_child(void);

/* 1 (said once) in a process forked from one whose engine ran: it must make no CUDA call at all
 * (a driver call there is undefined, and may wait forever on a lock of the parent's threads). */
int mt_devmem_forked(void);

/* The bytes of device memory the engine holds, in every context. */
size_t mt_devmem_bytes(void);

/* The summary's "contexts" member (", \"contexts\": [...]"): for each CUDA context the engine ran
 * in, its device (ordinal and PCI address), the calls it ran there and the bytes it holds there. */
void mt_devmem_summary(void (*emit)(void *ctx, const char *text), void *ctx);

#endif
