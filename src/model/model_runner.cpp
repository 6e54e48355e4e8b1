#include "kvattn/model/model_runner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "cpu_math.h"
#include "kvattn/attention/attention_group_builders.h"
#include "kvattn/attention/attention_impl.h"
#include "kvattn/attention/backend_registry.h"
#include "kvattn/batch/batch_preparer.h"
#include "kvattn/batch/input_batch.h"
#include "kvattn/core/error.h"
#include "kvattn/kv/allocate.h"
#include "kvattn/kv/attention_group.h"
#include "kvattn/kv/block_size.h"
#include "kvattn/kv/model_config.h"
#include "kvattn/model/model_dir.h"
#include "kvattn/core/cuda_runtime_api.h"
#include "layers.h"
#include "model/cuda/cuda_transformer.h"

namespace kvattn::model {

namespace {

// Physical block of logical block `b` in KV cache group `g` of `G`: every group gets its own
// disjoint id (groups overlay the same memory, so they never share a block); 0 stays null.
inline int32_t physical_block(int32_t b, int32_t g, int32_t G) { return b == 0 ? 0 : 1 + (b - 1) * G + g; }

constexpr int64_t kCpuDefaultKvMax = 4LL << 30;  // vLLM's default CPU KV cache space
constexpr int64_t kCpuDefaultRequests = 8;

}  // namespace

std::optional<DType> ModelRunner::parse_dtype_option(std::string_view n) {
  if (n == "auto") return std::nullopt;
  if (n == "bfloat16" || n == "bf16") return DType::bf16;
  if (n == "float16" || n == "half" || n == "f16") return DType::f16;
  if (n == "float32" || n == "float" || n == "f32") return DType::f32;
  throw InvalidArgument(fmt::format("--dtype '{}' is not a compute dtype; valid: auto, bfloat16, float16, float32", n));
}

DType ModelRunner::resolve_compute_dtype(std::optional<DType> requested, DType torch_dtype, Device device) {
  if (!device.is_cuda()) {
    if (requested && *requested != DType::f32)
      throw Unsupported(fmt::format("--dtype {}: on CPU kvattn computes models in float32 only; use --dtype float32 "
                                    "or auto (bf16/f16 checkpoints are converted to f32 at load)",
                                    dtype_name(*requested)));
    return DType::f32;
  }
  if (requested) {
    KVATTN_CHECK(*requested == DType::f32 || *requested == DType::bf16 || *requested == DType::f16,
                 "--dtype {} is not a compute dtype; valid: auto, bfloat16, float16, float32", dtype_name(*requested));
    return *requested;
  }
  // vLLM's "auto": the checkpoint's dtype, except that float32 checkpoints run in bfloat16.
  return torch_dtype == DType::f32 ? DType::bf16 : torch_dtype;
}

void ModelRunner::check_gpu_memory_utilization(double u) {
  KVATTN_CHECK(u > 0 && u <= 1,
               "--gpu-memory-utilization {} is outside (0, 1]; it is the fraction of the device's total memory "
               "kvattn may use (weights, activations and KV cache), e.g. 0.9",
               u);
}

int64_t ModelRunner::gpu_kv_cache_budget(const MemoryPlan& m) {
  const auto allowed = static_cast<int64_t>(static_cast<double>(m.total) * m.utilization);
  const int64_t budget = allowed - m.in_use_before - m.weights - m.activations;
  KVATTN_CHECK(budget > 0,
               "no device memory is left for the KV cache: {} bytes total x {} utilization = {} allowed, but {} "
               "were in use before loading (other processes, the CUDA context), the weights take {} and the "
               "activations (the profiling step's buffers and workspaces) {}; raise --gpu-memory-utilization, lower --max-num-batched-tokens, "
               "free the device or give --kv-cache-memory",
               m.total, m.utilization, allowed, m.in_use_before, m.weights, m.activations);
  return budget;
}

class ModelRunner::Impl final : public AttentionRunner {
 public:
  Impl(const ModelDir& dir, const Options& o);

