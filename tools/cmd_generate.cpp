// `kvattn generate MODEL_DIR`: text generation from a Hugging Face model directory through the
// scheduler, the model runner and kvattn's attention layer (model/llm.h).  One prompt: the text
// streams to stdout as it is generated and a short summary goes to stderr.  Several prompts
// (--prompts FILE.jsonl): a table per request and totals.  --json: one JSON document on stdout.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "command_registry.h"
#include "kvattn/core/error.h"
#include "kvattn/kv/kv_cache_layout.h"
#include "kvattn/kv/model_config.h"
#include "kvattn/model/llm.h"

namespace kvattn::tools {
namespace {

struct GenerateArgs {
  std::string model_dir;
  std::string prompt;
  std::string prompts_file;
  // Sampling (vLLM's SamplingParams names).
  double temperature = 1.0;
  int64_t top_k = -1;
  double top_p = 1.0;
  double min_p = 0.0;
  double repetition_penalty = 1.0;
  double frequency_penalty = 0.0;
  double presence_penalty = 0.0;
  int64_t max_tokens = 16;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool include_stop_str_in_output = false;
  int64_t logprobs = 0;
  std::string logprobs_mode = "raw_logprobs";
  uint64_t seed = 0;
  // Engine and model.
  std::string device = "cpu";
  std::string dtype = "auto";
  std::string kv_cache_dtype = "auto";
  std::string layout = "auto";
  std::string kv_cache_memory;
  double gpu_memory_utilization = 0.9;
  int64_t max_model_len = 0;
  int64_t max_num_seqs = 256;
  int64_t max_num_batched_tokens = 8192;
  std::string admission = "reserve";
  int64_t block_size = 16;
  bool json = false;
};

struct PromptLine {
  std::string text;
  std::optional<std::vector<int32_t>> token_ids;
};

// JSON Lines: {"prompt": "..."} or {"prompt_token_ids": [...]} per line; blank lines and lines
// starting with '#' are skipped.  Any other line is an error naming the file and line.
std::vector<PromptLine> read_prompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InvalidArgument(fmt::format("cannot open --prompts file '{}'; give a JSON Lines file", path));
  std::vector<PromptLine> out;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception&) {
      throw InvalidArgument(fmt::format("{}:{}: not valid JSON; expected {{\"prompt\": \"...\"}}", path, n));
    }
    PromptLine p;
    if (j.is_object() && j.contains("prompt") && j["prompt"].is_string()) {
      p.text = j["prompt"].get<std::string>();
    } else if (j.is_object() && j.contains("prompt_token_ids") && j["prompt_token_ids"].is_array()) {
      std::vector<int32_t> ids;
      for (const auto& v : j["prompt_token_ids"]) {
        if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX)
          throw InvalidArgument(fmt::format("{}:{}: prompt_token_ids must be integers", path, n));
        ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
      }
      p.token_ids = std::move(ids);
    } else {
      throw InvalidArgument(
          fmt::format("{}:{}: expected an object with \"prompt\" (a string) or \"prompt_token_ids\" (a list)", path, n));
    }
    out.push_back(std::move(p));
  }
  if (out.empty()) throw InvalidArgument(fmt::format("--prompts file '{}' has no prompt", path));
  return out;
}

nlohmann::json output_json(const model::RequestOutput& r, bool with_logprobs) {
  nlohmann::json j;
  j["request_id"] = r.request_id;
  j["prompt"] = r.prompt;
  j["prompt_token_ids"] = r.prompt_token_ids;
  j["text"] = r.output.text;
  j["token_ids"] = r.output.token_ids;
  j["finish_reason"] = r.output.finish_reason;
  if (!r.output.stop_reason.empty()) j["stop_reason"] = r.output.stop_reason;
  if (r.output.stop_token_id) j["stop_reason"] = *r.output.stop_token_id;
  if (with_logprobs) {
    nlohmann::json lps = nlohmann::json::array();
    for (const auto& tok : r.output.logprobs) {
      nlohmann::json m = nlohmann::json::array();
      for (const auto& [id, lp] : tok) m.push_back({{"token_id", id}, {"logprob", lp}});
      lps.push_back(m);
    }
    j["logprobs"] = lps;
  }
  j["metrics"] = {{"time_to_first_token_s", r.metrics.time_to_first_token_s},
                  {"total_time_s", r.metrics.total_time_s},
                  {"decode_tokens_per_s", r.metrics.decode_tokens_per_s},
                  {"num_preemptions", r.metrics.num_preemptions},
                  {"kv_blocks", r.metrics.kv_blocks}};
  return j;
}

