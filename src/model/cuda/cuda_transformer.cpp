#include "model/cuda/cuda_transformer.h"

#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kvattn/core/cuda_runtime_api.h"
#include "kvattn/core/error.h"
#include "kvattn/core/tensor.h"
#include "model/cuda/device_ops.h"

namespace kvattn::model {

namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw InternalError(fmt::format("{}: CUDA error {}", what, cudaGetErrorString(e)));
}

// A value as the compute dtype stores it (transformers rounds Gemma's embedding scale so).
float round_to(float v, DType t) {
  if (t == DType::bf16) return bf16_bits_to_f32(f32_to_bf16_bits(v));
  if (t == DType::f16) return f16_bits_to_f32(f32_to_f16_bits(v));
  return v;
}

struct DeviceLayer {
  Tensor input_norm, post_attn_norm, pre_ff_norm, post_ff_norm, q_norm, k_norm;
  Tensor qkv_w, qkv_b, o_w, gate_up_w, down_w;
};

}  // namespace

DeviceMemoryInfo device_memory_info(Device device) {
  cuda::set_device(device.index);
  size_t free = 0, total = 0;
  check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return {static_cast<int64_t>(free), static_cast<int64_t>(total)};
}

struct CudaTransformer::State {
  HfModelConfig cfg;
  ArchTraits traits;
  Device device;
  DType t = DType::bf16;
  int64_t H = 0, Hq = 0, Hk = 0, D = 0, I = 0, V = 0, max_tokens = 0, max_rows = 0;
  int64_t weight_bytes = 0, activation_bytes = 0;
  std::unique_ptr<gpu::Gemm> gemm;  // created on the device (its cuBLAS handle binds to it)
  // Weights in the compute dtype.
  Tensor embed, final_norm, lm_head;  // lm_head undefined when tied
  std::vector<DeviceLayer> layers;
  // Step buffers.
  Tensor x, normed, qkv, q, k, v, o, proj, gate_up, act, gathered, logits;  // logits: f32
  Tensor ids, positions, rows, cos, sin;

  // A step buffer (counted in activation_bytes).
  Tensor alloc(const Dims& shape, DType dt) {
    Tensor r = Tensor::empty(shape, dt, device);
    activation_bytes += r.numel() * dtype_size(dt);
    return r;
  }
  const void* lm() const { return lm_head.defined() ? lm_head.data() : embed.data(); }

  void upload_weights(const WeightStore& store) {
    const std::vector<WeightEntry> entries = plan_weights(traits, cfg, store);
    int64_t largest = 0;
    for (const WeightEntry& e : entries) largest = std::max(largest, e.numel());
    std::vector<char> staging(static_cast<size_t>(largest * dtype_size(t)));
    layers.resize(static_cast<size_t>(cfg.num_hidden_layers));
    for (const WeightEntry& e : entries) {
      convert_weight(e, t, staging.data());
      Tensor w = Tensor::empty({e.numel()}, t, device);
      cuda::memcpy(w.data(), staging.data(), static_cast<size_t>(e.numel() * dtype_size(t)));
      weight_bytes += e.numel() * dtype_size(t);
      DeviceLayer* l = e.layer >= 0 ? &layers[static_cast<size_t>(e.layer)] : nullptr;
      switch (e.id) {
        case WeightId::embed: embed = w; break;
        case WeightId::final_norm: final_norm = w; break;
        case WeightId::lm_head: lm_head = w; break;
        case WeightId::input_norm: l->input_norm = w; break;
        case WeightId::post_attn_norm: l->post_attn_norm = w; break;
        case WeightId::pre_ff_norm: l->pre_ff_norm = w; break;
        case WeightId::post_ff_norm: l->post_ff_norm = w; break;
        case WeightId::q_norm: l->q_norm = w; break;
        case WeightId::k_norm: l->k_norm = w; break;
        case WeightId::qkv_w: l->qkv_w = w; break;
        case WeightId::qkv_b: l->qkv_b = w; break;
        case WeightId::o_w: l->o_w = w; break;
        case WeightId::gate_up_w: l->gate_up_w = w; break;
        case WeightId::down_w: l->down_w = w; break;
      }
    }
  }

  // Rotary cos/sin of every position, computed in double and stored as f32.
  void rotary_tables(int64_t max_positions) {
    const std::vector<double> inv_freq = rope_inv_freq(cfg);
    const int64_t half = D / 2;
    std::vector<float> c(static_cast<size_t>(max_positions * half)), s(c.size());
    for (int64_t p = 0; p < max_positions; ++p)
      for (int64_t i = 0; i < half; ++i) {
        const double a = static_cast<double>(p) * inv_freq[static_cast<size_t>(i)];
        c[static_cast<size_t>(p * half + i)] = static_cast<float>(std::cos(a));
        s[static_cast<size_t>(p * half + i)] = static_cast<float>(std::sin(a));
      }
    cos = alloc({max_positions, half}, DType::f32);
    sin = alloc({max_positions, half}, DType::f32);
    cuda::memcpy(cos.data(), c.data(), c.size() * sizeof(float));
    cuda::memcpy(sin.data(), s.data(), s.size() * sizeof(float));
  }

