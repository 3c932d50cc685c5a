/* test_shim_engine.c — routed calls on the NVFP4 engine through the preloaded shim, on the CPU:
 * the fake cuBLAS of tests/cpu/fake and a fake libcuda.so.1 (tests/cpu/fake/fake_cuda.c) that
 * logs every launch, allocation, memset, read-back and synchronisation and computes nothing.
 *
 * The program is its own child: `test_shim_engine child SCENARIO BUILD` runs one scenario under
 * LD_PRELOAD=libminite.so with MINITE_SPEC=nvfp4-row. The child loads the fakes as PyTorch loads
 * cuBLAS and the driver (dlopen, RTLD_LOCAL: the shim finds them by soname), calls the hooked
 * entry points, and checks after each call what the engine enqueued (kernels in order, on the
 * call's stream, their arguments), what it allocated, and the output: a routed call's output is
 * exactly the elements the GEMM kernel marks (the fake cuBLAS is not called); a fallback's output
 * is bitwise what the fake cuBLAS computes without the shim. The parent checks the child's exit,
 * its stderr (warnings) and the summary record of the statistics file.
 *
 * scenario_quant_shapes and scenario_frozen_numerics call this program's own engine and weight
 * cache (linked from libmt.a, beside the preloaded shim's, on the same fake driver) instead of a
 * hook: the quantizer's shapes that no routed call of these tests reaches, and kept weights under
 * numerics that differ within one process, which one spec a process never gives.
 *
 * "No engine" without any libcuda is covered by test_shim_preload.c (its nvfp4 runs).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/gemm_args.h"
#include "kernels/quant.h"
#include "kernels/wcheck.h"
#include "kernels/whash.h"
#include "kernels/wstore.h"
#include "shim/wcache.h"
#include "tests/cpu/fake/fake.h"
#include "tests/cpu/fake/fake_cuda.h"
#include "tests/cpu/scenario.h"

#define OUT 256 /* the routed weight: OUT x IN (cuBLAS m x k) */
#define IN 512
#define BIG_OUT 4096 /* a second routed shape, too large for the frozen cache of the test (1 MB) */
#define ROUTES "MINITE_ROUTE=256x512,1024x512,4096x512,256x2048" /* the last for scenario_kpair */
#define S1 ((CUstream)(uintptr_t)0x1000)
#define S2 ((CUstream)(uintptr_t)0x2000)

/* ======================================================================================== */
/* The child: one scenario in a process with the shim preloaded.                             */
/* ======================================================================================== */

static void *lib_cublas, *lib_lt, *lib_cuda;
static cublasHandle_t handle;
static cublasLtHandle_t lt_handle;
static const float one = 1.0f, zero = 0.0f, half = 0.5f;

/* The hooks (the shim's exports, first in the global scope) and the fake's own functions. */
static __typeof__(&cublasGemmEx) hook_gemm, fake_gemm;
static __typeof__(&cublasGemmStridedBatchedEx) hook_strided, fake_strided;
static __typeof__(&cublasGemmBatchedEx) hook_batched, fake_batched;
static __typeof__(&cublasGemmGroupedBatchedEx) hook_grouped, fake_grouped;
static __typeof__(&cublasLtMatmul) hook_lt, fake_lt;
static void (*cublas_last)(fake_record *);
static void (*lt_last)(fake_record *);

static fake_cuda_counts_fn cuda_counts;
static fake_cuda_set_capturing_fn set_capturing;
static fake_cuda_set_mem_limit_fn set_mem_limit;
static fake_cuda_fail_launch_fn fail_launch;
static fake_cuda_fail_loads_fn fail_loads;
static fake_cuda_is_device_fn is_device;
static fake_cuda_guard_fn guard_pages;

static uint32_t seed = 4321;

static uint16_t *matrix(size_t elems) { return mt_t_matrix(&seed, elems); }

static uint16_t *copy_of(const uint16_t *p, size_t elems) {
  uint16_t *c = aligned_alloc(64, (elems * 2 + 63) / 64 * 64);
  memcpy(c, p, elems * 2);
  return c;
}

static long cublas_calls(void) {
  fake_record r;
  cublas_last(&r);
  return r.calls;
}

static long lt_calls(void) {
  fake_record r;
  lt_last(&r);
  return r.calls;
}

static int load_fakes(const char *build, int with_cuda) {
  if (with_cuda) {
    if (!(lib_cuda = mt_t_open(build, "tests/cpu/fake/driver/libcuda.so.1")))
      return -1;
    cuda_events = (fake_cuda_events_fn)mt_t_sym(lib_cuda, "fake_cuda_events");
    cuda_counts = (fake_cuda_counts_fn)mt_t_sym(lib_cuda, "fake_cuda_counts_get");
    set_capturing = (fake_cuda_set_capturing_fn)mt_t_sym(lib_cuda, "fake_cuda_set_capturing");
    set_mem_limit = (fake_cuda_set_mem_limit_fn)mt_t_sym(lib_cuda, "fake_cuda_set_mem_limit");
    fail_launch = (fake_cuda_fail_launch_fn)mt_t_sym(lib_cuda, "fake_cuda_fail_launch");
    fail_loads = (fake_cuda_fail_loads_fn)mt_t_sym(lib_cuda, "fake_cuda_fail_loads");
    is_device = (fake_cuda_is_device_fn)mt_t_sym(lib_cuda, "fake_cuda_is_device");
    guard_pages = (fake_cuda_guard_fn)mt_t_sym(lib_cuda, "fake_cuda_guard");
  }
  if (!(lib_cublas = mt_t_open(build, "tests/cpu/fake/libcublas.so.13")))
    return -1;
  if (!(lib_lt = mt_t_open(build, "tests/cpu/fake/libcublasLt.so.13")))
    return -1;
  hook_gemm = (__typeof__(hook_gemm))dlsym(RTLD_DEFAULT, "cublasGemmEx");
  hook_strided = (__typeof__(hook_strided))dlsym(RTLD_DEFAULT, "cublasGemmStridedBatchedEx");
  hook_batched = (__typeof__(hook_batched))dlsym(RTLD_DEFAULT, "cublasGemmBatchedEx");
  hook_grouped = (__typeof__(hook_grouped))dlsym(RTLD_DEFAULT, "cublasGemmGroupedBatchedEx");
  hook_lt = (__typeof__(hook_lt))dlsym(RTLD_DEFAULT, "cublasLtMatmul");
  /* the fakes' own functions (a lookup of a cuBLAS name gets the hook: shim/dl.h) */
  fake_gemm = (__typeof__(fake_gemm))mt_t_sym(lib_cublas, "fake_own_cublasGemmEx");
  fake_strided =
      (__typeof__(fake_strided))mt_t_sym(lib_cublas, "fake_own_cublasGemmStridedBatchedEx");
  fake_batched = (__typeof__(fake_batched))mt_t_sym(lib_cublas, "fake_own_cublasGemmBatchedEx");
  fake_grouped =
      (__typeof__(fake_grouped))mt_t_sym(lib_cublas, "fake_own_cublasGemmGroupedBatchedEx");
  fake_lt = (__typeof__(fake_lt))mt_t_sym(lib_lt, "fake_own_cublasLtMatmul");
  cublas_last = (void (*)(fake_record *))mt_t_sym(lib_cublas, "fake_cublas_last");
  lt_last = (void (*)(fake_record *))mt_t_sym(lib_lt, "fake_cublasLt_last");
  /* the shim is preloaded: its hooks are not the fake's functions */
  if (!hook_gemm || hook_gemm == fake_gemm || !hook_lt || hook_lt == fake_lt || !hook_strided ||
      !hook_batched || !hook_grouped || !cublas_last || !lt_last)
    return printf("    child: the shim's hooks are not in front of the fake cuBLAS\n"), -1;
  __typeof__(&cublasCreate_v2) create = (__typeof__(create))mt_t_sym(lib_cublas, "cublasCreate_v2");
  __typeof__(&cublasLtCreate) lt_create = (__typeof__(lt_create))mt_t_sym(lib_lt, "cublasLtCreate");
  if (!create || !lt_create || create(&handle) || lt_create(&lt_handle))
    return -1;
  return 0;
}

static void set_stream(CUstream s) {
  __typeof__(&cublasSetStream_v2) f = (__typeof__(f))dlsym(lib_cublas, "cublasSetStream_v2");
  f(handle, (cudaStream_t)s);
}

/* --- the log ---------------------------------------------------------------------------- */

/* The events since `from` as words: kernel names (+pdl: programmatic serialization; !fail: the
 * launch failed), alloc, free, memsetBYTES, sync, dtoh, load (a module), tmap, smem (a function's
 * shared-memory limit raised). */
static const char *trace(int from) {
  static char s[4096];
  size_t used = 0;
  s[0] = '\0';
  for (int i = from; i < now() && used < sizeof s - 64; i++) {
    const fake_cuda_event *e = event(i);
    const char *sep = used ? " " : "";
    switch (e->kind) {
    case FAKE_EV_LAUNCH:
      used += (size_t)snprintf(s + used, sizeof s - used, "%s%s%s%s", sep, e->name,
                               e->pdl ? "+pdl" : "", e->result ? "!fail" : "");
      break;
    case FAKE_EV_ALLOC:
      used +=
          (size_t)snprintf(s + used, sizeof s - used, "%salloc%s", sep, e->result ? "!fail" : "");
      break;
    case FAKE_EV_MEMSET:
      used += (size_t)snprintf(s + used, sizeof s - used, "%smemset%zu", sep, e->bytes);
      break;
    case FAKE_EV_ALLOC_ASYNC:
      used += (size_t)snprintf(s + used, sizeof s - used, "%salloc_async%s", sep,
                               e->result ? "!fail" : "");
      break;
    default: {
      static const char *const words[] = {[FAKE_EV_FREE] = "free",
                                          [FAKE_EV_DTOH] = "dtoh",
                                          [FAKE_EV_HTOD] = "htod",
                                          [FAKE_EV_SYNC] = "sync",
                                          [FAKE_EV_CTX_SYNC] = "ctxsync",
                                          [FAKE_EV_LOAD] = "load",
                                          [FAKE_EV_TMAP] = "tmap",
                                          [FAKE_EV_SETATTR] = "smem",
                                          [FAKE_EV_RECORD] = "record",
                                          [FAKE_EV_HOSTALLOC] = "hostalloc",
                                          [FAKE_EV_FREE_ASYNC] = "free_async",
                                          [FAKE_EV_HOSTREG] = "hostreg",
                                          [FAKE_EV_WAIT] = "wait"};
      const char *w =
          e->kind >= 0 && e->kind < (int)(sizeof words / sizeof words[0]) ? words[e->kind] : NULL;
      used += (size_t)snprintf(s + used, sizeof s - used, "%s%s", sep, w ? w : "?");
    }
    }
  }
  return s;
}

#define CHECK_TRACE(from, want)                                                                    \
  do {                                                                                             \
    const char *got_ = trace(from);                                                                \
    CHECKF(!strcmp(got_, want), "\n      got  %s\n      want %s", got_, want);                     \
  } while (0)

/* Every stream-ordered event since `from` is on `s`. */
static int all_on(int from, CUstream s) {
  for (int i = from; i < now(); i++) {
    const fake_cuda_event *e = event(i);
    if ((e->kind == FAKE_EV_LAUNCH || e->kind == FAKE_EV_MEMSET || e->kind == FAKE_EV_SYNC) &&
        e->stream != s)
      return 0;
  }
  return 1;
}

/* The weight check's step under the scenario's MINITE_WEIGHT_CACHE: a sample, or every line. */
static unsigned cache_step(void) {
  const char *mode = getenv("MINITE_WEIGHT_CACHE");
  return mode && !strcmp(mode, "frozen-sampled") ? MT_SAMPLE_STEP : 1;
}

/* The index of the nth (0-based) launch of a kernel whose name starts with `prefix`, or -1. */
static int find_launch(int from, const char *prefix, int nth) {
  return mt_t_find_launch(from, prefix, 1, nth);
}

static int find_kind(int from, int kind, int nth) {
  for (int i = from; i < now(); i++)
    if (event(i)->kind == kind && nth-- == 0)
      return i;
  return -1;
}

/* The tensor maps encoded from event `from` up to event `to`: how many, how many of rank `rank`
 * encoded, and how many refused (CUDA_ERROR_NOT_SUPPORTED). */
typedef struct {
  int maps, of_rank, refused;
} map_counts;

static map_counts maps_between(int from, int to, int rank) {
  map_counts c = {0, 0, 0};
  for (int i = find_kind(from, FAKE_EV_TMAP, 0); i >= 0 && i < to;
       i = find_kind(i + 1, FAKE_EV_TMAP, 0)) {
    c.maps++;
    c.of_rank += event(i)->value == rank && event(i)->result == CUDA_SUCCESS;
    c.refused += event(i)->result == CUDA_ERROR_NOT_SUPPORTED;
  }
  return c;
}

static long device_bytes(void) {
  fake_cuda_counts c;
  cuda_counts(&c);
  return (long)c.live_bytes;
}

static void check_driver_clean(void) {
  fake_cuda_counts c;
  cuda_counts(&c);
  CHECKF(c.invalid == 0, "%ld driver calls the real driver would refuse", c.invalid);
  CHECKF(c.during_capture == 0, "%ld allocations, loads or synchronisations while capturing",
         c.during_capture);
  CHECKF(c.bad_frees == 0, "%ld frees of unknown pointers", c.bad_frees);
}

/* --- calls ------------------------------------------------------------------------------ */

typedef struct {
  int out, tokens;
  uint16_t *w, *x, *y;
  int ldc;
  int k; /* IN but where a scenario says otherwise (make_k) */
} problem;

static problem make_k(int out, int tokens, int ldc, int k) {
  problem p = {out, tokens, matrix((size_t)out * k), matrix((size_t)tokens * k), NULL, ldc, k};
  p.y = matrix((size_t)ldc * tokens);
  return p;
}

static problem make(int out, int tokens, int ldc) { return make_k(out, tokens, ldc, IN); }

static void unmake(problem *p) { free(p->w), free(p->x), free(p->y); }

static cublasStatus_t gemm(const problem *p, CUstream s, const float *beta) {
  set_stream(s);
  return hook_gemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, p->out, p->tokens, p->k, &one, p->w,
                   CUDA_R_16BF, p->k, p->x, CUDA_R_16BF, p->k, beta, p->y, CUDA_R_16BF, p->ldc,
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

/* What the fake cuBLAS computes for p without the shim, from the output as it is now. */
static uint16_t *reference(const problem *p, const float *beta) {
  uint16_t *y = copy_of(p->y, (size_t)p->ldc * p->tokens);
  fake_gemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, p->out, p->tokens, p->k, &one, p->w, CUDA_R_16BF,
            p->k, p->x, CUDA_R_16BF, p->k, beta, y, CUDA_R_16BF, p->ldc, CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT);
  return y;
}

/* y holds the mark exactly where the engine writes (tokens x out), `before` elsewhere. */
static int marked(const uint16_t *y, const uint16_t *before, int out, int tokens, int ldc) {
  for (int j = 0; j < tokens; j++)
    for (int i = 0; i < ldc; i++) {
      uint16_t want = i < out ? FAKE_CUDA_MARK : before[(size_t)j * ldc + i];
      if (y[(size_t)j * ldc + i] != want)
        return 0;
    }
  return 1;
}

/* A call the engine must run: routed (status, no cuBLAS call, output marked). */
static void expect_routed(const problem *p, CUstream s, const float *beta) {
  uint16_t *before = copy_of(p->y, (size_t)p->ldc * p->tokens);
  long calls = cublas_calls();
  CHECK(gemm(p, s, beta) == CUBLAS_STATUS_SUCCESS);
  CHECKF(cublas_calls() == calls, "the fake cuBLAS was called for a routed call");
  CHECKF(marked(p->y, before, p->out, p->tokens, p->ldc), "the output is not exactly the GEMM's");
  free(before);
}

