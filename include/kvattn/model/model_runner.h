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
#include "kvattn/core/kv_cache_dtype.h"
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
    // Compute dtype: nullopt = "auto" (resolve_compute_dtype).  On CPU the compute is f32
    // ("auto" means f32); bfloat16 / float16 compute on CPU is Unsupported.  On CUDA f32, bf16
    // and f16; "auto" = the checkpoint's torch_dtype, float32 checkpoints computed in bf16.
    std::optional<DType> compute_dtype;
    KVCacheDType kv_cache_dtype = KVCacheDType::Auto;  // auto = the compute dtype
    std::optional<KVCacheLayout> layout;  // nullopt = "auto" (the planner's choice)
    // Bytes for the KV cache; 0 = the default (CPU: enough for 8 requests of max_model_len,
    // at most 4 GiB, vLLM's CPU default KV space; CUDA: from gpu_memory_utilization).
    int64_t kv_cache_memory = 0;
    // CUDA, vLLM's meaning: the fraction of the device's total memory this runner may fill
    // (weights + activations + KV cache), in (0, 1].  Memory other processes use counts
    // against it.  Checked on every device; used on CUDA when kv_cache_memory is 0.
    double gpu_memory_utilization = 0.9;
    int64_t max_model_len = 0;            // 0 = config.json's max_position_embeddings
    int64_t block_size = 16;
    int64_t max_num_seqs = 256;           // requests per step
    int64_t max_num_batched_tokens = 2048;  // tokens per step
    // CPU GEMM threads for the process's OpenBLAS (0 = its default: the machine's cores, or
    // OPENBLAS_NUM_THREADS).
    int num_threads = 0;
  };

  // Validates the options against the model, converts the weights (CPU: an f32 host copy;
  // CUDA: uploaded in the compute dtype; `model` may be closed afterwards), plans and allocates
  // the KV cache (CUDA: after a profiling step, see MemoryPlan).  Unsupported for bf16/f16
  // compute on CPU and for CUDA in a build without CUDA.  Not thread-safe: one step at a time.
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

  // Where the memory goes.  On CUDA: `total` device memory, `in_use_before` (other processes
  // and this process's earlier allocations and CUDA context, measured with cudaMemGetInfo
  // before loading), the uploaded `weights`, `activations` (everything else the profiling
  // step left in use: step buffers, rotary tables, cuBLAS and attention workspaces) and the
  // `kv_cache` allocation.  KV budget = total * utilization - in_use_before - weights -
  // activations unless kv_cache_memory was given.  On CPU: weights (f32) and kv_cache only.
  struct MemoryPlan {
    int64_t total = 0;
    double utilization = 0;  // 0 when kv_cache_memory decided the budget
    int64_t in_use_before = 0;
    int64_t weights = 0;
    int64_t activations = 0;
    int64_t kv_cache = 0;
  };
  const MemoryPlan& memory_plan() const;
  int64_t weight_bytes() const;
  int64_t activation_bytes() const;
  int64_t kv_cache_bytes() const;

  // Runs one step.  Returns the logits [number of requests with wants_logits, vocab] f32 on the
  // host, in request order: a view of a buffer the runner owns, valid until the next call.
  // InvalidArgument (naming the request) for an empty or out-of-range token list, a token id
  // outside the vocabulary, a block id outside [1, num_kv_blocks()), too few blocks for the
  // sequence, more than max_num_seqs requests or max_num_batched_tokens tokens.
  Tensor execute(std::span<const StepRequest> reqs);

  // "auto" -> nullopt; "bfloat16"/"bf16", "float16"/"half"/"f16", "float32"/"float"/"f32".
  static std::optional<DType> parse_dtype_option(std::string_view name);

  // The compute dtype of `requested` (nullopt = auto) for a checkpoint whose config.json says
  // `torch_dtype`: CPU -> f32 (bf16/f16 Unsupported); CUDA -> the request, or for auto the
  // checkpoint's dtype with float32 computed in bfloat16 (vLLM's rule).
  static DType resolve_compute_dtype(std::optional<DType> requested, DType torch_dtype, Device device);

  // InvalidArgument naming the value unless 0 < utilization <= 1.
  static void check_gpu_memory_utilization(double utilization);

  // The CUDA KV cache budget of a MemoryPlan (its kv_cache ignored): total * utilization -
  // in_use_before - weights - activations; InvalidArgument with every figure when <= 0.
  static int64_t gpu_kv_cache_budget(const MemoryPlan& m);

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvattn::model
