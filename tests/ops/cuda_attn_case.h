// Shared by the CUDA ops tests: GPU mirrors of CPU test tensors, and one paged_attention case
// run on the GPU and on the CPU reference (random inputs, NaN-poisoned outputs and LSE, page 0
// NaN, padding rows that must stay untouched) with the comparison.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kvattn/core/cuda_runtime_api.h"
#include "kernel_routing.h"
#include "ops/cuda_dispatch.h"
#include "ops_test_util.h"

namespace kvattn::ops::testing {

inline Device gpu() { return Device::cuda(0); }

// A GPU copy of a CPU tensor's whole storage, and the same view on it.
struct Mirror {
  Tensor cpu_base, gpu_base;
  explicit Mirror(const Tensor& base) : cpu_base(base) {
    KVATTN_CHECK(base.is_contiguous() && base.byte_offset() == 0, "Mirror needs a fresh contiguous base");
    gpu_base = base.to(gpu());
  }
  Tensor view(const Tensor& v) const {
    const int64_t off = v.byte_offset() / v.element_size();
    return gpu_base.view_as(v.dtype()).as_strided(v.shape(), v.strides(), off);
  }
  Tensor back() const { return gpu_base.to(Device::cpu()); }
};

inline Tensor to_gpu(const Tensor& t) { return t.defined() ? t.contiguous().to(gpu()) : Tensor(); }

struct AttnCase {
  std::vector<int64_t> q_lens, kv_lens;
  int64_t hq = 32, hkv = 8, dim = 128, page = 16;
  DType q_dt = DType::bf16, kv_dt = DType::bf16, out_dt = DType::bf16;
  int layout = 6;
  bool paged_form = true;
  bool causal = true;
  int64_t window_left = -1;
  double soft_cap = 0.0;
  bool sinks = false;
  bool lse = true;
  LseBase base = LseBase::Two;
  bool xqa = false;
  bool mm = false;
  double k_scale = 1.0, v_scale = 1.0;
  int64_t pad_rows = 2;
  int repeats = 1;  // calls on the same inputs (each re-poisoned and checked)
  // false: the repeats are enqueued back to back, each into its own poisoned output, with no
  // synchronisation between them (a call whose kernels overlap the previous call's would show in
  // its output or its split counters), then all checked
  bool sync_each = true;
  // idx64: qo_indptr and the page ids (or block table) as int64; idx_strided: the page ids (or
  // block table) as a strided view, every other element of a wider tensor — the kernels' page-id
  // loads of both widths and of any stride
  bool idx64 = false;
  bool idx_strided = false;
  bool xqa_random_bits = true;  // clear some mask bits below the diagonal at random
  double out_tol = 0;           // > 0: the output tolerance instead of tol_for()
  double lse_tol = 2e-2;        // largest |LSE - reference LSE| accepted
  KvLengthsHint kv_hint = KvLengthsHint::unknown;  // PagedAttentionArgs::kv_lengths of the GPU call
  int64_t max_q_len = -1;  // PagedAttentionArgs::max_query_len of both calls (the CPU one checks it)
  bool keep_plan = false;  // the GPU calls share one PagedAttentionPlan (the repeats reuse it)
  bool plan_unused = false;  // with keep_plan: the path takes no plan (it must neither plan nor reuse)
  // the slots of each request's last page at or past its kv_len hold NaN in K and V: keys that do
  // not exist must not reach the output (a kernel that copies whole pages must mask them and keep
  // their V out of P V, where 0 x NaN would still be NaN)
  bool nan_tails = true;
  std::string name;
};

inline double tol_for(const AttnCase& c) {
  if (c.kv_dt == DType::fp8_e4m3 || c.kv_dt == DType::fp8_e5m2 || c.kv_dt == DType::f16) return 1.5e-2;
  return 3e-2;  // bf16 P and V
}

// Fixture of the general decode path's tests (general_decode / decode_fp8 / decode_streamk): every decode
// call goes to the general path (not the small path); the process's decode options are saved and put
// back, with the forced split count and the small-path mode.  min_cc (e.g. 90) skips below it.
class CudaGeneralDecodeTest : public ::testing::Test {
 protected:
  explicit CudaGeneralDecodeTest(int min_cc = 0) : min_cc_(min_cc) {}
  void SetUp() override {
    if (!kvattn::cuda::available()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)";
    if (kvattn::cuda::compute_capability(0) < min_cc_)
      GTEST_SKIP() << "needs compute capability " << min_cc_ / 10 << "." << min_cc_ % 10 << " or later";
    opts0_ = cuda_impl::decode_options();
    saved_ = true;
    cuda_impl::set_small_decode_mode(1);  // general path for every decode call
  }
  void TearDown() override {
    if (!saved_) return;
    cuda_impl::set_decode_options(opts0_);
    cuda_impl::set_decode_splits(0);
    cuda_impl::set_decode_chunk(0);
    cuda_impl::set_small_decode_mode(0);
  }
  int opts0_ = 1;  // the process's decode options when the test started

