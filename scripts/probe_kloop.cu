// probe_kloop.cu — where a stage of the 64-token tiles goes at a few tokens (kernels/NOTES.md,
// eighth session).
//
// With one 64-wide K block a stage the large path spent ~135 ns a block at M <= 64 (gate_up and
// down at M = 16: 7.00 and 4.22 µs for 32 and 12 blocks) whatever the tile width (16-64), the SMs
// at work (48 or 96), the stages (16 or 32) and whether the weights came from HBM or L2 (6.55 µs
// hot); the same wgmma groups alone (scripts/probe_wgchain.cu) take 100 cycles a block. This runs
// the real kernel (kernels/gemm_large.cu, included with its marks switched on: clock64 of the
// consumer's first thread before and after each stage's "full" wait and after the previous group
// completed, and of the producer before and after each "empty" wait) on gate_up and down at M = 1,
// 16 and 64, weights rotated over EXPERTS matrices (from HBM) or one (from L2), and prints per launch
// the µs (a graph of EXPERTS launches), and over stages and CTAs (medians) the cycles of a stage,
// of the consumer's wait for data, of its issue and wait for the group before, and of the
// producer's wait for a free stage. If the consumer waits for data, the feed binds; if the stage's
// time is in the issue and group wait, the tensor cores' side does; what is in neither is the
// consumer's own hand-over (its release of the stage and the loop).
// Ninth session: a second line per row splits the first tile into phases (slot 5: the consumer's
// entry, its K loop done, its tile's stores issued; clock64 and globaltimer), since call 2's rows
// put ~3.5 µs of each launch outside the K loop (gate_up M = 16 6.42 µs a launch against a loop of
// 5176 cycles, ~3.0 µs; down 4.29 against 1430, ~0.8). Tenth session: M = 1 rows, and mark 3 (the
// epilogue's wait for scales loaded during the loop); results in kernels/NOTES.md.
//
// Build and run on the H200 (scripts/gpu_session.sh probe; PROBES=kloop):
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I. -o build/probe_kloop scripts/probe_kloop.cu -lcuda
#include <cstdint>

constexpr int MAXCTAS = 132, MAXKB = 128, SLOTS = 6;
__device__ long long g_marks[MAXCTAS][SLOTS][MAXKB];
// slot 5's marks in global time (ns): gemm_large.cu's list (4-6 the producer's, by thread 0)
__device__ unsigned long long g_ns[MAXCTAS][8];

// slots 0-2 and 5 by the consumer's first thread (128), 3-4 by the producer (0): gemm_large.cu
__device__ __forceinline__ void probe_mark(int slot, int i) {
  const bool mine = slot == 5 ? threadIdx.x == (i >= 4 && i <= 6 ? 0 : 128) : (threadIdx.x == 0 || threadIdx.x == 128);
  if (mine && i < MAXKB && blockIdx.x < MAXCTAS) {
    g_marks[blockIdx.x][slot][i] = clock64();
    if (slot == 5) {
      unsigned long long t;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
      if (i < 8)
        g_ns[blockIdx.x][i] = t;
    }
  }
}
#define MT_LARGE_MARK(slot, i) probe_mark(slot, i)
#include "kernels/gemm_large.cu"

#include <cuda_runtime.h>

#include <cstring>
#include <vector>

#include "scripts/probe.cuh"
#include "scripts/probe_tma.cuh"

constexpr int EXPERTS = 32, BN = 32;

struct shape {
  const char *name;
  int n, k;
};

