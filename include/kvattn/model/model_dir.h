// kvattn/model/model_dir.h — a Hugging Face model directory, opened and validated.
//
// open_model_dir reads config.json, generation_config.json (optional), tokenizer_config.json,
// the tokenizer and the safetensors headers, and cross-checks them (embedding / lm_head rows
// equal vocab_size, tensor dtypes among bf16/f16/f32) before any large allocation: the
// weights stay memory-mapped, nothing is copied.
#pragma once

#include <filesystem>
#include <memory>

#include "kvattn/model/hf_config.h"
#include "kvattn/model/safetensors.h"
#include "kvattn/model/tokenizer.h"

namespace kvattn::model {

struct ModelDir {
  std::filesystem::path path;
  HfModelConfig config;
  GenerationConfig generation;
  WeightStore weights;
  std::unique_ptr<Tokenizer> tokenizer;  // null when the directory has no tokenizer files
};

// `require_tokenizer`: throw when no tokenizer.json / tokenizer.model is present.
ModelDir open_model_dir(const std::filesystem::path& dir, bool require_tokenizer = true);

}  // namespace kvattn::model
