// whash.cuh — the frozen cache's content hash of a weight slice, shared by the per-call check
// (kernels/wcheck.cu) and the store's refresh (kernels/quant.cu, refresh_store) so that both hash
// alike (tests/gpu/test_grouped.c and tests/gpu/test_kernels.c check each against in-place
// changes); and the slices a grouped call covers, which the refresh walks.
//
// The hash of a slice is a sum mod 2^64 of a 64-bit mix of each 16-byte piece and its position in
// the slice: integer addition is exact and order-free, so the result is the same whatever the grid.
// A changed slice goes unseen only if the two sums collide (about 2^-64). A sampled check hashes
// the lines mt_whash_line names (kernels/whash.h), the same at every call.
#pragma once

#include <stdint.h>

#include "kernels/gemm_args.h"
#include "kernels/whash.h"

__device__ static inline uint64_t mt_mix64(uint64_t z) { // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__device__ static inline uint64_t mt_piece_hash(uint4 v, uint64_t i) {
  uint64_t lo = (uint64_t)v.y << 32 | v.x, hi = (uint64_t)v.w << 32 | v.z;
  return mt_mix64(lo + 0x9E3779B97F4A7C15ull * (2 * i + 1)) ^
         mt_mix64(hi ^ (0xD6E8FEB86659FD93ull * (i + 1)));
}

// A slice's geometry in 128-byte lines (row-major; the last line of a row may be short).
struct mt_wlines {
  int per_row;       // 16-byte pieces of a row (cols % 16 == 0)
  int lines_per_row; // 128-byte lines of a row
  uint32_t lines;    // of the slice (the launchers check that they fit 32 bits: mt_whash_lines_fit)
  uint32_t items;    // the lines a check of `step` walks (mt_whash_items)
};

__device__ static inline mt_wlines mt_wlines_of(int rows, int cols, uint32_t step) {
  mt_wlines g;
  g.per_row = cols / 8;
  g.lines_per_row = (g.per_row + 7) / 8;
  g.lines = (uint32_t)rows * g.lines_per_row;
  g.items = (uint32_t)mt_whash_items(g.lines, step);
  return g;
}

// Line `line` of a slice (row stride ldw elements): its hash. Its 16-byte pieces are loaded before
// any is hashed: 8 loads in flight a thread, where one at a time reached ~0.9 TB/s.
__device__ static inline uint64_t mt_line_hash(const uint16_t *w, int64_t ldw, const mt_wlines &g,
                                               uint32_t line) {
  const uint32_t r = line / g.lines_per_row;
  const int j0 = (int)(line - r * g.lines_per_row) * 8, n = min(8, g.per_row - j0);
  const uint4 *src = (const uint4 *)(w + (int64_t)r * ldw) + j0;
  uint4 v[8];
#pragma unroll
  for (int j = 0; j < 8; j++)
    if (j < n)
      v[j] = src[j];
  uint64_t h = 0;
#pragma unroll
  for (int j = 0; j < 8; j++)
    if (j < n)
      h += mt_piece_hash(v[j], (uint64_t)r * g.per_row + j0 + j);
  return h;
}

// The hash of item `item` of a check of `step` (0 past the slice's last line).
__device__ static inline uint64_t mt_item_hash(const uint16_t *w, int64_t ldw, const mt_wlines &g,
                                               uint32_t step, uint32_t item) {
  const uint32_t line = item < g.items ? (uint32_t)mt_whash_line(item, step) : g.lines;
  return line < g.lines ? mt_line_hash(w, ldw, g, line) : 0;
}

// The slices a check covers, i = 0 .. n-1: every slice without a segment table; with one, those
// with rows in the call, listed in increasing order in `list` (the CTA's shared memory, 4 bytes a
// slice) by mt_covered_list, so that every CTA numbers them alike.
struct mt_slices_of {
  const int *list;
  int n;
  __device__ int operator[](int i) const { return list ? list[i] : i; }
};

// The list, from the segments' ends (offs: cumulative, clamped to m) read by the CTA's `nthreads`
// threads at once (thread `tid`; a multiple of 32; a round of nthreads slices costs one trip to
// memory): each warp's covered slices are placed after those of the warps and rounds before it.
// Every thread of the CTA calls it.
__device__ static mt_slices_of mt_covered_list(const int32_t *offs, int slices, int m, int *list,
                                               int tid, int nthreads) {
  if (!offs)
    return {nullptr, slices};
  __shared__ int warp_n[32];
  const int lane = tid % 32, warp = tid / 32, warps = nthreads / 32;
  int n = 0;
  for (int base = 0; base < slices; base += nthreads) {
    const int e = base + tid;
    int start, rows = 0;
    if (e < slices)
      mt_offs_span(offs, e, m, &start, &rows);
    const uint32_t ballot = __ballot_sync(0xffffffffu, rows > 0);
    if (lane == 0)
      warp_n[warp] = __popc(ballot);
    __syncthreads();
    int before = n;
    for (int w = 0; w < warps; w++) {
      if (w == warp)
        before = n;
      n += warp_n[w];
    }
    if (rows > 0)
      list[before + __popc(ballot & ((1u << lane) - 1))] = e;
    __syncthreads(); // warp_n before the next round's
  }
  return {list, n};
}