  Tensor execute(std::span<const StepRequest> reqs);
  // Plans and allocates the KV cache for `budget` bytes and requests of up to `max_len`
  // tokens, with the backend's layers, builders, batches and preparers; release_attention()
  // frees all of it (the CUDA profiling step's temporary cache).
  void build_attention(int64_t budget, int64_t max_len, const std::string& budget_what);
  void release_attention();
  void attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out) override;

  struct Group {
    std::vector<int64_t> layers;  // model layer indices
    std::unique_ptr<AttentionGroupBuilders> builders;
    std::unique_ptr<InputBatch> batch;
    std::unique_ptr<BatchPreparer> preparer;
    const CommonAttentionMetadata* cm = nullptr;
    const AttentionMetadata* md = nullptr;
  };

  HfModelConfig cfg_;
  Options opt_;
  DType compute_dtype_ = DType::f32;
  KVPlan plan_;
  BackendConfig bc_;
  AttentionBackendPtr backend_;
  LayerRegistry registry_;
  KVCacheViews views_;
  std::vector<AttentionLayer> layers_;  // per model layer
  std::vector<Tensor> kv_cache_;        // per model layer: its [B, H, N, C] view
  std::vector<int32_t> group_of_layer_;
  std::vector<Group> groups_;
  ArchTraits traits_;
  std::string model_name_;
  std::unique_ptr<CpuTransformer> cpu_model_;
  std::unique_ptr<CudaTransformer> cuda_model_;
  MemoryPlan mem_;
  int32_t reorder_threshold_ = 1;
  int64_t num_logical_blocks_ = 0;
  // Step buffers (sized at construction).
  std::vector<std::string> id_strings_;  // "0".."max_num_seqs-1": the InputBatch request ids
  RequestState scratch_;
  std::vector<int32_t> tokens_;
  std::vector<int64_t> positions_, logit_rows_, offset_of_req_;
  Tensor logits_;  // [max_num_seqs, vocab] f32
  int64_t step_tokens_ = 0;
};

