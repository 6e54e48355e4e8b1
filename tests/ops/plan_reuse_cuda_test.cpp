// Kept plans across paged_attention calls (ops::PagedAttentionPlan): an engine step runs every
// layer over one batch, so the first call of a step runs the plan kernel and the later layers run
// on the kept tables.  Each case below runs several steps of several layers:
//   * every layer has its own KV cache (random, its own layout: the layers of a model may sit in
//     one layer-major allocation or apart) and its own query; page ids are a random permutation
//     with page 0 reserved; outputs and LSE are NaN-poisoned before every call; padding rows must
//     stay untouched;
//   * the batch lives in persistent GPU index buffers (fixed addresses, as vLLM's and a CUDA
//     graph's): each step writes new lengths into them and calls invalidate();
//   * every call is compared with the CPU reference, and the plan's counters must say that
//     exactly the first call of each step planned.  A reused call also proves that the work
//     counters reset themselves: a counter left at its end value would hand out no work and leave
//     the poisoned output in place.
// Paths: the decode config's work-counter path (bf16, f16), stream-K (fp8 caches, a (request, KV
// head) pair per CTA), the prefill kernel (the wgmma kernel on sm_90), attn_kernel's prefill
// config; both page forms.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda_attn_case.h"
#include "kvattn/core/cuda_runtime_api.h"

namespace kvattn::ops::testing {
namespace {

struct Step {
  std::vector<int64_t> q_lens, kv_lens;
};

struct ReuseCase {
  std::vector<Step> steps;
  int layers = 3;
  int64_t hq = 32, hkv = 8, dim = 128, page = 16;
  DType kv_dt = DType::bf16, q_dt = DType::bf16;
  bool paged_form = true;
  int prefill_mode = 1;  // cuda_impl::set_prefill_kernel_mode: 1 off, 2 force
  bool expect_kept = true;  // false: a path that plans inside its launch (the plan stays unused)
  std::string name;
};

// GPU index buffers of fixed address and shape, large enough for every step of a case.
struct IndexBuffers {
  Tensor qo, indptr, indices, last, block_table, seq_lens;  // GPU
  int64_t bt_width = 0;
};

// Pads a 1-D int32 CPU tensor to n entries (value `fill`), as a new CPU tensor.
Tensor pad1(const Tensor& t, int64_t n, int32_t fill) {
  std::vector<int32_t> v = t.numel() > 0 ? t.to_vector<int32_t>() : std::vector<int32_t>{};
  v.resize(static_cast<size_t>(n), fill);
  return Tensor::from_vector(v);
}

class CudaPlanReuse : public CudaGeneralDecodeTest {
 protected:
  void TearDown() override {
    cuda_impl::set_prefill_kernel_mode(0);
    CudaGeneralDecodeTest::TearDown();
  }

