// gemm_large.cu — the large-M path of the W4A4 GEMM (mt_gemm_large_nBN). y[m][n] = x[m][k] . W[n][k]^T
// on NVFP4 operands, exactly, through BF16 wgmma with FP32 accumulation.
//
// Exactness (DESIGN.md §4): every dequantized element e2m1 * e4m3 is exact in BF16 and every
// product of two is exact in FP32, so the tensor cores compute the NVFP4 products exactly; the
// outer scales are applied in the epilogue, in the order of gemm_args.h. Tiles of 128 tokens x BN
// channels (BN 64 to 256), or of 64 tokens x BN 32 to 64 where 128-token tiles would leave SMs
// idle (kernels/gemm.c chooses; their stages hold two 64-wide K blocks, brought by one box an
// operand in mt_gemm_large_m64p_nBN, rank-3 maps); TMA brings the BF16
// dequantized operands into 128B-swizzled shared memory (a ring of stages), one thread issues the
// copies, one consumer warpgroup per 64 tokens issues wgmma; k16 steps over K in increasing order
// into one FP32 accumulator per output, from zero, no split-K, no atomics: the arithmetic of the
// small path (kernels/gemm_small.cu), which lab/probe_mma.cu showed gives the same bits. A
// consumer keeps one wgmma group in flight across K steps (the groups chain on the same
// accumulators in issue order, so the sums do not change). The grid is persistent: each CTA walks
// tiles blockIdx.x, + gridDim.x, ..., so the producer fills the next tile's stages while the
// consumers run the epilogue. It starts under programmatic dependent launch and fetches its first
// weight tiles before griddepcontrol.wait.
//
// The epilogue does per tile what does not depend on the element (1/S_a of a thread's two rows,
// 1/S_w and the bias as floats in shared memory, the output type, whether C or a bias exist) and
// per element only the multiplies and adds of gemm_args.h, each rounded on its own
// (__fmul_rn/__fadd_rn, never contracted), then stores pairs of outputs as 4 bytes. In the 64-token
// tiles the producer warpgroup's three spare warps load those per-tile scales during the K loop
// (scale_helpers), so a few-token launch does not wait for S_w then S_a after it (tenth session:
// down at M = 16 3.98 -> 3.34 µs).
//
// kernels/gemm.c's default runs mt_gemm_large_ts_nBN, outputs through shared memory and TMA
// stores (see run_ts), where it applies, else mt_gemm_large_nBN (v6, per-thread stores; also
// everywhere under MT_LARGE_VARIANT=v6). Opt-in, measured and not faster: MT_LARGE_VARIANT=ra
// (mt_gemm_large_ra_nBN: ts with the activations as 5-bit records decoded into wgmma's A
// registers) and =fq (mt_gemm_large_fq_nBN: ts quantizing the rows past its first wave itself, in
// the producer warpgroup's idle warps). The variants measured and removed (v1: one tile per CTA;
// np; mc: clusters sharing a tile by TMA multicast; m64 of the second session: 64-token tiles
// whose two consumer warpgroups split the channels) are in lab/NOTES.md and git history.
//
// Tested by tests/gpu/test_kernels.c: against mt_ref_gemm (ref/nvfp4.c) within the
// FP32-accumulation bound, and bitwise across M, row positions and the two paths.
// lab/NOTES.md has the measurements.
#include "kernels/gemm_common.cuh"
#include "kernels/quant.cuh"
#include "kernels/wgmma.cuh"
#include "kernels/wgmma_rs.cuh"

// Named barriers and TMA stores (sm_90a; TMA and bulk loads, mbarriers and descriptors are in
// gemm_common.cuh)

// A barrier among the 128 threads of one consumer warpgroup (id 0 is __syncthreads').
__device__ static inline void warpgroup_sync(int id) { asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory"); }

// TMA stores (the ts variant): a box from shared memory to global, grouped; the shared memory may be
// written again once wait_read says the group has read it. Ordinary stores to shared memory that a
// TMA store reads need fence_async_shared in each writing thread first (HOPPER.md).
__device__ static inline void tma_store_2d(const CUtensorMap *map, const void *src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(map),
               "r"(smem_u32(src)), "r"(c0), "r"(c1)
               : "memory");
}
__device__ static inline void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
__device__ static inline void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
__device__ static inline void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
__device__ static inline void fence_async_shared() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// A from registers (the ra variant: widths 128, 192, 256).
template <int BN> __device__ static inline void wgmma_rs_step(float *d, const uint32_t (&a)[4], uint64_t db) {
  if constexpr (BN == 256)
    mt_wgmma_rs_m64n256k16(d, a, db);
  else if constexpr (BN == 192)
    mt_wgmma_rs_m64n192k16(d, a, db);
  else
    mt_wgmma_rs_m64n128k16(d, a, db);
}

// Marks in the K loop and the producer, for scripts/probe_kloop.cu (which defines MT_LARGE_MARK
// before including this file); nothing in the library: slot 0-2 a consumer's K block (before its
// stage is full, after, after the previous group completed), 3-4 the producer's (before the stage
// is free, after), 5 the phases of run's first tile (the consumer's 0 entry, 1 K loop done, 2 tile
// stored, 3 epilogue scales there, 7 past the CTA's barrier; the producer's 4 start, 5 first
// weight loads issued, 6 first activation loads issued).
#ifndef MT_LARGE_MARK
#define MT_LARGE_MARK(slot, i)
#endif

namespace large {
constexpr int BM = MT_LARGE_BM, BK = MT_LARGE_BK;
constexpr int A_BYTES = BM * BK * 2;

// Output element types as template parameters: a pair of adjacent outputs is one 4-byte word.
template <typename OUT> __device__ static __forceinline__ uint32_t pack2(float lo, float hi);
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi); // each half rounded as __float2bfloat16_rn
  uint32_t u;
  __builtin_memcpy(&u, &h, 4);
  return u;
}
template <> __device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  uint32_t u;
  __builtin_memcpy(&u, &h, 4);
  return u;
}
__device__ static __forceinline__ float to_float(__nv_bfloat16 h) { return __bfloat162float(h); }
__device__ static __forceinline__ float to_float(__half h) { return __half2float(h); }
template <typename OUT> __device__ static __forceinline__ float2 unpack2(uint32_t u) {
  OUT h[2];
  __builtin_memcpy(h, &u, 4);
  return make_float2(to_float(h[0]), to_float(h[1]));
}
template <typename OUT> __device__ static __forceinline__ OUT from_float(float v);
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// What a consumer warpgroup keeps per tile in shared memory: 1/S_w of the tile's columns (when S_w
// is per row) and the bias as floats (exact from any of its types).
template <int BN> struct columns {
  float inv_w[BN];
  float bias[BN];
};

