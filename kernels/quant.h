/* quant.h — NVFP4 quantization on the GPU (kernels in kernels/quant.cu, launched by
 * kernels/quant.c): BF16 or FP16 rows to the exact BF16 dequantized matrix the tensor cores read,
 * and optionally the packed codes and E4M3 scales, bit-identical to mt_ref_quantize (ref/nvfp4.c);
 * or the same codes and scales as the weight store of kernels/wstore.h (mt_quant_params.store).
 *
 * mt_quant_params is the one by-value argument of every kernel: C and CUDA C++ both include this
 * header, so it holds only fixed-width types and pointers.
 */
#ifndef MT_QUANT_H
#define MT_QUANT_H

#include <stdint.h>

#include "kernels/hostdev.h"

typedef struct {
  const void *x; /* [rows][cols] BF16 or FP16, row stride ldx elements; 16-byte aligned rows */
  int64_t ldx;
  int32_t rows, cols; /* cols % 16 == 0 */
  int32_t fp16;       /* input is FP16 (else BF16) */
  int32_t row_outer;  /* one S per row (else one for the matrix, from *amax) */
  uint16_t *xhat;     /* [rows][cols] BF16 e2m1(code) * scale, row stride cols */
  uint8_t *codes;     /* [rows][cols/2] or NULL */
  uint8_t *scales;    /* [rows][cols/16] or NULL */
  float *outer;       /* S: rows floats or 1 */
  uint32_t *amax;     /* per-tensor: max |x| as FP32 bits, zeroed then built by the amax kernel */
  const uint32_t *only_if; /* NULL, or a device word read when the kernels run: nothing done when
                              it reads 0 (a per-call refresh's check wrote it); not in the store
                              mode, whose refresh is its own kernel (mt_quantize_refresh) */
  /* Batches of rows (experts): 0, or the rows of a batch; row r of x is then row r % batch_rows of
   * batch r / batch_rows, which starts batch_stride elements after the one before. */
  int32_t batch_rows;
  int64_t batch_stride;
  /* NULL, or a device array of the batches' bases (pointer-array calls: x and batch_stride are
   * not used): batch e's rows, at row stride ldx, start at batch_ptrs[e]. Each batch has
   * batch_rows rows, or (batch_offs, batch_rows 0) batch e is rows [batch_offs[e-1], batch_offs[e])
   * (batch_offs[-1] = 0) of nbatch batches: device int32 cumulative ends, the last equal to rows.
   * Bases need only 2-byte alignment (the kernels test each row's). */
  const void *const *batch_ptrs;
  const int32_t *batch_offs;
  int32_t nbatch;
  /* NULL, or (activations in vLLM's dispatch, kernels/gemm_args.h mt_moe_dispatch_args) row r is
   * row gather[r] of x, a device list of rows (no batches) */
  const int32_t *gather;
  /* The per-row kernel launched dependent (mt_quantize_dependent): 0, it lets the kernels after it
   * start at once; 1, only once it has waited for the kernel before it (a store's refresh follows,
   * which reads the weights and its state before it waits: mt_gemm_grouped) */
  int32_t dependents_after_wait;
  /* NULL, or (with dependents_after_wait) a word zero between calls that each CTA raises by one
   * before it lets the kernels after it start and lowers after its writes: the grouped GEMM reads
   * the activations once it reads 0 (kernels/wcheck.h, mt_wcheck_head.acts) */
  uint32_t *running;
  /* NULL, or the weight store (kernels/wstore.h) to write instead of xhat, codes, scales, outer and
   * amax (not used then): batch e is slice e at store + e * slice_bytes, with its own S. */
  uint8_t *store;
  int64_t slice_bytes;
  /* 1: x is a weight stored [in][out] (JAX's Dense kernels): element (r, c) of a batch at
   * c * ldx + r from the batch's base, each batch cols stored rows of batch_rows (of rows without
   * batches). The quantized output is that of the [rows][cols] matrix it holds, bit for bit. */
  int32_t in_out, pad_in_out;
} mt_quant_params;

/* The stored shape of one batch (a slice) of x, what a change check hashes: batch_rows rows of
 * cols, or (in_out) cols rows of batch_rows. */
