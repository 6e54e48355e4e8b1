// kvattn/model/llm.h — offline generation as vLLM's `LLM.generate`: prompts in, one
// RequestOutput per prompt out, the engine's scheduler (continuous batching, chunked prefill,
// recompute preemption) driving a model step by step.
//
// The loop, per engine step:
//   Scheduler::schedule -> one StepRequest per scheduled request (the tokens it computes this
//   step, their first position, its block table, whether the step ends its known tokens and so
//   needs logits) -> StepExecutor::execute (logits [requests that want them, vocab]) ->
//   RequestSampler::sample per row -> stop checks (EOS unless ignore_eos, stop_token_ids, stop
//   strings on the detokenized text, max_tokens, max_model_len) -> streaming callback ->
//   Scheduler::update_after_step -> Scheduler::finish_request for the requests that stopped.
//
// Finish reasons follow vLLM: "stop" (EOS, a stop token id, or a stop string — the text is cut
// before the stop string unless include_stop_str_in_output; the stop token is kept in
// token_ids but not detokenized), "length" (max_tokens, or prompt + output reached
// max_model_len).  A stop token or stop string wins over "length" in the same step.
//
// Requests that stop early (before max_tokens) leave the scheduler after that step
// (Scheduler::finish_request): their seat and KV blocks serve the waiting requests from the
// next step, and the model is not called for them again.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvattn/core/tensor.h"
#include "kvattn/model/model_runner.h"
#include "kvattn/model/sampling.h"
#include "kvattn/model/tokenizer.h"

namespace kvattn::model {

// What the engine needs from a model (ModelRunner's contract, model_runner.h): num_kv_blocks()
// counts block ids including the reserved null block 0; execute() returns f32 CPU logits
// [number of requests with wants_logits, vocab] in request order, valid until the next call.
class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  virtual int64_t num_kv_blocks() const = 0;
  virtual int64_t block_size() const = 0;
  virtual int64_t max_model_len() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual Tensor execute(std::span<const StepRequest> reqs) = 0;
  // The ModelRunner behind it, when there is one (for its dtype and memory plan).
  virtual const ModelRunner* runner() const { return nullptr; }
};

// Streaming detokenization of one request's output.
class StreamDecoder {
 public:
  virtual ~StreamDecoder() = default;
  virtual std::string push(int32_t id) = 0;  // the new complete text (may be empty)
  virtual std::string flush() = 0;
};

// The engine's view of a tokenizer: prompt encoding, EOS ids, streaming decoding.
class TextCodec {
 public:
  virtual ~TextCodec() = default;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::unique_ptr<StreamDecoder> decoder(bool skip_special_tokens) const = 0;
  virtual std::vector<int32_t> eos_token_ids() const = 0;  // generation_config's, else the tokenizer's
  // False for a model loaded without a tokenizer: prompts must be token ids, outputs have no
  // text, stop strings are rejected.
  virtual bool has_text() const { return true; }
};

// A Tokenizer as the engine's codec: encode with the tokenizer's special tokens (BOS as the
// model adds it), IncrementalDetokenizer for streaming (ids past the tokenizer's vocabulary, in
// a model's padded embedding rows, decode to no text); EOS = the generation config's EOS ids and
// the tokenizer's (vLLM adds the generation config's to the tokenizer's).
class TokenizerCodec final : public TextCodec {
 public:
  TokenizerCodec(const Tokenizer& tokenizer, std::vector<int32_t> eos_token_ids);
  std::vector<int32_t> encode(std::string_view text) const override;
  std::unique_ptr<StreamDecoder> decoder(bool skip_special_tokens) const override;
  std::vector<int32_t> eos_token_ids() const override { return eos_; }

 private:
  const Tokenizer* tok_;
  std::vector<int32_t> eos_;
};

// How to load a model directory, as strings the way the CLI and Python take them.
struct ModelLoadConfig {
  std::string device = "cpu";         // cpu | cuda | cuda:N
  std::string dtype = "auto";         // compute: auto | float32 | bfloat16 | float16
  std::string kv_cache_dtype = "auto";  // a kv_cache_dtype_choices() name (parse_kv_cache_dtype)
  std::string layout = "auto";        // KV cache layout name (layout_from_name) or auto
  int64_t kv_cache_memory = 0;        // bytes; 0: the runner's default
  double gpu_memory_utilization = 0.9;
  int64_t max_model_len = 0;          // 0: config.json's
  int64_t block_size = 16;
  int num_threads = 0;                // CPU threads; 0: all cores
};

struct EngineOptions {
  int64_t max_num_seqs = 256;             // requests running at once
  int64_t max_num_batched_tokens = 8192;  // tokens per step (prefill chunks share it)
  uint64_t seed = 0;                      // seeds requests without their own seed
  LogprobsMode logprobs_mode = LogprobsMode::raw_logprobs;
  // vLLM's skip_tokenizer_init: load no tokenizer; token-id prompts only, no output text.
  bool skip_tokenizer_init = false;
  // Admission (engine/scheduler.h): true admits a request only while every running one can
  // still grow to its max_tokens (no preemption thrash); false admits on the first chunk's
  // blocks alone, as vLLM V1 does, and decode growth preempts the latest request.
  bool reserve_to_finish = true;
};

