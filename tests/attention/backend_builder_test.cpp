// FlashInferMetadataBuilder / FlashInferImpl: the static decisions, the per-step metadata
// (paged indices, cascade, DCP, CUDA-graph plans, work plans) and every rejection with its reason.
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "kvattn/attention/attention_group_builders.h"
#include "kvattn/attention/native_backend.h"

namespace kvattn {
namespace {

// Layers + config + a hand-made CommonAttentionMetadata.
struct Fixture {
  LayerRegistry registry;
  std::vector<AttentionLayer> layers;
  BackendConfig cfg;
  std::shared_ptr<const AttentionSpec> spec;
  std::vector<AttentionImplParams> params;
  // Step tensors kept alive.
  Tensor qsl, seq, bt, slots;
  CommonAttentionMetadata cm;

  explicit Fixture(std::optional<DeviceCapability> cap = std::nullopt, int64_t num_layers = 1) {
    cfg.platform.capability = cap;
    cfg.model_dtype = DType::bf16;
    cfg.num_attention_heads = 8;
    cfg.num_kv_heads = 2;
    cfg.head_size = 64;
    cfg.max_model_len = 1024;
    cfg.max_num_seqs = 16;
    cfg.max_num_batched_tokens = 512;
    cfg.num_sms = 4;
    cfg.flashinfer_workspace_buffer_size = 0;
    cfg.cache_config.kv_cache_layout = KVCacheLayout::LBNHC;
    cfg.layers = &registry;
    AttentionImplParams p;
    p.num_heads = 8;
    p.num_kv_heads = 2;
    p.head_size = 64;
    p.scale = 0.125;
    params.assign(static_cast<size_t>(num_layers), p);
    spec = FullAttentionSpec(16, 2, 64, DType::bf16);
  }

  std::unique_ptr<FlashInferMetadataBuilder> make() {
    layers.clear();
    layers.reserve(params.size());
    registry = LayerRegistry();
    std::vector<std::string> names;
    for (size_t i = 0; i < params.size(); ++i) {
      auto impl = std::make_shared<FlashInferImpl>(params[i], cfg);
      layers.push_back(AttentionLayer::make("layers." + std::to_string(i), impl));
      names.push_back(layers.back().name);
    }
    for (auto& l : layers) registry.add(&l);
    return std::make_unique<FlashInferMetadataBuilder>(spec, names, cfg);
  }

  // seq_lens / query_lens -> cm with block table rows = r * 100 + c (width `width`).
  const CommonAttentionMetadata& step(std::vector<int32_t> seq_lens, std::vector<int32_t> query_lens,
                                      int64_t width = 64, bool causal = true) {
    const int64_t n = static_cast<int64_t>(seq_lens.size());
    std::vector<int32_t> q(static_cast<size_t>(n + 1), 0);
    for (int64_t r = 0; r < n; ++r) q[r + 1] = q[r] + query_lens[r];
    std::vector<int32_t> table(static_cast<size_t>(n * width));
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < width; ++c) table[r * width + c] = static_cast<int32_t>(r * 100 + c + 1);
    qsl = Tensor::from_vector(q);
    seq = Tensor::from_vector(seq_lens);
    bt = Tensor::from_vector(table, {n, width});
    slots = Tensor::zeros({std::max<int64_t>(q[n], 1)}, DType::i64);
    cm = CommonAttentionMetadata{};
    cm.query_start_loc = qsl;
    cm.query_start_loc_cpu = qsl;
    cm.seq_lens = seq;
    cm.seq_lens_cpu_upper_bound = seq;
    cm.num_reqs = n;
    cm.num_actual_tokens = q[n];
    cm.max_query_len = *std::max_element(query_lens.begin(), query_lens.end());
    cm.max_seq_len = *std::max_element(seq_lens.begin(), seq_lens.end());
    cm.block_table_tensor = bt;
    cm.slot_mapping = slots.narrow(0, 0, q[n]);
    cm.causal = causal;
    return cm;
  }
};

template <typename E>
std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "no exception";
}

#define EXPECT_THROW_WITH(E, stmt, needle)                                                   \
  do {                                                                                       \
    const std::string msg_ = message_of<E>([&] { stmt; });                                   \
    EXPECT_NE(msg_.find(needle), std::string::npos) << "message: " << msg_;                  \
  } while (0)

