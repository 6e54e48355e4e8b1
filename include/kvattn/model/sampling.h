// kvattn/model/sampling.h — turning one request's logits into its next token, with vLLM's
// SamplingParams names, defaults, semantics and order.
//
// Order of operations for one request and one step (vLLM V1's Sampler):
//   0. raw logprobs (LogprobsMode::raw_logprobs): log_softmax of the model's logits, untouched;
//   1. penalties: repetition (tokens of the prompt or the output: logit > 0 ? logit / r :
//      logit * r), then frequency (logit -= f * count in the output), then presence
//      (logit -= p if the token is in the output);
//   2. temperature < 1e-5: greedy — the first index of the largest logit; steps 3-5 are skipped;
//   3. temperature: logits / t;
//   4. min-p: tokens whose probability is below min_p * (the largest probability) are removed;
//   5. top-k (the k largest logits; ties with the k-th are kept), then top-p over what top-k
//      kept (in ascending order, tokens whose inclusive cumulative probability is <= 1 - top_p
//      are removed; the most likely token always stays), then one draw from the softmax of the
//      remaining logits.
//   processed logprobs (LogprobsMode::processed_logprobs): log_softmax of the logits after the
//   last of these steps that ran (removed tokens have -inf).
//
// Randomness: each request owns a 64-bit Mersenne Twister.  A request with a `seed` seeds it
// with that seed, so the same seed and the same logits give the same tokens whatever else is in
// the batch; a request without one seeds it from the engine's seed and the request's position,
// so an engine run is reproducible too.  One uniform draw per random step (inverse CDF over the
// kept tokens in descending-probability order).
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvattn::model {

// vLLM's SamplingParams (names and defaults); fields vLLM has and kvattn does not are absent.
struct SamplingParams {
  double temperature = 1.0;          // 0 (below 1e-5): greedy
  int64_t top_k = -1;                // -1 or 0: all tokens
  double top_p = 1.0;                // (0, 1]
  double min_p = 0.0;                // [0, 1]
  double repetition_penalty = 1.0;   // > 0; prompt and output tokens
  double frequency_penalty = 0.0;    // [-2, 2]; output tokens
  double presence_penalty = 0.0;     // [-2, 2]; output tokens
  std::optional<uint64_t> seed;      // per-request seed
  int64_t max_tokens = 16;           // >= 1; capped by max_model_len - prompt length
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop;     // stop strings; the text is cut before the match
  bool include_stop_str_in_output = false;
  bool ignore_eos = false;
  int64_t logprobs = 0;              // top logprobs per generated token (0: none), <= 20
  bool skip_special_tokens = true;

  bool greedy() const noexcept { return temperature < 1e-5; }
  // Throws InvalidArgument naming the field, its value and the valid range.
  void validate(int64_t vocab_size) const;
};

// What the logprobs of a generated token are computed from (vLLM's --logprobs-mode).
enum class LogprobsMode { raw_logprobs, processed_logprobs };
LogprobsMode parse_logprobs_mode(std::string_view s);  // "raw_logprobs" | "processed_logprobs"
const char* logprobs_mode_name(LogprobsMode m) noexcept;

// The logprobs of one generated token: the sampled token first, then the `logprobs` most
// likely tokens in rank order (the sampled one not repeated), as vLLM's per-token dict.
using TokenLogprobs = std::vector<std::pair<int32_t, float>>;

// Working memory shared by all requests of one engine (one vocabulary row), so sampling
// allocates nothing per step.
class SamplerScratch {
 public:
  explicit SamplerScratch(int64_t vocab_size);
  int64_t vocab_size() const noexcept { return static_cast<int64_t>(logits.size()); }
  std::vector<float> logits;    // the processed row
  std::vector<int32_t> order;   // candidate token ids
  std::vector<double> probs;
};

// One request's sampling state: its parameters, the prompt's tokens (for the repetition
// penalty), the output counts and its random generator.
class RequestSampler {
 public:
  RequestSampler(const SamplingParams& params, int64_t vocab_size, std::span<const int32_t> prompt_ids,
                 uint64_t fallback_seed, LogprobsMode mode = LogprobsMode::raw_logprobs);

  // Chooses the next token from `logits` [vocab_size] and records it as an output token (for
  // the frequency/presence/repetition penalties).  When params.logprobs > 0 and `logprobs` is
  // given, fills it (see TokenLogprobs).
  int32_t sample(std::span<const float> logits, SamplerScratch& scratch, TokenLogprobs* logprobs = nullptr);

  // Records `token` as an output token without sampling (e.g. a forced token).
  void record(int32_t token);
  const SamplingParams& params() const noexcept { return params_; }

 private:
  void apply_penalties(std::vector<float>& x) const;
  void fill_logprobs(std::span<const float> x, int32_t token, SamplerScratch& scratch, TokenLogprobs& out) const;

  SamplingParams params_;
  int64_t vocab_size_;
  LogprobsMode mode_;
  std::vector<int32_t> prompt_unique_;              // sorted, unique
  std::vector<std::pair<int32_t, int32_t>> output_counts_;  // sorted by token
  std::mt19937_64 rng_;
};

}  // namespace kvattn::model
