// kvattn/kv/kv_cache_spec.h — what one layer keeps in the KV cache (vLLM's
// vllm/v1/kv_cache_interface.py spec family, layout era).
//
// A spec is immutable (vLLM's frozen dataclasses) and shared: KVCacheSpecPtr.  Every spec
// describes one page (the bytes one layer keeps per manager block) as an H x N x C grid:
//   H = num_heads()                 head slots (num_kv_heads unless a backend packs heads)
//   N = num_states()                states per block = block_size / tokens_per_state
//   C = state_content_size_bytes()  bytes per (head slot, state)
//   page_size_bytes() = page_size_padded() if set, else H * N * C
// The page-size formulas live once, in KVCacheSpec / AttentionSpec; the kinds differ only in
// max_memory_usage_bytes() (how many pages one request can hold).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvattn/core/dtype.h"
#include "kvattn/core/kv_cache_dtype.h"
#include "kvattn/kv/kv_cache_layout.h"

namespace kvattn {

// ---------------------------------------------------------------------------------------
// Quantisation mode of the KV cache (vLLM's KVQuantMode, current numbering).
enum class KVQuantMode : uint8_t {
  NONE = 0,
  FP8_PER_TENSOR = 1,
  INT8_PER_TOKEN_HEAD = 2,
  FP8_PER_TOKEN_HEAD = 3,
  INT4_PER_TOKEN_HEAD = 4,
  NVFP4 = 5,
  TURBOQUANT_K8V4 = 6,
  TURBOQUANT_4BIT_NC = 7,
  TURBOQUANT_K3V4_NC = 8,
  TURBOQUANT_3BIT_NC = 9,
  NVFP4_DS_MLA = 10,
};
const char* kv_quant_mode_name(KVQuantMode mode) noexcept;
bool is_per_token_head(KVQuantMode mode) noexcept;  // INT8_/FP8_/INT4_PER_TOKEN_HEAD
bool is_nvfp4(KVQuantMode mode) noexcept;           // NVFP4 only
// vLLM's get_kv_quant_mode(cache_dtype_str): exact "int4/int8/fp8_per_token_head";
// "nvfp4_ds_mla"; prefix "nvfp4" -> NVFP4; "turboquant_*" -> that member (InvalidArgument when
// unknown); prefix "fp8" -> FP8_PER_TENSOR; anything else ("auto", "bfloat16") -> NONE.
KVQuantMode get_kv_quant_mode(std::string_view cache_dtype);
bool is_quantized_kv_cache(std::string_view cache_dtype);
// The same for a parsed kv_cache_dtype: fp8 / fp8_e4m3 / fp8_e5m2 -> FP8_PER_TENSOR, nvfp4 -> NVFP4,
// auto / bfloat16 / float16 -> NONE.
KVQuantMode get_kv_quant_mode(KVCacheDType cache_dtype) noexcept;

// ---------------------------------------------------------------------------------------
enum class KVCacheSpecKind : uint8_t {
  FullAttention,          // "full_attention"
  MLAAttention,           // "mla_attention"
  SlidingWindow,          // "sliding_window"
  SlidingWindowMLA,       // "sliding_window_mla"
  Mamba,                  // "mamba"
  ChunkedLocalAttention,  // "chunked_local_attention"
  SinkFullAttention,      // "sink_full_attention"
  EncoderOnlyAttention,   // "encoder_only_attention"
  CrossAttention,         // "cross_attention"
  UniformType,            // kvattn: UniformTypeKVCacheSpecs (vLLM reports "unknown")
  Unknown,                // "unknown"
};
const char* kv_cache_spec_kind_name(KVCacheSpecKind kind) noexcept;

// tokens_per_state as a rational (vLLM: int | Fraction).  num > 0: den/num states per token,
// i.e. num/den tokens share one state (>1 compresses, e.g. DSv4's 4); num <= 0 (Mamba's -1):
// one state per block regardless of the block size.
struct Fraction {
  int64_t num = 1;
  int64_t den = 1;
  friend bool operator==(const Fraction&, const Fraction&) = default;
};

// The pieces of vLLM's VllmConfig that memory estimates read.
struct KVCacheLimits {
  int64_t max_model_len = 0;                 // tokens
  int64_t max_num_batched_tokens = 0;        // tokens in flight per step (window admission)
  int64_t max_num_encoder_input_tokens = 0;  // cross-attention encoder length
  int64_t decode_context_parallel_size = 1;  // DCP world size
};

// ---------------------------------------------------------------------------------------
// Base of the family.  Equality is structural: two specs are equal iff repr() is equal.
class KVCacheSpec {
 public:
  virtual ~KVCacheSpec() = default;

