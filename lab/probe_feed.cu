// probe_feed.cu — what bounds the large path at a few hundred tokens (lab/NOTES.md, "Large-M
// kernels and tiles"): how fast TMA fills one SM's shared memory, alone and under the MMAs, for
// tiles of BM tokens x BN channels on as many SMs as the tiles allow.
//
// The kernel is the large path's pipeline (kernels/gemm_large.cu: one producer thread, a ring of
// 128B-swizzled stages, consumer warpgroups issuing wgmma m64nNk16 with one group in flight) with
// no epilogue, on BF16 operands whose values do not matter: mode "null" issues nothing (launch
// and grid cost), "feed" loads every stage and hands it back unread (the TMA alone), "mma" runs
// the wgmmas on it as the real kernel does. Weights rotate over EXPERTS matrices, so they stream
// from HBM as in make bench; the activations stay in L2. Per row: µs a launch (CUDA graph of
// EXPERTS launches, median of 5 replays), the bytes each SM took into shared memory per µs and
// in all, and TFLOP/s. The question it answers: if "feed" at 48 SMs runs near the real kernel
// and its per-SM rate stays flat as the SMs double, each SM's ingress binds and tiles over more
// SMs win; if the total rate stays flat instead, the L2 binds and larger tiles win.
//
// Second experiment ("mc"): tiles of 64 tokens in clusters of 2 CTAs along M that share the weight
// tile by TMA multicast (each CTA loads half of it into both), against the same tiles alone: what
// the L2 feed costs the 64-token tiles at M = 128-512.
//
// Build and run on the H200 (tests/gpu/session.sh probe; PROBE_ARGS=mc for the second):
//   nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -I. -o build/probe_feed
//       lab/probe_feed.cu -lcuda
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/gemm_common.cuh"
#include "kernels/wgmma.cuh"
#include "lab/probe.cuh"
#include "lab/probe_tma.cuh"

enum { NULL_RUN, FEED, MMA };
constexpr int BK = 64, EXPERTS = 32, SMEM_STAGES = 200 * 1024;

// The large path's pieces (kernels/gemm_common.cuh, kernels/wgmma.cuh): tma_load_2d, desc_sw128,
// the mbarriers and wgmma_step.

// Clusters of 2 CTAs along M sharing the weight tile (MC): each CTA loads half of it into both
// CTAs' shared memory by TMA multicast, completing on each CTA's barrier at the same offset; a
// stage is refilled only once the consumers of both CTAs released it (they arrive on the "empty"
// barriers of both).
__device__ static inline uint32_t cluster_rank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ static inline void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                   : "memory");
}
__device__ static inline void mbar_arrive_in(uint64_t *bar, uint32_t cta) {
  asm volatile("{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
               "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(smem_u32(bar)),
               "r"(cta)
               : "memory");
}
__device__ static inline void tma_load_2d_both(void *dst, const CUtensorMap *map, uint64_t *bar,
                                               int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes."
               "multicast::cluster"
               " [%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(smem_u32(dst)),
               "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "h"((uint16_t)3)
               : "memory");
}
// A consumer warp's release of stage s: in its own CTA, or in both CTAs of the cluster.
template <bool MC> __device__ static inline void release(uint64_t *empty) {
  if (MC) {
    mbar_arrive_in(empty, 0);
    mbar_arrive_in(empty, 1);
  } else {
    mbar_arrive(empty);
  }
}

// The work of one CTA: items i = unit, unit + units, ...; an item is a tile, or under MC a pair of
// tiles on the same channels and adjacent bands of BM tokens (this CTA's: band 2 (i / tiles_n) +
// rank).
struct walk {
  int unit, units, items, tiles_n, rank;
  __device__ int m0(int i, int bm) const {
    return (rank < 0 ? i / tiles_n : i / tiles_n * 2 + rank) * bm;
  }
  __device__ int n0(int i, int bn) const { return i % tiles_n * bn; }
};

// A tile's geometry: BM tokens x BN channels; WGN consumer warpgroups share the channels of each
// 64 tokens (each a wgmma of BN / WGN), so (BM / 64) * WGN consumer warpgroups in all.
template <int BM, int BN, int WGN> struct geom {
  static constexpr int WG = BM / 64 * WGN, WN = BN / WGN, SB = (BM + BN) * BK * 2;
  static constexpr int S = SMEM_STAGES / SB < 16 ? SMEM_STAGES / SB : 16;
  static constexpr int THREADS = 128 * (1 + WG), SMEM = 1024 + S * SB + 16 * S;
};

