// cuda_emu.h — enough of CUDA C++ to run the instruments' kernels (kernels/instr.cu) on the CPU,
// for tests/cpu/test_instr_emu.cc: a CTA is blockDim.x std::threads, __syncthreads a barrier of
// them, a warp's shuffles and ballots an exchange through memory between two barriers of its 32
// threads, __shared__ static storage (CTAs run one after another), atomics GCC's. It checks what
// a kernel computes (its indexing, barriers, reductions and hashes, bit for bit against the host
// twin), never its speed or the GPU's memory model: a missing fence, a race on shared memory
// that a barrier orders here by chance, or a read of memory the GPU could not see passes.
#pragma once

// kernels/pdl.cuh: no programmatic dependent launch here (grids run one after another)
#define MT_CUDA_EMU 1

#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

namespace emu {

// The CTA being run: its barriers and the exchange its warps' shuffles go through.
struct cta {
  explicit cta(unsigned threads) : all(threads), xchg(threads) {
    for (unsigned w = 0; w < (threads + 31) / 32; w++)
      warps.emplace_back(
          std::make_unique<std::barrier<>>(threads - 32 * w < 32 ? threads - 32 * w : 32));
  }
  std::barrier<> all;
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  std::vector<uint64_t> xchg;
};
inline cta *current;

template <class T> uint64_t bits_of(T v) {
  static_assert(sizeof(T) <= 8, "a shuffle moves up to 8 bytes");
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof v);
  return b;
}
template <class T> T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

// Lane `src_lane` of this warp's values v (every lane of the warp calls it, as a full mask asks).
template <class T> T shuffle(T v, int src_lane) {
  const unsigned t = threadIdx.x, w = t / 32;
  current->xchg[t] = bits_of(v);
  current->warps[w]->arrive_and_wait();
  const uint64_t got = current->xchg[32 * w + (unsigned)src_lane % 32];
  current->warps[w]->arrive_and_wait();
  return from_bits<T>(got);
}

// Run kernel() as `grid` CTAs of `block` threads, one CTA after another.
template <class F> void launch(unsigned grid, unsigned block, F kernel) {
  gridDim = {grid, 1, 1};
  blockDim = {block, 1, 1};
  for (unsigned b = 0; b < grid; b++) {
    cta c(block);
    current = &c;
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < block; t++)
      threads.emplace_back([&c, &kernel, b, t] {
        blockIdx = {b, 1, 1};
        threadIdx = {t, 1, 1};
        kernel();
        // a thread that has returned no longer holds up its CTA's or its warp's barriers
        c.warps[t / 32]->arrive_and_drop();
        c.all.arrive_and_drop();
      });
    for (auto &th : threads)
      th.join();
  }
  current = nullptr;
}

} // namespace emu

inline void __syncthreads() { emu::current->all.arrive_and_wait(); }
inline int __syncthreads_or(int p) {
  const unsigned t = threadIdx.x;
  emu::current->xchg[t] = p != 0;
  __syncthreads();
  int any = 0;
  for (unsigned i = 0; i < blockDim.x; i++)
    any |= emu::current->xchg[i] != 0;
  __syncthreads();
  return any;
}
template <class T> T __shfl_xor_sync(unsigned, T v, int o) {
  return emu::shuffle(v, (int)(threadIdx.x % 32) ^ o);
}
template <class T> T __shfl_sync(unsigned, T v, int src) { return emu::shuffle(v, src); }
inline unsigned __ballot_sync(unsigned, int p) {
  const unsigned t = threadIdx.x, w = t / 32;
  emu::current->xchg[t] = p != 0;
  emu::current->warps[w]->arrive_and_wait();
  unsigned b = 0;
  for (unsigned l = 0; l < 32 && 32 * w + l < blockDim.x; l++)
    b |= (emu::current->xchg[32 * w + l] != 0 ? 1u : 0u) << l;
  emu::current->warps[w]->arrive_and_wait();
  return b;
}

inline unsigned atomicAdd(unsigned *p, unsigned v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline int atomicAdd(int *p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned long long atomicAdd(unsigned long long *p, unsigned long long v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
inline double atomicAdd(double *p, double v) {
  double old, want;
  __atomic_load(p, &old, __ATOMIC_SEQ_CST);
  do
    want = old + v;
  while (!__atomic_compare_exchange(p, &old, &want, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST));
  return old;
}
inline unsigned atomicMax(unsigned *p, unsigned v) {
  unsigned old = __atomic_load_n(p, __ATOMIC_SEQ_CST);
  while (old < v &&
         !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
  }
  return old;
}
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_system() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
template <class T> T __ldcg(const T *p) { return *p; }

inline int __popc(unsigned v) { return __builtin_popcount(v); }
inline int __ffs(int v) { return __builtin_ffs(v); }
inline unsigned __float_as_uint(float f) { return emu::from_bits<unsigned>(emu::bits_of(f)); }
inline float __int_as_float(int i) { return emu::from_bits<float>(emu::bits_of(i)); }
inline int min(int a, int b) { return a < b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
