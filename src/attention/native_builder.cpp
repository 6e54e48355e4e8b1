// src/attention/native_builder.cpp — FlashInferMetadataBuilder: the per-step plan of the
// native backend (seed 004's FlashInferMetadataBuilder, phase by phase).
#include <fmt/format.h>

#include <algorithm>

#include "kvattn/attention/native_backend.h"
#include "kvattn/attention/paged_kv_metadata.h"
#include "kvattn/attention/xqa_mask.h"
#include "kvattn/batch/slot_mapping.h"
#include "kvattn/batch/split.h"
#include "kvattn/batch/tensor_access.h"
#include "kvattn/core/error.h"
#include "kvattn/core/log.h"
#include "kvattn/ops/page_utils.h"

namespace kvattn {

namespace {

inline int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

constexpr int64_t kBatchInvariantWorkspaceBytes = 2048LL * 1024 * 1024;
constexpr int64_t kPrefillWorkspaceBytesPerElem = 16;

// FlashInfer's name for the block interior ("NHD"/"HND"); LHBNC has none, but kvattn's
// kernels read it through strides, so it keeps its own name as the label.
std::string layout_label(KVCacheLayout l) {
  return l == KVCacheLayout::LHBNC ? std::string("LHBNC") : std::string(get_flashinfer_layout_string(l));
}

bool is_xqa_head_dim_supported(int64_t head_dim) { return head_dim >= 16 && head_dim <= 256 && head_dim % 16 == 0; }

// Host int32 values of a 1-D tensor (contiguous, CPU).
const int32_t* host_i32(const Tensor& t, int64_t n, const char* what) {
  KVATTN_CHECK(t.defined() && t.device().is_cpu() && t.dtype() == DType::i32 && t.dim() == 1 && t.size(0) >= n &&
                   (t.size(0) <= 1 || t.stride(0) == 1),
               "FlashInferMetadataBuilder.build: {} must be a contiguous host int32 tensor of >= {} entries, got {}",
               what, n, t.defined() ? t.str() : "undefined");
  return t.data_ptr<int32_t>();
}

std::vector<AttentionLayerInfo> layer_infos(const BackendConfig& config, const std::vector<std::string>& names) {
  KVATTN_CHECK(config.layers != nullptr,
               "FlashInferMetadataBuilder: BackendConfig.layers must hold the attention layers of the group "
               "(vLLM's static forward context) so per-layer hyperparameters can be read; it is null");
  std::vector<AttentionLayerInfo> out;
  out.reserve(names.size());
  for (const auto& n : names) {
    const AttentionLayer& l = config.layers->get(n);
    KVATTN_CHECK(l.impl != nullptr, "FlashInferMetadataBuilder: layer '{}' has no impl", n);
    AttentionLayerInfo info;
    info.name = n;
    info.num_heads = l.impl->num_heads();
    info.num_kv_heads = l.impl->num_kv_heads();
    info.sm_scale = l.impl->scale();
    if (l.impl->window_left() >= 0) info.sliding_window = std::make_pair(l.impl->window_left(), int64_t{0});
    info.logits_soft_cap = l.impl->logits_soft_cap();
    info.has_sinks = l.impl->has_sinks();
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace

// The decisions of one build(), in the order the seed takes them.
struct FlashInferMetadataBuilder::StepPlan {
  int64_t num_reqs = 0, num_actual_tokens = 0;
  bool causal = true;
  int64_t num_decodes = 0, num_prefills = 0, num_decode_tokens = 0, num_prefill_tokens = 0;
  const int32_t* qo_indptr_cpu = nullptr;  // [num_reqs + 1]
  // Step 1: dispatch.
  bool use_cascade = false;
  int64_t common_prefix_len = 0;
  bool prefill_use_trtllm = false;
  bool decode_with_trtllm_api = false;
  bool all_uses_trtllm = false;
  // Host sequence lengths (nullptr when not needed) and page counts.
  const int32_t* seq_lens_cpu = nullptr;  // [num_reqs]
  int64_t num_common_kv_blocks = 0;
  bool has_paged_kv = false;
};

FlashInferMetadataBuilder::FlashInferMetadataBuilder(std::shared_ptr<const AttentionSpec> kv_cache_spec,
                                                     std::vector<std::string> layer_names,
                                                     const BackendConfig& config)
    : AttentionMetadataBuilder(std::move(kv_cache_spec), std::move(layer_names), config),
      device_(config.platform.device) {
  const AttentionSpec& spec = *kv_cache_spec_;
  num_speculative_tokens_ = config_.num_speculative_tokens.value_or(0);
  if (config_.batch_invariant) {
    decode_fixed_split_size_ = 2048;
    prefill_fixed_split_size_ = 4096;
    disable_split_kv_ = true;
  }
  max_num_batched_tokens_ = config_.max_num_batched_tokens;
  max_num_reqs_ = config_.max_num_seqs;
  max_num_pages_ = max_num_reqs_ * cdiv(config_.max_model_len, spec.block_size());
  enable_cuda_graph_ = config_.cudagraph_decode_full;
  if (enable_cuda_graph_) {
    decode_cudagraph_max_bs_ = (1 + num_speculative_tokens_) * max_num_reqs_;
    if (config_.max_cudagraph_capture_size)
      decode_cudagraph_max_bs_ = std::min(decode_cudagraph_max_bs_, *config_.max_cudagraph_capture_size);
  }
  if (spec.dcp_sharded()) {
    dcp_world_size_ = config_.decode_context_parallel_size;
    dcp_rank_ = config_.dcp_rank;
  }
  dcp_kv_cache_interleave_size_ = config_.cp_kv_cache_interleave_size;
  dcp_a2a_ = dcp_world_size_ > 1 && config_.dcp_comm_backend == "a2a";

  // Heads: from the layers (models with per-layer head counts), else the model config.
  const auto infos = layer_infos(config_, layer_names_);
  num_qo_heads_ = get_num_attention_heads_from_layers(infos, layer_names_).value_or(config_.num_attention_heads);
  num_kv_heads_ = spec.num_kv_heads();
  head_dim_ = spec.head_size();
  page_size_ = spec.block_size();
  KVATTN_CHECK(num_qo_heads_ % num_kv_heads_ == 0,
               "FlashInferMetadataBuilder: {} query heads are not a multiple of {} KV heads", num_qo_heads_,
               num_kv_heads_);

  // KV cache dtype of this group.
  if (spec.kv_quant_mode() != KVQuantMode::NONE) {
    cache_dtype_ = config_.cache_dtype;
    is_kvcache_nvfp4_ = is_nvfp4(cache_dtype_);
    if (is_kvcache_nvfp4_)
      throw Unsupported(fmt::format(
          "--kv-cache-dtype {} needs the SM100 trtllm-gen NVFP4 KV path; kvattn has no NVFP4 KV kernel. Use "
          "--kv-cache-dtype fp8 (or auto).",
          kv_cache_dtype_name(cache_dtype_)));
    kv_cache_dtype_ = FlashInferBackend::get_dtype_for_flashinfer(cache_dtype_);
  } else {
    cache_dtype_ = KVCacheDType::Auto;
    KVATTN_CHECK(spec.dtype() == config_.model_dtype,
                 "FlashInferMetadataBuilder: an unquantised KV cache must have the model dtype ({}), got {}",
                 dtype_name(config_.model_dtype), dtype_name(spec.dtype()));
    kv_cache_dtype_ = spec.dtype();
  }
  q_data_type_prefill_ = get_q_data_type(true);
  q_data_type_decode_ = get_q_data_type(false);

  // Decode kernel: XQA / trtllm-gen when usable (static, for full CUDA graphs).
  const bool can_use_api_decode = can_use_trtllm_attention(config_, num_qo_heads_, num_kv_heads_, false);
  KVATTN_CHECK(page_size_ <= 64 || (config_.platform.is_device_capability_family(100) && can_use_api_decode &&
                                    num_qo_heads_ / num_kv_heads_ > 1),
               "FlashInferMetadataBuilder: page size {} needs the trtllm-gen GQA path (SM100, query heads > KV "
               "heads); supported here: 16, 32, 64",
               page_size_);
  use_trtllm_decode_attention_ = can_use_api_decode;
  decode_kernel_ = can_use_api_decode ? get_flashinfer_trtllm_api_decode_kernel(config_) : std::nullopt;
  if (decode_kernel_ == FlashInferDecodeKernel::XQA && !is_xqa_head_dim_supported(head_dim_)) {
    logger().warn("XQA decode does not support head_dim={}; this KV-cache group uses native decode.", head_dim_);
    use_trtllm_decode_attention_ = false;
    decode_kernel_.reset();
  }
  if (dcp_world_size_ > 1 && decode_kernel_ == FlashInferDecodeKernel::XQA) {
    logger().warn("XQA decode cannot return LSE, so it does not support DCP; using native decode.");
    use_trtllm_decode_attention_ = false;
    decode_kernel_.reset();
  }
  use_xqa_ = decode_kernel_ == FlashInferDecodeKernel::XQA;
  use_trtllm_gen_varlen_decode_ = uses_trtllm_gen_varlen_decode(config_, decode_kernel_, dcp_world_size_ > 1);
  supports_draft_decode_metadata_update_ = decode_kernel_ == FlashInferDecodeKernel::TRTLLM_GEN && dcp_world_size_ == 1;
  // trtllm-gen decode has no DCP-aware causal mask for q_len > 1: spec queries stay prefills.
  init_reorder_batch_threshold(1, decode_kernel_.has_value(), /*supports_dcp_with_varlen=*/false);

  // Global hyperparameters shared by the layers.
  auto per_layer = get_per_layer_parameters(infos, layer_names_);
  global_ = infer_global_hyperparameters(per_layer);
  sm_scale_ = global_.sm_scale;
  window_left_ = global_.window_left;
  logits_soft_cap_ = global_.logits_soft_cap.value_or(0.0);
  has_sinks_ = global_.has_sinks;
  if (has_sinks_ && !FlashInferBackend().supports_sink(config_))
    throw Unsupported("FlashInfer backend does not support attention sinks on this platform");
  if (dcp_world_size_ > 1 && window_left_ != -1)
    throw Unsupported(fmt::format("DCP does not support sliding window attention (window_left={}): DCP-local "
                                  "positions cannot express the window; use decode_context_parallel_size=1",
                                  window_left_));
  logger().info("FlashInfer resolved query dtypes: prefill={}, decode={}, decode_backend={}, kv_cache_dtype={}, arch={}",
                dtype_name(q_data_type_prefill_), dtype_name(q_data_type_decode_),
                decode_kernel_ ? decode_kernel_name(*decode_kernel_) : "flashinfer-native",
                dtype_name(kv_cache_dtype_), config_.platform.str());

  // Persistent buffers.
  paged_kv_indptr_ = CpuGpuBuffer({max_num_reqs_ + 1}, DType::i32, device_);
  paged_kv_indices_ = Tensor::zeros({std::max<int64_t>(max_num_pages_, 1)}, DType::i32, device_);
  paged_kv_last_page_len_ = CpuGpuBuffer({max_num_reqs_}, DType::i32, device_);
  kv_lens_cpu_ = Tensor::zeros({max_num_reqs_}, DType::i32);
  seq_lens_cpu_ = Tensor::zeros({max_num_reqs_}, DType::i32);
  qo_indptr_prefill_ = CpuGpuBuffer({max_num_reqs_ + 1}, DType::i32, device_);
  paged_kv_indptr_prefill_ = CpuGpuBuffer({max_num_reqs_ + 1}, DType::i32, device_);
  const int64_t arange_n = std::max(max_num_reqs_, max_num_batched_tokens_) + 1;
  qo_arange_ = CpuGpuBuffer({arange_n}, DType::i32, device_);
  for (int64_t i = 0; i < arange_n; ++i) qo_arange_.np<int32_t>()[i] = static_cast<int32_t>(i);
  qo_arange_.copy_to_gpu(arange_n);
  cum_seq_lens_kv_ = CpuGpuBuffer({max_num_reqs_ + 1}, DType::i32, device_);
  cascade_qo_indptr_ = CpuGpuBuffer({2}, DType::i32, device_);
  if (use_xqa_) {
    mask_words_ = cdiv(reorder_batch_threshold_.value_or(1), 32);
    ragged_mask_ = Tensor::zeros({max_num_batched_tokens_, mask_words_}, DType::i32, device_);
    decode_mask_cache_.emplace(max_num_reqs_, mask_words_, device_);
  }
  plan_capacity_ = max_num_batched_tokens_ + 2 * max_num_reqs_ + 2 * config_.num_sms;
}

FlashInferMetadataBuilder::~FlashInferMetadataBuilder() = default;

KVCacheLayout FlashInferMetadataBuilder::kv_cache_layout() const {
  return layout_ ? *layout_ : config_.cache_config.get_resolved_kv_cache_layout();
}

DType FlashInferMetadataBuilder::get_q_data_type(bool is_prefill) const {
  if (config_.attention_config.disable_flashinfer_q_quantization) return config_.model_dtype;
  const auto& p = config_.platform;
  const bool xqa_arch = p.is_device_capability(90) || p.is_device_capability_family(120);
  // XQA decode on SM90/SM12x needs BF16/FP16-Q even with an fp8 KV cache.
  if (xqa_arch && !is_prefill && force_use_trtllm_attention(config_) != false && is_fp8(cache_dtype_))
    return config_.model_dtype;
  if (is_fp8(cache_dtype_)) {
    // FP8-Q needs an fp8 tensor-core path (SM90 prefill, SM100); elsewhere keep the model dtype.
    if (p.is_device_capability(90) || p.is_device_capability_family(100))
      return FlashInferBackend::get_dtype_for_flashinfer(cache_dtype_);
    return config_.model_dtype;
  }
  if (is_nvfp4(cache_dtype_)) return DType::fp8_e4m3;
  return kv_cache_spec_->dtype();
}

int64_t FlashInferMetadataBuilder::workspace_size() const {
  if (config_.batch_invariant) return kBatchInvariantWorkspaceBytes;
  const int64_t est = max_num_batched_tokens_ * num_qo_heads_ * head_dim_ * kPrefillWorkspaceBytesPerElem;
  return std::max(config_.flashinfer_workspace_buffer_size, est);
}

const Tensor& FlashInferMetadataBuilder::workspace_buffer() {
  if (!workspace_.defined()) workspace_ = Tensor::zeros({workspace_size()}, DType::u8, device_);
  return workspace_;
}

void FlashInferMetadataBuilder::set_workspace_buffer(const Tensor& workspace) {
  KVATTN_CHECK(workspace.defined() && workspace.dtype() == DType::u8 && workspace.dim() == 1,
               "set_workspace_buffer: expected a 1-D uint8 tensor, got {}",
               workspace.defined() ? workspace.str() : "undefined");
  workspace_ = workspace;
}

bool FlashInferMetadataBuilder::uses_trtllm_gen_varlen_decode(const BackendConfig& config,
                                                              std::optional<FlashInferDecodeKernel> kernel,
                                                              bool use_dcp) {
  return config.num_speculative_tokens.has_value() && config.enable_adaptive_verification &&
         kernel == FlashInferDecodeKernel::TRTLLM_GEN && !use_dcp;
}

std::optional<FlashInferDecodeKernel> FlashInferMetadataBuilder::get_flashinfer_trtllm_api_decode_kernel(
    const BackendConfig& config) {
  const auto& p = config.platform;
  if (p.is_device_capability(90) || p.is_device_capability_family(120)) return FlashInferDecodeKernel::XQA;
  if (p.is_device_capability_family(100)) return FlashInferDecodeKernel::TRTLLM_GEN;
  return std::nullopt;
}

FlashInferMetadataBuilder::DecodeQueryLens FlashInferMetadataBuilder::compute_decode_query_lens(
    std::span<const int32_t> qo, int64_t num_decodes, int64_t num_decode_tokens) const {
  const DecodeQueryWidth w = decode_query_width(qo, num_decodes, num_decode_tokens, use_xqa_);  // the shared rule
  return {w.q_len_per_req, w.use_qo_indptr};
}

AttentionPlanParams FlashInferMetadataBuilder::plan_params(DType q_dtype, bool causal, int64_t num_qo_heads) const {
  AttentionPlanParams p;
  p.num_qo_heads = num_qo_heads;
  p.num_kv_heads = num_kv_heads_;
  p.head_dim = head_dim_;
  p.page_size = page_size_;
  p.causal = causal;
  p.sm_scale = sm_scale_;
  p.window_left = window_left_;
  p.logits_soft_cap = logits_soft_cap_;
  p.q_data_type = q_dtype;
  p.kv_data_type = kv_cache_dtype_;
  p.o_data_type = config_.model_dtype;
  p.disable_split_kv = disable_split_kv_;
  return p;
}

// ---------------------------------------------------------------------------------------
// build(): the seed's phases, one call each.
const FlashInferMetadata& FlashInferMetadataBuilder::build(int64_t common_prefix_len, const CommonAttentionMetadata& cm,
                                                           bool fast_build) {
  StepPlan s;
  decide_dispatch(s, common_prefix_len, cm);  // split decodes/prefills; cascade, prefill and decode paths
  validate_step(s);                           // sinks with DCP/cascade, window lefts, mixed hyperparameters
  init_output_metadata(s, cm);                // counts, dtypes, slot mapping; paths left empty
  compute_host_seq_lens(s, cm);               // exact upper bound vs device copy
  adjust_seq_lens_for_dcp(s, cm);             // context-only prefill rows, rank-local lengths
  compute_paged_kv_metadata(s, cm);           // page counts, cascade adjustment, indptr/indices/last page
  if (s.use_cascade) {
    plan_cascade(s, cm);  // early-out: the whole batch is one cascade call
    return metadata_;
  }
  if (s.num_prefills > 0) plan_prefill(s, cm);  // native / DCP / trtllm prefill plan
  if (s.num_decodes > 0) plan_decode(s, cm);    // native (CUDA-graph aware) / XQA / trtllm-gen decode plan
  return metadata_;
}

void FlashInferMetadataBuilder::decide_dispatch(StepPlan& s, int64_t common_prefix_len,
                                                const CommonAttentionMetadata& cm) {
  s.num_reqs = cm.num_reqs;
  s.num_actual_tokens = cm.num_actual_tokens;
  s.causal = cm.causal;
  KVATTN_CHECK(s.num_reqs >= 0 && s.num_reqs <= max_num_reqs_,
               "FlashInferMetadataBuilder.build: num_reqs {} outside [0, max_num_seqs={}]", s.num_reqs, max_num_reqs_);
  KVATTN_CHECK(s.num_actual_tokens >= 0 && s.num_actual_tokens <= max_num_batched_tokens_,
               "FlashInferMetadataBuilder.build: num_actual_tokens {} outside [0, max_num_batched_tokens={}]",
               s.num_actual_tokens, max_num_batched_tokens_);
  KVATTN_CHECK(common_prefix_len >= 0, "FlashInferMetadataBuilder.build: common_prefix_len must be >= 0, got {}",
               common_prefix_len);
  s.qo_indptr_cpu = host_i32(cm.query_start_loc_cpu, s.num_reqs + 1, "query_start_loc_cpu");
  KVATTN_CHECK(s.qo_indptr_cpu[0] == 0 && s.qo_indptr_cpu[s.num_reqs] <= s.num_actual_tokens,
               "FlashInferMetadataBuilder.build: query_start_loc_cpu must start at 0 and end at <= num_actual_tokens "
               "({}), got [{} .. {}]",
               s.num_actual_tokens, s.qo_indptr_cpu[0], s.qo_indptr_cpu[s.num_reqs]);
  // Every index taken from the metadata below (qo_indptr_cpu[num_decode_tokens], the per-request
  // query lengths) trusts max_query_len and a non-decreasing query_start_loc: check both first.
  int64_t actual_max_query_len = 0;
  for (int64_t r = 0; r < s.num_reqs; ++r) {
    const int64_t q = static_cast<int64_t>(s.qo_indptr_cpu[r + 1]) - s.qo_indptr_cpu[r];
    KVATTN_CHECK(q >= 0,
                 "FlashInferMetadataBuilder.build: query_start_loc_cpu must be non-decreasing, but entry {} is {} "
                 "and entry {} is {}",
                 r, s.qo_indptr_cpu[r], r + 1, s.qo_indptr_cpu[r + 1]);
    actual_max_query_len = std::max(actual_max_query_len, q);
  }
  KVATTN_CHECK(cm.max_query_len >= actual_max_query_len,
               "FlashInferMetadataBuilder.build: max_query_len = {} understates the batch, whose longest query "
               "(from query_start_loc_cpu) has {} tokens; set max_query_len to the largest "
               "query_start_loc[i + 1] - query_start_loc[i]",
               cm.max_query_len, actual_max_query_len);
  KVATTN_CHECK(cm.block_table_tensor.defined() && cm.block_table_tensor.dim() == 2 &&
                   cm.block_table_tensor.size(0) >= s.num_reqs && cm.block_table_tensor.dtype() == DType::i32,
               "FlashInferMetadataBuilder.build: block_table_tensor must be [>= num_reqs={}, blocks] int32, got {}",
               s.num_reqs, cm.block_table_tensor.defined() ? cm.block_table_tensor.str() : "undefined");

  const bool route_decode = s.causal || use_xqa_;
  if (route_decode) {
    const auto split = split_decodes_and_prefills(cm, reorder_batch_threshold_.value_or(1),
                                                  /*require_uniform=*/!(use_xqa_ || use_trtllm_gen_varlen_decode_));
    s.num_decodes = split.num_decodes;
    s.num_prefills = split.num_prefills;
    s.num_decode_tokens = split.num_decode_tokens;
    s.num_prefill_tokens = split.num_prefill_tokens;
  } else {
    s.num_prefills = s.num_reqs;
    s.num_prefill_tokens = s.num_actual_tokens;
  }
  s.common_prefix_len = common_prefix_len;
  s.use_cascade = common_prefix_len > 0;
  const bool uses_spec_reorder = reorder_batch_threshold_.value_or(1) > 1;
  const std::optional<bool> prefill_force =
      page_size_ >= 128 ? std::optional<bool>(true) : config_.attention_config.use_trtllm_attention;
  s.prefill_use_trtllm = s.causal && use_trtllm_attention(config_, num_qo_heads_, num_kv_heads_, s.num_prefill_tokens,
                                                          cm.max_seq_len, dcp_world_size_, cache_dtype_,
                                                          q_data_type_prefill_, /*is_prefill=*/true, prefill_force,
                                                          has_sinks_, uses_spec_reorder);
  s.decode_with_trtllm_api = use_trtllm_decode_attention_ && (s.causal || use_xqa_);
  if (!s.causal && dcp_world_size_ > 1)
    throw Unsupported("FlashInfer non-causal prefill is not supported with DCP yet (set "
                      "decode_context_parallel_size=1 or use causal attention).");
  s.all_uses_trtllm = s.causal && (s.num_prefills == 0 || s.prefill_use_trtllm) &&
                      (s.num_decodes == 0 || s.decode_with_trtllm_api);
}

void FlashInferMetadataBuilder::validate_step(const StepPlan& s) const {
  if (s.all_uses_trtllm) return;
  if (has_sinks_ && (dcp_world_size_ > 1 || s.use_cascade))
    throw Unsupported(
        "FlashInfer BatchDCPPrefillWrapper and MultiLevelCascadeAttentionWrapper do not support attention sinks "
        "(sinks would be dropped): disable DCP / cascade for models with sinks.");
  KVATTN_CHECK(global_.has_same_window_lefts.value_or(true),
               "Window left is not the same for all layers. One potential fix is to set disable_sliding_window=True");
  KVATTN_CHECK(global_.has_same_all_params.value_or(true),
               "FlashInfer backend currently only supports models in which all layers share the same values for "
               "the following hyperparameters: `window_left`, `logits_soft_cap`, `sm_scale`.");
}

void FlashInferMetadataBuilder::init_output_metadata(const StepPlan& s, const CommonAttentionMetadata& cm) {
  if (!layout_) layout_ = config_.cache_config.get_resolved_kv_cache_layout();
  FlashInferMetadata& m = metadata_;
  m.kv_cache_layout = *layout_;
  m.num_actual_tokens = s.num_actual_tokens;
  m.slot_mapping = cm.slot_mapping.defined() ? cm.slot_mapping.narrow(0, 0, std::min<int64_t>(s.num_actual_tokens,
                                                                                                cm.slot_mapping.size(0)))
                                             : Tensor();
  m.q_data_type_prefill = q_data_type_prefill_;
  m.q_data_type_decode = q_data_type_decode_;
  m.num_decodes = s.num_decodes;
  m.num_decode_tokens = s.num_decode_tokens;
  m.num_prefills = s.num_prefills;
  m.num_prefill_tokens = s.num_prefill_tokens;
  m.causal = s.causal;
  m.dcp_world_size = dcp_world_size_;
  m.use_cascade = s.use_cascade;
  m.prefill = std::monostate{};
  m.decode = std::monostate{};
  m.cascade_wrapper = nullptr;
  m.cudagraph_batch_size = 0;
}

void FlashInferMetadataBuilder::compute_host_seq_lens(StepPlan& s, const CommonAttentionMetadata& cm) {
  const bool needs_seq_lens_cpu = dcp_world_size_ > 1 || s.use_cascade || !s.all_uses_trtllm;
  if (!needs_seq_lens_cpu) return;
  // No speculative token accounting: the upper bound is exact.  Checks query_len <= seq_len.
  s.seq_lens_cpu = paged_kv_host_seq_lens(cm, {s.qo_indptr_cpu, static_cast<size_t>(s.num_reqs + 1)}, s.num_reqs,
                                          num_speculative_tokens_ == 0, seq_lens_cpu_);
}

void FlashInferMetadataBuilder::adjust_seq_lens_for_dcp(StepPlan& s, const CommonAttentionMetadata&) {
  if (dcp_world_size_ <= 1) return;
  KVATTN_ASSERT(s.seq_lens_cpu != nullptr, "DCP needs host sequence lengths");
  // Other attention groups may reuse the same metadata: write our own copy.
  int32_t* out = seq_lens_cpu_.data_ptr<int32_t>();
  dcp_paged_kv_seq_lens(s.seq_lens_cpu, {s.qo_indptr_cpu, static_cast<size_t>(s.num_reqs + 1)}, s.num_reqs,
                        s.num_decodes, dcp_world_size_, dcp_rank_, dcp_kv_cache_interleave_size_, out);
  s.seq_lens_cpu = out;
}

void FlashInferMetadataBuilder::compute_paged_kv_metadata(StepPlan& s, const CommonAttentionMetadata& cm) {
  if (s.seq_lens_cpu == nullptr) return;
  if (s.use_cascade) {
    KVATTN_CHECK(s.common_prefix_len % page_size_ == 0,
                 "cascade attention: common_prefix_len {} must be a multiple of the page size {}", s.common_prefix_len,
                 page_size_);
    s.num_common_kv_blocks = s.common_prefix_len / page_size_;
  }
  const bool needs_native_paged_prefill = s.num_prefills > 0 && !s.prefill_use_trtllm;
  const bool needs_native_paged_decode = s.num_decodes > 0 && !s.decode_with_trtllm_api;
  if (!(s.use_cascade || needs_native_paged_prefill || needs_native_paged_decode)) return;

  // Pages (minus the cascade prefix), indptr and last-page lengths: the shared implementation.
  const int64_t col0 = s.num_common_kv_blocks;  // cascade: the unique level starts after the shared pages
  const int64_t width = cm.block_table_tensor.size(1);
  int32_t* indptr = paged_kv_indptr_.np<int32_t>();
  int32_t* last = paged_kv_last_page_len_.np<int32_t>();
  compute_paged_kv_indptr(s.seq_lens_cpu, s.num_reqs, page_size_, col0, width, paged_kv_indices_.size(0), indptr,
                          last);
  if (col0 > 0) {
    // kvattn's kernels take an empty unique level as kv length 0 (vLLM passes seq % page).
    for (int64_t r = 0; r < s.num_reqs; ++r)
      if (indptr[r + 1] == indptr[r]) last[r] = 0;
  }
  Tensor indptr_dev = paged_kv_indptr_.copy_to_gpu(s.num_reqs + 1);
  if (cm.block_table_tensor.device().is_cpu() && device_.is_cpu()) {
    gather_page_indices(paged_kv_indices_.data_ptr<int32_t>(), host_block_table(cm.block_table_tensor, "block_table_tensor"),
                        indptr, s.num_reqs, col0, /*num_blocks=*/0);
  } else {
    ops::copy_page_indices(paged_kv_indices_, cm.block_table_tensor.narrow(1, col0, width - col0), indptr_dev);
  }
  get_seq_lens({indptr, static_cast<size_t>(s.num_reqs + 1)}, {last, static_cast<size_t>(s.num_reqs)}, page_size_,
               {kv_lens_cpu_.data_ptr<int32_t>(), static_cast<size_t>(s.num_reqs)});
  paged_kv_last_page_len_.copy_to_gpu(s.num_reqs);
  s.has_paged_kv = true;
}

void FlashInferMetadataBuilder::plan_cascade(const StepPlan& s, const CommonAttentionMetadata& cm) {
  KVATTN_ASSERT(s.has_paged_kv, "cascade needs the paged metadata");
  if (window_left_ != -1)
    throw Unsupported(fmt::format("cascade attention has no sliding-window kernel (window_left={}); use "
                                  "common_prefix_len=0 for sliding-window models",
                                  window_left_));
  // Cascade has one query dtype for both phases (no fp8 KV / fp8 query).
  if (q_data_type_prefill_ != q_data_type_decode_ || dtype_is_fp8(kv_cache_dtype_))
    throw Unsupported("cascade attention needs one query dtype for prefill and decode and an unquantised KV cache");
  int32_t* qo = cascade_qo_indptr_.np<int32_t>();
  qo[0] = 0;
  qo[1] = static_cast<int32_t>(s.num_actual_tokens);
  cascade_qo_indptr_.copy_to_gpu(2);
  // The shared prefix: the first request's first pages (every request starts with them).
  Tensor shared = cm.block_table_tensor.select(0, 0).narrow(0, 0, s.num_common_kv_blocks);
  PagedKVView kv;
  kv.indptr_cpu = paged_kv_indptr_.cpu_rows(s.num_reqs + 1);
  kv.indptr = paged_kv_indptr_.gpu_rows(s.num_reqs + 1);
  kv.indices = paged_kv_indices_.narrow(0, 0, std::max<int64_t>(paged_kv_indptr_.np<int32_t>()[s.num_reqs], 1));
  kv.last_page_len_cpu = paged_kv_last_page_len_.cpu_rows(s.num_reqs);
  kv.last_page_len = paged_kv_last_page_len_.gpu_rows(s.num_reqs);
  kv.kv_lens_cpu = kv_lens_cpu_.narrow(0, 0, s.num_reqs);
  if (!cascade_wrapper_) cascade_wrapper_ = std::make_unique<CascadeWrapper>(layout_label(*layout_));
  cascade_wrapper_->plan(cm.query_start_loc.narrow(0, 0, s.num_reqs + 1), shared, kv,
                         plan_params(q_data_type_prefill_, true, num_qo_heads_));
  metadata_.cascade_wrapper = cascade_wrapper_.get();
}

void FlashInferMetadataBuilder::plan_prefill(const StepPlan& s, const CommonAttentionMetadata& cm) {
  const int64_t start = s.num_decodes, np = s.num_prefills;
  // Query offsets of the prefill rows, rebased to 0.
  int32_t* qo = qo_indptr_prefill_.np<int32_t>();
  for (int64_t r = 0; r <= np; ++r) qo[r] = s.qo_indptr_cpu[start + r] - s.qo_indptr_cpu[start];
  Tensor qo_dev = qo_indptr_prefill_.copy_to_gpu(np + 1);
  Tensor qo_cpu = qo_indptr_prefill_.cpu_rows(np + 1);
  if (s.prefill_use_trtllm) {
    plan_trtllm_prefill(s, cm);
    return;
  }
  KVATTN_ASSERT(s.has_paged_kv, "native prefill needs the paged metadata");
  // Paged metadata of the prefill rows (indptr rebased to 0; indices shared).
  const int32_t* indptr = paged_kv_indptr_.np<int32_t>();
  int32_t* pin = paged_kv_indptr_prefill_.np<int32_t>();
  for (int64_t r = 0; r <= np; ++r) pin[r] = indptr[start + r] - indptr[start];
  PagedKVView kv;
  kv.indptr_cpu = paged_kv_indptr_prefill_.cpu_rows(np + 1);
  kv.indptr = paged_kv_indptr_prefill_.copy_to_gpu(np + 1);
  kv.indices = paged_kv_indices_.narrow(0, indptr[start], std::max<int64_t>(pin[np], 1));
  kv.last_page_len_cpu = paged_kv_last_page_len_.cpu_rows(s.num_reqs).narrow(0, start, np);
  kv.last_page_len = paged_kv_last_page_len_.gpu_rows(s.num_reqs).narrow(0, start, np);
  kv.kv_lens_cpu = kv_lens_cpu_.narrow(0, start, np);
  AttentionPlanParams params = plan_params(q_data_type_prefill_, s.causal, num_qo_heads_);
  params.fixed_split_size = prefill_fixed_split_size_;
  const std::string layout = layout_label(*layout_);
  if (!s.causal) {
    KVATTN_ASSERT(dcp_world_size_ == 1, "non-causal DCP was rejected in decide_dispatch");
    if (!noncausal_prefill_wrapper_)
      noncausal_prefill_wrapper_ = std::make_unique<BatchPrefillWrapper>(layout, max_num_reqs_, plan_capacity_);
    noncausal_prefill_wrapper_->plan(qo_cpu, qo_dev, kv, params, config_.num_sms);
    metadata_.prefill = FIPrefill{noncausal_prefill_wrapper_.get(), nullptr};
    return;
  }
  if (dcp_world_size_ > 1) {
    if (!dcp_prefill_wrapper_)
      dcp_prefill_wrapper_ = std::make_unique<BatchDCPPrefillWrapper>(
          layout, dcp_a2a_, max_num_reqs_, max_num_batched_tokens_, plan_capacity_, qo_arange_.gpu(), device_);
    dcp_prefill_wrapper_->plan(qo_cpu, qo_dev, kv, params, dcp_world_size_, config_.num_sms);
    metadata_.prefill = FIPrefill{nullptr, dcp_prefill_wrapper_.get()};
    return;
  }
  if (!prefill_wrapper_) prefill_wrapper_ = std::make_unique<BatchPrefillWrapper>(layout, max_num_reqs_, plan_capacity_);
  prefill_wrapper_->plan(qo_cpu, qo_dev, kv, params, config_.num_sms);
  metadata_.prefill = FIPrefill{prefill_wrapper_.get(), nullptr};
}

void FlashInferMetadataBuilder::plan_trtllm_prefill(const StepPlan& s, const CommonAttentionMetadata& cm) {
  KVATTN_ASSERT(dcp_world_size_ == 1, "use_trtllm_attention never selects the trtllm prefill under DCP");
  const int64_t start = s.num_decodes, np = s.num_prefills;
  // Exact host lengths of the prefill rows: the upper bound is exact for them.
  const int32_t* seq = cm.seq_lens_cpu_upper_bound.defined()
                           ? host_i32(cm.seq_lens_cpu_upper_bound, s.num_reqs, "seq_lens_cpu_upper_bound")
                           : (cm.seq_lens.device().is_cpu() ? host_i32(cm.seq_lens, s.num_reqs, "seq_lens") : nullptr);
  if (seq == nullptr)
    throw Unsupported("trtllm prefill on a device batch needs seq_lens_cpu_upper_bound (kvattn computes the KV page "
                      "offsets on the host)");
  int32_t* cum = cum_seq_lens_kv_.np<int32_t>();
  cum[0] = 0;
  int64_t max_prefill_seq_len = 0;
  for (int64_t r = 0; r < np; ++r) {
    cum[r + 1] = cum[r] + static_cast<int32_t>(cdiv(seq[start + r], page_size_));
    max_prefill_seq_len = std::max<int64_t>(max_prefill_seq_len, seq[start + r]);
  }
  int64_t max_q_len = 0;
  for (int64_t r = 0; r < np; ++r)
    max_q_len = std::max<int64_t>(max_q_len, s.qo_indptr_cpu[start + r + 1] - s.qo_indptr_cpu[start + r]);
  Tensor block_tables = cm.block_table_tensor.narrow(0, start, np);
  if (!dtype_is_fp8(q_data_type_prefill_) && is_fp8(cache_dtype_)) {
    // The fp8 -> bf16 dequantisation allocates one page per table entry: keep only the columns used.
    const int64_t cols = std::min<int64_t>(cdiv(max_prefill_seq_len, page_size_), block_tables.size(1));
    block_tables = block_tables.narrow(1, 0, std::max<int64_t>(cols, 1));
  }
  TRTLLMPrefill p;
  p.block_tables = block_tables;
  p.seq_lens = cm.seq_lens.narrow(0, start, np);
  p.cum_seq_lens_q = qo_indptr_prefill_.gpu_rows(np + 1);
  p.cum_seq_lens_kv = cum_seq_lens_kv_.copy_to_gpu(np + 1);
  p.max_q_len = max_q_len;
  p.max_seq_len = cm.max_seq_len;
  trtllm_prefill_plan_->invalidate();
  p.plan = trtllm_prefill_plan_.get();
  metadata_.prefill = std::move(p);
}

void FlashInferMetadataBuilder::plan_decode(const StepPlan& s, const CommonAttentionMetadata& cm) {
  if (s.decode_with_trtllm_api)
    plan_trtllm_api_decode(s, cm);
  else
    plan_native_decode(s, cm);
}

void FlashInferMetadataBuilder::plan_trtllm_api_decode(const StepPlan& s, const CommonAttentionMetadata& cm) {
  KVATTN_ASSERT(decode_kernel_.has_value(), "trtllm-API decode without a kernel");
  const int64_t nd = s.num_decodes;
  FlashInferTrtllmAPIDecode d;
  d.kernel = *decode_kernel_;
  d.block_tables = cm.block_table_tensor.narrow(0, 0, nd);
  if (dcp_world_size_ > 1) {
    KVATTN_CHECK(cm.dcp_local_seq_lens.defined() && cm.dcp_local_seq_lens.size(0) >= nd,
                 "FlashInferMetadataBuilder.build: DCP decode needs CommonAttentionMetadata.dcp_local_seq_lens");
    d.seq_lens = cm.dcp_local_seq_lens.narrow(0, 0, nd);
  } else {
    d.seq_lens = cm.seq_lens.narrow(0, 0, nd);
  }
  const std::span<const int32_t> qo{s.qo_indptr_cpu, static_cast<size_t>(s.num_reqs + 1)};
  const auto q = compute_decode_query_lens(qo, nd, s.num_decode_tokens);
  d.q_len_per_req = q.q_len_per_req;
  if (q.ragged) d.q_cu_seq_lens = cm.query_start_loc.narrow(0, 0, nd + 1);
  if (use_xqa_) {
    d.mask = get_decode_mask(q.q_len_per_req, q.ragged, qo, nd, s.causal);
  } else if (use_trtllm_gen_varlen_decode_) {
    // Host query lengths may underestimate: a safe upper bound, device offsets always.
    d.q_len_per_req = std::min<int64_t>(cm.max_query_len, reorder_batch_threshold_.value_or(1));
    d.q_cu_seq_lens = cm.query_start_loc.narrow(0, 0, nd + 1);
  }
  d.max_seq_len = cm.max_seq_len;
  if (dcp_world_size_ > 1) d.dcp_query_start_loc = cm.query_start_loc.narrow(0, 0, nd + 1);
  d.qo_indptr = cm.query_start_loc.narrow(0, 0, nd + 1);
  trtllm_decode_plan_->invalidate();
  d.plan = trtllm_decode_plan_.get();
  metadata_.decode = std::move(d);
}

Tensor FlashInferMetadataBuilder::get_decode_mask(int64_t q_len_per_req, bool ragged, std::span<const int32_t> qo,
                                                  int64_t num_decodes, bool causal) {
  if (q_len_per_req <= 1) return Tensor();
  KVATTN_CHECK(q_len_per_req <= mask_words_ * 32,
               "XQA draft mask: query length {} exceeds the planned maximum {} (reorder_batch_threshold)",
               q_len_per_req, mask_words_ * 32);
  if (!ragged) {
    // Persistent per (q_len, causal), mask_words_ wide: a stable address for CUDA graphs.
    return decode_mask_cache_->uniform_rows(q_len_per_req, num_decodes, causal);
  }
  const int64_t rows = qo[num_decodes];
  if (!device_.is_cpu())
    throw Unsupported("XQA ragged draft masks are built on the host; their upload to a CUDA device is not implemented");
  int32_t* p = ragged_mask_.data_ptr<int32_t>();
  for (int64_t r = 0; r < num_decodes; ++r)
    fill_xqa_draft_mask_rows(reinterpret_cast<uint32_t*>(p + qo[r] * mask_words_), mask_words_, qo[r + 1] - qo[r], causal);
  return ragged_mask_.narrow(0, 0, rows);
}

BatchDecodeWrapper& FlashInferMetadataBuilder::get_decode_wrapper(int64_t batch_size, bool use_cudagraph) {
  const std::string layout = layout_label(*layout_);
  if (use_cudagraph) {
    auto& w = decode_wrappers_cudagraph_[batch_size];  // one plan per graph batch size
    if (!w) w = std::make_unique<BatchDecodeWrapper>(layout, true, batch_size, plan_capacity_, qo_arange_.gpu());
    return *w;
  }
  if (!decode_wrapper_)
    decode_wrapper_ = std::make_unique<BatchDecodeWrapper>(layout, false, max_num_reqs_, plan_capacity_, qo_arange_.gpu());
  return *decode_wrapper_;
}

void FlashInferMetadataBuilder::plan_native_decode(const StepPlan& s, const CommonAttentionMetadata& cm) {
  KVATTN_ASSERT(s.has_paged_kv, "native decode needs the paged metadata");
  const bool pure_decode = s.num_prefills == 0;
  const bool use_cudagraph = enable_cuda_graph_ && pure_decode && s.num_decode_tokens <= decode_cudagraph_max_bs_;
  const int64_t num_input_tokens = s.num_decode_tokens;
  // The native decode kernel reads one query row per request: the first num_decode_tokens
  // requests are single-token (zero-length graph padding only at the end).
  // Bounds first: qo_indptr_cpu has num_reqs + 1 entries.
  KVATTN_CHECK(num_input_tokens >= 0 && num_input_tokens <= s.num_decodes && s.num_decodes <= s.num_reqs,
               "native decode: the {} decode requests must hold one query token each (padding at the end), but "
               "they hold {} tokens; check max_query_len and query_start_loc",
               s.num_decodes, num_input_tokens);
  KVATTN_CHECK(s.qo_indptr_cpu[num_input_tokens] == num_input_tokens,
               "native decode: the {} decode requests must hold one query token each (padding at the end); "
               "query_start_loc[{}] = {}",
               s.num_decodes, num_input_tokens, s.qo_indptr_cpu[num_input_tokens]);
  BatchDecodeWrapper& wrapper = get_decode_wrapper(num_input_tokens, use_cudagraph);
  PagedKVView kv;
  kv.indptr_cpu = paged_kv_indptr_.cpu_rows(num_input_tokens + 1);
  kv.indptr = paged_kv_indptr_.gpu_rows(num_input_tokens + 1);
  kv.indices = paged_kv_indices_.narrow(0, 0, std::max<int64_t>(paged_kv_indptr_.np<int32_t>()[num_input_tokens], 1));
  kv.last_page_len_cpu = paged_kv_last_page_len_.cpu_rows(num_input_tokens);
  kv.last_page_len = paged_kv_last_page_len_.gpu_rows(num_input_tokens);
  kv.kv_lens_cpu = kv_lens_cpu_.narrow(0, 0, num_input_tokens);
  AttentionPlanParams params = plan_params(q_data_type_decode_, true, num_qo_heads_ * dcp_world_size_);
  params.fixed_split_size = decode_fixed_split_size_;
  fast_plan_decode(wrapper, kv, params, config_.num_sms);
  metadata_.decode = FIDecode{&wrapper};
  if (use_cudagraph) metadata_.cudagraph_batch_size = num_input_tokens;
}

bool FlashInferMetadataBuilder::use_cascade_attention(int64_t, std::span<const int32_t>, int64_t, int64_t, bool, bool,
                                                      bool, int64_t, int64_t) const {
  // The cascade wrapper needs the KV dtype to equal the query dtype; and, as in the seed,
  // cascade is never chosen automatically (callers may still pass common_prefix_len > 0).
  if (kv_cache_spec_->dtype() != config_.model_dtype) return false;
  return false;
}

}  // namespace kvattn
