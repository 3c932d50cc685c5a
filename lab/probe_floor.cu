// probe_floor.cu — the fastest a few-token call can be on this GPU under the spec's rules,
// measured: what the decode target (3x faster than cuBLAS BF16 at M <= 16) is up against.
//
// Batch invariance (docs/numerics.md, "Batch invariance") forbids split-K, so every output of a
// call is one chain of K / 16 dependent k16 MMAs into one FP32 accumulator, and every call is a
// kernel launch whose activations come from the launch before it. An ideal kernel does nothing
// else: each CTA (one warpgroup for 32 channels, as the 64-token tiles) requests its first weights
// from HBM as it starts, waits for the grid before it (griddepcontrol.wait), fetches its
// activations (one box of 8 token rows, from L2), runs the chain on them and stores. It streams no
// more weights (at M = 1 the NVFP4 bytes take less time than the chain on every shape but DeepSeek
// 7168x2048, whose bytes floor the table prints beside), quantizes nothing and has no epilogue, so
// it is a lower bound for the GEMM alone, and a routed call (quantization + GEMM) costs at least as
// much.
//
// Rows, per launch in a CUDA graph of 128 launches with the weights rotated over 128 experts (the
// method of make bench), each with and without programmatic dependent launch (PDL: every launch
// lets the next one start at once, so the next one's launch and weight requests overlap it; its
// wait still waits for this one to end): "launch" (a store only), "loads" (the weights before the
// wait, the activations after), "chain" (the K / 16 wgmma m64n32k16 steps, groups of 8 with one in
// flight, as the 64-token tiles issue them, on shared memory whose values do not matter for time:
// lab/probe_wgchain.cu, zeros and random alike), "floor" (all of it). cuBLAS BF16
// (cublasGemmEx TN, as bench/bench_kernels.c) at M = 1 and 16 in the same run. A floor above
// cuBLAS / 3 means no kernel that keeps the rules reaches the target on that shape.
// Then, since the large path's first full stage comes ~1 µs after its weights are requested even
// with them in L2 (probe_kloop's prologue line, lab/NOTES.md), the latency of a CTA's first weight
// load by kind: a plain bulk copy (as above), a TMA box through a tensor map passed as a
// __grid_constant__ parameter (as the kernels do: its descriptor is new memory every launch), and
// through a tensor map kept in global memory (one per expert, written once: L2-hot); globaltimer
// around the request and its mbarrier wait in each CTA's first thread, medians over CTAs.
//
// Measured (lab/NOTES.md, "Floors and what bounds a few-token call"): floors of
// 3.2 / 2.3 / 7.9 / 5.7 µs at gate_up, down and DeepSeek's two shapes, 1.2-1.9x the time 3x of
// cuBLAS allows at M <= 16; a first load of 4 KB lands in ~0.26-0.6 µs by bulk copy and ~0.3 µs
// later through a tensor map.
//
// Build and run on the H200 (tests/gpu/session.sh probe; PROBES=floor):
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I. -o build/probe_floor
//       lab/probe_floor.cu -lcuda -lcublas
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "kernels/gemm_common.cuh"
#include "kernels/wgmma.cuh"
#include "lab/probe.cuh"
#include "lab/probe_tma.cuh"

constexpr int EXPERTS = 128, BN = 32;
constexpr int A_SMEM = 64 * 128,
              B_SMEM = BN * 128; // one 64-wide K block: 64 token rows, BN channels
constexpr int A_BYTES = 8 * 128, W_BYTES = B_SMEM; // what is loaded: 8 token rows, the BN channels
constexpr int SMEM = 1024 + A_SMEM + B_SMEM;
enum { LAUNCH, LOADS, CHAIN, FLOOR };
static const char *const mode_names[] = {"launch", "loads", "chain", "floor"};

