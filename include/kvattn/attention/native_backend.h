// kvattn/attention/native_backend.h — kvattn's native attention backend, with the contract of
// vLLM's FlashInfer backend (seed 004): FlashInferBackend (traits), FlashInferMetadataBuilder
// (per-step plan), FlashInferImpl (KV-cache update + forward).
//
// The seed chooses between NVIDIA-only kernels (XQA on SM90/SM12x, trtllm-gen on SM100, NVFP4
// KV); kvattn keeps that decision structure and the metadata each path carries, and runs every
// path on its own kernels (kvattn/ops): FlashInfer-native paths read paged indices, the
// trtllm-API paths read block tables (+ XQA draft masks), the cascade and DCP paths compose
// paged attention with merge_attn_states.  NVFP4 has no kvattn kernel: Unsupported with the
// reason.  See src/attention/DESIGN.md, section "Backend".
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "kvattn/attention/attention_impl.h"
#include "kvattn/attention/backend.h"
#include "kvattn/attention/metadata_builder.h"
#include "kvattn/attention/native_plan.h"
#include "kvattn/attention/per_layer_parameters.h"
#include "kvattn/attention/xqa_mask.h"
#include "kvattn/batch/cpu_gpu_buffer.h"

namespace kvattn {

// ---------------------------------------------------------------------------------------
class FlashInferBackend final : public AttentionBackend {
 public:
  std::string get_name() const override { return "FLASHINFER"; }
  std::vector<KVCacheDType> supported_kv_cache_dtypes() const override;
  // nvfp4*: only with the SM100 trtllm-gen path — and kvattn has no NVFP4 kernel, so never.
  bool supports_kv_cache_dtype(KVCacheDType kv_cache_dtype, const BackendConfig& config) const override;
  // [16, 32, 64]; [16 .. 1024] when GQA on SM100 with trtllm-gen usable.
  std::vector<KernelBlockSize> get_supported_kernel_block_sizes(const KVCacheSpec* spec,
                                                                const BackendConfig& config) const override;
  std::vector<int64_t> get_supported_head_sizes() const override { return {64, 128, 256, 512}; }
  std::shared_ptr<const AttentionSpec> customize_spec(const std::shared_ptr<const AttentionSpec>& spec,
                                                      const BackendConfig& config) const override;
  std::optional<LayoutList> supported_kv_cache_layouts(const BackendConfig& config) const override;
  bool supports_compute_capability(const std::optional<DeviceCapability>& cap) const override;
  bool supports_sink(const BackendConfig& config) const override;
  bool supports_sliding_window() const override { return true; }
  bool supports_non_causal() const override { return true; }
  bool supports_dcp() const override { return true; }
  bool supports_device_cpu_query_lens_mismatch(const BackendConfig& config) const override;
  bool forward_includes_kv_cache_update() const override { return false; }
  AttentionCGSupport get_cudagraph_support(const BackendConfig& config,
                                           const KVCacheSpecPtr& kv_cache_spec) const override;
  std::optional<int64_t> get_varlen_cudagraph_max_query_len(const BackendConfig& config,
                                                            const KVCacheSpecPtr& kv_cache_spec) const override;
  std::unique_ptr<AttentionMetadataBuilder> make_builder(std::shared_ptr<const AttentionSpec> kv_cache_spec,
                                                         std::vector<std::string> layer_names,
                                                         const BackendConfig& config) const override;
  std::shared_ptr<AttentionImpl> make_impl(const AttentionImplParams& params,
                                           const BackendConfig& config) const override;

