/* test_shim_units.c — the shim's modules one at a time: the router's decision table, parameter
 * path templates, the log line format (control characters escaped), the census's order and
 * suggested-route rule, and the hook's answer when no real cuBLAS is in the process. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/log.h"
#include "base/proc.h"
#include "shim/router.h"
#include "shim/stats.h"
#include "tests/harness.h"

static mt_spec spec;

/* A forward call PyTorch's F.linear would make for the routed weight 64x32, details read. */
static mt_call forward(void) {
  static _Alignas(16) char buf[4][64];
  static const float one = 1.0f, zero = 0.0f;
  return (mt_call){
      .entry = MT_FN_cublasGemmEx,
      .transa = CUBLAS_OP_T,
      .transb = CUBLAS_OP_N,
      .m = 64,
      .n = 5,
      .k = 32,
      .atype = CUDA_R_16BF,
      .btype = CUDA_R_16BF,
      .ctype = CUDA_R_16BF,
      .dtype = CUDA_R_16BF,
      .compute = CUBLAS_COMPUTE_32F,
      .scale_type = -1,
      .a = buf[0],
      .b = buf[1],
      .c = buf[2],
      .d = buf[2],
      .lda = 32,
      .ldb = 32,
      .ldc = 64,
      .ldd = 64,
      .batch = 1,
      .alpha = &one,
      .beta = &zero,
      .ptr_mode = MT_PTR_HOST,
      .device = -1,
      .epilogue = CUBLASLT_EPILOGUE_DEFAULT,
      .bias_type = -1,
      .details = 1,
      .details_ok = 1,
  };
}

static void setup_spec(void) {
  mt_spec_errors errs = {0};
  CHECK(mt_spec_builtin("nvfp4-row", &spec) == 0);
  CHECK(mt_spec_add_routes(&spec, "64x32, 48x24", &errs) == 0);
}

