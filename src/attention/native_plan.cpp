// src/attention/native_plan.cpp — work plans and the native backend's wrappers.
#include "kvattn/attention/native_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "kvattn/attention/communicator.h"
#include "kvattn/batch/fast_div.h"
#include "kvattn/core/error.h"
#include "kvattn/ops/cascade.h"
#include "kvattn/ops/merge_attn_states.h"

namespace kvattn {

namespace {

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::span<const int32_t> host_span(const Tensor& t, int64_t n, const char* what) {
  KVATTN_ASSERT(t.defined() && t.device().is_cpu() && t.dtype() == DType::i32 && t.dim() == 1 &&
                    (t.size(0) <= 1 || t.stride(0) == 1) && t.size(0) >= n,
                "{}: expected a contiguous host int32 tensor of >= {} entries, got {}", what, n,
                t.defined() ? t.str() : "undefined");
  return {t.data_ptr<int32_t>(), static_cast<size_t>(n)};
}

// The query must have the planned head count and head size (a plan made for another layer or
// DCP world would otherwise run with the wrong GQA mapping).
void check_query(const Tensor& q, const AttentionPlanParams& p, const char* who) {
  KVATTN_CHECK(q.dim() == 3 && q.size(1) == p.num_qo_heads && q.size(2) == p.head_dim,
               "{}.run: query must be [tokens, {} heads, {}] as planned, got {}", who, p.num_qo_heads, p.head_dim,
               q.str());
}

ops::AttentionOptions run_options(const AttentionPlanParams& p, const AttentionRunArgs& r) {
  ops::AttentionOptions o;
  o.causal = p.causal;
  o.window_left = p.window_left;
  o.logits_soft_cap = p.logits_soft_cap;
  o.sm_scale = p.sm_scale;
  o.q_scale = r.q_scale;
  o.sinks = r.sinks;
  return o;
}

// The planned options plus this call's scales, sinks and LSE output (causal: the plan's).
void fill_run_options(ops::PagedAttentionArgs& a, const AttentionPlanParams& p, const AttentionRunArgs& r) {
  a.options() = run_options(p, r);
  a.k_scale = r.k_scale;
  a.v_scale = r.v_scale;
  a.lse = r.lse;
  a.lse_base = r.lse_base;
}

}  // namespace

void AttentionPlanParams::validate(const char* who) const {
  KVATTN_CHECK(num_qo_heads > 0 && num_kv_heads > 0 && num_qo_heads % num_kv_heads == 0,
               "{}.plan: num_qo_heads ({}) must be a positive multiple of num_kv_heads ({})", who, num_qo_heads,
               num_kv_heads);
  KVATTN_CHECK(head_dim > 0 && page_size > 0, "{}.plan: head_dim ({}) and page_size ({}) must be positive", who,
               head_dim, page_size);
  KVATTN_CHECK(sm_scale > 0, "{}.plan: sm_scale must be positive, got {}", who, sm_scale);
  KVATTN_CHECK(window_left >= -1, "{}.plan: window_left must be >= -1 (-1 = no window), got {}", who, window_left);
}

int64_t prefill_cta_tile_q(int64_t avg_packed_qo_len) noexcept {
  if (avg_packed_qo_len > 64) return 128;
  if (avg_packed_qo_len > 16) return 64;
  return 16;
}

// ---------------------------------------------------------------------------------------
WorkPlan::WorkPlan(int64_t max_batch, int64_t capacity) {
  KVATTN_CHECK(max_batch > 0 && capacity > 0, "WorkPlan: max_batch ({}) and capacity ({}) must be positive",
               max_batch, capacity);
  request_indices_ = Tensor::zeros({capacity}, DType::i32);
  qo_tile_indices_ = Tensor::zeros({capacity}, DType::i32);
  kv_tile_indices_ = Tensor::zeros({capacity}, DType::i32);
  o_indptr_ = Tensor::zeros({max_batch + 1}, DType::i32);
}

void WorkPlan::plan(std::span<const int32_t> qo_indptr, std::span<const int32_t> kv_lens, int64_t page_size,
                    int64_t num_kv_heads, int64_t gqa_group_size, int64_t cta_tile_q, int64_t max_ctas,
                    int64_t fixed_split_size, bool disable_split_kv) {
  const int64_t batch = static_cast<int64_t>(kv_lens.size());
  KVATTN_ASSERT(request_indices_.defined(), "WorkPlan used before construction");
  KVATTN_ASSERT(batch + 1 <= o_indptr_.size(0), "WorkPlan: batch {} exceeds the planned maximum {}", batch,
                o_indptr_.size(0) - 1);
  KVATTN_ASSERT(qo_indptr.empty() || static_cast<int64_t>(qo_indptr.size()) == batch + 1,
                "WorkPlan: qo_indptr has {} entries for {} requests", qo_indptr.size(), batch);
  KVATTN_ASSERT(page_size > 0 && cta_tile_q > 0 && num_kv_heads > 0, "WorkPlan: bad sizes");
  const BlockDiv page(page_size), tile(cta_tile_q);
  // Pass 1: pages and query tiles per request (kept in the scratch of the outputs).
  int32_t* pages = kv_tile_indices_.data_ptr<int32_t>() + (capacity() - batch);  // scratch tail
  int32_t* tiles = qo_tile_indices_.data_ptr<int32_t>() + (capacity() - batch);
  KVATTN_ASSERT(capacity() >= 2 * batch, "WorkPlan: capacity {} below twice the batch {}", capacity(), batch);
  auto q_len = [&](int64_t r) -> int64_t { return qo_indptr.empty() ? 1 : qo_indptr[r + 1] - qo_indptr[r]; };
  int64_t max_pages = 1, total_tiles = 0;
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t p = page.cdiv(kv_lens[r]), q = q_len(r);
    const int64_t t = q > 0 ? tile.cdiv(q * gqa_group_size) : 0;
    pages[r] = static_cast<int32_t>(p);
    tiles[r] = static_cast<int32_t>(t);
    max_pages = std::max(max_pages, p);
    total_tiles += t;
  }
  auto chunks_of = [&](int64_t r, int64_t c) { return std::max<int64_t>(1, cdiv(pages[r], c)); };
  int64_t chunk = max_pages;
  if (!disable_split_kv) {
    if (fixed_split_size > 0) {
      chunk = std::max<int64_t>(1, page.cdiv(fixed_split_size));
    } else if (total_tiles * num_kv_heads < max_ctas && max_pages > 1) {
      // Smallest chunk (>= 128 tokens) whose work items still fit the device in one wave.
      auto cost = [&](int64_t c) {
        int64_t n = 0;
        for (int64_t r = 0; r < batch; ++r) n += tiles[r] * chunks_of(r, c);
        return n * num_kv_heads;
      };
      int64_t lo = std::min(max_pages, std::max<int64_t>(1, 128 / page_size)), hi = max_pages;
      while (lo < hi) {
        const int64_t mid = (lo + hi) / 2;
        if (cost(mid) <= max_ctas) hi = mid; else lo = mid + 1;
      }
      chunk = lo;
    }
  }
  const bool split = chunk < max_pages;
  int64_t items = total_tiles;
  if (split) {
    items = 0;
    for (int64_t r = 0; r < batch; ++r) items += tiles[r] * chunks_of(r, chunk);
  }
  // Pass 2 writes from the front while pass 1's scratch sits in the tail: it must not overlap.
  const bool fits = items + batch <= capacity();
  if (!fits) {  // a fixed split finer than the buffers allow: do not split
    chunk = max_pages;
    items = total_tiles;
  }
  const bool do_split = fits && split;
  KVATTN_ASSERT(items + batch <= capacity(), "WorkPlan: {} work items exceed the capacity {}", items, capacity());
  int32_t* ri = request_indices_.data_ptr<int32_t>();
  int32_t* qi = qo_tile_indices_.data_ptr<int32_t>();
  int32_t* ki = kv_tile_indices_.data_ptr<int32_t>();
  int32_t* oi = o_indptr_.data_ptr<int32_t>();
  int64_t w = 0;
  oi[0] = 0;
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t nt = tiles[r], nc = do_split ? chunks_of(r, chunk) : 1;
    for (int64_t t = 0; t < nt; ++t)
      for (int64_t c = 0; c < nc; ++c) {
        ri[w] = static_cast<int32_t>(r);
        qi[w] = static_cast<int32_t>(t);
        ki[w] = static_cast<int32_t>(c);
        ++w;
      }
    oi[r + 1] = static_cast<int32_t>(oi[r] + q_len(r) * nc);
  }
  num_work_items_ = w;
  batch_ = batch;
  kv_chunk_size_pages_ = chunk;
  cta_tile_q_ = cta_tile_q;
  split_kv_ = do_split && w > total_tiles;
  num_partial_rows_ = oi[batch];
}