TEST(BackendBuilder, StaticDecisionsPerPlatform) {
  {
    Fixture f;
    f.cfg.num_speculative_tokens = 2;
    auto b = f.make();
    EXPECT_FALSE(b->decode_kernel().has_value());
    EXPECT_EQ(b->reorder_batch_threshold(), 1);  // no spec-as-decode kernel on CPU
    EXPECT_EQ(b->q_data_type_prefill(), DType::bf16);
    EXPECT_EQ(b->num_qo_heads(), 8);
  }
  {
    Fixture f(DeviceCapability{9, 0});
    f.cfg.num_speculative_tokens = 2;
    auto b = f.make();
    EXPECT_EQ(b->decode_kernel(), FlashInferDecodeKernel::XQA);
    EXPECT_TRUE(b->use_xqa());
    EXPECT_EQ(b->reorder_batch_threshold(), 3);
    EXPECT_FALSE(b->supports_draft_decode_metadata_update());
  }
  {
    Fixture f(DeviceCapability{10, 0});
    f.cfg.num_speculative_tokens = 2;
    f.cfg.parallel_drafting = true;
    auto b = f.make();
    EXPECT_EQ(b->decode_kernel(), FlashInferDecodeKernel::TRTLLM_GEN);
    EXPECT_EQ(b->reorder_batch_threshold(), 5);
    EXPECT_TRUE(b->supports_draft_decode_metadata_update());
  }
  {  // XQA head-dim limit reverts the group to native decode.
    Fixture f(DeviceCapability{9, 0});
    f.spec = FullAttentionSpec(16, 2, 512, DType::bf16);
    for (auto& p : f.params) p.head_size = 512;
    auto b = f.make();
    EXPECT_FALSE(b->decode_kernel().has_value());
    EXPECT_FALSE(b->use_trtllm_decode_attention());
  }
  {  // XQA cannot return LSE: reverted under DCP; DCP also keeps the threshold at 1.
    Fixture f(DeviceCapability{9, 0});
    f.cfg.decode_context_parallel_size = 2;
    f.cfg.num_speculative_tokens = 2;
    auto b = f.make();
    EXPECT_FALSE(b->decode_kernel().has_value());
    EXPECT_EQ(b->reorder_batch_threshold(), 1);
    EXPECT_TRUE(b->use_dcp());
  }
  {  // use_trtllm_attention = False: never the trtllm-API kernels.
    Fixture f(DeviceCapability{10, 0});
    f.cfg.attention_config.use_trtllm_attention = false;
    auto b = f.make();
    EXPECT_FALSE(b->decode_kernel().has_value());
  }
  {  // Adaptive verification makes trtllm-gen decode varlen.
    Fixture f(DeviceCapability{10, 0});
    f.cfg.num_speculative_tokens = 1;
    f.cfg.enable_adaptive_verification = true;
    auto b = f.make();
    EXPECT_TRUE(b->use_trtllm_gen_varlen_decode());
  }
}

TEST(BackendBuilder, QueryDtypePerPhase) {
  auto dtypes = [](std::optional<DeviceCapability> cap, const char* kv, bool disable = false) {
    Fixture f(cap);
    f.cfg.cache_dtype = parse_kv_cache_dtype(kv);
    f.cfg.attention_config.disable_flashinfer_q_quantization = disable;
    AttentionSpecOptions o;
    o.kv_quant_mode = KVQuantMode::FP8_PER_TENSOR;
    f.spec = FullAttentionSpec(16, 2, 64, DType::fp8_e4m3, o);
    for (auto& p : f.params) p.kv_cache_dtype = parse_kv_cache_dtype(kv);
    auto b = f.make();
    return std::make_pair(b->q_data_type_prefill(), b->q_data_type_decode());
  };
  EXPECT_EQ(dtypes(std::nullopt, "fp8"), std::make_pair(DType::bf16, DType::bf16));  // CPU: fa2-like
  EXPECT_EQ(dtypes(DeviceCapability{9, 0}, "fp8"), std::make_pair(DType::fp8_e4m3, DType::bf16));  // XQA decode
  EXPECT_EQ(dtypes(DeviceCapability{10, 0}, "fp8"), std::make_pair(DType::fp8_e4m3, DType::fp8_e4m3));
  EXPECT_EQ(dtypes(DeviceCapability{10, 0}, "fp8_e5m2"), std::make_pair(DType::fp8_e5m2, DType::fp8_e5m2));
  EXPECT_EQ(dtypes(DeviceCapability{8, 9}, "fp8"), std::make_pair(DType::bf16, DType::bf16));
  EXPECT_EQ(dtypes(DeviceCapability{10, 0}, "fp8", true), std::make_pair(DType::bf16, DType::bf16));
}

