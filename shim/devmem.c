/* devmem.c — the device memory of routed calls per CUDA context (see devmem.h).
 *
 * Locks: one per context (its scratch slots; shim/wcache.c keeps its tables of kept weights under
 * it too) and one per scratch buffer (the lease a call holds while it enqueues its launches). The
 * order is context, then lease: context_of takes each lease of a destroyed context under the
 * context's lock to drop its state (shim/wcache.c puts its kept-weight lock between the two).
 */
#include "shim/devmem.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/log.h"

#define MAX_STREAMS 64 /* streams with scratch, per context */

typedef struct {
  pthread_mutex_t lock;     /* the lease */
  unsigned long long owner; /* the context ID this slot belongs to; 0: dropped */
  CUstream stream;
  uintptr_t key; /* the stream's (kernels/driver.h: mt_stream_key) */
  CUdeviceptr mem;
  size_t bytes;
  CUevent done; /* the end of the slot's last tracked lease (scratch_idle); NULL until one */
  int recorded; /* done was recorded at the last lease's end */
} scratch;

struct mt_devctx {
  pthread_mutex_t lock;
  unsigned long long id; /* the context (kernels/driver.h); 0: none yet */
  scratch scratch[MAX_STREAMS];
  int nscratch;
  atomic_size_t held; /* this context's bytes, kept weights' included (counted without its lock) */
  int device;         /* its device's ordinal and PCI address, for the statistics */
  char pci[32];
  int sm90; /* the device runs the kernels: else its calls go to cuBLAS before taking memory */
  atomic_ullong routed; /* calls the engine ran here */
};
typedef mt_devctx context;

static context contexts[MT_MAX_CONTEXTS];
static pthread_once_t locks_once = PTHREAD_ONCE_INIT;
static int capture_graph = 1;
static atomic_size_t held_total;
static atomic_int engine_used, forked_after_use; /* CUDA does not survive a fork */

static void init_locks(void) {
  for (int i = 0; i < MT_MAX_CONTEXTS; i++) {
    pthread_mutex_init(&contexts[i].lock, NULL);
    for (int j = 0; j < MAX_STREAMS; j++)
      pthread_mutex_init(&contexts[i].scratch[j].lock, NULL);
  }
}

/* A forked child of a process whose engine ran cannot use CUDA: such a child routes nothing, and
 * never touches a lock another thread of its parent may have held at the fork. A child forked
 * before the engine ran starts from nothing and routes as any process. */
void mt_devmem_fork_child(void) {
  if (atomic_load(&engine_used))
    atomic_store(&forked_after_use, 1);
}

int mt_devmem_forked(void) {
  if (atomic_load_explicit(&forked_after_use, memory_order_relaxed)) {
    MT_WARN_ONCE("this process was forked from one that used CUDA, which a forked child cannot "
                 "use: its routed GEMMs go to cuBLAS (reason \"no engine\"); start workers with "
                 "spawn, or fork them before CUDA is used");
    return 1;
  }
  return 0;
}

void mt_devmem_init(const mt_params *p) {
  capture_graph = p->capture == MT_CAPTURE_GRAPH;
  pthread_once(&locks_once, init_locks);
}

size_t mt_devmem_bytes(void) { return atomic_load(&held_total) + mt_ctx_device_bytes(); }

/* Each context the engine ran in, so that a process driving several GPUs shows what each did. */
void mt_devmem_summary(void (*emit)(void *ctx, const char *text), void *ctx) {
  emit(ctx, ", \"contexts\": [");
  int first = 1;
  for (int i = 0; i < MT_MAX_CONTEXTS; i++) {
    context *c = &contexts[i];
    pthread_mutex_lock(&c->lock);
    char b[256];
    b[0] = '\0';
    if (c->id)
      snprintf(b, sizeof b,
               "%s{\"device\": %d, \"pci_bus\": \"%s\", \"routed\": %llu, \"device_bytes\": "
               "%zu}",
               first ? "" : ", ", c->device, c->pci, (unsigned long long)atomic_load(&c->routed),
               atomic_load(&c->held));
    pthread_mutex_unlock(&c->lock);
    if (b[0])
      emit(ctx, b), first = 0;
  }
  emit(ctx, "]");
}

