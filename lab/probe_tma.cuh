// probe_tma.cuh — the TMA description of an operand, for the probes that drive the large path's
// kernels or pipeline (lab/probe_feed.cu); link with -lcuda.
#pragma once
#include <cuda.h>

#include <cstdio>
#include <cstdlib>

// A K-major BF16 matrix of rows x k for TMA, boxes of 64 columns x box_rows, 128B swizzle: what
// kernels/gemm.c's tensor_map makes for the kernels (pair: rank 3, boxes of two 64-wide blocks).
static CUtensorMap tensor_map(const void *base, int rows, int k, int box_rows, bool pair = false) {
  CUtensorMap map;
  cuuint64_t dims[3] = {pair ? 64 : (cuuint64_t)k, (cuuint64_t)rows, (cuuint64_t)k / 64},
             strides[2] = {(cuuint64_t)k * 2, 128};
  cuuint32_t box[3] = {64, (cuuint32_t)box_rows, 2}, elem_strides[3] = {1, 1, 1};
  CUresult r = cuTensorMapEncodeTiled(
      &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, pair ? 3 : 2, (void *)base, dims, strides, box,
      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    printf("cuTensorMapEncodeTiled: %d\n", (int)r);
    exit(1);
  }
  return map;
}
