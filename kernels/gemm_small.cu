// gemm_small.cu — the small-M path of the W4A4 GEMM (mt_gemm_small_mROWS, and mt_gemm_small_q4 that
// also quantizes the activations) and the weight repacking into its fragment order (mt_gemm_pack).
// y[m][n] = x[m][k] . W[n][k]^T on NVFP4 operands, exactly, through BF16 mma.sync with FP32
// accumulation.
//
// One CTA of two warps per 16 output channels (n / 16 CTAs: 96 for gate_up, so most SMs share the
// work); each warp owns 8 channels. The MMA's M is the tokens (A: the quantized activations, staged
// in shared memory, rows past m zero) and its N the warp's 8 channels (B: the weight, streamed at 5
// bits per element in fragment order and decoded in registers, 4 elements a lane a step, no zero
// operand). k16 steps over K in increasing order into one FP32 accumulator per output, from zero,
// no split-K: the arithmetic of the large path (kernels/gemm_large.cu), which scripts/probe_mma.cu
// showed gives the same bits (within a step every product is exact and the block sum is exact in
// FP32, so which operand is A does not matter). mt_gemm_small_mROWS start under programmatic
// dependent launch and request their first weight chunks before griddepcontrol.wait; q4 runs in
// plain stream order (nothing before it to overlap) and quantizes while its weights arrive.
//
// The warp-specialized kernels mt_gemm_small_ws_* (MT_SMALL_KERNEL=ws; namespace ws below): one
// CTA of five warps per 8 channels, a chain warp that only loads ready B fragments and runs the
// MMAs, four decoder warps that produce them into a ring of shared-memory slots. Measured on the
// H200: the same bits, no faster than the default kernels (kernels/NOTES.md, v9); kept for
// measurements.
//
// Tested by tests/gpu/test_kernels.c: against mt_ref_gemm (spec/nvfp4.c) within the
// FP32-accumulation bound, and bitwise across M (1, 2, 3 run q4, 7 m8, 12 m16; 64 and more the
// large path), row positions and the two paths; run it again with MT_SMALL_KERNEL=ws for the ws
// kernels. kernels/NOTES.md has the measurements and the SASS counts.
#include "kernels/gemm_common.cuh"
#include "kernels/quant.cuh"

namespace small {
constexpr int WARPS = MT_SMALL_WARPS, THREADS = 32 * WARPS, KC = MT_SMALL_KC, PITCH = MT_SMALL_PITCH;
constexpr int REC = MT_FRAG_REC, WBYTES = MT_SMALL_WBYTES, WCHUNK = (KC / 32) * REC; // per warp
template <int ROWS> __host__ __device__ constexpr int stage_bytes() { return MT_SMALL_STAGE_BYTES(ROWS); }
template <int ROWS> __host__ __device__ constexpr int stages() { return MT_SMALL_STAGES(ROWS); }

__device__ static inline void cp16(void *dst, const void *src, bool valid) {
  // src-size 0 writes 16 zero bytes: records past k read as zero
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(valid ? 16 : 0)
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
    int i = min((int)threadIdx.x + j * THREADS, WPIECES - 1), w = i / (WCHUNK / 16), off = i % (WCHUNK / 16);
    l.src[j] = a.frag + (size_t)(blockIdx.x * WARPS + w) * l.pairs * REC + off * 16;
    l.rec[j] = off / (REC / 16);
  }
  return l;
}

// Chunk c of this CTA's weight records into stage buffer st; records past k read as zero.
__device__ static inline void load_weights(const mt_small_args &a, const wloader &l, uint8_t *st, int c) {
#pragma unroll
  for (int j = 0; j < WPER_THREAD; j++) {
    int i = threadIdx.x + j * THREADS;
    if (i < WPIECES) {
      bool ok = c * (KC / 32) + l.rec[j] < l.pairs;
      cp16(st + i * 16, ok ? l.src[j] + (size_t)c * WCHUNK : a.frag, ok);
    }
  }
}

// Chunk c of the m (at most ROWS) quantized activation rows into stage buffer st; rows past m stay
// zero (zeroed once at the start). A chunk row is KC / 8 = THREADS pieces of 16 bytes: thread t
// takes piece t of every row, so the addresses step by a row.
static_assert(KC / 8 == THREADS, "one 16-byte piece of each activation row per thread");
__device__ static void load_acts(const mt_small_args &a, uint8_t *st, int c, int rows) {
  int col = c * KC + threadIdx.x * 8;
  bool ok = col < a.e.k;
  const uint16_t *src = ok ? a.xa + col : a.xa;
  uint8_t *dst = st + WBYTES + threadIdx.x * 16;
  for (int r = 0; r < rows; r++, dst += PITCH, src += ok ? a.e.k : 0)
    cp16(dst, src, ok);
}

// The experimental decode (MT_SMALL_DECODE=shift, gemm.c; fragment order "shift", gemm_args.h):
// the two B words of step H of a record by shifts and masks alone. Each element's 3 magnitude bits
// land at BF16 bits 6..8 (e2m1 x 2^-126: exponent = the e2m1 exponent, subnormal for 0 and 0.5)
// and its sign at bit 15; then two exact BF16x2 multiplies, by the scale x 2^118 (stored so) and
// by 2^8. ~5 instead of ~11 ALU instructions a step; correct only if HMUL2.BF16 keeps subnormal
// inputs, which the GPU tests decide.
template <int H> __device__ static inline void weight_frag_shift(uint32_t w, uint32_t s2, uint32_t &b0, uint32_t &b1) {
  constexpr int j0 = 2 * H, j1 = 2 * H + 1;
  uint32_t m0 = 6 - 3 * j0 >= 0 ? w << (6 - 3 * j0) : w >> (3 * j0 - 6);
  uint32_t m1 = 6 - 3 * j1 >= 0 ? w << (6 - 3 * j1) : w >> (3 * j1 - 6);
  uint32_t p0 = (m0 & 0x01C001C0u) | ((w << j0) & 0x80008000u);
  uint32_t p1 = (m1 & 0x01C001C0u) | ((w << j1) & 0x80008000u);
  const uint32_t two8 = 0x43804380u; // 256 in both halves
  __nv_bfloat162 r0 = __hmul2(*(__nv_bfloat162 *)&p0, *(__nv_bfloat162 *)&s2);
  __nv_bfloat162 r1 = __hmul2(*(__nv_bfloat162 *)&p1, *(__nv_bfloat162 *)&s2);
  r0 = __hmul2(r0, *(const __nv_bfloat162 *)&two8);
  r1 = __hmul2(r1, *(const __nv_bfloat162 *)&two8);
  b0 = *(uint32_t *)&r0;
  b1 = *(uint32_t *)&r1;
}

