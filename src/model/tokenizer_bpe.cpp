// tokenizer_bpe.cpp — tokenizer.json (the Hugging Face `tokenizers` format) with a BPE model.
//
// The pipeline is the one of `tokenizers`:
//   added tokens split out (leftmost-longest, before normalisation)
//   -> normalizer (NFC/NFKC/NFD/NFKD, Replace, Prepend, Lowercase, Sequence)
//   -> pre-tokenizer (Split with a PCRE2 Unicode regex or a literal, ByteLevel, Metaspace, Sequence)
//   -> BPE per pre-token (merges by rank, ignore_merges, byte_fallback, unk/fuse_unk)
//   -> post-processor (TemplateProcessing, ByteLevel, Sequence) when add_special_tokens.
// Decoding runs the decoder chain (ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace,
// Sequence) over the token strings, producing raw bytes; decode() repairs invalid UTF-8.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "kvattn/core/error.h"
#include "read_file.h"
#include "kvattn/model/tokenizer.h"

namespace kvattn::model {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string clip(std::string_view s, size_t n = 60) {
  return s.size() <= n ? std::string(s) : std::string(s.substr(0, n)) + "...";
}

std::string read_text(const std::filesystem::path& p) { return detail::read_file(p); }

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

// Length in bytes of the UTF-8 character at s[i] (input is valid UTF-8).
size_t char_len(std::string_view s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  return std::min(n, s.size() - i);
}

uint32_t decode_cp(std::string_view s, size_t i, size_t n) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (n == 1) return c;
  uint32_t cp = c & (0x7F >> n);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t k = s.find(from, pos);
    if (k == std::string::npos) break;
    out.append(s, pos, k - pos);
    out.append(to);
    pos = k + from.size();
  }
  if (pos == 0) return;
  out.append(s, pos, std::string::npos);
  s = std::move(out);
}

// GPT-2's reversible byte <-> printable character mapping.
struct ByteLevelMap {
  std::array<std::string, 256> byte_to_str;
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;
  ByteLevelMap() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      append_utf8(byte_to_str[b], cp);
      cp_to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};
const ByteLevelMap& byte_level() {
  static const ByteLevelMap m;
  return m;
}

// A compiled PCRE2 pattern (UTF + Unicode properties), shared read-only between threads.
class Regex {
 public:
  explicit Regex(const std::string& pattern) : pattern_(pattern) {
    int err = 0;
    PCRE2_SIZE off = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP, &err, &off, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw Unsupported(fmt::format("tokenizer.json: regex '{}' does not compile with PCRE2 at "
                                    "offset {}: {}",
                                    clip(pattern, 120), off, reinterpret_cast<char*>(msg)));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // best effort; the interpreter is the fallback
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // All non-overlapping matches [begin, end) in `s` (valid UTF-8).
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view s) const {
    std::vector<std::pair<size_t, size_t>> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    if (!md) throw OutOfMemory("pcre2_match_data_create_from_pattern failed");
    size_t pos = 0;
    while (pos <= s.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos,
                                 PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        pcre2_match_data_free(md);
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        throw InternalError(fmt::format("PCRE2 match failed for '{}': {}", clip(pattern_),
                                        reinterpret_cast<char*>(msg)));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t b = ov[0], e = ov[1];
      if (e > b) out.emplace_back(b, e);
      pos = e > b ? e : (b < s.size() ? b + char_len(s, b) : s.size() + 1);
    }
    pcre2_match_data_free(md);
    return out;
  }

 private:
  std::string pattern_;
  pcre2_code* code_ = nullptr;
};

// A pre-token: its text and whether it begins at offset 0 of the input (Metaspace "first").
struct Piece {
  std::string text;
  bool at_start = false;
};

// ---- normalizers ----------------------------------------------------------------------

struct Normalizer {
  enum Kind { NFC, NFKC, NFD, NFKD, Lowercase, Replace, Prepend, Sequence } kind;
  std::string a, b;                      // Replace: pattern -> content; Prepend: prefix
  std::shared_ptr<Regex> regex;          // Replace with a Regex pattern
  std::vector<Normalizer> children;      // Sequence

  void apply(std::string& s) const {
    switch (kind) {
      case NFC: case NFKC: case NFD: case NFKD: {
        if (s.empty()) return;
        int opts = UTF8PROC_STABLE;
        if (kind == NFC || kind == NFKC) opts |= UTF8PROC_COMPOSE;
        else opts |= UTF8PROC_DECOMPOSE;
        if (kind == NFKC || kind == NFKD) opts |= UTF8PROC_COMPAT;
        utf8proc_uint8_t* dst = nullptr;
        const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                                static_cast<utf8proc_ssize_t>(s.size()), &dst,
                                                static_cast<utf8proc_option_t>(opts));
        if (n < 0) {
          std::free(dst);
          throw InvalidArgument(fmt::format("Unicode normalisation failed: {}", utf8proc_errmsg(n)));
        }
        s.assign(reinterpret_cast<char*>(dst), static_cast<size_t>(n));
        std::free(dst);
        return;
      }
      case Lowercase: {
        std::string out;
        for (size_t i = 0; i < s.size();) {
          const size_t n = char_len(s, i);
          append_utf8(out, static_cast<uint32_t>(utf8proc_tolower(
                               static_cast<utf8proc_int32_t>(decode_cp(s, i, n)))));
          i += n;
        }
        s = std::move(out);
        return;
      }
      case Replace:
        if (regex) {
          std::string out;
          size_t pos = 0;
          for (auto [mb, me] : regex->find_all(s)) {
            out.append(s, pos, mb - pos);
            out.append(b);
            pos = me;
          }
          out.append(s, pos, std::string::npos);
          s = std::move(out);
        } else {
          replace_all(s, a, b);
        }
        return;
      case Prepend:
        if (!s.empty()) s.insert(0, a);
        return;
      case Sequence:
        for (const auto& c : children) c.apply(s);
        return;
    }
  }
};

