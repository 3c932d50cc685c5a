/* wcache.c — the engine's device memory per CUDA context (see wcache.h). */
#include "shim/wcache.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/driver.h"
#include "kernels/wcheck.h"
#include "base/log.h"
#include "base/param.h"

#define MAX_CONTEXTS 16  /* GPUs (primary contexts) one process drives */
#define MAX_STREAMS 64   /* streams with scratch, per context */
#define MAX_ENTRIES 8192 /* frozen weights, per context */
#define ALIGN 256        /* what mt_qweight_bind and the workspace want */

typedef struct {
  CUstream stream;
  CUdeviceptr mem;
  size_t bytes;
} scratch;

typedef struct {
  mt_weight_ref ref;
  CUdeviceptr mem; /* quantized weight, then the refresh state */
  mt_qweight q;
} entry;

/* A grouped weight's store under weight_cache = frozen: a few per layer, searched in order. */
#define MAX_GROUPED 1024
typedef struct {
  mt_wgroup_ref ref;
  CUdeviceptr mem; /* the store, then the refresh state */
  mt_wstore store;
} gentry;

typedef struct {
  CUcontext ctx;
  scratch scratch[MAX_STREAMS];
  int nscratch;
  entry *entries; /* open addressing over MAX_ENTRIES slots, allocated with the context */
  int nentries;
  gentry *gentries; /* MAX_GROUPED, allocated at the first grouped call */
  int ngentries;
} context;

static context contexts[MAX_CONTEXTS];
static int ncontexts;
static int frozen;          /* weight_cache frozen or frozen-sampled: weights kept and checked */
static unsigned check_step; /* the check's sample: 1 (every byte) or MT_SAMPLE_STEP */
static size_t cache_limit, held, cached; /* limit and bytes of frozen entries; held: all bytes */
static unsigned long long cache_full;
static double store_bytes,
    store_elems; /* frozen grouped weights: their stores' bytes and elements */

int mt_wcache_init(const mt_spec *s) {
  static const char *const modes[] = {"requantize", "frozen", "frozen-sampled", NULL};
  int errors = 0;
  int mode = mt_param_choice("MINITE_WEIGHT_CACHE", modes, (int)s->weight_cache, &errors);
  frozen = mode != MT_WCACHE_REQUANTIZE;
  check_step = mode == MT_WCACHE_FROZEN_SAMPLED ? MT_SAMPLE_STEP : 1;
  cache_limit = (size_t)mt_param_count("MINITE_CACHE_MB", 8192, 0, 1ull << 30, "MiB", &errors)
                << 20;
  return errors;
}

const char *mt_wcache_mode(void) {
  return !frozen ? "requantize" : check_step > 1 ? "frozen-sampled" : "frozen";
}

void mt_wcache_summary(void (*emit)(void *ctx, const char *text), void *ctx) {
  int n = 0;
  for (int i = 0; i < ncontexts; i++)
    n += contexts[i].nentries + contexts[i].ngentries;
  char b[320];
  snprintf(b, sizeof b,
           ", \"engine\": {\"weight_cache\": \"%s\", \"device_bytes\": %zu, "
           "\"frozen_weights\": %d, \"cache_full\": %llu, \"store_bytes_per_element\": %.4f}",
           mt_wcache_mode(), held, n, cache_full,
           store_elems > 0 ? store_bytes / store_elems : 0.0);
  emit(ctx, b);
}

static size_t round_up(size_t v) { return (v + ALIGN - 1) / ALIGN * ALIGN; }

static context *context_current(const mt_driver *d) {
  CUcontext ctx = NULL;
  if (d->ctx_get_current(&ctx) != CUDA_SUCCESS || !ctx)
    return NULL;
  for (int i = 0; i < ncontexts; i++)
    if (contexts[i].ctx == ctx)
      return &contexts[i];
  if (ncontexts == MAX_CONTEXTS)
    return NULL;
  context *c = &contexts[ncontexts];
  c->entries = calloc(MAX_ENTRIES, sizeof *c->entries);
  if (!c->entries)
    return NULL;
  c->ctx = ctx;
  ncontexts++;
  return c;
}

static enum mt_reason device_alloc(const mt_driver *d, size_t bytes, CUdeviceptr *out) {
  if (d->mem_alloc(out, bytes) != CUDA_SUCCESS) {
    MT_WARN_ONCE("could not allocate %zu bytes of device memory for the engine: routed GEMMs that "
                 "need more fall back to cuBLAS (reason \"out of memory\")",
                 bytes);
    return MT_R_NOMEM;
  }
  held += bytes;
  return MT_R_ROUTED;
}

/* This stream's scratch, at least `bytes` long. Growing waits for the stream, so that the old
 * buffer is no longer read when it is freed; it is the one synchronisation in the shim, rare
 * (the largest call so far grows it) and never while capturing. */
