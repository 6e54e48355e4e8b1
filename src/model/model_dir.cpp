// model_dir.cpp — open a Hugging Face model directory and cross-check its parts.
#include "kvattn/model/model_dir.h"

#include <filesystem>

#include "kvattn/core/error.h"

namespace kvattn::model {
namespace fs = std::filesystem;

ModelDir open_model_dir(const fs::path& dir, bool require_tokenizer) {
  if (!fs::is_directory(dir))
    throw InvalidArgument(fmt::format("'{}' is not a directory; pass a Hugging Face model directory "
                                      "(config.json, model.safetensors, tokenizer files)",
                                      dir.string()));
  ModelDir m;
  m.path = dir;
  m.config = load_hf_config(dir / "config.json");
  m.generation = load_generation_config(dir / "generation_config.json");
  // generation_config.json's EOS ids extend config.json's (transformers stops on either).
  for (int64_t id : m.generation.eos_token_ids) {
    if (id >= m.config.vocab_size)
      throw InvalidArgument(fmt::format(
          "{}: eos_token_id {} is outside the vocabulary [0, {}) of config.json",
          (dir / "generation_config.json").string(), id, m.config.vocab_size));
    if (std::find(m.config.eos_token_ids.begin(), m.config.eos_token_ids.end(), id) ==
        m.config.eos_token_ids.end())
      m.config.eos_token_ids.push_back(id);
  }
  if (!m.generation.bos_token_id) m.generation.bos_token_id = m.config.bos_token_id;
  if (m.generation.eos_token_ids.empty()) m.generation.eos_token_ids = m.config.eos_token_ids;

  m.weights = WeightStore::open(dir);  // maps, validates headers; allocates nothing large
  // The embedding table must match the vocabulary and width (every architecture has it).
  m.weights.expect("model.embed_tokens.weight", {m.config.vocab_size, m.config.hidden_size});
  if (!m.config.tie_word_embeddings)
    m.weights.expect("lm_head.weight", {m.config.vocab_size, m.config.hidden_size});

  const bool has_tok = fs::exists(dir / "tokenizer.json") || fs::exists(dir / "tokenizer.model");
  if (has_tok || require_tokenizer) {
    m.tokenizer = load_tokenizer(dir);
    if (m.tokenizer->vocab_size() > m.config.vocab_size)
      throw InvalidArgument(fmt::format(
          "the tokenizer has {} tokens but config.json's vocab_size is {}; the tokenizer belongs "
          "to another model",
          m.tokenizer->vocab_size(), m.config.vocab_size));
    // generation_config's EOS ids are what generation stops on.
    if (!m.generation.eos_token_ids.empty()) {
      std::vector<int32_t> eos(m.generation.eos_token_ids.begin(), m.generation.eos_token_ids.end());
      for (int32_t id : m.tokenizer->eos_ids())
        if (std::find(eos.begin(), eos.end(), id) == eos.end()) eos.push_back(id);
      m.tokenizer->set_eos_ids(eos);
    }
  }
  return m;
}

}  // namespace kvattn::model