template <int BM, int BN, int WGN, bool MC>
__device__ static void produce(const CUtensorMap *ta, const CUtensorMap *tw, uint8_t *smem,
                               uint64_t *full, uint64_t *empty, const walk &w, int m, int kt) {
  using G = geom<BM, BN, WGN>;
  int it = 0;
  for (int i = w.unit; i < w.items; i += w.units) {
    const int m0 = w.m0(i, BM), n0 = w.n0(i, BN);
    for (int kb = 0; kb < kt; kb++, it++) {
      const int s = it % G::S;
      if (it >= G::S)
        mbar_wait(&empty[s], ((it / G::S) & 1) ^ 1);
      uint8_t *sa = smem + s * G::SB;
      mbar_arrive_expect_tx(&full[s], (m0 < m ? BM * BK * 2 : 0) + BN * BK * 2);
      if (m0 < m)
        tma_load_2d(sa, ta, &full[s], kb * BK, m0);
      if (MC)
        tma_load_2d_both(sa + (BM + w.rank * BN / 2) * BK * 2, tw, &full[s], kb * BK,
                         n0 + w.rank * BN / 2);
      else
        tma_load_2d(sa + BM * BK * 2, tw, &full[s], kb * BK, n0);
    }
  }
}

template <int BM, int BN, int WGN, int MODE, bool MC>
__device__ static void consume(uint8_t *smem, uint64_t *full, uint64_t *empty, const walk &w,
                               int kt, float *sink) {
  using G = geom<BM, BN, WGN>;
  const int cw = threadIdx.x / 128 - 1, wm = cw / WGN, wn = cw % WGN;
  const uint64_t da0 = desc_sw128(smem_u32(smem) + wm * 64 * 128);
  const uint64_t db0 = desc_sw128(smem_u32(smem) + BM * 128 + wn * G::WN * 128);
  int it = 0;
  for (int i = w.unit; i < w.items; i += w.units) {
    float d[G::WN / 2];
#pragma unroll
    for (int i = 0; i < G::WN / 2; i++)
      d[i] = 0.0f;
    int prev = 0;
    for (int kb = 0; kb < kt; kb++, it++) {
      const int s = it % G::S;
      mbar_wait(&full[s], (it / G::S) & 1);
      if constexpr (MODE == MMA) {
        const uint64_t off = (uint64_t)(s * (G::SB >> 4));
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++)
          wgmma_step<G::WN>(d, da0 + off + 2 * kk, db0 + off + 2 * kk);
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        if (kb > 0 && threadIdx.x % 32 == 0)
          release<MC>(&empty[prev]);
        prev = s;
      } else if (threadIdx.x % 32 == 0) {
        release<MC>(&empty[s]);
      }
    }
    if constexpr (MODE == MMA) {
      asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
      if (kt > 0 && threadIdx.x % 32 == 0)
        release<MC>(&empty[prev]);
    }
    if (d[0] == 12345.0f) // never, with these operands; keeps the accumulators live
      sink[threadIdx.x] = d[G::WN / 2 - 1];
  }
}

template <int BM, int BN, int WGN, int MODE, bool MC>
__global__ void __launch_bounds__(geom<BM, BN, WGN>::THREADS, 1)
    feed(const __grid_constant__ CUtensorMap ta, const __grid_constant__ CUtensorMap tw, int m,
         int n, int k, float *sink) {
  using G = geom<BM, BN, WGN>;
  extern __shared__ uint8_t smem_raw[];
  uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint64_t *full = (uint64_t *)(smem + G::S * G::SB), *empty = full + G::S;
  const int tiles_n = (n + BN - 1) / BN, bands = (m + BM - 1) / BM,
            kt = MODE == NULL_RUN ? 0 : k / BK;
  walk w = {(int)blockIdx.x, (int)gridDim.x, bands * tiles_n, tiles_n, -1};
  if (MC)
    w = {(int)blockIdx.x / 2, (int)gridDim.x / 2, (bands + 1) / 2 * tiles_n, tiles_n,
         (int)cluster_rank()};
  if (threadIdx.x == 0) {
    for (int s = 0; s < G::S; s++) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 4 * G::WG * (MC ? 2 : 1));
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  if (MC) // both CTAs' barriers exist before either multicasts into the other
    cluster_sync();
  if (threadIdx.x == 0)
    produce<BM, BN, WGN, MC>(&ta, &tw, smem, full, empty, w, m, kt);
  else if (threadIdx.x >= 128)
    consume<BM, BN, WGN, MODE, MC>(smem, full, empty, w, kt, sink);
  if (MC) // the peer may still multicast into this CTA or arrive on its barriers until it is done
    cluster_sync();
}

struct shape {
  const char *name;
  int n, k;
  std::vector<uint16_t *> w; // EXPERTS weight matrices
};

static int g_sms;
static float *g_sink;

