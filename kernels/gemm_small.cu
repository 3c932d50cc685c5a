// gemm_small.cu — the small-M path of the W4A4 GEMM (mt_gemm_small_tNT) and the weight repacking
// into its fragment order (mt_gemm_pack). y[m][n] = x[m][k] . W[n][k]^T on NVFP4 operands, exactly,
// through BF16 mma.sync with FP32 accumulation.
//
// The weight streams at 4.5 bits per element in fragment order and is decoded in registers; two
// warps own each group of 16 output channels (8 rows each, the MMA's other 8 rows zero) and run
// mma.sync with the tokens as the MMA's N (NT tiles of 8 tokens), so the weight decode is shared
// by every token. k16 steps over K in increasing order into one FP32 accumulator per output, from
// zero, no split-K: the arithmetic of the large path (kernels/gemm_large.cu), which
// scripts/probe_mma.cu showed gives the same bits. The grid starts under programmatic dependent
// launch and fetches weights before griddepcontrol.wait.
//
// Tested by tests/gpu/test_kernels.c: against mt_ref_gemm (spec/nvfp4.c) within the
// FP32-accumulation bound, and bitwise across M, row positions and the two paths.
// kernels/NOTES.md has the measurements.
#include "kernels/gemm_common.cuh"


namespace small {
constexpr int GROUPS = MT_SMALL_GROUPS, THREADS = 32 * MT_SMALL_WARPS, KC = MT_SMALL_KC;
constexpr int CODES = MT_SMALL_CODES, SCALES = MT_SMALL_SCALES, PITCH = MT_SMALL_PITCH;
template <int NT> __host__ __device__ constexpr int stage_bytes() { return MT_SMALL_STAGE_BYTES(NT); }
template <int NT> __host__ __device__ constexpr int stages() { return MT_SMALL_STAGES(NT); }

__device__ static inline void cp16(void *dst, const void *src, bool valid) {
  // src-size 0 writes 16 zero bytes: blocks past k and tokens past m read as zero
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}

// Chunk c of this CTA's weight fragments into stage buffer st.
__device__ static void load_weights(const mt_small_args &a, uint8_t *st, int c) {
  int n = a.e.n, k = a.e.k, t = threadIdx.x;
  size_t sgroups = ((size_t)k + 63) / 64, s8groups = ((size_t)k + 127) / 128;
  const uint8_t *codes = a.frag, *scales = a.frag + MT_FRAG_CODES_BYTES(n, k);
  for (int i = t; i < CODES / 16; i += THREADS) { // 2 KB per group: 4 blocks of 64 columns
    int w = i / (CODES / 16 / GROUPS), off = i % (CODES / 16 / GROUPS), R = blockIdx.x * GROUPS + w;
    size_t S = (size_t)c * (KC / 64) + off / 32;
    bool ok = R < n / 16 && S < sgroups;
    cp16(st + i * 16, codes + ok * (((size_t)R * sgroups + S) * 512 + (off % 32) * 16), ok);
  }
  for (int i = t; i < SCALES / 16; i += THREADS) { // 256 B per group: 2 blocks of 128 columns
    int w = i / (SCALES / 16 / GROUPS), off = i % (SCALES / 16 / GROUPS), R = blockIdx.x * GROUPS + w;
    size_t S8 = (size_t)c * (KC / 128) + off / 8;
    bool ok = R < n / 16 && S8 < s8groups;
    cp16(st + CODES + i * 16, scales + ok * (((size_t)R * s8groups + S8) * 128 + (off % 8) * 16), ok);
  }
}

// Chunk c of the (quantized, dequantized) activations into stage buffer st.
template <int NT> __device__ static void load_acts(const mt_small_args &a, uint8_t *st, int c) {
  uint8_t *act = st + CODES + SCALES;
  for (int i = threadIdx.x; i < NT * 8 * (KC / 8); i += THREADS) { // 16 bytes = 8 columns
    int tok = i / (KC / 8), col = c * KC + (i % (KC / 8)) * 8;
    bool ok = tok < a.e.m && col < a.e.k;
    cp16(act + tok * PITCH + (i % (KC / 8)) * 16, a.xa + ok * ((size_t)tok * a.e.k + col), ok);
  }
}

// Four e2m1 codes of bytes b0, b1 (low nibble first) -> two BF16x2 words, exact. Magnitudes via
// byte permutations of two 8-entry tables (high and low bytes of the BF16 values 0 .. 6), then the
// sign bits moved to bits 15 and 31.
__device__ static inline void decode4(uint32_t cw, int half, uint32_t &lo_pair, uint32_t &hi_pair) {
  uint32_t x = cw >> (16 * half);             // bytes b0 (elements e0,e1) and b1 (e2,e3)
  uint32_t sel = x & 0x7777u;                 // magnitudes of e0..e3 as 4 selectors
  uint32_t hi = __byte_perm(0x3F3F3F00u, 0x40404040u, sel); // high bytes of 0,.5,1,1.5,2,3,4,6
  uint32_t lo = __byte_perm(0xC0800000u, 0xC0804000u, sel); // low bytes
  uint32_t p0 = __byte_perm(lo, hi, 0x5140), p1 = __byte_perm(lo, hi, 0x7362);
  p0 |= ((x << 12) & 0x8000u) | ((x << 24) & 0x80000000u); // signs of e0 (bit 3), e1 (bit 7)
  p1 |= ((x << 4) & 0x8000u) | ((x << 16) & 0x80000000u);  // signs of e2 (bit 11), e3 (bit 15)
  lo_pair = p0;
  hi_pair = p1;
}

__device__ static inline uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  __nv_bfloat162 r = __hmul2(*(__nv_bfloat162 *)&a, *(__nv_bfloat162 *)&b);
  return *(uint32_t *)&r;
}

