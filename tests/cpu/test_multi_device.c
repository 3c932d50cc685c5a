/* test_multi_device.c — the shim in a process that drives several GPUs, and in jobs of several
 * ranks, on the CPU: scenarios of this program run in children under the preloaded shim with the
 * fake cuBLAS and the fake libcuda.so.1 of tests/cpu/fake, whose devices differ (0: an H200 of 132
 * SMs, 1: an sm_90 of 114 SMs, 2: an sm_80 the kernels cannot run on; fake_cuda.h).
 *
 *   devices_apart              contexts on devices 0, 1, 2 from one thread, then 0 and 1 from two
 *                              threads at once: each sm_90 device loads its own modules, sizes the
 *                              persistent grid by its own SM count, and counts its calls in the
 *                              summary's "contexts" under its ordinal and PCI address; the sm_80
 *                              device's calls go to cuBLAS ("no engine"), taking no memory there,
 *                              while the others route
 *   stream_of_another_context  a call whose stream is another context's: cuBLAS's result, counted
 *                              "other context", said once, no launch refused by the driver
 *   cache_bound_per_device     MINITE_CACHE_MB bounds the weights kept on each GPU, not the process
 *   rank_and_device_recorded   the start and summary records: rank, local_rank, world_size from
 *                              torchrun's, Open MPI's or Slurm's variables; the device and its PCI
 *                              address; %r gives each of two concurrent ranks its own file
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/cpu/scenario.h"

#define IN 512
#define OUT 256
#define WIDE 1024 /* a second route: 8192 tokens of it make more tiles than any device has SMs */
#define ROUTES "MINITE_ROUTE=256x512,1024x512"
#define S1 ((CUstream)(uintptr_t)0x1000)
#define S_DEV1 ((CUstream)(uintptr_t)0x3000)

/* ======================================================================================== */
/* The child.                                                                               */
/* ======================================================================================== */

static fake_cuda_ctx_create_on_fn ctx_create_on;
static fake_cuda_stream_bind_fn stream_bind;
static CUresult (*get_current)(CUcontext *);
static cublasHandle_t handle;

static int load_fakes(const char *build) {
  if (mt_t_load_fakes(build, &handle) != 0)
    return -1;
  void *cuda = mt_t_fakes.cuda;
  ctx_create_on = (fake_cuda_ctx_create_on_fn)mt_t_sym(cuda, "fake_cuda_ctx_create_on");
  stream_bind = (fake_cuda_stream_bind_fn)mt_t_sym(cuda, "fake_cuda_stream_bind");
  get_current = (CUresult(*)(CUcontext *))mt_t_sym(cuda, "cuCtxGetCurrent");
  if (!ctx_create_on || !stream_bind || !get_current)
    return printf("    child: a fake's knob is missing\n"), -1;
  return 0;
}

static mt_t_problem make(uint32_t *seed, int out, int tokens) {
  return mt_t_make(seed, out, IN, tokens);
}

/* The grid of the first large-path GEMM launched since `from`; -1 when none. */
static int large_grid(int from) {
  for (int i = from; i < now(); i++)
    if (event(i)->kind == FAKE_EV_LAUNCH && !strncmp(event(i)->name, "mt_gemm_large_", 14))
      return (int)event(i)->grid[0];
  return -1;
}

/* --- scenarios ---------------------------------------------------------------------------- */

static void scenario_one_call(void) {
  uint32_t seed = 1;
  mt_t_problem p = make(&seed, OUT, 8);
  CHECK(mt_t_routed_on(handle, &p, S1));
  mt_t_unmake(&p);
}

/* One device's first calls: a small one (which loads the modules: *loads) and one of 8192 tokens
 * whose persistent grid has one CTA per SM of the device. */
