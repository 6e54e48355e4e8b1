// The CUDA prefill kernel (src/ops/cuda/prefill_kernel.cu) against the CPU reference on random
// inputs: forced on for every case it supports (KVATTN routing mode "force"), so small shapes
// exercise it too; every KV layout (strided views) and both page forms, permuted pages with page
// 0 NaN-filled, NaN-poisoned outputs and LSE, odd lengths (1, 15, 17, 1000, 2049), GQA 1/4/8,
// head sizes 64/128/256, causal and not, chunked prefill (query after cached context), LSE in
// both bases, soft cap, sliding window, sinks, q/k/v scales, f32/f16/bf16 query and output.
// The routing test checks which calls reach the kernel: fp8 pages, PrefixLM ranges and XQA masks
// stay on attn_kernel, as do decode-like calls in automatic mode.  HopperWgmma* force the sm_90a
// wgmma kernel (src/ops/cuda/hopper_prefill.cu), under each of its consumer schedules (serial,
// overlap, pingpong), and check which kernel served each call (the wgmma kernel exactly where it
// covers the case on an sm_90 device); HopperWgmmaTailSplit* run the matrix with the plan's
// tail always cut into pieces (partial results merged by the last piece).  Skips when no GPU is
// present, except HopperPlanOrder, which checks the wgmma plan's unit order and tail split on
// the CPU with the plan kernel's own arithmetic (ops/cuda/prefill_plan_order.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kvattn/core/cuda_runtime_api.h"
#include "cuda_attn_case.h"
#include "ops/cuda/prefill_plan_order.h"

namespace kvattn::ops {
namespace {
using namespace testing;

class CudaPrefill : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kvattn::cuda::available()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)";
    saved_ = cuda_impl::prefill_kernel_mode();
    cuda_impl::set_prefill_kernel_mode(2);  // force
  }
  void TearDown() override {
    if (kvattn::cuda::available()) cuda_impl::set_prefill_kernel_mode(saved_);
  }
  int saved_ = 0;
};

// The prefill tests' defaults on top of the shared case: 8 query / 2 KV heads, 3 padding rows,
// the XQA mask as built, and an output tolerance of 1.5e-2 for f16 caches, 3e-2 otherwise.
struct Case : AttnCase {
  Case() {
    hq = 8;
    hkv = 2;
    pad_rows = 3;
    xqa_random_bits = false;
  }
};

// Runs one case on the GPU and the CPU reference; returns how many calls reached the prefill
// kernel (0 or 1).
int64_t run_case(const Case& c, uint32_t seed) {
  AttnCase a = c;
  a.out_tol = c.kv_dt == DType::f16 ? 1.5e-2 : 3e-2;  // bf16 P and V: ~1e-2
  return run_attn_case(a, seed);
}

// ---- the wgmma plan's unit order on the CPU (no GPU needed) ------------------------------------
// Orders the units of a batch as pf_plan_l2_kernel does (sections of groups within the L2
// budget, sort keys by po::section_key, counting sort, po::dealt_position for G round-robin
// CTAs as po::deal_ctas says; units of one key in unit order, where the kernel's atomics place
// them in any order) and returns the dealt list as (section, cost) per position.
struct PlanShape {
  std::vector<std::pair<int, int>> reqs;  // (q_len, kv_len)
  int hkv = 8, group = 4;
  bool causal = true;
  int64_t window_left = -1;
};
// tiles128 (optional): per position, the unit's 128-key tiles (the wgmma kernel's; the plan's
// costs count 64-key tiles).
std::vector<std::pair<int, int>> plan_order(const PlanShape& sh, int64_t l2_budget, int G,
                                            std::vector<int>* tiles128 = nullptr) {
  constexpr int kRowsPerUnit = 128, kCostTile = 64, kTokenBytes = 2 * 128 * 2;
  const int batch = static_cast<int>(sh.reqs.size()), hkv = sh.hkv, groups = batch * hkv;
  int64_t kv_sum = 0;
  for (const auto& r : sh.reqs) kv_sum += r.second;
  const int64_t group_bytes = std::max<int64_t>(1, kv_sum / batch * kTokenBytes);
  const int64_t fit = std::max<int64_t>(1, std::min<int64_t>(groups, l2_budget / group_bytes));
  const int num_sec = static_cast<int>((groups + fit - 1) / fit);
  const int per_sec = (groups + num_sec - 1) / num_sec;
  struct Unit {
    int sec, cost, tiles;
  };
  std::vector<Unit> units;  // unit order: (row tile across the batch, KV head)
  std::vector<int> max_cost(num_sec, 0), count(num_sec, 0);
  for (int r = 0; r < batch; ++r) {
    const int n = (sh.reqs[r].first * sh.group + kRowsPerUnit - 1) / kRowsPerUnit;
    for (int t = 0; t < n; ++t) {
      for (int hk = 0; hk < hkv; ++hk) {
        const int c = cuda_impl::po::row_tile_cost(sh.reqs[r].first, sh.reqs[r].second, t, kRowsPerUnit, sh.group,
                                                   sh.causal, sh.window_left, kCostTile);
        const int s = (r * hkv + hk) / per_sec;
        const int n = cuda_impl::po::row_tile_cost(sh.reqs[r].first, sh.reqs[r].second, t, kRowsPerUnit, sh.group,
                                                   sh.causal, sh.window_left, 128) - 1;
        units.push_back({s, c, n});
        max_cost[s] = std::max(max_cost[s], c);
        ++count[s];
      }
    }
  }
  std::vector<int> first(num_sec + 1, 0);
  for (int s = 0; s < num_sec; ++s) first[s + 1] = first[s] + std::max(1, std::min(max_cost[s], count[s]));
  const int U = static_cast<int>(units.size());
  std::vector<int> key(U);
  for (int u = 0; u < U; ++u) {
    const Unit& x = units[u];
    key[u] = cuda_impl::po::section_key(first[x.sec], first[x.sec + 1] - first[x.sec], x.cost, x.sec, num_sec);
    EXPECT_GE(key[u], first[x.sec]);
    EXPECT_LT(key[u], first[x.sec + 1]);
  }
  std::vector<int> sorted(U);
  std::iota(sorted.begin(), sorted.end(), 0);
  std::stable_sort(sorted.begin(), sorted.end(), [&](int a, int b) { return key[a] < key[b]; });
  std::vector<std::pair<int, int>> dealt(U, {-1, -1});
  if (tiles128 != nullptr) tiles128->assign(U, 0);
  const int deal = cuda_impl::po::deal_ctas(G, U, num_sec);
  for (int pos = 0; pos < U; ++pos) {
    const int d = cuda_impl::po::dealt_position(pos, deal, U);
    EXPECT_TRUE(d >= 0 && d < U && dealt[d].first < 0) << "position " << pos << " dealt to " << d;
    if (d >= 0 && d < U) {
      dealt[d] = {units[sorted[pos]].sec, units[sorted[pos]].cost};
      if (tiles128 != nullptr) (*tiles128)[d] = units[sorted[pos]].tiles;
    }
  }
  return dealt;
}

