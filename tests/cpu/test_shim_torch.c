/* test_shim_torch.c — the torch._grouped_mm hook (shim/torch.h) on the CPU, with the fake
 * libtorch_cuda.so of tests/cpu/fake/fake_torch.c: its kernel entry under the real mangled name,
 * reached through the PLT from the fake's op, as libtorch_cuda reaches the real one.
 *
 * The program is its own child (`test_shim_torch child SCENARIO BUILD`, tests/cpu/scenario.h),
 * under LD_PRELOAD=libminite.so with the weight 64x32 routed. The child dlopens the fake libtorch
 * with RTLD_LOCAL, as Python loads torch, and calls torch._grouped_mm in every mode on 4 experts
 * (offsets 8, 8, 25, 40: one expert gets no token):
 *   forward   x [40, 32] . W.transpose(-2, -1), W [4, 64, 32]        TN, routed
 *   dgrad     dy [40, 64] . W                                        NN, backward dgrad
 *   wgrad     dy^T [64, 40] (a column-major view) . x [40, 32]      NT, k per expert: wgrad
 *   batch     x3 [4, 5, 32] . W.transpose(-2, -1)                    TN, 3-D x 3-D: routed
 *   m ragged  x3 [4, 5, 32] . b [32, 40], offsets                    no role
 * After each call the child checks that the real function received exactly the five pointers the
 * op passed, and that out holds what the fake computes without the shim, bit for bit (except where
 * the engine ran the call: there out holds the fake engine's marks, written on the stream torch
 * reports). The parent checks the statistics: census rows named "torch grouped_mm", routed counts
 * and reasons by spec, the suggested route, the warnings; "torch abi" with a libtorch lacking an
 * accessor (whose real entry is then found through the calling library, under another soname) and
 * with an optional of another layout.
 */
#include <dlfcn.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/gemm_args.h"
#include "kernels/instr.h"
#include "kernels/quant.h"
#include "kernels/wcheck.h"
#include "tests/cpu/fake/fake.h"
#include "tests/cpu/fake/fake_cuda.h"
#include "tests/cpu/fake/fake_torch.h"
#include "tests/cpu/scenario.h"

#define ROUTES "MINITE_ROUTE=64x32"
#define E 4
#define OUT 64
#define IN 32
#define T 40
#define STREAM ((CUstream)(uintptr_t)0x7000) /* what the fake's current-stream accessor says */

/* ======================================================================================== */
/* The child.                                                                               */
/* ======================================================================================== */

static fake_torch_op_fn op;
static fake_torch_last_fn torch_last;
static fake_torch_entry_fn own;
static uint32_t seed = 2024;
static int32_t ends[E] = {8, 8, 25, 40};

static int load(const char *build) {
  const char *old = getenv("FAKE_TORCH_OLD"), *cuda = getenv("FAKE_WITH_CUDA");
  if (cuda && cuda[0] == '1') {
    void *lib_cuda = mt_t_open(build, "tests/cpu/fake/driver/libcuda.so.1");
    if (!lib_cuda)
      return -1;
    cuda_events = (fake_cuda_events_fn)mt_t_sym(lib_cuda, "fake_cuda_events");
  }
  void *lib =
      mt_t_open(build, old && old[0] == '1' ? "tests/cpu/fake/torch_old/libtorch_cuda_old.so"
                                            : "tests/cpu/fake/torch/libtorch_cuda.so");
  if (!lib)
    return -1;
  op = (fake_torch_op_fn)mt_t_sym(lib, "fake_torch_grouped_mm_op");
  torch_last = (fake_torch_last_fn)mt_t_sym(lib, "fake_torch_last");
  own = (fake_torch_entry_fn)mt_t_sym(lib, "fake_own_grouped_mm");
  return op && torch_last && own ? 0 : -1;
}

typedef struct {
  fake_impl impl;
  fake_tensor t;
} tensor;

static void make(tensor *x, void *data, int dim, const int64_t size[3], const int64_t stride[3]) {
  *x = (tensor){.impl = {.data = data, .dim = dim, .dtype = FAKE_TORCH_BF16}};
  memcpy(x->impl.sizes, size, sizeof(int64_t) * 3);
  memcpy(x->impl.strides, stride, sizeof(int64_t) * 3);
  x->t.impl = &x->impl;
}

