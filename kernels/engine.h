/* engine.h — the NVFP4 W4A4 engine: the C API that the shim calls to run one routed GEMM.
 *
 * Runs on the CUDA driver API only (libcuda.so.1 through dlopen, see kernels/driver.h): no CUDA
 * runtime, no cuBLAS. Kernels come from fatbins built for sm_90a, one per kernel file, embedded in
 * the library; all of them are loaded once per CUDA context, at its first routed call.
 *
 * Shapes are in token terms, row-major: x[M][K] activations, W[N][K] weight (N output channels),
 * y[M][N] = x . W^T. A cuBLAS TN call (m = N, n = M, k = K, A = W, B = x, C = y) maps onto it
 * directly: lda, ldb and ldc are the row strides below.
 *
 * Every function returns MT_OK or a status the shim turns into a counted fallback reason; none of
 * them synchronizes the caller's stream, allocates memory or reads device memory back to the host
 * except where it says so.
 */
#ifndef MT_ENGINE_H
#define MT_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "kernels/whash.h"
#include "spec/spec.h"

typedef struct CUstream_st *mt_stream; /* a CUstream (== cudaStream_t) */

enum mt_status {
  MT_OK = 0,
  MT_ERR_NO_DRIVER,   /* libcuda.so.1 or a needed entry point not found */
  MT_ERR_NO_DEVICE,   /* no current context, or the device is not sm_90 */
  MT_ERR_UNSUPPORTED, /* a shape, type or stride the kernels do not take */
  MT_ERR_CAPTURE,     /* would need to load or allocate while the stream is capturing */
  MT_ERR_NOMEM,       /* the workspace given is too small, or an allocation failed */
  MT_ERR_CUDA,        /* a driver call or launch failed */
};
const char *mt_status_name(enum mt_status s);

enum mt_dtype { MT_DTYPE_BF16, MT_DTYPE_FP16, MT_DTYPE_FP32 };

/* The numerics of the spec that the kernels need. */
typedef struct {
  enum mt_scale act_scale;
  enum mt_scale weight_scale;
  enum mt_wblock weight_block;
} mt_numerics;

void mt_numerics_from_spec(const mt_spec *s, mt_numerics *n);

/* A weight quantized for the GEMM (device memory the caller owns, laid out by mt_qweight_bind or
 * mt_qweight_bind_kept): the packed NVFP4 codes and scales and the outer scale (4.5 bits an
 * element: the kept form, what the frozen cache keeps); the full form adds the exact BF16
 * dequantized weight that the tensor cores read on the large path, and the small-M kernels' copy in
 * fragment order where AUTO may use it (what a call that requantizes writes, in one pass). A GEMM
 * on the kept form writes the dequantized copy from the codes into its workspace first (mt_gemm),
 * the same bits. */
typedef struct {
  int n, k;
  mt_numerics num;
  uint16_t *xhat;  /* [n][k] BF16: e2m1(code) * scale, exact; the outer scale is not applied. NULL
                      in the kept form */
  uint8_t *codes;  /* [n][k/2] E2M1 codes, ref/nvfp4.h layout */
  uint8_t *scales; /* [n][k/16] E4M3 block scales, ref/nvfp4.h layout */
  float *outer;    /* S: n floats (row) or 1 (tensor) */
  uint8_t *frag;   /* codes and scales again, in the small-M kernels' fragment order, or NULL
                       (mt_gemm_frag_bytes in kernels/gemm.h; written by mt_gemm_pack_weight; the
                       kept form has none) */
  /* The BF16/FP16 weight it is quantized from is stored [in][out] (k rows of n at row stride ldw:
   * element (r, c) at w[c * ldw + r]), as JAX keeps a Dense kernel; 0 (what binding sets): [n][k].
   * The quantized form is the same bits either way. */
  int in_out;
} mt_qweight;

/* Bytes of device memory a quantized n x k weight takes (data and outer together): the full form,
 * the kept form (~0.56 bytes an element), and the dequantized copy alone (2 bytes an element: what
 * a GEMM on the kept form needs in its workspace beyond mt_gemm_workspace_bytes). 0: a shape the
 * engine does not take. */
size_t mt_qweight_bytes(int n, int k, const mt_numerics *num);
size_t mt_qweight_kept_bytes(int n, int k, const mt_numerics *num);
size_t mt_qweight_xhat_bytes(int n, int k);

/* Point q at `mem` (mt_qweight_bytes, or for the kept form mt_qweight_kept_bytes, of device memory,
 * 256-byte aligned) for an n x k weight. */
int mt_qweight_bind(mt_qweight *q, int n, int k, const mt_numerics *num, void *mem);
int mt_qweight_bind_kept(mt_qweight *q, int n, int k, const mt_numerics *num, void *mem);

