// The generation loop (LLM over the scheduler) against a small fake model with the real
// execute() contract: it keeps a paged "KV cache" of token ids, writes each step's tokens
// through the block table and computes logits from the tokens it reads back through the block
// table.  A wrong block table, a skipped write, or a bad recompute after preemption changes
// the logits, so every schedule must reproduce the reference continuation computed directly
// from the token sequence.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kvattn/core/error.h"
#include "kvattn/model/llm.h"

using namespace kvattn;
using namespace kvattn::model;

namespace {

constexpr int64_t kVocab = 64;
constexpr int32_t kSpecial = 63;  // "</s>": a special token (empty text when skipped)

uint64_t mix(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The fake model's logits for a whole token sequence: a hash of the sequence and the position.
std::vector<float> reference_logits(std::span<const int32_t> seq) {
  uint64_t h = 1469598103934665603ULL;
  for (int32_t t : seq) h = mix(h ^ static_cast<uint64_t>(t + 1));
  std::vector<float> x(kVocab);
  for (int64_t v = 0; v < kVocab; ++v)
    x[static_cast<size_t>(v)] = static_cast<float>(static_cast<double>(mix(h + static_cast<uint64_t>(v)) >> 11) *
                                                       0x1.0p-53 * 8.0 - 4.0);
  return x;
}

class PagedHashModel final : public StepExecutor {
 public:
  PagedHashModel(int64_t num_blocks, int64_t block_size, int64_t max_model_len)
      : blocks_(num_blocks), bs_(block_size), max_len_(max_model_len),
        cache_(static_cast<size_t>(num_blocks * block_size), -1) {}
  int64_t num_kv_blocks() const override { return blocks_; }
  int64_t block_size() const override { return bs_; }
  int64_t max_model_len() const override { return max_len_; }
  int64_t vocab_size() const override { return kVocab; }

  Tensor execute(std::span<const StepRequest> reqs) override {
    std::vector<float> out;
    int64_t rows = 0;
    ++calls;
    for (const auto& r : reqs) {
      tokens_computed += static_cast<int64_t>(r.token_ids.size());
      first_call.emplace(r.request_id, calls);
      last_call[r.request_id] = calls;
      for (int32_t b : r.block_ids) blocks_of[r.request_id].insert(b);
      for (size_t j = 0; j < r.token_ids.size(); ++j) cache_[slot(r, r.start_pos + static_cast<int64_t>(j))] = r.token_ids[j];
      if (!r.wants_logits) continue;
      std::vector<int32_t> seq;
      for (int64_t pos = 0; pos < r.start_pos + static_cast<int64_t>(r.token_ids.size()); ++pos) {
        const int32_t t = cache_[slot(r, pos)];
        if (t < 0) throw InternalError("read an unwritten KV slot");
        seq.push_back(t);
      }
      const auto x = reference_logits(seq);
      out.insert(out.end(), x.begin(), x.end());
      ++rows;
    }
    return Tensor::from_vector(out, {rows, kVocab});
  }

  int64_t calls = 0;
  int64_t tokens_computed = 0;
  // Per request: the first and last call that computed it, and every block of its tables.
  std::map<int64_t, int64_t> first_call, last_call;
  std::map<int64_t, std::set<int32_t>> blocks_of;

 private:
  size_t slot(const StepRequest& r, int64_t pos) const {
    const auto b = static_cast<size_t>(pos / bs_);
    if (b >= r.block_ids.size()) throw InternalError("position beyond the block table");
    const int32_t id = r.block_ids[b];
    if (id <= 0 || id >= blocks_) throw InternalError("block id out of range or the null block");
    return static_cast<size_t>(id * bs_ + pos % bs_);
  }
  int64_t blocks_, bs_, max_len_;
  std::vector<int32_t> cache_;
};

// 0..25 'a'..'z', 26..51 'A'..'Z', 52 ' ', 53..62 '0'..'9', 63 "</s>".
char char_of(int32_t t) {
  if (t < 26) return static_cast<char>('a' + t);
  if (t < 52) return static_cast<char>('A' + t - 26);
  if (t == 52) return ' ';
  return static_cast<char>('0' + t - 53);
}

std::string decode(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t t : ids)
    if (t != kSpecial) s += char_of(t);
  return s;
}

class CharCodec final : public TextCodec {
 public:
  explicit CharCodec(std::vector<int32_t> eos = {kSpecial}) : eos_(std::move(eos)) {}
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    for (char c : text) {
      int32_t t = -1;
      for (int32_t v = 0; v < kSpecial; ++v)
        if (char_of(v) == c) t = v;
      if (t < 0) throw InvalidArgument(std::string("no token for character ") + c);
      ids.push_back(t);
    }
    return ids;
  }
  std::unique_ptr<StreamDecoder> decoder(bool skip_special) const override {
    struct D final : StreamDecoder {
      bool skip;
      explicit D(bool s) : skip(s) {}
      std::string push(int32_t id) override {
        if (id == kSpecial) return skip ? "" : "</s>";
        return std::string(1, char_of(id));
      }
      std::string flush() override { return ""; }
    };
    return std::make_unique<D>(skip_special);
  }
  std::vector<int32_t> eos_token_ids() const override { return eos_; }