// E4M3 byte -> its value in both halves of a BF16x2 word (exact: 4 significant bits).
__device__ static inline uint32_t scale_x2(uint32_t e4m3) {
  uint32_t h2;
  uint16_t in = (uint16_t)(e4m3 & 0xFF);
  asm("{\n.reg .b16 t;\nmov.b16 t, %1;\ncvt.rn.f16x2.e4m3x2 %0, t;\n}\n" : "=r"(h2) : "h"(in));
  float f = __half2float(__ushort_as_half((unsigned short)(h2 & 0xFFFF)));
  __nv_bfloat162 b = __floats2bfloat162_rn(f, f);
  return *(uint32_t *)&b;
}

// The A fragment of one k16 step for a warp that owns 8 of the group's 16 rows (half 0: rows
// g, half 1: rows g+8, put in the MMA's rows g; its rows g+8 are zero): columns 2q, 2q+1, 2q+8,
// 2q+9, exact BF16 (e2m1 * e4m3 has at most 6 significant bits). cw holds the step's four code
// bytes in fragment order (gemm_args.h); byte u of sc the row's block scales. Two warps per
// group halve each warp's decode: one warp per scheduler decoding 16 rows issued ~90
// instructions a step and kept the MMA chain waiting.
__device__ static inline void weight_frag(uint32_t cw, uint32_t sc, int u, int half, uint32_t (&ra)[4]) {
  uint32_t x = __byte_perm(cw, 0, half ? 0x4431 : 0x4420); // this half's bytes: columns 2q.., 2q+8..
  uint32_t s = scale_x2(sc >> (8 * u)), p0, p1;
  decode4(x, 0, p0, p1);
  ra[0] = bf16x2_mul(p0, s);
  ra[1] = 0;
  ra[2] = bf16x2_mul(p1, s);
  ra[3] = 0;
}