 private:
  int min_cc_;
  bool saved_ = false;
};

// The GPU call's output (and LSE when defined) against the CPU reference's: rows past `used`
// (no request) still NaN (untouched), relative error of the rest under `tol`, every LSE written,
// infinities equal and finite ones within lse_tol.
inline void expect_matches_reference(const Tensor& out_dev, const Tensor& lse_dev, const Tensor& out_ref,
                                     const Tensor& lse_ref, int64_t used, double tol, double lse_tol = 2e-2) {
  const Tensor out_gpu = out_dev.to(Device::cpu());
  for (int64_t t = used; t < out_gpu.size(0); ++t)
    EXPECT_TRUE(std::isnan(out_gpu.get({t, 0, 0}))) << "padding row " << t << " was written";
  if (used <= 0) return;
  EXPECT_LT(rel_error(out_gpu.slice(0, 0, used), out_ref.slice(0, 0, used)), tol) << "out";
  if (!lse_dev.defined()) return;
  const auto x = lse_dev.to(Device::cpu()).slice(0, 0, used).to_double_vector();
  const auto y = lse_ref.slice(0, 0, used).to_double_vector();
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isinf(y[i]) || std::isinf(x[i])) {
      EXPECT_EQ(x[i], y[i]) << "lse " << i;
      continue;
    }
    if (std::isnan(x[i])) {
      ADD_FAILURE() << "lse " << i << " is NaN (row not written)";
      break;
    }
    worst = std::max(worst, std::abs(x[i] - y[i]));
  }
  EXPECT_LT(worst, lse_tol) << "lse";
}

