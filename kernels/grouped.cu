// grouped.cu — the W4A4 GEMM of a whole grouped problem in one launch (mt_grouped_nBN): segments
// s = 0 .. nseg-1 (the experts of a MoE layer, or one weight),
// y_s[m_s][n] = x_s[m_s][k] . W_s[n][k]^T on NVFP4 operands, exactly, through BF16 tensor-core MMAs
// with FP32 accumulation.
//
// The weight is A and comes from registers: each consumer warp decodes its 16 channels' codes and
// block scales (kernels/wstore.h, 4.5 bits an element, streamed from HBM by bulk copies) into the
// A fragments of wgmma, or at token tiles of at most 16 of the warp's own mma.sync m16n8k16 (the
// same fragment, the same bits) (record_frags: ~19 instructions for 8 elements), so no BF16 copy
// of a weight exists anywhere; the tokens are B (N = BN): the quantized activations (BF16 xhat,
// exact), TMA-loaded into 128B-swizzled shared memory. A CTA owns tiles of 128 channels (two
// consumer warpgroups of 64) by BN tokens of one segment, walks them persistently (tile
// blockIdx.x, + gridDim.x, ...), and runs each tile's whole K loop: k16 steps in increasing order
// into one FP32 accumulator per output, from zero, no split-K, no atomics: the arithmetic of every
// other path (docs/numerics.md, "Batch invariance"), so a row's bits do not depend on its segment,
// its position, BN or the other segments. A segment's last token tile multiplies only as wide as
// its rows need (tile_rows); the n256 kernel, which keeps one width, leaves a last tile of fewer
// than MT_GROUPED_TAIL rows to a second launch of a narrower kernel (mt_grouped_kargs, split).
//
// The segments' rows come from device memory (offs: cumulative row ends, as torch._grouped_mm
// gives them) or are fixed (seg_rows each, strided-batched forms): every CTA turns them into a
// table of tiles first (token tile fastest, so CTAs running at once share a weight tile through
// L2). The producer thread requests a stage's weight records (one bulk copy) before
// griddepcontrol.wait for the CTA's first stages, so weights stream while the activation
// quantization before this kernel still runs (no kernel that writes the store lets its dependents
// start early, but the call's own refresh: store_moved); at a few rows after the call's refresh,
// every tile runs before the wait, once the quantizer's count says the activations are written
// (a.acts); and at a few tokens the grid lets the next call's kernels start at once, so that the
// next GEMM's table and first weights overlap this one's K loop.
// Pointer-array forms change only where the epilogue writes a segment's rows (and reads its C):
// through the segment's pointer, with the same arithmetic; their activations reach xhat through
// the quantizer, their weights the store.
//
// Exactness: every dequantized element e2m1 * e4m3 is exact in BF16 and every product of two is
// exact in FP32; each 16-element block sum is exact in FP32, so whether the weight is A or B does
// not change the sums. The weight's decode (wstore.h: a code's bits as BF16, times its scale
// byte's BF16) gives each element times 2^-7, a normal BF16: every product, block sum and partial
// sum is the unscaled one times 2^-7, all far above FP32's normal minimum (the smallest product is
// 2^-27), so each rounding is the unscaled one scaled, and the epilogue's exact multiply by 2^7
// gives the unscaled accumulator's bits. The epilogue is gemm_common.cuh's order, each operation
// rounded on its own.
//
// Tested by tests/gpu/test_grouped.c: against mt_ref_gemm (ref/nvfp4.c) within the
// FP32-accumulation bound, bitwise against the per-expert large path and across segment layouts,
// BN and row positions.
#include "kernels/gemm_common.cuh"
#include "kernels/wgmma_rs.cuh"
#include "kernels/wstore.h"

namespace grp {
constexpr int CB = 128;        // channels a tile (two warpgroups of 64)
constexpr int REC = MT_WS_REC; // bytes of a record (8 rows x 32 columns)
constexpr int REC_BLOCK = MT_GROUPED_REC_BLOCK;
static_assert(REC_BLOCK == (CB / 8) * 2 * REC, "a band's records of one 64-wide block");
#define KS_OF(bn) MT_GROUPED_KS(bn)
#define SB_OF(bn) MT_GROUPED_SB(bn)
#define S_OF(bn) MT_GROUPED_STAGES(bn)
constexpr int SYNC_MAX =
    16; // token tiles up to this many multiply by warp (k_loop_warp), wider by warpgroup
constexpr float kUnshift = (float)(1u << MT_WS_WEIGHT_SHIFT); // the decoded weights' 2^-7, undone

// Shared memory (gemm_args.h, MT_GROUPED_SMEM): the stages (each: KS activation boxes of BN rows x
// 128 bytes, then KS x 4608 bytes of records), the ring's barriers, then the tile table.
struct table {    // 16 bytes, then 4 * MT_GROUPED_MAX_SEG + 1 ints
  uint64_t ready; // the producer's verdict on the store is in `moved` (an mbarrier of one arrival)
  int moved;
  int pad;
  int tile_start[MT_GROUPED_MAX_SEG + 1]; // first tile of each segment; [nseg]: all tiles
  int row_start[MT_GROUPED_MAX_SEG];      // the segment's first row of xhat
  int first[MT_GROUPED_MAX_SEG];          // the tokens this launch runs: first .. end - 1
  int end[MT_GROUPED_MAX_SEG];
};

__device__ static inline void warpgroup_arrive_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

// The store's generation, read by thread 0 (the producer) before it requests any weight: with
// acquire, so that a refresh's writes counted in the value read are seen, also by the bulk copies
// (the async proxy) that thread issues after it. Kept in that thread's registers.
__device__ static inline uint32_t generation(const uint32_t *gen) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(gen) : "memory");
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
  return v;
}

