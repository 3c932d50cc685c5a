/* gemm.c — host side of the GEMM kernels (kernels/gemm_small.cu, kernels/gemm_large.cu): choose the
 * path and the tile, describe the operands, launch on the caller's stream. No allocation, no
 * synchronisation: legal inside a CUDA graph capture once the module is loaded. */
#include "kernels/gemm.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>

#include "kernels/driver.h"
#include "kernels/gemm_args.h"

/* None for a weight AUTO never fuses (mt_gemm_auto_path): a requantizing call on Qwen3's gate_up
 * expert writes 2 MB less (2.56 bytes an element instead of 3.19), on DeepSeek's 4096 x 7168 18 MB,
 * and one pack launch less. The kept form has none (engine.h). The small kernels need whole groups
 * of 16 rows. */
size_t mt_gemm_frag_bytes(int n, int k) {
  if (n <= 0 || k <= 0 || n % 16 || mt_gemm_auto_path(1, n, k, 1, 132) != MT_PATH_FUSED)
    return 0;
  return MT_FRAG_BYTES(n, k);
}

/* dependent: launched with programmatic stream serialization (driver.h: mt_launch); the GEMM
 * kernels wait for the activation quantization before reading its output. */
static int launch(const char *file, const char *fn, unsigned gx, unsigned gy, unsigned threads,
                  unsigned smem, int dependent, mt_stream stream, void *args) {
  CUfunction f;
  int st = mt_kernel_get(file, fn, (CUstream)stream, &f);
  if (st != MT_OK)
    return st;
  return mt_launch(f, gx, gy, threads, 1, smem, dependent, (CUstream)stream, args);
}

int mt_gemm_pack_weight(const mt_qweight *q, const uint32_t *only_if, mt_stream stream) {
  size_t chunks = mt_gemm_frag_bytes(q->n, q->k) / 16;
  if (!chunks || !q->frag)
    return MT_OK; /* the kept form has no fragment copy */
  mt_pack_args a = {q->codes, q->scales, q->frag, only_if, q->n, q->k};
  return launch("gemm_small", "mt_gemm_pack", (unsigned)((chunks + 255) / 256), 1, 256, 0, 0,
                stream, &a);
}

static void epilogue_args(const mt_gemm_args *a, const mt_qact *q, mt_epilogue_args *e) {
  e->m = a->m;
  e->n = a->n;
  e->k = a->k;
  e->sa = q->outer;
  e->sw = a->w->outer;
  e->sa_row = a->w->num.act_scale == MT_SCALE_ROW;
  e->sw_row = a->w->num.weight_scale == MT_SCALE_ROW;
  e->y = a->y;
  e->ldy = (long long)a->ldy;
  e->c = a->beta != 0.0f ? a->c : NULL; /* beta == 0: C is not read, as in cuBLAS */
  e->ldc = (long long)a->ldc;
  e->bias = a->bias;
  e->ytype = (int)a->ytype;
  e->biastype = (int)a->biastype;
  e->alpha = a->alpha;
  e->beta = a->beta;
}

/* Whether path p can take m tokens of k columns (packed: the weight's small-kernel copy exists):
 * fused, few tokens whose quantized rows fit the kernel's shared memory (gemm_args.h); small, the
 * kernel's token capacity; both need the packed weight. */
static int path_fits(int p, int m, int k, int packed) {
  switch (p) {
  case MT_PATH_FUSED:
    return packed && m <= MT_SMALL_FUSE_M && (size_t)m * (2 * (size_t)k + 16) <= MT_SMALL_FUSE_XHAT;
  case MT_PATH_LARGE:
    return 1;
  default:
    return 0;
  }
}

