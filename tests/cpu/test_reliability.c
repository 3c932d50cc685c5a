/* test_reliability.c — what a user meets when the shim runs inside real jobs, on the CPU: files
 * shared between processes, graph captures, threads, forks, contexts that die, allocations that
 * fail, odd inputs. Each test runs scenarios of this program in children under the preloaded shim
 * with the fake cuBLAS and the fake libcuda.so.1 of tests/cpu/fake (as test_shim_engine.c does),
 * some with a time limit (a hang is a failure, not a stuck `make test`).
 *
 *   log_file_appended_and_made_at_start MINITE_LOG_FILE: appended, made at start (also if empty)
 *   stats_file_shared_by_processes      MINITE_STATS: appended, whole records, every start kept
 *   stats_file_lost_before_first_call   its folder removed, or a link planted at its path, after
 *                                       the start: one warning, no file through the link, and no
 *                                       instrument reruns calls whose records have nowhere to go
 *   graph_memory_outlives_scratch       a captured call never uses memory a later call frees
 *   capture_after_warmup_elsewhere      warm-up on one stream, capture on another: routed
 *   capture_off_and_no_async            MINITE_CAPTURE=off; a driver without stream-ordered memory
 *   spec_from_fifo_or_stdin             a FIFO or a pipe as MINITE_SPEC: refused at once
 *   unusable_route_warned               route 15x17: one warning with the fix
 *   json_strings_and_long_values        UTF-8 roles, invalid bytes, long values, unknown escapes
 *   context_reset_and_recreate          cudaDeviceReset / a context re-created at one address
 *   two_contexts_one_device             two live contexts, from one thread and from two
 *   threads_route_at_once               16 threads on 16 streams, same and different weights
 *   threads_do_not_serialize            launches of different streams overlap
 *   fork_after_and_before_routing       a child forked after the engine ran; one forked before
 *   allocation_failure_everywhere       every allocation of a run failed in turn
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kernels/gemm_args.h"
#include "kernels/quant.h"
#include "tests/cpu/fake/fake.h"
#include "tests/cpu/fake/fake_cuda.h"
#include "tests/cpu/scenario.h"

#define OUT 256
#define IN 512
#define ROUTES "MINITE_ROUTE=256x512,1024x512"
#define S1 ((CUstream)(uintptr_t)0x1000)
#define S2 ((CUstream)(uintptr_t)0x2000)
#define NTHREADS 16

/* ======================================================================================== */
/* The child.                                                                               */
/* ======================================================================================== */

static fake_cuda_set_capturing_fn set_capturing;
static fake_cuda_ctx_create_fn ctx_create;
static fake_cuda_ctx_destroy_fn ctx_destroy;
static fake_cuda_device_reset_fn device_reset;
static fake_cuda_fail_alloc_fn fail_alloc;
static cublasHandle_t handle;

static int load_fakes(const char *build) {
  if (mt_t_load_fakes(build, &handle) != 0)
    return -1;
  void *cuda = mt_t_fakes.cuda;
  set_capturing = (fake_cuda_set_capturing_fn)mt_t_sym(cuda, "fake_cuda_set_capturing");
  ctx_create = (fake_cuda_ctx_create_fn)mt_t_sym(cuda, "fake_cuda_ctx_create");
  ctx_destroy = (fake_cuda_ctx_destroy_fn)mt_t_sym(cuda, "fake_cuda_ctx_destroy");
  device_reset = (fake_cuda_device_reset_fn)mt_t_sym(cuda, "fake_cuda_device_reset");
  fail_alloc = (fake_cuda_fail_alloc_fn)mt_t_sym(cuda, "fake_cuda_fail_alloc");
  if (!set_capturing || !ctx_create || !ctx_destroy || !device_reset || !fail_alloc)
    return printf("    child: a fake's knob is missing\n"), -1;
  return 0;
}

static mt_t_problem make(uint32_t *seed, int out, int tokens) {
  return mt_t_make(seed, out, IN, tokens);
}

/* Either routed or computed by cuBLAS bitwise: never a wrong result. Returns 1 when routed. */
static int correct_on(cublasHandle_t h, const mt_t_problem *p, CUstream s, int *ok) {
  uint16_t *want = mt_t_cublas_reference(h, p);
  *ok = mt_t_gemm_on(h, p, s) == CUBLAS_STATUS_SUCCESS;
  int routed = mt_t_all_marked(p);
  *ok &= routed || !memcmp(p->y, want, (size_t)p->out * p->tokens * 2);
  free(want);
  return routed;
}

/* --- scenarios ---------------------------------------------------------------------------- */

/* One routed call. */
static void scenario_one_call(void) {
  uint32_t seed = 1;
  mt_t_problem p = make(&seed, OUT, 8);
  CHECK(mt_t_routed_on(handle, &p, S1));
  mt_t_unmake(&p);
}

/* No GEMM at all: reads its stdin and says how many bytes it got. */
static void scenario_stdin(void) {
  char buf[256];
  long total = 0;
  ssize_t n;
  while ((n = read(0, buf, sizeof buf)) > 0)
    total += n;
  printf("#info stdin %ld\n", total);
}

static int first_launch(int from, const char *prefix) {
  for (int i = from; i < now(); i++)
    if (event(i)->kind == FAKE_EV_LAUNCH && !strncmp(event(i)->name, prefix, strlen(prefix)))
      return i;
  return -1;
}