  // fp8 / fp8_e4m3 -> fp8_e4m3, fp8_e5m2 -> fp8_e5m2, nvfp4 -> u8; else InvalidArgument.
  static DType get_dtype_for_flashinfer(KVCacheDType kv_cache_dtype);
};

// ---------------------------------------------------------------------------------------
// Metadata.
enum class FlashInferDecodeKernel : uint8_t { XQA, TRTLLM_GEN };
const char* decode_kernel_name(FlashInferDecodeKernel k) noexcept;  // "xqa", "trtllm-gen"

// The native prefill pathway (paged indices); `dcp` set instead of `wrapper` under DCP.
struct FIPrefill {
  const BatchPrefillWrapper* wrapper = nullptr;
  const BatchDCPPrefillWrapper* dcp = nullptr;
};

// The native decode pathway (paged indices).
struct FIDecode {
  const BatchDecodeWrapper* wrapper = nullptr;
};

// The trtllm prefill pathway (block tables).
struct TRTLLMPrefill {
  Tensor block_tables;    // [num_prefills, max_num_blocks_per_seq] int32 device
  Tensor seq_lens;        // [num_prefills] int32 device
  Tensor cum_seq_lens_q;  // [num_prefills + 1] int32 device, starting at 0
  Tensor cum_seq_lens_kv; // [num_prefills + 1] int32 device: cumulative KV pages
  int64_t max_q_len = 0;
  int64_t max_seq_len = 0;
  ops::PagedAttentionPlan* plan = nullptr;  // the builder's kept kernel plan for this step's layers
};

// XQA / trtllm-gen decode (block tables).
struct FlashInferTrtllmAPIDecode {
  FlashInferDecodeKernel kernel = FlashInferDecodeKernel::TRTLLM_GEN;
  Tensor block_tables;   // [num_decodes, max_num_blocks_per_seq] int32 device
  Tensor seq_lens;       // [num_decodes] int32 device (DCP: this rank's local lengths)
  int64_t max_seq_len = 0;
  int64_t q_len_per_req = 1;  // uniform speculative decode width
  Tensor q_cu_seq_lens;  // optional [num_decodes + 1] int32 device: ragged query offsets
  Tensor mask;           // optional [decode rows, P] int32: packed XQA draft mask (32 keys/word)
  Tensor dcp_query_start_loc;  // optional [num_decodes + 1] int32 device (DCP)
  // kvattn: the query rows of each decode request as its kernel reads them (query_start_loc
  // [:num_decodes + 1]); covers uniform, ragged and CUDA-graph-padded (zero-length) rows alike.
  Tensor qo_indptr;
  ops::PagedAttentionPlan* plan = nullptr;  // the builder's kept kernel plan for this step's layers
};

class FlashInferMetadata final : public AttentionMetadata {
 public:
  const char* backend_name() const noexcept override { return "FLASHINFER"; }

  KVCacheLayout kv_cache_layout = KVCacheLayout::LBNHC;
  int64_t num_actual_tokens = 0;  // excluding padding
  Tensor slot_mapping;            // [num_actual_tokens] int64
  DType q_data_type_prefill = DType::bf16;
  DType q_data_type_decode = DType::bf16;
  int64_t num_decodes = 0;
  int64_t num_decode_tokens = 0;
  int64_t num_prefills = 0;
  int64_t num_prefill_tokens = 0;
  bool causal = true;
  int64_t dcp_world_size = 1;  // DCP ranks the plans were made for (the impl's group must match)
  // Set when num_prefill_tokens > 0 / num_decode_tokens > 0 (monostate otherwise).
  std::variant<std::monostate, FIPrefill, TRTLLMPrefill> prefill;
  std::variant<std::monostate, FIDecode, FlashInferTrtllmAPIDecode> decode;
  // Cascade: the whole batch is one cascade call; prefill and decode stay empty.
  bool use_cascade = false;
  const CascadeWrapper* cascade_wrapper = nullptr;
  // Query rows per uniform decode request when the native decode path runs under a CUDA graph
  // (1); 0 otherwise.  (Diagnostics: which graph batch size's plan was used.)
  int64_t cudagraph_batch_size = 0;
};

// ---------------------------------------------------------------------------------------
class FlashInferMetadataBuilder final : public AttentionMetadataBuilder {
 public:
  // Sizes every persistent buffer from config (max_num_seqs, max_model_len,
  // max_num_batched_tokens) and resolves the static decisions (query dtypes, decode kernel,
  // reorder threshold, global hyperparameters).  Throws InvalidArgument / Unsupported with the
  // reason for configurations the seed rejects at construction.
  FlashInferMetadataBuilder(std::shared_ptr<const AttentionSpec> kv_cache_spec, std::vector<std::string> layer_names,
                            const BackendConfig& config);
  ~FlashInferMetadataBuilder() override;

