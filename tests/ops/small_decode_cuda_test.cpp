// The cluster small-call decode kernel (src/ops/cuda/small_decode.cu) against the CPU reference:
// every case runs on the cluster kernel and then on the small form of attn_kernel (attn_kernel<..., SMALL>)
// on the same inputs, with the launch counters showing which kernel ran.  Random inputs,
// NaN-poisoned outputs and LSE, permuted page tables with page 0 reserved (NaN), odd lengths
// (shorter than one 16-key slice, not multiples of 16, fewer keys than pieces), batches 1 to 32,
// every cache layout, page sizes 1 to 48 (both instantiations: whole 16-key slices per page or
// not), both page-table forms, GQA 1/4/8, head dims 64/128, bf16 and f16, sinks,
// soft cap, sliding window, LSE in both bases, multi-token rows (several 16-row tiles per unit),
// cluster sizes 1 to 16; calls the kernel does not cover must stay on attn_kernel's small form.
// Skips on devices before sm_90 (no thread-block clusters: attn_kernel's small form runs there).
#include <gtest/gtest.h>

#include <cstdio>

#include "kvattn/core/cuda_runtime_api.h"
#include "cuda_attn_case.h"

namespace kvattn::ops {
namespace {
using namespace testing;

class CudaClusterDecode : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kvattn::cuda::available()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)";
    if (kvattn::cuda::compute_capability(0) < 90) GTEST_SKIP() << "thread-block clusters need sm_90";
    cuda_impl::set_small_decode_mode(2);  // force: every decode call of <= 32 requests
    cuda_impl::set_small_decode_kernel(0);
    cuda_impl::set_small_cluster_max(16);
    cuda_impl::set_small_page_window(true);
    cuda_impl::set_small_warps(0);
    cuda_impl::set_small_route8(true);
  }
  void TearDown() override {
    if (!kvattn::cuda::available()) return;
    cuda_impl::set_small_decode_mode(0);
    cuda_impl::set_small_decode_kernel(0);
    cuda_impl::set_small_cluster_max(16);
    cuda_impl::set_small_page_window(true);
    cuda_impl::set_small_warps(0);
    cuda_impl::set_small_route8(true);
  }
  // The case on the cluster kernel with 4 warps per CTA and with the automatic choice (8 warps
  // wherever their clusters hold the call in one wave, else 4), then on attn_kernel's small form.
  static void both_kernels(const AttnCase& c, uint32_t seed, bool covered = true) {
    for (int run : {0, 1, 2}) {
      const int kernel = run == 2 ? 1 : 0;
      SCOPED_TRACE(run == 0 ? "cluster kernel, 4 warps" : run == 1 ? "cluster kernel, automatic warps" : "attn_kernel small form");
      cuda_impl::set_small_decode_kernel(kernel);
      cuda_impl::set_small_warps(run == 0 ? 4 : 0);
      const int64_t small0 = cuda_impl::small_decode_launches();
      const int64_t cl0 = cuda_impl::small_cluster_launches();
      run_attn_case(c, seed);
      EXPECT_EQ(cuda_impl::small_decode_launches() - small0, c.repeats) << "small path";
      EXPECT_EQ(cuda_impl::small_cluster_launches() - cl0, (kernel == 0 && covered) ? c.repeats : 0)
          << "cluster kernel routing";
    }
    cuda_impl::set_small_decode_kernel(0);
    cuda_impl::set_small_warps(0);
  }
};