// Columns first, first + stride, ... of cols for the tile at n0 (only what the call has).
template <int BN>
__device__ static void fill_columns(const mt_epilogue_args &e, columns<BN> *cols, int n0, int first, int stride) {
  for (int c = first; c < BN && n0 + c < e.n; c += stride) {
    if (e.sw_row) cols->inv_w[c] = inv_row(e.sw, 1, n0 + c);
    if (e.bias) cols->bias[c] = load_elem(e.bias, n0 + c, e.biastype);
  }
}

// Fill cols for the tile at n0 by the consumer warpgroup; its barrier before keeps the previous
// tile's readers, the one after this tile's.
template <int BN> __device__ static void prepare_columns(const mt_epilogue_args &e, columns<BN> *cols, int n0, int cw) {
  if (!e.sw_row && !e.bias) return;
  warpgroup_sync(1 + cw);
  fill_columns<BN>(e, cols, n0, threadIdx.x % 128, 128);
  warpgroup_sync(1 + cw);
}

// 1/S_w where it is one value (per tensor); unused (0) where it is per column.
__device__ static __forceinline__ float inv_w_one(const mt_epilogue_args &e) {
  return e.sw_row ? 0.0f : inv_row(e.sw, 0, 0);
}

// The outputs of one consumer warpgroup: 64 tokens from row0 by BN channels from n0 (its part of
// the tile); d[4c + 2i + j] is row 16w + g + 8i, column 8c + 2q + j (wgmma.cuh). Per element exactly epilogue() of
// gemm_common.cuh: t = (acc * ((1/S_a) * (1/S_w))) * alpha, + beta * c, + bias, one rounding each.
// SW_ROW: 1/S_w per column from shared memory, else one value; EXTRA: C or a bias exist; FULL:
// all BN columns exist (no column checks).
// ROWS (the 64-token tiles): 1/S_a of the tile's rows comes from shared memory (inv_a_rows, filled
// during the K loop by scale_helpers), not from a global load after it; the same value.
// STAGED (the ts variant): the outputs go as BF16/FP16 pairs into `stage` instead, BN / 64 boxes
// of 64 rows x 128 bytes in the 128B-swizzled layout a TMA store reads (16-byte chunk c of row r
// at chunk c ^ (r % 8)); columns past N keep stale values that the store clips.
template <int BN, typename OUT, bool SW_ROW, bool EXTRA, bool FULL, bool STAGED = false, bool ROWS = false>
__device__ static __forceinline__ void store_tile(const mt_epilogue_args &e, const float *d, int row0, int n0,
                                                  const columns<BN> *cols, float inv_w, uint8_t *stage = nullptr,
                                                  const float *inv_a_rows = nullptr) {
  const int t = threadIdx.x % 128, w = t / 32, g = (t % 32) / 4, q = t % 4;
  const int avail = e.n - n0 - 2 * q; // this thread's column 8c + j exists when 8c + j < avail
  const float alpha = e.alpha, beta = e.beta;
  const OUT *cmat = (const OUT *)e.c;
#pragma unroll
  for (int i = 0; i < 2; i++) {
    int row = row0 + 16 * w + g + 8 * i;
    if (row >= e.m) continue;
    float inv_a = ROWS ? inv_a_rows[16 * w + g + 8 * i] : inv_row(e.sa, e.sa_row, row);
    float scale = __fmul_rn(inv_a, inv_w); // used when !SW_ROW
    OUT *y = (OUT *)e.y + (long long)row * e.ldy + n0 + 2 * q;
    const OUT *c = EXTRA && cmat ? cmat + (long long)row * e.ldc + n0 + 2 * q : nullptr;
#pragma unroll
    for (int cb = 0; cb < BN / 8; cb++) {
      const int at = 8 * cb, lc = 8 * cb + 2 * q; // offset from y, column within the tile
      if (!FULL && at >= avail) continue;
      const bool pair = FULL || at + 1 < avail;
      float s0 = scale, s1 = scale;
      if constexpr (SW_ROW) {
        float2 iw = *(const float2 *)&cols->inv_w[lc];
        s0 = __fmul_rn(inv_a, iw.x);
        s1 = __fmul_rn(inv_a, iw.y);
      }
      float v0 = __fmul_rn(__fmul_rn(d[4 * cb + 2 * i], s0), alpha);
      float v1 = __fmul_rn(__fmul_rn(d[4 * cb + 2 * i + 1], s1), alpha);
      if constexpr (EXTRA) {
        if (c) {
          float2 cv;
          if (pair)
            cv = unpack2<OUT>(*(const uint32_t *)(c + at));
          else
            cv = make_float2(to_float(c[at]), 0.0f);
          v0 = __fadd_rn(v0, __fmul_rn(beta, cv.x));
          v1 = __fadd_rn(v1, __fmul_rn(beta, cv.y));
        }
        if (e.bias) {
          float2 b = *(const float2 *)&cols->bias[lc];
          v0 = __fadd_rn(v0, b.x);
          v1 = __fadd_rn(v1, b.y);
        }
      }
      if constexpr (STAGED)
        *(uint32_t *)(stage + cb / 8 * 8192 + (16 * w + g + 8 * i) * 128 + ((cb % 8 ^ g) << 4) + 4 * q) =
            pack2<OUT>(v0, v1);
      else if (pair)
        *(uint32_t *)(y + at) = pack2<OUT>(v0, v1);
      else
        y[at] = from_float<OUT>(v0);
    }
  }
}

template <int BN, typename OUT, bool STAGED = false, bool ROWS = false>
__device__ static __forceinline__ void store_tile_as(const mt_epilogue_args &e, const float *d, int row0, int n0,
                                                     const columns<BN> *cols, float inv_w, uint8_t *stage = nullptr,
                                                     const float *inv_a_rows = nullptr) {
  const bool extra = e.c || e.bias, full = n0 + BN <= e.n;
  const float *ia = inv_a_rows;
  if (e.sw_row) {
    if (extra)
      store_tile<BN, OUT, true, true, false, STAGED, ROWS>(e, d, row0, n0, cols, inv_w, stage, ia);
    else if (full)
      store_tile<BN, OUT, true, false, true, STAGED, ROWS>(e, d, row0, n0, cols, inv_w, stage, ia);
    else
      store_tile<BN, OUT, true, false, false, STAGED, ROWS>(e, d, row0, n0, cols, inv_w, stage, ia);
  } else {
    if (extra)
      store_tile<BN, OUT, false, true, false, STAGED, ROWS>(e, d, row0, n0, cols, inv_w, stage, ia);
    else if (full)
      store_tile<BN, OUT, false, false, true, STAGED, ROWS>(e, d, row0, n0, cols, inv_w, stage, ia);
    else
      store_tile<BN, OUT, false, false, false, STAGED, ROWS>(e, d, row0, n0, cols, inv_w, stage, ia);
  }
}

