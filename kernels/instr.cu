// instr.cu — the instruments' kernels (shim/instr.c enqueues them after a routed GEMM, on the
// call's stream, into a result block the host reads later without synchronizing the stream):
//   mt_instr_digest  the lead hashes of the activations' rows, and for the rows the rate picks by
//                    them, the row hash, the output row's hash and its 8-value sketch (scheme 2,
//                    kernels/instr.h); as a call's last launch, its last CTA then runs the finish
//   mt_instr_shadow  sum (y - ref)^2, sum ref^2 and max |y - ref| of the routed output against
//                    the BF16 GEMM's
//   mt_instr_probe   rows recomputed alone against their in-batch rows, bit for bit
//   mt_instr_finish  (its own launch where a grouped call's weights are read, or no row digested)
//                    the weight's weight_sum (1/64 of its lines, or the frozen-sampled cache's
//                    stored hash) and the bias's content sum, only when a row was digested; then
//                    the publication: the result block into mapped pinned host memory, the slot's
//                    flag last (the host polls it; it never waits on the stream)
// Integer sums (hashes) are exact and order-free, so any grid gives the same bits; the sketch is
// an FP32 sum whose order the format leaves free. Tested on the CPU through the host twin in
// kernels/instr.h (tests/cpu/test_shim_instr.c: twin against tools/minite-compare's Python
// reference) and on the H200 by tests/gpu/test_instruments.py (digests of two processes with
// different batchings join bitwise; probe and shadow figures).
#include <stdint.h>

#include "kernels/instr.h"
#include "kernels/whash.cuh"

namespace {

__device__ __forceinline__ uint64_t warp_sum(uint64_t v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_sumf(float v) {
  for (int o = 16; o > 0; o >>= 1)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ uint64_t piece_of(int i, uint4 v) {
  return mt_instr_piece((uint64_t)i, (uint64_t)v.y << 32 | v.x, (uint64_t)v.w << 32 | v.z);
}

// content_sum of a row of `elems` 2-byte elements (16-byte aligned: the router's rule), this
// lane's share; the last piece zero-padded. Whole pieces four at a time, loaded before any is
// hashed: a warp a row with one load in flight a lane leaves DRAM's latency exposed.
__device__ uint64_t row_sum_lane(const uint16_t *row, int elems, int lane) {
  uint64_t h = 0;
  const int pieces = (elems + 7) / 8;
  int i = lane;
  for (; i + 96 < elems / 8; i += 128) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; u++)
      v[u] = *(const uint4 *)(row + 8 * (i + 32 * u));
#pragma unroll
    for (int u = 0; u < 4; u++)
      h += piece_of(i + 32 * u, v[u]);
  }
  for (; i < pieces; i += 32) {
    if (8 * i + 8 <= elems) {
      h += piece_of(i, *(const uint4 *)(row + 8 * i));
      continue;
    }
    uint16_t e[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int j = 0; 8 * i + j < elems; j++)
      e[j] = row[8 * i + j];
    const uint64_t lo = (uint64_t)e[3] << 48 | (uint64_t)e[2] << 32 | (uint64_t)e[1] << 16 | e[0];
    const uint64_t hi = (uint64_t)e[7] << 48 | (uint64_t)e[6] << 32 | (uint64_t)e[5] << 16 | e[4];
    h += mt_instr_piece((uint64_t)i, lo, hi);
  }
  return h;
}

__device__ __forceinline__ float abs_diff(float a, float b) { return fabsf(a - b); }

} // namespace