Tensor WorkPlan::request_indices() const { return request_indices_.narrow(0, 0, num_work_items_); }
Tensor WorkPlan::qo_tile_indices() const { return qo_tile_indices_.narrow(0, 0, num_work_items_); }
Tensor WorkPlan::kv_tile_indices() const { return kv_tile_indices_.narrow(0, 0, num_work_items_); }
Tensor WorkPlan::o_indptr() const { return o_indptr_.narrow(0, 0, batch_ + 1); }

// ---------------------------------------------------------------------------------------
BatchDecodeWrapper::BatchDecodeWrapper(std::string kv_layout, bool use_cuda_graph, int64_t max_batch,
                                       int64_t plan_capacity, Tensor qo_arange)
    : kv_layout_(std::move(kv_layout)), use_cuda_graph_(use_cuda_graph), max_batch_(max_batch),
      qo_arange_(std::move(qo_arange)), plan_(max_batch, plan_capacity) {}

void BatchDecodeWrapper::plan(const PagedKVView& kv, const AttentionPlanParams& params, int64_t num_sms) {
  params.validate("BatchDecodeWrapper");
  params_ = params;
  first_call_ = false;
  fast_plan(kv, num_sms);
}

void BatchDecodeWrapper::fast_plan(const PagedKVView& kv, int64_t num_sms) {
  const int64_t batch = kv.indptr_cpu.size(0) - 1;
  KVATTN_CHECK(batch >= 0 && batch <= max_batch_ && batch + 1 <= qo_arange_.size(0),
               "BatchDecodeWrapper: batch {} exceeds the wrapper's maximum {}", batch, max_batch_);
  kv_ = kv;
  const int64_t gqa = params_.num_qo_heads / params_.num_kv_heads;
  const auto kv_lens = host_span(kv.kv_lens_cpu, batch, "kv_lens");
  plan_.plan({}, kv_lens, params_.page_size, params_.num_kv_heads, gqa,
             /*cta_tile_q=*/gqa, 2 * num_sms, params_.fixed_split_size, params_.disable_split_kv);
  kv_hint_ = ops::classify_kv_lengths(kv_lens);  // mixed lengths: the CUDA decode runs stream-K
  kept_.invalidate();
}

