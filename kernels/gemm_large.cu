// gemm_large.cu — the large-M path of the W4A4 GEMM (mt_gemm_large_nBN).
// y[m][n] = x[m][k] . W[n][k]^T on NVFP4 operands, exactly, through BF16 wgmma with FP32
// accumulation.
//
// Exactness (docs/numerics.md, "Why BF16 tensor cores compute NVFP4 exactly on Hopper"): every
// dequantized element e2m1 * e4m3 is exact in BF16 and every product of two is exact in FP32, so
// the tensor cores compute the NVFP4 products exactly; the outer scales are applied in the
// epilogue, in the order of gemm_args.h. Tiles of 128 tokens x BN
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
// (scale_helpers), so a few-token launch does not wait for S_w then S_a after it (lab/NOTES.md,
// "Epilogue scales during the K loop").
//
// Tested by tests/gpu/test_kernels.c: against mt_ref_gemm (ref/nvfp4.c) within the
// FP32-accumulation bound, and bitwise across M, row positions and the two paths.
// lab/NOTES.md has the measurements.
#include "kernels/gemm_common.cuh"
#include "kernels/quant.cuh"
#include "kernels/wgmma.cuh"

// Named barriers and TMA stores (sm_90a; TMA and bulk loads, mbarriers and descriptors are in
// gemm_common.cuh)

// A barrier among the 128 threads of one consumer warpgroup (id 0 is __syncthreads').
__device__ static inline void warpgroup_sync(int id) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(id) : "memory");
}

// TMA stores (the ts variant): a box from shared memory to global, grouped; the shared memory may
// be written again once wait_read says the group has read it. Ordinary stores to shared memory that
// a TMA store reads need fence_async_shared in each writing thread first (the PTX ISA's async
// proxy).
__device__ static inline void tma_store_2d(const CUtensorMap *map, const void *src, int c0,
                                           int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(map),
      "r"(smem_u32(src)), "r"(c0), "r"(c1)
      : "memory");
}
__device__ static inline void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
__device__ static inline void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
__device__ static inline void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}
__device__ static inline void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

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
template <> __device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}

// What a consumer warpgroup keeps per tile in shared memory: 1/S_w of the tile's columns (when S_w
// is per row) and the bias as floats (exact from any of its types).
template <int BN> struct columns {
  float inv_w[BN];
  float bias[BN];
};

// Columns first, first + stride, ... of cols for the tile at n0 (only what the call has).
template <int BN>
__device__ static void fill_columns(const mt_epilogue_args &e, columns<BN> *cols, int n0, int first,
                                    int stride) {
  for (int c = first; c < BN && n0 + c < e.n; c += stride) {
    if (e.sw_row)
      cols->inv_w[c] = inv_row(e.sw, 1, n0 + c);
    if (e.bias)
      cols->bias[c] = load_elem(e.bias, n0 + c, e.biastype);
  }
}

// Fill cols for the tile at n0 by the consumer warpgroup; its barrier before keeps the previous
// tile's readers, the one after this tile's.
template <int BN>
__device__ static void prepare_columns(const mt_epilogue_args &e, columns<BN> *cols, int n0,
                                       int cw) {
  if (!e.sw_row && !e.bias)
    return;
  warpgroup_sync(1 + cw);
  fill_columns<BN>(e, cols, n0, threadIdx.x % 128, 128);
  warpgroup_sync(1 + cw);
}

// 1/S_w where it is one value (per tensor); unused (0) where it is per column.
__device__ static __forceinline__ float inv_w_one(const mt_epilogue_args &e) {
  return e.sw_row ? 0.0f : inv_row(e.sw, 0, 0);
}

// The outputs of one consumer warpgroup: 64 tokens from row0 by BN channels from n0 (its part of
// the tile); d[4c + 2i + j] is row 16w + g + 8i, column 8c + 2q + j (wgmma.cuh). Per element
// exactly epilogue() of gemm_common.cuh: t = (acc * ((1/S_a) * (1/S_w))) * alpha, + beta * c,
// + bias, one rounding each. SW_ROW: 1/S_w per column from shared memory, else one value; EXTRA: C
// or a bias exist; FULL: all BN columns exist (no column checks).
// ROWS (the 64-token tiles): 1/S_a of the tile's rows comes from shared memory (inv_a_rows, filled
// during the K loop by scale_helpers), not from a global load after it; the same value.
// STAGED (the ts variant): the outputs go as BF16/FP16 pairs into `stage` instead, BN / 64 boxes
// of 64 rows x 128 bytes in the 128B-swizzled layout a TMA store reads (16-byte chunk c of row r
// at chunk c ^ (r % 8)); columns past N keep stale values that the store clips.
template <int BN, typename OUT, bool SW_ROW, bool EXTRA, bool FULL, bool STAGED = false,
          bool ROWS = false>