 private:
  std::vector<int32_t> eos_;
};

// The greedy continuation computed from the sequence alone.
std::vector<int32_t> reference_greedy(std::vector<int32_t> seq, int64_t n) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const auto x = reference_logits(seq);
    const auto t = static_cast<int32_t>(std::max_element(x.begin(), x.end()) - x.begin());
    out.push_back(t);
    seq.push_back(t);
  }
  return out;
}

std::vector<int32_t> prompt_of_length(int64_t n, int32_t salt) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>(mix(static_cast<uint64_t>(i * 131 + salt)) % 62));
  return p;
}

LLM make_llm(int64_t num_blocks, int64_t block_size, int64_t max_model_len, EngineOptions opts = {},
             std::vector<int32_t> eos = {kSpecial}) {
  return LLM(std::make_unique<PagedHashModel>(num_blocks, block_size, max_model_len),
             std::make_unique<CharCodec>(std::move(eos)), opts);
}

SamplingParams greedy(int64_t max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  return p;
}

}  // namespace

TEST(LLMLoop, GreedyMatchesTheReferenceUnderEverySchedule) {
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t n : {1, 5, 17, 33, 64}) prompts.push_back(prompt_of_length(n, static_cast<int32_t>(n)));
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : prompts) want.push_back(reference_greedy(p, 24));

  struct Case {
    const char* name;
    int64_t blocks, max_num_batched_tokens, max_num_seqs;
    bool expect_preemption;
  };
  for (const Case& c : {Case{"roomy", 256, 8192, 256, false}, Case{"chunked prefill", 256, 7, 256, false},
                        Case{"one at a time", 256, 8192, 1, false}, Case{"preemption", 26, 8192, 256, true},
                        Case{"preemption+chunks", 26, 5, 256, true}}) {
    EngineOptions o;
    o.max_num_batched_tokens = c.max_num_batched_tokens;
    o.max_num_seqs = c.max_num_seqs;
    o.reserve_to_finish = !c.expect_preemption;  // optimistic admission, so a tight cache preempts
    LLM llm = make_llm(c.blocks, 4, 128, o);
    const auto outs = llm.generate_tokens(prompts, {greedy(24)});
    ASSERT_EQ(outs.size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ(outs[i].output.token_ids, want[i]) << c.name << " prompt " << i;
      EXPECT_EQ(outs[i].output.finish_reason, "length") << c.name;
      EXPECT_EQ(outs[i].output.text, decode(want[i])) << c.name;
      EXPECT_EQ(outs[i].prompt_token_ids, prompts[i]);
      EXPECT_TRUE(outs[i].finished);
    }
    const auto& st = llm.last_stats();
    EXPECT_EQ(st.num_generated_tokens, 5 * 24);
    EXPECT_EQ(st.num_prompt_tokens, 1 + 5 + 17 + 33 + 64);
    EXPECT_EQ(st.num_kv_blocks, c.blocks - 1);
    if (c.expect_preemption) {
      EXPECT_GT(st.num_preemptions, 0) << c.name;
      EXPECT_GT(st.num_computed_tokens, st.num_prompt_tokens + st.num_generated_tokens - 5) << c.name;
    } else {
      EXPECT_EQ(st.num_preemptions, 0) << c.name;
      // Every prompt token and every output but the last computed exactly once.
      EXPECT_EQ(st.num_computed_tokens, st.num_prompt_tokens + st.num_generated_tokens - 5) << c.name;
    }
    if (c.max_num_batched_tokens == 7) {
      EXPECT_GT(st.num_steps, (1 + 5 + 17 + 33 + 64) / 7);
    }
  }
}

