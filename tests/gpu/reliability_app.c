/* reliability_app.c — a plain C program that routes expert GEMMs through the real cuBLAS under the
 * preloaded shim (no fakes), for tests/gpu/test_reliability.py: threads, forks, context resets,
 * two contexts on one GPU, device memory exhausted. It loads libcuda.so.1 and libcublas.so.13 with
 * dlopen (as PyTorch does; libcublas RTLD_GLOBAL, so that without the shim the program still
 * finds cublasGemmEx) and calls cublasGemmEx through the global scope, where the shim's hook
 * comes first when it is preloaded.
 *
 *   reliability_app MODE OUT
 *     threads    16 threads on 16 streams (own handles), the shared weight and their own; then
 *                the same calls one after another on one stream: bitwise equal
 *     swap       the threads' calls in rounds, the shared weight rewritten in place between rounds
 *                (two versions, alternately): each round bitwise equal to the calls made one after
 *                another on its version (under a frozen cache, the streams' checks of the shared
 *                weight right after its change run at once: shim/wcache.h orders them)
 *     fork       routes, forks while another thread routes: the child's call must come back (any
 *                status, no hang); then a child forked before CUDA was used routes on its own
 *     reset      routes; the primary context reset and retained again (cudaDeviceReset); routes;
 *                a created context destroyed and another created: bitwise equal throughout
 *     contexts   two created contexts on the one GPU, alternately and from two threads at once,
 *                against the primary context's results: bitwise equal
 *     oom        (run with MINITE_WEIGHT_CACHE=frozen) device memory taken until cuMemAlloc
 *                fails; calls on a weight not seen before (no cache entry to be had: cuBLAS's
 *                results); the memory given back; the same calls again (the engine's)
 * Every result is also written to OUT (raw BF16, in call order) for the parent to compare across
 * runs (with and without the shim). Prints "#info KEY VALUE" lines; exit 0 when its own checks
 * hold, 1 when one fails, 2 on a setup error.
 */
#include <cublas_api.h>
#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define OUT 1536 /* the routed weight: OUT x IN (Qwen3-30B-A3B's gate_up) */
#define IN 2048
#define MAXTOK 300
#define NTHREADS 16 /* at most: RELIABILITY_THREADS and RELIABILITY_CALLS lower them (sanitizers) */
#define CALLS 12
static int nthreads = NTHREADS, ncalls = CALLS;

#define CU(x) (d.x)
static struct {
  __typeof__(&cuInit) cuInit;
  __typeof__(&cuDeviceGet) cuDeviceGet;
  __typeof__(&cuDevicePrimaryCtxRetain) cuDevicePrimaryCtxRetain;
  __typeof__(&cuDevicePrimaryCtxRelease) cuDevicePrimaryCtxRelease;
  __typeof__(&cuDevicePrimaryCtxReset) cuDevicePrimaryCtxReset;
  __typeof__(&cuCtxSetCurrent) cuCtxSetCurrent;
  CUresult (*ctx_create)(CUcontext *ctx, unsigned flags, CUdevice dev); /* cuCtxCreate_v2 */
  __typeof__(&cuCtxDestroy) cuCtxDestroy;
  __typeof__(&cuCtxSynchronize) cuCtxSynchronize;
  __typeof__(&cuMemAlloc) cuMemAlloc;
  __typeof__(&cuMemFree) cuMemFree;
  __typeof__(&cuMemcpyHtoD) cuMemcpyHtoD;
  __typeof__(&cuMemcpyDtoH) cuMemcpyDtoH;
  __typeof__(&cuStreamCreate) cuStreamCreate;
  __typeof__(&cuStreamSynchronize) cuStreamSynchronize;
} d;

static __typeof__(&cublasCreate_v2) blas_create;
static __typeof__(&cublasDestroy_v2) blas_destroy;
static __typeof__(&cublasSetStream_v2) blas_set_stream;
static __typeof__(&cublasGemmEx) gemm_ex; /* the global scope's: the shim's hook when preloaded */
static CUdevice dev;
static FILE *out_file;

