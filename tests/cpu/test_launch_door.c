/* test_launch_door.c — the launch door (shim/launch.h, shim/vllm.h) on the CPU: a program that
 * loads and launches kernels as Triton does (cuModuleLoadData and cuModuleGetFunction through the
 * global scope, as its PLT binds them; cuLaunchKernelEx through dlopen + dlsym), on the fake
 * libcuda.so.1 (tests/cpu/fake/fake_cuda.c), whose Triton modules run vLLM's fused_moe_kernel
 * arithmetic on the host with the compile-time constants their image states.
 *
 * The program is its own child (tests/cpu/scenario.h): each scenario runs under the preloaded
 * shim and checks, after each launch, which kernels ran (the function's own: its output computed;
 * the engine's: the dispatch, then the GEMM marking exactly the rows vLLM's kernel would write),
 * and how many times the function ran on the probe's data. The parent checks the statistics
 * (routed, each fallback reason, the census entry) and the constants the probe logged.
 */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/cpu/scenario.h"

#define N 256 /* the routed weight N x K */
#define K 512
#define E 4
#define ROUTES "MINITE_ROUTE=256x512"

/* ======================================================================================== */
/* The child: a Triton-like program under the shim.                                           */
/* ======================================================================================== */

static void *lib_cuda;
static __typeof__(&cuModuleLoadData) load_module;
static __typeof__(&cuModuleGetFunction) get_function;
static __typeof__(&cuLaunchKernelEx) launch_ex, fake_launch_ex;
static __typeof__(&cuLaunchKernel) launch_legacy;
static __typeof__(&cuGetProcAddress_v2) get_proc;
static __typeof__(&cuMemAlloc_v2) mem_alloc;
static fake_cuda_events_fn cuda_events;
static fake_cuda_set_capturing_fn set_capturing;

static int load(const char *build) {
  if (!(lib_cuda = mt_t_open(build, "tests/cpu/fake/driver/libcuda.so.1")))
    return -1;
  /* as Triton's compiled helper: its PLT binds to the first definition in the global scope */
  load_module = (__typeof__(load_module))dlsym(RTLD_DEFAULT, "cuModuleLoadData");
  get_function = (__typeof__(get_function))dlsym(RTLD_DEFAULT, "cuModuleGetFunction");
  /* as Triton's launcher: dlopen + dlsym on the driver */
  launch_ex = (__typeof__(launch_ex))dlsym(lib_cuda, "cuLaunchKernelEx");
  launch_legacy = (__typeof__(launch_legacy))dlsym(lib_cuda, "cuLaunchKernel");
  get_proc = (__typeof__(get_proc))dlsym(lib_cuda, "cuGetProcAddress_v2");
  fake_launch_ex = (__typeof__(fake_launch_ex))mt_t_sym(lib_cuda, "fake_cuda_launch_ex");
  mem_alloc = (__typeof__(mem_alloc))mt_t_sym(lib_cuda, "cuMemAlloc_v2");
  cuda_events = (fake_cuda_events_fn)mt_t_sym(lib_cuda, "fake_cuda_events");
  set_capturing = (fake_cuda_set_capturing_fn)mt_t_sym(lib_cuda, "fake_cuda_set_capturing");
  return load_module && get_function && launch_ex && launch_legacy && get_proc && fake_launch_ex &&
                 mem_alloc && cuda_events && set_capturing
             ? 0
             : -1;
}

/* A Triton image: an ELF file holding the kernel's section name, a source path for its line
 * table (or none) and the fake's descriptor of its constants. */
static CUfunction kernel(const char *path, const char *desc) {
  static char images[16][1024];
  static int nimages;
  char *img = images[nimages++ % 16], text[768];
  const int len = snprintf(text, sizeof text, ".text.fused_moe_kernel%c%s%cfake-triton: %s", 0,
                           path ? path : "", 0, desc);
  fake_cuda_elf(img, sizeof images[0], text, (size_t)len + 1);
  CUmodule m;
  CUfunction f = NULL;
  if (load_module(&m, img) != CUDA_SUCCESS ||
      get_function(&f, m, "fused_moe_kernel") != CUDA_SUCCESS)
    printf("    child: the Triton module did not load\n");
  return f;
}