ModelRunner::Impl::Impl(const ModelDir& dir, const Options& o) : cfg_(dir.config), opt_(o) {
  // ---- options -----------------------------------------------------------------------
  compute_dtype_ = resolve_compute_dtype(o.compute_dtype, cfg_.torch_dtype, o.device);
  check_gpu_memory_utilization(o.gpu_memory_utilization);
  KVATTN_CHECK(o.block_size > 0, "--block-size must be positive, got {}", o.block_size);
  KVATTN_CHECK(o.max_num_seqs > 0 && o.max_num_seqs <= (1 << 20), "max_num_seqs {} must be in [1, {}]",
               o.max_num_seqs, 1 << 20);
  KVATTN_CHECK(o.max_num_batched_tokens > 0, "max_num_batched_tokens must be positive, got {}",
               o.max_num_batched_tokens);
  KVATTN_CHECK(o.kv_cache_memory >= 0, "--kv-cache-memory must be >= 0 bytes, got {}", o.kv_cache_memory);
  KVATTN_CHECK(o.max_model_len >= 0 && o.max_model_len <= cfg_.max_position_embeddings,
               "--max-model-len {} exceeds the model's max_position_embeddings {} (config.json); use a value in "
               "[1, {}] or 0 for the model's",
               o.max_model_len, cfg_.max_position_embeddings, cfg_.max_position_embeddings);
  KVATTN_CHECK(o.num_threads >= 0, "num_threads must be >= 0 (0: OpenBLAS's default), got {}", o.num_threads);
  if (o.num_threads > 0) cpu::set_num_threads(o.num_threads);
  KVATTN_CHECK(static_cast<int64_t>(cfg_.layer_is_sliding.size()) == cfg_.num_hidden_layers,
               "config: {} per-layer sliding flags for {} layers", cfg_.layer_is_sliding.size(),
               cfg_.num_hidden_layers);
  traits_ = arch_traits(cfg_);
  model_name_ = dir.path.string();
  const int64_t max_len = o.max_model_len > 0 ? o.max_model_len : cfg_.max_position_embeddings;
  const DType kv_dtype = resolve_kv_cache_dtype(o.kv_cache_dtype, compute_dtype_);

  for (int64_t i = 0; i < o.max_num_seqs; ++i) id_strings_.push_back(std::to_string(i));
  tokens_.resize(static_cast<size_t>(o.max_num_batched_tokens));
  positions_.resize(static_cast<size_t>(o.max_num_batched_tokens));
  logit_rows_.reserve(static_cast<size_t>(o.max_num_seqs));
  offset_of_req_.resize(static_cast<size_t>(o.max_num_seqs));
  logits_ = Tensor::empty({o.max_num_seqs, cfg_.vocab_size}, DType::f32);

  if (!o.device.is_cuda()) {
    // ---- CPU: f32 weights, KV budget from --kv-cache-memory or the CPU default ------------
    int64_t budget = o.kv_cache_memory;
    if (budget == 0) {
      const int64_t per_token =
          cfg_.num_hidden_layers * 2 * cfg_.num_key_value_heads * cfg_.head_dim * dtype_size(kv_dtype);
      const int64_t blocks = kCpuDefaultRequests * ((max_len + o.block_size - 1) / o.block_size) + 2;
      budget = std::min(kCpuDefaultKvMax, blocks * o.block_size * per_token);
    }
    build_attention(budget, max_len,
                    fmt::format("--kv-cache-memory {} bytes{}", budget, o.kv_cache_memory ? "" : " (the CPU default)"));
    ModelWeights w = load_weights(traits_, cfg_, dir.weights);
    mem_.weights = 0;
    for (const auto* v : {&w.embed, &w.final_norm, &w.lm_head}) mem_.weights += static_cast<int64_t>(v->size()) * 4;
    for (const LayerWeights& l : w.layers)
      for (const auto* v : {&l.input_norm, &l.post_attn_norm, &l.pre_ff_norm, &l.post_ff_norm, &l.q_norm, &l.k_norm,
                            &l.qkv_w, &l.qkv_b, &l.o_w, &l.gate_up_w, &l.down_w})
        mem_.weights += static_cast<int64_t>(v->size()) * 4;
    cpu_model_ = std::make_unique<CpuTransformer>(cfg_, traits_, std::move(w), o.max_num_batched_tokens,
                                                  o.max_num_seqs);
    mem_.kv_cache = plan_.total_bytes;
    return;
  }

  // ---- CUDA: weights, then a profiling step, then the KV cache from what is left ---------
  if (cuda::built_with_cuda() && o.device.index >= cuda::device_count()) {
    const int n = cuda::device_count();
    throw Unsupported(n == 0 ? fmt::format("--device {}: this machine has no usable CUDA device; use --device cpu",
                                           o.device.str())
                             : fmt::format("--device {}: this machine has {} usable CUDA device(s); use one of "
                                           "cuda:0..cuda:{} or --device cpu",
                                           o.device.str(), n, n - 1));
  }
  const DeviceMemoryInfo before = device_memory_info(o.device);  // Unsupported in builds without CUDA
  {
    const AttentionBackendPtr be = AttentionBackendRegistry::global().get("FLASHINFER");
    if (!be->supports_head_size(cfg_.head_dim))
      throw Unsupported(fmt::format("--device {}: the model's head_dim {} has no CUDA attention kernel (head sizes "
                                    "{}); run it with --device cpu",
                                    o.device.str(), cfg_.head_dim, fmt::join(be->get_supported_head_sizes(), ", ")));
  }
  mem_.total = before.total;
  mem_.in_use_before = before.total - before.free;
  // This process's own pool counters alongside the device-wide figures: other processes on the
  // same GPU that free memory during the profiling step would make the device-wide difference
  // too small (even 0); the pool's peak during the step cannot be lowered by them, and it also
  // sees the step's transient buffers.
  const int64_t pool_before = cuda::pool_bytes_in_use(o.device.index);
  cuda_model_ = std::make_unique<CudaTransformer>(cfg_, traits_, dir.weights, o.device, compute_dtype_,
                                                  o.max_num_batched_tokens, o.max_num_seqs, max_len);
  mem_.weights = cuda_model_->weight_bytes();
  cuda::reset_pool_peak(o.device.index);  // loading's staging buffers are not the step's
  // Profiling: one step of max_num_batched_tokens tokens (requests of at most max_model_len
  // tokens, at most max_num_seqs of them) through a temporary KV cache just large enough, so
  // that every buffer a full step needs (cuBLAS and attention workspaces) exists when measured.
  const int64_t bs = o.block_size;
  const int64_t profile_len = std::min(o.max_num_batched_tokens, max_len);
  std::vector<int64_t> lens;
  for (int64_t left = o.max_num_batched_tokens; left > 0 && static_cast<int64_t>(lens.size()) < o.max_num_seqs;
       left -= profile_len)
    lens.push_back(std::min(left, profile_len));
  int64_t profile_blocks = 0;
  for (int64_t n : lens) profile_blocks += (n + bs - 1) / bs;
  const int64_t per_token_all_layers =
      cfg_.num_hidden_layers * 2 * cfg_.num_key_value_heads * cfg_.head_dim * dtype_size(kv_dtype);
  // With G groups a logical block costs about bs * per_token_all_layers (G physical blocks of
  // 1/G of the layers each); twice that covers group padding and alignment.
  const int64_t profile_budget = 2 * (profile_blocks + 2) * bs * per_token_all_layers + (1 << 20);
  build_attention(profile_budget, profile_len,
                  fmt::format("{} bytes (the profiling step's temporary KV cache)", profile_budget));
  {
    std::vector<std::vector<int32_t>> ids, blocks;
    int32_t next_block = 1;
    for (int64_t n : lens) {
      ids.emplace_back(static_cast<size_t>(n), 0);
      std::vector<int32_t> b;
      for (int64_t k = 0; k < (n + bs - 1) / bs; ++k) b.push_back(next_block++);
      blocks.push_back(std::move(b));
    }
    std::vector<StepRequest> reqs(lens.size());
    for (size_t i = 0; i < lens.size(); ++i) {
      reqs[i].request_id = static_cast<int64_t>(i);
      reqs[i].token_ids = ids[i];
      reqs[i].block_ids = blocks[i];
      reqs[i].wants_logits = true;
    }
    execute(reqs);
  }
  cuda::synchronize();
  const DeviceMemoryInfo after = device_memory_info(o.device);
  const int64_t profile_kv = plan_.total_bytes;
  const int64_t pool_peak = std::max(cuda::pool_peak_bytes(o.device.index), cuda::pool_bytes_in_use(o.device.index));
  const int64_t device_wide = (before.free - after.free) - mem_.weights - profile_kv;
  const int64_t own_peak = pool_peak - pool_before - mem_.weights - profile_kv;
  mem_.activations = std::max<int64_t>({0, device_wide, own_peak});
  release_attention();
  int64_t budget = o.kv_cache_memory;
  if (budget == 0) {
    mem_.utilization = o.gpu_memory_utilization;
    budget = gpu_kv_cache_budget(mem_);
  }
  const std::string what =
      o.kv_cache_memory
          ? fmt::format("--kv-cache-memory {} bytes", budget)
          : fmt::format("a KV cache budget of {} bytes (= {} bytes total x {} --gpu-memory-utilization - {} in use "
                        "before loading - {} weights - {} activations)",
                        budget, mem_.total, mem_.utilization, mem_.in_use_before, mem_.weights, mem_.activations);
  build_attention(budget, max_len, what);
  mem_.kv_cache = plan_.total_bytes;
}

