// Gemma2ForCausalLM: embeddings times sqrt(hidden_size); RMSNorm weights (1 + w); norms
// after attention and before and after the MLP; GELU-tanh; softmax scale
// query_pre_attn_scalar^-0.5; attention logit soft cap; final logit soft cap; sliding-window
// attention on alternate layers (two KV cache groups); tied lm_head.
#include <cmath>

#include "../layers.h"
#include "kvattn/core/error.h"

namespace kvattn::model {

ArchTraits gemma2_traits(const HfModelConfig& c) {
  ArchTraits t = base_traits(c);
  t.sandwich_norms = true;
  t.norm_plus_one = true;
  t.scale_embeddings = true;
  if (c.query_pre_attn_scalar) {
    KVATTN_CHECK(*c.query_pre_attn_scalar > 0, "config.json query_pre_attn_scalar must be positive, got {}",
                 *c.query_pre_attn_scalar);
    t.attn_scale = 1.0 / std::sqrt(*c.query_pre_attn_scalar);
  }
  if (c.attn_logit_softcapping && *c.attn_logit_softcapping > 0) t.attn_softcap = c.attn_logit_softcapping;
  if (c.final_logit_softcapping && *c.final_logit_softcapping > 0) t.final_softcap = c.final_logit_softcapping;
  return t;
}

}  // namespace kvattn::model
