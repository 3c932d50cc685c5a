// gemm_large.cu — the large-M path of the W4A4 GEMM (mt_gemm_large_nBN). y[m][n] = x[m][k] . W[n][k]^T
// on NVFP4 operands, exactly, through BF16 wgmma with FP32 accumulation.
//
// Exactness (DESIGN.md §4): every dequantized element e2m1 * e4m3 is exact in BF16 and every
// product of two is exact in FP32, so the tensor cores compute the NVFP4 products exactly; the
// outer scales are applied in the epilogue (kernels/gemm_common.cuh). Tiles of 128 tokens x BN
// channels; TMA brings the BF16 dequantized operands into 128B-swizzled shared memory (a ring of
// stages), one thread issues the copies, two consumer warpgroups issue wgmma (64 tokens each);
// k16 steps over K in increasing order into one FP32 accumulator per output, from zero, no
// split-K, no atomics: the arithmetic of the small path (kernels/gemm_small.cu), which
// scripts/probe_mma.cu showed gives the same bits. The grid starts under programmatic dependent
// launch and fetches weight tiles before griddepcontrol.wait.
//
// Tested by tests/gpu/test_kernels.c: against mt_ref_gemm (spec/nvfp4.c) within the
// FP32-accumulation bound, and bitwise across M, row positions and the two paths.
// kernels/NOTES.md has the measurements.
#include "kernels/gemm_common.cuh"
#include "kernels/wgmma.cuh"

// shared-memory barriers, TMA and wgmma descriptors (sm_90a)

__device__ static inline void mbar_init(uint64_t *bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
}

__device__ static inline void mbar_expect_tx(uint64_t *bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}

__device__ static inline void mbar_arrive(uint64_t *bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

__device__ static inline void mbar_wait(uint64_t *bar, int parity) {
  asm volatile("{\n.reg .pred p;\nWAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
               "@!p bra WAIT;\n}\n" ::"r"(smem_u32(bar)),
               "r"(parity)
               : "memory");
}

__device__ static inline void tma_load_2d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n"
               ::"r"(smem_u32(dst)), "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
               : "memory");
}

// Descriptor of a K-major tile in the layout TMA writes with 128B swizzle: rows of 128 bytes
// (64 BF16 along K), groups of 8 rows 1024 bytes apart, tile base 1024-byte aligned. A step of 16
// along K inside the 128-byte row moves the start address by 32 bytes (the swizzle is applied by
// the hardware on the final address).
__device__ static inline uint64_t desc_sw128(uint32_t addr) {
  return (uint64_t)((addr >> 4) & 0x3FFF) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}

template <int BN> __device__ static inline void wgmma_step(float *d, uint64_t da, uint64_t db) {
  if constexpr (BN == 256) mt_wgmma_m64n256k16(d, da, db);
  else if constexpr (BN == 192) mt_wgmma_m64n192k16(d, da, db);
  else mt_wgmma_m64n128k16(d, da, db);
}



namespace large {
constexpr int BM = MT_LARGE_BM, BK = MT_LARGE_BK;
constexpr int A_BYTES = BM * BK * 2;

// Consumer warpgroup cw (0 or 1) owns tokens m0 + 64 cw .. + 63 of the tile.
template <int BN> __device__ static void store_tile(const mt_epilogue_args &e, const float *d, int m0, int n0, int cw) {
  int t = threadIdx.x % 128, w = t / 32, g = (t % 32) / 4, q = t % 4;
#pragma unroll
  for (int i = 0; i < 2; i++) {
    int row = m0 + 64 * cw + 16 * w + g + 8 * i;
    if (row >= e.m) continue;
    float inv_a = inv_row(e.sa, e.sa_row, row);
#pragma unroll
    for (int c = 0; c < BN / 8; c++)
#pragma unroll
      for (int j = 0; j < 2; j++) {
        int col = n0 + 8 * c + 2 * q + j;
        if (col >= e.n) continue;
        float v = epilogue(e, d[4 * c + 2 * i + j], inv_a, inv_row(e.sw, e.sw_row, col), row, col);
        store_elem(e.y, row * e.ldy + col, e.ytype, v);
      }
  }
}

template <int BN> __device__ static void run(const mt_large_args &a) {
  constexpr int S = MT_LARGE_STAGES(BN), SB = MT_LARGE_STAGE_BYTES(BN);
  extern __shared__ uint8_t smem_raw[];
  uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
  uint64_t *full = (uint64_t *)(smem + S * SB), *empty = full + S;
  int m0 = blockIdx.x * BM, n0 = blockIdx.y * BN, kt = (a.e.k + BK - 1) / BK;
  int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    for (int s = 0; s < S; s++) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 8); // one arrival per consumer warp
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (wg == 0) { // producer: one thread keeps the ring of stages full
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x != 0) return;
    // the weight tiles of the first stages before waiting for the activations' quantization
    int pre = kt < S ? kt : S;
    for (int kb = 0; kb < pre; kb++) {
      mbar_expect_tx(&full[kb], SB);
      tma_load_2d(smem + kb * SB + A_BYTES, &a.tw, &full[kb], kb * BK, n0);
    }
    grid_dependency_wait();
    for (int kb = 0; kb < pre; kb++)
      tma_load_2d(smem + kb * SB, &a.ta, &full[kb], kb * BK, m0);
    for (int kb = pre; kb < kt; kb++) {
      int s = kb % S;
      mbar_wait(&empty[s], ((kb / S) & 1) ^ 1);
      uint8_t *sa = smem + s * SB, *sw = sa + A_BYTES;
      mbar_expect_tx(&full[s], SB);
      tma_load_2d(sa, &a.ta, &full[s], kb * BK, m0);
      tma_load_2d(sw, &a.tw, &full[s], kb * BK, n0);
    }
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  int cw = wg - 1;
  float d[BN / 2];
#pragma unroll
  for (int i = 0; i < BN / 2; i++) d[i] = 0.0f;
  for (int kb = 0; kb < kt; kb++) {
    int s = kb % S;
    mbar_wait(&full[s], (kb / S) & 1);
    uint32_t sa = smem_u32(smem + s * SB) + cw * 64 * 128, sw = smem_u32(smem + s * SB + A_BYTES);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++) wgmma_step<BN>(d, desc_sw128(sa + 32 * kk), desc_sw128(sw + 32 * kk));
    asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    if (threadIdx.x % 32 == 0) mbar_arrive(&empty[s]);
  }
  grid_dependency_wait(); // S_a comes from the quantization too
  store_tile<BN>(a.e, d, m0, n0, cw);
}
} // namespace large

#define MT_LARGE(BN)                                                                               \
  extern "C" __global__ void __launch_bounds__(384, 1) mt_gemm_large_n##BN(const __grid_constant__ mt_large_args a) { \
    large::run<BN>(a);                                                                             \
  }
MT_LARGE(128)
MT_LARGE(192)
MT_LARGE(256)