// The tile table, by warp 0: each segment's rows (offs's, as mt_offs_span reads them, or seg_rows
// each) and first tile (an exclusive scan of ceil(rows / BN) * channel blocks, 32 segments at a
// time). Every segment's ends are read before any is used, so that reading offs is one round trip
// to memory, not one a round of 32 (4 for 128 experts): the producer requests no weight before
// the table is done. Returns the store's generation to lane 0, the producer (0 without a refresh).
template <int BN> __device__ static uint32_t build_table(const mt_grouped_kargs &a, table *t) {
  constexpr int R = MT_GROUPED_MAX_SEG / 32;
  const int lane = threadIdx.x % 32, blocks = (a.n + CB - 1) / CB;
  int start[R], rows[R];
  if (a.offs) {
    int lo[R], hi[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
      const int s = 32 * r + lane, g = a.seg0 + s;
      hi[r] = s < a.nseg ? a.offs[g] : 0;
      lo[r] = s < a.nseg && g > 0 ? a.offs[g - 1] : 0;
    }
#pragma unroll
    for (int r = 0; r < R; r++)
      mt_offs_clamp(lo[r], hi[r], a.m, &start[r], &rows[r]);
  } else
#pragma unroll
    for (int r = 0; r < R; r++)
      start[r] = (a.seg0 + 32 * r + lane) * a.seg_rows, rows[r] = a.seg_rows;
  int carry = 0;
#pragma unroll
  for (int r = 0; r < R && 32 * r < a.nseg; r++) {
    const int s = 32 * r + lane;
    int first, end;
    mt_grouped_part(rows[r], a.split, a.split_bn, &first, &end);
    int v = s < a.nseg ? (end - first + BN - 1) / BN * blocks : 0, incl = v;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int u = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o)
        incl += u;
    }
    if (s < a.nseg) {
      t->tile_start[s] = carry + incl - v;
      t->row_start[s] = start[r];
      t->first[s] = first;
      t->end[s] = end;
    }
    carry += __shfl_sync(0xffffffffu, incl, 31);
  }
  if (lane != 0)
    return 0;
  t->tile_start[a.nseg] = carry;
  return a.gen ? generation(a.gen) : 0;
}

// The call's activations are written once its quantizer's count of running CTAs reads 0 (every CTA
// counted itself before this grid could start: kernels/quant.cu, start_dependents): read with
// acquire, so that their writes are seen, also by the bulk copies of the activations after it.
__device__ static inline void acts_written(const uint32_t *acts) {
  for (;;) {
    uint32_t v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(acts) : "memory");
    if (v == 0)
      break;
    __nanosleep(64);
  }
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

// Whether the call's refresh of the store requantized a slice since the CTA read its generation
// gen (kernels/quant.cu, refresh_store: chained before this kernel, it lets it start before it
// ends, and each of its CTAs that wrote adds one to the generation after its writes). Then the
// weights requested before grid_dependency_wait may be stale or torn, and the tiles that read them
// run again. Asked once, by the producer after its wait (the refresh has ended then), and told to
// the consumers through t->ready, so that all agree on the stages that come.
__device__ static inline bool store_moved(const mt_grouped_kargs &a, uint32_t gen) {
  return a.gen && *(const volatile uint32_t *)a.gen != gen;
}
__device__ static inline bool producer_saw_moved(const table *t) {
  mbar_wait(const_cast<uint64_t *>(&t->ready), 0);
  return t->moved;
}

// Tile `tile`'s segment, channel block and token tile (token tile fastest within a segment).
struct where {
  int s, cb, tok0;
};
template <int BN> __device__ static inline where locate(const table *t, int nseg, int tile) {
  int lo = 0, hi = nseg; // the last segment whose first tile is <= tile
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (t->tile_start[mid] <= tile)
      lo = mid;
    else
      hi = mid;
  }
  const int local = tile - t->tile_start[lo], ntok = (t->end[lo] - t->first[lo] + BN - 1) / BN;
  return {lo, local / ntok, t->first[lo] + local % ntok * BN};
}

// Pair P of a store code word (wstore.h) as a BF16 pair of codes * 2^-126: the mask of one
// rotation of the word, or of two (its magnitudes and its signs). A rotation whose masked bits
// all come from below (R no more than the mask's lowest bit) is a left shift, which ptxas can give
// to the FMA pipe (IMAD.SHL): the decode's logic operations fill the ALU pipe, the busiest.
template <int R, uint32_t MASK> __device__ static inline uint32_t rotate(uint32_t w) {
  if constexpr (R == 0)
    return w;
  else if constexpr ((MASK & ((1u << R) - 1)) == 0)
    return w << R;
  else
    return __funnelshift_l(w, w, R);
}
template <int P> __device__ static inline uint32_t code_pair(uint32_t w) {
  constexpr int em = MT_WS_EM_ROT(P), sg = MT_WS_SIGN_ROT(P);
  if constexpr (em == sg)
    return rotate<em, MT_WS_EM | MT_WS_SIGN>(w) & (MT_WS_EM | MT_WS_SIGN);
  else
    return (rotate<em, MT_WS_EM>(w) & MT_WS_EM) | (rotate<sg, MT_WS_SIGN>(w) & MT_WS_SIGN);
}

__device__ static inline uint32_t bf16_mul(uint32_t a, __nv_bfloat162 b) {
  __nv_bfloat162 r = __hmul2(*(__nv_bfloat162 *)&a, b);
  return *(uint32_t *)&r;
}