// The tail split as pf_plan_l2_kernel's plan_tail makes it, from the tail units' 128-key tiles
// (list order), on G round-robin CTAs after W full waves: per tail CTA its pieces (tail unit,
// first tile, tiles, piece index, split id or -1), and per split id its first slot and pieces.
// gt = 0: the tail stays whole units.
struct TailPiece {
  int unit, lo, n, j, sid;
};
struct TailPlan {
  int gt = 0;
  std::vector<std::vector<TailPiece>> cta;
  std::vector<std::pair<int, int>> splits;
};
TailPlan tail_plan(const std::vector<int>& tiles, int G, int W, bool forced) {
  namespace po = cuda_impl::po;
  TailPlan t;
  const int m = static_cast<int>(tiles.size());
  if (G < 2 || m == 0) return t;
  std::vector<int64_t> first(m + 1, 0);
  int max_tiles = 0;
  bool bad = false;
  for (int i = 0; i < m; ++i) {
    first[i + 1] = first[i] + tiles[i];
    max_tiles = std::max(max_tiles, tiles[i]);
    bad |= tiles[i] <= 0 || tiles[i] >= (1 << 16);
  }
  const int64_t S = first[m];
  const int gt = po::tail_ctas(G, W, m, S, max_tiles, forced);
  if (gt == 0 || bad) return t;
  auto unit_of = [&](int64_t x) { return static_cast<int>(std::upper_bound(first.begin(), first.end() - 1, x) - first.begin()) - 1; };
  std::vector<int> sid(m, -1);
  int slots = 0;
  for (int i = 0; i < m; ++i) {
    const int np = po::tail_owner(first[i] + tiles[i] - 1, gt, S) - po::tail_owner(first[i], gt, S) + 1;
    if (np > 1) {
      sid[i] = static_cast<int>(t.splits.size());
      t.splits.push_back({slots, np});
      slots += np;
    }
  }
  t.cta.assign(gt, {});
  size_t kmax = 0;
  for (int g = 0; g < gt; ++g) {
    const int64_t a = po::tail_start(g, gt, S), b = po::tail_start(g + 1, gt, S);
    for (int i = unit_of(a); i <= unit_of(b - 1); ++i) {
      const int lo = static_cast<int>(std::max(a, first[i]) - first[i]);
      const int hi = static_cast<int>(std::min(b, first[i + 1]) - first[i]);
      t.cta[g].push_back({i, lo, hi - lo, g - po::tail_owner(first[i], gt, S), sid[i]});
    }
    kmax = std::max(kmax, t.cta[g].size());
  }
  if (kmax > static_cast<size_t>(po::kTailMaxPieces) || slots > po::tail_slots(G)) return TailPlan{};
  t.gt = gt;
  return t;
}
// Checks a tail plan: every unit's tiles covered once, in its pieces' order, a cut unit's pieces
// indexed 0..np-1 on consecutive CTAs, slots within tail_slots(G), ranges within one tile of
// each other.
void check_tail_plan(const TailPlan& t, const std::vector<int>& tiles, int G, const std::string& what) {
  if (t.gt == 0) return;
  ASSERT_LE(t.gt, G) << what;
  const int m = static_cast<int>(tiles.size());
  std::vector<int> next(m, 0), pieces(m, 0), last_cta(m, -1);
  int64_t lo_sum = INT64_MAX, hi_sum = 0;
  for (int g = 0; g < t.gt; ++g) {
    int64_t sum = 0;
    ASSERT_LE(t.cta[g].size(), static_cast<size_t>(cuda_impl::po::kTailMaxPieces)) << what;
    for (const TailPiece& pc : t.cta[g]) {
      ASSERT_TRUE(pc.unit >= 0 && pc.unit < m) << what;
      EXPECT_EQ(pc.lo, next[pc.unit]) << what << ": unit " << pc.unit << " piece on CTA " << g;
      EXPECT_GE(pc.n, 1) << what;
      next[pc.unit] = pc.lo + pc.n;
      EXPECT_EQ(pc.j, pieces[pc.unit]) << what;
      if (last_cta[pc.unit] >= 0) {
        EXPECT_EQ(last_cta[pc.unit], g - 1) << what;
      }
      last_cta[pc.unit] = g;
      ++pieces[pc.unit];
      sum += pc.n;
      if (pc.sid < 0) {
        EXPECT_EQ(pc.lo, 0) << what;
        EXPECT_EQ(pc.n, tiles[pc.unit]) << what;
      } else {
        ASSERT_LT(pc.sid, static_cast<int>(t.splits.size())) << what;
        EXPECT_LT(pc.j, t.splits[pc.sid].second) << what;
        EXPECT_LT(t.splits[pc.sid].first + pc.j, cuda_impl::po::tail_slots(G)) << what;
      }
    }
    lo_sum = std::min(lo_sum, sum);
    hi_sum = std::max(hi_sum, sum);
  }
  EXPECT_LE(hi_sum - lo_sum, 1) << what << ": tail ranges of unequal size";
  for (int i = 0; i < m; ++i) EXPECT_EQ(next[i], tiles[i]) << what << ": unit " << i << " not covered";
  for (size_t s = 1; s < t.splits.size(); ++s)
    EXPECT_EQ(t.splits[s].first, t.splits[s - 1].first + t.splits[s - 1].second) << what;
}
// Busiest round-robin CTA's sum of unit costs over the mean (CTA c takes positions c, c + G, ...).
double busiest_over_mean(const std::vector<std::pair<int, int>>& dealt, int G) {
  std::vector<double> load(G, 0.0);
  double total = 0;
  for (size_t w = 0; w < dealt.size(); ++w) {
    load[w % G] += dealt[w].second;
    total += dealt[w].second;
  }
  return *std::max_element(load.begin(), load.end()) / (total / G);
}

TEST(HopperPlanOrder, PermutationSectionsInOrderAndCtasEvenlyLoaded) {
  // dealt_position is a permutation of [0, U) for every grid, the short last wave included
  for (int G : {1, 2, 3, 7, 132}) {
    for (int U : {1, 2, 5, 131, 132, 133, 264, 265, 1000}) {
      std::vector<int> seen(U, 0);
      for (int pos = 0; pos < U; ++pos) {
        const int d = cuda_impl::po::dealt_position(pos, G, U);
        ASSERT_TRUE(d >= 0 && d < U) << "G " << G << " U " << U << " pos " << pos;
        ++seen[d];
      }
      EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), U) << "G " << G << " U " << U;
    }
  }
  EXPECT_EQ(cuda_impl::po::dealt_position(7, 0, 10), 7);  // drawn in list order
  // the benchmark's shapes (32 query / 8 KV heads, 132 CTAs, the L2 budget of a 50 MB L2): the
  // busiest CTA's sum of unit costs over the mean (the previous order, costliest first by row
  // tile and every wave dealt forwards: 1 x 8192 1.09, mixed lengths 1.09).  The bound is what
  // the shape allows: the chunked step's 1,024 units of nearly equal cost make 7.76 per CTA, so
  // some CTAs take 8; non-causal 8 x 2048's 4,096 equal units make 31.03.  Sections of 1 MB (a
  // group or two each, shorter than a wave: dealt as sorted) stay within 1.045.
  const int G = 132;
  const int64_t budget = int64_t(50) << 20;
  std::mt19937 rng(23);
  std::vector<std::pair<int, int>> mixed;
  for (int i = 0; i < 16; ++i) {
    const int l = 256 + static_cast<int>(rng() % 3841);
    mixed.push_back({l, l});
  }
  struct Named {
    const char* name;
    PlanShape shape;
    double bound;
  };
  auto uniform = [](int batch, int q, int kv, bool causal = true) {
    PlanShape sh;
    sh.reqs.assign(batch, {q, kv});
    sh.causal = causal;
    return sh;
  };
  PlanShape window = uniform(4, 4096, 4096);
  window.window_left = 1000;
  PlanShape mixed_shape;
  mixed_shape.reqs = mixed;
  const Named shapes[] = {
      {"causal 8 x 2048", uniform(8, 2048, 2048), 1.02},       {"causal 1 x 8192", uniform(1, 8192, 8192), 1.02},
      {"causal 4 x 4096", uniform(4, 4096, 4096), 1.02},       {"causal 16 x 1024", uniform(16, 1024, 1024), 1.02},
      {"causal 32 x 512", uniform(32, 512, 512), 1.02},        {"chunked 8 x (q 512, kv 4096)", uniform(8, 512, 4096), 1.04},
      {"non-causal 8 x 2048", uniform(8, 2048, 2048, false), 1.035}, {"mixed 16 x U[256, 4096]", mixed_shape, 1.02},
      {"causal 4 x 4096, window 1000", window, 1.02},
  };
  for (const Named& n : shapes) {
    for (int64_t l2 : {budget * 5 / 8, int64_t(1) << 20}) {  // the default sections; many small ones
      const auto dealt = plan_order(n.shape, l2, G);
      const double r = busiest_over_mean(dealt, G);
      EXPECT_LE(r, l2 == budget * 5 / 8 ? n.bound : 1.045) << n.name << ", L2 budget " << l2;
      // sections follow one another: a wave of G units holds no unit of a section before the
      // previous wave's last (dealing permutes only within a wave)
      for (size_t w = G; w < dealt.size(); w += G) {
        int prev_max = 0;
        for (size_t j = w - G; j < w; ++j) prev_max = std::max(prev_max, dealt[j].first);
        for (size_t j = w; j < std::min(dealt.size(), w + G); ++j)
          EXPECT_GE(dealt[j].first, prev_max) << n.name << " position " << j;
      }
      ::testing::Test::RecordProperty(std::string(n.name) + (l2 == budget * 5 / 8 ? "" : ", 1 MB sections"), std::to_string(r));
    }
  }
}

