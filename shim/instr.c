/* instr.c — the instruments of routed calls (see instr.h): sampling, the slot pool, the
 * background writer and the records.
 *
 * A slot is a result block (mt_instr_header + up to ROWS_PER_SLOT digested rows) in device
 * memory, its twin in mapped pinned host memory and a flag word there. The calling thread takes a
 * free slot and enqueues the kernels on the call's stream, last mt_instr_finish, which copies the
 * block into the host twin, zeroes it for the next use and writes the slot's sequence number into
 * its flag;
 * the slot goes to the writer thread, which polls the flags (plain memory reads: it makes no CUDA
 * call at all, so it is safe while another thread captures a graph, and at exit), turns finished
 * blocks into records and frees the slots. The calling thread never synchronizes, allocates only
 * at the first instrumented call of a context (never while capturing: instruments are skipped
 * then), and never reads device memory.
 *
 * The shadow's output and the probe's rows go to one scratch buffer per context (MINITE_INSTR_MB,
 * allocated once). A call on another stream than the buffer's last user takes it only when that
 * user's slot has been published (its flag, read from host memory); else it skips the shadow and
 * probe with the reason "busy". Same-stream reuse is ordered by the stream itself.
 *
 * Locks: `lock` guards the sampling counters, the aggregates, the contexts' creation and the
 * writer's work list, and is held for a few loads and stores only; a context's scratch_lock is
 * held while a call enqueues its probe or shadow (a second caller skips them as "busy" rather
 * than wait); slots are claimed with a compare-and-swap. Threads routing at once on different
 * streams therefore enqueue their instruments in parallel. Contexts are kept per slot of the
 * driver's registry (kernels/driver.h): a destroyed context's slots in flight are counted lost
 * and its host memory, which is the library's own (registered, not allocated, with the driver),
 * is never freed while the writer may read it.
 */
#include "shim/instr.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/driver.h"
#include "kernels/instr.h"
#include "base/log.h"
#include "base/param.h"
#include "shim/real.h"
#include "shim/stats.h"

#define ROWS_PER_SLOT 128 /* digested rows kept per call; more are counted as dropped */
#define SLOT_BYTES (sizeof(mt_instr_header) + ROWS_PER_SLOT * sizeof(mt_instr_row))
#define DRAIN_SECONDS 2.0 /* at exit: how long completed work is waited for */
#define POLL_NS 200000    /* the writer's sleep between scans while work is in flight */

enum { K_SHADOW = 1, K_PROBE = 2, K_DIGEST = 4 };
enum slot_state { S_FREE, S_TAKEN, S_FLIGHT, S_LOST };

enum skip {
  SK_CAPTURE,
  SK_NO_SLOT,
  SK_BETA,
  SK_ENTRY,
  SK_SCRATCH,
  SK_BUSY,
  SK_ERROR,
  SK_EXIT,
  SK_COUNT
};
static const char *const skip_names[SK_COUNT] = {"capture",      "no slot", "beta",  "entry",
                                                 "scratch size", "busy",    "error", "exit"};

typedef struct context context;

typedef struct {
  _Atomic int state;
  context *ctx;
  uint32_t seq;   /* what mt_instr_finish writes into the flag when this use is done */
  int used;       /* the block has been zeroed (a memset before its first use) */
  uint32_t *flag; /* host address of the flag */
  CUdeviceptr dev, host_dev, flag_dev; /* the block; the host twin and flag, as device addresses */
  unsigned char *host;
  /* what the writer needs to finish the records */
  int kinds, route, m, n, k, xtype, ytype, wtype, biastype, has_bias, probe_rows;
  float alpha;
} slot;

struct context {
  unsigned long long id; /* the CUDA context (kernels/driver.h mt_ctx); 0: never set up */
  CUdeviceptr mem;       /* nslots blocks, then the scratch; 0: off in this context */
  unsigned char *host;   /* nslots blocks, then nslots flags: registered, mapped host memory */
  CUdeviceptr host_dev;  /* ... its device address */
  size_t host_size;
  pthread_mutex_t scratch_lock; /* the five fields below, and the scratch's contents */
  size_t scratch_bytes;
  CUstream scratch_stream; /* last user of the scratch */
  slot *scratch_slot;      /* ... whose publication ends that use */
  uint32_t scratch_seq;
  int scratch_used;
  atomic_int next; /* where the search for a free slot starts */
  slot *slots;     /* nslots of them */
};

typedef struct {
  atomic_ullong calls, skipped[SK_COUNT];
} instrument;

typedef struct {
  unsigned long long shadow_calls, shadow_nonfinite, probe_calls, probe_rows, probe_differing,
      digest_calls, digest_rows, digest_dropped;
  double rel_l2_sum, rel_l2_max, shadow_max_abs, probe_max_abs;
  unsigned long long shadow_seen, probe_seen; /* the sampling counters */
} route_stats;

