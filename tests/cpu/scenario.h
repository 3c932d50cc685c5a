/* scenario.h — what the CPU tests that run each scenario in a child process under the preloaded
 * shim share (tests/cpu/test_shim_engine.c, tests/cpu/test_shim_instr.c): random BF16 matrices,
 * symbols of the fakes, the child (a clean environment with nvfp4-row, the routes and statistics,
 * the instruments off unless a scenario asks; its stdout, stderr and statistics file kept), reading
 * what it wrote, and the main that dispatches "child NAME BUILD" or runs the parent's tests. The
 * children of test_reliability.c, test_multi_device.c and test_fork.c also share the loading of
 * the fakes and the GEMM problems they route or hand to cuBLAS (mt_t_load_fakes, mt_t_problem). */
#ifndef MT_TESTS_SCENARIO_H
#define MT_TESTS_SCENARIO_H

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kernels/instr.h"
#include "tests/cpu/fake/fake.h"
#include "tests/cpu/fake/fake_cuda.h"
#include "tests/cpu/preload.h"
#include "tests/harness.h"

#define MT_T_UNUSED __attribute__((unused))

extern char **environ;

/* Values k/64 in [-1, 1): exact in BF16; the generator (an LCG in *seed) is the same everywhere. */
MT_T_UNUSED static uint16_t *mt_t_matrix(uint32_t *seed, size_t elems) {
  uint16_t *p = aligned_alloc(64, (elems * 2 + 63) / 64 * 64);
  for (size_t i = 0; i < elems; i++) {
    *seed = *seed * 1664525u + 1013904223u;
    p[i] = fake_float_to_bf16((float)((int)(*seed >> 25) - 64) / 64.0f);
  }
  return p;
}

MT_T_UNUSED static void *mt_t_sym(void *lib, const char *name) {
  void *p = dlsym(lib, name);
  if (!p)
    printf("    child: %s not found\n", name);
  return p;
}

/* The descriptor functions of the cuBLASLt in `lib` (the fake's), for building Lt calls. */
typedef struct {
  __typeof__(&cublasLtMatmulDescCreate) desc_create;
  __typeof__(&cublasLtMatmulDescSetAttribute) desc_set;
  __typeof__(&cublasLtMatmulDescDestroy) desc_destroy;
  __typeof__(&cublasLtMatrixLayoutCreate) layout_create;
  __typeof__(&cublasLtMatrixLayoutSetAttribute) layout_set;
  __typeof__(&cublasLtMatrixLayoutDestroy) layout_destroy;
} mt_t_lt_api;

MT_T_UNUSED static mt_t_lt_api mt_t_lt(void *lib) {
  mt_t_lt_api a;
  void *p;
#define MT_T_LT_SYM(field, name) (p = mt_t_sym(lib, name), memcpy(&a.field, &p, sizeof p))
  MT_T_LT_SYM(desc_create, "cublasLtMatmulDescCreate");
  MT_T_LT_SYM(desc_set, "cublasLtMatmulDescSetAttribute");
  MT_T_LT_SYM(desc_destroy, "cublasLtMatmulDescDestroy");
  MT_T_LT_SYM(layout_create, "cublasLtMatrixLayoutCreate");
  MT_T_LT_SYM(layout_set, "cublasLtMatrixLayoutSetAttribute");
  MT_T_LT_SYM(layout_destroy, "cublasLtMatrixLayoutDestroy");
#undef MT_T_LT_SYM
  return a;
}

/* The fake libcuda's event log (set by the child's loader): how many events so far, and one. */
static fake_cuda_events_fn cuda_events;

MT_T_UNUSED static int now(void) {
  const fake_cuda_event *e;
  return cuda_events(&e);
}

MT_T_UNUSED static const fake_cuda_event *event(int i) {
  const fake_cuda_event *e;
  cuda_events(&e);
  return &e[i];
}

/* The index of the nth (0-based) launch since event `from` of the kernel `name` (prefix: of a
 * kernel whose name starts with it), or -1. */
