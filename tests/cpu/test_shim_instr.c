/* test_shim_instr.c — the instruments of routed calls (shim/instr.c: MINITE_SHADOW, MINITE_PROBE,
 * MINITE_DIGEST) on the CPU, through the preloaded shim with the fake cuBLAS and the fake
 * libcuda.so.1 of tests/cpu/fake, which runs the instruments' kernels on the host through the
 * twin in kernels/instr.h.
 *
 * In-process: the rate parser; the host twin of the digest math (mix64, signs, sketch) against
 * the Python reference in tools/minite-compare.
 * Children (`test_shim_instr child SCENARIO BUILD`, each under LD_PRELOAD): the launch sequence
 * after a routed GEMM, the per-route sampling (small calls' digests by their route's count of
 * rows, MINITE_DIGEST_CALLS), capture (digests at each replay or one in R, or none; the rest
 * skipped, nothing allocated or read back), the bounded slots (drops counted, never a wait), event
 * queries only on the writer thread and no synchronisation, spec bf16 (shadow exactly 0, probe 0
 * differing), and records that tools/minite-compare reads and joins across two processes with
 * different batchings.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/instr.h"
#include "kernels/wcheck.h"
#include "tests/cpu/fake/fake.h"
#include "tests/cpu/fake/fake_cuda.h"
#include "tests/cpu/scenario.h"

#define OUT 256
#define IN 512
#define OUT2 1024
#define ROUTES "MINITE_ROUTE=256x512,1024x512"
#define S1 ((CUstream)(uintptr_t)0x1000)
#define S2 ((CUstream)(uintptr_t)0x2000)

/* ======================================================================================== */
/* The child.                                                                               */
/* ======================================================================================== */

static void *lib_cublas, *lib_cuda, *lib_lt;
static __typeof__(&cublasSetStream_v2) set_stream_fn;
static cublasHandle_t handle;
static const float one = 1.0f, zero = 0.0f, half = 0.5f;
static __typeof__(&cublasGemmEx) hook_gemm;
static void (*cublas_last)(fake_record *);
static fake_cuda_counts_fn cuda_counts;
static fake_cuda_set_capturing_fn set_capturing;
static fake_cuda_hold_events_fn hold_events;
static fake_cuda_event_queries_fn event_queries;
static fake_cuda_replay_instr_fn replay_instr;
static uint32_t seed = 777;

static uint16_t *matrix(size_t elems) { return mt_t_matrix(&seed, elems); }

static int load_fakes(const char *build) {
  if (!(lib_cuda = mt_t_open(build, "tests/cpu/fake/driver/libcuda.so.1")))
    return -1;
  cuda_events = (fake_cuda_events_fn)mt_t_sym(lib_cuda, "fake_cuda_events");
  cuda_counts = (fake_cuda_counts_fn)mt_t_sym(lib_cuda, "fake_cuda_counts_get");
  set_capturing = (fake_cuda_set_capturing_fn)mt_t_sym(lib_cuda, "fake_cuda_set_capturing");
  hold_events = (fake_cuda_hold_events_fn)mt_t_sym(lib_cuda, "fake_cuda_hold_events");
  event_queries = (fake_cuda_event_queries_fn)mt_t_sym(lib_cuda, "fake_cuda_event_queries");
  replay_instr = (fake_cuda_replay_instr_fn)mt_t_sym(lib_cuda, "fake_cuda_replay_instr");
  if (!(lib_cublas = mt_t_open(build, "tests/cpu/fake/libcublas.so.13")))
    return -1;
  if (!(lib_lt = mt_t_open(build, "tests/cpu/fake/libcublasLt.so.13")))
    return -1;
  hook_gemm = (__typeof__(hook_gemm))dlsym(RTLD_DEFAULT, "cublasGemmEx");
  cublas_last = (void (*)(fake_record *))mt_t_sym(lib_cublas, "fake_cublas_last");
  __typeof__(&cublasCreate_v2) create = (__typeof__(create))mt_t_sym(lib_cublas, "cublasCreate_v2");
  __typeof__(&cublasSetStream_v2) set = (__typeof__(set))mt_t_sym(lib_cublas, "cublasSetStream_v2");
  if (!hook_gemm || !cublas_last || !create || !set || !cuda_events || !hold_events ||
      !event_queries || create(&handle))
    return -1;
  set_stream_fn = set;
  set(handle, (cudaStream_t)S1);
  return 0;
}

static void set_stream(CUstream s) { set_stream_fn(handle, (cudaStream_t)s); }

static long cublas_calls(void) {
  fake_record r;
  cublas_last(&r);
  return r.calls;
}

/* The events since `from` as words (launches by name without the engine's, which
 * test_shim_engine.c checks: "gemm" stands for the engine's kernels of one problem). */
static const char *trace(int from) {
  static char s[4096];
  size_t used = 0;
  s[0] = '\0';
  for (int i = from; i < now() && used < sizeof s - 64; i++) {
    const fake_cuda_event *e = event(i);
    const char *w = NULL;
    char buf[64];
    int engine = e->kind == FAKE_EV_LAUNCH && strncmp(e->name, "mt_instr_", 9);
    if (engine || (e->kind == FAKE_EV_MEMSET && e->bytes == 4) || e->kind == FAKE_EV_TMAP ||
        e->kind == FAKE_EV_SETATTR) {
      if (engine &&
          (!strncmp(e->name, "mt_gemm_small", 13) || !strncmp(e->name, "mt_gemm_large", 13))) {
        w = "gemm";
      } else {
        continue;
      }
    } else if (e->kind == FAKE_EV_LAUNCH) {
      w = e->name + 9; /* digest, shadow, probe, finish */
    } else {
      switch (e->kind) {
      case FAKE_EV_ALLOC:
        w = "alloc";
        break;
      case FAKE_EV_FREE:
        w = "free";
        break;
      case FAKE_EV_MEMSET:
        snprintf(buf, sizeof buf, "memset%zu", e->bytes), w = buf;
        break;
      case FAKE_EV_DTOH:
        w = "dtoh";
        break;
      case FAKE_EV_SYNC:
        w = "sync";
        break;
      case FAKE_EV_CTX_SYNC:
        w = "ctxsync";
        break;
      case FAKE_EV_LOAD:
        w = "load";
        break;
      case FAKE_EV_RECORD:
        w = "record";
        break;
      case FAKE_EV_HOSTALLOC:
        w = "hostalloc";
        break;
      case FAKE_EV_HOSTREG:
        w = "hostreg";
        break;
      case FAKE_EV_ALLOC_ASYNC:
        w = "alloc_async";
        break;
      case FAKE_EV_FREE_ASYNC:
        w = "free_async";
        break;
      default:
        w = "?";
      }
    }
    used += (size_t)snprintf(s + used, sizeof s - used, "%s%s", used ? " " : "", w);
  }
  return s;
}

#define CHECK_TRACE(from, want)                                                                    \
  do {                                                                                             \
    const char *got_ = trace(from);                                                                \
    CHECKF(!strcmp(got_, want), "\n      got  %s\n      want %s", got_, want);                     \
  } while (0)

static int find_launch(int from, const char *name, int nth) {
  return mt_t_find_launch(from, name, 0, nth);
}

static void check_clean(void) {
  fake_cuda_counts c;
  cuda_counts(&c);
  CHECKF(c.invalid == 0, "%ld driver calls the real driver would refuse", c.invalid);
  CHECKF(c.during_capture == 0, "%ld allocations or read-backs while capturing", c.during_capture);
}

typedef struct {
  int out, tokens;
  uint16_t *w, *x, *y;
} problem;

static problem make(int out, int tokens) {
  problem p = {out, tokens, matrix((size_t)out * IN), matrix((size_t)tokens * IN), NULL};
  p.y = matrix((size_t)out * tokens);
  return p;
}

static void unmake(problem *p) { free(p->w), free(p->x), free(p->y); }

/* Rows [row, row + tokens) of p's activations through the hook, into p's output rows. */
static cublasStatus_t gemm_rows(const problem *p, int row, int tokens, const float *beta) {
  return hook_gemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, p->out, tokens, IN, &one, p->w, CUDA_R_16BF,
                   IN, p->x + (size_t)row * IN, CUDA_R_16BF, IN, beta, p->y + (size_t)row * p->out,
                   CUDA_R_16BF, p->out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}

static cublasStatus_t gemm(const problem *p, const float *beta) {
  return gemm_rows(p, 0, p->tokens, beta);
}

/* The keys the twin gives p's rows (weight content, bf16 output, alpha 1, no bias), as #info
 * lines the parent looks for in the statistics file. */
static void print_keys(const problem *p) {
  uint64_t wid = mt_instr_weight_id(mt_t_weight_sum(p->w, IN, p->out, IN), p->out, IN, 0);
  for (int i = 0; i < p->tokens; i++)
    printf("#info key %016" PRIx64 "\n",
           mt_instr_key(mt_instr_row_hash(p->x + (size_t)i * IN, IN, 0), wid, 0, 1.0f, 0));
}

