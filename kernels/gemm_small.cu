// gemm_small.cu — the few-token kernel of the W4A4 GEMM (mt_gemm_small_q4, up to 4 tokens, which
// also quantizes the activations: AUTO's choice where that redundant work is small, kernels/gemm.c)
// and the weight repacking into its fragment order (mt_gemm_pack). y[m][n] = x[m][k] . W[n][k]^T on
// NVFP4 operands, exactly, through BF16 mma.sync with FP32 accumulation.
//
// One CTA of two warps per 16 output channels (n / 16 CTAs: 96 for gate_up, so most SMs share the
// work); each warp owns 8 channels. The MMA's M is the tokens (A: the activations, quantized by the
// CTA into shared memory, rows past m zero) and its N the warp's 8 channels (B: the weight,
// streamed at 5 bits per element in fragment order and decoded in registers, 4 elements a lane a
// step, no zero operand). k16 steps over K in increasing order into one FP32 accumulator per
// output, from zero, no split-K: the arithmetic of the large path (kernels/gemm_large.cu), which
// lab/probe_mma.cu showed gives the same bits (within a step every product is exact and the block
// sum is exact in FP32, so which operand is A does not matter). The kernel runs in plain stream
// order (nothing before it to overlap) and quantizes while its first weights arrive. The epilogue's
// S_a, S_w and bias are loaded before the K loop, in registers when it ends (epi_in).
//
// Tested by tests/gpu/test_kernels.c: against mt_ref_gemm (ref/nvfp4.c) within the
// FP32-accumulation bound, bitwise across M and row positions, and bitwise against the large path
// (gemm_paths_agree).
#include "kernels/gemm_common.cuh"
#include "kernels/quant.cuh"

namespace small {
constexpr int WARPS = MT_SMALL_WARPS, THREADS = 32 * WARPS, KC = MT_SMALL_KC,
              PITCH = MT_SMALL_PITCH;
constexpr int REC = MT_FRAG_REC, WCHUNK = (KC / 32) * REC; // per warp
constexpr int WSTAGE = MT_SMALL_WSTAGE; // a stage's place in the ring: its records, then slack

__device__ static inline void cp16(void *dst, const void *src, bool valid) {
  // src-size 0 writes 16 zero bytes: records past k read as zero
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}

// This thread's share of every chunk's weight records (each warp's 8 rows: KC / 32 contiguous
// records of 160 bytes, the chunks of a warp contiguous too): a few 16-byte pieces, their sources
// for chunk 0 and their places in a stage, computed once so that a chunk's requests cost a few
// instructions.
constexpr int WPIECES = WARPS * WCHUNK / 16, WPER_THREAD = (WPIECES + THREADS - 1) / THREADS;
struct wloader {
  const uint8_t *src[WPER_THREAD];
  int rec[WPER_THREAD]; // record index within the chunk
  int pairs;            // records per warp over all of k
};

__device__ static wloader make_wloader(const mt_small_args &a) {
  wloader l;
  l.pairs = (a.e.k + 31) / 32;
#pragma unroll
  for (int j = 0; j < WPER_THREAD; j++) {
    int i = min((int)threadIdx.x + j * THREADS, WPIECES - 1), w = i / (WCHUNK / 16),
        off = i % (WCHUNK / 16);
    l.src[j] = a.frag + (size_t)(blockIdx.x * WARPS + w) * l.pairs * REC + off * 16;
    l.rec[j] = off / (REC / 16);
  }
  return l;
}

// Chunk c of this CTA's weight records into stage buffer st; records past k read as zero.
__device__ static inline void load_weights(const mt_small_args &a, const wloader &l, uint8_t *st,
                                           int c) {
#pragma unroll
  for (int j = 0; j < WPER_THREAD; j++) {
    int i = threadIdx.x + j * THREADS;
    if (i < WPIECES) {
      bool ok = c * (KC / 32) + l.rec[j] < l.pairs;
      cp16(st + i * 16, ok ? l.src[j] + (size_t)c * WCHUNK : a.frag, ok);
    }
  }
}

// Step H (0 or 1) of a record's code word w and scale word sc.
template <int H>
__device__ static inline void step_frag(uint32_t w, uint32_t sc, uint32_t &b0, uint32_t &b1) {
  uint32_t s2 = __byte_perm(sc, 0, H ? 0x3232 : 0x1010);
  weight_frag(H ? w >> 16 : w, s2, b0, b1);
}

// The A fragments of one k16 step for every tile of 16 tokens: tokens 16tt + g and + 8, columns
// 2q.. and 2q+8.., from the staged activations (r: token g's row at the step's column 2q, pitch
// bytes a row). With ROWS == 8 the tokens g + 8 are zero registers.
template <int ROWS> struct afrag { uint32_t v[(ROWS + 15) / 16][4]; };

template <int ROWS> __device__ static inline afrag<ROWS> load_a(const uint8_t *r, int pitch) {
  afrag<ROWS> a;
#pragma unroll
  for (int tt = 0; tt < (ROWS + 15) / 16; tt++) {
    const uint8_t *t = r + tt * 16 * pitch;
    a.v[tt][0] = *(const uint32_t *)t;
    a.v[tt][2] = *(const uint32_t *)(t + 16);
    a.v[tt][1] = ROWS >= 16 ? *(const uint32_t *)(t + 8 * pitch) : 0u;
    a.v[tt][3] = ROWS >= 16 ? *(const uint32_t *)(t + 8 * pitch + 16) : 0u;
  }
  return a;
}

// One k16 step: accumulated in K order into d.
template <int ROWS>
__device__ static inline void mma_step(float (&d)[(ROWS + 15) / 16][4], uint32_t b0, uint32_t b1,
                                       const afrag<ROWS> &a) {
#pragma unroll
  for (int tt = 0; tt < (ROWS + 15) / 16; tt++)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[tt][0]), "+f"(d[tt][1]), "+f"(d[tt][2]), "+f"(d[tt][3])
        : "r"(a.v[tt][0]), "r"(a.v[tt][1]), "r"(a.v[tt][2]), "r"(a.v[tt][3]), "r"(b0), "r"(b1));
}

