// `kvattn plan`: the KV cache memory plan for a model — resolved layout and why, groups and
// specs, page sizes, every layer's [B, H, N, C] view, blocks that fit and max concurrency.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include <algorithm>

#include "command_registry.h"
#include "kvattn/core/error.h"
#include "kvattn/kv/model_config.h"

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
  std::string max_model_len;
  std::string max_num_batched_tokens = "2048";
  bool json = false;
};

std::optional<int64_t> parse_count(const std::string& flag, const std::string& text) {
  if (text.empty()) return std::nullopt;
  const bool digits = text.size() <= 12 && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!digits || std::stoll(text) <= 0)
    throw InvalidArgument(fmt::format("{} {:?} is not a positive integer; e.g. {} 16", flag, text, flag));
  return std::stoll(text);
}

std::string dims_str(const Dims& d) { return d.str(); }

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

int print_text(const KVPlan& p) {
  const ModelConfig& m = p.model;
  fmt::print("KV cache plan for {}\n\n", m.name);
  fmt::print("model      {} layers ({}), dtype {}, max_model_len {}\n", m.num_hidden_layers, layers_summary(m),
             dtype_name(m.dtype), m.max_model_len);
  if (m.num_layers_of(ModelLayerKind::mamba) < m.num_hidden_layers)
    fmt::print("attention  {} query heads / {} KV heads, head size {}{}\n", m.num_attention_heads,
               m.num_key_value_heads, m.head_dim,
               m.sliding_window ? fmt::format(", sliding window {}", m.sliding_window) : "");
  if (m.mamba)
    fmt::print("mamba      conv state [{}, {}], ssm state [{}, {}, {}], {} ({} bytes per state)\n",
               m.mamba->conv_kernel - 1, m.mamba->conv_dim(), m.mamba->num_heads, m.mamba->head_dim,
               m.mamba->d_state, dtype_name(m.mamba->dtype), m.mamba->page_size_bytes());
  fmt::print("kv cache   dtype {} (--kv-cache-dtype {}), block size {} tokens\n\n", dtype_name(p.kv_dtype),
             p.kv_cache_dtype, p.block_size);

  fmt::print("layout     {}\n  why: {}\n\n", layout_name(p.layout), p.layout_reason);

  fmt::print("groups ({})\n", p.config.kv_cache_groups.size());
  for (size_t g = 0; g < p.config.kv_cache_groups.size(); ++g) {
    const auto& grp = p.config.kv_cache_groups[g];
    fmt::print("  group {}: {} layers, page {} bytes, block size {}\n    spec {}\n", g, grp.layer_names.size(),
               grp.kv_cache_spec->page_size_bytes(), grp.kv_cache_spec->block_size(), grp.kv_cache_spec->repr());
  }
  fmt::print("\ntensors ({}), one backing allocation of {} bytes ({})\n", p.config.kv_cache_tensors.size(),
             p.total_bytes, format_bytes(p.total_bytes));
  for (size_t i = 0; i < p.config.kv_cache_tensors.size(); ++i) {
    const auto& t = p.config.kv_cache_tensors[i];
    fmt::print("  tensor {}: {} layers ({} .. {}), offset {}, layer_stride {}, block_stride {}\n", i,
               t.layers.size(), t.layers.front(), t.layers.back(), t.offset, t.layer_stride, t.block_stride);
  }

  // By group (stable, model order inside a group), so a group's identical layers compress to
  // one line; --json lists every layer.
  std::vector<PlannedLayerView> views = p.views;
  std::stable_sort(views.begin(), views.end(),
                   [](const PlannedLayerView& a, const PlannedLayerView& b) { return a.group_id < b.group_id; });
  fmt::print("\nlayer views by group ([B, H, N, C] elements; strides in elements; offset in bytes)\n");
  for (const ViewRun& r : compress(views)) {
    const PlannedLayerView& v = views[r.first];
    const std::string who = r.first == r.last
                                ? v.layer_name
                                : fmt::format("{} .. {} ({} layers)", v.layer_name, views[r.last].layer_name,
                                              r.last - r.first + 1);
    const std::string off = r.first == r.last ? fmt::format("{}", v.byte_offset)
                                              : fmt::format("{} + i*{}", v.byte_offset, r.offset_step);
    if (v.raw)
      fmt::print("  {}: group {}, {}: raw backing bytes {} (the layer lays out its own state; page {} bytes)\n", who,
                 v.group_id, v.spec_kind, dims_str(v.shape), v.page_size_bytes);
    else
      fmt::print("  {}: group {}, {}: shape {} strides {} {} offset {}\n", who, v.group_id, v.spec_kind,
                 dims_str(v.shape), dims_str(v.strides), dtype_name(v.dtype), off);
  }

  fmt::print("\nmemory     budget {} ({} bytes), {} bytes per block\n", format_bytes(p.gpu_memory), p.gpu_memory,
             p.bytes_per_block);
  fmt::print("blocks     {} fit ({} usable + the null block 0)\n", p.config.num_blocks, p.config.num_blocks - 1);
  fmt::print("requests   one {}-token request holds {} blocks; maximum concurrency {:.2f}x\n", m.max_model_len,
             p.blocks_per_request, p.max_concurrency);
  return 0;
}

