// Model geometry: presets, config.json parsing, memory sizes (see kv/model_config.h).
#include "kvattn/kv/model_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kvattn/core/error.h"

namespace kvattn {

const char* model_layer_kind_name(ModelLayerKind k) noexcept {
  switch (k) {
    case ModelLayerKind::full_attention: return "full_attention";
    case ModelLayerKind::sliding_window: return "sliding_window";
    case ModelLayerKind::mamba: return "mamba";
  }
  return "unknown";
}

int64_t ModelConfig::num_layers_of(ModelLayerKind k) const noexcept {
  return static_cast<int64_t>(std::count(layer_kinds.begin(), layer_kinds.end(), k));
}

namespace {
// Generous caps: they keep every product below int64 overflow and every vector small.
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxHeads = 1 << 16;
constexpr int64_t kMaxHeadDim = 1 << 16;
constexpr int64_t kMaxLen = int64_t{1} << 32;
}  // namespace

void ModelConfig::validate() const {
  auto in = [&](const char* field, int64_t v, int64_t lo, int64_t hi) {
    KVATTN_CHECK(v >= lo && v <= hi, "model '{}': {} = {} is out of range (valid: {}..{})", name, field, v,
                 lo, hi);
  };
  in("num_hidden_layers", num_hidden_layers, 1, kMaxLayers);
  KVATTN_CHECK(static_cast<int64_t>(layer_kinds.size()) == num_hidden_layers,
               "model '{}': {} layer kinds for {} layers; give one kind per layer", name, layer_kinds.size(),
               num_hidden_layers);
  const bool has_attn = num_layers_of(ModelLayerKind::mamba) < num_hidden_layers;
  if (has_attn) {
    in("num_attention_heads", num_attention_heads, 1, kMaxHeads);
    in("num_key_value_heads", num_key_value_heads, 1, kMaxHeads);
    in("head_dim", head_dim, 1, kMaxHeadDim);
    KVATTN_CHECK(num_attention_heads % num_key_value_heads == 0,
                 "model '{}': num_attention_heads ({}) is not a multiple of num_key_value_heads ({}); "
                 "grouped-query attention needs whole query groups",
                 name, num_attention_heads, num_key_value_heads);
  }
  in("max_model_len", max_model_len, 1, kMaxLen);
  KVATTN_CHECK(dtype == DType::f32 || dtype == DType::f16 || dtype == DType::bf16,
               "model '{}': dtype {} is not a model dtype (valid: float32, float16, bfloat16)", name,
               dtype_name(dtype));
  if (num_layers_of(ModelLayerKind::sliding_window) > 0) {
    in("sliding_window", sliding_window, 1, kMaxLen);
    in("swa_num_key_value_heads", swa_num_key_value_heads, 0, kMaxHeads);
    in("swa_head_dim", swa_head_dim, 0, kMaxHeadDim);
  }
  if (num_layers_of(ModelLayerKind::mamba) > 0) {
    KVATTN_CHECK(mamba.has_value(),
                 "model '{}' has Mamba layers but no Mamba geometry (mamba_n_heads, mamba_d_head, "
                 "mamba_d_state, ...)",
                 name);
    in("mamba num_heads", mamba->num_heads, 1, kMaxHeads);
    in("mamba head_dim", mamba->head_dim, 1, kMaxHeadDim);
    in("mamba d_state", mamba->d_state, 1, kMaxHeadDim);
    in("mamba n_groups", mamba->n_groups, 1, kMaxHeads);
    in("mamba conv_kernel", mamba->conv_kernel, 2, 64);
    in("mamba intermediate_size", mamba->intermediate_size, 1, int64_t{1} << 24);
  }
}

// ---------------------------------------------------------------------------------------
// Presets

namespace {

// Which layers are what.  kAlternating: even layers sliding window, odd full (Gemma 2);
// kHybridMamba: attention at the listed layers, Mamba2 elsewhere.
enum class LayerPattern { kAllFull, kAlternating, kHybridMamba };

struct Preset {
  std::string_view name;
  int64_t layers, q_heads, kv_heads, head_dim, max_model_len;
  LayerPattern pattern;
  int64_t sliding_window = 0;                 // kAlternating
  std::array<int64_t, 3> attention_at{};      // kHybridMamba: the attention layers
  bool mamba = false;                         // kHybridMamba: the Mamba2 geometry below
  const char* what = "";
};

// The presets, one row each (`kvattn plan --model NAME`).
constexpr MambaGeometry kBambaMamba{128, 64, 128, 1, 4, 2 * 4096, DType::bf16};
const Preset kPresets[] = {
    {"llama3-8b", 32, 32, 8, 128, 8192, LayerPattern::kAllFull, 0, {}, false, "Llama-3-8B: GQA 32/8, head 128"},
    {"gemma2-9b", 42, 16, 8, 256, 8192, LayerPattern::kAlternating, 4096, {}, false,
     "Gemma-2-9B: even layers sliding window (4096), odd layers full"},
    {"hybrid-mamba", 32, 32, 8, 128, 8192, LayerPattern::kHybridMamba, 0, {9, 18, 27}, true,
     "Bamba-9B-like: attention at 9, 18, 27, Mamba2 elsewhere"},
    {"tiny-llama", 4, 8, 2, 64, 4096, LayerPattern::kAllFull, 0, {}, false,
     "a Llama-shaped model small enough to serve a trace on a 2-core CPU in seconds (kvattn run's default)"},
    {"tiny-gemma2", 4, 8, 4, 64, 4096, LayerPattern::kAlternating, 512, {}, false,
     "a Gemma-2-shaped miniature: sliding window (512) and full layers alternating"},
};

}  // namespace

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

ModelConfig model_preset(std::string_view name) {
  const Preset* p = nullptr;
  for (const Preset& row : kPresets)
    if (row.name == name) p = &row;
  if (p == nullptr)
    throw InvalidArgument(fmt::format(
        "Unknown model {:?}. Valid presets: [{}]; or pass the path of a Hugging Face config.json.",
        std::string(name), fmt::join(model_preset_names(), ", ")));
  ModelConfig m;
  m.name = std::string(name);
  m.dtype = DType::bf16;
  m.num_hidden_layers = p->layers;
  m.num_attention_heads = p->q_heads;
  m.num_key_value_heads = p->kv_heads;
  m.head_dim = p->head_dim;
  m.max_model_len = p->max_model_len;
  for (int64_t i = 0; i < p->layers; ++i) {
    switch (p->pattern) {
      case LayerPattern::kAllFull: m.layer_kinds.push_back(ModelLayerKind::full_attention); break;
      case LayerPattern::kAlternating:
        m.layer_kinds.push_back(i % 2 == 0 ? ModelLayerKind::sliding_window : ModelLayerKind::full_attention);
        break;
      case LayerPattern::kHybridMamba: {
        const bool attn = std::find(p->attention_at.begin(), p->attention_at.end(), i) != p->attention_at.end();
        m.layer_kinds.push_back(attn ? ModelLayerKind::full_attention : ModelLayerKind::mamba);
        break;
      }
    }
  }
  if (p->sliding_window > 0) m.sliding_window = p->sliding_window;
  if (p->mamba) m.mamba = kBambaMamba;
  m.validate();
  return m;
}

// ---------------------------------------------------------------------------------------
// config.json

namespace {

using nlohmann::json;

struct Reader {
  const json& j;
  std::string source;

