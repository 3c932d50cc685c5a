// instr.cu — the instruments' kernels (shim/instr.c enqueues them after a routed GEMM, on the
// call's stream, into a result block the host reads later without synchronizing the stream):
//   mt_instr_digest  the lead hashes of the activations' rows, and for the rows the rate picks by
//                    them, the row hash, the output row's hash and its 8-value sketch (scheme 3,
//                    kernels/instr.h)
//   mt_instr_shadow  sum (y - ref)^2, sum ref^2 and max |y - ref| of the routed output against
//                    the BF16 GEMM's
//   mt_instr_shadow_rows  the same on a few rows of a grouped call with no cuBLAS call to rerun,
//                    against the FP32 product it forms itself
//   mt_instr_probe   rows recomputed alone against their in-batch rows, bit for bit
//   mt_instr_finish  the weight's weight_sum (1/512 of its lines, or the frozen-sampled cache's
//                    stored hash) and the bias's content sum, only when a row was digested; then
//                    the publication: the result block into mapped pinned host memory, the slot's
//                    flag last (the host polls it; it never waits on the stream), or, for a call
//                    with nothing to report, the flag alone, marked empty (a captured call's
//                    replay: nothing)
// Integer sums (hashes) are exact and order-free, so any grid gives the same bits; the sketch is
// an FP32 sum whose order the format leaves free. Tested on the CPU through the host twin in
// kernels/instr.h (tests/cpu/test_shim_instr.c: twin against tools/minite-compare's Python
// reference); this file's digest, finish and shadows themselves on the CPU against that twin by
// tests/cpu/test_instr_emu.cc (tests/cpu/cuda_emu.h); and on the GPU by
// tests/gpu/test_instruments.py (digests of two processes with different batchings join bitwise;
// probe and shadow figures).
#include <stddef.h>
#include <stdint.h>

#include "kernels/instr.h"
#include "kernels/pdl.cuh"
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

// Piece i of a row of `elems` 2-byte elements (16-byte aligned), the last one zero-padded.
__device__ __forceinline__ uint4 piece_at(const uint16_t *row, int elems, int i) {
  if (8 * i + 8 <= elems)
    return *(const uint4 *)(row + 8 * i);
  uint16_t e[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int j = 0; 8 * i + j < elems; j++)
    e[j] = row[8 * i + j];
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; k++)
    w[k] = e[2 * k] | (uint32_t)e[2 * k + 1] << 16;
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// content_sum of a row of `elems` 2-byte elements (16-byte aligned: the router's rule), the share
// of pieces first, first + stride, ...; the last piece zero-padded. Whole pieces four at a time,
// loaded before any is hashed: one load in flight a thread leaves DRAM's latency exposed.
__device__ uint64_t row_sum_part(const uint16_t *row, int elems, int first, int stride) {
  uint64_t h = 0;
  const int pieces = (elems + 7) / 8;
  int i = first;
  for (; i + 3 * stride < elems / 8; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; u++)
      v[u] = *(const uint4 *)(row + 8 * (i + stride * u));
#pragma unroll
    for (int u = 0; u < 4; u++)
      h += piece_of(i + stride * u, v[u]);
  }
  for (; i < pieces; i += stride)
    h += piece_of(i, piece_at(row, elems, i));
  return h;
}

__device__ __forceinline__ float abs_diff(float a, float b) { return fabsf(a - b); }

} // namespace

// A share of an output row's content sum and of its sketch's eight sums, from one pass over its
// pieces first, first + stride, ... (four at a time, as row_sum_part): one hash an element gives
// its eight signs. The sketch's FP32 order is the share's pieces in turn.
__device__ uint64_t out_pass_part(const uint16_t *y, int n, int type, int first, int stride,
                                  float s[MT_INSTR_SKETCH]) {
  for (int i = 0; i < MT_INSTR_SKETCH; i++)
    s[i] = 0.0f;
  uint64_t h = 0;
  const int pieces = (n + 7) / 8;
  for (int i0 = first; i0 < pieces; i0 += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; u++)
      v[u] = i0 + stride * u < pieces ? piece_at(y, n, i0 + stride * u) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const int i = i0 + stride * u;
      if (i >= pieces)
        continue;
      h += piece_of(i, v[u]);
      const uint32_t w[4] = {v[u].x, v[u].y, v[u].z, v[u].w};
#pragma unroll // unrolled, w's index is a constant: a loop's would put w in local memory
      for (int e = 0; e < 8; e++) {
        if (8 * i + e >= n)
          break;
        const float f = mt_instr_half_to_float((uint16_t)(w[e / 2] >> (16 * (e % 2))), type);
        const uint64_t signs = mt_instr_sign_bits(8 * i + e);
#pragma unroll
        for (int k = 0; k < MT_INSTR_SKETCH; k++)
          s[k] += (signs >> (63 - k) & 1) ? -f : f;
      }
    }
  }
  return h;
}