__device__ static __forceinline__ void
store_tile(const mt_epilogue_args &e, const float *d, int row0, int n0, const columns<BN> *cols,
           float inv_w, uint8_t *stage = nullptr, const float *inv_a_rows = nullptr) {
  const int t = threadIdx.x % 128, w = t / 32, g = (t % 32) / 4, q = t % 4;
  const int avail = e.n - n0 - 2 * q; // this thread's column 8c + j exists when 8c + j < avail
  const float alpha = e.alpha, beta = e.beta;
  const OUT *cmat = (const OUT *)e.c;
#pragma unroll
  for (int i = 0; i < 2; i++) {
    int row = row0 + 16 * w + g + 8 * i;
    if (row >= e.m)
      continue;
    float inv_a = ROWS ? inv_a_rows[16 * w + g + 8 * i] : inv_row(e.sa, e.sa_row, row);
    float scale = __fmul_rn(inv_a, inv_w); // used when !SW_ROW
    OUT *y = (OUT *)e.y + (long long)row * e.ldy + n0 + 2 * q;
    const OUT *c = EXTRA && cmat ? cmat + (long long)row * e.ldc + n0 + 2 * q : nullptr;
#pragma unroll
    for (int cb = 0; cb < BN / 8; cb++) {
      const int at = 8 * cb, lc = 8 * cb + 2 * q; // offset from y, column within the tile
      if (!FULL && at >= avail)
        continue;
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
        *(uint32_t *)(stage + cb / 8 * 8192 + (16 * w + g + 8 * i) * 128 + ((cb % 8 ^ g) << 4) +
                      4 * q) = pack2<OUT>(v0, v1);
      else if (pair)
        *(uint32_t *)(y + at) = pack2<OUT>(v0, v1);
      else
        y[at] = from_float<OUT>(v0);
    }
  }
}

