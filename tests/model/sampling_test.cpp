// Sampling: every step of vLLM's sampler on hand-made logits with exact expected values.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "kvattn/core/error.h"
#include "kvattn/model/sampling.h"

using namespace kvattn;
using namespace kvattn::model;

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

std::vector<double> log_softmax(const std::vector<double>& x) {
  double m = -INFINITY;
  for (double v : x) m = std::max(m, v);
  double s = 0;
  for (double v : x)
    if (std::isfinite(v)) s += std::exp(v - m);
  std::vector<double> out;
  for (double v : x) out.push_back(std::isfinite(v) ? v - m - std::log(s) : -INFINITY);
  return out;
}

// All processed log-probabilities of one step (greedy or not), by token id.
std::map<int32_t, float> processed(SamplingParams p, const std::vector<float>& logits,
                                   const std::vector<int32_t>& prompt = {}, const std::vector<int32_t>& outputs = {},
                                   int32_t* token = nullptr) {
  p.logprobs = static_cast<int64_t>(logits.size());
  RequestSampler s(p, static_cast<int64_t>(logits.size()), prompt, 1, LogprobsMode::processed_logprobs);
  for (int32_t t : outputs) s.record(t);
  SamplerScratch scratch(static_cast<int64_t>(logits.size()));
  TokenLogprobs lp;
  const int32_t t = s.sample(logits, scratch, &lp);
  if (token) *token = t;
  EXPECT_EQ(lp.front().first, t);
  std::map<int32_t, float> m;
  for (const auto& [id, v] : lp) m[id] = v;
  EXPECT_EQ(m.size(), logits.size());
  return m;
}

void expect_logprobs(const std::map<int32_t, float>& got, const std::vector<double>& want_logits) {
  const auto want = log_softmax(want_logits);
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i])) {
      EXPECT_EQ(got.at(static_cast<int32_t>(i)), kNegInf) << "token " << i;
    } else {
      EXPECT_NEAR(got.at(static_cast<int32_t>(i)), want[i], 1e-5) << "token " << i;
    }
  }
}

std::vector<float> logits_of_probs(const std::vector<double>& probs) {
  std::vector<float> x;
  for (double p : probs) x.push_back(static_cast<float>(std::log(p)));
  return x;
}

// The set of tokens a configuration can produce (tokens with a finite processed logprob).
std::set<int32_t> kept_set(const SamplingParams& p, const std::vector<float>& logits) {
  std::set<int32_t> kept;
  for (const auto& [t, v] : processed(p, logits))
    if (v != kNegInf) kept.insert(t);
  return kept;
}

}  // namespace

TEST(Sampling, GreedyTakesTheFirstLargestLogit) {
  SamplingParams p;
  p.temperature = 0;
  RequestSampler s(p, 5, {}, 0);
  SamplerScratch scratch(5);
  EXPECT_EQ(s.sample(std::vector<float>{0.5f, 2.0f, -1.0f, 2.0f, 1.0f}, scratch), 1);
  EXPECT_EQ(s.sample(std::vector<float>{0.5f, 2.0f, -1.0f, 2.5f, 1.0f}, scratch), 3);
}

TEST(Sampling, RepetitionPenaltyOverPromptAndOutput) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 2.0;
  // Token 0 in the prompt (positive: divided), 1 in the output (negative: multiplied),
  // 2 in both (once), 3 untouched.
  const std::vector<float> x{2.0f, -2.0f, 1.0f, 0.5f, 0.25f};
  int32_t tok = -1;
  auto lp = processed(p, x, {0, 2, 2}, {1, 2}, &tok);
  expect_logprobs(lp, {1.0, -4.0, 0.5, 0.5, 0.25});
  EXPECT_EQ(tok, 0);  // 1.0 is the largest after the penalty
}

TEST(Sampling, FrequencyAndPresencePenaltiesCountOutputOnly) {
  SamplingParams p;
  p.temperature = 0;
  p.frequency_penalty = 0.5;
  p.presence_penalty = 0.25;
  const std::vector<float> x{3.0f, 2.0f, 1.0f, 0.0f};
  int32_t tok = -1;
  // Token 0 is in the prompt only: no penalty.  Token 1 generated 3 times, token 2 once.
  auto lp = processed(p, x, {0}, {1, 1, 2, 1}, &tok);
  expect_logprobs(lp, {3.0, 2.0 - 1.5 - 0.25, 1.0 - 0.5 - 0.25, 0.0});
  EXPECT_EQ(tok, 0);
}

TEST(Sampling, TemperatureScalesLogits) {
  SamplingParams p;
  p.temperature = 0.5;
  auto lp = processed(p, {1.0f, 0.0f, -1.0f});
  expect_logprobs(lp, {2.0, 0.0, -2.0});
}

