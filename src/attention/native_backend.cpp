// src/attention/native_backend.cpp — FlashInferBackend traits and FlashInferImpl (KV-cache
// update + forward) of the native backend.
#include "kvattn/attention/native_backend.h"

#include <fmt/format.h>

#include <cmath>

#include "kvattn/attention/communicator.h"
#include "kvattn/core/error.h"
#include "kvattn/ops/dcp_combine.h"
#include "kvattn/ops/page_utils.h"
#include "kvattn/ops/reshape_and_cache.h"

namespace kvattn {

const char* decode_kernel_name(FlashInferDecodeKernel k) noexcept {
  return k == FlashInferDecodeKernel::XQA ? "xqa" : "trtllm-gen";
}

// ---------------------------------------------------------------------------------------
// Traits.
std::vector<KVCacheDType> FlashInferBackend::supported_kv_cache_dtypes() const {
  // The seed also lists nvfp4 / nvfp4_4over6 (SM100 trtllm-gen only); kvattn has no NVFP4 kernel.
  return {KVCacheDType::Auto, KVCacheDType::Float16, KVCacheDType::BFloat16,
          KVCacheDType::Fp8,  KVCacheDType::Fp8E4M3, KVCacheDType::Fp8E5M2};
}

bool FlashInferBackend::supports_kv_cache_dtype(KVCacheDType kv_cache_dtype, const BackendConfig& config) const {
  if (is_nvfp4(kv_cache_dtype)) {
    // Seed: SM100 family with trtllm prefill and decode.  kvattn routes those paths to its own
    // kernels, which have no NVFP4 format: never supported.
    return false;
  }
  return AttentionBackend::supports_kv_cache_dtype(kv_cache_dtype, config);
}

std::vector<KernelBlockSize> FlashInferBackend::get_supported_kernel_block_sizes(const KVCacheSpec*,
                                                                                 const BackendConfig& config) const {
  // Page sizes >= 128 only run on the trtllm-gen path (GQA on SM100): advertised only there.
  const int64_t q = config.num_attention_heads, kv = config.num_kv_heads;
  const bool use_large_pages = kv > 0 && q / kv > 1 && config.platform.is_device_capability_family(100) &&
                               can_use_trtllm_attention(config, q, kv);
  if (!use_large_pages) return {int64_t{16}, int64_t{32}, int64_t{64}};
  return {int64_t{16}, int64_t{32}, int64_t{64}, int64_t{128}, int64_t{256}, int64_t{512}, int64_t{1024}};
}

std::shared_ptr<const AttentionSpec> FlashInferBackend::customize_spec(const std::shared_ptr<const AttentionSpec>& spec,
                                                                       const BackendConfig&) const {
  // NVFP4 stores K and V as separate per-head slots of packed fp4 data plus fp8 block scales.
  if (!spec || spec->state_content_bytes() || !is_nvfp4(spec->kv_quant_mode())) return spec;
  auto full_dim = [](int64_t h) { return h / 2 + h / 16; };
  KVATTN_CHECK(full_dim(spec->head_size()) == full_dim(spec->head_size_v()),
               "nvfp4 with asymmetric K/V head sizes ({} vs {}) is not supported", spec->head_size(),
               spec->head_size_v());
  AttentionSpecOptions o = spec->options();
  o.num_head_slots = 2 * spec->num_kv_heads();
  o.state_content_bytes = full_dim(spec->head_size()) * dtype_size(spec->dtype());
  return spec->with_options(o);
}

std::optional<LayoutList> FlashInferBackend::supported_kv_cache_layouts(const BackendConfig& config) const {
  const auto& cap = config.platform.capability;
  // trtllm-gen consumes head-major block interiors; the L/B nesting outside is immaterial.
  if (cap && cap->major == 10) return LayoutList{KVCacheLayout::LBHNC, KVCacheLayout::BLHNC};
  return std::nullopt;  // kvattn's kernels read any layout through strides
}

bool FlashInferBackend::supports_compute_capability(const std::optional<DeviceCapability>& cap) const {
  if (!cap) return true;  // CPU: kvattn's CPU kernels
  return *cap >= DeviceCapability{8, 0} && *cap <= DeviceCapability{12, 1};
}

bool FlashInferBackend::supports_sink(const BackendConfig&) const {
  // The seed gates sinks on XQA / trtllm-gen because FlashInfer's own wrappers lack them;
  // kvattn's paged_attention takes sinks on every path (cascade and DCP still reject them).
  return true;
}

bool FlashInferBackend::supports_device_cpu_query_lens_mismatch(const BackendConfig& config) const {
  // Only trtllm-gen decode (SM100 family) reads query offsets from the device tensor.
  if (!config.platform.is_device_capability_family(100)) return false;
  if (config.num_attention_heads <= 0) return true;
  return config.decode_context_parallel_size == 1 &&
         can_use_trtllm_attention(config, config.num_attention_heads, config.num_kv_heads, false);
}

AttentionCGSupport FlashInferBackend::get_cudagraph_support(const BackendConfig& config,
                                                            const KVCacheSpecPtr& kv_cache_spec) const {
  // XQA lacks LSE for DCP; DCP also cannot graph variable-length trtllm-gen.
  if (config.decode_context_parallel_size > 1) return AttentionCGSupport::UNIFORM_SINGLE_TOKEN_DECODE;
  const auto specs = kv_cache_spec ? iter_layer_specs(kv_cache_spec) : std::vector<KVCacheSpecPtr>{};
  const auto& p = config.platform;
  const bool is_xqa_arch = p.is_device_capability(90) || p.is_device_capability_family(120);
  bool has_uniform_batch_support = !specs.empty();
  for (const auto& s : specs) {
    const AttentionSpec* a = as_attention_spec(s);
    if (!a) continue;  // only attention specs matter here
    const bool xqa_head_ok = a->head_size() >= 16 && a->head_size() <= 256 && a->head_size() % 16 == 0;
    if (!can_use_trtllm_attention(config, config.num_attention_heads, a->num_kv_heads(), false) ||
        (is_xqa_arch && !xqa_head_ok)) {
      has_uniform_batch_support = false;
      break;
    }
  }
  if (has_uniform_batch_support && (!config.attention_config.use_non_causal || is_xqa_arch))
    return AttentionCGSupport::UNIFORM_BATCH;
  return AttentionCGSupport::UNIFORM_SINGLE_TOKEN_DECODE;
}

std::optional<int64_t> FlashInferBackend::get_varlen_cudagraph_max_query_len(const BackendConfig& config,
                                                                              const KVCacheSpecPtr& kv_cache_spec) const {
  if (get_cudagraph_support(config, kv_cache_spec) != AttentionCGSupport::UNIFORM_BATCH) return std::nullopt;
  if (!FlashInferMetadataBuilder::uses_trtllm_gen_varlen_decode(
          config, FlashInferMetadataBuilder::get_flashinfer_trtllm_api_decode_kernel(config),
          config.decode_context_parallel_size > 1))
    return std::nullopt;
  return max_decode_query_len(config);  // longer requests are split off as prefills
}

std::unique_ptr<AttentionMetadataBuilder> FlashInferBackend::make_builder(std::shared_ptr<const AttentionSpec> spec,
                                                                          std::vector<std::string> layer_names,
                                                                          const BackendConfig& config) const {
  return std::make_unique<FlashInferMetadataBuilder>(std::move(spec), std::move(layer_names), config);
}

std::shared_ptr<AttentionImpl> FlashInferBackend::make_impl(const AttentionImplParams& params,
                                                            const BackendConfig& config) const {
  return std::make_shared<FlashInferImpl>(params, config);
}

DType FlashInferBackend::get_dtype_for_flashinfer(KVCacheDType kv_cache_dtype) {
  if (is_quantized(kv_cache_dtype)) return kv_cache_storage_dtype(kv_cache_dtype, DType::u8);
  throw InvalidArgument(fmt::format("Unrecognized dtype: {} (expected fp8, fp8_e4m3, fp8_e5m2 or nvfp4)",
                                    kv_cache_dtype_name(kv_cache_dtype)));
}

// ---------------------------------------------------------------------------------------
// Impl.
namespace {

Tensor to_f32(const Tensor& t) { return t.dtype() == DType::f32 ? t : t.to(DType::f32); }

// fp8 queries are widened (exactly) for ops::paged_attention, which takes f32/f16/bf16 queries;
// on the query's own device (ops::copy_).
Tensor kernel_query(const Tensor& q) {
  if (!dtype_is_fp8(q.dtype())) return q;
  Tensor f = Tensor::empty(q.shape(), DType::f32, q.device());
  ops::copy_(f, q);
  return f;
}

}  // namespace

FlashInferImpl::FlashInferImpl(const AttentionImplParams& p, const BackendConfig& config)
    : num_heads_(p.num_heads), head_size_(p.head_size), num_kv_heads_(p.num_kv_heads), scale_(p.scale),
      logits_soft_cap_(p.logits_soft_cap), cache_dtype_(p.kv_cache_dtype),
      kv_sharing_target_layer_name_(p.kv_sharing_target_layer_name) {
  KVATTN_CHECK(num_heads_ > 0 && num_kv_heads_ > 0 && num_heads_ % num_kv_heads_ == 0,
               "FlashInferImpl: num_heads ({}) must be a positive multiple of num_kv_heads ({})", num_heads_,
               num_kv_heads_);
  KVATTN_CHECK(head_size_ > 0 && scale_ > 0, "FlashInferImpl: head_size ({}) and scale ({}) must be positive",
               head_size_, scale_);
  if (p.alibi_slopes) throw Unsupported("FlashInferImpl: ALiBi slopes are not supported by the FlashInfer backend");
  if (p.sliding_window) {
    KVATTN_CHECK(*p.sliding_window >= 1, "FlashInferImpl: sliding_window must be >= 1, got {}", *p.sliding_window);
    window_left_ = *p.sliding_window - 1;
  }
  is_kvcache_nvfp4_ = is_nvfp4(cache_dtype_);
  if (p.attn_type != AttentionType::DECODER)
    throw Unsupported("Encoder self-attention and encoder/decoder cross-attention are not implemented for "
                      "FlashInferImpl");
  if (p.sinks.defined()) {
    KVATTN_CHECK(p.sinks.dim() == 1 && p.sinks.size(0) == num_heads_,
                 "Sinks must have the same number of heads as the number of heads in the layer. Expected {}, but "
                 "got {}.",
                 num_heads_, p.sinks.dim() == 1 ? p.sinks.size(0) : -1);
    sinks_source_ = p.sinks;
    sinks_ = to_f32(p.sinks);
  }
  // Query pre-quantisation needs one dtype for the whole query: SM100 trtllm-gen only.
  supports_quant_query_input_ = can_use_trtllm_attention(config, num_heads_, num_kv_heads_, false) &&
                                is_quantized(cache_dtype_) &&
                                config.platform.is_device_capability_family(100) &&
                                !config.attention_config.disable_flashinfer_q_quantization;
  dcp_a2a_ = config.decode_context_parallel_size > 1 && config.dcp_comm_backend == "a2a";
}

void FlashInferImpl::process_weights_after_loading(DType) {
  if (!sinks_source_.defined()) return;
  sinks_ = to_f32(sinks_source_);  // FlashInfer-style kernels take f32 sinks
}

Tensor FlashInferImpl::maybe_quant_query(const Tensor& query, DType q_data_type, double q_scale) const {
  if (query.dtype() == q_data_type) return query;
  KVATTN_CHECK(dtype_is_fp8(q_data_type) && !dtype_is_fp8(query.dtype()) && query.dim() == 3,
               "maybe_quant_query: can only quantise a [T, H, D] f32/f16/bf16 query to fp8, got {} -> {}", query.str(),
               dtype_name(q_data_type));
  KVATTN_CHECK(q_scale > 0, "maybe_quant_query: q_scale must be positive, got {}", q_scale);
  // x * (1 / q_scale) in f32, then the saturating fp8 rounding; on the query's own device.
  Tensor out = Tensor::empty(query.shape(), q_data_type, query.device());
  ops::scaled_copy_(out, query, static_cast<float>(1.0 / q_scale));
  return out;
}

std::pair<Tensor, Tensor> FlashInferImpl::split_kv(const Tensor& kv_cache) const {
  KVATTN_CHECK(kv_cache.dim() == 4 && kv_cache.size(1) == num_kv_heads_ && kv_cache.size(3) == 2 * head_size_,
               "FlashInferImpl: kv_cache must be the layer's [B, H={}, N, 2*head_size={}] view, got {}", num_kv_heads_,
               2 * head_size_, kv_cache.str());
  Tensor kv = kv_cache;
  if (kv.dtype() == DType::u8) {
    // fp8 caches may be stored as bytes: view them with their logical dtype.
    KVATTN_CHECK(is_fp8(cache_dtype_), "FlashInferImpl: a uint8 KV cache needs an fp8 kv_cache_dtype, got '{}'",
                 kv_cache_dtype_name(cache_dtype_));
    kv = kv.view_as(FlashInferBackend::get_dtype_for_flashinfer(cache_dtype_));
  }
  return ops::split_kv_cache_layer_view(kv, head_size_);
}

ops::AttentionOptions FlashInferImpl::layer_options(bool causal, double q_scale) const {
  ops::AttentionOptions o;
  o.causal = causal;
  o.window_left = window_left_;
  o.logits_soft_cap = logits_soft_cap_.value_or(0.0);
  o.sm_scale = scale_;
  o.q_scale = q_scale;
  o.sinks = sinks_;
  return o;
}

AttentionRunArgs FlashInferImpl::run_args(const AttentionLayer& layer, DType q_dtype) const {
  AttentionRunArgs a;
  // Scales dequantise: the query's only when it was quantised, the cache's only when fp8.
  a.q_scale = dtype_is_fp8(q_dtype) ? layer.q_scale_float : 1.0;
  const bool fp8_cache = is_fp8(cache_dtype_);
  a.k_scale = fp8_cache ? layer.k_scale_float : 1.0;
  a.v_scale = fp8_cache ? layer.v_scale_float : 1.0;
  a.sinks = sinks_;
  return a;
}

void FlashInferImpl::do_kv_cache_update(const AttentionLayer& layer, const Tensor& key, const Tensor& value,
                                        const Tensor& kv_cache, const Tensor& slot_mapping) {
  if (kv_sharing_target_layer_name_) return;  // the target layer wrote this KV
  if (is_kvcache_nvfp4_) throw Unsupported("do_kv_cache_update: kvattn has no NVFP4 KV-cache write kernel");
  auto [k_cache, v_cache] = split_kv(kv_cache);
  // Key/value may be padded; the slot mapping's length is the number of tokens.
  ops::reshape_and_cache_flash(key, value, k_cache, v_cache, slot_mapping, cache_dtype_, layer.k_scale, layer.v_scale);
}

Tensor FlashInferImpl::forward(const AttentionLayer& layer, const Tensor& query, const Tensor& key, const Tensor& value,
                               const Tensor& kv_cache, const AttentionMetadata* metadata, const Tensor& output,
                               const Tensor& output_scale, const Tensor& output_block_scale) {
  if (metadata == nullptr) {  // profiling run
    Tensor(output).fill_(0);
    return output;
  }
  KVATTN_CHECK(std::string_view(metadata->backend_name()) == "FLASHINFER",
               "FlashInferImpl.forward: metadata built by backend {} (expected FLASHINFER)", metadata->backend_name());
  const auto& md = static_cast<const FlashInferMetadata&>(*metadata);
  if (output_scale.defined() || output_block_scale.defined())
    throw Unsupported("FlashInferImpl: attention + output quantisation fusion needs the trtllm-gen fused kernels; "
                      "kvattn has none (fused_output_quant_supported() is false)");
  if (is_kvcache_nvfp4_) throw Unsupported("FlashInferImpl: kvattn has no NVFP4 KV-cache attention kernel");
  KVATTN_CHECK(md.dcp_world_size == dcp_world_size_,
               "FlashInferImpl.forward: the metadata was planned for {} DCP ranks but this layer's impl has a DCP group "
               "of {}; call set_dcp_group() on every layer's impl (DCP decode needs set_dcp_group())",
               md.dcp_world_size, dcp_world_size_);
  const int64_t n = md.num_actual_tokens;
  KVATTN_CHECK(query.dim() == 3 && query.size(1) == num_heads_ && query.size(2) == head_size_ && query.size(0) >= n,
               "FlashInferImpl.forward: query must be [>= {} tokens, {} heads, {}], got {}", n, num_heads_, head_size_,
               query.str());
  KVATTN_CHECK(output.dim() == 3 && output.size(1) == num_heads_ && output.size(2) == head_size_ && output.size(0) >= n,
               "FlashInferImpl.forward: output must be [>= {} tokens, {} heads, {}], got {}", n, num_heads_,
               head_size_, output.str());
  KVATTN_CHECK(md.num_decode_tokens + md.num_prefill_tokens <= n,
               "FlashInferImpl.forward: metadata has {} decode + {} prefill tokens but {} actual tokens",
               md.num_decode_tokens, md.num_prefill_tokens, n);
  auto [k_cache, v_cache] = split_kv(kv_cache);
  const Tensor q = query.narrow(0, 0, n);
  const Tensor out = output.narrow(0, 0, n);

  if (md.use_cascade) {  // cascade attention (rare case)
    KVATTN_ASSERT(md.cascade_wrapper != nullptr, "cascade metadata without a wrapper");
    md.cascade_wrapper->run(q, k_cache, v_cache, out, run_args(layer, md.q_data_type_prefill));
    return output;
  }
  // Decodes are at the front and prefills at the back of the same output.
  if (md.num_prefill_tokens > 0) run_prefill(md, layer, q, key, value, k_cache, v_cache, out);
  if (md.num_decode_tokens > 0) run_decode(md, layer, q, k_cache, v_cache, out);
  return output;
}

void FlashInferImpl::run_prefill(const FlashInferMetadata& md, const AttentionLayer& layer, const Tensor& query,
                                 const Tensor& key, const Tensor& value, const Tensor& k_cache, const Tensor& v_cache,
                                 const Tensor& output) const {
  const int64_t nd = md.num_decode_tokens, np = md.num_prefill_tokens;
  const Tensor pq = maybe_quant_query(query.narrow(0, nd, np), md.q_data_type_prefill, layer.q_scale_float);
  const Tensor out = output.narrow(0, nd, np);
  AttentionRunArgs args = run_args(layer, md.q_data_type_prefill);
  if (const auto* fi = std::get_if<FIPrefill>(&md.prefill)) {
    if (fi->dcp) {
      if (!key.defined() || !value.defined())
        throw Unsupported("FlashInfer DCP prefill does not support KV-sharing layers");
      KVATTN_CHECK(dcp_group_ != nullptr && dcp_world_size_ > 1,
                   "FlashInferImpl: DCP metadata but no DCP group; call set_dcp_group() on every layer's impl");
      const auto& ctx = fi->dcp->context().params();
      KVATTN_ASSERT(ctx.window_left == window_left_ && ctx.logits_soft_cap == logits_soft_cap_.value_or(0.0) &&
                        ctx.sm_scale == scale_ && !ctx.causal && fi->dcp->new_tokens().params().causal,
                    "DCP prefill plan does not match layer '{}'", layer.name);
      fi->dcp->run(*dcp_group_, kernel_query(pq), k_cache, v_cache, key.narrow(0, nd, np), value.narrow(0, nd, np), out,
                   args);
      return;
    }
    KVATTN_ASSERT(fi->wrapper != nullptr, "native prefill metadata without a wrapper");
    const auto& pp = fi->wrapper->params();
    KVATTN_ASSERT(pp.window_left == window_left_ && pp.logits_soft_cap == logits_soft_cap_.value_or(0.0) &&
                      pp.sm_scale == scale_ && pp.causal == md.causal,
                  "prefill plan does not match layer '{}' (window {} vs {}, scale {} vs {})", layer.name,
                  pp.window_left, window_left_, pp.sm_scale, scale_);
    fi->wrapper->run(kernel_query(pq), k_cache, v_cache, out, args);
    return;
  }
  const auto& tp = std::get<TRTLLMPrefill>(md.prefill);
  ops::PagedAttentionArgs a;
  a.query = kernel_query(pq);
  a.qo_indptr = tp.cum_seq_lens_q;
  a.seq_lens = tp.seq_lens;
  a.out = out;
  a.options() = layer_options(/*causal=*/true, args.q_scale);
  if (!dtype_is_fp8(md.q_data_type_prefill) && is_fp8(cache_dtype_)) {
    // The trtllm prefill takes no BF16-Q with an fp8 cache: dequantise the pages it reads into
    // a scratch cache (page 0 reserved) and run on that.
    const int64_t R = tp.block_tables.size(0), P = tp.block_tables.size(1);
    const Dims shape{R * P + 1, k_cache.size(1), k_cache.size(2), k_cache.size(3)};
    Tensor mock_k = Tensor::zeros(shape, md.q_data_type_prefill, k_cache.device());
    Tensor mock_v = Tensor::zeros(shape, md.q_data_type_prefill, k_cache.device());
    ops::kvfp8_dequant(k_cache, v_cache, tp.block_tables, layer.k_scale, layer.v_scale, mock_k, mock_v);
    a.k_cache = mock_k;
    a.v_cache = mock_v;
    Tensor table = ops::make_mock_block_table(R, P);
    a.block_table = k_cache.device().is_cpu() ? table : table.to(k_cache.device());
    a.k_scale = 1.0;
    a.v_scale = 1.0;
  } else {
    a.k_cache = k_cache;
    a.v_cache = v_cache;
    a.block_table = tp.block_tables;
    a.k_scale = args.k_scale;
    a.v_scale = args.v_scale;
  }
  a.plan = tp.plan;  // the dequantised path's fresh mock table re-plans by itself (another index tensor)
  ops::paged_attention(a);
}

void FlashInferImpl::run_decode(const FlashInferMetadata& md, const AttentionLayer& layer, const Tensor& query,
                                const Tensor& k_cache, const Tensor& v_cache, const Tensor& output) const {
  const int64_t nd = md.num_decode_tokens;
  const Tensor dq = kernel_query(maybe_quant_query(query.narrow(0, 0, nd), md.q_data_type_decode, layer.q_scale_float));
  const Tensor out = output.narrow(0, 0, nd);
  AttentionRunArgs args = run_args(layer, md.q_data_type_decode);
  const bool use_dcp = dcp_world_size_ > 1;
  KVATTN_CHECK(!use_dcp || dcp_group_ != nullptr, "FlashInferImpl: DCP decode needs set_dcp_group()");

  // Under DCP: all-gather the query over heads, attend over this rank's shard with LSE, then
  // combine across ranks.  `attend(q, out, lse)` runs the planned kernel.
  auto run_with_dcp = [&](auto&& attend) {
    if (!use_dcp) {
      attend(dq, out, AttentionRunArgs(args));
      return;
    }
    if (sinks_.defined()) throw Unsupported("DCP decode does not support attention sinks (the gathered query has W*H heads)");
    Tensor q_all = dcp_group_->all_gather(dq, -2);  // [nd, W*H, D]
    Tensor out_tmp = Tensor::empty(q_all.shape(), DType::f32, q_all.device());
    Tensor lse = Tensor::empty({q_all.size(0), q_all.size(1)}, DType::f32, q_all.device());
    AttentionRunArgs a = args;
    a.lse = lse;
    a.lse_base = ops::LseBase::Two;
    attend(q_all, out_tmp, a);
    Tensor combined = dcp_a2a_ ? dcp_a2a_lse_reduce(out_tmp, lse, *dcp_group_, false)
                               : cp_lse_ag_out_rs(out_tmp, lse, *dcp_group_, false);
    ops::copy_(out, combined);
  };

  if (const auto* fi = std::get_if<FIDecode>(&md.decode)) {
    KVATTN_ASSERT(fi->wrapper != nullptr, "native decode metadata without a wrapper");
    const auto& pp = fi->wrapper->params();
    KVATTN_ASSERT(pp.window_left == window_left_ && pp.logits_soft_cap == logits_soft_cap_.value_or(0.0) &&
                      pp.sm_scale == scale_,
                  "decode plan does not match layer '{}'", layer.name);
    run_with_dcp([&](const Tensor& q, const Tensor& o, const AttentionRunArgs& a) {
      fi->wrapper->run(q, k_cache, v_cache, o, a);
    });
    return;
  }
  const auto& d = std::get<FlashInferTrtllmAPIDecode>(md.decode);
  if (d.kernel == FlashInferDecodeKernel::TRTLLM_GEN) {
    const auto layout = md.kv_cache_layout;
    KVATTN_CHECK(layout == KVCacheLayout::LBHNC || layout == KVCacheLayout::BLHNC || layout == KVCacheLayout::BHLNC,
                 "trtllm-gen decode needs an HND KV cache layout, got {}; resolve the layout with "
                 "FlashInferBackend::supported_kv_cache_layouts()",
                 layout_name(layout));
  } else {
    KVATTN_ASSERT(!use_dcp, "XQA decode was reverted under DCP");
  }
  run_with_dcp([&](const Tensor& q, const Tensor& o, const AttentionRunArgs& ra) {
    ops::PagedAttentionArgs a;
    a.query = q;
    a.k_cache = k_cache;
    a.v_cache = v_cache;
    a.qo_indptr = d.qo_indptr;
    a.block_table = d.block_tables;
    a.seq_lens = d.seq_lens;
    a.out = o;
    a.lse = ra.lse;
    a.lse_base = ra.lse_base;
    a.options() = layer_options(md.causal, ra.q_scale);
    a.k_scale = ra.k_scale;
    a.v_scale = ra.v_scale;
    if (d.kernel == FlashInferDecodeKernel::XQA) a.xqa_draft_mask = d.mask;
    a.plan = d.plan;
    ops::paged_attention(a);
  });
}

}  // namespace kvattn
