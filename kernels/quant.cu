/* quant.cu — NVFP4 quantization kernels: BF16/FP16 rows (row stride ldx) to the exact BF16
 * dequantized matrix xhat = e2m1(code) * s_b (outer scale not applied: what the tensor cores
 * read), and optionally the packed E2M1 codes and E4M3 block scales, with the FP32 outer scale S
 * per row or per tensor; 1x16 blocks, or 16x16 tiles for weights. Or (the store mode, for weights)
 * the same codes and scales as the weight store of kernels/wstore.h, with S, one slice per batch
 * (expert), each with its own S.
 *
 * Bit-identical to mt_ref_quantize (ref/nvfp4.c): the same IEEE FP32 operations in the same
 * order (TE's), each rounded on its own (__fmul_rn / __frcp_rn / __fdiv_rn: no FMA contraction,
 * correctly rounded division, denormals kept). tests/gpu/test_kernels.c checks codes, scales, S,
 * xhat and the store bit for bit against the reference on random and adversarial inputs;
 * tests/cpu/test_quant_rec_encode.c checks a host twin of the store mode's own encode.
 *
 * Layout of the work: one thread owns NB blocks of 16 elements of one row (two 16-byte loads and
 * stores per block, coalesced across the row's threads); a CTA holds TY rows of TX threads. The
 * per-row amax is a max over the FP32 bits of |x| (exact and order-independent; NaN's bits exceed
 * Inf's, so NaN wins as in the reference): butterfly shuffles, then shared memory across warps.
 */
#include <cooperative_groups.h>
#include <stdint.h>

#include "kernels/pdl.cuh"
#include "kernels/quant.cuh"
#include "kernels/quant.h"
#include "kernels/wcheck.h"
#include "kernels/whash.cuh"
#include "kernels/wstore.h"

using namespace mt_q;

namespace {

constexpr int kMaxThreads = 512;  /* per CTA; the launcher never asks for more */
constexpr int kAmaxThreads = 256; /* the amax pass's CTA (quant.c launches it with 256) */

/* The batch of row r under batch_offs (the first e with r < batch_offs[e]) and its row in it. */
__device__ __forceinline__ int batch_of_row(const mt_quant_params &p, int r, int &rl) {
  int lo = 0, hi = p.nbatch - 1;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (r < p.batch_offs[mid])
      hi = mid;
    else
      lo = mid + 1;
  }
  rl = r - (lo ? p.batch_offs[lo - 1] : 0);
  return lo;
}

/* Elements from one row of x to the next, and from one column to the next: a weight stored
 * [in][out] (p.in_out) is read transposed. */
__device__ __forceinline__ size_t row_step(const mt_quant_params &p) {
  return p.in_out ? 1 : (size_t)p.ldx;
}
__device__ __forceinline__ size_t col_step(const mt_quant_params &p) {
  return p.in_out ? (size_t)p.ldx : 1;
}

/* Row rl of batch e's first element of x, in elements: each batch batch_stride elements after the
 * one before. */
__device__ __forceinline__ size_t batch_row_at(const mt_quant_params &p, int e, int rl) {
  return (size_t)e * (size_t)p.batch_stride + (size_t)rl * row_step(p);
}

/* Row r's first byte of x: row r % batch_rows of batch r / batch_rows; with batch_ptrs (PTRS: the
 * _ptrs kernels, so that the others compile as if it did not exist), each batch at its own base;
 * with gather, row gather[r]. */
template <bool PTRS> __device__ __forceinline__ const char *x_row(const mt_quant_params &p, int r) {
  if constexpr (PTRS) {
    int e, rl;
    if (p.batch_offs) {
      e = batch_of_row(p, r, rl);
    } else {
      e = r / p.batch_rows;
      rl = r % p.batch_rows;
    }
    return (const char *)p.batch_ptrs[e] + (size_t)rl * row_step(p) * 2;
  }
  size_t at = (size_t)(p.gather ? p.gather[r] : r) * row_step(p);
  if (p.batch_rows)
    at = batch_row_at(p, r / p.batch_rows, r % p.batch_rows);
  return (const char *)p.x + at * 2;
}

/* The store mode: batch e is slice e of the store (kernels/wstore.h), p.batch_rows rows padded to
 * whole bands; its records, then its S (and, per tensor, its amax word after S). */
__device__ __forceinline__ int slice_rows(const mt_quant_params &p) {
  return (p.batch_rows + MT_WS_BAND - 1) / MT_WS_BAND * MT_WS_BAND;
}
__device__ __forceinline__ uint8_t *slice_of(const mt_quant_params &p, int e) {
  return p.store + (size_t)e * (size_t)p.slice_bytes;
}
__device__ __forceinline__ float *slice_outer(const mt_quant_params &p, int e) {
  return (float *)(slice_of(p, e) + MT_WS_SECTION(MT_WS_RECORD_BYTES(p.batch_rows, p.cols)));
}

/* The record that row r of slice e's blocks b (even) and b + 1 belong to. */
__device__ __forceinline__ uint8_t *record_of(const mt_quant_params &p, int e, int r, int b) {
  const size_t pairs = MT_WS_PAIRS(p.cols), groups = MT_WS_BAND / 8;
  return slice_of(p, e) +
         (((size_t)(r / MT_WS_BAND) * pairs + b / 2) * groups + (r / 8) % groups) * MT_WS_REC;
}

