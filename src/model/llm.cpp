#include "kvattn/model/llm.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "kvattn/core/error.h"
#include "kvattn/engine/scheduler.h"
#include "kvattn/kv/kv_cache_layout.h"
#include "kvattn/model/model_dir.h"

namespace kvattn::model {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

// Moves `cut` back to the start of a UTF-8 sequence so a streamed delta never splits one.
size_t utf8_boundary(const std::string& s, size_t cut) {
  while (cut > 0 && cut < s.size() && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return cut;
}

// A request's block table as the scheduler keeps it: one list, or one list per KV cache group
// ([group][block]) where the scheduler allocates per group — the model runner takes one table
// for all its groups, so the engine schedules a single group and passes its list.
[[maybe_unused]] std::span<const int32_t> block_table(const std::vector<int32_t>& blocks) { return blocks; }
[[maybe_unused]] std::span<const int32_t> block_table(const std::vector<std::vector<int32_t>>& groups) {
  return groups.empty() ? std::span<const int32_t>() : std::span<const int32_t>(groups.front());
}

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// One request's generation state.
struct Sequence {
  std::vector<int32_t> tokens;  // prompt + generated
  int64_t prompt_len = 0;
  int64_t max_outputs = 0;      // min(max_tokens, max_model_len - prompt_len), >= 1
  std::unique_ptr<RequestSampler> sampler;
  std::unique_ptr<StreamDecoder> decoder;
  size_t streamed = 0;          // bytes of output.text already streamed
  size_t holdback = 0;          // bytes kept back while they could start a stop string
  bool done = false;
  Clock::time_point first_token{}, last_token{};
};

// A model directory and its runner as the engine's executor.  The directory (weights mapped,
// tokenizer) lives as long as the runner that reads it.
class RunnerExecutor final : public StepExecutor {
 public:
  RunnerExecutor(std::unique_ptr<ModelDir> dir, const ModelRunner::Options& options)
      : dir_(std::move(dir)), runner_(*dir_, options) {}
  int64_t num_kv_blocks() const override { return runner_.num_kv_blocks(); }
  int64_t block_size() const override { return runner_.block_size(); }
  int64_t max_model_len() const override { return runner_.max_model_len(); }
  int64_t vocab_size() const override { return runner_.vocab_size(); }
  Tensor execute(std::span<const StepRequest> reqs) override { return runner_.execute(reqs); }
  const ModelRunner* runner() const override { return &runner_; }
  const ModelDir& dir() const noexcept { return *dir_; }

 private:
  std::unique_ptr<ModelDir> dir_;
  ModelRunner runner_;
};

// The codec of a model loaded without a tokenizer.
class TokenIdsOnlyCodec final : public TextCodec {
 public:
  explicit TokenIdsOnlyCodec(std::vector<int32_t> eos) : eos_(std::move(eos)) {}
  std::vector<int32_t> encode(std::string_view) const override {
    throw InvalidArgument(
        "this model was loaded without a tokenizer (skip_tokenizer_init, or the directory has none): give "
        "prompts as token ids");
  }
  std::unique_ptr<StreamDecoder> decoder(bool) const override {
    struct NoText final : StreamDecoder {
      std::string push(int32_t) override { return {}; }
      std::string flush() override { return {}; }
    };
    return std::make_unique<NoText>();
  }
  std::vector<int32_t> eos_token_ids() const override { return eos_; }
  bool has_text() const override { return false; }

 private:
  std::vector<int32_t> eos_;
};

SamplingParams defaults_from(const GenerationConfig& g) {
  SamplingParams p;
  if (g.temperature) p.temperature = *g.temperature;
  if (g.top_p) p.top_p = *g.top_p;
  if (g.top_k) p.top_k = *g.top_k;
  if (g.repetition_penalty) p.repetition_penalty = *g.repetition_penalty;
  return p;
}

}  // namespace

TokenizerCodec::TokenizerCodec(const Tokenizer& tokenizer, std::vector<int32_t> eos_token_ids)
    : tok_(&tokenizer), eos_(std::move(eos_token_ids)) {
  for (int32_t id : tokenizer.eos_ids())
    if (std::find(eos_.begin(), eos_.end(), id) == eos_.end()) eos_.push_back(id);
}

std::vector<int32_t> TokenizerCodec::encode(std::string_view text) const { return tok_->encode(text, true); }

std::unique_ptr<StreamDecoder> TokenizerCodec::decoder(bool skip_special_tokens) const {
  // Ids beyond the tokenizer's vocabulary (a model's embedding rows are often padded past it)
  // have no text: they decode to nothing, as in vLLM.
  struct Decoder final : StreamDecoder {
    IncrementalDetokenizer detok;
    int64_t vocab;
    Decoder(const Tokenizer& t, bool skip) : detok(t, skip), vocab(t.vocab_size()) {}
    std::string push(int32_t id) override { return id >= 0 && id < vocab ? detok.push(id) : std::string(); }
    std::string flush() override { return detok.flush(); }
  };
  return std::make_unique<Decoder>(*tok_, skip_special_tokens);
}

LLM::LLM(std::unique_ptr<StepExecutor> executor, std::unique_ptr<TextCodec> codec, EngineOptions options)
    : executor_(std::move(executor)), codec_(std::move(codec)), options_(options) {
  KVATTN_CHECK(executor_ != nullptr && codec_ != nullptr, "LLM needs a model executor and a tokenizer codec");
  check_options(options_);
  check_kv_blocks();
}

void LLM::check_options(const EngineOptions& o) {
  KVATTN_CHECK(o.max_num_seqs >= 1 && o.max_num_seqs <= (1 << 20), "max_num_seqs must be in [1, 2^20], got {}",
               o.max_num_seqs);
  KVATTN_CHECK(o.max_num_batched_tokens >= 1 && o.max_num_batched_tokens <= (int64_t{1} << 30),
               "max_num_batched_tokens must be in [1, 2^30], got {}", o.max_num_batched_tokens);
}

void LLM::check_kv_blocks() const {
  KVATTN_CHECK(executor_->num_kv_blocks() >= 2,
               "the KV cache has {} blocks (block 0 is reserved); give it more memory (--kv-cache-memory)",
               executor_->num_kv_blocks());
}

LLM::LLM(const std::filesystem::path& model_dir, const ModelRunner::Options& runner, EngineOptions options)
    : options_(options) {
  check_options(options_);
  auto dir = std::make_unique<ModelDir>(open_model_dir(model_dir, /*require_tokenizer=*/!options_.skip_tokenizer_init));
  std::vector<int32_t> eos;
  for (int64_t id : dir->generation.eos_token_ids)
    if (id >= 0 && id <= INT32_MAX) eos.push_back(static_cast<int32_t>(id));
  for (int64_t id : dir->config.eos_token_ids)
    if (id >= 0 && id <= INT32_MAX && std::find(eos.begin(), eos.end(), id) == eos.end())
      eos.push_back(static_cast<int32_t>(id));
  defaults_ = defaults_from(dir->generation);
  ModelRunner::Options ro = runner;
  ro.max_num_seqs = options_.max_num_seqs;
  ro.max_num_batched_tokens = options_.max_num_batched_tokens;
  const Tokenizer* tok = options_.skip_tokenizer_init ? nullptr : dir->tokenizer.get();
  auto exec = std::make_unique<RunnerExecutor>(std::move(dir), ro);
  if (tok)
    codec_ = std::make_unique<TokenizerCodec>(*tok, std::move(eos));
  else
    codec_ = std::make_unique<TokenIdsOnlyCodec>(std::move(eos));
  executor_ = std::move(exec);
  check_kv_blocks();
}

LLM LLM::open(const std::filesystem::path& model_dir, const ModelLoadConfig& load, EngineOptions options) {
  ModelRunner::Options ro;
  ro.device = Device::parse(load.device);
  ro.compute_dtype = ModelRunner::parse_dtype_option(load.dtype);
  ro.kv_cache_dtype = parse_kv_cache_dtype(load.kv_cache_dtype);
  ro.layout = parse_layout_option(load.layout);
  KVATTN_CHECK(load.kv_cache_memory >= 0, "kv_cache_memory must be >= 0 bytes, got {}", load.kv_cache_memory);
  ro.kv_cache_memory = load.kv_cache_memory;
  ModelRunner::check_gpu_memory_utilization(load.gpu_memory_utilization);
  ro.gpu_memory_utilization = load.gpu_memory_utilization;
  KVATTN_CHECK(load.max_model_len >= 0, "max_model_len must be >= 0 (0: the model's), got {}", load.max_model_len);
  ro.max_model_len = load.max_model_len;
  KVATTN_CHECK(load.block_size >= 1, "block_size must be >= 1, got {}", load.block_size);
  ro.block_size = load.block_size;
  ro.num_threads = load.num_threads;
  return LLM(model_dir, ro, options);
}

LLM::~LLM() = default;
LLM::LLM(LLM&&) noexcept = default;
LLM& LLM::operator=(LLM&&) noexcept = default;

std::vector<RequestOutput> LLM::generate(const std::vector<std::string>& prompts, const SamplingParams& params,
                                         const StreamCallback& callback) {
  return generate(prompts, std::vector<SamplingParams>(prompts.size(), params), callback);
}

std::vector<RequestOutput> LLM::generate(const std::vector<std::string>& prompts,
                                         const std::vector<SamplingParams>& params, const StreamCallback& callback) {
  KVATTN_CHECK(params.size() == prompts.size() || params.size() == 1,
               "got {} sampling parameter sets for {} prompts; pass one, or one per prompt", params.size(),
               prompts.size());
  std::vector<RequestOutput> outputs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    outputs[i].prompt = prompts[i];
    outputs[i].prompt_token_ids = codec_->encode(prompts[i]);
  }
  return run(std::move(outputs), params, callback);
}

