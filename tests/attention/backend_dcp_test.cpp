// The in-process DCP group and the cross-rank combines.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kvattn/attention/communicator.h"

namespace kvattn {
namespace {

// Runs fn(rank, comm) on W threads.
template <typename F>
void on_ranks(int64_t W, F fn) {
  InProcessDcpGroup g(W);
  std::vector<std::thread> ts;
  for (int64_t r = 0; r < W; ++r) ts.emplace_back([&, r] { fn(r, g.communicator(r)); });
  for (auto& t : ts) t.join();
}

TEST(BackendDcpGroup, Collectives) {
  on_ranks(3, [](int64_t r, DcpCommunicator& c) {
    EXPECT_EQ(c.world_size(), 3);
    EXPECT_EQ(c.rank(), r);
    Tensor t = Tensor::from_vector(std::vector<float>{float(r), float(10 + r)}, {1, 2});
    EXPECT_EQ(c.all_gather(t, 1).to_vector<float>(), (std::vector<float>{0, 10, 1, 11, 2, 12}));
    EXPECT_EQ(c.all_gather(t, 0).shape(), (Dims{3, 2}));
    Tensor v = Tensor::from_vector(std::vector<float>{1, 2, 3, 4, 5, 6});  // same on every rank
    EXPECT_EQ(c.reduce_scatter(v, 0).to_vector<float>(),
              (std::vector<float>{3.f * (1 + 2 * r), 3.f * (2 + 2 * r)}));
    Tensor a = Tensor::from_vector(std::vector<float>{float(r), float(r), float(r)});
    Tensor got = c.all_to_all(a, 0);  // [3, 1]: part r of every rank
    EXPECT_EQ(got.to_vector<float>(), (std::vector<float>{0, 1, 2}));
  });
  EXPECT_THROW(InProcessDcpGroup(0), InvalidArgument);
}

TEST(BackendDcpGroup, AFailedRankReleasesItsPeers) {
  InProcessDcpGroup g(3);
  std::vector<std::string> errors(3);
  std::vector<std::thread> ts;
  for (int64_t r = 0; r < 3; ++r)
    ts.emplace_back([&, r] {
      try {
        Tensor t = Tensor::from_vector(std::vector<float>{float(r)});
        g.communicator(r).all_gather(t, 0);  // every rank
        if (r == 1) throw InvalidArgument("rank 1: bad input");
        g.communicator(r).all_gather(t, 0);  // ranks 0 and 2 only: must not hang
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
        if (r == 1) g.abort();
      }
    });
  for (auto& t : ts) t.join();
  EXPECT_NE(errors[1].find("rank 1: bad input"), std::string::npos);
  for (int r : {0, 2}) EXPECT_NE(errors[static_cast<size_t>(r)].find("abandoned"), std::string::npos) << errors[r];
}

TEST(BackendDcpGroup, CombinesAgreeWithTheExactMerge) {
  const int64_t W = 2, T = 3, H = 2, D = 4;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  // Partial results of every rank (row t=2 is empty on rank 1: lse = -inf).
  std::vector<std::vector<float>> outs(W), lses(W);
  for (int64_t r = 0; r < W; ++r) {
    for (int64_t i = 0; i < T * W * H * D; ++i) outs[r].push_back(u(rng));
    for (int64_t i = 0; i < T * W * H; ++i) lses[r].push_back(u(rng));
  }
  for (int64_t h = 0; h < W * H; ++h) lses[1][2 * W * H + h] = -INFINITY;
  std::vector<std::vector<float>> ag(W), a2a(W), lse_ag(W);
  on_ranks(W, [&](int64_t r, DcpCommunicator& c) {
    Tensor o = Tensor::from_vector(outs[r], {T, W * H, D});
    Tensor l = Tensor::from_vector(lses[r], {T, W * H});
    Tensor lo;
    ag[r] = cp_lse_ag_out_rs(o, l, c, /*is_lse_base_on_e=*/false, &lo).to_vector<float>();
    lse_ag[r] = lo.to_vector<float>();
    a2a[r] = dcp_a2a_lse_reduce(o, l, c, false).to_vector<float>();
  });
  for (int64_t r = 0; r < W; ++r)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const int64_t gh = r * H + h;
        const double l0 = lses[0][t * W * H + gh], l1 = lses[1][t * W * H + gh];
        const double m = std::max(l0, l1);
        const double w0 = std::exp2(l0 - m), w1 = std::isinf(l1) ? 0.0 : std::exp2(l1 - m);
        EXPECT_NEAR(lse_ag[r][t * H + h], m + std::log2(w0 + w1), 1e-5);
        for (int64_t d = 0; d < D; ++d) {
          const double want = (w0 * outs[0][(t * W * H + gh) * D + d] + w1 * outs[1][(t * W * H + gh) * D + d]) / (w0 + w1);
          EXPECT_NEAR(ag[r][(t * H + h) * D + d], want, 1e-5);
          EXPECT_NEAR(a2a[r][(t * H + h) * D + d], want, 1e-5);
        }
      }
}

}  // namespace
}  // namespace kvattn