MT_T_UNUSED static int mt_t_find_launch(int from, const char *name, int prefix, int nth) {
  for (int i = from; i < now(); i++) {
    const fake_cuda_event *e = event(i);
    if (e->kind == FAKE_EV_LAUNCH &&
        !(prefix ? strncmp(e->name, name, strlen(name)) : strcmp(e->name, name)) && nth-- == 0)
      return i;
  }
  return -1;
}

/* BUILD/REL opened with RTLD_LOCAL (a fake's own symbols stay out of the global scope, where the
 * shim's hooks must be found first); NULL, said on stdout, when it fails. */
MT_T_UNUSED static void *mt_t_open(const char *build, const char *rel) {
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/%s", build, rel);
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib)
    printf("    child: %s\n", dlerror());
  return lib;
}

/* The same with RTLD_GLOBAL: its symbols join the global scope, after those loaded before. */
MT_T_UNUSED static void *mt_t_open_global(const char *build, const char *rel) {
  char path[PATH_MAX + 64];
  snprintf(path, sizeof path, "%s/%s", build, rel);
  void *lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
  if (!lib)
    printf("    child: %s\n", dlerror());
  return lib;
}

/* ---- the child's fakes and GEMMs (test_reliability.c, test_multi_device.c, test_fork.c) ---- */

/* The fakes' libraries and the symbols every such child uses (set by mt_t_load_fakes). */
MT_T_UNUSED static struct {
  void *cuda, *cublas;
  __typeof__(&cublasGemmEx) hook_gemm, fake_gemm; /* the shim's hook; the fake's own GEMM */
  __typeof__(&cublasCreate_v2) create_handle;
  __typeof__(&cublasDestroy_v2) destroy_handle;
  __typeof__(&cublasSetStream_v2) set_stream;
  fake_cuda_counts_fn counts;
  CUresult (*set_current)(CUcontext);
} mt_t_fakes;

/* Open the fake libcuda, libcublas and libcublasLt of BUILD, find the common symbols (the hook
 * must be the shim's, not the fake's) and create *h; -1, said on stdout, when any step fails. */
MT_T_UNUSED static int mt_t_load_fakes(const char *build, cublasHandle_t *h) {
  if (!(mt_t_fakes.cuda = mt_t_open(build, "tests/cpu/fake/driver/libcuda.so.1")) ||
      !(mt_t_fakes.cublas = mt_t_open(build, "tests/cpu/fake/libcublas.so.13")) ||
      !mt_t_open(build, "tests/cpu/fake/libcublasLt.so.13"))
    return -1;
  void *cuda = mt_t_fakes.cuda, *cublas = mt_t_fakes.cublas;
  cuda_events = (fake_cuda_events_fn)mt_t_sym(cuda, "fake_cuda_events");
  mt_t_fakes.counts = (fake_cuda_counts_fn)mt_t_sym(cuda, "fake_cuda_counts_get");
  mt_t_fakes.set_current = (CUresult(*)(CUcontext))mt_t_sym(cuda, "cuCtxSetCurrent");
  mt_t_fakes.hook_gemm = (__typeof__(&cublasGemmEx))dlsym(RTLD_DEFAULT, "cublasGemmEx");
  mt_t_fakes.fake_gemm = (__typeof__(&cublasGemmEx))mt_t_sym(cublas, "fake_own_cublasGemmEx");
  mt_t_fakes.create_handle = (__typeof__(&cublasCreate_v2))mt_t_sym(cublas, "cublasCreate_v2");
  mt_t_fakes.destroy_handle = (__typeof__(&cublasDestroy_v2))mt_t_sym(cublas, "cublasDestroy_v2");
  mt_t_fakes.set_stream = (__typeof__(&cublasSetStream_v2))mt_t_sym(cublas, "cublasSetStream_v2");
  if (!cuda_events || !mt_t_fakes.counts || !mt_t_fakes.set_current || !mt_t_fakes.hook_gemm ||
      mt_t_fakes.hook_gemm == mt_t_fakes.fake_gemm || !mt_t_fakes.create_handle ||
      !mt_t_fakes.destroy_handle || !mt_t_fakes.set_stream)
    return printf("    child: a hook or a fake's knob is missing\n"), -1;
  return mt_t_fakes.create_handle(h) == CUBLAS_STATUS_SUCCESS ? 0 : -1;
}

