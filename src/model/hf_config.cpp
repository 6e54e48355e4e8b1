// hf_config.cpp — config.json and generation_config.json with transformers' defaults.
#include "kvattn/model/hf_config.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kvattn/core/error.h"
#include "read_file.h"

namespace kvattn::model {
using nlohmann::json;

namespace {

constexpr int64_t kMaxLayers = 4096;  // far above any released model; bounds per-layer vectors

std::string clip(const std::string& s, size_t n = 80) {
  return s.size() <= n ? s : s.substr(0, n) + "...";
}

std::string read_text(const std::filesystem::path& p) { return detail::read_file(p); }

json parse_object(std::string_view text, const std::string& label) {
  json j;
  try {
    j = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    throw InvalidArgument(fmt::format("{}: not valid JSON ({})", label, e.what()));
  }
  if (!j.is_object())
    throw InvalidArgument(fmt::format("{}: must be a JSON object, got {}", label, j.type_name()));
  return j;
}

// Field readers: absent or null -> the default; wrong type -> InvalidArgument naming the field.
struct Reader {
  const json& j;
  const std::string& label;

  const json* find(const char* key) const {
    auto it = j.find(key);
    return it == j.end() || it->is_null() ? nullptr : &*it;
  }
  std::optional<int64_t> opt_int(const char* key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (v->is_number_unsigned() &&
        v->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      throw InvalidArgument(fmt::format("{}: {} = {} is out of range", label, key, clip(v->dump())));
    if (!v->is_number_integer())
      throw InvalidArgument(fmt::format("{}: {} must be an integer, got {}", label, key,
                                        clip(v->dump())));
    return v->get<int64_t>();
  }
  int64_t integer(const char* key, int64_t def) const { return opt_int(key).value_or(def); }
  std::optional<double> opt_num(const char* key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_number())
      throw InvalidArgument(fmt::format("{}: {} must be a number, got {}", label, key,
                                        clip(v->dump())));
    const double d = v->get<double>();
    if (!std::isfinite(d))
      throw InvalidArgument(fmt::format("{}: {} = {} is not finite", label, key, d));
    return d;
  }
  double number(const char* key, double def) const { return opt_num(key).value_or(def); }
  std::optional<bool> opt_bool(const char* key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_boolean())
      throw InvalidArgument(fmt::format("{}: {} must be true or false, got {}", label, key,
                                        clip(v->dump())));
    return v->get<bool>();
  }
  bool boolean(const char* key, bool def) const { return opt_bool(key).value_or(def); }
  std::optional<std::string> opt_str(const char* key) const {
    const json* v = find(key);
    if (!v) return std::nullopt;
    if (!v->is_string())
      throw InvalidArgument(fmt::format("{}: {} must be a string, got {}", label, key,
                                        clip(v->dump())));
    return v->get<std::string>();
  }
  // An int or a list of ints (eos_token_id).
  std::vector<int64_t> int_or_list(const char* key) const {
    const json* v = find(key);
    std::vector<int64_t> out;
    if (!v) return out;
    auto one = [&](const json& x) {
      if (!x.is_number_integer() ||
          (x.is_number_unsigned() && x.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) ||
          x.get<int64_t>() < 0)
        throw InvalidArgument(fmt::format("{}: {} must be a non-negative token id or a list of "
                                          "them, got {}",
                                          label, key, clip(v->dump())));
      out.push_back(x.get<int64_t>());
    };
    if (v->is_array()) {
      if (v->size() > 1024)
        throw InvalidArgument(fmt::format("{}: {} lists {} ids; at most 1024", label, key, v->size()));
      for (const json& x : *v) one(x);
    } else {
      one(*v);
    }
    return out;
  }
};

struct ArchDefaults {
  const char* architecture;
  const char* model_type;
  int64_t vocab, hidden, inter, layers, heads, kv_heads;  // kv_heads 0: = heads
  int64_t head_dim;                                       // 0: hidden / heads
  int64_t max_pos;
  double rms_eps;
  bool tie;
  int64_t bos, eos;  // -1: none
};

// transformers' configuration defaults (the values a config.json may omit).
constexpr ArchDefaults kArchs[] = {
    {"LlamaForCausalLM", "llama", 32000, 4096, 11008, 32, 32, 0, 0, 2048, 1e-6, false, 1, 2},
    {"MistralForCausalLM", "mistral", 32000, 4096, 14336, 32, 32, 8, 0, 4096 * 32, 1e-6, false, 1, 2},
    {"Qwen2ForCausalLM", "qwen2", 151936, 4096, 22016, 32, 32, 32, 0, 32768, 1e-6, false, -1, -1},
    {"Qwen3ForCausalLM", "qwen3", 151936, 4096, 22016, 32, 32, 32, 128, 32768, 1e-6, false, -1, -1},
    {"Gemma2ForCausalLM", "gemma2", 256000, 2304, 9216, 26, 8, 4, 256, 8192, 1e-6, true, 2, 1},
};

void check_positive(const std::string& label, const char* field, int64_t v, const char* hint) {
  if (v <= 0)
    throw InvalidArgument(fmt::format("{}: {} = {} must be positive; {}", label, field, v, hint));
}

}  // namespace