// Step H (0 or 1) of a record's code word w and scale word sc, in either decode.
template <bool SHIFT, int H> __device__ static inline void step_frag(uint32_t w, uint32_t sc, uint32_t &b0, uint32_t &b1) {
  uint32_t s2 = __byte_perm(sc, 0, H ? 0x3232 : 0x1010);
  if (SHIFT)
    weight_frag_shift<H>(w, s2, b0, b1);
  else
    weight_frag(H ? w >> 16 : w, s2, b0, b1);
}

// The A fragments of one k16 step for every tile of 16 tokens: tokens 16tt + g and + 8, columns
// 2q.. and 2q+8.., from the staged activations (r: token g's row at the step's column 2q, pitch
// bytes a row). With ROWS == 8 the tokens g + 8 are zero registers.
template <int ROWS> struct afrag {
  uint32_t v[(ROWS + 15) / 16][4];
};

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
__device__ static inline void mma_step(float (&d)[(ROWS + 15) / 16][4], uint32_t b0, uint32_t b1, const afrag<ROWS> &a) {
#pragma unroll
  for (int tt = 0; tt < (ROWS + 15) / 16; tt++)
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
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
template <int ROWS, bool SHIFT>
__device__ static inline void chunk_steps(float (&d)[(ROWS + 15) / 16][4], const uint8_t *rec, const uint8_t *arow,
                                          int pitch, int n, int lane) {
  const uint8_t *cp = rec + lane * 4, *sp = rec + 128 + (lane / 4) * 4, *ar = arow;
  uint32_t w = *(const uint32_t *)cp, sc = *(const uint32_t *)sp, b0, b1;
  afrag<ROWS> a0 = load_a<ROWS>(ar, pitch), a1 = load_a<ROWS>(ar + 32, pitch);
  step_frag<SHIFT, 0>(w, sc, b0, b1);
#pragma unroll 1
  for (int p = 0; p < n / 2; p++) {
    // the next record's words and A: past the chunk's last step these read up to 160 bytes past
    // it (the other warp's records, the activations, the next row, or MT_SMALL_SLACK), unused
    cp += REC, sp += REC;
    uint32_t wn = *(const uint32_t *)cp, scn = *(const uint32_t *)sp, c0, c1;
    afrag<ROWS> an0 = load_a<ROWS>(ar + 64, pitch), an1 = load_a<ROWS>(ar + 96, pitch);
    mma_step<ROWS>(d, b0, b1, a0);
    step_frag<SHIFT, 1>(w, sc, c0, c1);
    mma_step<ROWS>(d, c0, c1, a1);
    w = wn, sc = scn;
    step_frag<SHIFT, 0>(w, sc, b0, b1);
    a0 = an0, a1 = an1;
    ar += 64;
  }
  if (n % 2) // the last step of k, when k % 32 != 0
    mma_step<ROWS>(d, b0, b1, a0);
}

// The warp's accumulators to y through the epilogue: d[tt] holds, in lane (g, q), tokens
// 16 tt + g (d[tt][0..1]) and 16 tt + g + 8 (d[tt][2..3]) of channels ch and ch + 1. A token's
// 1/S_a is 1/S[tok] from the CTA's own quantization when FUSED, else from the quantization kernel's.
template <int TT, bool FUSED>
__device__ static inline void store_acc(const mt_epilogue_args &e, const float (&d)[TT][4], int ch, int g,
                                        const float *S) {
  float inv_w[2] = {inv_row(e.sw, e.sw_row, ch), inv_row(e.sw, e.sw_row, ch + 1)};
#pragma unroll
  for (int tt = 0; tt < TT; tt++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      int tok = tt * 16 + g + 8 * h;
      if (tok >= e.m) continue;
      float inv_a = FUSED ? mt_q::inv_S(S[tok]) : inv_row(e.sa, e.sa_row, tok);
#pragma unroll
      for (int j = 0; j < 2; j++)
        store_elem(e.y, tok * e.ldy + ch + j, e.ytype, epilogue(e, d[tt][2 * h + j], inv_a, inv_w[j], tok, ch + j));
    }
}

template <int ROWS, bool SHIFT> __device__ static void run(const mt_small_args &a) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int TT = (ROWS + 15) / 16, STAGES = stages<ROWS>();
  int t = threadIdx.x, w = t / 32, lane = t % 32, g = lane / 4, q = lane % 4;
  int ksteps = a.e.k / 16, chunks = (a.e.k + KC - 1) / KC, rows = min(a.e.m, ROWS);
  float d[TT][4];
  const wloader wl = make_wloader(a);
#pragma unroll
  for (int i = 0; i < TT; i++) d[i][0] = d[i][1] = d[i][2] = d[i][3] = 0.0f;

  // The weights do not depend on the kernel before this one (the activation quantization, which
  // lets this grid start early): their first chunks are requested before waiting for it.
  for (int c = 0; c < STAGES - 1 && c < chunks; c++)
    load_weights(a, wl, smem + c * stage_bytes<ROWS>(), c);
  // Token rows past m read as zero in every stage; cp.async never writes them.
  for (int i = t; i < STAGES * (ROWS - rows) * (PITCH / 16); i += THREADS) {
    int st = i / ((ROWS - rows) * (PITCH / 16)), r = i % ((ROWS - rows) * (PITCH / 16));
    *(uint4 *)(smem + st * stage_bytes<ROWS>() + WBYTES + rows * PITCH + r * 16) = make_uint4(0, 0, 0, 0);
  }
  grid_dependency_wait();
  for (int c = 0; c < STAGES - 1; c++) {
    if (c < chunks) load_acts(a, smem + c * stage_bytes<ROWS>(), c, rows);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  for (int c = 0; c < chunks; c++) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2) : "memory");
    __syncthreads();
    int next = c + STAGES - 1;
    if (next < chunks) {
      load_weights(a, wl, smem + (next % STAGES) * stage_bytes<ROWS>(), next);
      load_acts(a, smem + (next % STAGES) * stage_bytes<ROWS>(), next, rows);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    const uint8_t *st = smem + (c % STAGES) * stage_bytes<ROWS>();
    int steps = min(KC / 16, ksteps - c * (KC / 16));
    chunk_steps<ROWS, SHIFT>(d, st + w * WCHUNK, st + WBYTES + g * PITCH + q * 4, PITCH, steps, lane);
  }
  store_acc<TT, false>(a.e, d, (blockIdx.x * WARPS + w) * 8 + 2 * q, g, nullptr);
}

