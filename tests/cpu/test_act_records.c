/* test_act_records.c — the workspace accounting of the large-M ra kernel (MT_LARGE_VARIANT=ra,
 * kernels/gemm.c): under it the engine's workspace must hold the activations as 5-bit records
 * (kernels/gemm_args.h, MT_ACT_REC_BYTES: whole bands of 128 tokens and whole 64-column steps,
 * which at few tokens exceed the BF16 copy) before S; by default (and under =v6) the section is
 * the BF16 copy. The knob is read once per process, so each setting runs in a child with the
 * variable set. The GPU side (records bit for bit, GEMM bits under every setting) is
 * tests/gpu/test_kernels.c's. */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/engine.h"
#include "kernels/gemm.h"
#include "kernels/gemm_args.h"
#include "tests/harness.h"

static const int shapes[][2] = {{1, 16},    {17, 2048},   {40, 2048},  {64, 768},
                                {129, 160}, {4096, 2048}, {4133, 7168}};
#define NSHAPES ((int)(sizeof shapes / sizeof shapes[0]))

static size_t round256(size_t v) { return (v + 255) / 256 * 256; }

/* Whether the workspace for m x k holds `act` bytes of activations, then S (per row: m floats). */
static int holds(int m, int k, size_t act) {
  static const mt_numerics num = {MT_SCALE_ROW, MT_SCALE_TENSOR, MT_WBLOCK_1X16};
  return mt_gemm_workspace_bytes(m, k, &num) >= round256(act) + (size_t)m * 4;
}

/* Without ra: the activations' section is the BF16 copy. */
static void xhat_layout(void) {
  for (int i = 0; i < NSHAPES; i++) {
    int m = shapes[i][0], k = shapes[i][1];
    CHECKF(mt_gemm_act_bytes(m, k) == (size_t)m * k * 2, "m=%d k=%d: %zu", m, k,
           mt_gemm_act_bytes(m, k));
    CHECK(holds(m, k, (size_t)m * k * 2));
  }
}

/* ra: the section holds the larger of the two layouts (xhat where its kernel does not run). */
static void ra_layout_fits(void) {
  for (int i = 0; i < NSHAPES; i++) {
    int m = shapes[i][0], k = shapes[i][1];
    size_t xhat = (size_t)m * k * 2, rec = MT_ACT_REC_BYTES(m, k);
    CHECKF(mt_gemm_act_bytes(m, k) == (rec > xhat ? rec : xhat),
           "m=%d k=%d: %zu (records %zu, xhat %zu)", m, k, mt_gemm_act_bytes(m, k), rec, xhat);
    CHECK(holds(m, k, rec) && holds(m, k, xhat));
  }
  /* one stage of the ra kernel (128 tokens x 64 columns) is one band's two column pairs */
  CHECK(MT_ACT_REC_BYTES(128, 64) == MT_LARGE_RA_A_BYTES &&
        MT_ACT_REC_BYTES(1, 1) == MT_LARGE_RA_A_BYTES);
  CHECK(MT_ACT_REC_BYTES(129, 65) == 4 * MT_LARGE_RA_A_BYTES);
}

/* fn in a child that sets MT_LARGE_VARIANT (or unsets it) before any knob is read; its checks
 * print there, its status comes back here. */
static void in_child(const char *variant, void (*fn)(void)) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    if (variant)
      setenv("MT_LARGE_VARIANT", variant, 1);
    else
      unsetenv("MT_LARGE_VARIANT");
    fn();
    fflush(stdout);
    _exit(mt_t_cur_failures ? 1 : 0);
  }
  int status = 0;
  CHECK(pid > 0 && waitpid(pid, &status, 0) == pid);
  CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: the child's checks failed (status %d)",
         variant ? variant : "default", status);
}

static void ra_variant(void) { in_child("ra", ra_layout_fits); }
static void default_keeps_xhat(void) { in_child(NULL, xhat_layout); }
static void v6_keeps_xhat(void) { in_child("v6", xhat_layout); }

int main(void) {
  RUN(ra_variant);
  RUN(default_keeps_xhat);
  RUN(v6_keeps_xhat);
  return mt_test_done();
}
