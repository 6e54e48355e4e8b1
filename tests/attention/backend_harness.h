// tests/attention/backend_harness.h — the end-to-end path of an attention backend, in the
// style of vLLM's tests/v1/attention/test_attention_backends.py:
//
//   spec -> KV cache plan + allocate_kv_cache (every layout, kernel-block splitting)
//   -> layers / impls / AttentionGroupBuilders -> context written through do_kv_cache_update
//   -> InputBatch (shuffled) -> reorder_batch_to_split_decodes_and_prefills -> BatchPreparer
//   -> build_metadata -> do_kv_cache_update (this step's K/V) -> forward
//   -> compared with dense attention over the unpaged K/V of every request.
//
// DCP runs W ranks in W threads over an InProcessDcpGroup, each with its own KV cache,
// builder and impl holding its query heads; the oracle is computed over all heads.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kvattn/attention/attention_group_builders.h"
#include "kvattn/attention/backend_registry.h"
#include "kvattn/attention/communicator.h"
#include "kvattn/attention/native_backend.h"
#include "kvattn/attention/reference_backend.h"
#include "kvattn/batch/batch_preparer.h"
#include "kvattn/batch/input_batch.h"
#include "kvattn/batch/slot_mapping.h"
#include "kvattn/core/cuda_runtime_api.h"
#include "kvattn/kv/allocate.h"
#include "kvattn/kv/kv_cache_config.h"

namespace kvattn::test {

struct ReqSpec {
  int32_t seq_len = 0;    // context + this step's query
  int32_t query_len = 0;  // this step's tokens
};

struct BatchSpec {
  std::string name;
  std::vector<ReqSpec> reqs;
};

inline BatchSpec make_batch(std::string name, std::vector<int32_t> seq_lens, std::vector<int32_t> query_lens) {
  BatchSpec b{std::move(name), {}};
  for (size_t i = 0; i < seq_lens.size(); ++i) b.reqs.push_back({seq_lens[i], query_lens[i]});
  return b;
}

// vLLM's BATCH_SPECS, scaled down for a 2-core CPU.
inline std::vector<BatchSpec> standard_batch_specs() {
  return {
      make_batch("small_decode", {32, 40}, {1, 1}),
      make_batch("large_decode", {260, 275, 290, 300, 255, 281, 299, 270}, {1, 1, 1, 1, 1, 1, 1, 1}),
      make_batch("small_prefill", {32, 40}, {8, 8}),
      make_batch("mixed_small", {32, 40, 48, 56}, {1, 1, 5, 5}),
      make_batch("mixed_medium", {96, 128, 160, 96, 128, 160}, {1, 1, 1, 7, 7, 7}),
      make_batch("large_prefill", {192, 160}, {192, 160}),
      make_batch("chunked_prefill", {100, 180, 64}, {30, 64, 64}),
      make_batch("single_decode", {77}, {1}),
      make_batch("single_prefill", {45}, {45}),
  };
}

struct E2EOptions {
  std::string backend = "FLASHINFER";
  KVCacheLayout layout = KVCacheLayout::LBNHC;
  DType dtype = DType::bf16;
  KVCacheDType kv_cache_dtype = KVCacheDType::Auto;
  int64_t num_q_heads = 4;  // total over DCP ranks
  int64_t num_kv_heads = 2;
  int64_t head_size = 64;
  int64_t block_size = 16;  // manager block size
  std::optional<int64_t> kernel_block_size;
  std::optional<int64_t> sliding_window;
  std::optional<double> soft_cap;
  bool sinks = false;
  std::optional<int64_t> num_spec_tokens;
  AttentionPlatform platform;
  AttentionConfig attention_config;
  int64_t common_prefix_len = 0;  // cascade: every request shares this many leading tokens
  int64_t num_layers = 1;         // allocated layers
  bool shared_layer = false;      // + one layer reading layer 0's KV (KV sharing)
  bool causal = true;
  double q_scale = 1.0, k_scale = 1.0, v_scale = 1.0;
  bool cudagraph = false;
  int64_t num_reqs_padded = -1;  // CUDA-graph padding: zero-length requests appended
  int64_t dcp = 1;
  int64_t dcp_interleave = 1;
  std::string dcp_comm_backend = "ag_rs";
  // DCP transport: "in-process" (threads, host staging; ranks share `device`) or "nccl"
  // (rank r on cuda:r).  dcp_device_per_rank puts in-process ranks on cuda:r too.
  std::string dcp_transport = "in-process";
  bool dcp_device_per_rank = false;
  uint32_t seed = 1234;
  bool shuffle = true;
  Device device = Device::cpu();  // where the cache, metadata and step tensors live
};

inline double tolerance_for(DType d) { return d == DType::f32 ? 2e-4 : (d == DType::f16 ? 4e-3 : 2.5e-2); }

inline float round_to(float x, DType d) {
  switch (d) {
    case DType::bf16: return bf16_t::from_float(x).to_float();
    case DType::f16: return f16_t::from_float(x).to_float();
    case DType::fp8_e4m3: return fp8_e4m3_t::from_float(x).to_float();
    case DType::fp8_e5m2: return fp8_e5m2_t::from_float(x).to_float();
    default: return x;
  }
}

// Random request data (values exactly representable in the model dtype).
struct RequestData {
  std::vector<float> k, v;  // [seq_len, Hkv, D]
  std::vector<float> q;     // [query_len, Hq_total, D]
};

struct E2EResult {
  double max_abs_err = 0;
  int64_t checked_values = 0;
  bool poison_intact = true;
  std::string kernel_path;
  std::vector<std::string> errors;  // what each failing rank threw
  // Every output value, [layer][request (spec order)][query token][q head][dim] flattened.
  std::vector<float> outputs;
};

// Largest |a - b| over two runs' outputs of the same batch (infinity on a size mismatch or NaN).
inline double max_output_diff(const E2EResult& a, const E2EResult& b) {
  if (a.outputs.size() != b.outputs.size() || a.outputs.empty()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.outputs.size(); ++i) {
    const double d = std::abs(double(a.outputs[i]) - double(b.outputs[i]));
    m = std::isnan(d) ? INFINITY : std::max(m, d);
  }
  return m;
}

class E2ERunner {
 public:
  explicit E2ERunner(E2EOptions o) : o_(std::move(o)) {}