// The fused variant for m <= MT_SMALL_FUSE_M: the CTA quantizes the raw activations itself (no
// separate launch, whose ~1.7 µs at M = 1 was most of the budget) with the device steps of
// kernels/quant.cuh, bit for bit as mt_quantize: the domain's amax as the maximum of FP32 bits
// (exact, any order), S = outer_scale(amax), each block by mt_q::block, a NaN/Inf domain giving
// zero xhat and a NaN S. The whole of xhat (m rows of k) stays in shared memory for the MMAs; only
// the weights stream through the ring. Each CTA redoes the m x k quantization: cheap at m <= 4.
template <bool FP16> __device__ static inline uint32_t x_block(const mt_small_args &a, int r, int b, uint32_t (&v)[8]) {
  const uint4 *src = (const uint4 *)((const char *)a.x + ((size_t)r * (size_t)a.ldx + (size_t)b * 16) * 2);
  uint4 v0 = src[0], v1 = src[1];
  v[0] = v0.x, v[1] = v0.y, v[2] = v0.z, v[3] = v0.w, v[4] = v1.x, v[5] = v1.y, v[6] = v1.z, v[7] = v1.w;
  return mt_q::block_amax_bits<FP16>(v);
}

template <bool FP16, int NT = THREADS> __device__ static void fused_amax(const mt_small_args &a, uint32_t *amax) {
  int nblk = a.e.k / 16;
  for (int i = threadIdx.x; i < a.e.m * nblk; i += NT) {
    uint32_t v[8];
    int r = i / nblk;
    atomicMax(&amax[a.e.sa_row ? r : 0], x_block<FP16>(a, r, i % nblk, v));
  }
}

template <bool FP16, int NT = THREADS>
__device__ static void fused_quantize(const mt_small_args &a, const float *S, uint8_t *xs, int xp) {
  int nblk = a.e.k / 16;
  for (int i = threadIdx.x; i < a.e.m * nblk; i += NT) {
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

template <bool SHIFT> __device__ static void run_fused(const mt_small_args &a) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int STAGES = MT_SMALL_FUSE_STAGES;
  uint8_t *zero = smem + STAGES * WBYTES, *xs = zero + MT_SMALL_FUSE_META;
  float *S = (float *)(zero + PITCH);
  uint32_t *amax = (uint32_t *)(S + 8);
  int t = threadIdx.x, w = t / 32, lane = t % 32, g = lane / 4, q = lane % 4;
  int ksteps = a.e.k / 16, chunks = (a.e.k + KC - 1) / KC, xp = 2 * a.e.k + 16;
  float d[1][4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
  const wloader wl = make_wloader(a);

  // The weights first (they do not depend on the kernel before this one), one group per chunk.
  for (int c = 0; c < STAGES - 1; c++) {
    if (c < chunks) load_weights(a, wl, smem + c * WBYTES, c);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
  }
  for (int i = t; i < PITCH / 16; i += THREADS) // the A rows of tokens past m
    ((uint4 *)zero)[i] = make_uint4(0, 0, 0, 0);
  if (t < 8) amax[t] = 0;
  grid_dependency_wait();
  __syncthreads();
  if (a.xfp16) fused_amax<true>(a, amax);
  else fused_amax<false>(a, amax);
  __syncthreads();
  if (t < a.e.m) S[t] = mt_q::outer_scale(__uint_as_float(amax[a.e.sa_row ? t : 0]));
  __syncthreads();
  if (a.xfp16) fused_quantize<true>(a, S, xs, xp);
  else fused_quantize<false>(a, S, xs, xp);

  for (int c = 0; c < chunks; c++) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2) : "memory");
    __syncthreads();
    int next = c + STAGES - 1;
    if (next < chunks) load_weights(a, wl, smem + (next % STAGES) * WBYTES, next);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
    const uint8_t *arow = (g < a.e.m ? xs + g * xp + c * (KC * 2) : zero) + q * 4;
    int steps = min(KC / 16, ksteps - c * (KC / 16));
    chunk_steps<8, SHIFT>(d, smem + (c % STAGES) * WBYTES + w * WCHUNK, arow, xp, steps, lane);
  }
  int ch = (blockIdx.x * WARPS + w) * 8 + 2 * q, tok = g;
  if (tok >= a.e.m) return;
  float inv_a = mt_q::inv_S(S[tok]);
