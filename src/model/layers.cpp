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

// Collects the checkpoint tensors an architecture reads, validating each, and remembers which
// names were read.
class Checker {
 public:
  explicit Checker(const WeightStore& w) : w_(w) {}

  Tensor get(const std::string& name, std::initializer_list<int64_t> shape) {
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
    return t.contiguous();  // checkpoint tensors are contiguous: a view, no copy
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

int64_t WeightEntry::numel() const {
  int64_t n = 0;
  for (const Tensor& p : parts) n += p.numel();
  return n;
}

std::vector<WeightEntry> plan_weights(const ArchTraits& t, const HfModelConfig& c, const WeightStore& store) {
  Checker ck(store);
  const int64_t H = c.hidden_size, D = c.head_dim, Hq = c.num_attention_heads, Hk = c.num_key_value_heads,
                I = c.intermediate_size, V = c.vocab_size;
  std::vector<WeightEntry> out;
  auto add = [&](int64_t layer, WeightId id, std::vector<Tensor> parts) {
    out.push_back(WeightEntry{layer, id, std::move(parts)});
  };
  add(-1, WeightId::embed, {ck.get("model.embed_tokens.weight", {V, H})});
  add(-1, WeightId::final_norm, {ck.get("model.norm.weight", {H})});
  if (!c.tie_word_embeddings) {
    if (!store.has("lm_head.weight"))
      throw InvalidArgument("the checkpoint has no tensor 'lm_head.weight' while config.json says "
                            "tie_word_embeddings = false; add the tensor or set tie_word_embeddings");
    add(-1, WeightId::lm_head, {ck.get("lm_head.weight", {V, H})});
  }
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    add(i, WeightId::input_norm, {ck.get(p + "input_layernorm.weight", {H})});
    add(i, WeightId::post_attn_norm, {ck.get(p + "post_attention_layernorm.weight", {H})});
    if (t.sandwich_norms) {
      add(i, WeightId::pre_ff_norm, {ck.get(p + "pre_feedforward_layernorm.weight", {H})});
      add(i, WeightId::post_ff_norm, {ck.get(p + "post_feedforward_layernorm.weight", {H})});
    }
    if (t.qk_norm) {
      add(i, WeightId::q_norm, {ck.get(p + "self_attn.q_norm.weight", {D})});
      add(i, WeightId::k_norm, {ck.get(p + "self_attn.k_norm.weight", {D})});
    }
    add(i, WeightId::qkv_w,
        {ck.get(p + "self_attn.q_proj.weight", {Hq * D, H}), ck.get(p + "self_attn.k_proj.weight", {Hk * D, H}),
         ck.get(p + "self_attn.v_proj.weight", {Hk * D, H})});
    if (t.qkv_bias)
      add(i, WeightId::qkv_b,
          {ck.get(p + "self_attn.q_proj.bias", {Hq * D}), ck.get(p + "self_attn.k_proj.bias", {Hk * D}),
           ck.get(p + "self_attn.v_proj.bias", {Hk * D})});
    add(i, WeightId::o_w, {ck.get(p + "self_attn.o_proj.weight", {H, Hq * D})});
    add(i, WeightId::gate_up_w, {ck.get(p + "mlp.gate_proj.weight", {I, H}), ck.get(p + "mlp.up_proj.weight", {I, H})});
    add(i, WeightId::down_w, {ck.get(p + "mlp.down_proj.weight", {H, I})});
  }
  ck.check_all_used(c.architecture, c.tie_word_embeddings);
  return out;
}

void convert_weight(const WeightEntry& e, DType to, void* dst) {
  auto* out = static_cast<char*>(dst);
  for (const Tensor& p : e.parts) {
    const auto n = static_cast<size_t>(p.numel());
    if (p.dtype() == to) {
      std::memcpy(out, p.data(), n * static_cast<size_t>(dtype_size(to)));
    } else {
      const auto* in16 = static_cast<const uint16_t*>(p.data());
      const auto* in32 = static_cast<const float*>(p.data());
      auto load = [&](size_t i) {
        return p.dtype() == DType::f32 ? in32[i] : p.dtype() == DType::bf16 ? bf16_bits_to_f32(in16[i])
                                                                            : f16_bits_to_f32(in16[i]);
      };
      if (to == DType::f32) {
        auto* o = reinterpret_cast<float*>(out);
        for (size_t i = 0; i < n; ++i) o[i] = load(i);
      } else if (to == DType::bf16) {
        auto* o = reinterpret_cast<uint16_t*>(out);
        for (size_t i = 0; i < n; ++i) o[i] = f32_to_bf16_bits(load(i));
      } else {
        KVATTN_CHECK(to == DType::f16, "convert_weight: compute dtype {} is not float32, bfloat16 or float16",
                     dtype_name(to));
        auto* o = reinterpret_cast<uint16_t*>(out);
        for (size_t i = 0; i < n; ++i) o[i] = f32_to_f16_bits(load(i));
      }
    }
    out += n * static_cast<size_t>(dtype_size(to));
  }
}

ModelWeights load_weights(const ArchTraits& t, const HfModelConfig& c, const WeightStore& store) {
  const std::vector<WeightEntry> entries = plan_weights(t, c, store);
  ModelWeights w;
  w.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (const WeightEntry& e : entries) {
    std::vector<float>* dst = nullptr;
    LayerWeights* l = e.layer >= 0 ? &w.layers[static_cast<size_t>(e.layer)] : nullptr;
    switch (e.id) {
      case WeightId::embed: dst = &w.embed; break;
      case WeightId::final_norm: dst = &w.final_norm; break;
      case WeightId::lm_head: dst = &w.lm_head; break;
      case WeightId::input_norm: dst = &l->input_norm; break;
      case WeightId::post_attn_norm: dst = &l->post_attn_norm; break;
      case WeightId::pre_ff_norm: dst = &l->pre_ff_norm; break;
      case WeightId::post_ff_norm: dst = &l->post_ff_norm; break;
      case WeightId::q_norm: dst = &l->q_norm; break;
      case WeightId::k_norm: dst = &l->k_norm; break;
      case WeightId::qkv_w: dst = &l->qkv_w; break;
      case WeightId::qkv_b: dst = &l->qkv_b; break;
      case WeightId::o_w: dst = &l->o_w; break;
      case WeightId::gate_up_w: dst = &l->gate_up_w; break;
      case WeightId::down_w: dst = &l->down_w; break;
    }
    dst->resize(static_cast<size_t>(e.numel()));
    convert_weight(e, DType::f32, dst->data());
  }
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