static void make2(tensor *x, void *data, int64_t s0, int64_t s1, int64_t t0, int64_t t1) {
  make(x, data, 2, (int64_t[3]){s0, s1, 0}, (int64_t[3]){t0, t1, 0});
}

static void make3(tensor *x, void *data, int64_t s0, int64_t s1, int64_t s2, int64_t t0, int64_t t1,
                  int64_t t2) {
  make(x, data, 3, (int64_t[3]){s0, s1, s2}, (int64_t[3]){t0, t1, t2});
}

static int64_t elems_of(const tensor *x) {
  int64_t n = 1;
  for (int i = 0; i < x->impl.dim; i++)
    n *= x->impl.sizes[i];
  return n; /* every output here is contiguous */
}

/* The engine runs this call (one it can take, under nvfp4 with a driver): out holds its marks. */
static int engine_runs(int engine_takes) {
  const char *spec = getenv("MINITE_SPEC"), *cuda = getenv("FAKE_WITH_CUDA");
  return engine_takes && spec && !strncmp(spec, "nvfp4", 5) && cuda && cuda[0] == '1';
}

/* One torch._grouped_mm through the fake's op (offsets when with_offs, their optional's flag
 * `engaged`), checked as the header says. engine_takes: the engine runs it when routed. */
static void call(const char *what, tensor *a, tensor *b, int with_offs, unsigned char engaged,
                 tensor *out, int engine_takes) {
  tensor offs;
  make(&offs, ends, 1, (int64_t[3]){E, 0, 0}, (int64_t[3]){1, 0, 0});
  offs.impl.dtype = FAKE_TORCH_INT32;
  fake_optional o = {.value = offs.t, .engaged = with_offs ? engaged : 0}, bias = {{NULL}, 0};
  int64_t n = elems_of(out);
  tensor ref = *out;
  ref.impl.data = malloc((size_t)n * 2), ref.t.impl = &ref.impl;
  memcpy(ref.impl.data, out->impl.data, (size_t)n * 2);
  fake_optional o_ref = o, bias_ref = bias;
  own(&a->t, &b->t, &o_ref, &bias_ref, &ref.t);
  fake_torch_record before, after;
  torch_last(&before);
  void *passed[5];
  int t0 = cuda_events ? now() : 0;
  op(&a->t, &b->t, &o, &bias, &out->t, passed);
  torch_last(&after);
  if (engine_runs(engine_takes)) {
    CHECKF(after.calls == before.calls, "%s: the real function ran a call the engine ran", what);
    int marked = 1;
    for (int64_t i = 0; i < n; i++)
      marked &= ((uint16_t *)out->impl.data)[i] == FAKE_CUDA_MARK;
    CHECKF(marked, "%s: the output is not the engine's", what);
    for (int i = t0; i < now(); i++)
      CHECKF(event(i)->kind != FAKE_EV_LAUNCH || event(i)->stream == STREAM,
             "%s: %s launched on %p, not torch's current stream", what, event(i)->name,
             (void *)event(i)->stream);
  } else {
    CHECKF(after.calls == before.calls + 1, "%s: the real function was not called", what);
    CHECKF(!memcmp(after.args, passed, sizeof passed), "%s: the real function got other pointers",
           what);
    CHECKF(!memcmp(out->impl.data, ref.impl.data, (size_t)n * 2),
           "%s: out differs from the fake's own result", what);
  }
  free(ref.impl.data);
}

static void *matrix(int64_t elems) { return mt_t_matrix(&seed, (size_t)elems); }

static int find_launch(int from, const char *name) { return mt_t_find_launch(from, name, 0, 0); }

/* Under a frozen weight cache, the routed call since `from` refreshed its store first: one refresh
 * of E slices of the weight, covering the slices with rows under the call's offsets (`offs`, T
 * rows), or every slice (offs NULL), and no other quantization of the store. */
static void check_refresh(int from, const char *what, const void *w, const int32_t *offs) {
  const char *mode = getenv("MINITE_WEIGHT_CACHE");
  if (!mode || strncmp(mode, "frozen", 6) || !engine_runs(1))
    return;
  int c = mt_t_find_launch(from, "mt_refresh_", 1, 0);
  const mt_refresh_args *a = c >= 0 ? (const mt_refresh_args *)event(c)->args : NULL;
  CHECKF(a && a->q.x == w && a->q.store && a->q.rows == E * OUT && a->q.batch_rows == OUT &&
             a->q.cols == IN && a->q.ldx == IN && a->offs == offs && (!offs || a->m == T),
         "%s: the refresh's arguments", what);
  CHECKF(c >= 0 && mt_t_find_launch(from, "mt_quant_tensor_store_", 1, 0) < 0,
         "%s: the store quantized besides its refresh", what);
}

