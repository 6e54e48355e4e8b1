// `kvattn plan`: the KV cache memory plan for a model — resolved layout and why, groups and
// specs, page sizes, every layer's [B, H, N, C] view, blocks that fit and max concurrency.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include <algorithm>

#include "command_registry.h"
#include "kvattn/core/cuda_runtime_api.h"
#include "kvattn/core/error.h"
#include "kvattn/kv/model_config.h"
#include "output_file.h"

namespace kvattn::tools {
namespace {

// Options are taken as strings and parsed here, so every bad value is a kvattn error with the
// seeds' kind of message and exit code 2.
struct PlanArgs {
  std::string model;
  std::string block_size;
  std::string kv_cache_dtype = "auto";
  std::string layout = "auto";
  std::string gpu_memory;
  std::string gpu_memory_utilization;
  std::string max_model_len;
  std::string max_num_batched_tokens = "2048";
  bool json = false;
};

std::optional<int64_t> parse_count(const std::string& flag, const std::string& text, int64_t hi) {
  if (text.empty()) return std::nullopt;
  return parse_int_option(flag, text, 1, hi);
}

std::string dims_str(const Dims& d) { return d.str(); }

template <typename... A>
void put(std::string& out, fmt::format_string<A...> f, A&&... args) {
  fmt::format_to(std::back_inserter(out), f, std::forward<A>(args)...);
}

// The KV cache budget on CPU when no memory option is given (plan allocates nothing).
constexpr int64_t kCpuDefaultBudget = int64_t{4} << 30;
constexpr double kDefaultGpuMemoryUtilization = 0.9;

std::string layers_summary(const ModelConfig& m) {
  std::vector<std::string> parts;
  for (auto k : {ModelLayerKind::full_attention, ModelLayerKind::sliding_window, ModelLayerKind::mamba})
    if (int64_t n = m.num_layers_of(k)) parts.push_back(fmt::format("{} {}", n, model_layer_kind_name(k)));
  return fmt::format("{}", fmt::join(parts, ", "));
}

// Consecutive layers whose views differ only by a constant byte offset print as one line.
struct ViewRun {
  size_t first = 0, last = 0;
  int64_t offset_step = 0;
};

bool same_view(const PlannedLayerView& a, const PlannedLayerView& b) {
  return a.group_id == b.group_id && a.spec_kind == b.spec_kind && a.raw == b.raw && a.dtype == b.dtype &&
         a.shape == b.shape && a.strides == b.strides && a.page_size_bytes == b.page_size_bytes;
}

std::vector<ViewRun> compress(const std::vector<PlannedLayerView>& v) {
  std::vector<ViewRun> runs;
  for (size_t i = 0; i < v.size(); ++i) {
    if (!runs.empty()) {
      ViewRun& r = runs.back();
      const PlannedLayerView& prev = v[r.last];
      if (same_view(prev, v[i])) {
        const int64_t step = v[i].byte_offset - prev.byte_offset;
        if (r.first == r.last || step == r.offset_step) {
          r.offset_step = step;
          r.last = i;
          continue;
        }
      }
    }
    runs.push_back({i, i, 0});
  }
  return runs;
}

std::string plan_text(const KVPlan& p, const std::string& budget_why) {
  std::string o;
  const ModelConfig& m = p.model;
  put(o, "KV cache plan for {}\n\n", m.name);
  put(o, "model      {} layers ({}), dtype {}, max_model_len {}\n", m.num_hidden_layers, layers_summary(m),
             dtype_name(m.dtype), m.max_model_len);
  if (m.num_layers_of(ModelLayerKind::mamba) < m.num_hidden_layers)
    put(o, "attention  {} query heads / {} KV heads, head size {}{}\n", m.num_attention_heads,
               m.num_key_value_heads, m.head_dim,
               m.sliding_window ? fmt::format(", sliding window {}", m.sliding_window) : "");
  if (m.mamba)
    put(o, "mamba      conv state [{}, {}], ssm state [{}, {}, {}], {} ({} bytes per state)\n",
               m.mamba->conv_kernel - 1, m.mamba->conv_dim(), m.mamba->num_heads, m.mamba->head_dim,
               m.mamba->d_state, dtype_name(m.mamba->dtype), m.mamba->page_size_bytes());
  put(o, "kv cache   dtype {} (--kv-cache-dtype {}), block size {} tokens\n\n", dtype_name(p.kv_dtype),
             kv_cache_dtype_name(p.kv_cache_dtype), p.block_size);

  put(o, "layout     {}\n  why: {}\n\n", layout_name(p.layout), p.layout_reason);

  put(o, "groups ({})\n", p.config.kv_cache_groups.size());
  for (size_t g = 0; g < p.config.kv_cache_groups.size(); ++g) {
    const auto& grp = p.config.kv_cache_groups[g];
    put(o, "  group {}: {} layers, page {} bytes, block size {}\n    spec {}\n", g, grp.layer_names.size(),
               grp.kv_cache_spec->page_size_bytes(), grp.kv_cache_spec->block_size(), grp.kv_cache_spec->repr());
  }
  put(o, "\ntensors ({}), one backing allocation of {} bytes ({})\n", p.config.kv_cache_tensors.size(),
             p.total_bytes, format_bytes(p.total_bytes));
  for (size_t i = 0; i < p.config.kv_cache_tensors.size(); ++i) {
    const auto& t = p.config.kv_cache_tensors[i];
    put(o, "  tensor {}: {} layers ({} .. {}), offset {}, layer_stride {}, block_stride {}\n", i,
               t.layers.size(), t.layers.front(), t.layers.back(), t.offset, t.layer_stride, t.block_stride);
  }

  // By group (stable, model order inside a group), so a group's identical layers compress to
  // one line; --json lists every layer.
  std::vector<PlannedLayerView> views = p.views;
  std::stable_sort(views.begin(), views.end(),
                   [](const PlannedLayerView& a, const PlannedLayerView& b) { return a.group_id < b.group_id; });
  put(o, "\nlayer views by group ([B, H, N, C] elements; strides in elements; offset in bytes)\n");
  for (const ViewRun& r : compress(views)) {
    const PlannedLayerView& v = views[r.first];
    const std::string who = r.first == r.last
                                ? v.layer_name
                                : fmt::format("{} .. {} ({} layers)", v.layer_name, views[r.last].layer_name,
                                              r.last - r.first + 1);
    const std::string off = r.first == r.last ? fmt::format("{}", v.byte_offset)
                                              : fmt::format("{} + i*{}", v.byte_offset, r.offset_step);
    if (v.raw)
      put(o, "  {}: group {}, {}: raw backing bytes {} (the layer lays out its own state; page {} bytes)\n", who,
                 v.group_id, v.spec_kind, dims_str(v.shape), v.page_size_bytes);
    else
      put(o, "  {}: group {}, {}: shape {} strides {} {} offset {}\n", who, v.group_id, v.spec_kind,
                 dims_str(v.shape), dims_str(v.strides), dtype_name(v.dtype), off);
  }

  put(o, "\nmemory     budget {} ({} bytes), {} bytes per block\n", format_bytes(p.gpu_memory), p.gpu_memory,
             p.bytes_per_block);
  put(o, "  why: {}\n", budget_why);
  put(o, "blocks     {} fit ({} usable + the null block 0)\n", p.config.num_blocks, p.config.num_blocks - 1);
  put(o, "requests   one {}-token request holds {} blocks; maximum concurrency {:.2f}x\n", m.max_model_len,
             p.blocks_per_request, p.max_concurrency);
  return o;
}

std::string plan_json(const KVPlan& p, const std::string& budget_why) {
  using nlohmann::json;
  const ModelConfig& m = p.model;
  json j;
  json kinds = json::array();
  for (auto k : m.layer_kinds) kinds.push_back(model_layer_kind_name(k));
  j["model"] = {{"name", m.name},
                {"num_hidden_layers", m.num_hidden_layers},
                {"num_attention_heads", m.num_attention_heads},
                {"num_key_value_heads", m.num_key_value_heads},
                {"head_dim", m.head_dim},
                {"dtype", dtype_name(m.dtype)},
                {"max_model_len", m.max_model_len},
                {"sliding_window", m.sliding_window},
                {"layer_kinds", kinds}};
  if (m.mamba)
    j["model"]["mamba"] = {{"conv_state", {m.mamba->conv_kernel - 1, m.mamba->conv_dim()}},
                           {"ssm_state", {m.mamba->num_heads, m.mamba->head_dim, m.mamba->d_state}},
                           {"page_size_bytes", m.mamba->page_size_bytes()}};
  j["kv_cache_dtype"] = kv_cache_dtype_name(p.kv_cache_dtype);
  j["kv_dtype"] = dtype_name(p.kv_dtype);
  j["block_size"] = p.block_size;
  j["layout"] = layout_name(p.layout);
  j["layout_reason"] = p.layout_reason;
  j["layout_candidates"] = layout_names(p.layout_candidates);
  json groups = json::array();
  for (const auto& g : p.config.kv_cache_groups)
    groups.push_back({{"layer_names", g.layer_names},
                      {"spec", g.kv_cache_spec->repr()},
                      {"kind", kv_cache_spec_kind_name(g.kv_cache_spec->kind())},
                      {"block_size", g.kv_cache_spec->block_size()},
                      {"page_size_bytes", g.kv_cache_spec->page_size_bytes()}});
  j["groups"] = groups;
  json tensors = json::array();
  for (const auto& t : p.config.kv_cache_tensors)
    tensors.push_back({{"size", t.size},
                       {"layers", t.layers},
                       {"layer_stride", t.layer_stride},
                       {"block_stride", t.block_stride},
                       {"offset", t.offset}});
  j["tensors"] = tensors;
  json views = json::array();
  for (const auto& v : p.views)
    views.push_back({{"layer", v.layer_name},
                     {"group", v.group_id},
                     {"kind", v.spec_kind},
                     {"raw", v.raw},
                     {"dtype", dtype_name(v.dtype)},
                     {"shape", v.shape.vec()},
                     {"strides", v.strides.vec()},
                     {"byte_offset", v.byte_offset},
                     {"page_size_bytes", v.page_size_bytes}});
  j["views"] = views;
  j["gpu_memory"] = p.gpu_memory;
  j["gpu_memory_reason"] = budget_why;
  j["bytes_per_block"] = p.bytes_per_block;
  j["total_bytes"] = p.total_bytes;
  j["num_blocks"] = p.config.num_blocks;
  j["blocks_per_request"] = p.blocks_per_request;
  j["max_concurrency"] = p.max_concurrency;
  return j.dump(2) + "\n";
}

std::function<int()> setup_plan(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  app.option_defaults()->always_capture_default();
  app.add_option("--model", args->model,
                 fmt::format("(required) Model preset ({}) or path to a Hugging Face config.json",
                             fmt::join(model_preset_names(), ", ")))
      ->type_name("MODEL");
  app.add_option("--block-size", args->block_size, "Tokens per KV cache block (default 16; hybrid: fitted)")
      ->type_name("INT");
  app.add_option("--kv-cache-dtype", args->kv_cache_dtype,
                 fmt::format("KV cache dtype: {}", fmt::join(kv_cache_dtype_choices(), "|")));
  app.add_option("--layout", args->layout, "KV cache layout: auto or LBHNC|LBNHC|LHBNC|BLHNC|BLNHC|BHLNC|NHD|HND");
  app.add_option("--gpu-memory", args->gpu_memory,
                 "Memory available to the KV cache, e.g. 80GiB, 16GB, 512MiB or bytes; overrides "
                 "--gpu-memory-utilization (default: 0.9 of the GPU's memory on CUDA, 4GiB on CPU)")
      ->type_name("BYTES");
  app.add_option("--gpu-memory-utilization", args->gpu_memory_utilization,
                 "Fraction of GPU 0's memory for the KV cache, in (0, 1] (vLLM's option; vLLM also subtracts the "
                 "weights and activations, which kvattn does not know) (default: 0.9 on CUDA)")
      ->type_name("FLOAT");
  app.add_option("--max-model-len", args->max_model_len, "Override the model's maximum length (default: the model's)")
      ->type_name("INT");
  app.add_option("--max-num-batched-tokens", args->max_num_batched_tokens,
                 "Tokens in flight per step (sliding-window memory)")
      ->type_name("INT");
  app.add_flag("--json", args->json, "Print the full plan as JSON (every layer)");
  app.footer("Exit codes: 0 planned; 2 a bad option or model, or a budget too small for one max-length request, or "
             "output that cannot be written; 3 an unexpected error.");
  return [args] {
    if (args->model.empty())
      throw InvalidArgument(fmt::format("--model is required: a preset ({}) or a config.json path",
                                        fmt::join(model_preset_names(), ", ")));
    PlanOptions o;
    o.block_size = parse_count("--block-size", args->block_size, 1 << 20);
    o.kv_cache_dtype = parse_kv_cache_dtype(args->kv_cache_dtype);
    o.layout = parse_layout_option(args->layout);
    std::string budget_why;
    std::optional<double> util;
    if (!args->gpu_memory_utilization.empty()) {
      size_t used = 0;
      double u = 0;
      try {
        u = std::stod(args->gpu_memory_utilization, &used);
      } catch (...) {
        used = 0;
      }
      if (used != args->gpu_memory_utilization.size() || !(u > 0 && u <= 1))
        throw InvalidArgument(fmt::format("--gpu-memory-utilization must be a number in (0, 1], got '{}'; e.g. 0.9",
                                          args->gpu_memory_utilization));
      util = u;
    }
    if (!args->gpu_memory.empty()) {
      o.gpu_memory = parse_memory_size(args->gpu_memory);
      budget_why = fmt::format("--gpu-memory {}", args->gpu_memory);
    } else if (cuda::available()) {
      const double u = util.value_or(kDefaultGpuMemoryUtilization);
      const int64_t total = cuda::total_memory(0);
      o.gpu_memory = static_cast<int64_t>(u * static_cast<double>(total));
      budget_why = fmt::format("--gpu-memory-utilization {}{} x {} of cuda:0 ({}); vLLM would subtract the weights "
                               "and activations from this, kvattn plan does not know them",
                               u, util ? "" : " (default)", format_bytes(total), cuda::device_name(0));
    } else if (util) {
      throw Unsupported(fmt::format("--gpu-memory-utilization {} needs a CUDA device to measure, and {}; pass "
                                    "--gpu-memory instead (e.g. --gpu-memory 16GiB)",
                                    *util, cuda::built_with_cuda() ? "none is present" : "this build has no CUDA"));
    } else {
      o.gpu_memory = kCpuDefaultBudget;
      budget_why = fmt::format("no CUDA device: the default CPU budget {} (pass --gpu-memory to change it)",
                               format_bytes(kCpuDefaultBudget));
    }
    o.max_model_len = parse_count("--max-model-len", args->max_model_len, 1 << 30);
    o.max_num_batched_tokens = parse_count("--max-num-batched-tokens", args->max_num_batched_tokens, 1 << 24).value_or(2048);
    const KVPlan plan = plan_kv_cache(load_model_config(args->model), o);
    OutputFile out("kvattn plan", "-");
    out.write(args->json ? plan_json(plan, budget_why) : plan_text(plan, budget_why));
    return 0;
  };
}

const bool plan_registered = register_command({"plan", "Plan the KV cache of a model for a memory budget", &setup_plan, 10});

}  // namespace
}  // namespace kvattn::tools
