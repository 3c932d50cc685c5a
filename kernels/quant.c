/* quant.c — launches the quantization kernels of kernels/quant.cu: picks the kernel and the CTA
 * shape for a matrix (see quant.cu for what each thread owns; with p->store, the store-mode
 * kernels) and, for a per-tensor outer scale, zeroes the amax word and runs the amax pass first.
 * Launches only, so it is legal inside CUDA graph capture once the module is loaded.
 */
#include "kernels/quant.h"

#include <stdio.h>
#include <string.h>

#include "kernels/driver.h"
#include "kernels/whash.h"
#include "kernels/wstore.h"

/* CTAs of about this many threads; a row (per-row S) may take up to 512. */
#define CTA_THREADS 256
#define MAX_ROW_THREADS 512
/* Rows above which the per-row kernel is shaped for bandwidth rather than latency. */
#define MANY_ROWS 512

typedef struct {
  char name[40];
  unsigned grid_x, grid_y, block_x, block_y;
} launch_shape;

static unsigned pow2_at_least(unsigned v) {
  unsigned p = 1;
  while (p < v)
    p <<= 1;
  return p;
}

/* Threads per row for `blocks` blocks: a power of two up to a warp (rows share warps), else whole
 * warps (a warp never spans two rows). */
static unsigned row_threads(unsigned blocks) {
  return blocks <= 32 ? pow2_at_least(blocks) : (blocks + 31) / 32 * 32;
}

/* Blocks of 16 per thread for the per-row kernel over many rows. Measured on the H200 (make bench
 * with --sweep; K = 768, 2048, 7168): 2 or 4 blocks a thread (64 or 128 bytes in flight each) and
 * at most 128 threads a row reach 3.8-3.9 TB/s where one block a thread reaches 3.0-3.7; among
 * those the shape with the fewest idle threads wins, and on a tie 2 blocks a thread when that
 * still gives 64 threads a row. Few rows are latency-bound: one block a thread, as wide as the
 * row. */
static unsigned blocks_per_thread(unsigned nblk, unsigned rows) {
  if (rows <= MANY_ROWS)
    return 1;
  unsigned t2 = row_threads((nblk + 1) / 2), t4 = row_threads((nblk + 3) / 4);
  unsigned cap2 = 2 * t2, cap4 = 4 * t4;
  if (t2 <= 128 && (cap2 < cap4 || (cap2 == cap4 && t2 >= 64)))
    return 2;
  return t4 <= 128 ? 4 : 8;
}

/* The per-row kernel's shape (one CTA spans the whole row, so its threads may own several blocks
 * each) for rows of nblk blocks, at least `least` blocks a thread; the blocks a thread in *nb. */
static int row_shape(unsigned nblk, unsigned rows, unsigned least, launch_shape *s, unsigned *nb) {
  *nb = blocks_per_thread(nblk, rows);
  if (*nb < least)
    *nb = least;
  while (*nb <= 8 && (nblk + *nb - 1) / *nb > MAX_ROW_THREADS)
    *nb *= 2;
  if (*nb > 8)
    return MT_ERR_UNSUPPORTED;
  s->block_x = row_threads((nblk + *nb - 1) / *nb);
  unsigned cta = rows > MANY_ROWS ? CTA_THREADS / 2 : CTA_THREADS;
  s->block_y = s->block_x >= cta ? 1 : cta / s->block_x;
  s->grid_y = 1;
  return MT_OK;
}

/* The per-tensor kernel's shape for rows of `units` thread-sized pieces: CTAs of CTA_THREADS, a
 * row over grid_y of them where it needs more. */
static void tensor_shape(unsigned units, launch_shape *s) {
  unsigned tx = row_threads(units);
  s->block_x = tx > CTA_THREADS ? CTA_THREADS : tx;
  s->block_y = CTA_THREADS / s->block_x;
  s->grid_y = (units + s->block_x - 1) / s->block_x;
}

/* The store mode (p->store): threads own pairs of blocks over the padded layout (kernels/wstore.h:
 * whole 128-column steps, each slice's rows padded to whole bands), the same CTA shapes otherwise;
 * 16x16 tiles take 16 rows a CTA. */