template <int MODE>
__global__ void __launch_bounds__(128)
    ideal(const uint8_t *w, size_t w_cta, const uint8_t *x, int steps, float *y) {
  constexpr bool LOAD = MODE == LOADS || MODE == FLOOR, MMA = MODE == CHAIN || MODE == FLOOR;
  extern __shared__ uint8_t smem_raw[];
  uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  __shared__ uint64_t bar[2]; // weights, activations
  if (LOAD && threadIdx.x == 0) {
    mbar_init(&bar[0], 1);
    mbar_init(&bar[1], 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    mbar_arrive_expect_tx(&bar[0], W_BYTES);
    bulk_load(smem + A_SMEM, w + blockIdx.x * w_cta, W_BYTES, &bar[0]);
  }
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  grid_dependency_wait();
  if (LOAD && threadIdx.x == 0) {
    mbar_arrive_expect_tx(&bar[1], A_BYTES);
    bulk_load(smem, x, A_BYTES, &bar[1]);
  }
  if (LOAD) {
    __syncthreads(); // the barriers' init, before anyone waits on them
    mbar_wait(&bar[0], 0);
    mbar_wait(&bar[1], 0);
  }
  float d[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; i++)
    d[i] = 0.0f;
  if (MMA) {
    const uint64_t da = desc_sw128(smem_u32(smem)), db = desc_sw128(smem_u32(smem) + A_SMEM);
#pragma unroll 1 // unrolled, ptxas serializes the groups (C7515)
    for (int s = 0; s < steps; s += 8) {
      asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
      for (int kk = 0; kk < 8; kk++)
        mt_wgmma_m64n32k16(d, da + 2 * (kk % 4), db + 2 * (kk % 4));
      asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 1;\n" ::
                       : "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  }
  y[blockIdx.x * 128 + threadIdx.x] = d[0] + d[BN / 2 - 1];
}

enum { BULK, TMAP_PARAM, TMAP_GLOBAL, TMAP_SECOND, KINDS };
static const char *const kind_names[] = {"bulk copy", "TMA, map a parameter",
                                         "TMA, map in global memory",
                                         "TMA, map a parameter, its second load"};

// ns from a CTA's first weight request to its data in shared memory (KIND above), into lat;
// TMAP_SECOND times the CTA's second box through the same map (the next 64 columns), the first
// one landed: if it takes what a bulk copy does, the extra of a first tensor-map load is the
// descriptor's fetch (not yet run)
template <int KIND>
__global__ void __launch_bounds__(128)
    first_load(const uint8_t *w, size_t w_cta, const __grid_constant__ CUtensorMap tw,
               const CUtensorMap *tw_global, unsigned long long *lat) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  __shared__ uint64_t bar;
  if (threadIdx.x != 0)
    return;
  mbar_init(&bar, 1);
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  int phase = 0;
  if (KIND == TMAP_SECOND) {
    mbar_arrive_expect_tx(&bar, W_BYTES);
    tma_load_2d(smem, &tw, &bar, 0, blockIdx.x * BN);
    mbar_wait(&bar, phase++);
  }
  unsigned long long t0, t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0)::"memory");
  mbar_arrive_expect_tx(&bar, W_BYTES);
  if (KIND == BULK)
    bulk_load(smem, w + blockIdx.x * w_cta, W_BYTES, &bar);
  else
    tma_load_2d(smem, KIND == TMAP_GLOBAL ? tw_global : &tw, &bar, KIND == TMAP_SECOND ? 64 : 0,
                blockIdx.x * BN);
  mbar_wait(&bar, phase);
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1)::"memory");
  lat[blockIdx.x] = t1 - t0;
}

struct shape {
  const char *name;
  int n, k;
};

// µs a launch of ideal<MODE> on sh, weights of expert l % EXPERTS, with or without PDL
template <int MODE>
static double time_ideal(const shape &sh, uint16_t *const *w, const uint16_t *x, float *y,
                         bool pdl) {
  const int grid = sh.n / BN;
  CK(cudaFuncSetAttribute(ideal<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = pdl;
  return graph_us_per_launch(EXPERTS, [&](cudaStream_t st, int l) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = 128;
    cfg.dynamicSmemBytes = SMEM;
    cfg.stream = st;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    // each CTA's first bytes are its own channels' (rows of K BF16)
    CK(cudaLaunchKernelEx(&cfg, ideal<MODE>, (const uint8_t *)w[l % EXPERTS], (size_t)BN * sh.k * 2,
                          (const uint8_t *)x, sh.k / 16, y));
  });
}

static double time_cublas(cublasHandle_t blas, const shape &sh, int m, uint16_t *const *w,
                          const uint16_t *x, uint16_t *yb) {
  const float alpha = 1.0f, beta = 0.0f;
  auto call = [&](cudaStream_t st, int l) {
    cublasSetStream(blas, st);
    cublasStatus_t s = cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, sh.n, m, sh.k, &alpha,
                                    w[l % EXPERTS], CUDA_R_16BF, sh.k, x, CUDA_R_16BF, sh.k, &beta,
                                    yb, CUDA_R_16BF, sh.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
      printf("cublasGemmEx %s m=%d: status %d\n", sh.name, m, (int)s);
      exit(1);
    }
  };
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  call(st, 0); // outside capture first: cuBLAS picks and loads its kernel
  CK(cudaStreamSynchronize(st));
  CK(cudaStreamDestroy(st));
  return graph_us_per_launch(EXPERTS, call);
}

