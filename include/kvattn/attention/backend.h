// kvattn/attention/backend.h — what an attention backend declares about itself (vLLM's
// vllm/v1/attention/backend.py `AttentionBackend`, vllm-facts §4.1–§4.2), the configuration it
// is checked against, and the NVIDIA kernel-availability rules the FlashInfer backend's
// decisions read (vllm/utils/flashinfer.py, vllm-facts §7.7).
//
// A backend is a stateless object of traits plus three factories (metadata builder, impl).
// `validate_configuration` returns the *list of reasons* a configuration is rejected (empty =
// accepted), so the selector (backend_registry.h) can print why each backend was taken or not.
//
// The platform is data, not a global: `AttentionPlatform::capability` is the CUDA compute
// capability (nullopt = CPU).  Tests simulate SM90 / SM100 on CPU tensors to exercise the
// seed's decision structure (XQA, trtllm-gen) with kvattn's own kernels.
#pragma once

#include <compare>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvattn/core/device.h"
#include "kvattn/core/dtype.h"
#include "kvattn/core/kv_cache_dtype.h"
#include "kvattn/kv/block_size.h"
#include "kvattn/kv/kv_cache_layout.h"
#include "kvattn/kv/kv_cache_spec.h"

namespace kvattn {

class AttentionMetadataBuilder;  // metadata_builder.h
class AttentionImpl;             // attention_impl.h
struct AttentionImplParams;      // attention_impl.h
class LayerRegistry;             // attention_impl.h

// ---------------------------------------------------------------------------------------
// §4.1 enums.
enum class AttentionType : uint8_t { DECODER, ENCODER, ENCODER_ONLY, ENCODER_DECODER };
const char* attention_type_name(AttentionType t) noexcept;  // "decoder", ...

// How much of a step a backend lets CUDA graphs capture (cascade is never captured).
enum class AttentionCGSupport : uint8_t {
  NEVER = 0,
  UNIFORM_SINGLE_TOKEN_DECODE = 1,  // only query_len == 1 batches
  UNIFORM_BATCH = 2,                // all query lengths equal (spec decode: 1 + num_spec)
  ALWAYS = 3,                       // mixed prefill/decode
};
const char* attention_cg_support_name(AttentionCGSupport s) noexcept;

// ---------------------------------------------------------------------------------------
// Platform.
struct DeviceCapability {
  int major = 0;
  int minor = 0;
  int to_int() const noexcept { return major * 10 + minor; }  // 9.0 -> 90
  std::string str() const;                                     // "9.0"
  friend auto operator<=>(const DeviceCapability&, const DeviceCapability&) = default;
};

struct AttentionPlatform {
  Device device = Device::cpu();
  // CUDA compute capability; nullopt on CPU (no NVIDIA kernel family applies).
  std::optional<DeviceCapability> capability;
  // vLLM's supports_trtllm_attention also needs NVIDIA's artifactory kernels; kvattn routes
  // those paths to its own kernels, so this stays true unless a test switches it off.
  bool has_trtllm_kernels = true;