/* A BF16 GEMM as PyTorch's linear layers call it: Y (out x tokens) = W X with the weight W
 * (out x in) transposed, routed when out x in is one of the routes. */
typedef struct {
  int out, in, tokens;
  uint16_t *w, *x, *y;
} mt_t_problem;

MT_T_UNUSED static mt_t_problem mt_t_make(uint32_t *seed, int out, int in, int tokens) {
  mt_t_problem p = {out, in, tokens, NULL, NULL, NULL};
  p.w = mt_t_matrix(seed, (size_t)out * in); /* in this order: the seed's sequence */
  p.x = mt_t_matrix(seed, (size_t)tokens * in);
  p.y = mt_t_matrix(seed, (size_t)out * tokens);
  return p;
}

MT_T_UNUSED static void mt_t_unmake(mt_t_problem *p) { free(p->w), free(p->x), free(p->y); }

MT_T_UNUSED static cublasStatus_t mt_t_gemm_into(__typeof__(&cublasGemmEx) gemm, cublasHandle_t h,
                                                 const mt_t_problem *p, uint16_t *y) {
  static const float one = 1.0f, zero = 0.0f;
  return gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, p->out, p->tokens, p->in, &one, p->w, CUDA_R_16BF, p->in,
              p->x, CUDA_R_16BF, p->in, &zero, y, CUDA_R_16BF, p->out, CUBLAS_COMPUTE_32F,
              CUBLAS_GEMM_DEFAULT);
}

/* The call through the shim's hook, on stream s. */
MT_T_UNUSED static cublasStatus_t mt_t_gemm_on(cublasHandle_t h, const mt_t_problem *p,
                                               CUstream s) {
  mt_t_fakes.set_stream(h, (cudaStream_t)s);
  return mt_t_gemm_into(mt_t_fakes.hook_gemm, h, p, p->y);
}

/* Every element of the output marked by the fake GEMM kernel: the engine's. */
MT_T_UNUSED static int mt_t_all_marked(const mt_t_problem *p) {
  for (size_t i = 0; i < (size_t)p->out * p->tokens; i++)
    if (p->y[i] != FAKE_CUDA_MARK)
      return 0;
  return 1;
}

/* Routed: the output is exactly the engine's (the shadow instrument may call cuBLAS too, into its
 * own scratch). Returns 1 when so. */
MT_T_UNUSED static int mt_t_routed_on(cublasHandle_t h, const mt_t_problem *p, CUstream s) {
  return mt_t_gemm_on(h, p, s) == CUBLAS_STATUS_SUCCESS && mt_t_all_marked(p);
}

/* One thread's share of a test of contexts used at once: `calls` calls of an out x in problem of
 * 8 tokens (drawn from seed) in context ctx on `stream`, through a handle of its own; `routed`
 * counts those routed. mt_t_run_ctx_jobs runs each job (at most 8) in a thread of its own, all at
 * once. */
typedef struct {
  CUcontext ctx;
  CUstream stream;
  int out, in, calls, routed;
  uint32_t seed;
} mt_t_ctx_job;

MT_T_UNUSED static void *mt_t_ctx_worker(void *arg) {
  mt_t_ctx_job *j = arg;
  mt_t_fakes.set_current(j->ctx);
  cublasHandle_t h;
  mt_t_fakes.create_handle(&h);
  mt_t_problem p = mt_t_make(&j->seed, j->out, j->in, 8);
  for (int i = 0; i < j->calls; i++)
    j->routed += mt_t_routed_on(h, &p, j->stream);
  mt_t_unmake(&p);
  mt_t_fakes.destroy_handle(h);
  return NULL;
}

MT_T_UNUSED static void mt_t_run_ctx_jobs(mt_t_ctx_job *jobs, int n) {
  pthread_t th[8];
  for (int i = 0; i < n && i < 8; i++)
    pthread_create(&th[i], NULL, mt_t_ctx_worker, &jobs[i]);
  for (int i = 0; i < n && i < 8; i++)
    pthread_join(th[i], NULL);
}

/* What the fake cuBLAS computes for p without the shim (malloc'ed). */
MT_T_UNUSED static uint16_t *mt_t_cublas_reference(cublasHandle_t h, const mt_t_problem *p) {
  size_t n = (size_t)p->out * p->tokens;
  uint16_t *y = malloc(n * 2);
  memcpy(y, p->y, n * 2);
  mt_t_gemm_into(mt_t_fakes.fake_gemm, h, p, y);
  return y;
}

