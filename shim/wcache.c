/* wcache.c — the weights kept across calls per CUDA context (see wcache.h).
 *
 * Locks: a context's tables of kept weights are under its lock (shim/devmem.c), and one lock per
 * context is held by the calls on its kept weights (taken with the weight's lookup, held until the
 * call's release, so that one call's wait, launches and event on a weight are never interleaved
 * with another thread's). The order is context, kept, lease: a call takes the kept-weight lock
 * under the context's, then its lease (shim/devmem.c); tables_of waits for the kept-weight lock
 * under the context's lock when it drops a destroyed context's weights.
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

#define MAX_ENTRIES 8192 /* frozen weights, per context */
#define ALIGN 256        /* what mt_qweight_bind and the workspace want */

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

/* A context's kept weights, under its lock (shim/devmem.h). */
typedef struct {
  pthread_mutex_t kept;  /* held by a call on a kept weight from its lookup to its release */
  unsigned long long id; /* the context (kernels/driver.h) these weights belong to; 0: none yet */
  mt_devctx *mem;        /* that context's device memory (set with the lock held: tables_of) */
  entry *entries;        /* open addressing over MAX_ENTRIES slots, allocated with the context */
  int nentries;
  gentry *gentries; /* MAX_GROUPED, allocated at the first grouped call */
  int ngentries;
  size_t cached; /* the bytes of its frozen entries */
} tables;

static tables slots[MT_MAX_CONTEXTS];
static pthread_once_t locks_once = PTHREAD_ONCE_INIT;
static enum mt_wcache mode; /* MINITE_WEIGHT_CACHE */
static int frozen;          /* frozen or frozen-sampled: weights kept and checked */
static unsigned check_step; /* the check's sample: 1 (every byte) or MT_SAMPLE_STEP */
static size_t cache_limit;
static atomic_int kept_count; /* frozen entries and stores, in every context */
static atomic_ullong cache_full, captured_calls;
static atomic_ullong pointer_array_calls; /* grouped calls with weights behind pointer arrays */
static atomic_ullong store_bytes, store_elems; /* the kept weights' bytes and elements */

static void init_locks(void) {
  for (int i = 0; i < MT_MAX_CONTEXTS; i++)
    pthread_mutex_init(&slots[i].kept, NULL);
}

void mt_wcache_init(const mt_params *p) {
  mode = p->weight_cache;
  frozen = mode != MT_WCACHE_REQUANTIZE;
  check_step = mode == MT_WCACHE_FROZEN_SAMPLED ? MT_SAMPLE_STEP : 1;
  cache_limit = (size_t)p->cache_mb << 20;
  pthread_once(&locks_once, init_locks);
}

const char *mt_wcache_mode(void) { return mt_wcache_names[mode]; }

void mt_wcache_summary(void (*emit)(void *ctx, const char *text), void *ctx) {
  int n = atomic_load(&kept_count);
  unsigned long long elems = atomic_load(&store_elems);
  char b[384];
  snprintf(b, sizeof b,
           ", \"engine\": {\"weight_cache\": \"%s\", \"device_bytes\": %zu, "
           "\"frozen_weights\": %d, \"cache_full\": %llu, \"captured_calls\": %llu, "
           "\"pointer_array_calls\": %llu, \"store_bytes_per_element\": %.4f",
           mt_wcache_mode(), mt_devmem_bytes(), n, (unsigned long long)atomic_load(&cache_full),
           (unsigned long long)atomic_load(&captured_calls),
           (unsigned long long)atomic_load(&pointer_array_calls),
           elems ? (double)atomic_load(&store_bytes) / (double)elems : 0.0);
  emit(ctx, b);
  mt_devmem_summary(emit, ctx);
  emit(ctx, "}");
}

static size_t round_up(size_t v) { return (v + ALIGN - 1) / ALIGN * ALIGN; }

/* --- a context's tables -------------------------------------------------------------------- */

