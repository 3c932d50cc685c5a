// wcheck.cu — has a weight changed since it was last quantized? The frozen weight cache's check of
// a per-call weight (a grouped store's refresh is its own kernel: kernels/quant.cu, refresh_store).
//
// The shim keeps quantized weights across calls (MINITE_WEIGHT_CACHE=frozen) but must never use a
// stale one when the program overwrites a weight in place (an RL sampler does at every weight
// sync). At each call this kernel hashes the weight on the device (kernels/whash.cuh) and lists the
// slices whose hash differs from the one of their last quantization; the quantization kernels that
// follow on the stream requantize only the listed ones. No host read-back, so a captured graph
// replays the check too. Cost, nothing changed: one read of the weight (2 bytes an element), or of
// its sample (frozen-sampled: one 1 KB run of lines in each `step` runs; see README, "Weight
// cache"). Tested on the GPU by tests/gpu/test_kernels.c (the conditional quantization it drives)
// and through the shim by tests/gpu/test_routed.py; the launches and the state's handling on the
// CPU by tests/cpu/test_shim_engine.c.
#include <stdint.h>

#include "kernels/pdl.cuh"
#include "kernels/wcheck.h"
#include "kernels/whash.cuh"

// The last CTA to finish turns each slice's sum into its verdict, keeps the sum as the slice's
// hash, lists the changed slices for the quantizers and resets the words for the next call.
__device__ static void finish(const mt_wcheck_args &a) {
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
  if (!last)
    return;
  __threadfence();
  mt_wcheck_slice *sl = mt_wcheck_slices(a.state);
  uint32_t *list = mt_wcheck_list(a.state, a.slices);
  for (int e = threadIdx.x; e < a.slices; e += blockDim.x) {
    const uint64_t sum = *(volatile uint64_t *)&sl[e].sum;
    if (!sl[e].valid || sum != sl[e].hash)
      list[1 + atomicAdd(&changed, 1u)] = e;
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

// Each warp takes chunks of one slice's items (a turn: a line a lane, 32 lines; 4 turns a chunk, 1
// when sampled) and adds a chunk's sum to its slice's with one atomic.
extern "C" __global__ void __launch_bounds__(256) mt_wcheck(const mt_wcheck_args a) {
  // A sampled check is short: the quantizers after it (launched dependent: kernels/pdl.cuh) may
  // start now, and wait for all of it. A full one streams the weight: they start when it ends.
  // (The check itself is launched in order: launched dependent on the kernel before it, the full
  // check ran 10-20% slower, for a reason not found: lab/NOTES.md, "Launched dependent".)
  if (a.step > 1)
    allow_dependents();
  const mt_wlines g = mt_wlines_of(a.rows, a.cols, a.step);
  const int turns = a.step > 1 ? 1 : 4, lane = threadIdx.x % 32;
  const uint32_t chunk = 32 * turns, chunks = (g.items + chunk - 1) / chunk;
  const uint64_t total = (uint64_t)chunks * a.slices, warps = (uint64_t)gridDim.x * blockDim.x / 32;
  mt_wcheck_slice *sl = mt_wcheck_slices(a.state);
  for (uint64_t c = ((uint64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; c < total; c += warps) {
    const int e = (int)(c / chunks);
    const uint16_t *w = (const uint16_t *)a.w + (uint64_t)e * a.rows * a.ldw;
    const uint32_t first = (uint32_t)(c - (uint64_t)e * chunks) * chunk + lane;
    uint64_t h = 0;
#pragma unroll 1
    for (int u = 0; u < turns; u++)
      h += mt_item_hash(w, a.ldw, g, a.step, first + u * 32);
    for (int o = 16; o > 0; o >>= 1)
      h += __shfl_xor_sync(0xffffffffu, h, o);
    if (lane == 0 && h)
      atomicAdd((unsigned long long *)&sl[e].sum, (unsigned long long)h);
  }
  finish(a);
}