  const FlashInferMetadata& build(int64_t common_prefix_len, const CommonAttentionMetadata& cm,
                                  bool fast_build = false) override;
  bool use_cascade_attention(int64_t common_prefix_len, std::span<const int32_t> query_lens,
                             int64_t num_query_heads, int64_t num_kv_heads, bool use_alibi,
                             bool use_sliding_window, bool use_local_attention, int64_t num_sms,
                             int64_t dcp_world_size) const override;

  // ---- resolved decisions (read by tests and the impl) --------------------------------
  KVCacheLayout kv_cache_layout() const;
  DType get_q_data_type(bool is_prefill) const;
  DType q_data_type_prefill() const noexcept { return q_data_type_prefill_; }
  DType q_data_type_decode() const noexcept { return q_data_type_decode_; }
  std::optional<FlashInferDecodeKernel> decode_kernel() const noexcept { return decode_kernel_; }
  bool use_trtllm_decode_attention() const noexcept { return use_trtllm_decode_attention_; }
  bool use_xqa() const noexcept { return use_xqa_; }
  bool use_trtllm_gen_varlen_decode() const noexcept { return use_trtllm_gen_varlen_decode_; }
  bool use_dcp() const noexcept { return dcp_world_size_ > 1; }
  int64_t num_qo_heads() const noexcept { return num_qo_heads_; }
  KVCacheDType cache_dtype() const noexcept { return cache_dtype_; }
  DType kv_cache_dtype() const noexcept { return kv_cache_dtype_; }
  const PerLayerParameters& global_hyperparameters() const noexcept { return global_; }
  // max(flashinfer_workspace_buffer_size, max_num_batched_tokens * heads * head_dim * 16).
  int64_t workspace_size() const;
  const Tensor& workspace_buffer();  // allocated on first use (u8, on the device)
  void set_workspace_buffer(const Tensor& workspace);
  // Number of decode wrappers planned for CUDA graphs so far (one per graph batch size).
  size_t num_cudagraph_decode_wrappers() const noexcept { return decode_wrappers_cudagraph_.size(); }

  // ---- static helpers (seed's staticmethods) ---------------------------------------------
  static bool uses_trtllm_gen_varlen_decode(const BackendConfig& config,
                                            std::optional<FlashInferDecodeKernel> kernel, bool use_dcp);
  // XQA on SM90 / SM12x, TRTLLM_GEN on the SM100 family; nullopt elsewhere.
  static std::optional<FlashInferDecodeKernel> get_flashinfer_trtllm_api_decode_kernel(const BackendConfig& config);

  // The effective decode query width: (q_len_per_req, ragged offsets?, ragged lengths?).
  struct DecodeQueryLens {
    int64_t q_len_per_req = 1;
    bool ragged = false;  // q_cu_seq_lens = query_start_loc[:num_decodes + 1]
  };
  DecodeQueryLens compute_decode_query_lens(std::span<const int32_t> qo_indptr_cpu, int64_t num_decodes,
                                            int64_t num_decode_tokens) const;

 private:
  struct StepPlan;  // the per-step decisions of build(), see the .cpp
  void decide_dispatch(StepPlan& s, int64_t common_prefix_len, const CommonAttentionMetadata& cm);
  void validate_step(const StepPlan& s) const;
  void init_output_metadata(const StepPlan& s, const CommonAttentionMetadata& cm);
  void compute_host_seq_lens(StepPlan& s, const CommonAttentionMetadata& cm);
  void adjust_seq_lens_for_dcp(StepPlan& s, const CommonAttentionMetadata& cm);
  void compute_paged_kv_metadata(StepPlan& s, const CommonAttentionMetadata& cm);
  void plan_cascade(const StepPlan& s, const CommonAttentionMetadata& cm);
  void plan_prefill(const StepPlan& s, const CommonAttentionMetadata& cm);
  void plan_decode(const StepPlan& s, const CommonAttentionMetadata& cm);
  void plan_trtllm_prefill(const StepPlan& s, const CommonAttentionMetadata& cm);
  void plan_trtllm_api_decode(const StepPlan& s, const CommonAttentionMetadata& cm);
  void plan_native_decode(const StepPlan& s, const CommonAttentionMetadata& cm);
  Tensor get_decode_mask(int64_t q_len_per_req, bool ragged, std::span<const int32_t> qo_indptr_cpu,
                         int64_t num_decodes, bool causal);
  BatchDecodeWrapper& get_decode_wrapper(int64_t batch_size, bool use_cudagraph);
  AttentionPlanParams plan_params(DType q_dtype, bool causal, int64_t num_qo_heads) const;

