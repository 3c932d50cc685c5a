/* test_quant_rec_encode.c — a host twin of the record-mode encode of kernels/quant.cu (v2:
 * e2m1_mag_biased, record_words, e4m3_value), checked against the reference (ref/nvfp4.c) and
 * against the reference codes in the store's bit order (record_words_of_codes over mt_q's code
 * words, then kernels/wstore.h's mt_ws_word), and the decode of that order that kernels/grouped.cu
 * does. The twin does the same IEEE FP32 operations as the device code (fmaf = FFMA, one rounding;
 * fma.rn.sat = that rounding, then a clamp to [0, 1]; adds and multiplies rounded each on their
 * own: C11 on x86-64 does not contract); prmt is emulated with its sign-replicating selectors.
 * The GPU side (records bit for bit against mt_ref_quantize) is tests/gpu/test_kernels.c's.
 * MT_EXHAUSTIVE=1 checks every non-negative FP32 (a minute); by default a stride and the
 * neighbourhoods of every rounding threshold and binade edge. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/wstore.h"
#include "ref/nvfp4.h"
#include "tests/cpu/floatbits.h"
#include "tests/harness.h"

static float fma_sat(float a, float b, float c) {
  float r = fmaf(a, b, c);
  return r > 0.0f ? (r < 1.0f ? r : 1.0f) : 0.0f; /* NaN -> 0, as PTX's .sat */
}

static uint32_t min3_u32(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t m = a < b ? a : b;
  return m < c ? m : c;
}

/* quant.cu: e2m1_mag_biased */
static uint32_t mag_biased(float a) {
  float t1 = fmaf(a, 2.0f, 0x1p23f);
  float t2 = a + (0x1p23f + 2.0f);
  float t3 = fma_sat(a, 0.5f, -2.0f) + (0x1p23f + 6.0f);
  return min3_u32(bits_of(t1), bits_of(t2), bits_of(t3));
}

/* PTX prmt.b32, generic mode: bytes 0-3 of a, 4-7 of b; selector bit 3 replicates the sign. */
static uint32_t prmt(uint32_t a, uint32_t b, uint32_t sel) {
  uint64_t in = (uint64_t)b << 32 | a;
  uint32_t r = 0;
  for (int n = 0; n < 4; n++) {
    uint32_t s = (sel >> (4 * n)) & 0xf;
    uint32_t byte = (uint32_t)(in >> (8 * (s & 7))) & 0xff;
    if (s & 8)
      byte = (byte & 0x80) ? 0xff : 0;
    r |= byte << (8 * n);
  }
  return r;
}

/* CUDA's __byte_perm: the low 3 bits of each selector nibble. */
static uint32_t byte_perm(uint32_t a, uint32_t b, uint32_t sel) { return prmt(a, b, sel & 0x7777); }

static void unpack(uint32_t w, int fp16, float *lo, float *hi) {
  if (fp16) {
    *lo = mt_fp16_to_float((uint16_t)(w & 0xffff));
    *hi = mt_fp16_to_float((uint16_t)(w >> 16));
  } else {
    *lo = float_of(w << 16);
    *hi = float_of(w & 0xffff0000u);
  }
}

/* quant.cu: word_bias_start */
static uint32_t word_bias_start(void) {
  uint32_t sum = 0;
  for (uint32_t p = 0; p < 4; p++)
    sum += (0x4B000000u << ((6u - MT_WS_EM_ROT(p)) & 31u)) +
           (0x4B000000u << ((22u - MT_WS_EM_ROT(p)) & 31u));
  return 0u - sum;
}

/* quant.cu: record_words */
static void record_words(const uint32_t w0[8], const uint32_t w1[8], float c0, float c1, int fp16,
                         uint32_t word[4]) {
  for (int q = 0; q < 4; q++) {
    const uint32_t src[4] = {w0[q], w0[q + 4], w1[q], w1[q + 4]};
    uint32_t acc = word_bias_start(), sign = 0;
    for (int k = 0; k < 4; k++) {
      float lo, hi;
      unpack(src[k], fp16, &lo, &hi);
      float c = k < 2 ? c0 : c1;
      acc += mag_biased(fabsf(lo) * c) << ((6u - MT_WS_EM_ROT(k)) & 31u);
      acc += mag_biased(fabsf(hi) * c) << ((22u - MT_WS_EM_ROT(k)) & 31u);
      sign |= (src[k] & MT_WS_SIGN) >> MT_WS_SIGN_ROT(k);
    }
    word[q] = acc | sign;
  }
}

/* The words from the reference codes: packed as mt_q::encode_block does, then quant.cu's
 * record_words_of_codes (pairs of code bytes, then the store's bit order, mt_ws_word). */