TEST(HopperPlanOrder, RandomBatchesArePermutationsInSectionOrder) {
  // random batches: empty requests, context lengths, GQA groups, KV heads, windows, grids and
  // L2 budgets from one group per section to one section; plan_order checks every key against
  // its section's range and that no position is dealt twice
  std::mt19937 rng(31);
  for (int trial = 0; trial < 300; ++trial) {
    PlanShape sh;
    sh.hkv = 1 + static_cast<int>(rng() % 8);
    sh.group = 1 + static_cast<int>(rng() % 8);
    const int batch = 1 + static_cast<int>(rng() % 40);
    for (int r = 0; r < batch; ++r) {
      const int q = rng() % 5 == 0 ? 0 : 1 + static_cast<int>(rng() % 3000);
      sh.reqs.push_back({q, q + (rng() % 2 ? 0 : static_cast<int>(rng() % 5000))});
    }
    sh.causal = rng() % 4 != 0;
    sh.window_left = rng() % 3 == 0 ? static_cast<int64_t>(rng() % 2000) : -1;
    const int G = 1 + static_cast<int>(rng() % 140);
    const int64_t l2 = int64_t(1) << (16 + rng() % 12);
    const auto dealt = plan_order(sh, l2, G);
    int64_t units = 0;
    for (const auto& r : sh.reqs) units += int64_t(r.first * sh.group + 127) / 128 * sh.hkv;
    ASSERT_EQ(static_cast<int64_t>(dealt.size()), units) << "trial " << trial;
    for (size_t w = 0; w < dealt.size(); w += G) {
      int hi = 0;  // the wave's last section
      for (size_t j = w; j < std::min(dealt.size(), w + G); ++j) {
        ASSERT_GE(dealt[j].first, 0) << "trial " << trial << " position " << j << " not dealt";
        ASSERT_GE(dealt[j].second, 1) << "trial " << trial;
        hi = std::max(hi, dealt[j].first);
      }
      if (w + G < dealt.size()) {
        for (size_t j = w + G; j < std::min(dealt.size(), w + 2 * G); ++j)
          ASSERT_GE(dealt[j].first, hi) << "trial " << trial << ": a section before the previous wave's at " << j;
      }
    }
  }
}

TEST(HopperPlanOrder, TailSplitCoversEveryTileOnceAndEvensTheLastWave) {
  namespace po = cuda_impl::po;
  // owner and start agree: tile x lies in its owner's range, for uneven S / Gt too
  for (int gt : {1, 2, 3, 7, 132}) {
    for (int64_t S : {int64_t(gt), int64_t(gt) + 1, int64_t(100), int64_t(3050), int64_t(99991)}) {
      if (S < gt) continue;
      for (int64_t x = 0; x < S; x += std::max<int64_t>(1, S / 500)) {
        const int g = po::tail_owner(x, gt, S);
        ASSERT_TRUE(g >= 0 && g < gt && po::tail_start(g, gt, S) <= x && x < po::tail_start(g + 1, gt, S))
            << "gt " << gt << " S " << S << " x " << x;
      }
    }
  }
  // the benchmark's shapes on 132 CTAs (L2 sections of 5/8 of a 50 MB L2): non-causal
  // 8 x 2048's tail (4 units of 16 tiles) and a long context's chunk (116 units of about 243)
  // are cut; the chunked step's (100 units of 29-32 tiles, 8 to gain) and the causal shapes'
  // (their cheapest units) stay whole.  Busiest CTA's work over the mean (key tiles + 1 per
  // unit or piece, the full waves' units included): non-causal 1.008 (1.031 uncut).
  const int G = 132;
  const int64_t budget = (int64_t(50) << 20) * 5 / 8;
  struct Shape {
    const char* name;
    int batch, q, kv;
    bool causal, cut;
    double bound;
  };
  for (const Shape& sh : {Shape{"chunked 8 x (q 512, kv 4096)", 8, 512, 4096, true, false, 1.04},
                          Shape{"long context 1 x (q 2048, kv 32768)", 1, 2048, 32768, true, true, 1.025},
                          Shape{"non-causal 8 x 2048", 8, 2048, 2048, false, true, 1.012},
                          Shape{"causal 8 x 2048", 8, 2048, 2048, true, false, 1.02},
                          Shape{"causal 1 x 8192", 1, 8192, 8192, true, false, 1.02}}) {
    PlanShape ps;
    ps.reqs.assign(sh.batch, {sh.q, sh.kv});
    ps.causal = sh.causal;
    std::vector<int> tiles;
    plan_order(ps, budget, G, &tiles);
    const int U = static_cast<int>(tiles.size()), W = U / G;
    const std::vector<int> tail(tiles.begin() + int64_t(W) * G, tiles.end());
    const TailPlan t = tail_plan(tail, G, W, false);
    EXPECT_EQ(t.gt > 0, sh.cut) << sh.name;
    check_tail_plan(t, tail, G, sh.name);
    std::vector<double> load(G, 0.0);
    double total = 0;
    for (int w = 0; w < W * G; ++w) load[w % G] += tiles[w] + 1;
    if (t.gt > 0) {
      for (int g = 0; g < t.gt; ++g)
        for (const TailPiece& pc : t.cta[g]) load[g] += pc.n + 1;
    } else {
      for (int w = W * G; w < U; ++w) load[w % G] += tiles[w] + 1;
    }
    for (double x : load) total += x;
    const double r = *std::max_element(load.begin(), load.end()) / (total / G);
    EXPECT_LE(r, sh.bound) << sh.name;
    ::testing::Test::RecordProperty(std::string("tail ") + sh.name, std::to_string(r));
    std::vector<std::pair<int, int>> whole;  // the same list uncut, costs in 128-key tiles
    for (int x : tiles) whole.push_back({0, x + 1});
    ::testing::Test::RecordProperty(std::string("tail whole ") + sh.name, std::to_string(busiest_over_mean(whole, G)));
  }
  // random tails (fewer units than CTAs), forced and automatic, on grids of 2-140 CTAs; forced,
  // nearly all are cut (not where a range would hold more than kTailMaxPieces pieces)
  std::mt19937 rng(41);
  int forced_trials = 0, forced_cut = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const int G = 2 + static_cast<int>(rng() % 139);
    const int spread = rng() % 3 == 0 ? 3 : (rng() % 2 ? 40 : 300);
    std::vector<int> tail(1 + rng() % (G - 1));
    for (int& x : tail) x = 1 + static_cast<int>(rng() % spread);
    const bool forced = rng() % 2 == 0;
    const int W = static_cast<int>(rng() % 20);
    const TailPlan t = tail_plan(tail, G, W, forced);
    check_tail_plan(t, tail, G, "trial " + std::to_string(trial) + (forced ? " forced" : ""));
    const bool two_tiles = tail.size() > 1 || tail[0] > 1;
    if (forced && two_tiles) {
      ++forced_trials;
      forced_cut += t.gt > 0;
    }
  }
  EXPECT_GE(forced_cut, forced_trials * 9 / 10) << forced_cut << " of " << forced_trials;
}