const std::vector<std::string>& HfModelConfig::supported_architectures() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (const auto& a : kArchs) v.emplace_back(a.architecture);
    return v;
  }();
  return names;
}

HfModelConfig parse_hf_config(std::string_view json_text, const std::string& label) {
  const json j = parse_object(json_text, label);
  const Reader r{j, label};
  HfModelConfig c;

  // ---- architecture ----
  const json* archs = r.find("architectures");
  if (!archs)
    throw InvalidArgument(fmt::format(
        "{}: no \"architectures\" field; kvattn needs one of {} (as save_pretrained writes it)",
        label, fmt::join(HfModelConfig::supported_architectures(), ", ")));
  if (!archs->is_array() || archs->size() != 1 || !(*archs)[0].is_string())
    throw InvalidArgument(fmt::format(
        "{}: \"architectures\" must be a list of exactly one name, got {}", label,
        clip(archs->dump())));
  c.architecture = (*archs)[0].get<std::string>();
  const ArchDefaults* d = nullptr;
  for (const auto& a : kArchs)
    if (c.architecture == a.architecture) d = &a;
  if (!d)
    throw Unsupported(fmt::format("{}: architecture '{}' is not supported; supported: {}", label,
                                  clip(c.architecture),
                                  fmt::join(HfModelConfig::supported_architectures(), ", ")));
  c.model_type = r.opt_str("model_type").value_or(d->model_type);
  if (c.model_type != d->model_type)
    throw InvalidArgument(fmt::format(
        "{}: model_type '{}' contradicts architecture {} (expected '{}')", label,
        clip(c.model_type), c.architecture, d->model_type));
  const std::string arch = d->model_type;

  // ---- sizes ----
  c.vocab_size = r.integer("vocab_size", d->vocab);
  c.hidden_size = r.integer("hidden_size", d->hidden);
  c.intermediate_size = r.integer("intermediate_size", d->inter);
  c.num_hidden_layers = r.integer("num_hidden_layers", d->layers);
  c.num_attention_heads = r.integer("num_attention_heads", d->heads);
  c.num_key_value_heads = r.integer("num_key_value_heads", d->kv_heads ? d->kv_heads : c.num_attention_heads);
  c.max_position_embeddings = r.integer("max_position_embeddings", d->max_pos);
  check_positive(label, "vocab_size", c.vocab_size, "the vocabulary needs at least one token");
  check_positive(label, "hidden_size", c.hidden_size, "set the model width");
  check_positive(label, "intermediate_size", c.intermediate_size, "set the MLP width");
  check_positive(label, "num_hidden_layers", c.num_hidden_layers, "a model has at least one layer");
  check_positive(label, "num_attention_heads", c.num_attention_heads, "set the query head count");
  check_positive(label, "num_key_value_heads", c.num_key_value_heads, "set the KV head count (GQA)");
  check_positive(label, "max_position_embeddings", c.max_position_embeddings, "set the context length");
  if (c.num_hidden_layers > kMaxLayers)
    throw InvalidArgument(fmt::format("{}: num_hidden_layers = {} exceeds the supported {}", label,
                                      c.num_hidden_layers, kMaxLayers));
  if (c.vocab_size > std::numeric_limits<int32_t>::max())
    throw InvalidArgument(fmt::format("{}: vocab_size = {} does not fit 32-bit token ids", label,
                                      c.vocab_size));
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    throw InvalidArgument(fmt::format(
        "{}: num_key_value_heads = {} does not divide num_attention_heads = {}; grouped-query "
        "attention needs a whole number of query heads per KV head (valid: a divisor of {})",
        label, c.num_key_value_heads, c.num_attention_heads, c.num_attention_heads));
  const std::optional<int64_t> hd = r.opt_int("head_dim");
  if (hd) {
    c.head_dim = *hd;
  } else if (d->head_dim) {
    c.head_dim = d->head_dim;
  } else {
    if (c.hidden_size % c.num_attention_heads != 0)
      throw InvalidArgument(fmt::format(
          "{}: no head_dim and hidden_size = {} is not a multiple of num_attention_heads = {}; "
          "set head_dim",
          label, c.hidden_size, c.num_attention_heads));
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  check_positive(label, "head_dim", c.head_dim, "set the attention head size");
  if (c.head_dim > 1024)
    throw InvalidArgument(fmt::format("{}: head_dim = {} exceeds the supported 1024", label, c.head_dim));

  // ---- numerics ----
  c.rms_norm_eps = r.number("rms_norm_eps", d->rms_eps);
  if (!(c.rms_norm_eps > 0))
    throw InvalidArgument(fmt::format("{}: rms_norm_eps = {} must be positive", label, c.rms_norm_eps));
  c.rope_theta = r.number("rope_theta", 10000.0);
  if (!(c.rope_theta > 0))
    throw InvalidArgument(fmt::format("{}: rope_theta = {} must be positive", label, c.rope_theta));
  c.tie_word_embeddings = r.boolean("tie_word_embeddings", d->tie);
  c.attention_bias = arch == "qwen2" ? true : r.boolean("attention_bias", false);
  if (r.boolean("mlp_bias", false))
    throw Unsupported(fmt::format("{}: mlp_bias = true is not supported (no released {} model uses "
                                  "it); set it to false",
                                  label, c.architecture));

  // ---- activation ----
  std::optional<std::string> act = r.opt_str("hidden_activation");
  if (!act || arch != "gemma2") act = r.opt_str("hidden_act");
  c.hidden_act = act.value_or(arch == "gemma2" ? "gelu_pytorch_tanh" : "silu");
  if (c.hidden_act != "silu" && c.hidden_act != "gelu_pytorch_tanh")
    throw Unsupported(fmt::format("{}: hidden_act '{}' is not supported; supported: silu, "
                                  "gelu_pytorch_tanh",
                                  label, clip(c.hidden_act)));

  // ---- dtype ----
  std::optional<std::string> dt = r.opt_str("torch_dtype");
  if (!dt) dt = r.opt_str("dtype");
  if (!dt) {
    c.torch_dtype = DType::f32;  // transformers' default when the config does not say
  } else if (*dt == "bfloat16") {
    c.torch_dtype = DType::bf16;
  } else if (*dt == "float16") {
    c.torch_dtype = DType::f16;
  } else if (*dt == "float32") {
    c.torch_dtype = DType::f32;
  } else {
    throw InvalidArgument(fmt::format("{}: torch_dtype '{}' is not one of bfloat16, float16, float32",
                                      label, clip(*dt)));
  }

  // ---- rope scaling ----
  if (const json* rs = r.find("rope_scaling")) {
    if (!rs->is_object())
      throw InvalidArgument(fmt::format("{}: rope_scaling must be an object or null, got {}", label,
                                        clip(rs->dump())));
    const std::string rl = label + ": rope_scaling";
    const Reader rr{*rs, rl};
    RopeScaling s;
    std::optional<std::string> type = rr.opt_str("rope_type");
    if (!type) type = rr.opt_str("type");
    if (!type)
      throw InvalidArgument(fmt::format("{}: needs \"rope_type\" (llama3, linear or default)", rl));
    s.type = *type;
    if (s.type != "llama3" && s.type != "linear" && s.type != "default")
      throw Unsupported(fmt::format("{}: rope_type '{}' is not supported; supported: llama3, "
                                    "linear, default",
                                    rl, clip(s.type)));
    s.factor = rr.number("factor", 1.0);
    if (!(s.factor > 0))
      throw InvalidArgument(fmt::format("{}: factor = {} must be positive", rl, s.factor));
    if (s.type == "llama3") {
      for (const char* f : {"factor", "low_freq_factor", "high_freq_factor",
                            "original_max_position_embeddings"})
        if (!rr.find(f))
          throw InvalidArgument(fmt::format("{}: type llama3 needs the field {}", rl, f));
      s.low_freq_factor = rr.number("low_freq_factor", 1.0);
      s.high_freq_factor = rr.number("high_freq_factor", 4.0);
      s.original_max_position_embeddings = rr.integer("original_max_position_embeddings", 0);
      if (!(s.low_freq_factor > 0) || !(s.high_freq_factor > s.low_freq_factor))
        throw InvalidArgument(fmt::format(
            "{}: needs 0 < low_freq_factor ({}) < high_freq_factor ({})", rl, s.low_freq_factor,
            s.high_freq_factor));
      check_positive(rl, "original_max_position_embeddings", s.original_max_position_embeddings,
                     "set the pre-training context length");
    }
    c.rope_scaling = s;
  }

  // ---- sliding window, per layer ----
  c.layer_is_sliding.assign(static_cast<size_t>(c.num_hidden_layers), false);
  const std::optional<int64_t> window = r.opt_int("sliding_window");
  if (window) check_positive(label, "sliding_window", *window, "use null for full attention");
  if (arch == "mistral") {
    c.sliding_window = window;
    if (window) c.layer_is_sliding.assign(c.layer_is_sliding.size(), true);
  } else if (arch == "qwen2" || arch == "qwen3") {
    if (r.boolean("use_sliding_window", false) && window) {
      c.sliding_window = window;
      const int64_t first = r.integer("max_window_layers", 28);
      for (int64_t i = 0; i < c.num_hidden_layers; ++i) c.layer_is_sliding[i] = i >= first;
    }
  } else if (arch == "gemma2") {
    c.sliding_window = window.value_or(4096);
    for (int64_t i = 0; i < c.num_hidden_layers; ++i) c.layer_is_sliding[i] = (i % 2) == 0;
    c.attn_logit_softcapping = r.opt_num("attn_logit_softcapping");
    c.final_logit_softcapping = r.opt_num("final_logit_softcapping");
    if (!j.contains("attn_logit_softcapping")) c.attn_logit_softcapping = 50.0;
    if (!j.contains("final_logit_softcapping")) c.final_logit_softcapping = 30.0;
    c.query_pre_attn_scalar = r.number("query_pre_attn_scalar", 256.0);
    if (!(*c.query_pre_attn_scalar > 0))
      throw InvalidArgument(fmt::format("{}: query_pre_attn_scalar = {} must be positive", label,
                                        *c.query_pre_attn_scalar));
    for (auto* cap : {&c.attn_logit_softcapping, &c.final_logit_softcapping})
      if (*cap && !(**cap > 0))
        throw InvalidArgument(fmt::format("{}: a logit soft cap must be positive or null, got {}",
                                          label, **cap));
  } else if (window) {
    // Llama has no sliding window; a set value would be silently ignored by transformers too.
  }
  // An explicit layer_types list (newer transformers) overrides the derived pattern.
  if (const json* lt = r.find("layer_types")) {
    if (!lt->is_array() || static_cast<int64_t>(lt->size()) != c.num_hidden_layers)
      throw InvalidArgument(fmt::format(
          "{}: layer_types must list one entry per layer ({}), got {}", label,
          c.num_hidden_layers, clip(lt->dump())));
    bool any = false;
    for (size_t i = 0; i < lt->size(); ++i) {
      const json& t = (*lt)[i];
      if (t == "sliding_attention") {
        c.layer_is_sliding[i] = true;
        any = true;
      } else if (t == "full_attention") {
        c.layer_is_sliding[i] = false;
      } else {
        throw InvalidArgument(fmt::format(
            "{}: layer_types[{}] = {} is not one of sliding_attention, full_attention", label, i,
            clip(t.dump())));
      }
    }
    if (any && !c.sliding_window) {
      if (!window)
        throw InvalidArgument(fmt::format(
            "{}: layer_types has sliding_attention layers but sliding_window is null", label));
      c.sliding_window = window;
    }
  }

  // ---- special tokens ----
  const auto bos = r.int_or_list("bos_token_id");
  if (bos.size() > 1)
    throw InvalidArgument(fmt::format("{}: bos_token_id must be one id, got {}", label, bos.size()));
  if (!bos.empty()) c.bos_token_id = bos[0];
  else if (!j.contains("bos_token_id") && d->bos >= 0) c.bos_token_id = d->bos;
  c.eos_token_ids = r.int_or_list("eos_token_id");
  if (c.eos_token_ids.empty() && !j.contains("eos_token_id") && d->eos >= 0)
    c.eos_token_ids = {d->eos};
  for (int64_t id : c.eos_token_ids)
    if (id >= c.vocab_size)
      throw InvalidArgument(fmt::format("{}: eos_token_id {} is outside the vocabulary [0, {})",
                                        label, id, c.vocab_size));
  if (c.bos_token_id && *c.bos_token_id >= c.vocab_size)
    throw InvalidArgument(fmt::format("{}: bos_token_id {} is outside the vocabulary [0, {})", label,
                                      *c.bos_token_id, c.vocab_size));
  return c;
}

HfModelConfig load_hf_config(const std::filesystem::path& config_json) {
  return parse_hf_config(read_text(config_json), config_json.string());
}

GenerationConfig parse_generation_config(std::string_view json_text, const std::string& label) {
  const json j = parse_object(json_text, label);
  const Reader r{j, label};
  GenerationConfig g;
  g.eos_token_ids = r.int_or_list("eos_token_id");
  const auto bos = r.int_or_list("bos_token_id");
  if (bos.size() > 1)
    throw InvalidArgument(fmt::format("{}: bos_token_id must be one id, got {}", label, bos.size()));
  if (!bos.empty()) g.bos_token_id = bos[0];
  const auto pad = r.int_or_list("pad_token_id");
  if (!pad.empty()) g.pad_token_id = pad[0];
  g.temperature = r.opt_num("temperature");
  g.top_p = r.opt_num("top_p");
  g.top_k = r.opt_int("top_k");
  g.repetition_penalty = r.opt_num("repetition_penalty");
  g.do_sample = r.opt_bool("do_sample");
  g.max_new_tokens = r.opt_int("max_new_tokens");
  if (g.temperature && *g.temperature < 0)
    throw InvalidArgument(fmt::format("{}: temperature = {} must be >= 0", label, *g.temperature));
  if (g.top_p && !(*g.top_p > 0 && *g.top_p <= 1))
    throw InvalidArgument(fmt::format("{}: top_p = {} must be in (0, 1]", label, *g.top_p));
  return g;
}

GenerationConfig load_generation_config(const std::filesystem::path& p) {
  if (!std::filesystem::exists(p)) return {};
  return parse_generation_config(read_text(p), p.string());
}

}  // namespace kvattn::model
