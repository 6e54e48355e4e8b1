#include "kvattn/model/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kvattn/core/error.h"

namespace kvattn::model {
namespace {

constexpr double kSamplingEps = 1e-5;  // vLLM's _SAMPLING_EPS
constexpr int64_t kMaxLogprobs = 20;   // vLLM's default max_logprobs
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// log(sum(exp(x))) over the finite entries, in double (NaN entries are skipped).
double log_sum_exp(std::span<const float> x) {
  float m = kNegInf;
  for (float v : x)
    if (v > m) m = v;
  if (m == kNegInf) return -std::numeric_limits<double>::infinity();
  double s = 0;
  for (float v : x)
    if (v > kNegInf) s += std::exp(static_cast<double>(v) - m);
  return m + std::log(s);
}

// Descending value, ascending id: the total order used for ranks and candidates (NaN counts as
// -inf, so the order stays strict and weak on any input).
struct ByValueDesc {
  std::span<const float> x;
  static float key(float v) { return std::isnan(v) ? kNegInf : v; }
  bool operator()(int32_t a, int32_t b) const {
    const float va = key(x[static_cast<size_t>(a)]), vb = key(x[static_cast<size_t>(b)]);
    return va > vb || (va == vb && a < b);
  }
};

uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

void SamplingParams::validate(int64_t vocab_size) const {
  KVATTN_CHECK(std::isfinite(temperature) && temperature >= 0,
               "temperature must be >= 0 (0 = greedy), got {}; use 0 for greedy or e.g. 0.7", temperature);
  KVATTN_CHECK(top_k >= -1, "top_k must be -1 or 0 (all tokens) or >= 1, got {}", top_k);
  KVATTN_CHECK(top_p > 0 && top_p <= 1, "top_p must be in (0, 1], got {}; use 1 to disable", top_p);
  KVATTN_CHECK(min_p >= 0 && min_p <= 1, "min_p must be in [0, 1], got {}; use 0 to disable", min_p);
  KVATTN_CHECK(std::isfinite(repetition_penalty) && repetition_penalty > 0,
               "repetition_penalty must be > 0, got {}; use 1 to disable", repetition_penalty);
  KVATTN_CHECK(frequency_penalty >= -2 && frequency_penalty <= 2,
               "frequency_penalty must be in [-2, 2], got {}; use 0 to disable", frequency_penalty);
  KVATTN_CHECK(presence_penalty >= -2 && presence_penalty <= 2,
               "presence_penalty must be in [-2, 2], got {}; use 0 to disable", presence_penalty);
  KVATTN_CHECK(max_tokens >= 1, "max_tokens must be >= 1, got {}", max_tokens);
  KVATTN_CHECK(logprobs >= 0 && logprobs <= kMaxLogprobs, "logprobs must be in [0, {}], got {}", kMaxLogprobs,
               logprobs);
  for (int32_t t : stop_token_ids)
    KVATTN_CHECK(t >= 0 && t < vocab_size, "stop_token_ids has {}, which is not a token id of this model (0..{})", t,
                 vocab_size - 1);
  for (const auto& s : stop)
    KVATTN_CHECK(!s.empty(), "stop strings must not be empty; remove the empty string from `stop`");
}

LogprobsMode parse_logprobs_mode(std::string_view s) {
  if (s == "raw_logprobs") return LogprobsMode::raw_logprobs;
  if (s == "processed_logprobs") return LogprobsMode::processed_logprobs;
  throw InvalidArgument(fmt::format("unknown logprobs mode '{}'; valid: raw_logprobs, processed_logprobs", s));
}

const char* logprobs_mode_name(LogprobsMode m) noexcept {
  return m == LogprobsMode::raw_logprobs ? "raw_logprobs" : "processed_logprobs";
}

SamplerScratch::SamplerScratch(int64_t vocab_size) {
  KVATTN_CHECK(vocab_size >= 1, "vocab_size must be >= 1, got {}", vocab_size);
  logits.resize(static_cast<size_t>(vocab_size));
  order.resize(static_cast<size_t>(vocab_size));
  probs.resize(static_cast<size_t>(vocab_size));
}

RequestSampler::RequestSampler(const SamplingParams& params, int64_t vocab_size, std::span<const int32_t> prompt_ids,
                               uint64_t fallback_seed, LogprobsMode mode)
    : params_(params), vocab_size_(vocab_size), mode_(mode) {
  params_.validate(vocab_size);
  if (params_.top_k == 0) params_.top_k = -1;
  if (params_.repetition_penalty != 1.0) {
    prompt_unique_.assign(prompt_ids.begin(), prompt_ids.end());
    std::sort(prompt_unique_.begin(), prompt_unique_.end());
    prompt_unique_.erase(std::unique(prompt_unique_.begin(), prompt_unique_.end()), prompt_unique_.end());
    for (int32_t t : prompt_unique_)
      KVATTN_CHECK(t >= 0 && t < vocab_size, "prompt token id {} is outside the vocabulary (0..{})", t, vocab_size - 1);
  }
  rng_.seed(params_.seed ? *params_.seed : splitmix64(fallback_seed));
}

void RequestSampler::record(int32_t token) {
  auto it = std::lower_bound(output_counts_.begin(), output_counts_.end(), std::pair<int32_t, int32_t>{token, 0},
                             [](const auto& a, const auto& b) { return a.first < b.first; });
  if (it != output_counts_.end() && it->first == token)
    ++it->second;
  else
    output_counts_.insert(it, {token, 1});
}

void RequestSampler::apply_penalties(std::vector<float>& x) const {
  if (params_.repetition_penalty != 1.0) {
    const float r = static_cast<float>(params_.repetition_penalty);
    auto penalize = [&](int32_t t) {
      float& v = x[static_cast<size_t>(t)];
      v = v > 0 ? v / r : v * r;
    };
    // Each token of prompt ∪ output once.
    size_t i = 0;
    for (const auto& [t, c] : output_counts_) {
      while (i < prompt_unique_.size() && prompt_unique_[i] < t) penalize(prompt_unique_[i++]);
      if (i < prompt_unique_.size() && prompt_unique_[i] == t) ++i;
      penalize(t);
    }
    while (i < prompt_unique_.size()) penalize(prompt_unique_[i++]);
  }
  if (params_.frequency_penalty != 0.0 || params_.presence_penalty != 0.0) {
    const float f = static_cast<float>(params_.frequency_penalty), p = static_cast<float>(params_.presence_penalty);
    for (const auto& [t, c] : output_counts_) {
      float& v = x[static_cast<size_t>(t)];
      v -= f * static_cast<float>(c);
      v -= p;
    }
  }
}

void RequestSampler::fill_logprobs(std::span<const float> x, int32_t token, SamplerScratch& scratch,
                                   TokenLogprobs& out) const {
  const double lse = log_sum_exp(x);
  auto lp = [&](int32_t t) { return static_cast<float>(static_cast<double>(x[static_cast<size_t>(t)]) - lse); };
  out.clear();
  out.emplace_back(token, lp(token));
  const auto n = static_cast<size_t>(std::min<int64_t>(params_.logprobs, vocab_size_));
  auto& order = scratch.order;
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::partial_sort(order.begin(), order.begin() + static_cast<long>(n), order.end(), ByValueDesc{x});
  for (size_t i = 0; i < n; ++i)
    if (order[i] != token) out.emplace_back(order[i], lp(order[i]));
}

int32_t RequestSampler::sample(std::span<const float> logits, SamplerScratch& scratch, TokenLogprobs* logprobs) {
  KVATTN_CHECK(static_cast<int64_t>(logits.size()) == vocab_size_ && scratch.vocab_size() == vocab_size_,
               "logits row has {} entries, scratch {}, but the vocabulary has {}", logits.size(),
               scratch.vocab_size(), vocab_size_);
  const bool want_lp = logprobs != nullptr && params_.logprobs > 0;
  auto& x = scratch.logits;
  std::copy(logits.begin(), logits.end(), x.begin());
  // NaN logits are a model bug; treat them as impossible tokens rather than poisoning sorts.
  for (float& v : x)
    if (std::isnan(v)) v = kNegInf;
  int32_t token = -1;
  apply_penalties(x);

  if (params_.greedy()) {
    token = static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
  } else {
    const float inv_t = static_cast<float>(params_.temperature);
    for (float& v : x) v /= inv_t;
    if (params_.min_p > 0) {
      const float m = *std::max_element(x.begin(), x.end());
      // p_i / p_max = exp(x_i - x_max) < min_p  ->  removed.
      for (float& v : x)
        if (std::exp(static_cast<double>(v) - m) < params_.min_p) v = kNegInf;
    }
    // Candidates: finite logits, descending.
    auto& order = scratch.order;
    size_t n = 0;
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i] != kNegInf) order[n++] = static_cast<int32_t>(i);
    KVATTN_CHECK(n > 0, "every logit is -inf or NaN after penalties; the model produced no usable logits");
    const ByValueDesc desc{x};
    if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < n) {
      const auto k = static_cast<size_t>(params_.top_k);
      std::nth_element(order.begin(), order.begin() + static_cast<long>(k - 1), order.begin() + static_cast<long>(n),
                       desc);
      const float kth = x[static_cast<size_t>(order[k - 1])];
      // Keep every logit >= the k-th largest (ties kept, as vLLM's mask `logits < kth`).
      size_t kept = 0;
      for (size_t i = 0; i < n; ++i)
        if (x[static_cast<size_t>(order[i])] >= kth)
          order[kept++] = order[i];
        else
          x[static_cast<size_t>(order[i])] = kNegInf;
      n = kept;
    }
    std::sort(order.begin(), order.begin() + static_cast<long>(n), desc);
    // Softmax over the kept tokens (double).
    auto& probs = scratch.probs;
    const double m = x[static_cast<size_t>(order[0])];
    double z = 0;
    for (size_t i = 0; i < n; ++i) z += probs[i] = std::exp(static_cast<double>(x[static_cast<size_t>(order[i])]) - m);
    for (size_t i = 0; i < n; ++i) probs[i] /= z;
    if (params_.top_p < 1.0) {
      // Ascending order (from the back): remove while the inclusive cumulative sum <= 1 - p;
      // the most likely token (index 0) always stays.
      double cum = 0;
      size_t kept = n;
      for (size_t i = n; i-- > 1;) {
        cum += probs[i];
        if (cum <= 1.0 - params_.top_p) {
          x[static_cast<size_t>(order[i])] = kNegInf;
          kept = i;
        } else {
          break;
        }
      }
      n = kept;
      double z2 = 0;
      for (size_t i = 0; i < n; ++i) z2 += probs[i];
      for (size_t i = 0; i < n; ++i) probs[i] /= z2;
    }
    // One uniform draw in [0, 1), inverse CDF in descending-probability order.
    const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53;
    double cum = 0;
    token = order[n - 1];
    for (size_t i = 0; i < n; ++i) {
      cum += probs[i];
      if (u < cum) {
        token = order[i];
        break;
      }
    }
  }

  if (want_lp) fill_logprobs(mode_ == LogprobsMode::raw_logprobs ? logits : std::span<const float>(x), token, scratch,
                             *logprobs);
  record(token);
  return token;
}

}  // namespace kvattn::model
