// kvattn/kv/model_config.h — the model geometry the KV cache planner needs, and `plan`.
//
// A ModelConfig is what vLLM reads from a Hugging Face config to build per-layer KV cache
// specs: layer count, attention heads, head size, dtype, the kind of every layer (full
// attention, sliding window, Mamba) and the maximum length.  It comes from a built-in
// preset (`llama3-8b`, `gemma2-9b`, `hybrid-mamba`) or from a `config.json`.
// `plan_kv_cache` turns it plus the user's choices (block size, KV cache dtype, layout,
// memory budget) into a full memory plan: resolved layout, groups, specs, page sizes,
// per-layer views, blocks that fit and maximum concurrency.  `kvattn plan` prints it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvattn/core/dtype.h"
#include "kvattn/core/kv_cache_dtype.h"
#include "kvattn/core/tensor.h"
#include "kvattn/kv/kv_cache_config.h"
#include "kvattn/kv/kv_cache_layout.h"

namespace kvattn {

enum class ModelLayerKind : uint8_t { full_attention, sliding_window, mamba };
const char* model_layer_kind_name(ModelLayerKind k) noexcept;

// Mamba2 state geometry (vLLM's MambaStateShapeCalculator.mamba2_state_shape):
//   conv state [conv_kernel - 1, conv_dim], conv_dim = intermediate + 2 * n_groups * d_state
//   ssm state  [num_heads, head_dim, d_state]
struct MambaGeometry {
  int64_t num_heads = 0;
  int64_t head_dim = 0;
  int64_t d_state = 0;
  int64_t n_groups = 1;
  int64_t conv_kernel = 4;
  int64_t intermediate_size = 0;  // = expand * hidden_size
  DType dtype = DType::bf16;

  int64_t conv_dim() const noexcept { return intermediate_size + 2 * n_groups * d_state; }
  int64_t conv_state_elems() const noexcept { return (conv_kernel - 1) * conv_dim(); }
  int64_t ssm_state_elems() const noexcept { return num_heads * head_dim * d_state; }
  int64_t page_size_bytes() const noexcept {
    return (conv_state_elems() + ssm_state_elems()) * dtype_size(dtype);
  }
};

struct ModelConfig {
  std::string name;            // preset name or the config path
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  DType dtype = DType::bf16;   // model (activation) dtype; KV dtype "auto" follows it
  int64_t max_model_len = 0;   // max_position_embeddings unless overridden
  int64_t sliding_window = 0;  // window of sliding layers (0: none)
  // Sliding layers with their own geometry (MiMo-V2 style swa_num_key_value_heads /
  // swa_head_dim); 0 = same as the full layers.  Different geometry gives the specs mixed
  // (heads, states, page) shapes, which only block-compact / block-outer layouts can hold.
  int64_t swa_num_key_value_heads = 0;
  int64_t swa_head_dim = 0;
  std::vector<ModelLayerKind> layer_kinds;  // [num_hidden_layers]
  std::optional<MambaGeometry> mamba;       // set when any layer is Mamba