std::pair<std::string, std::shared_ptr<Regex>> parse_pattern(const json& p, const char* where) {
  if (p.is_object() && p.contains("String") && p["String"].is_string())
    return {p["String"].get<std::string>(), nullptr};
  if (p.is_object() && p.contains("Regex") && p["Regex"].is_string())
    return {{}, std::make_shared<Regex>(p["Regex"].get<std::string>())};
  throw InvalidArgument(fmt::format("tokenizer.json: {} pattern must be {{\"String\": ...}} or "
                                    "{{\"Regex\": ...}}, got {}",
                                    where, clip(p.dump())));
}

std::string str_field(const json& j, const char* key, const char* where) {
  if (!j.contains(key) || !j[key].is_string())
    throw InvalidArgument(fmt::format("tokenizer.json: {} needs a string field '{}'", where, key));
  return j[key].get<std::string>();
}

std::string type_of(const json& j, const char* where) {
  if (!j.is_object() || !j.contains("type") || !j["type"].is_string())
    throw InvalidArgument(fmt::format("tokenizer.json: {} needs a \"type\"", where));
  return j["type"].get<std::string>();
}

Normalizer parse_normalizer(const json& j) {
  const std::string t = type_of(j, "normalizer");
  Normalizer n{};
  if (t == "NFC") n.kind = Normalizer::NFC;
  else if (t == "NFKC") n.kind = Normalizer::NFKC;
  else if (t == "NFD") n.kind = Normalizer::NFD;
  else if (t == "NFKD") n.kind = Normalizer::NFKD;
  else if (t == "Lowercase") n.kind = Normalizer::Lowercase;
  else if (t == "Prepend") {
    n.kind = Normalizer::Prepend;
    n.a = str_field(j, "prepend", "Prepend normalizer");
  } else if (t == "Replace") {
    n.kind = Normalizer::Replace;
    if (!j.contains("pattern")) throw InvalidArgument("tokenizer.json: Replace normalizer needs a pattern");
    std::tie(n.a, n.regex) = parse_pattern(j["pattern"], "Replace normalizer");
    n.b = str_field(j, "content", "Replace normalizer");
  } else if (t == "Sequence") {
    n.kind = Normalizer::Sequence;
    if (!j.contains("normalizers") || !j["normalizers"].is_array())
      throw InvalidArgument("tokenizer.json: Sequence normalizer needs a \"normalizers\" list");
    for (const json& c : j["normalizers"]) n.children.push_back(parse_normalizer(c));
  } else {
    throw Unsupported(fmt::format("tokenizer.json: normalizer type '{}' is not supported; "
                                  "supported: NFC, NFKC, NFD, NFKD, Lowercase, Replace, Prepend, "
                                  "Sequence",
                                  clip(t)));
  }
  return n;
}

// ---- pre-tokenizers -------------------------------------------------------------------

// The GPT-2 regex ByteLevel uses when use_regex is true.
constexpr const char* kGpt2Pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