void BatchDecodeWrapper::run(const Tensor& query, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out,
                             const AttentionRunArgs& args) const {
  const int64_t batch = kv_.indptr.size(0) - 1;
  check_query(query, params_, "BatchDecodeWrapper");
  KVATTN_CHECK(query.dim() == 3 && query.size(0) == batch,
               "BatchDecodeWrapper.run: query must be [batch={}, heads, head_dim] (one row per request), got {}",
               batch, query.str());
  ops::PagedAttentionArgs a;
  a.query = query;
  a.k_cache = k_cache;
  a.v_cache = v_cache;
  a.qo_indptr = qo_arange_.narrow(0, 0, batch + 1);
  a.paged_kv_indptr = kv_.indptr;
  a.paged_kv_indices = kv_.indices;
  a.paged_kv_last_page_len = kv_.last_page_len;
  a.out = out;
  fill_run_options(a, params_, args);
  a.causal = true;
  a.plan = &kept_;
  a.kv_lengths = kv_hint_;
  a.max_query_len = 1;  // one row per request (qo_arange)
  ops::paged_attention(a);
}

void fast_plan_decode(BatchDecodeWrapper& wrapper, const PagedKVView& kv, const AttentionPlanParams& params,
                      int64_t num_sms) {
  if (!wrapper.is_cuda_graph_enabled() || wrapper.first_call()) {
    wrapper.plan(kv, params, num_sms);
    return;
  }
  wrapper.fast_plan(kv, num_sms);
}