// One k16 step for every token tile: B fragments (tokens 8nt + g, columns 2q.. and 2q+8..) from
// the staged activations, accumulated in K order into d.
template <int NT>
__device__ static inline void mma_step(float (&d)[NT][4], const uint32_t (&ra)[4], const uint8_t *act, int s, int g,
                                       int q) {
#pragma unroll
  for (int nt = 0; nt < NT; nt++) {
    const uint8_t *b = act + (nt * 8 + g) * PITCH + s * 32 + q * 4;
    uint32_t b0 = *(const uint32_t *)b, b1 = *(const uint32_t *)(b + 16);
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[nt][0]), "+f"(d[nt][1]), "+f"(d[nt][2]), "+f"(d[nt][3])
        : "r"(ra[0]), "r"(ra[1]), "r"(ra[2]), "r"(ra[3]), "r"(b0), "r"(b1));
  }
}

template <int NT> __device__ static void run(const mt_small_args &a) {
  extern __shared__ __align__(16) uint8_t smem[];
  int t = threadIdx.x, w = t / 32, lane = t % 32, g = lane / 4, q = lane % 4;
  int group = w / 2, half = w % 2;
  int ksteps = a.e.k / 16, chunks = (a.e.k + KC - 1) / KC;
  bool active = blockIdx.x * GROUPS + group < a.e.n / 16;
  float d[NT][4];
#pragma unroll
  for (int i = 0; i < NT; i++) d[i][0] = d[i][1] = d[i][2] = d[i][3] = 0.0f;

  // The weights do not depend on the kernel before this one (the activation quantization, which
  // lets this grid start early): their first chunks are requested before waiting for it.
  constexpr int STAGES = stages<NT>();
  for (int c = 0; c < STAGES - 1 && c < chunks; c++)
    load_weights(a, smem + c * stage_bytes<NT>(), c);
  grid_dependency_wait();
  for (int c = 0; c < STAGES - 1; c++) {
    if (c < chunks) load_acts<NT>(a, smem + c * stage_bytes<NT>(), c);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  for (int c = 0; c < chunks; c++) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2) : "memory");
    __syncthreads();
    int next = c + STAGES - 1;
    if (next < chunks) {
      load_weights(a, smem + (next % STAGES) * stage_bytes<NT>(), next);
      load_acts<NT>(a, smem + (next % STAGES) * stage_bytes<NT>(), next);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    if (!active) continue;
    const uint8_t *st = smem + (c % STAGES) * stage_bytes<NT>();
    const uint8_t *codes = st + group * (CODES / GROUPS), *scales = st + CODES + group * (SCALES / GROUPS);
    const uint8_t *act = st + CODES + SCALES;
    int steps = min(KC / 16, ksteps - c * (KC / 16));
    // 16-byte loads: codes for 4 steps (512 contiguous bytes a warp), scales for 8 steps (rows g
    // and g+8; the four lanes of a quad read the same bytes). A full group of 8 steps decodes all
    // its fragments first, with no branch in between, so the decode of one step overlaps the
    // previous steps' MMAs instead of waiting behind them (one warp per scheduler has no other
    // work to hide latency with).
    for (int s8 = 0; s8 < steps; s8 += 8) {
      uint4 sc4 = *(const uint4 *)(scales + (s8 / 8) * 128 + g * 16);
      uint32_t sc_lo = half ? sc4.z : sc4.x, sc_hi = half ? sc4.w : sc4.y; // steps 0-3, 4-7
      if (s8 + 8 <= steps) {
        uint4 c0 = *(const uint4 *)(codes + (s8 / 4) * 512 + lane * 16);
        uint4 c1 = *(const uint4 *)(codes + (s8 / 4 + 1) * 512 + lane * 16);
        uint32_t cw[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
        uint32_t ra[8][4];
#pragma unroll
        for (int u = 0; u < 8; u++)
          weight_frag(cw[u], u < 4 ? sc_lo : sc_hi, u % 4, half, ra[u]);
#pragma unroll
        for (int u = 0; u < 8; u++)
          mma_step<NT>(d, ra[u], act, s8 + u, g, q);
      } else {
        for (int s = s8; s < steps; s++) { // the last steps of k, when k % 128 != 0
          uint32_t cw = ((const uint32_t *)(codes + (s / 4) * 512 + lane * 16))[s % 4];
          int u = s - s8;
          uint32_t ra[4];
          weight_frag(cw, u < 4 ? sc_lo : sc_hi, u % 4, half, ra);
          mma_step<NT>(d, ra, act, s, g, q);
        }
      }
    }
  }
  if (!active) return;
  int ch = (blockIdx.x * GROUPS + group) * 16 + 8 * half + g;
  float inv_w = inv_row(a.e.sw, a.e.sw_row, ch);
#pragma unroll
  for (int nt = 0; nt < NT; nt++)
#pragma unroll
    for (int j = 0; j < 2; j++) {
      int tok = nt * 8 + 2 * q + j;
      if (tok >= a.e.m) continue;
      float inv_a = inv_row(a.e.sa, a.e.sa_row, tok);
      store_elem(a.e.y, tok * a.e.ldy + ch, a.e.ytype, epilogue(a.e, d[nt][j], inv_a, inv_w, tok, ch));
    }
}
} // namespace small

