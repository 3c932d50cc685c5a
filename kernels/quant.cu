/* quant.cu — NVFP4 quantization kernels: BF16/FP16 rows (row stride ldx) to the exact BF16
 * dequantized matrix xhat = e2m1(code) * s_b (outer scale not applied: what the tensor cores
 * read), and optionally the packed E2M1 codes and E4M3 block scales, with the FP32 outer scale S
 * per row or per tensor; 1x16 blocks, or 16x16 tiles for weights.
 *
 * Bit-identical to mt_ref_quantize (spec/nvfp4.c): the same IEEE FP32 operations in the same
 * order (TE's), each rounded on its own (__fmul_rn / __frcp_rn / __fdiv_rn: no FMA contraction,
 * correctly rounded division, denormals kept). tests/gpu/test_kernels.c checks codes, scales, S
 * and xhat bit for bit against the reference on random and adversarial inputs.
 *
 * Layout of the work: one thread owns NB blocks of 16 elements of one row (two 16-byte loads and
 * stores per block, coalesced across the row's threads); a CTA holds TY rows of TX threads. The
 * per-row amax is a max over the FP32 bits of |x| (exact and order-independent; NaN's bits exceed
 * Inf's, so NaN wins as in the reference): butterfly shuffles, then shared memory across warps.
 */
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/quant.h"

namespace {

constexpr int kMaxThreads = 512;        /* per CTA; the launcher never asks for more */
constexpr float kOneSixth = 0x1.555556p-3f; /* the FP32 constant nearest 1/6, as the reference */
constexpr float kFltMax = 3.402823466e38f;

/* FP32 of a non-negative |x| given as BF16/FP16 bits (abs bits order like the values; NaN last). */
template <bool FP16> __device__ __forceinline__ float abs_bits_to_float(uint32_t h) {
  if (FP16)
    return __half2float(__ushort_as_half((unsigned short)h));
  return __uint_as_float(h << 16);
}

template <bool FP16> __device__ __forceinline__ void unpack(uint32_t w, float &lo, float &hi) {
  if (FP16) {
    lo = __half2float(__ushort_as_half((unsigned short)(w & 0xffffu)));
    hi = __half2float(__ushort_as_half((unsigned short)(w >> 16)));
  } else {
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xffff0000u);
  }
}

/* max |x| of 16 packed elements, as FP32 bits. */
template <bool FP16> __device__ __forceinline__ uint32_t block_amax_bits(const uint32_t (&w)[8]) {
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < 8; i++)
    m = __vmaxu2(m, w[i] & 0x7fff7fffu);
  return __float_as_uint(abs_bits_to_float<FP16>(max(m & 0xffffu, m >> 16)));
}

/* mt_nvfp4_outer_scale: NaN for a NaN or Inf amax, 1 for 0, else 2688 / amax clamped. */
__device__ __forceinline__ float outer_scale(float amax) {
  if (!(amax <= kFltMax))
    return __uint_as_float(0x7fffffffu);
  if (amax == 0.0f)
    return 1.0f;
  return fminf(__fdiv_rn(2688.0f, amax), kFltMax);
}

/* E4M3 RNE satfinite: native on sm_89+ (NaN -> 0x7f, |v| > 448 -> 448, as the reference). */
__device__ __forceinline__ uint32_t e4m3_rne_satfinite(float v) {
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %1;" : "=h"(r) : "f"(v));
  return r & 0xffu;
}

/* The value of a non-negative, non-NaN E4M3 code (exact in FP32). */
__device__ __forceinline__ float e4m3_to_float(uint32_t code) {
  uint32_t exp = code >> 3, man = code & 7u;
  if (exp == 0)
    return (float)man * 0x1p-9f;
  return __uint_as_float(((exp + 120u) << 23) | (man << 20));
}

/* |v| rounded to the E2M1 magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}, ties to even, saturating. Adding
 * and removing 2^22, 2^23 or 2^24 rounds to the E2M1 spacing of |v|'s binade (0.5 below 2, 1
 * below 4, 2 above) by the FPU's own RNE, so each tie lands on the even code exactly where the
 * reference's thresholds put it (.25->0 .75->1 1.25->1 1.75->2 2.5->2 3.5->4 5->4). Inf and NaN
 * give 6 (fminf drops the NaN), as mt_e2m1_rne_satfinite does. */
__device__ __forceinline__ float e2m1_round(float a) {
  float magic = a < 2.0f ? 0x1p22f : (a < 4.0f ? 0x1p23f : 0x1p24f);
  return fminf(__fsub_rn(__fadd_rn(a, magic), magic), 6.0f);
}

/* The 3-bit E2M1 code of a magnitude e2m1_round returned: from its FP32 exponent and top
 * mantissa bit (1 -> 254 ... 6 -> 259), with 0.5 (252) and 0 special. */
