// probe_wgchain.cu — the latency of a dependent wgmma chain: what bounds the 64-token tiles at a
// few tokens (lab/NOTES.md, "Large-M kernels and tiles" and "Exactness of the MMA instructions").
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
// The 64-token kernel's stage (two blocks, 8 wgmmas a group) takes ~300 cycles against 8 x 25 here
// (probe_kloop, lab/NOTES.md), so the rows "ring" add, one at a time, what the kernel has and
// "kblock" has not: groups of G blocks over a ring of 4 stages at distinct addresses (zeros), then
// random BF16 operands ("rand"), then each group's wait on a completed mbarrier and one arrive a
// warp on another ("mbar"), as the kernel's k_loop does. Measured: n32 G 2 25.2 / 25.2 / 25.4
// cycles a step, so none of them is the missing ~100 cycles a stage; with G 1 the mbarrier
// hand-over shows (31.4). Then ("writes") the same beside a second warpgroup's thread bulk-copying
// 24 KB pieces from global memory into other shared memory (four in flight), as TMA fills the
// kernel's next stages, back to back or one every PACE cycles, the bytes written a cycle printed
// with it: 25.6 cycles a step with the copies at 52-75 B a cycle, so TMA's writes do not slow the
// wgmmas.
//
// Build and run on the H200 (tests/gpu/session.sh probe; PROBES=wgchain):
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I. -o build/probe_wgchain
//       lab/probe_wgchain.cu
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "kernels/gemm_common.cuh"
#include "kernels/wgmma.cuh"
#include "lab/probe.cuh"

constexpr int STEPS = 128, SMEM = 1024 + 64 * 128 + 256 * 128, RING = 4;
enum { KBLOCK, ONE_GROUP, RING_ZERO, RING_RAND, RING_MBAR, RING_WRITES };

// a ring stage: G A blocks (64 rows) then G B blocks (N rows), 128 bytes a row
template <int N, int G> __host__ __device__ constexpr int stage_bytes() {
  return G * (64 + N) * 128;
}
constexpr int PIECE = 24576, PIECES = 32,
              SLOTS = 4; // the "writes" rows' copies and their source buffer
template <int N, int G> __host__ __device__ constexpr int ring_smem() {
  return 1024 + RING * stage_bytes<N, G>() + 64 + SLOTS * PIECE;
}

// mbar_wait that gives up after ~2^24 polls (false): a probe that hangs reports nothing
__device__ static bool mbar_wait_bounded(uint64_t *bar, int parity) {
  for (int n = 0; n < 1 << 24; n++) {
    uint32_t done;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], "
                 "%2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(smem_u32(bar)), "r"(parity)
                 : "memory");
    if (done)
      return true;
  }
  return false;
}

// the "writes" rows' copier: pieces into SLOTS slots after the ring until the consumer says stop;
// returns the pieces copied (-1, -2: a wait gave up)
template <int PACE>
__device__ static int copy_pieces(uint8_t *slots, uint64_t *bars, volatile int *stop,
                                  const uint8_t *src) {
  int i = 0;
  long long next = clock64();
  for (; !*stop && i < 1 << 20; i++) {
    if (i >= SLOTS && !mbar_wait_bounded(&bars[i % SLOTS], ((i - SLOTS) / SLOTS) & 1))
      return -1;
    while (PACE && clock64() < next) {
    }
    next += PACE;
    mbar_arrive_expect_tx(&bars[i % SLOTS], PIECE);
    bulk_load(slots + (i % SLOTS) * PIECE, src + (size_t)(i % PIECES) * PIECE, PIECE,
              &bars[i % SLOTS]);
  }
  for (int j = i - SLOTS < 0 ? 0 : i - SLOTS; j < i;
       j++) // the copies still in flight land before exit
    if (!mbar_wait_bounded(&bars[j % SLOTS], (j / SLOTS) & 1))
      return -2;
  return i;
}

// groups of G 64-wide blocks, the stage rotating over RING at distinct addresses, as k_loop
template <int N, int G, int MODE, int PACE = 0>
__global__ void __launch_bounds__(256)
    ring(long long *cycles, float *sink, const uint8_t *src, int *copied) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint64_t *bars = (uint64_t *)(smem + RING * stage_bytes<N, G>());
  uint32_t h = 2166136261u ^ threadIdx.x;
  for (int i = threadIdx.x; i < RING * stage_bytes<N, G>() / 4; i += blockDim.x) {
    h = h * 1664525u + 1013904223u; // values in +-[1, 2): random, never zero
    ((uint32_t *)smem)[i] = MODE == RING_ZERO ? 0 : (0x3f803f80u | (h & 0x807f807fu));
  }
  volatile int *stop = (volatile int *)&bars[2 + SLOTS];
  if (threadIdx.x == 0) {
    mbar_init(&bars[0], 1);       // "full": its phase 0 completes now, so its wait returns at once
    mbar_init(&bars[1], 1 << 19); // "empty": never completes
    for (int i = 0; i < SLOTS; i++)
      mbar_init(&bars[2 + i], 1); // the copier's slots
    *stop = 0;
    mbar_arrive(&bars[0]);
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  if (threadIdx.x >= 128) {
    if (MODE == RING_WRITES && threadIdx.x == 128)
      copied[blockIdx.x] =
          copy_pieces<PACE>(smem + RING * stage_bytes<N, G>() + 64, &bars[2], stop, src);
    return;
  }
  constexpr int SB = stage_bytes<N, G>(), A_SUB = 64 * 128, B_SUB = N * 128;
  const uint64_t da = desc_sw128(smem_u32(smem)), db = desc_sw128(smem_u32(smem) + G * 64 * 128);
  float d[N / 2];
  for (int i = 0; i < N / 2; i++)
    d[i] = 0.0f;
  long long t0 = clock64();
  for (int kb = 0; kb < STEPS / (4 * G); kb++) {
    if (MODE >= RING_MBAR)
      mbar_wait(&bars[0], 0);
    const uint64_t off = (uint64_t)(kb % RING * (SB >> 4));
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int j = 0; j < G; j++)
#pragma unroll
      for (int kk = 0; kk < 4; kk++)
        wgmma_step<N>(d, da + off + j * (A_SUB >> 4) + 2 * kk,
                      db + off + j * (B_SUB >> 4) + 2 * kk);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    if (MODE >= RING_MBAR && threadIdx.x % 32 == 0)
      mbar_arrive(&bars[1]);
  }
  asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  long long t1 = clock64();
  if (threadIdx.x == 0) {
    cycles[blockIdx.x] = t1 - t0;
    *stop = 1;
  }
  if (d[0] == 12345.0f) // never: keeps the accumulators live
    sink[threadIdx.x] = d[N / 2 - 1];
}