// One row of a digest: chosen by its lead hash (kernels/instr.h), then its row hash, its output's
// hash and sketch into the next kept row of the block.
__device__ void digest_row(const mt_instr_digest_args &a, int r, int lane) {
  const int32_t seg = mt_instr_segment(a.offs, a.nseg, a.seg_rows, r);
  if (seg < 0)
    return; // past the last segment's end: never written
  const uint16_t *x = (const uint16_t *)a.x + mt_instr_digest_x(&a, seg, r);
  const uint64_t tag = mt_instr_tag((uint64_t)a.k, a.xtype);
  uint64_t row_hash =
      mt_instr_mix64(warp_sum(row_sum_lane(x, min(a.k, MT_INSTR_LEAD), lane)) ^ tag);
  if (!a.all && row_hash >= a.threshold)
    return;
  if (a.k > MT_INSTR_LEAD)
    row_hash = mt_instr_mix64(warp_sum(row_sum_lane(x, a.k, lane)) ^ tag);
  unsigned slot = 0;
  if (lane == 0)
    slot = atomicAdd(&a.hdr->selected, 1u);
  slot = __shfl_sync(0xffffffffu, slot, 0);
  if ((int)slot >= a.cap)
    return; // counted by `selected`; the host reports the excess as dropped
  const uint16_t *y = (const uint16_t *)a.y + mt_instr_digest_y(&a, seg, r);
  uint64_t out_hash =
      mt_instr_mix64(warp_sum(row_sum_lane(y, a.n, lane)) ^ mt_instr_tag((uint64_t)a.n, a.ytype));
  float s[MT_INSTR_SKETCH];
  for (int i = 0; i < MT_INSTR_SKETCH; i++)
    s[i] = 0.0f;
  for (int j = lane; j < a.n; j += 32) { // one hash an element gives its eight signs
    const float v = mt_instr_half_to_float(y[j], a.ytype);
    const uint64_t signs = mt_instr_sign_bits(j);
#pragma unroll
    for (int i = 0; i < MT_INSTR_SKETCH; i++)
      s[i] += (signs >> (63 - i) & 1) ? -v : v;
  }
  const float scale = 1.0f / sqrtf((float)a.n);
  mt_instr_row *out = a.rows + slot;
  for (int i = 0; i < MT_INSTR_SKETCH; i++) {
    float t = warp_sumf(s[i]);
    if (lane == 0)
      out->sketch[i] = t * scale;
  }
  if (lane == 0) {
    out->row_hash = row_hash;
    out->out_hash = out_hash;
    out->wsum = 0;
    out->seg = seg;
  }
}

// Line `line` of the [n][k] matrix that w holds stored [in][out] (element (r, c) at c * ldw + r):
// its pieces gathered element by element, hashed as mt_line_hash hashes the same line stored
// [out][in], so that the weight's id does not depend on its layout.
__device__ uint64_t line_hash_in_out(const uint16_t *w, int64_t ldw, const mt_wlines &g,
                                     uint32_t line) {
  const uint32_t r = line / g.lines_per_row;
  const int j0 = (int)(line - r * g.lines_per_row) * 8, n = min(8, g.per_row - j0);
  uint64_t h = 0;
  for (int j = 0; j < n; j++) {
    uint32_t e[8];
#pragma unroll
    for (int i = 0; i < 8; i++)
      e[i] = w[(int64_t)((j0 + j) * 8 + i) * ldw + r];
    const uint4 v =
        make_uint4(e[0] | e[1] << 16, e[2] | e[3] << 16, e[4] | e[5] << 16, e[6] | e[7] << 16);
    h += mt_piece_hash(v, (uint64_t)r * g.per_row + j0 + j);
  }
  return h;
}

// Item `item` of weight_sum's sample of w (mt_item_hash, or gathered where in_out).
__device__ uint64_t weight_item(const uint16_t *w, int64_t ldw, const mt_wlines &g, bool in_out,
                                uint32_t item) {
  if (!in_out)
    return mt_item_hash(w, ldw, g, MT_SAMPLE_STEP, item);
  const uint32_t line = item < g.items ? (uint32_t)mt_whash_line(item, MT_SAMPLE_STEP) : g.lines;
  return line < g.lines ? line_hash_in_out(w, ldw, g, line) : 0;
}

// This thread's share of weight_sum(W) (kernels/instr.h): the sample's items `first`, first +
// stride, ... (a 128-byte line each, its pieces loaded before any is hashed: kernels/whash.cuh).
__device__ uint64_t weight_sum_part(const uint16_t *w, int64_t ldw, const mt_wlines &g, bool in_out,
                                    uint32_t first, uint32_t stride) {
  uint64_t h = 0;
  for (uint32_t i = first; i < g.items; i += stride)
    h += weight_item(w, ldw, g, in_out, i);
  return h;
}

