/* gemm.c — host side of the GEMM kernels (kernels/gemm_small.cu, kernels/gemm_large.cu): choose the path and the tile, describe
 * the operands, launch on the caller's stream. No allocation, no synchronisation: legal inside a
 * CUDA graph capture once the module is loaded. */
#include "kernels/gemm.h"

#include <pthread.h>
#include <stddef.h>

#include "kernels/driver.h"
#include "kernels/gemm_args.h"
#include "shim/param.h"

/* None for a weight AUTO never sends to the small kernels (more than MT_GEMM_SMALL_W elements,
 * mt_gemm_path_of): DeepSeek's 4096 x 7168 expert keeps 18 MB less, and its quantization in
 * requantize mode one pack launch less a call. The small kernels need whole groups of 16 rows. */
size_t mt_gemm_frag_bytes(int n, int k) {
  if (n <= 0 || k <= 0 || n % 16 || (long long)n * k > MT_GEMM_SMALL_W)
    return 0;
  return MT_FRAG_BYTES(n, k);
}

/* dependent: launched with programmatic stream serialization (driver.h: mt_launch); the GEMM
 * kernels wait for the activation quantization before reading its output. */
static int launch(const char *file, const char *fn, unsigned gx, unsigned gy, unsigned threads, unsigned smem,
                  int dependent, mt_stream stream, void *args) {
  CUfunction f;
  int st = mt_kernel_get(file, fn, (CUstream)stream, &f);
  if (st != MT_OK)
    return st;
  return mt_launch(f, gx, gy, threads, 1, smem, dependent, (CUstream)stream, args);
}

/* The kernel measurement knobs (kernels/NOTES.md; README "The engine"), read once through
 * shim/param.h like every setting, so that a set one is logged at INFO and an invalid one warned
 * about; for measurements, not for users, and leaving them unset runs the measured defaults.
 *  MT_LARGE_VARIANT: the default stores the outputs by TMA from shared memory (mt_gemm_large_ts_nBN)
 *    where the tile is 128 to 256 wide, n % 8 == 0 and y suits a tensor map, else runs
 *    mt_gemm_large_nBN (v6, per-thread stores); "v6" runs mt_gemm_large_nBN everywhere; "ra" where
 *    the default would store by TMA, the activations quantized into 5-bit records (gemm_args.h:
 *    ~2.6 instead of 4 bytes of quantization traffic an element, 5 KB instead of 16 KB a stage)
 *    that the kernel decodes into wgmma's A registers (mt_gemm_large_ra_nBN; the engine's workspace
 *    then holds the records, mt_gemm_act_records), else as the default: same bits, not faster
 *    (H200: Qwen3 shapes 2-10% slower, DeepSeek's within the run-to-run spread of +-10%; the
 *    record quantization runs at 20.0 instead of 18.8 µs for 8192 x 2048). Same bits in every case.
 *    "fq" where the default would store by TMA, S_a is per row and the first wave of tiles leaves
 *    rows: the quantization kernel does the first wave's bands (and zeroes the counters), the GEMM
 *    (mt_gemm_large_fq_nBN, tiles 128 or 192 wide: fq_width) the rest in its producer warpgroup's
 *    idle warps and a fourth warpgroup while its consumers run (mt_gemm_quant_rows); same bits,
 *    faster only at the largest M of one shape (H200, 5th session: gate_up M = 16384 157.7 against
 *    164.8 µs; 4096 47.9 against 45.3, down and DeepSeek's slower; kernels/NOTES.md).
 *  MT_LARGE_BN: a tile width taken instead of the launcher's choice (256, 192 or 128 for every
 *    variant, fq taking 192 or 128 for 256; 96 or 64 for v6, where the default runs it).
 *  MT_FQ_ROWS: under fq, the rows the quantization kernel does before the GEMM at least (rounded
 *    up to 128; default 0: the first wave's bands): moves the split when the kernel's quantizers
 *    are too slow to stay ahead of the tiles (kernels/NOTES.md, fourth session).
 * The other knobs and kernels measured in earlier sessions (small-M: warp-specialized, shift
 * decode, 16-64 rows; large-M: v1, np, mc, m64) lost and were removed (kernels/NOTES.md). */
enum { LARGE_DEFAULT, LARGE_V6, LARGE_RA, LARGE_FQ };
static struct {
  int large_variant, large_bn;
  long long fq_rows;
} knobs;
static pthread_once_t knobs_once = PTHREAD_ONCE_INIT;