#pragma unroll
  for (int j = 0; j < 2; j++)
    store_elem(a.e.y, tok * a.e.ldy + ch + j, a.e.ytype,
               epilogue(a.e, d[0][j], inv_a, inv_row(a.e.sw, a.e.sw_row, ch + j), tok, ch + j));
}
} // namespace small

#define MT_SMALL(ROWS)                                                                             \
  extern "C" __global__ void __launch_bounds__(32 * MT_SMALL_WARPS) mt_gemm_small_m##ROWS(const __grid_constant__ mt_small_args a) { \
    small::run<ROWS, false>(a);                                                                    \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(32 * MT_SMALL_WARPS) mt_gemm_small_m##ROWS##_shift(const __grid_constant__ mt_small_args a) { \
    small::run<ROWS, true>(a);                                                                     \
  }
MT_SMALL(8)
MT_SMALL(16)
MT_SMALL(32)
MT_SMALL(64)

extern "C" __global__ void __launch_bounds__(32 * MT_SMALL_WARPS) mt_gemm_small_q4(const __grid_constant__ mt_small_args a) {
  small::run_fused<false>(a);
}
extern "C" __global__ void __launch_bounds__(32 * MT_SMALL_WARPS) mt_gemm_small_q4_shift(const __grid_constant__ mt_small_args a) {
  small::run_fused<true>(a);
}