  bool is_device_capability(int cap) const noexcept {  // exact, e.g. 90
    return capability && capability->to_int() == cap;
  }
  bool is_device_capability_family(int family) const noexcept {  // 100 -> major 10
    return capability && capability->major == family / 10;
  }
  std::string str() const;  // "cpu" or "cuda sm90"
};

// ---------------------------------------------------------------------------------------
// The slice of vLLM's VllmConfig the backend reads (model, scheduler, speculative, parallel,
// cache, compilation and attention configs, flattened).
struct AttentionConfig {
  std::optional<bool> use_trtllm_attention;  // None = auto, True = force, False = never
  bool disable_flashinfer_q_quantization = false;
  bool use_non_causal = false;
};

struct BackendConfig {
  AttentionPlatform platform;
  // model
  DType model_dtype = DType::bf16;
  int64_t num_attention_heads = 0;  // per rank (get_num_attention_heads(parallel_config))
  int64_t num_kv_heads = 0;         // per rank
  int64_t head_size = 0;
  int64_t max_model_len = 0;
  // scheduler
  int64_t max_num_seqs = 0;
  int64_t max_num_batched_tokens = 0;
  // speculative decoding (num_speculative_tokens nullopt = no speculative config)
  std::optional<int64_t> num_speculative_tokens;
  bool parallel_drafting = false;
  bool enable_adaptive_verification = false;
  // parallel (decode context parallel)
  int64_t decode_context_parallel_size = 1;
  int64_t dcp_rank = 0;
  int64_t cp_kv_cache_interleave_size = 1;
  std::string dcp_comm_backend = "ag_rs";  // "ag_rs" | "a2a"
  // cache
  KVCacheDType cache_dtype = KVCacheDType::Auto;  // vLLM cache_config.cache_dtype
  CacheConfig cache_config;          // resolved kv_cache_layout
  // compilation
  bool cudagraph_decode_full = false;  // compilation_config.cudagraph_mode.decode_mode() == FULL
  std::optional<int64_t> max_cudagraph_capture_size;
  // misc
  bool batch_invariant = false;  // VLLM_BATCH_INVARIANT
  AttentionConfig attention_config;
  // VLLM_FLASHINFER_WORKSPACE_BUFFER_SIZE: the floor of the workspace size rule.
  int64_t flashinfer_workspace_buffer_size = 394LL * 1024 * 1024;
  // Streaming multiprocessors (CUDA) or worker threads (CPU) the planner partitions work for.
  int64_t num_sms = 132;
  // Per-layer attention modules (vLLM's static forward context); not owned.
  const LayerRegistry* layers = nullptr;

  // Throws InvalidArgument naming the first bad field.
  void validate() const;
};

// vLLM max_decode_query_len: 1 + (2 if parallel_drafting else 1) * num_speculative_tokens,
// 1 without speculative decoding.
int64_t max_decode_query_len(const BackendConfig& config);

// ---------------------------------------------------------------------------------------
// NVIDIA kernel availability (vllm/utils/flashinfer.py), evaluated on `platform`.
bool supports_trtllm_attention(const BackendConfig& config, bool is_prefill);
std::optional<bool> force_use_trtllm_attention(const BackendConfig& config);
bool can_use_trtllm_attention(const BackendConfig& config, int64_t num_qo_heads, int64_t num_kv_heads,
                              bool is_prefill = false);
bool use_trtllm_attention(const BackendConfig& config, int64_t num_qo_heads, int64_t num_kv_heads,
                          int64_t num_tokens, int64_t max_seq_len, int64_t dcp_world_size,
                          KVCacheDType kv_cache_dtype, DType q_dtype, bool is_prefill,
                          std::optional<bool> force_use_trtllm, bool has_sinks, bool has_spec);

// ---------------------------------------------------------------------------------------
// What the selector checks (vLLM validate_configuration's arguments).
struct AttentionSelectorConfig {
  int64_t head_size = 128;
  DType dtype = DType::bf16;
  KVCacheDType kv_cache_dtype = KVCacheDType::Auto;
  std::optional<int64_t> block_size;  // nullopt = not decided yet
  bool use_mla = false;
  bool has_sink = false;
  bool use_sparse = false;
  bool use_mm_prefix = false;
  bool use_per_head_quant_scales = false;
  AttentionType attn_type = AttentionType::DECODER;
  bool has_sliding_window = false;
  bool use_non_causal = false;
  bool use_batch_invariant = false;
  bool use_kv_connector = false;
  bool use_pcp = false;
  bool use_adaptive_verification = false;
  bool use_dcp = false;
  std::string str() const;  // one line for logs
};

// ---------------------------------------------------------------------------------------
class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;

  virtual std::string get_name() const = 0;

  // ---- dtypes -----------------------------------------------------------------------
  virtual std::vector<DType> supported_dtypes() const { return {DType::f16, DType::bf16}; }
  virtual std::vector<KVCacheDType> supported_kv_cache_dtypes() const {
    return {KVCacheDType::Auto, KVCacheDType::Float16, KVCacheDType::BFloat16};
  }
  bool supports_dtype(DType dtype) const;
  // In supported_kv_cache_dtypes() (an empty list accepts all).
  virtual bool supports_kv_cache_dtype(KVCacheDType kv_cache_dtype, const BackendConfig& config) const;

