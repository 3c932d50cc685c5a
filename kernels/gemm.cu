// gemm.cu — the W4A4 GEMM kernels: y[m][n] = x[m][k] . W[n][k]^T on NVFP4 operands, run exactly
// through BF16 tensor cores with FP32 accumulation, and the weight repacking of the small-M path.
//
// Exactness (DESIGN.md §4): every dequantized element e2m1 * e4m3 is exact in BF16 and every
// product of two is exact in FP32, so the tensor cores compute the NVFP4 products exactly; the
// outer scales are applied in the epilogue. Tested by tests/gpu/test_kernels.c against
// mt_ref_gemm (spec/nvfp4.c) within the FP32-accumulation bound, and bitwise across M, row
// positions and the two paths.
//
// One arithmetic for both paths: k16 MMA steps over K in increasing order into one FP32
// accumulator per output, starting from zero, one CTA per output tile, no split-K, no atomics.
// scripts/probe_mma.cu showed on the H200 that mma.sync m16n8k16 and wgmma m64nNk16 (A from
// registers or from shared memory) give the same bits on NVFP4 operands, so:
//  - large M (mt_gemm_large_nBN): tiles of 128 tokens x BN channels; TMA brings the BF16
//    dequantized operands into 128B-swizzled shared memory (a ring of stages), one thread issues
//    the copies, two consumer warpgroups issue wgmma (64 tokens each);
//  - small M (mt_gemm_small_tNT): the weight streams at 4.5 bits per element in fragment order and
//    is decoded in registers; two warps own each group of 16 output channels (8 rows each, the
//    MMA's other 8 rows zero) and run mma.sync with the tokens as the MMA's N (NT tiles of 8
//    tokens), so the weight decode is shared by every token.
// The two paths start under programmatic dependent launch: they fetch weights before
// griddepcontrol.wait lets them read the activations the quantization kernel before them writes.
// kernels/NOTES.md has the measurements and what bounds each path.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/gemm_args.h"
#include "kernels/wgmma.cuh"

enum { DT_BF16 = 0, DT_FP16 = 1, DT_FP32 = 2 }; // enum mt_dtype, kernels/engine.h

// ---------------------------------------------------------------------------------------------
// epilogue

__device__ static inline float load_elem(const void *p, long long i, int type) {
  if (type == DT_BF16) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
  if (type == DT_FP16) return __half2float(((const __half *)p)[i]);
  return ((const float *)p)[i];
}

__device__ static inline void store_elem(void *p, long long i, int type, float v) {
  if (type == DT_BF16) ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
  else ((__half *)p)[i] = __float2half_rn(v);
}

// 1/S by the correctly rounded reciprocal: the same bits as the reference's 1.0f / S.
__device__ static inline float inv_row(const float *s, int per_row, int i) { return __frcp_rn(s[per_row ? i : 0]); }

// acc of output (i, j) to its final value, in the order of gemm_args.h; _rn keeps the compiler
// from contracting into FMAs, which would make the bits depend on how each path was compiled.
__device__ static inline float epilogue(const mt_epilogue_args &e, float acc, float inv_a, float inv_w, int i,
                                        int j) {
  float t = __fmul_rn(__fmul_rn(acc, __fmul_rn(inv_a, inv_w)), e.alpha);
  if (e.c) t = __fadd_rn(t, __fmul_rn(e.beta, load_elem(e.c, i * e.ldc + j, e.ytype)));
  if (e.bias) t = __fadd_rn(t, load_elem(e.bias, j, e.biastype));
  return t;
}

// ---------------------------------------------------------------------------------------------
// shared-memory barriers, TMA and wgmma descriptors (sm_90a)

__device__ static inline uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

// Programmatic dependent launch: the GEMMs are launched so that they may start while the
// activation quantization before them still runs; this waits for that grid to complete and its
// writes to be visible. A no-op when the launch did not allow overlap.
__device__ static inline void grid_dependency_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }

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

// ---------------------------------------------------------------------------------------------
// large M

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

// ---------------------------------------------------------------------------------------------
// small M

