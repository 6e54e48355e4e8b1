// Stream-K schedule of attn_kernel's decode config (decode option bit 16, KVATTN_DECODE_STREAMK=1;
// plan_streamk_kernel, attn_kernel<..., SK = true>, merge_streamk_kernel).  The schedule's
// arithmetic (ops/cuda/streamk_schedule.h, the same functions the kernels use) is checked on
// the CPU: the CTA ranges partition the flattened tiles, each CTA's walk yields pieces that
// cover every unit exactly once, and no unit has more pieces than the partial slots allow.
// On the GPU every case runs against the CPU reference: random inputs, outputs poisoned,
// permuted block tables with block 0 reserved (make_batch), odd and empty lengths, padding
// tokens, repeated calls on one workspace; each call is checked to have taken the stream-K path
// (streamk_launches()).  bf16 / f16 / fp8 (fast variant and the previous one), GQA 1 / 4 / 8,
// D 64 / 128 / 256, multi-token rows (causal drafts, xqa masks), LSE in both bases, sinks, soft
// cap, sliding window, mm prefix ranges, every cache layout and the block-table form; shapes
// with one piece per unit, a few, many (one long request over most CTAs), and T < grid.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kvattn/core/cuda_runtime_api.h"
#include "cuda_attn_case.h"
#include "ops/cuda/streamk_schedule.h"