/* A call captured on S1, then a larger call on S1 that grows (frees and reallocates) its
 * scratch. What the captured kernels use must outlive that growth: no later free covers the
 * activations' quantized rows of the captured call, and they are still device memory. */
static void scenario_graph_lifetime(void) {
  uint32_t seed = 2;
  mt_t_problem p = make(&seed, OUT, 8), big = make(&seed, OUT, 200);
  CHECK(mt_t_routed_on(handle, &p, S1)); /* warm-up on the capture's own stream */
  set_capturing(S1, 1);
  int t = now();
  CHECK(mt_t_routed_on(handle, &p, S1));
  set_capturing(S1, 0);
  int q = first_launch(t, "mt_quant_row_bf16");
  const mt_quant_params *qa = q >= 0 ? (const mt_quant_params *)event(q)->args : NULL;
  CHECK(qa != NULL);
  const char *xhat = qa ? (const char *)qa->xhat : NULL;
  t = now();
  CHECK(mt_t_routed_on(handle, &big, S1)); /* grows S1's scratch */
  for (int i = t; i < now() && xhat; i++) {
    const fake_cuda_event *e = event(i);
    if (e->kind == FAKE_EV_FREE || e->kind == FAKE_EV_FREE_ASYNC)
      CHECKF(!(xhat >= (const char *)(uintptr_t)e->ptr &&
               xhat < (const char *)(uintptr_t)e->ptr + e->bytes),
             "the captured call's memory was freed by a later call");
  }
  fake_cuda_is_device_fn is_device =
      (fake_cuda_is_device_fn)mt_t_sym(mt_t_fakes.cuda, "fake_cuda_is_device");
  CHECKF(xhat && is_device(xhat, 16), "the captured call's memory is gone");
  mt_t_check_clean();
  mt_t_unmake(&p), mt_t_unmake(&big);
}

/* PyTorch's documented pattern: warm-up on a side stream, capture on another. */
static void scenario_capture_elsewhere(void) {
  uint32_t seed = 3;
  mt_t_problem p = make(&seed, OUT, 8);
  CHECK(mt_t_routed_on(handle, &p, S2)); /* warm-up */
  set_capturing(S1, 1);
  CHECKF(mt_t_routed_on(handle, &p, S1), "a captured call fell back");
  set_capturing(S1, 0);
  mt_t_check_clean();
  mt_t_unmake(&p);
}

/* Captures with MINITE_CAPTURE=off, or a driver without stream-ordered memory: correct results
 * from cuBLAS, nothing allocated in the capture. */
static void scenario_capture_fallback(void) {
  uint32_t seed = 4;
  mt_t_problem p = make(&seed, OUT, 8);
  CHECK(mt_t_routed_on(handle, &p, S2));
  set_capturing(S1, 1);
  int ok, t = now();
  CHECK(!correct_on(handle, &p, S1, &ok) && ok);
  set_capturing(S1, 0);
  for (int i = t; i < now(); i++)
    CHECK(event(i)->kind != FAKE_EV_ALLOC && event(i)->kind != FAKE_EV_LAUNCH);
  mt_t_check_clean();
  mt_t_unmake(&p);
}

/* cudaDeviceReset (the primary context re-created at the same address) and a context
 * destroyed and another created at its address: fresh modules and memory, nothing stale. */
static void scenario_reset(void) {
  uint32_t seed = 5;
  mt_t_problem p = make(&seed, OUT, 8), big = make(&seed, OUT, 64);
  int t = now();
  CHECK(mt_t_routed_on(handle, &p, S1));
  const int modules = mt_t_count_kind(t, FAKE_EV_LOAD); /* the first call loads every kernel file */
  CHECK(modules > 0);
  device_reset();
  t = now();
  CHECKF(mt_t_routed_on(handle, &p, S1), "not routed after a device reset");
  CHECKF(mt_t_count_kind(t, FAKE_EV_LOAD) == modules, "%d modules loaded again",
         mt_t_count_kind(t, FAKE_EV_LOAD));
  CHECK(mt_t_routed_on(handle, &big, S1));
  CUcontext b = ctx_create(0);
  CHECK(b && mt_t_routed_on(handle, &p, S1));
  ctx_destroy(b);
  CUcontext c = ctx_create(1); /* at b's address */
  CHECK(c == b);
  t = now();
  CHECKF(mt_t_routed_on(handle, &p, S1), "not routed in a context re-created at the same address");
  CHECKF(mt_t_count_kind(t, FAKE_EV_LOAD) == modules, "%d modules loaded",
         mt_t_count_kind(t, FAKE_EV_LOAD));
  ctx_destroy(c);
  mt_t_fakes.set_current((CUcontext)NULL);
  int ok;
  CHECK(!correct_on(handle, &p, S1, &ok) && ok); /* no context: cuBLAS */
  mt_t_check_clean();
  mt_t_unmake(&p), mt_t_unmake(&big);
}

/* Two contexts alive on the one device: alternately from one thread, then each from its own
 * thread at once. Each gets its own modules and memory (a use across contexts counts stale). */
