// `kvattn bench-dcp`: decode context parallelism on W GPUs against one GPU, on long contexts.
//
// Setup as the decode anchors (bf16, 32 query / 8 KV heads, D = 128, page 16, random page
// order), B requests of L tokens.  One GPU: every request's L tokens, 32 heads.  DCP over W
// GPUs (NCCL, one thread per rank): each rank holds L / W tokens per request and 32 / W query
// heads; a step is query all-gather -> paged decode over the local shard with LSE ->
// cp_lse_ag_out_rs (or dcp_a2a_lse_reduce).  Each phase is timed per rank with a device sync
// after it (medians over --iters after warm-ups), so "communication" is the gather and combine
// time including waiting for the slowest peer.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <random>
#include <thread>

#include "bench_shape.h"
#include "command_registry.h"
#include "int_option.h"
#include "kvattn/core/checked_math.h"
#include "kvattn/attention/communicator.h"
#include "kvattn/core/cuda_runtime_api.h"
#include "kvattn/core/error.h"
#include "kvattn/ops/ops.h"

namespace kvattn::tools {
namespace {

struct DcpBenchOpts {
  int64_t dcp = 2;
  int64_t batch = 8;
  int64_t kv_len = 131072;
  int64_t iters = 20;
  std::string comm = "ag_rs";
};

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// One device's decode problem: B requests of `len` local tokens on random pages.
struct Shard {
  Device dev;
  Tensor k_cache, v_cache, block_table, seq_lens, qo_indptr;
  int64_t kv_bytes = 0;
  Shard(Device d, int64_t B, int64_t len, uint32_t seed) : dev(d) {
    const int64_t pages_per_req = (len + kPage - 1) / kPage, num_pages = B * pages_per_req + 1;
    k_cache = Tensor::zeros({num_pages, kPage, kHkv, kD}, DType::bf16, dev);
    v_cache = Tensor::zeros({num_pages, kPage, kHkv, kD}, DType::bf16, dev);
    std::vector<int32_t> ids(static_cast<size_t>(num_pages - 1));
    std::iota(ids.begin(), ids.end(), 1);  // page 0 stays unused (vLLM's null block)
    std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
    block_table = Tensor::from_vector(ids, {B, pages_per_req}).to(dev);
    seq_lens = Tensor::from_vector(std::vector<int32_t>(static_cast<size_t>(B), static_cast<int32_t>(len))).to(dev);
    std::vector<int32_t> qo(static_cast<size_t>(B + 1));
    std::iota(qo.begin(), qo.end(), 0);
    qo_indptr = Tensor::from_vector(qo).to(dev);
    kv_bytes = 2 * B * len * kHkv * kD * 2;
  }
  void decode(const Tensor& q, const Tensor& out, const Tensor& lse) const {
    ops::PagedAttentionArgs a;
    a.query = q;
    a.k_cache = k_cache;
    a.v_cache = v_cache;
    a.qo_indptr = qo_indptr;
    a.block_table = block_table;
    a.seq_lens = seq_lens;
    a.out = out;
    a.lse = lse;
    a.lse_base = ops::LseBase::Two;
    ops::paged_attention(a);
  }
};

int run_bench(const DcpBenchOpts& o) {
  KVATTN_CHECK(cuda::available(), "bench-dcp needs CUDA GPUs (this build: CUDA {})",
               cuda::built_with_cuda() ? "built, but no device" : "not built");
  KVATTN_CHECK(NcclDcpGroup::available(), "bench-dcp needs the NCCL communicator; this build has none");
  const int W = checked_cast<int>(o.dcp, "--dcp");
  // Page ids and lengths are int32 in the kernels' metadata: check before narrowing.
  const int64_t pages_per_req = (o.kv_len + kPage - 1) / kPage;
  checked_cast<int32_t>(checked_add(checked_mul(o.batch, pages_per_req, "bench-dcp: pages (--batch * --kv-len / 16)"), 1,
                                    "bench-dcp: pages"),
                        "bench-dcp: page ids (--batch * --kv-len / 16 + 1)");
  KVATTN_CHECK(W >= 2 && W <= cuda::device_count() && kHq % W == 0,
               "--dcp {} must be in [2, {}] (GPUs here) and divide the {} query heads", W, cuda::device_count(), kHq);
  KVATTN_CHECK(o.kv_len % W == 0, "--kv-len {} must divide by --dcp {}", o.kv_len, W);
  KVATTN_CHECK(o.comm == "ag_rs" || o.comm == "a2a", "unknown --comm '{}'; valid: ag_rs, a2a", o.comm);
  const int64_t B = o.batch;
  fmt::print("kvattn bench-dcp: {} requests x {} tokens, bf16, {} q / {} KV heads, D {}, page {}, {} GPUs ({})\n", B,
             o.kv_len, kHq, kHkv, kD, kPage, W, cuda::device_name(0));

  // ---- one GPU ------------------------------------------------------------------------
  double single_us = 0;
  int64_t single_bytes = 0;
  {
    cuda::set_device(0);
    Shard s(Device::cuda(0), B, o.kv_len, 1);
    Tensor q = Tensor::zeros({B, kHq, kD}, DType::bf16, s.dev), out = Tensor::empty({B, kHq, kD}, DType::bf16, s.dev);
    std::vector<double> t;
    for (int i = 0; i < o.iters + 3; ++i) {
      cuda::synchronize();
      const auto t0 = Clock::now();
      s.decode(q, out, Tensor());
      cuda::synchronize();
      if (i >= 3) t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    single_us = median(t);
    single_bytes = s.kv_bytes;
    fmt::print("  1 GPU                 decode {:9.1f} us   K+V {:6.2f} GB   {:5.2f} TB/s\n", single_us,
               static_cast<double>(s.kv_bytes) * 1e-9, static_cast<double>(s.kv_bytes) / single_us * 1e-6);
  }

  // ---- W GPUs ---------------------------------------------------------------------------
  std::vector<int> devices(static_cast<size_t>(W));
  std::iota(devices.begin(), devices.end(), 0);
  NcclDcpGroup group(devices);
  struct RankTimes {
    std::vector<double> gather, attend, combine, total;
    int64_t bytes = 0;
    std::string error;
  };
  std::vector<RankTimes> times(static_cast<size_t>(W));
  std::vector<std::thread> threads;
  for (int r = 0; r < W; ++r)
    threads.emplace_back([&, r] {
      RankTimes& rt = times[static_cast<size_t>(r)];
      try {
        cuda::set_device(r);
        DcpCommunicator& c = group.communicator(r);
        Shard s(Device::cuda(r), B, o.kv_len / W, 100 + r);
        rt.bytes = s.kv_bytes;
        Tensor q = Tensor::zeros({B, kHq / W, kD}, DType::bf16, s.dev);
        Tensor out_tmp = Tensor::empty({B, kHq, kD}, DType::f32, s.dev), lse = Tensor::empty({B, kHq}, DType::f32, s.dev);
        for (int i = 0; i < o.iters + 3; ++i) {
          cuda::synchronize();
          const auto t0 = Clock::now();
          Tensor q_all = c.all_gather(q, 1);
          cuda::synchronize();
          const auto t1 = Clock::now();
          s.decode(q_all, out_tmp, lse);
          cuda::synchronize();
          const auto t2 = Clock::now();
          Tensor o2 = o.comm == "a2a" ? dcp_a2a_lse_reduce(out_tmp, lse, c, false) : cp_lse_ag_out_rs(out_tmp, lse, c, false);
          cuda::synchronize();
          const auto t3 = Clock::now();
          if (i < 3) continue;
          auto us = [](auto a, auto b) { return std::chrono::duration<double, std::micro>(b - a).count(); };
          rt.gather.push_back(us(t0, t1));
          rt.attend.push_back(us(t1, t2));
          rt.combine.push_back(us(t2, t3));
          rt.total.push_back(us(t0, t3));
        }
      } catch (const std::exception& e) {
        rt.error = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < W; ++r)
    KVATTN_CHECK(times[static_cast<size_t>(r)].error.empty(), "rank {}: {}", r, times[static_cast<size_t>(r)].error);
  fmt::print("  transport             {}, combine {}\n", group.describe(), o.comm);
  double worst_total = 0;
  for (int r = 0; r < W; ++r) {
    const RankTimes& rt = times[static_cast<size_t>(r)];
    const double a = median(rt.attend), g = median(rt.gather), cb = median(rt.combine), tot = median(rt.total);
    worst_total = std::max(worst_total, tot);
    fmt::print("  rank {} (cuda:{})       decode {:9.1f} us   K+V {:6.2f} GB   {:5.2f} TB/s   all-gather {:6.1f} us   "
               "combine {:6.1f} us   step {:9.1f} us\n",
               r, r, a, static_cast<double>(rt.bytes) * 1e-9, static_cast<double>(rt.bytes) / a * 1e-6, g, cb, tot);
  }
  fmt::print("  DCP {} step (slowest rank) {:.1f} us vs 1 GPU {:.1f} us: {:.2f}x; aggregate K+V read {:.2f} TB/s\n", W,
             worst_total, single_us, single_us / worst_total, static_cast<double>(single_bytes) / worst_total * 1e-6);
  return 0;
}

std::function<int()> setup_bench_dcp(CLI::App& app) {
  auto o = std::make_shared<DcpBenchOpts>();
  app.option_defaults()->always_capture_default();
  add_int_option(app, "--dcp", o->dcp, 2, 64, "GPUs (DCP ranks); divides the 32 query heads and --kv-len");
  add_int_option(app, "--batch", o->batch, 1, 4096, "requests");
  add_int_option(app, "--kv-len", o->kv_len, 1, int64_t{1} << 30, "tokens per request (split over the ranks)");
  add_int_option(app, "--iters", o->iters, 1, 100000, "timed iterations (after 3 warm-ups)");
  app.add_option("--comm", o->comm, "combine: ag_rs or a2a")->check(CLI::IsMember({"ag_rs", "a2a"}));
  return [o] { return run_bench(*o); };
}

const bool bench_dcp_registered = register_command(
    {"bench-dcp", "Decode context parallelism over NCCL: per-rank bandwidth and communication time vs one GPU",
     &setup_bench_dcp, 420});

}  // namespace
}  // namespace kvattn::tools