static enum mt_reason scratch_get(const mt_driver *d, context *c, CUstream stream, size_t bytes,
                                  int capturing, CUdeviceptr *out) {
  scratch *s = NULL;
  for (int i = 0; i < c->nscratch && !s; i++)
    if (c->scratch[i].stream == stream)
      s = &c->scratch[i];
  if (!s) {
    if (c->nscratch == MAX_STREAMS)
      return MT_R_NOMEM;
    s = &c->scratch[c->nscratch++];
    s->stream = stream;
  }
  if (s->bytes < bytes) {
    if (capturing)
      return MT_R_CAPTURE;
    size_t want = bytes + bytes / 4; /* room for the next, slightly larger call */
    if (s->mem) {
      if (d->stream_synchronize(stream) != CUDA_SUCCESS) {
        MT_WARN_ONCE("could not wait for a stream to grow the engine's scratch: routed GEMMs that "
                     "need more fall back to cuBLAS (reason \"engine error\")");
        return MT_R_ENGINE;
      }
      d->mem_free(s->mem);
      held -= s->bytes;
      s->mem = 0;
      s->bytes = 0;
    }
    enum mt_reason r = device_alloc(d, want, &s->mem);
    if (r != MT_R_ROUTED)
      return r;
    s->bytes = want;
  }
  *out = s->mem;
  return MT_R_ROUTED;
}

static int same_ref(const mt_weight_ref *a, const mt_weight_ref *b) {
  return a->w == b->w && a->n == b->n && a->k == b->k && a->ldw == b->ldw && a->type == b->type &&
         a->num.act_scale == b->num.act_scale && a->num.weight_scale == b->num.weight_scale &&
         a->num.weight_block == b->num.weight_block;
}

static size_t slot_of(const mt_weight_ref *w) {
  uint64_t h =
      (uint64_t)(uintptr_t)w->w * 0x9E3779B97F4A7C15ull ^ (uint64_t)w->n << 32 ^ (uint64_t)w->k;
  return (size_t)(h >> 40) % MAX_ENTRIES;
}

/* A frozen entry's memory: `data` bytes, then its refresh state, zeroed on the stream (a zeroed
 * state has no hash yet: the first refresh quantizes); counted against the cache. */
static enum mt_reason entry_alloc(const mt_driver *d, size_t data, mt_stream stream,
                                  CUdeviceptr *mem) {
  size_t bytes = data + MT_REFRESH_STATE_BYTES;
  enum mt_reason why = device_alloc(d, bytes, mem);
  if (why != MT_R_ROUTED)
    return why;
  if (d->memset_d8_async(*mem + data, 0, MT_REFRESH_STATE_BYTES, stream) != CUDA_SUCCESS) {
    MT_WARN_ONCE("could not clear a frozen weight's state: such calls fall back to cuBLAS");
    d->mem_free(*mem);
    held -= bytes;
    return MT_R_ENGINE;
  }
  cached += bytes;
  return MT_R_ROUTED;
}

