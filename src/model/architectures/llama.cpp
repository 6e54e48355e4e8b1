// LlamaForCausalLM: the base decoder (RMSNorm, RoPE with optional Llama 3 'llama3' frequency
// scaling, GQA attention, SiLU-gated MLP), tied or untied lm_head.
#include <fmt/format.h>

#include "../layers.h"
#include "kvattn/core/error.h"

namespace kvattn::model {

ArchTraits llama_traits(const HfModelConfig& c) {
  ArchTraits t = base_traits(c);
  if (c.attention_bias)
    throw Unsupported(fmt::format("config.json attention_bias = true (biases on q/k/v and o_proj) is not supported "
                                  "for {}; kvattn runs bias-free Llama checkpoints",
                                  c.architecture));
  return t;
}

}  // namespace kvattn::model