// Steps 0 .. n - 1 of one chunk: records of two steps (gemm_args.h), the lane's 4-byte code word
// and its row's 4-byte scale word in each (the four lanes of a quad read the same scale word; 32
// lanes read 128 contiguous code bytes: no bank conflict). Software pipelined in a loop that is
// not unrolled: each MMA is followed, in program order, by the decode of the next step, and the
// next record's words and A fragments are loaded a record ahead, so decode and loads issue while
// the MMA chain waits (one warp per scheduler has nothing else to hide them with). Unrolled, ptxas
// sometimes hoisted all eight decodes of a group above its eight MMAs, which then ran back to back
// on the chain: about twice the time per step.
template <int ROWS>
__device__ static inline void chunk_steps(float (&d)[(ROWS + 15) / 16][4], const uint8_t *rec,
                                          const uint8_t *arow, int pitch, int n, int lane) {
  const uint8_t *cp = rec + lane * 4, *sp = rec + 128 + (lane / 4) * 4, *ar = arow;
  uint32_t w = *(const uint32_t *)cp, sc = *(const uint32_t *)sp, b0, b1;
  afrag<ROWS> a0 = load_a<ROWS>(ar, pitch), a1 = load_a<ROWS>(ar + 32, pitch);
  step_frag<0>(w, sc, b0, b1);
#pragma unroll 1
  for (int p = 0; p < n / 2; p++) {
    // the next record's words and A: past the chunk's last step these read up to 160 bytes past
    // it (the other warp's records, the stage's slack, the next row of activations, or
    // MT_SMALL_SLACK), unused
    cp += REC, sp += REC;
    uint32_t wn = *(const uint32_t *)cp, scn = *(const uint32_t *)sp, c0, c1;
    afrag<ROWS> an0 = load_a<ROWS>(ar + 64, pitch), an1 = load_a<ROWS>(ar + 96, pitch);
    mma_step<ROWS>(d, b0, b1, a0);
    step_frag<1>(w, sc, c0, c1);
    mma_step<ROWS>(d, c0, c1, a1);
    w = wn, sc = scn;
    step_frag<0>(w, sc, b0, b1);
    a0 = an0, a1 = an1;
    ar += 64;
  }
  if (n % 2) // the last step of k, when k % 32 != 0
    mma_step<ROWS>(d, b0, b1, a0);
}

