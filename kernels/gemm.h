/* gemm.h — launchers of the W4A4 GEMM kernels (kernels/gemm_small.cu, kernels/gemm_large.cu),
 * called by the engine after the activations are quantized.
 *
 * Both paths multiply exact BF16 dequantized operands in k16 tensor-core steps (mma.sync
 * m16n8k16 for small M, wgmma m64nNk16 for large M: the same bits on NVFP4 operands,
 * lab/probe_mma.cu) with FP32 accumulation over K in one fixed order, one CTA per output tile,
 * no split-K and no atomics, so a row's result does not depend on M, on its position or on the
 * path (tests/gpu/test_kernels.c proves it bitwise). The small-M kernels stream the packed NVFP4
 * weight and decode it in registers; the large-M path, which takes nearly every call, reads the
 * BF16 dequantized weight through TMA in tiles of 64 or 128 tokens.
 */
#ifndef MT_GEMM_H
#define MT_GEMM_H

#include <limits.h>

#include "kernels/driver.h"
#include "kernels/engine.h"

/* The largest m or n a GEMM takes: tile counts round a dimension up by less than 256 in int. */
#define MT_GEMM_DIM_MAX (INT_MAX - 256)

/* The quantized activations the engine prepared in its workspace. */
typedef struct {
  const uint16_t *xhat; /* [m][k] BF16 dequantized activations (exact), row stride k */
  const float *outer;   /* S_a: m floats (row) or 1 (tensor) */
} mt_qact;

/* AUTO's threshold (mt_gemm_auto_path in kernels/gemm.c says why): the fused kernel while each SM
 * redoes at most MT_GEMM_FUSE_ELEMS elements of the activations' quantization, else the large path.
 * The small kernel runs only when a call asks for it (mt_gemm_args.path). */
#define MT_GEMM_FUSE_ELEMS 1024

/* Bytes of the small-M kernels' copy of an n x k weight's codes and scales (mt_qweight.frag): only
 * for weights AUTO would fuse one token of on a GPU of 132 SMs (n % 16 == 0, and k times the waves
 * of n / 16 CTAs at most MT_GEMM_FUSE_ELEMS: Qwen3's down, not its gate_up nor DeepSeek's), else 0
 * and no copy: the small kernels then refuse a forced call. */
size_t mt_gemm_frag_bytes(int n, int k);

/* Rearrange q's codes and scales into q->frag; the engine calls it after quantizing a weight.
 * With only_if (a device word), the kernel does nothing when the word reads 0. */
int mt_gemm_pack_weight(const mt_qweight *q, const uint32_t *only_if, mt_stream stream);

/* The path of the call (a->path, or AUTO's choice): MT_PATH_FUSED, _SMALL or _LARGE; -1 where a
 * forced path cannot take it. For FUSED the engine launches mt_gemm_launch_fused instead of
 * quantizing and calling mt_gemm_launch. */
int mt_gemm_path_of(const mt_gemm_args *a);
/* AUTO's choice for m tokens on an n x k weight (packed: its small-kernel copy exists) on a GPU of
 * sms SMs; mt_gemm_path_of asks it with the current device's count. */
int mt_gemm_auto_path(int m, int n, int k, int packed, int sms);
int mt_gemm_launch_fused(const mt_gemm_args *a, mt_stream stream);

/* The large path's tile for m tokens on an n-row weight with sms SMs: the one of least estimated
 * time (kernels/gemm.c says how it is estimated), among those bm tokens high and bn wide where
 * those are not 0; {0, 0} where no kernel has such a tile. */
mt_gemm_tile mt_gemm_large_tile(int m, int n, int sms, int bm, int bn);

/* 1 where tiles t at depth k load a stage's two K blocks of an operand in one box (rank-3 tensor
 * maps, mt_gemm_large_m64p_nBN): 64-token tiles, k % 64 == 0, more stages than their ring holds. */
int mt_gemm_kpair(int k, mt_gemm_tile t);

/* A K-major BF16 matrix of rows x k for TMA loads of 128B-swizzled boxes of 64 columns by box_rows
 * rows (zeros past the matrix); with pair (k % 64 == 0), of rank 3, a box two K blocks deep. Shared
 * by the large path and the grouped engine (kernels/grouped.c), whose activation stages are the
 * same. MT_OK, or MT_ERR_UNSUPPORTED where the driver refuses the map. */
int mt_gemm_tensor_map(CUtensorMap *map, const void *base, int rows, int k, int box_rows, int pair);

/* Run a->y = ... on the large path for the quantized activations q (MT_ERR_UNSUPPORTED for any
 * other path: the fused kernel runs through mt_gemm_launch_fused). */
int mt_gemm_launch(const mt_gemm_args *a, const mt_qact *q, mt_stream stream);

#endif