  int64_t block_size() const noexcept { return block_size_; }  // tokens per manager block
  virtual KVCacheSpecKind kind() const noexcept = 0;

  // ---- page geometry (H x N x C) ----
  virtual int64_t num_heads() const = 0;
  virtual Fraction tokens_per_state() const = 0;
  virtual int64_t state_content_size_bytes() const = 0;
  virtual std::optional<int64_t> page_size_padded() const { return std::nullopt; }
  // H * N * C (the real page, before padding).
  int64_t unpadded_page_size_bytes() const;
  int64_t real_page_size_bytes() const { return unpadded_page_size_bytes(); }
  // page_size_padded() when set (>= the real page), else the real page.
  virtual int64_t page_size_bytes() const;
  // N of a manager block.
  int64_t num_states() const { return get_num_kernel_states(block_size_); }
  // States in a kernel block of `kernel_block_size` tokens: k * den / num (floor) when
  // tokens_per_state > 0, else 1.
  int64_t get_num_kernel_states(int64_t kernel_block_size) const;

  // ---- storage traits ----
  // True when allocate_kv_cache gives each layer a [B, H, N, C] view; false when the layer gets
  // the raw backing bytes and lays out its own state (Mamba).
  virtual bool has_layer_views() const = 0;
  // Byte multiple every block stride of this spec must be (1 = none).  See AttentionSpec.
  virtual int64_t get_block_stride_alignment() const { return 1; }
  // Element dtype of the per-layer views (nullopt: raw u8 bytes).
  virtual std::optional<DType> view_dtype() const { return std::nullopt; }
  virtual bool prefix_cacheable() const { return true; }

  // ---- memory ----
  // Bytes one request of max_model_len tokens can hold in this layer.
  virtual int64_t max_memory_usage_bytes(const KVCacheLimits& limits) const = 0;
  // Block-table row width for `max_len` tokens: cdiv(max_len, block_size).
  virtual int64_t max_num_blocks_per_req(const KVCacheLimits& limits, int64_t max_len) const;

  virtual KVCacheSpecPtr copy_with_new_block_size(int64_t block_size) const = 0;
  // Canonical one-line description of every field (used for equality, grouping, messages).
  virtual std::string repr() const = 0;

  friend bool operator==(const KVCacheSpec& a, const KVCacheSpec& b) { return a.repr() == b.repr(); }

