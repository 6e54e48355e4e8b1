// The CUDA prefill kernel (src/ops/cuda/prefill_kernel.cu) against the CPU reference on random
// inputs: forced on for every case it supports (KVATTN routing mode "force"), so small shapes
// exercise it too; every KV layout (strided views) and both page forms, permuted pages with page
// 0 NaN-filled, NaN-poisoned outputs and LSE, odd lengths (1, 15, 17, 1000, 2049), GQA 1/4/8,
// head sizes 64/128/256, causal and not, chunked prefill (query after cached context), LSE in
// both bases, soft cap, sliding window, sinks, q/k/v scales, f32/f16/bf16 query and output.
// The routing test checks which calls reach the kernel: fp8 pages, PrefixLM ranges and XQA masks
// stay on attn_kernel, as do decode-like calls in automatic mode.  Skips when no GPU is present.
#include <gtest/gtest.h>

#include "kvattn/core/cuda_runtime_api.h"
#include "ops/cuda_dispatch.h"
#include "ops_test_util.h"

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

Device gpu() { return Device::cuda(0); }

struct Mirror {
  Tensor cpu_base, gpu_base;
  explicit Mirror(const Tensor& base) : cpu_base(base) { gpu_base = base.to(gpu()); }
  Tensor view(const Tensor& v) const {
    const int64_t off = v.byte_offset() / v.element_size();
    return gpu_base.view_as(v.dtype()).as_strided(v.shape(), v.strides(), off);
  }
};

Tensor to_gpu(const Tensor& t) { return t.defined() ? t.contiguous().to(gpu()) : Tensor(); }

struct Case {
  std::vector<int64_t> q_lens, kv_lens;
  int64_t hq = 8, hkv = 2, dim = 128, page = 16;
  DType q_dt = DType::bf16, kv_dt = DType::bf16, out_dt = DType::bf16;
  int layout = 6;
  bool paged_form = true;
  bool causal = true;
  int64_t window_left = -1;
  double soft_cap = 0.0;
  bool sinks = false;
  bool lse = true;
  LseBase base = LseBase::Two;
  bool mm = false, xqa = false;
  double k_scale = 1.0, v_scale = 1.0;
  int64_t pad_rows = 3;
  std::string name;
};