/* Computed by cuBLAS, bit for bit what the fake cuBLAS gives without the shim. 1 when so. */
MT_T_UNUSED static int mt_t_cublas_on(cublasHandle_t h, const mt_t_problem *p, CUstream s) {
  uint16_t *want = mt_t_cublas_reference(h, p);
  int ok = mt_t_gemm_on(h, p, s) == CUBLAS_STATUS_SUCCESS &&
           !memcmp(p->y, want, (size_t)p->out * p->tokens * 2);
  free(want);
  return ok;
}

/* The fake driver's counters (fake_cuda.h) as they are now. */
MT_T_UNUSED static fake_cuda_counts mt_t_counts_now(void) {
  fake_cuda_counts c;
  mt_t_fakes.counts(&c);
  return c;
}

/* The fake driver saw nothing wrong: no invalid or stale handle, no allocation, load, sync or
 * read-back while a stream captured, no launch across contexts, no bad free. */
MT_T_UNUSED static void mt_t_check_clean(void) {
  fake_cuda_counts c = mt_t_counts_now();
  CHECKF(c.invalid == 0 && c.stale == 0 && c.during_capture == 0 && c.cross_context == 0 &&
             c.bad_frees == 0,
         "invalid %ld, stale %ld, during capture %ld, cross-context %ld, bad frees %ld", c.invalid,
         c.stale, c.during_capture, c.cross_context, c.bad_frees);
}

/* Events of `kind` since `from`. */
MT_T_UNUSED static int mt_t_count_kind(int from, int kind) {
  int n = 0;
  for (int i = from; i < now(); i++)
    n += event(i)->kind == kind;
  return n;
}

/* ---- the parent ------------------------------------------------------------------------ */

static struct {
  char self[PATH_MAX], build[PATH_MAX], tmp[PATH_MAX], preload[2 * PATH_MAX];
  const char *routes; /* "MINITE_ROUTE=..." */
} mt_t_paths;

typedef struct {
  int status;
  char *out, *err, *stats; /* the child's stdout, stderr and statistics file (NULL if none) */
  const char *summary;     /* its summary record, inside stats */
  char path[PATH_MAX + 64];
} mt_t_child;

/* Variables of the caller's environment that would change a child's behaviour. */
static int mt_t_scrubbed(const char *e) {
  static const char *const prefixes[] = {"MINITE_",       "LD_PRELOAD=",     "FAKE_",
                                         "RANK=",         "MT_BATCHES=",     "MT_REVERSE=",
                                         "LOCAL_RANK=",   "WORLD_SIZE=",     "OMPI_COMM_WORLD_",
                                         "PMI_",          "SLURM_PROCID=",   "SLURM_LOCALID=",
                                         "SLURM_NTASKS=", "MPI_LOCALRANKID="};
  for (size_t i = 0; i < sizeof prefixes / sizeof prefixes[0]; i++)
    if (!strncmp(e, prefixes[i], strlen(prefixes[i])))
      return 1;
  return 0;
}

static void mt_t_child_env(const char *stats, const char *const env[]) {
  for (char **e = environ; *e;) {
    if (mt_t_scrubbed(*e)) {
      char var[256];
      snprintf(var, sizeof var, "%.*s", (int)(strchr(*e, '=') - *e), *e);
      unsetenv(var);
    } else {
      e++;
    }
  }
  setenv("MINITE_SPEC", "nvfp4-row", 1);
  putenv((char *)mt_t_paths.routes);
  setenv("MINITE_STATS", stats, 1);
  setenv("MINITE_SHADOW", "0", 1); /* the instruments add launches: on only where asked */
  setenv("MINITE_PROBE", "0", 1);
  setenv("MINITE_DIGEST", "0", 1);
  for (int i = 0; env && env[i]; i++)
    putenv((char *)env[i]);
  setenv("LD_PRELOAD", mt_t_paths.preload, 1);
}