static void scenario_modes(void) {
  tensor x, w_t, w, y, dy, dx, dy_t, dw, x3, y3, b2, y4;
  void *wdata = matrix(E * OUT * IN), *xdata = matrix(T * IN), *dydata = matrix(T * OUT);
  void *x3data = matrix(E * 5 * IN);
  make2(&x, xdata, T, IN, IN, 1);
  make3(&w_t, wdata, E, IN, OUT, OUT * IN, 1, IN); /* W.transpose(-2, -1) */
  make3(&w, wdata, E, OUT, IN, OUT * IN, IN, 1);
  make2(&y, matrix(T * OUT), T, OUT, OUT, 1);
  make2(&dy, dydata, T, OUT, OUT, 1);
  make2(&dx, matrix(T * IN), T, IN, IN, 1);
  make2(&dy_t, dydata, OUT, T, 1, OUT); /* dy.t(): column-major */
  make3(&dw, matrix(E * OUT * IN), E, OUT, IN, OUT * IN, IN, 1);
  make3(&x3, x3data, E, 5, IN, 5 * IN, IN, 1);
  make3(&y3, matrix(E * 5 * OUT), E, 5, OUT, 5 * OUT, OUT, 1);
  make2(&b2, matrix(IN * T), IN, T, T, 1);
  make2(&y4, matrix(5 * T), 5, T, T, 1);
  /* the forward's token counts are on the device: the grouped engine reads them there */
  int t = cuda_events ? now() : 0;
  call("forward", &x, &w_t, 1, 1, &y, 1);
  check_refresh(t, "forward", wdata, ends);
  call("dgrad", &dy, &w, 1, 1, &dx, 0);
  call("wgrad", &dy_t, &x, 1, 1, &dw, 0);
  t = cuda_events ? now() : 0;
  call("batch", &x3, &w_t, 0, 0, &y3, 1);
  check_refresh(t, "batch", wdata, NULL);
  call("m ragged", &x3, &b2, 1, 1, &y4, 0);
  free(wdata), free(xdata), free(dydata), free(x3data);
  free(y.impl.data), free(dx.impl.data), free(dw.impl.data), free(y3.impl.data);
  free(b2.impl.data), free(y4.impl.data);
}

/* With an optional whose flag is neither 0 nor 1 (another ABI), then a well-formed call. */
static void scenario_optional(void) {
  tensor x, w_t, y;
  void *wdata = matrix(E * OUT * IN), *xdata = matrix(T * IN);
  make2(&x, xdata, T, IN, IN, 1);
  make3(&w_t, wdata, E, IN, OUT, OUT * IN, 1, IN);
  make2(&y, matrix(T * OUT), T, OUT, OUT, 1);
  call("flag 2", &x, &w_t, 1, 2, &y, 0);
  call("flag 1", &x, &w_t, 1, 1, &y, 0);
  free(wdata), free(xdata), free(y.impl.data);
}

/* Launches since `from` whose kernel name starts with `prefix`. */
static int launches_of(int from, const char *prefix) {
  int n = 0;
  for (int i = from; i < now(); i++)
    n += event(i)->kind == FAKE_EV_LAUNCH && !strncmp(event(i)->name, prefix, strlen(prefix));
  return n;
}

/* The twin's keys of the rows of a grouped call (x rows of IN, offsets or 5 rows a segment,
 * segment s through expert s of w), as #info lines the parent looks for in the statistics file:
 * the key of a single call of that row through that expert's weight. */
static void print_keys(const uint16_t *x, int rows, const int32_t *offs, const uint16_t *w) {
  for (int r = 0; r < rows; r++) {
    int32_t seg = mt_instr_segment(offs, E, offs ? 0 : 5, r);
    if (seg < 0)
      continue;
    const uint64_t wsum = mt_t_weight_sum(w + (size_t)seg * OUT * IN, IN, OUT, IN);
    uint64_t key = mt_instr_key(mt_instr_row_hash(x + (size_t)r * IN, IN, 0),
                                mt_instr_weight_id(wsum, OUT, IN, 0), 0, 1.0f, 0);
    printf("#info key %016" PRIx64 "\n", key);
  }
}

