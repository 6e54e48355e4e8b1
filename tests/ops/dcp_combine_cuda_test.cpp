// The CUDA copy_ and DCP combines against the CPU versions on random inputs with NaN-poisoned
// outputs and bad LSE rows.  Skips when no GPU is present.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kvattn/core/cuda_runtime_api.h"
#include "kvattn/ops/dcp_combine.h"
#include "ops_test_util.h"

namespace kvattn::ops {
namespace {
using namespace testing;

#define REQUIRE_GPU() \
  if (!kvattn::cuda::available()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)"

const Device kGpu = Device::cuda(0);

// Values equal within `tol` (NaN only where NaN is expected; equal infinities match).
void expect_same_values(const Tensor& got, const Tensor& want, double tol = 0.0) {
  const auto g = got.to_double_vector(), w = want.to_double_vector();
  ASSERT_EQ(g.size(), w.size());
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(w[i])) {
      EXPECT_TRUE(std::isnan(g[i])) << i;
      continue;
    }
    if (g[i] == w[i]) continue;  // equal infinities included
    EXPECT_LE(std::abs(g[i] - w[i]), tol) << "element " << i << ": got " << g[i] << ", want " << w[i];
  }
}

TEST(CudaDcpOps, StridedCopyConvertsAndPermutes) {
  REQUIRE_GPU();
  std::mt19937 rng(1);
  Tensor src = Tensor::empty({3, 5, 7, 8}, DType::f32);
  fill_uniform(src, rng);
  Tensor src_g = src.to(kGpu);
  for (DType dd : {DType::f32, DType::bf16, DType::f16, DType::fp8_e4m3}) {
    SCOPED_TRACE(dtype_name(dd));
    Tensor want = Tensor::empty({7, 3, 8, 5}, dd);
    copy_(want, src.permute({2, 0, 3, 1}));
    Tensor got_base = Tensor::empty({7, 3, 8, 5}, dd);
    fill_nan(got_base);
    Tensor got = got_base.to(kGpu);
    copy_(got, src_g.permute({2, 0, 3, 1}));
    expect_same_values(got.to(Device::cpu()), want);
  }
  // Raw same-dtype copy of int32 through a transposed destination view.
  Tensor ids = Tensor::from_vector(std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {3, 4});
  Tensor dst = Tensor::zeros({4, 3}, DType::i32).to(kGpu);
  copy_(dst.transpose(0, 1), ids.to(kGpu));
  EXPECT_EQ(dst.to(Device::cpu()).to_vector<int32_t>(), (std::vector<int32_t>{1, 5, 9, 2, 6, 10, 3, 7, 11, 4, 8, 12}));
}

// The CUDA scaled copy (query quantisation to fp8) is bit-identical to the CPU one.
TEST(CudaDcpOps, ScaledCopyEqualsTheCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(4);
  Tensor src = Tensor::empty({5, 8, 24}, DType::bf16);
  fill_uniform(src, rng);
  Tensor src_g = src.to(kGpu);
  for (float scale : {1.0f, 1.0f / 0.037f, 900.0f}) {
    for (DType dd : {DType::fp8_e4m3, DType::fp8_e5m2, DType::f16, DType::f32}) {
      SCOPED_TRACE(std::string(dtype_name(dd)) + " scale " + std::to_string(scale));
      Tensor want = Tensor::empty({8, 5, 24}, dd);
      scaled_copy_(want.transpose(0, 1), src, scale);
      Tensor got_base = Tensor::empty({8, 5, 24}, dd);
      fill_nan(got_base);
      Tensor got = got_base.to(kGpu);
      scaled_copy_(got.transpose(0, 1), src_g, scale);
      expect_same_values(got.to(Device::cpu()), want);
    }
  }
}

TEST(CudaDcpOps, ScalePackAndCombineEqualTheCpu) {
  REQUIRE_GPU();
  std::mt19937 rng(2);
  for (int64_t W : {2, 3, 8}) {
    for (bool base_e : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "W=" << W << " base_e=" << base_e);
      const int64_t T = 37, H = 4, D = 128;
      Tensor partial = Tensor::empty({T, W * H, D}, DType::bf16), lse = Tensor::empty({W, T, W * H}, DType::f32);
      fill_uniform(partial, rng);
      fill_uniform(lse, rng, -5.0, 5.0);
      for (int64_t hw = 0; hw < W * H; ++hw) {
        lse.set({W - 1, 1, hw}, -INFINITY);
        for (int64_t r = 0; r < W; ++r) lse.set({r, 2, hw}, -INFINITY);
        lse.set({0, 3, hw}, INFINITY);
        lse.set({1, 4, hw}, NAN);
      }
      for (int64_t rank : {int64_t{0}, W - 1}) {
        Tensor packed_c = Tensor::empty({W, T, H, D}, DType::f32), g_c = Tensor::empty({T, W * H}, DType::f32);
        dcp_lse_scale_pack(partial, lse, rank, base_e, packed_c, g_c);
        Tensor packed_g = Tensor::empty({W, T, H, D}, DType::f32, kGpu), g_g = Tensor::empty({T, W * H}, DType::f32, kGpu);
        Tensor poison = Tensor::empty({W, T, H, D}, DType::f32);
        fill_nan(poison);
        packed_g.copy_from(poison.to(kGpu));
        dcp_lse_scale_pack(partial.to(kGpu), lse.to(kGpu), rank, base_e, packed_g, g_g);
        expect_same_values(packed_g.to(Device::cpu()), packed_c, 2e-6);
        expect_same_values(g_g.to(Device::cpu()), g_c, 2e-6);
      }
      // Combine: [W, T, H, D] partials (a strided view) into a bf16 [T, H, D] output.
      Tensor parts = Tensor::empty({T, W, H, D}, DType::f32), lses = Tensor::empty({W, T, H}, DType::f32);
      fill_uniform(parts, rng);
      fill_uniform(lses, rng, -5.0, 5.0);
      for (int64_t h = 0; h < H; ++h) {
        for (int64_t r = 0; r < W; ++r) lses.set({r, 5, h}, -INFINITY);
        lses.set({0, 6, h}, NAN);
      }
      Tensor out_c = Tensor::empty({T, H, D}, DType::bf16), gl_c = Tensor::empty({T, H}, DType::f32);
      dcp_lse_combine(parts.transpose(0, 1), lses, base_e, out_c, gl_c);
      Tensor parts_g = parts.to(kGpu);
      Tensor out_g = Tensor::empty({T, H, D}, DType::bf16, kGpu), gl_g = Tensor::empty({T, H}, DType::f32, kGpu);
      dcp_lse_combine(parts_g.transpose(0, 1), lses.to(kGpu), base_e, out_g, gl_g);
      expect_same_values(out_g.to(Device::cpu()), out_c, 1.6e-2);  // one bf16 ulp at |x| < 2
      expect_same_values(gl_g.to(Device::cpu()), gl_c, 2e-6);
    }
  }
}

}  // namespace
}  // namespace kvattn::ops