static void first_calls(const mt_t_problem *p, const mt_t_problem *big, int sms, int *loads) {
  int t = now();
  CHECK(mt_t_routed_on(handle, p, S1));
  *loads = mt_t_count_kind(t, FAKE_EV_LOAD);
  t = now();
  CHECK(mt_t_routed_on(handle, big, S1));
  CHECKF(large_grid(t) == sms, "a grid of %d CTAs on a device of %d SMs", large_grid(t), sms);
}

/* Devices 0 and 1 route (53 and 52 calls), device 2's one call goes to cuBLAS. */
static void scenario_devices(void) {
  uint32_t seed = 2;
  mt_t_problem p = make(&seed, OUT, 8), big = make(&seed, WIDE, 8192);
  CUcontext d0 = NULL;
  get_current(&d0);
  int loads0, loads1;
  first_calls(&p, &big, 132, &loads0);
  CUcontext d1 = ctx_create_on(1);
  CHECK(d1 != NULL);
  first_calls(&p, &big, 114, &loads1);
  CHECKF(loads0 > 0 && loads1 == loads0, "modules loaded: %d on device 0, %d on device 1", loads0,
         loads1);
  CUcontext d2 = ctx_create_on(2);
  CHECK(d2 != NULL);
  CHECKF(mt_t_cublas_on(handle, &p, S1), "the sm_80 device's call is not cuBLAS's");
  mt_t_fakes.set_current(d0);
  int t = now();
  CHECK(mt_t_routed_on(handle, &p, S1));
  CHECKF(mt_t_count_kind(t, FAKE_EV_LOAD) == 0, "modules loaded again on device 0");
  mt_t_ctx_job jobs[2] = {{.ctx = d0, .stream = S1, .out = OUT, .in = IN, .calls = 50, .seed = 7},
                          {.ctx = d1, .stream = S1, .out = OUT, .in = IN, .calls = 50, .seed = 8}};
  mt_t_run_ctx_jobs(jobs, 2);
  CHECKF(jobs[0].routed == 50 && jobs[1].routed == 50, "routed %d and %d of 50", jobs[0].routed,
         jobs[1].routed);
  mt_t_check_clean();
  mt_t_unmake(&p), mt_t_unmake(&big);
}

/* S_DEV1 belongs to device 1's context; device 0's is current. */
static void scenario_foreign(void) {
  uint32_t seed = 3;
  mt_t_problem p = make(&seed, OUT, 8);
  CUcontext d0 = NULL;
  get_current(&d0);
  CHECK(mt_t_routed_on(handle, &p, S1));
  CUcontext d1 = ctx_create_on(1);
  stream_bind(S_DEV1, d1);
  CHECK(mt_t_routed_on(handle, &p, S_DEV1)); /* its own context current: routed */
  mt_t_fakes.set_current(d0);
  for (int i = 0; i < 2; i++)
    CHECKF(mt_t_cublas_on(handle, &p, S_DEV1), "call %d on another context's stream", i);
  CHECK(mt_t_routed_on(handle, &p, S1));
  mt_t_check_clean();
  mt_t_unmake(&p);
}

/* Two weights kept on device 0, the same two on device 1. */
static void scenario_cache(void) {
  uint32_t seed = 4;
  mt_t_problem a = make(&seed, OUT, 8), b = make(&seed, OUT, 8);
  for (int dev = 0; dev < 2; dev++) {
    if (dev)
      ctx_create_on(1);
    for (int i = 0; i < 2; i++)
      CHECK(mt_t_routed_on(handle, &a, S1) && mt_t_routed_on(handle, &b, S1));
  }
  mt_t_check_clean();
  mt_t_unmake(&a), mt_t_unmake(&b);
}

static const mt_t_scenario scenarios[] = {
    {"cache", scenario_cache},
    {"one_call", scenario_one_call},
    {"devices", scenario_devices},
    {"foreign", scenario_foreign},
};

/* ======================================================================================== */
/* The parent.                                                                              */
/* ======================================================================================== */

static long json_int(const char *s, const char *key) { return mt_t_json_int_in(s, NULL, key); }