/* AUTO's choice, from make bench's path table (H200; lab/NOTES.md, "The fused kernel and the path
 * choice"): the fused kernel where each SM's CTAs redo at most MT_GEMM_FUSE_ELEMS elements of the
 * quantization (m * k * waves of n / 16 CTAs; each CTA quantizes all m x k itself, and past that
 * the separate quantization launch, overlapped by PDL, costs less): Qwen3's down at 1 token; else
 * the large path. With its tiles of 64 tokens the large path is faster than the small kernel at
 * every M the small kernel takes, on every benchmark shape, so AUTO no longer chooses the small
 * kernel. */
int mt_gemm_auto_path(int m, int n, int k, int packed, int sms) {
  long long waves = ((long long)n / 16 + sms - 1) / sms;
  if ((long long)m * k * waves <= MT_GEMM_FUSE_ELEMS && path_fits(MT_PATH_FUSED, m, k, packed))
    return MT_PATH_FUSED;
  return MT_PATH_LARGE;
}

int mt_gemm_path_of(const mt_gemm_args *a) {
  int packed = mt_gemm_frag_bytes(a->n, a->k) && a->w->frag;
  if (a->path != MT_PATH_AUTO)
    return path_fits(a->path, a->m, a->k, packed) ? (int)a->path : -1;
  /* only the fused kernel's rule reads the SM count: the driver is asked where that kernel fits */
  int sms = path_fits(MT_PATH_FUSED, a->m, a->k, packed) ? mt_sm_count() : 1;
  return mt_gemm_auto_path(a->m, a->n, a->k, packed, sms);
}

int mt_gemm_launch_fused(const mt_gemm_args *a, mt_stream stream) {
  mt_qact none = {NULL, NULL};
  mt_small_args s = {a->w->frag, {0}, a->x, (long long)a->ldx, a->xtype == MT_DTYPE_FP16};
  epilogue_args(a, &none, &s.e);
  unsigned grid = (unsigned)(a->n / (8 * MT_SMALL_WARPS));
  return launch("gemm_small", "mt_gemm_small_q4", grid, 1, 32 * MT_SMALL_WARPS, MT_SMALL_FUSE_SMEM,
                0, stream, &s);
}

/* A K-major BF16 matrix of rows x k as TMA sees it: boxes of 64 columns (128 bytes, the swizzle
 * span) by box_rows rows; reads past the matrix return zeros, which add nothing to a sum. pair
 * (k % 64 == 0): rank 3, the columns as k / 64 blocks of 64 (128 bytes apart), a box two blocks
 * deep (mt_gemm_large_m64p_nBN); a block past k is wholly past the third dimension, so zeros
 * too. */