  E2EResult run(const BatchSpec& batch) {
    make_data(batch);
    req_q_offset_.clear();
    int64_t total_q = 0;
    for (const auto& r : batch.reqs) {
      req_q_offset_.push_back(total_q);
      total_q += r.query_len;
    }
    total_q_ = total_q;
    outputs_.assign(static_cast<size_t>(total_layers() * total_q * o_.num_q_heads * o_.head_size), NAN);
    if (o_.dcp == 1) {
      try {
        E2EResult r = run_rank(batch, 0, nullptr);
        r.outputs = outputs_;
        return r;
      } catch (const std::exception& e) {
        E2EResult r;
        r.errors.push_back(e.what());
        return r;
      }
    }
    std::unique_ptr<InProcessDcpGroup> in_process;
    std::unique_ptr<NcclDcpGroup> nccl;
    if (o_.dcp_transport == "nccl") {
      std::vector<int> devices(static_cast<size_t>(o_.dcp));
      std::iota(devices.begin(), devices.end(), 0);
      nccl = std::make_unique<NcclDcpGroup>(devices);
    } else {
      in_process = std::make_unique<InProcessDcpGroup>(o_.dcp);
    }
    std::vector<E2EResult> results(static_cast<size_t>(o_.dcp));
    std::vector<std::string> errors(static_cast<size_t>(o_.dcp));
    std::vector<std::thread> threads;
    for (int64_t r = 0; r < o_.dcp; ++r)
      threads.emplace_back([&, r] {
        try {
          const Device dev = rank_device(r);
          if (dev.is_cuda()) cuda::set_device(dev.index);
          results[r] = run_rank(batch, r, nccl ? &nccl->communicator(r) : &in_process->communicator(r));
        } catch (const std::exception& e) {
          errors[r] = e.what();
          if (in_process) in_process->abort();  // peers stop waiting for this rank
        }
      });
    for (auto& t : threads) t.join();
    E2EResult all;
    for (int64_t r = 0; r < o_.dcp; ++r) {
      if (!errors[r].empty()) all.errors.push_back(errors[r]);
      all.max_abs_err = std::max(all.max_abs_err, results[r].max_abs_err);
      all.checked_values += results[r].checked_values;
      all.poison_intact = all.poison_intact && results[r].poison_intact;
      all.kernel_path = results[r].kernel_path;
    }
    all.outputs = outputs_;
    return all;
  }

