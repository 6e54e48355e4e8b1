// kvattn/attention/attention_impl.h — the per-layer forward object (vLLM's AttentionImpl,
// vllm-facts §4.5) and the per-layer state it reads (the AttentionLayer protocol: q/k/v scales).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvattn/attention/backend.h"
#include "kvattn/core/tensor.h"

namespace kvattn {

class AttentionMetadata;  // metadata_builder.h
class DcpCommunicator;    // communicator.h

// Constructor arguments of vLLM's AttentionImpl (FlashInferImpl.__init__).
struct AttentionImplParams {
  int64_t num_heads = 0;     // query heads of this rank
  int64_t head_size = 0;
  double scale = 0.0;        // softmax scale (usually 1/sqrt(head_size))
  int64_t num_kv_heads = 0;
  std::optional<std::vector<float>> alibi_slopes;  // rejected by the native backend
  std::optional<int64_t> sliding_window;           // tokens; window_left = sliding_window - 1
  KVCacheDType kv_cache_dtype = KVCacheDType::Auto;
  std::optional<double> logits_soft_cap;
  AttentionType attn_type = AttentionType::DECODER;
  std::optional<std::string> kv_sharing_target_layer_name;
  Tensor sinks;  // optional [num_heads] any float dtype (made f32 by process_weights_after_loading)
};

// The per-layer quantisation scales (vLLM's Attention layer attributes).
struct AttentionLayer {
  std::string name;
  Tensor q_scale;  // [1] f32
  Tensor k_scale;  // [1] f32
  Tensor v_scale;  // [1] f32
  double q_scale_float = 1.0;
  double k_scale_float = 1.0;
  double v_scale_float = 1.0;
  std::shared_ptr<AttentionImpl> impl;

  // Scales 1.0 (tensors allocated on `device`).
  static AttentionLayer make(std::string name, std::shared_ptr<AttentionImpl> impl, Device device = Device::cpu());
  void set_scales(double q, double k, double v);
};

// vLLM's static forward context: layer name -> layer, read by builders for per-layer
// hyperparameters.  Not thread-safe for mutation; read-only during steps.
class LayerRegistry {
 public:
  void add(AttentionLayer* layer);  // not owned; InvalidArgument on a duplicate name
  const AttentionLayer* find(std::string_view name) const;
  const AttentionLayer& get(std::string_view name) const;  // InvalidArgument naming known layers
  std::vector<std::string> names() const;

 private:
  std::map<std::string, AttentionLayer*, std::less<>> layers_;
};

class AttentionImpl {
 public:
  virtual ~AttentionImpl() = default;

  // vLLM class attributes.
  virtual bool can_return_lse_for_decode() const { return false; }
  virtual bool supports_dcp() const { return true; }
  virtual bool supports_pcp() const { return false; }
  virtual bool supports_quant_query_input() const { return false; }

  // Per-layer hyperparameters (PerLayerParameters source).
  virtual double scale() const = 0;
  virtual int64_t window_left() const = 0;  // -1 = no window
  virtual std::optional<double> logits_soft_cap() const = 0;
  virtual bool has_sinks() const = 0;
  virtual int64_t num_heads() const = 0;
  virtual int64_t num_kv_heads() const = 0;
  virtual int64_t head_size() const = 0;
  virtual const std::optional<std::string>& kv_sharing_target_layer_name() const = 0;

  // Convert weights (sinks to f32) once after loading.
  virtual void process_weights_after_loading(DType act_dtype) {}

  // DCP: the decode-context-parallel group this layer's rank belongs to (not owned).
  void set_dcp_group(DcpCommunicator* group);
  int64_t dcp_world_size() const noexcept { return dcp_world_size_; }
  int64_t dcp_rank() const noexcept { return dcp_rank_; }
  bool need_to_return_lse_for_decode() const { return dcp_world_size_ > 1 && can_return_lse_for_decode(); }

  // query [T, num_heads, head_size]; key/value [T, num_kv_heads, head_size] or undefined for a
  // KV-sharing layer; kv_cache: the layer's logical [B, H, N, 2*head_size] view; metadata null
  // = profiling run; output [T, num_heads, head_size] (written; returned for chaining).
  virtual Tensor forward(const AttentionLayer& layer, const Tensor& query, const Tensor& key,
                         const Tensor& value, const Tensor& kv_cache, const AttentionMetadata* metadata,
                         const Tensor& output, const Tensor& output_scale = Tensor(),
                         const Tensor& output_block_scale = Tensor()) = 0;

  // Writes this step's K/V into the cache (when the backend's forward does not).
  virtual void do_kv_cache_update(const AttentionLayer& layer, const Tensor& key, const Tensor& value,
                                  const Tensor& kv_cache, const Tensor& slot_mapping) = 0;

 protected:
  DcpCommunicator* dcp_group_ = nullptr;
  int64_t dcp_world_size_ = 1;
  int64_t dcp_rank_ = 0;
};

}  // namespace kvattn
