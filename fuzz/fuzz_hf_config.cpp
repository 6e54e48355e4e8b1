// Fuzz target for the model layer's config.json / generation_config.json parsers
// (kvattn::model::parse_hf_config, parse_generation_config): arbitrary bytes, and fuzz-built
// values of every JSON type set into one field of each architecture's real config, must never
// crash; every rejection is a kvattn error with a message, and every accepted config keeps
// the invariants the architectures rely on.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "kvattn/core/error.h"
#include "kvattn/model/hf_config.h"

namespace {

using nlohmann::json;

void require(bool ok) {
  if (!ok) std::abort();
}

void check(const std::string& text) {
  try {
    const kvattn::model::HfModelConfig c = kvattn::model::parse_hf_config(text, "fuzz.json");
    require(c.num_attention_heads > 0 && c.num_key_value_heads > 0 &&
            c.num_attention_heads % c.num_key_value_heads == 0);
    require(c.head_dim > 0 && c.hidden_size > 0 && c.vocab_size > 0 && c.num_hidden_layers > 0);
    require(static_cast<int64_t>(c.layer_is_sliding.size()) == c.num_hidden_layers);
    for (bool s : c.layer_is_sliding) require(!s || (c.sliding_window && *c.sliding_window > 0));
    for (int64_t id : c.eos_token_ids) require(id >= 0 && id < c.vocab_size);
    require(c.rms_norm_eps > 0 && c.rope_theta > 0);
  } catch (const kvattn::Error& e) {
    require(!e.message().empty());
  }
  try {
    (void)kvattn::model::parse_generation_config(text, "fuzz-generation.json");
  } catch (const kvattn::Error& e) {
    require(!e.message().empty());
  }
}

// A JSON value of a type and content chosen by the fuzz bytes.
json value_from(const uint8_t* d, size_t n) {
  if (n == 0) return nullptr;
  int64_t i = 0;
  std::memcpy(&i, d + 1, std::min<size_t>(8, n - 1));
  switch (d[0] % 9) {
    case 0: return nullptr;
    case 1: return (d[0] & 16) != 0;
    case 2: return i;                                   // any 64-bit integer
    case 3: return static_cast<int64_t>(i % 9) - 2;     // small, incl. 0 and negatives
    case 4: return static_cast<uint64_t>(i);            // beyond int64
    case 5: return static_cast<double>(i) / 7.0;
    case 6: return std::string(reinterpret_cast<const char*>(d + 1), std::min<size_t>(n - 1, 24));
    case 7: {
      json a = json::array();
      for (size_t k = 1; k < n && k < 12; ++k) a.push_back(static_cast<int>(d[k]) - 8);
      return a;
    }
    default: {
      json o = json::object();
      o["rope_type"] = (d[0] & 32) ? "llama3" : "linear";
      o["factor"] = static_cast<double>(i % 17);
      if (n > 3) o["low_freq_factor"] = d[2] / 16.0;
      if (n > 4) o["high_freq_factor"] = d[3] / 8.0;
      if (n > 5) o["original_max_position_embeddings"] = static_cast<int>(d[4]) - 4;
      return o;
    }
  }
}

const char* kConfigs[] = {
    R"({"architectures":["LlamaForCausalLM"],"bos_token_id":128000,"eos_token_id":[128001,128008,128009],"hidden_size":4096,"intermediate_size":14336,"max_position_embeddings":131072,"model_type":"llama","num_attention_heads":32,"num_hidden_layers":32,"num_key_value_heads":8,"rms_norm_eps":1e-05,"rope_scaling":{"factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":8192,"rope_type":"llama3"},"rope_theta":500000.0,"torch_dtype":"bfloat16","vocab_size":128256})",
    R"({"architectures":["MistralForCausalLM"],"hidden_size":4096,"intermediate_size":14336,"num_attention_heads":32,"num_hidden_layers":32,"num_key_value_heads":8,"sliding_window":4096,"vocab_size":32000})",
    R"({"architectures":["Qwen2ForCausalLM"],"hidden_size":3584,"num_attention_heads":28,"num_hidden_layers":28,"num_key_value_heads":4,"max_window_layers":28,"use_sliding_window":true,"sliding_window":131072,"vocab_size":152064})",
    R"({"architectures":["Qwen3ForCausalLM"],"head_dim":128,"hidden_size":4096,"num_attention_heads":32,"num_hidden_layers":36,"num_key_value_heads":8,"vocab_size":151936})",
    R"({"architectures":["Gemma2ForCausalLM"],"attn_logit_softcapping":50.0,"final_logit_softcapping":30.0,"head_dim":256,"hidden_activation":"gelu_pytorch_tanh","hidden_size":3584,"num_attention_heads":16,"num_hidden_layers":42,"num_key_value_heads":8,"query_pre_attn_scalar":256,"sliding_window":4096,"vocab_size":256000})",
};
const char* kFields[] = {"architectures", "model_type", "vocab_size", "hidden_size",
                         "intermediate_size", "num_hidden_layers", "num_attention_heads",
                         "num_key_value_heads", "head_dim", "max_position_embeddings",
                         "rms_norm_eps", "rope_theta", "rope_scaling", "sliding_window",
                         "use_sliding_window", "max_window_layers", "layer_types",
                         "attention_bias", "tie_word_embeddings", "attn_logit_softcapping",
                         "final_logit_softcapping", "query_pre_attn_scalar", "hidden_act",
                         "hidden_activation", "torch_dtype", "bos_token_id", "eos_token_id",
                         "temperature", "top_p", "top_k"};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  check(std::string(reinterpret_cast<const char*>(data), size));
  // Structured: up to four fields of a real config replaced by fuzz-built values.
  if (size >= 2) {
    json j = json::parse(kConfigs[data[0] % 5]);
    size_t pos = 1;
    for (int k = 0; k < 4 && pos < size; ++k) {
      const char* field = kFields[data[pos] % (sizeof kFields / sizeof *kFields)];
      const size_t n = std::min<size_t>(size - pos - 1, 10);
      j[field] = value_from(data + pos + 1, n);
      pos += 1 + n;
    }
    check(j.dump(-1, ' ', false, json::error_handler_t::replace));
  }
  return 0;
}
