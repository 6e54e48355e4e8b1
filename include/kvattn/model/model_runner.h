// kvattn/model/model_runner.h — runs a Hugging Face decoder-only model one scheduler step at a
// time, with its attention through kvattn's backend exactly as vLLM's FlashInfer backend is
// driven: KV cache plan from the model's real layer specs -> allocate_kv_cache -> per KV cache
// group an InputBatch, a BatchPreparer (CommonAttentionMetadata) and the backend's
// AttentionGroupBuilders -> each step build() -> per layer do_kv_cache_update + forward.
//
// The caller (a scheduler) owns the block pool: block ids are logical ids in
// [1, num_kv_blocks()) (0 is the null block).  With several KV cache groups (Gemma 2: full and
// sliding-window layers) every logical block maps to one physical block per group, so one
// block table serves all groups.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "kvattn/core/device.h"
#include "kvattn/core/dtype.h"
#include "kvattn/core/tensor.h"
#include "kvattn/kv/kv_cache_layout.h"

namespace kvattn::model {

struct ModelDir;  // model_dir.h

// One request's share of a step.
struct StepRequest {
  int64_t request_id = 0;
  std::span<const int32_t> token_ids;  // the tokens computed this step (non-empty)
  int64_t start_pos = 0;               // position of token_ids[0] (= tokens already in the KV cache)
  std::span<const int32_t> block_ids;  // the request's logical KV block ids, covering start_pos + token count
  bool wants_logits = false;           // last chunk of a prefill, or a decode
};

class ModelRunner {
 public:
  struct Options {
    Device device = Device::cpu();
    // Compute dtype: nullopt = "auto".  On CPU the compute is f32 ("auto" means f32);
    // bfloat16 / float16 compute on CPU is Unsupported.
    std::optional<DType> compute_dtype;
    std::string kv_cache_dtype = "auto";  // auto (= compute dtype), float16, bfloat16, fp8, fp8_e4m3, fp8_e5m2
    std::optional<KVCacheLayout> layout;  // nullopt = "auto" (the planner's choice)
    // Bytes for the KV cache; 0 = the default (CPU: enough for 8 requests of max_model_len,
    // at most 4 GiB, vLLM's CPU default KV space).
    int64_t kv_cache_memory = 0;
    double gpu_memory_utilization = 0.9;  // CUDA only (vLLM's meaning)
    int64_t max_model_len = 0;            // 0 = config.json's max_position_embeddings
    int64_t block_size = 16;
    int64_t max_num_seqs = 256;           // requests per step
    int64_t max_num_batched_tokens = 2048;  // tokens per step
    // CPU GEMM threads for the process's OpenBLAS (0 = its default: the machine's cores, or
    // OPENBLAS_NUM_THREADS).
    int num_threads = 0;
  };

  // Validates the options against the model, plans and allocates the KV cache, converts the
  // weights (the runner keeps its own f32 copy: `model` may be closed afterwards).
  // Unsupported for CUDA (not built yet) and for bf16/f16 compute on CPU.  Not thread-safe:
  // one step at a time.
  ModelRunner(const ModelDir& model, const Options& options);
  ~ModelRunner();
  ModelRunner(const ModelRunner&) = delete;
  ModelRunner& operator=(const ModelRunner&) = delete;

  int64_t num_kv_blocks() const;  // logical blocks, including the null block 0
  int64_t block_size() const;
  int64_t max_model_len() const;
  int64_t vocab_size() const;
  DType compute_dtype() const;
  DType kv_cache_dtype() const;
  KVCacheLayout layout() const;
  int64_t num_kv_cache_groups() const;

  // Runs one step.  Returns the logits [number of requests with wants_logits, vocab] f32 on the
  // host, in request order: a view of a buffer the runner owns, valid until the next call.
  // InvalidArgument (naming the request) for an empty or out-of-range token list, a token id
  // outside the vocabulary, a block id outside [1, num_kv_blocks()), too few blocks for the
  // sequence, more than max_num_seqs requests or max_num_batched_tokens tokens.
  Tensor execute(std::span<const StepRequest> reqs);

  // "auto" -> nullopt; "bfloat16"/"bf16", "float16"/"half"/"f16", "float32"/"float"/"f32".
  static std::optional<DType> parse_dtype_option(std::string_view name);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvattn::model