// Page sizes: multiples of 16 keys (16, 32, 48: one page id per 16-key slice, 48 not a power of
// two) run the SIMPLE instantiation; 1 and 8 walk one page id per key on the general one.
TEST_F(CudaClusterDecode, GqaEveryLayoutOddLengths) {
  std::mt19937 rng(1901);
  uint32_t seed = 1910;
  const int64_t pages[] = {16, 8, 48, 1, 32};
  for (int64_t group : {1, 4, 8}) {
    for (int layout = 0; layout < kNumLayouts; ++layout) {
      AttnCase c;
      c.page = pages[(layout + group) % 5];
      c.name = "cluster gqa" + std::to_string(group) + " layout " + layout_name(layout) + " page " +
               std::to_string(c.page);
      c.layout = layout;
      c.paged_form = (layout + group) % 2 == 1;
      c.hkv = 1 + layout % 4;
      c.hq = c.hkv * group;
      const int B = 1 + static_cast<int>(rng() % 6);
      static const int64_t kShort[] = {1, 3, 15, 17, 31, 33, 0};
      for (int r = 0; r < B; ++r) {
        c.q_lens.push_back(1);
        c.kv_lens.push_back(r % 2 ? kShort[rng() % 7] : 1 + 2 * static_cast<int64_t>(rng() % 1500));  // odd
      }
      c.base = layout % 2 ? LseBase::E : LseBase::Two;
      both_kernels(c, seed++);
    }
  }
}

// Batches up to the small path's bound (32 requests; 32 q / 8 KV heads: from 256 units down to
// one piece per unit), mixed lengths with empty requests.
TEST_F(CudaClusterDecode, BatchesOneToThirtyTwo) {
  std::mt19937 rng(1950);
  for (int B : {1, 3, 8, 17, 32}) {
    AttnCase c;
    c.name = "cluster batch " + std::to_string(B);
    for (int r = 0; r < B; ++r) {
      c.q_lens.push_back(1);
      c.kv_lens.push_back(rng() % 11 == 0 ? 0 : 1 + static_cast<int64_t>(rng() % 2000));
    }
    c.paged_form = B % 2 == 1;
    both_kernels(c, 1950 + static_cast<uint32_t>(B));
  }
}

TEST_F(CudaClusterDecode, HeadDimsDtypesAndOptions) {
  uint32_t seed = 2000;
  for (int64_t dim : {64, 128}) {
    for (DType dt : {DType::bf16, DType::f16}) {
      for (int opt = 0; opt < 3; ++opt) {
        AttnCase c;
        c.name = "cluster dim " + std::to_string(dim) + " " + dtype_name(dt) + " options " + std::to_string(opt);
        c.dim = dim;
        c.kv_dt = c.q_dt = c.out_dt = dt;
        c.hq = 16; c.hkv = 4;
        c.q_lens = {1, 1, 1};
        c.kv_lens = {1537, 3, 611};
        if (opt == 1) { c.sinks = true; c.soft_cap = 25.0; c.window_left = 700; c.base = LseBase::E; }
        if (opt == 2) { c.window_left = 5; c.k_scale = 0.6; c.v_scale = 1.7; c.lse = false; c.paged_form = false; }
        both_kernels(c, seed++);
      }
    }
  }
  // float32 output (scalar stores) with a bf16 query: still the cluster kernel
  AttnCase c;
  c.name = "cluster f32 out";
  c.out_dt = DType::f32;
  c.q_lens = {1, 1};
  c.kv_lens = {2049, 77};
  c.sinks = true;
  both_kernels(c, seed++);
}

// Several query tokens per request: 16-row tiles walked inside one cluster (group 4: 5 tokens =
// 20 rows = 2 tiles, 8 tokens = 2 full tiles), causal and not, window, sinks, zero-query requests.
// (The call must stay a decode-config call — at most 16 rows per request on average — to reach
// the small path at all.)
TEST_F(CudaClusterDecode, MultiTokenRows) {
  AttnCase c;
  c.name = "cluster multi-token causal";
  c.hq = 16; c.hkv = 4;
  c.q_lens = {3, 1, 0, 5, 2, 8};
  c.kv_lens = {901, 40, 17, 300, 2, 1000};
  c.sinks = true;
  both_kernels(c, 2100);
  c.name = "cluster multi-token window lse-e page 8";
  c.sinks = false;
  c.window_left = 33;
  c.page = 8;
  c.base = LseBase::E;
  both_kernels(c, 2101);
  c.name = "cluster multi-token non-causal page 48";
  c.window_left = -1;
  c.page = 48;
  c.causal = false;
  both_kernels(c, 2102);
}

