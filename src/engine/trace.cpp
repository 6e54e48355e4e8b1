#include "kvattn/engine/trace.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <random>
#include <sstream>

#include "kvattn/core/error.h"

namespace kvattn::engine {
namespace {

// Reads an integer field; returns an error message or empty.
std::string read_int(const nlohmann::json& j, const char* key, bool required, int64_t lo, int64_t hi,
                     int64_t& out) {
  auto it = j.find(key);
  if (it == j.end()) return required ? fmt::format("missing required field \"{}\"", key) : std::string();
  if (!it->is_number_integer())
    return fmt::format("field \"{}\" must be an integer, got {}", key, it->dump());
  // An unsigned value above int64's range is quoted as written (not wrapped to a negative).
  if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(hi))
    return fmt::format("field \"{}\" = {} is outside [{}, {}]", key, it->dump(), lo, hi);
  const int64_t v = it->get<int64_t>();
  if (v < lo || v > hi) return fmt::format("field \"{}\" = {} is outside [{}, {}]", key, v, lo, hi);
  out = v;
  return {};
}

}  // namespace

Trace parse_trace_jsonl(std::string_view text, int64_t max_model_len) {
  KVATTN_CHECK(max_model_len > 1, "max_model_len must be > 1, got {}", max_model_len);
  Trace trace;
  int64_t line_no = 0;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string_view::npos || line[first] == '#') {
      if (end == text.size()) break;
      continue;
    }
    auto fail = [&](std::string msg) { trace.errors.push_back({line_no, std::move(msg)}); };
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      fail("not valid JSON");
    } else if (!j.is_object()) {
      fail(fmt::format("expected a JSON object, got {}", j.type_name()));
    } else {
      static constexpr const char* kKnown[] = {"arrival_step", "arrival", "prompt_len", "output_len",
                                               "shared_prefix_id", "shared_prefix_len"};
      for (const auto& [key, value] : j.items())
        if (std::find(std::begin(kKnown), std::end(kKnown), key) == std::end(kKnown))
          trace.warnings.push_back(
              {line_no, fmt::format("unknown field \"{}\" ignored; known fields: {}", key, fmt::join(kKnown, ", "))});
      TraceRequest r;
      r.source_line = line_no;
      int64_t arrival = 0, prompt = 0, output = 0, prefix_id = -1, prefix_len = 0;
      std::string err = j.contains("arrival") && !j.contains("arrival_step")
                            ? read_int(j, "arrival", true, 0, int64_t{1} << 40, arrival)
                            : read_int(j, "arrival_step", true, 0, int64_t{1} << 40, arrival);
      if (err.empty()) err = read_int(j, "prompt_len", true, 1, max_model_len, prompt);
      if (err.empty()) err = read_int(j, "output_len", true, 1, max_model_len, output);
      if (err.empty()) err = read_int(j, "shared_prefix_id", false, 0, 1 << 30, prefix_id);
      if (err.empty()) err = read_int(j, "shared_prefix_len", false, 0, max_model_len, prefix_len);
      if (err.empty() && prompt + output > max_model_len)
        err = fmt::format("prompt_len {} + output_len {} = {} exceeds the model's max length {}; shorten the "
                          "request or raise --max-model-len",
                          prompt, output, prompt + output, max_model_len);
      if (err.empty() && prefix_len > prompt)
        err = fmt::format("shared_prefix_len {} is longer than prompt_len {}", prefix_len, prompt);
      if (err.empty() && prefix_len > 0 && prefix_id < 0)
        err = "shared_prefix_len needs a shared_prefix_id";
      if (!err.empty()) {
        fail(std::move(err));
      } else {
        r.arrival_step = arrival;
        r.prompt_len = static_cast<int32_t>(prompt);
        r.output_len = static_cast<int32_t>(output);
        r.shared_prefix_id = static_cast<int32_t>(prefix_id);
        r.shared_prefix_len = static_cast<int32_t>(prefix_id >= 0 ? prefix_len : 0);
        trace.requests.push_back(r);
      }
    }
    if (end == text.size()) break;
  }
  std::stable_sort(trace.requests.begin(), trace.requests.end(),
                   [](const TraceRequest& a, const TraceRequest& b) { return a.arrival_step < b.arrival_step; });
  for (size_t i = 0; i < trace.requests.size(); ++i) trace.requests[i].id = static_cast<int64_t>(i);
  return trace;
}

Trace load_trace_file(const std::string& path, int64_t max_model_len) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw InvalidArgument(fmt::format("cannot open trace file '{}'; pass an existing JSON Lines file or "
                                      "'default'", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_trace_jsonl(ss.str(), max_model_len);
}

Trace default_trace(int64_t max_model_len, int num_requests, uint64_t seed) {
  KVATTN_CHECK(num_requests >= 1, "default_trace: num_requests must be >= 1, got {}", num_requests);
  KVATTN_CHECK(max_model_len >= kDefaultTraceMinModelLen,
               "--max-model-len {} is below what the default trace needs ({} tokens: its requests have prompts of "
               "up to 300 and outputs of up to 48 tokens, shortened to fit but not below that); raise --max-model-len "
               "or pass a --trace whose requests fit",
               max_model_len, kDefaultTraceMinModelLen);
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  Trace t;
  const int64_t long_prompt_max = std::max<int64_t>(64, std::min<int64_t>(max_model_len / 2, 3000));
  for (int i = 0; i < num_requests; ++i) {
    TraceRequest r;
    r.arrival_step = i / 3 + (i % 5 == 4 ? uniform(0, 6) : 0);
    const bool long_context = i % 8 == 5;
    if (long_context) {
      r.prompt_len = static_cast<int32_t>(uniform(long_prompt_max / 2, long_prompt_max));
      r.output_len = static_cast<int32_t>(uniform(8, 24));
    } else {
      r.prompt_len = static_cast<int32_t>(uniform(24, 300));
      r.output_len = static_cast<int32_t>(uniform(8, 48));
      if (i % 3 != 2) {  // two thirds of chat requests share a system prompt
        r.shared_prefix_id = 0;
        r.shared_prefix_len = std::min<int32_t>(128, r.prompt_len);
        r.prompt_len = std::max<int32_t>(r.prompt_len, r.shared_prefix_len + 16);
      }
    }
    r.prompt_len = static_cast<int32_t>(std::min<int64_t>(r.prompt_len, max_model_len - r.output_len));
    r.shared_prefix_len = std::min(r.shared_prefix_len, r.prompt_len);
    t.requests.push_back(r);
  }
  std::stable_sort(t.requests.begin(), t.requests.end(),
                   [](const TraceRequest& a, const TraceRequest& b) { return a.arrival_step < b.arrival_step; });
  for (size_t i = 0; i < t.requests.size(); ++i) t.requests[i].id = static_cast<int64_t>(i);
  return t;
}

}  // namespace kvattn::engine