static void knobs_read(void) {
  static const char *const large[] = {"default", "v6", "ra", "fq", NULL};
  static const char *const widths[] = {"default", "256", "192", "128", "96", "64", NULL};
  static const int width_of[] = {0, 256, 192, 128, 96, 64};
  int errors = 0; /* a warning is enough: these are not the user's settings */
  knobs.large_variant = mt_param_choice("MT_LARGE_VARIANT", large, 0, &errors); /* order of the enum */
  knobs.large_bn = width_of[mt_param_choice("MT_LARGE_BN", widths, 0, &errors)];
  knobs.fq_rows = (long long)mt_param_count("MT_FQ_ROWS", 0, 0, 1ull << 30, "rows", &errors);
}

static int large_variant(void) {
  pthread_once(&knobs_once, knobs_read);
  return knobs.large_variant;
}

int mt_gemm_pack_weight(const mt_qweight *q, const uint32_t *only_if, mt_stream stream) {
  size_t chunks = mt_gemm_frag_bytes(q->n, q->k) / 16;
  if (!chunks)
    return MT_OK;
  mt_pack_args a = {q->codes, q->scales, q->frag, only_if, q->n, q->k};
  return launch("gemm_small", "mt_gemm_pack", (unsigned)((chunks + 255) / 256), 1, 256, 0, 0, stream, &a);
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

/* One CTA per 16 output channels (gemm_small.cu), token capacity MT_SMALL_ROWS. */
_Static_assert(MT_GEMM_SMALL_M <= MT_SMALL_ROWS, "the small path's kernel holds at most MT_SMALL_ROWS tokens");
static int small_path(const mt_gemm_args *a, const mt_qact *q, mt_stream stream) {
  mt_small_args s = {q->xhat, a->w->frag, {0}, NULL, 0, 0};
  epilogue_args(a, q, &s.e);
  unsigned grid = (unsigned)(a->n / (8 * MT_SMALL_WARPS));
  return launch("gemm_small", "mt_gemm_small_m8", grid, 1, 32 * MT_SMALL_WARPS, MT_SMALL_SMEM, 1, stream, &s);
}

static int sm_count(void) {
  const mt_driver *d = mt_driver_get();
  CUdevice dev;
  int n = 0;
  if (!d || d->ctx_get_device(&dev) != CUDA_SUCCESS ||
      d->device_get_attribute(&n, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) != CUDA_SUCCESS || n <= 0)
    return 132;
  return n;
}

/* Whether path p can take m tokens of k columns (packed: the weight's small-kernel copy exists):
 * fused, few tokens whose quantized rows fit the kernel's shared memory (gemm_args.h); small, the
 * kernel's token capacity; both need the packed weight. */
static int path_fits(int p, int m, int k, int packed) {
  switch (p) {
  case MT_PATH_FUSED:
    return packed && m <= MT_SMALL_FUSE_M && (size_t)m * (2 * (size_t)k + 16) <= MT_SMALL_FUSE_XHAT;
  case MT_PATH_SMALL:
    return packed && m <= MT_SMALL_ROWS;
  case MT_PATH_LARGE:
    return 1;
  default:
    return 0;
  }
}

/* AUTO's choice, from make bench's path table (H200; kernels/NOTES.md, sixth session):
 * - fused where each SM's CTAs redo at most MT_GEMM_FUSE_ELEMS elements of the quantization
 *   (m * k * waves of n / 16 CTAs): each CTA quantizes all m x k itself, and past that the
 *   separate quantization launch (~2 µs, overlapped by PDL) costs less: Qwen3's down at 1 and 2
 *   tokens, gate_up at 1; DeepSeek's never;
 * - the small kernel up to MT_GEMM_SMALL_M tokens on weights of at most MT_GEMM_SMALL_W elements
 *   (Qwen3's: 0.1-0.6 µs under the large path). On larger ones the large path's BF16 stream keeps
 *   up with the small kernel's decode, and the small kernel's activation reads (m x k per 16
 *   channels) grow with m: DeepSeek 7168x2048 at 4 tokens 14.0 µs against 11.5. */
int mt_gemm_auto_path(int m, int n, int k, int packed, int sms) {
  long long waves = ((long long)n / 16 + sms - 1) / sms;
  if ((long long)m * k * waves <= MT_GEMM_FUSE_ELEMS && path_fits(MT_PATH_FUSED, m, k, packed))
    return MT_PATH_FUSED;
  if (m <= MT_GEMM_SMALL_M && (long long)n * k <= MT_GEMM_SMALL_W && path_fits(MT_PATH_SMALL, m, k, packed))
    return MT_PATH_SMALL;
  return MT_PATH_LARGE;
}

int mt_gemm_path_of(const mt_gemm_args *a) {
  int packed = mt_gemm_frag_bytes(a->n, a->k) && a->w->frag;
  if (a->path != MT_PATH_AUTO)
    return path_fits(a->path, a->m, a->k, packed) ? (int)a->path : -1;
  /* only the fused kernel's rule reads the SM count: the driver is asked where that kernel fits */
  int sms = path_fits(MT_PATH_FUSED, a->m, a->k, packed) ? sm_count() : 1;
  return mt_gemm_auto_path(a->m, a->n, a->k, packed, sms);
}

int mt_gemm_launch_fused(const mt_gemm_args *a, mt_stream stream) {
  mt_qact none = {NULL, NULL, NULL, NULL, a->m};
  mt_small_args s = {NULL, a->w->frag, {0}, a->x, (long long)a->ldx, a->xtype == MT_DTYPE_FP16};
  epilogue_args(a, &none, &s.e);
  unsigned grid = (unsigned)(a->n / (8 * MT_SMALL_WARPS));
  return launch("gemm_small", "mt_gemm_small_q4", grid, 1, 32 * MT_SMALL_WARPS, MT_SMALL_FUSE_SMEM, 0, stream, &s);
}

/* A K-major BF16 matrix of rows x k as TMA sees it: boxes of 64 columns (128 bytes, the swizzle
 * span) by box_rows rows; reads past the matrix return zeros, which add nothing to a sum. */
static int tensor_map(CUtensorMap *map, const void *base, int rows, int k, int box_rows) {
  const mt_driver *d = mt_driver_get();
  cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)rows};
  cuuint64_t strides[1] = {(cuuint64_t)k * 2};
  cuuint32_t box[2] = {64, (cuuint32_t)box_rows};
  cuuint32_t elem_strides[2] = {1, 1};
  CUresult r = d->tensor_map_encode_tiled(
      map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)base, dims, strides, box, elem_strides,
      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
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
      map, type == MT_DTYPE_FP16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, y, dims,
      strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? MT_OK : MT_ERR_UNSUPPORTED;
}

