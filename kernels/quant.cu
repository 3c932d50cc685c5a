/* quant.cu — NVFP4 quantization kernels: BF16/FP16 rows (row stride ldx) to the exact BF16
 * dequantized matrix xhat = e2m1(code) * s_b (outer scale not applied: what the tensor cores
 * read), and optionally the packed E2M1 codes and E4M3 block scales, with the FP32 outer scale S
 * per row or per tensor; 1x16 blocks, or 16x16 tiles for weights. Or (the record mode, for the
 * large-M ra kernel, MT_LARGE_VARIANT=ra) the same codes and scales as the 5-bit records of
 * gemm_args.h (MT_ACT_REC_BYTES: ~0.63 bytes an element written instead of xhat's 2), with S.
 *
 * Bit-identical to mt_ref_quantize (spec/nvfp4.c): the same IEEE FP32 operations in the same
 * order (TE's), each rounded on its own (__fmul_rn / __frcp_rn / __fdiv_rn: no FMA contraction,
 * correctly rounded division, denormals kept). tests/gpu/test_kernels.c checks codes, scales, S,
 * xhat and the records bit for bit against the reference on random and adversarial inputs.
 *
 * Layout of the work: one thread owns NB blocks of 16 elements of one row (two 16-byte loads and
 * stores per block, coalesced across the row's threads); a CTA holds TY rows of TX threads. The
 * per-row amax is a max over the FP32 bits of |x| (exact and order-independent; NaN's bits exceed
 * Inf's, so NaN wins as in the reference): butterfly shuffles, then shared memory across warps.
 */
#include <stdint.h>

#include "kernels/gemm_args.h"
#include "kernels/quant.cuh"
#include "kernels/quant.h"

using namespace mt_q;