TEST_F(CudaPrefill, CausalAndNonCausalGqaChunked) {
  uint32_t seed = 7000;
  for (int64_t group : {1, 4, 8}) {
    for (bool causal : {true, false}) {
      Case c;
      c.name = "gqa " + std::to_string(group) + (causal ? " causal" : " non-causal");
      c.hkv = 2;
      c.hq = 2 * group;
      c.q_lens = {1, 15, 17, 250, 0, 130};
      c.kv_lens = {1, 40, 17, 600, 5, 130};  // 40 and 600: query after 25 / 350 cached keys
      EXPECT_EQ(run_case(c, seed++), 1);
    }
  }
}

// A small matrix added to a loader's: GQA groups, causal without and with a 100-key sliding
// window, odd lengths and an empty request; soft cap on group 8.
void run_causal_window_subset(const std::string& label, std::initializer_list<int64_t> groups, uint32_t seed) {
  for (int64_t group : groups) {
    for (bool window : {false, true}) {
      Case c;
      c.name = label + ", gqa " + std::to_string(group) + (window ? " causal, window 100" : " causal");
      c.hkv = 2;
      c.hq = 2 * group;
      c.q_lens = {1, 15, 250, 0, 130};
      c.kv_lens = {1, 40, 600, 5, 130};
      c.window_left = window ? 100 : -1;
      if (group == 8) c.soft_cap = 30.f;
      EXPECT_EQ(run_case(c, seed++), 1);
    }
  }
}

// Sets the prefill kernel's loader knob (paired-row or flag-bit loader) for one test; the process's
// value comes back when it goes out of scope (also when an assertion returns early).
// The loader tests are about the mma.sync kernel: the wgmma kernel (sm_90a) is turned off while
// the knob is held.
class PrefillLoader {
 public:
  explicit PrefillLoader(bool paired) : paired_(cuda_impl::prefill_paired_rows()), hopper_(cuda_impl::prefill_hopper_mode()) {
    cuda_impl::set_prefill_paired_rows(paired);
    cuda_impl::set_prefill_hopper_mode(1);  // off
  }
  ~PrefillLoader() {
    cuda_impl::set_prefill_paired_rows(paired_);
    cuda_impl::set_prefill_hopper_mode(hopper_);
  }
  PrefillLoader(const PrefillLoader&) = delete;
  PrefillLoader& operator=(const PrefillLoader&) = delete;

 private:
  bool paired_;
  int hopper_;
};

// One K/V loader (label: "paired" or "flag-bit") across what the kernel supports: causal /
// non-causal, GQA 1/4/8, chunked prefill, odd lengths, every layout and page form (permuted pages,
// page 0 NaN-filled, poisoned outputs: run_attn_case), D 64/128/256, f16/bf16, f32 query/out
// (scalar paths), window, soft cap, sinks, LSE in both bases, several units per CTA (row tables
// reused).  The case names start with the label.
void run_loader_matrix(const std::string& label, uint32_t seed) {
  for (int64_t group : {1, 4, 8}) {
    for (bool causal : {true, false}) {
      Case c;
      c.name = label + " gqa " + std::to_string(group) + (causal ? " causal" : " non-causal");
      c.hkv = 2;
      c.hq = 2 * group;
      c.q_lens = {1, 15, 17, 250, 0, 130};
      c.kv_lens = {1, 40, 17, 600, 5, 130};
      c.causal = causal;
      EXPECT_EQ(run_case(c, seed++), 1);
    }
  }
  for (int layout = 0; layout < kNumLayouts; ++layout) {
    Case c;
    c.name = std::string(label + " layout ") + layout_name(layout);
    c.layout = layout;
    c.paged_form = layout % 2 == 1;
    c.page = layout % 3 == 0 ? 16 : (layout % 3 == 1 ? 8 : 32);
    c.q_lens = {130, 17, 64};
    c.kv_lens = {200, 17, 64};
    EXPECT_EQ(run_case(c, seed++), 1);
  }
  for (int64_t dim : {64, 128, 256}) {
    for (DType kv : {DType::bf16, DType::f16}) {
      Case c;
      c.name = label + " dim " + std::to_string(dim) + " kv " + dtype_name(kv);
      c.dim = dim;
      c.kv_dt = c.q_dt = c.out_dt = kv;
      c.q_lens = {150, 33, 1};
      c.kv_lens = {170, 33, 9};
      EXPECT_EQ(run_case(c, seed++), 1);
      c.name += " f32 query/out, block table";
      c.q_dt = DType::f32;
      c.out_dt = DType::f32;
      c.paged_form = false;
      EXPECT_EQ(run_case(c, seed++), 1);
    }
  }
  for (int variant = 0; variant < 6; ++variant) {
    Case c;
    c.hq = 16; c.hkv = 4;
    c.q_lens = {200, 31, 129};
    c.kv_lens = {260, 31, 500};
    c.window_left = (variant % 3 == 0) ? 47 : (variant % 3 == 1 ? 0 : 130);
    if (variant == 3) c.window_left = -1;  // soft cap + sinks without a window
    c.soft_cap = variant % 2 ? 15.0 : 0.0;
    c.sinks = variant >= 2;
    c.causal = variant != 4;
    c.base = variant % 2 ? LseBase::E : LseBase::Two;
    c.k_scale = 0.8; c.v_scale = 1.25;
    c.dim = variant == 5 ? 256 : (variant == 2 ? 64 : 128);
    c.name = label + " window " + std::to_string(c.window_left) + " cap " + std::to_string(c.soft_cap) +
             (c.sinks ? " sinks" : "") + (c.causal ? " causal" : " non-causal");
    EXPECT_EQ(run_case(c, seed++), 1);
  }
  {
    Case c;
    c.name = label + " causal 2049 + 1000, dim 64, LSE base e";
    c.hq = 4; c.hkv = 1; c.dim = 64;
    c.q_lens = {2049, 1000};
    c.kv_lens = {2049, 1003};
    c.base = LseBase::E;
    EXPECT_EQ(run_case(c, seed++), 1);
  }
  {
    std::mt19937 rng(4747);
    Case c;  // many 1-2 tile units per CTA: row tables reused across units
    c.name = label + " dim 128 group 8, 300 short requests with context";
    c.hq = 8; c.hkv = 1;
    for (int r = 0; r < 300; ++r) {
      const int64_t ql = 1 + static_cast<int64_t>(rng() % 16);
      c.q_lens.push_back(ql);
      c.kv_lens.push_back(ql + static_cast<int64_t>(rng() % 70));
    }
    EXPECT_EQ(run_case(c, seed++), 1);
  }
}

// The flag-bit loader (rows to zero-fill flagged in bit 0 of their address): what calls whose K/V
// rows are not aligned to their size take, here forced with the paired-row loader off.
TEST_F(CudaPrefill, FlagBitLoader) {
  const PrefillLoader loader(false);
  run_loader_matrix("flag-bit", 7700);
  run_causal_window_subset("flag-bit", {1, 4, 8}, 7350);
}