namespace kvattn::ops::testing {
namespace {

namespace sk = cuda_impl::sk;
constexpr int kStreamK = 16;  // decode option bit

// ---- the schedule on the CPU (no GPU needed) ----------------------------------------------
struct Walk {
  int64_t pieces_total = 0;
  int max_pieces = 0;
  int max_cost = 0;  // most (tiles + lead x pieces) of one CTA
};
// Plans units of the given lengths as plan_streamk_kernel does (lead = piece-start cost) and
// walks every CTA's range as attn_kernel's thread 0 does; checks coverage, piece counts, slots.
Walk check_schedule(const std::vector<int32_t>& len, int64_t max_splits, int64_t grid, int32_t lead = 3) {
  const int64_t U = static_cast<int64_t>(len.size());
  int64_t T = 0;
  int32_t lmax = 0;
  for (int32_t l : len) {
    EXPECT_GE(l, 1);
    T += l;
    lmax = std::max(lmax, l);
  }
  const sk::Schedule sc = sk::schedule(T, U, lmax, max_splits, grid, lead);
  const int64_t C = sc.C, G = sc.G;
  const bool aligned = T == U * lmax && U <= grid;  // uniform lengths in one wave
  Walk res;
  if (T == 0) {
    EXPECT_EQ(G, 0);
    return res;
  }
  EXPECT_GE(G, 1);
  EXPECT_LE(G, grid);
  EXPECT_EQ(C, T + int64_t(sc.lead) * U);
  if (aligned) {
    EXPECT_EQ(sc.lead, 0);
    EXPECT_EQ(G % U, 0) << "uniform one-wave call: every unit in the same number of pieces";
  } else {
    EXPECT_EQ(sc.lead, lead);
    if (G > 1) {
      EXPECT_GE(C / G, sk::min_tiles(lmax, max_splits)) << "ranges shorter than min_tiles";
    }
  }
  std::vector<int64_t> start(len.size());
  int64_t before = 0;
  for (int64_t w = 0; w < U; ++w) {
    start[size_t(w)] = sk::unit_start(before, w, sc.lead);
    before += len[size_t(w)];
  }
  std::vector<int> first(len.size()), pieces(len.size());
  for (size_t u = 0; u < len.size(); ++u) {
    first[u] = static_cast<int>(sk::cta_of(start[u], C, G));
    pieces[u] = static_cast<int>(sk::cta_of(start[u] + len[u] - 1, C, G)) - first[u] + 1;
    EXPECT_LE(pieces[u], max_splits - 1) << "unit " << u << " has more pieces than partial slots";
    if (aligned) {
      EXPECT_EQ(pieces[u], G / U) << "unit " << u;
    }
    res.max_pieces = std::max(res.max_pieces, pieces[u]);
  }
  std::vector<int> seen(static_cast<size_t>(T), 0);
  std::vector<int64_t> tile_base(len.size());
  for (size_t u = 0, acc = 0; u < len.size(); acc += size_t(len[u]), ++u) tile_base[u] = int64_t(acc);
  std::vector<int> got(len.size(), 0);
  for (int64_t c = 0; c < G; ++c) {
    const int64_t b = sk::range_begin(c, C, G), e = sk::range_begin(c + 1, C, G);
    EXPECT_LT(b, e) << "empty range " << c;
    // the plan's unit of the range's first position: largest u with start - lead <= b
    int64_t u = 0;
    while (u + 1 < U && start[size_t(u + 1)] - sc.lead <= b) ++u;
    int64_t t = b;
    int cost = 0;
    while (t < e) {
      if (u >= U) {
        ADD_FAILURE() << "range " << c << " walks past the last unit";
        break;
      }
      const sk::Piece pc = sk::piece_at(t, e, start[size_t(u)], len[size_t(u)]);
      if (pc.te <= pc.tb) break;  // the range ends in the unit's lead
      EXPECT_GE(pc.tb, 0);
      EXPECT_LE(pc.te, len[size_t(u)]);
      const int slot = static_cast<int>(c) - first[size_t(u)];
      EXPECT_GE(slot, 0);
      EXPECT_LT(slot, pieces[size_t(u)]);
      for (int k = pc.tb; k < pc.te; ++k) seen[static_cast<size_t>(tile_base[size_t(u)] + k)]++;
      got[size_t(u)]++;
      res.pieces_total++;
      cost += pc.te - pc.tb + lead;
      t = start[size_t(u)] + pc.te;
      if (pc.te == len[size_t(u)]) ++u;
    }
    res.max_cost = std::max(res.max_cost, cost);
  }
  for (int64_t t = 0; t < T; ++t) EXPECT_EQ(seen[static_cast<size_t>(t)], 1) << "tile " << t;
  for (size_t u = 0; u < len.size(); ++u) EXPECT_EQ(got[u], pieces[u]) << "unit " << u;
  return res;
}

TEST(StreamKSchedule, RangesPartitionTilesAndBoundPieces) {
  std::mt19937 rng(4401);
  // 64 x 4096 bf16: 512 units of 64 tiles on 396 CTAs: ranges of ceil(34304 / 396) = 87
  // positions, plus at most one start not counted (a range's first piece inside a unit)
  {
    const Walk w = check_schedule(std::vector<int32_t>(512, 64), 128, 396);
    EXPECT_LE(w.max_cost, 87 + 3);
  }
  // uniform one-wave calls (16 x 4096: 128 units -> 3 pieces each; 8 x 1024: 64 units of 16
  // tiles -> 6 pieces; 3 units of 2 tiles -> 2 pieces), and a tight slot bound
  EXPECT_EQ(check_schedule(std::vector<int32_t>(128, 64), 128, 396).pieces_total, 384);
  EXPECT_EQ(check_schedule(std::vector<int32_t>(64, 16), 128, 396).pieces_total, 384);
  EXPECT_EQ(check_schedule(std::vector<int32_t>(3, 2), 128, 396).pieces_total, 6);
  EXPECT_EQ(check_schedule(std::vector<int32_t>(10, 50), 4, 396).pieces_total, 30);
  {
    std::vector<int32_t> l(40, 2);
    l[7] = 313;
    const Walk w = check_schedule(l, 128, 396);
    EXPECT_GT(w.max_pieces, 20);  // the long unit runs on many CTAs
  }
  // one long unit among short ones, all one-tile units (empty requests), fewer tiles than
  // CTAs, tight partial slots, random lengths / slot bounds / grids
  check_schedule(std::vector<int32_t>(100, 1), 128, 396);
  check_schedule({5000, 1, 7, 5000}, 4, 396);
  check_schedule({5000, 1, 7, 5000}, 3, 396, 2);
  check_schedule(std::vector<int32_t>(700, 1), 128, 396, 2);  // fp8 lead, one-tile units
  check_schedule({}, 128, 396);
  for (int it = 0; it < 300; ++it) {
    const int n = 1 + static_cast<int>(rng() % 300);
    std::vector<int32_t> l(static_cast<size_t>(n));
    const int cap = it % 3 == 0 ? 8 : (it % 3 == 1 ? 200 : 3000);
    for (auto& x : l) x = 1 + static_cast<int32_t>(rng() % static_cast<uint32_t>(cap));
    if (it % 7 == 0) std::fill(l.begin(), l.end(), l[0]);  // uniform
    const int64_t ms = 3 + static_cast<int64_t>(rng() % 126);
    const int64_t grid = 1 + static_cast<int64_t>(rng() % 528);
    SCOPED_TRACE(::testing::Message() << "random schedule " << it << " units " << n << " max_splits " << ms
                                      << " grid " << grid);
    check_schedule(l, ms, grid, it % 2 == 0 ? 3 : 2);
  }
}

// ---- the kernels on the GPU --------------------------------------------------------------
class CudaDecodeStreamK : public CudaGeneralDecodeTest {
 protected:
  // default options (wave rule, fp8 fast) plus the stream-K bit
  void set_opts(int extra_off = 0) {
    const int o = ((opts0_ | 1 | 4) & ~extra_off) | kStreamK;
    cuda_impl::set_decode_options(o);
    ASSERT_EQ(cuda_impl::decode_options(), o);
  }
  // runs the case; every call must have taken the stream-K path
  void run_sk(const AttnCase& c, uint32_t seed) {
    const int64_t n0 = cuda_impl::streamk_launches();
    run_attn_case(c, seed);
    EXPECT_EQ(cuda_impl::streamk_launches() - n0, c.repeats) << c.name << ": not every call ran stream-K";
  }
};

std::string dt_name(DType d) {
  switch (d) {
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::fp8_e4m3: return "e4m3";
    case DType::fp8_e5m2: return "e5m2";
    default: return "?";
  }
}

// 34 requests (> 32: never the small path); mixed: empty (kv 0) requests, q_len 0 requests, odd
// lengths and one long request (5001 keys: many pieces); uniform: every request `ulen` keys.
AttnCase sk_case(std::mt19937& rng, DType kv, int64_t hq, int64_t hkv, int64_t dim, bool uniform,
                 int64_t ulen = 999) {
  AttnCase c;
  c.kv_dt = kv;
  if (kv == DType::f16) { c.q_dt = DType::f16; c.out_dt = DType::f16; }
  if (kv == DType::fp8_e4m3 || kv == DType::fp8_e5m2) { c.k_scale = 0.7; c.v_scale = 1.3; }
  c.hq = hq; c.hkv = hkv; c.dim = dim;
  for (int r = 0; r < 34; ++r) {
    c.q_lens.push_back(!uniform && r % 23 == 7 ? 0 : 1);
    c.kv_lens.push_back(uniform ? ulen : (r % 19 == 3 ? 0 : 1 + static_cast<int64_t>(rng() % 1500)));
  }
  if (!uniform) c.kv_lens[5] = 5001;
  c.repeats = 2;
  return c;
}

TEST_F(CudaDecodeStreamK, TypesGqaHeadDims) {
  std::mt19937 rng(4501);
  uint32_t seed = 4510;
  const int64_t heads[3][2] = {{8, 8}, {8, 2}, {16, 2}};  // GQA 1, 4, 8
  set_opts();
  for (DType kv : {DType::bf16, DType::f16, DType::fp8_e4m3, DType::fp8_e5m2}) {
    for (const auto& h : heads) {
      for (int64_t dim : {64, 128, 256}) {
        for (bool uniform : {false, true}) {
          if (uniform && dim != 128) continue;
          AttnCase c = sk_case(rng, kv, h[0], h[1], dim, uniform);
          c.name = dt_name(kv) + " gqa " + std::to_string(h[0] / h[1]) + " D " + std::to_string(dim) +
                   (uniform ? " uniform" : " mixed");
          run_sk(c, seed++);
        }
      }
    }
  }
}

// fp8 with the fast variant off (the previous fp8 kernel's stream-K instantiation), and on
// (both counters move).
TEST_F(CudaDecodeStreamK, Fp8FastOnAndOff) {
  std::mt19937 rng(4601);
  uint32_t seed = 4610;
  for (bool fast : {true, false}) {
    set_opts(fast ? 0 : 4);
    for (DType kv : {DType::fp8_e4m3, DType::fp8_e5m2}) {
      AttnCase c = sk_case(rng, kv, 8, 2, 128, false);
      c.name = dt_name(kv) + (fast ? " fast" : " fast off");
      const int64_t f0 = cuda_impl::fp8_fast_launches();
      run_sk(c, seed++);
      if (kvattn::cuda::compute_capability(0) >= 90) {
        EXPECT_EQ(cuda_impl::fp8_fast_launches() - f0, fast ? c.repeats : 0) << c.name;
      }
    }
  }
}

// Pieces per unit: 1 (many short units, T / G >= unit length), 2-ish (units about a range
// long), many (one long request over most CTAs), and T < grid (a handful of tiles: few CTAs).
TEST_F(CudaDecodeStreamK, PiecesPerUnitAndFewTiles) {
  uint32_t seed = 4710;
  set_opts();
  struct Shape {
    const char* name;
    std::vector<int64_t> kv;
  };
  std::vector<Shape> shapes;
  shapes.push_back({"one piece per unit (400 requests x 200 keys)", std::vector<int64_t>(400, 200)});
  shapes.push_back({"a few pieces per unit (40 x 1000)", std::vector<int64_t>(40, 1000)});
  {
    std::vector<int64_t> kv(34, 60);
    kv[11] = 20011;
    shapes.push_back({"many pieces (one 20011-key request among 60-key ones)", kv});
  }
  shapes.push_back({"T < grid (34 x 1..40 keys)", {}});
  for (int r = 0; r < 34; ++r) shapes.back().kv.push_back(1 + (r * 7) % 40);
  for (const auto& s : shapes) {
    for (int64_t dim : {128, 256}) {
      AttnCase c;
      c.hq = 8; c.hkv = 2; c.dim = dim;
      c.kv_lens = s.kv;
      c.q_lens.assign(s.kv.size(), 1);
      c.repeats = 2;
      c.name = std::string(s.name) + " D " + std::to_string(dim);
      run_sk(c, seed++);
    }
  }
}

// Multi-token rows (causal drafts: <= 16 rows per request on average keeps the decode config),
// xqa draft masks, sinks + soft cap + window + LSE base e, mm prefix ranges.
TEST_F(CudaDecodeStreamK, MultiTokenMasksSinksWindow) {
  std::mt19937 rng(4801);
  uint32_t seed = 4810;
  set_opts();
  for (DType kv : {DType::bf16, DType::fp8_e4m3}) {
    AttnCase m = sk_case(rng, kv, 16, 2, 64, false);
    m.name = dt_name(kv) + " causal draft rows (1-2 tokens x gqa 8), block-table form";
    for (size_t i = 0; i < m.q_lens.size(); ++i) {
      m.q_lens[i] = m.q_lens[i] == 0 ? 0 : 1 + static_cast<int64_t>(i % 2);
      m.kv_lens[i] = std::max(m.kv_lens[i], m.q_lens[i]);
    }
    m.paged_form = false;
    run_sk(m, seed++);
    AttnCase d = sk_case(rng, kv, 8, 2, 128, false);
    d.name = dt_name(kv) + " 1-4 draft tokens x gqa 4 with xqa masks";
    for (size_t i = 0; i < d.q_lens.size(); ++i) {
      d.q_lens[i] = 1 + static_cast<int64_t>(i % 4);
      d.kv_lens[i] = std::max(d.kv_lens[i], d.q_lens[i]);
    }
    d.xqa = true;
    run_sk(d, seed++);
    AttnCase w = sk_case(rng, kv, 8, 2, 128, false);
    w.name = dt_name(kv) + " sinks softcap window 700, LSE base e";
    w.sinks = true; w.soft_cap = 25.0; w.window_left = 700; w.base = LseBase::E;
    run_sk(w, seed++);
    AttnCase p = sk_case(rng, kv, 8, 2, 128, false);
    p.name = dt_name(kv) + " 4-token rows with mm prefix ranges";
    for (size_t i = 0; i < p.q_lens.size(); ++i) {
      p.q_lens[i] = p.q_lens[i] == 0 ? 0 : (i % 3 == 0 ? 4 : 1);
      p.kv_lens[i] = std::max(p.kv_lens[i], int64_t(8));
    }
    p.mm = true;
    run_sk(p, seed++);
  }
}

TEST_F(CudaDecodeStreamK, LayoutsPageSizesQueryTypes) {
  std::mt19937 rng(4901);
  uint32_t seed = 4910;
  const int64_t pages[] = {1, 8, 16, 32, 64};
  set_opts();
  for (int layout = 0; layout < kNumLayouts; ++layout) {
    const DType kv = layout % 3 == 0 ? DType::fp8_e5m2 : (layout % 3 == 1 ? DType::bf16 : DType::f16);
    AttnCase c = sk_case(rng, kv, 8, 2, layout % 4 == 1 ? 64 : 128, false);
    c.layout = layout;
    c.page = pages[layout % 5];
    c.paged_form = layout % 4 != 3;
    if (layout == 5) { c.q_dt = DType::f32; c.out_dt = DType::f32; }
    c.lse = layout != 4;
    c.name = dt_name(kv) + " layout " + std::to_string(layout) + " page " + std::to_string(c.page) +
             (c.paged_form ? "" : " block-table form") + (c.lse ? "" : " no LSE");
    run_sk(c, seed++);
  }
}

// The bit off: the counter path runs (stream-K's counter does not move), and the knob reaches
// decode_options() through the mask.
TEST_F(CudaDecodeStreamK, BitOffRunsCounterPath) {
  std::mt19937 rng(5001);
  cuda_impl::set_decode_options(opts0_ & ~kStreamK);
  AttnCase c = sk_case(rng, DType::bf16, 8, 2, 128, false);
  c.name = "stream-K bit off";
  const int64_t n0 = cuda_impl::streamk_launches();
  run_attn_case(c, 5010);
  EXPECT_EQ(cuda_impl::streamk_launches(), n0);
  EXPECT_EQ(opts0_ & kStreamK, 0) << "stream-K is default off";
}

// Option bit 32 (on by default): stream-K for fp8 caches when the call has at least one
// (request, KV head) pair per CTA; bf16, fewer pairs than CTAs or the bit off keep the counter
// path.  400 requests x 2 KV heads = 800 pairs, more than any grid of this config on an
// H100/H200/A100 (3 CTAs per SM).
TEST_F(CudaDecodeStreamK, Fp8RuleByPairsPerCta) {
  constexpr int kStreamKFp8 = 32;
  std::mt19937 rng(5101);
  uint32_t seed = 5110;
  auto many_pairs = [&](DType kv) {
    AttnCase c;
    c.kv_dt = kv;
    c.k_scale = 0.9; c.v_scale = 1.1;
    c.hq = 8; c.hkv = 2;
    for (int r = 0; r < 400; ++r) {
      c.q_lens.push_back(r % 37 == 5 ? 0 : 1);
      c.kv_lens.push_back(1 + static_cast<int64_t>(rng() % 300));
    }
    return c;
  };
  const int base = (opts0_ | 1 | 4) & ~(kStreamK | kStreamKFp8);
  for (int bit : {kStreamKFp8, 0}) {
    cuda_impl::set_decode_options(base | bit);
    for (DType kv : {DType::fp8_e4m3, DType::fp8_e5m2, DType::bf16}) {
      AttnCase c = many_pairs(kv);
      c.name = dt_name(kv) + " 400 requests, fp8 rule bit " + std::to_string(bit);
      const int64_t n0 = cuda_impl::streamk_launches();
      run_attn_case(c, seed++);
      const bool want = bit != 0 && kv != DType::bf16;
      EXPECT_EQ(cuda_impl::streamk_launches() - n0, want ? c.repeats : 0) << c.name;
    }
    AttnCase few = sk_case(rng, DType::fp8_e4m3, 8, 2, 128, false);  // 68 pairs: counter path
    few.name = "e4m3 34 requests, fp8 rule bit " + std::to_string(bit);
    const int64_t n0 = cuda_impl::streamk_launches();
    run_attn_case(few, seed++);
    EXPECT_EQ(cuda_impl::streamk_launches(), n0) << few.name;
  }
  EXPECT_EQ(opts0_ & kStreamKFp8, kStreamKFp8) << "the fp8 rule is on by default";
}

TEST_F(CudaDecodeStreamK, MixedLengthsHintRunsStreamK) {
  // KvLengthsHint::mixed (option bit 64, default on) sends bf16 / f16 decode calls with a
  // (request, KV head) pair per CTA to stream-K; uniform / unknown, or the bit off, keep the counter
  std::mt19937 rng(77);
  std::vector<int64_t> kv(72);
  for (auto& x : kv) x = 1 + static_cast<int64_t>(rng() % 700);  // odd, mixed lengths
  kv[3] = 0;                                                       // an empty request
  std::vector<int32_t> kv32(kv.begin(), kv.end());
  ASSERT_EQ(classify_kv_lengths(kv32), KvLengthsHint::mixed);
  const int opts = cuda_impl::decode_options();
  ASSERT_NE(opts & 64, 0) << "the mixed-lengths bit is on by default";
  for (DType dt : {DType::bf16, DType::f16}) {
    AttnCase c;
    c.q_lens.assign(kv.size(), 1);
    c.kv_lens = kv;
    c.kv_dt = dt;
    c.q_dt = dt;
    c.layout = dt == DType::bf16 ? 6 : 1;
    c.repeats = 2;
    c.name = std::string("mixed hint ") + dtype_name(dt);
    for (const auto& [hint, bit, want] : {std::tuple{KvLengthsHint::mixed, true, true},
                                          std::tuple{KvLengthsHint::uniform, true, false},
                                          std::tuple{KvLengthsHint::unknown, true, false},
                                          std::tuple{KvLengthsHint::mixed, false, false}}) {
      SCOPED_TRACE(::testing::Message() << "hint " << static_cast<int>(hint) << " bit " << bit);
      cuda_impl::set_decode_options(bit ? opts : (opts & ~64));
      c.kv_hint = hint;
      const int64_t before = cuda_impl::streamk_launches();
      run_attn_case(c, 78);
      EXPECT_EQ(cuda_impl::streamk_launches() - before, want ? c.repeats : 0);
    }
  }
  cuda_impl::set_decode_options(opts);
}

}  // namespace
}  // namespace kvattn::ops::testing