namespace {

constexpr int kMaxThreads = 512; /* per CTA; the launcher never asks for more */

/* Let a kernel launched after this one with programmatic stream serialization (a GEMM that streams
 * its weights before it waits for the activations) start now; its griddepcontrol.wait still waits
 * for this grid to finish. No effect on launches without that attribute. */
__device__ __forceinline__ void allow_dependents() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

/* The record of 8 rows x 32 columns (gemm_args.h) that row r's blocks b (even) and b + 1 belong
 * to, in the ra layout: bands of 128 rows, the band's records by column pair, then row group. */
__device__ __forceinline__ uint8_t *record_of(const mt_quant_params &p, int r, int b, int pairs) {
  return p.records + (((size_t)(r / MT_ACT_BAND) * pairs + b / 2) * (MT_ACT_BAND / 8) + (r / 8) % (MT_ACT_BAND / 8)) *
                         MT_FRAG_REC;
}

/* Row r's part of one record from its blocks b (cd0, scale code sb0) and b + 1 (cd1, sb1): lane
 * 4g + q's code word holds code bytes q and q + 4 of each block (gemm_args.h), the scale word the
 * two scales as BF16 (exact: an E4M3 value has 4 significant bits). 16 + 4 bytes. */
__device__ __forceinline__ void store_record(uint8_t *rec, int g, const uint32_t (&cd0)[2], const uint32_t (&cd1)[2],
                                             uint32_t sb0, uint32_t sb1) {
  const uint32_t a01 = __byte_perm(cd0[0], cd0[1], 0x5140), a23 = __byte_perm(cd0[0], cd0[1], 0x7362);
  const uint32_t b01 = __byte_perm(cd1[0], cd1[1], 0x5140), b23 = __byte_perm(cd1[0], cd1[1], 0x7362);
  *(uint4 *)(rec + 16 * g) = make_uint4(__byte_perm(a01, b01, 0x5410), __byte_perm(a01, b01, 0x7632),
                                        __byte_perm(a23, b23, 0x5410), __byte_perm(a23, b23, 0x7632));
  *(uint32_t *)(rec + 128 + 4 * g) =
      __float_as_uint(e4m3_to_float(sb0)) >> 16 | (__float_as_uint(e4m3_to_float(sb1)) & 0xffff0000u);
}

/* Rows r = blockIdx.x * TY + ty; thread tx owns blocks blockIdx.y * TX * NB + tx + j * TX. ROW: S
 * from the row's amax (the launcher makes one CTA span the whole row); else S from *p.amax. TILE:
 * 16x16 tiles, TY == 16, the tile's amax through shared memory. REC (NB even): the output is
 * p.records instead; thread tx owns the pairs of blocks blockIdx.y * TX * NB / 2 + tx + i * TX
 * (blocks j = 2i and 2i + 1 of its NB), over the rows and pairs the layout pads to (zeros: rows
 * past p.rows load as zero, so their S is 1 and their codes and scales 0; S is not written). */
template <bool FP16, int NB, bool ROW, bool TILE, bool REC = false>
__device__ __forceinline__ void quantize(const mt_quant_params &p) {
  if (p.only_if && *p.only_if == 0) /* the same for the whole grid: no barrier is left waiting */
    return;
  const int tx = threadIdx.x, ty = threadIdx.y, TX = blockDim.x;
  const int nblk = p.cols >> 4;
  const int r = blockIdx.x * blockDim.y + ty;
  const bool row_ok = r < p.rows;
  const int b0 = blockIdx.y * (TX * NB) + tx;
  auto block_of = [&](int j) { return REC ? 2 * (blockIdx.y * (TX * NB / 2) + tx + (j >> 1) * TX) + (j & 1) : b0 + j * TX; };
  const char *xrow = (const char *)p.x + (size_t)(row_ok ? r : 0) * (size_t)p.ldx * 2;

  uint32_t w[NB][8], amax_b[NB];
#pragma unroll
  for (int j = 0; j < NB; j++) {
    const int b = block_of(j);
    uint4 v0 = make_uint4(0, 0, 0, 0), v1 = v0;
    if (row_ok && b < nblk) {
      const uint4 *src = (const uint4 *)(xrow + (size_t)b * 32);
      v0 = src[0];
      v1 = src[1];
    }
    w[j][0] = v0.x, w[j][1] = v0.y, w[j][2] = v0.z, w[j][3] = v0.w;
    w[j][4] = v1.x, w[j][5] = v1.y, w[j][6] = v1.z, w[j][7] = v1.w;
    amax_b[j] = block_amax_bits<FP16>(w[j]);
  }

  float S;
  if (ROW) {
    uint32_t m = 0;
#pragma unroll
    for (int j = 0; j < NB; j++)
      m = max(m, amax_b[j]);
    for (int o = min(TX, 32) >> 1; o > 0; o >>= 1)
      m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (TX > 32) { /* TX is then a multiple of 32: every warp lies within one row */
      __shared__ uint32_t warp_max[kMaxThreads / 32];
      if ((tx & 31) == 0)
        warp_max[(ty * TX + tx) >> 5] = m;
      __syncthreads();
      const int lane = tx & 31, nwarps = TX >> 5; /* at most 16: one read per lane, then shuffles */
      m = lane < nwarps ? warp_max[((ty * TX) >> 5) + lane] : 0u;
      for (int o = 16; o > 0; o >>= 1)
        m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
    }
    S = outer_scale(__uint_as_float(m));
    if (tx == 0 && row_ok)
      p.outer[r] = S;
  } else {
    S = outer_scale(__uint_as_float(*p.amax));
    if (blockIdx.x == 0 && blockIdx.y == 0 && tx == 0 && ty == 0)
      p.outer[0] = S;
  }

  if (TILE) { /* NB == 1, TY == 16: the 16 rows of a CTA are one row of tiles */
    __shared__ uint32_t tile_max[kMaxThreads / 16];
    if (ty == 0)
      tile_max[tx] = 0;
    __syncthreads();
    atomicMax(&tile_max[tx], amax_b[0]);
    __syncthreads();
    amax_b[0] = tile_max[tx];
  }

  if (REC) {
    const int pairs = (int)MT_ACT_PAIRS(p.cols);
    if (r >= (p.rows + MT_ACT_BAND - 1) / MT_ACT_BAND * MT_ACT_BAND)
      return;
    const bool bad = !(S == S);
    const float s_over_6 = S_over_6(S), inv_s = inv_S(S);
#pragma unroll
    for (int j = 0; j < NB; j += 2) {
      const int b = block_of(j);
      if (b >= 2 * pairs)
        break;
      uint32_t xh[8], cd0[2] = {0, 0}, cd1[2] = {0, 0}, sb0 = 0, sb1 = 0;
      if (!bad) {
        sb0 = block<FP16, true>(w[j], amax_b[j], s_over_6, inv_s, xh, cd0);
        sb1 = block<FP16, true>(w[j + 1], amax_b[j + 1], s_over_6, inv_s, xh, cd1);
      }
      store_record(record_of(p, r, b, pairs), r % 8, cd0, cd1, sb0, sb1);
    }
    return;
  }
  if (!row_ok)
    return;
  /* A domain holding NaN or Inf: codes, scales and xhat all 0; its NaN S makes the GEMM's
   * outputs NaN. */
  const bool domain_bad = !(S == S);
  const float s_over_6 = S_over_6(S), inv_s = inv_S(S);
  const size_t row_base = (size_t)r * (size_t)p.cols;
#pragma unroll
  for (int j = 0; j < NB; j++) {
    const int b = block_of(j);
    if (b >= nblk)
      break;
    uint32_t xh[8] = {0, 0, 0, 0, 0, 0, 0, 0}, cd[2] = {0, 0}, sb_code = 0;
    if (!domain_bad) {
      if (p.codes)
        sb_code = block<FP16, true>(w[j], amax_b[j], s_over_6, inv_s, xh, cd);
      else
        sb_code = block<FP16, false>(w[j], amax_b[j], s_over_6, inv_s, xh, cd);
    }
    uint4 *dst = (uint4 *)(p.xhat + row_base + (size_t)b * 16);
    dst[0] = make_uint4(xh[0], xh[1], xh[2], xh[3]);
    dst[1] = make_uint4(xh[4], xh[5], xh[6], xh[7]);
    if (p.codes)
      *(uint2 *)(p.codes + row_base / 2 + (size_t)b * 8) = make_uint2(cd[0], cd[1]);
    if (p.scales)
      p.scales[row_base / 16 + b] = (uint8_t)sb_code;
  }
}

/* max |x| over the whole matrix into *p.amax (FP32 bits; the launcher zeroes it first): one warp
 * per row at a time, four 16-byte loads in flight per lane, one atomicMax per warp. */
template <bool FP16> __device__ __forceinline__ void amax_pass(const mt_quant_params &p) {
  if (p.only_if && *p.only_if == 0)
    return;
  const int lane = threadIdx.x & 31;
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
  const int nwarps = (gridDim.x * blockDim.x) >> 5;
  const int chunks = p.cols >> 3;
  uint32_t m = 0;
  for (int r = warp; r < p.rows; r += nwarps) {
    const uint4 *src = (const uint4 *)((const char *)p.x + (size_t)r * (size_t)p.ldx * 2);
    for (int c = lane; c < chunks; c += 4 * 32) {
      uint4 v[4];
#pragma unroll
      for (int u = 0; u < 4; u++)
        v[u] = (c + u * 32 < chunks) ? src[c + u * 32] : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int u = 0; u < 4; u++) {
        m = __vmaxu2(m, v[u].x & 0x7fff7fffu);
        m = __vmaxu2(m, v[u].y & 0x7fff7fffu);
        m = __vmaxu2(m, v[u].z & 0x7fff7fffu);
        m = __vmaxu2(m, v[u].w & 0x7fff7fffu);
      }
    }
  }
  uint32_t bits = __float_as_uint(abs_bits_to_float<FP16>(max(m & 0xffffu, m >> 16)));
  bits = __reduce_max_sync(0xffffffffu, bits);
  if (lane == 0 && bits != 0)
    atomicMax(p.amax, bits);
}

} // namespace

