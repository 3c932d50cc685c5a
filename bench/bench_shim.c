/* bench_shim.c — what the shim adds to one cuBLAS call, in ns, measured on the CPU against the
 * fake libcublas/libcublasLt of the tests (a benchmark, not a test).
 *
 *   make bench-shim
 *
 * Method: this program re-runs itself in child processes, without the shim and with
 * LD_PRELOAD=libminite.so in each mode below. Each child times a tight loop of calls of a tiny
 * GEMM (the fake does almost nothing, so the loop measures the call path), REPS times, and
 * reports the median ns per call. All modes run in turn, ROUNDS times over, so that a noisy
 * moment of a shared machine hits every mode alike; a mode's figure is the median of its rounds,
 * and the shim's cost is that minus the figure without the shim.
 */
#include <dlfcn.h>
#include <errno.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cuda.h>

#include "shim/cuda_api.h"
#include "tests/cpu/fake/fake_cuda.h"

#define CALLS 200000 /* cublasGemmEx; cublasLtMatmul (16x1x16 in the fake) takes a tenth */
#define REPS 21
#define ROUNDS 5

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* A Triton-style module image for the fake driver (tests/cpu/fake/fake_cuda.c: an ELF file naming
 * its kernel's section) and its function `name`, through the driver at `lib`. */
static CUfunction fake_kernel(void *lib, const char *name) {
  static char img[4][1024];
  static int n;
  char *p = img[n++ % 4], text[64];
  const int len = snprintf(text, sizeof text, ".text.%s", name);
  fake_cuda_elf(p, sizeof img[0], text, (size_t)len + 1);
  /* through the global scope, as Triton's helper's PLT binds them: the shim's hooks when
   * preloaded */
  __typeof__(&cuModuleLoadData) load = (__typeof__(load))dlsym(RTLD_DEFAULT, "cuModuleLoadData");
  __typeof__(&cuModuleGetFunction) get =
      (__typeof__(get))dlsym(RTLD_DEFAULT, "cuModuleGetFunction");
  if (!load)
    load = (__typeof__(load))dlsym(lib, "cuModuleLoadData");
  if (!get)
    get = (__typeof__(get))dlsym(lib, "cuModuleGetFunction");
  CUmodule m;
  CUfunction f = NULL;
  if (!load || !get || load(&m, p) != CUDA_SUCCESS || get(&f, m, name) != CUDA_SUCCESS)
    return NULL;
  return f;
}

/* The child of the launch modes: median ns per cuLaunchKernelEx of a kernel the door does not
 * decode, looked up as Triton's launcher does (dlopen + dlsym on the driver); with `door`, after a
 * fused_moe_kernel was recorded (the launches then probe the door's table). */
static int launch_child(int door) {
  char self[4096], path[4200];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0)
    return 1;
  self[len] = '\0';
  snprintf(path, sizeof path, "%s/../tests/cpu/fake/driver/libcuda.so.1", dirname(self));
  void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  __typeof__(&cuLaunchKernelEx) launch =
      lib ? (__typeof__(launch))dlsym(lib, "cuLaunchKernelEx") : NULL;
  if (!launch || (door && !fake_kernel(lib, "fused_moe_kernel")))
    return 1;
  CUfunction f = fake_kernel(lib, "other_kernel");
  int arg = 0;
  void *params[] = {&arg};
  const CUlaunchConfig cfg = {
      .gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 32, .blockDimY = 1, .blockDimZ = 1};
  double per_call[REPS];
  for (int r = 0; r < REPS; r++) {
    double t0 = now_ns();
    for (int i = 0; i < CALLS; i++)
      launch(&cfg, f, params, NULL);
    per_call[r] = (now_ns() - t0) / CALLS;
  }
  qsort(per_call, REPS, sizeof per_call[0], cmp_double);
  printf("%.2f\n", per_call[REPS / 2]);
  return 0;
}

/* The child: median ns per call of the entry point named by argv. */
static int child(const char *entry) {
  if (!strncmp(entry, "launch", 6))
    return launch_child(!strcmp(entry, "launch_door"));
  cublasHandle_t h;
  cublasLtHandle_t lth;
  cublasCreate_v2(&h);
  cublasLtCreate(&lth);
  uint16_t a = 0x3f80, b = 0x3f80, c = 0; /* BF16 1.0 */
  const float one = 1, zero = 0;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  int32_t t = CUBLAS_OP_T;
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t);
  cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, 16, 16, 16);
  cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, 16, 1, 16);
  cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, 16, 1, 16);
  static _Alignas(16) uint16_t A[256], B[16], C[16];
  int lt = !strcmp(entry, "lt");
  int calls = lt ? CALLS / 10 : CALLS;
  double per_call[REPS];
  for (int r = 0; r < REPS; r++) {
    double t0 = now_ns();
    for (int i = 0; i < calls; i++) {
      if (lt)
        cublasLtMatmul(lth, desc, &one, A, la, B, lb, &zero, C, lc, C, lc, NULL, NULL, 0, NULL);
      else
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 1, 1, 1, &one, &a, CUDA_R_16BF, 1, &b,
                     CUDA_R_16BF, 1, &zero, &c, CUDA_R_16BF, 1, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
    }
    per_call[r] = (now_ns() - t0) / calls;
  }
  qsort(per_call, REPS, sizeof per_call[0], cmp_double);
  printf("%.2f\n", per_call[REPS / 2]);
  return 0;
}