static void router_decision_table(void) {
  setup_spec();
  struct {
    const char *what;
    mt_call c;
    enum mt_reason want;
  } rows[64];
  int n = 0;
  mt_call c = forward();
#define ROW(text, expr, reason)                                                                    \
  do {                                                                                             \
    c = forward();                                                                                 \
    expr;                                                                                          \
    rows[n].what = text, rows[n].c = c, rows[n].want = reason, n++;                                \
  } while (0)
  ROW("F.linear forward", (void)0, MT_R_ROUTED);
  ROW("legacy compute type CUDA_R_32F", c.compute = CUDA_R_32F, MT_R_ROUTED);
  ROW("FP16 operands and output", (c.atype = c.btype = c.ctype = c.dtype = CUDA_R_16F),
      MT_R_ROUTED);
  ROW("op C counts as op T", c.transa = CUBLAS_OP_C, MT_R_ROUTED);
  ROW("Lt BIAS epilogue",
      (c.entry = MT_FN_cublasLtMatmul, c.epilogue = CUBLASLT_EPILOGUE_BIAS,
       c.scale_type = CUDA_R_32F),
      MT_R_ROUTED);
  ROW("unrouted shape", (c.m = 16, c.k = 16), MT_R_UNROUTED);
  ROW("TT is no GEMM of the weight", c.transb = CUBLAS_OP_T, MT_R_UNROUTED);
  ROW("an op that is no cublasOperation_t", c.transa = 3, MT_R_UNROUTED);
  ROW("NULL alpha (cuBLAS refuses it)", c.alpha = NULL, MT_R_LAYOUT);
  ROW("NULL beta", c.beta = NULL, MT_R_LAYOUT);
  ROW("dgrad NN", (c.transa = CUBLAS_OP_N, c.m = 32, c.k = 64), MT_R_DGRAD);
  ROW("forward of a weight stored [in][out], x @ W (NN, m = out, k = in)",
      (c.transa = CUBLAS_OP_N, c.lda = 64), MT_R_ROUTED);
  ROW("a strided batch of them (a capacity einsum)",
      (c.transa = CUBLAS_OP_N, c.lda = 64, c.entry = MT_FN_cublasGemmStridedBatchedEx, c.batch = 4,
       c.stride_a = 64 * 32, c.stride_b = 32 * 5, c.stride_c = c.stride_d = 64 * 5),
      MT_R_ROUTED);
  ROW("an [in][out] weight's stored rows shorter than out (lda < m)",
      (c.transa = CUBLAS_OP_N, c.lda = 32), MT_R_LAYOUT);
  ROW("an [in][out] forward with a row-order A",
      (c.transa = CUBLAS_OP_N, c.lda = 64, c.order_a = 1), MT_R_LAYOUT);
  ROW("wgrad NT", (c.transa = CUBLAS_OP_N, c.transb = CUBLAS_OP_T, c.m = 32, c.n = 64, c.k = 5),
      MT_R_WGRAD);
  ROW("FP32 operands", (c.atype = c.btype = CUDA_R_32F), MT_R_DTYPE);
  ROW("mixed BF16/FP16", c.btype = CUDA_R_16F, MT_R_DTYPE);
  ROW("FP32 output", (c.ctype = c.dtype = CUDA_R_32F), MT_R_DTYPE);
  ROW("TF32 compute", c.compute = CUBLAS_COMPUTE_32F_FAST_TF32, MT_R_COMPUTE);
  ROW("Lt FP16 scale type", (c.entry = MT_FN_cublasLtMatmul, c.scale_type = CUDA_R_16F),
      MT_R_COMPUTE);
  ROW("device pointer mode", c.ptr_mode = MT_PTR_DEVICE, MT_R_POINTER_MODE);
  ROW("Lt RELU epilogue", c.epilogue = CUBLASLT_EPILOGUE_RELU, MT_R_EPILOGUE);
  ROW("Lt BIAS of FP64", (c.epilogue = CUBLASLT_EPILOGUE_BIAS, c.bias_type = CUDA_R_64F),
      MT_R_EPILOGUE);
  ROW("row-major Lt", c.order_b = CUBLASLT_ORDER_ROW, MT_R_LAYOUT);
  ROW("row-major Lt A", c.order_a = CUBLASLT_ORDER_ROW, MT_R_LAYOUT);
  ROW("row-major Lt C", c.order_c = CUBLASLT_ORDER_ROW, MT_R_LAYOUT);
  ROW("row-major Lt D", c.order_d = CUBLASLT_ORDER_ROW, MT_R_LAYOUT);
  ROW("output leading dimension below m", (c.ldc = c.ldd = 56), MT_R_LAYOUT);
  ROW("D of another type than C", c.dtype = CUDA_R_16F, MT_R_DTYPE);
  ROW("a shape past uint32 is no route", (c.m = 64 + (1LL << 32)), MT_R_UNROUTED);
  ROW("negative batch stride of B",
      (c.entry = MT_FN_cublasGemmStridedBatchedEx, c.batch = 2, c.stride_a = 64 * 32,
       c.stride_b = -32 * 5, c.stride_c = c.stride_d = 64 * 5),
      MT_R_LAYOUT);
  ROW("Lt batch writing one output twice", (c.entry = MT_FN_cublasLtMatmul, c.batch = 2),
      MT_R_LAYOUT);
  ROW("Lt strided batch",
      (c.entry = MT_FN_cublasLtMatmul, c.batch = 2, c.stride_a = 64 * 32, c.stride_b = 32 * 5,
       c.stride_c = c.stride_d = 64 * 5),
      MT_R_ROUTED);
  ROW("Lt pointer-array batch",
      (c.entry = MT_FN_cublasLtMatmul, c.batch = 2, c.pointer_arrays = MT_PA_ALL), MT_R_ROUTED);
  ROW("batch stride not a multiple of 8",
      (c.entry = MT_FN_cublasGemmStridedBatchedEx, c.batch = 2, c.stride_a = 64 * 32 + 4,
       c.stride_d = 64 * 5),
      MT_R_LAYOUT);
  ROW("grouped_mm forward, tokens per expert on the device",
      (c.entry = MT_FN_torch_grouped_mm, c.batch = 8, c.ragged = MT_RAGGED_N, c.stride_a = 64 * 32),
      MT_R_ROUTED);
  ROW("grouped_mm dgrad", (c.transa = CUBLAS_OP_N, c.m = 32, c.k = 64, c.ragged = MT_RAGGED_N),
      MT_R_DGRAD);
  ROW("grouped_mm wgrad, k per expert on the device",
      (c.transa = CUBLAS_OP_N, c.transb = CUBLAS_OP_T, c.m = 32, c.n = 64, c.k = 500,
       c.ragged = MT_RAGGED_K),
      MT_R_WGRAD);
  ROW("a forward's k on the device is no forward", c.ragged = MT_RAGGED_K, MT_R_UNROUTED);
  ROW("m on the device: no role", (c.ragged = MT_RAGGED_M), MT_R_UNROUTED);
  ROW("ld not a multiple of 8", c.ldb = 36, MT_R_LAYOUT);
  ROW("unaligned pointer", c.b = (const char *)c.b + 2, MT_R_LAYOUT);
  ROW("details unreadable", c.details_ok = 0, MT_R_LAYOUT);
  ROW("k not a multiple of 16", (c.m = 48, c.k = 24, c.lda = c.ldb = 24, c.ldc = c.ldd = 48),
      MT_R_K_ALIGN);
  ROW("strided batch of routed problems",
      (c.entry = MT_FN_cublasGemmStridedBatchedEx, c.batch = 3, c.stride_a = 64 * 32,
       c.stride_b = 32 * 5, c.stride_c = c.stride_d = 64 * 5),
      MT_R_ROUTED);
  /* found by lab/fuzz_lt.c: an Lt layout of 2^64 - x columns read as a negative token count */
  ROW("negative token count", c.n = -8142508126285856760LL, MT_R_LAYOUT);
  ROW("no tokens", c.n = 0, MT_R_LAYOUT);
  /* found by lab/fuzz_lt.c: an Lt layout's batch count of 0 was routed as one problem */
  ROW("Lt batch count 0", (c.entry = MT_FN_cublasLtMatmul, c.batch = 0), MT_R_LAYOUT);
  ROW("negative batch count", (c.entry = MT_FN_cublasGemmStridedBatchedEx, c.batch = -3),
      MT_R_LAYOUT);
#undef ROW
  CHECK(n <= (int)(sizeof rows / sizeof rows[0]));
  for (int i = 0; i < n; i++) {
    enum mt_reason got = mt_route_decide(&spec, &rows[i].c);
    CHECKF(got == rows[i].want, "%s: %s, expected %s", rows[i].what, mt_reason_name(got),
           mt_reason_name(rows[i].want));
  }
  /* a route whose transpose is a route too: an NN call of either shape is ambiguous, read as
   * MINITE_WEIGHT_LAYOUT says (auto and out-in: PyTorch's dgrad; in-out: the forward) */
  mt_spec both = spec;
  mt_spec_errors berrs = {0};
  CHECK(mt_spec_add_routes(&both, "32x64", &berrs) == 0);
  c = forward();
  c.transa = CUBLAS_OP_N, c.lda = 64;
  CHECK(mt_route_role(&both, &c) == MT_ROLE_DGRAD && mt_route_decide(&both, &c) == MT_R_DGRAD);
  CHECK(mt_route_ambiguous(&both, &c) && !mt_route_ambiguous(&spec, &c));
  CHECK(mt_route_role(&spec, &c) == MT_ROLE_FORWARD_IN_OUT);
  mt_params lp = {.weight_layout = MT_WLAYOUT_IN_OUT};
  mt_router_init(&lp);
  CHECK(mt_route_role(&both, &c) == MT_ROLE_FORWARD_IN_OUT &&
        mt_route_decide(&both, &c) == MT_R_ROUTED);
  CHECK(mt_route_role(&spec, &c) == MT_ROLE_FORWARD_IN_OUT);
  c.m = 32, c.k = 64; /* the other NN shape: the forward of the 32x64 route, stored [in][out] */
  CHECK(mt_route_role(&both, &c) == MT_ROLE_FORWARD_IN_OUT);
  CHECK(mt_route_role(&spec, &c) == MT_ROLE_DGRAD); /* not ambiguous: the shapes decide */
  lp.weight_layout = MT_WLAYOUT_OUT_IN;
  mt_router_init(&lp);
  CHECK(mt_route_role(&both, &c) == MT_ROLE_DGRAD);
  c.transa = CUBLAS_OP_T; /* TN is a forward whatever the parameter */
  CHECK(mt_route_role(&both, &c) == MT_ROLE_FORWARD && !mt_route_ambiguous(&both, &c));
  lp.weight_layout = MT_WLAYOUT_AUTO;
  mt_router_init(&lp);
  c = forward();
  c.transa = CUBLAS_OP_N;
  CHECK(!strcmp(mt_route_role_name(MT_ROLE_FORWARD_IN_OUT), "forward [in, out]") &&
        !strcmp(mt_route_role_name(MT_ROLE_DGRAD), "dgrad") && !mt_route_role_name(MT_ROLE_NONE));
  /* JAX's ragged_dot: one dense NN, m a route's out, k experts x its in */
  int64_t experts = 0;
  c.k = 8 * 32;
  int route = mt_route_ragged_dot(&spec, &c, &experts);
  CHECKF(mt_route_role(&spec, &c) == MT_ROLE_NONE && route >= 0 && spec.routes[route].out == 64 &&
             spec.routes[route].in == 32 && experts == 8,
         "route %d, %lld experts", route, (long long)experts);
  c.k = 32;
  CHECK(mt_route_ragged_dot(&spec, &c, &experts) == -1); /* one expert: the [in, out] forward */
  c.k = 8 * 32 + 16;
  CHECK(mt_route_ragged_dot(&spec, &c, &experts) == -1);
  /* weight_block = 16x16 tiles the out-dimension too (spec/spec.h: mt_spec_route_unusable) */
  mt_spec tiles;
  mt_spec_errors errs = {0};
  static const char text[] = "name = t16\nformat = nvfp4\nelement = e2m1\nblock = 16\n"
                             "block_scale = e4m3\nact_scale = row\nweight_scale = tensor\n"
                             "weight_block = 16x16\nrounding = rne\naccumulate = fp32\n"
                             "backward = bf16\nweight_cache = requantize\nroute 64x32\n"
                             "route 40x32\n";
  CHECK(mt_spec_parse(text, sizeof text - 1, &tiles, &errs) == 0);
  c = forward();
  CHECK(mt_route_decide(&tiles, &c) == MT_R_ROUTED);
  c.m = 40, c.ldc = c.ldd = 40;
  CHECK(mt_route_decide(&tiles, &c) == MT_R_K_ALIGN);
  char why[160];
  CHECK(!mt_spec_route_unusable(&tiles, &tiles.routes[1], why, sizeof why) &&
        mt_spec_route_unusable(&tiles, &tiles.routes[0], why, sizeof why) &&
        strstr(why, "out-dimension 40"));
  CHECK(mt_spec_route_unusable(&spec, &spec.routes[0], why, sizeof why) &&
        strstr(why, "in-dimension 24"));
}