  const E2EOptions& options() const { return o_; }

  Device rank_device(int64_t rank) const {
    if (o_.device.is_cuda() && (o_.dcp_transport == "nccl" || o_.dcp_device_per_rank))
      return Device::cuda(static_cast<int>(rank));
    return o_.device;
  }

 private:
  static std::string layer_name(int64_t i) { return "model.layers." + std::to_string(i) + ".self_attn.attn"; }

  DType kv_spec_dtype() const {
    return kv_cache_storage_dtype(o_.kv_cache_dtype, o_.dtype);
  }
  int64_t total_layers() const { return o_.num_layers + (o_.shared_layer ? 1 : 0); }

  void make_data(const BatchSpec& batch) {
    std::mt19937 rng(o_.seed);
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    const int64_t L = total_layers();
    data_.assign(static_cast<size_t>(L), {});
    for (int64_t l = 0; l < L; ++l) {
      for (const auto& r : batch.reqs) {
        RequestData d;
        d.k.resize(static_cast<size_t>(r.seq_len * o_.num_kv_heads * o_.head_size));
        d.v.resize(d.k.size());
        d.q.resize(static_cast<size_t>(r.query_len * o_.num_q_heads * o_.head_size));
        for (auto& x : d.k) x = round_to(u(rng), o_.dtype);
        for (auto& x : d.v) x = round_to(u(rng), o_.dtype);
        for (auto& x : d.q) x = round_to(u(rng), o_.dtype);
        data_[l].push_back(std::move(d));
      }
      if (o_.common_prefix_len > 0) {  // a shared prefix: same K/V for the leading tokens
        const size_t n = static_cast<size_t>(o_.common_prefix_len * o_.num_kv_heads * o_.head_size);
        for (size_t i = 1; i < data_[l].size(); ++i) {
          std::copy_n(data_[l][0].k.begin(), n, data_[l][i].k.begin());
          std::copy_n(data_[l][0].v.begin(), n, data_[l][i].v.begin());
        }
      }
    }
    sinks_.clear();
    std::uniform_real_distribution<float> us(-0.5f, 1.5f);
    for (int64_t h = 0; h < o_.num_q_heads; ++h) sinks_.push_back(us(rng));
  }

  // The K/V a request's layer reads (layer of a KV-sharing layer = its target).
  int64_t kv_layer_of(int64_t l) const { return (o_.shared_layer && l == o_.num_layers) ? 0 : l; }