/* Where a thread's part of one CTA-sized block of rows and columns lies: row r (in the store mode
 * row rl of slice e), the block of columns by, and x's row (any row of the matrix where !row_ok:
 * nothing is loaded from it). */
struct block_at {
  int e, rl, r, by;
  bool row_ok;
  const char *xrow;
};

/* The store mode's block at row rl of slice e: rows past the slice's p.batch_rows (its padding to
 * whole bands) are not rows of x. */
template <bool PTRS>
__device__ __forceinline__ block_at slice_block_at(const mt_quant_params &p, int e, int rl,
                                                   int by) {
  const int r = e * p.batch_rows + rl;
  const bool ok = rl < p.batch_rows && r < p.rows;
  if constexpr (PTRS)
    return {e, rl, r, by, ok, x_row<true>(p, ok ? r : 0)};
  /* e and rl known: no division */
  return {e, rl, r, by, ok, (const char *)p.x + batch_row_at(p, e, ok ? rl : 0) * 2};
}

/* The launch's CTA (bx, by): rows r = bx * TY + ty (in the store mode over the slices' padded
 * rows). */
template <bool STORE, bool PTRS>
__device__ __forceinline__ block_at block_at_of(const mt_quant_params &p, int bx, int by) {
  const int r_all = bx * blockDim.y + threadIdx.y;
  if constexpr (STORE)
    return slice_block_at<PTRS>(p, r_all / slice_rows(p), r_all % slice_rows(p), by);
  return {0, r_all, r_all, by, r_all < p.rows, x_row<PTRS>(p, r_all < p.rows ? r_all : 0)};
}

/* Thread tx's j-th block of the block of columns by: by * TX * NB + tx + j * TX, or in the store
 * mode (NB even) the pairs by * TX * NB / 2 + tx + i * TX (blocks j = 2i and 2i + 1). */
template <int NB, bool STORE> __device__ __forceinline__ int block_index(int by, int j) {
  const int tx = threadIdx.x, TX = blockDim.x;
  return STORE ? 2 * (by * (TX * NB / 2) + tx + (j >> 1) * TX) + (j & 1)
               : by * (TX * NB) + tx + j * TX;
}

/* A block of 16 values of a weight stored [in][out]: one 2-byte load each, a column apart (a
 * warp's loads are not coalesced; the CTA's other rows, which read the neighbouring bytes, mostly
 * find them in L1). */
__device__ __forceinline__ void load_block_in_out(const mt_quant_params &p, const char *src,
                                                  uint32_t (&w)[8]) {
  const size_t step = (size_t)p.ldx * 2;
  uint32_t h[16];
#pragma unroll
  for (int i = 0; i < 16; i++)
    h[i] = *(const uint16_t *)(src + i * step);
#pragma unroll
  for (int i = 0; i < 8; i++)
    w[i] = h[2 * i] | h[2 * i + 1] << 16;
}

/* The thread's NB blocks of 16 values (zero past the row or outside x). */
template <int NB, bool STORE, bool PTRS>
__device__ __forceinline__ void load_blocks(const mt_quant_params &p, const block_at &at,
                                            uint32_t (&w)[NB][8]) {
  const int nblk = p.cols >> 4;
#pragma unroll
  for (int j = 0; j < NB; j++) {
    const int b = block_index<NB, STORE>(at.by, j);
    uint4 v0 = make_uint4(0, 0, 0, 0), v1 = v0;
    if (p.in_out) {
      if (at.row_ok && b < nblk)
        load_block_in_out(p, at.xrow + (size_t)b * 16 * (size_t)p.ldx * 2, w[j]);
      else
        for (int i = 0; i < 8; i++)
          w[j][i] = 0;
      continue;
    }
    if (at.row_ok && b < nblk) {
      const char *src = at.xrow + (size_t)b * 32;
      v0 = load16(src, PTRS);
      v1 = load16(src + 16, PTRS);
    }
    w[j][0] = v0.x, w[j][1] = v0.y, w[j][2] = v0.z, w[j][3] = v0.w;
    w[j][4] = v1.x, w[j][5] = v1.y, w[j][6] = v1.z, w[j][7] = v1.w;
  }
}

/* The thread's loaded blocks w of `at` quantized (block_index's blocks). ROW: S from the row's amax
 * (the launcher makes one CTA span the whole row); else S from the amax word (or *amax_at, where
 * given). TILE: 16x16 tiles, TY == 16, the tile's amax through shared memory. STORE: the output is
 * the weight store p.store instead, over the rows and pairs of each slice the layout pads to: rows
 * past a slice's p.batch_rows loaded as zero, so their codes and scales are 0 (their S is not
 * written). Every thread of the CTA calls it (ROW and TILE meet at barriers). */