  // ---- static configuration -----------------------------------------------------------
  int64_t num_speculative_tokens_ = 0;
  int64_t decode_fixed_split_size_ = -1, prefill_fixed_split_size_ = -1;
  bool disable_split_kv_ = false;
  int64_t max_num_reqs_ = 0, max_num_pages_ = 0, max_num_batched_tokens_ = 0;
  bool enable_cuda_graph_ = false;
  int64_t decode_cudagraph_max_bs_ = 0;
  int64_t dcp_world_size_ = 1, dcp_rank_ = 0, dcp_kv_cache_interleave_size_ = 1;
  bool dcp_a2a_ = false;
  int64_t num_qo_heads_ = 0, num_kv_heads_ = 0, head_dim_ = 0, page_size_ = 0;
  KVCacheDType cache_dtype_ = KVCacheDType::Auto;
  bool is_kvcache_nvfp4_ = false;
  DType kv_cache_dtype_ = DType::bf16;
  DType q_data_type_prefill_ = DType::bf16, q_data_type_decode_ = DType::bf16;
  bool use_trtllm_decode_attention_ = false;
  std::optional<FlashInferDecodeKernel> decode_kernel_;
  bool use_xqa_ = false, use_trtllm_gen_varlen_decode_ = false;
  PerLayerParameters global_;
  double sm_scale_ = 1.0;
  int64_t window_left_ = -1;
  double logits_soft_cap_ = 0.0;
  bool has_sinks_ = false;
  Device device_;

  // ---- persistent buffers (sized at construction) ---------------------------------------
  CpuGpuBuffer paged_kv_indptr_;         // [max_num_reqs + 1] int32
  Tensor paged_kv_indices_;              // [max_num_pages] int32 device
  CpuGpuBuffer paged_kv_last_page_len_;  // [max_num_reqs] int32
  Tensor kv_lens_cpu_;                   // [max_num_reqs] int32 host (get_seq_lens)
  Tensor seq_lens_cpu_;                  // [max_num_reqs] int32 host (exact / DCP-adjusted)
  CpuGpuBuffer qo_indptr_prefill_;       // [max_num_reqs + 1] int32: prefill rows rebased to 0
  CpuGpuBuffer qo_arange_;               // [max(max_num_reqs, tokens) + 1] int32 = 0, 1, 2, ...
  CpuGpuBuffer paged_kv_indptr_prefill_; // [max_num_reqs + 1] int32: prefill rows' indptr rebased to 0
  CpuGpuBuffer cum_seq_lens_kv_;         // [max_num_reqs + 1] int32 (trtllm prefill)
  CpuGpuBuffer cascade_qo_indptr_;       // [2] int32: [0, num_actual_tokens]
  Tensor ragged_mask_;                   // [max_num_batched_tokens, P] int32 (XQA ragged)
  int64_t mask_words_ = 0;               // P = cdiv(max decode query length, 32)
  std::optional<KVCacheLayout> layout_;  // resolved on first use
  std::optional<XqaDecodeMaskCache> decode_mask_cache_;  // uniform XQA masks (mask_words_ wide), XQA only
  Tensor workspace_;
  int64_t plan_capacity_ = 0;
  // the CUDA kernels' plans of the trtllm-API paths, kept across a step's layers (invalidated by
  // every build(); the native paths' wrappers keep their own)
  std::unique_ptr<ops::PagedAttentionPlan> trtllm_decode_plan_ = std::make_unique<ops::PagedAttentionPlan>();
  std::unique_ptr<ops::PagedAttentionPlan> trtllm_prefill_plan_ = std::make_unique<ops::PagedAttentionPlan>();

