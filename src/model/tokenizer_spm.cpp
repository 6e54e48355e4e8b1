// tokenizer_spm.cpp — SentencePiece tokenizer.model through libsentencepiece.
#include "kvattn/core/error.h"
#include "kvattn/model/tokenizer.h"

namespace kvattn::model {

std::unique_ptr<Tokenizer> load_sentencepiece(const std::filesystem::path& tokenizer_model,
                                              const std::filesystem::path&) {
  throw Unsupported(fmt::format("{}: SentencePiece loading is not implemented yet",
                                tokenizer_model.string()));
}

}  // namespace kvattn::model
