// wcheck.cu — has a weight changed since it was last quantized? The frozen weight cache's check.
//
// The shim keeps quantized weights across calls (weight_cache = frozen) but must never use a stale
// one when the program overwrites a weight in place (an RL sampler does at every weight sync). At
// each call this kernel hashes the weight on the device and lists the slices whose hash differs
// from the one of their last quantization; the quantization kernels that follow on the stream
// requantize only the listed slices. No host read-back, so a captured graph replays the check too.
//
// A weight is one slice (a per-call entry) or an expert tensor's slices (a grouped store). Given
// the call's segment table, the check covers only the slices with rows in the call, and the
// others keep their words: at one token a MoE layer reads and requantizes 8 of 128 experts, and
// an expert not used since a change is checked at the call that next uses it. Cost, nothing
// changed: one read of the covered slices (2 bytes an element).
//
// The hash of a slice is a sum mod 2^64 of a 64-bit mix of each 16-byte piece and its position in
// the slice: integer addition is exact and order-free, so the result is the same whatever the grid.
// A changed slice goes unseen only if the two sums collide (about 2^-64). The sampled check
// (frozen-sampled) hashes one 1 KB run of lines in each `step` runs, the same lines at every call:
// a change that touches none of them goes unseen (1/step of the bytes are read; see README,
// "Weight cache"). Tested on the GPU by tests/gpu/test_grouped.c (store_refresh: whole, one-row and
// one-element changes, sampled lines, slices outside the call) and through the shim by
// tests/gpu/test_routed.py; the launches and the state's handling on the CPU by
// tests/cpu/test_shim_engine.c; the conditional quantization it drives by test_kernels.c.
#include <stdint.h>

#include "kernels/gemm_args.h"
#include "kernels/pdl.cuh"
#include "kernels/wcheck.h"