/* The wait status of child `pid`, killed first when it runs past `limit` seconds (> 0). */
MT_T_UNUSED static int mt_t_wait(pid_t pid, int limit) {
  int status = 0;
  for (int waited = 0; limit > 0; waited++) {
    if (waitpid(pid, &status, WNOHANG) == pid)
      return status;
    if (waited == limit * 100) {
      kill(pid, SIGKILL);
      break;
    }
    nanosleep(&(struct timespec){0, 10000000}, NULL);
  }
  waitpid(pid, &status, 0);
  return status;
}

/* Run scenario `name` in a child under the shim, its files named after `tag`, with `env`
 * ("K=V", NULL-terminated) applied after the defaults of mt_t_child_env, `input` on its stdin (a
 * pipe; NULL: empty), and, when `limit` > 0, killed after `limit` seconds (status
 * 128 + SIGKILL). */
MT_T_UNUSED static void mt_t_run_child_with(const char *name, const char *tag,
                                            const char *const env[], const char *input, int limit,
                                            mt_t_child *r) {
  char out[PATH_MAX + 64], err[PATH_MAX + 64];
  snprintf(out, sizeof out, "%s/%s.out", mt_t_paths.tmp, tag);
  snprintf(err, sizeof err, "%s/%s.err", mt_t_paths.tmp, tag);
  snprintf(r->path, sizeof r->path, "%s/%s.jsonl", mt_t_paths.tmp, tag);
  int in[2];
  if (pipe(in) != 0)
    in[0] = in[1] = -1;
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    mt_t_child_env(r->path, env);
    dup2(in[0], 0);
    close(in[1]);
    int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    fd = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    execl(mt_t_paths.self, mt_t_paths.self, "child", name, mt_t_paths.build, (char *)NULL);
    _exit(127);
  }
  close(in[0]);
  if (input && write(in[1], input, strlen(input)) < 0)
    printf("    could not write the child's stdin\n");
  close(in[1]);
  int status = mt_t_wait(pid, limit);
  r->status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r->out = mt_t_read_file(out, NULL);
  r->err = mt_t_read_file(err, NULL);
  r->stats = mt_t_read_file(r->path, NULL);
  r->summary = r->stats ? strstr(r->stats, "{\"event\": \"summary\"") : NULL;
}

/* The same with no input and no time limit. */
MT_T_UNUSED static void mt_t_run_child(const char *name, const char *tag, const char *const env[],
                                       mt_t_child *r) {
  mt_t_run_child_with(name, tag, env, NULL, 0, r);
}

MT_T_UNUSED static void mt_t_child_free(mt_t_child *r) {
  free(r->out), free(r->err), free(r->stats);
}

/* Of the child's "#info key K" lines (*keys of them), those whose K is the key of a digest record
 * in its statistics file. */
MT_T_UNUSED static int mt_t_keys_in_file(const mt_t_child *r, int *keys) {
  int found = 0;
  *keys = 0;
  for (const char *p = r->out; p && (p = strstr(p, "#info key ")); p++) {
    char key[17] = {0}, pat[40];
    memcpy(key, p + 10, 16);
    snprintf(pat, sizeof pat, "\"key\": \"%s\"", key);
    ++*keys;
    found += r->stats && strstr(r->stats, pat) != NULL;
  }
  return found;
}

/* weight_sum (kernels/instr.h) of n rows of k (k % 16 == 0) at row stride ldw, written from its
 * definition rather than as the twin walks it: each 128-byte line L (row-major, the last of a row
 * short) whose run R = L / MT_WHASH_RUN is the one its group g = R / MT_SAMPLE_STEP samples,
 * R % MT_SAMPLE_STEP = (g * 0x9E3779B97F4A7C15 >> 40) % MT_SAMPLE_STEP (kernels/whash.h), adds its
 * pieces, numbered row-major. */
