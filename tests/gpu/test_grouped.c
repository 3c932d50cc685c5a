/* test_grouped.c — GPU tests of the grouped engine (kernels/grouped.c, kernels/grouped.cu): the
 * weight store bit for bit against the CPU reference (ref/nvfp4.c), slice by slice; the grouped
 * GEMM against mt_ref_gemm within the FP32-accumulation bound (tests/gpu/test_kernels.c's header
 * derives it), on segment tables with empty, short and long segments, both row layouts (device
 * offsets, fixed rows with strides), every token tile, C, bias, FP16, NaN rows, more segments than
 * one launch takes; pointer arrays (weights, activations, outputs and C behind device arrays of
 * pointers at any 2-byte alignment, the segment table from mt_grouped_seg_ends) bit for bit
 * against the same data with strides or offsets; and bitwise: a row's output the same whatever its
 * segment's position, the other segments, the token tile, the launch's layout, and the per-expert
 * large path of kernels/gemm_large.cu (an independent kernel reading a BF16 copy of the same
 * weight).
 *
 * Fresh random inputs every run (the seed is printed; MT_TEST_SEED=N repeats one); outputs are
 * poisoned before each launch. Without an sm_90 GPU every test reports skipped. */
#include <stdio.h>

#include "kernels/gemm_args.h"
#include "kernels/wcheck.h"
#include "kernels/whash.h"
#include "tests/gpu/gpu_test.h"

static const mt_numerics num_row = {MT_SCALE_ROW, MT_SCALE_TENSOR, MT_WBLOCK_1X16};
/* Every kind of weight a store holds: per-tensor and per-row S, 1x16 blocks and 16x16 tiles. */
static const mt_numerics store_nums[] = {
    {MT_SCALE_ROW, MT_SCALE_TENSOR, MT_WBLOCK_1X16},
    {MT_SCALE_ROW, MT_SCALE_ROW, MT_WBLOCK_1X16},
    {MT_SCALE_ROW, MT_SCALE_TENSOR, MT_WBLOCK_16X16},
};
static const int bns[] = {8, 16, 32, 64, 128, 256};

/* E experts' weights on the GPU, quantized into one store, with each slice's reference. */
typedef struct {
  int count, n, k;
  mt_numerics num;
  uint16_t *host; /* count x n x ld, `stride` elements from one expert to the next */
  size_t ld, stride;
  void *dev, *mem;
  mt_wstore ws;
  mt_nvfp4 *ref;
} experts;

static void free_experts(experts *e) {
  for (int i = 0; e->ref && i < e->count; i++)
    mt_nvfp4_free(&e->ref[i]);
  free(e->ref);
  free(e->host);
}

/* Build, quantize on the GPU and check every slice against the reference. Returns 1 when all
 * slices match bit for bit. wide: rows of every binade (for the store alone; a GEMM of them
 * overflows), else magnitudes that keep every output finite in FP16. */
static int make_experts_of(experts *e, int count, int n, int k, const mt_numerics *num, int fp16,
                           int wide, int packed) {
  static const enum row_kind all[] = {ROW_RANDOM, ROW_RANDOM, ROW_ZERO_BLKS,
                                      ROW_WIDE,   ROW_TIES,   ROW_SUBNORMAL};
  static const enum row_kind finite[] = {ROW_RANDOM, ROW_RANDOM, ROW_RANDOM, ROW_ZERO_BLKS};
  const enum row_kind *kinds = wide ? all : finite;
  const int nkinds = wide ? NKINDS(all) : NKINDS(finite);
  e->count = count, e->n = n, e->k = k, e->num = *num;
  e->ld = packed ? (size_t)k : rnd_ld(k); /* packed: back to back, as a refresh wants them */
  e->stride = (size_t)n * e->ld + (packed ? 0 : 8 * (size_t)rnd_below(3));
  e->host = malloc((size_t)count * e->stride * 2);
  e->ref = calloc((size_t)count, sizeof *e->ref);
  float *xf = malloc((size_t)n * e->ld * sizeof *xf);
  int tile16 = num->weight_block == MT_WBLOCK_16X16, ok = 1;
  for (int i = 0; i < count; i++) {
    uint16_t *x = make_matrix(n, k, e->ld, fp16, kinds, nkinds, tile16);
    memcpy(e->host + (size_t)i * e->stride, x, (size_t)n * e->ld * 2);
    for (size_t j = 0; j < (size_t)n * e->ld; j++)
      xf[j] = from_half(x[j], fp16);
    ok &= mt_nvfp4_alloc(&e->ref[i], n, k, num->weight_scale, num->weight_block) == 0;
    if (ok)
      mt_ref_quantize(xf, e->ld, &e->ref[i]);
    free(x);
  }
  free(xf);
  size_t bytes = mt_wstore_bytes(count, n, k, num);
  e->dev = dev_alloc((size_t)count * e->stride * 2);
  e->mem = dev_alloc(bytes);
  if (!ok || !bytes || !e->dev || !e->mem ||
      mt_wstore_bind(&e->ws, count, n, k, num, e->mem) != MT_OK || !poison(e->mem, bytes) ||
      cudaMemcpy(e->dev, e->host, (size_t)count * e->stride * 2, cudaMemcpyHostToDevice) !=
          cudaSuccess)
    return 0;
  int st = mt_wstore_quantize(e->dev, fp16 ? MT_DTYPE_FP16 : MT_DTYPE_BF16, e->ld, e->stride,
                              &e->ws, NULL);
  CHECKF(st == MT_OK, "mt_wstore_quantize: %s", mt_status_name((enum mt_status)st));
  if (st != MT_OK || sync_check() != cudaSuccess)
    return 0;
  uint8_t *h = malloc(bytes);
  long bad = 0;
  if (cudaMemcpy(h, e->mem, bytes, cudaMemcpyDeviceToHost) != cudaSuccess)
    bad = -1;
  for (int i = 0; bad >= 0 && i < count; i++)
    bad += check_store(h + (size_t)i * e->ws.slice_bytes, &e->ref[i]);
  free(h);
  CHECKF(bad == 0, "store of %d x %dx%d (%s weight S, %s): %ld differences", count, n, k,
         mt_scale_name(num->weight_scale), mt_wblock_name(num->weight_block), bad);
  return bad == 0;
}

static int make_experts(experts *e, int count, int n, int k, const mt_numerics *num, int fp16) {
  return make_experts_of(e, count, n, k, num, fp16, 0, 0);
}

/* Slices of every kind of weight: per-row and per-tensor S, 1x16 and 16x16 blocks, rows that fill
 * no band, columns that fill no 128-column step. */
static void store_slices(void) {
  NEED_GPU();
  static const int shapes[][3] = {{3, 200, 400}, {2, 128, 2048}, {5, 48, 16}, {1, 256, 784}};
  for (int v = 0; v < NKINDS(store_nums); v++)
    for (int s = 0; s < NKINDS(shapes); s++) {
      experts e = {0};
      make_experts_of(&e, shapes[s][0], shapes[s][1], shapes[s][2], &store_nums[v], (s + v) % 2, 1,
                      0);
      free_experts(&e);
      dev_free_all();
    }
}

/* A store of weights stored [in][out] (mt_wstore.in_out: JAX's [E, in, out] kernels, each slice
 * k rows of n back to back) is the store of the same weights stored [out][in], byte for byte (one
 * poison for every store, so the padding compares too): quantized from a stride, from pointer
 * arrays, and by the frozen refresh, full and sampled (its check hashes the stored rows). */
static void store_in_out(void) {
  NEED_GPU();
  static const int shapes[][3] = {{3, 208, 400}, {2, 128, 2048}, {4, 256, 768}};
  for (int v = 0; v < NKINDS(store_nums); v++)
    for (int sh = 0; sh < NKINDS(shapes); sh++) {
      experts e = {0};
      const int count = shapes[sh][0], n = shapes[sh][1], k = shapes[sh][2], fp16 = (sh + v) % 2;
      const enum mt_dtype type = fp16 ? MT_DTYPE_FP16 : MT_DTYPE_BF16;
      if (!make_experts_of(&e, count, n, k, &store_nums[v], fp16, 1, 1))
        goto out;
      const size_t bytes = mt_wstore_bytes(count, n, k, &store_nums[v]), slice = (size_t)n * k;
      uint16_t *wt = malloc((size_t)count * slice * 2);
      uint8_t *want = malloc(bytes), *got = malloc(bytes);
      void *dt = dev_alloc((size_t)count * slice * 2), *mem = dev_alloc(bytes),
           *state = dev_alloc(mt_refresh_state_bytes(count));
      void **ptrs = dev_alloc((size_t)count * sizeof(void *));
      void *hptrs[8];
      if (!wt || !want || !got || !dt || !mem || !state || !ptrs) {
        free(wt), free(want), free(got);
        goto out;
      }
      for (int x = 0; x < count; x++) {
        hptrs[x] = (uint16_t *)dt + (size_t)x * slice;
        for (int r = 0; r < n; r++)
          for (int c = 0; c < k; c++)
            wt[(size_t)x * slice + (size_t)c * n + r] = e.host[(size_t)x * e.stride + r * e.ld + c];
      }
      const int byte = 1 + rnd_below(255);
      mt_wstore ws;
      CU(cudaMemcpy(dt, wt, (size_t)count * slice * 2, cudaMemcpyHostToDevice));
      CU(cudaMemcpy(ptrs, hptrs, (size_t)count * sizeof(void *), cudaMemcpyHostToDevice));
      CU(cudaMemset(e.mem, byte, bytes));
      MT(mt_wstore_quantize(e.dev, type, e.ld, e.stride, &e.ws, NULL));
      CU(sync_check());
      CU(cudaMemcpy(want, e.mem, bytes, cudaMemcpyDeviceToHost));
      MT(mt_wstore_bind(&ws, count, n, k, &store_nums[v], mem));
      ws.in_out = 1;
      for (int way = 0; way < 4; way++) { /* stride, pointers, refresh full, refresh sampled */
        static const char *const ways[] = {"stride", "pointer arrays", "refresh", "sampled"};
        CU(cudaMemset(mem, byte, bytes));
        CU(cudaMemset(state, 0, mt_refresh_state_bytes(count)));
        const mt_wstore_refresh_args r = {.w = dt,
                                          .type = type,
                                          .ldw = (size_t)n,
                                          .ws = &ws,
                                          .state = state,
                                          .step = way == 3 ? MT_SAMPLE_STEP : 1,
                                          .m = 0};
        int st = way == 0   ? mt_wstore_quantize(dt, type, (size_t)n, slice, &ws, NULL)
                 : way == 1 ? mt_wstore_quantize_ptrs((const void *const *)ptrs, type, (size_t)n,
                                                      &ws, NULL)
                            : mt_wstore_refresh(&r, NULL);
        CHECKF(st == MT_OK, "%s: %s", ways[way], mt_status_name((enum mt_status)st));
        CU(sync_check());
        CU(cudaMemcpy(got, mem, bytes, cudaMemcpyDeviceToHost));
        long bad = 0;
        for (size_t i = 0; i < bytes; i++)
          bad += got[i] != want[i];
        CHECKF(bad == 0,
               "%s: store of %d x %dx%d (%s weight S, %s) stored [in][out]: %ld bytes "
               "differ from [out][in]",
               ways[way], count, n, k, mt_scale_name(store_nums[v].weight_scale),
               mt_wblock_name(store_nums[v].weight_block), bad);
      }
      CHECK(mt_wstore_quantize(dt, type, (size_t)n - 8, slice, &ws, NULL) == MT_ERR_UNSUPPORTED);
      free(wt), free(want), free(got);
    out:
      free_experts(&e);
      dev_free_all();
    }
}