struct PreTokenizer {
  enum Kind { Split, ByteLevel, Metaspace, Sequence } kind;
  // Split
  std::string literal;
  std::shared_ptr<Regex> regex;
  enum Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous } behavior = Isolated;
  bool invert = false;
  // ByteLevel
  bool add_prefix_space = false;
  // Metaspace
  std::string replacement = "\xE2\x96\x81";
  enum Prepend { Always, First, Never } prepend = Always;
  bool split = true;
  std::vector<PreTokenizer> children;

  // Splits one piece by the pattern with the behaviour (tokenizers' SplitDelimiterBehavior).
  static void split_by(const Piece& p, const std::vector<std::pair<size_t, size_t>>& matches,
                       Behavior behavior, bool invert, std::vector<Piece>& out) {
    // Segments: (begin, end, is_match)
    std::vector<std::tuple<size_t, size_t, bool>> segs;
    size_t pos = 0;
    for (auto [b, e] : matches) {
      if (b > pos) segs.emplace_back(pos, b, invert);
      segs.emplace_back(b, e, !invert);
      pos = e;
    }
    if (pos < p.text.size()) segs.emplace_back(pos, p.text.size(), invert);
    std::vector<std::pair<size_t, size_t>> pieces;
    switch (behavior) {
      case Isolated:
        for (auto [b, e, m] : segs) pieces.emplace_back(b, e);
        break;
      case Removed:
        for (auto [b, e, m] : segs)
          if (!m) pieces.emplace_back(b, e);
        break;
      case MergedWithPrevious: {
        bool prev_match = false;
        for (auto [b, e, m] : segs) {
          if (m && !pieces.empty() && !prev_match) pieces.back().second = e;
          else pieces.emplace_back(b, e);
          prev_match = m;
        }
        break;
      }
      case MergedWithNext: {
        bool prev_match = false;
        for (auto [b, e, m] : segs) {
          if (prev_match && !pieces.empty()) pieces.back().second = e;
          else pieces.emplace_back(b, e);
          prev_match = m;
        }
        break;
      }
      case Contiguous: {
        bool prev_match = false;
        for (auto [b, e, m] : segs) {
          if (m && prev_match && !pieces.empty()) pieces.back().second = e;
          else pieces.emplace_back(b, e);
          prev_match = m;
        }
        break;
      }
    }
    for (auto [b, e] : pieces)
      if (e > b) out.push_back({p.text.substr(b, e - b), p.at_start && b == 0});
  }

  void apply(std::vector<Piece>& pieces) const {
    std::vector<Piece> out;
    switch (kind) {
      case Sequence:
        for (const auto& c : children) c.apply(pieces);
        return;
      case Split:
        for (const Piece& p : pieces) {
          std::vector<std::pair<size_t, size_t>> m;
          if (regex) {
            m = regex->find_all(p.text);
          } else if (!literal.empty()) {
            for (size_t k = p.text.find(literal); k != std::string::npos;
                 k = p.text.find(literal, k + literal.size()))
              m.emplace_back(k, k + literal.size());
          }
          split_by(p, m, behavior, invert, out);
        }
        break;
      case ByteLevel: {
        static const Regex gpt2(kGpt2Pattern);
        const auto& map = byte_level();
        for (Piece p : pieces) {
          if (add_prefix_space && (p.text.empty() || p.text[0] != ' ')) p.text.insert(0, " ");
          std::vector<Piece> parts;
          if (regex) split_by(p, gpt2.find_all(p.text), Isolated, false, parts);
          else parts.push_back(p);
          for (Piece& q : parts) {
            std::string mapped;
            mapped.reserve(q.text.size() * 2);
            for (unsigned char c : q.text) mapped += map.byte_to_str[c];
            q.text = std::move(mapped);
            out.push_back(std::move(q));
          }
        }
        break;
      }
      case Metaspace:
        for (Piece p : pieces) {
          replace_all(p.text, " ", replacement);
          const bool starts = p.text.compare(0, replacement.size(), replacement) == 0;
          if (!starts && (prepend == Always || (prepend == First && p.at_start)))
            p.text.insert(0, replacement);
          if (split) {
            std::vector<std::pair<size_t, size_t>> m;
            for (size_t k = p.text.find(replacement); k != std::string::npos;
                 k = p.text.find(replacement, k + replacement.size()))
              m.emplace_back(k, k + replacement.size());
            split_by(p, m, MergedWithNext, false, out);
          } else {
            out.push_back(std::move(p));
          }
        }
        break;
    }
    pieces = std::move(out);
  }
};

bool bool_field(const json& j, const char* key, bool def) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return def;
  if (!it->is_boolean())
    throw InvalidArgument(fmt::format("tokenizer.json: field '{}' must be a boolean", key));
  return it->get<bool>();
}

PreTokenizer parse_pre_tokenizer(const json& j) {
  const std::string t = type_of(j, "pre_tokenizer");
  PreTokenizer p{};
  if (t == "Sequence") {
    p.kind = PreTokenizer::Sequence;
    if (!j.contains("pretokenizers") || !j["pretokenizers"].is_array())
      throw InvalidArgument("tokenizer.json: Sequence pre_tokenizer needs \"pretokenizers\"");
    for (const json& c : j["pretokenizers"]) p.children.push_back(parse_pre_tokenizer(c));
  } else if (t == "Split") {
    p.kind = PreTokenizer::Split;
    if (!j.contains("pattern")) throw InvalidArgument("tokenizer.json: Split needs a pattern");
    std::tie(p.literal, p.regex) = parse_pattern(j["pattern"], "Split pre_tokenizer");
    const std::string b = str_field(j, "behavior", "Split pre_tokenizer");
    if (b == "Removed") p.behavior = PreTokenizer::Removed;
    else if (b == "Isolated") p.behavior = PreTokenizer::Isolated;
    else if (b == "MergedWithPrevious") p.behavior = PreTokenizer::MergedWithPrevious;
    else if (b == "MergedWithNext") p.behavior = PreTokenizer::MergedWithNext;
    else if (b == "Contiguous") p.behavior = PreTokenizer::Contiguous;
    else
      throw Unsupported(fmt::format("tokenizer.json: Split behavior '{}' is not one of Removed, "
                                    "Isolated, MergedWithPrevious, MergedWithNext, Contiguous",
                                    clip(b)));
    p.invert = bool_field(j, "invert", false);
  } else if (t == "ByteLevel") {
    p.kind = PreTokenizer::ByteLevel;
    p.add_prefix_space = bool_field(j, "add_prefix_space", true);
    if (bool_field(j, "use_regex", true)) p.regex = std::make_shared<Regex>(kGpt2Pattern);
  } else if (t == "Metaspace") {
    p.kind = PreTokenizer::Metaspace;
    if (j.contains("replacement")) p.replacement = str_field(j, "replacement", "Metaspace");
    std::string scheme = j.contains("prepend_scheme") && j["prepend_scheme"].is_string()
                             ? j["prepend_scheme"].get<std::string>()
                             : (bool_field(j, "add_prefix_space", true) ? "always" : "never");
    if (scheme == "always") p.prepend = PreTokenizer::Always;
    else if (scheme == "first") p.prepend = PreTokenizer::First;
    else if (scheme == "never") p.prepend = PreTokenizer::Never;
    else throw InvalidArgument(fmt::format("tokenizer.json: Metaspace prepend_scheme '{}' is not "
                                           "one of always, first, never", clip(scheme)));
    p.split = bool_field(j, "split", true);
  } else {
    throw Unsupported(fmt::format("tokenizer.json: pre_tokenizer type '{}' is not supported; "
                                  "supported: Split, ByteLevel, Metaspace, Sequence",
                                  clip(t)));
  }
  return p;
}

