// probe_phases.cu — where the microseconds of a small-M GEMM call go (kernels/NOTES.md, "What
// bounds the misses").
//
// scripts/probe_chain.cu timed the k16 step loop alone (53 cycles a step for the default kernel's
// loop, 27 for the bare MMA chain); the kernels take several microseconds more than their loop.
// This probe runs the real kernels (kernels/gemm_small.cu, included here with its phase marks
// switched on) on the benchmark's shapes at M = 1, weights rotated over 64 experts so that they
// come from HBM, and records per CTA the global time at each mark:
//   0 entry, 1 after griddepcontrol.wait, 2 activations quantized (fused kernel only), 3 first
//   weight chunk in shared memory, 4 last k16 step done, 5 outputs stored.
// It prints, over CTAs and launches (medians; "last" the slowest CTA, median over launches), each
// mark's time from the first CTA's entry, and the kernel's time per launch from CUDA events around
// a graph of 64 launches, so launch cost = per-launch time - in-kernel span.
//
// Build and run on the H200 (scripts/gpu_session.sh probe):
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I. -o build/probe_phases scripts/probe_phases.cu
#include <cstdint>

constexpr int MAXCTAS = 1024, MARKS = 6;
__device__ unsigned long long g_marks[MAXCTAS][MARKS];

__device__ __forceinline__ void probe_mark(int i) {
  if (threadIdx.x == 0) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    g_marks[blockIdx.x][i] = t;
  }
}
#define MT_SMALL_MARK(i) probe_mark(i)
#include "kernels/gemm_small.cu"
#include "kernels/engine.h"

#include "scripts/probe.cuh"

#include <cstring>
#include <vector>


constexpr int EXPERTS = 64, LAUNCHES = 40, WARMUP = 8;

struct shape {
  const char *name;
  int n, k;
};

struct setup {
  std::vector<uint8_t *> frag;
  uint16_t *x;
  float *s;
  uint16_t *y;
};