// Runs one case on the GPU and the CPU reference and compares; returns how many calls reached
// the prefill kernel (prefill_kernel.cu).
inline int64_t run_attn_case(const AttnCase& c, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << "case " << c.name << " seed " << seed);
  std::mt19937 rng(seed);
  Batch b = make_batch(c.q_lens, c.kv_lens, c.page, rng, c.pad_rows);
  KVCache cache = make_kv_cache(c.layout, b.num_pages, c.page, c.hkv, c.dim, c.kv_dt);
  fill_cache(cache, rng);  // page 0 holds NaN (never read)
  if (c.nan_tails)
    for (size_t r = 0; r < c.kv_lens.size(); ++r) {
      const int64_t used = c.kv_lens[r] % c.page;  // slots in use of the request's last page
      if (c.kv_lens[r] == 0 || used == 0) continue;  // no page, or a full last page
      const int64_t last = b.indptr.at<int32_t>({static_cast<int64_t>(r) + 1}) - 1;  // its entry in indices
      const int64_t pg = b.indices.at<int32_t>({last});
      for (int64_t s = used; s < c.page; ++s) {
        fill_nan(cache.k.select(0, pg).select(0, s));
        fill_nan(cache.v.select(0, pg).select(0, s));
      }
    }
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
      for (int64_t t = 0; t < c.q_lens[i]; ++t, ++row) {
        if (c.q_lens[i] >= 4 && t >= 1 && t < 4) {  // tokens 1..3 form an image span
          r[row * 2] = static_cast<int32_t>(ctx + 1);
          r[row * 2 + 1] = static_cast<int32_t>(ctx + 3);
        }
      }
    }
    mm = Tensor::from_vector(r, Dims{b.num_tokens, 2});
  }
  if (c.xqa) {
    Tensor m = make_xqa_draft_block_mask(c.q_lens, true);
    // pad rows + randomise some bits below the diagonal
    xqa = Tensor::zeros({b.num_tokens, m.size(1)}, DType::i32);
    for (int64_t i = 0; i < m.size(0); ++i)
      for (int64_t w = 0; w < m.size(1); ++w) {
        uint32_t bits = static_cast<uint32_t>(m.at<int32_t>({i, w}));
        if (c.xqa_random_bits && rng() % 2) bits &= ~(1u << (rng() % 3));
        xqa.at<int32_t>({i, w}) = static_cast<int32_t>(bits);
      }
  }
  PagedAttentionArgs a = attn_args(b, cache, q, c.paged_form);
  // c.idx64 / c.idx_strided: the page ids (or block table) as int64 and / or at every other
  // element of the last dimension of a wider tensor (garbage between), the same view on the GPU
  Tensor ind_dev, bt_dev;
  auto reindex = [&](const Tensor& t, Tensor* dev) -> Tensor {
    if (!t.defined()) return t;
    Tensor x = c.idx64 ? t.to(DType::i64) : t;
    if (!c.idx_strided || x.numel() == 0) {
      *dev = to_gpu(x);
      return x;
    }
    Dims wide = x.shape();
    wide[wide.size() - 1] *= 2;
    Tensor w = Tensor::empty(wide, x.dtype());
    fill_uniform(w, rng, -1000, 1000);
    Tensor v = w.slice(wide.size() - 1, 0, wide[wide.size() - 1], 2);
    v.copy_from(x);
    *dev = to_gpu(w).slice(wide.size() - 1, 0, wide[wide.size() - 1], 2);
    return v;
  };
  if (c.idx64) a.qo_indptr = a.qo_indptr.to(DType::i64);
  a.paged_kv_indices = reindex(a.paged_kv_indices, &ind_dev);
  a.block_table = reindex(a.block_table, &bt_dev);
  a.out = out_ref; a.lse = lse_ref; a.lse_base = c.base; a.causal = c.causal; a.window_left = c.window_left;
  a.logits_soft_cap = c.soft_cap; a.k_scale = c.k_scale; a.v_scale = c.v_scale; a.sinks = sinks;
  a.mm_prefix_ranges = mm; a.xqa_draft_mask = xqa;
  a.max_query_len = c.max_q_len;
  Mirror mcache(cache.backing);
  PagedAttentionArgs g = a;
  g.query = to_gpu(q); g.k_cache = mcache.view(cache.k); g.v_cache = mcache.view(cache.v);
  g.qo_indptr = to_gpu(a.qo_indptr);
  g.paged_kv_indptr = to_gpu(a.paged_kv_indptr); g.paged_kv_indices = ind_dev;
  g.paged_kv_last_page_len = to_gpu(a.paged_kv_last_page_len);
  g.block_table = bt_dev; g.seq_lens = to_gpu(a.seq_lens);
  const Tensor out_poison = out_ref.to(gpu());  // poisoned (NaN) copies
  const Tensor lse_poison = c.lse ? lse_ref.to(gpu()) : Tensor();
  g.out = out_poison;
  g.lse = lse_poison;
  g.sinks = to_gpu(sinks); g.mm_prefix_ranges = to_gpu(mm); g.xqa_draft_mask = to_gpu(xqa);
  g.kv_lengths = c.kv_hint;
  PagedAttentionPlan plan;
  if (c.keep_plan) g.plan = &plan;
  reference::paged_attention(a);
  const int64_t launches_before = cuda_impl::prefill_kernel_launches();
  if (!c.sync_each) {
    std::vector<Tensor> outs, lses;
    for (int rep = 0; rep < c.repeats; ++rep) {  // every output made before the first call
      outs.push_back(out_poison.to(Device::cpu()).to(gpu()));
      lses.push_back(c.lse ? lse_poison.to(Device::cpu()).to(gpu()) : Tensor());
    }
    kvattn::cuda::synchronize();
    for (int rep = 0; rep < c.repeats; ++rep) {
      g.out = outs[static_cast<size_t>(rep)];
      g.lse = lses[static_cast<size_t>(rep)];
      paged_attention(g);
    }
    kvattn::cuda::synchronize();
    for (int rep = 0; rep < c.repeats; ++rep) {
      SCOPED_TRACE(::testing::Message() << "back-to-back call " << rep);
      expect_matches_reference(outs[static_cast<size_t>(rep)], lses[static_cast<size_t>(rep)], out_ref, lse_ref,
                               b.qo_indptr.to_vector<int32_t>().back(), c.out_tol > 0 ? c.out_tol : tol_for(c), c.lse_tol);
    }
  }
  for (int rep = 0; c.sync_each && rep < c.repeats; ++rep) {
  SCOPED_TRACE(::testing::Message() << "call " << rep);
  if (rep > 0) {  // fresh poisoned outputs: every call must write every row again
    g.out = out_poison.to(Device::cpu()).to(gpu());
    if (c.lse) g.lse = lse_poison.to(Device::cpu()).to(gpu());
  }
  paged_attention(g);
  kvattn::cuda::synchronize();
  expect_matches_reference(g.out, c.lse ? g.lse : Tensor(), out_ref, lse_ref,
                           b.qo_indptr.to_vector<int32_t>().back(), c.out_tol > 0 ? c.out_tol : tol_for(c), c.lse_tol);
  }
  if (c.keep_plan && c.plan_unused) {
    EXPECT_EQ(plan.plans(), 0) << "a path without a plan planned";
    EXPECT_EQ(plan.reuses(), 0) << "a path without a plan reused one";
  } else if (c.keep_plan) {
    EXPECT_EQ(plan.plans(), 1) << "the kept plan was planned again";
    EXPECT_EQ(plan.reuses(), c.repeats - 1);
  }
  return cuda_impl::prefill_kernel_launches() - launches_before;
}

}  // namespace kvattn::ops::testing