/* A call that must fall back: cuBLAS computes it, bitwise as without the shim. */
static void expect_fallback(const problem *p, CUstream s, const float *beta) {
  uint16_t *want = reference(p, beta);
  long calls = cublas_calls();
  CHECK(gemm(p, s, beta) == CUBLAS_STATUS_SUCCESS);
  CHECKF(cublas_calls() == calls + 1, "the fake cuBLAS was not called for a fallback");
  CHECKF(!memcmp(p->y, want, (size_t)p->ldc * p->tokens * 2), "output differs from cuBLAS's");
  free(want);
}

/* --- argument checks -------------------------------------------------------------------- */

static const mt_quant_params *quant_args(int i) {
  return i >= 0 ? (const mt_quant_params *)event(i)->args : NULL;
}

static const mt_epilogue_args *epilogue_of(int i) {
  if (i < 0)
    return NULL;
  const fake_cuda_event *e = event(i);
  return !strncmp(e->name, "mt_gemm_small_", 14) ? &((const mt_small_args *)e->args)->e
                                                 : &((const mt_large_args *)e->args)->e;
}

/* The packing of a weight requantized for its call (full form), or the dequantization of a kept
 * one (only_if: frozen), between the weight's quantization wq and the activations' aq; the
 * dequantized weight the GEMM reads (the full form's xhat, or the kept form's copy in the
 * workspace). */
static const uint16_t *check_weight_forms(int wq, int aq, const mt_quant_params *w,
                                          const problem *p, const uint32_t *only_if) {
  const size_t elems = (size_t)p->out * IN;
  if (only_if) {
    int dq = find_launch(wq, "mt_dequant_weight", 0);
    CHECKF(dq > wq && dq < aq && find_launch(wq, "mt_gemm_pack", 0) < 0, "dequantized at %d", dq);
    if (dq < 0)
      return NULL;
    const mt_dequant_args *da = (const mt_dequant_args *)event(dq)->args;
    CHECK(!w->xhat && da->codes == w->codes && da->scales == w->scales &&
          da->blocks == (int64_t)elems / 16 && is_device(da->xhat, elems * 2));
    return da->xhat;
  }
  int pack = find_launch(wq, "mt_gemm_pack", 0);
  CHECKF(pack > wq && pack < aq, "packed at %d", pack);
  if (pack < 0)
    return NULL;
  const mt_pack_args *pk = (const mt_pack_args *)event(pack)->args;
  CHECK(pk->codes == w->codes && pk->scales == w->scales && pk->n == p->out && pk->k == IN &&
        !pk->only_if && is_device(w->xhat, elems * 2));
  return w->xhat;
}

/* The weight quantization (per-tensor S: amax then quant), the packing or dequantization, the
 * activations' and the large path's GEMM of one call starting at `from`: operands, shapes and
 * device memory. only_if: the frozen entry's dirty word (its check's list, whose count is the word
 * for one slice), or NULL under requantize. */
static void check_call_args(int from, const problem *p, const void *c, const void *bias, float beta,
                            const uint32_t *only_if) {
  int amax = find_launch(from, "mt_quant_amax_bf16", 0);
  int wq = find_launch(from, "mt_quant_tensor_bf16", 0);
  int aq = find_launch(from, "mt_quant_row_bf16", 0);
  int g = find_launch(from, "mt_gemm_large_", 0);
  CHECKF(amax >= 0 && wq > amax && aq > wq && g > aq, "order %d %d %d %d", amax, wq, aq, g);
  if (amax < 0 || wq < 0 || aq < 0 || g < 0)
    return;
  const mt_quant_params *w = quant_args(wq), *a = quant_args(aq), *am = quant_args(amax);
  CHECK(w->x == p->w && w->ldx == IN && w->rows == p->out && w->cols == IN && !w->row_outer);
  CHECK(am->x == p->w && am->amax == w->amax && am->only_if == only_if);
  CHECKF(w->only_if == only_if, "weight quantization reads %p, want %p", (void *)w->only_if,
         (void *)only_if);
  CHECK(is_device(w->codes, (size_t)p->out * IN / 2) &&
        is_device(w->scales, (size_t)p->out * IN / 16) && is_device(w->outer, 8));
  /* the amax word zeroed before the amax pass is the one it builds */
  int ms = find_kind(from, FAKE_EV_MEMSET, 0);
  while (ms >= 0 && event(ms)->bytes != 4)
    ms = find_kind(ms + 1, FAKE_EV_MEMSET, 0);
  CHECK(ms >= 0 && ms < amax && event(ms)->ptr == (uint64_t)(uintptr_t)w->amax);
  const uint16_t *wx = check_weight_forms(wq, aq, w, p, only_if);
  CHECK(a->x == p->x && a->ldx == IN && a->rows == p->tokens && a->cols == IN && a->row_outer &&
        !a->only_if && is_device(a->xhat, (size_t)p->tokens * IN * 2) &&
        is_device(a->outer, (size_t)p->tokens * 4));
  /* the activations do not overlap the weight's dequantized form */
  CHECK(wx && ((const char *)a->xhat + (size_t)p->tokens * IN * 2 <= (const char *)wx ||
               (const char *)wx + (size_t)p->out * IN * 2 <= (const char *)a->xhat));
  const mt_epilogue_args *e = epilogue_of(g);
  CHECK(e->m == p->tokens && e->n == p->out && e->k == IN && e->y == p->y && e->ldy == p->ldc);
  CHECK(e->sa == a->outer && e->sw == w->outer && e->sa_row && !e->sw_row);
  CHECKF(e->alpha == 1.0f && e->beta == beta, "alpha %g beta %g", e->alpha, e->beta);
  CHECKF(e->c == (beta != 0.0f ? c : NULL), "c %p", e->c);
  CHECK(e->ldc == p->ldc && e->bias == bias);
  /* the last band's activation box holds its rows rounded up to 8, no more; bands of the kernel's
   * tile height (64 for mt_gemm_large_m64_*, else 128) */
  const mt_large_args *la = (const mt_large_args *)event(g)->args;
  int band = strstr(event(g)->name, "_m64") ? 64 : MT_LARGE_BM;
  int last = p->tokens - (p->tokens - 1) / band * band, want = (last + 7) / 8 * 8;
  CHECKF(la->last_rows == want, "last band's box of %d rows for %d tokens, want %d", la->last_rows,
         p->tokens, want);
  /* at k = IN the K loop fits the 64-token tiles' ring, so a box holds one K block (the maps of
   * rank 2, not mt_gemm_large_m64p_*; scenario_kpair has the other case) */
  CHECKF(!strstr(event(g)->name, "_m64p_"), "%s at k = %d", event(g)->name, IN);
  map_counts mc = maps_between(aq, g, 2);
  CHECKF(mc.maps >= 2 && mc.of_rank == mc.maps, "%d maps before the GEMM, %d of rank 2 encoded",
         mc.maps, mc.of_rank);
}

/* --- scenarios -------------------------------------------------------------------------- */

/* A call of 8 tokens on the OUT x IN weight: the large path's tiles of 64 x 32 (kernels/gemm.c),
 * its activation map and the weight's; the first one loads the module and raises the kernel's
 * shared-memory limit. */
#define FEW_CALL "mt_quant_row_bf16_nb1 tmap tmap mt_gemm_large_m64_n32+pdl"
#define FEW_CALL_FIRST "mt_quant_row_bf16_nb1 tmap tmap smem mt_gemm_large_m64_n32+pdl"
/* The first kernel lookup in a context loads every kernel file (so that a graph captured later
 * finds any kernel) and makes the context registry's liveness canary (kernels/driver.c). */
#define LOAD_ALL "load load load load load load alloc"
#define WEIGHT_QUANT "memset4 mt_quant_amax_bf16 mt_quant_tensor_bf16 mt_gemm_pack"
/* A kept weight (frozen modes): codes and scales only, so no packing; each call dequantizes them
 * into its workspace before its activations' quantizer. */
#define KEPT_QUANT "memset4 mt_quant_amax_bf16 mt_quant_tensor_bf16"
#define KEPT_CALL "mt_dequant_weight+pdl " FEW_CALL
#define KEPT_CALL_FIRST "mt_dequant_weight+pdl " FEW_CALL_FIRST

/* requantize: the kernels of a call in order, on its stream; scratch per stream, grown once. */
static void scenario_requantize(void) {
  problem p = make(OUT, 8, OUT);
  int t = now();
  expect_routed(&p, S1, &zero);
  CHECK_TRACE(t, "alloc " LOAD_ALL " memset4 mt_quant_amax_bf16 mt_quant_tensor_bf16 "
                 "mt_gemm_pack " FEW_CALL_FIRST);
  CHECK(all_on(t, S1));
  check_call_args(t, &p, p.y, NULL, 0.0f, NULL);
  long first_bytes = device_bytes();
  /* the same call again: nothing allocated or loaded */
  t = now();
  expect_routed(&p, S1, &zero);
  CHECK_TRACE(t, WEIGHT_QUANT " " FEW_CALL);
  check_call_args(t, &p, p.y, NULL, 0.0f, NULL);
  /* beta != 0: C is the output (cublasGemmEx), read by the epilogue */
  t = now();
  expect_routed(&p, S1, &half);
  check_call_args(t, &p, p.y, NULL, 0.5f, NULL);
  /* more tokens: the scratch grows once, after the stream is synchronised; the large path's
   * tensor maps, then its GEMM */
  problem big = make(OUT, 200, OUT + 8);
  t = now();
  expect_routed(&big, S1, &zero);
  CHECK_TRACE(t, "sync free alloc " WEIGHT_QUANT " mt_quant_row_bf16_nb1 tmap tmap tmap "
                 "mt_gemm_large_m64_n32+pdl"); /* 200 tokens: W's map, the last band's (8 rows), the
                                                   first bands' (64) */
  CHECK(all_on(t, S1));
  check_call_args(t, &big, big.y, NULL, 0.0f, NULL);
  CHECK(device_bytes() > first_bytes);
  /* fewer tokens again: no allocation */
  problem mid = make(OUT, 20, OUT);
  t = now();
  expect_routed(&mid, S1, &zero);
  CHECK_TRACE(t, WEIGHT_QUANT " mt_quant_row_bf16_nb1 tmap tmap mt_gemm_large_m64_n32+pdl");
  check_call_args(t, &mid, mid.y, NULL, 0.0f, NULL); /* one band: a box of 24 activation rows */
  const mt_quant_params *a0 = quant_args(find_launch(t, "mt_quant_row_bf16", 0));
  /* 2 tokens (m x k <= MT_GEMM_FUSE_ELEMS): one GEMM launch that quantizes the activations itself,
   * from the caller's x, in plain stream order (no quantization kernel before it to overlap) */
  problem few = make(OUT, 2, OUT);
  t = now();
  expect_routed(&few, S1, &half);
  CHECK_TRACE(t, WEIGHT_QUANT " smem mt_gemm_small_q4");
  int fq = find_launch(t, "mt_gemm_small_q4", 0), fpack = find_launch(t, "mt_gemm_pack", 0);
  if (fq >= 0 && fpack >= 0) {
    const mt_small_args *fa = (const mt_small_args *)event(fq)->args;
    const mt_quant_params *fw = quant_args(find_launch(t, "mt_quant_tensor_bf16", 0));
    CHECK(fa->x == few.x && fa->ldx == IN && !fa->xfp16 &&
          fa->frag == ((const mt_pack_args *)event(fpack)->args)->frag);
    CHECK(fa->e.m == 2 && fa->e.n == OUT && fa->e.k == IN && fa->e.y == few.y && fa->e.ldy == OUT);
    CHECK(fa->e.sa_row && fw && fa->e.sw == fw->outer && !fa->e.sw_row && fa->e.beta == 0.5f &&
          fa->e.c == few.y);
  }
  /* a second stream gets its own scratch: one allocation, no synchronisation */
  long before = device_bytes();
  t = now();
  expect_routed(&p, S2, &zero);
  CHECK_TRACE(t, "alloc " WEIGHT_QUANT " " FEW_CALL);
  CHECK(all_on(t, S2));
  CHECK(device_bytes() > before);
  const mt_quant_params *a1 = quant_args(find_launch(t, "mt_quant_row_bf16", 0));
  CHECKF(a1 && a0 && a1->xhat != a0->xhat, "two streams share the activations' scratch");
  printf("#info device_bytes %ld\n", device_bytes());
  check_driver_clean();
  unmake(&p), unmake(&big), unmake(&mid), unmake(&few);
}

/* cublasLtMatmul of p on handle h, its A of acols columns (p->out is right) and its B of brows
 * rows (IN is right), with the BIAS epilogue where bias is given; C (c) and D separate: its
 * status. */