  // ---- geometry -----------------------------------------------------------------------
  // Default [MultipleOf(1)].  `spec` may be null.
  virtual std::vector<KernelBlockSize> get_supported_kernel_block_sizes(const KVCacheSpec* spec,
                                                                        const BackendConfig& config) const {
    return {MultipleOf{1}};
  }
  bool supports_block_size(int64_t block_size, const BackendConfig& config) const;
  int64_t get_preferred_block_size(int64_t default_block_size, const BackendConfig& config) const;
  virtual std::vector<int64_t> get_supported_head_sizes() const { return {}; }  // empty = any
  bool supports_head_size(int64_t head_size) const;
  virtual std::shared_ptr<const AttentionSpec> customize_spec(const std::shared_ptr<const AttentionSpec>& spec,
                                                              const BackendConfig& config) const {
    return spec;
  }
  // nullopt = any layout, no preference.
  virtual std::optional<LayoutList> supported_kv_cache_layouts(const BackendConfig& config) const {
    return std::nullopt;
  }

  // ---- features -----------------------------------------------------------------------
  virtual bool supports_compute_capability(const std::optional<DeviceCapability>& cap) const { return true; }
  virtual bool supports_sink(const BackendConfig& config) const { return false; }
  virtual bool supports_sliding_window() const { return false; }
  virtual bool supports_non_causal() const { return false; }
  virtual bool supports_mm_prefix() const { return false; }
  virtual bool supports_per_head_quant_scales() const { return false; }
  virtual bool supports_batch_invariance() const { return false; }
  virtual bool supports_kv_connector() const { return true; }
  virtual bool supports_pcp() const { return false; }
  virtual bool supports_dcp() const { return false; }
  virtual bool is_mla() const { return false; }
  virtual bool is_sparse() const { return false; }
  virtual bool is_ssm() const { return false; }
  virtual bool supports_attn_type(AttentionType t) const { return t == AttentionType::DECODER; }
  // The runner may hand a device query_start_loc that differs from the host copy (adaptive
  // verification trims drafts on device).  Default: not is_ssm().
  virtual bool supports_device_cpu_query_lens_mismatch(const BackendConfig& config) const { return !is_ssm(); }
  // A last combination check; a reason string when the combination is unsupported.
  virtual std::optional<std::string> supports_combination(const AttentionSelectorConfig& sel,
                                                          const BackendConfig& config) const {
    return std::nullopt;
  }
  // The runner calls impl.do_kv_cache_update itself when false.
  virtual bool forward_includes_kv_cache_update() const { return true; }

  // ---- CUDA graphs ----------------------------------------------------------------------
  virtual AttentionCGSupport get_cudagraph_support(const BackendConfig& config,
                                                   const KVCacheSpecPtr& kv_cache_spec) const {
    return AttentionCGSupport::NEVER;
  }
  virtual std::optional<int64_t> get_varlen_cudagraph_max_query_len(const BackendConfig& config,
                                                                    const KVCacheSpecPtr& kv_cache_spec) const {
    return std::nullopt;
  }

  // ---- validation ---------------------------------------------------------------------
  // Every reason `sel` cannot run on this backend under `config` (empty = supported).  Each
  // reason names the bad value and the valid choices.
  std::vector<std::string> validate_configuration(const AttentionSelectorConfig& sel,
                                                  const BackendConfig& config) const;

  // ---- factories ----------------------------------------------------------------------
  // The metadata builder for one KV cache group (vLLM get_builder_cls()(spec, layers, config)).
  virtual std::unique_ptr<AttentionMetadataBuilder> make_builder(std::shared_ptr<const AttentionSpec> kv_cache_spec,
                                                                 std::vector<std::string> layer_names,
                                                                 const BackendConfig& config) const = 0;
  // The per-layer implementation (vLLM get_impl_cls()(...)).
  virtual std::shared_ptr<AttentionImpl> make_impl(const AttentionImplParams& params,
                                                   const BackendConfig& config) const = 0;
  // Whether make_builder needs a block_table_width (vLLM requires_block_table_width).
  virtual bool requires_block_table_width() const { return false; }

  // The kv/ view of this backend (name + kernel block sizes + customize_spec) for
  // select_common_block_size / prepare_kernel_block_sizes.
  BlockSizeBackend block_size_backend(const BackendConfig& config) const;
};

using AttentionBackendPtr = std::shared_ptr<const AttentionBackend>;

}  // namespace kvattn
