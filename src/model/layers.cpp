#include "layers.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstring>
#include <numbers>
#include <set>

#include "cpu_math.h"
#include "kvattn/core/error.h"

namespace kvattn::model {

namespace {

struct ArchEntry {
  const char* name;
  ArchTraits (*traits)(const HfModelConfig&);
};

constexpr ArchEntry kArchitectures[] = {
    {"LlamaForCausalLM", llama_traits},   {"MistralForCausalLM", mistral_traits},
    {"Qwen2ForCausalLM", qwen2_traits},   {"Qwen3ForCausalLM", qwen3_traits},
    {"Gemma2ForCausalLM", gemma2_traits},
};

}  // namespace

std::vector<std::string> supported_architectures() {
  std::vector<std::string> names;
  for (const auto& a : kArchitectures) names.emplace_back(a.name);
  return names;
}

ArchTraits arch_traits(const HfModelConfig& c) {
  for (const auto& a : kArchitectures)
    if (c.architecture == a.name) return a.traits(c);
  throw Unsupported(fmt::format(
      "config.json architecture '{}' is not supported; kvattn runs {}. Check 'architectures' in config.json",
      c.architecture, fmt::join(supported_architectures(), ", ")));
}

ArchTraits base_traits(const HfModelConfig& c) {
  KVATTN_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0,
               "config.json head_dim {} must be a positive even number (rotary embedding rotates halves)", c.head_dim);
  KVATTN_CHECK(c.num_key_value_heads > 0 && c.num_attention_heads % c.num_key_value_heads == 0,
               "config.json num_attention_heads {} must be a multiple of num_key_value_heads {} (grouped-query "
               "attention)",
               c.num_attention_heads, c.num_key_value_heads);
  ArchTraits t;
  t.architecture = c.architecture;
  t.attn_scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  if (c.hidden_act == "silu" || c.hidden_act == "swish") {
    t.activation = Activation::silu;
  } else if (c.hidden_act == "gelu_pytorch_tanh" || c.hidden_act == "gelu_tanh") {
    t.activation = Activation::gelu_tanh;
  } else {
    throw Unsupported(fmt::format("config.json hidden_act '{}' is not supported; valid: silu, gelu_pytorch_tanh",
                                  c.hidden_act));
  }
  if (c.rope_scaling) {
    const std::string& type = c.rope_scaling->type;
    if (!(type.empty() || type == "default" || type == "llama3" || type == "linear"))
      throw Unsupported(fmt::format(
          "config.json rope_scaling type '{}' is not supported; kvattn implements 'default', 'linear' and 'llama3'",
          type));
  }
  return t;
}

std::vector<double> rope_inv_freq(const HfModelConfig& c) {
  const int64_t half = c.head_dim / 2;
  std::vector<double> f(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    f[static_cast<size_t>(i)] =
        1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(c.head_dim));
  if (c.rope_scaling && c.rope_scaling->type == "linear") {
    // Position interpolation: positions / factor, i.e. every frequency / factor.
    KVATTN_CHECK(c.rope_scaling->factor > 0, "config.json rope_scaling 'linear' needs factor > 0, got {}",
                 c.rope_scaling->factor);
    for (auto& v : f) v /= c.rope_scaling->factor;
  }
  if (c.rope_scaling && c.rope_scaling->type == "llama3") {
    // Llama 3's frequency rewrite (transformers' _compute_llama3_parameters): long wavelengths
    // are slowed by `factor`, short ones kept, the band between interpolated smoothly.
    const RopeScaling& s = *c.rope_scaling;
    KVATTN_CHECK(s.factor > 0 && s.original_max_position_embeddings > 0 && s.high_freq_factor > s.low_freq_factor,
                 "config.json rope_scaling 'llama3' needs factor > 0, original_max_position_embeddings > 0 and "
                 "high_freq_factor > low_freq_factor (got {}, {}, {} / {})",
                 s.factor, s.original_max_position_embeddings, s.high_freq_factor, s.low_freq_factor);
    const double old_ctx = static_cast<double>(s.original_max_position_embeddings);
    const double low_wavelen = old_ctx / s.low_freq_factor, high_wavelen = old_ctx / s.high_freq_factor;
    for (auto& v : f) {
      const double wavelen = 2 * std::numbers::pi / v;
      if (wavelen < high_wavelen) continue;
      if (wavelen > low_wavelen) {
        v /= s.factor;
      } else {
        const double smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        v = (1 - smooth) * v / s.factor + smooth * v;
      }
    }
  }
  return f;
}

