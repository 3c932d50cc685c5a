/* wcache.c — the engine's device memory per CUDA context (see wcache.h).
 *
 * Locks: one per context (its tables: scratch slots, frozen entries), one per context for the
 * calls on its kept weights (taken with the weight's lookup, held until the call's release, so
 * that one call's wait, launches and event on a weight are never interleaved with another
 * thread's), and one per scratch buffer (the lease a call holds while it enqueues its launches).
 * A context lock is never taken while the others are held, except by context_of when it drops a
 * destroyed context's state (it waits for the kept-weight lock, then takes each lease in turn):
 * the order is context, kept, lease.
 */
#include "shim/wcache.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/params.h"
#include "kernels/driver.h"
#include "kernels/wcheck.h"

#define MAX_STREAMS 64   /* streams with scratch, per context */
#define MAX_ENTRIES 8192 /* frozen weights, per context */
#define ALIGN 256        /* what mt_qweight_bind and the workspace want */

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

/* The calls that use one kept weight (a frozen entry or store), in the order their launches were
 * enqueued: a call on another stream than the last one's waits for that call's event first, so
 * that no two calls check, requantize or read the weight at once (its check's state and its
 * quantized data are one, shared by every stream). */
typedef struct {
  CUevent done;   /* recorded after the last call's launches; NULL until one is */
  int pending;    /* a call's end is in `done`: a call on another stream waits for it */
  uintptr_t last; /* that call's stream (kernels/driver.h: mt_stream_key) */
} order;

typedef struct {
  mt_weight_ref ref;
  CUdeviceptr mem; /* quantized weight, then the refresh state */
  mt_qweight q;
  order order;
} entry;

/* A grouped weight's store under MINITE_WEIGHT_CACHE=frozen: a few per layer, searched in order. */
#define MAX_GROUPED 1024
typedef struct {
  mt_wgroup_ref ref;
  CUdeviceptr mem; /* the store, then the refresh state */
  mt_wstore store;
  order order;
} gentry;

typedef struct {
  pthread_mutex_t lock;
  pthread_mutex_t kept;  /* held by a call on a kept weight from its lookup to its release */
  unsigned long long id; /* the context (kernels/driver.h); 0: none yet */
  scratch scratch[MAX_STREAMS];
  int nscratch;
  entry *entries; /* open addressing over MAX_ENTRIES slots, allocated with the context */
  int nentries;
  gentry *gentries; /* MAX_GROUPED, allocated at the first grouped call */
  int ngentries;
  atomic_size_t held; /* this context's bytes: all (counted without its lock) */
  size_t cached;      /* ... and those of frozen entries */
  int device;         /* its device's ordinal and PCI address, for the statistics */
  char pci[32];
  int sm90; /* the device runs the kernels: else its calls go to cuBLAS before taking memory */
  atomic_ullong routed; /* calls the engine ran here */
} context;

static context contexts[MT_MAX_CONTEXTS];
static pthread_once_t locks_once = PTHREAD_ONCE_INIT;
static enum mt_wcache mode; /* MINITE_WEIGHT_CACHE */
static int frozen;          /* frozen or frozen-sampled: weights kept and checked */
static unsigned check_step; /* the check's sample: 1 (every byte) or MT_SAMPLE_STEP */
static int capture_graph = 1;
static size_t cache_limit;
static atomic_size_t held_total;
static atomic_ullong cache_full, captured_calls;
static atomic_ullong pointer_array_calls; /* grouped calls with weights behind pointer arrays */
static atomic_ullong store_bytes, store_elems;   /* the kept weights' bytes and elements */
static atomic_int engine_used, forked_after_use; /* CUDA does not survive a fork */

static void init_locks(void) {
  for (int i = 0; i < MT_MAX_CONTEXTS; i++) {
    pthread_mutex_init(&contexts[i].lock, NULL);
    pthread_mutex_init(&contexts[i].kept, NULL);
    for (int j = 0; j < MAX_STREAMS; j++)
      pthread_mutex_init(&contexts[i].scratch[j].lock, NULL);
  }
}