/* The instruments of grouped calls (MT_INSTR=on: probe, digests and shadow at rate 1; off:
 * none). The forward's offsets end at 36 of its 40 rows: rows 36..39 are in no segment (never
 * written), neither probed, digested nor shadowed. With the instruments on, each call gets behind
 * its grouped GEMM: the digest kernel (the segments found from the offsets on the device), for the
 * offsets form the kernel that builds the probed rows' one-row offsets, the 4 rows alone through
 * the grouped engine, the comparison, the shadow of 8 rows spread over the call (its own product,
 * no cuBLAS call), the finish; nothing read back. */
/* The shadow of a grouped call since event t: its 8 rows (`rows`), its segments from offs (or 5
 * rows a segment), x, y and each row's own expert of w (stored [out][in] behind the [in, out]
 * view: not in_out). */
static void check_shadow_rows(int t, int on, const int32_t *offs, const void *x, const void *y,
                              const void *w, const int32_t *rows) {
  const int si = find_launch(t, "mt_instr_shadow_rows");
  CHECKF(on == (si >= 0), "shadow launched %d, instruments on %d", si >= 0, on);
  if (si < 0)
    return;
  const mt_instr_shadow_rows_args *a = (const mt_instr_shadow_rows_args *)event(si)->args;
  CHECK(a->x == x && a->y == y && a->w == w && a->offs == offs && a->nseg == E &&
        a->seg_rows == (offs ? 0 : 5) && a->n == OUT && a->k == IN && a->ldw == IN && !a->in_out &&
        a->w_stride == OUT * IN && a->alpha == 1.0f && a->nrows == 8);
  for (int i = 0; i < 8; i++)
    CHECKF(a->rows[i] == rows[i], "shadow row %d: %d, want %d", i, a->rows[i], rows[i]);
}

static void scenario_instr(void) {
  static int32_t part[E] = {8, 8, 25, 36};
  int on = getenv("MT_INSTR") && !strcmp(getenv("MT_INSTR"), "on");
  tensor x, w_t, y, x3, y3, offs;
  uint16_t *wdata = matrix(E * OUT * IN), *xdata = matrix(T * IN), *x3data = matrix(E * 5 * IN);
  make2(&x, xdata, T, IN, IN, 1);
  make3(&w_t, wdata, E, IN, OUT, OUT * IN, 1, IN);
  make2(&y, matrix(T * OUT), T, OUT, OUT, 1);
  make3(&x3, x3data, E, 5, IN, 5 * IN, IN, 1);
  make3(&y3, matrix(E * 5 * OUT), E, 5, OUT, 5 * OUT, OUT, 1);
  make(&offs, part, 1, (int64_t[3]){E, 0, 0}, (int64_t[3]){1, 0, 0});
  offs.impl.dtype = FAKE_TORCH_INT32;
  fake_optional o = {.value = offs.t, .engaged = 1}, none = {{NULL}, 0};
  void *passed[5];
  int t = now();
  op(&x.t, &w_t.t, &o, &none, &y.t, passed);
  CHECKF(launches_of(t, "mt_grouped_") == (on ? 5 : 1), "forward: %d grouped launches",
         launches_of(t, "mt_grouped_"));
  CHECK(launches_of(t, "mt_instr_") == (on ? 5 : 0));
  check_shadow_rows(t, on, part, xdata, y.impl.data, wdata,
                    (int32_t[]){2, 7, 12, 17, 22, 27, 32, 37});
  int oi = find_launch(t, "mt_instr_offs"), pi = find_launch(t, "mt_instr_probe");
  CHECK(on == (oi >= 0) && on == (pi >= 0));
  if (on && oi >= 0 && pi >= 0) {
    const mt_instr_offs_args *oa = (const mt_instr_offs_args *)event(oi)->args;
    const mt_instr_probe_args *pa = (const mt_instr_probe_args *)event(pi)->args;
    CHECK(oa->offs == part && oa->nseg == E && oa->nrows == 4 && oa->rows[0] == 0 &&
          oa->rows[1] == 13 && oa->rows[2] == 26 && oa->rows[3] == 39);
    CHECK(pa->offs == part && pa->nseg == E && pa->yoff[3] == 39 * OUT && pa->y == y.impl.data);
    /* the rows alone: m = 1, each with its own one-row offsets, after the offsets' kernel; one
     * row has one segment's tiles at most, and the grid no more CTAs than that */
    int g = find_launch(oi, "mt_grouped_n8");
    const mt_grouped_kargs *ka = g >= 0 ? (const mt_grouped_kargs *)event(g)->args : NULL;
    CHECK(ka && ka->m == 1 && ka->offs == oa->out && g < pi);
    CHECKF(g >= 0 && event(g)->grid[0] == (OUT + 127) / 128, "a one-row launch of %u CTAs",
           g >= 0 ? event(g)->grid[0] : 0);
  }
  t = now();
  op(&x3.t, &w_t.t, &none, &none, &y3.t, passed);
  CHECK(launches_of(t, "mt_grouped_") == (on ? 5 : 1));
  CHECK(launches_of(t, "mt_instr_") == (on ? 4 : 0) && find_launch(t, "mt_instr_offs") < 0);
  check_shadow_rows(t, on, NULL, x3data, y3.impl.data, wdata,
                    (int32_t[]){1, 3, 6, 8, 11, 13, 16, 18});
  pi = find_launch(t, "mt_instr_probe");
  if (on && pi >= 0) { /* segment 1 row 1 of the batch: 5 rows a segment */
    const mt_instr_probe_args *pa = (const mt_instr_probe_args *)event(pi)->args;
    CHECK(!pa->offs && pa->rows[1] == 6 && pa->yoff[1] == 5 * OUT + OUT);
  }
  if (on) {
    print_keys(xdata, T, part, wdata);
    print_keys(x3data, E * 5, NULL, wdata);
  }
  free(wdata), free(xdata), free(x3data), free(y.impl.data), free(y3.impl.data);
}