#define VLLM_PATH "/usr/lib/python3/site-packages/vllm/model_executor/layers/fused_moe/fused_moe.py"

static void *dev(size_t bytes) {
  CUdeviceptr p = 0;
  return mem_alloc(&p, bytes) == CUDA_SUCCESS ? (void *)(uintptr_t)p : NULL;
}

/* One MoE layer's launch: tokens routed top_k of E experts (distinct, at random), vLLM's
 * dispatch built on the host as moe_align_block_size builds it, or the naive one. */
typedef struct {
  int tokens, top_k, bm, naive, valid;
  uint16_t *a, *b, *c;
  float *w;
  int32_t *sorted, *experts, *padded, ids[64];
  int32_t em, blocks;
} layer;

static uint32_t seed = 77;

static void make_layer(layer *l, int tokens, int top_k, int bm, int naive) {
  *l = (layer){.tokens = tokens, .top_k = top_k, .bm = bm, .naive = naive, .valid = tokens * top_k};
  l->a = dev((size_t)tokens * K * 2), l->b = dev((size_t)E * N * K * 2),
  l->c = dev((size_t)(l->valid + 1) * N * 2); /* a row more: the scrambled kernel writes it */
  l->w = dev((size_t)l->valid * 4), l->padded = dev(4);
  uint16_t *x = mt_t_matrix(&seed, (size_t)tokens * K), *w = mt_t_matrix(&seed, (size_t)E * N * K);
  memcpy(l->a, x, (size_t)tokens * K * 2), memcpy(l->b, w, (size_t)E * N * K * 2);
  free(x), free(w);
  for (int t = 0; t < tokens; t++)
    for (int j = 0; j < top_k; j++) {
      int e, dup;
      do {
        seed = seed * 1664525u + 1013904223u, e = (int)(seed >> 28) % E, dup = 0;
        for (int i = 0; i < j; i++)
          dup |= l->ids[t * top_k + i] == e;
      } while (dup);
      l->ids[t * top_k + j] = e;
      l->w[t * top_k + j] = 0.25f * (float)(1 + j);
    }
  l->sorted = dev((size_t)(l->valid + E * bm) * 4), l->experts = dev((size_t)(l->valid + E) * 4);
  int slots = 0;
  if (naive) {
    for (int i = 0; i < l->valid; i++)
      l->experts[i] = l->ids[i];
    l->blocks = l->valid, *l->padded = l->valid * bm, l->em = l->valid * bm;
    return;
  }
  for (int e = 0; e < E; e++) {
    int n = 0;
    for (int i = 0; i < l->valid; i++)
      if (l->ids[i] == e)
        l->sorted[slots + n++] = i;
    for (; n % bm; n++)
      l->sorted[slots + n] = l->valid;
    for (int b = 0; b < n / bm; b++)
      l->experts[l->blocks++] = e;
    slots += n;
  }
  *l->padded = slots, l->em = l->valid + E * (bm - 1);
}

/* The launch's parameters as Triton passes them: the pointers of `roles`, the 15 integers, the two
 * scratch pointers. */
typedef struct {
  void *ptr[8];
  int32_t ints[15];
  void *scratch[2];
  void *params[32];
  CUlaunchConfig cfg;
} args;

static void args_of(const layer *l, const char *roles, int bn, args *a, CUstream stream) {
  memset(a, 0, sizeof *a);
  int np = 0;
  for (const char *r = roles; *r; r++)
    a->ptr[np++] = *r == 'a'   ? (void *)l->a
                   : *r == 'b' ? (void *)l->b
                   : *r == 'c' ? (void *)l->c
                   : *r == 'w' ? (void *)l->w
                   : *r == 's' ? (void *)l->sorted
                   : *r == 'e' ? (void *)l->experts
                               : (void *)l->padded;
  const int32_t ints[15] = {N, K, l->em, l->valid, K, N * K, K, N, 0, 0, 0, 0, 0, 0, 0};
  memcpy(a->ints, ints, sizeof ints);
  for (int i = 0; i < np; i++)
    a->params[i] = &a->ptr[i];
  for (int i = 0; i < 15; i++)
    a->params[np + i] = &a->ints[i];
  a->params[np + 15] = &a->scratch[0], a->params[np + 16] = &a->scratch[1];
  a->cfg =
      (CUlaunchConfig){.gridDimX = (unsigned)(((l->em + l->bm - 1) / l->bm) * ((N + bn - 1) / bn)),
                       .gridDimY = 1,
                       .gridDimZ = 1,
                       .blockDimX = 128,
                       .blockDimY = 1,
                       .blockDimZ = 1,
                       .hStream = stream};
}