// A consumer warpgroup's position in the ring of stages, carried across its tiles.
struct ring {
  int s;          // stage
  uint32_t phase; // parity of the stage's current use
};

// The wgmmas of NB 64-wide K blocks of a stage, in K order. Always all of them: a branch between
// wgmmas (to skip a block past k) made ptxas commit an empty group after the merge, so that
// wait_group 1 then waited for the real one. a_sub16: the distance of a stage's A blocks / 16.
template <int WN, int NB, int B_SUB>
__device__ static __forceinline__ void wgmma_blocks(float *d, uint64_t da, uint64_t db, uint32_t a_sub16) {
#pragma unroll
  for (int j = 0; j < NB; j++)
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++) wgmma_step<WN>(d, da + j * a_sub16 + 2 * kk, db + j * (B_SUB >> 4) + 2 * kk);
}

// The K loop of one consumer warpgroup over one tile: per stage, wait for it, issue its k16 wgmmas
// (four per 64-wide block, KS blocks a stage) as one group, wait until the previous group is
// complete and give its stage back to the producer. kt64: the tile's 64-wide blocks; a_sub16 and
// B_SUB: the offsets of a stage's second A and B blocks (KS = 2; a_sub16 / 16 bytes). da0 and db0
// describe the warpgroup's A and B tiles in stage 0; a stage's descriptors are those plus the
// stage's offset / 16 (the start address field, bits 0-13, holds addr / 16 < 2^14 for any shared
// address, so the add never carries out of it), and a k16 step inside the 128-byte row adds 2.
// The descriptors stay in uniform registers: nothing between two wgmmas but the adds.
template <int WN, int S, int SB, int KS = 1, int B_SUB = 0>
__device__ static __forceinline__ void k_loop(float *d, uint64_t *full, uint64_t *empty, uint64_t da0, uint64_t db0,
                                              int kt64, ring &r, uint32_t a_sub16 = 0) {
  int prev = 0;
  const int kt = (kt64 + KS - 1) / KS;
  for (int kb = 0; kb < kt; kb++) {
    MT_LARGE_MARK(0, kb);
    mbar_wait(&full[r.s], r.phase);
    MT_LARGE_MARK(1, kb);
    const uint64_t off = (uint64_t)(r.s * (SB >> 4));
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    wgmma_blocks<WN, KS, B_SUB>(d, da0 + off, db0 + off, a_sub16);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    MT_LARGE_MARK(2, kb);
    if (kb > 0 && threadIdx.x % 32 == 0) mbar_arrive(&empty[prev]);
    prev = r.s;
    if (++r.s == S) {
      r.s = 0;
      r.phase ^= 1;
    }
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  if (threadIdx.x % 32 == 0) mbar_arrive(&empty[prev]);
}

// The ra variant's A operand: the A fragments of one 64-wide K step for this warp's 16 tokens
// (wgmma with A from registers: per warp the mma.sync m16n8k16 A layout), decoded from the stage's
// records (gemm_args.h, MT_ACT_REC_BYTES: column pair P = 2kb + pl, row group h at (pl * 16 + h) *
// 160). cp and sp point at this lane's code word and its row's scale word in the record of the
// warp's first row group (tokens g; the next record holds tokens g + 8). k16 step kk = 2 pl + hs
// takes the low (hs = 0: block 2P) or high half of the code word and of the scale word. hi0, lo0:
// weight_frag's table words, in registers.
__device__ static __forceinline__ void decode_a(const uint8_t *cp, const uint8_t *sp, uint32_t (&A)[4][4], uint32_t hi0,
                                                uint32_t lo0) {
#pragma unroll
  for (int pl = 0; pl < 2; pl++) {
    const int o = pl * (MT_ACT_BAND / 8) * MT_FRAG_REC;
    const uint32_t w0 = *(const uint32_t *)(cp + o), w1 = *(const uint32_t *)(cp + o + MT_FRAG_REC);
    const uint32_t s0 = *(const uint32_t *)(sp + o), s1 = *(const uint32_t *)(sp + o + MT_FRAG_REC);
#pragma unroll
    for (int hs = 0; hs < 2; hs++) {
      const uint32_t sel = hs ? 0x3232 : 0x1010;
      weight_frag(hs ? w0 >> 16 : w0, __byte_perm(s0, 0, sel), A[2 * pl + hs][0], A[2 * pl + hs][2], hi0, lo0);
      weight_frag(hs ? w1 >> 16 : w1, __byte_perm(s1, 0, sel), A[2 * pl + hs][1], A[2 * pl + hs][3], hi0, lo0);
    }
  }
}

// Keeps the compiler from moving the A registers' computation across the wgmma.fence after it.
__device__ static __forceinline__ void fence_operands(uint32_t (&A)[4][4]) {
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++) asm volatile("" : "+r"(A[i][j])::"memory");
}

// The K loop of the ra variant: k_loop with A decoded into registers. Step kb decodes its A into
// register set kb % 2 while step kb - 1's group may still run (its wgmmas read the other set); the
// wait_group 1 after issuing step kb completes step kb - 1's group, so the set step kb + 1 writes
// is free (the PTX ISA's rule for A in registers), and its stage is given back. B is at the
// stage's start (db0), the records after it (cp, sp: this thread's words in stage 0). tabs: the
// two table words of weight_frag, read from shared memory so that they stay in registers (as
// constants ptxas copied them from uniform registers before each use: ~16 MOV a step).
template <int BN, int S, int SB>
__device__ static __forceinline__ void k_loop_ra(float *d, uint64_t *full, uint64_t *empty, const uint8_t *cp,
                                                 const uint8_t *sp, uint64_t db0, int kt, ring &r,
                                                 const uint32_t *tabs) {
  uint32_t a0[4][4], a1[4][4];
  const uint32_t hi0 = tabs[0], lo0 = tabs[1];
  int prev = 0;
  auto step = [&](uint32_t(&A)[4][4], int kb) {
    mbar_wait(&full[r.s], r.phase);
    decode_a(cp + r.s * SB, sp + r.s * SB, A, hi0, lo0);
    fence_operands(A);
    const uint64_t off = (uint64_t)(r.s * (SB >> 4));
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++) wgmma_rs_step<BN>(d, A[kk], db0 + off + 2 * kk);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    fence_operands(A);
    if (kb > 0 && threadIdx.x % 32 == 0) mbar_arrive(&empty[prev]);
    prev = r.s;
    if (++r.s == S) {
      r.s = 0;
      r.phase ^= 1;
    }
  };
  int kb = 0;
  for (; kb + 1 < kt; kb += 2) {
    step(a0, kb);
    step(a1, kb + 1);
  }
  if (kb < kt) step(a0, kb);
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  if (threadIdx.x % 32 == 0) mbar_arrive(&empty[prev]);
}

