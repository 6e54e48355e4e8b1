// tokenizer_spm.cpp — SentencePiece tokenizer.model through Debian's libsentencepiece.
//
// Encoding splits the control pieces (<s>, </s>, ...) out of the text first, as transformers'
// Llama/Gemma tokenizers do with their special tokens, and encodes the rest with
// SentencePieceProcessor.  Decoding assembles the bytes itself (byte pieces <0xXX> as raw
// bytes, "▁" as a space, the dummy-prefix space of the first piece removed) so that the
// streaming detokenizer sees raw bytes; for valid text this equals SentencePiece's DecodeIds.
#include <sentencepiece_processor.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kvattn/core/error.h"
#include "read_file.h"
#include "kvattn/model/tokenizer.h"

namespace kvattn::model {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // "▁"
constexpr std::string_view kUnkText = " \xE2\x81\x87 ";  // SentencePiece's rendering of <unk>

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(const fs::path& model, const json* config) : label_(model.string()) {
    const auto st = sp_.Load(model.string());
    if (!st.ok())
      throw InvalidArgument(fmt::format("{}: not a SentencePiece model ({})", label_, st.ToString()));
    const int n = sp_.GetPieceSize();
    for (int id = 0; id < n; ++id)
      if (sp_.IsControl(id)) {
        special_ids_.push_back(id);
        if (!sp_.IdToPiece(id).empty()) controls_.emplace_back(sp_.IdToPiece(id), id);
      }
    std::sort(controls_.begin(), controls_.end(),
              [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
    if (sp_.bos_id() >= 0) bos_id_ = sp_.bos_id();
    if (sp_.eos_id() >= 0) eos_ids_ = {sp_.eos_id()};
    add_bos_ = bos_id_.has_value();
    const auto probe = sp_.EncodeAsPieces("a");
    dummy_prefix_ = !probe.empty() && probe[0].compare(0, kSpace.size(), kSpace) == 0;
    if (config) {
      if (auto it = config->find("add_bos_token"); it != config->end() && it->is_boolean())
        add_bos_ = it->get<bool>() && bos_id_.has_value();
      if (auto it = config->find("add_eos_token"); it != config->end() && it->is_boolean())
        add_eos_ = it->get<bool>() && !eos_ids_.empty();
    }
  }

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override {
    if (utf8_repair(text) != text)
      throw InvalidArgument("text to encode is not valid UTF-8; pass UTF-8 text");
    std::vector<int32_t> out;
    if (add_special_tokens && add_bos_) out.push_back(*bos_id_);
    size_t seg = 0;
    auto flush = [&](size_t end) {
      if (end <= seg) return;
      std::vector<int> ids;
      const auto st = sp_.Encode(text.substr(seg, end - seg), &ids);
      if (!st.ok()) throw InternalError(fmt::format("SentencePiece Encode failed: {}", st.ToString()));
      out.insert(out.end(), ids.begin(), ids.end());
    };
    for (size_t i = 0; i < text.size();) {
      bool matched = false;
      for (const auto& [piece, id] : controls_)
        if (text.compare(i, piece.size(), piece) == 0) {
          flush(i);
          out.push_back(id);
          i += piece.size();
          seg = i;
          matched = true;
          break;
        }
      if (!matched) ++i;
    }
    flush(text.size());
    if (add_special_tokens && add_eos_) out.push_back(eos_ids_[0]);
    return out;
  }

  std::string decode_bytes(std::span<const int32_t> ids, bool skip_special_tokens) const override {
    std::string out;
    bool first = true;
    for (int32_t id : ids) {
      if (id < 0 || id >= sp_.GetPieceSize())
        throw InvalidArgument(fmt::format("token id {} is not in the vocabulary [0, {}) of {}", id,
                                          sp_.GetPieceSize(), label_));
      if (sp_.IsControl(id)) {
        if (!skip_special_tokens) out += sp_.IdToPiece(id);
        continue;
      }
      const std::string& piece = sp_.IdToPiece(id);
      std::string text;
      if (sp_.IsByte(id) && piece.size() == 6) {
        text += static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16));
      } else if (sp_.IsUnknown(id)) {
        text.append(kUnkText);
      } else {
        for (size_t k = 0; k < piece.size();) {
          if (piece.compare(k, kSpace.size(), kSpace) == 0) {
            text.push_back(' ');
            k += kSpace.size();
          } else {
            text.push_back(piece[k++]);
          }
        }
      }
      if (first && out.empty() && dummy_prefix_ && !text.empty() && text[0] == ' ') text.erase(0, 1);
      first = false;
      out += text;
    }
    return out;
  }

  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const override {
    return utf8_repair(decode_bytes(ids, skip_special_tokens));
  }
  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  std::optional<std::string> id_to_token(int32_t id) const override {
    if (id < 0 || id >= sp_.GetPieceSize()) return std::nullopt;
    return sp_.IdToPiece(id);
  }
  std::optional<int32_t> token_to_id(std::string_view token) const override {
    const int id = sp_.PieceToId(std::string(token));
    if (id == sp_.unk_id() && token != sp_.IdToPiece(sp_.unk_id())) return std::nullopt;
    return id;
  }
  std::string kind() const override { return "sentencepiece"; }

 private:
  std::string label_;
  sentencepiece::SentencePieceProcessor sp_;
  std::vector<std::pair<std::string, int32_t>> controls_;  // longest first
  bool add_bos_ = true, add_eos_ = false, dummy_prefix_ = true;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece(const fs::path& tokenizer_model,
                                              const fs::path& tokenizer_config_json) {
  json cfg;
  const json* cfgp = nullptr;
  if (!tokenizer_config_json.empty()) {
    const std::string text = detail::read_file(tokenizer_config_json);
    try {
      cfg = json::parse(text);
    } catch (const json::exception& e) {
      throw InvalidArgument(fmt::format("{}: not valid JSON ({})", tokenizer_config_json.string(), e.what()));
    }
    if (cfg.is_object()) cfgp = &cfg;
  }
  return std::make_unique<SentencePieceTokenizer>(tokenizer_model, cfgp);
}

}  // namespace kvattn::model