/* The kept weights of the current context, whose lock is held: forgotten when the context is a
 * new one in its slot (a destroyed context's memory went with it, so nothing is freed). NULL, the
 * context's lock released, when there is no memory for its table. */
static tables *tables_of(mt_devctx *c, const mt_ctx *x) {
  tables *t = &slots[x->index];
  if (t->id != x->id) {
    pthread_mutex_lock(&t->kept); /* a call on one of its kept weights ends first */
    pthread_mutex_unlock(&t->kept);
    if (t->entries)
      memset(t->entries, 0, MAX_ENTRIES * sizeof *t->entries);
    atomic_fetch_sub(&kept_count, t->nentries + t->ngentries);
    t->nentries = 0;
    t->ngentries = 0;
    t->cached = 0;
    t->id = x->id;
  }
  t->mem = c;
  if (!t->entries && frozen && !(t->entries = calloc(MAX_ENTRIES, sizeof *t->entries))) {
    mt_devmem_unlock(c);
    MT_WARN_ONCE("no host memory for the table of kept weights: routed GEMMs run in cuBLAS (reason "
                 "\"no engine\")");
    return NULL;
  }
  return t;
}

/* --- frozen entries ------------------------------------------------------------------------- */

/* The numerics an entry was quantized under: another spec is another entry. */
static int same_num(const mt_numerics *a, const mt_numerics *b) {
  return a->act_scale == b->act_scale && a->weight_scale == b->weight_scale &&
         a->weight_block == b->weight_block;
}

static int same_ref(const mt_weight_ref *a, const mt_weight_ref *b) {
  return a->w == b->w && a->n == b->n && a->k == b->k && a->in_out == b->in_out &&
         a->ldw == b->ldw && a->type == b->type && same_num(&a->num, &b->num);
}

static size_t slot_of(const mt_weight_ref *w) {
  uint64_t h =
      (uint64_t)(uintptr_t)w->w * 0x9E3779B97F4A7C15ull ^ (uint64_t)w->n << 32 ^ (uint64_t)w->k;
  return (size_t)(h >> 40) % MAX_ENTRIES;
}

/* A weight that finds the cache full is requantized at every call: same bits, several times the
 * call's time (a whole weight read and written), which a user must hear of once, with the fix. */
static void count_full(unsigned long long n, const char *what) {
  atomic_fetch_add(&cache_full, 1);
  MT_WARN_ONCE("the weight cache is full (%llu %s): frozen weights past it are quantized again "
               "at every call (same bits, slower; the summary counts cache_full)",
               n, what);
}

/* Whether `bytes` more fit in the context's MINITE_CACHE_MB: the bound is per context, as each
 * GPU has its own memory (a process driving several GPUs may keep that much on each). Under the
 * context's lock, as are its entries. */
static int cache_fits(const tables *c, size_t bytes) { return c->cached + bytes <= cache_limit; }

/* A frozen entry's memory: `data` bytes, then the refresh state of its `slices`, zeroed on the
 * stream (a zeroed state has no hash yet: the first refresh quantizes); counted against the
 * context's MINITE_CACHE_MB. *why says whether the call can still go on, requantizing in its own
 * memory (cache full). */
static int entry_alloc(const mt_driver *d, tables *c, size_t data, int slices, mt_stream stream,
                       CUdeviceptr *mem, enum mt_reason *why) {
  const size_t state = mt_refresh_state_bytes(slices), bytes = data + state;
  *why = MT_R_ROUTED;
  if (!cache_fits(c, bytes)) {
    count_full((unsigned long long)(cache_limit >> 20),
               "MiB of MINITE_CACHE_MB on this GPU: raise it");
    return 0; /* requantized in scratch instead: slower, never wrong */
  }
  if ((*why = mt_devmem_alloc(d, bytes, mem)) != MT_R_ROUTED)
    return 0;
  if (d->memset_d8_async(*mem + data, 0, state, stream) != CUDA_SUCCESS) {
    MT_WARN_ONCE("could not clear a frozen weight's state: such calls fall back to cuBLAS");
    mt_devmem_free(d, *mem);
    *why = MT_R_ENGINE;
    return 0;
  }
  mt_devmem_count(c->mem, (long long)bytes);
  c->cached += bytes;
  return 1;
}