// ---- decoders -------------------------------------------------------------------------

struct Decoder {
  enum Kind { ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence } kind;
  std::string a, b;
  int64_t start = 0, stop = 0;
  bool prepend = true;
  std::vector<Decoder> children;

  static bool byte_token(const std::string& t, uint8_t* out) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return false;
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return -1;
    };
    const int h = hex(t[3]), l = hex(t[4]);
    if (h < 0 || l < 0) return false;
    *out = static_cast<uint8_t>(h * 16 + l);
    return true;
  }

  void apply(std::vector<std::string>& toks) const {
    switch (kind) {
      case Sequence:
        for (const auto& c : children) c.apply(toks);
        return;
      case ByteLevel: {
        const auto& map = byte_level();
        std::string bytes;
        for (const std::string& t : toks) {
          std::string part;
          bool ok = true;
          for (size_t i = 0; i < t.size() && ok;) {
            const size_t n = char_len(t, i);
            auto it = map.cp_to_byte.find(decode_cp(t, i, n));
            if (it == map.cp_to_byte.end()) ok = false;
            else part += static_cast<char>(it->second);
            i += n;
          }
          bytes += ok ? part : t;  // a token outside the byte alphabet (added token) as is
        }
        toks.assign(1, std::move(bytes));
        return;
      }
      case Replace:
        for (auto& t : toks) replace_all(t, a, b);
        return;
      case ByteFallback: {
        std::vector<std::string> out;
        std::string run;
        bool in_run = false;
        for (auto& t : toks) {
          uint8_t byte = 0;
          if (byte_token(t, &byte)) {
            run += static_cast<char>(byte);
            in_run = true;
          } else {
            if (in_run) out.push_back(std::move(run));
            run.clear();
            in_run = false;
            out.push_back(std::move(t));
          }
        }
        if (in_run) out.push_back(std::move(run));
        toks = std::move(out);
        return;
      }
      case Fuse: {
        std::string all;
        for (const auto& t : toks) all += t;
        toks.assign(1, std::move(all));
        return;
      }
      case Strip:
        for (auto& t : toks) {
          int64_t s = 0;
          size_t lo = 0;
          while (s < start && t.compare(lo, a.size(), a) == 0 && !a.empty()) {
            lo += a.size();
            ++s;
          }
          size_t hi = t.size();
          s = 0;
          while (s < stop && hi >= lo + a.size() && !a.empty() &&
                 t.compare(hi - a.size(), a.size(), a) == 0) {
            hi -= a.size();
            ++s;
          }
          t = t.substr(lo, hi - lo);
        }
        return;
      case Metaspace:
        for (size_t i = 0; i < toks.size(); ++i) {
          replace_all(toks[i], a, " ");
          if (i == 0 && prepend && !toks[i].empty() && toks[i][0] == ' ') toks[i].erase(0, 1);
        }
        return;
    }
  }
};

Decoder parse_decoder(const json& j) {
  const std::string t = type_of(j, "decoder");
  Decoder d{};
  if (t == "Sequence") {
    d.kind = Decoder::Sequence;
    if (!j.contains("decoders") || !j["decoders"].is_array())
      throw InvalidArgument("tokenizer.json: Sequence decoder needs \"decoders\"");
    for (const json& c : j["decoders"]) d.children.push_back(parse_decoder(c));
  } else if (t == "ByteLevel") {
    d.kind = Decoder::ByteLevel;
  } else if (t == "Replace") {
    d.kind = Decoder::Replace;
    std::shared_ptr<Regex> re;
    std::tie(d.a, re) = parse_pattern(j.value("pattern", json()), "Replace decoder");
    if (re) throw Unsupported("tokenizer.json: a Regex pattern in a Replace decoder is not supported");
    d.b = str_field(j, "content", "Replace decoder");
  } else if (t == "ByteFallback") {
    d.kind = Decoder::ByteFallback;
  } else if (t == "Fuse") {
    d.kind = Decoder::Fuse;
  } else if (t == "Strip") {
    d.kind = Decoder::Strip;
    d.a = str_field(j, "content", "Strip decoder");
    d.start = j.value("start", 0);
    d.stop = j.value("stop", 0);
  } else if (t == "Metaspace") {
    d.kind = Decoder::Metaspace;
    d.a = j.contains("replacement") ? str_field(j, "replacement", "Metaspace decoder") : "\xE2\x96\x81";
    const std::string scheme = j.contains("prepend_scheme") && j["prepend_scheme"].is_string()
                                   ? j["prepend_scheme"].get<std::string>()
                                   : (bool_field(j, "add_prefix_space", true) ? "always" : "never");
    d.prepend = scheme != "never";
  } else {
    throw Unsupported(fmt::format("tokenizer.json: decoder type '{}' is not supported; supported: "
                                  "ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace, Sequence",
                                  clip(t)));
  }
  return d;
}