// One record's word w of a lane (row g or g + 8: c = 0 or 1 of the fragment) and the row's two
// scale bytes sc, into the A fragments of the record's two k16 steps (S0: the first block, S1:
// the second): pairs 0 and 1 are the fragment's registers c and c + 2 of S0, pairs 2 and 3 those
// of S1. The scale bytes become the BF16 pair (scale0, scale1) * 2^119 by one multiply-add
// (wstore.h); each code pair times its block's half of it is the dequantized pair * 2^-7, exact
// (the code's subnormal 0.5 * 2^-126 included: BF16 arithmetic keeps subnormals).
__device__ static inline void record_frags(uint32_t w, uint32_t sc, int c, uint32_t (&S0)[4],
                                           uint32_t (&S1)[4]) {
  const uint32_t x = __byte_perm(sc, 0, 0x4140) * 16u + (MT_WS_SCALE_BF16 | MT_WS_SCALE_BF16 << 16);
  const __nv_bfloat162 s2 = *(const __nv_bfloat162 *)&x;
  const __nv_bfloat162 s0 = __low2bfloat162(s2), s1 = __high2bfloat162(s2);
  S0[c] = bf16_mul(code_pair<0>(w), s0);
  S0[c + 2] = bf16_mul(code_pair<1>(w), s0);
  S1[c] = bf16_mul(code_pair<2>(w), s1);
  S1[c + 2] = bf16_mul(code_pair<3>(w), s1);
}

// The A fragments of the four k16 steps of 64-wide block b of a stage, for this warp's 16 channels
// (row groups hw and hw + 1 of the band: rows g and g + 8), from the stage's records (pair P, row
// group h at (P * 16 + h) * REC): per pair, the lane's code word and its row's two scale bytes in
// each of the two records; step 2p + j takes block j of pair 2b + p. code and scale: this thread's
// code word and scale bytes in the stage's first record of its row group.
__device__ static inline void decode_block(const uint8_t *code, const uint8_t *scale, int b,
                                           uint32_t (&A)[4][4]) {
#pragma unroll
  for (int p = 0; p < 2; p++)
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const int rec = ((2 * b + p) * 16 + r) * REC;
      record_frags(*(const uint32_t *)(code + rec), *(const uint16_t *)(scale + rec), r, A[2 * p],
                   A[2 * p + 1]);
    }
}

// Keeps the compiler from moving the A registers' computation across the wgmma fence and wait
// around it (the PTX ISA's rule for A in registers).
__device__ static inline void fence_operands(uint32_t (&A)[4][4]) {
#pragma unroll
  for (int i = 0; i < 4; i++)
#pragma unroll
    for (int j = 0; j < 4; j++)
      asm volatile("" : "+r"(A[i][j])::"memory");
}