__device__ static inline uint64_t mix64(uint64_t z) { // splitmix64's finalizer
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__device__ static inline uint64_t piece_hash(uint4 v, uint64_t i) {
  uint64_t lo = (uint64_t)v.y << 32 | v.x, hi = (uint64_t)v.w << 32 | v.z;
  return mix64(lo + 0x9E3779B97F4A7C15ull * (2 * i + 1)) ^ mix64(hi ^ (0xD6E8FEB86659FD93ull * (i + 1)));
}

// The slices the check covers, i = 0 .. n-1: every slice without a segment table; with one, those
// with rows in the call, listed in increasing order in `list` (the CTA's shared memory) by
// covered_list, so that every CTA numbers them alike and the walk below only visits theirs.
struct slices_of {
  const int *list;
  int n;
  __device__ int operator[](int i) const { return list ? list[i] : i; }
};

// The list, from the segments' ends read by every thread at once (a round of blockDim.x slices
// costs one trip to memory; 128 or 256 experts, one round): each warp's covered slices are placed
// after those of the warps and rounds before it.
__device__ static slices_of covered_list(const mt_wcheck_args &a, int *list) {
  if (!a.offs) return {nullptr, a.slices};
  __shared__ int warp_n[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  int n = 0;
  for (int base = 0; base < a.slices; base += blockDim.x) {
    const int e = base + threadIdx.x;
    int start, rows = 0;
    if (e < a.slices) mt_offs_span(a.offs, e, a.m, &start, &rows);
    const uint32_t ballot = __ballot_sync(0xffffffffu, rows > 0);
    if (lane == 0) warp_n[warp] = __popc(ballot);
    __syncthreads();
    int before = n;
    for (int w = 0; w < warps; w++) {
      if (w == warp) before = n;
      n += warp_n[w];
    }
    if (rows > 0) list[before + __popc(ballot & ((1u << lane) - 1))] = e;
    __syncthreads(); // warp_n before the next round's
  }
  return {list, n};
}

// Line `line` of a slice (row-major 128-byte lines; the last of a row may be short): its hash.
// Its 16-byte pieces are loaded before any is hashed: 8 loads in flight a thread, where one at a
// time reached ~0.9 TB/s.
__device__ static inline uint64_t line_hash(const uint16_t *w, int64_t ldw, int per_row, int lines_per_row,
                                            uint32_t line) {
  const uint32_t r = line / lines_per_row;
  const int j0 = (int)(line - r * lines_per_row) * 8, n = min(8, per_row - j0);
  const uint4 *src = (const uint4 *)(w + (int64_t)r * ldw) + j0;
  uint4 v[8];
#pragma unroll
  for (int j = 0; j < 8; j++)
    if (j < n) v[j] = src[j];
  uint64_t h = 0;
#pragma unroll
  for (int j = 0; j < 8; j++)
    if (j < n) h += piece_hash(v[j], (uint64_t)r * per_row + j0 + j);
  return h;
}

// The last CTA to finish turns each covered slice's sum into its verdict, keeps the sum as the
// slice's hash, lists the changed slices for the quantizers (zeroing their amax words) and resets
// the words for the next call. A slice the call does not cover is not listed: its quantization is
// not redone at this call.
__device__ static void finish(const mt_wcheck_args &a, const slices_of &cov) {
  __shared__ bool last;
  __shared__ uint32_t changed;
  __threadfence(); // this thread's sums before the CTA's count
  __syncthreads();
  mt_wcheck_head *head = (mt_wcheck_head *)a.state;
  if (threadIdx.x == 0) {
    last = atomicAdd(&head->done, 1u) == gridDim.x - 1;
    changed = 0;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  mt_wcheck_slice *sl = mt_wcheck_slices(a.state);
  uint32_t *list = mt_wcheck_list(a.state, a.slices);
  for (int i = threadIdx.x; i < cov.n; i += blockDim.x) {
    const int e = cov[i];
    const uint64_t sum = *(volatile uint64_t *)&sl[e].sum;
    if (!sl[e].valid || sum != sl[e].hash) {
      list[1 + atomicAdd(&changed, 1u)] = e;
      if (a.amax) *(uint32_t *)((char *)a.amax + e * a.amax_stride) = 0;
    }
    sl[e].hash = sum;
    sl[e].valid = 1;
    sl[e].sum = 0;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    list[0] = changed;
    head->done = 0;
  }
}

// Each warp takes chunks of one covered slice's items (a turn: a line a lane, 32 lines; 4 turns a
// chunk, 1 when sampled) and adds a chunk's sum to its slice's with one atomic. The list of the
// covered slices takes 4 bytes a slice of dynamic shared memory when there is a segment table.
extern "C" __global__ void __launch_bounds__(256) mt_wcheck(const mt_wcheck_args a) {
  // A sampled check is short: the quantizers after it (launched dependent under its list:
  // kernels/pdl.cuh) may start now, and wait for all of it. A full one streams the weight: they
  // start when it ends. (The check itself is launched in order: launched dependent on the kernel
  // before it, the full check ran 10-20% slower, for a reason not found: lab/NOTES.md.)
  if (a.step > 1) allow_dependents();
  const int per_row = a.cols / 8;              // 16-byte pieces of a row (cols % 16 == 0)
  const int lines_per_row = (per_row + 7) / 8; // 128-byte lines (the last may be short)
  // a slice's lines and items fit 32 bits (the launcher checks), so the divisions here are 32-bit
  const uint32_t lines = (uint32_t)a.rows * lines_per_row, items = (uint32_t)mt_wcheck_items(lines, a.step);
  const int turns = a.step > 1 ? 1 : 4, lane = threadIdx.x % 32;
  const uint32_t chunk = 32 * turns, chunks = (items + chunk - 1) / chunk;
  extern __shared__ int covered_smem[];
  const slices_of cov = covered_list(a, covered_smem);
  const uint64_t total = (uint64_t)chunks * cov.n, warps = (uint64_t)gridDim.x * blockDim.x / 32;
  mt_wcheck_slice *sl = mt_wcheck_slices(a.state);
  for (uint64_t c = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; c < total; c += warps) {
    const int i = (int)(c / chunks), e = cov[i];
    const uint16_t *w = (const uint16_t *)a.w + (uint64_t)e * a.rows * a.ldw;
    const uint32_t first = (uint32_t)(c - (uint64_t)i * chunks) * chunk + lane;
    uint64_t h = 0;
#pragma unroll 1
    for (int u = 0; u < turns; u++) {
      const uint32_t item = first + u * 32;
      const uint32_t line = item < items ? (uint32_t)mt_wcheck_line(item, a.step) : lines;
      if (line < lines) h += line_hash(w, a.ldw, per_row, lines_per_row, line);
    }
    for (int o = 16; o > 0; o >>= 1) h += __shfl_xor_sync(0xffffffffu, h, o);
    if (lane == 0 && h) atomicAdd((unsigned long long *)&sl[e].sum, (unsigned long long)h);
  }
  finish(a, cov);
}