/* A forked child of a process whose engine ran cannot use CUDA: such a child routes nothing, and
 * never touches a lock another thread of its parent may have held at the fork. A child forked
 * before the engine ran starts from nothing and routes as any process. */
void mt_wcache_fork_child(void) {
  if (atomic_load(&engine_used))
    atomic_store(&forked_after_use, 1);
}

int mt_wcache_forked(void) {
  if (atomic_load_explicit(&forked_after_use, memory_order_relaxed)) {
    MT_WARN_ONCE("this process was forked from one that used CUDA, which a forked child cannot "
                 "use: its routed GEMMs go to cuBLAS (reason \"no engine\"); start workers with "
                 "spawn, or fork them before CUDA is used");
    return 1;
  }
  return 0;
}

void mt_wcache_init(const mt_params *p) {
  mode = p->weight_cache;
  frozen = mode != MT_WCACHE_REQUANTIZE;
  check_step = mode == MT_WCACHE_FROZEN_SAMPLED ? MT_SAMPLE_STEP : 1;
  cache_limit = (size_t)p->cache_mb << 20;
  capture_graph = p->capture == MT_CAPTURE_GRAPH;
  pthread_once(&locks_once, init_locks);
}

const char *mt_wcache_mode(void) { return mt_wcache_names[mode]; }

/* Each context the engine ran in: its device, the calls it ran there and the memory it holds
 * there, so that a process driving several GPUs shows what each did. */
static void emit_contexts(void (*emit)(void *ctx, const char *text), void *ctx) {
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

void mt_wcache_summary(void (*emit)(void *ctx, const char *text), void *ctx) {
  int n = 0;
  for (int i = 0; i < MT_MAX_CONTEXTS; i++) {
    pthread_mutex_lock(&contexts[i].lock);
    n += contexts[i].nentries + contexts[i].ngentries;
    pthread_mutex_unlock(&contexts[i].lock);
  }
  unsigned long long elems = atomic_load(&store_elems);
  char b[384];
  snprintf(b, sizeof b,
           ", \"engine\": {\"weight_cache\": \"%s\", \"device_bytes\": %zu, "
           "\"frozen_weights\": %d, \"cache_full\": %llu, \"captured_calls\": %llu, "
           "\"pointer_array_calls\": %llu, \"store_bytes_per_element\": %.4f",
           mt_wcache_mode(), atomic_load(&held_total) + mt_ctx_device_bytes(), n,
           (unsigned long long)atomic_load(&cache_full),
           (unsigned long long)atomic_load(&captured_calls),
           (unsigned long long)atomic_load(&pointer_array_calls),
           elems ? (double)atomic_load(&store_bytes) / (double)elems : 0.0);
  emit(ctx, b);
  emit_contexts(emit, ctx);
  emit(ctx, "}");
}

static size_t round_up(size_t v) { return (v + ALIGN - 1) / ALIGN * ALIGN; }

/* --- contexts ---------------------------------------------------------------------------- */

/* Forget what belonged to a destroyed context: its memory went with it, so nothing is freed;
 * a call of that context still holding a lease ends first. Under the context's lock. */
static void context_drop(context *c) {
  pthread_mutex_lock(&c->kept); /* a call on one of its kept weights ends first */
  pthread_mutex_unlock(&c->kept);
  for (int i = 0; i < c->nscratch; i++) {
    scratch *s = &c->scratch[i];
    pthread_mutex_lock(&s->lock);
    s->owner = 0, s->stream = NULL, s->key = 0, s->mem = 0, s->bytes = 0, s->done = NULL;
    s->recorded = 0;
    pthread_mutex_unlock(&s->lock);
  }
  c->nscratch = 0;
  if (c->entries)
    memset(c->entries, 0, MAX_ENTRIES * sizeof *c->entries);
  c->nentries = 0;
  c->ngentries = 0;
  atomic_fetch_sub(&held_total, atomic_exchange(&c->held, 0));
  c->cached = 0;
}

/* The current context's state, locked; NULL (said once) when there is none. */
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
  if (!c->entries && frozen && !(c->entries = calloc(MAX_ENTRIES, sizeof *c->entries))) {
    pthread_mutex_unlock(&c->lock);
    return NULL;
  }
  return c;
}