/* The context entry of `pci` in the summary's "contexts": its "routed", or -1. */
static long context_routed(const char *summary, const char *pci) {
  const char *c = summary ? strstr(summary, "\"contexts\": [") : NULL;
  char pat[96];
  snprintf(pat, sizeof pat, "\"pci_bus\": \"%s\"", pci);
  const char *p = c ? strstr(c, pat) : NULL;
  return p ? json_int(p, "routed") : -1;
}

static void devices_apart(void) {
  for (int frozen = 0; frozen < 2; frozen++) {
    const char *env[] = {frozen ? "MINITE_WEIGHT_CACHE=frozen" : "MINITE_WEIGHT_CACHE=requantize",
                         NULL};
    mt_t_child r;
    mt_t_run_child("devices", frozen ? "devices_frozen" : "devices", env, &r);
    mt_t_check_child("devices", &r);
    CHECKF(json_int(r.summary, "routed") == 105 && mt_t_fallback(r.summary, "no engine") == 1,
           "routed %ld, no engine %ld", json_int(r.summary, "routed"),
           mt_t_fallback(r.summary, "no engine"));
    CHECKF(context_routed(r.summary, "0000:19:00.0") == 53 &&
               context_routed(r.summary, "0000:29:00.0") == 52 &&
               context_routed(r.summary, "0000:39:00.0") == 0 &&
               strstr(r.summary, "\"routed\": 0, \"device_bytes\": 0}"),
           "contexts: %.400s", r.summary ? strstr(r.summary, "\"contexts\"") : "no summary");
    const char *dev1 = r.summary ? strstr(r.summary, "\"pci_bus\": \"0000:29:00.0\"") : NULL;
    CHECKF(dev1 && strstr(r.summary, "{\"device\": 1, \"pci_bus\": \"0000:29:00.0\""),
           "device 1's entry: %.200s", dev1 ? dev1 : "none");
    CHECKF(r.stats && strstr(r.stats, "\"device\": 0, \"pci_bus\": \"0000:19:00.0\""),
           "the start record names device 0: %.300s", r.stats ? r.stats : "no file");
    mt_t_child_free(&r);
  }
}

static void stream_of_another_context(void) {
  mt_t_child r;
  mt_t_run_child("foreign", "foreign", NULL, &r);
  mt_t_check_child("foreign", &r);
  CHECKF(mt_t_fallback(r.summary, "other context") == 2 && json_int(r.summary, "routed") == 3,
         "other context %ld, routed %ld", mt_t_fallback(r.summary, "other context"),
         json_int(r.summary, "routed"));
  CHECKF(mt_t_count_of(r.err, "belongs to a CUDA context other than the current one") == 1,
         "stderr: %s", r.err ? r.err : "");
  mt_t_child_free(&r);
}

/* The start record of a child run with `env`: rank, local_rank, world_size as wanted. */
static void ranks_from(const char *tag, const char *const env[], long rank, long local, long size) {
  mt_t_child r;
  mt_t_run_child("one_call", tag, env, &r);
  mt_t_check_child(tag, &r);
  const char *start = r.stats ? strstr(r.stats, "{\"event\": \"start\"") : NULL;
  CHECKF(json_int(start, "rank") == rank && json_int(start, "local_rank") == local &&
             json_int(start, "world_size") == size,
         "%s: %.300s", tag, start ? start : "no start record");
  CHECKF(json_int(r.summary, "rank") == rank && json_int(r.summary, "device") == 0, "%s: %.200s",
         tag, r.summary ? r.summary : "no summary");
  mt_t_child_free(&r);
}