// The warp-specialized kernels (mt_gemm_small_ws_*; gemm_args.h has the sizes). v7's single warp per 8
// channels issued its ~26 instructions a k16 step at ~2.9 cycles each (ncu: one warp cannot issue
// dependent-ish instructions faster), ~75 cycles a step against the 24 of the MMA chain. Here the
// chain warp only loads ready fragments and runs the MMAs (~4-6 instructions a step); decoder warps
// turn the 5-bit records into BF16 B fragments (the same weight_frag, so the same bits) in a ring of
// slots, each decoder every DEC-th slot's worth. The CTA's records for all of K are requested at the
// start by bulk copies, one mbarrier per slot's worth; a slot has a "full" barrier (the decoder
// warp's 32 arrivals plus, unfused, the bytes of its activation rows, copied in by the decoder) and
// an "empty" one (the chain warp's 32 arrivals). The arithmetic is that of run(): the same k16
// steps over K in increasing order into one FP32 accumulator from zero, the same epilogue.
namespace ws {
constexpr int DEC = MT_WS_DEC, THREADS = MT_WS_THREADS, NS = MT_WS_SLOTS, CS = MT_WS_STEPS, CREC = CS / 2;
constexpr int CCOLS = CS * 16, APITCH = MT_WS_APITCH, BBYTES = CS * 256;
static_assert(CS % 2 == 0 && MT_WS_KMAX(1) / CCOLS <= THREADS, "a thread per slot's worth of records");

// bytes still to come for the current phase, without an arrival
__device__ static inline void mbar_expect_tx(uint64_t *bar, uint32_t bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
// bytes (a multiple of 16, both addresses 16-byte aligned) from global into shared memory,
// completing on bar
__device__ static inline void bulk_copy(void *dst, const void *src, uint32_t bytes, uint64_t *bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_u32(dst)),
               "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}

// One record (two k16 steps) of this lane into its B fragments, step by step 256 bytes apart: w
// the lane's code word, sc its row's scale word.
template <bool SHIFT> __device__ static inline void decode_record(uint32_t w, uint32_t sc, uint8_t *out, int lane) {
  uint32_t b0, b1, c0, c1;
  small::step_frag<SHIFT, 0>(w, sc, b0, b1);
  small::step_frag<SHIFT, 1>(w, sc, c0, c1);
  *(uint2 *)(out + lane * 8) = make_uint2(b0, b1);
  *(uint2 *)(out + 256 + lane * 8) = make_uint2(c0, c1);
}

// Decoder warp dw: slots' worth c = dw, dw + DEC, ... into slot c % NS once the chain has emptied
// it; unfused, its lanes r < rows then copy token r's activations for the slot's columns (the
// weights are decoded before waiting for the activation quantization, which may still run).
template <int ROWS, bool FUSED, bool SHIFT>
__device__ static void decode(const mt_small_args &a, int dw, const uint8_t *raw, uint8_t *slots, uint64_t *rawb,
                              uint64_t *full, uint64_t *empty, int chunks, int rows) {
  constexpr int SLOT = MT_WS_SLOT(FUSED ? 0 : ROWS);
  int lane = threadIdx.x % 32, g = lane / 4, k = a.e.k, pairs = (k + 31) / 32;
  static_assert(CS * 256 == CREC * 512, "a record is two steps of 256 bytes");
  for (int c = dw; c < chunks; c += DEC) {
    int slot = c % NS, u = c / NS;
    uint8_t *sb = slots + slot * SLOT;
    if (u > 0)
      mbar_wait(&empty[slot], (u - 1) & 1);
    mbar_wait(&rawb[c], 0);
    const uint8_t *rec = raw + c * CREC * MT_FRAG_REC;
    const uint8_t *cw = rec + lane * 4, *sw = rec + 128 + g * 4;
    if (c * CREC + CREC <= pairs) { // a whole slot's worth: all its words loaded first, then decoded
      uint32_t w[CREC], sc[CREC];
#pragma unroll
      for (int r = 0; r < CREC; r++)
        w[r] = *(const uint32_t *)(cw + r * MT_FRAG_REC), sc[r] = *(const uint32_t *)(sw + r * MT_FRAG_REC);
#pragma unroll
      for (int r = 0; r < CREC; r++)
        decode_record<SHIFT>(w[r], sc[r], sb + r * 512, lane);
    } else {
      for (int r = 0; r < pairs - c * CREC; r++)
        decode_record<SHIFT>(*(const uint32_t *)(cw + r * MT_FRAG_REC), *(const uint32_t *)(sw + r * MT_FRAG_REC),
                             sb + r * 512, lane);
    }
    if (!FUSED) { // the activations come from the kernel before this one: wait for it once
      if (c == dw)
        grid_dependency_wait();
      uint32_t bytes = (uint32_t)min(CCOLS, k - c * CCOLS) * 2;
      if (lane == 0)
        mbar_expect_tx(&full[slot], bytes * rows);
      __syncwarp();
      if (lane < rows)
        bulk_copy(sb + BBYTES + lane * APITCH, a.xa + (size_t)lane * k + c * CCOLS, bytes, &full[slot]);
    }
    mbar_arrive(&full[slot]);
  }
}

// One slot's fragments: B (the lane's two words a step) and A (a0, a2 of mma.sync's A registers;
// with 16 rows also a1, a3). At 8 rows, a1 and a3 (tokens g + 8) are zero operands of the MMA,
// not loaded.
template <int ROWS> struct slotfrag {
  uint2 b[CS];
  uint32_t a[CS][ROWS >= 16 ? 4 : 2];
};

// sb: the slot's B fragments at this lane's 8 bytes; ar: its A at this lane's row and column
template <int ROWS>
__device__ static inline void load_step(slotfrag<ROWS> &f, int s, const uint8_t *sb, const uint8_t *ar, int pitch) {
  f.b[s] = *(const uint2 *)(sb + s * 256);
  const uint8_t *t = ar + s * 32;
  f.a[s][0] = *(const uint32_t *)t;
  f.a[s][1] = *(const uint32_t *)(t + 16);
  if (ROWS >= 16) {
    f.a[s][2] = *(const uint32_t *)(t + 8 * pitch);
    f.a[s][3] = *(const uint32_t *)(t + 8 * pitch + 16);
  }
}

template <int ROWS> __device__ static inline void mma_step(float (&d)[4], const slotfrag<ROWS> &f, int s) {
  static_assert(ROWS == 8 || ROWS == 16, "one m16 tile");
  uint32_t a1 = ROWS >= 16 ? f.a[s][ROWS >= 16 ? 2 : 0] : 0u, a3 = ROWS >= 16 ? f.a[s][ROWS >= 16 ? 3 : 1] : 0u;
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(f.a[s][0]), "r"(a1), "r"(f.a[s][1]), "r"(a3), "r"(f.b[s].x), "r"(f.b[s].y));
}

// The chain warp: slot by slot in K order, the next slot's fragments loaded before this slot's
// MMAs so that the loads issue while the chain waits on its previous MMA; two register sets used
// in turn (a loop of two slots: no copies between them). WAIT false: no barriers, for
// scripts/probe_chain.cu on slots already full.
template <int ROWS, bool FUSED, bool WAIT = true>
__device__ static void chain(float (&d)[(ROWS + 15) / 16][4], const uint8_t *slots, uint64_t *full, uint64_t *empty,
                             int chunks, int ksteps, const uint8_t *xrow, int xp) {
  constexpr int SLOT = MT_WS_SLOT(FUSED ? 0 : ROWS);
  int lane = threadIdx.x % 32, g = lane / 4, q = lane % 4;
  const uint8_t *bbase = slots + lane * 8;
  // A of slot c: unfused, the slot's own rows; fused, the whole rows xrow (pitch xp; the zero row,
  // which does not advance (xp 0), for tokens past m)
  const uint8_t *abase = FUSED ? xrow + q * 4 : slots + BBYTES + g * APITCH + q * 4;
  int astep = FUSED ? (xp ? CCOLS * 2 : 0) : SLOT, pitch = FUSED ? xp : APITCH;
  auto aof = [&](int c) { return abase + (FUSED ? c : c % NS) * astep; };
  // Step s's loads of the next slot follow step s's MMA in program order, so that they issue in
  // the MMA chain's gaps; past the last slot they read a stale slot, unused.
  auto stage = [&](int c, const slotfrag<ROWS> &f, slotfrag<ROWS> &n) {
    int cn = c + 1 < chunks ? c + 1 : c;
    const uint8_t *nb = bbase + (cn % NS) * SLOT, *na = aof(cn);
    if ((c + 1) * CS <= ksteps) { // the wait for the next slot after the first MMA, in its shadow
      mma_step<ROWS>(d[0], f, 0);
      if (WAIT && c + 1 < chunks)
        mbar_wait(&full[cn % NS], (cn / NS) & 1);
#pragma unroll
      for (int s = 0; s < CS; s++) {
        if (s > 0)
          mma_step<ROWS>(d[0], f, s);
        load_step<ROWS>(n, s, nb, na, pitch);
      }
    } else { // the last slot of a k that is not a multiple of CS steps
      int lim = ksteps - c * CS;
#pragma unroll
      for (int s = 0; s < CS; s++)
        if (s < lim)
          mma_step<ROWS>(d[0], f, s);
    }
    if (WAIT)
      mbar_arrive(&empty[c % NS]);
  };
  slotfrag<ROWS> f0, f1;
  if (WAIT)
    mbar_wait(&full[0], 0);
#pragma unroll
  for (int s = 0; s < CS; s++)
    load_step<ROWS>(f0, s, bbase, aof(0), pitch);
  for (int c = 0; c < chunks; c += 2) {
    stage(c, f0, f1);
    if (c + 1 < chunks)
      stage(c + 1, f1, f0);
  }
}

// v10 (kernels/NOTES.md): the chain warp on a ring of register sets. mma.sync's source registers
// stay locked until the MMA completes (~27 cycles) and issue is in order, so an instruction that
// writes a register an MMA in flight reads stalls the warp until then; ptxas takes the sources as
// read at issue and schedules HMMA as fixed latency, so it puts the next loads into them right
// after the MMA (chain() above: ~46 cycles a step in scripts/probe_chain.cu), and left to itself it
// folds any ring of sets back into two with the loads one step ahead. So the order is pinned by
// ptxas's own rules for volatile shared-memory accesses, which it never reorders: after MMA j, the
// loads of step j + 2 (ld.volatile), then a keeper of step j: a store (st.volatile) of MMA j's
// registers and of its first results, predicated off by a condition ptxas cannot prove false. The
// keeper reads MMA j's result, so it is not issued before MMA j has completed; it keeps MMA j's
// registers alive until then, so ptxas puts no other value in them; and the loads of step j + 3,
// which may take them, come after it. The same loads and MMAs, in the same order, as chain().
template <int ROWS> struct rset {
  uint32_t a[4], b0, b1;
};

// Step operands: B from shared address b (this lane's 8 bytes), A by one ldmatrix.x4 from this
// lane's row address a (lanes 8i .. 8i + 7 give the 16-byte rows of the A registers' matrix i: rows
// 0-7 then 8-15 of the tile, columns 0-7 of the step, then the same for columns 8-15), which loads
// exactly mma.sync's A fragment. With 8 rows, matrices 1 and 3 (tokens g + 8) are loaded from rows
// 0-7 again: any value serves (their outputs are not stored), and loaded values are the set's own
// registers (ptxas builds constant zeros into copies of the set, which the keeper would not keep).
template <int ROWS> __device__ static inline void rload(rset<ROWS> &r, uint32_t b, uint32_t a) {
  asm volatile("ld.volatile.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(r.b0), "=r"(r.b1) : "r"(b) : "memory");
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r.a[0]), "=r"(r.a[1]), "=r"(r.a[2]), "=r"(r.a[3])
               : "r"(a)
               : "memory");
}