static void reason_names(void) {
  const char *want[MT_R_COUNT] = {
      "unrouted",     "routed",        "backward dgrad", "backward wgrad", "dtype",
      "compute type", "layout",        "epilogue",       "pointer mode",   "k alignment",
      "no engine",    "capture",       "out of memory",  "engine error",   "pointer arrays",
      "torch abi",    "other context", "triton layout",  "sglang kernel",  "expert count"};
  for (int r = 0; r < MT_R_COUNT; r++)
    CHECKF(!strcmp(mt_reason_name(r), want[r]), "%d: %s", r, mt_reason_name(r));
  CHECK(!strcmp(mt_reason_name(MT_R_COUNT), "?"));
}

static void path_templates(void) {
  char out[64], want[64];
  setenv("RANK", "7", 1);
  CHECK(mt_proc_path("a.%r.%%.%p.%x", out, sizeof out) == 0);
  snprintf(want, sizeof want, "a.7.%%.%ld.%%x", (long)getpid());
  CHECKF(!strcmp(out, want), "%s", out);
  setenv("RANK", "-1", 1);
  CHECK(mt_proc_path("%r", out, sizeof out) == 0 && !strcmp(out, "0"));
  CHECK(mt_proc_path("%h", out, sizeof out) == 0 && !strchr(out, '.'));
  CHECK(mt_proc_path("0123456789", out, 10) == -1);
}