// ---------------------------------------------------------------------------------------
BatchPrefillWrapper::BatchPrefillWrapper(std::string kv_layout, int64_t max_batch, int64_t plan_capacity)
    : kv_layout_(std::move(kv_layout)), max_batch_(max_batch), plan_(max_batch, plan_capacity) {}

void BatchPrefillWrapper::plan(const Tensor& qo_indptr_cpu, const Tensor& qo_indptr, const PagedKVView& kv,
                               const AttentionPlanParams& params, int64_t num_sms) {
  params.validate("BatchPrefillWrapper");
  const int64_t batch = qo_indptr_cpu.size(0) - 1;
  KVATTN_CHECK(batch >= 0 && batch <= max_batch_, "BatchPrefillWrapper: batch {} exceeds the maximum {}", batch,
               max_batch_);
  params_ = params;
  qo_indptr_ = qo_indptr;
  kv_ = kv;
  const auto qo = host_span(qo_indptr_cpu, batch + 1, "qo_indptr");
  const int64_t gqa = params.num_qo_heads / params.num_kv_heads;
  const int64_t avg = batch > 0 ? qo[batch] * gqa / batch : 0;
  plan_.plan(qo, host_span(kv.kv_lens_cpu, batch, "kv_lens"), params.page_size, params.num_kv_heads, gqa,
             prefill_cta_tile_q(avg), 2 * num_sms, params.fixed_split_size, params.disable_split_kv);
  kept_.invalidate();
}

void BatchPrefillWrapper::run(const Tensor& query, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out,
                              const AttentionRunArgs& args) const {
  check_query(query, params_, "BatchPrefillWrapper");
  ops::PagedAttentionArgs a;
  a.query = query;
  a.k_cache = k_cache;
  a.v_cache = v_cache;
  a.qo_indptr = qo_indptr_;
  a.paged_kv_indptr = kv_.indptr;
  a.paged_kv_indices = kv_.indices;
  a.paged_kv_last_page_len = kv_.last_page_len;
  a.out = out;
  fill_run_options(a, params_, args);
  a.plan = &kept_;
  ops::paged_attention(a);
}

// ---------------------------------------------------------------------------------------
BatchRaggedPrefillWrapper::BatchRaggedPrefillWrapper(int64_t max_batch, int64_t max_tokens, int64_t plan_capacity,
                                                     Tensor token_arange, Device device)
    : max_batch_(max_batch), max_tokens_(max_tokens), token_arange_(std::move(token_arange)),
      last_page_len_({max_batch}, DType::i32, device), kv_lens_cpu_(Tensor::zeros({max_batch}, DType::i32)),
      plan_(max_batch, plan_capacity) {}

void BatchRaggedPrefillWrapper::plan(const Tensor& qo_indptr_cpu, const Tensor& qo_indptr,
                                     const AttentionPlanParams& params, int64_t num_sms) {
  params.validate("BatchRaggedPrefillWrapper");
  const int64_t batch = qo_indptr_cpu.size(0) - 1;
  KVATTN_CHECK(batch >= 0 && batch <= max_batch_, "BatchRaggedPrefillWrapper: batch {} exceeds the maximum {}",
               batch, max_batch_);
  const auto qo = host_span(qo_indptr_cpu, batch + 1, "qo_indptr");
  KVATTN_CHECK(qo[batch] <= max_tokens_ && qo[batch] <= token_arange_.size(0),
               "BatchRaggedPrefillWrapper: {} tokens exceed the maximum {}", qo[batch], max_tokens_);
  params_ = params;
  params_.page_size = 1;  // each new token is its own one-token page of key/value
  qo_indptr_ = qo_indptr;
  num_tokens_ = qo[batch];
  int32_t* last = last_page_len_.np<int32_t>();
  int32_t* lens = kv_lens_cpu_.data_ptr<int32_t>();
  for (int64_t r = 0; r < batch; ++r) {
    lens[r] = qo[r + 1] - qo[r];
    last[r] = lens[r] > 0 ? 1 : 0;
  }
  last_page_len_.copy_to_gpu(batch);
  const int64_t gqa = params.num_qo_heads / params.num_kv_heads;
  plan_.plan(qo, {lens, static_cast<size_t>(batch)}, 1, params.num_kv_heads, gqa,
             prefill_cta_tile_q(batch > 0 ? num_tokens_ * gqa / batch : 0), 2 * num_sms, -1, true);
  kept_.invalidate();
}