// The fq variant's hand-over between the warps that quantize rows and the producers of other CTAs:
// a row's xhat and S_a are plain stores, published per band by a release add after the proxy fence
// (TMA, the async proxy, reads them); a producer takes a band by an acquire load and the same
// fence before its TMA loads. The consumers read S_a with plain loads after waiting on a stage the
// producer filled after its acquire: quantizer's release (gpu) -> producer's acquire (gpu) ->
// producer's mbarrier arrive (release, cta, by default) -> consumers' try_wait (acquire, cta), a
// chain that orders the S_a stores before those loads (PTX memory model: causality order is
// transitive); the acquire also invalidated this SM's L1, so no stale line is read. A CTA's first
// tile, whose first stages are armed before any acquire, lies in the first wave: quantized by the
// kernel before, ordered by the consumers' own griddepcontrol.wait.
__device__ static inline uint32_t ld_acquire(const uint32_t *p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ static inline void red_release_add(uint32_t *p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}
__device__ static inline void fence_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

// Until the rows of the band at m0 are quantized (at once for the rows the kernel before did).
__device__ static void wait_band(const mt_large_args &a, int m0) {
  if (m0 < a.fq_r0) return;
  const uint32_t need = (uint32_t)min(BM, a.e.m - m0);
  while (ld_acquire(&a.fq_sync[1 + m0 / BM]) < need) __nanosleep(64);
  fence_async_global();
}

// The pieces of a row's quantization by one warp, bit for bit the per-row kernel of quant.cu (the
// same mt_q steps); lane l takes blocks l, l + 32, ...: block b of row xrow (16 elements, 32 bytes);
// the row's S from the lanes' amax bits, written by lane 0; block b of xhat from its elements
// (zeros where S is NaN: NaN or Inf in the row, whose NaN S makes its outputs NaN).
__device__ static __forceinline__ void load_block(const uint4 *xrow, int b, uint32_t (&w)[8]) {
  const uint4 v0 = xrow[2 * b], v1 = xrow[2 * b + 1];
  w[0] = v0.x, w[1] = v0.y, w[2] = v0.z, w[3] = v0.w, w[4] = v1.x, w[5] = v1.y, w[6] = v1.z, w[7] = v1.w;
}

__device__ static __forceinline__ float row_scale(const mt_large_args &a, int r, int lane, uint32_t amax) {
  const float S = mt_q::outer_scale(__uint_as_float(__reduce_max_sync(0xffffffffu, amax)));
  if (lane == 0) a.fq_outer[r] = S;
  return S;
}

template <bool FP16>
__device__ static __forceinline__ void store_block(uint4 *dst, int b, const uint32_t (&w)[8], bool bad, float s_over_6,
                                                   float inv_s) {
  uint32_t xh[8] = {0, 0, 0, 0, 0, 0, 0, 0}, cd[2];
  if (!bad) mt_q::block<FP16, false>(w, mt_q::block_amax_bits<FP16>(w), s_over_6, inv_s, xh, cd);
  dst[2 * b] = make_uint4(xh[0], xh[1], xh[2], xh[3]);
  dst[2 * b + 1] = make_uint4(xh[4], xh[5], xh[6], xh[7]);
}

__device__ static __forceinline__ const uint4 *x_row(const mt_large_args &a, int r) {
  return (const uint4 *)((const char *)a.fq_x + (size_t)r * (size_t)a.fq_ldx * 2);
}
__device__ static __forceinline__ uint4 *xhat_row(const mt_large_args &a, int r) {
  return (uint4 *)(a.fq_xhat + (size_t)r * (size_t)a.e.k);
}

// Row r in two passes, any k (the fq kernels take it for k > 2048): the row's amax, then its blocks
// again (from L1/L2), holding one block at a time.
template <bool FP16> __device__ static void quantize_row(const mt_large_args &a, int r, int lane) {
  const uint4 *xrow = x_row(a, r);
  const int nblk = a.e.k / 16;
  uint32_t m = 0;
#pragma unroll 2
  for (int b = lane; b < nblk; b += 32) {
    uint32_t w[8];
    load_block(xrow, b, w);
    m = max(m, mt_q::block_amax_bits<FP16>(w));
  }
  const float S = row_scale(a, r, lane, m);
  const bool bad = !(S == S);
  const float s_over_6 = mt_q::S_over_6(S), inv_s = mt_q::inv_S(S);
  uint4 *dst = xhat_row(a, r);
  for (int b = lane; b < nblk; b += 32) {
    uint32_t w[8];
    load_block(xrow, b, w);
    store_block<FP16>(dst, b, w, bad, s_over_6, inv_s);
  }
}

// Row r for k <= 32 * FQ_NB * 16 (2048) in one pass: the lane's blocks held in registers, all its
// loads in flight at once (the two-pass loop waits for ~6 round trips a row).
constexpr int FQ_NB = 4;
template <bool FP16> __device__ static void quantize_row_held(const mt_large_args &a, int r, int lane) {
  const uint4 *xrow = x_row(a, r);
  const int nblk = a.e.k / 16;
  uint32_t w[FQ_NB][8], m = 0;
#pragma unroll
  for (int j = 0; j < FQ_NB; j++) {
    const int b = lane + 32 * j;
    if (b < nblk)
      load_block(xrow, b, w[j]);
    else
      for (int i = 0; i < 8; i++) w[j][i] = 0;
  }
#pragma unroll
  for (int j = 0; j < FQ_NB; j++) m = max(m, mt_q::block_amax_bits<FP16>(w[j]));
  const float S = row_scale(a, r, lane, m);
  const bool bad = !(S == S);
  const float s_over_6 = mt_q::S_over_6(S), inv_s = mt_q::inv_S(S);
  uint4 *dst = xhat_row(a, r);
#pragma unroll
  for (int j = 0; j < FQ_NB; j++) {
    const int b = lane + 32 * j;
    if (b >= nblk) break;
    store_block<FP16>(dst, b, w[j], bad, s_over_6, inv_s);
  }
}

// Warps 1-3 of the producer warpgroup and the fourth warpgroup in every CTA: rows fq_r0 .. m-1,
// FQ_GROUP at a time (r0 is a multiple of 128, so a group lies in one band), in the order of a
// shared counter (so bands finish roughly in order, and resident CTAs do the work of any not yet
// running); each group counted into its band once its stores are visible.
constexpr int FQ_GROUP = 4;
__device__ static void quantize_rows(const mt_large_args &a) {
  const int lane = threadIdx.x % 32;
  const bool held = a.e.k <= 32 * FQ_NB * 16;
  grid_dependency_wait(); // the counters were zeroed by the kernel before
  for (;;) {
    uint32_t got = 0;
    if (lane == 0) got = atomicAdd(&a.fq_sync[0], (uint32_t)FQ_GROUP);
    const long long r0 = (long long)__shfl_sync(0xffffffffu, got, 0) + a.fq_r0;
    if (r0 >= a.e.m) return;
    const int rows = (int)min((long long)FQ_GROUP, a.e.m - r0);
    for (int i = 0; i < rows; i++) {
      const int r = (int)r0 + i;
      if (held)
        a.fq_fp16 ? quantize_row_held<true>(a, r, lane) : quantize_row_held<false>(a, r, lane);
      else
        a.fq_fp16 ? quantize_row<true>(a, r, lane) : quantize_row<false>(a, r, lane);
    }
    fence_async_global();
    __syncwarp();
    if (lane == 0) {
      __threadfence();
      red_release_add(&a.fq_sync[1 + r0 / BM], (uint32_t)rows);
    }
  }
}

// The stage ring's barriers, by one thread: "full" completes on the producer's arrival and the
// stage's bytes, "empty" on `consumers` arrivals (one per consumer warp: 8); the fence makes them visible
// to the async proxy (TMA).
template <int S> __device__ static __forceinline__ void init_ring(uint64_t *full, uint64_t *empty, int consumers) {
  for (int s = 0; s < S; s++) {
    mbar_init(&full[s], 1);
    mbar_init(&empty[s], consumers);
  }
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// The producer thread of a persistent CTA: the weight tiles of the first stages before waiting for
// the activations' quantization (griddepcontrol.wait), then the ring over this CTA's tiles (tile =
// blockIdx.x, + gridDim.x, ...) and each tile's K blocks in order. k-block number `it` counts on
// across the tiles: stage it % S, phase (it / S) & 1. A stage holds the TM-row activation tile
// (TM * 128 bytes), then the BN-row weight tile; of the last band's activation tile only
// a.last_rows rows are loaded (ta_last, gemm_args.h): the zero fill of the other rows cost
// DeepSeek's shapes up to half their time at M = 16 (lab/NOTES.md, fifth session).
// FQ: the activation tile of a band only once its rows are quantized (wait_band).
// KS = 2 (the 64-token tiles): a stage holds two 64-wide K blocks, A blocks then W blocks, so that a
// consumer's wait and release per stage (~190 cycles, scripts/probe_kloop.cu) come once per 128
// columns. Where k / 64 is odd the last stage's second block lies wholly past k: TMA fills it with
// zeros and its k16 steps add +0 to each accumulator, which changes no bits (an accumulator that
// starts at +0 is never -0 in round-to-nearest, and NaN and Inf stay), as the zero columns of a
// block past k always did. tests/gpu/test_kernels.c runs it at k = 2080 against the reference
// (gemm_accuracy) and bitwise against the small kernels at k = 944 (gemm_paths_agree).
// Stage kb's KS blocks of one operand from `row` into dst, blocks `step` bytes apart: a box a block,
// or with KP (the maps of rank 3) one box for all, an activation box's blocks then its rows apart.
template <int KS, bool KP>
__device__ static __forceinline__ void load_stage(uint8_t *dst, const CUtensorMap *map, uint64_t *bar, int kb, int row,
                                                  int step) {
  if constexpr (KP)
    tma_load_3d(dst, map, bar, 0, row, kb * KS);
  else
    for (int j = 0; j < KS; j++) tma_load_2d(dst + j * step, map, bar, (kb * KS + j) * BK, row);
}

template <int S, int SB, int BN, bool FQ = false, int TM = BM, int KS = 1, bool KP = false>
__device__ static __forceinline__ void produce(const mt_large_args &a, uint8_t *smem, uint64_t *full, uint64_t *empty,
                                               int tiles, int tiles_n, int kt64) {
  constexpr int A_TILE = TM * BK * 2, W_TILE = BN * BK * 2;
  const int kt = (kt64 + KS - 1) / KS;
  const int pre = kt < S ? kt : S, n_first = (int)blockIdx.x % tiles_n * BN, m_first = (int)blockIdx.x / tiles_n * TM;
  // the band at m0's activation map and what a block's two loads deliver for it
  const int m_last = (a.e.m - 1) / TM * TM;
  const uint32_t tx = (uint32_t)(A_TILE + W_TILE), tx_last = (uint32_t)(a.last_rows * BK * 2 + W_TILE);
  auto act = [&](int m0) { return m0 == m_last ? &a.ta_last : &a.ta; };
  MT_LARGE_MARK(5, 4);
  for (int kb = 0; kb < pre; kb++) {
    mbar_arrive_expect_tx(&full[kb], KS * (m_first == m_last ? tx_last : tx));
    load_stage<KS, KP>(smem + kb * SB + KS * A_TILE, &a.tw, &full[kb], kb, n_first, W_TILE);
  }
  MT_LARGE_MARK(5, 5);
  grid_dependency_wait();
  if (FQ) wait_band(a, m_first);
  for (int kb = 0; kb < pre; kb++) load_stage<KS, KP>(smem + kb * SB, act(m_first), &full[kb], kb, m_first, A_TILE);
  MT_LARGE_MARK(5, 6);
  int it = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int m0 = tile / tiles_n * TM, n0 = tile % tiles_n * BN;
    if (FQ && tile != (int)blockIdx.x) wait_band(a, m0);
    const CUtensorMap *ta = act(m0);
    const uint32_t bytes = m0 == m_last ? tx_last : tx;
    for (int kb = 0; kb < kt; kb++, it++) {
      if (it < pre) // issued above (the first tile)
        continue;
      const int s = it % S;
      MT_LARGE_MARK(3, it);
      mbar_wait(&empty[s], ((it / S) & 1) ^ 1);
      MT_LARGE_MARK(4, it);
      uint8_t *sa = smem + s * SB, *sw = sa + KS * A_TILE;
      mbar_arrive_expect_tx(&full[s], KS * bytes);
      if constexpr (KP) {
        load_stage<KS, KP>(sa, ta, &full[s], kb, m0, A_TILE);
        load_stage<KS, KP>(sw, &a.tw, &full[s], kb, n0, W_TILE);
      } else { // block by block, A then W (the order these kernels were measured with)
        for (int j = 0; j < KS; j++) {
          tma_load_2d(sa + j * A_TILE, ta, &full[s], (kb * KS + j) * BK, m0);
          tma_load_2d(sw + j * W_TILE, &a.tw, &full[s], (kb * KS + j) * BK, n0);
        }
      }
    }
  }
}

// The producer of the ra variant: produce with the stage's weight tile first (TMA, swizzled) and
// the 128 tokens' records after it, one bulk copy of 5120 contiguous bytes (gemm_args.h: band
// m0 / 128, column pairs 2kb and 2kb + 1).
template <int S, int SB, int BN>
__device__ static __forceinline__ void produce_ra(const mt_large_args &a, uint8_t *smem, uint64_t *full,
                                                  uint64_t *empty, int tiles, int tiles_n, int kt) {
  constexpr int WT = BN * BK * 2, RB = MT_LARGE_RA_A_BYTES;
  auto records = [&](int m0, int kb) { return a.ra + ((size_t)(m0 / BM) * kt + kb) * RB; };
  const int pre = kt < S ? kt : S, n_first = (int)blockIdx.x % tiles_n * BN, m_first = (int)blockIdx.x / tiles_n * BM;
  for (int kb = 0; kb < pre; kb++) {
    mbar_arrive_expect_tx(&full[kb], SB);
    tma_load_2d(smem + kb * SB, &a.tw, &full[kb], kb * BK, n_first);
  }
  grid_dependency_wait();
  for (int kb = 0; kb < pre; kb++) bulk_load(smem + kb * SB + WT, records(m_first, kb), RB, &full[kb]);
  int it = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int m0 = tile / tiles_n * BM, n0 = tile % tiles_n * BN;
    for (int kb = 0; kb < kt; kb++, it++) {
      if (it < pre) // issued above (the first tile)
        continue;
      const int s = it % S;
      mbar_wait(&empty[s], ((it / S) & 1) ^ 1);
      uint8_t *sw = smem + s * SB;
      mbar_arrive_expect_tx(&full[s], SB);
      tma_load_2d(sw, &a.tw, &full[s], kb * BK, n0);
      bulk_load(sw + WT, records(m0, kb), RB, &full[s]);
    }
  }
}

