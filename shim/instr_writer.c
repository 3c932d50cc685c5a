/* instr_writer.c — the instruments' slot pools, writer thread, records and summary (see
 * instr_writer.h).
 *
 * Contexts are kept per slot of the driver's registry (kernels/driver.h): a destroyed context's
 * slots in flight are counted lost and its host memory, which is the library's own (registered,
 * not allocated, with the driver), is never freed while the writer may read it.
 */
#include "shim/instr_writer.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "base/log.h"
#include "shim/stats.h"

#define DRAIN_SECONDS 2.0        /* at exit: how long completed work is waited for */
#define POLL_NS 200000           /* the writer's sleep between scans while work is in flight */
#define CAPTURED_POLL_NS 1000000 /* ... while only captured calls' replays may publish */

static const char *const skip_names[MT_IW_SKIP_COUNT] = {
    "capture", "no slot", "beta", "entry", "scratch size", "busy", "error", "exit"};

typedef struct {
  atomic_ullong calls, passed, skipped[MT_IW_SKIP_COUNT];
} instrument;

typedef struct {
  unsigned long long shadow_calls, shadow_nonfinite, probe_calls, probe_rows, probe_differing,
      digest_calls, digest_rows, digest_dropped;
  double rel_l2_sum, rel_l2_max, shadow_max_abs, probe_max_abs;
} route_stats;

static mt_iw_config cfg;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* everything below */
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static mt_iw_context contexts[MT_MAX_CONTEXTS];
static route_stats routes[MT_SPEC_MAX_ROUTES];
static instrument shadow, probe, digest;
static unsigned long long digest_written, digest_dropped;
static atomic_ullong dropped_slots;
static size_t device_bytes, host_bytes;
static int in_flight, writer_started, stopping, stopped;
/* captured calls' slots held; replays read; replays overwritten by the next before they were
 * read */
static int captured_slots;
static unsigned long long replays_read, replays_missed;
static pthread_t writer;

void mt_iw_configure(const mt_iw_config *c) { cfg = *c; }

void mt_iw_lock(void) { pthread_mutex_lock(&lock); }
void mt_iw_unlock(void) { pthread_mutex_unlock(&lock); }

void mt_iw_before_fork(void) { pthread_mutex_lock(&lock); }
void mt_iw_after_fork_parent(void) { pthread_mutex_unlock(&lock); }
void mt_iw_after_fork_child(void) {
  writer_started = 0;
  pthread_mutex_unlock(&lock);
}

int mt_iw_stopped(void) { return stopped; }

size_t mt_iw_round256(size_t v) { return (v + 255) / 256 * 256; }

/* --- counters --------------------------------------------------------------------------------- */

/* The instruments of `kinds`, into `in`; returns how many. */
static int instruments_of(int kinds, instrument *in[3]) {
  int n = 0;
  if (kinds & MT_IW_SHADOW)
    in[n++] = &shadow;
  if (kinds & MT_IW_PROBE)
    in[n++] = &probe;
  if (kinds & MT_IW_DIGEST)
    in[n++] = &digest;
  return n;
}

void mt_iw_count_calls(int kinds) {
  instrument *in[3];
  for (int i = 0, n = instruments_of(kinds, in); i < n; i++)
    in[i]->calls++;
}

void mt_iw_count_passed(int kinds) {
  instrument *in[3];
  for (int i = 0, n = instruments_of(kinds, in); i < n; i++)
    in[i]->passed++;
}

void mt_iw_count_skips(int kinds, enum mt_iw_skip why) {
  instrument *in[3];
  for (int i = 0, n = instruments_of(kinds, in); i < n; i++)
    in[i]->skipped[why]++;
}

void mt_iw_count_dropped_call(void) { dropped_slots++; }

/* --- contexts and slots (under lock) ----------------------------------------------------- */

/* The slots a destroyed context left in flight never complete: counted lost. Under lock. */
static void context_forget(mt_iw_context *c) {
  for (int i = 0; c->slots && i < cfg.nslots; i++) {
    mt_iw_slot *s = &c->slots[i];
    int st = atomic_load(&s->state);
    if (st == MT_IW_FLIGHT)
      mt_iw_count_skips(s->kinds, MT_IW_EXIT), in_flight--;
    captured_slots -= st == MT_IW_CAPTURED; /* its graphs went with the context */
    atomic_store(&s->state, st == MT_IW_FREE ? MT_IW_FREE : MT_IW_LOST);
  }
  if (c->host && c->mem)
    device_bytes -= mt_iw_round256((size_t)cfg.nslots * MT_IW_SLOT_BYTES) + c->scratch_bytes;
  c->mem = 0;
  c->scratch_used = 0;
}