// The paired-row K/V loader (the default): K and V row addresses paired in the
// offset table, rows to zero-fill read a static zero row.  The loader matrix plus the small
// matrix (causal with and without a window) and lengths around tile and page edges.
TEST_F(CudaPrefill, PairedRowLoader) {
  const PrefillLoader loader(true);
  ASSERT_TRUE(cuda_impl::prefill_paired_rows());
  run_loader_matrix("paired", 7900);
  run_causal_window_subset("paired", {1, 4, 8}, 8100);
  {
    Case c;  // key ranges ending inside a tile and inside a page: zero-row reads for K and V
    c.name = "paired causal, lengths around tile and page edges, page 16";
    c.hq = 8; c.hkv = 2;
    c.q_lens = {63, 64, 65, 127, 129, 1};
    c.kv_lens = {63, 64, 65, 191, 200, 97};
    EXPECT_EQ(run_case(c, 8200), 1);
    c.name = "paired non-causal, same lengths, page 32, block table";
    c.causal = false;
    c.page = 32;
    c.paged_form = false;
    EXPECT_EQ(run_case(c, 8201), 1);
  }
}

TEST_F(CudaPrefill, LongOddLengths) {
  Case c;
  c.name = "causal 2049 + 1000";
  c.hq = 4; c.hkv = 1; c.dim = 64;
  c.q_lens = {2049, 1000};
  c.kv_lens = {2049, 1003};
  EXPECT_EQ(run_case(c, 7100), 1);
  c.name = "non-causal 1000 window";
  c.q_lens = {1000};
  c.kv_lens = {1777};
  c.causal = false;
  c.window_left = 300;
  c.base = LseBase::E;
  EXPECT_EQ(run_case(c, 7101), 1);
}

TEST_F(CudaPrefill, EveryLayoutAndPageForm) {
  for (int layout = 0; layout < kNumLayouts; ++layout) {
    Case c;
    c.name = std::string("layout ") + layout_name(layout);
    c.layout = layout;
    c.paged_form = layout % 2 == 1;
    c.hq = 8; c.hkv = 2;
    c.page = layout % 3 == 0 ? 16 : (layout % 3 == 1 ? 8 : 32);
    c.q_lens = {130, 17, 64};
    c.kv_lens = {200, 17, 64};
    // page ids / block tables of both widths, some as strided views (the loader's page-id loads)
    c.idx64 = layout % 2 == 0;
    c.idx_strided = layout % 4 < 2;
    if (c.idx64) c.name += ", int64 indices";
    if (c.idx_strided) c.name += " (strided)";
    EXPECT_EQ(run_case(c, 7200 + static_cast<uint32_t>(layout)), 1);
  }
}

TEST_F(CudaPrefill, HeadDimsDtypesAndOutputs) {
  uint32_t seed = 7300;
  for (int64_t dim : {64, 128, 256}) {
    for (DType kv : {DType::bf16, DType::f16}) {
      Case c;
      c.name = "dim " + std::to_string(dim) + " kv " + dtype_name(kv);
      c.dim = dim;
      c.kv_dt = kv;
      c.q_dt = kv;
      c.out_dt = kv;
      c.hq = 8; c.hkv = 2;
      c.q_lens = {150, 33, 1};
      c.kv_lens = {170, 33, 9};
      EXPECT_EQ(run_case(c, seed++), 1);
      c.name += " f32 query/out, block table";  // scalar Q load and output store paths
      c.q_dt = DType::f32;
      c.out_dt = DType::f32;
      c.paged_form = false;
      EXPECT_EQ(run_case(c, seed++), 1);
    }
  }
  Case c;
  c.name = "f16 cache, bf16 query, bf16 out";
  c.kv_dt = DType::f16; c.q_dt = DType::bf16; c.out_dt = DType::bf16;
  c.q_lens = {77}; c.kv_lens = {90};
  EXPECT_EQ(run_case(c, seed++), 1);
}

TEST_F(CudaPrefill, WindowSoftCapSinksScalesLse) {
  uint32_t seed = 7400;
  for (int variant = 0; variant < 6; ++variant) {
    Case c;
    c.hq = 16; c.hkv = 4;
    c.q_lens = {200, 31, 129};
    c.kv_lens = {260, 31, 500};
    c.window_left = (variant % 3 == 0) ? 47 : (variant % 3 == 1 ? 0 : 130);
    c.soft_cap = variant % 2 ? 15.0 : 0.0;
    c.sinks = variant >= 2;
    c.causal = variant != 4;
    c.base = variant % 2 ? LseBase::E : LseBase::Two;
    c.k_scale = 0.8; c.v_scale = 1.25;
    c.dim = variant == 5 ? 256 : 128;
    c.name = "window " + std::to_string(c.window_left) + " cap " + std::to_string(c.soft_cap) +
             (c.sinks ? " sinks" : "") + (c.causal ? " causal" : " non-causal");
    EXPECT_EQ(run_case(c, seed++), 1);
  }
  Case c;
  c.name = "sinks, window 0 (each row sees only itself)";
  c.sinks = true;
  c.q_lens = {129, 3};
  c.kv_lens = {129, 3};
  c.window_left = 0;  // each row sees only itself
  EXPECT_EQ(run_case(c, seed++), 1);
}

TEST_F(CudaPrefill, Randomised) {
  std::mt19937 rng(4242);
  for (int iter = 0; iter < 8; ++iter) {
    Case c;
    c.name = "random " + std::to_string(iter);
    const int64_t groups[] = {1, 4, 8};
    c.hkv = 1 + rng() % 3;
    c.hq = c.hkv * groups[rng() % 3];
    const int64_t dims[] = {64, 128, 256};
    c.dim = dims[rng() % 3];
    c.kv_dt = rng() % 2 ? DType::bf16 : DType::f16;
    c.q_dt = c.kv_dt;
    c.out_dt = c.q_dt;
    const int64_t pages[] = {1, 8, 16, 32, 64};
    c.page = pages[rng() % 5];
    c.layout = static_cast<int>(rng() % kNumLayouts);
    c.paged_form = rng() % 2;
    c.causal = rng() % 4 != 0;
    if (rng() % 3 == 0) c.window_left = rng() % 200;
    if (rng() % 3 == 0) c.soft_cap = 10 + rng() % 40;
    c.sinks = rng() % 3 == 0;
    c.base = rng() % 2 ? LseBase::Two : LseBase::E;
    const int B = 1 + rng() % 5;
    for (int r = 0; r < B; ++r) {
      const int64_t ql = 1 + rng() % 200;
      c.q_lens.push_back(ql);
      c.kv_lens.push_back(ql + (rng() % 3 == 0 ? 0 : rng() % 400));
    }
    EXPECT_EQ(run_case(c, 8000 + static_cast<uint32_t>(iter)), 1);
  }
}

// More units than resident CTAs (132 SMs x 1-2), so CTAs run several units back to back (the
// atomic work counter, the K/V ring and the row tables reused across units), with units of 1 KV
// tile alternating with longer ones.  Many short requests keep the CPU reference cheap: one
// 128-row unit per request and KV head.
TEST_F(CudaPrefill, ManyUnitsPerCta) {
  std::mt19937 rng(4343);
  auto lens = [&](Case& c, int n, int qmax, int extra) {
    for (int r = 0; r < n; ++r) {
      const int64_t ql = 1 + static_cast<int64_t>(rng() % qmax);
      c.q_lens.push_back(ql);
      c.kv_lens.push_back(ql + static_cast<int64_t>(rng() % extra));
    }
  };
  {
    Case c;  // dim 128, group 8: <= 16 tokens per request = one unit; 1-2 KV tiles
    c.name = "dim 128 group 8, 400 requests, context";
    c.hq = 8; c.hkv = 1;
    lens(c, 400, 16, 70);
    EXPECT_EQ(run_case(c, 7600), 1);
  }
  {
    Case c;
    c.name = "dim 64 group 8, 300 requests, window 20, cap, sinks, f32 out, block table";
    c.dim = 64; c.hq = 16; c.hkv = 2;
    c.window_left = 20; c.soft_cap = 20; c.sinks = true; c.base = LseBase::E;
    c.out_dt = DType::f32; c.paged_form = false; c.page = 8;
    lens(c, 300, 16, 90);
    EXPECT_EQ(run_case(c, 7601), 1);
  }
  {
    Case c;
    c.name = "dim 256 f16 group 16, 200 requests, non-causal";
    c.dim = 256; c.kv_dt = c.q_dt = c.out_dt = DType::f16;
    c.hq = 16; c.hkv = 1; c.causal = false;
    lens(c, 200, 8, 70);
    EXPECT_EQ(run_case(c, 7602), 1);
  }
}

