// The whole-page decode path (src/ops/cuda/page_decode.cu): every case runs on the GPU with the
// path forced (KVATTN_PAGE_DECODE=force's setter) and against the CPU reference — random inputs,
// NaN-poisoned outputs and LSE, NaN in page 0 with permuted pages (make_batch), untouched padding
// rows — and each call is checked to have taken the path (page_decode_launches()).  Shapes: every
// cache layout, both page-table forms, int64 and strided page ids, odd / empty / one-key lengths,
// page sizes 16 / 32 / 64, GQA 1 / 2 / 4 / 8 / 16, multi-token rows (causal and not, up to 16 rows
// per KV head), f16, LSE in both bases and none, one request cut over every CTA, more requests
// than the plan kernel's block, fewer chunks than CTAs, a plan kept across calls (the split
// counters must reset themselves).  Also: what the automatic route takes and leaves, a request
// that breaks the max_query_len promise (NaN rows, nothing else touched), and on the CPU (no GPU
// needed) the chunk-range arithmetic of page_decode_schedule.h against a simulation of the plan
// kernel, every CTA's walk and the merges (from the slots, in two levels past 8 pieces, and into a
// range-end piece's registers).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "cuda_attn_case.h"
#include "kvattn/core/cuda_runtime_api.h"
#include "ops/cuda/page_decode_schedule.h"