 protected:
  explicit KVCacheSpec(int64_t block_size);
  KVCacheSpec(const KVCacheSpec&) = default;
  int64_t block_size_;
};

// ---------------------------------------------------------------------------------------
// Optional fields of every attention spec (aggregate: use designated initializers).
struct AttentionSpecOptions {
  std::optional<int64_t> head_size_v = std::nullopt;           // default head_size (MLA: 0)
  KVQuantMode kv_quant_mode = KVQuantMode::NONE;
  std::optional<int64_t> page_size_padded = std::nullopt;      // bytes; must be >= the real page
  std::optional<int64_t> num_head_slots = std::nullopt;        // H when a backend packs (NVFP4: 2*num_kv_heads)
  std::optional<int64_t> state_content_bytes = std::nullopt;   // C when packed; nullopt = (hs + hs_v) * dtype
  Fraction tokens_per_state{1, 1};
  // (inferred) KV sharded across DCP ranks; false for a replicated draft/ring.
  bool dcp_sharded = true;
  // (inferred) written through the slot mapping; false for self-addressed rings.
  bool uses_slot_mapping = true;
  // MultipleOf base in TOKENS set by customize_attention_spec (largest fixed kernel block size).
  std::optional<int64_t> block_stride_alignment = std::nullopt;
  // Kind-specific:
  std::optional<int64_t> sliding_window = std::nullopt;        // SlidingWindow(MLA): required; Full: HMA-off SWA
  std::optional<int64_t> attention_chunk_size = std::nullopt;  // ChunkedLocal: required; Full: informational
  int64_t extra_retained_tokens = 0;            // SlidingWindow
  bool non_causal = false;                      // FullAttention
  std::optional<int64_t> sink_len = std::nullopt;              // SinkFullAttention
  std::optional<int64_t> mla_alignment = std::nullopt;         // MLA: page padded up to a multiple of this
};

// All attention kinds in one class: the page-size formulas are shared, kind() selects the
// memory formula.  Build with the factory functions below.
class AttentionSpec : public KVCacheSpec {
 public:
  // Validates (positive sizes, padded page >= real page, kind-required fields) and throws
  // InvalidArgument naming the bad field.  `kind` must be an attention kind.
  AttentionSpec(KVCacheSpecKind kind, int64_t block_size, int64_t num_kv_heads, int64_t head_size,
                DType dtype, AttentionSpecOptions options = {});

  KVCacheSpecKind kind() const noexcept override { return kind_; }
  int64_t num_kv_heads() const noexcept { return num_kv_heads_; }
  int64_t head_size() const noexcept { return head_size_; }
  int64_t head_size_v() const noexcept { return head_size_v_; }
  DType dtype() const noexcept { return dtype_; }
  const AttentionSpecOptions& options() const noexcept { return opt_; }
  KVQuantMode kv_quant_mode() const noexcept { return opt_.kv_quant_mode; }
  std::optional<int64_t> num_head_slots() const noexcept { return opt_.num_head_slots; }
  std::optional<int64_t> state_content_bytes() const noexcept { return opt_.state_content_bytes; }
  bool dcp_sharded() const noexcept { return opt_.dcp_sharded; }
  bool uses_slot_mapping() const noexcept { return opt_.uses_slot_mapping; }
  std::optional<int64_t> block_stride_alignment() const noexcept { return opt_.block_stride_alignment; }
  std::optional<int64_t> sliding_window() const noexcept { return opt_.sliding_window; }
  std::optional<int64_t> attention_chunk_size() const noexcept { return opt_.attention_chunk_size; }

  int64_t num_heads() const override;                 // num_head_slots or num_kv_heads
  Fraction tokens_per_state() const override { return opt_.tokens_per_state; }
  int64_t state_content_size_bytes() const override;  // state_content_bytes or (hs+hs_v)*dtype
  std::optional<int64_t> page_size_padded() const override { return page_size_padded_; }
  bool has_layer_views() const override { return true; }
  // (inferred) bytes of one kernel page when a block is split into kernel blocks of
  // gcd(block_size, block_stride_alignment) tokens; 1 when unset or when that equals block_size.
  int64_t get_block_stride_alignment() const override;
  std::optional<DType> view_dtype() const override { return dtype_; }

