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

// The UTF-8 sequence starting at s[i]: a valid character of `len` bytes, an invalid
// "maximal subpart" of `len` bytes (replaced by one U+FFFD, as Python's errors="replace" and
// Rust's from_utf8_lossy do), or a valid prefix cut off by the end of the input.
struct Seq {
  enum State { Valid, Invalid, Truncated } state;
  size_t len;
};

Seq utf8_seq(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return {Seq::Valid, 1};
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) n = 2;
  else if (c == 0xE0) { n = 3; lo = 0xA0; }
  else if (c >= 0xE1 && c <= 0xEC) n = 3;
  else if (c == 0xED) { n = 3; hi = 0x9F; }  // no surrogates
  else if (c >= 0xEE && c <= 0xEF) n = 3;
  else if (c == 0xF0) { n = 4; lo = 0x90; }
  else if (c >= 0xF1 && c <= 0xF3) n = 4;
  else if (c == 0xF4) { n = 4; hi = 0x8F; }  // <= U+10FFFF
  else return {Seq::Invalid, 1};
  for (size_t k = 1; k < n; ++k) {
    if (i + k >= s.size()) return {Seq::Truncated, k};
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return {Seq::Invalid, k};
  }
  return {Seq::Valid, n};
}

}  // namespace

size_t utf8_complete_prefix(std::string_view s) noexcept {
  size_t i = 0;
  while (i < s.size()) {
    const Seq q = utf8_seq(s, i);
    if (q.state == Seq::Truncated) return i;  // wait for more bytes
    i += q.len;                               // invalid bytes are final (become U+FFFD)
  }
  return i;
}

std::string utf8_repair(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const Seq q = utf8_seq(s, i);
    if (q.state == Seq::Valid) out.append(s.substr(i, q.len));
    else out.append("\xEF\xBF\xBD");
    i += q.len;
  }
  return out;
}

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tok_(&tokenizer), skip_special_(skip_special_tokens) {}

// The window ids_ = [prefix_offset, end): its first read_offset_ ids produced text already
// emitted.  Decoding the window and its prefix the same way keeps position-dependent decoder
// rules (the leading-space strip of the first token) out of the difference.
std::string IncrementalDetokenizer::push(int32_t id) {
  ids_.push_back(id);
  const std::span<const int32_t> all(ids_);
  const std::string prefix = tok_->decode_bytes(all.first(read_offset_), skip_special_);
  const std::string full = tok_->decode_bytes(all, skip_special_);
  if (full.size() <= prefix.size()) return {};
  const std::string_view tail = std::string_view(full).substr(prefix.size());
  if (utf8_complete_prefix(tail) != tail.size()) return {};  // a code point is incomplete
  // Slide: the ids just decoded become the new prefix.
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(read_offset_));
  read_offset_ = ids_.size();
  return utf8_repair(tail);
}

std::string IncrementalDetokenizer::flush() {
  const std::span<const int32_t> all(ids_);
  const std::string prefix = tok_->decode_bytes(all.first(read_offset_), skip_special_);
  const std::string full = tok_->decode_bytes(all, skip_special_);
  ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(read_offset_));
  read_offset_ = ids_.size();
  if (full.size() <= prefix.size()) return {};
  return utf8_repair(std::string_view(full).substr(prefix.size()));
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