// A digest CTA's rows that its leads chose and that got a slot, in the order they got it: the
// CTA's warps then share each one's row and output passes (Nsight Compute: one warp's pass over a
// chosen row, ~3,000 instructions in series, was the whole kernel's time).
struct chosen_rows {
  int n;
  int r[MT_INSTR_DIGEST_WARPS], seg[MT_INSTR_DIGEST_WARPS];
  unsigned slot[MT_INSTR_DIGEST_WARPS];
  uint64_t lead[MT_INSTR_DIGEST_WARPS];
  // each row's sums by part: part p is warp p's share of the pieces (i % 256 / 32 == p), summed
  // in part order at the end, so that a row's sketch has the same bits however many rows its CTA
  // chose
  uint64_t x_sum[MT_INSTR_DIGEST_WARPS][MT_INSTR_DIGEST_WARPS];
  uint64_t y_sum[MT_INSTR_DIGEST_WARPS][MT_INSTR_DIGEST_WARPS];
  float sketch[MT_INSTR_DIGEST_WARPS][MT_INSTR_DIGEST_WARPS][MT_INSTR_SKETCH];
};

// Row r's lead, by one warp: when the rate picks it and the block has room, the row joins the list.
__device__ void choose_row(const mt_instr_digest_args &a, const int32_t *offs, int r, int lane,
                           chosen_rows *c) {
  const int32_t seg = mt_instr_segment(offs, a.nseg, a.seg_rows, r);
  if (seg < 0)
    return; // past the last segment's end: never written
  const uint16_t *x = (const uint16_t *)a.x + mt_instr_digest_x(&a, seg, r);
  const uint64_t lead =
      mt_instr_mix64(warp_sum(row_sum_part(x, min(a.k, MT_INSTR_LEAD), lane, 32)) ^
                     mt_instr_tag((uint64_t)a.k, a.xtype));
  if ((!a.all && lead >= a.threshold) || lane != 0)
    return;
  const unsigned slot = atomicAdd(&a.hdr->selected, 1u);
  if ((int)slot >= a.cap)
    return; // counted by `selected`; the host reports the excess as dropped
  const int j = atomicAdd(&c->n, 1);
  c->r[j] = r;
  c->seg[j] = seg;
  c->slot[j] = slot;
  c->lead[j] = lead;
}

// Warp `part`'s share of chosen row j: its pieces of the x row (when longer than its lead) and
// of the output row.
__device__ void digest_part(const mt_instr_digest_args &a, chosen_rows *c, int j, int part,
                            int lane) {
  const int t = part * 32 + lane, stride = 32 * MT_INSTR_DIGEST_WARPS;
  const uint16_t *x = (const uint16_t *)a.x + mt_instr_digest_x(&a, c->seg[j], c->r[j]);
  const uint16_t *y = (const uint16_t *)a.y + mt_instr_digest_y(&a, c->seg[j], c->r[j]);
  const uint64_t hx = a.k > MT_INSTR_LEAD ? warp_sum(row_sum_part(x, a.k, t, stride)) : 0;
  float s[MT_INSTR_SKETCH];
  const uint64_t hy = warp_sum(out_pass_part(y, a.n, a.ytype, t, stride, s));
  for (int i = 0; i < MT_INSTR_SKETCH; i++) {
    const float v = warp_sumf(s[i]);
    if (lane == 0)
      c->sketch[j][part][i] = v;
  }
  if (lane == 0) {
    c->x_sum[j][part] = hx;
    c->y_sum[j][part] = hy;
  }
}