  int64_t num_layers_of(ModelLayerKind k) const noexcept;
  // Throws InvalidArgument when fields are missing, non-positive or inconsistent.
  void validate() const;
};

// Built-in presets.
std::vector<std::string> model_preset_names();
// Throws InvalidArgument naming the valid presets when `name` is unknown.
ModelConfig model_preset(std::string_view name);
// Parses a Hugging Face config.json text.  Reads num_hidden_layers, num_attention_heads,
// num_key_value_heads (default: num_attention_heads), head_dim (default hidden_size /
// num_attention_heads), max_position_embeddings, torch_dtype (or dtype), sliding_window with
// layer_types / Gemma-2 alternation / sliding_window_pattern (and swa_num_key_value_heads /
// swa_head_dim), and hybrid layer lists
// (layer_types "mamba", layers_block_type, attn_layer_indices, attn_layer_period/offset)
// with mamba_* geometry.  Any malformed input throws InvalidArgument (never another
// exception type).  `source` names the input in messages.
ModelConfig parse_hf_config(std::string_view json_text, std::string_view source = "config.json");
// A preset name, else a path to a config.json (or to a directory holding one).
ModelConfig load_model_config(std::string_view model);

// "80GiB", "16GB", "512MiB", "1.5GiB", "1073741824" (bytes).  Binary (KiB/MiB/GiB/TiB) and
// decimal (KB/MB/GB/TB) units, case-insensitive, optional "B".  Throws InvalidArgument.
int64_t parse_memory_size(std::string_view text);
// "16.00 GiB"-style rendering.
std::string format_bytes(int64_t bytes);

// ---------------------------------------------------------------------------------------
// Planning

// The KV element dtype the planner allocates for a kv_cache_dtype (kv_cache_storage_dtype:
// auto -> the model dtype, fp8 -> fp8_e4m3, ...).  nvfp4 throws Unsupported (kvattn has no NVFP4
// kernel).  The accepted names are kv_cache_dtype_choices() (kvattn/core/kv_cache_dtype.h).
DType resolve_kv_cache_dtype(KVCacheDType kv_cache_dtype, DType model_dtype);

struct PlanOptions {
  std::optional<int64_t> block_size;       // tokens per block; default 16 (hybrid: raised so an
                                           // attention page holds a Mamba state)
  KVCacheDType kv_cache_dtype = KVCacheDType::Auto;
  std::optional<KVCacheLayout> layout;     // nullopt = automatic (vLLM's resolution)
  int64_t gpu_memory = 0;                  // bytes available to the KV cache
  std::optional<int64_t> max_model_len;    // overrides the model's
  int64_t max_num_batched_tokens = 2048;   // tokens in flight per step (sliding-window memory)
};

// One layer's view, as allocate_kv_cache would create it (no memory is allocated).
struct PlannedLayerView {
  std::string layer_name;
  int64_t group_id = 0;
  std::string spec_kind;       // kv_cache_spec_kind_name
  bool raw = false;            // no layer view: the layer gets the raw backing bytes (Mamba)
  DType dtype = DType::u8;     // element dtype of the view
  Dims shape;                  // [B, H, N, C] in elements (raw: [bytes])
  Dims strides;                // in elements
  int64_t byte_offset = 0;     // of block 0 into the backing allocation
  int64_t page_size_bytes = 0;
};

struct KVPlan {
  ModelConfig model;
  int64_t block_size = 0;
  KVCacheDType kv_cache_dtype = KVCacheDType::Auto;  // as requested
  DType kv_dtype = DType::bf16; // element dtype of attention KV
  KVCacheLayout layout = KVCacheLayout::LBNHC;
  std::string layout_reason;    // why this layout (one sentence per step that decided it)
  LayoutList layout_candidates; // layouts the specs allow, in preference order
  std::vector<LayerKVCacheSpec> layer_specs;  // per model layer, model order
  KVCacheConfig config;         // groups, tensors, num_blocks (incl. the null block)
  int64_t bytes_per_block = 0;  // backing bytes one manager block costs
  int64_t total_bytes = 0;      // backing allocation size
  int64_t blocks_per_request = 0;  // blocks one max-length request holds (all groups)
  double max_concurrency = 0;   // (num_blocks - 1 null block) / blocks_per_request
  int64_t gpu_memory = 0;
  std::vector<PlannedLayerView> views;  // one per model layer, model order
};

// Builds the per-layer specs, resolves the layout, plans the memory and derives the views.
// InvalidArgument (with the bad value, the valid choices and a hint) for a bad dtype, layout,
// block size, a layout the specs cannot use, or a budget too small for one request.
KVPlan plan_kv_cache(const ModelConfig& model, const PlanOptions& options);

}  // namespace kvattn