  // Splits the fused [T, (Hq + 2 Hk) D] projection into contiguous q, k, v (the attention's
  // inputs), one strided device copy each.
  void split_qkv(int64_t T) {
    const auto es = static_cast<size_t>(dtype_size(t));
    const int64_t QKV = (Hq + 2 * Hk) * D, qd = Hq * D, kd = Hk * D;
    const auto* src = static_cast<const char*>(qkv.data());
    const size_t pitch = static_cast<size_t>(QKV) * es;
    check_cuda(cudaMemcpy2DAsync(q.data(), qd * es, src, pitch, qd * es, T, cudaMemcpyDeviceToDevice, nullptr),
               "split q");
    check_cuda(cudaMemcpy2DAsync(k.data(), kd * es, src + qd * es, pitch, kd * es, T, cudaMemcpyDeviceToDevice,
                                 nullptr),
               "split k");
    check_cuda(cudaMemcpy2DAsync(v.data(), kd * es, src + (qd + kd) * es, pitch, kd * es, T,
                                 cudaMemcpyDeviceToDevice, nullptr),
               "split v");
  }

  void attention_block(int64_t layer, int64_t T, AttentionRunner& attn) {
    const DeviceLayer& l = layers[static_cast<size_t>(layer)];
    const bool p1 = traits.norm_plus_one;
    const auto eps = static_cast<float>(cfg.rms_norm_eps);
    const int64_t QKV = (Hq + 2 * Hk) * D, qd = Hq * D, kd = Hk * D;
    gpu::rms_norm(x.data(), T, H, H, l.input_norm.data(), eps, p1, normed.data(), H, t);
    gemm->linear(normed.data(), T, H, H, l.qkv_w.data(), QKV, l.qkv_b.defined() ? l.qkv_b.data() : nullptr,
                qkv.data(), QKV, t, t);
    split_qkv(T);
    if (traits.qk_norm) {
      gpu::rms_norm(q.data(), T * Hq, D, D, l.q_norm.data(), eps, p1, q.data(), D, t);
      gpu::rms_norm(k.data(), T * Hk, D, D, l.k_norm.data(), eps, p1, k.data(), D, t);
    }
    const auto* pos = positions.data_ptr<int64_t>();
    gpu::rope_neox(q.data(), T, Hq, D, qd, D, pos, cos.data_ptr<float>(), sin.data_ptr<float>(), t);
    gpu::rope_neox(k.data(), T, Hk, D, kd, D, pos, cos.data_ptr<float>(), sin.data_ptr<float>(), t);
    attn.attend(layer, q.narrow(0, 0, T), k.narrow(0, 0, T), v.narrow(0, 0, T), o.narrow(0, 0, T));
    gemm->linear(o.data(), T, qd, qd, l.o_w.data(), H, nullptr, proj.data(), H, t, t);
    if (traits.sandwich_norms) gpu::rms_norm(proj.data(), T, H, H, l.post_attn_norm.data(), eps, p1, proj.data(), H, t);
    gpu::add_inplace(x.data(), proj.data(), T * H, t);
  }

  void mlp_block(int64_t layer, int64_t T) {
    const DeviceLayer& l = layers[static_cast<size_t>(layer)];
    const bool p1 = traits.norm_plus_one;
    const auto eps = static_cast<float>(cfg.rms_norm_eps);
    const Tensor& pre = traits.sandwich_norms ? l.pre_ff_norm : l.post_attn_norm;
    gpu::rms_norm(x.data(), T, H, H, pre.data(), eps, p1, normed.data(), H, t);
    gemm->linear(normed.data(), T, H, H, l.gate_up_w.data(), 2 * I, nullptr, gate_up.data(), 2 * I, t, t);
    gpu::act_mul(gate_up.data(), T, I,
                 traits.activation == Activation::silu ? gpu::GatedActivation::silu : gpu::GatedActivation::gelu_tanh,
                 act.data(), t);
    gemm->linear(act.data(), T, I, I, l.down_w.data(), H, nullptr, proj.data(), H, t, t);
    if (traits.sandwich_norms) gpu::rms_norm(proj.data(), T, H, H, l.post_ff_norm.data(), eps, p1, proj.data(), H, t);
    gpu::add_inplace(x.data(), proj.data(), T * H, t);
  }
};

