/* instr.h — the instruments' device side (kernels/instr.cu) and its host twin: the result block
 * one instrumented call fills, the kernels' by-value arguments, and the hash and sketch math of
 * the row digests (scheme MT_INSTR_SCHEME of tools/minite-compare), written once for both sides.
 *
 * Plain C, included by the .cu (the MT_HD functions are then __host__ __device__), by
 * kernels/instr.c and shim/instr.c, and by the fake libcuda of the CPU tests, which runs the same
 * functions on the host in place of the kernels.
 *
 * Hashes (all 64-bit, wrap-around arithmetic):
 *   mix64(z)               splitmix64's finalizer (as kernels/wcheck.cu)
 *   piece(i, lo, hi)       mix64(lo + G (2i + 1)) ^ mix64(hi ^ H (i + 1)): the i-th 16-byte piece
 *                          of a byte string, lo/hi its two little-endian 8-byte halves
 *   content_sum(bytes)     sum of piece(i, ...) over the pieces, the last one zero-padded
 *   weight_sum(W)          the sum of piece(i, ...) over the pieces of W's sampled lines only,
 *                          pieces numbered row-major (i = row * K / 8 + piece of the row): W's rows
 *                          cut in 128-byte lines (the last of a row may be short), numbered
 *                          row-major, and of those the lines kernels/whash.h samples at
 *                          MT_SAMPLE_STEP, 1/512 of them in 1 KB runs. It is the hash the frozen
 *                          cache keeps under frozen-sampled (kernels/whash.cuh), so there a
 *                          weight's identity costs nothing, and elsewhere it reads 1/512 of W. A
 *                          weight stored [in][out] has the id of the same [out][in] matrix: its
 *                          sampled lines are gathered element by element (2-byte loads, each in
 *                          another stored row), whatever the cache keeps.
 *                          Two weights that differ only outside the sample share an id: their
 *                          rows then join and show as differing, never as silently equal.
 *   tag(len, type)         mix64(len << 4 | (type + 1)), type an mt_dtype
 *   row hash               mix64(content_sum(x row, K elements) ^ tag(K, xtype))
 *   lead hash              mix64(content_sum(the x row's first min(K, MT_INSTR_LEAD) elements)
 *                          ^ tag(K, xtype)): the row hash when K <= MT_INSTR_LEAD
 *   output hash            mix64(content_sum(y row, N elements) ^ tag(N, ytype))
 *   weight id              mix64(weight_sum(W, N rows of K) ^ tag(N << 28 | K, wtype))
 *   bias id                0 without bias; else mix64(content_sum(bias) ^ tag(N, biastype))
 *   key                    fold(KEY_SEED, row hash, weight id, ytype + 1, bits of alpha, bias id)
 *                          with fold(h, v) = mix64(h ^ v), left to right
 * A row is digested when its lead hash is below the rate as a fraction of 2^64 (every row when the
 * rate is 1), so two processes pick the same rows whatever their batches; choosing by the lead
 * reads 256 bytes of a row that is not digested, where the whole row's hash read all of every row
 * (46 MB a Qwen3 layer at 1,024 tokens, for 1/64 of its rows).
 */
#ifndef MT_INSTR_H
#define MT_INSTR_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/hostdev.h"
#include "kernels/whash.h"

/* The digest records' scheme (tools/minite-compare): a new number whenever a key, an output hash
 * or a sketch would differ for the same row. 3: the weight's identity over 1/512 of its lines
 * (MT_SAMPLE_STEP; scheme 2 sampled 1/64, so its keys never equal scheme 3's). */