template <int ROWS> __device__ static inline void rmma(float (&d)[4], const rset<ROWS> &r) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(r.a[0]), "r"(r.a[1]), "r"(r.a[2]), "r"(r.a[3]), "r"(r.b0), "r"(r.b1));
}

// The keeper of MMA j: stores, to 64 bytes at shared address at that nothing reads, of every
// register MMA j read (set r and the accumulators c it started from: ptxas may give each MMA new
// accumulator registers) and of its results d. Reading d, they issue only after the MMA has
// completed; as volatile accesses they stay after the loads before them in program order and before
// the loads after them. PRED (the ws10p kernels): predicated off, by never (zero, which ptxas cannot
// know) ANDed with this MMA's starting accumulator (so the predicate is computed per step: from a
// value fixed over the loop, ptxas turns the stores into branches around them): no shared-memory
// cycles, a few more issue cycles (SASS: 37 instead of 32 cycles a step static). Which costs less
// the GPU decides (the 4 stores a step are 14 shared-memory wavefronts if 16-byte stores to one
// address take 4).
template <int ROWS, bool PRED>
__device__ static inline void rkeep(uint32_t at, uint32_t never, const rset<ROWS> &r, const float (&d)[4],
                                    const float (&c)[4]) {
  if (PRED)
    asm volatile("{\n.reg .pred p;\n.reg .b32 t;\nand.b32 t, %15, %0;\nsetp.ne.u32 p, t, 0;\n"
                 "@p st.volatile.shared.v4.b32 [%1], {%2, %3, %4, %5};\n"
                 "@p st.volatile.shared.v2.b32 [%1+16], {%6, %7};\n"
                 "@p st.volatile.shared.v4.f32 [%1+32], {%8, %9, %10, %11};\n"
                 "@p st.volatile.shared.v4.f32 [%1+48], {%12, %13, %14, %15};\n}\n" ::"r"(never),
                 "r"(at), "r"(r.a[0]), "r"(r.a[1]), "r"(r.a[2]), "r"(r.a[3]), "r"(r.b0), "r"(r.b1), "f"(d[0]),
                 "f"(d[1]), "f"(d[2]), "f"(d[3]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3])
                 : "memory");
  else
    asm volatile("st.volatile.shared.v4.b32 [%0], {%1, %2, %3, %4};\n"
                 "st.volatile.shared.v2.b32 [%0+16], {%5, %6};\n"
                 "st.volatile.shared.v4.f32 [%0+32], {%7, %8, %9, %10};\n"
                 "st.volatile.shared.v4.f32 [%0+48], {%11, %12, %13, %14};\n" ::"r"(at),
                 "r"(r.a[0]), "r"(r.a[1]), "r"(r.a[2]), "r"(r.a[3]), "r"(r.b0), "r"(r.b1), "f"(d[0]), "f"(d[1]),
                 "f"(d[2]), "f"(d[3]), "f"(c[0]), "f"(c[1]), "f"(c[2]), "f"(c[3])
                 : "memory");
}

// MMA of set cur, then (after), then step operands into set nxt, then cur's keeper
#define MT_RING_STEP(cur, nxt, bp, ap, after)                                                      \
  {                                                                                                \
    float c_[4] = {d[0], d[1], d[2], d[3]};                                                        \
    rmma<ROWS>(d, cur);                                                                            \
    after;                                                                                         \
    rload<ROWS>(nxt, bp, ap);                                                                      \
    rkeep<ROWS, PRED>(kat, never, cur, d, c_);                                                     \
  }

// The chain warp of run() on the ring (WAIT false: no barriers, for scripts/probe_chain.cu on slots
// already full). Slot c's steps 0..7 use sets 0, 1, 2, 3, 0, 1, 2, 3; steps 6 and 7 load the next
// slot's first two steps, after waiting for it before step 2's MMA.
// The tile row whose 16-byte pieces this lane gives ldmatrix (see rload).
template <int ROWS> __device__ static inline int ring_row(int lane) { return lane % 8 + (ROWS >= 16 && lane / 8 % 2 ? 8 : 0); }