// The ring of stages: "full" completes on the producer's arrival and the stage's bytes, "empty" on
// one arrival per consumer warp (8).
template <int S>
__device__ static inline void init_ring(uint64_t *full, uint64_t *empty, table *t) {
  for (int s = 0; s < S; s++) {
    mbar_init(&full[s], 1);
    mbar_init(&empty[s], 8);
  }
  mbar_init(&t->ready, 1);
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// The producer thread: per tile, per stage, the 128 channels' records of the stage's K (one bulk
// copy of KS x 4608 contiguous bytes) and the tokens' activation boxes. Stage number `it` counts on
// across tiles: slot it % S, phase (it / S) & 1. The weights of the CTA's first stages are
// requested before griddepcontrol.wait (they do not depend on the kernel before this one, unless
// the call's refresh requantized them meanwhile: then the first tile's stages come twice,
// store_moved). After the call's refresh (a.acts), the activations come once the quantizer's count
// says they are written, every tile's stages follow, and only then the wait for the refresh: where
// it moved the store, every tile's stages come twice.
template <int BN>
__device__ static void produce(const mt_grouped_kargs &a, table *t, uint32_t gen, uint8_t *smem,
                               uint64_t *full, uint64_t *empty, int tiles, int nst) {
  constexpr int KS = KS_OF(BN), SB = SB_OF(BN), S = S_OF(BN), ACT = BN * 128;
  constexpr uint32_t RECS = KS * REC_BLOCK;
  const long long band = a.ws_band;
  auto records = [&](const where &w, int j) {
    return a.ws + (long long)(a.seg0 + w.s) * a.ws_slice + w.cb * band + (long long)j * RECS;
  };
  auto acts = [&](const where &w, int j, uint8_t *dst, uint64_t *bar) {
    const int row = t->row_start[w.s] + w.tok0;
    if (a.kpair)
      tma_load_3d(dst, &a.ta, bar, 0, row, j * KS);
    else
      for (int b = 0; b < KS; b++)
        tma_load_2d(dst + b * ACT, &a.ta, bar, (j * KS + b) * 64, row);
  };
  if ((int)blockIdx.x >= tiles) {
    grid_dependency_wait();
    return;
  }
  // the first tile's first stages: weights now, activations once written
  const where w0 = locate<BN>(t, a.nseg, blockIdx.x);
  const int pre = nst < S ? nst : S;
  for (int j = 0; j < pre; j++) {
    mbar_arrive_expect_tx(&full[j], RECS + KS * ACT);
    bulk_load(smem + j * SB + KS * ACT, records(w0, j), RECS, &full[j]);
  }
  auto verdict = [&]() {
    grid_dependency_wait();
    t->moved = store_moved(a, gen);
    mbar_arrive(&t->ready);
  };
  if (a.acts)
    acts_written(a.acts);
  else
    verdict();
  for (int j = 0; j < pre; j++)
    acts(w0, j, smem + j * SB, &full[j]);
  int it = 0;
  for (int round = 0;; round++) {
    // pass 0 (only where the store moved before the wait) is the first tile with the weights
    // requested early
    for (int tile = blockIdx.x, pass = !a.acts && t->moved ? 0 : 1; tile < tiles;
         tile += pass++ ? gridDim.x : 0) {
      const where w = locate<BN>(t, a.nseg, tile);
      for (int j = 0; j < nst; j++, it++) {
        if (it < pre)
          continue; // issued above
        const int slot = it % S;
        mbar_wait(&empty[slot], ((it / S) & 1) ^ 1);
        uint8_t *st = smem + slot * SB;
        mbar_arrive_expect_tx(&full[slot], RECS + KS * ACT);
        bulk_load(st + KS * ACT, records(w, j), RECS, &full[slot]);
        acts(w, j, st, &full[slot]);
      }
    }
    if (round || !a.acts)
      return;
    verdict(); // after the call's refresh: every tile again where it moved the store
    if (!t->moved)
      return;
  }
}

// One 64-wide K block of a consumer warpgroup: decode its A, four k16 wgmmas as one group, then
// wait until the group before is complete (its A registers may be written again, its stage
// released).
template <int BN>
__device__ static inline void block_step(float *d, uint32_t (&A)[4][4], const uint8_t *code,
                                         const uint8_t *scale, int b, uint64_t db) {
  decode_block(code, scale, b, A);
  fence_operands(A);
  warpgroup_arrive_fence();
#pragma unroll
  for (int kk = 0; kk < 4; kk++)
    wgmma_rs_step<BN>(d, A[kk], db + 2 * kk);
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
  fence_operands(A);
}

// The consumer's place in the ring: the slot of its next stage and that slot's phase, carried
// across tiles (stage number n: slot n % S, phase (n / S) & 1, counted on, never divided).
struct ring_pos {
  int slot = 0, phase = 0;
  template <int S> __device__ void next() {
    if (++slot == S)
      slot = 0, phase ^= 1;
  }
};

// This thread's code word and scale bytes in slot 0's first record of its row group hw (the K
// loops add a slot's offset and a record's): decode_block's code and scale.
template <int BN> struct lane_records {
  const uint8_t *code, *scale;
  __device__ lane_records(uint8_t *smem, int hw, int lane) {
    const uint8_t *recs = smem + KS_OF(BN) * BN * 128 + hw * REC;
    code = recs + 4 * lane;
    scale = recs + 128 + lane / 4 * 2;
  }
};

// The K loop of one consumer warpgroup over one tile: nst stages of KS blocks, the blocks
// alternating the two A register sets (within a stage when KS = 2, across stages when KS = 1); a
// stage waited for before its first block and released once the group of its last block is
// complete, which the wait of the block after it tells. The thread's addresses in a stage and the
// stage's descriptor are those of slot 0 plus the slot's offset. The wgmmas are NW tokens wide
// (NW <= BN: the tile's rows rounded up, accumulators d[0 .. NW/2 - 1]; the stage holds BN rows
// either way).
template <int BN, int NW>
__device__ static __forceinline__ void k_loop(float *d, uint8_t *smem, uint64_t *full,
                                              uint64_t *empty, ring_pos &at, int nst, int hw,
                                              int lane) {
  constexpr int KS = KS_OF(BN), SB = SB_OF(BN), S = S_OF(BN), ACT = BN * 128;
  static_assert(KS == 1 || KS == 2, "one or two blocks a stage");
  const lane_records<BN> lr(smem, hw, lane);
  const uint64_t desc = desc_sw128(smem_u32(smem));
  const bool leader = lane == 0;
  uint32_t A0[4][4], A1[4][4];
  int done = -1; // a slot whose last block's group is the one in flight before the next block's
  auto stage = [&](uint32_t(&A)[4][4], uint32_t(&B)[4][4]) {
    mbar_wait(&full[at.slot], at.phase);
    const int off = at.slot * SB;
    block_step<NW>(d, A, lr.code + off, lr.scale + off, 0, desc + (uint32_t)off / 16);
    if (done >= 0 && leader)
      mbar_arrive(&empty[done]); // the group before this block's is complete
    if constexpr (KS == 2)
      block_step<NW>(d, B, lr.code + off, lr.scale + off, 1, desc + (uint32_t)(off + ACT) / 16);
    done = at.slot;
    at.next<S>();
  };
  int j = 0;
  if constexpr (KS == 2)
    for (; j < nst; j++)
      stage(A0, A1);
  else {
    for (; j + 1 < nst; j += 2) {
      stage(A0, A1);
      stage(A1, A0);
    }
    if (j < nst)
      stage(A0, A1);
  }
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  if (leader)
    mbar_arrive(&empty[done]);
}

// Four 8 x 8 BF16 matrices from shared memory (lanes 8i .. 8i + 7 give matrix i's row addresses):
// thread 4g + q receives row g's elements 2q, 2q + 1 of each, mma.sync's B fragment when a row is
// a token and its 16 bytes are 8 consecutive k.
__device__ static inline void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// One k16 step of one warp's 16 channels by 8 tokens, accumulated into d[0 .. 3] (the layout of
// the wgmma's d[4c .. 4c + 3] for the warp: the same bits, lab/NOTES.md "Exactness of the MMA
// instructions").
__device__ static inline void mma_16816(float *d, const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The K loop of one consumer warp over one tile at a few tokens (BN <= SYNC_MAX): the
// same stages and decode as k_loop, multiplied by the warp alone with mma.sync m16n8k16 (NW / 8
// token groups, B by ldmatrix from the 128B-swizzled boxes: token r's 16-byte chunk c sits at
// r * 128 + (c ^ r % 8) * 16). No warpgroup meets at a fence or a wait, so a warp's decode of one
// block runs beside its own MMAs of the block before: Qwen3's layer faster at 1 and 16 tokens, the
// same at 128 (BN 16) (lab/NOTES.md, "Warp MMAs at a few tokens a tile"). A stage is released once
// the warp's last reads of it have returned (the MMAs read registers).
template <int BN, int NW>
__device__ static __forceinline__ void k_loop_warp(float *d, uint8_t *smem, uint64_t *full,
                                                   uint64_t *empty, ring_pos &at, int nst, int hw,
                                                   int lane) {
  constexpr int KS = KS_OF(BN), SB = SB_OF(BN), S = S_OF(BN), ACT = BN * 128;
  const lane_records<BN> lr(smem, hw, lane);
  const int r = lane % 8, c = lane / 8;
  const uint32_t rows = smem_u32(smem) + r * 128;
  const uint32_t chunk0 = (uint32_t)((c ^ r) * 16), chunk1 = (uint32_t)(((4 + c) ^ r) * 16);
  for (int j = 0; j < nst; j++) {
    mbar_wait(&full[at.slot], at.phase);
    const int off = at.slot * SB;
#pragma unroll
    for (int b = 0; b < KS; b++) {
      uint32_t A[4][4];
      decode_block(lr.code + off, lr.scale + off, b, A);
#pragma unroll
      for (int h = 0; h < 2; h++) { // k16 steps 2h and 2h + 1: chunks 4h .. 4h + 3
        uint32_t B[NW / 8][4];
#pragma unroll
        for (int g = 0; g < NW / 8; g++)
          ldsm_x4(B[g], rows + off + b * ACT + g * 1024 + (h ? chunk1 : chunk0));
#pragma unroll
        for (int s = 0; s < 2; s++)
#pragma unroll
          for (int g = 0; g < NW / 8; g++)
            mma_16816(d + 4 * g, A[2 * h + s], B[g][2 * s], B[g][2 * s + 1]);
      }
    }
    __syncwarp();
    if (lane == 0)
      mbar_arrive(&empty[at.slot]);
    at.next<S>();
  }
}

__device__ static inline void put(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
__device__ static inline void put(__half *p, float v) { *p = __float2half_rn(v); }
// v as an output of T would hold it, back in FP32 (exact)
__device__ static inline float rounded(const __nv_bfloat16 *, float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}
__device__ static inline float rounded(const __half *, float v) {
  return __half2float(__float2half_rn(v));
}

// The outer scales a consumer thread's part of a tile needs: S_w of its two channels (rows g and
// g + 8 of its warp's 16: i = 0, 1) and S_a of the tile's tokens 32k + lane (as the epilogue's
// shuffles hand them out). Loaded before the tile's K loop when the kernel before this one is
// known complete (every tile after the first), so that their latency hides behind it.
template <int BN> struct tile_scales { float sw[2], sa[(BN + 31) / 32]; };

template <int BN>
__device__ static inline void load_scales(const mt_grouped_kargs &a, const table *t,
                                          const where &wh, int ch0, tile_scales<BN> &ts) {
  const int lane = threadIdx.x % 32, w = (threadIdx.x % 128) / 32, g = lane / 4;
  const int s = wh.s, gs = a.seg0 + s, rows = t->end[s], row0 = t->row_start[s];
  const float *sw = (const float *)(a.ws + (long long)gs * a.ws_slice + a.ws_outer);
#pragma unroll
  for (int i = 0; i < 2; i++)
    ts.sw[i] = sw[a.sw_row ? min(ch0 + 16 * w + g + 8 * i, a.n - 1) : 0];
#pragma unroll
  for (int k = 0; k < (BN + 31) / 32; k++) { // past the segment's rows: 1 (unused)
    const int tok = wh.tok0 + 32 * k + lane;
    ts.sa[k] = tok < rows ? a.sa[a.sa_row ? row0 + tok : 0] : 1.0f;
  }
}

// The outputs of one consumer warpgroup: 64 channels from ch0 by BN tokens from tok0 of segment s,
// as T (y's type: BF16 or FP16), with C or a bias when EXTRA; d[4c + 2i + j] is channel
// 16w + g + 8i, token 8c + 2q + j (wgmma_rs.cuh). Per element exactly epilogue() of
// gemm_common.cuh: t = (acc * ((1/S_a) * (1/S_w))) * alpha, + beta * c, + bias. The epilogue runs
// while the tensor cores wait, so its instructions count: 1/S_a is computed once a token in the
// warp (lane l: tokens l, l + 32, ...) and shuffled to the lanes that use it, a token's y row is
// one pointer step from the one before, and without C and bias an element is four multiplies, a
// conversion and a store. SCATTER (vLLM's dispatch: a.y_rows, never with C or a bias): each
// token's row is its own, shuffled from the lane that loaded it as its 1/S_a, and with a router
// weight the element rounded to T is multiplied by it and rounded again.
template <int BN, int NW, typename T, bool EXTRA, bool SCATTER = false>
__device__ static __forceinline__ void store_tile_as(const mt_grouped_kargs &a, const table *t,
                                                     const float *d, const where &wh, int ch0,
                                                     const tile_scales<BN> &ts) {
  const int lane = threadIdx.x % 32, w = (threadIdx.x % 128) / 32, g = lane / 4, q = lane % 4;
  const int s = wh.s, gs = a.seg0 + s, rows = t->end[s], row0 = t->row_start[s];
  // y's (and c's) row of the segment's token r: the segment's rows of y (offs) or its own matrix
  // (strided, or behind a pointer array)
  const long long yrow0 = a.offs && !a.y_ptrs ? row0 : 0, crow0 = a.offs && !a.c_ptrs ? row0 : 0;
  T *y = a.y_ptrs ? (T *)a.y_ptrs[gs] : (T *)a.y + (long long)gs * a.stride_y;
  const char *c = nullptr, *bias = nullptr;
  if constexpr (EXTRA) {
    c = a.c_ptrs ? (const char *)a.c_ptrs[gs]
        : a.c    ? (const char *)a.c + (long long)gs * a.stride_c * 2
                 : nullptr;
    bias = a.bias ? (const char *)a.bias +
                        (long long)gs * a.stride_bias * (a.biastype == DT_FP32 ? 4 : 2)
                  : nullptr;
  }
  // A pointer read from an array is generic to the compiler: said global, y keeps the strided
  // path's st.global stores (not generic ones) in every kernel; C, read only when beta != 0, is
  // read through generic loads (the assumption does not reach them).
  __builtin_assume(__isGlobal(y));
  // per channel (i: rows g and g + 8): whether it is one of y's, 1/S_w and the bias
  const int ch_0 = ch0 + 16 * w + g;
  bool ok[2];
  float inv_w[2], bv[2];
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int ch = min(ch_0 + 8 * i, a.n - 1);
    ok[i] = ch_0 + 8 * i < a.n;
    inv_w[i] = __frcp_rn(ts.sw[i]);
    bv[i] = bias ? load_elem(bias, ch, a.biastype) : 0.0f;
  }
  // 1/S_a of the tile's tokens 32k + lane (past the segment's rows: unused)
  constexpr int NA = (BN + 31) / 32;
  float inv_own[NA];
#pragma unroll
  for (int k = 0; k < NA; k++)
    inv_own[k] = __frcp_rn(ts.sa[k]);
  // SCATTER: the tokens' output rows and router weights, loaded here rather than with the scales
  // before the K loop (live across it they cost the n128 kernel spills)
  int dst_own[SCATTER ? NA : 1];
  float w_own[SCATTER ? NA : 1];
  if constexpr (SCATTER)
#pragma unroll
    for (int k = 0; k < NA; k++) {
      const int tok = wh.tok0 + 32 * k + lane;
      dst_own[k] = tok < rows ? a.y_rows[row0 + tok] : 0;
      w_own[k] = tok < rows && a.row_w ? a.row_w[row0 + tok] : 1.0f;
    }
  T *yrow = y + (yrow0 + wh.tok0 + 2 * q) * a.ldy + ch_0; // token 8cc + 2q's row, channel ch_0
#pragma unroll
  for (int cc = 0; cc < NW / 8; cc++, yrow += 8 * a.ldy)
#pragma unroll
    for (int j = 0; j < 2; j++) {
      const int local = 8 * cc + 2 * q + j, tok = wh.tok0 + local;
      const float inv_a = __shfl_sync(0xffffffffu, inv_own[cc / 4], local % 32);
      T *yr = yrow + j * a.ldy;
      float rw = 1.0f;
      if constexpr (SCATTER) {
        yr = y + (long long)__shfl_sync(0xffffffffu, dst_own[cc / 4], local % 32) * a.ldy + ch_0;
        rw = __shfl_sync(0xffffffffu, w_own[cc / 4], local % 32);
      }
      if (tok >= rows)
        continue;
#pragma unroll
      for (int i = 0; i < 2; i++) {
        if (!ok[i])
          continue;
        const float acc = __fmul_rn(d[4 * cc + 2 * i + j], kUnshift);
        float v = __fmul_rn(__fmul_rn(acc, __fmul_rn(inv_a, inv_w[i])), a.alpha);
        if constexpr (EXTRA) {
          if (c)
            v = __fadd_rn(
                v, __fmul_rn(a.beta, load_elem(c, (crow0 + tok) * a.ldc + ch_0 + 8 * i, a.ytype)));
          if (bias)
            v = __fadd_rn(v, bv[i]);
        }
        if constexpr (SCATTER)
          if (a.row_w)
            v = __fmul_rn(rounded(yr, v), rw);
        put(yr + 8 * i, v);
      }
    }
}

// C or a bias: rare on the grouped path, so each has its own instantiation of the epilogue.
__device__ static inline bool has_extra(const mt_grouped_kargs &a) {
  return a.c || a.c_ptrs || a.bias;
}

// y is BF16 or FP16 (gemm_common.cuh, store_elem).
template <int BN, int NW>
__device__ static __forceinline__ void store_tile(const mt_grouped_kargs &a, const table *t,
                                                  const float *d, const where &wh, int ch0,
                                                  const tile_scales<BN> &ts) {
  if constexpr (NW < BN) { // narrow tiles only without C or bias, into BF16 (tile_rows)
    if (a.y_rows)
      store_tile_as<BN, NW, __nv_bfloat16, false, true>(a, t, d, wh, ch0, ts);
    else
      store_tile_as<BN, NW, __nv_bfloat16, false>(a, t, d, wh, ch0, ts);
    return;
  }
  if (a.y_rows) { // vLLM's dispatch: never with C or a bias (grouped.c)
    if (a.ytype == DT_FP16)
      store_tile_as<BN, NW, __half, false, true>(a, t, d, wh, ch0, ts);
    else
      store_tile_as<BN, NW, __nv_bfloat16, false, true>(a, t, d, wh, ch0, ts);
    return;
  }
  const bool extra = has_extra(a);
  if (a.ytype == DT_FP16) {
    if (extra)
      store_tile_as<BN, NW, __half, true>(a, t, d, wh, ch0, ts);
    else
      store_tile_as<BN, NW, __half, false>(a, t, d, wh, ch0, ts);
  } else if (extra)
    store_tile_as<BN, NW, __nv_bfloat16, true>(a, t, d, wh, ch0, ts);
  else
    store_tile_as<BN, NW, __nv_bfloat16, false>(a, t, d, wh, ch0, ts);
}

// When a consumer loads a tile's scales (tile_scales): S_a comes from the quantization, S_w from
// the store (which the call's refresh may rewrite), C and y may be another kernel's. The first
// tile's after its K loop and the wait for the grid before (AFTER_WAIT); or, beside the call's
// refresh (a.acts), after its K loop alone (AFTER_ACTS: the producer saw the activations written
// before it sent the first stage, the kernels before the call have ended, since the quantizer let
// the refresh start only after its wait for them, and the refresh's verdict comes at the end:
// run); every later tile's before its K loop (BEFORE).
enum scales_at { AFTER_WAIT, AFTER_ACTS, BEFORE };

// One tile of a consumer warpgroup (64 channels from ch0): its K loop and its outputs, with wgmmas
// and accumulators NW tokens wide (NW <= BN; the stage holds BN rows either way).
template <int BN, int NW>
__device__ static __forceinline__ void
tile_as(const mt_grouped_kargs &a, const table *t, uint8_t *smem, uint64_t *full, uint64_t *empty,
        ring_pos &at, int nst, int hw, int lane, const where &wh, int ch0, scales_at &sc) {
  float d[NW / 2];
  tile_scales<BN> ts;
  if (sc == BEFORE)
    load_scales<BN>(a, t, wh, ch0, ts);
  for (bool again = true; again;) {
#pragma unroll
    for (int i = 0; i < NW / 2; i++)
      d[i] = 0.0f;
    if constexpr (BN <= SYNC_MAX)
      k_loop_warp<BN, NW>(d, smem, full, empty, at, nst, hw, lane);
    else
      k_loop<BN, NW>(d, smem, full, empty, at, nst, hw, lane);
    again = false;
    if (sc == AFTER_WAIT) {
      grid_dependency_wait();
      again = producer_saw_moved(t); // then the producer sends the tile's stages again
    }
    if (sc != BEFORE) {
      sc = BEFORE;
      load_scales<BN>(a, t, wh, ch0, ts);
    }
  }
  store_tile<BN, NW>(a, t, d, wh, ch0, ts);
}

// A tile with wgmmas as wide as its rows need: a segment's last token tile is mostly padding (at
// T = 1024 Qwen3's experts have ~64 rows for tiles of 128), and the tensor cores' time is the
// wgmma's width while the decode's is the same at any width. The widths are BN, BN / 2, ... down to
// narrowest(BN), each its own instantiation, so that each wgmma pipeline is straight-line code with
// only the accumulators it needs. narrowest() is the set ptxas keeps pipelined: with more widths
// (BN / 4 in the n32 kernel, any narrower one in the n256 kernel, widths 3 * 2^j anywhere) it
// serializes the wgmmas of the kernel ("insufficient register resources"). A token's bits do not
// depend on the width, as they do not on BN (docs/numerics.md, "Batch invariance").
constexpr int narrowest(int bn) {
  return bn == 256 ? 256 : bn == 32 ? 16 : bn / 4 > 8 ? bn / 4 : 8;
}
template <int BN, int NW = narrowest(BN)>
__device__ static __forceinline__ void
tile_rows(const mt_grouped_kargs &a, const table *t, uint8_t *smem, uint64_t *full, uint64_t *empty,
          ring_pos &at, int nst, int hw, int lane, const where &wh, int ch0, bool narrow,
          scales_at &sc) {
  if constexpr (NW < BN) {
    if (narrow && t->end[wh.s] - wh.tok0 <= NW)
      return tile_as<BN, NW>(a, t, smem, full, empty, at, nst, hw, lane, wh, ch0, sc);
    return tile_rows<BN, 2 * NW>(a, t, smem, full, empty, at, nst, hw, lane, wh, ch0, narrow, sc);
  } else
    tile_as<BN, BN>(a, t, smem, full, empty, at, nst, hw, lane, wh, ch0, sc);
}

template <int BN> __device__ static __forceinline__ void run(const mt_grouped_kargs &a) {
  constexpr int SB = SB_OF(BN), S = S_OF(BN);
  extern __shared__ uint8_t smem_raw[];
  uint8_t *smem = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
  uint64_t *full = (uint64_t *)(smem + S * SB), *empty = full + S;
  table *t = (table *)(empty + S);
  const int wg = threadIdx.x / 128, lane = threadIdx.x % 32;
  const int nst = (a.k + 64 * KS_OF(BN) - 1) / (64 * KS_OF(BN));

  // With two CTAs an SM (a few tokens a segment), the next call's kernels, launched dependent, may
  // take the SMs this grid leaves free now: its activations' quantizer waits for this grid before
  // it reads or writes, its GEMM builds its table and streams its first weights while this one runs
  // (neither is written by this kernel). With one (many tokens) they would gain no more than the
  // tail, and there the early start cost T = 1024 2% (lab/NOTES.md, "The next call's kernels
  // started early").
  if constexpr (MT_GROUPED_CTAS(BN) == 2)
    allow_dependents();
  uint32_t gen = 0; // the store's generation, in the producer's registers
  if (threadIdx.x < 32)
    gen = build_table<BN>(a, t); // offs was written before the kernel before this one
  if (threadIdx.x == 32)
    init_ring<S>(full, empty, t);
  __syncthreads();
  const int tiles = t->tile_start[a.nseg];

  // Registers: the producer warpgroup gives its registers to the consumers (BN / 2 accumulators, up
  // to 128, two A register sets and the decode): 40 / 232 a thread at one CTA an SM; at two (BN <=
  // 32, 80 a thread at launch) 24 / 104, without which ptxas serializes the wgmmas.
  if (wg == 0) { // producer: one thread keeps the ring of stages full
    if constexpr (MT_GROUPED_CTAS(BN) == 1)
      asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
    else
      asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
    if (threadIdx.x == 0)
      produce<BN>(a, t, gen, smem, full, empty, tiles, nst);
    return;
  }
  if constexpr (MT_GROUPED_CTAS(BN) == 1)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
  else
    asm volatile("setmaxnreg.inc.sync.aligned.u32 104;\n");
  const int cw = __shfl_sync(0xffffffffu, wg - 1, 0);
  const int hw = 8 * cw + 2 * ((threadIdx.x % 128) / 32); // the warp's first row group of the band
  scales_at sc = a.acts ? AFTER_ACTS : AFTER_WAIT;
  ring_pos at;
  // narrower wgmmas for a tile's rows (tile_rows) on the common output alone: BF16, without C or
  // bias
  const bool narrow = !has_extra(a) && a.ytype != DT_FP16;
  for (int round = 0;; round++) {
    for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
      const where wh = locate<BN>(t, a.nseg, tile);
      tile_rows<BN>(a, t, smem, full, empty, at, nst, hw, lane, wh, wh.cb * CB + 64 * cw, narrow,
                    sc);
    }
    // after the call's refresh, its verdict: where it requantized a slice, every tile again (the
    // outputs written anew; nothing reads them before this grid ends)
    if (round || !a.acts || (int)blockIdx.x >= tiles)
      return;
    grid_dependency_wait();
    if (!producer_saw_moved(t))
      return;
  }
}
} // namespace grp