static void scenario_two_contexts(void) {
  uint32_t seed = 6;
  mt_t_problem p = make(&seed, OUT, 8);
  CUcontext a = NULL;
  CUresult (*get)(CUcontext *) =
      (CUresult(*)(CUcontext *))mt_t_sym(mt_t_fakes.cuda, "cuCtxGetCurrent");
  get(&a);
  CUcontext b = ctx_create(0);
  for (int i = 0; i < 4; i++) {
    mt_t_fakes.set_current(i % 2 ? b : a);
    CHECKF(mt_t_routed_on(handle, &p, S1), "call %d not routed", i);
  }
  mt_t_ctx_job jobs[2] = {{.ctx = a, .stream = S1, .out = OUT, .in = IN, .calls = 50, .seed = 7},
                          {.ctx = b, .stream = S2, .out = OUT, .in = IN, .calls = 50, .seed = 8}};
  mt_t_run_ctx_jobs(jobs, 2);
  CHECK(jobs[0].routed == 50 && jobs[1].routed == 50);
  mt_t_fakes.set_current(a);
  mt_t_check_clean();
  mt_t_unmake(&p);
}

typedef struct {
  int index, calls, routed, wrong, check; /* check: compare with cuBLAS (else routed only) */
  uint16_t *shared_w;
} thread_job;

/* A thread of its own stream and handle: calls of 1 to 40 tokens, every other one on the weight
 * all threads share. */
static void *thread_worker(void *arg) {
  thread_job *j = arg;
  cublasHandle_t h;
  mt_t_fakes.create_handle(&h);
  CUstream s = (CUstream)(uintptr_t)(0x10000 + 0x100 * j->index);
  uint32_t seed = 100 + (uint32_t)j->index;
  for (int i = 0; i < j->calls; i++) {
    mt_t_problem p = make(&seed, OUT, 1 + (i * 7 + j->index) % 40);
    if (i % 2) {
      free(p.w);
      p.w = j->shared_w;
    }
    int ok = 1, routed = j->check ? correct_on(h, &p, s, &ok) : mt_t_routed_on(h, &p, s);
    j->routed += routed;
    j->wrong += !ok;
    if (i % 2)
      p.w = NULL;
    mt_t_unmake(&p);
  }
  mt_t_fakes.destroy_handle(h);
  return NULL;
}

static void run_threads(int calls, int check) {
  uint32_t seed = 9;
  uint16_t *shared_w = mt_t_matrix(&seed, (size_t)OUT * IN);
  thread_job jobs[NTHREADS];
  pthread_t th[NTHREADS];
  for (int i = 0; i < NTHREADS; i++) {
    jobs[i] = (thread_job){i, calls, 0, 0, check, shared_w};
    pthread_create(&th[i], NULL, thread_worker, &jobs[i]);
  }
  int routed = 0, wrong = 0;
  for (int i = 0; i < NTHREADS; i++) {
    pthread_join(th[i], NULL);
    routed += jobs[i].routed, wrong += jobs[i].wrong;
  }
  CHECKF(wrong == 0, "%d wrong results", wrong);
  printf("#info routed %d\n", routed);
  free(shared_w);
}

/* 16 threads, each on its own stream and handle, routing at once. */
static void scenario_threads(void) {
  run_threads(40, 1);
  mt_t_check_clean();
}

/* The same with each launch taking time on the host (FAKE_CUDA_LAUNCH_US): the wall time. */
static void scenario_parallel(void) {
  struct timespec a, b;
  clock_gettime(CLOCK_MONOTONIC, &a);
  run_threads(4, 0);
  clock_gettime(CLOCK_MONOTONIC, &b);
  printf("#info wall_us %ld\n",
         (long)((b.tv_sec - a.tv_sec) * 1000000 + (b.tv_nsec - a.tv_nsec) / 1000));
  printf("#info launches %ld\n", mt_t_counts_now().launches);
}

static atomic_int stop_looping;

static void *looper(void *arg) {
  (void)arg;
  cublasHandle_t h;
  mt_t_fakes.create_handle(&h);
  uint32_t seed = 11;
  mt_t_problem p = make(&seed, OUT, 8);
  while (!atomic_load(&stop_looping))
    mt_t_routed_on(h, &p, S2);
  mt_t_unmake(&p);
  mt_t_fakes.destroy_handle(h);
  return NULL;
}

/* A fork while another thread routes: the child's routed calls go to cuBLAS (it cannot use the
 * parent's CUDA), with correct results and no hang; the parent routes on. */
static void scenario_fork_after(void) {
  uint32_t seed = 12;
  mt_t_problem p = make(&seed, OUT, 8);
  CHECK(mt_t_routed_on(handle, &p, S1));
  pthread_t th;
  pthread_create(&th, NULL, looper, NULL);
  for (int round = 0; round < 20; round++) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      alarm(10);
      int ok, routed = correct_on(handle, &p, S1, &ok);
      _exit(!routed && ok ? 0 : 1);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child of round %d: status %d", round,
           status);
  }
  atomic_store(&stop_looping, 1);
  pthread_join(th, NULL);
  CHECK(mt_t_routed_on(handle, &p, S1));
  mt_t_unmake(&p);
}