static double rate_shadow, rate_probe, rate_digest;
static uint64_t period_shadow, period_probe, digest_threshold;
static int digest_all, enabled;
static size_t scratch_limit;
static int nslots; /* per context: calls whose results may be in flight at once */
static const mt_spec *spec_now;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* everything below */
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static context contexts[MT_MAX_CONTEXTS];
static route_stats routes[MT_SPEC_MAX_ROUTES];
static instrument shadow, probe, digest;
static unsigned long long digest_written, digest_dropped;
static atomic_ullong dropped_slots;
static size_t device_bytes, host_bytes;
static int in_flight, writer_started, stopping, stopped;
static pthread_t writer;

static void lock_all(void) { pthread_mutex_lock(&lock); }
static void unlock_all(void) { pthread_mutex_unlock(&lock); }
/* The child of a fork has no writer thread and no usable CUDA: it instruments nothing. */
static void child_after_fork(void) {
  enabled = 0;
  writer_started = 0;
  pthread_mutex_unlock(&lock);
}

static uint64_t period_of(double rate) {
  if (rate <= 0)
    return 0;
  double p = ceil(1.0 / rate - 1e-9);
  return p < 1 ? 1 : p > 1e18 ? (uint64_t)1e18 : (uint64_t)p;
}

int mt_instr_init(const mt_spec *s, int stats_on) {
  int errors = 0;
  spec_now = s;
  rate_shadow = mt_param_rate("MINITE_SHADOW", 1.0 / 64, &errors);
  rate_probe = mt_param_rate("MINITE_PROBE", 1.0 / 64, &errors);
  rate_digest = mt_param_rate("MINITE_DIGEST", 1.0 / 64, &errors);
  nslots = (int)mt_param_count("MINITE_INSTR_SLOTS", 1024, 1, 65536, "slots", &errors);
  scratch_limit = (size_t)mt_param_count("MINITE_INSTR_MB", 64, 0, 1ull << 20, "MiB", &errors)
                  << 20;
  period_shadow = period_of(rate_shadow);
  period_probe = period_of(rate_probe);
  if (!period_shadow && !period_probe)
    scratch_limit = 0; /* only the digests: no scratch */
  digest_all = rate_digest >= 1.0;
  digest_threshold = rate_digest > 0 && !digest_all ? (uint64_t)ldexp(rate_digest, 64) : 0;
  enabled = stats_on && (period_shadow || period_probe || rate_digest > 0);
  int asked = (getenv("MINITE_SHADOW") && rate_shadow > 0) ||
              (getenv("MINITE_PROBE") && rate_probe > 0) ||
              (getenv("MINITE_DIGEST") && rate_digest > 0);
  if (!stats_on && asked)
    MT_WARN("MINITE_SHADOW, MINITE_PROBE and MINITE_DIGEST write to the statistics file: set "
            "MINITE_STATS=PATH to get them");
  if (enabled) {
    pthread_atfork(lock_all, unlock_all, child_after_fork);
    MT_INFO("instruments: shadow %g of calls, probe %g of calls with M > 1, digests %g of rows; "
            "scratch %zu MiB per GPU",
            rate_shadow, rate_probe, rate_digest, scratch_limit >> 20);
  }
  return errors;
}

int mt_instr_enabled(void) { return enabled; }

/* --- the routes ---------------------------------------------------------------------------- */

static int route_index(const mt_spec *s, int out, int in) {
  for (int i = 0; i < s->nroutes; i++)
    if ((int)s->routes[i].out == out && (int)s->routes[i].in == in)
      return i;
  return -1;
}

/* --- contexts and slots (under lock) ----------------------------------------------------- */

static size_t round256(size_t v) { return (v + 255) / 256 * 256; }

static void count_lost(const slot *s, enum skip why);

/* The slots a destroyed context left in flight never complete: counted lost. Under lock. */
static void context_forget(context *c) {
  for (int i = 0; c->slots && i < nslots; i++) {
    slot *s = &c->slots[i];
    int st = atomic_load(&s->state);
    if (st == S_FLIGHT)
      count_lost(s, SK_EXIT), in_flight--;
    atomic_store(&s->state, st == S_FREE ? S_FREE : S_LOST);
  }
  if (c->host && c->mem)
    device_bytes -= round256((size_t)nslots * SLOT_BYTES) + c->scratch_bytes;
  c->mem = 0;
  c->scratch_used = 0;
}

/* Host memory for the blocks and flags, allocated once and registered (mapped) with each context
 * that uses it: the library owns it, so no context's destruction frees it under the writer. */