/* Host memory for the blocks and flags, allocated once and registered (mapped) with each context
 * that uses it: the library owns it, so no context's destruction frees it under the writer. Pages
 * of its own, never part of the malloc heap: should the driver keep registered pages out of a
 * forked child, no chunk of the heap goes with them. */
static int host_memory(const mt_driver *d, const mt_instr_driver *e, mt_iw_context *c) {
  if (!d->mem_host_register)
    return 0;
  if (!c->host) {
    c->host_size =
        ((size_t)cfg.nslots * (MT_IW_SLOT_BYTES + sizeof(uint32_t)) + 4095) / 4096 * 4096;
    void *p = mmap(NULL, c->host_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return 0;
    c->host = p;
    host_bytes += c->host_size;
  }
  memset(c->host, 0, c->host_size);
  int relaxed = mt_capture_relax();
  int ok =
      d->mem_host_register(c->host, c->host_size, CU_MEMHOSTREGISTER_DEVICEMAP) == CUDA_SUCCESS &&
      e->mem_host_get_device_pointer(&c->host_dev, c->host, 0) == CUDA_SUCCESS;
  mt_capture_restore(relaxed);
  return ok;
}

/* Set up context c for the current CUDA context x (allocations: never while capturing, the
 * caller checked). Leaves c->mem 0 when something failed: instruments are then off there. */
static void context_setup(const mt_driver *d, const mt_instr_driver *e, mt_iw_context *c,
                          const mt_ctx *x) {
  if (c->id)
    context_forget(c);
  c->id = x->id;
  if (!c->slots) {
    pthread_mutex_init(&c->scratch_lock, NULL);
    if (!(c->slots = calloc((size_t)cfg.nslots, sizeof *c->slots)))
      return;
  }
  size_t bytes = mt_iw_round256((size_t)cfg.nslots * MT_IW_SLOT_BYTES) + cfg.scratch_bytes;
  int relaxed = mt_capture_relax();
  CUresult r = d->mem_alloc(&c->mem, bytes);
  mt_capture_restore(relaxed);
  if (r != CUDA_SUCCESS) {
    c->mem = 0;
    MT_WARN("could not allocate %zu bytes of device memory for the instruments: they are off on "
            "this GPU (lower MINITE_INSTR_MB)",
            bytes);
    return;
  }
  if (!host_memory(d, e, c)) {
    relaxed = mt_capture_relax();
    d->mem_free(c->mem);
    mt_capture_restore(relaxed);
    c->mem = 0;
    MT_WARN("could not register mapped host memory for the instruments: they are off on this GPU");
    return;
  }
  c->scratch_bytes = cfg.scratch_bytes;
  for (int i = 0; i < cfg.nslots; i++) {
    mt_iw_slot *s = &c->slots[i];
    atomic_store(&s->state, MT_IW_FREE);
    s->ctx = c;
    s->used = 0;
    s->seq = 0;
    s->captured = 0;
    s->dev = c->mem + (CUdeviceptr)(i * MT_IW_SLOT_BYTES);
    s->host = c->host + i * MT_IW_SLOT_BYTES;
    s->host_dev = c->host_dev + (CUdeviceptr)(i * MT_IW_SLOT_BYTES);
    s->flag = (uint32_t *)(c->host + (size_t)cfg.nslots * MT_IW_SLOT_BYTES) + i;
    s->flag_dev =
        c->host_dev + (CUdeviceptr)((size_t)cfg.nslots * MT_IW_SLOT_BYTES + i * sizeof(uint32_t));
  }
  device_bytes += bytes;
}

mt_iw_context *mt_iw_context_get(const mt_driver *d, const mt_instr_driver *e) {
  mt_ctx x;
  if (mt_ctx_current(&x) != MT_OK)
    return NULL;
  mt_iw_context *c = &contexts[x.index];
  if (c->id != x.id)
    context_setup(d, e, c, &x); /* a failure is not retried in this context */
  return c->mem ? c : NULL;
}

mt_iw_context *mt_iw_context_ready(void) {
  mt_ctx x;
  if (mt_ctx_current(&x) != MT_OK)
    return NULL;
  mt_iw_context *c = &contexts[x.index];
  return c->id == x.id && c->mem ? c : NULL;
}

CUdeviceptr mt_iw_scratch(const mt_iw_context *c) {
  return c->mem + (CUdeviceptr)mt_iw_round256((size_t)cfg.nslots * MT_IW_SLOT_BYTES);
}

mt_iw_slot *mt_iw_slot_take(mt_iw_context *c) {
  int from = atomic_load_explicit(&c->next, memory_order_relaxed);
  for (int i = 0; i < cfg.nslots; i++) {
    mt_iw_slot *s = &c->slots[(from + i) % cfg.nslots];
    int expected = MT_IW_FREE;
    if (atomic_compare_exchange_strong_explicit(&s->state, &expected, MT_IW_TAKEN,
                                                memory_order_acquire, memory_order_relaxed)) {
      atomic_store_explicit(&c->next, (from + i + 1) % cfg.nslots, memory_order_relaxed);
      return s;
    }
  }
  return NULL;
}

/* --- the writer thread -------------------------------------------------------------------- */

typedef struct {
  char *buf;
  size_t used, size;
} text;

__attribute__((format(printf, 2, 3))) static void put(text *t, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(t->buf + t->used, t->size - t->used, fmt, ap);
  va_end(ap);
  if (n > 0)
    t->used = (size_t)n < t->size - t->used ? t->used + (size_t)n : t->size - 1;
}

static void put_float(text *t, double v) {
  if (isfinite(v))
    put(t, "%.9g", v);
  else
    put(t, "null");
}

static float float_of_bits(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}

static void route_name(int route, char *out, size_t size) {
  snprintf(out, size, "%" PRIu32 "x%" PRIu32, cfg.spec->routes[route].out,
           cfg.spec->routes[route].in);
}

/* A grouped call's row i: its weight's content sum, held by the first row of its segment
 * (mt_instr_finish hashes each weight once). */
static uint64_t grouped_wsum(const mt_iw_slot *s, const mt_instr_row *rows, unsigned i) {
  unsigned j = 0;
  while (j < i && !s->shared_w && rows[j].seg != rows[i].seg)
    j++;
  return rows[j].wsum;
}

/* The records of one completed slot's block (its host block, or a captured replay's copy of it),
 * and its share of the aggregates. */
static void slot_records(const mt_iw_slot *s, const unsigned char *block, text *t) {
  const mt_instr_header *h = (const mt_instr_header *)block;
  const mt_instr_row *rows = (const mt_instr_row *)(block + sizeof *h);
  char route[48];
  route_name(s->route, route, sizeof route);
  route_stats *r = &routes[s->route];
  if (s->kinds & MT_IW_DIGEST) {
    unsigned kept = h->selected < MT_IW_ROWS ? h->selected : MT_IW_ROWS;
    uint64_t wid = mt_instr_weight_id(h->wsum, s->n, s->k, s->wtype);
    uint64_t bid = mt_instr_bias_id(s->has_bias, h->bsum, s->n, s->biastype);
    for (unsigned i = 0; i < kept; i++) {
      if (s->grouped)
        wid = mt_instr_weight_id(grouped_wsum(s, rows, i), s->n, s->k, s->wtype);
      uint64_t key = mt_instr_key(rows[i].row_hash, wid, s->ytype, s->alpha, bid);
      put(t,
          "{\"event\": \"digest\", \"scheme\": %d, \"route\": \"%s\", \"key\": \"%016" PRIx64
          "\", \"hash\": \"%016" PRIx64 "\", \"n\": %d, \"sketch\": [",
          MT_INSTR_SCHEME, route, key, rows[i].out_hash, s->n);
      for (int j = 0; j < MT_INSTR_SKETCH; j++) {
        put(t, j ? ", " : "");
        put_float(t, rows[i].sketch[j]);
      }
      put(t, "]}\n");
    }
    r->digest_calls++;
    r->digest_rows += kept;
    r->digest_dropped += h->selected - kept;
    digest_written += kept;
    digest_dropped += h->selected - kept;
  }
  if (s->kinds & MT_IW_SHADOW) {
    double rel = h->shadow_r2 > 0   ? sqrt(h->shadow_d2 / h->shadow_r2)
                 : h->shadow_d2 > 0 ? INFINITY
                                    : 0;
    double mx = float_of_bits(h->shadow_max_bits);
    put(t, "{\"event\": \"shadow\", \"route\": \"%s\", \"m\": %d, ", route, s->m);
    if (s->shadow_rows > 0) /* a grouped call's rows against the product formed on the device */
      put(t, "\"rows\": %d, ", s->shadow_rows);
    put(t, "\"rel_l2\": ");
    put_float(t, rel);
    put(t, ", \"max_abs\": ");
    put_float(t, mx);
    put(t, ", \"nonfinite\": %" PRIu32 "}\n", h->shadow_nonfinite);
    r->shadow_calls++;
    r->shadow_nonfinite += h->shadow_nonfinite;
    r->rel_l2_sum += rel;
    r->rel_l2_max = fmax(r->rel_l2_max, rel);
    r->shadow_max_abs = fmax(r->shadow_max_abs, mx);
  }
  if (s->kinds & MT_IW_PROBE) {
    double mx = float_of_bits(h->probe_max_bits);
    int probed = s->probe_rows - (int)h->probe_outside; /* grouped: rows in no segment */
    put(t,
        "{\"event\": \"probe\", \"route\": \"%s\", \"m\": %d, \"rows\": %d, \"differing\": %" PRIu32
        ", \"max_abs\": ",
        route, s->m, probed, h->probe_differing);
    put_float(t, mx);
    put(t, "}\n");
    r->probe_calls++;
    r->probe_rows += (unsigned)probed;
    r->probe_differing += h->probe_differing;
    r->probe_max_abs = fmax(r->probe_max_abs, mx);
  }
}

int mt_iw_published(const mt_iw_slot *s) {
  return (__atomic_load_n(s->flag, __ATOMIC_ACQUIRE) & ~MT_INSTR_EMPTY) == s->seq;
}

/* An uncaptured slot's block as published: its host block, or an empty one (the finish wrote the
 * flag alone: kernels/instr.h, MT_INSTR_EMPTY). */
static const unsigned char *published_block(const mt_iw_slot *s) {
  static const unsigned char empty[sizeof(mt_instr_header)];
  return __atomic_load_n(s->flag, __ATOMIC_ACQUIRE) & MT_INSTR_EMPTY ? empty : s->host;
}

/* A captured slot's latest replay, copied whole into `copy`: 1 when there is one not read yet
 * (the flag even, past the last one read, and unchanged across the copy; the replays it skipped
 * since the first one read are counted missed; replays that chose no row publish nothing and are
 * neither). Under lock. */
static int replay_copy(mt_iw_slot *s, unsigned char *copy) {
  const uint32_t flag = __atomic_load_n(s->flag, __ATOMIC_ACQUIRE);
  if ((flag & 1) || flag == s->seen)
    return 0;
  memcpy(copy, s->host, MT_IW_SLOT_BYTES);
  __atomic_thread_fence(__ATOMIC_ACQUIRE);
  if (__atomic_load_n(s->flag, __ATOMIC_ACQUIRE) != flag)
    return 0; /* a replay is writing it: read at a later scan */
  if (s->read_any)
    replays_missed += (uint32_t)(flag - s->seen) / 2 - 1;
  replays_read++;
  s->seen = flag;
  s->read_any = 1;
  return 1;
}

/* One scan over the slots in flight and the captured ones: published blocks become records.
 * Returns how many. Called with lock held; drops it around the write. */
static int scan(text *t) {
  static unsigned char copy[MT_IW_SLOT_BYTES];
  int done = 0;
  for (int ci = 0; ci < MT_MAX_CONTEXTS; ci++) {
    mt_iw_context *c = &contexts[ci];
    for (int i = 0; i < cfg.nslots && c->mem; i++) {
      mt_iw_slot *s = &c->slots[i];
      const int state = atomic_load_explicit(&s->state, memory_order_acquire);
      t->used = 0;
      if (state == MT_IW_CAPTURED && replay_copy(s, copy)) {
        slot_records(s, copy, t);
      } else if (state == MT_IW_FLIGHT && mt_iw_published(s)) {
        slot_records(s, published_block(s), t);
        atomic_store_explicit(&s->state, MT_IW_FREE, memory_order_release);
        in_flight--;
      } else {
        continue;
      }
      done++;
      if (t->used) {
        pthread_mutex_unlock(&lock);
        mt_stats_append(t->buf, t->used);
        pthread_mutex_lock(&lock);
      }
    }
  }
  return done;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void *writer_main(void *arg) {
  (void)arg;
  static char buf[MT_IW_ROWS * 320 + 4096];
  text t = {buf, 0, sizeof buf};
  double deadline = 0;
  pthread_mutex_lock(&lock);
  for (;;) {
    while (!in_flight && !captured_slots && !stopping)
      pthread_cond_wait(&wake, &lock);
    if (stopping && !deadline)
      deadline = now_s() + DRAIN_SECONDS;
    int found = scan(&t);
    if (stopping && (!in_flight || now_s() > deadline))
      break; /* the captured calls' replays done by now were read by this scan */
    if (!found) {
      pthread_mutex_unlock(&lock);
      nanosleep(&(struct timespec){0, in_flight ? POLL_NS : CAPTURED_POLL_NS}, NULL);
      pthread_mutex_lock(&lock);
    }
  }
  pthread_mutex_unlock(&lock);
  return NULL;
}

void mt_iw_drain(void) {
  pthread_mutex_lock(&lock);
  if (stopped || !writer_started) {
    stopped = 1;
    pthread_mutex_unlock(&lock);
    return;
  }
  stopping = 1;
  pthread_cond_broadcast(&wake);
  pthread_mutex_unlock(&lock);
  pthread_join(writer, NULL);
  pthread_mutex_lock(&lock);
  stopped = 1;
  for (int ci = 0; ci < MT_MAX_CONTEXTS; ci++)
    for (int i = 0; i < cfg.nslots && contexts[ci].mem; i++) {
      mt_iw_slot *s = &contexts[ci].slots[i];
      if (atomic_load(&s->state) == MT_IW_FLIGHT) {
        mt_iw_count_skips(s->kinds, MT_IW_EXIT);
        atomic_store(&s->state, MT_IW_LOST);
      }
    }
  in_flight = 0;
  pthread_mutex_unlock(&lock);
}

static void drain_at_exit(void) { mt_iw_drain(); }

/* Under lock. Registered at the first instrumented call, after the program has initialized CUDA:
 * atexit handlers run in reverse order, so the drain runs before the driver's own teardown. */
int mt_iw_writer_start(void) {
  if (writer_started)
    return 1;
  if (stopped)
    return 0;
  if (pthread_create(&writer, NULL, writer_main, NULL) != 0) {
    MT_WARN_ONCE("could not start the instruments' writer thread: instruments are off");
    return -1;
  }
  writer_started = 1;
  atexit(drain_at_exit);
  return 1;
}

int mt_iw_capture(mt_iw_slot *s) {
  pthread_mutex_lock(&lock);
  const int room = captured_slots < cfg.nslots / 2;
  if (room) {
    captured_slots++;
    s->captured = 1;
    s->seen = 0;
    s->read_any = 0;
    __atomic_store_n(s->flag, 0, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&lock);
  return room;
}

void mt_iw_give_back(mt_iw_slot *s, enum mt_iw_state state) {
  if (s->captured) {
    pthread_mutex_lock(&lock);
    captured_slots--;
    s->captured = 0;
    pthread_mutex_unlock(&lock);
  }
  atomic_store(&s->state, state);
}

void mt_iw_publish(mt_iw_slot *s) {
  int taken = MT_IW_TAKEN;
  pthread_mutex_lock(&lock);
  /* a slot whose context was found destroyed meanwhile is no longer this call's */
  if (atomic_compare_exchange_strong(&s->state, &taken,
                                     s->captured ? MT_IW_CAPTURED : MT_IW_FLIGHT)) {
    in_flight += !s->captured;
    pthread_cond_signal(&wake);
  }
  pthread_mutex_unlock(&lock);
}

/* --- the summary --------------------------------------------------------------------------- */

static void emit_skips(void (*emit)(void *, const char *), void *ctx, const instrument *in) {
  char b[96];
  emit(ctx, "\"skipped\": {");
  int first = 1;
  for (int i = 0; i < MT_IW_SKIP_COUNT; i++) {
    if (!in->skipped[i])
      continue;
    snprintf(b, sizeof b, "%s\"%s\": %llu", first ? "" : ", ", skip_names[i], in->skipped[i]);
    emit(ctx, b);
    first = 0;
  }
  emit(ctx, "}");
}

static void fmt_num(char *out, size_t size, double v) {
  if (isfinite(v))
    snprintf(out, size, "%.9g", v);
  else
    snprintf(out, size, "null");
}

static void emit_route(void (*emit)(void *, const char *), void *ctx, int i, int first) {
  const route_stats *r = &routes[i];
  char name[48], b[768], mean[32], rmax[32], smax[32], pmax[32];
  route_name(i, name, sizeof name);
  fmt_num(mean, sizeof mean, r->shadow_calls ? r->rel_l2_sum / r->shadow_calls : NAN);
  fmt_num(rmax, sizeof rmax, r->shadow_calls ? r->rel_l2_max : NAN);
  fmt_num(smax, sizeof smax, r->shadow_calls ? r->shadow_max_abs : NAN);
  fmt_num(pmax, sizeof pmax, r->probe_calls ? r->probe_max_abs : NAN);
  snprintf(
      b, sizeof b,
      "%s\"%s\": {\"shadow\": {\"calls\": %llu, \"rel_l2_mean\": %s, \"rel_l2_max\": %s, "
      "\"max_abs\": %s, \"nonfinite\": %llu}, \"probe\": {\"calls\": %llu, \"rows\": %llu, "
      "\"differing\": %llu, \"max_abs\": %s}, \"digest\": {\"calls\": %llu, \"written\": %llu, "
      "\"dropped\": %llu}}",
      first ? "" : ", ", name, r->shadow_calls, mean, rmax, smax, r->shadow_nonfinite,
      r->probe_calls, r->probe_rows, r->probe_differing, pmax, r->digest_calls, r->digest_rows,
      r->digest_dropped);
  emit(ctx, b);
}

void mt_iw_summary(void (*emit)(void *ctx, const char *text), void *ctx) {
  if (!cfg.spec || !(cfg.rates[0] > 0 || cfg.rates[1] > 0 || cfg.rates[2] > 0))
    return;
  pthread_mutex_lock(&lock);
  char b[512];
  const struct {
    const char *name;
    double rate;
    const instrument *in;
  } ins[3] = {{"shadow", cfg.rates[0], &shadow},
              {"probe", cfg.rates[1], &probe},
              {"digest", cfg.rates[2], &digest}};
  emit(ctx, ", \"instruments\": {");
  for (int i = 0; i < 3; i++) {
    snprintf(b, sizeof b, "\"%s\": {\"rate\": %.9g, \"calls\": %llu, \"passed\": %llu, ",
             ins[i].name, ins[i].rate, ins[i].in->calls, ins[i].in->passed);
    emit(ctx, b);
    emit_skips(emit, ctx, ins[i].in);
    emit(ctx, "}, ");
  }
  snprintf(b, sizeof b,
           "\"slots\": %d, \"dropped_calls\": %llu, \"device_bytes\": %zu, "
           "\"host_bytes\": %zu, \"captured\": {\"calls\": %d, \"replay_rate\": %.9g, "
           "\"replays\": %llu, \"missed\": %llu}, \"routes\": {",
           cfg.nslots, dropped_slots, device_bytes, host_bytes, captured_slots, cfg.replay_rate,
           replays_read, replays_missed);
  emit(ctx, b);
  int first = 1;
  for (int i = 0; i < cfg.spec->nroutes; i++) {
    const route_stats *r = &routes[i];
    if (!(r->shadow_calls || r->probe_calls || r->digest_calls))
      continue;
    emit_route(emit, ctx, i, first);
    first = 0;
  }
  unsigned long long lost = digest.skipped[MT_IW_NO_SLOT] + digest.skipped[MT_IW_EXIT];
  snprintf(b, sizeof b,
           "}}, \"digests\": {\"written\": %llu, \"dropped\": %llu, "
           "\"dropped_calls\": %llu}",
           digest_written, digest_dropped, lost);
  emit(ctx, b);
  pthread_mutex_unlock(&lock);
}