/* A child forked before the engine ran starts from nothing and routes. */
static void scenario_fork_before(void) {
  uint32_t seed = 13;
  mt_t_problem p = make(&seed, OUT, 8);
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    alarm(10);
    _exit(mt_t_routed_on(handle, &p, S1) ? 0 : 1);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: status %d", status);
  CHECK(mt_t_routed_on(handle, &p, S1));
  mt_t_unmake(&p);
}

/* What a test may do to the statistics file's path between the start and the first call
 * (MT_T_LATE): "rmdir" removes its folder, "link" plants a link to PATH.target there, "none"
 * nothing. Then 100 routed calls; prints the calls the fake cuBLAS saw (the shadow's reruns). */
static void scenario_stats_lost(void) {
  const char *path = getenv("MINITE_STATS"), *late = getenv("MT_T_LATE");
  char dir[PATH_MAX], target[PATH_MAX + 16];
  snprintf(dir, sizeof dir, "%s", path);
  *strrchr(dir, '/') = '\0';
  snprintf(target, sizeof target, "%s.target", path);
  if (!strcmp(late, "rmdir"))
    CHECK(rmdir(dir) == 0);
  else if (!strcmp(late, "link"))
    CHECK(symlink(target, path) == 0);
  uint32_t seed = 15;
  mt_t_problem p = make(&seed, OUT, 8);
  for (int i = 0; i < 100; i++)
    CHECK(mt_t_routed_on(handle, &p, S1));
  fake_record rec = {0};
  void (*last)(fake_record *) =
      (void (*)(fake_record *))mt_t_sym(mt_t_fakes.cublas, "fake_cublas_last");
  if (last)
    last(&rec);
  printf("#info cublas_calls %ld\n", rec.calls);
  mt_t_unmake(&p);
}

/* Every kind of call that allocates: a first call (scratch, modules' canary, the instruments),
 * growth, a second stream, a capture, frozen entries (MINITE_WEIGHT_CACHE=frozen). Each result is
 * right whether routed or not; prints the calls made and the allocations the run took. */
static void scenario_allocs(void) {
  uint32_t seed = 14;
  mt_t_problem small = make(&seed, OUT, 8), big = make(&seed, OUT, 300),
               other = make(&seed, OUT, 8);
  int calls = 0, routed = 0, wrong = 0, ok;
  const mt_t_problem *seq[] = {&small, &big, &other, &small, &big};
  const CUstream streams[] = {S1, S1, S2, S1, S2};
  for (int i = 0; i < 5; i++, calls++)
    routed += correct_on(handle, seq[i], streams[i], &ok), wrong += !ok;
  set_capturing(S1, 1);
  routed += correct_on(handle, &other, S1, &ok), wrong += !ok, calls++;
  set_capturing(S1, 0);
  routed += correct_on(handle, &small, S1, &ok), wrong += !ok, calls++;
  CHECKF(wrong == 0, "%d wrong results", wrong);
  fake_cuda_counts c = mt_t_counts_now();
  CHECKF(c.invalid == 0 && c.stale == 0 && c.during_capture == 0 && c.bad_frees == 0,
         "invalid %ld, stale %ld, during capture %ld, bad frees %ld", c.invalid, c.stale,
         c.during_capture, c.bad_frees);
  printf("#info calls %d\n#info routed %d\n#info allocs %ld\n", calls, routed, fail_alloc(0));
  mt_t_unmake(&small), mt_t_unmake(&big), mt_t_unmake(&other);
}

static const mt_t_scenario scenarios[] = {
    {"one_call", scenario_one_call},
    {"stdin", scenario_stdin},
    {"graph_lifetime", scenario_graph_lifetime},
    {"capture_elsewhere", scenario_capture_elsewhere},
    {"capture_fallback", scenario_capture_fallback},
    {"reset", scenario_reset},
    {"two_contexts", scenario_two_contexts},
    {"threads", scenario_threads},
    {"parallel", scenario_parallel},
    {"fork_after", scenario_fork_after},
    {"fork_before", scenario_fork_before},
    {"allocs", scenario_allocs},
    {"stats_lost", scenario_stats_lost},
};

/* ======================================================================================== */
/* The parent.                                                                              */
/* ======================================================================================== */

static void run_child(const char *name, const char *tag, const char *const env[], mt_t_child *r) {
  mt_t_run_child_with(name, tag, env, NULL, 60, r);
}

static long json_int(const char *s, const char *key) { return mt_t_json_int_in(s, NULL, key); }

static int exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* Every line of `text` is a whole JSON record: "{" ... "}". */
static int whole_lines(const char *text) {
  for (const char *line = text; line && *line;) {
    const char *nl = strchr(line, '\n');
    if (!nl || line[0] != '{' || nl[-1] != '}')
      return 0;
    line = nl + 1;
  }
  return 1;
}