// xrow (fused only): this lane's ldmatrix row, the quantized row of token ring_row or the zero row
// past m; xadv: whether it advances with k (not the zero row). keep: MT_WS_KEEP bytes for the
// keepers' stores.
template <int ROWS, bool FUSED, bool PRED, bool WAIT = true>
__device__ static void chain_ring(float (&d)[4], const uint8_t *slots, uint64_t *full, uint64_t *empty, int chunks,
                                  int ksteps, const uint8_t *xrow, bool xadv, uint8_t *keep) {
  static_assert(CS == 8, "the loop body is one slot of 8 steps on 4 sets");
  constexpr int SLOT = MT_WS_SLOT(FUSED ? 0 : ROWS);
  int lane = threadIdx.x % 32, half = lane / 16 * 16;
  uint32_t bbase = smem_u32(slots) + lane * 8;
  // this lane's ldmatrix row: unfused, its row of the slot's activations; fused, xrow
  uint32_t abase = (FUSED ? smem_u32(xrow) : smem_u32(slots) + BBYTES + ring_row<ROWS>(lane) * APITCH) + half;
  int astep = FUSED ? (xadv ? CCOLS * 2 : 0) : SLOT;
  auto bof = [&](int c) { return bbase + (c % NS) * SLOT; };
  auto aof = [&](int c) { return abase + (FUSED ? c : c % NS) * astep; };
  uint32_t kat = smem_u32(keep), never = (uint32_t)ksteps >> 31; // ksteps >= 0
  rset<ROWS> r0, r1, r2, r3;
  if (WAIT)
    mbar_wait(&full[0], 0);
  rload<ROWS>(r0, bof(0), aof(0));
  rload<ROWS>(r1, bof(0) + 256, aof(0) + 32);
  int whole = ksteps / CS;
#pragma unroll 1
  for (int c = 0; c < whole; c++) {
    int cn = c + 1 < chunks ? c + 1 : c; // past the last slot: a stale one, unused
    uint32_t b = bof(c), a = aof(c), bn = bof(cn), an = aof(cn);
    MT_RING_STEP(r0, r2, b + 512, a + 64, )
    MT_RING_STEP(r1, r3, b + 768, a + 96, )
    if (WAIT && c + 1 < chunks)
      mbar_wait(&full[cn % NS], (cn / NS) & 1);
    MT_RING_STEP(r2, r0, b + 1024, a + 128, )
    MT_RING_STEP(r3, r1, b + 1280, a + 160, )
    MT_RING_STEP(r0, r2, b + 1536, a + 192, )
    MT_RING_STEP(r1, r3, b + 1792, a + 224, )
    MT_RING_STEP(r2, r0, bn, an, )
    // slot c's last loads were two steps ago: its release waits for little
    MT_RING_STEP(r3, r1, bn + 256, an + 32, if (WAIT) mbar_arrive(&empty[c % NS]))
  }
  int left = ksteps - whole * CS; // the last slot of a k that is not a multiple of CS steps
  if (left > 0) {
    uint32_t b = bof(whole), a = aof(whole);
    rmma<ROWS>(d, r0);
    if (left > 1)
      rmma<ROWS>(d, r1);
    for (int s = 2; s < left; s++) {
      rload<ROWS>(r2, b + s * 256, a + s * 32);
      rmma<ROWS>(d, r2);
    }
    if (WAIT)
      mbar_arrive(&empty[whole % NS]);
  }
}
#undef MT_RING_STEP

