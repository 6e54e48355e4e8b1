// The planner's routing of paged_attention on CUDA (src/ops/cuda/attention_path.h): for calls of
// known shapes, select_attention_path (through attention_path_for, as paged_attention calls it)
// names the path a test expects and a reason that says why; forcing a path off changes the
// choice and the reason.  Needs a GPU (the choice reads the device); skipped without one.
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "kernel_routing.h"
#include "kvattn/core/cuda_runtime_api.h"
#include "kvattn/core/tensor.h"
#include "ops/cuda/attention_path.h"

namespace kvattn::ops::testing {
namespace {

#if defined(KVATTN_WITH_CUDA)
using cuda_impl::AttentionPath;
using cuda_impl::attention_path_for;

// B requests of L keys and q_len query rows each; 32 query heads, 8 KV heads, page 16; the cache
// [pages, 16, 8, dim] in `kv`, query and output in `q`.
struct Call {
  PagedAttentionArgs a;
  Call(int64_t B, int64_t L, int64_t q_len, DType q, DType kv, int64_t dim = 128) {
    const int64_t page = 16, n = (L + page - 1) / page, pages = B * n + 1;
    const Device g = Device::cuda(0);
    a.query = Tensor::empty({B * q_len, 32, dim}, q, g);
    a.out = Tensor::empty({B * q_len, 32, dim}, q, g);
    a.k_cache = Tensor::empty({pages, page, 8, dim}, kv, g);
    a.v_cache = Tensor::empty({pages, page, 8, dim}, kv, g);
    std::vector<int32_t> qo(static_cast<size_t>(B + 1)), ip(static_cast<size_t>(B + 1)), last(static_cast<size_t>(B));
    std::vector<int32_t> ind(static_cast<size_t>(B * n));
    std::iota(ind.begin(), ind.end(), 1);  // page 0 is the null block
    for (int64_t r = 0; r < B; ++r) {
      qo[r + 1] = static_cast<int32_t>((r + 1) * q_len);
      ip[r + 1] = static_cast<int32_t>((r + 1) * n);
      last[r] = static_cast<int32_t>(L - (n - 1) * page);
    }
    a.qo_indptr = Tensor::from_vector(qo).to(g);
    a.paged_kv_indptr = Tensor::from_vector(ip).to(g);
    a.paged_kv_indices = Tensor::from_vector(ind).to(g);
    a.paged_kv_last_page_len = Tensor::from_vector(last).to(g);
    a.max_query_len = q_len;
  }
};

class CudaAttentionPath : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kvattn::cuda::available()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)";
    cuda_impl::reset_kernel_routing();
  }
  void TearDown() override { cuda_impl::reset_kernel_routing(); }
  static bool hopper() { return kvattn::cuda::compute_capability(0) == 90; }
};

bool has(const char* reason, const std::string& part) { return std::string(reason).find(part) != std::string::npos; }

TEST_F(CudaAttentionPath, Float32CacheTakesTheSimtKernel) {
  Call c(2, 100, 1, DType::f32, DType::f32);
  const auto choice = attention_path_for(c.a);
  EXPECT_EQ(choice.path, AttentionPath::f32) << cuda_impl::attention_path_name(choice.path);
  EXPECT_TRUE(has(choice.reason, "float32")) << choice.reason;
}

TEST_F(CudaAttentionPath, HeadDimWithoutKernelIsUnsupportedWithTheReason) {
  Call c(2, 100, 1, DType::bf16, DType::bf16, 96);
  const auto choice = attention_path_for(c.a);
  EXPECT_EQ(choice.path, AttentionPath::unsupported) << cuda_impl::attention_path_name(choice.path);
  EXPECT_TRUE(has(choice.reason, "head_dim 64, 128 and 256")) << choice.reason;
}