// The CTA's sum of one value a thread, in thread 0; every thread calls it (two barriers, the
// second leaving warp_part free for the next use).
__device__ uint64_t cta_sum(uint64_t v, uint64_t *warp_part) {
  v = warp_sum(v);
  if (threadIdx.x % 32 == 0)
    warp_part[threadIdx.x / 32] = v;
  __syncthreads();
  uint64_t s = 0;
  if (threadIdx.x == 0)
    for (int w = 0; w < (int)blockDim.x / 32; w++)
      s += warp_part[w];
  __syncthreads();
  return s;
}

// The kept rows that are the first of their segment (one_weight: row 0 alone), in row order, into
// list (shared memory); their count. Every CTA finds the same list. A thread a row (cap <=
// blockDim.x); a row compares its segment with those of the rows before it (cap is 128: cheap).
__device__ int first_rows(const mt_instr_row *rows, unsigned kept, bool one_weight, int *list,
                          int *warp_n) {
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  bool first = (unsigned)t < kept && (!one_weight || t == 0);
  const int seg = first ? __ldcg(&rows[t].seg) : 0;
  if (first && !one_weight)
    for (int j = 0; j < t && first; j++)
      first = __ldcg(&rows[j].seg) != seg;
  const unsigned ballot = __ballot_sync(0xffffffffu, first);
  if (lane == 0)
    warp_n[warp] = __popc(ballot);
  __syncthreads();
  int before = 0, total = 0;
  for (int w = 0; w < (int)blockDim.x / 32; w++) {
    before += w < warp ? warp_n[w] : 0;
    total += warp_n[w];
  }
  if (first)
    list[before + __popc(ballot & ((1u << lane) - 1))] = t;
  __syncthreads();
  return total;
}

// A grouped call's digested rows: each distinct segment's weight_sum into the first row of it,
// from the frozen-sampled cache's stored hashes (CTA 0), or summed by the grid: units of one
// segment's block of blockDim.x items (a line a thread), dealt to the CTAs in turn, so that all
// the segments' samples stream at once.
__device__ void grouped_sums(const mt_instr_finish_args &a, uint64_t *warp_part, unsigned cta,
                             unsigned ctas) {
  __shared__ int list[256], warp_n[8];
  mt_instr_row *rows = (mt_instr_row *)(a.hdr + 1);
  const unsigned kept = min((unsigned)a.cap, *(volatile unsigned *)&a.hdr->selected);
  const int firsts = first_rows(rows, kept, a.w_stride == 0, list, warp_n);
  if (a.frozen_sum) {
    if (cta == 0 && (int)threadIdx.x < firsts) {
      mt_instr_row *row = rows + list[threadIdx.x];
      row->wsum = a.frozen_sum[(a.w_stride ? __ldcg(&row->seg) : 0) * a.frozen_stride];
    }
    return;
  }
  const mt_wlines g = mt_wlines_of(a.n, a.k, MT_SAMPLE_STEP);
  const uint32_t blocks = (g.items + blockDim.x - 1) / blockDim.x;
  for (uint32_t u = cta; u < (uint32_t)firsts * blocks; u += ctas) {
    mt_instr_row *row = rows + list[u / blocks];
    const uint16_t *w = (const uint16_t *)a.w + (a.w_stride ? __ldcg(&row->seg) : 0) * a.w_stride;
    const uint32_t item = u % blocks * blockDim.x + threadIdx.x;
    const uint64_t s = cta_sum(weight_item(w, a.ldw, g, a.in_out, item), warp_part);
    if (threadIdx.x == 0)
      atomicAdd((unsigned long long *)&row->wsum, (unsigned long long)s);
  }
}