void BatchRaggedPrefillWrapper::run(const Tensor& query, const Tensor& key, const Tensor& value, const Tensor& out,
                                    const AttentionRunArgs& args) const {
  KVATTN_CHECK(key.dim() == 3 && value.dim() == 3 && key.size(0) >= num_tokens_ && value.size(0) >= num_tokens_,
               "BatchRaggedPrefillWrapper.run: key/value must be [>= {} tokens, kv_heads, head_dim], got {} / {}",
               num_tokens_, key.str(), value.str());
  const int64_t batch = qo_indptr_.size(0) - 1;
  check_query(query, params_, "BatchRaggedPrefillWrapper");
  ops::PagedAttentionArgs a;
  a.query = query;
  a.k_cache = key.unsqueeze(1);  // [T, 1, kv_heads, D]: one-token pages
  a.v_cache = value.unsqueeze(1);
  a.qo_indptr = qo_indptr_;
  a.paged_kv_indptr = qo_indptr_;
  a.paged_kv_indices = token_arange_.narrow(0, 0, std::max<int64_t>(num_tokens_, 1));
  a.paged_kv_last_page_len = last_page_len_.gpu_rows(batch);
  a.out = out;
  fill_run_options(a, params_, args);
  a.causal = true;
  a.k_scale = 1.0;  // the new tokens are unquantised
  a.v_scale = 1.0;
  a.plan = &kept_;
  ops::paged_attention(a);
}

// ---------------------------------------------------------------------------------------
CascadeWrapper::CascadeWrapper(std::string kv_layout) : kv_layout_(std::move(kv_layout)) {}

void CascadeWrapper::plan(const Tensor& qo_indptr, const Tensor& shared_kv_page_indices, const PagedKVView& kv,
                          const AttentionPlanParams& params) {
  params.validate("CascadeWrapper");
  KVATTN_CHECK(params.window_left == -1, "CascadeWrapper.plan: cascade attention has no sliding window (got "
               "window_left={}); vLLM never picks cascade with a window", params.window_left);
  params_ = params;
  qo_indptr_ = qo_indptr;
  shared_ = shared_kv_page_indices;
  kv_ = kv;
}

void CascadeWrapper::run(const Tensor& query, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out,
                         const AttentionRunArgs& args) const {
  KVATTN_CHECK(!args.sinks.defined(), "CascadeWrapper.run: attention sinks are not supported by cascade attention");
  check_query(query, params_, "CascadeWrapper");
  ops::CascadeAttentionArgs a;
  a.query = query;
  a.k_cache = k_cache;
  a.v_cache = v_cache;
  a.qo_indptr = qo_indptr_;
  a.shared_kv_page_indices = shared_;
  a.paged_kv_indptr = kv_.indptr;
  a.paged_kv_indices = kv_.indices;
  a.paged_kv_last_page_len = kv_.last_page_len;
  a.out = out;
  a.options() = run_options(params_, args);
  a.causal = true;  // each request's own pages; the shared prefix is seen by every row
  a.k_scale = args.k_scale;
  a.v_scale = args.v_scale;
  ops::cascade_attention(a);
}

// ---------------------------------------------------------------------------------------
BatchDCPPrefillWrapper::BatchDCPPrefillWrapper(std::string kv_layout, bool dcp_a2a, int64_t max_batch,
                                               int64_t max_tokens, int64_t plan_capacity, Tensor token_arange,
                                               Device device)
    : dcp_a2a_(dcp_a2a), context_(std::move(kv_layout), max_batch, plan_capacity),
      new_tokens_(max_batch, max_tokens, plan_capacity, std::move(token_arange), device) {}