TEST(BackendBuilder, ConstructionRejectionsWithReasons) {
  {
    Fixture f;
    f.cfg.cache_dtype = KVCacheDType::Nvfp4;
    AttentionSpecOptions o;
    o.kv_quant_mode = KVQuantMode::NVFP4;
    f.spec = FullAttentionSpec(16, 2, 64, DType::u8, o);
    EXPECT_THROW_WITH(Unsupported, f.make(), "kvattn has no NVFP4 KV kernel");
  }
  {
    Fixture f;
    f.spec = FullAttentionSpec(128, 2, 64, DType::bf16);
    EXPECT_THROW_WITH(InvalidArgument, f.make(), "page size 128 needs the trtllm-gen GQA path");
  }
  {
    Fixture f;
    f.spec = FullAttentionSpec(16, 2, 64, DType::f16);
    EXPECT_THROW_WITH(InvalidArgument, f.make(), "must have the model dtype (bfloat16), got float16");
  }
  {
    Fixture f;
    f.cfg.layers = nullptr;
    auto impl = std::make_shared<FlashInferImpl>(f.params[0], f.cfg);
    EXPECT_THROW_WITH(InvalidArgument,
                      (void)FlashInferMetadataBuilder(f.spec, std::vector<std::string>{"x"}, f.cfg),
                      "BackendConfig.layers must hold the attention layers");
  }
  {
    Fixture f;
    f.cfg.decode_context_parallel_size = 2;
    for (auto& p : f.params) p.sliding_window = 64;
    EXPECT_THROW_WITH(Unsupported, f.make(), "DCP does not support sliding window");
  }
  {
    Fixture f;
    f.cfg.dcp_comm_backend = "nccl";
    f.cfg.decode_context_parallel_size = 2;
    EXPECT_THROW_WITH(InvalidArgument, f.make(), "is not one of ['ag_rs', 'a2a']");
  }
}

TEST(BackendBuilder, StepRejectionsWithReasons) {
  {  // sinks + DCP
    Fixture f;
    f.cfg.decode_context_parallel_size = 2;
    for (auto& p : f.params) p.sinks = Tensor::zeros({8}, DType::f32);
    auto b = f.make();
    EXPECT_THROW_WITH(Unsupported, b->build(0, f.step({40, 30}, {1, 1})), "do not support attention sinks");
  }
  {  // sinks + cascade
    Fixture f;
    for (auto& p : f.params) p.sinks = Tensor::zeros({8}, DType::f32);
    auto b = f.make();
    EXPECT_THROW_WITH(Unsupported, b->build(16, f.step({40, 30}, {1, 1})), "do not support attention sinks");
  }
  {  // layers with different windows
    Fixture f(std::nullopt, 2);
    f.params[1].sliding_window = 32;
    auto b = f.make();
    EXPECT_THROW_WITH(InvalidArgument, b->build(0, f.step({40}, {1})), "Window left is not the same for all layers");
  }
  {  // layers with different soft caps
    Fixture f(std::nullopt, 2);
    f.params[1].logits_soft_cap = 30.0;
    auto b = f.make();
    EXPECT_THROW_WITH(InvalidArgument, b->build(0, f.step({40}, {1})),
                      "all layers share the same values for the following hyperparameters");
  }
  {  // ... but when every path is trtllm (per-layer parameters in the impl), they are fine
    Fixture f(DeviceCapability{10, 0}, 2);
    f.params[1].logits_soft_cap = 30.0;
    auto b = f.make();
    EXPECT_NO_THROW(b->build(0, f.step({40, 30}, {1, 1})));
  }
  {  // non-causal with DCP
    Fixture f;
    f.cfg.decode_context_parallel_size = 2;
    auto b = f.make();
    EXPECT_THROW_WITH(Unsupported, b->build(0, f.step({40}, {4}, 64, false)), "non-causal prefill is not supported with DCP");
  }
  {  // cascade: prefix not page-aligned, prefix longer than a request, sliding window
    Fixture f;
    auto b = f.make();
    EXPECT_THROW_WITH(InvalidArgument, b->build(20, f.step({40, 30}, {1, 1})), "must be a multiple of the page size 16");
    EXPECT_THROW_WITH(InvalidArgument, b->build(48, f.step({60, 30}, {1, 1})), "fewer than the 3 shared prefix pages");
    Fixture w;
    for (auto& p : w.params) p.sliding_window = 8;
    auto bw = w.make();
    EXPECT_THROW_WITH(Unsupported, bw->build(16, w.step({40, 30}, {1, 1})), "cascade attention has no sliding-window");
  }
  {  // batch larger than the builder's buffers / block table too narrow / bad query_start_loc
    Fixture f;
    auto b = f.make();
    std::vector<int32_t> many(17, 20), ones(17, 1);
    EXPECT_THROW_WITH(InvalidArgument, b->build(0, f.step(many, ones)), "num_reqs 17 outside [0, max_num_seqs=16]");
    EXPECT_THROW_WITH(InvalidArgument, b->build(0, f.step({100}, {1}, 4)), "block table is narrower than the sequence needs");
    f.step({40}, {1});
    f.cm.num_actual_tokens = 0;
    EXPECT_THROW_WITH(InvalidArgument, b->build(0, f.cm), "end at <= num_actual_tokens");
    f.step({4}, {9});
    EXPECT_THROW_WITH(InvalidArgument, b->build(0, f.cm), "shorter than its query");
  }
  {  // more tokens than max_num_batched_tokens, a negative prefix, a wrong block-table dtype,
     // more pages than the builder holds
    Fixture f;
    auto b = f.make();
    f.step({600}, {600});
    EXPECT_THROW_WITH(InvalidArgument, b->build(0, f.cm), "num_actual_tokens 600 outside [0, max_num_batched_tokens=512]");
    EXPECT_THROW_WITH(InvalidArgument, b->build(-16, f.step({40}, {1})), "common_prefix_len must be >= 0");
    f.step({40}, {1});
    f.cm.block_table_tensor = f.cm.block_table_tensor.to(DType::i64);
    EXPECT_THROW_WITH(InvalidArgument, b->build(0, f.cm), "block_table_tensor must be [>= num_reqs=1, blocks] int32");
    std::vector<int32_t> longs(16, 1100), ones(16, 1);
    EXPECT_THROW_WITH(InvalidArgument, b->build(0, f.step(longs, ones, 80)), "the batch needs 1104 pages but the builder holds 1024");
  }
  {  // configuration checks
    Fixture f;
    f.cfg.num_attention_heads = 6;
    f.cfg.num_kv_heads = 4;
    EXPECT_THROW_WITH(InvalidArgument, f.make(), "must be a multiple of num_kv_heads (4)");
    Fixture g;
    g.cfg.decode_context_parallel_size = 2;
    g.cfg.dcp_rank = 2;
    EXPECT_THROW_WITH(InvalidArgument, g.make(), "dcp_rank 2 must be in [0, decode_context_parallel_size=2)");
  }
}

