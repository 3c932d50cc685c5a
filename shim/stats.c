/* stats.c — counters, census and the JSONL statistics file. */
#include "shim/stats.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/files.h"
#include "base/json.h"
#include "base/log.h"
#include "base/proc.h"
#include "kernels/driver.h"

static atomic_ullong n_calls, n_routed, n_passthrough, n_fallbacks[MT_R_COUNT];

typedef struct {
  int used;
  int entry, transa, transb, atype, btype, ctype;
  int64_t m, n, k, batch;
  unsigned long long count;
} census_row;

#define DISTINCT_N_KEPT 8
typedef struct {
  int used;
  int atype, ctype;
  int64_t m, k;
  unsigned long long calls;
  int grouped;    /* seen as the weights of a torch._grouped_mm: experts by construction */
  int nn;         /* seen as NN: a forward of an [in][out] weight, or PyTorch's dgrad of (k x m) */
  int distinct_n; /* saturates at DISTINCT_N_KEPT */
  int64_t n_seen[DISTINCT_N_KEPT];
} shape_row;

/* Static tables: nothing is allocated, and untouched pages of a process that never routes stay
 * unmapped. */
static census_row census[MT_CENSUS_SIZE];
static shape_row shapes[MT_SHAPES_SIZE];
static unsigned long long census_overflow, shapes_overflow;
static pthread_mutex_t census_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t file_lock = PTHREAD_MUTEX_INITIALIZER; /* stats_file.fd between threads */

static int stats_on;               /* MINITE_STATS opened or to be created: the census is kept */
static const mt_spec *census_spec; /* the spec the census rows' roles are read against */
static mt_outfile stats_file = {.fd = -1}; /* opened at start, or at the first GEMM call */
static pid_t owner_pid;
static char start_fields[4096]; /* pid .. fingerprint, shared by both records */

/* The statistics and the log in one file would mix log lines into the JSON lines: refused, also
 * when the log goes to stderr and stderr is the file. */
static int is_the_log(int fd, char *why, size_t size) {
  struct stat a, b;
  if (fstat(fd, &a) != 0 || fstat(mt_log_fd(), &b) != 0 || a.st_dev != b.st_dev ||
      a.st_ino != b.st_ino)
    return 0;
  snprintf(why, size,
           "%s is the file the log goes to (MINITE_LOG_FILE, or stderr): log lines would break "
           "its JSON lines; give the statistics a path of their own",
           stats_file.shown);
  return 1;
}

int mt_stats_open(const char *tmpl, char *why, size_t size) {
  if (mt_out_open(&stats_file, "MINITE_STATS", tmpl, 0, why, size) != 0)
    return -1;
  if (stats_file.fd >= 0 && is_the_log(stats_file.fd, why, size)) {
    close(stats_file.fd);
    stats_file.fd = -1;
    return -1;
  }
  owner_pid = getpid();
  stats_on = 1;
  return 0;
}

/* A fork with either lock held by another thread would leave the child's copy locked forever
 * (shim/fork.h): census_lock is taken first, as mt_stats_finish nests them. */
void mt_stats_fork_lock(void) {
  pthread_mutex_lock(&census_lock);
  pthread_mutex_lock(&file_lock);
}

void mt_stats_fork_unlock(void) {
  pthread_mutex_unlock(&file_lock);
  pthread_mutex_unlock(&census_lock);
}

/* --- records: each built in memory and written with one write(2) to a file opened O_APPEND, so
 * that processes and threads sharing the file interleave whole records, never pieces of them;
 * write(2) is the only way out, so that no stdio buffer is ever shared with a forked child -- */

typedef struct {
  char *buf;
  size_t used, size;
  int failed; /* out of memory: the record is dropped whole, never written in part */
} writer;

__attribute__((format(printf, 2, 3))) static void w_printf(writer *w, const char *fmt, ...) {
  for (int attempt = 0; attempt < 2 && !w->failed; attempt++) {
    va_list ap;
    va_start(ap, fmt);
    int n = w->buf ? vsnprintf(w->buf + w->used, w->size - w->used, fmt, ap) : -1;
    va_end(ap);
    if (n >= 0 && (size_t)n < w->size - w->used) {
      w->used += (size_t)n;
      return;
    }
    size_t want = (w->size ? w->size : 4096) * 2 + (n > 0 ? (size_t)n : 0);
    char *grown = realloc(w->buf, want);
    if (!grown)
      w->failed = 1;
    else
      w->buf = grown, w->size = want;
  }
}