static const mt_t_scenario scenarios[] = {
    {"modes", scenario_modes},
    {"optional", scenario_optional},
    {"instr", scenario_instr},
};

/* ======================================================================================== */
/* The parent.                                                                              */
/* ======================================================================================== */

static const char *const rows[] = {
    "{\"entry\": \"torch grouped_mm\", \"ops\": \"TN\", \"m\": 64, \"n\": 40, \"k\": 32, "
    "\"types\": "
    "\"bf16*bf16->bf16\", \"batch\": 4, \"role\": \"forward\", \"count\": 1}",
    "{\"entry\": \"torch grouped_mm\", \"ops\": \"NN\", \"m\": 32, \"n\": 40, \"k\": 64, "
    "\"types\": "
    "\"bf16*bf16->bf16\", \"batch\": 4, \"role\": \"dgrad\", \"count\": 1}",
    "{\"entry\": \"torch grouped_mm\", \"ops\": \"NT\", \"m\": 32, \"n\": 64, \"k\": 40, "
    "\"types\": "
    "\"bf16*bf16->bf16\", \"batch\": 4, \"role\": \"wgrad\", \"count\": 1}",
    "{\"entry\": \"torch grouped_mm\", \"ops\": \"TN\", \"m\": 64, \"n\": 5, \"k\": 32, \"types\": "
    "\"bf16*bf16->bf16\", \"batch\": 4, \"role\": \"forward\", \"count\": 1}",
    "{\"entry\": \"torch grouped_mm\", \"ops\": \"NN\", \"m\": 40, \"n\": 5, \"k\": 32, \"types\": "
    "\"bf16*bf16->bf16\", \"batch\": 4, \"count\": 1}",
    NULL};

static long fallback(const mt_t_child *r, const char *reason) {
  return mt_t_fallback(r->summary, reason);
}

static long json(const mt_t_child *r, const char *key) {
  return mt_t_json_int_in(r->summary, NULL, key);
}

/* The modes under `spec` (with the fake driver when cuda): the child's checks pass, the census
 * names every call, backward calls are counted as such. */