template <bool FP16, int NB, bool ROW, bool TILE, bool STORE>
__device__ __forceinline__ void quantize_loaded(const mt_quant_params &p, const block_at &at,
                                                const uint32_t (&w)[NB][8],
                                                const uint32_t *amax_at) {
  const int tx = threadIdx.x, ty = threadIdx.y, TX = blockDim.x;
  const int nblk = p.cols >> 4, by = at.by, e = at.e, rl = at.rl, r = at.r;
  const bool row_ok = at.row_ok;
  auto block_of = [&](int j) { return block_index<NB, STORE>(by, j); };
  uint32_t amax_b[NB];
#pragma unroll
  for (int j = 0; j < NB; j++)
    amax_b[j] = block_amax_bits<FP16>(w[j]);

  float *outer = STORE ? slice_outer(p, e) : p.outer;
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
      const int lane = tx & 31, nwarps = TX >> 5; /* at most 16: one read per lane, then shuffles */
      m = lane < nwarps ? warp_max[((ty * TX) >> 5) + lane] : 0u;
      for (int o = 16; o > 0; o >>= 1)
        m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    }
    S = outer_scale(__uint_as_float(m));
    if (tx == 0 && row_ok)
      outer[STORE ? rl : r] = S;
  } else {
    /* per tensor: the amax word after S (the store's slice, or p.amax) */
    if (!amax_at)
      amax_at = STORE ? (const uint32_t *)(outer + 1) : p.amax;
    S = outer_scale(__uint_as_float(*amax_at));
    if (by == 0 && tx == 0 && rl == 0)
      outer[0] = S;
  }

  if (TILE) { /* TY == 16: the 16 rows of a CTA are one row of tiles (a slice's rows are whole
                 tiles) */
    __shared__ uint32_t tile_max[kMaxThreads / 16 * 8];
    const int first = by * TX * NB;
#pragma unroll
    for (int j = 0; j < NB; j++)
      if (ty == 0)
        tile_max[block_of(j) - first] = 0;
    __syncthreads();
#pragma unroll
    for (int j = 0; j < NB; j++)
      atomicMax(&tile_max[block_of(j) - first], amax_b[j]);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < NB; j++)
      amax_b[j] = tile_max[block_of(j) - first];
  }

  /* A domain holding NaN or Inf: codes, scales and xhat all 0; its NaN S makes the GEMM's
   * outputs NaN. */
  const bool domain_bad = !(S == S);
  const float s_over_6 = S_over_6(S), inv_s = inv_S(S);
  if (STORE) {
    const int pairs = (int)MT_WS_PAIRS(p.cols);
#pragma unroll
    for (int j = 0; j < NB; j += 2) {
      const int b = block_of(j);
      if (b >= 2 * pairs)
        break;
      uint32_t word[4] = {0, 0, 0, 0}, sc0 = 0, sc1 = 0;
      if (!domain_bad)
        record_pair<FP16>(w[j], w[j + 1], amax_b[j], amax_b[j + 1], s_over_6, inv_s, word, sc0,
                          sc1);
      store_record(record_of(p, e, rl, b), rl % 8, word, sc0, sc1);
    }
    return;
  }
  if (!row_ok)
    return;
  const size_t row_base = (size_t)r * (size_t)p.cols;
#pragma unroll
  for (int j = 0; j < NB; j++) {
    const int b = block_of(j);
    if (b >= nblk)
      break;
    uint32_t xh[8] = {0, 0, 0, 0, 0, 0, 0, 0}, cd[2] = {0, 0}, sb_code = 0;
    if (!domain_bad) {
      if (p.codes)
        sb_code = block<FP16, true>(w[j], amax_b[j], s_over_6, inv_s, xh, cd);
      else
        sb_code = block<FP16, false>(w[j], amax_b[j], s_over_6, inv_s, xh, cd);
    }
    if (p.xhat) { /* a kept weight has none (mt_dequant_weight writes it at every call) */
      uint4 *dst = (uint4 *)(p.xhat + row_base + (size_t)b * 16);
      dst[0] = make_uint4(xh[0], xh[1], xh[2], xh[3]);
      dst[1] = make_uint4(xh[4], xh[5], xh[6], xh[7]);
    }
    if (p.codes)
      *(uint2 *)(p.codes + row_base / 2 + (size_t)b * 8) = make_uint2(cd[0], cd[1]);
    if (p.scales)
      p.scales[row_base / 16 + b] = (uint8_t)sb_code;
  }
}

/* The CTA (bx, by)'s block (the launch's, or the refresh's: refresh_store). */
template <bool FP16, int NB, bool ROW, bool TILE, bool STORE = false, bool PTRS = false>
__device__ __forceinline__ void quantize(const mt_quant_params &p, int bx, int by) {
  /* the same for the whole grid: no barrier is left waiting */
  if (!STORE && p.only_if && *p.only_if == 0)
    return;
  const block_at at = block_at_of<STORE, PTRS>(p, bx, by);
  uint32_t w[NB][8];
  load_blocks<NB, STORE, PTRS>(p, at, w);
  quantize_loaded<FP16, NB, ROW, TILE, STORE>(p, at, w, nullptr);
}

/* The store mode's CTAs: one block of blockDim.y rows (a block lies within one slice: quant.c)
 * and TX * NB / 2 pairs of columns each. They let no dependent start before they end: the
 * activations' quantizer launched after them lets the grouped GEMM start at once, and the GEMM
 * reads the store before it waits (kernels/grouped.cu). */