struct CompletionOutput {
  int64_t index = 0;
  std::string text;
  std::vector<int32_t> token_ids;
  std::string finish_reason;              // "stop" | "length"
  std::string stop_reason;                // the stop string that matched (empty otherwise)
  std::optional<int32_t> stop_token_id;   // the stop token id that matched (not EOS)
  std::vector<TokenLogprobs> logprobs;    // one per token when SamplingParams::logprobs > 0
};

struct RequestMetrics {
  double time_to_first_token_s = 0;  // from generate()'s start to the first sampled token
  double total_time_s = 0;           // from generate()'s start to the last one
  double decode_tokens_per_s = 0;    // (outputs - 1) / (last - first token time); 0 for 1 output
  int64_t num_preemptions = 0;
  int64_t kv_blocks = 0;             // the most KV blocks the request held at once
};

struct RequestOutput {
  std::string request_id;
  std::string prompt;
  std::vector<int32_t> prompt_token_ids;
  CompletionOutput output;
  bool finished = false;
  RequestMetrics metrics;
};

// Totals of the last generate() call.
struct GenerateStats {
  int64_t num_steps = 0;
  int64_t num_model_calls = 0;
  int64_t num_prompt_tokens = 0;
  int64_t num_generated_tokens = 0;
  int64_t num_computed_tokens = 0;   // tokens the model computed, recomputation included
  int64_t num_preemptions = 0;
  int64_t num_kv_blocks = 0;         // usable blocks (the null block excluded)
  int64_t block_size = 0;
  int64_t peak_kv_blocks_used = 0;
  double total_time_s = 0;
};

// Called on the engine thread as tokens arrive.  `text` is the new text since the previous
// event of this request (held back while it could still become a stop string);
// `output.finished` marks the last event of a request.
struct StreamEvent {
  size_t index = 0;  // position of the prompt in generate()'s input
  int32_t token_id = -1;
  std::string_view text;
  const RequestOutput& output;
};
using StreamCallback = std::function<void(const StreamEvent&)>;

class LLM {
 public:
  // A model given as an executor and a codec (for tests and embedders).
  LLM(std::unique_ptr<StepExecutor> executor, std::unique_ptr<TextCodec> codec, EngineOptions options = {});
  // A Hugging Face model directory: open_model_dir (all validation first), a ModelRunner with
  // `runner` (its max_num_seqs / max_num_batched_tokens are taken from `options`), the
  // directory's tokenizer and EOS ids.
  LLM(const std::filesystem::path& model_dir, const ModelRunner::Options& runner, EngineOptions options = {});
  // The same from strings ("auto" dtype / layout resolved by the runner).
  static LLM open(const std::filesystem::path& model_dir, const ModelLoadConfig& load, EngineOptions options = {});
  ~LLM();
  LLM(LLM&&) noexcept;
  LLM& operator=(LLM&&) noexcept;

  // One output per prompt, in order.  All prompts are validated (length <= max_model_len, token
  // ids in the vocabulary, parameters) before anything runs.
  std::vector<RequestOutput> generate(const std::vector<std::string>& prompts, const SamplingParams& params,
                                      const StreamCallback& callback = {});
  std::vector<RequestOutput> generate(const std::vector<std::string>& prompts,
                                      const std::vector<SamplingParams>& params, const StreamCallback& callback = {});
  // Prompts given as token ids (vLLM's TokensPrompt).
  std::vector<RequestOutput> generate_tokens(const std::vector<std::vector<int32_t>>& prompts,
                                             const std::vector<SamplingParams>& params,
                                             const StreamCallback& callback = {});

  const GenerateStats& last_stats() const noexcept { return stats_; }
  // vLLM's default when no SamplingParams are given: the generation config's temperature,
  // top_p, top_k and repetition_penalty over SamplingParams' defaults.
  const SamplingParams& default_sampling_params() const noexcept { return defaults_; }
  const EngineOptions& options() const noexcept { return options_; }
  StepExecutor& executor() noexcept { return *executor_; }
  const TextCodec& codec() const noexcept { return *codec_; }

 private:
  static void check_options(const EngineOptions& o);
  void check_kv_blocks() const;
  std::vector<RequestOutput> run(std::vector<RequestOutput> outputs, const std::vector<SamplingParams>& params,
                                 const StreamCallback& callback);

  std::unique_ptr<StepExecutor> executor_;
  std::unique_ptr<TextCodec> codec_;
  EngineOptions options_;
  GenerateStats stats_;
  SamplingParams defaults_;
  int64_t requests_started_ = 0;  // for request ids and unseeded requests' seeds
};

}  // namespace kvattn::model
