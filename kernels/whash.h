/* whash.h — the lines a weight's content hash reads (kernels/whash.cuh hashes them): how a slice
 * numbers its 128-byte lines, and which of them a check sampled by `step` walks. Plain C, included
 * by both sides: the launchers check that a slice's lines fit, the refresh sizes its clusters by
 * them (kernels/quant.c), and the CPU tests check the sample. */
#ifndef MT_WHASH_H
#define MT_WHASH_H

#include <stdint.h>

#include "kernels/hostdev.h"

/* The 128-byte lines of a slice of rows x cols 2-byte elements (cols % 8 == 0), numbered row-major,
 * the last of a row short where cols is no multiple of 64. */
MT_HD uint64_t mt_whash_lines(int rows, int cols) {
  return (uint64_t)rows * (uint64_t)((cols / 8 + 7) / 8);
}

/* Whether a slice of rows x cols (cols % 16 == 0) numbers its 128-byte lines and a check's items in
 * 32 bits, as the kernels do (kernels/whash.cuh). */
MT_HD int mt_whash_lines_fit(int rows, int cols) {
  return mt_whash_lines(rows, cols) <= UINT32_MAX / 2;
}

/* The sampled check's step (MINITE_WEIGHT_CACHE=frozen-sampled): one run in 512, 1/512 of a
 * weight's lines (12 KB of a Qwen3 gate_up expert's 6 MB). A weight sync or an optimizer step
 * rewrites every line, so any sample sees it; a change confined to a few lines is missed by any
 * sample short of every line. The check's bytes are what it costs at many tokens: at 1/64, a Qwen3
 * layer's check at 128 tokens read 19 MB beside its GEMMs' 340 MB (docs/performance.md, "Refresh
 * costs of the frozen caches"). The digests' weight identity is the sum over the same sample
 * (kernels/instr.h), so that under frozen-sampled it is the cache's stored hash. */
#define MT_SAMPLE_STEP 512

/* Lines (128 bytes) of a sampled run: 1 KB together, so that a sample of 1/step of a weight's
 * lines costs 1/8 of the random DRAM reads that single lines would. */
#define MT_WHASH_RUN 8

/* The items a check of `lines` lines walks: every line, or MT_WHASH_RUN lines of each group of
 * step runs. */
MT_HD uint64_t mt_whash_items(uint64_t lines, uint32_t step) {
  if (step <= 1)
    return lines;
  const uint64_t runs = (lines + MT_WHASH_RUN - 1) / MT_WHASH_RUN;
  return (runs + step - 1) / step * MT_WHASH_RUN;
}

/* The line item i hashes (past the slice's last line: none). Sampled, group g = i / MT_WHASH_RUN
 * takes one run of its step runs, the group's number mixed so that the sample moves across the
 * columns from group to group. Shared with the CPU tests. */
MT_HD uint64_t mt_whash_line(uint64_t item, uint32_t step) {
  if (step <= 1)
    return item;
  const uint64_t g = item / MT_WHASH_RUN;
  const uint64_t run = g * step + (uint32_t)((g * 0x9E3779B97F4A7C15ull) >> 40) % step;
  return run * MT_WHASH_RUN + item % MT_WHASH_RUN;
}

#endif