// The 64-token tiles' epilogue scales, filled during the K loop: 1/S_a of the tile's 64 rows and
// 1/S_w where it is one value (the columns' 1/S_w and bias go into `columns` as prepare_columns
// does), by warps 1-3 of the producer warpgroup, idle otherwise, so that a few-token launch does not
// wait for two dependent global loads (S_w, then S_a) after its K loop. full: the scales of the
// CTA's j-th tile are there (phase j % 2, 96 arrivals); empty: the consumer has stored that tile
// (4 arrivals, one a warp) and the next tile's may overwrite them. The loads below run one after
// another (a shared store between each), which does not matter: the consumer's wait for `full`
// measured <= 64 ns (probe_kloop, mark 5/3), and issuing all four first (next/m64ep-loads) was
// no faster (lab/NOTES.md, tenth session).
struct scales64 {
  uint64_t full, empty;
  float inv_w0;
  float inv_a[64];
};
static_assert(sizeof(scales64) <= 280, "MT_LARGE_SMEM_64 holds 280 bytes of scales64");

template <int BN>
__device__ static void scale_helpers(const mt_large_args &a, columns<BN> *cols, scales64 *sc, int tiles, int tiles_n) {
  const int t = threadIdx.x - 32; // 0 .. 95
  grid_dependency_wait();         // S_a (and in requantize mode S_w) come from the kernels before
  int j = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, j++) {
    const int m0 = tile / tiles_n * 64, n0 = tile % tiles_n * BN;
    if (j > 0) mbar_wait(&sc->empty, (j - 1) & 1);
    fill_columns<BN>(a.e, cols, n0, t, 96);
    for (int r = t; r < 64 && m0 + r < a.e.m; r += 96) sc->inv_a[r] = inv_row(a.e.sa, a.e.sa_row, m0 + r);
    if (t == 0) sc->inv_w0 = inv_w_one(a.e);
    mbar_arrive(&sc->full);
  }
}