// A CommonAttentionMetadata whose max_query_len understates the batch: the split's fast path
// then counts every token as a decode token (18 tokens in 4 requests) and the decode plan used to
// read query_start_loc_cpu[18] of 5 entries before checking (ASan: heap-buffer-overflow).
TEST(BackendBuilder, UnderstatedMaxQueryLenIsRefusedBeforeAnyIndexing) {
  Fixture f;
  auto b = f.make();
  CommonAttentionMetadata cm = f.step({40, 30, 20, 20}, {1, 1, 8, 8});
  cm.max_query_len = 1;
  EXPECT_THROW_WITH(InvalidArgument, b->build(0, cm), "max_query_len = 1 understates the batch");
  EXPECT_THROW_WITH(InvalidArgument, b->build(0, cm), "longest query (from query_start_loc_cpu) has 8 tokens");
  // A decreasing query_start_loc is refused with the entries named.
  CommonAttentionMetadata bad = f.step({40, 30}, {1, 1});
  int32_t* q = f.qsl.data_ptr<int32_t>();
  q[1] = 2;
  q[2] = 1;
  bad.num_actual_tokens = 2;
  EXPECT_THROW_WITH(InvalidArgument, b->build(0, bad), "must be non-decreasing, but entry 1 is 2 and entry 2 is 1");
  // The same batch with the true max_query_len builds: 2 decodes, 2 prefills.
  const auto& ok = b->build(0, f.step({40, 30, 20, 20}, {1, 1, 8, 8}));
  EXPECT_EQ(ok.num_decodes, 2);
  EXPECT_EQ(ok.num_decode_tokens, 2);
  EXPECT_EQ(ok.num_prefills, 2);
  EXPECT_EQ(ok.num_prefill_tokens, 16);
}