int mt_gemm_tensor_map(CUtensorMap *map, const void *base, int rows, int k, int box_rows,
                       int pair) {
  const mt_driver *d = mt_driver_get();
  cuuint64_t dims[3] = {pair ? 64 : (cuuint64_t)k, (cuuint64_t)rows, (cuuint64_t)k / 64};
  cuuint64_t strides[2] = {(cuuint64_t)k * 2, 128};
  cuuint32_t box[3] = {64, (cuuint32_t)box_rows, MT_LARGE_KS_64};
  cuuint32_t elem_strides[3] = {1, 1, 1};
  CUresult r = d->tensor_map_encode_tiled(
      map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, pair ? 3 : 2, (void *)base, dims, strides, box,
      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? MT_OK : MT_ERR_UNSUPPORTED;
}

/* The output y[m][n] (row stride ldy elements, BF16 or FP16) for TMA stores of 64 x 64 boxes,
 * 128B-swizzled in shared memory; stores past m or n are clipped. */
static int output_map(CUtensorMap *map, void *y, enum mt_dtype type, int m, int n, size_t ldy) {
  const mt_driver *d = mt_driver_get();
  cuuint64_t dims[2] = {(cuuint64_t)n, (cuuint64_t)m};
  cuuint64_t strides[1] = {(cuuint64_t)ldy * 2};
  cuuint32_t box[2] = {64, 64};
  cuuint32_t elem_strides[2] = {1, 1};
  CUresult r = d->tensor_map_encode_tiled(
      map,
      type == MT_DTYPE_FP16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2,
      y, dims, strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
      CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? MT_OK : MT_ERR_UNSUPPORTED;
}

/* Tiles of bm tokens x bn channels over an m x n output. */
static long long tile_count(int m, int n, mt_gemm_tile t) {
  return (long long)((m + t.bm - 1) / t.bm) * ((n + t.bn - 1) / t.bn);
}

static long long max2(long long a, long long b) { return a > b ? a : b; }

/* Clocks one SM spends on a 64-wide K block of a bm x bn tile while `active` SMs work: the largest
 * of what the block needs (H200, lab/probe_feed.cu; lab/NOTES.md, "What feeds a tile" and "The
 * tile estimate"):
 *  - shared memory, 128 bytes a clock: TMA writes bm + bn rows of 128 bytes, and each of the
 *    bm / 64 consumer warpgroups reads its 64 rows of A and all bn rows of B (128 x 64 tiles:
 *    56 KB, 448 clocks);
 *  - the tensor cores, 2048 multiply-adds a clock: bm * bn * 64 / 2048;
 *  - the feed from L2: ~76 bytes a clock into one SM, ~8000 shared by all the working SMs (8000
 *    puts gate_up M = 256 on 64 x 48 tiles, measured best: lab/NOTES.md, "Tiles of 64 tokens"). */
static long long kblock_clocks(mt_gemm_tile t, long long active) {
  long long smem = 2LL * t.bm + (long long)t.bn * (1 + t.bm / 64),
            mma = (long long)t.bm * t.bn / 32;
  long long bytes = (long long)(t.bm + t.bn) * 128, feed = max2(bytes / 76, bytes * active / 8000);
  return max2(max2(smem, mma), feed);
}

/* The tiles the kernels have: 128 tokens (two consumer warpgroups) x 256 to 64 channels, 64 tokens
 * (one) x 64 to 32; in order of preference where two estimate the same. Wider tiles of 64 tokens
 * were slower than the estimate says (one warpgroup's wgmma groups leave the tensor cores idle
 * between them: lab/NOTES.md, "Tiles of 64 tokens") and were removed. */
static const mt_gemm_tile tiles[] = {{128, 256}, {128, 192}, {128, 128}, {128, 96},
                                     {128, 64},  {64, 64},   {64, 48},   {64, 32}};

mt_gemm_tile mt_gemm_large_tile(int m, int n, int sms, int bm, int bn) {
  mt_gemm_tile best = {0, 0};
  long long best_cost = -1;
  for (size_t i = 0; i < sizeof tiles / sizeof tiles[0]; i++) {
    mt_gemm_tile t = tiles[i];
    if ((bm && t.bm != bm) || (bn && t.bn != bn))
      continue;
    long long count = tile_count(m, n, t), waves = (count + sms - 1) / sms;
    long long cost = waves * kblock_clocks(t, count < sms ? count : sms);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best = t;
    }
  }
  return best;
}

/* Whether the TMA-store epilogue can write y with tiles t, leaving y's description in ty: tiles of
 * 128 tokens x 128 to 256, rows that end on 16 bytes (the store clips at n only by 16-byte pieces:
 * at n = 271 it wrote column 271, the caller's padding), so n % 8 == 0, and a y that suits a tensor
 * map (16-byte aligned base and row stride). */
static int stores_by_tma(const mt_gemm_args *a, mt_gemm_tile t, CUtensorMap *ty) {
  return t.bm == MT_LARGE_BM && t.bn >= 128 && a->n % 8 == 0 &&
         output_map(ty, a->y, a->ytype, a->m, a->n, a->ldy) == MT_OK;
}

/* The persistent grid: one CTA per SM (one fits: ~200 KB of shared memory), each walking its
 * tiles. */
static unsigned persistent_grid(const mt_gemm_args *a, mt_gemm_tile t, int sms) {
  long long count = tile_count(a->m, a->n, t);
  return (unsigned)(count < sms ? count : sms);
}

/* The name of a large-path kernel: mt_gemm_large_<kind>n<bn> (kind "", "ts_", "m64_" or "m64p_"),
 * in buf. */
static const char *kernel_name(char buf[32], const char *kind, int bn) {
  snprintf(buf, 32, "mt_gemm_large_%sn%d", kind, bn);
  return buf;
}

/* The operands' maps for tiles t.bm tokens high: the last band's activations (its rows only,
 * rounded up to 8), the other bands' where they exist and differ, and the weight's; of rank 3
 * where pair. */
static int operand_maps(const mt_gemm_args *a, const mt_qact *q, mt_gemm_tile t, int pair,
                        mt_large_args *l) {
  int last = a->m - (a->m - 1) / t.bm * t.bm; /* 1 to t.bm */
  l->last_rows = (last + 7) / 8 * 8;
  int st = mt_gemm_tensor_map(&l->tw, a->w->xhat, a->n, a->k, t.bn, pair);
  if (st == MT_OK)
    st = mt_gemm_tensor_map(&l->ta_last, q->xhat, a->m, a->k, l->last_rows, pair);
  if (st != MT_OK || a->m <= t.bm || l->last_rows == t.bm) {
    l->ta = l->ta_last;
    return st;
  }
  return mt_gemm_tensor_map(&l->ta, q->xhat, a->m, a->k, t.bm, pair);
}

/* The 64-token tiles take a stage's two K blocks of an operand in one box (mt_gemm_large_m64p_nBN)
 * where k allows and the K loop outlasts their ring, so that the producer refills a freed stage
 * with two requests instead of four (faster at gate_up's few tokens; down, all six stages
 * requested up front, was no faster with it: lab/NOTES.md, "One TMA box a stage and operand"). */
int mt_gemm_kpair(int k, mt_gemm_tile t) { return t.bm == 64 && MT_LARGE_KPAIR_64(k, t.bn); }

static int large_path(const mt_gemm_args *a, const mt_qact *q, mt_stream stream) {
  static mt_large_args proto; /* only for its alignment: CUtensorMap must be 64-byte aligned */
  mt_large_args l = proto;
  int sms = mt_sm_count();
  mt_gemm_tile t = mt_gemm_large_tile(a->m, a->n, sms, a->tile.bm, a->tile.bn);
  if (!t.bm)
    return MT_ERR_UNSUPPORTED; /* a forced tile no kernel has */
  /* a driver that refused the rank-3 maps gets the boxes of one block */
  int pair = mt_gemm_kpair(a->k, t);
  int st = operand_maps(a, q, t, pair, &l);
  if (st != MT_OK && pair) {
    pair = 0;
    st = operand_maps(a, q, t, pair, &l);
  }
  if (st != MT_OK)
    return st;
  epilogue_args(a, q, &l.e);
  unsigned grid = persistent_grid(a, t, sms);
  char fn[32];
  if (t.bm != MT_LARGE_BM)
    return launch("gemm_large", kernel_name(fn, pair ? "m64p_" : "m64_", t.bn), grid, 1, 256,
                  MT_LARGE_SMEM_64(t.bn), 1, stream, &l);
  /* TMA stores where they can, else per-thread stores */
  if (stores_by_tma(a, t, &l.ty))
    return launch("gemm_large", kernel_name(fn, "ts_", t.bn), grid, 1, 384, MT_LARGE_SMEM_TS(t.bn),
                  1, stream, &l);
  return launch("gemm_large", kernel_name(fn, "", t.bn), grid, 1, 384, MT_LARGE_SMEM(t.bn), 1,
                stream, &l);
}

int mt_gemm_launch(const mt_gemm_args *a, const mt_qact *q, mt_stream stream) {
  int path = mt_gemm_path_of(a);
  if (path < 0)
    return MT_ERR_UNSUPPORTED;
  return path == MT_PATH_LARGE ? large_path(a, q, stream) : MT_ERR_UNSUPPORTED;
}