// ---- added tokens: a byte trie for leftmost-longest matching ---------------------------

class AddedTrie {
 public:
  void add(std::string_view s, int32_t id) {
    if (s.empty()) return;
    int node = 0;
    for (unsigned char c : s) {
      auto& kids = nodes_[node].kids;
      auto it = std::lower_bound(kids.begin(), kids.end(), std::pair<uint8_t, int>(c, -1));
      if (it != kids.end() && it->first == c) {
        node = it->second;
      } else {
        const int fresh = static_cast<int>(nodes_.size());
        kids.insert(it, {c, fresh});
        nodes_.push_back({});
        node = fresh;
      }
    }
    nodes_[node].id = id;
  }
  // Longest token starting at text[i]: (length, id) or (0, -1).
  std::pair<size_t, int32_t> longest(std::string_view text, size_t i) const {
    int node = 0;
    std::pair<size_t, int32_t> best{0, -1};
    for (size_t k = i; k < text.size(); ++k) {
      const auto& kids = nodes_[node].kids;
      const auto c = static_cast<uint8_t>(text[k]);
      auto it = std::lower_bound(kids.begin(), kids.end(), std::pair<uint8_t, int>(c, -1));
      if (it == kids.end() || it->first != c) break;
      node = it->second;
      if (nodes_[node].id >= 0) best = {k + 1 - i, nodes_[node].id};
    }
    return best;
  }
  bool empty() const { return nodes_.size() == 1; }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int>> kids;  // sorted by byte
    int32_t id = -1;
  };
  std::vector<Node> nodes_{Node{}};
};

// ---- the tokenizer ---------------------------------------------------------------------

class BpeTokenizer final : public Tokenizer {
 public:
  BpeTokenizer(const json& j, const json* config, const std::string& label);

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override;
  std::string decode(std::span<const int32_t> ids, bool skip_special_tokens) const override {
    return utf8_repair(decode_bytes(ids, skip_special_tokens));
  }
  std::string decode_bytes(std::span<const int32_t> ids, bool skip_special_tokens) const override;
  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_tok_.size()); }
  std::optional<std::string> id_to_token(int32_t id) const override {
    if (id < 0 || static_cast<size_t>(id) >= id_to_tok_.size() || !has_id_[id]) return std::nullopt;
    return id_to_tok_[id];
  }
  std::optional<int32_t> token_to_id(std::string_view token) const override {
    auto it = added_.find(std::string(token));
    if (it != added_.end()) return it->second;
    auto v = vocab_.find(std::string(token));
    if (v != vocab_.end()) return v->second;
    return std::nullopt;
  }
  std::string kind() const override { return kind_; }

 private:
  void bpe_word(const std::string& word, std::vector<int32_t>& out) const;
  void encode_segment(std::string_view seg, bool at_start, std::vector<int32_t>& out) const;

  std::string label_, kind_;
  std::unordered_map<std::string, int32_t> vocab_;   // model vocabulary
  std::unordered_map<std::string, int32_t> added_;   // added tokens
  std::vector<std::string> id_to_tok_;
  std::vector<bool> has_id_;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (a,b) -> (rank, merged)
  std::array<int32_t, 256> byte_ids_{};  // <0xXX> ids for byte fallback (-1 when absent)
  bool byte_fallback_ = false, ignore_merges_ = false, fuse_unk_ = false;
  std::optional<int32_t> unk_id_;
  std::optional<Normalizer> normalizer_;
  std::optional<PreTokenizer> pre_tokenizer_;
  std::optional<Decoder> decoder_;
  AddedTrie added_trie_;
  std::vector<int32_t> template_prefix_, template_suffix_;
};

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