static void count_bytes(context *c, long long bytes) {
  atomic_fetch_add(&c->held, (size_t)bytes);
  atomic_fetch_add(&held_total, (size_t)bytes);
}

/* An allocation outside captures (relaxed: legal while another thread captures). */
static enum mt_reason device_alloc(const mt_driver *d, size_t bytes, CUdeviceptr *out) {
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

static void device_free(const mt_driver *d, CUdeviceptr p) {
  int relaxed = mt_capture_relax();
  d->mem_free(p);
  mt_capture_restore(relaxed);
}

/* The end of a call's launches recorded on its stream in *ev, created at the first end it records
 * (NULL while it cannot be); whether it was. */
static int record_end(const mt_driver *d, CUevent *ev, CUstream s) {
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
 * is recorded on its stream (an event: ~0.2 µs of host time a call, lab/NOTES.md "probe_order"),
 * so that once every slot is taken a slot whose last use has ended goes to the next new stream
 * (a program that makes streams as it goes, or short-lived threads each on its per-thread default
 * stream); a program of a few streams records nothing. Slots leased only before that are kept by
 * their streams. */
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
    device_free(d, s->mem);
    count_bytes(c, -(long long)s->bytes);
    s->mem = 0;
    s->bytes = 0;
  }
  enum mt_reason r = device_alloc(d, want, &s->mem);
  if (r != MT_R_ROUTED)
    return r;
  s->bytes = want;
  count_bytes(c, (long long)want);
  return MT_R_ROUTED;
}

/* --- frozen entries ------------------------------------------------------------------------- */

/* The numerics an entry was quantized under: another spec is another entry. */
static int same_num(const mt_numerics *a, const mt_numerics *b) {
  return a->act_scale == b->act_scale && a->weight_scale == b->weight_scale &&
         a->weight_block == b->weight_block;
}

static int same_ref(const mt_weight_ref *a, const mt_weight_ref *b) {
  return a->w == b->w && a->n == b->n && a->k == b->k && a->ldw == b->ldw && a->type == b->type &&
         same_num(&a->num, &b->num);
}

static size_t slot_of(const mt_weight_ref *w) {
  uint64_t h =
      (uint64_t)(uintptr_t)w->w * 0x9E3779B97F4A7C15ull ^ (uint64_t)w->n << 32 ^ (uint64_t)w->k;
  return (size_t)(h >> 40) % MAX_ENTRIES;
}

/* Whether `bytes` more fit in the context's MINITE_CACHE_MB: the bound is per context, as each
 * GPU has its own memory (a process driving several GPUs may keep that much on each). Under the
 * context's lock, as are its entries. */
static int cache_fits(const context *c, size_t bytes) { return c->cached + bytes <= cache_limit; }

/* A frozen entry's memory: `data` bytes, then the refresh state of its `slices`, zeroed on the
 * stream (a zeroed state has no hash yet: the first refresh quantizes); counted against the
 * context's MINITE_CACHE_MB. *why says whether the call can still go on, requantizing in its own
 * memory (cache full). */
static int entry_alloc(const mt_driver *d, context *c, size_t data, int slices, mt_stream stream,
                       CUdeviceptr *mem, enum mt_reason *why) {
  const size_t state = mt_refresh_state_bytes(slices), bytes = data + state;
  *why = MT_R_ROUTED;
  if (!cache_fits(c, bytes)) {
    atomic_fetch_add(&cache_full, 1);
    return 0; /* requantized in scratch instead: slower, never wrong */
  }
  if ((*why = device_alloc(d, bytes, mem)) != MT_R_ROUTED)
    return 0;
  if (d->memset_d8_async(*mem + data, 0, state, stream) != CUDA_SUCCESS) {
    MT_WARN_ONCE("could not clear a frozen weight's state: such calls fall back to cuBLAS");
    device_free(d, *mem);
    *why = MT_R_ENGINE;
    return 0;
  }
  count_bytes(c, (long long)bytes);
  c->cached += bytes;
  return 1;
}