// Whether the wgmma prefill kernel (src/ops/cuda/hopper_prefill.cu) should serve a case on this
// device: an sm_90 device (the CUDA build holds sm_90a code), head_dim 128, a bf16 or f16 query
// with an output of its type, a cache of the query's type or fp8 (e4m3 / e5m2), no PrefixLM /
// XQA, pages dividing the 128-key tile (soft cap and sliding window included).
bool hopper_covers(const Case& c) {
  const bool half_q = c.q_dt == DType::bf16 || c.q_dt == DType::f16;
  const bool fp8 = c.kv_dt == DType::fp8_e4m3 || c.kv_dt == DType::fp8_e5m2;
  return kvattn::cuda::compute_capability(0) == 90 && c.dim == 128 && half_q && c.out_dt == c.q_dt &&
         (c.kv_dt == c.q_dt || fp8) && !c.mm && !c.xqa && c.page >= 8 && 128 % c.page == 0;
}

// run_case, then checks which prefill kernel served the call: the wgmma kernel exactly when
// hopper_covers(c) (the reason names why not otherwise).
void run_checked(const Case& c, uint32_t seed) {
  const int64_t hopper_before = cuda_impl::prefill_hopper_launches();
  EXPECT_EQ(run_case(c, seed), c.repeats) << c.name;
  const bool want = hopper_covers(c);
  EXPECT_EQ(cuda_impl::last_prefill_kernel_path(), want ? 1 : 0) << c.name << ": " << cuda_impl::last_prefill_kernel_reason();
  EXPECT_EQ(cuda_impl::prefill_hopper_launches() - hopper_before, want ? c.repeats : 0) << c.name;
}

// Sets the wgmma kernel's routing mode for one test (restored when it goes out of scope).
class HopperMode {
 public:
  explicit HopperMode(int mode) : saved_(cuda_impl::prefill_hopper_mode()) { cuda_impl::set_prefill_hopper_mode(mode); }
  ~HopperMode() { cuda_impl::set_prefill_hopper_mode(saved_); }
  HopperMode(const HopperMode&) = delete;
  HopperMode& operator=(const HopperMode&) = delete;

 private:
  int saved_;
};

// Sets one of the wgmma kernel's routing knobs for one test, and puts kAfter back when it goes
// out of scope.
template <void (*kSet)(int), int kAfter>
class ScopedKnob {
 public:
  explicit ScopedKnob(int value) { kSet(value); }
  ~ScopedKnob() { kSet(kAfter); }
  ScopedKnob(const ScopedKnob&) = delete;
  ScopedKnob& operator=(const ScopedKnob&) = delete;
};
// The consumer schedule (0 serial, 1 overlap, 2 pingpong, 3 turns; afterwards the default: per
// call, by average KV length).
using HopperSched = ScopedKnob<cuda_impl::set_prefill_hopper_sched, -1>;
// The grid's cap, so each CTA takes many units (afterwards 0: no cap).
using HopperCtas = ScopedKnob<cuda_impl::set_prefill_hopper_ctas, 0>;
// How the plan cuts its list's tail (0 where it pays, 1 never, 2 always; afterwards 0).
using TailSplit = ScopedKnob<cuda_impl::set_prefill_tail_split, 0>;

const char* sched_label(int sched) {
  return sched == 0 ? "serial" : sched == 1 ? "overlap" : sched == 2 ? "pingpong" : "turns";
}