static void warn_twice_once(void *arg) {
  (void)arg;
  for (int i = 0; i < 2; i++)
    MT_WARN_ONCE("once %d", 41 + i);
  MT_INFO("not at the WARN level");
}

static void log_none(void *arg) {
  (void)arg;
  atomic_store(&mt_log_level_now, MT_LOG_NONE);
  MT_WARN("silent");
  atomic_store(&mt_log_level_now, MT_LOG_WARN);
}

/* A value with a newline, a carriage return, a tab, ESC and DEL, as a user may set one. */
static void warn_controls(void *arg) {
  (void)arg;
  MT_WARN("role '%s'", "a\nhost:1:1 minite WARN forged\r\t\x1b[31m\x7f");
}

static void log_lines(void) {
  char text[512], want[300];
  mt_t_capture_stderr(warn_twice_once, NULL, text, sizeof text);
  snprintf(want, sizeof want, "%s:%ld:%ld minite WARN once 41\n", mt_proc_host(), (long)getpid(),
           (long)gettid());
  CHECKF(!strcmp(text, want), "got '%s', want '%s'", text, want);
  mt_t_capture_stderr(warn_controls, NULL, text, sizeof text);
  snprintf(want, sizeof want,
           "%s:%ld:%ld minite WARN role 'a\\nhost:1:1 minite WARN forged\\r\\t\\x1b[31m\\x7f'\n",
           mt_proc_host(), (long)getpid(), (long)gettid());
  CHECKF(!strcmp(text, want), "got '%s', want '%s'", text, want);
  mt_t_capture_stderr(log_none, NULL, text, sizeof text);
  CHECKF(text[0] == '\0', "%s", text);
}

