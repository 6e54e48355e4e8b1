// kvattn/model/tokenizer.h — text <-> token ids for Hugging Face model directories.
//
// Two implementations behind one interface:
//  * tokenizer.json (the Hugging Face `tokenizers` format) with a BPE model: byte-level BPE
//    (Llama 3 / 3.1, Qwen 2 / 3: Split regex pre-tokenizer through PCRE2 with Unicode
//    properties, ByteLevel byte<->char mapping) and SentencePiece-style BPE (Llama 2, Gemma:
//    "▁" metaspace normalizer, byte fallback <0xXX>).  Added/special tokens are matched before
//    normalisation; post-processing adds BOS/EOS as the TemplateProcessing says.
//  * tokenizer.model (SentencePiece protobuf) through libsentencepiece.
// load_tokenizer prefers tokenizer.json and reads tokenizer_config.json for add_bos_token /
// add_eos_token and the bos/eos token names.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvattn::model {

class Tokenizer {
 public:
  virtual ~Tokenizer();
  // add_special_tokens: apply the post-processor (BOS/EOS as the tokenizer adds them).
  virtual std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const = 0;
  // Text of `ids`; throws InvalidArgument for an id outside [0, vocab_size()).  Bytes that do
  // not form valid UTF-8 become U+FFFD (as transformers' errors="replace").
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special_tokens = true) const = 0;
  // Raw bytes of `ids` before UTF-8 repair (what IncrementalDetokenizer assembles).
  virtual std::string decode_bytes(std::span<const int32_t> ids, bool skip_special_tokens = true) const = 0;
  virtual int64_t vocab_size() const = 0;
  // Token string (as in the vocabulary) or nullopt for an unknown id; token id for a string.
  virtual std::optional<std::string> id_to_token(int32_t id) const = 0;
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  // "tokenizer.json/BPE(byte-level)", "tokenizer.json/BPE(byte-fallback)", "sentencepiece"
  virtual std::string kind() const = 0;

  std::optional<int32_t> bos_id() const { return bos_id_; }
  std::vector<int32_t> eos_ids() const { return eos_ids_; }
  bool is_special(int32_t id) const;
  // Set by load_tokenizer from tokenizer_config.json / generation_config.json.
  void set_bos_id(std::optional<int32_t> id) { bos_id_ = id; }
  void set_eos_ids(std::vector<int32_t> ids) { eos_ids_ = std::move(ids); }

 protected:
  std::optional<int32_t> bos_id_;
  std::vector<int32_t> eos_ids_;
  std::vector<int32_t> special_ids_;  // sorted
};

// Streaming detokenisation: push ids one at a time; each push returns the new complete
// UTF-8 text (empty while a code point is incomplete).  flush() returns what remains (an
// incomplete tail as U+FFFD).  The concatenation of all outputs equals decode(all ids).
// As vLLM's detokenizer, it decodes only a sliding window of recent ids (the ids of the last
// emitted text and those after it), so a push costs O(window), not O(sequence).
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens = true);
  std::string push(int32_t id);
  std::string flush();

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::vector<int32_t> ids_;   // ids from prefix_offset on (earlier ones are dropped)
  size_t read_offset_ = 0;     // ids_[0, read_offset_) produced the last emitted text
};

// Loads tokenizer.json (preferred) or tokenizer.model from `model_dir`, with
// tokenizer_config.json.  Throws InvalidArgument when neither exists, Unsupported for a
// tokenizer.json model/normalizer/pre-tokenizer/decoder type kvattn does not implement (named).
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& model_dir);

// Individual loaders (tests).
std::unique_ptr<Tokenizer> load_tokenizer_json(const std::filesystem::path& tokenizer_json,
                                               const std::filesystem::path& tokenizer_config_json = {});
std::unique_ptr<Tokenizer> load_sentencepiece(const std::filesystem::path& tokenizer_model,
                                              const std::filesystem::path& tokenizer_config_json = {});

// UTF-8 helpers: length of the longest prefix of `s` made of complete, valid sequences
// (used by the streaming detokenizer), and a copy with invalid sequences replaced by U+FFFD.
size_t utf8_complete_prefix(std::string_view s) noexcept;
std::string utf8_repair(std::string_view s);

}  // namespace kvattn::model