// Cluster sizes 1, 2, 3, 7, 8, 16 (odd and even, portable and not): 1 x 1024, one request shorter
// than the pieces (37 keys over up to 16 pieces: most pieces empty), a long one (5003 keys: many
// tiles per piece, the stage ring wraps; 1 x 20011 at 16 pieces runs in CudaSmallDecode), repeated
// calls on fresh poisoned outputs (no state survives a launch).  (Kept small: these tests also run
// under compute-sanitizer.)
TEST_F(CudaClusterDecode, EveryClusterSize) {
  uint32_t seed = 2200;
  for (int pmax : {1, 2, 3, 7, 8, 16}) {
    cuda_impl::set_small_cluster_max(pmax);
    for (int64_t len : {int64_t(1024), int64_t(37), int64_t(5003)}) {
      AttnCase c;
      c.name = "cluster max " + std::to_string(pmax) + " 1x" + std::to_string(len);
      c.q_lens = {1};
      c.kv_lens = {len};
      c.repeats = 2;
      c.sinks = len == 37;
      both_kernels(c, seed++);
    }
  }
  cuda_impl::set_small_cluster_max(16);
  std::printf("[ cluster size bound now %d ]\n", cuda_impl::small_cluster_max());
}

// The page-id window (the first 2 KB of the page index staged in shared memory per CTA): page
// ids past it — kv_indices of more than 512 int32 / 256 int64 rows, block-table rows wider than
// that — come from global memory; int32 and int64 indices, strided views, both page-table forms,
// a later request whose first pages sit past the window; every case with the window off too.
TEST_F(CudaClusterDecode, PageWindowEdges) {
  uint32_t seed = 2400;
  for (bool window : {true, false}) {
    cuda_impl::set_small_page_window(window);
    ASSERT_EQ(cuda_impl::small_page_window(), window);
    for (int form = 0; form < 2; ++form) {
      for (int idx = 0; idx < 3; ++idx) {  // int32, int64, int64 strided
        AttnCase c;
        c.paged_form = form == 0;
        c.idx64 = idx > 0;
        c.idx_strided = idx == 2;
        c.hq = 8; c.hkv = 2;
        c.q_lens = {1, 1, 1};
        // (page size, request 0's keys): kv_indices 313 + 238 + 8 = 559 int32 rows (> 512),
        // 19 + 282 + 4 = 305 and 38 + 238 + 8 = 284 int64 rows (> 256); block-table rows 1901 int32
        // and 282 int64 wide (past the window), 238 (inside); pages of 16 run the SIMPLE kernel
        static const int64_t kPage[2][3] = {{8, 16, 8}, {1, 16, 8}};
        c.page = kPage[form][idx];
        c.kv_lens = {idx == 0 && c.paged_form ? 2500 : 300, c.page == 16 ? 4500 : 1901, 57};
        c.name = std::string("page window ") + (window ? "on" : "off") + (c.paged_form ? " kv_indices" : " block table") +
                 (c.idx64 ? " int64" : " int32") + (c.idx_strided ? " strided" : "");
        both_kernels(c, seed++);
      }
    }
    // inside the window: 1 x 1024 at page 16 (64 rows), repeated calls
    AttnCase c;
    c.q_lens = {1};
    c.kv_lens = {1024};
    c.repeats = 2;
    c.name = std::string("page window ") + (window ? "on" : "off") + " 1x1024";
    both_kernels(c, seed++);
  }
  cuda_impl::set_small_page_window(true);
}