// ---------------------------------------------------------------------------------------
// Weights

namespace {

class Loader {
 public:
  Loader(const WeightStore& w) : w_(w) {}

  // Appends tensor `name` (shape `shape`) converted to f32.
  void append(const std::string& name, std::initializer_list<int64_t> shape, std::vector<float>& dst) {
    used_.insert(name);
    if (!w_.has(name))
      throw InvalidArgument(fmt::format("the checkpoint has no tensor '{}', which this architecture needs; the "
                                        "model directory is incomplete or its config.json names another model",
                                        name));
    const Tensor& t = w_.get(name);
    const Dims want(shape);
    if (!(t.shape() == want))
      throw InvalidArgument(fmt::format("checkpoint tensor '{}' has shape {}, but config.json implies {}", name,
                                        t.shape().str(), want.str()));
    KVATTN_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::bf16 || t.dtype() == DType::f16,
                 "checkpoint tensor '{}' has dtype {}; valid: float32, bfloat16, float16", name, dtype_name(t.dtype()));
    const size_t off = dst.size();
    const auto n = static_cast<size_t>(t.numel());
    dst.resize(off + n);
    float* out = dst.data() + off;
    const Tensor c = t.contiguous();  // checkpoint tensors are contiguous: a view, no copy
    if (c.dtype() == DType::f32) {
      std::memcpy(out, c.data(), n * sizeof(float));
    } else {
      const auto* in = static_cast<const uint16_t*>(c.data());
      if (c.dtype() == DType::bf16) {
        for (size_t i = 0; i < n; ++i) out[i] = bf16_bits_to_f32(in[i]);
      } else {
        for (size_t i = 0; i < n; ++i) out[i] = f16_bits_to_f32(in[i]);
      }
    }
  }
  std::vector<float> get(const std::string& name, std::initializer_list<int64_t> shape) {
    std::vector<float> v;
    append(name, shape, v);
    return v;
  }

  // A checkpoint tensor the architecture does not read (an MLP bias, an o_proj bias, another
  // architecture's weights) would be silently ignored: Unsupported, naming it.  Rotary
  // inv_freq buffers and a saved copy of a tied lm_head are not weights.
  void check_all_used(const std::string& architecture, bool tied) const {
    for (const std::string& name : w_.names()) {
      if (used_.count(name) || name.ends_with("rotary_emb.inv_freq") || (tied && name == "lm_head.weight")) continue;
      throw Unsupported(fmt::format("checkpoint tensor '{}' is not part of {} as kvattn implements it (it would be "
                                    "ignored); the checkpoint has weights kvattn does not support (biases, "
                                    "another architecture's layers)",
                                    name, architecture));
    }
  }

 private:
  const WeightStore& w_;
  std::set<std::string, std::less<>> used_;
};

}  // namespace

ModelWeights load_weights(const ArchTraits& t, const HfModelConfig& c, const WeightStore& store) {
  Loader ld(store);
  const int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_attention_heads, Hk = c.num_key_value_heads,
                I = c.intermediate_size, V = c.vocab_size;
  ModelWeights w;
  w.embed = ld.get("model.embed_tokens.weight", {V, H});
  w.final_norm = ld.get("model.norm.weight", {H});
  if (!c.tie_word_embeddings) {
    if (!store.has("lm_head.weight"))
      throw InvalidArgument("the checkpoint has no tensor 'lm_head.weight' while config.json says "
                            "tie_word_embeddings = false; add the tensor or set tie_word_embeddings");
    w.lm_head = ld.get("lm_head.weight", {V, H});
  }
  w.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    const std::string p = fmt::format("model.layers.{}.", i);
    l.input_norm = ld.get(p + "input_layernorm.weight", {H});
    l.post_attn_norm = ld.get(p + "post_attention_layernorm.weight", {H});
    if (t.sandwich_norms) {
      l.pre_ff_norm = ld.get(p + "pre_feedforward_layernorm.weight", {H});
      l.post_ff_norm = ld.get(p + "post_feedforward_layernorm.weight", {H});
    }
    if (t.qk_norm) {
      l.q_norm = ld.get(p + "self_attn.q_norm.weight", {D});
      l.k_norm = ld.get(p + "self_attn.k_norm.weight", {D});
    }
    ld.append(p + "self_attn.q_proj.weight", {Hq * D, H}, l.qkv_w);
    ld.append(p + "self_attn.k_proj.weight", {Hk * D, H}, l.qkv_w);
    ld.append(p + "self_attn.v_proj.weight", {Hk * D, H}, l.qkv_w);
    if (t.qkv_bias) {
      ld.append(p + "self_attn.q_proj.bias", {Hq * D}, l.qkv_b);
      ld.append(p + "self_attn.k_proj.bias", {Hk * D}, l.qkv_b);
      ld.append(p + "self_attn.v_proj.bias", {Hk * D}, l.qkv_b);
    }
    l.o_w = ld.get(p + "self_attn.o_proj.weight", {H, Hq * D});
    ld.append(p + "mlp.gate_proj.weight", {I, H}, l.gate_up_w);
    ld.append(p + "mlp.up_proj.weight", {I, H}, l.gate_up_w);
    l.down_w = ld.get(p + "mlp.down_proj.weight", {H, I});
  }
  ld.check_all_used(c.architecture, c.tie_word_embeddings);
  return w;
}