/* MINITE_LOG_FILE: appended, and made at start, so that no line ever opens it late. */
static void log_file_appended_and_made_at_start(void) {
  char log[PATH_MAX + 64], env_log[PATH_MAX + 80];
  snprintf(log, sizeof log, "%s/shared.log", mt_t_paths.tmp);
  snprintf(env_log, sizeof env_log, "MINITE_LOG_FILE=%s", log);
  const char *env[] = {env_log, "MINITE_LOG_LEVEL=INFO", NULL};
  mt_t_child a, b;
  run_child("one_call", "log_a", env, &a);
  run_child("one_call", "log_b", env, &b);
  mt_t_check_child("one_call", &a);
  char *text = mt_t_read_file(log, NULL);
  char pa[64], pb[64];
  snprintf(pa, sizeof pa, ":%d:", (int)json_int(a.stats, "pid"));
  snprintf(pb, sizeof pb, ":%d:", (int)json_int(b.stats, "pid"));
  CHECKF(text && strstr(text, pa) && strstr(text, pb),
         "the log holds the lines of both processes (%s, %s): %.300s", pa, pb, text ? text : "");
  free(text);
  mt_t_child_free(&a), mt_t_child_free(&b);
  /* a process that logs nothing (WARN, nothing to warn about) has its file all the same, empty */
  char dir[PATH_MAX + 64], env_quiet[PATH_MAX + 128], quiet[PATH_MAX + 128];
  snprintf(dir, sizeof dir, "%s/quiet", mt_t_paths.tmp);
  mkdir(dir, 0755);
  snprintf(env_quiet, sizeof env_quiet, "MINITE_LOG_FILE=%s/log.%%p", dir);
  const char *env2[] = {env_quiet, NULL};
  mt_t_child c;
  run_child("one_call", "log_quiet", env2, &c);
  mt_t_check_child("one_call", &c);
  snprintf(quiet, sizeof quiet, "%s/log.%ld", dir, json_int(c.stats, "pid"));
  long len = -1;
  free(mt_t_read_file(quiet, &len));
  CHECKF(len == 0, "%s: %ld bytes from a process that logged nothing", quiet, len);
  mt_t_child_free(&c);
}

/* The statistics file's folder removed, or a link planted at its path, between the start and the
 * first call: one warning at that call, no file made through the link, no statistics, and the
 * instruments off (no shadow reruns through cuBLAS whose results would be thrown away). Without
 * either, the shadow reruns each call. */
static void stats_file_lost_before_first_call(void) {
  static const char *const lates[] = {"MT_T_LATE=none", "MT_T_LATE=rmdir", "MT_T_LATE=link"};
  for (int i = 0; i < 3; i++) {
    char dir[PATH_MAX + 64], stats_env[PATH_MAX + 96], target[PATH_MAX + 96], tag[32];
    snprintf(dir, sizeof dir, "%s/late%d", mt_t_paths.tmp, i);
    CHECK(mkdir(dir, 0755) == 0);
    snprintf(stats_env, sizeof stats_env, "MINITE_STATS=%s/s.jsonl", dir);
    snprintf(target, sizeof target, "%s/s.jsonl.target", dir);
    snprintf(tag, sizeof tag, "stats_lost%d", i);
    const char *env[] = {stats_env, "MINITE_SHADOW=1", lates[i], NULL};
    mt_t_child r;
    run_child("stats_lost", tag, env, &r);
    mt_t_check_child("stats_lost", &r);
    CHECKF(mt_t_info(&r, "cublas_calls") == (i ? 0 : 100), "%s: %ld calls reran through cuBLAS",
           lates[i], mt_t_info(&r, "cublas_calls"));
    if (i == 0) {
      CHECKF(r.err && !r.err[0], "%s", r.err ? r.err : "");
      mt_t_child_free(&r);
      continue;
    }
    const char *w = r.err ? strstr(r.err, " minite WARN MINITE_STATS=") : NULL;
    CHECKF(w && strstr(w, i == 2 ? "is a symbolic link" : "does not exist") &&
               strstr(w, "no statistics and no instruments for this process") &&
               !strstr(w + 1, " minite WARN "),
           "%s: %s", lates[i], r.err ? r.err : "");
    CHECKF(!exists(target), "a file was made through the link: %s", target);
    mt_t_child_free(&r);
  }
}

/* Sequential and concurrent processes on one statistics path. */
static void stats_file_shared_by_processes(void) {
  char path[PATH_MAX + 64], env_stats[PATH_MAX + 80];
  snprintf(path, sizeof path, "%s/shared.jsonl", mt_t_paths.tmp);
  snprintf(env_stats, sizeof env_stats, "MINITE_STATS=%s", path);
  const char *env[] = {env_stats, "MINITE_DIGEST=1", NULL};
  mt_t_child r[2];
  for (int i = 0; i < 2; i++) {
    run_child("one_call", i ? "stats_b" : "stats_a", env, &r[i]);
    mt_t_check_child("one_call", &r[i]);
    mt_t_child_free(&r[i]);
  }
  char *text = mt_t_read_file(path, NULL);
  CHECKF(mt_t_count_of(text, "\"event\": \"start\"") == 2 &&
             mt_t_count_of(text, "\"event\": \"summary\"") == 2,
         "two processes, %d start and %d summary records",
         mt_t_count_of(text, "\"event\": \"start\""),
         mt_t_count_of(text, "\"event\": \"summary\""));
  free(text);
  /* four at once, each with digest records: every line whole, every start kept */
  unlink(path);
  pid_t pids[4];
  for (int i = 0; i < 4; i++) {
    fflush(stdout);
    if ((pids[i] = fork()) == 0) {
      mt_t_child c;
      char tag[32];
      snprintf(tag, sizeof tag, "stats_at_once%d", i);
      run_child("threads", tag, env, &c);
      _exit(c.status);
    }
  }
  for (int i = 0; i < 4; i++) {
    int status = 0;
    waitpid(pids[i], &status, 0);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d: status %d", i, status);
  }
  text = mt_t_read_file(path, NULL);
  CHECKF(mt_t_count_of(text, "\"event\": \"start\"") == 4 &&
             mt_t_count_of(text, "\"event\": \"summary\"") == 4,
         "%d start, %d summary records", mt_t_count_of(text, "\"event\": \"start\""),
         mt_t_count_of(text, "\"event\": \"summary\""));
  CHECKF(mt_t_count_of(text, "\"event\": \"digest\"") > 1000, "%d digests",
         mt_t_count_of(text, "\"event\": \"digest\""));
  CHECK(whole_lines(text));
  free(text);
  /* the shared file is one that tools/minite-compare reads (its start records agree) */
  const char *py = getenv("PYTHON") ? getenv("PYTHON") : "python3";
  char cmd[4 * PATH_MAX];
  snprintf(cmd, sizeof cmd, "%.200s tools/minite-compare %s %s > /dev/null 2>&1", py, path, path);
  int st = system(cmd);
  CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "minite-compare on the shared file: status %d", st);
}