void ModelRunner::Impl::release_attention() {
  groups_.clear();
  layers_.clear();
  kv_cache_.clear();
  group_of_layer_.clear();
  views_.clear();
  registry_ = LayerRegistry{};
  backend_.reset();
  plan_ = KVPlan{};
  reorder_threshold_ = 1;
  num_logical_blocks_ = 0;
}

void ModelRunner::Impl::build_attention(int64_t budget, int64_t max_len, const std::string& budget_what) {
  const Options& o = opt_;
  const ArchTraits& traits = traits_;
  // ---- KV cache plan from the model's real layer specs ------------------------------------
  ModelConfig mc;
  mc.name = model_name_;
  mc.num_hidden_layers = cfg_.num_hidden_layers;
  mc.num_attention_heads = cfg_.num_attention_heads;
  mc.num_key_value_heads = cfg_.num_key_value_heads;
  mc.head_dim = cfg_.head_dim;
  mc.dtype = compute_dtype_;
  mc.max_model_len = max_len;
  for (int64_t i = 0; i < cfg_.num_hidden_layers; ++i) {
    const bool sliding = cfg_.layer_is_sliding[static_cast<size_t>(i)];
    KVATTN_CHECK(!sliding || (cfg_.sliding_window && *cfg_.sliding_window > 0),
                 "config.json: layer {} uses sliding-window attention but sliding_window is missing or not positive",
                 i);
    mc.layer_kinds.push_back(sliding ? ModelLayerKind::sliding_window : ModelLayerKind::full_attention);
  }
  if (cfg_.sliding_window) mc.sliding_window = *cfg_.sliding_window;
  PlanOptions po;
  po.block_size = o.block_size;
  po.kv_cache_dtype = o.kv_cache_dtype;
  po.layout = o.layout;
  po.max_num_batched_tokens = o.max_num_batched_tokens;
  po.gpu_memory = budget;
  try {
    plan_ = plan_kv_cache(mc, po);
  } catch (const InvalidArgument& e) {
    // A budget too small: the planner speaks `kvattn plan`'s flags (--gpu-memory = the KV cache
    // budget here).  Other plan errors (layout, block size) are the user's choices, as named.
    if (std::string_view(e.what()).find("--gpu-memory") == std::string_view::npos) throw;
    throw InvalidArgument(fmt::format(
        "the KV cache cannot be planned with {} and --max-model-len {}: {}. Raise {} or lower "
        "--max-model-len",
        budget_what, mc.max_model_len, e.what(),
        o.device.is_cuda() && o.kv_cache_memory == 0 ? "--gpu-memory-utilization" : "--kv-cache-memory"));
  }

  // ---- backend -----------------------------------------------------------------------
  bc_.platform.device = o.device;
  if (o.device.is_cuda()) {
    const int cc = cuda::compute_capability(o.device.index);
    bc_.platform.capability = DeviceCapability{cc / 10, cc % 10};
    bc_.num_sms = cuda::multiprocessor_count(o.device.index);
  } else {
    bc_.num_sms = std::max(1, cpu::num_threads());
  }
  bc_.model_dtype = compute_dtype_;
  bc_.num_attention_heads = cfg_.num_attention_heads;
  bc_.num_kv_heads = cfg_.num_key_value_heads;
  bc_.head_size = cfg_.head_dim;
  bc_.max_model_len = plan_.model.max_model_len;
  bc_.max_num_seqs = o.max_num_seqs;
  bc_.max_num_batched_tokens = o.max_num_batched_tokens;
  bc_.cache_dtype = o.kv_cache_dtype;
  bc_.cache_config.kv_cache_layout = plan_.layout;
  bc_.flashinfer_workspace_buffer_size = 0;
  bc_.layers = &registry_;
  backend_ = AttentionBackendRegistry::global().get("FLASHINFER");
  if (!backend_->supports_kv_cache_dtype(o.kv_cache_dtype, bc_))
    throw Unsupported(fmt::format("--kv-cache-dtype {} is not supported by the attention backend; valid: {}",
                                  kv_cache_dtype_name(o.kv_cache_dtype),
                                  kv_cache_dtype_names(backend_->supported_kv_cache_dtypes())));
  // One kernel block size per KV cache group, as the worker picks it (vLLM's
  // prepare_kernel_block_sizes), all on the FlashInfer backend.
  const BlockSizeBackend bsb = backend_->block_size_backend(bc_);
  const std::vector<int64_t> kernel_block_sizes =
      prepare_kernel_block_sizes(plan_.config, one_backend_attention_groups(plan_.config, bsb));
  views_ = allocate_kv_cache(plan_.config, o.device, plan_.layout, kernel_block_sizes);

  // ---- layers: one backend impl each, with the model's scale, window and soft cap --------
  const auto L = static_cast<size_t>(cfg_.num_hidden_layers);
  layers_.resize(L);
  kv_cache_.resize(L);
  group_of_layer_.assign(L, -1);
  for (size_t i = 0; i < L; ++i) {
    const std::string& name = plan_.layer_specs[i].layer_name;
    AttentionImplParams p;
    p.num_heads = cfg_.num_attention_heads;
    p.head_size = cfg_.head_dim;
    p.scale = traits.attn_scale;
    p.num_kv_heads = cfg_.num_key_value_heads;
    if (cfg_.layer_is_sliding[i]) p.sliding_window = cfg_.sliding_window;
    p.kv_cache_dtype = o.kv_cache_dtype;
    p.logits_soft_cap = traits.attn_softcap;
    auto impl = backend_->make_impl(p, bc_);
    impl->process_weights_after_loading(compute_dtype_);
    layers_[i] = AttentionLayer::make(name, impl, o.device);
    kv_cache_[i] = views_.at(name);
  }
  for (auto& l : layers_) registry_.add(&l);

  // ---- KV cache groups: builders, batch rows, preparers ----------------------------------
  const auto& cfg_groups = plan_.config.kv_cache_groups;
  for (size_t gi = 0; gi < cfg_groups.size(); ++gi) {
    const auto& gs = cfg_groups[gi];
    Group g;
    for (const auto& name : gs.layer_names)
      for (size_t i = 0; i < L; ++i)
        if (layers_[i].name == name) {
          g.layers.push_back(static_cast<int64_t>(i));
          group_of_layer_[i] = static_cast<int32_t>(gi);
        }
    g.builders = std::make_unique<AttentionGroupBuilders>(backend_, gs.layer_names, gs.kv_cache_spec,
                                                          static_cast<int64_t>(gi), bc_);
    g.builders->create_metadata_builders(kernel_block_sizes[gi], 1);
    reorder_threshold_ = static_cast<int32_t>(std::max<int64_t>(
        reorder_threshold_, g.builders->get_metadata_builder().reorder_batch_threshold().value_or(1)));
    const int64_t spec_bs = gs.kv_cache_spec->block_size();
    const int64_t width = g.builders->block_table_width() * kernel_block_sizes[gi] / spec_bs;
    g.batch = std::make_unique<InputBatch>(o.max_num_seqs, width);
    BatchPreparerConfig pc;
    pc.max_num_reqs = o.max_num_seqs;
    pc.max_num_batched_tokens = o.max_num_batched_tokens;
    pc.max_model_len = width * spec_bs;
    pc.block_size = spec_bs;
    pc.num_blocks = plan_.config.num_blocks;
    pc.device = o.device;
    g.preparer = std::make_unique<BatchPreparer>(pc);
    groups_.push_back(std::move(g));
  }
  for (size_t i = 0; i < L; ++i)
    KVATTN_ASSERT(group_of_layer_[i] >= 0, "layer {} is in no KV cache group", layers_[i].name);
  const auto G = static_cast<int64_t>(groups_.size());
  num_logical_blocks_ = 1 + (plan_.config.num_blocks - 1) / G;
  scratch_.block_ids.reserve(static_cast<size_t>(plan_.model.max_model_len / o.block_size + 2));
}

