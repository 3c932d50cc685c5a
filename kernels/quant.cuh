/* quant.cuh — NVFP4 quantization, device side: the per-element and per-block steps of
 * mt_ref_quantize (ref/nvfp4.c) in the same IEEE FP32 operations and order, bit for bit. Used by
 * the quantization kernels of kernels/quant.cu, and meant for any kernel that wants to quantize
 * its own activations (a GEMM that fuses the step, say): a block of 16 elements given as 8 packed
 * BF16/FP16 pairs, its domain's S, and out come xhat, the codes and the E4M3 scale.
 *
 *   amax_b = mt_q::block_amax_bits<FP16>(w)                 per block, as FP32 bits
 *   S      = mt_q::outer_scale(max of amax_b over the domain) NaN when the domain held NaN or Inf:
 *                                                            then its xhat, codes, scales are 0
 *   scale  = mt_q::block<FP16, CODES>(w, amax_b, mt_q::S_over_6(S), mt_q::inv_S(S), xh, cd)
 *
 * Every step is rounded on its own (__fmul_rn, __frcp_rn, __fdiv_rn: no FMA contraction, correctly
 * rounded division, denormals kept), as the reference requires.
 */
#ifndef MT_QUANT_CUH
#define MT_QUANT_CUH

#include <cuda_fp16.h>
#include <stdint.h>

namespace mt_q {

constexpr float kOneSixth = 0x1.555556p-3f; /* the FP32 constant nearest 1/6, as the reference */
constexpr float kFltMax = 3.402823466e38f;

/* FP32 of a non-negative |x| given as BF16/FP16 bits (abs bits order like the values; NaN last). */
template <bool FP16> static __device__ __forceinline__ float abs_bits_to_float(uint32_t h) {
  if (FP16) return __half2float(__ushort_as_half((unsigned short)h));
  return __uint_as_float(h << 16);
}

template <bool FP16> static __device__ __forceinline__ void unpack(uint32_t w, float &lo, float &hi) {
  if (FP16) {
    lo = __half2float(__ushort_as_half((unsigned short)(w & 0xffffu)));
    hi = __half2float(__ushort_as_half((unsigned short)(w >> 16)));
  } else {
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xffff0000u);
  }
}

/* max |x| of 16 packed elements, as FP32 bits. */
template <bool FP16> static __device__ __forceinline__ uint32_t block_amax_bits(const uint32_t (&w)[8]) {
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < 8; i++) m = __vmaxu2(m, w[i] & 0x7fff7fffu);
  return __float_as_uint(abs_bits_to_float<FP16>(max(m & 0xffffu, m >> 16)));
}

/* mt_nvfp4_outer_scale: NaN for a NaN or Inf amax, 1 for 0, else 2688 / amax clamped. */
static __device__ __forceinline__ float outer_scale(float amax) {
  if (!(amax <= kFltMax)) return __uint_as_float(0x7fffffffu);
  if (amax == 0.0f) return 1.0f;
  return fminf(__fdiv_rn(2688.0f, amax), kFltMax);
}

/* E4M3 RNE satfinite: native on sm_89+ (NaN -> 0x7f, |v| > 448 -> 448, as the reference). */
static __device__ __forceinline__ uint32_t e4m3_rne_satfinite(float v) {
  unsigned short r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %1;" : "=h"(r) : "f"(v));
  return r & 0xffu;
}

/* The value of a non-negative, non-NaN E4M3 code (exact in FP32). */
static __device__ __forceinline__ float e4m3_to_float(uint32_t code) {
  uint32_t exp = code >> 3, man = code & 7u;
  if (exp == 0) return (float)man * 0x1p-9f;
  return __uint_as_float(((exp + 120u) << 23) | (man << 20));
}