TEST(BackendBuilder, ImplRejectionsWithReasons) {
  Fixture f;
  AttentionImplParams p = f.params[0];
  p.alibi_slopes = std::vector<float>(8, 0.1f);
  EXPECT_THROW_WITH(Unsupported, FlashInferImpl(p, f.cfg), "ALiBi");
  p = f.params[0];
  p.attn_type = AttentionType::ENCODER_DECODER;
  EXPECT_THROW_WITH(Unsupported, FlashInferImpl(p, f.cfg), "encoder/decoder cross-attention are not implemented");
  p = f.params[0];
  p.sinks = Tensor::zeros({4}, DType::f32);
  EXPECT_THROW_WITH(InvalidArgument, FlashInferImpl(p, f.cfg), "Expected 8, but got 4");
  p = f.params[0];
  p.num_kv_heads = 3;
  EXPECT_THROW_WITH(InvalidArgument, FlashInferImpl(p, f.cfg), "must be a positive multiple of num_kv_heads (3)");
  // Output-quant fusion and NVFP4 have no kvattn kernel.
  auto b = f.make();
  const auto& md = b->build(0, f.step({40}, {1}));
  FlashInferImpl impl(f.params[0], f.cfg);
  AttentionLayer layer = AttentionLayer::make("l", nullptr);
  Tensor q = Tensor::zeros({1, 8, 64}, DType::bf16), out = Tensor::zeros({1, 8, 64}, DType::bf16);
  Tensor kv = Tensor::zeros({8, 2, 16, 128}, DType::bf16);
  EXPECT_THROW_WITH(Unsupported, impl.forward(layer, q, Tensor(), Tensor(), kv, &md, out, Tensor::zeros({1}, DType::f32)),
                    "output quantisation fusion");
  p = f.params[0];
  p.kv_cache_dtype = KVCacheDType::Nvfp4;
  FlashInferImpl nv(p, f.cfg);
  EXPECT_THROW_WITH(Unsupported, nv.do_kv_cache_update(layer, q, q, kv, Tensor::zeros({1}, DType::i64)), "NVFP4");
  EXPECT_THROW_WITH(Unsupported, nv.forward(layer, q, Tensor(), Tensor(), kv, &md, out), "NVFP4");
  // A kv view of the wrong geometry.
  EXPECT_THROW_WITH(InvalidArgument, impl.forward(layer, q, Tensor(), Tensor(), Tensor::zeros({8, 2, 16, 64}, DType::bf16), &md, out),
                    "kv_cache must be the layer's [B, H=2, N, 2*head_size=128] view");
  // Metadata of another backend.
  class Other final : public AttentionMetadata {
   public:
    const char* backend_name() const noexcept override { return "OTHER"; }
  } other;
  EXPECT_THROW_WITH(InvalidArgument, impl.forward(layer, q, Tensor(), Tensor(), kv, &other, out), "built by backend OTHER");
  EXPECT_FALSE(impl.fused_output_quant_supported());
  // Query of the wrong head count.
  EXPECT_THROW_WITH(InvalidArgument,
                    impl.forward(layer, Tensor::zeros({1, 4, 64}, DType::bf16), Tensor(), Tensor(), kv, &md, out),
                    "query must be [>= 1 tokens, 8 heads, 64]");
  // DCP metadata on an impl without a DCP group.
  Fixture d;
  d.cfg.decode_context_parallel_size = 2;
  auto bd = d.make();
  const auto& mdd = bd->build(0, d.step({40}, {1}));
  FlashInferImpl lonely(d.params[0], d.cfg);
  EXPECT_THROW_WITH(InvalidArgument, lonely.forward(layer, q, Tensor(), Tensor(), kv, &mdd, out),
                    "DCP decode needs set_dcp_group()");
}

TEST(BackendBuilder, PagedMetadataOfAMixedBatch) {
  Fixture f;
  auto b = f.make();
  // decode, decode, prefill (seq 17: 2 pages, last 1), prefill (seq 32: 2 pages, last 16)
  const auto& md = b->build(0, f.step({33, 1, 17, 32}, {1, 1, 5, 32}));
  EXPECT_EQ(md.num_decodes, 2);
  EXPECT_EQ(md.num_decode_tokens, 2);
  EXPECT_EQ(md.num_prefills, 2);
  EXPECT_EQ(md.num_prefill_tokens, 37);
  const auto& dec = std::get<FIDecode>(md.decode);
  EXPECT_EQ(dec.wrapper->paged_kv().indptr.to_vector<int32_t>(), (std::vector<int32_t>{0, 3, 4}));
  EXPECT_EQ(dec.wrapper->paged_kv().indices.to_vector<int32_t>(), (std::vector<int32_t>{1, 2, 3, 101}));
  EXPECT_EQ(dec.wrapper->paged_kv().last_page_len.to_vector<int32_t>(), (std::vector<int32_t>{1, 1}));
  const auto& pre = std::get<FIPrefill>(md.prefill);
  ASSERT_NE(pre.wrapper, nullptr);
  EXPECT_EQ(pre.wrapper->paged_kv().indptr.to_vector<int32_t>(), (std::vector<int32_t>{0, 2, 4}));  // rebased
  EXPECT_EQ(pre.wrapper->paged_kv().indices.to_vector<int32_t>(), (std::vector<int32_t>{201, 202, 301, 302}));
  EXPECT_EQ(pre.wrapper->paged_kv().last_page_len.to_vector<int32_t>(), (std::vector<int32_t>{1, 16}));
  EXPECT_EQ(pre.wrapper->paged_kv().kv_lens_cpu.to_vector<int32_t>(), (std::vector<int32_t>{17, 32}));
  EXPECT_EQ(pre.wrapper->qo_indptr().to_vector<int32_t>(), (std::vector<int32_t>{0, 5, 37}));
  EXPECT_TRUE(pre.wrapper->params().causal);
  EXPECT_EQ(pre.wrapper->params().sm_scale, 0.125);
}

TEST(BackendBuilder, HostSeqLensUpperBoundOnlyWithoutSpeculation) {
  // Without speculative tokens the host upper bound is exact and is read (no device sync).
  Fixture f;
  auto b = f.make();
  f.step({40, 50}, {1, 1});
  Tensor upper = Tensor::from_vector(std::vector<int32_t>{48, 64});
  f.cm.seq_lens_cpu_upper_bound = upper;
  const auto& md = b->build(0, f.cm);
  EXPECT_EQ(std::get<FIDecode>(md.decode).wrapper->paged_kv().kv_lens_cpu.to_vector<int32_t>(),
            (std::vector<int32_t>{48, 64}));
  // With speculative tokens the bound is optimistic: the exact seq_lens are read instead.
  Fixture s;
  s.cfg.num_speculative_tokens = 2;
  auto bs = s.make();
  s.step({40, 50}, {1, 1});
  s.cm.seq_lens_cpu_upper_bound = upper;
  const auto& ms = bs->build(0, s.cm);
  EXPECT_EQ(std::get<FIDecode>(ms.decode).wrapper->paged_kv().kv_lens_cpu.to_vector<int32_t>(),
            (std::vector<int32_t>{40, 50}));
}