// What the epilogue reads besides the accumulators (C aside), loaded before the step loop (S_w and
// the bias of the fused kernel before its quantization) so that the loads' latency hides under it
// instead of following it (three dependent global loads, one after another, were most of the
// epilogue's time at gate_up M = 1: lab/NOTES.md, "Small-M kernels"): the raw S_w of the lane's
// channels ch and ch + 1, the raw S_a of its tokens 16 tt + g and + 8 (1 for tokens past m: never
// read), and the bits of its channels' bias (0 without bias: never read). Raw values, converted
// after the loop: the reciprocals and the epilogue's arithmetic stay where and as they were, and a
// 16-bit bias's conversion does not make the warp wait for its load before the loop.
template <int TT> struct epi_in {
  float sw[2], sa[TT][2];
  uint32_t bias[2];
};

// S_w (the weight's) and the bias bits (the caller's) of channels ch and ch + 1. Neither is written
// by the kernel before this one, but both are loaded after griddepcontrol.wait, for caution: what
// follows leaves plenty of time for them.
template <int TT>
__device__ static inline void load_epi_w(const mt_epilogue_args &e, int ch, epi_in<TT> &in) {
  bool half = e.biastype == DT_BF16 || e.biastype == DT_FP16; // load_elem's types
#pragma unroll
  for (int j = 0; j < 2; j++) {
    in.sw[j] = e.sw[e.sw_row ? ch + j : 0];
    in.bias[j] = !e.bias ? 0u
                 : half  ? ((const uint16_t *)e.bias)[ch + j]
                         : ((const uint32_t *)e.bias)[ch + j];
  }
}

// S_a of the lane's tokens from sa (one per row when per_row): the quantization kernel's (global
// memory: only after griddepcontrol.wait) or the fused kernel's own (shared memory: after the
// __syncthreads that follows its computation).
template <int TT>
__device__ static inline void load_epi_a(const mt_epilogue_args &e, int g, const float *sa,
                                         int per_row, epi_in<TT> &in) {
#pragma unroll
  for (int tt = 0; tt < TT; tt++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      int tok = tt * 16 + g + 8 * h;
      in.sa[tt][h] = tok >= e.m ? 1.0f : sa[per_row ? tok : 0];
    }
}

// A bias element's bits as load_elem converts them.
__device__ static inline float bias_value(uint32_t bits, int type) {
  if (type == DT_BF16)
    return __bfloat162float(__ushort_as_bfloat16((unsigned short)bits));
  if (type == DT_FP16)
    return __half2float(__ushort_as_half((unsigned short)bits));
  return __uint_as_float(bits);
}

// Output (tok, j) from its accumulator: epilogue() (gemm_common.cuh) without the bias, then the
// preloaded bias, which is the add epilogue() does last: the same operations in the same order, so
// the same bits as the large path. inv_a and inv_w are __frcp_rn of the raw S, as inv_row and
// mt_q::inv_S compute them.
__device__ static inline float epi_out(const mt_epilogue_args &e, float acc, float inv_a,
                                       float inv_w, uint32_t bias, int tok, int j) {
  mt_epilogue_args nb = e;
  nb.bias = nullptr;
  float t = epilogue(nb, acc, inv_a, inv_w, tok, j);
  return e.bias ? __fadd_rn(t, bias_value(bias, e.biastype)) : t;
}

// The warp's accumulators to y: d[tt] holds, in lane (g, q), tokens 16 tt + g (d[tt][0..1]) and
// 16 tt + g + 8 (d[tt][2..3]) of channels ch and ch + 1.
template <int TT>
__device__ static inline void store_acc(const mt_epilogue_args &e, const float (&d)[TT][4],
                                        const epi_in<TT> &in, int ch, int g) {
  float inv_w[2] = {__frcp_rn(in.sw[0]), __frcp_rn(in.sw[1])};
#pragma unroll
  for (int tt = 0; tt < TT; tt++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      int tok = tt * 16 + g + 8 * h;
      if (tok >= e.m)
        continue;
      float inv_a = __frcp_rn(in.sa[tt][h]);
#pragma unroll
      for (int j = 0; j < 2; j++)
        store_elem(e.y, tok * e.ldy + ch + j, e.ytype,
                   epi_out(e, d[tt][2 * h + j], inv_a, inv_w[j], in.bias[j], tok, ch + j));
    }
}

