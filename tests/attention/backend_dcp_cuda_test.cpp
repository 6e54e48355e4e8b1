// Decode context parallelism on CUDA: the native backend with W ranks (the in-process group
// with every rank on one GPU, and NCCL with rank r on cuda:r) against the dense oracle and
// against the single-GPU (W = 1) output of the same batch; the NCCL collectives and combines
// against the in-process ones.  Skips without a GPU; the NCCL tests skip without NCCL or with
// fewer than two GPUs.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <thread>

#include "backend_harness.h"
#include "kvattn/core/cuda_runtime_api.h"

namespace kvattn::test {
namespace {

#define REQUIRE_GPU() \
  if (!kvattn::cuda::available()) GTEST_SKIP() << "no CUDA device (or a build without CUDA)"
#define REQUIRE_NCCL_GPUS(n)                                                                          \
  REQUIRE_GPU();                                                                                       \
  if (!NcclDcpGroup::available()) GTEST_SKIP() << "kvattn was built without NCCL";                     \
  if (kvattn::cuda::device_count() < (n)) GTEST_SKIP() << "needs " << (n) << " GPUs, found " << kvattn::cuda::device_count()

// The batches of the issue: decode only, chunked prefill only, mixed.
std::vector<BatchSpec> dcp_batches() {
  return {make_batch("decode", {300, 517, 64, 1025, 33}, {1, 1, 1, 1, 1}),
          make_batch("chunked_prefill", {400, 257, 96}, {64, 100, 96}),
          make_batch("mixed", {700, 90, 33, 150, 260}, {1, 1, 9, 50, 260})};
}

// Runs every batch with W ranks and with one; both must match the oracle and each other.
void expect_dcp_matches_single_gpu(E2EOptions o) {
  E2EOptions single = o;
  single.dcp = 1;
  single.dcp_transport = "in-process";
  for (const auto& spec : dcp_batches()) {
    SCOPED_TRACE(spec.name + " dcp=" + std::to_string(o.dcp) + " " + o.dcp_transport + " " + o.dcp_comm_backend);
    const E2EResult d = expect_matches_oracle(o, spec);
    const E2EResult s = expect_matches_oracle(single, spec);
    EXPECT_NE(d.kernel_path.find(spec.name == "decode" ? "decode=native" : "prefill=dcp"), std::string::npos)
        << d.kernel_path;
    EXPECT_LE(max_output_diff(d, s), 2 * tolerance_for(o.dtype)) << "DCP output differs from the single-GPU output";
  }
}

TEST(BackendDcpCuda, InProcessRanksOnOneGpuMatchSingleGpu) {
  REQUIRE_GPU();
  for (const char* comm : {"ag_rs", "a2a"}) {
    E2EOptions o;
    o.device = Device::cuda(0);
    o.dcp = 2;
    o.dcp_comm_backend = comm;
    expect_dcp_matches_single_gpu(o);
  }
}

template <typename F>
void on_nccl_ranks(int W, F fn) {
  std::vector<int> devices(static_cast<size_t>(W));
  std::iota(devices.begin(), devices.end(), 0);
  NcclDcpGroup g(devices);
  std::vector<std::thread> ts;
  std::vector<std::string> errors(static_cast<size_t>(W));
  for (int r = 0; r < W; ++r)
    ts.emplace_back([&, r] {
      try {
        cuda::set_device(r);
        fn(r, g.communicator(r));
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < W; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
}

TEST(BackendDcpCuda, NcclCollectivesOnTwoGpus) {
  REQUIRE_NCCL_GPUS(2);
  const int W = 2;
  on_nccl_ranks(W, [&](int r, DcpCommunicator& c) {
    const Device dev = Device::cuda(r);
    EXPECT_STREQ(c.transport(), "nccl");
    // [2, 3] of r*100 + i, gathered along 0, 1 and -1.
    std::vector<float> v;
    for (int i = 0; i < 6; ++i) v.push_back(float(r * 100 + i));
    Tensor t = Tensor::from_vector(v, {2, 3}).to(dev);
    EXPECT_EQ(c.all_gather(t, 0).to(Device::cpu()).to_vector<float>(),
              (std::vector<float>{0, 1, 2, 3, 4, 5, 100, 101, 102, 103, 104, 105}));
    EXPECT_EQ(c.all_gather(t, -1).to(Device::cpu()).to_vector<float>(),
              (std::vector<float>{0, 1, 2, 100, 101, 102, 3, 4, 5, 103, 104, 105}));
    Tensor ti = Tensor::from_vector(std::vector<int32_t>{r, r + 10}, {2, 1}).to(dev);
    EXPECT_EQ(c.all_gather(ti, 1).to(Device::cpu()).to_vector<int32_t>(), (std::vector<int32_t>{0, 1, 10, 11}));
    // reduce_scatter of [2, 4] along 1: sum over ranks, this rank's 2 columns.
    std::vector<float> w;
    for (int i = 0; i < 8; ++i) w.push_back(float((r + 1) * i));
    Tensor rs = c.reduce_scatter(Tensor::from_vector(w, {2, 4}).to(dev), 1);
    const std::vector<float> want_rs = r == 0 ? std::vector<float>{0, 3, 12, 15} : std::vector<float>{6, 9, 18, 21};
    EXPECT_EQ(rs.to(Device::cpu()).to_vector<float>(), want_rs);
    EXPECT_EQ(c.reduce_scatter(Tensor::from_vector(w, {4, 2}).to(dev), 0).shape(), (Dims{2, 2}));
    // all_to_all of [1, 4] along 1: part j of every rank.
    Tensor a = Tensor::from_vector(std::vector<float>{float(r), float(r) + 0.5f, float(r) + 0.25f, float(r) + 0.75f}, {1, 4});
    const std::vector<float> want_a2a = r == 0 ? std::vector<float>{0, 0.5f, 1, 1.5f} : std::vector<float>{0.25f, 0.75f, 1.25f, 1.75f};
    EXPECT_EQ(c.all_to_all(a.to(dev), 1).to(Device::cpu()).to_vector<float>(), want_a2a);
    // A tensor on the wrong GPU is an error, not a hang: every rank checks before NCCL.
    EXPECT_THROW(c.all_gather(t.to(Device::cpu()), 0), InvalidArgument);
  });
}

TEST(BackendDcpCuda, NcclCombinesEqualTheInProcessOnes) {
  REQUIRE_NCCL_GPUS(2);
  const int W = 2;
  const int64_t T = 9, H = 4, D = 64;
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  std::vector<std::vector<float>> outs(W), lses(W);
  for (int r = 0; r < W; ++r) {
    for (int64_t i = 0; i < T * W * H * D; ++i) outs[r].push_back(u(rng));
    for (int64_t i = 0; i < T * W * H; ++i) lses[r].push_back(u(rng));
  }
  for (int64_t h = 0; h < W * H; ++h) lses[1][2 * W * H + h] = -INFINITY;
  std::vector<std::vector<float>> want_ag(W), want_a2a(W), got_ag(W), got_a2a(W);
  {
    InProcessDcpGroup g(W);
    std::vector<std::thread> ts;
    for (int r = 0; r < W; ++r)
      ts.emplace_back([&, r] {
        Tensor o = Tensor::from_vector(outs[r], {T, W * H, D}), l = Tensor::from_vector(lses[r], {T, W * H});
        want_ag[r] = cp_lse_ag_out_rs(o, l, g.communicator(r), false).to_vector<float>();
        want_a2a[r] = dcp_a2a_lse_reduce(o, l, g.communicator(r), false).to_vector<float>();
      });
    for (auto& t : ts) t.join();
  }
  on_nccl_ranks(W, [&](int r, DcpCommunicator& c) {
    Tensor o = Tensor::from_vector(outs[r], {T, W * H, D}).to(Device::cuda(r));
    Tensor l = Tensor::from_vector(lses[r], {T, W * H}).to(Device::cuda(r));
    got_ag[r] = cp_lse_ag_out_rs(o, l, c, false).to(Device::cpu()).to_vector<float>();
    got_a2a[r] = dcp_a2a_lse_reduce(o, l, c, false).to(Device::cpu()).to_vector<float>();
  });
  for (int r = 0; r < W; ++r) {
    ASSERT_EQ(got_ag[r].size(), want_ag[r].size());
    for (size_t i = 0; i < got_ag[r].size(); ++i) {
      EXPECT_NEAR(got_ag[r][i], want_ag[r][i], 1e-5) << "ag_rs rank " << r << " element " << i;
      EXPECT_NEAR(got_a2a[r][i], want_a2a[r][i], 1e-5) << "a2a rank " << r << " element " << i;
    }
  }
}

TEST(BackendDcpCuda, NcclBackendOnTwoGpusMatchesSingleGpu) {
  REQUIRE_NCCL_GPUS(2);
  for (const char* comm : {"ag_rs", "a2a"}) {
    E2EOptions o;
    o.device = Device::cuda(0);
    o.dcp = 2;
    o.dcp_transport = "nccl";
    o.dcp_comm_backend = comm;
    o.num_layers = 2;
    expect_dcp_matches_single_gpu(o);
  }
  E2EOptions i;  // interleaved shards of 16 tokens, HND cache
  i.device = Device::cuda(0);
  i.dcp = 2;
  i.dcp_transport = "nccl";
  i.dcp_interleave = 16;
  i.layout = KVCacheLayout::LBHNC;
  expect_dcp_matches_single_gpu(i);
}

TEST(BackendDcpCuda, NcclBackendOnFourGpus) {
  REQUIRE_NCCL_GPUS(4);
  E2EOptions o;
  o.device = Device::cuda(0);
  o.dcp = 4;
  o.dcp_transport = "nccl";
  expect_dcp_matches_single_gpu(o);
}

// A rank that fails outside a collective aborts the NCCL group: its peer, whose all-gather
// waits on the GPU for the failed rank, gets its device back, and its next collective throws
// instead of blocking forever.  (A hang here would hang the test binary: both waits are bounded
// and end the process with a failure.)
TEST(BackendDcpCuda, NcclAbortReleasesAPeerWaitingForAFailedRank) {
  REQUIRE_NCCL_GPUS(2);
  auto group = std::make_unique<NcclDcpGroup>(std::vector<int>{0, 1});
  const auto bounded = [](std::future<void>& f, const char* what) {
    if (f.wait_for(std::chrono::seconds(60)) == std::future_status::ready) return;
    ADD_FAILURE() << what << " still blocked after 60 s";
    std::fflush(nullptr);
    std::_Exit(1);
  };
  // One collective on both ranks first, so NCCL's connections exist (as after a first step).
  {
    std::vector<std::vector<float>> got(2);
    std::vector<std::thread> ts;
    for (int r = 0; r < 2; ++r)
      ts.emplace_back([&, r] {
        kvattn::cuda::set_device(r);
        Tensor t = Tensor::from_vector(std::vector<float>{float(r)}).to(Device::cuda(r));
        got[static_cast<size_t>(r)] = group->communicator(r).all_gather(t, 0).to(Device::cpu()).to_vector<float>();
      });
    for (auto& t : ts) t.join();
    for (const auto& g : got) EXPECT_EQ(g, (std::vector<float>{0, 1}));
  }
  std::atomic<int> stage{0};
  std::string peer_error;
  std::future<void> peer = std::async(std::launch::async, [&] {
    kvattn::cuda::set_device(1);
    DcpCommunicator& c = group->communicator(1);
    Tensor t = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}).to(Device::cuda(1));
    Tensor gathered = c.all_gather(t, 0);  // rank 0 never joins: the NCCL kernel waits for it
    stage = 1;
    try {
      kvattn::cuda::synchronize();  // returns once the group is aborted
    } catch (const std::exception&) {
    }
    stage = 2;
    try {
      (void)c.all_gather(t, 0);
    } catch (const InternalError& e) {
      peer_error = e.what();
    }
    stage = 3;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // rank 0 "fails" meanwhile
  EXPECT_EQ(stage.load(), 1) << "the peer's all-gather completed without rank 0";
  std::future<void> aborting = std::async(std::launch::async, [&] { group->abort(); });
  bounded(aborting, "NcclDcpGroup::abort()");
  bounded(peer, "the peer rank");
  EXPECT_EQ(stage.load(), 3);
  EXPECT_NE(peer_error.find("abandoned"), std::string::npos) << peer_error;
  group.reset();  // after abort(): nothing left to destroy, no hang
}

}  // namespace
}  // namespace kvattn::test
