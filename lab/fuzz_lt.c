/* fuzz_lt.c — libFuzzer target of the reading of cuBLASLt descriptors (lab/fuzz.mk): a
 * cublasLtMatmul call whose descriptor and layout attributes are answered by the input (each
 * answer: success with the asked size, another size, or a failure, then the value), normalised
 * (shim/norm.c) and decided (shim/router.c) under a spec whose routes the input also picks.
 *
 * What must hold, whatever the answers: no crash, no read or write past an attribute's buffer
 * (ASan), no undefined arithmetic (UBSan); and a call decided "routed" is one the engine can
 * take: its weight shape is a route, k a multiple of 16, n positive, one problem or more,
 * column-major operands with leading dimensions that hold them, host scalars, 16-byte aligned
 * pointers (a strided batch: aligned strides, no two problems writing one output; pointer arrays
 * are the grouped engine's to check on the device).
 * Any violation aborts, so libFuzzer keeps the input.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "shim/norm.h"
#include "shim/router.h"
#include "spec/spec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const uint8_t *in;
static size_t left;

static uint8_t take8(void) {
  if (!left)
    return 0;
  left--;
  return *in++;
}

static uint64_t take64(void) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = v << 8 | take8();
  return v;
}

/* One answer: the mode byte (low 2 bits: 0, 1 success with the asked size; 2 success with
 * another size; 3 failure), then the value, sized as asked. */
static cublasStatus_t answer(void *buf, size_t asked, size_t *written) {
  uint8_t mode = take8() & 3;
  uint64_t v = take64();
  if (mode == 3)
    return CUBLAS_STATUS_INVALID_VALUE;
  size_t n = asked < sizeof v ? asked : sizeof v;
  memcpy(buf, &v, n); /* little-endian: the low bytes */
  if (written)
    *written = mode == 2 ? asked + 1 + (v & 3) : asked;
  return CUBLAS_STATUS_SUCCESS;
}

static cublasStatus_t desc_get(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, void *buf,
                               size_t size, size_t *written) {
  (void)d, (void)a;
  return answer(buf, size, written);
}

static cublasStatus_t layout_get(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a,
                                 void *buf, size_t size, size_t *written) {
  (void)l, (void)a;
  return answer(buf, size, written);
}

static int half_type(int t) { return t == CUDA_R_16BF || t == CUDA_R_16F; }

static void check_routed(const mt_spec *s, const mt_call *c) {
  if (c->m <= 0 || c->k <= 0 || c->n <= 0 || c->m > UINT32_MAX || c->k > UINT32_MAX ||
      !mt_spec_routes(s, (uint32_t)c->m, (uint32_t)c->k))
    abort();
  if (c->k % 16 || c->batch < 1 || c->order_a || c->order_b || c->order_c || c->order_d)
    abort();
  if (c->lda < c->k || c->ldb < c->k || c->ldc < c->m || c->ldd < c->m || c->lda % 8 || c->ldb % 8)
    abort();
  if (!half_type(c->atype) || c->atype != c->btype || !half_type(c->dtype) || c->ptr_mode != 0 ||
      !c->details_ok)
    abort();
  if (c->pointer_arrays)
    return; /* the operands are device arrays: the grouped engine's to check */
  if (((uintptr_t)c->a | (uintptr_t)c->b | (uintptr_t)c->c | (uintptr_t)c->d) % 16)
    abort();
  /* a strided batch: aligned problems, none writing another's output */
  if (c->batch > 1 &&
      (c->stride_a < 0 || c->stride_b < 0 ||
       (c->stride_a | c->stride_b | c->stride_c | c->stride_d) % 8 || c->stride_d < c->ldd * c->n))
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 4)
    return 0;
  in = data, left = size;
  static int installed;
  if (!installed) {
    mt_fn_cublasLtMatmulDescGetAttribute d = desc_get;
    mt_fn_cublasLtMatrixLayoutGetAttribute l = layout_get;
    atomic_store(&mt_real_ptr[MT_FN_cublasLtMatmulDescGetAttribute], (void *)d);
    atomic_store(&mt_real_ptr[MT_FN_cublasLtMatrixLayoutGetAttribute], (void *)l);
    installed = 1;
  }
  mt_spec s;
  mt_spec_builtin(take8() & 1 ? "nvfp4-row" : "bf16", &s);
  char routes[64];
  snprintf(routes, sizeof routes, "%ux%u,1536x2048,16x16", (unsigned)take8() * 16 + 1,
           (unsigned)take8() * 8);
  mt_spec_add_routes(&s, routes, NULL);
  static uint16_t operands[4][64] __attribute__((aligned(16)));
  uint8_t misalign = take8();
  const char *p[4];
  for (int i = 0; i < 4; i++)
    p[i] = (const char *)operands[i] + 2 * ((misalign >> (2 * i)) & 3);
  float alpha = 1.0f, beta = 0.0f;
  mt_call c;
  mt_norm_cublasLtMatmul(&c, (cublasLtHandle_t)0x10, (cublasLtMatmulDesc_t)0x20, &alpha, p[0],
                         (cublasLtMatrixLayout_t)0x30, p[1], (cublasLtMatrixLayout_t)0x40, &beta,
                         p[2], (cublasLtMatrixLayout_t)0x50, (void *)p[3],
                         (cublasLtMatrixLayout_t)0x60, NULL, NULL, 0, (cudaStream_t)0x70);
  enum mt_role role = mt_route_role(&s, &c);
  if (role == MT_ROLE_FORWARD)
    mt_norm_details(&c);
  enum mt_reason r = mt_route_decide(&s, &c);
  if (r < MT_R_UNROUTED || r >= MT_R_COUNT || !mt_reason_name(r)[0])
    abort();
  if (r == MT_R_ROUTED)
    check_routed(&s, &c);
  return 0;
}