/* A captured call never uses memory a later call frees (scenario_graph_lifetime). */
static void graph_memory_outlives_scratch(void) {
  mt_t_child r;
  run_child("graph_lifetime", "graph_lifetime", NULL, &r);
  mt_t_check_child("graph_lifetime", &r);
  CHECK(json_int(r.summary, "routed") == 3 && json_int(r.summary, "captured_calls") == 1);
  mt_t_child_free(&r);
}

/* Warm-up on one stream, capture on another: routed (scenario_capture_elsewhere). */
static void capture_after_warmup_elsewhere(void) {
  mt_t_child r;
  run_child("capture_elsewhere", "capture_elsewhere", NULL, &r);
  mt_t_check_child("capture_elsewhere", &r);
  CHECKF(json_int(r.summary, "routed") == 2 && mt_t_fallback(r.summary, "capture") == 0, "%s",
         r.summary ? r.summary : "no summary");
  mt_t_child_free(&r);
}

static void capture_off_and_no_async(void) {
  const char *off[] = {"MINITE_CAPTURE=off", NULL};
  const char *no_async[] = {"FAKE_CUDA_NO_ASYNC=1", NULL};
  const char *const *envs[] = {off, no_async};
  for (int i = 0; i < 2; i++) {
    mt_t_child r;
    run_child("capture_fallback", i ? "capture_no_async" : "capture_off", envs[i], &r);
    mt_t_check_child("capture_fallback", &r);
    CHECK(json_int(r.summary, "routed") == 1 && mt_t_fallback(r.summary, "capture") == 1);
    int warnings = mt_t_count_of(r.err, " minite WARN ");
    CHECKF(i ? warnings == 1 && strstr(r.err, "cuMemAllocAsync") : warnings == 0, "%s", r.err);
    mt_t_child_free(&r);
  }
}

/* A FIFO with no writer, /dev/stdin on a pipe: refused at once, with the fix; the
 * program's input stays its own. `minite spec check` refuses the FIFO as well. */
static void spec_from_fifo_or_stdin(void) {
  char fifo[PATH_MAX + 64], env_spec[PATH_MAX + 80];
  snprintf(fifo, sizeof fifo, "%s/spec.fifo", mt_t_paths.tmp);
  CHECK(mkfifo(fifo, 0644) == 0);
  snprintf(env_spec, sizeof env_spec, "MINITE_SPEC=%s", fifo);
  const char *env[] = {env_spec, NULL};
  mt_t_child r;
  mt_t_run_child_with("one_call", "fifo", env, NULL, 20, &r);
  CHECKF(r.status != 128 + SIGKILL, "MINITE_SPEC=FIFO hangs the program");
  CHECKF(r.err && strstr(r.err, "is a FIFO or pipe, not a spec file") && strstr(r.err, "inert"),
         "stderr: %s", r.err ? r.err : "");
  mt_t_child_free(&r);
  const char *stdin_env[] = {"MINITE_SPEC=/dev/stdin", NULL};
  mt_t_run_child_with("stdin", "spec_stdin", stdin_env, "the program's own input\n", 20, &r);
  CHECKF(r.status == 0 && mt_t_info(&r, "stdin") == 24, "status %d, the program read %ld bytes",
         r.status, mt_t_info(&r, "stdin"));
  CHECKF(r.err && strstr(r.err, "not a spec file"), "stderr: %s", r.err ? r.err : "");
  mt_t_child_free(&r);
  char cmd[3 * PATH_MAX];
  snprintf(cmd, sizeof cmd, "timeout 20 %s/minite spec check %s 2>&1", mt_t_paths.build, fifo);
  FILE *p = popen(cmd, "r");
  char out[1024] = "";
  size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
  out[n] = '\0';
  int status = p ? pclose(p) : -1;
  CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 2 && strstr(out, "is a FIFO or pipe"),
         "minite spec check FIFO: status %d: %s", status, out);
}