/* Whether slice sl of two images of e's store differ; a per-tensor S's amax word after it is left
 * out (the quantizer's scratch: nothing but the quantizer reads it). */
static int slice_changed(const experts *e, const uint8_t *before, const uint8_t *after, int sl) {
  const size_t at = (size_t)sl * e->ws.slice_bytes, end = at + e->ws.slice_bytes;
  if (e->num.weight_scale == MT_SCALE_ROW)
    return memcmp(before + at, after + at, end - at) != 0;
  const size_t amax =
      (size_t)((const uint8_t *)(mt_wstore_outer(&e->ws, sl) + 1) - (const uint8_t *)e->mem);
  return memcmp(before + at, after + at, amax - at) != 0 ||
         memcmp(before + amax + 4, after + amax + 4, end - amax - 4) != 0;
}

/* Whether line `line` of a slice of `lines` is in the check's sample (kernels/whash.h). */
static int in_sample(uint64_t line, uint64_t lines, unsigned step) {
  const uint64_t items = mt_whash_items(lines, step);
  for (uint64_t i = line / (MT_WHASH_RUN * step) * MT_WHASH_RUN; i < items; i++) {
    const uint64_t l = mt_whash_line(i, step);
    if (l == line)
      return 1;
    if (l > line)
      return 0; /* the lines increase with the items */
  }
  return 0;
}

/* The refresh of e's store from e's weights (row stride ld; state, step, offs and m as
 * mt_wstore_refresh_args says). */
static mt_wstore_refresh_args refresh_of(const experts *e, size_t ld, void *state, unsigned step,
                                         const int32_t *offs, int m) {
  return (mt_wstore_refresh_args){.w = e->dev,
                                  .type = MT_DTYPE_BF16,
                                  .ldw = ld,
                                  .ws = &e->ws,
                                  .state = state,
                                  .step = step,
                                  .offs = offs,
                                  .m = m};
}

/* ... run on its own. */
static int refresh_store(const experts *e, size_t ld, void *state, unsigned step,
                         const int32_t *offs, int m) {
  const mt_wstore_refresh_args r = refresh_of(e, ld, state, step, offs, m);
  return mt_wstore_refresh(&r, NULL);
}

/* e's weights changed in place, every slice: slice s takes slice s + 1's (from the host copy);
 * rot, where given, gets the rotated slices' references. */
static cudaError_t rotate_slices(const experts *e, mt_nvfp4 *rot) {
  for (int sl = 0; sl < e->count; sl++) {
    const int from = (sl + 1) % e->count;
    cudaError_t err =
        cudaMemcpy((uint16_t *)e->dev + (size_t)sl * e->stride, e->host + (size_t)from * e->stride,
                   e->stride * 2, cudaMemcpyHostToDevice);
    if (err != cudaSuccess)
      return err;
    if (rot)
      rot[sl] = e->ref[from];
  }
  return cudaSuccess;
}

/* The frozen refresh of a store (mt_wstore_refresh) against in-place changes of its weights, slice
 * by slice: the whole tensor, one row, one element in a sampled line, one outside the sample, and
 * a change in a slice the call does not use (segment offsets giving it no rows) that the next
 * call using it sees. step 1 (frozen) sees every change of a slice the call uses; step
 * MT_SAMPLE_STEP (frozen-sampled) only those touching a sampled line (the miss of the others is
 * documented: README, "Weight cache"). Seen: the slice is the new weight's quantization (bit for
 * bit against the reference); missed or not covered: unchanged. */
static void store_refresh_case(int N, int K, const mt_numerics *num);
static void store_refresh_modes(void) {
  NEED_GPU();
  for (int v = 0; v < NKINDS(store_nums); v++) {
    store_refresh_case(256, 512, &store_nums[v]);
    /* a CTA a row in the store quantizer (224 threads); 16x16 tiles: 14 blocks of columns */
    store_refresh_case(128, 7168, &store_nums[v]);
  }
  /* a sample of 16 runs of 32 lines a slice (64 groups of MT_SAMPLE_STEP runs of 8 lines, a 1 KB
   * run each): frozen-sampled's clusters of two CTAs (quant.c, sampled_cluster; the shapes above
   * take one) */
  store_refresh_case(16 * MT_SAMPLE_STEP, 2048, &store_nums[0]);
}

static void store_refresh_case(int N, int K, const mt_numerics *num) {
  enum { E = 3 };
  const uint64_t lines = (uint64_t)N * K * 2 / 128; /* a slice's 128-byte lines */
  /* per change: the slice (-1: all), the element of it and how many, the call's offsets (NULL:
   * every slice) and rows */
  static const int32_t skip2[E] = {5, 9, 9}, only2[E] = {0, 0, 4};
  const struct {
    int slice;
    long at, count; /* at < 0: an element of a sampled line (-1) or of an unsampled one (-2) */
    const int32_t *offs;
    int m;
  } changes[] = {{-1, 0, (long)N * K, NULL, 0}, {1, 17L * K, K, NULL, 0}, {1, -1, 1, NULL, 0},
                 {1, -2, 1, NULL, 0},           {2, -1, 1, skip2, 9},     {2, 0, 0, only2, 4}};
  for (int sampled = 0; sampled < 2; sampled++) {
    experts e = {0};
    const unsigned step = sampled ? MT_SAMPLE_STEP : 1;
    const size_t sbytes = mt_refresh_state_bytes(E), bytes = mt_wstore_bytes(E, N, K, num);
    const size_t wbytes = (size_t)E * N * K * 2;
    void *state = dev_alloc(sbytes);
    int32_t *offs = dev_alloc(E * 4);
    uint8_t *before = malloc(bytes), *after = malloc(bytes);
    uint16_t *w = malloc(wbytes);
    int pending[E] = {0}; /* a change the next check of the slice sees */
    if (!state || !offs || !make_experts_of(&e, E, N, K, num, 0, 0, 1)) {
      CHECK(0);
      goto next;
    }
    CU(cudaMemset(state, 0, sbytes));
    MT(refresh_store(&e, K, state, step, NULL, 0)); /* quantizes */
    CU(sync_check());
    CU(cudaMemcpy(w, e.dev, wbytes, cudaMemcpyDeviceToHost));
    for (int c = 0; c < (int)NKINDS(changes); c++) {
      const int first = changes[c].slice < 0 ? 0 : changes[c].slice;
      const int last = changes[c].slice < 0 ? E - 1 : changes[c].slice;
      long at = changes[c].at;
      if (at < 0) { /* the first line from 37 * 8 + 1 in (+ 9: out of) the sample, on from the
                     * slice's first where none is further (a small slice's sample may be its first
                     * run alone); frozen: that line */
        uint64_t line = 37 * 8 + (at == -1 ? 1 : 9), tried = 0;
        while (sampled && tried++ < lines && in_sample(line % lines, lines, step) != (at == -1))
          line++;
        if (tried > lines) {
          CHECKF(0, "no line %s the sample", at == -1 ? "in" : "out of");
          continue;
        }
        at = (long)(line % lines) * 64 + 5;
      }
      /* another finite value; one element becomes 65536, its slice's new amax, so that its
       * requantization changes every code (a small change of one element may quantize to the same
       * bytes, and the store would not show that the refresh saw it) */
      for (int sl = first; sl <= last && changes[c].count; sl++) {
        uint16_t *ws = w + (size_t)sl * N * K;
        for (long i = at; i < at + changes[c].count; i++)
          ws[i] = changes[c].count == 1 ? 0x4780 : ws[i] ^ 0x0140;
        const uint64_t l0 = (uint64_t)at * 2 / 128,
                       l1 = (uint64_t)(at + changes[c].count - 1) * 2 / 128;
        for (uint64_t l = l0; l <= l1; l++)
          pending[sl] |= in_sample(l, lines, step);
      }
      if (changes[c].offs)
        CU(cudaMemcpy(offs, changes[c].offs, E * 4, cudaMemcpyHostToDevice));
      CU(cudaMemcpy(e.dev, w, wbytes, cudaMemcpyHostToDevice));
      CU(cudaMemcpy(before, e.mem, bytes, cudaMemcpyDeviceToHost));
      MT(refresh_store(&e, K, state, step, changes[c].offs ? offs : NULL, changes[c].m));
      CU(sync_check());
      CU(cudaMemcpy(after, e.mem, bytes, cudaMemcpyDeviceToHost));
      for (int sl = 0; sl < E; sl++) {
        const int covered =
            !changes[c].offs || changes[c].offs[sl] > (sl ? changes[c].offs[sl - 1] : 0);
        const int want = covered && pending[sl], seen = slice_changed(&e, before, after, sl);
        CHECKF(seen == want, "%dx%d %s %s S %s: change %d, slice %d (%s): %s", N, K,
               sampled ? "frozen-sampled" : "frozen", mt_scale_name(num->weight_scale),
               mt_wblock_name(num->weight_block), c, sl, covered ? "used" : "not used",
               seen ? "requantized" : "kept");
        if (!seen)
          continue;
        pending[sl] = 0;
        float *xf = malloc((size_t)N * K * sizeof *xf);
        mt_nvfp4 ref;
        mt_nvfp4_alloc(&ref, N, K, num->weight_scale, num->weight_block);
        for (size_t i = 0; i < (size_t)N * K; i++)
          xf[i] = mt_bf16_to_float(w[(size_t)sl * N * K + i]);
        mt_ref_quantize(xf, K, &ref);
        long bad = check_store(after + (size_t)sl * e.ws.slice_bytes, &ref);
        CHECKF(bad == 0,
               "%dx%d %s S %s change %d: refreshed slice %d differs from the reference (%ld)", N, K,
               mt_scale_name(num->weight_scale), mt_wblock_name(num->weight_block), c, sl, bad);
        mt_nvfp4_free(&ref);
        free(xf);
      }
      printf("    %dx%d %s %s S %s: change %d: slices %d%d%d requantized\n", N, K,
             sampled ? "frozen-sampled" : "frozen", mt_scale_name(num->weight_scale),
             mt_wblock_name(num->weight_block), c, slice_changed(&e, before, after, 0),
             slice_changed(&e, before, after, 1), slice_changed(&e, before, after, 2));
    }
  out:
  next:
    free(before), free(after), free(w);
    free_experts(&e);
    dev_free_all();
  }
}

