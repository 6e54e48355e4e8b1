// src/attention/backend.cpp — AttentionBackend traits, validate_configuration, the
// NVIDIA kernel-availability rules and BackendConfig validation.
#include "kvattn/attention/backend.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "kvattn/core/error.h"

namespace kvattn {

const char* attention_type_name(AttentionType t) noexcept {
  switch (t) {
    case AttentionType::DECODER: return "decoder";
    case AttentionType::ENCODER: return "encoder";
    case AttentionType::ENCODER_ONLY: return "encoder_only";
    case AttentionType::ENCODER_DECODER: return "encoder_decoder";
  }
  return "?";
}

const char* attention_cg_support_name(AttentionCGSupport s) noexcept {
  switch (s) {
    case AttentionCGSupport::NEVER: return "NEVER";
    case AttentionCGSupport::UNIFORM_SINGLE_TOKEN_DECODE: return "UNIFORM_SINGLE_TOKEN_DECODE";
    case AttentionCGSupport::UNIFORM_BATCH: return "UNIFORM_BATCH";
    case AttentionCGSupport::ALWAYS: return "ALWAYS";
  }
  return "?";
}

std::string DeviceCapability::str() const { return fmt::format("{}.{}", major, minor); }

std::string AttentionPlatform::str() const {
  if (!capability) return device.str();
  return fmt::format("{} sm{}", device.str(), capability->to_int());
}

void BackendConfig::validate() const {
  KVATTN_CHECK(num_attention_heads > 0 && num_kv_heads > 0,
               "BackendConfig: num_attention_heads ({}) and num_kv_heads ({}) must be positive",
               num_attention_heads, num_kv_heads);
  KVATTN_CHECK(num_attention_heads % num_kv_heads == 0,
               "BackendConfig: num_attention_heads ({}) must be a multiple of num_kv_heads ({}) (GQA)",
               num_attention_heads, num_kv_heads);
  KVATTN_CHECK(head_size > 0, "BackendConfig: head_size must be positive, got {}", head_size);
  KVATTN_CHECK(max_model_len > 0 && max_num_seqs > 0 && max_num_batched_tokens > 0,
               "BackendConfig: max_model_len ({}), max_num_seqs ({}) and max_num_batched_tokens ({}) must "
               "be positive",
               max_model_len, max_num_seqs, max_num_batched_tokens);
  KVATTN_CHECK(decode_context_parallel_size >= 1 && dcp_rank >= 0 && dcp_rank < decode_context_parallel_size,
               "BackendConfig: dcp_rank {} must be in [0, decode_context_parallel_size={})", dcp_rank,
               decode_context_parallel_size);
  KVATTN_CHECK(cp_kv_cache_interleave_size >= 1, "BackendConfig: cp_kv_cache_interleave_size must be >= 1, got {}",
               cp_kv_cache_interleave_size);
  KVATTN_CHECK(dcp_comm_backend == "ag_rs" || dcp_comm_backend == "a2a",
               "BackendConfig: dcp_comm_backend '{}' is not one of ['ag_rs', 'a2a']", dcp_comm_backend);
  KVATTN_CHECK(!num_speculative_tokens || *num_speculative_tokens >= 0,
               "BackendConfig: num_speculative_tokens must be >= 0, got {}", *num_speculative_tokens);
  KVATTN_CHECK(num_sms > 0, "BackendConfig: num_sms must be positive, got {}", num_sms);
  KVATTN_CHECK(dtype_is_float(model_dtype) && !dtype_is_fp8(model_dtype),
               "BackendConfig: model_dtype {} must be float32, float16 or bfloat16", dtype_name(model_dtype));
}

int64_t max_decode_query_len(const BackendConfig& config) {
  if (!config.num_speculative_tokens) return 1;
  return 1 + (config.parallel_drafting ? 2 : 1) * *config.num_speculative_tokens;
}

// ---------------------------------------------------------------------------------------
bool supports_trtllm_attention(const BackendConfig& config, bool is_prefill) {
  if (config.batch_invariant || !config.platform.has_trtllm_kernels) return false;
  const auto& p = config.platform;
  if (p.is_device_capability(90) || p.is_device_capability_family(120)) return !is_prefill;  // XQA decode only
  return p.is_device_capability_family(100);
}

std::optional<bool> force_use_trtllm_attention(const BackendConfig& config) {
  return config.attention_config.use_trtllm_attention;
}

bool can_use_trtllm_attention(const BackendConfig& config, int64_t num_qo_heads, int64_t num_kv_heads,
                              bool is_prefill) {
  const auto force = force_use_trtllm_attention(config);
  return force != false && supports_trtllm_attention(config, is_prefill) && num_kv_heads > 0 &&
         num_qo_heads % num_kv_heads == 0;
}

bool use_trtllm_attention(const BackendConfig& config, int64_t num_qo_heads, int64_t num_kv_heads,
                          int64_t num_tokens, int64_t max_seq_len, int64_t dcp_world_size,
                          KVCacheDType kv_cache_dtype, DType q_dtype, bool is_prefill,
                          std::optional<bool> force_use_trtllm, bool has_sinks, bool has_spec) {
  if (force_use_trtllm && !*force_use_trtllm) return false;
  if (dcp_world_size > 1) return false;  // no cross-rank LSE combine in the trtllm prefill
  if (!supports_trtllm_attention(config, is_prefill)) return false;
  if (num_kv_heads <= 0 || num_qo_heads % num_kv_heads != 0) return false;
  if (has_spec && !is_prefill) return true;
  if (dtype_is_fp8(q_dtype)) return true;
  if (has_sinks) return true;
  if (!force_use_trtllm) {
    if (is_prefill) return kv_cache_dtype == KVCacheDType::Auto;
    const auto& p = config.platform;
    if ((p.is_device_capability(90) || p.is_device_capability_family(120)) && is_fp8(kv_cache_dtype))
      return true;
    return num_tokens <= 256 && kv_cache_dtype == KVCacheDType::Auto;
  }
  return true;
}

// ---------------------------------------------------------------------------------------
std::string AttentionSelectorConfig::str() const {
  return fmt::format(
      "head_size={}, dtype={}, kv_cache_dtype={}, block_size={}, use_mla={}, has_sink={}, use_sparse={}, "
      "use_mm_prefix={}, attn_type={}, sliding_window={}, non_causal={}, batch_invariant={}, dcp={}",
      head_size, dtype_name(dtype), kv_cache_dtype_name(kv_cache_dtype),
      block_size ? fmt::format("{}", *block_size) : "None", use_mla, has_sink, use_sparse, use_mm_prefix,
      attention_type_name(attn_type), has_sliding_window, use_non_causal, use_batch_invariant, use_dcp);
}

bool AttentionBackend::supports_dtype(DType dtype) const {
  const auto d = supported_dtypes();
  return d.empty() || std::find(d.begin(), d.end(), dtype) != d.end();
}

bool AttentionBackend::supports_kv_cache_dtype(KVCacheDType kv_cache_dtype, const BackendConfig&) const {
  const auto d = supported_kv_cache_dtypes();
  return d.empty() || std::find(d.begin(), d.end(), kv_cache_dtype) != d.end();
}

bool AttentionBackend::supports_block_size(int64_t block_size, const BackendConfig& config) const {
  const auto sizes = get_supported_kernel_block_sizes(nullptr, config);
  if (sizes.empty()) return true;
  for (const auto& s : sizes) {
    if (const auto* i = std::get_if<int64_t>(&s); i && *i > 0 && block_size % *i == 0) return true;
    if (const auto* m = std::get_if<MultipleOf>(&s); m && m->base > 0 && block_size % m->base == 0) return true;
  }
  return false;
}

int64_t AttentionBackend::get_preferred_block_size(int64_t default_block_size, const BackendConfig& config) const {
  if (supports_block_size(default_block_size, config)) return default_block_size;
  int64_t best = 0;
  for (const auto& s : get_supported_kernel_block_sizes(nullptr, config)) {
    int64_t b = 0;
    if (const auto* i = std::get_if<int64_t>(&s)) b = *i;
    if (const auto* m = std::get_if<MultipleOf>(&s)) b = m->base;
    if (b > 0 && (best == 0 || b < best)) best = b;
  }
  KVATTN_CHECK(best > 0, "{}: declares no usable kernel block size", get_name());
  return best;
}

bool AttentionBackend::supports_head_size(int64_t head_size) const {
  const auto h = get_supported_head_sizes();
  return h.empty() || std::find(h.begin(), h.end(), head_size) != h.end();
}

std::vector<std::string> AttentionBackend::validate_configuration(const AttentionSelectorConfig& sel,
                                                                  const BackendConfig& config) const {
  std::vector<std::string> reasons;
  if (!supports_head_size(sel.head_size))
    reasons.push_back(fmt::format("head_size {} not supported (supported: [{}])", sel.head_size,
                                  fmt::join(get_supported_head_sizes(), ", ")));
  if (!supports_dtype(sel.dtype)) {
    std::vector<std::string> names;
    for (DType d : supported_dtypes()) names.emplace_back(dtype_name(d));
    reasons.push_back(fmt::format("dtype {} not supported (supported: [{}])", dtype_name(sel.dtype),
                                  fmt::join(names, ", ")));
  }
  if (!supports_kv_cache_dtype(sel.kv_cache_dtype, config))
    reasons.push_back(fmt::format("kv_cache_dtype '{}' not supported on {} (supported: [{}])",
                                  kv_cache_dtype_name(sel.kv_cache_dtype), config.platform.str(),
                                  kv_cache_dtype_names(supported_kv_cache_dtypes())));
  if (sel.block_size && !supports_block_size(*sel.block_size, config))
    reasons.push_back(fmt::format("block_size {} not supported (kernel block sizes: {})", *sel.block_size,
                                  format_kernel_block_sizes(get_supported_kernel_block_sizes(nullptr, config))));
  if (sel.use_mm_prefix && !supports_mm_prefix())
    reasons.push_back("partial multimodal token full attention not supported");
  if (sel.use_mla != is_mla()) reasons.push_back(sel.use_mla ? "MLA not supported" : "non-MLA not supported");
  if (sel.has_sink && !supports_sink(config))
    reasons.push_back(fmt::format("sink setting not supported on {}", config.platform.str()));
  if (sel.use_sparse != is_sparse())
    reasons.push_back(sel.use_sparse ? "sparse not supported" : "non-sparse not supported");
  if (sel.use_per_head_quant_scales && !supports_per_head_quant_scales())
    reasons.push_back("per-head quant scales not supported");
  if (!supports_compute_capability(config.platform.capability))
    reasons.push_back(fmt::format("compute capability {} not supported",
                                  config.platform.capability ? config.platform.capability->str() : "none"));
  if (!supports_attn_type(sel.attn_type))
    reasons.push_back(fmt::format("attention type {} not supported (only decoder)", attention_type_name(sel.attn_type)));
  if (sel.has_sliding_window && !supports_sliding_window()) reasons.push_back("sliding window not supported");
  if (sel.use_non_causal && !supports_non_causal()) reasons.push_back("non-causal attention not supported");
  if (sel.use_batch_invariant && !supports_batch_invariance()) reasons.push_back("batch invariance not supported");
  if (sel.use_kv_connector && !supports_kv_connector()) reasons.push_back("KV connector not supported");
  if (sel.use_pcp && !supports_pcp()) reasons.push_back("prefill context parallel not supported");
  if (sel.use_dcp && !supports_dcp()) reasons.push_back("decode context parallel not supported");
  if (sel.use_adaptive_verification && !supports_device_cpu_query_lens_mismatch(config))
    reasons.push_back(
        "device-cpu query lens mismatch not supported, this is needed for adaptive verification");
  if (auto combination = supports_combination(sel, config)) reasons.push_back(*combination);
  return reasons;
}

BlockSizeBackend AttentionBackend::block_size_backend(const BackendConfig& config) const {
  BlockSizeBackend b;
  b.name = get_name();
  // The lambdas copy the config; the backend outlives them (registry-owned, immortal).
  b.supported_kernel_block_sizes = [this, config](const KVCacheSpec* spec) {
    return get_supported_kernel_block_sizes(spec, config);
  };
  b.customize_spec = [this, config](const std::shared_ptr<const AttentionSpec>& spec) {
    return customize_spec(spec, config);
  };
  return b;
}

}  // namespace kvattn