std::optional<std::string> token_name(const json& cfg, const char* key) {
  auto it = cfg.find(key);
  if (it == cfg.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  throw InvalidArgument(fmt::format("tokenizer_config.json: {} must be a token string or an "
                                    "AddedToken object, got {}",
                                    key, clip(it->dump())));
}

BpeTokenizer::BpeTokenizer(const json& j, const json* config, const std::string& label)
    : label_(label) {
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    throw InvalidArgument(fmt::format("{}: needs a \"model\" object", label));
  const json& m = j["model"];
  const std::string mt = m.contains("type") && m["type"].is_string() ? m["type"].get<std::string>() : "BPE";
  if (mt != "BPE")
    throw Unsupported(fmt::format("{}: model type '{}' is not supported; kvattn implements BPE "
                                  "(WordPiece/Unigram/WordLevel are not; a SentencePiece "
                                  "tokenizer.model is loaded through libsentencepiece)",
                                  label, clip(mt)));
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (m.contains(k) && m[k].is_string() && !m[k].get<std::string>().empty())
      throw Unsupported(fmt::format("{}: BPE {} '{}' is not supported", label, k,
                                    clip(m[k].get<std::string>())));
  if (m.contains("dropout") && m["dropout"].is_number() && m["dropout"].get<double>() > 0)
    throw Unsupported(fmt::format("{}: BPE dropout is not supported for inference", label));
  byte_fallback_ = bool_field(m, "byte_fallback", false);
  ignore_merges_ = bool_field(m, "ignore_merges", false);
  fuse_unk_ = bool_field(m, "fuse_unk", false);

  // Vocabulary.
  if (!m.contains("vocab") || !m["vocab"].is_object())
    throw InvalidArgument(fmt::format("{}: model.vocab must be an object token -> id", label));
  int64_t max_id = -1;
  vocab_.reserve(m["vocab"].size());
  for (auto it = m["vocab"].begin(); it != m["vocab"].end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > INT32_MAX - 1)
      throw InvalidArgument(fmt::format("{}: vocab['{}'] must be a token id in [0, 2^31-1), got {}",
                                        label, clip(it.key()), clip(it.value().dump())));
    const auto id = static_cast<int32_t>(it.value().get<int64_t>());
    vocab_.emplace(it.key(), id);
    max_id = std::max<int64_t>(max_id, id);
  }
  // Added tokens.
  std::vector<std::pair<std::string, int32_t>> added_list;
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const json& a : j["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string())
        throw InvalidArgument(fmt::format("{}: every added_tokens entry needs id and content, got {}",
                                          label, clip(a.dump())));
      const int64_t id = a["id"].get<int64_t>();
      if (id < 0 || id > INT32_MAX - 1)
        throw InvalidArgument(fmt::format("{}: added token id {} is out of range", label, id));
      if (bool_field(a, "single_word", false) || bool_field(a, "lstrip", false) ||
          bool_field(a, "rstrip", false))
        throw Unsupported(fmt::format("{}: added token '{}' uses single_word/lstrip/rstrip, which "
                                      "kvattn does not implement",
                                      label, clip(a["content"].get<std::string>())));
      const std::string content = a["content"].get<std::string>();
      added_[content] = static_cast<int32_t>(id);
      added_list.emplace_back(content, static_cast<int32_t>(id));
      if (bool_field(a, "special", false)) special_ids_.push_back(static_cast<int32_t>(id));
      max_id = std::max<int64_t>(max_id, id);
    }
  }
  if (max_id < 0) throw InvalidArgument(fmt::format("{}: the vocabulary is empty", label));
  id_to_tok_.assign(static_cast<size_t>(max_id + 1), std::string());
  has_id_.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [tok, id] : vocab_) {
    id_to_tok_[id] = tok;
    has_id_[id] = true;
  }
  for (const auto& [tok, id] : added_list) {
    id_to_tok_[id] = tok;
    has_id_[id] = true;
    added_trie_.add(tok, id);
  }
  std::sort(special_ids_.begin(), special_ids_.end());
  special_ids_.erase(std::unique(special_ids_.begin(), special_ids_.end()), special_ids_.end());

  // Merges: "a b" strings or ["a", "b"] pairs; rank = position (a later duplicate wins, as
  // in tokenizers).
  if (m.contains("merges")) {
    if (!m["merges"].is_array())
      throw InvalidArgument(fmt::format("{}: model.merges must be a list", label));
    merges_.reserve(m["merges"].size());
    int32_t rank = 0;
    std::string a, b, ab;
    for (const json& e : m["merges"]) {
      if (e.is_string()) {
        const std::string& s = e.get_ref<const std::string&>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
          throw InvalidArgument(fmt::format("{}: merge '{}' must be two tokens separated by one "
                                            "space",
                                            label, clip(s)));
        a.assign(s, 0, sp);
        b.assign(s, sp + 1);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        a = e[0].get_ref<const std::string&>();
        b = e[1].get_ref<const std::string&>();
      } else {
        throw InvalidArgument(fmt::format("{}: merge {} must be \"a b\" or [\"a\", \"b\"]", label,
                                          clip(e.dump())));
      }
      ab.assign(a).append(b);
      auto ia = vocab_.find(a), ib = vocab_.find(b), iab = vocab_.find(ab);
      if (ia == vocab_.end() || ib == vocab_.end() || iab == vocab_.end())
        throw InvalidArgument(fmt::format("{}: merge ('{}', '{}') uses a token missing from the "
                                          "vocabulary",
                                          label, clip(a), clip(b)));
      merges_[pair_key(ia->second, ib->second)] = {rank++, iab->second};
    }
  }
  byte_ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(fmt::format("<0x{:02X}>", b));
    if (it != vocab_.end()) byte_ids_[b] = it->second;
  }
  if (m.contains("unk_token") && m["unk_token"].is_string()) {
    auto it = vocab_.find(m["unk_token"].get<std::string>());
    if (it == vocab_.end())
      throw InvalidArgument(fmt::format("{}: unk_token '{}' is not in the vocabulary", label,
                                        clip(m["unk_token"].get<std::string>())));
    unk_id_ = it->second;
  }

  if (j.contains("normalizer") && !j["normalizer"].is_null()) normalizer_ = parse_normalizer(j["normalizer"]);
  if (j.contains("pre_tokenizer") && !j["pre_tokenizer"].is_null())
    pre_tokenizer_ = parse_pre_tokenizer(j["pre_tokenizer"]);
  if (j.contains("decoder") && !j["decoder"].is_null()) decoder_ = parse_decoder(j["decoder"]);
  const bool byte_level = pre_tokenizer_ && [&] {
    std::function<bool(const PreTokenizer&)> has = [&](const PreTokenizer& p) {
      if (p.kind == PreTokenizer::ByteLevel) return true;
      for (const auto& c : p.children)
        if (has(c)) return true;
      return false;
    };
    return has(*pre_tokenizer_);
  }();
  kind_ = byte_level ? "tokenizer.json/BPE(byte-level)"
                     : (byte_fallback_ ? "tokenizer.json/BPE(byte-fallback)" : "tokenizer.json/BPE");

  // Post-processor: the ids TemplateProcessing puts around a single sequence.
  std::function<void(const json&)> post = [&](const json& p) {
    const std::string t = type_of(p, "post_processor");
    if (t == "Sequence") {
      if (!p.contains("processors") || !p["processors"].is_array())
        throw InvalidArgument(fmt::format("{}: Sequence post_processor needs \"processors\"", label));
      for (const json& c : p["processors"]) post(c);
    } else if (t == "ByteLevel") {
      // Offsets only; ids unchanged.
    } else if (t == "TemplateProcessing") {
      if (!p.contains("single") || !p["single"].is_array())
        throw InvalidArgument(fmt::format("{}: TemplateProcessing needs \"single\"", label));
      bool seen_seq = false;
      for (const json& piece : p["single"]) {
        if (piece.contains("Sequence")) {
          seen_seq = true;
        } else if (piece.contains("SpecialToken") && piece["SpecialToken"].contains("id")) {
          const std::string name = piece["SpecialToken"]["id"].get<std::string>();
          std::vector<int32_t> ids;
          if (p.contains("special_tokens") && p["special_tokens"].contains(name) &&
              p["special_tokens"][name].contains("ids")) {
            for (const json& x : p["special_tokens"][name]["ids"]) ids.push_back(x.get<int32_t>());
          } else if (auto id = token_to_id(name)) {
            ids.push_back(*id);
          } else {
            throw InvalidArgument(fmt::format("{}: template token '{}' is unknown", label, clip(name)));
          }
          auto& dst = seen_seq ? template_suffix_ : template_prefix_;
          dst.insert(dst.end(), ids.begin(), ids.end());
        } else {
          throw InvalidArgument(fmt::format("{}: TemplateProcessing piece {} is not understood",
                                            label, clip(piece.dump())));
        }
      }
    } else {
      throw Unsupported(fmt::format("{}: post_processor type '{}' is not supported; supported: "
                                    "TemplateProcessing, ByteLevel, Sequence",
                                    label, clip(t)));
    }
  };
  if (j.contains("post_processor") && !j["post_processor"].is_null()) post(j["post_processor"]);

  // tokenizer_config.json: bos/eos names; add_bos_token / add_eos_token override the template
  // (as transformers' Llama/Gemma tokenizers rebuild their post-processor).
  if (config) {
    const json& c = *config;
    if (auto bos = token_name(c, "bos_token")) {
      auto id = token_to_id(*bos);
      if (!id)
        throw InvalidArgument(fmt::format("tokenizer_config.json: bos_token '{}' is not a token of "
                                          "{}", clip(*bos), label));
      bos_id_ = *id;
    }
    if (auto eos = token_name(c, "eos_token")) {
      auto id = token_to_id(*eos);
      if (!id)
        throw InvalidArgument(fmt::format("tokenizer_config.json: eos_token '{}' is not a token of "
                                          "{}", clip(*eos), label));
      eos_ids_ = {*id};
    }
    auto flag = [&](const char* k) -> std::optional<bool> {
      auto it = c.find(k);
      if (it == c.end() || !it->is_boolean()) return std::nullopt;
      return it->get<bool>();
    };
    if (auto add_bos = flag("add_bos_token"); add_bos && bos_id_) {
      const bool has = !template_prefix_.empty() && template_prefix_.front() == *bos_id_;
      if (*add_bos && !has) template_prefix_.insert(template_prefix_.begin(), *bos_id_);
      if (!*add_bos && has) template_prefix_.erase(template_prefix_.begin());
    }
    if (auto add_eos = flag("add_eos_token"); add_eos && !eos_ids_.empty()) {
      const bool has = !template_suffix_.empty() && template_suffix_.back() == eos_ids_[0];
      if (*add_eos && !has) template_suffix_.push_back(eos_ids_[0]);
      if (!*add_eos && has) template_suffix_.pop_back();
    }
  }
}