MT_HD int32_t mt_quant_stored_rows(const mt_quant_params *p) {
  return p->in_out ? p->cols : p->batch_rows;
}
MT_HD int32_t mt_quant_stored_cols(const mt_quant_params *p) {
  return p->in_out ? p->batch_rows : p->cols;
}

/* A grouped store's refresh under the frozen cache (kernels/quant.cu, refresh_store): the change
 * check of each slice the call covers, then the quantization of those it finds changed into the
 * store (q: the store mode), a cluster of CTAs a slice. */
typedef struct {
  mt_quant_params q;
  /* NULL: every slice; else only the slices with rows under these cumulative ends (clamped to m) */
  const int32_t *offs;
  int32_t m;
  uint32_t step;   /* the check's sample (kernels/whash.h) */
  void *state;     /* MT_WCHECK_STATE_BYTES(slices): each slice's hash and valid word */
  int32_t grid_y;  /* the store quantizer's blocks of columns (quant.c) */
  int32_t chained; /* MT_REFRESH_ALONE, _CHAINED or _BESIDE */
} mt_refresh_args;

/* A refresh launched in order, which lets nothing after it start before it ends (ALONE); or
 * launched dependent after a grouped call's activations' quantizer, waiting for it before it ends,
 * and letting the call's GEMM start once its CTAs have read their lines (CHAINED: the GEMM waits
 * for the refresh before its K loops) or at once (BESIDE: the GEMM waits only for the activations,
 * and for the refresh before it ends: kernels/grouped.c) */
#define MT_REFRESH_ALONE 0
#define MT_REFRESH_CHAINED 1
#define MT_REFRESH_BESIDE 2

/* A kept weight's dequantized copy (mt_dequant_weight): blocks of 16, block b's 8 code bytes at
 * codes + 8b, its scale at scales[b], its 16 BF16 values to xhat + 16b. */
typedef struct {
  const uint8_t *codes, *scales;
  uint16_t *xhat;
  int64_t blocks;
} mt_dequant_args;

#ifndef __CUDACC__
#include "kernels/engine.h"

/* Write q's dequantized copy (xhat: [n][k] BF16, e2m1(code) * scale, the bits its quantizer would
 * have written) from its codes and scales: one kernel, launched dependent (it starts while the
 * kernel before it runs and waits for it before it reads; it lets nothing after it start early).
 * Launches only. */
int mt_dequantize(const mt_qweight *q, uint16_t *xhat, mt_stream stream);

/* Quantize as p says with 1x16 blocks (tile16 = 0) or 16x16 tiles (tile16 = 1: needs per-tensor S
 * and rows % 16 == 0; a batch's rows too). Per-tensor S zeroes the amax word (each slice's in the
 * store mode) and runs an amax pass first. Launches only: no allocation, no synchronisation (legal
 * inside graph capture once the module is loaded). */
int mt_quantize(const mt_quant_params *p, int tile16, mt_stream stream);

/* MT_OK when mt_quantize takes p (its shapes and a launch shape for them), else
 * MT_ERR_UNSUPPORTED; nothing is launched. */
int mt_quantize_accepts(const mt_quant_params *p, int tile16);

/* mt_quantize with 1x16 blocks, its one kernel launched to start while the kernel before it on the
 * stream still runs, where there is one kernel (per-row S; per-tensor S launches as mt_quantize):
 * it waits for that kernel before it reads or writes anything (kernels/pdl.cuh). For activations
 * behind a kernel that lets its dependents start early (the grouped GEMM of the call before). */
int mt_quantize_dependent(const mt_quant_params *p, mt_stream stream);

/* The refresh of a->q's store (the store mode, 1x16 blocks or 16x16 tiles): one launch, as
 * a->chained says. Launches only. */
int mt_quantize_refresh(const mt_refresh_args *a, int tile16, mt_stream stream);

/* The most slices a refresh with a segment table takes (their list lives in shared memory). */
#define MT_REFRESH_LIST_MAX ((48 * 1024 - 4096) / 4)

/* The CTAs a cluster of that refresh takes, with the check's sample `step`, where the device runs
 * clusters of that size (else 8): 16 for a full check, for a sample as few as give each warp one
 * run of 32 of its lines, at most 8 (quant.c). 0 where p is no store the refresh takes. Host code:
 * no device needed. */
unsigned mt_refresh_cluster(const mt_quant_params *p, int tile16, unsigned step);
#endif

#endif
