// The CUDA forward pass (CudaTransformer through ModelRunner) of every architecture against the
// independent float64 NumPy reference (reference_forward.py), as forward_test.cpp and
// llm_model_test.cpp check the CPU forward: batched prefill, chunked prefill + decode, NHD and
// HND KV layouts, an fp8 KV cache, greedy generation batched, chunked and under preemption;
// compute in f32, bf16 and f16, on the test models with head_dim 64.  Skipped without a CUDA
// device.
//
// Tolerances.  f32 compute: max |Δlogit| <= 1e-3, as on the CPU (cuBLAS runs f32 GEMMs without
// TF32).  bf16 / f16 compute round every activation and the residual stream; how far that
// alone moves the logits is measured per model by the reference itself
// (reference_forward.py --round bf16|f16 rounds the activations where the CUDA forward stores
// them), and the bound is twice that deviation plus 1e-3.  On these models the deviation is
// 0.9-5.7 % of max |logit| for bf16 and 0.1-0.6 % for f16 (qwen2_window and qwen2 largest).
// Greedy tokens must equal the reference's until the reference's top-2 margin falls below
// twice the bound (a near tie either token may win); nothing after the first such difference
// is compared.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "forward_test.h"
#include "kvattn/core/cuda_runtime_api.h"
#include "kvattn/kv/kv_cache_layout.h"
#include "kvattn/model/llm.h"
#include "kvattn/model/model_dir.h"
#include "kvattn/model/model_runner.h"

