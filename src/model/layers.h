// src/model/layers.h — the shared building blocks of the decoder-only architectures and the
// CPU forward pass over them.
//
// An architecture is a set of traits (ArchTraits): which weights exist (q/k/v bias, per-head
// q/k norms, Gemma 2's post-attention / pre- and post-feed-forward norms), how norms weigh
// (w or 1 + w), the activation, the softmax scale, the soft caps and the embedding scale.
// architectures/<name>.cpp derives them from the config (a diff of what differs); this file
// loads the weights for them and runs the blocks: embedding -> per layer [norm, q/k/v
// projection (+ bias), q/k norm, rotary embedding, attention (through the caller's
// AttentionRunner: kvattn's backend), o projection, residual, norm, gated MLP, residual] ->
// final norm -> lm_head (tied or not) -> final soft cap.
//
// CpuTransformer computes in f32 on the host: checkpoint tensors (bf16/f16/f32) are converted
// once at load; every activation buffer is sized at construction for max_num_batched_tokens
// tokens.  The CUDA forward over the same traits and weight list is cuda/cuda_transformer.h.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kvattn/core/tensor.h"
#include "kvattn/model/hf_config.h"
#include "kvattn/model/safetensors.h"

namespace kvattn::model {

enum class Activation { silu, gelu_tanh };

struct ArchTraits {
  std::string architecture;            // the config's architectures[0]
  bool qkv_bias = false;               // q/k/v projections carry a bias (Qwen2)
  bool qk_norm = false;                // per-head RMSNorm of q and k before RoPE (Qwen3)
  bool sandwich_norms = false;         // Gemma 2: norms after attention and around the MLP
  bool norm_plus_one = false;          // Gemma: RMSNorm weight is (1 + w)
  bool scale_embeddings = false;       // Gemma: embeddings times sqrt(hidden_size)
  Activation activation = Activation::silu;
  double attn_scale = 0;               // softmax scale
  std::optional<double> attn_softcap;  // attention logit soft cap
  std::optional<double> final_softcap; // final logit soft cap
};

// Per-architecture trait functions (architectures/*.cpp).  Each validates what its
// architecture requires and throws Unsupported for a feature kvattn does not implement.
ArchTraits llama_traits(const HfModelConfig& c);
ArchTraits mistral_traits(const HfModelConfig& c);
ArchTraits qwen2_traits(const HfModelConfig& c);
ArchTraits qwen3_traits(const HfModelConfig& c);
ArchTraits gemma2_traits(const HfModelConfig& c);

// Dispatch on config.architecture; Unsupported listing the known architectures otherwise.
ArchTraits arch_traits(const HfModelConfig& c);
std::vector<std::string> supported_architectures();

// The Llama-family defaults every architecture starts from: silu, scale 1/sqrt(head_dim),
// rope scaling none/default/llama3 (others Unsupported).
ArchTraits base_traits(const HfModelConfig& c);

// Rotary inverse frequencies [head_dim / 2] (double), with Llama 3's 'llama3' rewrite when the
// config asks for it.
std::vector<double> rope_inv_freq(const HfModelConfig& c);

struct LayerWeights {
  std::vector<float> input_norm;       // [H]
  std::vector<float> post_attn_norm;   // [H] (Llama: before the MLP; Gemma 2: after attention)
  std::vector<float> pre_ff_norm;      // [H] Gemma 2
  std::vector<float> post_ff_norm;     // [H] Gemma 2
  std::vector<float> q_norm, k_norm;   // [D] Qwen3
  std::vector<float> qkv_w;            // [(Hq + 2 Hk) D, H] q, k, v rows fused
  std::vector<float> qkv_b;            // [(Hq + 2 Hk) D] or empty
  std::vector<float> o_w;              // [H, Hq D]
  std::vector<float> gate_up_w;        // [2 I, H] gate rows then up rows
  std::vector<float> down_w;           // [H, I]
};

struct ModelWeights {
  std::vector<float> embed;            // [V, H]
  std::vector<LayerWeights> layers;
  std::vector<float> final_norm;       // [H]
  std::vector<float> lm_head;          // [V, H]; empty when tied to embed
  const float* lm_head_ptr() const { return lm_head.empty() ? embed.data() : lm_head.data(); }
};

// The weights an architecture reads, shared by the CPU and CUDA loaders: `layer` (-1 for the
// model-level ones), which weight, and the checkpoint tensors (views of the mapping, nothing
// copied) whose rows are concatenated into it — q, k, v rows for the fused QKV projection,
// gate then up rows for the fused gate-up projection, one tensor otherwise.
enum class WeightId {
  embed, final_norm, lm_head,
  input_norm, post_attn_norm, pre_ff_norm, post_ff_norm, q_norm, k_norm,
  qkv_w, qkv_b, o_w, gate_up_w, down_w,
};
struct WeightEntry {
  int64_t layer = -1;
  WeightId id = WeightId::embed;
  std::vector<Tensor> parts;
  int64_t numel() const;  // of the fused weight
};

// Validates the checkpoint against the architecture before anything is converted: a missing
// tensor, a shape that contradicts config.json or a dtype other than f32/bf16/f16 is an
// InvalidArgument naming the tensor; a tensor the architecture does not read is Unsupported
// naming it.  Returns the weights in load order.
std::vector<WeightEntry> plan_weights(const ArchTraits& t, const HfModelConfig& c, const WeightStore& w);

// Writes the fused weight `e` converted to `to` (f32, bf16 or f16; round to nearest even) to
// `dst` (e.numel() elements of `to`, host memory).
void convert_weight(const WeightEntry& e, DType to, void* dst);

// Reads and converts every tensor the architecture needs to f32 host arrays (plan_weights'
// checks, then convert_weight).
ModelWeights load_weights(const ArchTraits& t, const HfModelConfig& c, const WeightStore& w);

// The attention of one layer, provided by the model runner: q [T, Hq, D], k/v [T, Hk, D],
// out [T, Hq, D], contiguous tensors on the runner's device in the compute dtype (the CPU
// forward: f32 host tensors; the CUDA forward: device tensors in f32, bf16 or f16), tokens in
// the step's batch order.
class AttentionRunner {
 public:
  virtual ~AttentionRunner() = default;
  virtual void attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out) = 0;
};

class CpuTransformer {
 public:
  CpuTransformer(const HfModelConfig& config, ArchTraits traits, ModelWeights weights, int64_t max_tokens,
                 int64_t max_logit_rows);

  const ArchTraits& traits() const noexcept { return traits_; }
  int64_t max_tokens() const noexcept { return max_tokens_; }

  // One step over `tokens` (ids already validated) at `positions`; writes the logits of the
  // tokens at `logit_rows` (indices into tokens) into logits[logit_rows.size(), vocab].
  void forward(std::span<const int32_t> tokens, std::span<const int64_t> positions, AttentionRunner& attn,
               std::span<const int64_t> logit_rows, float* logits);

 private:
  void attention_block(int64_t layer, int64_t T, AttentionRunner& attn);
  void mlp_block(int64_t layer, int64_t T);

  HfModelConfig cfg_;
  ArchTraits traits_;
  ModelWeights w_;
  int64_t H_, Hq_, Hk_, D_, I_, V_, max_tokens_, max_logit_rows_;
  std::vector<double> inv_freq_;
  // Activation buffers, [max_tokens, ...] f32.
  std::vector<float> x_, normed_, qkv_, attn_out_, proj_, gate_up_, act_, cos_, sin_, gathered_;
  Tensor q_, k_, v_, o_;  // [max_tokens, heads, D] views the AttentionRunner receives (narrowed)
};

}  // namespace kvattn::model