/* Route 15x17: one warning with the fix. */
static void unusable_route_warned(void) {
  const char *env[] = {"MINITE_ROUTE=256x512,15x17,64x40", NULL};
  mt_t_child r;
  run_child("one_call", "unusable_route", env, &r);
  mt_t_check_child("one_call", &r);
  CHECKF(mt_t_count_of(r.err, " minite WARN ") == 2 &&
             strstr(r.err, "route 15x17 can never be routed: its in-dimension 17 is not a multiple "
                           "of 16") &&
             strstr(r.err, "route 64x40") && strstr(r.err, "remove it"),
         "stderr: %s", r.err ? r.err : "");
  CHECK(r.stats && strstr(r.stats, "\"15x17\"")); /* kept: part of the fingerprint */
  mt_t_child_free(&r);
  char cmd[PATH_MAX + 96];
  snprintf(cmd, sizeof cmd, "%s/minite spec show nvfp4-row --route 15x17 2>&1 >/dev/null",
           mt_t_paths.build);
  FILE *p = popen(cmd, "r");
  char out[1024] = "";
  size_t n = p ? fread(out, 1, sizeof out - 1, p) : 0;
  out[n] = '\0';
  CHECKF(p && pclose(p) == 0 && strstr(out, "warning: route 15x17 can never be routed"), "%s", out);
}

/* UTF-8 roles, invalid bytes, long values, unknown escapes. */
static void json_strings_and_long_values(void) {
  const char *utf8[] = {"MINITE_ROLE=caf\xc3\xa9 \xe6\xa0\xb7", NULL};
  const char *bad[] = {"MINITE_ROLE=a\xff\x01z\xc3", NULL};
  mt_t_child r;
  run_child("one_call", "role_utf8", utf8, &r);
  CHECKF(r.stats && strstr(r.stats, "\"role\": \"caf\xc3\xa9 \xe6\xa0\xb7\""), "%.300s",
         r.stats ? r.stats : "");
  mt_t_child_free(&r);
  run_child("one_call", "role_bad", bad, &r);
  CHECKF(r.stats && strstr(r.stats, "\"role\": \"a\\ufffd\\u0001z\\ufffd\""), "%.300s",
         r.stats ? r.stats : "");
  mt_t_child_free(&r);
  /* a long value: the message keeps its fix */
  static char long_spec[3200];
  snprintf(long_spec, sizeof long_spec, "MINITE_SPEC=%.100s/", mt_t_paths.tmp);
  size_t used = strlen(long_spec);
  while (used < sizeof long_spec - 20)
    used += (size_t)snprintf(long_spec + used, sizeof long_spec - used, "dir/");
  strcat(long_spec, "x.spec");
  const char *long_env[] = {long_spec, NULL};
  run_child("one_call", "long_value", long_env, &r);
  CHECKF(r.err && strstr(r.err, "lists every error)") && strstr(r.err, "the shim is inert"),
         "the message lost its fix: %.3000s", r.err ? r.err : "");
  mt_t_child_free(&r);
  /* an unknown escape in a template: said at start, kept as written */
  char env_stats[PATH_MAX + 80];
  snprintf(env_stats, sizeof env_stats, "MINITE_STATS=%s/s.%%q.jsonl", mt_t_paths.tmp);
  const char *esc[] = {env_stats, NULL};
  run_child("one_call", "escape", esc, &r);
  char kept[PATH_MAX + 64];
  snprintf(kept, sizeof kept, "%s/s.%%q.jsonl", mt_t_paths.tmp);
  CHECKF(r.err && strstr(r.err, "'%q' is not a known escape") && exists(kept), "%s",
         r.err ? r.err : "");
  mt_t_child_free(&r);
}

/* cudaDeviceReset and a context re-created at one address (scenario_reset); also with kept
 * weights, whose entries a dropped context must forget. */
static void context_reset_and_recreate(void) {
  const char *frozen[] = {"MINITE_WEIGHT_CACHE=frozen", NULL};
  const char *const *envs[] = {NULL, frozen};
  for (int i = 0; i < 2; i++) {
    mt_t_child r;
    const char *tag = i ? "reset_frozen" : "reset";
    run_child("reset", tag, envs[i], &r);
    mt_t_check_child(tag, &r);
    const char *reasons_ok =
        r.summary ? strstr(r.summary, "\"fallbacks\": {\"no engine\": 1}") : NULL;
    CHECKF(json_int(r.summary, "routed") == 5 && reasons_ok, "%s: %s", tag,
           r.summary ? r.summary : "");
    /* the call without a context */
    CHECKF(mt_t_count_of(r.err, " minite WARN ") == 1, "%s: %s", tag, r.err);
    mt_t_child_free(&r);
  }
}

static void two_contexts_one_device(void) {
  mt_t_child r;
  run_child("two_contexts", "two_contexts", NULL, &r);
  mt_t_check_child("two_contexts", &r);
  CHECK(json_int(r.summary, "routed") == 104);
  mt_t_child_free(&r);
}

