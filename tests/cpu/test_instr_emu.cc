// test_instr_emu.cc — kernels/instr.cu's kernels run on the CPU (tests/cpu/cuda_emu.h: a CTA as
// threads, barriers and warp shuffles emulated) against the host twin of kernels/instr.h, which
// tests/cpu/test_shim_instr.c checks against tools/minite-compare's reference: each kept row's row
// hash, output hash and segment bit for bit, its sketch within FP32 summation error, the count of
// rows chosen, the rows past the block's room dropped, a row's whole record the same bits whichever
// rows share its CTA; the finish's weight sums and its publication (the block copied, the flag
// last; an empty call's flag alone); the shadow's sums and the probe's counts; a captured call's
// replays, one in `every` digesting. What the GPU adds (timing, its memory model) only
// tests/gpu/test_instruments.py sees.
#include "tests/cpu/cuda_emu.h"

#include "kernels/instr.cu"

#include <algorithm>
#include <map>
#include <random>
#include <tuple>

extern "C" {
#include "tests/harness.h"
}

namespace {

constexpr int kThreads = 256; // kernels/instr.c launches every instrument kernel with 256
constexpr int kCap = 128;     // the rows a slot's block holds (shim/instr_writer.h, MT_IW_ROWS)

struct block {
  std::vector<unsigned char> mem;
  mt_instr_header *hdr() { return (mt_instr_header *)mem.data(); }
  mt_instr_row *rows() { return (mt_instr_row *)(hdr() + 1); }
  explicit block(int cap) : mem(sizeof(mt_instr_header) + (size_t)cap * sizeof(mt_instr_row)) {}
};

// Random BF16 values of moderate size (no NaN or Inf), row by row at stride ld.
std::vector<uint16_t> matrix(std::mt19937 &rng, int rows, int cols, int ld) {
  std::vector<uint16_t> m((size_t)rows * ld, 0);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (int r = 0; r < rows; r++)
    for (int c = 0; c < cols; c++) {
      const float f = u(rng);
      uint32_t b;
      std::memcpy(&b, &f, 4);
      m[(size_t)r * ld + c] = (uint16_t)(b >> 16);
    }
  return m;
}

// Every row the host twin (kernels/instr.h, mt_instr_digest_host) chooses, into a block with
// room for all of them.
block twin(mt_instr_digest_args a) {
  block b(a.m);
  a.hdr = b.hdr(), a.rows = b.rows(), a.cap = a.m;
  mt_instr_digest_host(&a);
  return b;
}

// The digest of `a` into dev's block, and a finish, on the emulator with kernels/instr.c's grids.
void run_digest(mt_instr_digest_args a, block &dev) {
  a.hdr = dev.hdr(), a.rows = dev.rows();
  emu::launch(mt_instr_digest_grid(&a), kThreads, [&a] { mt_instr_digest(a); });
}
void run_finish(const mt_instr_finish_args &f) {
  emu::launch(mt_instr_finish_grid(&f), kThreads, [&f] { mt_instr_finish(f); });
}

// One call's digest on the emulator against the twin; `what` names the case in failures.
void check_digest(const char *what, mt_instr_digest_args a) {
  block b(a.cap);
  run_digest(a, b);
  block want = twin(a);
  const unsigned chosen = want.hdr()->selected;
  CHECKF(b.hdr()->selected == chosen, "%s: %u rows chosen, the twin %u", what, b.hdr()->selected,
         chosen);
  std::map<std::tuple<uint64_t, uint64_t, int32_t>, const mt_instr_row *> by_key;
  for (unsigned i = 0; i < chosen; i++) {
    const mt_instr_row &w = want.rows()[i];
    by_key[{w.row_hash, w.out_hash, w.seg}] = &w;
  }
  const unsigned kept = std::min<unsigned>(b.hdr()->selected, (unsigned)a.cap);
  unsigned found = 0, sketches = 0;
  for (unsigned i = 0; i < kept; i++) {
    const mt_instr_row &g = b.rows()[i];
    auto it = by_key.find({g.row_hash, g.out_hash, g.seg});
    if (it == by_key.end())
      continue;
    found++;
    float norm = 0.0f;
    for (float v : it->second->sketch)
      norm += v * v;
    bool ok = g.wsum == 0;
    for (int k = 0; k < MT_INSTR_SKETCH; k++)
      ok &= std::fabs(g.sketch[k] - it->second->sketch[k]) <= 1e-5f * std::sqrt(norm) + 1e-30f;
    sketches += ok;
  }
  CHECKF(found == kept && sketches == kept,
         "%s: of %u kept rows %u are the twin's rows, %u with its sketch", what, kept, found,
         sketches);
}

// A call's arguments over x [m][k] and y [m][n] (row strides ldx, ldy), rate 1/`inverse_rate`.
mt_instr_digest_args digest_args(const std::vector<uint16_t> &x, const std::vector<uint16_t> &y,
                                 int m, int n, int k, int ldx, int ldy, int inverse_rate) {
  mt_instr_digest_args a{};
  a.x = x.data(), a.y = y.data(), a.ldx = ldx, a.ldy = ldy;
  a.m = m, a.n = n, a.k = k;
  a.all = inverse_rate == 1;
  a.threshold = inverse_rate > 1 ? UINT64_MAX / (uint64_t)inverse_rate : 0;
  a.cap = kCap;
  return a;
}

void digest_single_problem() {
  std::mt19937 rng(1);
  const int m = 37, n = 1536, k = 2048;
  auto x = matrix(rng, m, k, k), y = matrix(rng, m, n, n);
  check_digest("single problem, 1/4", digest_args(x, y, m, n, k, k, n, 4));
  check_digest("single problem, every row", digest_args(x, y, m, n, k, k, n, 1));
}

// Rows of a grouped call with offsets, each token's row repeated in several segments (a
// gate_up call's copies of one token), so that one CTA holds several chosen rows.
void digest_grouped_offsets() {
  std::mt19937 rng(2);
  const int m = 100, n = 2048, k = 768, nseg = 9;
  auto y = matrix(rng, m, n, n), tokens = matrix(rng, 20, k, k);
  std::vector<uint16_t> x((size_t)m * k);
  for (int r = 0; r < m; r++)
    std::memcpy(&x[(size_t)r * k], &tokens[(size_t)(r % 20) * k], 2 * (size_t)k);
  std::vector<int32_t> offs = {3, 3, 20, 41, 42, 60, 77, 90, 96}; // rows 96..99 in none
  mt_instr_digest_args a = digest_args(x, y, m, n, k, k, n, 3);
  a.offs = offs.data(), a.nseg = nseg;
  check_digest("grouped, offsets, 1/3", a);
  a.all = 1;
  check_digest("grouped, offsets, every row", a);
}

// Segments of seg_rows rows at strides (a strided batch), rows of k <= MT_INSTR_LEAD elements
// (the row hash is the lead) and an output row whose last piece is short.
void digest_strided_short_rows() {
  std::mt19937 rng(3);
  const int seg_rows = 13, nseg = 5, m = seg_rows * nseg, n = 1003, k = 64, ldy = 1008;
  const int64_t stride_x = 16 * k, stride_y = (int64_t)16 * ldy;
  auto x = matrix(rng, 16 * nseg, k, k), y = matrix(rng, 16 * nseg, n, ldy);
  mt_instr_digest_args a = digest_args(x, y, m, n, k, k, ldy, 2);
  a.seg_rows = seg_rows, a.stride_x = stride_x, a.stride_y = stride_y;
  check_digest("strided segments, short rows, 1/2", a);
}

// More rows chosen than the block holds: selected counts them all, the kept ones are the twin's.
void digest_past_the_block() {
  std::mt19937 rng(4);
  const int m = 300, n = 256, k = 512;
  auto x = matrix(rng, m, k, k), y = matrix(rng, m, n, n);
  check_digest("300 rows, every row", digest_args(x, y, m, n, k, k, n, 1));
}

// A row's record, its sketch included, has the same bits whichever rows share its CTA (the
// learner's batches and the sampler's differ): each row alone against the 8 rows of one CTA, all
// chosen, whose warps then split every row's passes among them.
void digest_same_bits_in_any_cta() {
  std::mt19937 rng(5);
  const int m = MT_INSTR_DIGEST_WARPS, n = 1536, k = 2048;
  auto x = matrix(rng, m, k, k), y = matrix(rng, m, n, n);
  block all(kCap);
  run_digest(digest_args(x, y, m, n, k, k, n, 1), all);
  int same = 0;
  for (int r = 0; r < m; r++) {
    std::vector<uint16_t> xr(x.begin() + (size_t)r * k, x.begin() + (size_t)(r + 1) * k);
    std::vector<uint16_t> yr(y.begin() + (size_t)r * n, y.begin() + (size_t)(r + 1) * n);
    block one(kCap);
    run_digest(digest_args(xr, yr, 1, n, k, k, n, 1), one);
    for (int i = 0; i < m; i++)
      same += one.hdr()->selected == 1 &&
              std::memcmp(&all.rows()[i], &one.rows()[0], sizeof(mt_instr_row)) == 0;
  }
  CHECKF(all.hdr()->selected == (unsigned)m && same == m,
         "%d of %d rows digested alone have the bits they have among %u chosen in one CTA", same, m,
         all.hdr()->selected);
}

// The finish of an uncaptured call: a grouped call's frozen sums into the first row of each
// segment, the block copied to its host twin, then the flag; a call that chose nothing: the flag
// alone, marked empty, and nothing copied.
void finish_publishes() {
  std::mt19937 rng(5);
  const int m = 64, n = 256, k = 512;
  auto x = matrix(rng, m, k, k), y = matrix(rng, m, n, n);
  std::vector<int32_t> offs = {10, 30, 64};
  mt_instr_digest_args a = digest_args(x, y, m, n, k, k, n, 1);
  a.offs = offs.data(), a.nseg = 3;
  block dev(a.cap), host(a.cap);
  run_digest(a, dev);
  const uint64_t frozen[3] = {0x1111, 0x2222, 0x3333};
  uint32_t flag = 0;
  mt_instr_finish_args f{};
  f.w = x.data(), f.ldw = k, f.w_stride = 1, f.grouped = 1, f.frozen_sum = frozen;
  f.frozen_stride = 1, f.n = n, f.k = k, f.hdr = dev.hdr(), f.dst = host.mem.data();
  f.flag = &flag, f.cap = a.cap, f.seq = 7;
  run_finish(f);
  CHECKF(flag == 7, "flag %#x, want 7", flag);
  const mt_instr_header *h = host.hdr();
  CHECKF(h->selected == 64, "published %u rows chosen, want 64", h->selected);
  uint64_t sums = 0;
  int firsts = 0;
  for (unsigned i = 0; i < 64; i++) {
    sums += host.rows()[i].wsum;
    firsts += host.rows()[i].wsum != 0;
  }
  CHECKF(firsts == 3 && sums == 0x6666, "%d rows carry a weight sum, summing to %#llx", firsts,
         (unsigned long long)sums);
  CHECKF(dev.hdr()->selected == 0, "the device header is reset for the next use");

  std::vector<uint16_t> none_x = matrix(rng, 4, k, k);
  a = digest_args(none_x, y, 4, n, k, k, n, 1 << 30); // 4 rows at 2^-30: none chosen
  run_digest(a, dev);
  std::fill(host.mem.begin(), host.mem.end(), 0xAB);
  f.seq = 8, f.empty_ok = 1;
  emu::launch(2, kThreads, [&f] { mt_instr_finish(f); }); // a grid of several: CTA 0 alone
  CHECKF(flag == (8u | MT_INSTR_EMPTY), "flag %#x, want 8 marked empty", flag);
  CHECKF(host.mem[0] == 0xAB, "an empty publication copies nothing");
}

// The finish's weight sums where nothing is stored (a grid of CTAs over the sampled lines): a
// single problem's, [out, in] and [in, out], with its bias; a grouped call's, each segment's into
// its first digested row.
void finish_weight_sums() {
  std::mt19937 rng(6);
  const int k = 512, m = 16;
  // a row of 512 elements is one run of 8 lines: 33 groups of the sample's runs, 264 sampled lines,
  // two CTAs of 256
  int n = 32 * MT_SAMPLE_STEP + MT_SAMPLE_STEP / 2;
  auto w = matrix(rng, n, k, k), w_t = matrix(rng, k, n, n), bias = matrix(rng, 1, n, n);
  auto x = matrix(rng, m, k, k), y = matrix(rng, m, n, n);
  for (int in_out = 0; in_out < 2; in_out++) {
    mt_instr_digest_args a = digest_args(x, y, m, n, k, k, n, 1);
    block dev(a.cap), host(a.cap);
    run_digest(a, dev);
    uint32_t flag = 0;
    mt_instr_finish_args f{};
    f.w = in_out ? w_t.data() : w.data(), f.ldw = in_out ? n : k, f.in_out = in_out;
    f.bias = bias.data(), f.bias_bytes = 2 * n, f.n = n, f.k = k, f.hdr = dev.hdr();
    f.dst = host.mem.data(), f.flag = &flag, f.cap = a.cap, f.seq = 3;
    run_finish(f);
    const uint64_t want = mt_instr_weight_sum_of((const uint16_t *)f.w, f.ldw, n, k, in_out);
    CHECKF(mt_instr_finish_grid(&f) > 1 && host.hdr()->wsum == want && flag == 3,
           "%s: %u CTAs, weight sum %#llx, want %#llx", in_out ? "[in, out]" : "[out, in]",
           mt_instr_finish_grid(&f), (unsigned long long)host.hdr()->wsum,
           (unsigned long long)want);
    CHECK(host.hdr()->bsum == mt_instr_content_sum(bias.data(), 2 * (size_t)n, 0));
  }
  n = 384; // a CTA for each of the block's rows that may name a weight
  y = matrix(rng, m, n, n);
  std::vector<uint16_t> ws = matrix(rng, 3 * n, k, k); // three experts' weights, one after another
  std::vector<int32_t> offs = {5, 11, 16};
  mt_instr_digest_args a = digest_args(x, y, m, n, k, k, n, 1);
  a.offs = offs.data(), a.nseg = 3;
  block dev(a.cap), host(a.cap);
  run_digest(a, dev);
  uint32_t flag = 0;
  mt_instr_finish_args f{};
  f.w = ws.data(), f.ldw = k, f.w_stride = (int64_t)n * k, f.grouped = 1, f.n = n, f.k = k;
  f.hdr = dev.hdr(), f.dst = host.mem.data(), f.flag = &flag, f.cap = a.cap, f.seq = 4;
  run_finish(f);
  uint64_t want[3], got[3] = {0, 0, 0};
  for (int s = 0; s < 3; s++)
    want[s] = mt_instr_weight_sum_of(ws.data() + (size_t)s * n * k, k, n, k, 0);
  int carrying = 0;
  for (int i = 0; i < m; i++)
    if (host.rows()[i].wsum) {
      carrying++;
      got[host.rows()[i].seg] = host.rows()[i].wsum;
    }
  CHECKF(carrying == 3 && got[0] == want[0] && got[1] == want[1] && got[2] == want[2] && flag == 4,
         "grouped: %d rows carry a sum; segment 1's %#llx, want %#llx", carrying,
         (unsigned long long)got[1], (unsigned long long)want[1]);
}

// A shadow's header against its twin's: `nonfinite` pairs counted by both, the same max, the
// double sums within 1e-12 (the kernel adds them in another order), none of them zero.
void same_shadow(const mt_instr_header &g, const mt_instr_header &w, unsigned nonfinite,
                 const char *what) {
  CHECKF(g.shadow_nonfinite == nonfinite && w.shadow_nonfinite == nonfinite,
         "%s: non-finite %u, twin %u", what, g.shadow_nonfinite, w.shadow_nonfinite);
  CHECKF(g.shadow_max_bits == w.shadow_max_bits && w.shadow_max_bits != 0, "%s: max %#x, twin %#x",
         what, g.shadow_max_bits, w.shadow_max_bits);
  CHECKF(std::fabs(g.shadow_d2 - w.shadow_d2) <= 1e-12 * w.shadow_d2 &&
             std::fabs(g.shadow_r2 - w.shadow_r2) <= 1e-12 * w.shadow_r2 && w.shadow_r2 > 0,
         "%s: sums %.17g %.17g, twin %.17g %.17g", what, g.shadow_d2, g.shadow_r2, w.shadow_d2,
         w.shadow_r2);
}

// The shadow's sums against the twin's, with non-finite elements skipped and counted; strided
// segments.
void shadow_sums() {
  std::mt19937 rng(7);
  const int seg_rows = 7, nseg = 3, m = seg_rows * nseg, n = 600, ld = 608;
  auto y = matrix(rng, 8 * nseg, n, ld), ref = matrix(rng, 8 * nseg, n, ld);
  y[5] = 0x7fc0, ref[ld + 9] = 0x7f80; // a NaN and an Inf
  mt_instr_shadow_args a{};
  a.y = y.data(), a.ref = ref.data(), a.ld = ld, a.stride = 8 * ld, a.m = m, a.n = n;
  a.seg_rows = seg_rows;
  block got(1), want(1);
  a.hdr = got.hdr();
  emu::launch(mt_instr_shadow_grid(&a), kThreads, [&a] { mt_instr_shadow(a); });
  a.hdr = want.hdr();
  mt_instr_shadow_host(&a);
  same_shadow(*got.hdr(), *want.hdr(), 2, "strided");
}

// The shadow of a grouped call's rows against the product it forms: the kernel's FP32 references
// are the twin's bit for bit (the same fused chain), so the max is too; rows of three segments of
// a weight stored [n][k] and one stored [k][n], a row past the last offset skipped, a NaN counted.
void shadow_rows() {
  std::mt19937 rng(11);
  const int nseg = 3, n = 300, k = 48, rows = 40, ldx = 56, ldy = 304;
  auto x = matrix(rng, rows, k, ldx), y = matrix(rng, rows, n, ldy);
  y[9 * ldy + 7] = 0x7fc0;                 // a NaN in row 9
  const int32_t offs[nseg] = {10, 10, 36}; // rows 36..39 in no segment; segment 1 empty
  for (int in_out = 0; in_out < 2; in_out++) {
    auto w = in_out ? matrix(rng, nseg * k, n, n) : matrix(rng, nseg * n, k, k);
    mt_instr_shadow_rows_args a{};
    a.x = x.data(), a.y = y.data(), a.w = w.data(), a.ldx = ldx, a.ldy = ldy;
    a.ldw = in_out ? n : k, a.w_stride = (int64_t)n * k, a.offs = offs, a.nseg = nseg;
    a.n = n, a.k = k, a.in_out = in_out, a.alpha = 0.5f, a.nrows = 5;
    const int32_t pick[5] = {0, 9, 17, 35, 38};
    std::memcpy(a.rows, pick, sizeof pick);
    block got(1), want(1);
    a.hdr = got.hdr();
    emu::launch(mt_instr_shadow_rows_grid(&a), kThreads, [&a] { mt_instr_shadow_rows(a); });
    a.hdr = want.hdr();
    mt_instr_shadow_rows_host(&a);
    same_shadow(*got.hdr(), *want.hdr(), 1, in_out ? "rows, [k][n]" : "rows, [n][k]");
  }
}

// The probe: rows recomputed alone against their in-batch rows, one differing in one element, one
// in a NaN (its difference Inf), one beyond the last segment's end (not compared, counted
// outside).
void probe_rows() {
  std::mt19937 rng(8);
  const int n = 700, ld_alone = 704;
  auto y = matrix(rng, 40, n, n);
  std::vector<uint16_t> alone((size_t)MT_INSTR_PROBE_ROWS * ld_alone, 0);
  const int32_t rows[MT_INSTR_PROBE_ROWS] = {0, 13, 26, 39};
  for (int p = 0; p < MT_INSTR_PROBE_ROWS; p++)
    std::memcpy(&alone[(size_t)p * ld_alone], &y[(size_t)rows[p] * n], 2 * (size_t)n);
  alone[ld_alone + 321] ^= 0x0040;          // row 13 differs in one element
  alone[2 * (size_t)ld_alone + 5] = 0x7fc0; // row 26 in a NaN against a number
  std::vector<int32_t> offs = {20, 30};     // row 39 lies past the last segment
  mt_instr_probe_args a{};
  a.y = y.data(), a.alone = alone.data(), a.nrows = MT_INSTR_PROBE_ROWS, a.n = n;
  a.ld_alone = ld_alone, a.offs = offs.data(), a.nseg = 2;
  for (int p = 0; p < MT_INSTR_PROBE_ROWS; p++)
    a.rows[p] = rows[p], a.yoff[p] = (int64_t)rows[p] * n;
  block got(1), want(1);
  a.hdr = got.hdr();
  emu::launch((unsigned)a.nrows, kThreads, [&a] { mt_instr_probe(a); });
  a.hdr = want.hdr();
  mt_instr_probe_host(&a);
  const mt_instr_header &g = *got.hdr(), &w = *want.hdr();
  CHECKF(g.probe_differing == 2 && w.probe_differing == 2 && g.probe_outside == 1 &&
             w.probe_outside == 1 && g.probe_max_bits == w.probe_max_bits &&
             g.probe_max_bits == 0x7f800000u, // Inf: NaN against a number
         "differing %u (twin %u), outside %u (twin %u), max %#x (twin %#x)", g.probe_differing,
         w.probe_differing, g.probe_outside, w.probe_outside, g.probe_max_bits, w.probe_max_bits);
}

// A captured call's replays (seq 0): one in `every` digests, by the count its finish raises at the
// end of each replay; a replay that digests publishes under the flag's seqlock, one that does not
// publishes nothing.
void captured_replays_gated() {
  std::mt19937 rng(9);
  const int m = 24, n = 256, k = 512;
  auto x = matrix(rng, m, k, k), y = matrix(rng, m, n, n);
  block dev(kCap), host(kCap);
  uint32_t tick = 7, flag = 0, published = 0;
  for (int replay = 0; replay < 8; replay++) {
    mt_instr_digest_args a = digest_args(x, y, m, n, k, k, n, 1);
    a.tick = &tick, a.every = 4;
    const bool due = tick % 4 == 0;
    run_digest(a, dev);
    CHECKF(dev.hdr()->selected == (due ? (unsigned)m : 0u), "tick %u: %u rows chosen", tick,
           dev.hdr()->selected);
    mt_instr_finish_args f{};
    f.n = n, f.k = k, f.hdr = dev.hdr(), f.dst = host.mem.data(), f.flag = &flag, f.cap = kCap;
    f.seq = 0, f.empty_ok = 1, f.tick = &tick;
    f.w = x.data(), f.ldw = k; // any weight: a frozen sum below, nothing read
    const uint64_t frozen = 0x77;
    f.frozen_sum = &frozen;
    const uint32_t before = tick, flag_before = flag;
    run_finish(f);
    CHECKF(tick == before + 1, "the finish raised the count %u to %u", before, tick);
    if (due) {
      published++;
      CHECKF(flag % 2 == 0 && flag > flag_before && host.hdr()->selected == (unsigned)m &&
                 host.hdr()->wsum == 0x77,
             "a digesting replay's publication: flag %u after %u", flag, flag_before);
    } else {
      CHECKF(flag == flag_before, "a replay with nothing chosen wrote the flag %u", flag);
    }
  }
  CHECKF(published == 2, "%u of 8 replays digested, want 2", published);
}

} // namespace

int main() {
  RUN(digest_single_problem);
  RUN(digest_grouped_offsets);
  RUN(digest_strided_short_rows);
  RUN(digest_past_the_block);
  RUN(digest_same_bits_in_any_cta);
  RUN(finish_publishes);
  RUN(finish_weight_sums);
  RUN(shadow_sums);
  RUN(shadow_rows);
  RUN(probe_rows);
  RUN(captured_replays_gated);
  return mt_test_done();
}