/* Tiles of MT_LARGE_BM tokens x bn channels over an m x n output. */
static long long tile_count(int m, int n, int bn) {
  return (long long)((m + MT_LARGE_BM - 1) / MT_LARGE_BM) * ((n + bn - 1) / bn);
}

/* The tile width with the least estimated time: waves of tiles times a tile's cost, taken as its
 * width plus a fixed 64 columns' worth for the activation loads and the epilogue. Narrow tiles
 * (64, 96) put more SMs to work at medium M (M = 256: 48 tiles of 128 x 64 rather than 16 of
 * 128 x 192). */
static int large_bn(int m, int n, int sms) {
  static const int widths[] = {256, 192, 128, 96, 64};
  int best = 256;
  long long best_cost = -1;
  for (int i = 0; i < 5; i++) {
    long long tiles = tile_count(m, n, widths[i]);
    long long cost = (tiles + sms - 1) / sms * (widths[i] + 64);
    if (best_cost < 0 || cost < best_cost) {
      best_cost = cost;
      best = widths[i];
    }
  }
  return best;
}

/* The tile width: MT_LARGE_BN where set, else large_bn's choice for sms SMs. */
static int tile_width(const mt_gemm_args *a, int sms) {
  pthread_once(&knobs_once, knobs_read);
  return knobs.large_bn ? knobs.large_bn : large_bn(a->m, a->n, sms);
}

/* Whether the TMA-store epilogue (the ts and ra kernels) can write y with tiles bn wide, leaving
 * y's description in ty: tiles of 128 to 256, rows that end on 16 bytes (the store clips at n by
 * 16-byte pieces: at n = 271 it wrote column 271, the caller's padding; H200, 2026-11-29), so
 * n % 8 == 0, and a y that suits a tensor map (16-byte aligned base and row stride). */