void ModelRunner::Impl::attend(int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out) {
  const Group& g = groups_[static_cast<size_t>(group_of_layer_[static_cast<size_t>(layer)])];
  AttentionLayer& al = layers_[static_cast<size_t>(layer)];
  const Tensor& cache = kv_cache_[static_cast<size_t>(layer)];
  if (!backend_->forward_includes_kv_cache_update())
    al.impl->do_kv_cache_update(al, k, v, cache, g.cm->slot_mapping.narrow(0, 0, step_tokens_));
  al.impl->forward(al, q, k, v, cache, g.md, out);
}

Tensor ModelRunner::Impl::execute(std::span<const StepRequest> reqs) {
  const auto R = static_cast<int64_t>(reqs.size());
  KVATTN_CHECK(R <= opt_.max_num_seqs, "a step of {} requests exceeds max_num_seqs {}", R, opt_.max_num_seqs);
  const int64_t bs = plan_.block_size, max_len = plan_.model.max_model_len;
  int64_t total = 0;
  for (int64_t i = 0; i < R; ++i) {
    const StepRequest& r = reqs[static_cast<size_t>(i)];
    const auto n = static_cast<int64_t>(r.token_ids.size());
    KVATTN_CHECK(n > 0, "request {}: no tokens to compute this step", r.request_id);
    KVATTN_CHECK(r.start_pos >= 0 && r.start_pos + n <= max_len,
                 "request {}: positions [{}, {}) leave [0, max_model_len = {}); shorten the prompt or raise "
                 "--max-model-len",
                 r.request_id, r.start_pos, r.start_pos + n, max_len);
    for (int32_t t : r.token_ids)
      KVATTN_CHECK(t >= 0 && t < cfg_.vocab_size, "request {}: token id {} is outside the vocabulary [0, {})",
                   r.request_id, t, cfg_.vocab_size);
    const int64_t need = (r.start_pos + n + bs - 1) / bs;
    KVATTN_CHECK(static_cast<int64_t>(r.block_ids.size()) >= need,
                 "request {}: {} KV blocks cover {} tokens, but {} tokens need {} blocks of {}", r.request_id,
                 r.block_ids.size(), static_cast<int64_t>(r.block_ids.size()) * bs, r.start_pos + n, need, bs);
    for (int64_t b = 0; b < need; ++b) {
      const int32_t id = r.block_ids[static_cast<size_t>(b)];
      KVATTN_CHECK(id >= 1 && id < num_logical_blocks_,
                   "request {}: block id {} is outside [1, {}) (num_kv_blocks; 0 is the null block)", r.request_id,
                   id, num_logical_blocks_);
    }
    total += n;
  }
  KVATTN_CHECK(total <= opt_.max_num_batched_tokens, "a step of {} tokens exceeds max_num_batched_tokens {}", total,
               opt_.max_num_batched_tokens);
  if (R == 0) return logits_.narrow(0, 0, 0);
  if (opt_.device.is_cuda()) cuda::set_device(opt_.device.index);  // the caller's thread may be on another

  // Batch rows: every group holds the same rows (its own physical block ids), reordered
  // decode -> short extend -> long extend -> prefill by the same permutation.
  const auto G = static_cast<int32_t>(groups_.size());
  for (int32_t gi = 0; gi < G; ++gi) {
    InputBatch& b = *groups_[static_cast<size_t>(gi)].batch;
    b.clear();
    for (int64_t i = 0; i < R; ++i) {
      const StepRequest& r = reqs[static_cast<size_t>(i)];
      const auto n = static_cast<int32_t>(r.token_ids.size());
      const auto start = static_cast<int32_t>(r.start_pos);
      scratch_.req_id = id_strings_[static_cast<size_t>(i)];
      // A step of at most reorder_threshold tokens after a context is a decode; anything else
      // is (a chunk of) a prompt.
      scratch_.num_prompt_tokens = (start > 0 && n <= reorder_threshold_) ? start : start + n;
      scratch_.num_computed_tokens = start;
      scratch_.num_scheduled_tokens = n;
      scratch_.block_ids.clear();
      const int64_t need = (r.start_pos + n + plan_.block_size - 1) / plan_.block_size;
      for (int64_t k = 0; k < need; ++k)
        scratch_.block_ids.push_back(physical_block(r.block_ids[static_cast<size_t>(k)], gi, G));
      b.add_request(scratch_);
    }
    reorder_batch_to_split_decodes_and_prefills(b, reorder_threshold_);
  }
  // Tokens in row order.
  const InputBatch& b0 = *groups_[0].batch;
  int64_t t = 0;
  for (int64_t row = 0; row < R; ++row) {
    const int64_t i = std::stoll(b0.req_id(row));
    const StepRequest& r = reqs[static_cast<size_t>(i)];
    offset_of_req_[static_cast<size_t>(i)] = t;
    for (size_t j = 0; j < r.token_ids.size(); ++j, ++t) {
      tokens_[static_cast<size_t>(t)] = r.token_ids[j];
      positions_[static_cast<size_t>(t)] = r.start_pos + static_cast<int64_t>(j);
    }
  }
  step_tokens_ = t;
  logit_rows_.clear();
  for (int64_t i = 0; i < R; ++i) {
    const StepRequest& r = reqs[static_cast<size_t>(i)];
    if (r.wants_logits)
      logit_rows_.push_back(offset_of_req_[static_cast<size_t>(i)] + static_cast<int64_t>(r.token_ids.size()) - 1);
  }
  // Metadata per group: CommonAttentionMetadata -> the backend's build().
  for (auto& g : groups_) {
    g.cm = &g.preparer->prepare(*g.batch);
    g.md = &g.builders->build_metadata(*g.cm, 0, 0);
  }
  const auto N = static_cast<int64_t>(logit_rows_.size());
  const std::span<const int32_t> tok(tokens_.data(), static_cast<size_t>(t));
  const std::span<const int64_t> pos(positions_.data(), static_cast<size_t>(t));
  if (cuda_model_)
    cuda_model_->forward(tok, pos, *this, logit_rows_, logits_.data_ptr<float>());
  else
    cpu_model_->forward(tok, pos, *this, logit_rows_, logits_.data_ptr<float>());
  return logits_.narrow(0, 0, N);
}