/* The frozen entry of w: found, or made (NULL when none can be made: full, capturing, no memory). */
static entry *entry_get(const mt_driver *d, context *c, const mt_weight_ref *w, int capturing,
                        mt_stream stream, enum mt_reason *why) {
  size_t i = slot_of(w);
  for (int probes = 0; probes < MAX_ENTRIES; probes++, i = (i + 1) % MAX_ENTRIES) {
    if (!c->entries[i].mem)
      break;
    if (same_ref(&c->entries[i].ref, w))
      return &c->entries[i];
  }
  size_t qbytes = round_up(mt_qweight_bytes(w->n, w->k, &w->num));
  size_t bytes = qbytes + MT_REFRESH_STATE_BYTES;
  *why = MT_R_ROUTED;
  if (c->nentries >= MAX_ENTRIES / 2 || cached + bytes > cache_limit) {
    cache_full++;
    return NULL; /* requantized in scratch instead: slower, never wrong */
  }
  if (capturing) {
    *why = MT_R_CAPTURE;
    return NULL;
  }
  CUdeviceptr mem;
  if ((*why = entry_alloc(d, qbytes, stream, &mem)) != MT_R_ROUTED)
    return NULL;
  entry *e = &c->entries[i];
  e->ref = *w;
  e->mem = mem;
  mt_qweight_bind(&e->q, w->n, w->k, &w->num, (void *)mem);
  c->nentries++;
  return e;
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

enum mt_reason mt_wcache_prepare(const mt_weight_ref *w, int m, mt_stream stream, int capturing,
                                 mt_engine_mem *out) {
  const mt_driver *d = mt_driver_get();
  if (!d)
    return MT_R_NO_ENGINE;
  context *c = context_current(d);
  if (!c) {
    MT_WARN_ONCE("no current CUDA context for a routed GEMM (or more than %d): it runs in cuBLAS "
                 "(reason \"no engine\")",
                 MAX_CONTEXTS);
    return MT_R_NO_ENGINE;
  }
  size_t ws = round_up(mt_gemm_workspace_bytes(m, w->k, &w->num));
  size_t qbytes = round_up(mt_qweight_bytes(w->n, w->k, &w->num));
  if (!ws || !qbytes)
    return MT_R_ENGINE;
  entry *e = NULL;
  enum mt_reason why = MT_R_ROUTED;
  if (frozen && !(e = entry_get(d, c, w, capturing, stream, &why)) && why != MT_R_ROUTED)
    return why;
  CUdeviceptr mem;
  enum mt_reason r = scratch_get(d, c, (CUstream)stream, ws + (e ? 0 : qbytes), capturing, &mem);
  if (r != MT_R_ROUTED)
    return r;
  out->workspace = (void *)mem;
  out->workspace_bytes = ws;
  out->wsum = NULL;
  if (e) {
    out->q = &e->q;
    out->wsum = &((const mt_wcheck_state *)(uintptr_t)(e->mem + qbytes))->hash;
    return weight_status(mt_refresh_weight(w->w, w->type, w->ldw, &e->q, (void *)(e->mem + qbytes),
                                           check_step, stream));
  }
  static mt_qweight q; /* under the exec lock, used until the call's launches are enqueued */
  mt_qweight_bind(&q, w->n, w->k, &w->num, (void *)(mem + ws));
  out->q = &q;
  return weight_status(mt_quantize_weight(w->w, w->type, w->ldw, &q, stream));
}

static int same_gref(const mt_wgroup_ref *a, const mt_wgroup_ref *b) {
  return a->w == b->w && a->w_stride == b->w_stride && a->groups == b->groups && a->n == b->n &&
         a->k == b->k && a->ldw == b->ldw && a->type == b->type &&
         a->num.act_scale == b->num.act_scale && a->num.weight_scale == b->num.weight_scale &&
         a->num.weight_block == b->num.weight_block;
}

/* The frozen store of w: found, or made (NULL when none can be made: the slices not back to back,
 * full, capturing, no memory; *why says which of the last two). */
static gentry *gentry_get(const mt_driver *d, context *c, const mt_wgroup_ref *w, size_t sbytes,
                          int capturing, mt_stream stream, enum mt_reason *why) {
  *why = MT_R_ROUTED;
  for (int i = 0; i < c->ngentries; i++)
    if (same_gref(&c->gentries[i].ref, w))
      return &c->gentries[i];
  if (w->w_stride && w->w_stride != (int64_t)w->n * (int64_t)w->ldw)
    return NULL; /* gaps: the hash reads rows */
  size_t bytes = sbytes + MT_REFRESH_STATE_BYTES;
  if (!c->gentries && !(c->gentries = calloc(MAX_GROUPED, sizeof *c->gentries)))
    return NULL;
  if (c->ngentries == MAX_GROUPED || cached + bytes > cache_limit) {
    cache_full++;
    return NULL;
  }
  if (capturing) {
    *why = MT_R_CAPTURE;
    return NULL;
  }
  CUdeviceptr mem;
  if ((*why = entry_alloc(d, sbytes, stream, &mem)) != MT_R_ROUTED)
    return NULL;
  store_bytes += (double)sbytes;
  store_elems += (double)(w->w_stride ? w->groups : 1) * w->n * w->k;
  gentry *e = &c->gentries[c->ngentries++];
  e->ref = *w;
  e->mem = mem;
  mt_wstore_bind(&e->store, w->w_stride ? w->groups : 1, w->n, w->k, &w->num, (void *)mem);
  return e;
}

/* One slice serves every group: the kernel steps by slice_bytes, 0 here. */
static void share_slices(mt_wstore *s, const mt_wgroup_ref *w) {
  if (w->w_stride)
    return;
  s->count = w->groups;
  s->slice_bytes = 0;
}

enum mt_reason mt_wcache_prepare_grouped(const mt_wgroup_ref *w, int rows, mt_stream stream,
                                         int capturing, mt_grouped_mem *out) {
  const mt_driver *d = mt_driver_get();
  if (!d)
    return MT_R_NO_ENGINE;
  context *c = context_current(d);
  if (!c)
    return MT_R_NO_ENGINE;
  const int slices = w->w_stride ? w->groups : 1;
  size_t ws = round_up(mt_grouped_workspace_bytes(rows, w->k, &w->num));
  size_t sbytes = round_up(mt_wstore_bytes(slices, w->n, w->k, &w->num));
  if (!ws || !sbytes)
    return MT_R_ENGINE;
  gentry *e = NULL;
  enum mt_reason why = MT_R_ROUTED;
  if (frozen && !(e = gentry_get(d, c, w, sbytes, capturing, stream, &why)) && why != MT_R_ROUTED)
    return why;
  CUdeviceptr mem;
  enum mt_reason r = scratch_get(d, c, (CUstream)stream, ws + (e ? 0 : sbytes), capturing, &mem);
  if (r != MT_R_ROUTED)
    return r;
  out->workspace = (void *)mem;
  out->workspace_bytes = ws;
  if (e) {
    out->store = e->store;
    int st = mt_wstore_refresh(w->w, w->type, w->ldw, &out->store, (void *)(e->mem + sbytes),
                               check_step, stream);
    share_slices(&out->store, w);
    return weight_status(st);
  }
  mt_wstore_bind(&out->store, slices, w->n, w->k, &w->num, (void *)(mem + ws));
  int st =
      mt_wstore_quantize(w->w, w->type, w->ldw, (size_t)w->w_stride, &out->store, NULL, stream);
  share_slices(&out->store, w);
  return weight_status(st);
}
