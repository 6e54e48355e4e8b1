// merge_attn_states v2 kernels (KVATTN_MERGE_V2 = 1: two 16-byte vectors per thread, 2: four,
// 3: one, in merge_rows16's row layout; KVATTN_MERGE_V2_CTAS occupancy caps) against the CPU reference and against the default kernel
// (v2 = 0) bit for bit: bf16 / f16, head dims 16..4096 (including dims whose vectors do not split
// 2 or 4 ways, which fall back to the default kernel), odd token and head counts, LSEs with
// +-inf and both-empty rows, prefill_tokens_with_context, with and without the output LSE,
// strided outputs / inputs (token rows of a fused [T, 3, H, D] tensor, LSEs as transposed
// [T, H] views) and mixed strides (fallback).  Outputs are poisoned with NaN first; the parts
// of a fused tensor the op must not write stay NaN.  Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_attn_case.h"
#include "kvattn/core/cuda_runtime_api.h"
#if defined(KVATTN_WITH_CUDA)
#include "ops/cuda/kernels.h"
#endif

namespace kvattn::ops {
namespace {
using namespace testing;

class CudaMergeV2 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!kvattn::cuda::available()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)";
#if !defined(KVATTN_WITH_CUDA)
    GTEST_SKIP() << "a build without CUDA kernels";
#endif
  }
  void TearDown() override {
#if defined(KVATTN_WITH_CUDA)
    cuda_impl::k::set_merge_v2(-1);
    cuda_impl::k::set_merge_v2_ctas(-1);
#endif
  }
};

::testing::AssertionResult same_bytes(const Tensor& a, const Tensor& b) {
  if (a.nbytes() != b.nbytes()) return ::testing::AssertionFailure() << "sizes differ";
  const auto* x = static_cast<const unsigned char*>(a.data());
  const auto* y = static_cast<const unsigned char*>(b.data());
  for (int64_t i = 0; i < a.nbytes(); ++i)
    if (x[i] != y[i])
      return ::testing::AssertionFailure() << "byte " << i << " differs: " << int(x[i]) << " vs " << int(y[i]);
  return ::testing::AssertionSuccess();
}

int64_t count_nan(const Tensor& t) {
  int64_t n = 0;
  for (double x : t.to_double_vector()) n += std::isnan(x);
  return n;
}

struct MergeCase {
  DType dt;
  int64_t T, H, D;
  int64_t ctx;       // prefill_tokens_with_context, -1 = none
  bool out_lse;
  bool fused;        // prefix / suffix / out are token rows of [T, 3, H, D] tensors (slot 1)
  bool lse_t;        // the LSEs (and out LSE) are transposed [T, H] views
  bool mixed;        // out contiguous while prefix / suffix are fused views (different strides)
};

// One call of the case on the GPU with the given v2 setting; out / out LSE back on the CPU (the
// whole fused / base tensors, so the untouched parts can be checked).
struct GpuResult {
  Tensor out_base, lse_base;
};

struct Inputs {
  Tensor po_base, so_base, pl_base, sl_base;  // CPU
  Tensor po, so, pl, sl;                      // CPU views as passed
};

Tensor view3(const Tensor& base, bool fused) { return fused ? base.select(1, 1) : base; }
Tensor view2(const Tensor& base, bool lse_t) { return lse_t ? base.transpose(0, 1) : base; }

Inputs make_inputs(const MergeCase& c, std::mt19937& rng) {
  Inputs in;
  const bool fused_in = c.fused || c.mixed;
  const Dims shape = fused_in ? Dims{c.T, 3, c.H, c.D} : Dims{c.T, c.H, c.D};
  in.po_base = Tensor::empty(shape, c.dt);
  in.so_base = Tensor::empty(shape, c.dt);
  fill_uniform(in.po_base, rng, -2, 2);
  fill_uniform(in.so_base, rng, -2, 2);
  const Dims lshape = c.lse_t ? Dims{c.T, c.H} : Dims{c.H, c.T};
  in.pl_base = Tensor::empty(lshape, DType::f32);
  in.sl_base = Tensor::empty(lshape, DType::f32);
  fill_uniform(in.pl_base, rng, -6, 6);
  fill_uniform(in.sl_base, rng, -6, 6);
  in.po = view3(in.po_base, fused_in);
  in.so = view3(in.so_base, fused_in);
  in.pl = view2(in.pl_base, c.lse_t);
  in.sl = view2(in.sl_base, c.lse_t);
  // empty prefixes (-inf), FA2's +inf, empty suffixes, and both empty
  for (int64_t t = 0; t < c.T; t += 7) in.pl.set({t % c.H, t}, -INFINITY);
  for (int64_t t = 2; t < c.T; t += 9) in.pl.set({(t + 1) % c.H, t}, INFINITY);
  for (int64_t t = 3; t < c.T; t += 11) in.sl.set({t % c.H, t}, INFINITY);
  for (int64_t t = 5; t < c.T; t += 13) in.sl.set({(t + 2) % c.H, t}, -INFINITY);
  if (c.T > 1) {
    in.pl.set({0, 1}, -INFINITY);
    in.sl.set({0, 1}, -INFINITY);
  }
  return in;
}