/* All of `len` bytes at the end of fd, in one write(2) unless the kernel takes fewer; 0 or -1. */
static int write_all(int fd, const char *p, size_t len) {
  while (len) {
    ssize_t n = write(fd, p, len);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    p += n, len -= (size_t)n;
  }
  return 0;
}

/* Write the record and free it; 0, or -1 when it could not be built or written. */
static int w_finish(writer *w, int fd) {
  int rc = w->failed || !w->buf ? -1 : write_all(fd, w->buf, w->used);
  free(w->buf);
  *w = (writer){0};
  return rc;
}

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The file, created now when it did not exist at start; 0, or -1 after one warning (the census
 * stops: nothing would ever read it). */
static int have_file(void) {
  char why[2048];
  if (stats_file.fd >= 0)
    return 0;
  if (mt_out_create(&stats_file, why, sizeof why) == 0)
    return 0;
  MT_WARN("%s; no statistics and no instruments for this process", why);
  stats_on = 0;
  return -1;
}

int mt_stats_start(const mt_spec *s, const char *role, const char *version) {
  census_spec = s;
  if (!stats_on || getpid() != owner_pid)
    return 0;
  if (have_file() != 0)
    return -1;
  char host[1600], role_json[1600], name_json[400], version_json[100],
      routes[MT_SPEC_MAX_ROUTES * 26]; /* each at most ', "4294967295x4294967295"' */
  mt_json_string(host, sizeof host, mt_proc_host());
  mt_json_string(role_json, sizeof role_json, role ? role : "");
  mt_json_string(name_json, sizeof name_json, s->name);
  mt_json_string(version_json, sizeof version_json, version);
  size_t used = 0;
  routes[0] = '\0';
  for (int i = 0; i < s->nroutes && used < sizeof routes; i++)
    used += (size_t)snprintf(routes + used, sizeof routes - used, "%s\"%" PRIu32 "x%" PRIu32 "\"",
                             i ? ", " : "", s->routes[i].out, s->routes[i].in);
  char pci[32], pci_json[80];
  int device = mt_device_current(pci, sizeof pci);
  mt_json_string(pci_json, sizeof pci_json, pci);
  snprintf(start_fields, sizeof start_fields,
           "\"pid\": %ld, \"host\": %s, \"rank\": %s, \"local_rank\": %d, \"world_size\": %d, "
           "\"device\": %d, \"pci_bus\": %s, \"role\": %s, \"spec\": %s, "
           "\"fingerprint\": \"%016" PRIx64 "\"",
           (long)owner_pid, host, mt_proc_rank(), mt_proc_local_rank(), mt_proc_world_size(),
           device, pci_json, role_json, name_json, mt_spec_fingerprint(s));
  writer w = {0};
  w_printf(&w, "{\"event\": \"start\", \"time\": %.6f, %s, \"routes\": [%s], \"version\": %s}\n",
           now_seconds(), start_fields, routes, version_json);
  char shown[MT_LOG_VALUE_MAX + 64];
  pthread_mutex_lock(&file_lock);
  if (w_finish(&w, stats_file.fd) != 0)
    MT_WARN("could not write the start record to %s: %s",
            mt_log_value(stats_file.path, shown, sizeof shown), strerror(errno));
  pthread_mutex_unlock(&file_lock);
  return 0;
}

void mt_stats_append(const char *lines, size_t len) {
  pthread_mutex_lock(&file_lock);
  if (stats_file.fd >= 0 && getpid() == owner_pid)
    write_all(stats_file.fd, lines, len); /* whole lines, one write */
  pthread_mutex_unlock(&file_lock);
}

static void emit_to_writer(void *ctx, const char *text) { w_printf((writer *)ctx, "%s", text); }

void mt_stats_count(enum mt_reason reason) {
  atomic_fetch_add_explicit(&n_calls, 1, memory_order_relaxed);
  if (reason == MT_R_ROUTED) {
    atomic_fetch_add_explicit(&n_routed, 1, memory_order_relaxed);
    return;
  }
  atomic_fetch_add_explicit(&n_passthrough, 1, memory_order_relaxed);
  if (reason != MT_R_UNROUTED)
    atomic_fetch_add_explicit(&n_fallbacks[reason], 1, memory_order_relaxed);
}

