/* wstore.h — the layout of a weight quantized for the grouped GEMM (kernels/grouped.cu): NVFP4
 * codes and E4M3 block scales in the order the kernel's warps read them, 4.5 bits an element.
 * Plain C, included by the host code and the kernels.
 *
 * A weight of n rows (output channels) by k columns is cut into records of 8 rows x 32 columns
 * (two 16-element blocks of each row), 144 bytes:
 *   bytes 0..127   codes, lane l = 4g + q of a warp owning bytes 4l..4l+3: one code word of the
 *                  eight codes of row g that are its wgmma A fragments for the record's two k16
 *                  steps, as four pairs (element 2i in the low half of a BF16 pair, 2i + 1 in the
 *                  high): pair 0 = elements 2q, 2q+1 of the first block, pair 1 = 2q+8, 2q+9 of
 *                  the first block, pairs 2 and 3 the same of the second. The bits are placed so
 *                  that a pair decodes in one or two logic operations (mt_ws_word below).
 *   bytes 128..143 the block scales, 2 a row: row g's first block at 128 + 2g, its second after,
 *                  as scale bytes (mt_ws_scale_byte below).
 * Records are grouped into bands of 128 rows (16 row groups): band b holds rows 128b .. 128b+127,
 * its records ordered by column pair P, then row group: record (H, P) of band H / 16 at
 *   ((H / 16) * MT_WS_PAIRS(k) + P) * 16 + H % 16
 * records from the slice's start, so one stage of the kernel (128 rows x 64 or 128 columns) is one
 * contiguous run of 32 or 64 records. Columns are padded to a multiple of 128 and rows to a
 * multiple of 128 with zero records (zero codes and scales: they add +0 to a sum, which changes no
 * bits). After the records: the outer scales S (FP32), n of them (per row) or one (per tensor),
 * padded to a 256-byte section.
 *
 * An expert tensor [E][n][k] is E such slices of MT_WS_SLICE_BYTES each, back to back: the
 * kernel finds expert e's weight at base + e * slice bytes.
 */
#ifndef MT_WSTORE_H
#define MT_WSTORE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/hostdev.h"

#define MT_WS_REC 144
#define MT_WS_BAND 128                                   /* rows of a band */
#define MT_WS_PAIRS(k) ((((size_t)(k) + 127) / 128) * 4) /* column pairs of 32, padded to 128 */
#define MT_WS_BANDS(n) (((size_t)(n) + MT_WS_BAND - 1) / MT_WS_BAND)
#define MT_WS_BAND_BYTES(k) (MT_WS_PAIRS(k) * (MT_WS_BAND / 8) * MT_WS_REC)
#define MT_WS_RECORD_BYTES(n, k) (MT_WS_BANDS(n) * MT_WS_BAND_BYTES(k))
#define MT_WS_SECTION(b) ((((size_t)(b)) + 255) / 256 * 256)
/* outer scales: n floats (per row) or one; the per-tensor amax word of the quantizer after it */
#define MT_WS_OUTER_BYTES(n, row) MT_WS_SECTION(((row) ? (size_t)(n) : 2) * 4)
#define MT_WS_SLICE_BYTES(n, k, row)                                                               \
  (MT_WS_SECTION(MT_WS_RECORD_BYTES(n, k)) + MT_WS_OUTER_BYTES(n, row))

/* The code word. Code (s e1 e0 m) of E2M1 value v decodes, put in BF16 bits at sign 15 and
 * e1 e0 m at 8 7 6 (the exponent field's low bits and the mantissa's top), as v * 2^-126: for
 * e > 0 the BF16 2^(e - 127) * 1.m, for e = 0 the subnormal m * 2^-127. Pair p of a word sits
 * so that rotating the word left by MT_WS_EM_ROT(p) brings both codes' e1 e0 m to bits 8..6 and
 * 24..22, and rotating it by MT_WS_SIGN_ROT(p) their signs to bits 15 and 31: the kernel's decode
 * of a pair is the mask MT_WS_EM | MT_WS_SIGN of one rotation (pairs 0 and 1) or of two, 5
 * rotations and 6 logic operations a word (kernels/grouped.cu). These four placements are a
 * cheapest way for 8 codes to fill 32 bits (tiling the word with the four pairs' bits). Four of
 * the five rotations bring their masked bits up from below (all but pair 3's magnitudes, 12), so
 * they are left shifts, which the kernel runs on the FMA pipe instead of the logic unit's. */
#define MT_WS_EM_ROT(p) ((0x0C030600u >> (8 * (p))) & 31u)   /* 0, 6, 3, 12 */
#define MT_WS_SIGN_ROT(p) ((0x02010600u >> (8 * (p))) & 31u) /* 0, 6, 1, 2 */
#define MT_WS_EM 0x01C001C0u
#define MT_WS_SIGN 0x80008000u

/* The store's word of pair p's codes lo (element 2i) and hi (2i + 1), each sign in bit 3. */
MT_HD uint32_t mt_ws_pair_bits(int p, uint32_t lo, uint32_t hi) {
  const uint32_t em = MT_WS_EM_ROT(p), sg = MT_WS_SIGN_ROT(p);
  return (lo & 7u) << ((6u - em) & 31u) | (hi & 7u) << ((22u - em) & 31u) |
         (lo >> 3 & 1u) << (15u - sg) | (hi >> 3 & 1u) << (31u - sg);
}

/* The store's word of four pairs given as bytes (byte p: pair p's low code in the low nibble). */
MT_HD uint32_t mt_ws_word(uint32_t pairs) {
  uint32_t w = 0;
  for (int p = 0; p < 4; p++)
    w |= mt_ws_pair_bits(p, pairs >> (8 * p) & 15u, pairs >> (8 * p + 4) & 15u);
  return w;
}

/* The scale byte. A block scale (an E4M3 value: 0, 2^-9 .. 448, or NaN) is stored as the byte b
 * with BF16 bits b * 16 + MT_WS_SCALE_BF16 = the scale * 2^119 (a normal BF16: 2^110 .. 1.75 *
 * 2^127), so one multiply-add turns it into the BF16 factor of the decode: v * 2^-126 times the
 * scale * 2^119 is the dequantized element * 2^-7, a normal BF16 (2^-17 .. 21), exact; the GEMM's
 * epilogue multiplies its accumulator by 2^7 (exact). b is an unsigned exponent (5 bits, bias 9)
 * and 3 mantissa bits: the FP32 bits of the scale >> 20, less 118 << 3. Scale 0 (its codes are all
 * 0) shares byte 0 with 2^-9; NaN is 148. `bits` are the FP32 bits of the scale's value. */
#define MT_WS_SCALE_BF16 (237u << 7) /* 2^110: the BF16 of 2^-9 * 2^119 */
#define MT_WS_WEIGHT_SHIFT 7         /* the decoded weights are the dequantized ones * 2^-7 */
MT_HD uint32_t mt_ws_scale_byte(uint32_t bits) {
  if ((bits & 0x7fffffffu) == 0)
    return 0;
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return 148;
  return (bits >> 20) - (118u << 3);
}

#endif
