// wcheck.cu — has a weight changed since it was last quantized? The frozen weight cache's check.
//
// The shim keeps quantized weights across calls (weight_cache = frozen) but must never use a stale
// one when the program overwrites a weight in place (an RL sampler does at every weight sync). At
// each call this kernel hashes the whole BF16/FP16 weight on the device and sets the dirty word
// when the hash differs from the one of the last quantization; the quantization kernels that
// follow on the stream run only when it is set. No host read-back, so a captured graph replays
// the check too. Cost: one read of the weight (2 bytes per element).
//
// The hash is a sum mod 2^64 of a 64-bit mix of each 16-byte piece and its position: integer
// addition is exact and order-free, so the result is the same whatever the grid. A changed weight
// goes unseen only if the two sums collide (about 2^-64). The sampled check (frozen-sampled) hashes
// one 128-byte line in each run of `step`, the same lines at every call: a change that touches none
// of them goes unseen (a few % of the bytes are read; see README, "Weight cache"). Tested through the shim by
// tests/gpu/test_routed.py (a weight overwritten in place between two calls is seen; written, not
// yet run on a device) and, for the launches and the state's handling, on the CPU by
// tests/cpu/test_shim_engine.c; the conditional quantization it drives by test_kernels.c.
#include <stdint.h>

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

// Each thread takes whole 128-byte lines (8 independent 16-byte loads in flight, where one at a
// time reached ~0.9 TB/s); with step > 1 only the sampled line of each run of `step` lines.
extern "C" __global__ void __launch_bounds__(256) mt_wcheck(const mt_wcheck_args a) {
  const int per_row = a.cols / 8;              // 16-byte pieces of a row (cols % 16 == 0)
  const int lines_per_row = (per_row + 7) / 8; // 128-byte lines (the last may be short)
  const uint64_t lines = (uint64_t)a.rows * lines_per_row, runs = (lines + a.step - 1) / a.step;
  uint64_t h = 0;
  for (uint64_t q = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; q < runs; q += (uint64_t)gridDim.x * blockDim.x) {
    const uint64_t line = mt_wcheck_sampled(q, a.step);
    if (line >= lines) continue;
    const uint64_t r = line / lines_per_row;
    const int j0 = (int)(line % lines_per_row) * 8, n = min(8, per_row - j0);
    const uint4 *src = (const uint4 *)((const uint16_t *)a.w + r * a.ldw) + j0;
    uint4 v[8];
#pragma unroll
    for (int j = 0; j < 8; j++)
      if (j < n) v[j] = src[j];
#pragma unroll
    for (int j = 0; j < 8; j++)
      if (j < n) h += piece_hash(v[j], r * per_row + j0 + j);
  }
  for (int o = 16; o > 0; o >>= 1) h += __shfl_xor_sync(0xffffffffu, h, o);
  __shared__ uint64_t warp_sum[8];
  if (threadIdx.x % 32 == 0) warp_sum[threadIdx.x / 32] = h;
  __syncthreads();
  if (threadIdx.x != 0) return;
  uint64_t s = 0;
  for (int w = 0; w < (int)blockDim.x / 32; w++) s += warp_sum[w];
  mt_wcheck_state *st = a.state;
  atomicAdd((unsigned long long *)&st->sum, (unsigned long long)s);
  __threadfence();
  // the last CTA to finish compares, keeps the new hash and resets the words for the next call
  if (atomicAdd(&st->done, 1u) != gridDim.x - 1) return;
  __threadfence();
  uint64_t sum = *(volatile uint64_t *)&st->sum;
  st->dirty = !st->valid || sum != st->hash;
  st->hash = sum;
  st->valid = 1;
  st->sum = 0;
  st->done = 0;
}