namespace kvattn::model {
namespace {

using testing::generator_args;
using testing::kLengths;
using testing::Outcome;
using testing::ReferenceModel;
using testing::run_prompts;

std::string fmt_name(const char* pattern, const char* mode) {
  char buf[96];
  std::snprintf(buf, sizeof buf, pattern, mode);
  return buf;
}

#define SKIP_WITHOUT_GPU() \
  if (!cuda::available()) GTEST_SKIP() << "no CUDA device"

// The CPU tests' models with head_dim 64 (the CUDA attention kernels exist for head_dim 64,
// 128, 256; the CPU tests use 16).  Qwen2 derives head_dim from hidden_size / 4 heads.
std::string cuda_generator_args(const std::string& arch) {
  return generator_args(arch) + (arch.starts_with("qwen2") ? " --hidden 256" : " --head-dim 64");
}

// A test model with its reference and how far rounding the reference's activations to bf16 /
// f16 alone moves its logits (reference_forward.py --round): max |rounded - exact| over every
// reference row; dev_bf16_fp8 the same with K/V rounded to fp8 e4m3 in both (--kv-fp8), where
// an activation's bf16 rounding can move a key or value by a whole fp8 step, so bf16 moves the
// fp8 reference's logits several times more than the exact reference's.
struct CudaModel {
  ReferenceModel ref;
  double dev_bf16 = 0, dev_f16 = 0, dev_bf16_fp8 = 0;
};

double rounding_deviation(const ReferenceModel& m, const char* mode, bool kv_fp8 = false) {
  namespace fs = std::filesystem;
  const std::string tag = std::string(mode) + (kv_fp8 ? "_fp8" : "");
  const fs::path out = m.dir / fmt_name("reference_logits_%s.bin", tag.c_str());
  testing::reference_output(m, out, std::string("--round ") + mode + (kv_fp8 ? " --kv-fp8" : ""));
  const std::string rounded = testing::read_file(out),
                    exact = testing::read_file(m.dir / (kv_fp8 ? "reference_logits_fp8.bin" : "reference_logits.bin"));
  EXPECT_EQ(rounded.size(), exact.size());
  const auto* a = reinterpret_cast<const double*>(rounded.data());
  const auto* b = reinterpret_cast<const double*>(exact.data());
  double d = 0;
  for (size_t i = 0; i < std::min(rounded.size(), exact.size()) / sizeof(double); ++i)
    d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

const CudaModel& model_for(const std::string& arch) {
  static std::map<std::string, CudaModel> cache;
  auto it = cache.find(arch);
  if (it == cache.end()) {
    CudaModel m;
    m.ref = testing::reference_model(arch, cuda_generator_args(arch), kLengths, 4, 11);
    m.dev_bf16 = rounding_deviation(m.ref, "bf16");
    m.dev_f16 = rounding_deviation(m.ref, "f16");
    m.dev_bf16_fp8 = rounding_deviation(m.ref, "bf16", true);
    it = cache.emplace(arch, std::move(m)).first;
  }
  return it->second;
}

// The logit error bound of a compute dtype on model `m`: f32 1e-3 (as on the CPU); 16-bit:
// twice what rounding the reference's activations to that dtype moves its logits (the CUDA
// forward rounds at the same points, with its own rounding errors), plus the f32 bound.
double bound(DType t, const CudaModel& m) {
  if (t == DType::f32) return 1e-3;
  return 2 * (t == DType::f16 ? m.dev_f16 : m.dev_bf16) + 1e-3;
}

ModelRunner::Options options(DType t, std::optional<KVCacheLayout> layout = std::nullopt,
                             KVCacheDType kv_dtype = KVCacheDType::Auto) {
  ModelRunner::Options o;
  o.device = Device::cuda(0);
  o.compute_dtype = t;
  o.kv_cache_dtype = kv_dtype;
  o.layout = layout;
  o.kv_cache_memory = 8 << 20;
  o.max_model_len = 256;
  o.block_size = 16;
  o.max_num_seqs = 8;
  o.max_num_batched_tokens = 128;
  return o;
}

struct Case {
  std::string arch;
  DType dtype;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  return info.param.arch + "_" + dtype_name(info.param.dtype);
}

std::vector<Case> cases() {
  std::vector<Case> c;
  for (const char* arch : {"llama", "mistral", "qwen2", "qwen3", "gemma2", "qwen2_window"})
    for (DType t : {DType::f32, DType::bf16, DType::f16}) c.push_back({arch, t});
  return c;
}

class CudaForwardTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
  const CudaModel& cm() { return model_for(GetParam().arch); }
  const ReferenceModel& model() { return cm().ref; }
  ModelDir open() { return open_model_dir(model().dir, /*require_tokenizer=*/false); }
  DType dtype() const { return GetParam().dtype; }
  std::string what() const { return GetParam().arch + " " + dtype_name(GetParam().dtype); }
};

TEST_P(CudaForwardTest, BatchedPrefillMatchesReference) {
  const ModelDir dir = open();
  ModelRunner runner(dir, options(dtype()));
  EXPECT_EQ(runner.compute_dtype(), dtype());
  EXPECT_EQ(runner.kv_cache_dtype(), dtype());  // "auto" follows the compute dtype
  EXPECT_GT(runner.weight_bytes(), 0);
  EXPECT_GT(runner.kv_cache_bytes(), 0);
  const Outcome o = run_prompts(runner, model(), 0, 0);
  const double b = bound(dtype(), cm());
  std::printf("%s batched prefill: max |dlogit| %.3g (bound %.3g; max |logit| %.3g; the reference's own bf16 / f16 "
              "rounding moves it %.3g / %.3g)\n",
              what().c_str(), o.max_err, b, o.max_ref, cm().dev_bf16, cm().dev_f16);
  EXPECT_EQ(o.steps, 1);
  EXPECT_EQ(o.compared_rows, static_cast<int64_t>(kLengths.size()));
  EXPECT_LE(o.max_err, b);
  EXPECT_GE(o.max_ref, 0.5);
}

TEST_P(CudaForwardTest, ChunkedPrefillThenDecodeMatchesReference) {
  const ModelDir dir = open();
  ModelRunner runner(dir, options(dtype()));
  const Outcome o = run_prompts(runner, model(), 7, 3);
  const double b = bound(dtype(), cm());
  std::printf("%s chunked prefill + decode: max |dlogit| %.3g (bound %.3g) over %lld rows in %lld steps\n",
              what().c_str(), o.max_err, b, static_cast<long long>(o.compared_rows), static_cast<long long>(o.steps));
  EXPECT_EQ(o.compared_rows, 13);
  EXPECT_LE(o.max_err, b);
}

TEST_P(CudaForwardTest, NhdAndHndLayoutsMatchReference) {
  const ModelDir dir = open();
  for (KVCacheLayout layout : {KVCacheLayout::LBNHC, KVCacheLayout::LBHNC}) {
    SCOPED_TRACE(layout_name(layout));
    ModelRunner runner(dir, options(dtype(), layout));
    EXPECT_EQ(runner.layout(), layout);
    const Outcome o = run_prompts(runner, model(), 5, 2);
    const double b = bound(dtype(), cm());
    std::printf("%s layout %s: max |dlogit| %.3g (bound %.3g)\n", what().c_str(), layout_name(layout), o.max_err, b);
    EXPECT_EQ(o.compared_rows, 1 + 3 + 3 + 3);
    EXPECT_LE(o.max_err, b);
  }
}

// A second pass on the same runner in reused blocks handed out in reverse (a recompute after
// preemption gets blocks others filled).
TEST_P(CudaForwardTest, RecomputeInReusedPermutedBlocksMatchesReference) {
  const ModelDir dir = open();
  ModelRunner runner(dir, options(dtype()));
  const Outcome first = run_prompts(runner, model(), 0, 0);
  const Outcome again = run_prompts(runner, model(), 7, 3, false, /*reverse_blocks=*/true);
  EXPECT_LE(first.max_err, bound(dtype(), cm()));
  EXPECT_EQ(again.compared_rows, 13);
  EXPECT_LE(again.max_err, bound(dtype(), cm()));
}

INSTANTIATE_TEST_SUITE_P(Architectures, CudaForwardTest, ::testing::ValuesIn(cases()), case_name);

class CudaArchTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { SKIP_WITHOUT_GPU(); }
};

// fp8 (e4m3) KV cache with bf16 compute, against the reference whose keys and values are
// rounded to e4m3, within bound()'s rule applied to that reference (dev_bf16_fp8): bf16 rounding
// before the fp8 rounding moves some keys and values by a whole fp8 step, which the bf16 bound of
// the exact reference does not cover (on the test models it moves the fp8 reference's logits
// 3.0-5.8x as much as the exact one's).
TEST_P(CudaArchTest, Fp8KvCacheWithBf16ComputeMatchesFp8RoundedReference) {
  const CudaModel& c = model_for(GetParam());
  const ReferenceModel& m = c.ref;
  const ModelDir dir = open_model_dir(m.dir, false);
  ModelRunner runner(dir, options(DType::bf16, std::nullopt, KVCacheDType::Fp8));
  EXPECT_EQ(runner.kv_cache_dtype(), DType::fp8_e4m3);
  const Outcome q = run_prompts(runner, m, 7, 3, /*fp8_reference=*/true);
  // bound()'s rule on the fp8 reference: twice what bf16 rounding moves it, plus the f32 bound
  const double b = 2 * c.dev_bf16_fp8 + 1e-3;
  std::printf("%s bf16 compute, fp8 KV cache: max |dlogit| %.3g vs the e4m3-rounded reference (bound %.3g)\n",
              GetParam().c_str(), q.max_err, b);
  EXPECT_EQ(q.compared_rows, 13);
  EXPECT_LE(q.max_err, b);
}

// "auto" on CUDA is the checkpoint's dtype (f32 checkpoints: bf16), and the KV budget comes
// from --gpu-memory-utilization after a profiling step: the memory plan adds up.
TEST_P(CudaArchTest, AutoDtypeAndMemoryPlan) {
  const CudaModel& c = model_for(GetParam());
  const ReferenceModel& m = c.ref;
  const ModelDir dir = open_model_dir(m.dir, false);
  ModelRunner::Options o = options(DType::bf16);
  o.compute_dtype = std::nullopt;
  ModelRunner::MemoryPlan probe;
  {
    // With --kv-cache-memory the budget is given; the plan still measures the rest.
    ModelRunner r(dir, o);
    probe = r.memory_plan();
    EXPECT_EQ(probe.utilization, 0);
    EXPECT_EQ(r.kv_cache_bytes(), probe.kv_cache);
  }
  // A utilization that leaves about 256 MiB for the KV cache.
  const double total = static_cast<double>(cuda::total_memory(0));
  o.kv_cache_memory = 0;
  o.gpu_memory_utilization =
      std::min(1.0, static_cast<double>(probe.in_use_before + probe.weights + probe.activations + (256 << 20)) / total);
  ModelRunner runner(dir, o);
  const DType want = dir.config.torch_dtype == DType::f32 ? DType::bf16 : dir.config.torch_dtype;
  EXPECT_EQ(runner.compute_dtype(), want);
  const ModelRunner::MemoryPlan& p = runner.memory_plan();
  std::printf("%s memory plan: total %lld, in use before %lld, weights %lld, activations %lld, KV cache %lld\n",
              GetParam().c_str(), static_cast<long long>(p.total), static_cast<long long>(p.in_use_before),
              static_cast<long long>(p.weights), static_cast<long long>(p.activations),
              static_cast<long long>(p.kv_cache));
  EXPECT_EQ(p.total, cuda::total_memory(0));
  EXPECT_EQ(p.utilization, o.gpu_memory_utilization);
  EXPECT_EQ(p.weights, probe.weights);
  EXPECT_GT(p.weights, 0);
  EXPECT_GT(p.activations, 0);
  EXPECT_GT(p.kv_cache, 0);
  EXPECT_LE(p.kv_cache, ModelRunner::gpu_kv_cache_budget(p));
  EXPECT_GE(p.kv_cache, ModelRunner::gpu_kv_cache_budget(p) * 9 / 10);
  // A utilization that leaves nothing for the KV cache names the figures.
  o.gpu_memory_utilization = std::max(1e-6, static_cast<double>(p.in_use_before + p.weights) / total);
  try {
    ModelRunner r(dir, o);
    ADD_FAILURE() << "a utilization leaving nothing for the KV cache was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--gpu-memory-utilization"), std::string::npos) << e.what();
  }
  // The planned cache computes the same logits.
  const Outcome out = run_prompts(runner, m, 0, 0);
  EXPECT_LE(out.max_err, bound(runner.compute_dtype(), c));
}