/* --- contexts ---------------------------------------------------------------------------- */

/* Forget what belonged to a destroyed context: its memory went with it, so nothing is freed;
 * a call of that context still holding a lease ends first (shim/wcache.c forgets its kept weights
 * likewise). Under the context's lock. */
static void context_drop(context *c) {
  for (int i = 0; i < c->nscratch; i++) {
    scratch *s = &c->scratch[i];
    pthread_mutex_lock(&s->lock);
    s->owner = 0, s->stream = NULL, s->key = 0, s->mem = 0, s->bytes = 0, s->done = NULL;
    s->recorded = 0;
    pthread_mutex_unlock(&s->lock);
  }
  c->nscratch = 0;
  atomic_fetch_sub(&held_total, atomic_exchange(&c->held, 0));
}

/* The current context's state, locked. */
static context *context_of(const mt_ctx *x) {
  context *c = &contexts[x->index];
  pthread_mutex_lock(&c->lock);
  if (c->id != x->id) {
    if (c->id)
      MT_INFO("a CUDA context was destroyed: the engine's state of it is dropped");
    context_drop(c);
    c->id = x->id;
    c->device = mt_device_current(c->pci, sizeof c->pci);
    c->sm90 = mt_device_sm90();
    atomic_store(&c->routed, 0);
  }
  return c;
}

void mt_devmem_count(context *c, long long bytes) {
  atomic_fetch_add(&c->held, (size_t)bytes);
  atomic_fetch_add(&held_total, (size_t)bytes);
}

/* Outside captures (relaxed: legal while another thread captures). */
enum mt_reason mt_devmem_alloc(const mt_driver *d, size_t bytes, CUdeviceptr *out) {
  int relaxed = mt_capture_relax();
  CUresult r = d->mem_alloc(out, bytes);
  mt_capture_restore(relaxed);
  if (r != CUDA_SUCCESS) {
    MT_WARN_ONCE("could not allocate %zu bytes of device memory for the engine: routed GEMMs that "
                 "need more fall back to cuBLAS (reason \"out of memory\")",
                 bytes);
    return MT_R_NOMEM;
  }
  return MT_R_ROUTED;
}

void mt_devmem_free(const mt_driver *d, CUdeviceptr p) {
  int relaxed = mt_capture_relax();
  d->mem_free(p);
  mt_capture_restore(relaxed);
}