/* Exploratory: 16 threads, requantize and frozen, digests of every row on. */
static void threads_route_at_once(void) {
  const char *req[] = {"MINITE_DIGEST=1", NULL};
  const char *frz[] = {"MINITE_DIGEST=1", "MINITE_WEIGHT_CACHE=frozen", NULL};
  const char *const *envs[] = {req, frz};
  for (int i = 0; i < 2; i++) {
    mt_t_child r;
    run_child("threads", i ? "threads_frozen" : "threads", envs[i], &r);
    mt_t_check_child("threads", &r);
    long routed = mt_t_info(&r, "routed"), rows = 0;
    for (int t = 0; t < NTHREADS; t++)
      for (int c = 0; c < 40; c++)
        rows += 1 + (c * 7 + t) % 40;
    CHECKF(routed == NTHREADS * 40 && json_int(r.summary, "routed") == routed, "routed %ld / %ld",
           routed, json_int(r.summary, "routed"));
    const char *dg = r.summary ? strstr(r.summary, "\"digests\": ") : NULL;
    CHECKF(dg && json_int(dg, "written") == rows && json_int(dg, "dropped") == 0 &&
               mt_t_count_of(r.stats, "\"event\": \"digest\"") == rows,
           "%ld rows, digests: %.200s", rows, dg ? dg : "none");
    CHECK(whole_lines(r.stats));
    mt_t_child_free(&r);
  }
}

/* The instruments and the scratch do not serialize threads of different streams: with 2 ms per
 * launch on the host, 16 threads take far less than the launches one after another. */
static void threads_do_not_serialize(void) {
  const char *env[] = {"MINITE_DIGEST=1", "FAKE_CUDA_LAUNCH_US=2000", NULL};
  mt_t_child r;
  run_child("parallel", "parallel", env, &r);
  mt_t_check_child("parallel", &r);
  long wall = mt_t_info(&r, "wall_us"), serial = mt_t_info(&r, "launches") * 2000;
  CHECKF(wall > 0 && serial > 0 && wall < serial / 3, "%ld us for %ld us of launches", wall,
         serial);
  mt_t_child_free(&r);
}

static void fork_after_and_before_routing(void) {
  mt_t_child r;
  mt_t_run_child_with("fork_after", "fork_after", NULL, NULL, 60, &r);
  mt_t_check_child("fork_after", &r);
  CHECKF(r.summary && json_int(r.summary, "passthrough") == 0, "the parent's counts: %s",
         r.summary ? r.summary : "none");
  CHECKF(mt_t_count_of(r.err, " minite WARN ") == 20 && strstr(r.err, "forked"),
         "one warning per child: %s", r.err ? r.err : "");
  mt_t_child_free(&r);
  mt_t_run_child_with("fork_before", "fork_before", NULL, NULL, 60, &r);
  mt_t_check_child("fork_before", &r);
  CHECKF(r.err && !r.err[0], "%s", r.err ? r.err : "");
  mt_t_child_free(&r);
}

/* Exploratory: the run of scenario_allocs with its nth allocation failing, for every n; frozen
 * and requantize, instruments on. Every result right (the child checks), every call counted. */
static void allocation_failure_everywhere(void) {
  for (int frozen = 0; frozen < 2; frozen++) {
    const char *base[] = {"MINITE_DIGEST=1", "MINITE_SHADOW=1", "MINITE_PROBE=1",
                          frozen ? "MINITE_WEIGHT_CACHE=frozen" : "MINITE_WEIGHT_CACHE=requantize",
                          NULL};
    mt_t_child r;
    run_child("allocs", "allocs", base, &r);
    mt_t_check_child("allocs", &r);
    long allocs = mt_t_info(&r, "allocs"), calls = mt_t_info(&r, "calls");
    CHECKF(allocs >= 6 && mt_t_info(&r, "routed") == calls, "%ld allocations, %ld of %ld routed",
           allocs, mt_t_info(&r, "routed"), calls);
    mt_t_child_free(&r);
    for (long n = 1; n <= allocs; n++) {
      char fail[64], tag[64];
      snprintf(fail, sizeof fail, "FAKE_CUDA_FAIL_ALLOC=%ld", n);
      snprintf(tag, sizeof tag, "allocs_%d_%ld", frozen, n);
      const char *env[] = {base[0], base[1], base[2], base[3], fail, NULL};
      run_child("allocs", tag, env, &r);
      mt_t_check_child(tag, &r);
      long routed = json_int(r.summary, "routed"), passed = json_int(r.summary, "passthrough");
      CHECKF(routed + passed == calls && routed == mt_t_info(&r, "routed"),
             "%s: %ld routed + %ld passed through, %ld calls", tag, routed, passed, calls);
      CHECKF(mt_t_count_of(r.err, " minite WARN ") <= 2, "%s: %s", tag, r.err);
      mt_t_child_free(&r);
    }
  }
}

static void tests(void) {
  RUN(log_file_appended_and_made_at_start);
  RUN(stats_file_shared_by_processes);
  RUN(stats_file_lost_before_first_call);
  RUN(graph_memory_outlives_scratch);
  RUN(capture_after_warmup_elsewhere);
  RUN(capture_off_and_no_async);
  RUN(spec_from_fifo_or_stdin);
  RUN(unusable_route_warned);
  RUN(json_strings_and_long_values);
  RUN(context_reset_and_recreate);
  RUN(two_contexts_one_device);
  RUN(threads_route_at_once);
  RUN(threads_do_not_serialize);
  RUN(fork_after_and_before_routing);
  RUN(allocation_failure_everywhere);
}

int main(int argc, char **argv) {
  return mt_t_scenario_main(argc, argv, "/tmp/mt_reliability.XXXXXX", ROUTES, load_fakes, scenarios,
                            sizeof scenarios / sizeof scenarios[0], tests);
}