template <bool FP16, int NB, bool ROW, bool TILE, bool PTRS>
__device__ __forceinline__ void quantize_store(const mt_quant_params &p) {
  quantize<FP16, NB, ROW, TILE, true, PTRS>(p, blockIdx.x, blockIdx.y);
}

/* max |x| over the whole matrix into *p.amax, or in the store mode over each slice into the
 * slice's amax word (FP32 bits; the launcher zeroes them first): each warp takes a run of rows,
 * four 16-byte loads in flight per lane; one atomicMax per CTA (per warp and slice in the store
 * mode, where a warp's run may cross into the next slice). */
template <bool FP16, bool PTRS>
__device__ __forceinline__ uint32_t row_amax(const mt_quant_params &p, int r, int lane) {
  if (p.in_out)
    return row_amax_strided<FP16>(x_row<PTRS>(p, r), p.cols, col_step(p) * 2, lane);
  return row_amax_bits<FP16, PTRS>(x_row<PTRS>(p, r), p.cols, lane);
}

/* The store mode's amax: each warp a run of the rows, one atomicMax per slice it touched. */
template <bool FP16, bool PTRS>
__device__ __forceinline__ void amax_store(const mt_quant_params &p, int warp, int nwarps) {
  const int lane = threadIdx.x & 31;
  const int run = (p.rows + nwarps - 1) / nwarps, v0 = warp * run, v1 = min(p.rows, v0 + run);
  uint32_t bits = 0;
  for (int v = v0; v < v1; v++) {
    const int e = v / p.batch_rows;
    bits = max(bits, row_amax<FP16, PTRS>(p, v, lane));
    if (v + 1 == v1 || (v + 1) % p.batch_rows == 0) { /* the slice's last row of this run */
      if (lane == 0 && bits != 0)
        atomicMax((uint32_t *)(slice_outer(p, e) + 1), bits);
      bits = 0;
    }
  }
}

template <bool FP16, bool PTRS>
__device__ __forceinline__ void amax_pass(const mt_quant_params &p) {
  const int lane = threadIdx.x & 31;
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int nwarps = (gridDim.x * blockDim.x) >> 5;
  if (p.store) {
    amax_store<FP16, PTRS>(p, warp, nwarps);
    return;
  }
  if (p.only_if && *p.only_if == 0)
    return;
  const int run = (p.rows + nwarps - 1) / nwarps, r0 = warp * run, r1 = min(p.rows, r0 + run);
  uint32_t bits = 0;
  for (int r = r0; r < r1; r++)
    bits = max(bits, row_amax<FP16, PTRS>(p, r, lane));
  /* then across the CTA's warps, so that one atomic per CTA (not per warp: 8192 on one word at
   * 8192 rows) reaches L2, where atomics on one address are served one after another */
  __shared__ uint32_t warp_max[kAmaxThreads / 32];
  if (lane == 0)
    warp_max[threadIdx.x >> 5] = bits;
  __syncthreads();
  if (threadIdx.x < 32) {
    bits = lane < (int)(blockDim.x >> 5) ? warp_max[lane] : 0u;
    bits = __reduce_max_sync(0xffffffffu, bits);
    if (lane == 0 && bits != 0)
      atomicMax(p.amax, bits);
  }
}

/* ---- a store's refresh: the check and the requantization of changed slices in one launch -------
 *
 * A cluster of CTAs (16 for a full check, 8 where the device runs no cluster of 16; for a sampled
 * one as few as keep the sample one trip a warp, at most 8: quant.c) owns every G-th covered slice:
 * its CTAs hash their share of the slices' lines (kernels/whash.cuh), the cluster adds the shares
 * in distributed shared memory and compares each sum with the hash kept at the slice's last
 * quantization. Unchanged: nothing more. Changed (or never quantized): the cluster takes the
 * slice's amax the same way (per-tensor S), quantizes its blocks as the store quantizer would (bit
 * for bit: the same quantize_loaded), and keeps the new hash. A slice's words are touched by its
 * cluster only, so nothing is counted, listed or reset across the grid: a refresh that finds
 * nothing changed is one launch, one read of the segment ends, one of the sample (all of a
 * cluster's slices at once) and two cluster barriers. On its own it ends before what follows it
 * starts. In a grouped call (between its activations' quantizer and its GEMM: kernels/grouped.c) it
 * runs beside the quantizer, which it waits for only at its end, and lets the GEMM start once its
 * lines are read (MT_REFRESH_CHAINED: the GEMM waits for it before its K loops) or at once
 * (MT_REFRESH_BESIDE: the GEMM waits for it only before it ends). A CTA that requantized adds one
 * to the state's generation after its writes, and the GEMM, which read weights meanwhile, reads
 * them again (kernels/grouped.cu, store_moved). Tested on the GPU by tests/gpu/test_grouped.c
 * (store_refresh_modes: every weight scale, whole, one-row and one-element changes, sampled lines,
 * slices outside the call; store_refresh_rounds: clusters of several slices; grouped_after_refresh
 * and grouped_many_segments: grouped calls that run a refresh, the GEMM beside it and after it),
 * the launch on the CPU by tests/cpu/test_shim_engine.c.
 */