int mt_devmem_record_end(const mt_driver *d, CUevent *ev, CUstream s) {
  if (!*ev) {
    int relaxed = mt_capture_relax();
    if (d->event_create(ev, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS)
      *ev = NULL;
    mt_capture_restore(relaxed);
  }
  return *ev && d->event_record(*ev, s) == CUDA_SUCCESS;
}

/* --- scratch ------------------------------------------------------------------------------- */

/* A context keeps scratch for MAX_STREAMS streams. From RECLAIM_FROM streams on, each lease's end
 * is recorded on its stream (an event, whose cost lab/probe_order measures: lab/NOTES.md, "Open
 * questions"), so that once every slot is taken a slot whose last use has ended goes to the next
 * new stream (a program that makes streams as it goes, or short-lived threads each on its
 * per-thread default stream); a program of a few streams records nothing. Slots leased only before
 * that are kept by their streams. */
#define RECLAIM_FROM (MAX_STREAMS / 2)

/* A slot nobody holds whose last lease's recorded end has passed, returned locked; or NULL. Under
 * the context's lock. */
static scratch *scratch_idle(const mt_driver *d, context *c) {
  for (int i = 0; i < c->nscratch; i++) {
    scratch *s = &c->scratch[i];
    if (pthread_mutex_trylock(&s->lock))
      continue;
    int idle = 0;
    if (s->recorded) {
      int relaxed = mt_capture_relax(); /* a query, beside another thread's capture */
      idle = d->event_query(s->done) == CUDA_SUCCESS;
      mt_capture_restore(relaxed);
    }
    if (idle)
      return s;
    pthread_mutex_unlock(&s->lock);
  }
  return NULL;
}

/* The stream's slot: its own, a new one, or an idle one given to it (its memory kept: nothing runs
 * on it). Under the context's lock; NULL when there is none to be had. */
static scratch *scratch_find(const mt_driver *d, context *c, unsigned long long id, CUstream stream,
                             uintptr_t key) {
  for (int i = 0; i < c->nscratch; i++)
    if (c->scratch[i].key == key)
      return &c->scratch[i];
  if (c->nscratch < MAX_STREAMS) { /* no other thread knows this slot yet */
    scratch *s = &c->scratch[c->nscratch++];
    s->owner = id, s->mem = 0, s->bytes = 0, s->done = NULL;
    s->stream = stream, s->key = key, s->recorded = 0;
    return s;
  }
  scratch *s = scratch_idle(d, c);
  if (s) { /* under both locks: its old stream's caller reads the key under the slot's */
    s->stream = stream, s->key = key, s->recorded = 0;
    pthread_mutex_unlock(&s->lock);
  }
  return s;
}

/* This stream's scratch slot, leased (its lock held); NULL when there is none to be had. *tracked:
 * the release records the lease's end (RECLAIM_FROM). Releases the context's lock. */
static scratch *scratch_lease(const mt_driver *d, context *c, unsigned long long id,
                              CUstream stream, int *tracked, enum mt_reason *why) {
  const uintptr_t key = mt_stream_key(stream);
  for (;;) {
    scratch *s = scratch_find(d, c, id, stream, key);
    *tracked = c->nscratch >= RECLAIM_FROM;
    pthread_mutex_unlock(&c->lock);
    if (!s) {
      MT_WARN_ONCE("%d streams route GEMMs in one CUDA context and none of their calls has "
                   "ended: calls on further streams fall back to cuBLAS (reason \"out of "
                   "memory\") until one has",
                   MAX_STREAMS);
      *why = MT_R_NOMEM;
      return NULL;
    }
    pthread_mutex_lock(&s->lock);
    if (s->owner != id) { /* dropped meanwhile: the context is gone */
      pthread_mutex_unlock(&s->lock);
      *why = MT_R_NO_ENGINE;
      return NULL;
    }
    if (s->key == key)
      return s;
    pthread_mutex_unlock(&s->lock); /* given to another stream meanwhile: look again */
    pthread_mutex_lock(&c->lock);
  }
}

/* The leased scratch, at least `bytes` long. Growing waits for the stream, so that the old buffer
 * is no longer read when it is freed; it is rare (the largest call so far grows it), and no graph
 * holds the old buffer (captured calls never use scratch). */
static enum mt_reason scratch_grow(const mt_driver *d, context *c, scratch *s, size_t bytes) {
  if (s->bytes >= bytes)
    return MT_R_ROUTED;
  size_t want = bytes + bytes / 4; /* room for the next, slightly larger call */
  if (s->mem) {
    int relaxed = mt_capture_relax();
    CUresult r = d->stream_synchronize(s->stream);
    mt_capture_restore(relaxed);
    if (r != CUDA_SUCCESS) {
      MT_WARN_ONCE("could not wait for a stream to grow the engine's scratch: routed GEMMs that "
                   "need more fall back to cuBLAS (reason \"engine error\")");
      return MT_R_ENGINE;
    }
    mt_devmem_free(d, s->mem);
    mt_devmem_count(c, -(long long)s->bytes);
    s->mem = 0;
    s->bytes = 0;
  }
  enum mt_reason r = mt_devmem_alloc(d, want, &s->mem);
  if (r != MT_R_ROUTED)
    return r;
  s->bytes = want;
  mt_devmem_count(c, (long long)want);
  return MT_R_ROUTED;
}

enum mt_reason mt_engine_reason(int status) {
  switch (status) {
  case MT_OK:
    return MT_R_ROUTED;
  case MT_ERR_CAPTURE:
    return MT_R_CAPTURE;
  case MT_ERR_NOMEM:
    return MT_R_NOMEM;
  case MT_ERR_NO_DRIVER:
  case MT_ERR_NO_DEVICE:
    return MT_R_NO_ENGINE;
  default:
    return MT_R_ENGINE;
  }
}

/* --- a call's memory ----------------------------------------------------------------------- */

/* A captured call's memory: stream-ordered, on the capturing stream, so that it becomes the
 * graph's own. */
static enum mt_reason graph_memory(const mt_driver *d, CUstream stream, size_t bytes,
                                   mt_devmem_hold *out) {
  CUdeviceptr p;
  if (!capture_graph)
    return MT_R_CAPTURE;
  if (!d->mem_alloc_async || !d->mem_free_async) {
    MT_WARN_ONCE(
        "this CUDA driver has no stream-ordered allocation (cuMemAllocAsync): routed GEMMs "
        "inside CUDA graph captures fall back to cuBLAS (reason \"capture\")");
    return MT_R_CAPTURE;
  }
  if (d->mem_alloc_async(&p, bytes, stream) != CUDA_SUCCESS) {
    MT_WARN_ONCE("could not take %zu bytes of graph memory (cuMemAllocAsync) in a CUDA graph "
                 "capture: such routed GEMMs fall back to cuBLAS (reason \"capture\"); "
                 "MINITE_CAPTURE=off says so without trying",
                 bytes);
    return MT_R_CAPTURE;
  }
  out->graph_mem = p;
  return MT_R_ROUTED;
}

enum mt_reason mt_devmem_take(const mt_driver *d, context *c, const mt_ctx *x, mt_stream stream,
                              size_t bytes, int capturing, mt_devmem_hold *out, CUdeviceptr *mem) {
  enum mt_reason r = MT_R_ROUTED;
  if (capturing) {
    pthread_mutex_unlock(&c->lock);
    if ((r = graph_memory(d, (CUstream)stream, bytes, out)) == MT_R_ROUTED)
      *mem = (CUdeviceptr)out->graph_mem;
    return r;
  }
  scratch *s = scratch_lease(d, c, x->id, (CUstream)stream, &out->tracked, &r); /* unlocks */
  if (!s)
    return r;
  out->lease = s;
  if ((r = scratch_grow(d, c, s, bytes)) == MT_R_ROUTED)
    *mem = s->mem;
  return r;
}

context *mt_devmem_current(const mt_driver *d, mt_ctx *x) {
  if (!d || mt_devmem_forked())
    return NULL;
  pthread_once(&locks_once, init_locks);
  int st = mt_ctx_current(x);
  if (st == MT_OK && !atomic_load_explicit(&engine_used, memory_order_relaxed))
    atomic_store(&engine_used, 1); /* from here on, a forked child cannot use CUDA */
  context *c = st == MT_OK ? context_of(x) : NULL;
  if (!c)
    MT_WARN_ONCE("no usable current CUDA context for a routed GEMM (none current, or more than %d "
                 "alive): it runs in cuBLAS (reason \"no engine\")",
                 MT_MAX_CONTEXTS);
  if (c && !c->sm90) {
    MT_WARN_ONCE("GPU %d (%s) is not an sm_90 device, which the NVFP4 kernels need: its routed "
                 "GEMMs run in cuBLAS (reason \"no engine\")",
                 c->device, c->pci[0] ? c->pci : "PCI address unknown");
    pthread_mutex_unlock(&c->lock);
    return NULL;
  }
  return c;
}

void mt_devmem_unlock(context *c) { pthread_mutex_unlock(&c->lock); }

void mt_devmem_ran(const mt_devmem_hold *mem) {
  if (mem->state)
    atomic_fetch_add_explicit(&mem->state->routed, 1, memory_order_relaxed);
}

void mt_devmem_release(mt_devmem_hold *mem) {
  const mt_driver *d = mt_driver_get();
  if (mem->graph_mem && d &&
      d->mem_free_async((CUdeviceptr)mem->graph_mem, (CUstream)mem->stream) != CUDA_SUCCESS)
    MT_WARN_ONCE("could not free a captured call's graph memory (cuMemFreeAsync): the graph keeps "
                 "it until it is destroyed");
  if (mem->lease) {
    scratch *s = mem->lease;
    if (mem->tracked && d) /* a context of many streams: the slot can go once this has ended */
      s->recorded = mt_devmem_record_end(d, &s->done, s->stream);
    pthread_mutex_unlock(&s->lock);
  }
  mem->graph_mem = 0;
  mem->lease = NULL;
  mem->tracked = 0;
}