  E2EResult run_rank(const BatchSpec& batch, int64_t rank, DcpCommunicator* comm) {
    const int64_t W = o_.dcp;
    const int64_t H = o_.num_q_heads / W;  // this rank's query heads
    const int64_t num_reqs = static_cast<int64_t>(batch.reqs.size());
    const int64_t max_seq = std::max_element(batch.reqs.begin(), batch.reqs.end(), [](auto& a, auto& b) {
                              return a.seq_len < b.seq_len;
                            })->seq_len;
    // A multiple of 128 * W tokens, so the device preparer's block table (cdiv(len / W, block))
    // is exactly as wide as the group's 128-token-aligned kernel table.
    const int64_t align = 128 * W;
    const int64_t max_model_len = (std::max<int64_t>(512, max_seq) + align - 1) / align * align;
    int64_t total_tokens = 0;
    for (const auto& r : batch.reqs) total_tokens += r.query_len;
    const int64_t max_num_seqs = std::max<int64_t>(16, o_.num_reqs_padded);
    const int64_t max_tokens = 2048;

    // ---- spec, plan, allocation ---------------------------------------------------------
    AttentionSpecOptions so;
    so.kv_quant_mode = get_kv_quant_mode(o_.kv_cache_dtype);
    auto spec = FullAttentionSpec(o_.block_size, o_.num_kv_heads, o_.head_size, kv_spec_dtype(), so);
    std::vector<LayerKVCacheSpec> layers;
    for (int64_t l = 0; l < o_.num_layers; ++l) layers.push_back({layer_name(l), spec});
    const auto groups = get_kv_cache_groups(layers);
    // Blocks: per request cdiv(local tokens, block) + 1, and the null block.
    int64_t blocks_needed = 1;
    for (const auto& r : batch.reqs) blocks_needed += r.seq_len / (o_.block_size * W) + 2;
    const int64_t num_blocks = blocks_needed + 3;
    KVCacheConfig kv_config = materialize_kv_cache_config(groups, o_.layout, num_blocks);
    std::optional<std::vector<int64_t>> kbs;
    if (o_.kernel_block_size) kbs = std::vector<int64_t>{*o_.kernel_block_size};
    const Device dev = rank_device(rank);
    KVCacheViews views = allocate_kv_cache(kv_config, dev, o_.layout, kbs);
    // Poison the cache so a read of an unwritten slot shows (host caches; device ones are zero).
    if (dev.is_cpu())
      for (auto& [name, view] : views)
        std::fill_n(static_cast<uint8_t*>(view.storage()->data()), view.storage()->size(), uint8_t{0x47});

    // ---- backend, layers, group ---------------------------------------------------------
    AttentionBackendPtr backend = AttentionBackendRegistry::global().get(o_.backend);
    LayerRegistry registry;
    BackendConfig cfg;
    cfg.platform = o_.platform;
    cfg.platform.device = dev;
    cfg.model_dtype = o_.dtype;
    cfg.num_attention_heads = H;
    cfg.num_kv_heads = o_.num_kv_heads;
    cfg.head_size = o_.head_size;
    cfg.max_model_len = max_model_len;
    cfg.max_num_seqs = max_num_seqs;
    cfg.max_num_batched_tokens = max_tokens;
    cfg.num_speculative_tokens = o_.num_spec_tokens;
    cfg.decode_context_parallel_size = W;
    cfg.dcp_rank = rank;
    cfg.cp_kv_cache_interleave_size = o_.dcp_interleave;
    cfg.dcp_comm_backend = o_.dcp_comm_backend;
    cfg.cache_dtype = o_.kv_cache_dtype;
    cfg.cache_config.kv_cache_layout = o_.layout;
    cfg.cudagraph_decode_full = o_.cudagraph;
    cfg.attention_config = o_.attention_config;
    cfg.flashinfer_workspace_buffer_size = 0;
    cfg.num_sms = 8;
    cfg.layers = &registry;
    const double scale = 1.0 / std::sqrt(static_cast<double>(o_.head_size));
    std::vector<AttentionLayer> attn_layers(static_cast<size_t>(total_layers()));
    std::vector<std::string> names;
    Tensor sinks_local;
    if (o_.sinks) sinks_local = to_dev(dev, Tensor::from_vector(std::vector<float>(sinks_.begin() + rank * H, sinks_.begin() + (rank + 1) * H)));
    for (int64_t l = 0; l < total_layers(); ++l) {
      AttentionImplParams p;
      p.num_heads = H;
      p.head_size = o_.head_size;
      p.scale = scale;
      p.num_kv_heads = o_.num_kv_heads;
      p.sliding_window = o_.sliding_window;
      p.kv_cache_dtype = o_.kv_cache_dtype;
      p.logits_soft_cap = o_.soft_cap;
      if (kv_layer_of(l) != l) p.kv_sharing_target_layer_name = layer_name(kv_layer_of(l));
      if (o_.sinks) p.sinks = sinks_local;
      auto impl = backend->make_impl(p, cfg);
      impl->process_weights_after_loading(o_.dtype);
      if (comm) impl->set_dcp_group(comm);
      attn_layers[l] = AttentionLayer::make(layer_name(l), impl, dev);
      attn_layers[l].set_scales(o_.q_scale, o_.k_scale, o_.v_scale);
      registry.add(&attn_layers[l]);
      names.push_back(layer_name(l));
    }
    AttentionGroupBuilders group(backend, names, spec, 0, cfg);
    group.create_metadata_builders(o_.kernel_block_size, 1);
    AttentionMetadataBuilder& builder = group.get_metadata_builder();
    const int32_t threshold = static_cast<int32_t>(builder.reorder_batch_threshold().value_or(1));

    // ---- blocks: a random permutation of the pool, block 0 reserved --------------------
    std::mt19937 rng(o_.seed + 17);
    std::vector<int32_t> pool(static_cast<size_t>(num_blocks - 1));
    std::iota(pool.begin(), pool.end(), 1);
    std::shuffle(pool.begin(), pool.end(), rng);
    size_t next = 0;
    const int64_t local_block_tokens = o_.block_size;  // one manager block per rank per W*block tokens
    std::vector<std::vector<int32_t>> block_ids(static_cast<size_t>(num_reqs));
    std::vector<int32_t> shared_prefix;
    const int64_t prefix_blocks = o_.common_prefix_len / o_.block_size;
    for (int64_t i = 0; i < prefix_blocks; ++i) shared_prefix.push_back(pool[next++]);
    for (int64_t r = 0; r < num_reqs; ++r) {
      const int64_t nblk = (batch.reqs[r].seq_len + local_block_tokens * W - 1) / (local_block_tokens * W);
      for (int64_t i = 0; i < nblk; ++i)
        block_ids[r].push_back(i < prefix_blocks ? shared_prefix[i] : pool[next++]);
    }

    // ---- context: written through the impl, positions [0, context) ----------------------
    SlotMappingParams sp;
    sp.block_size = o_.block_size;
    sp.dcp_world_size = W;
    sp.dcp_rank = rank;
    sp.cp_kv_cache_interleave_size = o_.dcp_interleave;
    // The block table rows are as wide as the group's persistent kernel table (manager blocks).
    const int64_t max_blocks_per_req =
        group.block_table_width() * o_.kernel_block_size.value_or(o_.block_size) / o_.block_size;
    for (int64_t r = 0; r < num_reqs; ++r) {
      const int64_t ctx = batch.reqs[r].seq_len - batch.reqs[r].query_len;
      if (ctx == 0) continue;
      std::vector<int32_t> qsl{0, static_cast<int32_t>(ctx)};
      std::vector<int64_t> pos(static_cast<size_t>(ctx));
      std::iota(pos.begin(), pos.end(), 0);
      std::vector<int32_t> bt(static_cast<size_t>(max_blocks_per_req), 0);
      std::copy(block_ids[r].begin(), block_ids[r].end(), bt.begin());
      Tensor bt_t = Tensor::from_vector(bt, {1, max_blocks_per_req});
      Tensor slots = compute_slot_mapping(Tensor::from_vector(qsl), Tensor::from_vector(pos), bt_t, sp);
      for (int64_t l = 0; l < o_.num_layers; ++l) {
        Tensor k = to_dev(dev, kv_tensor(data_[l][r].k, 0, ctx));
        Tensor v = to_dev(dev, kv_tensor(data_[l][r].v, 0, ctx));
        attn_layers[l].impl->do_kv_cache_update(attn_layers[l], k, v, views.at(layer_name(l)), to_dev(dev, slots));
      }
    }

    // ---- the step's batch: shuffled, reordered, prepared --------------------------------
    InputBatch ib(max_num_seqs, max_blocks_per_req);
    std::vector<int64_t> order(static_cast<size_t>(num_reqs));
    std::iota(order.begin(), order.end(), 0);
    if (o_.shuffle) std::shuffle(order.begin(), order.end(), rng);
    for (int64_t r : order) {
      RequestState rs;
      rs.req_id = std::to_string(r);
      const int32_t ctx = batch.reqs[r].seq_len - batch.reqs[r].query_len;
      rs.num_computed_tokens = ctx;
      rs.num_scheduled_tokens = batch.reqs[r].query_len;
      // Decode-like requests (short query after a context) have finished their prompt.
      rs.num_prompt_tokens = (ctx > 0 && batch.reqs[r].query_len <= threshold) ? ctx : batch.reqs[r].seq_len;
      rs.block_ids = block_ids[r];
      ib.add_request(rs);
    }
    reorder_batch_to_split_decodes_and_prefills(ib, threshold);
    BatchPreparerConfig pc;
    pc.max_num_reqs = max_num_seqs;
    pc.max_num_batched_tokens = max_tokens;
    pc.max_model_len = max_model_len;
    pc.block_size = o_.block_size;
    pc.dcp_world_size = W;
    pc.dcp_rank = rank;
    pc.cp_kv_cache_interleave_size = o_.dcp_interleave;
    pc.num_blocks = num_blocks;
    pc.causal = o_.causal;
    pc.device = dev;
    BatchPreparer prep(pc);
    const int64_t padded_tokens = total_tokens + 3;
    const CommonAttentionMetadata& cm0 = prep.prepare(ib, o_.num_reqs_padded, padded_tokens);
    CommonAttentionMetadata cm = cm0;  // seq_lens_cpu_upper_bound: exact host lengths
    // Request of each row.
    std::vector<int64_t> row_req;
    for (const auto& id : ib.req_ids()) row_req.push_back(std::stoll(id));

    // ---- this step's tensors (rows in batch order, padded) ------------------------------
    const int64_t L = total_layers();
    std::vector<Tensor> q(L), k(L), v(L);
    for (int64_t l = 0; l < L; ++l) {
      std::vector<float> qv(static_cast<size_t>(padded_tokens * H * o_.head_size), 0.f);
      std::vector<float> kv(static_cast<size_t>(padded_tokens * o_.num_kv_heads * o_.head_size), 0.f);
      std::vector<float> vv(kv.size(), 0.f);
      int64_t t = 0;
      for (int64_t row = 0; row < num_reqs; ++row) {
        const int64_t r = row_req[row];
        const auto& d = data_[l][r];
        const int64_t ql = batch.reqs[r].query_len, ctx = batch.reqs[r].seq_len - ql;
        for (int64_t i = 0; i < ql; ++i, ++t) {
          for (int64_t h = 0; h < H; ++h)
            std::copy_n(&d.q[((i * o_.num_q_heads) + rank * H + h) * o_.head_size], o_.head_size,
                        &qv[(t * H + h) * o_.head_size]);
          const size_t kvrow = static_cast<size_t>(o_.num_kv_heads * o_.head_size);
          std::copy_n(&d.k[(ctx + i) * kvrow], kvrow, &kv[t * kvrow]);
          std::copy_n(&d.v[(ctx + i) * kvrow], kvrow, &vv[t * kvrow]);
        }
      }
      q[l] = to_dev(dev, Tensor::from_vector(qv, {padded_tokens, H, o_.head_size}).to(o_.dtype));
      k[l] = to_dev(dev, Tensor::from_vector(kv, {padded_tokens, o_.num_kv_heads, o_.head_size}).to(o_.dtype));
      v[l] = to_dev(dev, Tensor::from_vector(vv, {padded_tokens, o_.num_kv_heads, o_.head_size}).to(o_.dtype));
    }

    // ---- build, update, forward -----------------------------------------------------------
    const AttentionMetadata& md = group.build_metadata(cm, 0, o_.common_prefix_len);
    E2EResult res;
    res.kernel_path = describe(md);
    for (int64_t l = 0; l < L; ++l)
      attn_layers[l].impl->do_kv_cache_update(attn_layers[l], k[l], v[l], views.at(layer_name(kv_layer_of(l))),
                                              cm.slot_mapping.narrow(0, 0, total_tokens));
    const float poison = 512.f;  // exact in every output dtype
    for (int64_t l = 0; l < L; ++l) {
      Tensor out = Tensor::empty({padded_tokens, H, o_.head_size}, o_.dtype);
      out.fill_(poison);
      out = to_dev(dev, out);
      const bool sharing = kv_layer_of(l) != l;
      attn_layers[l].impl->forward(attn_layers[l], q[l], sharing ? Tensor() : k[l], sharing ? Tensor() : v[l],
                                   views.at(layer_name(kv_layer_of(l))), &md, out);
      check_output(batch, row_req, l, rank, H, dev.is_cpu() ? out : out.to(Device::cpu()), total_tokens, poison, res);
    }
    return res;
  }