#define MT_INSTR_SCHEME 3
#define MT_INSTR_SKETCH 8
#define MT_INSTR_SKETCH_SEED 0x6D696E6974652D31ull /* "minite-1" */
#define MT_INSTR_KEY_SEED 0x6D696E6974656B31ull    /* "minitek1" */
#define MT_INSTR_MUL_G 0x9E3779B97F4A7C15ull
#define MT_INSTR_MUL_H 0xD6E8FEB86659FD93ull
#define MT_INSTR_PROBE_ROWS 4   /* rows a probe recomputes alone: first, last, two between */
#define MT_INSTR_SHADOW_ROWS 8  /* rows of a grouped call its shadow recomputes (no cuBLAS call) */
#define MT_INSTR_LEAD 128       /* elements of a row the digests' choice reads (16 pieces) */
#define MT_INSTR_SMEM_SEGS 1024 /* a grouped call's offsets the digest reads into shared memory */
#define MT_INSTR_DIGEST_WARPS 8 /* rows a digest's CTA takes, a warp a row's lead */
/* The flag's bit of an empty publication: a call with only digests and no row chosen, for which
 * mt_instr_finish writes the flag alone (seq | MT_INSTR_EMPTY), not the block; sequences stay
 * below it. */
#define MT_INSTR_EMPTY 0x80000000u

/* One digested row, as the kernel writes it; the key is finished on the host. In a grouped call
 * the row's segment (which expert) and that expert's weight_sum (mt_instr_finish sums each
 * distinct segment once, into the first row of it; wsum 0 in the others). */
typedef struct {
  uint64_t row_hash, out_hash;
  float sketch[MT_INSTR_SKETCH];
  uint64_t wsum;
  int32_t seg, pad;
} mt_instr_row;

/* What one instrumented call's kernels fill, then published to the host by mt_instr_finish, which
 * also zeroes it for the slot's next use, all but `replays` (a slot's header up to `replays` is
 * zeroed with a memset before its first use). */
typedef struct {
  uint64_t wsum;     /* weight_sum of the weight (0 when no row was digested) */
  uint64_t bsum;     /* content_sum of the bias */
  uint32_t selected; /* rows whose row hash passed the rate (may exceed the rows kept) */
  uint32_t probe_differing;
  double shadow_d2, shadow_r2; /* sum (y - ref)^2 and sum ref^2 over finite elements */
  uint32_t shadow_max_bits;  /* max |y - ref| (a non-negative float's bits: ordered as integers) */
  uint32_t shadow_nonfinite; /* elements where y or ref is NaN or Inf */
  uint32_t probe_max_bits;   /* max |in-batch - alone| over the probed rows */
  uint32_t finished;         /* CTAs of mt_instr_finish done (the last one publishes) */
  uint32_t probe_outside;    /* probed rows of a grouped call in no segment (not compared) */
  /* A captured slot's publications so far, its seqlock's count kept on the device: replay c
   * writes the flag 2c + 1, then the block, then 2c + 2 (no read of the host's flag, a round trip
   * over the bus). Never zeroed: it starts at what the device memory held, so the host counts the
   * replays it missed from the first it reads (shim/instr_writer.c). */
  uint32_t replays;
} mt_instr_header;

/* mt_instr_digest: a warp per row of x (m rows) for its lead. A grouped call's rows: with offs
 * (device, nseg cumulative ends) row r is in the first segment s with offs[s] > r (rows in none
 * are skipped); with seg_rows > 0, segment r / seg_rows, at x + s * stride_x + (r % seg_rows) *
 * ldx (y alike); with x_rows and y_rows, at x + x_rows[r] * ldx and y + y_rows[r] * ldy. */
typedef struct {
  const void *x; /* [m][k] 2-byte elements, row stride ldx (elements) */
  const void *y; /* [m][n] 2-byte elements, row stride ldy */
  int64_t ldx, ldy;
  int32_t m, n, k, xtype, ytype, all; /* all: every row is digested */
  uint64_t threshold;                 /* a row is digested when its row hash < threshold */
  mt_instr_header *hdr;
  mt_instr_row *rows; /* room for cap rows */
  int32_t cap, nseg;
  const int32_t *offs;
  int64_t stride_x, stride_y;
  int32_t seg_rows;
  uint32_t every; /* with tick: a captured call digests the replays whose *tick % every is 0 */
  /* NULL, or (a grouped call in vLLM's dispatch) device lists of each row's row of x and of y:
   * row r reads x row x_rows[r] and y row y_rows[r] (offs still gives its segment) */
  const int32_t *x_rows, *y_rows;
  /* NULL (every call digests), or a captured call's count of its replays, which its finish
   * raises at the end of each (mt_instr_finish_args.tick) */
  const uint32_t *tick;
} mt_instr_digest_args;

