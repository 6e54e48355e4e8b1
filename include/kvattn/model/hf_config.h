// kvattn/model/hf_config.h — Hugging Face config.json / generation_config.json, validated.
//
// HfModelConfig holds the fields the five supported architectures (Llama, Mistral, Qwen2,
// Qwen3, Gemma2) need, read with the defaults transformers applies when a field is absent,
// and validated: positive sizes, num_key_value_heads dividing num_attention_heads, a known
// architecture, consistent rope_scaling / sliding window fields.  Every rejection is an
// InvalidArgument naming the field, its value, what is valid, and the file.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvattn/core/dtype.h"

namespace kvattn::model {

struct RopeScaling {
  std::string type;  // "llama3" | "linear" | "default"
  double factor = 1, low_freq_factor = 1, high_freq_factor = 4;
  int64_t original_max_position_embeddings = 0;
};

struct HfModelConfig {
  // "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
  // "Gemma2ForCausalLM"
  std::string architecture;
  std::string model_type;
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0,
          num_attention_heads = 0, num_key_value_heads = 0, head_dim = 0,
          max_position_embeddings = 0;
  double rms_norm_eps = 1e-6, rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;
  std::optional<int64_t> sliding_window;  // Mistral (all layers) / Gemma2 (alternate layers)
  // Per layer, derived: Mistral all layers when sliding_window is set; Gemma2 even layers
  // (i % 2 == 0, as transformers); Qwen2/3 when use_sliding_window, layers >= max_window_layers.
  std::vector<bool> layer_is_sliding;
  bool attention_bias = false;  // Qwen2: true (q/k/v bias)
  bool tie_word_embeddings = false;
  std::optional<double> attn_logit_softcapping, final_logit_softcapping;  // Gemma2
  std::optional<double> query_pre_attn_scalar;                            // Gemma2
  std::string hidden_act = "silu";  // silu | gelu_pytorch_tanh
  DType torch_dtype = DType::bf16;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;

  // Names accepted in `architecture`.
  static const std::vector<std::string>& supported_architectures();
};

// Parses config.json text; `label` names the file in messages.
HfModelConfig parse_hf_config(std::string_view json_text, const std::string& label = "config.json");
HfModelConfig load_hf_config(const std::filesystem::path& config_json);

struct GenerationConfig {
  std::vector<int64_t> eos_token_ids;  // eos_token_id: an int or a list
  std::optional<int64_t> bos_token_id;
  std::optional<int64_t> pad_token_id;
  std::optional<double> temperature, top_p;
  std::optional<int64_t> top_k;
  std::optional<double> repetition_penalty;
  std::optional<bool> do_sample;
  std::optional<int64_t> max_new_tokens;
};
GenerationConfig parse_generation_config(std::string_view json_text,
                                         const std::string& label = "generation_config.json");
// A missing file gives an empty GenerationConfig.
GenerationConfig load_generation_config(const std::filesystem::path& generation_config_json);

}  // namespace kvattn::model