void BatchDCPPrefillWrapper::plan(const Tensor& qo_indptr_cpu, const Tensor& qo_indptr, const PagedKVView& kv,
                                  const AttentionPlanParams& params, int64_t dcp_world_size, int64_t num_sms) {
  KVATTN_CHECK(dcp_world_size >= 1, "BatchDCPPrefillWrapper.plan: dcp_world_size must be >= 1, got {}",
               dcp_world_size);
  dcp_world_size_ = dcp_world_size;
  AttentionPlanParams ctx = params;
  ctx.num_qo_heads = params.num_qo_heads * dcp_world_size;
  ctx.causal = false;  // the context run: every query row sees all (earlier) context keys
  context_.plan(qo_indptr_cpu, qo_indptr, kv, ctx, num_sms);
  AttentionPlanParams fresh = params;
  fresh.causal = true;  // the new-tokens run: this rank's heads over the KV heads they read
  const int64_t g = ctx.num_qo_heads / params.num_kv_heads;
  fresh.num_kv_heads = params.num_qo_heads % g == 0 ? params.num_qo_heads / g : 1;
  new_tokens_.plan(qo_indptr_cpu, qo_indptr, fresh, num_sms);
}

void BatchDCPPrefillWrapper::run(DcpCommunicator& group, const Tensor& prefill_query, const Tensor& k_cache,
                                 const Tensor& v_cache, const Tensor& key, const Tensor& value, const Tensor& out,
                                 const AttentionRunArgs& args) const {
  KVATTN_CHECK(group.world_size() == dcp_world_size_,
               "BatchDCPPrefillWrapper.run: planned for {} DCP ranks but the group has {}", dcp_world_size_,
               group.world_size());
  KVATTN_CHECK(!args.sinks.defined(), "BatchDCPPrefillWrapper does not support attention sinks");
  const int64_t T = prefill_query.size(0), H = prefill_query.size(1), D = prefill_query.size(2);
  // Context: all-gathered query over this rank's context shard.  FlashInfer returns a base-2
  // LSE that vLLM converts after the combine; asking the kernel for natural-log LSE and
  // combining in base e gives the same weights and the LSE merge_attn_states takes.
  Tensor q_all = group.all_gather(prefill_query, 1);  // [T, W*H, D]
  Tensor out_ctx_tmp = Tensor::empty({T, H * dcp_world_size_, D}, DType::f32, prefill_query.device());
  Tensor lse_ctx_tmp = Tensor::empty({T, H * dcp_world_size_}, DType::f32, prefill_query.device());
  AttentionRunArgs ctx_args = args;
  ctx_args.lse = lse_ctx_tmp;
  ctx_args.lse_base = ops::LseBase::E;
  context_.run(q_all, k_cache, v_cache, out_ctx_tmp, ctx_args);
  Tensor lse_ctx;  // [T, H]
  Tensor out_ctx = dcp_a2a_ ? dcp_a2a_lse_reduce(out_ctx_tmp, lse_ctx_tmp, group, true, &lse_ctx)
                            : cp_lse_ag_out_rs(out_ctx_tmp, lse_ctx_tmp, group, true, &lse_ctx);
  // New tokens: causal over this step's own K/V, this rank's heads, natural-log LSE.
  Tensor out_new = Tensor::empty({T, H, D}, DType::f32, prefill_query.device());
  Tensor lse_new = Tensor::empty({T, H}, DType::f32, prefill_query.device());
  AttentionRunArgs new_args = args;
  new_args.lse = lse_new;
  new_args.lse_base = ops::LseBase::E;
  // The KV heads are replicated over the group and the W*H gathered query heads map to them
  // (GQA group g = W*H / kv_heads); this rank's heads [rank*H, (rank+1)*H) read KV heads
  // [rank*H/g, ((rank+1)*H-1)/g]: narrow key/value to them so the local GQA mapping is exact.
  const int64_t kv_heads = key.size(1), g = H * dcp_world_size_ / kv_heads;
  const int64_t first = group.rank() * H / g, last = ((group.rank() + 1) * H - 1) / g;
  if (!(H % g == 0 || g % H == 0))
    throw Unsupported(fmt::format("DCP prefill: {} local query heads per rank and a GQA group of {} do not nest "
                                  "(one must divide the other)", H, g));
  new_tokens_.run(prefill_query, key.narrow(1, first, last - first + 1), value.narrow(1, first, last - first + 1),
                  out_new, new_args);
  ops::merge_attn_states(out, out_ctx, lse_ctx.transpose(0, 1), out_new, lse_new.transpose(0, 1));
}

}  // namespace kvattn