TEST(LLMLoop, TextPromptsAreEncodedAndDecoded) {
  LLM llm = make_llm(64, 4, 128);
  const auto outs = llm.generate({"Hello world", "abc"}, greedy(8));
  ASSERT_EQ(outs.size(), 2u);
  EXPECT_EQ(outs[0].prompt, "Hello world");
  EXPECT_EQ(outs[0].prompt_token_ids, CharCodec().encode("Hello world"));
  EXPECT_EQ(outs[0].output.token_ids, reference_greedy(CharCodec().encode("Hello world"), 8));
  EXPECT_EQ(outs[1].output.text, decode(reference_greedy(CharCodec().encode("abc"), 8)));
  EXPECT_NE(outs[0].request_id, outs[1].request_id);
}

TEST(LLMLoop, EosAndStopTokenIdsStopWithoutText) {
  const auto prompt = prompt_of_length(9, 3);
  const auto ref = reference_greedy(prompt, 40);
  // The first output position >= 3 holding a token not seen before: use it as EOS / stop id.
  size_t k = 3;
  while (std::find(ref.begin(), ref.begin() + static_cast<long>(k), ref[k]) != ref.begin() + static_cast<long>(k)) ++k;
  ASSERT_LT(k, ref.size());
  const int32_t stop_tok = ref[k];
  const std::vector<int32_t> want(ref.begin(), ref.begin() + static_cast<long>(k + 1));

  {  // as EOS
    LLM llm = make_llm(64, 4, 128, {}, {stop_tok});
    auto p = greedy(40);
    p.ignore_eos = false;
    const auto o = llm.generate_tokens({prompt}, {p})[0];
    EXPECT_EQ(o.output.token_ids, want);
    EXPECT_EQ(o.output.finish_reason, "stop");
    EXPECT_FALSE(o.output.stop_token_id.has_value());
    EXPECT_EQ(o.output.text, decode({want.begin(), want.end() - 1}));
    // The stopped request is no longer computed: prompt + outputs - 1 tokens in all.
    EXPECT_EQ(llm.last_stats().num_computed_tokens, static_cast<int64_t>(prompt.size() + want.size() - 1));
    p.ignore_eos = true;
    const auto o2 = llm.generate_tokens({prompt}, {p})[0];
    EXPECT_EQ(o2.output.token_ids, ref);
    EXPECT_EQ(o2.output.finish_reason, "length");
  }
  {  // as a stop token id
    LLM llm = make_llm(64, 4, 128);
    auto p = greedy(40);
    p.stop_token_ids = {stop_tok};
    const auto o = llm.generate_tokens({prompt}, {p})[0];
    EXPECT_EQ(o.output.token_ids, want);
    EXPECT_EQ(o.output.finish_reason, "stop");
    ASSERT_TRUE(o.output.stop_token_id.has_value());
    EXPECT_EQ(*o.output.stop_token_id, stop_tok);
    EXPECT_EQ(o.output.text, decode({want.begin(), want.end() - 1}));
  }
}