  void run(const ReuseCase& c, uint32_t seed) {
    SCOPED_TRACE(::testing::Message() << "case " << c.name << " seed " << seed);
    cuda_impl::set_prefill_kernel_mode(c.prefill_mode);
    std::mt19937 rng(seed);
    // batches first: the caches need the most pages any step uses, the buffers the most entries
    std::vector<Batch> batches;
    int64_t pages = 0, n_idx = 1, width = 1, tokens = 0;
    const size_t B = c.steps.front().q_lens.size();
    for (const Step& s : c.steps) {
      ASSERT_EQ(s.q_lens.size(), B) << "every step of a case keeps the batch size (fixed buffers)";
      batches.push_back(make_batch(s.q_lens, s.kv_lens, c.page, rng, /*pad_rows=*/2));
      pages = std::max(pages, batches.back().num_pages);
      n_idx = std::max(n_idx, batches.back().indices.numel());
      width = std::max(width, batches.back().block_table.size(1));
      tokens = std::max(tokens, batches.back().num_tokens);
    }
    IndexBuffers ib;
    ib.bt_width = width;
    ib.qo = Tensor::empty({int64_t(B) + 1}, DType::i32, gpu());
    ib.indptr = Tensor::empty({int64_t(B) + 1}, DType::i32, gpu());
    ib.indices = Tensor::empty({n_idx}, DType::i32, gpu());
    ib.last = Tensor::empty({int64_t(B)}, DType::i32, gpu());
    ib.block_table = Tensor::empty({int64_t(B), width}, DType::i32, gpu());
    ib.seq_lens = Tensor::empty({int64_t(B)}, DType::i32, gpu());

    static const int kLayouts[] = {6, 0, 4, 1};
    std::vector<KVCache> caches;
    std::vector<std::unique_ptr<Mirror>> mirrors;
    for (int l = 0; l < c.layers; ++l) {
      caches.push_back(make_kv_cache(kLayouts[l % 4], pages, c.page, c.hkv, c.dim, c.kv_dt));
      fill_cache(caches.back(), rng);
      mirrors.push_back(std::make_unique<Mirror>(caches.back().backing));
    }

    PagedAttentionPlan plan;
    const int64_t streamk0 = cuda_impl::streamk_launches();
    const int64_t prefill0 = cuda_impl::prefill_kernel_launches();
    const int64_t hopper0 = cuda_impl::prefill_hopper_launches();
    for (size_t si = 0; si < c.steps.size(); ++si) {
      SCOPED_TRACE(::testing::Message() << "step " << si);
      const Batch& b = batches[si];
      // the step's metadata, written into the same buffers; then the plan is stale
      ib.qo.copy_from(b.qo_indptr);
      ib.indptr.copy_from(b.indptr);
      ib.indices.copy_from(pad1(b.indices, n_idx, 0));
      ib.last.copy_from(b.last_page_len);
      {
        Tensor bt = Tensor::zeros({int64_t(B), width}, DType::i32);
        for (int64_t r = 0; r < int64_t(B); ++r)
          for (int64_t j = 0; j < b.block_table.size(1); ++j)
            bt.at<int32_t>({r, j}) = b.block_table.at<int32_t>({r, j});
        ib.block_table.copy_from(bt);
      }
      ib.seq_lens.copy_from(b.seq_lens);
      plan.invalidate();
      for (int l = 0; l < c.layers; ++l) {
        SCOPED_TRACE(::testing::Message() << "layer " << l);
        const KVCache& cache = caches[static_cast<size_t>(l)];
        Tensor q = Tensor::empty({b.num_tokens, c.hq, c.dim}, c.q_dt);
        fill_uniform(q, rng, -2, 2);
        Tensor out_ref = Tensor::empty({b.num_tokens, c.hq, c.dim}, DType::bf16);
        Tensor lse_ref = Tensor::empty({b.num_tokens, c.hq}, DType::f32);
        fill_nan(out_ref);
        fill_nan(lse_ref);
        PagedAttentionArgs a = attn_args(b, cache, q, c.paged_form);
        a.out = out_ref; a.lse = lse_ref;
        PagedAttentionArgs g = a;
        g.query = to_gpu(q);
        g.k_cache = mirrors[static_cast<size_t>(l)]->view(cache.k);
        g.v_cache = mirrors[static_cast<size_t>(l)]->view(cache.v);
        g.qo_indptr = ib.qo;
        if (c.paged_form) {
          g.paged_kv_indptr = ib.indptr;
          g.paged_kv_indices = ib.indices.narrow(0, 0, std::max<int64_t>(b.indices.numel(), 1));
          g.paged_kv_last_page_len = ib.last;
        } else {
          g.block_table = ib.block_table;
          g.seq_lens = ib.seq_lens;
        }
        g.out = out_ref.to(gpu());  // poisoned
        g.lse = lse_ref.to(gpu());
        g.plan = &plan;
        reference::paged_attention(a);
        paged_attention(g);
        kvattn::cuda::synchronize();
        const int64_t used = b.qo_indptr.to_vector<int32_t>().back();
        ASSERT_GT(used, 0);
        expect_matches_reference(g.out, g.lse, out_ref, lse_ref, used, c.kv_dt == DType::bf16 ? 3e-2 : 1.5e-2);
      }
      const int64_t steps_done = static_cast<int64_t>(si) + 1;
      if (c.expect_kept) {
        EXPECT_EQ(plan.plans(), steps_done) << "one plan per step";
        EXPECT_EQ(plan.reuses(), steps_done * (c.layers - 1)) << "every later layer reuses it";
      } else {
        EXPECT_EQ(plan.plans(), 0);
        EXPECT_EQ(plan.reuses(), 0);
      }
    }
    streamk_calls_ = cuda_impl::streamk_launches() - streamk0;
    prefill_calls_ = cuda_impl::prefill_kernel_launches() - prefill0;
    hopper_calls_ = cuda_impl::prefill_hopper_launches() - hopper0;
  }
  int64_t streamk_calls_ = 0, prefill_calls_ = 0, hopper_calls_ = 0;  // hopper: of prefill_calls_, the wgmma kernel's
};

std::vector<int64_t> lens(size_t n, std::mt19937& rng, int64_t lo, int64_t hi) {
  std::uniform_int_distribution<int64_t> u(lo, hi);
  std::vector<int64_t> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

TEST_F(CudaPlanReuse, DecodeCounterPath) {
  std::mt19937 rng(5);
  for (bool paged : {true, false}) {
    for (DType dt : {DType::bf16, DType::f16}) {
      ReuseCase c;
      c.name = std::string(paged ? "paged " : "block table ") + dtype_name(dt);
      c.kv_dt = dt;
      c.q_dt = dt;
      c.paged_form = paged;
      // odd lengths, an empty request, one long request that gets split; then shorter, then longer
      c.steps.push_back({std::vector<int64_t>(7, 1), {1, 0, 37, 2050, 255, 16, 999}});
      c.steps.push_back({std::vector<int64_t>(7, 1), lens(7, rng, 1, 300)});
      c.steps.push_back({std::vector<int64_t>(7, 1), lens(7, rng, 500, 3000)});
      run(c, 11);
      EXPECT_EQ(streamk_calls_, 0);
    }
  }
}

TEST_F(CudaPlanReuse, DecodeForcedSplitsAndRemainderChunks) {
  // uniform lengths take the whole-wave / remainder split rules; forced splits as well
  std::mt19937 rng(6);
  for (int splits : {0, 3}) {
    cuda_impl::set_decode_splits(splits);
    ReuseCase c;
    c.name = "uniform, splits " + std::to_string(splits);
    c.steps.push_back({std::vector<int64_t>(24, 1), std::vector<int64_t>(24, 1111)});
    c.steps.push_back({std::vector<int64_t>(24, 1), std::vector<int64_t>(24, 517)});
    run(c, 12);
  }
  cuda_impl::set_decode_splits(0);
}

TEST_F(CudaPlanReuse, MultiTokenDecodeRows) {
  std::mt19937 rng(7);
  ReuseCase c;
  c.name = "q_len 1..4";
  c.hkv = 4;
  c.steps.push_back({{1, 2, 3, 4, 1}, {40, 333, 1030, 77, 5}});
  c.steps.push_back({{4, 1, 2, 3, 2}, lens(5, rng, 4, 900)});
  run(c, 13);
}

TEST_F(CudaPlanReuse, StreamKFp8) {
  if (kvattn::cuda::compute_capability(0) < 90) GTEST_SKIP() << "the fp8 stream-K default needs sm_90";
  std::mt19937 rng(8);
  // 96 requests x 8 KV heads = 768 pairs: at least one per CTA, so fp8 caches take stream-K
  ReuseCase c;
  c.name = "fp8 e4m3 stream-K";
  c.kv_dt = DType::fp8_e4m3;
  c.layers = 2;
  c.steps.push_back({std::vector<int64_t>(96, 1), lens(96, rng, 1, 200)});
  c.steps.push_back({std::vector<int64_t>(96, 1), lens(96, rng, 100, 400)});
  run(c, 14);
  EXPECT_EQ(streamk_calls_, 4) << "every call took the stream-K path";
}

TEST_F(CudaPlanReuse, PrefillKernel) {
  std::mt19937 rng(9);
  for (bool paged : {true, false}) {
    ReuseCase c;
    c.name = paged ? "prefill kernel, paged" : "prefill kernel, block table";
    c.paged_form = paged;
    c.prefill_mode = 2;  // force
    c.steps.push_back({{130, 64, 1}, {130, 200, 9}});  // chunked prefill: query after context
    c.steps.push_back({{77, 129, 3}, {300, 129, 50}});
    run(c, 15);
    EXPECT_EQ(prefill_calls_, 6) << "every call reached the prefill kernel";
    // on sm_90 the wgmma kernel serves them, on its own plan (pf_plan_l2_kernel)
    EXPECT_EQ(hopper_calls_, kvattn::cuda::compute_capability(0) == 90 ? 6 : 0);
  }
}

TEST_F(CudaPlanReuse, AttnKernelPrefillConfig) {
  ReuseCase c;
  c.name = "attn_kernel prefill config";
  c.prefill_mode = 1;  // off: attn_kernel's 64-row config
  c.steps.push_back({{40, 17, 33}, {40, 500, 33}});
  c.steps.push_back({{21, 60, 9}, {90, 60, 1000}});
  run(c, 16);
  EXPECT_EQ(prefill_calls_, 0);
}

TEST_F(CudaPlanReuse, SmallPathPlansInItsLaunch) {
  // the one-launch small path (automatic routing) has no plan kernel: nothing is kept, and the
  // results are right with the plan in the args
  cuda_impl::set_small_decode_mode(2);  // force
  ReuseCase c;
  c.name = "small path";
  c.expect_kept = false;
  c.steps.push_back({{1, 1}, {1024, 33}});
  c.steps.push_back({{1, 1}, {7, 2000}});
  run(c, 17);
}

TEST_F(CudaPlanReuse, NewPlanInputsReplanWithoutInvalidate) {
  // a call whose plan inputs differ (other index tensors, another head count) plans again by
  // itself; invalidate() alone also forces a new plan
  std::mt19937 rng(10);
  Batch b = make_batch({1, 1, 1}, {100, 2000, 7}, 16, rng, 0);
  KVCache cache = make_kv_cache(6, b.num_pages, 16, 8, 128, DType::bf16);
  fill_cache(cache, rng);
  Mirror m(cache.backing);
  Tensor q = Tensor::empty({b.num_tokens, 32, 128}, DType::bf16);
  fill_uniform(q, rng, -2, 2);
  Tensor ref = Tensor::empty({b.num_tokens, 32, 128}, DType::bf16);
  PagedAttentionArgs a = attn_args(b, cache, q, /*paged_form=*/true);
  a.out = ref;
  reference::paged_attention(a);
  PagedAttentionPlan plan;
  PagedAttentionArgs g = a;
  g.query = to_gpu(q); g.k_cache = m.view(cache.k); g.v_cache = m.view(cache.v);
  g.qo_indptr = to_gpu(b.qo_indptr); g.paged_kv_indptr = to_gpu(b.indptr);
  g.paged_kv_indices = to_gpu(b.indices); g.paged_kv_last_page_len = to_gpu(b.last_page_len);
  g.plan = &plan;
  auto check = [&](int64_t plans, int64_t reuses) {
    Tensor out = Tensor::empty({b.num_tokens, 32, 128}, DType::bf16);
    fill_nan(out);
    g.out = out.to(gpu());
    paged_attention(g);
    kvattn::cuda::synchronize();
    EXPECT_LT(rel_error(g.out.to(Device::cpu()), ref), 3e-2);
    EXPECT_EQ(plan.plans(), plans);
    EXPECT_EQ(plan.reuses(), reuses);
  };
  check(1, 0);
  check(1, 1);
  g.paged_kv_indptr = to_gpu(b.indptr);  // same contents, another address: a new plan
  check(2, 1);
  check(2, 2);
  plan.invalidate();
  check(3, 2);
  PagedAttentionPlan copy = plan;  // copies share the plan
  g.plan = &copy;
  check(3, 3);
}

}  // namespace
}  // namespace kvattn::ops::testing