TEST(Sampling, TopPKeepsExactlyTheSmallestSetAboveP) {
  const auto x = logits_of_probs({0.1, 0.4, 0.2, 0.3});
  SamplingParams p;
  p.top_p = 0.75;  // ascending cumsum 0.1, 0.3, ...: only 0.1 <= 0.25 goes
  EXPECT_EQ(kept_set(p, x), (std::set<int32_t>{1, 2, 3}));
  expect_logprobs(processed(p, x), {-INFINITY, std::log(0.4), std::log(0.2), std::log(0.3)});
  p.top_p = 0.65;  // 0.1 and 0.3 <= 0.35 go
  EXPECT_EQ(kept_set(p, x), (std::set<int32_t>{1, 3}));
  p.top_p = 0.35;  // 0.1, 0.3, 0.6 <= 0.65 go
  EXPECT_EQ(kept_set(p, x), (std::set<int32_t>{1}));
  p.top_p = 0.05;  // the most likely token always stays
  EXPECT_EQ(kept_set(p, x), (std::set<int32_t>{1}));
  p.top_p = 1.0;
  EXPECT_EQ(kept_set(p, x), (std::set<int32_t>{0, 1, 2, 3}));
}

TEST(Sampling, TopKKeepsTiesAndTopPAppliesAfterIt) {
  SamplingParams p;
  p.top_k = 2;
  EXPECT_EQ(kept_set(p, {3.0f, 1.0f, 1.0f, 0.0f}), (std::set<int32_t>{0, 1, 2}));
  EXPECT_EQ(kept_set(p, {3.0f, 1.0f, 2.0f, 0.0f}), (std::set<int32_t>{0, 2}));
  p.top_k = 0;  // disabled, as -1
  EXPECT_EQ(kept_set(p, {3.0f, 1.0f, 2.0f, 0.0f}).size(), 4u);
  // top-k 3 of {0.4, 0.3, 0.2, 0.1} renormalizes to {4/9, 3/9, 2/9}; top-p 0.7 then removes
  // 2/9 (<= 0.3) and keeps 3/9 (cumsum 5/9 > 0.3).
  p.top_k = 3;
  p.top_p = 0.7;
  const auto x = logits_of_probs({0.4, 0.3, 0.2, 0.1});
  EXPECT_EQ(kept_set(p, x), (std::set<int32_t>{0, 1}));
}

TEST(Sampling, MinPRemovesTokensBelowAFractionOfTheTopProbability) {
  SamplingParams p;
  p.min_p = 0.2;  // threshold 0.2 * 0.5 = 0.1
  EXPECT_EQ(kept_set(p, logits_of_probs({0.5, 0.3, 0.15, 0.05})), (std::set<int32_t>{0, 1, 2}));
  p.min_p = 0.5;  // threshold 0.25
  EXPECT_EQ(kept_set(p, logits_of_probs({0.5, 0.3, 0.15, 0.05})), (std::set<int32_t>{0, 1}));
}

TEST(Sampling, RawLogprobsIgnoreProcessingAndListSampledTokenFirst) {
  SamplingParams p;
  p.temperature = 0;
  p.repetition_penalty = 4.0;
  p.logprobs = 2;
  const std::vector<float> x{4.0f, 3.0f, 1.0f, 0.0f};
  RequestSampler s(p, 4, std::vector<int32_t>{0}, 0, LogprobsMode::raw_logprobs);
  SamplerScratch scratch(4);
  TokenLogprobs lp;
  // Penalty: token 0 -> 1.0, so greedy takes token 1.
  EXPECT_EQ(s.sample(x, scratch, &lp), 1);
  const auto want = log_softmax({4.0, 3.0, 1.0, 0.0});
  ASSERT_EQ(lp.size(), 2u);  // sampled (1) first, then the top 2 without repeating it: 0
  EXPECT_EQ(lp[0].first, 1);
  EXPECT_NEAR(lp[0].second, want[1], 1e-6);
  EXPECT_EQ(lp[1].first, 0);
  EXPECT_NEAR(lp[1].second, want[0], 1e-6);

  // A sampled token outside the top n: n + 1 entries.
  p.logprobs = 1;
  p.temperature = 1;
  p.top_k = 1;
  p.repetition_penalty = 1;
  RequestSampler s2(p, 4, {}, 0, LogprobsMode::raw_logprobs);
  EXPECT_EQ(s2.sample(std::vector<float>{0.0f, 1.0f, 0.5f, 0.0f}, scratch, &lp), 1);
  ASSERT_EQ(lp.size(), 1u);
}

