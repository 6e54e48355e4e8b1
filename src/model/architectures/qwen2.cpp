// Qwen2ForCausalLM: Llama's blocks with biases on the q/k/v projections (not on o_proj).
#include "../layers.h"

namespace kvattn::model {

ArchTraits qwen2_traits(const HfModelConfig& c) {
  ArchTraits t = base_traits(c);
  t.qkv_bias = true;
  return t;
}

}  // namespace kvattn::model