static void modes(const char *tag, const char *spec, int cuda, mt_t_child *r) {
  const char *env[] = {spec, cuda ? "FAKE_WITH_CUDA=1" : "FAKE_WITH_CUDA=0", NULL};
  mt_t_run_child("modes", tag, env, r);
  mt_t_check_child("modes", r);
  CHECKF(r->summary, "%s: no summary", tag);
  if (!r->summary)
    return;
  for (int i = 0; rows[i]; i++)
    CHECKF(strstr(r->summary, rows[i]), "%s: no census row %s in %.1500s", tag, rows[i],
           r->summary);
  CHECK(json(r, "gemm_calls") == 5);
  CHECK(fallback(r, "backward dgrad") == 1 && fallback(r, "backward wgrad") == 1);
  /* the m-ragged call's b [32, 40] is x @ W of a 40x32 weight stored [in][out]: a route too */
  CHECKF(strstr(r->summary, "\"suggested_routes\": [\"route 64x32\", \"route 40x32\"]"), "%s",
         strstr(r->summary, "suggested_routes"));
}

static void bf16_counts_forward_calls_routed(void) {
  mt_t_child r;
  modes("bf16", "MINITE_SPEC=bf16", 0, &r);
  CHECK(json(&r, "routed") == 2 && json(&r, "passthrough") == 3);
  CHECKF(r.err && !r.err[0], "stderr: %s", r.err);
  mt_t_child_free(&r);
}

static void nvfp4_without_a_driver_is_no_engine(void) {
  mt_t_child r;
  modes("nvfp4", "MINITE_SPEC=nvfp4-row", 0, &r);
  CHECK(json(&r, "routed") == 0 && fallback(&r, "no engine") == 2);
  CHECKF(mt_t_count_of(r.err, "minite WARN") == 1 && strstr(r.err, "no CUDA driver"), "%s", r.err);
  mt_t_child_free(&r);
}

/* The forward (offsets on the device) and the 3-D batch run on the grouped engine, on torch's
 * current stream. */
static void nvfp4_grouped_engine_runs_forward_and_batch(void) {
  mt_t_child r;
  modes("nvfp4_cuda", "MINITE_SPEC=nvfp4-row", 1, &r);
  CHECK(json(&r, "routed") == 2 && fallback(&r, "engine error") == 0);
  CHECKF(r.err && !strstr(r.err, "minite WARN"), "stderr: %s", r.err);
  mt_t_child_free(&r);
}

/* The same under weight_cache = frozen: the forward's store refresh covers the experts with rows
 * in the call (check_refresh), the batch's every expert; one store for both (one weight). */
static void nvfp4_frozen_refreshes_the_slices_a_call_uses(void) {
  mt_t_child r;
  const char *env[] = {"MINITE_SPEC=nvfp4-row", "MINITE_WEIGHT_CACHE=frozen", "FAKE_WITH_CUDA=1",
                       NULL};
  mt_t_run_child("modes", "frozen", env, &r);
  mt_t_check_child("modes frozen", &r);
  CHECK(json(&r, "routed") == 2 && fallback(&r, "engine error") == 0);
  CHECKF(r.summary && strstr(r.summary, "\"weight_cache\": \"frozen\""), "%.400s", r.summary);
  mt_t_child_free(&r);
}

static void inert_passes_everything_through(void) {
  const char *env[] = {"MINITE_SPEC=", NULL};
  mt_t_child r;
  mt_t_run_child("modes", "inert", env, &r);
  mt_t_check_child("modes", &r);
  CHECKF(r.err && !r.err[0], "stderr: %s", r.err);
  CHECK(!r.stats);
  mt_t_child_free(&r);
}

/* A libtorch without aoti_torch_get_current_cuda_stream, under another soname: the real entry is
 * found through the calling library, one warning names the accessor, every call passes through
 * unread as "torch abi". */
static void a_missing_accessor_is_torch_abi(void) {
  const char *env[] = {"MINITE_SPEC=bf16", "FAKE_TORCH_OLD=1", NULL};
  mt_t_child r;
  mt_t_run_child("modes", "abi", env, &r);
  mt_t_check_child("modes", &r);
  CHECKF(mt_t_count_of(r.err, "minite WARN") == 1 &&
             strstr(r.err, "aoti_torch_get_current_cuda_stream") && strstr(r.err, "torch abi"),
         "%s", r.err);
  CHECK(json(&r, "gemm_calls") == 5 && json(&r, "routed") == 0);
  CHECK(fallback(&r, "torch abi") == 5);
  CHECKF(r.summary && !strstr(r.summary, "torch grouped_mm"), "an unread call in the census");
  mt_t_child_free(&r);
}