  // Full/MLA/Sink: cdiv(cdiv(max_model_len, dcp) if dcp > 1, block_size) pages;
  // SlidingWindow(MLA): (cdiv(min(sw-1+extra+batched, max_len), bs) + 1) pages, dcp must be 1;
  // ChunkedLocal: cdiv(min(chunk + batched, max_len), bs) pages;
  // CrossAttention: cdiv(max_num_encoder_input_tokens, bs) pages; EncoderOnly: 0.
  int64_t max_memory_usage_bytes(const KVCacheLimits& limits) const override;
  // cdiv(max_len, block_size * dcp).
  int64_t max_num_blocks_per_req(const KVCacheLimits& limits, int64_t max_len) const override;
  // SlidingWindow admission: cdiv(min(sw - 1 + extra + in_flight, max_len), bs) + 1.
  int64_t max_admission_blocks_per_request(int64_t in_flight_tokens, int64_t max_len) const;

  KVCacheSpecPtr copy_with_new_block_size(int64_t block_size) const override;
  // Same spec with other options (e.g. customize_attention_spec setting block_stride_alignment).
  std::shared_ptr<const AttentionSpec> with_options(const AttentionSpecOptions& options) const;
  std::string repr() const override;

 private:
  KVCacheSpecKind kind_;
  int64_t num_kv_heads_;
  int64_t head_size_;
  int64_t head_size_v_;
  DType dtype_;
  AttentionSpecOptions opt_;
  std::optional<int64_t> page_size_padded_ = std::nullopt;  // opt_.page_size_padded or the MLA alignment rounding
};

// Factories (vLLM class names).
std::shared_ptr<const AttentionSpec> FullAttentionSpec(int64_t block_size, int64_t num_kv_heads,
                                                       int64_t head_size, DType dtype,
                                                       AttentionSpecOptions options = {});
// head_size_v = 0 (one latent vector per token); options.mla_alignment pads the page.
std::shared_ptr<const AttentionSpec> MLAAttentionSpec(int64_t block_size, int64_t num_kv_heads,
                                                      int64_t head_size, DType dtype,
                                                      AttentionSpecOptions options = {});
std::shared_ptr<const AttentionSpec> SlidingWindowSpec(int64_t block_size, int64_t num_kv_heads,
                                                       int64_t head_size, DType dtype,
                                                       int64_t sliding_window,
                                                       AttentionSpecOptions options = {});
std::shared_ptr<const AttentionSpec> ChunkedLocalAttentionSpec(int64_t block_size, int64_t num_kv_heads,
                                                               int64_t head_size, DType dtype,
                                                               int64_t attention_chunk_size,
                                                               AttentionSpecOptions options = {});
std::shared_ptr<const AttentionSpec> CrossAttentionSpec(int64_t block_size, int64_t num_kv_heads,
                                                        int64_t head_size, DType dtype,
                                                        AttentionSpecOptions options = {});
std::shared_ptr<const AttentionSpec> EncoderOnlyAttentionSpec(int64_t block_size, int64_t num_kv_heads,
                                                              int64_t head_size, DType dtype,
                                                              AttentionSpecOptions options = {});

// nullptr unless `spec` is an AttentionSpec (any attention kind).
const AttentionSpec* as_attention_spec(const KVCacheSpec* spec) noexcept;
inline const AttentionSpec* as_attention_spec(const KVCacheSpecPtr& spec) noexcept {
  return as_attention_spec(spec.get());
}

// ---------------------------------------------------------------------------------------
struct MambaSpecOptions {
  std::optional<int64_t> page_size_padded = std::nullopt;
  std::string mamba_type = "mamba2";
  std::string mamba_cache_mode = "none";  // "none" | "align" | "all"
  int64_t num_speculative_blocks = 0;
  int64_t num_prefill_checkpoint_blocks = 0;
};

// Recurrent state: one page per block holding every state tensor back to back.  No layer
// views (the layer lays out its own state in the raw bytes); H = 1, N = 1, C = real page.
class MambaSpec : public KVCacheSpec {
 public:
  // shapes[i] with dtypes[i]; InvalidArgument on mismatched counts, non-positive dims, a padded
  // page smaller than the real one, or an unknown cache mode.
  MambaSpec(int64_t block_size, std::vector<std::vector<int64_t>> shapes, std::vector<DType> dtypes,
            MambaSpecOptions options = {});