static uint64_t mix(uint64_t h, int64_t v) {
  h ^= (uint64_t)v;
  h *= 0x100000001b3ULL;
  return h ^ (h >> 29);
}

static void census_add(const mt_call *c) {
  uint64_t h = 0xcbf29ce484222325ULL;
  h = mix(mix(mix(h, c->entry), c->transa * 4 + c->transb), c->m);
  h = mix(mix(mix(h, c->n), c->k), ((int64_t)c->atype << 32) ^ (c->btype << 16) ^ c->ctype);
  h = mix(h, c->batch);
  for (unsigned i = 0; i < MT_CENSUS_SIZE; i++) {
    census_row *r = &census[(h + i) % MT_CENSUS_SIZE];
    if (!r->used) {
      *r = (census_row){1,        (int)c->entry, c->transa, c->transb, c->atype, c->btype,
                        c->ctype, c->m,          c->n,      c->k,      c->batch, 1};
      return;
    }
    if (r->entry == (int)c->entry && r->transa == c->transa && r->transb == c->transb &&
        r->m == c->m && r->n == c->n && r->k == c->k && r->atype == c->atype &&
        r->btype == c->btype && r->ctype == c->ctype && r->batch == c->batch) {
      r->count++;
      return;
    }
  }
  census_overflow++;
}

/* Forwards of either weight layout: TN, and NN (which may be a dgrad: suggest_locked tells). */
static int suggestible(const mt_call *c) {
  return mt_op_known(c->transa) && c->transb == MT_OP_N && c->atype == c->btype &&
         (c->atype == CUDA_R_16BF || c->atype == CUDA_R_16F) && c->m > 0 && c->k > 0;
}

static void shape_add(const mt_call *c) {
  const int nn = c->transa == MT_OP_N;
  uint64_t h = mix(mix(mix(0xcbf29ce484222325ULL, c->m), c->k), c->atype * 64 + c->ctype);
  h = mix(h, nn);
  for (unsigned i = 0; i < MT_SHAPES_SIZE; i++) {
    shape_row *r = &shapes[(h + i) % MT_SHAPES_SIZE];
    if (!r->used)
      *r = (shape_row){
          .used = 1, .atype = c->atype, .ctype = c->ctype, .m = c->m, .k = c->k, .nn = nn};
    else if (r->m != c->m || r->k != c->k || r->atype != c->atype || r->ctype != c->ctype ||
             r->nn != nn)
      continue;
    r->calls++;
    r->grouped |= c->entry == MT_FN_torch_grouped_mm || c->entry == MT_FN_vllm_fused_moe;
    int seen = 0;
    for (int j = 0; j < r->distinct_n && !seen; j++)
      seen = r->n_seen[j] == c->n;
    if (!seen && r->distinct_n < DISTINCT_N_KEPT)
      r->n_seen[r->distinct_n++] = c->n;
    return;
  }
  shapes_overflow++;
}

void mt_stats_census(const mt_call *one) {
  if (!stats_on)
    return;
  pthread_mutex_lock(&census_lock);
  census_add(one);
  if (suggestible(one))
    shape_add(one);
  pthread_mutex_unlock(&census_lock);
}

void mt_stats_get(mt_stats_counts *out) {
  out->gemm_calls = atomic_load(&n_calls);
  out->routed = atomic_load(&n_routed);
  out->passthrough = atomic_load(&n_passthrough);
  for (int r = 0; r < MT_R_COUNT; r++)
    out->fallbacks[r] = atomic_load(&n_fallbacks[r]);
}

static int by_calls_desc(const void *x, const void *y) {
  const shape_row *a = *(const shape_row *const *)x, *b = *(const shape_row *const *)y;
  if (a->calls != b->calls)
    return a->calls < b->calls ? 1 : -1;
  return a->m != b->m ? (a->m < b->m ? -1 : 1) : (a->k < b->k ? -1 : a->k > b->k);
}

/* An NN shape (m x k) that is PyTorch's dgrad of a weight seen in a TN forward as k x m; else it is
 * taken as the forward of an [in][out] weight. Caller holds census_lock. */
static int dgrad_of_seen(const shape_row *nn) {
  for (int i = 0; i < MT_SHAPES_SIZE; i++)
    if (shapes[i].used && !shapes[i].nn && shapes[i].m == nn->k && shapes[i].k == nn->m)
      return 1;
  return 0;
}