/* Where this thread stands: its cluster, its CTA's rank in it, its number in the CTA. */
struct cluster_at {
  cooperative_groups::cluster_group cl;
  int rank, size; /* the CTA's rank, the cluster's CTAs */
  int tid, nthreads;
};

__device__ cluster_at cluster_here() {
  const cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
  return {cl, (int)cl.block_rank(), (int)cl.num_blocks(),
          (int)(threadIdx.y * blockDim.x + threadIdx.x), (int)(blockDim.x * blockDim.y)};
}

/* One value of the CTA, combined over its warps: a sum (hash words) or a max (amax bits); thread 0
 * holds the result. */
template <bool MAX> __device__ __forceinline__ uint64_t combine(uint64_t a, uint64_t b) {
  return MAX ? max(a, b) : a + b;
}
template <bool MAX> __device__ uint64_t cta_combine(uint64_t v, const cluster_at &c) {
  __shared__ uint64_t warp_v[kMaxThreads / 32];
  for (int o = 16; o > 0; o >>= 1)
    v = combine<MAX>(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (c.tid % 32 == 0)
    warp_v[c.tid / 32] = v;
  __syncthreads();
  if (c.tid == 0)
    for (int w = 1; w < c.nthreads / 32; w++)
      v = combine<MAX>(v, warp_v[w]);
  return v;
}

/* The cluster's combination of one value a CTA, for every thread: thread 0 puts its CTA's in
 * `slot` (its shared memory; two slots used in turn, so that a round's writes never meet the reads
 * of the round before, which every CTA finishes before the next barrier), the cluster's barrier,
 * then each thread reads every CTA's slot. */
template <bool MAX>
__device__ uint64_t cluster_combine(const cluster_at &c, uint64_t *slot, uint64_t v) {
  v = cta_combine<MAX>(v, c);
  if (c.tid == 0)
    *slot = v;
  c.cl.sync();
  v = 0;
  for (int r = 0; r < c.size; r++)
    v = combine<MAX>(v, *c.cl.map_shared_rank(slot, r));
  return v;
}

/* Up to kRefreshBatch of the cluster's slices are checked in one pass, without a barrier between
 * slices (a batch's words live in shared memory); a cluster takes more in further passes. */
constexpr int kRefreshBatch = 32;

/* A pass's slices: the cluster's j-th covered slice is cov[first + j * stride], j < n. */
struct refresh_batch {
  mt_slices_of cov;
  int first, stride, n;
  __device__ int slice(int j) const { return cov[first + j * stride]; }
};

/* This CTA's share of a batch's check into part[j] (shared memory, zeroed): the batch's items in
 * runs of 32 (a line a lane), slice after slice, dealt to the cluster's warps in turn (rank * warps
 * + warp, then a cluster's warps further on), so that a sample of a few runs a slice still keeps
 * every warp busy. A warp adds its sum of a slice to the slice's word once, when it moves past the
 * slice (a 64-bit add to shared memory is a compare-and-swap loop: one a warp, not one a
 * thread). */
__device__ void hash_shares(const mt_refresh_args &a, const refresh_batch &bt, uint64_t *part,
                            const cluster_at &c) {
  const mt_quant_params &p = a.q;
  const mt_wlines g = mt_wlines_of(mt_quant_stored_rows(&p), mt_quant_stored_cols(&p), a.step);
  const uint32_t runs = (g.items + 31) / 32, stride = c.size * c.nthreads / 32, lane = c.tid % 32;
  uint32_t run = c.rank * c.nthreads / 32 + c.tid / 32;
  int j = 0;
  for (; j < bt.n && run >= runs; j++)
    run -= runs;
  uint64_t h = 0;
  while (j < bt.n) {
    h += mt_item_hash((const uint16_t *)p.x + (size_t)bt.slice(j) * (size_t)p.batch_stride, p.ldx,
                      g, a.step, run * 32 + lane);
    run += stride;
    if (run < runs)
      continue;
    for (int o = 16; o > 0; o >>= 1)
      h += __shfl_xor_sync(0xffffffffu, h, o);
    if (lane == 0)
      atomicAdd((unsigned long long *)&part[j], (unsigned long long)h);
    h = 0;
    for (; j < bt.n && run >= runs; j++)
      run -= runs;
  }
}

/* This CTA's share of slice e's amax (FP32 bits of max |x|): rows rank * warps + warp + i * (the
 * cluster's warps), as the amax pass reads a row. */
template <bool FP16>
__device__ uint32_t slice_amax_share(const mt_quant_params &p, int e, const cluster_at &c) {
  const int warps = c.nthreads / 32;
  uint32_t m = 0;
  for (int r = c.rank * warps + c.tid / 32; r < p.batch_rows; r += c.size * warps)
    m = max(m, row_amax<FP16, false>(p, e * p.batch_rows + r, c.tid % 32));
  return m;
}

/* Slice e's requantization by the cluster (found changed): its amax the way the check's sums were
 * combined (per-tensor S), then its blocks of rows and columns dealt to the CTAs in turn. A CTA's
 * blocks are a chain of trips to memory, with only two warps a scheduler to hide them, so the next
 * block's loads are issued before this one is quantized where both fit the registers (NB == 2:
 * 32 values a thread). */
template <bool FP16, int NB, bool ROW, bool TILE>
__device__ void requantize(const mt_refresh_args &a, int e, uint64_t *amax_slot,
                           const cluster_at &c) {
  const mt_quant_params &p = a.q;
  const int per_slice = slice_rows(p) / blockDim.y, blocks = per_slice * a.grid_y;
  uint32_t amax = 0;
  if (!ROW) {
    amax = (uint32_t)cluster_combine<true>(c, amax_slot, slice_amax_share<FP16>(p, e, c));
    if (c.rank == 0 && c.tid == 0)
      *(uint32_t *)(slice_outer(p, e) + 1) = amax; /* as the amax pass leaves it */
  }
  constexpr bool kAhead = NB == 2;
  /* block b: the rows (b % per_slice) * TY.. of the slice, the columns' block b / per_slice */
  int b = c.rank, rb = b % per_slice, by = b / per_slice;
  auto at_of = [&]() {
    return slice_block_at<false>(p, e, rb * (int)blockDim.y + (int)threadIdx.y, by);
  };
  auto step = [&]() {
    b += c.size, rb += c.size;
    for (; rb >= per_slice; rb -= per_slice)
      by++;
  };
  if (b >= blocks)
    return;
  block_at at = at_of();
  uint32_t w[NB][8], w_next[NB][8];
  load_blocks<NB, true, false>(p, at, w);
  for (;;) {
    step();
    const bool more = b < blocks;
    const block_at at_next = more ? at_of() : at;
    if (kAhead && more)
      load_blocks<NB, true, false>(p, at_next, w_next);
    quantize_loaded<FP16, NB, ROW, TILE, true>(p, at, w, &amax);
    __syncthreads(); /* one block's shared memory before the next's */
    if (!more)
      return;
    if (!kAhead)
      load_blocks<NB, true, false>(p, at_next, w_next);
    at = at_next;
#pragma unroll
    for (int j = 0; j < NB; j++)
#pragma unroll
      for (int k = 0; k < 8; k++)
        w[j][k] = w_next[j][k];
  }
}

template <bool FP16, int NB, bool ROW, bool TILE>
__device__ void refresh_store(const mt_refresh_args &a) {
  /* Beside, the call's GEMM starts now: it streams the weights and runs its K loops while the
   * refresh runs (once the activations are written), and waits for this grid before it ends; if a
   * slice was requantized meanwhile, it runs them again (the store's generation moved). */
  if (a.chained == MT_REFRESH_BESIDE)
    allow_dependents();
  const cluster_at c = cluster_here();
  const mt_quant_params &p = a.q;
  const int clusters = gridDim.x / c.size;
  __shared__ uint64_t part[kRefreshBatch], sum[kRefreshBatch], amax_slot[2];
  __shared__ uint32_t changed[kRefreshBatch];
  extern __shared__ int covered[];
  refresh_batch bt = {
      mt_covered_list(a.offs, p.rows / p.batch_rows, a.m, covered, c.tid, c.nthreads), 0, clusters,
      0};
  mt_wcheck_slice *words = mt_wcheck_slices(a.state);
  int round = 0;
  bool wrote = false; /* alike in every thread of the CTA: the cluster's verdicts */
  for (bt.first = blockIdx.x / c.size; bt.first < bt.cov.n; bt.first += kRefreshBatch * clusters) {
    bt.n = min(kRefreshBatch, (bt.cov.n - bt.first + clusters - 1) / clusters);
    /* every CTA of the cluster takes the same verdicts: the same sums (read from every CTA's part)
     * against the same words, read here, before the hashes' loads (one trip to memory for both),
     * and written below only after the next barrier */
    mt_wcheck_slice w = {0, 0, 0, 0};
    if (c.tid < bt.n) {
      part[c.tid] = 0;
      w = words[bt.slice(c.tid)];
    }
    __syncthreads();
    hash_shares(a, bt, part, c);
    /* The CTA's reads of the sample are done: chained, the call's GEMM may start (it streams its
     * first weights before it waits for this grid, and again if the generation moves, below).
     * Earlier, that stream would queue before the sample's loads. */
    if (a.chained)
      allow_dependents();
    c.cl.sync();
    if (c.tid < bt.n) {
      uint64_t total = 0;
      for (int r = 0; r < c.size; r++)
        total += c.cl.map_shared_rank(part, r)[c.tid];
      sum[c.tid] = total;
      changed[c.tid] = !w.valid || total != w.hash;
    }
    c.cl.sync(); /* the parts read before any is zeroed again; the verdicts before they are used */
    for (int j = 0; j < bt.n; j++) {
      if (!changed[j])
        continue;
      requantize<FP16, NB, ROW, TILE>(a, bt.slice(j), &amax_slot[round], c);
      round ^= 1;
      wrote = true;
      if (c.rank == 0 && c.tid == 0) {
        words[bt.slice(j)].hash = sum[j];
        words[bt.slice(j)].valid = 1;
      }
    }
  }
  if (a.chained)
    allow_dependents(); /* a CTA whose cluster had no slice (the call used fewer) */
  if (wrote) { /* the CTA's writes, then the generation: release (the GEMM reads it with acquire) */
    __threadfence();
    __syncthreads();
    if (c.tid == 0)
      atomicAdd(&((mt_wcheck_head *)a.state)->gen, 1u);
  }
  c.cl.sync(); /* no CTA leaves while another may still read its shared memory */
  /* Chained, the activations' quantizer before this grid runs beside it: its end is this one's,
   * so that the GEMM's wait for this grid is a wait for both. */
  grid_dependency_wait();
}

} // namespace