/* A refresh of more slices than it has clusters (kernels/quant.cu, refresh_store: at most two CTAs
 * an SM, eight a cluster), so that each cluster takes several slices in turn, changed and unchanged
 * mixed: the first refresh quantizes every slice; then three slices change and only they are
 * requantized (each against the reference), whichever cluster takes them and in whatever turn;
 * then nothing changes and nothing is written. */
static void store_refresh_rounds(void) {
  NEED_GPU();
  enum { E = 100, N = 32, K = 256 };
  static const int changed[] = {5, 40, 99};
  experts e = {0};
  const size_t sbytes = mt_refresh_state_bytes(E), bytes = mt_wstore_bytes(E, N, K, &num_row);
  const size_t wbytes = (size_t)E * N * K * 2;
  void *state = dev_alloc(sbytes);
  uint8_t *before = malloc(bytes), *after = malloc(bytes);
  if (!state || !make_experts_of(&e, E, N, K, &num_row, 0, 0, 1)) {
    CHECK(0);
    goto out;
  }
  CU(cudaMemset(state, 0, sbytes));
  CU(cudaMemset(e.mem, 0x5a, bytes));
  MT(refresh_store(&e, K, state, 1, NULL, 0));
  CU(sync_check());
  CU(cudaMemcpy(after, e.mem, bytes, cudaMemcpyDeviceToHost));
  long bad = 0;
  for (int sl = 0; sl < E; sl++)
    bad += check_store(after + (size_t)sl * e.ws.slice_bytes, &e.ref[sl]);
  CHECKF(bad == 0, "first refresh of %d slices: %ld differences from the reference", E, bad);
  for (int round = 0; round < 2; round++) {
    if (round == 0)
      for (int c = 0; c < NKINDS(changed); c++) /* another weight: the next slice's */
        CU(cudaMemcpy((uint16_t *)e.dev + (size_t)changed[c] * N * K,
                      (uint16_t *)e.dev + (size_t)(changed[c] + 1) % E * N * K, wbytes / E,
                      cudaMemcpyDeviceToDevice));
    memcpy(before, after, bytes);
    MT(refresh_store(&e, K, state, 1, NULL, 0));
    CU(sync_check());
    CU(cudaMemcpy(after, e.mem, bytes, cudaMemcpyDeviceToHost));
    for (int sl = 0; sl < E; sl++) {
      int want = 0;
      for (int c = 0; round == 0 && c < NKINDS(changed); c++)
        want |= changed[c] == sl;
      const int seen = slice_changed(&e, before, after, sl);
      CHECKF(seen == want, "round %d, slice %d: %s", round, sl, seen ? "requantized" : "kept");
      if (seen && want) /* it holds the next slice's weight now */
        CHECKF(check_store(after + (size_t)sl * e.ws.slice_bytes, &e.ref[(sl + 1) % E]) == 0,
               "round %d: requantized slice %d differs from the reference", round, sl);
    }
  }
out:
  free(before), free(after);
  free_experts(&e);
  dev_free_all();
}

/* ---- the grouped GEMM ------------------------------------------------------------------------ */

/* One grouped problem: segment rows, activations (all rows, contiguous) and their reference
 * quantization over all rows (so that a per-tensor S is the call's). */
typedef struct {
  int nseg, m;
  int *start, *rows;
  uint16_t *x; /* m x ld */
  size_t ld;
  int fp16;
  void *dx;
  mt_nvfp4 ref;
} problem;

static void free_problem(problem *p) {
  free(p->start);
  free(p->rows);
  free(p->x);
  mt_nvfp4_free(&p->ref);
}

static int make_problem(problem *p, int nseg, const int *rows, int k, enum mt_scale act, int fp16,
                        const int *nan_rows, int nnan) {
  static const enum row_kind kinds[] = {ROW_RANDOM, ROW_RANDOM, ROW_RANDOM, ROW_ZERO_BLKS,
                                        ROW_ZEROS};
  p->nseg = nseg, p->fp16 = fp16, p->m = 0;
  p->start = malloc((size_t)nseg * sizeof(int));
  p->rows = malloc((size_t)nseg * sizeof(int));
  for (int s = 0; s < nseg; s++) {
    p->start[s] = p->m;
    p->rows[s] = rows[s];
    p->m += rows[s];
  }
  int m = p->m > 0 ? p->m : 1;
  p->ld = rnd_ld(k);
  p->x = make_matrix(m, k, p->ld, fp16, kinds, NKINDS(kinds), 0);
  for (int i = 0; i < nnan; i++)
    p->x[(size_t)nan_rows[i] * p->ld + (size_t)rnd_below(k)] = fp16 ? 0x7e00 : 0x7fc0;
  float *xf = malloc((size_t)m * p->ld * sizeof *xf);
  for (size_t i = 0; i < (size_t)m * p->ld; i++)
    xf[i] = from_half(p->x[i], fp16);
  int ok = mt_nvfp4_alloc(&p->ref, m, k, act, MT_WBLOCK_1X16) == 0;
  if (ok)
    mt_ref_quantize(xf, p->ld, &p->ref);
  free(xf);
  p->dx = dev_alloc((size_t)m * p->ld * 2);
  return ok && p->dx &&
         cudaMemcpy(p->dx, p->x, (size_t)m * p->ld * 2, cudaMemcpyHostToDevice) == cudaSuccess;
}

/* Rows r0 .. r0 + rows - 1 of a quantized matrix, as a matrix of its own (the reference's arrays
 * are row-major: a view is pointers into them). */
static mt_nvfp4 rows_of(const mt_nvfp4 *q, int r0, int rows) {
  mt_nvfp4 v = *q;
  v.rows = rows;
  v.codes = q->codes + (size_t)r0 * q->cols / 2;
  v.scales = q->scales + (size_t)r0 * q->cols / 16;
  if (q->outer_kind == MT_SCALE_ROW)
    v.outer = q->outer + r0;
  return v;
}

/* A store refresh for the grouped call to run (NULL: none). */
typedef struct {
  void *state;
  unsigned step;
} refresh_first;

/* The grouped call of p on e (offsets doffs on the device) with token tile bn into dy (ldy), its
 * workspace ws of ws_bytes. */
static mt_grouped_args offs_call(const problem *p, const experts *e, int bn, size_t ldy,
                                 enum mt_dtype ytype, const int32_t *doffs, void *dy, void *ws,
                                 size_t ws_bytes) {
  return (mt_grouped_args){.nseg = p->nseg,
                           .n = e->n,
                           .k = e->k,
                           .w = &e->ws,
                           .offs = doffs,
                           .m = p->m > 0 ? p->m : 1,
                           .x = p->dx,
                           .ldx = p->ld,
                           .xtype = p->fp16 ? MT_DTYPE_FP16 : MT_DTYPE_BF16,
                           .y = dy,
                           .ldy = ldy,
                           .ytype = ytype,
                           .alpha = 1.0f,
                           .workspace = ws,
                           .workspace_bytes = ws_bytes,
                           .bn = bn};
}

/* p's cumulative row ends on the device (NULL on a failure). */
static int32_t *dev_offs(const problem *p) {
  int32_t *offs_h = malloc((size_t)p->nseg * 4), *doffs = dev_alloc((size_t)p->nseg * 4);
  for (int s = 0; s < p->nseg; s++)
    offs_h[s] = p->start[s] + p->rows[s];
  if (doffs &&
      cudaMemcpy(doffs, offs_h, (size_t)p->nseg * 4, cudaMemcpyHostToDevice) != cudaSuccess)
    doffs = NULL;
  free(offs_h);
  return doffs;
}

/* Run the grouped GEMM of p on e (offsets on the device) with token tile bn into a fresh y of
 * m x ldy (poisoned; its first state in y0), the call running e's refresh `rf` first
 * (mt_grouped_args.refresh); returns 0 on a failure (reported). */
static int run_offs_after(const problem *p, const experts *e, int bn, size_t ldy,
                          enum mt_dtype ytype, uint16_t *y0, uint16_t *y, const refresh_first *rf) {
  int ok = 0, m = p->m > 0 ? p->m : 1;
  size_t ws_bytes = mt_grouped_workspace_bytes(m, e->k, &e->num);
  int32_t *doffs = dev_offs(p);
  void *dy = dev_alloc((size_t)m * ldy * 2), *ws = dev_alloc(ws_bytes);
  if (!doffs || !dy || !ws)
    goto out;
  CHECK(poison(dy, (size_t)m * ldy * 2) && poison(ws, ws_bytes));
  CU(cudaMemcpy(y0, dy, (size_t)m * ldy * 2, cudaMemcpyDeviceToHost));
  mt_grouped_args a = offs_call(p, e, bn, ldy, ytype, doffs, dy, ws, ws_bytes);
  const mt_wstore_refresh_args r =
      refresh_of(e, e->ld, rf ? rf->state : NULL, rf ? rf->step : 0, doffs, m);
  a.refresh = rf ? &r : NULL;
  MT(mt_gemm_grouped(&a, NULL));
  CU(sync_check());
  CU(cudaMemcpy(y, dy, (size_t)m * ldy * 2, cudaMemcpyDeviceToHost));
  ok = 1;
out:
  return ok;
}

static int run_offs(const problem *p, const experts *e, int bn, size_t ldy, enum mt_dtype ytype,
                    uint16_t *y0, uint16_t *y) {
  return run_offs_after(p, e, bn, ldy, ytype, y0, y, NULL);
}

/* Every segment's rows against the reference; rows past the last offset untouched. */
static void check_segments(const problem *p, const experts *e, const uint16_t *y,
                           const uint16_t *y0, size_t ldy, enum mt_dtype ytype, const char *nan_row,
                           const char *what) {
  out_check oc = {0};
  for (int s = 0; s < p->nseg; s++) {
    if (!p->rows[s])
      continue;
    mt_nvfp4 a = rows_of(&p->ref, p->start[s], p->rows[s]);
    size_t at = (size_t)p->start[s] * ldy;
    check_outputs(&a, &e->ref[s], y + at, y0 + at, ldy, ytype, 1.0f, 0.0f, NULL, NULL,
                  nan_row ? nan_row + p->start[s] : NULL, &oc);
  }
  CHECKF(!oc.bad && !oc.pad && !oc.nan,
         "%s: %ld outside the bound, %ld padding written, %ld not NaN", what, oc.bad, oc.pad,
         oc.nan);
  printf("    %s: worst error %.3f of the bound\n", what, oc.worst);
}

/* p on e with every token tile: token tile 8's outputs (every tile 8 wide) against the reference,
 * every other token tile's bitwise equal to them. */