/* Launches of fused_moe_kernel so far (the function's own runs: the program's and the probe's). */
static int triton_runs(void) {
  const fake_cuda_event *ev;
  int n = cuda_events(&ev), runs = 0;
  for (int i = 0; i < n; i++)
    runs +=
        ev[i].kind == FAKE_EV_LAUNCH && !strcmp(ev[i].name, "fused_moe_kernel") && !ev[i].result;
  return runs;
}

static int launched(const char *name) {
  const fake_cuda_event *ev;
  int n = cuda_events(&ev), runs = 0;
  for (int i = 0; i < n; i++)
    runs +=
        ev[i].kind == FAKE_EV_LAUNCH && !strncmp(ev[i].name, name, strlen(name)) && !ev[i].result;
  return runs;
}

/* The rows of c the engine marked: exactly the valid ids'. */
static int marked_rows(const layer *l) {
  int rows = 0;
  for (int i = 0; i < l->valid; i++) {
    int marks = 0;
    for (int j = 0; j < N; j++)
      marks += l->c[(size_t)i * N + j] == FAKE_CUDA_MARK;
    if (marks != N && marks != 0)
      return -1;
    rows += marks == N;
  }
  return rows;
}

/* The function's own output for the same launch, through the fake's own entry point into a
 * fresh output; 1 when l's output holds it. */
static int computed_by_triton(const layer *l, const char *roles, CUfunction f) {
  layer r = *l;
  r.c = dev((size_t)l->valid * N * 2);
  memset(r.c, 0xff, (size_t)l->valid * N * 2);
  args a;
  args_of(&r, roles, 32, &a, NULL);
  return fake_launch_ex(&a.cfg, f, a.params, NULL) == CUDA_SUCCESS &&
         !memcmp(r.c, l->c, (size_t)l->valid * N * 2);
}

static void poison_c(const layer *l) { memset(l->c, 0xff, (size_t)l->valid * N * 2); }

#define DESC(roles, bm, top_k, mul)                                                                \
  "roles=" roles " ints=15 scratch=2 bm=" #bm " bn=32 gm=1 top_k=" #top_k " mul=" #mul

/* vLLM's GEMM1 as TritonExperts launches it (no router weights), sorted dispatch: decoded by one
 * probe run, then every launch routed (the engine's dispatch and GEMM, the rows of valid ids
 * marked, the function not run again). */
static void scenario_sorted(void) {
  CUfunction f = kernel(VLLM_PATH, DESC("abcsep", 16, 2, 0));
  layer l;
  make_layer(&l, 5, 2, 16, 0);
  args a;
  for (int call = 0; call < 3; call++) {
    poison_c(&l);
    args_of(&l, "abcsep", 32, &a, NULL);
    CHECK(launch_ex(&a.cfg, f, a.params, NULL) == CUDA_SUCCESS);
    CHECKF(marked_rows(&l) == l.valid, "call %d: %d rows marked of %d", call, marked_rows(&l),
           l.valid);
  }
  CHECKF(triton_runs() == 1, "the function ran %d times (its probe once)", triton_runs());
  CHECK(launched("mt_moe_dispatch") == 3 && launched("mt_grouped_") == 3);
}

/* GEMM2 (router weights multiplied, top_k 1), naive dispatch (a few tokens), through cuLaunchKernel
 * (Triton before 3.4) and through a cuLaunchKernelEx found with cuGetProcAddress. */
