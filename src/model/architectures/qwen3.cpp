// Qwen3ForCausalLM: Llama's blocks plus a per-head RMSNorm of q and k (over head_dim, before
// the rotary embedding); head_dim is free of hidden_size / num_attention_heads.
#include <fmt/format.h>

#include "../layers.h"
#include "kvattn/core/error.h"

namespace kvattn::model {

ArchTraits qwen3_traits(const HfModelConfig& c) {
  ArchTraits t = base_traits(c);
  if (c.attention_bias)
    throw Unsupported("config.json attention_bias = true (biases on q/k/v and o_proj) is not supported for "
                      "Qwen3ForCausalLM; Qwen3 checkpoints ship without them");
  t.qk_norm = true;
  return t;
}

}  // namespace kvattn::model