namespace kvattn::ops::testing {
namespace {

// ---- the schedule on the CPU (no GPU needed): the functions the kernels run ------------------
namespace ps = cuda_impl::k::page_sched;

// Plans chunk counts as page_plan_kernel does, walks every CTA's range as page_decode_kernel does
// (which requests it holds, which it writes whole, which it leaves in which slot) and merges as
// its last piece does; checks that the ranges partition the chunks, that each CTA's first request
// is the one the plan kernel writes, that a CTA holds at most two cut requests in distinct slots,
// that the merge finds exactly the (CTA, slot) pieces the CTAs wrote, that only a request's last
// piece ends inside its range (the kernel counts it early), that a piece running to its
// range's end, merging into registers, reads every other piece's slot, and that a request of more
// than kGroup pieces splits into groups that cover its pieces once, each merged into its first
// piece's slot, with a counter per group.
void check_page_schedule(const std::vector<int64_t>& chunks, int64_t grid) {
  SCOPED_TRACE(::testing::Message() << chunks.size() << " requests, grid " << grid);
  const int64_t B = static_cast<int64_t>(chunks.size());
  std::vector<int64_t> cstart(chunks.size() + 1, 0);
  for (int64_t r = 0; r < B; ++r) cstart[r + 1] = cstart[r] + chunks[r];
  const int64_t T = cstart[B];
  if (T == 0) return;
  const int64_t G = std::min(grid, T);
  // the plan kernel's first request of each range
  std::vector<int64_t> first(static_cast<size_t>(G), -1);
  for (int64_t r = 0; r < B; ++r) {
    if (chunks[r] == 0) continue;
    for (int64_t c = ps::first_cta_starting_in(cstart[r], G, T); c < ps::cta_of(cstart[r + 1] - 1, G, T) + 1; ++c) {
      EXPECT_EQ(first[c], -1) << "CTA " << c << " given two first requests";
      first[c] = r;
    }
  }
  std::map<int64_t, std::set<std::pair<int64_t, int>>> written;  // cut request -> (CTA, slot)
  std::vector<int> whole(chunks.size(), 0);
  std::map<int64_t, std::vector<std::pair<int64_t, int>>> held_at_end;  // pieces running to a range's end
  for (int64_t c = 0; c < G; ++c) {
    const int64_t x0 = ps::range_begin(c, G, T), x1 = ps::range_begin(c + 1, G, T);
    ASSERT_LT(x0, x1) << "CTA " << c << " has an empty range";
    if (c == 0) {
      EXPECT_EQ(x0, 0);
    }
    if (c == G - 1) {
      EXPECT_EQ(x1, T);
    }
    ASSERT_GE(first[c], 0) << "CTA " << c << " has no first request";
    EXPECT_TRUE(cstart[first[c]] <= x0 && x0 < cstart[first[c] + 1]) << "CTA " << c << ": wrong first request";
    EXPECT_EQ(ps::cta_of(x0, G, T), c);
    EXPECT_EQ(ps::cta_of(x1 - 1, G, T), c);
    int cut = 0, slots = 0;
    for (int64_t r = first[c]; r < B && cstart[r] < x1; ++r) {
      if (chunks[r] == 0) continue;
      if (cstart[r] < x0 || cstart[r + 1] > x1) {
        const int slot = ps::cut_slot(cstart[r], x0);
        EXPECT_TRUE(written[r].insert({c, slot}).second);
        // only the request's last piece ends inside its range (and is counted early); every
        // other piece runs to its range's end, where it may merge into registers
        EXPECT_EQ(ps::ends_inside(cstart[r], chunks[r], x1), c == ps::cta_of(cstart[r + 1] - 1, G, T))
            << "request " << r << " in CTA " << c;
        if (!ps::ends_inside(cstart[r], chunks[r], x1)) {
          EXPECT_EQ(x1, ps::range_begin(c + 1, G, T));
          held_at_end[r].push_back({c, slot});
        }
        ++cut;
        slots |= 1 << slot;
      } else {
        ++whole[r];
      }
    }
    EXPECT_LE(cut, 2) << "CTA " << c;
    EXPECT_EQ(__builtin_popcount(static_cast<unsigned>(slots)), cut) << "CTA " << c << ": two cut requests in one slot";
  }
  for (int64_t r = 0; r < B; ++r) {
    if (chunks[r] == 0) continue;
    const int64_t c_lo = ps::cta_of(cstart[r], G, T);
    const int64_t pieces = ps::piece_count(cstart[r], chunks[r], G, T);
    EXPECT_EQ(pieces, ps::cta_of(cstart[r + 1] - 1, G, T) - c_lo + 1);
    if (pieces == 1) {
      EXPECT_EQ(whole[r], 1) << "request " << r << " in one range must be written whole, once";
      EXPECT_EQ(written.count(r), 0u);
      continue;
    }
    EXPECT_EQ(whole[r], 0);
    std::set<std::pair<int64_t, int>> merged;
    for (int64_t c2 = c_lo; c2 < c_lo + pieces; ++c2) merged.insert({c2, ps::piece_slot(cstart[r], c2, c_lo, G, T)});
    EXPECT_EQ(merged, written[r]) << "request " << r << ": the merge reads other slots than the pieces wrote";
    // two levels past kGroup pieces: the groups cover every piece once, each group's partial goes
    // to its first piece's slot, and the call's counters have room for every group
    const int groups = ps::group_count(static_cast<int>(pieces));
    EXPECT_LE(1 + groups, ps::counters_per_unit(G)) << "request " << r;
    if (pieces > ps::kGroup) {
      int covered = 0;
      for (int gi = 0; gi < groups; ++gi) {
        const int n = ps::group_size(gi, static_cast<int>(pieces));
        EXPECT_GE(n, 1);
        EXPECT_LE(n, ps::kGroup);
        const int64_t first_piece = c_lo + int64_t(gi) * ps::kGroup;
        EXPECT_EQ(written[r].count({first_piece, ps::piece_slot(cstart[r], first_piece, c_lo, G, T)}), 1u);
        covered += n;
      }
      EXPECT_EQ(covered, pieces) << "request " << r;
      continue;  // no register merge: the groups merge
    }
    EXPECT_EQ(groups, 1);
    // a piece at a range's end merging into registers reads every other piece's slot
    EXPECT_EQ(held_at_end[r].size(), static_cast<size_t>(pieces - 1)) << "request " << r;
    for (const auto& [c, own] : held_at_end[r]) {
      std::set<std::pair<int64_t, int>> read{{c, own}};
      for (int64_t c2 = c_lo; c2 < c_lo + pieces; ++c2)
        if (c2 != c) read.insert({c2, ps::piece_slot(cstart[r], c2, c_lo, G, T)});
      EXPECT_EQ(read, written[r]) << "request " << r << ", register merge in CTA " << c;
    }
  }
}

TEST(PageDecodeSchedule, HandCases) {
  check_page_schedule({256, 256, 256}, 132);   // every request over ~44 CTAs
  check_page_schedule({1, 1, 1}, 132);         // fewer chunks than CTAs: 3 ranges
  check_page_schedule({0, 5, 0, 0, 7, 0}, 4);  // requests without chunks skipped
  check_page_schedule({10}, 1);
  check_page_schedule({3, 3, 3, 3}, 4);        // ranges on request boundaries: nothing cut
  check_page_schedule({100000, 1, 100000}, 132);
  // 64 x 4096 and 128 x 4096 at page 16 on 132 SMs (the benchmark shapes)
  check_page_schedule(std::vector<int64_t>(64, 256), 132);
  check_page_schedule(std::vector<int64_t>(128, 256), 132);
}

TEST(PageDecodeSchedule, Randomised) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const int64_t B = 1 + static_cast<int64_t>(rng() % 300);
    std::vector<int64_t> chunks(static_cast<size_t>(B));
    const int kind = trial % 3;
    for (auto& n : chunks) {
      const uint32_t u = rng();
      n = kind == 0 ? u % 40 : kind == 1 ? (u % 4 == 0 ? 0 : u % 600) : (u % 50 == 0 ? 5000 + u % 9000 : u % 3);
    }
    const int64_t grids[] = {1, 2, 7, 108, 132, 264};
    check_page_schedule(chunks, grids[rng() % 6]);
  }
}

class CudaPageDecodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kvattn::cuda::available()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)";
    if (kvattn::cuda::compute_capability(0) < 90) GTEST_SKIP() << "the path runs on sm_90 or later";
    saved_ = true;
    cuda_impl::set_page_decode_mode(2);
  }
  void TearDown() override {
    if (saved_) cuda_impl::set_page_decode_mode(0);
  }
  // one case, which must reach the page path on every call
  void run(AttnCase c, uint32_t seed) {
    if (c.max_q_len < 0) {
      c.max_q_len = 1;
      for (int64_t q : c.q_lens) c.max_q_len = std::max(c.max_q_len, q);
    }
    const int64_t n0 = cuda_impl::page_decode_launches();
    run_attn_case(c, seed);
    EXPECT_EQ(cuda_impl::page_decode_launches() - n0, c.repeats) << c.name << ": not every call took the page path";
  }

 private:
  bool saved_ = false;
};

std::vector<int64_t> ones(size_t n) { return std::vector<int64_t>(n, 1); }

TEST_F(CudaPageDecodeTest, EveryLayoutBothFormsOddLengths) {
  const std::vector<int64_t> kv = {1, 15, 16, 17, 0, 300, 4097, 33, 1000, 2, 64, 511};
  for (int layout = 0; layout < kNumLayouts; ++layout)
    for (bool paged : {true, false}) {
      AttnCase c;
      c.q_lens = ones(kv.size());
      c.kv_lens = kv;
      c.layout = layout;
      c.paged_form = paged;
      c.name = std::string(layout_name(layout)) + (paged ? " kv_indices" : " block table");
      run(c, 100 + layout * 2 + (paged ? 1 : 0));
    }
}

TEST_F(CudaPageDecodeTest, IndexWidthsStridesPageSizes) {
  std::mt19937 rng(7);
  for (int64_t page : {16, 32, 64})
    for (int v = 0; v < 4; ++v) {
      AttnCase c;
      c.page = page;
      c.idx64 = v & 1;
      c.idx_strided = v & 2;
      c.paged_form = v != 2;
      c.layout = v == 3 ? 7 : 6;
      std::uniform_int_distribution<int64_t> len(0, 1500);
      for (int r = 0; r < 24; ++r) c.kv_lens.push_back(len(rng));
      c.q_lens = ones(c.kv_lens.size());
      c.name = "page " + std::to_string(page) + " variant " + std::to_string(v);
      run(c, 200 + static_cast<uint32_t>(page) + v);
    }
}

