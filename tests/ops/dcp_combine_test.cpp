// ops::copy_ and the DCP LSE combines on CPU against brute-force double-precision merges.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kvattn/core/error.h"
#include "kvattn/ops/dcp_combine.h"
#include "ops_test_util.h"

namespace kvattn::ops {
namespace {
using namespace testing;

// Runs `stmt`, expecting exception type E whose message contains `needle`.
#define EXPECT_THROW_WITH(E, stmt, needle)                                                       \
  do {                                                                                           \
    std::string msg_ = "no exception";                                                           \
    try {                                                                                        \
      stmt;                                                                                      \
    } catch (const E& e_) {                                                                      \
      msg_ = e_.what();                                                                          \
    } catch (const std::exception& e_) {                                                         \
      msg_ = std::string("wrong exception type: ") + e_.what();                                  \
    }                                                                                            \
    EXPECT_NE(msg_.find(needle), std::string::npos) << "message: " << msg_;                      \
  } while (0)

TEST(OpsCopy, StridedViewsAndDtypeConversion) {
  std::mt19937 rng(5);
  Tensor src = Tensor::empty({3, 4, 5}, DType::f32);
  fill_uniform(src, rng);
  // Permuted source into a bf16 destination, then back through a transposed f32 view.
  Tensor dst = Tensor::empty({5, 3, 4}, DType::bf16);
  copy_(dst, src.permute({2, 0, 1}));
  for (int64_t i = 0; i < 5; ++i)
    for (int64_t j = 0; j < 3; ++j)
      for (int64_t k = 0; k < 4; ++k)
        EXPECT_EQ(dst.get({i, j, k}), bf16_t::from_float(static_cast<float>(src.get({j, k, i}))).to_float());
  Tensor back = Tensor::empty({4, 3, 5}, DType::f32);
  fill_nan(back);
  copy_(back.transpose(0, 1), dst.permute({1, 2, 0}));
  for (int64_t j = 0; j < 3; ++j)
    for (int64_t k = 0; k < 4; ++k)
      for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(back.get({k, j, i}), dst.get({i, j, k}));
  // Same-dtype integers copy raw.
  Tensor ids = Tensor::from_vector(std::vector<int32_t>{1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor ids_t = Tensor::empty({3, 2}, DType::i32);
  copy_(ids_t, ids.transpose(0, 1));
  EXPECT_EQ(ids_t.to_vector<int32_t>(), (std::vector<int32_t>{1, 4, 2, 5, 3, 6}));
}

// scaled_copy_: one f32 multiply, then the destination's rounding (fp8 saturating at ±448 for
// e4m3, ±57344 for e5m2), through strided views.
TEST(OpsCopy, ScaledCopyQuantisesThroughOneF32Multiply) {
  std::mt19937 rng(9);
  Tensor src = Tensor::empty({4, 6}, DType::bf16);
  fill_uniform(src, rng);
  src.set({0, 0}, 3.0);     // * 200 = 600 -> saturates to 448 in e4m3
  src.set({1, 1}, -2.5);    // * 200 = -500 -> -448
  src.set({2, 2}, 0.0625);  // * 200 = 12.5: a tie between 12 and 13 in e4m3 -> 12 (even mantissa)
  const float scale = 200.0f;
  for (DType dd : {DType::fp8_e4m3, DType::fp8_e5m2, DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dd));
    Tensor got = Tensor::empty({6, 4}, dd);
    scaled_copy_(got.transpose(0, 1), src, scale);
    for (int64_t i = 0; i < 4; ++i)
      for (int64_t j = 0; j < 6; ++j) {
        Tensor one = Tensor::from_vector(std::vector<float>{static_cast<float>(src.get({i, j})) * scale}).to(dd);
        EXPECT_EQ(got.get({j, i}), one.get({0})) << i << "," << j;
      }
  }
  Tensor q = Tensor::empty({3, 3}, DType::fp8_e4m3);
  scaled_copy_(q, src.narrow(0, 0, 3).narrow(1, 0, 3), scale);
  EXPECT_EQ(q.get({0, 0}), 448.0);
  EXPECT_EQ(q.get({1, 1}), -448.0);
  EXPECT_EQ(q.get({2, 2}), 12.0);
  EXPECT_THROW_WITH(InvalidArgument, scaled_copy_(Tensor::empty({2}, DType::i32), Tensor::empty({2}, DType::i32), 2.f),
                    "scaling needs float dtypes");
  EXPECT_THROW_WITH(InvalidArgument, scaled_copy_(q, q, std::nanf("")), "scale must be finite");
}

TEST(OpsCopy, RejectsBadArguments) {
  Tensor a = Tensor::empty({2, 3}, DType::f32);
  EXPECT_THROW_WITH(InvalidArgument, copy_(a, Tensor::empty({3, 2}, DType::f32)), "`src` has shape [3, 2]");
  EXPECT_THROW_WITH(InvalidArgument, copy_(Tensor::empty({2, 3}, DType::i32), a), "cannot convert float32 to int32");
}

// Exact merge in double of W partial states of one row.
struct Merged {
  std::vector<double> out;
  double lse;
};
Merged exact_merge(const std::vector<std::vector<double>>& outs, const std::vector<double>& lses, bool base_e) {
  const auto ex = [&](double x) { return base_e ? std::exp(x) : std::exp2(x); };
  double m = -INFINITY;
  for (double l : lses)
    if (std::isfinite(l)) m = std::max(m, l);
  Merged r{std::vector<double>(outs[0].size(), 0.0), -INFINITY};
  if (m == -INFINITY) return r;
  double s = 0;
  for (double l : lses)
    if (std::isfinite(l)) s += ex(l - m);
  r.lse = m + (base_e ? std::log(s) : std::log2(s));
  for (size_t w = 0; w < outs.size(); ++w) {
    if (!std::isfinite(lses[w])) continue;
    const double f = ex(lses[w] - r.lse);
    for (size_t d = 0; d < r.out.size(); ++d) r.out[d] += f * outs[w][d];
  }
  return r;
}

// Random partials and LSEs for W ranks, with bad rows: t=1 has one rank at -inf, t=2 every
// rank at -inf, t=3 one +inf and one NaN.
struct DcpCase {
  int64_t W, T, H, D;
  std::vector<Tensor> partial;  // per rank [T, W*H, D]
  Tensor all_lse;               // [W, T, W*H]
};
DcpCase make_case(int64_t W, int64_t T, int64_t H, int64_t D, uint32_t seed) {
  std::mt19937 rng(seed);
  DcpCase c{W, T, H, D, {}, Tensor::empty({W, T, W * H}, DType::f32)};
  fill_uniform(c.all_lse, rng, -3.0, 3.0);
  for (int64_t r = 0; r < W; ++r) {
    c.partial.push_back(Tensor::empty({T, W * H, D}, DType::f32));
    fill_uniform(c.partial.back(), rng);
  }
  for (int64_t hw = 0; hw < W * H; ++hw) {
    if (T > 1) c.all_lse.set({W - 1, 1, hw}, -INFINITY);
    if (T > 2)
      for (int64_t r = 0; r < W; ++r) c.all_lse.set({r, 2, hw}, -INFINITY);
    if (T > 3 && W > 2) {
      c.all_lse.set({0, 3, hw}, INFINITY);
      c.all_lse.set({1, 3, hw}, NAN);
    }
  }
  return c;
}

TEST(OpsDcpCombine, ScalePackSummedOverRanksIsTheExactMerge) {
  for (bool base_e : {false, true}) {
    const DcpCase c = make_case(3, 5, 2, 24, base_e ? 7 : 8);
    const int64_t W = c.W, T = c.T, H = c.H, D = c.D;
    std::vector<Tensor> packed;
    Tensor global = Tensor::empty({T, W * H}, DType::f32);
    for (int64_t r = 0; r < W; ++r) {
      packed.push_back(Tensor::empty({W, T, H, D}, DType::f32));
      fill_nan(packed.back());
      dcp_lse_scale_pack(c.partial[r], c.all_lse, r, base_e, packed.back(), global);
    }
    for (int64_t t = 0; t < T; ++t)
      for (int64_t hw = 0; hw < W * H; ++hw) {
        std::vector<std::vector<double>> outs;
        std::vector<double> lses;
        for (int64_t r = 0; r < W; ++r) {
          lses.push_back(c.all_lse.get({r, t, hw}));
          std::vector<double> o;
          for (int64_t d = 0; d < D; ++d) o.push_back(c.partial[r].get({t, hw, d}));
          outs.push_back(o);
        }
        const Merged m = exact_merge(outs, lses, base_e);
        if (std::isinf(m.lse)) EXPECT_EQ(global.get({t, hw}), -INFINITY);
        else EXPECT_NEAR(global.get({t, hw}), m.lse, 1e-5);
        for (int64_t d = 0; d < D; ++d) {
          double sum = 0;
          for (int64_t r = 0; r < W; ++r) sum += packed[r].get({hw / H, t, hw % H, d});
          EXPECT_NEAR(sum, m.out[d], 1e-5) << "t " << t << " head " << hw << " dim " << d;
        }
      }
  }
}

TEST(OpsDcpCombine, CombineIsTheExactMergeIntoAnyDtypeAndStrides) {
  const int64_t W = 4, T = 5, H = 3, D = 16;
  std::mt19937 rng(11);
  Tensor partials = Tensor::empty({W, T, H, D}, DType::f32), lses = Tensor::empty({W, T, H}, DType::f32);
  fill_uniform(partials, rng);
  fill_uniform(lses, rng, -4.0, 4.0);
  for (int64_t h = 0; h < H; ++h) {
    lses.set({1, 1, h}, -INFINITY);
    for (int64_t r = 0; r < W; ++r) lses.set({r, 2, h}, -INFINITY);
    lses.set({2, 3, h}, NAN);
    lses.set({3, 4, h}, INFINITY);
  }
  for (DType od : {DType::f32, DType::bf16}) {
    Tensor out_base = Tensor::empty({H, T, D}, od);  // written through a transposed view
    fill_nan(out_base);
    Tensor out = out_base.transpose(0, 1);
    Tensor global = Tensor::empty({T, H}, DType::f32);
    dcp_lse_combine(partials, lses, false, out, global);
    const double tol = od == DType::f32 ? 1e-5 : 1e-2;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        std::vector<std::vector<double>> outs;
        std::vector<double> ls;
        for (int64_t r = 0; r < W; ++r) {
          ls.push_back(lses.get({r, t, h}));
          std::vector<double> o;
          for (int64_t d = 0; d < D; ++d) o.push_back(partials.get({r, t, h, d}));
          outs.push_back(o);
        }
        const Merged m = exact_merge(outs, ls, false);
        if (std::isinf(m.lse)) EXPECT_EQ(global.get({t, h}), -INFINITY);
        else EXPECT_NEAR(global.get({t, h}), m.lse, 1e-5);
        for (int64_t d = 0; d < D; ++d) EXPECT_NEAR(out.get({t, h, d}), m.out[d], tol);
      }
  }
}

TEST(OpsDcpCombine, RejectsBadShapes) {
  Tensor p = Tensor::empty({2, 6, 8}, DType::f32);
  Tensor l = Tensor::empty({2, 2, 6}, DType::f32);
  EXPECT_THROW_WITH(InvalidArgument, dcp_lse_scale_pack(p, l, 2, false, Tensor::empty({2, 2, 3, 8}, DType::f32)),
                    "rank 2 outside [0, 2)");
  EXPECT_THROW_WITH(InvalidArgument, dcp_lse_scale_pack(p, l, 0, false, Tensor::empty({2, 2, 6, 8}, DType::f32)),
                    "`packed` must be a contiguous [W, T, H, D] = [2, 2, 3, 8]");
  EXPECT_THROW_WITH(InvalidArgument,
                    dcp_lse_scale_pack(Tensor::empty({2, 5, 8}, DType::f32), Tensor::empty({3, 2, 5}, DType::f32), 0,
                                       false, Tensor::empty({3, 2, 1, 8}, DType::f32)),
                    "5 heads in `partial` do not divide over the 3 ranks");
  EXPECT_THROW_WITH(InvalidArgument,
                    dcp_lse_combine(Tensor::empty({2, 3, 4, 8}, DType::f32), Tensor::empty({2, 3, 5}, DType::f32),
                                    false, Tensor::empty({3, 4, 8}, DType::f32)),
                    "`lses` must be [W, T, H] = [2, 3, 4]");
  EXPECT_THROW_WITH(InvalidArgument,
                    dcp_lse_combine(Tensor::empty({2, 3, 4, 8}, DType::f32), Tensor::empty({2, 3, 4}, DType::f16),
                                    false, Tensor::empty({3, 4, 8}, DType::f32)),
                    "`lses` has dtype float16");
}

}  // namespace
}  // namespace kvattn::ops