// The fused variant for m <= MT_SMALL_FUSE_M: the CTA quantizes the raw activations itself (no
// separate launch, which at M = 1 took most of the budget: lab/NOTES.md, "Small-M kernels") with
// the device steps of kernels/quant.cuh, bit for bit as mt_quantize: the domain's amax as the
// maximum of FP32 bits (exact, any order), S = outer_scale(amax), each block by mt_q::block, a
// NaN/Inf domain giving zero xhat and a NaN S. The whole of xhat (m rows of k) stays in shared
// memory for the MMAs; only the weights stream through the ring. Each CTA redoes the m x k
// quantization: cheap at m <= 4.
template <bool FP16>
__device__ static inline uint32_t x_block(const mt_small_args &a, int r, int b, uint32_t (&v)[8]) {
  const uint4 *src =
      (const uint4 *)((const char *)a.x + ((size_t)r * (size_t)a.ldx + (size_t)b * 16) * 2);
  uint4 v0 = src[0], v1 = src[1];
  v[0] = v0.x, v[1] = v0.y, v[2] = v0.z, v[3] = v0.w, v[4] = v1.x, v[5] = v1.y, v[6] = v1.z,
  v[7] = v1.w;
  return mt_q::block_amax_bits<FP16>(v);
}

template <bool FP16> __device__ static void fused_amax(const mt_small_args &a, uint32_t *amax) {
  int nblk = a.e.k / 16;
  for (int i = threadIdx.x; i < a.e.m * nblk; i += THREADS) {
    uint32_t v[8];
    int r = i / nblk;
    atomicMax(&amax[a.e.sa_row ? r : 0], x_block<FP16>(a, r, i % nblk, v));
  }
}

template <bool FP16>
__device__ static void fused_quantize(const mt_small_args &a, const float *S, uint8_t *xs, int xp) {
  int nblk = a.e.k / 16;
  for (int i = threadIdx.x; i < a.e.m * nblk; i += THREADS) {
    uint32_t v[8], xh[8] = {0, 0, 0, 0, 0, 0, 0, 0}, cd[2];
    int r = i / nblk, b = i % nblk;
    uint32_t amax_b = x_block<FP16>(a, r, b, v);
    float Sr = S[r];
    if (Sr == Sr)
      mt_q::block<FP16, false>(v, amax_b, mt_q::S_over_6(Sr), mt_q::inv_S(Sr), xh, cd);
    uint4 *dst = (uint4 *)(xs + r * xp + b * 32);
    dst[0] = make_uint4(xh[0], xh[1], xh[2], xh[3]);
    dst[1] = make_uint4(xh[4], xh[5], xh[6], xh[7]);
  }
}

__device__ static void run_fused(const mt_small_args &a) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int STAGES = MT_SMALL_FUSE_STAGES;
  uint8_t *zero = smem + STAGES * WSTAGE, *xs = zero + MT_SMALL_FUSE_META;
  float *S = (float *)(zero + PITCH);
  uint32_t *amax = (uint32_t *)(S + 8);
  int t = threadIdx.x, w = t / 32, lane = t % 32, g = lane / 4, q = lane % 4;
  int ksteps = a.e.k / 16, chunks = (a.e.k + KC - 1) / KC, xp = 2 * a.e.k + 16;
  float d[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
  const wloader wl = make_wloader(a);

  // The weights first (they do not depend on the kernel before this one), one group per chunk.
  for (int c = 0; c < STAGES - 1; c++) {
    if (c < chunks)
      load_weights(a, wl, smem + c * WSTAGE, c);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  for (int i = t; i < PITCH / 16; i += THREADS) // the A rows of tokens past m
    ((uint4 *)zero)[i] = make_uint4(0, 0, 0, 0);
  if (t < 8)
    amax[t] = 0;
  grid_dependency_wait();
  int ch = (blockIdx.x * WARPS + w) * 8 + 2 * q;
  epi_in<1> in;
  load_epi_w(a.e, ch, in); // in flight during the quantization and the loop
  __syncthreads();
  if (a.xfp16)
    fused_amax<true>(a, amax);
  else
    fused_amax<false>(a, amax);
  __syncthreads();
  if (t < a.e.m)
    S[t] = mt_q::outer_scale(__uint_as_float(amax[a.e.sa_row ? t : 0]));
  __syncthreads();
  if (a.xfp16)
    fused_quantize<true>(a, S, xs, xp);
  else
    fused_quantize<false>(a, S, xs, xp);
  load_epi_a(a.e, g, S, 1, in);

  for (int c = 0; c < chunks; c++) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2) : "memory");
    __syncthreads();
    int next = c + STAGES - 1;
    if (next < chunks)
      load_weights(a, wl, smem + (next % STAGES) * WSTAGE, next);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    const uint8_t *arow = (g < a.e.m ? xs + g * xp + c * (KC * 2) : zero) + q * 4;
    int steps = min(KC / 16, ksteps - c * (KC / 16));
    chunk_steps<8>(d, smem + (c % STAGES) * WSTAGE + w * WCHUNK, arow, xp, steps, lane);
  }
  if (g >= a.e.m)
    return;
  float inv_a = __frcp_rn(in.sa[0][0]);