#define MT_SMALL(NT)                                                                               \
  extern "C" __global__ void __launch_bounds__(32 * MT_SMALL_WARPS, 1) mt_gemm_small_t##NT(const __grid_constant__ mt_small_args a) { \
    small::run<NT>(a);                                                                             \
  }
MT_SMALL(1)
MT_SMALL(2)
MT_SMALL(4)
MT_SMALL(8)


// weight repacking into fragment order (gemm_args.h); one thread per 16 output bytes

extern "C" __global__ void mt_gemm_pack(const __grid_constant__ mt_pack_args a) {
  if (a.only_if && *a.only_if == 0)
    return;
  size_t sgroups = ((size_t)a.k + 63) / 64, s8groups = ((size_t)a.k + 127) / 128, kb = (size_t)a.k / 16;
  size_t ncodes = (size_t)a.n / 16 * sgroups * 32, nscales = (size_t)a.n / 16 * s8groups * 8;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  uint8_t out[16];
  if (i < ncodes) { // (R, S, lane)
    size_t R = i / (sgroups * 32), S = (i / 32) % sgroups;
    int lane = i % 32, g = lane / 4, q = lane % 4;
    const uint8_t *r0 = a.codes + (16 * R + g) * (size_t)(a.k / 2), *r1 = r0 + 8 * (size_t)(a.k / 2);
    for (int s = 0; s < 4; s++) {
      size_t b = 4 * S + s;
      bool ok = b < kb;
      out[4 * s + 0] = ok ? r0[b * 8 + q] : 0;
      out[4 * s + 1] = ok ? r1[b * 8 + q] : 0;
      out[4 * s + 2] = ok ? r0[b * 8 + q + 4] : 0;
      out[4 * s + 3] = ok ? r1[b * 8 + q + 4] : 0;
    }
    *(uint4 *)(a.frag + i * 16) = *(uint4 *)out;
  } else if (i < ncodes + nscales) { // (R, S8, g)
    size_t j = i - ncodes, R = j / (s8groups * 8), S8 = (j / 8) % s8groups;
    int g = j % 8;
    const uint8_t *r0 = a.scales + (16 * R + g) * kb, *r1 = r0 + 8 * kb;
    for (int s = 0; s < 8; s++) {
      size_t b = 8 * S8 + s;
      out[s] = b < kb ? r0[b] : 0;
      out[8 + s] = b < kb ? r1[b] : 0;
    }
    *(uint4 *)(a.frag + MT_FRAG_CODES_BYTES(a.n, a.k) + j * 16) = *(uint4 *)out;
  }
}