TEST_F(CudaPageDecodeTest, GroupsAndMultiTokenRows) {
  struct G {
    int64_t hq, max_q;
    bool causal;
  };
  // rows per KV head = max_q x group: 1, 2, 4 (8 rows), 16 (R16), 6, 12, 16 with GQA 16
  for (const G gq : {G{8, 1, true}, G{16, 1, true}, G{64, 1, true}, G{32, 4, true}, G{32, 4, false}, G{16, 3, true},
                     G{16, 6, false}, G{64, 2, true}, G{128, 1, true}}) {
    AttnCase c;
    c.hq = gq.hq;
    c.causal = gq.causal;
    c.max_q_len = gq.max_q;
    const std::vector<int64_t> kv = {5, 17, 250, 1, 0, 4100, 40, 3};
    for (size_t r = 0; r < kv.size(); ++r) {
      c.kv_lens.push_back(kv[r]);
      c.q_lens.push_back(std::min<int64_t>(gq.max_q, 1 + static_cast<int64_t>(r) % gq.max_q));
    }
    c.q_lens[2] = 0;  // a request with keys and no query row
    c.base = gq.causal ? LseBase::Two : LseBase::E;
    c.layout = gq.hq == 64 ? 7 : 6;
    c.name = "hq " + std::to_string(gq.hq) + " max_q " + std::to_string(gq.max_q) + (gq.causal ? " causal" : "");
    run(c, 300 + static_cast<uint32_t>(gq.hq + gq.max_q));
  }
}

TEST_F(CudaPageDecodeTest, F16NoLseAndScales) {
  AttnCase c;
  c.q_dt = c.kv_dt = c.out_dt = DType::f16;
  c.lse = false;
  c.k_scale = 0.8;
  c.v_scale = 1.25;
  c.kv_lens = {2048, 7, 129, 3333};
  c.q_lens = ones(4);
  c.name = "f16";
  run(c, 401);
}

TEST_F(CudaPageDecodeTest, OneRequestOverEveryCta) {
  AttnCase c;
  c.kv_lens = {60001};
  c.q_lens = {1};
  c.repeats = 2;
  c.name = "1 x 60001";
  run(c, 501);
  c.hq = 64;  // GQA 8, 8 rows per KV head
  c.kv_lens = {20000, 20000};
  c.q_lens = {1, 1};
  c.layout = 3;
  c.paged_form = false;
  c.name = "2 x 20000 GQA 8";
  run(c, 502);
}

TEST_F(CudaPageDecodeTest, ManyRequestsAndFewChunks) {
  std::mt19937 rng(11);
  AttnCase c;
  std::uniform_int_distribution<int64_t> len(0, 90);
  for (int r = 0; r < 2500; ++r) c.kv_lens.push_back(len(rng));  // more than the plan kernel's 1024 threads
  c.q_lens = ones(c.kv_lens.size());
  c.name = "2500 short requests";
  run(c, 601);
  AttnCase f;
  f.kv_lens = {20, 3, 33};  // 5 chunks: fewer than CTAs
  f.q_lens = ones(3);
  f.name = "5 chunks";
  run(f, 602);
  AttnCase z;
  z.kv_lens = {0, 0};  // no chunk at all: zeros and -inf
  z.q_lens = ones(2);
  z.name = "no keys";
  run(z, 603);
}