/* mt_instr_finish, the last kernel of an instrumented call: the weight's weight_sum and the bias's
 * content sum (only when a row was digested), then, in the last CTA to finish, the publication: the
 * header and the digested rows copied into mapped pinned host memory, the header zeroed, the
 * slot's flag set to seq (the host polls it: no CUDA call is needed to learn that the results are
 * there). */
typedef struct {
  const void *w; /* [n][k] 2-byte elements, row stride ldw; NULL: no digest in this call */
  int64_t ldw;
  int64_t w_stride; /* grouped (> 0 or shared): segment s's weight at w + s * w_stride, each
                       digested row's own weight summed into its row (once a segment) */
  int32_t grouped;
  int32_t in_out; /* w (each segment's) is stored [in][out]: element (r, c) at c * ldw + r; the
                     sum is the [n][k] matrix's (mt_instr_weight_sum_of) */
  /* NULL, or the frozen-sampled cache's stored hashes, which are the weight_sums (nothing is read
   * from w then): the weight's at frozen_sum[0]; a grouped call's segment s's at
   * frozen_sum[s * frozen_stride] (kernels/wcheck.h, mt_wcheck_slice.hash; stride 0: one weight) */
  const uint64_t *frozen_sum;
  int64_t frozen_stride;
  const void *bias; /* NULL or bias_bytes of bias */
  int64_t bias_bytes;
  int32_t n, k;
  mt_instr_header *hdr; /* followed by the rows */
  void *dst;            /* mapped pinned host block (device address) */
  uint32_t *flag;       /* mapped pinned host word (device address) */
  int32_t cap;          /* rows the block holds */
  /* The flag's value once the block is published; 0 in a call captured in a CUDA graph, whose
   * digesting replays publish into the same block: the flag is then a seqlock over the header's
   * `replays` count, odd while the block is written and the next even value once it is whole (the
   * host reads a block whole when the flag is even and the same before and after its copy) */
  uint32_t seq;
  /* 1: the call has no probe or shadow, so that with no row chosen it reports nothing: the finish
   * then writes the flag alone, seq | MT_INSTR_EMPTY, and the block keeps what an earlier use left
   * (the host reads it as empty); a captured call's replay writes nothing (the host reads the
   * replays that chose a row) */
  int32_t empty_ok;
  uint32_t *tick; /* NULL, or the captured call's replay count, raised once a replay */
} mt_instr_finish_args;

/* mt_instr_shadow: the shadow error of y against ref (same layout: row r at r * ld, or in a
 * strided batch of seg_rows rows a problem, stride elements apart, as mt_instr_row_offset says). */
typedef struct {
  const void *y, *ref;
  int64_t ld, stride;
  int32_t m, n, type, seg_rows;
  mt_instr_header *hdr;
} mt_instr_shadow_args;

/* mt_instr_shadow_rows: the shadow error of a grouped call that has no cuBLAS call to rerun
 * (torch._grouped_mm) on rows[0 .. nrows) of its rows, against the FP32 product the kernel forms
 * itself, ref = alpha * sum_k x[r][k] W_s[j][k] over the 2-byte operands in k order (what cuBLAS's
 * BF16 GEMM rounds to its output). Row r is in segment s (with offs the first s with offs[s] > r,
 * none past the last: skipped; else r / seg_rows), at x + mt_instr_row_offset(s, seg_rows,
 * stride_x, ldx, r) and y likewise (stride_y, ldy); W_s at w + s * w_stride, [n][k] with row
 * stride ldw, or [k][n] where in_out. A CTA for each 256 columns of a row. */