GpuResult run_gpu(const MergeCase& c, const Inputs& in, int v2, int cap) {
#if defined(KVATTN_WITH_CUDA)
  cuda_impl::k::set_merge_v2(v2);
  cuda_impl::k::set_merge_v2_ctas(cap);
#endif
  const bool fused_in = c.fused || c.mixed;
  const Tensor po_g = in.po_base.to(gpu()), so_g = in.so_base.to(gpu());
  const Tensor pl_g = in.pl_base.to(gpu()), sl_g = in.sl_base.to(gpu());
  Tensor ob = Tensor::empty(c.fused ? Dims{c.T, 3, c.H, c.D} : Dims{c.T, c.H, c.D}, c.dt);
  fill_nan(ob);
  Tensor lb = Tensor::empty(c.lse_t ? Dims{c.T, c.H} : Dims{c.H, c.T}, DType::f32);
  fill_nan(lb);
  const Tensor ob_g = ob.to(gpu()), lb_g = lb.to(gpu());
  MergeAttnStatesArgs g;
  g.output = view3(ob_g, c.fused);
  g.prefix_output = view3(po_g, fused_in);
  g.suffix_output = view3(so_g, fused_in);
  g.prefix_lse = view2(pl_g, c.lse_t);
  g.suffix_lse = view2(sl_g, c.lse_t);
  if (c.out_lse) g.output_lse = view2(lb_g, c.lse_t);
  if (c.ctx >= 0) g.prefill_tokens_with_context = c.ctx;
  merge_attn_states(g);
  kvattn::cuda::synchronize();
  return GpuResult{ob_g.to(Device::cpu()), lb_g.to(Device::cpu())};
}

void check_case(const MergeCase& c, uint32_t seed) {
  SCOPED_TRACE(::testing::Message() << dtype_name(c.dt) << " T " << c.T << " H " << c.H << " D " << c.D << " ctx "
                                    << c.ctx << " out_lse " << c.out_lse << " fused " << c.fused << " lse_t "
                                    << c.lse_t << " mixed " << c.mixed);
  std::mt19937 rng(seed);
  const Inputs in = make_inputs(c, rng);
  // CPU reference
  Tensor ref_out = Tensor::empty({c.T, c.H, c.D}, c.dt), ref_lse = Tensor::empty({c.H, c.T}, DType::f32);
  fill_nan(ref_out);
  fill_nan(ref_lse);
  MergeAttnStatesArgs a;
  a.output = ref_out; a.prefix_output = in.po; a.suffix_output = in.so; a.prefix_lse = in.pl; a.suffix_lse = in.sl;
  if (c.out_lse) a.output_lse = ref_lse;
  if (c.ctx >= 0) a.prefill_tokens_with_context = c.ctx;
  reference::merge_attn_states(a);

  const GpuResult base = run_gpu(c, in, 0, 0);
  // every v2 kernel; two with the occupancy cap (shared-memory padding) of the bench's A/B
  for (const auto& [v2, cap] : {std::pair{1, 0}, std::pair{2, 0}, std::pair{3, 0}, std::pair{3, 6}, std::pair{1, 4}}) {
    SCOPED_TRACE(::testing::Message() << "KVATTN_MERGE_V2=" << v2 << " KVATTN_MERGE_V2_CTAS=" << cap);
    const GpuResult r = run_gpu(c, in, v2, cap);
    const Tensor out = view3(r.out_base, c.fused).contiguous();
    EXPECT_EQ(count_nan(out), 0) << "unwritten or NaN outputs";
    EXPECT_LT(rel_error(out, ref_out), 1e-2);
    // the same arithmetic as the default kernel: the same bits, written and untouched parts alike
    EXPECT_TRUE(same_bytes(r.out_base, base.out_base));
    if (c.fused) {
      EXPECT_EQ(count_nan(r.out_base.select(1, 0).contiguous()), c.T * c.H * c.D) << "slot 0 written";
      EXPECT_EQ(count_nan(r.out_base.select(1, 2).contiguous()), c.T * c.H * c.D) << "slot 2 written";
    }
    if (c.out_lse) {
      const Tensor lse = view2(r.lse_base, c.lse_t).contiguous();
      EXPECT_LT(rel_error(lse, ref_lse), 1e-5);
      EXPECT_TRUE(same_bytes(r.lse_base, base.lse_base));
    } else {
      EXPECT_EQ(count_nan(r.lse_base), c.T * c.H) << "out LSE written without being given";
    }
  }
}