static mt_call shape(int ta, int64_t m, int64_t n, int64_t k, int type) {
  mt_call c = forward();
  c.transa = ta, c.m = m, c.n = n, c.k = k;
  c.atype = c.btype = c.ctype = c.dtype = type;
  return c;
}

/* A fresh statistics file at path (a mkstemp template) and an empty census. */
static void stats_fresh(char *path) {
  close(mkstemp(path));
  char why[256] = "";
  CHECKF(mt_stats_open(path, why, sizeof why) == 0, "%s", why);
  mt_stats_reset();
}

static void suggested_routes_rule(void) {
  char path[] = "/tmp/mt_stats_test.XXXXXX";
  stats_fresh(path);
  for (int n = 1; n <= 3; n++) { /* three token counts: an expert */
    mt_call c = shape(CUBLAS_OP_T, 1536, n, 2048, CUDA_R_16BF);
    mt_stats_census(&c);
  }
  for (int i = 0; i < 999; i++) { /* one token count, 999 calls: not yet */
    mt_call c = shape(CUBLAS_OP_T, 4096, 8, 1024, CUDA_R_16BF);
    mt_stats_census(&c);
  }
  for (int i = 0; i < 1000; i++) { /* one token count, 1000 calls */
    mt_call c = shape(CUBLAS_OP_T, 2048, 8, 768, CUDA_R_16F);
    mt_stats_census(&c);
  }
  /* never: PyTorch's dgrad (NN of a weight seen as a TN forward, however few), FP32, the same
   * shape in FP16, nor stored [in][out] (NN with the forward's m and k) */
  mt_call seen = shape(CUBLAS_OP_T, 256, 1, 512, CUDA_R_16BF);
  mt_stats_census(&seen);
  for (int n = 1; n <= 5; n++) {
    mt_call nn = shape(CUBLAS_OP_N, 512, n, 256, CUDA_R_16BF);
    mt_call f32 = shape(CUBLAS_OP_T, 256, n, 512, CUDA_R_32F);
    mt_call f16 = shape(CUBLAS_OP_T, 1536, n, 2048, CUDA_R_16F);
    mt_call in_out = shape(CUBLAS_OP_N, 1536, n, 2048, CUDA_R_16BF);
    mt_stats_census(&nn), mt_stats_census(&f32), mt_stats_census(&f16), mt_stats_census(&in_out);
  }
  for (int n = 1; n <= 4; n++) { /* NN of a shape never seen TN: a forward of an [in][out] weight */
    mt_call jax = shape(CUBLAS_OP_N, 384, n, 192, CUDA_R_16BF);
    mt_stats_census(&jax);
  }
  /* never: B transposed (TT, TC), a layout the router does not take as a forward call, nor counted
   * with the TN calls of the same weight, which have two token counts (not yet) */
  for (int n = 1; n <= 5; n++) {
    mt_call tt = shape(CUBLAS_OP_T, 768, n, 384, CUDA_R_16BF);
    mt_call tc = shape(CUBLAS_OP_T, 640, n, 320, CUDA_R_16BF);
    tt.transb = CUBLAS_OP_T, tc.transb = CUBLAS_OP_C;
    mt_stats_census(&tt), mt_stats_census(&tc);
  }
  for (int n = 6; n <= 7; n++) {
    mt_call tn = shape(CUBLAS_OP_T, 768, n, 384, CUDA_R_16BF);
    mt_stats_census(&tn);
  }
  mt_route r[8];
  int n = mt_stats_suggest(r, 8);
  CHECKF(n == 3, "%d suggestions", n);
  CHECK(n >= 1 && r[0].out == 2048 && r[0].in == 768); /* most calls first */
  CHECK(n >= 2 && r[1].out == 1536 && r[1].in == 2048);
  CHECK(n >= 3 && r[2].out == 384 && r[2].in == 192);
  mt_stats_reset();
  unlink(path);
}

