/* test_gemm_paths.c — AUTO's choice of GEMM path (kernels/gemm.c: mt_gemm_auto_path) on the
 * benchmark shapes, against the choices make bench's path table measured best on the H200
 * (kernels/NOTES.md, sixth session), and the refusals of a forced path that cannot take a call.
 * No GPU: the choice is host code, and the refusals come before any launch. */
#include <stdio.h>
#include <string.h>

#include "kernels/engine.h"
#include "kernels/gemm.h"
#include "tests/harness.h"

enum { F = MT_PATH_FUSED, S = MT_PATH_SMALL, L = MT_PATH_LARGE };

/* The best path at M = 1..8 on 132 SMs, and where it is not the measured best, why. */
static const struct {
  const char *name;
  int n, k;
  int want[8];
} shapes[] = {
    {"qwen3 gate_up", 1536, 2048, {F, S, S, S, S, S, S, S}}, /* M = 2: small 8.84 fused 8.90 */
    {"qwen3 down", 2048, 768, {F, F, S, S, S, S, S, S}},
    /* M = 1: the small kernel 22.28 against 22.83, given up for one weight-size threshold */
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
  for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) /* past 8 tokens: the large path */
    CHECK(mt_gemm_auto_path(9, shapes[s].n, shapes[s].k, 1, 132) == L);
}

/* Without the packed weight (n % 16 != 0) every call takes the large path; fewer SMs mean more
 * waves of the fused kernel's CTAs, so fewer tokens fused (down: 128 CTAs on 64 SMs are 2 waves). */
static void auto_path_edges(void) {
  CHECK(mt_gemm_auto_path(1, 1536, 2048, 0, 132) == L);
  CHECK(mt_gemm_auto_path(2, 2048, 768, 1, 132) == F);
  CHECK(mt_gemm_auto_path(2, 2048, 768, 1, 64) == S);
  CHECK(mt_gemm_auto_path(1, 2048, 768, 1, 64) == F);
  /* rows that do not fit the fused kernel's shared memory: k = 16384 holds 1 row, 16400 none */
  CHECK(mt_gemm_auto_path(1, 16, 16384, 1, 132) == S);
  CHECK(mt_gemm_auto_path(1, 16, 128, 1, 132) == F);
}

/* The small kernels' copy of the weight exists only where AUTO can use it. */
static void fragment_copy_only_where_used(void) {
  CHECK(mt_gemm_frag_bytes(1536, 2048) == (size_t)1536 * 2048 * 5 / 8);
  CHECK(mt_gemm_frag_bytes(2048, 768) > 0);
  CHECK(mt_gemm_frag_bytes(2048, 2048) > 0); /* 2^22 elements: the limit */
  CHECK(mt_gemm_frag_bytes(2048, 2064) == 0);
  CHECK(mt_gemm_frag_bytes(4096, 7168) == 0 && mt_gemm_frag_bytes(7168, 2048) == 0);
  CHECK(mt_gemm_frag_bytes(271, 256) == 0); /* n % 16 */
  mt_numerics num = {MT_SCALE_ROW, MT_SCALE_TENSOR, MT_WBLOCK_1X16};
  CHECK(mt_qweight_bytes(7168, 2048, &num) < (size_t)7168 * 2048 * 2 * 13 / 10); /* ~2.56 B an element */
  CHECK(mt_qweight_bytes(1536, 2048, &num) > (size_t)1536 * 2048 * 3);           /* ~3.19 */
}

/* A forced path past its rows or without the packed weight is refused before anything runs. */
static void forced_paths_refused(void) {
  static _Alignas(256) unsigned char fake[256]; /* never touched */
  mt_qweight w = {.n = 64, .k = 64, .xhat = (uint16_t *)fake, .frag = fake};
  mt_gemm_args a = {.m = 5, .n = 64, .k = 64, .w = &w, .path = MT_PATH_FUSED};
  CHECK(mt_gemm_path_of(&a) == -1);
  a.m = 4;
  CHECK(mt_gemm_path_of(&a) == MT_PATH_FUSED);
  a.path = MT_PATH_SMALL, a.m = 9;
  CHECK(mt_gemm_path_of(&a) == -1);
  a.m = 8;
  CHECK(mt_gemm_path_of(&a) == MT_PATH_SMALL);
  w.frag = NULL;
  CHECK(mt_gemm_path_of(&a) == -1);
  a.path = MT_PATH_LARGE;
  CHECK(mt_gemm_path_of(&a) == MT_PATH_LARGE);
  a.path = (enum mt_gemm_path)9;
  CHECK(mt_gemm_path_of(&a) == -1);
}

int main(void) {
  RUN(auto_path_on_the_benchmark_shapes);
  RUN(auto_path_edges);
  RUN(fragment_copy_only_where_used);
  RUN(forced_paths_refused);
  return mt_test_done();
}
