/* test_gemm_paths.c — AUTO's choice of GEMM path (kernels/gemm.c: mt_gemm_auto_path), the large
 * path's choice of tile (mt_gemm_large_tile) and a store refresh's cluster size
 * (kernels/quant.c: mt_refresh_cluster) on the benchmark shapes, against what the benchmarks
 * measured best (lab/NOTES.md), and the refusals of a forced path that cannot take a call. No GPU:
 * the choices are host code, and the refusals come before any launch. */
#include <stdio.h>
#include <string.h>

#include "kernels/engine.h"
#include "kernels/gemm.h"
#include "kernels/gemm_args.h"
#include "kernels/quant.h"
#include "tests/harness.h"

enum { F = MT_PATH_FUSED, L = MT_PATH_LARGE };

/* The best path at M = 1..8 on 132 SMs, quantization included (lab/NOTES.md, "The fused kernel
 * and the path choice"): the large path's 64-token tiles everywhere but Qwen3's down at one token,
 * where the fused kernel wins. */
static const struct {
  const char *name;
  int n, k;
  int want[8];
} shapes[] = {
    {"qwen3 gate_up", 1536, 2048, {L, L, L, L, L, L, L, L}},
    {"qwen3 down", 2048, 768, {F, L, L, L, L, L, L, L}},
    {"dsv3 gate_up", 4096, 7168, {L, L, L, L, L, L, L, L}},
    {"dsv3 down", 7168, 2048, {L, L, L, L, L, L, L, L}},
};

static void auto_path_on_the_benchmark_shapes(void) {
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
    for (int m = 1; m <= 8; m++) {
      int got = mt_gemm_auto_path(m, shapes[s].n, shapes[s].k, 1, 132);
      CHECKF(got == shapes[s].want[m - 1], "%s M = %d: path %d, want %d", shapes[s].name, m, got,
             shapes[s].want[m - 1]);
    }
}

/* Without the packed weight every call takes the large path; fewer SMs mean more waves of the
 * fused kernel's CTAs, so fewer tokens fused (down: 128 CTAs on 64 SMs are 2 waves); the fused
 * kernel while m * k * waves <= 1024. */
static void auto_path_edges(void) {
  CHECK(mt_gemm_auto_path(1, 2048, 768, 0, 132) == L);
  CHECK(mt_gemm_auto_path(1, 2048, 768, 1, 64) == L);
  CHECK(mt_gemm_auto_path(1, 16, 1024, 1, 132) == F);
  CHECK(mt_gemm_auto_path(1, 16, 1040, 1, 132) == L);
  CHECK(mt_gemm_auto_path(2, 16, 512, 1, 132) == F);
  CHECK(mt_gemm_auto_path(3, 16, 336, 1, 132) == F);
  CHECK(mt_gemm_auto_path(3, 16, 352, 1, 132) == L);
  CHECK(mt_gemm_auto_path(1, 2112, 512, 1, 132) == F); /* 132 CTAs: one wave */
  CHECK(mt_gemm_auto_path(1, 2128, 768, 1, 132) == L); /* 133: two */
}

/* The fused kernel's copy of the weight exists only where AUTO fuses one token on 132 SMs. */
static void fragment_copy_only_where_used(void) {
  CHECK(mt_gemm_frag_bytes(2048, 768) == (size_t)2048 * 768 * 5 / 8);
  CHECK(mt_gemm_frag_bytes(1536, 2048) == 0);
  CHECK(mt_gemm_frag_bytes(2112, 1024) > 0 && mt_gemm_frag_bytes(2128, 1024) == 0);
  CHECK(mt_gemm_frag_bytes(256, 1024) > 0 && mt_gemm_frag_bytes(256, 1040) == 0);
  CHECK(mt_gemm_frag_bytes(4096, 7168) == 0 && mt_gemm_frag_bytes(7168, 2048) == 0);
  CHECK(mt_gemm_frag_bytes(264, 256) == 0); /* n % 16 */
  mt_numerics num = {MT_SCALE_ROW, MT_SCALE_TENSOR, MT_WBLOCK_1X16};
  CHECK(mt_qweight_bytes(7168, 2048, &num) <
        (size_t)7168 * 2048 * 2 * 13 / 10); /* ~2.56 B an element */
  CHECK(mt_qweight_bytes(1536, 2048, &num) < (size_t)1536 * 2048 * 2 * 13 / 10);
  CHECK(mt_qweight_bytes(2048, 768, &num) > (size_t)2048 * 768 * 3); /* ~3.19 */
}