  static Tensor to_dev(Device dev, const Tensor& t) { return dev.is_cpu() ? t : t.contiguous().to(dev); }

  Tensor kv_tensor(const std::vector<float>& src, int64_t begin, int64_t n) const {
    const int64_t row = o_.num_kv_heads * o_.head_size;
    std::vector<float> part(src.begin() + begin * row, src.begin() + (begin + n) * row);
    return Tensor::from_vector(part, {n, o_.num_kv_heads, o_.head_size}).to(o_.dtype);
  }

  static std::string describe(const AttentionMetadata& md) {
    if (std::string_view(md.backend_name()) != "FLASHINFER") return md.backend_name();
    const auto& m = static_cast<const FlashInferMetadata&>(md);
    if (m.use_cascade) return "cascade";
    std::string s = "prefill=";
    if (std::holds_alternative<std::monostate>(m.prefill)) s += "none";
    else if (const auto* p = std::get_if<FIPrefill>(&m.prefill)) s += p->dcp ? "dcp" : "native";
    else s += "trtllm";
    s += " decode=";
    if (std::holds_alternative<std::monostate>(m.decode)) s += "none";
    else if (std::holds_alternative<FIDecode>(m.decode)) s += "native";
    else s += decode_kernel_name(std::get<FlashInferTrtllmAPIDecode>(m.decode).kernel);
    return s;
  }