/* The frozen entry of w, its kept form kbytes long (then its refresh state): found, or made (NULL
 * when none can be made: full, capturing, no memory; *why says whether the call can still go on,
 * requantizing in its own memory). Under the context's lock. */
static entry *entry_get(const mt_driver *d, tables *c, const mt_weight_ref *w, size_t kbytes,
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
    count_full(MAX_ENTRIES / 2, "single weights on this GPU, its most");
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
  e->q.in_out = w->in_out;
  c->nentries++;
  atomic_fetch_add(&kept_count, 1);
  return e;
}

/* --- the order of a kept weight's calls ---------------------------------------------------- */

/* A call on kept weight `o` outside a capture holds the context's kept-weight lock from here
 * (under the context's lock) to mt_wcache_release. */
static void order_take(tables *c, order *o, mt_wcache_hold *hold) {
  pthread_mutex_lock(&c->kept);
  hold->kept = &c->kept;
  hold->order = o;
}

/* The call's stream waits for the weight's last call where that ran on another stream. */
static enum mt_reason order_wait(const mt_driver *d, mt_wcache_hold *hold) {
  order *o = hold->order;
  CUstream s = (CUstream)hold->mem.stream;
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
  CUstream s = (CUstream)hold->mem.stream;
  o->last = mt_stream_key(s);
  o->pending = mt_devmem_record_end(d, &o->done, s);
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

/* A weight's quantization (or refresh) as a reason; a failure other than capture warned once. */
static enum mt_reason weight_status(int st) {
  if (st != MT_OK && st != MT_ERR_CAPTURE)
    MT_WARN_ONCE("the NVFP4 engine could not quantize a routed weight: %s; such calls fall back to "
                 "cuBLAS",
                 mt_status_name((enum mt_status)st));
  return mt_engine_reason(st);
}

/* The call's memory after its weight's entry was looked up (`why`: the lookup's verdict; `kept`:
 * the entry's order, NULL without one): the workspace, and room for the weight unless an entry
 * keeps it; outside a capture, the call put in the kept weight's order. Releases the context's
 * lock. */
static enum mt_reason take_memory(const mt_driver *d, tables *c, const mt_ctx *x, mt_stream stream,
                                  size_t ws, size_t wbytes, order *kept, enum mt_reason why,
                                  int capturing, mt_wcache_hold *hold, CUdeviceptr *mem) {
  if (kept && !capturing)
    order_take(c, kept, hold);
  if (!ws || !wbytes || why != MT_R_ROUTED) {
    mt_devmem_unlock(c->mem);
    if (ws && wbytes)
      return why;
    MT_WARN_ONCE("the NVFP4 engine has no layout for a routed weight's shape under the spec's "
                 "numerics: such calls fall back to cuBLAS (reason \"engine error\")");
    return MT_R_ENGINE;
  }
  enum mt_reason r =
      mt_devmem_take(d, c->mem, x, stream, ws + (kept ? 0 : wbytes), capturing, &hold->mem, mem);
  return r == MT_R_ROUTED && hold->order ? order_wait(d, hold) : r;
}

/* The weight's quantization or refresh status as the call's reason, captured calls counted. */
static enum mt_reason weight_done(int st, int capturing) {
  enum mt_reason r = weight_status(st);
  if (capturing && r == MT_R_ROUTED)
    atomic_fetch_add(&captured_calls, 1);
  return r;
}

/* The current context's kept weights, its lock held; NULL (said once) when there are none to be
 * had. */
static tables *current(const mt_driver *d, mt_ctx *x) {
  pthread_once(&locks_once, init_locks);
  mt_devctx *c = mt_devmem_current(d, x);
  return c ? tables_of(c, x) : NULL;
}

enum mt_reason mt_wcache_prepare(const mt_weight_ref *w, int m, mt_stream stream, int capturing,
                                 mt_engine_mem *out) {
  memset(out, 0, sizeof *out);
  out->hold.mem.stream = stream;
  const mt_driver *d = mt_driver_get();
  mt_ctx x;
  tables *c = current(d, &x);
  if (!c)
    return MT_R_NO_ENGINE;
  out->hold.mem.state = c->mem;
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
    /* frozen-sampled's hash covers the digests' sample of the lines: it is their weight sum
     * (kernels/instr.h); frozen's covers every line, which no digest key uses */
    if (check_step == MT_SAMPLE_STEP && !w->in_out) /* [in][out]: the hash of stored lines */
      out->wsum = &mt_wcheck_slices((void *)(uintptr_t)(e->mem + kbytes))->hash;
    return weight_done(mt_refresh_weight(w->w, w->type, w->ldw, &e->q, (void *)(e->mem + kbytes),
                                         check_step, stream),
                       capturing);
  }
  mt_qweight_bind(&out->own, w->n, w->k, &w->num, (void *)(mem + ws));
  out->own.in_out = w->in_out;
  out->q = &out->own;
  return weight_done(mt_quantize_weight(w->w, w->type, w->ldw, &out->own, stream), capturing);
}