// Requests shorter than a range: nearly every range ends inside a request whose other piece is a
// short one at the next range's start, which counts itself early — so the range's end usually
// merges that piece into its registers, and otherwise leaves its slot for the count.  Odd
// lengths, GQA 4 and 8 (4 and 8 rows per KV head), three calls on a kept plan.
TEST_F(CudaPageDecodeTest, CutRequestsOfTwoPieces) {
  std::mt19937 rng(13);
  AttnCase c;
  std::uniform_int_distribution<int64_t> len(300, 700);
  for (int r = 0; r < 200; ++r) c.kv_lens.push_back(len(rng));
  c.q_lens = ones(c.kv_lens.size());
  c.keep_plan = true;
  c.repeats = 3;
  c.name = "200 x U[300, 700]";
  run(c, 721);
  c.hq = 64;  // GQA 8: 8 rows per KV head
  c.layout = 3;
  c.name = "200 x U[300, 700] GQA 8";
  run(c, 722);
}

TEST_F(CudaPageDecodeTest, KeptPlanRepeats) {
  AttnCase c;
  c.kv_lens = {4096, 4096, 100, 9000, 1, 4096, 5000, 16};
  c.q_lens = ones(c.kv_lens.size());
  c.keep_plan = true;
  c.repeats = 4;  // three calls on the kept plan: the split counters must be back at 0 each time
  c.name = "kept plan";
  run(c, 701);
  c.layout = 7;
  c.paged_form = false;
  c.hq = 128;
  c.name = "kept plan, block table, GQA 16";
  run(c, 702);
}

// Calls enqueued back to back with no synchronisation between them, on a kept plan and on a plan
// per call: every call reuses the workspace's split counters and partial slots, so each must find
// the counters back at 0 and leave them so for the next one while its output is still unread.
TEST_F(CudaPageDecodeTest, BackToBackCallsWithoutSync) {
  AttnCase c;
  c.kv_lens = {4096, 4096, 100, 9000, 1, 4096, 5000, 16, 3000, 777};
  c.q_lens = ones(c.kv_lens.size());
  c.repeats = 6;
  c.sync_each = false;
  c.keep_plan = true;
  c.name = "back to back, kept plan";
  run(c, 711);
  c.keep_plan = false;
  c.lse = false;
  c.name = "back to back, plan per call, no LSE";
  run(c, 712);
}

// Automatic routing: the path takes a large decode call with max_query_len known, and leaves
// calls without the promise, with options it does not implement, with more rows per KV head, or
// with fewer requests than a quarter of the SMs.
TEST_F(CudaPageDecodeTest, AutomaticRoute) {
  cuda_impl::set_page_decode_mode(0);
  auto taken = [&](AttnCase c) {
    const int64_t n0 = cuda_impl::page_decode_launches();
    run_attn_case(c, 801);
    return cuda_impl::page_decode_launches() - n0;
  };
  AttnCase c;
  c.kv_lens = std::vector<int64_t>(64, 1500);
  c.q_lens = ones(64);
  c.max_q_len = 1;
  c.name = "64 x 1500";
  EXPECT_EQ(taken(c), 1);
  AttnCase u = c;
  u.max_q_len = -1;
  u.name = "no max_query_len";
  EXPECT_EQ(taken(u), 0);
  AttnCase w = c;
  w.window_left = 100;
  w.name = "window";
  EXPECT_EQ(taken(w), 0);
  AttnCase s = c;
  s.soft_cap = 30;
  s.name = "soft cap";
  EXPECT_EQ(taken(s), 0);
  AttnCase r = c;
  r.max_q_len = 5;  // 20 rows per KV head
  r.name = "max_query_len 5";
  EXPECT_EQ(taken(r), 0);
  AttnCase f8 = c;
  f8.kv_dt = DType::fp8_e4m3;
  f8.name = "fp8";
  EXPECT_EQ(taken(f8), 0);
  AttnCase few = c;  // 32 requests: fewer than one per 4 CTAs on an H200's 132 SMs
  few.kv_lens = std::vector<int64_t>(32, 1500);
  few.q_lens = ones(32);
  few.name = "32 x 1500";
  EXPECT_EQ(taken(few), kvattn::cuda::multiprocessor_count(0) >= 128 ? 0 : 1);
  AttnCase one = c;
  one.kv_lens = {1024};
  one.q_lens = {1};
  one.name = "1 x 1024 (small-call path)";
  EXPECT_EQ(taken(one), 0);
}