// Random weights in fragment order (the values do not matter for time; the scale words are BF16
// in [1, 2) so that nothing is NaN), random BF16 activations in [0.5, 2), S = 1.
static setup make_setup(const shape &sh) {
  setup s;
  size_t bytes = MT_FRAG_BYTES(sh.n, sh.k);
  std::vector<uint8_t> h(bytes);
  for (size_t i = 0; i < bytes; i++)
    h[i] = (uint8_t)rand();
  for (size_t r = 0; r + MT_FRAG_REC <= bytes; r += MT_FRAG_REC)
    for (int i = 128; i < MT_FRAG_REC; i += 2)
      h[r + i] = (uint8_t)rand(), h[r + i + 1] = 0x3f;
  for (int e = 0; e < EXPERTS; e++) {
    uint8_t *d;
    CK(cudaMalloc(&d, bytes + 256));
    CK(cudaMemcpy(d, h.data(), bytes, cudaMemcpyHostToDevice));
    s.frag.push_back(d);
  }
  std::vector<uint16_t> hx((size_t)8 * sh.k);
  for (auto &v : hx)
    v = (uint16_t)(0x3f00 + rand() % 0x100);
  CK(cudaMalloc(&s.x, hx.size() * 2));
  CK(cudaMemcpy(s.x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
  std::vector<float> ones(8, 1.0f);
  CK(cudaMalloc(&s.s, 8 * sizeof(float)));
  CK(cudaMemcpy(s.s, ones.data(), 8 * sizeof(float), cudaMemcpyHostToDevice));
  CK(cudaMalloc(&s.y, (size_t)8 * sh.n * 2));
  return s;
}

static mt_small_args args_for(const shape &sh, const setup &s, int e, bool fused) {
  mt_small_args a;
  memset(&a, 0, sizeof a);
  a.frag = s.frag[e % EXPERTS];
  a.e.m = 1, a.e.n = sh.n, a.e.k = sh.k;
  a.e.sa = s.s, a.e.sw = s.s, a.e.sa_row = 1, a.e.sw_row = 0;
  a.e.y = s.y, a.e.ldy = sh.n, a.e.ytype = MT_DTYPE_BF16, a.e.biastype = MT_DTYPE_BF16;
  a.e.alpha = 1.0f, a.e.beta = 0.0f;
  if (fused)
    a.x = s.x, a.ldx = sh.k;
  else
    a.xa = s.x;
  return a;
}

static void launch(bool fused, unsigned grid, const mt_small_args &a, cudaStream_t st) {
  if (fused)
    mt_gemm_small_q4<<<grid, 32 * MT_SMALL_WARPS, MT_SMALL_FUSE_SMEM, st>>>(a);
  else
    mt_gemm_small_m8<<<grid, 32 * MT_SMALL_WARPS, MT_SMALL_SMEM, st>>>(a);
}

// In-kernel phases: LAUNCHES single launches (each synchronised, marks read back).
static void phases(const shape &sh, const setup &s, bool fused) {
  unsigned grid = (unsigned)(sh.n / (8 * MT_SMALL_WARPS));
  std::vector<double> at[MARKS], last_end;
  std::vector<unsigned long long> m((size_t)grid * MARKS);
  void *marks;
  CK(cudaGetSymbolAddress(&marks, g_marks));
  for (int l = 0; l < LAUNCHES; l++) {
    CK(cudaMemset(marks, 0, sizeof(unsigned long long) * MAXCTAS * MARKS));
    launch(fused, grid, args_for(sh, s, l, fused), 0);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpyFromSymbol(m.data(), g_marks, m.size() * sizeof m[0]));
    if (l < WARMUP)
      continue;
    unsigned long long t0 = ~0ull, tend = 0;
    for (unsigned c = 0; c < grid; c++)
      t0 = std::min(t0, m[c * MARKS]), tend = std::max(tend, m[c * MARKS + 5]);
    for (unsigned c = 0; c < grid; c++)
      for (int i = 0; i < MARKS; i++)
        if (m[c * MARKS + i])
          at[i].push_back((double)(m[c * MARKS + i] - t0) * 1e-3);
    last_end.push_back((double)(tend - t0) * 1e-3);
  }
  printf("%-14s %-6s grid %4u | µs from the first entry, median over CTAs: entry %5.2f  wait %5.2f  quant %5.2f  "
         "chunk0 %5.2f  steps done %5.2f  stored %5.2f | last CTA stored %5.2f\n",
         sh.name, fused ? "q4" : "m8", grid, median(at[0]), median(at[1]), median(at[2]), median(at[3]),
         median(at[4]), median(at[5]), median(last_end));
}

// Time per launch in a graph of 64 launches over 64 experts, median of 5 replays.
static void per_launch(const shape &sh, const setup &s, bool fused) {
  unsigned grid = (unsigned)(sh.n / (8 * MT_SMALL_WARPS));
  double us = graph_us_per_launch(EXPERTS, [&](cudaStream_t st, int l) {
    launch(fused, grid, args_for(sh, s, l, fused), st);
  });
  printf("%-14s %-6s grid %4u | %5.2f µs a launch (graph of %d, median of 5)\n", sh.name, fused ? "q4" : "m8", grid,
         us, EXPERTS);
}

int main() {
  srand(11);
  const shape shapes[] = {{"qwen3_gate_up", 1536, 2048}, {"qwen3_down", 2048, 768}, {"dsv3_down", 7168, 2048}};
  CK(cudaFuncSetAttribute(mt_gemm_small_q4, cudaFuncAttributeMaxDynamicSharedMemorySize, MT_SMALL_FUSE_SMEM));
  CK(cudaFuncSetAttribute(mt_gemm_small_m8, cudaFuncAttributeMaxDynamicSharedMemorySize, MT_SMALL_SMEM));
  for (const shape &sh : shapes) {
    setup s = make_setup(sh);
    for (bool fused : {true, false}) {
      phases(sh, s, fused);
      per_launch(sh, s, fused);
    }
  }
  return 0;
}