void mt_wcache_release(mt_wcache_hold *hold) {
  if (hold->ordered)
    order_done(mt_driver_get(), hold);
  mt_devmem_release(&hold->mem);
  if (hold->kept)
    pthread_mutex_unlock(hold->kept);
  hold->kept = NULL;
  hold->order = NULL;
  hold->ordered = 0;
}

/* --- grouped calls ------------------------------------------------------------------------- */

static int same_gref(const mt_wgroup_ref *a, const mt_wgroup_ref *b) {
  return a->w == b->w && a->w_stride == b->w_stride && a->groups == b->groups && a->n == b->n &&
         a->k == b->k && a->in_out == b->in_out && a->ldw == b->ldw && a->type == b->type &&
         same_num(&a->num, &b->num);
}

/* The frozen store of w: found, or made (NULL when none can be made: the slices not back to back,
 * full, capturing, no memory; *why says whether the call can still go on). Under the context's
 * lock. */
static gentry *gentry_get(const mt_driver *d, tables *c, const mt_wgroup_ref *w, size_t sbytes,
                          int capturing, mt_stream stream, enum mt_reason *why) {
  *why = MT_R_ROUTED;
  for (int i = 0; i < c->ngentries; i++)
    if (same_gref(&c->gentries[i].ref, w))
      return &c->gentries[i];
  if (w->w_stride && w->w_stride != (int64_t)(w->in_out ? w->k : w->n) * (int64_t)w->ldw)
    return NULL; /* gaps between the slices: the check reads slice e at e * n * ldw (k * ldw) */
  if (capturing)
    return NULL; /* no allocation in a capture: requantized in the graph's memory */
  if (!c->gentries && !(c->gentries = calloc(MAX_GROUPED, sizeof *c->gentries)))
    return NULL;
  if (c->ngentries == MAX_GROUPED) {
    count_full(MAX_GROUPED, "grouped weights on this GPU, its most");
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
  e->store.in_out = w->in_out;
  atomic_fetch_add(&kept_count, 1);
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
  out->hold.mem.stream = stream;
  const mt_driver *d = mt_driver_get();
  mt_ctx x;
  tables *c = current(d, &x);
  if (!c)
    return MT_R_NO_ENGINE;
  out->hold.mem.state = c->mem;
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
    out->store.in_out = w->in_out;
    st = quantize_store(w, &out->store, stream);
  }
  share_slices(&out->store, w);
  return weight_done(st, capturing);
}
