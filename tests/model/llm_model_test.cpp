// Greedy generation through LLM (scheduler + ModelRunner + kvattn's attention) on the generated
// test models of every architecture, against the greedy continuation of the independent
// float64 NumPy reference (reference_forward.py --greedy): 32 tokens per prompt,
// token for token, under plain batching, chunked prefill, preemption forced by a small KV cache,
// every KV cache layout, and an fp8 KV cache.
//
// Agreement criterion.  Greedy tokens must equal the reference's; the first token that differs
// is allowed only where the reference's two largest logits are closer than twice the logit
// error bound (f32: 2 x 1e-3; fp8 KV against the e4m3-rounded reference: 2 x 0.05,
// forward_test.cpp's measured bound) — a near-tie that a correct implementation may break
// either way — and nothing after it is compared.  Each case prints how many tokens were
// equal and how many continuations parted; at least half the tokens must be compared.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "forward_test.h"
#include "kvattn/kv/kv_cache_layout.h"
#include "kvattn/model/llm.h"

namespace kvattn::model {
namespace {

using testing::ReferenceModel;

constexpr int kNewTokens = testing::kGreedyTokens;  // 32
constexpr double kF32Margin = 2e-3;
constexpr double kFp8Margin = 0.1;

using testing::generator_args;
using testing::kLengths;

struct Greedy {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<double>> margins;
};

struct CachedModel {
  ReferenceModel ref;
  Greedy greedy, greedy_fp8;
};

// The reference's greedy continuation with keys and values rounded to fp8 e4m3 (the f32 one
// comes with the ReferenceModel), cached next to the model.
Greedy reference_greedy_fp8(const ReferenceModel& m) {
  namespace fs = std::filesystem;
  const fs::path src = testing::source_dir() / "tests" / "model";
  const std::string key = testing::read_file(src / "reference_forward.py") + std::to_string(testing::kGreedyTokens);
  char name[64];
  std::snprintf(name, sizeof name, "greedy-fp8-%016zx.json", std::hash<std::string>{}(key));
  const fs::path out = m.dir / name;
  testing::reference_output(m, out, "--greedy " + std::to_string(testing::kGreedyTokens) + " --kv-fp8");
  const auto j = nlohmann::json::parse(testing::read_file(out));
  Greedy g;
  g.tokens = j["tokens"].get<std::vector<std::vector<int32_t>>>();
  g.margins = j["margins"].get<std::vector<std::vector<double>>>();
  return g;
}

const CachedModel& cached_model(const std::string& arch) {
  static std::map<std::string, CachedModel> cache;
  auto it = cache.find(arch);
  if (it == cache.end()) {
    CachedModel m;
    m.ref = testing::reference_model(arch, generator_args(arch), kLengths, 4, 11);
    m.greedy = Greedy{m.ref.greedy, m.ref.greedy_margins};
    m.greedy_fp8 = reference_greedy_fp8(m.ref);
    it = cache.emplace(arch, std::move(m)).first;
  }
  return it->second;
}

ModelLoadConfig load_config(const std::string& layout = "auto", const std::string& kv_dtype = "auto",
                            int64_t kv_memory = 8 << 20) {
  ModelLoadConfig c;
  c.device = "cpu";
  c.dtype = "float32";
  c.kv_cache_dtype = kv_dtype;
  c.layout = layout;
  c.kv_cache_memory = kv_memory;
  c.max_model_len = 256;
  c.block_size = 16;
  return c;
}

EngineOptions engine(int64_t max_num_batched_tokens = 512) {
  EngineOptions e;
  e.max_num_seqs = 8;
  e.max_num_batched_tokens = max_num_batched_tokens;
  e.skip_tokenizer_init = true;
  return e;
}

struct Agreement {
  int64_t compared = 0;  // tokens equal to the reference's before any difference
  int64_t total = 0;
  int64_t parted = 0;    // continuations that parted (each at a margin below the criterion)
};

// Generates kNewTokens greedy tokens for every prompt and checks them against `want` under the
// margin criterion (a token that differs where the reference's margin is clear fails); returns
// how many tokens were compared.
Agreement check_greedy(LLM& llm, const ReferenceModel& m, const Greedy& want, double margin, const std::string& what) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = kNewTokens;
  p.ignore_eos = true;
  const auto outs = llm.generate_tokens(m.prompts.ids, {p});
  Agreement a;
  EXPECT_EQ(outs.size(), m.prompts.ids.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    const auto& got = outs[i].output.token_ids;
    EXPECT_EQ(got.size(), static_cast<size_t>(kNewTokens)) << what;
    EXPECT_EQ(outs[i].output.finish_reason, "length");
    for (size_t t = 0; t < got.size() && t < want.tokens[i].size(); ++t) {
      ++a.total;
      if (got[t] != want.tokens[i][t]) {
        // The first difference: allowed only where the reference's choice was within the error.
        EXPECT_LT(want.margins[i][t], margin)
            << what << ": prompt " << i << " (length " << m.prompts.ids[i].size() << ") token " << t << " is "
            << got[t] << ", the reference's is " << want.tokens[i][t] << " (top-2 margin " << want.margins[i][t]
            << ")";
        a.total += static_cast<int64_t>(got.size() - t - 1);
        ++a.parted;
        break;
      }
      ++a.compared;
    }
  }
  std::printf("%s: %lld of %lld greedy tokens equal to the reference's, %lld of %zu continuations parted at a "
              "near-tie\n",
              what.c_str(), static_cast<long long>(a.compared), static_cast<long long>(a.total),
              static_cast<long long>(a.parted), outs.size());
  return a;
}

class GenerateTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GenerateTest, GreedyMatchesTheReferenceBatchedChunkedAndPreempted) {
  const CachedModel& m = cached_model(GetParam());
  {
    LLM llm = LLM::open(m.ref.dir, load_config(), engine());
    const auto a = check_greedy(llm, m.ref, m.greedy, kF32Margin, GetParam() + " batched");
    EXPECT_GE(2 * a.compared, a.total);
    EXPECT_EQ(llm.last_stats().num_preemptions, 0);
  }
  {
    LLM llm = LLM::open(m.ref.dir, load_config(), engine(/*max_num_batched_tokens=*/8));
    const auto a = check_greedy(llm, m.ref, m.greedy, kF32Margin, GetParam() + " chunked prefill (8 tokens/step)");
    EXPECT_GE(2 * a.compared, a.total);
    EXPECT_GT(llm.last_stats().num_steps, 45 / 8 + kNewTokens);
  }
  {
    // max_model_len 80 and a KV cache of ~8 blocks of 16 tokens (the runner wants room for one
    // request of max_model_len): the four prompts need 14 at the end, so requests are
    // preempted and recomputed.
    auto small = load_config();
    small.max_model_len = 80;
    LLM probe = LLM::open(m.ref.dir, small, engine());
    const int64_t bytes_per_block = small.kv_cache_memory / probe.executor().num_kv_blocks();
    small.kv_cache_memory = 8 * bytes_per_block;
    EngineOptions optimistic = engine();
    optimistic.reserve_to_finish = false;  // admit on the first chunk, as vLLM V1: decode growth preempts
    LLM llm = LLM::open(m.ref.dir, small, optimistic);
    EXPECT_LE(llm.executor().num_kv_blocks(), 9);
    const auto a = check_greedy(llm, m.ref, m.greedy, kF32Margin, GetParam() + " preemption");
    EXPECT_GE(2 * a.compared, a.total);
    EXPECT_GT(llm.last_stats().num_preemptions, 0);
  }
}

TEST_P(GenerateTest, GreedyMatchesTheReferenceInEveryKvLayout) {
  const CachedModel& m = cached_model(GetParam());
  for (KVCacheLayout layout : kDefaultLayoutPreference) {
    LLM llm = LLM::open(m.ref.dir, load_config(layout_name(layout)), engine(16));
    const auto a = check_greedy(llm, m.ref, m.greedy, kF32Margin, GetParam() + " layout " + layout_name(layout));
    EXPECT_GE(2 * a.compared, a.total) << layout_name(layout);
  }
}

TEST_P(GenerateTest, GreedyWithFp8KvCacheMatchesTheFp8RoundedReference) {
  const CachedModel& m = cached_model(GetParam());
  LLM llm = LLM::open(m.ref.dir, load_config("auto", "fp8"), engine(16));
  const auto a = check_greedy(llm, m.ref, m.greedy_fp8, kFp8Margin, GetParam() + " fp8 KV");
  EXPECT_GE(2 * a.compared, a.total);
}

INSTANTIATE_TEST_SUITE_P(Architectures, GenerateTest,
                         ::testing::Values("llama", "mistral", "qwen2", "qwen3", "gemma2", "qwen2_window"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kvattn::model