  KVCacheSpecKind kind() const noexcept override { return KVCacheSpecKind::Mamba; }
  const std::vector<std::vector<int64_t>>& shapes() const noexcept { return shapes_; }
  const std::vector<DType>& dtypes() const noexcept { return dtypes_; }
  const MambaSpecOptions& options() const noexcept { return opt_; }

  int64_t num_heads() const override { return 1; }
  Fraction tokens_per_state() const override { return {-1, 1}; }
  int64_t state_content_size_bytes() const override;  // sum of prod(shape) * dtype size
  std::optional<int64_t> page_size_padded() const override { return opt_.page_size_padded; }
  bool has_layer_views() const override { return false; }
  // "all": cdiv(max_len, bs) + spec pages; "align": 2 + spec + ckpt; "none": 1 + spec.
  int64_t max_memory_usage_bytes(const KVCacheLimits& limits) const override;
  // "align": cdiv(max_len, bs) + spec; else max_memory_usage_bytes / page.
  int64_t max_num_blocks_per_req(const KVCacheLimits& limits, int64_t max_len) const override;
  KVCacheSpecPtr copy_with_new_block_size(int64_t block_size) const override;
  std::string repr() const override;

 private:
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<DType> dtypes_;
  MambaSpecOptions opt_;
};

// ---------------------------------------------------------------------------------------
// One group of layers of the same type (and block size) but different per-layer specs (e.g.
// different head counts).  The group's page is all its layers' pages together.
class UniformTypeKVCacheSpecs : public KVCacheSpec {
 public:
  // layer name -> spec, in layer order.  InvalidArgument when empty or block sizes differ.
  UniformTypeKVCacheSpecs(int64_t block_size, std::vector<std::pair<std::string, KVCacheSpecPtr>> specs);
  // A Uniform spec when every spec is an attention spec of one kind and block size (and equal
  // window / chunk); nullptr otherwise.
  static std::shared_ptr<const UniformTypeKVCacheSpecs> from_specs(
      const std::vector<std::pair<std::string, KVCacheSpecPtr>>& specs);

  KVCacheSpecKind kind() const noexcept override { return KVCacheSpecKind::UniformType; }
  const std::vector<std::pair<std::string, KVCacheSpecPtr>>& kv_cache_specs() const noexcept {
    return specs_;
  }
  // The spec of `layer_name`; InvalidArgument when not part of this group.
  const KVCacheSpecPtr& spec_of(std::string_view layer_name) const;

  // Per-layer geometry differs: these throw Unsupported (use iter_layer_specs()).
  int64_t num_heads() const override;
  Fraction tokens_per_state() const override;
  int64_t state_content_size_bytes() const override;
  int64_t page_size_bytes() const override;  // sum of the layers' pages
  bool has_layer_views() const override;     // every layer has views
  int64_t max_memory_usage_bytes(const KVCacheLimits& limits) const override;  // max pages * page
  int64_t max_num_blocks_per_req(const KVCacheLimits& limits, int64_t max_len) const override;
  KVCacheSpecPtr copy_with_new_block_size(int64_t block_size) const override;
  std::string repr() const override;

 private:
  std::vector<std::pair<std::string, KVCacheSpecPtr>> specs_;
};

// Per-layer specs of a UniformTypeKVCacheSpecs, else {spec}.
std::vector<KVCacheSpecPtr> iter_layer_specs(const KVCacheSpecPtr& spec);

// vLLM's KVCacheSpec.merge: all specs must be equal, except attention specs that differ only in
// sliding_window / attention_chunk_size / non_causal, which merge (<= 1 distinct window, not both
// window and chunk, non_causal = any).  InvalidArgument otherwise.
KVCacheSpecPtr merge_kv_cache_specs(const std::vector<KVCacheSpecPtr>& specs);

}  // namespace kvattn