#pragma unroll
  for (int j = 0; j < 2; j++)
    store_elem(a.e.y, g * a.e.ldy + ch + j, a.e.ytype,
               epi_out(a.e, d[0][j], inv_a, __frcp_rn(in.sw[j]), in.bias[j], g, ch + j));
}
} // namespace small

extern "C" __global__ void __launch_bounds__(32 * MT_SMALL_WARPS)
    mt_gemm_small_q4(const __grid_constant__ mt_small_args a) {
  small::run_fused(a);
}

// weight repacking into fragment order (gemm_args.h); one thread per 16 output bytes: a record of
// 8 rows x 32 columns is 8 x 16 code bytes (4 lanes each) then 2 x 16 bytes of BF16 scales (4 rows
// each)

namespace small {
__device__ static void pack(const mt_pack_args &a) {
  if (a.only_if && *a.only_if == 0)
    return;
  size_t pairs = ((size_t)a.k + 31) / 32, kb = (size_t)a.k / 16;
  size_t chunks = (size_t)a.n / 8 * pairs * (MT_FRAG_REC / 16);
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= chunks)
    return;
  size_t r = i / (MT_FRAG_REC / 16), H = r / pairs, P = r % pairs;
  int j = (int)(i % (MT_FRAG_REC / 16));
  uint8_t out[16];
  for (int o = 0; o < 4; o++) {
    if (j < 8) { // lane l = 4g + q: bytes q and q + 4 of row 8H + g, blocks 2P and 2P + 1
      int l = 4 * j + o, g = l / 4, q = l % 4;
      const uint8_t *row = a.codes + (8 * H + g) * (size_t)(a.k / 2);
      uint32_t w = 0;
      for (int s = 0; s < 2; s++) {
        size_t b = 2 * P + s;
        if (b < kb)
          w |= (uint32_t)row[b * 8 + q] << (16 * s) | (uint32_t)row[b * 8 + q + 4] << (16 * s + 8);
      }
      for (int u = 0; u < 4; u++)
        out[4 * o + u] = (uint8_t)(w >> (8 * u));
    } else { // row 8H + g's scales of blocks 2P, 2P + 1 as BF16 (exact: 4 significant bits)
      int g = 4 * (j - 8) + o;
      const uint8_t *row = a.scales + (8 * H + g) * kb;
      for (int s = 0; s < 2; s++) {
        size_t b = 2 * P + s;
        uint16_t v = 0;
        if (b < kb) {
          __nv_bfloat16 h = __float2bfloat16_rn(mt_q::e4m3_to_float(row[b] & 0x7fu));
          v = *(uint16_t *)&h;
        }
        out[4 * o + 2 * s] = (uint8_t)v;
        out[4 * o + 2 * s + 1] = (uint8_t)(v >> 8);
      }
    }
  }
  *(uint4 *)(a.frag + i * 16) = *(uint4 *)out;
}
} // namespace small

extern "C" __global__ void mt_gemm_pack(const __grid_constant__ mt_pack_args a) { small::pack(a); }