static cublasStatus_t lt_matmul(const problem *p, cublasLtHandle_t h, uint64_t acols,
                                uint64_t brows, const uint16_t *c, const void *bias, int bias_type,
                                const float *beta) {
  const mt_t_lt_api api = mt_t_lt(lib_lt);
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc;
  api.desc_create(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  int32_t ta = CUBLAS_OP_T;
  api.desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  if (bias) {
    uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
    api.desc_set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    api.desc_set(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
    if (bias_type != -1)
      api.desc_set(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type);
  }
  api.layout_create(&la, CUDA_R_16BF, IN, acols, IN);
  api.layout_create(&lb, CUDA_R_16BF, brows, p->tokens, (int64_t)brows);
  api.layout_create(&lc, CUDA_R_16BF, p->out, p->tokens, p->ldc);
  char workspace[256];
  cublasStatus_t st = hook_lt(h, desc, &one, p->w, la, p->x, lb, beta, c, lc, p->y, lc, NULL,
                              workspace, sizeof workspace, (cudaStream_t)S1);
  api.desc_destroy(desc);
  api.layout_destroy(la), api.layout_destroy(lb), api.layout_destroy(lc);
  return st;
}

/* A routed cublasLtMatmul of p's own shapes. */
static void lt_call(const problem *p, const uint16_t *c, const void *bias, int bias_type,
                    const float *beta) {
  CHECK(lt_matmul(p, lt_handle, (uint64_t)p->out, IN, c, bias, bias_type, beta) ==
        CUBLAS_STATUS_SUCCESS);
}

static void scenario_lt(void) {
  problem p = make(OUT, 8, OUT);
  uint16_t *c = matrix((size_t)OUT * 8), *bias = matrix(OUT);
  float *bias32 = aligned_alloc(64, OUT * 4);
  for (int i = 0; i < OUT; i++)
    bias32[i] = 0.25f * (float)(i % 7);
  long calls = lt_calls();
  int t = now();
  lt_call(&p, c, NULL, -1, &zero);
  CHECK_TRACE(t, "alloc " LOAD_ALL " memset4 mt_quant_amax_bf16 mt_quant_tensor_bf16 "
                 "mt_gemm_pack " FEW_CALL_FIRST);
  check_call_args(t, &p, c, NULL, 0.0f, NULL);
  t = now();
  lt_call(&p, c, bias, -1, &half);
  CHECK_TRACE(t, WEIGHT_QUANT " " FEW_CALL);
  check_call_args(t, &p, c, bias, 0.5f, NULL);
  const mt_epilogue_args *e = epilogue_of(find_launch(t, "mt_gemm_large_", 0));
  CHECK(e && e->biastype == 0 /* MT_DTYPE_BF16: the output's type */ && e->ytype == 0);
  t = now();
  lt_call(&p, c, bias32, CUDA_R_32F, &zero);
  e = epilogue_of(find_launch(t, "mt_gemm_large_", 0));
  CHECK(e && e->bias == bias32 && e->biastype == 2 /* MT_DTYPE_FP32 */);
  CHECKF(lt_calls() == calls, "the fake cublasLtMatmul was called for routed calls");
  check_driver_clean();
  unmake(&p), free(c), free(bias), free(bias32);
}

/* Calls of a routed shape that cuBLAS refuses reach it as they came, and get its status: NULL
 * alpha or beta, an op that is no cublasOperation_t, an Lt A or B whose shape is not op(A)'s or
 * op(B)'s, a NULL Lt handle. Nothing runs on the engine. */
static void scenario_refused(void) {
  problem p = make(OUT, 8, OUT);
  const cublasOperation_t T = CUBLAS_OP_T, N = CUBLAS_OP_N;
  set_stream(S1);
  const int t = now();
  const long calls = cublas_calls(), lts = lt_calls();
  CHECK(hook_gemm(handle, T, N, OUT, 8, IN, NULL, p.w, CUDA_R_16BF, IN, p.x, CUDA_R_16BF, IN, &zero,
                  p.y, CUDA_R_16BF, OUT, CUBLAS_COMPUTE_32F,
                  CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(hook_gemm(handle, T, N, OUT, 8, IN, &one, p.w, CUDA_R_16BF, IN, p.x, CUDA_R_16BF, IN, NULL,
                  p.y, CUDA_R_16BF, OUT, CUBLAS_COMPUTE_32F,
                  CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(hook_gemm(handle, (cublasOperation_t)3, N, OUT, 8, IN, &one, p.w, CUDA_R_16BF, IN, p.x,
                  CUDA_R_16BF, IN, &zero, p.y, CUDA_R_16BF, OUT, CUBLAS_COMPUTE_32F,
                  CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(hook_strided(handle, T, N, OUT, 4, IN, &one, p.w, CUDA_R_16BF, IN, 0, p.x, CUDA_R_16BF, IN,
                     4 * IN, NULL, p.y, CUDA_R_16BF, OUT, 4 * OUT, 2, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_INVALID_VALUE);
  CHECK(cublas_calls() == calls + 4);
  CHECK(lt_matmul(&p, lt_handle, OUT, IN + 16, p.y, NULL, -1, &zero) ==
        CUBLAS_STATUS_INVALID_VALUE);
  CHECK(lt_matmul(&p, NULL, OUT, IN, p.y, NULL, -1, &zero) == CUBLAS_STATUS_NOT_INITIALIZED);
  CHECK(lt_matmul(&p, lt_handle, OUT + 8, IN, p.y, NULL, -1, &zero) ==
        CUBLAS_STATUS_INVALID_VALUE); /* A's m, not D's */
  CHECK(lt_calls() == lts + 3);
  CHECKF(find_kind(t, FAKE_EV_LAUNCH, 0) < 0, "the engine ran a call cuBLAS refuses");
  expect_routed(&p, S1, &zero); /* and the shape itself routes */
  check_driver_clean();
  unmake(&p);
}

/* frozen: an entry per weight, zeroed state, the check first and quantization under its dirty
 * word; a weight past MINITE_CACHE_MB is requantized in scratch. */
static void scenario_frozen(void) {
  problem p = make(OUT, 8, OUT), q = make(OUT, 8, OUT), big = make(BIG_OUT, 8, BIG_OUT);
  int t = now();
  expect_routed(&p, S1, &zero);
  CHECK_TRACE(t, "alloc memset48 alloc " LOAD_ALL " mt_wcheck " KEPT_QUANT " " KEPT_CALL_FIRST
                 " record");
  CHECK(all_on(t, S1));
  int wc = find_launch(t, "mt_wcheck", 0), ms = find_kind(t, FAKE_EV_MEMSET, 0);
  const mt_wcheck_args *w = wc >= 0 ? (const mt_wcheck_args *)event(wc)->args : NULL;
  const uint32_t *dirty = w ? mt_wcheck_list(w->state, 1) : NULL;
  const unsigned step = cache_step();
  CHECK(w && w->w == p.w && w->ldw == IN && w->rows == OUT && w->cols == IN && w->step == step &&
        w->slices == 1);
  CHECK(w && ms >= 0 && event(ms)->ptr == (uint64_t)(uintptr_t)w->state && event(ms)->value == 0 &&
        event(ms)->bytes == MT_WCHECK_STATE_BYTES(1) &&
        is_device(w->state, MT_WCHECK_STATE_BYTES(1)));
  check_call_args(t, &p, p.y, NULL, 0.0f, dirty);
  const mt_quant_params *wq = quant_args(find_launch(t, "mt_quant_tensor_bf16", 0));
  uint8_t *entry_codes = wq ? wq->codes : NULL;
  long bytes1 = device_bytes();
  /* the same weight again: the check and the conditional quantization, nothing allocated */
  t = now();
  expect_routed(&p, S1, &zero);
  CHECK_TRACE(t, "mt_wcheck " KEPT_QUANT " " KEPT_CALL " record");
  check_call_args(t, &p, p.y, NULL, 0.0f, dirty);
  wq = quant_args(find_launch(t, "mt_quant_tensor_bf16", 0));
  CHECK(wq && wq->codes == entry_codes);
  CHECK(device_bytes() == bytes1);
  /* another weight of the same shape: a second entry */
  t = now();
  expect_routed(&q, S1, &zero);
  CHECK_TRACE(t, "alloc memset48 mt_wcheck " KEPT_QUANT " " KEPT_CALL " record");
  wc = find_launch(t, "mt_wcheck", 0);
  w = wc >= 0 ? (const mt_wcheck_args *)event(wc)->args : NULL;
  CHECK(w && w->w == q.w && mt_wcheck_list(w->state, 1) != dirty);
  check_call_args(t, &q, q.y, NULL, 0.0f, w ? mt_wcheck_list(w->state, 1) : NULL);
  /* a weight past the cache: requantized in the (grown) scratch, no check kernel */
  t = now();
  expect_routed(&big, S1, &zero);
  CHECK_TRACE(t, "sync free alloc " WEIGHT_QUANT " " FEW_CALL);
  check_call_args(t, &big, big.y, NULL, 0.0f, NULL);
  /* and again: the cache is still full, the scratch large enough */
  t = now();
  expect_routed(&big, S1, &zero);
  CHECK_TRACE(t, WEIGHT_QUANT " " FEW_CALL);
  printf("#info device_bytes %ld\n", device_bytes());
  check_driver_clean();
  unmake(&p), unmake(&q), unmake(&big);
}

/* One weight's call on wide (OUT rows at row stride ldw), 8 tokens. */
static void strided_weight_call(const uint16_t *wide, int ldw, const problem *p) {
  set_stream(S1);
  CHECK(hook_gemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, OUT, 8, IN, &one, wide, CUDA_R_16BF, ldw, p->x,
                  CUDA_R_16BF, IN, &zero, p->y, CUDA_R_16BF, OUT, CUBLAS_COMPUTE_32F,
                  CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
}

/* Under frozen, one address read at another row stride is another weight: another entry, each
 * found again at its own stride. */
static void scenario_frozen_stride(void) {
  problem p = make(OUT, 8, OUT);
  uint16_t *wide = matrix((size_t)OUT * (IN + 16));
  strided_weight_call(wide, IN, &p);
  int t = now();
  strided_weight_call(wide, IN + 16, &p);
  CHECK_TRACE(t, "alloc memset48 mt_wcheck " KEPT_QUANT " " KEPT_CALL " record");
  t = now();
  strided_weight_call(wide, IN, &p);
  CHECK_TRACE(t, "mt_wcheck " KEPT_QUANT " " KEPT_CALL " record");
  check_driver_clean();
  free(wide), unmake(&p);
}

/* A capturing stream: nothing is allocated outside the graph, loaded or read back. Before any
 * routed call the kernels are not loaded: capture (the call's graph memory, taken first, is given
 * back in the graph). After a routed call on any stream, a captured call takes its memory from the
 * capture (stream-ordered, the graph's own): whatever its size, whichever stream captures. */
static void scenario_capture(void) {
  problem p = make(OUT, 8, OUT), big = make(OUT, 200, OUT);
  set_capturing(S1, 1);
  int t = now();
  expect_fallback(&p, S1, &zero);
  CHECK_TRACE(t, "alloc_async free_async");
  set_capturing(S1, 0);
  expect_routed(&p, S2, &zero); /* the warm-up, on another stream than the capture's */
  set_capturing(S1, 1);
  t = now();
  expect_routed(&p, S1, &half);
  CHECK_TRACE(t, "alloc_async " WEIGHT_QUANT " " FEW_CALL " free_async");
  CHECK(all_on(t, S1));
  /* a larger call, another capturing stream: graph memory as well */
  t = now();
  expect_routed(&big, S1, &zero);
  set_capturing(S2, 1);
  expect_routed(&p, S2, &zero);
  CHECKF(mt_t_count_of(trace(t), "alloc_async") == 2 && mt_t_count_of(trace(t), "free_async") == 2,
         "%s", trace(t));
  CHECK(find_kind(t, FAKE_EV_ALLOC, 0) < 0 && find_kind(t, FAKE_EV_FREE, 0) < 0);
  set_capturing(S2, 0);
  set_capturing(S1, 0);
  check_driver_clean();
  unmake(&p), unmake(&big);
}

/* The module is not loaded yet (its first load failed) while the scratch exists: capture. */
static void scenario_capture_module(void) {
  problem p = make(OUT, 8, OUT);
  fail_loads(1);
  int t = now();
  expect_fallback(&p, S1, &zero); /* engine error: the module load failed */
  CHECK_TRACE(t, "alloc load");
  set_capturing(S1, 1);
  t = now();
  expect_fallback(&p, S1, &zero); /* capture: loading is not legal now */
  CHECK_TRACE(t, "alloc_async free_async");
  set_capturing(S1, 0);
  t = now();
  expect_routed(&p, S1, &zero);
  CHECK_TRACE(t, LOAD_ALL
              " memset4 mt_quant_amax_bf16 mt_quant_tensor_bf16 mt_gemm_pack " FEW_CALL_FIRST);
  check_driver_clean();
  unmake(&p);
}

/* Device memory refused (FAKE_CUDA_MEM_LIMIT): out of memory, cuBLAS computes. */
static void scenario_oom(void) {
  problem p = make(OUT, 8, OUT);
  int t = now();
  expect_fallback(&p, S1, &zero);
  expect_fallback(&p, S1, &zero);
  CHECK_TRACE(t, "alloc!fail alloc!fail");
  set_mem_limit(-1);
  expect_routed(&p, S1, &zero);
  check_driver_clean();
  unmake(&p);
}

/* The GEMM kernel's launch fails (FAKE_CUDA_FAIL_LAUNCH=mt_gemm_large_m64_n32:1): engine error. */
static void scenario_launch_fail(void) {
  problem p = make(OUT, 8, OUT);
  int t = now();
  expect_fallback(&p, S1, &half);
  CHECKF(find_launch(t, "mt_gemm_large_m64_n32", 0) >= 0 &&
             event(find_launch(t, "mt_gemm_large_m64_n32", 0))->result,
         "%s", trace(t));
  expect_routed(&p, S1, &zero);
  fail_launch("mt_gemm_large_m64_n32", 1);
  expect_fallback(&p, S1, &zero);
  check_driver_clean();
  unmake(&p);
}

/* No current context, or a device that is not sm_90: no engine; cuBLAS computes. */
static void scenario_no_engine(void) {
  problem p = make(OUT, 8, OUT);
  int t = now();
  expect_fallback(&p, S1, &zero);
  expect_fallback(&p, S1, &half);
  /* no kernel was launched (an sm_80 device may get its scratch before the module is refused) */
  CHECK(find_kind(t, FAKE_EV_LAUNCH, 0) < 0);
  check_driver_clean();
  unmake(&p);
}

/* FP16 operands and output through cublasGemmEx_64: the FP16 kernels, FP16 output and bias type. */
static void scenario_fp16(void) {
  __typeof__(&cublasGemmEx_64) hook64 = (__typeof__(hook64))dlsym(RTLD_DEFAULT, "cublasGemmEx_64");
  problem p = make(OUT, 8, OUT);
  uint16_t *before = copy_of(p.y, (size_t)OUT * 8);
  set_stream(S1);
  long calls = cublas_calls();
  int t = now();
  CHECK(hook64 && hook64(handle, CUBLAS_OP_T, CUBLAS_OP_N, OUT, 8, IN, &one, p.w, CUDA_R_16F, IN,
                         p.x, CUDA_R_16F, IN, &zero, p.y, CUDA_R_16F, OUT, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublas_calls() == calls && marked(p.y, before, OUT, 8, OUT));
  CHECK_TRACE(t, "alloc " LOAD_ALL " memset4 mt_quant_amax_fp16 mt_quant_tensor_fp16 mt_gemm_pack "
                 "mt_quant_row_fp16_nb1 tmap tmap smem mt_gemm_large_m64_n32+pdl");
  const mt_quant_params *w = quant_args(find_launch(t, "mt_quant_tensor_fp16", 0));
  const mt_quant_params *a = quant_args(find_launch(t, "mt_quant_row_fp16", 0));
  CHECK(w && w->fp16 && w->x == p.w && a && a->fp16 && a->x == p.x);
  const mt_epilogue_args *e = epilogue_of(find_launch(t, "mt_gemm_large_", 0));
  CHECK(e && e->ytype == 1 /* MT_DTYPE_FP16 */ && e->y == p.y);
  check_driver_clean();
  unmake(&p), free(before);
}

/* frozen, capturing: a weight with an entry is routed (the check runs in the graph); a weight
 * without one is quantized into the graph's memory (no entry is made in a capture). */
static void scenario_frozen_capture(void) {
  problem p = make(OUT, 8, OUT), q = make(OUT, 8, OUT);
  expect_routed(&p, S1, &zero);
  set_capturing(S1, 1);
  int t = now();
  expect_routed(&p, S1, &zero);
  CHECK_TRACE(t, "alloc_async mt_wcheck " KEPT_QUANT " " KEPT_CALL " free_async");
  t = now();
  expect_routed(&q, S1, &zero);
  CHECK_TRACE(t, "alloc_async " WEIGHT_QUANT " " FEW_CALL " free_async");
  set_capturing(S1, 0);
  t = now();
  expect_routed(&q, S1, &zero);
  CHECK_TRACE(t, "alloc memset48 mt_wcheck " KEPT_QUANT " " KEPT_CALL " record");
  check_driver_clean();
  unmake(&p), unmake(&q);
}

/* A launch of the weight's quantization fails (FAKE_CUDA_FAIL_LAUNCH=mt_quant_tensor_bf16:1):
 * engine error, cuBLAS computes; the parent expects the warning the conventions ask for. */
static void scenario_weight_quant_fail(void) {
  problem p = make(OUT, 8, OUT);
  expect_fallback(&p, S1, &zero);
  expect_routed(&p, S1, &zero);
  check_driver_clean();
  unmake(&p);
}

/* Under frozen, the quantization after the check fails
 * (FAKE_CUDA_FAIL_LAUNCH=mt_quant_tensor_bf16:1): cuBLAS computes the call, and the state's hash is
 * taken back (its valid word cleared after the failed launch), so that the next call's check finds
 * a change and quantizes again. */
static void scenario_frozen_quant_fail(void) {
  problem p = make(OUT, 8, OUT);
  int t = now();
  expect_fallback(&p, S1, &zero);
  CHECK_TRACE(t, "alloc memset48 alloc " LOAD_ALL " mt_wcheck memset4 mt_quant_amax_bf16 "
                 "mt_quant_tensor_bf16!fail memset4 record");
  const int wc = find_launch(t, "mt_wcheck", 0), last = now() - 2;
  const mt_wcheck_args *w = wc >= 0 ? (const mt_wcheck_args *)event(wc)->args : NULL;
  CHECK(w && event(last)->kind == FAKE_EV_MEMSET && event(last)->value == 0 &&
        event(last)->ptr == (uint64_t)(uintptr_t)&mt_wcheck_slices(w->state)[0].valid);
  t = now();
  expect_routed(&p, S1, &zero);
  CHECK_TRACE(t, "mt_wcheck " KEPT_QUANT " " KEPT_CALL_FIRST " record");
  check_driver_clean();
  unmake(&p);
}

/* --- batched and grouped ------------------------------------------------------------------ */

enum { BATCH = 3 };

/* A strided batch's launch (kernels/gemm_args.h: mt_grouped_kargs): every problem of `tokens`
 * rows at its stride, the store the quantization just wrote, the call's scalars, C and bias. */
static void check_grouped_args(int from, const uint16_t *y, size_t sy, int tokens, const void *c,
                               float beta, const void *bias, long long stride_bias) {
  int g = find_launch(from, "mt_grouped_", 0),
      q = find_launch(from, "mt_quant_tensor_store_bf16", 0);
  CHECKF(g >= 0 && q >= 0 && q < g, "store quantization at %d, grouped GEMM at %d", q, g);
  if (g < 0 || q < 0)
    return;
  const mt_grouped_kargs *k = (const mt_grouped_kargs *)event(g)->args;
  const mt_quant_params *p = quant_args(q);
  CHECK(k->seg0 == 0 && k->nseg == BATCH && !k->offs && k->seg_rows == tokens &&
        k->m == BATCH * tokens);
  CHECK(k->n == OUT && k->k == IN && k->y == y && k->ldy == OUT && k->stride_y == (long long)sy);
  CHECK(k->ws == p->store && k->ws_slice == p->slice_bytes && p->batch_rows == OUT);
  CHECK(!k->gen); /* a store quantized for the call: no refresh runs before the GEMM */
  int a = find_launch(from, "mt_quant_row_bf16_nb1", 0);
  CHECK(a > q && a < g && !quant_args(a)->dependents_after_wait && !quant_args(a)->running);
  CHECK(!k->acts);
  CHECK(k->c == c && (!c || k->stride_c == (long long)sy) && k->beta == beta && k->alpha == 1.0f);
  CHECK(k->bias == bias && (!bias || k->stride_bias == stride_bias));
}

/* A strided batch of `count` problems of `tokens` rows through `fn` (the hook or the fake cuBLAS):
 * the routed weight's shape, each operand's problems one matrix apart. */
static int strided_call(__typeof__(&cublasGemmStridedBatchedEx) fn, int tokens, const uint16_t *w,
                        const uint16_t *x, const float *beta, uint16_t *y, int count) {
  long long sw = (long long)OUT * IN, sx = (long long)tokens * IN, sy = (long long)OUT * tokens;
  return fn(handle, CUBLAS_OP_T, CUBLAS_OP_N, OUT, tokens, IN, &one, w, CUDA_R_16BF, IN, sw, x,
            CUDA_R_16BF, IN, sx, beta, y, CUDA_R_16BF, OUT, sy, count, CUBLAS_COMPUTE_32F,
            CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
}

/* The engine's trace of a strided batch of 3 problems of 8 rows: the weights into one store, the
 * activations (launched dependent: they wait on the device for the kernel before them, and the
 * store's quantizer lets none start early), one grouped GEMM. */
#define BATCH_CALL                                                                                 \
  "memset12 mt_quant_amax_bf16 mt_quant_tensor_store_bf16 tmap mt_quant_row_bf16_nb1+pdl"
#define BATCH_GEMM "mt_grouped_n16+pdl"
/* ... refreshed under frozen: the activations, then the check and the requantization of changed
 * slices, one launch dependent on them (they let it start once the kernel before has ended) */
#define BATCH_REFRESH "tmap mt_quant_row_bf16_nb1+pdl mt_refresh_tensor_store_bf16+pdl"
/* ... and of a pointer-array batch: the quantizers' kernels for rows behind pointers */
#define ARRAYS_CALL                                                                                \
  "memset12 mt_quant_amax_bf16_ptrs mt_quant_tensor_store_bf16_ptrs tmap "                         \
  "mt_quant_row_bf16_nb1_ptrs+pdl"

/* A call whose K loop outlasts the 64-token tiles' ring (k = 2048 at 8 tokens): every operand map
 * of rank 3 and the kernel that loads by them (mt_gemm_kpair, mt_gemm_large_m64p_*); under
 * FAKE_CUDA_MAP_RANK=2, a driver that refuses rank 3, the first map is refused, the maps of rank 2
 * and mt_gemm_large_m64_* taken instead, and the call is routed as ever. Then a strided batch of 8
 * rows a problem, whose grouped GEMM takes its activations two K blocks a box (kpair), or one
 * where rank 3 is refused. */
static void scenario_kpair(void) {
  const char *limit = getenv("FAKE_CUDA_MAP_RANK");
  int refuse = limit && atoi(limit) < 3;
  problem p = make_k(OUT, 8, OUT, 2048);
  int t = now();
  expect_routed(&p, S1, &zero);
  int g = find_launch(t, "mt_gemm_large_m64", 0);
  map_counts mc = maps_between(t, g, 3);
  CHECKF(g >= 0 && mc.refused == refuse && mc.of_rank == (refuse ? 0 : 2) && mc.maps == 2 + refuse,
         "GEMM at %d, %d maps, %d of rank 3, %d refused", g, mc.maps, mc.of_rank, mc.refused);
  if (g >= 0) {
    const mt_large_args *la = (const mt_large_args *)event(g)->args;
    const char *want = refuse ? "mt_gemm_large_m64_" : "mt_gemm_large_m64p_";
    CHECKF(!strncmp(event(g)->name, want, strlen(want)), "%s, want %s*", event(g)->name, want);
    CHECK(la->last_rows == 8 && la->e.k == 2048);
  }
  unmake(&p);
  int tokens = 8;
  uint16_t *w = matrix((size_t)OUT * IN * BATCH), *x = matrix((size_t)tokens * IN * BATCH);
  uint16_t *y = matrix((size_t)OUT * tokens * BATCH);
  set_stream(S1);
  t = now();
  CHECK(strided_call(hook_strided, tokens, w, x, &zero, y, BATCH));
  g = find_launch(t, "mt_grouped_n16", 0);
  mc = maps_between(t, g, 3);
  CHECKF(g >= 0 && mc.refused == refuse && mc.of_rank == !refuse,
         "grouped GEMM at %d, %d of rank 3, %d refused", g, mc.of_rank, mc.refused);
  if (g >= 0)
    CHECK(((const mt_grouped_kargs *)event(g)->args)->kpair == !refuse);
  check_driver_clean();
  free(w), free(x), free(y);
}

static void scenario_strided(void) {
  int tokens = 8;
  size_t sw = (size_t)OUT * IN, sx = (size_t)tokens * IN, sy = (size_t)OUT * tokens;
  uint16_t *w = matrix(sw * BATCH), *x = matrix(sx * BATCH), *y = matrix(sy * BATCH);
  set_stream(S1);
  /* beta != 0 with several problems: one launch for all, C read */
  uint16_t *before = copy_of(y, sy * BATCH);
  long calls = cublas_calls();
  int t = now();
  CHECK(strided_call(hook_strided, tokens, w, x, &half, y, BATCH));
  CHECK(cublas_calls() == calls);
  CHECK_TRACE(t, "alloc " LOAD_ALL " " BATCH_CALL " smem " BATCH_GEMM);
  check_grouped_args(t, y, sy, tokens, y, 0.5f, NULL, 0);
  for (int i = 0; i < BATCH; i++)
    CHECK(marked(y + i * sy, before + i * sy, OUT, tokens, OUT));
  /* beta 0 */
  free(before);
  before = copy_of(y, sy * BATCH);
  t = now();
  CHECK(strided_call(hook_strided, tokens, w, x, &zero, y, BATCH));
  CHECK(cublas_calls() == calls);
  CHECK_TRACE(t, BATCH_CALL " " BATCH_GEMM);
  check_grouped_args(t, y, sy, tokens, NULL, 0.0f, NULL, 0);
  for (int i = 0; i < BATCH; i++)
    CHECK(marked(y + i * sy, before + i * sy, OUT, tokens, OUT));
  /* one problem with beta != 0: the per-call path */
  t = now();
  CHECK(strided_call(hook_strided, tokens, w, x, &half, y, 1));
  /* (its weight, requantized in scratch, outgrows the grouped call's: the scratch grows) */
  CHECK_TRACE(t, "sync free alloc memset4 mt_quant_amax_bf16 mt_quant_tensor_bf16 "
                 "mt_gemm_pack " FEW_CALL_FIRST);
  check_driver_clean();
  free(w), free(x), free(y), free(before);
}

/* A strided batch of problems of 300 rows (token tile 256: kernels/gemm_args.h, MT_GROUPED_SPLITS):
 * two GEMM launches, each problem's tile of 256 rows on the n256 kernel (split 1), then its last
 * 44 rows on the n32 kernel (split 2, with its own activation map, two blocks a box), both
 * dependent, together writing every output once; a batch that reads C (beta != 0) runs whole in
 * one launch. */
static void scenario_split(void) {
  int tokens = 300;
  size_t sw = (size_t)OUT * IN, sx = (size_t)tokens * IN, sy = (size_t)OUT * tokens;
  uint16_t *w = matrix(sw * BATCH), *x = matrix(sx * BATCH), *y = matrix(sy * BATCH);
  uint16_t *before = copy_of(y, sy * BATCH);
  set_stream(S1);
  for (int round = 0; round < 2; round++) {
    const float *beta = round ? &half : &zero;
    int t = now();
    CHECK(strided_call(hook_strided, tokens, w, x, beta, y, BATCH));
    int body = find_launch(t, "mt_grouped_n256", 0), tail = find_launch(t, "mt_grouped_n32", 0);
    CHECKF(body >= 0 && event(body)->pdl, "beta %g: no dependent n256 launch", *beta);
    CHECKF(find_launch(t, "mt_grouped_", round ? 1 : 2) < 0, "beta %g: too many grouped launches",
           *beta);
    if (body < 0)
      continue;
    const mt_grouped_kargs *kb = (const mt_grouped_kargs *)event(body)->args;
    if (round) {
      CHECKF(tail < 0 && kb->split == 0, "C read: the call is split (%d)", kb->split);
      continue;
    }
    CHECKF(tail > body && event(tail)->pdl, "the tails' launch at %d, the body's at %d", tail,
           body);
    if (tail < 0)
      continue;
    const mt_grouped_kargs *kt = (const mt_grouped_kargs *)event(tail)->args;
    CHECK(kb->split == 1 && kt->split == 2 && kb->split_bn == 256 && kt->split_bn == 256);
    CHECK(kt->seg_rows == tokens && kt->y == y && kt->stride_y == (long long)sy && !kb->kpair &&
          kt->kpair);
    for (int i = 0; i < BATCH; i++)
      CHECKF(marked(y + i * sy, before + i * sy, OUT, tokens, OUT),
             "problem %d: not every row written", i);
  }
  check_driver_clean();
  free(w), free(x), free(y), free(before);
}

/* The same batch (beta 0) with the tails' launch failing (FAKE_CUDA_FAIL_LAUNCH=mt_grouped_n32:1):
 * the body's rows were written, nothing reads them, and cuBLAS computes the whole batch. */
static void scenario_split_fail(void) {
  int tokens = 300;
  size_t sw = (size_t)OUT * IN, sx = (size_t)tokens * IN, sy = (size_t)OUT * tokens;
  uint16_t *w = matrix(sw * BATCH), *x = matrix(sx * BATCH), *y = matrix(sy * BATCH);
  uint16_t *want = copy_of(y, sy * BATCH);
  CHECK(strided_call(fake_strided, tokens, w, x, &zero, want, BATCH));
  set_stream(S1);
  long calls = cublas_calls();
  CHECK(strided_call(hook_strided, tokens, w, x, &zero, y, BATCH));
  CHECKF(cublas_calls() == calls + 1, "cuBLAS was not called after the failed launch");
  CHECKF(!memcmp(y, want, sy * BATCH * 2), "the output differs from cuBLAS's");
  free(w), free(x), free(y), free(want);
}

/* The launches of a frozen strided batch of BATCH weights w since event t: the refresh of every
 * slice between the activations' quantizer (which lets it start only after its wait) and the GEMM;
 * beside (at most 64 rows), the quantizer counts its running CTAs in the state and the GEMM, which
 * starts with the refresh, waits for that count; else the GEMM waits for the refresh. Either way
 * the GEMM reads the state's generation. Returns the refresh's launch. */
static int check_frozen_launches(int t, const uint16_t *w, unsigned step, int beside) {
  int r = find_launch(t, "mt_refresh_tensor_store_bf16", 0);
  const mt_refresh_args *a = r >= 0 ? (const mt_refresh_args *)event(r)->args : NULL;
  CHECK(a && a->q.x == w && a->q.store && a->q.rows == BATCH * OUT && a->q.batch_rows == OUT &&
        a->q.cols == IN && a->q.ldx == IN && a->q.batch_stride == (long long)OUT * IN &&
        !a->q.only_if && a->step == step && a->state && a->grid_y == 1);
  CHECK(a && !a->offs); /* a strided batch uses every slice */
  int q = find_launch(t, "mt_quant_row_bf16_nb1", 0), g = find_launch(t, "mt_grouped_", 0);
  if (!a || q < 0 || g < 0) {
    CHECKF(0, "refresh %d, quantizer %d, GEMM %d", r, q, g);
    return r;
  }
  mt_wcheck_head *head = (mt_wcheck_head *)a->state;
  const mt_quant_params *qp = quant_args(q);
  const mt_grouped_kargs *k = (const mt_grouped_kargs *)event(g)->args;
  CHECK(q < r && r < g && event(r)->pdl && qp->dependents_after_wait && k->gen == &head->gen);
  CHECKF(a->chained == (beside ? MT_REFRESH_BESIDE : MT_REFRESH_CHAINED), "chained %d", a->chained);
  CHECK(qp->running == (beside ? &head->acts : NULL) && k->acts == qp->running);
  return r;
}

/* A strided batch under frozen: one store for the three weights (back to back), its refresh over
 * all of them (every round: the kernel finds what changed), in clusters of 16 CTAs (the function
 * allowed a non-portable size first: the fake refuses the launch otherwise), or of 8 where the
 * device runs none of 16 (FAKE_CUDA_MAX_CLUSTER=8), of one under frozen-sampled; 8 tokens a problem
 * (the GEMM beside the refresh), then 32 (the GEMM waiting for it). */
static void scenario_frozen_batch(void) {
  int tokens = 8;
  const unsigned step = cache_step();
  size_t sw = (size_t)OUT * IN, sx = (size_t)tokens * IN, sy = (size_t)OUT * tokens;
  uint16_t *w = matrix(sw * BATCH), *x = matrix(sx * BATCH), *y = matrix(sy * BATCH);
  set_stream(S1);
  for (int round = 0; round < 2; round++) {
    int t = now();
    CHECK(strided_call(hook_strided, tokens, w, x, &zero, y, BATCH));
    CHECK_TRACE(
        t, round ? BATCH_REFRESH " " BATCH_GEMM " record"
                 : "alloc memset104 alloc tmap " LOAD_ALL
                   " mt_quant_row_bf16_nb1+pdl mt_refresh_tensor_store_bf16+pdl smem " BATCH_GEMM
                   " record");
    int r = check_frozen_launches(t, w, step, 1);
    /* clusters of 16 CTAs (8 on a device that runs no cluster of 16; for a sample, as many as
     * give each warp one run of 32 lines: a slice of 256 x 512 has one run, so 1), as many as the
     * (fake) device runs at once: 2 for the 3 slices */
    const char *max = getenv("FAKE_CUDA_MAX_CLUSTER");
    const unsigned size = step > 1 ? 1 : max && atoi(max) < 16 ? 8 : 16;
    CHECKF(r >= 0 && event(r)->cluster == size && event(r)->grid[0] == size * 2 &&
               event(r)->block[0] * event(r)->block[1] % 32 == 0,
           "clusters of %u, grid %u, want clusters of %u", r >= 0 ? event(r)->cluster : 0,
           r >= 0 ? event(r)->grid[0] : 0, size);
  }
  uint16_t *x32 = matrix(4 * sx * BATCH), *y32 = matrix(4 * sy * BATCH);
  int t = now();
  CHECK(strided_call(hook_strided, 4 * tokens, w, x32, &zero, y32, BATCH));
  check_frozen_launches(t, w, step, 0);
  check_driver_clean();
  free(w), free(x), free(y), free(x32), free(y32);
}

/* --- weights stored [in][out] ----------------------------------------------------------------- */

/* The quantizer launch `name` since `from` reads W stored [in][out] at w: transposed (in_out), OUT
 * rows of IN of the logical matrix, stored rows of OUT (ldx). */
static const mt_quant_params *check_in_out_quant(int from, const char *name, const void *w) {
  const mt_quant_params *q = quant_args(find_launch(from, name, 0));
  CHECKF(q && q->in_out == 1 && q->x == w && q->ldx == OUT && q->cols == IN, "%s: in_out %d", name,
         q ? q->in_out : -1);
  return q;
}

/* Under frozen: x @ W with W stored [in][out] (NN, m = OUT, k = IN, lda = OUT) is routed, its
 * check hashes the stored rows (IN of OUT) and its quantizer reads W transposed; the same memory
 * read as an [out][in] weight (TN, lda = IN) is another entry; a strided batch of such weights
 * (XLA's capacity einsum) refreshes its store with the transposed read. */
static void scenario_in_out(void) {
  const int tokens = 8;
  size_t sw = (size_t)OUT * IN, sx = (size_t)tokens * IN, sy = (size_t)OUT * tokens;
  uint16_t *w = matrix(sw * BATCH), *x = matrix(sx * BATCH), *y = matrix(sy * BATCH);
  set_stream(S1);
  uint16_t *before = copy_of(y, sy);
  long calls = cublas_calls();
  int t = now();
  CHECK(hook_gemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, OUT, tokens, IN, &one, w, CUDA_R_16BF, OUT, x,
                  CUDA_R_16BF, IN, &zero, y, CUDA_R_16BF, OUT, CUBLAS_COMPUTE_32F,
                  CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
  CHECKF(cublas_calls() == calls, "the fake cuBLAS was called for a routed [in][out] forward");
  CHECK(marked(y, before, OUT, tokens, OUT));
  int wc = find_launch(t, "mt_wcheck", 0);
  const mt_wcheck_args *a = wc >= 0 ? (const mt_wcheck_args *)event(wc)->args : NULL;
  CHECKF(a && a->w == w && a->rows == IN && a->cols == OUT && a->ldw == OUT, "check %d x %d",
         a ? a->rows : -1, a ? a->cols : -1);
  const mt_quant_params *q = check_in_out_quant(t, "mt_quant_tensor_bf16", w);
  CHECK(q && q->rows == OUT && !q->batch_rows);
  /* the same address as an [out][in] weight: a second entry, read untransposed */
  t = now();
  CHECK(hook_gemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, OUT, tokens, IN, &one, w, CUDA_R_16BF, IN, x,
                  CUDA_R_16BF, IN, &zero, y, CUDA_R_16BF, OUT, CUBLAS_COMPUTE_32F,
                  CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
  CHECK(find_kind(t, FAKE_EV_ALLOC, 0) >= 0);
  q = quant_args(find_launch(t, "mt_quant_tensor_bf16", 0));
  CHECK(q && q->in_out == 0 && q->ldx == IN);
  /* a strided batch: one store, refreshed with the transposed read, slices IN x OUT apart */
  long long lsw = (long long)sw, lsx = (long long)sx, lsy = (long long)sy;
  for (int round = 0; round < 2; round++) {
    t = now();
    CHECK(hook_strided(handle, CUBLAS_OP_N, CUBLAS_OP_N, OUT, tokens, IN, &one, w, CUDA_R_16BF, OUT,
                       lsw, x, CUDA_R_16BF, IN, lsx, &zero, y, CUDA_R_16BF, OUT, lsy, BATCH,
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublas_calls() == calls);
    int r = find_launch(t, "mt_refresh_tensor_store_bf16", 0);
    const mt_refresh_args *ra = r >= 0 ? (const mt_refresh_args *)event(r)->args : NULL;
    CHECKF(ra && ra->q.in_out == 1 && ra->q.x == w && ra->q.ldx == OUT && ra->q.batch_rows == OUT &&
               ra->q.cols == IN && ra->q.batch_stride == lsw,
           "round %d: refresh in_out %d", round, ra ? ra->q.in_out : -1);
  }
  check_driver_clean();
  free(w), free(x), free(y), free(before);
}

/* --- a kept weight on several streams ------------------------------------------------------- */

#define S3 ((CUstream)(uintptr_t)0x3000)

static fake_cuda_fail_event_ops_fn fail_event_ops;

/* The kinds of the log that order a kept weight's calls, and its launches. */
static int order_kind(int kind) {
  return kind == FAKE_EV_WAIT || kind == FAKE_EV_RECORD || kind == FAKE_EV_LAUNCH;
}

/* The call since `from` waited for the weight's event on stream s (first, before any launch) when
 * `waits`, ran its launches on s and recorded the event on s last; the event, or 0. */
static uint64_t check_ordered(int from, CUstream s, int waits, uint64_t ev) {
  int first = from, last = now() - 1;
  while (first <= last && !order_kind(event(first)->kind))
    first++;
  const fake_cuda_event *w = first <= last ? event(first) : NULL, *r = event(last);
  CHECKF(!waits || (w && w->kind == FAKE_EV_WAIT && w->stream == s && (!ev || w->ptr == ev)),
         "no wait on the stream before the call's launches");
  CHECKF(waits || find_kind(from, FAKE_EV_WAIT, 0) < 0, "a wait where the last call was on the "
                                                        "same stream");
  CHECKF(r->kind == FAKE_EV_RECORD && r->stream == s && (!ev || r->ptr == ev),
         "the call's last event is not the weight's record on its stream");
  CHECK(find_kind(from, FAKE_EV_RECORD, 0) == last && all_on(from, s));
  return r->kind == FAKE_EV_RECORD ? r->ptr : 0;
}

static void *call_on_per_thread_stream(void *arg) {
  expect_routed((const problem *)arg, CU_STREAM_PER_THREAD, &zero);
  return NULL;
}

/* Calls on one kept weight, stream after stream: each records the weight's event on its stream
 * after its launches, and a call on another stream than the last one's waits for it first (two
 * threads' per-thread default streams are two streams); a new entry, or a captured call, neither
 * waits (a capture would join the other stream's work) nor records; a grouped store likewise. A
 * failed record waits for the stream instead; a failed wait sends the call to cuBLAS. */
static void scenario_streams(void) {
  problem p = make(OUT, 8, OUT), q = make(OUT, 8, OUT);
  fail_event_ops = (fake_cuda_fail_event_ops_fn)mt_t_sym(lib_cuda, "fake_cuda_fail_event_ops");
  int t = now();
  expect_routed(&p, S1, &zero);
  const uint64_t ev = check_ordered(t, S1, 0, 0);
  CHECK(ev != 0);
  t = now();
  expect_routed(&p, S1, &zero);
  CHECK_TRACE(t, "mt_wcheck " KEPT_QUANT " " KEPT_CALL " record");
  t = now();
  expect_routed(&p, S2, &zero);
  CHECK_TRACE(t, "alloc wait mt_wcheck " KEPT_QUANT " " KEPT_CALL " record");
  check_ordered(t, S2, 1, ev);
  t = now();
  expect_routed(&p, S2, &zero);
  check_ordered(t, S2, 0, ev);
  t = now();
  expect_routed(&p, S1, &zero);
  check_ordered(t, S1, 1, ev);
  t = now();
  expect_routed(&q, S2, &zero); /* a new entry: nothing to wait for */
  CHECK(check_ordered(t, S2, 0, 0) != ev);
  set_capturing(S3, 1);
  t = now();
  expect_routed(&p, S3, &zero);
  CHECK_TRACE(t, "alloc_async mt_wcheck " KEPT_QUANT " " KEPT_CALL " free_async");
  set_capturing(S3, 0);
  /* each thread's per-thread default stream: its own scratch, and a wait */
  t = now();
  expect_routed(&p, CU_STREAM_PER_THREAD, &zero);
  CHECK_TRACE(t, "alloc wait mt_wcheck " KEPT_QUANT " " KEPT_CALL " record");
  check_ordered(t, CU_STREAM_PER_THREAD, 1, ev);
  pthread_t other;
  t = now();
  CHECK(!pthread_create(&other, NULL, call_on_per_thread_stream, &p) && !pthread_join(other, NULL));
  CHECK_TRACE(t, "alloc wait mt_wcheck " KEPT_QUANT " " KEPT_CALL " record");
  check_ordered(t, CU_STREAM_PER_THREAD, 1, ev);
  /* a thread started after that one ended (glibc may give it the same stack): another stream */
  t = now();
  CHECK(!pthread_create(&other, NULL, call_on_per_thread_stream, &p) && !pthread_join(other, NULL));
  CHECK_TRACE(t, "alloc wait mt_wcheck " KEPT_QUANT " " KEPT_CALL " record");
  /* the record fails: the stream is waited for, and the next call has nothing to wait for */
  expect_routed(&p, S1, &zero);
  fail_event_ops(1);
  t = now();
  expect_routed(&p, S1, &zero);
  CHECK_TRACE(t, "mt_wcheck " KEPT_QUANT " " KEPT_CALL " record sync");
  t = now();
  expect_routed(&p, S2, &zero);
  check_ordered(t, S2, 0, ev);
  /* the wait fails: cuBLAS computes the call, nothing launched or recorded; the next one waits */
  fail_event_ops(1);
  t = now();
  expect_fallback(&p, S1, &zero);
  CHECK_TRACE(t, "wait");
  t = now();
  expect_routed(&p, S1, &zero);
  check_ordered(t, S1, 1, ev);
  /* a strided batch's store: the same order */
  const int tokens = 8;
  size_t sw = (size_t)OUT * IN, sx = (size_t)tokens * IN, sy = (size_t)OUT * tokens;
  uint16_t *w = matrix(sw * BATCH), *x = matrix(sx * BATCH), *y = matrix(sy * BATCH);
  set_stream(S1);
  t = now();
  CHECK(strided_call(hook_strided, tokens, w, x, &zero, y, BATCH));
  const uint64_t gev = check_ordered(t, S1, 0, 0);
  CHECK(gev != 0 && gev != ev);
  set_stream(S2);
  t = now();
  CHECK(strided_call(hook_strided, tokens, w, x, &zero, y, BATCH));
  /* S2's scratch already holds the call's needs: it took the kept weight's dequantized copy */
  CHECK_TRACE(t, "wait " BATCH_REFRESH " " BATCH_GEMM " record");
  check_ordered(t, S2, 1, gev);
  check_driver_clean();
  free(w), free(x), free(y);
  unmake(&p), unmake(&q);
}

enum { THREAD_CALLS = 64 };

/* A thread's calls on the shared weight: its own cuBLAS handle, stream and operands. */
typedef struct {
  const uint16_t *w;
  uint16_t *x, *y;
  CUstream stream;
  int routed;
} caller;

static void *calls_on(void *arg) {
  caller *c = arg;
  cublasHandle_t h;
  __typeof__(&cublasCreate_v2) create = (__typeof__(create))mt_t_sym(lib_cublas, "cublasCreate_v2");
  __typeof__(&cublasSetStream_v2) stream =
      (__typeof__(stream))dlsym(lib_cublas, "cublasSetStream_v2");
  if (create(&h) || stream(h, (cudaStream_t)c->stream))
    return NULL;
  for (int i = 0; i < THREAD_CALLS; i++)
    c->routed += hook_gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, OUT, 8, IN, &one, c->w, CUDA_R_16BF, IN,
                           c->x, CUDA_R_16BF, IN, &zero, c->y, CUDA_R_16BF, OUT, CUBLAS_COMPUTE_32F,
                           CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
  ((__typeof__(&cublasDestroy_v2))mt_t_sym(lib_cublas, "cublasDestroy_v2"))(h);
  return NULL;
}

/* Two threads call on one kept weight at once, each on its own stream: in the driver's log, every
 * call's launches lie between two records of the weight's event, on one stream, and a call on
 * another stream than the record before it starts with its wait (the kept-weight lock keeps one
 * thread's wait, launches and record together). */
static void scenario_streams_threads(void) {
  uint16_t *w = matrix((size_t)OUT * IN);
  caller c[2];
  pthread_t th[2];
  int t = now();
  for (int i = 0; i < 2; i++) {
    c[i] = (caller){w, matrix((size_t)8 * IN), matrix((size_t)8 * OUT), i ? S2 : S1, 0};
    CHECK(!pthread_create(&th[i], NULL, calls_on, &c[i]));
  }
  for (int i = 0; i < 2; i++)
    CHECK(!pthread_join(th[i], NULL) && c[i].routed == THREAD_CALLS);
  CUstream last = NULL, cur = NULL;
  int records = 0, switches = 0, waited = 0, bad = 0;
  for (int i = t; i < now(); i++) {
    const fake_cuda_event *e = event(i);
    if (e->kind == FAKE_EV_WAIT) {
      bad += cur != NULL || e->stream == last;
      switches += e->stream != last;
      waited = 1, cur = e->stream;
    } else if (e->kind == FAKE_EV_LAUNCH) {
      if (!cur) {
        bad += last && e->stream != last && !waited;
        cur = e->stream;
      }
      bad += e->stream != cur;
    } else if (e->kind == FAKE_EV_RECORD) {
      bad += e->stream != cur;
      records++, last = cur, cur = NULL, waited = 0;
    }
  }
  CHECKF(!bad && records == 2 * THREAD_CALLS, "%d events out of order, %d records", bad, records);
  /* one at least: the second thread's first call follows the first thread's record */
  CHECKF(switches >= 1, "the calls never changed stream");
  printf("#info stream switches %d\n", switches);
  check_driver_clean();
  free(w);
  for (int i = 0; i < 2; i++)
    free(c[i].x), free(c[i].y);
}

/* Stream i of scenario_many_streams (0x10000 on: no other scenario's). */
static CUstream nth_stream(int i) { return (CUstream)(uintptr_t)(0x10000 + 0x100 * i); }

/* More streams than a context keeps scratch for (shim/devmem.c, MAX_STREAMS = 64, RECLAIM_FROM =
 * 32): the first 31 take theirs and record nothing; from the 32nd each call's end is recorded on
 * its stream; the 65th finds every slot's last use unfinished (the fake's events held: not ready)
 * and falls back as "out of memory", then, the events done, takes an idle slot (the 32nd's, the
 * first recorded: no new allocation) and routes; the 32nd stream, whose slot went, takes another.
 * Each slot's memory is kept (the fake's allocations counted). */
static void scenario_many_streams(void) {
  problem p = make(OUT, 8, OUT);
  typedef void (*hold_fn)(int);
  hold_fn hold = (hold_fn)mt_t_sym(lib_cuda, "fake_cuda_hold_events");
  for (int i = 0; i < 64; i++) {
    const int t = now();
    expect_routed(&p, nth_stream(i), &zero);
    CHECKF(find_kind(t, FAKE_EV_ALLOC, 0) >= 0, "stream %d: no scratch of its own", i);
    CHECKF((find_kind(t, FAKE_EV_RECORD, 0) >= 0) == (i >= 31), "stream %d: %s its end", i,
           i >= 31 ? "did not record" : "recorded");
  }
  hold(1);
  int t = now();
  expect_fallback(&p, nth_stream(64), &zero);
  hold(0);
  t = now();
  expect_routed(&p, nth_stream(64), &zero);
  CHECKF(find_kind(t, FAKE_EV_ALLOC, 0) < 0, "stream 65 allocated instead of taking an idle slot");
  CHECKF(find_kind(t, FAKE_EV_RECORD, 0) >= 0, "stream 65 did not record its end");
  t = now();
  expect_routed(&p, nth_stream(31), &zero);
  CHECKF(find_kind(t, FAKE_EV_ALLOC, 0) < 0, "stream 32 allocated instead of taking an idle slot");
  t = now();
  expect_routed(&p, nth_stream(0), &zero); /* its own slot, untracked: nothing recorded */
  CHECKF(find_kind(t, FAKE_EV_ALLOC, 0) < 0 && find_kind(t, FAKE_EV_RECORD, 0) >= 0,
         "stream 1: its slot reallocated, or its end not recorded (the context is past 32)");
  unmake(&p);
}

/* An Lt strided batch (BATCH_COUNT, STRIDED_BATCH_OFFSET) with a bias per problem
 * (BIAS_BATCH_STRIDE): one grouped GEMM, each problem on its own operands and bias. */
static void scenario_lt_batch(void) {
  int tokens = 8;
  size_t sw = (size_t)OUT * IN, sx = (size_t)tokens * IN, sy = (size_t)OUT * tokens;
  uint16_t *w = matrix(sw * BATCH), *x = matrix(sx * BATCH), *y = matrix(sy * BATCH);
  uint16_t *bias = matrix((size_t)OUT * BATCH), *before = copy_of(y, sy * BATCH);
  const mt_t_lt_api api = mt_t_lt(lib_lt);
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t l[3];
  api.desc_create(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  int32_t ta = CUBLAS_OP_T, count = BATCH;
  uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
  int64_t bias_stride = OUT, strides[3] = {(int64_t)sw, (int64_t)sx, (int64_t)sy};
  api.desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  api.desc_set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
  api.desc_set(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
  api.desc_set(desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &bias_stride, sizeof bias_stride);
  api.layout_create(&l[0], CUDA_R_16BF, IN, OUT, IN);
  api.layout_create(&l[1], CUDA_R_16BF, IN, tokens, IN);
  api.layout_create(&l[2], CUDA_R_16BF, OUT, tokens, OUT);
  for (int i = 0; i < 3; i++) {
    api.layout_set(l[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count);
    api.layout_set(l[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i],
                   sizeof strides[i]);
  }
  char workspace[256];
  long calls = lt_calls();
  int t = now();
  CHECK(hook_lt(lt_handle, desc, &one, w, l[0], x, l[1], &zero, y, l[2], y, l[2], NULL, workspace,
                sizeof workspace, (cudaStream_t)S1) == CUBLAS_STATUS_SUCCESS);
  CHECKF(lt_calls() == calls, "the fake cublasLtMatmul was called for a routed batch");
  CHECK_TRACE(t, "alloc " LOAD_ALL " " BATCH_CALL " smem " BATCH_GEMM);
  CHECK(all_on(t, S1));
  check_grouped_args(t, y, sy, tokens, NULL, 0.0f, bias, OUT);
  for (int i = 0; i < BATCH; i++)
    CHECK(marked(y + i * sy, before + i * sy, OUT, tokens, OUT));
  api.desc_destroy(desc);
  for (int i = 0; i < 3; i++)
    api.layout_destroy(l[i]);
  check_driver_clean();
  free(w), free(x), free(y), free(bias), free(before);
}

/* The pointer-array forms (BatchedEx, GroupedBatchedEx, Lt POINTER_ARRAY batches) hold their
 * problems' pointers in device arrays: one grouped engine call whose quantizers read the weights'
 * and activations' bases from the arrays and whose GEMM writes each output through its pointer.
 * Nothing is read back to the host (no dtoh in any trace), capturing too; what the engine does not
 * take falls back as "pointer arrays". */
typedef struct {
  const void **a, **b;
  void **c;
  int count;
} arrays;

/* A pointer-array call's kernels, checked against its arrays: the weights' store from `a` (no
 * stride), the activations from `b` (rows each, or by `offs`), the outputs (and C) through `c`. */
static void check_array_args(int from, const arrays *p, int rows, int total, float beta) {
  int q = find_launch(from, "mt_quant_tensor_store_bf16", 0),
      x = find_launch(from, "mt_quant_row_bf16", 0), g = find_launch(from, "mt_grouped_", 0);
  CHECKF(q >= 0 && x > q && g > x, "store at %d, activations at %d, GEMM at %d", q, x, g);
  if (q < 0 || x < 0 || g < 0)
    return;
  const mt_quant_params *w = quant_args(q), *a = quant_args(x);
  const mt_grouped_kargs *k = (const mt_grouped_kargs *)event(g)->args;
  CHECK(w->batch_ptrs == (const void *const *)p->a && !w->x && w->batch_rows == OUT &&
        w->rows == p->count * OUT && w->store == k->ws);
  CHECK(a->batch_ptrs == (const void *const *)p->b && !a->x && a->ldx == IN && a->rows == total);
  CHECK(k->nseg == p->count && k->m == total && k->n == OUT && k->k == IN && !k->y && !k->c);
  CHECK(k->y_ptrs == (void *const *)p->c && k->ldy == OUT && k->beta == beta);
  CHECK(k->c_ptrs == (beta != 0.0f ? (const void *const *)p->c : NULL));
  if (rows) { /* the same rows for every problem: no table */
    CHECK(!k->offs && !a->batch_offs && a->batch_rows == rows && k->seg_rows == rows);
    CHECK(find_launch(from, "mt_seg_ends", 0) < 0);
  } else { /* the table, written on the device before the activations are read by it */
    int e = find_launch(from, "mt_seg_ends", 0);
    CHECKF(e >= 0 && e < x, "segment table at %d, activations at %d", e, x);
    CHECK(k->offs && a->batch_offs == k->offs && !a->batch_rows && a->nbatch == p->count);
    CHECK(k->seg_rows == 0 && is_device(k->offs, (size_t)p->count * 4));
  }
  CHECKF(find_kind(from, FAKE_EV_DTOH, 0) < 0 && find_kind(from, FAKE_EV_HTOD, 0) < 0,
         "a copy between host and device");
}

/* The problems' outputs: exactly the GEMM's rows in each, the rest as before. */
static void check_marked(const problem *p, uint16_t *const before[], int count) {
  for (int i = 0; i < count; i++)
    CHECKF(marked(p[i].y, before[i], OUT, p[i].tokens, OUT), "problem %d", i);
}

static void save_outputs(const problem *p, uint16_t *before[], int count) {
  for (int i = 0; i < count; i++)
    before[i] = copy_of(p[i].y, (size_t)OUT * p[i].tokens);
}

static void free_all(uint16_t *v[], int count) {
  for (int i = 0; i < count; i++)
    free(v[i]);
}

static cublasStatus_t call_batched(const arrays *x, const float *beta) {
  return hook_batched(handle, CUBLAS_OP_T, CUBLAS_OP_N, OUT, 8, IN, &one, (const void *const *)x->a,
                      CUDA_R_16BF, IN, (const void *const *)x->b, CUDA_R_16BF, IN, beta, x->c,
                      CUDA_R_16BF, OUT, x->count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

/* Two groups: one problem of n0 tokens, then two of n1; group 1's ldc and alpha as given. */
static cublasStatus_t call_grouped(const arrays *x, int n0, int n1, int ldc1, float alpha1) {
  cublasOperation_t ta[2] = {CUBLAS_OP_T, CUBLAS_OP_T}, tb[2] = {CUBLAS_OP_N, CUBLAS_OP_N};
  int m[2] = {OUT, OUT}, n[2] = {n0, n1}, k[2] = {IN, IN}, ld[2] = {IN, IN}, ldc[2] = {OUT, ldc1};
  int size[2] = {1, 2};
  float alpha[2] = {1.0f, alpha1}, beta[2] = {0.0f, 0.0f};
  return hook_grouped(handle, ta, tb, m, n, k, alpha, (const void *const *)x->a, CUDA_R_16BF, ld,
                      (const void *const *)x->b, CUDA_R_16BF, ld, beta, x->c, CUDA_R_16BF, ldc, 2,
                      size, CUBLAS_COMPUTE_32F);
}

/* The problems' arrays of pointers in a page of their own, which guard() makes unreadable to the
 * host but for the fake's kernels (the GPU's reads): a host read of them crashes the child. */
static arrays arrays_of(const problem *p) {
  void **page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  arrays x = {(const void **)page, (const void **)page + BATCH, page + 2 * BATCH, BATCH};
  for (int i = 0; i < BATCH; i++)
    x.a[i] = p[i].w, x.b[i] = p[i].x, x.c[i] = p[i].y;
  return x;
}

static void guard(const arrays *x, int on) { guard_pages((void *)x->a, 4096, on); }

static void arrays_free(arrays *x) { munmap((void *)x->a, 4096); }

/* cublasGemmBatchedEx: beta != 0 (C through the output array), then beta 0 while capturing. */
static void arrays_batched(void) {
  problem p[BATCH] = {make(OUT, 8, OUT), make(OUT, 8, OUT), make(OUT, 8, OUT)};
  arrays x = arrays_of(p);
  uint16_t *before[BATCH];
  save_outputs(p, before, BATCH);
  long calls = cublas_calls();
  int t = now();
  guard(&x, 1);
  CHECK(call_batched(&x, &half) == CUBLAS_STATUS_SUCCESS);
  CHECKF(cublas_calls() == calls, "the fake cuBLAS was called for a routed pointer-array batch");
  CHECK_TRACE(t, "alloc " LOAD_ALL " " ARRAYS_CALL " smem " BATCH_GEMM);
  check_array_args(t, &x, 8, BATCH * 8, 0.5f);
  check_marked(p, before, BATCH);
  free_all(before, BATCH);
  set_capturing(S1, 1);
  save_outputs(p, before, BATCH);
  t = now();
  CHECK(call_batched(&x, &zero) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublas_calls() == calls);
  CHECK_TRACE(t, "alloc_async " ARRAYS_CALL " " BATCH_GEMM " free_async");
  check_array_args(t, &x, 8, BATCH * 8, 0.0f);
  check_marked(p, before, BATCH);
  set_capturing(S1, 0);
  guard(&x, 0);
  free_all(before, BATCH);
  arrays_free(&x);
  for (int i = 0; i < BATCH; i++)
    unmake(&p[i]);
}

/* cublasGemmGroupedBatchedEx: rows differing by group (a segment table written on the device,
 * capturing too), the same rows (a uniform batch), and groups that disagree (cuBLAS). */
static void arrays_grouped(void) {
  problem g[BATCH] = {make(OUT, 8, OUT), make(OUT, 72, OUT), make(OUT, 72, OUT)};
  arrays x = arrays_of(g);
  uint16_t *before[BATCH];
  long calls = cublas_calls();
  guard(&x, 1);
  for (int capturing = 0; capturing < 2; capturing++) {
    set_capturing(S1, capturing);
    save_outputs(g, before, BATCH);
    int t = now();
    CHECK(call_grouped(&x, 8, 72, OUT, 1.0f) == CUBLAS_STATUS_SUCCESS);
    CHECK(cublas_calls() == calls);
    check_array_args(t, &x, 0, 8 + 2 * 72, 0.0f);
    int e = find_launch(t, "mt_grouped_", 0);
    const int32_t *offs = e >= 0 ? ((const mt_grouped_kargs *)event(e)->args)->offs : NULL;
    CHECKF(offs && offs[0] == 8 && offs[1] == 80 && offs[2] == 152, "the segment table");
    CHECK(mt_t_count_of(trace(t), "alloc_async") == capturing);
    check_marked(g, before, BATCH);
    free_all(before, BATCH);
  }
  set_capturing(S1, 0);
  /* every group 8 rows: a uniform batch */
  save_outputs(g, before, BATCH);
  int t = now();
  CHECK(call_grouped(&x, 8, 8, OUT, 1.0f) == CUBLAS_STATUS_SUCCESS);
  CHECK(cublas_calls() == calls);
  check_array_args(t, &x, 8, BATCH * 8, 0.0f);
  for (int i = 0; i < BATCH; i++)
    CHECKF(marked(g[i].y, before[i], OUT, 8, OUT), "problem %d", i);
  free_all(before, BATCH);
  guard(&x, 0); /* the fake cuBLAS reads them on the host */
  /* groups of other alphas or another ldc: cuBLAS, nothing enqueued */
  t = now();
  CHECK(call_grouped(&x, 8, 72, OUT, 2.0f) == CUBLAS_STATUS_SUCCESS);
  CHECK(call_grouped(&x, 8, 8, OUT + 8, 1.0f) == CUBLAS_STATUS_SUCCESS);
  CHECK_TRACE(t, "");
  CHECK(cublas_calls() == calls + 2);
  arrays_free(&x);
  for (int i = 0; i < BATCH; i++)
    unmake(&g[i]);
}

/* cublasLtMatmul with every layout POINTER_ARRAY (routed); one layout strided, or a bias: cuBLAS
 * (whose fake refuses pointer arrays: the forwarded call's status comes back). */
static void arrays_lt(void) {
  problem p[BATCH] = {make(OUT, 8, OUT), make(OUT, 8, OUT), make(OUT, 8, OUT)};
  arrays x = arrays_of(p);
  const mt_t_lt_api api = mt_t_lt(lib_lt);
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t l[3];
  api.desc_create(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  int32_t ta = CUBLAS_OP_T, count = BATCH;
  uint32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY, strided = CUBLASLT_BATCH_MODE_STRIDED;
  api.desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  api.layout_create(&l[0], CUDA_R_16BF, IN, OUT, IN);
  api.layout_create(&l[1], CUDA_R_16BF, IN, 8, IN);
  api.layout_create(&l[2], CUDA_R_16BF, OUT, 8, OUT);
  for (int i = 0; i < 3; i++) {
    api.layout_set(l[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count);
    api.layout_set(l[i], CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof mode);
  }
  char workspace[256];
  uint16_t *before[BATCH];
  save_outputs(p, before, BATCH);
  long calls = lt_calls();
  int t = now();
  guard(&x, 1);
  CHECK(hook_lt(lt_handle, desc, &one, x.a, l[0], x.b, l[1], &zero, x.c, l[2], x.c, l[2], NULL,
                workspace, sizeof workspace, (cudaStream_t)S1) == CUBLAS_STATUS_SUCCESS);
  guard(&x, 0);
  CHECKF(lt_calls() == calls, "the fake cublasLtMatmul was called for a routed batch");
  CHECK(all_on(t, S1));
  check_array_args(t, &x, 8, BATCH * 8, 0.0f);
  check_marked(p, before, BATCH);
  free_all(before, BATCH);
  /* A strided, B, C and D pointer arrays: not one form */
  api.layout_set(l[0], CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &strided, sizeof strided);
  t = now();
  CHECK(hook_lt(lt_handle, desc, &one, p[0].w, l[0], x.b, l[1], &zero, x.c, l[2], x.c, l[2], NULL,
                workspace, sizeof workspace, (cudaStream_t)S1) == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(lt_calls() == calls + 1);
  /* a bias with pointer-array batches */
  api.layout_set(l[0], CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof mode);
  uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
  api.desc_set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
  CHECK(hook_lt(lt_handle, desc, &one, x.a, l[0], x.b, l[1], &zero, x.c, l[2], x.c, l[2], NULL,
                workspace, sizeof workspace, (cudaStream_t)S1) == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(lt_calls() == calls + 2);
  CHECK_TRACE(t, "");
  api.desc_destroy(desc);
  for (int i = 0; i < 3; i++)
    api.layout_destroy(l[i]);
  arrays_free(&x);
  for (int i = 0; i < BATCH; i++)
    unmake(&p[i]);
}

static void scenario_arrays(void) {
  set_stream(S1);
  arrays_batched();
  arrays_grouped();
  arrays_lt();
  check_driver_clean();
}

/* A grouped call whose groups hold one problem each with beta != 0, its one grouped GEMM launch
 * failing (FAKE_CUDA_FAIL_LAUNCH=mt_grouped_n16:1): nothing was written, so cuBLAS computes every
 * problem from its C as it came. */
static void scenario_grouped_beta_partial(void) {
  int tokens = 8;
  problem p[2] = {make(OUT, tokens, OUT), make(OUT, tokens, OUT)};
  uint16_t *want[2] = {reference(&p[0], &half), reference(&p[1], &half)};
  cublasOperation_t ta[2] = {CUBLAS_OP_T, CUBLAS_OP_T}, tb[2] = {CUBLAS_OP_N, CUBLAS_OP_N};
  int m[2] = {OUT, OUT}, n[2] = {tokens, tokens}, k[2] = {IN, IN}, ld[2] = {IN, IN};
  int ldc[2] = {OUT, OUT}, size[2] = {1, 1};
  float alpha[2] = {1.0f, 1.0f}, beta[2] = {0.5f, 0.5f};
  const void *ga[2] = {p[0].w, p[1].w}, *gb[2] = {p[0].x, p[1].x};
  void *gc[2] = {p[0].y, p[1].y};
  set_stream(S1);
  CHECK(hook_grouped(handle, ta, tb, m, n, k, alpha, ga, CUDA_R_16BF, ld, gb, CUDA_R_16BF, ld, beta,
                     gc, CUDA_R_16BF, ldc, 2, size, CUBLAS_COMPUTE_32F) == CUBLAS_STATUS_SUCCESS);
  CHECKF(!memcmp(p[0].y, want[0], (size_t)OUT * tokens * 2),
         "problem 0: cuBLAS recomputed it from an output the engine had overwritten");
  CHECK(!memcmp(p[1].y, want[1], (size_t)OUT * tokens * 2));
  unmake(&p[0]), unmake(&p[1]), free(want[0]), free(want[1]);
}

/* The quantizer's CTA shapes (kernels/quant.c) where its caps start to bind and just before,
 * launched by this program's own engine (linked from libmt.a beside the preloaded shim, on the
 * same fake driver): most of these shapes no routed call of the tests reaches (8192 rows and more,
 * rows of more than 4096 blocks), and only the driver sees a launch's shape. Per-tensor S: the
 * amax pass runs a warp a row over at most 8192 warps (1024 CTAs of 256 threads); the quantizer's
 * CTAs are of 256 threads, a row over at most 256 threads of one and the rest of it over grid y
 * (a thread a block of 16, rows of fewer than 256 blocks sharing a CTA). Per-row S:
 * a row of up to 512 threads, one block of 16 a thread while that holds and then 2, 4 or 8 (past
 * 8 the shape is refused); CTAs of 256 threads, or of 128 over more than 512 rows, where a row
 * takes at most 128 threads (2 blocks a thread where that fills them no worse than 4). */
static void scenario_quant_shapes(void) {
  static const struct {
    int rows, cols, row_outer;
    const char *name;
    unsigned grid[2], block[2];
  } want[] = {
      {8184, 16, 0, "mt_quant_amax_bf16", {1023, 1}, {256, 1}},
      {8192, 16, 0, "mt_quant_amax_bf16", {1024, 1}, {256, 1}},
      {8193, 16, 0, "mt_quant_amax_bf16", {1024, 1}, {256, 1}},
      {65536, 16, 0, "mt_quant_amax_bf16", {1024, 1}, {256, 1}},
      {16, 2048, 0, "mt_quant_tensor_bf16", {8, 1}, {128, 2}},
      {16, 4080, 0, "mt_quant_tensor_bf16", {16, 1}, {256, 1}},
      {16, 4096, 0, "mt_quant_tensor_bf16", {16, 1}, {256, 1}},
      {16, 4112, 0, "mt_quant_tensor_bf16", {16, 2}, {256, 1}},
      {4, 8192, 1, "mt_quant_row_bf16_nb1", {4, 1}, {512, 1}},
      {4, 8208, 1, "mt_quant_row_bf16_nb2", {4, 1}, {288, 1}},
      {4, 65536, 1, "mt_quant_row_bf16_nb8", {4, 1}, {512, 1}},
      {512, 512, 1, "mt_quant_row_bf16_nb1", {64, 1}, {32, 8}},
      {513, 512, 1, "mt_quant_row_bf16_nb4", {33, 1}, {8, 16}},
      {1024, 4096, 1, "mt_quant_row_bf16_nb2", {1024, 1}, {128, 1}},
      {1024, 4112, 1, "mt_quant_row_bf16_nb4", {1024, 1}, {96, 1}},
      {1024, 8192, 1, "mt_quant_row_bf16_nb4", {1024, 1}, {128, 1}},
      {1024, 8208, 1, "mt_quant_row_bf16_nb8", {1024, 1}, {96, 1}},
  };
  CUresult (*mem_alloc)(CUdeviceptr *, size_t) =
      (CUresult(*)(CUdeviceptr *, size_t))mt_t_sym(lib_cuda, "cuMemAlloc_v2");
  CUdeviceptr amax = 0;
  CHECK(mem_alloc && mem_alloc(&amax, 4) == CUDA_SUCCESS);
  static _Alignas(256) unsigned char fake[256]; /* never read: the fake computes no quantizer */
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
    mt_quant_params q = {.x = fake,
                         .ldx = want[i].cols,
                         .rows = want[i].rows,
                         .cols = want[i].cols,
                         .row_outer = want[i].row_outer,
                         .xhat = (uint16_t *)fake,
                         .outer = (float *)fake,
                         .amax = (uint32_t *)(uintptr_t)amax};
    const int t = now(), st = mt_quantize(&q, 0, (mt_stream)S1);
    const int l = mt_t_find_launch(t, want[i].name, 0, 0), last = now() - 1;
    static const fake_cuda_event none = {.name = "nothing launched"};
    const fake_cuda_event *e = l >= 0 ? event(l) : last >= t ? event(last) : &none;
    const int ok = st == MT_OK && l >= 0 && e->grid[0] == want[i].grid[0] &&
                   e->grid[1] == want[i].grid[1] && e->block[0] == want[i].block[0] &&
                   e->block[1] == want[i].block[1];
    CHECKF(ok, "%d x %d: %s, %s grid %u x %u block %u x %u, want %s %u x %u and %u x %u",
           want[i].rows, want[i].cols, mt_status_name((enum mt_status)st), e->name, e->grid[0],
           e->grid[1], e->block[0], e->block[1], want[i].name, want[i].grid[0], want[i].grid[1],
           want[i].block[0], want[i].block[1]);
  }
  /* rows of 4097 blocks would need 16 a thread: refused before anything is launched */
  mt_quant_params wide = {.x = fake, .ldx = 65552, .rows = 4, .cols = 65552, .row_outer = 1};
  const int t = now();
  CHECK(mt_quantize(&wide, 0, (mt_stream)S1) == MT_ERR_UNSUPPORTED && now() == t);
  check_driver_clean();
}

/* The weight cache's summary part (mt_wcache_summary's emit), kept in a buffer of 4096 bytes. */
static void append_text(void *ctx, const char *text) {
  strncat((char *)ctx, text, 4095 - strlen((char *)ctx));
}

/* A kept weight's entry is keyed by the numerics it was quantized under (shim/wcache.c, same_num):
 * the same weight under another act_scale, weight_scale or weight_block is another entry, each
 * found again under its own numerics; so is a grouped call's store. A process's shim has one spec,
 * so no two routed calls on one weight differ in numerics: this program's own weight cache (linked
 * from libmt.a beside the preloaded shim's, on the same fake driver) is called directly. */
static void scenario_frozen_numerics(void) {
  mt_spec spec;
  CHECK(mt_spec_builtin("nvfp4-row", &spec) == 0);
  mt_params params;
  mt_params_read(&params);
  params.weight_cache = MT_WCACHE_FROZEN;
  mt_wcache_init(&params);
  static const mt_numerics nums[] = {{MT_SCALE_ROW, MT_SCALE_TENSOR, MT_WBLOCK_1X16},
                                     {MT_SCALE_TENSOR, MT_SCALE_TENSOR, MT_WBLOCK_1X16},
                                     {MT_SCALE_ROW, MT_SCALE_ROW, MT_WBLOCK_1X16},
                                     {MT_SCALE_ROW, MT_SCALE_TENSOR, MT_WBLOCK_16X16}};
  enum { NUMS = sizeof nums / sizeof nums[0] };
  uint16_t *w = matrix((size_t)OUT * IN);
  const void *kept[2][NUMS]; /* the entries found: one weight's, a grouped call's store */
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < NUMS; i++) {
      const mt_weight_ref ref = {
          .w = w, .n = OUT, .k = IN, .ldw = IN, .type = MT_DTYPE_BF16, .num = nums[i]};
      mt_engine_mem m;
      CHECK(mt_wcache_prepare(&ref, 8, (mt_stream)S1, 0, &m) == MT_R_ROUTED);
      CHECKF(m.q && m.q != &m.own && !memcmp(&m.q->num, &nums[i], sizeof nums[i]),
             "numerics %d: not the kept weight's entry, or under other numerics", i);
      const void *found[2] = {m.q, NULL};
      mt_wcache_release(&m.hold); /* the context's kept-weight lock, which the next call takes */
      const mt_wgroup_ref all = {
          .w = w, .groups = 2, .n = OUT, .k = IN, .ldw = IN, .type = MT_DTYPE_BF16, .num = nums[i]};
      mt_grouped_mem g;
      CHECK(mt_wcache_prepare_grouped(&all, 16, (mt_stream)S1, 0, &g) == MT_R_ROUTED);
      CHECKF(g.refresh.ws && !memcmp(&g.store.num, &nums[i], sizeof nums[i]),
             "numerics %d: no grouped entry, or under other numerics", i);
      found[1] = g.store.base;
      mt_wcache_release(&g.hold);
      for (int k = 0; k < 2; k++) {
        if (pass == 0)
          for (int j = 0; j < i; j++)
            CHECKF(kept[k][j] != found[k], "%s: numerics %d and %d share an entry",
                   k ? "grouped" : "one weight", j, i);
        else
          CHECKF(kept[k][i] == found[k], "%s: numerics %d found another entry the second time",
                 k ? "grouped" : "one weight", i);
        kept[k][i] = found[k];
      }
    }
  char summary[4096] = "";
  mt_wcache_summary(append_text, summary);
  CHECKF(strstr(summary, "\"frozen_weights\": 8,"), "%s", summary);
  check_driver_clean();
  free(w);
}

static const mt_t_scenario scenarios[] = {
    {"requantize", scenario_requantize},
    {"lt", scenario_lt},
    {"refused", scenario_refused},
    {"frozen", scenario_frozen},
    {"frozen_stride", scenario_frozen_stride},
    {"frozen_batch", scenario_frozen_batch},
    {"in_out", scenario_in_out},
    {"capture", scenario_capture},
    {"capture_module", scenario_capture_module},
    {"kpair", scenario_kpair},
    {"oom", scenario_oom},
    {"launch_fail", scenario_launch_fail},
    {"no_engine", scenario_no_engine},
    {"strided", scenario_strided},
    {"split", scenario_split},
    {"split_fail", scenario_split_fail},
    {"lt_batch", scenario_lt_batch},
    {"arrays", scenario_arrays},
    {"fp16", scenario_fp16},
    {"frozen_capture", scenario_frozen_capture},
    {"streams", scenario_streams},
    {"many_streams", scenario_many_streams},
    {"streams_threads", scenario_streams_threads},
    {"weight_quant_fail", scenario_weight_quant_fail},
    {"frozen_quant_fail", scenario_frozen_quant_fail},
    {"grouped_beta_partial", scenario_grouped_beta_partial},
    {"quant_shapes", scenario_quant_shapes},
    {"frozen_numerics", scenario_frozen_numerics},
};

static int load_all(const char *build) { return load_fakes(build, 1); }

/* ======================================================================================== */
/* The parent: a child per scenario, its stderr and statistics.                              */
/* ======================================================================================== */

/* Scenario `name` with the defaults of tests/cpu/scenario.h and `env` ("K=V", NULL-terminated). */
static void run_child(const char *name, const char *const env[], mt_t_child *r) {
  mt_t_run_child(name, name, env, r);
}

static long json_int(const char *s, const char *key) { return mt_t_json_int_in(s, NULL, key); }

/* The summary's routed calls and fallbacks: `reasons` is "name=N" strings, NULL-terminated;
 * every other reason must be absent. */
static void check_counts(const mt_t_child *r, long routed, const char *const reasons[]) {
  static const char *const all[] = {"capture", "out of memory", "engine error",   "no engine",
                                    "layout",  "dtype",         "pointer arrays", NULL};
  CHECKF(r->summary, "no summary record");
  if (!r->summary)
    return;
  CHECKF(json_int(r->summary, "routed") == routed, "routed %ld, want %ld",
         json_int(r->summary, "routed"), routed);
  for (int i = 0; all[i]; i++) {
    long want = 0;
    for (int j = 0; reasons && reasons[j]; j++)
      if (!strncmp(reasons[j], all[i], strlen(all[i])) && reasons[j][strlen(all[i])] == '=')
        want = atol(reasons[j] + strlen(all[i]) + 1);
    CHECKF(mt_t_fallback(r->summary, all[i]) == want, "%s: %ld, want %ld", all[i],
           mt_t_fallback(r->summary, all[i]), want);
  }
}

static void requantize_kernels_in_order(void) {
  mt_t_child r;
  run_child("requantize", NULL, &r);
  mt_t_check_child("requantize", &r);
  check_counts(&r, 7, NULL);
  CHECKF(r.err && !r.err[0], "stderr: %s", r.err);
  CHECK(r.summary && strstr(r.summary, "\"engine\": {\"weight_cache\": \"requantize\""));
  CHECKF(json_int(r.summary, "device_bytes") == mt_t_info(&r, "device_bytes") &&
             mt_t_info(&r, "device_bytes") > 0,
         "device_bytes %ld, the fake holds %ld", json_int(r.summary, "device_bytes"),
         mt_t_info(&r, "device_bytes"));
  CHECK(json_int(r.summary, "frozen_weights") == 0 && json_int(r.summary, "cache_full") == 0);
  mt_t_child_free(&r);
}

static void lt_routed_with_bias(void) {
  mt_t_child r;
  run_child("lt", NULL, &r);
  mt_t_check_child("lt", &r);
  check_counts(&r, 3, NULL);
  mt_t_child_free(&r);
}

/* A frozen grouped weight: routed three times, one entry, and the summary's bytes an element of the
 * stores (kernels/wstore.h: 4.5 bits and the padding of rows and columns). */
static void frozen_grouped_store(void) {
  const char *env[] = {"MINITE_WEIGHT_CACHE=frozen", NULL};
  mt_t_child r;
  run_child("frozen_batch", env, &r);
  mt_t_check_child("frozen_batch", &r);
  check_counts(&r, 3, NULL);
  CHECKF(json_int(r.summary, "frozen_weights") == 1, "%ld", json_int(r.summary, "frozen_weights"));
  double want = (double)((MT_WS_SLICE_BYTES(OUT, IN, 0) * BATCH + 255) / 256 * 256) /
                ((double)BATCH * OUT * IN);
  const char *at = r.summary ? strstr(r.summary, "\"store_bytes_per_element\": ") : NULL;
  double got = at ? atof(at + strlen("\"store_bytes_per_element\": ")) : -1;
  CHECKF(got > 0.5625 && got < 0.6 && fabs(got - want) < 1e-4, "%g bytes an element, want %g", got,
         want);
  mt_t_child_free(&r);
  /* a device that runs no cluster of 16: the refresh's clusters are of 8 */
  const char *eight[] = {"MINITE_WEIGHT_CACHE=frozen", "FAKE_CUDA_MAX_CLUSTER=8", NULL};
  run_child("frozen_batch", eight, &r);
  mt_t_check_child("frozen_batch, clusters of 8", &r);
  check_counts(&r, 3, NULL);
  mt_t_child_free(&r);
  /* a sampled refresh: clusters of one CTA (the sample's one run of lines a slice) */
  const char *sampled[] = {"MINITE_WEIGHT_CACHE=frozen-sampled", NULL};
  run_child("frozen_batch", sampled, &r);
  mt_t_check_child("frozen_batch, frozen-sampled", &r);
  check_counts(&r, 3, NULL);
  mt_t_child_free(&r);
}

/* frozen-sampled: the same entries, the check reading one 128-byte line in each run of
 * MT_SAMPLE_STEP (scenario_frozen checks the step), and the summary names the mode. */
static void frozen_sampled_checks_a_sample(void) {
  const char *env[] = {"MINITE_WEIGHT_CACHE=frozen-sampled", "MINITE_CACHE_MB=1", NULL};
  mt_t_child r;
  run_child("frozen", env, &r);
  mt_t_check_child("frozen", &r);
  check_counts(&r, 5, NULL);
  CHECK(r.summary && strstr(r.summary, "\"engine\": {\"weight_cache\": \"frozen-sampled\""));
  mt_t_child_free(&r);
}

/* The sampled check's lines (kernels/whash.h): runs of MT_WHASH_RUN consecutive lines, one run
 * in each group of MT_SAMPLE_STEP runs, at an offset that moves from group to group (so that a
 * sample covers every column over the rows); the items cover every group of a slice and no line
 * twice; step 1 takes every line. */
static void sampled_lines_cover_the_runs(void) {
  int offsets[MT_SAMPLE_STEP] = {0}, distinct = 0;
  const uint64_t lines = 4096 * MT_WHASH_RUN * MT_SAMPLE_STEP + 5; /* a short last group */
  const uint64_t items = mt_whash_items(lines, MT_SAMPLE_STEP);
  CHECK(items == 4097 * MT_WHASH_RUN && mt_whash_items(lines, 1) == lines);
  uint64_t last = 0;
  for (uint64_t i = 0; i < items; i++) {
    const uint64_t line = mt_whash_line(i, MT_SAMPLE_STEP), run = line / MT_WHASH_RUN;
    CHECKF(run / MT_SAMPLE_STEP == i / MT_WHASH_RUN && line % MT_WHASH_RUN == i % MT_WHASH_RUN,
           "item %llu: line %llu", (unsigned long long)i, (unsigned long long)line);
    CHECK(i == 0 || line > last); /* increasing: no line twice */
    last = line;
    if (i % MT_WHASH_RUN == 0 && i / MT_WHASH_RUN < 4096)
      distinct += !offsets[run % MT_SAMPLE_STEP]++;
    CHECK(mt_whash_line(i, 1) == i);
  }
  CHECKF(distinct == MT_SAMPLE_STEP, "%d of %d offsets taken", distinct, MT_SAMPLE_STEP);
}

/* scenario_refused: five calls with the reason "layout" (NULL scalars, an Lt B shape or handle
 * cuBLASLt refuses), the op that is no op and the Lt A of another m unrouted, one routed. */
static void refused_calls_reach_cublas(void) {
  mt_t_child r;
  run_child("refused", NULL, &r);
  mt_t_check_child("refused", &r);
  const char *reasons[] = {"layout=5", NULL};
  check_counts(&r, 1, reasons);
  mt_t_child_free(&r);
}

/* Scenario `name` under frozen: its checks pass, `calls` calls, `weights` kept weights. */
static void frozen_child(const char *name, int calls, long weights) {
  const char *env[] = {"MINITE_WEIGHT_CACHE=frozen", NULL};
  mt_t_child r;
  run_child(name, env, &r);
  mt_t_check_child(name, &r);
  check_counts(&r, calls, NULL);
  CHECKF(json_int(r.summary, "frozen_weights") == weights, "%s: %ld", name,
         json_int(r.summary, "frozen_weights"));
  mt_t_child_free(&r);
}

static void frozen_entries_by_row_stride(void) { frozen_child("frozen_stride", 3, 2); }

static void frozen_weights_stored_in_out(void) { frozen_child("in_out", 4, 3); }

static void frozen_entries_and_cache_full(void) {
  const char *env[] = {"MINITE_WEIGHT_CACHE=frozen", "MINITE_CACHE_MB=1", NULL};
  mt_t_child r;
  run_child("frozen", env, &r);
  mt_t_check_child("frozen", &r);
  check_counts(&r, 5, NULL);
  CHECK(r.summary && strstr(r.summary, "\"engine\": {\"weight_cache\": \"frozen\""));
  CHECKF(json_int(r.summary, "frozen_weights") == 2, "%ld", json_int(r.summary, "frozen_weights"));
  CHECKF(json_int(r.summary, "cache_full") == 2, "%ld", json_int(r.summary, "cache_full"));
  /* two calls past the bound, one warning, which names the bound and its variable */
  CHECKF(mt_t_count_of(r.err, "the weight cache is full") == 1 &&
             strstr(r.err, "(1 MiB of MINITE_CACHE_MB on this GPU: raise it)"),
         "stderr: %s", r.err);
  CHECKF(json_int(r.summary, "device_bytes") == mt_t_info(&r, "device_bytes"),
         "%ld, the fake holds %ld", json_int(r.summary, "device_bytes"),
         mt_t_info(&r, "device_bytes"));
  mt_t_child_free(&r);
}

static void capture_falls_back_until_warm(void) {
  mt_t_child r;
  run_child("capture", NULL, &r);
  mt_t_check_child("capture", &r);
  const char *reasons[] = {"capture=1", NULL};
  check_counts(&r, 4, reasons);
  CHECKF(json_int(r.summary, "captured_calls") == 3, "%ld", json_int(r.summary, "captured_calls"));
  mt_t_child_free(&r);
}

static void capture_before_module_load(void) {
  mt_t_child r;
  run_child("capture_module", NULL, &r);
  mt_t_check_child("capture_module", &r);
  const char *reasons[] = {"capture=1", "engine error=1", NULL};
  check_counts(&r, 1, reasons);
  mt_t_child_free(&r);
}

static void kpair_maps_and_their_refusal(void) {
  const char *refuse[] = {"FAKE_CUDA_MAP_RANK=2", NULL};
  const char *const *envs[] = {NULL, refuse};
  for (int i = 0; i < 2; i++) {
    mt_t_child r;
    run_child("kpair", envs[i], &r);
    mt_t_check_child("kpair", &r);
    check_counts(&r, 2, NULL);
    CHECKF(mt_t_count_of(r.err, " minite WARN ") == 0, "stderr: %s", r.err);
    mt_t_child_free(&r);
  }
}

static void out_of_memory_warns_once(void) {
  const char *env[] = {"FAKE_CUDA_MEM_LIMIT=4096", NULL};
  mt_t_child r;
  run_child("oom", env, &r);
  mt_t_check_child("oom", &r);
  const char *reasons[] = {"out of memory=2", NULL};
  check_counts(&r, 1, reasons);
  CHECKF(mt_t_count_of(r.err, " minite WARN ") == 1 && strstr(r.err, "out of memory"), "stderr: %s",
         r.err);
  mt_t_child_free(&r);
}

static void launch_failure_is_engine_error(void) {
  const char *env[] = {"FAKE_CUDA_FAIL_LAUNCH=mt_gemm_large_m64_n32:1", NULL};
  mt_t_child r;
  run_child("launch_fail", env, &r);
  mt_t_check_child("launch_fail", &r);
  const char *reasons[] = {"engine error=2", NULL};
  check_counts(&r, 1, reasons);
  CHECKF(mt_t_count_of(r.err, " minite WARN ") == 1 && strstr(r.err, "CUDA error"), "stderr: %s",
         r.err);
  mt_t_child_free(&r);
}

static void no_context_or_not_sm90_is_no_engine(void) {
  const char *no_ctx[] = {"FAKE_CUDA_NO_CONTEXT=1", NULL};
  const char *sm80[] = {"FAKE_CUDA_CC=8.0", NULL};
  const char *const *envs[] = {no_ctx, sm80};
  for (int i = 0; i < 2; i++) {
    mt_t_child r;
    run_child("no_engine", envs[i], &r);
    mt_t_check_child("no_engine", &r);
    const char *reasons[] = {"no engine=2", NULL};
    check_counts(&r, 0, reasons);
    mt_t_child_free(&r);
  }
}

static void strided_batched(void) {
  mt_t_child r;
  run_child("strided", NULL, &r);
  mt_t_check_child("strided", &r);
  check_counts(&r, 3, NULL);
  mt_t_child_free(&r);
}

static void lt_strided_batch(void) {
  mt_t_child r;
  run_child("lt_batch", NULL, &r);
  mt_t_check_child("lt_batch", &r);
  check_counts(&r, 1, NULL);
  mt_t_child_free(&r);
}

static void pointer_arrays_on_the_grouped_engine(void) {
  mt_t_child r;
  run_child("arrays", NULL, &r);
  mt_t_check_child("arrays", &r);
  const char *reasons[] = {"pointer arrays=4", NULL};
  check_counts(&r, 6, reasons);
  CHECK(json_int(r.summary, "pointer_array_calls") == 6);
  CHECKF(mt_t_count_of(r.err, "requantized at every call") == 0, "stderr: %s", r.err);
  mt_t_child_free(&r);
}

/* The instruments skip pointer-array calls ("entry": their rows' addresses are on the device only;
 * the first batched call, beta != 0, as "beta"): the child's traces hold no instrument launch. */
static void pointer_arrays_skip_the_instruments(void) {
  const char *env[] = {"MINITE_DIGEST=1", "MINITE_PROBE=1", "MINITE_SHADOW=1", NULL};
  mt_t_child r;
  run_child("arrays", env, &r);
  mt_t_check_child("arrays", &r);
  const char *reasons[] = {"pointer arrays=4", NULL};
  check_counts(&r, 6, reasons);
  static const char *const kinds[] = {"\"digest\": {\"rate\"", "\"probe\": {\"rate\"",
                                      "\"shadow\": {\"rate\"", NULL};
  for (int i = 0; kinds[i]; i++)
    CHECKF(mt_t_json_int_in(r.summary, kinds[i], "calls") == 6 &&
               mt_t_json_int_in(r.summary, kinds[i], "entry") == 5 &&
               mt_t_json_int_in(r.summary, kinds[i], "beta") == 1,
           "%s: %s", kinds[i], r.summary);
  mt_t_child_free(&r);
}

/* Under a frozen mode the same calls are requantized (no entry: the weights' addresses are on the
 * device), said once at INFO. */
static void pointer_arrays_under_frozen(void) {
  const char *env[] = {"MINITE_WEIGHT_CACHE=frozen", "MINITE_LOG_LEVEL=INFO", NULL};
  mt_t_child r;
  run_child("arrays", env, &r);
  mt_t_check_child("arrays", &r);
  const char *reasons[] = {"pointer arrays=4", NULL};
  check_counts(&r, 6, reasons);
  CHECK(json_int(r.summary, "frozen_weights") == 0 &&
        json_int(r.summary, "pointer_array_calls") == 6);
  CHECKF(mt_t_count_of(r.err, "requantized at every call") == 1, "stderr: %s", r.err);
  mt_t_child_free(&r);
}

static void fp16_through_gemm_ex_64(void) {
  mt_t_child r;
  run_child("fp16", NULL, &r);
  mt_t_check_child("fp16", &r);
  check_counts(&r, 1, NULL);
  mt_t_child_free(&r);
}

static void frozen_capture_needs_an_entry(void) {
  const char *env[] = {"MINITE_WEIGHT_CACHE=frozen", NULL};
  mt_t_child r;
  run_child("frozen_capture", env, &r);
  mt_t_check_child("frozen_capture", &r);
  check_counts(&r, 4, NULL);
  CHECK(json_int(r.summary, "frozen_weights") == 2 && json_int(r.summary, "cache_full") == 0);
  mt_t_child_free(&r);
}

/* A failure inside the weight cache's preparation (a failed module load or quantization launch)
 * is warned about, as a failed GEMM launch is. */
/* scenario_streams: one warning for the failed wait (its call in cuBLAS), one for the failed
 * record (the stream waited for instead); scenario_streams_threads: every call in order. */
static void kept_weights_ordered_across_streams(void) {
  const char *env[] = {"MINITE_WEIGHT_CACHE=frozen", NULL};
  mt_t_child r;
  run_child("streams", env, &r);
  mt_t_check_child("streams", &r);
  const char *reasons[] = {"engine error=1", NULL};
  check_counts(&r, 16, reasons);
  CHECKF(mt_t_count_of(r.err, " minite WARN ") == 2 && strstr(r.err, "cuStreamWaitEvent") &&
             strstr(r.err, "cuEventRecord"),
         "stderr: %s", r.err);
  mt_t_child_free(&r);
  const char *sampled[] = {"MINITE_WEIGHT_CACHE=frozen-sampled", NULL};
  run_child("streams_threads", sampled, &r);
  mt_t_check_child("streams_threads", &r);
  check_counts(&r, 2 * 64, NULL);
  mt_t_child_free(&r);
}

/* scenario_many_streams: one warning for the 65th stream's fallback, which names the cause. */
static void streams_past_the_scratch_table(void) {
  mt_t_child r;
  run_child("many_streams", NULL, &r);
  mt_t_check_child("many_streams", &r);
  const char *reasons[] = {"out of memory=1", NULL};
  check_counts(&r, 67, reasons);
  CHECKF(mt_t_count_of(r.err, " minite WARN ") == 1 && strstr(r.err, "64 streams"), "stderr: %s",
         r.err);
  mt_t_child_free(&r);
}

static void weight_quantization_failure_warns(void) {
  const char *env[] = {"FAKE_CUDA_FAIL_LAUNCH=mt_quant_tensor_bf16:1", NULL};
  mt_t_child r;
  run_child("weight_quant_fail", env, &r);
  mt_t_check_child("weight_quant_fail", &r);
  const char *reasons[] = {"engine error=1", NULL};
  check_counts(&r, 1, reasons);
  CHECKF(mt_t_count_of(r.err, " minite WARN ") == 1, "no warning for an engine error; stderr: %s",
         r.err);
  mt_t_child_free(&r);
}

static void quantizer_shapes_at_their_caps(void) {
  mt_t_child r;
  run_child("quant_shapes", NULL, &r);
  mt_t_check_child("quant_shapes", &r);
  mt_t_child_free(&r);
}

static void frozen_entries_by_numerics(void) {
  mt_t_child r;
  /* a call that took the kept-weight lock and kept it would hang the child: killed, a failure */
  mt_t_run_child_with("frozen_numerics", "frozen_numerics", NULL, NULL, 60, &r);
  mt_t_check_child("frozen_numerics", &r);
  mt_t_child_free(&r);
}

static void frozen_quantization_failure_forgets_the_hash(void) {
  const char *env[] = {"MINITE_WEIGHT_CACHE=frozen", "FAKE_CUDA_FAIL_LAUNCH=mt_quant_tensor_bf16:1",
                       NULL};
  mt_t_child r;
  run_child("frozen_quant_fail", env, &r);
  mt_t_check_child("frozen_quant_fail", &r);
  const char *reasons[] = {"engine error=1", NULL};
  check_counts(&r, 1, reasons);
  CHECKF(mt_t_count_of(r.err, " minite WARN ") == 1, "stderr: %s", r.err);
  mt_t_child_free(&r);
}

/* All problems of a grouped call run in one launch: a failed launch has written no output, and
 * cuBLAS reads every C as it came. */
static void grouped_beta_failure_after_a_problem_ran(void) {
  const char *env[] = {"FAKE_CUDA_FAIL_LAUNCH=mt_grouped_n16:1", NULL};
  mt_t_child r;
  run_child("grouped_beta_partial", env, &r);
  mt_t_check_child("grouped_beta_partial", &r);
  const char *reasons[] = {"engine error=1", NULL};
  check_counts(&r, 0, reasons);
  mt_t_child_free(&r);
}

/* A grouped call at token tile 256 is two launches (scenario_split); the second failing, cuBLAS
 * computes the whole call. */
static void grouped_split_into_two_launches(void) {
  mt_t_child r;
  run_child("split", NULL, &r);
  mt_t_check_child("split", &r);
  check_counts(&r, 2, NULL);
  mt_t_child_free(&r);
  const char *env[] = {"FAKE_CUDA_FAIL_LAUNCH=mt_grouped_n32:1", NULL};
  run_child("split_fail", env, &r);
  mt_t_check_child("split_fail", &r);
  const char *reasons[] = {"engine error=1", NULL};
  check_counts(&r, 0, reasons);
  mt_t_child_free(&r);
}

static void tests(void) {
  RUN(requantize_kernels_in_order);
  RUN(lt_routed_with_bias);
  RUN(refused_calls_reach_cublas);
  RUN(frozen_entries_and_cache_full);
  RUN(frozen_entries_by_row_stride);
  RUN(frozen_sampled_checks_a_sample);
  RUN(frozen_grouped_store);
  RUN(frozen_weights_stored_in_out);
  RUN(sampled_lines_cover_the_runs);
  RUN(capture_falls_back_until_warm);
  RUN(capture_before_module_load);
  RUN(kpair_maps_and_their_refusal);
  RUN(out_of_memory_warns_once);
  RUN(launch_failure_is_engine_error);
  RUN(no_context_or_not_sm90_is_no_engine);
  RUN(strided_batched);
  RUN(grouped_split_into_two_launches);
  RUN(lt_strided_batch);
  RUN(pointer_arrays_on_the_grouped_engine);
  RUN(pointer_arrays_under_frozen);
  RUN(pointer_arrays_skip_the_instruments);
  RUN(fp16_through_gemm_ex_64);
  RUN(frozen_capture_needs_an_entry);
  RUN(kept_weights_ordered_across_streams);
  RUN(streams_past_the_scratch_table);
  RUN(grouped_beta_failure_after_a_problem_ran);
  RUN(weight_quantization_failure_warns);
  RUN(frozen_quantization_failure_forgets_the_hash);
  RUN(quantizer_shapes_at_their_caps);
  RUN(frozen_entries_by_numerics);
}

int main(int argc, char **argv) {
  return mt_t_scenario_main(argc, argv, "/tmp/mt_shim_engine.XXXXXX", ROUTES, load_all, scenarios,
                            sizeof scenarios / sizeof scenarios[0], tests);
}