// The weight's weight_sum (or each grouped row's own weight's); the bias in CTA 0; then the last
// CTA to finish publishes the block. CTA `cta` of `ctas`: mt_instr_finish's grid, or the digest's
// last CTA alone (its rows written by the other CTAs of its grid: read from L2, never from L1).
__device__ void finish_body(const mt_instr_finish_args &a, unsigned cta, unsigned ctas) {
  __shared__ uint64_t warp_part[8];
  __shared__ bool last;
  mt_instr_header *hdr = a.hdr;
  const bool digest = a.w && *(volatile unsigned *)&hdr->selected > 0; // the same for all CTAs
  uint64_t h = 0, b = 0;
  if (digest && a.grouped) {
    grouped_sums(a, warp_part, cta, ctas);
  } else if (digest && !a.frozen_sum) {
    h = weight_sum_part((const uint16_t *)a.w, a.ldw, mt_wlines_of(a.n, a.k, MT_SAMPLE_STEP),
                        a.in_out, cta * blockDim.x + threadIdx.x, ctas * blockDim.x);
  }
  if (digest && cta == 0 && a.bias) {
    const unsigned char *p = (const unsigned char *)a.bias;
    for (int64_t off = 16 * (int64_t)threadIdx.x; off < a.bias_bytes; off += 16 * blockDim.x) {
      uint64_t lo = 0, hi = 0;
      for (int j = 7; j >= 0; j--) {
        lo = lo << 8 | (off + j < a.bias_bytes ? p[off + j] : 0);
        hi = hi << 8 | (off + 8 + j < a.bias_bytes ? p[off + 8 + j] : 0);
      }
      b += mt_instr_piece((uint64_t)(off / 16), lo, hi);
    }
  }
  h = warp_sum(h);
  b = warp_sum(b);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  if (lane == 0)
    warp_part[warp] = h;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint64_t s = 0;
    for (int w = 0; w < warps; w++)
      s += warp_part[w];
    if (digest && a.frozen_sum) {
      hdr->wsum = *a.frozen_sum;
    } else if (digest && !a.grouped) {
      atomicAdd((unsigned long long *)&hdr->wsum, (unsigned long long)s);
    }
  }
  __syncthreads();
  if (lane == 0)
    warp_part[warp] = b;
  __syncthreads();
  if (threadIdx.x == 0) {
    if (digest && cta == 0 && a.bias) {
      uint64_t s = 0;
      for (int w = 0; w < warps; w++)
        s += warp_part[w];
      hdr->bsum = s;
    }
    __threadfence();
    last = atomicAdd(&hdr->finished, 1u) == ctas - 1;
  }
  __syncthreads();
  if (!last)
    return;
  // the publication: every CTA's sums are in the header (fenced before their count). A captured
  // call's (seq 0) is the flag's seqlock: odd while the block is written, the next even value once
  // it is whole (kernels/instr.h)
  __shared__ uint32_t flag_was;
  __threadfence();
  if (a.seq == 0 && threadIdx.x == 0) {
    flag_was = *(volatile uint32_t *)a.flag;
    *(volatile uint32_t *)a.flag = flag_was + 1;
    __threadfence_system();
  }
  __syncthreads();
  const unsigned rows = min((unsigned)a.cap, *(volatile unsigned *)&hdr->selected);
  const int64_t words = (int64_t)(sizeof(mt_instr_header) + rows * sizeof(mt_instr_row)) / 16;
  const uint4 *src = (const uint4 *)hdr;
  uint4 *dst = (uint4 *)a.dst;
  for (int64_t i = threadIdx.x; i < words; i += blockDim.x)
    dst[i] = __ldcg(src + i); // from L2, where the other CTAs' sums and atomics are
  __syncthreads();
  for (int i = threadIdx.x; i < (int)(sizeof(mt_instr_header) / 16); i += blockDim.x)
    ((uint4 *)hdr)[i] = make_uint4(0, 0, 0, 0); // ready for the slot's next use
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    *(volatile uint32_t *)a.flag = a.seq ? a.seq : flag_was + 2;
  }
}

extern "C" __global__ void __launch_bounds__(256) mt_instr_finish(const mt_instr_finish_args a) {
  finish_body(a, blockIdx.x, gridDim.x);
}

