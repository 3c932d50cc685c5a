/* wstore.h — the layout of a weight quantized for the grouped GEMM (kernels/grouped.cu): NVFP4
 * codes and E4M3 block scales in the order the kernel's warps read them, 4.5 bits an element.
 * Plain C, included by the host code and the kernels.
 *
 * A weight of n rows (output channels) by k columns is cut into records of 8 rows x 32 columns
 * (two 16-element blocks of each row), 144 bytes:
 *   bytes 0..127   codes, lane l = 4g + q of a warp owning bytes 4l..4l+3: code byte q of row g's
 *                  first block (elements 2q, 2q+1 in its low and high nibble), its byte q + 4
 *                  (elements 2q+8, 2q+9), then the same two bytes of row g's second block. These
 *                  are the operands of one mma.sync m16n8k16 fragment (or of a wgmma A fragment's
 *                  half) for each of the record's two k16 steps, so a lane decodes its own word.
 *   bytes 128..143 the E4M3 scales, 2 a row: row g's first block at 128 + 2g, its second after.
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

#define MT_WS_REC 144
#define MT_WS_BAND 128                                   /* rows of a band */
#define MT_WS_PAIRS(k) ((((size_t)(k) + 127) / 128) * 4) /* column pairs of 32, padded to 128 */
#define MT_WS_BANDS(n) (((size_t)(n) + MT_WS_BAND - 1) / MT_WS_BAND)
#define MT_WS_BAND_BYTES(k) (MT_WS_PAIRS(k) * (MT_WS_BAND / 8) * MT_WS_REC)
#define MT_WS_RECORD_BYTES(n, k) (MT_WS_BANDS(n) * MT_WS_BAND_BYTES(k))
#define MT_WS_SECTION(b) ((((size_t)(b)) + 255) / 256 * 256)
/* outer scales: n floats (per row) or one; the per-tensor amax word of the quantizer after it */
#define MT_WS_OUTER_BYTES(n, row) MT_WS_SECTION(((row) ? (size_t)(n) : 2) * 4)
#define MT_WS_SLICE_BYTES(n, k, row) (MT_WS_SECTION(MT_WS_RECORD_BYTES(n, k)) + MT_WS_OUTER_BYTES(n, row))

#endif