std::string one_line(std::string s, size_t max) {
  for (char& c : s)  // control characters would move the cursor
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  if (s.size() > max) {
    size_t cut = max - 3;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
    s = s.substr(0, cut) + "...";
  }
  return s;
}

std::string human_bytes(int64_t b) {
  const double v = static_cast<double>(b);
  if (v >= 1024.0 * 1024 * 1024) return fmt::format("{:.2f} GiB", v / (1024.0 * 1024 * 1024));
  return fmt::format("{:.1f} MiB", v / (1024.0 * 1024));
}

// "kvattn generate: cuda:0, bfloat16 compute, KV cache bfloat16 LBNHC, 4096 blocks; memory: ..."
std::string memory_line(model::LLM& llm) {
  const model::ModelRunner* r = llm.executor().runner();
  if (!r) return "kvattn generate: model loaded";
  const model::ModelRunner::MemoryPlan& m = r->memory_plan();
  std::string s = fmt::format("kvattn generate: {} compute, KV cache {} {}, {} blocks of {} tokens; memory: weights {}",
                              dtype_name(r->compute_dtype()), dtype_name(r->kv_cache_dtype()), layout_name(r->layout()),
                              r->num_kv_blocks() - 1, r->block_size(), human_bytes(m.weights));
  if (m.total > 0) s += fmt::format(", activations {}", human_bytes(m.activations));
  s += fmt::format(", KV cache {}", human_bytes(m.kv_cache));
  if (m.total > 0) {
    s += fmt::format(" (device {}, {} in use before loading", human_bytes(m.total), human_bytes(m.in_use_before));
    s += m.utilization > 0 ? fmt::format(", --gpu-memory-utilization {})", m.utilization) : ", --kv-cache-memory)";
  }
  return s;
}