/* The kept form (what the frozen cache keeps of a single call's weight): codes, scales and S, at
 * most 0.6 bytes an element on the benchmark shapes and every weight numerics; the dequantized
 * copy a call on it writes into its workspace is 2 bytes an element. */
static void kept_form_under_0_6_bytes(void) {
  static const int dims[][2] = {{1536, 2048}, {2048, 768}, {4096, 7168}, {7168, 2048}};
  static const mt_numerics nums[] = {{MT_SCALE_ROW, MT_SCALE_TENSOR, MT_WBLOCK_1X16},
                                     {MT_SCALE_ROW, MT_SCALE_ROW, MT_WBLOCK_1X16},
                                     {MT_SCALE_ROW, MT_SCALE_TENSOR, MT_WBLOCK_16X16}};
  for (size_t s = 0; s < sizeof dims / sizeof dims[0]; s++)
    for (size_t v = 0; v < sizeof nums / sizeof nums[0]; v++) {
      const size_t elems = (size_t)dims[s][0] * (size_t)dims[s][1];
      const size_t kept = mt_qweight_kept_bytes(dims[s][0], dims[s][1], &nums[v]);
      CHECKF(kept >= elems * 9 / 16 && kept <= elems * 6 / 10, "%dx%d: %zu bytes", dims[s][0],
             dims[s][1], kept);
      CHECK(mt_qweight_xhat_bytes(dims[s][0], dims[s][1]) == elems * 2);
    }
  CHECK(mt_qweight_xhat_bytes(0, 16) == 0);
}

/* The large path's tile on the benchmark shapes (132 SMs), bm x bn, at M = 1, 16, 64, 256, 300,
 * 1024, 4096, 16384: the tiles measured best up to M = 300 (GEMM alone; lab/NOTES.md, "Tiles of 64
 * tokens"), from M = 1024 on those of the TMA-store kernels (lab/NOTES.md, "Large-M kernels and
 * tiles"). */
static const int tile_ms[] = {1, 16, 64, 256, 300, 1024, 4096, 16384};
static const struct {
  const char *name;
  int n;
  int want[8][2];
} tile_shapes[] = {
    {"qwen3 gate_up",
     1536,
     {{64, 32}, {64, 32}, {64, 32}, {64, 48}, {64, 64}, {128, 96}, {128, 192}, {128, 256}}},
    {"qwen3 down",
     2048,
     {{64, 32}, {64, 32}, {64, 32}, {64, 64}, {128, 64}, {128, 128}, {128, 256}, {128, 256}}},
    {"dsv3 gate_up",
     4096,
     {{64, 32}, {64, 32}, {64, 32}, {128, 64}, {128, 96}, {128, 256}, {128, 256}, {128, 256}}},
    {"dsv3 down",
     7168,
     {{64, 64}, {64, 64}, {64, 64}, {128, 128}, {128, 192}, {128, 256}, {128, 256}, {128, 256}}},
};

static void large_tiles_on_the_benchmark_shapes(void) {
  for (size_t s = 0; s < sizeof tile_shapes / sizeof tile_shapes[0]; s++)
    for (int i = 0; i < 8; i++) {
      mt_gemm_tile t = mt_gemm_large_tile(tile_ms[i], tile_shapes[s].n, 132, 0, 0);
      CHECKF(t.bm == tile_shapes[s].want[i][0] && t.bn == tile_shapes[s].want[i][1],
             "%s M = %d: %d x %d, want %d x %d", tile_shapes[s].name, tile_ms[i], t.bm, t.bn,
             tile_shapes[s].want[i][0], tile_shapes[s].want[i][1]);
    }
}