std::vector<RequestOutput> LLM::generate_tokens(const std::vector<std::vector<int32_t>>& prompts,
                                                const std::vector<SamplingParams>& params,
                                                const StreamCallback& callback) {
  KVATTN_CHECK(params.size() == prompts.size() || params.size() == 1,
               "got {} sampling parameter sets for {} prompts; pass one, or one per prompt", params.size(),
               prompts.size());
  std::vector<RequestOutput> outputs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) outputs[i].prompt_token_ids = prompts[i];
  return run(std::move(outputs), params, callback);
}

std::vector<RequestOutput> LLM::run(std::vector<RequestOutput> outputs, const std::vector<SamplingParams>& params,
                                    const StreamCallback& callback) {
  const auto t0 = Clock::now();
  stats_ = {};
  const int64_t vocab = executor_->vocab_size();
  const int64_t max_model_len = executor_->max_model_len();
  const int64_t block_size = executor_->block_size();
  const int64_t num_blocks = executor_->num_kv_blocks();
  const std::vector<int32_t> eos = codec_->eos_token_ids();
  auto params_of = [&](size_t i) -> const SamplingParams& { return params.size() == 1 ? params[0] : params[i]; };

  // Validate everything before running anything.
  std::vector<Sequence> seqs(outputs.size());
  std::vector<engine::TraceRequest> trace;
  trace.reserve(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    const auto& ids = outputs[i].prompt_token_ids;
    const SamplingParams& p = params_of(i);
    p.validate(vocab);
    KVATTN_CHECK(p.stop.empty() || codec_->has_text(),
                 "request {} has stop strings but the model was loaded without a tokenizer; use stop_token_ids", i);
    KVATTN_CHECK(!ids.empty(), "prompt {} is empty (0 tokens); give it at least one token", i);
    KVATTN_CHECK(static_cast<int64_t>(ids.size()) <= max_model_len,
                 "prompt {} has {} tokens, more than max_model_len {}; shorten it or raise --max-model-len", i,
                 ids.size(), max_model_len);
    for (size_t j = 0; j < ids.size(); ++j)
      KVATTN_CHECK(ids[j] >= 0 && ids[j] < vocab,
                   "prompt {} token {} is id {}, which is not in the model's vocabulary (0..{})", i, j, ids[j],
                   vocab - 1);
    Sequence& s = seqs[i];
    s.prompt_len = static_cast<int64_t>(ids.size());
    s.max_outputs = std::max<int64_t>(1, std::min(p.max_tokens, max_model_len - s.prompt_len));
    s.tokens.reserve(static_cast<size_t>(s.prompt_len + s.max_outputs));
    s.tokens = ids;
    const int64_t request_number = requests_started_ + static_cast<int64_t>(i);
    s.sampler = std::make_unique<RequestSampler>(p, vocab, ids, options_.seed ^ (0x5bd1e995ULL * (request_number + 1)),
                                                 options_.logprobs_mode);
    s.decoder = codec_->decoder(p.skip_special_tokens);
    if (!p.include_stop_str_in_output)
      for (const auto& st : p.stop) s.holdback = std::max(s.holdback, st.size() - 1);
    outputs[i].request_id = std::to_string(request_number);
    outputs[i].output.token_ids.reserve(static_cast<size_t>(s.max_outputs));
    engine::TraceRequest t;
    t.id = static_cast<int64_t>(i);
    t.arrival_step = 0;
    t.prompt_len = static_cast<int32_t>(s.prompt_len);
    t.output_len = static_cast<int32_t>(s.max_outputs);
    trace.push_back(t);
    stats_.num_prompt_tokens += s.prompt_len;
    const int64_t need = cdiv(s.prompt_len + s.max_outputs - 1, block_size);
    KVATTN_CHECK(need <= num_blocks - 1,
                 "prompt {} ({} tokens + up to {} generated) needs {} KV blocks of {} tokens but the cache has {}; "
                 "give the KV cache more memory (--kv-cache-memory) or lower max_tokens",
                 i, s.prompt_len, s.max_outputs, need, block_size, num_blocks - 1);
  }
  requests_started_ += static_cast<int64_t>(outputs.size());
  stats_.num_kv_blocks = num_blocks - 1;
  stats_.block_size = block_size;
  if (outputs.empty()) return outputs;

  engine::SchedulerConfig cfg;
  cfg.block_size = static_cast<int32_t>(block_size);
  cfg.max_num_seqs = static_cast<int32_t>(options_.max_num_seqs);
  cfg.max_num_batched_tokens = static_cast<int32_t>(options_.max_num_batched_tokens);
  cfg.max_model_len = max_model_len;
  cfg.enable_prefix_sharing = false;
  cfg.reserve_to_finish = options_.reserve_to_finish;
  KVATTN_CHECK(num_blocks <= INT32_MAX, "{} KV blocks is more than the scheduler's 32-bit ids", num_blocks);
  engine::Scheduler sched(cfg, static_cast<int32_t>(num_blocks), trace);
  for (size_t i = 0; i < outputs.size(); ++i)
    KVATTN_CHECK(sched.request(static_cast<int64_t>(i)).state == engine::RequestState::Waiting,
                 "the scheduler cannot serve prompt {} ({} tokens) in a KV cache of {} blocks of {} tokens", i,
                 seqs[i].prompt_len, num_blocks - 1, block_size);

  SamplerScratch scratch(vocab);
  std::vector<StepRequest> step_reqs;
  std::vector<size_t> step_index;  // prompt index of each StepRequest
  step_reqs.reserve(outputs.size());
  step_index.reserve(outputs.size());
  TokenLogprobs lp;
  int64_t step = 0;
  int64_t idle_steps = 0;

  std::vector<int64_t> ended;  // requests that finished in this step
  auto finish = [&](size_t i, const char* reason) {
    ended.push_back(static_cast<int64_t>(i));
    seqs[i].done = true;
    outputs[i].finished = true;
    outputs[i].output.finish_reason = reason;
  };

  while (sched.has_pending_work()) {
    const engine::SchedulerOutput out = sched.schedule(step);
    if (out.scheduled.empty()) {
      KVATTN_ASSERT(++idle_steps < 1000, "the scheduler scheduled nothing for 1000 steps with requests pending");
      ++step;
      continue;
    }
    idle_steps = 0;
    step_reqs.clear();
    step_index.clear();
    for (const auto& sr : out.scheduled) {
      const auto i = static_cast<size_t>(sr.request_id);
      const engine::EngineRequest& er = sched.request(sr.request_id);
      Sequence& s = seqs[i];
      KVATTN_ASSERT(!s.done, "request {} finished but was scheduled again", i);
      const std::span<const int32_t> blocks = block_table(er.block_ids);
      outputs[i].metrics.kv_blocks = std::max<int64_t>(outputs[i].metrics.kv_blocks, static_cast<int64_t>(blocks.size()));
      KVATTN_ASSERT(er.num_known_tokens() == static_cast<int32_t>(s.tokens.size()),
                    "request {} has {} tokens but the scheduler knows {}", i, s.tokens.size(), er.num_known_tokens());
      const int64_t begin = sr.num_computed_before, n = sr.num_new_tokens;
      StepRequest r;
      r.request_id = static_cast<int64_t>(i);
      r.token_ids = std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(begin), static_cast<size_t>(n));
      r.start_pos = begin;
      r.block_ids = blocks;
      r.wants_logits = begin + n == static_cast<int64_t>(s.tokens.size());
      step_reqs.push_back(r);
      step_index.push_back(i);
      stats_.num_computed_tokens += n;
    }

    if (!step_reqs.empty()) {
      const Tensor logits = executor_->execute(step_reqs);
      ++stats_.num_model_calls;
      const auto num_rows = static_cast<int64_t>(
          std::count_if(step_reqs.begin(), step_reqs.end(), [](const StepRequest& r) { return r.wants_logits; }));
      KVATTN_ASSERT(logits.dtype() == DType::f32 && logits.device().is_cpu() && logits.dim() == 2 &&
                        logits.size(0) == num_rows && logits.size(1) == vocab && logits.is_contiguous(),
                    "the model returned logits {} for {} rows of {} tokens; expected f32 CPU [{}, {}]",
                    logits.str(), num_rows, vocab, num_rows, vocab);
      const float* rows = logits.data_ptr<float>();
      int64_t row = 0;
      const auto now = Clock::now();
      for (size_t k = 0; k < step_reqs.size(); ++k) {
        if (!step_reqs[k].wants_logits) continue;
        const size_t i = step_index[k];
        Sequence& s = seqs[i];
        RequestOutput& o = outputs[i];
        const SamplingParams& p = params_of(i);
        const std::span<const float> row_logits(rows + row * vocab, static_cast<size_t>(vocab));
        ++row;
        const bool want_lp = p.logprobs > 0;
        const int32_t tok = s.sampler->sample(row_logits, scratch, want_lp ? &lp : nullptr);
        s.tokens.push_back(tok);
        o.output.token_ids.push_back(tok);
        if (want_lp) o.output.logprobs.push_back(lp);
        ++stats_.num_generated_tokens;
        if (o.output.token_ids.size() == 1) s.first_token = now;
        s.last_token = now;

        // Stop checks, vLLM's order: EOS, stop token ids, then length; stop strings on the text.
        const bool is_eos = !p.ignore_eos && std::find(eos.begin(), eos.end(), tok) != eos.end();
        const bool is_stop_id = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), tok) != p.stop_token_ids.end();
        const size_t before = o.output.text.size();
        if (is_eos || is_stop_id) {
          if (is_stop_id && !is_eos) o.output.stop_token_id = tok;
          if (p.include_stop_str_in_output) o.output.text += s.decoder->push(tok);
          o.output.text += s.decoder->flush();
          finish(i, "stop");
        } else {
          o.output.text += s.decoder->push(tok);
          if (static_cast<int64_t>(o.output.token_ids.size()) >= s.max_outputs) {
            o.output.text += s.decoder->flush();
            finish(i, "length");
          }
        }
        // Stop strings: searched where the new text could complete one (vLLM's window).
        if (!p.stop.empty() && o.output.text.size() > before) {
          for (const auto& st : p.stop) {
            const size_t from = before + 1 >= st.size() ? before + 1 - st.size() : 0;
            size_t at = o.output.text.find(st, from);
            if (at == std::string::npos) continue;
            if (p.include_stop_str_in_output) at += st.size();
            if (at < o.output.text.size()) o.output.text.resize(at);
            o.output.stop_reason = st;
            o.output.stop_token_id.reset();
            finish(i, "stop");
            break;
          }
        }
        if (s.done) {
          o.metrics.time_to_first_token_s = seconds(t0, s.first_token);
          o.metrics.total_time_s = seconds(t0, s.last_token);
          const double decode = seconds(s.first_token, s.last_token);
          o.metrics.decode_tokens_per_s =
              o.output.token_ids.size() > 1 && decode > 0 ? static_cast<double>(o.output.token_ids.size() - 1) / decode : 0;
          o.metrics.num_preemptions = sched.request(static_cast<int64_t>(i)).num_preemptions;
        }
        if (callback) {
          size_t upto = o.output.text.size();
          if (!s.done) upto = utf8_boundary(o.output.text, upto > s.holdback ? upto - s.holdback : 0);
          upto = std::max(upto, s.streamed);
          const std::string_view delta = std::string_view(o.output.text).substr(s.streamed, upto - s.streamed);
          s.streamed = upto;
          callback(StreamEvent{i, tok, delta, o});
        }
      }
    }
    sched.update_after_step(out);
    // A request that stopped before its planned length (EOS, a stop token id or string) leaves
    // the scheduler now: its seat, blocks and budget serve the others from the next step.  One
    // that reached its length was finished by update_after_step already (finish_request: false).
    for (int64_t id : ended) sched.finish_request(id);
    ended.clear();
    ++step;
  }

  for (size_t i = 0; i < outputs.size(); ++i)
    KVATTN_ASSERT(seqs[i].done, "request {} ended without a finish reason", i);
  KVATTN_ASSERT(stats_.num_computed_tokens == sched.num_computed_tokens_total(),
                "the model computed {} tokens but the scheduler planned {}", stats_.num_computed_tokens,
                sched.num_computed_tokens_total());
  stats_.num_steps = step;
  stats_.num_preemptions = sched.num_preemptions();
  stats_.peak_kv_blocks_used = sched.pool().peak_used();
  stats_.total_time_s = seconds(t0, Clock::now());
  return outputs;
}

}  // namespace kvattn::model