// A warp a row; with `publish`, the grid's last CTA to finish its rows then runs the finish
// (every thread's rows fenced before its CTA is counted).
extern "C" __global__ void __launch_bounds__(256) mt_instr_digest(const mt_instr_digest_args a) {
  __shared__ bool last;
  const int r = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
  if (r < a.m)
    digest_row(a, r, threadIdx.x % 32);
  if (!a.publish)
    return;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0)
    last = atomicAdd(&a.hdr->digested, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!last)
    return;
  __threadfence();
  finish_body(a.fin, 0, 1);
}

extern "C" __global__ void __launch_bounds__(256) mt_instr_shadow(const mt_instr_shadow_args a) {
  const uint64_t total = (uint64_t)a.m * a.n;
  double d2 = 0.0, r2 = 0.0;
  float mx = 0.0f;
  unsigned bad = 0;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (uint64_t)gridDim.x * blockDim.x) {
    uint64_t r = i / a.n, j = i % a.n;
    int64_t at = mt_instr_row_offset(a.seg_rows > 0 ? (int32_t)(r / a.seg_rows) : 0, a.seg_rows,
                                     a.stride, a.ld, (int64_t)r) +
                 j;
    float y = mt_instr_half_to_float(((const uint16_t *)a.y)[at], a.type);
    float ref = mt_instr_half_to_float(((const uint16_t *)a.ref)[at], a.type);
    if (!isfinite(y) || !isfinite(ref)) {
      bad++;
      continue;
    }
    double d = (double)y - (double)ref;
    d2 += d * d;
    r2 += (double)ref * ref;
    mx = fmaxf(mx, abs_diff(y, ref));
  }
  for (int o = 16; o > 0; o >>= 1) {
    d2 += __shfl_xor_sync(0xffffffffu, d2, o);
    r2 += __shfl_xor_sync(0xffffffffu, r2, o);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    bad += __shfl_xor_sync(0xffffffffu, bad, o);
  }
  if (threadIdx.x % 32)
    return;
  atomicAdd(&a.hdr->shadow_d2, d2);
  atomicAdd(&a.hdr->shadow_r2, r2);
  atomicMax(&a.hdr->shadow_max_bits, __float_as_uint(mx)); // non-negative: ordered as integers
  if (bad)
    atomicAdd(&a.hdr->shadow_nonfinite, bad);
}

// One CTA per probed row.
extern "C" __global__ void __launch_bounds__(256) mt_instr_probe(const mt_instr_probe_args a) {
  const int p = blockIdx.x;
  if (p >= a.nrows)
    return;
  if (a.offs && a.rows[p] >= a.offs[a.nseg - 1]) { // in no segment: the call never wrote it
    if (threadIdx.x == 0)
      atomicAdd(&a.hdr->probe_outside, 1u);
    return;
  }
  const uint16_t *in_batch = (const uint16_t *)a.y + a.yoff[p];
  const uint16_t *alone = (const uint16_t *)a.alone + (int64_t)p * a.ld_alone;
  int differ = 0;
  float mx = 0.0f;
  for (int j = threadIdx.x; j < a.n; j += blockDim.x) {
    if (in_batch[j] == alone[j])
      continue;
    differ = 1;
    float d = abs_diff(mt_instr_half_to_float(in_batch[j], a.type),
                       mt_instr_half_to_float(alone[j], a.type));
    mx = fmaxf(mx, d != d ? __int_as_float(0x7f800000) : d); // NaN against a number: Inf
  }
  differ = __syncthreads_or(differ);
  for (int o = 16; o > 0; o >>= 1)
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  if (threadIdx.x % 32 == 0 && mx > 0.0f)
    atomicMax(&a.hdr->probe_max_bits, __float_as_uint(mx));
  if (threadIdx.x == 0 && differ)
    atomicAdd(&a.hdr->probe_differing, 1u);
}

// One CTA per probed row of a grouped call with offsets (mt_instr_offs_args).
extern "C" __global__ void __launch_bounds__(256) mt_instr_offs(const mt_instr_offs_args a) {
  const int p = blockIdx.x;
  if (p >= a.nrows)
    return;
  for (int s = threadIdx.x; s < a.nseg; s += blockDim.x)
    a.out[(int64_t)p * a.nseg + s] = a.offs[s] > a.rows[p] ? 1 : 0;
}
