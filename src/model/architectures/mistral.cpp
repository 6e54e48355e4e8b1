// MistralForCausalLM: Llama's blocks; every layer attends over the config's sliding_window
// (the KV cache plan gives the layers SlidingWindowSpec and the backend the window).
#include "../layers.h"

namespace kvattn::model {

ArchTraits mistral_traits(const HfModelConfig& c) { return llama_traits(c); }

}  // namespace kvattn::model