// The wgmma kernel (TMA page gathers, wgmma, mbarrier ring) on the cases it covers, under one
// consumer schedule: GQA 1/4/8/16, causal and not, chunked prefill, odd lengths ending inside a
// page and inside a 128-key tile (V rows past the end zeroed), every layout and both page forms
// with pages of 8/16/32/64, LSE in both bases, sinks, scales, soft cap, sliding windows (0, 1,
// tile-sized, wider than the context; causal and not; tiles left of the window skipped), many
// units per CTA, permuted pages with page 0 NaN, poisoned outputs (run_attn_case).
void run_hopper_matrix(int sched, uint32_t seed) {
  const HopperMode forced(2);
  const HopperSched schedule(sched);
  const std::string tag = std::string("wgmma ") + sched_label(sched) + " ";
  for (int64_t group : {1, 4, 8, 16}) {
    for (bool causal : {true, false}) {
      Case c;
      c.name = tag + "gqa " + std::to_string(group) + (causal ? " causal" : " non-causal");
      c.hkv = group >= 8 ? 1 : 2;
      c.hq = c.hkv * group;
      c.causal = causal;
      c.q_lens = {1, 15, 17, 250, 0, 130, 200};
      c.kv_lens = {1, 40, 17, 600, 5, 130, 637};
      run_checked(c, seed++);
    }
  }
  for (int layout = 0; layout < kNumLayouts; ++layout) {
    Case c;
    c.name = tag + "layout " + layout_name(layout);
    c.layout = layout;
    c.paged_form = layout % 2 == 1;
    c.page = layout % 4 == 0 ? 16 : (layout % 4 == 1 ? 8 : (layout % 4 == 2 ? 32 : 64));
    c.q_lens = {130, 17, 64, 129};
    c.kv_lens = {200, 17, 64, 383};
    run_checked(c, seed++);
  }
  for (int variant = 0; variant < 4; ++variant) {
    Case c;
    c.hq = 16; c.hkv = 4;
    c.q_lens = {200, 31, 129, 256};
    c.kv_lens = {260, 31, 500, 256};
    c.sinks = variant >= 1;
    c.causal = variant != 2;
    c.base = variant % 2 ? LseBase::E : LseBase::Two;
    c.k_scale = 0.8; c.v_scale = 1.25;
    c.name = tag + "sinks/scales/lse variant " + std::to_string(variant);
    run_checked(c, seed++);
  }
  // logit soft cap: tanh on the scaled scores (a strong cap of 5 and a mild one of 30)
  for (int variant = 0; variant < 4; ++variant) {
    Case c;
    c.hq = 8; c.hkv = 2;
    c.causal = variant % 2 == 0;
    c.soft_cap = variant < 2 ? 5.0 : 30.0;
    c.paged_form = variant >= 2;
    c.layout = variant % kNumLayouts;
    c.q_lens = {1, 130, 17, 300};
    c.kv_lens = {9, 130, 400, 333};
    c.name = tag + "soft cap " + std::to_string(c.soft_cap) + (c.causal ? " causal" : " non-causal");
    run_checked(c, seed++);
  }
  // sliding window: keys below query position - window_left hidden; with context before the
  // query, whole 128-key tiles left of a warpgroup's window are skipped
  for (int64_t w : {0, 1, 50, 127, 128, 300, 5000}) {
    for (bool causal : {true, false}) {
      Case c;
      c.hq = 8; c.hkv = 2;
      c.causal = causal;
      c.window_left = w;
      c.paged_form = w % 2 == 0;
      c.page = w == 50 ? 8 : (w == 300 ? 64 : 16);
      c.q_lens = {1, 200, 17, 700, 129};
      c.kv_lens = {1, 200, 1500, 900, 1029};
      c.name = tag + "window " + std::to_string(w) + (causal ? " causal" : " non-causal");
      run_checked(c, seed++);
    }
  }
  {
    Case c;  // everything at once: window, soft cap, sinks, LSE base e, GQA 16, a strided layout
    c.name = tag + "window 90 + soft cap 20 + sinks + lse e, gqa 16";
    c.hq = 16; c.hkv = 1;
    c.window_left = 90;
    c.soft_cap = 20.0;
    c.sinks = true;
    c.base = LseBase::E;
    c.layout = kNumLayouts - 1;
    c.paged_form = (kNumLayouts - 1) % 2 == 1;
    c.q_lens = {300, 45, 1};
    c.kv_lens = {800, 45, 257};
    run_checked(c, seed++);
  }
  // f16 and fp8 pages (fp8: widened to f16 in shared memory, f16 wgmma; a bf16 query is rounded
  // to f16): tile and page edges, GQA 4 / 8, causal and not, scales, then with soft cap, window,
  // sinks and LSE base e
  {
    struct Dt {
      DType kv, q;
    };
    int variant = 0;
    for (const Dt dt : {Dt{DType::f16, DType::f16}, Dt{DType::fp8_e4m3, DType::bf16}, Dt{DType::fp8_e5m2, DType::bf16},
                        Dt{DType::fp8_e4m3, DType::f16}, Dt{DType::fp8_e5m2, DType::f16}}) {
      for (int opts = 0; opts < 2; ++opts, ++variant) {
        Case c;
        c.kv_dt = dt.kv;
        c.q_dt = c.out_dt = dt.q;
        c.hq = opts ? 16 : 8;
        c.hkv = 2;
        c.causal = variant % 3 != 2;
        c.page = variant % 4 == 1 ? 8 : (variant % 4 == 3 ? 64 : 16);
        c.paged_form = variant % 2 == 0;
        c.layout = variant % kNumLayouts;
        c.k_scale = 0.7;
        c.v_scale = 1.3;
        if (opts) {
          c.soft_cap = 20.0;
          c.window_left = 90;
          c.sinks = true;
          c.base = LseBase::E;
        }
        c.q_lens = {1, 130, 17, 300, 129};
        c.kv_lens = {9, 130, 400, 333, 1029};
        c.name = tag + "kv " + dtype_name(dt.kv) + " q " + dtype_name(dt.q) + (opts ? " + window/soft cap/sinks" : "") +
                 (c.causal ? " causal" : " non-causal");
        run_checked(c, seed++);
      }
    }
  }
  {
    Case c;
    c.name = tag + "causal 1025 + 300 + 100 (block table)";
    c.hq = 4; c.hkv = 1;
    c.paged_form = false;
    c.q_lens = {1025, 300, 100};
    c.kv_lens = {1025, 303, 1500};
    run_checked(c, seed++);
  }
  // 300 short requests (queries of 1-40 tokens after up to 299 cached ones), seeded: many
  // short units per CTA
  auto short_requests = [](Case& c, uint32_t rng_seed) {
    std::mt19937 rng(rng_seed);
    for (int r = 0; r < 300; ++r) {
      const int64_t ql = 1 + static_cast<int64_t>(rng() % 40);
      c.q_lens.push_back(ql);
      c.kv_lens.push_back(ql + static_cast<int64_t>(rng() % 300));
    }
  };
  {
    Case c;  // many short units per CTA (taken round-robin: the producer and consumers walk the same list)
    c.name = tag + "group 8, 300 short requests with context";
    c.hq = 8; c.hkv = 1;
    short_requests(c, 4848);
    run_checked(c, seed++);
    c.name = tag + "group 8, 300 short requests with context, window 37";
    c.window_left = 37;
    run_checked(c, seed++);
  }
  {
    // fp8 pages, many short units per CTA: the CTAs draw their units from the plan's counter;
    // on a kept plan each launch's last draw puts the counter back for the next (back to back)
    Case c;
    c.name = tag + "fp8 e4m3, group 8, 300 short requests with context, kept plan, 3 repeats";
    c.kv_dt = DType::fp8_e4m3;
    c.k_scale = 0.8;
    c.v_scale = 1.1;
    c.hq = 8; c.hkv = 1;
    short_requests(c, 5050);
    c.keep_plan = true;
    c.repeats = 3;
    run_checked(c, seed++);
  }
  {
    // the plan's L2 sections: one (request, KV head) group per section, a few groups per section
    // (sections cut through a request's heads), mixed lengths; and the default (one section)
    std::mt19937 rng(4949);
    Case c;
    c.hq = 8; c.hkv = 2;
    for (int r = 0; r < 9; ++r) {
      const int64_t ql = 1 + static_cast<int64_t>(rng() % 400);
      c.q_lens.push_back(ql);
      c.kv_lens.push_back(ql + static_cast<int64_t>(rng() % 200));
    }
    for (int64_t budget : {int64_t(1), int64_t(300) * 512, int64_t(0)}) {
      cuda_impl::set_prefill_l2_budget(budget);
      c.name = tag + "9 mixed requests, L2 section budget " + std::to_string(budget) + " bytes";
      run_checked(c, seed++);
    }
  }
  {  // repeated calls on one kept plan
    Case c;
    c.name = tag + "kept plan, 3 repeats";
    c.q_lens = {300, 77};
    c.kv_lens = {400, 77};
    c.keep_plan = true;
    c.repeats = 3;
    run_checked(c, seed++);
  }
}

TEST_F(CudaPrefill, HopperWgmmaSerial) { run_hopper_matrix(0, 11000); }
TEST_F(CudaPrefill, HopperWgmmaOverlap) { run_hopper_matrix(1, 11000); }
TEST_F(CudaPrefill, HopperWgmmaPingpong) { run_hopper_matrix(2, 11000); }
TEST_F(CudaPrefill, HopperWgmmaTurns) { run_hopper_matrix(3, 11000); }
// The whole matrix with the plan's tail always cut (16-bit pages): the calls are short, so every
// unit lies in the tail and is cut into pieces of one or a few key tiles over the grid's CTAs,
// whose partial results the last piece merges (sinks, LSE, windows, soft cap, kept plans: each
// launch puts the counters back); then with 3 CTAs, so full waves come before the tail.
TEST_F(CudaPrefill, HopperWgmmaTailSplitPingpong) {
  const TailSplit forced(2);
  run_hopper_matrix(2, 11300);
}
TEST_F(CudaPrefill, HopperWgmmaTailSplitSerial) {
  const TailSplit forced(2);
  run_hopper_matrix(0, 11400);
}
TEST_F(CudaPrefill, HopperWgmmaTailSplitThreeCtas) {
  const TailSplit forced(2);
  const HopperCtas three(3);
  run_hopper_matrix(2, 11600);
}
// The whole matrix on 3 CTAs under overlap, the tail whole: every CTA runs many units in a row
// (windows that skip a unit's first tiles, units whose warpgroups end on different tiles, each
// Q tile refilled many times).
TEST_F(CudaPrefill, HopperWgmmaOverlapThreeCtas) {
  const TailSplit whole(1);
  const HopperCtas three(3);
  run_hopper_matrix(1, 11700);
}

// The calls the wgmma kernel leaves to the mma.sync kernel, with the reason (head_dim 64, f32
// output), an f16 call it takes, and the kernel turned off.
TEST_F(CudaPrefill, HopperWgmma) {
  uint32_t seed = 11500;
  {
    const HopperMode forced(2);
    Case c;
    c.q_lens = {150, 33};
    c.kv_lens = {170, 33};
    c.name = "head_dim 64 -> mma.sync";
    c.dim = 64;
    run_checked(c, seed++);
    EXPECT_NE(std::string(cuda_impl::last_prefill_kernel_reason()).find("head_dim"), std::string::npos)
        << cuda_impl::last_prefill_kernel_reason();
    c.dim = 128;
    c.name = "f16 -> wgmma";
    c.kv_dt = c.q_dt = c.out_dt = DType::f16;
    run_checked(c, seed++);
    c.kv_dt = c.q_dt = DType::bf16;
    c.out_dt = DType::f32;
    c.name = "f32 output -> mma.sync";
    run_checked(c, seed++);
    c.out_dt = DType::bf16;
    c.name = "window + soft cap -> wgmma";
    c.window_left = 20;
    c.soft_cap = 10.0;
    run_checked(c, seed++);
  }
  // turned off: the mma.sync kernel serves the call
  const HopperMode off(1);
  Case c;
  c.name = "wgmma off";
  c.q_lens = {150};
  c.kv_lens = {170};
  EXPECT_EQ(run_case(c, seed++), 1);
  EXPECT_EQ(cuda_impl::last_prefill_kernel_path(), 0);
  EXPECT_NE(std::string(cuda_impl::last_prefill_kernel_reason()).find("off"), std::string::npos)
      << cuda_impl::last_prefill_kernel_reason();
}