typedef struct {
  const void *x, *y, *w;
  int64_t ldx, ldy, ldw, stride_x, stride_y, w_stride;
  const int32_t *offs;
  int32_t nseg, seg_rows, n, k, xtype, ytype, wtype, in_out, nrows;
  float alpha;
  int32_t rows[MT_INSTR_SHADOW_ROWS];
  mt_instr_header *hdr;
} mt_instr_shadow_rows_args;

/* mt_instr_probe: the row at y + yoff[i] against row i of alone (n elements each, row stride
 * ld_alone). With offs (a grouped call's nseg cumulative ends), rows[i] >= offs[nseg - 1] is in no
 * segment: not compared, counted in probe_outside. */
typedef struct {
  const void *y;
  const void *alone;
  int64_t yoff[MT_INSTR_PROBE_ROWS];
  int32_t rows[MT_INSTR_PROBE_ROWS];
  int32_t nrows, n, type, ld_alone;
  mt_instr_header *hdr;
  const int32_t *offs;
  int32_t nseg, pad;
} mt_instr_probe_args;

/* mt_instr_offs: for each probed row rows[i] of a grouped call with offs, the one-row offsets
 * that make the grouped engine compute that row alone with its own segment's weight:
 * out[i * nseg + s] = offs[s] > rows[i] (0 before the row's segment, 1 from it on). */
typedef struct {
  const int32_t *offs;
  int32_t *out;
  int32_t rows[MT_INSTR_PROBE_ROWS];
  int32_t nrows, nseg;
} mt_instr_offs_args;

/* --- the math, one copy for both sides ---------------------------------------------------- */

MT_HD uint64_t mt_instr_mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

MT_HD uint64_t mt_instr_piece(uint64_t i, uint64_t lo, uint64_t hi) {
  return mt_instr_mix64(lo + MT_INSTR_MUL_G * (2 * i + 1)) ^
         mt_instr_mix64(hi ^ (MT_INSTR_MUL_H * (i + 1)));
}

MT_HD uint64_t mt_instr_tag(uint64_t len, int type) {
  return mt_instr_mix64(len << 4 | (uint64_t)(type + 1));
}

/* The signs of element j of the sketch: sign(i, j) is -1 when bit 63 - i of mix64(SEED ^ j) is
 * set, so that one hash gives an element's eight signs. */
MT_HD uint64_t mt_instr_sign_bits(int j) {
  return mt_instr_mix64(MT_INSTR_SKETCH_SEED ^ (uint64_t)j);
}

MT_HD float mt_instr_sign(int i, int j) {
  return (mt_instr_sign_bits(j) >> (63 - i) & 1) ? -1.0f : 1.0f;
}

MT_HD uint64_t mt_instr_fold(uint64_t h, uint64_t v) { return mt_instr_mix64(h ^ v); }

/* A grouped call's segment of row r (mt_instr_digest_args): the first s with offs[s] > r, -1 when
 * none; r / seg_rows without offs; 0 for a single problem (neither). */