// RING: the chain warp is chain_ring (v10; 2: with its keepers predicated off), else chain
template <int ROWS, int CLS, bool FUSED, bool SHIFT, int RING> __device__ static void run(const mt_small_args &a) {
  extern __shared__ __align__(16) uint8_t smem[];
  constexpr int MAXCH = MT_WS_KMAX(CLS) / CCOLS, TT = (ROWS + 15) / 16, AROWS = FUSED ? 0 : ROWS;
  uint64_t *rawb = (uint64_t *)smem, *full = rawb + MAXCH, *empty = full + NS;
  uint8_t *raw = smem + MT_WS_BARS(CLS) * 8, *slots = raw + MT_WS_RAW(CLS);
  uint8_t *zero = slots + NS * MT_WS_SLOT(AROWS); // fused only: zero row, S, amax, xs
  float *S = (float *)(zero + APITCH);
  uint32_t *amax = (uint32_t *)(S + 8);
  uint8_t *xs = (uint8_t *)(amax + 8);
  int t = threadIdx.x, w = t / 32, lane = t % 32, g = lane / 4, q = lane % 4;
  int k = a.e.k, ksteps = k / 16, chunks = (ksteps + CS - 1) / CS, pairs = (k + 31) / 32, rows = min(a.e.m, ROWS);
  if (t < chunks)
    mbar_init(&rawb[t], 1);
  if (t < NS) {
    mbar_init(&full[t], 32);
    mbar_init(&empty[t], 32);
  }
  if (FUSED) {
    for (int i = t; i < APITCH / 16; i += THREADS)
      ((uint4 *)zero)[i] = make_uint4(0, 0, 0, 0);
    if (t < 8)
      amax[t] = 0;
  } else { // token rows past m read as zero in every slot; the copies never write them
    for (int i = t; i < NS * (ROWS - rows) * (APITCH / 16); i += THREADS) {
      int sl = i / ((ROWS - rows) * (APITCH / 16)), r = i % ((ROWS - rows) * (APITCH / 16));
      *(uint4 *)(slots + sl * MT_WS_SLOT(AROWS) + BBYTES + rows * APITCH + r * 16) = make_uint4(0, 0, 0, 0);
    }
  }
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  __syncthreads();
  // This CTA's 8 rows over all of K are contiguous in fragment order; they do not depend on the
  // kernel before this one, so they are requested before waiting for it.
  if (t < chunks) {
    int r0 = t * CREC, nrec = min(CREC, pairs - r0);
    mbar_arrive_expect_tx(&rawb[t], (uint32_t)(nrec * MT_FRAG_REC));
    bulk_copy(raw + r0 * MT_FRAG_REC, a.frag + ((size_t)blockIdx.x * pairs + r0) * MT_FRAG_REC,
              (uint32_t)(nrec * MT_FRAG_REC), &rawb[t]);
  }
  if (FUSED || w == 0) // decoder warps wait in decode(), after their first weights
    grid_dependency_wait();
  int xp = 0;
  if (FUSED) { // as run_fused: amax, S, then the quantized rows, by all warps
    xp = 2 * k + 16;
    if (a.xfp16) small::fused_amax<true, THREADS>(a, amax);
    else small::fused_amax<false, THREADS>(a, amax);
    __syncthreads();
    if (t < a.e.m) S[t] = mt_q::outer_scale(__uint_as_float(amax[a.e.sa_row ? t : 0]));
    __syncthreads();
    if (a.xfp16) small::fused_quantize<true, THREADS>(a, S, xs, xp);
    else small::fused_quantize<false, THREADS>(a, S, xs, xp);
    __syncthreads();
  }
  if (w > 0) {
    decode<ROWS, FUSED, SHIFT>(a, w - 1, raw, slots, rawb, full, empty, chunks, rows);
    return;
  }
  float d[TT][4];
#pragma unroll
  for (int i = 0; i < TT; i++) d[i][0] = d[i][1] = d[i][2] = d[i][3] = 0.0f;
  if (RING) {
    int r = ring_row<ROWS>(lane);
    uint8_t *keep = smem + (FUSED ? MT_WS_FUSE_SMEM(CLS) : MT_WS_SMEM(CLS, ROWS)) - MT_WS_KEEP;
    chain_ring<ROWS, FUSED, RING == 2>(d[0], slots, full, empty, chunks, ksteps, FUSED && r < a.e.m ? xs + r * xp : zero,
                                       FUSED && r < a.e.m, keep);
  } else {
    const uint8_t *xrow = FUSED ? (g < a.e.m ? xs + g * xp : zero) : nullptr;
    chain<ROWS, FUSED>(d, slots, full, empty, chunks, ksteps, xrow, FUSED && g < a.e.m ? xp : 0);
  }
  small::store_acc<TT, FUSED>(a.e, d, blockIdx.x * 8 + 2 * q, g, S);
}
} // namespace ws

// _shift: the decoders use the v8 decode (MT_SMALL_DECODE=shift, its fragment order); ws10: the
// chain warp is chain_ring (v10, MT_SMALL_KERNEL=ws10); ws10p: with its keepers predicated off
#define MT_WS1(PRE, NAME, ROWS, CLS, FUSED, RING)                                                  \
  extern "C" __global__ void __launch_bounds__(MT_WS_THREADS) mt_gemm_small_##PRE##_##NAME##_k##CLS(const __grid_constant__ mt_small_args a) { \
    ws::run<ROWS, CLS, FUSED, false, RING>(a);                                                     \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(MT_WS_THREADS) mt_gemm_small_##PRE##_##NAME##_k##CLS##_shift(const __grid_constant__ mt_small_args a) { \
    ws::run<ROWS, CLS, FUSED, true, RING>(a);                                                      \
  }
#define MT_WS(NAME, ROWS, CLS, FUSED)                                                              \
  MT_WS1(ws, NAME, ROWS, CLS, FUSED, 0) MT_WS1(ws10, NAME, ROWS, CLS, FUSED, 1) MT_WS1(ws10p, NAME, ROWS, CLS, FUSED, 2)
MT_WS(m8, 8, 0, false)
MT_WS(m16, 16, 0, false)
MT_WS(q4, 8, 0, true)
MT_WS(m8, 8, 1, false)
MT_WS(m16, 16, 1, false)
MT_WS(q4, 8, 1, true)

// weight repacking into fragment order (gemm_args.h); one thread per 16 output bytes: a record of
// 8 rows x 32 columns is 8 x 16 code bytes (4 lanes each) then 2 x 16 bytes of BF16 scales (4 rows
// each)

namespace small {
// One lane's code word of record P in the "shift" order: word j (0, 1: step 2P's b0, b1; 2, 3:
// step 2P+1's) holds its low element's magnitude at bits 3j..3j+2 and sign at 15-j, its high
// element's at 16+3j.. and 31-j, so that weight_frag_shift needs one shift per field.
__device__ static uint32_t shift_word(const uint8_t *row, size_t P, size_t kb, int q) {
  uint32_t w = 0;
  for (int j = 0; j < 4; j++) {
    size_t b = 2 * P + j / 2;
    uint32_t byte = b < kb ? row[b * 8 + q + 4 * (j % 2)] : 0;
    uint32_t lo = byte & 15, hi = byte >> 4;
    w |= (lo & 7) << (3 * j) | (lo >> 3) << (15 - j) | (hi & 7) << (16 + 3 * j) | (hi >> 3) << (31 - j);
  }
  return w;
}

template <bool SHIFT> __device__ static void pack(const mt_pack_args &a) {
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
      if (SHIFT)
        w = shift_word(row, P, kb, q);
      else
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
        if (b < kb) { // "shift": times 2^118, exact (448 x 2^118 < 2^127)
          __nv_bfloat16 h = __float2bfloat16_rn(mt_q::e4m3_to_float(row[b] & 0x7fu) * (SHIFT ? 0x1p118f : 1.0f));
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

extern "C" __global__ void mt_gemm_pack(const __grid_constant__ mt_pack_args a) { small::pack<false>(a); }
extern "C" __global__ void mt_gemm_pack_shift(const __grid_constant__ mt_pack_args a) { small::pack<true>(a); }