/* Caller holds census_lock. The same weight shape seen as BF16 and as FP16, or in both layouts, is
 * suggested once. */
static int suggest_locked(mt_route *routes, int max) {
  static const shape_row *picked[MT_SHAPES_SIZE];
  int npicked = 0, n = 0;
  for (int i = 0; i < MT_SHAPES_SIZE; i++) {
    const shape_row *r = &shapes[i];
    if (r->used &&
        (r->grouped || r->distinct_n >= MT_SUGGEST_DISTINCT_N || r->calls >= MT_SUGGEST_CALLS) &&
        !(r->nn && dgrad_of_seen(r)))
      picked[npicked++] = r;
  }
  qsort(picked, (size_t)npicked, sizeof picked[0], by_calls_desc);
  for (int i = 0; i < npicked && n < max; i++) {
    int dup = 0;
    for (int j = 0; j < n && !dup; j++)
      dup = routes[j].out == picked[i]->m && routes[j].in == picked[i]->k;
    if (!dup && picked[i]->m <= UINT32_MAX && picked[i]->k <= UINT32_MAX)
      routes[n++] = (mt_route){(uint32_t)picked[i]->m, (uint32_t)picked[i]->k};
  }
  return n;
}

int mt_stats_suggest(mt_route *routes, int max) {
  pthread_mutex_lock(&census_lock);
  int n = suggest_locked(routes, max);
  pthread_mutex_unlock(&census_lock);
  return n;
}

void mt_stats_reset(void) {
  pthread_mutex_lock(&census_lock);
  memset(census, 0, sizeof census);
  memset(shapes, 0, sizeof shapes);
  census_overflow = shapes_overflow = 0;
  pthread_mutex_unlock(&census_lock);
  atomic_store(&n_calls, 0);
  atomic_store(&n_routed, 0);
  atomic_store(&n_passthrough, 0);
  for (int r = 0; r < MT_R_COUNT; r++)
    atomic_store(&n_fallbacks[r], 0);
}

static const char *type_name(int t, char *buf, size_t size) {
  switch (t) {
  case CUDA_R_16BF:
    return "bf16";
  case CUDA_R_16F:
    return "f16";
  case CUDA_R_32F:
    return "f32";
  case CUDA_R_64F:
    return "f64";
  case CUDA_R_8F_E4M3:
    return "f8e4m3";
  case CUDA_R_8F_E5M2:
    return "f8e5m2";
  case CUDA_R_8I:
    return "i8";
  case CUDA_R_32I:
    return "i32";
  default:
    snprintf(buf, size, "type%d", t);
    return buf;
  }
}

static char op_char(int op) { return op == 0 ? 'N' : op == 1 ? 'T' : op == 2 ? 'C' : '?'; }

static int cmp_i64(int64_t a, int64_t b) { return a < b ? -1 : a > b; }

/* Rows of equal counts by entry name, m, n and k, as tools/minite-merge orders its rows, so that a
 * process's census and the merge of its file list tied rows alike. */
static int by_count_desc(const void *x, const void *y) {
  const census_row *a = *(const census_row *const *)x, *b = *(const census_row *const *)y;
  if (a->count != b->count)
    return a->count < b->count ? 1 : -1;
  int c = strcmp(mt_fn_name((enum mt_fn)a->entry), mt_fn_name((enum mt_fn)b->entry));
  if (!c)
    c = cmp_i64(a->m, b->m);
  if (!c)
    c = cmp_i64(a->n, b->n);
  return c ? c : cmp_i64(a->k, b->k);
}

/* What a census row is to the spec's routes, as its "role" field (empty: nothing routed). */
static void census_role(const census_row *r, char *out, size_t size) {
  const mt_call c = {.transa = r->transa, .transb = r->transb, .m = r->m, .n = r->n, .k = r->k};
  const char *name = census_spec ? mt_route_role_name(mt_route_role(census_spec, &c)) : NULL;
  int64_t experts;
  int route = census_spec && !name ? mt_route_ragged_dot(census_spec, &c, &experts) : -1;
  if (name)
    snprintf(out, size, ", \"role\": \"%s%s\"", name,
             mt_route_ambiguous(census_spec, &c) ? " (ambiguous)" : "");
  else if (route >= 0)
    snprintf(out, size,
             ", \"role\": \"ragged_dot: %" PRId64 " experts of %" PRIu32 "x%" PRIu32 " [in, out]\"",
             experts, census_spec->routes[route].out, census_spec->routes[route].in);
  else
    out[0] = '\0';
}