namespace {
/* A per-row quantizer before a store's refresh (kernels/grouped.c): the kernels after it start
 * once every CTA has waited for the kernel before it (the refresh reads what the kernels before
 * this one wrote) and counted itself as running (mt_quant_params.running: the GEMM after the
 * refresh waits for the count to fall back to 0, so it must never miss a CTA that has yet to write;
 * counted after the wait, so a GEMM before this kernel, waiting for 0, is never held up by it). */
__device__ void start_dependents(const mt_quant_params &p) {
  if (p.running && threadIdx.x == 0 && threadIdx.y == 0) {
    atomicAdd(p.running, 1u);
    __threadfence(); /* counted before the kernels after this one can start */
  }
  __syncthreads();
  allow_dependents();
}

/* The CTA's writes, then its count down (release: the GEMM reads the count with acquire). */
__device__ void stop_running(uint32_t *running) {
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0 && threadIdx.y == 0)
    atomicSub(running, 1u);
}
} // namespace

/* Every kernel twice: for strided rows, and (suffix _ptrs) for rows behind device pointer arrays
 * (mt_quant_params.batch_ptrs), whose bases only the device sees. The activation quantizers let
 * the GEMM after them start at once (it streams its weights before it waits for them); the per-row
 * ones, launched dependent themselves (mt_quantize_dependent), wait for the kernel before them
 * first (a no-op when launched in order), and before a store's refresh let it start only then
 * (start_dependents). */
