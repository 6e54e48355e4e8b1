// Compositions of paged_attention + merge_attn_states (kvattn/ops/cascade.h).  Device-neutral:
// temporaries live on the query's device; small index tensors are built on the host and copied.
#include "kvattn/ops/cascade.h"

#include <cmath>
#include <vector>

#include "kvattn/ops/merge_attn_states.h"
#include "kvattn/ops/paged_attention.h"
#include "ops/common.h"

namespace kvattn::ops {
namespace {

Tensor host_i32(const std::vector<int32_t>& v, Device dev) {
  Tensor t = Tensor::from_vector(v.empty() ? std::vector<int32_t>{0} : v);
  if (v.empty()) t = t.slice(0, 0, 0);
  return dev.is_cpu() ? t : t.to(dev);
}

Tensor filled_f32(const Dims& shape, float value, Device dev) {
  Tensor t = Tensor::empty(shape, DType::f32);
  t.fill_(value);
  return dev.is_cpu() ? t : t.to(dev);
}

std::vector<int64_t> host_indices(const Tensor& t) {
  const Tensor c = t.device().is_cpu() ? t : t.to(Device::cpu());
  const detail::IndexView v(c);
  std::vector<int64_t> out(static_cast<size_t>(c.size(0)));
  for (int64_t i = 0; i < c.size(0); ++i) out[i] = v[i];
  return out;
}

}  // namespace

void cascade_attention(const CascadeAttentionArgs& a) {
  static constexpr const char* op = "cascade_attention";
  detail::check_dim(a.query, 3, op, "query", "[num_tokens, num_qo_heads, head_dim]");
  detail::check_dim(a.shared_kv_page_indices, 1, op, "shared_kv_page_indices", "[num_shared_pages]");
  detail::check_dim(a.k_cache, 4, op, "k_cache", "[num_pages, page_size, num_kv_heads, head_dim]");
  KVATTN_CHECK(a.window_left == -1,
               "{}: window_left = {}, but cascade attention has no sliding window (vLLM never chooses cascade "
               "with one); pass window_left = -1 or use paged_attention", op, a.window_left);
  KVATTN_CHECK(!a.sinks.defined(),
               "{}: sinks are not supported (the merge of the two levels would count them twice); use "
               "paged_attention", op);
  const Device dev = a.query.device();
  const int64_t T = a.query.size(0), H = a.query.size(1), D = a.query.size(2);
  const int64_t ncb = a.shared_kv_page_indices.size(0), page_size = a.k_cache.size(1);

  // Level 1: every query row against the shared prefix, non-causal (the prefix precedes all).
  const Tensor prefix_out = Tensor::empty({T, H, D}, DType::f32, dev);
  const Tensor prefix_lse = filled_f32({H, T}, -INFINITY, dev);
  PagedAttentionArgs shared;
  shared.options() = a.options();
  shared.causal = false;
  shared.query = a.query;
  shared.k_cache = a.k_cache;
  shared.v_cache = a.v_cache;
  shared.k_scale = a.k_scale;
  shared.v_scale = a.v_scale;
  shared.qo_indptr = host_i32({0, static_cast<int32_t>(T)}, dev);
  shared.paged_kv_indptr = host_i32({0, static_cast<int32_t>(ncb)}, dev);
  shared.paged_kv_indices = a.shared_kv_page_indices;
  shared.paged_kv_last_page_len = host_i32({static_cast<int32_t>(ncb > 0 ? page_size : 0)}, dev);
  shared.out = prefix_out;
  shared.lse = prefix_lse.transpose(0, 1);
  shared.lse_base = LseBase::E;
  paged_attention(shared);

  // Level 2: each request against its own pages (causal unless the options say otherwise).
  const Tensor suffix_out = Tensor::zeros({T, H, D}, DType::f32, dev);
  const Tensor suffix_lse = filled_f32({H, T}, -INFINITY, dev);
  PagedAttentionArgs unique;
  unique.paged_kv() = a.paged_kv();
  unique.options() = a.options();
  unique.query = a.query;
  unique.qo_indptr = a.qo_indptr;
  unique.out = suffix_out;
  unique.lse = suffix_lse.transpose(0, 1);
  unique.lse_base = LseBase::E;
  paged_attention(unique);

  merge_attn_states(a.out, prefix_out, prefix_lse, suffix_out, suffix_lse);
}

void dcp_prefill_attention(const DcpPrefillArgs& a) {
  static constexpr const char* op = "dcp_prefill_attention";
  detail::check_dim(a.query, 3, op, "query", "[num_tokens, num_qo_heads, head_dim]");
  detail::check_dim(a.key, 3, op, "key", "[num_tokens, num_kv_heads, head_dim]");
  detail::check_dim(a.value, 3, op, "value", "[num_tokens, num_kv_heads, head_dim]");
  detail::check_dim(a.qo_indptr, 1, op, "qo_indptr", "[batch + 1]");
  detail::check_index_dtype(a.qo_indptr, op, "qo_indptr");
  KVATTN_CHECK(a.key.dtype() == a.query.dtype() && a.value.dtype() == a.query.dtype(),
               "{}: key/value dtypes ({}, {}) must equal the query's {}", op, dtype_name(a.key.dtype()),
               dtype_name(a.value.dtype()), dtype_name(a.query.dtype()));
  KVATTN_CHECK(a.key.shape() == a.value.shape() && a.key.size(0) == a.query.size(0),
               "{}: key {} and value {} must be [num_tokens = {}, num_kv_heads, head_dim]", op, a.key.shape().str(),
               a.value.shape().str(), a.query.size(0));
  KVATTN_CHECK(!a.sinks.defined(),
               "{}: sinks are not supported (the merge of the two passes would count them twice); use "
               "paged_attention", op);
  const Device dev = a.query.device();
  const int64_t T = a.query.size(0), H = a.query.size(1), D = a.query.size(2);

  // Context pass: the new tokens against the cached context only (it all precedes them).
  const Tensor ctx_out = Tensor::zeros({T, H, D}, DType::f32, dev);
  const Tensor ctx_lse = filled_f32({H, T}, -INFINITY, dev);
  PagedAttentionArgs ctx;
  ctx.paged_kv() = a.paged_kv();
  ctx.options() = a.options();
  ctx.causal = false;
  ctx.query = a.query;
  ctx.qo_indptr = a.qo_indptr;
  ctx.out = ctx_out;
  ctx.lse = ctx_lse.transpose(0, 1);
  ctx.lse_base = LseBase::E;
  paged_attention(ctx);

  // New-token pass: over the ragged K/V, seen as pages of one token (page t = token t); they are
  // not quantised, so the cache's scales stay out.
  const std::vector<int64_t> qo = host_indices(a.qo_indptr);
  std::vector<int32_t> indices(static_cast<size_t>(T)), last(qo.size() > 0 ? qo.size() - 1 : 0);
  for (int64_t t = 0; t < T; ++t) indices[t] = static_cast<int32_t>(t);
  for (size_t r = 0; r + 1 < qo.size(); ++r) last[r] = qo[r + 1] > qo[r] ? 1 : 0;
  std::vector<int32_t> qo32(qo.begin(), qo.end());
  const Tensor new_out = Tensor::zeros({T, H, D}, DType::f32, dev);
  const Tensor new_lse = filled_f32({H, T}, -INFINITY, dev);
  PagedAttentionArgs nt;
  nt.options() = a.options();
  nt.query = a.query;
  nt.k_cache = a.key.unsqueeze(1);  // [T, 1, Hkv, D]
  nt.v_cache = a.value.unsqueeze(1);
  nt.qo_indptr = a.qo_indptr;
  nt.paged_kv_indptr = host_i32(qo32, dev);
  nt.paged_kv_indices = host_i32(indices, dev);
  nt.paged_kv_last_page_len = host_i32(last, dev);
  nt.out = new_out;
  nt.lse = new_lse.transpose(0, 1);
  nt.lse_base = LseBase::E;
  paged_attention(nt);

  merge_attn_states(a.out, ctx_out, ctx_lse, new_out, new_lse);
}

}  // namespace kvattn::ops