  std::unique_ptr<BatchPrefillWrapper> prefill_wrapper_, noncausal_prefill_wrapper_;
  std::unique_ptr<BatchDCPPrefillWrapper> dcp_prefill_wrapper_;
  std::unique_ptr<BatchDecodeWrapper> decode_wrapper_;
  std::map<int64_t, std::unique_ptr<BatchDecodeWrapper>> decode_wrappers_cudagraph_;
  std::unique_ptr<CascadeWrapper> cascade_wrapper_;

  FlashInferMetadata metadata_;
};

// ---------------------------------------------------------------------------------------
class FlashInferImpl final : public AttentionImpl {
 public:
  FlashInferImpl(const AttentionImplParams& params, const BackendConfig& config);

  bool can_return_lse_for_decode() const override { return true; }
  bool supports_dcp() const override { return true; }
  bool supports_quant_query_input() const override { return supports_quant_query_input_; }
  double scale() const override { return scale_; }
  int64_t window_left() const override { return window_left_; }
  std::optional<double> logits_soft_cap() const override { return logits_soft_cap_; }
  bool has_sinks() const override { return sinks_source_.defined(); }
  int64_t num_heads() const override { return num_heads_; }
  int64_t num_kv_heads() const override { return num_kv_heads_; }
  int64_t head_size() const override { return head_size_; }
  const std::optional<std::string>& kv_sharing_target_layer_name() const override {
    return kv_sharing_target_layer_name_;
  }
  const Tensor& sinks() const noexcept { return sinks_; }  // [num_heads] f32 after loading

  // kvattn has no fused attention+output-quant kernel: always false.
  bool fused_output_quant_supported() const { return false; }
  void process_weights_after_loading(DType act_dtype) override;
  // Quantise a [T, H, D] query to fp8 (x / q_scale, saturating) when q_data_type is fp8 and
  // the query is not; returns the query unchanged otherwise.
  Tensor maybe_quant_query(const Tensor& query, DType q_data_type, double q_scale) const;

  Tensor forward(const AttentionLayer& layer, const Tensor& query, const Tensor& key, const Tensor& value,
                 const Tensor& kv_cache, const AttentionMetadata* metadata, const Tensor& output,
                 const Tensor& output_scale = Tensor(), const Tensor& output_block_scale = Tensor()) override;
  void do_kv_cache_update(const AttentionLayer& layer, const Tensor& key, const Tensor& value,
                          const Tensor& kv_cache, const Tensor& slot_mapping) override;

 private:
  // The layer's [B, H, N, 2D] view -> (k_cache, v_cache) [B, N, H, D] views in the cache dtype.
  std::pair<Tensor, Tensor> split_kv(const Tensor& kv_cache) const;
  void run_prefill(const FlashInferMetadata& md, const AttentionLayer& layer, const Tensor& query,
                   const Tensor& key, const Tensor& value, const Tensor& k_cache, const Tensor& v_cache,
                   const Tensor& output) const;
  // Decode rows [0, num_decode_tokens): the kernels read each request's rows through
  // query_start_loc, so CUDA-graph padding rows need no special query width.
  void run_decode(const FlashInferMetadata& md, const AttentionLayer& layer, const Tensor& query,
                  const Tensor& k_cache, const Tensor& v_cache, const Tensor& output) const;
  AttentionRunArgs run_args(const AttentionLayer& layer, DType q_dtype) const;
  // The layer's attention options (window, soft cap, scale, sinks) for one kernel call.
  ops::AttentionOptions layer_options(bool causal, double q_scale) const;

  int64_t num_heads_, head_size_, num_kv_heads_;
  double scale_;
  int64_t window_left_ = -1;
  std::optional<double> logits_soft_cap_;
  KVCacheDType cache_dtype_;
  bool is_kvcache_nvfp4_ = false;
  std::optional<std::string> kv_sharing_target_layer_name_;
  Tensor sinks_source_, sinks_;
  bool supports_quant_query_input_ = false;
  bool dcp_a2a_ = false;
};

}  // namespace kvattn