__device__ __forceinline__ uint32_t e2m1_code(float r) {
  uint32_t t = __float_as_uint(r) >> 22;
  return t >= 254u ? t - 252u : (uint32_t)(t != 0u);
}

/* One element: v = x * c_b (one rounding), its E2M1 magnitude r, xhat = +-r * s_b (exact). The
 * sign is v's: a NaN v (0 * Inf, when c_b overflowed) is the GPU's canonical positive NaN, so its
 * code is +6 as the reference wants. Returns xhat's FP32 bits (the low 16 are zero). */
template <bool CODES>
__device__ __forceinline__ uint32_t encode(float x, float c, float sb, uint32_t &code) {
  float v = __fmul_rn(x, c);
  float r = e2m1_round(fabsf(v));
  uint32_t sign = __float_as_uint(v) & 0x80000000u;
  if (CODES)
    code = e2m1_code(r) | (sign >> 28);
  return __float_as_uint(__fmul_rn(r, sb)) | sign;
}

template <bool FP16, bool CODES>
__device__ __forceinline__ void encode_block(const uint32_t (&w)[8], float c, float sb,
                                             uint32_t (&xh)[8], uint32_t (&cd)[2]) {
  cd[0] = cd[1] = 0;
#pragma unroll
  for (int i = 0; i < 8; i++) {
    float lo, hi;
    unpack<FP16>(w[i], lo, hi);
    uint32_t code_lo = 0, code_hi = 0;
    uint32_t bits_lo = encode<CODES>(lo, c, sb, code_lo);
    uint32_t bits_hi = encode<CODES>(hi, c, sb, code_hi);
    xh[i] = __byte_perm(bits_lo, bits_hi, 0x7632); /* the two BF16 halves, low element first */
    if (CODES)
      cd[i >> 2] |= (code_lo | (code_hi << 4)) << (8 * (i & 3));
  }
}

/* Rows r = blockIdx.x * TY + ty; thread tx owns blocks blockIdx.y * TX * NB + tx + j * TX. ROW: S
 * from the row's amax (the launcher makes one CTA span the whole row); else S from *p.amax. TILE:
 * 16x16 tiles, TY == 16, the tile's amax through shared memory. */
template <bool FP16, int NB, bool ROW, bool TILE>
__device__ __forceinline__ void quantize(const mt_quant_params &p) {
  const int tx = threadIdx.x, ty = threadIdx.y, TX = blockDim.x;
  const int nblk = p.cols >> 4;
  const int r = blockIdx.x * blockDim.y + ty;
  const bool row_ok = r < p.rows;
  const int b0 = blockIdx.y * (TX * NB) + tx;
  const char *xrow = (const char *)p.x + (size_t)(row_ok ? r : 0) * (size_t)p.ldx * 2;

  uint32_t w[NB][8], amax_b[NB];
#pragma unroll
  for (int j = 0; j < NB; j++) {
    const int b = b0 + j * TX;
    uint4 v0 = make_uint4(0, 0, 0, 0), v1 = v0;
    if (row_ok && b < nblk) {
      const uint4 *src = (const uint4 *)(xrow + (size_t)b * 32);
      v0 = src[0];
      v1 = src[1];
    }
    w[j][0] = v0.x, w[j][1] = v0.y, w[j][2] = v0.z, w[j][3] = v0.w;
    w[j][4] = v1.x, w[j][5] = v1.y, w[j][6] = v1.z, w[j][7] = v1.w;
    amax_b[j] = block_amax_bits<FP16>(w[j]);
  }

  float S;
  if (ROW) {
    uint32_t m = 0;
#pragma unroll
    for (int j = 0; j < NB; j++)
      m = max(m, amax_b[j]);
    for (int o = min(TX, 32) >> 1; o > 0; o >>= 1)
      m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (TX > 32) { /* TX is then a multiple of 32: every warp lies within one row */
      __shared__ uint32_t warp_max[kMaxThreads / 32];
      if ((tx & 31) == 0)
        warp_max[(ty * TX + tx) >> 5] = m;
      __syncthreads();
      const int first = (ty * TX) >> 5;
      for (int i = 0; i < (TX >> 5); i++)
        m = max(m, warp_max[first + i]);
    }
    S = outer_scale(__uint_as_float(m));
    if (tx == 0 && row_ok)
      p.outer[r] = S;
  } else {
    S = outer_scale(__uint_as_float(*p.amax));
    if (blockIdx.x == 0 && blockIdx.y == 0 && tx == 0 && ty == 0)
      p.outer[0] = S;
  }

  if (TILE) { /* NB == 1, TY == 16: the 16 rows of a CTA are one row of tiles */
    __shared__ uint32_t tile_max[kMaxThreads / 16];
    if (ty == 0)
      tile_max[tx] = 0;
    __syncthreads();
    atomicMax(&tile_max[tx], amax_b[0]);
    __syncthreads();
    amax_b[0] = tile_max[tx];
  }

  if (!row_ok)
    return;
  /* A domain holding NaN or Inf: codes, scales and xhat all 0; its NaN S makes the GEMM's
   * outputs NaN. */
  const bool domain_bad = !(S == S);
  const float inv_S = __frcp_rn(S);
  const float S_over_6 = __fmul_rn(S, kOneSixth);
  const size_t row_base = (size_t)r * (size_t)p.cols;
#pragma unroll
  for (int j = 0; j < NB; j++) {
    const int b = b0 + j * TX;
    if (b >= nblk)
      break;
    uint32_t xh[8] = {0, 0, 0, 0, 0, 0, 0, 0}, cd[2] = {0, 0}, sb_code = 0;
    if (!domain_bad) {
      sb_code = e4m3_rne_satfinite(__fmul_rn(__uint_as_float(amax_b[j]), S_over_6));
      const float sb = e4m3_to_float(sb_code);
      const float c = sb_code == 0 ? 0.0f : __frcp_rn(__fmul_rn(sb, inv_S));
      if (p.codes)
        encode_block<FP16, true>(w[j], c, sb, xh, cd);
      else
        encode_block<FP16, false>(w[j], c, sb, xh, cd);
    }
    uint4 *dst = (uint4 *)(p.xhat + row_base + (size_t)b * 16);
    dst[0] = make_uint4(xh[0], xh[1], xh[2], xh[3]);
    dst[1] = make_uint4(xh[4], xh[5], xh[6], xh[7]);
    if (p.codes)
      *(uint2 *)(p.codes + row_base / 2 + (size_t)b * 8) = make_uint2(cd[0], cd[1]);
    if (p.scales)
      p.scales[row_base / 16 + b] = (uint8_t)sb_code;
  }
}