static int pick_store_shape(const mt_quant_params *p, int tile16, launch_shape *s) {
  const char *type = p->fp16 ? "fp16" : "bf16", *sfx = p->batch_ptrs ? "_ptrs" : "";
  unsigned nblk = (unsigned)MT_WS_PAIRS(p->cols) * 2, nb;
  unsigned slices = (unsigned)(p->rows / p->batch_rows);
  unsigned rows = slices * (unsigned)((p->batch_rows + MT_WS_BAND - 1) / MT_WS_BAND * MT_WS_BAND);
  if (tile16) {
    s->block_x = nblk / 2 < 16 ? pow2_at_least(nblk / 2) : 16;
    s->block_y = 16;
    s->grid_y = (nblk / 2 + s->block_x - 1) / s->block_x;
    snprintf(s->name, sizeof s->name, "mt_quant_tile_store_%s%s", type, sfx);
  } else if (p->row_outer) {
    if (row_shape(nblk, (unsigned)p->rows, 2, s, &nb) != MT_OK)
      return MT_ERR_UNSUPPORTED;
    snprintf(s->name, sizeof s->name, "mt_quant_row_store_%s_nb%u%s", type, nb, sfx);
  } else {
    tensor_shape(nblk / 2, s);
    snprintf(s->name, sizeof s->name, "mt_quant_tensor_store_%s%s", type, sfx);
  }
  /* a CTA takes one block of block_y rows, within one slice (slices are whole bands) */
  s->grid_x = rows / s->block_y;
  return s->grid_y <= 65535 && MT_WS_BAND % s->block_y == 0 ? MT_OK : MT_ERR_UNSUPPORTED;
}

static int pick_shape(const mt_quant_params *p, int tile16, launch_shape *s) {
  const char *type = p->fp16 ? "fp16" : "bf16", *sfx = p->batch_ptrs ? "_ptrs" : "";
  unsigned rows = (unsigned)p->rows, nblk = (unsigned)p->cols / 16, nb;
  if (p->store)
    return pick_store_shape(p, tile16, s);
  if (tile16) {
    s->block_x = nblk < 16 ? pow2_at_least(nblk) : 16;
    s->block_y = 16;
    s->grid_y = (nblk + s->block_x - 1) / s->block_x;
    snprintf(s->name, sizeof s->name, "mt_quant_tile_%s%s", type, sfx);
  } else if (p->row_outer) {
    if (row_shape(nblk, rows, 1, s, &nb) != MT_OK)
      return MT_ERR_UNSUPPORTED;
    snprintf(s->name, sizeof s->name, "mt_quant_row_%s_nb%u%s", type, nb, sfx);
  } else {
    tensor_shape(nblk, s);
    snprintf(s->name, sizeof s->name, "mt_quant_tensor_%s%s", type, sfx);
  }
  s->grid_x = (rows + s->block_y - 1) / s->block_y;
  return s->grid_y <= 65535 ? MT_OK : MT_ERR_UNSUPPORTED;
}

/* The amax words the pass builds: p->amax, or each slice's (after its S: kernels/wstore.h), one
 * 2-D memset for all of them. */
static CUresult zero_amax(const mt_driver *d, const mt_quant_params *p, mt_stream stream) {
  if (!p->store)
    return d->memset_d8_async((CUdeviceptr)p->amax, 0, sizeof *p->amax, stream);
  CUdeviceptr first =
      (CUdeviceptr)(p->store + MT_WS_SECTION(MT_WS_RECORD_BYTES(p->batch_rows, p->cols)) + 4);
  return d->memset_d2d32_async(first, (size_t)p->slice_bytes, 0, 1,
                               (size_t)(p->rows / p->batch_rows), stream);
}