ModelRunner::ModelRunner(const ModelDir& model, const Options& options)
    : impl_(std::make_unique<Impl>(model, options)) {}
ModelRunner::~ModelRunner() = default;

int64_t ModelRunner::num_kv_blocks() const { return impl_->num_logical_blocks_; }
int64_t ModelRunner::block_size() const { return impl_->plan_.block_size; }
int64_t ModelRunner::max_model_len() const { return impl_->plan_.model.max_model_len; }
int64_t ModelRunner::vocab_size() const { return impl_->cfg_.vocab_size; }
DType ModelRunner::compute_dtype() const { return impl_->compute_dtype_; }
DType ModelRunner::kv_cache_dtype() const { return impl_->plan_.kv_dtype; }
KVCacheLayout ModelRunner::layout() const { return impl_->plan_.layout; }
const ModelRunner::MemoryPlan& ModelRunner::memory_plan() const { return impl_->mem_; }
int64_t ModelRunner::weight_bytes() const { return impl_->mem_.weights; }
int64_t ModelRunner::activation_bytes() const { return impl_->mem_.activations; }
int64_t ModelRunner::kv_cache_bytes() const { return impl_->mem_.kv_cache; }
int64_t ModelRunner::num_kv_cache_groups() const { return static_cast<int64_t>(impl_->groups_.size()); }
Tensor ModelRunner::execute(std::span<const StepRequest> reqs) { return impl_->execute(reqs); }

}  // namespace kvattn::model
