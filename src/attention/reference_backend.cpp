// src/attention/reference_backend.cpp — the dense oracle and the REFERENCE backend.
#include "kvattn/attention/reference_backend.h"

#include <cmath>
#include <limits>
#include <vector>

#include "kvattn/core/error.h"
#include "kvattn/ops/paged_attention.h"
#include "kvattn/ops/reshape_and_cache.h"

namespace kvattn {

Tensor dense_attention_reference(const DenseAttentionArgs& a) {
  KVATTN_CHECK(a.query.dim() == 3 && a.key.dim() == 3 && a.value.dim() == 3,
               "dense_attention_reference: query [q, Hq, D], key/value [kv, Hkv, D] expected, got {} {} {}",
               a.query.str(), a.key.str(), a.value.str());
  const int64_t q_len = a.query.size(0), hq = a.query.size(1), d = a.query.size(2);
  const int64_t kv_len = a.key.size(0), hkv = a.key.size(1);
  KVATTN_CHECK(a.value.size(0) == kv_len && a.value.size(1) == hkv && a.key.size(2) == d && a.value.size(2) == d &&
                   hkv > 0 && hq % hkv == 0 && q_len <= kv_len,
               "dense_attention_reference: inconsistent shapes {} {} {}", a.query.str(), a.key.str(), a.value.str());
  const std::vector<double> q = a.query.contiguous().to_double_vector();
  const std::vector<double> k = a.key.contiguous().to_double_vector();
  const std::vector<double> v = a.value.contiguous().to_double_vector();
  std::vector<double> sinks;
  if (a.sinks.defined()) sinks = a.sinks.contiguous().to_double_vector();
  Tensor out = Tensor::zeros({q_len, hq, d}, DType::f32);
  float* o = out.data_ptr<float>();
  const int64_t group = hq / hkv;
  std::vector<double> s(static_cast<size_t>(kv_len));
  for (int64_t i = 0; i < q_len; ++i) {
    const int64_t pos = kv_len - q_len + i;
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t kh = h / group;
      double m = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < kv_len; ++j) {
        const bool visible = (!a.causal || j <= pos) && (a.window_left < 0 || j >= pos - a.window_left);
        if (!visible) {
          s[j] = -std::numeric_limits<double>::infinity();
          continue;
        }
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += q[(i * hq + h) * d + c] * k[(j * hkv + kh) * d + c];
        double x = dot * a.sm_scale;
        if (a.logits_soft_cap > 0) x = a.logits_soft_cap * std::tanh(x / a.logits_soft_cap);
        s[j] = x;
        m = std::max(m, x);
      }
      if (!sinks.empty()) m = std::max(m, sinks[h]);
      if (m == -std::numeric_limits<double>::infinity()) continue;
      double denom = sinks.empty() ? 0.0 : std::exp(sinks[h] - m);
      for (int64_t j = 0; j < kv_len; ++j)
        if (s[j] != -std::numeric_limits<double>::infinity()) denom += std::exp(s[j] - m);
      for (int64_t c = 0; c < d; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < kv_len; ++j)
          if (s[j] != -std::numeric_limits<double>::infinity()) acc += std::exp(s[j] - m) * v[(j * hkv + kh) * d + c];
        o[(i * hq + h) * d + c] = static_cast<float>(denom > 0 ? acc / denom : 0.0);
      }
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------
std::unique_ptr<AttentionMetadataBuilder> ReferenceBackend::make_builder(std::shared_ptr<const AttentionSpec> spec,
                                                                         std::vector<std::string> layer_names,
                                                                         const BackendConfig& config) const {
  return std::make_unique<ReferenceMetadataBuilder>(std::move(spec), std::move(layer_names), config);
}

std::shared_ptr<AttentionImpl> ReferenceBackend::make_impl(const AttentionImplParams& params,
                                                           const BackendConfig&) const {
  return std::make_shared<ReferenceImpl>(params);
}

ReferenceMetadataBuilder::ReferenceMetadataBuilder(std::shared_ptr<const AttentionSpec> spec,
                                                   std::vector<std::string> layer_names, const BackendConfig& config)
    : AttentionMetadataBuilder(std::move(spec), std::move(layer_names), config) {
  init_reorder_batch_threshold(1);
}

const ReferenceMetadata& ReferenceMetadataBuilder::build(int64_t common_prefix_len, const CommonAttentionMetadata& cm,
                                                         bool) {
  if (common_prefix_len > 0) throw Unsupported("REFERENCE backend: cascade attention (common_prefix_len > 0) is not supported");
  KVATTN_CHECK(cm.query_start_loc_cpu.device().is_cpu() && cm.seq_lens.device().is_cpu() &&
                   cm.block_table_tensor.device().is_cpu(),
               "REFERENCE backend: metadata must live on the CPU");
  metadata_.num_reqs = cm.num_reqs;
  metadata_.num_actual_tokens = cm.num_actual_tokens;
  metadata_.causal = cm.causal;
  metadata_.query_start_loc_cpu = cm.query_start_loc_cpu.narrow(0, 0, cm.num_reqs + 1);
  metadata_.seq_lens_cpu = cm.seq_lens.narrow(0, 0, cm.num_reqs);
  metadata_.block_table = cm.block_table_tensor;
  metadata_.slot_mapping = cm.slot_mapping;
  return metadata_;
}

ReferenceImpl::ReferenceImpl(const AttentionImplParams& params) : p_(params) {
  KVATTN_CHECK(p_.num_heads > 0 && p_.num_kv_heads > 0 && p_.num_heads % p_.num_kv_heads == 0 && p_.head_size > 0,
               "ReferenceImpl: bad head geometry ({} heads, {} kv heads, head size {})", p_.num_heads, p_.num_kv_heads,
               p_.head_size);
  if (p_.alibi_slopes) throw Unsupported("REFERENCE backend: ALiBi is not supported");
}

void ReferenceImpl::do_kv_cache_update(const AttentionLayer& layer, const Tensor& key, const Tensor& value,
                                       const Tensor& kv_cache, const Tensor& slot_mapping) {
  if (p_.kv_sharing_target_layer_name) return;
  Tensor kv = kv_cache.dtype() == DType::u8 && is_fp8(p_.kv_cache_dtype)
                  ? kv_cache.view_as(kv_cache_storage_dtype(p_.kv_cache_dtype, DType::u8))
                  : kv_cache;
  auto [k, v] = ops::split_kv_cache_layer_view(kv, p_.head_size);
  ops::reshape_and_cache_flash(key, value, k, v, slot_mapping, p_.kv_cache_dtype, layer.k_scale, layer.v_scale);
}

Tensor ReferenceImpl::forward(const AttentionLayer& layer, const Tensor& query, const Tensor&, const Tensor&,
                              const Tensor& kv_cache, const AttentionMetadata* metadata, const Tensor& output,
                              const Tensor& output_scale, const Tensor&) {
  if (metadata == nullptr) {
    Tensor(output).fill_(0);
    return output;
  }
  KVATTN_CHECK(std::string_view(metadata->backend_name()) == "REFERENCE",
               "ReferenceImpl.forward: metadata built by backend {}", metadata->backend_name());
  if (output_scale.defined()) throw Unsupported("REFERENCE backend: output quantisation is not supported");
  const auto& md = static_cast<const ReferenceMetadata&>(*metadata);
  Tensor kv = kv_cache.dtype() == DType::u8 && is_fp8(p_.kv_cache_dtype)
                  ? kv_cache.view_as(kv_cache_storage_dtype(p_.kv_cache_dtype, DType::u8))
                  : kv_cache;
  auto [kc, vc] = ops::split_kv_cache_layer_view(kv, p_.head_size);  // [B, N, H, D]
  const bool fp8 = dtype_is_fp8(kc.dtype());
  const double ks = fp8 ? layer.k_scale_float : 1.0, vs = fp8 ? layer.v_scale_float : 1.0;
  const int64_t page = kc.size(1), hkv = kc.size(2), d = kc.size(3);
  const auto qsl = md.query_start_loc_cpu.to_vector<int32_t>();
  const auto seq = md.seq_lens_cpu.to_vector<int32_t>();
  for (int64_t r = 0; r < md.num_reqs; ++r) {
    const int64_t q_len = qsl[r + 1] - qsl[r], kv_len = seq[r];
    if (q_len == 0) continue;
    KVATTN_CHECK(kv_len >= q_len && (kv_len + page - 1) / page <= md.block_table.size(1),
                 "ReferenceImpl: request {} has seq_len {} for {} query tokens and {} block-table columns", r, kv_len,
                 q_len, md.block_table.size(1));
    Tensor keys = Tensor::empty({kv_len, hkv, d}, DType::f32);
    Tensor vals = Tensor::empty({kv_len, hkv, d}, DType::f32);
    for (int64_t j = 0; j < kv_len; ++j) {
      const int64_t blk = static_cast<int64_t>(md.block_table.get({r, j / page}));
      KVATTN_CHECK(blk >= 0 && blk < kc.size(0), "ReferenceImpl: block id {} out of range [0, {})", blk, kc.size(0));
      for (int64_t h = 0; h < hkv; ++h)
        for (int64_t c = 0; c < d; ++c) {
          keys.set({j, h, c}, kc.get({blk, j % page, h, c}) * ks);
          vals.set({j, h, c}, vc.get({blk, j % page, h, c}) * vs);
        }
    }
    DenseAttentionArgs a;
    a.query = query.narrow(0, qsl[r], q_len);
    a.key = keys;
    a.value = vals;
    a.sm_scale = p_.scale;
    a.causal = md.causal;
    a.window_left = window_left();
    a.logits_soft_cap = p_.logits_soft_cap.value_or(0.0);
    a.sinks = p_.sinks;
    output.narrow(0, qsl[r], q_len).copy_from(dense_attention_reference(a));
  }
  return output;
}

}  // namespace kvattn
