/* wcheck.h — the frozen weight cache's change check (kernels/wcheck.cu): device state kept with a
 * cached quantized weight, and the kernel's by-value arguments. Plain C, included by both sides. */
#ifndef MT_WCHECK_H
#define MT_WCHECK_H

#include <stdint.h>

/* Lives in device memory with the quantized weight; zeroed when the weight is bound. */
typedef struct {
  uint64_t hash;  /* hash of the weight when it was last quantized */
  uint64_t sum;   /* the hash being built by the running check; 0 between checks */
  uint32_t valid; /* hash holds a quantized weight's hash */
  uint32_t dirty; /* the last check found a change (or nothing quantized yet): requantize */
  uint32_t done;  /* CTAs of the running check that have finished; 0 between checks */
  uint32_t pad;
} mt_wcheck_state;

typedef struct {
  const void *w; /* [rows][cols] BF16 or FP16 (the hash reads bits only), row stride ldw */
  int64_t ldw;
  int32_t rows, cols;
  mt_wcheck_state *state;
  uint32_t step; /* 1: every 128-byte line of every row; s > 1: one line in each run of s (the
                    same lines at every call: mt_wcheck_sampled) */
} mt_wcheck_args;

/* The line of each run of `step` lines that the sampled check hashes: the run's number mixed, so
 * that the sample moves across the columns from run to run. Shared with the CPU tests. */
#ifdef __CUDACC__
__host__ __device__
#endif
    static inline uint64_t
    mt_wcheck_sampled(uint64_t run, uint32_t step) {
  return step <= 1 ? run : run * step + ((run * 0x9E3779B97F4A7C15ull) >> 40) % step;
}

#endif
