// Fuzz target for the JSON Lines trace parser (kvattn::engine::parse_trace_jsonl): arbitrary
// bytes must never crash, only kvattn errors may escape, and what it returns must hold its
// contract: every request is valid for max_model_len, requests are sorted by arrival with ids
// 0..n-1, every line is either a request, an error or a comment/blank, and errors and warnings
// name lines that exist.  The bytes are also turned into structured lines (known and unknown
// keys with extreme values), so the field validators see more than invalid JSON.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "kvattn/core/error.h"
#include "kvattn/engine/trace.h"

namespace {

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "fuzz_trace: property violated: %s\n", what);
    std::abort();
  }
}

void check(const kvattn::engine::Trace& t, std::string_view text, int64_t max_len) {
  int64_t lines = 1;
  for (char c : text) lines += c == '\n';
  for (size_t i = 0; i < t.requests.size(); ++i) {
    const auto& r = t.requests[i];
    require(r.id == static_cast<int64_t>(i), "ids are 0..n-1 in order");
    require(i == 0 || t.requests[i - 1].arrival_step <= r.arrival_step, "sorted by arrival_step");
    require(r.arrival_step >= 0 && r.arrival_step <= (int64_t{1} << 40), "arrival_step in range");
    require(r.prompt_len >= 1 && r.output_len >= 1, "prompt_len and output_len >= 1");
    require(int64_t{r.prompt_len} + r.output_len <= max_len, "prompt + output within max_model_len");
    require(r.shared_prefix_len >= 0 && r.shared_prefix_len <= r.prompt_len, "prefix within the prompt");
    require(r.shared_prefix_len == 0 || r.shared_prefix_id >= 0, "a prefix has an id");
    require(r.source_line >= 1 && r.source_line <= lines, "source line exists");
  }
  for (size_t i = 0; i < t.errors.size(); ++i) {
    require(t.errors[i].line >= 1 && t.errors[i].line <= lines, "error line exists");
    require(i == 0 || t.errors[i - 1].line < t.errors[i].line, "one error per line, in order");
    require(!t.errors[i].message.empty(), "error message");
  }
  for (const auto& w : t.warnings) require(w.line >= 1 && w.line <= lines, "warning line exists");
  require(static_cast<int64_t>(t.requests.size() + t.errors.size()) <= lines, "at most one outcome per line");
}

std::string value_from(const uint8_t*& p, const uint8_t* end) {
  if (p == end) return "1";
  const uint8_t b = *p++;
  switch (b % 10) {
    case 0: return "18446744073709551615";
    case 1: return "-1";
    case 2: return "9223372036854775807";
    case 3: return "1e300";
    case 4: return "\"12\"";
    case 5: return "null";
    case 6: return "1099511627777";
    default: {
      uint32_t v = b;
      if (p != end) v = v * 256 + *p++;
      return std::to_string(v);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const int64_t max_len = size > 0 ? 2 + data[0] * 16 : 4096;
  try {
    check(kvattn::engine::parse_trace_jsonl(text, max_len), text, max_len);
  } catch (const kvattn::Error&) {
  }
  // Structured lines: keys (known, misspelled) with values chosen by the bytes.
  static constexpr const char* kKeys[] = {"arrival_step", "arrival",           "prompt_len",       "output_len",
                                          "shared_prefix_id", "shared_prefix_len", "shared_prefix_ln", "promt_len"};
  std::string lines;
  const uint8_t* p = data;
  const uint8_t* end = data + size;
  while (p != end && lines.size() < 8192) {
    lines += "{";
    const int fields = 1 + *p++ % 6;
    for (int f = 0; f < fields && p != end; ++f) {
      if (f) lines += ", ";
      lines += "\"";
      lines += kKeys[*p++ % 8];
      lines += "\": ";
      lines += value_from(p, end);
    }
    lines += "}\n";
  }
  try {
    check(kvattn::engine::parse_trace_jsonl(lines, max_len), lines, max_len);
  } catch (const kvattn::Error&) {
  }
  return 0;
}