/* Whether quantize (or, store mode, a refresh) can take p: the shapes the kernels assume. */
static int params_ok(const mt_quant_params *p, int tile16) {
  if (p->rows <= 0 || p->cols <= 0 || p->cols % 16 || p->batch_rows < 0 ||
      (p->batch_rows && p->rows % p->batch_rows) || (p->store && (!p->batch_rows || p->only_if)) ||
      (tile16 && (p->row_outer || p->rows % 16 || p->batch_rows % 16)))
    return 0;
  if (p->gather && (p->batch_rows || p->batch_ptrs || p->store || p->in_out))
    return 0;
  return p->batch_ptrs
             ? (p->batch_offs ? !p->batch_rows && !p->store && p->nbatch > 0 : !!p->batch_rows)
             : !p->batch_offs;
}

/* dependent: per-row S's one kernel launched with programmatic serialization
 * (mt_quantize_dependent) */
static int quantize(const mt_quant_params *p, int tile16, int dependent, mt_stream stream) {
  const mt_driver *d = mt_driver_get();
  if (!d)
    return MT_ERR_NO_DRIVER;
  if (!params_ok(p, tile16))
    return MT_ERR_UNSUPPORTED;
  launch_shape s;
  CUfunction quant, amax = NULL;
  int status = pick_shape(p, tile16, &s);
  if (status == MT_OK)
    status = mt_kernel_get("quant", s.name, stream, &quant);
  if (status == MT_OK && !p->row_outer) {
    char name[40];
    snprintf(name, sizeof name, "mt_quant_amax_%s%s", p->fp16 ? "fp16" : "bf16",
             p->batch_ptrs ? "_ptrs" : "");
    status = mt_kernel_get("quant", name, stream, &amax);
  }
  if (status != MT_OK)
    return status;
  if (amax) {
    /* The amax pass ends in atomicMax on FP32 bits: exact and independent of order. */
    if (zero_amax(d, p, stream) != CUDA_SUCCESS)
      return MT_ERR_CUDA;
    unsigned warps = (unsigned)p->rows < 8192 ? (unsigned)p->rows : 8192; /* a row per warp */
    status = mt_launch(amax, (warps + 7) / 8, 1, 256, 1, 0, 0, stream, (void *)p);
    if (status != MT_OK)
      return status;
  }
  return mt_launch(quant, s.grid_x, s.grid_y, s.block_x, s.block_y, 0, dependent && !amax, stream,
                   (void *)p);
}

int mt_quantize(const mt_quant_params *p, int tile16, mt_stream stream) {
  return quantize(p, tile16, 0, stream);
}

int mt_quantize_accepts(const mt_quant_params *p, int tile16) {
  launch_shape s;
  return params_ok(p, tile16) && pick_shape(p, tile16, &s) == MT_OK ? MT_OK : MT_ERR_UNSUPPORTED;
}

int mt_dequantize(const mt_qweight *q, uint16_t *xhat, mt_stream stream) {
  if (!q || !q->codes || !q->scales || !xhat)
    return MT_ERR_UNSUPPORTED;
  CUfunction f;
  int status = mt_kernel_get("quant", "mt_dequant_weight", stream, &f);
  if (status != MT_OK)
    return status;
  mt_dequant_args a = {q->codes, q->scales, xhat, (int64_t)q->n * q->k / 16};
  return mt_launch(f, (unsigned)((a.blocks + 255) / 256), 1, 256, 1, 0, 1, stream, &a);
}

int mt_quantize_dependent(const mt_quant_params *p, mt_stream stream) {
  return p->store ? MT_ERR_UNSUPPORTED : quantize(p, 0, 1, stream);
}

/* A sampled refresh's cluster size: as few CTAs as give each warp of a slice's cluster at most one
 * run of 32 of the sample's lines (a lane a line: kernels/quant.cu, hash_shares), so that the check
 * stays one trip to memory, at most 8 (portable). Fewer CTAs leave more of the SMs to the call's
 * GEMM, which runs beside the refresh or starts once its lines are read: Qwen3's layer served at
 * 1 to 128 tokens 4-14% faster with clusters of 2 or 4 than of 8 (lab/NOTES.md, "The sampled
 * refresh's clusters"). A changed slice is requantized by its cluster alone, so slower: Qwen3's
 * slices take one CTA at MT_SAMPLE_STEP 512, and its first call after a weight sync at one token
 * 2.7x as long as with the clusters of a 1/64 sample (lab/NOTES.md, "The sample at 1/512"). */
