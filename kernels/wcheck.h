/* wcheck.h — the frozen weight cache's change check: device state kept with a cached quantized
 * weight, and the per-call check's by-value arguments (kernels/wcheck.cu); the lines it hashes are
 * kernels/whash.h's. Plain C, included by both sides.
 *
 * The state of a weight of `slices` slices (a store's experts, or the one weight of a per-call
 * entry) is MT_WCHECK_STATE_BYTES(slices) (mt_refresh_state_bytes) of device memory, zeroed when
 * the weight is bound: a head, the slices' words, then the list of the slices the last per-call
 * check found changed (which the quantizers read as their only_if). A store's refresh
 * (kernels/quant.cu, refresh_store) keeps only the slices' hash and valid words (its verdicts never
 * leave a cluster) and the head's generation; the grouped call that runs it, the head's count of
 * its activations' quantizer's running CTAs. */
#ifndef MT_WCHECK_H
#define MT_WCHECK_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/hostdev.h"

typedef struct {
  uint32_t done; /* CTAs of the running per-call check that have finished; 0 between checks */
  /* A store's generation: every CTA of a refresh that requantized a slice adds one after its
   * writes, so that the grouped GEMM that read the store while the refresh ran knows to read it
   * again (kernels/grouped.cu, store_moved) */
  uint32_t gen;
  /* The CTAs of a grouped call's activations' quantizer, chained before the store's refresh, that
   * have started and not yet ended (0 between calls): the call's GEMM reads its activations once
   * it reads 0 (kernels/grouped.c) */
  uint32_t acts;
  uint32_t pad;
} mt_wcheck_head;

typedef struct {
  uint64_t hash;  /* hash of the slice when it was last quantized */
  uint64_t sum;   /* the hash being built by the running per-call check; 0 between checks */
  uint32_t valid; /* hash holds a quantized slice's hash */
  uint32_t pad;
} mt_wcheck_slice;

#define MT_WCHECK_STATE_BYTES(slices)                                                              \
  ((sizeof(mt_wcheck_head) + (size_t)(slices) * sizeof(mt_wcheck_slice) +                          \
    4 * (1 + (size_t)(slices)) + 7) /                                                              \
   8 * 8)

MT_HD mt_wcheck_slice *mt_wcheck_slices(void *state) {
  return (mt_wcheck_slice *)((char *)state + sizeof(mt_wcheck_head));
}

/* The slices to requantize, as the last per-call check left them: their number n, then n slice
 * numbers (in no particular order): the slices it found changed (or never quantized). For a weight
 * of one slice, [0] is its dirty word. */
MT_HD uint32_t *mt_wcheck_list(void *state, int slices) {
  return (uint32_t *)(mt_wcheck_slices(state) + slices);
}

typedef struct {
  /* slices back to back: slice e's [rows][cols] BF16 or FP16 (the hash reads bits only) at
   * w + e * rows * ldw elements, row stride ldw */
  const void *w;
  int64_t ldw;
  int32_t rows, cols, slices;
  /* 1: every 128-byte line of every row; s > 1: one run of MT_WHASH_RUN lines in each s runs (the
   * same lines at every call: kernels/whash.h, mt_whash_line) */
  uint32_t step;
  void *state; /* MT_WCHECK_STATE_BYTES(slices) */
} mt_wcheck_args;

#endif
