// src/model/cuda/cuda_transformer.h — the forward pass of the decoder-only architectures on a
// CUDA device, in the compute dtype f32, bf16 or f16: the device counterpart of CpuTransformer
// (layers.h), with the same traits, block order and AttentionRunner interface.
//
// Weights are uploaded once, converted to the compute dtype on the host one fused tensor at a
// time (a staging buffer of the largest weight, never a whole-model host copy).  Activations
// and the residual stream are in the compute dtype; every device buffer is allocated at
// construction for max_tokens tokens and max_logit_rows logit rows, so a step allocates no
// device memory in the model layer.  Logits are computed in f32 (an f32-output GEMM) for the
// requested rows only and copied once to the caller's host buffer.
//
// This header has no CUDA includes: common code includes it.  Builds without CUDA link
// cuda_transformer_stub.cpp, whose entries throw Unsupported.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "kvattn/core/device.h"
#include "kvattn/core/dtype.h"
#include "model/layers.h"

namespace kvattn::model {

// cudaMemGetInfo of `device`: bytes free and in total (every process's allocations count).
struct DeviceMemoryInfo {
  int64_t free = 0;
  int64_t total = 0;
};
DeviceMemoryInfo device_memory_info(Device device);

class CudaTransformer {
 public:
  // Validates and uploads the weights (plan_weights' checks, before any device allocation),
  // allocates the activation buffers and the rotary cos/sin tables for positions
  // [0, max_positions).  `dtype`: f32, bf16 or f16.
  CudaTransformer(const HfModelConfig& config, ArchTraits traits, const WeightStore& weights, Device device,
                  DType dtype, int64_t max_tokens, int64_t max_logit_rows, int64_t max_positions);
  ~CudaTransformer();
  CudaTransformer(const CudaTransformer&) = delete;
  CudaTransformer& operator=(const CudaTransformer&) = delete;

  int64_t weight_bytes() const noexcept;      // device bytes of the uploaded weights
  int64_t activation_bytes() const noexcept;  // device bytes of the step buffers and rotary tables

  // One step over `tokens` (ids already validated) at `positions` (host arrays); the attention
  // receives device tensors in the compute dtype.  Writes the f32 logits of the tokens at
  // `logit_rows` into the host buffer logits[logit_rows.size(), vocab]; returns after the copy.
  void forward(std::span<const int32_t> tokens, std::span<const int64_t> positions, AttentionRunner& attn,
               std::span<const int64_t> logit_rows, float* logits);

 private:
  struct State;
  std::unique_ptr<State> s_;
};

}  // namespace kvattn::model