static void rank_and_device_recorded(void) {
  const char *torchrun[] = {"RANK=3", "LOCAL_RANK=1", "WORLD_SIZE=4", "SLURM_PROCID=9", NULL};
  ranks_from("torchrun", torchrun, 3, 1, 4);
  const char *mpi[] = {"OMPI_COMM_WORLD_RANK=5", "OMPI_COMM_WORLD_LOCAL_RANK=2",
                       "OMPI_COMM_WORLD_SIZE=8", NULL};
  ranks_from("mpi", mpi, 5, 2, 8);
  const char *slurm[] = {"SLURM_PROCID=6", "SLURM_LOCALID=0", "SLURM_NTASKS=7", NULL};
  ranks_from("slurm", slurm, 6, 0, 7);
  const char *bad[] = {"RANK=x", "SLURM_PROCID=2", NULL}; /* the first set decides */
  ranks_from("bad_rank", bad, 0, -1, -1);
  ranks_from("no_rank", NULL, 0, -1, -1);
  /* leading zeros: the numbers as JSON writes them (the start record stays JSON) */
  const char *zeros[] = {"RANK=007", "LOCAL_RANK=01", "WORLD_SIZE=08", NULL};
  ranks_from("zeros", zeros, 7, 1, 8);
  mt_t_child r;
  mt_t_run_child("one_call", "zeros_text", zeros, &r);
  CHECKF(r.stats && strstr(r.stats, "\"rank\": 7, \"local_rank\": 1, \"world_size\": 8,"), "%.300s",
         r.stats ? r.stats : "no statistics");
  mt_t_child_free(&r);
  /* two ranks at once on the one device, one file each through %r */
  char tmpl[PATH_MAX + 64];
  snprintf(tmpl, sizeof tmpl, "MINITE_STATS=%s/ranks.%%r.jsonl", mt_t_paths.tmp);
  pid_t pids[2];
  for (int i = 0; i < 2; i++) {
    fflush(stdout);
    if ((pids[i] = fork()) == 0) {
      const char *env[] = {tmpl, i ? "RANK=1" : "RANK=0", "WORLD_SIZE=2", NULL};
      mt_t_child one;
      mt_t_run_child("one_call", i ? "rank1" : "rank0", env, &one);
      _exit(one.status);
    }
  }
  for (int i = 0; i < 2; i++) {
    int status = 1;
    waitpid(pids[i], &status, 0);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "rank %d's child failed", i);
    char path[PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/ranks.%d.jsonl", mt_t_paths.tmp, i);
    char *text = mt_t_read_file(path, NULL);
    const char *summary = text ? strstr(text, "{\"event\": \"summary\"") : NULL;
    CHECKF(summary && json_int(summary, "rank") == i && json_int(summary, "routed") == 1 &&
               mt_t_count_of(text, "\"event\": \"start\"") == 1,
           "%s: %.300s", path, text ? text : "missing");
    free(text);
  }
}

/* MINITE_CACHE_MB bounds each GPU's kept weights: two weights of ~410 KB fit in 1 MiB on each of
 * two devices (all four would not fit in one bound shared by the process). */
static void cache_bound_per_device(void) {
  const char *env[] = {"MINITE_WEIGHT_CACHE=frozen", "MINITE_CACHE_MB=1", NULL};
  mt_t_child r;
  mt_t_run_child("cache", "cache", env, &r);
  mt_t_check_child("cache", &r);
  CHECKF(json_int(r.summary, "frozen_weights") == 4 && json_int(r.summary, "cache_full") == 0 &&
             json_int(r.summary, "routed") == 8,
         "%.300s", r.summary ? strstr(r.summary, "\"engine\"") : "no summary");
  mt_t_child_free(&r);
}

static void tests(void) {
  RUN(devices_apart);
  RUN(cache_bound_per_device);
  RUN(stream_of_another_context);
  RUN(rank_and_device_recorded);
}

int main(int argc, char **argv) {
  return mt_t_scenario_main(argc, argv, "/tmp/mt_multi_device.XXXXXX", ROUTES, load_fakes,
                            scenarios, sizeof scenarios / sizeof scenarios[0], tests);
}
