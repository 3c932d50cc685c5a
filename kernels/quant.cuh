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

#include "kernels/wstore.h"

namespace mt_q {

constexpr float kOneSixth = 0x1.555556p-3f; /* the FP32 constant nearest 1/6, as the reference */
constexpr float kFltMax = 3.402823466e38f;

/* FP32 of a non-negative |x| given as BF16/FP16 bits (abs bits order like the values; NaN last). */
template <bool FP16> static __device__ __forceinline__ float abs_bits_to_float(uint32_t h) {
  if (FP16)
    return __half2float(__ushort_as_half((unsigned short)h));
  return __uint_as_float(h << 16);
}

template <bool FP16>
static __device__ __forceinline__ void unpack(uint32_t w, float &lo, float &hi) {
  if (FP16) {
    lo = __half2float(__ushort_as_half((unsigned short)(w & 0xffffu)));
    hi = __half2float(__ushort_as_half((unsigned short)(w >> 16)));
  } else {
    lo = __uint_as_float(w << 16);
    hi = __uint_as_float(w & 0xffff0000u);
  }
}

/* max |x| of 16 packed elements, as FP32 bits. */
template <bool FP16>
static __device__ __forceinline__ uint32_t block_amax_bits(const uint32_t (&w)[8]) {
  uint32_t m = 0;
#pragma unroll
  for (int i = 0; i < 8; i++)
    m = __vmaxu2(m, w[i] & 0x7fff7fffu);
  return __float_as_uint(abs_bits_to_float<FP16>(max(m & 0xffffu, m >> 16)));
}

/* mt_nvfp4_outer_scale: NaN for a NaN or Inf amax, 1 for 0, else 2688 / amax clamped. */
static __device__ __forceinline__ float outer_scale(float amax) {
  if (!(amax <= kFltMax))
    return __uint_as_float(0x7fffffffu);
  if (amax == 0.0f)
    return 1.0f;
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
  if (exp == 0)
    return (float)man * 0x1p-9f;
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
template <bool CODES>
static __device__ __forceinline__ uint32_t encode(float x, float c, float sb, uint32_t &code) {
  float v = __fmul_rn(x, c);
  float r = e2m1_round(fabsf(v));
  uint32_t sign = __float_as_uint(v) & 0x80000000u;
  if (CODES)
    code = e2m1_code(r) | (sign >> 28);
  return __float_as_uint(__fmul_rn(r, sb)) | sign;
}

template <bool FP16, bool CODES>
static __device__ __forceinline__ void encode_block(const uint32_t (&w)[8], float c, float sb,
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

/* S * (1/6) and 1/S, once per domain: the two per-domain factors of mt_q_block. */
static __device__ __forceinline__ float S_over_6(float S) { return __fmul_rn(S, kOneSixth); }
static __device__ __forceinline__ float inv_S(float S) { return __frcp_rn(S); }

/* One block of 16 of a finite domain: its E4M3 scale code s_b = e4m3(amax_b * (S/6)), the encode
 * coefficient c_b = 1 / (s_b * (1/S)) (0 for a zero scale), and for each element its xhat (BF16
 * pairs in xh) and, with CODES, its packed codes (element 2i in the low nibble of byte i). */
template <bool FP16, bool CODES>
static __device__ __forceinline__ uint32_t block(const uint32_t (&w)[8], uint32_t amax_bits,
                                                 float s_over_6, float inv_s, uint32_t (&xh)[8],
                                                 uint32_t (&cd)[2]) {
  const uint32_t sb_code = e4m3_rne_satfinite(__fmul_rn(__uint_as_float(amax_bits), s_over_6));
  const float sb = e4m3_to_float(sb_code);
  const float c = sb_code == 0 ? 0.0f : __frcp_rn(__fmul_rn(sb, inv_s));
  encode_block<FP16, CODES>(w, c, sb, xh, cd);
  return sb_code;
}

/* ---- the weight store's encode (kernels/wstore.h), the store quantizer's (kernels/quant.cu): here
 * beside the per-block steps, so that any kernel that writes a store writes it bit for bit
 * alike ---- */

/* The record's four code words of row r from its blocks b (codes cd0) and b + 1 (cd1): lane
 * 4g + q's word holds the pairs of code bytes q and q + 4 of each block, in the store's bit order
 * (kernels/wstore.h, mt_ws_word). */
static __device__ __forceinline__ void
record_words_of_codes(const uint32_t (&cd0)[2], const uint32_t (&cd1)[2], uint32_t (&word)[4]) {
  const uint32_t a01 = __byte_perm(cd0[0], cd0[1], 0x5140),
                 a23 = __byte_perm(cd0[0], cd0[1], 0x7362);
  const uint32_t b01 = __byte_perm(cd1[0], cd1[1], 0x5140),
                 b23 = __byte_perm(cd1[0], cd1[1], 0x7362);
  word[0] = mt_ws_word(__byte_perm(a01, b01, 0x5410)),
  word[1] = mt_ws_word(__byte_perm(a01, b01, 0x7632));
  word[2] = mt_ws_word(__byte_perm(a23, b23, 0x5410)),
  word[3] = mt_ws_word(__byte_perm(a23, b23, 0x7632));
}

/* Row r's part of one record (row g of it): its four code words (16 bytes) and its two blocks'
 * scale bytes (mt_ws_scale_byte). */
static __device__ __forceinline__ void store_record(uint8_t *rec, int g, const uint32_t (&word)[4],
                                                    uint32_t sc0, uint32_t sc1) {
  *(uint4 *)(rec + 16 * g) = make_uint4(word[0], word[1], word[2], word[3]);
  *(uint16_t *)(rec + 128 + 2 * g) = (uint16_t)(sc0 | sc1 << 8);
}

/* The store mode's encode (lab/NOTES.md, "Activation quantization"). mt_q::encode
 * spends ~15 ALU-pipe instructions an element (compares, selects, shifts, ORs: the ALU pipe issues
 * a warp instruction every second cycle), which made the record kernels ALU-bound; this one spends
 * ~3, its other work on the FMA pipe. The same codes, bit for bit, for every c_b the kernels meet
 * except c_b = +Inf (the caller takes mt_q::encode there): tests/cpu/test_quant_rec_encode.c
 * checks a C twin of this arithmetic against mt_e2m1_rne_satfinite over the FP32 range, and the
 * assembled words against the old byte order.
 *
 * E2M1 magnitude of a = |x| * c_b (finite or +Inf, never NaN since c_b is finite): with
 * n(u) = RNE(u) to an integer, code = min(n(2a), n(a) + 2, 6 + n(clamp(a/2 - 2, 0, 1))), each
 * term one FP32 rounding of an exact value (the FPU's own ties to even) onto the integer grid of
 * [2^23, 2^24): 2a + 2^23 in one FFMA, a + (2^23 + 2) in one FADD, the clamp as FFMA.SAT (a/2 - 2
 * is exact) then + (2^23 + 6). Rounding is monotone, so the min of the rounded terms is the
 * rounding of min(2a, a + 2, a/2 + 4) clamped at 7, which is E2M1's RNE code with saturation
 * (the last term also caps Inf and everything above 5 at 7). The three are positive floats of
 * one binade, so the min is one integer VIMNMX3 on their bits: 0x4B000000 + code. */
static __device__ __forceinline__ float fma_sat(float a, float b, float c) {
  float r;
  asm("fma.rn.sat.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
  return r;
}

static __device__ __forceinline__ uint32_t e2m1_mag_biased(float a) {
  const float t1 = __fmaf_rn(a, 2.0f, 0x1p23f);
  const float t2 = __fadd_rn(a, 0x1p23f + 2.0f);
  const float t3 = __fadd_rn(fma_sat(a, 0.5f, -2.0f), 0x1p23f + 6.0f);
  return __vimin3_u32(__float_as_uint(t1), __float_as_uint(t2), __float_as_uint(t3));
}

/* The bias that record_words's biased magnitudes add at the store's code positions
 * (mt_ws_pair_bits), negated: the sum starting from it ends as the codes alone (at most 7 in a
 * field of 3 bits, so no carries: the biases cancel modulo 2^32). */
static __host__ __device__ constexpr uint32_t word_bias_start() {
  uint32_t sum = 0;
  for (uint32_t p = 0; p < 4; p++)
    sum += (0x4B000000u << ((6u - MT_WS_EM_ROT(p)) & 31u)) +
           (0x4B000000u << ((22u - MT_WS_EM_ROT(p)) & 31u));
  return 0u - sum;
}

/* The four code words of a pair of blocks (words w0, w1, coefficients c0, c1, both finite), in the
 * store's bit order directly: word q's pairs 0..3 are the element pairs of w0[q], w0[q + 4], w1[q],
 * w1[q + 4]. Magnitudes: each biased code is added in at its position (an IMAD), from
 * word_bias_start. Sign: x * c_b has x's sign (c_b >= +0, and the product is not NaN), the
 * BF16/FP16 sign bits 15 and 31 of each source word, shifted to the pair's sign positions. */
template <bool FP16>
static __device__ __forceinline__ void record_words(const uint32_t (&w0)[8],
                                                    const uint32_t (&w1)[8], float c0, float c1,
                                                    uint32_t (&word)[4]) {
#pragma unroll
  for (int q = 0; q < 4; q++) {
    const uint32_t src[4] = {w0[q], w0[q + 4], w1[q], w1[q + 4]};
    uint32_t acc = word_bias_start(), sign = 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
      float lo, hi;
      unpack<FP16>(src[k], lo, hi);
      const float c = k < 2 ? c0 : c1;
      acc += e2m1_mag_biased(__fmul_rn(fabsf(lo), c)) << ((6u - MT_WS_EM_ROT(k)) & 31u);
      acc += e2m1_mag_biased(__fmul_rn(fabsf(hi), c)) << ((22u - MT_WS_EM_ROT(k)) & 31u);
      sign |= (src[k] & MT_WS_SIGN) >> MT_WS_SIGN_ROT(k);
    }
    word[q] = acc | sign;
  }
}

/* mt_q::e4m3_to_float without its branch: the code's exponent and mantissa fields moved to FP32's
 * (a subnormal E4M3 becomes a subnormal FP32), then the bias difference 2^(127 - 7) applied by an
 * exact multiply (denormals are kept). tests/cpu/test_quant_rec_encode.c checks all 127 codes. */
static __device__ __forceinline__ float e4m3_value(uint32_t code) {
  return __fmul_rn(__uint_as_float(code << 20), 0x1p120f);
}

/* mt_q::block's scale code and encode coefficient, alone. */
static __device__ __forceinline__ float block_coef(uint32_t amax_bits, float s_over_6, float inv_s,
                                                   uint32_t &sb_code, float &sb) {
  sb_code = e4m3_rne_satfinite(__fmul_rn(__uint_as_float(amax_bits), s_over_6));
  sb = e4m3_value(sb_code);
  return sb_code == 0 ? 0.0f : __frcp_rn(__fmul_rn(sb, inv_s));
}

/* The record words and scale bytes of a pair of blocks w0, w1 (amax_b amax0, amax1) of a finite
 * domain (S_over_6 and inv_S of its S): the store's bytes for them (kernels/wstore.h). */
template <bool FP16>
static __device__ __forceinline__ void
record_pair(const uint32_t (&w0)[8], const uint32_t (&w1)[8], uint32_t amax0, uint32_t amax1,
            float s_over_6, float inv_s, uint32_t (&word)[4], uint32_t &sc0, uint32_t &sc1) {
  uint32_t sb0, sb1;
  float f0, f1; /* the scales' values */
  const float c0 = block_coef(amax0, s_over_6, inv_s, sb0, f0);
  const float c1 = block_coef(amax1, s_over_6, inv_s, sb1, f1);
  sc0 = mt_ws_scale_byte(__float_as_uint(f0)), sc1 = mt_ws_scale_byte(__float_as_uint(f1));
  if (c0 <= kFltMax && c1 <= kFltMax) {
    record_words<FP16>(w0, w1, c0, c1, word);
  } else { /* c_b = +Inf (1/S subnormal): 0 * Inf is NaN, +6 whatever x's sign */
    uint32_t xh[8], cd0[2], cd1[2];
    encode_block<FP16, true>(w0, c0, f0, xh, cd0);
    encode_block<FP16, true>(w1, c1, f1, xh, cd1);
    record_words_of_codes(cd0, cd1, word);
  }
}

/* 16 bytes of a row: one vector load, or (a pointer array's base, which the host cannot check)
 * eight 2-byte loads where the address is not 16-byte aligned. The same bytes either way. */
static __device__ __forceinline__ uint4 load16(const char *at, bool loose) {
  if (!loose || ((uintptr_t)at & 15u) == 0)
    return *(const uint4 *)at;
  const uint16_t *h = (const uint16_t *)at;
  return make_uint4(h[0] | (uint32_t)h[1] << 16, h[2] | (uint32_t)h[3] << 16,
                    h[4] | (uint32_t)h[5] << 16, h[6] | (uint32_t)h[7] << 16);
}

/* max |x| of the row of `cols` elements at src, as FP32 bits, by a warp (lane `lane`), in every
 * lane: four 16-byte loads in flight a lane (LOOSE: src need not be 16-byte aligned, load16). */
template <bool FP16, bool LOOSE>
static __device__ __forceinline__ uint32_t row_amax_bits(const char *src, int cols, int lane) {
  const int chunks = cols >> 3;
  uint32_t m = 0;
  for (int c = lane; c < chunks; c += 4 * 32) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; u++)
      v[u] = (c + u * 32 < chunks) ? load16(src + (size_t)(c + u * 32) * 16, LOOSE)
                                   : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < 4; u++) {
      m = __vmaxu2(m, v[u].x & 0x7fff7fffu);
      m = __vmaxu2(m, v[u].y & 0x7fff7fffu);
      m = __vmaxu2(m, v[u].z & 0x7fff7fffu);
      m = __vmaxu2(m, v[u].w & 0x7fff7fffu);
    }
  }
  return __reduce_max_sync(0xffffffffu,
                           __float_as_uint(abs_bits_to_float<FP16>(max(m & 0xffffu, m >> 16))));
}

/* The same of `cols` elements `step` bytes apart (a row of a weight stored [in][out]): a 2-byte
 * load a lane at a time, the warp's loads each in another stored row. */
template <bool FP16>
static __device__ __forceinline__ uint32_t row_amax_strided(const char *src, int cols, size_t step,
                                                            int lane) {
  uint32_t m = 0;
  for (int c = lane; c < cols; c += 32)
    m = max(m, *(const uint16_t *)(src + (size_t)c * step) & 0x7fffu);
  return __reduce_max_sync(0xffffffffu, __float_as_uint(abs_bits_to_float<FP16>(m)));
}

} // namespace mt_q

#endif