static int stores_by_tma(const mt_gemm_args *a, int bn, CUtensorMap *ty) {
  return bn >= 128 && a->n % 8 == 0 && output_map(ty, a->y, a->ytype, a->m, a->n, a->ldy) == MT_OK;
}

/* The persistent grid: one CTA per SM (one fits: ~200 KB of shared memory), each walking its tiles. */
static unsigned persistent_grid(const mt_gemm_args *a, int bn, int sms) {
  long long tiles = tile_count(a->m, a->n, bn);
  return (unsigned)(tiles < sms ? tiles : sms);
}

/* The ra kernel's tile width for this call, or 0 where it does not run: MT_LARGE_VARIANT=ra, the
 * large path, and stores_by_tma (y's description left in ty); the SM count in *sms. The engine
 * asks it before quantizing (records or xhat) and the launcher again, with the same answer. */
static int ra_width(const mt_gemm_args *a, CUtensorMap *ty, int *sms) {
  if (large_variant() != LARGE_RA || mt_gemm_path_of(a) != MT_PATH_LARGE || !mt_driver_get())
    return 0;
  *sms = sm_count();
  int bn = tile_width(a, *sms);
  return stores_by_tma(a, bn, ty) ? bn : 0;
}

/* The fq kernel's first rows for this call, or a->m where it does not run: MT_LARGE_VARIANT=fq, the
 * large path, S_a per row, stores_by_tma, and a first wave of tiles (tile blockIdx.x of every CTA)
 * that leaves rows to quantize: the bands it touches are quantized before the kernel (they are
 * needed at once), the rest by the kernel's spare warps while its tensor cores run. */
static int fq_rows(const mt_gemm_args *a, int bn, int sms, CUtensorMap *ty) {
  if (large_variant() != LARGE_FQ || a->w->num.act_scale != MT_SCALE_ROW || !stores_by_tma(a, bn, ty))
    return a->m;
  int tiles_n = (a->n + bn - 1) / bn, grid = (int)persistent_grid(a, bn, sms);
  long long r0 = (long long)((grid - 1) / tiles_n + 1) * MT_LARGE_BM;
  long long least = (knobs.fq_rows + MT_LARGE_BM - 1) / MT_LARGE_BM * MT_LARGE_BM; /* MT_FQ_ROWS */
  if (r0 < least)
    r0 = least;
  return r0 < a->m ? (int)r0 : a->m;
}

/* The fq kernels' tile width for a call whose ts width is bn: at most 192 (their fourth warpgroup
 * leaves 128 registers a thread, too few for a 256-wide tile's accumulators); in place of 256,
 * whichever of 192 and 128 pads n less (2048: 128, 1536: 192). */
static int fq_width(const mt_gemm_args *a, int bn) {
  if (bn <= 192)
    return bn;
  int pad192 = (a->n + 191) / 192 * 192 - a->n, pad128 = (a->n + 127) / 128 * 128 - a->n;
  return pad192 <= pad128 ? 192 : 128;
}

int mt_gemm_quant_rows(const mt_gemm_args *a) {
  if (large_variant() != LARGE_FQ || mt_gemm_path_of(a) != MT_PATH_LARGE || !mt_driver_get())
    return a->m;
  CUtensorMap ty;
  int sms = sm_count();
  return fq_rows(a, fq_width(a, tile_width(a, sms)), sms, &ty);
}

int mt_gemm_act_records(const mt_gemm_args *a) {
  CUtensorMap ty;
  int sms;
  return ra_width(a, &ty, &sms) != 0;
}

size_t mt_gemm_act_bytes(int m, int k) {
  size_t xhat = (size_t)m * (size_t)k * 2, rec = MT_ACT_REC_BYTES(m, k);
  return large_variant() == LARGE_RA && rec > xhat ? rec : xhat;
}

/* The ra kernel on activations given as records (q->rec): the TMA-store kernel's grid and epilogue. */
static int ra_path(const mt_gemm_args *a, const mt_qact *q, mt_stream stream) {
  static mt_large_args proto; /* only for its alignment: CUtensorMap must be 64-byte aligned */
  mt_large_args l = proto;
  int sms, bn = ra_width(a, &l.ty, &sms);
  if (!bn) /* records were made for a call the ra kernel does not take: not the engine's doing */
    return MT_ERR_UNSUPPORTED;
  int st = tensor_map(&l.tw, a->w->xhat, a->n, a->k, bn);
  if (st != MT_OK)
    return st;
  epilogue_args(a, q, &l.e);
  l.ra = q->rec;
  const char *fn = bn == 256 ? "mt_gemm_large_ra_n256" : bn == 192 ? "mt_gemm_large_ra_n192" : "mt_gemm_large_ra_n128";
  return launch("gemm_large", fn, persistent_grid(a, bn, sms), 1, 384, MT_LARGE_SMEM_RA(bn), 1, stream, &l);
}