TEST(LLMLoop, AnEarlyStopFreesItsBlocksForTheWaitingRequest) {
  // 12 usable blocks of 4 tokens.  Request 0 (9 prompt tokens, max_tokens 40: 12 blocks at its
  // peak) stops at an EOS after k + 1 outputs; request 1 (40 prompt tokens + 8 outputs: 12
  // blocks) waits behind request 0's admission reserve.  The stop returns request 0's blocks at
  // once, so request 1 runs from the next step, on blocks request 0 held.
  const auto p0 = prompt_of_length(9, 3);
  const auto ref0 = reference_greedy(p0, 40);
  size_t k = 3;
  while (std::find(ref0.begin(), ref0.begin() + static_cast<long>(k), ref0[k]) != ref0.begin() + static_cast<long>(k)) ++k;
  ASSERT_LT(k, 20u);
  const int32_t stop_tok = ref0[k];
  const auto p1 = prompt_of_length(40, 5);
  auto model = std::make_unique<PagedHashModel>(13, 4, 128);
  PagedHashModel* m = model.get();
  LLM llm(std::move(model), std::make_unique<CharCodec>(std::vector<int32_t>{stop_tok}), {});
  auto until_eos = greedy(40);
  until_eos.ignore_eos = false;
  const auto outs = llm.generate_tokens({p0, p1}, {until_eos, greedy(8)});
  const auto n0 = static_cast<int64_t>(k + 1);  // request 0's outputs, one per step
  EXPECT_EQ(outs[0].output.token_ids, std::vector<int32_t>(ref0.begin(), ref0.begin() + n0));
  EXPECT_EQ(outs[0].output.finish_reason, "stop");
  EXPECT_EQ(outs[1].output.token_ids, reference_greedy(p1, 8));
  EXPECT_EQ(outs[1].output.finish_reason, "length");

  // Request 0 ran in calls 1..n0; request 1 waited, then ran in the next 8.
  EXPECT_EQ(m->first_call.at(0), 1);
  EXPECT_EQ(m->last_call.at(0), n0);
  EXPECT_EQ(m->first_call.at(1), n0 + 1);
  EXPECT_EQ(m->last_call.at(1), n0 + 8);
  // Request 0 held cdiv(9 + k, 4) blocks, so at most 12 - that were never used: request 1's 12
  // blocks include some of request 0's, freed by the stop.
  const auto& b0 = m->blocks_of.at(0);
  const auto& b1 = m->blocks_of.at(1);
  EXPECT_EQ(static_cast<int64_t>(b0.size()), (9 + n0 - 1 + 3) / 4);
  EXPECT_EQ(b1.size(), 12u);
  int64_t reused = 0;
  for (int32_t b : b1) reused += b0.count(b) > 0;
  EXPECT_EQ(reused, static_cast<int64_t>(b0.size()));  // all of them: 12 = the whole cache

  const auto& st = llm.last_stats();
  EXPECT_EQ(st.num_steps, n0 + 8);  // request 0 holding its seat to 40 outputs: 40 + 8
  EXPECT_EQ(st.num_model_calls, n0 + 8);
  EXPECT_EQ(st.num_computed_tokens, (9 + n0 - 1) + (40 + 8 - 1));
  EXPECT_EQ(m->tokens_computed, st.num_computed_tokens);
  EXPECT_EQ(st.num_generated_tokens, n0 + 8);
  EXPECT_EQ(st.peak_kv_blocks_used, 12);
  EXPECT_EQ(st.num_preemptions, 0);
}

TEST(LLMLoop, StopStringsTruncateTheTextAndStreamHoldsThemBack) {
  const auto prompt = prompt_of_length(6, 11);
  const auto ref = reference_greedy(prompt, 40);
  const std::string full = decode(ref);
  ASSERT_GE(full.size(), 12u);
  const std::string stop = full.substr(7, 3);
  const size_t at = full.find(stop);
  // Tokens up to the one that completes the first match.
  std::vector<int32_t> want_tokens;
  for (int32_t t : ref) {
    want_tokens.push_back(t);
    if (decode(want_tokens).find(stop) != std::string::npos) break;
  }
  for (bool include : {false, true}) {
    LLM llm = make_llm(64, 4, 128);
    auto p = greedy(40);
    p.stop = {"never-matches", stop};
    p.include_stop_str_in_output = include;
    std::string streamed;
    int events = 0;
    bool saw_finished = false;
    const auto o = llm.generate_tokens({prompt}, {p}, [&](const StreamEvent& e) {
      EXPECT_EQ(e.index, 0u);
      streamed += e.text;
      ++events;
      saw_finished = e.output.finished;
      // Nothing streamed ever lies beyond what the final text keeps.
      EXPECT_LE(streamed.size(), include ? at + stop.size() : at);
    })[0];
    EXPECT_EQ(o.output.text, include ? full.substr(0, at + stop.size()) : full.substr(0, at));
    EXPECT_EQ(streamed, o.output.text);
    EXPECT_EQ(o.output.token_ids, want_tokens);
    EXPECT_EQ(o.output.finish_reason, "stop");
    EXPECT_EQ(o.output.stop_reason, stop);
    EXPECT_EQ(events, static_cast<int>(want_tokens.size()));
    EXPECT_TRUE(saw_finished);
  }
}