// A request with more rows than max_query_len promised: its rows read NaN (out and LSE), every
// other request is still right and the padding rows stay untouched.
TEST_F(CudaPageDecodeTest, BrokenPromiseGivesNanRows) {
  std::mt19937 rng(901);
  const std::vector<int64_t> q_lens = {1, 3, 1}, kv_lens = {500, 400, 2000};
  Batch b = make_batch(q_lens, kv_lens, 16, rng, 2);
  KVCache cache = make_kv_cache(6, b.num_pages, 16, 8, 128, DType::bf16);
  fill_cache(cache, rng);
  Tensor q = Tensor::empty({b.num_tokens, 32, 128}, DType::bf16);
  fill_uniform(q, rng, -2, 2);
  Tensor out_ref = Tensor::empty({b.num_tokens, 32, 128}, DType::bf16);
  fill_nan(out_ref);
  Tensor lse_ref = Tensor::empty({b.num_tokens, 32}, DType::f32);
  fill_nan(lse_ref);
  PagedAttentionArgs a = attn_args(b, cache, q, true);
  a.out = out_ref;
  a.lse = lse_ref;
  reference::paged_attention(a);  // the CPU reference of the honest call
  Mirror mc(cache.backing);
  PagedAttentionArgs g = a;
  g.query = to_gpu(q);
  g.k_cache = mc.view(cache.k);
  g.v_cache = mc.view(cache.v);
  g.qo_indptr = to_gpu(a.qo_indptr);
  g.paged_kv_indptr = to_gpu(a.paged_kv_indptr);
  g.paged_kv_indices = to_gpu(a.paged_kv_indices);
  g.paged_kv_last_page_len = to_gpu(a.paged_kv_last_page_len);
  Tensor poison = Tensor::empty({b.num_tokens, 32, 128}, DType::bf16);
  poison.fill_(7.0);  // finite: the NaN rows are written, not left over
  g.out = poison.to(gpu());
  Tensor lpoison = Tensor::empty({b.num_tokens, 32}, DType::f32);
  lpoison.fill_(7.0);
  g.lse = lpoison.to(gpu());
  g.max_query_len = 1;  // broken by request 1 (3 rows)
  const int64_t n0 = cuda_impl::page_decode_launches();
  paged_attention(g);
  kvattn::cuda::synchronize();
  EXPECT_EQ(cuda_impl::page_decode_launches() - n0, 1);
  const Tensor out = g.out.to(Device::cpu()), lse = g.lse.to(Device::cpu());
  // rows 1..3 belong to request 1: NaN in every output element and LSE
  for (int64_t t = 1; t < 4; ++t)
    for (int64_t h = 0; h < 32; ++h) {
      EXPECT_TRUE(std::isnan(lse.get({t, h}))) << t << " " << h;
      for (int64_t d : {0, 77, 127}) EXPECT_TRUE(std::isnan(out.get({t, h, d}))) << t << " " << h << " " << d;
    }
  EXPECT_LT(rel_error(out.slice(0, 0, 1), out_ref.slice(0, 0, 1)), 3e-2);
  EXPECT_LT(rel_error(out.slice(0, 4, 5), out_ref.slice(0, 4, 5)), 3e-2);
  EXPECT_LT(rel_error(lse.slice(0, 4, 5), lse_ref.slice(0, 4, 5)), 1e-3);
  for (int64_t t = 5; t < b.num_tokens; ++t) EXPECT_EQ(out.get({t, 0, 0}), 7.0) << "padding row " << t;
  // and the CPU path refuses the broken promise with a clear error
  PagedAttentionArgs cpu = a;
  cpu.max_query_len = 1;
  try {
    reference::paged_attention(cpu);
    ADD_FAILURE() << "the CPU reference accepted a broken max_query_len";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("max_query_len = 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvattn::ops::testing