TEST(Sampling, SameSeedSameTokensAndDifferentSeedsDiffer) {
  const auto x = logits_of_probs({0.2, 0.2, 0.2, 0.2, 0.2});
  auto draw = [&](uint64_t seed) {
    SamplingParams p;
    p.seed = seed;
    RequestSampler s(p, 5, {}, 999, LogprobsMode::raw_logprobs);
    SamplerScratch scratch(5);
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(x, scratch));
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
  // Without a seed the fallback (engine seed and request position) decides.
  SamplingParams p;
  RequestSampler a(p, 5, {}, 1), b(p, 5, {}, 1), c(p, 5, {}, 2);
  SamplerScratch scratch(5);
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 64; ++i) {
    ta.push_back(a.sample(x, scratch));
    tb.push_back(b.sample(x, scratch));
    tc.push_back(c.sample(x, scratch));
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(Sampling, SeededFrequenciesPassChiSquare) {
  // 20000 draws from {0.5, 0.25, 0.15, 0.1} (temperature 1) and from the same logits at
  // temperature 0.5 (probabilities ∝ p^2); chi-square with 3 degrees of freedom must stay
  // below 16.27 (p = 0.001).
  const std::vector<double> probs{0.5, 0.25, 0.15, 0.1};
  for (double temp : {1.0, 0.5}) {
    std::vector<double> want;
    double z = 0;
    for (double q : probs) z += std::pow(q, 1.0 / temp);
    for (double q : probs) want.push_back(std::pow(q, 1.0 / temp) / z);
    SamplingParams p;
    p.temperature = temp;
    p.seed = 12345;
    RequestSampler s(p, 4, {}, 0);
    SamplerScratch scratch(4);
    const int n = 20000;
    std::vector<int> count(4, 0);
    const auto x = logits_of_probs(probs);
    for (int i = 0; i < n; ++i) ++count[static_cast<size_t>(s.sample(x, scratch))];
    double chi2 = 0;
    for (size_t i = 0; i < 4; ++i) {
      const double e = n * want[i];
      chi2 += (count[i] - e) * (count[i] - e) / e;
    }
    EXPECT_LT(chi2, 16.27) << "temperature " << temp;
    EXPECT_GT(count[3], 0);
  }
}

TEST(Sampling, InvalidParametersAreNamed) {
  auto bad = [](auto edit, const char* needle) {
    SamplingParams p;
    edit(p);
    try {
      p.validate(100);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  bad([](SamplingParams& p) { p.temperature = -1; }, "temperature");
  bad([](SamplingParams& p) { p.top_p = 0; }, "top_p");
  bad([](SamplingParams& p) { p.top_k = -2; }, "top_k");
  bad([](SamplingParams& p) { p.min_p = 1.5; }, "min_p");
  bad([](SamplingParams& p) { p.repetition_penalty = 0; }, "repetition_penalty");
  bad([](SamplingParams& p) { p.frequency_penalty = 3; }, "frequency_penalty");
  bad([](SamplingParams& p) { p.presence_penalty = -3; }, "presence_penalty");
  bad([](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens");
  bad([](SamplingParams& p) { p.logprobs = 21; }, "logprobs");
  bad([](SamplingParams& p) { p.stop_token_ids = {100}; }, "stop_token_ids");
  bad([](SamplingParams& p) { p.stop = {""}; }, "stop strings");
  EXPECT_THROW(parse_logprobs_mode("raw"), InvalidArgument);
  EXPECT_EQ(parse_logprobs_mode("processed_logprobs"), LogprobsMode::processed_logprobs);
}

TEST(Sampling, NanLogitsAreNeverChosen) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x{nan, 1.0f, 2.0f, nan, 0.5f};
  SamplingParams g;
  g.temperature = 0;
  g.logprobs = 3;
  RequestSampler greedy(g, 5, {}, 0, LogprobsMode::raw_logprobs);
  SamplerScratch scratch(5);
  TokenLogprobs lp;
  EXPECT_EQ(greedy.sample(x, scratch, &lp), 2);
  ASSERT_EQ(lp.size(), 3u);  // ranks skip the NaN entries
  EXPECT_EQ(lp[1].first, 1);
  EXPECT_EQ(lp[2].first, 4);
  const auto want = std::log(std::exp(2.0) / (std::exp(2.0) + std::exp(1.0) + std::exp(0.5)));
  EXPECT_NEAR(lp[0].second, want, 1e-6);
  SamplingParams r;
  r.seed = 5;
  r.top_p = 0.99;
  RequestSampler random(r, 5, {}, 0);
  for (int i = 0; i < 200; ++i) {
    const int32_t t = random.sample(x, scratch);
    EXPECT_TRUE(t == 1 || t == 2 || t == 4) << t;
  }
}