// Greedy generation through LLM (scheduler + ModelRunner on CUDA) batched, with chunked
// prefill and under preemption, f32 and bf16 compute.
TEST_P(CudaArchTest, GreedyGenerationBatchedChunkedAndPreempted) {
  const CudaModel& c = model_for(GetParam());
  const ReferenceModel& m = c.ref;
  for (const char* dt : {"float32", "bfloat16"}) {
    const DType t = *ModelRunner::parse_dtype_option(dt);
    const double margin = 2 * bound(t, c);
    auto check = [&](LLM& llm, const std::string& what) {
      SamplingParams sp;
      sp.temperature = 0;
      sp.max_tokens = testing::kGreedyTokens;
      sp.ignore_eos = true;
      const auto outs = llm.generate_tokens(m.prompts.ids, {sp});
      int64_t compared = 0, total = 0;
      for (size_t i = 0; i < outs.size(); ++i) {
        const auto& got = outs[i].output.token_ids;
        EXPECT_EQ(got.size(), static_cast<size_t>(testing::kGreedyTokens)) << what;
        for (size_t k = 0; k < got.size(); ++k) {
          ++total;
          if (got[k] != m.greedy[i][k]) {
            EXPECT_LT(m.greedy_margins[i][k], margin)
                << what << ": prompt " << i << " token " << k << " is " << got[k] << ", the reference's "
                << m.greedy[i][k] << " (top-2 margin " << m.greedy_margins[i][k] << ")";
            total += static_cast<int64_t>(got.size() - k - 1);
            break;
          }
          ++compared;
        }
      }
      std::printf("%s %s %s: %lld of %lld greedy tokens equal to the reference's\n", GetParam().c_str(), dt,
                  what.c_str(), static_cast<long long>(compared), static_cast<long long>(total));
      // In float32 at least half the tokens agree.  In bf16 every divergence is at a near tie
      // (checked above) and that alone: on a model whose bf16 rounding moves the logits by a
      // third of a logit (qwen2_window), the ties come early and no count of tokens is a rule.
      if (t == DType::f32) {
        EXPECT_GE(2 * compared, total) << what;
      }
    };
    ModelLoadConfig c;
    c.device = "cuda:0";
    c.dtype = dt;
    c.kv_cache_memory = 8 << 20;
    c.max_model_len = 256;
    EngineOptions e;
    e.max_num_seqs = 8;
    e.max_num_batched_tokens = 512;
    e.skip_tokenizer_init = true;
    {
      LLM llm = LLM::open(m.dir, c, e);
      check(llm, "batched");
      EXPECT_EQ(llm.last_stats().num_preemptions, 0);
    }
    {
      EngineOptions chunked = e;
      chunked.max_num_batched_tokens = 8;
      LLM llm = LLM::open(m.dir, c, chunked);
      check(llm, "chunked prefill (8 tokens/step)");
    }
    {
      ModelLoadConfig small = c;
      small.max_model_len = 80;
      LLM probe = LLM::open(m.dir, small, e);
      small.kv_cache_memory = 8 * (small.kv_cache_memory / probe.executor().num_kv_blocks());
      EngineOptions optimistic = e;
      optimistic.reserve_to_finish = false;
      LLM llm = LLM::open(m.dir, small, optimistic);
      check(llm, "preemption");
      EXPECT_GT(llm.last_stats().num_preemptions, 0);
    }
  }
}

// head_dim 16 (the CPU tests' models) has no CUDA attention kernel: refused before loading.
TEST(CudaModelRunner, HeadDimWithoutKernelIsUnsupported) {
  SKIP_WITHOUT_GPU();
  namespace fs = std::filesystem;
  const fs::path dir = testing::data_dir() / ("head16-" + std::to_string(::getpid()));
  testing::run(testing::python() + (testing::source_dir() / "tests" / "model" / "make_test_model.py").string() +
               " --arch llama --tokenizer none --out " + dir.string() + " > /dev/null");
  const ModelDir md = open_model_dir(dir, false);
  try {
    ModelRunner r(md, options(DType::bf16));
    ADD_FAILURE() << "head_dim 16 was accepted on CUDA";
  } catch (const Unsupported& e) {
    EXPECT_NE(std::string(e.what()).find("head_dim 16"), std::string::npos) << e.what();
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Architectures, CudaArchTest,
                         ::testing::Values("llama", "mistral", "qwen2", "qwen3", "gemma2", "qwen2_window"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kvattn::model