// Runs one case on the GPU and the CPU reference; returns how many calls reached the prefill
// kernel (0 or 1).
int64_t run_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "case " << c.name << " seed " << seed);
  std::mt19937 rng(seed);
  Batch b = make_batch(c.q_lens, c.kv_lens, c.page, rng, c.pad_rows);
  KVCache cache = make_kv_cache(c.layout, b.num_pages, c.page, c.hkv, c.dim, c.kv_dt);
  fill_cache(cache, rng);  // random values, page 0 NaN
  Tensor q = Tensor::empty({b.num_tokens, c.hq, c.dim}, c.q_dt);
  fill_uniform(q, rng, -2, 2);
  Tensor out_ref = Tensor::empty({b.num_tokens, c.hq, c.dim}, c.out_dt);
  fill_nan(out_ref);
  Tensor lse_ref;
  if (c.lse) {
    lse_ref = Tensor::empty({b.num_tokens, c.hq}, DType::f32);
    fill_nan(lse_ref);
  }
  Tensor sinks, mm, xqa;
  if (c.sinks) {
    sinks = Tensor::empty({c.hq}, DType::f32);
    fill_uniform(sinks, rng, -1, 3);
  }
  if (c.mm) {
    std::vector<int32_t> r(static_cast<size_t>(b.num_tokens * 2), -1);
    int64_t row = 0;
    for (size_t i = 0; i < c.q_lens.size(); ++i) {
      const int64_t ctx = c.kv_lens[i] - c.q_lens[i];
      for (int64_t t = 0; t < c.q_lens[i]; ++t, ++row)
        if (c.q_lens[i] >= 4 && t >= 1 && t < 4) {
          r[row * 2] = static_cast<int32_t>(ctx + 1);
          r[row * 2 + 1] = static_cast<int32_t>(ctx + 3);
        }
    }
    mm = Tensor::from_vector(r, Dims{b.num_tokens, 2});
  }
  if (c.xqa) {
    const Tensor m = make_xqa_draft_block_mask(c.q_lens, true);
    xqa = Tensor::zeros({b.num_tokens, m.size(1)}, DType::i32);
    for (int64_t i = 0; i < m.size(0); ++i)
      for (int64_t w = 0; w < m.size(1); ++w) xqa.at<int32_t>({i, w}) = m.at<int32_t>({i, w});
  }
  PagedAttentionArgs a;
  a.query = q; a.k_cache = cache.k; a.v_cache = cache.v; a.qo_indptr = b.qo_indptr;
  if (c.paged_form) {
    a.paged_kv_indptr = b.indptr; a.paged_kv_indices = b.indices; a.paged_kv_last_page_len = b.last_page_len;
  } else {
    a.block_table = b.block_table; a.seq_lens = b.seq_lens;
  }
  a.out = out_ref; a.lse = lse_ref; a.lse_base = c.base; a.causal = c.causal; a.window_left = c.window_left;
  a.logits_soft_cap = c.soft_cap; a.k_scale = c.k_scale; a.v_scale = c.v_scale; a.sinks = sinks;
  a.mm_prefix_ranges = mm; a.xqa_draft_mask = xqa;
  Mirror mcache(cache.backing);
  PagedAttentionArgs g = a;
  g.query = to_gpu(q); g.k_cache = mcache.view(cache.k); g.v_cache = mcache.view(cache.v);
  g.qo_indptr = to_gpu(b.qo_indptr);
  g.paged_kv_indptr = to_gpu(a.paged_kv_indptr); g.paged_kv_indices = to_gpu(a.paged_kv_indices);
  g.paged_kv_last_page_len = to_gpu(a.paged_kv_last_page_len);
  g.block_table = to_gpu(a.block_table); g.seq_lens = to_gpu(a.seq_lens);
  g.out = out_ref.to(gpu());  // poisoned (NaN) copy
  g.lse = c.lse ? lse_ref.to(gpu()) : Tensor();
  g.sinks = to_gpu(sinks); g.mm_prefix_ranges = to_gpu(mm); g.xqa_draft_mask = to_gpu(xqa);
  reference::paged_attention(a);
  const int64_t before = cuda_impl::prefill_kernel_launches();
  paged_attention(g);
  kvattn::cuda::synchronize();
  const int64_t launched = cuda_impl::prefill_kernel_launches() - before;
  const Tensor out_gpu = g.out.to(Device::cpu());
  const int64_t used = b.qo_indptr.to_vector<int32_t>().back();
  for (int64_t t = used; t < b.num_tokens; ++t)
    EXPECT_TRUE(std::isnan(out_gpu.get({t, 0, 0}))) << "padding row " << t << " was written";
  if (used > 0) {
    const double tol = c.kv_dt == DType::f16 ? 1.5e-2 : 3e-2;  // bf16 P and V: ~1e-2
    const double err = rel_error(out_gpu.slice(0, 0, used), out_ref.slice(0, 0, used));
    EXPECT_LT(err, tol) << "out";
    if (c.lse) {
      const Tensor lg = g.lse.to(Device::cpu()).slice(0, 0, used), lr = lse_ref.slice(0, 0, used);
      const auto x = lg.to_double_vector(), y = lr.to_double_vector();
      double worst = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        if (std::isinf(y[i]) || std::isinf(x[i])) {
          EXPECT_EQ(x[i], y[i]) << "lse " << i;
          continue;
        }
        if (std::isnan(x[i])) {
          ADD_FAILURE() << "lse " << i << " is NaN";
          break;
        }
        worst = std::max(worst, std::abs(x[i] - y[i]));
      }
      EXPECT_LT(worst, 2e-2) << "lse";
    }
  }
  return launched;
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

// Which calls reach the prefill kernel.  Everything it does not implement goes to attn_kernel
// (and is checked against the reference here too).
TEST_F(CudaPrefill, Routing) {
  Case c;
  c.q_lens = {100, 40};
  c.kv_lens = {130, 40};
  c.name = "fp8 e4m3 pages -> attn_kernel";
  c.kv_dt = DType::fp8_e4m3;
  c.k_scale = 0.5;
  EXPECT_EQ(run_case(c, 9000), 0);
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