template <int N, int MODE>
__global__ void __launch_bounds__(128) chain(long long *cycles, float *sink) {
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
    for (int kk = 0; kk < 4; kk++)
      wgmma_step<N>(d, da + 2 * kk, db + 2 * kk);
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

// launch(grid) runs one launch; "writes" rows also report the copier's bytes a cycle
template <class L>
static void measure(L launch, const char *name, long long *cycles, int *copied, bool writes) {
  for (int grid : {1, 132}) {
    std::vector<long long> h(grid);
    std::vector<int> n(grid);
    std::vector<double> per_step, written;
    for (int rep = 0; rep < 5; rep++) {
      launch(grid);
      CK(cudaGetLastError());
      CK(cudaMemcpy(h.data(), cycles, grid * sizeof(long long), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(n.data(), copied, grid * sizeof(int), cudaMemcpyDeviceToHost));
      for (int c = 0; c < grid; c++) {
        per_step.push_back((double)h[c] / STEPS);
        written.push_back((double)n[c] * PIECE / (double)h[c]);
      }
    }
    printf("%-44s grid %3d: %6.1f cycles a step", name, grid, median(per_step));
    if (writes)
      printf(", copies beside it %5.1f B a cycle (fewest pieces a CTA %d)", median(written),
             *std::min_element(n.begin(), n.end()));
    printf(" (medians over CTAs and 5 launches)\n");
  }
}

struct bufs {
  long long *cycles;
  float *sink;
  uint8_t *src;
  int *copied;
};

template <int N, int MODE> static void row(const bufs &b) {
  char name[64];
  snprintf(name, sizeof name, "wgmma m64n%dk16  %s", N, MODE == KBLOCK ? "kblock" : "one group");
  CK(cudaFuncSetAttribute(chain<N, MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
  measure([&](int grid) { chain<N, MODE><<<grid, 128, SMEM>>>(b.cycles, b.sink); }, name, b.cycles,
          b.copied, false);
}

template <int N, int G, int MODE, int PACE = 0> static void ring_row(const bufs &b) {
  static const char *const mode[] = {
      "", "", "ring", "ring rand", "ring rand mbar", "ring rand mbar writes"};
  char name[64];
  snprintf(name, sizeof name, "wgmma m64n%dk16  %s G %d%s", N, mode[MODE], G, PACE ? " paced" : "");
  constexpr int smem = ring_smem<N, G>();
  auto k = ring<N, G, MODE, PACE>;
  CK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  measure([&](int grid) { k<<<grid, 256, smem>>>(b.cycles, b.sink, b.src, b.copied); }, name,
          b.cycles, b.copied, MODE == RING_WRITES);
}

int main() {
  setvbuf(stdout, nullptr, _IONBF, 0); // rows as they come, should a later one hang
  bufs b;
  CK(cudaMalloc(&b.cycles, 256 * sizeof(long long)));
  CK(cudaMalloc(&b.sink, 256 * sizeof(float)));
  CK(cudaMalloc(&b.copied, 256 * sizeof(int)));
  CK(cudaMemset(b.copied, 0, 256 * sizeof(int)));
  b.src = (uint8_t *)random_bf16((size_t)PIECES * PIECE / 2);
  row<16, KBLOCK>(b);
  row<32, KBLOCK>(b);
  row<64, KBLOCK>(b);
  row<128, KBLOCK>(b);
  row<256, KBLOCK>(b);
  row<16, ONE_GROUP>(b);
  row<64, ONE_GROUP>(b);
  ring_row<32, 1, RING_ZERO>(b);
  ring_row<32, 2, RING_ZERO>(b);
  ring_row<32, 2, RING_RAND>(b);
  ring_row<32, 2, RING_MBAR>(b);
  ring_row<32, 1, RING_MBAR>(b);
  ring_row<16, 2, RING_MBAR>(b);
  ring_row<64, 2, RING_MBAR>(b);
  ring_row<32, 2, RING_WRITES>(b);
  ring_row<32, 2, RING_WRITES, 200>(b);
  ring_row<32, 2, RING_WRITES, 400>(b);
  ring_row<32, 1, RING_WRITES, 200>(b);
  return 0;
}