// ---------------------------------------------------------------------------------------
// Forward

CpuTransformer::CpuTransformer(const HfModelConfig& config, ArchTraits traits, ModelWeights weights,
                               int64_t max_tokens, int64_t max_logit_rows)
    : cfg_(config),
      traits_(std::move(traits)),
      w_(std::move(weights)),
      H_(config.hidden_size),
      Hq_(config.num_attention_heads),
      Hk_(config.num_key_value_heads),
      D_(config.head_dim),
      I_(config.intermediate_size),
      V_(config.vocab_size),
      max_tokens_(max_tokens),
      max_logit_rows_(max_logit_rows),
      inv_freq_(rope_inv_freq(config)) {
  const auto T = static_cast<size_t>(max_tokens);
  x_.resize(T * H_);
  normed_.resize(T * H_);
  qkv_.resize(T * (Hq_ + 2 * Hk_) * D_);
  proj_.resize(T * H_);
  gate_up_.resize(T * 2 * I_);
  act_.resize(T * I_);
  cos_.resize(T * D_ / 2);
  sin_.resize(T * D_ / 2);
  gathered_.resize(static_cast<size_t>(max_logit_rows) * H_);
  q_ = Tensor::empty({max_tokens, Hq_, D_}, DType::f32);
  k_ = Tensor::empty({max_tokens, Hk_, D_}, DType::f32);
  v_ = Tensor::empty({max_tokens, Hk_, D_}, DType::f32);
  o_ = Tensor::empty({max_tokens, Hq_, D_}, DType::f32);
}

void CpuTransformer::attention_block(int64_t layer, int64_t T, AttentionRunner& attn) {
  const LayerWeights& l = w_.layers[static_cast<size_t>(layer)];
  const bool p1 = traits_.norm_plus_one;
  const double eps = cfg_.rms_norm_eps;
  const int64_t QKV = (Hq_ + 2 * Hk_) * D_, qd = Hq_ * D_, kd = Hk_ * D_;
  cpu::rms_norm(x_.data(), T, H_, H_, l.input_norm.data(), eps, p1, normed_.data());
  cpu::linear(normed_.data(), T, H_, H_, l.qkv_w.data(), QKV, l.qkv_b.empty() ? nullptr : l.qkv_b.data(), qkv_.data(),
              QKV);
  float* q = q_.data_ptr<float>();
  float* k = k_.data_ptr<float>();
  float* v = v_.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    const float* row = qkv_.data() + t * QKV;
    std::memcpy(q + t * qd, row, static_cast<size_t>(qd) * sizeof(float));
    std::memcpy(k + t * kd, row + qd, static_cast<size_t>(kd) * sizeof(float));
    std::memcpy(v + t * kd, row + qd + kd, static_cast<size_t>(kd) * sizeof(float));
  }
  if (traits_.qk_norm) {
    cpu::rms_norm(q, T * Hq_, D_, D_, l.q_norm.data(), eps, p1, q);
    cpu::rms_norm(k, T * Hk_, D_, D_, l.k_norm.data(), eps, p1, k);
  }
  cpu::rope_neox(q, T, Hq_, D_, qd, D_, cos_.data(), sin_.data());
  cpu::rope_neox(k, T, Hk_, D_, kd, D_, cos_.data(), sin_.data());
  attn.attend(layer, q_.narrow(0, 0, T), k_.narrow(0, 0, T), v_.narrow(0, 0, T), o_.narrow(0, 0, T));
  cpu::linear(o_.data_ptr<float>(), T, qd, qd, l.o_w.data(), H_, nullptr, proj_.data(), H_);
  if (traits_.sandwich_norms) cpu::rms_norm(proj_.data(), T, H_, H_, l.post_attn_norm.data(), eps, p1, proj_.data());
  cpu::add_inplace(x_.data(), proj_.data(), T * H_);
}

