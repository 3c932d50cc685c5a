// gemm_common.cuh — what both GEMM paths share, so that a row's bits never depend on the path: the
// epilogue (the order of gemm_args.h, each operation rounded on its own) and the device helpers of
// kernels/gemm_small.cu and kernels/gemm_large.cu.
#pragma once
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#include "kernels/gemm_args.h"
#include "kernels/pdl.cuh"

enum { DT_BF16 = 0, DT_FP16 = 1, DT_FP32 = 2 }; // enum mt_dtype, kernels/engine.h

// epilogue

__device__ static inline float load_elem(const void *p, long long i, int type) {
  if (type == DT_BF16)
    return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
  if (type == DT_FP16)
    return __half2float(((const __half *)p)[i]);
  return ((const float *)p)[i];
}

// y is BF16 or FP16: the engine routes no other output type (gemm_args_ok in engine.c).
__device__ static inline void store_elem(void *p, long long i, int type, float v) {
  if (type == DT_BF16)
    ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
  else
    ((__half *)p)[i] = __float2half_rn(v);
}

// 1/S by the correctly rounded reciprocal: the same bits as the reference's 1.0f / S.
__device__ static inline float inv_row(const float *s, int per_row, int i) {
  return __frcp_rn(s[per_row ? i : 0]);
}

// acc of output (i, j) to its final value, in the order of gemm_args.h; _rn keeps the compiler
// from contracting into FMAs, which would make the bits depend on how each path was compiled.
__device__ static inline float epilogue(const mt_epilogue_args &e, float acc, float inv_a,
                                        float inv_w, int i, int j) {
  float t = __fmul_rn(__fmul_rn(acc, __fmul_rn(inv_a, inv_w)), e.alpha);
  if (e.c)
    t = __fadd_rn(t, __fmul_rn(e.beta, load_elem(e.c, i * e.ldc + j, e.ytype)));
  if (e.bias)
    t = __fadd_rn(t, load_elem(e.bias, j, e.biastype));
  return t;
}

// The decode of packed E2M1 codes into BF16 MMA fragments, for the small path's 5-bit records
// (gemm_args.h; the grouped engine's store has its own bit order, wstore.h): one k16 step's
// fragment pair of a row g, from 16 bits x = code byte q (elements 2q, 2q+1) then code byte q+4
// (2q+8, 2q+9), and s2 the block scale as BF16 in
// both halves. Magnitudes by byte permutations of two 8-entry tables (high and low bytes of the
// BF16 values 0 .. 6); the four sign bits (3, 7, 11, 15) moved to bits 15 and 31 of each pair by
// one multiply each (no carries reach them); then one BF16x2 multiply per pair, exact (e2m1 * e4m3
// has at most 6 significant bits). hi0 and lo0 are constants, the tables' first words (a byte
// permutation takes one of its two words from a register), overridable by a caller that keeps them
// in registers it loaded once.
__device__ static inline void weight_frag(uint32_t x, uint32_t s2, uint32_t &b0, uint32_t &b1,
                                          uint32_t hi0 = 0x3F3F3F00u, uint32_t lo0 = 0xC0800000u) {
  uint32_t sel = x & 0x7777u;
  uint32_t hi = __byte_perm(hi0, 0x40404040u, sel); // high bytes of 0,.5,1,1.5,2,3,4,6
  uint32_t lo = __byte_perm(lo0, 0xC0804000u, sel); // low bytes
  uint32_t sg = x & 0x8888u;
  uint32_t p0 =
      __byte_perm(lo, hi, 0x5140) | ((sg * 0x01001000u) & 0x80008000u); // bit 3 -> 15, 7 -> 31
  uint32_t p1 =
      __byte_perm(lo, hi, 0x7362) | ((sg * 0x00010010u) & 0x80008000u); // bit 11 -> 15, 15 -> 31
  __nv_bfloat162 r0 = __hmul2(*(__nv_bfloat162 *)&p0, *(__nv_bfloat162 *)&s2);
  __nv_bfloat162 r1 = __hmul2(*(__nv_bfloat162 *)&p1, *(__nv_bfloat162 *)&s2);
  b0 = *(uint32_t *)&r0;
  b1 = *(uint32_t *)&r1;
}

__device__ static inline uint32_t smem_u32(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

// mbarriers in shared memory (sm_90): the large path's stage ring.
__device__ static inline void mbar_init(uint64_t *bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
}

// one arrival, and `bytes` more expected before the phase completes
__device__ static inline void mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)),
               "r"(bytes)
               : "memory");
}

__device__ static inline void mbar_arrive(uint64_t *bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

__device__ static inline void mbar_wait(uint64_t *bar, int parity) {
  asm volatile("{\n.reg .pred p;\nWAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
               "@!p bra WAIT;\n}\n" ::"r"(smem_u32(bar)),
               "r"(parity)
               : "memory");
}

// A TMA load of one box of `map` at (c0, c1) into this CTA's shared memory, completing on bar.
__device__ static inline void tma_load_2d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0,
                                          int c1) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], "
               "[%1, {%3, %4}], [%2];\n" ::"r"(smem_u32(dst)),
               "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
               : "memory");
}

// The same for a map of rank 3 (mt_gemm_large_m64p_nBN): one box of (c0, c1, c2).
__device__ static inline void tma_load_3d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0,
                                          int c1, int c2) {
  asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], "
               "[%1, {%3, %4, %5}], [%2];\n" ::"r"(smem_u32(dst)),
               "l"(map), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}

// A plain bulk copy (no tensor map) of `bytes` (a multiple of 16, both addresses 16-byte aligned)
// from global into this CTA's shared memory, completing on bar (the ra variant's records).
__device__ static inline void bulk_load(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

// Descriptor of a K-major tile in the layout TMA writes with 128B swizzle: rows of 128 bytes
// (64 BF16 along K), groups of 8 rows 1024 bytes apart, tile base 1024-byte aligned. A step of 16
// along K inside the 128-byte row moves the start address by 32 bytes (the swizzle is applied by
// the hardware on the final address).
__device__ static inline uint64_t desc_sw128(uint32_t addr) {
  return (uint64_t)((addr >> 4) & 0x3FFF) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 |
         (uint64_t)1 << 62;
}