namespace small {
constexpr int GROUPS = MT_SMALL_GROUPS, THREADS = 32 * MT_SMALL_WARPS, KC = MT_SMALL_KC;
constexpr int CODES = MT_SMALL_CODES, SCALES = MT_SMALL_SCALES, PITCH = MT_SMALL_PITCH;
template <int NT> __host__ __device__ constexpr int stage_bytes() { return MT_SMALL_STAGE_BYTES(NT); }
template <int NT> __host__ __device__ constexpr int stages() { return MT_SMALL_STAGES(NT); }

__device__ static inline void cp16(void *dst, const void *src, bool valid) {
  // src-size 0 writes 16 zero bytes: blocks past k and tokens past m read as zero
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}

// Chunk c of this CTA's weight fragments into stage buffer st.
__device__ static void load_weights(const mt_small_args &a, uint8_t *st, int c) {
  int n = a.e.n, k = a.e.k, t = threadIdx.x;
  size_t sgroups = ((size_t)k + 63) / 64, s8groups = ((size_t)k + 127) / 128;
  const uint8_t *codes = a.frag, *scales = a.frag + MT_FRAG_CODES_BYTES(n, k);
  for (int i = t; i < CODES / 16; i += THREADS) { // 2 KB per group: 4 blocks of 64 columns
    int w = i / (CODES / 16 / GROUPS), off = i % (CODES / 16 / GROUPS), R = blockIdx.x * GROUPS + w;
    size_t S = (size_t)c * (KC / 64) + off / 32;
    bool ok = R < n / 16 && S < sgroups;
    cp16(st + i * 16, codes + ok * (((size_t)R * sgroups + S) * 512 + (off % 32) * 16), ok);
  }
  for (int i = t; i < SCALES / 16; i += THREADS) { // 256 B per group: 2 blocks of 128 columns
    int w = i / (SCALES / 16 / GROUPS), off = i % (SCALES / 16 / GROUPS), R = blockIdx.x * GROUPS + w;
    size_t S8 = (size_t)c * (KC / 128) + off / 8;
    bool ok = R < n / 16 && S8 < s8groups;
    cp16(st + CODES + i * 16, scales + ok * (((size_t)R * s8groups + S8) * 128 + (off % 8) * 16), ok);
  }
}

// Chunk c of the (quantized, dequantized) activations into stage buffer st.
template <int NT> __device__ static void load_acts(const mt_small_args &a, uint8_t *st, int c) {
  uint8_t *act = st + CODES + SCALES;
  for (int i = threadIdx.x; i < NT * 8 * (KC / 8); i += THREADS) { // 16 bytes = 8 columns
    int tok = i / (KC / 8), col = c * KC + (i % (KC / 8)) * 8;
    bool ok = tok < a.e.m && col < a.e.k;
    cp16(act + tok * PITCH + (i % (KC / 8)) * 16, a.xa + ok * ((size_t)tok * a.e.k + col), ok);
  }
}

// Four e2m1 codes of bytes b0, b1 (low nibble first) -> two BF16x2 words, exact. Magnitudes via
// byte permutations of two 8-entry tables (high and low bytes of the BF16 values 0 .. 6), then the
// sign bits moved to bits 15 and 31.
__device__ static inline void decode4(uint32_t cw, int half, uint32_t &lo_pair, uint32_t &hi_pair) {
  uint32_t x = cw >> (16 * half);             // bytes b0 (elements e0,e1) and b1 (e2,e3)
  uint32_t sel = x & 0x7777u;                 // magnitudes of e0..e3 as 4 selectors
  uint32_t hi = __byte_perm(0x3F3F3F00u, 0x40404040u, sel); // high bytes of 0,.5,1,1.5,2,3,4,6
  uint32_t lo = __byte_perm(0xC0800000u, 0xC0804000u, sel); // low bytes
  uint32_t p0 = __byte_perm(lo, hi, 0x5140), p1 = __byte_perm(lo, hi, 0x7362);
  p0 |= ((x << 12) & 0x8000u) | ((x << 24) & 0x80000000u); // signs of e0 (bit 3), e1 (bit 7)
  p1 |= ((x << 4) & 0x8000u) | ((x << 16) & 0x80000000u);  // signs of e2 (bit 11), e3 (bit 15)
  lo_pair = p0;
  hi_pair = p1;
}

__device__ static inline uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  __nv_bfloat162 r = __hmul2(*(__nv_bfloat162 *)&a, *(__nv_bfloat162 *)&b);
  return *(uint32_t *)&r;
}

// E4M3 byte -> its value in both halves of a BF16x2 word (exact: 4 significant bits).
__device__ static inline uint32_t scale_x2(uint32_t e4m3) {
  uint32_t h2;
  uint16_t in = (uint16_t)(e4m3 & 0xFF);
  asm("{\n.reg .b16 t;\nmov.b16 t, %1;\ncvt.rn.f16x2.e4m3x2 %0, t;\n}\n" : "=r"(h2) : "h"(in));
  float f = __half2float(__ushort_as_half((unsigned short)(h2 & 0xFFFF)));
  __nv_bfloat162 b = __floats2bfloat162_rn(f, f);
  return *(uint32_t *)&b;
}

