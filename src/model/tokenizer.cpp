// tokenizer.cpp — the Tokenizer base, UTF-8 helpers, streaming detokenisation, dispatch.
#include "kvattn/model/tokenizer.h"

#include <algorithm>
#include <filesystem>

#include "kvattn/core/error.h"

namespace kvattn::model {
namespace fs = std::filesystem;

Tokenizer::~Tokenizer() = default;

bool Tokenizer::is_special(int32_t id) const {
  return std::binary_search(special_ids_.begin(), special_ids_.end(), id);
}

namespace {

// Length of the valid UTF-8 sequence starting at s[i] (1..4), 0 when invalid, -1 when the
// input ends inside an otherwise valid sequence.
int utf8_seq(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  int n;
  uint32_t min;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) { n = 2; min = 0x80; }
  else if (c >= 0xE0 && c <= 0xEF) { n = 3; min = 0x800; }
  else if (c >= 0xF0 && c <= 0xF4) { n = 4; min = 0x10000; }
  else return 0;
  uint32_t cp = c & (0x7F >> n);
  for (int k = 1; k < n; ++k) {
    if (i + k >= s.size()) return -1;
    const auto cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (cc & 0x3F);
    // Reject overlongs / surrogates / > U+10FFFF as early as the second byte allows.
    if (k == 1) {
      if (n == 3 && c == 0xE0 && cc < 0xA0) return 0;
      if (n == 3 && c == 0xED && cc > 0x9F) return 0;
      if (n == 4 && c == 0xF0 && cc < 0x90) return 0;
      if (n == 4 && c == 0xF4 && cc > 0x8F) return 0;
    }
  }
  return cp >= min ? n : 0;
}

}  // namespace

size_t utf8_complete_prefix(std::string_view s) noexcept {
  size_t i = 0;
  while (i < s.size()) {
    const int n = utf8_seq(s, i);
    if (n < 0) return i;          // an incomplete tail: wait for more bytes
    i += n == 0 ? 1 : static_cast<size_t>(n);  // invalid bytes are final (become U+FFFD)
  }
  return i;
}

std::string utf8_repair(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const int n = utf8_seq(s, i);
    if (n > 0) {
      out.append(s.substr(i, static_cast<size_t>(n)));
      i += static_cast<size_t>(n);
    } else {
      out.append("\xEF\xBF\xBD");
      // An incomplete tail is one replacement character (as Python's errors="replace"
      // does for a truncated sequence); an invalid byte is one each.
      if (n < 0) break;
      ++i;
    }
  }
  return out;
}

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tok_(&tokenizer), skip_special_(skip_special_tokens) {}

std::string IncrementalDetokenizer::push(int32_t id) {
  ids_.push_back(id);
  const std::string bytes = tok_->decode_bytes(ids_, skip_special_);
  if (bytes.size() < emitted_bytes_) {
    // Decoding is not prefix-stable here (cannot happen for per-token decoders); restart.
    emitted_bytes_ = bytes.size();
    return {};
  }
  const std::string_view rest = std::string_view(bytes).substr(emitted_bytes_);
  const size_t n = utf8_complete_prefix(rest);
  emitted_bytes_ += n;
  return utf8_repair(rest.substr(0, n));
}

std::string IncrementalDetokenizer::flush() {
  const std::string bytes = tok_->decode_bytes(ids_, skip_special_);
  std::string out = bytes.size() > emitted_bytes_ ? utf8_repair(std::string_view(bytes).substr(emitted_bytes_)) : std::string();
  emitted_bytes_ = bytes.size();
  return out;
}

std::unique_ptr<Tokenizer> load_tokenizer(const fs::path& model_dir) {
  const fs::path config = model_dir / "tokenizer_config.json";
  const fs::path cfg = fs::exists(config) ? config : fs::path();
  if (fs::exists(model_dir / "tokenizer.json"))
    return load_tokenizer_json(model_dir / "tokenizer.json", cfg);
  if (fs::exists(model_dir / "tokenizer.model"))
    return load_sentencepiece(model_dir / "tokenizer.model", cfg);
  throw InvalidArgument(fmt::format(
      "'{}' has neither tokenizer.json nor tokenizer.model; copy the tokenizer files of the "
      "model into the directory",
      model_dir.string()));
}

}  // namespace kvattn::model
