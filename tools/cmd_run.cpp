// `kvattn run`: serve a request trace through the whole attention layer (engine/runner.h)
// and print a summary.  Progress bar on a terminal, plain log lines otherwise.
//
// Exit codes: 0 every request served with its output_len tokens; 1 the run finished but not
// every trace line was served (malformed lines skipped, or requests rejected because they can
// never fit in the KV cache); 2 a bad option, trace file, model or configuration refused before
// the run, a failed correctness check, or a result file that cannot be written; 3 an
// unexpected error; 4 a served request ended without its output_len tokens (a bug).
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "command_registry.h"
#include "kvattn/core/cuda_runtime_api.h"
#include "kvattn/engine/runner.h"
#include "kvattn/kv/model_config.h"
#include "output_file.h"

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
  std::string admission = "reserve";
  std::string check_every = "1";
  std::string json_path;
  std::string seed = "1";
  std::string dcp = "1";
  std::string dcp_comm_backend = "ag_rs";
  std::string dcp_interleave = "1";
  std::string dcp_transport = "auto";
  std::string num_requests = "48";
  bool no_prefix_sharing = false;
  bool quiet = false;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

std::function<int()> setup_run(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  app.option_defaults()->always_capture_default();
  app.add_option("--trace", o->trace, "JSON Lines trace file, or 'default' for the built-in mix")->type_name("PATH");
  app.add_option("--device", o->device, "cpu, cuda, cuda:N or auto (cuda when available)");
  app.add_option("--model", o->model, "model preset (" + fmt::format("{}", fmt::join(model_preset_names(), ", ")) +
                                          ") or a config.json path");
  app.add_option("--num-layers", o->num_layers, "serve only the first N layers of the model (default: all)")
      ->type_name("INT");
  app.add_option("--layout", o->layout, "KV cache layout: auto or a layout name (LBNHC, NHD, HND, ...)");
  app.add_option("--block-size", o->block_size,
                 "tokens per KV cache block (default 16; hybrid models pick one that holds a Mamba state)")
      ->type_name("INT");
  app.add_option("--kv-cache-dtype", o->kv_cache_dtype, "KV cache dtype: " + kv_cache_dtype_choices_str());
  app.add_option("--max-num-seqs", o->max_num_seqs, "requests running at once")->type_name("INT");
  app.add_option("--max-num-batched-tokens", o->max_num_batched_tokens, "tokens per step (the scheduler's budget)")
      ->type_name("INT");
  app.add_option("--max-model-len", o->max_model_len, "override the model's maximum length (default: the model's)")
      ->type_name("INT");
  app.add_option("--gpu-memory", o->gpu_memory, "memory for the KV cache, e.g. 64MiB, 2GiB or bytes")
      ->type_name("BYTES");
  app.add_option("--backend", o->backend, "attention backend (FLASHINFER = kvattn's native backend, REFERENCE)");
  app.add_option("--cascade", o->cascade, "rule (FlashAttention's heuristic), backend (the backend's hook), off");
  app.add_option("--admission", o->admission,
                 "reserve (admit only while the running requests can finish: no preemption thrash) or optimistic "
                 "(admit on the first chunk's blocks; decode growth preempts the latest request)");
  app.add_option("--check-every", o->check_every, "compare one layer with the reference backend every N steps (0: never)")
      ->type_name("INT");
  app.add_option("--num-requests", o->num_requests, "requests in the default trace (not with --trace FILE)")
      ->type_name("INT");
  app.add_option("--seed", o->seed, "seed of the synthetic Q/K/V")->type_name("INT");
  app.add_option("--dcp", o->dcp,
                 "decode context parallel ranks: each holds 1/N of every request's KV and 1/N of the query heads "
                 "(CUDA: one GPU per rank over NCCL, from --device on; CPU: ranks as threads)")
      ->type_name("INT");
  app.add_option("--dcp-comm-backend", o->dcp_comm_backend, "DCP combine: ag_rs (all-gather LSE + reduce-scatter) or a2a");
  app.add_option("--dcp-transport", o->dcp_transport,
                 "DCP collectives: auto (NCCL on CUDA, threads on CPU), nccl, in-process (all ranks on one device)");
  app.add_option("--dcp-interleave", o->dcp_interleave,
                 "DCP: consecutive tokens per rank (cp_kv_cache_interleave_size); must divide the block size")
      ->type_name("INT");
  app.add_flag("--no-prefix-sharing", o->no_prefix_sharing, "do not share shared-prefix blocks between requests");
  app.add_option("--json", o->json_path,
                 "also write the summary as JSON to this file ('-': stdout, and every text line goes to stderr)")
      ->type_name("PATH");
  app.add_flag("--quiet", o->quiet, "no progress output");
  app.footer(
      "Exit codes: 0 every request served; 1 served, but some trace lines were malformed or some requests can never "
      "fit the KV cache (each reported with its trace line); 2 a refused option, trace, model or configuration, a "
      "failed correctness check, or an unwritable --json; 3 an unexpected error; 4 a request ended without its "
      "output_len tokens.");
  return [o, &app]() -> int {
    // Every value is checked at full width before the run starts; the result file is opened now.
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
    if (!o->num_layers.empty()) rc.num_layers = parse_int_option("--num-layers", o->num_layers, 1, 1 << 20);
    rc.layout = parse_layout_option(o->layout);
    if (!o->block_size.empty()) rc.block_size = parse_int_option("--block-size", o->block_size, 1, 1 << 20);
    rc.kv_cache_dtype = parse_kv_cache_dtype(o->kv_cache_dtype);
    rc.max_num_seqs = static_cast<int32_t>(parse_int_option("--max-num-seqs", o->max_num_seqs, 1, 1 << 16));
    rc.max_num_batched_tokens =
        static_cast<int32_t>(parse_int_option("--max-num-batched-tokens", o->max_num_batched_tokens, 1, 1 << 24));
    if (!o->max_model_len.empty()) rc.max_model_len = parse_int_option("--max-model-len", o->max_model_len, 2, 1 << 30);
    rc.gpu_memory = parse_memory_size(o->gpu_memory);
    rc.backend = o->backend;
    rc.cascade = o->cascade;
    rc.admission = o->admission;
    rc.check_every = static_cast<int32_t>(parse_int_option("--check-every", o->check_every, 0, kInt32Max));
    rc.seed = static_cast<uint64_t>(parse_int_option("--seed", o->seed, 0, std::numeric_limits<int64_t>::max()));
    rc.prefix_sharing = !o->no_prefix_sharing;
    rc.dcp = static_cast<int32_t>(parse_int_option("--dcp", o->dcp, 1, 64));
    rc.dcp_comm_backend = o->dcp_comm_backend;
    rc.dcp_transport = o->dcp_transport;
    rc.dcp_interleave = static_cast<int32_t>(parse_int_option("--dcp-interleave", o->dcp_interleave, 1, 1 << 20));
    const bool trace_file = o->trace != "default";
    if (trace_file && app.count("--num-requests") > 0)
      throw InvalidArgument(fmt::format("--num-requests sizes the built-in default trace; with --trace {} the trace "
                                        "file decides the requests. Drop --num-requests, or use --trace default",
                                        o->trace));
    const int num_requests = static_cast<int>(parse_int_option("--num-requests", o->num_requests, 1, 1 << 20));
    OutputFile json_out("--json", o->json_path);
    // With the JSON on stdout, every text line goes to stderr.
    FILE* text = json_out.is_stdout() ? stderr : stdout;

    ModelConfig model = load_model_config(rc.model);
    const int64_t max_len = rc.max_model_len.value_or(model.max_model_len);
    engine::Trace trace = trace_file ? engine::load_trace_file(o->trace, max_len)
                                     : engine::default_trace(max_len, num_requests);
    for (const auto& w : trace.warnings) fmt::print(stderr, "kvattn run: {}:{}: warning: {}\n", o->trace, w.line, w.message);
    for (const auto& e : trace.errors) fmt::print(stderr, "kvattn run: {}:{}: {} (line skipped)\n", o->trace, e.line, e.message);

    const bool tty = !o->quiet && isatty(fileno(stderr));
    int64_t last_logged = -1;
    auto progress = [&](const engine::RunProgress& p) {
      if (o->quiet) return;
      // The summary's throughput: tokens over attention + host time (not wall time, which
      // includes Q/K/V synthesis and the reference checks).
      const double tps = p.busy_s > 0 ? static_cast<double>(p.tokens) / p.busy_s : 0.0;
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
    for (const auto& r : s.rejected) fmt::print(stderr, "kvattn run: {} (request rejected; the others are served)\n", r);

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
    const int64_t served = s.num_requests - static_cast<int64_t>(s.rejected.size());
    const int64_t needed = s.computed_tokens - s.recomputed_tokens;

    auto line = [&](const std::string& t) { fmt::print(text, "{}\n", t); };
    line("\nkvattn run — summary");
    line(fmt::format("  model               {} ({} attention layers), KV {} {}, backend {}, device {}", s.model,
                     s.num_layers, s.layout, s.kv_cache_dtype, s.backend, s.device));
    line(fmt::format("  plan                budget {} ({} bytes), {} blocks of {} tokens ({} usable + the null block), "
                     "layout {}",
                     format_bytes(s.gpu_memory), s.gpu_memory, s.num_blocks, s.block_size, s.num_blocks - 1, s.layout));
    // One line per run of identical groups (a hybrid model has many equal Mamba groups).
    for (size_t g = 0; g < s.groups.size();) {
      size_t e = g + 1;
      while (e < s.groups.size() && s.groups[e] == s.groups[g]) ++e;
      const std::string who = e - g == 1 ? fmt::format("group {}", g) : fmt::format("groups {}-{}", g, e - 1);
      line(fmt::format("    {:<18}{}{}", who, s.groups[g], e - g == 1 ? "" : " each"));
      g = e;
    }
    line(fmt::format("    layout why        {}", s.layout_reason));
    if (s.dcp > 1)
      line(fmt::format("  DCP                 {} ranks ({}), {} combine, interleave {}", s.dcp, s.dcp_transport,
                       rc.dcp_comm_backend, rc.dcp_interleave));
    std::vector<std::string> notes;
    if (!s.rejected.empty()) notes.push_back(fmt::format("{} rejected (can never fit the KV cache)", s.rejected.size()));
    if (s.trace_errors) notes.push_back(fmt::format("{} malformed trace lines skipped", s.trace_errors));
    line(fmt::format("  requests            {} served{}", served,
                     notes.empty() ? std::string() : fmt::format(", {}", fmt::join(notes, ", "))));
    line(fmt::format("  steps               {}", s.steps));
    line(fmt::format("  tokens              {} ({} prefill, {} decode), {} generated", tokens, s.prefill_tokens,
                     s.decode_tokens, s.output_tokens));
    line(fmt::format("  attention / step    median {}, p99 {} (KV writes + forwards, all layers)",
                     format_us(percentile(attn, 0.5)), format_us(percentile(attn, 0.99))));
    line(fmt::format("  host / step         median {}, p99 {} (schedule, batch, metadata, build)",
                     format_us(percentile(host, 0.5)), format_us(percentile(host, 0.99))));
    line(fmt::format("  throughput          {:.0f} tokens/s (tokens / (attention + host time)); wall {:.2f} s incl. "
                     "Q/K/V synthesis and checks",
                     tps, s.wall_s));
    // The slowest step: one-off costs (first launches, first allocations) weigh on the throughput
    // sum but not on the medians; --json lists every step.
    size_t slowest = 0;
    for (size_t i = 1; i < s.timings.size(); ++i)
      if (s.timings[i].attention_us + s.timings[i].host_us >
          s.timings[slowest].attention_us + s.timings[slowest].host_us)
        slowest = i;
    if (!s.timings.empty())
      line(fmt::format("  slowest step        #{} of {}: attention {}, host {}, {} tokens", slowest + 1,
                       s.timings.size(), format_us(s.timings[slowest].attention_us),
                       format_us(s.timings[slowest].host_us), s.timings[slowest].tokens));
    line(fmt::format("  KV blocks           peak {} of {} used", s.peak_blocks_used, s.num_blocks - 1));
    line(fmt::format("  preemptions         {}; recomputed tokens {} ({:.2f}x the {} necessary; --admission {})",
                     s.preemptions, s.recomputed_tokens, s.recompute_ratio(), needed, rc.admission));
    line(fmt::format("  cascade             {} of {} steps — {}", s.cascade_steps, s.steps, s.cascade_reason));
    line(fmt::format("  correctness checks  {} passed, {} query tokens recomputed by the reference (max |native - "
                     "reference| = {:.3g}, tolerance {:.3g})",
                     s.checks_passed, s.checked_tokens, s.max_check_error, s.check_tolerance));
    line(fmt::format("  outputs             {}", s.all_outputs_correct
                                                      ? "every served request produced its output_len tokens"
                                                      : "MISSING OUTPUTS"));

    if (json_out.enabled()) {
      nlohmann::json j;
      j["model"] = s.model;
      j["num_layers"] = s.num_layers;
      j["device"] = s.device;
      j["layout"] = s.layout;
      j["layout_reason"] = s.layout_reason;
      j["kv_cache_dtype"] = s.kv_cache_dtype;
      j["backend"] = s.backend;
      j["gpu_memory"] = s.gpu_memory;
      j["block_size"] = s.block_size;
      j["kv_cache_groups"] = s.groups;
      j["dcp"] = s.dcp;
      if (s.dcp > 1) j["dcp_transport"] = s.dcp_transport;
      j["requests"] = s.num_requests;
      j["requests_served"] = served;
      j["rejected"] = s.rejected;
      j["trace_errors"] = s.trace_errors;
      j["steps"] = s.steps;
      j["tokens"] = tokens;
      j["prefill_tokens"] = s.prefill_tokens;
      j["decode_tokens"] = s.decode_tokens;
      j["generated_tokens"] = s.output_tokens;
      j["attention_us_per_step"] = {{"median", percentile(attn, 0.5)}, {"p99", percentile(attn, 0.99)}};
      j["host_us_per_step"] = {{"median", percentile(host, 0.5)}, {"p99", percentile(host, 0.99)}};
      j["tokens_per_s"] = tps;  // tokens / (attention + host time), as the progress line
      nlohmann::json steps = nlohmann::json::array();
      for (const auto& t : s.timings)
        steps.push_back({{"tokens", t.tokens}, {"attention_us", t.attention_us}, {"host_us", t.host_us}});
      j["step_timings"] = std::move(steps);  // every step that ran work, in order
      j["wall_s"] = s.wall_s;
      j["peak_kv_blocks"] = s.peak_blocks_used;
      j["kv_blocks"] = s.num_blocks - 1;
      j["preemptions"] = s.preemptions;
      j["admission"] = rc.admission;
      j["computed_tokens"] = s.computed_tokens;
      j["recomputed_tokens"] = s.recomputed_tokens;
      j["recompute_ratio"] = s.recompute_ratio();
      j["cascade_steps"] = s.cascade_steps;
      j["cascade_reason"] = s.cascade_reason;
      j["checks_passed"] = s.checks_passed;
      j["checked_tokens"] = s.checked_tokens;
      j["max_check_error"] = s.max_check_error;
      j["check_tolerance"] = s.check_tolerance;
      j["all_outputs_correct"] = s.all_outputs_correct;
      json_out.write(j.dump(2) + "\n");
    }
    if (std::fflush(stdout) != 0)
      throw InvalidArgument(fmt::format("kvattn run: writing the summary to stdout failed: {}", std::strerror(errno)));
    if (!s.all_outputs_correct) return 4;
    return s.trace_errors > 0 || !s.rejected.empty() ? 1 : 0;
  };
}

const bool run_registered = register_command({"run", "Serve a request trace through the attention layer (the main job)",
                                          &setup_run, 10});

}  // namespace
}  // namespace kvattn::tools