// v6 (mt_gemm_large_nBN): the two consumer warpgroups take 64 tokens each of a 128 x BN tile.
// TM = 64 (mt_gemm_large_m64_nBN): one consumer warpgroup, tiles of 64 x BN, for calls whose
// 128-token tiles would leave SMs idle. Every k-block a consumer warpgroup reads its 64 rows of A
// and all of B from shared memory while TMA writes both: at M = 256 the 128 x 64 tiles ran at the
// 128 bytes a clock of shared memory (56 KB a k-block in 451 cycles, lab/probe_feed.cu), and
// at M <= 64 the second warpgroup's reads were of rows no token has (lab/NOTES.md, seventh
// session). Their stages hold two K blocks (KS = MT_LARGE_KS_64): with one, the consumer's
// hand-over per stage (~190 cycles: wait, group wait, release) outlasted a 64 x 32 block's 100
// cycles of wgmma (scripts/probe_kloop.cu, eighth session).
// KP (mt_gemm_large_m64p_nBN; TM = 64): the maps are of rank 3, a box holds a stage's two K blocks
// of an operand (produce), where kernels/gemm.c's mt_gemm_kpair says so.
template <int BN, int TM = BM, bool KP = false> __device__ static void run(const mt_large_args &a) {
  MT_LARGE_MARK(5, 0);
  constexpr int S = TM == BM ? MT_LARGE_STAGES(BN) : MT_LARGE_STAGES_64(BN);
  constexpr int SB = TM == BM ? MT_LARGE_STAGE_BYTES(BN) : MT_LARGE_STAGE_BYTES_64(BN);
  constexpr int KS = TM == BM ? 1 : MT_LARGE_KS_64; // 64-wide K blocks a stage
  extern __shared__ uint8_t smem_raw[];
  // 1024-aligned by an offset on the shared array itself, so the compiler keeps the shared
  // address space (LDS for the column table rather than generic loads)
  uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint64_t *full = (uint64_t *)(smem + S * SB), *empty = full + S;
  columns<BN> *cols_all = (columns<BN> *)(empty + S);
  scales64 *sc = (scales64 *)(cols_all + 1); // TM = 64 only (MT_LARGE_SMEM_64)
  const int tiles_n = (a.e.n + BN - 1) / BN, tiles = (a.e.m + TM - 1) / TM * tiles_n;
  const int kt = (a.e.k + BK - 1) / BK;
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    if constexpr (TM == 64) {
      mbar_init(&sc->full, 96);
      mbar_init(&sc->empty, 4);
    }
    init_ring<S>(full, empty, 4 * (TM / 64));
  }
  __syncthreads();
  MT_LARGE_MARK(5, 7);

  // k-block number `it` counts on across this CTA's tiles: stage it % S, phase (it / S) & 1.
  // Registers: with TM = 64 the launch's 256 threads have enough without moving any (BN / 2
  // accumulators at most 64).
  if (wg == 0) { // producer: one thread keeps the ring of stages full
    if constexpr (TM == BM) asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if constexpr (TM == 64)
      if (threadIdx.x >= 32 && (int)blockIdx.x < tiles) {
        scale_helpers<BN>(a, cols_all, sc, tiles, tiles_n);
        return;
      }
    if (threadIdx.x != 0 || (int)blockIdx.x >= tiles) return;
    produce<S, SB, BN, false, TM, KS, KP>(a, smem, full, empty, tiles, tiles_n, kt);
    return;
  }

  if constexpr (TM == BM) asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  const int cw = __shfl_sync(0xffffffffu, wg - 1, 0); // the same in every lane, known so to the compiler
  columns<BN> *cols = cols_all + cw;
  const uint64_t da0 = desc_sw128(smem_u32(smem) + cw * 64 * 128);
  const uint64_t db0 = desc_sw128(smem_u32(smem) + KS * TM * BK * 2);
  bool waited = false;
  ring r = {0, 0};
  int j = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, j++) {
    const int m0 = tile / tiles_n * TM, n0 = tile % tiles_n * BN, row0 = m0 + 64 * cw;
    float d[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++) d[i] = 0.0f;
    // a stage's second A block: 64 rows on, or with KP the last band's box's rows (produce)
    const int a_rows = KP && m0 == (a.e.m - 1) / TM * TM ? a.last_rows : TM;
    k_loop<BN, S, SB, KS, BN * BK * 2>(d, full, empty, da0, db0, kt, r, a_rows * BK * 2 / 16);
    MT_LARGE_MARK(5, 1);
    if (!waited) { // S_a comes from the quantization too, and C and y may be another kernel's
      grid_dependency_wait();
      waited = true;
    }
    if constexpr (TM == 64) {
      mbar_wait(&sc->full, j & 1);
      MT_LARGE_MARK(5, 3);
      if (a.e.ytype == DT_BF16)
        store_tile_as<BN, __nv_bfloat16, false, true>(a.e, d, row0, n0, cols, sc->inv_w0, nullptr, sc->inv_a);
      else
        store_tile_as<BN, __half, false, true>(a.e, d, row0, n0, cols, sc->inv_w0, nullptr, sc->inv_a);
      __syncwarp();
      if (threadIdx.x % 32 == 0) mbar_arrive(&sc->empty);
    } else {
      prepare_columns<BN>(a.e, cols, n0, cw);
      const float inv_w = inv_w_one(a.e);
      if (a.e.ytype == DT_BF16)
        store_tile_as<BN, __nv_bfloat16>(a.e, d, row0, n0, cols, inv_w);
      else
        store_tile_as<BN, __half>(a.e, d, row0, n0, cols, inv_w);
    }
    MT_LARGE_MARK(5, 2);
  }
}