#define MT_GROUPED(BN)                                                                             \
  extern "C" __global__ void __launch_bounds__(384, MT_GROUPED_CTAS(BN))                           \
      mt_grouped_n##BN(const __grid_constant__ mt_grouped_kargs a) {                               \
    grp::run<BN>(a);                                                                               \
  }
MT_GROUPED(8)
MT_GROUPED(16)
MT_GROUPED(32)
MT_GROUPED(64)
MT_GROUPED(128)
MT_GROUPED(256)

// The segments' row ends from the host's counts (gemm_args.h, mt_seg_ends_args): thread j writes
// run j's segments, after summing the runs before it.
extern "C" __global__ void __launch_bounds__(128)
    mt_seg_ends(const __grid_constant__ mt_seg_ends_args a) {
  for (int j = threadIdx.x; j < a.nruns; j += blockDim.x) {
    int seg = a.seg0, row = a.row0;
    for (int i = 0; i < j; i++)
      seg += a.size[i], row += a.size[i] * a.rows[i];
    for (int s = 0; s < a.size[j]; s++)
      a.offs[seg + s] = row + (s + 1) * a.rows[j];
  }
}

// vLLM's fused-MoE dispatch into segments and row lists (gemm_args.h, mt_moe_dispatch_args): one
// CTA, three passes over the slots the Triton kernel would run: count each expert's valid slots
// (shared-memory atomics), an exclusive scan of the counts (the segment ends), then each slot's
// place in its segment (atomics again: the order within a segment is any, and a row's bits do not
// depend on its position). The slots' blocks are read as the Triton kernel reads them, so a row
// is routed where that kernel would have computed it and nowhere else.
namespace moe {
__device__ static inline bool slot(const mt_moe_dispatch_args &a, int s, int &id, int &e) {
  if (a.sorted) {
    id = a.sorted[s];
    e = a.experts[s / a.block_m];
  } else {
    id = s;
    e = a.experts[s];
  }
  return id >= 0 && id < a.valid;
}

// The expert's exclusive prefix over the CTA (thread t: expert t), and the total to every thread.
__device__ static inline int scan(int own, int *warp_sums, int &total) {
  const int lane = threadIdx.x % 32, w = threadIdx.x / 32, nw = blockDim.x / 32;
  int incl = own;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o)
      incl += u;
  }
  if (lane == 31)
    warp_sums[w] = incl;
  __syncthreads();
  int before = 0;
  total = 0;
  for (int i = 0; i < nw; i++) {
    before += i < w ? warp_sums[i] : 0;
    total += warp_sums[i];
  }
  return before + incl - own;
}