// per kind: µs a launch (graph of EXPERTS, no PDL) and the median first-load latency (last launch)
static void first_loads(const shape &sh, uint16_t *const *w, unsigned long long *lat) {
  static CUtensorMap maps[EXPERTS];
  CUtensorMap *dev_maps;
  for (int e = 0; e < EXPERTS; e++)
    maps[e] = tensor_map(w[e], sh.n, sh.k, BN);
  CK(cudaMalloc(&dev_maps, sizeof maps));
  CK(cudaMemcpy(dev_maps, maps, sizeof maps, cudaMemcpyHostToDevice));
  const int grid = sh.n / BN;
  void (*kernels[KINDS])(const uint8_t *, size_t, const CUtensorMap, const CUtensorMap *,
                         unsigned long long *) = {first_load<BULK>, first_load<TMAP_PARAM>,
                                                  first_load<TMAP_GLOBAL>, first_load<TMAP_SECOND>};
  printf("%-14s first weights (%d B a CTA, no PDL):", sh.name, W_BYTES);
  for (int kind = 0; kind < KINDS; kind++) {
    CK(cudaFuncSetAttribute(kernels[kind], cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    double us = graph_us_per_launch(EXPERTS, [&](cudaStream_t st, int l) {
      kernels[kind]<<<grid, 128, SMEM, st>>>((const uint8_t *)w[l % EXPERTS], (size_t)BN * sh.k * 2,
                                             maps[l % EXPERTS], dev_maps + l % EXPERTS, lat);
    });
    CK(cudaGetLastError());
    std::vector<unsigned long long> h(grid);
    CK(cudaMemcpy(h.data(), lat, grid * sizeof h[0], cudaMemcpyDeviceToHost));
    std::vector<double> ns(h.begin(), h.end());
    printf(" %s %5.0f ns (%4.2f us a launch);", kind_names[kind], median(ns), us);
  }
  printf("\n");
  CK(cudaFree(dev_maps));
}

int main() {
  const shape shapes[] = {{"qwen3_gate_up", 1536, 2048},
                          {"qwen3_down", 2048, 768},
                          {"ds_4096x7168", 4096, 7168},
                          {"ds_7168x2048", 7168, 2048}};
  cublasHandle_t blas;
  void *ws;
  if (cublasCreate(&blas) != CUBLAS_STATUS_SUCCESS) {
    printf("cublasCreate failed\n");
    return 1;
  }
  CK(cudaMalloc(&ws, 64 << 20));
  cublasSetWorkspace(blas, ws, 64 << 20); // so that capture never allocates
  uint16_t *x = random_bf16(16 * 7168), *yb;
  float *y;
  unsigned long long *lat;
  CK(cudaMalloc(&lat, 7168 / BN * sizeof *lat));
  CK(cudaMalloc(&yb, 16 * 7168 * 2));
  CK(cudaMalloc(&y, 7168 / BN * 128 * sizeof(float)));
  int clock_khz;
  CK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  printf("ideal kernel: %d threads a CTA, one per %d channels; us a launch, graphs of %d launches "
         "over %d experts, "
         "median of 5 replays\n",
         128, BN, EXPERTS, EXPERTS);
  for (const shape &sh : shapes) {
    uint16_t *w[EXPERTS];
    const size_t elems = (size_t)sh.n * sh.k;
    w[0] = random_bf16(elems);
    for (int e = 1; e < EXPERTS; e++) {
      CK(cudaMalloc(&w[e], elems * 2));
      CK(cudaMemcpy(w[e], w[0], elems * 2, cudaMemcpyDeviceToDevice));
    }
    const double blas1 = time_cublas(blas, sh, 1, w, x, yb),
                 blas16 = time_cublas(blas, sh, 16, w, x, yb);
    double t[2][4];
    for (int pdl = 0; pdl < 2; pdl++) {
      t[pdl][LAUNCH] = time_ideal<LAUNCH>(sh, w, x, y, pdl);
      t[pdl][LOADS] = time_ideal<LOADS>(sh, w, x, y, pdl);
      t[pdl][CHAIN] = time_ideal<CHAIN>(sh, w, x, y, pdl);
      t[pdl][FLOOR] = time_ideal<FLOOR>(sh, w, x, y, pdl);
    }
    const double nvfp4_bytes = (double)sh.n * sh.k * 9 / 16; // e2m1 codes + one e4m3 scale per 16
    printf("%-14s %4dx%-4d %3d CTAs, %3d steps | cuBLAS M=1 %6.2f, M=16 %6.2f; target (cuBLAS / 3) "
           "%5.2f, %5.2f | "
           "NVFP4 weights at 3.85 TB/s %5.2f\n",
           sh.name, sh.n, sh.k, sh.n / BN, sh.k / 16, blas1, blas16, blas1 / 3, blas16 / 3,
           nvfp4_bytes / 3.85e6);
    for (int pdl = 0; pdl < 2; pdl++) {
      printf("%-14s %-6s", sh.name, pdl ? "PDL" : "no PDL");
      for (int md = 0; md < 4; md++)
        printf(" %s %6.2f", mode_names[md], t[pdl][md]);
      printf(" | floor / target: M=1 %.2f, M=16 %.2f\n", t[pdl][FLOOR] / (blas1 / 3),
             t[pdl][FLOOR] / (blas16 / 3));
    }
    first_loads(sh, w, lat);
    for (int e = 0; e < EXPERTS; e++)
      CK(cudaFree(w[e]));
  }
  printf("(device clock attribute %.2f GHz; the chain's steps run at the SM clock of the moment)\n",
         clock_khz / 1e6);
  cublasDestroy(blas);
  return 0;
}