static void scenario_naive_weights(void) {
  CUfunction f = kernel(VLLM_PATH, DESC("abcwep", 16, 1, 1));
  layer l;
  make_layer(&l, 3, 1, 16, 1);
  args a;
  args_of(&l, "abcwep", 32, &a, NULL);
  poison_c(&l);
  CHECK(launch_legacy(f, a.cfg.gridDimX, 1, 1, 128, 1, 1, 0, NULL, a.params, NULL) == CUDA_SUCCESS);
  CHECKF(marked_rows(&l) == l.valid, "%d rows marked of %d", marked_rows(&l), l.valid);
  void *p = NULL;
  CUdriverProcAddressQueryResult st;
  CHECK(get_proc("cuLaunchKernelEx", &p, 12000, 0, &st) == CUDA_SUCCESS && p == (void *)launch_ex);
  poison_c(&l);
  CHECK(((__typeof__(launch_ex))p)(&a.cfg, f, a.params, NULL) == CUDA_SUCCESS);
  CHECKF(marked_rows(&l) == l.valid, "%d rows marked of %d", marked_rows(&l), l.valid);
  /* the probe: the sorted layout's hypothesis once a type, then the naive one's two runs */
  CHECKF(triton_runs() == 4, "runs %d", triton_runs());
}

/* A launch the door leaves alone runs the function's own arithmetic, bit for bit. */
static void expect_passed_through(CUfunction f, const char *roles, int tokens, int top_k, int naive,
                                  int runs) {
  layer l;
  make_layer(&l, tokens, top_k, 16, naive);
  args a;
  args_of(&l, roles, 32, &a, NULL);
  poison_c(&l);
  CHECK(launch_ex(&a.cfg, f, a.params, NULL) == CUDA_SUCCESS);
  CHECKF(triton_runs() == runs, "the function ran %d times, want %d", triton_runs(), runs);
  CHECKF(marked_rows(&l) == 0 && computed_by_triton(&l, roles, f),
         "the output is not the function's own");
}

/* Under bf16 the launch is counted as routed and runs unchanged (after its probe). */
static void scenario_bf16(void) {
  CUfunction f = kernel(VLLM_PATH, DESC("abcwsep", 16, 2, 0));
  expect_passed_through(f, "abcwsep", 5, 2, 0, 2); /* the probe, then the launch */
}

/* SGLang's kernel (its image's line table names sglang/): never probed, passed through. */
static void scenario_sglang(void) {
  CUfunction f =
      kernel("/usr/lib/python3/site-packages/sglang/kernels/ops/moe/fused_moe_triton_kernels.py",
             DESC("abcwsep", 16, 2, 0));
  expect_passed_through(f, "abcwsep", 5, 2, 0, 1);
}

/* A layout outside the table (vLLM before b_bias: 13 integers): never probed, passed through. */
static void scenario_unknown_layout(void) {
  CUfunction f =
      kernel(VLLM_PATH, "roles=abcwsep ints=13 scratch=2 bm=16 bn=32 gm=1 top_k=2 mul=0");
  layer l;
  make_layer(&l, 5, 2, 16, 0);
  args a;
  args_of(&l, "abcwsep", 32, &a, NULL);
  poison_c(&l);
  CHECK(launch_ex(&a.cfg, f, a.params, NULL) == CUDA_SUCCESS);
  CHECK(marked_rows(&l) == 0 && triton_runs() == 1);
}

/* A kernel of that name and layout that does something else (each row written one row down): the
 * probe's output fits no hypothesis, and its launches pass through for good. */
static void scenario_scrambled(void) {
  CUfunction f = kernel(VLLM_PATH, DESC("abcsep", 16, 2, 0) " scramble=1");
  layer l;
  make_layer(&l, 5, 2, 16, 0);
  args a;
  args_of(&l, "abcsep", 32, &a, NULL);
  for (int call = 0; call < 2; call++)
    CHECK(launch_ex(&a.cfg, f, a.params, NULL) == CUDA_SUCCESS);
  CHECK(marked_rows(&l) == 0);
  CHECKF(triton_runs() == 4 + 2, "runs %d",
         triton_runs()); /* 4 hypotheses once (2 layouts x 2 types), 2 launches */
}

/* First seen while its stream captures: no probe then ("capture"), the launch runs unchanged;
 * decoded at the next launch outside the capture. */