/* Quantize W (n rows of k, or k of n where q->in_out; row stride ldw, BF16 or FP16) into q on
 * `stream`. */
int mt_quantize_weight(const void *w, enum mt_dtype type, size_t ldw, mt_qweight *q,
                       mt_stream stream);

/* The same, done only when the device word *only_if is non-zero when the kernels run (they read it
 * themselves: nothing is read back); NULL quantizes unconditionally. */
int mt_quantize_weight_if(const void *w, enum mt_dtype type, size_t ldw, mt_qweight *q,
                          const uint32_t *only_if, mt_stream stream);

/* MT_OK when mt_quantize_weight takes these arguments, else MT_ERR_UNSUPPORTED; nothing is
 * launched. */
int mt_quantize_weight_accepts(const void *w, enum mt_dtype type, size_t ldw, const mt_qweight *q);

/* The frozen cache's refresh: quantize W into q only when W's bytes differ from those of the last
 * quantization recorded in `state` (mt_refresh_state_bytes(1) of device memory, zeroed before the
 * first use). Arguments the quantization would refuse are refused before the check runs, and a
 * quantization that fails to launch after it leaves the state without a hash (the next refresh
 * quantizes), so that the state never vouches for a q it did not get. A hash of the weight is
 * compared on the device (kernels/wcheck.cu): nothing is read back, so it is legal inside graph
 * capture and a replay checks again. step 1: the whole weight
 * (cost when nothing changed: one read of it); step s > 1: one 1 KB run of lines in each s runs,
 * the same lines at every call (MINITE_WEIGHT_CACHE=frozen-sampled, MT_SAMPLE_STEP of
 * kernels/whash.h: a change confined to lines outside the sample goes unseen). */
size_t mt_refresh_state_bytes(int slices);
int mt_refresh_weight(const void *w, enum mt_dtype type, size_t ldw, mt_qweight *q, void *state,
                      unsigned step, mt_stream stream);

/* The kernels that run a GEMM: the few-token kernel that quantizes the activations itself
 * (fused) and the tiled tensor-core kernels after the activations' quantization (large). Both
 * give the same bits (docs/numerics.md, "Batch invariance"). AUTO, what the shim uses, lets
 * mt_gemm_path_of (kernels/gemm.h) pick the faster for the call; tests and make bench force one,
 * and a forced path that cannot take the call is MT_ERR_UNSUPPORTED. */
enum mt_gemm_path { MT_PATH_AUTO, MT_PATH_FUSED, MT_PATH_LARGE };

/* A large-path tile: bm tokens (128 or 64) x bn channels (256 to 64, or 64 to 32). {0, 0} in
 * mt_gemm_args lets the launcher choose; tests and make bench force one. */
typedef struct {
  int bm, bn;
} mt_gemm_tile;

/* One routed GEMM:  y = acc * ((1/S_a[i]) * (1/S_w[j])) * alpha + beta * c + bias, one RNE cast. */
typedef struct {
  int m, n, k;   /* tokens, output channels, inner */
  const void *x; /* [m][k], row stride ldx, type xtype */
  size_t ldx;
  enum mt_dtype xtype; /* BF16 or FP16 */
  const mt_qweight *w; /* [n][k] */
  void *y;             /* [m][n], row stride ldy, type ytype (BF16 or FP16) */
  size_t ldy;
  enum mt_dtype ytype;
  const void *c; /* beta's operand, [m][n], row stride ldc, type ytype; may be y */
  size_t ldc;
  const void *bias;       /* [n] or NULL, type biastype */
  enum mt_dtype biastype; /* BF16, FP16 or FP32 */
  float alpha, beta;
  void *workspace; /* device scratch of at least mt_gemm_workspace_bytes(m, k, ...), and
                      mt_qweight_xhat_bytes(n, k) more for a weight in the kept form */
  size_t workspace_bytes;
  enum mt_gemm_path path; /* MT_PATH_AUTO (0) */
  mt_gemm_tile tile;      /* the large path's tile: {0, 0} (the launcher's choice) */
} mt_gemm_args;

size_t mt_gemm_workspace_bytes(int m, int k, const mt_numerics *num);

int mt_gemm(const mt_gemm_args *a, mt_stream stream);

/* Where mt_gemm(a) writes the dequantized copy of a weight in the kept form (after the
 * activations' section of a->workspace), or NULL for a weight in the full form. A call on the same
 * stream after it, before anything else writes that memory, may read the copy there as the xhat of
 * the same weight (the instruments' probe reruns rows on it without dequantizing again). */
uint16_t *mt_gemm_kept_copy(const mt_gemm_args *a);

/* ---- the grouped engine: weights in 4.5 bits, a whole grouped problem in one launch ---------- */