  void check_output(const BatchSpec& batch, const std::vector<int64_t>& row_req, int64_t l, int64_t rank, int64_t H,
                    const Tensor& out, int64_t total_tokens, float poison, E2EResult& res) {
    const int64_t D = o_.head_size, Hkv = o_.num_kv_heads;
    const int64_t kl = kv_layer_of(l);
    const bool fp8_kv = is_fp8(o_.kv_cache_dtype);
    const DType kvd = kv_spec_dtype();
    // fp8 queries (SM90 prefill / SM100) are quantised by the backend: the oracle does the same.
    const bool fp8_q = fp8_kv && !o_.attention_config.disable_flashinfer_q_quantization &&
                       (o_.platform.is_device_capability(90) || o_.platform.is_device_capability_family(100));
    const std::vector<double> got = out.to_double_vector();
    int64_t t = 0;
    for (size_t row = 0; row < row_req.size(); ++row) {
      const int64_t r = row_req[row];
      const int64_t ql = batch.reqs[r].query_len, seq = batch.reqs[r].seq_len;
      const auto& d = data_[l][r];
      const auto& dk = data_[kl][r];
      std::vector<float> qv(static_cast<size_t>(ql * o_.num_q_heads * D));
      for (size_t i = 0; i < qv.size(); ++i) qv[i] = d.q[i];
      const bool prefill_row = ql > 1 || (seq == ql);
      // SM90 quantises only the prefill query (XQA decode keeps the model dtype).
      const bool quant_q = fp8_q && (o_.platform.is_device_capability_family(100) || prefill_row);
      if (quant_q)
        for (auto& x : qv) x = round_to(static_cast<float>(x / o_.q_scale), kvd) * static_cast<float>(o_.q_scale);
      std::vector<float> kv(dk.k.begin(), dk.k.begin() + seq * Hkv * D), vv(dk.v.begin(), dk.v.begin() + seq * Hkv * D);
      if (fp8_kv) {
        for (auto& x : kv) x = round_to(static_cast<float>(x / o_.k_scale), kvd) * static_cast<float>(o_.k_scale);
        for (auto& x : vv) x = round_to(static_cast<float>(x / o_.v_scale), kvd) * static_cast<float>(o_.v_scale);
      }
      DenseAttentionArgs a;
      a.query = Tensor::from_vector(qv, {ql, o_.num_q_heads, D});
      a.key = Tensor::from_vector(kv, {seq, Hkv, D});
      a.value = Tensor::from_vector(vv, {seq, Hkv, D});
      a.sm_scale = 1.0 / std::sqrt(static_cast<double>(D));
      a.causal = o_.causal;
      a.window_left = o_.sliding_window ? *o_.sliding_window - 1 : -1;
      a.logits_soft_cap = o_.soft_cap.value_or(0.0);
      if (o_.sinks) a.sinks = Tensor::from_vector(sinks_);
      const std::vector<double> want = dense_attention_reference(a).to_double_vector();
      const double tol = tolerance_for(o_.dtype) * (fp8_kv ? 2.0 : 1.0);
      for (int64_t i = 0; i < ql; ++i, ++t)
        for (int64_t h = 0; h < H; ++h)
          for (int64_t c = 0; c < D; ++c) {
            const double g = got[static_cast<size_t>((t * H + h) * D + c)];
            const double w = want[static_cast<size_t>((i * o_.num_q_heads + rank * H + h) * D + c)];
            const double err = std::abs(g - w);
            outputs_[static_cast<size_t>(
                (((l * total_q_ + req_q_offset_[static_cast<size_t>(r)] + i) * o_.num_q_heads) + rank * H + h) * D + c)] =
                static_cast<float>(g);
            res.max_abs_err = std::max(res.max_abs_err, std::isfinite(err) ? err : 1e30);
            ++res.checked_values;
            if (!(err <= tol + tol * std::abs(w)) && res.checked_values < 1000000) {
              ADD_FAILURE() << "layer " << l << " rank " << rank << " request " << r << " (seq " << seq << ", q " << ql
                            << ") row " << i << " head " << h << " dim " << c << ": got " << g << ", want " << w;
              res.checked_values = 1000000;  // report the first mismatch only
            }
          }
    }
    for (int64_t tt = total_tokens; tt < out.size(0); ++tt)
      res.poison_intact = res.poison_intact && got[static_cast<size_t>(tt * H * D)] == poison;
  }

  E2EOptions o_;
  std::vector<std::vector<RequestData>> data_;  // [layer][request]
  std::vector<float> sinks_;                    // [num_q_heads]
  std::vector<int64_t> req_q_offset_;           // first query token of each request (spec order)
  int64_t total_q_ = 0;
  std::vector<float> outputs_;                  // see E2EResult::outputs (ranks write disjoint heads)
};

// Runs `spec` and checks it against the oracle; returns the result for extra assertions.
inline E2EResult expect_matches_oracle(const E2EOptions& o, const BatchSpec& spec) {
  E2ERunner runner(o);
  E2EResult r = runner.run(spec);
  for (const auto& e : r.errors) ADD_FAILURE() << spec.name << ": " << e;
  EXPECT_GT(r.checked_values, 0) << spec.name;
  EXPECT_TRUE(r.poison_intact) << spec.name << ": rows past num_actual_tokens were written";
  EXPECT_LE(r.max_abs_err, tolerance_for(o.dtype) * 4) << spec.name << " via " << r.kernel_path;
  return r;
}

}  // namespace kvattn::test