typedef struct {
  const char *name, *entry;
  const char *env[4]; /* set in the child; NULL-terminated */
  int shim;
} mode;

/* Run one mode in a child; its median ns per call. */
static double run_mode(const char *self, const char *lib, const mode *m) {
  int fds[2];
  if (pipe(fds) != 0)
    return -1;
  pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    unsetenv("MINITE_SPEC"), unsetenv("MINITE_STATS"), unsetenv("MINITE_ROUTE");
    unsetenv("LD_PRELOAD");
    for (int i = 0; m->env[i]; i++)
      putenv((char *)m->env[i]);
    if (m->shim)
      setenv("LD_PRELOAD", lib, 1);
    execl(self, self, "--child", m->entry, (char *)NULL);
    _exit(127);
  }
  close(fds[1]);
  char buf[64] = {0};
  ssize_t n = read(fds[0], buf, sizeof buf - 1);
  close(fds[0]);
  int status;
  waitpid(pid, &status, 0);
  return n > 0 && WIFEXITED(status) && !WEXITSTATUS(status) ? atof(buf) : -1;
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "--child"))
    return child(argv[2]);
  if (argc != 2) {
    fprintf(stderr, "usage: %s BUILD/libminite.so\n", argv[0]);
    return 2;
  }
  char stats[64];
  snprintf(stats, sizeof stats, "MINITE_STATS=/tmp/mt_bench_%ld.jsonl", (long)getpid());
  const mode modes[] = {
      {"cublasGemmEx, no shim", "gemm", {NULL}, 0},
      {"cublasGemmEx, inert (MINITE_SPEC unset)", "gemm", {NULL}, 1},
      {"cublasGemmEx, pass-through, no stats", "gemm", {"MINITE_SPEC=bf16", NULL}, 1},
      {"cublasGemmEx, pass-through + stats", "gemm", {"MINITE_SPEC=bf16", stats, NULL}, 1},
      {"cublasGemmEx, routed shape (bf16) + stats",
       "gemm",
       {"MINITE_SPEC=bf16", stats, "MINITE_ROUTE=1x1", NULL},
       1},
      {"cublasLtMatmul, no shim", "lt", {NULL}, 0},
      {"cublasLtMatmul, pass-through + stats", "lt", {"MINITE_SPEC=bf16", stats, NULL}, 1},
      {"cublasLtMatmul, routed shape (bf16) + stats",
       "lt",
       {"MINITE_SPEC=bf16", stats, "MINITE_ROUTE=16x16", NULL},
       1},
      {"cuLaunchKernelEx, no shim", "launch", {NULL}, 0},
      {"cuLaunchKernelEx, inert", "launch", {NULL}, 1},
      {"cuLaunchKernelEx, active, no door kernel", "launch", {"MINITE_SPEC=bf16", NULL}, 1},
      {"cuLaunchKernelEx, active, door table probed", "launch_door", {"MINITE_SPEC=bf16", NULL}, 1},
  };
  printf(
      "bench_shim: ns per call added by libminite.so, against the fake cuBLAS of the tests\n"
      "method: per mode, the median of %d rounds; a round is one process timing %d repetitions\n"
      "of a loop of %d calls of a 1x1x1 cublasGemmEx (%d of a 16x1x16 cublasLtMatmul; %d\n"
      "cuLaunchKernelEx of the fake driver's kernels, found as Triton finds it) and reporting the\n"
      "median; modes alternate within each round. added = mode - the entry's no-shim mode\n\n",
      ROUNDS, REPS, CALLS, CALLS / 10, CALLS);
  enum { NMODES = sizeof modes / sizeof modes[0] };
  double ns[NMODES][ROUNDS];
  for (int round = 0; round < ROUNDS; round++)
    for (int i = 0; i < NMODES; i++)
      ns[i][round] = run_mode("/proc/self/exe", argv[1], &modes[i]);
  double base = 0;
  for (int i = 0; i < NMODES; i++) {
    qsort(ns[i], ROUNDS, sizeof ns[i][0], cmp_double);
    double median = ns[i][ROUNDS / 2];
    if (ns[i][0] < 0) {
      printf("%-46s failed\n", modes[i].name);
      continue;
    }
    if (!modes[i].shim)
      base = median, printf("%s%-46s %8.1f ns per call\n", i ? "\n" : "", modes[i].name, median);
    else
      printf("%-46s %8.1f ns per call, %+7.1f ns added\n", modes[i].name, median, median - base);
  }
  char path[64];
  snprintf(path, sizeof path, "%s", stats + strlen("MINITE_STATS="));
  unlink(path);
  printf("\ntargets: inert < 50 ns, pass-through with statistics < 300 ns; a launch the door does\n"
         "not decode: one lookup\n");
  return 0;
}