TEST_F(CudaAttentionPath, SmallDecodeIsOneLaunch) {
  Call c(1, 1024, 1, DType::bf16, DType::bf16);
  const auto choice = attention_path_for(c.a);
  EXPECT_TRUE(choice.path == AttentionPath::small_cluster || choice.path == AttentionPath::small_decode)
      << cuda_impl::attention_path_name(choice.path);
  if (kvattn::cuda::compute_capability(0) >= 90) {
    EXPECT_EQ(choice.path, AttentionPath::small_cluster);
  }
  EXPECT_TRUE(has(choice.reason, "small decode call")) << choice.reason;
  // the small path off: attn_kernel's decode configuration, and the reason says so
  cuda_impl::set_small_decode_mode(1);
  cuda_impl::set_page_decode_mode(1);
  const auto off = attention_path_for(c.a);
  EXPECT_EQ(off.path, AttentionPath::attn_kernel) << cuda_impl::attention_path_name(off.path);
  EXPECT_TRUE(has(off.reason, "decode configuration")) << off.reason;
}

TEST_F(CudaAttentionPath, LargeDecodeOnHopperReadsWholePages) {
  if (kvattn::cuda::compute_capability(0) < 90) GTEST_SKIP() << "the whole-page decode needs sm_90";
  Call c(128, 256, 1, DType::bf16, DType::bf16);
  const auto choice = attention_path_for(c.a);
  EXPECT_EQ(choice.path, AttentionPath::page_decode) << cuda_impl::attention_path_name(choice.path) << ": " << choice.reason;
  EXPECT_TRUE(has(choice.reason, "whole-page decode")) << choice.reason;
  c.a.max_query_len = -1;  // unknown: the page path cannot take the call
  EXPECT_EQ(attention_path_for(c.a).path, AttentionPath::attn_kernel);
}

TEST_F(CudaAttentionPath, PrefillTakesThePrefillKernels) {
  Call c(8, 2048, 2048, DType::bf16, DType::bf16);
  const auto choice = attention_path_for(c.a);
  if (hopper()) {
    EXPECT_EQ(choice.path, AttentionPath::prefill_wgmma) << choice.reason;
  } else {
    EXPECT_EQ(choice.path, AttentionPath::prefill_mma) << choice.reason;
  }
  // the wgmma form off: the mma.sync kernel, with the reason
  cuda_impl::set_prefill_hopper_mode(1);
  const auto mma = attention_path_for(c.a);
  EXPECT_EQ(mma.path, AttentionPath::prefill_mma) << cuda_impl::attention_path_name(mma.path);
  if (hopper()) {
    EXPECT_TRUE(has(mma.reason, "turned off")) << mma.reason;
  }
  // the prefill kernels off: attn_kernel's prefill configuration
  cuda_impl::set_prefill_kernel_mode(1);
  const auto general = attention_path_for(c.a);
  EXPECT_EQ(general.path, AttentionPath::attn_kernel) << cuda_impl::attention_path_name(general.path);
  EXPECT_TRUE(has(general.reason, "prefill configuration")) << general.reason;
}

// fp8 pages: the wgmma kernel reads them on sm_90a; the mma.sync prefill kernel does not, so
// elsewhere (or with the wgmma kernel off) the call goes to attn_kernel's prefill configuration.
TEST_F(CudaAttentionPath, Fp8PrefillTakesTheWgmmaKernelElseAttnKernel) {
  Call c(8, 2048, 2048, DType::bf16, DType::fp8_e4m3);
  const auto choice = attention_path_for(c.a);
  if (hopper()) {
    EXPECT_EQ(choice.path, AttentionPath::prefill_wgmma) << cuda_impl::attention_path_name(choice.path);
    EXPECT_TRUE(has(choice.reason, "fp8")) << choice.reason;
  } else {
    EXPECT_EQ(choice.path, AttentionPath::attn_kernel) << cuda_impl::attention_path_name(choice.path);
  }
  cuda_impl::set_prefill_hopper_mode(1);
  const auto off = attention_path_for(c.a);
  EXPECT_EQ(off.path, AttentionPath::attn_kernel) << cuda_impl::attention_path_name(off.path);
  EXPECT_TRUE(has(off.reason, "prefill configuration")) << off.reason;
}
#else
TEST(CudaAttentionPath, NeedsCuda) { GTEST_SKIP() << "a build without CUDA"; }
#endif

}  // namespace
}  // namespace kvattn::ops::testing