// A valid slot of a block of expert -1: its output row zeroed (the Triton kernel's
// write_zeros_to_output), 2-byte elements.
__device__ static inline void zero_row(const mt_moe_dispatch_args &a, int id) {
  uint16_t *row = (uint16_t *)a.y + (long long)id * a.ldy;
  for (int j = 0; j < a.n; j++)
    row[j] = 0;
}
} // namespace moe

extern "C" __global__ void __launch_bounds__(MT_MOE_THREADS)
    mt_moe_dispatch(const __grid_constant__ mt_moe_dispatch_args a) {
  __shared__ int next[MT_MOE_MAX_EXPERTS], warp_sums[MT_MOE_THREADS / 32];
  const int t = threadIdx.x, T = blockDim.x;
  for (int e = t; e < MT_MOE_MAX_EXPERTS; e += T)
    next[e] = 0;
  const long long padded = *a.post_padded;
  const long long run =
      min((long long)a.blocks, padded > 0 ? (padded + a.block_m - 1) / a.block_m : 0LL);
  const int slots = (int)(a.sorted ? run * a.block_m : run);
  __syncthreads();
  for (int s = t; s < slots; s += T) {
    int id, e;
    if (moe::slot(a, s, id, e) && e >= 0 && e < a.nseg)
      atomicAdd(&next[e], 1);
  }
  __syncthreads();
  const int own = t < a.nseg ? next[t] : 0;
  int total;
  const int start = moe::scan(own, warp_sums, total);
  if (t < a.nseg) {
    next[t] = start;
    a.offs[t] = start + own;
  }
  __syncthreads();
  for (int s = t; s < slots; s += T) {
    int id, e;
    if (!moe::slot(a, s, id, e))
      continue;
    if (e >= 0 && e < a.nseg) {
      const int r = atomicAdd(&next[e], 1);
      a.src[r] = id / a.top_k;
      a.dst[r] = id;
      if (a.w)
        a.w[r] = a.weights[id];
    } else if (e == -1) {
      moe::zero_row(a, id);
    }
  }
  __syncthreads();
  for (int r = total + t; r < a.valid; r += T) {
    a.src[r] = total ? a.src[0] : 0;
    a.dst[r] = -1;
  }
}