static int host_memory(const mt_driver *d, const mt_instr_driver *e, context *c) {
  if (!d->mem_host_register)
    return 0;
  if (!c->host) {
    c->host_size = ((size_t)nslots * (SLOT_BYTES + sizeof(uint32_t)) + 4095) / 4096 * 4096;
    if (!(c->host = aligned_alloc(4096, c->host_size)))
      return 0;
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
static void context_setup(const mt_driver *d, const mt_instr_driver *e, context *c,
                          const mt_ctx *x) {
  if (c->id)
    context_forget(c);
  c->id = x->id;
  if (!c->slots) {
    pthread_mutex_init(&c->scratch_lock, NULL);
    if (!(c->slots = calloc((size_t)nslots, sizeof *c->slots)))
      return;
  }
  size_t bytes = round256((size_t)nslots * SLOT_BYTES) + scratch_limit;
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
  c->scratch_bytes = scratch_limit;
  for (int i = 0; i < nslots; i++) {
    slot *s = &c->slots[i];
    atomic_store(&s->state, S_FREE);
    s->ctx = c;
    s->used = 0;
    s->seq = 0;
    s->dev = c->mem + (CUdeviceptr)(i * SLOT_BYTES);
    s->host = c->host + i * SLOT_BYTES;
    s->host_dev = c->host_dev + (CUdeviceptr)(i * SLOT_BYTES);
    s->flag = (uint32_t *)(c->host + (size_t)nslots * SLOT_BYTES) + i;
    s->flag_dev = c->host_dev + (CUdeviceptr)((size_t)nslots * SLOT_BYTES + i * sizeof(uint32_t));
  }
  device_bytes += bytes;
}

/* The current context's instruments, or NULL when they are off there. Under lock. */
static context *context_get(const mt_driver *d, const mt_instr_driver *e) {
  mt_ctx x;
  if (mt_ctx_current(&x) != MT_OK)
    return NULL;
  context *c = &contexts[x.index];
  if (c->id != x.id)
    context_setup(d, e, c, &x); /* a failure is not retried in this context */
  return c->mem ? c : NULL;
}

/* A free slot, claimed for this call (any thread, no lock). */
static slot *slot_take(context *c) {
  int from = atomic_load_explicit(&c->next, memory_order_relaxed);
  for (int i = 0; i < nslots; i++) {
    slot *s = &c->slots[(from + i) % nslots];
    int expected = S_FREE;
    if (atomic_compare_exchange_strong_explicit(&s->state, &expected, S_TAKEN, memory_order_acquire,
                                                memory_order_relaxed)) {
      atomic_store_explicit(&c->next, (from + i + 1) % nslots, memory_order_relaxed);
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
  snprintf(out, size, "%" PRIu32 "x%" PRIu32, spec_now->routes[route].out,
           spec_now->routes[route].in);
}

/* The records of one completed slot (its host block), and its share of the aggregates. */
static void slot_records(const slot *s, text *t) {
  const mt_instr_header *h = (const mt_instr_header *)s->host;
  const mt_instr_row *rows = (const mt_instr_row *)(s->host + sizeof *h);
  char route[48];
  route_name(s->route, route, sizeof route);
  route_stats *r = &routes[s->route];
  if (s->kinds & K_DIGEST) {
    unsigned kept = h->selected < ROWS_PER_SLOT ? h->selected : ROWS_PER_SLOT;
    uint64_t wid = mt_instr_weight_id(h->wsum, s->n, s->k, s->wtype);
    uint64_t bid = mt_instr_bias_id(s->has_bias, h->bsum, s->n, s->biastype);
    for (unsigned i = 0; i < kept; i++) {
      uint64_t key = mt_instr_key(rows[i].row_hash, wid, s->ytype, s->alpha, bid);
      put(t,
          "{\"event\": \"digest\", \"scheme\": 1, \"route\": \"%s\", \"key\": \"%016" PRIx64
          "\", \"hash\": \"%016" PRIx64 "\", \"n\": %d, \"sketch\": [",
          route, key, rows[i].out_hash, s->n);
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
  if (s->kinds & K_SHADOW) {
    double rel = h->shadow_r2 > 0   ? sqrt(h->shadow_d2 / h->shadow_r2)
                 : h->shadow_d2 > 0 ? INFINITY
                                    : 0;
    double mx = float_of_bits(h->shadow_max_bits);
    put(t, "{\"event\": \"shadow\", \"route\": \"%s\", \"m\": %d, \"rel_l2\": ", route, s->m);
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
  if (s->kinds & K_PROBE) {
    double mx = float_of_bits(h->probe_max_bits);
    put(t,
        "{\"event\": \"probe\", \"route\": \"%s\", \"m\": %d, \"rows\": %d, \"differing\": %" PRIu32
        ", \"max_abs\": ",
        route, s->m, s->probe_rows, h->probe_differing);
    put_float(t, mx);
    put(t, "}\n");
    r->probe_calls++;
    r->probe_rows += (unsigned)s->probe_rows;
    r->probe_differing += h->probe_differing;
    r->probe_max_abs = fmax(r->probe_max_abs, mx);
  }
}

static void count_lost(const slot *s, enum skip why) {
  if (s->kinds & K_SHADOW)
    shadow.skipped[why]++;
  if (s->kinds & K_PROBE)
    probe.skipped[why]++;
  if (s->kinds & K_DIGEST)
    digest.skipped[why]++;
}

static int published(const slot *s) { return __atomic_load_n(s->flag, __ATOMIC_ACQUIRE) == s->seq; }

/* One scan over the slots in flight: published ones become records. Returns how many. Called
 * with lock held; drops it around the write. */
static int scan(text *t) {
  int done = 0;
  for (int ci = 0; ci < MT_MAX_CONTEXTS; ci++) {
    context *c = &contexts[ci];
    for (int i = 0; i < nslots && c->mem; i++) {
      slot *s = &c->slots[i];
      if (atomic_load_explicit(&s->state, memory_order_acquire) != S_FLIGHT || !published(s))
        continue;
      t->used = 0;
      slot_records(s, t);
      atomic_store_explicit(&s->state, S_FREE, memory_order_release);
      in_flight--;
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
  static char buf[ROWS_PER_SLOT * 320 + 4096];
  text t = {buf, 0, sizeof buf};
  double deadline = 0;
  pthread_mutex_lock(&lock);
  for (;;) {
    while (!in_flight && !stopping)
      pthread_cond_wait(&wake, &lock);
    if (stopping && !deadline)
      deadline = now_s() + DRAIN_SECONDS;
    if (stopping && (!in_flight || now_s() > deadline))
      break;
    if (!scan(&t)) {
      pthread_mutex_unlock(&lock);
      nanosleep(&(struct timespec){0, POLL_NS}, NULL);
      pthread_mutex_lock(&lock);
    }
  }
  pthread_mutex_unlock(&lock);
  return NULL;
}

void mt_instr_drain(void) {
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
    for (int i = 0; i < nslots && contexts[ci].mem; i++) {
      slot *s = &contexts[ci].slots[i];
      if (atomic_load(&s->state) == S_FLIGHT) {
        count_lost(s, SK_EXIT);
        atomic_store(&s->state, S_LOST);
      }
    }
  in_flight = 0;
  pthread_mutex_unlock(&lock);
}

static void drain_at_exit(void) { mt_instr_drain(); }

/* Under lock. Registered at the first instrumented call, after the program has initialized CUDA:
 * atexit handlers run in reverse order, so the drain runs before the driver's own teardown. */
static int writer_start(void) {
  if (writer_started)
    return 1;
  if (stopped)
    return 0;
  if (pthread_create(&writer, NULL, writer_main, NULL) != 0) {
    MT_WARN_ONCE("could not start the instruments' writer thread: instruments are off");
    enabled = 0;
    return 0;
  }
  writer_started = 1;
  atexit(drain_at_exit);
  return 1;
}

/* --- the calling side ---------------------------------------------------------------------- */

static int stream_capturing(const mt_driver *d, mt_stream stream) {
  CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
  if (d->stream_is_capturing((CUstream)stream, &st) != CUDA_SUCCESS)
    return 1;
  return st != CU_STREAM_CAPTURE_STATUS_NONE;
}

static int single_problem(const mt_call *c) {
  return (c->entry == MT_FN_cublasGemmEx || c->entry == MT_FN_cublasGemmEx_64 ||
          c->entry == MT_FN_cublasLtMatmul) &&
         c->batch == 1 && !c->pointer_arrays && c->group_count == 0;
}

/* The call again through the real cuBLAS, tokens [row, row + rows) of it, output into `out`
 * (row stride ldo) with beta = 0. Lt reruns only whole calls (its layouts fix the token count). */
static int rerun_cublas(const mt_call *c, int64_t row, int64_t rows, void *out, int64_t ldo) {
  static const float zero = 0.0f;
  const char *b = (const char *)c->b + 2 * row * c->ldb;
  if (c->entry == MT_FN_cublasGemmEx) {
    mt_fn_cublasGemmEx f = MT_REAL_FN(cublasGemmEx);
    return f && f(c->handle, c->transa, c->transb, (int)c->m, (int)rows, (int)c->k, c->alpha, c->a,
                  c->atype, (int)c->lda, b, c->btype, (int)c->ldb, &zero, out, c->ctype, (int)ldo,
                  c->compute, c->algo) == CUBLAS_STATUS_SUCCESS;
  }
  if (c->entry == MT_FN_cublasGemmEx_64) {
    mt_fn_cublasGemmEx_64 f = MT_REAL_FN(cublasGemmEx_64);
    return f && f(c->handle, c->transa, c->transb, c->m, rows, c->k, c->alpha, c->a, c->atype,
                  c->lda, b, c->btype, c->ldb, &zero, out, c->ctype, ldo, c->compute,
                  c->algo) == CUBLAS_STATUS_SUCCESS;
  }
  if (c->entry == MT_FN_cublasLtMatmul && row == 0 && rows == c->n && ldo == c->ldd) {
    mt_fn_cublasLtMatmul f = MT_REAL_FN(cublasLtMatmul);
    return f && f(c->handle, c->lt_desc, c->alpha, c->a, c->lt_adesc, c->b, c->lt_bdesc, &zero,
                  c->c, c->lt_cdesc, out, c->lt_ddesc, c->lt_algo, c->workspace,
                  (size_t)c->workspace_bytes, c->stream) == CUBLAS_STATUS_SUCCESS;
  }
  return 0;
}

/* The probe's rows in the scratch: 16-byte aligned, as the router requires of a routed output. */
static int probe_ld(int n) { return (n + 7) / 8 * 8; }

/* The scratch: after the slots' blocks, 256-byte aligned; the probe's rows, then the shadow's. */
static CUdeviceptr scratch_of(const context *c) {
  return c->mem + (CUdeviceptr)round256((size_t)nslots * SLOT_BYTES);
}

static size_t probe_bytes_of(int n) {
  return round256((size_t)MT_INSTR_PROBE_ROWS * probe_ld(n) * 2);
}

/* Rows the probe recomputes: first, last and two spread between, distinct. */
static int probe_rows_of(int m, int32_t rows[MT_INSTR_PROBE_ROWS]) {
  int cand[MT_INSTR_PROBE_ROWS] = {0, m / 3, (2 * m) / 3, m - 1}, n = 0;
  for (int i = 0; i < MT_INSTR_PROBE_ROWS; i++) {
    int dup = 0;
    for (int j = 0; j < n; j++)
      dup |= rows[j] == cand[i];
    if (!dup)
      rows[n++] = cand[i];
  }
  return n;
}

/* The probe's rows alone: through the engine (M = 1 each, the call's own quantized weight and
 * workspace, ordered after the call on its stream) or, for bf16, through cuBLAS. */
static int run_probe(const mt_instr_call *ic, CUdeviceptr scratch, mt_instr_probe_args *pa) {
  pa->nrows = probe_rows_of(ic->m, pa->rows);
  pa->ld_alone = probe_ld(ic->n);
  for (int i = 0; i < pa->nrows; i++) {
    void *out = (void *)(scratch + (CUdeviceptr)(2 * (size_t)i * pa->ld_alone));
    if (ic->engine) {
      mt_gemm_args one = *ic->engine;
      one.m = 1;
      one.x = (const char *)ic->x + 2 * (size_t)pa->rows[i] * ic->ldx;
      one.y = out;
      one.ldy = (size_t)pa->ld_alone;
      one.c = NULL;
      one.beta = 0.0f;
      if (mt_gemm(&one, (mt_stream)ic->call->stream) != MT_OK)
        return 0;
    } else if (!rerun_cublas(ic->call, pa->rows[i], 1, out, pa->ld_alone)) {
      return 0;
    }
  }
  pa->y = ic->y;
  pa->alone = (const void *)scratch;
  pa->ldy = (int64_t)ic->ldy;
  pa->n = ic->n;
  pa->type = ic->ytype;
  return 1;
}

/* Can the scratch serve this stream now (see the file comment)? Under scratch_lock. */
static int scratch_free(context *c, CUstream stream) {
  if (!c->scratch_used || c->scratch_stream == stream)
    return 1;
  /* the slot may have been published again since: its sequence only grows */
  return (int32_t)(__atomic_load_n(c->scratch_slot->flag, __ATOMIC_ACQUIRE) - c->scratch_seq) >= 0;
}

typedef struct {
  int route, shadow, probe;
} sampled;

/* Which instruments this call gets (the per-route counters advance here). Under lock. */
static sampled sample(const mt_instr_call *ic) {
  sampled p = {route_index(ic->spec, ic->n, ic->k), 0, 0};
  if (p.route < 0)
    return p;
  route_stats *r = &routes[p.route];
  if (period_shadow)
    p.shadow = r->shadow_seen++ % period_shadow == 0;
  if (period_probe && ic->m > 1)
    p.probe = r->probe_seen++ % period_probe == 0;
  return p;
}

static void skip_all(int kinds, enum skip why) {
  if (kinds & K_SHADOW)
    shadow.skipped[why]++;
  if (kinds & K_PROBE)
    probe.skipped[why]++;
  if (kinds & K_DIGEST)
    digest.skipped[why]++;
}

/* Enqueue the chosen instruments into slot s on the call's stream; returns the kinds enqueued
 * (0 when the memset failed: nothing was enqueued). The probe and shadow under scratch_lock. */
static int enqueue(const mt_instr_call *ic, context *c, slot *s, int kinds, const mt_driver *d) {
  CUstream stream = (CUstream)ic->call->stream;
  mt_instr_header *hdr = (mt_instr_header *)s->dev;
  if (!s->used && d->memset_d8_async(s->dev, 0, sizeof *hdr, stream) != CUDA_SUCCESS)
    return 0;
  s->used = 1;
  if (kinds & K_DIGEST) {
    mt_instr_digest_args da = {.x = ic->x,
                               .y = ic->y,
                               .ldx = (int64_t)ic->ldx,
                               .ldy = (int64_t)ic->ldy,
                               .m = ic->m,
                               .n = ic->n,
                               .k = ic->k,
                               .xtype = ic->xtype,
                               .ytype = ic->ytype,
                               .all = digest_all,
                               .threshold = digest_threshold,
                               .hdr = hdr,
                               .rows = (mt_instr_row *)(s->dev + sizeof *hdr),
                               .cap = ROWS_PER_SLOT};
    if (mt_instr_launch_digest(&da, (mt_stream)stream) != MT_OK) {
      digest.skipped[SK_ERROR]++;
      kinds &= ~K_DIGEST;
    }
  }
  CUdeviceptr scratch = scratch_of(c);
  if (kinds & K_PROBE) {
    mt_instr_probe_args pa = {.hdr = hdr};
    if (!run_probe(ic, scratch, &pa) || mt_instr_launch_probe(&pa, (mt_stream)stream) != MT_OK) {
      probe.skipped[SK_ERROR]++;
      kinds &= ~K_PROBE;
    } else {
      s->probe_rows = pa.nrows;
    }
  }
  if (kinds & K_SHADOW) {
    CUdeviceptr ref = scratch + (CUdeviceptr)probe_bytes_of(ic->n);
    mt_instr_shadow_args sa = {.y = ic->y,
                               .ref = (const void *)ref,
                               .ld = (int64_t)ic->ldy,
                               .m = ic->m,
                               .n = ic->n,
                               .type = ic->ytype,
                               .hdr = hdr};
    if (!rerun_cublas(ic->call, 0, ic->m, (void *)ref, (int64_t)ic->ldy) ||
        mt_instr_launch_shadow(&sa, (mt_stream)stream) != MT_OK) {
      shadow.skipped[SK_ERROR]++;
      kinds &= ~K_SHADOW;
    }
  }
  return kinds;
}

/* The last launch of an instrumented call: the weight's identity when rows were digested, then
 * the publication of the block (kernels/instr.h). MT_OK or an mt_status. */
static int finish(const mt_instr_call *ic, slot *s, int kinds) {
  size_t bias_elem = ic->biastype == MT_DTYPE_FP32 ? 4 : 2;
  int digest_on = kinds & K_DIGEST;
  s->seq++;
  mt_instr_finish_args fa = {.w = digest_on ? ic->w : NULL,
                             .ldw = (int64_t)ic->ldw,
                             .frozen_sum = digest_on ? ic->frozen_sum : NULL,
                             .bias = digest_on ? ic->bias : NULL,
                             .bias_bytes = digest_on && ic->bias ? (int64_t)(bias_elem * ic->n) : 0,
                             .n = ic->n,
                             .k = ic->k,
                             .hdr = (mt_instr_header *)s->dev,
                             .dst = (void *)s->host_dev,
                             .flag = (uint32_t *)s->flag_dev,
                             .cap = ROWS_PER_SLOT,
                             .seq = s->seq};
  return mt_instr_launch_finish(&fa, (mt_stream)ic->call->stream);
}

/* The scratch's room and availability for the probe and shadow. When they stay on, the
 * context's scratch_lock is held (*held set) until the call has enqueued them. */
static int scratch_gate(const mt_instr_call *ic, context *c, int kinds, int *held) {
  size_t probe_bytes = probe_bytes_of(ic->n);
  size_t shadow_bytes = 2 * ((size_t)(ic->m - 1) * ic->ldy + (size_t)ic->n);
  *held = 0;
  if ((kinds & K_SHADOW) && probe_bytes + shadow_bytes > c->scratch_bytes) {
    shadow.skipped[SK_SCRATCH]++;
    kinds &= ~K_SHADOW;
  }
  if ((kinds & K_PROBE) && probe_bytes > c->scratch_bytes) {
    probe.skipped[SK_SCRATCH]++;
    kinds &= ~K_PROBE;
  }
  if (!(kinds & (K_PROBE | K_SHADOW)))
    return kinds;
  /* another thread enqueueing its own probe or shadow: skip rather than wait for it */
  if (pthread_mutex_trylock(&c->scratch_lock) == 0) {
    if (scratch_free(c, (CUstream)ic->call->stream))
      return *held = 1, kinds;
    pthread_mutex_unlock(&c->scratch_lock);
  }
  skip_all(kinds & (K_PROBE | K_SHADOW), SK_BUSY);
  return kinds & ~(K_PROBE | K_SHADOW);
}

/* Which instruments this call gets, and its slot's context; 0 when none. Takes `lock` briefly. */
static int choose(const mt_instr_call *ic, const mt_driver *d, const mt_instr_driver *e, sampled *p,
                  context **c) {
  pthread_mutex_lock(&lock);
  *p = sample(ic);
  int kinds =
      (p->shadow ? K_SHADOW : 0) | (p->probe ? K_PROBE : 0) | (rate_digest > 0 ? K_DIGEST : 0);
  if (p->route < 0 || !kinds || !d || !e || stopped) {
    pthread_mutex_unlock(&lock);
    return 0;
  }
  if (kinds & K_SHADOW)
    shadow.calls++;
  if (kinds & K_PROBE)
    probe.calls++;
  if (kinds & K_DIGEST)
    digest.calls++;
  /* beta != 0: y is beta C + ..., and C may be y itself, already overwritten */
  if (ic->beta != 0.0f) {
    skip_all(kinds, SK_BETA);
    kinds = 0;
  }
  if ((kinds & K_SHADOW) && !single_problem(ic->call)) {
    shadow.skipped[SK_ENTRY]++;
    kinds &= ~K_SHADOW;
  }
  if ((kinds & K_PROBE) && !ic->engine && ic->call->entry == MT_FN_cublasLtMatmul) {
    probe.skipped[SK_ENTRY]++;
    kinds &= ~K_PROBE;
  }
  if (kinds && (ic->capturing || stream_capturing(d, (mt_stream)ic->call->stream))) {
    skip_all(kinds, SK_CAPTURE);
    kinds = 0;
  } else if (kinds && (!(*c = context_get(d, e)) || !writer_start())) {
    skip_all(kinds, SK_ERROR);
    kinds = 0;
  }
  pthread_mutex_unlock(&lock);
  return kinds;
}

/* The slot's fields the writer needs, from the call. */
static void slot_fill(slot *s, const mt_instr_call *ic, int route, int kinds) {
  s->kinds = kinds;
  s->route = route;
  s->m = ic->m, s->n = ic->n, s->k = ic->k;
  s->xtype = ic->xtype, s->ytype = ic->ytype, s->wtype = ic->wtype;
  s->has_bias = ic->bias != NULL, s->biastype = ic->biastype;
  s->alpha = ic->alpha;
  s->probe_rows = 0;
}

/* Hand an enqueued slot to the writer. */
static void publish(slot *s) {
  int taken = S_TAKEN;
  pthread_mutex_lock(&lock);
  /* a slot whose context was found destroyed meanwhile is no longer this call's */
  if (atomic_compare_exchange_strong(&s->state, &taken, S_FLIGHT)) {
    in_flight++;
    pthread_cond_signal(&wake);
  }
  pthread_mutex_unlock(&lock);
}

void mt_instr_after(const mt_instr_call *ic) {
  if (!enabled || ic->m <= 0 || ic->n <= 0)
    return;
  const mt_driver *d = mt_driver_get();
  const mt_instr_driver *e = mt_instr_driver_get();
  sampled p;
  context *c = NULL;
  int kinds = choose(ic, d, e, &p, &c);
  slot *s = NULL;
  if (kinds && !(s = slot_take(c))) {
    skip_all(kinds, SK_NO_SLOT);
    dropped_slots++;
    kinds = 0;
  }
  int held = 0;
  if (kinds)
    kinds = scratch_gate(ic, c, kinds, &held);
  if (!kinds) {
    if (s)
      atomic_store(&s->state, S_FREE);
    return;
  }
  slot_fill(s, ic, p.route, kinds);
  int got = enqueue(ic, c, s, kinds, d);
  skip_all(kinds & ~got, SK_ERROR);
  if (got && finish(ic, s, got) != MT_OK) {
    /* enqueued work whose end cannot be known: the slot is never reused */
    skip_all(got, SK_ERROR);
    atomic_store(&s->state, S_LOST);
    got = 0;
  } else if (!got) {
    atomic_store(&s->state, S_FREE);
  }
  if (got && (got & (K_PROBE | K_SHADOW))) {
    c->scratch_used = 1;
    c->scratch_stream = (CUstream)ic->call->stream;
    c->scratch_slot = s;
    c->scratch_seq = s->seq;
  }
  if (held)
    pthread_mutex_unlock(&c->scratch_lock);
  if (got) {
    s->kinds = got;
    publish(s);
  }
}

/* --- bf16: cuBLAS is the routed engine ------------------------------------------------------ */

static enum mt_dtype dtype_of(int cuda_type) {
  return cuda_type == CUDA_R_16F   ? MT_DTYPE_FP16
         : cuda_type == CUDA_R_32F ? MT_DTYPE_FP32
                                   : MT_DTYPE_BF16;
}

void mt_instr_from_call(const mt_spec *s, const mt_call *c, const float *alpha, const float *beta,
                        mt_instr_call *out) {
  int bias = c->entry == MT_FN_cublasLtMatmul && c->epilogue == CUBLASLT_EPILOGUE_BIAS;
  *out = (mt_instr_call){.spec = s,
                         .call = c,
                         .w = c->a,
                         .ldw = (size_t)c->lda,
                         .wtype = dtype_of(c->atype),
                         .m = (int)c->n,
                         .n = (int)c->m,
                         .k = (int)c->k,
                         .x = c->b,
                         .ldx = (size_t)c->ldb,
                         .xtype = dtype_of(c->btype),
                         .y = c->d,
                         .ldy = (size_t)c->ldd,
                         .ytype = dtype_of(c->dtype),
                         .alpha = *alpha,
                         .beta = *beta,
                         .bias = bias ? c->bias : NULL,
                         .biastype = !bias || c->bias_type == -1 ? dtype_of(c->dtype)
                                                                 : dtype_of(c->bias_type)};
}

int mt_instr_bf16(const mt_spec *s, const mt_call *c, cublasStatus_t *status) {
  if (!enabled || !single_problem(c) || c->m > INT32_MAX || c->n > INT32_MAX || c->k > INT32_MAX ||
      !mt_driver_get() || !mt_instr_driver_get())
    return 0;
  if (c->entry == MT_FN_cublasLtMatmul) {
    mt_fn_cublasLtMatmul f = MT_REAL_FN(cublasLtMatmul);
    if (!f)
      return 0;
    *status = f(c->handle, c->lt_desc, c->alpha, c->a, c->lt_adesc, c->b, c->lt_bdesc, c->beta,
                c->c, c->lt_cdesc, c->d, c->lt_ddesc, c->lt_algo, c->workspace,
                (size_t)c->workspace_bytes, c->stream);
  } else if (c->entry == MT_FN_cublasGemmEx) {
    mt_fn_cublasGemmEx f = MT_REAL_FN(cublasGemmEx);
    if (!f)
      return 0;
    *status = f(c->handle, c->transa, c->transb, (int)c->m, (int)c->n, (int)c->k, c->alpha, c->a,
                c->atype, (int)c->lda, c->b, c->btype, (int)c->ldb, c->beta, (void *)c->c, c->ctype,
                (int)c->ldc, c->compute, c->algo);
  } else {
    mt_fn_cublasGemmEx_64 f = MT_REAL_FN(cublasGemmEx_64);
    if (!f)
      return 0;
    *status =
        f(c->handle, c->transa, c->transb, c->m, c->n, c->k, c->alpha, c->a, c->atype, c->lda, c->b,
          c->btype, c->ldb, c->beta, (void *)c->c, c->ctype, c->ldc, c->compute, c->algo);
  }
  if (*status == CUBLAS_STATUS_SUCCESS) {
    mt_instr_call ic;
    mt_instr_from_call(s, c, (const float *)c->alpha, (const float *)c->beta, &ic);
    mt_instr_after(&ic);
  }
  return 1;
}

/* --- the summary --------------------------------------------------------------------------- */

static void emit_skips(void (*emit)(void *, const char *), void *ctx, const instrument *in) {
  char b[96];
  emit(ctx, "\"skipped\": {");
  int first = 1;
  for (int i = 0; i < SK_COUNT; i++) {
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

void mt_instr_summary(void (*emit)(void *ctx, const char *text), void *ctx) {
  if (!spec_now || !(period_shadow || period_probe || rate_digest > 0))
    return;
  pthread_mutex_lock(&lock);
  char b[512];
  const struct {
    const char *name;
    double rate;
    const instrument *in;
  } ins[3] = {{"shadow", rate_shadow, &shadow},
              {"probe", rate_probe, &probe},
              {"digest", rate_digest, &digest}};
  emit(ctx, ", \"instruments\": {");
  for (int i = 0; i < 3; i++) {
    snprintf(b, sizeof b, "\"%s\": {\"rate\": %.9g, \"calls\": %llu, ", ins[i].name, ins[i].rate,
             ins[i].in->calls);
    emit(ctx, b);
    emit_skips(emit, ctx, ins[i].in);
    emit(ctx, "}, ");
  }
  snprintf(b, sizeof b,
           "\"slots\": %d, \"dropped_calls\": %llu, \"device_bytes\": %zu, "
           "\"host_bytes\": %zu, \"routes\": {",
           nslots, dropped_slots, device_bytes, host_bytes);
  emit(ctx, b);
  int first = 1;
  for (int i = 0; i < spec_now->nroutes; i++) {
    const route_stats *r = &routes[i];
    if (!(r->shadow_calls || r->probe_calls || r->digest_calls))
      continue;
    emit_route(emit, ctx, i, first);
    first = 0;
  }
  unsigned long long lost = digest.skipped[SK_NO_SLOT] + digest.skipped[SK_EXIT];
  snprintf(b, sizeof b,
           "}}, \"digests\": {\"written\": %llu, \"dropped\": %llu, "
           "\"dropped_calls\": %llu}",
           digest_written, digest_dropped, lost);
  emit(ctx, b);
  pthread_mutex_unlock(&lock);
}