/* The fq kernel on l (activation and weight maps and the epilogue already there), or
 * MT_ERR_UNSUPPORTED where the engine's split of the rows (q->r0) is not the one fq_rows gives. */
static int fq_launch(const mt_gemm_args *a, const mt_qact *q, int bn, int sms, mt_large_args *l, mt_stream stream) {
  if (!q->sync || fq_rows(a, bn, sms, &l->ty) != q->r0)
    return MT_ERR_UNSUPPORTED;
  l->fq_x = a->x;
  l->fq_ldx = (long long)a->ldx;
  l->fq_xhat = (uint16_t *)q->xhat;
  l->fq_outer = (float *)q->outer;
  l->fq_sync = q->sync;
  l->fq_r0 = q->r0;
  l->fq_fp16 = a->xtype == MT_DTYPE_FP16;
  const char *fn = bn == 192 ? "mt_gemm_large_fq_n192" : "mt_gemm_large_fq_n128";
  return launch("gemm_large", fn, persistent_grid(a, bn, sms), 1, MT_LARGE_FQ_THREADS, MT_LARGE_SMEM_TS(bn), 1, stream, l);
}

static int large_path(const mt_gemm_args *a, const mt_qact *q, mt_stream stream) {
  static mt_large_args proto; /* only for its alignment: CUtensorMap must be 64-byte aligned */
  mt_large_args l = proto;
  if (q->rec)
    return ra_path(a, q, stream);
  int sms = sm_count(), bn = tile_width(a, sms);
  if (q->r0 < a->m) /* the fq kernel quantizes rows r0 .. m-1 itself (mt_gemm_quant_rows) */
    bn = fq_width(a, bn);
  /* the last band's activation map (its rows only), then the other bands' where they exist and
   * differ */
  int last = a->m - (a->m - 1) / MT_LARGE_BM * MT_LARGE_BM; /* 1 to 128 */
  l.last_rows = (last + 7) / 8 * 8;
  int st = tensor_map(&l.ta_last, q->xhat, a->m, a->k, l.last_rows);
  if (st == MT_OK)
    st = a->m <= MT_LARGE_BM || l.last_rows == MT_LARGE_BM ? (l.ta = l.ta_last, MT_OK)
                                                           : tensor_map(&l.ta, q->xhat, a->m, a->k, MT_LARGE_BM);
  if (st == MT_OK)
    st = tensor_map(&l.tw, a->w->xhat, a->n, a->k, bn);
  if (st != MT_OK)
    return st;
  epilogue_args(a, q, &l.e);
  if (q->r0 < a->m)
    return fq_launch(a, q, bn, sms, &l, stream);
  unsigned grid = persistent_grid(a, bn, sms);
  /* TMA stores (all but v6; ra where its kernel does not run is the default) where they can,
   * else per-thread stores */
  if (large_variant() != LARGE_V6 && stores_by_tma(a, bn, &l.ty)) {
    const char *fn = bn == 256 ? "mt_gemm_large_ts_n256" : bn == 192 ? "mt_gemm_large_ts_n192" : "mt_gemm_large_ts_n128";
    return launch("gemm_large", fn, grid, 1, 384, MT_LARGE_SMEM_TS(bn), 1, stream, &l);
  }
  const char *fn = bn == 256 ? "mt_gemm_large_n256" : bn == 192 ? "mt_gemm_large_n192" : bn == 128 ? "mt_gemm_large_n128"
                 : bn == 96  ? "mt_gemm_large_n96"
                             : "mt_gemm_large_n64";
  return launch("gemm_large", fn, grid, 1, 384, MT_LARGE_SMEM(bn), 1, stream, &l);
}

int mt_gemm_launch(const mt_gemm_args *a, const mt_qact *q, mt_stream stream) {
  int path = mt_gemm_path_of(a);
  if (path < 0)
    return MT_ERR_UNSUPPORTED;
  return path == MT_PATH_LARGE ? large_path(a, q, stream) : small_path(a, q, stream);
}
