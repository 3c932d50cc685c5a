/* test_shim_dl.c — the shim's dlsym and dlvsym (shim/dl.h): programs that dlopen cuBLAS and look
 * its entry points up by name, as JAX/XLA's CUDA plugin does, get the hooks; nothing else about
 * dynamic loading changes.
 *
 * The program is its own child (`test_shim_dl child SCENARIO BUILD`, tests/cpu/scenario.h), under
 * LD_PRELOAD=libminite.so; it links no cuBLAS and dlopens the fakes of tests/cpu/fake with
 * RTLD_LOCAL. Scenarios:
 *   lookups     dlsym and dlvsym of every hooked name on the fake's handles give the hook (the
 *               shim's global definition), calls through them reach the fake with the caller's
 *               arguments and the fake's results, and are seen (the parent reads the census);
 *               other names and missing ones answer as the loader does
 *   two_copies  cuBLAS 13 and a second copy (the CUDA 12 fake): the first copy's lookups give the
 *               hooks, the second copy's give its own functions, unhooked, with one warning
 * And tests/cpu/fake/next_app under the shim: dlsym(RTLD_NEXT) and dlvsym(RTLD_NEXT) from one
 * library find the next one's definition, and dlsym(RTLD_DEFAULT) from a library loaded RTLD_LOCAL
 * finds a symbol of its own dependency, as without the shim: the loader still sees the caller.
 */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/cpu/fake/fake.h"
#include "tests/cpu/scenario.h"

#define ROUTES "MINITE_ROUTE=64x32"

static const char *build_dir;
static const float one = 1.0f, zero = 0.0f;
static uint32_t seed = 99;

static int remember_build(const char *build) {
  build_dir = build;
  return 0;
}

static const char *const hooked[] = {"cublasGemmEx",
                                     "cublasGemmEx_64",
                                     "cublasGemmStridedBatchedEx",
                                     "cublasGemmStridedBatchedEx_64",
                                     "cublasGemmBatchedEx",
                                     "cublasGemmBatchedEx_64",
                                     "cublasGemmGroupedBatchedEx",
                                     "cublasGemmGroupedBatchedEx_64",
                                     NULL};

/* A TN GEMM of the routed shape 64x32 through `gemm`, and the same through the fake's own
 * function: equal bits, the arguments received as passed. */