/* A store refresh's clusters on the benchmark layers' weights (128 or 256 slices): a full check 16
 * CTAs a slice; a sampled one as few as keep each warp at one run of 32 sampled lines, at most 8:
 * Qwen3's gate_up has 3 runs a slice, its down 2, DeepSeek's 28 and 14, over 8 warps a CTA
 * (per-tensor S, 1x16 blocks or 16x16 tiles) or 4 (per-row S: a CTA spans a row's pairs of
 * blocks) (lab/NOTES.md, "The sampled refresh's clusters"); 0 for what is no store. */
static void refresh_clusters_on_the_benchmark_shapes(void) {
  static const struct {
    const char *name;
    int slices, n, k;
    unsigned sampled, sampled_row; /* per-tensor S, per-row S */
  } w[] = {{"qwen3 gate_up", 128, 1536, 2048, 1, 1},
           {"qwen3 down", 128, 2048, 768, 1, 1},
           {"dsv3 gate_up", 256, 4096, 7168, 4, 8},
           {"dsv3 down", 256, 7168, 2048, 2, 4},
           {"one run a slice", 3, 256, 512, 1, 1}};
  for (size_t i = 0; i < sizeof w / sizeof w[0]; i++)
    for (int v = 0; v < 3; v++) { /* per-tensor S, per-row S, 16x16 tiles */
      mt_quant_params p = {.rows = w[i].slices * w[i].n,
                           .cols = w[i].k,
                           .row_outer = v == 1,
                           .batch_rows = w[i].n,
                           .store = (uint8_t *)16};
      const unsigned want = v == 1 ? w[i].sampled_row : w[i].sampled;
      const unsigned full = mt_refresh_cluster(&p, v == 2, 1),
                     sampled = mt_refresh_cluster(&p, v == 2, MT_SAMPLE_STEP);
      CHECKF(full == 16 && sampled == want,
             "%s, numerics %d: clusters of %u and %u, want 16 and %u", w[i].name, v, full, sampled,
             want);
    }
  mt_quant_params none = {.rows = 256, .cols = 512, .batch_rows = 256};
  CHECK(mt_refresh_cluster(&none, 0, MT_SAMPLE_STEP) == 0 && mt_refresh_cluster(NULL, 0, 1) == 0);
}

/* Every choice is a tile some kernel has: 128 x 256..64 or 64 x 64..32; a forced height or width
 * is kept, and a pair no kernel has is {0, 0}. */
/* One box a stage and operand (mt_gemm_kpair) on the benchmark shapes' 64-token tiles where the
 * K loop outlasts the ring of 8 stages at width 32 (gate_up, DeepSeek's two), not on down's 6
 * stages, nor where k % 64 != 0, nor on the 128-token tiles. */
static void kpair_where_the_loop_outlasts_the_ring(void) {
  const mt_gemm_tile n32 = {64, 32}, n64 = {64, 64}, big = {128, 128};
  CHECK(mt_gemm_kpair(2048, n32) && mt_gemm_kpair(7168, n32) && !mt_gemm_kpair(768, n32));
  CHECK(!mt_gemm_kpair(1024, n32) && mt_gemm_kpair(1088, n32) && !mt_gemm_kpair(2080, n32));
  CHECKF(MT_LARGE_STAGES_64(64) == 6, "%d stages at width 64", MT_LARGE_STAGES_64(64));
  CHECK(!mt_gemm_kpair(768, n64) && mt_gemm_kpair(896, n64) && !mt_gemm_kpair(7168, big));
}