// The A fragment of one k16 step for a warp that owns 8 of the group's 16 rows (half 0: rows
// g, half 1: rows g+8, put in the MMA's rows g; its rows g+8 are zero): columns 2q, 2q+1, 2q+8,
// 2q+9, exact BF16 (e2m1 * e4m3 has at most 6 significant bits). cw holds the step's four code
// bytes in fragment order (gemm_args.h); byte u of sc the row's block scales. Two warps per
// group halve each warp's decode: one warp per scheduler decoding 16 rows issued ~90
// instructions a step and kept the MMA chain waiting.
__device__ static inline void weight_frag(uint32_t cw, uint32_t sc, int u, int half, uint32_t (&ra)[4]) {
  uint32_t x = __byte_perm(cw, 0, half ? 0x4431 : 0x4420); // this half's bytes: columns 2q.., 2q+8..
  uint32_t s = scale_x2(sc >> (8 * u)), p0, p1;
  decode4(x, 0, p0, p1);
  ra[0] = bf16x2_mul(p0, s);
  ra[1] = 0;
  ra[2] = bf16x2_mul(p1, s);
  ra[3] = 0;
}

// One k16 step for every token tile: B fragments (tokens 8nt + g, columns 2q.. and 2q+8..) from
// the staged activations, accumulated in K order into d.
template <int NT>
__device__ static inline void mma_step(float (&d)[NT][4], const uint32_t (&ra)[4], const uint8_t *act, int s, int g,
                                       int q) {
#pragma unroll
  for (int nt = 0; nt < NT; nt++) {
    const uint8_t *b = act + (nt * 8 + g) * PITCH + s * 32 + q * 4;
    uint32_t b0 = *(const uint32_t *)b, b1 = *(const uint32_t *)(b + 16);
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[nt][0]), "+f"(d[nt][1]), "+f"(d[nt][2]), "+f"(d[nt][3])
        : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(b0), "r"(b1));
  }
}

template <int NT> __device__ static void run(const mt_small_args &a) {
  extern __shared__ __align__(16) uint8_t smem[];
  int t = threadIdx.x, w = t / 32, lane = t % 32, g = lane / 4, q = lane % 4;
  int group = w / 2, half = w % 2;
  int ksteps = a.e.k / 16, chunks = (a.e.k + KC - 1) / KC;
  bool active = blockIdx.x * GROUPS + group < a.e.n / 16;
  float d[NT][4];
#pragma unroll
  for (int i = 0; i < NT; i++) d[i][0] = d[i][1] = d[i][2] = d[i][3] = 0.0f;

  // The weights do not depend on the kernel before this one (the activation quantization, which
  // lets this grid start early): their first chunks are requested before waiting for it.
  constexpr int STAGES = stages<NT>();
  for (int c = 0; c < STAGES - 1 && c < chunks; c++)
    load_weights(a, smem + c * stage_bytes<NT>(), c);
  grid_dependency_wait();
  for (int c = 0; c < STAGES - 1; c++) {
    if (c < chunks) load_acts<NT>(a, smem + c * stage_bytes<NT>(), c);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  for (int c = 0; c < chunks; c++) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2) : "memory");
    __syncthreads();
    int next = c + STAGES - 1;
    if (next < chunks) {
      load_weights(a, smem + (next % STAGES) * stage_bytes<NT>(), next);
      load_acts<NT>(a, smem + (next % STAGES) * stage_bytes<NT>(), next);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    if (!active) continue;
    const uint8_t *st = smem + (c % STAGES) * stage_bytes<NT>();
    const uint8_t *codes = st + group * (CODES / GROUPS), *scales = st + CODES + group * (SCALES / GROUPS);
    const uint8_t *act = st + CODES + SCALES;
    int steps = min(KC / 16, ksteps - c * (KC / 16));
    // 16-byte loads: codes for 4 steps (512 contiguous bytes a warp), scales for 8 steps (rows g
    // and g+8; the four lanes of a quad read the same bytes). A full group of 8 steps decodes all
    // its fragments first, with no branch in between, so the decode of one step overlaps the
    // previous steps' MMAs instead of waiting behind them (one warp per scheduler has no other
    // work to hide latency with).
    for (int s8 = 0; s8 < steps; s8 += 8) {
      uint4 sc4 = *(const uint4 *)(scales + (s8 / 8) * 128 + g * 16);
      uint32_t sc_lo = half ? sc4.z : sc4.x, sc_hi = half ? sc4.w : sc4.y; // steps 0-3, 4-7
      if (s8 + 8 <= steps) {
        uint4 c0 = *(const uint4 *)(codes + (s8 / 4) * 512 + lane * 16);
        uint4 c1 = *(const uint4 *)(codes + (s8 / 4 + 1) * 512 + lane * 16);
        uint32_t cw[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
        uint32_t ra[8][4];
#pragma unroll
        for (int u = 0; u < 8; u++)
          weight_frag(cw[u], u < 4 ? sc_lo : sc_hi, u % 4, half, ra[u]);
#pragma unroll
        for (int u = 0; u < 8; u++)
          mma_step<NT>(d, ra[u], act, s8 + u, g, q);
      } else {
        for (int s = s8; s < steps; s++) { // the last steps of k, when k % 128 != 0
          uint32_t cw = ((const uint32_t *)(codes + (s / 4) * 512 + lane * 16))[s % 4];
          int u = s - s8;
          uint32_t ra[4];
          weight_frag(cw, u < 4 ? sc_lo : sc_hi, u % 4, half, ra);
          mma_step<NT>(d, ra, act, s, g, q);
        }
      }
    }
  }
  if (!active) return;
  int ch = (blockIdx.x * GROUPS + group) * 16 + 8 * half + g;
  float inv_w = inv_row(a.e.sw, a.e.sw_row, ch);
#pragma unroll
  for (int nt = 0; nt < NT; nt++)
#pragma unroll
    for (int j = 0; j < 2; j++) {
      int tok = nt * 8 + 2 * q + j;
      if (tok >= a.e.m) continue;
      float inv_a = inv_row(a.e.sa, a.e.sa_row, tok);
      store_elem(a.e.y, tok * a.e.ldy + ch, a.e.ytype, epilogue(a.e, d[nt][j], inv_a, inv_w, tok, ch));
    }
}
} // namespace small