static unsigned sampled_cluster(const mt_quant_params *p, const launch_shape *s, unsigned step) {
  const uint64_t lines = mt_whash_lines(mt_quant_stored_rows(p), mt_quant_stored_cols(p));
  const uint64_t runs = (mt_whash_items(lines, step) + 31) / 32,
                 warps = s->block_x * s->block_y / 32;
  unsigned size = 1;
  while (size < 8 && size * warps < runs)
    size *= 2;
  return size;
}

/* A full check (step 1) takes clusters of 16 CTAs (a slice's share of the CTAs is what bounds the
 * stream of few slices: one token's), a sampled one as sampled_cluster says. */
static unsigned cluster_size(const mt_quant_params *p, const launch_shape *s, unsigned step) {
  return step > 1 ? sampled_cluster(p, s, step) : 16;
}

unsigned mt_refresh_cluster(const mt_quant_params *p, int tile16, unsigned step) {
  launch_shape s;
  if (!p || !p->store || !params_ok(p, tile16) || pick_store_shape(p, tile16, &s) != MT_OK)
    return 0;
  return cluster_size(p, &s, step);
}

/* A refresh's clusters (kernels/quant.cu, refresh_store): of cluster_size's CTAs, or 8 where the
 * device runs none of 16; one a slice the call can cover (a segment with rows has at least one of
 * the call's m), at most as many as the device runs at once (a second wave would wait for the
 * first). */
static void refresh_clusters(CUfunction f, const mt_quant_params *p, const launch_shape *s,
                             unsigned smem, unsigned covered, unsigned step, unsigned *size,
                             unsigned *clusters) {
  *size = cluster_size(p, s, step);
  int fit = mt_cluster_capacity(f, *size, s->block_x, s->block_y, smem);
  if (fit <= 0 && *size > 8) {
    *size = 8;
    fit = mt_cluster_capacity(f, *size, s->block_x, s->block_y, smem);
  }
  if (fit <= 0)
    fit = mt_sm_count() / (int)*size > 0 ? mt_sm_count() / (int)*size : 1; /* one CTA an SM */
  *clusters = (unsigned)fit < covered ? (unsigned)fit : covered;
}

int mt_quantize_refresh(const mt_refresh_args *a, int tile16, mt_stream stream) {
  const mt_quant_params *p = &a->q;
  if (!p->store || p->batch_ptrs || !params_ok(p, tile16) || !a->state || (a->offs && a->m < 0) ||
      mt_quant_stored_cols(p) % 16)
    return MT_ERR_UNSUPPORTED;
  const unsigned slices = (unsigned)(p->rows / p->batch_rows);
  const unsigned covered = a->offs && (unsigned)a->m < slices ? (unsigned)a->m : slices;
  if (covered == 0)
    return MT_OK;
  launch_shape s;
  int status = pick_store_shape(p, tile16, &s);
  /* the list of covered slices in shared memory, 4 bytes a slice, within the 48 KB a launch gets
   * without asking, less 4 KB for the kernel's own (under 2 KB by ptxas); no model has 11,264
   * experts */
  if (status != MT_OK || (s.block_x * s.block_y) % 32 || (a->offs && slices > MT_REFRESH_LIST_MAX))
    return MT_ERR_UNSUPPORTED;
  char name[64];
  snprintf(name, sizeof name, "mt_refresh_%s", s.name + strlen("mt_quant_"));
  CUfunction f;
  status = mt_kernel_get("quant", name, stream, &f);
  if (status != MT_OK)
    return status;
  const unsigned smem = a->offs ? 4 * slices : 0;
  unsigned size, clusters;
  refresh_clusters(f, p, &s, smem, covered, a->step, &size, &clusters);
  mt_refresh_args k = *a;
  k.grid_y = (int32_t)s.grid_y;
  return mt_launch_clusters(f, size, clusters, s.block_x, s.block_y, smem,
                            a->chained != MT_REFRESH_ALONE, stream, &k);
}