static void large_tiles_exist(void) {
  static const int ms[] = {1, 7, 64, 65, 200, 513, 3000, 70000},
                   ns[] = {16, 264, 1536, 4096, 7168, 30000};
  static const int sms[] = {1, 78, 132};
  for (int i = 0; i < 8; i++)
    for (int j = 0; j < 6; j++)
      for (int s = 0; s < 3; s++) {
        mt_gemm_tile t = mt_gemm_large_tile(ms[i], ns[j], sms[s], 0, 0);
        int ok = t.bm == 128 ? t.bn == 256 || t.bn == 192 || t.bn == 128 || t.bn == 96 || t.bn == 64
                             : t.bm == 64 && (t.bn == 64 || t.bn == 48 || t.bn == 32);
        CHECKF(ok, "M = %d, N = %d, %d SMs: %d x %d", ms[i], ns[j], sms[s], t.bm, t.bn);
        mt_gemm_tile h = mt_gemm_large_tile(ms[i], ns[j], sms[s], 128, 0),
                     w = mt_gemm_large_tile(ms[i], ns[j], sms[s], 0, 48);
        CHECK(h.bm == 128 && w.bm == 64 && w.bn == 48);
      }
  mt_gemm_tile none = mt_gemm_large_tile(256, 1536, 132, 64, 256);
  CHECK(none.bm == 0 && none.bn == 0);
  none = mt_gemm_large_tile(256, 1536, 132, 128, 32);
  CHECK(none.bm == 0 && none.bn == 0);
}

/* A forced path past its rows or without the packed weight is refused before anything runs. */
static void forced_paths_refused(void) {
  static _Alignas(256) unsigned char fake[256]; /* never touched */
  mt_qweight w = {.n = 64, .k = 64, .xhat = (uint16_t *)fake, .frag = fake};
  mt_gemm_args a = {.m = 5, .n = 64, .k = 64, .w = &w, .path = MT_PATH_FUSED};
  CHECK(mt_gemm_path_of(&a) == -1);
  a.m = 4;
  CHECK(mt_gemm_path_of(&a) == MT_PATH_FUSED);
  w.frag = NULL;
  CHECK(mt_gemm_path_of(&a) == -1);
  a.path = MT_PATH_LARGE;
  CHECK(mt_gemm_path_of(&a) == MT_PATH_LARGE);
  a.path = (enum mt_gemm_path)9;
  CHECK(mt_gemm_path_of(&a) == -1);
}

/* A grouped call's refresh with a segment table reads an end for each of its slices: it must be the
 * call's own table, a segment a slice. Refused before anything runs; accepted, the call goes on to
 * its workspace (NULL here: out of memory). */
static void grouped_refresh_tables(void) {
  static _Alignas(256) unsigned char fake[4096]; /* never touched */
  const int32_t *offs = (const int32_t *)fake, *other = offs + 64;
  mt_wstore w = {.count = 8, .n = 64, .k = 64, .base = fake, .slice_bytes = 512};
  mt_wstore_refresh_args r = {
      .w = fake, .type = MT_DTYPE_BF16, .ldw = 64, .ws = &w, .state = fake, .m = 16};
  mt_grouped_args a = {.m = 16,
                       .n = 64,
                       .k = 64,
                       .nseg = 8,
                       .w = &w,
                       .offs = offs,
                       .x = fake,
                       .ldx = 64,
                       .y = fake,
                       .ldy = 64,
                       .refresh = &r};
  CHECK(mt_gemm_grouped(&a, NULL) == MT_ERR_NOMEM); /* no table: every slice */
  r.offs = offs;
  CHECK(mt_gemm_grouped(&a, NULL) == MT_ERR_NOMEM);
  r.offs = other;
  CHECK(mt_gemm_grouped(&a, NULL) == MT_ERR_UNSUPPORTED);
  r.offs = offs, a.nseg = 4; /* 8 slices, 4 ends */
  CHECK(mt_gemm_grouped(&a, NULL) == MT_ERR_UNSUPPORTED);
  mt_wstore one = {.count = 1, .n = 64, .k = 64, .base = fake}; /* one slice for every segment */
  mt_wstore shared = one;
  shared.count = 4, shared.slice_bytes = 0;
  a.w = &shared, r.ws = &one;
  CHECK(mt_gemm_grouped(&a, NULL) == MT_ERR_UNSUPPORTED);
  r.offs = NULL;
  CHECK(mt_gemm_grouped(&a, NULL) == MT_ERR_NOMEM);
}