/* A weight quantized for the grouped GEMM (kernels/wstore.h): `count` slices (the experts of a 3-D
 * expert tensor, or one weight) of n x k, each its NVFP4 codes and E4M3 block scales in the
 * kernel's order and its outer scale S: ~0.56 bytes an element. Device memory the caller owns. */
typedef struct {
  int count, n, k;
  mt_numerics num;
  uint8_t *base; /* slice e at base + e * slice_bytes */
  size_t slice_bytes;
  int in_out; /* the weights quantized into it are stored [in][out], as mt_qweight.in_out says */
} mt_wstore;

/* Bytes of device memory a store of count slices of n x k takes (0: a shape it cannot hold). */
size_t mt_wstore_bytes(int count, int n, int k, const mt_numerics *num);

/* Point w at mem (mt_wstore_bytes of device memory, 256-byte aligned). */
int mt_wstore_bind(mt_wstore *w, int count, int n, int k, const mt_numerics *num, void *mem);

/* Slice e's outer scale(s) S: n floats (per row) or one. */
const float *mt_wstore_outer(const mt_wstore *w, int e);

/* Quantize w->count weights of n rows of k (row stride ldw elements, `stride` elements from one to
 * the next; BF16 or FP16; k rows of n where w->in_out) into w on `stream`, each slice with its own
 * S. */
int mt_wstore_quantize(const void *wt, enum mt_dtype type, size_t ldw, size_t stride, mt_wstore *w,
                       mt_stream stream);

/* The same for weights behind a device array of w->count pointers (slice e from w_ptrs[e], row
 * stride ldw): the array and the weights are read on the device only. The same slices, bit for bit,
 * as mt_wstore_quantize of the same weights laid out with a stride. */
int mt_wstore_quantize_ptrs(const void *const *w_ptrs, enum mt_dtype type, size_t ldw, mt_wstore *w,
                            mt_stream stream);

/* The frozen cache's refresh of a store (kernels/quant.cu, refresh_store): the check and
 * quantization of mt_refresh_weight, slice by slice, of ws from its ws->count weights lying back to
 * back (row stride ldw, each n * ldw elements after the one before, k * ldw stored [in][out];
 * BF16 or FP16), with state
 * mt_refresh_state_bytes(ws->count) and step as there. With offs (a call's segment table as
 * mt_gemm_grouped reads it, a segment a slice: ws->count ends; m its rows), only the slices whose
 * segment has rows are checked and, when changed, requantized: the others keep their quantization
 * until a call that uses them checks them. Without, every slice. A grouped call takes a refresh
 * with offs only where offs is its own and nseg is ws->count. */
typedef struct {
  const void *w;
  enum mt_dtype type;
  size_t ldw;
  const mt_wstore *ws;
  void *state;
  unsigned step;
  const int32_t *offs;
  int m;
} mt_wstore_refresh_args;

/* The refresh on its own: one launch, which ends before what follows it on the stream starts. A
 * grouped call given it (mt_grouped_args.refresh) runs it beside its activations' quantization. */
int mt_wstore_refresh(const mt_wstore_refresh_args *r, mt_stream stream);

/* vLLM's fused-MoE dispatch (its Triton kernel fused_moe_kernel's sorted_token_ids, expert_ids and
 * num_tokens_post_padded: kernels/gemm_args.h, mt_moe_dispatch_args), which a grouped call may take
 * instead of rows by segment: the call first turns it into its segment ends and row lists on the
 * device, in memory the caller lays out with mt_moe_lists_at (the ends are then the call's offs,
 * its m the Triton kernel's num_valid_tokens), then gathers each row's activations from x row
 * id / top_k and writes its outputs to y row id (times its router weight where given: the row
 * rounded to y's type, times the weight in FP32, rounded again). The rows the Triton kernel
 * would compute, and only those, are written; the rows of blocks of expert -1 are zeroed. */
typedef struct {
  int32_t *offs, *src, *dst; /* nseg ends; m activation rows; m output rows */
  float *w;                  /* m router weights, or NULL */
} mt_moe_lists;
size_t mt_moe_lists_bytes(int m, int nseg, int weighted);
mt_moe_lists mt_moe_lists_at(void *mem, int m, int nseg, int weighted);

typedef struct {
  const int32_t *sorted;      /* [blocks * block_m] token ids (token * top_k + j), or NULL: one
                                 (token, expert) pair a block (vLLM's naive_block_assignment) */
  const int32_t *experts;     /* [blocks] */
  const int32_t *post_padded; /* device word */
  const float *weights;       /* router weights by id (MUL_ROUTED_WEIGHT), or NULL */
  int blocks, block_m, top_k;
  mt_moe_lists lists; /* lists.offs is the call's offs; lists.w set iff weights */
} mt_moe_dispatch;