/* The frozen entry of w, its kept form kbytes long (then its refresh state): found, or made (NULL
 * when none can be made: full, capturing, no memory; *why says whether the call can still go on,
 * requantizing in its own memory). Under the context's lock. */
static entry *entry_get(const mt_driver *d, context *c, const mt_weight_ref *w, size_t kbytes,
                        int capturing, mt_stream stream, enum mt_reason *why) {
  size_t i = slot_of(w);
  for (int probes = 0; probes < MAX_ENTRIES; probes++, i = (i + 1) % MAX_ENTRIES) {
    if (!c->entries[i].mem)
      break;
    if (same_ref(&c->entries[i].ref, w))
      return &c->entries[i];
  }
  *why = MT_R_ROUTED;
  if (capturing)
    return NULL; /* no allocation in a capture: requantized in the graph's memory */
  if (c->nentries >= MAX_ENTRIES / 2) {
    atomic_fetch_add(&cache_full, 1);
    return NULL;
  }
  CUdeviceptr mem;
  if (!entry_alloc(d, c, kbytes, 1, stream, &mem, why))
    return NULL;
  atomic_fetch_add(&store_bytes, kbytes);
  atomic_fetch_add(&store_elems, (unsigned long long)w->n * (unsigned)w->k);
  entry *e = &c->entries[i];
  e->ref = *w;
  e->mem = mem;
  mt_qweight_bind_kept(&e->q, w->n, w->k, &w->num, (void *)mem);
  c->nentries++;
  return e;
}

/* --- the order of a kept weight's calls ---------------------------------------------------- */

/* A call on kept weight `o` outside a capture holds the context's kept-weight lock from here
 * (under the context's lock) to mt_wcache_release. */
static void order_take(context *c, order *o, mt_wcache_hold *hold) {
  pthread_mutex_lock(&c->kept);
  hold->kept = &c->kept;
  hold->order = o;
}

/* The call's stream waits for the weight's last call where that ran on another stream. */
static enum mt_reason order_wait(const mt_driver *d, mt_wcache_hold *hold) {
  order *o = hold->order;
  CUstream s = (CUstream)hold->stream;
  if (o->pending && o->last != mt_stream_key(s) &&
      d->stream_wait_event(s, o->done, 0) != CUDA_SUCCESS) {
    MT_WARN_ONCE("could not order a routed GEMM after another stream's call on the same kept "
                 "weight (cuStreamWaitEvent): such calls fall back to cuBLAS (reason \"engine "
                 "error\")");
    return MT_R_ENGINE;
  }
  hold->ordered = 1;
  return MT_R_ROUTED;
}

/* After the call's launches: the weight's event recorded on the call's stream, for the next call
 * on another. Without an event, the stream is waited for, so that no later call has to. */
