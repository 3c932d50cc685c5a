// probe_wgchain.cu — the latency of a dependent wgmma chain: what bounds the 64-token tiles at a
// few tokens (kernels/NOTES.md, eighth session).
//
// At M <= 64 the large path's GEMM took the same time whatever the tile width (gate_up M = 16:
// 64 x 16 6.88 µs, 64 x 32 6.96, 64 x 64 7.46), the number of SMs at work (96 or 48) and the bytes
// it streams (the f4 kernels read 3.2x fewer): what is left is the chain of K / 16 wgmma steps
// into one accumulator, which batch invariance forbids splitting. Here one warpgroup per CTA
// issues STEPS dependent wgmma m64nNk16 (operands in shared memory, zeros: the values do not
// change the time) as the kernels do, a group of 4 per 64-wide K block with one group in flight
// ("kblock"), or all in one group ("one group"), for N from 16 to 256: where the cycles a step stay
// flat as N (the work a step) grows, latency binds, where they grow with N the tensor cores' rate
// does (m64n256k16 is 16384 multiply-adds per SM sub-partition, 128 cycles at 128 a cycle).
// Cycles by clock64 in thread 0 around the loop, per step; grids of 1 and 132 CTAs.
//
// Build and run on the H200 (scripts/gpu_session.sh probe; PROBES=wgchain):
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I. -o build/probe_wgchain scripts/probe_wgchain.cu
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "kernels/gemm_common.cuh"
#include "kernels/wgmma.cuh"
#include "scripts/probe.cuh"

constexpr int STEPS = 128, SMEM = 1024 + 64 * 128 + 256 * 128;
enum { KBLOCK, ONE_GROUP };

template <int N, int MODE> __global__ void __launch_bounds__(128) chain(long long *cycles, float *sink) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  for (int i = threadIdx.x; i < (64 + 256) * 128 / 4; i += 128)
    ((uint32_t *)smem)[i] = 0;
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  const uint64_t da = desc_sw128(smem_u32(smem)), db = desc_sw128(smem_u32(smem) + 64 * 128);
  float d[N / 2];
  for (int i = 0; i < N / 2; i++)
    d[i] = 0.0f;
  long long t0 = clock64();
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  for (int kb = 0; kb < STEPS / 4; kb++) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wgmma_step<N>(d, da + 2 * kk, db + 2 * kk);
    if (MODE != ONE_GROUP) {
      asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
      asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    }
  }
  asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  long long t1 = clock64();
  if (threadIdx.x == 0)
    cycles[blockIdx.x] = t1 - t0;
  if (d[0] == 12345.0f) // never: keeps the accumulators live
    sink[threadIdx.x] = d[N / 2 - 1];
}

template <int N, int MODE> static void row(long long *cycles, float *sink) {
  static const char *const mode[] = {"kblock", "one group"};
  auto k = chain<N, MODE>;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
  for (int grid : {1, 132}) {
    std::vector<long long> h(grid);
    std::vector<double> per_step;
    for (int rep = 0; rep < 5; rep++) {
      k<<<grid, 128, SMEM>>>(cycles, sink);
      CK(cudaGetLastError());
      CK(cudaMemcpy(h.data(), cycles, grid * sizeof(long long), cudaMemcpyDeviceToHost));
      for (long long c : h)
        per_step.push_back((double)c / STEPS);
    }
    printf("wgmma m64n%-3dk16  %-10s grid %3d: %6.1f cycles a step (median over CTAs and 5 launches)\n", N, mode[MODE],
           grid, median(per_step));
  }
}

int main() {
  long long *cycles;
  float *sink;
  CK(cudaMalloc(&cycles, 256 * sizeof(long long)));
  CK(cudaMalloc(&sink, 256 * sizeof(float)));
  row<16, KBLOCK>(cycles, sink);
  row<32, KBLOCK>(cycles, sink);
  row<64, KBLOCK>(cycles, sink);
  row<128, KBLOCK>(cycles, sink);
  row<256, KBLOCK>(cycles, sink);
  row<16, ONE_GROUP>(cycles, sink);
  row<64, ONE_GROUP>(cycles, sink);
  return 0;
}