// MC: clusters of 2 along M sharing the weight tile; bytes counts what lands in shared memory.
template <int BM, int BN, int WGN, int MODE, bool MC = false>
static void row(shape &sh, const uint16_t *x, int m) {
  using G = geom<BM, BN, WGN>;
  static const char *const mode[] = {"null", "feed", "mma"};
  auto kern = feed<BM, BN, WGN, MODE, MC>;
  CK(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, G::SMEM));
  const CUtensorMap ta = tensor_map(x, m, sh.k, BM);
  std::vector<CUtensorMap> tw;
  for (int e = 0; e < EXPERTS; e++)
    tw.push_back(tensor_map(sh.w[e], sh.n, sh.k, MC ? BN / 2 : BN));
  const int tiles_n = (sh.n + BN - 1) / BN, bands = (m + BM - 1) / BM, tiles = bands * tiles_n;
  const int pairs = (bands + 1) / 2 * tiles_n;
  const int grid = MC ? 2 * (pairs < g_sms / 2 ? pairs : g_sms / 2) : tiles < g_sms ? tiles : g_sms;
  cudaLaunchAttribute attr;
  attr.id = cudaLaunchAttributeClusterDimension;
  attr.val.clusterDim.x = MC ? 2 : 1, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
  double us = graph_us_per_launch(EXPERTS, [&](cudaStream_t st, int l) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid), cfg.blockDim = dim3(G::THREADS), cfg.dynamicSmemBytes = G::SMEM,
    cfg.stream = st;
    cfg.attrs = &attr, cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, kern, ta, tw[l], m, sh.n, sh.k, g_sink));
  });
  CK(cudaGetLastError());
  const double bytes = (double)tiles * (BM + BN) * sh.k * 2, flop = 2.0 * m * sh.n * sh.k;
  printf("%-16s M %5d  tile %3dx%-3d wg %d  %-4s%s  tiles %4d grid %3d  %8.2f us  %6.1f GB/s an SM "
         " %5.2f TB/s  "
         "%6.1f TFLOP/s  stages %2d\n",
         sh.name, m, BM, BN, G::WG, mode[MODE], MC ? " mc" : "   ", tiles, grid, us,
         bytes / grid / us * 1e-3, bytes / us * 1e-6, MODE == MMA ? flop / us * 1e-6 : 0.0, G::S);
}

template <int BM, int BN, int WGN> static void rows(shape &sh, const uint16_t *x, int m) {
  row<BM, BN, WGN, NULL_RUN>(sh, x, m);
  row<BM, BN, WGN, FEED>(sh, x, m);
  row<BM, BN, WGN, MMA>(sh, x, m);
}

// One consumer warpgroup per 64 tokens, alone and in clusters of 2 sharing the weight tile.
template <int BM, int BN> static void rows_mc(shape &sh, const uint16_t *x, int m) {
  row<BM, BN, 1, FEED>(sh, x, m);
  row<BM, BN, 1, FEED, true>(sh, x, m);
  row<BM, BN, 1, MMA>(sh, x, m);
  row<BM, BN, 1, MMA, true>(sh, x, m);
}

// The first experiment (no argument): tiles and SM counts at M = 256. "mc": the same tiles of 64
// tokens alone and in clusters of 2 sharing the weight tile, at M = 128-512.
static void tiles_at_256(shape &sh, const uint16_t *x) {
  // the launcher's tile at M = 256 (128 x 64), over 24 to 132 SMs: per-SM or total rate
  for (int m : {128, 256, 512, 1024})
    row<128, 64, 1, FEED>(sh, x, m);
  // the tiles that would put more SMs to work at M = 256
  rows<128, 64, 1>(sh, x, 256);
  rows<128, 32, 1>(sh, x, 256);
  rows<64, 64, 1>(sh, x, 256);
  rows<64, 64, 2>(sh, x, 256);
  rows<64, 48, 1>(sh, x, 256);
  rows<64, 32, 1>(sh, x, 256);
  rows<64, 96, 2>(sh, x, 256);
  rows<64, 128, 2>(sh, x, 256);
  rows<128, 128, 1>(sh, x, 256);
}

static void clusters(shape &sh, const uint16_t *x) {
  for (int m : {128, 256, 512}) {
    rows_mc<64, 64>(sh, x, m);
    rows_mc<64, 48>(sh, x, m);
    rows_mc<64, 32>(sh, x, m);
  }
  rows_mc<128, 64>(sh, x, 256);
}

int main(int argc, char **argv) {
  const bool mc = argc > 1 && !strcmp(argv[1], "mc");
  CK(cudaDeviceGetAttribute(&g_sms, cudaDevAttrMultiProcessorCount, 0));
  CK(cudaMalloc(&g_sink, 4096 * sizeof(float)));
  std::vector<shape> shapes = {{"qwen3_gate_up", 1536, 2048, {}}, {"dsv3_gate_up", 4096, 7168, {}}};
  if (mc)
    shapes.insert(shapes.begin() + 1, {"qwen3_down", 2048, 768, {}});
  const int mmax = 1024;
  for (auto &sh : shapes) {
    for (int e = 0; e < EXPERTS; e++)
      sh.w.push_back(random_bf16((size_t)sh.n * sh.k));
    const uint16_t *x = random_bf16((size_t)mmax * sh.k);
    if (mc)
      clusters(sh, x);
    else
      tiles_at_256(sh, x);
    for (auto *w : sh.w)
      CK(cudaFree(w));
    CK(cudaFree((void *)x));
  }
  return 0;
}