/* cublasLtMatmul of p with an FP32 bias (the BIAS epilogue), C = D = p's output. */
static cublasStatus_t lt_bias(const problem *p, const float *bias) {
  __typeof__(&cublasLtCreate) lt_create = (__typeof__(lt_create))dlsym(lib_lt, "cublasLtCreate");
  const mt_t_lt_api api = mt_t_lt(lib_lt);
  __typeof__(&cublasLtMatmul) hook_lt = (__typeof__(hook_lt))dlsym(RTLD_DEFAULT, "cublasLtMatmul");
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc;
  if (!lt_create || !api.desc_create || !api.desc_set || !api.layout_create || !hook_lt ||
      lt_create(&lt))
    return CUBLAS_STATUS_NOT_INITIALIZED;
  api.desc_create(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  int32_t ta = CUBLAS_OP_T, bias_type = CUDA_R_32F;
  uint32_t epi = CUBLASLT_EPILOGUE_BIAS;
  api.desc_set(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
  api.desc_set(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
  api.desc_set(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias);
  api.desc_set(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type);
  api.layout_create(&la, CUDA_R_16BF, IN, p->out, IN);
  api.layout_create(&lb, CUDA_R_16BF, IN, p->tokens, IN);
  api.layout_create(&lc, CUDA_R_16BF, p->out, p->tokens, p->out);
  static char workspace[256];
  cublasStatus_t st = hook_lt(lt, desc, &one, p->w, la, p->x, lb, &zero, p->y, lc, p->y, lc, NULL,
                              workspace, sizeof workspace, (cudaStream_t)S1);
  api.desc_destroy(desc);
  api.layout_destroy(la), api.layout_destroy(lb), api.layout_destroy(lc);
  ((__typeof__(&cublasLtDestroy))dlsym(lib_lt, "cublasLtDestroy"))(lt);
  return st;
}

/* The keys of p's rows with an FP32 bias, as print_keys. */
static void print_keys_bias(const problem *p, const float *bias) {
  uint64_t wid = mt_instr_weight_id(mt_t_weight_sum(p->w, IN, p->out, IN), p->out, IN, 0);
  uint64_t bid = mt_instr_bias_id(1, mt_instr_content_sum(bias, (size_t)p->out * 4, 0), p->out,
                                  2 /* MT_DTYPE_FP32 */);
  for (int i = 0; i < p->tokens; i++)
    printf("#info key %016" PRIx64 "\n",
           mt_instr_key(mt_instr_row_hash(p->x + (size_t)i * IN, IN, 0), wid, 0, 1.0f, bid));
}

/* MINITE_DIGEST=1 (others 0): after the GEMM, the digest kernel and mt_instr_finish with the
 * call's operands (the slot's block zeroed once before its first use); nothing synchronized,
 * nothing read back. */
static void scenario_digest(void) {
  problem p = make(OUT, 8);
  int t = now();
  CHECK(gemm(&p, &zero) == CUBLAS_STATUS_SUCCESS);
  /* the first lookup loads every kernel file and makes the context registry's canary; the
   * instruments' memory: device, then host (registered) */
  CHECK_TRACE(
      t, "alloc load load load load load load alloc gemm alloc hostreg memset60 digest finish");
  int d = find_launch(t, "mt_instr_digest", 0), w = find_launch(t, "mt_instr_finish", 0);
  const mt_instr_digest_args *da = d >= 0 ? (const mt_instr_digest_args *)event(d)->args : NULL;
  const mt_instr_finish_args *wa = w >= 0 ? (const mt_instr_finish_args *)event(w)->args : NULL;
  CHECK(da && da->x == p.x && da->y == p.y && da->ldx == IN && da->ldy == OUT && da->m == 8 &&
        da->n == OUT && da->k == IN && da->all == 1 && da->cap > 0);
  CHECK(da && event(d)->grid[0] == 1 && event(d)->block[0] == 256 && event(d)->stream == S1);
  /* both launched dependent: each waits on the device for the kernels before it
   * (kernels/instr.cu) */
  CHECK(d >= 0 && w >= 0 && event(d)->pdl && event(w)->pdl);
  CHECK(wa && wa->w == p.w && wa->ldw == IN && wa->n == OUT && wa->k == IN && !wa->frozen_sum &&
        !wa->bias && wa->hdr == da->hdr && wa->seq == 1 && wa->cap == da->cap);
  /* the weight's sample, 32 lines of its 2048, summed by one CTA (a line a thread) */
  CHECK(w >= 0 && event(w)->grid[0] == 1);
  print_keys(&p);
  /* again, and 3 more rows of another problem: no allocation, no load */
  t = now();
  CHECK(gemm(&p, &zero) == CUBLAS_STATUS_SUCCESS);
  CHECK_TRACE(t, "gemm memset60 digest finish");
  problem q = make(OUT, 3);
  CHECK(gemm(&q, &zero) == CUBLAS_STATUS_SUCCESS);
  print_keys(&q);
  /* cublasLtMatmul with an FP32 bias: the bias's content is in the key */
  problem l = make(OUT, 5);
  float *bias = aligned_alloc(64, OUT * 4);
  for (int i = 0; i < OUT; i++)
    bias[i] = 0.125f * (float)(i % 9) - 0.5f;
  t = now();
  CHECK(lt_bias(&l, bias) == CUBLAS_STATUS_SUCCESS);
  int f = find_launch(t, "mt_instr_finish", 0);
  const mt_instr_finish_args *fa = f >= 0 ? (const mt_instr_finish_args *)event(f)->args : NULL;
  CHECK(fa && fa->bias == bias && fa->bias_bytes == OUT * 4);
  print_keys_bias(&l, bias);
  free(bias);
  unmake(&l);
  /* beta != 0: not digested (C is the output, already overwritten) */
  t = now();
  CHECK(gemm(&q, &half) == CUBLAS_STATUS_SUCCESS);
  CHECK_TRACE(t, "gemm");
  long queries, same;
  event_queries(&queries, &same);
  CHECKF(queries == 0, "%ld event queries: the writer polls host memory", queries);
  check_clean();
  unmake(&p), unmake(&q);
}

/* Kept weights: under frozen-sampled (MT_SAMPLED=1), whose stored hash is the digests' weight sum
 * (the same sample), the digest reads it instead of summing the weight; under frozen, whose hash
 * covers every line, it sums the weight's sample. */
static void scenario_digest_frozen(void) {
  int sampled = getenv("MT_SAMPLED") && getenv("MT_SAMPLED")[0] == '1';
  problem p = make(OUT, 4);
  int t = now();
  CHECK(gemm(&p, &zero) == CUBLAS_STATUS_SUCCESS);
  int wc = find_launch(t, "mt_wcheck", 0), w = find_launch(t, "mt_instr_finish", 0);
  CHECK(wc >= 0 && w > wc);
  const mt_instr_finish_args *wa = w >= 0 ? (const mt_instr_finish_args *)event(w)->args : NULL;
  const mt_wcheck_args *ca = wc >= 0 ? (const mt_wcheck_args *)event(wc)->args : NULL;
  CHECK(wa && (wa->frozen_sum != NULL) == sampled && ca &&
        ca->step == (sampled ? MT_SAMPLE_STEP : 1u));
  /* the stored hash of the weight's last quantization, not the running check's sum */
  CHECKF(!sampled || (ca && wa && wa->frozen_sum == &mt_wcheck_slices(ca->state)->hash),
         "the digest reads %p", wa ? (const void *)wa->frozen_sum : NULL);
  print_keys(&p);
  unmake(&p);
}

/* A weight stored [in][out] (x @ W, NN, lda = OUT) under frozen-sampled: the cache's stored hash is
 * of its stored lines, so the finish sums the sample itself, gathering the [out][in] matrix's lines
 * (in_out): the keys are those of the same weight stored [out][in] (print_keys on p's W). */
static void scenario_digest_in_out(void) {
  problem p = make(OUT, 4);
  uint16_t *wt = aligned_alloc(64, (size_t)OUT * IN * 2);
  for (int r = 0; r < OUT; r++)
    for (int c = 0; c < IN; c++)
      wt[(size_t)c * OUT + r] = p.w[(size_t)r * IN + c];
  int t = now();
  CHECK(hook_gemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, OUT, p.tokens, IN, &one, wt, CUDA_R_16BF, OUT,
                  p.x, CUDA_R_16BF, IN, &zero, p.y, CUDA_R_16BF, OUT, CUBLAS_COMPUTE_32F,
                  CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
  int w = find_launch(t, "mt_instr_finish", 0);
  const mt_instr_finish_args *wa = w >= 0 ? (const mt_instr_finish_args *)event(w)->args : NULL;
  CHECK(wa && wa->w == wt && wa->ldw == OUT && wa->n == OUT && wa->k == IN && wa->in_out == 1 &&
        !wa->frozen_sum);
  CHECK(mt_instr_weight_sum_of(wt, OUT, OUT, IN, 1) == mt_t_weight_sum(p.w, IN, OUT, IN));
  CHECK(mt_instr_weight_sum_of(wt, OUT, OUT, IN, 1) != mt_instr_weight_sum(wt, OUT, IN, OUT));
  print_keys(&p);
  free(wt);
  unmake(&p);
}

/* Sampling: shadow every 3rd call of a route, probe every 2nd call with M > 1, per route. */
static void scenario_sampling(void) {
  problem a = make(OUT, 8), b = make(OUT2, 5), single = make(OUT, 1);
  int shadows = 0, probes = 0;
  for (int i = 0; i < 7; i++) {
    long calls = cublas_calls();
    int t = now();
    CHECK(gemm(&a, &zero) == CUBLAS_STATUS_SUCCESS);
    int want_shadow = i % 3 == 0, want_probe = i % 2 == 0;
    int got_shadow = find_launch(t, "mt_instr_shadow", 0) >= 0;
    int got_probe = find_launch(t, "mt_instr_probe", 0) >= 0;
    CHECKF(got_shadow == want_shadow && got_probe == want_probe, "call %d: shadow %d probe %d", i,
           got_shadow, got_probe);
    CHECKF(cublas_calls() == calls + want_shadow, "call %d: the shadow reruns cuBLAS once", i);
    if (got_probe) { /* 4 rows alone through the engine, then the comparison */
      int pr = find_launch(t, "mt_instr_probe", 0);
      const mt_instr_probe_args *pa = (const mt_instr_probe_args *)event(pr)->args;
      CHECK(pa->nrows == 4 && pa->rows[0] == 0 && pa->rows[1] == 2 && pa->rows[2] == 5 &&
            pa->rows[3] == 7 && pa->y == a.y && pa->n == OUT && pa->yoff[3] == 7 * OUT &&
            pa->ld_alone == OUT && (uintptr_t)pa->alone % 256 == 0);
      int g = 0;
      for (int e = t; e < pr; e++)
        g += event(e)->kind == FAKE_EV_LAUNCH && (!strncmp(event(e)->name, "mt_gemm_small", 13) ||
                                                  !strncmp(event(e)->name, "mt_gemm_large", 13));
      CHECKF(g == 5, "%d GEMM launches before the probe, want the call's and 4 alone", g);
      /* a kept weight (frozen): the rows alone read the copy the call dequantized */
      int dq = 0, kept = getenv("MINITE_WEIGHT_CACHE") != NULL;
      for (int e = t; e < pr; e++)
        dq += event(e)->kind == FAKE_EV_LAUNCH && !strcmp(event(e)->name, "mt_dequant_weight");
      CHECKF(dq == kept, "%d dequantizations before the probe, want %d", dq, kept);
    }
    if (got_shadow) {
      int sh = find_launch(t, "mt_instr_shadow", 0);
      const mt_instr_shadow_args *sa = (const mt_instr_shadow_args *)event(sh)->args;
      CHECK(sa->y == a.y && sa->m == 8 && sa->n == OUT && sa->ld == OUT && sa->ref != a.y);
    }
    shadows += got_shadow, probes += got_probe;
    /* route 1024x512 counts on its own: its first call is sampled too */
    if (i < 2) {
      t = now();
      CHECK(gemm(&b, &zero) == CUBLAS_STATUS_SUCCESS);
      CHECK((find_launch(t, "mt_instr_shadow", 0) >= 0) == (i == 0));
    }
    /* M = 1 calls do not advance the probe's counter */
    t = now();
    CHECK(gemm(&single, &zero) == CUBLAS_STATUS_SUCCESS);
    CHECK(find_launch(t, "mt_instr_probe", 0) < 0);
  }
  printf("#info shadows %d\n#info probes %d\n", shadows, probes);
  check_clean();
  unmake(&a), unmake(&b), unmake(&single);
}

/* Capture: the routed call runs (warm) in the graph's memory, and its digests are captured with
 * it (the probe is skipped: it reruns the call from the host); nothing is allocated outside the
 * graph, read back or recorded while the stream captures. The capture's finish publishes with the
 * flag's seqlock (seq 0; the fake runs kernels as they are captured: that is a first replay), and
 * each replay (fake_cuda_replay_instr) publishes into the same slot again: the writer reads each
 * one it finds whole (the parent counts the records). */
static void scenario_capture(void) {
  problem p = make(OUT, 8);
  CHECK(gemm(&p, &zero) == CUBLAS_STATUS_SUCCESS);
  set_capturing(S1, 1);
  int t = now();
  CHECK(gemm(&p, &zero) == CUBLAS_STATUS_SUCCESS);
  CHECK_TRACE(t, "alloc_async gemm memset60 digest finish free_async"); /* a slot new to use */
  set_capturing(S1, 0);
  int w = find_launch(t, "mt_instr_finish", 0);
  CHECK(w >= 0 && ((const mt_instr_finish_args *)event(w)->args)->seq == 0);
  for (int i = 0; i < 3; i++) {
    struct timespec gap = {0, 30 * 1000 * 1000}; /* the writer scans every ms meanwhile */
    nanosleep(&gap, NULL);
    replay_instr(t);
  }
  t = now();
  CHECK(gemm(&p, &zero) == CUBLAS_STATUS_SUCCESS);
  CHECK(find_launch(t, "mt_instr_digest", 0) >= 0);
  w = find_launch(t, "mt_instr_finish", 0);
  CHECK(w >= 0 && ((const mt_instr_finish_args *)event(w)->args)->seq != 0);
  check_clean();
  unmake(&p);
}

/* A call of p before a capture, while its stream captures (nothing of the instruments in the
 * graph: no slot, no launch) and after it; returns the event count before the last call. */
static int call_captured_bare(const problem *p) {
  CHECK(gemm(p, &zero) == CUBLAS_STATUS_SUCCESS);
  set_capturing(S1, 1);
  int t = now();
  CHECK(gemm(p, &zero) == CUBLAS_STATUS_SUCCESS);
  CHECK_TRACE(t, "alloc_async gemm free_async");
  set_capturing(S1, 0);
  t = now();
  CHECK(gemm(p, &zero) == CUBLAS_STATUS_SUCCESS);
  return t;
}

/* MINITE_DIGEST_REPLAYS=0: a call being captured gets no digest (nor anything else): no slot, no
 * launch of the instruments in the graph; the uncaptured call after it digests as before. */
static void scenario_capture_off(void) {
  problem p = make(OUT, 8);
  int t = call_captured_bare(&p);
  CHECK(find_launch(t, "mt_instr_digest", 0) >= 0);
  check_clean();
  unmake(&p);
}

/* MINITE_DIGEST=0, the shadow and the probe on every call: a call being captured is still known
 * as captured (no digest asked the driver), so both are skipped and nothing runs in the graph;
 * the uncaptured call after it gets both. */
static void scenario_capture_no_digest(void) {
  problem p = make(OUT, 8);
  int t = call_captured_bare(&p);
  CHECK(find_launch(t, "mt_instr_shadow", 0) >= 0 && find_launch(t, "mt_instr_probe", 0) >= 0);
  check_clean();
  unmake(&p);
}

/* Bounded: with every publication held "in flight", calls past the pool's slots are not
 * instrumented (dropped and counted) and never wait; a call of more rows than a slot keeps drops
 * the rest; released events drain; held ones at exit are counted after the drain's time limit. */
static void scenario_bounded(void) {
  problem p = make(OUT, 2), big = make(OUT, 200);
  CHECK(gemm(&big, &zero) == CUBLAS_STATUS_SUCCESS); /* 200 rows: 128 kept */
  usleep(100000);
  hold_events(1);
  int digests = 0;
  for (int i = 0; i < 300; i++) {
    int t = now();
    CHECK(gemm(&p, &zero) == CUBLAS_STATUS_SUCCESS);
    digests += find_launch(t, "mt_instr_digest", 0) >= 0;
  }
  printf("#info held_digests %d\n", digests);
  hold_events(0);
  usleep(300000); /* the writer drains what was held */
  for (int i = 0; i < 3; i++)
    CHECK(gemm(&p, &zero) == CUBLAS_STATUS_SUCCESS);
  usleep(100000);
  hold_events(1); /* these stay in flight through exit */
  for (int i = 0; i < 5; i++)
    CHECK(gemm(&p, &zero) == CUBLAS_STATUS_SUCCESS);
  const fake_cuda_event *e;
  int n = cuda_events(&e), syncs = 0;
  for (int i = 0; i < n; i++)
    syncs +=
        e[i].kind == FAKE_EV_SYNC || e[i].kind == FAKE_EV_CTX_SYNC || e[i].kind == FAKE_EV_DTOH;
  CHECKF(syncs == 0, "%d synchronisations or read-backs", syncs);
  check_clean();
  unmake(&p), unmake(&big);
}

/* A process run for the join: problem rows in batches given by MT_BATCHES ("64" or "7,1,..."),
 * taken from the end backwards when MT_REVERSE=1. Same seed: same weight and rows. */
static void scenario_join(void) {
  problem p = make(OUT, 64);
  const char *spec = getenv("MT_BATCHES");
  int reverse = getenv("MT_REVERSE") && getenv("MT_REVERSE")[0] == '1';
  int sizes[64], n = 0;
  for (const char *s = spec; s && *s && n < 64;) {
    char *end;
    sizes[n++] = (int)strtol(s, &end, 10);
    s = *end == ',' ? end + 1 : end;
  }
  int done = 0;
  for (int i = 0; done < 64; i = (i + 1) % n) {
    int len = sizes[i] < 64 - done ? sizes[i] : 64 - done;
    int row = reverse ? 64 - done - len : done;
    CHECK(gemm_rows(&p, row, len, &zero) == CUBLAS_STATUS_SUCCESS);
    done += len;
  }
  unmake(&p);
}

static void *gemm_in_thread(void *p) {
  CHECK(gemm(p, &zero) == CUBLAS_STATUS_SUCCESS);
  return NULL;
}

/* The scratch of the shadow and probe serves another stream only once its last user's slot is
 * published: until then that stream's calls skip them ("busy"), never wait or order the streams. */
static void scenario_busy(void) {
  problem p = make(OUT, 4);
  hold_events(1);
  CHECK(gemm(&p, &zero) == CUBLAS_STATUS_SUCCESS); /* S1: shadow and probe in flight */
  set_stream(S2);
  int t = now();
  CHECK(gemm(&p, &zero) == CUBLAS_STATUS_SUCCESS);
  CHECK(find_launch(t, "mt_instr_shadow", 0) < 0 && find_launch(t, "mt_instr_probe", 0) < 0);
  CHECK(find_launch(t, "mt_instr_finish", 0) >= 0); /* the digest still runs */
  set_stream(S1); /* the scratch's own stream: ordered by the stream itself */
  t = now();
  CHECK(gemm(&p, &zero) == CUBLAS_STATUS_SUCCESS);
  CHECK(find_launch(t, "mt_instr_shadow", 0) >= 0);
  hold_events(0);
  set_stream(S2);
  t = now();
  CHECK(gemm(&p, &zero) == CUBLAS_STATUS_SUCCESS);
  CHECK(find_launch(t, "mt_instr_shadow", 0) >= 0 && find_launch(t, "mt_instr_probe", 0) >= 0);
  /* two threads' per-thread default streams are two streams */
  hold_events(1);
  set_stream(CU_STREAM_PER_THREAD);
  CHECK(gemm(&p, &zero) == CUBLAS_STATUS_SUCCESS);
  pthread_t other;
  t = now();
  CHECK(!pthread_create(&other, NULL, gemm_in_thread, &p) && !pthread_join(other, NULL));
  CHECK(find_launch(t, "mt_instr_shadow", 0) < 0 && find_launch(t, "mt_instr_probe", 0) < 0);
  hold_events(0);
  check_clean();
  unmake(&p);
}

/* A forked child instruments nothing and exits without waiting for a writer it does not have. */
static void scenario_fork(void) {
  problem p = make(OUT, 4);
  CHECK(gemm(&p, &zero) == CUBLAS_STATUS_SUCCESS);
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    int t = now();
    int ok = gemm(&p, &zero) == CUBLAS_STATUS_SUCCESS && find_launch(t, "mt_instr_", 0) < 0;
    for (int i = t; i < now(); i++)
      ok &= strncmp(event(i)->name, "mt_instr_", 9) != 0;
    exit(ok ? 0 : 1); /* exit(), not _exit(): the atexit drain must not hang */
  }
  int status = -1;
  waitpid(pid, &status, 0);
  CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "forked child: status %d", status);
  CHECK(gemm(&p, &zero) == CUBLAS_STATUS_SUCCESS); /* the parent goes on */
  unmake(&p);
}

/* A strided batch of 3 problems of 8 rows (one grouped call): the shadow reruns the batch through
 * the real cuBLAS into the scratch in the call's own layout, the probe recomputes rows 0, 8, 16
 * and 23 alone through the grouped engine, each with its own problem's weight slice, and every
 * row is digested with the key of its own problem's weight. */
static void scenario_strided(void) {
  enum { B = 3, T = 8 };
  size_t sw = (size_t)OUT * IN, sx = (size_t)T * IN, sy = (size_t)OUT * T;
  uint16_t *w = matrix(sw * B), *x = matrix(sx * B), *y = matrix(sy * B);
  __typeof__(&cublasGemmStridedBatchedEx) hook_strided =
      (__typeof__(hook_strided))dlsym(RTLD_DEFAULT, "cublasGemmStridedBatchedEx");
  CHECK(hook_strided != NULL);
  if (!hook_strided)
    return;
  long calls = cublas_calls();
  int t = now();
  CHECK(hook_strided(handle, CUBLAS_OP_T, CUBLAS_OP_N, OUT, T, IN, &one, w, CUDA_R_16BF, IN, sw, x,
                     CUDA_R_16BF, IN, sx, &zero, y, CUDA_R_16BF, OUT, sy, B, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS);
  CHECKF(cublas_calls() == calls + 1, "%ld cuBLAS calls: the shadow's rerun only",
         cublas_calls() - calls);
  int sh = find_launch(t, "mt_instr_shadow", 0), pr = find_launch(t, "mt_instr_probe", 0);
  const mt_instr_shadow_args *sa = sh >= 0 ? (const mt_instr_shadow_args *)event(sh)->args : NULL;
  const mt_instr_probe_args *pa = pr >= 0 ? (const mt_instr_probe_args *)event(pr)->args : NULL;
  CHECK(sa && sa->y == y && sa->m == B * T && sa->ld == OUT && sa->stride == (int64_t)sy &&
        sa->seg_rows == T);
  CHECK(pa && !pa->offs && pa->nrows == 4 && pa->rows[1] == 8 && pa->rows[3] == 23 &&
        pa->yoff[1] == (int64_t)sy && pa->yoff[3] == 2 * (int64_t)sy + 7 * OUT);
  CHECK(find_launch(t, "mt_instr_offs", 0) < 0);
  /* the rows alone: one grouped launch of one row each, between the call's and the comparison */
  int alone = 0;
  for (int e = find_launch(t, "mt_grouped_n8", 0); e >= 0 && e < pr; e++)
    alone += event(e)->kind == FAKE_EV_LAUNCH && !strncmp(event(e)->name, "mt_grouped_", 11);
  CHECKF(alone == 4, "%d grouped launches of one row", alone);
  for (int b = 0; b < B; b++) {
    uint64_t wid = mt_instr_weight_id(mt_t_weight_sum(w + b * sw, IN, OUT, IN), OUT, IN, 0);
    for (int i = 0; i < T; i++)
      printf("#info key %016" PRIx64 "\n",
             mt_instr_key(mt_instr_row_hash(x + b * sx + (size_t)i * IN, IN, 0), wid, 0, 1.0f, 0));
  }
  check_clean();
  free(w), free(x), free(y);
}

/* MINITE_DIGEST=1/4, every call looked at (MINITE_DIGEST_CALLS=all), one slot: the rows whose
 * lead hash (their first MT_INSTR_LEAD elements) is below 2^62 are digested, keyed by the whole
 * row's hash. Rows come in pairs equal in their lead and unequal after it: a pair is chosen
 * together, and some rows' whole-row hashes would choose otherwise. The 64 rows in one call, then
 * each alone in turn: a call with no row chosen publishes its flag alone, and the writer must not
 * read the rows its slot's block kept from an earlier use (each chosen row is written twice, no
 * more). */
static void scenario_lead(void) {
  problem p = make(OUT, 64);
  for (int i = 1; i < p.tokens; i += 2)
    memcpy(p.x + (size_t)i * IN, p.x + (size_t)(i - 1) * IN, MT_INSTR_LEAD * 2);
  CHECK(gemm(&p, &zero) == CUBLAS_STATUS_SUCCESS);
  for (int i = 0; i < p.tokens; i++) {
    usleep(5000); /* the writer frees the one slot meanwhile */
    CHECK(gemm_rows(&p, i, 1, &zero) == CUBLAS_STATUS_SUCCESS);
  }
  const uint64_t below = 1ull << 62;
  uint64_t wid = mt_instr_weight_id(mt_t_weight_sum(p.w, IN, p.out, IN), p.out, IN, 0);
  int chosen = 0, otherwise = 0;
  for (int i = 0; i < p.tokens; i++) {
    const uint16_t *x = p.x + (size_t)i * IN;
    uint64_t row = mt_instr_row_hash(x, IN, 0);
    int lead = mt_instr_lead_hash(x, IN, 0) < below;
    otherwise += lead != (row < below);
    if (lead)
      printf("#info key %016" PRIx64 "\n", mt_instr_key(row, wid, 0, 1.0f, 0)), chosen++;
  }
  printf("#info chosen %d\n#info otherwise %d\n", chosen, otherwise);
  check_clean();
  unmake(&p);
}

/* Uncaptured calls of rows[i] rows of the route, each digested or not as due[i] says (every one
 * under MINITE_DIGEST_CALLS=all). */
static void digest_calls_due(const problem *p, const int *rows, const int *due, int n) {
  const int all = getenv("MINITE_DIGEST_CALLS") != NULL;
  for (int i = 0; i < n; i++) {
    int t = now();
    CHECK(gemm_rows(p, 0, rows[i], &zero) == CUBLAS_STATUS_SUCCESS);
    CHECKF((find_launch(t, "mt_instr_digest", 0) >= 0) == (all || due[i]), "call %d of %d rows", i,
           rows[i]);
  }
}

/* MINITE_DIGEST=1/4 (a period of 4 rows): uncaptured calls of 1, 1, 1, 1, 1, 3, 3, 3, 4, 8 and 2
 * rows are digested where their route's count of rows reaches a multiple of 4 within them (rows
 * 0, 4, 8, 12, 16 and 20 to 25: calls 1, 5, 7, 8, 9 and 10); a captured call of 1 row is digested
 * and adds no row, so the uncaptured call after it starts at row 28 and is digested. */
static void scenario_small_calls(void) {
  static const int rows[] = {1, 1, 1, 1, 1, 3, 3, 3, 4, 8, 2};
  static const int due[] = {1, 0, 0, 0, 1, 0, 1, 1, 1, 1, 0};
  problem p = make(OUT, 8);
  digest_calls_due(&p, rows, due, (int)(sizeof rows / sizeof rows[0]));
  set_capturing(S1, 1);
  int t = now();
  CHECK(gemm_rows(&p, 0, 1, &zero) == CUBLAS_STATUS_SUCCESS);
  CHECK(find_launch(t, "mt_instr_digest", 0) >= 0);
  set_capturing(S1, 0);
  t = now();
  CHECK(gemm_rows(&p, 0, 1, &zero) == CUBLAS_STATUS_SUCCESS);
  CHECK(find_launch(t, "mt_instr_digest", 0) >= 0);
  check_clean();
  unmake(&p);
}

/* MINITE_DIGEST=1/4096: the period is capped at 64 rows, so calls of 64 rows are all digested and
 * calls of 32 at every other (rows 128, 192; not 160); with a period of 4096 only the first would
 * be. */
static void scenario_small_calls_low_rate(void) {
  static const int rows[] = {64, 64, 32, 32, 32, 100};
  static const int due[] = {1, 1, 1, 0, 1, 1};
  problem p = make(OUT, 100);
  digest_calls_due(&p, rows, due, (int)(sizeof rows / sizeof rows[0]));
  check_clean();
  unmake(&p);
}

/* MINITE_DIGEST=1/4: a call of 1,024 rows would choose ~256, past the 128 its block keeps; its
 * threshold is lowered to 96 / 1,024 of 2^64 (3 x 2^59), so it keeps the rows whose lead hash is
 * below that, in full. Its first 64 rows then as a call of their own, at the rate (2^62): among
 * them, every row the large call kept is kept again (the thresholds nest). */
static void scenario_nested(void) {
  problem p = make(OUT, 1024);
  int t = now();
  CHECK(gemm(&p, &zero) == CUBLAS_STATUS_SUCCESS);
  int d = find_launch(t, "mt_instr_digest", 0);
  CHECK(d >= 0 && ((const mt_instr_digest_args *)event(d)->args)->threshold == 3ull << 59);
  t = now();
  CHECK(gemm_rows(&p, 0, 64, &zero) == CUBLAS_STATUS_SUCCESS);
  d = find_launch(t, "mt_instr_digest", 0);
  CHECK(d >= 0 && ((const mt_instr_digest_args *)event(d)->args)->threshold == 1ull << 62);
  uint64_t wid = mt_instr_weight_id(mt_t_weight_sum(p.w, IN, p.out, IN), p.out, IN, 0);
  int large = 0, small = 0, both = 0;
  for (int i = 0; i < p.tokens; i++) {
    const uint16_t *x = p.x + (size_t)i * IN;
    const uint64_t lead = mt_instr_lead_hash(x, IN, 0);
    large += lead < 3ull << 59;
    small += i < 64 && lead < 1ull << 62;
    both += i < 64 && lead < 3ull << 59;
    if (lead < 3ull << 59 || (i < 64 && lead < 1ull << 62))
      printf("#info key %016" PRIx64 "\n",
             mt_instr_key(mt_instr_row_hash(x, IN, 0), wid, 0, 1.0f, 0));
  }
  printf("#info large %d\n#info small %d\n#info both %d\n", large, small, both);
  check_clean();
  unmake(&p);
}

/* MINITE_SHADOW=MINITE_PROBE=1/2, MINITE_DIGEST=1/4, one slot, rows none of which the digest
 * chooses: the first call (shadow and probe) takes the scratch on S1; the second, digests only,
 * reuses the slot and publishes its flag alone, marked empty; the third, on S2, finds the scratch
 * free (the slot's sequence has moved past its user's, the marked bit aside). */
static void scenario_busy_empty(void) {
  problem p = make(OUT, 4);
  for (int i = 0; i < p.tokens; i++) /* no row chosen at 1/4: lead hashes from 2^62 up */
    while (mt_instr_lead_hash(p.x + (size_t)i * IN, IN, 0) < 1ull << 62)
      p.x[(size_t)i * IN] += 1;
  CHECK(gemm(&p, &zero) == CUBLAS_STATUS_SUCCESS);
  usleep(20000); /* the writer frees the one slot */
  int t = now();
  CHECK(gemm(&p, &zero) == CUBLAS_STATUS_SUCCESS);
  int f = find_launch(t, "mt_instr_finish", 0);
  CHECK(f >= 0 && ((const mt_instr_finish_args *)event(f)->args)->empty_ok == 1 &&
        find_launch(t, "mt_instr_shadow", 0) < 0);
  usleep(20000);
  set_stream(S2);
  t = now();
  CHECK(gemm(&p, &zero) == CUBLAS_STATUS_SUCCESS);
  CHECK(find_launch(t, "mt_instr_shadow", 0) >= 0 && find_launch(t, "mt_instr_probe", 0) >= 0);
  check_clean();
  unmake(&p);
}

static const mt_t_scenario scenarios[] = {
    {"strided", scenario_strided},
    {"busy", scenario_busy},
    {"busy_empty", scenario_busy_empty},
    {"fork", scenario_fork},
    {"digest", scenario_digest},
    {"digest_frozen", scenario_digest_frozen},
    {"digest_in_out", scenario_digest_in_out},
    {"sampling", scenario_sampling},
    {"lead", scenario_lead},
    {"small_calls", scenario_small_calls},
    {"small_calls_low_rate", scenario_small_calls_low_rate},
    {"nested", scenario_nested},
    {"capture", scenario_capture},
    {"capture_off", scenario_capture_off},
    {"capture_no_digest", scenario_capture_no_digest},
    {"bounded", scenario_bounded},
    {"join", scenario_join},
};

/* ======================================================================================== */
/* The parent.                                                                              */
/* ======================================================================================== */

static double json_num_in(const char *s, const char *within, const char *key) {
  const char *w = s && within ? strstr(s, within) : s;
  char pat[128];
  snprintf(pat, sizeof pat, "\"%s\": ", key);
  const char *p = w ? strstr(w, pat) : NULL;
  return p ? strtod(p + strlen(pat), NULL) : NAN;
}

/* Every "#info key K" of the child is the key of a digest record in its statistics file. */
static void check_keys_in_file(const mt_t_child *r, int want_keys) {
  int keys, found = mt_t_keys_in_file(r, &keys);
  CHECKF(keys == want_keys && found == keys, "%d of %d keys found (want %d)", found, keys,
         want_keys);
}

/* The twin's mix64, signs and sketch against tools/minite-compare's Python reference. */
static void twin_matches_python_reference(void) {
  const char *py = getenv("PYTHON") ? getenv("PYTHON") : "python3";
  char rows_path[PATH_MAX + 32], script[PATH_MAX + 32], outp[PATH_MAX + 32], cmd[4 * PATH_MAX];
  snprintf(rows_path, sizeof rows_path, "%s/rows.txt", mt_t_paths.tmp);
  snprintf(script, sizeof script, "%s/ref.py", mt_t_paths.tmp);
  snprintf(outp, sizeof outp, "%s/ref.out", mt_t_paths.tmp);
  enum { NROWS = 6 };
  static const int lens[NROWS] = {1, 7, 16, 100, 768, 2048};
  FILE *f = fopen(rows_path, "w");
  uint16_t *rows[NROWS];
  uint32_t s = 99;
  for (int r = 0; r < NROWS; r++) {
    rows[r] = malloc((size_t)lens[r] * 2);
    for (int j = 0; j < lens[r]; j++) {
      s = s * 1664525u + 1013904223u;
      rows[r][j] = (uint16_t)(0x3c00 + (s >> 20) % 0x800) ^ (uint16_t)((s >> 3) & 0x8000);
      fprintf(f, "%s%.9g", j ? " " : "", mt_instr_half_to_float(rows[r][j], 0));
    }
    fprintf(f, "\n");
  }
  fclose(f);
  f = fopen(script, "w");
  fprintf(
      f, "import importlib.machinery, importlib.util, sys\n"
         "ld = importlib.machinery.SourceFileLoader('mc', 'tools/minite-compare')\n"
         "m = importlib.util.module_from_spec(importlib.util.spec_from_loader('mc', ld))\n"
         "ld.exec_module(m)\n"
         "for z in (0, 1, 0x6D696E6974652D31, 2**64 - 1): print('mix %%d %%d' %% (z, m.mix64(z)))\n"
         "for line in open(sys.argv[1]):\n"
         "    row = [float(v) for v in line.split()]\n"
         "    print('sketch ' + ' '.join('%%.17g' %% v for v in m.sketch(row)))\n");
  fclose(f);
  snprintf(cmd, sizeof cmd, "%s %s %s > %s", py, script, rows_path, outp);
  if (system(cmd) != 0) {
    for (int r = 0; r < NROWS; r++)
      free(rows[r]);
    SKIP("%s could not run tools/minite-compare's reference", py);
  }
  char *ref = mt_t_read_file(outp, NULL);
  const char *p = ref;
  int mixes = 0, sketches = 0;
  while (p && *p) {
    if (!strncmp(p, "mix ", 4)) {
      unsigned long long z = strtoull(p + 4, (char **)&p, 10), want = strtoull(p, NULL, 10);
      CHECKF(mt_instr_mix64(z) == want, "mix64(%llu)", z);
      mixes++;
    } else if (!strncmp(p, "sketch ", 7) && sketches < NROWS) {
      float got[MT_INSTR_SKETCH];
      mt_instr_sketch(rows[sketches], lens[sketches], 0, got);
      double norm = 0;
      for (int j = 0; j < lens[sketches]; j++)
        norm += pow(mt_instr_half_to_float(rows[sketches][j], 0), 2);
      p += 7;
      for (int i = 0; i < MT_INSTR_SKETCH; i++) {
        double want = strtod(p, (char **)&p);
        /* FP32 sums: within a few ulps of the row's norm */
        CHECKF(fabs(got[i] - want) <= 1e-6 * sqrt(norm) + 1e-30, "row %d value %d: %.9g vs %.17g",
               sketches, i, got[i], want);
      }
      sketches++;
    }
    p = strchr(p, '\n');
    p = p ? p + 1 : NULL;
  }
  CHECKF(mixes == 4 && sketches == NROWS, "%d mixes, %d sketches read", mixes, sketches);
  free(ref);
  for (int r = 0; r < NROWS; r++)
    free(rows[r]);
}

static void digest_launches_and_records(void) {
  const char *env[] = {"MINITE_DIGEST=1", NULL};
  mt_t_child r;
  mt_t_run_child("digest", "digest", env, &r);
  mt_t_check_child("digest", &r);
  /* 8 + 8 + 3 rows, 5 of the Lt call with bias; the beta call skipped */
  CHECKF(mt_t_count_of(r.stats, "\"event\": \"digest\"") == 24, "%d digest records",
         mt_t_count_of(r.stats, "\"event\": \"digest\""));
  check_keys_in_file(&r, 16);
  CHECK(mt_t_json_int_in(r.summary, "\"digests\": {", "written") == 24 &&
        mt_t_json_int_in(r.summary, "\"digests\": {", "dropped") == 0);
  CHECK(mt_t_json_int_in(r.summary, "\"digest\": {\"rate\"", "calls") == 5 &&
        mt_t_json_int_in(r.summary, "\"digest\": {\"rate\"", "beta") == 1);
  /* the fake GEMM writes the mark everywhere: every output row has the same hash */
  uint16_t mark[OUT];
  for (int i = 0; i < OUT; i++)
    mark[i] = FAKE_CUDA_MARK;
  char pat[64];
  snprintf(pat, sizeof pat, "\"hash\": \"%016" PRIx64 "\"", mt_instr_out_hash(mark, OUT, 0));
  CHECK(mt_t_count_of(r.stats, pat) == 24);
  CHECKF(r.err && !r.err[0], "stderr: %s", r.err);
  mt_t_child_free(&r);
}

static void digest_chooses_rows_by_their_lead(void) {
  const char *env[] = {"MINITE_DIGEST=1/4", "MINITE_DIGEST_CALLS=all", "MINITE_INSTR_SLOTS=1",
                       NULL};
  mt_t_child r;
  mt_t_run_child("lead", "lead", env, &r);
  mt_t_check_child("lead", &r);
  long chosen = mt_t_info(&r, "chosen"), otherwise = mt_t_info(&r, "otherwise");
  CHECKF(chosen > 0 && chosen < 64 && chosen % 2 == 0 && otherwise > 0,
         "%ld rows chosen by their lead (pairs), %ld the whole row's hash would choose otherwise",
         chosen, otherwise);
  CHECKF(mt_t_count_of(r.stats, "\"event\": \"digest\"") == 2 * chosen,
         "%d digest records, want %ld", mt_t_count_of(r.stats, "\"event\": \"digest\""),
         2 * chosen);
  CHECK(mt_t_json_int_in(r.summary, "\"digest\": {\"rate\"", "calls") == 65 &&
        mt_t_json_int_in(r.summary, "\"digest\": {\"rate\"", "no slot") < 1);
  check_keys_in_file(&r, chosen);
  mt_t_child_free(&r);
}

/* Small uncaptured calls are digested by their route's count of rows (scenario_small_calls): 8 of
 * the 13 calls (the captured one among them), 5 passed over; all 13 under MINITE_DIGEST_CALLS=all.
 * The captured call's replays are not run, so it writes its rows once, at capture. At 1/4096 the
 * period stops at 64 rows (scenario_small_calls_low_rate): 5 of 6 calls. */
static void small_calls_digested_by_their_rows(void) {
  for (int all = 0; all < 2; all++) {
    const char *env[] = {"MINITE_DIGEST=1/4", "MINITE_LOG_LEVEL=INFO",
                         all ? "MINITE_DIGEST_CALLS=all" : NULL, NULL};
    mt_t_child r;
    mt_t_run_child("small_calls", all ? "small_calls_all" : "small_calls", env, &r);
    mt_t_check_child("small_calls", &r);
    CHECKF(r.err && strstr(r.err, all ? "digests 0.25 of rows (of every call;"
                                      : "digests 0.25 of rows (of every call of 4 rows or more, "
                                        "one in about 4 / m of others;"),
           "%s", r.err ? r.err : "(no stderr)");
    CHECKF(mt_t_json_int_in(r.summary, "\"digest\": {\"rate\"", "calls") == (all ? 13 : 8) &&
               mt_t_json_int_in(r.summary, "\"digest\": {\"rate\"", "passed") == (all ? 0 : 5),
           "%s: %s", all ? "all" : "sampled", r.summary ? r.summary : "(no summary)");
    mt_t_child_free(&r);
  }
  const char *env[] = {"MINITE_DIGEST=1/4096", NULL};
  mt_t_child r;
  mt_t_run_child("small_calls_low_rate", "small_calls_low_rate", env, &r);
  mt_t_check_child("small_calls_low_rate", &r);
  CHECK(mt_t_json_int_in(r.summary, "\"digest\": {\"rate\"", "calls") == 5 &&
        mt_t_json_int_in(r.summary, "\"digest\": {\"rate\"", "passed") == 1);
  mt_t_child_free(&r);
}

/* A large call keeps the rows of the lowest lead hashes, none dropped, and a call of some of its
 * rows keeps them again (scenario_nested). */
static void large_calls_keep_nested_rows(void) {
  const char *env[] = {"MINITE_DIGEST=1/4", NULL};
  mt_t_child r;
  mt_t_run_child("nested", "nested", env, &r);
  mt_t_check_child("nested", &r);
  long large = mt_t_info(&r, "large"), small = mt_t_info(&r, "small"), both = mt_t_info(&r, "both");
  /* ~96 of 1,024 at 3/32 and ~16 of 64 at 1/4; a row below 3 x 2^59 is below 2^62 */
  CHECKF(large > 48 && large <= 128 && small > 4 && both > 0 && both <= small,
         "large call %ld rows, small %ld, both %ld", large, small, both);
  CHECKF(mt_t_count_of(r.stats, "\"event\": \"digest\"") == large + small,
         "%d digest records, want %ld", mt_t_count_of(r.stats, "\"event\": \"digest\""),
         large + small);
  CHECK(mt_t_json_int_in(r.summary, "\"digests\": {", "dropped") == 0);
  check_keys_in_file(&r, (int)(large + small - both));
  mt_t_child_free(&r);
}

static void digest_frozen_uses_the_cache_sum(void) {
  const char *sampled[] = {"MINITE_DIGEST=1", "MINITE_WEIGHT_CACHE=frozen-sampled", "MT_SAMPLED=1",
                           NULL};
  mt_t_child r;
  mt_t_run_child("digest_frozen", "digest_sampled", sampled, &r);
  mt_t_check_child("digest_frozen sampled", &r);
  /* the fake's wcheck computes nothing: the stored sum is 0, so the key differs from the twin's:
   * what is checked is that the stored sum (not the weight's) reached the records */
  CHECK(mt_t_count_of(r.stats, "\"event\": \"digest\"") == 4);
  int keys;
  CHECK(mt_t_keys_in_file(&r, &keys) == 0 && keys == 4);
  mt_t_child_free(&r);
  /* frozen: the weight's sample summed, so the keys are the content keys of every other mode */
  const char *env[] = {"MINITE_DIGEST=1", "MINITE_WEIGHT_CACHE=frozen", NULL};
  mt_t_run_child("digest_frozen", "digest_frozen", env, &r);
  mt_t_check_child("digest_frozen", &r);
  check_keys_in_file(&r, 4);
  mt_t_child_free(&r);
}

static void digest_in_out_keys_as_out_in(void) {
  const char *env[] = {"MINITE_DIGEST=1", "MINITE_WEIGHT_CACHE=frozen-sampled", NULL};
  mt_t_child r;
  mt_t_run_child("digest_in_out", "digest_in_out", env, &r);
  mt_t_check_child("digest_in_out", &r);
  CHECK(mt_t_count_of(r.stats, "\"event\": \"digest\"") == 4);
  check_keys_in_file(&r, 4);
  mt_t_child_free(&r);
}

/* The same sampling on kept weights (frozen): the probe's rows read the call's dequantized copy
 * (scenario_sampling counts the dequantizations). */
static void probe_on_a_kept_weight(void) {
  const char *env[] = {"MINITE_SHADOW=1/3", "MINITE_PROBE=0.5", "MINITE_WEIGHT_CACHE=frozen", NULL};
  mt_t_child r;
  mt_t_run_child("sampling", "sampling_frozen", env, &r);
  mt_t_check_child("sampling_frozen", &r);
  CHECK(mt_t_info(&r, "shadows") == 3 && mt_t_info(&r, "probes") == 4);
  CHECK(mt_t_json_int_in(r.summary, "\"256x512\": {\"shadow\"", "differing") == 0);
  mt_t_child_free(&r);
}

static void sampling_is_per_route_and_deterministic(void) {
  const char *env[] = {"MINITE_SHADOW=1/3", "MINITE_PROBE=0.5", NULL};
  mt_t_child r;
  mt_t_run_child("sampling", "sampling", env, &r);
  mt_t_check_child("sampling", &r);
  CHECK(mt_t_info(&r, "shadows") == 3 && mt_t_info(&r, "probes") == 4);
  /* the route's M = 1 calls count for the shadow too: 14 calls, every 3rd */
  CHECKF(mt_t_json_int_in(r.summary, "\"256x512\": {\"shadow\"", "calls") == 5, "%s",
         r.summary ? r.summary : "(no summary)");
  CHECK(mt_t_json_int_in(r.summary, "\"256x512\": {\"shadow\"", "rows") == 16);
  CHECK(mt_t_json_int_in(r.summary, "\"256x512\": {\"shadow\"", "differing") == 0);
  CHECK(mt_t_json_int_in(r.summary, "\"1024x512\": {\"shadow\"", "calls") == 1);
  /* the 16 calls of both routes: 6 shadowed, 10 passed over */
  CHECKF(mt_t_json_int_in(r.summary, "\"shadow\": {\"rate\"", "calls") == 6 &&
             mt_t_json_int_in(r.summary, "\"shadow\": {\"rate\"", "passed") == 10,
         "%s", r.summary ? r.summary : "(no summary)");
  CHECK(mt_t_count_of(r.stats, "\"event\": \"shadow\"") == 6 &&
        mt_t_count_of(r.stats, "\"event\": \"probe\"") == 5);
  /* the fake GEMM's mark against cuBLAS's product: a finite, non-zero error */
  double rel = json_num_in(r.summary, "\"256x512\": {\"shadow\"", "rel_l2_mean");
  CHECKF(rel > 0 && isfinite(rel), "rel_l2_mean %g", rel);
  mt_t_child_free(&r);
}

/* MINITE_DIGEST_REPLAYS=1, 1/2, 1/4: a captured call's digests come from one replay in 1, 2 or 4,
 * whatever count the replays start from (the device memory's), so of the capture's own run and 3
 * replays all 4, exactly 2 or exactly 1 digest; the others choose no row and publish nothing. The
 * writer reads each digesting replay it finds whole; the ones a later replay overwrote first are
 * counted missed: read + missed = the digesting replays. */
static void captured_calls_digest_one_replay_in_r(void) {
  for (int every = 1; every <= 4; every *= 2) {
    char rate[40], tag[40];
    snprintf(rate, sizeof rate, "MINITE_DIGEST_REPLAYS=1/%d", every);
    snprintf(tag, sizeof tag, "capture-%d", every);
    const char *env[] = {"MINITE_DIGEST=1", "MINITE_PROBE=1", rate, NULL};
    mt_t_child r;
    mt_t_run_child("capture", tag, env, &r);
    mt_t_check_child("capture", &r);
    CHECKF(mt_t_json_int_in(r.summary, "\"digest\": {\"rate\"", "capture") < 1 && /* none */
               mt_t_json_int_in(r.summary, "\"probe\": {\"rate\"", "capture") == 1,
           "1/%d: %s", every, r.summary ? r.summary : "");
    long read = mt_t_json_int_in(r.summary, "\"captured\": {", "replays");
    long missed = mt_t_json_int_in(r.summary, "\"captured\": {", "missed");
    CHECKF(mt_t_json_int_in(r.summary, "\"captured\": {", "calls") == 1 && read >= 1 &&
               read + missed == 4 / every,
           "1/%d: captured %ld read, %ld missed: %s", every, read, missed,
           r.summary ? r.summary : "");
    CHECK(mt_t_count_of(r.stats, "\"event\": \"digest\"") == 8 * (2 + read));
    mt_t_child_free(&r);
  }
}

/* MINITE_DIGEST_REPLAYS=0: captured calls are not digested (skipped as `capture`). */
static void captured_calls_without_replay_digests(void) {
  const char *env[] = {"MINITE_DIGEST=1", "MINITE_DIGEST_REPLAYS=0", NULL};
  mt_t_child r;
  mt_t_run_child("capture_off", "capture-off", env, &r);
  mt_t_check_child("capture_off", &r);
  CHECKF(mt_t_json_int_in(r.summary, "\"digest\": {\"rate\"", "capture") == 1 &&
             mt_t_json_int_in(r.summary, "\"captured\": {", "calls") == 0,
         "%s", r.summary ? r.summary : "");
  CHECK(mt_t_count_of(r.stats, "\"event\": \"digest\"") == 8 * 2);
  mt_t_child_free(&r);
}

/* MINITE_DIGEST=0: a captured call's shadow and probe are skipped as `capture`
 * (scenario_capture_no_digest). */
static void captured_calls_without_digests(void) {
  const char *env[] = {"MINITE_DIGEST=0", "MINITE_SHADOW=1", "MINITE_PROBE=1", NULL};
  mt_t_child r;
  mt_t_run_child("capture_no_digest", "capture-no-digest", env, &r);
  mt_t_check_child("capture_no_digest", &r);
  CHECKF(mt_t_json_int_in(r.summary, "\"shadow\": {\"rate\"", "capture") == 1 &&
             mt_t_json_int_in(r.summary, "\"probe\": {\"rate\"", "capture") == 1 &&
             mt_t_json_int_in(r.summary, "\"captured\": {", "calls") == 0,
         "%s", r.summary ? r.summary : "(no summary)");
  CHECK(mt_t_count_of(r.stats, "\"event\": \"digest\"") == 0);
  mt_t_child_free(&r);
}

/* A captured call's replay that chose no row publishes nothing (the flag is not touched: no round
 * trip over the bus), so the writer reads none and misses none. */
static void captured_replays_without_rows_publish_nothing(void) {
  /* no row passes; every call is looked at */
  const char *env[] = {"MINITE_DIGEST=1e-18", "MINITE_DIGEST_CALLS=all", "MINITE_PROBE=1", NULL};
  mt_t_child r;
  mt_t_run_child("capture", "capture-none", env, &r);
  mt_t_check_child("capture", &r);
  long read = mt_t_json_int_in(r.summary, "\"captured\": {", "replays");
  long missed = mt_t_json_int_in(r.summary, "\"captured\": {", "missed");
  CHECKF(mt_t_json_int_in(r.summary, "\"captured\": {", "calls") == 1 && read == 0 && missed == 0,
         "captured %ld read, %ld missed: %s", read, missed, r.summary ? r.summary : "");
  CHECK(mt_t_count_of(r.stats, "\"event\": \"digest\"") == 0);
  mt_t_child_free(&r);
}

static void bounded_slots_drop_and_count(void) {
  const char *env[] = {"MINITE_DIGEST=1", "MINITE_INSTR_SLOTS=256", NULL};
  mt_t_child r;
  mt_t_run_child("bounded", "bounded", env, &r);
  mt_t_check_child("bounded", &r);
  long held = mt_t_info(&r, "held_digests");
  CHECKF(held == 256, "%ld calls instrumented while every event was held, want the 256 slots",
         held);
  /* 128 of the big call's 200 rows + 256 x 2 + 3 x 2 written; 72 rows dropped; 44 calls found no
   * slot; 5 calls in flight at exit */
  CHECKF(mt_t_json_int_in(r.summary, "\"digests\": {", "written") == 128 + 512 + 6, "%s",
         r.summary ? strstr(r.summary, "\"digests\"") : "");
  CHECK(mt_t_json_int_in(r.summary, "\"digests\": {", "dropped") == 72);
  CHECK(mt_t_json_int_in(r.summary, "\"digest\": {\"rate\"", "no slot") == 44);
  CHECK(mt_t_json_int_in(r.summary, "\"digest\": {\"rate\"", "exit") == 5);
  CHECK(mt_t_json_int_in(r.summary, "\"instruments\": {", "dropped_calls") == 44);
  mt_t_child_free(&r);
}

static void scratch_busy_on_another_stream(void) {
  const char *env[] = {"MINITE_SHADOW=1", "MINITE_PROBE=1", "MINITE_DIGEST=1", NULL};
  mt_t_child r;
  mt_t_run_child("busy", "busy", env, &r);
  mt_t_check_child("busy", &r);
  CHECK(mt_t_json_int_in(r.summary, "\"shadow\": {\"rate\"", "busy") == 2 &&
        mt_t_json_int_in(r.summary, "\"probe\": {\"rate\"", "busy") == 2);
  CHECKF(mt_t_json_int_in(r.summary, "\"digests\": {", "written") == 24, "%ld",
         mt_t_json_int_in(r.summary, "\"digests\": {", "written"));
  mt_t_child_free(&r);
}

static void scratch_free_after_an_empty_publication(void) {
  const char *env[] = {"MINITE_SHADOW=1/2", "MINITE_PROBE=1/2", "MINITE_DIGEST=1/4",
                       "MINITE_INSTR_SLOTS=1", NULL};
  mt_t_child r;
  mt_t_run_child("busy_empty", "busy_empty", env, &r);
  mt_t_check_child("busy_empty", &r);
  CHECK(mt_t_json_int_in(r.summary, "\"shadow\": {\"rate\"", "busy") < 1 &&
        mt_t_json_int_in(r.summary, "\"digests\": {", "written") == 0);
  mt_t_child_free(&r);
}

static void fork_child_instruments_nothing(void) {
  /* No leak check under ASan: the forked child inherits the allocator's locks as the parent's
   * writer thread held them, and LeakSanitizer, locking them all at the child's exit, could wait
   * forever for one (seen: a hang in about one run of twenty under load, in
   * __lsan::LockAllocator). */
  const char *env[] = {"MINITE_DIGEST=1", "ASAN_OPTIONS=detect_leaks=0", NULL};
  mt_t_child r;
  mt_t_run_child("fork", "fork", env, &r);
  mt_t_check_child("fork", &r);
  CHECK(mt_t_count_of(r.stats, "\"event\": \"summary\"") == 1);
  CHECK(mt_t_json_int_in(r.summary, "\"digests\": {", "written") == 8);
  mt_t_child_free(&r);
}

/* Two processes, the same rows in different batches: minite-compare joins every row, equal. */
static void join_two_batchings_through_minite_compare(void) {
  const char *py = getenv("PYTHON") ? getenv("PYTHON") : "python3";
  const char *spec_env[2] = {"MINITE_SPEC=nvfp4-row", "MINITE_SPEC=bf16"};
  for (int s = 0; s < 2; s++) {
    const char *a_env[] = {"MINITE_DIGEST=1", "MT_BATCHES=64", spec_env[s], NULL};
    const char *b_env[] = {"MINITE_DIGEST=1",
                           "MINITE_SHADOW=1",
                           "MINITE_PROBE=1",
                           "MT_BATCHES=7,1",
                           "MT_REVERSE=1",
                           spec_env[s],
                           NULL};
    mt_t_child a, b;
    mt_t_run_child("join", s ? "join_bf16_a" : "join_a", a_env, &a);
    mt_t_run_child("join", s ? "join_bf16_b" : "join_b", b_env, &b);
    mt_t_check_child("join a", &a);
    mt_t_check_child("join b", &b);
    char cmd[4 * PATH_MAX], out[PATH_MAX + 32];
    snprintf(out, sizeof out, "%s/compare%d.json", mt_t_paths.tmp, s);
    snprintf(cmd, sizeof cmd, "%s tools/minite-compare %s %s --json > %s", py, a.path, b.path, out);
    int st = system(cmd);
    char *doc = mt_t_read_file(out, NULL);
    CHECKF(st == 0 && doc, "minite-compare exit %d", st);
    const char *total = doc ? strstr(doc, "\"total\"") : NULL;
    CHECKF(mt_t_json_int_in(total, NULL, "matched") == 64 &&
               mt_t_json_int_in(total, NULL, "equal") == 64,
           "%s: %.600s", spec_env[s], total ? total : "(no total)");
    if (s == 1) { /* bf16: cuBLAS against cuBLAS: the shadow is exactly 0, no row differs alone */
      CHECKF(json_num_in(b.summary, "\"256x512\": {\"shadow\"", "rel_l2_max") == 0.0 &&
                 json_num_in(b.summary, "\"256x512\": {\"shadow\"", "max_abs") == 0.0,
             "%s", b.summary ? b.summary : "");
      CHECK(mt_t_json_int_in(b.summary, "\"256x512\": {\"shadow\"", "calls") > 0);
      CHECK(mt_t_json_int_in(b.summary, "\"256x512\": {\"shadow\"", "differing") == 0 &&
            mt_t_json_int_in(b.summary, "\"256x512\": {\"shadow\"", "rows") > 0);
    }
    free(doc);
    mt_t_child_free(&a), mt_t_child_free(&b);
  }
}

static void strided_batch_gets_every_instrument(void) {
  const char *env[] = {"MINITE_SHADOW=1", "MINITE_PROBE=1", "MINITE_DIGEST=1", NULL};
  mt_t_child r;
  mt_t_run_child("strided", "strided", env, &r);
  mt_t_check_child("strided", &r);
  check_keys_in_file(&r, 24);
  const char *route = "\"256x512\": {\"shadow\"";
  CHECK(mt_t_json_int_in(r.summary, route, "calls") == 1);
  double rel = json_num_in(r.summary, route, "rel_l2_mean");
  CHECKF(rel > 0 && isfinite(rel), "rel_l2_mean %g: the fake engine's mark against cuBLAS's", rel);
  CHECK(mt_t_json_int_in(r.summary, route, "rows") == 4 &&
        mt_t_json_int_in(r.summary, route, "differing") == 0);
  CHECK(mt_t_json_int_in(r.summary, "\"digests\": {", "written") == 24);
  CHECKF(r.err && !r.err[0], "stderr: %s", r.err);
  mt_t_child_free(&r);
}

static void tests(void) {
  RUN(twin_matches_python_reference);
  RUN(digest_launches_and_records);
  RUN(digest_chooses_rows_by_their_lead);
  RUN(small_calls_digested_by_their_rows);
  RUN(large_calls_keep_nested_rows);
  RUN(digest_frozen_uses_the_cache_sum);
  RUN(digest_in_out_keys_as_out_in);
  RUN(sampling_is_per_route_and_deterministic);
  RUN(probe_on_a_kept_weight);
  RUN(captured_calls_digest_one_replay_in_r);
  RUN(captured_calls_without_replay_digests);
  RUN(captured_calls_without_digests);
  RUN(captured_replays_without_rows_publish_nothing);
  RUN(bounded_slots_drop_and_count);
  RUN(scratch_busy_on_another_stream);
  RUN(scratch_free_after_an_empty_publication);
  RUN(fork_child_instruments_nothing);
  RUN(join_two_batchings_through_minite_compare);
  RUN(strided_batch_gets_every_instrument);
}

int main(int argc, char **argv) {
  return mt_t_scenario_main(argc, argv, "/tmp/mt_shim_instr.XXXXXX", ROUTES, load_fakes, scenarios,
                            sizeof scenarios / sizeof scenarios[0], tests);
}