static void scenario_capture_first(void) {
  CUfunction f = kernel(VLLM_PATH, DESC("abcsep", 16, 2, 0));
  CUstream s = (CUstream)(uintptr_t)0x1000;
  layer l;
  make_layer(&l, 5, 2, 16, 0);
  args a;
  args_of(&l, "abcsep", 32, &a, s);
  set_capturing(s, 1);
  poison_c(&l);
  CHECK(launch_ex(&a.cfg, f, a.params, NULL) == CUDA_SUCCESS && marked_rows(&l) == 0 &&
        triton_runs() == 1);
  set_capturing(s, 0);
  poison_c(&l);
  CHECK(launch_ex(&a.cfg, f, a.params, NULL) == CUDA_SUCCESS && marked_rows(&l) == l.valid);
  CHECK(triton_runs() == 2);
}

/* A weight whose allocation's reservation runs past what is mapped (PyTorch's expandable segments):
 * its expert count cannot be bounded ("expert count"). */
static void scenario_expert_count(void) {
  CUfunction f = kernel(VLLM_PATH, DESC("abcsep", 16, 2, 0));
  expect_passed_through(f, "abcsep", 5, 2, 0, 2);
}

/* A weight shape the spec does not route: counted in the census, run unchanged. */
static void scenario_unrouted(void) {
  CUfunction f = kernel(VLLM_PATH, DESC("abcsep", 16, 2, 0));
  expect_passed_through(f, "abcsep", 5, 2, 0, 2);
}

/* Inert (MINITE_SPEC unset): nothing recorded, no probe, every launch unchanged. */
static void scenario_inert(void) {
  CUfunction f = kernel(VLLM_PATH, DESC("abcsep", 16, 2, 0));
  expect_passed_through(f, "abcsep", 5, 2, 0, 1);
}

/* Another kernel's launch goes to the driver as it came. */
static void scenario_other_kernel(void) {
  CUfunction f = kernel(VLLM_PATH, DESC("abcsep", 16, 2, 0));
  CUmodule m;
  static char img[1024];
  fake_cuda_elf(img, sizeof img, ".text.other_kernel", 19);
  CUfunction g = NULL;
  CHECK(load_module(&m, img) == CUDA_SUCCESS &&
        get_function(&g, m, "other_kernel") == CUDA_SUCCESS);
  void *arg = &m;
  void *params[] = {arg};
  const CUlaunchConfig cfg = {
      .gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 32, .blockDimY = 1, .blockDimZ = 1};
  CHECK(launch_ex(&cfg, g, params, NULL) == CUDA_SUCCESS && launched("other_kernel") == 1);
  (void)f;
}

static const mt_t_scenario scenarios[] = {
    {"sorted", scenario_sorted},
    {"naive_weights", scenario_naive_weights},
    {"bf16", scenario_bf16},
    {"sglang", scenario_sglang},
    {"unknown_layout", scenario_unknown_layout},
    {"scrambled", scenario_scrambled},
    {"capture_first", scenario_capture_first},
    {"expert_count", scenario_expert_count},
    {"unrouted", scenario_unrouted},
    {"inert", scenario_inert},
    {"other_kernel", scenario_other_kernel},
};

/* ======================================================================================== */
/* The parent.                                                                                */
/* ======================================================================================== */

static void run(const char *name, const char *const env[], mt_t_child *r) {
  mt_t_run_child(name, name, env, r);
  mt_t_check_child(name, r);
}

static long routed(const mt_t_child *r) { return mt_t_json_int_in(r->summary, NULL, "routed"); }

static int census_has(const mt_t_child *r, const char *entry) {
  char pat[96];
  snprintf(pat, sizeof pat, "\"entry\": \"%s\"", entry);
  return r->summary && strstr(r->summary, pat);
}

static void sorted_gemm1_is_routed(void) {
  const char *env[] = {"MINITE_LOG_LEVEL=INFO", NULL};
  mt_t_child r;
  run("sorted", env, &r);
  CHECKF(routed(&r) == 3, "routed %ld", routed(&r));
  CHECK(census_has(&r, "vllm fused_moe_kernel"));
  CHECKF(
      r.err &&
          strstr(r.err,
                 "decoded: parameters sorted; BLOCK_SIZE_M 16, top_k 2, MUL_ROUTED_WEIGHT 0, BF16"),
      "%s", r.err);
  mt_t_child_free(&r);
}

/* Digests of a dispatched call read its rows through the row lists: every valid pair's row (all
 * rows at rate 1) of each of the three calls; a call that multiplies by router weights is not
 * digested (its rows are no expert's own). */