std::function<int()> setup_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateArgs>();
  app.option_defaults()->always_capture_default();
  app.add_option("model_dir", o->model_dir, "Hugging Face model directory (config.json, *.safetensors, tokenizer)")
      ->required();
  auto* prompt = app.add_option("--prompt", o->prompt, "one prompt; its text streams as it is generated");
  auto* prompts = app.add_option("--prompts", o->prompts_file,
                                 "JSON Lines file, one {\"prompt\": \"...\"} or {\"prompt_token_ids\": [...]} per line");
  prompt->excludes(prompts);
  prompts->excludes(prompt);
  app.add_option("--temperature", o->temperature, "sampling temperature; 0 = greedy");
  app.add_option("--top-k", o->top_k, "keep the k most likely tokens (-1 or 0: all)");
  app.add_option("--top-p", o->top_p, "keep the smallest set of tokens with probability mass >= p, in (0, 1]");
  app.add_option("--min-p", o->min_p, "drop tokens below min_p x the top probability, in [0, 1]");
  app.add_option("--repetition-penalty", o->repetition_penalty, "> 1 discourages tokens of the prompt and output");
  app.add_option("--frequency-penalty", o->frequency_penalty, "subtracted per occurrence in the output, [-2, 2]");
  app.add_option("--presence-penalty", o->presence_penalty, "subtracted once if in the output, [-2, 2]");
  app.add_option("--max-tokens", o->max_tokens, "tokens to generate per prompt at most");
  app.add_option("--stop", o->stop, "stop string (repeatable); the text ends before it");
  app.add_option("--stop-token-ids", o->stop_token_ids, "token ids that end generation (repeatable)");
  app.add_flag("--ignore-eos", o->ignore_eos, "keep generating after EOS");
  app.add_flag("--include-stop-str-in-output", o->include_stop_str_in_output, "keep the matched stop string in the text");
  app.add_option("--logprobs", o->logprobs, "top log-probabilities per generated token (with --json), [0, 20]");
  app.add_option("--logprobs-mode", o->logprobs_mode, "raw_logprobs (the model's logits) or processed_logprobs");
  app.add_option("--seed", o->seed, "engine seed: requests are sampled reproducibly from it");
  app.add_option("--device", o->device,
                 "cpu, cuda or cuda:N (CUDA: weights, activations and KV cache on the device; sampling on the host)");
  app.add_option("--dtype", o->dtype,
                 "compute dtype: auto, float32, bfloat16, float16 (CPU: float32 only; CUDA auto: the checkpoint's "
                 "torch_dtype, float32 checkpoints in bfloat16)");
  app.add_option("--kv-cache-dtype", o->kv_cache_dtype, "KV cache dtype: " + kv_cache_dtype_choices_str());
  app.add_option("--layout", o->layout, "KV cache layout: auto or a layout name (LBNHC, NHD, HND, ...)");
  app.add_option("--kv-cache-memory", o->kv_cache_memory,
                 "KV cache size, e.g. 64MiB (default: on CPU room for 8 requests of --max-model-len, at most 4GiB; "
                 "on CUDA --gpu-memory-utilization)");
  app.add_option("--gpu-memory-utilization", o->gpu_memory_utilization,
                 "CUDA: fraction of the device's total memory for weights + activations + KV cache, in (0, 1]; the KV "
                 "cache gets what is left after loading and a profiling step (memory other processes use counts)");
  app.add_option("--max-model-len", o->max_model_len, "maximum prompt + output length (0: the model's)");
  app.add_option("--max-num-seqs", o->max_num_seqs, "requests running at once");
  app.add_option("--max-num-batched-tokens", o->max_num_batched_tokens, "tokens per step (prefill is chunked to fit)");
  app.add_option("--block-size", o->block_size, "tokens per KV cache block");
  app.add_option("--admission", o->admission,
                 "reserve (admit only while the running requests can reach --max-tokens: no preemption thrash) or "
                 "optimistic (admit on the first chunk's blocks, as vLLM V1; decode growth preempts)")
      ->check(CLI::IsMember({"reserve", "optimistic"}));
  app.add_flag("--json", o->json, "print the results as one JSON document on stdout");
  return [o]() -> int {
    if (o->prompt.empty() && o->prompts_file.empty())
      throw InvalidArgument("give a prompt: --prompt \"...\" or --prompts FILE.jsonl");
    model::SamplingParams sp;
    sp.temperature = o->temperature;
    sp.top_k = o->top_k;
    sp.top_p = o->top_p;
    sp.min_p = o->min_p;
    sp.repetition_penalty = o->repetition_penalty;
    sp.frequency_penalty = o->frequency_penalty;
    sp.presence_penalty = o->presence_penalty;
    sp.max_tokens = o->max_tokens;
    sp.stop = o->stop;
    sp.stop_token_ids = o->stop_token_ids;
    sp.ignore_eos = o->ignore_eos;
    sp.include_stop_str_in_output = o->include_stop_str_in_output;
    sp.logprobs = o->logprobs;

    model::EngineOptions eo;
    eo.max_num_seqs = o->max_num_seqs;
    eo.max_num_batched_tokens = o->max_num_batched_tokens;
    eo.seed = o->seed;
    eo.reserve_to_finish = o->admission == "reserve";
    eo.logprobs_mode = model::parse_logprobs_mode(o->logprobs_mode);

    model::ModelLoadConfig lc;
    lc.device = o->device;
    lc.dtype = o->dtype;
    lc.kv_cache_dtype = o->kv_cache_dtype;
    lc.layout = o->layout;
    if (!o->kv_cache_memory.empty()) lc.kv_cache_memory = parse_memory_size(o->kv_cache_memory);
    lc.gpu_memory_utilization = o->gpu_memory_utilization;
    lc.max_model_len = o->max_model_len;
    lc.block_size = o->block_size;
    model::LLM llm = model::LLM::open(o->model_dir, lc, eo);
    if (!o->json) fmt::print(stderr, "{}\n", memory_line(llm));

    std::vector<model::RequestOutput> outs;
    const bool single = !o->prompt.empty();
    if (single) {
      const bool stream = !o->json;
      outs = llm.generate({o->prompt}, sp, stream ? model::StreamCallback([](const model::StreamEvent& e) {
        std::fwrite(e.text.data(), 1, e.text.size(), stdout);
        std::fflush(stdout);
      })
                                                  : model::StreamCallback());
      if (stream) {
        std::fputc('\n', stdout);
        std::fflush(stdout);
      }
    } else {
      const auto lines = read_prompts(o->prompts_file);
      const bool all_text = std::all_of(lines.begin(), lines.end(), [](const PromptLine& p) { return !p.token_ids; });
      if (all_text) {
        std::vector<std::string> texts;
        for (const auto& p : lines) texts.push_back(p.text);
        outs = llm.generate(texts, sp);
      } else {
        std::vector<std::vector<int32_t>> ids;
        for (const auto& p : lines) ids.push_back(p.token_ids ? *p.token_ids : llm.codec().encode(p.text));
        outs = llm.generate_tokens(ids, {sp});
        for (size_t i = 0; i < outs.size(); ++i) outs[i].prompt = lines[i].text;
      }
    }
    const auto& st = llm.last_stats();
    const double tps = st.total_time_s > 0 ? static_cast<double>(st.num_generated_tokens) / st.total_time_s : 0;

    if (o->json) {
      nlohmann::json j;
      j["model_dir"] = o->model_dir;
      if (const model::ModelRunner* r = llm.executor().runner()) {
        const model::ModelRunner::MemoryPlan& m = r->memory_plan();
        j["memory"] = {{"compute_dtype", dtype_name(r->compute_dtype())},
                       {"kv_cache_dtype", dtype_name(r->kv_cache_dtype())},
                       {"weights_bytes", m.weights},
                       {"activations_bytes", m.activations},
                       {"kv_cache_bytes", m.kv_cache},
                       {"device_total_bytes", m.total},
                       {"in_use_before_bytes", m.in_use_before},
                       {"gpu_memory_utilization", m.utilization}};
      }
      j["outputs"] = nlohmann::json::array();
      for (const auto& r : outs) j["outputs"].push_back(output_json(r, sp.logprobs > 0));
      j["stats"] = {{"steps", st.num_steps},
                    {"prompt_tokens", st.num_prompt_tokens},
                    {"generated_tokens", st.num_generated_tokens},
                    {"computed_tokens", st.num_computed_tokens},
                    {"preemptions", st.num_preemptions},
                    {"kv_blocks", st.num_kv_blocks},
                    {"block_size", st.block_size},
                    {"peak_kv_blocks_used", st.peak_kv_blocks_used},
                    {"total_time_s", st.total_time_s},
                    {"generated_tokens_per_s", tps}};
      fmt::print("{}\n", j.dump(2));
      return 0;
    }
    if (single) {
      const auto& r = outs[0];
      fmt::print(stderr,
                 "kvattn generate: {} prompt + {} generated tokens ({}), time to first token {:.1f} ms, {:.1f} "
                 "tokens/s, KV blocks {} of {}, preemptions {}\n",
                 r.prompt_token_ids.size(), r.output.token_ids.size(), r.output.finish_reason,
                 r.metrics.time_to_first_token_s * 1e3, r.metrics.decode_tokens_per_s, r.metrics.kv_blocks,
                 st.num_kv_blocks, r.metrics.num_preemptions);
      return 0;
    }
    fmt::print("{:>4}  {:>7}  {:>7}  {:>9}  {:>8}  {:>6}  {:>7}  {:<6}  {}\n", "#", "prompt", "gen", "TTFT ms",
               "tok/s", "blocks", "preempt", "finish", "text");
    for (size_t i = 0; i < outs.size(); ++i) {
      const auto& r = outs[i];
      fmt::print("{:>4}  {:>7}  {:>7}  {:>9.1f}  {:>8.1f}  {:>6}  {:>7}  {:<6}  {}\n", i, r.prompt_token_ids.size(),
                 r.output.token_ids.size(), r.metrics.time_to_first_token_s * 1e3, r.metrics.decode_tokens_per_s,
                 r.metrics.kv_blocks, r.metrics.num_preemptions, r.output.finish_reason, one_line(r.output.text, 48));
    }
    fmt::print("\n{} requests: {} prompt tokens, {} generated in {:.2f} s ({:.1f} tokens/s), {} steps, KV blocks peak "
               "{} of {} ({} tokens each), {} preemptions\n",
               outs.size(), st.num_prompt_tokens, st.num_generated_tokens, st.total_time_s, tps, st.num_steps,
               st.peak_kv_blocks_used, st.num_kv_blocks, st.block_size, st.num_preemptions);
    return 0;
  };
}

const bool generate_registered = register_command(
    {"generate", "Generate text from a Hugging Face model directory (prompts in, text out)", &setup_generate, 25});

}  // namespace
}  // namespace kvattn::tools