void BpeTokenizer::bpe_word(const std::string& word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = vocab_.find(word);
    if (it != vocab_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  struct Sym {
    int32_t id;
    int prev, next;
    bool alive;
  };
  std::vector<Sym> syms;
  syms.reserve(word.size());
  bool last_unk = false;
  for (size_t i = 0; i < word.size();) {
    const size_t n = char_len(word, i);
    auto it = vocab_.find(word.substr(i, n));
    if (it != vocab_.end()) {
      syms.push_back({it->second, 0, 0, true});
      last_unk = false;
    } else {
      bool done = false;
      if (byte_fallback_) {
        bool all = true;
        for (size_t k = 0; k < n; ++k) all = all && byte_ids_[static_cast<uint8_t>(word[i + k])] >= 0;
        if (all) {
          for (size_t k = 0; k < n; ++k)
            syms.push_back({byte_ids_[static_cast<uint8_t>(word[i + k])], 0, 0, true});
          done = true;
          last_unk = false;
        }
      }
      if (!done) {
        if (!unk_id_)
          throw InvalidArgument(fmt::format(
              "{}: the character '{}' is not in the vocabulary and the tokenizer has no unk_token "
              "or byte fallback",
              label_, clip(word.substr(i, n))));
        if (!(fuse_unk_ && last_unk)) syms.push_back({*unk_id_, 0, 0, true});
        last_unk = true;
      }
    }
    i += n;
  }
  const int len = static_cast<int>(syms.size());
  for (int i = 0; i < len; ++i) {
    syms[i].prev = i - 1;
    syms[i].next = i + 1 < len ? i + 1 : -1;
  }
  struct Merge {
    int32_t rank;
    int pos;
    int32_t new_id;
    bool operator>(const Merge& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Merge, std::vector<Merge>, std::greater<Merge>> queue;
  auto lookup = [&](int32_t a, int32_t b) -> const std::pair<int32_t, int32_t>* {
    auto it = merges_.find(pair_key(a, b));
    return it == merges_.end() ? nullptr : &it->second;
  };
  for (int i = 0; i + 1 < len; ++i)
    if (auto* mg = lookup(syms[i].id, syms[i + 1].id)) queue.push({mg->first, i, mg->second});
  while (!queue.empty()) {
    const Merge top = queue.top();
    queue.pop();
    Sym& cur = syms[top.pos];
    if (!cur.alive || cur.next < 0) continue;
    const int nx = cur.next;
    auto* mg = lookup(cur.id, syms[nx].id);
    if (!mg || mg->second != top.new_id) continue;
    cur.id = top.new_id;
    syms[nx].alive = false;
    cur.next = syms[nx].next;
    if (cur.next >= 0) syms[cur.next].prev = top.pos;
    if (cur.prev >= 0)
      if (auto* p = lookup(syms[cur.prev].id, cur.id)) queue.push({p->first, cur.prev, p->second});
    if (cur.next >= 0)
      if (auto* p = lookup(cur.id, syms[cur.next].id)) queue.push({p->first, top.pos, p->second});
  }
  for (int i = len > 0 ? 0 : -1; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
}

void BpeTokenizer::encode_segment(std::string_view seg, bool at_start, std::vector<int32_t>& out) const {
  std::string s(seg);
  if (normalizer_) normalizer_->apply(s);
  std::vector<Piece> pieces;
  if (!s.empty()) pieces.push_back({std::move(s), at_start});
  if (pre_tokenizer_) pre_tokenizer_->apply(pieces);
  for (const Piece& p : pieces) bpe_word(p.text, out);
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (utf8_complete_prefix(text) != text.size() || utf8_repair(text) != text)
    throw InvalidArgument(fmt::format("text to encode is not valid UTF-8 (first bad byte near "
                                      "offset {}); pass UTF-8 text",
                                      utf8_complete_prefix(text)));
  std::vector<int32_t> out;
  if (add_special_tokens) out = template_prefix_;
  size_t seg_start = 0;
  for (size_t i = 0; i < text.size();) {
    auto [n, id] = added_trie_.longest(text, i);
    if (n == 0) {
      ++i;
      continue;
    }
    if (i > seg_start) encode_segment(text.substr(seg_start, i - seg_start), seg_start == 0, out);
    out.push_back(id);
    i += n;
    seg_start = i;
  }
  if (seg_start < text.size()) encode_segment(text.substr(seg_start), seg_start == 0, out);
  if (add_special_tokens) out.insert(out.end(), template_suffix_.begin(), template_suffix_.end());
  return out;
}

std::string BpeTokenizer::decode_bytes(std::span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= id_to_tok_.size() || !has_id_[id])
      throw InvalidArgument(fmt::format("token id {} is not in the vocabulary [0, {}) of {}", id,
                                        id_to_tok_.size(), label_));
    if (skip_special_tokens && is_special(id)) continue;
    toks.push_back(id_to_tok_[id]);
  }
  if (decoder_) decoder_->apply(toks);
  std::string out;
  for (const auto& t : toks) out += t;
  return out;
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer_json(const fs::path& tokenizer_json,
                                               const fs::path& tokenizer_config_json) {
  json j;
  try {
    j = json::parse(read_text(tokenizer_json));
  } catch (const json::exception& e) {
    throw InvalidArgument(fmt::format("{}: not valid JSON ({})", tokenizer_json.string(), e.what()));
  }
  json cfg;
  const json* cfgp = nullptr;
  if (!tokenizer_config_json.empty()) {
    try {
      cfg = json::parse(read_text(tokenizer_config_json));
    } catch (const json::exception& e) {
      throw InvalidArgument(
          fmt::format("{}: not valid JSON ({})", tokenizer_config_json.string(), e.what()));
    }
    if (!cfg.is_object())
      throw InvalidArgument(fmt::format("{}: must be a JSON object", tokenizer_config_json.string()));
    cfgp = &cfg;
  }
  try {
    return std::make_unique<BpeTokenizer>(j, cfgp, tokenizer_json.string());
  } catch (const json::exception& e) {
    throw InvalidArgument(fmt::format("{}: unexpected field type ({})", tokenizer_json.string(), e.what()));
  }
}

}  // namespace kvattn::model