#define MT_QUANT_ROW_AS(type, fp16, nb, sfx, ptrs)                                                 \
  extern "C" __global__ void __launch_bounds__(kMaxThreads)                                        \
      mt_quant_row_##type##_nb##nb##sfx(const mt_quant_params p) {                                 \
    if (!p.dependents_after_wait)                                                                  \
      allow_dependents();                                                                          \
    grid_dependency_wait();                                                                        \
    if (p.dependents_after_wait)                                                                   \
      start_dependents(p);                                                                         \
    quantize<fp16, nb, true, false, false, ptrs>(p, blockIdx.x, blockIdx.y);                       \
    if (p.dependents_after_wait && p.running)                                                      \
      stop_running(p.running);                                                                     \
  }
#define MT_QUANT_ROW(type, fp16, nb)                                                               \
  MT_QUANT_ROW_AS(type, fp16, nb, , false) MT_QUANT_ROW_AS(type, fp16, nb, _ptrs, true)
MT_QUANT_ROW(bf16, false, 1)
MT_QUANT_ROW(bf16, false, 2)
MT_QUANT_ROW(bf16, false, 4)
MT_QUANT_ROW(bf16, false, 8)
MT_QUANT_ROW(fp16, true, 1)
MT_QUANT_ROW(fp16, true, 2)
MT_QUANT_ROW(fp16, true, 4)
MT_QUANT_ROW(fp16, true, 8)

#define MT_QUANT_TENSOR_AS(type, fp16, sfx, ptrs)                                                  \
  extern "C" __global__ void __launch_bounds__(kMaxThreads)                                        \
      mt_quant_tensor_##type##sfx(const mt_quant_params p) {                                       \
    allow_dependents();                                                                            \
    quantize<fp16, 1, false, false, false, ptrs>(p, blockIdx.x, blockIdx.y);                       \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(kMaxThreads)                                        \
      mt_quant_tile_##type##sfx(const mt_quant_params p) {                                         \
    allow_dependents();                                                                            \
    quantize<fp16, 1, false, true, false, ptrs>(p, blockIdx.x, blockIdx.y);                        \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(kAmaxThreads)                                       \
      mt_quant_amax_##type##sfx(const mt_quant_params p) {                                         \
    allow_dependents();                                                                            \
    amax_pass<fp16, ptrs>(p);                                                                      \
  }
#define MT_QUANT_TENSOR(type, fp16)                                                                \
  MT_QUANT_TENSOR_AS(type, fp16, , false) MT_QUANT_TENSOR_AS(type, fp16, _ptrs, true)
MT_QUANT_TENSOR(bf16, false)
MT_QUANT_TENSOR(fp16, true)

/* The store mode (mt_quant_params.store, weights): per-row S with 2, 4 or 8 blocks a thread (pairs
 * of adjacent blocks), per-tensor S with 2, and 16x16 tiles (per-tensor S) with 2. */