static void row(const shape &sh, int m, int experts, const std::vector<uint16_t *> &w, const uint16_t *x, float *ones,
                uint16_t *y) {
  const int kt = sh.k / 64, tiles_n = sh.n / BN, grid = std::min(tiles_n * ((m + 63) / 64), MAXCTAS);
  const int last = m - (m - 1) / 64 * 64, last_rows = (last + 7) / 8 * 8;
  // as kernels/gemm.c (mt_gemm_kpair): rank-3 maps and the kernel that loads a stage and operand a box
  const bool pair = MT_LARGE_KPAIR_64(sh.k, BN);
  void (*kernel)(mt_large_args) = pair ? mt_gemm_large_m64p_n32 : mt_gemm_large_m64_n32;
  std::vector<mt_large_args> args(experts);
  for (int e = 0; e < experts; e++) {
    mt_large_args &a = args[e];
    memset(&a, 0, sizeof a);
    a.ta_last = tensor_map(x, m, sh.k, last_rows, pair);
    a.ta = m > 64 ? tensor_map(x, m, sh.k, 64, pair) : a.ta_last;
    a.tw = tensor_map(w[e], sh.n, sh.k, BN, pair);
    a.last_rows = last_rows;
    a.e = {m, sh.n, sh.k, ones, ones, 1, 0, y, sh.n, nullptr, 0, nullptr, 0, 0, 1.0f, 0.0f};
  }
  const int smem = MT_LARGE_SMEM_64(BN);
  CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  static const unsigned long long zero[MAXCTAS][8] = {};
  CK(cudaMemcpyToSymbol(g_ns, zero, sizeof zero)); // mark 3 stays 0 where the kernel has none
  double us = graph_us_per_launch(EXPERTS, [&](cudaStream_t st, int l) {
    kernel<<<grid, 256, smem, st>>>(args[l % experts]);
  });
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  static long long h[MAXCTAS][SLOTS][MAXKB];
  static unsigned long long ns[MAXCTAS][8];
  CK(cudaMemcpyFromSymbol(h, g_marks, sizeof h));
  CK(cudaMemcpyFromSymbol(ns, g_ns, sizeof ns));
  // per CTA and stage (the last launch of the graph): the stage's period (from one "full" to the
  // next), the consumer's wait for it, its issue and wait for the previous group, and the
  // producer's wait for a free stage (stages past the first ring's worth)
  std::vector<double> period, wait_full, issue, wait_empty, span, first, loop_ns, epilogue, scales, inside, ghz;
  std::vector<double> pro[4]; // from the consumer's entry: past the barrier, producer start, W issued, A issued
  const int S = MT_LARGE_STAGES_64(BN), n = std::min((kt + MT_LARGE_KS_64 - 1) / MT_LARGE_KS_64, MAXKB);
  for (int c = 0; c < grid; c++) {
    for (int kb = 0; kb < n; kb++) {
      wait_full.push_back((double)(h[c][1][kb] - h[c][0][kb]));
      issue.push_back((double)(h[c][2][kb] - h[c][1][kb]));
      if (kb + 1 < n)
        period.push_back((double)(h[c][1][kb + 1] - h[c][1][kb]));
      if (kb >= S)
        wait_empty.push_back((double)(h[c][4][kb] - h[c][3][kb]));
    }
    span.push_back((double)(h[c][2][n - 1] - h[c][1][0]));
    // the first tile's phases, ns: entry to the first stage full, the K loop, the epilogue
    const double c_ns = (double)(h[c][5][2] - h[c][5][0]) / (double)(ns[c][2] - ns[c][0]);
    first.push_back((double)(h[c][1][0] - h[c][5][0]) / c_ns);
    const int pm[4] = {7, 4, 5, 6};
    for (int i = 0; i < 4; i++)
      pro[i].push_back((double)(h[c][5][pm[i]] - h[c][5][0]) / c_ns);
    loop_ns.push_back((double)(h[c][5][1] - h[c][1][0]) / c_ns);
    epilogue.push_back((double)(ns[c][2] - ns[c][1]));
    if (ns[c][3])
      scales.push_back((double)(ns[c][3] - ns[c][1]));
    inside.push_back((double)(ns[c][2] - ns[c][0]));
    ghz.push_back(c_ns);
  }
  printf("%-14s M %3d  experts %2d  grid %3d  %6.2f us a launch | cycles: loop %6.0f, a stage %5.0f, wait for data "
         "%5.0f, issue + group %4.0f, producer's wait for a stage %5.0f (medians; %d stages of %d K blocks, a ring "
         "of %d)\n",
         sh.name, m, experts, grid, us, median(span), median(period), median(wait_full), median(issue),
         median(wait_empty), n, MT_LARGE_KS_64, S);
  printf("%-14s M %3d  experts %2d  phases, ns (medians over CTAs): entry to the first stage full %5.0f, K loop "
         "%5.0f, epilogue issued %4.0f (of which the wait for its scales %4.0f), in the kernel %5.0f of %5.0f a "
         "launch (SM clock %.2f GHz)\n",
         sh.name, m, experts, median(first), median(loop_ns), median(epilogue), median(scales),
         median(inside), us * 1e3, median(ghz));
  printf("%-14s M %3d  experts %2d  prologue, ns from the consumer's entry (medians over CTAs): past the CTA's "
         "barrier %4.0f, producer's start %4.0f, its first weight loads issued %4.0f, activation loads issued %4.0f, "
         "first stage full %5.0f\n",
         sh.name, m, experts, median(pro[0]), median(pro[1]), median(pro[2]), median(pro[3]), median(first));
}

int main() {
  const shape shapes[] = {{"qwen3_gate_up", 1536, 2048}, {"qwen3_down", 2048, 768}};
  float *ones;
  uint16_t *x = random_bf16(64 * 2048), *y;
  CK(cudaMalloc(&ones, 256 * sizeof(float)));
  std::vector<float> h_ones(256, 1.0f);
  CK(cudaMemcpy(ones, h_ones.data(), 256 * sizeof(float), cudaMemcpyHostToDevice));
  CK(cudaMalloc(&y, 64 * 2048 * 2));
  for (const shape &sh : shapes) {
    std::vector<uint16_t *> w(EXPERTS);
    for (auto &p : w)
      p = random_bf16((size_t)sh.n * sh.k);
    for (int m : {1, 16, 64})
      for (int experts : {EXPERTS, 1})
        row(sh, m, experts, w, x, ones, y);
    for (auto p : w)
      CK(cudaFree(p));
  }
  return 0;
}