MT_HD int32_t mt_instr_segment(const int32_t *offs, int32_t nseg, int32_t seg_rows, int64_t r) {
  if (!offs)
    return seg_rows > 0 ? (int32_t)(r / seg_rows) : 0;
  int32_t lo = 0, hi = nseg; /* offs is non-decreasing: binary search */
  while (lo < hi) {
    int32_t mid = (lo + hi) / 2;
    if (offs[mid] > r)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo < nseg ? lo : -1;
}

/* Element offset of row r of a matrix with row stride ld in a grouped call (see above). */
MT_HD int64_t mt_instr_row_offset(int32_t seg, int32_t seg_rows, int64_t stride, int64_t ld,
                                  int64_t r) {
  return seg_rows > 0 ? seg * stride + (r % seg_rows) * ld : r * ld;
}

/* Where mt_instr_digest reads row r (in segment seg) of x and of y, in elements. */
MT_HD int64_t mt_instr_digest_x(const mt_instr_digest_args *a, int32_t seg, int64_t r) {
  return a->x_rows ? (int64_t)a->x_rows[r] * a->ldx
                   : mt_instr_row_offset(seg, a->seg_rows, a->stride_x, a->ldx, r);
}
MT_HD int64_t mt_instr_digest_y(const mt_instr_digest_args *a, int32_t seg, int64_t r) {
  return a->y_rows ? (int64_t)a->y_rows[r] * a->ldy
                   : mt_instr_row_offset(seg, a->seg_rows, a->stride_y, a->ldy, r);
}

MT_HD float mt_instr_half_to_float(uint16_t h, int type) {
  uint32_t bits;
  if (type == 0) { /* MT_DTYPE_BF16 */
    bits = (uint32_t)h << 16;
  } else { /* FP16 */
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0x1f) {
      bits = sign | 0x7f800000u | man << 13;
    } else if (exp) {
      bits = sign | (exp + 112) << 23 | man << 13;
    } else if (!man) {
      bits = sign;
    } else { /* subnormal: normalise */
      int e = -1;
      do {
        man <<= 1;
        e++;
      } while (!(man & 0x400));
      bits = sign | (uint32_t)(112 - e) << 23 | (man & 0x3ff) << 13;
    }
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

/* Output (r, j) of a shadow_rows call's reference, r in segment seg: FP32 fused multiply-adds in
 * k order, then alpha (kernels/instr.cu and its host twin run this same code). */
MT_HD float mt_instr_shadow_ref(const mt_instr_shadow_rows_args *a, int32_t seg, int64_t r, int j) {
  const uint16_t *x =
      (const uint16_t *)a->x + mt_instr_row_offset(seg, a->seg_rows, a->stride_x, a->ldx, r);
  const uint16_t *w = (const uint16_t *)a->w + seg * a->w_stride;
  float acc = 0.0f;
  for (int kk = 0; kk < a->k; kk++) {
    const uint16_t wv = a->in_out ? w[(int64_t)kk * a->ldw + j] : w[(int64_t)j * a->ldw + kk];
    acc = fmaf(mt_instr_half_to_float(x[kk], a->xtype), mt_instr_half_to_float(wv, a->wtype), acc);
  }
  return a->alpha * acc;
}

/* --- host-only helpers: the whole-row forms the host twin and the shim use ---------------- */
#ifndef __CUDACC__
#include <stddef.h>

/* content_sum of `bytes` bytes at p (zero-padded to a multiple of 16), pieces numbered from
 * `first`: a matrix is the sum of its rows with first = row * pieces per row. */
static inline uint64_t mt_instr_content_sum(const void *p, size_t bytes, uint64_t first) {
  uint64_t sum = 0;
  const unsigned char *b = (const unsigned char *)p;
  for (size_t off = 0, i = first; off < bytes; off += 16, i++) {
    unsigned char piece[16] = {0};
    memcpy(piece, b + off, bytes - off < 16 ? bytes - off : 16);
    uint64_t lo, hi;
    memcpy(&lo, piece, 8);
    memcpy(&hi, piece + 8, 8);
    sum += mt_instr_piece(i, lo, hi);
  }
  return sum;
}

/* The hash of a row of k elements over its first `elems`, tagged with the row's length: the row
 * hash and the output hash (elems = k) and the lead hash are the same function. */
static inline uint64_t mt_instr_prefix_hash(const uint16_t *x, int elems, int k, int xtype) {
  return mt_instr_mix64(mt_instr_content_sum(x, (size_t)elems * 2, 0) ^
                        mt_instr_tag((uint64_t)k, xtype));
}

static inline uint64_t mt_instr_row_hash(const uint16_t *x, int k, int xtype) {
  return mt_instr_prefix_hash(x, k, k, xtype);
}

static inline uint64_t mt_instr_lead_hash(const uint16_t *x, int k, int xtype) {
  return mt_instr_prefix_hash(x, k < MT_INSTR_LEAD ? k : MT_INSTR_LEAD, k, xtype);
}

static inline uint64_t mt_instr_out_hash(const uint16_t *y, int n, int ytype) {
  return mt_instr_prefix_hash(y, n, n, ytype);
}

/* weight_sum of W, n rows of k 2-byte elements (k % 8 == 0) at row stride ldw, or (in_out: W
 * stored [in][out], k rows of n) element (r, c) at w[c * ldw + r], whose sampled lines are
 * gathered element by element so that the sum is the [n][k] matrix's: the pieces of the sampled
 * lines, walked as the kernels walk them (kernels/whash.cuh, mt_item_hash; kernels/instr.cu). */
static inline uint64_t mt_instr_weight_sum_of(const uint16_t *w, int64_t ldw, int n, int k,
                                              int in_out) {
  const uint64_t per_row = (uint64_t)k / 8, lines_per_row = (per_row + 7) / 8;
  const uint64_t lines = mt_whash_lines(n, k);
  const uint64_t items = mt_whash_items(lines, MT_SAMPLE_STEP);
  uint64_t sum = 0;
  for (uint64_t item = 0; item < items; item++) {
    const uint64_t line = mt_whash_line(item, MT_SAMPLE_STEP);
    if (line >= lines)
      continue;
    const uint64_t r = line / lines_per_row, j0 = line % lines_per_row * 8;
    const uint64_t pieces = per_row - j0 < 8 ? per_row - j0 : 8;
    uint16_t gathered[64];
    const uint16_t *at = w + r * (uint64_t)ldw + j0 * 8;
    if (in_out) {
      for (uint64_t e = 0; e < pieces * 8; e++)
        gathered[e] = w[(j0 * 8 + e) * (uint64_t)ldw + r];
      at = gathered;
    }
    sum += mt_instr_content_sum(at, pieces * 16, r * per_row + j0);
  }
  return sum;
}

static inline uint64_t mt_instr_weight_sum(const uint16_t *w, int64_t ldw, int n, int k) {
  return mt_instr_weight_sum_of(w, ldw, n, k, 0);
}

static inline uint64_t mt_instr_weight_id(uint64_t wsum, int n, int k, int wtype) {
  return mt_instr_mix64(wsum ^ mt_instr_tag((uint64_t)n << 28 | (uint64_t)k, wtype));
}

static inline uint64_t mt_instr_bias_id(int has_bias, uint64_t bsum, int n, int btype) {
  return has_bias ? mt_instr_mix64(bsum ^ mt_instr_tag((uint64_t)n, btype)) : 0;
}

static inline uint64_t mt_instr_key(uint64_t row_hash, uint64_t weight_id, int ytype, float alpha,
                                    uint64_t bias_id) {
  uint32_t abits;
  memcpy(&abits, &alpha, 4);
  uint64_t h = mt_instr_fold(MT_INSTR_KEY_SEED, row_hash);
  h = mt_instr_fold(h, weight_id);
  h = mt_instr_fold(h, (uint64_t)(ytype + 1));
  h = mt_instr_fold(h, abits);
  return mt_instr_fold(h, bias_id);
}

/* The sketch of an output row, FP32 sums in element order. */
static inline void mt_instr_sketch(const uint16_t *y, int n, int ytype,
                                   float out[MT_INSTR_SKETCH]) {
  float scale = 1.0f / sqrtf((float)n);
  for (int i = 0; i < MT_INSTR_SKETCH; i++) {
    float s = 0.0f;
    for (int j = 0; j < n; j++)
      s += mt_instr_sign(i, j) * mt_instr_half_to_float(y[j], ytype);
    out[i] = s * scale;
  }
}

/* mt_instr_digest on the host: the rows chosen, in row order, into a->rows (a->hdr->selected
 * counts them all; the rows past a->cap are not written). The fake driver's kernel
 * (tests/cpu/fake/fake_cuda.c) and the reference of the kernel's CPU emulation
 * (tests/cpu/test_instr_emu.cc). */
static inline void mt_instr_digest_host(const mt_instr_digest_args *a) {
  if (a->tick && *a->tick % a->every)
    return;
  for (int r = 0; r < a->m; r++) {
    int32_t seg = mt_instr_segment(a->offs, a->nseg, a->seg_rows, r);
    if (seg < 0)
      continue;
    const uint16_t *x = (const uint16_t *)a->x + mt_instr_digest_x(a, seg, r);
    if (!a->all && mt_instr_lead_hash(x, a->k, a->xtype) >= a->threshold)
      continue;
    unsigned slot = a->hdr->selected++;
    if ((int)slot >= a->cap)
      continue;
    const uint16_t *y = (const uint16_t *)a->y + mt_instr_digest_y(a, seg, r);
    mt_instr_row *out = a->rows + slot;
    out->wsum = 0;
    out->seg = seg;
    out->row_hash = mt_instr_row_hash(x, a->k, a->xtype);
    out->out_hash = mt_instr_out_hash(y, a->n, a->ytype);
    mt_instr_sketch(y, a->n, a->ytype, out->sketch);
  }
}

static inline float mt_instr_max_host(float a, float b) { return a > b ? a : b; }

/* One element of a shadow into the header, on the host (*mx: the largest |y - ref| so far). */
static inline void mt_instr_shadow_add_host(mt_instr_header *h, float y, float ref, float *mx) {
  if (!isfinite(y) || !isfinite(ref)) {
    h->shadow_nonfinite++;
    return;
  }
  double d = (double)y - ref;
  h->shadow_d2 += d * d;
  h->shadow_r2 += (double)ref * ref;
  *mx = mt_instr_max_host(*mx, fabsf(y - ref));
}

/* mt_instr_shadow on the host, row by row (the kernel's double sums add in another order). */
static inline void mt_instr_shadow_host(const mt_instr_shadow_args *a) {
  float mx;
  memcpy(&mx, &a->hdr->shadow_max_bits, 4);
  for (int r = 0; r < a->m; r++)
    for (int j = 0; j < a->n; j++) {
      int64_t at = mt_instr_row_offset(a->seg_rows > 0 ? r / a->seg_rows : 0, a->seg_rows,
                                       a->stride, a->ld, r) +
                   j;
      mt_instr_shadow_add_host(
          a->hdr, mt_instr_half_to_float(((const uint16_t *)a->y)[at], a->type),
          mt_instr_half_to_float(((const uint16_t *)a->ref)[at], a->type), &mx);
    }
  memcpy(&a->hdr->shadow_max_bits, &mx, 4);
}

/* mt_instr_shadow_rows on the host. */
static inline void mt_instr_shadow_rows_host(const mt_instr_shadow_rows_args *a) {
  float mx;
  memcpy(&mx, &a->hdr->shadow_max_bits, 4);
  for (int i = 0; i < a->nrows; i++) {
    const int64_t r = a->rows[i];
    const int32_t seg = mt_instr_segment(a->offs, a->nseg, a->seg_rows, r);
    if (seg < 0)
      continue;
    const uint16_t *y =
        (const uint16_t *)a->y + mt_instr_row_offset(seg, a->seg_rows, a->stride_y, a->ldy, r);
    for (int j = 0; j < a->n; j++)
      mt_instr_shadow_add_host(a->hdr, mt_instr_half_to_float(y[j], a->ytype),
                               mt_instr_shadow_ref(a, seg, r, j), &mx);
  }
  memcpy(&a->hdr->shadow_max_bits, &mx, 4);
}

/* mt_instr_probe on the host. */
static inline void mt_instr_probe_host(const mt_instr_probe_args *a) {
  float mx;
  memcpy(&mx, &a->hdr->probe_max_bits, 4);
  for (int p = 0; p < a->nrows; p++) {
    if (a->offs && a->rows[p] >= a->offs[a->nseg - 1]) {
      a->hdr->probe_outside++;
      continue;
    }
    const uint16_t *in = (const uint16_t *)a->y + a->yoff[p];
    const uint16_t *alone = (const uint16_t *)a->alone + (int64_t)p * a->ld_alone;
    int differ = 0;
    for (int j = 0; j < a->n; j++)
      if (in[j] != alone[j]) {
        differ = 1;
        const float d = fabsf(mt_instr_half_to_float(in[j], a->type) -
                              mt_instr_half_to_float(alone[j], a->type));
        mx = mt_instr_max_host(mx, d != d ? INFINITY : d); /* NaN against a number: Inf */
      }
    a->hdr->probe_differing += (unsigned)differ;
  }
  memcpy(&a->hdr->probe_max_bits, &mx, 4);
}

/* The grids kernels/instr.c launches (256 threads a CTA), here for the kernels' CPU emulation
 * (tests/cpu/test_instr_emu.cc) too. The digest: MT_INSTR_DIGEST_WARPS rows a CTA. The finish: a
 * CTA for each block of 256 sampled lines (a line a thread; a grouped call's for each of the
 * weights its digested rows may name), at most 264 (as kernels/wcheck.c); one where nothing is
 * read (a frozen-sampled weight's sums are stored; no digest: only the publication). The shadow:
 * a CTA for each 1,024 elements, at most 264; of rows, a CTA for each 256 columns of a row. The
 * probe and the offsets: a CTA a probed row. */
static inline unsigned mt_instr_digest_grid(const mt_instr_digest_args *a) {
  return a->m > 0 ? (unsigned)((a->m + MT_INSTR_DIGEST_WARPS - 1) / MT_INSTR_DIGEST_WARPS) : 1;
}
static inline unsigned mt_instr_finish_grid(const mt_instr_finish_args *a) {
  if (!a->w || a->frozen_sum)
    return 1;
  const uint64_t blocks = mt_whash_items(mt_whash_lines(a->n, a->k), MT_SAMPLE_STEP) / 256 + 1;
  const uint64_t units = a->grouped ? blocks * (uint64_t)a->cap : blocks;
  return units < 264 ? (unsigned)units : 264;
}
static inline unsigned mt_instr_shadow_grid(const mt_instr_shadow_args *a) {
  const int64_t blocks = (int64_t)a->m * a->n / 1024 + 1;
  return blocks < 264 ? (unsigned)blocks : 264;
}
static inline unsigned mt_instr_shadow_rows_grid(const mt_instr_shadow_rows_args *a) {
  return (unsigned)(a->nrows > 0 ? a->nrows : 1) * (unsigned)((a->n + 255) / 256);
}

/* --- the launchers (kernels/instr.c) and the driver calls only the instruments make ------- */

#include <cuda.h>

#include "kernels/engine.h"

typedef struct {
  __typeof__(&cuMemHostAlloc) mem_host_alloc;
  __typeof__(&cuMemHostGetDevicePointer) mem_host_get_device_pointer;
  __typeof__(&cuMemFreeHost) mem_free_host;
} mt_instr_driver;

/* The table, or NULL when the process's libcuda.so.1 lacks one of them. Thread-safe. */
const mt_instr_driver *mt_instr_driver_get(void);

/* Each enqueues its kernel on `stream` (no other driver call): MT_OK or an mt_status. */
int mt_instr_launch_digest(const mt_instr_digest_args *a, mt_stream stream);
int mt_instr_launch_finish(const mt_instr_finish_args *a, mt_stream stream);
int mt_instr_launch_shadow(const mt_instr_shadow_args *a, mt_stream stream);
int mt_instr_launch_shadow_rows(const mt_instr_shadow_rows_args *a, mt_stream stream);
int mt_instr_launch_probe(const mt_instr_probe_args *a, mt_stream stream);
int mt_instr_launch_offs(const mt_instr_offs_args *a, mt_stream stream);

#endif /* !__CUDACC__ */
#endif
