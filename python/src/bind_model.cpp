// Python bindings of model/: offline generation (`kvattn.LLM`, `kvattn.SamplingParams`) with
// vLLM's names.  kvattn/llm.py wraps `_LLM` into vLLM's `LLM(model, ...)` /
// `generate(prompts, sampling_params)` surface; results are `RequestOutput`s whose
// `.outputs[0]` is a `CompletionOutput` (`.text`, `.token_ids`, `.finish_reason`, ...).
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include "bindings.h"
#include "kvattn/model/llm.h"
#include "kvattn/model/sampling.h"

namespace py = pybind11;

namespace kvattn::python {
namespace {

using model::CompletionOutput;
using model::RequestOutput;
using model::SamplingParams;

py::object stop_reason_of(const CompletionOutput& c) {
  if (!c.stop_reason.empty()) return py::str(c.stop_reason);
  if (c.stop_token_id) return py::int_(*c.stop_token_id);
  return py::none();
}

// vLLM's per-token logprobs: a dict {token_id: logprob}, the sampled token first.
py::object logprobs_of(const CompletionOutput& c) {
  if (c.logprobs.empty()) return py::none();
  py::list out;
  for (const auto& tok : c.logprobs) {
    py::dict d;
    for (const auto& [id, lp] : tok) d[py::int_(id)] = py::float_(lp);
    out.append(d);
  }
  return out;
}

void bind_model(py::module_& m) {
  py::class_<SamplingParams>(m, "SamplingParams",
                             "vLLM's SamplingParams: keyword arguments with vLLM's names and defaults")
      .def(py::init([](int64_t n, double temperature, int64_t top_k, double top_p, double min_p,
                       double repetition_penalty, double frequency_penalty, double presence_penalty,
                       std::optional<uint64_t> seed, std::optional<int64_t> max_tokens,
                       std::optional<std::vector<std::string>> stop, std::optional<std::vector<int32_t>> stop_token_ids,
                       bool include_stop_str_in_output, bool ignore_eos, std::optional<int64_t> logprobs,
                       bool skip_special_tokens) {
             if (n != 1)
               throw Unsupported("SamplingParams(n=" + std::to_string(n) +
                                 "): kvattn generates one completion per prompt; pass the prompt n times instead");
             SamplingParams p;
             p.temperature = temperature;
             p.top_k = top_k;
             p.top_p = top_p;
             p.min_p = min_p;
             p.repetition_penalty = repetition_penalty;
             p.frequency_penalty = frequency_penalty;
             p.presence_penalty = presence_penalty;
             p.seed = seed;
             if (max_tokens) p.max_tokens = *max_tokens;
             if (stop) p.stop = *stop;
             if (stop_token_ids) p.stop_token_ids = *stop_token_ids;
             p.include_stop_str_in_output = include_stop_str_in_output;
             p.ignore_eos = ignore_eos;
             if (logprobs) p.logprobs = *logprobs;
             p.skip_special_tokens = skip_special_tokens;
             // Range checks that need no vocabulary now; token ids are checked against the model.
             p.validate(INT32_MAX);
             return p;
           }),
           py::kw_only(), py::arg("n") = 1, py::arg("temperature") = 1.0, py::arg("top_k") = -1,
           py::arg("top_p") = 1.0, py::arg("min_p") = 0.0, py::arg("repetition_penalty") = 1.0,
           py::arg("frequency_penalty") = 0.0, py::arg("presence_penalty") = 0.0, py::arg("seed") = py::none(),
           py::arg("max_tokens") = 16, py::arg("stop") = py::none(), py::arg("stop_token_ids") = py::none(),
           py::arg("include_stop_str_in_output") = false, py::arg("ignore_eos") = false,
           py::arg("logprobs") = py::none(), py::arg("skip_special_tokens") = true)
      .def_readwrite("temperature", &SamplingParams::temperature)
      .def_readwrite("top_k", &SamplingParams::top_k)
      .def_readwrite("top_p", &SamplingParams::top_p)
      .def_readwrite("min_p", &SamplingParams::min_p)
      .def_readwrite("repetition_penalty", &SamplingParams::repetition_penalty)
      .def_readwrite("frequency_penalty", &SamplingParams::frequency_penalty)
      .def_readwrite("presence_penalty", &SamplingParams::presence_penalty)
      .def_readwrite("seed", &SamplingParams::seed)
      .def_readwrite("max_tokens", &SamplingParams::max_tokens)
      .def_readwrite("stop", &SamplingParams::stop)
      .def_readwrite("stop_token_ids", &SamplingParams::stop_token_ids)
      .def_readwrite("include_stop_str_in_output", &SamplingParams::include_stop_str_in_output)
      .def_readwrite("ignore_eos", &SamplingParams::ignore_eos)
      .def_readwrite("logprobs", &SamplingParams::logprobs)
      .def_readwrite("skip_special_tokens", &SamplingParams::skip_special_tokens)
      .def("__repr__", [](const SamplingParams& p) {
        return fmt::format("SamplingParams(temperature={}, top_k={}, top_p={}, min_p={}, seed={}, max_tokens={})",
                           p.temperature, p.top_k, p.top_p, p.min_p, p.seed ? std::to_string(*p.seed) : "None",
                           p.max_tokens);
      });

  py::class_<CompletionOutput>(m, "CompletionOutput",
                               "vLLM's CompletionOutput: one generated sequence — text, token_ids, finish_reason "
                               "('stop' | 'length'), stop_reason (the stop string or token id), logprobs (a dict "
                               "{token_id: logprob} per token, the sampled token first) when requested")
      .def_readonly("index", &CompletionOutput::index)
      .def_readonly("text", &CompletionOutput::text)
      .def_readonly("token_ids", &CompletionOutput::token_ids)
      .def_readonly("finish_reason", &CompletionOutput::finish_reason)
      .def_property_readonly("stop_reason", &stop_reason_of)
      .def_property_readonly("logprobs", &logprobs_of)
      .def("finished", [](const CompletionOutput& c) { return !c.finish_reason.empty(); })
      .def("__repr__", [](const CompletionOutput& c) {
        return fmt::format("CompletionOutput(index={}, text={:?}, token_ids=[{} tokens], finish_reason={})", c.index,
                           c.text, c.token_ids.size(), c.finish_reason);
      });

  py::class_<RequestOutput>(m, "RequestOutput",
                            "vLLM's RequestOutput: one prompt's result — request_id, prompt, prompt_token_ids, "
                            "outputs (a list of one CompletionOutput), finished, metrics (time to first token, "
                            "decode tokens/s, preemptions, KV blocks)")
      .def_readonly("request_id", &RequestOutput::request_id)
      .def_readonly("prompt", &RequestOutput::prompt)
      .def_readonly("prompt_token_ids", &RequestOutput::prompt_token_ids)
      .def_readonly("finished", &RequestOutput::finished)
      .def_property_readonly("outputs", [](const RequestOutput& r) { return std::vector<CompletionOutput>{r.output}; })
      .def_property_readonly("metrics", [](const RequestOutput& r) {
        py::dict d;
        d["time_to_first_token_s"] = r.metrics.time_to_first_token_s;
        d["total_time_s"] = r.metrics.total_time_s;
        d["decode_tokens_per_s"] = r.metrics.decode_tokens_per_s;
        d["num_preemptions"] = r.metrics.num_preemptions;
        d["kv_blocks"] = r.metrics.kv_blocks;
        return d;
      })
      .def("__repr__", [](const RequestOutput& r) {
        return fmt::format("RequestOutput(request_id={}, prompt={:?}, outputs=[CompletionOutput(text={:?})])",
                           r.request_id, r.prompt, r.output.text);
      });

  py::class_<model::LLM>(m, "_LLM", "The C++ engine behind kvattn.LLM (kvattn/llm.py)")
      .def(py::init([](const std::filesystem::path& model, const std::string& device, const std::string& dtype,
                       const std::string& kv_cache_dtype, const std::string& layout, int64_t kv_cache_memory,
                       double gpu_memory_utilization, int64_t max_model_len, int64_t block_size, int64_t max_num_seqs,
                       int64_t max_num_batched_tokens, uint64_t seed, const std::string& logprobs_mode,
                       bool skip_tokenizer_init) {
             model::ModelLoadConfig lc;
             lc.device = device;
             lc.dtype = dtype;
             lc.kv_cache_dtype = kv_cache_dtype;
             lc.layout = layout;
             lc.kv_cache_memory = kv_cache_memory;
             lc.gpu_memory_utilization = gpu_memory_utilization;
             lc.max_model_len = max_model_len;
             lc.block_size = block_size;
             model::EngineOptions eo;
             eo.max_num_seqs = max_num_seqs;
             eo.max_num_batched_tokens = max_num_batched_tokens;
             eo.seed = seed;
             eo.logprobs_mode = model::parse_logprobs_mode(logprobs_mode);
             eo.skip_tokenizer_init = skip_tokenizer_init;
             py::gil_scoped_release release;
             return model::LLM::open(model, lc, eo);
           }),
           py::arg("model"), py::kw_only(), py::arg("device") = "cpu", py::arg("dtype") = "auto",
           py::arg("kv_cache_dtype") = "auto", py::arg("layout") = "auto", py::arg("kv_cache_memory") = 0,
           py::arg("gpu_memory_utilization") = 0.9, py::arg("max_model_len") = 0, py::arg("block_size") = 16,
           py::arg("max_num_seqs") = 256, py::arg("max_num_batched_tokens") = 8192, py::arg("seed") = 0,
           py::arg("logprobs_mode") = "raw_logprobs", py::arg("skip_tokenizer_init") = false)
      .def(
          "generate",
          [](model::LLM& llm, const std::vector<std::string>& prompts, const std::vector<SamplingParams>& params) {
            py::gil_scoped_release release;
            return llm.generate(prompts, params);
          },
          py::arg("prompts"), py::arg("params"))
      .def(
          "generate_tokens",
          [](model::LLM& llm, const std::vector<std::vector<int32_t>>& prompts,
             const std::vector<SamplingParams>& params) {
            py::gil_scoped_release release;
            return llm.generate_tokens(prompts, params);
          },
          py::arg("prompt_token_ids"), py::arg("params"))
      .def_property_readonly("default_sampling_params", &model::LLM::default_sampling_params)
      .def("encode", [](const model::LLM& llm, const std::string& text) { return llm.codec().encode(text); })
      .def_property_readonly("last_stats", [](const model::LLM& llm) {
        const auto& s = llm.last_stats();
        py::dict d;
        d["num_steps"] = s.num_steps;
        d["num_prompt_tokens"] = s.num_prompt_tokens;
        d["num_generated_tokens"] = s.num_generated_tokens;
        d["num_computed_tokens"] = s.num_computed_tokens;
        d["num_preemptions"] = s.num_preemptions;
        d["num_kv_blocks"] = s.num_kv_blocks;
        d["block_size"] = s.block_size;
        d["peak_kv_blocks_used"] = s.peak_kv_blocks_used;
        d["total_time_s"] = s.total_time_s;
        return d;
      });
}

}  // namespace

KVATTN_PY_BINDER(bind_model);

}  // namespace kvattn::python