int print_json(const KVPlan& p) {
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
  j["kv_cache_dtype"] = p.kv_cache_dtype;
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
  j["bytes_per_block"] = p.bytes_per_block;
  j["total_bytes"] = p.total_bytes;
  j["num_blocks"] = p.config.num_blocks;
  j["blocks_per_request"] = p.blocks_per_request;
  j["max_concurrency"] = p.max_concurrency;
  fmt::print("{}\n", j.dump(2));
  return 0;
}

std::function<int()> setup_plan(CLI::App& app) {
  auto args = std::make_shared<PlanArgs>();
  app.add_option("--model", args->model,
                 fmt::format("Model preset ({}) or path to a Hugging Face config.json",
                             fmt::join(model_preset_names(), ", ")));
  app.add_option("--block-size", args->block_size, "Tokens per KV cache block (default 16; hybrid: fitted)");
  app.add_option("--kv-cache-dtype", args->kv_cache_dtype,
                 fmt::format("KV cache dtype: {}", fmt::join(kv_cache_dtype_choices(), "|")));
  app.add_option("--layout", args->layout, "KV cache layout: auto or LBHNC|LBNHC|LHBNC|BLHNC|BLNHC|BHLNC|NHD|HND");
  app.add_option("--gpu-memory", args->gpu_memory,
                 "Memory available to the KV cache, e.g. 80GiB, 16GB, 512MiB or bytes");
  app.add_option("--max-model-len", args->max_model_len, "Override the model's maximum length");
  app.add_option("--max-num-batched-tokens", args->max_num_batched_tokens,
                 "Tokens in flight per step (sliding-window memory), default 2048");
  app.add_flag("--json", args->json, "Print the full plan as JSON (every layer)");
  return [args] {
    if (args->model.empty())
      throw InvalidArgument(fmt::format("--model is required: a preset ({}) or a config.json path",
                                        fmt::join(model_preset_names(), ", ")));
    if (args->gpu_memory.empty())
      throw InvalidArgument("--gpu-memory is required: the memory available to the KV cache, e.g. 16GiB");
    PlanOptions o;
    o.block_size = parse_count("--block-size", args->block_size);
    o.kv_cache_dtype = args->kv_cache_dtype;
    o.layout = args->layout;
    o.gpu_memory = parse_memory_size(args->gpu_memory);
    o.max_model_len = parse_count("--max-model-len", args->max_model_len);
    o.max_num_batched_tokens = parse_count("--max-num-batched-tokens", args->max_num_batched_tokens).value_or(2048);
    const KVPlan plan = plan_kv_cache(load_model_config(args->model), o);
    return args->json ? print_json(plan) : print_text(plan);
  };
}

const bool registered = register_command({"plan", "Plan the KV cache of a model for a memory budget", &setup_plan, 10});

}  // namespace
}  // namespace kvattn::tools