/* The summary's census lists the most frequent shapes first, rows of equal counts by entry, m, n
 * and k (shim/stats.c, write_census); rows differing only in B's op are rows of their own. The
 * counts are added out of order, and the hash table holds these rows out of order too (as a
 * census without its sort would list them). */
static void census_most_calls_first(void) {
  char path[] = "/tmp/mt_stats_test.XXXXXX";
  stats_fresh(path);
  static const struct {
    int tb, count;
    int64_t m;
  } rows[] = {{CUBLAS_OP_N, 3, 96}, {CUBLAS_OP_N, 1, 160}, {CUBLAS_OP_N, 5, 224},
              {CUBLAS_OP_T, 2, 96}, {CUBLAS_OP_N, 4, 288}, {CUBLAS_OP_N, 6, 416},
              {CUBLAS_OP_N, 6, 32}, {CUBLAS_OP_N, 6, 352}};
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
    for (int j = 0; j < rows[i].count; j++) {
      mt_call c = shape(CUBLAS_OP_T, rows[i].m, 8, 64, CUDA_R_16BF);
      c.transb = rows[i].tb;
      mt_stats_census(&c);
    }
  mt_spec bf16;
  CHECK(mt_spec_builtin("bf16", &bf16) == 0);
  mt_stats_start(&bf16, "test", "0");
  mt_stats_finish(NULL);
  char text[8192] = "";
  int fd = open(path, O_RDONLY);
  ssize_t got = fd >= 0 ? read(fd, text, sizeof text - 1) : -1;
  text[got > 0 ? got : 0] = '\0';
  if (fd >= 0)
    close(fd);
  const char *census = strstr(text, "\"census\": [");
  CHECKF(census, "no census in %s", text);
  /* rows of equal counts by m (entry, n and k alike here), as tools/minite-merge orders them */
  const char *at = census;
  static const int64_t tied[] = {32, 352, 416};
  for (int i = 0; census && i < 3; i++) {
    char want[64];
    snprintf(want, sizeof want, "\"m\": %lld, \"n\": 8, \"k\": 64", (long long)tied[i]);
    const char *row = strstr(census, want);
    CHECKF(row && row > at, "tied row m = %lld missing or out of order: %.700s", (long long)tied[i],
           census);
    at = row ? row : at;
  }
  for (int count = 5; census && count >= 1; count--) {
    char want[160];
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
      if (rows[i].count == count)
        snprintf(want, sizeof want,
                 "\"ops\": \"T%c\", \"m\": %lld, \"n\": 8, \"k\": 64, \"types\": "
                 "\"bf16*bf16->bf16\", \"count\": %d}",
                 rows[i].tb == CUBLAS_OP_N ? 'N' : 'T', (long long)rows[i].m, count);
    const char *row = strstr(census, want);
    CHECKF(row && row > at, "row of %d calls missing or out of order: %.700s", count, census);
    if (!row || row <= at)
      break;
    at = row;
  }
  mt_stats_reset();
  unlink(path);
}

static cublasStatus_t statuses[2];

static void call_twice(void *arg) {
  (void)arg;
  for (int i = 0; i < 2; i++)
    statuses[i] = cublasGemmEx(NULL, CUBLAS_OP_T, CUBLAS_OP_N, 1, 1, 1, NULL, NULL, CUDA_R_16BF, 1,
                               NULL, CUDA_R_16BF, 1, NULL, NULL, CUDA_R_16BF, 1, CUBLAS_COMPUTE_32F,
                               CUBLAS_GEMM_DEFAULT);
}

/* This program holds no cuBLAS: the hook answers NOT_INITIALIZED, never crashes, warns once. */
static void no_real_cublas(void) {
  char text[2048];
  mt_t_capture_stderr(call_twice, NULL, text, sizeof text);
  CHECK(statuses[0] == CUBLAS_STATUS_NOT_INITIALIZED);
  CHECK(statuses[1] == CUBLAS_STATUS_NOT_INITIALIZED);
  CHECKF(mt_t_count_of(text, "cannot find the real cublasGemmEx") == 1, "%s", text);
}

int main(void) {
  RUN(router_decision_table);
  RUN(reason_names);
  RUN(path_templates);
  RUN(log_lines);
  RUN(suggested_routes_rule);
  RUN(census_most_calls_first);
  RUN(no_real_cublas);
  return mt_test_done();
}
