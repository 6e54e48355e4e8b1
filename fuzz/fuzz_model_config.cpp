// Fuzz target for the Hugging Face config.json parser (kvattn::parse_hf_config): arbitrary
// bytes must never crash, and only kvattn errors may escape the parser (caught here).  Inputs
// that parse are also planned with a small budget, exercising the spec / layout / planner path.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kvattn/core/error.h"
#include "kvattn/kv/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    kvattn::ModelConfig m = kvattn::parse_hf_config(text, "fuzz.json");
    // Keep planning cheap: cap what the fuzzer can ask for.
    if (m.num_hidden_layers <= 64 && m.max_model_len <= (1 << 20)) {
      kvattn::PlanOptions o;
      o.gpu_memory = int64_t{1} << 30;
      (void)kvattn::plan_kv_cache(m, o);
    }
  } catch (const kvattn::Error&) {
    // Expected for malformed or unplannable input.
  }
  // Also feed the structured prefix of a valid config with the fuzz bytes as a value, so the
  // field validators (not just the JSON syntax check) see arbitrary content.
  std::string wrapped = R"({"num_hidden_layers": 2, "num_attention_heads": 4, "head_dim": 8, )"
                        R"("max_position_embeddings": 64, "layer_types": )";
  wrapped.append(text.substr(0, 256));
  wrapped += "}";
  try {
    (void)kvattn::parse_hf_config(wrapped, "fuzz-wrapped.json");
  } catch (const kvattn::Error&) {
  }
  try {
    (void)kvattn::parse_memory_size(text.substr(0, 64));
  } catch (const kvattn::Error&) {
  }
  return 0;
}