// Automatic routing: 1 request (8 units at 32 / 8 heads) takes the cluster kernel; 16 requests
// (128 units: 2 pieces per unit with 2 four-warp CTAs on each of 132 SMs) stay on attn_kernel's small form under the
// 4-warp rule alone (fewer than kClusterMinAutoPieces = 4 pieces per unit: the cluster kernel lost
// on 16 x 4096 at 2 pieces); with the 8-warp route (default) they may move to the cluster kernel
// (one 8-warp CTA per unit where 128 of them fit at once), never the other way; all are
// small-path calls with outputs checked.
TEST_F(CudaClusterDecode, AutomaticRoutingByPieces) {
  cuda_impl::set_small_decode_mode(0);
  for (bool route8 : {false, true}) {
    cuda_impl::set_small_route8(route8);
    for (int B : {1, 8, 16}) {
      AttnCase c;
      c.name = "auto cluster routing batch " + std::to_string(B) + (route8 ? " (8-warp route)" : "");
      for (int r = 0; r < B; ++r) {
        c.q_lens.push_back(1);
        c.kv_lens.push_back(B == 8 ? 1024 : 1 + 37 * r);
      }
      const int64_t small0 = cuda_impl::small_decode_launches();
      const int64_t cl0 = cuda_impl::small_cluster_launches();
      run_attn_case(c, 2250 + static_cast<uint32_t>(B));
      EXPECT_EQ(cuda_impl::small_decode_launches() - small0, 1) << c.name << ": small path";
      const int64_t cl = cuda_impl::small_cluster_launches() - cl0;
      if (B == 1) {
        EXPECT_EQ(cl, 1) << c.name;
      }
      if (B == 16 && !route8) {
        EXPECT_EQ(cl, 0) << c.name;
      }
      std::printf("[ %s: %s kernel ]\n", c.name.c_str(), cl == 1 ? "cluster" : "attn_kernel small form");
    }
  }
  cuda_impl::set_small_route8(true);
}

// Warps per CTA: one request of 1024 keys (8 units of <= 8 pieces: one 8-warp CTA per SM holds
// them on any sm_90 part) runs 8 warps automatically and 4 when asked; 32 requests (256 units:
// too many for one 8-warp CTA per SM) run 4 warps even automatically.
TEST_F(CudaClusterDecode, WarpsPerCtaChoice) {
  for (const auto& [warps, batch, expect8] : {std::tuple{0, 1, 1}, std::tuple{4, 1, 0}, std::tuple{0, 32, 0}}) {
    cuda_impl::set_small_warps(warps);
    AttnCase c;
    c.name = "warps " + std::to_string(warps) + " batch " + std::to_string(batch);
    c.q_lens.assign(static_cast<size_t>(batch), 1);
    c.kv_lens.assign(static_cast<size_t>(batch), 1024);
    const int64_t cl0 = cuda_impl::small_cluster_launches();
    const int64_t w80 = cuda_impl::small_cluster_launches_8warps();
    run_attn_case(c, 2350 + static_cast<uint32_t>(batch + warps));
    EXPECT_EQ(cuda_impl::small_cluster_launches() - cl0, 1) << c.name;
    EXPECT_EQ(cuda_impl::small_cluster_launches_8warps() - w80, expect8) << c.name;
  }
  cuda_impl::set_small_warps(0);
}

// Calls the cluster kernel does not cover stay on attn_kernel<..., SMALL>, and are right.
TEST_F(CudaClusterDecode, UncoveredCallsTakeTheSmallForm) {
  uint32_t seed = 2300;
  AttnCase c;
  c.q_lens = {1, 1};
  c.kv_lens = {700, 33};
  c.name = "fp8 e4m3";
  c.kv_dt = DType::fp8_e4m3; c.k_scale = 0.8; c.v_scale = 1.1;
  both_kernels(c, seed++, false);
  c.name = "fp8 e5m2";
  c.kv_dt = DType::fp8_e5m2;
  both_kernels(c, seed++, false);
  c.kv_dt = DType::bf16; c.k_scale = c.v_scale = 1.0;
  c.name = "head dim 256";
  c.dim = 256;
  both_kernels(c, seed++, false);
  c.dim = 128;
  c.name = "f32 query";
  c.q_dt = DType::f32;
  both_kernels(c, seed++, false);
  c.q_dt = DType::bf16;
  c.name = "f16 cache, bf16 query";
  c.kv_dt = DType::f16;
  both_kernels(c, seed++, false);
  c.kv_dt = DType::bf16;
  c.name = "xqa draft mask";
  c.q_lens = {3, 1};
  c.xqa = true;
  both_kernels(c, seed++, false);
}

}  // namespace
}  // namespace kvattn::ops