#define MT_SMALL(NT)                                                                               \
  extern "C" __global__ void __launch_bounds__(32 * MT_SMALL_WARPS, 1) mt_gemm_small_t##NT(const __grid_constant__ mt_small_args a) { \
    small::run<NT>(a);                                                                             \
  }
MT_SMALL(1)
MT_SMALL(2)
MT_SMALL(4)
MT_SMALL(8)

// ---------------------------------------------------------------------------------------------
// weight repacking into fragment order (gemm_args.h); one thread per 16 output bytes

extern "C" __global__ void mt_gemm_pack(const __grid_constant__ mt_pack_args a) {
  if (a.only_if && *a.only_if == 0)
    return;
  size_t sgroups = ((size_t)a.k + 63) / 64, s8groups = ((size_t)a.k + 127) / 128, kb = (size_t)a.k / 16;
  size_t ncodes = (size_t)a.n / 16 * sgroups * 32, nscales = (size_t)a.n / 16 * s8groups * 8;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  uint8_t out[16];
  if (i < ncodes) { // (R, S, lane)
    size_t R = i / (sgroups * 32), S = (i / 32) % sgroups;
    int lane = i % 32, g = lane / 4, q = lane % 4;
    const uint8_t *r0 = a.codes + (16 * R + g) * (size_t)(a.k / 2), *r1 = r0 + 8 * (size_t)(a.k / 2);
    for (int s = 0; s < 4; s++) {
      size_t b = 4 * S + s;
      bool ok = b < kb;
      out[4 * s + 0] = ok ? r0[b * 8 + q] : 0;
      out[4 * s + 1] = ok ? r1[b * 8 + q] : 0;
      out[4 * s + 2] = ok ? r0[b * 8 + q + 4] : 0;
      out[4 * s + 3] = ok ? r1[b * 8 + q + 4] : 0;
    }
    *(uint4 *)(a.frag + i * 16) = *(uint4 *)out;
  } else if (i < ncodes + nscales) { // (R, S8, g)
    size_t j = i - ncodes, R = j / (s8groups * 8), S8 = (j / 8) % s8groups;
    int g = j % 8;
    const uint8_t *r0 = a.scales + (16 * R + g) * kb, *r1 = r0 + 8 * kb;
    for (int s = 0; s < 8; s++) {
      size_t b = 8 * S8 + s;
      out[s] = b < kb ? r0[b] : 0;
      out[8 + s] = b < kb ? r1[b] : 0;
    }
    *(uint4 *)(a.frag + MT_FRAG_CODES_BYTES(a.n, a.k) + j * 16) = *(uint4 *)out;
  }
}