static void record_words_ref(const uint32_t w0[8], const uint32_t w1[8], float c0, float c1,
                             int fp16, uint32_t word[4]) {
  uint32_t cd[2][2] = {{0, 0}, {0, 0}};
  for (int blk = 0; blk < 2; blk++)
    for (int i = 0; i < 8; i++) {
      float lo, hi, c = blk ? c1 : c0;
      unpack(blk ? w1[i] : w0[i], fp16, &lo, &hi);
      uint32_t code_lo = mt_e2m1_rne_satfinite(lo * c), code_hi = mt_e2m1_rne_satfinite(hi * c);
      cd[blk][i >> 2] |= (code_lo | code_hi << 4) << (8 * (i & 3));
    }
  uint32_t a01 = byte_perm(cd[0][0], cd[0][1], 0x5140), a23 = byte_perm(cd[0][0], cd[0][1], 0x7362);
  uint32_t b01 = byte_perm(cd[1][0], cd[1][1], 0x5140), b23 = byte_perm(cd[1][0], cd[1][1], 0x7362);
  word[0] = mt_ws_word(byte_perm(a01, b01, 0x5410)),
  word[1] = mt_ws_word(byte_perm(a01, b01, 0x7632));
  word[2] = mt_ws_word(byte_perm(a23, b23, 0x5410)),
  word[3] = mt_ws_word(byte_perm(a23, b23, 0x7632));
}

static int mag_ok(uint32_t u) {
  float a = float_of(u);
  return mag_biased(a) - 0x4B000000u == (uint32_t)(mt_e2m1_rne_satfinite(a) & 7);
}

/* Every non-negative non-NaN FP32 from 0 to +Inf: a stride (all with MT_EXHAUSTIVE=1), and 2^16
 * neighbours on each side of every threshold, binade edge and saturation point. */