/* A refresh with a segment table keeps the covered slices' list in shared memory: past
 * MT_REFRESH_LIST_MAX slices it is refused before anything is asked of the driver (a store it
 * takes gets as far as loading its kernel, which fails here: no driver or no context). */
static void refresh_list_bound(void) {
  static _Alignas(256) unsigned char fake[256]; /* never touched */
  mt_refresh_args k = {.q = {.x = fake, .ldx = 64, .cols = 64, .batch_rows = 16, .store = fake},
                       .offs = (const int32_t *)fake,
                       .m = 1,
                       .step = 1,
                       .state = fake};
  k.q.rows = MT_REFRESH_LIST_MAX * 16;
  int st = mt_quantize_refresh(&k, 0, NULL);
  CHECKF(st != MT_ERR_UNSUPPORTED && st != MT_OK, "%s", mt_status_name((enum mt_status)st));
  k.q.rows += 16;
  CHECK(mt_quantize_refresh(&k, 0, NULL) == MT_ERR_UNSUPPORTED);
  k.offs = NULL; /* every slice: no list */
  st = mt_quantize_refresh(&k, 0, NULL);
  CHECKF(st != MT_ERR_UNSUPPORTED && st != MT_OK, "%s", mt_status_name((enum mt_status)st));
}

/* Sizes whose tile counts or row counts would overflow an int are refused, before any launch. */
static void sizes_past_an_int_refused(void) {
  static _Alignas(256) unsigned char fake[256]; /* never touched */
  const mt_numerics num = {MT_SCALE_ROW, MT_SCALE_TENSOR, MT_WBLOCK_1X16};
  CHECK(mt_wstore_bytes(128, 1536, 2048, &num) > 0);
  CHECK(mt_wstore_bytes(70000, 40000, 64, &num) == 0); /* 2.8e9 rows */
  mt_qweight w = {.n = 64, .k = 64, .num = num, .xhat = (uint16_t *)fake};
  mt_gemm_args a = {.m = MT_GEMM_DIM_MAX + 1,
                    .n = 64,
                    .k = 64,
                    .x = fake,
                    .ldx = 64,
                    .w = &w,
                    .y = fake,
                    .ldy = 64,
                    .workspace = fake,
                    .workspace_bytes = 256};
  CHECK(mt_gemm(&a, NULL) == MT_ERR_UNSUPPORTED);
  mt_wstore s = {.count = 1, .n = MT_GEMM_DIM_MAX + 1, .k = 64, .num = num, .base = fake};
  mt_grouped_args g = {.m = 16,
                       .n = s.n,
                       .k = 64,
                       .nseg = 1,
                       .seg_rows = 16,
                       .w = &s,
                       .x = fake,
                       .ldx = 64,
                       .y = fake,
                       .ldy = (size_t)s.n};
  CHECK(mt_gemm_grouped(&g, NULL) == MT_ERR_UNSUPPORTED);
}

int main(void) {
  RUN(auto_path_on_the_benchmark_shapes);
  RUN(auto_path_edges);
  RUN(fragment_copy_only_where_used);
  RUN(kept_form_under_0_6_bytes);
  RUN(large_tiles_on_the_benchmark_shapes);
  RUN(kpair_where_the_loop_outlasts_the_ring);
  RUN(large_tiles_exist);
  RUN(refresh_clusters_on_the_benchmark_shapes);
  RUN(forced_paths_refused);
  RUN(grouped_refresh_tables);
  RUN(refresh_list_bound);
  RUN(sizes_past_an_int_refused);
  return mt_test_done();
}
