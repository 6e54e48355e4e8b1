// tokenizer_bpe.cpp — tokenizer.json (Hugging Face tokenizers) with a BPE model.
#include "kvattn/core/error.h"
#include "kvattn/model/tokenizer.h"

namespace kvattn::model {

std::unique_ptr<Tokenizer> load_tokenizer_json(const std::filesystem::path& tokenizer_json,
                                               const std::filesystem::path&) {
  throw Unsupported(fmt::format("{}: tokenizer.json loading is not implemented yet",
                                tokenizer_json.string()));
}

}  // namespace kvattn::model