static void every_bn(const problem *p, const experts *e, size_t ldy, enum mt_dtype yt,
                     const char *name) {
  size_t ybytes = (size_t)p->m * ldy * 2;
  uint16_t *y0 = malloc(ybytes), *y = malloc(ybytes), *first = malloc(ybytes);
  for (int b = 0; b < NKINDS(bns); b++) {
    if (!run_offs(p, e, bns[b], ldy, yt, y0, y))
      break;
    char what[128];
    snprintf(what, sizeof what, "%s, bn %d", name, bns[b]);
    if (b == 0) {
      check_segments(p, e, y, y0, ldy, yt, NULL, what);
      memcpy(first, y, ybytes);
      continue;
    }
    long differ = 0;
    for (int r = 0; r < p->m; r++)
      differ += memcmp(y + (size_t)r * ldy, first + (size_t)r * ldy, (size_t)e->n * 2) != 0;
    CHECKF(differ == 0, "%s: %ld rows differ from bn 8's", what, differ);
  }
  free(y0);
  free(y);
  free(first);
}

/* nseg segments of rows[] over experts of n x k and numerics num (their weights FP16 when wfp16,
 * the rows when xfp16): every_bn into y of row stride ldy and type yt. */
static void every_bn_case(int nseg, const int *rows, int n, int k, const mt_numerics *num,
                          int wfp16, int xfp16, size_t ldy, enum mt_dtype yt) {
  experts e = {0};
  problem p = {0};
  if (make_experts(&e, nseg, n, k, num, wfp16) &&
      make_problem(&p, nseg, rows, k, num->act_scale, xfp16, NULL, 0)) {
    char what[96];
    snprintf(what, sizeof what, "%d segments of %dx%d, %d rows", nseg, n, k, p.m);
    every_bn(&p, &e, ldy, yt, what);
  }
  free_problem(&p);
  free_experts(&e);
  dev_free_all();
}

/* Segments of 0 to 40 rows (some empty) over odd shapes (n short of a band, k a partial last
 * block: 400 = 6.25 blocks; 448 = 7 blocks, rank-3 boxes with a last stage half past k), every
 * token tile: every row within the bound, and bitwise the same for every tile. */
static void grouped_accuracy(void) {
  NEED_GPU();
  static const int shapes[][3] = {{5, 320, 448}, {4, 256, 400}, {3, 128, 2048}};
  static const mt_numerics nums[] = {
      {MT_SCALE_ROW, MT_SCALE_TENSOR, MT_WBLOCK_1X16},
      {MT_SCALE_ROW, MT_SCALE_ROW, MT_WBLOCK_1X16},
      {MT_SCALE_TENSOR, MT_SCALE_TENSOR, MT_WBLOCK_16X16},
  };
  for (int s = 0; s < NKINDS(shapes); s++) {
    const mt_numerics *num = &nums[s % NKINDS(nums)];
    int nseg = shapes[s][0], n = shapes[s][1], k = shapes[s][2], rows[8];
    for (int i = 0; i < nseg; i++)
      rows[i] = i == 1 ? 0 : 1 + rnd_below(40);
    every_bn_case(nseg, rows, n, k, num, s == 2, s == 1, (size_t)n + (s % 2 ? 8 : 0),
                  s % 2 ? MT_DTYPE_FP16 : MT_DTYPE_BF16);
  }
}

/* The wgmma widths of a segment's last token tile (grouped.cu, tile_rows: BN, BN / 2, ... as its
 * rows need) and, at BN 256, the last tiles of fewer than MT_GROUPED_TAIL rows left to the second
 * launch (grouped.c: 257, 319 and 513 rows split, 320 not): segments whose last tile has the rows
 * at and around each bound, for every token tile, each bitwise the same as token tile 8's (whose
 * tiles are all 8 wide), and those against the reference. */
static void grouped_widths(void) {
  NEED_GPU();
  enum { N = 256, K = 256 };
  int rows[] = {1,   8,   9,   16,  17,  31,  32,  33,  63,  64, 65,
                127, 128, 129, 200, 255, 256, 257, 319, 320, 513};
  enum { NSEG = sizeof rows / sizeof rows[0] };
  every_bn_case(NSEG, rows, N, K, &num_row, 0, 0, N, MT_DTYPE_BF16);
}

/* A row's bits depend on nothing but its inputs (per-row S_a): the same rows computed in one
 * grouped call, then each segment alone (fixed rows, one segment), then with the segments in
 * another order and other segments' sizes around them, then by the per-expert large path
 * (mt_gemm on the same weights quantized into the BF16 copy it reads). The weights hold every
 * finite row kind: wide exponents, ties and subnormals give block scales from E4M3's subnormals
 * up, the scale bytes and code positions the store's decode must turn into the same BF16 operands
 * (times 2^-7) as the large path's copy. */
static void grouped_bitwise(void) {
  NEED_GPU();
  enum { NSEG = 6, N = 384, K = 1024 };
  int rows[NSEG];
  for (int i = 0; i < NSEG; i++)
    rows[i] = 1 + rnd_below(70);
  experts e = {0};
  problem p = {0};
  uint16_t *y0 = NULL, *all = NULL, *one = NULL, *large = NULL;
  if (!make_experts_of(&e, NSEG, N, K, &num_row, 0, 1, 0) ||
      !make_problem(&p, NSEG, rows, K, MT_SCALE_ROW, 0, NULL, 0)) {
    CHECK(0);
    goto out;
  }
  size_t ybytes = (size_t)p.m * N * 2;
  y0 = malloc(ybytes), all = malloc(ybytes), one = malloc(ybytes), large = malloc(ybytes);
  if (!run_offs(&p, &e, 0, N, MT_DTYPE_BF16, y0, all))
    goto out;
  long differ_one = 0, differ_large = 0;
  size_t ws_bytes = mt_grouped_workspace_bytes(p.m, K, &num_row);
  void *ws = dev_alloc(ws_bytes), *dy = dev_alloc(ybytes);
  /* each segment alone: fixed rows, one segment, its own slice as the store */
  for (int s = 0; s < NSEG && ws && dy; s++) {
    mt_wstore one_ws = e.ws;
    one_ws.base += (size_t)s * e.ws.slice_bytes;
    one_ws.count = 1;
    mt_grouped_args a = {.nseg = 1,
                         .n = N,
                         .k = K,
                         .w = &one_ws,
                         .m = p.rows[s],
                         .seg_rows = p.rows[s],
                         .x = (uint16_t *)p.dx + (size_t)p.start[s] * p.ld,
                         .ldx = p.ld,
                         .xtype = MT_DTYPE_BF16,
                         .y = (uint16_t *)dy + (size_t)p.start[s] * N,
                         .ldy = N,
                         .ytype = MT_DTYPE_BF16,
                         .alpha = 1.0f,
                         .workspace = ws,
                         .workspace_bytes = ws_bytes};
    MT(mt_gemm_grouped(&a, NULL));
  }
  CU(sync_check());
  CU(cudaMemcpy(one, dy, ybytes, cudaMemcpyDeviceToHost));
  for (int r = 0; r < p.m; r++)
    differ_one += memcmp(one + (size_t)r * N, all + (size_t)r * N, N * 2) != 0;
  CHECKF(differ_one == 0, "%ld rows differ between one grouped call and a call per segment",
         differ_one);
  /* the per-expert large path on the same weights */
  for (int s = 0; s < NSEG; s++) {
    size_t qbytes = mt_qweight_bytes(N, K, &num_row),
           gws = mt_gemm_workspace_bytes(p.rows[s], K, &num_row);
    void *qmem = dev_alloc(qbytes), *gw = dev_alloc(gws);
    mt_qweight q;
    if (!qmem || !gw)
      break;
    MT(mt_qweight_bind(&q, N, K, &num_row, qmem));
    MT(mt_quantize_weight((uint16_t *)e.dev + (size_t)s * e.stride, MT_DTYPE_BF16, e.ld, &q, NULL));
    mt_gemm_args g = {.m = p.rows[s],
                      .n = N,
                      .k = K,
                      .x = (uint16_t *)p.dx + (size_t)p.start[s] * p.ld,
                      .ldx = p.ld,
                      .xtype = MT_DTYPE_BF16,
                      .w = &q,
                      .y = (uint16_t *)dy + (size_t)p.start[s] * N,
                      .ldy = N,
                      .ytype = MT_DTYPE_BF16,
                      .alpha = 1.0f,
                      .workspace = gw,
                      .workspace_bytes = gws,
                      .path = MT_PATH_LARGE};
    MT(mt_gemm(&g, NULL));
    CU(sync_check());
  }
  CU(cudaMemcpy(large, dy, ybytes, cudaMemcpyDeviceToHost));
  for (int r = 0; r < p.m; r++)
    differ_large += memcmp(large + (size_t)r * N, all + (size_t)r * N, N * 2) != 0;
  CHECKF(differ_large == 0, "%ld of %d rows differ between the grouped engine and the large path",
         differ_large, p.m);
  /* the segments reversed and with other sizes around them: segment s's rows at a new place */
  {
    problem q = {0};
    int rows2[2 * NSEG];
    for (int s = 0; s < NSEG; s++) {
      rows2[2 * s] = rnd_below(30);
      rows2[2 * s + 1] = p.rows[NSEG - 1 - s];
    }
    if (make_problem(&q, 2 * NSEG, rows2, K, MT_SCALE_ROW, 0, NULL, 0)) {
      for (int s = 0; s < NSEG; s++) /* the original segment's rows into their new place */
        CU(cudaMemcpy2D((uint16_t *)q.dx + (size_t)q.start[2 * s + 1] * q.ld, q.ld * 2,
                        (uint16_t *)p.dx + (size_t)p.start[NSEG - 1 - s] * p.ld, p.ld * 2, K * 2,
                        (size_t)q.rows[2 * s + 1], cudaMemcpyDeviceToDevice));
      experts e2 = e; /* slice 2s + 1 must be expert NSEG - 1 - s: a store laid out so */
      size_t sb = e.ws.slice_bytes;
      void *mem2 = dev_alloc(sb * 2 * NSEG);
      if (mem2) {
        for (int s = 0; s < NSEG; s++) {
          CU(cudaMemcpy((char *)mem2 + (2 * s) * sb, e.mem, sb, cudaMemcpyDeviceToDevice));
          CU(cudaMemcpy((char *)mem2 + (2 * s + 1) * sb, (char *)e.mem + (NSEG - 1 - s) * sb, sb,
                        cudaMemcpyDeviceToDevice));
        }
        e2.ws.base = mem2;
        e2.ws.count = 2 * NSEG;
        size_t yb2 = (size_t)q.m * N * 2;
        uint16_t *z0 = malloc(yb2), *z = malloc(yb2);
        long differ_moved = 0;
        if (run_offs(&q, &e2, 0, N, MT_DTYPE_BF16, z0, z))
          for (int s = 0; s < NSEG; s++)
            for (int r = 0; r < q.rows[2 * s + 1]; r++)
              differ_moved += memcmp(z + (size_t)(q.start[2 * s + 1] + r) * N,
                                     all + (size_t)(p.start[NSEG - 1 - s] + r) * N, N * 2) != 0;
        CHECKF(differ_moved == 0, "%ld rows differ when their segments move", differ_moved);
        free(z0);
        free(z);
      }
    }
    free_problem(&q);
  }
out:
  free(y0);
  free(all);
  free(one);
  free(large);
  free_problem(&p);
  free_experts(&e);
  dev_free_all();
}