static void order_done(const mt_driver *d, mt_wcache_hold *hold) {
  order *o = hold->order;
  CUstream s = (CUstream)hold->stream;
  o->last = mt_stream_key(s);
  o->pending = record_end(d, &o->done, s);
  if (o->pending)
    return;
  MT_WARN_ONCE("could not record the end of a routed GEMM on a kept weight (cuEventRecord): its "
               "stream is waited for instead, so that a call on another stream finds it done");
  int relaxed = mt_capture_relax();
  CUresult r = d->stream_synchronize(s);
  mt_capture_restore(relaxed);
  if (r != CUDA_SUCCESS)
    MT_WARN_ONCE("could not wait for a stream after a routed GEMM on a kept weight "
                 "(cuStreamSynchronize): a call on another stream may check or requantize that "
                 "weight while this one still reads it");
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

/* A weight's quantization (or refresh) as a reason; a failure other than capture warned once. */
static enum mt_reason weight_status(int st) {
  if (st != MT_OK && st != MT_ERR_CAPTURE)
    MT_WARN_ONCE("the NVFP4 engine could not quantize a routed weight: %s; such calls fall back to "
                 "cuBLAS",
                 mt_status_name((enum mt_status)st));
  return mt_engine_reason(st);
}

/* --- a call's memory ----------------------------------------------------------------------- */

/* A captured call's memory: stream-ordered, on the capturing stream, so that it becomes the
 * graph's own. */
static enum mt_reason graph_memory(const mt_driver *d, CUstream stream, size_t bytes,
                                   mt_wcache_hold *out) {
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

/* Memory for the call: graph memory when capturing, else the stream's scratch (leased). */
static enum mt_reason call_memory(const mt_driver *d, context *c, const mt_ctx *x, CUstream stream,
                                  size_t bytes, int capturing, mt_wcache_hold *out,
                                  CUdeviceptr *mem) {
  enum mt_reason r = MT_R_ROUTED;
  if (capturing) {
    pthread_mutex_unlock(&c->lock);
    if ((r = graph_memory(d, stream, bytes, out)) == MT_R_ROUTED)
      *mem = (CUdeviceptr)out->graph_mem;
    return r;
  }
  scratch *s = scratch_lease(d, c, x->id, stream, &out->tracked, &r); /* releases the lock */
  if (!s)
    return r;
  out->lease = s;
  if ((r = scratch_grow(d, c, s, bytes)) == MT_R_ROUTED)
    *mem = s->mem;
  return r;
}

/* The call's memory after its weight's entry was looked up (`why`: the lookup's verdict; `kept`:
 * the entry's order, NULL without one): the workspace, and room for the weight unless an entry
 * keeps it; outside a capture, the call put in the kept weight's order. Releases the context's
 * lock. */
static enum mt_reason take_memory(const mt_driver *d, context *c, const mt_ctx *x, mt_stream stream,
                                  size_t ws, size_t wbytes, order *kept, enum mt_reason why,
                                  int capturing, mt_wcache_hold *hold, CUdeviceptr *mem) {
  if (kept && !capturing)
    order_take(c, kept, hold);
  if (!ws || !wbytes || why != MT_R_ROUTED) {
    pthread_mutex_unlock(&c->lock);
    if (ws && wbytes)
      return why;
    MT_WARN_ONCE("the NVFP4 engine has no layout for a routed weight's shape under the spec's "
                 "numerics: such calls fall back to cuBLAS (reason \"engine error\")");
    return MT_R_ENGINE;
  }
  enum mt_reason r =
      call_memory(d, c, x, (CUstream)stream, ws + (kept ? 0 : wbytes), capturing, hold, mem);
  return r == MT_R_ROUTED && hold->order ? order_wait(d, hold) : r;
}

/* The weight's quantization or refresh status as the call's reason, captured calls counted. */
static enum mt_reason weight_done(int st, int capturing) {
  enum mt_reason r = weight_status(st);
  if (capturing && r == MT_R_ROUTED)
    atomic_fetch_add(&captured_calls, 1);
  return r;
}

/* The current context's state, locked; NULL (said once) when there is none to be had. */
static context *current(const mt_driver *d, mt_ctx *x) {
  if (!d || mt_wcache_forked())
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

enum mt_reason mt_wcache_prepare(const mt_weight_ref *w, int m, mt_stream stream, int capturing,
                                 mt_engine_mem *out) {
  memset(out, 0, sizeof *out);
  out->hold.stream = stream;
  const mt_driver *d = mt_driver_get();
  mt_ctx x;
  context *c = current(d, &x);
  if (!c)
    return MT_R_NO_ENGINE;
  out->hold.state = c;
  size_t ws = round_up(mt_gemm_workspace_bytes(m, w->k, &w->num));
  size_t qbytes = round_up(mt_qweight_bytes(w->n, w->k, &w->num));
  size_t kbytes = round_up(mt_qweight_kept_bytes(w->n, w->k, &w->num));
  entry *e = NULL;
  enum mt_reason why = MT_R_ROUTED;
  if (ws && qbytes && frozen)
    e = entry_get(d, c, w, kbytes, capturing, stream, &why);
  if (e) /* a kept weight's dequantized copy lives in the call's workspace (mt_gemm) */
    ws += round_up(mt_qweight_xhat_bytes(w->n, w->k));
  CUdeviceptr mem = 0;
  enum mt_reason r = take_memory(d, c, &x, stream, ws, qbytes, e ? &e->order : NULL, why, capturing,
                                 &out->hold, &mem);
  if (r != MT_R_ROUTED)
    return r;
  out->workspace = (void *)mem;
  out->workspace_bytes = ws;
  if (e) {
    out->q = &e->q;
    /* frozen-sampled's hash covers a sample of the lines: not the weight's content sum, which a
     * digest's key needs to join a process under another cache mode */
    if (check_step == 1)
      out->wsum = &mt_wcheck_slices((void *)(uintptr_t)(e->mem + kbytes))->hash;
    return weight_done(mt_refresh_weight(w->w, w->type, w->ldw, &e->q, (void *)(e->mem + kbytes),
                                         check_step, stream),
                       capturing);
  }
  mt_qweight_bind(&out->own, w->n, w->k, &w->num, (void *)(mem + ws));
  out->q = &out->own;
  return weight_done(mt_quantize_weight(w->w, w->type, w->ldw, &out->own, stream), capturing);
}

void mt_wcache_ran(const mt_wcache_hold *mem) {
  if (mem->state)
    atomic_fetch_add_explicit(&((context *)mem->state)->routed, 1, memory_order_relaxed);
}

void mt_wcache_release(mt_wcache_hold *mem) {
  const mt_driver *d = mt_driver_get();
  if (mem->ordered)
    order_done(d, mem);
  if (mem->graph_mem && d &&
      d->mem_free_async((CUdeviceptr)mem->graph_mem, (CUstream)mem->stream) != CUDA_SUCCESS)
    MT_WARN_ONCE("could not free a captured call's graph memory (cuMemFreeAsync): the graph keeps "
                 "it until it is destroyed");
  if (mem->lease) {
    scratch *s = mem->lease;
    if (mem->tracked && d) /* a context of many streams: the slot can go once this has ended */
      s->recorded = record_end(d, &s->done, s->stream);
    pthread_mutex_unlock(&s->lock);
  }
  if (mem->kept)
    pthread_mutex_unlock(mem->kept);
  mem->graph_mem = 0;
  mem->lease = NULL;
  mem->kept = NULL;
  mem->order = NULL;
  mem->ordered = 0;
  mem->tracked = 0;
}

/* --- grouped calls ------------------------------------------------------------------------- */

static int same_gref(const mt_wgroup_ref *a, const mt_wgroup_ref *b) {
  return a->w == b->w && a->w_stride == b->w_stride && a->groups == b->groups && a->n == b->n &&
         a->k == b->k && a->ldw == b->ldw && a->type == b->type && same_num(&a->num, &b->num);
}

/* The frozen store of w: found, or made (NULL when none can be made: the slices not back to back,
 * full, capturing, no memory; *why says whether the call can still go on). Under the context's
 * lock. */
static gentry *gentry_get(const mt_driver *d, context *c, const mt_wgroup_ref *w, size_t sbytes,
                          int capturing, mt_stream stream, enum mt_reason *why) {
  *why = MT_R_ROUTED;
  for (int i = 0; i < c->ngentries; i++)
    if (same_gref(&c->gentries[i].ref, w))
      return &c->gentries[i];
  if (w->w_stride && w->w_stride != (int64_t)w->n * (int64_t)w->ldw)
    return NULL; /* gaps between the slices: the check reads slice e at e * n * ldw */
  if (capturing)
    return NULL; /* no allocation in a capture: requantized in the graph's memory */
  if (!c->gentries && !(c->gentries = calloc(MAX_GROUPED, sizeof *c->gentries)))
    return NULL;
  if (c->ngentries == MAX_GROUPED) {
    atomic_fetch_add(&cache_full, 1);
    return NULL;
  }
  CUdeviceptr mem;
  const int slices = w->w_stride ? w->groups : 1;
  if (!entry_alloc(d, c, sbytes, slices, stream, &mem, why))
    return NULL;
  atomic_fetch_add(&store_bytes, sbytes);
  atomic_fetch_add(&store_elems, (unsigned long long)slices * (unsigned)w->n * (unsigned)w->k);
  gentry *e = &c->gentries[c->ngentries++];
  e->ref = *w;
  e->mem = mem;
  mt_wstore_bind(&e->store, slices, w->n, w->k, &w->num, (void *)mem);
  return e;
}

/* One slice serves every group: the kernel steps by slice_bytes, 0 here. */
static void share_slices(mt_wstore *s, const mt_wgroup_ref *w) {
  if (w->w_stride || w->w_ptrs)
    return;
  s->count = w->groups;
  s->slice_bytes = 0;
}

/* Weights behind pointer arrays: no frozen entry; said once where a frozen mode was asked. */
static void count_pointer_arrays(void) {
  static atomic_int said;
  atomic_fetch_add(&pointer_array_calls, 1);
  if (frozen && !atomic_exchange(&said, 1))
    MT_INFO(
        "routed calls whose weights are behind device pointer arrays (cublasGemmBatchedEx, "
        "cublasGemmGroupedBatchedEx, cuBLASLt POINTER_ARRAY batches) are requantized at every "
        "call: MINITE_WEIGHT_CACHE=%s keeps weights by address, which only the device knows there",
        mt_wcache_mode());
}

/* The store's quantization into the call's own memory, from a stride or pointer arrays. */
static int quantize_store(const mt_wgroup_ref *w, mt_wstore *store, mt_stream stream) {
  if (w->w_ptrs)
    return mt_wstore_quantize_ptrs(w->w_ptrs, w->type, w->ldw, store, stream);
  return mt_wstore_quantize(w->w, w->type, w->ldw, (size_t)w->w_stride, store, stream);
}

enum mt_reason mt_wcache_prepare_grouped(const mt_wgroup_ref *w, int rows, mt_stream stream,
                                         int capturing, mt_grouped_mem *out) {
  memset(out, 0, sizeof *out);
  out->hold.stream = stream;
  const mt_driver *d = mt_driver_get();
  mt_ctx x;
  context *c = current(d, &x);
  if (!c)
    return MT_R_NO_ENGINE;
  out->hold.state = c;
  const int slices = w->w_stride || w->w_ptrs ? w->groups : 1;
  size_t ws = round_up(mt_grouped_workspace_bytes(rows, w->k, &w->num));
  size_t extra = round_up(w->extra_bytes);
  size_t sbytes = round_up(mt_wstore_bytes(slices, w->n, w->k, &w->num));
  gentry *e = NULL;
  enum mt_reason why = MT_R_ROUTED;
  if (w->w_ptrs)
    count_pointer_arrays();
  else if (ws && sbytes && frozen)
    e = gentry_get(d, c, w, sbytes, capturing, stream, &why);
  CUdeviceptr mem = 0;
  enum mt_reason r = take_memory(d, c, &x, stream, ws ? ws + extra : 0, sbytes,
                                 e ? &e->order : NULL, why, capturing, &out->hold, &mem);
  if (r != MT_R_ROUTED)
    return r;
  out->workspace = (void *)mem;
  out->workspace_bytes = ws;
  out->extra = extra ? (void *)(mem + ws) : NULL;
  int st = MT_OK;
  if (e) {
    out->store = out->refreshed = e->store;
    out->refresh = (mt_wstore_refresh_args){.w = w->w,
                                            .type = w->type,
                                            .ldw = w->ldw,
                                            .ws = &out->refreshed,
                                            .state = (void *)(e->mem + sbytes),
                                            .step = check_step,
                                            .m = rows};
  } else {
    mt_wstore_bind(&out->store, slices, w->n, w->k, &w->num, (void *)(mem + ws + extra));
    st = quantize_store(w, &out->store, stream);
  }
  share_slices(&out->store, w);
  return weight_done(st, capturing);
}