template <int BN, typename OUT, bool STAGED = false, bool ROWS = false>
__device__ static __forceinline__ void
store_tile_as(const mt_epilogue_args &e, const float *d, int row0, int n0, const columns<BN> *cols,
              float inv_w, uint8_t *stage = nullptr, const float *inv_a_rows = nullptr) {
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
      store_tile<BN, OUT, false, false, false, STAGED, ROWS>(e, d, row0, n0, cols, inv_w, stage,
                                                             ia);
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
__device__ static __forceinline__ void wgmma_blocks(float *d, uint64_t da, uint64_t db,
                                                    uint32_t a_sub16) {
#pragma unroll
  for (int j = 0; j < NB; j++)
#pragma unroll
    for (int kk = 0; kk < BK / 16; kk++)
      wgmma_step<WN>(d, da + j * a_sub16 + 2 * kk, db + j * (B_SUB >> 4) + 2 * kk);
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
__device__ static __forceinline__ void k_loop(float *d, uint64_t *full, uint64_t *empty,
                                              uint64_t da0, uint64_t db0, int kt64, ring &r,
                                              uint32_t a_sub16 = 0) {
  int prev = 0;
  const int kt = (kt64 + KS - 1) / KS;
  for (int kb = 0; kb < kt; kb++) {
    mbar_wait(&full[r.s], r.phase);
    const uint64_t off = (uint64_t)(r.s * (SB >> 4));
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    wgmma_blocks<WN, KS, B_SUB>(d, da0 + off, db0 + off, a_sub16);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    if (kb > 0 && threadIdx.x % 32 == 0)
      mbar_arrive(&empty[prev]);
    prev = r.s;
    if (++r.s == S) {
      r.s = 0;
      r.phase ^= 1;
    }
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  if (threadIdx.x % 32 == 0)
    mbar_arrive(&empty[prev]);
}

// The stage ring's barriers, by one thread: "full" completes on the producer's arrival and the
// stage's bytes, "empty" on `consumers` arrivals (one per consumer warp: 8); the fence makes them
// visible to the async proxy (TMA).
template <int S>
__device__ static __forceinline__ void init_ring(uint64_t *full, uint64_t *empty, int consumers) {
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
// DeepSeek's shapes up to half their time at M = 16 (lab/NOTES.md, "The last band's box").
// KS = 2 (the 64-token tiles): a stage holds two 64-wide K blocks, A blocks then W blocks, so that
// a consumer's wait and release per stage (lab/NOTES.md, "Two K blocks a stage") come once per 128
// columns. Where k / 64 is odd the last stage's second block lies wholly past k: TMA fills it with
// zeros and its k16 steps add +0 to each accumulator, which changes no bits (an accumulator that
// starts at +0 is never -0 in round-to-nearest, and NaN and Inf stay), as the zero columns of a
// block past k always did. tests/gpu/test_kernels.c runs it at k = 2080 against the reference
// (gemm_accuracy) and bitwise against the small kernels at k = 944 (gemm_paths_agree).
// Stage kb's KS blocks of one operand from `row` into dst, blocks `step` bytes apart: a box a
// block, or with KP (the maps of rank 3) one box for all, an activation box's blocks then its rows
// apart.
template <int KS, bool KP>
__device__ static __forceinline__ void load_stage(uint8_t *dst, const CUtensorMap *map,
                                                  uint64_t *bar, int kb, int row, int step) {
  if constexpr (KP)
    tma_load_3d(dst, map, bar, 0, row, kb * KS);
  else
    for (int j = 0; j < KS; j++)
      tma_load_2d(dst + j * step, map, bar, (kb * KS + j) * BK, row);
}

template <int S, int SB, int BN, int TM = BM, int KS = 1, bool KP = false>
__device__ static __forceinline__ void produce(const mt_large_args &a, uint8_t *smem,
                                               uint64_t *full, uint64_t *empty, int tiles,
                                               int tiles_n, int kt64) {
  constexpr int A_TILE = TM * BK * 2, W_TILE = BN * BK * 2;
  const int kt = (kt64 + KS - 1) / KS;
  const int pre = kt < S ? kt : S, n_first = (int)blockIdx.x % tiles_n * BN,
            m_first = (int)blockIdx.x / tiles_n * TM;
  // the band at m0's activation map and what a block's two loads deliver for it
  const int m_last = (a.e.m - 1) / TM * TM;
  const uint32_t tx = (uint32_t)(A_TILE + W_TILE),
                 tx_last = (uint32_t)(a.last_rows * BK * 2 + W_TILE);
  auto act = [&](int m0) { return m0 == m_last ? &a.ta_last : &a.ta; };
  for (int kb = 0; kb < pre; kb++) {
    mbar_arrive_expect_tx(&full[kb], KS * (m_first == m_last ? tx_last : tx));
    load_stage<KS, KP>(smem + kb * SB + KS * A_TILE, &a.tw, &full[kb], kb, n_first, W_TILE);
  }
  grid_dependency_wait();
  for (int kb = 0; kb < pre; kb++)
    load_stage<KS, KP>(smem + kb * SB, act(m_first), &full[kb], kb, m_first, A_TILE);
  int it = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int m0 = tile / tiles_n * TM, n0 = tile % tiles_n * BN;
    const CUtensorMap *ta = act(m0);
    const uint32_t bytes = m0 == m_last ? tx_last : tx;
    for (int kb = 0; kb < kt; kb++, it++) {
      if (it < pre) // issued above (the first tile)
        continue;
      const int s = it % S;
      mbar_wait(&empty[s], ((it / S) & 1) ^ 1);
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

// The 64-token tiles' epilogue scales, filled during the K loop: 1/S_a of the tile's 64 rows and
// 1/S_w where it is one value (the columns' 1/S_w and bias go into `columns` as prepare_columns
// does), by warps 1-3 of the producer warpgroup, idle otherwise, so that a few-token launch does
// not wait for two dependent global loads (S_w, then S_a) after its K loop. full: the scales of the
// CTA's j-th tile are there (phase j % 2, 96 arrivals); empty: the consumer has stored that tile
// (4 arrivals, one a warp) and the next tile's may overwrite them. The loads below run one after
// another (a shared store between each), which does not matter: the consumer barely waits for
// `full`, and issuing all four first was no faster (lab/NOTES.md, "Epilogue scales during the K
// loop").
struct scales64 {
  uint64_t full, empty;
  float inv_w0;
  float inv_a[64];
};
static_assert(sizeof(scales64) <= 280, "MT_LARGE_SMEM_64 holds 280 bytes of scales64");

template <int BN>
__device__ static void scale_helpers(const mt_large_args &a, columns<BN> *cols, scales64 *sc,
                                     int tiles, int tiles_n) {
  const int t = threadIdx.x - 32; // 0 .. 95
  grid_dependency_wait();         // S_a (and in requantize mode S_w) come from the kernels before
  int j = 0;
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, j++) {
    const int m0 = tile / tiles_n * 64, n0 = tile % tiles_n * BN;
    if (j > 0)
      mbar_wait(&sc->empty, (j - 1) & 1);
    fill_columns<BN>(a.e, cols, n0, t, 96);
    for (int r = t; r < 64 && m0 + r < a.e.m; r += 96)
      sc->inv_a[r] = inv_row(a.e.sa, a.e.sa_row, m0 + r);
    if (t == 0)
      sc->inv_w0 = inv_w_one(a.e);
    mbar_arrive(&sc->full);
  }
}

// v6 (mt_gemm_large_nBN): the two consumer warpgroups take 64 tokens each of a 128 x BN tile.
// TM = 64 (mt_gemm_large_m64_nBN): one consumer warpgroup, tiles of 64 x BN, for calls whose
// 128-token tiles would leave SMs idle. Every k-block a consumer warpgroup reads its 64 rows of A
// and all of B from shared memory while TMA writes both: at M = 256 the 128 x 64 tiles ran at the
// 128 bytes a clock of shared memory (lab/NOTES.md, "What feeds a tile"), and at M <= 64 the
// second warpgroup's reads were of rows no token has (lab/NOTES.md, "Tiles of 64 tokens"). Their
// stages hold two K blocks (KS = MT_LARGE_KS_64): with one, the consumer's hand-over per stage
// (wait, group wait, release) outlasted a 64 x 32 block's wgmma (lab/NOTES.md, "Two K blocks a
// stage").
// KP (mt_gemm_large_m64p_nBN; TM = 64): the maps are of rank 3, a box holds a stage's two K blocks
// of an operand (produce), where kernels/gemm.c's mt_gemm_kpair says so.
template <int BN, int TM = BM, bool KP = false> __device__ static void run(const mt_large_args &a) {
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

  // k-block number `it` counts on across this CTA's tiles: stage it % S, phase (it / S) & 1.
  // Registers: with TM = 64 the launch's 256 threads have enough without moving any (BN / 2
  // accumulators at most 64).
  if (wg == 0) { // producer: one thread keeps the ring of stages full
    if constexpr (TM == BM)
      asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if constexpr (TM == 64)
      if (threadIdx.x >= 32 && (int)blockIdx.x < tiles) {
        scale_helpers<BN>(a, cols_all, sc, tiles, tiles_n);
        return;
      }
    if (threadIdx.x != 0 || (int)blockIdx.x >= tiles)
      return;
    produce<S, SB, BN, TM, KS, KP>(a, smem, full, empty, tiles, tiles_n, kt);
    return;
  }

  if constexpr (TM == BM)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  const int cw =
      __shfl_sync(0xffffffffu, wg - 1, 0); // the same in every lane, known so to the compiler
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
    for (int i = 0; i < BN / 2; i++)
      d[i] = 0.0f;
    // a stage's second A block: 64 rows on, or with KP the last band's box's rows (produce)
    const int a_rows = KP && m0 == (a.e.m - 1) / TM * TM ? a.last_rows : TM;
    k_loop<BN, S, SB, KS, BN * BK * 2>(d, full, empty, da0, db0, kt, r, a_rows * BK * 2 / 16);
    if (!waited) { // S_a comes from the quantization too, and C and y may be another kernel's
      grid_dependency_wait();
      waited = true;
    }
    if constexpr (TM == 64) {
      mbar_wait(&sc->full, j & 1);
      if (a.e.ytype == DT_BF16)
        store_tile_as<BN, __nv_bfloat16, false, true>(a.e, d, row0, n0, cols, sc->inv_w0, nullptr,
                                                      sc->inv_a);
      else
        store_tile_as<BN, __half, false, true>(a.e, d, row0, n0, cols, sc->inv_w0, nullptr,
                                               sc->inv_a);
      __syncwarp();
      if (threadIdx.x % 32 == 0)
        mbar_arrive(&sc->empty);
    } else {
      prepare_columns<BN>(a.e, cols, n0, cw);
      const float inv_w = inv_w_one(a.e);
      if (a.e.ytype == DT_BF16)
        store_tile_as<BN, __nv_bfloat16>(a.e, d, row0, n0, cols, inv_w);
      else
        store_tile_as<BN, __half>(a.e, d, row0, n0, cols, inv_w);
    }
  }
}

// The TMA-store kernel (mt_gemm_large_ts_nBN, the default where it applies): v6 with one stage
// fewer and the epilogue writing its outputs into a staging tile in shared memory (64 x BN per
// consumer warpgroup) that one thread then stores by TMA (boxes of 64 x 64, clipped at M and N):
// full 128-byte lines instead of 16-byte pieces from 8 rows per store instruction, and the stores
// overlap the next tile's K loop. Same arithmetic, same bits. The clip at N works in 16-byte
// pieces: at N = 271 device call 3 saw column 271 (the caller's padding) written, so kernels/gemm.c
// runs it only when N % 8 == 0.
template <int BN> __device__ static void run_ts(const mt_large_args &a) {
  constexpr int S = MT_LARGE_STAGES_TS(BN);
  constexpr int SB = MT_LARGE_STAGE_BYTES(BN);
  extern __shared__ uint8_t smem_raw[];
  uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint64_t *full = (uint64_t *)(smem + S * SB), *empty = full + S;
  columns<BN> *cols_all = (columns<BN> *)(empty + S);
  uint8_t *staging = smem + ((S * SB + 16 * S + 2 * (int)sizeof(columns<BN>) + 1023) & ~1023);
  const int tiles_n = (a.e.n + BN - 1) / BN, tiles = (a.e.m + BM - 1) / BM * tiles_n;
  const int kt = (a.e.k + BK - 1) / BK;
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    init_ring<S>(full, empty, 8);
  }
  __syncthreads();

  if (wg == 0) { // producer: one thread keeps the ring of stages full
    asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    if (threadIdx.x != 0 || (int)blockIdx.x >= tiles)
      return;
    produce<S, SB, BN>(a, smem, full, empty, tiles, tiles_n, kt);
    return;
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  const int cw = __shfl_sync(0xffffffffu, wg - 1, 0), lead = threadIdx.x % 128 == 0;
  columns<BN> *cols = cols_all + cw;
  uint8_t *stage = staging + cw * 64 * BN * 2;
  const uint64_t da0 = desc_sw128(smem_u32(smem) + cw * 64 * 128);
  const uint64_t db0 = desc_sw128(smem_u32(smem) + A_BYTES);
  bool waited = false;
  ring r = {0, 0};
  for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int m0 = tile / tiles_n * BM, n0 = tile % tiles_n * BN, row0 = m0 + 64 * cw;
    float d[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++)
      d[i] = 0.0f;
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
      for (int b = 0; b < BN / 64 && n0 + 64 * b < a.e.n; b++)
        tma_store_2d(&a.ty, stage + b * 8192, n0 + 64 * b, row0);
      bulk_commit();
    }
  }
  if (lead)
    bulk_wait_all();
}

} // namespace large

#define MT_LARGE(BN)                                                                               \
  extern "C" __global__ void __launch_bounds__(384, 1)                                             \
      mt_gemm_large_n##BN(const __grid_constant__ mt_large_args a) {                               \
    large::run<BN>(a);                                                                             \
  }
#define MT_LARGE_TS(BN)                                                                            \
  extern "C" __global__ void __launch_bounds__(384, 1)                                             \
      mt_gemm_large_ts_n##BN(const __grid_constant__ mt_large_args a) {                            \
    large::run_ts<BN>(a);                                                                          \
  }
MT_LARGE(64)
MT_LARGE(96)
#define MT_LARGE_64(BN)                                                                            \
  extern "C" __global__ void __launch_bounds__(256, 1)                                             \
      mt_gemm_large_m64_n##BN(const __grid_constant__ mt_large_args a) {                           \
    large::run<BN, 64>(a);                                                                         \
  }
MT_LARGE_64(32)
MT_LARGE_64(48)
MT_LARGE_64(64)
#define MT_LARGE_64P(BN)                                                                           \
  extern "C" __global__ void __launch_bounds__(256, 1)                                             \
      mt_gemm_large_m64p_n##BN(const __grid_constant__ mt_large_args a) {                          \
    large::run<BN, 64, true>(a);                                                                   \
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