#define MT_QUANT_STORE_AS(type, fp16, sfx, ptrs)                                                   \
  extern "C" __global__ void __launch_bounds__(kMaxThreads)                                        \
      mt_quant_row_store_##type##_nb2##sfx(const mt_quant_params p) {                              \
    quantize_store<fp16, 2, true, false, ptrs>(p);                                                 \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(kMaxThreads)                                        \
      mt_quant_row_store_##type##_nb4##sfx(const mt_quant_params p) {                              \
    quantize_store<fp16, 4, true, false, ptrs>(p);                                                 \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(kMaxThreads)                                        \
      mt_quant_row_store_##type##_nb8##sfx(const mt_quant_params p) {                              \
    quantize_store<fp16, 8, true, false, ptrs>(p);                                                 \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(kMaxThreads)                                        \
      mt_quant_tensor_store_##type##sfx(const mt_quant_params p) {                                 \
    quantize_store<fp16, 2, false, false, ptrs>(p);                                                \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(kMaxThreads)                                        \
      mt_quant_tile_store_##type##sfx(const mt_quant_params p) {                                   \
    quantize_store<fp16, 2, false, true, ptrs>(p);                                                 \
  }
#define MT_QUANT_STORE(type, fp16)                                                                 \
  MT_QUANT_STORE_AS(type, fp16, , false) MT_QUANT_STORE_AS(type, fp16, _ptrs, true)
MT_QUANT_STORE(bf16, false)
MT_QUANT_STORE(fp16, true)

/* ---- a kept weight's dequantized copy, from its codes and scales (kernels/engine.c: the large
 * path of a weight kept without one) -------------------------------------------------------------
 *
 * xhat = +-e2m1(code) * s_b with the code's sign: the product the quantizer formed (encode:
 * r * s_b, then v's sign, which the code carries), so the same bits, -0 and the zeros of a domain
 * holding NaN or Inf included (codes and scales 0). One thread a block of 16: its 8 code bytes and
 * its scale in, 32 bytes out (element 2i in the low nibble of code byte i, as the quantizer packs
 * them). Launched dependent: its launch overlaps the kernel before it, for which it waits before it
 * reads; the call's activations' quantizer, launched in order, starts once it has ended, and the
 * GEMM after that reads the copy before it waits (kernels/engine.c).
 * Tested by tests/gpu/test_kernels.c (kept_weight_dequant: the quantizer's xhat bit for bit, every
 * numerics; the GEMM on the kept form against the full form, bit for bit). */

/* The FP32 bits of the E2M1 magnitude of a 3-bit code: 0, 0.5, then 1 .. 6 from its exponent and
 * mantissa bits (2 -> 1.0: 127 << 23, 7 -> 6.0: 129 << 23 | 1 << 22). */
__device__ __forceinline__ uint32_t e2m1_value_bits(uint32_t c) {
  return c < 2u ? (c ? 0x3f000000u : 0u) : ((126u + (c >> 1)) << 23) | ((c & 1u) << 22);
}

__device__ __forceinline__ uint32_t dequant_one(uint32_t code, float sb) {
  return __float_as_uint(__fmul_rn(__uint_as_float(e2m1_value_bits(code & 7u)), sb)) |
         ((code & 8u) << 28);
}

__device__ __forceinline__ void dequant_block(const mt_dequant_args &a, int64_t b) {
  const uint2 cd = *(const uint2 *)(a.codes + b * 8);
  const float sb = e4m3_to_float(a.scales[b]);
  uint32_t xh[8];
#pragma unroll
  for (int i = 0; i < 8; i++) {
    const uint32_t byte = ((i < 4 ? cd.x : cd.y) >> (8 * (i & 3))) & 0xffu;
    xh[i] = __byte_perm(dequant_one(byte & 15u, sb), dequant_one(byte >> 4, sb), 0x7632);
  }
  uint4 *dst = (uint4 *)(a.xhat + b * 16);
  dst[0] = make_uint4(xh[0], xh[1], xh[2], xh[3]);
  dst[1] = make_uint4(xh[4], xh[5], xh[6], xh[7]);
}

extern "C" __global__ void __launch_bounds__(256) mt_dequant_weight(const mt_dequant_args a) {
  grid_dependency_wait(); /* the codes' quantizer or refresh may be the kernel before */
  const int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (b < a.blocks)
    dequant_block(a, b);
}

/* A store's refresh (refresh_store), one kernel a store quantizer: per-row S with 2, 4 or 8 blocks
 * a thread, per-tensor S, 16x16 tiles; launched in clusters (their size is the launch's). */
#define MT_REFRESH_AS(name, fp16, nb, row, tile)                                                   \
  extern "C" __global__ void __launch_bounds__(kMaxThreads) name(const mt_refresh_args a) {        \
    refresh_store<fp16, nb, row, tile>(a);                                                         \
  }
#define MT_REFRESH(type, fp16)                                                                     \
  MT_REFRESH_AS(mt_refresh_row_store_##type##_nb2, fp16, 2, true, false)                           \
  MT_REFRESH_AS(mt_refresh_row_store_##type##_nb4, fp16, 4, true, false)                           \
  MT_REFRESH_AS(mt_refresh_row_store_##type##_nb8, fp16, 8, true, false)                           \
  MT_REFRESH_AS(mt_refresh_tensor_store_##type, fp16, 2, false, false)                             \
  MT_REFRESH_AS(mt_refresh_tile_store_##type, fp16, 2, false, true)
MT_REFRESH(bf16, false)
MT_REFRESH(fp16, true)