// The TMA-store kernel (mt_gemm_large_ts_nBN, the default where it applies): v6 with one stage fewer and
// the epilogue writing its outputs into a staging tile in shared memory (64 x BN per consumer
// warpgroup) that one thread then stores by TMA (boxes of 64 x 64, clipped at M and N): full
// 128-byte lines instead of 16-byte pieces from 8 rows per store instruction, and the stores
// overlap the next tile's K loop. Same arithmetic, same bits. The clip at N works in 16-byte
// pieces: at N = 271 device call 3 saw column 271 (the caller's padding) written, so kernels/gemm.c
// runs it only when N % 8 == 0.
// RA (mt_gemm_large_ra_nBN, MT_LARGE_VARIANT=ra): the activations come as 5-bit records
// (gemm_args.h: 5 KB a stage instead of 16 KB of BF16) that each consumer thread decodes into its
// A fragments (k_loop_ra: wgmma with A from registers, the same products, so the same bits); the
// weight tile sits first in a stage (produce_ra).
// FQ (mt_gemm_large_fq_nBN, MT_LARGE_VARIANT=fq): ts with rows fq_r0 .. m-1 of the activations
// quantized inside the kernel (quantize_rows) by warps 1-3 of the producer warpgroup, idle
// otherwise, and by a fourth warpgroup (512 threads: 128 registers a thread at launch, so widths
// 128 and 192 only; kernels/gemm.c), while the consumers of every CTA run the first wave of tiles
// on the rows the quantization kernel before did; the producer takes a band's tiles once it is
// done (wait_band).
template <int BN, bool RA = false, bool FQ = false> __device__ static void run_ts(const mt_large_args &a) {
  constexpr int S = RA ? MT_LARGE_STAGES_RA(BN) : MT_LARGE_STAGES_TS(BN);
  constexpr int SB = RA ? MT_LARGE_STAGE_BYTES_RA(BN) : MT_LARGE_STAGE_BYTES(BN);
  extern __shared__ uint8_t smem_raw[];
  uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint64_t *full = (uint64_t *)(smem + S * SB), *empty = full + S;
  columns<BN> *cols_all = (columns<BN> *)(empty + S);
  uint32_t *tabs = (uint32_t *)(cols_all + 2); // RA: weight_frag's table words (k_loop_ra)
  uint8_t *staging = smem + ((S * SB + 16 * S + 2 * (int)sizeof(columns<BN>) + (RA ? 16 : 0) + 1023) & ~1023);
  const int tiles_n = (a.e.n + BN - 1) / BN, tiles = (a.e.m + BM - 1) / BM * tiles_n;
  const int kt = (a.e.k + BK - 1) / BK;
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    init_ring<S>(full, empty, 8);
    if constexpr (RA) {
      tabs[0] = 0x3F3F3F00u;
      tabs[1] = 0xC0800000u;
    }
  }
  __syncthreads();

  if (wg == 0 || (FQ && wg == 3)) { // wg 3: the fq kernels' fourth warpgroup (MT_LARGE_FQ_THREADS)
    if (FQ) {                       // the row quantizers hold a row of k = 2048 (32 registers) and its loads in flight
      asm volatile("setmaxnreg.dec.sync.aligned.u32 88;\n");
    } else {
      asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    }
    if (FQ && threadIdx.x >= 32) {
      quantize_rows(a);
      return;
    }
    if (threadIdx.x != 0 || (int)blockIdx.x >= tiles) return;
    if constexpr (RA)
      produce_ra<S, SB, BN>(a, smem, full, empty, tiles, tiles_n, kt);
    else
      produce<S, SB, BN, FQ>(a, smem, full, empty, tiles, tiles_n, kt);
    return;
  }

  if (FQ) { // 2 x 128 x 88 + 2 x 128 x 168 = the 512 x 128 registers of the launch
    asm volatile("setmaxnreg.inc.sync.aligned.u32 168;\n");
  } else {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  }
  const int cw = __shfl_sync(0xffffffffu, wg - 1, 0), lead = threadIdx.x % 128 == 0;
  columns<BN> *cols = cols_all + cw;
  uint8_t *stage = staging + cw * 64 * BN * 2;
  const uint64_t da0 = desc_sw128(smem_u32(smem) + cw * 64 * 128);
  const uint64_t db0 = desc_sw128(smem_u32(smem) + (RA ? 0 : A_BYTES));
  // RA: this thread's code word and scale word in the stage-0 record of its warp's first row group
  // (8 cw + 2 w of the band's 16)
  const int lane = threadIdx.x % 32, h0 = 8 * cw + 2 * ((threadIdx.x % 128) / 32);
  const uint8_t *rec0 = smem + BN * BK * 2 + h0 * MT_FRAG_REC;
  const uint8_t *cp = rec0 + 4 * lane, *sp = rec0 + 128 + 4 * (lane / 4);
  bool waited = false;
  ring r = {0, 0};
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int m0 = tile / tiles_n * BM, n0 = tile % tiles_n * BN, row0 = m0 + 64 * cw;
    float d[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++) d[i] = 0.0f;
    if constexpr (RA)
      k_loop_ra<BN, S, SB>(d, full, empty, cp, sp, db0, kt, r, tabs);
    else
      k_loop<BN, S, SB>(d, full, empty, da0, db0, kt, r);
    if (!waited) {
      grid_dependency_wait();
      waited = true;
    }
    if (row0 >= a.e.m) // no rows of this warpgroup exist
      continue;
    prepare_columns<BN>(a.e, cols, n0, cw);
    if (lead) // the previous tile's store has read the staging tile
      bulk_wait_read();
    warpgroup_sync(1 + cw);
    const float inv_w = inv_w_one(a.e);
    if (a.e.ytype == DT_BF16)
      store_tile_as<BN, __nv_bfloat16, true>(a.e, d, row0, n0, cols, inv_w, stage);
    else
      store_tile_as<BN, __half, true>(a.e, d, row0, n0, cols, inv_w, stage);
    fence_async_shared();
    warpgroup_sync(1 + cw);
    if (lead) {
      for (int b = 0; b < BN / 64 && n0 + 64 * b < a.e.n; b++) tma_store_2d(&a.ty, stage + b * 8192, n0 + 64 * b, row0);
      bulk_commit();
    }
  }
  if (lead) bulk_wait_all();
}

} // namespace large