CudaTransformer::CudaTransformer(const HfModelConfig& config, ArchTraits traits, const WeightStore& weights,
                                 Device device, DType dtype, int64_t max_tokens, int64_t max_logit_rows,
                                 int64_t max_positions)
    : s_(std::make_unique<State>()) {
  KVATTN_CHECK(device.is_cuda(), "CudaTransformer needs a CUDA device, got {}", device.str());
  KVATTN_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16,
               "CUDA model compute dtype {} is not supported; valid: float32, bfloat16, float16", dtype_name(dtype));
  KVATTN_CHECK(max_tokens > 0 && max_logit_rows > 0 && max_positions > 0,
               "CudaTransformer: max_tokens {}, max_logit_rows {} and max_positions {} must be positive", max_tokens,
               max_logit_rows, max_positions);
  cuda::set_device(device.index);
  State& s = *s_;
  s.cfg = config;
  s.traits = std::move(traits);
  s.device = device;
  s.t = dtype;
  s.H = config.hidden_size;
  s.Hq = config.num_attention_heads;
  s.Hk = config.num_key_value_heads;
  s.D = config.head_dim;
  s.I = config.intermediate_size;
  s.V = config.vocab_size;
  s.max_tokens = max_tokens;
  s.max_rows = max_logit_rows;
  s.gemm = std::make_unique<gpu::Gemm>();
  s.upload_weights(weights);
  const int64_t T = max_tokens, N = max_logit_rows;
  s.x = s.alloc({T, s.H}, dtype);
  s.normed = s.alloc({T, s.H}, dtype);
  s.qkv = s.alloc({T, (s.Hq + 2 * s.Hk) * s.D}, dtype);
  s.q = s.alloc({T, s.Hq, s.D}, dtype);
  s.k = s.alloc({T, s.Hk, s.D}, dtype);
  s.v = s.alloc({T, s.Hk, s.D}, dtype);
  s.o = s.alloc({T, s.Hq, s.D}, dtype);
  s.proj = s.alloc({T, s.H}, dtype);
  s.gate_up = s.alloc({T, 2 * s.I}, dtype);
  s.act = s.alloc({T, s.I}, dtype);
  s.gathered = s.alloc({N, s.H}, dtype);
  s.logits = s.alloc({N, s.V}, DType::f32);
  s.ids = s.alloc({T}, DType::i32);
  s.positions = s.alloc({T}, DType::i64);
  s.rows = s.alloc({N}, DType::i64);
  s.rotary_tables(max_positions);
  cuda::synchronize();
}

CudaTransformer::~CudaTransformer() = default;

int64_t CudaTransformer::weight_bytes() const noexcept { return s_->weight_bytes; }
int64_t CudaTransformer::activation_bytes() const noexcept { return s_->activation_bytes; }

void CudaTransformer::forward(std::span<const int32_t> tokens, std::span<const int64_t> positions,
                              AttentionRunner& attn, std::span<const int64_t> logit_rows, float* logits) {
  State& s = *s_;
  const auto T = static_cast<int64_t>(tokens.size());
  const auto N = static_cast<int64_t>(logit_rows.size());
  KVATTN_ASSERT(T <= s.max_tokens && positions.size() == tokens.size() && N <= s.max_rows,
                "CudaTransformer::forward: {} tokens / {} positions / {} logit rows exceed the buffers ({}, {})", T,
                positions.size(), N, s.max_tokens, s.max_rows);
  if (T == 0) return;
  cuda::set_device(s.device.index);
  const DType t = s.t;
  cuda::memcpy(s.ids.data(), tokens.data(), tokens.size_bytes());
  cuda::memcpy(s.positions.data(), positions.data(), positions.size_bytes());
  if (N > 0) cuda::memcpy(s.rows.data(), logit_rows.data(), logit_rows.size_bytes());
  // Embedding (Gemma: times sqrt(hidden) rounded to the compute dtype, as transformers does).
  const float scale =
      s.traits.scale_embeddings ? round_to(static_cast<float>(std::sqrt(static_cast<double>(s.H))), t) : 1.0f;
  gpu::embedding(s.ids.data_ptr<int32_t>(), T, s.embed.data(), s.H, scale, s.x.data(), t);
  for (int64_t layer = 0; layer < s.cfg.num_hidden_layers; ++layer) {
    s.attention_block(layer, T, attn);
    s.mlp_block(layer, T);
  }
  if (N == 0) {
    cuda::synchronize();
    return;
  }
  // Final norm and lm_head on the requested rows only; f32 logits.
  gpu::gather_rows(s.x.data(), s.H, s.rows.data_ptr<int64_t>(), N, s.gathered.data(), t);
  gpu::rms_norm(s.gathered.data(), N, s.H, s.H, s.final_norm.data(), static_cast<float>(s.cfg.rms_norm_eps),
                s.traits.norm_plus_one, s.gathered.data(), s.H, t);
  s.gemm->linear(s.gathered.data(), N, s.H, s.H, s.lm(), s.V, nullptr, s.logits.data(), s.V, t, DType::f32);
  if (s.traits.final_softcap)
    gpu::soft_cap(s.logits.data(), N * s.V, static_cast<float>(*s.traits.final_softcap), DType::f32);
  cuda::memcpy(logits, s.logits.data(), static_cast<size_t>(N * s.V) * sizeof(float));
}

}  // namespace kvattn::model