/* Fixed rows with strides (the strided-batched cuBLAS form): segment s's x, y and C each their own
 * matrix at a stride, FP16 activations and outputs, alpha, beta with C, a bias per segment of each
 * type; every output against the reference, and the gaps between the matrices untouched. Segments
 * of 37 rows, and of 3 (a decode step's few rows). */
static void grouped_strided(void) {
  NEED_GPU();
  enum { NSEG = 3, N = 256, K = 512 };
  for (int v = 0; v < 6; v++) {
    const int seg_rows = v < 3 ? 37 : 3;
    experts e = {0};
    problem p = {0};
    int rows[NSEG] = {seg_rows, seg_rows, seg_rows};
    const enum mt_dtype yt = v % 3 == 1 ? MT_DTYPE_BF16 : MT_DTYPE_FP16;
    const enum mt_dtype bt = v % 3 == 0   ? MT_DTYPE_FP32
                             : v % 3 == 1 ? MT_DTYPE_BF16
                                          : MT_DTYPE_FP16;
    const float alpha = v % 3 == 2 ? 0.5f : 1.25f, beta = v % 3 == 1 ? 0.0f : 0.75f;
    const size_t ldy = N + 8, sy = (size_t)seg_rows * ldy + 64; /* y's stride leaves a gap */
    uint16_t *y0 = malloc(NSEG * sy * 2), *y = malloc(NSEG * sy * 2);
    float *cf = malloc(NSEG * sy * sizeof *cf), *biasf = malloc(NSEG * N * sizeof *biasf);
    uint8_t *bias_h = malloc(NSEG * N * 4);
    if (!make_experts(&e, NSEG, N, K, &num_row, 1) ||
        !make_problem(&p, NSEG, rows, K, MT_SCALE_ROW, 1, NULL, 0)) {
      CHECK(0);
      goto next;
    }
    for (size_t i = 0; i < NSEG * sy; i++) { /* C is the y the call starts from */
      y0[i] = to_half((rnd_unit() - 0.5f) * 4.0f, yt == MT_DTYPE_FP16);
      cf[i] = out_value(y0, i, yt);
    }
    for (int j = 0; j < NSEG * N; j++) {
      float b = (rnd_unit() - 0.5f) * 2.0f;
      if (bt == MT_DTYPE_FP32)
        ((float *)bias_h)[j] = b;
      else
        ((uint16_t *)bias_h)[j] = to_half(b, bt == MT_DTYPE_FP16),
                   b = from_half(((uint16_t *)bias_h)[j], bt == MT_DTYPE_FP16);
      biasf[j] = b;
    }
    size_t ws_bytes = mt_grouped_workspace_bytes(p.m, K, &num_row);
    void *dy = dev_alloc(NSEG * sy * 2), *dbias = dev_alloc(NSEG * N * 4),
         *ws = dev_alloc(ws_bytes);
    if (!dy || !dbias || !ws)
      goto next;
    CU(cudaMemcpy(dy, y0, NSEG * sy * 2, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(dbias, bias_h, NSEG * N * 4, cudaMemcpyHostToDevice));
    mt_grouped_args a = {.nseg = NSEG,
                         .n = N,
                         .k = K,
                         .w = &e.ws,
                         .m = p.m,
                         .seg_rows = seg_rows,
                         .x = p.dx,
                         .ldx = p.ld,
                         .stride_x = (long long)(seg_rows * p.ld),
                         .xtype = MT_DTYPE_FP16,
                         .y = dy,
                         .ldy = ldy,
                         .stride_y = (long long)sy,
                         .ytype = yt,
                         .c = dy,
                         .ldc = ldy,
                         .stride_c = (long long)sy,
                         .bias = dbias,
                         .stride_bias = N,
                         .biastype = bt,
                         .alpha = alpha,
                         .beta = beta,
                         .workspace = ws,
                         .workspace_bytes = ws_bytes};
    MT(mt_gemm_grouped(&a, NULL));
    CU(sync_check());
    CU(cudaMemcpy(y, dy, NSEG * sy * 2, cudaMemcpyDeviceToHost));
    out_check oc = {0};
    long gap = 0;
    for (int s = 0; s < NSEG; s++) {
      mt_nvfp4 ar = rows_of(&p.ref, s * seg_rows, seg_rows);
      check_outputs(&ar, &e.ref[s], y + s * sy, y0 + s * sy, ldy, yt, alpha, beta, cf + s * sy,
                    biasf + s * N, NULL, &oc);
      for (size_t i = (size_t)seg_rows * ldy; i < sy; i++)
        gap += y[s * sy + i] != y0[s * sy + i];
    }
    CHECKF(!oc.bad && !oc.pad && !oc.nan && !gap,
           "strided, y %s, bias %d, beta %g: %ld outside the bound, %ld padding, %ld gap written",
           yt ? "fp16" : "bf16", (int)bt, beta, oc.bad, oc.pad, gap);
    printf("    strided variant %d, %d rows a segment: worst error %.3f of the bound\n", v % 3,
           seg_rows, oc.worst);
  out:
  next:
    free(y0);
    free(y);
    free(cf);
    free(biasf);
    free(bias_h);
    free_problem(&p);
    free_experts(&e);
    dev_free_all();
  }
}

/* ---- pointer arrays -------------------------------------------------------------------------- */

/* Device memory handed out in pieces, each `skew` elements past a 256-byte boundary (skew 1 and 4:
 * 2 and 8 bytes, so that nothing may assume a 16-byte base behind a pointer array). */
typedef struct {
  char *base;
  size_t used, bytes;
} pool;

static void *pool_put(pool *p, const void *host, size_t bytes, int skew) {
  size_t at = (p->used + 255) / 256 * 256 + (size_t)skew * 2;
  if (!p->base || at + bytes > p->bytes)
    return NULL;
  p->used = at + bytes;
  void *d = p->base + at;
  if (host && bytes && cudaMemcpy(d, host, bytes, cudaMemcpyHostToDevice) != cudaSuccess)
    return NULL;
  return d;
}

static const int skews[] = {0, 1, 4};

/* The store quantized through a device array of pointers to copies of the weights (at other
 * places and alignments) is the strided store of the same weights, byte for byte (both written
 * over the same bytes, so that the padding compares too). */
static int same_store(experts *e, int fp16, pool *pl, mt_wstore *ws2) {
  const enum mt_dtype t = fp16 ? MT_DTYPE_FP16 : MT_DTYPE_BF16;
  size_t bytes = mt_wstore_bytes(e->count, e->n, e->k, &e->num), wbytes = (size_t)e->n * e->ld * 2;
  void *wp[8], *mem2 = pool_put(pl, NULL, bytes, 0);
  uint8_t *a = malloc(bytes), *b = malloc(bytes);
  int same = 0;
  for (int s = 0; s < e->count; s++)
    wp[s] = pool_put(pl, e->host + (size_t)s * e->stride, wbytes, skews[s % 3]);
  void *const *dwp = pool_put(pl, wp, (size_t)e->count * sizeof *wp, 0);
  if (!mem2 || !dwp || mt_wstore_bind(ws2, e->count, e->n, e->k, &e->num, mem2) != MT_OK) {
    CHECK(0);
    goto out;
  }
  CU(cudaMemset(e->mem, 0x5a, bytes));
  CU(cudaMemset(mem2, 0x5a, bytes));
  MT(mt_wstore_quantize(e->dev, t, e->ld, e->stride, &e->ws, NULL));
  MT(mt_wstore_quantize_ptrs((const void *const *)dwp, t, e->ld, ws2, NULL));
  CU(sync_check());
  CU(cudaMemcpy(a, e->mem, bytes, cudaMemcpyDeviceToHost));
  CU(cudaMemcpy(b, mem2, bytes, cudaMemcpyDeviceToHost));
  long differ = 0;
  for (size_t i = 0; i < bytes; i++)
    differ += a[i] != b[i];
  CHECKF(differ == 0, "the store through pointers differs in %ld of %zu bytes", differ, bytes);
  same = differ == 0;
out:
  free(a), free(b);
  return same;
}

/* One pointer-array case: NSEG segments (rows each, or ragged with an empty one); the grouped GEMM
 * through x, y and C pointer arrays (and, ragged, a segment table from mt_grouped_seg_ends) against
 * the same data laid out with strides (uniform) or offsets (ragged): every output bit for bit, and
 * the pointer run's outputs against the reference. */
static void pointer_case(const mt_numerics *num, int fp16, int ragged, float beta) {
  enum { NSEG = 3, N = 256, K = 512, ROWS = 37 };
  const int rows[NSEG] = {ragged ? 5 : ROWS, ragged ? 0 : ROWS, ragged ? 40 : ROWS};
  const enum mt_dtype xt = fp16 ? MT_DTYPE_FP16 : MT_DTYPE_BF16, yt = xt;
  const float alpha = 1.25f;
  experts e = {0};
  problem p = {0};
  mt_wstore ws2;
  pool pl = {0};
  uint16_t *y0 = NULL, *c0 = NULL, *ya = NULL, *yb = NULL;
  float *cf = NULL;
  char what[96];
  snprintf(what, sizeof what, "%s act S, %s weight S, %s, %s, %s, beta %g",
           mt_scale_name(num->act_scale), mt_scale_name(num->weight_scale),
           mt_wblock_name(num->weight_block), fp16 ? "fp16" : "bf16", ragged ? "ragged" : "uniform",
           beta);
  if (!make_experts(&e, NSEG, N, K, num, fp16) ||
      !make_problem(&p, NSEG, rows, K, num->act_scale, fp16, NULL, 0)) {
    CHECK(0);
    goto out;
  }
  const size_t ldy = N + 8, ybytes = (size_t)p.m * ldy * 2;
  pl.bytes = (size_t)64 << 20;
  pl.base = dev_alloc(pl.bytes);
  if (!same_store(&e, fp16, &pl, &ws2))
    goto out;
  y0 = malloc(ybytes), c0 = malloc(ybytes), ya = malloc(ybytes), yb = malloc(ybytes);
  cf = malloc((size_t)p.m * ldy * sizeof *cf);
  for (size_t i = 0; i < (size_t)p.m * ldy; i++) {
    y0[i] = to_half((rnd_unit() - 0.5f) * 4.0f, fp16);
    c0[i] = to_half((rnd_unit() - 0.5f) * 4.0f, fp16);
    cf[i] = out_value(c0, i, yt);
  }
  /* the strided (or offsets) run: x, y and C each one matrix of all rows */
  int32_t ends[NSEG], ones[NSEG], rows32[NSEG];
  for (int s = 0; s < NSEG; s++)
    ends[s] = p.start[s] + p.rows[s], ones[s] = 1, rows32[s] = p.rows[s];
  void *dy = pool_put(&pl, y0, ybytes, 0), *dc = pool_put(&pl, c0, ybytes, 0);
  int32_t *doffs = pool_put(&pl, ends, sizeof ends, 0),
          *doffs2 = pool_put(&pl, NULL, sizeof ends, 0);
  size_t ws_bytes = mt_grouped_workspace_bytes(p.m, K, num);
  void *ws = pool_put(&pl, NULL, ws_bytes, 0);
  if (!dy || !dc || !doffs || !doffs2 || !ws) {
    CHECK(0);
    goto out;
  }
  mt_grouped_args a = {.nseg = NSEG,
                       .n = N,
                       .k = K,
                       .w = &e.ws,
                       .offs = ragged ? doffs : NULL,
                       .m = p.m,
                       .seg_rows = ragged ? 0 : ROWS,
                       .x = p.dx,
                       .ldx = p.ld,
                       .stride_x = ragged ? 0 : (long long)(ROWS * p.ld),
                       .xtype = xt,
                       .y = dy,
                       .ldy = ldy,
                       .stride_y = ragged ? 0 : (long long)(ROWS * ldy),
                       .ytype = yt,
                       .c = dc,
                       .ldc = ldy,
                       .stride_c = ragged ? 0 : (long long)(ROWS * ldy),
                       .alpha = alpha,
                       .beta = beta,
                       .workspace = ws,
                       .workspace_bytes = ws_bytes};
  MT(mt_gemm_grouped(&a, NULL));
  /* the pointer run: every segment's x, y and C its own piece, weights from the second store */
  void *xp[NSEG], *yp[NSEG], *cp[NSEG];
  for (int s = 0; s < NSEG; s++) {
    size_t at = (size_t)p.start[s] * ldy, n = (size_t)p.rows[s] * ldy * 2;
    xp[s] = pool_put(&pl, p.x + (size_t)p.start[s] * p.ld, (size_t)p.rows[s] * p.ld * 2, skews[s]);
    yp[s] = pool_put(&pl, y0 + at, n, skews[(s + 1) % 3]);
    cp[s] = pool_put(&pl, c0 + at, n, skews[(s + 2) % 3]);
  }
  void *dxp = pool_put(&pl, xp, sizeof xp, 0), *dyp = pool_put(&pl, yp, sizeof yp, 0),
       *dcp = pool_put(&pl, cp, sizeof cp, 0), *ws_b = pool_put(&pl, NULL, ws_bytes, 0);
  if (!dxp || !dyp || !dcp || !ws_b) {
    CHECK(0);
    goto out;
  }
  if (ragged)
    MT(mt_grouped_seg_ends(doffs2, 0, 0, NSEG, ones, rows32, NULL));
  mt_grouped_args b = a;
  b.w = &ws2, b.offs = ragged ? doffs2 : NULL, b.workspace = ws_b;
  b.x = NULL, b.y = NULL, b.c = NULL, b.stride_x = b.stride_y = b.stride_c = 0;
  b.x_ptrs = dxp, b.y_ptrs = dyp, b.c_ptrs = beta != 0.0f ? dcp : NULL;
  MT(mt_gemm_grouped(&b, NULL));
  CU(sync_check());
  CU(cudaMemcpy(ya, dy, ybytes, cudaMemcpyDeviceToHost));
  for (int s = 0; s < NSEG; s++)
    CU(cudaMemcpy(yb + (size_t)p.start[s] * ldy, yp[s], (size_t)p.rows[s] * ldy * 2,
                  cudaMemcpyDeviceToHost));
  int32_t got_ends[NSEG];
  CU(cudaMemcpy(got_ends, ragged ? doffs2 : doffs, sizeof got_ends, cudaMemcpyDeviceToHost));
  CHECKF(!memcmp(got_ends, ends, sizeof ends), "%s: the segment table", what);
  long differ = 0;
  for (size_t i = 0; i < (size_t)p.m * ldy; i++)
    differ += ya[i] != yb[i];
  CHECKF(differ == 0, "%s: %ld outputs differ from the strided path's", what, differ);
  out_check oc = {0};
  for (int s = 0; s < NSEG; s++) {
    if (!p.rows[s])
      continue;
    mt_nvfp4 ar = rows_of(&p.ref, p.start[s], p.rows[s]);
    size_t at = (size_t)p.start[s] * ldy;
    check_outputs(&ar, &e.ref[s], yb + at, y0 + at, ldy, yt, alpha, beta, cf + at, NULL, NULL, &oc);
  }
  CHECKF(!oc.bad && !oc.pad && !oc.nan, "%s: %ld outside the bound, %ld padding, %ld NaN", what,
         oc.bad, oc.pad, oc.nan);
  printf("    %s: bitwise the strided path's; worst error %.3f of the bound\n", what, oc.worst);
out:
  free(y0), free(c0), free(ya), free(yb), free(cf);
  free_problem(&p);
  free_experts(&e);
  dev_free_all();
}

/* Pointer arrays (the cuBLAS pointer-array forms): per-row and per-tensor S of both operands, 1x16
 * and 16x16 weight blocks, BF16 and FP16, uniform and ragged rows, beta with C and without. */
static void grouped_pointer_arrays(void) {
  NEED_GPU();
  static const mt_numerics nums[] = {
      {MT_SCALE_ROW, MT_SCALE_TENSOR, MT_WBLOCK_1X16},
      {MT_SCALE_ROW, MT_SCALE_ROW, MT_WBLOCK_1X16},
      {MT_SCALE_TENSOR, MT_SCALE_TENSOR, MT_WBLOCK_1X16},
      {MT_SCALE_TENSOR, MT_SCALE_TENSOR, MT_WBLOCK_16X16},
  };
  pointer_case(&nums[0], 0, 0, 0.75f);
  pointer_case(&nums[0], 0, 1, 0.0f);
  pointer_case(&nums[1], 1, 1, 0.5f);
  pointer_case(&nums[1], 0, 0, 0.0f);
  pointer_case(&nums[2], 0, 1, 0.75f);
  pointer_case(&nums[2], 1, 0, 0.0f);
  pointer_case(&nums[3], 1, 0, 0.75f);
  pointer_case(&nums[3], 0, 1, 0.25f);
}

/* Three segments of rows[] over 128 x 256 experts, a NaN in each of the nnan rows nan_rows[], token
 * tile bn: every row within the bound, NaN exactly in those rows' outputs. */
static void nan_case(const int rows[3], const int *nan_rows, int nnan, int bn, const char *what) {
  enum { NSEG = 3, N = 128, K = 256 };
  experts e = {0};
  problem p = {0};
  if (make_experts(&e, NSEG, N, K, &num_row, 0) &&
      make_problem(&p, NSEG, rows, K, MT_SCALE_ROW, 0, nan_rows, nnan)) {
    uint16_t *y0 = malloc((size_t)p.m * N * 2), *y = malloc((size_t)p.m * N * 2);
    char *nan_row = calloc((size_t)p.m, 1);
    for (int i = 0; i < nnan; i++)
      nan_row[nan_rows[i]] = 1;
    if (run_offs(&p, &e, bn, N, MT_DTYPE_BF16, y0, y))
      check_segments(&p, &e, y, y0, N, MT_DTYPE_BF16, nan_row, what);
    free(y0);
    free(y);
    free(nan_row);
  }
  free_problem(&p);
  free_experts(&e);
  dev_free_all();
}

/* A decode step's few rows (1 to 16 in all): segments of 0 to 3 rows over shapes with a partial
 * last block (k = 400), an odd number of 64-column blocks (448), Qwen3's and DeepSeek-V3's widths,
 * BF16 and FP16 rows: every token tile's outputs bitwise the same (every_bn: tile 8's against the
 * reference); and a NaN row, NaN in its outputs only. */
static void grouped_few_rows(void) {
  NEED_GPU();
  static const int shapes[][3] = {{6, 320, 448}, {5, 256, 400}, {9, 1536, 2048}, {4, 256, 7168}};
  for (int s = 0; s < NKINDS(shapes); s++) {
    int nseg = shapes[s][0], n = shapes[s][1], k = shapes[s][2], rows[16], m;
    do { /* one to 16 rows, some segments empty */
      m = 0;
      for (int i = 0; i < nseg; i++)
        m += rows[i] = rnd_below(4);
    } while (m < 1 || m > 16);
    every_bn_case(nseg, rows, n, k, &num_row, 0, s % 2, (size_t)n, MT_DTYPE_BF16);
  }
  const int rows[3] = {2, 0, 3}, nan_rows[1] = {3};
  nan_case(rows, nan_rows, 1, 8, "few rows, a NaN row");
}

/* A row holding NaN gives NaN in that row only, whatever segment it is in. */
static void grouped_nan_rows(void) {
  NEED_GPU();
  const int rows[3] = {5, 9, 20}, nan_rows[2] = {3, 20};
  nan_case(rows, nan_rows, 2, 16, "NaN rows");
}

/* More segments than one launch's table (MT_GROUPED_MAX_SEG): the launcher splits them; 0 to 3
 * rows each, every row within the bound. */
static void grouped_many_segments(void) {
  NEED_GPU();
  enum { NSEG = MT_GROUPED_MAX_SEG + 88, N = 128, K = 64 };
  int *rows = malloc(NSEG * sizeof(int));
  for (int i = 0; i < NSEG; i++)
    rows[i] = rnd_below(4);
  experts e = {0};
  problem p = {0};
  uint16_t *y0 = NULL, *y = NULL;
  /* then the call running its refresh, a fresh state (every used slice requantized, the same
   * bits): the first launch waits for the quantizer's count, the second for the first */
  const refresh_first rf = {dev_alloc(mt_refresh_state_bytes(NSEG)), 1};
  if (!rf.state || !make_experts_of(&e, NSEG, N, K, &num_row, 0, 0, 1) ||
      !make_problem(&p, NSEG, rows, K, MT_SCALE_ROW, 0, NULL, 0)) {
    CHECK(0);
    goto out;
  }
  y0 = malloc((size_t)p.m * N * 2), y = malloc((size_t)p.m * N * 2);
  if (run_offs(&p, &e, 8, N, MT_DTYPE_BF16, y0, y))
    check_segments(&p, &e, y, y0, N, MT_DTYPE_BF16, NULL, "600 segments");
  CU(cudaMemset(rf.state, 0, mt_refresh_state_bytes(NSEG)));
  if (run_offs_after(&p, &e, 8, N, MT_DTYPE_BF16, y0, y, &rf))
    check_segments(&p, &e, y, y0, N, MT_DTYPE_BF16, NULL, "600 segments, refreshed");
out:
  free(y0), free(y), free(rows);
  free_problem(&p);
  free_experts(&e);
  dev_free_all();
}

/* A layer's worth at a MoE shape (Qwen3's gate_up: 8 experts of 1536 x 2048, ~600 rows each, more
 * tiles than SMs on every token tile; DeepSeek-V3's: 4096 x 7168): sampled rows against the
 * reference, every row bitwise equal across the token tiles. */
static void layer_case(int N, int K, int rows_lo, int rows_span) {
  enum { NSEG = 8 };
  int rows[NSEG];
  for (int i = 0; i < NSEG; i++)
    rows[i] = rows_lo + rnd_below(rows_span);
  experts e = {0};
  problem p = {0};
  if (make_experts(&e, NSEG, N, K, &num_row, 0) &&
      make_problem(&p, NSEG, rows, K, MT_SCALE_ROW, 0, NULL, 0)) {
    size_t ybytes = (size_t)p.m * N * 2;
    uint16_t *y0 = malloc(ybytes), *y = malloc(ybytes), *first = malloc(ybytes);
    for (int b = 0; b < NKINDS(bns); b += 1) {
      if (!run_offs(&p, &e, bns[b], N, MT_DTYPE_BF16, y0, y))
        break;
      if (b == 0) {
        memcpy(first, y, ybytes);
        out_check oc = {0};
        for (int t = 0; t < 12; t++) { /* a few rows of the reference: it runs on the CPU */
          int s = rnd_below(NSEG), r = rnd_below(p.rows[s]);
          mt_nvfp4 ar = rows_of(&p.ref, p.start[s] + r, 1);
          size_t at = (size_t)(p.start[s] + r) * N;
          check_outputs(&ar, &e.ref[s], y + at, y0 + at, N, MT_DTYPE_BF16, 1.0f, 0.0f, NULL, NULL,
                        NULL, &oc);
        }
        CHECKF(!oc.bad && !oc.pad, "layer %dx%d: %ld outside the bound", N, K, oc.bad);
        printf("    layer %dx%d, %d rows: worst error %.3f of the bound (12 rows)\n", N, K, p.m,
               oc.worst);
      } else {
        CHECKF(!memcmp(y, first, ybytes), "layer %dx%d: bn %d differs from bn 8", N, K, bns[b]);
      }
    }
    free(y0);
    free(y);
    free(first);
  }
  free_problem(&p);
  free_experts(&e);
  dev_free_all();
}

static void grouped_layer(void) {
  NEED_GPU();
  layer_case(1536, 2048, 500, 200);
  layer_case(4096, 7168, 1, 60);
}

/* A grouped call that runs its store's refresh (kernels/engine.h, mt_grouped_args.refresh). Its
 * GEMM reads weights while the refresh runs: its first stages before it waits for the refresh (72
 * rows, 8 to 10 an expert), or every tile's before the refresh's verdict (15 rows, one to three:
 * the GEMM beside the refresh, waiting only for the activations); where the refresh requantizes,
 * it must read them again (kernels/grouped.cu, store_moved). Eight experts of 512 x 2048 (the K
 * loop longer than the ring, so that some stages come before the wait and some after), token tiles
 * 8 (two CTAs an SM), 128 (one) and 256 (its launch has no tile: the rows go to the second, which
 * waits for it), every store numerics and per-tensor S of the activations (a quantizer of two
 * kernels, the GEMM waiting for the refresh at any rows), both frozen modes; FP16 activations on
 * one numerics (per-row weight S). The weights rotated in place (slice s takes slice s + 1's): the
 * call's output against the reference of the rotated weights, bitwise equal to the same GEMM run
 * alone afterwards; then nothing changed: the same bits again. */
static void grouped_after_refresh(void) {
  NEED_GPU();
  enum { E = 8, N = 512, K = 2048 };
  static const int few[E] = {1, 3, 2, 1, 2, 3, 1, 2}, more[E] = {8, 10, 9, 8, 10, 9, 8, 10};
  static const mt_numerics tensor_acts = {MT_SCALE_TENSOR, MT_SCALE_TENSOR, MT_WBLOCK_1X16};
  for (int v = 0; v <= NKINDS(store_nums); v++)
    for (int c = 0; c < (v ? 2 : 4); c++) { /* more rows: one numerics (the reference is slow) */
      const int sampled = c & 1, *rows = c & 2 ? more : few;
      for (int b = 0; b < 3; b++) {
        const int bn = b == 2 ? 256 : b ? 128 : 8;
        const mt_numerics num = v < NKINDS(store_nums) ? store_nums[v] : tensor_acts;
        const refresh_first rf = {dev_alloc(mt_refresh_state_bytes(E)),
                                  sampled ? MT_SAMPLE_STEP : 1};
        experts e = {0};
        problem p = {0};
        mt_nvfp4 *rot = malloc(E * sizeof *rot);
        uint16_t *y0 = NULL, *y = NULL, *alone = NULL;
        if (!rf.state || !make_experts_of(&e, E, N, K, &num, 0, 0, 1) ||
            !make_problem(&p, E, rows, K, num.act_scale, v == 1, NULL, 0)) {
          CHECK(0);
          goto out;
        }
        const size_t ybytes = (size_t)p.m * N * 2;
        y0 = malloc(ybytes), y = malloc(ybytes), alone = malloc(ybytes);
        char what[128];
        snprintf(what, sizeof what, "%s, %d rows, activations %s %s S, weights %s S %s, bn %d",
                 sampled ? "frozen-sampled" : "frozen", p.m, v == 1 ? "FP16" : "BF16",
                 mt_scale_name(num.act_scale), mt_scale_name(num.weight_scale),
                 mt_wblock_name(num.weight_block), bn);
        CU(cudaMemset(rf.state, 0, mt_refresh_state_bytes(E)));
        MT(refresh_store(&e, e.ld, rf.state, rf.step, NULL, 0));
        CU(rotate_slices(&e, rot));
        if (!run_offs_after(&p, &e, bn, N, MT_DTYPE_BF16, y0, y, &rf) ||
            !run_offs(&p, &e, bn, N, MT_DTYPE_BF16, y0, alone))
          goto out;
        experts er = e;
        er.ref = rot;
        check_segments(&p, &er, y, y0, N, MT_DTYPE_BF16, NULL, what);
        CHECKF(!memcmp(y, alone, ybytes), "%s: the GEMM after the refresh differs from it alone",
               what);
        if (!run_offs_after(&p, &e, bn, N, MT_DTYPE_BF16, y0, y, &rf))
          goto out;
        CHECKF(!memcmp(y, alone, ybytes), "%s, nothing changed: the output differs", what);
      out:
        free(y0), free(y), free(alone), free(rot);
        free_problem(&p);
        free_experts(&e);
        dev_free_all();
      }
    }
}

/* Grouped calls on one store and state back to back, nothing between them on the stream but an
 * in-place change: at token tile 8 (two CTAs an SM) a GEMM lets the next call's kernels start while
 * it runs, so the next call's quantizer counts itself in the state, and its refresh reads the
 * store, as soon as this call has ended (kernels/engine.h). Every slice changed in place (rotated:
 * slice s takes slice s + 1's), then two calls of 15 rows (the GEMM beside the refresh), the
 * weights put back by an asynchronous copy, two calls more: each output bitwise equal to the same
 * GEMM run alone on its weights, which matches the reference, and the calls end (no GEMM waiting
 * for its activations' count is held for good by the next call's quantizer: a variant whose
 * quantizer counted itself before its wait, and whose GEMM let the next call start before it had
 * read its count, hung here). Token tiles 8 and 128 (one CTA an SM: the next call starts as the
 * GEMM ends); every store numerics, frozen-sampled (and frozen on one). */
static void grouped_back_to_back(void) {
  NEED_GPU();
  enum { E = 8, N = 512, K = 2048, CALLS = 4 };
  static const int rows[E] = {1, 3, 2, 1, 2, 3, 1, 2};
  for (int v = 0; v < NKINDS(store_nums); v++)
    for (int c = 0; c < (v ? 2 : 4); c++) {
      const int bn = c & 1 ? 128 : 8, sampled = !(c & 2);
      const refresh_first rf = {dev_alloc(mt_refresh_state_bytes(E)), sampled ? MT_SAMPLE_STEP : 1};
      experts e = {0};
      problem p = {0};
      mt_nvfp4 *rot = malloc(E * sizeof *rot);
      uint16_t *y0 = NULL, *y = NULL, *alone[2] = {NULL, NULL};
      if (!rf.state || !make_experts_of(&e, E, N, K, &store_nums[v], 0, 0, 1) ||
          !make_problem(&p, E, rows, K, store_nums[v].act_scale, 0, NULL, 0)) {
        CHECK(0);
        goto out;
      }
      const size_t ybytes = (size_t)p.m * N * 2, wbytes = (size_t)E * N * K * 2;
      const size_t ws_bytes = mt_grouped_workspace_bytes(p.m, K, &e.num);
      y0 = malloc(ybytes), y = malloc(ybytes), alone[0] = malloc(ybytes), alone[1] = malloc(ybytes);
      void *orig = dev_alloc(wbytes), *ws = dev_alloc(ws_bytes), *dy[CALLS];
      int32_t *doffs = dev_offs(&p);
      int have = orig && ws && doffs;
      for (int i = 0; i < CALLS; i++)
        have &= (dy[i] = dev_alloc(ybytes)) != NULL;
      char what[96];
      snprintf(what, sizeof what, "%s, weights %s S %s, bn %d",
               sampled ? "frozen-sampled" : "frozen", mt_scale_name(store_nums[v].weight_scale),
               mt_wblock_name(store_nums[v].weight_block), bn);
      if (!have) {
        CHECK(0);
        goto out;
      }
      CU(cudaMemset(rf.state, 0, mt_refresh_state_bytes(E)));
      MT(refresh_store(&e, e.ld, rf.state, rf.step, NULL, 0));
      CU(cudaMemcpy(orig, e.dev, wbytes, cudaMemcpyDeviceToDevice));
      CU(rotate_slices(&e, rot));
      const mt_wstore_refresh_args r = refresh_of(&e, e.ld, rf.state, rf.step, doffs, p.m);
      for (int i = 0; i < CALLS; i++) {
        if (i == CALLS / 2)
          CU(cudaMemcpyAsync(e.dev, orig, wbytes, cudaMemcpyDeviceToDevice, NULL));
        mt_grouped_args a = offs_call(&p, &e, bn, N, MT_DTYPE_BF16, doffs, dy[i], ws, ws_bytes);
        a.refresh = &r;
        MT(mt_gemm_grouped(&a, NULL));
      }
      CU(sync_check());
      /* the same GEMMs alone: the weights put back, then rotated again */
      if (!run_offs(&p, &e, bn, N, MT_DTYPE_BF16, y0, alone[1]))
        goto out;
      CU(rotate_slices(&e, NULL));
      MT(refresh_store(&e, e.ld, rf.state, rf.step, NULL, 0));
      CU(sync_check());
      if (!run_offs(&p, &e, bn, N, MT_DTYPE_BF16, y0, alone[0]))
        goto out;
      experts er = e;
      er.ref = rot;
      check_segments(&p, &er, alone[0], y0, N, MT_DTYPE_BF16, NULL, what);
      check_segments(&p, &e, alone[1], y0, N, MT_DTYPE_BF16, NULL, what);
      for (int i = 0; i < CALLS; i++) {
        CU(cudaMemcpy(y, dy[i], ybytes, cudaMemcpyDeviceToHost));
        CHECKF(!memcmp(y, alone[i >= CALLS / 2], ybytes),
               "%s: call %d of %d back to back differs from it alone", what, i + 1, CALLS);
      }
    out:
      free(y0), free(y), free(alone[0]), free(alone[1]), free(rot);
      free_problem(&p);
      free_experts(&e);
      dev_free_all();
    }
}

/* ---- vLLM's dispatch (kernels/engine.h, mt_moe_dispatch) ------------------------------------- */

/* vLLM's moe_align_block_size on the host: the ids (token * top_k + j) of each expert in id order,
 * padded to whole blocks of bm with the pad id `valid`; blocks of experts the map sends to -1 keep
 * their slots with expert -1 (ignore_invalid_experts off). Naive: one block a (token, expert) pair,
 * no slots. */
typedef struct {
  int32_t *sorted, *experts, padded;
  int blocks;
} aligned;

static aligned align_blocks(const int32_t *ids, int valid, int E, int bm, const int *map,
                            int naive) {
  aligned a = {0};
  if (naive) {
    a.experts = malloc((size_t)valid * 4);
    for (int i = 0; i < valid; i++)
      a.experts[i] = map[ids[i]];
    a.blocks = valid, a.padded = valid * bm;
    return a;
  }
  a.sorted = malloc(((size_t)valid + (size_t)E * bm) * 4);
  a.experts = malloc(((size_t)valid / bm + (size_t)E + 1) * 4);
  for (int e = 0; e < E; e++) {
    int n = 0;
    for (int i = 0; i < valid; i++)
      if (ids[i] == e)
        a.sorted[a.padded + n++] = i;
    for (; n % bm; n++)
      a.sorted[a.padded + n] = valid;
    for (int b = 0; b < n / bm; b++)
      a.experts[a.blocks++] = map[e];
    a.padded += n;
  }
  return a;
}

/* One dispatch case: `tokens` tokens routed top_k of E experts at random (distinct a token), block
 * bm, sorted or naive, the blocks the Triton kernel runs cut to `cut` (0: all), experts >= local
 * mapped to -1 (local < E: another rank's), with or without router weights. The dispatched call's
 * output row id against the same rows gathered by hand through the grouped call with offsets:
 * bitwise (weighted: the unweighted row, rounded, times the weight in FP32, rounded again); rows
 * of blocks not run untouched, of expert -1 zeroed. */
static void dispatch_case(int tokens, int top_k, int E, int local, int bm, int naive, int cut,
                          int weighted) {
  enum { N = 256, K = 512 };
  const int valid = tokens * top_k;
  char what[160];
  snprintf(what, sizeof what, "%d tokens top-%d of %d experts (%d local), block %d%s%s%s", tokens,
           top_k, E, local, bm, naive ? ", naive" : "", cut ? ", blocks cut" : "",
           weighted ? ", weighted" : "");
  int32_t *ids = malloc((size_t)valid * 4);
  int *map = malloc((size_t)E * sizeof *map), *rows = calloc((size_t)E, sizeof *rows);
  float *w = malloc((size_t)valid * 4);
  for (int e = 0; e < E; e++)
    map[e] = e < local ? e : -1;
  for (int t = 0; t < tokens; t++)
    for (int j = 0; j < top_k; j++) {
      int e, dup;
      do {
        e = rnd_below(E), dup = 0;
        for (int i = 0; i < j; i++)
          dup |= ids[t * top_k + i] == e;
      } while (dup);
      ids[t * top_k + j] = e;
      w[t * top_k + j] = rnd_unit() + 0x1p-4f;
    }
  aligned al = align_blocks(ids, valid, E, bm, map, naive);
  const int blocks = cut ? (al.blocks + 1) / 2 : al.blocks;
  /* the ids a run block holds, in the order gathered by expert for the reference call */
  int *ran = calloc((size_t)valid, sizeof *ran);
  for (int b = 0; b < blocks; b++)
    for (int i = 0; i < (naive ? 1 : bm); i++) {
      const int id = naive ? b : al.sorted[b * bm + i];
      if (id < valid)
        ran[id] = al.experts[b] >= 0 ? 1 : -1;
    }
  experts ex = {0};
  problem p = {0}, g = {0};
  for (int i = 0; i < valid; i++)
    if (ran[i] == 1)
      rows[map[ids[i]]]++;
  uint16_t *y0 = NULL, *y = NULL, *yg = NULL, *yg0 = NULL;
  int *row_of = malloc((size_t)valid * sizeof *row_of);
  if (!make_experts_of(&ex, local, N, K, &num_row, 0, 0, 1) ||
      !make_problem(&p, 1, &tokens, K, MT_SCALE_ROW, 0, NULL, 0) ||
      !make_problem(&g, local, rows, K, MT_SCALE_ROW, 0, NULL, 0)) {
    CHECK(0);
    goto out;
  }
  /* g's rows: each run id's token row of p, by expert */
  int *fill = calloc((size_t)local, sizeof *fill);
  for (int i = 0; i < valid; i++)
    if (ran[i] == 1) {
      const int e = map[ids[i]], r = g.start[e] + fill[e]++;
      memcpy(g.x + (size_t)r * g.ld, p.x + (size_t)(i / top_k) * p.ld, (size_t)K * 2);
      row_of[i] = r;
    }
  free(fill);
  CU(cudaMemcpy(g.dx, g.x, (size_t)(g.m > 0 ? g.m : 1) * g.ld * 2, cudaMemcpyHostToDevice));
  const size_t ybytes = (size_t)valid * N * 2, gbytes = (size_t)(g.m > 0 ? g.m : 1) * N * 2;
  y0 = malloc(ybytes), y = malloc(ybytes), yg = malloc(gbytes), yg0 = malloc(gbytes);
  if (g.m > 0 && !run_offs(&g, &ex, 0, N, MT_DTYPE_BF16, yg0, yg))
    goto out;
  /* the dispatched call */
  const size_t ws_bytes = mt_grouped_workspace_bytes(valid, K, &ex.num),
               lbytes = mt_moe_lists_bytes(valid, local, weighted);
  void *dy = dev_alloc(ybytes), *ws = dev_alloc(ws_bytes), *lists = dev_alloc(lbytes);
  int32_t *dsorted = naive ? NULL : dev_alloc((size_t)al.padded * 4),
          *dexp = dev_alloc((size_t)al.blocks * 4), *dpad = dev_alloc(4);
  float *dw = dev_alloc((size_t)valid * 4);
  if (!dy || !ws || !lists || (!naive && !dsorted) || !dexp || !dpad || !dw) {
    CHECK(0);
    goto out;
  }
  CU(cudaMemcpy(dexp, al.experts, (size_t)al.blocks * 4, cudaMemcpyHostToDevice));
  if (!naive)
    CU(cudaMemcpy(dsorted, al.sorted, (size_t)al.padded * 4, cudaMemcpyHostToDevice));
  CU(cudaMemcpy(dpad, &al.padded, 4, cudaMemcpyHostToDevice));
  CU(cudaMemcpy(dw, w, (size_t)valid * 4, cudaMemcpyHostToDevice));
  CHECK(poison(dy, ybytes) && poison(ws, ws_bytes) && poison(lists, lbytes));
  CU(cudaMemcpy(y0, dy, ybytes, cudaMemcpyDeviceToHost));
  mt_moe_dispatch d = {.sorted = dsorted,
                       .experts = dexp,
                       .post_padded = dpad,
                       .weights = weighted ? dw : NULL,
                       .blocks = blocks,
                       .block_m = bm,
                       .top_k = top_k,
                       .lists = mt_moe_lists_at(lists, valid, local, weighted)};
  mt_grouped_args a = {.nseg = local,
                       .n = N,
                       .k = K,
                       .w = &ex.ws,
                       .offs = d.lists.offs,
                       .m = valid,
                       .x = p.dx,
                       .ldx = p.ld,
                       .xtype = MT_DTYPE_BF16,
                       .y = dy,
                       .ldy = N,
                       .ytype = MT_DTYPE_BF16,
                       .alpha = 1.0f,
                       .workspace = ws,
                       .workspace_bytes = ws_bytes,
                       .dispatch = &d};
  MT(mt_gemm_grouped(&a, NULL));
  CU(sync_check());
  CU(cudaMemcpy(y, dy, ybytes, cudaMemcpyDeviceToHost));
  long differ = 0, touched = 0, not_zero = 0;
  for (int i = 0; i < valid; i++)
    for (int j = 0; j < N; j++) {
      const uint16_t got = y[(size_t)i * N + j];
      if (ran[i] == 1) {
        uint16_t want = yg[(size_t)row_of[i] * N + j];
        if (weighted)
          want = to_half(from_half(want, 0) * w[i], 0);
        differ += got != want;
      } else if (ran[i] == -1) {
        not_zero += got != 0;
      } else {
        touched += got != y0[(size_t)i * N + j];
      }
    }
  CHECKF(!differ && !touched && !not_zero,
         "%s: %ld outputs differ, %ld rows not run written, %ld of expert -1 not 0", what, differ,
         touched, not_zero);
  printf("    %s: %d rows routed\n", what, g.m);
out:
  free(y0), free(y), free(yg), free(yg0), free(row_of), free(ran), free(ids), free(map), free(rows),
      free(w);
  free(al.sorted), free(al.experts);
  free_problem(&p), free_problem(&g);
  free_experts(&ex);
  dev_free_all();
}

static void grouped_moe_dispatch(void) {
  NEED_GPU();
  static const int tokens[] = {1, 5, 40, 300};
  for (int t = 0; t < NKINDS(tokens); t++)
    for (int c = 0; c < 4; c++)
      dispatch_case(tokens[t], 4, 16, 16, c & 1 ? 64 : 16, 0, 0, c >> 1);
  dispatch_case(1, 8, 64, 64, 16, 1, 0, 0); /* naive: decode of a few tokens */
  dispatch_case(3, 8, 128, 128, 16, 1, 0, 1);
  dispatch_case(40, 4, 16, 12, 16, 0, 0, 1); /* another rank's experts: their rows zeroed */
  dispatch_case(40, 4, 16, 16, 16, 0, 1, 0); /* the blocks cut (vLLM's EM for few tokens) */
  dispatch_case(2, 8, 64, 64, 16, 1, 1, 1);
}

int main(void) {
  seed_rng();
  RUN(store_slices);
  RUN(store_in_out);
  RUN(store_refresh_modes);
  RUN(store_refresh_rounds);
  RUN(grouped_after_refresh);
  RUN(grouped_back_to_back);
  RUN(grouped_accuracy);
  RUN(grouped_widths);
  RUN(grouped_bitwise);
  RUN(grouped_strided);
  RUN(grouped_pointer_arrays);
  RUN(grouped_few_rows);
  RUN(grouped_nan_rows);
  RUN(grouped_many_segments);
  RUN(grouped_layer);
  RUN(grouped_moe_dispatch);
  return mt_test_done();
}