MT_T_UNUSED static uint64_t mt_t_weight_sum(const uint16_t *w, size_t ldw, int n, int k) {
  const uint64_t line_elems = 64, lines_per_row = ((uint64_t)k + line_elems - 1) / line_elems;
  uint64_t sum = 0;
  for (uint64_t line = 0; line < (uint64_t)n * lines_per_row; line++) {
    const uint64_t run = line / MT_WHASH_RUN, g = run / MT_SAMPLE_STEP;
    if (run % MT_SAMPLE_STEP != (uint32_t)((g * 0x9E3779B97F4A7C15ull) >> 40) % MT_SAMPLE_STEP)
      continue;
    const uint64_t r = line / lines_per_row, col = line % lines_per_row * line_elems;
    const uint64_t elems = (uint64_t)k - col < line_elems ? (uint64_t)k - col : line_elems;
    sum += mt_instr_content_sum(w + r * ldw + col, elems * 2, (r * (uint64_t)k + col) / 8);
  }
  return sum;
}

/* The child passed: exit 0 and nothing on stdout but "#info" lines (its failed checks otherwise,
 * shown here). */
MT_T_UNUSED static void mt_t_check_child(const char *name, const mt_t_child *r) {
  int only_info = 1;
  for (const char *line = r->out; line && *line;
       line = strchr(line, '\n') ? strchr(line, '\n') + 1 : "")
    if (strncmp(line, "#info ", 6))
      only_info = 0;
  if (!only_info || r->status)
    printf("    child %s (exit %d):\n%s    stderr: %.2000s\n", name, r->status,
           r->out ? r->out : "", r->err ? r->err : "");
  CHECKF(r->status == 0 && only_info, "scenario %s failed", name);
}

/* The integer after "key": " in s, after the first occurrence of `within` when it is not NULL;
 * -1 when absent. */
MT_T_UNUSED static long mt_t_json_int_in(const char *s, const char *within, const char *key) {
  const char *w = s && within ? strstr(s, within) : s;
  char pat[128];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  const char *p = w ? strstr(w, pat) : NULL;
  return p ? strtol(p + strlen(pat), NULL, 10) : -1;
}

/* The child's "#info KEY N" line: N, or -1. */
MT_T_UNUSED static long mt_t_info(const mt_t_child *r, const char *key) {
  char pat[96];
  snprintf(pat, sizeof pat, "#info %s ", key);
  const char *p = r->out ? strstr(r->out, pat) : NULL;
  return p ? strtol(p + strlen(pat), NULL, 10) : -1;
}

/* ---- main ------------------------------------------------------------------------------ */

typedef struct {
  const char *name;
  void (*fn)(void);
} mt_t_scenario;

static int mt_t_child_main(const char *name, const char *build, int (*load)(const char *),
                           const mt_t_scenario *sc, size_t n) {
  if (load(build) != 0)
    return 3;
  for (size_t i = 0; i < n; i++)
    if (!strcmp(sc[i].name, name)) {
      sc[i].fn();
      fflush(stdout);
      return mt_t_cur_failures ? 1 : 0;
    }
  printf("    child: no scenario %s\n", name);
  return 3;
}

/* "child NAME BUILD": load the fakes from BUILD and run scenario NAME. Otherwise the parent: the
 * paths (MT_BUILD or build; a temporary folder from `tmpl`), then `tests`, then the folder is
 * removed unless a test failed. */
MT_T_UNUSED static int mt_t_scenario_main(int argc, char **argv, const char *tmpl,
                                          const char *routes, int (*load)(const char *),
                                          const mt_t_scenario *sc, size_t n, void (*tests)(void)) {
  if (argc == 4 && !strcmp(argv[1], "child"))
    return mt_t_child_main(argv[2], argv[3], load, sc, n);
  const char *b = getenv("MT_BUILD") ? getenv("MT_BUILD") : "build";
  if (!realpath(b, mt_t_paths.build) || !realpath("/proc/self/exe", mt_t_paths.self)) {
    printf("no build directory %s\n", b);
    return 1;
  }
  mt_t_paths.routes = routes;
  mt_t_preload_value(mt_t_paths.build, mt_t_paths.preload, sizeof mt_t_paths.preload);
  snprintf(mt_t_paths.tmp, sizeof mt_t_paths.tmp, "%s", tmpl);
  if (!mkdtemp(mt_t_paths.tmp)) {
    printf("mkdtemp: %s\n", strerror(errno));
    return 1;
  }
  tests();
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", mt_t_paths.tmp);
  if (!mt_t_failed && system(cmd) != 0)
    printf("could not remove %s\n", mt_t_paths.tmp);
  return mt_test_done();
}

#endif
