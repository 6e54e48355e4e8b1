// kvattn/engine/trace.h — request traces for `kvattn run`.
//
// A trace is JSON Lines, one request per line:
//   {"arrival_step": 0, "prompt_len": 512, "output_len": 64, "shared_prefix_id": 1,
//    "shared_prefix_len": 256}
// `arrival_step` (or `arrival`), `prompt_len` and `output_len` are required; the shared prefix
// fields are optional (requests with the same id start with the same `shared_prefix_len`
// tokens, which the engine may share through the block pool and attend to with cascade).
// Blank lines and lines starting with '#' are ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvattn::engine {

struct TraceRequest {
  int64_t id = 0;             // position among the valid requests, 0-based
  int64_t arrival_step = 0;   // the engine step at which the request arrives
  int32_t prompt_len = 0;     // >= 1
  int32_t output_len = 0;     // >= 1 generated tokens
  int32_t shared_prefix_id = -1;   // -1: none
  int32_t shared_prefix_len = 0;   // tokens of the prompt that are the shared prefix
  int64_t source_line = 0;    // 1-based line in the trace file (0 for generated traces)
};

struct TraceError {
  int64_t line = 0;  // 1-based
  std::string message;
};

struct Trace {
  std::vector<TraceRequest> requests;  // sorted by arrival_step, stable
  std::vector<TraceError> errors;      // malformed lines, each reported, none silently dropped
  std::vector<TraceError> warnings;    // served lines with something ignored (an unknown field)
};

// Parses JSON Lines.  Every malformed line (bad JSON, missing or negative fields, a prompt
// longer than max_model_len or prompt+output beyond it, prefix longer than the prompt) becomes
// one TraceError naming the line (a value out of range is quoted as written); every valid
// line becomes a request.  A field the format does not know (e.g. a misspelled
// "shared_prefix_ln") is a warning naming the line and the known fields.
Trace parse_trace_jsonl(std::string_view text, int64_t max_model_len);
Trace load_trace_file(const std::string& path, int64_t max_model_len);

// The built-in default workload: a deterministic mix of chat-like requests (short prompts,
// some sharing a 128-token system prompt) and long-context requests, arriving over the first
// steps.  Sized to finish in well under a minute on a 2-core CPU.  Needs max_model_len >=
// kDefaultTraceMinModelLen (InvalidArgument otherwise, in --max-model-len terms).
inline constexpr int64_t kDefaultTraceMinModelLen = 64;
Trace default_trace(int64_t max_model_len, int num_requests = 48, uint64_t seed = 2026);

}  // namespace kvattn::engine
