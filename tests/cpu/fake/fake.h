/* fake.h — what the fake cuBLAS libraries (tests/cpu/fake/) add to the real API for the tests.
 *
 * The fakes compute GEMMs on host memory ("device" pointers are host pointers here) with the real
 * semantics, and record the arguments of the last GEMM entry point called, so that a test can
 * check that the shim forwarded every argument unchanged.
 */
#ifndef MT_FAKE_H
#define MT_FAKE_H

#include <stdint.h>

#include "shim/cuda_api.h"

#define FAKE_MAX_ARGS 24

typedef struct {
  char fn[64]; /* the entry point's name */
  int nargs;
  uint64_t args[FAKE_MAX_ARGS]; /* each argument widened to 64 bits, pointers as addresses */
  long calls;                   /* GEMM entry points called so far */
  long attr_gets;               /* cublasLt*GetAttribute calls so far (the shim's reads) */
} fake_record;

/* The calling thread's record of libcublas.so.13 (fake) and of libcublasLt.so.13 (fake). */
void fake_cublas_last(fake_record *out);
void fake_cublasLt_last(fake_record *out);

/* Number conversions shared by both fakes: BF16 and FP16 to and from float, RNE. */
static inline float fake_bf16_to_float(uint16_t h) {
  union {
    uint32_t u;
    float f;
  } v = {.u = (uint32_t)h << 16};
  return v.f;
}

static inline uint16_t fake_float_to_bf16(float f) {
  union {
    uint32_t u;
    float f;
  } v = {.f = f};
  if ((v.u & 0x7fffffffu) > 0x7f800000u)
    return (uint16_t)((v.u >> 16) | 0x40);
  return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1)) >> 16);
}

static inline float fake_f16_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff;
  union {
    uint32_t u;
    float f;
  } v;
  if (exp == 0x1f) {
    v.u = sign | 0x7f800000u | (man << 13);
  } else if (exp == 0) {
    float m = (float)man * (1.0f / 16777216.0f); /* 2^-24 */
    return sign ? -m : m;
  } else {
    v.u = sign | ((exp + 112) << 23) | (man << 13);
  }
  return v.f;
}

static inline uint16_t fake_float_to_f16(float f) {
  union {
    uint32_t u;
    float f;
  } v = {.f = f};
  uint32_t sign = (v.u >> 16) & 0x8000, a = v.u & 0x7fffffffu;
  if (a > 0x7f800000u)
    return (uint16_t)(sign | 0x7e00);
  if (a >= 0x477ff000u) /* rounds to >= 65520: infinity */
    return (uint16_t)(sign | 0x7c00);
  if (a < 0x38800000u) { /* subnormal half: scale so that RNE happens in the float add */
    union {
      uint32_t u;
      float f;
    } t = {.u = a};
    t.f += 0.5f; /* 2^-1 pins the exponent: the low mantissa bits are the half subnormal */
    return (uint16_t)(sign | (t.u - 0x3f000000u));
  }
  uint32_t r = a + 0xfffu + ((a >> 13) & 1);
  return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

/* One element of type t (CUDA_R_16BF, CUDA_R_16F, CUDA_R_32F) as float, and back. */
static inline float fake_load(const void *p, int t, int64_t i) {
  if (t == CUDA_R_32F)
    return ((const float *)p)[i];
  uint16_t h = ((const uint16_t *)p)[i];
  return t == CUDA_R_16BF ? fake_bf16_to_float(h) : fake_f16_to_float(h);
}

static inline void fake_store(void *p, int t, int64_t i, float x) {
  if (t == CUDA_R_32F)
    ((float *)p)[i] = x;
  else
    ((uint16_t *)p)[i] = t == CUDA_R_16BF ? fake_float_to_bf16(x) : fake_float_to_f16(x);
}

static inline int fake_type_ok(int t) {
  return t == CUDA_R_16BF || t == CUDA_R_16F || t == CUDA_R_32F;
}

#endif