/* max |x| over the whole matrix into *p.amax (FP32 bits; the launcher zeroes it first): one warp
 * per row at a time, four 16-byte loads in flight per lane, one atomicMax per warp. */
template <bool FP16> __device__ __forceinline__ void amax_pass(const mt_quant_params &p) {
  const int lane = threadIdx.x & 31;
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int nwarps = (gridDim.x * blockDim.x) >> 5;
  const int chunks = p.cols >> 3;
  uint32_t m = 0;
  for (int r = warp; r < p.rows; r += nwarps) {
    const uint4 *src = (const uint4 *)((const char *)p.x + (size_t)r * (size_t)p.ldx * 2);
    for (int c = lane; c < chunks; c += 4 * 32) {
      uint4 v[4];
#pragma unroll
      for (int u = 0; u < 4; u++)
        v[u] = (c + u * 32 < chunks) ? src[c + u * 32] : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int u = 0; u < 4; u++) {
        m = __vmaxu2(m, v[u].x & 0x7fff7fffu);
        m = __vmaxu2(m, v[u].y & 0x7fff7fffu);
        m = __vmaxu2(m, v[u].z & 0x7fff7fffu);
        m = __vmaxu2(m, v[u].w & 0x7fff7fffu);
      }
    }
  }
  uint32_t bits = __float_as_uint(abs_bits_to_float<FP16>(max(m & 0xffffu, m >> 16)));
  bits = __reduce_max_sync(0xffffffffu, bits);
  if (lane == 0 && bits != 0)
    atomicMax(p.amax, bits);
}

} // namespace

#define MT_QUANT_ROW(type, fp16, nb)                                                               \
  extern "C" __global__ void __launch_bounds__(kMaxThreads)                                        \
      mt_quant_row_##type##_nb##nb(const mt_quant_params p) {                                      \
    quantize<fp16, nb, true, false>(p);                                                            \
  }
MT_QUANT_ROW(bf16, false, 1)
MT_QUANT_ROW(bf16, false, 2)
MT_QUANT_ROW(bf16, false, 4)
MT_QUANT_ROW(bf16, false, 8)
MT_QUANT_ROW(fp16, true, 1)
MT_QUANT_ROW(fp16, true, 2)
MT_QUANT_ROW(fp16, true, 4)
MT_QUANT_ROW(fp16, true, 8)

#define MT_QUANT_TENSOR(type, fp16)                                                                \
  extern "C" __global__ void __launch_bounds__(kMaxThreads)                                        \
      mt_quant_tensor_##type(const mt_quant_params p) {                                            \
    quantize<fp16, 1, false, false>(p);                                                            \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(kMaxThreads)                                        \
      mt_quant_tile_##type(const mt_quant_params p) {                                              \
    quantize<fp16, 1, false, true>(p);                                                             \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(256) mt_quant_amax_##type(const mt_quant_params p) { \
    amax_pass<fp16>(p);                                                                            \
  }
MT_QUANT_TENSOR(bf16, false)
MT_QUANT_TENSOR(fp16, true)