#define MT_LARGE(BN)                                                                                                   \
  extern "C" __global__ void __launch_bounds__(384, 1) mt_gemm_large_n##BN(const __grid_constant__ mt_large_args a) {  \
    large::run<BN>(a);                                                                                                 \
  }
#define MT_LARGE_TS(BN)                                                                                                \
  extern "C" __global__ void __launch_bounds__(384, 1)                                                                 \
      mt_gemm_large_ts_n##BN(const __grid_constant__ mt_large_args a) {                                                \
    large::run_ts<BN>(a);                                                                                              \
  }
MT_LARGE(64)
MT_LARGE(96)
#define MT_LARGE_64(BN)                                                                                                \
  extern "C" __global__ void __launch_bounds__(256, 1)                                                                 \
      mt_gemm_large_m64_n##BN(const __grid_constant__ mt_large_args a) {                                               \
    large::run<BN, 64>(a);                                                                                             \
  }
MT_LARGE_64(32)
MT_LARGE_64(48)
MT_LARGE_64(64)
#define MT_LARGE_64P(BN)                                                                                               \
  extern "C" __global__ void __launch_bounds__(256, 1)                                                                 \
      mt_gemm_large_m64p_n##BN(const __grid_constant__ mt_large_args a) {                                              \
    large::run<BN, 64, true>(a);                                                                                       \
  }
MT_LARGE_64P(32)
MT_LARGE_64P(48)
MT_LARGE_64P(64)
MT_LARGE(128)
MT_LARGE(192)
MT_LARGE(256)
MT_LARGE_TS(128)
MT_LARGE_TS(192)
MT_LARGE_TS(256)
#define MT_LARGE_RA(BN)                                                                                                \
  extern "C" __global__ void __launch_bounds__(384, 1)                                                                 \
      mt_gemm_large_ra_n##BN(const __grid_constant__ mt_large_args a) {                                                \
    large::run_ts<BN, true>(a);                                                                                        \
  }
MT_LARGE_RA(128)
MT_LARGE_RA(192)
MT_LARGE_RA(256)
#define MT_LARGE_FQ(BN)                                                                                                \
  extern "C" __global__ void __launch_bounds__(MT_LARGE_FQ_THREADS, 1)                                                 \
      mt_gemm_large_fq_n##BN(const __grid_constant__ mt_large_args a) {                                                \
    large::run_ts<BN, false, true>(a);                                                                                 \
  }
MT_LARGE_FQ(128)
MT_LARGE_FQ(192)
