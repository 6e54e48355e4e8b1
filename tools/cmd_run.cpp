// `kvattn run`: serve a request trace through the whole attention layer (engine/runner.h)
// and print a summary.  Progress bar on a terminal, plain log lines otherwise.
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "command_registry.h"
#include "kvattn/core/cuda_runtime_api.h"
#include "kvattn/engine/runner.h"
#include "kvattn/kv/model_config.h"

namespace kvattn::tools {
namespace {

struct RunOptions {
  std::string trace = "default";
  std::string device = "auto";
  std::string model = "tiny-llama";
  std::string layout = "auto";
  std::string block_size;
  std::string kv_cache_dtype = "auto";
  std::string max_num_seqs = "32";
  std::string max_num_batched_tokens = "1024";
  std::string max_model_len;
  std::string gpu_memory = "16MiB";
  std::string num_layers;
  std::string backend = "FLASHINFER";
  std::string cascade = "rule";
  std::string check_every = "1";
  std::string json_path;
  std::string seed = "1";
  std::string dcp = "1";
  std::string dcp_comm_backend = "ag_rs";
  std::string dcp_interleave = "1";
  std::string dcp_transport = "auto";
  int default_requests = 48;
  bool no_prefix_sharing = false;
  bool quiet = false;
};

int64_t parse_int(const std::string& flag, const std::string& v, int64_t lo) {
  int64_t x = 0;
  size_t used = 0;
  try {
    x = std::stoll(v, &used);
  } catch (...) {
    used = 0;
  }
  if (used != v.size() || v.empty() || x < lo)
    throw InvalidArgument(fmt::format("{} must be an integer >= {}, got '{}'", flag, lo, v));
  return x;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

std::function<int()> setup_run(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  app.add_option("--trace", o->trace, "JSON Lines trace file, or 'default' for the built-in mix");
  app.add_option("--device", o->device, "cpu, cuda, cuda:N or auto (cuda when available)");
  app.add_option("--model", o->model, "model preset (" + fmt::format("{}", fmt::join(model_preset_names(), ", ")) +
                                          ") or a config.json path");
  app.add_option("--num-layers", o->num_layers, "serve only the first N layers of the model");
  app.add_option("--layout", o->layout, "KV cache layout: auto or a layout name (LBNHC, NHD, HND, ...)");
  app.add_option("--block-size", o->block_size, "tokens per KV cache block (default 16; hybrid models pick one that holds a Mamba state)");
  app.add_option("--kv-cache-dtype", o->kv_cache_dtype, "auto, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2");
  app.add_option("--max-num-seqs", o->max_num_seqs, "requests running at once");
  app.add_option("--max-num-batched-tokens", o->max_num_batched_tokens, "tokens per step (the scheduler's budget)");
  app.add_option("--max-model-len", o->max_model_len, "override the model's maximum length");
  app.add_option("--gpu-memory", o->gpu_memory, "memory for the KV cache, e.g. 64MiB, 2GiB");
  app.add_option("--backend", o->backend, "attention backend (FLASHINFER = kvattn's native backend, REFERENCE)");
  app.add_option("--cascade", o->cascade, "rule (FlashAttention's heuristic), backend (the backend's hook), off");
  app.add_option("--check-every", o->check_every, "compare one layer with the reference backend every N steps (0: never)");
  app.add_option("--num-requests", o->default_requests, "requests in the default trace");
  app.add_option("--seed", o->seed, "seed of the synthetic Q/K/V");
  app.add_option("--dcp", o->dcp,
                 "decode context parallel ranks: each holds 1/N of every request's KV and 1/N of the query heads "
                 "(CUDA: one GPU per rank over NCCL, from --device on; CPU: ranks as threads)");
  app.add_option("--dcp-comm-backend", o->dcp_comm_backend, "DCP combine: ag_rs (all-gather LSE + reduce-scatter) or a2a");
  app.add_option("--dcp-transport", o->dcp_transport,
                 "DCP collectives: auto (NCCL on CUDA, threads on CPU), nccl, in-process (all ranks on one device)");
  app.add_option("--dcp-interleave", o->dcp_interleave, "DCP: consecutive tokens per rank (cp_kv_cache_interleave_size)");
  app.add_flag("--no-prefix-sharing", o->no_prefix_sharing, "do not share shared-prefix blocks between requests");
  app.add_option("--json", o->json_path, "also write the summary as JSON to this file ('-' for stdout)");
  app.add_flag("--quiet", o->quiet, "no progress output");
  return [o]() -> int {
    engine::RunConfig rc;
    rc.model = o->model;
    if (o->device == "auto") {
      rc.device = cuda::available() ? Device::cuda(0) : Device::cpu();
    } else {
      rc.device = Device::parse(o->device);
    }
    if (rc.device.is_cuda() && !cuda::available())
      throw Unsupported(fmt::format("--device {} but {}; use --device cpu", rc.device.str(),
                                    cuda::built_with_cuda() ? "no CUDA device is present"
                                                            : "this build has no CUDA support"));
    if (!o->num_layers.empty()) rc.num_layers = parse_int("--num-layers", o->num_layers, 1);
    rc.layout = o->layout;
    if (!o->block_size.empty()) rc.block_size = parse_int("--block-size", o->block_size, 1);
    rc.kv_cache_dtype = o->kv_cache_dtype;
    rc.max_num_seqs = static_cast<int32_t>(parse_int("--max-num-seqs", o->max_num_seqs, 1));
    rc.max_num_batched_tokens = static_cast<int32_t>(parse_int("--max-num-batched-tokens", o->max_num_batched_tokens, 1));
    if (!o->max_model_len.empty()) rc.max_model_len = parse_int("--max-model-len", o->max_model_len, 2);
    rc.gpu_memory = parse_memory_size(o->gpu_memory);
    rc.backend = o->backend;
    rc.cascade = o->cascade;
    rc.check_every = static_cast<int32_t>(parse_int("--check-every", o->check_every, 0));
    rc.seed = static_cast<uint64_t>(parse_int("--seed", o->seed, 0));
    rc.prefix_sharing = !o->no_prefix_sharing;
    rc.dcp = static_cast<int32_t>(parse_int("--dcp", o->dcp, 1));
    rc.dcp_comm_backend = o->dcp_comm_backend;
    rc.dcp_transport = o->dcp_transport;
    rc.dcp_interleave = static_cast<int32_t>(parse_int("--dcp-interleave", o->dcp_interleave, 1));

    ModelConfig model = load_model_config(rc.model);
    const int64_t max_len = rc.max_model_len.value_or(model.max_model_len);
    engine::Trace trace = o->trace == "default" ? engine::default_trace(max_len, o->default_requests)
                                                : engine::load_trace_file(o->trace, max_len);
    for (const auto& e : trace.errors) fmt::print(stderr, "kvattn run: {}:{}: {} (line skipped)\n", o->trace, e.line, e.message);

    const bool tty = !o->quiet && isatty(fileno(stderr));
    int64_t last_logged = -1;
    auto progress = [&](const engine::RunProgress& p) {
      if (o->quiet) return;
      const double tps = p.elapsed_s > 0 ? static_cast<double>(p.tokens) / p.elapsed_s : 0.0;
      const double kv = p.blocks_total > 0 ? 100.0 * static_cast<double>(p.blocks_used) / static_cast<double>(p.blocks_total) : 0;
      if (tty) {
        const int width = 30;
        const int filled = static_cast<int>(width * p.finished / std::max<int64_t>(1, p.total));
        fmt::print(stderr, "\r[{}{}] {}/{} requests  step {}  {:.0f} tok/s  KV {:.0f}%   ", std::string(filled, '#'),
                   std::string(width - filled, '.'), p.finished, p.total, p.step, tps, kv);
        if (p.finished == p.total) fmt::print(stderr, "\n");
      } else {
        const int64_t decile = 10 * p.finished / std::max<int64_t>(1, p.total);
        if (decile != last_logged) {
          last_logged = decile;
          fmt::print(stderr, "kvattn run: step {}: {}/{} requests done, {} tokens, {:.0f} tok/s, KV {:.0f}% used\n",
                     p.step, p.finished, p.total, p.tokens, tps, kv);
        }
      }
    };
    engine::RunStats s = engine::run_trace(rc, trace, progress);

    std::vector<double> host, attn;
    int64_t tokens = 0;
    for (const auto& t : s.timings) {
      host.push_back(t.host_us);
      attn.push_back(t.attention_us);
      tokens += t.tokens;
    }
    double attn_total = 0, host_total = 0;
    for (double x : attn) attn_total += x;
    for (double x : host) host_total += x;
    const double tps = attn_total + host_total > 0 ? static_cast<double>(tokens) / ((attn_total + host_total) * 1e-6) : 0;

    fmt::print("\nkvattn run — summary\n");
    fmt::print("  model               {} ({} attention layers), KV {} {}, backend {}, device {}\n", s.model,
               s.num_layers, s.layout, s.kv_cache_dtype, s.backend, s.device);
    if (s.dcp > 1)
      fmt::print("  DCP                 {} ranks ({}), {} combine, interleave {}\n", s.dcp, s.dcp_transport,
                 rc.dcp_comm_backend, rc.dcp_interleave);
    fmt::print("  requests            {} served{}\n", s.num_requests,
               s.trace_errors ? fmt::format(", {} malformed trace lines skipped", s.trace_errors) : std::string());
    fmt::print("  steps               {}\n", s.steps);
    fmt::print("  tokens              {} ({} prefill, {} decode), {} generated\n", tokens, s.prefill_tokens,
               s.decode_tokens, s.output_tokens);
    fmt::print("  attention / step    median {:.1f} us, p99 {:.1f} us (KV writes + forwards, all layers)\n",
               percentile(attn, 0.5), percentile(attn, 0.99));
    fmt::print("  host / step         median {:.1f} us, p99 {:.1f} us (schedule, batch, metadata, build)\n",
               percentile(host, 0.5), percentile(host, 0.99));
    fmt::print("  throughput          {:.0f} tokens/s (attention + host time); wall {:.2f} s incl. checks\n", tps,
               s.wall_s);
    // The slowest step: one-off costs (first launches, first allocations) weigh on the throughput
    // sum but not on the medians; --json lists every step.
    size_t slowest = 0;
    for (size_t i = 1; i < s.timings.size(); ++i)
      if (s.timings[i].attention_us + s.timings[i].host_us >
          s.timings[slowest].attention_us + s.timings[slowest].host_us)
        slowest = i;
    if (!s.timings.empty())
      fmt::print("  slowest step        #{} of {}: attention {:.1f} us, host {:.1f} us, {} tokens\n", slowest + 1,
                 s.timings.size(), s.timings[slowest].attention_us, s.timings[slowest].host_us,
                 s.timings[slowest].tokens);
    fmt::print("  KV blocks           peak {} of {} used\n", s.peak_blocks_used, s.num_blocks - 1);
    fmt::print("  preemptions         {}\n", s.preemptions);
    fmt::print("  cascade steps       {}\n", s.cascade_steps);
    fmt::print("  correctness checks  {} passed, {} query tokens recomputed by the reference (max |native - "
               "reference| = {:.3g})\n",
               s.checks_passed, s.checked_tokens, s.max_check_error);
    fmt::print("  outputs             {}\n", s.all_outputs_correct ? "every request produced its output_len tokens"
                                                                    : "MISSING OUTPUTS");

    if (!o->json_path.empty()) {
      nlohmann::json j;
      j["model"] = s.model;
      j["num_layers"] = s.num_layers;
      j["device"] = s.device;
      j["layout"] = s.layout;
      j["kv_cache_dtype"] = s.kv_cache_dtype;
      j["backend"] = s.backend;
      j["dcp"] = s.dcp;
      if (s.dcp > 1) j["dcp_transport"] = s.dcp_transport;
      j["requests"] = s.num_requests;
      j["trace_errors"] = s.trace_errors;
      j["steps"] = s.steps;
      j["tokens"] = tokens;
      j["prefill_tokens"] = s.prefill_tokens;
      j["decode_tokens"] = s.decode_tokens;
      j["generated_tokens"] = s.output_tokens;
      j["attention_us_per_step"] = {{"median", percentile(attn, 0.5)}, {"p99", percentile(attn, 0.99)}};
      j["host_us_per_step"] = {{"median", percentile(host, 0.5)}, {"p99", percentile(host, 0.99)}};
      j["tokens_per_s"] = tps;
      nlohmann::json steps = nlohmann::json::array();
      for (const auto& t : s.timings)
        steps.push_back({{"tokens", t.tokens}, {"attention_us", t.attention_us}, {"host_us", t.host_us}});
      j["step_timings"] = std::move(steps);  // every step that ran work, in order
      j["wall_s"] = s.wall_s;
      j["peak_kv_blocks"] = s.peak_blocks_used;
      j["kv_blocks"] = s.num_blocks - 1;
      j["preemptions"] = s.preemptions;
      j["cascade_steps"] = s.cascade_steps;
      j["checks_passed"] = s.checks_passed;
      j["checked_tokens"] = s.checked_tokens;
      j["max_check_error"] = s.max_check_error;
      j["all_outputs_correct"] = s.all_outputs_correct;
      const std::string text = j.dump(2) + "\n";
      if (o->json_path == "-") {
        fmt::print("{}", text);
      } else {
        std::ofstream f(o->json_path);
        if (!f) throw InvalidArgument(fmt::format("cannot write --json file '{}'", o->json_path));
        f << text;
      }
    }
    if (!s.all_outputs_correct) return 4;
    return s.trace_errors > 0 ? 1 : 0;
  };
}

const bool registered = register_command({"run", "Serve a request trace through the attention layer (the main job)",
                                          &setup_run, 10});

}  // namespace
}  // namespace kvattn::tools
