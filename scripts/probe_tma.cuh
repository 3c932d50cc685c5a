// probe_tma.cuh — the TMA description of an operand, for the probes that drive the large path's
// kernels or pipeline (scripts/probe_feed.cu, scripts/probe_kloop.cu); link with -lcuda.
#pragma once
#include <cuda.h>

#include <cstdio>
#include <cstdlib>

// A K-major BF16 matrix of rows x k for TMA, boxes of 64 columns x box_rows, 128B swizzle: what
// kernels/gemm.c's tensor_map makes for the kernels.
static CUtensorMap tensor_map(const void *base, int rows, int k, int box_rows) {
  CUtensorMap map;
  cuuint64_t dims[2] = {(cuuint64_t)k, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)k * 2};
  cuuint32_t box[2] = {64, (cuuint32_t)box_rows}, elem_strides[2] = {1, 1};
  CUresult r = cuTensorMapEncodeTiled(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)base, dims, strides, box,
                                      elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    printf("cuTensorMapEncodeTiled: %d\n", (int)r);
    exit(1);
  }
  return map;
}