TEST(BackendBuilder, CascadeMetadataSharesThePrefixPages) {
  Fixture f;
  auto b = f.make();
  const auto& md = b->build(32, f.step({40, 50}, {1, 3}));
  ASSERT_TRUE(md.use_cascade);
  ASSERT_NE(md.cascade_wrapper, nullptr);
  EXPECT_TRUE(std::holds_alternative<std::monostate>(md.prefill));
  EXPECT_TRUE(std::holds_alternative<std::monostate>(md.decode));
  EXPECT_EQ(md.cascade_wrapper->shared_kv_page_indices().to_vector<int32_t>(), (std::vector<int32_t>{1, 2}));
  // Unique level: the pages after the shared ones (40 -> 1 page, 50 -> 2 pages).
  EXPECT_EQ(md.cascade_wrapper->paged_kv().indptr.to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(md.cascade_wrapper->paged_kv().indices.to_vector<int32_t>(), (std::vector<int32_t>{3, 103, 104}));
  EXPECT_EQ(md.cascade_wrapper->paged_kv().last_page_len.to_vector<int32_t>(), (std::vector<int32_t>{8, 2}));
}

TEST(BackendBuilder, DcpPrefillRowsPageTheirLocalContextOnly) {
  Fixture f;
  f.cfg.decode_context_parallel_size = 2;
  f.cfg.dcp_rank = 1;
  auto b = f.make();
  // decode seq 33 -> rank 1 holds 16; prefill seq 40 with 8 new tokens -> context 32 -> 16.
  const auto& md = b->build(0, f.step({33, 40}, {1, 8}));
  const auto& pre = std::get<FIPrefill>(md.prefill);
  ASSERT_NE(pre.dcp, nullptr);
  EXPECT_EQ(pre.dcp->context().paged_kv().kv_lens_cpu.to_vector<int32_t>(), (std::vector<int32_t>{16}));
  EXPECT_EQ(pre.dcp->context().params().num_qo_heads, 16);  // all-gathered over 2 ranks
  EXPECT_FALSE(pre.dcp->context().params().causal);
  EXPECT_TRUE(pre.dcp->new_tokens().params().causal);
  const auto& dec = std::get<FIDecode>(md.decode);
  EXPECT_EQ(dec.wrapper->paged_kv().kv_lens_cpu.to_vector<int32_t>(), (std::vector<int32_t>{16}));
  EXPECT_EQ(dec.wrapper->params().num_qo_heads, 16);
}

TEST(BackendBuilder, CudaGraphDecodePlansOnePerBatchSize) {
  Fixture f;
  f.cfg.cudagraph_decode_full = true;
  auto b = f.make();
  const auto& m3 = b->build(0, f.step({30, 40, 50}, {1, 1, 1}));
  EXPECT_EQ(m3.cudagraph_batch_size, 3);
  const BatchDecodeWrapper* w3 = std::get<FIDecode>(m3.decode).wrapper;
  EXPECT_TRUE(w3->is_cuda_graph_enabled());
  const auto& m5 = b->build(0, f.step({30, 40, 50, 60, 70}, {1, 1, 1, 1, 1}));
  EXPECT_EQ(m5.cudagraph_batch_size, 5);
  EXPECT_NE(std::get<FIDecode>(m5.decode).wrapper, w3);
  // Replaying batch size 3 reuses its plan object (fast plan), with this step's lengths.
  const auto& again = b->build(0, f.step({90, 17, 18}, {1, 1, 1}));
  EXPECT_EQ(std::get<FIDecode>(again.decode).wrapper, w3);
  EXPECT_EQ(w3->paged_kv().kv_lens_cpu.to_vector<int32_t>(), (std::vector<int32_t>{90, 17, 18}));
  EXPECT_EQ(b->num_cudagraph_decode_wrappers(), 2u);
  // Mixed batches never use the graph plans.
  const auto& mixed = b->build(0, f.step({30, 40}, {1, 9}));
  EXPECT_EQ(mixed.cudagraph_batch_size, 0);
  EXPECT_FALSE(std::get<FIDecode>(mixed.decode).wrapper->is_cuda_graph_enabled());
}

TEST(BackendBuilder, TrtllmApiDecodeMetadataAndXqaMasks) {
  Fixture f(DeviceCapability{9, 0});
  f.cfg.num_speculative_tokens = 2;
  auto b = f.make();
  // Uniform spec decode: 3 requests x 3 tokens; the cached causal mask (1 word per row).
  const auto& md = b->build(0, f.step({30, 40, 50}, {3, 3, 3}));
  const auto& d = std::get<FlashInferTrtllmAPIDecode>(md.decode);
  EXPECT_EQ(d.kernel, FlashInferDecodeKernel::XQA);
  EXPECT_EQ(d.q_len_per_req, 3);
  EXPECT_FALSE(d.q_cu_seq_lens.defined());
  EXPECT_EQ(d.mask.to_vector<int32_t>(), (std::vector<int32_t>{1, 3, 7, 1, 3, 7, 1, 3, 7}));
  EXPECT_EQ(d.seq_lens.to_vector<int32_t>(), (std::vector<int32_t>{30, 40, 50}));
  const void* uniform_at = d.mask.data();
  EXPECT_EQ(d.mask.shape(), (Dims{9, 1}));
  // The next uniform step reuses the same mask memory (a CUDA-graph stable address).
  const auto& md2 = b->build(0, f.step({31, 41}, {3, 3}));
  const auto& d2 = std::get<FlashInferTrtllmAPIDecode>(md2.decode);
  EXPECT_EQ(d2.mask.data(), uniform_at);
  EXPECT_EQ(d2.mask.shape(), (Dims{6, 1}));
  // Ragged: rows of each request's own length.
  const auto& mr = b->build(0, f.step({30, 40, 50}, {3, 1, 2}));
  const auto& r = std::get<FlashInferTrtllmAPIDecode>(mr.decode);
  EXPECT_EQ(r.q_len_per_req, 3);
  EXPECT_EQ(r.q_cu_seq_lens.to_vector<int32_t>(), (std::vector<int32_t>{0, 3, 4, 6}));
  EXPECT_EQ(r.mask.to_vector<int32_t>(), (std::vector<int32_t>{1, 3, 7, 1, 1, 3}));
}

TEST(BackendBuilder, DecodeQueryLensFollowTheSeed) {
  Fixture native(DeviceCapability{10, 0});
  auto b = native.make();
  auto ql = [&](FlashInferMetadataBuilder& bb, std::vector<int32_t> qo, int64_t nd, int64_t ndt) {
    auto r = bb.compute_decode_query_lens(qo, nd, ndt);
    return std::make_pair(r.q_len_per_req, r.ragged);
  };
  EXPECT_EQ(ql(*b, {0, 1, 2, 3}, 3, 3), std::make_pair(int64_t{1}, false));
  EXPECT_EQ(ql(*b, {0, 2, 4, 6}, 3, 6), std::make_pair(int64_t{2}, false));
  EXPECT_EQ(ql(*b, {0, 2, 4, 4}, 3, 4), std::make_pair(int64_t{2}, true));  // graph padding after spec decode
  EXPECT_EQ(ql(*b, {0, 1, 2, 2}, 3, 2), std::make_pair(int64_t{1}, false));
  EXPECT_EQ(ql(*b, {0}, 0, 0), std::make_pair(int64_t{1}, false));
  Fixture x(DeviceCapability{9, 0});
  x.cfg.num_speculative_tokens = 3;
  auto bx = x.make();
  EXPECT_EQ(ql(*bx, {0, 3, 4, 6}, 3, 6), std::make_pair(int64_t{3}, true));
  EXPECT_EQ(ql(*bx, {0, 2, 4, 4}, 3, 4), std::make_pair(int64_t{2}, true));
  EXPECT_EQ(ql(*bx, {0, 4, 8}, 2, 8), std::make_pair(int64_t{4}, false));
  EXPECT_EQ(ql(*bx, {0, 1, 1}, 2, 1), std::make_pair(int64_t{1}, false));
}

TEST(BackendBuilder, WorkspaceSizeRule) {
  Fixture f;
  auto b = f.make();
  EXPECT_EQ(b->workspace_size(), 512 * 8 * 64 * 16);  // max_num_batched_tokens * heads * head_dim * 16
  f.cfg.flashinfer_workspace_buffer_size = 64LL << 20;
  EXPECT_EQ(f.make()->workspace_size(), 64LL << 20);  // never below the configured default
  f.cfg.batch_invariant = true;
  EXPECT_EQ(f.make()->workspace_size(), 2048LL * 1024 * 1024);
  f.cfg = Fixture().cfg;
  f.cfg.layers = &f.registry;
  auto c = f.make();
  EXPECT_EQ(c->workspace_buffer().numel(), c->workspace_size());
}

TEST(BackendPlan, DecodeSplitsLongKvWhenTheBatchIsSmall) {
  WorkPlan p(8, 256);
  // 2 requests of 64 pages on a device with 16 concurrent work items, 2 KV heads.
  std::vector<int32_t> kv{1024, 1000};
  p.plan({}, kv, 16, 2, 4, 4, 16, -1, false);
  EXPECT_TRUE(p.split_kv());
  EXPECT_GE(p.kv_chunk_size_pages(), 8);  // >= 128 tokens per chunk
  const auto ri = p.request_indices().to_vector<int32_t>(), ki = p.kv_tile_indices().to_vector<int32_t>();
  ASSERT_EQ(ri.size(), ki.size());
  EXPECT_LE(static_cast<int64_t>(ri.size()) * 2, 16);
  // Every request's chunks cover its pages exactly once, in order.
  for (int32_t r = 0; r < 2; ++r) {
    int32_t expect = 0;
    for (size_t w = 0; w < ri.size(); ++w) {
      if (ri[w] == r) {
        EXPECT_EQ(ki[w], expect++);
      }
    }
    EXPECT_EQ(expect, (kv[r] / 16 + p.kv_chunk_size_pages() - 1) / p.kv_chunk_size_pages());
  }
  const auto o = p.o_indptr().to_vector<int32_t>();
  EXPECT_EQ(o.front(), 0);
  EXPECT_EQ(o.back(), p.num_partial_rows());
  // A large batch fills the device without splitting; disable_split_kv never splits.
  std::vector<int32_t> many(8, 1024);
  p.plan({}, many, 16, 2, 4, 4, 16, -1, false);
  EXPECT_FALSE(p.split_kv());
  EXPECT_EQ(p.num_work_items(), 8);
  p.plan({}, kv, 16, 2, 4, 4, 16, -1, true);
  EXPECT_FALSE(p.split_kv());
  // A fixed split (batch invariance): 2048-token chunks.
  p.plan({}, kv, 16, 2, 4, 4, 16, 512, false);
  EXPECT_EQ(p.kv_chunk_size_pages(), 32);
  EXPECT_EQ(p.num_work_items(), 4);
}

TEST(BackendPlan, PrefillTilesTheQueries) {
  WorkPlan p(4, 1024);
  std::vector<int32_t> qo{0, 100, 101, 300}, kv{100, 50, 400};
  p.plan(qo, kv, 16, 2, 4, prefill_cta_tile_q(300 * 4 / 3), 64, -1, true);
  EXPECT_EQ(p.cta_tile_q(), 128);
  // ceil(100*4/128) + ceil(1*4/128) + ceil(199*4/128) = 4 + 1 + 7
  EXPECT_EQ(p.num_work_items(), 12);
  EXPECT_EQ(p.o_indptr().to_vector<int32_t>(), (std::vector<int32_t>{0, 100, 101, 300}));
  EXPECT_EQ(prefill_cta_tile_q(10), 16);
  EXPECT_EQ(prefill_cta_tile_q(40), 64);
}

TEST(BackendGroup, KernelBlockTablesPerUbatch) {
  Fixture f;
  f.spec = FullAttentionSpec(64, 2, 64, DType::bf16);
  f.make();  // registers the layers
  auto backend = std::make_shared<FlashInferBackend>();
  AttentionGroupBuilders g(backend, {"layers.0"}, f.spec, 0, f.cfg);
  g.create_metadata_builders(16, 2);
  EXPECT_EQ(g.num_metadata_builders(), 2u);
  EXPECT_EQ(g.kv_group().kernel_block_size, std::optional<int64_t>(16));
  EXPECT_EQ(g.builder_spec()->block_size(), 16);
  EXPECT_EQ(g.block_table_width(), 16 * 4);  // cdiv(1024, 64) manager blocks -> 4 kernel blocks each
  // Manager table [[1, 3]] -> kernel blocks [[4..7, 12..15]] in ubatch 1's own table.
  f.step({100}, {1}, 2);
  Tensor manager = Tensor::from_vector(std::vector<int32_t>{1, 3}, {1, 2});
  f.cm.block_table_tensor = manager;
  const auto& md = static_cast<const FlashInferMetadata&>(g.build_metadata(f.cm, 1));
  const auto& dec = std::get<FIDecode>(md.decode);
  EXPECT_EQ(dec.wrapper->paged_kv().indices.to_vector<int32_t>(), (std::vector<int32_t>{4, 5, 6, 7, 12, 13, 14}));
  EXPECT_EQ(dec.wrapper->params().page_size, 16);
  EXPECT_THROW((void)g.get_metadata_builder(2), InvalidArgument);
  // Capture and drafting go through the same mapping.
  EXPECT_NO_THROW((void)g.build_metadata_for_cudagraph_capture(f.cm, 0));
  EXPECT_NO_THROW((void)g.build_metadata_for_drafting(f.cm, 1));
  EXPECT_FALSE(g.supports_draft_decode_metadata_update());
  EXPECT_EQ(get_block_table_width(10, 16), 16);      // rounded to 128 tokens
  EXPECT_EQ(get_block_table_width(10, 64, 16), 40);  // 10 manager blocks (128-token aligned) -> 40
}

}  // namespace
}  // namespace kvattn