static void dispatched_rows_are_digested(void) {
  const char *env[] = {"MINITE_DIGEST=1", NULL};
  mt_t_child r;
  run("sorted", env, &r);
  CHECKF(mt_t_json_int_in(r.summary, "\"digests\"", "written") == 3 * 10, "digests: %s",
         r.summary ? strstr(r.summary, "\"digests\"") : "(no summary)");
  mt_t_child_free(&r);
  run("naive_weights", env, &r);
  CHECKF(mt_t_json_int_in(r.summary, "\"digests\"", "written") <= 0, "digests: %s",
         r.summary ? strstr(r.summary, "\"digests\"") : "(no summary)");
  mt_t_child_free(&r);
}

static void naive_gemm2_with_weights_is_routed(void) {
  const char *env[] = {"MINITE_LOG_LEVEL=INFO", NULL};
  mt_t_child r;
  run("naive_weights", env, &r);
  CHECKF(routed(&r) == 2, "routed %ld", routed(&r));
  CHECKF(r.err && strstr(r.err, "decoded: parameters naive, router weights; BLOCK_SIZE_M 16, top_k "
                                "1, MUL_ROUTED_WEIGHT 1, BF16"),
         "%s", r.err);
  mt_t_child_free(&r);
}

static void bf16_counts_and_passes_through(void) {
  const char *env[] = {"MINITE_SPEC=bf16", NULL};
  mt_t_child r;
  run("bf16", env, &r);
  CHECKF(routed(&r) == 1, "routed %ld", routed(&r));
  mt_t_child_free(&r);
}

static void refused_kernels_pass_through_counted(void) {
  static const struct {
    const char *scenario, *reason;
    long count;
  } cases[] = {{"sglang", "sglang kernel", 1},
               {"unknown_layout", "triton layout", 1},
               {"scrambled", "triton layout", 2},
               {"capture_first", "capture", 1}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    mt_t_child r;
    run(cases[i].scenario, NULL, &r);
    CHECKF(mt_t_fallback(r.summary, cases[i].reason) == cases[i].count, "%s: %s %ld",
           cases[i].scenario, cases[i].reason, mt_t_fallback(r.summary, cases[i].reason));
    mt_t_child_free(&r);
  }
  const char *reserved[] = {"FAKE_CUDA_RESERVED=1048576", NULL};
  mt_t_child r;
  run("expert_count", reserved, &r);
  CHECK(mt_t_fallback(r.summary, "expert count") == 1 && routed(&r) == 0);
  CHECKF(strstr(r.err, "expert count cannot be bounded"), "%s", r.err);
  mt_t_child_free(&r);
}

static void unrouted_shapes_are_in_the_census(void) {
  const char *env[] = {"MINITE_ROUTE=1024x512", NULL};
  mt_t_child r;
  run("unrouted", env, &r);
  CHECK(routed(&r) == 0 && census_has(&r, "vllm fused_moe_kernel"));
  CHECKF(r.summary && strstr(r.summary, "route 256x512"), "suggested routes: %s", r.summary);
  mt_t_child_free(&r);
}

static void inert_shim_records_nothing(void) {
  const char *env[] = {"MINITE_SPEC=", NULL};
  mt_t_child r;
  run("inert", env, &r);
  CHECK(!r.stats && r.err && !r.err[0]);
  mt_t_child_free(&r);
}

static void other_kernels_go_to_the_driver(void) {
  mt_t_child r;
  run("other_kernel", NULL, &r);
  mt_t_child_free(&r);
}

static void tests(void) {
  RUN(sorted_gemm1_is_routed);
  RUN(naive_gemm2_with_weights_is_routed);
  RUN(dispatched_rows_are_digested);
  RUN(bf16_counts_and_passes_through);
  RUN(refused_kernels_pass_through_counted);
  RUN(unrouted_shapes_are_in_the_census);
  RUN(inert_shim_records_nothing);
  RUN(other_kernels_go_to_the_driver);
}

int main(int argc, char **argv) {
  return mt_t_scenario_main(argc, argv, "/tmp/mt_launch_door.XXXXXX", ROUTES, load, scenarios,
                            sizeof scenarios / sizeof scenarios[0], tests);
}