static void an_optional_of_another_layout_is_torch_abi(void) {
  const char *env[] = {"MINITE_SPEC=bf16", NULL};
  mt_t_child r;
  mt_t_run_child("optional", "optional", env, &r);
  mt_t_check_child("optional", &r);
  CHECKF(mt_t_count_of(r.err, "minite WARN") == 1 && strstr(r.err, "std::optional"), "%s", r.err);
  CHECK(fallback(&r, "torch abi") == 1 && json(&r, "routed") == 1);
  mt_t_child_free(&r);
}

/* Grouped calls' instruments, on: the probe of both forms (3 rows of the forward in a segment,
 * 4 of the batch; none differing), the digests of the rows in a segment with the keys of their
 * own experts, the shadow of 8 rows of each (the forward's last past its offsets); off: nothing
 * launched (the child checks). */
static void grouped_calls_get_probe_and_digests(void) {
  const char *on[] = {"MINITE_SPEC=nvfp4-row", "FAKE_WITH_CUDA=1", "MT_INSTR=on", "MINITE_PROBE=1",
                      "MINITE_DIGEST=1",       "MINITE_SHADOW=1",  NULL};
  mt_t_child r;
  mt_t_run_child("instr", "instr_on", on, &r);
  mt_t_check_child("instr on", &r);
  const char *route = "\"64x32\": {\"shadow\"";
  CHECKF(mt_t_json_int_in(r.summary, route, "calls") == 2 &&
             mt_t_json_int_in(r.summary, "\"shadow\": {\"rate\"", "entry") < 1,
         "%s", r.summary ? r.summary : "(no summary)");
  CHECKF(mt_t_count_of(r.stats, "\"event\": \"shadow\", \"route\": \"64x32\", \"m\": 40, "
                                "\"rows\": 8, \"rel_l2\": ") == 1 &&
             mt_t_count_of(r.stats, "\"m\": 20, \"rows\": 8, \"rel_l2\": ") == 1,
         "%s", r.stats ? r.stats : "(no statistics)");
  const char *probe = r.summary ? strstr(r.summary, "\"64x32\"") : NULL;
  probe = probe ? strstr(probe, "\"probe\": {") : NULL;
  CHECKF(mt_t_json_int_in(probe, NULL, "calls") == 2 &&
             mt_t_json_int_in(probe, NULL, "rows") == 7 &&
             mt_t_json_int_in(probe, NULL, "differing") == 0,
         "%.300s", probe ? probe : "(no probe)");
  CHECK(mt_t_count_of(r.stats, "\"event\": \"probe\"") == 2 &&
        mt_t_count_of(r.stats, "\"rows\": 3, \"differing\": 0") == 1);
  CHECK(mt_t_json_int_in(r.summary, "\"digests\": {", "written") == 36 + 20 &&
        mt_t_count_of(r.stats, "\"event\": \"digest\"") == 56);
  int keys, found = mt_t_keys_in_file(&r, &keys);
  CHECKF(keys == 56 && found == 56, "%d of %d keys found", found, keys);
  CHECKF(r.err && !strstr(r.err, "minite WARN"), "stderr: %s", r.err);
  mt_t_child_free(&r);
  const char *off[] = {"MINITE_SPEC=nvfp4-row",
                       "FAKE_WITH_CUDA=1",
                       "MT_INSTR=off",
                       "MINITE_PROBE=0",
                       "MINITE_DIGEST=0",
                       "MINITE_SHADOW=0",
                       NULL};
  mt_t_run_child("instr", "instr_off", off, &r);
  mt_t_check_child("instr off", &r);
  CHECK(mt_t_json_int_in(r.summary, NULL, "routed") == 2);
  mt_t_child_free(&r);
}

static void tests(void) {
  RUN(bf16_counts_forward_calls_routed);
  RUN(nvfp4_without_a_driver_is_no_engine);
  RUN(nvfp4_grouped_engine_runs_forward_and_batch);
  RUN(nvfp4_frozen_refreshes_the_slices_a_call_uses);
  RUN(inert_passes_everything_through);
  RUN(a_missing_accessor_is_torch_abi);
  RUN(an_optional_of_another_layout_is_torch_abi);
  RUN(grouped_calls_get_probe_and_digests);
}

int main(int argc, char **argv) {
  return mt_t_scenario_main(argc, argv, "/tmp/mt_shim_torch.XXXXXX", ROUTES, load, scenarios,
                            sizeof scenarios / sizeof scenarios[0], tests);
}