static int load(void) {
  void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  void *blas = dlopen("libcublas.so.13", RTLD_NOW | RTLD_GLOBAL);
  if (!cuda || !blas)
    return fprintf(stderr, "dlopen: %s\n", dlerror()), -1;
  void *p;
#define SYM(lib, field, name)                                                                      \
  if (!(p = dlsym(lib, name)))                                                                     \
    return fprintf(stderr, "no %s\n", name), -1;                                                   \
  memcpy(&field, &p, sizeof p);
  SYM(cuda, d.cuInit, "cuInit");
  SYM(cuda, d.cuDeviceGet, "cuDeviceGet");
  SYM(cuda, d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
  SYM(cuda, d.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
  SYM(cuda, d.cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset_v2");
  SYM(cuda, d.cuCtxSetCurrent, "cuCtxSetCurrent");
  SYM(cuda, d.ctx_create, "cuCtxCreate_v2");
  SYM(cuda, d.cuCtxDestroy, "cuCtxDestroy_v2");
  SYM(cuda, d.cuCtxSynchronize, "cuCtxSynchronize");
  SYM(cuda, d.cuMemAlloc, "cuMemAlloc_v2");
  SYM(cuda, d.cuMemFree, "cuMemFree_v2");
  SYM(cuda, d.cuMemcpyHtoD, "cuMemcpyHtoD_v2");
  SYM(cuda, d.cuMemcpyDtoH, "cuMemcpyDtoH_v2");
  SYM(cuda, d.cuStreamCreate, "cuStreamCreate");
  SYM(cuda, d.cuStreamSynchronize, "cuStreamSynchronize");
  SYM(blas, blas_create, "cublasCreate_v2");
  SYM(blas, blas_destroy, "cublasDestroy_v2");
  SYM(blas, blas_set_stream, "cublasSetStream_v2");
  SYM(RTLD_DEFAULT, gemm_ex, "cublasGemmEx");
#undef SYM
  return 0;
}

static int cuda_up(void) {
  CUcontext ctx;
  return CU(cuInit)(0) || CU(cuDeviceGet)(&dev, 0) || CU(cuDevicePrimaryCtxRetain)(&ctx, dev) ||
                 CU(cuCtxSetCurrent)(ctx)
             ? -1
             : 0;
}

/* --- data: BF16 values k/64 in [-1, 1) from an LCG, the same in every run --------------------- */

static void fill(uint16_t *p, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    float f = (float)((int)(seed >> 25) - 64) / 64.0f;
    uint32_t u;
    memcpy(&u, &f, 4);
    p[i] = (uint16_t)(u >> 16); /* exact: at most 7 significant bits */
  }
}

typedef struct {
  CUdeviceptr w, x, y; /* W [OUT][IN], x [MAXTOK][IN], y [MAXTOK][OUT] */
} buffers;

/* Threads make their buffers at once: each fills a host array of its own. */
static int buffers_make(buffers *b, uint32_t wseed, uint32_t xseed) {
  size_t elems = (size_t)OUT * IN > (size_t)MAXTOK * IN ? (size_t)OUT * IN : (size_t)MAXTOK * IN;
  uint16_t *host = malloc(elems * 2);
  int bad = !host || CU(cuMemAlloc)(&b->w, (size_t)OUT * IN * 2) ||
            CU(cuMemAlloc)(&b->x, (size_t)MAXTOK * IN * 2) ||
            CU(cuMemAlloc)(&b->y, (size_t)MAXTOK * OUT * 2);
  if (!bad) {
    fill(host, (size_t)OUT * IN, wseed);
    bad = CU(cuMemcpyHtoD)(b->w, host, (size_t)OUT * IN * 2) != 0;
  }
  if (!bad) {
    fill(host, (size_t)MAXTOK * IN, xseed);
    bad = CU(cuMemcpyHtoD)(b->x, host, (size_t)MAXTOK * IN * 2) != 0;
  }
  free(host);
  return bad ? -1 : 0;
}

static void buffers_free(buffers *b) {
  CU(cuMemFree)(b->w), CU(cuMemFree)(b->x), CU(cuMemFree)(b->y);
}

/* y[tokens][OUT] = x W^T (F.linear's TN call), on `stream`; the result copied back into host. */
static int linear(cublasHandle_t h, CUstream stream, CUdeviceptr w, const buffers *b, int tokens,
                  uint16_t *host) {
  static const float one = 1.0f, zero = 0.0f;
  blas_set_stream(h, (cudaStream_t)stream);
  cublasStatus_t st =
      gemm_ex(h, CUBLAS_OP_T, CUBLAS_OP_N, OUT, tokens, IN, &one, (const void *)w, CUDA_R_16BF, IN,
              (const void *)b->x, CUDA_R_16BF, IN, &zero, (void *)b->y, CUDA_R_16BF, OUT,
              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  if (st != CUBLAS_STATUS_SUCCESS || CU(cuStreamSynchronize)(stream))
    return -1;
  return CU(cuMemcpyDtoH)(host, b->y, (size_t)tokens * OUT * 2) ? -1 : 0;
}

static void record(const uint16_t *y, int tokens) {
  if (out_file)
    fwrite(y, 2, (size_t)tokens * OUT, out_file);
}

static int tokens_of(int thread, int call) { return 1 + (call * 37 + thread * 11) % MAXTOK; }

/* --- threads -------------------------------------------------------------------------------- */

typedef struct {
  int index, failed;
  CUcontext ctx;
  CUdeviceptr shared_w;
  uint16_t *results; /* CALLS x MAXTOK x OUT */
  CUstream stream;   /* 0: the worker makes its own */
} job;

static void *worker(void *arg) {
  job *j = arg;
  CU(cuCtxSetCurrent)(j->ctx);
  cublasHandle_t h;
  CUstream s;
  buffers b;
  s = j->stream;
  if (blas_create(&h) || (!s && CU(cuStreamCreate)(&s, CU_STREAM_NON_BLOCKING)) ||
      buffers_make(&b, 1000u + (uint32_t)j->index, 2000u + (uint32_t)j->index)) {
    j->failed = 1;
    return NULL;
  }
  for (int c = 0; c < ncalls && !j->failed; c++)
    j->failed = linear(h, s, c % 2 ? j->shared_w : b.w, &b, tokens_of(j->index, c),
                       j->results + (size_t)c * MAXTOK * OUT) != 0;
  buffers_free(&b);
  blas_destroy(h);
  return NULL;
}

/* All jobs at once (threads), or one after another in this thread. */
static int run_jobs(job *jobs, int n, int at_once) {
  pthread_t th[NTHREADS];
  for (int i = 0; i < n; i++)
    if (at_once)
      pthread_create(&th[i], NULL, worker, &jobs[i]);
    else
      worker(&jobs[i]);
  int failed = 0;
  for (int i = 0; i < n; i++) {
    if (at_once)
      pthread_join(th[i], NULL);
    failed |= jobs[i].failed;
  }
  return failed;
}

static long compare_jobs(const job *a, const job *b, int n) {
  long differ = 0;
  for (int i = 0; i < n; i++)
    for (int c = 0; c < ncalls; c++) {
      size_t at = (size_t)c * MAXTOK * OUT, len = (size_t)tokens_of(i, c) * OUT * 2;
      differ += memcmp(a[i].results + at, b[i].results + at, len) != 0;
      record(a[i].results + at, tokens_of(i, c));
    }
  return differ;
}

static job *jobs_new(int n, CUcontext ctx, CUdeviceptr shared_w) {
  job *j = calloc((size_t)n, sizeof *j);
  for (int i = 0; i < n; i++)
    j[i] = (job){i, 0, ctx, shared_w, malloc((size_t)CALLS * MAXTOK * OUT * 2), 0};
  return j;
}

static CUcontext current(void) {
  CUcontext c;
  CU(cuDevicePrimaryCtxRetain)(&c, dev);
  CU(cuDevicePrimaryCtxRelease)(dev);
  return c;
}

static int mode_threads(void) {
  buffers shared;
  if (buffers_make(&shared, 7, 8))
    return 2;
  job *par = jobs_new(nthreads, current(), shared.w),
      *seq = jobs_new(nthreads, current(), shared.w);
  if (run_jobs(par, nthreads, 1) || run_jobs(seq, nthreads, 0))
    return printf("#info failed_calls 1\n"), 1;
  long differ = compare_jobs(par, seq, nthreads);
  printf("#info calls %d\n#info differing %ld\n", 2 * nthreads * ncalls, differ);
  return differ ? 1 : 0;
}

/* --- swap ------------------------------------------------------------------------------------- */

#define ROUNDS 6

static void jobs_free(job *j, int n) {
  for (int i = 0; i < n; i++)
    free(j[i].results);
  free(j);
}

/* The shared weight set to `host` between rounds: every call before it has ended, and the copy
 * has landed before any call after it starts (the streams do not block on the legacy stream). */
static int set_weight(CUdeviceptr w, const uint16_t *host) {
  return CU(cuCtxSynchronize)() || CU(cuMemcpyHtoD)(w, host, (size_t)OUT * IN * 2) ||
                 CU(cuCtxSynchronize)()
             ? -1
             : 0;
}

static int mode_swap(void) {
  buffers shared;
  uint16_t *v[2] = {malloc((size_t)OUT * IN * 2), malloc((size_t)OUT * IN * 2)};
  if (!v[0] || !v[1] || buffers_make(&shared, 7, 8))
    return 2;
  fill(v[0], (size_t)OUT * IN, 7); /* buffers_make's weight */
  fill(v[1], (size_t)OUT * IN, 9);
  job *seq[2];
  for (int k = 0; k < 2; k++) {
    seq[k] = jobs_new(nthreads, current(), shared.w);
    if (set_weight(shared.w, v[k]) || run_jobs(seq[k], nthreads, 0))
      return printf("#info failed_calls 1\n"), 1;
  }
  /* one stream a thread index for every round: the rounds start 96 threads, and a context keeps
   * scratch for 64 streams (a slot goes to a new stream only once its last call has ended, which
   * this case should not depend on) */
  CUstream streams[NTHREADS];
  for (int i = 0; i < nthreads; i++)
    if (CU(cuStreamCreate)(&streams[i], CU_STREAM_NON_BLOCKING))
      return 2;
  long differ = 0;
  for (int r = 0; r < ROUNDS; r++) {
    job *par = jobs_new(nthreads, current(), shared.w);
    for (int i = 0; i < nthreads; i++)
      par[i].stream = streams[i];
    if (set_weight(shared.w, v[r % 2]) || run_jobs(par, nthreads, 1)) /* a change each round */
      return printf("#info failed_calls 1\n"), 1;
    differ += compare_jobs(par, seq[r % 2], nthreads);
    jobs_free(par, nthreads);
  }
  printf("#info calls %d\n#info differing %ld\n", (2 + ROUNDS) * nthreads * ncalls, differ);
  jobs_free(seq[0], nthreads), jobs_free(seq[1], nthreads);
  free(v[0]), free(v[1]);
  return differ ? 1 : 0;
}

/* --- fork ------------------------------------------------------------------------------------- */

static volatile int stop_looping;

static void *looper(void *arg) {
  job *j = arg;
  cublasHandle_t h;
  CUstream s;
  buffers b;
  CU(cuCtxSetCurrent)(j->ctx);
  if (blas_create(&h) || CU(cuStreamCreate)(&s, CU_STREAM_NON_BLOCKING) || buffers_make(&b, 5, 6))
    return NULL;
  while (!stop_looping)
    linear(h, s, b.w, &b, 64, j->results);
  return NULL;
}

static int mode_fork(void) {
  /* a child forked before CUDA is used routes on its own */
  int pipefd[2];
  if (pipe(pipefd))
    return 2;
  fflush(stdout);
  pid_t early = fork();
  if (early == 0) {
    alarm(60);
    uint16_t *y = malloc((size_t)MAXTOK * OUT * 2);
    cublasHandle_t h;
    buffers b;
    int ok = cuda_up() == 0 && blas_create(&h) == 0 && buffers_make(&b, 3, 4) == 0 &&
             linear(h, NULL, b.w, &b, 100, y) == 0;
    if (ok && write(pipefd[1], y, (size_t)100 * OUT * 2) < 0)
      ok = 0;
    _exit(ok ? 0 : 1);
  }
  close(pipefd[1]);
  static uint16_t early_y[(size_t)100 * OUT];
  size_t got = 0;
  ssize_t n;
  while (got < sizeof early_y &&
         (n = read(pipefd[0], (char *)early_y + got, sizeof early_y - got)) > 0)
    got += (size_t)n;
  int status = 0;
  waitpid(early, &status, 0);
  printf("#info early_child_status %d\n",
         WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  if (cuda_up())
    return 2;
  cublasHandle_t h;
  buffers b;
  uint16_t *y = malloc((size_t)MAXTOK * OUT * 2);
  if (blas_create(&h) || buffers_make(&b, 3, 4) || linear(h, NULL, b.w, &b, 100, y))
    return 2;
  int same = got == sizeof early_y && !memcmp(y, early_y, sizeof early_y);
  printf("#info early_child_same %d\n", same);
  record(y, 100);
  /* children forked while another thread routes: each child's call comes back */
  job loop = {0, 0, current(), 0, malloc((size_t)MAXTOK * OUT * 2), 0};
  pthread_t th;
  pthread_create(&th, NULL, looper, &loop);
  int hung = 0;
  for (int round = 0; round < 10; round++) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      alarm(30); /* a hang is SIGALRM */
      linear(h, NULL, b.w, &b, 100, y);
      _exit(0);
    }
    waitpid(pid, &status, 0);
    hung += WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM;
  }
  stop_looping = 1;
  pthread_join(th, NULL);
  printf("#info hung_children %d\n", hung);
  uint16_t *again = malloc((size_t)MAXTOK * OUT * 2);
  int after = linear(h, NULL, b.w, &b, 100, again) == 0 && !memcmp(again, y, (size_t)100 * OUT * 2);
  printf("#info parent_after_forks_same %d\n", after);
  return hung || !same || !after ? 1 : 0;
}

/* --- reset and contexts ---------------------------------------------------------------------- */

/* The calls of one pass in the current context, into y (CALLS results). */
static int pass(uint16_t *y) {
  cublasHandle_t h;
  buffers b;
  if (blas_create(&h) || buffers_make(&b, 21, 22))
    return -1;
  int rc = 0;
  for (int c = 0; c < ncalls && !rc; c++)
    rc = linear(h, NULL, b.w, &b, tokens_of(0, c), y + (size_t)c * MAXTOK * OUT);
  buffers_free(&b);
  blas_destroy(h);
  return rc;
}

static long compare_passes(const uint16_t *a, const uint16_t *b) {
  long differ = 0;
  for (int c = 0; c < ncalls; c++) {
    size_t at = (size_t)c * MAXTOK * OUT;
    differ += memcmp(a + at, b + at, (size_t)tokens_of(0, c) * OUT * 2) != 0;
  }
  return differ;
}

static int mode_reset(void) {
  size_t bytes = (size_t)CALLS * MAXTOK * OUT * 2;
  uint16_t *first = malloc(bytes), *again = malloc(bytes);
  if (pass(first))
    return 2;
  for (int c = 0; c < ncalls; c++)
    record(first + (size_t)c * MAXTOK * OUT, tokens_of(0, c));
  long differ = 0;
  for (int round = 0; round < 3; round++) {
    CU(cuCtxSynchronize)();
    if (CU(cuDevicePrimaryCtxReset)(dev) || cuda_up() || pass(again))
      return printf("#info reset_round_failed %d\n", round), 1;
    differ += compare_passes(first, again);
  }
  for (int round = 0; round < 3; round++) {
    CUcontext c;
    if (CU(ctx_create)(&c, 0, dev) || pass(again))
      return printf("#info created_round_failed %d\n", round), 1;
    differ += compare_passes(first, again);
    CU(cuCtxDestroy)(c);
    cuda_up();
  }
  printf("#info differing %ld\n", differ);
  return differ ? 1 : 0;
}

static int mode_contexts(void) {
  size_t bytes = (size_t)CALLS * MAXTOK * OUT * 2;
  uint16_t *primary = malloc(bytes), *other = malloc(bytes);
  if (pass(primary))
    return 2;
  CUcontext a, b;
  if (CU(ctx_create)(&a, 0, dev) || CU(ctx_create)(&b, 0, dev))
    return 2;
  long differ = 0;
  for (int i = 0; i < 4; i++) {
    CU(cuCtxSetCurrent)(i % 2 ? b : a);
    if (pass(other))
      return printf("#info alternate_failed %d\n", i), 1;
    differ += compare_passes(primary, other);
  }
  /* both at once, a thread each, sharing nothing but the GPU */
  job jobs[2];
  CUdeviceptr shared[2];
  for (int i = 0; i < 2; i++) {
    buffers w;
    CU(cuCtxSetCurrent)(i ? b : a);
    if (buffers_make(&w, 7, 8))
      return 2;
    shared[i] = w.w;
    jobs[i] = (job){i, 0, i ? b : a, shared[i], malloc((size_t)CALLS * MAXTOK * OUT * 2), 0};
  }
  job seq[2] = {jobs[0], jobs[1]};
  for (int i = 0; i < 2; i++)
    seq[i].results = malloc((size_t)CALLS * MAXTOK * OUT * 2);
  if (run_jobs(jobs, 2, 1) || run_jobs(seq, 2, 0))
    return printf("#info threads_failed 1\n"), 1;
  differ += compare_jobs(jobs, seq, 2);
  printf("#info differing %ld\n", differ);
  return differ ? 1 : 0;
}

/* --- out of memory ---------------------------------------------------------------------------- */

/* Under MINITE_WEIGHT_CACHE=frozen: a weight first seen while memory is exhausted gets no cache
 * entry (out of memory: cuBLAS computes); once memory is back it gets one and is routed. */
static int mode_oom(void) {
  cublasHandle_t h;
  buffers b, fresh;
  if (blas_create(&h) || buffers_make(&b, 31, 32) || buffers_make(&fresh, 33, 34))
    return 2;
  uint16_t *y = malloc((size_t)MAXTOK * OUT * 2);
  if (linear(h, NULL, b.w, &b, 8, y)) /* cuBLAS's and the engine's set-up, before memory runs out */
    return 2;
  static CUdeviceptr hog[4096];
  int n = 0;
  /* down to 4 KB pieces: a kept weight (codes and scales, 1.7 MB here) must not fit what is left */
  for (size_t chunk = (size_t)1 << 30; chunk >= ((size_t)1 << 12) && n < 4096;)
    if (CU(cuMemAlloc)(&hog[n], chunk) == CUDA_SUCCESS)
      n++;
    else
      chunk /= 2;
  printf("#info hog_chunks %d\n", n);
  int failed = 0;
  for (int c = 0; c < 4; c++) {
    failed |= linear(h, NULL, fresh.w, &fresh, 150 + 40 * c, y) != 0;
    record(y, 150 + 40 * c);
  }
  while (n)
    CU(cuMemFree)(hog[--n]);
  for (int c = 0; c < 4; c++) {
    failed |= linear(h, NULL, fresh.w, &fresh, 150 + 40 * c, y) != 0;
    record(y, 150 + 40 * c);
  }
  printf("#info failed_calls %d\n", failed);
  return failed;
}

int main(int argc, char **argv) {
  if (argc != 3)
    return fprintf(stderr, "usage: reliability_app threads|swap|fork|reset|contexts|oom OUT\n"), 2;
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *t = getenv("RELIABILITY_THREADS"), *c = getenv("RELIABILITY_CALLS");
  if (t && atoi(t) > 0 && atoi(t) <= NTHREADS)
    nthreads = atoi(t);
  if (c && atoi(c) > 0 && atoi(c) <= CALLS)
    ncalls = atoi(c);
  if (load())
    return 2;
  if (strcmp(argv[1], "fork") && cuda_up())
    return fprintf(stderr, "no CUDA device\n"), 2;
  out_file = fopen(argv[2], "wb");
  int rc = !strcmp(argv[1], "threads")    ? mode_threads()
           : !strcmp(argv[1], "swap")     ? mode_swap()
           : !strcmp(argv[1], "fork")     ? mode_fork()
           : !strcmp(argv[1], "reset")    ? mode_reset()
           : !strcmp(argv[1], "contexts") ? mode_contexts()
           : !strcmp(argv[1], "oom")      ? mode_oom()
                                          : 2;
  if (out_file)
    fclose(out_file);
  return rc;
}