static void magnitude_codes(void) {
  const char *ex = getenv("MT_EXHAUSTIVE");
  uint32_t step = ex && *ex == '1' ? 1 : 997, bad = 0, first_bad = 0;
  for (uint64_t u = 0; u <= 0x7f800000u; u += step)
    if (!mag_ok((uint32_t)u) && bad++ == 0)
      first_bad = (uint32_t)u;
  static const float edges[] = {0.25f,   0.5f,    0.75f,     1.0f,      1.25f,        1.5f,
                                1.75f,   2.0f,    2.5f,      3.0f,      3.5f,         4.0f,
                                5.0f,    6.0f,    7.0f,      8.0f,      16.0f,        0x1p22f,
                                0x1p23f, 0x1p24f, 0x1p-126f, 0x1p-149f, 3.4028234e38f};
  for (size_t e = 0; e < sizeof edges / sizeof edges[0]; e++) {
    int64_t c = bits_of(edges[e]);
    for (int64_t u = c - 65536; u <= c + 65536; u++)
      if (u >= 0 && u <= 0x7f800000 && !mag_ok((uint32_t)u) && bad++ == 0)
        first_bad = (uint32_t)u;
  }
  CHECKF(bad == 0, "%u values wrong, first %a", bad, (double)float_of(first_bad));
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next32(void) {
  rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
  return (uint32_t)(rng >> 16);
}

/* A random finite BF16 or FP16 element: all bit patterns but Inf and NaN (the kernels' fast path
 * runs only on finite domains), zeros of both signs and subnormals included. */
static uint16_t element(int fp16) {
  for (;;) {
    uint16_t h = (uint16_t)next32();
    if (next32() % 8 == 0)
      h &= 0x8000; /* +-0 */
    uint16_t exp_mask = fp16 ? 0x7c00 : 0x7f80;
    if ((h & exp_mask) != exp_mask)
      return h;
  }
}

/* A finite encode coefficient c_b >= +0 as the kernels meet them: 0, typical 6 / amax_b, and the
 * extremes (huge when 1/S is subnormal), so that x * c_b also overflows to Inf now and then. */
static float coefficient(void) {
  switch (next32() % 6) {
  case 0:
    return 0.0f;
  case 1:
    return 3.4028234e38f;
  case 2:
    return float_of(0x7f000000u | (next32() & 0x7fffffu)); /* 2^127 .. */
  case 3:
    return float_of(next32() & 0x7f7fffffu); /* any non-negative finite */
  default:
    return 6.0f / float_of(0x30000000u + next32() % 0x10000000u); /* 6 / (2^-31 .. 2) */
  }
}

/* Per element: sign of x | magnitude of |x| * c_b equals the reference code of x * c_b. */
static void element_codes(void) {
  int bad = 0;
  for (int fp16 = 0; fp16 < 2; fp16++)
    for (int i = 0; i < 2000000; i++) {
      uint16_t h = element(fp16);
      float x = fp16 ? mt_fp16_to_float(h) : mt_bf16_to_float(h), c = coefficient();
      uint32_t code = (mag_biased(fabsf(x) * c) - 0x4B000000u) | ((h & 0x8000) ? 8 : 0);
      if (code != mt_e2m1_rne_satfinite(x * c) && bad++ < 3)
        CHECKF(0, "fp16=%d x=%a c=%a: %u, reference %u", fp16, (double)x, (double)c, code,
               mt_e2m1_rne_satfinite(x * c));
    }
  CHECK(bad == 0);
}

/* Whole pairs of blocks: the four words in the record's byte order. */
static void record_word_order(void) {
  int bad = 0;
  for (int fp16 = 0; fp16 < 2; fp16++)
    for (int i = 0; i < 200000; i++) {
      uint32_t w0[8], w1[8], got[4], want[4];
      for (int j = 0; j < 8; j++) {
        w0[j] = element(fp16) | (uint32_t)element(fp16) << 16;
        w1[j] = element(fp16) | (uint32_t)element(fp16) << 16;
      }
      float c0 = coefficient(), c1 = coefficient();
      record_words(w0, w1, c0, c1, fp16, got);
      record_words_ref(w0, w1, c0, c1, fp16, want);
      if (memcmp(got, want, sizeof got) != 0 && bad++ < 3)
        CHECKF(0, "fp16=%d c0=%a c1=%a: %08x %08x %08x %08x, want %08x %08x %08x %08x", fp16,
               (double)c0, (double)c1, got[0], got[1], got[2], got[3], want[0], want[1], want[2],
               want[3]);
    }
  CHECK(bad == 0);
}

/* quant.cu: e4m3_value, every non-negative non-NaN code. */
static void e4m3_values(void) {
  for (uint32_t code = 0; code < 0x7f; code++) {
    float v = float_of(code << 20) * 0x1p120f;
    CHECKF(bits_of(v) == bits_of(mt_e4m3_to_float((uint8_t)code)), "code %#x: %a", code, (double)v);
  }
}

/* The BF16 bits as a float. */
static float bf16_value(uint32_t h) { return float_of(h << 16); }

/* grouped.cu: code_pair, rotations and masks. */
static uint32_t rotl(uint32_t w, uint32_t r) { return r ? w << r | w >> (32 - r) : w; }
static uint32_t code_pair(uint32_t w, int p) {
  uint32_t em = MT_WS_EM_ROT(p), sg = MT_WS_SIGN_ROT(p);
  return (rotl(w, em) & MT_WS_EM) | (rotl(w, sg) & MT_WS_SIGN);
}

/* The store's decode (kernels/wstore.h, grouped.cu's record_frags), every code in every position
 * and every scale: the four pairs' bits tile the word; a pair's BF16 bits are its codes * 2^-126;
 * the scale byte's BF16 is the scale * 2^119; their product (the kernel's BF16 multiply) is the
 * dequantized element * 2^-7, exact and a normal BF16. */
static void store_decode(void) {
  uint32_t all = 0;
  for (int p = 0; p < 4; p++) {
    uint32_t bits = mt_ws_pair_bits(p, 15, 15);
    CHECKF((all & bits) == 0, "pair %d overlaps: %08x", p, all & bits);
    all |= bits;
  }
  CHECKF(all == 0xffffffffu, "the pairs leave bits %08x", ~all);
  int bad = 0;
  for (int p = 0; p < 4; p++)
    for (uint32_t lo = 0; lo < 16; lo++)
      for (uint32_t hi = 0; hi < 16; hi++) {
        /* the other pairs' codes random: they must not leak into this one */
        uint32_t w = mt_ws_pair_bits(p, lo, hi);
        for (int o = 0; o < 4; o++)
          if (o != p)
            w |= mt_ws_pair_bits(o, next32() & 15, next32() & 15);
        uint32_t pair = code_pair(w, p);
        float vlo = bf16_value(pair & 0xffff) * 0x1p126f, vhi = bf16_value(pair >> 16) * 0x1p126f;
        if ((bits_of(vlo) != bits_of(mt_e2m1_to_float((uint8_t)lo)) ||
             bits_of(vhi) != bits_of(mt_e2m1_to_float((uint8_t)hi))) &&
            bad++ < 3)
          CHECKF(0, "pair %d codes %x %x: %a %a", p, lo, hi, (double)vlo, (double)vhi);
      }
  for (uint32_t code = 0; code <= 0x7f; code++) {
    float s = mt_e4m3_to_float((uint8_t)code);
    uint32_t b = mt_ws_scale_byte(bits_of(s));
    CHECKF(b < 256, "code %#x: byte %u", code, b);
    float f = bf16_value(b * 16 + MT_WS_SCALE_BF16);
    if (s != s) {
      CHECKF(f != f, "code %#x (NaN): byte %u is %a", code, b, (double)f);
      continue;
    }
    if (s == 0) /* its codes are all zero: any finite factor */
      continue;
    CHECKF(f * 0x1p-119f == s, "code %#x: byte %u is %a, want %a * 2^119", code, b, (double)f,
           (double)s);
    for (uint32_t c = 0; c < 16; c++) {
      float want = mt_e2m1_to_float((uint8_t)c) * s; /* exact: at most 6 significant bits */
      float got =
          bf16_value(code_pair(mt_ws_pair_bits(0, c, 0), 0) & 0xffff) * f; /* exact in FP32 */
      CHECKF(got == want * 0x1p-7f && (bits_of(got) & 0xffff) == 0 &&
                 (got == 0 || fabsf(got) >= 0x1p-126f),
             "code %x scale %#x: %a, want %a * 2^-7, a normal BF16", c, code, (double)got,
             (double)want);
    }
  }
  CHECK(bad == 0);
}

int main(void) {
  RUN(magnitude_codes);
  RUN(element_codes);
  RUN(record_word_order);
  RUN(e4m3_values);
  RUN(store_decode);
  return mt_test_done();
}