/* |v| rounded to the E2M1 magnitudes {0, .5, 1, 1.5, 2, 3, 4, 6}, ties to even, saturating. Adding
 * and removing 2^22, 2^23 or 2^24 rounds to the E2M1 spacing of |v|'s binade (0.5 below 2, 1
 * below 4, 2 above) by the FPU's own RNE, so each tie lands on the even code exactly where the
 * reference's thresholds put it (.25->0 .75->1 1.25->1 1.75->2 2.5->2 3.5->4 5->4). Inf and NaN
 * give 6 (fminf drops the NaN), as mt_e2m1_rne_satfinite does. */
static __device__ __forceinline__ float e2m1_round(float a) {
  float magic = a < 2.0f ? 0x1p22f : (a < 4.0f ? 0x1p23f : 0x1p24f);
  return fminf(__fsub_rn(__fadd_rn(a, magic), magic), 6.0f);
}

/* The 3-bit E2M1 code of a magnitude e2m1_round returned: from its FP32 exponent and top
 * mantissa bit (1 -> 254 ... 6 -> 259), with 0.5 (252) and 0 special. */
static __device__ __forceinline__ uint32_t e2m1_code(float r) {
  uint32_t t = __float_as_uint(r) >> 22;
  return t >= 254u ? t - 252u : (uint32_t)(t != 0u);
}

/* One element: v = x * c_b (one rounding), its E2M1 magnitude r, xhat = +-r * s_b (exact). The
 * sign is v's: a NaN v (0 * Inf, when c_b overflowed) is the GPU's canonical positive NaN, so its
 * code is +6 as the reference wants. Returns xhat's FP32 bits (the low 16 are zero). */
template <bool CODES> static __device__ __forceinline__ uint32_t encode(float x, float c, float sb, uint32_t &code) {
  float v = __fmul_rn(x, c);
  float r = e2m1_round(fabsf(v));
  uint32_t sign = __float_as_uint(v) & 0x80000000u;
  if (CODES) code = e2m1_code(r) | (sign >> 28);
  return __float_as_uint(__fmul_rn(r, sb)) | sign;
}

template <bool FP16, bool CODES>
static __device__ __forceinline__ void encode_block(const uint32_t (&w)[8], float c, float sb, uint32_t (&xh)[8],
                                                    uint32_t (&cd)[2]) {
  cd[0] = cd[1] = 0;
#pragma unroll
  for (int i = 0; i < 8; i++) {
    float lo, hi;
    unpack<FP16>(w[i], lo, hi);
    uint32_t code_lo = 0, code_hi = 0;
    uint32_t bits_lo = encode<CODES>(lo, c, sb, code_lo);
    uint32_t bits_hi = encode<CODES>(hi, c, sb, code_hi);
    xh[i] = __byte_perm(bits_lo, bits_hi, 0x7632); /* the two BF16 halves, low element first */
    if (CODES) cd[i >> 2] |= (code_lo | (code_hi << 4)) << (8 * (i & 3));
  }
}

/* S * (1/6) and 1/S, once per domain: the two per-domain factors of mt_q_block. */
static __device__ __forceinline__ float S_over_6(float S) { return __fmul_rn(S, kOneSixth); }
static __device__ __forceinline__ float inv_S(float S) { return __frcp_rn(S); }

/* One block of 16 of a finite domain: its E4M3 scale code s_b = e4m3(amax_b * (S/6)), the encode
 * coefficient c_b = 1 / (s_b * (1/S)) (0 for a zero scale), and for each element its xhat (BF16
 * pairs in xh) and, with CODES, its packed codes (element 2i in the low nibble of byte i). */
template <bool FP16, bool CODES>
static __device__ __forceinline__ uint32_t block(const uint32_t (&w)[8], uint32_t amax_bits, float s_over_6,
                                                 float inv_s, uint32_t (&xh)[8], uint32_t (&cd)[2]) {
  const uint32_t sb_code = e4m3_rne_satfinite(__fmul_rn(__uint_as_float(amax_bits), s_over_6));
  const float sb = e4m3_to_float(sb_code);
  const float c = sb_code == 0 ? 0.0f : __frcp_rn(__fmul_rn(sb, inv_s));
  encode_block<FP16, CODES>(w, c, sb, xh, cd);
  return sb_code;
}

} // namespace mt_q

#endif