TEST(LLMLoop, SeededSamplingDoesNotDependOnTheBatch) {
  SamplingParams p;
  p.temperature = 0.8;
  p.top_p = 0.9;
  p.seed = 42;
  p.max_tokens = 16;
  p.ignore_eos = true;
  const auto a = prompt_of_length(10, 1), b = prompt_of_length(30, 2), c = prompt_of_length(20, 3);
  LLM alone = make_llm(64, 4, 128);
  const auto solo = alone.generate_tokens({a}, {p})[0].output.token_ids;
  ASSERT_EQ(solo.size(), 16u);
  EXPECT_EQ(alone.generate_tokens({a}, {p})[0].output.token_ids, solo);
  // In a batch, with chunked prefill and preemption.
  EngineOptions o;
  o.max_num_batched_tokens = 9;
  o.reserve_to_finish = false;  // optimistic admission: the tight cache preempts
  LLM busy = make_llm(14, 4, 128, o);
  auto q = p;
  q.seed = 7;
  const auto outs = busy.generate_tokens({b, a, c}, {q, p, q});
  EXPECT_EQ(outs[1].output.token_ids, solo);
  EXPECT_GT(busy.last_stats().num_preemptions, 0);
  // A different seed gives a different continuation.
  p.seed = 43;
  EXPECT_NE(alone.generate_tokens({a}, {p})[0].output.token_ids, solo);
}

TEST(LLMLoop, LogprobsAreTheRawLogSoftmaxOfEveryStep) {
  LLM llm = make_llm(64, 4, 128);
  auto p = greedy(6);
  p.logprobs = 3;
  const auto prompt = prompt_of_length(7, 5);
  const auto o = llm.generate_tokens({prompt}, {p})[0];
  ASSERT_EQ(o.output.logprobs.size(), 6u);
  auto seq = prompt;
  for (size_t i = 0; i < 6; ++i) {
    const auto x = reference_logits(seq);
    double m = *std::max_element(x.begin(), x.end()), z = 0;
    for (float v : x) z += std::exp(v - m);
    const auto& lp = o.output.logprobs[i];
    ASSERT_EQ(lp.size(), 3u);  // greedy: the sampled token is the top one
    EXPECT_EQ(lp[0].first, o.output.token_ids[i]);
    for (const auto& [t, v] : lp) EXPECT_NEAR(v, x[static_cast<size_t>(t)] - m - std::log(z), 1e-5);
    EXPECT_GE(lp[1].second, lp[2].second);
    EXPECT_GE(lp[0].second, lp[1].second);
    seq.push_back(o.output.token_ids[i]);
  }
}

TEST(LLMLoop, MaxModelLenCapsTheOutput) {
  LLM llm = make_llm(64, 4, 32);
  const auto outs = llm.generate_tokens({prompt_of_length(29, 1), prompt_of_length(32, 2)}, {greedy(10)});
  EXPECT_EQ(outs[0].output.token_ids.size(), 3u);
  EXPECT_EQ(outs[0].output.finish_reason, "length");
  EXPECT_EQ(outs[1].output.token_ids.size(), 1u);
  EXPECT_EQ(outs[1].output.token_ids, reference_greedy(prompt_of_length(32, 2), 1));
}

TEST(LLMLoop, BadPromptsAreClearErrors) {
  LLM llm = make_llm(64, 4, 32);
  auto expect_error = [&](const std::vector<std::vector<int32_t>>& prompts, const char* needle) {
    try {
      llm.generate_tokens(prompts, {greedy(4)});
      ADD_FAILURE() << "no error for " << needle;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error({prompt_of_length(4, 1), prompt_of_length(33, 1)}, "more than max_model_len 32");
  expect_error({{1, 2, 64}}, "token 2 is id 64, which is not in the model's vocabulary (0..63)");
  expect_error({{1, -1}}, "is id -1");
  expect_error({{}}, "is empty");
  auto bad = greedy(4);
  bad.top_p = 2;
  EXPECT_THROW(llm.generate_tokens({{1}}, {bad}), InvalidArgument);
  EXPECT_THROW(llm.generate_tokens({{1}, {2}}, {greedy(1), greedy(1), greedy(1)}), InvalidArgument);
  // A request that cannot fit the KV cache at all.
  LLM tiny = make_llm(3, 4, 32);
  try {
    tiny.generate_tokens({prompt_of_length(2, 1), prompt_of_length(20, 1)}, {greedy(4)});
    ADD_FAILURE() << "no error for a request larger than the KV cache";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("prompt 1 (20 tokens + up to 4 generated) needs 6 KV blocks of 4 tokens but "
                                         "the cache has 2"),
              std::string::npos)
        << e.what();
  }
  // Nothing ran, and the engine still works.
  EXPECT_EQ(llm.generate_tokens({{1, 2}}, {greedy(2)})[0].output.token_ids, reference_greedy({1, 2}, 2));
}