  bool has(const char* key) const { return j.contains(key) && !j.at(key).is_null(); }

  std::optional<int64_t> opt_int(const char* key, int64_t lo, int64_t hi) const {
    if (!has(key)) return std::nullopt;
    const json& v = j.at(key);
    int64_t out = 0;
    if (v.is_number_unsigned()) {
      const auto u = v.get<uint64_t>();
      KVATTN_CHECK(u <= static_cast<uint64_t>(hi), "{}: \"{}\" = {} is out of range (valid: {}..{})", source,
                   key, u, lo, hi);
      out = static_cast<int64_t>(u);
    } else if (v.is_number_integer()) {
      out = v.get<int64_t>();
    } else if (v.is_number_float() && std::isfinite(v.get<double>()) &&
               v.get<double>() == std::floor(v.get<double>()) && std::fabs(v.get<double>()) < 1e15) {
      out = static_cast<int64_t>(v.get<double>());
    } else {
      throw InvalidArgument(fmt::format("{}: \"{}\" must be an integer, got {}", source, key,
                                        v.dump(-1, ' ', true, json::error_handler_t::replace)));
    }
    KVATTN_CHECK(out >= lo && out <= hi, "{}: \"{}\" = {} is out of range (valid: {}..{})", source, key, out,
                 lo, hi);
    return out;
  }
  int64_t req_int(const char* key, int64_t lo, int64_t hi) const {
    auto v = opt_int(key, lo, hi);
    KVATTN_CHECK(v.has_value(), "{}: missing \"{}\"; a decoder config.json has it (e.g. \"{}\": 32)", source,
                 key, key);
    return *v;
  }
  std::optional<std::string> opt_str(const char* key) const {
    if (!has(key)) return std::nullopt;
    const json& v = j.at(key);
    KVATTN_CHECK(v.is_string(), "{}: \"{}\" must be a string, got {}", source, key,
                 v.dump(-1, ' ', true, json::error_handler_t::replace));
    return v.get<std::string>();
  }
  std::optional<bool> opt_bool(const char* key) const {
    if (!has(key)) return std::nullopt;
    const json& v = j.at(key);
    KVATTN_CHECK(v.is_boolean(), "{}: \"{}\" must be true or false", source, key);
    return v.get<bool>();
  }
  const json* opt_array(const char* key, size_t max_size) const {
    if (!has(key)) return nullptr;
    const json& v = j.at(key);
    KVATTN_CHECK(v.is_array(), "{}: \"{}\" must be a list", source, key);
    KVATTN_CHECK(v.size() <= max_size, "{}: \"{}\" has {} entries (at most {})", source, key, v.size(),
                 max_size);
    return &v;
  }
};

DType model_dtype_from(const std::string& s, const std::string& source) {
  if (s == "bfloat16" || s == "bf16") return DType::bf16;
  if (s == "float16" || s == "fp16" || s == "half") return DType::f16;
  if (s == "float32" || s == "fp32" || s == "float") return DType::f32;
  throw InvalidArgument(fmt::format(
      "{}: torch_dtype {:?} is not a model dtype; valid: bfloat16, float16, float32", source, s));
}

ModelConfig parse_json(const json& root, std::string_view source_view) {
  const std::string source(source_view);
  KVATTN_CHECK(root.is_object(), "{}: expected a JSON object at the top level, got {}", source,
               root.type_name());
  // Multimodal configs nest the language model.
  const json* cfg = &root;
  if (root.contains("text_config") && root.at("text_config").is_object()) cfg = &root.at("text_config");
  Reader r{*cfg, source};
  Reader top{root, source};

  ModelConfig m;
  m.name = source;
  m.num_hidden_layers = r.req_int("num_hidden_layers", 1, kMaxLayers);
  const auto heads = r.opt_int("num_attention_heads", 1, kMaxHeads);
  m.num_attention_heads = heads.value_or(0);
  m.num_key_value_heads = r.opt_int("num_key_value_heads", 1, kMaxHeads).value_or(m.num_attention_heads);
  if (auto hd = r.opt_int("head_dim", 1, kMaxHeadDim)) {
    m.head_dim = *hd;
  } else if (auto hidden = r.opt_int("hidden_size", 1, int64_t{1} << 24); hidden && heads) {
    KVATTN_CHECK(*hidden % *heads == 0,
                 "{}: hidden_size {} is not a multiple of num_attention_heads {}; set \"head_dim\"", source,
                 *hidden, *heads);
    m.head_dim = *hidden / *heads;
  }
  m.max_model_len = r.opt_int("max_position_embeddings", 1, kMaxLen).value_or(0);
  if (m.max_model_len == 0) m.max_model_len = top.opt_int("max_position_embeddings", 1, kMaxLen).value_or(0);
  KVATTN_CHECK(m.max_model_len > 0,
               "{}: missing \"max_position_embeddings\"; add it or pass --max-model-len", source);
  std::optional<std::string> dt = r.opt_str("torch_dtype");
  if (!dt) dt = r.opt_str("dtype");
  if (!dt) dt = top.opt_str("torch_dtype");
  m.dtype = dt ? model_dtype_from(*dt, source) : DType::bf16;

  const auto n = static_cast<size_t>(m.num_hidden_layers);
  m.layer_kinds.assign(n, ModelLayerKind::full_attention);
  const std::string model_type = r.opt_str("model_type").value_or(top.opt_str("model_type").value_or(""));

  // Sliding window: explicit layer_types, else model-specific patterns.
  const auto window = r.opt_int("sliding_window", 0, kMaxLen);
  const bool sliding_enabled = r.opt_bool("use_sliding_window").value_or(true);
  bool kinds_set = false;
  if (const json* lt = r.opt_array("layer_types", static_cast<size_t>(kMaxLayers))) {
    KVATTN_CHECK(lt->size() == n, "{}: \"layer_types\" has {} entries for {} layers", source, lt->size(), n);
    for (size_t i = 0; i < n; ++i) {
      const json& e = (*lt)[i];
      KVATTN_CHECK(e.is_string(), "{}: layer_types[{}] must be a string", source, i);
      const auto s = e.get<std::string>();
      if (s == "full_attention" || s == "attention")
        m.layer_kinds[i] = ModelLayerKind::full_attention;
      else if (s == "sliding_attention" || s == "sliding_window")
        m.layer_kinds[i] = ModelLayerKind::sliding_window;
      else if (s == "mamba" || s == "mamba2")
        m.layer_kinds[i] = ModelLayerKind::mamba;
      else
        throw Unsupported(fmt::format(
            "{}: layer_types[{}] = {:?} is not supported (valid: full_attention, sliding_attention, mamba)",
            source, i, s));
    }
    kinds_set = true;
  } else if (const json* lbt = r.opt_array("layers_block_type", static_cast<size_t>(kMaxLayers))) {
    KVATTN_CHECK(lbt->size() == n, "{}: \"layers_block_type\" has {} entries for {} layers", source,
                 lbt->size(), n);
    for (size_t i = 0; i < n; ++i) {
      const json& e = (*lbt)[i];
      KVATTN_CHECK(e.is_string(), "{}: layers_block_type[{}] must be a string", source, i);
      const auto s = e.get<std::string>();
      if (s == "attention")
        m.layer_kinds[i] = ModelLayerKind::full_attention;
      else if (s == "mamba")
        m.layer_kinds[i] = ModelLayerKind::mamba;
      else
        throw Unsupported(fmt::format("{}: layers_block_type[{}] = {:?} is not supported (valid: attention, mamba)",
                                      source, i, s));
    }
    kinds_set = true;
  } else if (const json* ali = r.opt_array("attn_layer_indices", static_cast<size_t>(kMaxLayers))) {
    m.layer_kinds.assign(n, ModelLayerKind::mamba);
    for (size_t i = 0; i < ali->size(); ++i) {
      const json& e = (*ali)[i];
      KVATTN_CHECK(e.is_number_integer() && e.get<int64_t>() >= 0 && e.get<int64_t>() < m.num_hidden_layers,
                   "{}: attn_layer_indices[{}] must be a layer index in 0..{}", source, i,
                   m.num_hidden_layers - 1);
      m.layer_kinds[static_cast<size_t>(e.get<int64_t>())] = ModelLayerKind::full_attention;
    }
    kinds_set = true;
  } else if (auto period = r.opt_int("attn_layer_period", 1, kMaxLayers)) {
    const int64_t offset = r.opt_int("attn_layer_offset", 0, kMaxLayers).value_or(0);
    for (size_t i = 0; i < n; ++i)
      m.layer_kinds[i] = static_cast<int64_t>(i) % *period == offset ? ModelLayerKind::full_attention
                                                                   : ModelLayerKind::mamba;
    kinds_set = true;
  }
  if (!kinds_set && window && *window > 0 && sliding_enabled) {
    if (model_type == "gemma2") {
      for (size_t i = 0; i < n; ++i)
        m.layer_kinds[i] = i % 2 == 0 ? ModelLayerKind::sliding_window : ModelLayerKind::full_attention;
    } else if (auto pattern = r.opt_int("sliding_window_pattern", 1, kMaxLayers)) {
      // Gemma-3 style: every pattern-th layer is global.
      for (size_t i = 0; i < n; ++i)
        m.layer_kinds[i] = (static_cast<int64_t>(i) + 1) % *pattern == 0 ? ModelLayerKind::full_attention
                                                                       : ModelLayerKind::sliding_window;
    } else {
      m.layer_kinds.assign(n, ModelLayerKind::sliding_window);  // Mistral style: every layer
    }
  }
  if (m.num_layers_of(ModelLayerKind::sliding_window) > 0) {
    KVATTN_CHECK(window && *window > 0,
                 "{}: layers are marked sliding_attention but \"sliding_window\" is missing or 0", source);
    m.sliding_window = *window;
    m.swa_num_key_value_heads = r.opt_int("swa_num_key_value_heads", 1, kMaxHeads).value_or(0);
    m.swa_head_dim = r.opt_int("swa_head_dim", 1, kMaxHeadDim).value_or(0);
  }
  if (m.num_layers_of(ModelLayerKind::mamba) > 0) {
    MambaGeometry g;
    const int64_t hidden = r.opt_int("hidden_size", 1, int64_t{1} << 24).value_or(0);
    g.num_heads = r.req_int("mamba_n_heads", 1, kMaxHeads);
    g.head_dim = r.req_int("mamba_d_head", 1, kMaxHeadDim);
    g.d_state = r.req_int("mamba_d_state", 1, kMaxHeadDim);
    g.n_groups = r.opt_int("mamba_n_groups", 1, kMaxHeads).value_or(1);
    g.conv_kernel = r.opt_int("mamba_d_conv", 2, 64).value_or(4);
    const int64_t expand = r.opt_int("mamba_expand", 1, 64).value_or(2);
    // vLLM's Mamba2 mixer: intermediate = expand * hidden_size (= heads * head_dim in practice).
    g.intermediate_size = hidden > 0 ? expand * hidden : g.num_heads * g.head_dim;
    g.dtype = m.dtype;
    m.mamba = g;
  }
  m.validate();
  return m;
}

}  // namespace

ModelConfig parse_hf_config(std::string_view json_text, std::string_view source) {
  json root;
  try {
    root = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/true,
                       /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    throw InvalidArgument(fmt::format("{}: not valid JSON ({}); pass a Hugging Face config.json", source,
                                      e.what()));
  }
  try {
    return parse_json(root, source);
  } catch (const Error&) {
    throw;
  } catch (const json::exception& e) {
    throw InvalidArgument(fmt::format("{}: unexpected config.json content ({})", source, e.what()));
  }
}

ModelConfig load_model_config(std::string_view model) {
  const auto presets = model_preset_names();
  if (std::find(presets.begin(), presets.end(), model) != presets.end()) return model_preset(model);
  std::filesystem::path p{std::string(model)};
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) p /= "config.json";
  if (!std::filesystem::is_regular_file(p, ec))
    throw InvalidArgument(fmt::format(
        "Unknown model {:?}: neither a preset (valid: [{}]) nor a readable config.json path", std::string(model),
        fmt::join(presets, ", ")));
  std::ifstream in(p, std::ios::binary);
  KVATTN_CHECK(in.good(), "cannot open {}; check the path and permissions", p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  KVATTN_CHECK(text.size() <= (size_t{64} << 20), "{}: {} bytes is too large for a config.json", p.string(),
               text.size());
  return parse_hf_config(text, p.string());
}

// ---------------------------------------------------------------------------------------
// Memory sizes

int64_t parse_memory_size(std::string_view text) {
  auto bad = [&](const char* why) {
    return InvalidArgument(fmt::format(
        "invalid memory size {:?} ({}); write a number with an optional unit, e.g. 80GiB, 16GB, 512MiB "
        "or 1073741824 (bytes)",
        std::string(text), why));
  };
  std::string s;
  for (char c : text)
    if (!std::isspace(static_cast<unsigned char>(c))) s.push_back(c);
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) throw bad("no number");
  const std::string num = s.substr(0, i);
  if (std::count(num.begin(), num.end(), '.') > 1 || num == ".") throw bad("malformed number");
  if (num.size() > 24) throw bad("too large");
  std::string unit = s.substr(i);
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return std::tolower(c); });
  double mult = 1;
  if (unit.empty() || unit == "b")
    mult = 1;
  else if (unit == "k" || unit == "kb")
    mult = 1e3;
  else if (unit == "m" || unit == "mb")
    mult = 1e6;
  else if (unit == "g" || unit == "gb")
    mult = 1e9;
  else if (unit == "t" || unit == "tb")
    mult = 1e12;
  else if (unit == "ki" || unit == "kib")
    mult = 1024.0;
  else if (unit == "mi" || unit == "mib")
    mult = 1024.0 * 1024;
  else if (unit == "gi" || unit == "gib")
    mult = 1024.0 * 1024 * 1024;
  else if (unit == "ti" || unit == "tib")
    mult = 1024.0 * 1024 * 1024 * 1024;
  else
    throw bad("unknown unit; valid: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB");
  if (num.find('.') == std::string::npos && mult == 1) {
    if (num.size() > 18) throw bad("too large");
    return std::stoll(num);
  }
  const double v = std::stod(num) * mult;
  if (!(v < 9.0e18)) throw bad("too large");
  return static_cast<int64_t>(std::llround(v));
}

