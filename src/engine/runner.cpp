#include "kvattn/engine/runner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <numeric>
#include <thread>

#include "kvattn/attention/attention_group_builders.h"
#include "kvattn/attention/backend_registry.h"
#include "kvattn/attention/communicator.h"
#include "kvattn/attention/native_backend.h"
#include "kvattn/attention/paged_kv_metadata.h"
#include "kvattn/batch/batch_preparer.h"
#include "kvattn/batch/input_batch.h"
#include "kvattn/core/cuda_runtime_api.h"
#include "kvattn/engine/scheduler.h"
#include "kvattn/kv/allocate.h"
#include "kvattn/kv/attention_group.h"
#include "kvattn/kv/block_size.h"
#include "kvattn/kv/kv_block_zeroer.h"
#include "kvattn/kv/model_config.h"

namespace kvattn::engine {
namespace {

using Clock = std::chrono::steady_clock;
double us_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// Deterministic pseudo-random value in (-1, 1) for one element (splitmix64 of its key).
inline float synth_value(uint64_t key) {
  key += 0x9e3779b97f4a7c15ULL;
  key = (key ^ (key >> 30)) * 0xbf58476d1ce4e5b9ULL;
  key = (key ^ (key >> 27)) * 0x94d049bb133111ebULL;
  key ^= key >> 31;
  return static_cast<float>(static_cast<double>(key >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

double tolerance_for(DType model_dtype, DType kv_dtype) {
  double t = model_dtype == DType::f32 ? 1e-4 : (model_dtype == DType::f16 ? 5e-3 : 3e-2);
  if (dtype_is_fp8(kv_dtype)) t = std::max(t, 3e-2);
  return t;
}

// One model layer as the runner sees it: its name, kind, and the reference (oracle) layer.
struct LayerState {
  std::string name;
  int64_t model_index = 0;
  bool sliding = false;
  AttentionLayer reference;
  Tensor reference_cache;  // what the reference reads: rank 0's cache, or the host shadow (DCP)
};

// What every rank shares about one KV cache group: the batch (identical on every rank), the
// reference builders and the correctness sample.
struct GroupState {
  std::shared_ptr<const AttentionSpec> spec;
  size_t plan_group = 0;       // index among the plan's KV cache groups (= the scheduler's group)
  std::vector<size_t> layers;  // indices into Runner::layers_
  std::unique_ptr<AttentionGroupBuilders> reference;
  std::unique_ptr<InputBatch> batch;
  // The correctness sample: every request's last (up to kCheckTokensPerRequest) query tokens
  // of the step, as a batch of their own, prepared on the host for the reference backend.
  std::unique_ptr<InputBatch> sample_batch;
  std::unique_ptr<BatchPreparer> sample_preparer;
  // DCP with checks: slot mapping of the host shadow cache (blocks of block_size * W tokens).
  std::unique_ptr<BatchPreparer> shadow_preparer;
  int64_t cascade_prefix_len = 0;  // this step's decision
};

// One DCP rank (the only one without DCP): its device, KV cache, native layers and builders,
// step buffers.  Under DCP every rank holds the full batch, a token-interleaved shard of each
// request's KV and Hq / W query heads.
struct RankState {
  int64_t rank = 0;
  Device device;
  DcpCommunicator* comm = nullptr;
  BackendConfig cfg;
  LayerRegistry registry;
  KVCacheViews views;
  std::vector<AttentionLayer> native;  // per LayerState
  std::vector<Tensor> kv_cache;        // per LayerState: the layer's [B, H, N, C] view
  std::vector<std::unique_ptr<AttentionGroupBuilders>> builders;  // per GroupState
  std::vector<std::unique_ptr<BatchPreparer>> preparers;          // per GroupState
  std::vector<const CommonAttentionMetadata*> step_metadata;      // per GroupState, this step
  std::unique_ptr<KVBlockZeroer> zeroer;
  // Step tensors (host, reused every step) and the output on the rank's device.
  std::vector<float> qf, kf, vf;
  Tensor q_host, k_host, v_host, out;
  StepTiming timing;
  std::string error;
};

// Query tokens per request the reference recomputes at a check: the whole step for decodes,
// the last tokens of a prefill chunk (causal attention makes them independent of the rest).
constexpr int32_t kCheckTokensPerRequest = 16;

class Runner {
 public:
  Runner(const RunConfig& cfg, const Trace& trace) : cfg_(cfg), trace_(trace) {}

  RunStats run(const std::function<void(const RunProgress&)>& on_step);

 private:
  // setup() runs these phases in order; each reads what the earlier ones left in the members.
  void setup();
  void load_model();              // model_: the preset or config.json, --num-layers applied
  void check_dcp_geometry() const;  // --dcp divides the query heads into whole GQA groups
  void plan_kv();                 // plan_, kv_dtype_: plan_kv_cache over the run's options
  void setup_dcp_transport();     // nccl_group_ or in_process_group_ (DCP only)
  void configure_backends();      // backend_cfg_, ref_cfg_, the two backends
  void choose_kernel_block_sizes();  // kernel_block_sizes_: kv::prepare_kernel_block_sizes
  void setup_layers();            // layers_ and their reference twins
  void setup_ranks();             // ranks_: KV cache, native layers and builders per device
  void setup_groups();            // groups_: batches, reference builders, sample preparers
  void setup_scheduler();         // scheduler_ over the plan's one block pool
  void fill_run_stats();          // stats_: what the run serves with
  void setup_rank(RankState& rs, const std::vector<int64_t>& kernel_block_sizes, const AttentionBackendPtr& backend);
  void setup_shadow_cache(const std::vector<std::string>& attention_layers);
  void update_batches(const SchedulerOutput& out);
  bool g_sliding(int32_t gi) const { return groups_[static_cast<size_t>(gi)].spec->sliding_window().has_value(); }
  int64_t common_prefix_len(const GroupState& g) const;
  void decide_cascade(GroupState& g);
  std::string cascade_reason() const;
  // Why cascade was not used, counted per group and step (fixed counters: nothing allocated per step).
  struct CascadeWhy {
    int64_t off = 0, dcp = 0, no_prefix = 0, short_prefix = 0, sliding = 0, few_requests = 0, flash_decoding = 0,
            backend = 0;
  } cascade_why_;
  void rank_step(RankState& rs, int64_t check_layer_index);
  void make_qkv(RankState& rs, const LayerState& layer, const InputBatch& batch, int64_t num_tokens);
  void check_layer(GroupState& g, LayerState& layer, const CommonAttentionMetadata& cm, int64_t step);

  int64_t W() const { return cfg_.dcp; }
  // A preparer for this run's limits, `block_size`-token block-table entries, on `device`.
  BatchPreparerConfig preparer_config(int64_t block_size, Device device) const {
    BatchPreparerConfig pc;
    pc.max_num_reqs = cfg_.max_num_seqs;
    pc.max_num_batched_tokens = cfg_.max_num_batched_tokens;
    pc.max_model_len = plan_.model.max_model_len;
    pc.block_size = block_size;
    pc.num_blocks = plan_.config.num_blocks;
    pc.device = device;
    return pc;
  }

  RunConfig cfg_;
  const Trace& trace_;
  ModelConfig model_;
  KVPlan plan_;
  BackendConfig backend_cfg_;  // the native backend's configuration (each rank adapts a copy)
  BackendConfig ref_cfg_;
  AttentionBackendPtr native_backend_, ref_backend_;
  std::vector<int64_t> kernel_block_sizes_;       // per KV cache group of the plan
  std::vector<std::string> attention_layers_;     // names of layers_, model order
  LayerRegistry ref_registry_;
  std::vector<LayerState> layers_;
  std::vector<GroupState> groups_;
  std::vector<RankState> ranks_;
  std::unique_ptr<InProcessDcpGroup> in_process_group_;
  std::unique_ptr<NcclDcpGroup> nccl_group_;
  KVCacheViews shadow_views_;  // DCP with checks: the whole KV on the host, for the reference
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<int64_t> row_of_req_;  // request id -> row in every group's batch, -1 = absent
  int32_t reorder_threshold_ = 1;
  DType kv_dtype_ = DType::bf16;
  RunStats stats_;
  std::vector<int32_t> zero_ids_;
  // The checked layer of this step: the full output rows [T, Hq, D] (every rank writes its
  // heads) and rank 0's host Q/K/V of that layer.
  Tensor check_out_, check_q_, check_k_, check_v_;
};

void Runner::setup() {
  load_model();
  check_dcp_geometry();
  plan_kv();
  setup_dcp_transport();
  configure_backends();
  choose_kernel_block_sizes();
  setup_layers();
  setup_ranks();
  setup_groups();
  setup_scheduler();
  fill_run_stats();
}

void Runner::load_model() {
  model_ = load_model_config(cfg_.model);
  if (cfg_.num_layers) {
    KVATTN_CHECK(*cfg_.num_layers >= 1 && *cfg_.num_layers <= model_.num_hidden_layers,
                 "--num-layers {} is outside [1, {}] for model {}", *cfg_.num_layers, model_.num_hidden_layers,
                 model_.name);
    model_.num_hidden_layers = *cfg_.num_layers;
    model_.layer_kinds.resize(static_cast<size_t>(*cfg_.num_layers));
    if (model_.num_layers_of(ModelLayerKind::mamba) == 0) model_.mamba.reset();
  }
}

void Runner::check_dcp_geometry() const {
  if (W() == 1) return;
  // Each rank serves num_attention_heads / dcp query heads against all num_key_value_heads
  // KV heads, so that share must itself be a multiple of the KV heads (GQA groups stay whole).
  std::vector<int64_t> valid;
  for (int64_t w = 1; w <= model_.num_attention_heads; ++w)
    if (model_.num_attention_heads % w == 0 && (model_.num_attention_heads / w) % model_.num_key_value_heads == 0)
      valid.push_back(w);
  KVATTN_CHECK(model_.num_attention_heads % W() == 0,
               "--dcp {}: the model's {} query heads must divide over the DCP ranks (each rank serves "
               "num_attention_heads / dcp of them); valid --dcp values divide {}: {}",
               W(), model_.num_attention_heads, model_.num_attention_heads, fmt::join(valid, ", "));
  KVATTN_CHECK((model_.num_attention_heads / W()) % model_.num_key_value_heads == 0,
               "--dcp {}: each rank would serve num_attention_heads / dcp = {} / {} = {} query heads, which must be a "
               "multiple of the model's num_key_value_heads ({}; every rank holds all KV heads); valid --dcp values "
               "for {}: {}",
               W(), model_.num_attention_heads, W(), model_.num_attention_heads / W(), model_.num_key_value_heads,
               model_.name, fmt::join(valid, ", "));
  KVATTN_CHECK(model_.num_layers_of(ModelLayerKind::sliding_window) == 0 && !model_.mamba,
               "--dcp {}: model {} has sliding-window or Mamba layers; decode context parallelism serves "
               "full-attention models only (vLLM's FlashInfer backend rejects sliding windows with DCP)",
               W(), model_.name);
}

void Runner::plan_kv() {
  PlanOptions po;
  po.block_size = cfg_.block_size;
  po.kv_cache_dtype = cfg_.kv_cache_dtype;
  po.layout = cfg_.layout;
  po.gpu_memory = cfg_.gpu_memory;
  po.max_model_len = cfg_.max_model_len;
  po.max_num_batched_tokens = cfg_.max_num_batched_tokens;
  plan_ = plan_kv_cache(model_, po);
  kv_dtype_ = plan_.kv_dtype;
  if (W() > 1)
    KVATTN_CHECK(plan_.block_size % cfg_.dcp_interleave == 0,
                 "--dcp-interleave {} must divide the KV cache block size {} (each block holds whole interleave runs "
                 "of every rank's tokens); valid values are the divisors of {}, e.g. 1 or {}",
                 cfg_.dcp_interleave, plan_.block_size, plan_.block_size, plan_.block_size);
}

void Runner::setup_dcp_transport() {
  const bool use_nccl =
      W() > 1 && (cfg_.dcp_transport == "nccl" || (cfg_.dcp_transport == "auto" && cfg_.device.is_cuda()));
  if (use_nccl) {
    KVATTN_CHECK(cfg_.device.is_cuda(), "--dcp-transport nccl needs --device cuda, got {}", cfg_.device.str());
    const int n = cuda::device_count();
    KVATTN_CHECK(cfg_.device.index + W() <= n,
                 "--dcp {} on {} needs GPUs cuda:{}..cuda:{} (one per rank), but this machine has {}; lower --dcp, "
                 "or use --dcp-transport in-process (every rank on one GPU)",
                 W(), cfg_.device.str(), cfg_.device.index, cfg_.device.index + W() - 1, n);
    std::vector<int> devices;
    for (int r = 0; r < W(); ++r) devices.push_back(cfg_.device.index + r);
    nccl_group_ = std::make_unique<NcclDcpGroup>(devices);  // Unsupported without NCCL
    stats_.dcp_transport = nccl_group_->describe();
  } else if (W() > 1) {
    in_process_group_ = std::make_unique<InProcessDcpGroup>(W());
    stats_.dcp_transport = fmt::format("in-process, {} ranks as threads on {}", W(), cfg_.device.str());
  }
}

void Runner::configure_backends() {
  const Device dev = cfg_.device;
  BackendConfig& bc = backend_cfg_;
  bc.platform.device = dev;
  if (dev.is_cuda()) {
    const int cc = cuda::compute_capability(dev.index);
    bc.platform.capability = DeviceCapability{cc / 10, cc % 10};
    bc.num_sms = cuda::multiprocessor_count(dev.index);
  } else {
    bc.num_sms = 8;
  }
  bc.model_dtype = model_.dtype;
  bc.num_attention_heads = model_.num_attention_heads;
  bc.num_kv_heads = model_.num_key_value_heads;
  bc.head_size = model_.head_dim;
  bc.max_model_len = plan_.model.max_model_len;
  bc.max_num_seqs = cfg_.max_num_seqs;
  bc.max_num_batched_tokens = cfg_.max_num_batched_tokens;
  bc.cache_dtype = cfg_.kv_cache_dtype;
  bc.cache_config.kv_cache_layout = plan_.layout;
  bc.flashinfer_workspace_buffer_size = 0;
  ref_cfg_ = bc;
  ref_cfg_.platform.device = Device::cpu();
  ref_cfg_.platform.capability.reset();
  ref_cfg_.layers = &ref_registry_;
  native_backend_ = AttentionBackendRegistry::global().get(cfg_.backend);
  ref_backend_ = AttentionBackendRegistry::global().get("REFERENCE");
}

void Runner::choose_kernel_block_sizes() {
  // One size per KV cache group (vLLM's prepare_kernel_block_sizes): an attention group takes
  // the manager's block size when the backend accepts it, else the largest size it accepts that
  // divides it (virtual block splitting); block-outermost packed groups and Mamba keep theirs.
  const BlockSizeBackend bsb = native_backend_->block_size_backend(backend_cfg_);
  kernel_block_sizes_ = prepare_kernel_block_sizes(plan_.config, one_backend_attention_groups(plan_.config, bsb));
}

void Runner::setup_layers() {
  const double scale = 1.0 / std::sqrt(static_cast<double>(model_.head_dim));
  layers_.reserve(plan_.layer_specs.size());
  for (size_t i = 0; i < plan_.layer_specs.size(); ++i) {
    const auto& ls = plan_.layer_specs[i];
    if (as_attention_spec(ls.spec) == nullptr) continue;  // Mamba layers: no attention to run
    LayerState st;
    st.name = ls.layer_name;
    st.model_index = static_cast<int64_t>(i);
    st.sliding = model_.layer_kinds[i] == ModelLayerKind::sliding_window;
    attention_layers_.push_back(st.name);
    layers_.push_back(std::move(st));
  }
  KVATTN_CHECK(!layers_.empty(), "model {} has no attention layers to serve", model_.name);
  for (auto& st : layers_) {
    AttentionImplParams p;
    p.num_heads = model_.num_attention_heads;
    p.head_size = model_.head_dim;
    p.scale = scale;
    p.num_kv_heads = model_.num_key_value_heads;
    if (st.sliding) p.sliding_window = model_.sliding_window;
    p.kv_cache_dtype = cfg_.kv_cache_dtype;
    auto ri = ref_backend_->make_impl(p, ref_cfg_);
    ri->process_weights_after_loading(model_.dtype);
    st.reference = AttentionLayer::make(st.name, ri, Device::cpu());
  }
  for (auto& st : layers_) ref_registry_.add(&st.reference);
  // The checked layer's full output rows (every rank writes its heads).
  const int64_t T = cfg_.max_num_batched_tokens, Hq = model_.num_attention_heads, D = model_.head_dim;
  check_out_ = Tensor::empty({T, Hq, D}, model_.dtype);
}

void Runner::setup_ranks() {
  const Device dev = cfg_.device;
  ranks_.resize(static_cast<size_t>(W()));
  for (int64_t r = 0; r < W(); ++r) {
    RankState& rs = ranks_[static_cast<size_t>(r)];
    rs.rank = r;
    rs.device = nccl_group_ ? Device::cuda(dev.index + static_cast<int>(r)) : dev;
    rs.comm = nccl_group_ ? &nccl_group_->communicator(r) : in_process_group_ ? &in_process_group_->communicator(r) : nullptr;
    rs.cfg = backend_cfg_;
    rs.cfg.platform.device = rs.device;
    rs.cfg.num_attention_heads = model_.num_attention_heads / W();
    rs.cfg.decode_context_parallel_size = W();
    rs.cfg.dcp_rank = r;
    rs.cfg.cp_kv_cache_interleave_size = cfg_.dcp_interleave;
    rs.cfg.dcp_comm_backend = cfg_.dcp_comm_backend;
    rs.cfg.layers = &rs.registry;
    setup_rank(rs, kernel_block_sizes_, native_backend_);
  }
  if (W() > 1 && cfg_.check_every > 0) setup_shadow_cache(attention_layers_);
  for (auto& st : layers_)
    if (!st.reference_cache.defined())
      st.reference_cache = ranks_[0].kv_cache[static_cast<size_t>(&st - layers_.data())];
}

void Runner::setup_groups() {
  const auto& cfg_groups = plan_.config.kv_cache_groups;
  for (size_t gi = 0, out_gi = 0; gi < cfg_groups.size(); ++gi) {
    const auto& gs = cfg_groups[gi];
    GroupState g;
    for (const auto& name : gs.layer_names) {
      auto it = std::find_if(layers_.begin(), layers_.end(), [&](const LayerState& l) { return l.name == name; });
      if (it != layers_.end()) g.layers.push_back(static_cast<size_t>(it - layers_.begin()));
    }
    if (g.layers.empty()) continue;
    g.plan_group = gi;
    // The group's spec (a UniformTypeKVCacheSpecs wraps per-layer specs: take the first).
    KVCacheSpecPtr first_spec = plan_.config.layer_spec(gs.layer_names.front());
    g.spec = std::shared_ptr<const AttentionSpec>(first_spec, as_attention_spec(first_spec));
    std::vector<std::string> names;
    for (size_t l : g.layers) names.push_back(layers_[l].name);
    // The reference reads blocks of block_size tokens, or of block_size * W in the DCP shadow.
    KVCacheSpecPtr ref_spec = W() > 1 ? gs.kv_cache_spec->copy_with_new_block_size(g.spec->block_size() * W())
                                      : gs.kv_cache_spec;
    const int64_t ref_kernel_block = W() > 1 ? g.spec->block_size() * W() : kernel_block_sizes_[gi];
    g.reference = std::make_unique<AttentionGroupBuilders>(ref_backend_, names, ref_spec, static_cast<int64_t>(gi),
                                                           ref_cfg_);
    g.reference->create_metadata_builders(ref_kernel_block, 1);
    AttentionGroupBuilders& native0 = *ranks_[0].builders[out_gi];
    reorder_threshold_ = static_cast<int32_t>(
        std::max<int64_t>(reorder_threshold_, native0.get_metadata_builder().reorder_batch_threshold().value_or(1)));
    // InputBatch rows hold manager blocks; the group maps them to kernel blocks at build time.
    const int64_t width = native0.block_table_width() * kernel_block_sizes_[gi] / g.spec->block_size();
    g.batch = std::make_unique<InputBatch>(cfg_.max_num_seqs, width);
    g.sample_batch = std::make_unique<InputBatch>(cfg_.max_num_seqs, width);
    const BatchPreparerConfig pc = preparer_config(g.spec->block_size() * W(), Device::cpu());
    g.sample_preparer = std::make_unique<BatchPreparer>(pc);
    if (W() > 1 && cfg_.check_every > 0) g.shadow_preparer = std::make_unique<BatchPreparer>(pc);
    groups_.push_back(std::move(g));
    ++out_gi;
  }
}

void Runner::setup_scheduler() {
  SchedulerConfig sc = make_scheduler_config(plan_, cfg_.max_num_seqs, cfg_.max_num_batched_tokens, W(),
                                             cfg_.prefix_sharing);
  sc.reserve_to_finish = cfg_.admission == "reserve";
  scheduler_ = std::make_unique<Scheduler>(sc, static_cast<int32_t>(plan_.config.num_blocks), trace_.requests);
  for (const auto& r : scheduler_->requests())
    if (r.state == RequestState::Rejected) stats_.rejected.push_back(r.reject_reason);
  row_of_req_.assign(trace_.requests.size(), -1);
}

void Runner::fill_run_stats() {
  stats_.model = model_.name;
  stats_.device = cfg_.device.str();
  stats_.layout = layout_name(plan_.layout);
  stats_.kv_cache_dtype = dtype_name(kv_dtype_);
  stats_.backend = cfg_.backend;
  stats_.num_layers = static_cast<int64_t>(layers_.size());
  stats_.num_requests = static_cast<int64_t>(trace_.requests.size());
  stats_.trace_errors = static_cast<int64_t>(trace_.errors.size());
  stats_.num_blocks = plan_.config.num_blocks;
  stats_.dcp = W();
  stats_.block_size = plan_.block_size;
  stats_.gpu_memory = plan_.gpu_memory;
  stats_.layout_reason = plan_.layout_reason;
  stats_.check_tolerance = tolerance_for(model_.dtype, kv_dtype_);
  for (const auto& gs : plan_.config.kv_cache_groups)
    stats_.groups.push_back(fmt::format("{} layers, {}, block size {}, page {} bytes", gs.layer_names.size(),
                                        kv_cache_spec_kind_name(plan_.config.layer_spec(gs.layer_names.front())->kind()),
                                        gs.kv_cache_spec->block_size(), gs.kv_cache_spec->page_size_bytes()));
}

void Runner::setup_rank(RankState& rs, const std::vector<int64_t>& kernel_block_sizes,
                        const AttentionBackendPtr& backend) {
  if (rs.device.is_cuda()) cuda::set_device(rs.device.index);
  rs.views = allocate_kv_cache(plan_.config, rs.device, plan_.layout, kernel_block_sizes);
  const double scale = 1.0 / std::sqrt(static_cast<double>(model_.head_dim));
  rs.native.resize(layers_.size());
  for (size_t i = 0; i < layers_.size(); ++i) {
    const LayerState& st = layers_[i];
    rs.kv_cache.push_back(rs.views.at(st.name));
    AttentionImplParams p;
    p.num_heads = model_.num_attention_heads / W();
    p.head_size = model_.head_dim;
    p.scale = scale;
    p.num_kv_heads = model_.num_key_value_heads;
    if (st.sliding) p.sliding_window = model_.sliding_window;
    p.kv_cache_dtype = cfg_.kv_cache_dtype;
    auto ni = backend->make_impl(p, rs.cfg);
    ni->process_weights_after_loading(model_.dtype);
    if (rs.comm) ni->set_dcp_group(rs.comm);
    rs.native[i] = AttentionLayer::make(st.name, ni, rs.device);
  }
  for (auto& l : rs.native) rs.registry.add(&l);
  std::vector<AttentionGroup> kv_groups;
  const auto& cfg_groups = plan_.config.kv_cache_groups;
  for (size_t gi = 0; gi < cfg_groups.size(); ++gi) {
    const auto& gs = cfg_groups[gi];
    std::vector<std::string> names;
    for (const auto& name : gs.layer_names)
      if (std::any_of(layers_.begin(), layers_.end(), [&](const LayerState& l) { return l.name == name; }))
        names.push_back(name);
    if (names.empty()) continue;
    auto b = std::make_unique<AttentionGroupBuilders>(backend, names, gs.kv_cache_spec, static_cast<int64_t>(gi), rs.cfg);
    b->create_metadata_builders(kernel_block_sizes[gi], 1);
    kv_groups.push_back(b->kv_group());
    BatchPreparerConfig pc = preparer_config(gs.kv_cache_spec->block_size(), rs.device);
    // The device preparer's block-table copy must be as wide as the InputBatch rows, which
    // follow the builder's 128-token-aligned kernel table: size it from that width (not from
    // max_model_len, which need not be aligned; the scheduler bounds the lengths).
    const int64_t width = b->block_table_width() * kernel_block_sizes[gi] / gs.kv_cache_spec->block_size();
    pc.max_model_len = width * gs.kv_cache_spec->block_size() * W();
    pc.dcp_world_size = W();
    pc.dcp_rank = rs.rank;
    pc.cp_kv_cache_interleave_size = cfg_.dcp_interleave;
    rs.preparers.push_back(std::make_unique<BatchPreparer>(pc));
    rs.builders.push_back(std::move(b));
  }
  rs.step_metadata.assign(rs.builders.size(), nullptr);
  rs.zeroer = std::make_unique<KVBlockZeroer>(rs.device, kv_groups, kernel_block_sizes, rs.views, plan_.config.num_blocks);
  const int64_t T = cfg_.max_num_batched_tokens, Hq = model_.num_attention_heads,
                Hk = model_.num_key_value_heads, D = model_.head_dim;
  rs.q_host = Tensor::empty({T, Hq, D}, model_.dtype);
  rs.k_host = Tensor::empty({T, Hk, D}, model_.dtype);
  rs.v_host = Tensor::empty({T, Hk, D}, model_.dtype);
  rs.out = Tensor::empty({T, Hq / W(), D}, model_.dtype, rs.device);
  rs.qf.resize(static_cast<size_t>(T * Hq * D));
  rs.kf.resize(static_cast<size_t>(T * Hk * D));
  rs.vf.resize(rs.kf.size());
}

// DCP with checks: every rank holds a shard, so the reference reads a host copy of the whole
// KV, written every step with the full K/V and a plain (non-DCP) slot mapping over blocks of
// block_size * W tokens (the scheduler's blocks).
void Runner::setup_shadow_cache(const std::vector<std::string>& attention_layers) {
  std::vector<LayerKVCacheSpec> specs;
  for (const auto& ls : plan_.layer_specs)
    if (std::find(attention_layers.begin(), attention_layers.end(), ls.layer_name) != attention_layers.end())
      specs.push_back({ls.layer_name, ls.spec->copy_with_new_block_size(ls.spec->block_size() * W())});
  const KVCacheConfig shadow = materialize_kv_cache_config(get_kv_cache_groups(specs), KVCacheLayout::LBNHC,
                                                           plan_.config.num_blocks);
  shadow_views_ = allocate_kv_cache(shadow, Device::cpu(), KVCacheLayout::LBNHC);
  for (auto& st : layers_) st.reference_cache = shadow_views_.at(st.name);
}

// Brings every group's InputBatch in line with the scheduler's decisions: rows of requests
// not scheduled this step leave, new ones join, the rest advance and gain their new blocks.
void Runner::update_batches(const SchedulerOutput& out) {
  const int32_t G = static_cast<int32_t>(groups_.size());
  const int32_t bs = scheduler_->config().block_size;
  std::vector<char> scheduled(row_of_req_.size(), 0);
  for (const auto& s : out.scheduled) scheduled[static_cast<size_t>(s.request_id)] = 1;
  InputBatch& b0 = *groups_[0].batch;
  for (int64_t row = b0.num_reqs() - 1; row >= 0; --row) {
    const int64_t id = std::stoll(b0.req_id(row));
    if (scheduled[static_cast<size_t>(id)]) continue;
    const int64_t last = b0.num_reqs() - 1;
    if (row != last) row_of_req_[static_cast<size_t>(std::stoll(b0.req_id(last)))] = row;
    for (auto& g : groups_) g.batch->remove_request(row);
    row_of_req_[static_cast<size_t>(id)] = -1;
  }
  std::vector<int32_t> ids;
  for (const auto& s : out.scheduled) {
    const EngineRequest& r = scheduler_->request(s.request_id);
    int64_t& row = row_of_req_[static_cast<size_t>(s.request_id)];
    for (int32_t gi = 0; gi < G; ++gi) {
      InputBatch& b = *groups_[static_cast<size_t>(gi)].batch;
      if (row < 0) {
        kvattn::RequestState rs;
        rs.req_id = std::to_string(s.request_id);
        rs.num_prompt_tokens = r.spec.prompt_len;
        rs.num_computed_tokens = s.num_computed_before;
        rs.num_scheduled_tokens = s.num_new_tokens;
        const auto& blocks = r.group_blocks(groups_[static_cast<size_t>(gi)].plan_group);
        rs.block_ids.assign(blocks.begin(), blocks.end());
        const int64_t added = b.add_request(rs);
        if (gi == G - 1) row = added;
      } else {
        b.num_computed_tokens_cpu()[static_cast<size_t>(row)] = s.num_computed_before;
        b.num_scheduled_tokens()[static_cast<size_t>(row)] = s.num_new_tokens;
        const auto& blocks = r.group_blocks(groups_[static_cast<size_t>(gi)].plan_group);
        int32_t have = b.num_blocks_per_row()[static_cast<size_t>(row)];
        // A sliding-window group's leading blocks become the null block once they leave the
        // window (the scheduler freed them): rewrite the row from the first such entry.
        if (g_sliding(gi)) {
          const auto cur = b.block_row(row);
          const int32_t lim = std::min<int32_t>(have, s.num_computed_before / bs + 1);
          for (int32_t i = 0; i < lim; ++i)
            if (cur[static_cast<size_t>(i)] != blocks[static_cast<size_t>(i)]) {
              have = i;
              b.num_blocks_per_row()[static_cast<size_t>(row)] = i;
              break;
            }
        }
        ids.assign(blocks.begin() + have, blocks.end());
        if (!ids.empty()) b.append_block_ids(row, ids);
      }
    }
  }
  // Reorder decode -> short extend -> long extend -> prefill; every group's batch holds the
  // same rows with the same counts, so each reorder applies the same permutation.
  for (auto& g : groups_) reorder_batch_to_split_decodes_and_prefills(*g.batch, reorder_threshold_);
  for (int64_t row = 0; row < b0.num_reqs(); ++row) row_of_req_[static_cast<size_t>(std::stoll(b0.req_id(row)))] = row;
}

// Tokens every request of the batch shares as leading blocks (vLLM's common prefix), limited
// to what every request has already computed, in whole blocks.
int64_t Runner::common_prefix_len(const GroupState& g) const {
  const InputBatch& b = *g.batch;
  const int64_t n = b.num_reqs();
  if (n < 2) return 0;
  int64_t common = b.num_blocks_per_row()[0];
  int64_t min_computed = b.num_computed_tokens_cpu()[0];
  const auto row0 = b.block_row(0);
  for (int64_t r = 1; r < n; ++r) {
    const auto row = b.block_row(r);
    int64_t k = 0;
    const int64_t lim = std::min<int64_t>(common, b.num_blocks_per_row()[static_cast<size_t>(r)]);
    while (k < lim && row[static_cast<size_t>(k)] == row0[static_cast<size_t>(k)] && row0[static_cast<size_t>(k)] != 0) ++k;
    common = k;
    min_computed = std::min<int64_t>(min_computed, b.num_computed_tokens_cpu()[static_cast<size_t>(r)]);
    if (common == 0) return 0;
  }
  const int64_t bs = g.spec->block_size();
  return std::min(common * bs, (min_computed / bs) * bs);
}

// Q/K/V of this step's tokens for one layer, in the batch's row order: each element is a
// hash of (seed, layer, request — or its shared prefix for prefix tokens —, position, index).
void Runner::make_qkv(RankState& rs, const LayerState& layer, const InputBatch& batch, int64_t num_tokens) {
  const int64_t Hq = model_.num_attention_heads, Hk = model_.num_key_value_heads, D = model_.head_dim;
  int64_t t = 0;
  for (int64_t row = 0; row < batch.num_reqs(); ++row) {
    const int64_t id = std::stoll(batch.req_id(row));
    const EngineRequest& r = scheduler_->request(id);
    const int32_t start = batch.num_computed_tokens_cpu()[static_cast<size_t>(row)];
    const int32_t n = batch.num_scheduled_tokens()[static_cast<size_t>(row)];
    for (int32_t i = 0; i < n; ++i, ++t) {
      const int64_t pos = start + i;
      const bool in_prefix = r.spec.shared_prefix_id >= 0 && pos < r.spec.shared_prefix_len;
      const uint64_t owner = in_prefix ? (1ULL << 40) + static_cast<uint64_t>(r.spec.shared_prefix_id)
                                       : static_cast<uint64_t>(id);
      const uint64_t base = (cfg_.seed * 0x100000001b3ULL) ^ (static_cast<uint64_t>(layer.model_index) << 56) ^
                            (owner << 20) ^ (static_cast<uint64_t>(pos) * 0x9e3779b1ULL);
      for (int64_t e = 0; e < Hq * D; ++e) rs.qf[static_cast<size_t>(t * Hq * D + e)] = synth_value(base ^ (uint64_t(e) << 1));
      for (int64_t e = 0; e < Hk * D; ++e) {
        rs.kf[static_cast<size_t>(t * Hk * D + e)] = synth_value(base ^ ((uint64_t(e) << 1) | 1) ^ 0x5555ULL);
        rs.vf[static_cast<size_t>(t * Hk * D + e)] = synth_value(base ^ ((uint64_t(e) << 1) | 1) ^ 0xaaaaULL);
      }
    }
  }
  KVATTN_ASSERT(t == num_tokens, "token count {} != {}", t, num_tokens);
  auto store = [&](const std::vector<float>& src, Tensor& dst, int64_t count) {
    Tensor f = Tensor::from_blob(const_cast<float*>(src.data()), {count}, DType::f32);
    dst.view({-1}).narrow(0, 0, count).copy_from(f);
  };
  store(rs.qf, rs.q_host, t * Hq * D);
  store(rs.kf, rs.k_host, t * Hk * D);
  store(rs.vf, rs.v_host, t * Hk * D);
}

// Recomputes a sample of this step's outputs of one layer with the reference backend, from
// the same (already updated) cache — or, under DCP, from the host shadow of every rank's
// shards — and compares with the native output rows saved by the ranks (check_out_).  The sample is every request's last
// kCheckTokensPerRequest query tokens: a request whose chunk starts at c with n tokens
// becomes a sample row with c + n - m computed and m scheduled tokens.
void Runner::check_layer(GroupState& g, LayerState& layer, const CommonAttentionMetadata& cm, int64_t step) {
  const InputBatch& b = *g.batch;
  InputBatch& sb = *g.sample_batch;
  sb.clear();
  std::vector<int64_t> native_rows;  // native token row of each sample token
  std::vector<int32_t> qsl(static_cast<size_t>(b.num_reqs() + 1), 0);
  cm.naive_query_lens(std::span<int32_t>(qsl.data() + 1, static_cast<size_t>(b.num_reqs())));
  for (size_t r = 0; r < static_cast<size_t>(b.num_reqs()); ++r) qsl[r + 1] += qsl[r];
  for (int64_t row = 0; row < b.num_reqs(); ++row) {
    const int32_t c = b.num_computed_tokens_cpu()[static_cast<size_t>(row)];
    const int32_t n = b.num_scheduled_tokens()[static_cast<size_t>(row)];
    const int32_t m = std::min(n, kCheckTokensPerRequest);
    if (m == 0) continue;
    kvattn::RequestState rs;
    rs.req_id = b.req_id(row);
    rs.num_prompt_tokens = b.num_prompt_tokens()[static_cast<size_t>(row)];
    rs.num_computed_tokens = c + n - m;
    rs.num_scheduled_tokens = m;
    const auto blocks = b.block_row(row);
    rs.block_ids.assign(blocks.begin(), blocks.begin() + b.num_blocks_per_row()[static_cast<size_t>(row)]);
    sb.add_request(rs);
    for (int32_t i = n - m; i < n; ++i) native_rows.push_back(qsl[static_cast<size_t>(row)] + i);
  }
  const int64_t Ts = static_cast<int64_t>(native_rows.size());
  const CommonAttentionMetadata& cm_s = g.sample_preparer->prepare(sb);
  const AttentionMetadata& md_ref = g.reference->build_metadata(cm_s);
  Tensor kv_cpu = layer.reference_cache;
  if (!kv_cpu.device().is_cpu()) {
    // The reference reads the cache on the host: copy the backing allocation and rebuild the
    // same strided view over the copy.
    const auto& st = kv_cpu.storage();
    auto host = Buffer::allocate(st->size(), Device::cpu());
    cuda::memcpy(host->data(), st->data(), st->size());
    kv_cpu = Tensor::from_buffer(host, kv_cpu.byte_offset(), kv_cpu.shape(), kv_cpu.strides(), kv_cpu.dtype());
  }
  const int64_t Hq = model_.num_attention_heads, Hk = model_.num_key_value_heads, D = model_.head_dim;
  Tensor qs = Tensor::empty({Ts, Hq, D}, model_.dtype), ks = Tensor::empty({Ts, Hk, D}, model_.dtype),
         vs = Tensor::empty({Ts, Hk, D}, model_.dtype);
  const Tensor got_all = check_out_.narrow(0, 0, cm.num_actual_tokens);
  Tensor got = Tensor::empty({Ts, Hq, D}, model_.dtype);
  for (int64_t i = 0; i < Ts; ++i) {
    const int64_t t = native_rows[static_cast<size_t>(i)];
    qs.select(0, i).copy_from(check_q_.select(0, t));
    ks.select(0, i).copy_from(check_k_.select(0, t));
    vs.select(0, i).copy_from(check_v_.select(0, t));
    got.select(0, i).copy_from(got_all.select(0, t));
  }
  if (step == cfg_.corrupt_output_at_step && Ts > 0) got.set({Ts - 1, 0, 0}, got.get({Ts - 1, 0, 0}) + 1.0);
  Tensor ref_out = Tensor::empty({Ts, Hq, D}, model_.dtype);
  layer.reference.impl->forward(layer.reference, qs, ks, vs, kv_cpu, &md_ref, ref_out);
  const auto a = got.to_double_vector(), r = ref_out.to_double_vector();
  const double tol = tolerance_for(model_.dtype, kv_dtype_);
  double max_err = 0;
  size_t worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double e = std::fabs(a[i] - r[i]);
    if (!(e <= max_err)) {  // NaN-propagating
      max_err = e;
      worst = i;
    }
  }
  stats_.max_check_error = std::max(stats_.max_check_error, max_err);
  stats_.checked_tokens += Ts;
  if (!(max_err <= tol)) {
    const int64_t per_token = Hq * D;
    const int64_t tok = native_rows[worst / static_cast<size_t>(per_token)];
    const int64_t head = (static_cast<int64_t>(worst) % per_token) / D;
    throw RunMismatch(fmt::format(
        "step {}: layer {} (layout {}): the native backend's output differs from the reference by {:.3g} "
        "(tolerance {:.3g}) at token row {}, head {}: native {:.6g}, reference {:.6g}. Rerun with the same trace "
        "and --check-every 1 to reproduce; --backend REFERENCE isolates the native kernels",
        step, layer.name, layout_name(plan_.layout), max_err, tol, tok, head, a[worst], r[worst]));
  }
  ++stats_.checks_passed;
}

// The cascade decision of one group for this step (the same on every rank); never under DCP
// (the backend's DCP paths have no cascade form).
void Runner::decide_cascade(GroupState& g) {
  g.cascade_prefix_len = 0;
  CascadeWhy& why = cascade_why_;
  if (cfg_.cascade == "off") return ++why.off, void();
  if (W() > 1) return ++why.dcp, void();
  const int64_t candidate = common_prefix_len(g);
  if (candidate <= 0) return ++why.no_prefix, void();
  const auto sched = g.batch->num_scheduled_tokens();
  const std::span<const int32_t> qlens(sched.data(), static_cast<size_t>(g.batch->num_reqs()));
  const int64_t num_sms = ranks_[0].cfg.num_sms;
  const bool sliding = g.spec->sliding_window().has_value();
  bool use = false;
  if (cfg_.cascade == "rule") {
    CascadeAttentionQuery q{candidate, qlens, model_.num_attention_heads, model_.num_key_value_heads,
                            false, sliding, false, num_sms, 1};
    use = use_cascade_attention(q);
    if (!use) {
      // The rule's gates, in its order (vllm-facts §7.4), so the summary can say why.
      if (candidate < 256) ++why.short_prefix;
      else if (sliding) ++why.sliding;
      else if (qlens.size() < 8) ++why.few_requests;
      else ++why.flash_decoding;
    }
  } else {
    use = ranks_[0].builders[static_cast<size_t>(&g - groups_.data())]->get_metadata_builder().use_cascade_attention(
        candidate, qlens, model_.num_attention_heads, model_.num_key_value_heads, false, sliding, false, num_sms, 1);
    if (!use) ++why.backend;
  }
  if (use) g.cascade_prefix_len = candidate;
}

std::string Runner::cascade_reason() const {
  const CascadeWhy& w = cascade_why_;
  if (cfg_.cascade == "off") return "off (--cascade off)";
  if (W() > 1) return "off under DCP (the backend's DCP paths have no cascade form)";
  std::vector<std::string> parts;
  auto add = [&](int64_t n, const char* what) {
    if (n > 0) parts.push_back(fmt::format("{} {}", n, what));
  };
  add(w.no_prefix, "without a block-aligned prefix shared by every request of the step");
  add(w.short_prefix, "with a shared prefix shorter than 256 tokens");
  add(w.sliding, "on a sliding-window group");
  add(w.few_requests, "with fewer than 8 requests");
  add(w.flash_decoding, "where flash decoding is estimated faster");
  add(w.backend, "declined by the backend's own hook (vLLM's FlashInfer backend never cascades)");
  const std::string rule = cfg_.cascade == "rule" ? "rule (FlashAttention's use_cascade_attention)" : "backend hook";
  if (parts.empty()) return fmt::format("{}: every step", rule);
  return fmt::format("{}; not used on group-steps: {}", rule, fmt::join(parts, ", "));
}

// One rank's share of a step: zero the new blocks, prepare + build every group's metadata,
// then per layer: Q/K/V, KV-cache write, forward.  Under DCP all ranks run this concurrently
// (one thread each) and meet in the backend's collectives.  For the checked layer the rank
// saves its output heads into check_out_ (rank 0 also its host Q/K/V and, under DCP, writes
// the host shadow cache of every layer).
void Runner::rank_step(RankState& rs, int64_t check_layer_index) {
  rs.timing = StepTiming{};
  if (rs.device.is_cuda()) cuda::set_device(rs.device.index);
  auto tz = Clock::now();
  rs.zeroer->zero_block_ids(zero_ids_);
  rs.timing.attention_us += us_since(tz);
  const int64_t H = model_.num_attention_heads / W();
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    GroupState& g = groups_[gi];
    auto tb = Clock::now();
    const CommonAttentionMetadata& cm = rs.preparers[gi]->prepare(*g.batch);
    rs.step_metadata[gi] = &cm;
    const AttentionMetadata& md = rs.builders[gi]->build_metadata(cm, 0, g.cascade_prefix_len);
    rs.timing.host_us += us_since(tb);
    const int64_t T = cm.num_actual_tokens;
    const CommonAttentionMetadata* shadow = nullptr;
    if (g.shadow_preparer && rs.rank == 0) shadow = &g.shadow_preparer->prepare(*g.batch);
    for (size_t li : g.layers) {
      LayerState& layer = layers_[li];
      make_qkv(rs, layer, *g.batch, T);
      Tensor q = rs.q_host.narrow(0, 0, T), k = rs.k_host.narrow(0, 0, T), v = rs.v_host.narrow(0, 0, T);
      if (W() > 1) q = q.narrow(1, rs.rank * H, H).contiguous();  // this rank's query heads
      if (rs.device.is_cuda()) {
        q = q.to(rs.device);
        k = k.to(rs.device);
        v = v.to(rs.device);
      }
      if (shadow)
        layer.reference.impl->do_kv_cache_update(layer.reference, rs.k_host.narrow(0, 0, T), rs.v_host.narrow(0, 0, T),
                                                 layer.reference_cache, shadow->slot_mapping.narrow(0, 0, T));
      Tensor o = rs.out.narrow(0, 0, T);
      AttentionLayer& native = rs.native[li];
      auto ta = Clock::now();
      native.impl->do_kv_cache_update(native, k, v, rs.kv_cache[li], cm.slot_mapping.narrow(0, 0, T));
      native.impl->forward(native, q, k, v, rs.kv_cache[li], &md, o);
      if (rs.device.is_cuda()) cuda::synchronize();
      rs.timing.attention_us += us_since(ta);
      if (static_cast<int64_t>(li) == check_layer_index) {
        check_out_.narrow(0, 0, T).narrow(1, rs.rank * H, H).copy_from(o.device().is_cpu() ? o : o.to(Device::cpu()));
        if (rs.rank == 0) {
          check_q_ = rs.q_host.narrow(0, 0, T).clone();
          check_k_ = rs.k_host.narrow(0, 0, T).clone();
          check_v_ = rs.v_host.narrow(0, 0, T).clone();
        }
      }
    }
  }
}

RunStats Runner::run(const std::function<void(const RunProgress&)>& on_step) {
  setup();
  const auto t_start = Clock::now();
  int64_t step = 0, finished = 0, tokens = 0;
  double busy_us = 0;
  while (!scheduler_->all_finished()) {
    StepTiming timing;
    auto t0 = Clock::now();
    SchedulerOutput out = scheduler_->schedule(step);
    timing.host_us += us_since(t0);
    if (out.scheduled.empty()) {  // nothing runnable: skip to the next arrival (idle stretches are not stepped)
      step = scheduler_->next_busy_step(step + 1);
      continue;
    }
    // New blocks are zeroed (on every rank) before this step writes them.
    zero_ids_.assign(out.new_block_ids.begin(), out.new_block_ids.end());
    auto tu = Clock::now();
    update_batches(out);
    bool step_cascade = false;
    for (auto& g : groups_) {
      decide_cascade(g);
      step_cascade = step_cascade || g.cascade_prefix_len > 0;
    }
    timing.host_us += us_since(tu);
    timing.tokens = out.total_tokens;
    for (const auto& s : out.scheduled) {
      const auto& r = scheduler_->request(s.request_id);
      const int32_t prompt_part =
          std::max(0, std::min(s.num_computed_before + s.num_new_tokens, r.spec.prompt_len) - s.num_computed_before);
      stats_.prefill_tokens += prompt_part;
      stats_.decode_tokens += s.num_new_tokens - prompt_part;
    }
    const bool check_step = cfg_.check_every > 0 && step % cfg_.check_every == 0;
    const int64_t check_layer_index =
        check_step ? (step / std::max(1, cfg_.check_every)) % static_cast<int64_t>(layers_.size()) : -1;

    // The ranks' work: inline without DCP, one thread per rank with it.
    if (W() == 1) {
      rank_step(ranks_[0], check_layer_index);
    } else {
      std::vector<std::thread> threads;
      for (auto& rs : ranks_)
        threads.emplace_back([&, rsp = &rs] {
          try {
            rank_step(*rsp, check_layer_index);
          } catch (const std::exception& e) {
            rsp->error = e.what();
            if (in_process_group_) in_process_group_->abort();  // peers stop waiting for this rank
            if (nccl_group_) nccl_group_->abort();
          }
        });
      for (auto& t : threads) t.join();
      // The first failing rank's own error (its peers may report the abandoned collective).
      const RankState* failed = nullptr;
      for (const auto& rs : ranks_)
        if (!rs.error.empty() && (failed == nullptr || failed->error.find("abandoned") != std::string::npos))
          failed = &rs;
      if (failed) throw InternalError(fmt::format("step {}: DCP rank {} failed: {}", step, failed->rank, failed->error));
    }
    double rank_host = 0, rank_attn = 0;
    for (const auto& rs : ranks_) {
      rank_host = std::max(rank_host, rs.timing.host_us);
      rank_attn = std::max(rank_attn, rs.timing.attention_us);
    }
    timing.host_us += rank_host;
    timing.attention_us += rank_attn;
    if (check_layer_index >= 0) {
      LayerState& layer = layers_[static_cast<size_t>(check_layer_index)];
      for (size_t gi = 0; gi < groups_.size(); ++gi)
        if (std::find(groups_[gi].layers.begin(), groups_[gi].layers.end(), static_cast<size_t>(check_layer_index)) !=
            groups_[gi].layers.end())
          check_layer(groups_[gi], layer, *ranks_[0].step_metadata[gi], step);
    }
    stats_.cascade_steps += step_cascade;
    stats_.timings.push_back(timing);
    busy_us += timing.attention_us + timing.host_us;
    tokens += out.total_tokens;
    finished += static_cast<int64_t>(scheduler_->update_after_step(out).size());
    stats_.peak_blocks_used = std::max<int64_t>(stats_.peak_blocks_used, int64_t{scheduler_->pool().num_used()});
    ++step;
    if (on_step) {
      RunProgress p;
      p.step = step;
      p.finished = finished;
      p.total = stats_.num_requests - static_cast<int64_t>(stats_.rejected.size());  // those that will finish
      p.tokens = tokens;
      p.elapsed_s = std::chrono::duration<double>(Clock::now() - t_start).count();
      p.busy_s = busy_us * 1e-6;
      p.blocks_used = scheduler_->pool().num_used();
      p.blocks_total = plan_.config.num_blocks - 1;
      on_step(p);
    }
  }
  scheduler_->check_invariants();
  stats_.wall_s = std::chrono::duration<double>(Clock::now() - t_start).count();
  stats_.steps = static_cast<int64_t>(stats_.timings.size());
  stats_.preemptions = scheduler_->num_preemptions();
  stats_.computed_tokens = scheduler_->num_computed_tokens_total();
  stats_.recomputed_tokens = scheduler_->num_recomputed_tokens();
  stats_.cascade_reason = cascade_reason();
  bool all_ok = true;
  for (const auto& r : scheduler_->requests()) {
    if (r.state == RequestState::Rejected) continue;
    stats_.output_tokens += r.num_output_tokens;
    all_ok = all_ok && r.num_output_tokens == r.spec.output_len;
  }
  stats_.all_outputs_correct = all_ok && scheduler_->pool().num_used() == 0;
  return stats_;
}

}  // namespace

SchedulerConfig make_scheduler_config(const KVPlan& plan, int32_t max_num_seqs, int32_t max_num_batched_tokens,
                                      int64_t dcp, bool prefix_sharing) {
  KVATTN_CHECK(dcp >= 1, "dcp must be >= 1, got {}", dcp);
  SchedulerConfig sc;
  sc.block_size = static_cast<int32_t>(plan.block_size * dcp);  // DCP: a block spans W shards
  sc.max_num_seqs = max_num_seqs;
  sc.max_num_batched_tokens = max_num_batched_tokens;
  sc.max_model_len = plan.model.max_model_len;
  sc.enable_prefix_sharing = prefix_sharing;
  sc.groups.clear();
  for (const auto& gs : plan.config.kv_cache_groups) {
    SchedulerGroup g;
    const KVCacheSpecPtr spec = plan.config.layer_spec(gs.layer_names.front());
    if (const AttentionSpec* a = as_attention_spec(spec)) {
      if (a->sliding_window()) {
        g.kind = KVGroupKind::sliding_window;
        g.sliding_window = static_cast<int32_t>(*a->sliding_window());
      }
    } else {
      g.kind = KVGroupKind::state;  // Mamba: one state block per request
    }
    sc.groups.push_back(g);
  }
  return sc;
}

RunStats run_trace(const RunConfig& config, const Trace& trace, const std::function<void(const RunProgress&)>& on_step) {
  KVATTN_CHECK(config.cascade == "rule" || config.cascade == "backend" || config.cascade == "off",
               "unknown --cascade '{}'; valid: rule, backend, off", config.cascade);
  KVATTN_CHECK(config.admission == "reserve" || config.admission == "optimistic",
               "unknown --admission '{}'; valid: reserve, optimistic", config.admission);
  KVATTN_CHECK(config.check_every >= 0, "--check-every must be >= 0, got {}", config.check_every);
  KVATTN_CHECK(config.dcp >= 1 && config.dcp <= 64, "--dcp {} must be in [1, 64] (ranks of decode context parallelism)",
               config.dcp);
  KVATTN_CHECK(config.dcp_comm_backend == "ag_rs" || config.dcp_comm_backend == "a2a",
               "unknown --dcp-comm-backend '{}'; valid: ag_rs, a2a", config.dcp_comm_backend);
  KVATTN_CHECK(config.dcp_transport == "auto" || config.dcp_transport == "nccl" || config.dcp_transport == "in-process",
               "unknown --dcp-transport '{}'; valid: auto, nccl, in-process", config.dcp_transport);
  KVATTN_CHECK(config.dcp_interleave >= 1, "--dcp-interleave must be >= 1, got {}", config.dcp_interleave);
  KVATTN_CHECK(!trace.requests.empty(), "the trace has no valid request{}",
               trace.errors.empty() ? "" : fmt::format(" ({} malformed lines)", trace.errors.size()));
  Runner runner(config, trace);
  return runner.run(on_step);
}

}  // namespace kvattn::engine