#define MT_QUANT_ROW(type, fp16, nb)                                                               \
  extern "C" __global__ void __launch_bounds__(kMaxThreads)                                        \
      mt_quant_row_##type##_nb##nb(const mt_quant_params p) {                                      \
    allow_dependents();                                                                            \
    quantize<fp16, nb, true, false>(p);                                                            \
  }
MT_QUANT_ROW(bf16, false, 1)
MT_QUANT_ROW(bf16, false, 2)
MT_QUANT_ROW(bf16, false, 4)
MT_QUANT_ROW(bf16, false, 8)
MT_QUANT_ROW(fp16, true, 1)
MT_QUANT_ROW(fp16, true, 2)
MT_QUANT_ROW(fp16, true, 4)
MT_QUANT_ROW(fp16, true, 8)

#define MT_QUANT_TENSOR(type, fp16)                                                                \
  extern "C" __global__ void __launch_bounds__(kMaxThreads)                                        \
      mt_quant_tensor_##type(const mt_quant_params p) {                                            \
    allow_dependents();                                                                            \
    quantize<fp16, 1, false, false>(p);                                                            \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(kMaxThreads)                                        \
      mt_quant_tile_##type(const mt_quant_params p) {                                              \
    allow_dependents();                                                                            \
    quantize<fp16, 1, false, true>(p);                                                             \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(256) mt_quant_amax_##type(const mt_quant_params p) { \
    amax_pass<fp16>(p);                                                                            \
  }
MT_QUANT_TENSOR(bf16, false)
MT_QUANT_TENSOR(fp16, true)

/* The record mode (mt_quant_params.records, for MT_LARGE_VARIANT=ra): per-row S with 2, 4 or 8
 * blocks a thread (pairs of adjacent blocks), per-tensor S with 2. */
#define MT_QUANT_REC(type, fp16)                                                                   \
  extern "C" __global__ void __launch_bounds__(kMaxThreads)                                        \
      mt_quant_row_rec_##type##_nb2(const mt_quant_params p) {                                     \
    allow_dependents();                                                                            \
    quantize<fp16, 2, true, false, true>(p);                                                       \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(kMaxThreads)                                        \
      mt_quant_row_rec_##type##_nb4(const mt_quant_params p) {                                     \
    allow_dependents();                                                                            \
    quantize<fp16, 4, true, false, true>(p);                                                       \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(kMaxThreads)                                        \
      mt_quant_row_rec_##type##_nb8(const mt_quant_params p) {                                     \
    allow_dependents();                                                                            \
    quantize<fp16, 8, true, false, true>(p);                                                       \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(kMaxThreads)                                        \
      mt_quant_tensor_rec_##type(const mt_quant_params p) {                                        \
    allow_dependents();                                                                            \
    quantize<fp16, 2, false, false, true>(p);                                                      \
  }
MT_QUANT_REC(bf16, false)
MT_QUANT_REC(fp16, true)