void CpuTransformer::mlp_block(int64_t layer, int64_t T) {
  const LayerWeights& l = w_.layers[static_cast<size_t>(layer)];
  const bool p1 = traits_.norm_plus_one;
  const double eps = cfg_.rms_norm_eps;
  const std::vector<float>& pre = traits_.sandwich_norms ? l.pre_ff_norm : l.post_attn_norm;
  cpu::rms_norm(x_.data(), T, H_, H_, pre.data(), eps, p1, normed_.data());
  cpu::linear(normed_.data(), T, H_, H_, l.gate_up_w.data(), 2 * I_, nullptr, gate_up_.data(), 2 * I_);
  if (traits_.activation == Activation::silu) {
    cpu::silu_mul(gate_up_.data(), T, I_, act_.data());
  } else {
    cpu::gelu_tanh_mul(gate_up_.data(), T, I_, act_.data());
  }
  cpu::linear(act_.data(), T, I_, I_, l.down_w.data(), H_, nullptr, proj_.data(), H_);
  if (traits_.sandwich_norms) cpu::rms_norm(proj_.data(), T, H_, H_, l.post_ff_norm.data(), eps, p1, proj_.data());
  cpu::add_inplace(x_.data(), proj_.data(), T * H_);
}

void CpuTransformer::forward(std::span<const int32_t> tokens, std::span<const int64_t> positions,
                             AttentionRunner& attn, std::span<const int64_t> logit_rows, float* logits) {
  const auto T = static_cast<int64_t>(tokens.size());
  KVATTN_ASSERT(T <= max_tokens_ && positions.size() == tokens.size() &&
                    static_cast<int64_t>(logit_rows.size()) <= max_logit_rows_,
                "CpuTransformer::forward: {} tokens / {} positions / {} logit rows exceed the buffers ({}, {})", T,
                positions.size(), logit_rows.size(), max_tokens_, max_logit_rows_);
  // Embedding (Gemma: times sqrt(hidden), rounded to the compute dtype as transformers does).
  for (int64_t t = 0; t < T; ++t)
    std::memcpy(x_.data() + t * H_, w_.embed.data() + static_cast<int64_t>(tokens[static_cast<size_t>(t)]) * H_,
                static_cast<size_t>(H_) * sizeof(float));
  if (traits_.scale_embeddings)
    cpu::scale_inplace(x_.data(), T * H_, static_cast<float>(std::sqrt(static_cast<double>(H_))));
  // Rotary angles of this step's positions, shared by every layer.
  const int64_t half = D_ / 2;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const double a = static_cast<double>(positions[static_cast<size_t>(t)]) * inv_freq_[static_cast<size_t>(i)];
      cos_[static_cast<size_t>(t * half + i)] = static_cast<float>(std::cos(a));
      sin_[static_cast<size_t>(t * half + i)] = static_cast<float>(std::sin(a));
    }
  for (int64_t layer = 0; layer < cfg_.num_hidden_layers; ++layer) {
    attention_block(layer, T, attn);
    mlp_block(layer, T);
  }
  const auto N = static_cast<int64_t>(logit_rows.size());
  for (int64_t n = 0; n < N; ++n)
    std::memcpy(gathered_.data() + n * H_, x_.data() + logit_rows[static_cast<size_t>(n)] * H_,
                static_cast<size_t>(H_) * sizeof(float));
  cpu::rms_norm(gathered_.data(), N, H_, H_, w_.final_norm.data(), cfg_.rms_norm_eps, traits_.norm_plus_one,
                gathered_.data());
  cpu::linear(gathered_.data(), N, H_, H_, w_.lm_head_ptr(), V_, nullptr, logits, V_);
  if (traits_.final_softcap) cpu::soft_cap(logits, N * V_, *traits_.final_softcap);
}

}  // namespace kvattn::model