// A small subset of the wgmma matrix for the sanitizers (memcheck, racecheck: every launch is
// slow under them), under each consumer schedule: tile and page edges (V rows past the end
// zeroed, out-of-range boxes), pages of 8 and 64, GQA 1 / 8, causal and not, sinks with LSE base
// e, soft cap, a window skipping tiles, several units per CTA, a kept plan, and two CTAs taking
// 9 units each (16-bit pages: each Q tile refilled 3-4 times; fp8 pages: the ring of unit slots
// wraps around twice).
TEST_F(CudaPrefill, HopperWgmmaSmall) {
  const HopperMode forced(2);
  for (int sched = 0; sched < 4; ++sched) {
    const HopperSched schedule(sched);
    const std::string tag = std::string("wgmma small ") + sched_label(sched) + " ";
    uint32_t seed = 12000;
    for (int variant = 0; variant < 5; ++variant) {
      Case c;
      c.hkv = 1;
      c.hq = variant % 2 ? 8 : 1;
      c.causal = variant != 1;
      c.page = variant == 2 ? 8 : (variant == 3 ? 64 : 16);
      c.paged_form = variant % 2 == 0;
      c.sinks = variant == 3;
      c.base = variant == 3 ? LseBase::E : LseBase::Two;
      c.soft_cap = variant == 1 ? 8.0 : 0.0;
      c.window_left = variant == 4 ? 60 : -1;
      c.q_lens = {1, 17, 130, 0, 40};
      c.kv_lens = {1, 17, 257, 5, 300};
      c.name = tag + "variant " + std::to_string(variant);
      run_checked(c, seed++);
    }
    for (int variant = 0; variant < 2; ++variant) {  // fp8 pages: the staging tile and its widening
      Case c;
      c.kv_dt = variant ? DType::fp8_e5m2 : DType::fp8_e4m3;
      c.q_dt = c.out_dt = variant ? DType::f16 : DType::bf16;
      c.hq = 4; c.hkv = 1;
      c.page = variant ? 8 : 16;
      c.k_scale = 0.5;
      c.q_lens = {17, 130};
      c.kv_lens = {17, 257};
      c.name = tag + "fp8 variant " + std::to_string(variant);
      run_checked(c, seed++);
    }
    Case c;
    c.name = tag + "kept plan, 2 repeats";
    c.hq = 4; c.hkv = 1;
    c.q_lens = {70, 129};
    c.kv_lens = {70, 200};
    c.keep_plan = true;
    c.repeats = 2;
    run_checked(c, seed++);
    // 18 units (128 rows each at group 4) on a grid of 2 CTAs, the plan kept for a second launch
    const HopperCtas two(2);
    c.q_lens = {130, 40, 17, 1, 60, 200};
    c.kv_lens = {130, 90, 17, 33, 60, 260};
    for (DType kv : {DType::bf16, DType::fp8_e4m3}) {
      c.kv_dt = kv;
      c.k_scale = kv == DType::bf16 ? 1.0 : 0.5;
      c.name = tag + "2 CTAs, 9 units each, " + (kv == DType::bf16 ? "bf16" : "fp8 e4m3") + ", kept plan, 2 repeats";
      run_checked(c, seed++);
    }
    // units in a row on 2 CTAs whose warpgroups skip tiles: a window that skips the first tiles
    // of some units for one warpgroup; group 1, where the first warpgroup's last visible tile
    // comes before its unit's last (tiles to skip after it)
    for (int variant = 0; variant < 2; ++variant) {
      Case d;
      d.hkv = 1;
      d.hq = variant ? 1 : 4;
      d.window_left = variant ? -1 : 150;
      d.q_lens = {130, 40, 17, 1, 60, 200};
      d.kv_lens = {400, 90, 300, 33, 60, 460};
      d.name = tag + "2 CTAs, " + (variant ? "group 1 with context" : "window 150");
      run_checked(d, seed++);
    }
    // the tail always cut: 21 units on 2 CTAs (10 full waves, the last unit's 3 tiles shared),
    // and on the whole grid (every unit in pieces), sinks and LSE base e, a kept plan
    const TailSplit cut(2);
    c.kv_dt = DType::bf16;
    c.k_scale = 1.0;
    c.q_lens = {130, 40, 17, 1, 60, 200, 96};
    c.kv_lens = {400, 300, 290, 333, 560, 700, 900};
    c.sinks = true;
    c.base = LseBase::E;
    c.name = tag + "tail cut, 2 CTAs, kept plan, 2 repeats";
    run_checked(c, seed++);
    const HopperCtas all(0);
    c.name = tag + "tail cut, every unit in pieces, kept plan, 2 repeats";
    run_checked(c, seed++);
  }
}

// Which calls reach the prefill kernel.  Everything it does not implement goes to attn_kernel
// (and is checked against the reference here too).
TEST_F(CudaPrefill, Routing) {
  Case c;
  c.q_lens = {100, 40};
  c.kv_lens = {130, 40};
  c.name = "fp8 e4m3 pages -> the wgmma kernel on sm_90, else attn_kernel";
  c.kv_dt = DType::fp8_e4m3;
  c.k_scale = 0.5;
  EXPECT_EQ(run_case(c, 9000), hopper_covers(c) ? 1 : 0);
  if (hopper_covers(c)) {
    const HopperMode off(1);
    c.name = "fp8 e4m3 pages, wgmma kernel off -> attn_kernel";
    EXPECT_EQ(run_case(c, 9000), 0);
  }
  c.name = "PrefixLM ranges -> attn_kernel";
  c.kv_dt = DType::bf16;
  c.k_scale = 1.0;
  c.mm = true;
  EXPECT_EQ(run_case(c, 9001), 0);
  c.name = "XQA draft mask -> attn_kernel";
  c.mm = false;
  c.q_lens = {3, 4};
  c.kv_lens = {30, 44};
  c.xqa = true;
  EXPECT_EQ(run_case(c, 9002), 0);
  // automatic mode: small / decode-like calls stay on attn_kernel, a large prefill does not
  cuda_impl::set_prefill_kernel_mode(0);
  Case d;
  d.name = "automatic: decode batch -> attn_kernel";
  d.q_lens = {1, 1, 1, 1};
  d.kv_lens = {300, 20, 1, 77};
  EXPECT_EQ(run_case(d, 9003), 0);
  d.name = "automatic: small prefill -> attn_kernel";
  d.q_lens = {64};
  d.kv_lens = {64};
  EXPECT_EQ(run_case(d, 9004), 0);
  d.name = "automatic: large prefill -> prefill kernel";
  d.hq = 32; d.hkv = 8; d.dim = 64;
  d.q_lens = {600};
  d.kv_lens = {600};
  const int sms = kvattn::cuda::multiprocessor_count(0);
  const int64_t units = (600 + 3) * 4 / 128 * 8;
  EXPECT_EQ(run_case(d, 9005), units >= sms ? 1 : 0) << sms << " SMs";
  cuda_impl::set_prefill_kernel_mode(1);
  d.name = "off: large prefill -> attn_kernel";
  EXPECT_EQ(run_case(d, 9006), 0);
}

}  // namespace
}  // namespace kvattn::ops