std::string format_bytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes >= (int64_t{1} << 30)) return fmt::format("{:.2f} GiB", b / (1 << 30));
  if (bytes >= (int64_t{1} << 20)) return fmt::format("{:.2f} MiB", b / (1 << 20));
  if (bytes >= (int64_t{1} << 10)) return fmt::format("{:.2f} KiB", b / (1 << 10));
  return fmt::format("{} B", bytes);
}

}  // namespace kvattn

// ---------------------------------------------------------------------------------------
// Planning

#include "kvattn/kv/allocate.h"
#include "kvattn/kv/kv_cache_spec.h"

namespace kvattn {

DType resolve_kv_cache_dtype(KVCacheDType t, DType model_dtype) {
  if (is_nvfp4(t))
    throw Unsupported(fmt::format("--kv-cache-dtype {} has no kvattn kernel; use auto, bfloat16, float16, fp8, "
                                  "fp8_e4m3 or fp8_e5m2",
                                  kv_cache_dtype_name(t)));
  return kv_cache_storage_dtype(t, model_dtype);
}

namespace {

constexpr int64_t kDefaultBlockSize = 16;
constexpr int64_t kKernelBlockAlignment = 16;  // hybrid attention block sizes are multiples of it

int64_t cdiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string layer_name_of(const ModelConfig& m, size_t i) {
  return m.layer_kinds[i] == ModelLayerKind::mamba ? fmt::format("model.layers.{}.mamba", i)
                                                   : fmt::format("model.layers.{}.self_attn.attn", i);
}

}  // namespace

KVPlan plan_kv_cache(const ModelConfig& model_in, const PlanOptions& opt) {
  KVPlan plan;
  plan.model = model_in;
  ModelConfig& m = plan.model;
  if (opt.max_model_len) {
    KVATTN_CHECK(*opt.max_model_len > 0 && *opt.max_model_len <= kMaxLen,
                 "--max-model-len {} is out of range (valid: 1..{})", *opt.max_model_len, kMaxLen);
    m.max_model_len = *opt.max_model_len;
  }
  m.validate();
  KVATTN_CHECK(opt.gpu_memory > 0,
               "--gpu-memory must be a positive size (the memory available to the KV cache), got {} bytes; e.g. "
               "--gpu-memory 16GiB",
               opt.gpu_memory);
  KVATTN_CHECK(opt.max_num_batched_tokens > 0, "max_num_batched_tokens must be positive, got {}",
               opt.max_num_batched_tokens);
  plan.gpu_memory = opt.gpu_memory;
  plan.kv_cache_dtype = opt.kv_cache_dtype;
  plan.kv_dtype = resolve_kv_cache_dtype(opt.kv_cache_dtype, m.dtype);
  const KVQuantMode quant = get_kv_quant_mode(opt.kv_cache_dtype);

  const bool has_mamba = m.num_layers_of(ModelLayerKind::mamba) > 0;
  const bool has_attn = m.num_layers_of(ModelLayerKind::mamba) < m.num_hidden_layers;
  // Bytes one token costs in one attention layer (K and V).
  const int64_t attn_bytes_per_token = has_attn ? 2 * m.num_key_value_heads * m.head_dim * dtype_size(plan.kv_dtype) : 0;
  const int64_t mamba_page = has_mamba ? m.mamba->page_size_bytes() : 0;

  // Block size: the user's, else 16; a hybrid model needs an attention page that holds one
  // Mamba state (vLLM raises the attention block size and pads the Mamba page to match).
  int64_t bs = opt.block_size.value_or(kDefaultBlockSize);
  KVATTN_CHECK(bs > 0 && bs <= (int64_t{1} << 20), "--block-size {} is out of range (valid: 1..{})", bs,
               int64_t{1} << 20);
  if (has_mamba && has_attn) {
    const int64_t min_bs = kKernelBlockAlignment * cdiv(mamba_page, kKernelBlockAlignment * attn_bytes_per_token);
    if (!opt.block_size) {
      bs = std::max(bs, min_bs);
    } else {
      KVATTN_CHECK(bs * attn_bytes_per_token >= mamba_page,
                   "--block-size {} gives {}-byte attention pages, smaller than one Mamba state ({} bytes); this "
                   "hybrid model needs --block-size >= {} (or leave it unset to pick {})",
                   bs, bs * attn_bytes_per_token, mamba_page, cdiv(mamba_page, attn_bytes_per_token), min_bs);
    }
  }
  plan.block_size = bs;

  // Per-layer specs.
  const int64_t attn_page = bs * attn_bytes_per_token;
  for (size_t i = 0; i < m.layer_kinds.size(); ++i) {
    KVCacheSpecPtr spec;
    AttentionSpecOptions ao;
    ao.kv_quant_mode = quant;
    switch (m.layer_kinds[i]) {
      case ModelLayerKind::full_attention:
        spec = FullAttentionSpec(bs, m.num_key_value_heads, m.head_dim, plan.kv_dtype, ao);
        break;
      case ModelLayerKind::sliding_window:
        spec = SlidingWindowSpec(bs, m.swa_num_key_value_heads ? m.swa_num_key_value_heads : m.num_key_value_heads,
                                 m.swa_head_dim ? m.swa_head_dim : m.head_dim, plan.kv_dtype, m.sliding_window, ao);
        break;
      case ModelLayerKind::mamba: {
        const MambaGeometry& g = *m.mamba;
        MambaSpecOptions mo;
        if (has_attn && attn_page > mamba_page) mo.page_size_padded = attn_page;
        // One state per request ("none" cache mode): the block spans the whole sequence.
        spec = std::make_shared<MambaSpec>(m.max_model_len,
                                           std::vector<std::vector<int64_t>>{{g.conv_kernel - 1, g.conv_dim()},
                                                                             {g.num_heads, g.head_dim, g.d_state}},
                                           std::vector<DType>{g.dtype, g.dtype}, mo);
        break;
      }
    }
    plan.layer_specs.push_back({layer_name_of(m, i), spec});
  }

  // Layout: no backend declares a set here, so vLLM's default preference applies; the specs
  // then narrow it (resolve_kv_cache_layout).
  std::vector<KVCacheSpecPtr> specs;
  for (const auto& l : plan.layer_specs) specs.push_back(l.spec);
  const std::vector<LayoutList> default_pref = {
      LayoutList(kDefaultLayoutPreference.begin(), kDefaultLayoutPreference.end())};
  // The candidates: layouts resolve_kv_cache_layout accepts as the requested layout (the spec
  // rules of its step 3) and in which the planner can express the groups' page sizes
  // (validate_kv_cache_config: mixed page sizes need block-compact, and block-outer when there
  // are several groups).
  const std::vector<KVCacheGroupSpec> groups = get_kv_cache_groups(plan.layer_specs);
  LayoutList spec_ok;
  for (KVCacheLayout l : kDefaultLayoutPreference) {
    CacheConfig c;
    try {
      resolve_kv_cache_layout(c, default_pref, specs, l, std::nullopt);
      spec_ok.push_back(l);
      validate_kv_cache_config(l, groups);
      plan.layout_candidates.push_back(l);
    } catch (const InvalidArgument&) {
    }
  }
  KVATTN_CHECK(!plan.layout_candidates.empty(),
               "no KV cache layout can hold model {}: its specs allow {} but none of them can express its "
               "mixed page sizes across {} groups; use a uniform KV cache dtype / block size",
               m.name, format_layout_names(spec_ok), groups.size());
  const bool automatic = !opt.layout.has_value();
  auto is_candidate = [&](KVCacheLayout l) {
    return std::find(plan.layout_candidates.begin(), plan.layout_candidates.end(), l) != plan.layout_candidates.end();
  };
  if (!automatic) {
    const KVCacheLayout want = *opt.layout;
    if (!is_candidate(want))
      throw InvalidArgument(fmt::format(
          "--layout {} cannot hold the KV cache of {}: {}. Valid layouts for this model: {}; or use --layout auto.",
          layout_name(want), m.name,
          std::find(spec_ok.begin(), spec_ok.end(), want) == spec_ok.end()
              ? "its specs have mixed (heads, states, page) shapes, which need a block-compact layout"
              : "its groups have mixed page sizes, which need a block-compact, block-outermost layout",
          format_layout_names(plan.layout_candidates)));
    CacheConfig cache_config;
    plan.layout = resolve_kv_cache_layout(cache_config, default_pref, specs, want, std::nullopt);
    plan.layout_reason = fmt::format("requested with --layout {}; the model allows {}", layout_name(want),
                                     format_layout_names(plan.layout_candidates));
  } else {
    CacheConfig cache_config;
    const KVCacheLayout resolved =
        resolve_kv_cache_layout(cache_config, default_pref, specs, std::nullopt, std::nullopt);
    plan.layout_reason = fmt::format(
        "no backend declares supported layouts, so vLLM's default preference {} applies",
        format_layout_names(LayoutList(kDefaultLayoutPreference.begin(), kDefaultLayoutPreference.end())));
    if (spec_ok.size() < kDefaultLayoutPreference.size())
      plan.layout_reason += fmt::format(
          "; the specs have mixed (heads, states, page) shapes, which keeps only block-compact layouts {}",
          format_layout_names(spec_ok));
    if (is_candidate(resolved)) {
      plan.layout = resolved;
      plan.layout_reason += fmt::format("; the first candidate {} is chosen", layout_name(plan.layout));
    } else {
      // vLLM would stop here and ask for a block-outermost layout; the tool takes the first one
      // that works and says so.
      plan.layout = plan.layout_candidates.front();
      plan.layout_reason += fmt::format(
          "; the first candidate {} cannot express mixed page sizes across {} groups, so the first layout that "
          "can, {}, is chosen (vLLM: set VLLM_KV_CACHE_LAYOUT={})",
          layout_name(resolved), groups.size(), layout_name(plan.layout), layout_name(plan.layout));
    }
  }

  // Memory plan.
  KVCachePlanOptions po;
  po.limits.max_model_len = m.max_model_len;
  po.limits.max_num_batched_tokens = opt.max_num_batched_tokens;
  Result<KVCacheConfig> cfg = get_kv_cache_config(plan.layer_specs, plan.layout, opt.gpu_memory, po);
  if (!cfg.ok())
    throw InvalidArgument(fmt::format("model {} with --gpu-memory {} ({} bytes): {} (kvattn plan: raise "
                                      "--gpu-memory or lower --max-model-len.)",
                                      m.name, format_bytes(opt.gpu_memory), opt.gpu_memory, cfg.failure().message));
  plan.config = std::move(cfg).value();
  plan.config.kv_cache_layout = plan.layout;
  plan.bytes_per_block = get_kv_cache_bytes_per_block(plan.config.kv_cache_groups, plan.layout);
  plan.total_bytes = plan.config.kv_cache_tensors.empty() ? 0 : plan.config.kv_cache_tensors.front().size;
  for (const auto& g : plan.config.kv_cache_groups)
    plan.blocks_per_request += cdiv(g.kv_cache_spec->max_memory_usage_bytes(po.limits), g.kv_cache_spec->page_size_bytes());
  plan.max_concurrency = plan.blocks_per_request > 0 ? static_cast<double>(plan.config.num_blocks - 1) /
                                                           static_cast<double>(plan.blocks_per_request)
                                                     : 0.0;

  // Views, exactly as allocate_kv_cache would create them, over an address-less backing tensor.
  const Tensor raw = Tensor::from_blob(nullptr, Dims{plan.total_bytes}, DType::u8);
  std::map<std::string, PlannedLayerView> by_name;
  for (const KVCacheTensor& t : plan.config.kv_cache_tensors) {
    const auto gid = plan.config.group_index_of(t.layers.front());
    KVATTN_ASSERT(gid.has_value(), "layer {} is in no group", t.layers.front());
    const KVCacheSpecPtr spec = plan.config.layer_spec(t.layers.front());
    if (!spec->has_layer_views()) {
      for (const auto& n : t.layers) {
        PlannedLayerView v;
        v.layer_name = n;
        v.group_id = static_cast<int64_t>(*gid);
        v.spec_kind = kv_cache_spec_kind_name(spec->kind());
        v.raw = true;
        v.shape = Dims{plan.total_bytes};
        v.strides = Dims{1};
        v.page_size_bytes = spec->page_size_bytes();
        by_name[n] = v;
      }
      continue;
    }
    const auto views = create_kv_cache_views(raw, *spec, plan.config.num_blocks_of(t), plan.layout, t);
    for (size_t l = 0; l < views.size(); ++l) {
      PlannedLayerView v;
      v.layer_name = t.layers[l];
      v.group_id = static_cast<int64_t>(*gid);
      v.spec_kind = kv_cache_spec_kind_name(spec->kind());
      v.dtype = views[l].dtype();
      v.shape = views[l].shape();
      v.strides = views[l].strides();
      v.byte_offset = views[l].byte_offset();
      v.page_size_bytes = spec->page_size_bytes();
      by_name[t.layers[l]] = v;
    }
  }
  for (const auto& l : plan.layer_specs) {
    auto it = by_name.find(l.layer_name);
    KVATTN_ASSERT(it != by_name.end(), "layer {} got no view", l.layer_name);
    plan.views.push_back(it->second);
  }
  return plan;
}

}  // namespace kvattn