TEST_F(CudaMergeV2, MatchesReferenceAndDefaultKernel) {
  std::vector<MergeCase> cases = {
      {DType::bf16, 37, 5, 128, -1, true, false, false, false},
      {DType::f16, 37, 5, 128, 20, true, false, false, false},
      {DType::bf16, 300, 32, 64, -1, false, false, false, false},
      {DType::f16, 11, 3, 256, 0, true, false, false, false},      // every token suffix-only
      {DType::bf16, 19, 7, 40, 7, true, false, false, false},      // 5 vectors a row: v2 = 1, 2 fall back
      {DType::f16, 1, 1, 16, -1, true, false, false, false},       // 2 vectors a row: v2 = 2 falls back
      {DType::bf16, 3, 2, 4096, 2, true, false, false, false},     // 512 vectors a row: v2 = 3 falls back
      {DType::bf16, 2, 3, 2048, -1, true, false, false, false},    // 256 threads a row at v2 = 3
      {DType::bf16, 45, 6, 128, 30, true, true, false, false},     // fused token rows (strides shared)
      {DType::f16, 23, 4, 64, -1, true, true, true, false},        // + transposed LSEs
      {DType::bf16, 29, 3, 128, 12, true, false, true, false},     // transposed LSEs only
      {DType::bf16, 17, 5, 128, -1, true, false, false, true},     // mixed strides: fallback
      {DType::f16, 33, 9, 96, 40, false, true, false, false},      // ctx past the end, 12 vectors a row
  };
  uint32_t seed = 100;
  for (const MergeCase& c : cases) check_case(c, seed++);
}

// Random shapes: the v2 kernels on whatever odd sizes come up.
TEST_F(CudaMergeV2, RandomShapes) {
  std::mt19937 rng(77);
  for (int iter = 0; iter < 12; ++iter) {
    MergeCase c;
    c.dt = rng() % 2 ? DType::bf16 : DType::f16;
    c.T = 1 + rng() % 200;
    c.H = 1 + rng() % 12;
    c.D = 8 * (1 + rng() % 32);
    c.ctx = rng() % 3 == 0 ? -1 : static_cast<int64_t>(rng() % (c.T + 5));
    c.out_lse = rng() % 4 != 0;
    c.fused = rng() % 3 == 0;
    c.lse_t = rng() % 3 == 0;
    c.mixed = !c.fused && rng() % 5 == 0;
    check_case(c, 500 + static_cast<uint32_t>(iter));
  }
}

// The knob: the setter overrides the environment, -1 gives it back.
TEST_F(CudaMergeV2, Setter) {
#if defined(KVATTN_WITH_CUDA)
  namespace k = cuda_impl::k;
  k::set_merge_v2(-1);
  const int env = k::merge_v2();
  EXPECT_GE(env, 0);
  EXPECT_LE(env, 3);
  k::set_merge_v2(2);
  EXPECT_EQ(k::merge_v2(), 2);
  k::set_merge_v2(9);
  EXPECT_EQ(k::merge_v2(), 3);
  k::set_merge_v2(-1);
  EXPECT_EQ(k::merge_v2(), env);
  k::set_merge_v2_ctas(-1);
  const int env_ctas = k::merge_v2_ctas();
  k::set_merge_v2_ctas(6);
  EXPECT_EQ(k::merge_v2_ctas(), 6);
  k::set_merge_v2_ctas(-1);
  EXPECT_EQ(k::merge_v2_ctas(), env_ctas);
#endif
}

}  // namespace
}  // namespace kvattn::ops