/* Most frequent shapes first: the ones a reader looks for. Caller holds census_lock. */
static void write_census(writer *w) {
  static const census_row *rows[MT_CENSUS_SIZE];
  int nrows = 0;
  for (int i = 0; i < MT_CENSUS_SIZE; i++)
    if (census[i].used)
      rows[nrows++] = &census[i];
  qsort(rows, (size_t)nrows, sizeof rows[0], by_count_desc);
  for (int i = 0; i < nrows; i++) {
    const census_row *r = rows[i];
    int first = i == 0;
    char b1[16], b2[16], b3[16], batch[40] = "", role[96];
    if (r->batch != 1)
      snprintf(batch, sizeof batch, ", \"batch\": %" PRId64, r->batch);
    census_role(r, role, sizeof role);
    w_printf(w,
             "%s{\"entry\": \"%s\", \"ops\": \"%c%c\", \"m\": %" PRId64 ", \"n\": %" PRId64
             ", \"k\": %" PRId64 ", \"types\": \"%s*%s->%s\"%s%s, \"count\": %llu}",
             first ? "" : ", ", mt_fn_name((enum mt_fn)r->entry), op_char(r->transa),
             op_char(r->transb), r->m, r->n, r->k, type_name(r->atype, b1, sizeof b1),
             type_name(r->btype, b2, sizeof b2), type_name(r->ctype, b3, sizeof b3), batch, role,
             r->count);
  }
}

static void log_summary(const mt_stats_counts *c) {
  char reasons[512];
  size_t used = 0;
  reasons[0] = '\0';
  for (int r = MT_R_DGRAD; r < MT_R_COUNT; r++)
    if (c->fallbacks[r] && used < sizeof reasons)
      used += (size_t)snprintf(reasons + used, sizeof reasons - used, "%s%s %llu", used ? ", " : "",
                               mt_reason_name(r), c->fallbacks[r]);
  MT_INFO("summary: %llu GEMM calls, %llu routed, %llu passed through%s%s%s", c->gemm_calls,
          c->routed, c->passthrough, used ? " (" : "", reasons, used ? ")" : "");
}

void mt_stats_finish(mt_stats_part parts) {
  mt_stats_counts c;
  mt_stats_get(&c);
  log_summary(&c);
  if (stats_file.fd < 0 || getpid() != owner_pid)
    return;
  pthread_mutex_lock(&census_lock);
  writer w = {0};
  w_printf(&w,
           "{\"event\": \"summary\", \"time\": %.6f, %s, \"gemm_calls\": %llu, \"routed\": "
           "%llu, \"passthrough\": %llu, \"fallbacks\": {",
           now_seconds(), start_fields, c.gemm_calls, c.routed, c.passthrough);
  int first = 1;
  for (int r = MT_R_DGRAD; r < MT_R_COUNT; r++) {
    if (!c.fallbacks[r])
      continue;
    w_printf(&w, "%s\"%s\": %llu", first ? "" : ", ", mt_reason_name(r), c.fallbacks[r]);
    first = 0;
  }
  w_printf(&w, "}, \"census\": [");
  write_census(&w);
  w_printf(&w, "], \"census_overflow\": %llu, \"suggested_routes\": [", census_overflow);
  static mt_route routes[MT_SUGGEST_MAX];
  int n = suggest_locked(routes, MT_SUGGEST_MAX);
  for (int i = 0; i < n; i++)
    w_printf(&w, "%s\"route %" PRIu32 "x%" PRIu32 "\"", i ? ", " : "", routes[i].out, routes[i].in);
  w_printf(&w, "]");
  if (parts)
    parts(emit_to_writer, &w);
  w_printf(&w, "}\n");
  pthread_mutex_lock(&file_lock);
  int rc = w_finish(&w, stats_file.fd);
  int saved = errno;
  close(stats_file.fd);
  stats_file.fd = -1;
  pthread_mutex_unlock(&file_lock);
  pthread_mutex_unlock(&census_lock);
  char shown[MT_LOG_VALUE_MAX + 64];
  if (rc != 0)
    MT_WARN("could not write the summary to %s: %s",
            mt_log_value(stats_file.path, shown, sizeof shown), strerror(saved));
}