/* A grouped GEMM: segments s = 0 .. nseg-1, y_s[m_s][n] = x_s[m_s][k] . W_s[n][k]^T with W_s slice
 * s of w, each output y = acc * ((1/S_a[i]) * (1/S_w[j])) * alpha + beta * c + bias, one RNE cast.
 * Rows: with offs (device memory, nseg int32 cumulative ends, as torch._grouped_mm takes them),
 * segment s is rows offs[s-1] .. offs[s]-1 of x, y and c (offs[-1] = 0), m the rows of x (a bound
 * on offs); without, every segment has seg_rows rows (m = nseg * seg_rows), segment s's at
 * x + s * stride_x, y + s * stride_y, c + s * stride_c (elements). A row's bits do not depend on
 * its segment, position, the other segments or bn.
 * Pointer arrays (device arrays of nseg pointers, read on the device only): with x_ptrs, segment
 * s's rows are its own matrix at x_ptrs[s] (row stride ldx; x and stride_x not used; with offs,
 * offs[nseg-1] must equal m), likewise y_ptrs and c_ptrs; the bits are those of the same data
 * laid out with strides or offsets.
 * With refresh (the frozen cache), the call refreshes the store first: of w itself, or of the one
 * slice its segments share (refresh->ws at w's base, one slice, w->slice_bytes 0).
 * Launch order (kernels/pdl.cuh): the activations' quantizer (per-row S) is launched to start while
 * the kernel before the call ends, and waits for it before it reads or writes; the GEMM reads offs
 * and the store before it waits. So offs and the store must not be written by a kernel just
 * before the call that lets its dependents start early: none of the engine's do (the store's
 * quantizers, its refresh on its own and mt_grouped_seg_ends end before what follows them
 * starts). With refresh, the refresh is launched between the quantizer and the GEMM: it starts once
 * the kernel before the call has ended, runs beside the quantizer (reading the weights, offs and
 * its state) and waits for it at its end. At up to 64 rows with per-row S the GEMM starts with the
 * refresh, waits only for the activations (the quantizer counts its running CTAs in the refresh's
 * state), runs every tile, and waits for the refresh before it ends: where the refresh requantized
 * a slice, every tile again. Else the refresh lets the GEMM start once its lines are read, and the
 * GEMM waits for it before its K loops, its first tile again where it requantized. Calls on one
 * state from several streams at once never wait for each other for good (the count may make one
 * wait for another's quantizer), but their refreshes race (shim/wcache.h). At token tile 256 the
 * GEMM is two launches (the segments' last tiles of a few rows on the second, which waits for the
 * first before it reads the activations), so a kernel that waits for the call's last waits for the
 * whole call. */
typedef struct {
  int nseg, n, k;
  const mt_wstore *w; /* at least nseg slices */
  const int32_t *offs;
  int m, seg_rows;
  const void *x;
  size_t ldx;
  long long stride_x;
  enum mt_dtype xtype; /* BF16 or FP16 */
  void *y;
  size_t ldy;
  long long stride_y;
  enum mt_dtype ytype; /* BF16 or FP16 */
  const void *c;       /* beta's operand, laid out as y; not read when beta == 0 */
  size_t ldc;
  long long stride_c;
  const void *bias; /* [n] a segment, stride_bias elements apart, or NULL */
  long long stride_bias;
  enum mt_dtype biastype;
  float alpha, beta;
  void *workspace; /* at least mt_grouped_workspace_bytes(m, k, ...) */
  size_t workspace_bytes;
  int bn; /* tokens a tile (8 .. 256, a power of two): 0, the launcher's choice (mt_grouped_bn) */
  const void *const *x_ptrs;
  void *const *y_ptrs;
  const void *const *c_ptrs;
  const mt_wstore_refresh_args *refresh; /* NULL, or the store's refresh the call runs first */
  /* NULL, or vLLM's dispatch (above): then offs == dispatch->lists.offs, which the call writes,
   * nseg at most MT_MOE_MAX_EXPERTS, no pointer arrays, no C (beta 0) and no bias */
  const mt_moe_dispatch *dispatch;
} mt_grouped_args;

/* Write offs[seg0 ..] (device int32 cumulative row ends, as mt_grouped_args.offs takes them) for
 * runs j = 0 .. nruns-1 of size[j] segments of rows[j] rows each (host arrays), the first segment
 * starting at row row0: the values travel in kernel parameters, so this is a launch only (legal
 * in graph capture; no host copy). The ends must fit an int32. */
int mt_grouped_seg_ends(int32_t *offs, int seg0, int row0, int nruns, const int32_t *size,
                        const int32_t *rows, mt_stream stream);

size_t mt_grouped_workspace_bytes(int m, int k, const mt_numerics *num);

/* The launcher's token tile for m rows over nseg segments. */
int mt_grouped_bn(int m, int nseg);

int mt_gemm_grouped(const mt_grouped_args *a, mt_stream stream);

#endif