// Chosen row j's record from its parts, into its slot of the block.
__device__ void write_row(const mt_instr_digest_args &a, const chosen_rows *c, int j) {
  uint64_t hx = 0, hy = 0;
  float s[MT_INSTR_SKETCH] = {};
  for (int p = 0; p < MT_INSTR_DIGEST_WARPS; p++) {
    hx += c->x_sum[j][p];
    hy += c->y_sum[j][p];
    for (int i = 0; i < MT_INSTR_SKETCH; i++)
      s[i] += c->sketch[j][p][i];
  }
  mt_instr_row *out = a.rows + c->slot[j];
  const float scale = 1.0f / sqrtf((float)a.n);
  for (int i = 0; i < MT_INSTR_SKETCH; i++)
    out->sketch[i] = s[i] * scale;
  out->row_hash =
      a.k > MT_INSTR_LEAD ? mt_instr_mix64(hx ^ mt_instr_tag((uint64_t)a.k, a.xtype)) : c->lead[j];
  out->out_hash = mt_instr_mix64(hy ^ mt_instr_tag((uint64_t)a.n, a.ytype));
  out->wsum = 0;
  out->seg = c->seg[j];
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
                          int *warp_n, int *segs) {
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  if ((unsigned)t < kept) // read once, then compared in shared memory (a row with those before it)
    segs[t] = rows[t].seg;
  __syncthreads();
  bool first = (unsigned)t < kept && (!one_weight || t == 0);
  if (first && !one_weight)
    for (int j = 0; j < t && first; j++)
      first = segs[j] != segs[t];
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
__device__ void grouped_sums(const mt_instr_finish_args &a, uint64_t *warp_part) {
  __shared__ int list[256], warp_n[8], segs[256];
  mt_instr_row *rows = (mt_instr_row *)(a.hdr + 1);
  const unsigned kept = min((unsigned)a.cap, *(volatile unsigned *)&a.hdr->selected);
  const int firsts = first_rows(rows, kept, a.w_stride == 0, list, warp_n, segs);
  if (a.frozen_sum) {
    if (blockIdx.x == 0 && (int)threadIdx.x < firsts) {
      mt_instr_row *row = rows + list[threadIdx.x];
      row->wsum = a.frozen_sum[(a.w_stride ? segs[list[threadIdx.x]] : 0) * a.frozen_stride];
    }
    return;
  }
  const mt_wlines g = mt_wlines_of(a.n, a.k, MT_SAMPLE_STEP);
  const uint32_t blocks = (g.items + blockDim.x - 1) / blockDim.x;
  for (uint32_t u = blockIdx.x; u < (uint32_t)firsts * blocks; u += gridDim.x) {
    mt_instr_row *row = rows + list[u / blocks];
    const uint16_t *w =
        (const uint16_t *)a.w + (a.w_stride ? segs[list[u / blocks]] : 0) * a.w_stride;
    const uint32_t item = u % blocks * blockDim.x + threadIdx.x;
    const uint64_t s = cta_sum(weight_item(w, a.ldw, g, a.in_out, item), warp_part);
    if (threadIdx.x == 0)
      atomicAdd((unsigned long long *)&row->wsum, (unsigned long long)s);
  }
}

static_assert(sizeof(mt_instr_header) == 64 && offsetof(mt_instr_header, replays) == 60,
              "reset_header writes the header as four 16-byte words, the count last");

// The header zeroed for the slot's next use, all but its replay count (the last word's last
// field), in four 16-byte stores.
__device__ void reset_header(mt_instr_header *hdr, uint32_t replays) {
  if (threadIdx.x < 4)
    ((uint4 *)hdr)[threadIdx.x] = make_uint4(0, 0, 0, threadIdx.x == 3 ? replays : 0);
}

// The publication of a call that chose no row and has nothing else to report: the flag alone,
// marked empty, or for a captured call's replay nothing but its replay count. Only CTA 0 of a
// finish runs it (a call that digested no row never counts its CTAs in `finished`), and it left
// the header as the last use did, zeroed: nothing to order before the flag.
__device__ void publish_empty(const mt_instr_finish_args &a) {
  if (a.seq != 0 && threadIdx.x == 0)
    *(volatile uint32_t *)a.flag = a.seq | MT_INSTR_EMPTY;
  if (a.tick && threadIdx.x == 0) // the replay is over; the next one's digest reads the count
    ++*a.tick;
}

// This thread's share of the bias's content sum (kernels/instr.h): its 16-byte pieces `threadIdx.x`,
// + blockDim.x, ..., the last one zero-padded.
__device__ uint64_t bias_sum_part(const mt_instr_finish_args &a) {
  const unsigned char *p = (const unsigned char *)a.bias;
  uint64_t b = 0;
  for (int64_t off = 16 * (int64_t)threadIdx.x; off < a.bias_bytes; off += 16 * blockDim.x) {
    uint64_t lo = 0, hi = 0;
    for (int j = 7; j >= 0; j--) {
      lo = lo << 8 | (off + j < a.bias_bytes ? p[off + j] : 0);
      hi = hi << 8 | (off + 8 + j < a.bias_bytes ? p[off + 8 + j] : 0);
    }
    b += mt_instr_piece((uint64_t)(off / 16), lo, hi);
  }
  return b;
}

// The publication, by the last CTA to finish: every CTA's sums are in the header (fenced before
// their count). A call that chose no row and has nothing else to report writes the flag alone;
// otherwise the header and the kept rows are copied to the host block, the header is zeroed for
// the slot's next use, then the flag is set. A captured call's (seq 0) flag is a seqlock: odd
// while the block is written, the next even value once it is whole.
__device__ void publish_block(const mt_instr_finish_args &a) {
  mt_instr_header *hdr = a.hdr;
  if (a.empty_ok && hdr->selected == 0) {
    publish_empty(a);
    return;
  }
  __shared__ uint32_t count; // a captured slot's replays so far (kernels/instr.h)
  if (threadIdx.x == 0)
    count = *(volatile uint32_t *)&hdr->replays;
  __syncthreads();
  __threadfence();
  if (a.seq == 0 && threadIdx.x == 0) {
    *(volatile uint32_t *)a.flag = 2 * count + 1;
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
  reset_header(hdr, a.seq ? count : count + 1);
  // one system fence, thread 0's after the barrier: cumulative, it orders every thread's copy
  // before the flag (a fence in each thread cost each its own round trip)
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    *(volatile uint32_t *)a.flag = a.seq ? a.seq : 2 * count + 2;
    if (a.tick)
      ++*a.tick;
  }
}

// The weight's weight_sum (or each grouped row's own weight's); the bias in CTA 0; then the last
// CTA to finish publishes the block.
extern "C" __global__ void __launch_bounds__(256) mt_instr_finish(const mt_instr_finish_args a) {
  __shared__ uint64_t warp_part[8];
  __shared__ bool last;
  // launched dependent: wait for the digest's rows and counts, and the GEMM before it
  grid_dependency_wait();
  mt_instr_header *hdr = a.hdr;
  const bool digest = a.w && hdr->selected > 0; // the same for the whole grid
  // no row digested: nothing to sum, so CTA 0 publishes alone and the others have nothing to do
  const bool alone = gridDim.x == 1 || !digest;
  if (alone && blockIdx.x > 0)
    return;
  if (digest) { // uniform across the grid: the sums' barriers only where a row was digested
    uint64_t h = 0;
    if (a.grouped)
      grouped_sums(a, warp_part);
    else if (!a.frozen_sum)
      h = weight_sum_part((const uint16_t *)a.w, a.ldw, mt_wlines_of(a.n, a.k, MT_SAMPLE_STEP),
                          a.in_out, blockIdx.x * blockDim.x + threadIdx.x, gridDim.x * blockDim.x);
    h = cta_sum(h, warp_part);
    const uint64_t b = cta_sum(blockIdx.x == 0 && a.bias ? bias_sum_part(a) : 0, warp_part);
    if (threadIdx.x == 0 && a.frozen_sum)
      hdr->wsum = *a.frozen_sum;
    else if (threadIdx.x == 0 && !a.grouped)
      atomicAdd((unsigned long long *)&hdr->wsum, (unsigned long long)h);
    if (threadIdx.x == 0 && blockIdx.x == 0 && a.bias)
      hdr->bsum = b;
  }
  if (threadIdx.x == 0) {
    last = alone; // no CTA waits on its sums: no count, no fence
    if (!last) {
      __threadfence();
      last = atomicAdd(&hdr->finished, 1u) == gridDim.x - 1;
    }
  }
  __syncthreads();
  if (last)
    publish_block(a);
}

static_assert(32 * MT_INSTR_DIGEST_WARPS == 256, "kernels/instr.c launches 256 threads a CTA");

// A warp a row's lead; then the CTA's chosen rows, each one's passes shared by all its warps. A
// grouped call's offsets (up to MT_INSTR_SMEM_SEGS) are read into shared memory once: each row's
// binary search over them in global memory was a chain of dependent loads.
extern "C" __global__ void __launch_bounds__(256) mt_instr_digest(const mt_instr_digest_args a) {
  __shared__ int32_t offs[MT_INSTR_SMEM_SEGS];
  __shared__ chosen_rows c;
  // launched dependent (kernels/instr.c): the finish may start now, and waits for this grid's end
  allow_dependents();
  // a captured call's replays digest one in `every`: the others choose nothing, and their finish
  // publishes nothing. The count is the last replay's finish's, long ended: read before the wait
  const bool skip = a.tick && *(volatile const uint32_t *)a.tick % a.every;
  // the GEMM's output and its inputs; and every CTA waits, skipping or not, so that this grid, and
  // with it the finish, ends after the GEMM: the stream's order for the kernels after them
  grid_dependency_wait();
  if (skip)
    return;
  const int32_t *o = a.offs;
  if (o && a.nseg <= MT_INSTR_SMEM_SEGS) {
    for (int i = threadIdx.x; i < a.nseg; i += blockDim.x)
      offs[i] = a.offs[i];
    o = offs;
  }
  if (threadIdx.x == 0)
    c.n = 0;
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int r = blockIdx.x * MT_INSTR_DIGEST_WARPS + warp;
  if (r < a.m)
    choose_row(a, o, r, lane, &c);
  __syncthreads();
  const int chosen = c.n;
  if (chosen == 0)
    return;
  for (int j = 0; j < chosen; j++)
    digest_part(a, &c, j, warp, lane);
  __syncthreads();
  if (warp < chosen && lane == 0)
    write_row(a, &c, warp);
}

// A thread's share of a shadow: squared differences and squared references over the finite
// pairs, the largest |y - ref|, the pairs where either is NaN or Inf.
struct shadow_part {
  double d2 = 0.0, r2 = 0.0;
  float mx = 0.0f;
  unsigned bad = 0;
};

__device__ void shadow_add(shadow_part &s, float y, float ref) {
  if (!isfinite(y) || !isfinite(ref)) {
    s.bad++;
    return;
  }
  const double d = (double)y - (double)ref;
  s.d2 += d * d;
  s.r2 += (double)ref * ref;
  s.mx = fmaxf(s.mx, abs_diff(y, ref));
}

// The warp's shares summed, then added to the header by its lane 0 (every thread calls it).
__device__ void shadow_publish(shadow_part s, mt_instr_header *hdr) {
  for (int o = 16; o > 0; o >>= 1) {
    s.d2 += __shfl_xor_sync(0xffffffffu, s.d2, o);
    s.r2 += __shfl_xor_sync(0xffffffffu, s.r2, o);
    s.mx = fmaxf(s.mx, __shfl_xor_sync(0xffffffffu, s.mx, o));
    s.bad += __shfl_xor_sync(0xffffffffu, s.bad, o);
  }
  if (threadIdx.x % 32)
    return;
  atomicAdd(&hdr->shadow_d2, s.d2);
  atomicAdd(&hdr->shadow_r2, s.r2);
  atomicMax(&hdr->shadow_max_bits, __float_as_uint(s.mx)); // non-negative: ordered as integers
  if (s.bad)
    atomicAdd(&hdr->shadow_nonfinite, s.bad);
}

extern "C" __global__ void __launch_bounds__(256) mt_instr_shadow(const mt_instr_shadow_args a) {
  const uint64_t total = (uint64_t)a.m * a.n;
  shadow_part s;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (uint64_t)gridDim.x * blockDim.x) {
    uint64_t r = i / a.n, j = i % a.n;
    int64_t at = mt_instr_row_offset(a.seg_rows > 0 ? (int32_t)(r / a.seg_rows) : 0, a.seg_rows,
                                     a.stride, a.ld, (int64_t)r) +
                 j;
    shadow_add(s, mt_instr_half_to_float(((const uint16_t *)a.y)[at], a.type),
               mt_instr_half_to_float(((const uint16_t *)a.ref)[at], a.type));
  }
  shadow_publish(s, a.hdr);
}

// A CTA for each 256 columns of a sampled row: a thread a column, its reference a k-long chain of
// FP32 fused multiply-adds (mt_instr_shadow_ref). Up to 8 rows a call, at 1/64 of its calls: the
// weights' reads are not coalesced ([n][k]: a thread a row of W) and need not be.
extern "C" __global__ void __launch_bounds__(256)
    mt_instr_shadow_rows(const mt_instr_shadow_rows_args a) {
  const int chunks = (a.n + 255) / 256;
  const int i = blockIdx.x / chunks, j = blockIdx.x % chunks * 256 + threadIdx.x;
  const int64_t r = i < a.nrows ? a.rows[i] : 0;
  const int32_t seg = i < a.nrows ? mt_instr_segment(a.offs, a.nseg, a.seg_rows, r) : -1;
  shadow_part s;
  if (seg >= 0 && j < a.n) {
    const uint16_t *y =
        (const uint16_t *)a.y + mt_instr_row_offset(seg, a.seg_rows, a.stride_y, a.ldy, r);
    shadow_add(s, mt_instr_half_to_float(y[j], a.ytype), mt_instr_shadow_ref(&a, seg, r, j));
  }
  shadow_publish(s, a.hdr);
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