static void gemm_through(void *lib, __typeof__(&cublasGemmEx) gemm) {
  __typeof__(&cublasCreate_v2) create = (__typeof__(create))mt_t_sym(lib, "cublasCreate_v2");
  __typeof__(&cublasGemmEx) own = (__typeof__(own))mt_t_sym(lib, "fake_own_cublasGemmEx");
  void (*last)(fake_record *) = (void (*)(fake_record *))mt_t_sym(lib, "fake_cublas_last");
  cublasHandle_t h;
  if (!create || !own || !last || create(&h)) {
    CHECKF(0, "%s", "a fixture could not be loaded");
    return;
  }
  uint16_t *w = mt_t_matrix(&seed, 64 * 32), *x = mt_t_matrix(&seed, 32 * 5);
  uint16_t *y = mt_t_matrix(&seed, 64 * 5), *want = mt_t_matrix(&seed, 64 * 5);
  CHECK(own(h, CUBLAS_OP_T, CUBLAS_OP_N, 64, 5, 32, &one, w, CUDA_R_16BF, 32, x, CUDA_R_16BF, 32,
            &zero, want, CUDA_R_16BF, 64, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == 0);
  CHECK(gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, 64, 5, 32, &one, w, CUDA_R_16BF, 32, x, CUDA_R_16BF, 32,
             &zero, y, CUDA_R_16BF, 64, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == 0);
  fake_record r;
  last(&r);
  CHECK(r.nargs == 19 && r.args[7] == (uint64_t)(uintptr_t)w &&
        r.args[14] == (uint64_t)(uintptr_t)y);
  CHECKF(!memcmp(y, want, 64 * 5 * 2), "the result differs from the fake's own");
  free(w), free(x), free(y), free(want);
}

static void scenario_lookups(void) {
  void *lib = mt_t_open(build_dir, "tests/cpu/fake/libcublas.so.13");
  void *lt = mt_t_open(build_dir, "tests/cpu/fake/libcublasLt.so.13");
  if (!lib || !lt) {
    CHECKF(0, "%s", "a fixture could not be loaded");
    return;
  }
  for (int i = 0; hooked[i]; i++) {
    char own_name[96];
    snprintf(own_name, sizeof own_name, "fake_own_%s", hooked[i]);
    void *hook = dlsym(RTLD_DEFAULT, hooked[i]), *got = dlsym(lib, hooked[i]);
    CHECKF(hook && got == hook, "%s: dlsym gave %p, the hook is %p", hooked[i], got, hook);
    CHECKF(dlvsym(lib, hooked[i], "libcublas.so.13") == hook, "%s through dlvsym", hooked[i]);
    CHECKF(dlsym(lib, own_name) && got != dlsym(lib, own_name), "%s is the fake's", hooked[i]);
  }
  void *lt_hook = dlsym(RTLD_DEFAULT, "cublasLtMatmul");
  CHECK(lt_hook && dlsym(lt, "cublasLtMatmul") == lt_hook);
  CHECK(dlsym(lt, "cublasLtMatmul") != dlsym(lt, "fake_own_cublasLtMatmul"));
  /* a name the shim does not hook is the library's own; a missing one is NULL with an error */
  void *create = dlsym(lib, "cublasCreate_v2");
  CHECK(create && create != dlsym(RTLD_DEFAULT, "cublasCreate_v2"));
  dlerror();
  CHECK(!dlsym(lib, "cublasNoSuchFunction") && dlerror());
  CHECK(!dlvsym(lib, "cublasGemmEx", "NO_SUCH_VERSION"));
  gemm_through(lib, (__typeof__(&cublasGemmEx))dlsym(lib, "cublasGemmEx"));
}

static void scenario_two_copies(void) {
  void *first = mt_t_open(build_dir, "tests/cpu/fake/libcublas.so.13");
  void *second = mt_t_open(build_dir, "tests/cpu/fake/cuda12/libcublas.so.12");
  if (!first || !second) {
    CHECKF(0, "%s", "a fixture could not be loaded");
    return;
  }
  void *hook = dlsym(RTLD_DEFAULT, "cublasGemmEx");
  CHECK(dlsym(first, "cublasGemmEx") == hook);
  void *theirs = dlsym(second, "cublasGemmEx");
  CHECKF(theirs && theirs != hook && theirs == dlsym(second, "fake_own_cublasGemmEx"),
         "the second copy's lookup gave %p (hook %p)", theirs, hook);
  CHECK(dlsym(second, "cublasGemmStridedBatchedEx") !=
        dlsym(RTLD_DEFAULT, "cublasGemmStridedBatchedEx"));
  gemm_through(second, (__typeof__(&cublasGemmEx))theirs);
  gemm_through(first, (__typeof__(&cublasGemmEx))hook);
}

static const mt_t_scenario scenarios[] = {
    {"lookups", scenario_lookups},
    {"two_copies", scenario_two_copies},
};

/* ======================================================================================== */
/* The parent.                                                                              */
/* ======================================================================================== */

static const char *const census_row = "{\"entry\": \"cublasGemmEx\", \"ops\": \"TN\", \"m\": 64, "
                                      "\"n\": 5, \"k\": 32, \"types\": \"bf16*bf16->bf16\"";

static void lookups_answer_hooks_and_calls_are_seen(void) {
  const char *specs[] = {"MINITE_SPEC=bf16", "MINITE_SPEC=nvfp4-row", NULL};
  for (int i = 0; specs[i]; i++) {
    const char *env[] = {specs[i], NULL};
    mt_t_child r;
    mt_t_run_child("lookups", i ? "lookups_nvfp4" : "lookups_bf16", env, &r); /* a file each */
    mt_t_check_child("lookups", &r);
    CHECKF(i == 0 ? !strstr(r.err, "minite WARN") : mt_t_count_of(r.err, "minite WARN") == 1, "%s",
           r.err);
    CHECKF(r.summary && strstr(r.summary, census_row), "census: %.400s", r.summary);
    CHECK(mt_t_json_int_in(r.summary, NULL, "gemm_calls") == 1);
    CHECK(mt_t_json_int_in(r.summary, NULL, "routed") == (i == 0));
    CHECK(i == 0 || mt_t_fallback(r.summary, "no engine") == 1);
    mt_t_child_free(&r);
  }
}

static void lookups_when_inert_change_nothing(void) {
  const char *env[] = {"MINITE_SPEC=", NULL};
  mt_t_child r;
  mt_t_run_child("lookups", "lookups_inert", env, &r);
  mt_t_check_child("lookups", &r);
  CHECKF(r.err && !r.err[0], "stderr: %s", r.err);
  CHECK(!r.stats);
  mt_t_child_free(&r);
}

/* tests/cpu/fake/next_app under the shim (active, then inert): exit 0 when RTLD_NEXT from a library
 * of the initial scope finds the next one's definition (dlsym and dlvsym), and RTLD_DEFAULT from a
 * library loaded RTLD_LOCAL finds its own dependency's symbol. */
static void rtld_next_and_default_see_the_caller(void) {
  char app[PATH_MAX + 128], dir[PATH_MAX + 64], out[PATH_MAX + 64], stats[PATH_MAX + 64];
  snprintf(dir, sizeof dir, "%s/tests/cpu/fake/next", mt_t_paths.build);
  snprintf(app, sizeof app, "%s/next_app", dir);
  for (int inert = 0; inert < 2; inert++) {
    const char *env[] = {inert ? "MINITE_SPEC=" : "MINITE_SPEC=bf16", NULL};
    snprintf(out, sizeof out, "%s/next_app%d.out", mt_t_paths.tmp, inert);
    snprintf(stats, sizeof stats, "%s/next_app%d.jsonl", mt_t_paths.tmp, inert);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      mt_t_child_env(stats, env);
      int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(fd, 1), dup2(fd, 2);
      execl(app, app, dir, (char *)NULL);
      _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    char *text = mt_t_read_file(out, NULL);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: %s", inert ? "inert" : "active",
           text ? text : "");
    free(text);
  }
}

static void a_second_cublas_gets_its_own_functions(void) {
  const char *env[] = {"MINITE_SPEC=bf16", NULL};
  mt_t_child r;
  mt_t_run_child("two_copies", "two_copies", env, &r);
  mt_t_check_child("two_copies", &r);
  CHECKF(mt_t_count_of(r.err, "minite WARN") == 1 &&
             strstr(r.err, "two copies of the library that defines cublasGemmEx") &&
             strstr(r.err, "libcublas.so.12") && strstr(r.err, "libcublas.so.13"),
         "%s", r.err);
  /* only the first copy's call was seen */
  CHECK(mt_t_json_int_in(r.summary, NULL, "gemm_calls") == 1);
  mt_t_child_free(&r);
}

static void tests(void) {
  RUN(lookups_answer_hooks_and_calls_are_seen);
  RUN(lookups_when_inert_change_nothing);
  RUN(rtld_next_and_default_see_the_caller);
  RUN(a_second_cublas_gets_its_own_functions);
}

int main(int argc, char **argv) {
  return mt_t_scenario_main(argc, argv, "/tmp/mt_shim_dl.XXXXXX", ROUTES, remember_build, scenarios,
                            sizeof scenarios / sizeof scenarios[0], tests);
}
